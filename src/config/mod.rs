//! Configuration: the structs are the reference, `config/kubesink.toml` shows every option
//! with the same words, and a test keeps the two in step.
//!
//! Layers, later wins: built-in defaults < TOML file (`--config PATH` or `KUBESINK_CONFIG`) <
//! environment variables `KUBESINK_…` with `__` for nesting (`KUBESINK_CLUSTER__NAME=prod`,
//! `KUBESINK_PIPELINE__LINGER=50ms`). Loading collects every problem it can find; each names
//! the key and where its value came from (see [`ConfigError`]).
//!
//! This module never touches the network: it only reads and checks.

mod load;
mod state;
#[cfg(test)]
mod tests;
mod warn;

use serde::{Deserialize, Serialize};

pub use crate::destinations::SinkConfig;
pub use kubesink_core::units::{ByteSize, HumanDuration};
pub(crate) use load::describe_source;
pub use load::{load, load_resources, ConfigError, ConfigErrors};
#[cfg(feature = "nats")]
pub use state::StateNatsConfig;
pub use state::{StateBackend, StateConfig};
pub use warn::{warnings, GROUP_ALIASES};

/// The whole configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
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

/// `[cluster]`: the connection and the label every message carries.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Required. The cluster's name: the `cluster` field of every message and the value of the
    /// cluster label merged into every object. Must be a valid Kubernetes label value
    /// (at most 63 characters of `[A-Za-z0-9._-]`, starting and ending alphanumeric).
    #[serde(default)]
    pub name: String,
    /// The label key merged into `object.metadata.labels` of every emitted object.
    /// Default `kubesink.io/cluster`.
    #[serde(default = "default_cluster_label")]
    pub label: String,
    /// Path to a kubeconfig file. Default: in-cluster service account when running in a Pod,
    /// else `KUBECONFIG`, else `~/.kube/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context to use. Default: the kubeconfig's current context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            name: String::new(),
            label: default_cluster_label(),
            kubeconfig: None,
            context: None,
        }
    }
}

/// One `[[clusters]]` entry: a cluster of a multi-cluster process. Each has its own client,
/// its own watches and its own name on every message; one that is unreachable or forbids
/// access does not stop the others.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterEntry {
    /// Required. The cluster's name (as `cluster.name`).
    pub name: String,
    /// Kubeconfig file. Default: in-cluster service account, else `KUBECONFIG` /
    /// `~/.kube/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context. Default: the kubeconfig's current context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// This cluster's resources. Default: the top-level `[[resources]]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<ResourceConfig>>,
}

/// A cluster to watch, resolved from `[cluster]` or one `[[clusters]]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Name on every message and in the cluster label.
    pub name: String,
    /// The label key merged into every object (`cluster.label`).
    pub label: String,
    /// Kubeconfig file, if any.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context, if any.
    pub context: Option<String>,
    /// Its resources.
    pub resources: Vec<ResourceConfig>,
}

impl ClusterSpec {
    /// The connection settings in the `[cluster]` form.
    pub fn connection(&self) -> ClusterConfig {
        ClusterConfig {
            name: self.name.clone(),
            label: self.label.clone(),
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }
}

impl Config {
    /// The clusters to watch: the `[[clusters]]` entries, or the single `[cluster]`.
    pub fn clusters(&self) -> Vec<ClusterSpec> {
        if self.clusters.is_empty() {
            return vec![ClusterSpec {
                name: self.cluster.name.clone(),
                label: self.cluster.label.clone(),
                kubeconfig: self.cluster.kubeconfig.clone(),
                context: self.cluster.context.clone(),
                resources: self.resources.clone(),
            }];
        }
        self.clusters
            .iter()
            .map(|c| ClusterSpec {
                name: c.name.clone(),
                label: self.cluster.label.clone(),
                kubeconfig: c.kubeconfig.clone(),
                context: c.context.clone(),
                resources: c
                    .resources
                    .clone()
                    .unwrap_or_else(|| self.resources.clone()),
            })
            .collect()
    }
}

/// `[leader_election]`: replicas elect a leader on a `coordination.k8s.io/v1` Lease, the way
/// client-go's `leaderelection` does (optimistic concurrency on the Lease's resourceVersion);
/// only the leader watches and emits (`src/leader.rs`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct LeaderElectionConfig {
    /// Elect a leader. Default `false`: this process always leads.
    pub enabled: bool,
    /// The Lease's name. Default `kubesink`.
    pub lease_name: String,
    /// The Lease's namespace. Default: the Pod's own namespace in a cluster, else `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_namespace: Option<String>,
    /// This replica's identity in the Lease. Default: `POD_NAME`, else the host name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The cluster whose API holds the Lease (a `[[clusters]]` name). Default: the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// How long a lease is valid after its last renewal; followers take over after it.
    /// Default 15s (client-go's).
    pub lease_duration: HumanDuration,
    /// The leader stops emitting when it could not renew for this long; shorter than
    /// `lease_duration`, so it stops before anyone else may start. Default 10s.
    pub renew_deadline: HumanDuration,
    /// How often to try to acquire or renew. Default 2s.
    pub retry_period: HumanDuration,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            enabled: false,
            lease_name: "kubesink".to_owned(),
            lease_namespace: None,
            identity: None,
            cluster: None,
            lease_duration: HumanDuration::from_secs(15),
            renew_deadline: HumanDuration::from_secs(10),
            retry_period: HumanDuration::from_secs(2),
        }
    }
}

