//! One sink's keyed, coalescing, bounded queue.
//!
//! States of a change: **pending** (in `pending`, waiting for a batch) → **in flight** (taken
//! by the worker, counted until the sink confirms) → gone. Invariants:
//!
//! - With coalescing, a key has at most one pending change per uid; a newer change replaces
//!   it in place, keeping its position (so the queue's order is the order in which keys first
//!   became pending). A change for a key that is in flight waits as a new pending entry, and
//!   the worker takes the next batch only after the current one is confirmed (with a window
//!   above 1: the next batch leaves that entry pending until its key's batch is confirmed),
//!   so a newer change never overtakes an older one.
//! - Coalescing never merges across a uid change: a change whose uid differs from the key's
//!   pending one (a re-created object: the old uid's inferred `deleted`, then the new uid's
//!   `added`) waits behind it as a new entry, so both arrive, in order.
//! - Cancellation: a `deleted` whose key's pending change is *fresh* (it began as an `added`
//!   that was never delivered, possibly replaced since by `updated`s of the same uid, so what
//!   the sink last received of the key says "absent") removes that change and is not queued
//!   either: nothing of the pair is sent. An `added` pushed as one a destination may already
//!   hold (`may_be_held`: re-sent after a restart, a crash or a hand-over, or from a
//!   process's first list, see `Change::may_be_held`) is never fresh: a `deleted` replaces
//!   it, so the destination learns of the delete (cancelling it left ghosts after a crash). A pending `updated` or `deleted` chain is not fresh,
//!   and a `deleted` then replaces it as usual. Both acknowledgements are settled at once
//!   (the acknowledged state ends with the key absent, as it was before the `added`).
//! - `pending + in flight <= max_pending` changes and, but for a single oversize message,
//!   `<= max_pending_bytes` bytes. A push beyond that waits: this is the backpressure that
//!   stops the informers reading their watch streams.
//! - A sync marker ([`Op::Synced`](kubesink_core::Op)) is a barrier: it is never coalesced
//!   (not even with another marker), and a change pushed after it never replaces a change
//!   pending before it (it waits behind the marker as a new entry). So everything queued
//!   before a marker is delivered before it, as it was queued.
//! - Batching: the worker takes one batch at a time, so a batch forms while the previous one
//!   is in flight: everything pending when the sink confirmed is the next batch (up to
//!   `max_batch_events`/`max_batch_bytes`). An idle sink (nothing in flight) waits at most
//!   `linger` after the oldest pending change before taking it; the default, 0, sends at
//!   once. So one change alone is sent without delay, and under load batches grow to what
//!   accumulated during one send, without a timer (measured in `BENCHMARKS.md`).
//! - Several batches in flight (a sink whose `max_batches_in_flight` is above 1: JetStream,
//!   so that PubAcks keep flowing while the next batch is published): the worker may take a
//!   batch while up to `window - 1` others are unconfirmed. Per-key order still holds
//!   because a key is in at most one batch in flight: a change whose key is in flight stays
//!   pending, in place, until that batch is confirmed (retries included), so a key's next
//!   change is never sent before its previous one is confirmed, and a failed send makes
//!   every later change of that key wait. Changes behind it of other keys are taken (their
//!   slots become holes). Sync markers keep their barrier: a marker is taken only when no
//!   batch is in flight and nothing before it was skipped, and nothing is taken while a
//!   batch with a marker is in flight. With a window of 1 this is the one-batch-at-a-time
//!   rule above.
//! - Rate per class ([`Throttle`]: events mode's `reason_rate_limit`, docs/events.md): a
//!   change pushed with a throttle is taken only when its class's rate allows (GCRA,
//!   `governor`, one limiter per class and queue: each destination has its own budget). One
//!   the rate holds back stays pending, in place, like a change whose key is in flight: the
//!   changes behind it of other keys and classes are taken, a later change of its key
//!   coalesces into it (counted in [`SinkQueue::rate_folded`]: an Event's occurrences add
//!   up), a change of its key that cannot coalesce waits behind it, and a sync marker waits
//!   for it. A full queue, or a closed one, takes everything whatever the rate: the limit
//!   never holds memory beyond the queue's bounds, nor a shutdown.
//! - Acknowledgements: a change may carry an [`Ack`]. The queue settles it once this sink is
//!   done with the change: when the worker completes the batch that carried it (the sink
//!   confirmed it, see `deliver.rs`), when coalescing replaced it (the newer change carries
//!   the key's state), or when it was cancelled with its `deleted`. A change still held when
//!   the queue is dropped is never settled.

use std::collections::{HashMap, HashSet, VecDeque};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kubesink_core::{Message, Op};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::ack::{Ack, WriteAhead};

/// Limits of one queue, from `[pipeline]` (and the sink's [`Sink::max_batches_in_flight`]).
///
/// [`Sink::max_batches_in_flight`]: kubesink_core::Sink::max_batches_in_flight
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
    /// Batches the worker may have in flight at once (at least 1). Above 1 the queue keeps
    /// per-key order across them: see "Several batches in flight" in the module docs.
    pub window: usize,
}

/// The rate a change's class is held to in a queue: at most `per_second` changes of `class`
/// a second, in bursts of as many (events mode's `reason_rate_limit`: the class is the
/// resource and the Event's reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Throttle {
    /// The limiter: one per resource and rate (`{cluster}/{group}/{kind}/{per_second}`).
    pub limiter: Arc<str>,
    /// The class within it (the Event's reason).
    pub class: Arc<str>,
    /// Changes a second (and the burst).
    pub per_second: NonZeroU32,
}

/// Classes a limiter keeps before it forgets the idle ones (an idle class is as if new).
const LIMITER_CLASSES: usize = 4096;

