//! Warnings: configurations that load and run but probably do not do what was meant, or
//! weaken security. `kubesink check` prints them (and still exits 0), `kubesink run` logs
//! them at start. This module only reads the configuration.
//!
//! - The same objects watched twice: two `[[resources]]` entries of one kind under two
//!   versions of its group, or under two API groups that serve the same objects (v1 `Event`
//!   and `events.k8s.io/v1` `Event`; `extensions/v1beta1` and `apps/v1` Deployments...), with
//!   overlapping namespaces. Every change would then be reported twice.
//! - A file the configuration names (a kubeconfig, a sink's credentials or certificates,
//!   the state store's) that is not here ([`missing_files`]).
//! - Sink settings that turn TLS verification off or send credentials without TLS
//!   ([`SinkConfig::warnings`](crate::sinks::SinkConfig::warnings)), and the selected state
//!   backend's section's warnings (the same for its connection, a server only this machine
//!   reaches: `StateBackendConfig::warnings` in its destination's crate).
//! - A state store the replicas cannot share (a file with leader election on).

use super::{Config, ResourceConfig};

/// Kinds whose objects one API server serves under two groups: (group, kind) → the group
/// it is the same object in (Kubernetes API deprecation guide, "Migrate" sections:
/// <https://kubernetes.io/docs/reference/using-api/deprecation-guide/>).
pub const GROUP_ALIASES: &[(&str, &str, &str)] = &[
    ("", "Event", "events.k8s.io"),
    ("extensions", "Deployment", "apps"),
    ("extensions", "DaemonSet", "apps"),
    ("extensions", "ReplicaSet", "apps"),
    ("extensions", "NetworkPolicy", "networking.k8s.io"),
    ("extensions", "Ingress", "networking.k8s.io"),
    ("extensions", "PodSecurityPolicy", "policy"),
];

/// The group an entry's objects belong to, aliases resolved: `(group, kind)`.
fn identity(api_version: &str, kind: &str) -> (String, String) {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let group = GROUP_ALIASES
        .iter()
        .find(|(g, k, _)| *g == group && *k == kind)
        .map_or(group, |(_, _, canonical)| canonical);
    (group.to_owned(), kind.to_owned())
}

/// Whether two namespace lists (empty: all) share a namespace.
fn overlap(a: &[String], b: &[String]) -> bool {
    a.is_empty() || b.is_empty() || a.iter().any(|n| b.contains(n))
}

/// A file the configuration names that is not here: its key, its path, and what it costs
/// (whether `kubesink run` refuses to start without it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingFile {
    /// Full dotted key: `clusters.1.kubeconfig`, `sinks.0.security.ssl_ca_location`.
    pub key: String,
    /// The path it names.
    pub path: std::path::PathBuf,
    /// What is lost without it.
    pub cost: String,
}

impl MissingFile {
    /// As a warning (`kubesink check`): the file may be mounted only where kubesink runs.
    pub fn warning(&self) -> String {
        format!(
            "{}: {} does not exist here or is not a file ({}; fine if it is mounted where kubesink runs)",
            self.key,
            self.path.display(),
            self.cost
        )
    }

    /// As an error (`kubesink check --strict`: checked where it runs).
    pub fn error(&self) -> String {
        format!(
            "{}: {} does not exist or is not a file ({})",
            self.key,
            self.path.display(),
            self.cost
        )
    }
}

