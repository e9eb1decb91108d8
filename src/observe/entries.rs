//! What the observers are given to watch: the watches, sinks and state stores of the bridge
//! (its leadership is the leader election's own record, `crate::leader::Leadership`). Read by the health rules (`mod.rs`) and the metrics (`metrics.rs`).

use std::sync::Arc;

use crate::informer::{ClusterApi, InformerStats, SinkFilterStats};
use crate::pipeline::SinkHandle;
use crate::state::StateStats;

/// One watch as the observers see it (known from the configuration before discovery).
#[derive(Clone)]
pub struct WatchEntry {
    /// The cluster's name.
    pub cluster: String,
    /// `apiVersion` as configured.
    pub api_version: String,
    /// Kind as configured.
    pub kind: String,
    /// Its namespace (`None`: all, or the cluster scope).
    pub namespace: Option<String>,
    /// Its counters.
    pub stats: Arc<InformerStats>,
}

/// One cluster's state store as the observers see it.
#[derive(Clone)]
pub struct StateEntry {
    /// The cluster's name.
    pub cluster: String,
    /// Where the state is kept (`file ...`, `NATS object store ...`).
    pub store: String,
    /// Its counters.
    pub stats: Arc<StateStats>,
}

/// One cluster's API requests as the observers see them.
#[derive(Clone)]
pub struct ClusterEntry {
    /// The cluster's name.
    pub cluster: String,
    /// Its request budget and counts.
    pub api: Arc<ClusterApi>,
}

/// One sink as the observers see it.
#[derive(Clone)]
pub struct SinkEntry {
    /// The sink with its queue and counters.
    pub handle: SinkHandle,
    /// With a `filter`: what it did, summed over the sink's views (`bridge/routes.rs`).
    pub filter: Option<Arc<SinkFilterStats>>,
    /// With scale-out (`scale_out.rs`), the cluster whose pipeline this queue belongs to: every
    /// held cluster has its own queues, so the sink's series carry a `cluster` label too.
    pub cluster: Option<String>,
}
