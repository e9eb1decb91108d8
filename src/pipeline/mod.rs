//! The batching and backpressure stage between the informers and the sinks.
//!
//! ```text
//! informers ──publish──▶ SinkQueue (per sink) ──batch──▶ worker ──send──▶ Sink
//!      ▲                      │ full: push waits                 │ Err: retry (backoff)
//!      └── stop reading the watch streams ◀──────┘               └ Ok: complete → space
//! ```
//!
//! - Every sink has its own [`SinkQueue`] and worker: a slow sink cannot lose data for the
//!   others, and because the informers wait for room in *every* queue, a dead sink cannot let
//!   the others (or memory) run unbounded either; it stalls the informers, which stop
//!   reading their watch streams (the API server then holds the backlog, or expires it with
//!   410 Gone, after which the relist recovers it).
//! - At-least-once: a batch leaves its queue only when the sink confirms it. Errors are
//!   retried with capped exponential backoff (with jitter), forever; only the messages a
//!   sink reports as failed are re-sent. Never dropped.
//! - Oversize: the policy shared by all sinks (see `kubesink_sinks::Sink`): metadata-only
//!   form with `"truncated": true`, then no object; counted in [`SinkStats::truncated`].

mod queue;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use kubesink_sinks::{Message, Sink, SinkError};
use tokio::task::JoinHandle;

pub use queue::{Batch, QueueLimits, SinkQueue};

use crate::config::PipelineConfig;
use crate::message::{truncate, TruncateLevel};

/// Counters of one sink's worker.
#[derive(Debug, Default)]
pub struct SinkStats {
    /// Messages the sink confirmed.
    pub delivered: AtomicU64,
    /// Batches confirmed.
    pub batches: AtomicU64,
    /// Failed `send` calls (each followed by a retry).
    pub errors: AtomicU64,
    /// Messages reduced by the oversize policy.
    pub truncated: AtomicU64,
}

/// A sink with its queue, worker and counters.
pub struct SinkHandle {
    /// The sink.
    pub sink: Arc<dyn Sink>,
    /// Its queue.
    pub queue: Arc<SinkQueue>,
    /// Its counters.
    pub stats: Arc<SinkStats>,
    worker: JoinHandle<()>,
}

/// The fan-out to every sink's queue. Cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    sinks: Arc<Vec<SinkHandle>>,
}

impl Pipeline {
    /// Starts one worker per sink.
    pub fn start(config: &PipelineConfig, sinks: Vec<Arc<dyn Sink>>) -> Self {
        let limits = QueueLimits {
            coalesce: config.coalesce,
            max_pending: config.max_pending,
            max_pending_bytes: config.max_pending_bytes.bytes(),
            max_batch_events: config.max_batch_events,
            max_batch_bytes: config.max_batch_bytes.bytes(),
            linger: config.linger.get(),
        };
        let retry = RetryPolicy {
            initial: config.retry_initial_backoff.get(),
            max: config.retry_max_backoff.get(),
        };
        let handles = sinks
            .into_iter()
            .map(|sink| {
                let queue = Arc::new(SinkQueue::new(limits.clone()));
                let stats = Arc::new(SinkStats::default());
                let worker = tokio::spawn(run_worker(
                    sink.clone(),
                    queue.clone(),
                    stats.clone(),
                    retry.clone(),
                ));
                SinkHandle {
                    sink,
                    queue,
                    stats,
                    worker,
                }
            })
            .collect();
        Pipeline {
            sinks: Arc::new(handles),
        }
    }

    /// Queues `msg` for every sink, waiting while any queue is full (backpressure). Returns
    /// `false` when the pipeline is shutting down.
    pub async fn publish(&self, msg: Message) -> bool {
        let mut all = true;
        for h in self.sinks.iter() {
            all &= h.queue.push(msg.clone()).await;
        }
        all
    }

    /// The sinks, their queues and counters.
    pub fn sinks(&self) -> &[SinkHandle] {
        &self.sinks
    }

