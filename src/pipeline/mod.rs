//! The batching and backpressure stage between the informers and the sinks.
//!
//! ```text
//! informers ──Publisher::publish──▶ SinkQueue (per sink) ──batch──▶ worker ──send──▶ Sink
//!      ▲                                 │ full: push waits               │ Err: retry (backoff)
//!      └── stop reading the watch streams ◀──────┘                        └ Ok: complete → space
//! ```
//!
//! - [`Pipeline`] is the owner: it starts one worker per sink and holds their join handles,
//!   so [`Pipeline::shutdown`] awaits the workers. [`Publisher`] is the cheap, cloneable
//!   handle the informers publish through (both in this file). A sink as the pipeline sees
//!   it is a [`SinkHandle`] (`handle.rs`) with its [`SinkStats`] (`stats.rs`); a change's
//!   acknowledgement and the write-ahead position are `ack.rs`.
//! - Every sink has its own queue (`queue.rs`) and worker: a slow sink cannot lose data for
//!   the others, and because the informers wait for room in *every* queue, a dead sink cannot
//!   let the others (or memory) run unbounded either; it stalls the informers, which stop
//!   reading their watch streams (the API server then holds the backlog, or expires it with
//!   410 Gone, after which the relist recovers it).
//! - At-least-once: a batch leaves its queue only when the sink confirms it (`deliver.rs`).
//!   Errors are retried with capped exponential backoff, forever; only the messages a sink
//!   reports as failed are re-sent. Never dropped.
//! - Oversize: the policy shared by all sinks (see `kubesink_core::Sink`): metadata-only
//!   form with `"truncated": true`, then no object; counted in [`SinkStats::truncated`].
//! - Acknowledgements: [`Publisher::publish_acked`] attaches an [`Ack`] to a change; each
//!   sink's queue settles it once that sink confirmed the change or replaced it by a newer
//!   one of the same key (coalescing). A change fanned out to N sinks is settled N times;
//!   the acknowledged informer state counts to N. Nothing settles a change that was not
//!   confirmed (shutdown timeout, crash).
//! - Write-ahead: a change whose [`Ack`] carries a [`WriteAhead`] position (with a state
//!   store: every change, since the state journal records each new key before its `added`
//!   may leave) is sent only once that log is durable up to it; the worker waits once per
//!   batch, for the batch's highest position (`deliver.rs`). A log that cannot be written
//!   stalls delivery, which the queues turn into backpressure: nothing is sent that a crash
//!   could leave unaccounted for.
//! - Sync markers are never coalesced and never overtaken (`queue.rs`), and a partial retry
//!   re-sends a marker after the messages before it (`deliver.rs`).
//! - A worker that panics (a bug, in a sink's `send` say) is not restarted: its panic is
//!   caught, logged and kept in [`SinkStats::panicked`], so the sink fails readiness and
//!   liveness (`observe`) and the restart that follows resumes delivery; meanwhile its queue
//!   fills and stalls the informers, as a dead sink does. At shutdown it counts as not
//!   drained: what its queue holds is undelivered ([`Drained::panicked`]).

mod ack;
mod deliver;
mod handle;
#[cfg(test)]
mod model_tests;
mod queue;
mod stats;
#[cfg(test)]
mod worker_model_tests;

use std::sync::Arc;

use kubesink_core::backoff::Backoff;
use kubesink_core::{Message, Sink};
use queue::{QueueLimits, SinkQueue};

pub use ack::{Ack, Durability, Settle, WriteAhead};
pub use handle::SinkHandle;
pub use queue::Throttle;
pub use stats::{SinkStats, ERROR_KINDS};
use tokio::task::JoinHandle;

use crate::config::PipelineConfig;
use crate::leader::Fence;

/// The handle informers publish through: the fan-out to every sink's queue. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    queues: Arc<[Arc<SinkQueue>]>,
    /// The leadership fence, for the leader epoch every message carries.
    fence: Fence,
}

