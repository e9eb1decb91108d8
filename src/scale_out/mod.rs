//! Scale-out (`leader_election.scale_out = true`, `docs/scale-out.md`): the clusters of the
//! configuration spread over the replicas of a Deployment, on Kubernetes Leases alone.
//!
//! Every `retry_period` each replica:
//! 1. renews its **membership Lease** (`members.rs`); a replica that cannot renew it for
//!    `renew_deadline` stops everything and exits, as a leader does;
//! 2. lists the group's Leases: the live members, the settled ones (`join_after`), and who
//!    holds each cluster;
//! 3. computes the **assignment** (`assign.rs`: an even spread that moves the fewest
//!    clusters from their current holders), the same on every replica;
//! 4. **holds** each cluster assigned to it through a bridge of its own (`bridge::Bridge`:
//!    one cluster, its own pipeline, fence, state keeper and Elector on the cluster's Lease
//!    `{lease_name}-cluster-…`): the bridge waits for that Lease, then restores the cluster's
//!    state and watches; its fence closes before anyone else may take the Lease, exactly as
//!    a leader's (`leader.rs`), so a cluster is never emitted by two replicas;
//! 5. **releases** each cluster no longer assigned to it: the cluster's bridge stops its
//!    watches, drains its queues, saves its state and gives the Lease up (the bridge's own
//!    shutdown), and the next holder, which has been trying to take the Lease every
//!    `retry_period`, resumes from the saved state: it sends only what changed.
//!
//! A bridge whose Lease is lost (renewals failed, or taken over) is dropped at once: its
//! fence is closed, so it could neither send nor save; the cluster's next holder sends what
//! it held.
//!
//! Why a bridge per cluster rather than per-cluster fences inside one pipeline: the bridge is
//! the unit whose hand-over is built and tested (drain, final save, release, fencing of a
//! frozen process); a cluster's move is then that hand-over, unchanged. The sinks' clients are
//! shared (one Kafka producer, one NATS connection per sink for the process); each held
//! cluster has its own queues, bounded by `[pipeline]` each.

pub mod assign;
pub mod members;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::FutureExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kubesink_core::{Message, ReadySignal, Sink, SinkError};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bridge::{self, Bridge, Shared, ShutdownReport, Unclean, LOST_LEADERSHIP_EXIT};
use crate::cluster::ClusterError;
use crate::config::{Cluster, LeaderElectionConfig};
use crate::informer::ListBudget;
use crate::leader::Leadership;
use crate::leader::{self, Elector, Lost};
use crate::observe::{self, Observed, Observer, Report};
use crate::plan::{LeasePlan, Plan, UnitPlan};
use members::{Membership, View, CLUSTER_ANNOTATION, GROUP_LABEL, ROLE_LABEL};

/// A sink shared by the bridges of the held clusters: a cluster's bridge closing at its
/// release must not close the client the others use. The process closes the sinks once,
/// after every bridge stopped.
struct SharedSink(Arc<dyn Sink>);

#[async_trait]
impl Sink for SharedSink {
    fn name(&self) -> &str {
        self.0.name()
    }
    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        self.0.send(batch).await
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.0.healthcheck().await
    }
    /// Nothing: the process closes the shared sink at its end. A released cluster's
    /// messages were confirmed before its drain ended (at-least-once does not rest on
    /// `close`).
    async fn close(&self) -> Result<(), SinkError> {
        Ok(())
    }
    /// Forwarded: what the client still holds of the abandoned send is dropped. With a
    /// shared client this may drop another cluster's records in flight too; their sends
    /// then fail and are retried (sent again, never lost).
    async fn abandon(&self) {
        self.0.abandon().await
    }
    fn max_message_bytes(&self) -> Option<usize> {
        self.0.max_message_bytes()
    }
    fn max_batches_in_flight(&self) -> usize {
        self.0.max_batches_in_flight()
    }
    fn client_rebuilds(&self) -> u64 {
        self.0.client_rebuilds()
    }
    fn rejected(&self) -> u64 {
        self.0.rejected()
    }
    fn ready_signal(&self) -> Option<ReadySignal> {
        self.0.ready_signal()
    }
    fn health_signal(&self) -> Option<ReadySignal> {
        self.0.health_signal()
    }
}

