//! Broker outages as a new user meets them, against real parts: what the log says while a
//! NATS server is down (the real binary, its own log filter: one WARN per client at the
//! start, one INFO with the counts at the end, none of async-nats' per-second lines), a
//! killed Kafka broker (`/readyz` fails within seconds, the outage is one WARN and one INFO,
//! not an ERROR per reconnect), and a Kafka topic created after start (used within seconds,
//! not after the pipeline's 30 s backoff).
#![cfg(all(feature = "kafka", feature = "nats"))]

use kubesink_test_support::{self as support, kafka_server, logs, nats_server, process};

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_server::Tansu;
use kubesink::bridge::Bridge;
use kubesink::config::{Config, ResourceConfig, SinkConfig};
use kubesink_core::Sink;
use kubesink_kafka::KafkaConfig;
use kubesink_sim::SimConfig;
use nats_server::NatsServer;
use process::Kubesink;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(60);
/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(10);

fn create_configmaps(c: &Cluster, n: usize) {
    for i in 0..n {
        c.sim
            .create(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm-{i}"), "namespace": "default"}, "data": {"k": "v"}}))
            .expect("create");
    }
}

/// The number after `key=` on `line` (`failed_attempts=12`, `down_for=10.3s`).
fn field(line: &str, key: &str) -> Option<f64> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Lines of `log` containing every one of `needles`.
fn lines<'a>(log: &'a str, needles: &[&str]) -> Vec<&'a str> {
    log.lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_outage_is_one_warning_per_client_and_one_recovery_line_with_counts() {
    let mut server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    create_configmaps(&c, 5);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("kubesink.toml");
    let url = server.url();
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"outage\"\nkubeconfig = {:?}\n\n\
             [state]\nbackend = \"nats\"\n[state.nats]\nservers = [{url:?}]\n\n\
             [[resources]]\napi_version = \"v1\"\nkind = \"ConfigMap\"\n\n\
             [[sinks]]\ntype = \"nats\"\nname = \"nats\"\nservers = [{url:?}]\nmode = \"jetstream\"\n\
             [sinks.stream]\ncreate = true\n",
            c.kubeconfig.display().to_string()
        ),
    )
    .expect("write config");
    // As an operator runs it: the default filter (info), no RUST_LOG.
    let k = Kubesink::start(BIN, &config, dir.path(), "outage", &[]);
    let seen = |what: &'static str| {
        let log = k.stderr();
        (log.contains(what), format!("kubesink stderr:\n{log}"))
    };
    // Both clients connected: the sink's, and the state store's (the watches start once
    // the saved state was read).
    wait_for_seen("the sink ready", LONG, || seen("sink ready")).await;
    wait_for_seen("the state read", LONG, || seen("initial sync complete")).await;

    server.stop();
    let stopped = Instant::now();
    wait_for_seen("the outage noticed", LONG, || seen("NATS unreachable")).await;
    // The outage itself.
    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed())).await;
    server.restart();
    let restarted = Instant::now();
    wait_for_seen("both clients back", LONG, || {
        let log = k.stderr();
        let back = ["sink=nats", "sink=state"]
            .iter()
            .all(|s| !lines(&log, &["NATS reachable again", s]).is_empty());
        (back, format!("kubesink stderr:\n{log}"))
    })
    .await;
    let back_after = restarted.elapsed();
    // Readiness follows the reconnect (the sink's health signal wakes the probe), within one
    // probe interval (10 s) at the latest, however long the outage was.
    wait_for_seen("the sink ready again", Duration::from_secs(12), || {
        seen("sink ready again")
    })
    .await;
    let ready_after = restarted.elapsed();
    eprintln!("ready again {ready_after:?} after the restart");
    let log = k.stderr();
    let from = log.find("NATS unreachable").unwrap_or(0);
    let outage_log = &log[from..];
    let library_lines = lines(outage_log, &["async_nats"]).len();
    let warns = lines(outage_log, &[" WARN ", "NATS"]);
    eprintln!(
        "NATS outage of {OUTAGE:?}: {} WARN lines about NATS, {library_lines} async_nats lines, \
         back {back_after:?} after the restart; recovery lines:\n{}",
        warns.len(),
        lines(outage_log, &["NATS reachable again"]).join("\n")
    );
    assert_eq!(
        library_lines, 0,
        "async-nats' own lines are filtered:\n{log}"
    );
    for client in ["sink=nats", "sink=state"] {
        let started = lines(outage_log, &["NATS unreachable", client]);
        assert_eq!(
            started.len(),
            1,
            "one WARN at the start for {client}:\n{log}"
        );
        assert!(
            lines(outage_log, &["still unreachable", client]).is_empty(),
            "no summary within the first minute:\n{log}"
        );
        let ended = lines(outage_log, &["NATS reachable again", client]);
        assert_eq!(ended.len(), 1, "one INFO at the end for {client}:\n{log}");
        assert!(ended[0].contains(" INFO "), "{}", ended[0]);
        let attempts = field(ended[0], "failed_attempts").unwrap_or(0.0);
        let down_for = field(ended[0], "down_for").unwrap_or(0.0);
        assert!(
            attempts >= 5.0,
            "about one failed attempt a second is counted: {}",
            ended[0]
        );
        assert!(
            down_for >= OUTAGE.as_secs_f64() - 1.0,
            "the duration is the outage's: {}",
            ended[0]
        );
        assert!(
            ended[0].contains("Connection refused"),
            "the last error names the cause: {}",
            ended[0]
        );
    }
    assert!(
        warns.len() <= 3,
        "a WARN per client and the readiness probe's, not one a second:\n{}",
        warns.join("\n")
    );
    k.terminate().await;
}

