//! Restarts from saved state on a real kube-apiserver, with each state backend (a file, a
//! NATS object store on a real nats-server, a compacted topic on a real Kafka-protocol broker):
//! kubesink stopped (SIGTERM: its state saved), 5 creates, 5 updates and 5 deletes made while
//! it is down, started again: it sends exactly those 15 (the deletes inferred), nothing
//! `initial`, each update naming what changed since the first run's last message (the
//! saved change-path fingerprints), and the fold of both runs equals the API server (uid
//! and resourceVersion).

use kubesink_test_support::{self as support, kube_server, process};

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kube_server::{
    configmap, create, delete, live_state, namespace, patch_configmap, ControlPlane,
};
use process::{resource_toml, Kubesink, STDOUT_SINK};
use serde_json::{json, Value};
use support::{fold_equals, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);

fn write_config(dir: &Path, cp: &ControlPlane, ns: &str, state: &str) -> std::path::PathBuf {
    let resources = [
        resource_toml("v1", "ConfigMap", &[ns]),
        resource_toml("apps/v1", "Deployment", &[ns]),
    ]
    .concat();
    let rest = format!("[pipeline]\nlinger = \"20ms\"\n{state}\n{resources}{STDOUT_SINK}");
    process::write_config(dir, &format!("real-{ns}"), &cp.admin_kubeconfig, &rest)
}

const KINDS: &[(&str, &str)] = &[("v1", "ConfigMap"), ("apps/v1", "Deployment")];

/// Waits until the fold of `first`'s messages then `second`'s (read anew each time)
/// equals the live objects of `ns`.
async fn converged(cp: &ControlPlane, ns: &str, first: &[Value], second: &Kubesink) {
    let client = cp.admin().await;
    wait_until("the fold to equal the API server", LONG, || async {
        let live = live_state(&client, KINDS, |o| {
            o.metadata.namespace.as_deref() == Some(ns)
        })
        .await;
        let second = second.messages();
        fold_equals(
            &live,
            first.iter().chain(&second),
            Expect::STRICT.restarts(),
            |_| true,
        )
    })
    .await;
}

/// The scenario with `state` (a `[state]` section) in namespace `ns`.
async fn restart_sends_only_what_changed(ns: &str, state: &str) {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    namespace(cp, ns, json!({})).await;
    let client = cp.admin().await;
    for i in 0..30 {
        create(
            &client,
            configmap(ns, &format!("cm-{i:02}"), json!({"v": "0"})),
        )
        .await;
    }
    create(
        &client,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), cp, ns, state);
    let first = Kubesink::start(BIN, &config, dir.path(), "first", &[]);
    // Through the controllers' updates of the Deployment's status.
    wait_until("the first run to converge", LONG, || async {
        let live = live_state(&client, KINDS, |o| {
            o.metadata.namespace.as_deref() == Some(ns)
        })
        .await;
        fold_equals(&live, &first.messages(), Expect::STRICT, |_| true).map(|_| ())
    })
    .await;
    let first = first.terminate().await;

    let mut changed = [BTreeSet::new(), BTreeSet::new(), BTreeSet::new()];
    for i in 0..5 {
        let name = format!("cm-{i:02}");
        delete(&client, "v1", "ConfigMap", Some(ns), &name).await;
        changed[0].insert(name);
        let name = format!("cm-{:02}", 10 + i);
        patch_configmap(&client, ns, &name, json!({"v": "1"})).await;
        changed[1].insert(name);
        let name = format!("new-{i}");
        create(
            &client,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}}),
        )
        .await;
        changed[2].insert(name);
    }
    let second = Kubesink::start(BIN, &config, dir.path(), "second", &[]);
    converged(cp, ns, &first, &second).await;
    let all = second.terminate().await;
    // The change paths' fingerprints came back from the saved state: each update after the
    // restart names what changed since the first run's last message.
    let both: Vec<Value> = first.iter().chain(&all).cloned().collect();
    support::check_changed(&both, support::Changed::Covers).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        all.iter()
            .filter(|m| m["kind"] == "ConfigMap" && m["op"] == "updated")
            .all(|m| m["changed"] == json!(["data"])),
        "{all:#?}"
    );
    // The Deployment: re-sent only if its controller really changed it meanwhile.
    assert!(
        all.iter()
            .filter(|m| m["kind"] == "Deployment")
            .all(|m| m["op"] == "updated"),
        "{all:#?}"
    );
    let sent: Vec<Value> = all
        .into_iter()
        .filter(|m| m["kind"] == "ConfigMap")
        .collect();
    let names = |op: &str| -> BTreeSet<String> {
        sent.iter()
            .filter(|m| m["op"] == op)
            .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(names("deleted"), changed[0], "{sent:#?}");
    assert_eq!(names("updated"), changed[1], "{sent:#?}");
    assert_eq!(names("added"), changed[2], "{sent:#?}");
    assert_eq!(sent.len(), 15, "only what changed while down: {sent:#?}");
    assert!(sent.iter().all(|m| m["initial"] != true), "{sent:#?}");
    assert!(
        sent.iter()
            .filter(|m| m["op"] == "deleted")
            .all(|m| m["finalStateUnknown"] == true),
        "{sent:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_file_state_a_restart_sends_only_what_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = format!(
        "[state]\nbackend = \"file\"\npath = {:?}\n",
        dir.path().join("state").display().to_string()
    );
    restart_sends_only_what_changed("restart-file", &state).await;
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_nats_state_a_restart_sends_only_what_changed() {
    let nats = support::nats_server::NatsServer::start("");
    let state = format!(
        "[state]\nbackend = \"nats\"\n[state.nats]\nservers = [{:?}]\n",
        nats.url()
    );
    restart_sends_only_what_changed("restart-nats", &state).await;
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_kafka_state_a_restart_sends_only_what_changed() {
    let tansu = support::kafka_server::Tansu::start().await;
    let state = format!(
        "[state]\nbackend = \"kafka\"\n[state.kafka]\nbootstrap_servers = {:?}\n",
        tansu.bootstrap
    );
    restart_sends_only_what_changed("restart-kafka", &state).await;
}
