//! The informer's decision step: one watcher event in, the changes to emit out. Synchronous
//! and I/O-free, like kube-runtime's `reflector::store::Writer::apply_watcher_event`, so every
//! row of the semantics table is a unit test without a server.
//!
//! # Semantics (the Lyft Clutch lightweight informer, done right)
//!
//! | [`Event`] | store | emitted |
//! |---|---|---|
//! | `ListStart` (a list starts: first sync, or relist after 410 Gone / desync) | new list epoch | — |
//! | `Listed(obj)` / `Applied(obj)`, key unknown | insert | `added` |
//! | same, key known, fingerprint differs, `updates = false` | update | nothing |
//! | same, key known, fingerprint differs | update | `updated` naming its `changed` paths (`changes.rs`) |
//! | same, key known, fingerprint equal | update rv | nothing (relist duplicates, dropped-field changes, changes in `ignore_changes` paths only) |
//! | same, key known, uid differs | replace | `deleted` (old uid, `finalStateUnknown`), then `added` |
//! | same, key *unconfirmed* (restored; its earlier `added` may not have arrived), same uid | confirm, update | `added` (again, `may_be_held`: never cancelled by a later `deleted`) |
//! | `Deleted(obj)` | remove | `deleted` with the final object |
//! | `Deleted(obj)`, key known with another uid (replaced unseen) | remove | `deleted` (held uid, `finalStateUnknown`), then `deleted` with the final object |
//! | `LeftSelector(obj)` (a DELETED of an object still in the cluster: `watch.rs` `still_there`) | remove | as `Deleted`, the `deleted` with `reason: leftSelector` |
//! | `Listed(obj)` / `Applied(obj)` the resource's `filter` does not match, key known | remove | `deleted` with this state and `reason: leftFilter` |
//! | same, key unknown | — | nothing (counted in `filtered_out`) |
//! | `Deleted(obj)` / `LeftSelector(obj)` the filter does not match, key unknown | — | nothing |
//! | `ListedUnreadable` (a list item that did not decode, key known) | keep, mark seen | nothing |
//! | `ListDone { sweep: true }` | sweep keys not seen in this list | `deleted`, `finalStateUnknown: true`, each |
//! | `ListDone { sweep: false }` (an unreadable item without a key: a half list) | keep all | nothing |
//! | any object without `metadata.name` | — | nothing; [`InformerError::MissingName`] |
//! | an object a pointer cannot shape | keep the last state (mark seen in a list) | nothing; [`InformerError::Shape`] |
//!
//! `initial` is true for changes emitted during the informer's first list ([`Phase`]).
//! Every `added` before this decider's first completed list, and every re-sent unconfirmed
//! one, carries `may_be_held` (`Change::may_be_held`): a destination may already hold it
//! from a previous run or leader, so the pipeline sends its later `deleted` instead of
//! cancelling the pair.
//!
//! # Starting from saved state
//!
//! A decider built over a restored store (the state a previous run saved, acknowledged by
//! every sink) treats its first list like a relist: not `initial`, differences only (`added`
//! for new keys, `updated` where the fingerprint changed, nothing for unchanged objects), and
//! its `ListDone` sweep emits the `deleted` with `finalStateUnknown` of every key that
//! vanished while kubesink was down. Unconfirmed keys in it (sent as `added` by the earlier
//! run, or recorded in its journal, without every sink's confirmation) are re-sent as
//! `added` when listed and swept like the others when not: a crash never leaves downstream
//! with a key whose delete it cannot learn. In events mode, a restored state that never
//! completed a list (the journal alone) keeps the first start's `since` for the keys it does
//! not hold (`since_open`).
//!
//! # Acknowledged state and sync markers
//!
//! The store is a [`TrackedStore`]: when it tracks acknowledgements, every emitted change
//! first records the key's previous facts in the store's overlay, and [`Decider::ack`] gives
//! the published message the handle that releases them once every sink confirmed it (see
//! `tracked.rs`). With [`Decider::with_sync_markers`], the end of each list leaves a
//! [`Synced`] for [`Decider::take_synced`], to be published after the list's changes.
//!
//! The decider owns the [`LightStore`]; it never keeps an object after returning its change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kubesink_core::message::{Change, DeleteReason, Synced};
use kubesink_core::{Message, Op, Resource};

use super::facts::Facts;
use super::filter::{ChangeVars, Filter, Match as FilterMatch, Subject};
use super::object::RawObject;
use super::occurrence::Occurrences;
use super::owners::OwnerContext;
use super::payload::{ShapeError, Shaper};
use super::stats::{InformerStats, SinkFilterStats};
#[cfg(any(test, feature = "test-util"))]
use super::store::LightStore;
use super::store::{Observed, Vanished};
#[cfg(any(test, feature = "test-util"))]
use super::tracked::Tracked;
use super::tracked::TrackedStore;
use crate::pipeline::{Ack, Throttle};

/// What the list/watch loop saw, in the order it saw it.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// A list starts.
    ListStart,
    /// An object of the current list.
    Listed(RawObject<'a>),
    /// An item of the current list that did not decode but whose key is known: it stays
    /// (and is not swept).
    ListedUnreadable {
        /// Its namespace.
        namespace: Option<String>,
        /// Its name.
        name: String,
    },
    /// The list is complete; `sweep: false` when an item without a readable key was skipped
    /// (a half list proves no deletes).
    ListDone {
        /// Infer deletes for keys not seen.
        sweep: bool,
    },
    /// A watch ADDED or MODIFIED.
    Applied(RawObject<'a>),
    /// A watch DELETED, with the object's final state.
    Deleted(RawObject<'a>),
    /// A watch DELETED of an object found still in the cluster (same uid) without the
    /// resource's selectors: it stopped matching them. Removed like a delete; its `deleted`
    /// says `reason: leftSelector`.
    LeftSelector(RawObject<'a>),
}

/// Where an informer is in the list/watch protocol. Transitions: `Starting` —`ListStart`→
/// `InitialList` —`ListDone`→ `Watching` —`ListStart` (relist)→ `Relist` —`ListDone`→
/// `Watching`. A list that fails half-way starts again with `ListStart` in the same phase
/// kind (the first list stays initial until it completes).
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
    /// A `fields` or `drop` pointer could not be applied to the object.
    #[error("{resource} {key}: object skipped: {source}")]
    Shape {
        /// `apiVersion Kind`.
        resource: String,
        /// The object's key (`namespace/name`).
        key: String,
        /// Why.
        source: ShapeError,
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
    /// A list of this decider completed. Before that, every `added` may repeat what a
    /// previous run or leader delivered ([`Change::may_be_held`]).
    listed_once: bool,
    /// The highest decimal resourceVersion the watch has reached since the last list: the
    /// list's own, then each watch event's. A watch event at or below it is a replay (etcd
    /// revisions are unique per write and a watch delivers them in order).
    watch_floor: Option<u64>,
    /// Keys whose former uid's owed `deleted` this decider sent ([`Self::owed_deletes`]),
    /// with that uid: the key's next change goes out as an `added` naming it
    /// (`Change::replaced_uid`). The previous run may have delivered that very change before
    /// the `deleted` that now precedes it; sent as it was (same `id`), a JetStream stream
    /// drops it as a duplicate and the key ends "deleted" (found by scripts/chaos.sh,
    /// seed 45401). Only keys of owed deletes: a handful after a crash.
    owed_sent: std::collections::HashMap<(Option<String>, String), String>,
    /// The CEL filters of objects (`filter.rs`): the resource's, and, for a decider that
    /// serves the sinks of one filter (a *view*, see `bridge/routes.rs`), that sink's. An
    /// object that any of them does not match is not followed.
    filters: Vec<Arc<Filter>>,
    /// A sink's change filter (one naming `op` or `changed`): a change it does not match is
    /// not sent, and is settled as if delivered.
    change_filter: Option<Arc<Filter>>,
    /// The first of `filters` that is a sink's (the ones before are the resource's).
    sink_from: usize,
    /// The sink's filter's counts (`None` without one: every count is the resource's).
    sink_counts: Option<Arc<SinkFilterStats>>,
    /// Events mode (`occurrence.rs`): the store's fingerprint of an Event is its count, an
    /// `added` or `updated` says how many occurrences it brings, an update that brings none
    /// is not sent, and a `deleted` only with `send_deleted`.
    occurrences: Option<Occurrences>,
    /// Whether the Events mode's `since` applies to the Events this list finds new: during a
    /// first start's list, and during the first list over a restored state that never
    /// completed one (the last run crashed before its first save, its journal alone
    /// restored), so the Events a first start left out are left out again rather than sent
    /// whole. Never for a key the store holds (an unconfirmed one is re-sent).
    since_open: bool,
    /// Events mode's `reason_rate_limit`: the limiter's name (`{cluster}/{group}/{kind}/{rate}`)
    /// and the rate, for [`Decider::throttle`].
    reason_rate: Option<(Arc<str>, std::num::NonZeroU32)>,
    /// `enrich` (`owners.rs`): the cluster's owner index, which this decider fills when its
    /// kind is one that owns others, and reads when its messages carry context.
    context: Option<OwnerContext>,
}

/// Whose filter did not match an object ([`Decider::refused`]): what its `leftFilter` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// The resource's.
    Resource,
    /// The sink's, in a sink's view.
    Sink,
}

/// The store as [`Decider::store`] lends it (under the store's lock).
#[cfg(any(test, feature = "test-util"))]
pub struct StoreRef<'a>(std::sync::MutexGuard<'a, Tracked>);

#[cfg(any(test, feature = "test-util"))]
impl std::ops::Deref for StoreRef<'_> {
    type Target = LightStore;
    fn deref(&self) -> &LightStore {
        &self.0.store
    }
}

