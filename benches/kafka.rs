//! Messages/s from the Kafka sink to a real Kafka-protocol broker (tansu, memory storage).
//!
//! Starts its own tansu (the binary `scripts/test.sh` caches), creates a 6-partition topic,
//! and sends N pre-encoded topology messages through `KafkaSink::send` in batches of the
//! pipeline's default size (500), one batch at a time as the pipeline does (each confirmed
//! by every delivery report before the next). Prints messages/s.
//!
//! `cargo bench --bench kafka` (env: `N` messages, default 200000; `PAYLOAD` bytes, default
//! 1024; `BATCH`, default 500).

#[path = "../tests/support/kafka_server.rs"]
mod kafka_server;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kubesink::sinks::kafka::{KafkaConfig, KafkaSink};
use kubesink::sinks::{Message, MessageMeta, Op, Sink};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn messages(n: usize, payload: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let name = format!("pod-{}", i % 20_000);
            let meta = MessageMeta {
                id: format!("{i:032x}").into(),
                op: Op::Updated,
                cluster: "bench".into(),
                group: "".into(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: "Pod".into(),
                resource: "pods".into(),
                namespace: Some("default".into()),
                name: name.as_str().into(),
            };
            let head =
                format!(r#"{{"op":"updated","name":"{name}","resourceVersion":"{i}","pad":""#);
            let mut body = head.into_bytes();
            body.resize(payload.saturating_sub(2).max(body.len()), b'x');
            body.extend_from_slice(b"\"}");
            Message {
                key: format!("bench/core/Pod/default/{name}").into(),
                payload: Bytes::from(body),
                meta: Arc::new(meta),
            }
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
    let sink = KafkaSink::new(&cfg).expect("sink");
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
