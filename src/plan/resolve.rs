//! [`resolve`]: the configuration turned, once, into the [`Plan`] that runs. Each layer
//! below the binary's edge takes only its part of the plan: the bridge its units, sinks
//! and settings, the informer each resource's compiled filter and change paths, the
//! pipeline its settings, the leader election its Lease, the state store its section.
//! Nothing below this module sees [`Config`].

use std::sync::Arc;

use crate::config::{
    Cluster, Config, LeaderElectionConfig, LogConfig, PipelineConfig, ResourceConfig, ServerConfig,
    SinkConfig, WatchConfig,
};
use crate::informer::{ChangePaths, Filter, FilterCompileError, FilterPlace};
use crate::state::StatePlan;

/// What runs: the configuration resolved once by [`resolve`].
#[derive(Clone, Debug)]
pub struct Plan {
    /// The configured clusters in order (`[[clusters]]`, or the single `[cluster]`), each
    /// with its resources compiled: the clients are built for these.
    pub clusters: Vec<UnitPlan>,
    /// What is watched: the clusters, or with scale-out each shard of a cluster with
    /// `shards > 1` ([`Config::units`]; the same compiled resources).
    pub units: Vec<UnitPlan>,
    /// The sinks in order, each with its filter compiled.
    pub sinks: Vec<SinkPlan>,
    /// With `leader_election.enabled`: the Lease and the cluster holding it.
    pub lease: Option<LeasePlan>,
    /// `leader_election.scale_out` (with leader election on): the units spread over a
    /// group of replicas.
    pub scale_out: bool,
    /// `[pipeline]`.
    pub pipeline: PipelineConfig,
    /// `[watch]`.
    pub watch: WatchConfig,
    /// `[state]` and what a backend takes from the rest of the configuration.
    pub state: StatePlan,
    /// `[server]`.
    pub server: ServerConfig,
    /// `[log]`.
    pub log: LogConfig,
}

/// One cluster, or one shard of it (a unit of scale-out), with its resources.
#[derive(Clone, Debug)]
pub struct UnitPlan {
    /// The cluster (with its shard, for a unit of a sharded cluster).
    pub cluster: Cluster,
    /// Its resources in configuration order, compiled.
    pub resources: Vec<ResourcePlan>,
}

impl UnitPlan {
    /// Its name as a unit ([`Cluster::unit`]).
    pub fn unit(&self) -> String {
        self.cluster.unit()
    }
}

/// One configured resource with what the configuration says of it in other languages
/// compiled: its CEL filter and its JSONPath change paths. Compiled once per resource and
/// shared by every watch of it (each namespace, each cluster's copy is its own).
#[derive(Clone, Debug)]
pub struct ResourcePlan {
    /// The `[[resources]]` entry.
    pub config: ResourceConfig,
    /// Its compiled `filter`; `None`: every object.
    pub filter: Option<Arc<Filter>>,
    /// Its compiled `change_paths`, `ignore_changes` and `change_values`.
    pub changes: Arc<ChangePaths>,
    /// A watch the owner index adds (`informer::owners::index_resources`): it fills the
    /// index and sends nothing, keeps no saved state.
    pub index_only: bool,
}

impl ResourcePlan {
    /// For a group-form entry, the entry of one kind discovery found (`ar`,
    /// [`ResourceConfig::for_kind`]), the compiled filter and change paths shared.
    pub fn for_kind(&self, ar: &kube::discovery::ApiResource, namespaced: bool) -> ResourcePlan {
        ResourcePlan {
            config: self
                .config
                .for_kind(&ar.api_version, &ar.kind, &ar.plural, namespaced),
            filter: self.filter.clone(),
            changes: self.changes.clone(),
            index_only: false,
        }
    }
}

/// One `[[sinks]]` entry with its filter compiled.
#[derive(Clone, Debug)]
pub struct SinkPlan {
    /// The entry.
    pub config: SinkConfig,
    /// Its compiled `filter`, naming the sink in its errors; `None`: everything.
    pub filter: Option<Arc<Filter>>,
}

impl SinkPlan {
    /// The sink's name.
    pub fn name(&self) -> &str {
        self.config.name()
    }
}

/// The leader-election Lease.
#[derive(Clone, Debug)]
pub struct LeasePlan {
    /// `[leader_election]`.
    pub election: LeaderElectionConfig,
    /// The index in [`Plan::clusters`] of the cluster holding the Lease
    /// (`leader_election.cluster`, else the first).
    pub at: usize,
}

/// A filter that does not compile: what [`resolve`] refuses (loading the configuration
/// through [`crate::plan::load`] reports it first, with its source).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A resource's `filter`.
    #[error("{key}.filter {shown}: {error}")]
    Resource {
        /// `resources.N` or `clusters.N.resources.M`.
        key: String,
        /// The filter as shown in messages.
        shown: String,
        /// Why it does not compile.
        error: FilterCompileError,
    },
    /// A sink's `filter`.
    #[error("sinks.{index}.filter (sink {name:?}) {shown}: {error}")]
    Sink {
        /// The entry's position in `sinks`.
        index: usize,
        /// The sink's name.
        name: String,
        /// The filter as shown in messages.
        shown: String,
        /// Why it does not compile.
        error: FilterCompileError,
    },
}

