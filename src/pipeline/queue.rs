//! One sink's keyed, coalescing, bounded queue.
//!
//! States of a change: **pending** (in `pending`, waiting for a batch) → **in flight** (taken
//! by the worker, counted until the sink confirms) → gone. Invariants:
//!
//! - With coalescing, a key has at most one pending change; a newer change replaces it in
//!   place, keeping its position (so the queue's order is the order in which keys first
//!   became pending). A change for a key that is in flight waits as a new pending entry, and
//!   the worker takes the next batch only after the current one is confirmed, so a newer
//!   change never overtakes an older one.
//! - `pending + in flight <= max_pending` changes and, but for a single oversize message,
//!   `<= max_pending_bytes` bytes. A push beyond that waits: this is the backpressure that
//!   stops the informers reading their watch streams.
//! - A sync marker ([`Op::Synced`](kubesink_sinks::Op)) is a barrier: it is never coalesced
//!   (not even with another marker), and a change pushed after it never replaces a change
//!   pending before it (it waits behind the marker as a new entry). So everything queued
//!   before a marker is delivered before it, as it was queued.
//! - Batching: the worker takes one batch at a time, so a batch forms while the previous one
//!   is in flight: everything pending when the sink confirmed is the next batch (up to
//!   `max_batch_events`/`max_batch_bytes`). An idle sink (nothing in flight) waits at most
//!   `linger` after the oldest pending change before taking it; the default, 0, sends at
//!   once. So one change alone is sent without delay, and under load batches grow to what
//!   accumulated during one send, without a timer (measured in `BENCHMARKS.md`).
//! - Acknowledgements: a change may carry an [`Ack`]. The queue settles it once this sink is
//!   done with the change: when the worker completes the batch that carried it (the sink
//!   confirmed it, see `deliver.rs`), or when coalescing replaced it (the newer change carries
//!   the key's state). A change still held when the queue is dropped is never settled.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kubesink_sinks::Message;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Ack;

/// Limits of one queue, from `[pipeline]`.
#[derive(Clone, Debug)]
pub struct QueueLimits {
    /// Coalesce per key.
    pub coalesce: bool,
    /// Changes held (pending + in flight).
    pub max_pending: usize,
    /// Bytes held (pending + in flight).
    pub max_pending_bytes: usize,
    /// Messages per batch.
    pub max_batch_events: usize,
    /// Bytes per batch.
    pub max_batch_bytes: usize,
    /// How long an idle sink waits for more changes after the oldest pending one before it
    /// takes a batch (0: at once). A busy sink's next batch is what accumulated meanwhile.
    pub linger: Duration,
}

struct Slot {
    msg: Message,
    enqueued_at: Instant,
    ack: Option<Ack>,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Slot>,
    /// Key → sequence number of its newest pending slot (coalescing only).
    index: HashMap<Arc<str>, u64>,
    /// Sequence number of `pending[0]`.
    head_seq: u64,
    /// Sequence number of the newest sync marker pushed (a barrier for coalescing).
    barrier: Option<u64>,
    pending_bytes: usize,
    inflight: usize,
    inflight_bytes: usize,
    closed: bool,
}

impl State {
    fn held(&self) -> usize {
        self.pending.len() + self.inflight
    }
    fn held_bytes(&self) -> usize {
        self.pending_bytes + self.inflight_bytes
    }
}

/// A batch taken from the queue; hand it back with [`SinkQueue::complete`].
pub struct Batch {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
    /// Their acknowledgements, settled by [`SinkQueue::complete`].
    acks: Vec<Ack>,
    bytes: usize,
}

/// The queue between the informers and one sink's worker.
pub struct SinkQueue {
    limits: QueueLimits,
    state: Mutex<State>,
    space: Notify,
    data: Notify,
    high_water: AtomicUsize,
    coalesced: AtomicUsize,
}

