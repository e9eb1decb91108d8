//! End-to-end informer semantics against the Kubernetes API simulator over real HTTP.

use kubesink_test_support as support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::{Config, PayloadMode, ResourceConfig};
use kubesink_core::Sink;
use kubesink_sim::{SimConfig, Workload};
use support::*;

const LONG: Duration = Duration::from_secs(60);

async fn client(c: &Config) -> kube::Client {
    kubesink::cluster::client(&c.clusters()[0])
        .await
        .expect("client")
}

async fn start(c: &Config, sink: &Arc<CaptureSink>) -> Bridge {
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    Bridge::start(&plan(c), client(c).await, sinks)
        .await
        .expect("bridge starts")
}

fn synced(b: &Bridge) -> bool {
    b.informer_stats()
        .iter()
        .all(|(_, s)| s.synced.load(Ordering::SeqCst))
}

fn three_kinds() -> Vec<ResourceConfig> {
    vec![
        ResourceConfig::new("v1", "Pod"),
        ResourceConfig::new("v1", "Node"),
        ResourceConfig::new(FOOBAR_API, "FooBar"),
    ]
}

const KINDS: [(&str, &str); 3] = [("v1", "Pod"), ("v1", "Node"), (FOOBAR_API, "FooBar")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_list_emits_one_added_per_object_with_cluster_label() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 4,
            pods: 500,
            nodes: 200,
            foobars: 300,
            seed: 7,
            ..Default::default()
        })
        .unwrap();
    let cfg = config(&c.kubeconfig, three_kinds());
    let sink = CaptureSink::new();
    let bridge = start(&cfg, &sink).await;
    wait_for("1000 messages", LONG, || sink.len() >= 1000).await;
    wait_for("initial sync", LONG, || synced(&bridge)).await;
    bridge.shutdown().await;
    let msgs = sink.messages();
    assert_eq!(msgs.len(), 1000);
    assert!(msgs
        .iter()
        .all(|m| m["op"] == "added" && m["initial"] == true && m["finalStateUnknown"] == false));
    assert!(msgs
        .iter()
        .all(|m| m["object"]["metadata"]["labels"]["kubesink.io/cluster"] == "test"));
    assert!(msgs.iter().all(|m| m["cluster"] == "test"));
    let count = |k: &str| msgs.iter().filter(|m| m["kind"] == k).count();
    assert_eq!(
        (count("Pod"), count("Node"), count("FooBar")),
        (500, 200, 300)
    );
    assert!(msgs
        .iter()
        .filter(|m| m["kind"] == "Node")
        .all(|m| m.get("namespace").is_none()));
    assert_eq!(fold(&msgs), sim_state(&c.sim, &KINDS));
    assert_schema_valid(&schema(), &msgs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_is_followed_exactly_and_a_quiet_relist_emits_nothing() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 3,
            pods: 200,
            nodes: 20,
            foobars: 50,
            seed: 1,
            ..Default::default()
        })
        .unwrap();
    let sink = CaptureSink::new();
    let bridge = start(&config(&c.kubeconfig, three_kinds()), &sink).await;
    wait_for("initial sync", LONG, || {
        synced(&bridge) && sink.len() == 270
    })
    .await;

    let stats = c.sim.churn_steps(300, 42).unwrap();
    let want = sim_state(&c.sim, &KINDS);
    wait_for("fold equals the simulator after churn", LONG, || {
        fold(&sink.messages()) == want
    })
    .await;
    let msgs = sink.messages();
    let ops = |op: &str| {
        msgs.iter()
            .filter(|m| m["op"] == op && m["initial"] == false)
            .count()
    };
    assert!(
        ops("updated") > 0 && ops("deleted") > 0 && ops("added") > 270 - 270,
        "{stats:?}"
    );
    assert_schema_valid(&schema(), &msgs);
    // Each update names the paths its object differs in from the key's previous message
    // (the pipeline coalesces: a coalesced update names the paths of both).
    let checked =
        support::check_changed(&msgs, support::Changed::Covers).unwrap_or_else(|e| panic!("{e}"));
    assert!(checked > 0, "no update checked");

    // Force a relist: the next watch answers 410 Gone; nothing changed, so nothing is sent.
    let before = sink.len();
    let lists = |b: &Bridge| {
        b.informer_stats()
            .iter()
            .map(|(_, s)| s.lists.load(Ordering::SeqCst))
            .sum::<u64>()
    };
    let lists_before = lists(&bridge);
    c.sim.faults().fail_next_watches_with_gone(3);
    c.sim.faults().close_all_watches();
    wait_for("every informer relisted", LONG, || {
        lists(&bridge) >= lists_before + 3 && synced(&bridge)
    })
    .await;
    // Give any (wrong) relist output the time a batch needs to show up: linger is 10 ms.
    wait_for("pipeline idle", LONG, || {
        bridge.pipeline().sinks().iter().all(|h| h.held() == 0)
    })
    .await;
    assert_eq!(
        sink.len(),
        before,
        "a relist with nothing changed emitted messages"
    );
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_missed_during_a_410_gap_are_emitted_as_final_state_unknown() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 120,
            seed: 3,
            ..Default::default()
        })
        .unwrap();
    let sink = CaptureSink::new();
    let bridge = start(
        &config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]),
        &sink,
    )
    .await;
    wait_for("initial sync", LONG, || {
        synced(&bridge) && sink.len() == 120
    })
    .await;
    let lists = || bridge.informer_stats()[0].1.lists.load(Ordering::SeqCst);

    // Open a gap: responses are delayed, the watch is cut, and the next watch gets 410 Gone.
    c.sim.faults().set_delay(Duration::from_millis(1500));
    c.sim.faults().fail_next_watches_with_gone(1);
    c.sim.faults().close_all_watches();
    wait_for("watch closed", LONG, || c.sim.open_watches() == 0).await;
    let victims: Vec<_> = c.sim.objects("v1", "Pod").into_iter().take(50).collect();
    delete_each(&c.sim, "v1", "Pod", &victims);
    wait_for("relist done", LONG, || lists() == 2 && synced(&bridge)).await;
    c.sim.faults().set_delay(Duration::ZERO);
    wait_for("50 deletes", LONG, || sink.len() >= 170).await;
    bridge.shutdown().await;

    let msgs = sink.messages();
    let deletes: Vec<_> = msgs.iter().skip(120).collect();
    assert_eq!(
        deletes.len(),
        50,
        "exactly the 50 missed deletes: {deletes:#?}"
    );
    assert!(deletes.iter().all(|m| m["op"] == "deleted"
        && m["finalStateUnknown"] == true
        && m.get("object").is_none()));
    let mut got: Vec<_> = deletes
        .iter()
        .map(|m| m["uid"].as_str().unwrap().to_owned())
        .collect();
    let mut want: Vec<_> = victims
        .iter()
        .map(|p| p["metadata"]["uid"].as_str().unwrap().to_owned())
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(fold(&msgs), sim_state(&c.sim, &[("v1", "Pod")]));
    assert_schema_valid(&schema(), &msgs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_sink_bounds_pending_changes_and_stops_the_watch_being_read() {
    let c = cluster(SimConfig {
        retained_events: 100_000,
        ..Default::default()
    })
    .await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 100,
            seed: 5,
            ..Default::default()
        })
        .unwrap();
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    cfg.pipeline.max_pending = 40;
    cfg.pipeline.max_batch_events = 10;
    let sink = CaptureSink::new();
    let bridge = start(&cfg, &sink).await;
    wait_for("initial sync", LONG, || {
        synced(&bridge) && sink.len() == 100
    })
    .await;
    let received = || bridge.informer_stats()[0].1.received();
    let base = received();
    let sent_before = c.sim.watch_events_sent();

    sink.blocked.store(true, Ordering::SeqCst);
    // 3,000 changes (~8 KB each, ~24 MB) while the sink accepts nothing.
    let churn = c.sim.churn_steps(3000, 9).unwrap();
    let queue = &bridge.pipeline().sinks()[0];
    wait_for("queue full", LONG, || queue.held() >= 40).await;
    // A window in which the informer, were it not held back, would read on (the high-water
    // mark covers all of it, not samples of it).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        queue.high_water() <= 40,
        "pending changes exceeded max_pending: {}",
        queue.high_water()
    );
    let read_while_blocked = received() - base;
    // Each key can coalesce, so a full queue may have absorbed more events than 40; but the
    // informer stops once 40 distinct keys wait, far below the 3,000 changes made.
    assert!(
        read_while_blocked < 1500,
        "informer kept reading: {read_while_blocked} events"
    );
    let sent = c.sim.watch_events_sent() - sent_before;
    assert!(
        sent < 3000,
        "the simulator wrote every event ({sent}): the watch was read to the end"
    );
    assert!(queue.high_water() <= 40);

    sink.unblock();
    let want = sim_state(&c.sim, &[("v1", "Pod")]);
    wait_for("fold equals the simulator after unblocking", LONG, || {
        fold(&sink.messages()) == want
    })
    .await;
    assert!(
        queue.high_water() <= 40,
        "high water {}",
        queue.high_water()
    );
    bridge.shutdown().await;
    eprintln!("churn: {churn:?}; read while blocked: {read_while_blocked}; sim wrote {sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_sink_eventually_gets_every_final_state_in_order_per_key() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 100,
            foobars: 20,
            seed: 11,
            ..Default::default()
        })
        .unwrap();
    let mut cfg = config(
        &c.kubeconfig,
        vec![
            ResourceConfig::new("v1", "Pod"),
            ResourceConfig::new(FOOBAR_API, "FooBar"),
        ],
    );
    cfg.pipeline.coalesce = false;
    cfg.pipeline.max_batch_events = 25;
    let sink = CaptureSink::new();
    sink.fail_next.store(15, Ordering::SeqCst);
    let bridge = start(&cfg, &sink).await;
    c.sim.churn_steps(400, 12).unwrap();
    let kinds = [("v1", "Pod"), (FOOBAR_API, "FooBar")];
    let want = sim_state(&c.sim, &kinds);
    wait_for("fold equals the simulator", LONG, || {
        fold_expecting(&sink.messages(), Expect::STRICT.uncoalesced()) == want
    })
    .await;
    assert_eq!(
        sink.failures.load(Ordering::SeqCst),
        15,
        "the sink really failed"
    );
    bridge.shutdown().await;
    // Per key, resourceVersions only increase (coalescing is off: every change is sent).
    let mut last: std::collections::HashMap<String, u64> = Default::default();
    for m in sink.messages() {
        let key = format!("{}/{}/{}", m["kind"], m["namespace"], m["name"]);
        let rv: u64 = m["resourceVersion"].as_str().unwrap().parse().unwrap();
        if let Some(prev) = last.insert(key.clone(), rv) {
            assert!(
                rv >= prev,
                "{key}: resourceVersion went back from {prev} to {rv}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_mode_asks_for_partial_object_metadata_and_sends_no_spec() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            pods: 30,
            seed: 2,
            ..Default::default()
        })
        .unwrap();
    let mut res = ResourceConfig::new("v1", "Pod");
    res.payload = PayloadMode::Metadata;
    let sink = CaptureSink::new();
    let bridge = start(&config(&c.kubeconfig, vec![res]), &sink).await;
    wait_for("initial sync", LONG, || synced(&bridge) && sink.len() == 30).await;
    bridge.shutdown().await;
    let reqs = c.sim.requests();
    let pod_reqs: Vec<_> = reqs
        .iter()
        .filter(|r| r.path_and_query.starts_with("/api/v1/pods"))
        .collect();
    assert!(!pod_reqs.is_empty());
    for r in &pod_reqs {
        let accept = r.accept.as_deref().unwrap_or("");
        assert!(
            accept.contains("as=PartialObjectMetadata") && accept.contains("g=meta.k8s.io"),
            "{r:?}"
        );
    }
    let msgs = sink.messages();
    for m in &msgs {
        let obj = m["object"].as_object().unwrap();
        assert_eq!(
            obj.keys().collect::<Vec<_>>(),
            ["apiVersion", "kind", "metadata"]
        );
        assert_eq!(m["object"]["kind"], "Pod");
        assert!(m["object"]["metadata"]["managedFields"].is_null());
    }
    assert_schema_valid(&schema(), &msgs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_false_sends_adds_and_deletes_only() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            pods: 50,
            seed: 4,
            ..Default::default()
        })
        .unwrap();
    let mut res = ResourceConfig::new("v1", "Pod");
    res.updates = false;
    let sink = CaptureSink::new();
    let bridge = start(&config(&c.kubeconfig, vec![res]), &sink).await;
    wait_for("initial sync", LONG, || synced(&bridge) && sink.len() == 50).await;
    c.sim.churn_steps(200, 5).unwrap();
    let want: std::collections::BTreeSet<_> =
        sim_state(&c.sim, &[("v1", "Pod")]).into_keys().collect();
    wait_for("same keys as the simulator", LONG, || {
        fold(&sink.messages())
            .into_keys()
            .collect::<std::collections::BTreeSet<_>>()
            == want
    })
    .await;
    bridge.shutdown().await;
    assert!(sink.messages().iter().all(|m| m["op"] != "updated"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sinks_keep_separate_queues_and_a_dead_one_bounds_both() {
    let c = cluster(SimConfig {
        retained_events: 100_000,
        ..Default::default()
    })
    .await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 60,
            seed: 21,
            ..Default::default()
        })
        .unwrap();
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    cfg.pipeline.max_pending = 30;
    cfg.pipeline.max_batch_events = 10;
    let (healthy, dead) = (CaptureSink::new(), CaptureSink::new());
    dead.blocked.store(true, Ordering::SeqCst);
    let sinks: Vec<Arc<dyn Sink>> = vec![healthy.clone(), dead.clone()];
    let bridge = Bridge::start(&plan(&cfg), client(&cfg).await, sinks)
        .await
        .unwrap();
    let queues = bridge.pipeline().sinks().to_vec();
    // The healthy sink gets what fits in the dead sink's queue (the informer waits for room
    // in every queue), then both stall with bounded queues.
    wait_for("dead sink's queue full", LONG, || queues[1].held() >= 30).await;
    wait_for("healthy sink caught up with what was queued", LONG, || {
        healthy.len() >= 30
    })
    .await;
    c.sim.churn_steps(500, 22).unwrap();
    // A window for the churn to push against the full queues (high-water marks cover it).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(queues.iter().all(|q| q.high_water() <= 30));
    assert_eq!(dead.len(), 0);
    dead.unblock();
    let want = sim_state(&c.sim, &[("v1", "Pod")]);
    wait_for("both sinks hold the simulator's state", LONG, || {
        fold(&healthy.messages()) == want && fold(&dead.messages()) == want
    })
    .await;
    assert!(queues.iter().all(|q| q.high_water() <= 30));
    bridge.shutdown().await;
}