/// A Kafka sink named `name` producing to `topic` at `bootstrap`, production defaults
/// otherwise (healthcheck timeout 10 s).
fn kafka(name: &str, bootstrap: &str, topic: &str) -> KafkaConfig {
    KafkaConfig {
        name: name.into(),
        bootstrap_servers: bootstrap.into(),
        topic: topic.into(),
        ..Default::default()
    }
}

/// The bridge config of these tests, with the production values of what they measure:
/// `server.sink_check_interval` (10 s) and `pipeline.retry_max_backoff` (30 s).
fn production_timing(c: &Cluster, sink: KafkaConfig) -> Config {
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "ConfigMap")]);
    cfg.cluster.name = logs::unique_cluster("outages");
    cfg.server.sink_check_interval = kubesink::config::ServerConfig::default().sink_check_interval;
    cfg.pipeline.retry_max_backoff = kubesink::config::PipelineConfig::default().retry_max_backoff;
    cfg.pipeline.retry_initial_backoff =
        kubesink::config::PipelineConfig::default().retry_initial_backoff;
    cfg.sinks = vec![SinkConfig::Kafka(sink)];
    cfg
}

async fn start(cfg: &Config) -> Bridge {
    let sink: Arc<dyn Sink> = cfg.sinks[0].build(0).await.expect("sink builds");
    start_bridge(cfg, sink).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_kafka_broker_fails_readiness_within_seconds_and_is_logged_as_one_outage() {
    let logs = logs::install();
    let mut broker = Tansu::start().await;
    let topic = "kubesink.killed";
    broker.create_topic(topic, 1).await;
    let c = cluster(SimConfig::default()).await;
    create_configmaps(&c, 5);
    let name = "kafka-killed";
    let cfg = production_timing(&c, kafka(name, &broker.bootstrap, topic));
    let bridge = start(&cfg).await;
    let h = &bridge.pipeline().sinks()[0];
    wait_for("delivered and ready", LONG, || {
        h.stats().delivered.load(Ordering::SeqCst) >= 5 && bridge.observed().readiness().ok
    })
    .await;
    let sink_field = format!("sink={name}");
    let before = logs.lines(&sink_field).len();

    broker.kill();
    let killed = Instant::now();
    // Before: the next healthcheck (every 10 s) waited healthcheck_timeout (10 s) for
    // metadata: 12-25 s. Now librdkafka's ALL_BROKERS_DOWN fails it at once.
    wait_for("/readyz fails", Duration::from_secs(10), || {
        !bridge.observed().readiness().ok
    })
    .await;
    let detected = killed.elapsed();
    let body = bridge.observed().readiness().body.to_string();
    tokio::time::sleep(OUTAGE.saturating_sub(killed.elapsed())).await;
    let during: Vec<String> = logs.lines(&sink_field)[before..].to_vec();
    broker.restart_empty().await;
    broker.create_topic(topic, 1).await;
    wait_for("ready again", LONG, || bridge.observed().readiness().ok).await;
    wait_for("the outage's end logged", LONG, || {
        logs.lines(&sink_field)
            .iter()
            .any(|l| l.contains("Kafka brokers reachable again"))
    })
    .await;
    let all = logs.lines(&sink_field)[before..].to_vec();
    let ended: Vec<&String> = all
        .iter()
        .filter(|l| l.contains("Kafka brokers reachable again"))
        .collect();
    let errors: Vec<&String> = during.iter().filter(|l| l.contains(" ERROR ")).collect();
    let warns: Vec<&String> = during.iter().filter(|l| l.contains(" WARN ")).collect();
    eprintln!(
        "Kafka broker killed: /readyz failed after {detected:?} ({body}); {} lines during the \
         {OUTAGE:?} outage ({} ERROR, {} WARN):\n{}\nend: {ended:?}",
        during.len(),
        errors.len(),
        warns.len(),
        during.join("\n")
    );
    assert!(
        body.contains("ALL_BROKERS_DOWN") || body.contains("Connection refused"),
        "/readyz names the cause: {body}"
    );
    assert!(errors.is_empty(), "no ERROR per reconnect: {errors:#?}");
    assert_eq!(
        during
            .iter()
            .filter(|l| l.contains("Kafka brokers unreachable"))
            .count(),
        1,
        "one WARN at the start: {during:#?}"
    );
    assert!(
        warns.len() <= 3,
        "the outage's WARN and the readiness probe's, not one a reconnect: {warns:#?}"
    );
    assert_eq!(ended.len(), 1, "one INFO at the end: {all:#?}");
    assert!(ended[0].contains(" INFO "), "{}", ended[0]);
    assert!(
        field(ended[0], "failed_attempts").unwrap_or(0.0) >= 5.0,
        "about a failed attempt a second is counted: {}",
        ended[0]
    );
    assert!(
        field(ended[0], "down_for").unwrap_or(0.0) >= OUTAGE.as_secs_f64() - 1.0,
        "{}",
        ended[0]
    );
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_topic_created_after_start_is_used_within_seconds() {
    let logs = logs::install();
    let broker = Tansu::start().await;
    let c = cluster(SimConfig::default()).await;
    create_configmaps(&c, 5);
    let name = "kafka-later";
    let topic = "kubesink.created-later";
    let mut k = kafka(name, &broker.bootstrap, topic);
    // librdkafka calls a topic missing once its metadata said so for this long (default
    // 30 s): the sink reaches the "topic does not exist" state the user sees sooner.
    k.librdkafka
        .insert("topic.metadata.propagation.max.ms".into(), "1000".into());
    let cfg = production_timing(&c, k);
    let bridge = start(&cfg).await;
    let h = &bridge.pipeline().sinks()[0];
    wait_for("the missing topic reported", LONG, || {
        h.stats()
            .problem()
            .is_some_and(|p| p.contains("does not exist"))
    })
    .await;
    // The pipeline now waits retry_max_backoff (30 s) before it sends again.
    let errors = h.stats().errors.load(Ordering::SeqCst);
    broker.create_topic(topic, 1).await;
    let created = Instant::now();
    wait_for(
        "delivery within 15 s of the topic's creation",
        Duration::from_secs(15),
        || h.stats().delivered.load(Ordering::SeqCst) >= 5,
    )
    .await;
    let took = created.elapsed();
    let found = logs.lines("the topic exists now");
    let found: Vec<&String> = found
        .iter()
        .filter(|l| l.contains(&format!("sink={name}")))
        .collect();
    eprintln!("topic created -> delivered: {took:?} (failed sends before: {errors}); {found:?}");
    assert_eq!(found.len(), 1, "the watcher logged finding it once");
    bridge.shutdown().await;
}

#[test]
fn fields_are_read_from_log_lines() {
    let l = "INFO kubesink_core::outage: NATS reachable again sink=nats down_for=10.3s failed_attempts=12 last_error=x";
    assert_eq!(field(l, "failed_attempts"), Some(12.0));
    assert_eq!(field(l, "down_for"), Some(10.3));
    assert_eq!(field(l, "missing"), None);
}
