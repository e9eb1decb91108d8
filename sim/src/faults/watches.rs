//! Watch faults: the registry of open watch streams (so a switch can end or silence the ones
//! open now) and the rules for new ones: closed at once, 410 `Expired`, silent (a middlebox
//! that dropped an idle connection, or a server that stopped sending), empty (200 and an
//! immediate end), damaged events, and watches that stay open after their
//! CustomResourceDefinition is deleted. Watch streams read these rules; this module never
//! writes a byte to a client.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::{prefix_matches, toggle_rule, Faults, RequestMatch};

/// How a damaged watch event is written instead of the real one (see
/// [`Faults::damage_next_watch_events`]). Each damaged event still ends with `\n`, so the
/// stream stays line-delimited and later events arrive intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DamageKind {
    /// The first half of the real event line, then the newline: JSON cut in the middle.
    Truncated,
    /// A line of text that is not JSON (`this is not json: <garbage>`).
    NotJson,
    /// A line of bytes that are not UTF-8 (`0xff 0xfe …`).
    NonUtf8,
    /// Valid JSON that is not a watch event: `{"hello":"world"}`.
    NotAnEvent,
}

impl DamageKind {
    /// Parses the admin endpoint's names: `truncated`, `not-json`, `non-utf8`, `not-an-event`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "truncated" => Some(DamageKind::Truncated),
            "not-json" => Some(DamageKind::NotJson),
            "non-utf8" => Some(DamageKind::NonUtf8),
            "not-an-event" => Some(DamageKind::NotAnEvent),
            _ => None,
        }
    }

    /// The damaged line that replaces `line` (a whole event line ending in `\n`).
    pub(crate) fn apply(self, line: &[u8]) -> Bytes {
        match self {
            DamageKind::Truncated => {
                let body = line.strip_suffix(b"\n").unwrap_or(line);
                let mut out = body[..body.len() / 2].to_vec();
                out.push(b'\n');
                out.into()
            }
            DamageKind::NotJson => Bytes::from_static(b"this is not json: <<garbage>>\n"),
            DamageKind::NonUtf8 => Bytes::from_static(b"\xff\xfe\xfd\x80 not utf-8 \xc3\x28\n"),
            DamageKind::NotAnEvent => Bytes::from_static(b"{\"hello\":\"world\"}\n"),
        }
    }
}

/// A pending "damage the next events" rule.
#[derive(Debug, Clone)]
pub(super) struct Damage {
    remaining: usize,
    kind: DamageKind,
    prefix: Option<String>,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    path: String,
    group: String,
    plural: String,
    end: CancellationToken,
    silence: CancellationToken,
}

/// The watch streams open now.
#[derive(Debug, Default)]
pub(super) struct OpenWatches {
    next_id: u64,
    entries: Vec<Entry>,
}

/// What one watch stream gets from the switches when it opens. `end` fires when the stream
/// must end (close-watches, a status override on its path, …); `silence` when it must send
/// nothing more while staying open.
#[derive(Debug)]
pub(crate) struct WatchControl {
    /// Registry id, for [`Faults::unregister_watch`].
    pub id: u64,
    /// Fires when the stream must end.
    pub end: CancellationToken,
    /// Fires when the stream must go silent.
    pub silence: CancellationToken,
    /// Whether a `silence_watches` rule matched: accepted, then silent from the start.
    pub silent_from_start: bool,
}

impl Faults {
    fn open_watches(&self) -> std::sync::MutexGuard<'_, OpenWatches> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends every watch stream open now (the client sees the response body end); later
    /// watches are unaffected.
    pub fn close_all_watches(&self) {
        let open = self.open_watches();
        for e in &open.entries {
            e.end.cancel();
        }
        self.count_effect("closedWatches", open.entries.len() as u64);
    }

    /// Makes every watch stream open now send nothing more, ever (no events, no bookmarks,
    /// and no end at `timeoutSeconds`), while its connection stays open: what a client sees
    /// when a middlebox silently drops an idle TCP connection or the server stops sending.
    /// Only [`Faults::close_all_watches`], a status override, an unreachable server or
    /// shutdown end such a stream. New watches are unaffected.
    pub fn silence_open_watches(&self) {
        let open = self.open_watches();
        for e in &open.entries {
            e.silence.cancel();
        }
        self.count_effect("silencedWatches", open.entries.len() as u64);
    }

    /// While `on`, every NEW watch whose URL path starts with `path_prefix` (`None` = every
    /// path) is accepted (200 and headers) and then sends nothing, as
    /// [`Faults::silence_open_watches`] does to open ones. `on = false` removes that prefix's
    /// rule (`None`: every rule).
    pub fn silence_watches(&self, path_prefix: Option<&str>, on: bool) {
        self.with(|s| toggle_rule(&mut s.silent_new_watches, path_prefix, on));
    }

