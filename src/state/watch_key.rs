//! How the saved state names a watch: its identity and selection fingerprint.

/// One watch as the state knows it.
#[derive(Clone, Debug)]
pub struct WatchKey {
    /// `{group}/{Kind}/{namespace}` (`WatchPlan::identity`).
    pub identity: String,
    /// The selection fingerprint (`WatchPlan::selection`).
    pub selection: u64,
    /// The identity whose saved state this watch starts from when it has none of its own:
    /// a sink's view starts from the shared view's (`bridge/routes.rs`). `None`: none.
    pub seed: Option<String>,
}
