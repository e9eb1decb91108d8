//! Streaming lists (KEP-3157, `sendInitialEvents=true`) as the simulator serves them, over
//! real HTTP: the parameter checks of the API server, and each of the server behaviours a
//! client must survive (the feature gate off, a server that ignores the parameter, initial
//! events cut or answered 410 before the end bookmark).

mod support;

use std::time::Duration;

use kubesink_sim::{BreakKind, SimConfig, WatchListSupport, Workload};
use serde_json::Value;
use support::*;

const T: Duration = Duration::from_secs(5);

/// A streaming list of the pods of `default`, as client-go and kubesink ask for it
/// (resourceVersion unset: a consistent read).
const STREAM: &str = "/api/v1/namespaces/default/pods?watch=true&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=";

async fn sim_with_pods(
    n: usize,
    bookmarks: Duration,
) -> (kubesink_sim::Simulator, std::net::SocketAddr) {
    let (sim, addr) = start(SimConfig {
        bookmark_interval: bookmarks,
        ..SimConfig::default()
    })
    .await;
    sim.populate(&Workload {
        pods: n,
        ..Workload::default()
    })
    .unwrap();
    (sim, addr)
}

fn is_end_bookmark(e: &Value) -> bool {
    e["type"] == "BOOKMARK"
        && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
}

#[tokio::test]
async fn a_consistent_streaming_list_sends_every_object_then_the_end_bookmark_at_the_current_version(
) {
    let (sim, addr) = sim_with_pods(6, Duration::from_secs(60)).await;
    let rv = sim.resource_version();
    let mut w = watch(addr, STREAM, None).await;
    assert_eq!(w.status, 200);
    let events = w.take(7, T).await;
    assert_eq!(events.len(), 7);
    assert!(events[..6].iter().all(|e| e["type"] == "ADDED"));
    assert!(is_end_bookmark(&events[6]));
    assert_eq!(
        events[6]["object"]["metadata"]["resourceVersion"],
        rv.to_string()
    );
    // Then it is an ordinary watch from there.
    let mut pod = sim.objects("v1", "Pod").remove(0);
    pod["metadata"]["labels"]["changed"] = "yes".into();
    sim.replace(pod).unwrap();
    let next = w.next(T).await.unwrap();
    assert_eq!(next["type"], "MODIFIED");
}

/// Found on the real server (tests/real_*.rs): its BOOKMARK object is the Go type's zero value
/// (`spec.containers: null`, `status: {}` for a Pod), not metadata alone. The end bookmark the
/// simulator sends has the recorded one's fields (`tests/fixtures/k8s-replays/v1-37`).
#[tokio::test]
async fn the_end_bookmark_has_the_fields_of_the_real_servers() {
    let recorded: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/k8s-replays/v1-37/watch_event-watch_pods_without_initial_events.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let real = recorded[0]["response_body"]
        .as_str()
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(is_end_bookmark)
        .expect("the recording has the end bookmark");
    let (_sim, addr) = sim_with_pods(2, Duration::from_secs(60)).await;
    let mut w = watch(addr, STREAM, None).await;
    let events = w.take(3, T).await;
    let ours = &events[2];
    assert!(is_end_bookmark(ours), "{ours}");
    let fields = |e: &Value| {
        let mut o = e["object"].as_object().unwrap().clone();
        o.remove("metadata");
        o
    };
    assert_eq!(
        fields(ours),
        fields(&real),
        "simulator {ours} vs real {real}"
    );
    assert_eq!(
        ours["object"]["metadata"]["annotations"],
        real["object"]["metadata"]["annotations"]
    );
}

