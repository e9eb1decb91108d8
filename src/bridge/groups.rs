//! The group form of `[[resources]]` at run time (`group`, `kinds`, `exclude`;
//! docs/configuration.md, "Whole API groups"): per cluster and entry, one task that asks API
//! discovery which kinds the entry follows and runs each as a resource of its own, a *slot*
//! (its own watches, views, counters and saved state, named after the kind), then follows
//! the cluster as kinds come and go:
//!
//! - a kind that appears (a CRD installed) starts a slot;
//! - a kind whose preferred version changes (a CRD given a newer version) moves: its slot
//!   stops (its state saved) and starts again at the new version from that state, so each
//!   object is sent once as `updated` in its new `apiVersion`, and nothing as `added`;
//! - a kind no longer served (a CRD deleted: the API server deletes its objects first, and
//!   the watch sends those deletes), once a list of it answers 404 (discovery alone can
//!   leave a kind out for a moment while a CRD changes), retires: what its stores still
//!   hold is sent as deleted (an inferred delete, as after a list that no longer finds
//!   it), then its watches stop; once those deletes are saved as acknowledged, the slot is
//!   done;
//! - a kind followed before this start (the entry's [`Manifest`], with `[state]`) that is no
//!   longer served starts retired: its watches send the deletes of what its saved state
//!   holds, then stop.
//!
//! What changes the set is learnt from a watch of CustomResourceDefinitions (metadata only;
//! a change of a CRD of the entry's group asks discovery again after [`DEBOUNCE`], then
//! [`SETTLES`] times [`SETTLE`] apart: the API server serves a new CRD's kind once it is
//! established, and rebuilds its discovery document a moment after a change) and
//! from discovery every [`REDISCOVER`] (aggregated APIs, and clusters where kubesink may not
//! watch CRDs).
//!
//! Why a slot keeps a state store of its own rather than a section of its cluster's: a
//! cluster's watches, and so its saved state's sections and journal, are fixed when it
//! starts (`planned.rs`, `watching.rs`); a slot is started the same way, as a cluster of one
//! resource, so a kind added or removed never rewrites another kind's state, and the
//! restore, journal, keeper and hand-over code stays the one every watch uses.
//!
//! A kind another entry of the cluster follows with the same namespaces (one listing it by
//! `api_version` and `kind`, or an earlier group-form entry) is left to that entry.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use kubesink_core::backoff::Backoff;
use kubesink_core::Resource;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::planned::{plan_resource, PlannedCluster};
use super::watching::{SlotRun, Watching};
use crate::cluster::{self, Discovered};
use crate::config::{group_name, Cluster, GroupSelector, ServedKind};
use crate::informer::{ClusterApi, FailureKind, InformerStats};
use crate::plan::ResourcePlan;
use crate::state::{self, StateStats, StateStore};

/// How long after a CRD's change discovery is asked again (more changes meanwhile are
/// taken together).
const DEBOUNCE: Duration = Duration::from_millis(300);
/// After the discovery that followed a CRD's change, how long until it is asked once more:
/// the API server serves a CRD's kind once the CRD is established, and stops shortly after
/// the CRD is gone.
const SETTLE: Duration = Duration::from_secs(3);
/// How many discoveries follow a CRD's change, [`SETTLE`] apart.
const SETTLES: u32 = 4;
/// How often discovery is asked without a CRD's change.
const REDISCOVER: Duration = Duration::from_secs(300);
/// How long a slot that stops waits for its watches to end before its final save.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// One group-form resource of one cluster, and what its kinds are left to others.
pub(super) struct GroupTarget {
    spec: Cluster,
    unit: String,
    client: Client,
    api: Arc<ClusterApi>,
    resource: ResourcePlan,
    selector: GroupSelector,
    /// Its counters as one watch: discovery's failures; synced once discovery answered.
    stats: Arc<InformerStats>,
    /// `(group, Kind)` of the entries that list a kind by `api_version` and `kind` with the
    /// same namespaces.
    listed: Vec<(String, String)>,
    /// The earlier group-form entries with the same namespaces.
    earlier: Vec<GroupSelector>,
}