/// Files named but not here: a kubeconfig (a typo shows only as "cannot connect" at start,
/// or in a fleet as that cluster failing), a sink's credentials or certificates, the state
/// store's files (its section's `StateBackendConfig::files`; `run` refuses to start without
/// those). A warning, not an
/// error: a file is often checked where it is not run (in CI, for a Pod that mounts it);
/// `kubesink check --strict` makes each an error. Each says what `run` does without it: a
/// single cluster's kubeconfig, the Lease cluster's (`leader_election`) and every sink's or
/// state store's file stop the start; another cluster of a fleet is retried while the others
/// run.
pub fn missing_files(c: &Config) -> Vec<MissingFile> {
    let mut files: Vec<(String, std::path::PathBuf, String)> = Vec::new();
    let clusters = c.clusters();
    let lease_holder = c.leader_election.enabled.then(|| {
        c.leader_election
            .cluster
            .as_ref()
            .and_then(|name| clusters.iter().position(|cl| &cl.name == name))
            .unwrap_or(0)
    });
    let none_here = clusters
        .iter()
        .all(|cl| cl.kubeconfig.as_ref().is_some_and(|p| !p.is_file()));
    for (i, cl) in clusters.iter().enumerate() {
        let Some(p) = &cl.kubeconfig else { continue };
        let cost = if clusters.len() == 1 {
            "`kubesink run` refuses to start without it".to_owned()
        } else if none_here {
            "`kubesink run` refuses to start without it: no cluster's kubeconfig is here".to_owned()
        } else if lease_holder == Some(i) {
            format!(
                "`kubesink run` refuses to start without it: cluster {:?} holds the leader-election Lease",
                cl.name
            )
        } else {
            format!(
                "cluster {:?} cannot be watched without it: the other clusters run, it is retried",
                cl.name
            )
        };
        files.push((format!("{}.kubeconfig", cl.key), p.clone(), cost));
    }
    for (i, s) in c.sinks.iter().enumerate() {
        for (key, path) in s.files() {
            files.push((
                format!("sinks.{i}.{key}"),
                path,
                "`kubesink run` refuses to start without it".to_owned(),
            ));
        }
    }
    if let Some(section) = c.state.selected() {
        let name = c.state.backend.name();
        for (key, path) in section.files() {
            files.push((
                format!("state.{name}.{key}"),
                path,
                "the state store cannot be opened without it".to_owned(),
            ));
        }
    }
    files
        .into_iter()
        .filter(|(_, p, _)| !p.is_file())
        .map(|(key, path, cost)| MissingFile { key, path, cost })
        .collect()
}

/// Every warning of `c`, one sentence each naming the keys.
pub fn warnings(c: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (i, a) in c.resources.iter().enumerate() {
        for (j, b) in c.resources.iter().enumerate().skip(i + 1) {
            // The group form's overlaps: `plan::groups` (it needs the built-in kinds).
            if a.selector().is_some() || b.selector().is_some() {
                continue;
            }
            let same_entry = a.api_version == b.api_version && a.kind == b.kind;
            if identity(&a.api_version, &a.kind) != identity(&b.api_version, &b.kind)
                || !overlap(&a.namespaces, &b.namespaces)
                || (same_entry && a.namespaces == b.namespaces)
            {
                continue;
            }
            let how = if same_entry {
                "watch the same objects in overlapping namespaces"
            } else if a.api_version.rsplit_once('/').map(|x| x.0)
                == b.api_version.rsplit_once('/').map(|x| x.0)
            {
                "are the same objects under two versions of one API group"
            } else {
                "are the same objects under two API groups"
            };
            out.push(format!(
                "resources.{i} ({}) and resources.{j} ({}) {how}: every change is reported twice (unless their selectors keep them apart); keep one",
                a.display_name(),
                b.display_name()
            ));
        }
    }
    out.extend(missing_files(c).iter().map(MissingFile::warning));
    out.extend(observed_generation(c));
    for (prefix, list) in c.resource_lists() {
        out.extend(context_gaps(list, &prefix));
    }
    for (i, s) in c.sinks.iter().enumerate() {
        out.extend(s.warnings(i));
    }
    out.extend(c.state.warnings(&c.state_context(String::new())));
    out.extend(unshared_state(c));
    // An invalid `shards` is a problem of its own; the units it would make are not counted.
    let shards_valid = c
        .clusters()
        .iter()
        .all(|k| crate::config::Shard::valid_count(k.shards));
    if c.leader_election.enabled
        && c.leader_election.scale_out
        && shards_valid
        && c.units().len() < 2
    {
        out.push("leader_election.scale_out with one cluster: one replica holds it and the others stand by, as with leader election alone; scale-out spreads [[clusters]] entries, several of them, or the shards of a cluster (cluster.shards)".to_owned());
    }
    out
}