    /// While `on`, every watch request whose URL path starts with `path_prefix` (`None` =
    /// every path) answers 200 with an empty body: the stream ends at once with no event.
    /// `on = false` removes that prefix's rule (`None`: every rule).
    pub fn empty_watches(&self, path_prefix: Option<&str>, on: bool) {
        self.with(|s| toggle_rule(&mut s.empty_watches, path_prefix, on));
    }

    /// The next `n` real events (ADDED, MODIFIED, DELETED; not BOOKMARK or ERROR) written on
    /// watches whose URL path starts with `path_prefix` (`None` = every watch) are sent
    /// damaged as `kind` instead of intact. The watch then goes on with later events, so the
    /// damaged change is lost unless the client relists. Replaces a pending rule;
    /// [`Faults::damaged_watch_events`] counts what was sent.
    pub fn damage_next_watch_events(&self, n: usize, kind: DamageKind, path_prefix: Option<&str>) {
        self.with(|s| {
            s.damage = Some(Damage {
                remaining: n,
                kind,
                prefix: path_prefix.map(str::to_owned),
            })
        });
    }

    /// How many watch streams are open now.
    pub(crate) fn open_watch_count(&self) -> u64 {
        self.open_watches().entries.len() as u64
    }

    /// How many damaged watch events were written since the simulator started.
    pub fn damaged_watch_events(&self) -> u64 {
        self.damaged.load(Ordering::Relaxed)
    }

    /// While `on`, watches of a custom resource whose CustomResourceDefinition is deleted
    /// stay open and silent instead of ending (a real API server bug: the client never learns
    /// the resource is gone). Off (the default) they end after the DELETED events of the
    /// resource's objects, as a correct API server does.
    pub fn keep_watches_open_after_crd_delete(&self, on: bool) {
        self.with(|s| s.keep_watches_after_crd_delete = on);
    }

    /// Registers a new watch of `path` (resource `group`/`plural`).
    pub(crate) fn register_watch(&self, path: &str, group: &str, plural: &str) -> WatchControl {
        let silent_from_start = self.with(|s| {
            s.silent_new_watches
                .iter()
                .any(|p| path.starts_with(p.as_str()))
        });
        let mut open = self.open_watches();
        open.next_id += 1;
        let entry = Entry {
            id: open.next_id,
            path: path.to_owned(),
            group: group.to_owned(),
            plural: plural.to_owned(),
            end: CancellationToken::new(),
            silence: CancellationToken::new(),
        };
        let control = WatchControl {
            id: entry.id,
            end: entry.end.clone(),
            silence: entry.silence.clone(),
            silent_from_start,
        };
        open.entries.push(entry);
        control
    }

    /// Forgets a watch that ended.
    pub(crate) fn unregister_watch(&self, id: u64) {
        self.open_watches().entries.retain(|e| e.id != id);
    }

    /// Ends the open watches `matcher` selects.
    pub(super) fn end_watches_matching(&self, matcher: &RequestMatch) {
        for e in &self.open_watches().entries {
            if matcher.matches(&e.path, Some((&e.group, &e.plural))) {
                e.end.cancel();
            }
        }
    }

    /// Whether a watch of `path` must answer an empty body.
    pub(crate) fn empties_watch(&self, path: &str) -> bool {
        self.with(|s| s.empty_watches.iter().any(|p| path.starts_with(p.as_str())))
    }

    /// Consumes one pending damage for a real event on a watch of `path`.
    pub(crate) fn take_damage(&self, path: &str) -> Option<DamageKind> {
        let kind = self.with(|s| {
            let d = s.damage.as_mut()?;
            if d.remaining == 0 || !prefix_matches(d.prefix.as_deref(), path) {
                return None;
            }
            d.remaining -= 1;
            Some(d.kind)
        })?;
        self.damaged.fetch_add(1, Ordering::Relaxed);
        Some(kind)
    }

    /// Whether watches of a deleted CRD stay open and silent.
    pub(crate) fn keeps_watches_after_crd_delete(&self) -> bool {
        self.with(|s| s.keep_watches_after_crd_delete)
    }
}

#[cfg(test)]
mod tests {
    use super::DamageKind;

    #[test]
    fn damaged_lines_end_with_a_newline_and_are_not_events() {
        let line = b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\"}}\n";
        for kind in [
            DamageKind::Truncated,
            DamageKind::NotJson,
            DamageKind::NonUtf8,
            DamageKind::NotAnEvent,
        ] {
            let damaged = kind.apply(line);
            assert!(damaged.ends_with(b"\n"), "{kind:?}");
            let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&damaged);
            assert!(parsed.map_or(true, |v| v.get("type").is_none()), "{kind:?}");
        }
        assert!(std::str::from_utf8(&DamageKind::NonUtf8.apply(line)).is_err());
    }
}
