//! Lightweight informers: one list/watch loop per [`WatchPlan`] (a resource in one namespace,
//! or in all), a decision step that keeps only keys and fingerprints, and the loop between
//! the API server and the pipeline. This file is [`Informer`], the list/watch state machine.
//! Its state and recovery tables, streaming lists, why kubesink owns this loop, and a map of
//! the module's files: `docs/architecture.md`, "Lightweight informer".
//!
//! It never keeps an object after emitting it, never restarts a watch from an older
//! resourceVersion than the last event or bookmark it processed, and never reads on while a
//! sink queue is full (backpressure: each emitted change is awaited into the pipeline).

mod api;
mod cel_values;
mod changes;
mod decide;
mod decode;
mod emit;
mod facts;
mod filter;
mod lists;
mod name;
mod object;
mod occurrence;
mod owners;
mod payload;
mod plan;
mod protobuf;
mod recovery;
mod stats;
mod store;
mod tracked;
mod watch;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use kubesink_core::backoff::Backoff;
use kubesink_core::shard::Shard;
use kubesink_core::Resource;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use api::ClusterApi;
pub use changes::{parse_path, ChangePaths};
pub use decide::{Decider, Event};
#[cfg(feature = "test-util")]
pub use decide::{InformerError, Phase};
#[cfg(feature = "test-util")]
pub use decode::{watch_line, DecodeError};
pub use facts::{Facts, Parts, Rv, Uid, PART_SLOTS};
pub use filter::{
    CompileError as FilterCompileError, Filter, Match as FilterMatch, Place as FilterPlace,
    Subject as FilterSubject,
};
pub use lists::ListBudget;
pub use object::{MinimalMeta, RawObject};
pub use owners::{
    index_resources, roles as owner_roles, with_index_resources, OwnerContext, OwnerIndex,
    Role as OwnerRole, WAIT as OWNERS_WAIT,
};
pub use plan::WatchPlan;
pub use stats::{FailureKind, InformerStats, SinkFilterStats, Strategy};
pub use store::LightStore;
#[cfg(test)] // the journal's tests record as the informer does
pub use tracked::record_new_key;
pub use tracked::{Acknowledged, JournalRef, NewKeys, TrackedStore};
// `fold --against-cluster` evaluates filters on what the informer would see.
pub use payload::Shaper;
// What only the benches and tests reach (`kubesink::testing`).
#[cfg(feature = "test-util")]
#[cfg(any(test, feature = "test-util"))]
// and the pipeline's model (`pipeline/model_tests.rs`)
pub use payload::{ShapeError, Shaped};
#[cfg(feature = "test-util")]
pub use store::{Entry as StoreEntry, Observed, Vanished};

use crate::config::{InitialList, WatchConfig};
use crate::pipeline::Publisher;
use decode::WatchLine;
use recovery::{Failed, Situation, Then, Wait, DECODE_RETRIES_BEFORE_RELIST};
use watch::{Lines, Requests, WatchFailure, WATCH_TIMEOUT_SECS};

/// With `watch.initial_list = "auto"`, a streaming list whose initial events end early (or
/// stay silent for [`INITIAL_EVENTS_SILENCE`]) before the end bookmark this many times in a
/// row falls back to paged lists: once is a cut connection, twice is a server that never
/// sends it.
pub const STREAM_CUTS_BEFORE_FALLBACK: u32 = 2;

/// The longest silence allowed between a streaming list's initial events (and before its
/// end bookmark) when `watch.idle_timeout` is longer. The API server sends the initial
/// events from its watch cache without pause, and the end bookmark at its next bookmark tick
/// (about a second later: `cacher.go`'s dispatch timer); a server that ignores
/// `sendInitialEvents` goes silent there for good. Only time spent waiting for the server
/// counts: while the pipeline applies backpressure the loop is not reading.
pub const INITIAL_EVENTS_SILENCE: Duration = Duration::from_secs(15);

/// Statuses that refuse a streaming list as a request the server does not take (rather than
/// an outage, a throttle or RBAC): 400 Bad Request, 405 Method Not Allowed, 415 Unsupported
/// Media Type, 422 Invalid (the `WatchList` feature gate off: "sendInitialEvents is forbidden
/// for watch unless the WatchList feature gate is enabled"), 501 Not Implemented.
const STREAM_REFUSALS: [u16; 5] = [400, 405, 415, 422, 501];

/// What the loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    /// List (initial sync or relist).
    List,
    /// Watch from this resourceVersion.
    Watch(String),
}

/// Whether a watch that lasted `elapsed` ended long before its `timeoutSeconds` (a watch
/// that ends at once without a line is not a watch that ran its course).
fn ended_early(elapsed: Duration) -> bool {
    elapsed < Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS / 2))
}

/// How a list or watch attempt ended.
enum Step {
    /// The list completed; watch from its resourceVersion.
    Listed(String),
    /// The watch ended cleanly after `lines` lines and `elapsed`.
    WatchEnded { lines: u64, elapsed: Duration },
    /// Something failed.
    Failed {
        failure: WatchFailure,
        /// During a list (else a watch).
        listing: bool,
    },
    /// The pipeline refuses changes: shutting down.
    Closed,
}

/// The retry delays of one informer: grow per consecutive failure, reset on success.
struct Retry {
    policy: Backoff,
    delays: Box<dyn Iterator<Item = Duration> + Send + Sync>,
}

impl Retry {
    fn new(policy: Backoff) -> Self {
        Retry {
            policy,
            delays: Box::new(policy.delays()),
        }
    }
    fn next(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.policy.max)
    }
    fn reset(&mut self) {
        self.delays = Box::new(self.policy.delays());
    }
}

