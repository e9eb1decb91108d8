//! Metrics and health over real HTTP: `/metrics` scraped and parsed with a Prometheus text
//! parser under churn, `/readyz` following the initial sync and a sink outage, `/healthz`
//! staying up through it.

use kubesink_test_support as support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::ResourceConfig;
use kubesink_core::Sink;
use kubesink_sim::{SimConfig, Workload};
use support::*;

const LONG: Duration = Duration::from_secs(60);

/// One scrape: metric name (with `_total`, `_bucket`... as exposed) and labels → value.
type Scrape = HashMap<(String, Vec<(String, String)>), f64>;

async fn scrape(addr: SocketAddr) -> Scrape {
    let (code, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text format");
    parsed
        .samples
        .into_iter()
        .map(|s| {
            let mut labels: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                prometheus_parse::Value::Histogram(h) => {
                    h.iter().map(|b| b.count).fold(0.0, f64::max)
                }
                prometheus_parse::Value::Summary(_) => f64::NAN,
            };
            ((s.metric, labels), v)
        })
        .collect()
}

/// Scrapes until `cond` holds (counters are updated right after the sink confirmed); fails
/// the test after `LONG`, showing `what` and the last scrape.
async fn scrape_until(addr: SocketAddr, what: &str, cond: impl Fn(&Scrape) -> bool) -> Scrape {
    wait_until(what, LONG, || async {
        let s = scrape(addr).await;
        if cond(&s) {
            Ok(s)
        } else {
            let mut seen: Vec<String> = s
                .iter()
                .map(|((n, l), v)| format!("{n}{l:?} {v}"))
                .collect();
            seen.sort();
            Err(seen.join("\n"))
        }
    })
    .await
}

