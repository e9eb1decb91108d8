//! Many clusters in one process (`[[clusters]]`) and the process-wide budget of lists in
//! flight (`watch.max_concurrent_lists`): the budget is never exceeded, whichever list shape,
//! every cluster syncs, and a list that fails gives its slot back.
//!
//! The clusters are one simulator under several names (each `[[clusters]]` entry its own
//! client and informers), so the simulator sees every list of the process and counts the
//! streaming lists in flight at once (`Simulator::streaming_lists_peak`); holding their end
//! bookmarks back (`Faults::hold_initial_events_end`) keeps the lists in flight as long as
//! the test looks, so "two at once, four waiting" is observed, not hoped for.

use kubesink_test_support::{self as support, proxy};

use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::{ClusterEntry, Config, InitialList, ResourceConfig};
use kubesink_core::Sink;
use kubesink_sim::{BreakKind, SimConfig, Workload};
use support::*;

const LONG: Duration = Duration::from_secs(60);
const PODS: usize = 12;

/// `n` clusters named `fleet-0` … on the simulator of `c`, watching its pods, with a budget
/// of `max` lists at once.
async fn fleet(
    c: &Cluster,
    n: usize,
    max: usize,
    initial_list: InitialList,
) -> (Bridge, Arc<CaptureSink>) {
    let mut cfg: Config = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    cfg.cluster.name = String::new();
    cfg.cluster.kubeconfig = None;
    cfg.watch.max_concurrent_lists = max;
    cfg.watch.initial_list = initial_list;
    cfg.clusters = (0..n)
        .map(|i| ClusterEntry {
            name: format!("fleet-{i}"),
            kubeconfig: Some(c.kubeconfig.clone()),
            context: None,
            resources: None,
            shards: 1,
        })
        .collect();
    let mut clients = Vec::new();
    for spec in cfg.clusters() {
        clients.push(kubesink::cluster::client(&spec).await.expect("client"));
    }
    let sink = CaptureSink::new();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let bridge = Bridge::start_with(&plan(&cfg), clients, sinks, None)
        .await
        .expect("bridge starts");
    (bridge, sink)
}

/// The simulator never had more than the budget of two streaming lists in flight, but for
/// lists kubesink gave up on: a held list silent for `INITIAL_EVENTS_SILENCE` (15 s, reached
/// on a busy machine) is abandoned and retried in its slot, and the server sees the closed
/// connection a moment after the retry arrives. Every list over the budget must be such a
/// cut one; with none cut, the peak is the budget.
fn assert_within_budget(c: &Cluster, when: &str) {
    let (peak, cut) = (c.sim.streaming_lists_peak(), c.sim.streaming_lists_cut());
    assert!(
        peak >= 2 && peak <= 2 + cut,
        "{when}: the simulator saw a peak of {peak} streaming lists, {cut} of them cut"
    );
}

async fn populated() -> Cluster {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: PODS,
            seed: 3,
            ..Default::default()
        })
        .expect("populate");
    c
}

/// A process-wide gauge or counter of the list budget (no labels).
fn lists_metric(bridge: &Bridge, name: &str) -> f64 {
    metric_value(&bridge.observed().metrics().0, name, &[])
}