impl Decider {
    /// A decider for `resource` watched in `scope` (`namespace x`, `all namespaces`,
    /// `cluster`), starting with an empty store that tracks no acknowledgements.
    #[cfg(any(test, feature = "test-util"))]
    pub fn new(resource: Arc<Resource>, scope: String, shaper: Shaper, updates: bool) -> Self {
        Self::with_store(
            resource,
            scope,
            shaper,
            updates,
            TrackedStore::new(LightStore::new(), false),
            false,
            Arc::default(),
        )
    }

    /// A decider over `store` (shared with the acknowledgements and the state saver; created
    /// before the watch could be planned), `restored` when it holds saved state (see the
    /// module docs), counting into `stats`.
    pub fn with_store(
        resource: Arc<Resource>,
        scope: String,
        shaper: Shaper,
        updates: bool,
        store: Arc<TrackedStore>,
        restored: bool,
        stats: Arc<InformerStats>,
    ) -> Self {
        if restored {
            let objects = store.lock().store.len() as u64;
            stats.objects.store(objects, Ordering::Relaxed);
        }
        Decider {
            resource,
            scope,
            store,
            restored,
            phase: Phase::Starting,
            shaper,
            updates,
            stats,
            markers: None,
            synced: None,
            list_max_rv: None,
            list_rv: None,
            listed_once: false,
            watch_floor: None,
            owed_sent: std::collections::HashMap::new(),
            filters: Vec::new(),
            change_filter: None,
            sink_from: usize::MAX,
            sink_counts: None,
            occurrences: None,
            since_open: false,
            reason_rate: None,
            context: None,
        }
    }

    /// The rate the sinks' queues hold `change` to: an occurrence of a resource with
    /// `reason_rate_limit`, classed by its Event's reason (`""` when it has none); `None`
    /// otherwise.
    pub fn throttle(&self, change: &Change) -> Option<Throttle> {
        let (limiter, per_second) = self.reason_rate.as_ref()?;
        if !matches!(change.op, Op::Added | Op::Updated) {
            return None;
        }
        let reason = change
            .object
            .as_ref()
            .and_then(super::occurrence::reason_of)
            .unwrap_or_default();
        Some(Throttle {
            limiter: limiter.clone(),
            class: Arc::from(reason),
            per_second: *per_second,
        })
    }

    /// Sends the resource's Events as occurrences (`mode = "events"`, see
    /// [`Decider::occurrences`](Self) and docs/events.md).
    pub fn with_occurrences(mut self, occurrences: Occurrences) -> Self {
        self.occurrences = Some(occurrences);
        self.reason_rate = occurrences.reason_rate_limit.map(|rate| {
            let r = &self.resource;
            let name = format!("{}/{}/{}/{rate}", r.cluster, r.group, r.kind);
            (Arc::from(name), rate)
        });
        self
    }

    /// Follows only the objects `filter` matches (see the semantics table): an object that
    /// stops matching is sent as `deleted` with `reason: leftFilter`, one that starts
    /// matching as `added`.
    pub fn with_filter(mut self, filter: Option<Arc<Filter>>) -> Self {
        self.filters.extend(filter);
        self
    }

    /// Also applies a sink's filter: one of objects ([`Filter::on_changes`] false) is one
    /// more filter of what this decider follows (leaving it sends `deleted` with
    /// `leftFilter`); a change filter drops the changes it does not match, settled as if
    /// delivered.
    /// Counts into `counts` (the sink's, shared by its views).
    pub fn with_sink_filter(mut self, filter: Arc<Filter>, counts: Arc<SinkFilterStats>) -> Self {
        if filter.on_changes() {
            self.change_filter = Some(filter);
        } else {
            self.sink_from = self.filters.len();
            self.filters.push(filter);
        }
        self.sink_counts = Some(counts);
        self
    }

    /// The counters of a no match (`filtered out`, `errors`) by the filter at `index` of
    /// `filters` (`usize::MAX`: the change filter): the sink's or the resource's.
    fn out_counters(&self, index: usize) -> (&AtomicU64, &AtomicU64) {
        match &self.sink_counts {
            Some(c) if index >= self.sink_from => (&c.filtered_out, &c.errors),
            _ => (&self.stats.filtered_out, &self.stats.filter_errors),
        }
    }

    /// Which object filter does not match `obj`, the first one (`None`: every one matches,
    /// or there is none); counts a no match and an evaluation error.
    fn refused(&self, obj: &RawObject<'_>) -> Option<Refused> {
        if self.filters.is_empty() {
            return None;
        }
        let (metadata, redacted) = self.shaper.filter_view(obj);
        let i = (0..self.filters.len())
            .find(|&i| !self.evaluate(i, obj, &metadata, &redacted, None))?;
        Some(match i >= self.sink_from {
            true => Refused::Sink,
            false => Refused::Resource,
        })
    }

