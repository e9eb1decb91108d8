//! Wiring: configuration → client → discovery → informers → pipeline → sinks, and the
//! orderly shutdown (stop the watches, flush within `pipeline.shutdown_timeout`, close).

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kubesink_sinks::backoff::Backoff;
use kubesink_sinks::Sink;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cluster::{self, ClusterError};
use crate::config::Config;
use crate::informer::{Informer, InformerStats, WatchPlan};
use crate::pipeline::Pipeline;

/// The readiness probe's retries: 1 s doubling to 30 s.
const PROBE: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// A running bridge: informers feeding the pipeline.
pub struct Bridge {
    pipeline: Pipeline,
    informers: JoinSet<()>,
    cancel: CancellationToken,
    stats: Vec<(String, Arc<InformerStats>)>,
    shutdown_timeout: Duration,
}

impl Bridge {
    /// Resolves every configured resource, plans one watch per (resource, namespace), starts
    /// the pipeline over `sinks` with a readiness probe for each, and one informer per plan.
    ///
    /// # Errors
    /// [`ClusterError`] when a resource cannot be resolved.
    pub async fn start(
        config: &Config,
        client: Client,
        sinks: Vec<Arc<dyn Sink>>,
    ) -> Result<Bridge, ClusterError> {
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
        for sink in &sinks {
            tokio::spawn(probe_until_ready(sink.clone(), cancel.clone()));
        }
        let pipeline = Pipeline::start(&config.pipeline, sinks);
        let mut informers = JoinSet::new();
        let mut stats = Vec::new();
        for plan in plans {
            let informer = Informer::new(plan, client.clone(), &config.watch);
            stats.push((informer.label(), informer.stats()));
            informers.spawn(informer.run(pipeline.publisher(), cancel.clone()));
        }
        Ok(Bridge {
            pipeline,
            informers,
            cancel,
            stats,
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

    /// Stops the watches, delivers what is pending within `pipeline.shutdown_timeout`, closes
    /// the sinks. Returns the number of changes not delivered in time.
    pub async fn shutdown(mut self) -> usize {
        self.cancel.cancel();
        while self.informers.join_next().await.is_some() {}
        self.pipeline.shutdown(self.shutdown_timeout).await
    }
}

/// Runs a sink's healthcheck at start-up until it passes (with [`PROBE`] backoff), logging
/// each failure as "not ready", then "ready". Delivery does not wait for it: the pipeline
/// retries until the destination accepts.
async fn probe_until_ready(sink: Arc<dyn Sink>, cancel: CancellationToken) {
    let probe = kubesink_sinks::backoff::retry(
        PROBE,
        || sink.healthcheck(),
        |_| true,
        |e, delay| tracing::warn!(sink = sink.name(), error = %e, retry_in = ?delay, "sink not ready yet; changes wait in the pipeline"),
    );
    tokio::select! {
        _ = cancel.cancelled() => {}
        res = probe => if res.is_ok() {
            tracing::info!(sink = sink.name(), "sink ready");
        },
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

/// `kubesink run`: runs the bridge until a signal, then shuts down cleanly.
///
/// # Errors
/// Cluster connection, discovery or sink construction failures.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let client = cluster::client(&config.cluster).await?;
    let sinks = build_sinks(&config).await?;
    let bridge = Bridge::start(&config, client, sinks).await?;
    tracing::info!(cluster = %config.cluster.name, resources = config.resources.len(), sinks = config.sinks.len(), "kubesink running");
    shutdown_signal().await;
    tracing::info!("shutting down: stopping watches, flushing sinks");
    let left = bridge.shutdown().await;
    if left == 0 {
        tracing::info!("shutdown complete");
    }
    Ok(())
}
