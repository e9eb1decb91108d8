//! Resource filters (CEL) on a real kube-apiserver: only the objects an
//! expression matches are followed; an object edited out of it is sent as `deleted` with
//! `reason: "leftFilter"` and the state that made it leave, one edited into it as `added`;
//! nothing at all is sent for an object never matched (not even its delete); a restart from
//! saved state sends `leftFilter` for an object that left while kubesink was down, and only
//! what changed. The oracle is the API server's objects kept by a Rust predicate written
//! apart from the CEL expression (uid and resourceVersion, `Expect::STRICT`), and
//! `kubesink fold --against-cluster` (which evaluates the configured filter on a live list)
//! agrees.

use kubesink_test_support::{self as support, kube_server, ports, process};

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kube::api::DynamicObject;
use kube_server::{create, delete, live_state, namespace, patch, ControlPlane};
use process::{resource_toml, Kubesink, STDOUT_SINK};
use serde_json::{json, Value};
use support::{fold_equals, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "filters";
const KINDS: &[(&str, &str)] = &[("v1", "ConfigMap"), ("apps/v1", "Deployment")];

fn write_config(dir: &Path, cp: &ControlPlane) -> std::path::PathBuf {
    let state = dir.join("state").display().to_string();
    let configmaps = resource_toml("v1", "ConfigMap", &[NS]);
    let deployments = resource_toml("apps/v1", "Deployment", &[NS]);
    let rest = format!(
        r#"[pipeline]
linger = "20ms"
coalesce = false
[state]
backend = "file"
path = {state:?}
{configmaps}filter = 'has(object.data) && "keep" in object.data && object.data.keep == "yes"'
{deployments}filter = 'object.spec.replicas > 0 && cluster == "real-filters" && ns == "{NS}"'
{STDOUT_SINK}"#
    );
    process::write_config(dir, "real-filters", &cp.admin_kubeconfig, &rest)
}

/// The oracle's predicate: what the two expressions mean, written in Rust.
fn kept(o: &DynamicObject) -> bool {
    if o.metadata.namespace.as_deref() != Some(NS) {
        return false;
    }
    // A list's items carry no kind: a Deployment is what has a spec.
    match o.data.get("spec") {
        Some(spec) => spec["replicas"].as_i64().unwrap_or(0) > 0,
        None => o.data["data"]["keep"] == "yes",
    }
}

async fn converged(cp: &ControlPlane, msgs: impl Fn() -> Vec<Value>) {
    let client = cp.admin().await;
    wait_until(
        "the fold to equal the filtered API server",
        LONG,
        || async {
            let live = live_state(&client, KINDS, kept).await;
            fold_equals(&live, &msgs(), Expect::STRICT.restarts(), |_| true)
        },
    )
    .await;
}

fn sent<'a>(msgs: &'a [Value], name: &str) -> Vec<&'a Value> {
    msgs.iter().filter(|m| m["name"] == name).collect()
}

/// Sets ConfigMap `name`'s `keep` (the ConfigMaps' filter reads it).
async fn set_keep(client: &kube::Client, name: &str, keep: &str) {
    let data = json!({"data": {"keep": keep}});
    patch(client, "v1", "ConfigMap", Some(NS), name, data).await;
}

/// Scales the Deployment `web` (the Deployments' filter reads `spec.replicas`).
async fn scale_web(client: &kube::Client, replicas: i32) {
    let spec = json!({"spec": {"replicas": replicas}});
    patch(client, "apps/v1", "Deployment", Some(NS), "web", spec).await;
}

