//! Messages/s from the Kafka sink to a real Kafka-protocol broker (tansu, memory storage).
//!
//! Starts its own tansu (the binary `scripts/test.sh` caches), creates a 6-partition topic,
//! and sends N pre-encoded topology messages through `KafkaSink::send` in batches of the
//! pipeline's default size (500), one batch at a time as the pipeline does (each confirmed
//! by every delivery report before the next). Prints messages/s.
//!
//! `cargo bench --bench kafka` (env: `N` messages, default 200000; `PAYLOAD` bytes, default
//! 1024; `BATCH`, default 500).

use kubesink_test_support::kafka_server;

use std::sync::Arc;
use std::time::Instant;

use kubesink_core::message::{encode, fixtures, Change, ObjectJson};
use kubesink_core::{Message, Op, Resource, Sink};
use kubesink_kafka::KafkaConfig;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `n` encoded `updated` messages of pods (20,000 distinct keys) of about `payload` bytes.
fn messages(n: usize, payload: usize) -> Vec<Message> {
    let pods = Arc::new(Resource::new("bench", "", "v1", "Pod", "pods", true));
    // The envelope without the filler is ~330 bytes.
    let filler = "x".repeat(payload.saturating_sub(330));
    (0..n)
        .map(|i| {
            let name = format!("pod-{}", i % 20_000);
            let object =
                ObjectJson::from_value(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"filler": filler}}));
            let change = Change {
                uid: format!("{i:08x}-0000-4000-8000-000000000000"),
                resource_version: i.to_string(),
                ..fixtures::change(Op::Updated, Some("default"), &name, Some(object))
            };
            encode(&pods, &change, "2026-11-29T15:54:42.123Z").expect("encodes")
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = env("N", 200_000);
    let payload = env("PAYLOAD", 1024);
    let batch = env("BATCH", 500);
    let t0 = Instant::now();
    let broker = kafka_server::Tansu::start().await;
    broker.create_topic("kubesink.bench", 6).await;
    let startup = t0.elapsed();
    let cfg = KafkaConfig {
        bootstrap_servers: broker.bootstrap.clone(),
        ..Default::default()
    };
    let sink = cfg.build_sink(0).expect("sink");
    let msgs = messages(n, payload);
    // Warm-up: connection, metadata, producer id.
    sink.send(&msgs[..batch.min(n)]).await.expect("warm-up");
    let t = Instant::now();
    for chunk in msgs.chunks(batch) {
        sink.send(chunk).await.expect("send");
    }
    let secs = t.elapsed().as_secs_f64();
    sink.close().await.expect("flush");
    println!(
        "kafka sink -> tansu (memory://, 6 partitions, lz4, idempotent, acks=all): \
         {n} messages of {payload} B in batches of {batch}: {secs:.2} s, {:.0} messages/s, \
         {:.1} MB/s (broker start + topic creation {:.2} s)",
        n as f64 / secs,
        (n * payload) as f64 / secs / 1e6,
        startup.as_secs_f64()
    );
}