impl GroupTarget {
    /// The group-form entry `at` of cluster `c`, followed through `client`, counting into
    /// `stats`; `None` when the entry is not in the group form.
    fn new(
        c: &PlannedCluster,
        at: usize,
        client: Client,
        stats: Arc<InformerStats>,
    ) -> Option<GroupTarget> {
        let resource = c.resources.get(at)?.resource.clone();
        let selector = resource.config.selector()?;
        let namespaces = &resource.config.namespaces;
        let same =
            |r: &&super::planned::PlannedResource| &r.resource.config.namespaces == namespaces;
        let listed = c
            .resources
            .iter()
            .filter(same)
            .filter(|r| r.group.is_none())
            .map(|r| {
                let (group, _) = r.resource.config.group_version();
                (group.to_owned(), r.resource.config.kind.clone())
            })
            .collect();
        let earlier = c.resources[..at]
            .iter()
            .filter(same)
            .filter_map(|r| r.resource.config.selector())
            .collect();
        Some(GroupTarget {
            spec: c.spec.clone(),
            unit: c.spec.unit(),
            client,
            api: c.api.clone(),
            selector,
            resource,
            stats,
            listed,
            earlier,
        })
    }

    /// Whether kind `d` is another entry's.
    fn taken(&self, d: &Discovered) -> bool {
        let ar = &d.api_resource;
        let served = ServedKind {
            group: &ar.group,
            kind: &ar.kind,
            plural: &ar.plural,
            namespaced: d.namespaced,
        };
        self.listed
            .iter()
            .any(|(g, k)| *g == ar.group && *k == ar.kind)
            || self.earlier.iter().any(|e| e.follows(served))
    }
}

/// One kind followed: the version it is followed at, what it runs under, its watches'
/// counters (shown by the observers while it runs), and whether it retired.
struct Slot {
    version: String,
    run: SlotRun,
    stats: Vec<Arc<InformerStats>>,
    retired: bool,
}

/// Starts following the group-form entry `at` of cluster `c` in a task of `w`'s
/// ([`super::watching::FollowGroup`]).
pub(super) fn spawn_follow(
    w: &Arc<Watching>,
    c: &PlannedCluster,
    at: usize,
    client: Client,
    stats: Arc<InformerStats>,
) {
    if let Some(target) = GroupTarget::new(c, at, client, stats) {
        w.tasks.spawn(follow(w.clone(), target));
    }
}