/// One informer: a list/watch loop for one [`WatchPlan`].
pub struct Informer {
    resource: Arc<Resource>,
    scope: String,
    requests: Requests,
    /// One decider per route (`bridge/routes.rs`), never empty.
    views: Vec<View>,
    stats: Arc<InformerStats>,
    idle_timeout: Duration,
    retry: Retry,
    /// The resourceVersion of the last event or bookmark processed.
    last_rv: Option<String>,
    /// The resourceVersion where events failed to decode, and how many times in a row.
    decode_failures: Option<(String, u32)>,
    /// Early ends since the window started, for the rate in the log line.
    early_window: (Instant, u64),
    /// When an early end was last logged (`None`: not in this streak).
    early_logged: Option<Instant>,
    /// Repeated failures are logged once (see [`FailureLog`]).
    failure_log: FailureLog,
    /// The last relist was forced by a watch that answered 410 before delivering anything:
    /// the completed list does not reset the backoff (a server answering 410 to every watch
    /// would otherwise be relisted in a tight loop); the next watch event does.
    unproductive_relist: bool,
    /// Watch events and bookmarks processed since the last list completed.
    lines_since_list: u64,
    /// The line of the current watch that last failed to decode (1 = the first).
    decode_position: u64,
    /// `watch.initial_list`.
    initial_list: InitialList,
    /// Lists are streamed (`stream`, or `auto` while [`api::auto_shape`] says so and until
    /// it fell back).
    streaming: bool,
    /// `auto` chose its shape from the server's version (until then it streams).
    shape_chosen: bool,
    /// Streaming lists cut (or silent) before their end bookmark, in a row.
    stream_cuts: u32,
    /// The cluster's budget, counts and learned facts.
    api: Arc<ClusterApi>,
    /// The bound of the random delay before a relist that needs no backoff.
    relist_jitter: Duration,
    /// The process's budget of lists in flight: a list holds a slot while it is read.
    lists: Arc<ListBudget>,
    /// The shard this watch follows (`shard.rs`): objects outside it are dropped here, which
    /// only happens when the server ignored the `shardSelector` (the client-side fallback).
    shard: Option<Shard>,
    /// The fallback was logged (once per informer).
    shard_fallback_logged: bool,
    /// The span of its log lines, `informer{cluster, resource, scope, strategy}`: made anew
    /// when the strategy changes (recording a field twice would print it twice).
    span: tracing::Span,
}

/// How often a failure that keeps repeating is logged again at WARN (with its count).
const FAILURE_REMINDER: Duration = Duration::from_secs(60);

/// Repeated failures logged once: the first of a streak at WARN, the same failure again at
/// DEBUG, and a WARN reminder with the count at most every [`FAILURE_REMINDER`]. A different
/// failure, or a success, starts a new streak.
struct FailureLog {
    signature: Option<String>,
    repeats: u64,
    last_warn: Instant,
}

impl FailureLog {
    fn new() -> Self {
        FailureLog {
            signature: None,
            repeats: 0,
            last_warn: Instant::now(),
        }
    }

    /// Counts a failure with `signature`; returns whether it goes out at WARN and how many
    /// times it repeated before.
    fn note(&mut self, signature: &str) -> (bool, u64) {
        if self.signature.as_deref() == Some(signature) {
            self.repeats += 1;
            let loud = self.last_warn.elapsed() >= FAILURE_REMINDER;
            if loud {
                self.last_warn = Instant::now();
            }
            return (loud, self.repeats);
        }
        self.signature = Some(signature.to_owned());
        self.repeats = 0;
        self.last_warn = Instant::now();
        (true, 0)
    }

    fn reset(&mut self) {
        self.signature = None;
    }
}

impl Informer {
    /// An informer following `plan` through `client`, with the `[watch]` settings, deciding
    /// with `views` (one decider per route, prepared by the bridge for the plan: restored state, acknowledgements,
    /// sync markers) and counting into `stats` (created before the plan existed: the bridge
    /// shows the watch while API discovery of its resource is still retried), within its
    /// cluster's `api` budget and the process's budget of lists in flight, `lists`.
    pub fn new(
        plan: WatchPlan,
        client: Client,
        watch: &WatchConfig,
        views: Vec<View>,
        stats: Arc<InformerStats>,
        api: Arc<ClusterApi>,
        lists: Arc<ListBudget>,
    ) -> Self {
        let scope = plan.scope();
        let shard = plan.shard;
        Informer {
            resource: plan.resource.clone(),
            requests: Requests::new(&plan, client, api.clone(), watch.encoding),
            scope,
            views,
            stats,
            idle_timeout: watch.idle_timeout.get(),
            retry: Retry::new(Backoff::new(
                watch.retry_initial_backoff.get(),
                watch.retry_max_backoff.get(),
            )),
            last_rv: None,
            decode_failures: None,
            early_window: (Instant::now(), 0),
            early_logged: None,
            failure_log: FailureLog::new(),
            unproductive_relist: false,
            lines_since_list: 0,
            decode_position: 0,
            initial_list: watch.initial_list,
            streaming: watch.initial_list != InitialList::List,
            shape_chosen: watch.initial_list != InitialList::Auto,
            stream_cuts: 0,
            api,
            relist_jitter: watch.retry_initial_backoff.get(),
            lists,
            span: tracing::Span::none(),
            shard,
            shard_fallback_logged: false,
        }
    }

    /// [`Informer::foreign`] for a list item that does not decode: by its name and namespace
    /// as far as they read; never when its name does not.
    fn foreign_key(&mut self, item: &str) -> bool {
        let meta = MinimalMeta::read(item).unwrap_or_default();
        meta.name.is_some() && self.foreign(meta.namespace.as_deref())
    }

    /// Whether an object in `namespace` is outside this watch's shard: then it is counted and
    /// dropped, as if the server had filtered it (it would have, with its
    /// `ShardedListAndWatch` gate on). The first such object is logged: the server ignores
    /// `shardSelector`, so each shard's watch reads every object of the resource.
    fn foreign(&mut self, namespace: Option<&str>) -> bool {
        let Some(shard) = self.shard else {
            return false;
        };
        if shard.holds(namespace) {
            return false;
        }
        self.stats.shard_foreign.fetch_add(1, Ordering::Relaxed);
        if !self.shard_fallback_logged {
            self.shard_fallback_logged = true;
            tracing::warn!(shard = %shard.selector(), "the API server answered an object outside this watch's shard: it ignores shardSelector (feature gate ShardedListAndWatch off), so kubesink keeps its shard itself (the client-side fallback: each shard's watch reads the whole resource; kubesink_shard_foreign_objects_total)");
        }
        true
    }

