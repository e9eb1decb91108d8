//! Warnings: configurations that load and run but probably do not do what was meant, or
//! weaken security. `kubesink check` prints them (and still exits 0), `kubesink run` logs
//! them at start. This module only reads the configuration.
//!
//! - The same objects watched twice: two `[[resources]]` entries of one kind under two
//!   versions of its group, or under two API groups that serve the same objects (v1 `Event`
//!   and `events.k8s.io/v1` `Event`; `extensions/v1beta1` and `apps/v1` Deployments...), with
//!   overlapping namespaces. Every change would then be reported twice.
//! - A kubeconfig path that names no file here.
//! - Sink settings that turn TLS verification off or send credentials without TLS
//!   ([`SinkConfig::warnings`](crate::destinations::SinkConfig::warnings)), and the same for the
//!   NATS state store's connection (`state.nats.auth.*`, `state.nats.servers`).

use super::Config;

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

/// Every warning of `c`, one sentence each naming the keys.
pub fn warnings(c: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (i, a) in c.resources.iter().enumerate() {
        for (j, b) in c.resources.iter().enumerate().skip(i + 1) {
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
    // A kubeconfig named but not here: a typo shows only as "cannot connect" at start. A
    // warning, not an error: a file is often checked where it is not run (in CI, for a Pod
    // that mounts the kubeconfig).
    let kubeconfigs = std::iter::once(("cluster.kubeconfig".to_owned(), &c.cluster.kubeconfig))
        .chain(
            c.clusters
                .iter()
                .enumerate()
                .map(|(i, e)| (format!("clusters.{i}.kubeconfig"), &e.kubeconfig)),
        );
    for (key, path) in kubeconfigs {
        if let Some(p) = path.as_ref().filter(|p| !p.is_file()) {
            out.push(format!(
                "{key}: {} does not exist here or is not a file (fine if it is mounted where kubesink runs)",
                p.display()
            ));
        }
    }
    for (i, s) in c.sinks.iter().enumerate() {
        out.extend(s.warnings(i));
    }
    out.extend(c.state.warnings());
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
