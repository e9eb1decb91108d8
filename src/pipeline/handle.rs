//! [`SinkHandle`]: one sink as the pipeline sees it (the sink, its queue, its counters, its
//! ready signal), shared by the worker, the bridge's probe and the observers.

use std::sync::Arc;

use kubesink_core::{ReadySignal, Sink};

use super::queue::SinkQueue;
use super::stats::SinkStats;

/// One sink as the pipeline sees it: the sink, its queue and its counters. Cheap to clone.
#[derive(Clone)]
pub struct SinkHandle {
    pub(super) sink: Arc<dyn Sink>,
    pub(super) queue: Arc<SinkQueue>,
    pub(super) stats: Arc<SinkStats>,
    pub(super) ready: ReadySignal,
}

impl SinkHandle {
    /// The sink.
    pub fn sink(&self) -> &Arc<dyn Sink> {
        &self.sink
    }

    /// Its worker's counters.
    pub fn stats(&self) -> &Arc<SinkStats> {
        &self.stats
    }

    /// The "destination reachable again" signal that ends the worker's retry backoff: the
    /// sink's own ([`Sink::ready_signal`]) or one only the readiness probe notifies.
    pub fn ready(&self) -> &ReadySignal {
        &self.ready
    }

    /// Changes held now (pending + in flight).
    pub fn held(&self) -> usize {
        self.queue.held()
    }

    /// The most changes ever held at once.
    pub fn high_water(&self) -> usize {
        self.queue.high_water()
    }

    /// Batches in flight now (at most the sink's [`Sink::max_batches_in_flight`]).
    pub fn batches_in_flight(&self) -> usize {
        self.queue.batches_in_flight()
    }

    /// The most batches ever in flight at once.
    pub fn batches_high_water(&self) -> usize {
        self.queue.batches_high_water()
    }

    /// Bytes held now (pending + in flight).
    pub fn held_bytes(&self) -> usize {
        self.queue.held_bytes()
    }

    /// Changes not sent because of coalescing (replaced while waiting, or cancelled pairs).
    pub fn coalesced(&self) -> usize {
        self.queue.coalesced()
    }

    /// Changes folded into one an Event reason's rate held back (`reason_rate_limit`).
    pub fn rate_folded(&self) -> usize {
        self.queue.rate_folded()
    }

    /// Changes an Event reason's rate held back, each once.
    pub fn rate_held(&self) -> usize {
        self.queue.rate_held()
    }
}
