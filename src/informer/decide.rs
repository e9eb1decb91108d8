//! The informer's decision step: one watcher event in, the changes to emit out. Synchronous
//! and I/O-free, like kube-runtime's `reflector::store::Writer::apply_watcher_event`, so every
//! row of the semantics table is a unit test without a server.
//!
//! # Semantics (the Lyft Clutch lightweight informer, done right)
//!
//! | watcher event | store | emitted |
//! |---|---|---|
//! | `Init` (a list starts: first sync, or relist after 410 Gone / desync) | new list epoch | — |
//! | `InitApply(obj)` / `Apply(obj)`, key unknown | insert | `added` |
//! | same, key known, fingerprint differs | update | `updated` (unless `updates = false`) |
//! | same, key known, fingerprint equal | update rv | nothing (relist duplicates, dropped-field changes) |
//! | same, key known, uid differs | replace | `deleted` (old uid, `finalStateUnknown`), then `added` |
//! | `Delete(obj)` | remove | `deleted` with the final object |
//! | `InitDone` | sweep keys not seen in this list | `deleted`, `finalStateUnknown: true`, each |
//! | any object without `metadata.name` | — | nothing; [`InformerError::MissingName`] |
//!
//! `initial` is true for changes emitted during the informer's first list ([`Phase`]).
//!
//! # Starting from saved state
//!
//! [`Decider::with_store`] seeds the store with the state a previous run saved
//! (acknowledged by every sink). The first list then behaves like a relist: not `initial`,
//! differences only (`added` for new keys, `updated` where the fingerprint changed, nothing
//! for unchanged objects), and its `InitDone` sweep emits the `deleted` with
//! `finalStateUnknown` of every key that vanished while kubesink was down.
//!
//! # Acknowledged state and sync markers
//!
//! The store is a [`TrackedStore`]: with [`Decider::track_acknowledgements`] every emitted
//! change first records the key's previous facts in the store's overlay, and
//! [`Decider::ack`] gives the published message the handle that releases them once every
//! sink confirmed it (see `tracked.rs`). With [`Decider::with_sync_markers`], the end of each
//! list leaves a [`Synced`] for [`Decider::take_synced`], to be published after the list's
//! changes.
//!
//! The decider owns the [`LightStore`] (shared, behind a short lock, with the acknowledgements
//! and the state saver); it never keeps an object after returning its change.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use kubesink_sinks::message::{Change, Synced};
use kubesink_sinks::{Message, Op, Resource};

use super::facts::Facts;
use super::payload::{fingerprint, Shaper};
use super::store::{LightStore, Observed, Vanished};
use super::tracked::{Tracked, TrackedStore};
use crate::pipeline::Ack;

/// Counters of one informer, readable while it runs.
#[derive(Debug, Default)]
pub struct InformerStats {
    /// Watch and list events read from the API server.
    pub events_received: AtomicU64,
    /// Changes emitted into the pipeline.
    pub emitted: AtomicU64,
    /// Events that changed nothing in the emitted payload.
    pub suppressed: AtomicU64,
    /// Deletes inferred after a relist or uid change.
    pub inferred_deletes: AtomicU64,
    /// Lists started (1 = initial sync only; more = relists).
    pub lists: AtomicU64,
    /// Objects currently known.
    pub objects: AtomicU64,
    /// The first list has completed.
    pub synced: AtomicBool,
    /// Watcher errors (each retried with backoff).
    pub errors: AtomicU64,
}

/// Where an informer is in the list/watch protocol. Transitions: `Starting` —`Init`→
/// `InitialList` —`InitDone`→ `Watching` —`Init` (relist)→ `Relist` —`InitDone`→ `Watching`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the first `Init`.
    Starting,
    /// First list in progress: changes are `initial`.
    InitialList {
        /// When the list started.
        started: Instant,
        /// Objects listed so far.
        listed: u64,
    },
    /// A relist (after 410 Gone or a watch restart) in progress.
    Relist {
        /// When the list started.
        started: Instant,
        /// Objects listed so far.
        listed: u64,
    },
    /// Following the watch stream.
    Watching,
}

