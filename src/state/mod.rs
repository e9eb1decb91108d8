//! Acknowledged informer state that survives restarts and hand-overs (`docs/restarts.md`).
//!
//! - `snapshot.rs`: the versioned, checksummed file format (per watch: identity, selection
//!   fingerprint, list resourceVersion, the store's packed entries).
//! - `journal.rs` (with `journal/frame.rs`, its format): the write-ahead journal of new keys
//!   between snapshots, so that a crash never leaves downstream with a key whose delete the
//!   restart cannot infer.
//! - `file.rs`, `nats.rs`: the two [`StateStore`] backends (`state.backend`): a local file
//!   written atomically with its journal beside it, and a NATS JetStream object store (with a
//!   stream for the journal) that any replica can read.
//! - `restore.rs`: [`restore`] each watch's store at start-up from the snapshot and the
//!   journal (deciding per watch whether its part is usable, and saying why not).
//! - `stats.rs`: [`StateStats`], the counters behind the `kubesink_state_*` metrics.
//! - this file: the [`StateStore`] trait, [`open`] the configured backend, and the
//!   [`Keeper`] that saves the acknowledged state every `state.interval` and at shutdown.
//!
//! Bad state is never fatal: a missing, truncated, corrupt, foreign (other format version,
//! cluster or selection) or unreadable state is logged with the reason and ignored for the
//! affected watches, which then list and emit everything as without state; the next save
//! overwrites it. This module never decides what to emit (the informer's `Decider` does,
//! from the restored store) and never saves anything a sink has not confirmed: it reads the
//! informers' [`TrackedStore`]s, whose overlay holds back unacknowledged changes.

mod file;
pub mod journal;
#[cfg(feature = "nats")]
mod nats;
mod restore;
mod snapshot;
mod stats;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use journal::Journal;
pub use restore::{restore, Restored};
pub use snapshot::{parse, Snapshot, SnapshotError, Writer, FORMAT_VERSION, MAGIC};
pub use stats::StateStats;

use crate::config::{StateBackend, StateConfig};
use crate::informer::TrackedStore;
use crate::leader::Fence;

/// One stored piece of the journal: a file, or one message of a stream.
#[derive(Debug)]
pub struct JournalSegment {
    /// Where it is, for log lines (a file path, `stream S sequence N`).
    pub name: String,
    /// Its frames, back to back.
    pub bytes: Vec<u8>,
    /// A crash may have cut its last write short (a file), so a damaged last frame is torn,
    /// not corrupt (`journal/frame.rs`).
    pub may_tear: bool,
}

/// Where the state is kept: the snapshot (one blob, replaced whole on every save) and the
/// journal of new keys (appended between saves, dropped by generation).
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Where, for logs (`file /var/lib/kubesink/state`, `NATS object store
    /// KUBESINK_STATE/prod at nats://...`).
    fn describe(&self) -> &str;

    /// The saved bytes; `Ok(None)` when nothing was saved yet.
    ///
    /// # Errors
    /// [`StateError`] when the store cannot be read (the caller starts without state).
    async fn load(&self) -> Result<Option<Vec<u8>>, StateError>;

    /// Replaces the saved bytes, atomically: a reader sees the old or the new state whole.
    ///
    /// # Errors
    /// [`StateError`] when the store cannot be written (the caller retries at the next save).
    async fn save(&self, bytes: Vec<u8>) -> Result<(), StateError>;

    /// Appends one journal frame to generation `generation`, durably: on `Ok` it survives a
    /// crash (and, as far as the backend provides, a power loss).
    ///
    /// # Errors
    /// [`StateError`] when it could not be stored (the journal retries; sends wait).
    async fn append(&self, generation: u64, frame: Vec<u8>) -> Result<(), StateError>;

    /// Every stored journal segment, oldest first.
    ///
    /// # Errors
    /// [`StateError`] when the journal cannot be read (the caller starts without state).
    async fn load_journal(&self) -> Result<Vec<JournalSegment>, StateError>;

    /// Removes the journal of every generation below `generation` (a snapshot of
    /// `generation` is stored, which covers them). Frames of older generations appended
    /// meanwhile may survive it; the next call removes them.
    ///
    /// # Errors
    /// [`StateError`] when the backend refuses (logged; the next save tries again).
    async fn drop_journal_before(&self, generation: u64) -> Result<(), StateError>;
}

