//! One watch's [`LightStore`], shared by its decider (which changes it), the sinks'
//! acknowledgements (which settle its changes) and the state saver (which reads the
//! acknowledged part), behind one short lock.
//!
//! # The acknowledged state without a second copy
//!
//! The saved state must never run ahead of what every sink has: a key enters it only after
//! every sink confirmed the message that produced it. Keeping a second, acknowledged copy of
//! the store would double the informer's memory (a product target). Instead the live store is
//! the acknowledged state plus an **overlay** for the keys with unacknowledged changes:
//!
//! | key | overlay entry |
//! |---|---|
//! | no unacknowledged change | none: the live entry is acknowledged |
//! | `n` unacknowledged changes | the facts before the oldest of them (or *absent*), and `n` |
//!
//! The decider records an overlay entry before it changes the store for an emitted change
//! ([`Tracked::note_change`]); each change's [`Ack`] is settled by every sink (confirmed, or
//! replaced by coalescing, see the pipeline); when the last sink settles it, `n` drops by one
//! and at zero the entry goes. The acknowledged state is the live store with the overlay
//! applied, which is what [`TrackedStore::acknowledged`] hands the snapshot writer. The
//! overlay holds at most the keys the pipeline holds (`pipeline.max_pending` per sink).
//!
//! While several changes of a key are outstanding, the older facts stay in the overlay even
//! after the first change settles (a count, not a history): the saved state may lag by a
//! change, never lead; a restart then re-sends that key's current state (at-least-once).
//!
//! This module never decides what to emit and never does I/O.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kubesink_sinks::MessageMeta;

use super::facts::Facts;
use super::store::LightStore;
use crate::pipeline::{Ack, Settle};

/// An overlay key: namespace id in the store's interner and name.
#[derive(PartialEq, Eq)]
struct Key(u32, Box<str>);

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        KeyRef(self.0, &self.1).hash(h)
    }
}

/// A borrowed overlay key, for lookups without allocating.
#[derive(PartialEq, Eq, Hash)]
struct KeyRef<'a>(u32, &'a str);

impl hashbrown::Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, k: &Key) -> bool {
        self.0 == k.0 && self.1 == &*k.1
    }
}

/// The overlay entry of a key with unacknowledged changes.
struct Outstanding {
    /// The facts before the oldest unacknowledged change; `None`: the key was absent.
    before: Option<Facts<'static>>,
    /// Changes emitted for the key and not yet settled by every sink.
    changes: u32,
}

/// What the lock protects.
pub struct Tracked {
    /// The live store.
    pub store: LightStore,
    /// `None` when acknowledgements are not tracked (no state store configured).
    overlay: Option<hashbrown::HashMap<Key, Outstanding>>,
    /// The resourceVersion of the last completed list, saved with the state.
    pub list_resource_version: String,
}

impl Tracked {
    /// The facts of `(ns, name)` before a change, to hand to [`Tracked::note_change`]; `None`
    /// when the key is unknown or acknowledgements are not tracked (nothing to keep).
    pub fn before(&self, ns: Option<&str>, name: &str) -> Option<Facts<'static>> {
        self.overlay.as_ref()?;
        self.store.get(ns, name).map(Facts::into_owned)
    }

    /// Records that a change of `(ns, name)` is about to be emitted `count` times (a replaced
    /// uid emits two), with `before` the key's facts before the change. Call before changing
    /// the store. Does nothing when acknowledgements are not tracked.
    pub fn note_change(
        &mut self,
        ns: Option<&str>,
        name: &str,
        before: Option<Facts<'static>>,
        count: u32,
    ) {
        let Some(overlay) = &mut self.overlay else {
            return;
        };
        let id = self.store.intern(ns);
        match overlay.get_mut(&KeyRef(id, name)) {
            Some(o) => o.changes += count,
            None => {
                overlay.insert(
                    Key(id, name.into()),
                    Outstanding {
                        before,
                        changes: count,
                    },
                );
            }
        }
    }
}

/// A watch's store and its acknowledgement overlay, shared behind one mutex. Every holder
/// keeps the lock for one short step (one event's store update, one settle, one packing of
/// the acknowledged state).
pub struct TrackedStore {
    inner: Mutex<Tracked>,
    /// Whether the overlay is on (fixed at creation).
    tracking: bool,
    /// Bumped on every step that may change the store or the overlay: the saver skips a watch
    /// whose state did not move.
    version: AtomicU64,
}