/// The sum of `name` over the samples whose labels include every pair of `with`; `None`
/// when there is no such sample (a labelled counter appears once incremented).
fn sum(s: &Scrape, name: &str, with: &[(&str, &str)]) -> Option<f64> {
    let values: Vec<f64> = s
        .iter()
        .filter(|((n, labels), _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, v)| *v)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// [`sum`] of a series that must be exposed: panics naming it when it is not.
fn value(s: &Scrape, name: &str, with: &[(&str, &str)]) -> f64 {
    sum(s, name, with)
        .unwrap_or_else(|| panic!("metric {name} with labels {with:?} is not exposed"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_exposed_and_move_under_churn() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 100,
            nodes: 5,
            seed: 3,
            ..Default::default()
        })
        .unwrap();
    let cfg = config(
        &c.kubeconfig,
        vec![
            ResourceConfig::new("v1", "Pod"),
            ResourceConfig::new("v1", "Node"),
        ],
    );
    let sink = CaptureSink::new();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    let bridge = Bridge::start(&plan(&cfg), client, sinks).await.unwrap();
    let addr = bridge.server_addr().expect("server enabled");
    wait_for("initial sync", LONG, || sink.len() >= 105).await;

    let before = scrape_until(addr, "105 messages delivered in the metrics", |s| {
        sum(s, "kubesink_sink_delivered_messages_total", &[]).is_some_and(|v| v >= 105.0)
    })
    .await;
    let pod = [("kind", "Pod"), ("cluster", "test"), ("scope", "all")];
    assert_eq!(value(&before, "kubesink_objects", &pod), 100.0);
    assert_eq!(value(&before, "kubesink_synced", &[("kind", "Node")]), 1.0);
    assert!(
        value(
            &before,
            "kubesink_watch_events_total",
            &[("kind", "Pod"), ("type", "listed")]
        ) >= 100.0
    );
    assert!(value(&before, "kubesink_messages_total", &[("op", "added")]) >= 105.0);
    assert!(value(&before, "kubesink_initial_sync_duration_seconds", &pod) > 0.0);
    assert!(
        value(
            &before,
            "kubesink_sink_delivered_messages_total",
            &[("sink", "capture")]
        ) >= 105.0
    );
    assert_eq!(
        value(&before, "kubesink_sink_ready", &[("sink", "capture")]),
        1.0
    );
    assert!(
        value(
            &before,
            "kubesink_sink_batch_size_count",
            &[("sink", "capture")]
        ) >= 1.0
    );
    assert!(value(&before, "kubesink_sink_send_duration_seconds_count", &[]) >= 1.0);
    assert!(before
        .keys()
        .any(|(n, l)| n == "kubesink_build_info" && l.iter().any(|(k, _)| k == "version")));
    for name in [
        "kubesink_suppressed_total",
        "kubesink_updates_ignored_total",
        "kubesink_inferred_deletes_total",
        "kubesink_watch_requests_total",
        "kubesink_watch_gone_total",
        "kubesink_watch_idle_restarts_total",
        "kubesink_api_errors_total",
        "kubesink_watch_last_event_age_seconds",
        "kubesink_sink_pending_messages",
        "kubesink_sink_pending_bytes",
        "kubesink_sink_coalesced_total",
        "kubesink_sink_errors_total",
        "kubesink_sink_retried_messages_total",
        "kubesink_sink_truncated_messages_total",
    ] {
        assert!(before.keys().any(|(n, _)| n == name), "{name} missing");
    }

    c.sim.churn_steps(200, 9).unwrap();
    // A relist (410) moves the gone counter.
    c.sim.faults().fail_next_watches_with_gone(2);
    c.sim.faults().close_all_watches();
    let want = sim_state(&c.sim, &[("v1", "Pod"), ("v1", "Node")]);
    wait_for("churn delivered", LONG, || fold(&sink.messages()) == want).await;
    let delivered = sink.len() as f64;
    let lists_before = sum(&before, "kubesink_lists_total", &[]).unwrap_or(0.0);
    let after = scrape_until(addr, "the relist and the churn in the metrics", |s| {
        sum(s, "kubesink_watch_gone_total", &[]).is_some_and(|v| v >= 1.0)
            && sum(s, "kubesink_sink_delivered_messages_total", &[]).is_some_and(|v| v >= delivered)
            // The relist's stream may meet the second 410 and stream again after a backoff.
            && sum(s, "kubesink_lists_total", &[]).is_some_and(|v| v > lists_before)
    })
    .await;
    // A labelled counter not yet incremented before the churn is absent from `before`.
    let moved = |name: &str, with: &[(&str, &str)]| {
        value(&after, name, with) > sum(&before, name, with).unwrap_or(0.0)
    };
    assert!(moved(
        "kubesink_watch_events_total",
        &[("type", "modified")]
    ));
    assert!(moved("kubesink_messages_total", &[("op", "updated")]));
    assert!(moved("kubesink_messages_total", &[("op", "deleted")]));
    assert!(moved("kubesink_sink_delivered_messages_total", &[]));
    assert!(moved("kubesink_watch_gone_total", &[]));
    assert!(moved("kubesink_lists_total", &[]));
    let age = value(&after, "kubesink_watch_last_event_age_seconds", &pod);
    assert!((0.0..30.0).contains(&age), "last event age {age}");
    bridge.shutdown().await;
}

/// Waits until `/readyz` answers 200.
async fn ready(addr: SocketAddr, what: &str) {
    wait_until(what, LONG, || async {
        match http_get(addr, "/readyz").await {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_sync_and_sinks_while_liveness_survives_a_sink_outage() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 50,
            seed: 5,
            ..Default::default()
        })
        .unwrap();
    // The first list is held back by a slow API server: not ready until it is done. 5 s: the
    // readiness probe below must come before the list ends, even on a loaded machine.
    c.sim.faults().set_delay(Duration::from_secs(5));
    let cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    let sink = CaptureSink::new();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    let bridge = Bridge::start(&plan(&cfg), client, sinks).await.unwrap();
    let addr = bridge.server_addr().expect("server enabled");
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("initial sync"), "{body}");
    let (code, _) = http_get(addr, "/healthz").await;
    assert_eq!(code, 200);
    c.sim.faults().set_delay(Duration::ZERO);

    wait_for("synced", LONG, || sink.len() >= 50).await;
    ready(addr, "ready after the initial sync").await;

    // The sink goes down: not ready, naming it; alive all the same.
    sink.down.store(true, Ordering::SeqCst);
    c.sim.churn_steps(20, 4).unwrap();
    let body = wait_until("not ready while the sink is down", LONG, || async {
        match http_get(addr, "/readyz").await {
            (503, body) => Ok(body),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(v["status"], "failing", "{v}");
    assert!(v["problems"].to_string().contains("sink capture"), "{v}");
    assert_eq!(v["sinks"][0]["ready"], false);
    let (code, live) = http_get(addr, "/healthz").await;
    assert_eq!(code, 200, "a sink outage does not fail liveness: {live}");

    // Back: ready again, and the changes made meanwhile arrive.
    sink.down.store(false, Ordering::SeqCst);
    let want = sim_state(&c.sim, &[("v1", "Pod")]);
    wait_for("delivered after the outage", LONG, || {
        fold(&sink.messages()) == want
    })
    .await;
    ready(addr, "ready again once the sink is back").await;
    bridge.shutdown().await;
}
