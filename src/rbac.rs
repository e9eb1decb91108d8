//! `kubesink rbac`: the least-privilege RBAC a configuration needs, derived offline.
//!
//! What kubesink asks of the API server, and what that needs
//! (<https://kubernetes.io/docs/reference/access-authn-authz/rbac/>):
//! - API discovery (`/api/v1`, `/apis/{group}/{version}`): every authenticated user may read
//!   it through the built-in `system:discovery` ClusterRole; nothing to grant.
//! - `list` and `watch` of each configured resource (a metadata-only watch asks for the same
//!   resource with another `Accept` header). Nothing else: no `get`, no other resource.
//! - With `enrich = ["owner"]`: `list` and `watch` of the workload controllers the owner
//!   index watches by itself (ReplicaSets, Deployments, StatefulSets, DaemonSets, Jobs,
//!   CronJobs; `informer::owners::index_resources`), where the entries asking for owners
//!   watch.
//! - A group-form entry (`group`, `kinds`): `list` and `watch` of every resource of its
//!   group (`resources: ["*"]`; `apiGroups: ["*"]` for every group), or of its kinds'
//!   plurals; RBAC has no exclusions, so what `exclude` leaves out is granted too (name the
//!   groups to keep Secrets out). And `list` and `watch` of CustomResourceDefinitions
//!   (cluster-wide), whose changes tell kubesink when kinds come and go.
//! - With scale-out (`leader_election.scale_out`): `create`, `delete`, `get`, `list` and
//!   `update` of Leases in the Lease namespace (one per replica and one per cluster, named at
//!   run time: no `resourceNames`).
//! - With leader election: `get` and `update` of its one Lease (`coordination.k8s.io`,
//!   restricted by `resourceNames`), and `create` of Leases in the Lease's namespace, since a
//!   `create` cannot be restricted by name (the name is not known at authorization time).
//! - `kubesink check --online` (`src/online/`) asks nothing more: discovery, a LIST per
//!   resource and scope, and `SelfSubjectAccessReview`s, which every authenticated user may
//!   create through the built-in `system:basic-user` ClusterRole.
//!
//! Shape of the output, for service account `NS/SA` and object name `NAME` (`--name`):
//! - resources watched in all namespaces (or cluster-scoped): ClusterRole `NAME` with one rule
//!   per API group, and ClusterRoleBinding `NAME`;
//! - resources whose entries list `namespaces`: per namespace, Role `NAME` and RoleBinding
//!   `NAME` there (when every entry lists namespaces, there is no ClusterRole at all);
//! - leader election on: Role and RoleBinding `NAME-leader-election` in the Lease's namespace.
//!
//! Plurals (the `resources` of a rule) need no API server: [`plural`] takes a built-in kind's
//! from k8s-openapi ([`k8s_openapi::Resource::URL_PATH_SEGMENT`]), else the entry's `plural`,
//! else the guess of Kubernetes' code generator.
//!
//! This module never touches the network, and never grants more than list and watch on
//! what the configuration names (plus the Lease).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::config::{describe_source, ConfigErrors, ResourceConfig};
use crate::plan::kinds::{builtin, kind_warnings};
use crate::plan::load_resources;

/// The API group of RBAC objects.
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// Verbs of every watched resource: the informer lists (initial list, relists) and watches.
const WATCH_VERBS: [&str; 2] = ["list", "watch"];
/// Verbs on the Lease itself (read it, renew or take it over with optimistic concurrency).
const LEASE_VERBS: [&str; 2] = ["get", "update"];

/// Verbs on the Leases of a scale-out group (`leader_election.scale_out`), in the Lease
/// namespace: read, list (the group, by label), create, renew or take over, and delete (a
/// leaving replica's membership).
const SCALE_OUT_LEASE_VERBS: [&str; 5] = ["create", "delete", "get", "list", "update"];

/// Who the RBAC is for and whether it includes the Lease.
///
/// The generator takes this small struct, not the whole configuration, so the command
/// line, the configuration (`[leader_election]`) or a test can fill it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbacOptions {
    /// Name of the generated ClusterRole, Roles and bindings (`kubesink`).
    pub name: String,
    /// The service account kubesink runs as (`kubesink`).
    pub service_account: String,
    /// The service account's namespace (`kubesink`).
    pub namespace: String,
    /// The Lease, when leader election is on.
    pub lease: Option<LeaseRef>,
}

/// A `coordination.k8s.io/v1` Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRef {
    /// The Lease's name.
    pub name: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// `leader_election.scale_out`: the group's Leases (named at run time) instead of one.
    pub scale_out: bool,
}

