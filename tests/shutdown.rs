//! The shutdown's one deadline and what a sink worker that panicked does, against the
//! simulator over HTTP: a state store that hangs (a SIGSTOPped nats-server) cannot hold the
//! real binary past `pipeline.shutdown_timeout`, and what did not fit is named and makes the
//! exit code non-zero; a worker that panicked fails `/readyz` and `/healthz` at once, and
//! its changes count as undelivered at shutdown.

use kubesink_test_support::{self as support, process};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubesink::config::ResourceConfig;
use kubesink_core::{Message, Sink, SinkError};
use kubesink_sim::{SimConfig, Workload};
use support::*;

const LONG: Duration = Duration::from_secs(60);

/// A sink whose `send` panics (a bug in a sink); its healthcheck passes.
#[derive(Default)]
struct PanicSink {
    sends: AtomicUsize,
}

#[async_trait]
impl Sink for PanicSink {
    fn name(&self) -> &str {
        "panics"
    }
    async fn send(&self, _batch: &[Message]) -> Result<(), SinkError> {
        self.sends.fetch_add(1, Ordering::SeqCst);
        panic!("injected: a sink's send panicked");
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
    async fn close(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Polls `path` until it answers `code` with a body containing `text`; panics with the last
/// answer after [`LONG`].
async fn until_health(addr: std::net::SocketAddr, path: &str, code: u16, text: &str) -> String {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let (got, body) = http_get(addr, path).await;
        if got == code && body.contains(text) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never answered {code} with {text:?}; last: {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_sink_worker_fails_health_and_its_changes_count_as_undelivered() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            configmaps: 5,
            seed: 7,
            ..Default::default()
        })
        .unwrap();
    let cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "ConfigMap")]);
    let sink = Arc::new(PanicSink::default());
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let bridge = kubesink::bridge::Bridge::start(&plan(&cfg), client, sinks)
        .await
        .unwrap();
    let addr = bridge.server_addr().expect("server enabled");
    wait_for("the first send", LONG, || {
        sink.sends.load(Ordering::SeqCst) >= 1
    })
    .await;

    let ready = until_health(addr, "/readyz", 503, "panicked").await;
    assert!(ready.contains("sink panics"), "{ready}");
    let live = until_health(addr, "/healthz", 503, "panicked").await;
    assert!(live.contains("sink panics"), "{live}");
    assert_eq!(
        sink.sends.load(Ordering::SeqCst),
        1,
        "nothing retried the batch: the worker is gone"
    );

    let report = bridge.shutdown_report().await;
    assert_eq!(report.panicked, ["panics"], "{report:?}");
    assert!(
        report.undelivered >= 5,
        "the 5 configmaps the panicked worker held are undelivered, not drained: {report:?}"
    );
    assert_eq!(
        report.exit_code(),
        kubesink::bridge::WORKER_PANICKED_EXIT,
        "{report:?}"
    );
}

/// A config file for cluster `shutdown` watching pods metadata-only, stdout sink, with the
/// informer state in the NATS server at `nats`.
#[cfg(feature = "nats")]
fn nats_state_config(
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    nats: &str,
) -> std::path::PathBuf {
    let rest = format!(
        "\n[pipeline]\nlinger = \"10ms\"\nshutdown_timeout = \"2s\"\n\n[state]\nbackend = \"nats\"\ninterval = \"1h\"\n[state.nats]\nservers = [{nats:?}]\ntimeout = \"120s\"\n\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\npayload = \"metadata\"\n\n{}",
        process::STDOUT_SINK
    );
    process::write_config(dir, "shutdown", kubeconfig, &rest)
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_state_store_cannot_hold_shutdown_past_its_deadline_and_what_was_abandoned_is_named(
) {
    let server = support::nats_server::NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            pods: 20,
            seed: 11,
            ..Default::default()
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = nats_state_config(dir.path(), &c.kubeconfig, &server.url());
    let mut k =
        process::Kubesink::start(env!("CARGO_BIN_EXE_kubesink"), &cfg, dir.path(), "a", &[]);
    let deadline = tokio::time::Instant::now() + LONG;
    while k.count() < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the initial list; stderr:\n{}",
            k.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The state store hangs: connected, answering nothing (each request waits its 120 s).
    server.pause();
    // shutdown_timeout (2 s) + 20 s: a liveness bound, not a speed claim.
    let exited = k.signal_and_wait("TERM", Duration::from_secs(22)).await;
    server.resume();
    let stderr = k.stderr();
    let code = exited.unwrap_or_else(|| {
        panic!("still running 22 s after SIGTERM with shutdown_timeout = 2s; stderr:\n{stderr}")
    });
    eprintln!("exited with {code:?}; stderr:\n{stderr}");
    assert_eq!(
        code,
        Some(5),
        "exit code: work abandoned at the deadline; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("abandoned") && stderr.contains("final save"),
        "names what it abandoned; stderr:\n{stderr}"
    );
}
