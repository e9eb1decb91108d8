//! The write-ahead journal of new keys: between two snapshots, every `added` is recorded here
//! before any sink may send it, so that after a crash the restart knows every key downstream
//! may have, and can send the `deleted` of those that vanished meanwhile.
//!
//! # Why
//!
//! A snapshot holds what every sink confirmed at the time it was taken (`tracked.rs`). An
//! object first sent after that snapshot, and deleted while kubesink is down after a crash,
//! is in no snapshot: without the journal the restart cannot know downstream has it, and
//! downstream keeps a ghost. Updates and deletes need no record: their key is in the
//! snapshot already, so the restart's list finds the difference.
//!
//! # How (group commit, as a database's write-ahead log)
//!
//! - [`NewKeys::try_record`] appends a record (key, uid, resourceVersion; ~57 bytes) to an
//!   in-memory chunk and returns its position; the change's acknowledgement carries it
//!   ([`WriteAhead`]), and a sink's worker sends a batch only once the journal is durable up
//!   to the batch's highest position (`pipeline/deliver.rs`). Changes that add no key carry
//!   the newest position, so a coalesced change never drops its key's record.
//! - One writer task ([`Journal::run`]) stores what is pending in one operation of the
//!   [`StateStore`] (file: one write of its frames and one fdatasync; NATS: a JetStream
//!   publish per frame, then their PubAcks), and publishes the durable position. It stores
//!   **on demand**: as soon as a sink's worker waits for a position not yet durable
//!   ([`Durability::demanded`]), when a chunk is full, or at the latest [`LINGER`] after the
//!   first pending record. So a lone change waits one store operation and no timer, and
//!   under load one operation covers a whole batch (measured in `benches/restart.rs`: records
//!   per append). At most [`MAX_CHUNKS`] chunks of [`CHUNK_BYTES`] are pending; beyond that,
//!   [`NewKeys::try_record`] refuses and the informer waits for [`NewKeys::room`]
//!   (backpressure, like a full sink queue).
//! - Failing appends are retried with backoff, forever; sends wait meanwhile (nothing leaves
//!   that a crash could leave unaccounted for). The failure is logged, counted and shown in
//!   `/readyz`.
//! - **Generations.** The journal is cut into generations. Each save first starts a new one
//!   ([`Journal::rotate`]), then packs the snapshot (which lists every key whose `added` is
//!   still unconfirmed, `tracked.rs`) and stores it with that generation; only then are the
//!   older generations dropped. At start-up, the segments of the snapshot's generation and
//!   later are replayed onto it (`restore.rs`). Pending chunks are tagged with the generation
//!   current when the writer takes them, so a record appended after a rotation is never in an
//!   older generation. Generations are at least the wall-clock milliseconds at start, so a new
//!   process never appends to a segment an earlier one may have left torn.
//!
//! Never decides what is emitted, and never holds more than the chunks bound.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kubesink_core::backoff::Backoff;
use kubesink_core::state::StateStore;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use super::stats::StateStats;
use super::watch_key::WatchKey;
use crate::informer::NewKeys;
use crate::pipeline::{Durability, WriteAhead};

pub mod frame;

/// Records per chunk are bounded by bytes: a chunk is one frame. 64 KiB (about 1,100
/// records) is below any NATS server's `max_payload` in practice (default 1 MB).
pub const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks pending (the ones being stored not counted) before [`NewKeys::try_record`] refuses.
pub const MAX_CHUNKS: usize = 4;
/// The longest a record waits to be stored when no sink asks for it yet.
pub const LINGER: Duration = Duration::from_millis(5);
/// How often a journal that keeps failing is logged again at WARN.
const FAILURE_REMINDER: Duration = Duration::from_secs(60);
/// A record's bytes beyond its names: watch index, lengths, flags, uid, resourceVersion (a
/// bound for the chunk's fit check; text uids and resourceVersions add their length).
const RECORD_OVERHEAD: usize = 48;

/// Records appended and not yet stored.
struct Chunk {
    bytes: Vec<u8>,
    first: u64,
    count: u64,
}

struct Buffer {
    chunks: VecDeque<Chunk>,
    /// Number of the last record appended (records are numbered from 1).
    last: u64,
    /// The generation new chunks are written to.
    generation: u64,
    /// When the oldest pending record was appended.
    since: Option<Instant>,
}

/// One cluster's journal of new keys (see the module docs). Shared by its watches' stores
/// (which record) and its writer task.
pub struct Journal {
    cluster: String,
    /// The watch table written in every frame: `(identity, selection)` by watch index.
    watches: Vec<(String, u64)>,
    buffer: Mutex<Buffer>,
    data: Notify,
    room: Notify,
    /// Durable position; dropped when the writer stops, which releases waiting sends.
    durable_tx: Mutex<Option<watch::Sender<u64>>>,
    durability: Arc<Durability>,
    stats: Arc<StateStats>,
}

