//! `kubesink rbac`: plurals, the shape of the generated objects, and the configuration it
//! reads (file and environment).

#![allow(clippy::result_large_err)] // figment::Jail fixes the closure type

use std::path::Path;

use figment::Jail;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};

use super::*;
use crate::plan::kinds::{unknown_builtin_kind, BUILTINS};

fn options(lease: Option<(&str, &str)>) -> RbacOptions {
    RbacOptions {
        name: "kubesink".into(),
        service_account: "kubesink".into(),
        namespace: "kubesink".into(),
        lease: lease.map(|(ns, name)| LeaseRef {
            name: name.into(),
            namespace: ns.into(),
            scale_out: false,
        }),
    }
}

fn res(api_version: &str, kind: &str, namespaces: &[&str]) -> ResourceConfig {
    let mut r = ResourceConfig::new(api_version, kind);
    r.namespaces = namespaces.iter().map(|s| (*s).to_owned()).collect();
    r
}

/// The documents of a YAML stream as `(kind, document)`, parsed back with serde-saphyr.
fn documents(yaml: &str) -> Vec<(String, String)> {
    yaml.split("---\n")
        .skip(1)
        .map(|doc| {
            let v: serde_json::Value = serde_saphyr::from_str(doc).unwrap();
            (v["kind"].as_str().unwrap().to_owned(), doc.to_owned())
        })
        .collect()
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |xs: &[&str]| xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

#[test]
fn guess_plural_follows_the_kubernetes_code_generator() {
    for (kind, plural) in [
        ("FooBar", "foobars"),
        ("Pod", "pods"),
        ("Ingress", "ingresses"),
        ("NetworkPolicy", "networkpolicies"),
        ("Gateway", "gateways"),
        ("Mailbox", "mailboxes"),
        ("Batch", "batches"),
        ("Mesh", "meshes"),
        ("Leaf", "leaves"),
        ("Knife", "knives"),
        ("Quiz", "quizes"),
        ("X", "x"),
    ] {
        assert_eq!(guess_plural(kind), plural, "{kind}");
    }
}

#[test]
fn builtin_plurals_come_from_k8s_openapi_including_irregular_ones() {
    assert_eq!(plural("", "Endpoints", None), "endpoints");
    assert_eq!(
        guess_plural("Endpoints"),
        "endpointses",
        "the guess alone gets it wrong"
    );
    assert_eq!(plural("", "Pod", None), "pods");
    assert_eq!(plural("apps", "Deployment", None), "deployments");
    assert_eq!(
        plural("networking.k8s.io", "IngressClass", None),
        "ingressclasses"
    );
    // A built-in kind's plural wins over a configured one; a CRD takes the configured one.
    assert_eq!(plural("", "Pod", Some("pod")), "pods");
    assert_eq!(plural("example.com", "Octopus", Some("octopi")), "octopi");
    assert_eq!(plural("example.com", "Octopus", None), "octopuses");
}

#[test]
fn the_guess_matches_every_builtin_plural_but_endpoints() {
    let wrong: Vec<_> = BUILTINS
        .iter()
        .filter(|b| guess_plural(b.kind) != b.plural)
        .map(|b| b.kind)
        .collect();
    assert_eq!(wrong, ["Endpoints"]);
}

#[test]
fn cluster_wide_resources_get_one_cluster_role_with_list_and_watch_per_group() {
    let resources = [
        res("v1", "Pod", &[]),
        res("apps/v1", "Deployment", &[]),
        res("v1", "Node", &[]),
        res("v1", "Service", &[]),
    ];
    let yaml = render(&resources, &options(None)).unwrap();
    let docs = documents(&yaml);
    let kinds: Vec<_> = docs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["ClusterRole", "ClusterRoleBinding"]);
    let role: ClusterRole = serde_saphyr::from_str(&docs[0].1).unwrap();
    assert_eq!(role.metadata.name.as_deref(), Some("kubesink"));
    assert_eq!(
        role.rules.unwrap(),
        [
            rule(&[""], &["nodes", "pods", "services"], &["list", "watch"]),
            rule(&["apps"], &["deployments"], &["list", "watch"]),
        ]
    );
    let binding: ClusterRoleBinding = serde_saphyr::from_str(&docs[1].1).unwrap();
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, "kubesink");
    let subjects = binding.subjects.unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].name, "kubesink");
    assert_eq!(subjects[0].namespace.as_deref(), Some("kubesink"));
    assert!(yaml.starts_with("# Least-privilege RBAC for kubesink"));
}