    /// The span of this informer's log lines, with `strategy` once chosen. A root span: made
    /// while another of its spans is current, it must not nest in it.
    fn make_span(&self, strategy: Option<Strategy>) -> tracing::Span {
        let span = match strategy {
            Some(s) => tracing::info_span!(
                parent: None,
                "informer",
                cluster = %self.resource.cluster,
                shard = tracing::field::Empty,
                resource = %self.resource,
                scope = %self.scope,
                strategy = s.as_str()
            ),
            None => tracing::info_span!(
                parent: None,
                "informer",
                cluster = %self.resource.cluster,
                shard = tracing::field::Empty,
                resource = %self.resource,
                scope = %self.scope
            ),
        };
        // With shards, which one: several of a cluster may run in one process.
        if let Some(shard) = self.shard {
            span.record("shard", tracing::field::display(shard));
        }
        span
    }

    /// Runs until `cancel` fires or the pipeline shuts down. Every log line inside carries
    /// the span `informer{cluster, shard (with shards), resource, scope}`.
    pub async fn run(mut self, cancel: CancellationToken) {
        self.run_inner(cancel).await
    }

    /// [`Informer::run`] borrowing the informer.
    async fn run_inner(&mut self, cancel: CancellationToken) {
        self.span = self.make_span(None);
        /// Clears `running` however the loop ends (a panic included).
        struct Running(Arc<InformerStats>);
        impl Drop for Running {
            fn drop(&mut self) {
                self.0.running.store(false, Ordering::Relaxed);
            }
        }
        self.stats.running.store(true, Ordering::Relaxed);
        self.stats.started.store(true, Ordering::Relaxed);
        let _running = Running(self.stats.clone());
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = self.run_loop() => {}
        }
        self.span.in_scope(|| tracing::debug!("informer stopped"));
    }

    /// [`Informer::run`], or, when `gone` fires first (its kind left the cluster: a
    /// group-form resource's CRD was deleted), ends as a list that found nothing would: every
    /// key its views hold is sent as `deleted` (an inferred delete), then it stops.
    pub async fn run_or_retire(
        mut self,
        cancel: CancellationToken,
        gone: Option<CancellationToken>,
    ) {
        let Some(gone) = gone else {
            return self.run(cancel).await;
        };
        let retire = {
            let stop = cancel.clone();
            let run = self.run_inner(stop);
            tokio::select! {
                biased;
                _ = gone.cancelled() => true,
                _ = run => false,
            }
        };
        if !retire || cancel.is_cancelled() {
            return;
        }
        self.span = self.make_span(None);
        let span = self.span.clone();
        let swept = async {
            self.decide(Event::ListStart).await?;
            self.decide(Event::ListDone { sweep: true }).await
        };
        let closed = tokio::select! {
            _ = cancel.cancelled() => true,
            r = swept.instrument(span.clone()) => r.is_err(),
        };
        span.in_scope(|| match closed {
            false => tracing::info!("its kind is no longer served: sent the deletes of the objects it held; informer stopped"),
            true => tracing::warn!("its kind is no longer served, but the deletes of the objects it held could not all be sent (shutting down): with [state], the next start sends them from its saved state (the kind stays in its entry's list of kinds until they are acknowledged); without, they are lost"),
        });
    }

    /// Lists and watches, each step in the span of the strategy of its time.
    async fn run_loop(&mut self) {
        let mut next = Next::List;
        loop {
            if matches!(next, Next::List) && !self.shape_chosen {
                let span = self.span.clone();
                self.choose_shape().instrument(span).await;
            }
            let stream =
                matches!(next, Next::List) && self.span.clone().in_scope(|| self.stream_now());
            let span = self.span.clone();
            let step = async {
                match &next {
                    Next::List if stream => self.stream_list().await,
                    Next::List => self.list().await,
                    Next::Watch(rv) => {
                        let rv = rv.clone();
                        self.watch(&rv).await
                    }
                }
            }
            .instrument(span)
            .await;
            if matches!(step, Step::Closed) {
                return;
            }
            let span = self.span.clone();
            let wait = span.in_scope(|| match step {
                Step::Closed => None,
                Step::Listed(rv) => {
                    self.listed();
                    next = Next::Watch(rv);
                    None
                }
                Step::WatchEnded { lines, elapsed } => {
                    if let Some(rv) = &self.last_rv {
                        next = Next::Watch(rv.clone());
                    }
                    if lines == 0 && ended_early(elapsed) {
                        Some(self.early_end(elapsed))
                    } else {
                        None
                    }
                }
                Step::Failed { failure, listing } => {
                    let (after, wait) = self.failed(failure, listing);
                    next = after;
                    wait
                }
            });
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// With `auto`, the list shape cheaper for the server ([`api::auto_shape`]), once the
    /// server's version is known (until then: streaming, with its fallback). Never streams
    /// again after a fallback.
    async fn choose_shape(&mut self) {
        let version = self.api.server_version(self.requests.client()).await;
        let (shape, why) = api::auto_shape(version);
        self.shape_chosen = version.is_some();
        if shape == Strategy::List && self.streaming {
            self.streaming = false;
            tracing::debug!(version = ?version.map(|v| v.to_string()), reason = why, "paged lists (watch.initial_list = \"auto\")");
        }
    }

    /// Whether the next list is a streaming list: with `auto`, not once this informer or
    /// another of its cluster found the resource's server without them.
    fn stream_now(&mut self) -> bool {
        if self.streaming && self.initial_list == InitialList::Auto {
            if let Some(why) = self.api.no_streaming(&self.resource.to_string()) {
                tracing::debug!(reason = %why, "the server does not stream lists of this resource (found by another watch); listing");
                self.fall_back();
            }
        }
        self.set_strategy(if self.streaming {
            Strategy::Stream
        } else {
            Strategy::List
        });
        self.streaming
    }

    /// Records how the informer reads its state: in its stats (the metric) and in its span
    /// (`strategy=stream|list` on every later log line of the watch, once: a new span).
    fn set_strategy(&mut self, s: Strategy) {
        if self.stats.strategy() != Some(s) {
            self.span = self.make_span(Some(s));
        }
        self.stats.set_strategy(s);
    }

    /// Paged lists from now on.
    fn fall_back(&mut self) {
        self.streaming = false;
        self.stats
            .initial_list_fallbacks
            .fetch_add(1, Ordering::Relaxed);
        self.set_strategy(Strategy::List);
    }

    /// With `auto`, whether `failure` of a streaming list's initial events shows a server
    /// without streaming lists: then it falls back (logged once per cluster and resource)
    /// and the paged list starts at once.
    fn falls_back(&mut self, failure: &WatchFailure) -> bool {
        if self.initial_list != InitialList::Auto {
            return false;
        }
        let reason = match failure {
            WatchFailure::NoStreaming(why) => why.clone(),
            // A selector the server rejects fails the paged list too: not a reason to
            // give streaming lists up, but the error to report (`failed`).
            WatchFailure::Api { status, .. }
                if self.requests.selector_rejected(status).is_some() =>
            {
                return false
            }
            WatchFailure::Api { status, .. } if STREAM_REFUSALS.contains(&status.code) => {
                format!("the server refuses it: {status}")
            }
            // The server's `timeoutSeconds` ended initial events that took that long (a
            // large list behind a slow sink): not a server without streaming lists.
            WatchFailure::InitialEventsCut { elapsed, .. }
                if *elapsed >= Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS / 2)) =>
            {
                return false
            }
            WatchFailure::InitialEventsCut { .. } | WatchFailure::Idle(_) => {
                self.stream_cuts += 1;
                if self.stream_cuts < STREAM_CUTS_BEFORE_FALLBACK {
                    return false;
                }
                format!(
                    "{failure} ({} times in a row: the server never sends the initial-events-end bookmark)",
                    self.stream_cuts
                )
            }
            _ => return false,
        };
        self.fall_back();
        if self
            .api
            .learn_no_streaming(&self.resource.to_string(), &reason)
        {
            tracing::info!(reason = %reason, "the API server does not serve streaming lists (KEP-3157, sendInitialEvents) of this resource; using paged lists for it in this cluster until restart (watch.initial_list = \"auto\")");
        } else {
            tracing::debug!(reason = %reason, "streaming list failed; using paged lists, as the other watches of this resource already do");
        }
        true
    }

    /// A list completed: the backoff and the failure streak start over, unless the list
    /// followed a 410 that came before any event.
    fn listed(&mut self) {
        if self.unproductive_relist {
            self.stats.clear_failure();
            self.failure_log.reset();
        } else {
            self.succeeded();
        }
    }

    /// A list completed or a watch delivered something: the backoff and the failure streak
    /// start over.
    fn succeeded(&mut self) {
        self.retry.reset();
        self.stats.clear_failure();
        self.failure_log.reset();
        self.unproductive_relist = false;
        self.early_logged = None;
        self.early_window = (Instant::now(), 0);
    }

    /// Logs a failure once per streak (see [`FailureLog`]): `signature` identifies "the same
    /// failure again".
    fn log_failure(&mut self, signature: &str, message: &str, retry_in: Duration) {
        let (loud, repeated) = self.failure_log.note(signature);
        if loud && repeated == 0 {
            tracing::warn!(retry_in = ?retry_in, "{message}");
        } else if loud {
            tracing::warn!(retry_in = ?retry_in, repeated, "{message} (still failing: {repeated} more times since the first)");
        } else {
            tracing::debug!(retry_in = ?retry_in, repeated, "{message}");
        }
    }

    /// An empty watch that ended early: counted, backed off, logged with its rate at most
    /// once a minute.
    fn early_end(&mut self, elapsed: Duration) -> Duration {
        self.stats.early_ends.fetch_add(1, Ordering::Relaxed);
        let wait = self.retry.next();
        let (since, n) = &mut self.early_window;
        *n += 1;
        if self
            .early_logged
            .is_none_or(|t| t.elapsed() >= FAILURE_REMINDER)
        {
            self.early_logged = Some(Instant::now());
            tracing::warn!(
                ended_after = ?elapsed,
                count = *n,
                window = ?since.elapsed(),
                retry_in = ?wait,
                "watch ended early without any event ({n} in the last {:.0?}; the watch asked for {WATCH_TIMEOUT_SECS}s); backing off",
                since.elapsed()
            );
            *since = Instant::now();
            *n = 0;
        }
        self.stats.set_failure(
            FailureKind::Broken,
            format!("watch ends early without events (after {elapsed:?})"),
        );
        wait
    }

    /// Logs and counts a failure; returns where to go next and how long to wait first. The
    /// decision is `recovery::recover`'s (a pure table, tested row by row); this method
    /// only gathers the situation, applies the backoff and logs.
    fn failed(&mut self, failure: WatchFailure, listing: bool) -> (Next, Option<Duration>) {
        let streaming = listing && self.streaming;
        if streaming && self.falls_back(&failure) {
            return (Next::List, None);
        }
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        // The same words for both strategies, so one grep finds every list failure;
        // `kubesink_watch_initial_list` says which one the watch uses.
        let what = match (listing, self.stats.synced.load(Ordering::Relaxed)) {
            (false, _) => "watch failed",
            (true, false) => "initial list failed",
            (true, true) => "relist failed",
        };
        let kind = match (&failure, failure.code()) {
            (_, Some(401 | 403)) => FailureKind::Forbidden,
            (_, Some(404)) => FailureKind::NotFound,
            (WatchFailure::Transport(_), _) => FailureKind::Unreachable,
            _ => FailureKind::Broken,
        };
        let rejected = match &failure {
            WatchFailure::Api { status, .. } => self.requests.selector_rejected(status),
            _ => None,
        };
        self.stats.set_failure(
            kind,
            format!(
                "{what}: {}",
                rejected
                    .as_ref()
                    .map_or_else(|| failure.to_string(), Clone::clone)
            ),
        );
        let at = self.last_rv.clone().unwrap_or_default();
        let failed = match &failure {
            WatchFailure::Gone(_) => Failed::Gone,
            WatchFailure::Idle(_) => Failed::Idle,
            WatchFailure::Decode(_) if listing => Failed::Decode { in_a_row: 1 },
            WatchFailure::Decode(_) => Failed::Decode {
                in_a_row: match &mut self.decode_failures {
                    Some((rv, n)) if *rv == at => {
                        *n += 1;
                        *n
                    }
                    other => {
                        *other = Some((at.clone(), 1));
                        1
                    }
                },
            },
            WatchFailure::Api { status, .. } => Failed::Status(status.code),
            WatchFailure::Transport(_) => Failed::Transport,
            WatchFailure::Request(_) => Failed::Request,
            WatchFailure::NoStreaming(_) | WatchFailure::InitialEventsCut { .. } => {
                Failed::Streaming
            }
        };
        let situation = Situation {
            listing,
            streaming,
            resume_point: self.last_rv.is_some(),
            delivered_since_list: self.lines_since_list > 0,
            unproductive_relist: self.unproductive_relist,
        };
        let rec = recovery::recover(situation, failed);
        if rec.unproductive {
            self.unproductive_relist = true;
        }
        let retry_after = match &failure {
            WatchFailure::Api { retry_after, .. } => *retry_after,
            _ => None,
        };
        let wait = match rec.wait {
            // A relist at once: after a random delay within `relist_jitter`, so that the
            // informers whose watches expired together (an etcd compaction) spread out.
            Wait::No if rec.then == Then::List => Some(Duration::from_nanos(fastrand::u64(
                0..=u64::try_from(self.relist_jitter.as_nanos()).unwrap_or(u64::MAX),
            ))),
            Wait::No => None,
            Wait::Backoff => Some(self.retry.next()),
            Wait::BackoffOrRetryAfter => {
                let backoff = self.retry.next();
                Some(retry_after.map_or(backoff, |r| r.max(backoff)))
            }
        };
        let next = match (rec.then, &self.last_rv) {
            (Then::Resume, Some(rv)) => Next::Watch(rv.clone()),
            _ => Next::List,
        };
        if next == Next::List {
            self.decode_failures = None;
        }
        self.log_recovery(&failure, what, listing, &next, wait);
        (next, wait)
    }

    /// Counts and logs a failure once its recovery is decided.
    fn log_recovery(
        &mut self,
        failure: &WatchFailure,
        what: &str,
        listing: bool,
        next: &Next,
        wait: Option<Duration>,
    ) {
        let retry_in = wait.unwrap_or_default();
        match failure {
            WatchFailure::Gone(_) => {
                self.stats.gone.fetch_add(1, Ordering::Relaxed);
                if listing {
                    tracing::info!("list continue token expired (410); restarting the list from its first page (no deletes are inferred from the part already read)");
                } else if wait.is_some() {
                    // The watch right after a list answered 410 before any event: relisting
                    // at once could loop as fast as the server answers.
                    self.log_failure(
                        "gone right after a list",
                        "resourceVersion expired (410 Gone) right after a list; relisting after a backoff",
                        retry_in,
                    );
                } else {
                    tracing::info!("resourceVersion expired (410 Gone); relisting");
                }
            }
            WatchFailure::Idle(d) => {
                self.stats.idle_restarts.fetch_add(1, Ordering::Relaxed);
                if listing && self.streaming {
                    self.log_failure(
                        "stream stalled",
                        &format!(
                            "{what}: no initial event and no end bookmark of the streaming list for {}; streaming again",
                            humantime::format_duration(*d)
                        ),
                        retry_in,
                    );
                } else if listing {
                    self.log_failure(
                        "list stalled",
                        &format!(
                            "{what}: no byte of the list arrived for {}; listing again",
                            humantime::format_duration(*d)
                        ),
                        retry_in,
                    );
                } else {
                    tracing::warn!(idle = ?d, "watch silent (no event or bookmark) for {}; re-establishing it", humantime::format_duration(*d));
                }
            }
            WatchFailure::Decode(e) => {
                self.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                let at = self.last_rv.clone().unwrap_or_default();
                if listing {
                    self.log_failure(
                        "list does not decode",
                        &format!("{what}: response does not decode: {e}"),
                        retry_in,
                    );
                } else if *next == Next::List && self.last_rv.is_none() {
                    tracing::warn!(error = %e, line = self.decode_position, retry_in = ?retry_in, "watch event does not decode and there is no resourceVersion to resume from; relisting");
                } else if *next == Next::List {
                    tracing::warn!(error = %e, line = self.decode_position, after_resource_version = %at, retry_in = ?retry_in, "watch event does not decode ({DECODE_RETRIES_BEFORE_RELIST} times after this resourceVersion); relisting");
                } else {
                    tracing::warn!(error = %e, line = self.decode_position, after_resource_version = %at, "watch event does not decode; watching again from the last good resourceVersion to replay it");
                }
            }
            WatchFailure::Api {
                status,
                retry_after,
            } => {
                // One streak per status, whether the watch or the list that follows meets it.
                let signature = format!("status {}", status.code);
                if let Some(rejected) = self.requests.selector_rejected(status) {
                    self.stats.other_errors.fetch_add(1, Ordering::Relaxed);
                    self.log_failure(
                        "selector rejected",
                        &format!("{what}: {rejected}; fix the resource's selector (`kubesink check --online` asks the API server); retrying"),
                        retry_in,
                    );
                    return;
                }
                match status.code {
                    401 | 403 => {
                        self.stats.forbidden.fetch_add(1, Ordering::Relaxed);
                        self.log_failure(&signature, &format!("{what}: {status}; not allowed (RBAC?): keeping the last known state, retrying"), retry_in);
                    }
                    404 => {
                        self.stats.not_found.fetch_add(1, Ordering::Relaxed);
                        self.log_failure(&signature, &format!("{what}: {status}; the resource is not served (CRD removed?): keeping the last known state, relisting when it is back"), retry_in);
                    }
                    429 | 500..=599 => {
                        let counter = if status.code == 429 {
                            &self.stats.throttled
                        } else {
                            &self.stats.server_errors
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        let obeyed = if retry_after.is_some_and(|r| r >= retry_in) {
                            " (as Retry-After asks)"
                        } else {
                            ""
                        };
                        self.log_failure(
                            &signature,
                            &format!("{what}: {status}; retrying{obeyed}"),
                            retry_in,
                        );
                    }
                    _ if !listing => {
                        // 400 and the like: the request itself is refused, most likely its
                        // resourceVersion (an object's opaque resourceVersion the server does
                        // not accept back). Asking again would fail forever: relist.
                        self.stats.other_errors.fetch_add(1, Ordering::Relaxed);
                        self.log_failure(
                            &signature,
                            &format!("{what}: {status}; the server refuses to watch from resourceVersion {:?}: relisting", self.last_rv.as_deref().unwrap_or("")),
                            retry_in,
                        );
                    }
                    _ => {
                        self.stats.other_errors.fetch_add(1, Ordering::Relaxed);
                        self.log_failure(
                            &signature,
                            &format!("{what}: {status}; retrying"),
                            retry_in,
                        );
                    }
                }
            }
            WatchFailure::Transport(cause) => {
                self.stats.transport_errors.fetch_add(1, Ordering::Relaxed);
                let message = match next {
                    Next::Watch(rv) => {
                        format!("{what}: {cause}; resuming from resourceVersion {rv:?}")
                    }
                    Next::List => format!("{what}: {cause}; retrying"),
                };
                self.log_failure(cause, &message, retry_in);
            }
            WatchFailure::Request(e) => {
                let message = format!("{what}: {e}");
                let (loud, _) = self.failure_log.note(&message);
                if loud {
                    tracing::error!(retry_in = ?retry_in, "{message}");
                }
            }
            WatchFailure::NoStreaming(_) | WatchFailure::InitialEventsCut { .. } => {
                self.stats.other_errors.fetch_add(1, Ordering::Relaxed);
                let tail = match self.initial_list {
                    InitialList::Stream => {
                        "; streaming again (watch.initial_list = \"stream\" never lists)"
                    }
                    _ => "; streaming again",
                };
                let signature = match failure {
                    WatchFailure::NoStreaming(_) => "no streaming list",
                    _ => "streaming list cut",
                };
                self.log_failure(signature, &format!("{what}: {failure}{tail}"), retry_in);
            }
        }
    }

    /// One complete list: pages until the last, then the sweep; the whole of it holds a slot
    /// of the list budget (given back on every way out).
    async fn list(&mut self) -> Step {
        let _slot = self.lists.acquire().await;
        if let Err(step) = self.decide(Event::ListStart).await {
            return step;
        }
        let mut continue_token: Option<String> = None;
        let mut sweep = true;
        loop {
            self.stats.list_requests.fetch_add(1, Ordering::Relaxed);
            let failed = |failure| Step::Failed {
                failure,
                listing: true,
            };
            // Each item is decided as soon as it has arrived: the page is never held whole.
            // A page that breaks off after some items fails like a page that failed to
            // arrive: the list is tried again (the items decided so far are of the same
            // consistent list, as the pages before a failed page are).
            let mut page = match self
                .requests
                .list_page_items(continue_token.as_deref(), self.idle_timeout)
                .await
            {
                Ok(p) => p,
                Err(failure) => return failed(failure),
            };
            let mut i = 0u64;
            loop {
                match page.next_item().await {
                    Ok(Some(item)) => {
                        if let Err(step) = self.decide_listed(i, item, &mut sweep).await {
                            return step;
                        }
                        i += 1;
                    }
                    Ok(None) => break,
                    Err(failure) => return failed(failure),
                }
            }
            let metadata = match page.metadata() {
                Ok(m) => m,
                Err(failure) => return failed(failure),
            };
            match metadata.next_page() {
                Some(token) => continue_token = Some(token.to_owned()),
                None => {
                    let rv = metadata.resource_version.clone().unwrap_or_default();
                    for v in &mut self.views {
                        v.decider.note_list_resource_version(&rv);
                    }
                    if let Err(step) = self.decide(Event::ListDone { sweep }).await {
                        return step;
                    }
                    self.stats.note_event();
                    self.last_rv = Some(rv.clone());
                    self.lines_since_list = 0;
                    return Step::Listed(rv);
                }
            }
        }
    }

    /// One streaming list: the initial events as listed objects, the end bookmark as the
    /// list's end, then the same watch read on (see "Streaming lists" above). The initial
    /// events hold a slot of the list budget, the watch after the end bookmark none.
    async fn stream_list(&mut self) -> Step {
        let slot = self.lists.acquire().await;
        if let Err(step) = self.decide(Event::ListStart).await {
            return step;
        }
        self.stats.watch_requests.fetch_add(1, Ordering::Relaxed);
        self.stats.initial_streams.fetch_add(1, Ordering::Relaxed);
        let failed = |failure| Step::Failed {
            failure,
            listing: true,
        };
        let started = Instant::now();
        let silence = self.idle_timeout.min(INITIAL_EVENTS_SILENCE);
        // Another watch of the resource may learn, while this one waits for its turn in the
        // cluster's budget, that the server does not stream lists: then it lists without
        // sending the request.
        let (api, resource, auto) = (
            &self.api,
            &self.resource,
            self.initial_list == InitialList::Auto,
        );
        let still_wanted = || match api.no_streaming(&resource.to_string()) {
            Some(why) if auto => Err(format!("found by another watch of this resource: {why}")),
            _ => Ok(()),
        };
        let mut lines = match self.requests.stream(silence, still_wanted).await {
            Ok(l) => l,
            Err(f) => return failed(f),
        };
        let mut events = 0u64;
        let mut sweep = true;
        loop {
            let line = match lines.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    return failed(WatchFailure::InitialEventsCut {
                        events,
                        elapsed: started.elapsed(),
                    })
                }
                Err(f) => return failed(f),
            };
            let decoded = match decode::watch_line(&line) {
                Ok(d) => d,
                Err(e) => return failed(WatchFailure::Decode(e)),
            };
            let raw = match decoded {
                WatchLine::Added(raw) => raw,
                WatchLine::Bookmark {
                    resource_version,
                    initial_events_end: true,
                } => {
                    self.stats.bookmarks.fetch_add(1, Ordering::Relaxed);
                    for v in &mut self.views {
                        v.decider.note_list_resource_version(&resource_version);
                    }
                    if let Err(step) = self.decide(Event::ListDone { sweep }).await {
                        return step;
                    }
                    self.stats.note_event();
                    if !resource_version.is_empty() {
                        self.last_rv = Some(resource_version);
                    }
                    self.lines_since_list = 0;
                    self.stream_cuts = 0;
                    self.listed();
                    // The list is read: its slot goes to the next list before the watch.
                    drop(slot);
                    // The same connection goes on as the watch from the bookmark; the
                    // server's timeoutSeconds counts from the request.
                    lines.set_idle_timeout(self.idle_timeout);
                    return self.read_watch(lines, started).await;
                }
                // The API server sends a watch with sendInitialEvents no bookmark before the
                // one that ends its initial events (the cacher holds them back until then):
                // a plain one means the parameter was ignored, whatever the mode.
                WatchLine::Bookmark { .. } => {
                    return failed(WatchFailure::NoStreaming(format!(
                        "a BOOKMARK without the {} annotation came after {events} initial events, before the end bookmark: the server ignores sendInitialEvents",
                        decode::INITIAL_EVENTS_END
                    )))
                }
                WatchLine::Modified(_) | WatchLine::Deleted(_) => {
                    let kind = if matches!(decoded, WatchLine::Modified(_)) {
                        "MODIFIED"
                    } else {
                        "DELETED"
                    };
                    return failed(WatchFailure::NoStreaming(format!(
                        "a {kind} event came after {events} initial events, before the initial-events-end bookmark: the server ignores sendInitialEvents"
                    )));
                }
                WatchLine::Error(status) => return failed(WatchFailure::from_error_event(status)),
            };
            events += 1;
            if let Err(step) = self.decide_listed(events, raw.get(), &mut sweep).await {
                return step;
            }
        }
    }

    /// One object of a list (an item of a page, or an initial event of a streaming list, at
    /// position `index`) decided as `Listed`. One that does not decode keeps its key from the
    /// sweep; one without even a name turns the list's sweep off (`sweep`).
    async fn decide_listed(
        &mut self,
        index: u64,
        item: &str,
        sweep: &mut bool,
    ) -> Result<(), Step> {
        let event = match RawObject::parse(item) {
            Ok(obj) if self.foreign(obj.namespace()) => return Ok(()),
            Ok(obj) => Event::Listed(obj),
            // An unreadable item is another shard's only when its key is readable: one
            // without even a name turns the sweep off below, whichever shard it is of.
            Err(_) if self.foreign_key(item) => return Ok(()),
            Err(e) => match self.unreadable_item(index, item, &e) {
                Some(event) => event,
                None => {
                    *sweep = false;
                    return Ok(());
                }
            },
        };
        self.decide(event).await
    }

    /// A list item (at position `index` of its page or stream) that does not decode: logged and counted;
    /// the event that keeps its key from the sweep, or `None` when even its name is
    /// unreadable (then nothing may be swept).
    fn unreadable_item(
        &self,
        index: u64,
        item: &str,
        error: &dyn std::fmt::Display,
    ) -> Option<Event<'static>> {
        let meta = MinimalMeta::read(item).unwrap_or_default();
        tracing::warn!(item = index, name = ?meta.name, namespace = ?meta.namespace, error = %error, excerpt = %decode::excerpt(item.as_bytes()), "list item does not decode; skipped");
        self.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
        match meta.name {
            Some(name) => Some(Event::ListedUnreadable {
                namespace: meta.namespace,
                name,
            }),
            None => {
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// One watch request, read until it ends or fails.
    async fn watch(&mut self, rv: &str) -> Step {
        self.stats.watch_requests.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let step = match self.requests.watch(rv, self.idle_timeout).await {
            Ok(lines) => self.read_watch(lines, started).await,
            Err(failure) => Step::Failed {
                failure,
                listing: false,
            },
        };
        match step {
            Step::WatchEnded { lines: 0, elapsed } if ended_early(elapsed) => {
                self.after_empty_end(rv, step).await
            }
            step => step,
        }
    }

    /// A watch from `rv` that `ended` at once without a line. For a resource outside the
    /// watch cache (Events: kube-apiserver's default `--watch-cache-sizes` gives them none) a
    /// watch from a resourceVersion etcd compacted away is answered 200 and closed, with no
    /// 410 (kubernetes/kubernetes#104171, #137089): resumed from it again it would end again,
    /// for ever. So the server is asked, with a one-item list at exactly `rv`
    /// (`resourceVersionMatch=Exact`, which it answers 410 Gone when it no longer holds
    /// it): Gone is the watch's 410 (a relist); anything else leaves `ended` to the early
    /// end's backoff.
    async fn after_empty_end(&mut self, rv: &str, ended: Step) -> Step {
        // Not one of the list's pages (`list_requests`): counted with the API requests
        // (`kubesink_api_requests_total{verb="list"}`), as the lookups of `leftSelector` are.
        match self.requests.holds(rv, self.idle_timeout).await {
            Err(WatchFailure::Gone(status)) => {
                self.stats.early_ends.fetch_add(1, Ordering::Relaxed);
                self.stats.early_ends_gone.fetch_add(1, Ordering::Relaxed);
                Step::Failed {
                    failure: WatchFailure::Gone(status),
                    listing: false,
                }
            }
            Ok(()) => ended,
            Err(failure) => {
                self.span.in_scope(|| tracing::debug!(resource_version = rv, error = %failure, "could not ask whether the server still holds the resourceVersion of a watch that ended early"));
                ended
            }
        }
    }

    /// A watch's event lines, read until it ends or fails; `started`: when it began.
    async fn read_watch(&mut self, mut lines: Lines, started: Instant) -> Step {
        let failed = |failure| Step::Failed {
            failure,
            listing: false,
        };
        let mut count = 0u64;
        loop {
            let line = match lines.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    return Step::WatchEnded {
                        lines: count,
                        elapsed: started.elapsed(),
                    }
                }
                Err(f) => return failed(f),
            };
            let arrived = lines.arrived();
            let decoded = match decode::watch_line(&line) {
                Ok(d) => d,
                Err(e) => {
                    self.decode_position = count + 1;
                    return failed(WatchFailure::Decode(e));
                }
            };
            let (raw, kind) = match decoded {
                WatchLine::Bookmark {
                    resource_version, ..
                } => {
                    self.stats.bookmarks.fetch_add(1, Ordering::Relaxed);
                    count += 1;
                    self.note_line(resource_version, count);
                    continue;
                }
                WatchLine::Error(status) => return failed(WatchFailure::from_error_event(status)),
                WatchLine::Added(raw) => (raw, &self.stats.added_events),
                WatchLine::Modified(raw) => (raw, &self.stats.modified_events),
                WatchLine::Deleted(raw) => (raw, &self.stats.deleted_events),
            };
            kind.fetch_add(1, Ordering::Relaxed);
            count += 1;
            let obj = match RawObject::parse(raw.get()) {
                Ok(o) => o,
                Err(e) => {
                    // The line is a well-formed event; its object breaks the conventions
                    // (`metadata` that is not an object, or nested deeper than serde_json's
                    // limit). Replaying it would fail the same way: skip that one object.
                    let meta = MinimalMeta::read(raw.get()).unwrap_or_default();
                    self.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                    self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(line = count, name = ?meta.name, namespace = ?meta.namespace, error = %e, excerpt = %decode::excerpt(raw.get().as_bytes()), "watch event's object does not decode; skipped");
                    continue;
                }
            };
            let rv = obj.resource_version().to_owned();
            if self.foreign(obj.namespace()) {
                self.note_line(rv, count);
                continue;
            }
            let event = if matches!(decoded, WatchLine::Deleted(_)) {
                // An object with a deletionTimestamp is being deleted for real (a Pod's
                // graceful deletion, pending finalizers): no request for it, so a storm of Pod
                // deletes costs no requests here.
                let there = match obj.is_being_deleted() {
                    true => None,
                    false => {
                        self.requests
                            .still_there(
                                obj.namespace(),
                                obj.name().unwrap_or_default(),
                                obj.uid(),
                                self.idle_timeout,
                            )
                            .await
                    }
                };
                if there == Some(true) {
                    self.stats.left_selector.fetch_add(1, Ordering::Relaxed);
                    Event::LeftSelector(obj)
                } else {
                    Event::Deleted(obj)
                }
            } else {
                Event::Applied(obj)
            };
            if let Err(step) = self.decide_arrived(event, Some(arrived)).await {
                return step;
            }
            self.note_line(rv, count);
        }
    }

    /// The `count`th event or bookmark of a watch was processed: it is the new resume point,
    /// and the first of a watch proves the list/watch cycle works (the backoff starts over).
    fn note_line(&mut self, rv: String, count: u64) {
        self.stats.note_event();
        if !rv.is_empty() {
            self.last_rv = Some(rv);
        }
        self.decode_failures = None;
        self.lines_since_list += 1;
        if count == 1 {
            self.succeeded();
        }
    }

    /// Applies one event in every view and publishes what each decides to its sinks;
    /// `Err(Step::Closed)` when the pipeline is shutting down.
    async fn decide(&mut self, event: Event<'_>) -> Result<(), Step> {
        self.decide_arrived(event, None).await
    }

    /// [`Informer::decide`] for a watch event that `arrived` then (`Lines::arrived`).
    async fn decide_arrived(
        &mut self,
        event: Event<'_>,
        arrived: Option<std::time::SystemTime>,
    ) -> Result<(), Step> {
        let Some((last, rest)) = self.views.split_last_mut() else {
            return Ok(());
        };
        for view in rest {
            view.decide(event.clone(), &self.resource, arrived).await?;
        }
        last.decide(event, &self.resource, arrived).await
    }
}

