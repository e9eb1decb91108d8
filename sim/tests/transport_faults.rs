//! Transport faults and request counters over real TCP and with kube-rs: dribbled bodies, an
//! unreachable server that cuts every connection and comes back on the same port, and the
//! per-resource and per-path list/watch counts.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kubesink_sim::SimConfig;
use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(10);

/// Sends a GET over HTTP/1.0 and returns (body bytes, sizes of the reads, elapsed time).
async fn timed_get(addr: std::net::SocketAddr, path: &str) -> (Vec<u8>, Vec<usize>, Duration) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: sim\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (mut all, mut reads, mut buf) = (Vec::new(), Vec::new(), [0u8; 4096]);
    loop {
        let n = tokio::time::timeout(T, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        reads.push(n);
        all.extend_from_slice(&buf[..n]);
    }
    let at = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    (all.split_off(at), reads, started.elapsed())
}

#[tokio::test]
async fn dribble_writes_bodies_in_small_chunks_with_pauses() {
    let (sim, addr) = start(SimConfig::default()).await;
    for i in 0..3 {
        sim.create(configmap(
            "default",
            &format!("c{i}"),
            json!({"app": "web"}),
        ))
        .unwrap();
    }
    let (fast_body, _, _) = timed_get(addr, "/api/v1/configmaps").await;
    sim.faults().dribble(64, Duration::from_millis(20));
    let (body, reads, elapsed) = timed_get(addr, "/api/v1/configmaps").await;
    assert_eq!(body, fast_body, "same bytes, only slower");
    let chunks = body.len().div_ceil(64) as u32;
    assert!(
        elapsed >= Duration::from_millis(20) * (chunks - 1),
        "{} bytes in {chunks} chunks took {elapsed:?}",
        body.len()
    );
    assert!(
        reads.len() >= chunks as usize / 2,
        "arrived in pieces: {reads:?}"
    );

    // A watch event is split across reads too.
    let mut w = watch(addr, "/api/v1/configmaps?watch=true", None).await;
    let started = Instant::now();
    let line = w.next_line(T).await.unwrap();
    assert!(line.len() > 128);
    assert!(started.elapsed() >= Duration::from_millis(20) * (line.len() / 64 - 1) as u32);

    let off = request(addr, "POST", "/_sim/dribble?bytes=0", None, None).await;
    assert_eq!(off.status, 200);
    let (_, _, quick) = timed_get(addr, "/api/v1/configmaps").await;
    assert!(
        quick < Duration::from_millis(20) * (chunks - 1),
        "{quick:?}"
    );
}

#[tokio::test]
async fn an_unreachable_server_cuts_watches_refuses_service_and_resumes_on_the_same_port() {
    let (sim, addr) = start(SimConfig::default()).await;
    let mut w = watch(addr, "/api/v1/configmaps?watch=true", None).await;
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    let pods: Api<Pod> = Api::all(kube_client(&sim).await);
    pods.list(&ListParams::default()).await.unwrap();

    sim.faults().set_unreachable(true);
    assert!(w.ends_within(T).await, "the open watch is cut");
    wait_for("watch dropped", T, || sim.open_watches() == 0).await;
    let refused = try_request(addr, "GET", "/api/v1/pods", None).await;
    assert!(
        refused.as_ref().map_or(true, |r| r.status == 0),
        "no HTTP answer while unreachable: {refused:?}"
    );
    assert!(pods.list(&ListParams::default()).await.is_err());
    let stats = get(addr, "/_sim/stats").await.json();
    assert_eq!(
        stats["unreachable"], true,
        "admin requests still get through"
    );

    sim.faults().set_unreachable(false);
    assert_eq!(get(addr, "/api/v1/pods").await.status, 200);
    let deadline = Instant::now() + T;
    while pods.list(&ListParams::default()).await.is_err() {
        assert!(Instant::now() < deadline, "kube-rs reconnects");
    }

    // Over the admin endpoint, with an automatic end.
    let cut = request(
        addr,
        "POST",
        "/_sim/unreachable?on=true&for_ms=300",
        None,
        None,
    )
    .await;
    assert_eq!(cut.status, 200);
    assert!(sim.faults().is_unreachable());
    wait_for("service resumes", T, || !sim.faults().is_unreachable()).await;
    assert_eq!(get(addr, "/api/v1/pods").await.status, 200);
}