/// The scale-out metrics (`kubesink_scale_out_*`), registered beside the held clusters'.
#[derive(Clone, Default)]
struct Metrics {
    held: Gauge,
    cluster_held: Family<Vec<(String, String)>, Gauge>,
    members: Gauge,
    moves: Family<Vec<(String, String)>, Counter>,
    unheld: Family<Vec<(String, String)>, Gauge<f64, std::sync::atomic::AtomicU64>>,
    renewed: Family<Vec<(String, String)>, Gauge<f64, std::sync::atomic::AtomicU64>>,
    lost: Gauge,
    member_lease_failing: Gauge,
}

impl Metrics {
    fn register(&self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("scale_out");
        r.register(
            "held_clusters",
            "Clusters this replica holds the Lease of and watches",
            self.held.clone(),
        );
        r.register(
            "cluster_held",
            "1 for each cluster this replica holds, 0 for one it waits for or released",
            self.cluster_held.clone(),
        );
        r.register(
            "members",
            "Live members of the group as this replica last listed them",
            self.members.clone(),
        );
        r.register(
            "moves",
            "Clusters this replica took (acquired), gave up (released: no longer assigned to it) or lost (its Lease could not be renewed)",
            self.moves.clone(),
        );
        r.register(
            "unheld_seconds",
            "How long each cluster's Lease has had no valid holder, as this replica last listed the Leases (0 while held): alert on the maximum over replicas",
            self.unheld.clone(),
        );
        r.register_with_unit(
            "cluster_lease_renewed",
            "Seconds since each cluster Lease's holder was last seen renewing it, as this replica last listed the Leases (below about twice retry_period while the holder lives; at lease_duration the next holder takes it; absent while no one holds it)",
            prometheus_client::registry::Unit::Seconds,
            self.renewed.clone(),
        );
        r.register(
            "members_lost",
            "Members not seen renewing their membership Lease for renew_deadline (stopped, by their own rule): their clusters go to the others",
            self.lost.clone(),
        );
        r.register(
            "member_lease_failing",
            "1 while renewing this replica's membership Lease fails (at renew_deadline it stops and exits)",
            self.member_lease_failing.clone(),
        );
    }

    fn moved(&self, reason: &str) {
        self.moves
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }
}

/// One cluster this replica holds or is trying to hold.
struct Holding {
    bridge: Bridge,
    /// Resolves when the bridge's Lease is lost.
    lost: Pin<Box<dyn Future<Output = Lost> + Send>>,
    /// Whether it held the Lease at the last look (for the `acquired` move).
    held: bool,
}

/// What the HTTP server shows of a scale-out replica: the held clusters' bridges merged,
/// plus the scale-out metrics and membership.
struct Fleet {
    parts: Mutex<BTreeMap<String, Arc<Observer>>>,
    metrics: Metrics,
    /// The process's budget of lists in flight, shared by the held clusters.
    lists: Arc<ListBudget>,
    watch_failure_timeout: Duration,
    identity: String,
    /// The last view: members and assignment, for `/readyz`'s body.
    last: Mutex<(View, BTreeMap<String, String>)>,
    /// Whether renewing the membership Lease fails, since when and why (the leader
    /// election's record of its attempts, `leader::Leadership`).
    member: Leadership,
    /// The same for listing the group's Leases.
    listing: Leadership,
}

