//! The informer state store contract: where the acknowledged state (`docs/restarts.md`) is
//! kept between runs. The bridge's `state` module owns the format, the journal and the
//! restore; a backend only stores bytes ([`StateStore`]). There are three: `file` in the
//! bridge, `nats` (a JetStream object store and a stream) in the NATS destination's crate,
//! and `kafka` (a compacted topic fenced by epoch) in the Kafka destination's crate.
//!
//! A backend kept by a destination's crate is registered by its `[state.NAME]` section, which
//! implements [`StateBackendConfig`]: the bridge's one registration list (`src/sinks.rs`)
//! adds it to `state.backend` and `[state]`, and the bridge checks, warns about and opens it
//! through that trait alone, handing it what it needs of the rest of the configuration as a
//! [`StateContext`].

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

use crate::Destination;

/// What a state backend's section sees of the rest of the configuration, without knowing its
/// types.
pub struct StateContext<'a> {
    /// Every `[[sinks]]` entry in file order (its index is its position in `sinks`), as its
    /// destination's [`Destination`]: a backend finds its own destination's entries with
    /// [`Destination::as_any`] (Kafka: the sink whose connection the state borrows).
    pub sinks: Vec<&'a dyn Destination>,
    /// The names of the clusters watched, in order (`cluster.name`, or each `[[clusters]]`
    /// entry's): what `{cluster}` stands for in a sink's templates.
    pub clusters: Vec<String>,
    /// Whether leader election is on (`leader_election.enabled`): replicas then take the
    /// store over from one another.
    pub leader_election: bool,
    /// This replica's identity (leader election's), for a store that tells its writers apart
    /// (Kafka's epoch fence names it). Empty while the configuration is only checked.
    pub identity: String,
}

/// A destination's `[state.NAME]` section: a state backend kept by its broker, registered in
/// the bridge's list (`src/sinks.rs`, which makes `NAME` a value of `state.backend` and the
/// section a field of `[state]`). Its keys are relative to `[state.NAME]` (`bucket`,
/// `auth.token`): the bridge prefixes `state.NAME.`. Read and checked only; nothing here
/// touches the network but the store [`StateBackendConfig::open`] returns, on first use.
pub trait StateBackendConfig: Send + Sync {
    /// Its name as written in `state.backend` (`"nats"`): the section's key under `[state]`.
    fn name(&self) -> &'static str;

    /// Problems the section alone shows (serde cannot see them), as `(key, message)`: checked
    /// when it is the selected backend.
    fn problems(&self) -> Vec<(String, String)>;

    /// Problems it shows only beside the rest of the configuration (a connection borrowed
    /// from a sink, a topic a sink also writes), as `(key, message)`: checked when it is the
    /// selected backend and its [`StateBackendConfig::inputs`] parsed, after every other
    /// section's problems, in the registered sections' order (with the other sections'
    /// [`StateBackendConfig::unselected`]). Default: none.
    fn problems_across(&self, ctx: &StateContext<'_>) -> Vec<(String, String)> {
        let _ = ctx;
        Vec::new()
    }

