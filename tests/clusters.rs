//! Several clusters in one process: two simulators, each labelled with its own name, each
//! with its own watches; one going down does not stop the other, and readiness names it.

use kubesink_test_support as support;

use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::{ClusterEntry, ResourceConfig};
use kubesink_core::Sink;
use kubesink_sim::{SimConfig, Workload};
use serde_json::Value;
use support::*;

const LONG: Duration = Duration::from_secs(60);

fn of(msgs: &[Value], cluster: &str) -> Vec<Value> {
    msgs.iter()
        .filter(|m| m["cluster"] == cluster)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_flow_independently_and_a_dead_one_is_named() {
    let east = cluster(SimConfig::default()).await;
    let west = cluster(SimConfig::default()).await;
    for (c, seed) in [(&east, 1), (&west, 2)] {
        c.sim
            .populate(&Workload {
                namespaces: 2,
                pods: 40,
                seed,
                ..Default::default()
            })
            .unwrap();
    }
    let mut cfg = config(&east.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    cfg.cluster.name = String::new();
    cfg.cluster.kubeconfig = None;
    cfg.watch.retry_max_backoff = kubesink::config::HumanDuration(Duration::from_secs(1));
    cfg.clusters = vec![
        ClusterEntry {
            name: "east".into(),
            kubeconfig: Some(east.kubeconfig.clone()),
            context: None,
            resources: None,
            shards: 1,
        },
        ClusterEntry {
            name: "west".into(),
            kubeconfig: Some(west.kubeconfig.clone()),
            context: None,
            resources: None,
            shards: 1,
        },
    ];
    let mut clients = Vec::new();
    for spec in cfg.clusters() {
        clients.push(kubesink::cluster::client(&spec).await.unwrap());
    }
    let sink = CaptureSink::new();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let bridge = Bridge::start_with(&plan(&cfg), clients, sinks, None)
        .await
        .unwrap();
    let addr = bridge.server_addr().unwrap();
    wait_for("both clusters listed", LONG, || sink.len() >= 80).await;
    let msgs = sink.messages();
    for (name, c) in [("east", &east), ("west", &west)] {
        let mine = of(&msgs, name);
        assert_eq!(fold(&mine), sim_state(&c.sim, &[("v1", "Pod")]), "{name}");
        assert!(mine
            .iter()
            .all(|m| m["object"]["metadata"]["labels"]["kubesink.io/cluster"] == name));
    }

    // west goes down; east keeps flowing.
    west.sim.faults().set_unreachable(true);
    west.sim.faults().close_all_watches();
    east.sim.churn_steps(50, 7).unwrap();
    let want = sim_state(&east.sim, &[("v1", "Pod")]);
    wait_for("east still flows", LONG, || {
        fold(&of(&sink.messages(), "east")) == want
    })
    .await;
    let body: Value = wait_until("readiness to name west degraded", LONG, || async {
        let (_, b) = http_get(addr, "/readyz").await;
        let body: Value = serde_json::from_str(&b).unwrap();
        if body["degraded"].to_string().contains("west") {
            Ok(body)
        } else {
            Err(b)
        }
    })
    .await;
    assert!(
        body["degraded"].to_string().contains("west v1 Pod"),
        "{body}"
    );
    assert!(!body["degraded"].to_string().contains("east"), "{body}");
    let (live, _) = http_get(addr, "/healthz").await;
    assert_eq!(
        live, 200,
        "an unreachable cluster among several does not fail liveness"
    );

    // west comes back and catches up.
    west.sim.churn_steps(20, 9).unwrap();
    west.sim.faults().set_unreachable(false);
    let want = sim_state(&west.sim, &[("v1", "Pod")]);
    wait_for("west catches up", LONG, || {
        fold(&of(&sink.messages(), "west")) == want
    })
    .await;
    bridge.shutdown().await;
}
