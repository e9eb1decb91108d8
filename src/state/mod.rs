//! Acknowledged informer state that survives restarts and hand-overs (`docs/restarts.md`).
//!
//! - `snapshot.rs`: the versioned, checksummed file format (per watch: identity, selection
//!   fingerprint, list resourceVersion, the store's packed entries).
//! - `file.rs`, `nats.rs`: the two [`StateStore`] backends (`state.backend`): a local file
//!   written atomically, and a NATS JetStream object store that any replica can read.
//! - this file: [`open`] the configured backend, [`restore`] each watch's store at start-up
//!   (deciding per watch whether its part is usable, and saying why not), and the [`Keeper`]
//!   that saves the acknowledged state every `state.interval` and at shutdown.
//!
//! Bad state is never fatal: a missing, truncated, corrupt, foreign (other format version,
//! cluster or selection) or unreadable state is logged with the reason and ignored for the
//! affected watches, which then list and emit everything as without state; the next save
//! overwrites it. This module never decides what to emit (the informer's `Decider` does,
//! from the restored store) and never saves anything a sink has not confirmed: it reads the
//! informers' [`TrackedStore`]s, whose overlay holds back unacknowledged changes.

mod file;
#[cfg(feature = "nats")]
mod nats;
mod snapshot;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use snapshot::{parse, Snapshot, SnapshotError, Writer, FORMAT_VERSION, MAGIC};

use crate::config::{StateBackend, StateConfig};
use crate::informer::{LightStore, TrackedStore};

/// Where the state is kept: one blob, replaced whole on every save.
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

/// Loads the saved state and returns, for each of `watches` in order, its restored store,
/// or `None` (with a log line saying why) when there is no usable part for it.
pub async fn restore(
    store: &dyn StateStore,
    cluster: &str,
    watches: &[WatchKey],
) -> Vec<Option<LightStore>> {
    let started = Instant::now();
    let none = || watches.iter().map(|_| None).collect();
    let bytes = match store.load().await {
        Ok(Some(b)) => b,
        Ok(None) => {
            tracing::info!(
                store = store.describe(),
                "no saved informer state yet: every watch lists and emits everything (initial)"
            );
            return none();
        }
        Err(e) => {
            tracing::warn!(store = store.describe(), error = %e, "saved informer state ignored: it cannot be read; every watch lists and emits everything (initial)");
            return none();
        }
    };
    let snap = match snapshot::parse(&bytes) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(store = store.describe(), reason = %e, "saved informer state ignored: {e}; every watch lists and emits everything (initial); the next save overwrites it");
            return none();
        }
    };
    if snap.cluster != cluster {
        let reason = format!(
            "it is of cluster {:?}, this kubesink is cluster.name = {cluster:?}",
            snap.cluster
        );
        tracing::warn!(store = store.describe(), %reason, "saved informer state ignored: {reason}; every watch lists and emits everything (initial); the next save overwrites it");
        return none();
    }
    let age = UNIX_EPOCH
        .checked_add(Duration::from_millis(snap.written_at_ms))
        .and_then(|written| SystemTime::now().duration_since(written).ok())
        .unwrap_or_default();
    let damaged = snap.sections.iter().filter(|s| s.is_err()).count();
    if damaged > 0 || snap.sections.len() != snap.announced as usize {
        tracing::warn!(store = store.describe(), damaged, found = snap.sections.len(), announced = snap.announced, "saved informer state is partly damaged; the watches of the damaged parts list and emit everything");
    }
    let out = watches
        .iter()
        .map(|w| restore_watch(&snap, w, age))
        .collect();
    tracing::debug!(elapsed = ?started.elapsed(), bytes = bytes.len(), "informer state loaded");
    out
}