type Limiter = governor::RateLimiter<
    Arc<str>,
    governor::state::keyed::DefaultKeyedStateStore<Arc<str>>,
    governor::clock::DefaultClock,
>;

struct Slot {
    msg: Message,
    /// The rate this change is held to (see [`Throttle`]); `None`: none. Boxed: most
    /// changes have none, and a slot's size is paid `max_pending` times while a queue that
    /// filled keeps its capacity.
    throttle: Option<Box<Throttle>>,
    /// The rate held it back at least once: a change coalesced into it is counted as folded.
    held_back: bool,
    enqueued_at: Instant,
    ack: Option<Ack>,
    /// The change began as an `added` (coalesced `updated`s keep it so): a `deleted` of the
    /// same uid cancels it.
    fresh: bool,
    /// Cancelled: a hole that [`SinkQueue::take`] skips (never the front of `pending`).
    cancelled: bool,
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
    /// Cancelled slots still in `pending` (holes, so sequence numbers stay positions).
    holes: usize,
    inflight: usize,
    inflight_bytes: usize,
    /// Batches taken and not yet completed.
    inflight_batches: usize,
    /// Of those, the batches that carry a sync marker.
    inflight_markers: usize,
    /// With a window above 1: key → its messages in flight (a key here is not taken again
    /// until its batch is complete).
    inflight_keys: HashMap<Arc<str>, u32>,
    /// The rate limiters of the throttled classes, by [`Throttle::limiter`].
    limiters: HashMap<Arc<str>, Limiter>,
    /// When the earliest change the rate held back in the last [`SinkQueue::take`] may go.
    next_ready: Option<Instant>,
    closed: bool,
}

impl State {
    fn held(&self) -> usize {
        self.pending.len() - self.holes + self.inflight
    }

    /// Drops cancelled slots from the front, so the front is always a real change, and from
    /// the back (the usual case: the cancelled `added` was the newest entry).
    fn trim_holes(&mut self) {
        while self.pending.front().is_some_and(|s| s.cancelled) {
            self.pending.pop_front();
            self.head_seq += 1;
            self.holes -= 1;
        }
        while self.pending.back().is_some_and(|s| s.cancelled) {
            self.pending.pop_back();
            self.holes -= 1;
        }
    }

    /// Removes every hole once they are more than half of `pending` (and more than a few),
    /// renumbering the index and the barrier: holes are not counted against `max_pending`,
    /// so without this a stalled sink behind a stream of created-and-deleted objects (short
    /// Jobs' pods) would grow `pending` without bound. Amortized O(1) per cancellation.
    fn compact_if_sparse(&mut self) {
        if self.holes <= 32 || self.holes * 2 <= self.pending.len() {
            return;
        }
        let old = std::mem::take(&mut self.pending);
        for (was, slot) in (self.head_seq..).zip(old) {
            let now = self.head_seq + self.pending.len() as u64;
            if slot.cancelled {
                continue;
            }
            if self.index.get(&slot.msg.key) == Some(&was) {
                self.index.insert(slot.msg.key.clone(), now);
            }
            if self.barrier == Some(was) {
                self.barrier = Some(now);
            }
            self.pending.push_back(slot);
        }
        self.holes = 0;
    }
    fn held_bytes(&self) -> usize {
        self.pending_bytes + self.inflight_bytes
    }

    /// Gives back the room a burst left once nothing is held: an initial list into a sink
    /// slower than the list fills the queue to `max_pending` slots (and the coalescing index
    /// to as many keys), and a `VecDeque` or a map keeps its capacity when emptied: at the
    /// default 10,000, ~1 MB of slots (about 100 bytes each) and ~0.4 MB of index per sink,
    /// for the life of the process (computed; a fast sink, as the simulator's memory
    /// benchmark's stdout, never fills it: `benches/memory-floor.sh` at 100,000 Pods showed
    /// no difference). Only above [`SHRINK_ABOVE`]: a queue that never grew that far (steady
    /// traffic) is not reallocated.
    fn shrink_if_drained(&mut self) {
        if self.inflight > 0 || !self.pending.is_empty() {
            return;
        }
        if self.pending.capacity() > SHRINK_ABOVE {
            self.pending = VecDeque::new();
        }
        if self.index.is_empty() && self.index.capacity() > SHRINK_ABOVE {
            self.index = HashMap::new();
        }
        if self.inflight_keys.is_empty() && self.inflight_keys.capacity() > SHRINK_ABOVE {
            self.inflight_keys = HashMap::new();
        }
    }
}

/// Slots (and index entries) a drained queue may keep without giving them back.
const SHRINK_ABOVE: usize = 1024;

/// What a push made final: the acknowledgements of the change it replaced, or of both
/// changes of a cancelled pair, and whether it freed room (a cancelled pair releases the
/// `added`'s place).
#[derive(Default)]
struct Done {
    acks: [Option<Ack>; 2],
    freed: bool,
}

/// A batch taken from the queue; hand it back with [`SinkQueue::complete`].
pub struct Batch {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
    /// Their acknowledgements, settled by [`SinkQueue::complete`].
    acks: Vec<Ack>,
    bytes: usize,
    /// It carries a sync marker.
    marker: bool,
}

impl Batch {
    /// The write-ahead positions the batch must wait for before it is sent: the highest of
    /// each log (see [`WriteAhead`]), usually one.
    pub fn write_ahead(&self) -> Vec<WriteAhead> {
        let mut points: Vec<WriteAhead> = Vec::new();
        for p in self.acks.iter().filter_map(|a| a.write_ahead()) {
            match points.iter_mut().find(|q| q.same_log(p)) {
                Some(q) if q.position() < p.position() => *q = p.clone(),
                Some(_) => {}
                None => points.push(p.clone()),
            }
        }
        points
    }
}

