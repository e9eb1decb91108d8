//! What an operator sees of a running bridge: Prometheus metrics (`metrics.rs`), the health
//! rules behind `/healthz` and `/readyz` (this file), the HTTP server that serves them
//! (`server.rs`), the continuous sink readiness probe and the periodic summary log line.
//!
//! # Health rules
//!
//! - **Liveness** (`/healthz`) fails only when restarting the process could help: a watch
//!   that could not be re-established (connection failures, dead or undecodable watches,
//!   server errors) for longer than `server.watch_failure_timeout`, an informer that
//!   stopped, or a sink whose worker panicked (delivery to it stopped for good; the restart
//!   resumes it from the saved state). A sink outage never fails it (the pipeline holds the backlog and retries), nor
//!   does an API server refusing (401/403: RBAC; 404: the CRD is gone): a restart cures
//!   neither, and the informer keeps retrying on its own.
//! - **Readiness** (`/readyz`): every watch finished its initial sync, every sink is ready
//!   (its worker runs, its healthcheck passes and its sends succeed), and no state journal is
//!   failing (its sends would wait).
//!
//! Both answer `200` or `503` with a JSON body naming every watch and sink and what is
//! wrong with it. This module reads counters; it never changes the data path.

mod entries;
mod metrics;
pub mod server;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kubesink_core::backoff::Backoff;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::informer::{FailureKind, ListBudget};
use crate::pipeline::SinkHandle;

pub use crate::leader::Leadership;
pub use entries::{ClusterEntry, SinkEntry, StateEntry, WatchEntry, WatchList};

/// How long a sink's batch may wait for the state journal before `/readyz` fails: a healthy
/// journal answers in milliseconds (one PubAck or produce round trip, written while the
/// previous batch was sent), a store that is down never.
pub const JOURNAL_WAIT_NOT_READY: Duration = Duration::from_secs(1);

/// What the HTTP server serves (`server.rs`): one bridge's [`Observer`], or a scale-out
/// replica's view over the clusters it holds (`scale_out.rs`).
pub trait Observed: Send + Sync + 'static {
    /// The metrics in the Prometheus text format, and its content type.
    fn metrics(&self) -> (String, &'static str);
    /// `/healthz`.
    fn liveness(&self) -> Report;
    /// `/readyz`.
    fn readiness(&self) -> Report;
}

impl Observed for Observer {
    fn metrics(&self) -> (String, &'static str) {
        Observer::metrics(self)
    }
    fn liveness(&self) -> Report {
        Observer::liveness(self)
    }
    fn readiness(&self) -> Report {
        Observer::readiness(self)
    }
}

/// A health answer: whether it passes, and the JSON body that says why.
#[derive(Debug, Clone)]
pub struct Report {
    /// Passes.
    pub ok: bool,
    /// `{"status": "ok"|"failing", "problems": [...], "watches": [...], "sinks": [...]}`.
    pub body: Value,
}

/// The observable state of one bridge.
pub struct Observer {
    watches: Arc<WatchList>,
    sinks: Arc<[SinkEntry]>,
    states: Arc<[StateEntry]>,
    clusters: Arc<[ClusterEntry]>,
    registry: Registry,
    watch_failure_timeout: Duration,
    multi_cluster: bool,
    leadership: Option<Arc<Leadership>>,
}