impl SinkQueue {
    /// An empty queue.
    pub fn new(limits: QueueLimits) -> Self {
        SinkQueue {
            limits,
            state: Mutex::new(State::default()),
            space: Notify::new(),
            data: Notify::new(),
            high_water: AtomicUsize::new(0),
            coalesced: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock would be a bug in this module; the state is still
        // consistent at every await point, so recovering the guard is safe.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a change with its acknowledgement (if any), waiting while the queue is full
    /// (backpressure). Returns `false` if the queue is closed (shutdown), in which case the
    /// message was not queued and `ack` is never settled by this queue.
    pub async fn push(&self, msg: Message, ack: Option<Ack>) -> bool {
        let mut item = Some((msg, ack));
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.closed {
                    return false;
                }
                let Some((m, a)) = item.take() else {
                    return false;
                };
                match self.try_push(&mut st, m, a) {
                    Ok(replaced) => {
                        drop(st);
                        if let Some(old) = replaced {
                            old.settle();
                        }
                        self.data.notify_one();
                        return true;
                    }
                    Err(back) => item = Some(back),
                }
            }
            notified.await;
        }
    }

    /// Queues `msg` or gives it back when the queue is full. `Ok(Some(ack))`: the message
    /// replaced a pending one, whose acknowledgement the caller settles (outside the lock).
    #[allow(clippy::type_complexity)] // (message, ack) handed back as it came
    fn try_push(
        &self,
        st: &mut State,
        msg: Message,
        ack: Option<Ack>,
    ) -> Result<Option<Ack>, (Message, Option<Ack>)> {
        let size = msg.size();
        let marker = msg.meta.op.is_marker();
        if self.limits.coalesce && !marker {
            if let Some(&seq) = st.index.get(&msg.key) {
                let pos = usize::try_from(seq - st.head_seq).unwrap_or(usize::MAX);
                let behind_barrier = st.barrier.is_some_and(|b| b > seq);
                if let (Some(slot), false) = (st.pending.get_mut(pos), behind_barrier) {
                    let old = std::mem::replace(&mut slot.msg, msg);
                    let old_ack = std::mem::replace(&mut slot.ack, ack);
                    st.pending_bytes = st.pending_bytes - old.size() + size;
                    self.coalesced.fetch_add(1, Ordering::Relaxed);
                    return Ok(old_ack);
                }
            }
        }
        let empty = st.held() == 0;
        if !empty
            && (st.held() >= self.limits.max_pending
                || st.held_bytes() + size > self.limits.max_pending_bytes)
        {
            return Err((msg, ack));
        }
        let seq = st.head_seq + st.pending.len() as u64;
        if marker {
            st.barrier = Some(seq);
        } else if self.limits.coalesce {
            st.index.insert(msg.key.clone(), seq);
        }
        st.pending_bytes += size;
        st.pending.push_back(Slot {
            msg,
            enqueued_at: Instant::now(),
            ack,
        });
        self.high_water.fetch_max(st.held(), Ordering::Relaxed);
        Ok(None)
    }