/// A sink that delivers ~100 messages/s under ~200 changes/s, for `KUBESINK_SLOW_SINK_SECS`
/// seconds (default 30; the ten-minute run of the issue is
/// `KUBESINK_SLOW_SINK_SECS=600 cargo test --test informer a_sink_slower -- --nocapture`).
/// Pending changes stay within `max_pending` and `max_pending_bytes` throughout (the
/// pipeline's memory; the simulator shares this process, so its RSS says nothing about
/// kubesink's), coalescing shows in the metrics, and the sink ends with every final state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_slower_than_the_change_rate_stays_bounded_and_coalesces() {
    let secs: u64 = std::env::var("KUBESINK_SLOW_SINK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 200,
            nodes: 5,
            foobars: 10,
            seed: 17,
            ..Default::default()
        })
        .unwrap();
    let mut cfg = config(&c.kubeconfig, three_kinds());
    cfg.pipeline.max_pending = 100;
    cfg.pipeline.max_pending_bytes = kubesink::config::ByteSize(1 << 20);
    cfg.pipeline.max_batch_events = 20;
    let sink = CaptureSink::new();
    sink.delay_ms.store(200, Ordering::SeqCst);
    let bridge = start(&cfg, &sink).await;
    wait_for("initial sync", LONG, || synced(&bridge)).await;
    let churn = c.sim.spawn_churn(kubesink_sim::Churn {
        rate_per_sec: 200.0,
        seed: 23,
    });
    let queue = &bridge.pipeline().sinks()[0];
    let started = tokio::time::Instant::now();
    // The run itself: observe the queue while the sink lags behind.
    while started.elapsed() < Duration::from_secs(secs) {
        assert!(queue.held() <= 100, "held {}", queue.held());
        assert!(
            queue.held_bytes() <= (1 << 20) + 64 * 1024,
            "held {} bytes",
            queue.held_bytes()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    churn.stop();
    let (text, _) = bridge.observed().metrics();
    let coalesced = metric_value(
        &text,
        "kubesink_sink_coalesced_total",
        &[("sink", "capture")],
    );
    assert!(coalesced > 0.0, "coalescing shows in the metrics: {text}");
    assert!(
        queue.high_water() <= 100,
        "high water {}",
        queue.high_water()
    );
    wait_for(
        "the slow sink catches up with every final state",
        LONG,
        || fold(&sink.messages()) == sim_state(&c.sim, &KINDS),
    )
    .await;
    eprintln!(
        "{secs} s: delivered {}, coalesced {coalesced}, high water {}",
        sink.len(),
        queue.high_water()
    );
    bridge.shutdown().await;
}

fn configmap_obj(name: &str, value: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"}, "data": {"v": value}})
}

/// The `resourceVersion` query parameter of a recorded watch request.
fn watch_rv(path_and_query: &str) -> Option<String> {
    let query = path_and_query.split_once('?')?.1;
    if !query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
    {
        return None;
    }
    query
        .split('&')
        .find_map(|p| p.strip_prefix("resourceVersion="))
        .map(str::to_owned)
}

/// A connection reset in the middle of a watch. The informer must
/// resume from the last resourceVersion it processed; re-watching from where the broken
/// watch began would replay every event since against the current store: an older state
/// would go out after a newer one (resourceVersion going backwards per key) and a replayed
/// ADDED of a re-created object's old uid would infer a false delete of the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_reset_mid_watch_resumes_from_the_last_resource_version_and_replays_nothing() {
    let c = cluster(SimConfig::default()).await;
    for name in ["a", "b"] {
        c.sim.create(configmap_obj(name, "0")).unwrap();
    }
    let sink = CaptureSink::new();
    let bridge = start(
        &config(&c.kubeconfig, vec![ResourceConfig::new("v1", "ConfigMap")]),
        &sink,
    )
    .await;
    wait_for("initial sync", LONG, || synced(&bridge) && sink.len() == 2).await;
    for v in ["1", "2", "3"] {
        c.sim.replace(configmap_obj("a", v)).unwrap();
    }
    c.sim
        .delete("v1", "ConfigMap", Some("default"), "b")
        .unwrap();
    c.sim.create(configmap_obj("b", "new")).unwrap();
    let b_uid = c
        .sim
        .objects("v1", "ConfigMap")
        .iter()
        .find(|o| o["metadata"]["name"] == "b")
        .unwrap()["metadata"]["uid"]
        .clone();
    wait_for("the watch changes", LONG, || {
        let msgs = sink.messages();
        msgs.iter()
            .any(|m| m["name"] == "a" && m["object"]["data"]["v"] == "3")
            && msgs
                .iter()
                .any(|m| m["name"] == "b" && m["op"] == "added" && m["uid"] == b_uid)
    })
    .await;
    let before_reset = sink.len();
    let last_rv = c.sim.resource_version().to_string();

    let stats = bridge.informer_stats()[0].1.clone();
    let watches = stats.watch_requests.load(Ordering::SeqCst);
    c.sim.faults().reset_connections();
    wait_for("a watch after the reset", LONG, || {
        stats.transport_errors.load(Ordering::SeqCst) >= 1
            && stats.watch_requests.load(Ordering::SeqCst) > watches
    })
    .await;
    // A change after the reset: once it is out, anything replayed would be too.
    c.sim.create(configmap_obj("z", "after")).unwrap();
    wait_for("the change made after the reset", LONG, || {
        sink.messages().iter().any(|m| m["name"] == "z")
    })
    .await;
    bridge.shutdown().await;

    let msgs = sink.messages();
    let after: Vec<String> = msgs[before_reset..]
        .iter()
        .map(|m| format!("{} {} {}", m["op"], m["name"], m["resourceVersion"]))
        .collect();
    assert_eq!(
        after,
        [format!(
            "\"added\" \"z\" \"{}\"",
            c.sim
                .objects("v1", "ConfigMap")
                .iter()
                .find(|o| o["metadata"]["name"] == "z")
                .unwrap()["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
        )],
        "after the reset only the new change; nothing replayed"
    );
    // Per key and uid, resourceVersions only grow.
    let mut last: std::collections::BTreeMap<(String, String), u64> = Default::default();
    for m in &msgs {
        let k = (m["name"].to_string(), m["uid"].to_string());
        let rv: u64 = m["resourceVersion"].as_str().unwrap().parse().unwrap();
        if let Some(prev) = last.insert(k.clone(), rv) {
            assert!(rv > prev, "{k:?}: resourceVersion {rv} after {prev}");
        }
    }
    // The watch that followed the reset asked for the last resourceVersion processed.
    let resumed: Vec<String> = c
        .sim
        .requests()
        .iter()
        .filter_map(|r| watch_rv(&r.path_and_query))
        .collect();
    assert!(
        resumed.len() >= 2,
        "a watch before and after the reset: {resumed:?}"
    );
    assert_eq!(
        resumed[1], last_rv,
        "resumed from the last event seen: {resumed:?}"
    );
    assert_eq!(
        stats.stale_events.load(Ordering::SeqCst),
        0,
        "nothing was replayed"
    );
}

/// An object that stops matching the resource's label or field selector arrives as a watch
/// DELETED (the API server's rule, and the simulator's: the previous content, the new
/// resourceVersion); kubesink finds it still in the cluster and its `deleted` says
/// `reason: "leftSelector"`. A real delete of a matching object has no reason; every message
/// stays schema-valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_leaves_the_selector_is_a_deleted_with_reason_left_selector() {
    let c = cluster(SimConfig::default()).await;
    let cm = |name: &str, app: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
            "data": {"k": "v"}})
    };
    let node = |name: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "spec": {"unschedulable": false}})
    };
    let mut leaving = None;
    for name in ["stays", "leaves", "goes"] {
        let stored = c.sim.create(cm(name, "web")).unwrap();
        if name == "leaves" {
            leaving = Some(stored);
        }
    }
    let cordoned = c.sim.create(node("cordoned")).unwrap();
    c.sim.create(node("n1")).unwrap();
    let mut by_label = ResourceConfig::new("v1", "ConfigMap");
    by_label.label_selector = Some("app=web".into());
    let mut by_field = ResourceConfig::new("v1", "Node");
    by_field.field_selector = Some("spec.unschedulable=false".into());
    let cfg = config(&c.kubeconfig, vec![by_label, by_field]);
    let sink = CaptureSink::new();
    let bridge = start(&cfg, &sink).await;
    wait_for("initial sync", LONG, || synced(&bridge) && sink.len() >= 5).await;

    let mut obj = leaving.unwrap();
    obj["metadata"]["labels"]["app"] = "batch".into();
    c.sim.replace(obj).unwrap();
    let mut obj = cordoned;
    obj["spec"]["unschedulable"] = true.into();
    c.sim.replace(obj).unwrap();
    c.sim
        .delete("v1", "ConfigMap", Some("default"), "goes")
        .unwrap();
    c.sim.delete("v1", "Node", None, "n1").unwrap();
    let deleted = |name: &str| {
        sink.messages()
            .into_iter()
            .find(|m| m["name"] == name && m["op"] == "deleted")
    };
    wait_for("four deletes", LONG, || {
        ["leaves", "cordoned", "goes", "n1"]
            .iter()
            .all(|n| deleted(n).is_some())
    })
    .await;
    bridge.shutdown().await;

    for left in ["leaves", "cordoned"] {
        let m = deleted(left).unwrap();
        assert_eq!(m["reason"], "leftSelector", "{m}");
        assert_eq!(m["finalStateUnknown"], false, "{m}");
    }
    for gone in ["goes", "n1"] {
        let m = deleted(gone).unwrap();
        assert!(m.get("reason").is_none(), "{m}");
    }
    let msgs = sink.messages();
    assert_eq!(
        msgs.iter().filter(|m| m.get("reason").is_some()).count(),
        2,
        "{msgs:?}"
    );
    assert_schema_valid(&schema(), &msgs);
}