impl Publisher {
    /// Queues `msg` for every sink, waiting while any queue is full (backpressure). Returns
    /// `false` when the pipeline is shutting down.
    pub async fn publish(&self, msg: Message) -> bool {
        self.publish_acked(msg, None, true, None).await
    }

    /// [`Publisher::publish`] with an acknowledgement: each sink settles `ack` once (see
    /// [`Settle`]), so it is settled [`Publisher::sinks`] times when every sink is done.
    /// `may_be_held` ([`kubesink_core::message::Change::may_be_held`]): an `added` that a
    /// destination may already hold, which no later `deleted` may cancel in a queue.
    /// `throttle`: the rate each sink's queue holds the change to ([`Throttle`]; each sink
    /// has its own budget).
    pub async fn publish_acked(
        &self,
        msg: Message,
        ack: Option<Ack>,
        may_be_held: bool,
        throttle: Option<Throttle>,
    ) -> bool {
        let mut all = true;
        for q in self.queues.iter() {
            all &= q
                .push_change(msg.clone(), ack.clone(), may_be_held, throttle.clone())
                .await;
        }
        all
    }

    /// The leader epoch messages carry (`leaderEpoch`; [`Fence::epoch`]), `None` without
    /// leader election.
    pub fn leader_epoch(&self) -> Option<u64> {
        self.fence.epoch()
    }

    /// The number of sinks a published change goes to.
    pub fn sinks(&self) -> usize {
        self.queues.len()
    }

    /// A publisher to the sinks at `sinks` (indexes in the pipeline's order; one out of
    /// range is left out): a route's (`bridge/routes.rs`). All of them: a clone of this one.
    pub fn only(&self, sinks: &[usize]) -> Publisher {
        if sinks.len() == self.queues.len() && sinks.iter().enumerate().all(|(i, s)| i == *s) {
            return self.clone();
        }
        Publisher {
            queues: sinks
                .iter()
                .filter_map(|i| self.queues.get(*i).cloned())
                .collect(),
            fence: self.fence.clone(),
        }
    }
}

/// The running pipeline: one queue and one worker per sink. Owns the workers.
pub struct Pipeline {
    sinks: Vec<SinkHandle>,
    workers: Vec<JoinHandle<()>>,
    publisher: Publisher,
}

impl Pipeline {
    /// Starts one worker per sink with the `[pipeline]` limits and retry policy. Workers send
    /// only while `fence` is open (leader election).
    pub fn start(config: &PipelineConfig, sinks: Vec<Arc<dyn Sink>>, fence: Fence) -> Self {
        let limits = QueueLimits {
            coalesce: config.coalesce,
            max_pending: config.max_pending,
            max_pending_bytes: config.max_pending_bytes.bytes(),
            max_batch_events: config.max_batch_events,
            max_batch_bytes: config.max_batch_bytes.bytes(),
            linger: config.linger.get(),
            window: 1,
        };
        let retry = Backoff::new(
            config.retry_initial_backoff.get(),
            config.retry_max_backoff.get(),
        );
        let mut handles = Vec::with_capacity(sinks.len());
        let mut workers = Vec::with_capacity(sinks.len());
        for sink in sinks {
            let window = sink.max_batches_in_flight().max(1);
            let h = SinkHandle {
                ready: sink.ready_signal().unwrap_or_default(),
                sink,
                queue: Arc::new(SinkQueue::new(QueueLimits {
                    window,
                    ..limits.clone()
                })),
                stats: Arc::new(SinkStats::default()),
            };
            workers.push(tokio::spawn(supervise(
                h.clone(),
                deliver::run_worker(h.clone(), retry, fence.clone()),
            )));
            handles.push(h);
        }
        let publisher = Publisher {
            queues: handles.iter().map(|h| h.queue.clone()).collect(),
            fence,
        };
        Pipeline {
            sinks: handles,
            workers,
            publisher,
        }
    }

    /// A handle to publish through.
    pub fn publisher(&self) -> Publisher {
        self.publisher.clone()
    }

