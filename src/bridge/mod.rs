//! One bridge, started from its part of the plan (`crate::plan::Plan`; `launch.rs`): clients →
//! saved state → discovery → informers → pipeline → sinks, the observers (metrics, health,
//! summaries), leader election, and the orderly shutdown:
//! stop the watches, flush, close the sinks, save the acknowledged state, give the lease up
//! and wait for the tasks, all within one deadline, `pipeline.shutdown_timeout` counted from
//! the signal ([`Bridge::shutdown_report`]); what does not fit is abandoned and named, and
//! `kubesink run` exits non-zero ([`Unclean`] and its exit codes).
//!
//! Start-up never waits for an API server: each configured resource of each cluster is
//! resolved (API discovery) by its own task, retried with backoff while the server is
//! unreachable or the kind is not served, and its informers start when it resolves. So one
//! cluster that is down, or one CRD not installed yet, delays nothing else; each shows in
//! `/readyz` and the metrics until it works.
//!
//! The saved state is read when this replica starts watching (`watching.rs`): at once, or,
//! with leader election, when it becomes the leader, so a replica that took over starts from
//! the state its predecessor saved up to the hand-over, not from what was saved when it
//! started waiting. A follower never saves.

mod groups;
mod launch;
pub(crate) use launch::launch;
mod planned;
mod routes;
pub use routes::explain as explain_routes;
mod watching;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kubesink_core::Sink;

use planned::Keepers;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::{self, ClusterError};
use crate::config::Cluster;
use crate::informer::{InformerStats, ListBudget};
use crate::leader::{Elector, Lost};
use crate::observe::{self, Observer};
use crate::pipeline::Pipeline;
use crate::plan::Plan;
use crate::state::{Keeper, SaveReport, StateError};

/// Why the bridge could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A cluster's client could not be built.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The HTTP server could not listen (`server.listen` not an address, or not free).
    #[error(transparent)]
    Listen(#[from] observe::server::ListenError),
    /// Not one client per configured cluster.
    #[error("{clusters} clusters configured but {clients} clients given")]
    Clients {
        /// Configured clusters.
        clusters: usize,
        /// Clients given.
        clients: usize,
    },
}

/// What a shutdown could not finish ([`Bridge::shutdown_report`]).
#[derive(Debug, Clone, Default)]
pub struct ShutdownReport {
    /// Changes not delivered: held by the sinks' queues (pending or in flight) when the
    /// drain's deadline passed, or by a sink whose worker had panicked; summed over the sinks.
    pub undelivered: usize,
    /// The sinks whose worker had panicked.
    pub panicked: Vec<String>,
    /// What the deadline cut off after the drain, in words (`the final save of the informer
    /// state to ...`, `giving up the leader lease`, `waiting for N background tasks`).
    pub abandoned: Vec<String>,
    /// `pipeline.shutdown_timeout`.
    pub timeout: Duration,
}

impl ShutdownReport {
    /// The reports of several bridges (a scale-out replica's, one per cluster) as one.
    pub fn merge(reports: impl IntoIterator<Item = ShutdownReport>) -> ShutdownReport {
        reports
            .into_iter()
            .fold(ShutdownReport::default(), |mut all, r| {
                all.undelivered += r.undelivered;
                all.panicked.extend(r.panicked);
                all.abandoned.extend(r.abandoned);
                all.timeout = all.timeout.max(r.timeout);
                all
            })
    }

    /// Everything delivered and done within the deadline.
    pub fn is_clean(&self) -> bool {
        self.undelivered == 0 && self.panicked.is_empty() && self.abandoned.is_empty()
    }

    /// The process's exit code: 0 when clean; else the gravest of [`WORKER_PANICKED_EXIT`],
    /// 1 (changes undelivered) and [`SHUTDOWN_ABANDONED_EXIT`], in that order.
    pub fn exit_code(&self) -> i32 {
        if !self.panicked.is_empty() {
            WORKER_PANICKED_EXIT
        } else if self.undelivered > 0 {
            1
        } else if !self.abandoned.is_empty() {
            SHUTDOWN_ABANDONED_EXIT
        } else {
            0
        }
    }
}

/// `kubesink run` stopped uncleanly: a sink's worker had panicked, changes were left
/// undelivered, or the deadline cut off the final save, the lease release or the wait for
/// the tasks. The process exits with [`ShutdownReport::exit_code`].
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.0))]
pub struct Unclean(pub ShutdownReport);