/// Why an event could not be turned into a change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InformerError {
    /// An object without `metadata.name` (skipped).
    #[error("{resource} in {scope}: object without metadata.name skipped (namespace {namespace:?}, uid {uid:?})")]
    MissingName {
        /// `apiVersion Kind`.
        resource: String,
        /// Namespace or `all namespaces`.
        scope: String,
        /// The object's namespace, if any.
        namespace: Option<String>,
        /// The object's uid, if any.
        uid: Option<String>,
    },
}

/// The decision step of one watch: store, phase, shaping and the `updates` switch.
pub struct Decider {
    resource: Arc<Resource>,
    scope: String,
    store: Arc<TrackedStore>,
    /// The store holds saved state: the first list is a relist, not `initial`.
    restored: bool,
    phase: Phase,
    shaper: Shaper,
    updates: bool,
    stats: Arc<InformerStats>,
    /// `Some(namespace the watch covers)` when sync markers are on.
    markers: Option<Option<String>>,
    /// The marker of the list that just ended, until taken.
    synced: Option<Synced>,
    /// Highest decimal resourceVersion among the objects of the current list.
    list_max_rv: Option<u64>,
    /// The current list's own resourceVersion, when the watch loop knows it.
    list_rv: Option<String>,
}

/// The store as [`Decider::store`] lends it (under the store's lock).
pub struct StoreRef<'a>(std::sync::MutexGuard<'a, Tracked>);

impl std::ops::Deref for StoreRef<'_> {
    type Target = LightStore;
    fn deref(&self) -> &LightStore {
        &self.0.store
    }
}

impl Decider {
    /// A decider for `resource` watched in `scope` (`namespace x`, `all namespaces`,
    /// `cluster`), starting with an empty store.
    pub fn new(resource: Arc<Resource>, scope: String, shaper: Shaper, updates: bool) -> Self {
        Decider {
            resource,
            scope,
            store: TrackedStore::new(LightStore::new(), false),
            restored: false,
            phase: Phase::Starting,
            shaper,
            updates,
            stats: Arc::new(InformerStats::default()),
            markers: None,
            synced: None,
            list_max_rv: None,
            list_rv: None,
        }
    }

    /// A decider starting from `store`, the state a previous run saved (see the module
    /// docs): its first list emits differences only and sweeps what vanished meanwhile.
    pub fn with_store(
        resource: Arc<Resource>,
        scope: String,
        shaper: Shaper,
        updates: bool,
        store: LightStore,
    ) -> Self {
        let objects = store.len() as u64;
        let mut d = Decider::new(resource, scope, shaper, updates);
        d.store = TrackedStore::new(store, false);
        d.restored = true;
        d.stats.objects.store(objects, Ordering::Relaxed);
        d
    }

    /// Turns on acknowledgement tracking (needed to save state): each emitted change
    /// records the key's previous facts until [`Decider::ack`]'s handle is settled by every
    /// sink. Call before the first event.
    pub fn track_acknowledgements(mut self) -> Self {
        let store = std::mem::take(&mut self.store.lock().store);
        self.store = TrackedStore::new(store, true);
        self
    }

    /// Turns on sync markers for a watch covering `namespace` (`None`: all namespaces or a
    /// cluster-scoped kind): each list's end leaves a [`Synced`] for
    /// [`Decider::take_synced`].
    pub fn with_sync_markers(mut self, namespace: Option<String>) -> Self {
        self.markers = Some(namespace);
        self
    }

    /// The shared store, for the state saver.
    pub fn tracked(&self) -> Arc<TrackedStore> {
        self.store.clone()
    }

    /// The acknowledgement handle of `msg`, the encoded form of a change this decider just
    /// returned, for a pipeline of `sinks` sinks; `None` when acknowledgements are not
    /// tracked.
    pub fn ack(&self, msg: &Message, sinks: usize) -> Option<Ack> {
        self.store.ack(&msg.meta, sinks)
    }

    /// A change this decider returned will never be published (encoding failed): release
    /// it, as if every sink had confirmed it.
    pub fn abandon(&self, change: &Change) {
        if self.store.tracking() {
            self.store
                .settled(change.namespace.as_deref(), &change.name);
        }
    }