/// One watch's store from `snap`, or `None` with the reason logged.
fn restore_watch(snap: &Snapshot<'_>, w: &WatchKey, age: Duration) -> Option<LightStore> {
    let watch = w.identity.as_str();
    let ignored = |reason: String| {
        tracing::warn!(%watch, %reason, "saved state ignored for this watch: {reason}; it lists and emits everything (initial)");
        None
    };
    let found = snap.sections.iter().find(|s| match s {
        Ok(s) => s.identity == w.identity,
        Err(d) => d.identity.as_deref() == Some(&w.identity),
    });
    let section = match found {
        None => {
            return ignored(
                "no saved state for it (a watch added since the save, or its part was lost)".into(),
            )
        }
        Some(Err(d)) => return ignored(d.error.to_string()),
        Some(Ok(s)) => s,
    };
    if section.selection != w.selection {
        return ignored("the resource's selection changed since the save (apiVersion, namespaces, selectors, payload, fields, drop, updates, allow_secret_data or cluster.label): what it emits differs".into());
    }
    match section.store() {
        Ok(store) => {
            tracing::info!(%watch, objects = store.len(), list_resource_version = %section.list_resource_version, saved_ago = ?Duration::from_secs(age.as_secs()), "saved state restored: the first list emits only the differences");
            Some(store)
        }
        Err(e) => ignored(e.to_string()),
    }
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
    /// Acknowledged objects written, all watches.
    pub objects: u64,
    /// Size of the state, bytes.
    pub bytes: usize,
    /// Time to pack every watch's acknowledged state (locks included).
    pub pack: Duration,
    /// The longest a watch's store was locked while packed (its informer waits meanwhile).
    pub longest_lock: Duration,
    /// Time the backend took to store the bytes (file: write, fsync, rename).
    pub write: Duration,
}

/// Saves the acknowledged state of every watch: on an interval, and once more at shutdown.
pub struct Keeper {
    store: Arc<dyn StateStore>,
    cluster: String,
    watches: Arc<Vec<Kept>>,
    /// The stores' versions at the last successful save: an unchanged state is not rewritten.
    saved: Mutex<Option<Vec<u64>>>,
}

impl Keeper {
    /// A keeper of `watches` in `store` for cluster `cluster`.
    pub fn new(store: Arc<dyn StateStore>, cluster: &str, watches: Vec<Kept>) -> Arc<Self> {
        Arc::new(Keeper {
            store,
            cluster: cluster.to_owned(),
            watches: Arc::new(watches),
            saved: Mutex::new(None),
        })
    }

    /// Where the state goes, for logs.
    pub fn describe(&self) -> &str {
        self.store.describe()
    }

    /// Packs the acknowledged state of every watch (each store locked only while its own
    /// section is written, on a blocking thread) and stores it. Returns `Ok(None)` without
    /// writing when nothing changed since the last save and `force` is false.
    ///
    /// # Errors
    /// [`StateError`] from the backend or the packing task.
    pub async fn save(&self, force: bool) -> Result<Option<SaveReport>, StateError> {
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
        let (watches, cluster) = (self.watches.clone(), self.cluster.clone());
        let packed = tokio::task::spawn_blocking(move || pack(&cluster, &watches))
            .await
            .map_err(|e| StateError::Task {
                what: "packing",
                detail: e.to_string(),
            })?;
        let (bytes, mut report) = packed;
        let started = Instant::now();
        self.store.save(bytes).await?;
        report.write = started.elapsed();
        *self.saved.lock().unwrap_or_else(|p| p.into_inner()) = Some(versions);
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
                        tracing::debug!(store = keeper.describe(), objects = r.objects, bytes = r.bytes, pack = ?r.pack, longest_lock = ?r.longest_lock, write = ?r.write, "informer state saved")
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(store = keeper.describe(), error = %e, "saving the informer state failed; retrying at the next interval")
                    }
                }
            }
        })
    }
}

/// The snapshot of `watches` and what packing it took.
fn pack(cluster: &str, watches: &[Kept]) -> (Vec<u8>, SaveReport) {
    let started = Instant::now();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut w = Writer::new(cluster, now_ms);
    let mut report = SaveReport::default();
    for kept in watches {
        let locked = Instant::now();
        report.objects += kept
            .store
            .acknowledged(|a| w.section(&kept.key.identity, kept.key.selection, a));
        report.longest_lock = report.longest_lock.max(locked.elapsed());
    }
    let bytes = w.finish();
    report.bytes = bytes.len();
    report.pack = started.elapsed();
    (bytes, report)
}