impl Fleet {
    fn parts(&self) -> Vec<(String, Arc<Observer>)> {
        self.parts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn combine(&self, each: impl Fn(&Observer) -> Report) -> Report {
        let mut problems = Vec::new();
        if let Some((failing, why)) = self.member.lease_failing() {
            problems.push(json!(format!(
                "scale-out: the membership Lease cannot be renewed for {}s: {why}",
                failing.as_secs()
            )));
        }
        if let Some((failing, why)) = self.listing.lease_failing() {
            problems.push(json!(format!(
                "scale-out: the group's Leases cannot be listed for {}s (no cluster is taken or given up meanwhile): {why}",
                failing.as_secs()
            )));
        }
        let mut clusters = serde_json::Map::new();
        let mut held = Vec::new();
        let mut waiting = Vec::new();
        for (name, o) in self.parts() {
            if !o.leads() {
                waiting.push(name);
                continue;
            }
            let r = each(&o);
            if let Some(p) = r.body.get("problems").and_then(|p| p.as_array()) {
                problems.extend(p.iter().cloned());
            }
            clusters.insert(name.clone(), r.body);
            held.push(name);
        }
        let (view, assigned) = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let ok = problems.is_empty();
        Report {
            ok,
            body: json!({
                "status": if ok { "ok" } else { "failing" },
                "role": "scale-out",
                "identity": self.identity,
                "problems": problems,
                "held": held,
                "waiting_for_lease": waiting,
                "members": view.live,
                "members_lost": view.lost.iter().map(|(m, ago)| json!({"identity": m, "renewed_seconds_ago": ago.as_secs()})).collect::<Vec<_>>(),
                "other_members": view.others,
                "assigned": assigned.iter().filter(|(_, m)| **m == self.identity).map(|(c, _)| c.clone()).collect::<Vec<_>>(),
                "clusters": clusters,
            }),
        }
    }
}

impl Observed for Fleet {
    fn metrics(&self) -> (String, &'static str) {
        let parts = self.parts();
        let refs: Vec<&Observer> = parts.iter().map(|(_, o)| &**o).collect();
        self.metrics
            .member_lease_failing
            .set(i64::from(self.member.lease_failing().is_some()));
        Observer::merged(&refs, self.lists.clone(), self.watch_failure_timeout, |r| {
            self.metrics.register(r)
        })
        .metrics()
    }
    fn liveness(&self) -> Report {
        self.combine(Observer::liveness)
    }
    /// Ready when the membership Lease renews and every held cluster is (a replica that
    /// holds none is ready: it stands by).
    fn readiness(&self) -> Report {
        self.combine(Observer::readiness)
    }
}

/// Everything a unit's bridge is started from.
struct Launcher {
    /// The plan of the units' bridges: no HTTP server or summaries of their own.
    sub: Plan,
    /// `[leader_election]`: each unit's Lease is named after it.
    election: LeaderElectionConfig,
    specs: BTreeMap<String, UnitPlan>,
    clients: BTreeMap<String, Option<Client>>,
    sinks: Vec<Arc<dyn Sink>>,
    lease_client: Client,
    lease_cluster: String,
    group: String,
    lists: Arc<ListBudget>,
}

impl Launcher {
    /// Starts the bridge of cluster `name` (it waits for the cluster's Lease); `seen` is what
    /// the group's listing saw of that Lease (see [`Elector::seen`]).
    async fn hold(
        &self,
        name: &str,
        seen: Option<(String, String, Instant)>,
    ) -> anyhow::Result<Holding> {
        let spec = self
            .specs
            .get(name)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no [[clusters]] entry named {name:?}"))?;
        let client: Result<Client, ClusterError> =
            match self.clients.get(&spec.cluster.name).cloned().flatten() {
                Some(c) => Ok(c),
                None => crate::cluster::client(&spec.cluster).await,
            };
        let mut le = self.election.clone();
        le.lease_name = members::lease_name(&self.group, "cluster", name);
        let mut elector = Elector::new(self.lease_client.clone(), &le);
        if let Some((holder, record, at)) = seen {
            elector = elector.seen(holder, record, at);
        }
        let elector = elector.on_cluster(self.lease_cluster.clone()).marked(
            BTreeMap::from([
                (GROUP_LABEL.to_owned(), self.group.clone()),
                (ROLE_LABEL.to_owned(), "cluster".to_owned()),
            ]),
            BTreeMap::from([(CLUSTER_ANNOTATION.to_owned(), name.to_owned())]),
        );
        let shared = Shared {
            lists: Some(self.lists.clone()),
            multi: self.specs.len() > 1,
            sink_cluster: Some(name.to_owned()),
        };
        let mut bridge = bridge::launch(
            &self.sub,
            vec![spec],
            vec![client],
            self.sinks.clone(),
            Some(elector),
            shared,
        )
        .await?;
        bridge.release_code_pages();
        let lost = Box::pin(bridge.take_lost_leadership());
        Ok(Holding {
            bridge,
            lost,
            held: false,
        })
    }
}

/// Renews the membership Lease every `retry_period` until `stop`, apart from the work of
/// the main loop (starting a cluster's bridge must never delay a renewal). A replica that
/// went `renew_deadline` without renewing (its renewals failed, or the process was frozen) may
/// have been counted out by the others, who then took its clusters: it exits with
/// [`LOST_LEADERSHIP_EXIT`] rather than renew and pull them back (a restarted process joins
/// afresh, after `join_after`). Its clusters' fences close on their own (each bridge's Elector
/// renews its cluster's Lease, and stops emitting at its own deadline); the exit ends every
/// send in flight.
async fn renew_membership(
    membership: Membership,
    fleet: Arc<Fleet>,
    retry: Duration,
    renew_deadline: Duration,
    stop: CancellationToken,
) {
    let mut last_renewed = Instant::now();
    let mut tick = tokio::time::interval(retry);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if last_renewed.elapsed() >= renew_deadline {
            lost_membership(
                membership.lease(),
                "not renewed within leader_election.renew_deadline (the process was frozen, or its renewals failed)",
            );
        }
        let renewed = tokio::time::timeout(renew_deadline, membership.renew()).await;
        let why = match renewed {
            Ok(Ok(())) => {
                last_renewed = Instant::now();
                fleet.member.lease_attempt(Ok(()));
                continue;
            }
            Ok(Err(e)) => crate::cluster::error_chain(&e),
            Err(_) => "the API server did not answer in time".to_owned(),
        };
        fleet.member.lease_attempt(Err(why.clone()));
        if last_renewed.elapsed() >= renew_deadline {
            lost_membership(membership.lease(), &why);
        }
        tracing::warn!(lease = membership.lease(), error = %why, "renewing the membership Lease failed; retrying until leader_election.renew_deadline");
    }
}

