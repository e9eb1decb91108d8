//! The real delivery worker under random faults (the real `deliver()`, not a model of it):
//! random pushes of a few keys through the real [`Pipeline`](super::Pipeline) (its
//! `SinkQueue`, the worker of `deliver.rs` with its segmenting, retries, `retain_failed`
//! and `shrink`), with backpressure (a `max_pending` of 1 to 4, so the publisher waits),
//! linger on or off, coalescing on or off, one to three batches in flight, and every change
//! behind a write-ahead position that a writer makes durable late and in steps; the sink
//! answers from a random script (ok, transient, partial, too large). Time is paused, so
//! linger, backoff and the writer's delays run in virtual time.
//!
//! Invariants:
//! 1. nothing is sent before its write-ahead position is durable (checked in `send`);
//! 2. per key, the resourceVersions the destination received (confirmed) never decrease;
//! 3. an acknowledgement settles only once its change, or a later one of the key, was
//!    confirmed, or, with coalescing, once a later change of the key was published (the
//!    replacement settles it, `Settle`'s contract) (checked in `settle`);
//! 4. once the pipeline drained, each key's last confirmed resourceVersion is the last one
//!    published, and every acknowledgement settled once.
//!
//! Planted faults it catches (each tried once, in a few hundred cases): the queue taking a
//! key already in another batch in flight (invariant 2); a batch waiting for the lowest
//! write-ahead position of its changes instead of the highest (invariant 1).
//!
//! `cargo test -p kubesink --lib worker_model` runs 500 cases (`KUBESINK_MODEL_CASES`
//! scales it, as for `model_tests.rs`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kubesink_core::message::{encode, fixtures, Change, ObjectJson};
use kubesink_core::{Message, Op, Resource, Sink, SinkError};
use proptest::prelude::*;
use serde_json::json;

use super::{Durability, Pipeline, Settle, WriteAhead};
use crate::config::{ByteSize, HumanDuration, PipelineConfig};
use crate::leader::Fence;

const KEYS: [&str; 3] = ["a", "b", "c"];

/// One scripted answer of the sink.
#[derive(Debug, Clone)]
enum Reply {
    Ok,
    Transient,
    /// The messages whose index bit is set fail, the others are confirmed.
    Partial(u8),
    /// Message `n` (modulo the batch) is too large.
    TooLarge(u8),
}

/// What the destination confirmed, in order, and the violations seen while sending.
#[derive(Default)]
struct Seen {
    /// (key, resourceVersion) confirmed, in order.
    confirmed: Vec<(String, u64)>,
    /// (key, resourceVersion) handed to the publisher, in order.
    published: Vec<(String, u64)>,
    violations: Vec<String>,
}

struct ModelSink {
    replies: Mutex<VecDeque<Reply>>,
    seen: Arc<Mutex<Seen>>,
    /// How far the write-ahead log is durable.
    durable: tokio::sync::watch::Receiver<u64>,
    /// Each message's write-ahead position, by (key, resourceVersion).
    positions: Arc<Mutex<HashMap<(String, u64), u64>>>,
    window: usize,
}