impl TrackedStore {
    /// Shares `store`; `track` turns the overlay on (only useful with a state store).
    pub fn new(store: LightStore, track: bool) -> Arc<Self> {
        Arc::new(TrackedStore {
            inner: Mutex::new(Tracked {
                store,
                overlay: track.then(hashbrown::HashMap::new),
                list_resource_version: String::new(),
            }),
            tracking: track,
            version: AtomicU64::new(0),
        })
    }

    /// Locks for one step that may change the store or the overlay.
    pub fn lock(&self) -> MutexGuard<'_, Tracked> {
        self.version.fetch_add(1, Ordering::Relaxed);
        self.read()
    }

    /// Locks for reading. A panic while locked would be a bug; the store is consistent
    /// between steps, so a poisoned lock is recovered.
    fn read(&self) -> MutexGuard<'_, Tracked> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether acknowledgements are tracked (the overlay is on).
    pub fn tracking(&self) -> bool {
        self.tracking
    }

    /// A number that changes whenever the store or its overlay may have changed.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    /// The acknowledgement of one published change (`meta` names its key), to be settled by
    /// each of `sinks` sinks; `None` when acknowledgements are not tracked.
    pub fn ack(self: &Arc<Self>, meta: &Arc<MessageMeta>, sinks: usize) -> Option<Ack> {
        if !self.tracking {
            return None;
        }
        Some(Arc::new(ChangeAck {
            remaining: AtomicUsize::new(sinks),
            store: self.clone(),
            meta: meta.clone(),
        }))
    }

    /// One change of `(ns, name)` is settled by every sink (or will never be published: an
    /// encoding failure): the overlay forgets it, and the key's live facts become
    /// acknowledged once no other change of it is outstanding.
    pub fn settled(&self, ns: Option<&str>, name: &str) {
        let mut t = self.lock();
        let Some(id) = t.store.ns_id_of(ns) else {
            return;
        };
        let Some(overlay) = &mut t.overlay else {
            return;
        };
        let key = KeyRef(id, name);
        if let Some(o) = overlay.get_mut(&key) {
            o.changes = o.changes.saturating_sub(1);
            if o.changes == 0 {
                overlay.remove(&key);
            }
        }
    }

    /// Keys with unacknowledged changes.
    pub fn outstanding(&self) -> usize {
        self.read().overlay.as_ref().map_or(0, |o| o.len())
    }

    /// Calls `f` with the acknowledged state under the lock: the namespace table, then
    /// [`Acknowledged::for_each`]. Keep `f` short (it blocks the watch's decider).
    pub fn acknowledged<R>(&self, f: impl FnOnce(&Acknowledged<'_>) -> R) -> R {
        let t = self.read();
        f(&Acknowledged { t: &t })
    }
}

/// The acknowledged state of one watch: the live store with the overlay applied.
pub struct Acknowledged<'a> {
    t: &'a Tracked,
}

impl Acknowledged<'_> {
    /// The namespace table the ids of [`Acknowledged::for_each`] index.
    pub fn namespaces(&self) -> &[Box<str>] {
        self.t.store.namespace_table()
    }

    /// The resourceVersion of the last completed list.
    pub fn list_resource_version(&self) -> &str {
        &self.t.list_resource_version
    }

    /// Calls `f(namespace id, name, facts)` for every acknowledged object: live entries
    /// without outstanding changes, and the `before` facts of keys with some.
    pub fn for_each(&self, mut f: impl FnMut(u32, &str, &Facts<'_>)) {
        let overlay = self.t.overlay.as_ref().filter(|o| !o.is_empty());
        self.t.store.for_each(|ns, name, facts| {
            if overlay.is_none_or(|o| !o.contains_key(&KeyRef(ns, name))) {
                f(ns, name, &facts);
            }
        });
        for (Key(ns, name), o) in overlay.into_iter().flatten() {
            if let Some(before) = &o.before {
                f(*ns, name, before);
            }
        }
    }
}

