//! [`SinkStats`]: the counters and health of one sink's worker (`/metrics`, `/readyz`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use kubesink_core::{Problem, SinkError, Streak};
use prometheus_client::metrics::histogram::Histogram;

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
    /// Since when a batch has been waiting for the state journal (`/readyz`).
    journal_wait: Streak,
    /// Batches waiting for the state journal now.
    journal_waiters: AtomicUsize,
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
            journal_wait: Streak::default(),
            journal_waiters: AtomicUsize::new(0),
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

    /// A batch begins waiting for the state journal to hold its new objects.
    pub fn journal_wait_begins(&self) {
        if self.journal_waiters.fetch_add(1, Ordering::Relaxed) == 0 {
            self.journal_wait.fail();
        }
    }

    /// A batch stops waiting for the state journal.
    pub fn journal_wait_ends(&self) {
        if self.journal_waiters.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.journal_wait.end();
        }
    }

    /// How long batches have been waiting for the state journal, while one does.
    pub fn waiting_for_journal(&self) -> Option<Duration> {
        self.journal_wait.failing_for()
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

    pub(super) fn note_panic(&self, message: String) {
        self.panic.set(Some(message));
    }
}