impl Journal {
    /// The journal of cluster `cluster`'s `watches` (their order gives the watch indexes),
    /// writing generation `generation` first.
    pub fn new(
        cluster: &str,
        watches: &[WatchKey],
        generation: u64,
        stats: Arc<StateStats>,
    ) -> Arc<Self> {
        let (tx, rx) = watch::channel(0);
        Arc::new(Journal {
            cluster: cluster.to_owned(),
            watches: watches
                .iter()
                .map(|w| (w.identity.clone(), w.selection))
                .collect(),
            buffer: Mutex::new(Buffer {
                chunks: VecDeque::new(),
                last: 0,
                generation,
                since: None,
            }),
            data: Notify::new(),
            room: Notify::new(),
            durable_tx: Mutex::new(Some(tx)),
            durability: Durability::new(rx),
            stats,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // Every step leaves the buffer consistent: a poisoned lock is recovered.
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a new generation and returns it: records appended from now on are not in any
    /// older generation. The keeper calls it right before packing a snapshot.
    pub fn rotate(&self) -> u64 {
        let mut b = self.lock();
        b.generation += 1;
        b.generation
    }

    fn point(&self, position: u64) -> WriteAhead {
        WriteAhead::new(self.durability.clone(), position)
    }

    /// Waits until what is pending should be stored: a sink waits for it, a chunk is full,
    /// or the oldest record waited [`LINGER`]. `false` when `stop` fired.
    async fn due(&self, stop: &CancellationToken) -> bool {
        loop {
            let notified = self.data.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let deadline = {
                let b = self.lock();
                match b.since {
                    None => None,
                    Some(_) if b.chunks.len() > 1 => return true,
                    Some(_) if self.durability.wanted() > self.durability.durable() => return true,
                    Some(since) => Some(since + LINGER),
                }
            };
            match deadline {
                None => tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = &mut notified => {}
                },
                Some(at) => tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = &mut notified => {}
                    _ = self.durability.demanded() => {}
                    _ = tokio::time::sleep_until(at.into()) => return true,
                },
            }
        }
    }

    /// Stores what is pending until `stop` fires (after the pipeline drained at shutdown),
    /// retrying a failed append with `retry` forever. On return, waiting sends are released.
    pub async fn run(
        self: Arc<Self>,
        store: Arc<dyn StateStore>,
        retry: Backoff,
        stop: CancellationToken,
    ) {
        let mut failing: Option<(Instant, Instant, u64)> = None; // since, last warn, count
        'appends: while self.due(&stop).await {
            let (generation, chunks) = {
                let mut b = self.lock();
                b.since = None;
                (b.generation, std::mem::take(&mut b.chunks))
            };
            self.room.notify_waiters();
            let Some(last) = chunks.back().map(|c| c.first + c.count - 1) else {
                continue;
            };
            let frames: Vec<Vec<u8>> = chunks
                .iter()
                .map(|c| {
                    frame::encode(
                        &self.cluster,
                        generation,
                        c.first,
                        &self.watches,
                        c.count,
                        &c.bytes,
                    )
                })
                .collect();
            let bytes: usize = frames.iter().map(Vec::len).sum();
            let mut delays = retry.delays();
            loop {
                match store.append(generation, frames.clone()).await {
                    Ok(()) => break,
                    Err(e) => {
                        self.stats.note_journal_error(&e);
                        let wait = delays.next().unwrap_or(retry.max);
                        let now = Instant::now();
                        match &mut failing {
                            None => {
                                failing = Some((now, now, 1));
                                tracing::warn!(store = store.describe(), error = %e, retry_in = ?wait, "state journal: cannot record new objects; sends wait until it can (nothing is sent that a crash could leave undeleted downstream)");
                            }
                            Some((since, last_warn, count)) => {
                                *count += 1;
                                if now.duration_since(*last_warn) >= FAILURE_REMINDER {
                                    *last_warn = now;
                                    tracing::warn!(store = store.describe(), error = %e, failing_for = ?now.duration_since(*since), attempts = *count, "state journal still failing; sends wait");
                                } else {
                                    tracing::debug!(error = %e, retry_in = ?wait, "state journal append failed again");
                                }
                            }
                        }
                        tokio::select! {
                            _ = stop.cancelled() => break 'appends,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            }
            if let Some(took) = self.stats.note_journal_stored(bytes, last) {
                tracing::info!(store = store.describe(), failed_for = ?took, "state journal recording again");
                failing = None;
            }
            if let Some(tx) = self
                .durable_tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
            {
                tx.send_replace(last);
            }
        }
        // Release whatever still waits: the pipeline has drained (or given up) by now.
        self.durable_tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.room.notify_waiters();
    }

    /// Whether the writer stopped.
    fn stopped(&self) -> bool {
        self.durable_tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

#[async_trait]
impl NewKeys for Journal {
    fn try_record(
        &self,
        watch: u32,
        namespace: Option<&str>,
        name: &str,
        uid: &str,
        rv: &str,
    ) -> Option<WriteAhead> {
        let namespace = namespace.unwrap_or("");
        let size = RECORD_OVERHEAD + namespace.len() + name.len() + uid.len() + rv.len();
        let mut b = self.lock();
        let fits_last = b
            .chunks
            .back()
            .is_some_and(|c| c.bytes.len() + size <= CHUNK_BYTES);
        if !fits_last && b.chunks.len() >= MAX_CHUNKS && !self.stopped() {
            return None;
        }
        b.last += 1;
        let n = b.last;
        // The writer is told only what can make it store: the first pending record (its
        // linger starts) and a full chunk; a sink waiting tells it too (`Durability`).
        let wake = b.since.is_none() || !fits_last;
        if !fits_last {
            b.chunks.push_back(Chunk {
                bytes: Vec::with_capacity(CHUNK_BYTES),
                first: n,
                count: 0,
            });
        }
        if let Some(c) = b.chunks.back_mut() {
            frame::put_record(&mut c.bytes, watch, namespace, name, uid, rv);
            c.count += 1;
        }
        b.since.get_or_insert_with(Instant::now);
        drop(b);
        self.stats.journal_records.fetch_add(1, Ordering::Relaxed);
        if wake {
            self.data.notify_one();
        }
        Some(self.point(n))
    }

    async fn room(&self) {
        let notified = self.room.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let full = {
            let b = self.lock();
            b.chunks.len() >= MAX_CHUNKS && !self.stopped()
        };
        if full {
            notified.await;
        }
    }

    fn covered(&self) -> WriteAhead {
        let last = self.lock().last;
        self.point(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::file::FileStore;

    const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";

    /// Records like the informer does: waiting for room when the buffer is full.
    async fn record(j: &Journal, ns: Option<&str>, name: &str, rv: &str) -> WriteAhead {
        crate::informer::record_new_key(j, 0, ns, name, U1, rv).await
    }

    fn journal(generation: u64) -> Arc<Journal> {
        let watches = [WatchKey {
            identity: "core/Pod/".into(),
            selection: 7,
            seed: None,
        }];
        Journal::new("prod", &watches, generation, Arc::default())
    }

    #[tokio::test]
    async fn a_send_waits_until_its_record_is_stored_and_the_records_replay_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> = Arc::new(FileStore::new(dir.path().join("state")));
        let j = journal(10);
        let a = record(&j, Some("ns"), "a", "1").await;
        let b = record(&j, Some("ns"), "b", "2").await;
        assert_eq!(
            (a.position(), b.position(), j.covered().position()),
            (1, 2, 2)
        );
        assert!(!b.is_durable(), "nothing is stored before the writer runs");
        let stop = CancellationToken::new();
        let writer = tokio::spawn(j.clone().run(
            store.clone(),
            Backoff::new(Duration::from_millis(10), Duration::from_millis(50)),
            stop.clone(),
        ));
        assert!(tokio::time::timeout(Duration::from_secs(10), b.wait())
            .await
            .unwrap());
        assert_eq!(j.rotate(), 11);
        let c = record(&j, None, "node", "3").await;
        // Nobody waits for it: stored anyway, after the linger.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !c.is_durable() {
            assert!(Instant::now() < deadline, "stored without demand");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        writer.await.unwrap();
        let segments = store.load_journal().await.unwrap();
        let frames: Vec<frame::Frame> = segments
            .iter()
            .flat_map(|s| {
                frame::parse_segment(&s.name, &s.bytes, s.may_tear)
                    .unwrap()
                    .frames
            })
            .collect();
        let names: Vec<(u64, &str)> = frames
            .iter()
            .flat_map(|f| {
                f.records
                    .iter()
                    .map(move |r| (f.generation, r.name.as_str()))
            })
            .collect();
        assert_eq!(names, [(10, "a"), (10, "b"), (11, "node")]);
        // Once stopped, nothing waits for it.
        let late = record(&j, None, "late", "4").await;
        assert!(!late.wait().await, "released, not durable");
    }

    #[tokio::test]
    async fn a_full_journal_makes_recording_wait_for_the_writer() {
        let j = journal(1);
        let name = "x".repeat(CHUNK_BYTES / 2);
        for i in 0..MAX_CHUNKS {
            record(&j, None, &format!("{name}{i}"), "1").await;
        }
        let more_name = format!("{name}-more");
        let more = record(&j, None, &more_name, "1");
        assert!(
            tokio::time::timeout(Duration::from_millis(200), more)
                .await
                .is_err(),
            "a fifth chunk waits for room"
        );
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> = Arc::new(FileStore::new(dir.path().join("state")));
        let stop = CancellationToken::new();
        tokio::spawn(j.clone().run(
            store,
            Backoff::new(Duration::from_millis(10), Duration::from_millis(50)),
            stop.clone(),
        ));
        let more = record(&j, None, &more_name, "1");
        let p = tokio::time::timeout(Duration::from_secs(10), more)
            .await
            .unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(10), p.wait())
            .await
            .unwrap());
        stop.cancel();
    }
}
