//! What the bridge plans before any watch starts: per cluster its client, state store and
//! resources, per resource its watches to come (namespace, counters, key in saved state per
//! route); built by [`plan_units`] for the launch (`launch.rs`), consumed by the watching
//! (`watching.rs`) once this replica may watch. It starts nothing and never touches the
//! network.

use std::sync::{Arc, Mutex};

use kube::Client;

use super::routes::Route;
use crate::cluster::ClusterError;
use crate::config::{Cluster, ResourceConfig};
use crate::informer::{ClusterApi, InformerStats, WatchPlan};
use crate::observe::{ClusterEntry, StateEntry, WatchEntry};
use crate::plan::{Plan, ResourcePlan, UnitPlan};
use crate::state::{self, Keeper, StateStats, StateStore, WatchKey};

/// The state keepers of the clusters that started watching.
pub(super) type Keepers = Arc<Mutex<Vec<Arc<Keeper>>>>;

/// One watch to come (a namespace of a configured resource, or all of it): what exists
/// before the state was restored and discovery resolved it.
pub(super) struct PlannedScope {
    pub(super) namespace: Option<String>,
    /// The watch's counters (shown per watch; its first view's decider counts into them).
    pub(super) stats: Arc<InformerStats>,
    /// Per route (`routes.rs`, in order): its view's key in saved state and counters.
    pub(super) views: Vec<(WatchKey, Arc<InformerStats>)>,
}

/// One configured resource and its watches to come.
pub(super) struct PlannedResource {
    pub(super) resource: ResourcePlan,
    pub(super) scopes: Vec<PlannedScope>,
    /// In the group form (no scopes of its own): the counters it shows as one watch, its
    /// discovery's failures.
    pub(super) group: Option<Arc<InformerStats>>,
}

/// One cluster: its client, its state store (with `[state]`) and its resources.
pub(super) struct PlannedCluster {
    pub(super) spec: Cluster,
    /// Its client, or why it could not be built at start (built again before its watches).
    pub(super) client: Result<Client, ClusterError>,
    /// Its request budget and counts, shared by its informers.
    pub(super) api: Arc<ClusterApi>,
    pub(super) state: Option<(Arc<dyn StateStore>, Arc<StateStats>)>,
    pub(super) resources: Vec<PlannedResource>,
}

/// The clusters planned, and what the observers are given of them.
pub(super) struct Planned {
    pub(super) clusters: Vec<PlannedCluster>,
    pub(super) watches: Vec<WatchEntry>,
    pub(super) states: Vec<StateEntry>,
    pub(super) apis: Vec<ClusterEntry>,
    /// Each watch's label in the shutdown's figures, and its counters.
    pub(super) stats: Vec<(String, Arc<InformerStats>)>,
}

/// Plans every unit of `units` (with its client, in order): its state store (`p.state`),
/// request budget (`p.watch`) and resources, and per resource and namespace the watch's
/// counters and, per route, its view's key in saved state. `multi` names watches and state
/// as a configuration of several clusters does.
pub(super) fn plan_units(
    p: &Plan,
    units: Vec<UnitPlan>,
    clients: Vec<Result<Client, ClusterError>>,
    routes: &[Route],
    multi: bool,
) -> Planned {
    let mut planned = Vec::new();
    let mut watches = Vec::new();
    let mut states = Vec::new();
    let mut apis = Vec::new();
    let mut stats = Vec::new();
    for (
        UnitPlan {
            cluster: spec,
            resources: compiled,
        },
        client,
    ) in units.into_iter().zip(clients)
    {
        // What the metrics, `/readyz` and the saved state call it: the cluster, or its
        // shard (messages carry the cluster's name either way).
        let unit = spec.unit();
        let mut resources = Vec::new();
        for compiled in compiled {
            let res = &compiled.config;
            if res.selector().is_some() {
                // The group form: its kinds' watches are planned as discovery finds them
                // (`groups.rs`); until then it shows as one watch of its own.
                let s = Arc::new(InformerStats::default());
                watches.push(WatchEntry {
                    cluster: unit.clone(),
                    api_version: res.display_name(),
                    kind: "*".to_owned(),
                    namespace: None,
                    stats: s.clone(),
                });
                resources.push(PlannedResource {
                    resource: compiled,
                    scopes: Vec::new(),
                    group: Some(s),
                });
                continue;
            }
            let identity = configured_identity(&spec.name, res);
            let (planned, entries) = plan_resource(&spec, &unit, compiled, identity, routes);
            for e in &entries {
                stats.push((
                    watch_label(&unit, &e.api_version, &e.kind, &e.namespace, multi),
                    e.stats.clone(),
                ));
            }
            watches.extend(entries);
            resources.push(planned);
        }
        let state = state::open(&p.state, &unit, multi).map(|store| {
            let s = Arc::new(StateStats::default());
            states.push(StateEntry {
                cluster: unit.clone(),
                store: store.describe().to_owned(),
                stats: s.clone(),
            });
            (store, s)
        });
        let api = Arc::new(ClusterApi::new(&p.watch));
        apis.push(ClusterEntry {
            cluster: unit.clone(),
            api: api.clone(),
        });
        planned.push(PlannedCluster {
            spec,
            client,
            api,
            state,
            resources,
        });
    }
    Planned {
        clusters: planned,
        watches,
        states,
        apis,
        stats,
    }
}