/// The [`Ack`] of one change: settled once per sink; the last settle releases the change in
/// the overlay.
struct ChangeAck {
    remaining: AtomicUsize,
    store: Arc<TrackedStore>,
    meta: Arc<MessageMeta>,
}

impl Settle for ChangeAck {
    fn settle(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.store
                .settled(self.meta.namespace.as_deref(), &self.meta.name);
        }
    }
}

/// The acknowledged state as sorted `(namespace, name, resourceVersion)`, for tests.
#[cfg(test)]
pub fn acknowledged_keys(s: &TrackedStore) -> Vec<(String, String, String)> {
    s.acknowledged(|a| {
        let mut v = Vec::new();
        let table = a.namespaces();
        a.for_each(|ns, name, f| {
            v.push((
                table[ns as usize].to_string(),
                name.to_owned(),
                f.rv.render(),
            ))
        });
        v.sort();
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubesink_sinks::{Op, Resource};

    const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";

    fn meta(name: &str) -> Arc<MessageMeta> {
        Arc::new(MessageMeta {
            id: "0".into(),
            op: Op::Updated,
            resource: Arc::new(Resource::new("c", "", "v1", "Pod", "pods", true)),
            namespace: Some("ns".into()),
            name: name.into(),
            tombstone_id: None,
            uid: "u".into(),
            observed_at: "2026-11-30T00:00:00.000Z".into(),
        })
    }

    /// Observes (ns, name) at rv with fingerprint rv, recording the change like the decider.
    fn change(s: &TrackedStore, name: &str, rv: u64) {
        let mut t = s.lock();
        let before = t.store.get(Some("ns"), name).map(Facts::into_owned);
        t.note_change(Some("ns"), name, before, 1);
        t.store.observe(Some("ns"), name, U1, &rv.to_string(), rv);
    }

    fn rvs(s: &TrackedStore) -> Vec<(String, String)> {
        acknowledged_keys(s)
            .into_iter()
            .map(|(_, n, rv)| (n, rv))
            .collect()
    }

    #[test]
    fn a_change_is_acknowledged_only_when_every_sink_settled_it() {
        let s = TrackedStore::new(LightStore::new(), true);
        change(&s, "a", 1);
        assert_eq!(rvs(&s), [], "an unacknowledged add is absent");
        let ack = s.ack(&meta("a"), 2).unwrap();
        ack.settle();
        assert_eq!(rvs(&s), [], "one of two sinks");
        ack.settle();
        assert_eq!(rvs(&s), [("a".into(), "1".into())]);
        assert_eq!(s.outstanding(), 0);
    }

    #[test]
    fn the_oldest_unacknowledged_facts_stay_until_every_change_of_the_key_settled() {
        let s = TrackedStore::new(LightStore::new(), true);
        change(&s, "a", 1);
        s.ack(&meta("a"), 1).unwrap().settle();
        let (b2, b3) = (s.ack(&meta("a"), 1).unwrap(), s.ack(&meta("a"), 1).unwrap());
        change(&s, "a", 2);
        change(&s, "a", 3);
        b3.settle(); // e.g. the newer change replaced the older one by coalescing
        assert_eq!(rvs(&s), [("a".into(), "1".into())], "lags, never leads");
        b2.settle();
        assert_eq!(rvs(&s), [("a".into(), "3".into())]);
    }

    #[test]
    fn an_unacknowledged_delete_keeps_the_key_and_untracked_stores_need_no_acks() {
        let s = TrackedStore::new(LightStore::new(), true);
        change(&s, "a", 1);
        s.settled(Some("ns"), "a");
        {
            let mut t = s.lock();
            let before = t.store.get(Some("ns"), "a").map(Facts::into_owned);
            t.note_change(Some("ns"), "a", before, 1);
            t.store.remove(Some("ns"), "a");
        }
        assert_eq!(rvs(&s), [("a".into(), "1".into())]);
        s.settled(Some("ns"), "a");
        assert_eq!(rvs(&s), []);
        let plain = TrackedStore::new(LightStore::new(), false);
        assert!(plain.ack(&meta("a"), 1).is_none());
        change(&plain, "a", 1);
        assert_eq!(rvs(&plain), [("a".into(), "1".into())]);
    }
}