/// `enrich` without the kinds it reads its context from (`informer/owners.rs`), among one
/// cluster's `resources` (keys prefixed with `prefix`): Events' owners without Pods (the
/// owner index watches the workload controllers by itself, not the Pods an Event regards),
/// an Event's node from Pods followed without their spec.
fn context_gaps(resources: &[ResourceConfig], prefix: &str) -> Vec<String> {
    use super::resource::{Enrich, PayloadMode, ResourceMode};
    let followed = |api: &str, kind: &str| {
        resources
            .iter()
            .any(|r| r.api_version == api && r.kind == kind)
    };
    let mut out = Vec::new();
    for (i, r) in resources.iter().enumerate() {
        let events = r.mode == ResourceMode::Events;
        let needs: &[(&str, &str)] = match (r.enriches(Enrich::Owner), events) {
            (true, true) => &[("v1", "Pod")],
            _ => &[],
        };
        let missing: Vec<&(&str, &str)> = needs
            .iter()
            .filter(|(api, kind)| !followed(api, kind))
            .collect();
        if !missing.is_empty() {
            let names: Vec<String> = missing.iter().map(|(a, k)| format!("{a} {k}")).collect();
            // An Event's node is read from the Pod's spec: metadata alone is not enough.
            let how = match r.enriches(Enrich::Node) {
                true => "Pods need their spec for node: payload = \"fields\", fields = [\"/metadata\", \"/spec/nodeName\"]",
                false => "payload = \"metadata\" suffices",
            };
            out.push(format!(
                "{prefix}resources.{i}.enrich ({}): {} not followed, so an Event's chain stops at the object it regards (owners: [], ownersComplete: false); follow them too ({how})",
                r.display_name(),
                names.join(", ")
            ));
        }

        if events && r.enriches(Enrich::Node) {
            let pods = resources.iter().position(|p| p.is_pods());
            match pods.map(|p| &resources[p]) {
                None => out.push(format!(
                    "{prefix}resources.{i}.enrich ({}): \"node\" is the regarding Pod's, and v1 Pod is not followed: no Event will carry a node",
                    r.display_name()
                )),
                Some(p) if p.payload == PayloadMode::Metadata => out.push(format!(
                    "{prefix}resources.{i}.enrich ({}): \"node\" is the regarding Pod's spec.nodeName, which v1 Pod with payload = \"metadata\" does not read: no Event will carry a node; set {prefix}resources.{}.payload = \"fields\" with fields = [\"/spec/nodeName\"] (or \"full\")",
                    r.display_name(),
                    pods.unwrap_or_default(),
                )),
                Some(_) => {}
            }
        }
    }
    out
}

/// A Deployment whose annotations are ignored but not `status.observedGeneration`: an
/// annotation change moves its `metadata.generation` (left out of the comparison with
/// `ignore_changes`, `informer/changes.rs`), and the deployment controller then writes
/// `status.observedGeneration` to match, a write of its own that is sent and names the
/// annotations too (`changed` is relative to the last payload sent).
fn observed_generation(c: &Config) -> Vec<String> {
    let trimmed = |p: &str| p.trim_start_matches('$').trim_start_matches('.').to_owned();
    let mut out = Vec::new();
    let clusters = c.clusters();
    for (ci, cluster) in clusters.iter().enumerate() {
        for (i, r) in cluster.resources.iter().enumerate() {
            let deployment = r.kind == "Deployment"
                && ["apps", "extensions"].contains(&r.api_version.split('/').next().unwrap_or(""));
            let ignored: Vec<String> = r.ignore_changes.iter().map(|p| trimmed(p)).collect();
            let annotations = ignored
                .iter()
                .any(|p| p.starts_with("metadata.annotations"));
            let caught_up = ignored
                .iter()
                .any(|p| p == "status" || p == "status.observedGeneration");
            if deployment && annotations && !caught_up {
                let at = match c.clusters.is_empty() {
                    true => format!("resources.{i}.ignore_changes"),
                    false => format!("clusters.{ci}.resources.{i}.ignore_changes"),
                };
                out.push(format!(
                    "{at}: an annotation change moves a Deployment's generation, and the deployment controller then writes status.observedGeneration: that write is sent (naming metadata.annotations too); add \"status.observedGeneration\" to ignore_changes to leave it out as well"
                ));
            }
        }
    }
    out
}