    /// The sync marker of the list that just ended (once), when sync markers are on. Publish
    /// it after the changes of the `InitDone` event that produced it.
    pub fn take_synced(&mut self) -> Option<Synced> {
        self.synced.take()
    }

    /// The current list's own resourceVersion (`metadata.resourceVersion` of the list
    /// response), for its sync marker and the saved state. kube-runtime's watcher does not
    /// expose it; until the watch loop does, the highest resourceVersion among the listed
    /// objects stands in (empty for an empty list). Call before `InitDone`.
    pub fn note_list_resource_version(&mut self, rv: &str) {
        self.list_rv = Some(rv.to_owned());
    }

    /// The counters.
    pub fn stats(&self) -> Arc<InformerStats> {
        self.stats.clone()
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The store (keys, uids, resourceVersions, fingerprints), locked while borrowed.
    pub fn store(&self) -> StoreRef<'_> {
        StoreRef(self.store.lock())
    }

    /// Applies one watcher event; returns the changes to emit, in order.
    ///
    /// # Errors
    /// [`InformerError::MissingName`] for an object without `metadata.name`: nothing is
    /// emitted or stored for it.
    pub fn on_event(&mut self, event: Event<DynamicObject>) -> Result<Vec<Change>, InformerError> {
        match event {
            Event::Init => {
                self.begin_list();
                Ok(Vec::new())
            }
            Event::InitApply(obj) => {
                self.stats.events_received.fetch_add(1, Ordering::Relaxed);
                self.count_listed();
                let rv = obj.metadata.resource_version.as_deref();
                if let Some(rv) = rv.and_then(|r| r.parse::<u64>().ok()) {
                    self.list_max_rv = self.list_max_rv.max(Some(rv));
                }
                let initial = matches!(self.phase, Phase::InitialList { .. });
                self.apply(obj, initial)
            }
            Event::InitDone => Ok(self.end_list()),
            Event::Apply(obj) => {
                self.stats.events_received.fetch_add(1, Ordering::Relaxed);
                self.apply(obj, false)
            }
            Event::Delete(obj) => {
                self.stats.events_received.fetch_add(1, Ordering::Relaxed);
                self.delete(obj)
            }
        }
    }

    fn begin_list(&mut self) {
        self.stats.lists.fetch_add(1, Ordering::Relaxed);
        self.store.lock().store.begin_list();
        (self.list_max_rv, self.list_rv) = (None, None);
        let started = Instant::now();
        let (resource, scope) = (&self.resource, &self.scope);
        self.phase = if self.stats.synced.load(Ordering::Relaxed) {
            tracing::info!(cluster = %resource.cluster, %resource, %scope, "relist started");
            Phase::Relist { started, listed: 0 }
        } else if self.restored {
            tracing::info!(cluster = %resource.cluster, %resource, %scope, "list started: differences against the saved state");
            Phase::Relist { started, listed: 0 }
        } else {
            tracing::info!(cluster = %resource.cluster, %resource, %scope, "initial list started");
            Phase::InitialList { started, listed: 0 }
        };
    }

    fn count_listed(&mut self) {
        if let Phase::InitialList { listed, started } | Phase::Relist { listed, started } =
            &mut self.phase
        {
            *listed += 1;
            if *listed % 10_000 == 0 {
                let (listed, elapsed) = (*listed, started.elapsed());
                let (resource, scope) = (&self.resource, &self.scope);
                tracing::info!(cluster = %resource.cluster, %resource, %scope, listed, ?elapsed, "listing");
            }
        }
    }