/// Follows `g`'s kinds until the bridge stops (see the module docs).
async fn follow(w: Arc<Watching>, g: GroupTarget) {
    let selector = &g.selector;
    let span = tracing::info_span!("group", cluster = %g.spec.name, resource = %g.resource.config.display_name());
    let (tx, mut rx) = mpsc::channel(1);
    w.tasks.spawn(
        crd_changes(g.client.clone(), selector.clone(), tx, w.cancel.clone())
            .instrument(span.clone()),
    );
    let retry = Backoff::new(
        w.watch.retry_initial_backoff.get(),
        w.watch.retry_max_backoff.get(),
    );
    let mut delays = retry.delays();
    let mut slots: BTreeMap<(String, String), Slot> = BTreeMap::new();
    let mut manifest = Manifest::open(&w, &g);
    // Discoveries still to come at [`SETTLE`] intervals after a CRD's change.
    let mut settle = 0u32;
    let mut failed = false;
    loop {
        let found = tokio::select! {
            _ = w.cancel.cancelled() => return,
            r = cluster::discover_kinds(&g.client, &g.resource.config, selector) => r,
        };
        let next = match found {
            Ok(kinds) => {
                if failed {
                    span.in_scope(|| tracing::info!("API discovery answers again"));
                    failed = false;
                }
                g.stats.clear_failure();
                let unsure = async {
                    let unsure = reconcile(&w, &g, &mut slots, &kinds, &mut manifest).await;
                    let pending = finish_retired(&w, &mut slots).await;
                    manifest.write(&slots).await;
                    unsure || pending
                }
                .instrument(span.clone())
                .await;
                g.stats.synced.store(true, Ordering::Relaxed);
                delays = retry.delays();
                settle = settle.saturating_sub(1);
                match settle > 0 || unsure {
                    true => SETTLE,
                    false => REDISCOVER,
                }
            }
            Err(e) => {
                let wait = delays.next().unwrap_or(retry.max);
                g.stats.errors.fetch_add(1, Ordering::Relaxed);
                g.stats.discovery_errors.fetch_add(1, Ordering::Relaxed);
                let kind = match e.is_transient() {
                    true => FailureKind::Unreachable,
                    false => FailureKind::Broken,
                };
                g.stats.set_failure(kind, e.to_string());
                if !failed {
                    span.in_scope(|| tracing::warn!(error = %e, retry_in = ?wait, "API discovery failed; the kinds found before are still followed; retrying"));
                }
                failed = true;
                wait
            }
        };
        tokio::select! {
            _ = w.cancel.cancelled() => return,
            _ = tokio::time::sleep(next) => {}
            Some(()) = rx.recv() => {
                tokio::time::sleep(DEBOUNCE).await;
                while rx.try_recv().is_ok() {}
                settle = SETTLES;
            }
        }
    }
}

/// Brings `slots` to the kinds discovery found: retires those gone, starts those new,
/// moves those whose version changed. `true` when discovery left out a kind that still
/// answers (ask again soon).
async fn reconcile(
    w: &Arc<Watching>,
    g: &GroupTarget,
    slots: &mut BTreeMap<(String, String), Slot>,
    kinds: &[Discovered],
    manifest: &mut Manifest,
) -> bool {
    let want: BTreeMap<(String, String), &Discovered> = kinds
        .iter()
        .filter(|d| !g.taken(d))
        .map(|d| {
            let (group, kind) = d.group_kind();
            ((group.to_owned(), kind.to_owned()), d)
        })
        .collect();
    let mut unsure = false;
    // The kinds followed before this start (saved) that are gone now: their saved state
    // holds what their deletes need. Each starts retired, so its watches send those deletes
    // from the restored state and stop.
    for d in manifest.take_saved().await {
        let (group, kind) = d.group_kind();
        let key = (group.to_owned(), kind.to_owned());
        if slots.contains_key(&key) || want.contains_key(&key) {
            continue;
        }
        if !gone(g, &d.api_resource).await {
            // Left by the configuration (or out of discovery for a moment): nothing is
            // sent, as for a [[resources]] entry removed.
            continue;
        }
        tracing::info!(group = %key.0, kind = %key.1, "a kind followed before this start is no longer served: sending the deletes of its objects from its saved state");
        slots.insert(key, start(w, g, &d, true));
    }
    for ((group, kind), slot) in slots.iter_mut() {
        if slot.retired || want.contains_key(&(group.clone(), kind.clone())) {
            continue;
        }
        // Discovery may leave a kind out for a moment (the API server rebuilds its
        // discovery document while a CRD changes): only a 404 from the kind itself retires
        // it, else its objects would be sent as deleted and then again as added.
        if !gone(g, &slot.run.resolved.api_resource).await {
            tracing::debug!(%group, %kind, "discovery left a followed kind out, but it still answers: kept");
            unsure = true;
            continue;
        }
        tracing::info!(%group, %kind, "a kind is no longer served: sending the deletes of its objects that remain, then stopping its watches");
        w.watch_list.remove(&slot.stats);
        slot.run.gone.cancel();
        slot.retired = true;
    }
    for (key, d) in want {
        let version = &d.api_resource.version;
        match slots.get(&key) {
            Some(s) if !s.retired && &s.version == version => continue,
            Some(s) if s.retired => {
                tracing::info!(group = %key.0, kind = %key.1, %version, "a kind is served again");
            }
            Some(s) => {
                tracing::info!(group = %key.0, kind = %key.1, from = %s.version, to = %version, "a kind's preferred version changed: following it there (each object is sent once as updated)");
            }
            None => tracing::info!(group = %key.0, kind = %key.1, %version, "following a kind"),
        }
        if let Some(old) = slots.remove(&key) {
            stop(w, old).await;
        }
        slots.insert(key, start(w, g, d, false));
    }
    unsure
}