/// Exits with [`LOST_LEADERSHIP_EXIT`]: the membership Lease was not renewed for
/// `renew_deadline`.
fn lost_membership(lease: &str, why: &str) -> ! {
    tracing::error!(%lease, error = %why, "the membership Lease could not be renewed for leader_election.renew_deadline: stopping every cluster at once without emitting more (exit {LOST_LEADERSHIP_EXIT}); the other replicas take them over");
    std::process::exit(LOST_LEADERSHIP_EXIT);
}

/// `kubesink run` with `leader_election.scale_out`: see the module. Runs until a signal,
/// then leaves the group (its membership Lease deleted, so the others reassign at once) and
/// hands every held cluster over (drain, save, release) within `pipeline.shutdown_timeout`.
///
/// # Errors
/// The Lease cluster's client, the sinks or the HTTP server cannot be built; [`Unclean`] when
/// a cluster's hand-over at shutdown was not clean. Exits the process with
/// [`LOST_LEADERSHIP_EXIT`] when the membership Lease cannot be renewed for `renew_deadline`.
pub async fn run(plan: Plan) -> anyhow::Result<()> {
    let Some(lease) = &plan.lease else {
        anyhow::bail!("scale-out needs leader_election.enabled: its units are held on Leases");
    };
    let le = &lease.election;
    let (retry, renew_deadline) = (le.retry_period.get(), le.renew_deadline.get());
    let Started {
        mut group,
        mut membership,
        sinks,
        cancel,
    } = start(&plan, lease).await?;
    let signal = bridge::shutdown_signal();
    tokio::pin!(signal);
    if !join(&mut membership, &group.fleet, retry, &mut signal).await {
        return Ok(());
    }
    let stop_renewing = CancellationToken::new();
    let renewing = tokio::spawn(renew_membership(
        membership.clone(),
        group.fleet.clone(),
        retry,
        renew_deadline,
        stop_renewing.clone(),
    ));
    let mut tick = tokio::time::interval(retry);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut signal => break,
            Some(done) = group.releasing.join_next() => {
                if let Ok((name, report)) = done {
                    group.released(&name, report);
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        group.step(&mut membership, renew_deadline).await;
    }
    // Shutdown: leave first, so the others start taking the clusters as each is released.
    tracing::info!("shutting down: leaving the group, handing every held cluster over");
    // The renewals stop first: one after the delete would create the Lease again.
    stop_renewing.cancel();
    let _ = renewing.await;
    membership.leave().await;
    let report = group.hand_over_all().await;
    for s in &sinks {
        if let Err(e) = tokio::time::timeout(plan.pipeline.shutdown_timeout.get(), s.close())
            .await
            .unwrap_or(Ok(()))
        {
            tracing::warn!(sink = s.name(), error = %e, "closing the sink failed");
        }
    }
    cancel.cancel();
    if !report.is_clean() {
        return Err(Unclean(report).into());
    }
    tracing::info!("shutdown complete: every held cluster handed over");
    Ok(())
}

/// A started member, before it joined: its group loop, its membership Lease, the sinks (closed
/// at its end) and the token that stops its HTTP server.
struct Started {
    group: Group,
    membership: Membership,
    sinks: Vec<Arc<dyn Sink>>,
    cancel: CancellationToken,
}

/// Phase 1: the clients (the Lease cluster's is required; the others' failures are each
/// held cluster's own), the membership Lease, the sinks, what each cluster's bridge is
/// started from, and the HTTP server.
///
/// # Errors
/// The Lease cluster's client, the sinks or the HTTP server cannot be built.
async fn start(plan: &Plan, lease: &LeasePlan) -> anyhow::Result<Started> {
    let le = &lease.election;
    let clusters: Vec<Cluster> = plan.clusters.iter().map(|u| u.cluster.clone()).collect();
    let clients = crate::cluster::clients(&clusters).await;
    let at = lease.at;
    let lease_cluster = clusters.get(at).map(|c| c.name.clone()).unwrap_or_default();
    let lease_client = match clients.get(at) {
        Some(Ok(c)) => c.clone(),
        Some(Err(e)) => anyhow::bail!(
            "{e}: cluster {lease_cluster:?} holds the scale-out Leases (leader_election.cluster), so kubesink cannot start without it"
        ),
        None => anyhow::bail!("no cluster to hold the scale-out Leases"),
    };
    for (c, r) in clusters.iter().zip(&clients) {
        if let Err(e) = r {
            tracing::error!(cluster = %c.name, error = %e, "this cluster's client cannot be built: when this replica holds it, its watches wait and retry (/readyz names them)");
        }
    }
    let identity = leader::identity(le);
    let group = le.lease_name.clone();
    let api: Api<Lease> = Api::namespaced(lease_client.clone(), &leader::namespace(le));
    // The units spread over the group: each cluster, or each shard of a cluster with
    // `shards > 1` (`Plan::units`); the clients are the clusters'.
    let names: Vec<String> = plan.units.iter().map(UnitPlan::unit).collect();
    let membership = Membership::new(
        api,
        &group,
        &identity,
        &names,
        (le.lease_duration.get(), le.renew_deadline.get()),
        le.join_after(),
    );
    let sinks = crate::sinks::build_all(plan.sinks.iter().map(|s| &s.config)).await?;
    let shared_sinks: Vec<Arc<dyn Sink>> = sinks
        .iter()
        .map(|s| Arc::new(SharedSink(s.clone())) as Arc<dyn Sink>)
        .collect();
    let launcher = Launcher {
        sub: plan.for_held_units(),
        election: le.clone(),
        specs: plan.units.iter().map(|u| (u.unit(), u.clone())).collect(),
        clients: clusters
            .iter()
            .zip(clients)
            .map(|(c, r)| (c.name.clone(), r.ok()))
            .collect(),
        sinks: shared_sinks,
        lease_client,
        lease_cluster,
        group: group.clone(),
        lists: Arc::new(ListBudget::new(plan.watch.max_concurrent_lists)),
    };
    let fleet = Arc::new(Fleet {
        parts: Mutex::default(),
        metrics: Metrics::default(),
        lists: launcher.lists.clone(),
        watch_failure_timeout: plan.server.watch_failure_timeout.get(),
        identity: identity.clone(),
        last: Mutex::default(),
        member: Leadership::default(),
        listing: Leadership::default(),
    });
    let cancel = CancellationToken::new();
    observe::server::serve_configured(&plan.server, fleet.clone(), cancel.clone()).await?;
    tracing::info!(clusters = %names.join(","), %identity, %group, membership = membership.lease(), "kubesink running (scale-out: clusters spread over the group's replicas)");
    Ok(Started {
        group: Group {
            plan: launcher,
            fleet,
            names,
            identity,
            holding: BTreeMap::new(),
            releasing: JoinSet::new(),
            in_release: Default::default(),
            others_seen: Vec::new(),
            unheld_since: BTreeMap::new(),
        },
        membership,
        sinks,
        cancel,
    })
}

/// Phase 2: joins before anything else. Until the membership Lease can be written, the
/// replica holds nothing and says why (/readyz, kubesink_scale_out_member_lease_failing), as
/// a follower that cannot reach the leader-election Lease does. `false` when `signal` came
/// first.
async fn join(
    membership: &mut Membership,
    fleet: &Fleet,
    retry: Duration,
    signal: &mut Pin<&mut impl Future<Output = ()>>,
) -> bool {
    let mut warned: Option<Instant> = None;
    loop {
        let e = tokio::select! {
            _ = signal.as_mut() => return false,
            r = membership.renew() => match r {
                Ok(()) => break,
                Err(e) => crate::cluster::error_chain(&e),
            },
        };
        fleet.member.lease_attempt(Err(e.clone()));
        if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            warned = Some(Instant::now());
            tracing::warn!(lease = membership.lease(), error = %e, "cannot create or renew the membership Lease; retrying (logged again once a minute while it fails)");
        }
        tokio::time::sleep(retry).await;
    }
    fleet.member.lease_attempt(Ok(()));
    true
}