#[tokio::test]
async fn a_kube_watcher_recovers_after_the_network_comes_back() {
    let (sim, _addr) = start(SimConfig::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube_client(&sim).await, "default");
    let mut items =
        spawn_watcher(watcher::watcher(cms, watcher::Config::default()).default_backoff());
    while !matches!(next_item(&mut items, T).await, Ok(Event::InitDone)) {}
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    sim.faults().set_unreachable(true);
    assert!(
        next_item(&mut items, T).await.is_err(),
        "the cut watch surfaces as an error"
    );
    sim.create(configmap("default", "while-cut", json!({})))
        .unwrap();
    sim.faults().set_unreachable(false);
    loop {
        match next_item(&mut items, T).await {
            Ok(Event::Apply(c) | Event::InitApply(c))
                if c.metadata.name.as_deref() == Some("while-cut") =>
            {
                break
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn list_and_watch_requests_are_counted_per_resource_and_path_even_when_rejected() {
    let (sim, addr) = start(SimConfig::default()).await;
    let pods: Api<Pod> = Api::namespaced(kube_client(&sim).await, "x");
    let mut items = spawn_watcher(watcher::watcher(pods, watcher::Config::default()));
    while !matches!(next_item(&mut items, T).await, Ok(Event::InitDone)) {}
    wait_for("watch requested", T, || {
        sim.request_counts().resource("", "pods").watches == 1
    })
    .await;
    let counts = sim.request_counts();
    assert_eq!(counts.resource("", "pods").lists, 1);
    assert_eq!(counts.path("/api/v1/namespaces/x/pods").watches, 1);
    assert_eq!(counts.path("/api/v1/pods").lists, 0);

    sim.faults().set_status("/apis/apps", 429, Some(5)).unwrap();
    for _ in 0..3 {
        assert_eq!(
            get(addr, "/apis/apps/v1/deployments?watch=true")
                .await
                .status,
            429
        );
    }
    get(addr, "/apis/apps/v1/namespaces/y/deployments").await;
    let stats = get(addr, "/_sim/stats").await.json();
    assert_eq!(
        stats["requestCounts"]["byResource"]["deployments.apps"],
        json!({"lists": 1, "watches": 3})
    );
    assert_eq!(
        stats["requestCounts"]["byPath"]["/apis/apps/v1/deployments"],
        json!({"lists": 0, "watches": 3})
    );
    assert_eq!(stats["requestCounts"]["byResource"]["pods"]["lists"], 1);

    request(addr, "POST", "/_sim/reset-stats", None, None).await;
    assert_eq!(
        sim.request_counts().resource("apps", "deployments").watches,
        0
    );
}

#[tokio::test]
async fn the_simulators_own_churn_is_the_one_the_admin_endpoint_stops() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.populate(&kubesink_sim::Workload {
        pods: 20,
        seed: 4,
        ..Default::default()
    })
    .unwrap();
    // As `kubesink-sim --churn 200` starts it.
    sim.set_churn(kubesink_sim::Churn {
        rate_per_sec: 200.0,
        seed: 4,
    });
    let applied = || async { get(addr, "/_sim/stats").await.json()["churnApplied"].clone() };
    let deadline = Instant::now() + T;
    while applied().await.as_u64().unwrap_or(0) < 5 {
        assert!(Instant::now() < deadline, "the churn runs and is counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped = request(addr, "POST", "/_sim/churn?rate=0", None, None).await;
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    let rv = sim.resource_version();
    // A negative check needs a window: at 200 changes/s a running churn would write ~40
    // times in it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        sim.resource_version(),
        rv,
        "rate=0 stopped the simulator's churn"
    );
}