/// Stops the retired slots whose watches ended and whose saved state no longer holds an
/// object (their deletes acknowledged and saved). `true` while some are still pending.
async fn finish_retired(w: &Watching, slots: &mut BTreeMap<(String, String), Slot>) -> bool {
    let mut pending = false;
    let mut done = Vec::new();
    for (key, slot) in slots.iter() {
        if !slot.retired {
            continue;
        }
        if !slot.run.tasks.is_empty() {
            pending = true;
            continue;
        }
        let keepers = slot
            .run
            .keepers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut empty = true;
        for k in &keepers {
            match tokio::time::timeout(STOP_WAIT, k.save(true)).await {
                Ok(Ok(Some(r))) => empty &= r.objects == 0,
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "saving a retired kind's state failed; tried again");
                    empty = false;
                }
                Err(_) => empty = false,
            }
        }
        match empty {
            true => done.push(key.clone()),
            false => pending = true,
        }
    }
    for key in done {
        if let Some(slot) = slots.remove(&key) {
            tracing::info!(group = %key.0, kind = %key.1, "a retired kind's deletes are acknowledged: its watches and state are done");
            stop(w, slot).await;
        }
    }
    pending
}

/// The kinds a group-form entry follows, saved beside their states (with `[state]`), so that
/// a start finds the kinds that left the cluster while kubesink was not running and sends
/// their objects' deletes: JSON, `[{group, version, kind, plural, namespaced}]`, rewritten
/// when the set changes. A kind stays in it until its deletes are saved as acknowledged.
struct Manifest {
    store: Option<Arc<dyn StateStore>>,
    /// Read yet (once, at the first discovery that answers; nothing is written before).
    read: bool,
    /// What was read, or written last.
    written: Vec<SavedKind>,
}

/// One kind of a [`Manifest`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct SavedKind {
    group: String,
    version: String,
    kind: String,
    plural: String,
    namespaced: bool,
}

impl SavedKind {
    fn discovered(&self) -> Discovered {
        let api_version = match self.group.as_str() {
            "" => self.version.clone(),
            g => format!("{g}/{}", self.version),
        };
        Discovered {
            api_resource: kube::discovery::ApiResource {
                group: self.group.clone(),
                version: self.version.clone(),
                api_version,
                kind: self.kind.clone(),
                plural: self.plural.clone(),
            },
            namespaced: self.namespaced,
        }
    }
}

impl Manifest {
    /// `g`'s manifest in the configured state store: `kinds-{XXH3 of the entry's name and
    /// namespaces}` beside the kinds' states.
    fn open(w: &Watching, g: &GroupTarget) -> Manifest {
        let id = xxhash_rust::xxh3::xxh3_64(
            format!(
                "{}\n{}",
                g.resource.config.display_name(),
                g.resource.config.namespaces.join(",")
            )
            .as_bytes(),
        );
        let name = match w.multi {
            true => format!("{}.kinds-{id:016x}", g.unit),
            false => format!("kinds-{id:016x}"),
        };
        Manifest {
            store: state::open(&w.state_plan, &name, true),
            read: false,
            written: Vec::new(),
        }
    }

