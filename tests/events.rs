//! Events mode (`mode = "events"`, docs/events.md) against the simulator, for what a real
//! server cannot be asked to do on cue: the Events watch quirk at a chosen moment (a watch
//! resumed from a compacted resourceVersion answered 200 and closed, with no 410, as
//! kube-apiserver answers for Events), and a storm of count bumps behind a slow sink. Each
//! run's `occurrences` summed per Event must equal the Event's count in the simulator.

use kubesink_test_support::{self as support, run};

use std::collections::BTreeMap;
use std::time::Duration;

use kubesink::config::{HumanDuration, ResourceConfig, ResourceMode, Since};
use kubesink_sim::SimConfig;
use run::{Run, LONG};
use serde_json::{json, Value};
use support::*;

const NS: &str = "storm";

fn event(name: &str, count: u64) -> Value {
    let mut v = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": NS},
        "eventTime": "2026-12-07T10:00:00.000000Z", "reportingController": "kubelet",
        "reportingInstance": "node-1", "action": "Starting", "reason": "BackOff", "type": "Warning",
        "note": "Back-off restarting failed container",
        "regarding": {"kind": "Pod", "namespace": NS, "name": "web-1", "apiVersion": "v1"}});
    if count > 1 {
        v["series"] = json!({"count": count, "lastObservedTime": "2026-12-07T10:05:00.000000Z"});
    }
    v
}

/// `name`'s count set to `count`, as the events recorder bumps a series.
fn bump(c: &Cluster, name: &str, count: u64) {
    let mut current = c
        .sim
        .objects("events.k8s.io/v1", "Event")
        .into_iter()
        .find(|e| e["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Event {name}"));
    current["series"] = json!({"count": count, "lastObservedTime": "2026-12-07T10:06:00.000000Z"});
    c.sim.replace(current).expect("replace");
}

fn events() -> Vec<ResourceConfig> {
    let mut r = ResourceConfig::new("events.k8s.io/v1", "Event");
    r.mode = ResourceMode::Events;
    r.since = Some(Since::All);
    vec![r]
}

/// Each Event's count in the simulator, by uid.
fn counts(c: &Cluster) -> BTreeMap<String, u64> {
    c.sim
        .objects("events.k8s.io/v1", "Event")
        .into_iter()
        .map(|e| {
            let n = e["series"]["count"].as_u64().unwrap_or(1);
            (
                e["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                n,
            )
        })
        .collect()
}

/// The sum of `occurrences` per uid, each message id once.
fn sums(run: &Run) -> BTreeMap<String, u64> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = BTreeMap::new();
    for m in run.sink.messages() {
        if seen.insert(m["id"].to_string()) {
            if let Some(n) = m["occurrences"].as_u64() {
                *out.entry(m["uid"].as_str().unwrap_or_default().to_owned())
                    .or_default() += n;
            }
        }
    }
    out
}

