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
//!   handle the informers publish through.
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

mod deliver;
#[cfg(test)]
mod model_tests;
mod queue;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use kubesink_core::backoff::Backoff;
use kubesink_core::{Message, Problem, ReadySignal, Sink, SinkError, Streak};
use prometheus_client::metrics::histogram::Histogram;
use queue::{QueueLimits, SinkQueue};
use tokio::task::JoinHandle;

use crate::config::PipelineConfig;
use crate::leader::Fence;

/// Told when a sink is done with a change (see [`Ack`]).
pub trait Settle: Send + Sync {
    /// Called once per sink the change was queued for: after that sink confirmed it, or when
    /// coalescing replaced it in that sink's queue. Never for a sink that did not deliver
    /// it. Called from the sink's worker or a publisher, outside the queue's lock; must not
    /// block.
    fn settle(&self);

    /// The point of a write-ahead log that must be durable before any sink sends the change
    /// (the state journal of new keys, `state/journal.rs`); `None`: no condition.
    fn write_ahead(&self) -> Option<&WriteAhead> {
        None
    }
}

/// How far one write-ahead log is durable, shared by its writer (which publishes the durable
/// position) and the senders that wait for it (which say how far they need it, so the writer
/// can store at once on demand rather than on a timer).
#[derive(Debug)]
pub struct Durability {
    durable: tokio::sync::watch::Receiver<u64>,
    /// The highest position a sender waits for.
    wanted: AtomicU64,
    demand: tokio::sync::Notify,
}

impl Durability {
    /// The durability whose durable position `durable` publishes (the writer keeps the
    /// sender; dropping it releases every waiting sender).
    pub fn new(durable: tokio::sync::watch::Receiver<u64>) -> Arc<Self> {
        Arc::new(Durability {
            durable,
            wanted: AtomicU64::new(0),
            demand: tokio::sync::Notify::new(),
        })
    }

    /// The durable position.
    pub fn durable(&self) -> u64 {
        *self.durable.borrow()
    }

    /// The highest position a sender has waited for.
    pub fn wanted(&self) -> u64 {
        self.wanted.load(Ordering::Acquire)
    }

    /// Resolves when a sender starts waiting for a position (or already did since the last
    /// call): the writer's cue to store what it holds.
    pub async fn demanded(&self) {
        self.demand.notified().await
    }
}

/// A position in a write-ahead log: a change carrying it is sent only once the log is
/// durable up to it (group commit: the worker waits once per batch, for the highest
/// position in it). Positions of one log grow with every record; a coalesced change is
/// replaced by a newer one, whose position is not lower.
#[derive(Clone, Debug)]
pub struct WriteAhead {
    log: Arc<Durability>,
    position: u64,
}

impl WriteAhead {
    /// Position `position` of the log `log`.
    pub fn new(log: Arc<Durability>, position: u64) -> Self {
        WriteAhead { log, position }
    }

    /// The position.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Whether the log is durable up to this position.
    pub fn is_durable(&self) -> bool {
        self.log.durable() >= self.position
    }

    /// Waits until the log is durable up to this position, telling its writer it is wanted.
    /// Returns `false` when the log closed first (its writer stopped): the caller then sends
    /// without the guarantee, which only a writer that died unexpectedly can cause (at
    /// shutdown the log outlives the pipeline).
    pub async fn wait(&self) -> bool {
        let mut rx = self.log.durable.clone();
        if *rx.borrow_and_update() >= self.position {
            return true;
        }
        self.log.wanted.fetch_max(self.position, Ordering::AcqRel);
        self.log.demand.notify_one();
        // Bound first: the `Ref` the wait returns borrows `rx` and must be dropped before it.
        let durable = rx.wait_for(|d| *d >= self.position).await.is_ok();
        durable
    }

    /// Whether `other` is a position of the same log.
    pub(super) fn same_log(&self, other: &WriteAhead) -> bool {
        Arc::ptr_eq(&self.log, &other.log)
    }
}

/// The acknowledgement handle a change carries through the queues: one reference-counted
/// object per change, shared by every sink's copy.
pub type Ack = Arc<dyn Settle>;

/// Counters and health of one sink's worker.
#[derive(Debug)]
pub struct SinkStats {
    /// Messages the sink confirmed.
    pub delivered: AtomicU64,
    /// Batches confirmed.
    pub batches: AtomicU64,
    /// Failed `send` calls (each followed by a retry), all kinds.
    pub errors: AtomicU64,
    /// Failed sends by kind: transient, partial, too large, fatal.
    pub errors_by_kind: [AtomicU64; 4],
    /// Messages sent again after a failure.
    pub retried: AtomicU64,
    /// Microseconds batches waited for their write-ahead positions (the state journal).
    pub write_ahead_wait_us: AtomicU64,
    /// A batch waits for the state journal now.
    pub waiting_for_journal: AtomicBool,
    /// Messages reduced by the oversize policy.
    pub truncated: AtomicU64,
    /// Messages whose send was abandoned because the leadership fence closed during it.
    pub abandoned: AtomicU64,
    /// Messages per confirmed batch.
    pub batch_size: Histogram,
    /// Duration of each `send` call, in seconds (failed ones included).
    pub send_seconds: Histogram,
    /// Since when sends have been failing (not failing: the last one succeeded).
    failing: Streak,
    /// The last healthcheck passed (updated by the bridge's probe).
    pub healthy: AtomicBool,
    /// Why the last healthcheck or send failed, while it does.
    problem: Problem,
    /// The worker's panic message, once it panicked (it delivers nothing more).
    panic: Problem,
}

