//! Lightweight informers: one list/watch loop per [`WatchPlan`] (a resource in one namespace,
//! or in all), a decision step that keeps only keys and fingerprints, and the loop between
//! the API server and the pipeline.
//!
//! - `plan.rs`: [`WatchPlan`], configuration and discovery resolved into one plan per watch.
//! - `watch.rs`: the list-page and watch requests, event lines, failures classified.
//! - `decode.rs`: list pages, watch event lines and `Status` as the API server sends them.
//! - `object.rs`: [`RawObject`](object::RawObject), one-pass decoding of an object.
//! - `payload.rs`: [`Shaper`] (payload modes, Secret data, cluster label) → JSON + fingerprint.
//! - `decide.rs`: [`Decider`], the synchronous decision step and its semantics table.
//! - `store.rs`: [`LightStore`], key, uid, resourceVersion and fingerprint per object.
//! - `stats.rs`: [`InformerStats`], counters and health.
//! - this file: [`Informer`], the list/watch state machine.
//!
//! # The list/watch loop
//!
//! It follows the API concepts' "efficient detection of changes"
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>)
//! the way kube-runtime's `watcher` does, with two states, [`Next::List`] and
//! [`Next::Watch`] (from a resourceVersion):
//!
//! | outcome | next | wait |
//! |---|---|---|
//! | list complete | watch from the list's resourceVersion | — (backoff reset) |
//! | watch delivered events, then ended | watch from the last resourceVersion | — (backoff reset) |
//! | watch ended empty before half its `timeoutSeconds` | the same watch | backoff, counted; a WARN with the rate, at most once a minute |
//! | 410 Gone / `Expired` (watch, `ERROR` event, or a list's continue token) | relist | — (info: expected) |
//! | nothing for `watch.idle_timeout` (dead connection) | watch from the last resourceVersion | — |
//! | an event that does not decode | watch from the last good resourceVersion (it replays the event); relist after 3 in a row at one resourceVersion | backoff from the second |
//! | 401 / 403 (RBAC revoked) | the same request | backoff to the cap; the store is kept, no deletes inferred |
//! | 404 (the CRD is gone) | relist (when it is back, the sweep emits the differences) | backoff |
//! | 429 / 5xx | the same request | `Retry-After` if longer than the backoff |
//! | connection failure | the same request | backoff |
//!
//! kubesink owns this loop instead of using kube-runtime's `watcher` because that watcher
//! re-watches at once when a stream ends without error (an empty 200 gets ~30,000 requests a
//! second), resets its backoff on every list attempt, drops undecodable lines and continues
//! past the change they carried, and decodes with `DynamicObject`, which builds every object
//! twice. Here every failure is classified, counted in [`InformerStats`], logged once with the
//! informer's span (cluster, resource, scope), and backed off.
//!
//! Backpressure: each emitted change is awaited into the pipeline; while a sink queue is
//! full this loop stops reading, so the HTTP body is not read.
//!
//! This module never keeps an object after emitting it.

mod decide;
mod decode;
mod object;
mod payload;
mod plan;
mod stats;
mod store;
mod watch;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use kubesink_sinks::backoff::Backoff;
use kubesink_sinks::message::{encode, now_rfc3339, Change};
use kubesink_sinks::Resource;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use decide::{Decider, Event, InformerError, Phase};
#[cfg(feature = "test-util")]
pub use decode::{watch_line, DecodeError};
pub use object::{MinimalMeta, RawObject};
pub use payload::{ShapeError, Shaped, Shaper};
pub use plan::WatchPlan;
pub use stats::{FailureKind, InformerStats};
pub use store::{Entry as StoreEntry, LightStore, Observed, Vanished};

use crate::config::WatchConfig;
use crate::pipeline::Publisher;
use decode::WatchLine;
use watch::{Failure, Requests, WATCH_TIMEOUT_SECS};

/// After this many undecodable events in a row at one resourceVersion, relist instead of
/// re-watching.
const DECODE_RETRIES_BEFORE_RELIST: u32 = 3;

/// What the loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    /// List (initial sync or relist).
    List,
    /// Watch from this resourceVersion.
    Watch(String),
}

