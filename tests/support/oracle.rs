//! The oracle of the end-to-end tests: folds delivered topology messages into the view a
//! consumer would hold (as `docs/consumers.md` and `kubesink fold` do), and on the way checks
//! every rule of `docs/message-contract.md` a single message stream can break. It must never
//! accept a stream a consumer following the documented fold would get wrong.
//!
//! Per message, in order (`key` = the payload's `key`, else built as the contract says):
//! - **id**: the `id` is the documented derivation (XXH3-128 of cluster, group, kind,
//!   namespace, name, uid, resourceVersion, op, `fsu`, and an `added`'s `replacedUid`), and one id always carries the same
//!   change (same key, op, uid, resourceVersion, `finalStateUnknown` and `object`; only
//!   `observedAt`, `initial` and `leaderEpoch` may differ, since a change observed again, or
//!   sent again by the next leader, keeps its id).
//! - **duplicates**: a repeated id is a violation unless the test expects redelivery
//!   ([`Expect::redelivery`]); even then it must repeat the key's *last* message (a consumer
//!   deduplicates on that alone, `docs/consumers.md` "Deduplication"). Duplicates are skipped.
//! - **op**: `added` for a key already present, `deleted` of another uid or of a key already
//!   deleted, `updated` of another uid or of a uid already deleted: violations (a `deleted`
//!   with a `reason`, `leftSelector` or `leftFilter`, is of an object still in the cluster,
//!   which may come back as `added` with its uid). A `deleted` of a uid the stream never
//!   carried is not: an `added` a destination may hold from an
//!   earlier run or leader is never cancelled, so its `deleted` may go alone. `updated` for an
//!   absent key is a coalesced `added` (an `added` overtaken by an `updated` arrives as
//!   `updated`) unless the test says coalescing is off ([`Expect::uncoalesced`]). After a
//!   restart ([`Expect::restarts`]) an `added` may announce a present key again (a new
//!   initial list, or a key the saved state did not hold as acknowledged), and a `deleted`
//!   may come for a key already gone.
//! - **uid**: a key's uid changes only after a `deleted` of the old uid. After a restart
//!   ([`Expect::restarts`]) the owed, inferred `deleted` of a former uid may come again while
//!   its successor is present, even as a repeat of its first sending after newer messages
//!   of the key (`docs/consumers.md`, "Deduplication"): folded as a consumer does (the key
//!   goes), noted.
//! - **order**: per key and uid, decimal resourceVersions never decrease. (After a restart
//!   from saved state, [`Expect::restarts`], an inferred `deleted` of a uid whose delete
//!   already arrived may carry the older, last acknowledged resourceVersion: noted, printed.)
//! - Storage that keeps only each key's last message ([`Expect::last_per_key`]) may start a
//!   key with its `updated` or `deleted`.
//! - `synced` (sync markers) are not folded (no sweep); any other op is a violation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde_json::Value;

/// What a test expects beyond the strict contract of one uninterrupted run. The default is
/// strict: no message repeated, coalescing on (the product's and [`super::config`]'s default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Expect {
    redelivery: bool,
    restarts: bool,
    uncoalesced: bool,
    last_per_key: bool,
}

impl Expect {
    /// Strict: one run, no redelivery, coalescing on.
    pub const STRICT: Expect = Expect {
        redelivery: false,
        restarts: false,
        uncoalesced: false,
        last_per_key: false,
    };

    /// At-least-once redelivery is expected (a broker retry, a crash before the
    /// acknowledgement was saved): a message may repeat, byte-identical in content, right
    /// after the original as far as its key goes.
    pub fn redelivery(self) -> Expect {
        Expect {
            redelivery: true,
            ..self
        }
    }

    /// The stream spans restarts of kubesink. Stateless: each new initial list re-sends
    /// every live object as `added` with `initial: true` (unchanged ones with their old id),
    /// over a key present with the same uid, or with another one (deleted and re-created
    /// while kubesink was down: that delete is never sent). From saved state: the new
    /// process knows only what was *acknowledged* before the crash, so it may announce again
    /// as `added` a key the consumer has, or send the inferred `deleted` of a key whose
    /// delete already arrived. Implies [`Expect::redelivery`].
    pub fn restarts(self) -> Expect {
        Expect {
            redelivery: true,
            restarts: true,
            ..self
        }
    }