/// Phase 3, the group loop's state: what this member holds, hands over and has seen.
struct Group {
    plan: Launcher,
    fleet: Arc<Fleet>,
    /// The units spread over the group.
    names: Vec<String>,
    identity: String,
    holding: BTreeMap<String, Holding>,
    /// The hand-overs under way, each ending with its cluster's shutdown report.
    releasing: JoinSet<(String, ShutdownReport)>,
    in_release: std::collections::BTreeSet<String>,
    /// The live members with another cluster list, last warned about.
    others_seen: Vec<String>,
    /// Since when each unit has had no holder.
    unheld_since: BTreeMap<String, Instant>,
}

impl Group {
    /// A hand-over ended.
    fn released(&mut self, name: &str, report: ShutdownReport) {
        self.in_release.remove(name);
        if report.is_clean() {
            tracing::info!(cluster = %name, "cluster handed over: drained, saved, Lease given up");
        } else {
            tracing::warn!(cluster = %name, report = %Unclean(report), "cluster handed over, not cleanly: its next holder sends again what was not confirmed");
        }
    }

    /// One look, every `retry_period` (steps 2 to 5 of the module's list).
    async fn step(&mut self, membership: &mut Membership, renew_deadline: Duration) {
        self.drop_lost();
        let Some(view) = self.look(membership, renew_deadline).await else {
            return;
        };
        if view.others != self.others_seen {
            if !view.others.is_empty() {
                let group = &self.plan.group;
                tracing::warn!(others = %view.others.join(","), "live members of this group ({group}) have another cluster list: each list's members share only their own clusters, so a cluster of one list waits for a member of that list; give each configuration its own leader_election.lease_name, and finish rolling updates that change [[clusters]]");
            }
            self.others_seen = view.others.clone();
        }
        let assigned = assign::assign(&self.names, view.assignees(), &view.holders);
        self.release_unassigned(&assigned);
        self.hold_assigned(&assigned, &view).await;
        self.record(view, assigned);
    }