/// Why the state store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file operation of the `file` backend failed.
    #[error("state.path {path}: {what}: {source}")]
    File {
        /// The state file.
        path: String,
        /// What was being done (`reading`, `writing a temporary file`, ...).
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A NATS operation of the `nats` backend failed.
    #[error("state.nats: {what} object {object:?} in bucket {bucket:?} at {servers}: {detail}")]
    Nats {
        /// What was being done (`connecting`, `reading`, `writing`, ...).
        what: &'static str,
        /// The servers, user info removed.
        servers: String,
        /// The bucket.
        bucket: String,
        /// The object.
        object: String,
        /// The client's description.
        detail: String,
    },
    /// This replica may no longer lead (its leader-election fence closed): it must not
    /// overwrite the state of the replica that took over.
    #[error(
        "state: not saved, this replica may no longer lead (its lease may have passed to another)"
    )]
    Fenced,
    /// The background task that packs or writes the state failed.
    #[error("state: the {what} task failed: {detail}")]
    Task {
        /// `packing` or `writing`.
        what: &'static str,
        /// The join error.
        detail: String,
    },
}

/// The configured backend for cluster `cluster`, or `None` for `state.backend = "none"`.
/// With several clusters (`multi`), each has its own file (`state.path` + `.{cluster}`) or
/// object (`state.nats.object` + `.{cluster}`; the default object is the cluster's name).
/// Does no I/O (the NATS backend connects on first use), so a broken store never prevents
/// start-up.
pub fn open(config: &StateConfig, cluster: &str, multi: bool) -> Option<Arc<dyn StateStore>> {
    let store: Arc<dyn StateStore> = match config.backend {
        StateBackend::None => return None,
        StateBackend::File => {
            let mut path = config.path.clone().unwrap_or_default();
            if multi {
                let mut name = path.file_name().unwrap_or_default().to_os_string();
                name.push(format!(".{cluster}"));
                path.set_file_name(name);
            }
            Arc::new(file::FileStore::new(path))
        }
        #[cfg(feature = "nats")]
        StateBackend::Nats => {
            let mut nats = config.nats.clone();
            if multi {
                nats.object = nats.object.map(|o| format!("{o}.{cluster}"));
            }
            Arc::new(nats::NatsStore::new(&nats, cluster))
        }
    };
    tracing::info!(%cluster, store = store.describe(), "informer state store");
    Some(store)
}

/// One watch as the state knows it.
#[derive(Clone, Debug)]
pub struct WatchKey {
    /// `{group}/{Kind}/{namespace}` (`WatchPlan::identity`).
    pub identity: String,
    /// The selection fingerprint (`WatchPlan::selection`).
    pub selection: u64,
}

/// One watch whose acknowledged state the [`Keeper`] saves.
pub struct Kept {
    /// Identity and selection, written with its section.
    pub key: WatchKey,
    /// The informer's shared store.
    pub store: Arc<TrackedStore>,
}

/// What one save did.
#[derive(Clone, Copy, Debug, Default)]
pub struct SaveReport {
    /// Objects written, all watches (unconfirmed included).
    pub objects: u64,
    /// Of those, unconfirmed: sent as `added`, not yet confirmed by every sink.
    pub unconfirmed: u64,
    /// Size of the state, bytes.
    pub bytes: usize,
    /// Time to pack every watch's acknowledged state (locks included).
    pub pack: Duration,
    /// The longest a watch's store was locked while packed (its informer waits meanwhile).
    pub longest_lock: Duration,
    /// Time the backend took to store the bytes (file: write, fsync, rename).
    pub write: Duration,
    /// Time to drop the journal generations the snapshot covers.
    pub journal_drop: Duration,
}

/// Saves the acknowledged state of every watch: on an interval, and once more at shutdown.
pub struct Keeper {
    store: Arc<dyn StateStore>,
    cluster: String,
    watches: Arc<Vec<Kept>>,
    /// The journal of new keys, rotated at every save (without `state.write_ahead`: none).
    journal: Option<Arc<Journal>>,
    /// Saves only while this replica may emit (leader election): a deposed leader must not
    /// overwrite its successor's state.
    fence: Fence,
    stats: Arc<StateStats>,
    /// The stores' versions at the last successful save: an unchanged state is not rewritten.
    saved: Mutex<Option<Vec<u64>>>,
}

impl Keeper {
    /// A keeper of `watches` in `store` for cluster `cluster`, rotating `journal` at every
    /// save, saving only while `fence` is open, counting into `stats`.
    pub fn new(
        store: Arc<dyn StateStore>,
        cluster: &str,
        watches: Vec<Kept>,
        journal: Option<Arc<Journal>>,
        fence: Fence,
        stats: Arc<StateStats>,
    ) -> Arc<Self> {
        Arc::new(Keeper {
            store,
            cluster: cluster.to_owned(),
            watches: Arc::new(watches),
            journal,
            fence,
            stats,
            saved: Mutex::new(None),
        })
    }

