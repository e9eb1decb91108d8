//! Configuration: the structs are the reference, `config/kubesink.toml` shows every option
//! with the same words, and a test keeps the two in step.
//!
//! Layers, later wins: built-in defaults < TOML file (`--config PATH` or `KUBESINK_CONFIG`) <
//! environment variables `KUBESINK_…` with `__` for nesting (`KUBESINK_CLUSTER__NAME=prod`,
//! `KUBESINK_PIPELINE__LINGER=50ms`). Loading collects every problem it can find; each names
//! the key and where its value came from (see [`ConfigError`]).
//!
//! One file per section, each type beside the checks serde cannot express (`problems()`):
//! `cluster.rs` (`[cluster]`, `[[clusters]]` and the resolved [`Cluster`]), `resource.rs`
//! (`[[resources]]`), `sections.rs` (`[leader_election]`, `[pipeline]`, `[watch]`,
//! `[server]`, `[log]`), `state.rs` (`[state]`, the registered backends' sections checked
//! through their trait), the destinations' own (`[[sinks]]`, in their crates); `syntax.rs`
//! the Kubernetes name syntax they share; `load.rs` the layers, the per-section extraction
//! and the order the checks run in; `warn.rs` what works but is risky.
//!
//! This module never touches the network: it only reads and checks.

mod cluster;
mod env;
mod expressions;
mod group;
mod load;
mod probe;
mod problems;
mod resource;
mod sections;
mod state;
mod syntax;
#[cfg(test)]
mod tests;
mod warn;
mod words;

use serde::{Deserialize, Serialize};

pub use crate::sinks::SinkConfig;
pub use cluster::{Cluster, ClusterConfig, ClusterEntry};
pub use env::{is_service_link, service_link_variables};
pub use expressions::Expressions;
pub use group::{excludes_group, group_name, GroupSelector, ServedKind};
pub use kubesink_core::shard::{Shard, MAX_SHARDS};
pub use kubesink_core::units::{ByteSize, HumanDuration};
pub(crate) use load::describe_source;
pub use load::{load, load_resources, load_with_partial, ConfigError, ConfigErrors, PLACEHOLDER};
pub use resource::{Enrich, PayloadMode, ResourceConfig, ResourceMode, Since};
pub use sections::{
    InitialList, LeaderElectionConfig, LogConfig, PipelineConfig, ServerConfig, WatchConfig,
    WireEncoding, DEFAULT_MAX_CONCURRENT_LISTS, MAX_CONCURRENT_LISTS, MIN_REQUESTS_PER_SECOND,
};
pub use state::{context as state_context, StateBackend, StateConfig};
pub use warn::{missing_files, warnings, MissingFile, GROUP_ALIASES};

/// The whole configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Which cluster to watch and how it is labelled (the single-cluster form).
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// Several clusters in one process, one `[[clusters]]` entry each (instead of
    /// `[cluster]`). Default: none.
    #[serde(default)]
    pub clusters: Vec<ClusterEntry>,
    /// Leader election between replicas (only the leader watches and emits).
    #[serde(default)]
    pub leader_election: LeaderElectionConfig,
    /// The batching and backpressure stage between informers and sinks.
    #[serde(default)]
    pub pipeline: PipelineConfig,
    /// How informers keep their lists and watches going.
    #[serde(default)]
    pub watch: WatchConfig,
    /// The HTTP server: metrics and health.
    #[serde(default)]
    pub server: ServerConfig,
    /// Logging beyond the command line's format and level.
    #[serde(default)]
    pub log: LogConfig,
    /// The resources to watch, one `[[resources]]` entry each. Default: Pods, Deployments,
    /// Nodes and Services (the topology core).
    #[serde(default = "default_resources")]
    pub resources: Vec<ResourceConfig>,
    /// Destinations, one `[[sinks]]` entry each. Default: one stdout sink.
    #[serde(default = "default_sinks")]
    pub sinks: Vec<SinkConfig>,
    /// Where the acknowledged informer state is kept between runs. Default: nowhere.
    #[serde(default)]
    pub state: StateConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cluster: ClusterConfig::default(),
            clusters: Vec::new(),
            leader_election: LeaderElectionConfig::default(),
            pipeline: PipelineConfig::default(),
            watch: WatchConfig::default(),
            server: ServerConfig::default(),
            log: LogConfig::default(),
            resources: default_resources(),
            sinks: default_sinks(),
            state: StateConfig::default(),
        }
    }
}

impl Config {
    /// The JSON Schema (draft-07) of the configuration file, generated from these types (their
    /// doc comments are the descriptions, serde's names and defaults the keys): what
    /// `config/kubesink.schema.json` holds for editors (TOML language servers such as taplo
    /// read JSON Schema) and the Helm chart's `values.schema.json` checks `config` against.
    /// A test keeps both files in step with it. It knows types, names and allowed values; the
    /// checks across keys are `kubesink check`'s.
    pub fn json_schema() -> serde_json::Value {
        let generator = schemars::generate::SchemaSettings::draft07().into_generator();
        let mut schema = serde_json::Value::from(generator.into_root_schema_for::<Config>());
        if let Some(root) = schema.as_object_mut() {
            root.insert(
                "title".into(),
                "kubesink configuration (kubesink.toml)".into(),
            );
        }
        schema
    }

    /// The effective configuration as TOML, as `kubesink check` prints it (secrets masked),
    /// in a form that loads again: each registered backend's `[state.NAME]` table is left
    /// out unless that is the backend (its settings without it are an error).
    ///
    /// # Errors
    /// When the configuration cannot be written as TOML.
    pub fn to_effective_toml(&self) -> Result<String, toml::ser::Error> {
        let mut value = toml::Value::try_from(self)?;
        if let Some(toml::Value::Table(state)) = value.get_mut("state") {
            let backend = self.state.backend.name();
            for (other, _) in self.state.sections() {
                if other != backend {
                    state.remove(other);
                }
            }
        }
        toml::to_string_pretty(&value)
    }
}

impl Config {
    /// What a state backend's section sees of this configuration
    /// ([`StateBackendConfig`](kubesink_core::state::StateBackendConfig)): the sinks as their
    /// destinations', the clusters' names, whether leader election is on, and `identity`
    /// (this replica's, when a store is opened; empty for the checks).
    pub fn state_context(&self, identity: String) -> kubesink_core::state::StateContext<'_> {
        let clusters = self.clusters().into_iter().map(|c| c.name).collect();
        state::context(
            &self.sinks,
            clusters,
            self.leader_election.enabled,
            identity,
        )
    }
}

/// The top-level keys (the sections), as [`Config`] names its fields; a test keeps the two in
/// step.
pub(crate) const SECTIONS: &[&str] = &[
    "cluster",
    "clusters",
    "leader_election",
    "pipeline",
    "watch",
    "server",
    "log",
    "resources",
    "sinks",
    "state",
];

fn default_resources() -> Vec<ResourceConfig> {
    vec![
        ResourceConfig::new("v1", "Pod"),
        ResourceConfig::new("apps/v1", "Deployment"),
        ResourceConfig::new("v1", "Node"),
        ResourceConfig::new("v1", "Service"),
    ]
}

/// One stdout sink; none in a build without the `stdout` feature (the configuration must
/// then name its sinks).
fn default_sinks() -> Vec<SinkConfig> {
    #[cfg(feature = "stdout")]
    return vec![SinkConfig::Stdout(Default::default())];
    #[cfg(not(feature = "stdout"))]
    Vec::new()
}
