//! Messages/s through the NATS sink, core and JetStream side by side in one run.
//!
//! Starts its own `nats-server` (free port, JetStream, temp store), pre-encodes N topology
//! messages of realistic size (one per object, ~1.3 KB), and sends them through
//! `NatsSink::send` in batches of the pipeline's default size (500), in core mode and then in
//! JetStream mode (file storage, `Nats-Msg-Id` dedup, every PubAck awaited). Prints both rates
//! and their ratio.
//!
//! `cargo bench --bench nats` (`BENCH_MESSAGES=200000` to change N; `BENCH_FORMAT=cloudevents`
//! or `cloudevents-structured` to measure a CloudEvents format instead of `json`).

use kubesink_test_support::nats_server;

use std::sync::Arc;
use std::time::Instant;

use kubesink::config::HumanDuration;
use kubesink_core::message::{encode, fixtures, Change, ObjectJson};
use kubesink_core::{Format, Message, Op, Resource, Sink};
use kubesink_nats::{NatsConfig, NatsMode};

const BATCH: usize = 500;

fn messages(n: usize) -> Vec<Message> {
    let filler = "x".repeat(900);
    let pods = Arc::new(Resource::new("bench", "", "v1", "Pod", "pods", true));
    (0..n)
        .map(|i| {
            let name = format!("web-{:05}-{:05}", i / 1000, i % 1000);
            let ns = format!("ns-{}", i % 20);
            let object =
                ObjectJson::from_value(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
                "spec": {"nodeName": format!("node-{}", i % 50), "filler": filler}}));
            let change = Change {
                uid: format!("{i:08x}-0000-4000-8000-000000000000"),
                resource_version: (1000 + i).to_string(),
                ..fixtures::change(Op::Updated, Some(&ns), &name, Some(object))
            };
            encode(&pods, &change, "2026-11-29T15:54:42.123Z").expect("encodes")
        })
        .collect()
}

async fn run(
    server: &nats_server::NatsServer,
    mode: NatsMode,
    format: Format,
    msgs: &[Message],
) -> f64 {
    let mut cfg = NatsConfig {
        name: format!("{mode:?}"),
        servers: vec![server.url()],
        mode,
        format,
        ..Default::default()
    };
    cfg.stream.create = true;
    cfg.stream.duplicate_window = HumanDuration::from_secs(120);
    let sink = cfg.build_sink(0).await.expect("sink builds");
    let start = Instant::now();
    for batch in msgs.chunks(BATCH) {
        sink.send(batch).await.expect("batch delivered");
    }
    sink.close().await.expect("flushed");
    msgs.len() as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::var("BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let format: Format = std::env::var("BENCH_FORMAT")
        .ok()
        .map(|f| serde_json::from_value(f.into()).expect("BENCH_FORMAT: a sink format"))
        .unwrap_or_default();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let server = nats_server::NatsServer::start("");
    let msgs = messages(n);
    let avg = msgs.iter().map(|m| m.payload.len()).sum::<usize>() / n.max(1);
    println!(
        "nats-server {} | {n} messages of {avg} B payload, batches of {BATCH}, format {}",
        server.url(),
        format.as_str()
    );
    rt.block_on(async {
        // Warm-up (connection, stream creation) outside the measurement.
        let _ = run(&server, NatsMode::Core, format, &msgs[..BATCH.min(n)]).await;
        let core = run(&server, NatsMode::Core, format, &msgs).await;
        println!("core      (flush per batch):            {core:>10.0} msg/s");
        let js = run(&server, NatsMode::Jetstream, format, &msgs).await;
        println!("jetstream (PubAck per message, file):   {js:>10.0} msg/s");
        println!(
            "core / jetstream:                       {:>10.2}",
            core / js
        );
    });
}
