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
//! # Keys downstream may have: unconfirmed entries and the journal
//!
//! Lagging is safe for updates and deletes, not for a new key: if an `added` was sent but
//! not confirmed, downstream may have the key while the acknowledged state does not, and a
//! restart after it was deleted could never send its `deleted` (a ghost). So the overlay
//! also remembers the uid and resourceVersion of the newest `added` of a key with outstanding
//! changes, and the acknowledged state lists such keys as **unconfirmed**
//! ([`Facts::unconfirmed`]): the next list re-sends them if they exist and sends their
//! `deleted` if not. Between saves, each `added` is first recorded in the state journal
//! ([`NewKeys`]); its acknowledgement carries the journal position that must be durable
//! before any sink sends it ([`WriteAhead`]).
//!
//! This module never decides what to emit and never does I/O.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use kubesink_core::{MessageMeta, Op};

use super::facts::{Facts, Rv, Uid};
use super::store::LightStore;
use crate::pipeline::{Ack, Settle, WriteAhead};

/// Where new keys are recorded before their `added` may be sent: the state journal
/// (`state/journal.rs`), named here as a trait so that the informer does not depend on the
/// state module.
#[async_trait]
pub trait NewKeys: Send + Sync {
    /// Records that `(namespace, name)` of watch `watch` (its index in the journal) with
    /// `uid` and resourceVersion `rv` is about to be sent as `added`, and returns the position
    /// that must be durable before it is sent; `None` when the journal's buffer is full (wait
    /// for [`NewKeys::room`], then try again).
    fn try_record(
        &self,
        watch: u32,
        namespace: Option<&str>,
        name: &str,
        uid: &str,
        rv: &str,
    ) -> Option<WriteAhead>;

    /// Resolves when the buffer may have room again.
    async fn room(&self);

    /// The position of the newest record: a change that adds no key waits for it, so it
    /// never overtakes (by coalescing) a record of its key.
    fn covered(&self) -> WriteAhead;
}

/// Records a new key in `journal` ([`NewKeys::try_record`]), waiting for [`NewKeys::room`]
/// while its buffer is full (backpressure). A plain function rather than a provided trait
/// method: the `async_trait` method would box a future for every `added`, where this boxes
/// one only when the informer has to wait.
pub async fn record_new_key(
    journal: &dyn NewKeys,
    watch: u32,
    namespace: Option<&str>,
    name: &str,
    uid: &str,
    rv: &str,
) -> WriteAhead {
    loop {
        match journal.try_record(watch, namespace, name, uid, rv) {
            Some(point) => return point,
            None => journal.room().await,
        }
    }
}

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
    /// uid and resourceVersion of the newest `added` among them: downstream may have it.
    added: Option<(Uid<'static>, Rv<'static>)>,
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
                // The overlay refers to the namespace by id: keep it while the key is here.
                self.store.pin_namespace(ns);
                overlay.insert(
                    Key(id, name.into()),
                    Outstanding {
                        before,
                        changes: count,
                        added: None,
                    },
                );
            }
        }
    }

    /// Records that the change just noted for `(ns, name)` is (or includes) the `deleted`
    /// of `uid`, carrying resourceVersion `rv`: until every sink settled it, a destination
    /// may still hold that uid, and the acknowledged state names it (a
    /// [`Former`](super::store::Former) in the store) even once the key has a newer uid, so
    /// a crash before the `deleted` arrives still sends it after the restart. Does nothing
    /// when acknowledgements are not tracked.
    pub fn note_deleted(&mut self, ns: Option<&str>, name: &str, uid: &str, rv: &str) {
        if self.overlay.is_none() {
            return;
        }
        let id = self.store.intern(ns);
        let (uid, rv) = (Uid::parse(uid).into_owned(), Rv::parse(rv).into_owned());
        self.store.add_former(id, name, uid, rv, true);
    }

    /// Records that the change just noted for `(ns, name)` is an `added` of `uid` at `rv`
    /// (after [`Tracked::note_change`]): until it settles, the acknowledged state lists the
    /// key as unconfirmed. Does nothing when acknowledgements are not tracked.
    pub fn note_added(&mut self, ns: Option<&str>, name: &str, uid: &str, rv: &str) {
        let Some(overlay) = &mut self.overlay else {
            return;
        };
        let Some(id) = self.store.ns_id_of(ns) else {
            return;
        };
        if let Some(o) = overlay.get_mut(&KeyRef(id, name)) {
            o.added = Some((Uid::parse(uid).into_owned(), Rv::parse(rv).into_owned()));
        }
    }
}

