//! The counters and health of one informer, written by its loop and decision step and read
//! by the bridge (readiness), the tests and the metrics exporter. Atomics only on the hot
//! path; the last failure's description behind a mutex, touched only when something fails.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Counters of one informer, readable while it runs.
#[derive(Debug, Default)]
pub struct InformerStats {
    /// Objects read from lists and watch events (not bookmarks).
    pub events_received: AtomicU64,
    /// Changes handed to encoding and the pipeline.
    pub emitted: AtomicU64,
    /// Events that changed nothing in the emitted payload.
    pub suppressed: AtomicU64,
    /// Deletes inferred after a relist or uid change.
    pub inferred_deletes: AtomicU64,
    /// Lists started (1 = initial sync only; more = relists or retried lists).
    pub lists: AtomicU64,
    /// Objects currently known.
    pub objects: AtomicU64,
    /// The first list has completed.
    pub synced: AtomicBool,
    /// Failures of any kind (each followed by a retry).
    pub errors: AtomicU64,
    /// Objects skipped because they could not be decoded or shaped.
    pub skipped: AtomicU64,
    /// List page requests sent.
    pub list_requests: AtomicU64,
    /// Watch requests sent.
    pub watch_requests: AtomicU64,
    /// 410 Gone / `Expired` answers (list continue tokens and watches).
    pub gone: AtomicU64,
    /// Watches re-established because nothing arrived within `watch.idle_timeout`.
    pub idle_restarts: AtomicU64,
    /// Watches that ended empty long before their `timeoutSeconds`.
    pub early_ends: AtomicU64,
    /// Responses or events that did not decode.
    pub decode_errors: AtomicU64,
    /// 401 and 403 answers.
    pub forbidden: AtomicU64,
    /// 404 answers.
    pub not_found: AtomicU64,
    /// 429 answers.
    pub throttled: AtomicU64,
    /// 5xx answers.
    pub server_errors: AtomicU64,
    /// Connection failures (refused, reset, TLS, too many open files).
    pub transport_errors: AtomicU64,
    /// Unix time in milliseconds of the last event or bookmark (0: none yet).
    pub last_event_ms: AtomicU64,
    /// Duration of the initial sync in milliseconds (0 until it completed).
    pub initial_sync_ms: AtomicU64,
    /// The failure the informer is recovering from, if any (cleared on success).
    last_failure: Mutex<Option<String>>,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl InformerStats {
    /// Records that an event or bookmark arrived now.
    pub fn note_event(&self) {
        self.last_event_ms
            .store(unix_ms(SystemTime::now()), Ordering::Relaxed);
    }

    /// Time since the last event or bookmark; `None` before the first.
    pub fn since_last_event(&self) -> Option<Duration> {
        match self.last_event_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(
                unix_ms(SystemTime::now()).saturating_sub(ms),
            )),
        }
    }

    /// Records the initial sync's duration.
    pub fn note_initial_sync(&self, took: Duration) {
        self.initial_sync_ms.store(
            u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Records the failure being recovered from.
    pub fn set_failure(&self, what: String) {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(what);
    }

    /// Clears the failure after a success.
    pub fn clear_failure(&self) {
        let mut f = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_some() {
            *f = None;
        }
    }

    /// The failure being recovered from, if any.
    pub fn failure(&self) -> Option<String> {
        self.last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
