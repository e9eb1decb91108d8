//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's `leaderelection`
//! package does it
//! (<https://pkg.go.dev/k8s.io/client-go/tools/leaderelection>): every `retry_period` each
//! replica reads the Lease; it takes it when it is free or its holder did not renew for
//! `lease_duration` (measured on the reader's own clock from when it last saw the record
//! change, so clock skew between nodes does not matter), and the holder renews it. Every
//! write is an update with the resourceVersion it read: the API server refuses a stale one
//! with 409 Conflict, so two replicas can never both win.
//!
//! # No window where two replicas emit
//!
//! The leader holds a [`Fence`] that is open until `renew_deadline` after the start of its
//! last successful renewal. The pipeline checks it before every send. Another replica can
//! take over only `lease_duration` after it saw that renewal, which happened after its
//! start, so with `renew_deadline < lease_duration` the old leader's fence closes first —
//! also when the process was frozen (SIGSTOP) and wakes up late: the fence uses the monotonic
//! clock. A leader that cannot renew stops and exits (client-go's usual `OnStoppedLeading`):
//! it must not emit, and a new process starts as a follower.
//!
//! This module never emits anything itself; it only decides who may.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::config::LeaderElectionConfig;

/// Emission is allowed while the fence is open. Cheap to clone and to check.
#[derive(Clone, Debug)]
pub struct Fence {
    base: Instant,
    /// Nanoseconds after `base` until which the fence is open (0: closed).
    until: Arc<AtomicU64>,
    /// Told when the fence is closed early ([`Fence::close`]) or its deadline moves.
    changed: Arc<tokio::sync::Notify>,
    /// The leader epoch plus one (0: none): the Lease's `leaseTransitions` when this
    /// replica took it ([`Fence::epoch`]).
    epoch: Arc<AtomicU64>,
}

impl Fence {
    fn new() -> Self {
        Fence {
            base: Instant::now(),
            until: Arc::new(AtomicU64::new(0)),
            changed: Arc::new(tokio::sync::Notify::new()),
            epoch: Arc::new(AtomicU64::new(0)),
        }
    }

    /// This replica's leader epoch: the Lease's `spec.leaseTransitions` as it wrote it when
    /// it took the Lease (each take-over by another replica adds one), `None` without leader
    /// election. Every message carries it (`leaderEpoch`), so a consumer can drop a deposed
    /// leader's publishes that a client library wrote after its successor's
    /// (`docs/consumers.md`). A Lease deleted and created again starts at 0 again.
    pub fn epoch(&self) -> Option<u64> {
        self.epoch.load(Ordering::SeqCst).checked_sub(1)
    }

    fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch.saturating_add(1), Ordering::SeqCst);
    }

    /// Resolves once the fence is closed: its deadline passed (on the monotonic clock, so
    /// also right after a process frozen with SIGSTOP wakes up) or it was closed. A send
    /// raced against it is abandoned when the fence closes first (`pipeline/deliver.rs`):
    /// what it carried is not acknowledged, so the next leader sends it again. Pending
    /// forever on a fence that is always open.
    pub async fn closed(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let until = self.until.load(Ordering::SeqCst);
            let now = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
            if now >= until {
                return;
            }
            if until == u64::MAX {
                changed.await;
                continue;
            }
            let deadline = self.base + Duration::from_nanos(until);
            tokio::select! {
                _ = tokio::time::sleep_until(deadline.into()) => {}
                _ = &mut changed => {}
            }
        }
    }

    /// A closed fence (a replica that lost its lease), for tests.
    #[cfg(test)]
    pub fn closed_for_tests() -> Self {
        Fence::new()
    }

    /// A fence open until `deadline`, closable with [`Fence::close_for_tests`], for tests.
    #[cfg(test)]
    pub fn open_until_for_tests(deadline: Instant) -> Self {
        let f = Fence::new();
        f.extend_to(deadline);
        f
    }

    /// Closes the fence now, for tests.
    #[cfg(test)]
    pub fn close_for_tests(&self) {
        self.close();
    }

    /// A fence that is always open (no leader election).
    pub fn open() -> Self {
        let f = Fence::new();
        f.until.store(u64::MAX, Ordering::SeqCst);
        f
    }

    /// Whether emitting is allowed now.
    pub fn is_open(&self) -> bool {
        let now = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        now < self.until.load(Ordering::SeqCst)
    }

    fn extend_to(&self, t: Instant) {
        let nanos = u64::try_from(t.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        self.until.store(nanos, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn close(&self) {
        self.until.store(0, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    /// Renewals failed for `renew_deadline`.
    #[error("could not renew the lease {lease} for {deadline:?}: {last_error}")]
    RenewDeadline {
        /// `namespace/name`.
        lease: String,
        /// `renew_deadline`.
        deadline: Duration,
        /// The last failure.
        last_error: String,
    },
    /// Another replica holds the lease.
    #[error("lease {lease} is now held by {holder}")]
    TakenOver {
        /// `namespace/name`.
        lease: String,
        /// The new holder's identity.
        holder: String,
    },
}

/// The outcome of one acquire-or-renew attempt.
enum Attempt {
    /// We hold the lease (renewed at the attempt's start).
    Held,
    /// Someone else holds a valid lease.
    Other(String),
}

/// One replica's candidacy for a Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    namespace: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    /// The record last seen (holder, renewTime, resourceVersion) and when it was first seen.
    observed: Option<(String, String, Instant)>,
    fence: Fence,
    /// Where the outcome of each attempt on the Lease is recorded for `/readyz` and the
    /// metrics ([`Elector::report_to`]).
    health: Option<Arc<Leadership>>,
    /// The name of the cluster the Lease is on, when known ([`Elector::on_cluster`]).
    cluster: Option<String>,
    /// Labels and annotations the Lease is created with ([`Elector::marked`]).
    marks: (
        std::collections::BTreeMap<String, String>,
        std::collections::BTreeMap<String, String>,
    ),
}

fn timed_out() -> kube::Error {
    kube::Error::Service(Box::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the API server did not answer in time",
    )))
}

/// `leaseDurationSeconds` for `d`: whole seconds, rounded up (a sub-second or fractional
/// duration truncated would tell the other replicas the lease expires before it does; a
/// zero would make it free at once), at least 1.
pub(crate) fn lease_seconds(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// The identity of this replica: `identity`, else `POD_NAME` (unique per Pod, and kept by a
/// restarted container, which then renews its own Lease at once), else the host name plus a
/// random suffix drawn once per process (`myhost_0f5c…`, as client-go's examples build it), so
/// two replicas on one host, or anywhere `POD_NAME` is unset, never share an identity. The
/// same value for the whole process (the Kafka state store's writer takes it too).
pub fn identity(cfg: &LeaderElectionConfig) -> String {
    /// Host name and suffix, drawn once.
    static PROCESS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let host = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| "kubesink".to_owned());
        format!("{host}_{}", uuid::Uuid::new_v4().simple())
    });
    cfg.identity
        .clone()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| PROCESS.clone())
}

/// The Lease's namespace: configured, else the Pod's own (service account), else `default`.
pub fn namespace(cfg: &LeaderElectionConfig) -> String {
    cfg.lease_namespace.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_owned())
    })
}

impl Elector {
    /// A candidate for the configured Lease through `client`.
    pub fn new(client: Client, cfg: &LeaderElectionConfig) -> Self {
        let ns = namespace(cfg);
        Elector {
            api: Api::namespaced(client, &ns),
            name: cfg.lease_name.clone(),
            namespace: ns,
            identity: identity(cfg),
            lease_duration: cfg.lease_duration.get(),
            renew_deadline: cfg.renew_deadline.get(),
            retry_period: cfg.retry_period.get(),
            observed: None,
            fence: Fence::new(),
            health: None,
            cluster: None,
            marks: Default::default(),
        }
    }