fn describe(r: &ShutdownReport) -> String {
    let timeout = humantime::format_duration(r.timeout);
    let mut parts = Vec::new();
    if !r.panicked.is_empty() {
        parts.push(format!(
            "the worker of sink {} had panicked (a bug; it delivered nothing more)",
            r.panicked.join(", ")
        ));
    }
    if r.undelivered > 0 {
        parts.push(format!("{} changes were not delivered within pipeline.shutdown_timeout = {timeout}; they are sent again after the next start (saved state), or with its full list", r.undelivered));
    }
    if !r.abandoned.is_empty() {
        parts.push(format!(
            "pipeline.shutdown_timeout = {timeout} passed before the shutdown was done; abandoned: {}",
            r.abandoned.join("; ")
        ));
    }
    parts.join("; ")
}

/// The share of `pipeline.shutdown_timeout` the drain leaves to what follows it (the final
/// save, the lease release, the tasks): a fifth. A dead sink makes the drain take all it is
/// given, while the steps after it take milliseconds when their stores answer and cost much
/// when skipped (the restart repeats what changed since the last save; a successor waits for
/// the lease to expire).
const AFTER_DRAIN_SHARE: u32 = 5;

/// What the bridges of one scale-out replica share (one bridge per cluster it holds,
/// `scale_out.rs`); the default for a bridge of its own.
#[derive(Clone, Default)]
pub(crate) struct Shared {
    /// The process's budget of lists in flight (without: the bridge makes its own from
    /// `watch.max_concurrent_lists`).
    pub lists: Option<Arc<ListBudget>>,
    /// Name the watches and the saved state as a configuration of several clusters does,
    /// although this bridge runs one of them (so a move between replicas, or a switch from
    /// one leader to scale-out, finds the same state keys).
    pub multi: bool,
    /// Label this bridge's sink queues with its cluster (each held cluster has its own).
    pub sink_cluster: Option<String>,
}

/// A running bridge: informers feeding the pipeline, observed.
pub struct Bridge {
    pipeline: Pipeline,
    tasks: TaskTracker,
    cancel: CancellationToken,
    stats: Vec<(String, Arc<InformerStats>)>,
    observed: Arc<Observer>,
    server: Option<SocketAddr>,
    shutdown_timeout: Duration,
    lost: Option<oneshot::Receiver<Lost>>,
    /// Cancelled after the pipeline drained: the leader then gives its lease up.
    release: CancellationToken,
    /// With leader election: cancelled once the leader task ended (its lease given up, or
    /// never held).
    released: Option<CancellationToken>,
    /// One state keeper per cluster that started watching (with `[state]`), registered once
    /// its state was restored; the token that stops their interval saves; the token that
    /// stops the journal writers (after the pipeline drained).
    keepers: Keepers,
    stop_saving: CancellationToken,
    stop_journals: CancellationToken,
}

impl Bridge {
    /// [`Bridge::start_with`] for the single cluster of `plan` through `client`, without
    /// leader election.
    ///
    /// # Errors
    /// As [`Bridge::start_with`].
    pub async fn start(
        plan: &Plan,
        client: Client,
        sinks: Vec<Arc<dyn Sink>>,
    ) -> Result<Bridge, StartError> {
        Bridge::start_with(plan, vec![client], sinks, None).await
    }

    /// Starts the pipeline over `sinks` (a continuous readiness probe each), the HTTP server
    /// (`[server]`) and the summaries (`[log]`), and the watches of every unit of `plan`
    /// (`clients` in [`Plan::units`] order): at once, or, with an `elector`, once this
    /// replica leads.
    ///
    /// # Errors
    /// [`StartError`] when the server cannot listen or the clients do not match the units.
    pub async fn start_with(
        plan: &Plan,
        clients: Vec<Client>,
        sinks: Vec<Arc<dyn Sink>>,
        elector: Option<Elector>,
    ) -> Result<Bridge, StartError> {
        let clients = clients.into_iter().map(Ok).collect();
        Bridge::start_built(plan, clients, sinks, elector).await
    }

    /// [`Bridge::start_with`] for the clients [`clients`] built (or could not build): a
    /// cluster whose client could not be built is that cluster's problem. Its watches show
    /// the error (`/readyz` names them) and its client is built again with the `[watch]`
    /// backoff until it can be; the other clusters do not wait for it.
    ///
    /// # Errors
    /// As [`Bridge::start_with`].
    pub async fn start_built(
        plan: &Plan,
        clients: Vec<Result<Client, ClusterError>>,
        sinks: Vec<Arc<dyn Sink>>,
        elector: Option<Elector>,
    ) -> Result<Bridge, StartError> {
        launch::launch(
            plan,
            plan.units.clone(),
            clients,
            sinks,
            elector,
            Shared::default(),
        )
        .await
    }

