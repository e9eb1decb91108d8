//! A property of sink filters, on the simulator: whatever the churn and however
//! often kubesink is stopped and started again from its saved state, with or without
//! coalescing and sync markers, each sink's fold (every
//! message it got, across the runs, in order) equals the cluster filtered by that sink's
//! expression, uid and resourceVersion (`Expect::STRICT` but for the re-sends a restart
//! allows). The churn (`Simulator::churn_steps`, seeded) changes Pods' images, which the
//! filters read, so objects leave and enter each route while kubesink runs and while it is
//! down; the oracle's predicates are written in Rust apart from the CEL.
//!
//! A case costs a few seconds (a simulator and up to four runs): CI runs 6 cases;
//! `PROPTEST_CASES=64 cargo test --test routes_model` runs more.

use kubesink_test_support as support;

use std::sync::Arc;
use std::time::Duration;

use kubesink::config::{ResourceConfig, StateBackend};
use kubesink::sinks::SinkConfig;
use kubesink_sim::{SimConfig, Workload};
use proptest::prelude::*;
use serde_json::Value;
use support::{
    cluster, config, fold_equals, sim_uid_state, wait_until, CaptureSink, Expect, UidFold,
};

const LONG: Duration = Duration::from_secs(120);

/// The routes: a name, its CEL filter (`None`: everything) and the same written in Rust, on
/// the last character of the first container's image (`…:v1.12.N`).
type Route = (&'static str, Option<&'static str>, fn(char) -> bool);

const ROUTES: &[Route] = &[
    (
        "even",
        Some(
            r#"object.spec.containers[0].image.endsWith("0") || object.spec.containers[0].image.endsWith("2") || object.spec.containers[0].image.endsWith("4") || object.spec.containers[0].image.endsWith("6") || object.spec.containers[0].image.endsWith("8")"#,
        ),
        |c| "02468".contains(c),
    ),
    (
        "low",
        Some(
            r#"object.spec.containers.exists(c, c.image.endsWith("1") || c.image.endsWith("2") || c.image.endsWith("3"))"#,
        ),
        |c| "123".contains(c),
    ),
    ("all", None, |_| true),
];

/// The simulator's Pods that `keeps` keeps, as a fold holds them.
fn wanted(sim: &kubesink_sim::Simulator, keeps: fn(char) -> bool) -> UidFold {
    sim_uid_state(sim, "v1", "Pod", |o| {
        o["spec"]["containers"][0]["image"]
            .as_str()
            .and_then(|i| i.chars().last())
            .is_some_and(keeps)
    })
}

/// What a route got that it did not need: a `deleted` of an object it did not hold (that
/// uid), or an `added` of one it held at that very resourceVersion (a re-send). Runs stop
/// cleanly here (their state saved), so without coalescing neither may happen.
fn needless(msgs: &[Value]) -> Option<String> {
    let mut held = std::collections::BTreeMap::new();
    for m in msgs {
        let key = (m["namespace"].to_string(), m["name"].to_string());
        let uid = m["uid"].to_string();
        let rv = m["object"]["metadata"]["resourceVersion"].to_string();
        match m["op"].as_str() {
            Some("deleted") if held.remove(&key).is_none_or(|(u, _)| u != uid) => {
                return Some(format!(
                    "a deleted (reason {}) of {key:?} {uid}, which it did not hold",
                    m["reason"]
                ));
            }
            Some("added") if held.get(&key) == Some(&(uid.clone(), rv.clone())) => {
                return Some(format!("{key:?} {uid} re-sent unchanged at {rv}"));
            }
            Some("added") => {
                held.insert(key, (uid, rv));
            }
            Some("updated") => {
                held.insert(key, (uid, rv));
            }
            _ => {}
        }
    }
    None
}