/// A decider and the sinks it serves (`bridge/routes.rs`): the sinks without a filter share
/// one view of a watch, each sink with a filter has its own.
pub struct View {
    decider: Decider,
    publisher: Publisher,
}

impl View {
    /// `decider`'s changes go to `publisher`'s sinks.
    pub fn new(decider: Decider, publisher: Publisher) -> Self {
        View { decider, publisher }
    }

    async fn decide(
        &mut self,
        event: Event<'_>,
        resource: &Arc<Resource>,
        arrived: Option<std::time::SystemTime>,
    ) -> Result<(), Step> {
        let changes = match self.decider.on_event(event) {
            Ok(changes) => changes,
            Err(e) => {
                tracing::warn!("{e}");
                return Ok(());
            }
        };
        // A view without sinks (an owner-index watch) only keeps its store and the index.
        if self.publisher.sinks() == 0 {
            return Ok(());
        }
        if emit::publish(
            &mut self.decider,
            resource,
            changes,
            &self.publisher,
            arrived,
        )
        .await
        {
            Ok(())
        } else {
            Err(Step::Closed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_streak_is_logged_loud_once_and_again_after_a_different_failure() {
        let mut log = FailureLog::new();
        assert_eq!(log.note("status 403"), (true, 0));
        assert_eq!(log.note("status 403"), (false, 1));
        assert_eq!(log.note("status 403"), (false, 2));
        assert_eq!(log.note("status 503"), (true, 0));
        log.reset();
        assert_eq!(log.note("status 503"), (true, 0));
        // A minute later the same streak is reminded of, with its count.
        if let Some(earlier) = Instant::now().checked_sub(FAILURE_REMINDER) {
            log.last_warn = earlier;
            assert_eq!(log.note("status 503"), (true, 1));
        }
    }
}
