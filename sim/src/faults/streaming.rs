//! Streaming lists (KEP-3157, "WatchList": a watch with `sendInitialEvents=true`), as the API
//! servers a client meets serve them, and their faults:
//!
//! - [`WatchListSupport`]: `on` (the feature gate on, Kubernetes 1.32 and 1.34+: the initial
//!   events end with a BOOKMARK annotated `k8s.io/initial-events-end: "true"`), `off` (the gate
//!   off, 1.33's default, or an aggregated API server with its own gates: 422 `Invalid`
//!   "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"),
//!   `ignored` (a server older than 1.27, or a proxy that drops the parameter: it treats the
//!   request as a plain watch, so an unset resourceVersion gets synthetic ADDED events and no
//!   end bookmark). The setting is the server's, not a fault: `clear-faults` keeps it.
//! - [`InitialEventsBreak`]: the next streaming lists end before their end bookmark, cleanly
//!   (`cut`: a proxy or load balancer that closed the response) or with a 410 `Expired` ERROR
//!   event (`gone`), after a given number of initial events.
//! - the end-bookmark hold ([`Faults::hold_initial_events_end`]): streaming lists send their
//!   initial events, then wait before their end bookmark until the hold is released, so a
//!   test can see how many streaming lists a client has in flight at once.
//!
//! The validation follows `validateWatchOptions` of
//! `k8s.io/apiserver/pkg/apis/meta/internalversion/validation` (1.34). This module holds the
//! switches; the watch handler applies them and never writes here.

use tokio_util::sync::CancellationToken;

use super::{prefix_matches, Faults};

/// How the server answers a watch with `sendInitialEvents` (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WatchListSupport {
    /// Served: initial events, then the initial-events-end bookmark (the default).
    #[default]
    On,
    /// Refused with 422 `Invalid` (the `WatchList` feature gate off).
    Off,
    /// `sendInitialEvents` and `resourceVersionMatch` ignored: a plain watch.
    Ignored,
}

impl WatchListSupport {
    /// Parses `on`, `off` or `ignored`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "on" => Some(WatchListSupport::On),
            "off" => Some(WatchListSupport::Off),
            "ignored" => Some(WatchListSupport::Ignored),
            _ => None,
        }
    }
}

/// How a broken streaming list ends before its end bookmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakKind {
    /// The response body ends cleanly (the last chunk is sent).
    Cut,
    /// An `ERROR` event with a 410 `Expired` Status, then the end.
    Gone,
}

impl BreakKind {
    /// Parses `cut` or `gone`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "cut" => Some(BreakKind::Cut),
            "gone" => Some(BreakKind::Gone),
            _ => None,
        }
    }
}

/// A pending rule: the next `remaining` streaming lists of paths under `prefix` break after
/// `after` initial events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialEventsBreak {
    /// Streaming lists still to break.
    pub remaining: usize,
    /// Initial events sent before the break (fewer when there are fewer objects).
    pub after: usize,
    /// How they end.
    pub kind: BreakKind,
    /// URL path prefix of the watches it applies to (`None`: every path).
    pub prefix: Option<String>,
}

impl Faults {
    /// Sets how watches with `sendInitialEvents` are served, from now on (open streams keep
    /// what they were given). Not reset by [`Faults::clear`]: it is the server's version.
    pub fn set_watch_list(&self, support: WatchListSupport) {
        *self.watch_list.lock().unwrap_or_else(|p| p.into_inner()) = support;
    }

    /// How watches with `sendInitialEvents` are served now.
    pub fn watch_list(&self) -> WatchListSupport {
        *self.watch_list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `count` streaming lists of paths under `path_prefix` (`None`: every path) end
    /// after `after` initial events, before the end bookmark, as `kind` says. Replaces a
    /// pending rule.
    pub fn break_initial_events(
        &self,
        count: usize,
        after: usize,
        kind: BreakKind,
        path_prefix: Option<&str>,
    ) {
        self.with(|s| {
            s.initial_events_break = Some(InitialEventsBreak {
                remaining: count,
                after,
                kind,
                prefix: path_prefix.map(str::to_owned),
            })
        });
    }

    /// While `on`, every streaming list begun meanwhile holds its initial-events-end bookmark
    /// back after its initial events (and sends no other bookmark); `false` releases the held
    /// ones at once. A list takes the hold when its request comes, so a release also lets out
    /// a list still writing its initial events (taking it when the end bookmark is due kept
    /// such a list held past the release on a busy machine).
    /// Cleared by [`Faults::clear`] (which releases them too).
    pub fn hold_initial_events_end(&self, on: bool) {
        let released = self.with(|s| match (on, &s.initial_events_end_hold) {
            (true, Some(_)) => None,
            (true, None) => {
                s.initial_events_end_hold = Some(CancellationToken::new());
                None
            }
            (false, _) => s.initial_events_end_hold.take(),
        });
        if let Some(t) = released {
            t.cancel();
        }
    }

    /// Releases the end bookmarks of every streaming list begun so far (held now or still
    /// writing its initial events) and keeps holding those of later streaming lists,
    /// in one step: [`Faults::hold_initial_events_end`] `false` then `true` leaves a moment
    /// in which a list that comes in gets its end bookmark unheld (a test thread descheduled
    /// between the two calls on a busy machine). Does nothing while the hold is off.
    pub fn release_held_initial_events_end(&self) {
        let released = self.with(|s| {
            s.initial_events_end_hold
                .as_mut()
                .map(|t| std::mem::replace(t, CancellationToken::new()))
        });
        if let Some(t) = released {
            t.cancel();
        }
    }

    /// The hold of initial-events-end bookmarks, while on: cancelled when released.
    pub(crate) fn initial_events_end_hold(&self) -> Option<CancellationToken> {
        self.with(|s| s.initial_events_end_hold.clone())
    }

    /// Consumes one pending break for a streaming list of `path`: how many initial events
    /// to send, and how to end.
    pub(crate) fn take_initial_events_break(&self, path: &str) -> Option<(usize, BreakKind)> {
        self.with(|s| {
            let b = s.initial_events_break.as_mut()?;
            if b.remaining == 0 || !prefix_matches(b.prefix.as_deref(), path) {
                return None;
            }
            b.remaining -= 1;
            Some((b.after, b.kind))
        })
    }
}
