//! Wiring: configuration → client → discovery → saved state → informers → pipeline → sinks,
//! and the orderly shutdown (stop the watches, flush within `pipeline.shutdown_timeout`,
//! close, save the acknowledged state).

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kubesink_sinks::backoff::Backoff;
use kubesink_sinks::Sink;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cluster::{self, ClusterError};
use crate::config::Config;
use crate::informer::{Decider, Informer, InformerStats, WatchPlan};
use crate::pipeline::Pipeline;
use crate::state::{self, Keeper, Kept, SaveReport, StateError, WatchKey};

/// The readiness probe's retries: 1 s doubling to 30 s.
const PROBE: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// A running bridge: informers feeding the pipeline, and the keeper of their state.
pub struct Bridge {
    pipeline: Pipeline,
    informers: JoinSet<()>,
    cancel: CancellationToken,
    stats: Vec<(String, Arc<InformerStats>)>,
    shutdown_timeout: Duration,
    /// The state keeper and its interval task (with `[state]`).
    keeper: Option<(Arc<Keeper>, CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Bridge {
    /// Resolves every configured resource, plans one watch per (resource, namespace), loads
    /// the saved state (`[state]`; a bad state is logged and ignored per watch), starts the
    /// pipeline over `sinks` with a readiness probe for each, one informer per plan, and the
    /// state keeper.
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
        let keys: Vec<WatchKey> = plans
            .iter()
            .map(|p| WatchKey {
                identity: p.identity(),
                selection: p.selection,
            })
            .collect();
        let store = state::open(&config.state, &config.cluster.name);
        let mut restored = match &store {
            Some(s) => state::restore(&**s, &config.cluster.name, &keys).await,
            None => Vec::new(),
        };
        restored.resize_with(plans.len(), || None);
        let pipeline = Pipeline::start(&config.pipeline, sinks);
        let mut informers = JoinSet::new();
        let mut stats = Vec::new();
        let mut kept = Vec::new();
        for ((plan, key), saved) in plans.into_iter().zip(keys).zip(restored) {
            let decider = decider(&plan, saved, store.is_some(), config.pipeline.sync_markers);
            kept.push(Kept {
                key,
                store: decider.tracked(),
            });
            let informer = Informer::with_decider(plan, client.clone(), decider);
            stats.push((informer.label(), informer.stats()));
            informers.spawn(informer.run(pipeline.publisher(), cancel.clone()));
        }
        let keeper = store.map(|s| {
            let keeper = Keeper::new(s, &config.cluster.name, kept);
            let stop = CancellationToken::new();
            let task = keeper.spawn(config.state.interval.get(), stop.clone());
            (keeper, stop, task)
        });
        Ok(Bridge {
            pipeline,
            informers,
            cancel,
            stats,
            shutdown_timeout: config.pipeline.shutdown_timeout.get(),
            keeper,
        })
    }

    /// Saves the acknowledged state now (with `[state]`; `None` without). For tests and
    /// measurements; the bridge saves by itself on `state.interval` and at shutdown.
    pub async fn save_state(&self) -> Option<Result<SaveReport, StateError>> {
        let (keeper, _, _) = self.keeper.as_ref()?;
        Some(keeper.save(true).await.map(Option::unwrap_or_default))
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
    /// the sinks, then saves the acknowledged state (what was not delivered stays out of it,
    /// so the next start sends it). Returns the number of changes not delivered in time.
    pub async fn shutdown(mut self) -> usize {
        self.cancel.cancel();
        while self.informers.join_next().await.is_some() {}
        let left = self.pipeline.shutdown(self.shutdown_timeout).await;
        if let Some((keeper, stop, task)) = self.keeper.take() {
            stop.cancel();
            let _ = task.await;
            match keeper.save(true).await {
                Ok(r) => {
                    let r = r.unwrap_or_default();
                    tracing::info!(store = keeper.describe(), objects = r.objects, bytes = r.bytes, pack = ?r.pack, write = ?r.write, "informer state saved at shutdown");
                }
                Err(e) => {
                    tracing::error!(store = keeper.describe(), error = %e, "saving the informer state at shutdown failed; the next start re-sends what changed since the last save")
                }
            }
        }
        left
    }
}

/// The decider of `plan`: from `saved` state when there is some, tracking acknowledgements
/// when a state store is configured, with sync markers when asked.
fn decider(
    plan: &WatchPlan,
    saved: Option<crate::informer::LightStore>,
    track: bool,
    sync_markers: bool,
) -> Decider {
    let (resource, scope, shaper) = (plan.resource.clone(), plan.scope(), plan.shaper.clone());
    let mut d = match saved {
        Some(store) => Decider::with_store(resource, scope, shaper, plan.updates, store),
        None => Decider::new(resource, scope, shaper, plan.updates),
    };
    if track {
        d = d.track_acknowledgements();
    }
    if sync_markers {
        d = d.with_sync_markers(plan.namespace.clone());
    }
    d
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