    /// The messages come from storage that keeps only each key's last message (a JetStream
    /// stream with `max_msgs_per_subject = 1`, a compacted topic): a key's first message may
    /// be its `updated` or `deleted`.
    pub fn last_per_key(self) -> Expect {
        Expect {
            last_per_key: true,
            ..self
        }
    }

    /// `pipeline.coalesce = false`: every change arrives, so an `updated` is never the first
    /// message of a uid.
    pub fn uncoalesced(self) -> Expect {
        Expect {
            uncoalesced: true,
            ..self
        }
    }
}

/// Object identity as tests compare it: (kind, namespace, name) → resourceVersion.
pub type Fold = BTreeMap<(String, String, String), String>;

/// The exact state: (kind, namespace, name) → (uid, resourceVersion), as a fold holds it and
/// as `kube_server::live_state` lists it from a real API server.
pub type UidFold = BTreeMap<(String, String, String), (String, String)>;

/// Folds `msgs` as `expect` allows (panicking on a contract violation), keeps the keys `keep`
/// keeps, and compares them with `live`: the number of objects when the two are equal, else
/// their first differences.
pub fn fold_equals<'a>(
    live: &UidFold,
    msgs: impl IntoIterator<Item = &'a Value>,
    expect: Expect,
    keep: impl Fn(&(String, String, String)) -> bool,
) -> Result<usize, String> {
    let mut o = Oracle::new(expect);
    for m in msgs {
        o.apply(m);
    }
    o.assert_clean();
    let mut got = o.fold_uids();
    got.retain(|key, _| keep(key));
    if &got == live {
        Ok(live.len())
    } else {
        Err(state_diff(live, &got))
    }
}

/// The first differences between `want` (the API server) and `got` (a fold).
pub fn state_diff(want: &UidFold, got: &UidFold) -> String {
    let mut out = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => out.push(format!("missing {k:?} {v:?}")),
            Some(g) if g != v => out.push(format!("stale {k:?}: folded {g:?}, live {v:?}")),
            Some(_) => {}
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            out.push(format!("ghost {k:?} {v:?}"));
        }
    }
    let n = out.len();
    out.truncate(15);
    format!("{n} difference(s): {}", out.join("; "))
}

/// Folds `msgs` strictly ([`Expect::STRICT`]); panics naming every violation.
pub fn fold(msgs: &[Value]) -> Fold {
    fold_expecting(msgs, Expect::STRICT)
}

/// Folds `msgs` allowing what `expect` says; panics naming every violation.
pub fn fold_expecting(msgs: &[Value], expect: Expect) -> Fold {
    let mut o = Oracle::new(expect);
    for m in msgs {
        o.apply(m);
    }
    o.assert_clean();
    if !o.notes.is_empty() {
        eprintln!(
            "the oracle allowed {} deviation(s) from the strict contract ({expect:?}), e.g.:",
            o.notes.len()
        );
        for n in o.notes.iter().take(5) {
            eprintln!("- {n}");
        }
    }
    o.fold()
}

/// The fold with its checks, message by message (see the module docs).
pub struct Oracle {
    expect: Expect,
    /// Messages applied so far (their index in the input).
    seen: usize,
    keys: BTreeMap<String, KeyState>,
    /// id → (index, the change it carries, its summary).
    ids: HashMap<String, (usize, Change, String)>,
    violations: Vec<String>,
    /// What an [`Expect`] allowed that the strict contract forbids, printed by
    /// [`fold_expecting`] so a test shows what it tolerated.
    notes: Vec<String>,
}

#[derive(Default)]
struct KeyState {
    /// (kind, namespace, name).
    short: (String, String, String),
    /// The present uid and resourceVersion; `None`: absent.
    present: Option<(String, String)>,
    /// The id of the key's last applied message (a `deleted` included).
    last_id: Option<String>,
    deleted_uids: HashSet<String>,
    /// uid → highest decimal resourceVersion seen.
    max_rv: HashMap<String, u128>,
    /// The key's messages so far: (index, one-line summary).
    history: Vec<(usize, String)>,
}

