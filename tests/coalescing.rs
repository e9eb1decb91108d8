//! End-to-end coalescing rules of the message contract, against the simulator over real
//! HTTP: an object created and deleted while its sink is stalled is never seen by that sink
//! (the pair is cancelled in the queue), unless `pipeline.coalesce = false`; and the
//! informer's state stays right afterwards (a relist's sync marker counts the live objects,
//! and no delete of the cancelled object ever follows).

use kubesink_test_support as support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::ResourceConfig;
use kubesink_core::Sink;
use kubesink_sim::{SimConfig, Workload};
use serde_json::{json, Value};
use support::*;

const LONG: Duration = Duration::from_secs(60);

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "default"}, "data": {"k": "v"}})
}

fn names(msgs: &[Value]) -> Vec<(String, String)> {
    msgs.iter()
        .filter(|m| m["op"] != "synced")
        .map(|m| {
            (
                m["op"].as_str().unwrap_or_default().to_owned(),
                m["name"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// What a stalled run leaves: the sink, how many messages it had before the stall, the
/// cluster and the bridge.
struct Stalled {
    sink: Arc<CaptureSink>,
    before: usize,
    c: Cluster,
    bridge: Bridge,
}

impl Stalled {
    /// What the sink received after the stall began.
    fn received(&self) -> Vec<Value> {
        self.sink.messages()[self.before..].to_vec()
    }
}

/// Stalls the sink behind one in-flight change, creates and deletes `ephemeral` while it is
/// stalled, then lets the sink go and waits for a change made after that.
async fn create_and_delete_while_stalled(coalesce: bool) -> Stalled {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            configmaps: 5,
            seed: 13,
            ..Default::default()
        })
        .unwrap();
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "ConfigMap")]);
    cfg.pipeline.coalesce = coalesce;
    cfg.pipeline.sync_markers = true;
    let sink = CaptureSink::new();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    let bridge = Bridge::start(&plan(&cfg), client, sinks).await.unwrap();
    // 5 configmaps and the initial list's marker.
    wait_for("initial list delivered", LONG, || sink.len() == 6).await;
    let before = sink.len();

    // The destination goes down; the next change is taken into a batch that keeps failing,
    // so every later change waits in the queue behind it.
    sink.down.store(true, Ordering::SeqCst);
    c.sim.create(configmap("plug")).unwrap();
    wait_for("the plug's batch failed once", LONG, || {
        sink.failures.load(Ordering::SeqCst) >= 1
    })
    .await;
    let queue = &bridge.pipeline().sinks()[0];
    c.sim.create(configmap("ephemeral")).unwrap();
    c.sim
        .delete("v1", "ConfigMap", Some("default"), "ephemeral")
        .unwrap();
    if coalesce {
        wait_for("the pair cancelled", LONG, || queue.coalesced() >= 2).await;
        assert_eq!(queue.held(), 1, "only the plug is held");
    } else {
        wait_for("the pair queued", LONG, || queue.held() == 3).await;
    }
    c.sim.create(configmap("after")).unwrap();
    sink.down.store(false, Ordering::SeqCst);
    wait_for("the change after the stall arrives", LONG, || {
        names(&sink.messages()).contains(&("added".into(), "after".into()))
    })
    .await;
    Stalled {
        sink,
        before,
        c,
        bridge,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_created_and_deleted_while_the_sink_is_stalled_is_never_sent() {
    let run = create_and_delete_while_stalled(true).await;
    let received = run.received();
    assert_eq!(
        names(&received),
        [
            ("added".to_owned(), "plug".to_owned()),
            ("added".into(), "after".into())
        ],
        "nothing of `ephemeral`: {received:#?}"
    );

    // The informer's state is unharmed: a relist (410 Gone) infers no delete of it, and its
    // sync marker counts the 7 live configmaps.
    run.c.sim.faults().fail_next_watches_with_gone(1);
    run.c.sim.faults().close_all_watches();
    let markers = || {
        run.received()
            .into_iter()
            .filter(|m| m["op"] == "synced")
            .collect::<Vec<_>>()
    };
    wait_for("the relist's sync marker", LONG, || !markers().is_empty()).await;
    let marker = &markers()[0];
    assert_eq!(
        (marker["count"].as_u64(), marker["initial"].as_bool()),
        (Some(7), Some(false)),
        "{marker:#}"
    );
    let received = run.received();
    assert!(
        !received.iter().any(|m| m["name"] == "ephemeral"),
        "{received:#?}"
    );
    assert_schema_valid(&schema(), &received);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_coalescing_the_created_and_deleted_object_arrives_twice() {
    let run = create_and_delete_while_stalled(false).await;
    let received = run.received();
    assert_eq!(
        names(&received),
        [
            ("added".to_owned(), "plug".to_owned()),
            ("added".into(), "ephemeral".into()),
            ("deleted".into(), "ephemeral".into()),
            ("added".into(), "after".into())
        ]
    );
    assert_schema_valid(&schema(), &received);
    run.bridge.shutdown().await;
}
