//! Watch semantics and fault controls over real HTTP.

mod support;

use std::time::Duration;

use kubesink_sim::{FailureKind, SimConfig, Workload};
use serde_json::json;
use support::*;

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn watch_without_resource_version_starts_with_added_then_live_events() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.create(configmap("default", "a", json!({}))).unwrap();
    let mut w = watch(
        addr,
        "/api/v1/namespaces/default/configmaps?watch=true",
        None,
    )
    .await;
    assert_eq!(w.status, 200);
    let first = w.next(T).await.unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "a");
    sim.create(configmap("default", "b", json!({}))).unwrap();
    sim.create(configmap("other", "ignored", json!({})))
        .unwrap();
    let mut updated = sim
        .objects("v1", "ConfigMap")
        .into_iter()
        .find(|o| o["metadata"]["name"] == "a")
        .unwrap();
    updated["data"] = json!({"k": "changed"});
    sim.replace(updated).unwrap();
    sim.delete("v1", "ConfigMap", Some("default"), "b").unwrap();
    let events = w.take(3, T).await;
    let summary: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["object"]["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
        .map(|(t, n)| (t.to_owned(), n.to_owned()));
    assert_eq!(summary, expected);
    assert_eq!(
        events[2]["object"]["metadata"]["resourceVersion"],
        sim.resource_version().to_string()
    );
    assert!(sim.watch_events_sent() >= 4);
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_one_410_error_event() {
    let (sim, addr) = start(SimConfig {
        retained_events: 3,
        ..SimConfig::default()
    })
    .await;
    for i in 0..10 {
        sim.create(configmap("default", &format!("c{i}"), json!({})))
            .unwrap();
    }
    let mut w = watch(
        addr,
        "/api/v1/configmaps?watch=true&resourceVersion=2",
        None,
    )
    .await;
    let ev = w.next(T).await.unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert!(ev["object"]["message"]
        .as_str()
        .unwrap()
        .starts_with("too old resource version: 2 ("));
    assert!(w.ends_within(T).await);
}

#[tokio::test]
async fn watch_from_a_retained_version_replays_later_events() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.create(configmap("default", "a", json!({}))).unwrap();
    let rv = sim.resource_version();
    sim.create(configmap("default", "b", json!({}))).unwrap();
    let mut w = watch(
        addr,
        &format!("/api/v1/configmaps?watch=1&resourceVersion={rv}"),
        None,
    )
    .await;
    let ev = w.next(T).await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("b"))
    );
}

#[tokio::test]
async fn send_initial_events_ends_with_the_initial_events_end_bookmark_and_bookmarks_repeat() {
    let (sim, addr) = start(SimConfig {
        bookmark_interval: Duration::from_millis(100),
        ..SimConfig::default()
    })
    .await;
    sim.populate(&Workload {
        pods: 4,
        ..Workload::default()
    })
    .unwrap();
    let rv = sim.resource_version();
    let mut w = watch(
        addr,
        "/api/v1/namespaces/default/pods?allowWatchBookmarks=true&resourceVersion=0&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&watch=true",
        None,
    )
    .await;
    let events = w.take(5, T).await;
    assert!(events[..4].iter().all(|e| e["type"] == "ADDED"));
    let end = &events[4];
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(end["object"]["kind"], "Pod");
    assert_eq!(end["object"]["metadata"]["resourceVersion"], rv.to_string());
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    sim.create(configmap("default", "other-kind", json!({})))
        .unwrap();
    let periodic = w.take(2, T).await;
    assert!(periodic
        .iter()
        .all(|e| e["type"] == "BOOKMARK" && e["object"]["metadata"].get("annotations").is_none()));
    assert_eq!(
        periodic[1]["object"]["metadata"]["resourceVersion"],
        sim.resource_version().to_string()
    );
}

#[tokio::test]
async fn selectors_apply_to_watch_events_and_unmatching_updates_become_deleted() {
    let (sim, addr) = start(SimConfig::default()).await;
    let rv = sim.resource_version();
    let mut w = watch(
        addr,
        &format!(
            "/api/v1/configmaps?watch=true&resourceVersion={rv}&labelSelector=app%20in%20(web)"
        ),
        None,
    )
    .await;
    let mut fw = watch(
        addr,
        &format!(
            "/api/v1/configmaps?watch=true&resourceVersion={rv}&fieldSelector=metadata.name!%3Da"
        ),
        None,
    )
    .await;
    let a = sim
        .create(configmap("default", "a", json!({"app": "web"})))
        .unwrap();
    sim.create(configmap("default", "b", json!({"app": "api"})))
        .unwrap();
    let mut changed = a.clone();
    changed["metadata"]["labels"] = json!({"app": "api"});
    sim.replace(changed).unwrap();
    let mut back = sim
        .objects("v1", "ConfigMap")
        .into_iter()
        .find(|o| o["metadata"]["name"] == "b")
        .unwrap();
    back["metadata"]["labels"] = json!({"app": "web"});
    sim.replace(back).unwrap();
    let events = w.take(3, T).await;
    let summary: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![("ADDED", "a"), ("DELETED", "a"), ("ADDED", "b")]
    );
    assert_eq!(
        events[1]["object"]["metadata"]["labels"]["app"], "web",
        "DELETED carries the last matching state"
    );
    let field_events = fw.take(2, T).await;
    assert!(field_events
        .iter()
        .all(|e| e["object"]["metadata"]["name"] == "b"));
}