/// A state store the replicas cannot share: a file with leader election on (each replica
/// reads its own; one that takes over starts from a state its predecessor did not save). A
/// registered backend's own (a server on the loopback) are its section's warnings.
fn unshared_state(c: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if c.state.backend == super::StateBackend::File && c.leader_election.enabled {
        let instead = super::state::shared_choice().map_or_else(
            || "a state backend every replica reaches (this build has none)".to_owned(),
            |names| format!("state.backend = {names}, which every replica reaches"),
        );
        out.push(format!(
            "state.backend = \"file\" with leader_election.enabled: each replica reads and writes its own file ({}), so a replica that takes over starts from a state its predecessor never saved (it re-sends, and misses the deletes made meanwhile); use {instead}",
            c.state.path.as_ref().map_or_else(|| "state.path".to_owned(), |p| p.display().to_string())
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ResourceConfig;

    fn with(resources: Vec<ResourceConfig>) -> Vec<String> {
        warnings(&Config {
            resources,
            ..Default::default()
        })
    }

    #[test]
    fn a_kubeconfig_that_is_not_here_is_named() {
        let mut c = Config::default();
        c.cluster.kubeconfig = Some("/nonexistent/kubeconfig".into());
        let w = warnings(&c).join("\n");
        assert!(
            w.contains("cluster.kubeconfig: /nonexistent/kubeconfig does not exist here"),
            "{w}"
        );
        c.cluster.kubeconfig = Some(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml").into());
        assert!(warnings(&c).is_empty());
    }

    #[test]
    fn core_events_and_events_k8s_io_events_are_the_same_objects() {
        let w = with(vec![
            ResourceConfig::new("v1", "Event"),
            ResourceConfig::new("v1", "Pod"),
            ResourceConfig::new("events.k8s.io/v1", "Event"),
        ]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("resources.0 (v1 Event) and resources.2 (events.k8s.io/v1 Event) are the same objects under two API groups"),
            "{w:?}"
        );
    }

    #[test]
    fn ignored_deployment_annotations_without_observed_generation_are_warned_about() {
        let deployment = |ignored: &[&str]| {
            let mut r = ResourceConfig::new("apps/v1", "Deployment");
            r.ignore_changes = ignored.iter().map(|p| (*p).to_owned()).collect();
            r
        };
        let w = with(vec![deployment(&["metadata.annotations"])]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(
                "resources.0.ignore_changes: an annotation change moves a Deployment's generation"
            ),
            "{w:?}"
        );
        let w = with(vec![deployment(&["$.metadata.annotations['a.io/x']"])]);
        assert_eq!(w.len(), 1, "{w:?}");
        for quiet in [
            deployment(&["metadata.annotations", "status.observedGeneration"]),
            deployment(&["metadata.annotations", "status"]),
            deployment(&["status"]),
        ] {
            assert!(with(vec![quiet]).is_empty());
        }
        let mut pod = deployment(&["metadata.annotations"]);
        (pod.api_version, pod.kind) = ("v1".into(), "Pod".into());
        assert!(with(vec![pod]).is_empty());
    }

    #[test]
    fn extensions_and_apps_deployments_and_two_versions_of_one_group_are_the_same_objects() {
        let w = with(vec![
            ResourceConfig::new("extensions/v1beta1", "Deployment"),
            ResourceConfig::new("apps/v1", "Deployment"),
            ResourceConfig::new("autoscaling/v1", "HorizontalPodAutoscaler"),
            ResourceConfig::new("autoscaling/v2", "HorizontalPodAutoscaler"),
        ]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("two API groups"), "{w:?}");
        assert!(w[1].contains("two versions of one API group"), "{w:?}");
    }

    #[cfg(feature = "nats")]
    #[test]
    fn state_store_credentials_without_tls_are_warned_about_naming_the_key() {
        use crate::config::{StateBackend, StateConfig};
        let with = |backend, servers: &[&str], required: bool| {
            let mut state = StateConfig {
                backend,
                ..Default::default()
            };
            state.nats.servers = servers.iter().map(|s| s.to_string()).collect();
            state.nats.auth.token = Some(kubesink_core::Secret::new("t0ken-value"));
            state.nats.tls.required = required;
            warnings(&Config {
                state,
                ..Default::default()
            })
        };
        let w = with(StateBackend::Nats, &["nats://n:4222"], false);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("state.nats.auth.token: ") && w[0].contains("without TLS"),
            "{w:?}"
        );
        assert!(!w[0].contains("t0ken-value"), "{w:?}");
        assert!(with(StateBackend::Nats, &["tls://n:4222"], false).is_empty());
        assert!(with(StateBackend::Nats, &["nats://n:4222"], true).is_empty());
        assert!(
            with(StateBackend::None, &["nats://n:4222"], false).is_empty(),
            "no store, no connection"
        );
    }

    #[test]
    fn a_file_state_with_leader_election_is_warned_about() {
        use crate::config::{StateBackend, StateConfig};
        let mut c = Config {
            state: StateConfig {
                backend: StateBackend::File,
                path: Some("/var/lib/kubesink/state".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(warnings(&c).is_empty(), "{:?}", warnings(&c));
        c.leader_election.enabled = true;
        let w = warnings(&c);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("state.backend = \"file\" with leader_election.enabled: ")
                && w[0].contains("/var/lib/kubesink/state"),
            "{w:?}"
        );
    }

    #[cfg(feature = "nats")]
    #[test]
    fn a_nats_state_store_on_the_loopback_is_warned_about() {
        use crate::config::{StateBackend, StateConfig};
        let with = |servers: &[&str], leader: bool| {
            let mut state = StateConfig {
                backend: StateBackend::Nats,
                ..Default::default()
            };
            state.nats.servers = servers.iter().map(|s| s.to_string()).collect();
            let mut c = Config {
                state,
                ..Default::default()
            };
            c.leader_election.enabled = leader;
            warnings(&c)
        };
        for server in [
            "nats://127.0.0.1:4222",
            "localhost:4222",
            "tls://[::1]:4222",
            "nats://u:p@127.0.0.2",
        ] {
            let w: Vec<String> = with(&[server], false)
                .into_iter()
                .filter(|w| w.contains("loopback"))
                .collect();
            assert_eq!(w.len(), 1, "{server}: {w:?}");
            assert!(w[0].starts_with("state.nats.servers: "), "{w:?}");
            assert!(!w[0].contains("u:p"), "no credential: {w:?}");
        }
        assert!(with(&["nats://127.0.0.1:4222"], true)[0].contains("leader_election.enabled"));
        assert!(with(&["nats://nats.kubesink:4222"], true).is_empty());
    }

    #[test]
    fn disjoint_namespaces_and_different_kinds_do_not_warn() {
        let mut a = ResourceConfig::new("v1", "Event");
        a.namespaces = vec!["a".into()];
        let mut b = ResourceConfig::new("events.k8s.io/v1", "Event");
        b.namespaces = vec!["b".into()];
        let mut c = ResourceConfig::new("v1", "Pod");
        c.namespaces = vec!["a".into()];
        let mut d = ResourceConfig::new("v1", "Pod");
        d.namespaces = vec!["b".into(), "a".into()];
        let w = with(vec![
            a,
            b,
            ResourceConfig::new("apps/v1", "ReplicaSet"),
            c,
            d,
        ]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("overlapping namespaces"), "{w:?}");
    }
}
