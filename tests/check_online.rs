//! `kubesink check --online`, the real binary against simulators over HTTP: every line ok;
//! a misspelt kind with the nearest served one; a bad label selector with the API server's
//! message; a denied watch and Lease; an unreachable cluster named beside a reachable one;
//! `--as` impersonating the service account.

use kubesink_test_support as support;

use kubesink_sim::{Denial, SimConfig, Workload};
use support::*;

/// A configuration file for `clusters` (name, kubeconfig), with `body` appended (resources,
/// leader election...).
fn config_file(dir: &tempfile::TempDir, clusters: &[(&str, &Cluster)], body: &str) -> String {
    let mut text = String::new();
    for (name, c) in clusters {
        text.push_str(&format!(
            "[[clusters]]\nname = {name:?}\nkubeconfig = {:?}\n",
            c.kubeconfig.display().to_string()
        ));
    }
    text.push_str(body);
    let path = dir.path().join("kubesink.toml");
    std::fs::write(&path, text).expect("write config");
    path.display().to_string()
}

async fn check_online(config: &str) -> FoldRun {
    run_kubesink(&["check", "--online", "--config", config], b"").await
}

const POD: &str = "[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n";

async fn populated() -> Cluster {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 10,
            deployments: 2,
            nodes: 2,
            seed: 3,
            ..Default::default()
        })
        .expect("populate");
    c
}

#[tokio::test]
async fn every_resource_found_selected_and_allowed_prints_ok_lines_and_exits_0() {
    let c = populated().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        &dir,
        &[("prod-eu-1", &c)],
        "[leader_election]\nenabled = true\nlease_namespace = \"kubesink\"\n\
         [[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nlabel_selector = \"app in (web, api),tier\"\n\
         [[resources]]\napi_version = \"apps/v1\"\nkind = \"Deployment\"\nnamespaces = [\"team-a\", \"team-b\"]\n\
         [[resources]]\napi_version = \"v1\"\nkind = \"Node\"\nfield_selector = \"metadata.name!=x\"\n",
    );
    let out = check_online(&config).await;
    assert_eq!(
        out.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(
        out.stdout,
        "ok   prod-eu-1 v1/Pod (all namespaces): found, selector ok, list+watch allowed\n\
         ok   prod-eu-1 apps/v1/Deployment (namespaces team-a, team-b): found, list ok, list+watch allowed\n\
         ok   prod-eu-1 v1/Node (cluster-scoped): found, selector ok, list+watch allowed\n\
         ok   prod-eu-1 Lease kubesink/kubesink: get+create+update allowed\n"
    );
    assert!(
        out.stderr.contains("online check: 4 ok, 0 failed"),
        "{}",
        out.stderr
    );
    // A LIST with limit=1 and the selector per scope, and access reviews, were sent.
    let asked: Vec<String> = c
        .sim
        .requests()
        .into_iter()
        .map(|r| format!("{} {}", r.method, r.path_and_query))
        .collect();
    let sent = |method_path: &str, query: &[&str]| {
        asked
            .iter()
            .any(|a| a.starts_with(method_path) && query.iter().all(|q| a.contains(q)))
    };
    assert!(
        sent("GET /api/v1/pods?", &["limit=1", "labelSelector=app"]),
        "{asked:#?}"
    );
    assert!(
        sent(
            "GET /apis/apps/v1/namespaces/team-b/deployments?",
            &["limit=1"]
        ),
        "{asked:#?}"
    );
    assert!(
        sent(
            "POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            &[]
        ),
        "{asked:#?}"
    );
}