    /// Step 2, lost Leases: the bridge's fence is closed already; drop it now.
    fn drop_lost(&mut self) {
        let lost: Vec<String> = self
            .holding
            .iter_mut()
            .filter_map(|(name, h)| h.lost.as_mut().now_or_never().map(|why| (name, why)))
            .map(|(name, why)| {
                tracing::error!(cluster = %name, error = %why, "lost the cluster's Lease: stopped emitting it at once; its next holder sends what was not confirmed");
                name.clone()
            })
            .collect();
        for name in lost {
            if let Some(h) = self.holding.remove(&name) {
                self.fleet.metrics.moved("lost");
                self.in_release.insert(name.clone());
                self.releasing
                    .spawn(async move { (name, h.bridge.abandon().await) });
            }
        }
    }

    /// Step 3, the group's Leases listed; `None` while that fails (nothing is taken or given
    /// up then, the clusters held stay held).
    async fn look(&self, membership: &mut Membership, renew_deadline: Duration) -> Option<View> {
        let listed = tokio::time::timeout(renew_deadline, membership.view()).await;
        match listed {
            Ok(Ok(v)) => {
                self.fleet.listing.lease_attempt(Ok(()));
                Some(v)
            }
            failed => {
                let why = match failed {
                    Ok(Err(e)) => crate::cluster::error_chain(&e),
                    _ => "the API server did not answer in time".to_owned(),
                };
                let first = self.fleet.listing.lease_failing().is_none();
                self.fleet.listing.lease_attempt(Err(why.clone()));
                if first {
                    tracing::warn!(error = %why, "listing the group's Leases failed: no cluster is taken or given up until it works again (the clusters held stay held); retrying every retry_period, /readyz says so");
                } else {
                    tracing::debug!(error = %why, "listing the group's Leases failed; retrying");
                }
                None
            }
        }
    }

