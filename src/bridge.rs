//! Wiring: configuration → client → discovery → informers → pipeline → sinks, and the
//! orderly shutdown (stop the watches, flush within `pipeline.shutdown_timeout`, close).
//!
//! API discovery at start-up: a resource whose kind the server does not serve (or a
//! cluster-scoped kind with `namespaces`) stops the start with an error naming the entry. A
//! resource whose discovery fails for now (connection failure, 429, 5xx: the API server is
//! starting, or one aggregated API group is down) does not hold the others back: they start,
//! and its discovery is retried in the background with the `[watch]` backoff until it
//! succeeds, then its watches start. Meanwhile its watches show in `/readyz` (not synced, with
//! the discovery error), in the metrics (`kubesink_discovery_errors_total`) and, past
//! `server.watch_failure_timeout`, in `/healthz`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use kubesink_sinks::backoff::Backoff;
use kubesink_sinks::{Resource, Sink};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cluster::{self, ClusterError};
use crate::config::{Config, ResourceConfig, WatchConfig};
use crate::informer::{FailureKind, Informer, InformerStats, WatchPlan};
use crate::observe::{self, Observed, SinkEntry, WatchEntry};
use crate::pipeline::{Pipeline, Publisher};

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
    /// plan, the HTTP server (`[server]`) and the periodic summary (`[log]`). A resource
    /// whose discovery fails for now is resolved in the background (see the module docs).
    ///
    /// # Errors
    /// [`StartError`] when a resource is not served or misconfigured, or the server cannot
    /// listen.
    pub async fn start(
        config: &Config,
        client: Client,
        sinks: Vec<Arc<dyn Sink>>,
    ) -> Result<Bridge, StartError> {
        let mut plans = Vec::new();
        let mut deferred = Vec::new();
        for (i, res) in config.resources.iter().enumerate() {
            match cluster::resolve(&client, &config.cluster.name, i, res).await {
                Ok(r) => plans.extend(WatchPlan::expand(
                    res,
                    r.resource,
                    r.api_resource,
                    &config.cluster.label,
                )),
                Err(e) if e.is_transient() => {
                    tracing::warn!(cluster = %config.cluster.name, resource = %res.display_name(), "{e}; starting the other resources and retrying this one in the background");
                    deferred.push(i);
                }
                Err(e) => return Err(e.into()),
            }
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
        for index in deferred {
            let later = Deferred::new(config, client.clone(), index);
            for (namespace, s) in later.watches() {
                let scope = namespace.as_deref().map_or_else(
                    || "all namespaces".to_owned(),
                    |ns| format!("namespace {ns}"),
                );
                stats.push((format!("{} ({scope})", later.resource), s.clone()));
                watches.push(WatchEntry {
                    resource: later.resource.clone(),
                    namespace,
                    stats: s,
                });
            }
            informers.spawn(later.run(pipeline.publisher(), cancel.clone()));
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

    /// Stops the watches, delivers what is pending within `pipeline.shutdown_timeout`, closes
    /// the sinks. Returns the number of changes not delivered in time.
    pub async fn shutdown(mut self) -> usize {
        self.cancel.cancel();
        while self.informers.join_next().await.is_some() {}
        self.pipeline.shutdown(self.shutdown_timeout).await
    }
}

/// A resource whose API discovery failed transiently at start-up: resolved in the
/// background, then its watches start (see the module docs).
struct Deferred {
    client: Client,
    cluster: String,
    label_key: String,
    index: usize,
    res: ResourceConfig,
    watch: WatchConfig,
    /// Until discovery names its plural and scope: `apiVersion` and `kind` as configured.
    resource: Arc<Resource>,
    /// One per planned watch (namespace, or all), in [`WatchPlan::expand`]'s order.
    stats: Vec<Arc<InformerStats>>,
}

impl Deferred {
    fn new(config: &Config, client: Client, index: usize) -> Self {
        let res = config.resources[index].clone();
        let (group, version) = res
            .api_version
            .split_once('/')
            .unwrap_or(("", res.api_version.as_str()));
        let resource = Arc::new(Resource::new(
            &config.cluster.name,
            group,
            version,
            &res.kind,
            "",
            true,
        ));
        let watches = res.namespaces.len().max(1);
        Deferred {
            client,
            cluster: config.cluster.name.clone(),
            label_key: config.cluster.label.clone(),
            index,
            watch: config.watch.clone(),
            resource,
            stats: (0..watches).map(|_| Arc::default()).collect(),
            res,
        }
    }

    /// (namespace, counters) of each watch to come.
    fn watches(&self) -> Vec<(Option<String>, Arc<InformerStats>)> {
        let namespaces: Vec<Option<String>> = if self.res.namespaces.is_empty() {
            vec![None]
        } else {
            self.res.namespaces.iter().cloned().map(Some).collect()
        };
        namespaces.into_iter().zip(self.stats.clone()).collect()
    }

    /// Retries discovery with the `[watch]` backoff until it succeeds (then runs the
    /// watches until `cancel`) or `cancel` fires.
    async fn run(self, publisher: Publisher, cancel: CancellationToken) {
        for s in &self.stats {
            s.running.store(true, Ordering::Relaxed);
        }
        let resolved = tokio::select! {
            _ = cancel.cancelled() => None,
            r = self.resolve() => r,
        };
        let Some(r) = resolved else {
            // Cancelled, or misconfigured (logged): nothing will run.
            cancel.cancelled().await;
            for s in &self.stats {
                s.running.store(false, Ordering::Relaxed);
            }
            return;
        };
        tracing::info!(cluster = %self.cluster, resource = %self.res.display_name(), "API discovery succeeded; starting its watches");
        let plans = WatchPlan::expand(&self.res, r.resource, r.api_resource, &self.label_key);
        let mut informers = JoinSet::new();
        for (plan, stats) in plans.into_iter().zip(self.stats.iter().cloned()) {
            let informer = Informer::with_stats(plan, self.client.clone(), &self.watch, stats);
            informers.spawn(informer.run(publisher.clone(), cancel.clone()));
        }
        while informers.join_next().await.is_some() {}
    }

    /// Discovery, retried; `None` when the entry turns out misconfigured (logged).
    async fn resolve(&self) -> Option<cluster::Resolved> {
        let policy = Backoff::new(
            self.watch.retry_initial_backoff.get(),
            self.watch.retry_max_backoff.get(),
        );
        let mut delays = policy.delays();
        let mut last_warn: Option<Instant> = None;
        loop {
            let e = match cluster::resolve(&self.client, &self.cluster, self.index, &self.res).await
            {
                Ok(r) => return Some(r),
                Err(e) => e,
            };
            for s in &self.stats {
                s.discovery_errors.fetch_add(1, Ordering::Relaxed);
                s.errors.fetch_add(1, Ordering::Relaxed);
                s.set_failure(FailureKind::Broken, e.to_string());
            }
            if matches!(e, ClusterError::ClusterScoped { .. }) {
                tracing::error!(cluster = %self.cluster, resource = %self.res.display_name(), "{e}; this resource is not watched");
                return None;
            }
            let wait = delays.next().unwrap_or(policy.max);
            // Logged once a minute at most: the retries go on at debug.
            if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                last_warn = Some(Instant::now());
                tracing::warn!(cluster = %self.cluster, resource = %self.res.display_name(), retry_in = ?wait, "{e}; retrying in the background");
            } else {
                tracing::debug!(cluster = %self.cluster, resource = %self.res.display_name(), retry_in = ?wait, "{e}; retrying in the background");
            }
            tokio::time::sleep(wait).await;
        }
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
    crate::limits::prepare(&config);
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