    /// Stops accepting changes and delivers what is pending, for at most `timeout`; then
    /// closes every sink. Returns the number of changes that could not be delivered in time
    /// (0 on a clean flush).
    pub async fn shutdown(&self, timeout: Duration) -> usize {
        for h in self.sinks.iter() {
            h.queue.close();
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut undelivered = 0;
        for h in self.sinks.iter() {
            let abort = h.worker.abort_handle();
            if tokio::time::timeout_at(deadline, async {
                while !h.worker.is_finished() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .is_err()
            {
                abort.abort();
                let left = h.queue.held();
                undelivered += left;
                tracing::error!(
                    sink = h.sink.name(),
                    undelivered = left,
                    "shutdown timeout: changes not delivered"
                );
            }
            if let Err(e) = h.sink.close().await {
                tracing::warn!(sink = h.sink.name(), error = %e, "closing sink");
            }
        }
        undelivered
    }
}

#[derive(Clone, Debug)]
struct RetryPolicy {
    initial: Duration,
    max: Duration,
}

impl RetryPolicy {
    fn backoff(&self) -> impl Iterator<Item = Duration> {
        ExponentialBuilder::default()
            .with_min_delay(self.initial)
            .with_max_delay(self.max)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

async fn run_worker(
    sink: Arc<dyn Sink>,
    queue: Arc<SinkQueue>,
    stats: Arc<SinkStats>,
    retry: RetryPolicy,
) {
    while let Some(batch) = queue.next_batch().await {
        deliver(&*sink, &batch.messages, &stats, &retry).await;
        queue.complete(batch);
    }
}

/// Sends `batch` until the sink confirms all of it. Never returns early: at-least-once.
async fn deliver(sink: &dyn Sink, batch: &[Message], stats: &SinkStats, retry: &RetryPolicy) {
    let total = batch.len() as u64;
    let mut todo: Vec<Message> = batch.to_vec();
    let mut levels: Vec<Option<TruncateLevel>> = vec![None; todo.len()];
    if let Some(limit) = sink.max_message_bytes() {
        for i in 0..todo.len() {
            while todo[i].payload.len() > limit {
                if !shrink(&mut todo[i], &mut levels[i], stats) {
                    break;
                }
            }
        }
    }
    let mut backoff = retry.backoff();
    loop {
        let err = match sink.send(&todo).await {
            Ok(()) => {
                stats.delivered.fetch_add(total, Ordering::Relaxed);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(e) => e,
        };
        stats.errors.fetch_add(1, Ordering::Relaxed);
        let mut delay = backoff.next().unwrap_or(retry.max);
        match &err {
            SinkError::TooLarge { index, .. } => {
                let i = *index;
                if i < todo.len() && shrink(&mut todo[i], &mut levels[i], stats) {
                    tracing::warn!(sink = sink.name(), key = %todo[i].key, "message too large for the destination: sending it truncated");
                    continue;
                }
                tracing::error!(sink = sink.name(), error = %err, "message too large even without its object; retrying");
            }
            SinkError::Partial { failed, .. } => {
                let (keep, keep_levels) = retain_failed(&todo, &levels, failed);
                tracing::warn!(sink = sink.name(), error = %err, retrying = keep.len(), "partial delivery");
                todo = keep;
                levels = keep_levels;
                if todo.is_empty() {
                    stats.delivered.fetch_add(total, Ordering::Relaxed);
                    stats.batches.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            SinkError::Fatal { .. } => {
                delay = retry.max;
                tracing::error!(sink = sink.name(), error = %err, retry_in = ?delay, "sink needs attention; retrying");
            }
            SinkError::Transient { retry_after, .. } => {
                if let Some(after) = retry_after {
                    delay = delay.max(*after);
                }
                tracing::warn!(sink = sink.name(), error = %err, retry_in = ?delay, "sink error; retrying");
            }
        }
        tokio::time::sleep(delay).await;
    }
}

/// Keeps the failed messages, in order, except those superseded by a later message of the
/// same key that was delivered (re-sending them would move that key backwards).
fn retain_failed(
    todo: &[Message],
    levels: &[Option<TruncateLevel>],
    failed: &[usize],
) -> (Vec<Message>, Vec<Option<TruncateLevel>>) {
    let failed: std::collections::HashSet<usize> =
        failed.iter().copied().filter(|i| *i < todo.len()).collect();
    let mut last_delivered: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::new();
    for (i, m) in todo.iter().enumerate() {
        if !failed.contains(&i) {
            last_delivered.insert(&m.key, i);
        }
    }
    todo.iter()
        .zip(levels)
        .enumerate()
        .filter(|(i, (m, _))| {
            failed.contains(i) && last_delivered.get(&*m.key).is_none_or(|d| d < i)
        })
        .map(|(_, (m, l))| (m.clone(), *l))
        .unzip()
}

/// Applies the next truncation level; `false` when nothing more can be removed.
fn shrink(msg: &mut Message, level: &mut Option<TruncateLevel>, stats: &SinkStats) -> bool {
    let next = match level {
        None => TruncateLevel::MetadataOnly,
        Some(TruncateLevel::MetadataOnly) => TruncateLevel::NoObject,
        Some(TruncateLevel::NoObject) => return false,
    };
    let Some(smaller) = truncate(msg, next) else {
        return false;
    };
    if level.is_none() {
        stats.truncated.fetch_add(1, Ordering::Relaxed);
    }
    *msg = smaller;
    *level = Some(next);
    true
}