    /// `InitDone`: every key of an older epoch vanished while the watch was down.
    fn end_list(&mut self) -> Vec<Change> {
        let tracking = self.store.tracking();
        let resource_version = match self.list_rv.take() {
            Some(rv) => rv,
            None => self.list_max_rv.map(|n| n.to_string()).unwrap_or_default(),
        };
        let (vanished, count) = {
            let mut t = self.store.lock();
            let vanished = t.store.end_list();
            if tracking {
                for v in &vanished {
                    let before = Facts::from_text(&v.uid, &v.rv, v.fingerprint);
                    t.note_change(v.namespace.as_deref(), &v.name, Some(before), 1);
                }
            }
            t.list_resource_version = resource_version.clone();
            (vanished, t.store.len())
        };
        if let Some(namespace) = &self.markers {
            self.synced = Some(Synced {
                namespace: namespace.clone(),
                count: count as u64,
                resource_version,
                initial: matches!(self.phase, Phase::InitialList { .. }),
            });
        }
        let (what, started, listed) = match self.phase {
            Phase::InitialList { started, listed } => ("initial sync complete", started, listed),
            Phase::Relist { started, listed } => ("relist complete", started, listed),
            Phase::Starting | Phase::Watching => ("list complete", Instant::now(), 0),
        };
        let (resource, scope) = (&self.resource, &self.scope);
        tracing::info!(cluster = %resource.cluster, %resource, %scope, objects = listed, vanished = vanished.len(), elapsed = ?started.elapsed(), "{what}");
        self.phase = Phase::Watching;
        self.stats.synced.store(true, Ordering::Relaxed);
        self.note_size();
        self.stats
            .inferred_deletes
            .fetch_add(vanished.len() as u64, Ordering::Relaxed);
        let changes: Vec<Change> = vanished.into_iter().map(inferred_delete).collect();
        self.stats
            .emitted
            .fetch_add(changes.len() as u64, Ordering::Relaxed);
        changes
    }

    fn note_size(&self) {
        let objects = self.store.lock().store.len() as u64;
        self.stats.objects.store(objects, Ordering::Relaxed);
    }

    fn missing_name(&self, obj: &DynamicObject) -> InformerError {
        InformerError::MissingName {
            resource: self.resource.to_string(),
            scope: self.scope.clone(),
            namespace: obj.metadata.namespace.clone(),
            uid: obj.metadata.uid.clone(),
        }
    }

    fn apply(&mut self, obj: DynamicObject, initial: bool) -> Result<Vec<Change>, InformerError> {
        let Some(name) = obj.metadata.name.clone() else {
            return Err(self.missing_name(&obj));
        };
        let namespace = obj.metadata.namespace.clone();
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        let shaped = self.shaper.shape(obj);
        let fp = fingerprint(&shaped);
        let mut t = self.store.lock();
        let before = t.before(namespace.as_deref(), &name);
        let observed = t.store.observe(namespace.as_deref(), &name, &uid, &rv, fp);
        self.stats
            .objects
            .store(t.store.len() as u64, Ordering::Relaxed);
        let mut changes = Vec::with_capacity(1);
        let op = match observed {
            Observed::New => Op::Added,
            Observed::Changed if self.updates => Op::Updated,
            Observed::Changed | Observed::Unchanged => {
                self.stats.suppressed.fetch_add(1, Ordering::Relaxed);
                return Ok(changes);
            }
            Observed::Replaced {
                old_uid,
                old_rv,
                old_fingerprint,
            } => {
                self.stats.inferred_deletes.fetch_add(1, Ordering::Relaxed);
                changes.push(inferred_delete(Vanished {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    uid: old_uid,
                    rv: old_rv,
                    fingerprint: old_fingerprint,
                }));
                Op::Added
            }
        };
        let emitted = if changes.is_empty() { 1 } else { 2 };
        t.note_change(namespace.as_deref(), &name, before, emitted);
        drop(t);
        changes.push(Change {
            op,
            namespace,
            name,
            uid,
            resource_version: rv,
            initial,
            final_state_unknown: false,
            object: Some(shaped),
        });
        self.stats
            .emitted
            .fetch_add(changes.len() as u64, Ordering::Relaxed);
        Ok(changes)
    }

