//! Process limits kubesink depends on: open files (`RLIMIT_NOFILE`, see `getrlimit(2)`).
//!
//! Every open watch holds one connection to the API server: kube's client speaks HTTP/1.1
//! only, and an HTTP/1.1 connection carries one streaming response at a time, so N watches
//! (one per resource and listed namespace) hold N sockets, plus the sockets of lists in
//! progress, the sinks' connections and the HTTP server. The common soft limit of 1,024
//! open files is reached with a thousand namespaces. As Go's runtime does at start-up,
//! [`raise_open_files_limit`] raises the soft limit to the hard limit; [`fd_budget`] says
//! whether the configured watches fit, for `kubesink check` and the start-up log.
//!
//! This module never changes anything but the process's own soft limit.

/// File descriptors kept aside for everything but the watches: lists in progress, sink
/// connections, the HTTP server and its clients, the runtime, logs.
pub const RESERVED_FDS: u64 = 64;

/// The open-files limits of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit in force now.
    pub soft: u64,
    /// The hard limit (the ceiling an unprivileged process may raise its soft limit to).
    pub hard: u64,
    /// The soft limit before [`raise_open_files_limit`] raised it, if it did.
    pub raised_from: Option<u64>,
}

/// Why the limit could not be read or raised.
#[derive(Debug, thiserror::Error)]
#[error("open-files limit (RLIMIT_NOFILE): {0}")]
pub struct LimitError(#[from] std::io::Error);

/// The current open-files limits.
///
/// # Errors
/// [`LimitError`] when `getrlimit` fails.
pub fn open_files() -> Result<OpenFiles, LimitError> {
    let (soft, hard) = rlimit::Resource::NOFILE.get()?;
    Ok(OpenFiles {
        soft,
        hard,
        raised_from: None,
    })
}

/// Raises the soft open-files limit to the hard limit (no-op when it already is).
///
/// # Errors
/// [`LimitError`] when `getrlimit` or `setrlimit` fails.
pub fn raise_open_files_limit() -> Result<OpenFiles, LimitError> {
    let before = open_files()?;
    let soft = rlimit::increase_nofile_limit(u64::MAX)?;
    Ok(OpenFiles {
        soft,
        hard: before.hard,
        raised_from: (soft > before.soft).then_some(before.soft),
    })
}

/// A warning when `watches` watches ([`crate::plan::Plan::watches`]) cannot fit under a
/// limit of `limit` open files, else `None`. `limit` is the soft limit kubesink will run
/// with (the hard limit, once raised).
pub fn fd_budget(watches: u64, limit: u64) -> Option<String> {
    let needed = watches + RESERVED_FDS;
    (needed > limit).then(|| {
        format!(
            "{watches} watches need about {needed} open files (one connection each, plus \
             {RESERVED_FDS}), but the open-files limit is {limit}: watches will fail with \"too \
             many open files\". Raise the limit (ulimit -n, systemd LimitNOFILE, the container \
             runtime's nofile ulimit) or watch fewer namespaces (one watch of all namespaces \
             with a field selector instead of one per namespace)"
        )
    })
}

/// At start-up: raises the soft limit to the hard limit (logged at info when it moved) and
/// warns when `watches` watches cannot fit even so.
pub fn prepare(watches: u64) {
    match raise_open_files_limit() {
        Ok(l) => {
            if let Some(from) = l.raised_from {
                tracing::info!(
                    from,
                    to = l.soft,
                    "raised the open-files soft limit to the hard limit"
                );
            }
            if let Some(warning) = fd_budget(watches, l.soft) {
                tracing::warn!(watches, limit = l.soft, "{warning}");
            }
        }
        Err(e) => tracing::warn!("{e}: cannot tell whether the watches fit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ResourceConfig};

    #[test]
    fn each_listed_namespace_is_a_watch_and_the_budget_says_when_they_do_not_fit() {
        let mut config = Config::default();
        let mut pods = ResourceConfig::new("v1", "Pod");
        pods.namespaces = (0..1500).map(|i| format!("ns-{i}")).collect();
        config.resources = vec![pods, ResourceConfig::new("v1", "Node")];
        let watches = crate::plan::resolve(&config).expect("resolves").watches();
        assert_eq!(watches, 1501);
        let warning = fd_budget(watches, 1024).expect("1501 watches do not fit in 1024");
        assert!(
            warning.contains("1501 watches need about 1565 open files"),
            "{warning}"
        );
        assert!(warning.contains("limit is 1024"), "{warning}");
        assert_eq!(fd_budget(watches, 1565), None);
    }

    #[test]
    fn raising_the_limit_never_lowers_it() {
        let before = open_files().expect("getrlimit");
        let after = raise_open_files_limit().expect("setrlimit");
        assert_eq!(after.soft, before.hard.max(before.soft));
        assert_eq!(after.hard, before.hard);
    }
}
