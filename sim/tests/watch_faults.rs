//! Watch faults over real HTTP: silent open and new watches, empty watches, damaged events,
//! and their admin endpoints.

mod support;

use std::time::Duration;

use kubesink_sim::{DamageKind, SimConfig};
use serde_json::{json, Value};
use support::*;

const T: Duration = Duration::from_secs(5);
/// How long a silent watch is observed to send nothing.
const QUIET: Duration = Duration::from_millis(600);

fn fast_bookmarks() -> SimConfig {
    SimConfig {
        bookmark_interval: Duration::from_millis(50),
        ..SimConfig::default()
    }
}

const WATCH_CMS: &str = "/api/v1/namespaces/default/configmaps?watch=true&allowWatchBookmarks=true";

#[tokio::test]
async fn silenced_open_watches_send_nothing_but_stay_open_while_new_watches_work() {
    let (sim, addr) = start(fast_bookmarks()).await;
    let mut w = watch(addr, WATCH_CMS, None).await;
    assert_eq!(w.next(T).await.unwrap()["type"], "BOOKMARK");
    sim.faults().silence_open_watches();
    sim.create(configmap("default", "after-silence", json!({})))
        .unwrap();
    assert!(w.silent_for(QUIET).await, "no event, no bookmark, no end");
    assert_eq!(sim.open_watches(), 1, "the connection stays open");

    let mut fresh = watch(addr, WATCH_CMS, None).await;
    let first = fresh.next(T).await.unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("after-silence"))
    );
    sim.faults().close_all_watches();
    assert!(
        w.ends_within(T).await,
        "close-watches still ends a silent watch"
    );
}

#[tokio::test]
async fn silenced_new_watches_on_a_prefix_are_accepted_then_silent_even_past_their_timeout() {
    let (sim, addr) = start(fast_bookmarks()).await;
    sim.faults()
        .silence_watches(Some("/api/v1/namespaces/default/configmaps"), true);
    let mut silent = watch(
        addr,
        "/api/v1/namespaces/default/configmaps?watch=true&allowWatchBookmarks=true&timeoutSeconds=1",
        None,
    )
    .await;
    assert_eq!(silent.status, 200);
    let mut other = watch(
        addr,
        "/api/v1/configmaps?watch=true&allowWatchBookmarks=true",
        None,
    )
    .await;
    sim.create(configmap("default", "a", json!({}))).unwrap();
    assert_eq!(
        other.next(T).await.unwrap()["type"],
        "ADDED",
        "other paths unaffected"
    );
    assert!(
        silent.silent_for(Duration::from_millis(1500)).await,
        "silent past timeoutSeconds"
    );

    sim.faults()
        .silence_watches(Some("/api/v1/namespaces/default/configmaps"), false);
    let mut normal = watch(addr, WATCH_CMS, None).await;
    assert_eq!(normal.next(T).await.unwrap()["type"], "ADDED");

    // The same through the admin endpoint, for every path.
    let on = request(addr, "POST", "/_sim/silence-watches?on=true", None, None).await;
    assert_eq!(on.status, 200);
    let mut all = watch(
        addr,
        "/api/v1/pods?watch=true&allowWatchBookmarks=true",
        None,
    )
    .await;
    assert_eq!(all.status, 200);
    assert!(all.silent_for(QUIET).await);
    request(addr, "POST", "/_sim/silence-watches?on=false", None, None).await;
    let mut back = watch(
        addr,
        "/api/v1/pods?watch=true&allowWatchBookmarks=true",
        None,
    )
    .await;
    assert_eq!(back.next(T).await.unwrap()["type"], "BOOKMARK");
    request(addr, "POST", "/_sim/silence-open-watches", None, None).await;
    assert!(back.silent_for(QUIET).await);
}

#[tokio::test]
async fn empty_watches_answer_200_and_end_at_once_without_events() {
    let (sim, addr) = start(fast_bookmarks()).await;
    sim.create(configmap("default", "a", json!({}))).unwrap();
    sim.faults()
        .empty_watches(Some("/api/v1/namespaces/default"), true);
    let resp = get(addr, "/api/v1/namespaces/default/configmaps?watch=true").await;
    assert_eq!((resp.status, resp.body.as_str()), (200, ""));
    assert_eq!(sim.open_watches(), 0);
    let mut unaffected = watch(addr, "/api/v1/configmaps?watch=true", None).await;
    assert_eq!(unaffected.next(T).await.unwrap()["type"], "ADDED");

    sim.faults().empty_watches(None, false);
    let mut back = watch(addr, WATCH_CMS, None).await;
    assert_eq!(back.next(T).await.unwrap()["type"], "ADDED");
    request(addr, "POST", "/_sim/empty-watches?on=true", None, None).await;
    assert_eq!(get(addr, "/api/v1/pods?watch=true").await.body, "");
}

