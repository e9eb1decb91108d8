//! Streaming lists (KEP-3157) and the request budget, end to end against the simulator over
//! real HTTP: a streamed initial state and a streamed relist send exactly what paged lists
//! send; `watch.initial_list = "auto"` falls back to paged lists in every case where the server
//! cannot stream (the feature gate off, `sendInitialEvents` ignored, the end bookmark never
//! coming) and only then; a resumed watch never asks for the initial events again; a 410 in
//! the middle of the initial events restarts cleanly; the client-side rate limit holds.

use kubesink_test_support::{self as support, run};

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kubesink::config::{Config, HumanDuration, InitialList, PayloadMode, ResourceConfig};
use kubesink_sim::workload::namespace_name;
use kubesink_sim::{BreakKind, SimConfig, WatchListSupport, Workload};
use run::{Run, LONG};
use serde_json::Value;
use support::*;

const PODS: &str = "/api/v1/pods";

fn pods() -> Vec<ResourceConfig> {
    vec![ResourceConfig::new("v1", "Pod")]
}

fn with(initial_list: InitialList) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| c.watch.initial_list = initial_list
}

/// A simulator reporting Kubernetes 1.32, where `auto` streams JSON lists (`auto_shape`):
/// the release whose streaming lists and fallbacks these tests are about.
async fn populated(pods: usize, sim: SimConfig) -> Cluster {
    let c = cluster(sim).await;
    c.sim.set_server_version(1, 32);
    c.sim
        .populate(&Workload {
            namespaces: 3,
            pods,
            nodes: 5,
            seed: 11,
            ..Default::default()
        })
        .unwrap();
    c
}

/// The requests of the streaming lists (`sendInitialEvents=true`) and of LIST pages under
/// `path`, from the simulator's request log.
fn requests(c: &Cluster, path: &str) -> (usize, usize) {
    let log = c.sim.requests();
    let of = |r: &&kubesink_sim::RecordedRequest| r.path_and_query.starts_with(path);
    let streams = log
        .iter()
        .filter(of)
        .filter(|r| r.path_and_query.contains("sendInitialEvents=true"))
        .count();
    let lists = log
        .iter()
        .filter(of)
        .filter(|r| !r.path_and_query.contains("watch=true"))
        .count();
    (streams, lists)
}

/// A message as compared between two runs: everything but when it was observed, and the
/// cluster name (each run has its own).
fn comparable(m: &Value, cluster: &str) -> String {
    let mut m = m.clone();
    if let Some(o) = m.as_object_mut() {
        o.remove("observedAt");
    }
    m.to_string().replace(cluster, "CLUSTER")
}

/// Every message of a run, per key in order.
fn per_key(run: &Run) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in run.sink.messages() {
        let key = m["key"]
            .as_str()
            .unwrap_or("")
            .replace(&run.cluster, "CLUSTER");
        out.entry(key)
            .or_default()
            .push(comparable(&m, &run.cluster));
    }
    out
}

/// What every watch of `run` uses now, from `kubesink_watch_initial_list{strategy}`:
/// `stream`, `list`, or what else the gauges say.
fn strategy_metric(run: &Run) -> String {
    let metrics = run.bridge.observed().metrics().0;
    let watches = run.bridge.informer_stats().len() as f64;
    let of = |s: &str| {
        metric(&metrics, "kubesink_watch_initial_list", &[("strategy", s)]).unwrap_or(0.0)
    };
    match (of("stream"), of("list")) {
        (s, l) if s == watches && l == 0.0 => "stream".into(),
        (s, l) if l == watches && s == 0.0 => "list".into(),
        other => format!("neither: {other:?} of {watches} watches"),
    }
}

/// Panics unless `a` and `b` hold the same messages per key, naming what differs (briefly:
/// a message is kilobytes).
fn assert_same(what: &str, a: &BTreeMap<String, Vec<String>>, b: &BTreeMap<String, Vec<String>>) {
    let brief = |v: &Vec<String>| -> Vec<String> {
        v.iter()
            .map(|m| {
                let m: Value = serde_json::from_str(m).unwrap_or_default();
                format!(
                    "{} {} rv={} id={} initial={} fsu={}",
                    m["op"],
                    m["key"],
                    m["resourceVersion"],
                    m["id"],
                    m["initial"],
                    m["finalStateUnknown"]
                )
            })
            .collect()
    };
    for (key, msgs) in a {
        match b.get(key) {
            None => panic!("{what}: {key} only in the first: {:#?}", brief(msgs)),
            Some(other) if other != msgs => panic!(
                "{what}: {key} differs:\n first {:#?}\n second {:#?}",
                brief(msgs),
                brief(other)
            ),
            Some(_) => {}
        }
    }
    if let Some((key, msgs)) = b.iter().find(|(k, _)| !a.contains_key(*k)) {
        panic!("{what}: {key} only in the second: {:#?}", brief(msgs));
    }
}