    /// Starts from what another reader of this process saw of the Lease: record
    /// `(holder, renewTime and resourceVersion as [`Elector::record_of`] writes them)` first
    /// seen at `at`. A new candidate for a Lease whose holder died then takes it
    /// `lease_duration` after that first sight, not after its own (scale-out: the group's
    /// listing saw the cluster Lease before the cluster was assigned here). The same rule as
    /// its own observations: `at` is on this process's monotonic clock.
    #[must_use]
    pub fn seen(mut self, holder: String, record: String, at: Instant) -> Self {
        self.observed = Some((holder, record, at));
        self
    }

    /// The record of `lease` as [`Elector::seen`] takes it: its `renewTime` and
    /// `resourceVersion` (a change of either is a renewal).
    pub fn record_of(lease: &Lease) -> String {
        let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref());
        format!("{renewed:?}{:?}", lease.metadata.resource_version)
    }

    /// Creates the Lease, when it does not exist, with these labels and annotations (a
    /// scale-out cluster Lease names its group and cluster, `scale_out`).
    #[must_use]
    pub fn marked(
        mut self,
        labels: std::collections::BTreeMap<String, String>,
        annotations: std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.marks = (labels, annotations);
        self
    }

    /// Records whether each attempt on the Lease reached the API server in `leadership`
    /// (`/readyz` reports a replica that cannot reach it, whatever its role).
    pub fn report_to(&mut self, leadership: Arc<Leadership>) {
        self.health = Some(leadership);
    }

    /// Names the cluster that holds the Lease in what `/readyz` and the logs say.
    #[must_use]
    pub fn on_cluster(mut self, name: impl Into<String>) -> Self {
        self.cluster = Some(name.into());
        self
    }

    /// Records one attempt's outcome (see [`Elector::report_to`]), naming the Lease and its
    /// cluster.
    fn record(&self, outcome: Result<(), String>) {
        if let Some(h) = &self.health {
            h.lease_attempt(outcome.map_err(|e| {
                let on = self
                    .cluster
                    .as_ref()
                    .map(|c| format!(" on cluster {c:?}"))
                    .unwrap_or_default();
                format!("Lease {}{on}: {e}", self.lease())
            }));
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// `namespace/name` of the Lease.
    pub fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The fence the pipeline checks (closed until the lease is acquired).
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Waits until this replica holds the lease; the fence is open when it returns.
    pub async fn acquire(&mut self) {
        let mut last_holder = String::new();
        // A failure is logged at WARN the first time, then at most once a minute (DEBUG in
        // between): `/readyz` and `kubesink_lease_failing` say it continuously.
        let mut last_warned: Option<Instant> = None;
        loop {
            let attempt = tokio::time::timeout(self.renew_deadline, self.attempt()).await;
            let attempt = attempt.unwrap_or_else(|_| Err(timed_out()));
            self.record(match &attempt {
                Ok(_) => Ok(()),
                Err(e) => Err(crate::cluster::error_chain(e)),
            });
            if attempt.is_ok() && last_warned.take().is_some() {
                tracing::info!(lease = %self.lease(), "leader election: the lease can be read again");
            }
            match attempt {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %self.lease(), identity = %self.identity, "became the leader");
                    return;
                }
                Ok(Attempt::Other(holder)) => {
                    if holder != last_holder {
                        tracing::info!(lease = %self.lease(), %holder, "following: another replica leads");
                        last_holder = holder;
                    }
                }
                Err(e) => {
                    let error = crate::cluster::error_chain(&e);
                    if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        last_warned = Some(Instant::now());
                        tracing::warn!(lease = %self.lease(), cluster = self.cluster.as_deref().unwrap_or(""), %error, "leader election: cannot read or take the lease; retrying (logged again once a minute while it fails)");
                    } else {
                        tracing::debug!(lease = %self.lease(), %error, "leader election: cannot read or take the lease; retrying");
                    }
                }
            }
            tokio::time::sleep(self.retry_period).await;
        }
    }

    /// Renews the lease every `retry_period` while it can; returns why leadership ended (the
    /// fence is closed by then).
    pub async fn hold(&mut self) -> Lost {
        let mut last_ok = Instant::now();
        // As in `acquire`: WARN the first failure of a streak, DEBUG the retries.
        let mut warned = false;
        loop {
            tokio::time::sleep(self.retry_period).await;
            let started = Instant::now();
            // A request that hangs must not keep a leader that cannot renew from stopping
            // (its fence closes on time regardless).
            let left = self.renew_deadline.saturating_sub(last_ok.elapsed());
            let attempt = tokio::time::timeout(left.max(self.retry_period), self.attempt()).await;
            let attempt = attempt.unwrap_or_else(|_| Err(timed_out()));
            self.record(match &attempt {
                Ok(_) => Ok(()),
                Err(e) => Err(crate::cluster::error_chain(e)),
            });
            let last_error = match attempt {
                Ok(Attempt::Held) => {
                    if warned {
                        tracing::info!(lease = %self.lease(), "lease renewed again");
                        warned = false;
                    }
                    last_ok = started;
                    continue;
                }
                Ok(Attempt::Other(holder)) => {
                    self.fence.close();
                    return Lost::TakenOver {
                        lease: self.lease(),
                        holder,
                    };
                }
                Err(e) => crate::cluster::error_chain(&e),
            };
            if last_ok.elapsed() >= self.renew_deadline {
                self.fence.close();
                return Lost::RenewDeadline {
                    lease: self.lease(),
                    deadline: self.renew_deadline,
                    last_error,
                };
            }
            if warned {
                tracing::debug!(lease = %self.lease(), error = %last_error, "renewing the lease failed; retrying");
            } else {
                warned = true;
                tracing::warn!(lease = %self.lease(), cluster = self.cluster.as_deref().unwrap_or(""), error = %last_error, "renewing the lease failed; retrying until the renew deadline (leader_election.renew_deadline), then this replica stops leading");
            }
        }
    }

    /// Gives the lease up (at shutdown) so a follower takes over at once.
    pub async fn release(&mut self) {
        self.fence.close();
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.lease(), "lease released"),
            Err(e) => {
                tracing::warn!(lease = %self.lease(), error = %crate::cluster::error_chain(&e), "releasing the lease failed; it expires on its own")
            }
        }
    }

    /// One acquire-or-renew: read, decide, write with the read resourceVersion.
    async fn attempt(&mut self) -> Result<Attempt, kube::Error> {
        let started = Instant::now();
        let now = MicroTime(Timestamp::now());
        let secs = lease_seconds(self.lease_duration);
        let Some(current) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    labels: Some(self.marks.0.clone()).filter(|l| !l.is_empty()),
                    annotations: Some(self.marks.1.clone()).filter(|a| !a.is_empty()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(self.won(started, 0)),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Other(String::new())),
                Err(e) => Err(e),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let record = (holder.clone(), Self::record_of(&current));
        // When the record was first seen: after the GET returned, as client-go's
        // `observedTime` (taking it before would let a follower count the request's own
        // latency as time the holder failed to renew, and take over early).
        let seen_at = match &self.observed {
            Some((h, r, at)) if *h == record.0 && *r == record.1 => *at,
            _ => {
                let seen = Instant::now();
                self.observed = Some((record.0, record.1, seen));
                seen
            }
        };
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.lease_duration, Duration::from_secs);
        let mine = holder == self.identity;
        if let Some(h) = &self.health {
            h.holder_renewed_at(Some(seen_at).filter(|_| !holder.is_empty()));
        }
        if !mine && !holder.is_empty() && seen_at.elapsed() < duration {
            return Ok(Attempt::Other(holder));
        }
        let mut lease = current;
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !mine {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(secs);
        let transitions = u64::try_from(spec.lease_transitions.unwrap_or(0)).unwrap_or(0);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(self.won(started, transitions)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Other(holder)),
            Err(e) => Err(e),
        }
    }

    fn won(&mut self, started: Instant, transitions: u64) -> Attempt {
        if let Some(h) = &self.health {
            h.holder_renewed_at(Some(started));
        }
        self.fence.set_epoch(transitions);
        self.fence.extend_to(started + self.renew_deadline);
        self.observed = None;
        Attempt::Held
    }
}

