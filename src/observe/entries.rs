//! What the observers are given to watch: the watches, sinks and state stores of the bridge,
//! and its leadership. Read by the health rules (`mod.rs`) and the metrics (`metrics.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// Whether this replica leads (with leader election), how often that changed, and whether
/// the Lease can be read and written at all.
#[derive(Debug, Default)]
pub struct Leadership {
    leader: AtomicBool,
    changes: AtomicU64,
    /// Since when, and why, the last attempts on the Lease failed (`None` once one answers).
    lease_failing: std::sync::Mutex<Option<(std::time::Instant, String)>>,
}

impl Leadership {
    /// Records the outcome of one attempt on the Lease (acquire or renew): `Err` with the
    /// error's text when the API server could not be asked or refused, `Ok` once it answered.
    pub fn lease_attempt(&self, outcome: Result<(), String>) {
        let mut failing = self
            .lease_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match outcome {
            Ok(()) => *failing = None,
            Err(why) => {
                let since = failing
                    .as_ref()
                    .map_or_else(std::time::Instant::now, |f| f.0);
                *failing = Some((since, why));
            }
        }
    }

    /// How long attempts on the Lease have failed, and the last error; `None` while it answers.
    pub fn lease_failing(&self) -> Option<(std::time::Duration, String)> {
        self.lease_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|(since, why)| (since.elapsed(), why.clone()))
    }

    /// Records a change of role; logged by the caller.
    pub fn set_leader(&self, leader: bool) {
        if self.leader.swap(leader, Ordering::SeqCst) != leader {
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    /// How many times the role changed.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
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