/// Why no RBAC could be generated.
#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    /// The configuration's `[[resources]]` could not be loaded.
    #[error("{0}")]
    Config(ConfigErrors),
    /// `namespaces` listed for a kind that Kubernetes serves cluster-scoped.
    #[error(
        "resources.{index}.namespaces: {resource} is cluster-scoped; remove the namespaces list"
    )]
    ClusterScoped {
        /// Position in `resources`.
        index: usize,
        /// `apiVersion Kind`.
        resource: String,
    },
    /// A name (flag or `[leader_election]` key) that Kubernetes would reject.
    #[error("{key}: {value:?} is not a valid name (lowercase RFC 1123: letters, digits, '-', '.'; at most {max} characters) (from {source_name})")]
    BadName {
        /// The flag or key (`--service-account`, `leader_election.lease_name`).
        key: String,
        /// The value given.
        value: String,
        /// The longest name allowed.
        max: usize,
        /// Where it came from (`command line`, `file PATH`, `env NAME`).
        source_name: String,
    },
    /// The `[leader_election]` section has a value of the wrong type.
    #[error("leader_election: {0}")]
    LeaderElection(String),
    /// The YAML could not be written.
    #[error("writing the RBAC YAML: {0}")]
    Yaml(#[from] serde_saphyr::ser::Error),
}

/// The part of `[leader_election]` that RBAC depends on. Other keys (durations...) are
/// ignored here.
#[derive(Debug, Default, Deserialize)]
struct LeaderElectionView {
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    lease_name: Option<String>,
    #[serde(default)]
    lease_namespace: Option<String>,
    #[serde(default)]
    scale_out: bool,
}

/// `kubesink rbac`: reads `file` (and the `KUBESINK_…` environment like every command) and
/// returns the RBAC YAML for it.
///
/// `name`, `service_account` and `namespace` come from the command line. Leader election is
/// read from `leader_election.enabled`, `leader_election.lease_name` (default `kubesink`, as
/// at run time) and `leader_election.lease_namespace` (default `namespace`: at run time, the
/// Pod's own namespace).
///
/// # Errors
/// [`RbacError`]: configuration problems (naming key and source), cluster-scoped kinds with
/// namespaces, invalid names.
pub fn generate(
    file: Option<&Path>,
    name: &str,
    service_account: &str,
    namespace: &str,
) -> Result<Generated, RbacError> {
    let cli = |_: &str| "command line".to_owned();
    check_name("--name", name, 253, &cli)?;
    check_name("--service-account", service_account, 253, &cli)?;
    check_name("--namespace", namespace, 63, &cli)?;
    let (resources, figment) = load_resources(file).map_err(RbacError::Config)?;
    let view: LeaderElectionView = match figment.find_value("leader_election") {
        Ok(v) => v
            .deserialize()
            .map_err(|e| RbacError::LeaderElection(e.to_string()))?,
        Err(_) => LeaderElectionView::default(),
    };
    let source = |key: &str| {
        let path: Vec<String> = key.split('.').map(str::to_owned).collect();
        describe_source(figment.find_metadata(key), &path, file)
    };
    let lease = if view.enabled {
        let lease = LeaseRef {
            // The Lease kubesink takes at run time: the configuration's default, whatever
            // `--name` calls the RBAC objects.
            name: view
                .lease_name
                .unwrap_or_else(|| crate::config::LeaderElectionConfig::default().lease_name),
            namespace: view.lease_namespace.unwrap_or_else(|| namespace.to_owned()),
            scale_out: view.scale_out,
        };
        check_name("leader_election.lease_name", &lease.name, 253, &source)?;
        check_name(
            "leader_election.lease_namespace",
            &lease.namespace,
            63,
            &source,
        )?;
        Some(lease)
    } else {
        None
    };
    let options = RbacOptions {
        name: name.to_owned(),
        service_account: service_account.to_owned(),
        namespace: namespace.to_owned(),
        lease,
    };
    Ok(Generated {
        yaml: render(&resources, &options)?,
        warnings: kind_warnings(&resources, ""),
    })
}

/// What [`generate`] made: the YAML, and what the configuration's resources get wrong that
/// is known offline ([`kind_warnings`]), for stderr.
#[derive(Debug)]
pub struct Generated {
    /// The RBAC objects, as [`render`] writes them.
    pub yaml: String,
    /// One sentence each, naming the entry.
    pub warnings: Vec<String>,
}

