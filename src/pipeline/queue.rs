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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kubesink_sinks::Message;
use tokio::sync::Notify;
use tokio::time::Instant;

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
    /// Time a batch may wait for more messages after its first one was queued.
    pub linger: Duration,
}

struct Slot {
    msg: Message,
    enqueued_at: Instant,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Slot>,
    /// Key → sequence number of its pending slot (coalescing only).
    index: HashMap<Arc<str>, u64>,
    /// Sequence number of `pending[0]`.
    head_seq: u64,
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
#[derive(Debug)]
pub struct Batch {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
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

    /// Queues a change, waiting while the queue is full (backpressure). Returns `false` if the
    /// queue is closed (shutdown), in which case the message was not queued.
    pub async fn push(&self, msg: Message) -> bool {
        let mut msg = Some(msg);
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.closed {
                    return false;
                }
                let Some(m) = msg.take() else { return false };
                match self.try_push(&mut st, m) {
                    Ok(()) => {
                        drop(st);
                        self.data.notify_one();
                        return true;
                    }
                    Err(m) => msg = Some(m),
                }
            }
            notified.await;
        }
    }

    fn try_push(&self, st: &mut State, msg: Message) -> Result<(), Message> {
        let size = msg.size();
        if self.limits.coalesce {
            if let Some(&seq) = st.index.get(&msg.key) {
                let pos = usize::try_from(seq - st.head_seq).unwrap_or(usize::MAX);
                if let Some(slot) = st.pending.get_mut(pos) {
                    let old = std::mem::replace(&mut slot.msg, msg);
                    st.pending_bytes = st.pending_bytes - old.size() + size;
                    self.coalesced.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
            }
        }
        let empty = st.held() == 0;
        if !empty
            && (st.held() >= self.limits.max_pending
                || st.held_bytes() + size > self.limits.max_pending_bytes)
        {
            return Err(msg);
        }
        if self.limits.coalesce {
            let seq = st.head_seq + st.pending.len() as u64;
            st.index.insert(msg.key.clone(), seq);
        }
        st.pending_bytes += size;
        st.pending.push_back(Slot {
            msg,
            enqueued_at: Instant::now(),
        });
        self.high_water.fetch_max(st.held(), Ordering::Relaxed);
        Ok(())
    }

    /// Waits for the next batch: it closes at `max_batch_events`, `max_batch_bytes`, when the
    /// oldest pending change has waited `linger`, when the queue is full (waiting longer
    /// would only stall the informers), or at shutdown. Returns `None` once the queue is
    /// closed and drained.
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
        }
        st.pending_bytes -= bytes;
        st.inflight += messages.len();
        st.inflight_bytes += bytes;
        Batch { messages, bytes }
    }

    /// Releases a batch the sink confirmed (or the worker gave up on at shutdown).
    pub fn complete(&self, batch: Batch) {
        {
            let mut st = self.lock();
            st.inflight -= batch.messages.len();
            st.inflight_bytes -= batch.bytes;
        }
        self.space.notify_waiters();
        self.data.notify_one();
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
        assert!(q.push(msg("a", "a1")).await);
        assert!(q.push(msg("b", "b1")).await);
        assert!(q.push(msg("a", "a2")).await);
        let b = q.next_batch().await.unwrap();
        assert_eq!(payloads(&b), ["a2", "b1"]);
        assert_eq!(q.coalesced(), 1);
    }

    #[tokio::test]
    async fn change_for_in_flight_key_waits_for_the_next_batch() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(msg("a", "a1")).await;
        let first = q.next_batch().await.unwrap();
        q.push(msg("a", "a2")).await;
        assert_eq!(q.held(), 2);
        q.complete(first);
        let second = q.next_batch().await.unwrap();
        assert_eq!(payloads(&second), ["a2"]);
    }

    #[tokio::test]
    async fn without_coalescing_every_change_is_kept_in_order() {
        let q = SinkQueue::new(limits(false, 10));
        for p in ["a1", "a2", "a3"] {
            q.push(msg("a", p)).await;
        }
        assert_eq!(payloads(&q.next_batch().await.unwrap()), ["a1", "a2", "a3"]);
    }

    #[tokio::test]
    async fn push_waits_while_full_and_resumes_after_complete() {
        let q = Arc::new(SinkQueue::new(limits(true, 2)));
        q.push(msg("a", "1")).await;
        q.push(msg("b", "1")).await;
        let q2 = q.clone();
        let blocked = tokio::spawn(async move { q2.push(msg("c", "1")).await });
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
            q.push(msg(k, "x")).await;
        }
        assert_eq!(q.next_batch().await.unwrap().messages.len(), 2);
        let mut l = limits(true, 100);
        l.max_batch_bytes = 5;
        let q = SinkQueue::new(l);
        for k in ["a", "b", "c"] {
            q.push(msg(k, "xx")).await; // 3 bytes each
        }
        assert_eq!(q.next_batch().await.unwrap().messages.len(), 1);
    }

    #[tokio::test]
    async fn close_drains_then_ends() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(msg("a", "1")).await;
        q.close();
        assert!(!q.push(msg("b", "1")).await);
        let b = q.next_batch().await.unwrap();
        q.complete(b);
        assert!(q.next_batch().await.is_none());
    }
}