/// How a list or watch attempt ended.
enum Step {
    /// The list completed; watch from its resourceVersion.
    Listed(String),
    /// The watch ended cleanly after `lines` lines and `elapsed`.
    WatchEnded { lines: u64, elapsed: Duration },
    /// Something failed.
    Failed {
        failure: Failure,
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
    decider: Decider,
    stats: Arc<InformerStats>,
    idle_timeout: Duration,
    retry: Retry,
    /// The resourceVersion of the last event or bookmark processed.
    last_rv: Option<String>,
    /// The resourceVersion where events failed to decode, and how many times in a row.
    decode_failures: Option<(String, u32)>,
    /// Early ends since the window started, for the rate in the log line.
    early_window: (Instant, u64),
}

impl Informer {
    /// An informer following `plan` through `client`, with the `[watch]` settings.
    pub fn new(plan: WatchPlan, client: Client, watch: &WatchConfig) -> Self {
        let scope = plan.scope();
        let decider = Decider::new(
            plan.resource.clone(),
            scope.clone(),
            plan.shaper.clone(),
            plan.updates,
        );
        let stats = decider.stats();
        Informer {
            resource: plan.resource.clone(),
            requests: Requests::new(&plan, client),
            scope,
            decider,
            stats,
            idle_timeout: watch.idle_timeout.get(),
            retry: Retry::new(Backoff::new(
                watch.retry_initial_backoff.get(),
                watch.retry_max_backoff.get(),
            )),
            last_rv: None,
            decode_failures: None,
            early_window: (Instant::now(), 0),
        }
    }

    /// This informer's counters.
    pub fn stats(&self) -> Arc<InformerStats> {
        self.stats.clone()
    }

    /// `apiVersion Kind (scope)`, for logs and diagnostics.
    pub fn label(&self) -> String {
        format!("{} ({})", self.resource, self.scope)
    }