/// The RBAC objects for `resources` and `options`, as a multi-document YAML stream with a
/// header comment. Deterministic: groups, resources and namespaces are sorted.
///
/// # Errors
/// [`RbacError::ClusterScoped`] for namespaces on a cluster-scoped built-in kind;
/// [`RbacError::Yaml`] if serialization fails.
pub fn render(resources: &[ResourceConfig], options: &RbacOptions) -> Result<String, RbacError> {
    // group -> plurals, for the ClusterRole and for each namespace's Role.
    type Rules = BTreeMap<String, BTreeSet<String>>;
    let mut cluster_wide = Rules::new();
    let mut per_namespace: BTreeMap<String, Rules> = BTreeMap::new();
    // The owner index's own watches (`informer::owners::index_resources`) need theirs too.
    let all = crate::informer::with_index_resources(resources);
    // Grants list and watch of `plurals` of `group` in `namespaces` (empty: cluster-wide).
    let mut grant = |group: &str, plurals: Vec<String>, namespaces: &[String]| {
        let add = |rules: &mut Rules| {
            rules
                .entry(group.to_owned())
                .or_default()
                .extend(plurals.iter().cloned())
        };
        match namespaces.is_empty() {
            true => add(&mut cluster_wide),
            false => {
                for ns in namespaces {
                    add(per_namespace.entry(ns.clone()).or_default());
                }
            }
        }
    };
    for (index, r) in all.iter().enumerate() {
        if let Some(s) = r.selector() {
            // The group form: every resource of its group (`*` in both for every group),
            // or its kinds' plurals; RBAC cannot leave the excluded ones out. Its kinds are
            // found through a watch of CRDs, which are cluster-scoped.
            let group = s.group.clone().unwrap_or_else(|| "*".to_owned());
            let plurals: Vec<String> = match &s.kinds {
                None => vec!["*".to_owned()],
                Some(kinds) => kinds.iter().map(|k| plural(&group, k, None)).collect(),
            };
            grant(&group, plurals, &r.namespaces);
            grant(
                "apiextensions.k8s.io",
                vec!["customresourcedefinitions".to_owned()],
                &[],
            );
            continue;
        }
        let group = group_of(&r.api_version);
        let found = builtin(group, &r.kind);
        if found.is_some_and(|b| !b.namespaced) && !r.namespaces.is_empty() {
            return Err(RbacError::ClusterScoped {
                index,
                resource: r.display_name(),
            });
        }
        grant(
            group,
            vec![plural(group, &r.kind, r.plural.as_deref())],
            &r.namespaces,
        );
    }
    // What the ClusterRole grants everywhere needs no Role.
    for rules in per_namespace.values_mut() {
        for (group, plurals) in rules.iter_mut() {
            if let Some(everywhere) = cluster_wide.get(group) {
                plurals.retain(|p| !everywhere.contains(p));
            }
        }
        rules.retain(|_, plurals| !plurals.is_empty());
    }
    per_namespace.retain(|_, rules| !rules.is_empty());

    let to_rules = |rules: &Rules| -> Vec<PolicyRule> {
        rules
            .iter()
            .map(|(group, plurals)| PolicyRule {
                api_groups: Some(vec![group.clone()]),
                resources: Some(plurals.iter().cloned().collect()),
                verbs: WATCH_VERBS.iter().map(|v| (*v).to_owned()).collect(),
                ..Default::default()
            })
            .collect()
    };
    let subjects = Some(vec![Subject {
        kind: "ServiceAccount".to_owned(),
        name: options.service_account.clone(),
        namespace: Some(options.namespace.clone()),
        api_group: None,
    }]);
    let role_ref = |kind: &str, name: &str| RoleRef {
        api_group: Some(RBAC_GROUP.to_owned()),
        kind: kind.to_owned(),
        name: name.to_owned(),
    };

    let mut docs = Vec::new();
    if !cluster_wide.is_empty() {
        docs.push(serde_saphyr::to_string(&ClusterRole {
            metadata: meta(&options.name, None),
            rules: Some(to_rules(&cluster_wide)),
            aggregation_rule: None,
        })?);
        docs.push(serde_saphyr::to_string(&ClusterRoleBinding {
            metadata: meta(&options.name, None),
            role_ref: role_ref("ClusterRole", &options.name),
            subjects: subjects.clone(),
        })?);
    }
    for (ns, rules) in &per_namespace {
        docs.push(serde_saphyr::to_string(&Role {
            metadata: meta(&options.name, Some(ns)),
            rules: Some(to_rules(rules)),
        })?);
        docs.push(serde_saphyr::to_string(&RoleBinding {
            metadata: meta(&options.name, Some(ns)),
            role_ref: role_ref("Role", &options.name),
            subjects: subjects.clone(),
        })?);
    }
    if let Some(lease) = &options.lease {
        let name = format!("{}-leader-election", options.name);
        let leases = || Some(vec!["leases".to_owned()]);
        let group = || Some(vec!["coordination.k8s.io".to_owned()]);
        // Scale-out: the group's Leases are named per replica and per cluster
        // (`src/scale_out/members.rs`), listed by label, and a leaving replica deletes its
        // own; none of that can be restricted by resourceNames.
        let rules = if lease.scale_out {
            vec![PolicyRule {
                api_groups: group(),
                resources: leases(),
                verbs: SCALE_OUT_LEASE_VERBS
                    .iter()
                    .map(|v| (*v).to_owned())
                    .collect(),
                ..Default::default()
            }]
        } else {
            vec![
                PolicyRule {
                    api_groups: group(),
                    resources: leases(),
                    resource_names: Some(vec![lease.name.clone()]),
                    verbs: LEASE_VERBS.iter().map(|v| (*v).to_owned()).collect(),
                    ..Default::default()
                },
                // `create` cannot be restricted by resourceNames.
                PolicyRule {
                    api_groups: group(),
                    resources: leases(),
                    verbs: vec!["create".to_owned()],
                    ..Default::default()
                },
            ]
        };
        docs.push(serde_saphyr::to_string(&Role {
            metadata: meta(&name, Some(&lease.namespace)),
            rules: Some(rules),
        })?);
        docs.push(serde_saphyr::to_string(&RoleBinding {
            metadata: meta(&name, Some(&lease.namespace)),
            role_ref: role_ref("Role", &name),
            subjects: subjects.clone(),
        })?);
    }
    let lease = match &options.lease {
        Some(l) => format!("Lease {}/{}", l.namespace, l.name),
        None => "no leader election".to_owned(),
    };
    let mut out = format!(
        "# Least-privilege RBAC for kubesink (service account {}/{}; {lease}).\n\
         # Generated by `kubesink rbac`: regenerate it rather than editing it.\n",
        options.namespace, options.service_account
    );
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&doc);
    }
    Ok(out)
}

