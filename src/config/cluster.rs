//! `[cluster]` and `[[clusters]]`, the two spellings of "which clusters to watch", and
//! [`Cluster`], the one form they resolve to ([`Config::clusters`]), with their checks.
//!
//! The spellings stay two input types because their keys differ (`[cluster]` has the
//! `label` every cluster shares; an entry has its own `resources`), so that serde's
//! `deny_unknown_fields` names a misplaced key precisely; nothing past the configuration
//! sees them.

use serde::{Deserialize, Serialize};

use super::problems::Problems;
use super::syntax::{check_label_key, check_label_value};
use super::{Config, Expressions, ResourceConfig};
use super::{Shard, MAX_SHARDS};

/// `[cluster]`: the connection and the label every message carries.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
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
    /// Split this cluster's objects into this many shards by the hash of their namespace,
    /// each held by one replica of the scale-out group (`leader_election.scale_out`, required)
    /// with its own watches, Lease and saved state: for a cluster too big for one process
    /// (`docs/scale-out.md`, "One huge cluster"). 1 to 256; default 1 (the whole cluster is
    /// one unit). Cluster-scoped objects all fall into one shard. The API server filters when
    /// its `ShardedListAndWatch` feature gate is on (Kubernetes 1.36+, alpha); else every
    /// replica reads the whole resource and keeps its shard itself. Changing it re-lists every
    /// shard from scratch (a new selection).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    #[schemars(range(min = 1, max = 256))]
    pub shards: u32,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            name: String::new(),
            label: default_cluster_label(),
            kubeconfig: None,
            context: None,
            shards: 1,
        }
    }
}

/// One `[[clusters]]` entry: a cluster of a multi-cluster process. Each has its own client,
/// its own watches and its own name on every message; one that is unreachable or forbids
/// access does not stop the others.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
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
    /// As `cluster.shards`, for this cluster: 1 to 256, default 1 (not split).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    #[schemars(range(min = 1, max = 256))]
    pub shards: u32,
}

/// A cluster to watch, resolved from `[cluster]` or one `[[clusters]]` entry
/// ([`Config::clusters`]): what everything after the configuration sees of a cluster (its
/// client, its watches, its state, its label).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cluster {
    /// Name on every message and in the cluster label.
    pub name: String,
    /// Where it is configured: `cluster` or `clusters.N` (errors name its keys with it;
    /// empty reads as `cluster`).
    pub key: String,
    /// The label key merged into every object (`cluster.label`).
    pub label: String,
    /// Kubeconfig file, if any.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context, if any.
    pub context: Option<String>,
    /// Its resources.
    pub resources: Vec<ResourceConfig>,
    /// How many shards it is split into (`shards`; 1: none).
    pub shards: u32,
    /// The shard this is, for a unit of scale-out ([`Config::units`]); `None`: the whole
    /// cluster.
    pub shard: Option<Shard>,
}

impl Config {
    /// The clusters to watch: the `[[clusters]]` entries, or the single `[cluster]`.
    pub fn clusters(&self) -> Vec<Cluster> {
        if self.clusters.is_empty() {
            return vec![Cluster {
                name: self.cluster.name.clone(),
                key: "cluster".to_owned(),
                label: self.cluster.label.clone(),
                kubeconfig: self.cluster.kubeconfig.clone(),
                context: self.cluster.context.clone(),
                resources: self.resources.clone(),
                shards: self.cluster.shards,
                shard: None,
            }];
        }
        self.clusters
            .iter()
            .enumerate()
            .map(|(i, c)| Cluster {
                name: c.name.clone(),
                key: format!("clusters.{i}"),
                label: self.cluster.label.clone(),
                kubeconfig: c.kubeconfig.clone(),
                context: c.context.clone(),
                resources: c
                    .resources
                    .clone()
                    .unwrap_or_else(|| self.resources.clone()),
                shards: c.shards,
                shard: None,
            })
            .collect()
    }

    /// Every `[[resources]]` list with the prefix of its keys: the top-level one (`""`), then
    /// each `[[clusters]]` entry's own (`clusters.N.`).
    pub fn resource_lists(&self) -> Vec<(String, &[ResourceConfig])> {
        let mut lists = vec![(String::new(), &self.resources[..])];
        for (ci, k) in self.clusters.iter().enumerate() {
            if let Some(own) = &k.resources {
                lists.push((format!("clusters.{ci}."), &own[..]));
            }
        }
        lists
    }