/// Both runs synced and their sinks idle.
async fn settled(runs: &[&Run]) {
    for r in runs {
        wait_for("synced", LONG, || r.synced()).await;
        r.idle().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_initial_state_and_relist_send_exactly_what_paged_lists_send() {
    // A small retained window: the changes made while the watches are down compact their
    // resourceVersion, so they come back to 410 Gone and relist.
    let c = populated(
        120,
        SimConfig {
            retained_events: 20,
            ..SimConfig::default()
        },
    )
    .await;
    let resources = vec![
        ResourceConfig::new("v1", "Pod"),
        ResourceConfig {
            payload: PayloadMode::Metadata,
            ..ResourceConfig::new("v1", "Node")
        },
    ];
    let tweak = |mode| {
        move |cfg: &mut Config| {
            cfg.watch.initial_list = mode;
            cfg.pipeline.sync_markers = true;
            // One cluster name for both: it is part of every message id.
            cfg.cluster.name = "twins".into();
        }
    };
    let listed = Run::start(&c, "paged", resources.clone(), tweak(InitialList::List)).await;
    let streamed = Run::start(&c, "streamed", resources, tweak(InitialList::Stream)).await;
    settled(&[&listed, &streamed]).await;
    assert_eq!(strategy_metric(&listed), "list");
    assert_eq!(strategy_metric(&streamed), "stream");
    let initial = per_key(&listed);
    assert_eq!(
        initial.values().map(Vec::len).sum::<usize>(),
        125 + 2,
        "125 objects and 2 sync markers"
    );
    assert_same("the initial states", &initial, &per_key(&streamed));

    // The gap: every pod and node request answers 503 (open watches end), pods are deleted,
    // changed and created, then the server comes back and both resume into 410 Gone.
    for prefix in [PODS, "/api/v1/nodes"] {
        c.sim
            .faults()
            .set_status_for(
                kubesink_sim::RequestMatch::PathPrefix(prefix.into()),
                503,
                None,
            )
            .unwrap();
    }
    let uids = |c: &Cluster| -> std::collections::BTreeSet<String> {
        c.sim
            .objects("v1", "Pod")
            .iter()
            .map(|p| p["metadata"]["uid"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let before = uids(&c);
    let victims: Vec<Value> = c.sim.objects("v1", "Pod").into_iter().take(30).collect();
    delete_each(&c.sim, "v1", "Pod", &victims);
    for mut p in c.sim.objects("v1", "Pod").into_iter().take(10) {
        p["metadata"]["labels"]["gap"] = "changed".into();
        c.sim.replace(p).unwrap();
    }
    c.sim.churn_steps(20, 5).unwrap();
    c.sim.faults().clear();
    // Each relist ends with its sync marker: two per resource and run.
    let markers = |r: &Run| {
        r.sink
            .messages()
            .iter()
            .filter(|m| m["op"] == "synced")
            .count()
    };
    wait_for("both relisted both resources", LONG, || {
        markers(&listed) == 4 && markers(&streamed) == 4
    })
    .await;
    settled(&[&listed, &streamed]).await;
    let after = per_key(&listed);
    assert_same("the relists", &after, &per_key(&streamed));
    let inferred: std::collections::BTreeSet<String> = listed
        .sink
        .messages()
        .iter()
        .filter(|m| m["finalStateUnknown"] == true)
        .map(|m| m["uid"].as_str().unwrap_or_default().to_owned())
        .collect();
    let vanished: std::collections::BTreeSet<String> =
        before.difference(&uids(&c)).cloned().collect();
    assert!(vanished.len() >= 30);
    assert_eq!(
        inferred, vanished,
        "the deletes made in the gap, inferred by the relist"
    );
    let expected = sim_state(&c.sim, &[("v1", "Pod"), ("v1", "Node")]);
    assert_eq!(fold(&streamed.sink.messages()), expected);
    assert_schema_valid(&schema(), &streamed.sink.messages());
    // No LIST from the streamed run: its only list requests are watches.
    assert_eq!(streamed.count("Pod", |s| &s.list_requests), 0);
    assert!(listed.count("Pod", |s| &s.list_requests) >= 2);
    listed.bridge.shutdown().await;
    streamed.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_watch_never_asks_for_the_initial_events_again() {
    let c = populated(40, SimConfig::default()).await;
    let run = Run::start(&c, "resume", pods(), with(InitialList::Stream)).await;
    settled(&[&run]).await;
    assert_eq!(requests(&c, PODS), (1, 0));
    let sent = run.sink.len();
    // Cut the watch three ways: closed by the server, a connection reset, and the server
    // unreachable for a moment.
    for cut in 0..3 {
        let watches = run.count("Pod", |s| &s.watch_requests);
        match cut {
            0 => c.sim.faults().close_all_watches(),
            1 => c.sim.faults().reset_connections(),
            _ => c.sim.faults().set_unreachable(true),
        }
        if cut == 2 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.sim.faults().set_unreachable(false);
        }
        wait_for("the watch resumed", LONG, || {
            run.count("Pod", |s| &s.watch_requests) > watches && c.sim.open_watches() == 1
        })
        .await;
    }
    let mut pod = c.sim.objects("v1", "Pod").remove(0);
    pod["metadata"]["labels"]["after"] = "resume".into();
    c.sim.replace(pod).unwrap();
    wait_for("the change", LONG, || run.sink.len() == sent + 1).await;
    let log = c.sim.requests();
    let watches: Vec<&str> = log
        .iter()
        .filter(|r| r.path_and_query.starts_with(PODS))
        .map(|r| r.path_and_query.as_str())
        .collect();
    assert_eq!(
        watches
            .iter()
            .filter(|q| q.contains("sendInitialEvents"))
            .count(),
        1,
        "only the first request streams: {watches:#?}"
    );
    assert!(
        watches[1..].iter().all(|q| q.contains("watch=true")
            && !q.contains("resourceVersion=&")
            && !q.ends_with("resourceVersion=")),
        "every resumed watch names its resourceVersion: {watches:#?}"
    );
    assert_eq!(run.count("Pod", |s| &s.lists), 1, "no relist");
    assert_eq!(run.sink.len(), sent + 1, "nothing re-sent");
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_in_the_middle_of_the_initial_events_streams_again_and_sends_each_object_once() {
    let c = populated(60, SimConfig::default()).await;
    c.sim
        .faults()
        .break_initial_events(2, 25, BreakKind::Gone, Some(PODS));
    let run = Run::start(&c, "gone-midway", pods(), with(InitialList::Auto)).await;
    settled(&[&run]).await;
    assert_eq!(run.count("Pod", |s| &s.gone), 2);
    assert_eq!(
        requests(&c, PODS),
        (3, 0),
        "streamed three times, never listed"
    );
    assert_eq!(strategy_metric(&run), "stream");
    let msgs = run.sink.messages();
    assert_eq!(msgs.len(), 60, "each pod exactly once");
    assert!(msgs
        .iter()
        .all(|m| m["op"] == "added" && m["initial"] == true));
    assert_eq!(fold(&msgs), sim_state(&c.sim, &[("v1", "Pod")]));
    assert!(run.log("does not serve streaming lists").is_empty());
    run.bridge.shutdown().await;
}

/// `auto` asks the server's version first and takes the shape cheaper for it: on 1.36 paged
/// lists (from the watch cache's snapshot), whole objects and metadata alike; on 1.33 (the
/// `WatchList` gate off by default) paged lists without a streaming list refused first; on
/// 1.32 (pages after the first from etcd) a streaming list. None of them is a fallback; each
/// ends in the same fold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_chooses_the_list_shape_cheaper_for_the_server_by_version() {
    let c = populated(30, SimConfig::default()).await;
    let cases = [
        ((1, 36), PayloadMode::Full, "list"),
        ((1, 36), PayloadMode::Metadata, "list"),
        ((1, 33), PayloadMode::Full, "list"),
        ((1, 32), PayloadMode::Full, "stream"),
        ((1, 32), PayloadMode::Metadata, "stream"),
    ];
    for ((major, minor), mode, want) in cases {
        c.sim.set_server_version(major, minor);
        let before = requests(&c, PODS);
        let resources = vec![ResourceConfig {
            payload: mode,
            ..ResourceConfig::new("v1", "Pod")
        }];
        let name = format!("v1-{minor}-{mode:?}").to_lowercase();
        let run = Run::start(&c, &name, resources, with(InitialList::Auto)).await;
        wait_for("30 pods", LONG, || run.sink.len() == 30 && run.synced()).await;
        let after = requests(&c, PODS);
        let case = format!("1.{minor} {mode:?}: {before:?} → {after:?}");
        assert_eq!(strategy_metric(&run), want, "{case}");
        let (streams, lists) = (after.0 - before.0, after.1 - before.1);
        if want == "list" {
            assert_eq!(streams, 0, "no streaming list asked for: {case}");
            assert!(lists >= 1, "{case}");
        } else {
            assert_eq!((streams, lists), (1, 0), "{case}");
        }
        for (_, s) in run.bridge.informer_stats() {
            assert_eq!(s.initial_list_fallbacks.load(Ordering::SeqCst), 0, "{case}");
        }
        assert_eq!(
            fold(&run.sink.messages()),
            sim_state(&c.sim, &[("v1", "Pod")]),
            "{case}"
        );
        run.bridge.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_falls_back_to_paged_lists_when_the_feature_gate_is_off_and_says_so_once() {
    let c = populated(90, SimConfig::default()).await;
    c.sim.faults().set_watch_list(WatchListSupport::Off);
    // Three namespaces: three informers of the same resource, one fallback line.
    let resources = vec![ResourceConfig {
        namespaces: (0..3).map(namespace_name).collect(),
        ..ResourceConfig::new("v1", "Pod")
    }];
    let run = Run::start(&c, "gate-off", resources, with(InitialList::Auto)).await;
    wait_for("90 pods", LONG, || run.sink.len() == 90 && run.synced()).await;
    let lines = run.log("does not serve streaming lists");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("422") && lines[0].contains("WatchList feature gate"),
        "{}",
        lines[0]
    );
    assert_eq!(strategy_metric(&run), "list");
    let stats = run.bridge.informer_stats();
    assert_eq!(stats.len(), 3);
    for (_, s) in stats {
        assert_eq!(s.initial_list_fallbacks.load(Ordering::SeqCst), 1);
        assert_eq!(
            s.errors.load(Ordering::SeqCst),
            0,
            "a refusal is not an error"
        );
    }
    assert_eq!(
        fold(&run.sink.messages()),
        sim_state(&c.sim, &[("v1", "Pod")])
    );
    // A relist after 410 lists too: the fallback holds until restart.
    let (streams, lists) = requests(&c, "/api/v1/namespaces/default/pods");
    c.sim.faults().fail_next_watches_with_gone(1);
    c.sim.faults().close_all_watches();
    wait_for("a relist", LONG, || {
        requests(&c, "/api/v1/namespaces/").1 > 3
    })
    .await;
    settled(&[&run]).await;
    assert!(streams <= 1, "each informer tried once at most");
    assert!(requests(&c, "/api/v1/namespaces/default/pods").0 == streams);
    assert!(lists >= 1);
    // Every line of a watch names its strategy once: the one of its time.
    let spans = run.logs.of(&run.cluster, "strategy=");
    assert!(
        spans.iter().any(|l| l.contains("strategy=\"list\"")),
        "{spans:#?}"
    );
    for l in &spans {
        assert_eq!(l.matches("strategy=").count(), 1, "{l}");
    }
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_falls_back_when_the_server_ignores_send_initial_events() {
    // Bookmarks every 200 ms: the first plain BOOKMARK before the end bookmark gives it away.
    let c = populated(
        30,
        SimConfig {
            bookmark_interval: Duration::from_millis(200),
            ..SimConfig::default()
        },
    )
    .await;
    c.sim.faults().set_watch_list(WatchListSupport::Ignored);
    let run = Run::start(&c, "ignored", pods(), with(InitialList::Auto)).await;
    wait_for("fallback", LONG, || strategy_metric(&run) == "list").await;
    settled(&[&run]).await;
    let lines = run.log("does not serve streaming lists");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("BOOKMARK without the k8s.io/initial-events-end annotation"),
        "{}",
        lines[0]
    );
    let msgs = run.sink.messages();
    assert_eq!(
        msgs.len(),
        30,
        "the objects the plain watch sent are not sent again"
    );
    assert_eq!(fold(&msgs), sim_state(&c.sim, &[("v1", "Pod")]));
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_falls_back_when_a_quiet_server_never_sends_the_end_bookmark() {
    // No bookmarks, no changes: after the ADDED events the stream is silent, twice.
    let c = populated(
        20,
        SimConfig {
            bookmark_interval: Duration::from_secs(3600),
            ..SimConfig::default()
        },
    )
    .await;
    c.sim.faults().set_watch_list(WatchListSupport::Ignored);
    let run = Run::start(&c, "silent", pods(), |cfg| {
        cfg.watch.initial_list = InitialList::Auto;
        cfg.watch.idle_timeout = HumanDuration(Duration::from_millis(700));
        cfg.watch.retry_initial_backoff = HumanDuration(Duration::from_millis(50));
    })
    .await;
    wait_for("fallback", LONG, || strategy_metric(&run) == "list").await;
    settled(&[&run]).await;
    assert_eq!(requests(&c, PODS).0, 2, "two silent streams, then lists");
    // The initial sync took both silences (2 x 700 ms) and the list, not the list alone.
    let took = run.count("Pod", |s| &s.initial_sync_ms);
    assert!(took >= 1_400, "initial sync {took} ms");
    let lines = run.log("does not serve streaming lists");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("2 times in a row"), "{}", lines[0]);
    assert_eq!(run.sink.len(), 20);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cut_stream_is_retried_two_in_a_row_fall_back() {
    let c = populated(40, SimConfig::default()).await;
    // One cut: streamed again, no fallback.
    c.sim
        .faults()
        .break_initial_events(1, 10, BreakKind::Cut, Some(PODS));
    let once = Run::start(&c, "cut-once", pods(), with(InitialList::Auto)).await;
    settled(&[&once]).await;
    assert_eq!(strategy_metric(&once), "stream");
    assert_eq!(requests(&c, PODS), (2, 0));
    assert_eq!(once.sink.len(), 40);
    once.bridge.shutdown().await;

    // Two cuts in a row: falls back.
    let c = populated(40, SimConfig::default()).await;
    c.sim
        .faults()
        .break_initial_events(2, 10, BreakKind::Cut, Some(PODS));
    let twice = Run::start(&c, "cut-twice", pods(), with(InitialList::Auto)).await;
    settled(&[&twice]).await;
    assert_eq!(strategy_metric(&twice), "list");
    let (streams, lists) = requests(&c, PODS);
    assert_eq!(streams, 2);
    assert!(lists >= 1);
    let lines = twice.log("does not serve streaming lists");
    assert!(
        lines.len() == 1 && lines[0].contains("before the initial-events-end bookmark"),
        "{lines:#?}"
    );
    assert_eq!(twice.sink.len(), 40);
    twice.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_mode_never_lists_and_waits_for_the_server_to_stream() {
    let c = populated(15, SimConfig::default()).await;
    c.sim.faults().set_watch_list(WatchListSupport::Off);
    let run = Run::start(&c, "stream-only", pods(), with(InitialList::Stream)).await;
    wait_for("three refused streams", LONG, || requests(&c, PODS).0 >= 3).await;
    assert_eq!(requests(&c, PODS).1, 0, "no LIST, ever");
    assert_eq!(run.sink.len(), 0);
    let ready = run.bridge.observed().readiness();
    assert!(!ready.ok, "not ready while it cannot list: {}", ready.body);
    assert!(
        ready.body.to_string().contains("no streaming list")
            || ready.body.to_string().contains("422"),
        "{}",
        ready.body
    );
    // The server is upgraded: the next retry streams.
    c.sim.faults().set_watch_list(WatchListSupport::On);
    wait_for("synced", LONG, || run.synced() && run.sink.len() == 15).await;
    assert_eq!(requests(&c, PODS).1, 0);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_watch_requests_stay_within_the_clusters_rate_limit() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 24,
            pods: 48,
            configmaps: 48,
            seed: 2,
            ..Default::default()
        })
        .unwrap();
    let namespaces: Vec<String> = (0..24).map(namespace_name).collect();
    let resources = vec![
        ResourceConfig {
            namespaces: namespaces.clone(),
            ..ResourceConfig::new("v1", "Pod")
        },
        // In pages of one: two LIST requests per namespace.
        ResourceConfig {
            namespaces,
            page_size: 1,
            ..ResourceConfig::new("v1", "ConfigMap")
        },
    ];
    let (rate, burst) = (20.0, 4u32);
    let started = Instant::now();
    let run = Run::start(&c, "rate", resources, |cfg| {
        cfg.watch.requests_per_second = rate;
        cfg.watch.request_burst = burst;
        cfg.watch.initial_list = InitialList::List;
    })
    .await;
    settled(&[&run]).await;
    let log: Vec<Instant> = c
        .sim
        .requests()
        .iter()
        .filter(|r| r.path_and_query.starts_with("/api/v1/namespaces/") && r.at >= started)
        .map(|r| r.at)
        .collect();
    assert!(log.len() >= 24 * 2 * 2, "{} requests", log.len());
    // However the requests fell, no window holds more than the bucket allows: `burst` at once
    // plus `rate` per second of the window (one more for the window's edges).
    for (i, first) in log.iter().enumerate() {
        for (j, last) in log.iter().enumerate().skip(i) {
            let window = last.duration_since(*first).as_secs_f64();
            let allowed = f64::from(burst) + rate * window + 1.0;
            let n = (j - i + 1) as f64;
            assert!(
                n <= allowed,
                "{n} requests in {window:.3} s, the limit allows {allowed:.1}"
            );
        }
    }
    let metrics = run.bridge.observed().metrics().0;
    assert!(
        metric_value(
            &metrics,
            "kubesink_api_rate_limited_requests_total",
            &[("cluster", &run.cluster)]
        ) > 0.0
    );
    let sent = metric_value(
        &metrics,
        "kubesink_api_requests_total",
        &[("cluster", &run.cluster), ("verb", "list")],
    ) + metric_value(
        &metrics,
        "kubesink_api_requests_total",
        &[("cluster", &run.cluster), ("verb", "watch")],
    );
    assert_eq!(
        sent as usize,
        log.len(),
        "the metric counts what the server received"
    );
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relists_after_a_shared_410_are_spread_over_the_jitter_not_sent_together() {
    let c = cluster(SimConfig {
        bookmark_interval: Duration::from_millis(100),
        ..SimConfig::default()
    })
    .await;
    c.sim
        .populate(&Workload {
            namespaces: 20,
            pods: 40,
            seed: 4,
            ..Default::default()
        })
        .unwrap();
    let resources = vec![ResourceConfig {
        namespaces: (0..20).map(namespace_name).collect(),
        ..ResourceConfig::new("v1", "Pod")
    }];
    // Paged lists, so that the relists are the LIST requests and cannot take a 410 meant
    // for a resumed watch.
    let run = Run::start(&c, "jitter", resources, |cfg| {
        cfg.watch.initial_list = InitialList::List;
        cfg.watch.retry_initial_backoff = HumanDuration(Duration::from_millis(800));
        cfg.watch.retry_max_backoff = HumanDuration(Duration::from_secs(2));
    })
    .await;
    settled(&[&run]).await;
    // Every watch delivered a bookmark since its list: a 410 now is an expired
    // resourceVersion, relisted without backoff (only the jitter spreads them).
    wait_for("a bookmark on every watch", LONG, || {
        run.bridge
            .informer_stats()
            .iter()
            .all(|(_, s)| s.bookmarks.load(Ordering::SeqCst) >= 1)
    })
    .await;
    // One etcd compaction expires every watch at once. (Twenty 410s for the next twenty
    // watch requests, as before, could let a fast relist's new watch take the 410 meant for
    // an informer slow to resume on a busy machine.)
    let expired = Instant::now();
    c.sim.compact();
    c.sim.faults().close_all_watches();
    // The informers count a list when they start it, before its request reaches the
    // simulator: wait for both.
    let relists = || -> Vec<Instant> {
        c.sim
            .requests()
            .iter()
            .filter(|r| r.at >= expired && !r.path_and_query.contains("watch=true"))
            .map(|r| r.at)
            .collect()
    };
    wait_for("20 relists", LONG, || {
        relists().len() >= 20
            && run
                .bridge
                .informer_stats()
                .iter()
                .all(|(_, s)| s.lists.load(Ordering::SeqCst) == 2)
    })
    .await;
    let relists = relists();
    assert_eq!(relists.len(), 20, "one LIST page per namespace");
    let first = relists.iter().min().copied().unwrap_or(expired);
    let last = relists.iter().max().copied().unwrap_or(expired);
    let spread = last.duration_since(first);
    // 20 delays drawn from 0–800 ms: all within 100 ms of each other has a chance of about
    // 20 × (1/8)^19; without the jitter they arrive within a few milliseconds.
    assert!(
        spread >= Duration::from_millis(100),
        "the relists came within {spread:?} of each other"
    );
    // No ceiling on the spread: it is a wall-clock figure a loaded machine stretches (the
    // jitter is drawn from 0..=watch.retry_initial_backoff where the informer handles a
    // failure, src/informer/mod.rs).
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_mode_against_a_server_that_ignores_the_parameter_fails_fast_and_says_why() {
    let c = populated(
        12,
        SimConfig {
            bookmark_interval: Duration::from_millis(200),
            ..SimConfig::default()
        },
    )
    .await;
    c.sim.faults().set_watch_list(WatchListSupport::Ignored);
    let run = Run::start(&c, "stream-ignored", pods(), |cfg| {
        cfg.watch.initial_list = InitialList::Stream;
        cfg.watch.retry_initial_backoff = HumanDuration(Duration::from_millis(100));
    })
    .await;
    // Each attempt ends at the first plain bookmark (~200 ms), not at the watch's timeout.
    wait_for("three streaming attempts", LONG, || {
        requests(&c, PODS).0 >= 3
    })
    .await;
    assert_eq!(requests(&c, PODS).1, 0, "no LIST, ever");
    let ready = run.bridge.observed().readiness();
    assert!(!ready.ok);
    let body = ready.body.to_string();
    assert!(
        body.contains("BOOKMARK without the k8s.io/initial-events-end annotation"),
        "{body}"
    );
    assert_eq!(strategy_metric(&run), "stream");
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_waiting_for_the_budget_do_not_stream_once_another_found_the_server_cannot() {
    let c = populated(50, SimConfig::default()).await;
    c.sim.faults().set_watch_list(WatchListSupport::Off);
    let resources = vec![ResourceConfig {
        namespaces: (0..3).map(namespace_name).collect(),
        ..ResourceConfig::new("v1", "Pod")
    }];
    // One request at a time, four a second: the first refusal is known before the other
    // watches' turns come.
    let run = Run::start(&c, "budget-learns", resources, |cfg| {
        cfg.watch.initial_list = InitialList::Auto;
        cfg.watch.requests_per_second = 4.0;
        cfg.watch.request_burst = 1;
    })
    .await;
    settled(&[&run]).await;
    let streams = c
        .sim
        .requests()
        .iter()
        .filter(|r| r.path_and_query.contains("sendInitialEvents=true"))
        .count();
    assert_eq!(
        streams, 1,
        "one refused streaming list for the resource, not one per namespace"
    );
    assert_eq!(strategy_metric(&run), "list");
    assert_eq!(run.log("does not serve streaming lists").len(), 1);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_the_server_rejects_is_reported_as_such_and_streaming_lists_are_kept() {
    let c = populated(9, SimConfig::default()).await;
    let resources = vec![ResourceConfig {
        label_selector: Some("tier in (web".into()),
        ..ResourceConfig::new("v1", "Pod")
    }];
    let run = Run::start(&c, "bad-selector", resources, with(InitialList::Auto)).await;
    let stats = run.stats("Pod");
    wait_for_seen("two failed streaming lists", LONG, || {
        let (streams, _) = requests(&c, "/api/v1/pods");
        (
            streams >= 2 && stats.failure().is_some(),
            format!("{streams} streaming lists; failure {:?}", stats.failure()),
        )
    })
    .await;
    let failure = stats.failure().unwrap_or_default();
    assert!(
        failure.contains("label selector \"tier in (web\" rejected by the API server: "),
        "{failure}"
    );
    assert_eq!(
        stats.initial_list_fallbacks.load(Ordering::SeqCst),
        0,
        "a selector error says nothing about streaming lists"
    );
    assert_eq!(strategy_metric(&run), "stream");
    let (_, lists) = requests(&c, "/api/v1/pods");
    assert_eq!(lists, 0, "no paged list tried");
    assert!(!run.log("rejected by the API server").is_empty());
    assert!(run.log("does not serve streaming lists").is_empty());
    run.bridge.shutdown().await;
}
