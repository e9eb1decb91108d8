//! Sync markers (`pipeline.sync_markers`) end to end against the simulator, through the
//! pipeline to a capturing sink: one marker per list of each watch, after every message of
//! that list, with the live count; again after a relist, as a differences-only list.

use kubesink_test_support as support;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::ResourceConfig;
use kubesink_core::Sink;
use kubesink_sim::{SimConfig, Workload};
use serde_json::Value;
use support::*;

const LONG: Duration = Duration::from_secs(60);

/// A watch's scope as markers name it: (kind, namespace or "").
type Scope = (String, String);

fn scope_of(m: &Value) -> Scope {
    (
        m["kind"].as_str().unwrap_or_default().to_owned(),
        m["namespace"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The markers in `msgs[from..]` by scope, each checked to be the last message of its
/// scope there (the list's messages all came before it, and nothing else followed).
fn markers_last_of_their_scope(msgs: &[Value], from: usize) -> BTreeMap<Scope, Value> {
    let mut markers = BTreeMap::new();
    for (i, m) in msgs.iter().enumerate().skip(from) {
        if m["op"] != "synced" {
            continue;
        }
        let scope = scope_of(m);
        // Only the markers of later lists of the same watch may follow (410 answers are
        // handed to whichever watch asks first, so a watch may relist twice).
        let after: Vec<String> = msgs[i + 1..]
            .iter()
            .filter(|x| scope_of(x) == scope && x["op"] != "synced")
            .map(|x| format!("{} {} {}", x["op"], x["name"], x["resourceVersion"]))
            .collect();
        assert!(
            after.is_empty(),
            "{scope:?}: messages after the marker of its list (rv {}): {after:?}",
            m["resourceVersion"]
        );
        markers.insert(scope, m.clone());
    }
    markers
}

/// The simulator's count of live objects per marker scope.
fn live(c: &Cluster, kind: &str, namespace: Option<&str>) -> usize {
    c.sim
        .objects("v1", kind)
        .iter()
        .filter(|o| namespace.is_none_or(|ns| o["metadata"]["namespace"] == ns))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_close_the_initial_list_and_each_relist_of_every_watch_with_the_live_count() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 3,
            pods: 300,
            deployments: 3,
            nodes: 20,
            seed: 14,
            ..Default::default()
        })
        .unwrap();
    let mut pods = ResourceConfig::new("v1", "Pod");
    pods.namespaces = vec!["default".into(), "ns-1".into()];
    let mut cfg = config(&c.kubeconfig, vec![pods, ResourceConfig::new("v1", "Node")]);
    cfg.pipeline.sync_markers = true;
    cfg.pipeline.max_batch_events = 7; // many batches: the marker must still come last
    let sink = CaptureSink::new();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    let bridge = Bridge::start(&plan(&cfg), client, sinks).await.unwrap();
    let count_markers = |msgs: &[Value]| msgs.iter().filter(|m| m["op"] == "synced").count();
    wait_for("three markers", LONG, || {
        count_markers(&sink.messages()) == 3
    })
    .await;

    let msgs = sink.messages();
    assert_schema_valid(&schema(), &msgs);
    let first = markers_last_of_their_scope(&msgs, 0);
    assert_eq!(first.len(), 3);
    let expected = [
        (
            ("Pod".to_owned(), "default".to_owned()),
            live(&c, "Pod", Some("default")),
            "namespace",
        ),
        (
            ("Pod".to_owned(), "ns-1".to_owned()),
            live(&c, "Pod", Some("ns-1")),
            "namespace",
        ),
        (
            ("Node".to_owned(), String::new()),
            live(&c, "Node", None),
            "cluster",
        ),
    ];
    for (scope, count, kind) in &expected {
        let at = msgs
            .iter()
            .position(|m| m["op"] == "synced" && scope_of(m) == *scope)
            .unwrap_or_else(|| panic!("no marker for {scope:?}"));
        let m = &msgs[at];
        let listed: Vec<&Value> = msgs
            .iter()
            .filter(|x| x["op"] != "synced" && scope_of(x) == *scope)
            .collect();
        assert_eq!(listed.len(), *count, "{scope:?}: every object listed once");
        assert!(
            *count > 0,
            "{scope:?}: the workload spreads pods over namespaces"
        );
        assert!(
            msgs[at..]
                .iter()
                .all(|x| x["op"] == "synced" || scope_of(x) != *scope),
            "{scope:?}: a message of the list after its marker"
        );
        assert_eq!(m["count"], *count as u64, "{scope:?}");
        assert_eq!(
            (m["scope"].as_str(), m["initial"].as_bool()),
            (Some(*kind), Some(true))
        );
        // The marker carries the list's own resourceVersion: at least its newest object's.
        let max_rv = listed
            .iter()
            .filter_map(|x| x["resourceVersion"].as_str()?.parse::<u64>().ok())
            .max()
            .unwrap_or_default();
        let list_rv: u64 = m["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| {
                panic!("{scope:?}: marker resourceVersion {}", m["resourceVersion"])
            });
        assert!(list_rv >= max_rv, "{scope:?}: {list_rv} < {max_rv}");
        assert!(m.get("object").is_none() && m.get("uid").is_none());
    }

    // Churn, then a relist of every watch: markers again, after the relist's differences.
    c.sim.churn_steps(150, 3).unwrap();
    let before = sink.len();
    let lists = || -> Vec<u64> {
        bridge
            .informer_stats()
            .iter()
            .map(|(_, s)| s.lists.load(Ordering::SeqCst))
            .collect()
    };
    let lists_before = lists();
    // Every watch must meet a 410: answers go to whichever watch asks first, so keep
    // answering 410 until each has relisted, then stop.
    c.sim.faults().fail_next_watches_with_gone(1000);
    c.sim.faults().close_all_watches();
    wait_for("every watch relisted", LONG, || {
        lists()
            .iter()
            .zip(&lists_before)
            .all(|(now, was)| now > was)
    })
    .await;
    c.sim.faults().clear();
    wait_for("a marker for every watch", LONG, || {
        markers_last_of_their_scope(&sink.messages(), before).len() == expected.len()
    })
    .await;
    let msgs = sink.messages();
    let relisted = markers_last_of_their_scope(&msgs, before);
    for (scope, _, _) in &expected {
        let (kind, ns) = scope;
        let m = &relisted[scope];
        let want = live(&c, kind, (!ns.is_empty()).then_some(ns.as_str()));
        assert_eq!(m["count"], want as u64, "{scope:?} after the relist");
        assert_eq!(m["initial"], false, "a relist sends differences only");
    }
    assert_schema_valid(&schema(), &msgs);
    bridge.shutdown().await;
}