/// A watch's place in the state journal: the journal and the watch's index in it.
#[derive(Clone)]
pub struct JournalRef {
    /// The journal.
    pub journal: Arc<dyn NewKeys>,
    /// The watch's index in it.
    pub watch: u32,
}

/// A watch's store and its acknowledgement overlay, shared behind one mutex. Every holder
/// keeps the lock for one short step (one event's store update, one settle, one packing of
/// the acknowledged state).
pub struct TrackedStore {
    inner: Mutex<Tracked>,
    /// Whether the overlay is on (fixed at creation).
    tracking: bool,
    /// Where `added` changes are recorded before they are sent (with a state journal).
    journal: Option<JournalRef>,
    /// Bumped on every step that may change the store or the overlay: the saver skips a watch
    /// whose state did not move.
    version: AtomicU64,
}

impl TrackedStore {
    /// Shares `store`; `track` turns the overlay on (only useful with a state store).
    pub fn new(store: LightStore, track: bool) -> Arc<Self> {
        Self::build(store, track, None)
    }

    /// Shares `store`, tracking acknowledgements and recording every `added` in `journal`
    /// before it may be sent.
    pub fn with_journal(store: LightStore, journal: JournalRef) -> Arc<Self> {
        Self::build(store, true, Some(journal))
    }