/// The resourceVersion of every plain watch of pods (not a streaming list) the simulator
/// received, in order.
fn pod_watch_rvs(sim: &kubesink_sim::Simulator) -> Vec<String> {
    sim.requests()
        .iter()
        .filter_map(|r| {
            let (path, query) = r.path_and_query.split_once('?')?;
            if path != "/api/v1/pods" {
                return None;
            }
            let pairs: Vec<(&str, &str)> =
                query.split('&').filter_map(|p| p.split_once('=')).collect();
            let has = |k: &str, v: &str| pairs.iter().any(|(a, b)| *a == k && *b == v);
            if !has("watch", "true") && !has("watch", "1") || has("sendInitialEvents", "true") {
                return None;
            }
            let rv = pairs.iter().find(|(k, _)| *k == "resourceVersion")?.1;
            Some(rv.to_owned())
        })
        .collect()
}

/// A pod named `name` in `default`, created; returns its resourceVersion.
fn create_pod(sim: &kubesink_sim::Simulator, name: &str) -> String {
    let made = sim
        .create(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }))
        .expect("create");
    made["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned()
}

/// Waits for the next plain watch of pods after `seen` of them and returns its
/// resourceVersion.
async fn next_watch_rv(sim: &kubesink_sim::Simulator, seen: usize) -> String {
    wait_for("the next watch", LONG, || pod_watch_rvs(sim).len() > seen).await;
    pod_watch_rvs(sim)[seen].clone()
}