/// Resolves `config` into the [`Plan`] that runs: the units (clusters × shards with
/// scale-out), the Lease's cluster, each resource's compiled filter and change paths, each
/// sink's compiled filter, the state store's section. Never touches the network.
///
/// # Errors
/// [`PlanError`] for the first filter that does not compile.
pub fn resolve(config: &Config) -> Result<Plan, PlanError> {
    let le = &config.leader_election;
    let scale_out = le.enabled && le.scale_out;
    let clusters = config
        .clusters()
        .into_iter()
        .enumerate()
        .map(|(i, cluster)| {
            // Where its resources are configured: its own list, or the shared one.
            let own = config
                .clusters
                .get(i)
                .is_some_and(|c| c.resources.is_some());
            let at = match own {
                true => format!("{}.resources", cluster.key),
                false => "resources".to_owned(),
            };
            let mut resources: Vec<ResourcePlan> = cluster
                .resources
                .iter()
                .enumerate()
                .map(|(j, r)| resource(r, &format!("{at}.{j}")))
                .collect::<Result<_, _>>()?;
            // The owner index's own watches, after the configured ones.
            for r in crate::informer::index_resources(&cluster.resources) {
                resources.push(ResourcePlan {
                    changes: Arc::new(ChangePaths::of_resource(&r)),
                    config: r,
                    filter: None,
                    index_only: true,
                });
            }
            Ok(UnitPlan { cluster, resources })
        })
        .collect::<Result<Vec<_>, PlanError>>()?;
    // A bridge watches whole clusters; only a scale-out group splits one into shards.
    // Each unit ([`Config::units`]) shares its cluster's compiled resources (cluster names
    // are unique).
    let units = match scale_out {
        false => clusters.clone(),
        true => config
            .units()
            .into_iter()
            .map(|cluster| UnitPlan {
                resources: clusters
                    .iter()
                    .find(|u| u.cluster.name == cluster.name)
                    .map(|u| u.resources.clone())
                    .unwrap_or_default(),
                cluster,
            })
            .collect(),
    };
    let sinks = config
        .sinks
        .iter()
        .enumerate()
        .map(|(index, s)| sink(s, index))
        .collect::<Result<Vec<_>, _>>()?;
    let lease = le.enabled.then(|| LeasePlan {
        election: le.clone(),
        at: le
            .cluster
            .as_ref()
            .and_then(|name| clusters.iter().position(|c| &c.cluster.name == name))
            .unwrap_or(0),
    });
    let names = clusters.iter().map(|u| u.cluster.name.clone()).collect();
    Ok(Plan {
        clusters,
        units,
        sinks,
        lease,
        scale_out,
        pipeline: config.pipeline.clone(),
        watch: config.watch.clone(),
        state: StatePlan {
            config: config.state.clone(),
            sinks: config.sinks.clone(),
            identity: crate::leader::identity(le),
            clusters: names,
            leader_election: le.enabled,
        },
        server: config.server.clone(),
        log: config.log.clone(),
    })
}

/// Compiles one resource's filter and change paths.
fn resource(r: &ResourceConfig, key: &str) -> Result<ResourcePlan, PlanError> {
    let filter = match r.filter.as_deref() {
        None => None,
        Some(expr) => Some(Arc::new(Filter::compile(expr).map_err(|error| {
            PlanError::Resource {
                key: key.to_owned(),
                shown: Filter::shown(expr),
                error,
            }
        })?)),
    };
    Ok(ResourcePlan {
        config: r.clone(),
        filter,
        changes: Arc::new(ChangePaths::of_resource(r)),
        index_only: false,
    })
}

/// Compiles one sink's filter.
#[cfg_attr(
    not(any(
        feature = "stdout",
        feature = "nats",
        feature = "kafka",
        feature = "http",
        feature = "otlp"
    )),
    allow(unreachable_code, unused_variables) // no destination: `SinkConfig` is uninhabited
)]
fn sink(s: &SinkConfig, index: usize) -> Result<SinkPlan, PlanError> {
    let filter = match s.filter() {
        None => None,
        Some(expr) => {
            let f =
                Filter::compile_for(expr, FilterPlace::Sink).map_err(|error| PlanError::Sink {
                    index,
                    name: s.name().to_owned(),
                    shown: Filter::shown(expr),
                    error,
                })?;
            Some(Arc::new(f.of_sink(s.name())))
        }
    };
    Ok(SinkPlan {
        config: s.clone(),
        filter,
    })
}

impl Plan {
    /// How many watches the plan opens: one per resource of each unit and listed namespace
    /// (one for all namespaces, or the cluster scope, when none is listed).
    pub fn watches(&self) -> u64 {
        self.units
            .iter()
            .flat_map(|u| &u.resources)
            .map(|r| r.config.namespaces.len().max(1) as u64)
            .sum()
    }

    /// The plan a scale-out member starts each held unit's bridge from: this one without
    /// an HTTP server or summaries of its own (the member serves them for all its units).
    pub fn for_held_units(&self) -> Plan {
        let mut sub = self.clone();
        sub.server.enabled = false;
        sub.log.summary_interval = kubesink_core::units::HumanDuration(std::time::Duration::ZERO);
        sub
    }
}
