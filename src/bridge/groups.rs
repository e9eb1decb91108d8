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
//!   leave a kind out for a moment while a CRD changes), retires: what its stores still hold is sent as deleted
//!   (an inferred delete, as after a list that no longer finds it), then its watches stop.
//!
//! What changes the set is learnt from a watch of CustomResourceDefinitions (metadata only;
//! a change of a CRD of the entry's group asks discovery again after [`DEBOUNCE`], then
//! [`SETTLES`] times [`SETTLE`] apart: the API server serves a new CRD's kind once it is
//! established, and rebuilds its discovery document a moment after a change) and
//! from discovery every [`REDISCOVER`] (aggregated APIs, and clusters where kubesink may not
//! watch CRDs).
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
use crate::cluster::{self, Discovered, Resolved};
use crate::config::{Cluster, GroupSelector, ServedKind};
use crate::informer::{ClusterApi, FailureKind, InformerStats};
use crate::plan::ResourcePlan;
use crate::state::{self, StateStats};

/// How long after a CRD's change discovery is asked again (more changes meanwhile are
/// taken together).
pub(super) const DEBOUNCE: Duration = Duration::from_millis(300);
/// After the discovery that followed a CRD's change, how long until it is asked once more:
/// the API server serves a CRD's kind once the CRD is established, and stops shortly after
/// the CRD is gone.
pub(super) const SETTLE: Duration = Duration::from_secs(3);
/// How many discoveries follow a CRD's change, [`SETTLE`] apart.
const SETTLES: u32 = 4;
/// How often discovery is asked without a CRD's change.
pub(super) const REDISCOVER: Duration = Duration::from_secs(300);
/// How long a slot that stops waits for its watches to end before its final save.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// One group-form resource of one cluster, and what its kinds are left to others.
pub(super) struct GroupTarget {
    spec: Cluster,
    unit: String,
    client: Client,
    api: Arc<ClusterApi>,
    resource: ResourcePlan,
    selector: Option<GroupSelector>,
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
    /// `stats`.
    pub(super) fn new(
        c: &PlannedCluster,
        at: usize,
        client: Client,
        stats: Arc<InformerStats>,
    ) -> GroupTarget {
        let resource = c.resources[at].resource.clone();
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
        GroupTarget {
            spec: c.spec.clone(),
            unit: c.spec.unit(),
            client,
            api: c.api.clone(),
            selector: resource.config.selector(),
            resource,
            stats,
            listed,
            earlier,
        }
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

/// Follows `g`'s kinds until the bridge stops (see the module docs).
pub(super) async fn follow(w: Arc<Watching>, g: GroupTarget) {
    let Some(selector) = g.selector.clone() else {
        return;
    };
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
    // Discoveries still to come at [`SETTLE`] intervals after a CRD's change.
    let mut settle = 0u32;
    let mut failed = false;
    loop {
        let found = tokio::select! {
            _ = w.cancel.cancelled() => return,
            r = cluster::discover_kinds(&g.client, &g.resource.config, &selector) => r,
        };
        let next = match found {
            Ok(kinds) => {
                if failed {
                    span.in_scope(|| tracing::info!("API discovery answers again"));
                    failed = false;
                }
                g.stats.clear_failure();
                let unsure = reconcile(&w, &g, &mut slots, &kinds)
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
        slots.insert(key, start(w, g, d));
    }
    unsure
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
/// it (state restored, then its informers) in a task of its own.
fn start(w: &Arc<Watching>, g: &GroupTarget, d: &Discovered) -> Slot {
    let ar = &d.api_resource;
    let mut config = g.resource.config.clone();
    config.api_version = ar.api_version.clone();
    config.kind = ar.kind.clone();
    config.group = None;
    config.kinds.clear();
    config.exclude.clear();
    config.plural = Some(ar.plural.clone());
    let compiled = ResourcePlan {
        config,
        filter: g.resource.filter.clone(),
        changes: g.resource.changes.clone(),
    };
    // Version-less in saved state: a kind keeps its state when its preferred version
    // changes (its objects' uids and resourceVersions do not).
    let identity = Resource::new(&g.spec.name, &ar.group, "*", &ar.kind, "", true);
    let (planned, entries) = plan_resource(&g.spec, &g.unit, compiled, identity, &w.routes);
    let stats = entries.iter().map(|e| e.stats.clone()).collect();
    w.watch_list.add(entries);
    let state = state::open(&w.state_plan, &state_name(&g.unit, ar, w.multi), true)
        .map(|store| (store, Arc::new(StateStats::default())));
    let resolved = Resolved {
        resource: Arc::new(Resource::new(
            &g.spec.name,
            &ar.group,
            &ar.version,
            &ar.kind,
            &ar.plural,
            d.namespaced,
        )),
        api_resource: ar.clone(),
    };
    let run = SlotRun {
        resolved,
        cancel: w.cancel.child_token(),
        gone: CancellationToken::new(),
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
        retired: false,
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
    for k in &keepers {
        if let Err(e) = k.final_save().await {
            tracing::warn!(store = k.describe(), error = %e, "saving a kind's informer state before following it again failed; what changed since its last save is sent again");
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
    let group = match ar.group.as_str() {
        "" => "core",
        g => g,
    };
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