    /// The other top-level sections its checks beside the rest of the configuration read
    /// (`"sinks"`): when one of them did not parse, the loader leaves out both
    /// [`StateBackendConfig::problems_across`] and [`StateBackendConfig::unselected`] for this
    /// section. Default: none.
    fn inputs(&self) -> &'static [&'static str] {
        &[]
    }

    /// The message for a setting of this section given while `state.backend` is `backend`
    /// (`"none"`, `"file"` or another section's name): the setting would be ignored. The
    /// bridge names the setting's key before it. Default: says so and how to fix it.
    fn unselected(&self, backend: &str) -> String {
        let name = self.name();
        format!(
            "is a [state.{name}] setting but state.backend is \"{backend}\", so it would be ignored: set state.backend = \"{name}\" (KUBESINK_STATE__BACKEND={name}), or remove the [state.{name}] settings"
        )
    }

    /// Settings that work but weaken security or will not do what was meant (credentials
    /// without TLS, a store only this machine reaches), as `(key, message)`: warned about
    /// when it is the selected backend (`kubesink check` prints them, `kubesink run` logs
    /// them). Default: none.
    fn warnings(&self, ctx: &StateContext<'_>) -> Vec<(String, String)> {
        let _ = ctx;
        Vec::new()
    }

    /// The files the store reads when opened (credentials, certificates) as `(key, path)`:
    /// the store cannot be opened without them, so `kubesink check` names each that is not
    /// there (a warning; an error with `--strict`). Default: none.
    fn files(&self) -> Vec<(String, PathBuf)> {
        Vec::new()
    }

    /// The store of unit `unit` (a cluster, or one shard of it: its name keys the state in
    /// the store). With several units (`multi`), each keeps its own state: the section's
    /// configured object or key name gets `.{unit}` appended (its default is the unit's
    /// name). Does no I/O: the store connects on first use, so a broker that is down never
    /// prevents start-up.
    ///
    /// # Errors
    /// `(key, message)` when the settings cannot make a store (the loader has reported it
    /// already: checked by [`StateBackendConfig::problems_across`]); the bridge logs it and
    /// keeps no state.
    fn open(
        &self,
        unit: &str,
        multi: bool,
        ctx: &StateContext<'_>,
    ) -> Result<Arc<dyn StateStore>, (String, String)>;
}

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
    /// [`StateError::Damaged`] when the store was read and what it holds is known to be
    /// damaged or partly lost (the caller ignores the state: a full initial list);
    /// any other [`StateError`] when the store cannot be read (the caller waits and reads
    /// again, or with `state.write_ahead = false` starts without state: `restore.rs`).
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
    /// ([`StateError::Superseded`]: a deposed leader frozen past its fence's check could
    /// otherwise land an older state over its successor's).
    ///
    /// # Errors
    /// [`StateError`] when the store cannot be asked (the save is not attempted).
    async fn saved_generation(&self) -> Result<Option<u64>, StateError> {
        Ok(None)
    }

    /// Whether the store still holds what this writer saved, checked while nothing else is
    /// written (the keeper asks at every `state.interval` when the state is unchanged): a
    /// state lost while a writer is quiet would otherwise be found only by its next write,
    /// perhaps the final save at shutdown, or never before a crash. `Ok(false)`: it was lost
    /// (the Kafka state topic deleted, emptied, or created again; the backend is ready to
    /// write it anew), so the caller saves the whole state now. The default (file, NATS)
    /// answers `Ok(true)`: their next save stores the whole state anyway.
    ///
    /// # Errors
    /// [`StateError::Fenced`] when another writer took the state over; any other
    /// [`StateError`] when the store cannot be asked (tried again at the next interval).
    async fn verify(&self) -> Result<bool, StateError> {
        Ok(true)
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
    /// A broker-held backend failed: its error names the operation and where (`state.nats`:
    /// servers, bucket and object; `state.kafka`: brokers, topic and key).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
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
    /// The store was read, and what it holds is known to be damaged or partly lost (a
    /// snapshot chunk missing or failing its checksum, the Kafka state topic lost while a
    /// writer ran and not saved whole since). Unlike a store that cannot be read, this is not
    /// waited for: the state is ignored, and every watch lists and emits everything
    /// (`initial`, so consumers sweep on the sync marker), exactly as for a damaged state
    /// file. Replaying what survived (a journal without its snapshot) would send live objects
    /// as non-initial `added` and never the deletes the lost part could have inferred.
    #[error("state: the saved state is damaged or partly lost: {0}")]
    Damaged(String),
    /// The background task that packs, writes or runs a save failed.
    #[error("state: the {what} task failed: {detail}")]
    Task {
        /// `packing`, `writing`, `journal append` or `saving`.
        what: &'static str,
        /// The join error.
        detail: String,
    },
}