#[test]
fn resources_that_name_their_namespaces_get_roles_there_and_no_cluster_role() {
    let resources = [
        res("v1", "Pod", &["shop", "payments"]),
        res("apps/v1", "Deployment", &["shop"]),
    ];
    let docs = documents(&render(&resources, &options(None)).unwrap());
    let kinds: Vec<_> = docs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["Role", "RoleBinding", "Role", "RoleBinding"]);
    let payments: Role = serde_saphyr::from_str(&docs[0].1).unwrap();
    assert_eq!(payments.metadata.namespace.as_deref(), Some("payments"));
    assert_eq!(
        payments.rules.unwrap(),
        [rule(&[""], &["pods"], &["list", "watch"])]
    );
    let shop: Role = serde_saphyr::from_str(&docs[2].1).unwrap();
    assert_eq!(shop.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(
        shop.rules.unwrap(),
        [
            rule(&[""], &["pods"], &["list", "watch"]),
            rule(&["apps"], &["deployments"], &["list", "watch"]),
        ]
    );
    let binding: RoleBinding = serde_saphyr::from_str(&docs[3].1).unwrap();
    assert_eq!(binding.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(
        (
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        ("Role", "kubesink")
    );
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        subject.namespace.as_deref(),
        Some("kubesink"),
        "the service account's namespace"
    );
}

#[test]
fn a_namespaced_entry_already_granted_cluster_wide_gets_no_role() {
    let resources = [
        res("v1", "Pod", &[]),
        res("v1", "Pod", &["shop"]),
        res("v1", "ConfigMap", &["shop"]),
    ];
    let docs = documents(&render(&resources, &options(None)).unwrap());
    let kinds: Vec<_> = docs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    );
    let role: Role = serde_saphyr::from_str(&docs[2].1).unwrap();
    assert_eq!(
        role.rules.unwrap(),
        [rule(&[""], &["configmaps"], &["list", "watch"])]
    );
}

#[test]
fn namespaces_on_a_cluster_scoped_kind_are_an_error_naming_the_entry() {
    let resources = [res("v1", "Pod", &[]), res("v1", "Node", &["default"])];
    let err = render(&resources, &options(None)).unwrap_err().to_string();
    assert_eq!(
        err,
        "resources.1.namespaces: v1 Node is cluster-scoped; remove the namespaces list"
    );
}

#[test]
fn leader_election_adds_a_role_for_its_lease_only() {
    let resources = [res("v1", "Pod", &[])];
    let docs = documents(&render(&resources, &options(Some(("ops", "kubesink-lock")))).unwrap());
    let kinds: Vec<_> = docs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    );
    let role: Role = serde_saphyr::from_str(&docs[2].1).unwrap();
    assert_eq!(
        role.metadata.name.as_deref(),
        Some("kubesink-leader-election")
    );
    assert_eq!(role.metadata.namespace.as_deref(), Some("ops"));
    let mut by_name = rule(&["coordination.k8s.io"], &["leases"], &["get", "update"]);
    by_name.resource_names = Some(vec!["kubesink-lock".into()]);
    assert_eq!(
        role.rules.unwrap(),
        [
            by_name,
            rule(&["coordination.k8s.io"], &["leases"], &["create"])
        ]
    );
    let binding: RoleBinding = serde_saphyr::from_str(&docs[3].1).unwrap();
    assert_eq!(binding.role_ref.name, "kubesink-leader-election");
    assert_eq!(binding.metadata.namespace.as_deref(), Some("ops"));
}

#[test]
fn scale_out_grants_the_groups_leases_without_names() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "k.toml",
            "[leader_election]\nenabled = true\nscale_out = true\nlease_namespace = \"ops\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n",
        )?;
        let yaml = generate(
            Some(Path::new("k.toml")),
            "kubesink",
            "kubesink",
            "kubesink",
        )
        .map(|g| g.yaml)
        .map_err(|e| e.to_string())?;
        let docs = documents(&yaml);
        let role: Role = serde_saphyr::from_str(&docs[2].1).unwrap();
        assert_eq!(role.metadata.namespace.as_deref(), Some("ops"));
        assert_eq!(
            role.rules.unwrap(),
            [rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["create", "delete", "get", "list", "update"]
            )]
        );
        Ok(())
    });
}

