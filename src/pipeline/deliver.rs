//! One sink's worker: take a batch, wait for its write-ahead positions, deliver it until the
//! sink confirms all of it, hand it back. Owns the delivery policy every sink shares: retries with the one [`Backoff`] (every
//! wait, a destination's `retry_after` hint included, within `retry_max_backoff`), cut short
//! when the sink's [`ReadyWatch`] says the destination is back (the backoff then starts
//! over), partial retries that never move a key backwards, and the oversize shrink.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use kubesink_core::backoff::Backoff;
use kubesink_core::message::{truncate, TruncateLevel};
use kubesink_core::{Message, ReadyWatch, Sink, SinkError};

use super::handle::SinkHandle;
use super::stats::SinkStats;
use crate::leader::Fence;

/// Delivers batches until the queue is closed and drained; sends nothing while `fence` is
/// closed (a replica that is not, or no longer, the leader). Up to the queue's window of
/// batches are delivered concurrently (1 unless the sink asks for more,
/// [`Sink::max_batches_in_flight`]); the queue keeps each key in one of them at most.
pub(super) async fn run_worker(h: SinkHandle, retry: Backoff, fence: Fence) {
    use futures::stream::{FuturesUnordered, StreamExt};
    let window = h.queue.window();
    let mut inflight = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            Some(()) = inflight.next(), if !inflight.is_empty() => {}
            batch = h.queue.next_batch(), if inflight.len() < window => {
                let Some(batch) = batch else { break };
                inflight.push(deliver_batch(&h, batch, retry, &fence));
            }
        }
    }
    while inflight.next().await.is_some() {}
}