    fn delete(&mut self, obj: DynamicObject) -> Result<Vec<Change>, InformerError> {
        let Some(name) = obj.metadata.name.clone() else {
            return Err(self.missing_name(&obj));
        };
        let namespace = obj.metadata.namespace.clone();
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        {
            let mut t = self.store.lock();
            let before = t.before(namespace.as_deref(), &name);
            t.note_change(namespace.as_deref(), &name, before, 1);
            t.store.remove(namespace.as_deref(), &name);
        }
        self.note_size();
        self.stats.emitted.fetch_add(1, Ordering::Relaxed);
        Ok(vec![Change {
            op: Op::Deleted,
            namespace,
            name,
            uid,
            resource_version: rv,
            initial: false,
            final_state_unknown: false,
            object: Some(self.shaper.shape(obj)),
        }])
    }
}

/// The `deleted` of an object that vanished unseen (relist sweep, uid replaced).
fn inferred_delete(v: Vanished) -> Change {
    Change {
        op: Op::Deleted,
        namespace: v.namespace,
        name: v.name,
        uid: v.uid,
        resource_version: v.rv,
        initial: false,
        final_state_unknown: true,
        object: None,
    }
}

#[cfg(test)]
mod restart_tests;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::ResourceConfig;

    pub(super) const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";
    pub(super) const U2: &str = "1d0f26d0-5b32-4c1a-ba4f-4c897e871cf9";

    pub(super) fn decider(res: ResourceConfig) -> Decider {
        let resource = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
        let shaper = Shaper::new(&res, "kubesink.io/cluster", "test");
        Decider::new(resource, "all namespaces".into(), shaper, res.updates)
    }

    pub(super) fn pod(name: &str, uid: &str, rv: u64, image: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "resourceVersion": rv.to_string()},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .unwrap()
    }

    /// (op, name, initial, finalStateUnknown) of each change.
    pub(super) fn summary(changes: &[Change]) -> Vec<(Op, &str, bool, bool)> {
        changes
            .iter()
            .map(|c| (c.op, c.name.as_str(), c.initial, c.final_state_unknown))
            .collect()
    }

    /// A decider that has listed `pods` and is watching.
    pub(super) fn synced(pods: Vec<DynamicObject>) -> Decider {
        let mut d = decider(ResourceConfig::new("v1", "Pod"));
        d.on_event(Event::Init).unwrap();
        for p in pods {
            d.on_event(Event::InitApply(p)).unwrap();
        }
        d.on_event(Event::InitDone).unwrap();
        d
    }

    #[test]
    fn a_new_key_is_added_and_initial_only_during_the_first_list() {
        let mut d = decider(ResourceConfig::new("v1", "Pod"));
        assert_eq!(d.on_event(Event::Init).unwrap(), vec![]);
        let c = d.on_event(Event::InitApply(pod("a", U1, 1, "i"))).unwrap();
        assert_eq!(summary(&c), [(Op::Added, "a", true, false)]);
        assert_eq!(c[0].uid, U1);
        assert_eq!(c[0].resource_version, "1");
        assert_eq!(
            c[0].object.as_ref().unwrap()["metadata"]["labels"]["kubesink.io/cluster"],
            "test"
        );
        assert_eq!(d.on_event(Event::InitDone).unwrap(), vec![]);
        assert_eq!(d.phase(), Phase::Watching);
        let c = d.on_event(Event::Apply(pod("b", U2, 2, "i"))).unwrap();
        assert_eq!(summary(&c), [(Op::Added, "b", false, false)]);
        // A relist is not the first list: nothing it emits is initial.
        d.on_event(Event::Init).unwrap();
        assert!(matches!(d.phase(), Phase::Relist { .. }));
        let c = d.on_event(Event::InitApply(pod("c", U1, 3, "i"))).unwrap();
        assert_eq!(summary(&c), [(Op::Added, "c", false, false)]);
    }

    #[test]
    fn a_changed_fingerprint_is_an_update() {
        let mut d = synced(vec![pod("a", U1, 1, "v1")]);
        let c = d.on_event(Event::Apply(pod("a", U1, 2, "v2"))).unwrap();
        assert_eq!(summary(&c), [(Op::Updated, "a", false, false)]);
        assert_eq!(c[0].resource_version, "2");
    }

    #[test]
    fn an_equal_fingerprint_is_suppressed() {
        let mut d = synced(vec![pod("a", U1, 1, "v1")]);
        // Only the resourceVersion moved (a relist duplicate, or a change to managedFields).
        assert_eq!(
            d.on_event(Event::Apply(pod("a", U1, 2, "v1"))).unwrap(),
            vec![]
        );
        assert_eq!(d.stats().suppressed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_replaced_uid_is_a_delete_of_the_old_object_then_an_add() {
        let mut d = synced(vec![pod("a", U1, 1, "v1")]);
        let c = d.on_event(Event::Apply(pod("a", U2, 5, "v1"))).unwrap();
        assert_eq!(
            summary(&c),
            [
                (Op::Deleted, "a", false, true),
                (Op::Added, "a", false, false)
            ]
        );
        assert_eq!(
            (c[0].uid.as_str(), c[0].resource_version.as_str()),
            (U1, "1")
        );
        assert!(c[0].object.is_none());
        assert_eq!(c[1].uid, U2);
    }

    #[test]
    fn a_watch_delete_carries_the_final_object_and_forgets_the_key() {
        let mut d = synced(vec![pod("a", U1, 1, "v1")]);
        let c = d.on_event(Event::Delete(pod("a", U1, 9, "v1"))).unwrap();
        assert_eq!(summary(&c), [(Op::Deleted, "a", false, false)]);
        assert_eq!(c[0].resource_version, "9");
        assert!(c[0].object.is_some());
        assert!(d.store().is_empty());
        // The same name again is new.
        let c = d.on_event(Event::Apply(pod("a", U2, 10, "v1"))).unwrap();
        assert_eq!(summary(&c), [(Op::Added, "a", false, false)]);
    }

    #[test]
    fn the_relist_sweep_infers_deletes_for_vanished_keys() {
        let mut d = synced(vec![
            pod("a", U1, 1, "v"),
            pod("b", U2, 2, "v"),
            pod("c", U1, 3, "v"),
        ]);
        d.on_event(Event::Init).unwrap();
        // "b" is listed again unchanged: nothing; "a" and "c" vanished while the watch was down.
        assert_eq!(
            d.on_event(Event::InitApply(pod("b", U2, 7, "v"))).unwrap(),
            vec![]
        );
        let c = d.on_event(Event::InitDone).unwrap();
        assert_eq!(
            summary(&c),
            [
                (Op::Deleted, "a", false, true),
                (Op::Deleted, "c", false, true)
            ]
        );
        assert_eq!(
            (c[0].uid.as_str(), c[0].resource_version.as_str()),
            (U1, "1")
        );
        assert!(c.iter().all(|c| c.object.is_none()));
        assert_eq!(d.stats().inferred_deletes.load(Ordering::Relaxed), 2);
        assert_eq!(d.store().len(), 1);
    }

    #[test]
    fn without_updates_only_adds_and_deletes_are_emitted() {
        let mut res = ResourceConfig::new("v1", "Pod");
        res.updates = false;
        let mut d = decider(res);
        d.on_event(Event::Init).unwrap();
        d.on_event(Event::InitApply(pod("a", U1, 1, "v1"))).unwrap();
        d.on_event(Event::InitDone).unwrap();
        assert_eq!(
            d.on_event(Event::Apply(pod("a", U1, 2, "v2"))).unwrap(),
            vec![]
        );
        let c = d.on_event(Event::Delete(pod("a", U1, 3, "v2"))).unwrap();
        assert_eq!(summary(&c), [(Op::Deleted, "a", false, false)]);
    }

    #[test]
    fn an_object_without_a_name_is_skipped_with_an_error_naming_it() {
        let mut d = synced(vec![]);
        let nameless: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "ns", "uid": U1, "resourceVersion": "4"}
        }))
        .unwrap();
        let e = d.on_event(Event::Apply(nameless.clone())).unwrap_err();
        assert_eq!(
            e,
            InformerError::MissingName {
                resource: "v1 Pod".into(),
                scope: "all namespaces".into(),
                namespace: Some("ns".into()),
                uid: Some(U1.into()),
            }
        );
        assert!(d.on_event(Event::Delete(nameless)).is_err());
        assert!(d.store().is_empty());
    }
}