/// Applies `end` (a fault that ends the open pod watch), then returns the resourceVersion
/// the next watch asks for. A fault that lands while the watch is being opened ends nothing
/// (the simulator has not registered its stream yet), so `end` is applied again every 2 s
/// until a watch after the first `seen` shows (seen once in a full run: 60 s without one).
async fn next_watch_rv_after(sim: &kubesink_sim::Simulator, seen: usize, end: impl Fn()) -> String {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        end();
        let again = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < again {
            if let Some(rv) = pod_watch_rvs(sim).get(seen) {
                return rv.clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no watch after the {seen} seen within {LONG:?}"
        );
    }
}

/// Which resourceVersion the next watch asks for at each resume point (`recovery.rs`
/// decides resume or relist, not from where). With
/// bookmarks off (interval 1 h), against the simulator's request log:
/// - the server ends the stream: from the last event delivered;
/// - the connection is reset: the same;
/// - 410 Gone: the watch from the expired resourceVersion is refused, the relist streams the
///   state again (its stream goes on as the watch), and the watch after that stream ends
///   starts from the relist's resourceVersion (newer: an object of another kind was created
///   meanwhile), never from the expired one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_resume_point_watches_from_the_resource_version_it_must() {
    let c = cluster(SimConfig {
        bookmark_interval: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let sink = CaptureSink::new();
    let bridge = start(
        &config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]),
        &sink,
    )
    .await;
    wait_for("initial sync", LONG, || synced(&bridge)).await;
    let delivered = |rv: &str| sink.messages().iter().any(|m| m["resourceVersion"] == rv);

    // The server ends the watch.
    let rv = create_pod(&c.sim, "a");
    wait_for("a delivered", LONG, || delivered(&rv)).await;
    let seen = pod_watch_rvs(&c.sim).len();
    let close = || c.sim.faults().close_all_watches();
    assert_eq!(
        next_watch_rv_after(&c.sim, seen, close).await,
        rv,
        "after a stream end"
    );

    // The connection is reset.
    let rv = create_pod(&c.sim, "b");
    wait_for("b delivered", LONG, || delivered(&rv)).await;
    let seen = pod_watch_rvs(&c.sim).len();
    let reset = || c.sim.faults().reset_connections();
    assert_eq!(
        next_watch_rv_after(&c.sim, seen, reset).await,
        rv,
        "after a reset"
    );

    // 410 Gone: the state moves on (a ConfigMap, not watched), the resumed watch is refused.
    let rv = create_pod(&c.sim, "c");
    wait_for("c delivered", LONG, || delivered(&rv)).await;
    let later = c
        .sim
        .create(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "moves-the-clock", "namespace": "default"},
        }))
        .expect("create")["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned();
    let seen = pod_watch_rvs(&c.sim).len();
    c.sim.faults().fail_next_watches_with_gone(1);
    assert_eq!(
        next_watch_rv_after(&c.sim, seen, close).await,
        rv,
        "resumed from the last event"
    );
    // The relist is a streaming list whose stream goes on as the watch: end it once the
    // relist is done, and the watch after it starts from the relist's resourceVersion.
    wait_for("the relist", LONG, || {
        synced(&bridge) && bridge.informer_stats()[0].1.lists.load(Ordering::SeqCst) >= 2
    })
    .await;
    let seen = pod_watch_rvs(&c.sim).len();
    assert_eq!(
        next_watch_rv_after(&c.sim, seen, close).await,
        later,
        "after the 410 and the relist: from the relist's resourceVersion"
    );
    bridge.shutdown().await;
}

