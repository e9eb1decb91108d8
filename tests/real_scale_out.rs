//! Scale-out on a real kube-apiserver (`leader_election.scale_out`, `docs/scale-out.md`):
//! three replicas spread six clusters (the real API server under six names) over themselves
//! on real `coordination.k8s.io/v1` Leases (created, listed by label, renewed, released and
//! deleted through the real server), under churn; one replica SIGKILLed, one replaced by a
//! rolling update. Every cluster's stream (the replicas' stdout, each cluster's messages in
//! `leaderEpoch` order: each holder of a cluster writes with a higher epoch than the one
//! before) folds to the API server's exact state, uid and resourceVersion. A replica's
//! `/metrics` and `/readyz` say which clusters it holds.

#[path = "support/kube_server.rs"]
mod kube_server;
#[path = "support/nats_server.rs"]
mod nats_server;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/process.rs"]
mod process;
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube_server::{create, delete, live_state, namespace, patch, ControlPlane};
use process::Kubesink;
use serde_json::{json, Value};
use support::{fold_equals, metric_value, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "scaleout";
const CLUSTERS: usize = 6;
const CONFIGMAPS: usize = 15;

fn cluster_name(i: usize) -> String {
    format!("r-{i}")
}

fn write_config(dir: &Path, kubeconfig: &Path, nats: &str) -> std::path::PathBuf {
    let names: Vec<String> = (0..CLUSTERS).map(cluster_name).collect();
    let clusters = support::clusters_toml(&names, kubeconfig);
    let path = dir.join("kubesink.toml");
    std::fs::write(
        &path,
        format!(
            r#"[leader_election]
enabled = true
scale_out = true
lease_name = "ksr"
lease_namespace = "{NS}"
lease_duration = "4s"
renew_deadline = "2500ms"
retry_period = "500ms"
[pipeline]
linger = "20ms"
[state]
backend = "nats"
[state.nats]
servers = [{nats:?}]
[[resources]]
api_version = "v1"
kind = "ConfigMap"
namespaces = ["{NS}"]
[[sinks]]
type = "stdout"
{clusters}"#
        ),
    )
    .expect("config");
    path
}

/// Each cluster Lease's holder while valid (renewed within its duration).
async fn holders(client: &kube::Client) -> BTreeMap<String, Option<String>> {
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), NS);
    let Ok(list) = api
        .list(&ListParams::default().labels("kubesink.io/group=ksr,kubesink.io/role=cluster"))
        .await
    else {
        return BTreeMap::new();
    };
    let now = jiff::Timestamp::now();
    list.items
        .into_iter()
        .map(|l| {
            let cluster = l
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubesink.io/cluster"))
                .cloned()
                .unwrap_or_default();
            let spec = l.spec.unwrap_or_default();
            let holder = spec.holder_identity.unwrap_or_default();
            let valid = !holder.is_empty()
                && spec.renew_time.is_some_and(|r| {
                    now.duration_since(r.0).as_secs_f64()
                        < spec.lease_duration_seconds.unwrap_or(0) as f64
                });
            (cluster, Some(holder).filter(|_| valid))
        })
        .collect()
}

/// Waits until the cluster Leases are held as the assignment over `members` says.
async fn held_as_assigned(client: &kube::Client, what: &str, members: &[&str], logs: &[&Kubesink]) {
    let names: Vec<String> = (0..CLUSTERS).map(cluster_name).collect();
    let want = support::assigned(&names, members);
    wait_until(what, LONG, || async {
        let got = holders(client).await;
        if got == want {
            return Ok(());
        }
        let tails: String = logs
            .iter()
            .map(|k| {
                let s = k.stderr();
                let tail: Vec<&str> = s.lines().rev().take(4).collect();
                format!("\n---\n{}", tail.join("\n"))
            })
            .collect();
        Err(format!("holders {got:?}, want {want:?}{tails}"))
    })
    .await;
}

/// The process's `/metrics` and `/readyz` (the address it logged).
async fn observe(k: &Kubesink) -> (String, u16, Value) {
    let log = k.stderr();
    let addr = log
        .lines()
        .find(|l| l.contains("serving /metrics"))
        .and_then(|l| l.split("addr=").nth(1))
        .map(|a| a.split_whitespace().next().unwrap_or_default().to_owned())
        .expect("the server's address is logged");
    let addr: std::net::SocketAddr = addr.parse().expect("an address");
    let (_, metrics) = support::http_get(addr, "/metrics").await;
    let (code, body) = support::http_get(addr, "/readyz").await;
    (
        metrics,
        code,
        serde_json::from_str(&body).unwrap_or(Value::Null),
    )
}