fn key_rv(m: &Message) -> (String, u64) {
    let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap_or_default();
    (
        v["name"].as_str().unwrap_or_default().to_owned(),
        v["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0),
    )
}

#[async_trait]
impl Sink for ModelSink {
    fn name(&self) -> &str {
        "model"
    }

    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        let durable = *self.durable.borrow();
        {
            let positions = self.positions.lock().unwrap_or_else(|p| p.into_inner());
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            for m in batch {
                let k = key_rv(m);
                if positions.get(&k).is_some_and(|p| *p > durable) {
                    seen.violations.push(format!(
                        "invariant 1: {k:?} sent before its write-ahead position was durable ({durable})"
                    ));
                }
            }
        }
        let reply = self
            .replies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .unwrap_or(Reply::Ok);
        let failed: Vec<usize> = match &reply {
            Reply::Ok => Vec::new(),
            Reply::Transient => (0..batch.len()).collect(),
            Reply::Partial(mask) => (0..batch.len())
                .filter(|i| mask & (1 << (i % 8)) != 0)
                .collect(),
            Reply::TooLarge(n) => vec![*n as usize % batch.len()],
        };
        // A too-large answer confirms nothing; the others confirm what did not fail.
        let confirmed: Vec<usize> = match reply {
            Reply::TooLarge(_) => Vec::new(),
            _ => (0..batch.len()).filter(|i| !failed.contains(i)).collect(),
        };
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            for i in confirmed {
                let (key, rv) = key_rv(&batch[i]);
                if let Some(last) = seen
                    .confirmed
                    .iter()
                    .rev()
                    .find(|(k, _)| *k == key)
                    .map(|(_, r)| *r)
                {
                    if last > rv {
                        seen.violations.push(format!(
                            "invariant 2: {key} rv {rv} confirmed after rv {last}"
                        ));
                    }
                }
                seen.confirmed.push((key, rv));
            }
        }
        match reply {
            Reply::Ok => Ok(()),
            Reply::Transient => Err(SinkError::transient("model", "down")),
            Reply::Partial(_) if failed.is_empty() => Ok(()),
            Reply::Partial(_) => Err(SinkError::Partial {
                sink: "model".into(),
                failed,
                message: "some failed".into(),
            }),
            Reply::TooLarge(n) => Err(SinkError::TooLarge {
                sink: "model".into(),
                index: n as usize % batch.len(),
                size: batch[n as usize % batch.len()].payload.len(),
                limit: None,
            }),
        }
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }

    async fn close(&self) -> Result<(), SinkError> {
        Ok(())
    }

    fn max_batches_in_flight(&self) -> usize {
        self.window
    }
}

/// An acknowledgement behind a write-ahead position, recording when it settles.
struct Acked {
    key: String,
    rv: u64,
    wal: WriteAhead,
    seen: Arc<Mutex<Seen>>,
    settled: Arc<AtomicUsize>,
    coalesce: bool,
}

impl Settle for Acked {
    fn settle(&self) {
        self.settled.fetch_add(1, Ordering::SeqCst);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let covered = seen
            .confirmed
            .iter()
            .any(|(k, rv)| *k == self.key && *rv >= self.rv);
        let replaced = self.coalesce
            && seen
                .published
                .iter()
                .any(|(k, rv)| *k == self.key && *rv > self.rv);
        if !covered && !replaced {
            let v = format!(
                "invariant 3: the acknowledgement of {} rv {} settled before it or a later one was confirmed",
                self.key, self.rv
            );
            seen.violations.push(v);
        }
    }

    fn write_ahead(&self) -> Option<&WriteAhead> {
        Some(&self.wal)
    }
}

/// One case's shape.
#[derive(Debug, Clone)]
struct Shape {
    max_pending: usize,
    max_batch_events: usize,
    linger_ms: u64,
    coalesce: bool,
    window: usize,
}

fn message(key: &str, rv: u64) -> Message {
    let r = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
    let object = json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": key, "namespace": "ns", "resourceVersion": rv.to_string()},
                        "spec": {"containers": [{"name": "c", "image": format!("img-{rv}")}]}});
    let object = Some(ObjectJson::from_value(&object));
    let change = Change {
        resource_version: rv.to_string(),
        ..fixtures::change(Op::Updated, Some("ns"), key, object)
    };
    encode(&r, &change, "2026-12-04T00:00:00.000Z").expect("encodes")
}