/// Whether this replica leads (with leader election), how often that changed, and whether
/// the Lease can be read and written at all.
#[derive(Debug, Default)]
pub struct Leadership {
    leader: AtomicBool,
    changes: AtomicU64,
    /// Since when, and why, the last attempts on the Lease failed (`None` once one answers).
    lease_failing: std::sync::Mutex<Option<(std::time::Instant, String)>>,
    /// When the Lease's holder was last seen renewing it ([`Leadership::holder_renewed_ago`]).
    renewed: std::sync::Mutex<Option<Instant>>,
}

impl Leadership {
    /// Records the outcome of one attempt on the Lease (acquire or renew): `Err` with the
    /// error's text when the API server could not be asked or refused, `Ok` once it answered.
    pub fn lease_attempt(&self, outcome: Result<(), String>) {
        let mut failing = self
            .lease_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match outcome {
            Ok(()) => *failing = None,
            Err(why) => {
                let since = failing
                    .as_ref()
                    .map_or_else(std::time::Instant::now, |f| f.0);
                *failing = Some((since, why));
            }
        }
    }

    /// How long attempts on the Lease have failed, and the last error; `None` while it answers.
    pub fn lease_failing(&self) -> Option<(std::time::Duration, String)> {
        self.lease_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|(since, why)| (since.elapsed(), why.clone()))
    }

    /// Records when the Lease's holder was last seen renewing it: this replica's own
    /// renewal while it holds the Lease, else the moment it first saw the holder's current
    /// record (`None`: no holder).
    pub fn holder_renewed_at(&self, at: Option<Instant>) {
        *self
            .renewed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = at;
    }

    /// How long ago the Lease's holder last renewed it, on this replica's monotonic clock
    /// (the measure the take-over uses: `lease_duration` of it frees the Lease); `None`
    /// while no one holds it or before the first attempt. A holder renews every
    /// `retry_period`, so it stays below that while the holder lives; past it, the holder
    /// is dead, frozen or cut off, and a follower takes over when it reaches
    /// `lease_duration`.
    pub fn holder_renewed_ago(&self) -> Option<Duration> {
        self.renewed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .map(|at| at.elapsed())
    }

    /// Records a change of role; logged by the caller.
    pub fn set_leader(&self, leader: bool) {
        if self.leader.swap(leader, Ordering::SeqCst) != leader {
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    /// How many times the role changed.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_is_open_until_its_deadline_and_closes() {
        let f = Fence::new();
        assert!(!f.is_open(), "closed until acquired");
        f.extend_to(Instant::now() + Duration::from_secs(60));
        assert!(f.is_open());
        f.extend_to(Instant::now() - Duration::from_millis(1));
        assert!(!f.is_open(), "past its deadline");
        f.extend_to(Instant::now() + Duration::from_secs(60));
        f.close();
        assert!(!f.is_open());
        assert!(Fence::open().is_open());
    }

    #[test]
    fn a_lease_record_never_claims_a_shorter_lease_than_configured() {
        assert_eq!(lease_seconds(Duration::from_millis(500)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(15)), 15);
        assert_eq!(lease_seconds(Duration::ZERO), 1);
    }

    #[tokio::test]
    async fn closed_resolves_at_the_deadline_or_when_closed_and_never_when_always_open() {
        let f = Fence::new();
        f.extend_to(Instant::now() + Duration::from_millis(30));
        tokio::time::timeout(Duration::from_secs(30), f.closed())
            .await
            .expect("resolves once the deadline passed");
        assert!(!f.is_open());
        f.extend_to(Instant::now() + Duration::from_secs(3600));
        let waiter = {
            let f = f.clone();
            tokio::spawn(async move { f.closed().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        f.close();
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("resolves when closed")
            .unwrap();
        let open = Fence::open();
        assert!(
            tokio::time::timeout(Duration::from_millis(20), open.closed())
                .await
                .is_err(),
            "an always-open fence never closes"
        );
    }
}
