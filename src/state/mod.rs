//! Acknowledged informer state that survives restarts and hand-overs (`docs/restarts.md`).
//!
//! - `snapshot.rs`: the versioned, checksummed file format (per watch: identity, selection
//!   fingerprint, list resourceVersion, the store's packed entries); `codec.rs`: the integers,
//!   strings and uid/resourceVersion forms it shares with the journal's frames.
//! - `journal.rs` (with `journal/frame.rs`, its format): the write-ahead journal of new keys
//!   between snapshots, so that a crash never leaves downstream with a key whose delete the
//!   restart cannot infer.
//! - `file.rs`: the bridge's own [`StateStore`] backend (`state.backend = "file"`; the trait
//!   is `kubesink_core::state`), a local file written atomically with its journal beside it.
//!   The others are kept by destinations' crates, which every replica reaches (a NATS
//!   JetStream object store, a compacted Kafka topic): registered in `src/sinks.rs`, opened
//!   through their `[state.NAME]` section's `StateBackendConfig::open`.
//! - `restore.rs`: [`restore`] each watch's store at start-up from the snapshot and the
//!   journal (deciding per watch whether its part is usable, and saying why not).
//! - `keeper.rs`: the [`Keeper`] that saves the acknowledged state every `state.interval` and
//!   at shutdown (rotating the journal around each snapshot), one save at a time.
//! - `stats.rs`: [`StateStats`], the counters behind the `kubesink_state_*` metrics.
//! - this file: [`open`] the configured backend (naming none of a destination's).
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
mod restore;
mod snapshot;
mod stats;
mod watch_key;

use std::sync::Arc;

pub use journal::Journal;
pub use keeper::{Keeper, Kept, SaveReport};
pub use kubesink_core::state::{JournalSegment, StateError, StateStore};
pub use restore::{read, restore, Restored, RestoredWatch, Saved};
pub use snapshot::{parse, Snapshot, SnapshotError, Writer, FORMAT_VERSION, MAGIC};
pub use stats::StateStats;
pub use watch_key::WatchKey;

use crate::config::{StateBackend, StateConfig};

/// `[state]` and what its backend takes from the rest of the configuration: the state
/// store's part of the plan (`crate::plan::resolve` builds it).
#[derive(Clone, Debug)]
pub struct StatePlan {
    /// `[state]`.
    pub config: StateConfig,
    /// The sinks' entries (a broker's backend may take its connection from its sink).
    pub sinks: Vec<crate::sinks::SinkConfig>,
    /// This replica's identity (`leader_election.identity`, else the host name): the
    /// writer a broker-held state store fences by.
    pub identity: String,
    /// The names of the configured clusters, in order (what `{cluster}` stands for in a
    /// sink's templates).
    pub clusters: Vec<String>,
    /// `leader_election.enabled`: replicas take the store over from one another.
    pub leader_election: bool,
}

impl StatePlan {
    /// What a registered backend's section sees of the rest of the plan
    /// ([`StateContext`](kubesink_core::state::StateContext)).
    pub fn context(&self) -> kubesink_core::state::StateContext<'_> {
        crate::config::state_context(
            &self.sinks,
            self.clusters.clone(),
            self.leader_election,
            self.identity.clone(),
        )
    }
}

/// The configured backend (`plan.config`) for cluster `cluster`, or `None` for
/// `state.backend = "none"`. With several clusters (`multi`), each has its own file
/// (`state.path` + `.{cluster}`), or its own object or key in a registered backend's store
/// (its section's `.{cluster}` suffix, [`StateBackendConfig::open`]). A registered backend is
/// opened by its section, given the sinks and this replica's leader-election identity
/// ([`StatePlan::context`]); settings that cannot make a store (checked when the
/// configuration was loaded) open none, logged. Does no I/O (the broker-held backends
/// connect on first use), so a broken store never prevents start-up.
///
/// [`StateBackendConfig::open`]: kubesink_core::state::StateBackendConfig::open
pub fn open(plan: &StatePlan, cluster: &str, multi: bool) -> Option<Arc<dyn StateStore>> {
    let state: &StateConfig = &plan.config;
    let store: Arc<dyn StateStore> = match state.backend {
        StateBackend::None => return None,
        StateBackend::File => {
            let mut path = state.path.clone().unwrap_or_default();
            if multi {
                let mut name = path.file_name().unwrap_or_default().to_os_string();
                name.push(format!(".{cluster}"));
                path.set_file_name(name);
            }
            Arc::new(file::FileStore::new(path))
        }
        #[allow(unreachable_patterns)] // a build without any registered backend
        backend => {
            let section = state.selected()?;
            let ctx = plan.context();
            match section.open(cluster, multi, &ctx) {
                Ok(store) => store,
                Err((key, message)) => {
                    tracing::error!(%cluster, "state.{}.{key}: {message}", backend.name());
                    return None;
                }
            }
        }
    };
    tracing::info!(%cluster, store = store.describe(), "informer state store");
    Some(store)
}