fn cm(name: &str, keep: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS}, "data": {"keep": keep}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_matching_objects_are_followed_and_leaving_ones_are_deleted_with_left_filter() {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    namespace(cp, NS, json!({})).await;
    let client = cp.admin().await;
    for i in 0..20usize {
        let keep = if i.is_multiple_of(2) { "yes" } else { "no" };
        create(&client, cm(&format!("cm-{i:02}"), keep)).await;
    }
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no-data", "namespace": NS}}),
    )
    .await;
    create(&client, kube_server::deployment(NS, "web", 1, "nginx")).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), cp);
    let listen = format!("127.0.0.1:{}", ports::free_port());
    let server: std::net::SocketAddr = listen.parse().expect("listen");
    let first = Kubesink::start(
        BIN,
        &config,
        dir.path(),
        "first",
        &[("KUBESINK_SERVER__LISTEN", &listen)],
    );
    converged(cp, || first.messages()).await;
    let initial = first.messages();
    for m in &initial {
        let name = m["name"].as_str().unwrap_or_default();
        let i: usize = name
            .strip_prefix("cm-")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(
            name == "web" || (name.starts_with("cm-") && i.is_multiple_of(2)),
            "{name} does not match and was sent: {m}"
        );
    }

    // Edits in and out of the filters, creates and deletes on both sides.
    set_keep(&client, "cm-00", "no").await;
    set_keep(&client, "cm-01", "yes").await;
    delete(&client, "v1", "ConfigMap", Some(NS), "cm-02").await;
    delete(&client, "v1", "ConfigMap", Some(NS), "cm-03").await;
    create(&client, cm("new-in", "yes")).await;
    create(&client, cm("new-out", "no")).await;
    scale_web(&client, 0).await;
    converged(cp, || first.messages()).await;
    let msgs = first.messages();
    let left = sent(&msgs, "cm-00");
    let last = left.last().expect("cm-00 sent");
    assert_eq!(last["op"], "deleted", "{left:#?}");
    assert_eq!(last["reason"], "leftFilter", "{left:#?}");
    assert_eq!(
        last["object"]["data"]["keep"], "no",
        "the state that made it leave: {last}"
    );
    assert_eq!(last["finalStateUnknown"], false, "{last}");
    let web = sent(&msgs, "web");
    let last = web.last().expect("web sent");
    assert_eq!(
        (last["op"].as_str(), last["reason"].as_str()),
        (Some("deleted"), Some("leftFilter")),
        "{web:#?}"
    );
    assert_eq!(
        sent(&msgs, "cm-01").first().map(|m| m["op"].clone()),
        Some(json!("added"))
    );
    let gone = sent(&msgs, "cm-02");
    assert_eq!(
        gone.last()
            .map(|m| (m["op"].clone(), m.get("reason").cloned())),
        Some((json!("deleted"), None))
    );
    for never in ["cm-03", "new-out", "no-data"] {
        assert!(
            sent(&msgs, never).is_empty(),
            "{never} was never matched: {:#?}",
            sent(&msgs, never)
        );
    }
    let (_, metrics) = support::http_get(server, "/metrics").await;
    assert!(
        support::metric_value(&metrics, "kubesink_left_filter_deletes_total", &[]) >= 2.0,
        "{metrics}"
    );
    assert_eq!(
        support::metric_value(&metrics, "kubesink_filter_errors_total", &[]),
        0.0
    );

    // Down: cm-04 leaves, cm-05 enters, web is scaled back up, cm-06 is deleted.
    let first = first.terminate().await;
    set_keep(&client, "cm-04", "no").await;
    set_keep(&client, "cm-05", "yes").await;
    delete(&client, "v1", "ConfigMap", Some(NS), "cm-06").await;
    scale_web(&client, 2).await;
    let second = Kubesink::start(BIN, &config, dir.path(), "second", &[]);
    converged(cp, || {
        first.iter().cloned().chain(second.messages()).collect()
    })
    .await;
    let after = second.terminate().await;
    let ops: BTreeSet<(String, String, String)> = after
        .iter()
        .filter(|m| m["kind"] == "ConfigMap")
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_owned(),
                m["op"].as_str().unwrap_or_default().to_owned(),
                m["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let want: BTreeSet<(String, String, String)> = [
        ("cm-04", "deleted", "leftFilter"),
        ("cm-05", "added", ""),
        ("cm-06", "deleted", ""),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(ops, want, "only what changed while down: {after:#?}");
    assert!(
        after
            .iter()
            .any(|m| m["name"] == "web" && m["op"] == "added"),
        "web came back into its filter: {after:#?}"
    );

    // The CLI's comparison evaluates the configured filters on a live list and agrees.
    let stream: String = first
        .iter()
        .chain(&after)
        .map(|m| format!("{m}\n"))
        .collect();
    let file = dir.path().join("stream.jsonl");
    std::fs::write(&file, stream).expect("stream file");
    let (config_arg, file_arg) = (config.display().to_string(), file.display().to_string());
    let run = support::run_kubesink(
        &[
            "--config",
            &config_arg,
            "fold",
            "--file",
            &file_arg,
            "--against-cluster",
            "--compare-resource-version",
        ],
        b"",
    )
    .await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("in agreement with the cluster"),
        "{}",
        run.stderr
    );
}