    /// Step 4a: hands over what is no longer ours.
    fn release_unassigned(&mut self, assigned: &BTreeMap<String, String>) {
        let leaving: Vec<String> = self
            .holding
            .keys()
            .filter(|c| assigned.get(*c) != Some(&self.identity))
            .cloned()
            .collect();
        for name in leaving {
            if let Some(h) = self.holding.remove(&name) {
                let to = assigned.get(&name).cloned().unwrap_or_default();
                tracing::info!(cluster = %name, to = %to, "cluster assigned to another member: handing it over");
                // Held at some time, though perhaps only between two looks.
                if h.held || h.bridge.observed().leads() {
                    if !h.held {
                        self.fleet.metrics.moved("acquired");
                    }
                    self.fleet.metrics.moved("released");
                }
                self.in_release.insert(name.clone());
                self.releasing
                    .spawn(async move { (name, h.bridge.shutdown_report().await) });
            }
        }
    }

    /// Step 4b: starts holding what is ours (each bridge waits for its cluster's Lease).
    async fn hold_assigned(&mut self, assigned: &BTreeMap<String, String>, view: &View) {
        for (name, member) in assigned {
            if *member != self.identity
                || self.holding.contains_key(name)
                || self.in_release.contains(name)
            {
                continue;
            }
            match self.plan.hold(name, view.seen.get(name).cloned()).await {
                Ok(h) => {
                    tracing::info!(cluster = %name, "cluster assigned to this replica: taking its Lease");
                    self.holding.insert(name.clone(), h);
                }
                Err(e) => {
                    tracing::error!(cluster = %name, error = %e, "cannot start the cluster's watches; retrying at the next period")
                }
            }
        }
    }

    /// Step 5: what the metrics and /readyz say.
    fn record(&mut self, view: View, assigned: BTreeMap<String, String>) {
        let metrics = &self.fleet.metrics;
        let mut held = 0;
        for (name, h) in self.holding.iter_mut() {
            let now = h.bridge.observed().leads();
            if now && !h.held {
                metrics.moved("acquired");
                tracing::info!(cluster = %name, "holding the cluster's Lease: watching and emitting it");
            }
            h.held = now;
            held += i64::from(now);
        }
        metrics.held.set(held);
        metrics.members.set(view.live.len() as i64);
        metrics.lost.set(view.lost.len() as i64);
        for name in &self.names {
            let label = vec![("cluster".to_owned(), name.clone())];
            let mine = self.holding.get(name).is_some_and(|h| h.held);
            metrics
                .cluster_held
                .get_or_create(&label)
                .set(i64::from(mine));
            let holder = view.holders.get(name).cloned().flatten();
            let unheld = if holder.is_some() || mine {
                self.unheld_since.remove(name);
                0.0
            } else {
                self.unheld_since
                    .entry(name.clone())
                    .or_insert_with(Instant::now)
                    .elapsed()
                    .as_secs_f64()
            };
            metrics.unheld.get_or_create(&label).set(unheld);
            match view.renewed.get(name) {
                Some(ago) => {
                    metrics.renewed.get_or_create(&label).set(ago.as_secs_f64());
                }
                None => {
                    metrics.renewed.remove(&label);
                }
            }
        }
        *self
            .fleet
            .parts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = self
            .holding
            .iter()
            .map(|(k, h)| (k.clone(), h.bridge.observed().clone()))
            .collect();
        *self
            .fleet
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (view, assigned);
    }

    /// Phase 4: hands every held cluster over (drain, save, release), waits for the
    /// hand-overs under way, and merges their reports.
    async fn hand_over_all(mut self) -> ShutdownReport {
        let mut reports = Vec::new();
        let handovers = std::mem::take(&mut self.holding)
            .into_iter()
            .map(|(name, h)| async move { (name, h.bridge.shutdown_report().await) });
        for (name, report) in futures::future::join_all(handovers).await {
            if !report.is_clean() {
                tracing::warn!(cluster = %name, report = %Unclean(report.clone()), "the cluster's hand-over was not clean");
            }
            reports.push(report);
        }
        while let Some(done) = self.releasing.join_next().await {
            if let Ok((_, report)) = done {
                reports.push(report);
            }
        }
        ShutdownReport::merge(reports)
    }
}