/// Names of [`SinkStats::errors_by_kind`], in order.
pub const ERROR_KINDS: [&str; 4] = ["transient", "partial", "too_large", "fatal"];

impl Default for SinkStats {
    fn default() -> Self {
        SinkStats {
            delivered: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            errors_by_kind: Default::default(),
            retried: AtomicU64::new(0),
            write_ahead_wait_us: AtomicU64::new(0),
            waiting_for_journal: AtomicBool::new(false),
            truncated: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            // 1 .. 4096 messages.
            batch_size: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                1.0, 4.0, 7,
            )),
            // 1 ms .. ~65 s.
            send_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.001, 4.0, 9),
            ),
            failing: Streak::default(),
            healthy: AtomicBool::new(false),
            problem: Problem::default(),
            panic: Problem::default(),
        }
    }
}

impl SinkStats {
    /// Records a failed send.
    pub fn note_error(&self, e: &SinkError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let kind = match e {
            SinkError::Transient { .. } => 0,
            SinkError::Partial { .. } => 1,
            SinkError::TooLarge { .. } => 2,
            SinkError::Fatal { .. } => 3,
        };
        self.errors_by_kind[kind].fetch_add(1, Ordering::Relaxed);
        self.failing.fail();
        self.problem.set(Some(e.to_string()));
    }

    /// Records a confirmed send.
    pub fn note_success(&self) {
        if self.failing.end().is_some() && self.healthy.load(Ordering::Relaxed) {
            self.problem.set(None);
        }
    }

    /// Records a healthcheck result.
    pub fn note_health(&self, result: Result<(), String>) {
        let ok = result.is_ok();
        self.healthy.store(ok, Ordering::Relaxed);
        if !ok || !self.failing.is_failing() {
            self.problem.set(result.err());
        }
    }

    /// Whether the sink is ready: its worker runs, its healthcheck passes and sends are not
    /// failing.
    pub fn ready(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
            && !self.failing.is_failing()
            && self.panicked().is_none()
    }

    /// What is wrong with the sink, if anything (a panicked worker first).
    pub fn problem(&self) -> Option<String> {
        if let Some(p) = self.panicked() {
            return Some(format!(
                "its worker panicked, nothing more is delivered to it until a restart: {p}"
            ));
        }
        self.problem.get()
    }

    /// The panic message of the sink's worker, once it panicked.
    pub fn panicked(&self) -> Option<String> {
        self.panic.get()
    }

    fn note_panic(&self, message: String) {
        self.panic.set(Some(message));
    }
}

/// One sink as the pipeline sees it: the sink, its queue and its counters. Cheap to clone.
#[derive(Clone)]
pub struct SinkHandle {
    sink: Arc<dyn Sink>,
    queue: Arc<SinkQueue>,
    stats: Arc<SinkStats>,
    ready: ReadySignal,
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

    /// Bytes held now (pending + in flight).
    pub fn held_bytes(&self) -> usize {
        self.queue.held_bytes()
    }

    /// Changes not sent because of coalescing (replaced while waiting, or cancelled pairs).
    pub fn coalesced(&self) -> usize {
        self.queue.coalesced()
    }
}

/// The handle informers publish through: the fan-out to every sink's queue. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    queues: Arc<[Arc<SinkQueue>]>,
}

impl Publisher {
    /// Queues `msg` for every sink, waiting while any queue is full (backpressure). Returns
    /// `false` when the pipeline is shutting down.
    pub async fn publish(&self, msg: Message) -> bool {
        self.publish_acked(msg, None, true).await
    }

    /// [`Publisher::publish`] with an acknowledgement: each sink settles `ack` once (see
    /// [`Settle`]), so it is settled [`Publisher::sinks`] times when every sink is done.
    /// `may_be_held` ([`kubesink_core::message::Change::may_be_held`]): an `added` that a
    /// destination may already hold, which no later `deleted` may cancel in a queue.
    pub async fn publish_acked(&self, msg: Message, ack: Option<Ack>, may_be_held: bool) -> bool {
        let mut all = true;
        for q in self.queues.iter() {
            all &= q.push_change(msg.clone(), ack.clone(), may_be_held).await;
        }
        all
    }

    /// The number of sinks a published change goes to.
    pub fn sinks(&self) -> usize {
        self.queues.len()
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
        };
        let retry = Backoff::new(
            config.retry_initial_backoff.get(),
            config.retry_max_backoff.get(),
        );
        let mut handles = Vec::with_capacity(sinks.len());
        let mut workers = Vec::with_capacity(sinks.len());
        for sink in sinks {
            let h = SinkHandle {
                ready: sink.ready_signal().unwrap_or_default(),
                sink,
                queue: Arc::new(SinkQueue::new(limits.clone())),
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
                    None if h.stats.waiting_for_journal.load(Ordering::Relaxed) => {
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