    /// The keepers registered so far.
    fn keepers(&self) -> Vec<Arc<Keeper>> {
        self.keepers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Saves the acknowledged state now (with `[state]`; `None` without): every cluster's,
    /// reported together. For tests and measurements; the bridge saves by itself on
    /// `state.interval` and at shutdown.
    pub async fn save_state(&self) -> Option<Result<SaveReport, StateError>> {
        let keepers = self.keepers();
        if keepers.is_empty() {
            return None;
        }
        let mut total = SaveReport::default();
        for k in &keepers {
            match k.save(true).await {
                Ok(r) => {
                    let r = r.unwrap_or_default();
                    total.objects += r.objects;
                    total.unconfirmed += r.unconfirmed;
                    total.bytes += r.bytes;
                    total.pack += r.pack;
                    total.longest_lock = total.longest_lock.max(r.longest_lock);
                    total.write += r.write;
                    total.journal_drop += r.journal_drop;
                }
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(total))
    }

    /// The pipeline (queues and sink counters).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Each watch's name (`apiVersion Kind (scope)`, prefixed by the cluster when there are
    /// several) and counters.
    pub fn informer_stats(&self) -> &[(String, Arc<InformerStats>)] {
        &self.stats
    }

    /// Gives the start-up's code pages back to the kernel now, and the initial sync's once
    /// every watch of this bridge synced ([`crate::code_pages::release_after_sync`]), in a
    /// task of its own.
    pub fn release_code_pages(&self) {
        let watches = self.stats.iter().map(|(_, s)| s.clone()).collect();
        tokio::spawn(crate::code_pages::release_after_sync(watches));
    }

    /// Metrics and health.
    pub fn observed(&self) -> &Arc<Observer> {
        &self.observed
    }

    /// Where the HTTP server listens, when enabled.
    pub fn server_addr(&self) -> Option<SocketAddr> {
        self.server
    }

    /// `pipeline.shutdown_timeout`.
    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }

    /// A future that resolves when this replica loses its leadership, while running or
    /// while shutting down (until the lease is given up); it never resolves without leader
    /// election, or once the lease was given up. Taken once: the bridge keeps no other.
    pub fn take_lost_leadership(&mut self) -> impl std::future::Future<Output = Lost> {
        let lost = self.lost.take();
        async move {
            match lost {
                Some(rx) => match rx.await {
                    Ok(lost) => lost,
                    Err(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        }
    }

    /// Stops at once, without delivering what is pending (counted as undelivered) or waiting
    /// for a save: for a bridge whose lease was lost (its fence is closed: it could neither
    /// send nor save anyway; the next holder sends what it held, scale-out).
    pub(crate) async fn abandon(mut self) -> ShutdownReport {
        self.shutdown_timeout = Duration::ZERO;
        self.shutdown_report().await
    }

    /// [`Bridge::shutdown_report`], returning only the number of changes not delivered (a
    /// panicked sink worker's included).
    pub async fn shutdown(self) -> usize {
        self.shutdown_report().await.undelivered
    }

    /// Shuts down within one deadline, `pipeline.shutdown_timeout` from now: stops the
    /// watches, delivers what is pending and closes the sinks (until four fifths of the
    /// deadline at most: what follows has at least a fifth), then saves the acknowledged
    /// state (the final save, after any save still running), gives the lease up (after the
    /// save, so a successor reads it) and waits for the tasks. A step the deadline cuts off is
    /// abandoned: logged at ERROR with what it costs, and listed in the report.
    pub async fn shutdown_report(self) -> ShutdownReport {
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        let drain_deadline = deadline - self.shutdown_timeout / AFTER_DRAIN_SHARE;
        self.cancel.cancel();
        self.tasks.close();
        let keepers = self.keepers();
        let drained = self.pipeline.drain(drain_deadline).await;
        let mut abandoned = Vec::new();
        // What was not delivered stays out of the saved state (or in it as unconfirmed, for
        // a new key): the next start sends it.
        self.stop_saving.cancel();
        let saves = keepers
            .iter()
            .map(|k| async move { tokio::time::timeout_at(deadline, k.final_save()).await });
        let saved = futures::future::join_all(saves).await;
        for (keeper, saved) in keepers.iter().zip(saved) {
            match saved {
                Ok(Ok(r)) => {
                    let r = r.unwrap_or_default();
                    tracing::info!(store = keeper.describe(), objects = r.objects, unconfirmed = r.unconfirmed, bytes = r.bytes, pack = ?r.pack, write = ?r.write, "informer state saved at shutdown");
                }
                Ok(Err(e)) => {
                    tracing::error!(store = keeper.describe(), error = %e, "saving the informer state at shutdown failed; the next start re-sends what changed since the last save");
                }
                Err(_) => {
                    let what = if keeper.waiting() > 0 {
                        "waiting for an earlier save that was still storing"
                    } else {
                        "storing"
                    };
                    tracing::error!(store = keeper.describe(), running_for = ?keeper.running_for(), "shutdown deadline passed: abandoned the final save of the informer state ({what}; the state store did not answer in time); the next start re-sends what changed since the last save that landed");
                    abandoned.push(format!(
                        "the final save of the informer state to {}",
                        keeper.describe()
                    ));
                }
            }
        }
        // The journals outlive the pipeline (its sends wait for them) and the final save.
        self.stop_journals.cancel();
        // The lease is given up only after the pipeline drained (the leader still emits
        // while it drains, and keeps renewing) and the state was saved.
        self.release.cancel();
        if let Some(released) = &self.released {
            if tokio::time::timeout_at(deadline, released.cancelled())
                .await
                .is_err()
            {
                tracing::error!("shutdown deadline passed: abandoned giving up the leader lease (the API server did not answer in time); a successor takes over once it expires (leader_election.lease_duration)");
                abandoned.push("giving up the leader lease".to_owned());
            }
        }
        if tokio::time::timeout_at(deadline, self.tasks.wait())
            .await
            .is_err()
        {
            let left = self.tasks.len();
            tracing::error!(tasks = left, "shutdown deadline passed: abandoned waiting for the background tasks (watches, probes, state journal writers) to stop");
            abandoned.push(format!("waiting for {left} background tasks to stop"));
        }
        ShutdownReport {
            undelivered: drained.undelivered,
            panicked: drained.panicked,
            abandoned,
            timeout: self.shutdown_timeout,
        }
    }
}

/// Resolves when SIGINT (Ctrl-C) or SIGTERM arrives. The handlers are installed when it is
/// called, not when it is first awaited: a signal that comes while the process starts
/// (clients, sinks connecting) is kept for it, where the default action killed the process
/// (exit 143; found by scripts/chaos.sh, seed 73289's replay: a replica restarted after
/// losing its Lease was sent SIGTERM while it started). Call it from the runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let handlers = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        if let (Some(mut term), Some(mut int)) = handlers {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The exit code after losing leadership: the process must stop emitting at once, and a new
/// one starts as a follower.
pub const LOST_LEADERSHIP_EXIT: i32 = 3;

/// The exit code after a shutdown in which a sink's worker had panicked (a bug): delivery to
/// that sink had stopped; what it held is sent again after the next start.
pub const WORKER_PANICKED_EXIT: i32 = 4;

/// The exit code after a shutdown whose deadline cut off the final save, the lease release
/// or the wait for the tasks (everything was delivered).
pub const SHUTDOWN_ABANDONED_EXIT: i32 = 5;

/// Everything before the bridge runs: the clients, the leader election, the sinks, the
/// launch (state restored, watches planned). Returns the bridge, the clusters' names, the
/// number of sinks and whether leader election is on.
async fn start(plan: &Plan) -> anyhow::Result<(Bridge, Vec<String>, usize, bool)> {
    let clusters: Vec<Cluster> = plan.units.iter().map(|u| u.cluster.clone()).collect();
    let clients = cluster::clients(&clusters).await;
    // The Lease's cluster first: without it nothing can start, so the other clusters'
    // problems are not logged as if the fleet went on. The Lease decides whether this
    // replica may watch at all: without its cluster's client there is nothing to retry
    // towards, so the start fails.
    let lease = match &plan.lease {
        None => None,
        Some(lease) => {
            let name = clusters
                .get(lease.at)
                .map(|c| c.name.clone())
                .unwrap_or_default();
            match clients.get(lease.at) {
                Some(Ok(client)) => Some((client.clone(), name, &lease.election)),
                Some(Err(e)) => anyhow::bail!(
                    "{e}: cluster {name:?} holds the leader-election Lease (leader_election.cluster), so kubesink cannot start without it"
                ),
                None => anyhow::bail!("no cluster to hold the lease"),
            }
        }
    };
    let clients = cluster::usable(&clusters, clients).map_err(|e| -> anyhow::Error {
        if clusters.len() > 1 {
            anyhow::anyhow!("{e}; no cluster's client could be built (all {} failed), so kubesink cannot start (one failing among others is retried while the others run)", clusters.len())
        } else {
            e.into()
        }
    })?;
    let elector =
        lease.map(|(client, name, election)| Elector::new(client, election).on_cluster(name));
    let sinks = crate::sinks::build_all(plan.sinks.iter().map(|s| &s.config)).await?;
    let names: Vec<String> = clusters.iter().map(|c| c.name.clone()).collect();
    let (sink_count, leader_election) = (plan.sinks.len(), plan.lease.is_some());
    let bridge = launch::launch(
        plan,
        plan.units.clone(),
        clients,
        sinks,
        elector,
        Shared::default(),
    )
    .await?;
    Ok((bridge, names, sink_count, leader_election))
}

/// One bridge for every configured cluster until a signal, then a shutdown within
/// `pipeline.shutdown_timeout`. Exits the process with [`LOST_LEADERSHIP_EXIT`] when
/// leadership is lost.
///
/// # Errors
/// Client construction, server start or sink construction failures; [`Unclean`] (with its
/// exit code) when the shutdown was not clean.
pub async fn run(plan: Plan) -> anyhow::Result<()> {
    let stop = shutdown_signal();
    tokio::pin!(stop);
    let (mut bridge, names, sink_count, leader_election) = tokio::select! {
        started = start(&plan) => started?,
        _ = &mut stop => {
            // Nothing was sent yet that a next start would not send again.
            tracing::info!("stopped while starting");
            return Ok(());
        }
    };
    tracing::info!(clusters = %names.join(","), sinks = sink_count, leader_election, "kubesink running");
    bridge.release_code_pages();
    let lost = bridge.take_lost_leadership();
    tokio::pin!(lost);
    tokio::select! {
        _ = &mut stop => {}
        lost = &mut lost => {
            tracing::error!(error = %lost, "lost leadership: stopping at once without emitting more (exit {LOST_LEADERSHIP_EXIT}); the replacement process starts as a follower");
            std::process::exit(LOST_LEADERSHIP_EXIT);
        }
    }
    tracing::info!("shutting down: stopping watches, flushing sinks");
    // A leader that loses the lease while it drains stops at once too: its fence
    // is closed, so nothing more can be sent or saved, and waiting out
    // `pipeline.shutdown_timeout` would only hold the Pod.
    let report = tokio::select! {
        report = bridge.shutdown_report() => report,
        lost = &mut lost => {
            tracing::error!(error = %lost, "lost leadership while shutting down: stopping at once; what was not delivered is sent by the next leader (exit {LOST_LEADERSHIP_EXIT})");
            std::process::exit(LOST_LEADERSHIP_EXIT);
        }
    };
    if !report.is_clean() {
        return Err(Unclean(report).into());
    }
    tracing::info!("shutdown complete: every change delivered");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_names_the_gravest_way_a_shutdown_was_not_clean() {
        let clean = ShutdownReport {
            timeout: Duration::from_secs(10),
            ..Default::default()
        };
        assert!(clean.is_clean());
        assert_eq!(clean.exit_code(), 0);
        let abandoned = ShutdownReport {
            abandoned: vec!["giving up the leader lease".into()],
            ..clean.clone()
        };
        assert_eq!(abandoned.exit_code(), SHUTDOWN_ABANDONED_EXIT);
        let undelivered = ShutdownReport {
            undelivered: 3,
            ..abandoned.clone()
        };
        assert_eq!(undelivered.exit_code(), 1);
        let panicked = ShutdownReport {
            panicked: vec!["nats".into()],
            ..undelivered.clone()
        };
        assert_eq!(panicked.exit_code(), WORKER_PANICKED_EXIT);
        assert_eq!(
            Unclean(panicked).to_string(),
            "the worker of sink nats had panicked (a bug; it delivered nothing more); 3 changes \
             were not delivered within pipeline.shutdown_timeout = 10s; they are sent again \
             after the next start (saved state), or with its full list; \
             pipeline.shutdown_timeout = 10s passed before the shutdown was done; abandoned: \
             giving up the leader lease"
        );
    }
}