fn default_cluster_label() -> String {
    "kubesink.io/cluster".to_owned()
}

/// `[pipeline]`: the batching and backpressure stage (see `src/pipeline/mod.rs`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// While a key waits, a newer change replaces the older one (topology is state). `false`
    /// keeps every change. Default `true`.
    pub coalesce: bool,
    /// Changes held per sink (waiting plus in flight) before the informers stop reading their
    /// watch streams. With `coalesce = true` this is the number of distinct keys waiting.
    /// Default 10000.
    pub max_pending: usize,
    /// Bytes (keys + payloads) held per sink before the informers stop reading. Default 8MiB
    /// (~1,000 pods of 8 KB: enough to keep a sink busy, small next to the informer's state;
    /// see `BENCHMARKS.md`).
    pub max_pending_bytes: ByteSize,
    /// A batch closes at this many messages. Default 500.
    pub max_batch_events: usize,
    /// A batch closes at this many bytes (keys + payloads). Default 1MiB.
    pub max_batch_bytes: ByteSize,
    /// How long an idle sink (no batch in flight) waits for more changes after the oldest
    /// pending one before sending. A busy sink's next batch is everything that accumulated
    /// during its current send, without waiting, so batches grow with the load. Default 0s:
    /// an idle sink sends at once (lowest latency); a few milliseconds trade latency for
    /// fewer, fuller requests at low change rates.
    pub linger: HumanDuration,
    /// First retry delay after a sink error; doubles per failure (with jitter). Default 100ms.
    pub retry_initial_backoff: HumanDuration,
    /// Cap of every retry delay, jitter and a destination's retry-after hint included; a
    /// sink that reports its destination reachable again ends the wait at once. Default 30s.
    pub retry_max_backoff: HumanDuration,
    /// On SIGINT/SIGTERM, the deadline of the whole shutdown: stopping the watches,
    /// delivering what is pending and closing the sinks (four fifths of it at most), then the
    /// final state save, the lease release and the wait for the tasks. What does not fit is
    /// abandoned and named; `kubesink run` exits 1 naming how many changes were left
    /// undelivered, 5 when only later steps were abandoned (`docs/operations.md`). Keep it
    /// below the Pod's `terminationGracePeriodSeconds`. Default 10s.
    pub shutdown_timeout: HumanDuration,
    /// After each list (initial list or relist) of each watch, send a sync marker (`op:
    /// "synced"`, see `docs/message-contract.md`) to every destination of the resource, after
    /// all of the list's messages. Default `false`.
    pub sync_markers: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        use std::time::Duration;
        PipelineConfig {
            coalesce: true,
            max_pending: 10_000,
            max_pending_bytes: ByteSize(8 * 1024 * 1024),
            max_batch_events: 500,
            max_batch_bytes: ByteSize(1024 * 1024),
            linger: HumanDuration(Duration::ZERO),
            retry_initial_backoff: HumanDuration(Duration::from_millis(100)),
            retry_max_backoff: HumanDuration(Duration::from_secs(30)),
            shutdown_timeout: HumanDuration(Duration::from_secs(10)),
            sync_markers: false,
        }
    }
}

/// `[watch]`: how each informer keeps its list and watch going (`src/informer/mod.rs`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// A watch that delivers neither an event nor a bookmark for this long is presumed dead
    /// (a middlebox that dropped the connection silently, a server that stopped sending) and
    /// re-established from its last resourceVersion. API servers send a bookmark about every
    /// minute on a healthy watch. A list page whose bytes stop arriving for this long is
    /// abandoned and the list tried again (a slow server is waited for). Default 3m.
    pub idle_timeout: HumanDuration,
    /// First delay after a failed list or watch (or a watch that ended empty at once);
    /// doubles per consecutive failure, with jitter inside the cap; reset only after a list
    /// completed or a watch delivered something. Default 500ms.
    pub retry_initial_backoff: HumanDuration,
    /// Cap of that delay, `Retry-After` excepted (a server asking for longer is obeyed).
    /// Default 15s.
    pub retry_max_backoff: HumanDuration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            idle_timeout: HumanDuration::from_secs(180),
            retry_initial_backoff: HumanDuration::from_millis(500),
            retry_max_backoff: HumanDuration::from_secs(15),
        }
    }
}