/// One batch: waits for its write-ahead positions and the fence, delivers it until the sink
/// confirmed all of it, hands it back to the queue.
async fn deliver_batch(h: &SinkHandle, batch: super::queue::Batch, retry: Backoff, fence: &Fence) {
    let mut ready = h.ready.subscribe();
    // Write-ahead: the state journal must hold every new key of the batch before any of
    // it leaves (see `WriteAhead`). Usually already durable: the journal is written
    // while the previous batch was being sent.
    for point in batch.write_ahead() {
        if point.is_durable() {
            continue;
        }
        let waiting = std::time::Instant::now();
        h.stats.journal_wait_begins();
        let durable = point.wait().await;
        h.stats.journal_wait_ends();
        let waited = u64::try_from(waiting.elapsed().as_micros()).unwrap_or(u64::MAX);
        h.stats
            .write_ahead_wait_us
            .fetch_add(waited, Ordering::Relaxed);
        if !durable {
            tracing::error!(
                sink = h.sink.name(),
                "the state journal stopped before recording this batch's new objects; sending anyway (a crash now could leave them undeleted downstream)"
            );
        }
    }
    while !fence.is_open() {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    deliver(
        &*h.sink,
        &batch.messages,
        &h.stats,
        retry,
        fence,
        &mut ready,
    )
    .await;
    h.queue.complete(batch);
}

/// Sends `batch` until the sink confirms all of it. Never returns early: at-least-once. (The
/// shutdown deadline cancels this future from outside; the batch then counts as
/// undelivered.) Between attempts it waits for the backoff or for `ready`, whichever comes
/// first.
///
/// A sync marker goes out only once everything before it is confirmed: the batch is sent
/// in segments that each begin at a marker (a sink may deliver a batch's messages
/// concurrently, and a marker that reached the destination before a message of its list
/// failed would tell consumers to sweep a key that is still coming).
pub(super) async fn deliver(
    sink: &dyn Sink,
    batch: &[Message],
    stats: &SinkStats,
    retry: Backoff,
    fence: &Fence,
    ready: &mut ReadyWatch,
) {
    let total = batch.len() as u64;
    let mut todo: Vec<Message> = batch.to_vec();
    let mut levels: Vec<Option<TruncateLevel>> = vec![None; todo.len()];
    if let Some(limit) = sink.max_message_bytes() {
        for (m, level) in todo.iter_mut().zip(levels.iter_mut()) {
            let size = m.payload.len();
            while m.payload.len() > limit {
                if !shrink(m, level, stats) {
                    break;
                }
            }
            if level.is_some() {
                tracing::warn!(sink = sink.name(), key = %m.key, size, limit, truncated_to = m.payload.len(), "message larger than the destination accepts: sending it truncated");
            }
        }
    }
    let mut start = 0;
    while start < todo.len() {
        let end = todo[start + 1..]
            .iter()
            .position(|m| m.meta.op.is_marker())
            .map_or(todo.len(), |p| start + 1 + p);
        deliver_segment(
            sink,
            todo[start..end].to_vec(),
            levels[start..end].to_vec(),
            stats,
            retry,
            fence,
            ready,
        )
        .await;
        start = end;
    }
    stats.delivered.fetch_add(total, Ordering::Relaxed);
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats.batch_size.observe(total as f64);
    stats.note_success();
}

/// Sends one segment of a batch (no marker but possibly its first message) until the sink
/// confirmed all of it.
async fn deliver_segment(
    sink: &dyn Sink,
    mut todo: Vec<Message>,
    mut levels: Vec<Option<TruncateLevel>>,
    stats: &SinkStats,
    retry: Backoff,
    fence: &Fence,
    ready: &mut ReadyWatch,
) {
    let mut delays = retry.delays();
    let mut attempt = 0u64;
    loop {
        if attempt > 0 {
            stats
                .retried
                .fetch_add(todo.len() as u64, Ordering::Relaxed);
        }
        attempt += 1;
        // Checked right before each send: a leader whose lease may have passed to another
        // replica emits nothing more (see src/leader.rs).
        while !fence.is_open() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        ready.mark_seen();
        let started = std::time::Instant::now();
        // The send races the fence: a leader whose fence closes mid-send (its lease may
        // pass to another replica; a process frozen with SIGSTOP wakes up past it) abandons
        // the send instead of completing it, and the sink drops what it still holds
        // (`Sink::abandon`: librdkafka's queue is purged). Nothing of it is acknowledged, so
        // the next leader sends it again.
        let sent = tokio::select! {
            biased;
            _ = fence.closed() => None,
            sent = sink.send(&todo) => Some(sent),
        };
        stats.send_seconds.observe(started.elapsed().as_secs_f64());
        let err = match sent {
            Some(Ok(())) => break,
            Some(Err(e)) => e,
            None => {
                stats
                    .abandoned
                    .fetch_add(todo.len() as u64, Ordering::Relaxed);
                tracing::warn!(sink = sink.name(), messages = todo.len(), "leadership fence closed during a send: send abandoned (the next leader sends these again)");
                sink.abandon().await;
                continue;
            }
        };
        stats.note_error(&err);
        let mut delay = delays.next().unwrap_or(retry.max);
        match &err {
            SinkError::TooLarge { index, .. } => {
                let i = *index;
                let size = todo.get(i).map_or(0, |m| m.payload.len());
                if i < todo.len() && shrink(&mut todo[i], &mut levels[i], stats) {
                    tracing::warn!(sink = sink.name(), key = %todo[i].key, size, limit = ?err_limit(&err), truncated_to = todo[i].payload.len(), "message too large for the destination: sending it truncated");
                    continue;
                }
                tracing::error!(sink = sink.name(), error = %err, "message too large even without its object; retrying");
            }
            SinkError::Partial { failed, .. } => {
                let (keep, keep_levels) = retain_failed(&todo, &levels, failed);
                tracing::warn!(sink = sink.name(), error = %err, retrying = keep.len(), "partial delivery");
                todo = keep;
                levels = keep_levels;
                if todo.is_empty() {
                    break;
                }
            }
            SinkError::Fatal { .. } => {
                delay = retry.max;
                tracing::error!(sink = sink.name(), error = %err, retry_in = ?delay, "sink needs attention; retrying");
            }
            SinkError::Transient { retry_after, .. } => {
                // A destination's hint is obeyed up to the configured cap.
                if let Some(after) = retry_after {
                    delay = delay.max(*after).min(retry.max);
                }
                // The first failure of a batch is a WARN; its retries are DEBUG: an outage is
                // the sink's to announce (one line when it starts, a summary a minute, one when
                // it ends: `kubesink_core::outage`), and readiness says it too; a WARN per
                // retry would repeat it every few seconds.
                if attempt == 1 {
                    tracing::warn!(sink = sink.name(), error = %err, retry_in = ?delay, "sink error; retrying (its retries are logged at DEBUG)");
                } else {
                    tracing::debug!(sink = sink.name(), error = %err, retry_in = ?delay, attempt, "sink error; retrying");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = ready.changed() => {
                tracing::info!(sink = sink.name(), "destination reachable again: retrying now");
                delays = retry.delays();
            }
        }
    }
}

fn err_limit(e: &SinkError) -> Option<usize> {
    match e {
        SinkError::TooLarge { limit, .. } => *limit,
        _ => None,
    }
}

/// What a partial failure leaves to re-send, in order:
/// - each failed message, unless a later message of the same key *and uid* was delivered
///   (it carries that object's newer state; re-sending the older one would move the key
///   backwards). A later message of another uid does not supersede it: the failed `deleted`
///   of a re-created object's old uid must still arrive;
/// - after a kept message of a key, every later message of that key, delivered or not, so
///   the key's last state is again the last one the destination receives (a re-sent
///   `deleted` of uid 1 must not end up after the `added` of uid 2, nor its Kafka
///   tombstone);
/// - a sync marker when any message before it is kept, so it is delivered again after them
///   (a marker must follow its list's messages on every destination).
pub(super) fn retain_failed(
    todo: &[Message],
    levels: &[Option<TruncateLevel>],
    failed: &[usize],
) -> (Vec<Message>, Vec<Option<TruncateLevel>>) {
    let failed: HashSet<usize> = failed.iter().copied().filter(|i| *i < todo.len()).collect();
    let mut last_delivered: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, m) in todo.iter().enumerate() {
        if !failed.contains(&i) {
            last_delivered.insert((&m.key, &m.meta.uid), i);
        }
    }
    let mut kept_before = false;
    let mut resent_keys: HashSet<&str> = HashSet::new();
    let mut kept: Vec<usize> = Vec::new();
    for (i, m) in todo.iter().enumerate() {
        let retry = failed.contains(&i)
            && last_delivered
                .get(&(&*m.key, &*m.meta.uid))
                .is_none_or(|d| *d < i);
        let behind_a_retry = !m.meta.op.is_marker() && resent_keys.contains(&*m.key);
        if retry || behind_a_retry || (kept_before && m.meta.op.is_marker()) {
            kept_before = true;
            if !m.meta.op.is_marker() {
                resent_keys.insert(&m.key);
            }
            kept.push(i);
        }
    }
    // Of what is kept, a message superseded by a later kept one of the same key and uid
    // goes: re-sent, it would land after a newer state of that uid already delivered (found
    // by the model test: `updated` rv 4 delivered, the `added` rv 3 before it re-sent).
    let mut later: HashSet<(&str, &str)> = HashSet::new();
    let mut kept: Vec<usize> = kept
        .into_iter()
        .rev()
        .filter(|&i| {
            let m = &todo[i];
            m.meta.op.is_marker() || later.insert((&m.key, &m.meta.uid))
        })
        .collect();
    kept.reverse();
    (
        kept.iter().map(|&i| todo[i].clone()).collect(),
        kept.iter().map(|&i| levels[i]).collect(),
    )
}

/// Applies the next truncation level; `false` when nothing more can be removed.
pub(super) fn shrink(
    msg: &mut Message,
    level: &mut Option<TruncateLevel>,
    stats: &SinkStats,
) -> bool {
    let next = match level {
        None => TruncateLevel::MetadataOnly,
        Some(TruncateLevel::MetadataOnly) => TruncateLevel::NoObject,
        Some(TruncateLevel::NoObject) => return false,
    };
    let Some(smaller) = truncate(msg, next) else {
        return false;
    };
    if level.is_none() {
        stats.truncated.fetch_add(1, Ordering::Relaxed);
    }
    *msg = smaller;
    *level = Some(next);
    true
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;
    use kubesink_core::message::{encode, fixtures, Change, ObjectJson};
    use kubesink_core::{Op, Resource};
    use serde_json::{json, Value};

    use super::*;

    /// What the scripted sink answers to one `send`.
    enum Reply {
        Ok,
        Transient,
        /// Transient, with the destination asking to wait this long.
        TransientAfter(Duration),
        /// Fail these indices of the batch.
        Partial(Vec<usize>),
        /// Message `index` is over `limit` bytes.
        TooLarge(usize),
        Fatal,
        /// Never answer (a broker that hangs).
        Hang,
    }

    /// A sink that answers from a script and records every batch it was given.
    #[derive(Default)]
    struct Scripted {
        replies: Mutex<VecDeque<Reply>>,
        calls: Mutex<Vec<Vec<Value>>>,
        /// When each `send` was called.
        at: Mutex<Vec<tokio::time::Instant>>,
        limit: Option<usize>,
    }

    impl Scripted {
        fn new(replies: Vec<Reply>) -> Self {
            Scripted {
                replies: Mutex::new(replies.into()),
                ..Default::default()
            }
        }
        /// The (name, resourceVersion, truncated) of each message of each call.
        fn calls(&self) -> Vec<Vec<(String, String, bool)>> {
            self.calls
                .lock()
                .unwrap()
                .iter()
                .map(|batch| {
                    batch
                        .iter()
                        .map(|m| {
                            (
                                m["name"].as_str().unwrap().to_owned(),
                                m["resourceVersion"].as_str().unwrap().to_owned(),
                                m["truncated"] == true,
                            )
                        })
                        .collect()
                })
                .collect()
        }
    }

    #[async_trait]
    impl Sink for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
            let seen = batch
                .iter()
                .map(|m| serde_json::from_slice(&m.payload).unwrap())
                .collect();
            self.calls.lock().unwrap().push(seen);
            self.at.lock().unwrap().push(tokio::time::Instant::now());
            let reply = self
                .replies
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Reply::Ok);
            match reply {
                Reply::Ok => Ok(()),
                Reply::Transient => Err(SinkError::transient("scripted", "down")),
                Reply::TransientAfter(after) => Err(SinkError::Transient {
                    sink: "scripted".into(),
                    message: "throttled".into(),
                    retry_after: Some(after),
                }),
                Reply::Partial(failed) => Err(SinkError::Partial {
                    sink: "scripted".into(),
                    failed,
                    message: "some failed".into(),
                }),
                Reply::TooLarge(index) => Err(SinkError::TooLarge {
                    sink: "scripted".into(),
                    index,
                    size: batch[index].payload.len(),
                    limit: None,
                }),
                Reply::Fatal => Err(SinkError::fatal("scripted", "not authorized")),
                Reply::Hang => std::future::pending().await,
            }
        }
        async fn healthcheck(&self) -> Result<(), SinkError> {
            Ok(())
        }
        async fn close(&self) -> Result<(), SinkError> {
            Ok(())
        }
        fn max_message_bytes(&self) -> Option<usize> {
            self.limit
        }
    }

    fn msg(name: &str, rv: u64, spec_bytes: usize) -> Message {
        let r = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
        let object = json!({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "namespace": "ns"},
                            "spec": {"blob": "x".repeat(spec_bytes)}});
        let object = Some(ObjectJson::from_value(&object));
        let change = Change {
            resource_version: rv.to_string(),
            ..fixtures::change(Op::Updated, Some("ns"), name, object)
        };
        encode(&r, &change, "2026-11-30T00:00:00.000Z").unwrap()
    }

    /// A ready watch nothing ever notifies.
    fn quiet() -> ReadyWatch {
        kubesink_core::ReadySignal::new().subscribe()
    }

    fn policy() -> Backoff {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(30))
    }

    fn entry(name: &str, rv: u64) -> (String, String, bool) {
        (name.into(), rv.to_string(), false)
    }

    /// An acknowledgement that only carries a write-ahead position.
    struct Gated(crate::pipeline::WriteAhead);

    impl crate::pipeline::Settle for Gated {
        fn settle(&self) {}
        fn write_ahead(&self) -> Option<&crate::pipeline::WriteAhead> {
            Some(&self.0)
        }
    }

    async fn sent_within(sink: &Scripted, d: Duration) -> bool {
        tokio::time::timeout(d, async {
            while sink.calls().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_sent_only_once_its_write_ahead_position_is_durable() {
        let sink = Arc::new(Scripted::new(vec![]));
        let config = crate::config::PipelineConfig::default();
        let p = crate::pipeline::Pipeline::start(
            &config,
            vec![sink.clone() as Arc<dyn Sink>],
            Fence::open(),
        );
        let (durable, rx) = tokio::sync::watch::channel(0u64);
        let log = crate::pipeline::Durability::new(rx);
        let ack = Arc::new(Gated(crate::pipeline::WriteAhead::new(log.clone(), 2)));
        assert!(
            p.publisher()
                .publish_acked(msg("a", 1, 0), Some(ack), false, None)
                .await
        );
        // (Paused time: these waits are the runtime going idle, not wall-clock sleeps.)
        assert!(
            !sent_within(&sink, Duration::from_secs(60)).await,
            "not durable yet"
        );
        durable.send_replace(1);
        assert!(
            !sent_within(&sink, Duration::from_secs(60)).await,
            "durable up to 1 of 2"
        );
        durable.send_replace(2);
        assert!(sent_within(&sink, Duration::from_secs(60)).await);
        assert_eq!(sink.calls(), [vec![entry("a", 1)]]);
        // A log whose writer stopped releases what waits (shutdown order makes this the
        // exception: a writer that died).
        assert_eq!(
            log.wanted(),
            2,
            "the writer was told what the sender waits for"
        );
        let ack = Arc::new(Gated(crate::pipeline::WriteAhead::new(log.clone(), 3)));
        assert!(
            p.publisher()
                .publish_acked(msg("b", 2, 0), Some(ack), false, None)
                .await
        );
        drop(durable);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while sink.calls().len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "released");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        p.shutdown(tokio::time::Instant::now() + Duration::from_secs(5))
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_until_the_whole_batch_is_confirmed() {
        let sink = Scripted::new(vec![Reply::Transient, Reply::Transient, Reply::Ok]);
        let stats = SinkStats::default();
        let batch = [msg("a", 1, 10), msg("b", 2, 10)];
        deliver(
            &sink,
            &batch,
            &stats,
            policy(),
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        let calls = sink.calls();
        assert_eq!(calls.len(), 3);
        assert!(calls.iter().all(|c| *c == [entry("a", 1), entry("b", 2)]));
        assert_eq!(stats.errors.load(Ordering::Relaxed), 2);
        assert_eq!(stats.delivered.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_partial_failure_resends_only_the_failed_messages_never_moving_a_key_back() {
        // a@1 and a@2 are the same key: a@1 failed but a@2 was delivered, so a@1 must not be
        // sent again (it would overwrite a@2 downstream). c@4 failed and is re-sent.
        let sink = Scripted::new(vec![Reply::Partial(vec![0, 3]), Reply::Ok]);
        let stats = SinkStats::default();
        let batch = [
            msg("a", 1, 0),
            msg("a", 2, 0),
            msg("b", 3, 0),
            msg("c", 4, 0),
        ];
        deliver(
            &sink,
            &batch,
            &stats,
            policy(),
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        assert_eq!(sink.calls()[1], [entry("c", 4)]);
        assert_eq!(stats.delivered.load(Ordering::Relaxed), 4);
    }

    fn marker() -> Message {
        let r = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
        let synced = kubesink_core::message::Synced {
            namespace: None,
            count: 2,
            resource_version: "9".into(),
            initial: true,
        };
        kubesink_core::message::encode_synced(&r, &synced, "2026-11-30T00:00:00.000Z").unwrap()
    }

    /// The ops of each call's messages.
    fn ops(sink: &Scripted) -> Vec<Vec<String>> {
        sink.calls
            .lock()
            .unwrap()
            .iter()
            .map(|b| {
                b.iter()
                    .map(|m| m["op"].as_str().unwrap().to_owned())
                    .collect()
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_sync_marker_goes_out_only_after_everything_before_it_is_confirmed() {
        // a@1 fails: the marker must not have reached the destination before it.
        let sink = Scripted::new(vec![Reply::Partial(vec![0]), Reply::Ok]);
        let stats = SinkStats::default();
        let batch = [msg("a", 1, 0), msg("b", 2, 0), marker(), msg("c", 3, 0)];
        deliver(
            &sink,
            &batch,
            &stats,
            policy(),
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        assert_eq!(
            ops(&sink),
            [
                vec!["updated", "updated"],
                vec!["updated"],
                vec!["synced", "updated"]
            ]
        );
        assert_eq!(sink.calls.lock().unwrap()[1][0]["name"], "a");
        assert_eq!(stats.delivered.load(Ordering::Relaxed), 4);
        // Within a segment a marker is only ever first; should one be kept behind a failed
        // message, it is re-sent after it.
        let batch = [msg("a", 1, 0), marker()];
        let (keep, _) = retain_failed(&batch, &[None; 2], &[0]);
        assert_eq!(keep.len(), 2);
        let (keep, _) = retain_failed(&batch, &[None; 2], &[]);
        assert!(keep.is_empty());
    }

    /// A message of key `name` with `op` and `uid`.
    fn change_of(name: &str, op: Op, uid: &str, rv: u64) -> Message {
        let r = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
        let object = json!({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "namespace": "ns", "uid": uid}});
        let object = Some(ObjectJson::from_value(&object));
        let change = Change {
            uid: uid.into(),
            resource_version: rv.to_string(),
            ..fixtures::change(op, Some("ns"), name, object)
        };
        encode(&r, &change, "2026-11-30T00:00:00.000Z").unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_delete_of_an_old_uid_is_not_superseded_by_the_new_uids_added() {
        // The deleted of uid 1 failed, the added of uid 2 (a re-created object) went
        // through: the delete is re-sent, then the added again, so the key ends on uid 2.
        let sink = Scripted::new(vec![Reply::Partial(vec![0]), Reply::Ok]);
        let stats = SinkStats::default();
        let batch = [
            change_of("b", Op::Deleted, "u1", 5),
            change_of("b", Op::Added, "u2", 6),
            change_of("c", Op::Updated, "u3", 7),
        ];
        deliver(
            &sink,
            &batch,
            &stats,
            policy(),
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        let calls = sink.calls.lock().unwrap();
        let retried: Vec<(String, String)> = calls[1]
            .iter()
            .map(|m| (m["op"].to_string(), m["uid"].to_string()))
            .collect();
        assert_eq!(
            retried,
            [
                ("\"deleted\"".to_owned(), "\"u1\"".to_owned()),
                ("\"added\"".to_owned(), "\"u2\"".to_owned())
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn too_large_shrinks_to_metadata_then_to_no_object() {
        let sink = Scripted::new(vec![Reply::TooLarge(1), Reply::TooLarge(1), Reply::Ok]);
        let stats = SinkStats::default();
        let batch = [msg("a", 1, 0), msg("big", 2, 5000)];
        let started = tokio::time::Instant::now();
        deliver(
            &sink,
            &batch,
            &stats,
            policy(),
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        let calls = sink.calls.lock().unwrap();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[1][1]["truncated"], true);
        assert!(calls[1][1]["object"].get("spec").is_none());
        assert_eq!(calls[1][1]["object"]["metadata"]["name"], "big");
        assert!(calls[2][1].get("object").is_none());
        assert_eq!(
            calls[2][0]["truncated"],
            Value::Null,
            "the others stay whole"
        );
        assert_eq!(stats.truncated.load(Ordering::Relaxed), 1);
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a shrink is retried at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_known_limit_shrinks_before_the_first_send() {
        let mut sink = Scripted::new(vec![]);
        sink.limit = Some(1000);
        let stats = SinkStats::default();
        deliver(
            &sink,
            &[msg("big", 1, 5000)],
            &stats,
            policy(),
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        let calls = sink.calls();
        assert_eq!(calls, [vec![("big".into(), "1".into(), true)]]);
    }

    #[tokio::test(start_paused = true)]
    async fn fatal_errors_are_retried_at_the_maximum_backoff() {
        let sink = Scripted::new(vec![Reply::Fatal, Reply::Ok]);
        let stats = SinkStats::default();
        let started = tokio::time::Instant::now();
        deliver(
            &sink,
            &[msg("a", 1, 0)],
            &stats,
            policy(),
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert_eq!(sink.calls().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_grows_and_never_exceeds_the_cap() {
        let replies = (0..12)
            .map(|_| Reply::Transient)
            .chain([Reply::Ok])
            .collect();
        let sink = Scripted::new(replies);
        let stats = SinkStats::default();
        let retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let started = tokio::time::Instant::now();
        deliver(
            &sink,
            &[msg("a", 1, 0)],
            &stats,
            retry,
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        // 12 waits, each at most 2 s, the first ones short.
        assert!(
            started.elapsed() <= Duration::from_secs(24),
            "{:?}",
            started.elapsed()
        );
        assert!(
            started.elapsed() >= Duration::from_millis(100 + 200 + 400 + 800),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_shutdown_deadline_cancels_a_hanging_send_and_nothing_counts_as_delivered() {
        let sink = Scripted::new(vec![Reply::Hang]);
        let stats = SinkStats::default();
        let outcome = tokio::time::timeout(
            Duration::from_secs(5),
            deliver(
                &sink,
                &[msg("a", 1, 0)],
                &stats,
                policy(),
                &Fence::open(),
                &mut quiet(),
            ),
        )
        .await;
        assert!(outcome.is_err(), "the deadline ended delivery");
        assert_eq!(stats.delivered.load(Ordering::Relaxed), 0);
        assert_eq!(sink.calls().len(), 1);
    }

    /// The waits between successive sends.
    fn waits(sink: &Scripted) -> Vec<Duration> {
        let at = sink.at.lock().unwrap();
        at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn every_wait_stays_within_the_cap_even_when_the_destination_asks_for_more() {
        let mut replies: Vec<Reply> = (0..30).map(|_| Reply::Transient).collect();
        replies.insert(10, Reply::TransientAfter(Duration::from_secs(600)));
        let sink = Scripted::new(replies);
        let stats = SinkStats::default();
        let cap = Duration::from_secs(2);
        let retry = Backoff::new(Duration::from_millis(100), cap);
        deliver(
            &sink,
            &[msg("a", 1, 0)],
            &stats,
            retry,
            &Fence::open(),
            &mut quiet(),
        )
        .await;
        let w = waits(&sink);
        assert_eq!(w.len(), 31);
        assert!(w.iter().all(|d| *d <= cap), "{w:?}");
        assert!(
            w.iter().filter(|d| **d >= Duration::from_secs(1)).count() > 10,
            "the cap is reached: {w:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_ready_signal_ends_the_backoff_and_starts_it_over() {
        let replies = (0..8).map(|_| Reply::Transient).collect();
        let sink = Arc::new(Scripted::new(replies));
        let stats = Arc::new(SinkStats::default());
        let signal = kubesink_core::ReadySignal::new();
        let mut ready = signal.subscribe();
        // Without jitter: 1 s, 2 s, 4 s, 8 s, then 10 s waits.
        let retry = Backoff::new(Duration::from_secs(1), Duration::from_secs(10)).without_jitter();
        let (s, st) = (sink.clone(), stats.clone());
        let worker = tokio::spawn(async move {
            deliver(
                &*s,
                &[msg("a", 1, 0)],
                &st,
                retry,
                &Fence::open(),
                &mut ready,
            )
            .await;
        });
        // 1 + 2 + 4 + 8 = 15 s of backoff, and 3 s into the 10 s wait: the broker is back.
        tokio::time::sleep(Duration::from_secs(18)).await;
        assert_eq!(sink.at.lock().unwrap().len(), 5);
        signal.notify();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(sink.at.lock().unwrap().len(), 6, "retried at once");
        worker.await.unwrap();
        let w = waits(&sink);
        assert_eq!(w[4], Duration::from_secs(3), "{w:?}");
        // After the wake-up the backoff starts over at 1 s.
        assert_eq!(&w[5..], [1, 2, 4].map(Duration::from_secs), "{w:?}");
        assert_eq!(stats.delivered.load(Ordering::Relaxed), 1);
    }
}