/// After a BOOKMARK (interval 300 ms) the next watch starts from the
/// bookmark's resourceVersion, past the last event of the watched kind (another kind moved
/// the clock), not from that event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_bookmark_the_next_watch_starts_from_its_resource_version() {
    let c = cluster(SimConfig {
        bookmark_interval: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    let sink = CaptureSink::new();
    let bridge = start(
        &config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]),
        &sink,
    )
    .await;
    wait_for("initial sync", LONG, || synced(&bridge)).await;
    let rv = create_pod(&c.sim, "a");
    wait_for("a delivered", LONG, || {
        sink.messages().iter().any(|m| m["resourceVersion"] == rv)
    })
    .await;
    let later = c
        .sim
        .create(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "moves-the-clock", "namespace": "default"},
        }))
        .expect("create")["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned();
    // Bookmarks after the ConfigMap carry its resourceVersion.
    let sent = c.sim.watch_events_sent();
    wait_for("two bookmarks since", LONG, || {
        c.sim.watch_events_sent() >= sent + 2
    })
    .await;
    let seen = pod_watch_rvs(&c.sim).len();
    c.sim.faults().close_all_watches();
    assert_ne!(rv, later);
    assert_eq!(
        next_watch_rv(&c.sim, seen).await,
        later,
        "from the bookmark, not from the last event ({rv})"
    );
    bridge.shutdown().await;
}