async fn sums_equal(c: &Cluster, run: &Run) {
    support::wait_until(
        "the sums of occurrences to equal the counts",
        LONG,
        || async {
            let (want, got) = (counts(c), sums(run));
            if want == got {
                Ok(())
            } else {
                Err(format!("want {want:?}\n got {got:?}"))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_events_resumed_from_a_compacted_version_ends_at_once_and_is_relisted() {
    let c = cluster(SimConfig::default()).await;
    for i in 0..6 {
        c.sim.create(event(&format!("e-{i}"), 2)).expect("create");
    }
    let run = Run::start(&c, "quirk", events(), |cfg| {
        cfg.watch.retry_initial_backoff = HumanDuration(Duration::from_millis(100));
        cfg.watch.retry_max_backoff = HumanDuration(Duration::from_millis(500));
    })
    .await;
    sums_equal(&c, &run).await;
    // The watch down and the server unreachable; meanwhile counts rise, an Event is
    // created, and the history is compacted past the resourceVersion kubesink holds.
    c.sim.faults().set_unreachable(true);
    c.sim.faults().close_all_watches();
    for i in 0..3 {
        bump(&c, &format!("e-{i}"), 7);
    }
    c.sim.create(event("during", 4)).expect("create");
    c.sim.compact();
    c.sim.faults().set_unreachable(false);
    sums_equal(&c, &run).await;
    let gone = run.count("Event", |s| &s.early_ends_gone);
    assert!(
        gone >= 1,
        "the resumed watch ended at once and its resourceVersion was found gone"
    );
    assert!(run.count("Event", |s| &s.lists) >= 2, "relisted");
    // Exactly the differences: three bumps of 5 occurrences and one new Event of 4.
    let after: Vec<(String, u64)> = run
        .sink
        .messages()
        .iter()
        .skip_while(|m| m["initial"] == true)
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_owned(),
                m["occurrences"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let mut after = after;
    after.sort();
    assert_eq!(
        after,
        [
            ("during".to_owned(), 4),
            ("e-0".to_owned(), 5),
            ("e-1".to_owned(), 5),
            ("e-2".to_owned(), 5)
        ]
    );
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_count_bumps_behind_a_slow_sink_coalesces_and_the_sums_stay_exact() {
    let c = cluster(SimConfig::default()).await;
    c.sim.create(event("crashloop", 1)).expect("create");
    let run = Run::start(&c, "storm", events(), |cfg| {
        cfg.pipeline.linger = HumanDuration(Duration::from_millis(300));
    })
    .await;
    sums_equal(&c, &run).await;
    // 2,000 bumps of one series as fast as the simulator takes them: with a linger of
    // 300 ms, what waits in the queue is replaced, its occurrences added to the survivor.
    for n in 2..=2_001 {
        bump(&c, "crashloop", n);
    }
    sums_equal(&c, &run).await;
    let messages = run.sink.len();
    assert!(
        messages < 1_000,
        "{messages} messages for 2,000 bumps: the queue coalesced the series"
    );
    assert!(run
        .bridge
        .pipeline()
        .sinks()
        .iter()
        .all(|h| h.coalesced() > 0));
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasons_rate_limit_holds_its_storm_back_folds_it_and_lets_other_reasons_through() {
    let c = cluster(SimConfig::default()).await;
    let mut events = events();
    events[0].reason_rate_limit = Some(20);
    let run = Run::start(&c, "limited", events, |_| {}).await;
    c.sim.create(event("first", 1)).expect("create");
    sums_equal(&c, &run).await;
    // A storm of one reason: 200 BackOff Events at once, then each happens again; meanwhile
    // a few Events of another reason.
    for i in 0..200 {
        c.sim
            .create(event(&format!("backoff-{i}"), 1))
            .expect("create");
    }
    for i in 0..5 {
        let mut other = event(&format!("pulled-{i}"), 1);
        other["reason"] = json!("Pulled");
        c.sim.create(other).expect("create");
    }
    for i in 0..200 {
        bump(&c, &format!("backoff-{i}"), 2);
    }
    sums_equal(&c, &run).await;
    let messages = run.sink.messages();
    let last = |prefix: &str| {
        messages
            .iter()
            .rposition(|m| m["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .unwrap_or(usize::MAX)
    };
    assert!(
        last("pulled-") < last("backoff-"),
        "the other reason is not queued behind the storm"
    );
    let sinks = run.bridge.pipeline().sinks();
    let (held, folded) = (sinks[0].rate_held(), sinks[0].rate_folded());
    eprintln!(
        "{} messages for 401 changes; held back {held}, folded {folded}",
        messages.len()
    );
    assert!(held > 0 && folded > 0, "held {held}, folded {folded}");
    assert!(
        messages.len() < 401,
        "{} messages: the held ones folded their second occurrence",
        messages.len()
    );
    run.bridge.shutdown().await;
}