fn all_synced(bridge: &Bridge) -> bool {
    bridge
        .informer_stats()
        .iter()
        .all(|(_, s)| s.synced.load(std::sync::atomic::Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_clusters_with_a_budget_of_two_stream_two_lists_at_a_time_and_all_sync() {
    let c = populated().await;
    c.sim.faults().hold_initial_events_end(true);
    let (bridge, sink) = fleet(&c, 6, 2, InitialList::Stream).await;
    // Three rounds: two lists in flight (held before their end bookmark), the rest waiting
    // for a slot; releasing the two lets the next two in, never a third.
    for round in 0..3usize {
        let waiting = (4 - 2 * round) as f64;
        wait_for_seen(
            &format!("round {round}: two streaming lists in flight, {waiting} waiting"),
            LONG,
            || {
                let (sim, ours) = (
                    c.sim.streaming_lists_in_flight(),
                    lists_metric(&bridge, "kubesink_watch_lists_waiting"),
                );
                let synced = bridge
                    .informer_stats()
                    .iter()
                    .filter(|(_, s)| s.synced.load(std::sync::atomic::Ordering::SeqCst))
                    .count();
                let in_flight = lists_metric(&bridge, "kubesink_watch_lists_in_flight");
                (
                    sim == 2 && ours == waiting && in_flight == 2.0,
                    format!("simulator: {sim} in flight; kubesink: {ours} waiting, {in_flight} in flight, {synced} synced; peak {}", c.sim.streaming_lists_peak()),
                )
            },
        )
        .await;
        assert_within_budget(&c, &format!("round {round}"));
        // Release the held end bookmarks and hold the next lists' (one step: with two calls
        // a list coming in between got through unheld on a busy machine).
        c.sim.faults().release_held_initial_events_end();
    }
    c.sim.faults().hold_initial_events_end(false);
    wait_for("every cluster synced and delivered", LONG, || {
        all_synced(&bridge) && sink.len() >= 6 * PODS
    })
    .await;
    let msgs = sink.messages();
    for i in 0..6 {
        let name = format!("fleet-{i}");
        let mine: Vec<_> = msgs
            .iter()
            .filter(|m| m["cluster"] == name.as_str())
            .cloned()
            .collect();
        assert_eq!(fold(&mine), sim_state(&c.sim, &[("v1", "Pod")]), "{name}");
    }
    assert_within_budget(&c, "never more than the budget");
    assert_eq!(
        lists_metric(&bridge, "kubesink_watch_lists_in_flight_peak"),
        2.0
    );
    assert_eq!(lists_metric(&bridge, "kubesink_watch_lists_in_flight"), 0.0);
    assert_eq!(lists_metric(&bridge, "kubesink_watch_lists_waiting"), 0.0);
    // Four lists waited for a slot; a cut list's retry may wait again.
    let waits = lists_metric(&bridge, "kubesink_watch_list_slot_waits_total");
    if c.sim.streaming_lists_cut() == 0 {
        assert_eq!(waits, 4.0);
    } else {
        assert!(waits >= 4.0, "{waits} slot waits");
    }
    assert_eq!(
        lists_metric(&bridge, "kubesink_watch_max_concurrent_lists"),
        2.0
    );
    // The watches after the lists hold no slot: all six stay open.
    assert!(c.sim.open_watches() >= 6, "{}", c.sim.open_watches());
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_lists_of_six_clusters_stay_within_the_budget_and_all_sync() {
    let c = populated().await;
    // Slow pages of one pod: each list takes a while, so the six overlap without a budget.
    c.sim.faults().set_delay(Duration::from_millis(20));
    let (bridge, sink) = fleet(&c, 6, 2, InitialList::List).await;
    wait_for("every cluster synced and delivered", LONG, || {
        all_synced(&bridge) && sink.len() >= 6 * PODS
    })
    .await;
    let peak = lists_metric(&bridge, "kubesink_watch_lists_in_flight_peak");
    assert!((1.0..=2.0).contains(&peak), "peak {peak}");
    assert_eq!(lists_metric(&bridge, "kubesink_watch_lists_in_flight"), 0.0);
    assert_eq!(c.sim.streaming_lists_peak(), 0, "paged lists only");
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_fails_gives_its_slot_back_so_a_budget_of_one_still_syncs_everyone() {
    let c = populated().await;
    // 1.32: `auto` streams JSON lists there, and the faults below are in streaming lists.
    c.sim.set_server_version(1, 32);
    // The first three streaming lists end with a 410 ERROR event after a few initial
    // events, the next ones are cut: each failed list must release its only slot.
    c.sim
        .faults()
        .break_initial_events(3, 4, BreakKind::Gone, None);
    let (bridge, sink) = fleet(&c, 3, 1, InitialList::Auto).await;
    wait_for("three 410s", LONG, || {
        c.sim.request_counts().resource("", "pods").watches >= 3
    })
    .await;
    c.sim
        .faults()
        .break_initial_events(1, 2, BreakKind::Cut, None);
    wait_for("every cluster synced and delivered", LONG, || {
        all_synced(&bridge) && sink.len() >= 3 * PODS
    })
    .await;
    assert_eq!(c.sim.streaming_lists_peak(), 1);
    assert_eq!(
        lists_metric(&bridge, "kubesink_watch_lists_in_flight_peak"),
        1.0
    );
    assert_eq!(lists_metric(&bridge, "kubesink_watch_lists_in_flight"), 0.0);
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_while_lists_wait_for_a_slot_ends_at_once() {
    let c = populated().await;
    c.sim.faults().hold_initial_events_end(true);
    let (bridge, _sink) = fleet(&c, 4, 1, InitialList::Stream).await;
    wait_for_seen("one list in flight, three waiting", LONG, || {
        let waiting = lists_metric(&bridge, "kubesink_watch_lists_waiting");
        (
            c.sim.streaming_lists_in_flight() == 1 && waiting == 3.0,
            format!("{waiting} waiting"),
        )
    })
    .await;
    let observed = bridge.observed().clone();
    tokio::time::timeout(LONG, bridge.shutdown())
        .await
        .expect("the shutdown does not wait for list slots");
    let metrics = observed.metrics().0;
    assert_eq!(
        metric_value(&metrics, "kubesink_watch_lists_waiting", &[]),
        0.0
    );
    assert_eq!(
        metric_value(&metrics, "kubesink_watch_lists_in_flight", &[]),
        0.0,
        "the held list's slot was given back when its informer was cancelled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_kubeconfig_is_missing_does_not_stop_the_fleet_and_is_retried() {
    let c = populated().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("fleet-1.kubeconfig");
    let mut cfg: Config = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    cfg.cluster.name = String::new();
    cfg.cluster.kubeconfig = None;
    cfg.watch.retry_initial_backoff = kubesink::config::HumanDuration(Duration::from_millis(50));
    cfg.watch.retry_max_backoff = kubesink::config::HumanDuration(Duration::from_millis(200));
    cfg.clusters = (0..3)
        .map(|i| ClusterEntry {
            name: format!("fleet-{i}"),
            kubeconfig: Some(if i == 1 {
                missing.clone()
            } else {
                c.kubeconfig.clone()
            }),
            context: None,
            resources: None,
            shards: 1,
        })
        .collect();
    let clients = kubesink::cluster::clients(&cfg.clusters()).await;
    let error = clients[1]
        .as_ref()
        .err()
        .expect("fleet-1 has no client")
        .to_string();
    assert!(
        error.starts_with("clusters.1.kubeconfig "),
        "the error names the entry's key: {error}"
    );
    let sink = CaptureSink::new();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let bridge = Bridge::start_built(&plan(&cfg), clients, sinks, None)
        .await
        .expect("the bridge starts with one cluster's client missing");
    let addr = bridge.server_addr().expect("server");
    let of = |name: &str| {
        sink.messages()
            .into_iter()
            .filter(|m| m["cluster"] == name)
            .collect::<Vec<_>>()
    };
    wait_for("fleet-0 and fleet-2 delivered", LONG, || {
        of("fleet-0").len() >= PODS && of("fleet-2").len() >= PODS
    })
    .await;
    let want = sim_state(&c.sim, &[("v1", "Pod")]);
    assert_eq!(fold(&of("fleet-0")), want);
    assert_eq!(fold(&of("fleet-2")), want);
    assert!(of("fleet-1").is_empty());
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("json");
    let problems = ready["problems"].to_string();
    assert!(
        problems.contains("fleet-1 v1 Pod (all)") && problems.contains("clusters.1.kubeconfig"),
        "/readyz names the cluster and its key: {problems}"
    );
    assert!(
        !problems.contains("fleet-0") && !problems.contains("fleet-2"),
        "{problems}"
    );
    let (live, body) = http_get(addr, "/healthz").await;
    assert_eq!(live, 200, "a restart would not cure it: {body}");
    // The kubeconfig appears (a Secret mounted late): the client is built again, the
    // cluster syncs and the process becomes ready.
    std::fs::copy(&c.kubeconfig, &missing).expect("copy kubeconfig");
    wait_for(
        "fleet-1 delivered after its kubeconfig appeared",
        LONG,
        || of("fleet-1").len() >= PODS && all_synced(&bridge),
    )
    .await;
    assert_eq!(fold(&of("fleet-1")), want);
    wait_until("/readyz 200", LONG, || async {
        let (code, body) = http_get(addr, "/readyz").await;
        if code == 200 {
            Ok(())
        } else {
            Err(body)
        }
    })
    .await;
    bridge.shutdown().await;
}

/// A fleet whose leader-election Lease lives on a cluster that cannot be reached emits
/// nothing (no replica can lead): the replica must not call itself ready. `/readyz` names the
/// Lease's problem and `kubesink_lease_failing` is 1 until the Lease's cluster answers; then
/// it leads and both clusters are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_whose_lease_cluster_is_unreachable_is_not_ready_until_it_answers() {
    let c = populated().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let sim_addr: std::net::SocketAddr = c
        .sim
        .url()
        .expect("started")
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let mut proxy = proxy::Proxy::start(sim_addr).await;
    proxy.stop();
    let behind_proxy = dir.path().join("lease-cluster.kubeconfig");
    let text = std::fs::read_to_string(&c.kubeconfig)
        .expect("kubeconfig")
        .replace(&sim_addr.to_string(), &proxy.addr.to_string());
    std::fs::write(&behind_proxy, text).expect("write kubeconfig");
    let mut cfg: Config = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    cfg.cluster.name = String::new();
    cfg.cluster.kubeconfig = None;
    cfg.clusters = ["lease-home", "other"]
        .iter()
        .map(|name| ClusterEntry {
            name: (*name).to_owned(),
            kubeconfig: Some(if *name == "lease-home" {
                behind_proxy.clone()
            } else {
                c.kubeconfig.clone()
            }),
            context: None,
            resources: None,
            shards: 1,
        })
        .collect();
    let le = &mut cfg.leader_election;
    le.enabled = true;
    le.cluster = Some("lease-home".into());
    le.lease_namespace = Some("default".into());
    le.lease_duration = kubesink::config::HumanDuration(Duration::from_secs(3));
    le.renew_deadline = kubesink::config::HumanDuration(Duration::from_secs(2));
    le.retry_period = kubesink::config::HumanDuration(Duration::from_millis(200));
    let mut clients = Vec::new();
    for spec in cfg.clusters() {
        clients.push(kubesink::cluster::client(&spec).await.expect("client"));
    }
    let elector = kubesink::leader::Elector::new(clients[0].clone(), &cfg.leader_election);
    let sink = CaptureSink::new();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let bridge = Bridge::start_with(&plan(&cfg), clients, sinks, Some(elector))
        .await
        .expect("bridge starts");
    let addr = bridge.server_addr().expect("server");
    let problems = wait_until("/readyz 503 naming the Lease", LONG, || async {
        let (code, body) = http_get(addr, "/readyz").await;
        match code {
            503 if body.contains("leader election: the Lease cannot be read or written") => {
                Ok(body)
            }
            _ => Err(format!("{code}: {body}")),
        }
    })
    .await;
    assert!(problems.contains("\"role\":\"follower\""), "{problems}");
    assert_eq!(lease_failing(&bridge), 1.0);
    assert!(
        sink.messages().is_empty(),
        "no replica leads, nothing is sent"
    );
    // The Lease's cluster answers again: this replica leads, both clusters are delivered,
    // and it is ready.
    proxy.resume().await;
    wait_for("both clusters delivered once leading", LONG, || {
        let msgs = sink.messages();
        ["lease-home", "other"]
            .iter()
            .all(|name| msgs.iter().filter(|m| m["cluster"] == *name).count() >= PODS)
    })
    .await;
    wait_until("/readyz 200", LONG, || async {
        let (code, body) = http_get(addr, "/readyz").await;
        if code == 200 {
            Ok(())
        } else {
            Err(body)
        }
    })
    .await;
    assert_eq!(lease_failing(&bridge), 0.0);
    bridge.shutdown().await;
}

fn lease_failing(bridge: &Bridge) -> f64 {
    metric_value(
        &bridge.observed().metrics().0,
        "kubesink_lease_failing",
        &[],
    )
}