/// `[server]`: the HTTP server with `/metrics`, `/healthz` and `/readyz`
/// (`docs/operations.md`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Serve at all. Default `true`.
    pub enabled: bool,
    /// Address and port to listen on. Default `0.0.0.0:9090`.
    pub listen: String,
    /// `/healthz` fails when a watch could not be re-established for this long (connection
    /// failures, dead or undecodable watches, server errors; not 401/403/404, which a restart
    /// cannot cure). Default 5m.
    pub watch_failure_timeout: HumanDuration,
    /// How often each sink's healthcheck runs once it passed (readiness). Default 10s.
    pub sink_check_interval: HumanDuration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            enabled: true,
            listen: "0.0.0.0:9090".to_owned(),
            watch_failure_timeout: HumanDuration::from_secs(300),
            sink_check_interval: HumanDuration::from_secs(10),
        }
    }
}

/// `[log]`: logging beyond `--log-format` and `--log-level`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Interval of the one-line summary at info level (objects, events/s, messages/s,
    /// pending and delivered/s per sink); `0s` turns it off. Default 60s.
    pub summary_interval: HumanDuration,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            summary_interval: HumanDuration::from_secs(60),
        }
    }
}

/// How much of each object a message carries.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PayloadMode {
    /// The whole object without `metadata.managedFields` (and without the `drop` paths).
    #[default]
    Full,
    /// Metadata only: the watch asks for `PartialObjectMetadata`, so nothing else crosses the
    /// wire; the message's object is `{apiVersion, kind, metadata}`.
    Metadata,
    /// Only the JSON pointers in `fields` (plus `apiVersion`, `kind` and the identifying
    /// metadata: name, namespace, uid, resourceVersion, labels).
    Fields,
}

/// One `[[resources]]` entry: a kind to watch (built-in or custom), resolved through API
/// discovery.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// `apiVersion` of the kind as Kubernetes writes it: `v1` (the core group), `apps/v1`,
    /// `example.com/v1alpha1`. Any other spelling (`/v1`, `v1/`, whitespace) is an error.
    pub api_version: String,
    /// PascalCase kind: `Pod`, `Deployment`, a CRD's kind.
    pub kind: String,
    /// Namespaces to watch (one watch each). Empty (default): all namespaces, or the
    /// cluster scope for cluster-scoped kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Label selector passed to the API server (`app=web,tier in (a,b)`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// Field selector passed to the API server (`metadata.name=web`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<String>,
    /// Payload mode: `full` (default), `metadata` or `fields`.
    #[serde(default)]
    pub payload: PayloadMode,
    /// With `payload = "fields"`: JSON pointers (RFC 6901) to keep, e.g. `/spec/nodeName`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// JSON pointers removed from every emitted object, on top of `/metadata/managedFields`
    /// which is always removed. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
    /// Emit `updated` messages. `false` gives adds and deletes only (the seed's
    /// `receiveUpdates=false`). Default `true`.
    #[serde(default = "yes")]
    pub updates: bool,
    /// For core/v1 Secrets only: emit `data` and `stringData`. Default `false`: they are
    /// removed before fingerprinting, so they never leave the process.
    #[serde(default)]
    pub allow_secret_data: bool,
    /// Page size (`limit`) of the initial list and relists. Default 500.
    #[serde(default = "default_page_size")]
    pub page_size: u32,
    /// The resource's plural name in API paths and RBAC rules (`pods`; a CRD's
    /// `spec.names.plural`). Read only by `kubesink rbac`, which works offline: by default it
    /// takes built-in kinds' plurals from k8s-openapi and guesses others the way Kubernetes'
    /// code generator does (`FooBar` → `foobars`, `Policy` → `policies`). Set it for a CRD
    /// whose plural differs. At run time API discovery is authoritative; a different plural
    /// is logged as a warning (the generated RBAC would not match). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plural: Option<String>,
}

fn yes() -> bool {
    true
}

fn default_page_size() -> u32 {
    500
}

impl ResourceConfig {
    /// A resource with every option at its default.
    pub fn new(api_version: &str, kind: &str) -> Self {
        ResourceConfig {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespaces: Vec::new(),
            label_selector: None,
            field_selector: None,
            payload: PayloadMode::Full,
            fields: Vec::new(),
            drop: Vec::new(),
            updates: true,
            allow_secret_data: false,
            page_size: default_page_size(),
            plural: None,
        }
    }

    /// The `(group, version)` API discovery is asked for: `group/version`, or the core group
    /// (`""`) for a bare version. `check` accepts only well-formed apiVersions, so `v1` is
    /// the one spelling of the core group.
    pub fn group_version(&self) -> (&str, &str) {
        match self.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", self.api_version.as_str()),
        }
    }

    /// `apiVersion Kind`, used in logs and errors.
    pub fn display_name(&self) -> String {
        format!("{} {}", self.api_version, self.kind)
    }
}

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
