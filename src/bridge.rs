//! Wiring: configuration → client → discovery → informers → pipeline → sinks, and the
//! orderly shutdown: stop the watches, flush, close the sinks, all of it within
//! `pipeline.shutdown_timeout` counted from the signal; `kubesink run` then exits non-zero
//! when changes were left undelivered ([`Undelivered`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kubesink_sinks::Sink;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cluster::{self, ClusterError};
use crate::config::Config;
use crate::informer::{Informer, InformerStats, WatchPlan};
use crate::observe::{self, Observed, SinkEntry, WatchEntry};
use crate::pipeline::Pipeline;

/// Why the bridge could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A resource could not be resolved.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The HTTP server could not listen.
    #[error(transparent)]
    Serve(#[from] observe::ServeError),
}

/// `kubesink run` stopped with changes that were not delivered before the shutdown
/// deadline (`pipeline.shutdown_timeout`): the process exits non-zero.
#[derive(Debug, thiserror::Error)]
#[error("{count} changes were not delivered within pipeline.shutdown_timeout = {}; the next start lists every resource again", humantime::format_duration(*.timeout))]
pub struct Undelivered {
    /// Changes held by the sinks' queues (pending or in flight) at the deadline, summed over
    /// the sinks.
    pub count: usize,
    /// The deadline that passed.
    pub timeout: Duration,
}

/// A running bridge: informers feeding the pipeline, observed.
pub struct Bridge {
    pipeline: Pipeline,
    informers: JoinSet<()>,
    cancel: CancellationToken,
    stats: Vec<(String, Arc<InformerStats>)>,
    observed: Arc<Observed>,
    server: Option<SocketAddr>,
    shutdown_timeout: Duration,
}

impl Bridge {
    /// Resolves every configured resource, plans one watch per (resource, namespace), starts
    /// the pipeline over `sinks` with a continuous readiness probe for each, one informer per
    /// plan, the HTTP server (`[server]`) and the periodic summary (`[log]`).
    ///
    /// # Errors
    /// [`StartError`] when a resource cannot be resolved or the server cannot listen.
    pub async fn start(
        config: &Config,
        client: Client,
        sinks: Vec<Arc<dyn Sink>>,
    ) -> Result<Bridge, StartError> {
        let mut plans = Vec::new();
        for (i, res) in config.resources.iter().enumerate() {
            let r = cluster::resolve(&client, &config.cluster.name, i, res).await?;
            plans.extend(WatchPlan::expand(
                res,
                r.resource,
                r.api_resource,
                &config.cluster.label,
            ));
        }
        let cancel = CancellationToken::new();
        let pipeline = Pipeline::start(&config.pipeline, sinks);
        for h in pipeline.sinks() {
            tokio::spawn(observe::probe_sink(
                h.clone(),
                config.server.sink_check_interval.get(),
                cancel.clone(),
            ));
        }
        let mut informers = JoinSet::new();
        let mut stats = Vec::new();
        let mut watches = Vec::new();
        for plan in plans {
            watches.push(WatchEntry {
                resource: plan.resource.clone(),
                namespace: plan.namespace.clone(),
                stats: Arc::new(InformerStats::default()),
            });
            let informer = Informer::new(plan, client.clone(), &config.watch);
            if let Some(w) = watches.last_mut() {
                w.stats = informer.stats();
            }
            stats.push((informer.label(), informer.stats()));
            informers.spawn(informer.run(pipeline.publisher(), cancel.clone()));
        }
        let sink_entries = pipeline
            .sinks()
            .iter()
            .map(|h| SinkEntry { handle: h.clone() })
            .collect();
        let observed = Arc::new(Observed::new(
            watches,
            sink_entries,
            config.server.watch_failure_timeout.get(),
        ));
        let server = if config.server.enabled {
            let addr: SocketAddr =
                config
                    .server
                    .listen
                    .parse()
                    .map_err(|e| observe::ServeError {
                        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                    })?;
            Some(observe::serve(addr, observed.clone(), cancel.clone()).await?)
        } else {
            None
        };
        let every = config.log.summary_interval.get();
        if !every.is_zero() {
            tokio::spawn(observed.clone().log_summaries(every, cancel.clone()));
        }
        Ok(Bridge {
            pipeline,
            informers,
            cancel,
            stats,
            observed,
            server,
            shutdown_timeout: config.pipeline.shutdown_timeout.get(),
        })
    }

    /// The pipeline (queues and sink counters).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Each informer's name (`apiVersion Kind (scope)`) and counters.
    pub fn informer_stats(&self) -> &[(String, Arc<InformerStats>)] {
        &self.stats
    }

    /// Metrics and health.
    pub fn observed(&self) -> &Arc<Observed> {
        &self.observed
    }

    /// Where the HTTP server listens, when enabled.
    pub fn server_addr(&self) -> Option<SocketAddr> {
        self.server
    }

    /// Stops the watches, delivers what is pending and closes the sinks, all within
    /// `pipeline.shutdown_timeout` from now. Returns the number of changes not delivered in
    /// time.
    pub async fn shutdown(mut self) -> usize {
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        self.cancel.cancel();
        let informers = async { while self.informers.join_next().await.is_some() {} };
        if tokio::time::timeout_at(deadline, informers).await.is_err() {
            tracing::warn!("shutdown deadline passed while stopping the watches");
            self.informers.abort_all();
        }
        self.pipeline.shutdown(deadline).await
    }

    /// `pipeline.shutdown_timeout`.
    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }
}

/// Builds the configured sinks.
///
/// # Errors
/// The first sink that cannot be built, naming its entry.
pub async fn build_sinks(
    config: &Config,
) -> Result<Vec<Arc<dyn Sink>>, kubesink_sinks::SinkConfigError> {
    let mut sinks = Vec::new();
    for (i, s) in config.sinks.iter().enumerate() {
        sinks.push(s.build(i).await?);
    }
    Ok(sinks)
}

/// Resolves when SIGINT (Ctrl-C) or SIGTERM arrives.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// `kubesink run`: runs the bridge until a signal, then shuts down within
/// `pipeline.shutdown_timeout`.
///
/// # Errors
/// Cluster connection, discovery or sink construction failures; [`Undelivered`] when the
/// shutdown left changes undelivered.
pub async fn run(config: Config) -> anyhow::Result<()> {
    for w in crate::config::warnings(&config) {
        tracing::warn!("configuration: {w}");
    }
    let client = cluster::client(&config.cluster).await?;
    let sinks = build_sinks(&config).await?;
    let bridge = Bridge::start(&config, client, sinks).await?;
    tracing::info!(cluster = %config.cluster.name, resources = config.resources.len(), sinks = config.sinks.len(), "kubesink running");
    shutdown_signal().await;
    tracing::info!("shutting down: stopping watches, flushing sinks");
    let timeout = bridge.shutdown_timeout();
    let left = bridge.shutdown().await;
    if left > 0 {
        return Err(Undelivered {
            count: left,
            timeout,
        }
        .into());
    }
    tracing::info!("shutdown complete: every change delivered");
    Ok(())
}