    /// Where the state goes, for logs.
    pub fn describe(&self) -> &str {
        self.store.describe()
    }

    /// Starts a journal generation (with a journal), packs the acknowledged state of every
    /// watch (each store locked only while its own section is written, on a blocking thread)
    /// with that generation, stores it, then drops the older journal generations. Returns
    /// `Ok(None)` without writing when nothing changed since the last save and `force` is
    /// false.
    ///
    /// # Errors
    /// [`StateError`] from the backend or the packing task, and [`StateError::Fenced`] when
    /// this replica may no longer lead.
    pub async fn save(&self, force: bool) -> Result<Option<SaveReport>, StateError> {
        let result = self.save_inner(force).await;
        if let Err(e) = &result {
            if !matches!(e, StateError::Fenced) {
                self.stats.note_save_error(e);
            }
        }
        result
    }

    async fn save_inner(&self, force: bool) -> Result<Option<SaveReport>, StateError> {
        if !self.fence.is_open() {
            return Err(StateError::Fenced);
        }
        let versions: Vec<u64> = self.watches.iter().map(|w| w.store.version()).collect();
        let unchanged = self
            .saved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            == Some(&versions);
        if unchanged && !force {
            return Ok(None);
        }
        let started = Instant::now();
        // Records appended from here on are in the new generation; everything before is in
        // what is packed next (confirmed, or unconfirmed while outstanding).
        let generation = self.journal.as_ref().map_or(0, |j| j.rotate());
        let (watches, cluster) = (self.watches.clone(), self.cluster.clone());
        let packed = tokio::task::spawn_blocking(move || pack(&cluster, &watches, generation))
            .await
            .map_err(|e| StateError::Task {
                what: "packing",
                detail: e.to_string(),
            })?;
        let (bytes, mut report) = packed;
        if !self.fence.is_open() {
            return Err(StateError::Fenced);
        }
        let writing = Instant::now();
        self.store.save(bytes).await?;
        report.write = writing.elapsed();
        *self.saved.lock().unwrap_or_else(|p| p.into_inner()) = Some(versions);
        self.stats.note_saved(
            report.bytes,
            report.objects,
            report.unconfirmed,
            started.elapsed(),
        );
        if self.journal.is_some() {
            let dropping = Instant::now();
            if let Err(e) = self.store.drop_journal_before(generation).await {
                tracing::warn!(store = self.describe(), error = %e, "dropping the journal the saved state covers failed; the next save tries again (a restart replays a little more)");
            }
            report.journal_drop = dropping.elapsed();
        }
        Ok(Some(report))
    }

    /// Saves every `interval` until `cancel` fires (the final save is the caller's, after the
    /// pipeline drained). A failed save is logged and retried at the next tick.
    pub fn spawn(
        self: &Arc<Self>,
        interval: Duration,
        cancel: CancellationToken,
    ) -> JoinHandle<()> {
        let keeper = self.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match keeper.save(false).await {
                    Ok(Some(r)) => {
                        tracing::debug!(store = keeper.describe(), objects = r.objects, unconfirmed = r.unconfirmed, bytes = r.bytes, pack = ?r.pack, longest_lock = ?r.longest_lock, write = ?r.write, journal_drop = ?r.journal_drop, "informer state saved")
                    }
                    Ok(None) => {}
                    Err(StateError::Fenced) => {
                        tracing::debug!(
                            store = keeper.describe(),
                            "not saving the informer state: this replica may no longer lead"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(store = keeper.describe(), error = %e, "saving the informer state failed; retrying at the next interval")
                    }
                }
            }
        })
    }
}

/// The snapshot of `watches` at journal generation `generation`, and what packing it took.
fn pack(cluster: &str, watches: &[Kept], generation: u64) -> (Vec<u8>, SaveReport) {
    let started = Instant::now();
    let mut w = Writer::new(cluster, stats::now_ms(), generation);
    let mut report = SaveReport::default();
    for kept in watches {
        let locked = Instant::now();
        let (objects, unconfirmed) = kept
            .store
            .acknowledged(|a| w.section(&kept.key.identity, kept.key.selection, a));
        report.objects += objects;
        report.unconfirmed += unconfirmed;
        report.longest_lock = report.longest_lock.max(locked.elapsed());
    }
    let bytes = w.finish();
    report.bytes = bytes.len();
    report.pack = started.elapsed();
    (bytes, report)
}
