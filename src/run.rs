//! `kubesink run`: the one entry that chooses what runs, one bridge for every configured
//! cluster (`crate::bridge`) or a scale-out group whose members each hold some clusters
//! through bridges of their own (`crate::scale_out`). The bridge knows nothing of the group.

use crate::config::{self, Config, MissingFile};

/// Prepares the process (open-files limit), logs the configuration's warnings, then runs
/// one bridge or a scale-out member until a signal.
///
/// # Errors
/// As [`crate::bridge::run`] or [`crate::scale_out::run`].
pub async fn run(config: Config) -> anyhow::Result<()> {
    crate::limits::prepare(&config);
    // A missing file is said as what it is here (where kubesink runs), not with `check`'s
    // "fine if it is mounted where kubesink runs".
    let missing = config::missing_files(&config);
    let as_warnings: Vec<String> = missing.iter().map(MissingFile::warning).collect();
    for w in crate::plan::warnings(&config) {
        if !as_warnings.contains(&w) {
            tracing::warn!("configuration: {w}");
        }
    }
    for m in &missing {
        tracing::warn!("configuration: {}", m.error());
    }
    if config.leader_election.enabled && config.leader_election.scale_out {
        crate::scale_out::run(config).await
    } else {
        crate::bridge::run(config).await
    }
}