impl Oracle {
    /// An oracle that has seen no message yet, allowing what `expect` allows.
    pub fn new(expect: Expect) -> Oracle {
        Oracle {
            expect,
            seen: 0,
            keys: BTreeMap::new(),
            ids: HashMap::new(),
            violations: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The violations found so far, each naming the key and the messages involved.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// What the [`Expect`] let through that the strict contract would not.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Panics listing the violations, if any.
    pub fn assert_clean(&self) {
        if self.violations.is_empty() {
            return;
        }
        let mut text = format!(
            "the message stream breaks the contract ({} violations in {} messages, expecting {:?}):\n",
            self.violations.len(),
            self.seen,
            self.expect
        );
        for v in self.violations.iter().take(20) {
            let _ = writeln!(text, "- {v}");
        }
        panic!("{text}");
    }

    /// The live keys as (kind, namespace, name) → resourceVersion.
    pub fn fold(&self) -> Fold {
        let mut out = Fold::new();
        for (key, k) in &self.keys {
            if let Some((_, rv)) = &k.present {
                if out.insert(k.short.clone(), rv.clone()).is_some() {
                    panic!(
                        "fold(): two live keys share {:?} (the second {key}): fold one cluster and group at a time",
                        k.short
                    );
                }
            }
        }
        out
    }

    /// The live keys with their uid: (kind, namespace, name) → (uid, resourceVersion), the
    /// exact state the real-server tests compare with the API server's.
    pub fn fold_uids(&self) -> UidFold {
        self.keys
            .values()
            .filter_map(|k| Some((k.short.clone(), k.present.clone()?)))
            .collect()
    }

    /// Applies one message (a structured-mode CloudEvent is unwrapped).
    pub fn apply(&mut self, m: &Value) {
        let i = self.seen;
        self.seen += 1;
        let m = match m.get("specversion") {
            Some(_) => m.get("data").unwrap_or(m),
            None => m,
        };
        let op = m["op"].as_str().unwrap_or_default();
        match op {
            "added" | "updated" | "deleted" => {}
            "synced" => return,
            _ => {
                self.violations
                    .push(format!("{}: unknown op: #{i}: {}", key_of(m), summary(m)));
                return;
            }
        }
        let key = key_of(m);
        let id = m["id"].as_str().unwrap_or_default().to_owned();
        let line = summary(m);
        let change = Change::of(m);
        let expect = self.expect;
        let k = self.keys.entry(key.clone()).or_default();
        k.short = (
            m["kind"].as_str().unwrap_or_default().to_owned(),
            m["namespace"].as_str().unwrap_or_default().to_owned(),
            m["name"].as_str().unwrap_or_default().to_owned(),
        );
        let mut found = Vec::new();
        let history = |k: &KeyState| -> String {
            let mut h = String::new();
            let from = k.history.len().saturating_sub(4);
            for (j, s) in &k.history[from..] {
                let _ = write!(h, "\n    #{j}: {s}");
            }
            h
        };

        // The id: its documented derivation, and one id, one change.
        match derived_id(m) {
            Some(want) if want != id => found.push(format!(
                "id is not the documented derivation (want {want}): #{i}: {line}"
            )),
            _ => {}
        }
        if id.is_empty() {
            self.violations
                .push(format!("{key}: a message without an id: #{i}: {line}"));
        } else if let Some((j, earlier, earlier_line)) = self.ids.get(&id) {
            if *earlier != change {
                found.push(format!(
                    "id {id} carries two different changes (fields {:?} differ): #{j}: {earlier_line} and #{i}: {line}",
                    earlier.differing(&change)
                ));
            } else if !expect.redelivery {
                found.push(format!(
                    "duplicate of #{j} (no redelivery expected): #{i}: {line}; history:{}",
                    history(k)
                ));
            } else if k.last_id.as_deref() != Some(id.as_str()) {
                // After a restart from a snapshot older than the previous run's last sends,
                // the journal's replay owes the former uid's inferred `deleted` again, though
                // it was sent, and a newer message of the key may be downstream already
                // (docs/consumers.md, "Deduplication"; docs/restarts.md, "At start"). A
                // consumer applies it again (the key goes); the successor is re-sent after
                // it. Noted, and folded as a consumer does below, so a missing re-send shows
                // in the fold.
                let uid = m["uid"].as_str().unwrap_or_default();
                let owed_again = expect.restarts
                    && op == "deleted"
                    && m["finalStateUnknown"] == true
                    && k.deleted_uids.contains(uid);
                if owed_again {
                    self.notes.push(format!(
                        "{key}: the owed delete of former uid {uid} sent again after a restart, after newer messages of its key: #{j} then #{i}: {line}"
                    ));
                    k.history.push((i, format!("{line} (sent again)")));
                    if k.present.as_ref().is_some_and(|(u, _)| u != uid) {
                        k.present = None;
                    }
                    k.last_id = Some(id);
                    return;
                }
                found.push(format!(
                    "repeat of #{j} after a newer message of the key (a consumer deduplicating on the key's last id applies it again): #{i}: {line}; history:{}",
                    history(k)
                ));
            }
            for f in found {
                self.violations.push(format!("{key}: {f}"));
            }
            k.history.push((i, format!("{line} (duplicate)")));
            return;
        } else {
            self.ids.insert(id.clone(), (i, change, line.clone()));
        }

        let uid = m["uid"].as_str().unwrap_or_default().to_owned();
        let rv = m["resourceVersion"].as_str().unwrap_or_default().to_owned();
        match (op, &k.present) {
            ("added", Some((u, _))) if !expect.restarts => found.push(if *u == uid {
                format!("added for a key already present: #{i}: {line}")
            } else {
                format!("uid changed from {u} without a delete of it: #{i}: {line}")
            }),
            ("added", None) if k.deleted_uids.contains(&uid) => {
                found.push(format!("added of a uid already deleted: #{i}: {line}"))
            }
            ("updated", Some((u, _))) if *u != uid => found.push(format!(
                "uid changed from {u} without a delete of it: #{i}: {line}"
            )),
            ("updated", None) if k.deleted_uids.contains(&uid) => {
                found.push(format!("updated of a uid already deleted: #{i}: {line}"))
            }
            ("updated", None) if expect.uncoalesced && !expect.last_per_key => found.push(format!(
                "updated for an absent key (coalescing is off): #{i}: {line}"
            )),
            ("deleted", None)
                if !expect.last_per_key && !expect.restarts && k.deleted_uids.contains(&uid) =>
            {
                found.push(format!(
                    "deleted again for a key already deleted: #{i}: {line}"
                ))
            }
            // The delete of a uid this stream never carried: an `added` a destination may
            // already hold (from an earlier run or leader: a first list's, or one re-sent
            // after a crash) is never cancelled by its `deleted`, which then goes alone
            // (docs/message-contract.md, "Restarts").
            ("deleted", None) if !k.history.iter().any(|(_, l)| l.contains(&uid)) => {}
            ("deleted", None) if !expect.last_per_key && !expect.restarts => {
                found.push(format!("deleted for an absent key: #{i}: {line}"))
            }
            // After a crash, the journal's replay makes the delete of a key's former uid owed
            // again (docs/restarts.md, "At start"), though the previous run may have sent it
            // and its successor's `added` already: a consumer removes the key (`deleted`
            // removes it whatever its uid, docs/consumers.md), and the successor is re-sent
            // after it (unconfirmed) or replaced. Noted, and folded as a consumer does, so a
            // missing re-send shows in the fold.
            ("deleted", Some((u, _)))
                if *u != uid
                    && expect.restarts
                    && m["finalStateUnknown"] == true
                    && k.deleted_uids.contains(&uid) =>
            {
                self.notes.push(format!(
                    "{key}: the owed delete of former uid {uid}, re-sent after a restart while {u} is present: #{i}: {line}"
                ));
                k.present = None;
            }
            ("deleted", Some((u, _))) if *u != uid => found.push(format!(
                "deleted of uid {uid} while {u} is present: #{i}: {line}"
            )),
            _ => {}
        }
        if let Ok(v) = rv.parse::<u128>() {
            let max = *k.max_rv.entry(uid.clone()).or_insert(v);
            if v < max {
                let text =
                    format!("resourceVersion went back from {max} for uid {uid}: #{i}: {line}");
                // After a crash, a process restarted from saved state re-sends the delete of
                // an object whose delete arrived but was not yet acknowledged in the state:
                // inferred, so with the last *acknowledged* resourceVersion, older than the
                // observed delete's (a consumer sees a second delete of an absent key).
                if expect.restarts
                    && op == "deleted"
                    && m["finalStateUnknown"] == true
                    && k.deleted_uids.contains(&uid)
                {
                    self.notes.push(format!(
                        "{key}: the inferred delete of a uid already deleted, re-sent after a restart: {text}; history:{}",
                        history(k)
                    ));
                } else {
                    found.push(text);
                }
            }
            k.max_rv.insert(uid.clone(), max.max(v));
        }
        if !found.is_empty() {
            let h = history(k);
            for f in found {
                self.violations.push(format!("{key}: {f}; history:{h}"));
            }
        }
        k.last_id = Some(id);
        k.history.push((i, line));
        if op == "deleted" {
            if k.present.as_ref().is_some_and(|(u, _)| *u == uid) {
                k.present = None;
            }
            // A `deleted` with a `reason` (leftSelector, leftFilter) is of an object still in
            // the cluster: it comes back as `added`, with the same uid, when it matches again.
            if m.get("reason").is_none_or(Value::is_null) {
                k.deleted_uids.insert(uid);
            }
        } else {
            k.present = Some((uid, rv));
        }
    }
}

/// The message key: the `key` field, else built as `docs/message-contract.md` says.
fn key_of(m: &Value) -> String {
    if let Some(k) = m["key"].as_str() {
        return k.to_owned();
    }
    format!(
        "{}/{}/{}/{}/{}",
        m["cluster"].as_str().unwrap_or_default(),
        match group_of(m) {
            "" => "core",
            g => g,
        },
        m["kind"].as_str().unwrap_or_default(),
        m["namespace"].as_str().unwrap_or_default(),
        m["name"].as_str().unwrap_or_default()
    )
}

fn group_of(m: &Value) -> &str {
    match m["group"].as_str() {
        Some(g) => g,
        None => m["apiVersion"]
            .as_str()
            .and_then(|a| a.split_once('/'))
            .map_or("", |(g, _)| g),
    }
}

/// The id `docs/message-contract.md` defines; `None` when a field it is built from is
/// missing (the schema check reports that).
fn derived_id(m: &Value) -> Option<String> {
    let mut buf = String::new();
    for part in [
        m["cluster"].as_str()?,
        group_of(m),
        m["kind"].as_str()?,
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str()?,
        m["uid"].as_str()?,
        m["resourceVersion"].as_str()?,
        m["op"].as_str()?,
        if m["finalStateUnknown"] == true {
            "fsu"
        } else {
            ""
        },
    ] {
        buf.push_str(part);
        buf.push('\0');
    }
    // An `added` that follows the inferred `deleted` of the uid it replaced names that uid.
    if let Some(old) = m["replacedUid"].as_str().filter(|_| m["op"] == "added") {
        buf.push_str(old);
        buf.push('\0');
    }
    Some(format!(
        "{:032x}",
        xxhash_rust::xxh3::xxh3_128(buf.as_bytes())
    ))
}

/// What one id stands for: the message without `observedAt`, `initial` and `leaderEpoch`, as a hash per
/// top-level field (cheap to keep for every message of a long run).
#[derive(PartialEq)]
struct Change(BTreeMap<String, u64>);

impl Change {
    fn of(m: &Value) -> Change {
        let fields = m.as_object().map(|o| {
            o.iter()
                .filter(|(f, _)| *f != "observedAt" && *f != "initial" && *f != "leaderEpoch")
                .map(|(f, v)| {
                    let text = serde_json::to_string(v).unwrap_or_default();
                    (f.clone(), xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
                })
                .collect()
        });
        Change(fields.unwrap_or_default())
    }

    /// The fields in which two changes differ.
    fn differing(&self, other: &Change) -> Vec<String> {
        self.0
            .keys()
            .chain(other.0.keys())
            .filter(|f| self.0.get(*f) != other.0.get(*f))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    }
}

/// One line naming a message: op, uid, resourceVersion, flags, id.
fn summary(m: &Value) -> String {
    format!(
        "{} {} uid={} rv={}{}{} id={}",
        m["op"].as_str().unwrap_or("?"),
        key_of(m),
        m["uid"].as_str().unwrap_or("?"),
        m["resourceVersion"].as_str().unwrap_or("?"),
        if m["initial"] == true { " initial" } else { "" },
        if m["finalStateUnknown"] == true {
            " finalStateUnknown"
        } else {
            ""
        },
        m["id"].as_str().unwrap_or("?"),
    )
}