/// The queue between the informers and one sink's worker.
pub struct SinkQueue {
    limits: QueueLimits,
    state: Mutex<State>,
    space: Notify,
    data: Notify,
    high_water: AtomicUsize,
    /// The most batches ever in flight at once.
    batches_high_water: AtomicUsize,
    coalesced: AtomicUsize,
    /// Changes coalesced into a change its class's rate held back.
    rate_folded: AtomicUsize,
    /// Times a change was held back by its class's rate (once per change).
    rate_held: AtomicUsize,
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
            batches_high_water: AtomicUsize::new(0),
            coalesced: AtomicUsize::new(0),
            rate_folded: AtomicUsize::new(0),
            rate_held: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock would be a bug in this module; the state is still
        // consistent at every await point, so recovering the guard is safe.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a change with its acknowledgement (if any), waiting while the queue is full
    /// (backpressure). `may_be_held`: for an `added`, a destination may already hold it, so
    /// a later `deleted` never cancels it (see the module docs). Returns `false` if the queue
    /// is closed (shutdown), in which case the message was not queued and `ack` is never
    /// settled by this queue. `throttle`: the rate the change is held to (see [`Throttle`]).
    pub async fn push_change(
        &self,
        msg: Message,
        ack: Option<Ack>,
        may_be_held: bool,
        throttle: Option<Throttle>,
    ) -> bool {
        let mut item = Some((msg, ack, throttle));
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.closed {
                    return false;
                }
                let Some((m, a, t)) = item.take() else {
                    return false;
                };
                match self.try_push(&mut st, m, a, may_be_held, t) {
                    Ok(done) => {
                        drop(st);
                        for ack in done.acks.into_iter().flatten() {
                            ack.settle();
                        }
                        self.data.notify_one();
                        if done.freed {
                            self.space.notify_waiters();
                        }
                        return true;
                    }
                    Err(back) => item = Some(back),
                }
            }
            notified.await;
        }
    }

    /// Queues `msg` or gives it back when the queue is full. `Ok(acks)`: the message was
    /// queued, or coalesced into a pending one, or cancelled with it; `acks` are the
    /// acknowledgements of what will never be sent (replaced or cancelled), which the caller
    /// settles outside the lock.
    #[allow(clippy::type_complexity)] // (message, ack, throttle) handed back as it came
    fn try_push(
        &self,
        st: &mut State,
        msg: Message,
        ack: Option<Ack>,
        may_be_held: bool,
        throttle: Option<Throttle>,
    ) -> Result<Done, (Message, Option<Ack>, Option<Throttle>)> {
        let size = msg.size();
        let marker = msg.meta.op.is_marker();
        if self.limits.coalesce && !marker {
            if let Some(&seq) = st.index.get(&msg.key) {
                let pos = usize::try_from(seq - st.head_seq).unwrap_or(usize::MAX);
                let behind_barrier = st.barrier.is_some_and(|b| b > seq);
                match st.pending.get_mut(pos) {
                    // A re-created object (another uid) never merges: it queues behind. Nor does
                    // an Event's deletion: the occurrences before it were facts, not state.
                    Some(slot)
                        if !behind_barrier
                            && slot.msg.meta.uid == msg.meta.uid
                            && !(msg.meta.resource.events && msg.meta.op == Op::Deleted) =>
                    {
                        if msg.meta.op == Op::Deleted && slot.fresh {
                            // `added` (+ `updated`s) then `deleted`, none delivered: the sink
                            // never learns of the key, as if it had never existed.
                            slot.cancelled = true;
                            let old_ack = slot.ack.take();
                            st.pending_bytes -= slot.msg.size();
                            slot.msg.payload = bytes::Bytes::new(); // a hole holds no payload
                            st.holes += 1;
                            st.index.remove(&msg.key);
                            st.trim_holes();
                            st.compact_if_sparse();
                            self.coalesced.fetch_add(2, Ordering::Relaxed);
                            return Ok(Done {
                                acks: [old_ack, ack],
                                freed: true,
                            });
                        }
                        if slot.held_back {
                            self.rate_folded.fetch_add(1, Ordering::Relaxed);
                        }
                        let msg =
                            coalesced_occurrences(&slot.msg, coalesced_changed(&slot.msg, msg));
                        let size = msg.size();
                        let old = std::mem::replace(&mut slot.msg, msg);
                        let old_ack = std::mem::replace(&mut slot.ack, ack);
                        st.pending_bytes = st.pending_bytes - old.size() + size;
                        self.coalesced.fetch_add(1, Ordering::Relaxed);
                        return Ok(Done {
                            acks: [old_ack, None],
                            freed: false,
                        });
                    }
                    _ => {}
                }
            }
        }
        let empty = st.held() == 0;
        if !empty
            && (st.held() >= self.limits.max_pending
                || st.held_bytes() + size > self.limits.max_pending_bytes)
        {
            return Err((msg, ack, throttle));
        }
        let seq = st.head_seq + st.pending.len() as u64;
        if marker {
            st.barrier = Some(seq);
        } else if self.limits.coalesce {
            st.index.insert(msg.key.clone(), seq);
        }
        st.pending_bytes += size;
        let fresh = msg.meta.op == Op::Added && !may_be_held;
        st.pending.push_back(Slot {
            msg,
            throttle: throttle.map(Box::new),
            held_back: false,
            enqueued_at: Instant::now(),
            ack,
            fresh,
            cancelled: false,
        });
        self.high_water.fetch_max(st.held(), Ordering::Relaxed);
        Ok(Done::default())
    }

    /// Waits for the next batch. With a window of 1 the worker calls it when its previous
    /// batch is confirmed, so nothing of this sink is in flight; with a larger window, while
    /// up to `window - 1` batches are (the batch then leaves out the keys they carry, see
    /// the module docs). Whatever is pending is taken at once when it fills a batch
    /// (`max_batch_events`, `max_batch_bytes`), when the queue is full (waiting longer would
    /// only stall the informers), at shutdown, or once the oldest pending change has waited
    /// `linger` (default 0: at once). Returns `None` once the queue is closed and drained.
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
                            let batch = self.take(&mut st);
                            if !batch.messages.is_empty() {
                                return Some(batch);
                            }
                            // Everything pending waits for a batch in flight (its key, or
                            // a marker's barrier): `complete` wakes this; or for its class's
                            // rate: the earliest time it allows wakes it.
                            st.next_ready
                        } else {
                            Some(due)
                        }
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

    /// Takes the next batch from `pending`, oldest first. With a window above 1 it skips
    /// (leaving them pending, in place) the changes whose key is in another batch in
    /// flight, takes nothing while a batch with a marker is in flight, and stops at a marker
    /// unless nothing is in flight and nothing was skipped. May return an empty batch then.
    fn take(&self, st: &mut State) -> Batch {
        let pipelined = self.limits.window > 1;
        let mut messages = Vec::new();
        let mut acks = Vec::new();
        let mut bytes = 0;
        let mut marker = false;
        let mut taken_from_middle = false;
        if pipelined && st.inflight_markers > 0 {
            return Batch {
                messages,
                acks,
                bytes,
                marker,
            };
        }
        // Position in `pending` of the first slot not yet looked at: 0 until a slot is
        // skipped (taken slots are popped from the front), then it walks on.
        let mut at = 0;
        let mut skipped = false;
        let mut taken_keys: Vec<Arc<str>> = Vec::new();
        // The rate holds nothing back in a full or closed queue (module docs).
        let rated = !st.closed
            && st.held() < self.limits.max_pending
            && st.held_bytes() < self.limits.max_pending_bytes;
        // Keys of changes the rate held back: their later changes wait behind them.
        let mut held_keys: HashSet<Arc<str>> = HashSet::new();
        st.next_ready = None;
        while let Some(slot) = st.pending.get(at) {
            if slot.cancelled {
                if at == 0 {
                    st.trim_holes();
                } else {
                    at += 1;
                }
                continue;
            }
            let is_marker = slot.msg.meta.op.is_marker();
            if is_marker && skipped {
                break;
            }
            if pipelined {
                if is_marker && st.inflight_batches > 0 {
                    break;
                }
                if !is_marker && st.inflight_keys.contains_key(&slot.msg.key) {
                    skipped = true;
                    at += 1;
                    continue;
                }
            }
            if !held_keys.is_empty() && held_keys.contains(&slot.msg.key) {
                skipped = true;
                at += 1;
                continue;
            }
            let size = slot.msg.size();
            if !messages.is_empty()
                && (messages.len() >= self.limits.max_batch_events
                    || bytes + size > self.limits.max_batch_bytes)
            {
                break;
            }
            let wait = match (rated, slot.throttle.as_deref()) {
                (true, Some(t)) => rate_wait(&mut st.limiters, t),
                _ => None,
            };
            if let Some(wait) = wait {
                let ready = Instant::now() + wait;
                st.next_ready = Some(st.next_ready.map_or(ready, |r| r.min(ready)));
                let Some(slot) = st.pending.get_mut(at) else {
                    break;
                };
                if !slot.held_back {
                    slot.held_back = true;
                    self.rate_held.fetch_add(1, Ordering::Relaxed);
                }
                held_keys.insert(slot.msg.key.clone());
                skipped = true;
                at += 1;
                continue;
            }
            let seq = st.head_seq + at as u64;
            let (msg, ack) = if at == 0 {
                let Some(slot) = st.pending.pop_front() else {
                    break;
                };
                st.head_seq += 1;
                (slot.msg, slot.ack)
            } else {
                // Taken from behind a skipped change: a hole keeps the positions.
                let Some(slot) = st.pending.get_mut(at) else {
                    break;
                };
                slot.cancelled = true;
                let mut hole = slot.msg.clone();
                hole.payload = bytes::Bytes::new(); // a hole holds no payload
                let msg = std::mem::replace(&mut slot.msg, hole);
                let ack = slot.ack.take();
                st.holes += 1;
                taken_from_middle = true;
                at += 1;
                (msg, ack)
            };
            if self.limits.coalesce && st.index.get(&msg.key) == Some(&seq) {
                st.index.remove(&msg.key);
            }
            if pipelined && !is_marker {
                taken_keys.push(msg.key.clone());
            }
            marker |= is_marker;
            bytes += size;
            messages.push(msg);
            acks.extend(ack);
        }
        if taken_from_middle {
            st.trim_holes();
            st.compact_if_sparse();
        }
        for key in taken_keys {
            *st.inflight_keys.entry(key).or_insert(0) += 1;
        }
        st.pending_bytes -= bytes;
        st.inflight += messages.len();
        st.inflight_bytes += bytes;
        if !messages.is_empty() {
            st.inflight_batches += 1;
            st.inflight_markers += usize::from(marker);
            self.batches_high_water
                .fetch_max(st.inflight_batches, Ordering::Relaxed);
        }
        Batch {
            messages,
            acks,
            bytes,
            marker,
        }
    }

    /// Releases a batch the sink confirmed and settles its acknowledgements. Only for a
    /// confirmed batch: a batch the worker gave up on (shutdown) is never completed.
    pub fn complete(&self, batch: Batch) {
        {
            let mut st = self.lock();
            st.inflight -= batch.messages.len();
            st.inflight_bytes -= batch.bytes;
            st.inflight_batches -= 1;
            st.inflight_markers -= usize::from(batch.marker);
            if self.limits.window > 1 {
                for m in batch.messages.iter().filter(|m| !m.meta.op.is_marker()) {
                    if let Some(n) = st.inflight_keys.get_mut(&m.key) {
                        *n -= 1;
                        if *n == 0 {
                            st.inflight_keys.remove(&m.key);
                        }
                    }
                }
            }
            st.shrink_if_drained();
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

    /// Batches the worker may have in flight at once (`QueueLimits::window`).
    pub fn window(&self) -> usize {
        self.limits.window.max(1)
    }

    /// Batches in flight now.
    pub fn batches_in_flight(&self) -> usize {
        self.lock().inflight_batches
    }

    /// The most batches ever in flight at once.
    pub fn batches_high_water(&self) -> usize {
        self.batches_high_water.load(Ordering::Relaxed)
    }

    /// Bytes held now (pending + in flight).
    pub fn held_bytes(&self) -> usize {
        self.lock().held_bytes()
    }

    /// The most changes ever held at once.
    pub fn high_water(&self) -> usize {
        self.high_water.load(Ordering::Relaxed)
    }

    /// Changes never sent because of coalescing: replaced by a newer change of the same key,
    /// or cancelled (an `added` and its `deleted`, counted as two).
    pub fn coalesced(&self) -> usize {
        self.coalesced.load(Ordering::Relaxed)
    }

    /// Changes folded into one their class's rate held back (see [`Throttle`]): replaced by
    /// a newer change of the same key while it waited (also counted in
    /// [`SinkQueue::coalesced`]).
    pub fn rate_folded(&self) -> usize {
        self.rate_folded.load(Ordering::Relaxed)
    }

    /// Changes their class's rate held back, each counted once.
    pub fn rate_held(&self) -> usize {
        self.rate_held.load(Ordering::Relaxed)
    }
}

/// Takes one change of `t`'s class from its limiter (made on first use): `None` when the
/// rate allows it now, else how long until it will.
fn rate_wait(limiters: &mut HashMap<Arc<str>, Limiter>, t: &Throttle) -> Option<Duration> {
    use governor::clock::Clock as _;
    let limiter = limiters.entry(t.limiter.clone()).or_insert_with(|| {
        governor::RateLimiter::hashmap(governor::Quota::per_second(t.per_second))
    });
    if limiter.len() > LIMITER_CLASSES {
        limiter.retain_recent();
    }
    match limiter.check_key(&t.class) {
        Ok(()) => None,
        Err(not_until) => Some(not_until.wait_time_from(limiter.clock().now())),
    }
}

/// The survivor of two coalesced occurrences of an Event (`new` replacing `old`, never
/// sent; [`Resource::events`](kubesink_core::Resource)): its `occurrences` count both, so a
/// consumer's sum stays exact. Objects' messages pass unchanged.
fn coalesced_occurrences(old: &Message, new: Message) -> Message {
    use kubesink_core::message::{occurrences_of, with_occurrences};
    if !new.meta.resource.events {
        return new;
    }
    match (occurrences_of(old), occurrences_of(&new)) {
        (Some(a), b) => with_occurrences(&new, a.saturating_add(b.unwrap_or(0))),
        (None, _) => new,
    }
}

/// The survivor of two coalesced changes of a key (`new` replacing `old`, never sent): its
/// `changed` names what changed since the last message the sink received, so the
/// union of both updates' paths; unknown (left out) when `old` was not an `updated` whose
/// `changed` is known (an `added` never delivered, or one a destination may hold from a
/// previous run). Its `changes` (old and new values) go from the first old value to the
/// last new one ([`kubesink_core::message::coalesce_changes`]).
fn coalesced_changed(old: &Message, new: Message) -> Message {
    let new = match kubesink_core::message::coalesce_changes(old, &new) {
        Some(changes) => kubesink_core::message::with_changes(&new, changes),
        None => new,
    };
    let Some(n) = new.meta.changed.as_ref() else {
        return new;
    };
    match (&old.meta.changed, old.meta.op) {
        (Some(o), Op::Updated) if o.mask & !n.mask == 0 => new,
        (Some(o), Op::Updated) => {
            let union = n.union(o);
            kubesink_core::message::with_changed(&new, Some(union))
        }
        _ => kubesink_core::message::with_changed(&new, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Settle;
    use bytes::Bytes;
    use kubesink_core::{MessageMeta, Op, Resource};

    impl SinkQueue {
        /// A change no destination can hold yet (an `added` of it is cancellable).
        async fn push(&self, msg: Message, ack: Option<Ack>) -> bool {
            self.push_change(msg, ack, false, None).await
        }
    }

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
                tombstone_id: None,
                uid: "u".into(),
                observed_at: "2026-11-30T00:00:00.000Z".into(),
                changed: None,
                has_changes: false,
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
            window: 1,
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

    /// An `updated` of key `a` whose `changed` has `mask` over three paths (`None`: none).
    fn update(mask: Option<u8>) -> Message {
        let mut m = msg("a", r#"{"op":"updated","observedAt":"t"}"#);
        Arc::make_mut(&mut m.meta).op = Op::Updated;
        let names: Arc<[Arc<str>]> = ["metadata.labels", "spec", "status"].map(Arc::from).into();
        let changed = mask.map(|mask| kubesink_core::message::ChangedPaths { mask, names });
        kubesink_core::message::with_changed(&m, changed)
    }

    /// An occurrence of Event `a` (`op`) reporting `n` occurrences (`None`: none, a
    /// `deleted`).
    fn occurrence(op: Op, n: Option<u64>) -> Message {
        let text = match n {
            Some(n) => format!(
                r#"{{"op":"{}","occurrences":{n},"observedAt":"t"}}"#,
                op.as_str()
            ),
            None => format!(r#"{{"op":"{}","observedAt":"t"}}"#, op.as_str()),
        };
        let mut m = msg("a", &text);
        let meta = Arc::make_mut(&mut m.meta);
        meta.op = op;
        meta.resource = Arc::new(
            Resource::new("c", "events.k8s.io", "v1", "Event", "events", true).with_events(true),
        );
        m
    }

    /// An occurrence of Event `key` reporting `n` occurrences, held to 5 a second (a burst
    /// of 5) for its `reason`, pushed as the informer does.
    async fn push_occurrence(q: &SinkQueue, key: &str, reason: &str, op: Op, n: u64) {
        let mut m = occurrence(op, Some(n));
        m.key = key.into();
        let throttle = Throttle {
            limiter: "c/events.k8s.io/Event/5".into(),
            class: reason.into(),
            per_second: NonZeroU32::new(5).unwrap(),
        };
        assert!(q.push_change(m, None, false, Some(throttle)).await);
    }

    /// (key, occurrences) of each message of `b`.
    fn occurrences(b: &Batch) -> Vec<(String, Option<u64>)> {
        b.messages
            .iter()
            .map(|m| (m.key.to_string(), kubesink_core::message::occurrences_of(m)))
            .collect()
    }

    async fn next(q: &SinkQueue) -> Batch {
        tokio::time::timeout(Duration::from_secs(30), q.next_batch())
            .await
            .expect("a batch within 30 s")
            .expect("not closed")
    }

    #[tokio::test]
    async fn a_reasons_rate_holds_its_occurrences_back_folds_them_and_lets_other_reasons_pass() {
        let q = SinkQueue::new(limits(true, 100));
        // Five BackOffs use the burst; the sixth and seventh wait. A Pulled is another class.
        for k in 0..7 {
            push_occurrence(&q, &format!("backoff-{k}"), "BackOff", Op::Added, 1).await;
        }
        push_occurrence(&q, "pulled", "Pulled", Op::Added, 1).await;
        let first = next(&q).await;
        // A held BackOff happens twice more: folded into the one waiting.
        push_occurrence(&q, "backoff-6", "BackOff", Op::Updated, 2).await;
        let keys: Vec<String> = occurrences(&first).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "backoff-0",
                "backoff-1",
                "backoff-2",
                "backoff-3",
                "backoff-4",
                "pulled"
            ],
            "the burst of one reason, and the other reason behind the held ones"
        );
        assert_eq!((q.rate_held(), q.rate_folded()), (2, 1));
        q.complete(first);
        // The rate lets the held ones go in turn, each whole: nothing lost.
        let mut rest = Vec::new();
        while rest.len() < 2 {
            let b = next(&q).await;
            rest.extend(occurrences(&b));
            q.complete(b);
        }
        assert_eq!(
            rest,
            [("backoff-5".into(), Some(1)), ("backoff-6".into(), Some(3))]
        );
        assert_eq!(q.held(), 0);
    }

    #[tokio::test]
    async fn a_drained_queue_gives_back_the_room_of_a_burst() {
        let q = SinkQueue::new(limits(true, 10_000));
        for k in 0..5_000 {
            q.push(msg(&format!("k{k}"), "x"), None).await;
        }
        let room = |q: &SinkQueue| {
            let st = q.lock();
            (st.pending.capacity(), st.index.capacity())
        };
        assert!(room(&q).0 >= 5_000 && room(&q).1 >= 5_000);
        while q.held() > 0 {
            let b = next(&q).await;
            q.complete(b);
        }
        let (slots, index) = room(&q);
        assert!(
            slots <= SHRINK_ABOVE && index <= SHRINK_ABOVE,
            "kept {slots} slots and {index} index entries"
        );
        // And it works on from there.
        q.push(msg("again", "y"), None).await;
        assert_eq!(payloads(&next(&q).await), ["y"]);
    }

    #[tokio::test]
    async fn a_marker_waits_for_a_change_the_rate_holds_back() {
        let q = SinkQueue::new(limits(true, 100));
        for k in 0..6 {
            push_occurrence(&q, &format!("e-{k}"), "BackOff", Op::Added, 1).await;
        }
        q.push_change(marker("m"), None, true, None).await;
        push_occurrence(&q, "other", "Pulled", Op::Added, 1).await;
        let first = next(&q).await;
        assert_eq!(
            first.messages.len(),
            5,
            "the burst; e-5 held, the marker behind it"
        );
        q.complete(first);
        let second = next(&q).await;
        let keys: Vec<&str> = second.messages.iter().map(|m| &*m.key).collect();
        assert_eq!(
            keys,
            ["e-5", "m", "other"],
            "the list's changes, then its marker"
        );
    }

    #[tokio::test]
    async fn a_full_or_closed_queue_takes_what_the_rate_holds_back() {
        let q = SinkQueue::new(limits(true, 6));
        for k in 0..6 {
            push_occurrence(&q, &format!("e-{k}"), "BackOff", Op::Added, 1).await;
        }
        assert_eq!(
            next(&q).await.messages.len(),
            6,
            "full: the rate yields to the bound"
        );
        let q = SinkQueue::new(limits(true, 100));
        for k in 0..8 {
            push_occurrence(&q, &format!("e-{k}"), "BackOff", Op::Added, 1).await;
        }
        q.close();
        assert_eq!(next(&q).await.messages.len(), 8, "closed: drained at once");
    }

    #[tokio::test]
    async fn coalesced_occurrences_add_up_and_a_deletion_never_cancels_them() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(occurrence(Op::Added, Some(5)), None).await;
        q.push(occurrence(Op::Updated, Some(3)), None).await;
        q.push(occurrence(Op::Updated, Some(1)), None).await;
        // An Event's deletion queues behind its occurrences: an `added` and a `deleted` of
        // an object cancel out, occurrences do not.
        q.push(occurrence(Op::Deleted, None), None).await;
        let b = q.next_batch().await.unwrap();
        assert_eq!(
            payloads(&b),
            [
                r#"{"op":"updated","occurrences":9,"observedAt":"t"}"#,
                r#"{"op":"deleted","observedAt":"t"}"#
            ]
        );
        assert_eq!(
            kubesink_core::message::occurrences_of(&b.messages[0]),
            Some(9)
        );
        assert_eq!(q.coalesced(), 2);
    }

    #[tokio::test]
    async fn coalesced_updates_name_the_paths_of_both_and_an_unknown_one_makes_it_unknown() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(update(Some(0b100)), None).await; // status
        q.push(update(Some(0b010)), None).await; // spec
        let b = q.next_batch().await.unwrap();
        assert_eq!(
            payloads(&b),
            [r#"{"op":"updated","changed":["spec","status"],"observedAt":"t"}"#]
        );
        let meta = &b.messages[0].meta;
        assert_eq!(meta.changed.as_ref().map(|c| c.mask), Some(0b110));
        q.complete(b);
        // The replaced update's changed unknown: the survivor's is unknown too.
        q.push(update(None), None).await;
        q.push(update(Some(0b001)), None).await;
        let b = q.next_batch().await.unwrap();
        assert_eq!(payloads(&b), [r#"{"op":"updated","observedAt":"t"}"#]);
        q.complete(b);
        // After an added the sink never received: unknown.
        q.push(msg("a", r#"{"op":"added"}"#), None).await;
        q.push(update(Some(0b001)), None).await;
        let b = q.next_batch().await.unwrap();
        assert_eq!(b.messages[0].meta.changed, None);
        assert!(!payloads(&b)[0].contains("changed"), "{:?}", payloads(&b));
    }

    #[tokio::test]
    async fn coalesced_updates_carry_the_first_old_value_and_the_last_new_one() {
        let with = |changes: &str| {
            kubesink_core::message::with_changes(&update(Some(0b010)), Some(changes.to_owned()))
        };
        let q = SinkQueue::new(limits(true, 10));
        q.push(
            with(r#"[{"path":"spec.replicas","old":1,"new":2},{"path":"image","old":"a","new":"b"}]"#),
            None,
        )
        .await;
        q.push(
            with(r#"[{"path":"spec.replicas","old":2,"new":3},{"path":"image","old":"b","new":"a"}]"#),
            None,
        )
        .await;
        let b = q.next_batch().await.unwrap();
        let m: serde_json::Value = serde_json::from_slice(&b.messages[0].payload).unwrap();
        assert_eq!(
            m["changes"],
            serde_json::json!([{"path": "spec.replicas", "old": 1, "new": 3}]),
            "the image came back: not a change"
        );
        q.complete(b);
        // After an added the sink never received, the old values are unknown: none.
        q.push(msg("a", r#"{"op":"added"}"#), None).await;
        q.push(with(r#"[{"path":"spec.replicas","old":3,"new":4}]"#), None)
            .await;
        let b = q.next_batch().await.unwrap();
        assert!(!payloads(&b)[0].contains("changes"), "{:?}", payloads(&b));
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

    /// A change of `key` with `op` and `uid`; the payload names them (`a:deleted:u1`).
    fn change(key: &str, op: Op, uid: &str) -> Message {
        let mut m = msg(key, &format!("{key}:{op}:{uid}"));
        m.meta = Arc::new(MessageMeta {
            op,
            uid: uid.into(),
            ..(*m.meta).clone()
        });
        m
    }

    #[tokio::test]
    async fn a_uid_change_is_never_coalesced_both_arrive_in_order() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(change("a", Op::Updated, "u1"), None).await;
        q.push(change("a", Op::Deleted, "u1"), None).await; // replaces the update
        q.push(change("a", Op::Added, "u2"), None).await; // a re-created object
        q.push(change("a", Op::Updated, "u2"), None).await; // coalesces with its own added
        let b = q.next_batch().await.unwrap();
        assert_eq!(payloads(&b), ["a:deleted:u1", "a:updated:u2"]);
        assert_eq!(q.coalesced(), 2);
    }

    #[tokio::test]
    async fn added_then_deleted_while_pending_cancels_the_pair_and_settles_both() {
        let q = SinkQueue::new(limits(true, 10));
        let (added, deleted) = (Arc::new(Counter::default()), Arc::new(Counter::default()));
        q.push(change("b", Op::Updated, "u"), None).await;
        q.push(change("a", Op::Added, "u1"), Some(added.clone()))
            .await;
        q.push(change("a", Op::Updated, "u1"), None).await; // still an `added` for the sink
        q.push(change("c", Op::Updated, "u"), None).await;
        q.push(change("a", Op::Deleted, "u1"), Some(deleted.clone()))
            .await;
        assert_eq!((settled(&added), settled(&deleted)), (1, 1));
        assert_eq!(q.held(), 2, "the pair holds nothing");
        // The index still finds `c` behind the hole.
        q.push(change("c", Op::Deleted, "u"), None).await;
        let b = q.next_batch().await.unwrap();
        assert_eq!(
            payloads(&b),
            ["b:updated:u", "c:deleted:u"],
            "the hole is skipped"
        );
        assert_eq!(q.coalesced(), 4);
        // Created and deleted at the front of an otherwise empty queue: nothing to take.
        q.complete(b);
        q.push(change("d", Op::Added, "u"), None).await;
        q.push(change("d", Op::Deleted, "u"), None).await;
        assert_eq!(q.held(), 0);
        q.push(change("e", Op::Added, "u"), None).await;
        assert_eq!(payloads(&q.next_batch().await.unwrap()), ["e:added:u"]);
    }

    #[tokio::test]
    async fn a_delete_of_a_key_the_sink_has_is_always_sent() {
        let q = SinkQueue::new(limits(true, 10));
        // Pending `updated`: the sink has the key (an earlier change was delivered).
        q.push(change("a", Op::Updated, "u"), None).await;
        q.push(change("a", Op::Deleted, "u"), None).await;
        // `added` in flight, its `deleted` pending: the sink will have the key.
        q.push(change("b", Op::Added, "u"), None).await;
        let first = q.next_batch().await.unwrap();
        assert_eq!(payloads(&first), ["a:deleted:u", "b:added:u"]);
        q.push(change("b", Op::Deleted, "u"), None).await;
        q.complete(first);
        assert_eq!(payloads(&q.next_batch().await.unwrap()), ["b:deleted:u"]);
        // Without coalescing every change is sent, the pair included.
        let q = SinkQueue::new(limits(false, 10));
        q.push(change("a", Op::Added, "u"), None).await;
        q.push(change("a", Op::Deleted, "u"), None).await;
        assert_eq!(
            payloads(&q.next_batch().await.unwrap()),
            ["a:added:u", "a:deleted:u"]
        );
    }

    #[tokio::test]
    async fn a_delete_never_cancels_an_added_a_destination_may_already_hold() {
        let q = SinkQueue::new(limits(true, 10));
        let (added, deleted) = (Arc::new(Counter::default()), Arc::new(Counter::default()));
        // Re-sent after a crash: the previous run may have delivered it.
        q.push_change(change("a", Op::Added, "u"), Some(added.clone()), true, None)
            .await;
        q.push(change("a", Op::Updated, "u"), None).await; // coalesces, stays not fresh
        q.push(change("a", Op::Deleted, "u"), Some(deleted.clone()))
            .await;
        assert_eq!(settled(&added), 1, "replaced by the deleted");
        assert_eq!(settled(&deleted), 0, "still to be sent");
        assert_eq!(q.held(), 1);
        let b = q.next_batch().await.unwrap();
        assert_eq!(payloads(&b), ["a:deleted:u"]);
        q.complete(b);
        assert_eq!(settled(&deleted), 1);
    }

    #[tokio::test]
    async fn a_delete_never_cancels_an_added_queued_before_a_marker() {
        let q = SinkQueue::new(limits(true, 10));
        q.push(change("a", Op::Added, "u"), None).await;
        q.push(marker("m"), None).await;
        q.push(change("a", Op::Deleted, "u"), None).await;
        assert_eq!(
            payloads(&q.next_batch().await.unwrap()),
            ["a:added:u", "sync", "a:deleted:u"],
            "the marker counted the object: its delete must follow"
        );
    }

    #[tokio::test]
    async fn holes_of_cancelled_pairs_stay_bounded_and_keep_the_index_and_barrier_right() {
        let q = SinkQueue::new(limits(true, 100));
        q.push(change("plug", Op::Updated, "u"), None).await;
        q.push(change("y", Op::Updated, "u"), None).await;
        q.push(marker("m"), None).await;
        q.push(change("z", Op::Updated, "u"), None).await;
        // Each round leaves 9 cancelled `added`s in the middle, before one live change.
        for round in 0..50 {
            let keys: Vec<String> = (0..9).map(|i| format!("short-{round}-{i}")).collect();
            for k in &keys {
                q.push(change(k, Op::Added, "u"), None).await;
            }
            q.push(change(&format!("live-{round}"), Op::Updated, "u"), None)
                .await;
            for k in &keys {
                q.push(change(k, Op::Deleted, "u"), None).await;
            }
            let len = q.lock().pending.len();
            let live = q.held();
            assert!(len <= 2 * live + 33, "{len} slots for {live} changes");
        }
        assert_eq!(q.held(), 54);
        // `y` is before the marker: a newer `y` may not replace it; `z` is behind it: it may.
        q.push(change("y", Op::Deleted, "u"), None).await;
        q.push(change("z", Op::Deleted, "u"), None).await;
        q.push(change("live-7", Op::Deleted, "u"), None).await;
        let b = q.next_batch().await.unwrap();
        let got = payloads(&b);
        assert_eq!(
            got[..5],
            [
                "plug:updated:u",
                "y:updated:u",
                "sync",
                "z:deleted:u",
                "live-0:updated:u"
            ]
        );
        assert_eq!(
            got[11], "live-7:deleted:u",
            "the index found it after compaction"
        );
        assert_eq!(got.last().map(String::as_str), Some("y:deleted:u"));
        assert_eq!(got.len(), 55);
    }

    #[tokio::test]
    async fn a_cancelled_pair_frees_room_for_a_waiting_push() {
        let q = Arc::new(SinkQueue::new(limits(true, 2)));
        q.push(change("a", Op::Added, "u"), None).await;
        q.push(change("b", Op::Added, "u"), None).await;
        let q2 = q.clone();
        let blocked = tokio::spawn(async move { q2.push(change("c", Op::Added, "u"), None).await });
        tokio::task::yield_now().await;
        assert!(!blocked.is_finished());
        q.push(change("a", Op::Deleted, "u"), None).await;
        assert!(tokio::time::timeout(Duration::from_secs(5), blocked)
            .await
            .unwrap()
            .unwrap());
        assert_eq!(
            payloads(&q.next_batch().await.unwrap()),
            ["b:added:u", "c:added:u"]
        );
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
