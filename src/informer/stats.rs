//! The counters and health of one informer, written by its loop and decision step and read
//! by the bridge (readiness), the tests and the metrics exporter. Atomics only on the hot
//! path; the last failure's description behind a mutex, touched only when something fails.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use kubesink_core::clock::now_ms;
use kubesink_core::{Problem, Streak};

/// Counters of one informer, readable while it runs.
#[derive(Debug, Default)]
pub struct InformerStats {
    /// Objects read from lists.
    pub listed: AtomicU64,
    /// Watch ADDED events.
    pub added_events: AtomicU64,
    /// Watch MODIFIED events.
    pub modified_events: AtomicU64,
    /// Watch DELETED events.
    pub deleted_events: AtomicU64,
    /// Watch BOOKMARK events.
    pub bookmarks: AtomicU64,
    /// `added` changes emitted.
    pub emitted_added: AtomicU64,
    /// `updated` changes emitted.
    pub emitted_updated: AtomicU64,
    /// `deleted` changes emitted (watch deletes and inferred ones).
    pub emitted_deleted: AtomicU64,
    /// Events that changed nothing in the emitted payload.
    pub suppressed: AtomicU64,
    /// Updates not emitted whose payload differs from the one last sent in `ignore_changes`
    /// paths only (counted apart from `suppressed`; see `changes.rs`).
    pub ignored: AtomicU64,
    /// Events mode: Events a first start's list found whose last occurrence is older than
    /// `since`: recorded (their later occurrences are sent), not sent.
    pub events_before_since: AtomicU64,
    /// Events mode: deletions of Events (their TTL) not sent (no `send_deleted`).
    pub events_deletes_unsent: AtomicU64,
    /// Watch events dropped because their resourceVersion is older than the one already
    /// held for the key (a replay: see `decide.rs`).
    pub stale_events: AtomicU64,
    /// Deletes inferred after a relist or uid change.
    pub inferred_deletes: AtomicU64,
    /// Watch DELETEDs of objects found still in the cluster: they left the selector.
    pub left_selector: AtomicU64,
    /// Objects (listed or watched) outside the watch's shard, dropped by kubesink itself: the
    /// API server ignored the `shardSelector` (its `ShardedListAndWatch` gate is off), so the
    /// client-side fallback keeps the shard exact (`shard.rs`). Always 0 without shards, and
    /// with a server that serves sharded lists.
    pub shard_foreign: AtomicU64,
    /// Objects (listed or watched) the resource's filter did not match: not followed.
    pub filtered_out: AtomicU64,
    /// Objects that stopped matching the resource's filter: sent as `deleted` with
    /// `reason: leftFilter`.
    pub left_filter: AtomicU64,
    /// Evaluations of the resource's filter that failed or gave no bool (each a no match).
    pub filter_errors: AtomicU64,
    /// Lists started (1 = initial sync only; more = relists or retried lists).
    pub lists: AtomicU64,
    /// Objects currently known.
    pub objects: AtomicU64,
    /// The first list has completed.
    pub synced: AtomicBool,
    /// The informer's loop is running (false before it starts and after it stopped).
    pub running: AtomicBool,
    /// The informer's loop has started once.
    pub started: AtomicBool,
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
    /// Of `early_ends`, those whose resourceVersion the server no longer holds (a list at
    /// it answered 410 Gone): relisted. What a watch of Events from a compacted
    /// resourceVersion gets instead of 410 (kubernetes/kubernetes#104171).
    pub early_ends_gone: AtomicU64,
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
    /// Other error answers (400 Bad Request and the like; a watch relists after them).
    pub other_errors: AtomicU64,
    /// Failed API discovery attempts of this watch's resource (retried in the background
    /// while the other resources run).
    pub discovery_errors: AtomicU64,
    /// Connection failures (refused, reset, TLS, too many open files).
    pub transport_errors: AtomicU64,
    /// Unix time in milliseconds of the last event or bookmark (0: none yet).
    pub last_event_ms: AtomicU64,
    /// Duration of the initial sync in milliseconds (0 until it completed).
    pub initial_sync_ms: AtomicU64,
    /// Streaming lists started (KEP-3157: a watch with `sendInitialEvents=true`); each is
    /// counted in `watch_requests` too.
    pub initial_streams: AtomicU64,
    /// Falls back from a streaming list to paged lists (`watch.initial_list = "auto"`; at
    /// most one per informer).
    pub initial_list_fallbacks: AtomicU64,
    /// How the informer reads its state now ([`Strategy`] as a number; 0 before its
    /// first list).
    strategy: AtomicU8,
    /// Since when the informer has been failing.
    failing: Streak,
    /// The kind of the current failure ([`FailureKind`] as a number).
    failure_kind: AtomicU8,
    /// The failure the informer is recovering from, if any (cleared on success).
    last_failure: Problem,
}

