//! `kubesink run`: the binary's edge, the last code that sees the raw configuration. It
//! logs the configuration's warnings, resolves it once into the [`Plan`](crate::plan::Plan)
//! and starts what the plan says: one bridge for every configured cluster
//! (`crate::bridge`) or a scale-out group whose members each hold some units through
//! bridges of their own (`crate::scale_out`). The bridge knows nothing of the group.

use crate::config::{self, Config, MissingFile};

/// Logs the configuration's warnings, resolves it, prepares the process (open-files
/// limit), then runs one bridge or a scale-out member until a signal.
///
/// # Errors
/// A filter that does not compile ([`crate::plan::PlanError`]; loading through
/// [`crate::plan::load`] refuses it first); as [`crate::bridge::run`] or
/// [`crate::scale_out::run`].
pub async fn run(config: Config) -> anyhow::Result<()> {
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
    let plan = crate::plan::resolve(&config)?;
    drop(config);
    crate::limits::prepare(plan.watches());
    if plan.scale_out {
        crate::scale_out::run(plan).await
    } else {
        crate::bridge::run(plan).await
    }
}