    /// The kinds saved by the last run, once (later calls: none). An unreadable or foreign
    /// manifest is logged and taken as empty.
    async fn take_saved(&mut self) -> Vec<Discovered> {
        let Some(store) = self.store.as_ref().filter(|_| !self.read) else {
            return Vec::new();
        };
        let kinds: Vec<SavedKind> = match store.load().await {
            Ok(None) => Vec::new(),
            Ok(Some(bytes)) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(store = store.describe(), error = %e, "the saved list of a group's kinds does not parse; kinds removed while kubesink was not running are not found");
                Vec::new()
            }),
            Err(e) => {
                tracing::warn!(store = store.describe(), error = %e, "the saved list of a group's kinds cannot be read; kinds removed while kubesink was not running are not found");
                Vec::new()
            }
        };
        self.read = true;
        let saved = kinds.iter().map(SavedKind::discovered).collect();
        self.written = kinds;
        saved
    }

    /// Saves the kinds of `slots` when they changed since the last write.
    async fn write(&mut self, slots: &BTreeMap<(String, String), Slot>) {
        let Some(store) = self.store.as_ref().filter(|_| self.read) else {
            return;
        };
        let now: Vec<SavedKind> = slots
            .values()
            .map(|s| {
                let ar = &s.run.resolved.api_resource;
                SavedKind {
                    group: ar.group.clone(),
                    version: ar.version.clone(),
                    kind: ar.kind.clone(),
                    plural: ar.plural.clone(),
                    namespaced: s.run.resolved.resource.namespaced,
                }
            })
            .collect();
        if self.written == now {
            return;
        }
        let Ok(bytes) = serde_json::to_vec(&now) else {
            return;
        };
        match store.save(bytes, 0).await {
            Ok(()) => self.written = now,
            Err(e) => {
                tracing::warn!(store = store.describe(), error = %e, "saving the list of a group's kinds failed; tried again at the next discovery")
            }
        }
    }
}

/// Whether kind `ar` of `g` is gone: a list of it (one item, metadata only, in the entry's
/// first namespace when it lists some) answers 404 Not Found.
async fn gone(g: &GroupTarget, ar: &kube::discovery::ApiResource) -> bool {
    let api: Api<DynamicObject> = match g.resource.config.namespaces.first() {
        Some(ns) => Api::namespaced_with(g.client.clone(), ns, ar),
        None => Api::all_with(g.client.clone(), ar),
    };
    matches!(
        api.list_metadata(&ListParams::default().limit(1)).await,
        Err(kube::Error::Api(s)) if s.code == 404
    )
}

/// Starts a slot for kind `d` of `g`: plans its watches, opens its state store and starts
/// it (state restored, then its informers) in a task of its own; `retired`: a kind gone
/// before this start, whose watches send the deletes of what its state holds and stop.
fn start(w: &Arc<Watching>, g: &GroupTarget, d: &Discovered, retired: bool) -> Slot {
    let ar = &d.api_resource;
    let compiled = g.resource.for_kind(ar, d.namespaced);
    // Version-less in saved state: a kind keeps its state when its preferred version
    // changes (its objects' uids and resourceVersions do not).
    let identity = Resource::new(&g.spec.name, &ar.group, "*", &ar.kind, "", true);
    let (planned, entries) = plan_resource(&g.spec, &g.unit, compiled, identity, &w.routes);
    let stats = entries.iter().map(|e| e.stats.clone()).collect();
    // A retired slot only sends its deletes: the observers do not wait for it to sync.
    if !retired {
        w.watch_list.add(entries);
    }
    let state = state::open(&w.state_plan, &state_name(&g.unit, ar, w.multi), true)
        .map(|store| (store, Arc::new(StateStats::default())));
    let resolved = d.resolved(&g.spec.name);
    let run = SlotRun {
        resolved,
        cancel: w.cancel.child_token(),
        gone: {
            let gone = CancellationToken::new();
            if retired {
                gone.cancel();
            }
            gone
        },
        saving: w.stop_saving.child_token(),
        journals: w.stop_journals.child_token(),
        keepers: Default::default(),
        tasks: TaskTracker::new(),
    };
    let cluster = PlannedCluster {
        spec: g.spec.clone(),
        client: Ok(g.client.clone()),
        api: g.api.clone(),
        state,
        resources: vec![planned],
    };
    let (watching, slot, client) = (w.clone(), run.clone(), g.client.clone());
    w.tasks.spawn(
        run.tasks.track_future(async move {
            watching.start_planned(&cluster, client, Some(&slot)).await
        }),
    );
    Slot {
        version: ar.version.clone(),
        run,
        stats,
        retired,
    }
}