#[tokio::test]
async fn the_parameters_are_checked_as_the_api_server_checks_them() {
    let (_sim, addr) = sim_with_pods(1, Duration::from_secs(60)).await;
    let base = "/api/v1/namespaces/default/pods?watch=true&allowWatchBookmarks=true";
    let cases = [
        (
            "&sendInitialEvents=true",
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ),
        (
            "&sendInitialEvents=true&resourceVersionMatch=Exact",
            "Unsupported value: \"Exact\"",
        ),
        (
            "&resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
    ];
    for (query, want) in cases {
        let r = get(addr, &format!("{base}{query}")).await;
        assert_eq!(r.status, 422, "{query}: {}", r.body);
        let status = r.json();
        assert_eq!(status["reason"], "Invalid", "{query}");
        assert_eq!(status["details"]["kind"], "ListOptions", "{query}");
        let message = status["message"].as_str().unwrap();
        assert!(
            message.starts_with("ListOptions.meta.k8s.io \"\" is invalid: ")
                && message.contains(want),
            "{query}: {message}"
        );
    }
}

#[tokio::test]
async fn with_the_feature_gate_off_a_streaming_list_is_refused_with_422_and_plain_watches_work() {
    let (sim, addr) = sim_with_pods(3, Duration::from_secs(60)).await;
    sim.faults().set_watch_list(WatchListSupport::Off);
    let r = get(addr, STREAM).await;
    assert_eq!(r.status, 422, "{}", r.body);
    let status = r.json();
    assert_eq!(
        status["message"],
        "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
    );
    assert_eq!(status["details"]["causes"][0]["field"], "sendInitialEvents");
    let mut plain = watch(addr, "/api/v1/namespaces/default/pods?watch=true", None).await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.take(3, T).await.len(), 3);
    // clear-faults keeps the server's version; the admin endpoint turns it back on.
    sim.faults().clear();
    assert_eq!(get(addr, STREAM).await.status, 422);
    let r = request(addr, "POST", "/_sim/watch-list?mode=on", None, None).await;
    assert_eq!(r.status, 200);
    let mut w = watch(addr, STREAM, None).await;
    assert!(is_end_bookmark(&w.take(4, T).await[3]));
}

#[tokio::test]
async fn a_server_that_ignores_send_initial_events_serves_a_plain_watch_without_the_end_bookmark() {
    let (sim, addr) = sim_with_pods(4, Duration::from_millis(200)).await;
    let r = request(addr, "POST", "/_sim/watch-list?mode=ignored", None, None).await;
    assert_eq!(r.status, 200);
    assert_eq!(sim.faults().watch_list(), WatchListSupport::Ignored);
    let mut w = watch(addr, STREAM, None).await;
    assert_eq!(w.status, 200);
    let events = w.take(6, T).await;
    assert!(
        events[..4].iter().all(|e| e["type"] == "ADDED"),
        "{events:?}"
    );
    // Periodic bookmarks only, none of them the end of the initial events.
    assert!(events[4..]
        .iter()
        .all(|e| e["type"] == "BOOKMARK" && !is_end_bookmark(e)));
    // Whatever resourceVersionMatch says, it is not checked.
    let r = get(
        addr,
        "/api/v1/namespaces/default/pods?watch=true&resourceVersionMatch=Exact&resourceVersion=1&timeoutSeconds=1",
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn initial_events_cut_before_the_end_bookmark_end_the_body_and_only_the_next_n_are_cut() {
    let (sim, addr) = sim_with_pods(10, Duration::from_secs(60)).await;
    let r = request(
        addr,
        "POST",
        "/_sim/break-initial-events?count=1&after=4&how=cut&path_prefix=/api/v1/namespaces/default/pods",
        None,
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let mut cut = watch(addr, STREAM, None).await;
    let events = cut.take(20, T).await;
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(events.iter().all(|e| e["type"] == "ADDED"));
    assert!(cut.ends_within(T).await);
    // The next one is whole.
    let mut whole = watch(addr, STREAM, None).await;
    let events = whole.take(11, T).await;
    assert!(is_end_bookmark(&events[10]));
    drop(sim);
}

#[tokio::test]
async fn a_410_in_the_middle_of_the_initial_events_ends_the_stream_with_an_expired_error() {
    let (sim, addr) = sim_with_pods(10, Duration::from_secs(60)).await;
    sim.faults()
        .break_initial_events(2, 3, BreakKind::Gone, None);
    // A plain watch is not a streaming list: the rule does not apply to it.
    let mut plain = watch(addr, "/api/v1/namespaces/default/pods?watch=true", None).await;
    let events = plain.take(10, T).await;
    assert!(events.iter().all(|e| e["type"] == "ADDED"), "{events:?}");
    for _ in 0..2 {
        let mut w = watch(addr, STREAM, None).await;
        let events = w.take(20, T).await;
        assert_eq!(events.len(), 4, "{events:?}");
        assert!(events[..3].iter().all(|e| e["type"] == "ADDED"));
        assert_eq!(events[3]["type"], "ERROR");
        assert_eq!(events[3]["object"]["code"], 410);
        assert_eq!(events[3]["object"]["reason"], "Expired");
        assert!(w.ends_within(T).await);
    }
    // The rule is used up.
    let mut w = watch(addr, STREAM, None).await;
    assert!(is_end_bookmark(&w.take(11, T).await[10]));
}