#[tokio::test]
async fn metadata_only_watch_sends_partial_object_metadata() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.populate(&Workload {
        pods: 2,
        ..Workload::default()
    })
    .unwrap();
    let accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    let mut w = watch(addr, "/api/v1/pods?watch=true", Some(accept)).await;
    let ev = w.next(T).await.unwrap();
    assert_eq!(ev["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(ev["object"]["apiVersion"], "meta.k8s.io/v1");
    assert!(ev["object"].get("spec").is_none());
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream() {
    let (_sim, addr) = start(SimConfig::default()).await;
    let mut w = watch(addr, "/api/v1/pods?watch=true&timeoutSeconds=1", None).await;
    assert!(w.ends_within(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_reader_that_stops_reading_stops_the_producer_and_is_closed_when_it_lags() {
    let (sim, addr) = start(SimConfig {
        retained_events: 100,
        ..SimConfig::default()
    })
    .await;
    sim.populate(&Workload {
        pods: 50,
        ..Workload::default()
    })
    .unwrap();
    let rv = sim.resource_version();
    let mut w = watch(
        addr,
        &format!("/api/v1/pods?watch=true&resourceVersion={rv}"),
        None,
    )
    .await;
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    let steps = 3000;
    sim.churn_steps(steps, 1).unwrap();
    // Let the producer fill the socket buffers, then check it stopped.
    let mut last = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = sim.watch_events_sent();
        if now == last {
            break;
        }
        last = now;
    }
    assert!(
        sim.watch_events_sent() < steps as u64,
        "producer ran ahead of a stalled reader"
    );
    assert!(
        w.ends_within(Duration::from_secs(10)).await,
        "lagging watcher is closed"
    );
    wait_for("watch closed", T, || sim.open_watches() == 0).await;
}

#[tokio::test]
async fn close_all_watches_and_gone_faults_end_watches() {
    let (sim, addr) = start(SimConfig::default()).await;
    let mut w = watch(addr, "/api/v1/pods?watch=true", None).await;
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    sim.faults().close_all_watches();
    assert!(w.ends_within(T).await);
    let mut later = watch(addr, "/api/v1/pods?watch=true&timeoutSeconds=1", None).await;
    assert!(
        later.ends_within(T).await,
        "later watches run normally until their timeout"
    );

    sim.faults().fail_next_watches_with_gone(1);
    let mut gone = watch(addr, "/api/v1/pods?watch=true&resourceVersion=1", None).await;
    let ev = gone.next(T).await.unwrap();
    assert_eq!(
        (ev["type"].as_str(), ev["object"]["code"].as_u64()),
        (Some("ERROR"), Some(410))
    );
    assert!(gone.ends_within(T).await);
}

#[tokio::test]
async fn injected_failures_answer_500_and_429_with_retry_after() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.faults().fail_next_requests(1, FailureKind::Internal);
    let resp = get(addr, "/api/v1/pods").await;
    assert_eq!(resp.status, 500);
    assert_eq!(resp.json()["reason"], "InternalError");
    assert_eq!(get(addr, "/api/v1/pods").await.status, 200);

    sim.faults().fail_next_requests_matching(
        2,
        FailureKind::TooManyRequests {
            retry_after_secs: 3,
        },
        "/apis/apps",
    );
    assert_eq!(get(addr, "/api/v1/pods").await.status, 200);
    let resp = get(addr, "/apis/apps/v1/deployments").await;
    assert_eq!(resp.status, 429);
    assert_eq!(resp.header("retry-after"), Some("3"));
    assert_eq!(get(addr, "/apis/apps/v1/deployments").await.status, 429);
    assert_eq!(get(addr, "/apis/apps/v1/deployments").await.status, 200);
}

#[tokio::test]
async fn delay_slows_every_response_and_admin_endpoints_drive_faults() {
    let (sim, addr) = start(SimConfig::default()).await;
    assert_eq!(
        request(addr, "POST", "/_sim/delay?ms=300", None, None)
            .await
            .status,
        200
    );
    let started = std::time::Instant::now();
    assert_eq!(get(addr, "/api/v1/pods").await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
    sim.faults().set_delay(Duration::ZERO);

    request(
        addr,
        "POST",
        "/_sim/fail-requests?count=1&status=429&retry_after=7",
        None,
        None,
    )
    .await;
    assert_eq!(
        get(addr, "/api/v1/pods").await.header("retry-after"),
        Some("7")
    );
    request(addr, "POST", "/_sim/fail-watches?count=1", None, None).await;
    let mut gone = watch(addr, "/api/v1/pods?watch=true", None).await;
    assert_eq!(gone.next(T).await.unwrap()["type"], "ERROR");
    let stats = get(addr, "/_sim/stats").await.json();
    assert!(stats["watchEventsSent"].as_u64().unwrap() >= 1);
    assert!(sim
        .requests()
        .iter()
        .all(|r| !r.path_and_query.starts_with("/_sim/")));
}