/// Opens a watch, injects one damaged event of `kind`, writes two objects and returns the
/// raw lines of the two events.
async fn damaged_then_intact(kind: DamageKind) -> (Vec<u8>, Vec<u8>) {
    let (sim, addr) = start(SimConfig::default()).await;
    let rv = sim.resource_version();
    let mut w = watch(
        addr,
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"),
        None,
    )
    .await;
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    sim.faults()
        .damage_next_watch_events(1, kind, Some("/api/v1/namespaces/default/configmaps"));
    sim.create(configmap("default", "lost", json!({}))).unwrap();
    sim.create(configmap("default", "kept", json!({}))).unwrap();
    let damaged = w.next_line(T).await.unwrap();
    let intact = w.next_line(T).await.unwrap();
    assert_eq!(sim.faults().damaged_watch_events(), 1);
    (damaged, intact)
}

fn assert_intact_kept(intact: &[u8]) {
    let ev: Value = serde_json::from_slice(intact).unwrap();
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["metadata"]["name"], "kept");
}

#[tokio::test]
async fn a_truncated_event_is_a_real_line_cut_in_the_middle_and_the_watch_goes_on() {
    let (damaged, intact) = damaged_then_intact(DamageKind::Truncated).await;
    assert!(damaged.ends_with(b"\n"));
    assert!(damaged.starts_with(b"{\"type\":\"ADDED\",\"object\":{"));
    assert!(serde_json::from_slice::<Value>(&damaged).is_err());
    assert!(damaged.len() * 2 <= intact.len() + 8, "about half a line");
    assert_intact_kept(&intact);
}

#[tokio::test]
async fn not_json_non_utf8_and_not_an_event_lines_replace_events() {
    let (damaged, intact) = damaged_then_intact(DamageKind::NotJson).await;
    assert!(std::str::from_utf8(&damaged).is_ok());
    assert!(serde_json::from_slice::<Value>(&damaged).is_err());
    assert_intact_kept(&intact);

    let (damaged, intact) = damaged_then_intact(DamageKind::NonUtf8).await;
    assert!(std::str::from_utf8(&damaged).is_err());
    assert_intact_kept(&intact);

    let (damaged, intact) = damaged_then_intact(DamageKind::NotAnEvent).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&damaged).unwrap(),
        json!({"hello": "world"})
    );
    assert_intact_kept(&intact);
}

#[tokio::test]
async fn damage_applies_to_matching_paths_only_and_is_driven_by_the_admin_endpoint() {
    let (sim, addr) = start(SimConfig::default()).await;
    let rv = sim.resource_version();
    let mut pods = watch(
        addr,
        &format!("/api/v1/configmaps?watch=true&resourceVersion={rv}"),
        None,
    )
    .await;
    let mut other_ns = watch(
        addr,
        &format!("/api/v1/namespaces/other/configmaps?watch=true&resourceVersion={rv}"),
        None,
    )
    .await;
    wait_for("watches open", T, || sim.open_watches() == 2).await;
    let resp = request(
        addr,
        "POST",
        "/_sim/damage-watch-events?count=2&kind=not-an-event&path_prefix=/api/v1/configmaps",
        None,
        None,
    )
    .await;
    assert_eq!(resp.status, 200);
    for name in ["a", "b", "c"] {
        sim.create(configmap("other", name, json!({}))).unwrap();
    }
    let lines: Vec<Value> = pods.take(3, T).await;
    assert_eq!(lines[0], json!({"hello": "world"}));
    assert_eq!(lines[1], json!({"hello": "world"}));
    assert_eq!(lines[2]["object"]["metadata"]["name"], "c");
    let intact = other_ns.take(3, T).await;
    assert!(intact.iter().all(|e| e["type"] == "ADDED"));
    let stats = get(addr, "/_sim/stats").await.json();
    assert_eq!(stats["damagedWatchEvents"], 2);
    let bad = request(
        addr,
        "POST",
        "/_sim/damage-watch-events?kind=bogus",
        None,
        None,
    )
    .await;
    assert_eq!(bad.status, 400);
}
