//! Fault injection: close every open watch, answer the next watches with the 410 `Expired`
//! ERROR event, delay every response, and fail the next requests with 500 or 429 +
//! `Retry-After` (how the API server signals overload, see
//! <https://kubernetes.io/docs/concepts/cluster-administration/flow-control/>). This module
//! only holds the switches; the server consults them. Admin requests under `/_sim/` are exempt.

use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// What an injected request failure answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// 500 `InternalError` Status.
    Internal,
    /// 429 `TooManyRequests` Status with header `Retry-After: retry_after_secs`.
    TooManyRequests {
        /// Seconds in the `Retry-After` header.
        retry_after_secs: u64,
    },
}

#[derive(Debug, Default)]
struct State {
    gone_watches: usize,
    delay: Duration,
    failures: usize,
    failure_kind: Option<FailureKind>,
    failure_prefix: Option<String>,
}

/// The fault switches of one simulator; reach them through `Simulator::faults()`.
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<State>,
    watches: Mutex<CancellationToken>,
}

impl Faults {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Ends every watch stream open now (the client sees the response body end); later
    /// watches are unaffected.
    pub fn close_all_watches(&self) {
        let mut token = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        token.cancel();
        *token = CancellationToken::new();
    }

    /// The next `n` watch requests answer a single `ERROR` event carrying a 410 `Expired`
    /// Status, then end (as when the requested resourceVersion was compacted).
    pub fn fail_next_watches_with_gone(&self, n: usize) {
        self.with(|s| s.gone_watches = n);
    }

    /// Delays every response (list, get, write, watch start) by `delay`; zero disables.
    pub fn set_delay(&self, delay: Duration) {
        self.with(|s| s.delay = delay);
    }

    /// Fails the next `n` requests (any path) with `kind`.
    pub fn fail_next_requests(&self, n: usize, kind: FailureKind) {
        self.with(|s| {
            s.failures = n;
            s.failure_kind = Some(kind);
            s.failure_prefix = None;
        });
    }

    /// Fails the next `n` requests whose path starts with `path_prefix` with `kind`.
    pub fn fail_next_requests_matching(&self, n: usize, kind: FailureKind, path_prefix: &str) {
        self.with(|s| {
            s.failures = n;
            s.failure_kind = Some(kind);
            s.failure_prefix = Some(path_prefix.to_owned());
        });
    }

    /// Clears every fault (pending failures, gone watches, delay).
    pub fn clear(&self) {
        self.with(|s| *s = State::default());
    }

    /// The current response delay.
    pub fn delay(&self) -> Duration {
        self.with(|s| s.delay)
    }

    /// Consumes one pending failure if `path` matches; returns what to answer.
    pub(crate) fn take_failure(&self, path: &str) -> Option<FailureKind> {
        self.with(|s| {
            if s.failures == 0
                || s.failure_prefix
                    .as_deref()
                    .is_some_and(|p| !path.starts_with(p))
            {
                return None;
            }
            s.failures -= 1;
            s.failure_kind
        })
    }

    /// Consumes one pending "gone" watch.
    pub(crate) fn take_gone_watch(&self) -> bool {
        self.with(|s| {
            let take = s.gone_watches > 0;
            s.gone_watches = s.gone_watches.saturating_sub(1);
            take
        })
    }

    /// A token cancelled by the next `close_all_watches`.
    pub(crate) fn watch_token(&self) -> CancellationToken {
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
