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
use super::{Config, ResourceConfig};

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
            })
            .collect()
    }
}

impl Cluster {
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

/// The problems of `[cluster]` and `[[clusters]]` (names, the two used together, each
/// entry's resources), as `(key, message)` with full dotted keys.
pub fn problems(c: &Config) -> Vec<(String, String)> {
    let mut problems = Problems::default();
    if c.clusters.is_empty() {
        if c.cluster.name.is_empty() {
            problems.add("cluster.name", "required: the cluster's name, carried by every message (set it in the file or KUBESINK_CLUSTER__NAME)");
        } else {
            name_problems(&mut problems, "cluster.name", &c.cluster.name);
        }
    } else {
        if !c.cluster.name.is_empty()
            || c.cluster.kubeconfig.is_some()
            || c.cluster.context.is_some()
        {
            problems.add("clusters", "use either [cluster] (name, kubeconfig, context) or [[clusters]], not both (cluster.label applies to all)");
        }
        let mut names = std::collections::HashSet::new();
        for (i, e) in c.clusters.iter().enumerate() {
            name_problems(&mut problems, &format!("clusters.{i}.name"), &e.name);
            if !names.insert(e.name.clone()) {
                problems.add(
                    format!("clusters.{i}.name"),
                    format!("cluster name {:?} is used twice", e.name),
                );
            }
            for (j, r) in e.resources.iter().flatten().enumerate() {
                problems.extend(r.problems(&format!("clusters.{i}.resources.{j}")));
            }
        }
    }
    problems.into_vec()
}