    /// Waits for the next batch; the worker calls it when its previous batch is confirmed,
    /// so nothing of this sink is in flight. Whatever is pending is taken at once when it
    /// fills a batch (`max_batch_events`, `max_batch_bytes`), when the queue is full (waiting
    /// longer would only stall the informers), at shutdown, or once the oldest pending change
    /// has waited `linger` (default 0: at once). Returns `None` once the queue is closed and
    /// drained.
    pub async fn next_batch(&self) -> Option<Batch> {
        loop {
            let notified = self.data.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let deadline = {
                let mut st = self.lock();
                match st.pending.front() {
                    None if st.closed => return None,
                    None => None,
                    Some(front) => {
                        let due = front.enqueued_at + self.limits.linger;
                        let full = st.held() >= self.limits.max_pending
                            || st.held_bytes() >= self.limits.max_pending_bytes;
                        if st.closed
                            || full
                            || st.pending.len() >= self.limits.max_batch_events
                            || st.pending_bytes >= self.limits.max_batch_bytes
                            || Instant::now() >= due
                        {
                            return Some(self.take(&mut st));
                        }
                        Some(due)
                    }
                }
            };
            match deadline {
                Some(due) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(due) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    fn take(&self, st: &mut State) -> Batch {
        let mut messages = Vec::new();
        let mut acks = Vec::new();
        let mut bytes = 0;
        while let Some(front) = st.pending.front() {
            let size = front.msg.size();
            if !messages.is_empty()
                && (messages.len() >= self.limits.max_batch_events
                    || bytes + size > self.limits.max_batch_bytes)
            {
                break;
            }
            let Some(slot) = st.pending.pop_front() else {
                break;
            };
            let seq = st.head_seq;
            st.head_seq += 1;
            if self.limits.coalesce && st.index.get(&slot.msg.key) == Some(&seq) {
                st.index.remove(&slot.msg.key);
            }
            bytes += size;
            messages.push(slot.msg);
            acks.extend(slot.ack);
        }
        st.pending_bytes -= bytes;
        st.inflight += messages.len();
        st.inflight_bytes += bytes;
        Batch {
            messages,
            acks,
            bytes,
        }
    }

    /// Releases a batch the sink confirmed and settles its acknowledgements. Only for a
    /// confirmed batch: a batch the worker gave up on (shutdown) is never completed.
    pub fn complete(&self, batch: Batch) {
        {
            let mut st = self.lock();
            st.inflight -= batch.messages.len();
            st.inflight_bytes -= batch.bytes;
        }
        self.space.notify_waiters();
        self.data.notify_one();
        for ack in batch.acks {
            ack.settle();
        }
    }

    /// Stops accepting pushes; the worker drains what is pending without lingering.
    pub fn close(&self) {
        self.lock().closed = true;
        self.space.notify_waiters();
        self.data.notify_one();
    }

    /// Changes held now (pending + in flight).
    pub fn held(&self) -> usize {
        self.lock().held()
    }

    /// Bytes held now (pending + in flight).
    pub fn held_bytes(&self) -> usize {
        self.lock().held_bytes()
    }

    /// The most changes ever held at once.
    pub fn high_water(&self) -> usize {
        self.high_water.load(Ordering::Relaxed)
    }

    /// Changes replaced by a newer change for the same key.
    pub fn coalesced(&self) -> usize {
        self.coalesced.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Settle;
    use bytes::Bytes;
    use kubesink_sinks::{MessageMeta, Op, Resource};

    fn msg(key: &str, payload: &str) -> Message {
        Message {
            key: key.into(),
            payload: Bytes::from(payload.to_owned()),
            meta: Arc::new(MessageMeta {
                id: "0".into(),
                op: Op::Added,
                resource: Arc::new(Resource::new("c", "", "v1", "Pod", "pods", true)),
                namespace: None,
                name: key.into(),
            }),
        }
    }

    fn limits(coalesce: bool, max_pending: usize) -> QueueLimits {
        QueueLimits {
            coalesce,
            max_pending,
            max_pending_bytes: 1 << 20,
            max_batch_events: 100,
            max_batch_bytes: 1 << 20,
            linger: Duration::from_millis(5),
        }
    }

    fn payloads(b: &Batch) -> Vec<String> {
        b.messages
            .iter()
            .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
            .collect()
    }

    #[tokio::test]
    async fn newer_change_replaces_pending_one_in_place() {
        let q = SinkQueue::new(limits(true, 10));
        assert!(q.push(msg("a", "a1"), None).await);
        assert!(q.push(msg("b", "b1"), None).await);
        assert!(q.push(msg("a", "a2"), None).await);
        let b = q.next_batch().await.unwrap();
        assert_eq!(payloads(&b), ["a2", "b1"]);
        assert_eq!(q.coalesced(), 1);
    }

    #[tokio::test]
    async fn change_for_in_flight_key_waits_for_the_next_batch() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(msg("a", "a1"), None).await;
        let first = q.next_batch().await.unwrap();
        q.push(msg("a", "a2"), None).await;
        assert_eq!(q.held(), 2);
        q.complete(first);
        let second = q.next_batch().await.unwrap();
        assert_eq!(payloads(&second), ["a2"]);
    }

    #[tokio::test]
    async fn without_coalescing_every_change_is_kept_in_order() {
        let q = SinkQueue::new(limits(false, 10));
        for p in ["a1", "a2", "a3"] {
            q.push(msg("a", p), None).await;
        }
        assert_eq!(payloads(&q.next_batch().await.unwrap()), ["a1", "a2", "a3"]);
    }

    #[tokio::test]
    async fn push_waits_while_full_and_resumes_after_complete() {
        let q = Arc::new(SinkQueue::new(limits(true, 2)));
        q.push(msg("a", "1"), None).await;
        q.push(msg("b", "1"), None).await;
        let q2 = q.clone();
        let blocked = tokio::spawn(async move { q2.push(msg("c", "1"), None).await });
        tokio::task::yield_now().await;
        assert!(!blocked.is_finished());
        let batch = q.next_batch().await.unwrap();
        assert_eq!(batch.messages.len(), 2);
        assert!(!blocked.is_finished(), "in-flight changes still count");
        q.complete(batch);
        assert!(tokio::time::timeout(Duration::from_secs(5), blocked)
            .await
            .unwrap()
            .unwrap());
        assert_eq!(q.high_water(), 2);
    }

    #[tokio::test]
    async fn batches_close_on_event_and_byte_limits() {
        let mut l = limits(true, 100);
        l.max_batch_events = 2;
        l.max_batch_bytes = 1 << 20;
        let q = SinkQueue::new(l);
        for k in ["a", "b", "c"] {
            q.push(msg(k, "x"), None).await;
        }
        assert_eq!(q.next_batch().await.unwrap().messages.len(), 2);
        let mut l = limits(true, 100);
        l.max_batch_bytes = 5;
        let q = SinkQueue::new(l);
        for k in ["a", "b", "c"] {
            q.push(msg(k, "xx"), None).await; // 3 bytes each
        }
        assert_eq!(q.next_batch().await.unwrap().messages.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_sink_gets_a_lone_change_at_once_and_a_busy_one_what_accumulated() {
        let mut l = limits(true, 100);
        l.linger = Duration::ZERO;
        let q = SinkQueue::new(l);
        q.push(msg("a", "a1"), None).await;
        let start = Instant::now();
        let first = q.next_batch().await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO, "no timer waited out");
        assert_eq!(payloads(&first), ["a1"]);
        // While `first` is in flight, changes accumulate; they are the next batch.
        for k in ["b", "c", "d"] {
            q.push(msg(k, "2"), None).await;
        }
        q.complete(first);
        let second = q.next_batch().await.unwrap();
        assert_eq!(payloads(&second), ["2", "2", "2"]);
        assert_eq!(start.elapsed(), Duration::ZERO);
        // With a linger, an idle sink waits that long after the oldest pending change.
        let q = SinkQueue::new(limits(true, 100));
        q.push(msg("a", "a1"), None).await;
        let start = Instant::now();
        q.next_batch().await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(5));
    }

    fn marker(key: &str) -> Message {
        let mut m = msg(key, "sync");
        m.meta = Arc::new(MessageMeta {
            op: Op::Synced,
            ..(*m.meta).clone()
        });
        m
    }

    /// Counts settlements.
    #[derive(Default)]
    struct Counter(std::sync::atomic::AtomicUsize);
    impl Settle for Counter {
        fn settle(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn settled(c: &Arc<Counter>) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_marker_is_never_coalesced_and_no_change_moves_before_it() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(msg("a", "a1"), None).await;
        q.push(marker("m"), None).await;
        q.push(marker("m"), None).await;
        // a2 may not replace a1: it would then be delivered before the markers.
        q.push(msg("a", "a2"), None).await;
        // a3 replaces a2, which is behind the last marker.
        q.push(msg("a", "a3"), None).await;
        let b = q.next_batch().await.unwrap();
        assert_eq!(payloads(&b), ["a1", "sync", "sync", "a3"]);
        assert_eq!(q.coalesced(), 1);
    }

    #[tokio::test]
    async fn acks_settle_on_completion_or_replacement_never_on_close() {
        let q = SinkQueue::new(limits(true, 10));
        let (a1, a2, b1) = (
            Arc::new(Counter::default()),
            Arc::new(Counter::default()),
            Arc::new(Counter::default()),
        );
        q.push(msg("a", "a1"), Some(a1.clone())).await;
        q.push(msg("a", "a2"), Some(a2.clone())).await;
        assert_eq!(settled(&a1), 1, "replaced: a2 carries the key's state");
        let batch = q.next_batch().await.unwrap();
        assert_eq!(settled(&a2), 0, "in flight is not confirmed");
        q.complete(batch);
        assert_eq!(settled(&a2), 1);
        q.push(msg("b", "b1"), Some(b1.clone())).await;
        let _abandoned = q.next_batch().await.unwrap();
        q.close();
        assert!(!q.push(msg("c", "c1"), Some(b1.clone())).await);
        drop(q);
        assert_eq!(settled(&b1), 0, "never confirmed, never settled");
    }

    #[tokio::test]
    async fn close_drains_then_ends() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(msg("a", "1"), None).await;
        q.close();
        assert!(!q.push(msg("b", "1"), None).await);
        let b = q.next_batch().await.unwrap();
        q.complete(b);
        assert!(q.next_batch().await.is_none());
    }
}