async fn case(seed: u64, rounds: usize, steps: usize, coalesce: bool, markers: bool, shared: bool) {
    // Without the sink that has no filter, every sink has a view of its own and the first
    // one counts into the watch's counters too (otherwise its sink's counters would stay
    // 0).
    let routes: Vec<Route> = ROUTES
        .iter()
        .filter(|r| shared || r.1.is_some())
        .copied()
        .collect();
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 40,
            seed,
            ..Default::default()
        })
        .expect("populate");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    cfg.pipeline.coalesce = coalesce;
    // Each view sends its own sync markers (barriers in its sinks' queues; not folded).
    cfg.pipeline.sync_markers = markers;
    cfg.state.backend = StateBackend::File;
    cfg.state.path = Some(dir.path().join("state"));
    cfg.sinks = routes
        .iter()
        .map(|(name, filter, _)| {
            SinkConfig::Stdout(kubesink_stdout::StdoutConfig {
                name: (*name).to_owned(),
                filter: filter.map(str::to_owned),
                ..Default::default()
            })
        })
        .collect();
    let mut got: Vec<Vec<Value>> = vec![Vec::new(); routes.len()];
    for round in 0..rounds {
        let sinks: Vec<Arc<CaptureSink>> = routes
            .iter()
            .map(|(name, _, _)| CaptureSink::named(name))
            .collect();
        let dyn_sinks = sinks
            .iter()
            .map(|s| s.clone() as Arc<dyn kubesink_core::Sink>)
            .collect();
        let bridge = support::start_bridge_with(&cfg, dyn_sinks).await;
        // Churn while it runs, then wait for every route to hold the cluster's objects.
        c.sim
            .churn_steps(steps, seed ^ (round as u64 + 1))
            .expect("churn");
        wait_until(
            "every route to equal the filtered cluster",
            LONG,
            || async {
                for (i, (name, _, keeps)) in routes.iter().enumerate() {
                    let msgs: Vec<Value> =
                        got[i].iter().cloned().chain(sinks[i].messages()).collect();
                    fold_equals(
                        &wanted(&c.sim, *keeps),
                        &msgs,
                        Expect::STRICT.restarts(),
                        |_| true,
                    )
                    .map_err(|d| format!("round {round}, route {name}: {d}"))?;
                }
                Ok::<(), String>(())
            },
        )
        .await;
        // Per sink: what its filter kept out, what left it.
        let addr = bridge.server_addr().expect("server");
        let (_, metrics) = support::http_get(addr, "/metrics").await;
        let count =
            |name: &str, sink: &str| support::metric_value(&metrics, name, &[("sink", sink)]);
        let left: f64 = routes
            .iter()
            .map(|r| count("kubesink_sink_left_filter_deletes_total", r.0))
            .sum();
        let sent_left = routes
            .iter()
            .enumerate()
            .map(|(i, _)| {
                sinks[i]
                    .messages()
                    .iter()
                    .filter(|m| m["reason"] == "leftFilter")
                    .count()
            })
            .sum::<usize>();
        assert!(
            left >= sent_left as f64,
            "{left} counted, {sent_left} received\n{metrics}"
        );
        // A Pod a route's filter does not match now was evaluated in this run (its list at
        // least), and counted for that route.
        let pods = c.sim.objects("v1", "Pod").len();
        for (name, filter, keeps) in &routes {
            if filter.is_some() && wanted(&c.sim, *keeps).len() < pods {
                assert!(
                    count("kubesink_sink_filtered_out_total", name) > 0.0,
                    "route {name}\n{metrics}"
                );
            }
        }
        if shared {
            assert_eq!(
                support::metric_value(
                    &metrics,
                    "kubesink_sink_filtered_out_total",
                    &[("sink", "all")]
                ),
                0.0,
                "{metrics}"
            );
        }
        // The watch's counters are the resource's: it has no filter here.
        assert_eq!(
            support::metric_value(&metrics, "kubesink_filtered_out_objects_total", &[]),
            0.0,
            "{metrics}"
        );
        assert_eq!(bridge.shutdown().await, 0, "a clean stop saves the state");
        for (i, s) in sinks.iter().enumerate() {
            got[i].extend(s.messages());
        }
        // Churn while it is down: the next run's relist sends each route the difference.
        c.sim
            .churn_steps(steps, seed ^ (round as u64 + 101))
            .expect("churn");
    }
    // With coalescing a queue may replace an `added` by the `deleted` that follows it (the
    // `added` of a first list may be held from an earlier run, so the `deleted` must go): a
    // route may then get a `deleted` of an object it did not get. Without, it never may.
    for (i, (name, _, _)) in routes.iter().enumerate() {
        if let Some(what) = needless(&got[i]).filter(|_| !coalesce) {
            panic!("route {name}: {what}");
        }
    }
    // Each route got something to prove: objects entered it.
    for (i, (name, filter, _)) in routes.iter().enumerate() {
        if filter.is_some() {
            assert!(
                got[i].iter().any(|m| m["op"] == "added"),
                "route {name} never got an object"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(6),
        ..ProptestConfig::default()
    })]

    #[test]
    fn each_sinks_fold_equals_the_cluster_filtered_by_its_expression(
        seed in any::<u64>(),
        rounds in 2..4usize,
        steps in 10..120usize,
        coalesce in any::<bool>(),
        markers in any::<bool>(),
        shared in any::<bool>(),
    ) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(case(seed, rounds, steps, coalesce, markers, shared));
    }
}

/// A sink that gets a filter between two runs starts from the state all sinks shared: the
/// second run sends it a `deleted` (`leftFilter`) for each object the filter leaves out and
/// nothing else, and its fold equals the cluster filtered by the expression.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_given_a_filter_between_runs_gets_only_the_left_filter_deletes() {
    let (_, even, keeps) = ROUTES[0];
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 40,
            seed: 7,
            ..Default::default()
        })
        .expect("populate");
    // Images the filter leaves out and keeps, so the second run has both.
    c.sim.churn_steps(60, 7).expect("churn");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    cfg.state.backend = StateBackend::File;
    cfg.state.path = Some(dir.path().join("state"));
    let entry = |filter: Option<&str>| {
        SinkConfig::Stdout(kubesink_stdout::StdoutConfig {
            name: "x".to_owned(),
            filter: filter.map(str::to_owned),
            ..Default::default()
        })
    };
    let everything = wanted(&c.sim, |_| true);
    let mut all = Vec::new();
    for (run, filter) in [(1, None), (2, even)] {
        cfg.sinks = vec![entry(filter)];
        let sink = CaptureSink::named("x");
        let bridge = support::start_bridge(&cfg, sink.clone()).await;
        let want = if run == 1 {
            everything.clone()
        } else {
            wanted(&c.sim, keeps)
        };
        wait_until("the sink to equal the cluster", LONG, || async {
            let msgs: Vec<Value> = all.iter().cloned().chain(sink.messages()).collect();
            fold_equals(&want, &msgs, Expect::STRICT.restarts(), |_| true).map(|_| ())
        })
        .await;
        assert_eq!(bridge.shutdown().await, 0);
        if run == 2 {
            let sent = sink.messages();
            let left_out = everything.len() - want.len();
            assert!(left_out > 0, "the churn left every image even");
            assert_eq!(sent.len(), left_out, "{sent:#?}");
            assert!(
                sent.iter()
                    .all(|m| m["op"] == "deleted" && m["reason"] == "leftFilter"),
                "{sent:#?}"
            );
        }
        all.extend(sink.messages());
    }
}
