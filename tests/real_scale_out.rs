//! Scale-out on a real kube-apiserver (`leader_election.scale_out`, `docs/scale-out.md`):
//! three replicas spread six clusters (the real API server under six names) over themselves
//! on real `coordination.k8s.io/v1` Leases (created, listed by label, renewed, released and
//! deleted through the real server), under churn; one replica SIGKILLed, one replaced by a
//! rolling update. Every cluster's stream (the replicas' stdout, each cluster's messages in
//! `leaderEpoch` order: each holder of a cluster writes with a higher epoch than the one
//! before) folds to the API server's exact state, uid and resourceVersion. A replica's
//! `/metrics` and `/readyz` say which clusters it holds.

use kubesink_test_support::{self as support, kube_server, leases, nats_server, process};

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube_server::{
    configmap, create, delete, live_state, namespace, patch_configmap, ControlPlane,
};
use leases::{holders, observe, per_cluster};
use process::{leader_toml, nats_state_toml, resource_toml, Kubesink, STDOUT_SINK};
use serde_json::json;
use support::{fold_equals, metric_value, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "scaleout";
const CLUSTERS: usize = 6;
const CONFIGMAPS: usize = 15;

fn cluster_name(i: usize) -> String {
    format!("r-{i}")
}

/// Waits until the cluster Leases are held as the assignment over `members` says.
async fn held_as_assigned(client: &kube::Client, what: &str, members: &[&str], logs: &[&Kubesink]) {
    let names: Vec<String> = (0..CLUSTERS).map(cluster_name).collect();
    leases::held_as_assigned(client, what, (NS, "ksr"), &names, members, logs, LONG).await;
}

fn write_config(dir: &Path, kubeconfig: &Path, nats: &str) -> std::path::PathBuf {
    let names: Vec<String> = (0..CLUSTERS).map(cluster_name).collect();
    let clusters = support::clusters_toml(&names, kubeconfig);
    let configmaps = resource_toml("v1", "ConfigMap", &[NS]);
    let path = dir.join("kubesink.toml");
    let (leader, state) = (leader_toml("ksr", NS, true), nats_state_toml(nats));
    let text = format!(
        "{leader}[pipeline]\nlinger = \"20ms\"\n{state}{configmaps}{STDOUT_SINK}{clusters}"
    );
    std::fs::write(&path, text).expect("config");
    path
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
            configmap(NS, &format!("cm-{i:02}"), json!({"v": "0"})),
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
                    create(&client, configmap(NS, &name, json!({"v": n.to_string()}))).await;
                } else {
                    patch_configmap(&client, NS, &name, json!({"v": n.to_string()})).await;
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
    let mine: Vec<String> = holders(&client, NS, "ksr")
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

    // SIGKILL b: a and c take its clusters. Meanwhile a's failover gauge for b's clusters
    // (seconds since their holder renewed) climbs past renew_deadline, a logs b as lost and
    // its /readyz lists b apart; once taken over, the gauge is back under it.
    let of_b: Vec<String> = holders(&client, NS, "ksr")
        .await
        .into_iter()
        .filter(|(_, h)| h.as_deref() == Some("b"))
        .map(|(c, _)| c)
        .collect();
    assert!(!of_b.is_empty(), "b holds its share");
    let renewed = |metrics: &str| {
        of_b.iter()
            .filter_map(|c| {
                support::metric(
                    metrics,
                    "kubesink_scale_out_cluster_lease_renewed_seconds",
                    &[("cluster", c)],
                )
            })
            .fold(0.0f64, f64::max)
    };
    let b_out = b.kill().await;
    let (climbed, lost_listed) = wait_until(
        "a's gauge for b's clusters past renew_deadline",
        LONG,
        || async {
            let (metrics, _, body) = observe(&a).await;
            let ago = renewed(&metrics);
            let lost = body["members_lost"].to_string();
            (ago >= 2.5)
                .then_some((ago, lost.clone()))
                .ok_or_else(|| format!("{ago}s; lost {lost}"))
        },
    )
    .await;
    held_as_assigned(
        &client,
        "b's clusters taken by a and c",
        &["a", "c"],
        &[&a, &c],
    )
    .await;
    let after = wait_until(
        "a's gauge back under renew_deadline: renewed by the new holders",
        LONG,
        || async {
            let ago = renewed(&observe(&a).await.0);
            (ago < 2.5).then_some(ago).ok_or_else(|| format!("{ago}s"))
        },
    )
    .await;
    assert!(
        a.stderr()
            .lines()
            .any(|l| l.contains("scale-out member lost") && l.contains("member=b")),
        "a logs b lost: {}",
        a.stderr()
    );
    eprintln!("failover gauge for b's clusters on a: {climbed:.1}s before the take-over, {after:.1}s after; /readyz members_lost then: {lost_listed}");

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
    // The failover as the messages show it: per cluster of b, the longest stretch without
    // a message observed, from b's last to its next holder's first.
    let a_out = a.messages();
    let by = per_cluster(&[a_out.clone(), b_out.clone(), c_out.clone(), c2.messages()]);
    let mut gaps = Vec::new();
    for c in &of_b {
        let mut times: Vec<i64> = by
            .get(c)
            .into_iter()
            .flatten()
            .filter_map(|m| m["observedAt"].as_str())
            .filter_map(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| t.as_millisecond())
            .collect();
        times.sort_unstable();
        let gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        gaps.push(gap);
    }
    eprintln!("emission gap per cluster of b (ms, lease_duration 4 s): {gaps:?}");
    c2.terminate().await;
    a.terminate().await;
}