    fn build(store: LightStore, track: bool, journal: Option<JournalRef>) -> Arc<Self> {
        Arc::new(TrackedStore {
            inner: Mutex::new(Tracked {
                store,
                overlay: track.then(hashbrown::HashMap::new),
                list_resource_version: String::new(),
            }),
            tracking: track,
            journal,
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

    /// The acknowledgement of one published change (`meta` names its key and op; `rv` is
    /// its resourceVersion), to be settled by each of `sinks` sinks; `None` when
    /// acknowledgements are not tracked. With a journal, an `added` is recorded there first
    /// (waiting while its buffer is full), and the acknowledgement carries the journal
    /// position that must be durable before the change is sent.
    pub async fn ack(
        self: &Arc<Self>,
        meta: &Arc<MessageMeta>,
        rv: &str,
        sinks: usize,
    ) -> Option<Ack> {
        if !self.tracking {
            return None;
        }
        let write_ahead = match &self.journal {
            None => None,
            Some(j) if meta.op == Op::Added => {
                let ns = meta.namespace.as_deref();
                Some(record_new_key(&*j.journal, j.watch, ns, &meta.name, &meta.uid, rv).await)
            }
            Some(j) => Some(j.journal.covered()),
        };
        Some(Arc::new(ChangeAck {
            remaining: AtomicUsize::new(sinks),
            store: self.clone(),
            meta: meta.clone(),
            write_ahead,
        }))
    }

    /// One change of `(ns, name)` is settled by every sink (or will never be published: an
    /// encoding failure): the overlay forgets it, and the key's live facts become
    /// acknowledged once no other change of it is outstanding. `deleted_uid`: the change was
    /// the `deleted` of that uid; when it is a former uid of the key ([`Former`](super::store::Former)), the
    /// acknowledged state stops naming it.
    pub fn settled(&self, ns: Option<&str>, name: &str, deleted_uid: Option<&str>) {
        let mut guard = self.lock();
        let t = &mut *guard;
        if let Some(uid) = deleted_uid {
            t.store.settle_former(ns, name, uid);
        }
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
                t.store.unpin_namespace(id);
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

    /// Calls `f(namespace id, name, facts)` for every acknowledged object: first every
    /// former uid a destination may hold ([`Former`](super::store::Former), as unconfirmed facts), then live
    /// entries without outstanding changes, and for keys with some, the newest outstanding
    /// `added` as unconfirmed facts (downstream may have it), else the `before` facts.
    ///
    /// A key can come more than once, with different uids: its former ones first. Restoring
    /// the entries in this order ([`LightStore::restore`]) rebuilds the formers.
    pub fn for_each(&self, mut f: impl FnMut(u32, &str, &Facts<'_>)) {
        let overlay = self.t.overlay.as_ref().filter(|o| !o.is_empty());
        let store = &self.t.store;
        store.for_each_former(|ns, name, former| {
            // The uid the entries below name for the key: no need to name it twice.
            let current = match overlay.and_then(|o| o.get(&KeyRef(ns, name))) {
                Some(o) => match (&o.added, &o.before) {
                    (Some((uid, _)), _) => Some(uid.clone()),
                    (None, before) => before.as_ref().map(|b| b.uid.clone()),
                },
                None => {
                    let ns = store.namespace_table().get(ns as usize).map(|n| &**n);
                    store.get(ns, name).map(|f| f.uid.into_owned())
                }
            };
            if current.as_ref() != Some(&former.uid) {
                f(
                    ns,
                    name,
                    &Facts::unconfirmed(former.uid.clone(), former.rv.clone()),
                )
            }
        });
        self.t.store.for_each(|ns, name, facts| {
            if overlay.is_none_or(|o| !o.contains_key(&KeyRef(ns, name))) {
                f(ns, name, &facts);
            }
        });
        for (Key(ns, name), o) in overlay.into_iter().flatten() {
            match (&o.added, &o.before) {
                (Some((uid, rv)), _) => f(*ns, name, &Facts::unconfirmed(uid.clone(), rv.clone())),
                (None, Some(before)) => f(*ns, name, before),
                (None, None) => {}
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
    write_ahead: Option<WriteAhead>,
}

impl Settle for ChangeAck {
    fn settle(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let deleted = (self.meta.op == Op::Deleted).then_some(&*self.meta.uid);
            self.store
                .settled(self.meta.namespace.as_deref(), &self.meta.name, deleted);
        }
    }

    fn write_ahead(&self) -> Option<&WriteAhead> {
        self.write_ahead.as_ref()
    }
}

/// The confirmed part of the acknowledged state as sorted `(namespace, name,
/// resourceVersion)`, for tests.
#[cfg(test)]
pub fn acknowledged_keys(s: &TrackedStore) -> Vec<(String, String, String)> {
    keys_where(s, false)
}

/// The unconfirmed part of the acknowledged state, as [`acknowledged_keys`].
#[cfg(test)]
pub fn unconfirmed_keys(s: &TrackedStore) -> Vec<(String, String, String)> {
    keys_where(s, true)
}

#[cfg(test)]
fn keys_where(s: &TrackedStore, unconfirmed: bool) -> Vec<(String, String, String)> {
    s.acknowledged(|a| {
        let mut v = Vec::new();
        let table = a.namespaces();
        a.for_each(|ns, name, f| {
            if f.unconfirmed == unconfirmed {
                v.push((
                    table[ns as usize].to_string(),
                    name.to_owned(),
                    f.rv.render(),
                ))
            }
        });
        v.sort();
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubesink_core::{Op, Resource};

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
            changed: None,
            has_changes: false,
        })
    }

    /// Observes (ns, name) at rv with fingerprint rv, recording the change like the decider
    /// (an `added` when the key is new).
    fn change(s: &TrackedStore, name: &str, rv: u64) {
        let mut t = s.lock();
        let before = t.store.get(Some("ns"), name).map(Facts::into_owned);
        let new = before.is_none();
        t.note_change(Some("ns"), name, before, 1);
        if new {
            t.note_added(Some("ns"), name, U1, &rv.to_string());
        }
        t.store.observe(Some("ns"), name, U1, &rv.to_string(), rv);
    }

    fn rvs(s: &TrackedStore) -> Vec<(String, String)> {
        acknowledged_keys(s)
            .into_iter()
            .map(|(_, n, rv)| (n, rv))
            .collect()
    }

    fn unconfirmed(s: &TrackedStore) -> Vec<(String, String)> {
        unconfirmed_keys(s)
            .into_iter()
            .map(|(_, n, rv)| (n, rv))
            .collect()
    }

    async fn ack(s: &Arc<TrackedStore>, name: &str, sinks: usize) -> Ack {
        s.ack(&meta(name), "0", sinks).await.unwrap()
    }

    #[tokio::test]
    async fn a_change_is_acknowledged_only_when_every_sink_settled_it() {
        let s = TrackedStore::new(LightStore::new(), true);
        change(&s, "a", 1);
        assert_eq!(rvs(&s), [], "an unacknowledged add is not confirmed");
        assert_eq!(
            unconfirmed(&s),
            [("a".into(), "1".into())],
            "but downstream may have it"
        );
        let ack = ack(&s, "a", 2).await;
        ack.settle();
        assert_eq!(rvs(&s), [], "one of two sinks");
        ack.settle();
        assert_eq!(rvs(&s), [("a".into(), "1".into())]);
        assert_eq!(unconfirmed(&s), []);
        assert_eq!(s.outstanding(), 0);
    }

    #[tokio::test]
    async fn the_oldest_unacknowledged_facts_stay_until_every_change_of_the_key_settled() {
        let s = TrackedStore::new(LightStore::new(), true);
        change(&s, "a", 1);
        ack(&s, "a", 1).await.settle();
        let (b2, b3) = (ack(&s, "a", 1).await, ack(&s, "a", 1).await);
        change(&s, "a", 2);
        change(&s, "a", 3);
        b3.settle(); // e.g. the newer change replaced the older one by coalescing
        assert_eq!(rvs(&s), [("a".into(), "1".into())], "lags, never leads");
        b2.settle();
        assert_eq!(rvs(&s), [("a".into(), "3".into())]);
    }

    #[tokio::test]
    async fn an_unacknowledged_delete_keeps_the_key_and_untracked_stores_need_no_acks() {
        let s = TrackedStore::new(LightStore::new(), true);
        change(&s, "a", 1);
        s.settled(Some("ns"), "a", None);
        {
            let mut t = s.lock();
            let before = t.store.get(Some("ns"), "a").map(Facts::into_owned);
            t.note_change(Some("ns"), "a", before, 1);
            t.store.remove(Some("ns"), "a");
        }
        assert_eq!(rvs(&s), [("a".into(), "1".into())]);
        s.settled(Some("ns"), "a", None);
        assert_eq!(rvs(&s), []);
        let plain = TrackedStore::new(LightStore::new(), false);
        assert!(plain.ack(&meta("a"), "0", 1).await.is_none());
        change(&plain, "a", 1);
        assert_eq!(rvs(&plain), [("a".into(), "1".into())]);
    }

    #[tokio::test]
    async fn an_add_then_delete_both_outstanding_stays_unconfirmed_until_both_settle() {
        // Downstream may have received the `added` and not yet the `deleted`: a restart must
        // be able to send the delete, so the key stays in the saved state as unconfirmed.
        let s = TrackedStore::new(LightStore::new(), true);
        change(&s, "a", 1);
        {
            let mut t = s.lock();
            let before = t.store.get(Some("ns"), "a").map(Facts::into_owned);
            t.note_change(Some("ns"), "a", before, 1);
            t.store.remove(Some("ns"), "a");
        }
        assert_eq!(unconfirmed(&s), [("a".into(), "1".into())]);
        s.settled(Some("ns"), "a", None);
        assert_eq!(unconfirmed(&s), [("a".into(), "1".into())], "one of two");
        s.settled(Some("ns"), "a", None);
        assert_eq!((rvs(&s), unconfirmed(&s)), (vec![], vec![]));
    }
}