    /// The units a scale-out group spreads over its replicas: each cluster, or each shard of
    /// a cluster with `shards > 1` (a [`Cluster`] with its [`Cluster::shard`] set), in
    /// configuration order.
    pub fn units(&self) -> Vec<Cluster> {
        self.clusters()
            .into_iter()
            .flat_map(|c| match Shard::all(c.shards) {
                shards if shards.is_empty() => vec![c],
                shards => shards
                    .into_iter()
                    .map(|s| Cluster {
                        shard: Some(s),
                        ..c.clone()
                    })
                    .collect(),
            })
            .collect()
    }
}

impl Cluster {
    /// Its name as a unit of scale-out (Lease, saved state, metrics and `/readyz` labels):
    /// the cluster's name, or its shard's ([`Shard::unit`]). Messages always carry
    /// [`Cluster::name`].
    pub fn unit(&self) -> String {
        match self.shard {
            Some(s) => s.unit(&self.name),
            None => self.name.clone(),
        }
    }

    /// The full key of its `kubeconfig`: `cluster.kubeconfig` or `clusters.N.kubeconfig`.
    pub fn kubeconfig_key(&self) -> String {
        let at = if self.key.is_empty() {
            "cluster"
        } else {
            &self.key
        };
        format!("{at}.kubeconfig")
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn default_cluster_label() -> String {
    "kubesink.io/cluster".to_owned()
}

impl ClusterConfig {
    /// `cluster.label`'s problems (it is a label key), as `(key, message)`.
    pub fn label_problems(&self) -> Vec<(String, String)> {
        match check_label_key(&self.label) {
            Ok(()) => Vec::new(),
            Err(why) => vec![("cluster.label".into(), format!("{:?} {why}", self.label))],
        }
    }
}

/// A cluster name's problems: it is a label value and a part of the message key.
fn name_problems(problems: &mut Problems, key: &str, name: &str) {
    if let Err(why) = check_label_value(name) {
        problems.add(key, format!("{name:?} {why}"));
    } else if name.contains('/') {
        problems.add(key, "must not contain '/' (it is part of the message key)");
    }
}

/// A `shards` setting's problems: out of range, set without scale-out (one process would
/// only multiply its watches), or with sync markers (each marks a whole watch's list).
/// Each is its own problem, so that one run reports them all; the conflict with sync markers
/// is keyed at `pipeline.sync_markers`, so that its message names where that value came from.
fn shard_problems(problems: &mut Problems, key: &str, shards: u32, c: &Config) {
    if !Shard::valid_count(shards) {
        problems.add(key, format!("{shards} is out of range: 1 to {MAX_SHARDS}"));
        return;
    }
    if shards < 2 {
        return;
    }
    if !(c.leader_election.enabled && c.leader_election.scale_out) {
        problems.add(key, format!("{shards} shards need leader_election.enabled = true and leader_election.scale_out = true: the shards of a cluster are spread over the replicas of a scale-out group (in one process they would only multiply its watches)"));
    }
    if c.pipeline.sync_markers {
        problems.add("pipeline.sync_markers", format!("cannot be used with {key} = {shards}: a sync marker stands for a whole watch's list (docs/message-contract.md), and a shard lists only part of the resource, so a consumer sweeping on one shard's marker would drop the other shards' keys"));
    }
}

/// The problems of `[cluster]` and `[[clusters]]` (names, the two used together, each
/// entry's resources), as `(key, message)` with full dotted keys.
pub fn problems(c: &Config, exprs: &dyn Expressions) -> Vec<(String, String)> {
    let mut problems = Problems::default();
    if c.clusters.is_empty() {
        if c.cluster.name.is_empty() {
            problems.add("cluster.name", "required: the cluster's name, carried by every message (set it in the file or KUBESINK_CLUSTER__NAME)");
        } else {
            name_problems(&mut problems, "cluster.name", &c.cluster.name);
        }
        shard_problems(&mut problems, "cluster.shards", c.cluster.shards, c);
    } else {
        if !c.cluster.name.is_empty()
            || c.cluster.kubeconfig.is_some()
            || c.cluster.context.is_some()
            || c.cluster.shards != 1
        {
            problems.add("clusters", "use either [cluster] (name, kubeconfig, context) or [[clusters]], not both (cluster.label applies to all)");
        }
        let mut names = std::collections::HashSet::new();
        for (i, e) in c.clusters.iter().enumerate() {
            name_problems(&mut problems, &format!("clusters.{i}.name"), &e.name);
            shard_problems(&mut problems, &format!("clusters.{i}.shards"), e.shards, c);
            if !names.insert(e.name.clone()) {
                problems.add(
                    format!("clusters.{i}.name"),
                    format!("cluster name {:?} is used twice", e.name),
                );
            }
            for (j, r) in e.resources.iter().flatten().enumerate() {
                problems.extend(r.problems(&format!("clusters.{i}.resources.{j}"), exprs));
            }
        }
    }
    problems.into_vec()
}