/// Runs one case; `Err` names the invariant broken.
fn run_case(shape: &Shape, pushes: &[usize], replies: Vec<Reply>) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let positions: Arc<Mutex<HashMap<(String, u64), u64>>> = Arc::default();
        let (durable_tx, durable_rx) = tokio::sync::watch::channel(0u64);
        let log = Durability::new(durable_rx.clone());
        let sink = Arc::new(ModelSink {
            replies: Mutex::new(replies.into()),
            seen: seen.clone(),
            durable: durable_rx,
            positions: positions.clone(),
            window: shape.window,
        });
        let config = PipelineConfig {
            coalesce: shape.coalesce,
            max_pending: shape.max_pending,
            max_pending_bytes: ByteSize(1 << 30),
            max_batch_events: shape.max_batch_events,
            max_batch_bytes: ByteSize(1 << 30),
            linger: HumanDuration(Duration::from_millis(shape.linger_ms)),
            retry_initial_backoff: HumanDuration(Duration::from_millis(10)),
            retry_max_backoff: HumanDuration(Duration::from_millis(100)),
            ..PipelineConfig::default()
        };
        let pipeline = Pipeline::start(&config, vec![sink.clone() as Arc<dyn Sink>], Fence::open());
        // The write-ahead writer: durable up to what was pushed, late and in steps.
        let pushed = Arc::new(AtomicUsize::new(0));
        let writer = {
            let pushed = pushed.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(7)).await;
                    let upto = pushed.load(Ordering::SeqCst) as u64;
                    let now = *durable_tx.borrow();
                    if now < upto {
                        durable_tx.send_replace(now + 1);
                    }
                }
            })
        };
        let settled = Arc::new(AtomicUsize::new(0));
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        let publisher = pipeline.publisher();
        for (i, k) in pushes.iter().enumerate() {
            let key = KEYS[*k % KEYS.len()];
            let rv = i as u64 + 1;
            let position = rv;
            positions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((key.to_owned(), rv), position);
            let ack = Arc::new(Acked {
                key: key.to_owned(),
                rv,
                wal: WriteAhead::new(log.clone(), position),
                seen: seen.clone(),
                settled: settled.clone(),
                coalesce: shape.coalesce,
            });
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .published
                .push((key.to_owned(), rv));
            pushed.store(i + 1, Ordering::SeqCst);
            // Backpressure: with a full queue this waits for the worker.
            let queued = tokio::time::timeout(
                Duration::from_secs(3600),
                publisher.publish_acked(message(key, rv), Some(ack), false, None),
            )
            .await
            .map_err(|_| format!("publish of {key} rv {rv} never returned (stalled)"))?;
            if !queued {
                return Err(format!("publish of {key} rv {rv} refused"));
            }
            last.insert(key.to_owned(), rv);
        }
        let undelivered = pipeline
            .shutdown(tokio::time::Instant::now() + Duration::from_secs(3600))
            .await;
        writer.abort();
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = seen.violations.first() {
            return Err(v.clone());
        }
        if undelivered > 0 {
            return Err(format!("{undelivered} changes undelivered after the drain"));
        }
        for (key, rv) in &last {
            let got = seen
                .confirmed
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, r)| *r);
            if got != Some(*rv) {
                return Err(format!(
                    "invariant 4: {key}'s last confirmed rv is {got:?}, the last published {rv}"
                ));
            }
        }
        if settled.load(Ordering::SeqCst) != pushes.len() {
            return Err(format!(
                "invariant 4: {} of {} acknowledgements settled",
                settled.load(Ordering::SeqCst),
                pushes.len()
            ));
        }
        Ok(())
    })
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        5 => Just(Reply::Ok),
        1 => Just(Reply::Transient),
        2 => (1..=255u8).prop_map(Reply::Partial),
        1 => any::<u8>().prop_map(Reply::TooLarge),
    ]
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        1..=4usize,
        1..=4usize,
        prop_oneof![Just(0u64), Just(5), Just(50)],
        any::<bool>(),
        1..=3usize,
    )
        .prop_map(
            |(max_pending, max_batch_events, linger_ms, coalesce, window)| Shape {
                max_pending,
                max_batch_events,
                linger_ms,
                coalesce,
                window,
            },
        )
}

fn cases() -> u32 {
    std::env::var("KUBESINK_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(500, |n| (n / 4).max(1))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 5_000,
        ..ProptestConfig::default()
    })]

    /// The real worker keeps every invariant through random answers, backpressure, linger,
    /// coalescing, windows and late write-ahead positions.
    #[test]
    fn worker_model_the_real_worker_delivers_in_order_after_the_write_ahead_and_loses_nothing(
        shape in shape(),
        pushes in proptest::collection::vec(0..KEYS.len(), 1..30),
        replies in proptest::collection::vec(reply(), 0..40),
    ) {
        if let Err(e) = run_case(&shape, &pushes, replies) {
            return Err(TestCaseError::fail(e));
        }
    }
}