    /// Runs until `cancel` fires or the pipeline shuts down. Every log line inside carries
    /// the span `informer{cluster, resource, scope}`.
    pub async fn run(mut self, publisher: Publisher, cancel: CancellationToken) {
        let span = tracing::info_span!(
            "informer",
            cluster = %self.resource.cluster,
            resource = %self.resource,
            scope = %self.scope
        );
        /// Clears `running` however the loop ends (a panic included).
        struct Running(Arc<InformerStats>);
        impl Drop for Running {
            fn drop(&mut self) {
                self.0.running.store(false, Ordering::Relaxed);
            }
        }
        self.stats.running.store(true, Ordering::Relaxed);
        let _running = Running(self.stats.clone());
        async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = self.run_loop(&publisher) => {}
            }
            tracing::debug!("informer stopped");
        }
        .instrument(span)
        .await;
    }

    async fn run_loop(&mut self, publisher: &Publisher) {
        let mut next = Next::List;
        loop {
            let step = match &next {
                Next::List => self.list(publisher).await,
                Next::Watch(rv) => {
                    let rv = rv.clone();
                    self.watch(&rv, publisher).await
                }
            };
            let wait = match step {
                Step::Closed => return,
                Step::Listed(rv) => {
                    self.succeeded();
                    next = Next::Watch(rv);
                    None
                }
                Step::WatchEnded { lines, elapsed } => {
                    if let Some(rv) = &self.last_rv {
                        next = Next::Watch(rv.clone());
                    }
                    if lines > 0 {
                        self.succeeded();
                        None
                    } else if elapsed < Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS / 2)) {
                        Some(self.early_end(elapsed))
                    } else {
                        None
                    }
                }
                Step::Failed { failure, listing } => {
                    let (after, wait) = self.failed(failure, listing);
                    next = after.unwrap_or(next);
                    wait
                }
            };
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
        }
    }

    fn succeeded(&mut self) {
        self.retry.reset();
        self.stats.clear_failure();
    }

    /// An empty watch that ended early: counted, backed off, logged with its rate at most
    /// once a minute.
    fn early_end(&mut self, elapsed: Duration) -> Duration {
        self.stats.early_ends.fetch_add(1, Ordering::Relaxed);
        let wait = self.retry.next();
        let (since, n) = &mut self.early_window;
        *n += 1;
        if *n == 1 || since.elapsed() >= Duration::from_secs(60) {
            tracing::warn!(
                ended_after = ?elapsed,
                count = *n,
                window = ?since.elapsed(),
                retry_in = ?wait,
                "watch ended early without events ({n} times in {:.0?}); backing off",
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

    /// Logs and counts a failure; returns where to go next (`None`: retry the same) and how
    /// long to wait first.
    fn failed(&mut self, failure: Failure, listing: bool) -> (Option<Next>, Option<Duration>) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        let what = if listing {
            "list failed"
        } else {
            "watch failed"
        };
        let kind = match failure.code() {
            Some(401 | 403) => FailureKind::Forbidden,
            Some(404) => FailureKind::NotFound,
            _ => FailureKind::Broken,
        };
        self.stats.set_failure(kind, format!("{what}: {failure}"));
        let resume = || self.last_rv.clone().map(Next::Watch);
        match failure {
            Failure::Gone(_) => {
                self.stats.gone.fetch_add(1, Ordering::Relaxed);
                if listing {
                    tracing::info!("list continue token expired (410); restarting the list");
                } else {
                    tracing::info!("resourceVersion expired (410 Gone); relisting");
                }
                (Some(Next::List), None)
            }
            Failure::Idle(d) => {
                self.stats.idle_restarts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(idle = ?d, "watch silent (no event or bookmark) for {}; re-establishing it", humantime::format_duration(d));
                (resume(), None)
            }
            Failure::Decode(e) => {
                self.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                if listing {
                    let wait = self.retry.next();
                    tracing::warn!(error = %e, retry_in = ?wait, "list failed: response does not decode");
                    return (Some(Next::List), Some(wait));
                }
                let at = self.last_rv.clone().unwrap_or_default();
                let count = match &mut self.decode_failures {
                    Some((rv, n)) if *rv == at => {
                        *n += 1;
                        *n
                    }
                    other => {
                        *other = Some((at.clone(), 1));
                        1
                    }
                };
                if count >= DECODE_RETRIES_BEFORE_RELIST || self.last_rv.is_none() {
                    self.decode_failures = None;
                    let wait = self.retry.next();
                    tracing::warn!(error = %e, resource_version = %at, retry_in = ?wait, "watch event does not decode ({count} times at this resourceVersion); relisting");
                    (Some(Next::List), Some(wait))
                } else {
                    let wait = (count > 1).then(|| self.retry.next());
                    tracing::warn!(error = %e, resource_version = %at, "watch event does not decode; watching again from the last good resourceVersion to replay it");
                    (resume(), wait)
                }
            }
            Failure::Api {
                status,
                retry_after,
            } => {
                let wait = self.retry.next();
                let wait = retry_after.map_or(wait, |r| r.max(wait));
                match status.code {
                    401 | 403 => {
                        self.stats.forbidden.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(status = status.code, retry_in = ?wait, "{what}: {status}; not allowed (RBAC?): keeping the last known state, retrying");
                        (None, Some(wait))
                    }
                    404 => {
                        self.stats.not_found.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(status = status.code, retry_in = ?wait, "{what}: {status}; the resource is not served (CRD removed?): keeping the last known state, relisting when it is back");
                        (Some(Next::List), Some(wait))
                    }
                    code => {
                        let counter = match code {
                            429 => &self.stats.throttled,
                            500..=599 => &self.stats.server_errors,
                            _ => &self.stats.errors,
                        };
                        if code == 429 || code >= 500 {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                        tracing::warn!(status = code, retry_in = ?wait, "{what}: {status}; retrying");
                        (None, Some(wait))
                    }
                }
            }
            Failure::Transport(cause) => {
                self.stats.transport_errors.fetch_add(1, Ordering::Relaxed);
                let wait = self.retry.next();
                tracing::warn!(retry_in = ?wait, "{what}: {cause}; retrying");
                (None, Some(wait))
            }
            Failure::Request(e) => {
                let wait = self.retry.next();
                tracing::error!(retry_in = ?wait, "{what}: {e}");
                (None, Some(wait))
            }
        }
    }

    /// One complete list: pages until the last, then the sweep.
    async fn list(&mut self, publisher: &Publisher) -> Step {
        if let Err(step) = self.decide(Event::ListStart, publisher).await {
            return step;
        }
        let mut continue_token: Option<String> = None;
        let mut sweep = true;
        loop {
            self.stats.list_requests.fetch_add(1, Ordering::Relaxed);
            let body = match self.requests.list_page(continue_token.as_deref()).await {
                Ok(b) => b,
                Err(failure) => {
                    return Step::Failed {
                        failure,
                        listing: true,
                    }
                }
            };
            let page = match decode::list_page(&body) {
                Ok(p) => p,
                Err(e) => {
                    return Step::Failed {
                        failure: Failure::Decode(e),
                        listing: true,
                    }
                }
            };
            for (i, item) in page.items.iter().enumerate() {
                let event = match RawObject::parse(item.get()) {
                    Ok(obj) => Event::Listed(obj),
                    Err(e) => {
                        let meta = MinimalMeta::read(item.get()).unwrap_or_default();
                        tracing::warn!(item = i, name = ?meta.name, namespace = ?meta.namespace, error = %e, excerpt = %decode::excerpt(item.get().as_bytes()), "list item does not decode; skipped");
                        self.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                        match meta.name {
                            Some(name) => Event::ListedUnreadable {
                                namespace: meta.namespace,
                                name,
                            },
                            None => {
                                sweep = false;
                                continue;
                            }
                        }
                    }
                };
                if let Err(step) = self.decide(event, publisher).await {
                    return step;
                }
            }
            match page.metadata.next_page() {
                Some(token) => continue_token = Some(token.to_owned()),
                None => {
                    let rv = page.metadata.resource_version.clone().unwrap_or_default();
                    if let Err(step) = self.decide(Event::ListDone { sweep }, publisher).await {
                        return step;
                    }
                    self.stats.note_event();
                    self.last_rv = Some(rv.clone());
                    return Step::Listed(rv);
                }
            }
        }
    }

    /// One watch request, read until it ends or fails.
    async fn watch(&mut self, rv: &str, publisher: &Publisher) -> Step {
        self.stats.watch_requests.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let failed = |failure| Step::Failed {
            failure,
            listing: false,
        };
        let mut lines = match self.requests.watch(rv, self.idle_timeout).await {
            Ok(l) => l,
            Err(f) => return failed(f),
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
            let decoded = match decode::watch_line(&line) {
                Ok(d) => d,
                Err(e) => return failed(Failure::Decode(e)),
            };
            let (raw, kind) = match decoded {
                WatchLine::Bookmark { resource_version } => {
                    self.stats.bookmarks.fetch_add(1, Ordering::Relaxed);
                    self.note_line(resource_version);
                    count += 1;
                    continue;
                }
                WatchLine::Error(status) if status.code == 410 => {
                    return failed(Failure::Gone(status))
                }
                WatchLine::Error(status) => {
                    return failed(Failure::Api {
                        status,
                        retry_after: None,
                    })
                }
                WatchLine::Added(raw) => (raw, &self.stats.added_events),
                WatchLine::Modified(raw) => (raw, &self.stats.modified_events),
                WatchLine::Deleted(raw) => (raw, &self.stats.deleted_events),
            };
            kind.fetch_add(1, Ordering::Relaxed);
            let obj = match RawObject::parse(raw.get()) {
                Ok(o) => o,
                Err(e) => {
                    return failed(Failure::Decode(decode::DecodeError {
                        what: "watch event object",
                        reason: e.to_string(),
                        excerpt: decode::excerpt(raw.get().as_bytes()),
                    }))
                }
            };
            let rv = obj.resource_version().to_owned();
            let event = if matches!(decoded, WatchLine::Deleted(_)) {
                Event::Deleted(obj)
            } else {
                Event::Applied(obj)
            };
            count += 1;
            if let Err(step) = self.decide(event, publisher).await {
                return step;
            }
            self.note_line(rv);
        }
    }

    /// An event or bookmark was processed: it is the new resume point.
    fn note_line(&mut self, rv: String) {
        self.stats.note_event();
        if !rv.is_empty() {
            self.last_rv = Some(rv);
        }
        self.decode_failures = None;
    }

    /// Applies one event and publishes what it decides; `Err(Step::Closed)` when the
    /// pipeline is shutting down.
    async fn decide(&mut self, event: Event<'_>, publisher: &Publisher) -> Result<(), Step> {
        let changes = match self.decider.on_event(event) {
            Ok(changes) => changes,
            Err(e) => {
                tracing::warn!("{e}");
                return Ok(());
            }
        };
        for change in changes {
            if !self.publish(change, publisher).await {
                return Err(Step::Closed);
            }
        }
        Ok(())
    }

    async fn publish(&self, change: Change, publisher: &Publisher) -> bool {
        match encode(&self.resource, &change, &now_rfc3339()) {
            Ok(msg) => publisher.publish(msg).await,
            Err(e) => {
                let key = self.resource.key(change.namespace.as_deref(), &change.name);
                tracing::error!(%key, error = %e, "encoding the message failed; change skipped");
                true
            }
        }
    }
}
