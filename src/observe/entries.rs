//! What the observers are given to watch: the watches, sinks and state stores of the bridge
//! (its leadership is the leader election's own record, `crate::leader::Leadership`). Read by the health rules (`mod.rs`) and the metrics (`metrics.rs`).

use std::sync::{Arc, RwLock};

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

/// The watches of a bridge as the observers see them: those planned at start, and those a
/// group-form resource adds and removes as the cluster's kinds come and go
/// (`bridge/groups.rs`); or, for a scale-out replica, those of the bridges it runs.
#[derive(Default)]
pub struct WatchList {
    own: RwLock<Arc<[WatchEntry]>>,
    parts: Vec<Arc<WatchList>>,
}

impl WatchList {
    /// A list of `entries`.
    pub fn new(entries: Vec<WatchEntry>) -> Arc<Self> {
        Arc::new(WatchList {
            own: RwLock::new(entries.into()),
            parts: Vec::new(),
        })
    }

    /// The lists of `parts`, read through as one.
    pub fn merged(parts: Vec<Arc<WatchList>>) -> Arc<Self> {
        Arc::new(WatchList {
            own: RwLock::default(),
            parts,
        })
    }

    /// The watches now, in the order they were added.
    pub fn get(&self) -> Arc<[WatchEntry]> {
        let own = self.own.read().unwrap_or_else(|p| p.into_inner()).clone();
        if self.parts.is_empty() {
            return own;
        }
        let mut all = own.to_vec();
        for p in &self.parts {
            all.extend(p.get().iter().cloned());
        }
        all.into()
    }

    /// Adds `entries`.
    pub fn add(&self, entries: impl IntoIterator<Item = WatchEntry>) {
        let mut own = self.own.write().unwrap_or_else(|p| p.into_inner());
        let mut all = own.to_vec();
        all.extend(entries);
        *own = all.into();
    }

    /// Removes the watches counting into `stats` (compared by pointer).
    pub fn remove(&self, stats: &[Arc<InformerStats>]) {
        let mut own = self.own.write().unwrap_or_else(|p| p.into_inner());
        let kept: Vec<WatchEntry> = own
            .iter()
            .filter(|w| !stats.iter().any(|s| Arc::ptr_eq(s, &w.stats)))
            .cloned()
            .collect();
        *own = kept.into();
    }
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