/// The label of a watch in the shutdown's figures.
fn watch_label(
    unit: &str,
    api_version: &str,
    kind: &str,
    namespace: &Option<String>,
    multi: bool,
) -> String {
    let scope = namespace.as_deref().unwrap_or("all");
    match multi {
        true => format!("{unit}: {api_version} {kind} ({scope})"),
        false => format!("{api_version} {kind} ({scope})"),
    }
}

/// One resource of cluster `spec` (unit `unit`), known as `identity` in saved state: per
/// listed namespace (or one for all) its watch's counters and, per route, its view's key
/// in saved state; and what the observers show of each watch.
pub(super) fn plan_resource(
    spec: &Cluster,
    unit: &str,
    compiled: ResourcePlan,
    identity: kubesink_core::Resource,
    routes: &[Route],
) -> (PlannedResource, Vec<WatchEntry>) {
    let res = &compiled.config;
    let namespaces: Vec<Option<String>> = if res.namespaces.is_empty() {
        vec![None]
    } else {
        res.namespaces.iter().cloned().map(Some).collect()
    };
    let mut scopes = Vec::new();
    let mut entries = Vec::new();
    for ns in namespaces {
        let base = WatchPlan::identity_of(&identity, ns.as_deref());
        let selection =
            WatchPlan::selection_of(res, &identity, ns.as_deref(), &spec.label, spec.shard);
        let s = Arc::new(InformerStats::default());
        entries.push(WatchEntry {
            cluster: unit.to_owned(),
            api_version: res.api_version.clone(),
            kind: res.kind.clone(),
            namespace: ns.clone(),
            stats: s.clone(),
        });
        // An owner-index watch has one view, sending nothing and saving nothing.
        let routes = match compiled.index_only {
            true => &routes[..routes.len().min(1)],
            false => routes,
        };
        let views = routes
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let key = WatchKey {
                    identity: r.identity(&base),
                    selection,
                    seed: r.seed(&base),
                };
                // The first view counts into the watch's counters (what `/metrics` and
                // `/readyz` show per watch); a sink's filter counts into the sink's
                // (`Route::counts`).
                let counts = match k {
                    0 => s.clone(),
                    _ => Arc::new(InformerStats::default()),
                };
                (key, counts)
            })
            .collect();
        scopes.push(PlannedScope {
            namespace: ns,
            stats: s,
            views,
        });
    }
    let planned = PlannedResource {
        resource: compiled,
        scopes,
        group: None,
    };
    (planned, entries)
}

/// The identity of `res` in `cluster` as configured, before discovery (the plural and scope
/// are not part of saved state's keys).
pub(super) fn configured_identity(cluster: &str, res: &ResourceConfig) -> kubesink_core::Resource {
    let (group, version) = res
        .api_version
        .split_once('/')
        .unwrap_or(("", res.api_version.as_str()));
    kubesink_core::Resource::new(cluster, group, version, &res.kind, "", true)
}