#[tokio::test]
async fn a_misspelt_kind_fails_with_the_nearest_served_kind() {
    let c = populated().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        &dir,
        &[("prod-eu-1", &c)],
        "[[resources]]\napi_version = \"v1\"\nkind = \"Pdo\"\n\
         [[resources]]\napi_version = \"v1\"\nkind = \"Deployment\"\n\
         [[resources]]\napi_version = \"app/v1\"\nkind = \"Deployment\"\n\
         [[resources]]\napi_version = \"apps/v2\"\nkind = \"Deployment\"\n\
         [[resources]]\napi_version = \"v1\"\nkind = \"Node\"\n",
    );
    let out = check_online(&config).await;
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert_eq!(
        out.stdout,
        "FAIL prod-eu-1 v1/Pdo (all namespaces): kind \"Pdo\" not served by v1 (did you mean \"Pod\"?)\n\
         FAIL prod-eu-1 v1/Deployment (all namespaces): kind \"Deployment\" not served by v1 (served by apps/v1)\n\
         FAIL prod-eu-1 app/v1/Deployment (all namespaces): API group \"app\" not served (did you mean \"apps\"?)\n\
         FAIL prod-eu-1 apps/v2/Deployment (all namespaces): apps/v2 not served (the API group apps serves v1)\n\
         ok   prod-eu-1 v1/Node (cluster-scoped): found, list ok, list+watch allowed\n"
    );
    assert!(
        out.stderr.contains("online check: 1 ok, 4 failed"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn a_bad_label_selector_fails_with_the_api_servers_message() {
    let c = populated().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        &dir,
        &[("prod-eu-1", &c)],
        "[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nnamespaces = [\"a\", \"b\"]\nlabel_selector = \"app in (web\"\n\
         [[resources]]\napi_version = \"v1\"\nkind = \"Service\"\nfield_selector = \"spec.foo=x\"\n",
    );
    let out = check_online(&config).await;
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert_eq!(
        out.stdout,
        "FAIL prod-eu-1 v1/Pod (namespaces a, b): label selector \"app in (web\" rejected by the API server: unable to parse requirement: app in (web\n\
         FAIL prod-eu-1 v1/Service (all namespaces): field selector \"spec.foo=x\" rejected by the API server: field label not supported: spec.foo\n"
    );
}

#[tokio::test]
async fn a_denied_watch_and_lease_update_fail_naming_verb_and_namespace() {
    let c = populated().await;
    for rule in ["watch:pods:team-b", "update:leases.coordination.k8s.io"] {
        c.sim.faults().deny(Denial::parse(rule).unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        &dir,
        &[("prod-eu-1", &c)],
        "[leader_election]\nenabled = true\nlease_namespace = \"kubesink\"\n\
         [[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nnamespaces = [\"team-a\", \"team-b\"]\n\
         [[resources]]\napi_version = \"v1\"\nkind = \"Node\"\n",
    );
    let out = check_online(&config).await;
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert_eq!(
        out.stdout,
        "FAIL prod-eu-1 v1/Pod (namespaces team-a, team-b): watch denied in namespace team-b (`kubesink rbac` prints the RBAC this configuration needs)\n\
         ok   prod-eu-1 v1/Node (cluster-scoped): found, list ok, list+watch allowed\n\
         FAIL prod-eu-1 Lease kubesink/kubesink: update denied (`kubesink rbac` prints the RBAC this configuration needs)\n"
    );
}

#[tokio::test]
async fn an_unreachable_cluster_is_named_with_its_error_and_the_others_are_still_checked() {
    let east = populated().await;
    let west = cluster(SimConfig::default()).await;
    west.sim.faults().set_unreachable(true);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&dir, &[("east", &east), ("west", &west)], POD);
    let out = check_online(&config).await;
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert_eq!(
        lines[0],
        "ok   east v1/Pod (all namespaces): found, list ok, list+watch allowed"
    );
    assert!(
        lines[1].starts_with("FAIL west: cluster unreachable, nothing checked: ")
            && lines[1].len() > "FAIL west: cluster unreachable, nothing checked: ".len(),
        "{}",
        lines[1]
    );
    assert!(
        out.stderr
            .contains("online check: 1 ok, 1 failed; unreachable, not checked: west"),
        "{}",
        out.stderr
    );

    // Nothing listening at all: the connection's own error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = std::fs::read_to_string(&west.kubeconfig).unwrap().replace(
        &west.sim.url().unwrap(),
        &format!("http://127.0.0.1:{port}"),
    );
    std::fs::write(&west.kubeconfig, kubeconfig).unwrap();
    let out = check_online(&config).await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stdout
            .contains("FAIL west: cluster unreachable, nothing checked: ")
            && out.stdout.contains("Connection refused"),
        "{}",
        out.stdout
    );
}

#[tokio::test]
async fn the_offline_check_runs_first_and_stops_a_bad_configuration() {
    let c = populated().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        &dir,
        &[("prod-eu-1", &c)],
        "[[resources]]\napi_version = \"/v1\"\nkind = \"Pod\"\n",
    );
    let out = check_online(&config).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.stdout, "", "no cluster was asked");
    assert!(out.stderr.contains("api_version"), "{}", out.stderr);
    assert!(c.sim.requests().is_empty(), "{:?}", c.sim.requests());
}

#[tokio::test]
async fn as_user_sends_every_request_impersonating_that_user() {
    let c = populated().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&dir, &[("prod-eu-1", &c)], POD);
    let user = "system:serviceaccount:kubesink:kubesink";
    let out = run_kubesink(
        &["check", "--online", "--as", user, "--config", &config],
        b"",
    )
    .await;
    assert_eq!(out.code, Some(0), "stderr:\n{}", out.stderr);
    let requests = c.sim.requests();
    assert!(requests.len() >= 4, "{requests:?}");
    assert!(
        requests
            .iter()
            .all(|r| r.impersonate_user.as_deref() == Some(user)),
        "{requests:#?}"
    );
    // Without --as, the client's own identity.
    let out = check_online(&config).await;
    assert_eq!(out.code, Some(0));
    assert!(c.sim.requests().last().unwrap().impersonate_user.is_none());
}