impl Observer {
    /// Observers over `watches`, `sinks`, the clusters' state stores `states` and their API
    /// request counts `clusters`, and the process's budget of lists in flight `lists`;
    /// `multi_cluster` when several clusters are watched; `leadership` with leader election.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        watches: Arc<WatchList>,
        sinks: Vec<SinkEntry>,
        states: Vec<StateEntry>,
        clusters: Vec<ClusterEntry>,
        lists: Arc<ListBudget>,
        watch_failure_timeout: Duration,
        multi_cluster: bool,
        leadership: Option<Arc<Leadership>>,
    ) -> Self {
        let sinks: Arc<[SinkEntry]> = sinks.into();
        let states: Arc<[StateEntry]> = states.into();
        let clusters: Arc<[ClusterEntry]> = clusters.into();
        Observer {
            registry: metrics::registry(
                watches.clone(),
                sinks.clone(),
                states.clone(),
                clusters.clone(),
                lists,
                leadership.clone(),
            ),
            watches,
            sinks,
            states,
            clusters,
            watch_failure_timeout,
            multi_cluster,
            leadership,
        }
    }

    /// One observer over the watches, sinks and state stores of `parts` (the bridges of the
    /// clusters a scale-out replica holds or waits for, `scale_out.rs`), without leadership
    /// (each part has its own Lease), and `extra` metrics registered beside them; `lists` is
    /// the process's budget of lists in flight, which the parts share.
    pub fn merged(
        parts: &[&Observer],
        lists: Arc<ListBudget>,
        watch_failure_timeout: Duration,
        extra: impl FnOnce(&mut Registry),
    ) -> Self {
        let watches = WatchList::merged(parts.iter().map(|o| o.watches.clone()).collect());
        let sinks: Vec<SinkEntry> = parts.iter().flat_map(|o| o.sinks.to_vec()).collect();
        let states: Vec<StateEntry> = parts.iter().flat_map(|o| o.states.to_vec()).collect();
        let clusters: Vec<ClusterEntry> = parts.iter().flat_map(|o| o.clusters.to_vec()).collect();
        let mut o = Observer::new(
            watches,
            sinks,
            states,
            clusters,
            lists,
            watch_failure_timeout,
            true,
            None,
        );
        extra(&mut o.registry);
        o
    }

    /// The watches now: those planned at start, and those a group-form resource added for
    /// the kinds discovery found.
    fn watches(&self) -> Arc<[WatchEntry]> {
        self.watches.get()
    }

    /// Whether this bridge watches: always without leader election, else while it holds its
    /// Lease.
    pub fn leads(&self) -> bool {
        self.watching()
    }

    /// Whether this replica watches: always without leader election, else while it leads.
    fn watching(&self) -> bool {
        self.leadership.as_ref().is_none_or(|l| l.is_leader())
    }

    fn role(&self) -> &'static str {
        match &self.leadership {
            None => "single",
            Some(l) if l.is_leader() => "leader",
            Some(_) => "follower",
        }
    }

    /// The metrics in the Prometheus text format, and its content type.
    pub fn metrics(&self) -> (String, &'static str) {
        (metrics::encode(&self.registry), metrics::CONTENT_TYPE)
    }

    fn watch_json(w: &WatchEntry) -> Value {
        let failing = w.stats.failing_for();
        json!({
            "cluster": w.cluster,
            "resource": format!("{} {}", w.api_version, w.kind),
            "scope": w.namespace.as_deref().unwrap_or("all"),
            "synced": w.stats.synced.load(Ordering::Relaxed),
            "running": w.stats.running.load(Ordering::Relaxed),
            "objects": w.stats.objects.load(Ordering::Relaxed),
            "failing_seconds": failing.map(|(d, _)| d.as_secs()),
            "failure": w.stats.failure(),
        })
    }

    fn sink_json(s: &SinkEntry) -> Value {
        let st = s.handle.stats();
        json!({
            "sink": s.handle.sink().name(),
            "ready": st.ready(),
            "pending": s.handle.held(),
            "waiting_for_journal": st.waiting_for_journal().is_some(),
            "worker_panicked": st.panicked().is_some(),
            "problem": st.problem(),
        })
    }

    fn state_json(s: &StateEntry) -> Value {
        let st = &s.stats;
        json!({
            "cluster": s.cluster,
            "store": s.store,
            "saves": st.saves.load(Ordering::Relaxed),
            "last_save_unix_ms": st.last_save_ms.load(Ordering::Relaxed),
            "journal_pending": st.journal_pending(),
            "journal_failing_seconds": st.journal_failing_for().map(|d| d.as_secs()),
            "restore": st.restore(),
            "problem": st.problem(),
        })
    }

    fn report(&self, problems: Vec<String>) -> Report {
        let ok = problems.is_empty();
        // Watches that synced once and are failing now: their data is stale, not lost.
        let degraded: Vec<String> = self
            .watches()
            .iter()
            .filter(|w| w.stats.synced.load(Ordering::Relaxed))
            .filter_map(|w| w.stats.failure().map(|f| format!("{}: {f}", Self::name(w))))
            .collect();
        Report {
            ok,
            body: json!({
                "status": if ok { "ok" } else { "failing" },
                "role": self.role(),
                "problems": problems,
                "degraded": degraded,
                "watches": self.watches().iter().map(Self::watch_json).collect::<Vec<_>>(),
                "sinks": self.sinks.iter().map(Self::sink_json).collect::<Vec<_>>(),
                "state": self.states.iter().map(Self::state_json).collect::<Vec<_>>(),
            }),
        }
    }

    fn name(w: &WatchEntry) -> String {
        format!(
            "{} {} {} ({})",
            w.cluster,
            w.api_version,
            w.kind,
            w.namespace.as_deref().unwrap_or("all")
        )
    }

    /// `/healthz`: see the module's health rules.
    pub fn liveness(&self) -> Report {
        let mut problems = Vec::new();
        for w in self.watches().iter() {
            let stopped =
                w.stats.started.load(Ordering::Relaxed) && !w.stats.running.load(Ordering::Relaxed);
            if stopped && self.watching() {
                problems.push(format!("{}: informer stopped", Self::name(w)));
            }
            // An unreachable cluster among several: a restart cannot bring it back and would
            // interrupt the others.
            let counts = |k| match k {
                FailureKind::Broken => true,
                FailureKind::Unreachable => !self.multi_cluster,
                FailureKind::Forbidden | FailureKind::NotFound => false,
            };
            if let Some((d, kind)) = w.stats.failing_for().filter(|(_, k)| counts(*k)) {
                let _ = kind;
                if d > self.watch_failure_timeout {
                    problems.push(format!(
                        "{}: watch not re-established for {}s: {}",
                        Self::name(w),
                        d.as_secs(),
                        w.stats.failure().unwrap_or_default()
                    ));
                }
            }
        }
        // A panicked worker delivers nothing more: only a restart resumes delivery.
        for s in self.sinks.iter() {
            if let Some(p) = s.handle.stats().panicked() {
                problems.push(format!(
                    "sink {}: its worker panicked, nothing more is delivered to it until a restart: {p}",
                    s.handle.sink().name()
                ));
            }
        }
        self.report(problems)
    }

    /// `/readyz`: see the module's health rules.
    pub fn readiness(&self) -> Report {
        let mut problems = Vec::new();
        // A replica that cannot reach the Lease can neither lead nor stand by (a leader that
        // cannot renew stops at its renew deadline): with the Lease's cluster unreachable the
        // whole fleet emits nothing, and every replica says so.
        if let Some((failing, why)) = self.leadership.as_ref().and_then(|l| l.lease_failing()) {
            problems.push(format!(
                "leader election: the Lease cannot be read or written for {}s: {why}",
                failing.as_secs()
            ));
        }
        // A follower is ready when its sinks are: it stands by.
        for w in self.watches().iter().filter(|_| self.watching()) {
            if !w.stats.synced.load(Ordering::Relaxed) {
                let why = w.stats.failure().map_or_else(
                    || "initial sync in progress".to_owned(),
                    |f| format!("initial sync not done: {f}"),
                );
                problems.push(format!("{}: {why}", Self::name(w)));
            }
        }
        for s in self.sinks.iter() {
            let st = s.handle.stats();
            // Said as soon as a wait is longer than a healthy journal's round trip, before
            // the journal's own write times out (`state.<backend>.timeout`, 10 s by default).
            if let Some(waited) = st
                .waiting_for_journal()
                .filter(|w| *w >= JOURNAL_WAIT_NOT_READY)
            {
                problems.push(format!(
                    "sink {}: its sends have waited {:.1}s for the state journal to hold their new objects (state.write_ahead): the state store does not answer",
                    s.handle.sink().name(),
                    waited.as_secs_f64()
                ));
            }
            if !st.ready() {
                problems.push(format!(
                    "sink {}: {}",
                    s.handle.sink().name(),
                    st.problem().unwrap_or_else(|| "not ready yet".to_owned())
                ));
            }
        }
        // A journal that cannot store holds every send back; a state that cannot be read
        // holds the watches back.
        for s in self.states.iter() {
            if let Some(d) = s.stats.restore_waiting_for() {
                problems.push(format!(
                    "state of cluster {} ({}): the watches wait for {}s: {}",
                    s.cluster,
                    s.store,
                    d.as_secs(),
                    s.stats.restore().unwrap_or_default()
                ));
            }
            if let Some(d) = s.stats.journal_failing_for() {
                problems.push(format!(
                    "state of cluster {} ({}): journal failing for {}s, sends wait: {}",
                    s.cluster,
                    s.store,
                    d.as_secs(),
                    s.stats.problem().unwrap_or_default()
                ));
            }
        }
        self.report(problems)
    }

    /// Logs one summary line: objects, events/s, messages/s, and per sink pending and
    /// delivered/s, every `every` until `cancel`.
    pub async fn log_summaries(self: Arc<Self>, every: Duration, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut last = self.totals();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = self.totals();
            let rate = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / every.as_secs_f64();
            let sinks: Vec<String> = self
                .sinks
                .iter()
                .zip(&now.delivered)
                .zip(&last.delivered)
                .map(|((s, d1), d0)| {
                    format!(
                        "{}: {} pending, {:.1}/s delivered{}",
                        s.handle.sink().name(),
                        s.handle.held(),
                        rate(*d1, *d0),
                        if s.handle.stats().ready() {
                            ""
                        } else {
                            " (not ready)"
                        }
                    )
                })
                .collect();
            tracing::info!(
                objects = now.objects,
                // Numbers, not strings, in the JSON log format (rounded to 0.1/s).
                events_per_sec = (rate(now.events, last.events) * 10.0).round() / 10.0,
                messages_per_sec = (rate(now.messages, last.messages) * 10.0).round() / 10.0,
                sinks = %sinks.join("; "),
                "summary"
            );
            last = now;
        }
    }

    fn totals(&self) -> Totals {
        Totals {
            objects: self
                .watches()
                .iter()
                .map(|w| w.stats.objects.load(Ordering::Relaxed))
                .sum(),
            events: self.watches().iter().map(|w| w.stats.received()).sum(),
            messages: self.watches().iter().map(|w| w.stats.emitted()).sum(),
            delivered: self
                .sinks
                .iter()
                .map(|s| s.handle.stats().delivered.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

struct Totals {
    objects: u64,
    events: u64,
    messages: u64,
    delivered: Vec<u64>,
}

/// The readiness probe's retries while a sink is not ready: 1 s doubling, capped at the probe's
/// `interval` (and at 30 s); every `interval` while it is.
const PROBE: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// Runs a sink's healthcheck until `cancel`: every `interval` while it passes, with backoff
/// (1 s doubling, at most `interval`) while it does not, and at once when the sink's `health_signal` says its answer changed; each result goes to the sink's stats (readiness), each change between ready
/// and not ready is logged once, and a return to ready after a failure notifies the sink's
/// ready signal, which ends the pipeline's retry backoff for sinks that have no connection
/// events of their own.
pub async fn probe_sink(handle: SinkHandle, interval: Duration, cancel: CancellationToken) {
    let sink = handle.sink().clone();
    let stats = handle.stats().clone();
    let mut delays = PROBE.delays();
    let mut was_ready: Option<bool> = None;
    // The sink's "look again" (`Sink::health_signal`): a change learned between two checks.
    let mut health = sink.health_signal().map(|s| s.subscribe());
    loop {
        if let Some(h) = health.as_mut() {
            h.mark_seen();
        }
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = tokio::time::timeout(interval.max(Duration::from_secs(1)) * 3, sink.healthcheck()) => r,
        };
        let result = match result {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("healthcheck did not answer".to_owned()),
        };
        let ready = result.is_ok();
        // Ready: the regular interval, and the backoff starts over. Not ready: the backoff,
        // never longer than the interval, so a sink that comes back is seen ready within one
        // interval however long or often it was down (a backoff never reset would sit at its
        // 30 s cap after a few outages, and see a sink ready again up to 30 s late).
        let wait = if ready {
            delays = PROBE.delays();
            interval
        } else {
            delays
                .next()
                .unwrap_or(PROBE.max)
                .min(interval.max(PROBE.initial))
        };
        match (&result, was_ready) {
            (Ok(()), Some(true)) | (Err(_), Some(false)) => {}
            (Ok(()), Some(false)) => {
                tracing::info!(sink = sink.name(), "sink ready again");
                handle.ready().notify();
            }
            (Ok(()), None) => tracing::info!(sink = sink.name(), "sink ready"),
            (Err(e), _) => {
                tracing::warn!(sink = sink.name(), error = %e, next_check_in = ?wait, "sink not ready; changes wait in the pipeline")
            }
        }
        was_ready = Some(ready);
        stats.note_health(result);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = async {
                match health.as_mut() {
                    Some(h) => h.changed().await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}
