//! Acknowledged informer state that survives restarts and hand-overs (`docs/restarts.md`).
//!
//! - `snapshot.rs`: the versioned, checksummed file format (per watch: identity, selection
//!   fingerprint, list resourceVersion, the store's packed entries); `codec.rs`: the integers,
//!   strings and uid/resourceVersion forms it shares with the journal's frames.
//! - `journal.rs` (with `journal/frame.rs`, its format): the write-ahead journal of new keys
//!   between snapshots, so that a crash never leaves downstream with a key whose delete the
//!   restart cannot infer.
//! - `file.rs`, `nats.rs`: the two [`StateStore`] backends (`state.backend`): a local file
//!   written atomically with its journal beside it, and a NATS JetStream object store (with a
//!   stream for the journal) that any replica can read.
//! - `restore.rs`: [`restore`] each watch's store at start-up from the snapshot and the
//!   journal (deciding per watch whether its part is usable, and saying why not).
//! - `keeper.rs`: the [`Keeper`] that saves the acknowledged state every `state.interval` and
//!   at shutdown (rotating the journal around each snapshot), one save at a time.
//! - `stats.rs`: [`StateStats`], the counters behind the `kubesink_state_*` metrics.
//! - this file: the [`StateStore`] trait and [`open`] the configured backend.
//!
//! Bad state is never fatal: a missing, truncated, corrupt or foreign (other format version,
//! cluster or selection) state is logged with the reason and ignored for the affected
//! watches, which then list and emit everything as without state; the next save overwrites
//! it. A store that cannot be read at all is waited for (`restore.rs`): its state is
//! unknown, not absent, and starting without it would lose the deletes it could infer.
//!
//! This module never decides what to emit (the informer's `Decider` does, from the restored
//! store) and never saves anything a sink has not confirmed: it reads the
//! informers' [`TrackedStore`]s, whose overlay holds back unacknowledged changes.

mod codec;
mod file;
pub mod journal;
mod keeper;
#[cfg(feature = "nats")]
mod nats;
mod restore;
mod snapshot;
mod stats;

use std::sync::Arc;

use async_trait::async_trait;

pub use journal::Journal;
pub use keeper::{Keeper, Kept, SaveReport};
pub use restore::{read, restore, Restored, Saved};
pub use snapshot::{parse, Snapshot, SnapshotError, Writer, FORMAT_VERSION, MAGIC};
pub use stats::StateStats;

use crate::config::{StateBackend, StateConfig};

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
    /// [`StateError`] when the store cannot be read (the caller waits and reads again, or
    /// with `state.write_ahead = false` starts without state: `restore.rs`).
    async fn load(&self) -> Result<Option<Vec<u8>>, StateError>;

    /// Replaces the saved bytes, atomically: a reader sees the old or the new state whole.
    /// `generation` is the snapshot's journal generation (0 without a journal), kept beside
    /// it where the backend can (see [`StateStore::saved_generation`]).
    ///
    /// # Errors
    /// [`StateError`] when the store cannot be written (the caller retries at the next save).
    async fn save(&self, bytes: Vec<u8>, generation: u64) -> Result<(), StateError>;

    /// The journal generation of the saved state, when the backend keeps it beside the bytes
    /// (NATS: the object's metadata); `Ok(None)` when nothing was saved, or the backend does
    /// not keep it (file: one writer, the Pod that mounts the volume). Generations grow
    /// across replicas (a replica that takes over starts above every generation it read),
    /// so a saved generation above a replica's own means another replica took over and
    /// saved since: the keeper then neither saves nor drops journal generations
    /// ([`StateError::Superseded`]; issue 19, defect 4d: a deposed leader frozen past its
    /// fence's check could otherwise land an older state over its successor's).
    ///
    /// # Errors
    /// [`StateError`] when the store cannot be asked (the save is not attempted).
    async fn saved_generation(&self) -> Result<Option<u64>, StateError> {
        Ok(None)
    }

    /// Appends journal frames to generation `generation`, in order and durably: on `Ok` they
    /// survive a crash (and, as far as the backend provides, a power loss). One call is one
    /// group commit (file: one write, one fdatasync; NATS: one message per frame, all their
    /// PubAcks awaited).
    ///
    /// # Errors
    /// [`StateError`] when they could not all be stored (the journal retries them all; sends
    /// wait).
    async fn append(&self, generation: u64, frames: Vec<Vec<u8>>) -> Result<(), StateError>;

    /// Every stored journal segment, oldest first.
    ///
    /// # Errors
    /// [`StateError`] when the journal cannot be read (as for [`StateStore::load`]).
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
    /// Another replica saved a newer state (its generation `saved` is above this replica's
    /// `ours`, see [`StateStore::saved_generation`]): it took over, so this replica no
    /// longer leads and must not overwrite it.
    #[error("state: not saved, another replica saved a newer state since (generation {saved}, this replica's {ours}): it took over")]
    Superseded {
        /// The generation saved by the other replica.
        saved: u64,
        /// This replica's.
        ours: u64,
    },
    /// The background task that packs, writes or runs a save failed.
    #[error("state: the {what} task failed: {detail}")]
    Task {
        /// `packing`, `writing`, `journal append` or `saving`.
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