/// Every cluster's messages from every replica's stdout, in holder order: by `leaderEpoch`,
/// then in the order its holder wrote them.
fn per_cluster(outputs: &[Vec<Value>]) -> BTreeMap<String, Vec<Value>> {
    let mut by: BTreeMap<String, Vec<(u64, usize, usize, Value)>> = BTreeMap::new();
    for (p, out) in outputs.iter().enumerate() {
        for (i, m) in out.iter().enumerate() {
            let cluster = m["cluster"].as_str().unwrap_or_default().to_owned();
            let epoch = m["leaderEpoch"].as_u64().unwrap_or(0);
            by.entry(cluster)
                .or_default()
                .push((epoch, p, i, m.clone()));
        }
    }
    by.into_iter()
        .map(|(c, mut v)| {
            v.sort_by_key(|(e, p, i, _)| (*e, *p, *i));
            (c, v.into_iter().map(|(_, _, _, m)| m).collect())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_clusters_over_three_replicas_on_real_leases_fold_exactly_through_a_kill_and_a_rolling_update(
) {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    namespace(cp, NS, json!({})).await;
    let client = cp.admin().await;
    let nats = nats_server::NatsServer::start("");
    for i in 0..CONFIGMAPS {
        create(
            &client,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm-{i:02}"), "namespace": NS}, "data": {"v": "0"}}),
        )
        .await;
    }
    // Churn: an edit every 50 ms, round robin, and every 13th a delete and a re-create.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, client) = (stop.clone(), client.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("cm-{:02}", n % CONFIGMAPS as u64);
                if n.is_multiple_of(13) {
                    delete(&client, "v1", "ConfigMap", Some(NS), &name).await;
                    create(
                        &client,
                        json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": name, "namespace": NS}, "data": {"v": n.to_string()}}),
                    )
                    .await;
                } else {
                    patch(
                        &client,
                        "v1",
                        "ConfigMap",
                        Some(NS),
                        &name,
                        json!({"data": {"v": n.to_string()}}),
                    )
                    .await;
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            n
        })
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &cp.admin_kubeconfig, &nats.url());
    let id = |name: &'static str| [("KUBESINK_LEADER_ELECTION__IDENTITY", name)];
    let a = Kubesink::start(BIN, &config, dir.path(), "a", &id("a"));
    let b = Kubesink::start(BIN, &config, dir.path(), "b", &id("b"));
    let c = Kubesink::start(BIN, &config, dir.path(), "c", &id("c"));
    held_as_assigned(
        &client,
        "six clusters over a, b and c",
        &["a", "b", "c"],
        &[&a, &b, &c],
    )
    .await;

    // What a replica says it holds: its metrics and /readyz against the Leases.
    let mine: Vec<String> = holders(&client)
        .await
        .into_iter()
        .filter(|(_, h)| h.as_deref() == Some("a"))
        .map(|(c, _)| c)
        .collect();
    wait_until(
        "a's /readyz and metrics name what it holds",
        LONG,
        || async {
            let (metrics, code, body) = observe(&a).await;
            let held = metric_value(&metrics, "kubesink_scale_out_held_clusters", &[]);
            let listed: Vec<String> = body["held"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            // Each held cluster's queue is its own: the sink's series carry the cluster.
            let delivered = mine.iter().all(|c| {
                metric_value(
                    &metrics,
                    "kubesink_sink_delivered_messages_total",
                    &[("sink", "stdout"), ("cluster", c)],
                ) > 0.0
            });
            let ok = code == 200 && held as usize == mine.len() && listed == mine && delivered;
            ok.then_some(())
                .ok_or_else(|| format!("held {held}, /readyz {code} {body}, Leases {mine:?}"))
        },
    )
    .await;

    // SIGKILL b: a and c take its clusters.
    let b_out = b.kill().await;
    held_as_assigned(
        &client,
        "b's clusters taken by a and c",
        &["a", "c"],
        &[&a, &c],
    )
    .await;

    // A rolling update: c leaves (SIGTERM: drain, save, release), c2 joins.
    let c_out = c.terminate().await;
    let c2 = Kubesink::start(BIN, &config, dir.path(), "c2", &id("c2"));
    held_as_assigned(
        &client,
        "the clusters over a and c2",
        &["a", "c2"],
        &[&a, &c2],
    )
    .await;

    stop.store(true, Ordering::Relaxed);
    let edits = churn.await.expect("churn");
    eprintln!("{edits} edits under churn");
    wait_until(
        "every cluster's fold to equal the API server",
        LONG,
        || async {
            let live = live_state(&client, &[("v1", "ConfigMap")], |o| {
                o.metadata.namespace.as_deref() == Some(NS)
            })
            .await;
            let outputs = vec![a.messages(), b_out.clone(), c_out.clone(), c2.messages()];
            let by = per_cluster(&outputs);
            let mut bad = Vec::new();
            for i in 0..CLUSTERS {
                let name = cluster_name(i);
                let msgs = by.get(&name).cloned().unwrap_or_default();
                if let Err(e) = fold_equals(&live, &msgs, Expect::STRICT.restarts(), |_| true) {
                    bad.push(format!("{name}: {e}"));
                }
            }
            bad.is_empty().then_some(()).ok_or_else(|| bad.join("\n"))
        },
    )
    .await;
    c2.terminate().await;
    a.terminate().await;
}
