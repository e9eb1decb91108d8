//! What the bridge plans before any watch starts: per cluster its client, state store and
//! resources, per resource its watches to come (namespace, counters, key in saved state);
//! built by `Bridge::launch` (`mod.rs`), consumed by the watching (`watching.rs`) once this
//! replica may watch.

use std::sync::{Arc, Mutex};

use kube::Client;

use crate::cluster::ClusterError;
use crate::config::{Cluster, ResourceConfig};
use crate::informer::{ClusterApi, InformerStats};
use crate::state::{Keeper, StateStats, StateStore, WatchKey};

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
    pub(super) resource: ResourceConfig,
    pub(super) scopes: Vec<PlannedScope>,
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