/// Stops `slot`: its watches (waiting up to [`STOP_WAIT`] for them to end: a retired
/// slot's end once they sent their deletes), then its keeper after a final save, so that a
/// slot started for the same kind restores what this one acknowledged.
async fn stop(w: &Watching, slot: Slot) {
    w.watch_list.remove(&slot.stats);
    if !slot.retired {
        slot.run.cancel.cancel();
    }
    slot.run.tasks.close();
    if tokio::time::timeout(STOP_WAIT, slot.run.tasks.wait())
        .await
        .is_err()
    {
        slot.run.cancel.cancel();
        slot.run.tasks.wait().await;
    }
    let keepers: Vec<_> =
        std::mem::take(&mut *slot.run.keepers.lock().unwrap_or_else(|p| p.into_inner()));
    // Bounded: a state store that does not answer must not hold the other kinds' discovery
    // (the save goes on in its own task; a slot started after it restores what landed).
    for k in &keepers {
        match tokio::time::timeout(STOP_WAIT, k.final_save()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(store = k.describe(), error = %e, "saving a kind's informer state before following it again failed; what changed since its last save is sent again")
            }
            Err(_) => {
                tracing::warn!(store = k.describe(), waited = ?STOP_WAIT, "saving a kind's informer state did not finish in time; what changed since its last save that landed is sent again")
            }
        }
    }
    w.keepers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|k| !keepers.iter().any(|s| Arc::ptr_eq(s, k)));
    slot.run.saving.cancel();
    slot.run.journals.cancel();
}

/// The name of a kind's own state (`state::open`): `{plural}.{group}` (`core` for the core
/// group), after the unit's name with several clusters.
fn state_name(unit: &str, ar: &kube::discovery::ApiResource, multi: bool) -> String {
    let group = group_name(&ar.group);
    match multi {
        true => format!("{unit}.{}.{group}", ar.plural),
        false => format!("{}.{group}", ar.plural),
    }
}

/// Sends on `changed` when a CustomResourceDefinition that may concern `selector` is
/// created, changed or deleted (a metadata-only watch, kube's watcher with its backoff).
/// Without the right to watch CRDs it says so once; discovery every [`REDISCOVER`] still
/// finds the changes.
async fn crd_changes(
    client: Client,
    selector: GroupSelector,
    changed: mpsc::Sender<()>,
    cancel: CancellationToken,
) {
    let api: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut warned = false;
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            e = stream.next() => e,
        };
        match event {
            None => return,
            Some(Ok(watcher::Event::Apply(crd) | watcher::Event::Delete(crd))) => {
                if selector.concerns_crd(&crd.name_any()) {
                    let _ = changed.try_send(());
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) if !warned => {
                warned = true;
                tracing::warn!(error = %e, every = ?REDISCOVER, "cannot watch CustomResourceDefinitions: CRDs installed or deleted are found by API discovery at its interval only (grant list and watch on customresourcedefinitions.apiextensions.k8s.io: kubesink rbac)");
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "watching CustomResourceDefinitions still fails")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kinds_state_is_named_after_its_plural_and_group() {
        let ar = |group: &str, plural: &str| kube::discovery::ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: "x".into(),
            kind: "X".into(),
            plural: plural.into(),
        };
        assert_eq!(
            state_name("prod", &ar("example.com", "widgets"), false),
            "widgets.example.com"
        );
        assert_eq!(state_name("prod", &ar("", "pods"), true), "prod.pods.core");
    }
}