    /// Whether the filter at `index` of `filters` (`usize::MAX`: the change filter) matches
    /// `obj` (with its `metadata` and `redacted` fields as the shaper gives them, and
    /// `change`); counts a no match and an evaluation error as the resource's or the sink's
    /// ([`Decider::out_counters`]).
    fn evaluate(
        &self,
        index: usize,
        obj: &RawObject<'_>,
        metadata: &serde_json::Map<String, serde_json::Value>,
        redacted: &dyn Fn(&str) -> bool,
        change: Option<ChangeVars<'_>>,
    ) -> bool {
        let filter = match index {
            usize::MAX => self.change_filter.as_ref(),
            i => self.filters.get(i),
        };
        let Some(filter) = filter else {
            return true;
        };
        // The context only for an expression that names it (it is a lookup in the index).
        let context = filter
            .uses_context()
            .then(|| self.context_of(obj))
            .flatten();
        let got = filter.matches(
            &Subject::new(obj, metadata, redacted, &self.resource, change)
                .with_context(context.as_deref()),
        );
        let (out, errors) = self.out_counters(index);
        match got {
            FilterMatch::Yes => return true,
            FilterMatch::No => {}
            FilterMatch::Error => {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        out.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Whether the change filter keeps `change`, decided on `obj` (the event's object when
    /// it is the change's, else a stub of the change's key, uid and resourceVersion: an
    /// inferred `deleted` has no object). Counts a change dropped as filtered out.
    fn keeps(&self, change: &Change, obj: Option<&RawObject<'_>>) -> bool {
        let stub;
        let obj = match obj.filter(|o| o.uid() == change.uid) {
            Some(o) => o,
            None => {
                let mut metadata = serde_json::Map::new();
                metadata.insert("name".into(), change.name.clone().into());
                if let Some(ns) = &change.namespace {
                    metadata.insert("namespace".into(), ns.clone().into());
                }
                metadata.insert("uid".into(), change.uid.clone().into());
                metadata.insert(
                    "resourceVersion".into(),
                    change.resource_version.clone().into(),
                );
                stub = RawObject {
                    api_version: None,
                    kind: Some(self.resource.kind.clone()),
                    metadata,
                    body: Vec::new(),
                };
                &stub
            }
        };
        let changed: Vec<&str> = change.changed.iter().flat_map(|c| c.iter()).collect();
        let vars = ChangeVars {
            op: change.op.as_str(),
            changed: &changed,
        };
        let (metadata, redacted) = self.shaper.filter_view(obj);
        self.evaluate(usize::MAX, obj, &metadata, &redacted, Some(vars))
    }

    /// Whether the store holds `obj`'s key.
    fn holds(&self, obj: &RawObject<'_>) -> bool {
        obj.name()
            .is_some_and(|name| self.store.lock().store.get(obj.namespace(), name).is_some())
    }

    /// An object the filter does not match: the `deleted` (`leftFilter`) of a key held,
    /// nothing for one not held.
    fn left_filter(
        &mut self,
        obj: RawObject<'_>,
        by: Refused,
    ) -> Result<Vec<Change>, InformerError> {
        if !self.holds(&obj) {
            return Ok(Vec::new());
        }
        match (by, &self.sink_counts) {
            (Refused::Sink, Some(c)) => &c.left_filter,
            _ => &self.stats.left_filter,
        }
        .fetch_add(1, Ordering::Relaxed);
        self.delete(obj, Some(DeleteReason::LeftFilter))
    }

    /// Turns on sync markers for a watch covering `namespace` (`None`: all namespaces or a
    /// cluster-scoped kind): each list's end leaves a [`Synced`] for
    /// [`Decider::take_synced`].
    pub fn with_sync_markers(mut self, namespace: Option<String>) -> Self {
        self.markers = Some(namespace);
        self
    }

    /// The acknowledgement handle of `msg`, the encoded form of a change this decider just
    /// returned (`rv`: its resourceVersion), for a pipeline of `sinks` sinks; `None` when
    /// acknowledgements are not tracked. With a state journal, an `added` is recorded there
    /// first (see `tracked.rs`).
    pub async fn ack(&self, msg: &Message, rv: &str, sinks: usize) -> Option<Ack> {
        self.store.ack(&msg.meta, rv, sinks).await
    }

    /// A change this decider returned will never be published (encoding failed): release
    /// it, as if every sink had confirmed it.
    pub fn abandon(&self, change: &Change) {
        if self.store.tracking() {
            let deleted = (change.op == Op::Deleted).then_some(change.uid.as_str());
            self.store
                .settled(change.namespace.as_deref(), &change.name, deleted);
        }
    }

    /// The sync marker of the list that just ended (once), when sync markers are on. Publish
    /// it after the changes of the `ListDone` event that produced it.
    pub fn take_synced(&mut self) -> Option<Synced> {
        self.synced.take()
    }

    /// The current list's own resourceVersion (`metadata.resourceVersion` of the list
    /// response), for its sync marker and the saved state; without it, the highest
    /// resourceVersion among the listed objects stands in. Call before `ListDone`.
    pub fn note_list_resource_version(&mut self, rv: &str) {
        self.list_rv = Some(rv.to_owned()).filter(|r| !r.is_empty());
    }

    /// The counters.
    #[cfg(any(test, feature = "test-util"))]
    pub fn stats(&self) -> Arc<InformerStats> {
        self.stats.clone()
    }

    /// The current phase.
    #[cfg(any(test, feature = "test-util"))]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The store (keys, uids, resourceVersions, fingerprints), locked while borrowed.
    #[cfg(any(test, feature = "test-util"))]
    pub fn store(&self) -> StoreRef<'_> {
        StoreRef(self.store.lock())
    }

    /// Applies one event; returns the changes to emit, in order.
    ///
    /// # Errors
    /// [`InformerError::MissingName`] for an object without `metadata.name`, and
    /// [`InformerError::Shape`] for one a pointer cannot shape: nothing is emitted for it
    /// and its last known state stays.
    pub fn on_event(&mut self, event: Event<'_>) -> Result<Vec<Change>, InformerError> {
        let changes = self.filtered(event)?;
        match self.occurrences {
            Some(o) if !o.send_deleted && changes.iter().any(|c| c.op == Op::Deleted) => {
                // An Event's deletion (its TTL) is not an occurrence: settled unsent, as a
                // change filter's drop is.
                let (deleted, kept): (Vec<Change>, Vec<Change>) =
                    changes.into_iter().partition(|c| c.op == Op::Deleted);
                for c in &deleted {
                    self.abandon(c);
                }
                self.stats
                    .events_deletes_unsent
                    .fetch_add(deleted.len() as u64, Ordering::Relaxed);
                Ok(kept)
            }
            _ => Ok(changes),
        }
    }

    /// [`Decider::on_event`] before events mode: the decision and the change filter.
    fn filtered(&mut self, event: Event<'_>) -> Result<Vec<Change>, InformerError> {
        if self.change_filter.is_none() {
            return self.decide(event);
        }
        let obj = match &event {
            Event::Listed(o) | Event::Applied(o) | Event::Deleted(o) | Event::LeftSelector(o) => {
                Some(o.clone())
            }
            _ => None,
        };
        let changes = self.decide(event)?;
        let mut kept = Vec::with_capacity(changes.len());
        for change in changes {
            if self.keeps(&change, obj.as_ref()) {
                kept.push(change);
            } else {
                self.abandon(&change);
            }
        }
        Ok(kept)
    }

    /// [`Decider::on_event`] before a change filter.
    fn decide(&mut self, event: Event<'_>) -> Result<Vec<Change>, InformerError> {
        match event {
            Event::ListStart => {
                self.begin_list();
                Ok(self.owed_deletes())
            }
            Event::Listed(obj) => {
                self.feed(&obj);
                self.stats.listed.fetch_add(1, Ordering::Relaxed);
                self.count_listed();
                if let Ok(rv) = obj.resource_version().parse::<u64>() {
                    self.list_max_rv = self.list_max_rv.max(Some(rv));
                }
                if let Some(by) = self.refused(&obj) {
                    return self.left_filter(obj, by);
                }
                let initial = matches!(self.phase, Phase::InitialList { .. });
                self.apply(obj, initial)
            }
            Event::ListedUnreadable { namespace, name } => {
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                self.store.lock().store.touch(namespace.as_deref(), &name);
                Ok(Vec::new())
            }
            Event::ListDone { sweep } => Ok(self.end_list(sweep)),
            // Not match guards: `stale` raises the watch's floor for an event it admits.
            Event::Applied(obj) => match self.stale(&obj) {
                true => Ok(Vec::new()),
                false => match self.feed(&obj).refused(&obj) {
                    Some(by) => self.left_filter(obj, by),
                    None => self.apply(obj, false),
                },
            },
            // The final state of a key held is sent whatever the filter says of it; a key
            // never followed has nothing to delete.
            Event::Deleted(obj) => match self.stale(&obj) {
                true => Ok(Vec::new()),
                false
                    if !self.unfeed(&obj).filters.is_empty()
                        && !self.holds(&obj)
                        && self.refused(&obj).is_some() =>
                {
                    Ok(Vec::new())
                }
                false => self.delete(obj, None),
            },
            Event::LeftSelector(obj) => match self.stale(&obj) {
                true => Ok(Vec::new()),
                false
                    if !self.filters.is_empty()
                        && !self.holds(&obj)
                        && self.refused(&obj).is_some() =>
                {
                    Ok(Vec::new())
                }
                false => self.delete(obj, Some(DeleteReason::LeftSelector)),
            },
        }
    }

    /// Whether a watch event is *stale* (dropped and counted), raising the watch's floor to
    /// it when it is not. Stale: at or below the floor, or older
    /// than what the store holds for its key (both resourceVersions decimal: etcd's
    /// revisions, which grow with every write). Such an event is a replay (a watch restarted
    /// from an older resourceVersion, or a server that sent it twice); emitting it would
    /// move the key backwards, or (for another uid) infer a false replace. Lists are not
    /// checked: a list without a resourceVersion is a consistent read, the truth the relist
    /// resynchronizes to (after an etcd restore the revisions may even have gone back).
    fn stale(&mut self, obj: &RawObject<'_>) -> bool {
        let (Some(name), Ok(rv)) = (obj.name(), obj.resource_version().parse::<u64>()) else {
            return false;
        };
        // Below the watch's floor: a replay even of a key no longer held (a replayed ADDED
        // of a deleted object would bring it back; found by the model test).
        let replayed = !self.listing() && self.watch_floor.is_some_and(|floor| rv <= floor);
        if !self.listing() && !replayed {
            self.watch_floor = Some(rv);
        }
        let held = match self.store.lock().store.get(obj.namespace(), name) {
            Some(Facts {
                rv: super::facts::Rv::Number(held),
                ..
            }) => Some(held),
            _ => None,
        };
        if !replayed && held.is_none_or(|held| rv >= held) {
            return false;
        }
        let held = held.unwrap_or_default();
        self.stats.stale_events.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(name, namespace = ?obj.namespace(), resource_version = rv, held, "watch event older than the state held for its key; dropped");
        true
    }

    /// The `deleted`s saved state owes ([`Former`](super::store::Former)): uids of keys
    /// re-created before a crash whose `deleted` no sink had confirmed. A uid never returns,
    /// so each is certainly gone: sent at once, before anything the list brings for its key
    /// (the contract's order: the old uid's `deleted`, then the new uid's changes). Each
    /// carries the key's current resourceVersion when newer (see [`inferred_delete`]).
    fn owed_deletes(&mut self) -> Vec<Change> {
        let owed = {
            let mut t = self.store.lock();
            let owed = t.store.take_owed();
            for o in &owed {
                let (ns, name) = (o.vanished.namespace.as_deref(), &o.vanished.name);
                let before = t.before(ns, name);
                t.note_change(ns, name, before, 1);
            }
            owed
        };
        if owed.is_empty() {
            return Vec::new();
        }
        tracing::info!(
            deletes = owed.len(),
            "sending the deletes of re-created objects' old uids that no sink had confirmed before the restart"
        );
        self.stats
            .inferred_deletes
            .fetch_add(owed.len() as u64, Ordering::Relaxed);
        let changes: Vec<Change> = owed
            .into_iter()
            .map(|o| inferred_delete(o.vanished, o.seen_gone.as_deref().unwrap_or_default()))
            .collect();
        for c in &changes {
            self.owed_sent
                .insert((c.namespace.clone(), c.name.clone()), c.uid.clone());
        }
        self.count_emitted(&changes);
        changes
    }

    /// With `enrich`: this decider's use of its cluster's owner index (`owners.rs`).
    pub fn with_context(mut self, context: OwnerContext) -> Self {
        self.context = Some(context);
        self
    }

    /// Records `obj` in the owner index when this decider fills it; `self` for chaining.
    fn feed(&mut self, obj: &RawObject<'_>) -> &mut Self {
        if let Some(c) = &self.context {
            c.feed(obj);
        }
        self
    }

    /// Forgets `obj` (deleted) in the owner index when this decider fills it; `self` for
    /// chaining.
    fn unfeed(&mut self, obj: &RawObject<'_>) -> &mut Self {
        if let Some(c) = &self.context {
            c.unfeed(obj.uid(), obj.name().unwrap_or_default());
        }
        self
    }

    /// The context of a message about `obj` (`enrich`), `None` without it.
    fn context_of(&self, obj: &RawObject<'_>) -> Option<Arc<kubesink_core::message::Context>> {
        self.context
            .as_ref()
            .and_then(|c| c.of(obj, self.occurrences.is_some()))
    }

    /// Whether a list is in progress.
    pub fn listing(&self) -> bool {
        matches!(self.phase, Phase::InitialList { .. } | Phase::Relist { .. })
    }

    fn begin_list(&mut self) {
        self.stats.lists.fetch_add(1, Ordering::Relaxed);
        self.store.lock().store.begin_list();
        (self.list_max_rv, self.list_rv) = (None, None);
        // A list tried again (a fallback to paged lists, a 410 on a continue token) keeps the
        // start of the first attempt: the initial sync took all of it.
        let started = match self.phase {
            Phase::InitialList { started, .. } | Phase::Relist { started, .. } => started,
            Phase::Starting | Phase::Watching => Instant::now(),
        };
        if matches!(self.phase, Phase::Starting) {
            self.since_open = !self.restored || self.store.lock().list_resource_version.is_empty();
        }
        // After a restore the first list is a relist: differences against the saved state.
        let first =
            !self.restored && matches!(self.phase, Phase::Starting | Phase::InitialList { .. });
        // A list that failed and is tried again is not a new list for the reader of the log:
        // the failure was logged (with its status), the retry is at debug.
        let retry = self.listing();
        let what = match (first, self.restored, self.phase) {
            (true, _, _) => "initial list",
            (false, true, Phase::Starting) => "list (differences against the saved state)",
            _ => "relist",
        };
        if retry {
            tracing::debug!("{what} started again");
        } else {
            tracing::info!("{what} started");
        }
        self.phase = if first {
            Phase::InitialList { started, listed: 0 }
        } else {
            Phase::Relist { started, listed: 0 }
        };
    }

    fn count_listed(&mut self) {
        if let Phase::InitialList { listed, started } | Phase::Relist { listed, started } =
            &mut self.phase
        {
            *listed += 1;
            if *listed % 10_000 == 0 {
                let (listed, elapsed) = (*listed, started.elapsed());
                tracing::info!(listed, ?elapsed, "listing");
            }
        }
    }

    /// `ListDone`: every key of an older epoch vanished while the watch was down (unless
    /// the list was incomplete: then nothing is inferred).
    fn end_list(&mut self, sweep: bool) -> Vec<Change> {
        let tracking = self.store.tracking();
        let own_rv = self
            .list_rv
            .as_deref()
            .and_then(|rv| rv.parse::<u64>().ok());
        let resource_version = match self.list_rv.take() {
            Some(rv) => rv,
            None => self.list_max_rv.map(|n| n.to_string()).unwrap_or_default(),
        };
        let (vanished, count) = {
            let mut t = self.store.lock();
            let vanished = if sweep {
                t.store.end_list()
            } else {
                tracing::warn!(
                    "list had unreadable items without a key: no deletes inferred from it"
                );
                Vec::new()
            };
            if tracking {
                for v in &vanished {
                    let mut before = Facts::from_text(&v.uid, &v.rv, v.fingerprint);
                    before.unconfirmed = v.unconfirmed;
                    let (ns, name) = (v.namespace.as_deref(), &v.name);
                    t.note_change(ns, name, Some(before), 1);
                    let rv = inferred_rv(&v.rv, &resource_version);
                    t.note_deleted(ns, name, &v.uid, rv);
                }
            }
            t.list_resource_version = resource_version.clone();
            (vanished, t.store.len())
        };
        if let Some(c) = &self.context {
            for v in &vanished {
                c.unfeed(&v.uid, &v.name);
            }
            c.first_list_done();
        }
        if let Some(namespace) = &self.markers {
            self.synced = Some(Synced {
                namespace: namespace.clone(),
                count: count as u64,
                resource_version: resource_version.clone(),
                initial: matches!(self.phase, Phase::InitialList { .. }),
            });
        }
        let (what, started, listed) = match self.phase {
            Phase::InitialList { started, listed } => ("initial sync complete", started, listed),
            Phase::Relist { started, listed } => ("relist complete", started, listed),
            Phase::Starting | Phase::Watching => ("list complete", Instant::now(), 0),
        };
        tracing::info!(objects = listed, vanished = vanished.len(), elapsed = ?started.elapsed(), "{what}");
        if what == "initial sync complete" {
            self.stats.note_initial_sync(started.elapsed());
        }
        self.phase = Phase::Watching;
        self.listed_once = true;
        self.since_open = false;
        // The list's own resourceVersion resets the floor (after an etcd restore a
        // consistent list can be lower); the highest listed object's, a stand-in, only
        // raises it (it can be below events the watch already delivered).
        self.watch_floor = match (own_rv, resource_version.parse::<u64>().ok()) {
            (Some(own), _) => Some(own),
            (None, Some(listed)) => Some(self.watch_floor.map_or(listed, |f| f.max(listed))),
            (None, None) => self.watch_floor,
        };
        self.stats.synced.store(true, Ordering::Relaxed);
        self.note_size();
        self.stats
            .inferred_deletes
            .fetch_add(vanished.len() as u64, Ordering::Relaxed);
        let changes: Vec<Change> = vanished
            .into_iter()
            .map(|v| inferred_delete(v, &resource_version))
            .collect();
        self.count_emitted(&changes);
        changes
    }

    fn count_emitted(&self, changes: &[Change]) {
        for c in changes {
            let counter = match c.op {
                Op::Added => &self.stats.emitted_added,
                Op::Updated => &self.stats.emitted_updated,
                Op::Deleted => &self.stats.emitted_deleted,
                // Markers are not changes; emit.rs publishes them.
                Op::Synced => continue,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn note_size(&self) {
        let objects = self.store.lock().store.len() as u64;
        self.stats.objects.store(objects, Ordering::Relaxed);
    }

    fn missing_name(&self, obj: &RawObject<'_>) -> InformerError {
        self.stats.skipped.fetch_add(1, Ordering::Relaxed);
        InformerError::MissingName {
            resource: self.resource.to_string(),
            scope: self.scope.clone(),
            namespace: obj.namespace().map(str::to_owned),
            uid: Some(obj.uid()).filter(|u| !u.is_empty()).map(str::to_owned),
        }
    }

    fn apply(&mut self, obj: RawObject<'_>, initial: bool) -> Result<Vec<Change>, InformerError> {
        let Some(name) = obj.name().map(str::to_owned) else {
            return Err(self.missing_name(&obj));
        };
        let namespace = obj.namespace().map(str::to_owned);
        let shaped = match self.shaper.shape(&obj) {
            Ok(s) => s,
            Err(source) => {
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                if self.listing() {
                    self.store.lock().store.touch(namespace.as_deref(), &name);
                }
                return Err(InformerError::Shape {
                    resource: self.resource.to_string(),
                    key: format!("{}/{name}", namespace.as_deref().unwrap_or("")),
                    source,
                });
            }
        };
        let uid = obj.uid().to_owned();
        let rv = obj.resource_version().to_owned();
        let mut t = self.store.lock();
        let before = t.before(namespace.as_deref(), &name);
        // Events mode: the count last sent for this Event (the store's fingerprint).
        let count_before = match self.occurrences {
            Some(_) => t
                .store
                .get(namespace.as_deref(), &name)
                .filter(|held| held.uid == super::facts::Uid::parse(&uid))
                .map(|held| held.fingerprint),
            None => None,
        };
        let (observed, parts_before) = t.store.observe_parts(
            namespace.as_deref(),
            &name,
            &uid,
            &rv,
            shaped.fingerprint,
            shaped.parts,
        );
        self.stats
            .objects
            .store(t.store.len() as u64, Ordering::Relaxed);
        let mut changes = Vec::with_capacity(1);
        // An `added` a destination may already hold is never cancelled downstream.
        let mut may_be_held = !self.listed_once;
        // After this key's owed `deleted` (another uid), its object goes out again as an
        // `added` naming that uid, whatever the store says of it (see `owed_sent`).
        let owed = if self.owed_sent.is_empty() {
            None
        } else {
            self.owed_sent.remove(&(namespace.clone(), name.clone()))
        };
        let observed = match observed {
            Observed::Replaced { .. } => observed,
            _ if owed.is_some() => Observed::Resend,
            _ => observed,
        };
        let new_key = matches!(observed, Observed::New);
        let op = match observed {
            Observed::New => Op::Added,
            Observed::Resend => {
                may_be_held = true;
                Op::Added
            }
            Observed::Changed if self.updates => Op::Updated,
            Observed::Unchanged
                if self.shaper.changes().ignores()
                    && parts_before
                        .differing(&shaped.parts)
                        .is_some_and(|m| m != 0) =>
            {
                // Every change lies in `ignore_changes` paths: the store keeps the parts of
                // the payload last sent, and the new resourceVersion.
                self.stats.ignored.fetch_add(1, Ordering::Relaxed);
                return Ok(changes);
            }
            Observed::Changed | Observed::Unchanged => {
                self.stats.suppressed.fetch_add(1, Ordering::Relaxed);
                return Ok(changes);
            }
            Observed::Replaced {
                old_uid,
                old_rv,
                old_fingerprint,
            } => {
                if let Some(c) = &self.context {
                    c.unfeed(&old_uid, &name);
                }
                self.stats.inferred_deletes.fetch_add(1, Ordering::Relaxed);
                changes.push(inferred_delete(
                    Vanished {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        uid: old_uid,
                        rv: old_rv,
                        fingerprint: old_fingerprint,
                        unconfirmed: false,
                    },
                    &rv,
                ));
                let gone = &changes[0];
                t.note_deleted(
                    namespace.as_deref(),
                    &name,
                    &gone.uid,
                    &gone.resource_version,
                );
                Op::Added
            }
        };
        let occurrences = match (self.occurrences, op) {
            (None, _) => None,
            (Some(_), Op::Updated) => {
                match shaped.fingerprint.checked_sub(count_before.unwrap_or(0)) {
                    Some(n) if n > 0 => Some(n),
                    // The count did not rise (an edit of the note, a count set back): no
                    // occurrence to report; the store keeps the new count.
                    _ => {
                        self.stats.suppressed.fetch_add(1, Ordering::Relaxed);
                        return Ok(changes);
                    }
                }
            }
            (Some(o), Op::Added)
                if self.since_open
                    && self.listing()
                    && new_key
                    && changes.is_empty()
                    && !o.sends_at_start(&obj, std::time::SystemTime::now()) =>
            {
                // An Event older than `since` at a first start: recorded (its later
                // occurrences are sent), not sent.
                self.stats
                    .events_before_since
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(changes);
            }
            (Some(_), Op::Added) => Some(shaped.fingerprint),
            (Some(_), _) => None,
        };
        // `change_values`: the update's value changes against those kept for the payload
        // last sent, then this payload's kept (an ignored or suppressed update returned
        // above, keeping the old ones).
        let value_changes = match shaped.values {
            Some(values) => {
                let changes = (op == Op::Updated).then(|| {
                    let old = t.store.values(namespace.as_deref(), &name);
                    self.shaper.changes().value_changes(old, &values)
                });
                t.store.set_values(namespace.as_deref(), &name, values);
                changes.flatten()
            }
            None => None,
        };
        let emitted = if changes.is_empty() { 1 } else { 2 };
        t.note_change(namespace.as_deref(), &name, before, emitted);
        if op == Op::Added {
            t.note_added(namespace.as_deref(), &name, &uid, &rv);
        }
        drop(t);
        // The `added` after its name's old uid's inferred `deleted` names that uid, which
        // gives it its own `id`: a previous run may have sent the same `added` before this
        // `deleted`, and a JetStream stream would drop it as a duplicate (found by
        // scripts/chaos.sh; `Change::replaced_uid`).
        let replaced_uid = changes.first().map(|gone| gone.uid.clone()).or(owed);
        let changed = (op == Op::Updated)
            .then(|| {
                self.shaper
                    .changes()
                    .changed(parts_before.differing(&shaped.parts))
            })
            .flatten();
        changes.push(Change {
            op,
            namespace,
            name,
            uid,
            resource_version: rv,
            initial,
            final_state_unknown: false,
            object: Some(shaped.object),
            may_be_held: op == Op::Added && may_be_held,
            replaced_uid,
            changed,
            changes: value_changes,
            occurrences,
            context: self.context_of(&obj),
            reason: None,
        });
        self.count_emitted(&changes);
        Ok(changes)
    }

    fn delete(
        &mut self,
        obj: RawObject<'_>,
        reason: Option<DeleteReason>,
    ) -> Result<Vec<Change>, InformerError> {
        let Some(name) = obj.name().map(str::to_owned) else {
            return Err(self.missing_name(&obj));
        };
        let namespace = obj.namespace().map(str::to_owned);
        let (uid, rv) = (obj.uid(), obj.resource_version());
        let mut changes = Vec::with_capacity(1);
        let unheld = {
            let mut t = self.store.lock();
            let ns = namespace.as_deref();
            let held = t.store.get(ns, &name).map(Facts::into_owned);
            let before = held.clone().filter(|_| self.store.tracking());
            // The key holds another uid: that object was deleted (and this one created)
            // unseen, e.g. while a half list proved nothing. Its `deleted` comes first, as
            // for a replace (found by the model test: a destination indexing by uid kept it).
            let replaced = held
                .filter(|held| held.uid != super::facts::Uid::parse(uid))
                .map(|held| Vanished {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    uid: held.uid.render(),
                    rv: held.rv.render(),
                    fingerprint: held.fingerprint,
                    unconfirmed: held.unconfirmed,
                });
            // An object that left the filter under a uid never followed (the key's object
            // was re-created unseen, and the new one does not match): its `deleted` would
            // name an object no destination got. Only the old uid's goes.
            let unheld = reason == Some(DeleteReason::LeftFilter) && replaced.is_some();
            if let Some(v) = replaced {
                let gone = inferred_delete(v, rv);
                t.note_deleted(ns, &name, &gone.uid, &gone.resource_version);
                changes.push(gone);
                self.stats.inferred_deletes.fetch_add(1, Ordering::Relaxed);
            }
            let own = u32::from(!unheld);
            t.note_change(ns, &name, before, own + changes.len() as u32);
            if !unheld {
                t.note_deleted(ns, &name, uid, rv);
            }
            t.store.remove(ns, &name);
            unheld
        };
        self.note_size();
        self.count_emitted(&changes);
        if unheld {
            return Ok(changes);
        }
        self.stats.emitted_deleted.fetch_add(1, Ordering::Relaxed);
        // The delete is emitted even when the final state cannot be shaped: without it.
        let object = match self.shaper.shape(&obj) {
            Ok(s) => Some(s.object),
            Err(e) => {
                tracing::warn!(name, error = %e, "deleted object's final state cannot be shaped; emitting the delete without it");
                None
            }
        };
        changes.push(Change {
            op: Op::Deleted,
            namespace,
            name,
            uid: uid.to_owned(),
            resource_version: rv.to_owned(),
            initial: false,
            final_state_unknown: object.is_none(),
            object,
            may_be_held: false,
            replaced_uid: None,
            changed: None,
            changes: None,
            occurrences: None,
            context: self.context_of(&obj),
            reason,
        });
        Ok(changes)
    }
}

/// The resourceVersion of an inferred `deleted` ([`inferred_delete`]): `seen_gone` when
/// both are decimal and it is newer than `last`, else `last`.
fn inferred_rv<'a>(last: &'a str, seen_gone: &'a str) -> &'a str {
    match (last.parse::<u64>(), seen_gone.parse::<u64>()) {
        (Ok(l), Ok(gone)) if gone > l => seen_gone,
        _ => last,
    }
}

/// The `deleted` of an object that vanished unseen (relist sweep, uid replaced), `seen_gone`
/// the resourceVersion at which it was known gone (the list's, or the replacing object's).
///
/// Its `resourceVersion` is `seen_gone` when both are decimal and `seen_gone` is newer, else
/// the last one known. The store's last known one can be older than what a destination
/// already holds: after a restart it is the saved (acknowledged) state, which lags what the
/// previous run delivered. A `deleted` carrying it would move the key's resourceVersion
/// backwards (found by scripts/chaos.sh: 32 such deletes in one 40 s run), and a consumer
/// that drops messages older than what it holds would keep the object forever.
fn inferred_delete(v: Vanished, seen_gone: &str) -> Change {
    let resource_version = inferred_rv(&v.rv, seen_gone).to_owned();
    Change {
        op: Op::Deleted,
        namespace: v.namespace,
        name: v.name,
        uid: v.uid,
        resource_version,
        initial: false,
        final_state_unknown: true,
        object: None,
        may_be_held: false,
        replaced_uid: None,
        changed: None,
        changes: None,
        occurrences: None,
        context: None,
        reason: None,
    }
}

#[cfg(test)]
mod changes_tests;
#[cfg(test)]
mod events_tests;
#[cfg(test)]
mod filter_tests;
#[cfg(test)]
mod restart_tests;

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::config::ResourceConfig;

    pub(super) const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";
    pub(super) const U2: &str = "1d0f26d0-5b32-4c1a-ba4f-4c897e871cf9";

    /// A decider of `res` for `resource` over `store` (restored when there is one; else an
    /// empty store), acknowledgements untracked.
    pub(super) fn over_store(
        resource: Resource,
        res: &ResourceConfig,
        store: Option<LightStore>,
    ) -> Decider {
        let shaper = Shaper::new(res, "kubesink.io/cluster", "test");
        let restored = store.is_some();
        Decider::with_store(
            Arc::new(resource),
            "all namespaces".into(),
            shaper,
            res.updates,
            TrackedStore::new(store.unwrap_or_default(), false),
            restored,
            Arc::default(),
        )
    }

    pub(super) fn decider(res: ResourceConfig) -> Decider {
        let resource = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
        let shaper = Shaper::new(&res, "kubesink.io/cluster", "test");
        Decider::new(resource, "all namespaces".into(), shaper, res.updates)
    }

    /// A pod's JSON text.
    pub(super) fn pod(name: &str, uid: &str, rv: u64, image: &str) -> String {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "resourceVersion": rv.to_string()},
            "spec": {"containers": [{"name": "c", "image": image}]}
        })
        .to_string()
    }

    pub(super) fn obj(text: &str) -> RawObject<'_> {
        RawObject::parse(text).unwrap()
    }

    pub(super) fn listed(d: &mut Decider, text: &str) -> Vec<Change> {
        d.on_event(Event::Listed(obj(text))).unwrap()
    }

    pub(super) fn applied(d: &mut Decider, text: &str) -> Vec<Change> {
        d.on_event(Event::Applied(obj(text))).unwrap()
    }

    pub(super) fn object(c: &Change) -> Value {
        c.object
            .as_ref()
            .map(|o| o.to_value())
            .unwrap_or(Value::Null)
    }

    /// (op, name, initial, finalStateUnknown) of each change.
    pub(super) fn summary(changes: &[Change]) -> Vec<(Op, &str, bool, bool)> {
        changes
            .iter()
            .map(|c| (c.op, c.name.as_str(), c.initial, c.final_state_unknown))
            .collect()
    }

    /// A decider that has listed `pods` and is watching.
    pub(super) fn synced(pods: &[String]) -> Decider {
        let mut d = decider(ResourceConfig::new("v1", "Pod"));
        d.on_event(Event::ListStart).unwrap();
        for p in pods {
            listed(&mut d, p);
        }
        d.on_event(Event::ListDone { sweep: true }).unwrap();
        d
    }

    #[test]
    fn an_added_of_the_first_list_may_be_held_one_first_seen_by_the_watch_may_not() {
        let mut d = decider(ResourceConfig::new("v1", "Pod"));
        d.on_event(Event::ListStart).unwrap();
        let c = listed(&mut d, &pod("a", U1, 1, "i"));
        assert!(c[0].may_be_held, "a previous run may have delivered it");
        d.on_event(Event::ListDone { sweep: true }).unwrap();
        let c = applied(&mut d, &pod("b", U2, 2, "i"));
        assert!(!c[0].may_be_held, "created while this process watched");
        // A relist's new key was created while the watch was down: no one sent it either.
        d.on_event(Event::ListStart).unwrap();
        let c = listed(&mut d, &pod("c", U1, 3, "i"));
        assert!(!c[0].may_be_held);
    }

    #[test]
    fn a_replayed_watch_event_older_than_the_held_state_is_dropped() {
        let mut d = synced(&[pod("a", U1, 10, "i1")]);
        let c = applied(&mut d, &pod("a", U1, 12, "i2"));
        assert_eq!(summary(&c), [(Op::Updated, "a", false, false)]);
        // A watch restarted from an older resourceVersion replays rv 11: never emitted.
        assert_eq!(applied(&mut d, &pod("a", U1, 11, "i-old")), vec![]);
        assert_eq!(d.stats().stale_events.load(Ordering::Relaxed), 1);
        // The same state again (rv 12) is a duplicate: suppressed, not stale.
        assert_eq!(applied(&mut d, &pod("a", U1, 12, "i2")), vec![]);
        // A replayed ADDED of an older uid infers no false replace.
        assert_eq!(applied(&mut d, &pod("a", U2, 5, "other")), vec![]);
        let d_store = d.store();
        let held = d_store.get(Some("ns"), "a").unwrap();
        assert_eq!(held.rv, crate::informer::facts::Rv::Number(12));
        drop(d_store);
        // A replayed DELETED older than the held state removes nothing.
        let old = pod("a", U1, 11, "i-old");
        assert_eq!(d.on_event(Event::Deleted(obj(&old))).unwrap(), vec![]);
        assert!(d.store().get(Some("ns"), "a").is_some());
        // Newer events go on as usual.
        let c = applied(&mut d, &pod("a", U1, 13, "i3"));
        assert_eq!(summary(&c), [(Op::Updated, "a", false, false)]);
    }

    #[test]
    fn a_watch_delete_of_another_uid_than_the_held_one_deletes_the_held_uid_first() {
        // The key was re-created unseen (e.g. during a half list); the watch then deletes
        // the new uid. A destination indexing by uid holds the old one: its `deleted` too.
        let mut d = synced(&[pod("a", U1, 10, "i1")]);
        let c = d
            .on_event(Event::Deleted(obj(&pod("a", U2, 14, "new"))))
            .unwrap();
        assert_eq!(
            summary(&c),
            [
                (Op::Deleted, "a", false, true),
                (Op::Deleted, "a", false, false)
            ]
        );
        assert_eq!(
            (
                c[0].uid.as_str(),
                c[0].resource_version.as_str(),
                c[1].uid.as_str()
            ),
            (U1, "14", U2),
            "the held uid's, at the resourceVersion that showed it gone"
        );
        assert!(d.store().get(Some("ns"), "a").is_none());
        assert_eq!(d.stats().inferred_deletes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_list_is_taken_as_the_truth_even_when_its_resource_version_is_lower() {
        // A consistent list after an etcd restore can carry lower revisions.
        let mut d = synced(&[pod("a", U1, 10, "i1")]);
        d.on_event(Event::ListStart).unwrap();
        let c = listed(&mut d, &pod("a", U1, 4, "restored"));
        assert_eq!(summary(&c), [(Op::Updated, "a", false, false)]);
    }

    #[test]
    fn a_new_key_is_added_and_initial_only_during_the_first_list() {
        let mut d = decider(ResourceConfig::new("v1", "Pod"));
        assert_eq!(d.on_event(Event::ListStart).unwrap(), vec![]);
        let c = listed(&mut d, &pod("a", U1, 1, "i"));
        assert_eq!(summary(&c), [(Op::Added, "a", true, false)]);
        assert_eq!(c[0].uid, U1);
        assert_eq!(c[0].resource_version, "1");
        assert_eq!(
            object(&c[0])["metadata"]["labels"]["kubesink.io/cluster"],
            "test"
        );
        // A first list that fails half-way and starts again is still the initial list.
        d.on_event(Event::ListStart).unwrap();
        assert!(matches!(d.phase(), Phase::InitialList { .. }));
        assert_eq!(listed(&mut d, &pod("a", U1, 1, "i")), vec![]);
        assert_eq!(d.on_event(Event::ListDone { sweep: true }).unwrap(), vec![]);
        assert_eq!(d.phase(), Phase::Watching);
        let c = applied(&mut d, &pod("b", U2, 2, "i"));
        assert_eq!(summary(&c), [(Op::Added, "b", false, false)]);
        // A relist is not the first list: nothing it emits is initial.
        d.on_event(Event::ListStart).unwrap();
        assert!(matches!(d.phase(), Phase::Relist { .. }));
        let c = listed(&mut d, &pod("c", U1, 3, "i"));
        assert_eq!(summary(&c), [(Op::Added, "c", false, false)]);
    }

    #[test]
    fn a_changed_fingerprint_is_an_update() {
        let mut d = synced(&[pod("a", U1, 1, "v1")]);
        let c = applied(&mut d, &pod("a", U1, 2, "v2"));
        assert_eq!(summary(&c), [(Op::Updated, "a", false, false)]);
        assert_eq!(c[0].resource_version, "2");
    }

    #[test]
    fn an_equal_fingerprint_is_suppressed() {
        let mut d = synced(&[pod("a", U1, 1, "v1")]);
        // Only the resourceVersion moved (a relist duplicate, or a change to managedFields).
        assert_eq!(applied(&mut d, &pod("a", U1, 2, "v1")), vec![]);
        assert_eq!(d.stats().suppressed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_replaced_uid_is_a_delete_of_the_old_object_then_an_add() {
        let mut d = synced(&[pod("a", U1, 1, "v1")]);
        let c = applied(&mut d, &pod("a", U2, 5, "v1"));
        assert_eq!(
            summary(&c),
            [
                (Op::Deleted, "a", false, true),
                (Op::Added, "a", false, false)
            ]
        );
        assert_eq!(
            (c[0].uid.as_str(), c[0].resource_version.as_str()),
            (U1, "5"),
            "the replacing object's resourceVersion: never older than what was sent"
        );
        assert!(c[0].object.is_none());
        assert_eq!(c[1].uid, U2);
        assert_eq!(
            c[1].replaced_uid.as_deref(),
            Some(U1),
            "the added names the uid it replaced"
        );
        assert_eq!(c[0].replaced_uid, None);
    }

    #[test]
    fn a_watch_delete_carries_the_final_object_and_forgets_the_key() {
        let mut d = synced(&[pod("a", U1, 1, "v1")]);
        let c = d
            .on_event(Event::Deleted(obj(&pod("a", U1, 9, "v1"))))
            .unwrap();
        assert_eq!(summary(&c), [(Op::Deleted, "a", false, false)]);
        assert_eq!(c[0].resource_version, "9");
        assert_eq!(object(&c[0])["metadata"]["name"], "a");
        assert!(d.store().is_empty());
        // The same name again is new.
        let c = applied(&mut d, &pod("a", U2, 10, "v1"));
        assert_eq!(summary(&c), [(Op::Added, "a", false, false)]);
    }

    #[test]
    fn the_relist_sweep_infers_deletes_for_vanished_keys() {
        let mut d = synced(&[
            pod("a", U1, 1, "v"),
            pod("b", U2, 2, "v"),
            pod("c", U1, 3, "v"),
        ]);
        d.on_event(Event::ListStart).unwrap();
        // "b" is listed again unchanged: nothing; "a" and "c" vanished while the watch was down.
        assert_eq!(listed(&mut d, &pod("b", U2, 7, "v")), vec![]);
        let c = d.on_event(Event::ListDone { sweep: true }).unwrap();
        assert_eq!(
            summary(&c),
            [
                (Op::Deleted, "a", false, true),
                (Op::Deleted, "c", false, true)
            ]
        );
        assert_eq!(
            (c[0].uid.as_str(), c[0].resource_version.as_str()),
            (U1, "7"),
            "the list's resourceVersion (the highest listed here): the object is known gone there"
        );
        assert!(c.iter().all(|c| c.object.is_none()));
        assert_eq!(d.stats().inferred_deletes.load(Ordering::Relaxed), 2);
        assert_eq!(d.store().len(), 1);
    }

    #[test]
    fn a_half_list_infers_no_deletes_and_an_unreadable_item_with_a_key_is_kept() {
        let mut d = synced(&[pod("a", U1, 1, "v"), pod("b", U2, 2, "v")]);
        d.on_event(Event::ListStart).unwrap();
        d.on_event(Event::ListedUnreadable {
            namespace: Some("ns".into()),
            name: "a".into(),
        })
        .unwrap();
        // "b" is missing from this list, but an item without a key was skipped too.
        assert_eq!(
            d.on_event(Event::ListDone { sweep: false }).unwrap(),
            vec![]
        );
        assert_eq!(d.store().len(), 2);
        d.on_event(Event::ListStart).unwrap();
        d.on_event(Event::ListedUnreadable {
            namespace: Some("ns".into()),
            name: "a".into(),
        })
        .unwrap();
        let c = d.on_event(Event::ListDone { sweep: true }).unwrap();
        assert_eq!(summary(&c), [(Op::Deleted, "b", false, true)]);
    }

    #[test]
    fn without_updates_only_adds_and_deletes_are_emitted() {
        let mut res = ResourceConfig::new("v1", "Pod");
        res.updates = false;
        let mut d = decider(res);
        d.on_event(Event::ListStart).unwrap();
        listed(&mut d, &pod("a", U1, 1, "v1"));
        d.on_event(Event::ListDone { sweep: true }).unwrap();
        assert_eq!(applied(&mut d, &pod("a", U1, 2, "v2")), vec![]);
        let c = d
            .on_event(Event::Deleted(obj(&pod("a", U1, 3, "v2"))))
            .unwrap();
        assert_eq!(summary(&c), [(Op::Deleted, "a", false, false)]);
    }

    #[test]
    fn an_object_without_a_name_is_skipped_with_an_error_naming_it() {
        let mut d = synced(&[]);
        let nameless = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "ns", "uid": U1, "resourceVersion": "4"}
        })
        .to_string();
        let e = d.on_event(Event::Applied(obj(&nameless))).unwrap_err();
        assert_eq!(
            e,
            InformerError::MissingName {
                resource: "v1 Pod".into(),
                scope: "all namespaces".into(),
                namespace: Some("ns".into()),
                uid: Some(U1.into()),
            }
        );
        assert!(d.on_event(Event::Deleted(obj(&nameless))).is_err());
        assert!(d.store().is_empty());
    }

    #[test]
    fn an_object_a_pointer_cannot_shape_keeps_its_last_state() {
        let mut res = ResourceConfig::new("v1", "Pod");
        res.drop = vec!["/spec/deep/x".into()];
        let mut d = decider(res);
        d.on_event(Event::ListStart).unwrap();
        listed(&mut d, &pod("a", U1, 1, "v1"));
        d.on_event(Event::ListDone { sweep: true }).unwrap();
        let deep = format!(
            r#"{{"metadata":{{"name":"a","namespace":"ns","uid":"{U1}"}},"spec":{{"deep":{}1{}}}}}"#,
            "[".repeat(500),
            "]".repeat(500)
        );
        let e = d.on_event(Event::Applied(obj(&deep))).unwrap_err();
        assert!(
            matches!(e, InformerError::Shape { ref key, .. } if key == "ns/a"),
            "{e}"
        );
        // In a relist it is kept (not swept) though it could not be shaped.
        d.on_event(Event::ListStart).unwrap();
        assert!(d.on_event(Event::Listed(obj(&deep))).is_err());
        assert_eq!(d.on_event(Event::ListDone { sweep: true }).unwrap(), vec![]);
        assert_eq!(d.store().len(), 1);
    }
}