#[test]
fn generate_reads_resources_and_leader_election_from_file_and_environment() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "k.toml",
            r#"
[cluster]
name = "c"
[leader_election]
enabled = true
lease_namespace = "ops"
lease_duration = "15s"
[[resources]]
api_version = "example.com/v1"
kind = "Octopus"
plural = "octopi"
"#,
        )?;
        let yaml = generate(Some(Path::new("k.toml")), "ks", "sa", "team")
            .map(|g| g.yaml)
            .map_err(|e| e.to_string())?;
        assert!(yaml.contains("- octopi\n"), "{yaml}");
        assert!(yaml.contains("  namespace: ops\n"), "{yaml}");
        assert!(
            yaml.contains("- kubesink\n"),
            "the lease name defaults to the runtime's default: {yaml}"
        );
        assert!(yaml.contains("  name: sa\n  namespace: team\n"), "{yaml}");
        jail.set_env("KUBESINK_LEADER_ELECTION__ENABLED", "false");
        let yaml = generate(Some(Path::new("k.toml")), "ks", "sa", "team")
            .map(|g| g.yaml)
            .map_err(|e| e.to_string())?;
        assert!(!yaml.contains("leases"), "{yaml}");
        Ok(())
    });
}

#[test]
fn generate_reports_bad_resources_and_names_with_their_source() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "k.toml",
            "[leader_election]\nenabled = true\nlease_name = \"Not_A_Name\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nplural = \"Pods!\"\n",
        )?;
        let err = generate(
            Some(Path::new("k.toml")),
            "kubesink",
            "kubesink",
            "kubesink",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("resources.0.plural: \"Pods!\" is not a resource name"),
            "{err}"
        );
        jail.create_file(
            "k.toml",
            "[leader_election]\nenabled = true\nlease_name = \"Not_A_Name\"\n",
        )?;
        let err = generate(
            Some(Path::new("k.toml")),
            "kubesink",
            "kubesink",
            "kubesink",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("leader_election.lease_name: \"Not_A_Name\" is not a valid name")
                && err.ends_with("(from file k.toml)"),
            "{err}"
        );
        let err = generate(None, "kubesink", "Bad Account", "kubesink")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--service-account: \"Bad Account\""),
            "{err}"
        );
        Ok(())
    });
}

/// The Helm chart renders RBAC from `values.config.resources` itself (templates/_rbac.tpl);
/// its table of built-in plurals and scopes must be this module's, line for line.
#[test]
fn the_helm_charts_builtin_table_is_this_modules() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/kubesink/templates/_rbac.tpl");
    let tpl = std::fs::read_to_string(&path).unwrap();
    let begin = "{{- define \"kubesink.builtinKinds\" -}}\n";
    let start = tpl.find(begin).expect("the builtinKinds define") + begin.len();
    let end = start + tpl[start..].find("{{- end }}").expect("its end");
    let chart: Vec<&str> = tpl[start..end].lines().collect();
    let want: Vec<String> = BUILTINS
        .iter()
        .map(|b| {
            let scope = if b.namespaced {
                "namespaced"
            } else {
                "cluster"
            };
            format!(
                "{:?}: {{plural: {}, scope: {scope}}}",
                format!("{}/{}", b.group, b.kind),
                b.plural
            )
        })
        .collect();
    assert_eq!(
        chart,
        want,
        "replace the table in {} with:\n{}",
        path.display(),
        want.join("\n")
    );
}