    /// The sinks, their queues and counters.
    pub fn sinks(&self) -> &[SinkHandle] {
        &self.sinks
    }

    /// [`Pipeline::drain`], returning only the number of changes that were not delivered.
    pub async fn shutdown(self, deadline: tokio::time::Instant) -> usize {
        self.drain(deadline).await.undelivered
    }

    /// Stops accepting changes and delivers what is pending until `deadline`, then closes
    /// every sink, the close included in the same deadline (a sink's `close` is cancelled
    /// when it passes). Returns what was not delivered (nothing on a clean flush), and logs
    /// one error line per sink that left some. A sink whose worker had panicked is not
    /// drained: what its queue holds is undelivered.
    pub async fn drain(self, deadline: tokio::time::Instant) -> Drained {
        for h in &self.sinks {
            h.queue.close();
        }
        let mut out = Drained::default();
        let mut drained = Vec::with_capacity(self.sinks.len());
        for (h, worker) in self.sinks.iter().zip(self.workers) {
            let abort = worker.abort_handle();
            let joined = tokio::time::timeout_at(deadline, worker).await;
            // Caught by `supervise`; a panic that escaped it shows in the join error.
            let panic = match &joined {
                Ok(Err(e)) if e.is_panic() => Some(e.to_string()),
                _ => h.stats.panicked(),
            };
            if let Some(panic) = panic {
                let left = h.queue.held();
                out.undelivered += left;
                out.panicked.push(h.sink.name().to_owned());
                tracing::error!(
                    sink = h.sink.name(),
                    undelivered = left,
                    %panic,
                    "shutdown: the sink's worker had panicked; its changes were not delivered"
                );
                drained.push(false);
            } else if joined.is_err() {
                abort.abort();
                let left = h.queue.held();
                out.undelivered += left;
                let problem = match h.stats.problem() {
                    Some(p) => p,
                    None if h.stats.waiting_for_journal().is_some() => {
                        "its batch was waiting for the state journal, which could not be stored (see the state journal's log lines)".to_owned()
                    }
                    None => "none recorded".to_owned(),
                };
                tracing::error!(
                    sink = h.sink.name(),
                    undelivered = left,
                    %problem,
                    "shutdown deadline passed: changes not delivered"
                );
                drained.push(false);
            } else {
                drained.push(true);
            }
        }
        // Every sink closes concurrently within what is left of the deadline.
        let closes = self
            .sinks
            .iter()
            .zip(drained)
            .map(|(h, drained)| async move {
                match tokio::time::timeout_at(deadline, h.sink.close()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(sink = h.sink.name(), error = %e, "closing sink"),
                    Err(_) if drained => {
                        tracing::warn!(
                            sink = h.sink.name(),
                            "shutdown deadline passed while closing the sink"
                        )
                    }
                    Err(_) => {}
                }
            });
        futures::future::join_all(closes).await;
        out
    }
}

/// What [`Pipeline::drain`] could not deliver.
#[derive(Debug, Default)]
pub struct Drained {
    /// Changes held by the sinks' queues (pending or in flight) at the deadline, or by a
    /// sink whose worker had panicked, summed over the sinks.
    pub undelivered: usize,
    /// The sinks whose worker had panicked.
    pub panicked: Vec<String>,
}

/// Runs a sink's worker, catching a panic in it (a bug): logged and kept in the sink's
/// stats, so health fails (`observe`) instead of delivery stopping silently.
async fn supervise(h: SinkHandle, worker: impl std::future::Future<Output = ()>) {
    use futures::FutureExt;
    if let Err(panic) = std::panic::AssertUnwindSafe(worker).catch_unwind().await {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        tracing::error!(
            sink = h.sink.name(),
            held = h.queue.held(),
            panic = %message,
            "the sink's worker panicked (a bug): nothing more is delivered to this sink; /readyz and /healthz fail so that a restart resumes delivery"
        );
        h.stats.note_panic(message);
    }
}