/// The API group of an apiVersion: `""` for the core group (`v1`), else the part before `/`.
fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

/// The plural resource name of `kind` in `group`: a built-in kind's own (k8s-openapi's
/// `URL_PATH_SEGMENT`, so irregular plurals such as `endpoints` come out right), else
/// `configured` (a `[[resources]]` entry's `plural`), else [`guess_plural`].
pub fn plural(group: &str, kind: &str, configured: Option<&str>) -> String {
    if let Some(b) = builtin(group, kind) {
        return b.plural.to_owned();
    }
    match configured {
        Some(p) => p.to_owned(),
        None => guess_plural(kind),
    }
}

/// Lower-cases `kind` and pluralizes it the way Kubernetes' code generator names built-in
/// resources (gengo `namer.NewAllLowercasePluralNamer`) and `controller-gen` most CRDs:
/// `-s`/`-x`/`-z`/`-ch`/`-sh` take `es`, a consonant before `-y` gives `ies`, `-f`/`-fe` give
/// `ves`, anything else takes `s`. (kubectl's offline `UnsafeGuessKindToResource` differs
/// for a vowel before `-y`: `Gateway` gives `gatewaies` there, `gateways` here and on the
/// server.) A CRD may declare any plural in `spec.names.plural`: set `plural` then.
pub fn guess_plural(kind: &str) -> String {
    let k = kind.to_ascii_lowercase();
    let before_last = |s: &str| s.chars().rev().nth(1);
    let is_vowel = |c: char| "aeiou".contains(c);
    if k.len() < 2 {
        return k;
    }
    if k.ends_with(['s', 'x', 'z']) || k.ends_with("ch") || k.ends_with("sh") {
        format!("{k}es")
    } else if k.ends_with('y') && before_last(&k).is_some_and(|c| !is_vowel(c)) {
        format!("{}ies", &k[..k.len() - 1])
    } else if let Some(stem) = k.strip_suffix("fe") {
        format!("{stem}ves")
    } else if let Some(stem) = k.strip_suffix('f') {
        format!("{stem}ves")
    } else {
        format!("{k}s")
    }
}

/// Metadata of a generated object: name, namespace, and the `app.kubernetes.io/name` label.
fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "kubesink".to_owned(),
        )])),
        ..Default::default()
    }
}

/// RFC 1123 subdomain (`max` 253: object names) or label (`max` 63: namespaces).
fn check_name(
    key: &str,
    value: &str,
    max: usize,
    source: &dyn Fn(&str) -> String,
) -> Result<(), RbacError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let ok = !value.is_empty()
        && value.len() <= max
        && if max == 63 {
            label_ok(value)
        } else {
            value.split('.').all(label_ok)
        };
    if ok {
        Ok(())
    } else {
        Err(RbacError::BadName {
            key: key.to_owned(),
            value: value.to_owned(),
            max,
            source_name: source(key),
        })
    }
}

#[cfg(test)]
mod tests;