/// What kind of failure an informer is recovering from: the health rules treat a refusal
/// by the API server (which a restart cannot cure) apart from a broken watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// 401 or 403: not allowed (RBAC).
    Forbidden,
    /// 404: the resource is not served (a CRD removed).
    NotFound,
    /// The API server cannot be reached (connection refused, DNS, timeouts).
    Unreachable,
    /// Anything else: server errors, undecodable responses, dead watches.
    Broken,
}

/// How an informer reads the state it starts from (`watch.initial_list`, once `auto` chose).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// A streaming list (KEP-3157).
    Stream = 1,
    /// Paged LISTs.
    List = 2,
}

impl Strategy {
    /// `stream` or `list`, as the metric's label says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Stream => "stream",
            Strategy::List => "list",
        }
    }
}

impl InformerStats {
    /// Records how the informer reads its state from now on.
    pub fn set_strategy(&self, s: Strategy) {
        self.strategy.store(s as u8, Ordering::Relaxed);
    }

    /// How the informer reads its state; `None` before its first list.
    pub fn strategy(&self) -> Option<Strategy> {
        match self.strategy.load(Ordering::Relaxed) {
            1 => Some(Strategy::Stream),
            2 => Some(Strategy::List),
            _ => None,
        }
    }

    /// Records that an event or bookmark arrived now.
    pub fn note_event(&self) {
        self.last_event_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Time since the last event or bookmark; `None` before the first.
    pub fn since_last_event(&self) -> Option<Duration> {
        match self.last_event_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(now_ms().saturating_sub(ms))),
        }
    }

    /// Records the initial sync's duration.
    pub fn note_initial_sync(&self, took: Duration) {
        self.initial_sync_ms.store(
            u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// All changes emitted.
    pub fn emitted(&self) -> u64 {
        self.emitted_added.load(Ordering::Relaxed)
            + self.emitted_updated.load(Ordering::Relaxed)
            + self.emitted_deleted.load(Ordering::Relaxed)
    }

    /// Objects and events read (lists and watch events, bookmarks excluded).
    pub fn received(&self) -> u64 {
        self.listed.load(Ordering::Relaxed)
            + self.added_events.load(Ordering::Relaxed)
            + self.modified_events.load(Ordering::Relaxed)
            + self.deleted_events.load(Ordering::Relaxed)
    }

    /// Records the failure being recovered from (the first one of a streak sets the start).
    pub fn set_failure(&self, kind: FailureKind, what: String) {
        self.failing.fail();
        self.failure_kind.store(kind as u8, Ordering::Relaxed);
        self.last_failure.set(Some(what));
    }

    /// Clears the failure after a success.
    pub fn clear_failure(&self) {
        if self.failing.end().is_some() {
            self.last_failure.set(None);
        }
    }

    /// How long the current failure streak has lasted, and its kind; `None` when healthy.
    pub fn failing_for(&self) -> Option<(Duration, FailureKind)> {
        let failing_for = self.failing.failing_for()?;
        let kind = match self.failure_kind.load(Ordering::Relaxed) {
            k if k == FailureKind::Forbidden as u8 => FailureKind::Forbidden,
            k if k == FailureKind::NotFound as u8 => FailureKind::NotFound,
            k if k == FailureKind::Unreachable as u8 => FailureKind::Unreachable,
            _ => FailureKind::Broken,
        };
        Some((failing_for, kind))
    }

    /// The failure being recovered from, if any.
    pub fn failure(&self) -> Option<String> {
        self.last_failure.get()
    }
}

/// What a sink's `filter` did (`[[sinks]] filter`, `bridge/routes.rs`), summed over the
/// sink's views (one per watch): shown per sink (`kubesink_sink_filtered_out_total` and the
/// others), apart from the resources' filters' counts.
#[derive(Debug, Default)]
pub struct SinkFilterStats {
    /// Objects (or, for a change filter, changes) it did not match.
    pub filtered_out: AtomicU64,
    /// Objects that stopped matching it: sent to the sink as `deleted` (`leftFilter`).
    pub left_filter: AtomicU64,
    /// Evaluations that failed or gave no bool (each a no match).
    pub errors: AtomicU64,
}