/// Without `lease_name`, the Lease granted is the one kubesink takes at run time
/// (`kubesink`), not one named after `--name` (which names the RBAC objects only).
#[test]
fn the_default_lease_is_the_run_time_default_whatever_the_name() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("k.toml", "[leader_election]\nenabled = true\n")?;
        let yaml = generate(Some(Path::new("k.toml")), "topology", "sa", "ops")
            .map(|g| g.yaml)
            .map_err(|e| e.to_string())?;
        let roles: Vec<Role> = documents(&yaml)
            .into_iter()
            .filter(|(kind, _)| kind == "Role")
            .map(|(_, doc)| serde_saphyr::from_str(&doc).unwrap())
            .collect();
        assert_eq!(roles.len(), 1, "{yaml}");
        assert_eq!(
            roles[0].metadata.name.as_deref(),
            Some("topology-leader-election")
        );
        let rules = roles[0].rules.as_ref().unwrap();
        assert_eq!(
            rules[0].resource_names,
            Some(vec!["kubesink".to_owned()]),
            "{yaml}"
        );
        Ok(())
    });
}

#[test]
fn a_misspelt_builtin_kind_is_named_offline_with_the_nearest() {
    assert_eq!(
        unknown_builtin_kind("apps/v1", "Deploymnet").as_deref(),
        Some("apps/v1 has no kind \"Deploymnet\" (its kinds: ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet); did you mean \"Deployment\"?")
    );
    assert!(unknown_builtin_kind("v1", "pod").is_some_and(|w| w.ends_with("did you mean \"Pod\"?")));
    assert!(unknown_builtin_kind("v1", "Octopus").is_some_and(|w| !w.contains("did you mean")));
    // Known kinds, CRDs and group versions the table does not cover: only the server knows.
    assert_eq!(unknown_builtin_kind("apps/v1", "Deployment"), None);
    assert_eq!(unknown_builtin_kind("example.com/v1", "Octopus"), None);
    assert_eq!(unknown_builtin_kind("apps/v1beta9", "Deploymnet"), None);
    let w = kind_warnings(
        &[res("v1", "Pod", &[]), res("apps/v1", "Deploymnet", &[])],
        "clusters.2.",
    );
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("clusters.2.resources.1 (apps/v1 Deploymnet): apps/v1 has no kind"),
        "{w:?}"
    );
}

/// The group form grants every resource of its group (or its kinds' plurals), in its
/// namespaces' Roles when it lists some, and CRDs cluster-wide.
#[test]
fn the_group_form_grants_its_groups_resources_and_crds() {
    let mut group = ResourceConfig::new("", "");
    group.group = Some("example.com".into());
    let mut some = ResourceConfig::new("", "");
    some.group = Some("core".into());
    some.kinds = vec!["ConfigMap".into()];
    some.namespaces = vec!["shop".into()];
    let yaml = render(&[group, some], &options(None)).unwrap();
    let docs = documents(&yaml);
    let role_of = |kind: &str| {
        docs.iter()
            .find(|(k, _)| k == kind)
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| panic!("no {kind} in {yaml}"))
    };
    let cluster: ClusterRole = serde_saphyr::from_str(&role_of("ClusterRole")).unwrap();
    let watch = ["list", "watch"];
    assert_eq!(
        cluster.rules.unwrap(),
        vec![
            rule(
                &["apiextensions.k8s.io"],
                &["customresourcedefinitions"],
                &watch
            ),
            rule(&["example.com"], &["*"], &watch),
        ]
    );
    let role: Role = serde_saphyr::from_str(&role_of("Role")).unwrap();
    assert_eq!(role.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(
        role.rules.unwrap(),
        vec![rule(&[""], &["configmaps"], &watch)]
    );
}

/// With `enrich = ["owner"]`, the workload controllers the owner index watches by itself,
/// where the entries asking for owners watch, but for those an entry already follows there.
#[test]
fn owners_need_the_workload_controllers_the_index_watches() {
    let mut pods = res("v1", "Pod", &["shop"]);
    pods.enrich = vec![crate::config::Enrich::Owner];
    let yaml = render(&[pods, res("apps/v1", "ReplicaSet", &[])], &options(None)).unwrap();
    let docs = documents(&yaml);
    let role: Role =
        serde_saphyr::from_str(&docs.iter().find(|(k, _)| k == "Role").expect("a Role").1).unwrap();
    let watch = ["list", "watch"];
    assert_eq!(
        role.rules.unwrap(),
        vec![
            rule(&[""], &["pods"], &watch),
            rule(
                &["apps"],
                &["daemonsets", "deployments", "statefulsets"],
                &watch
            ),
            rule(&["batch"], &["cronjobs", "jobs"], &watch),
        ]
    );
}
