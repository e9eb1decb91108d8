//! Fault injection: the switches that make the simulator misbehave the way real API servers
//! and networks do, so kubesink's tests can prove it survives. This module owns only the
//! switches and the handles of open watches (so a switch can end or silence them); the
//! server consults the switches on every request. Admin requests under `/_sim/` are exempt.
//!
//! The switches, by concept:
//! - request failures (this file): the next N requests fail with 500 or 429 + `Retry-After`
//!   (how the API server signals overload, see
//!   <https://kubernetes.io/docs/concepts/cluster-administration/flow-control/>), a delay
//!   before every response;
//! - `status`: `Status` answers by path prefix or resource until cleared (401, 403, 404,
//!   429, 500, 503, …);
//! - `watches`: close, 410, silence, empty and damaged watch streams, watches that outlive
//!   their CustomResourceDefinition;
//! - `lists`: expired `continue` tokens and an explicit empty `continue` on the last page;
//! - `transport`: slow bodies (dribble) and an unreachable server (a network cut);
//! - `streaming`: whether streaming lists (`sendInitialEvents`) are served, refused or
//!   ignored, streaming lists cut or answered 410 before their end bookmark, and end
//!   bookmarks held back;
//! - `access`: permissions taken away (403 Forbidden, and `SelfSubjectAccessReview` answers
//!   that agree).

mod access;
mod lists;
mod status;
mod streaming;
mod transport;
mod watches;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use access::{Denial, DenialParseError};
pub use status::{FaultError, RequestMatch, INJECTABLE_STATUSES};
pub use streaming::{BreakKind, InitialEventsBreak, WatchListSupport};
pub use watches::DamageKind;
pub(crate) use watches::WatchControl;

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

/// The switches that [`Faults::clear`] resets, behind one mutex.
#[derive(Debug, Default)]
struct State {
    gone_watches: usize,
    delay: Duration,
    failures: usize,
    failure_kind: Option<FailureKind>,
    failure_prefix: Option<String>,
    /// Path prefixes of new watches that are accepted and then silent ("" = every path).
    silent_new_watches: Vec<String>,
    /// Path prefixes of new watches that answer 200 with an empty body.
    empty_watches: Vec<String>,
    damage: Option<watches::Damage>,
    keep_watches_after_crd_delete: bool,
    statuses: Vec<status::StatusOverride>,
    expire_continues: usize,
    explicit_empty_continue: bool,
    dribble: Option<(usize, Duration)>,
    initial_events_break: Option<streaming::InitialEventsBreak>,
    /// While set, streaming lists hold their end bookmark until it is cancelled.
    initial_events_end_hold: Option<CancellationToken>,
}

/// The fault switches of one simulator; reach them through `Simulator::faults()`.
///
/// Every switch is also reachable over HTTP under `/_sim/` (see the admin endpoint list in
/// the `kubesink-sim --help` output).
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<State>,
    open: Mutex<watches::OpenWatches>,
    /// Cancelled (and replaced) when the server becomes unreachable: every connection
    /// accepted before holds it and is dropped when it fires.
    cut: Mutex<CancellationToken>,
    unreachable: AtomicBool,
    damaged: AtomicU64,
    /// How streaming lists are served; not a fault, so [`Faults::clear`] keeps it.
    watch_list: Mutex<WatchListSupport>,
    /// Permissions taken away (`access`); the cluster's configuration, kept by
    /// [`Faults::clear`].
    denials: Mutex<Vec<Denial>>,
    /// How often each fault took effect (kept by [`Faults::clear`]): see [`Faults::effects`].
    effects: Mutex<BTreeMap<&'static str, u64>>,
}

/// Adds `prefix` to `rules` (`on`) or removes it; `None` stands for "every path" when adding
/// and for "every rule" when removing.
fn toggle_rule(rules: &mut Vec<String>, prefix: Option<&str>, on: bool) {
    match (prefix, on) {
        (p, true) => {
            let p = p.unwrap_or("").to_owned();
            if !rules.contains(&p) {
                rules.push(p);
            }
        }
        (Some(p), false) => rules.retain(|r| r != p),
        (None, false) => rules.clear(),
    }
}

fn prefix_matches(prefix: Option<&str>, path: &str) -> bool {
    prefix.is_none_or(|p| path.starts_with(p))
}

impl Faults {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
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

    /// Clears every switch: pending failures and 410 watches, delay, status overrides,
    /// silent/empty/damaged watch rules, the CRD watch bug, list faults, dribble, broken
    /// streaming lists, and makes the server reachable again (streaming-list support, the
    /// server's version rather than a fault, is kept, and so are denials, its RBAC). Watches already silenced stay silent; the damaged-event
    /// counter is kept.
    pub fn clear(&self) {
        let held = self.with(|s| std::mem::take(s).initial_events_end_hold);
        if let Some(t) = held {
            t.cancel();
        }
        self.set_unreachable(false);
    }

    /// Counts `n` effects of the fault `name` (a request failed, a watch closed, …).
    pub(crate) fn count_effect(&self, name: &'static str, n: u64) {
        if n > 0 {
            *self
                .effects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(name)
                .or_default() += n;
        }
    }

    /// How often each fault took effect since the simulator started, so a fault campaign can
    /// tell a fault that did something from one that did nothing: `failedRequests` (answered
    /// by `fail-requests`), `goneWatches` (410 ERROR events of `fail-watches`),
    /// `expiredContinues` (lists answered 410 by `expire-continue`), `damagedWatchEvents`,
    /// `closedWatches` and `silencedWatches` (open watches ended or silenced),
    /// `resetWatches` and `cutWatches` (open watches when connections were reset or the
    /// server became unreachable), `refusedConnections` (closed while unreachable) and
    /// `delayedResponses`. Kept by [`Faults::clear`].
    pub fn effects(&self) -> BTreeMap<&'static str, u64> {
        let mut m = self
            .effects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        m.insert("damagedWatchEvents", self.damaged_watch_events());
        m
    }

    /// The current response delay.
    pub fn delay(&self) -> Duration {
        self.with(|s| s.delay)
    }

    /// Consumes one pending failure if `path` matches; returns what to answer.
    pub(crate) fn take_failure(&self, path: &str) -> Option<FailureKind> {
        self.with(|s| {
            if s.failures == 0 || !prefix_matches(s.failure_prefix.as_deref(), path) {
                return None;
            }
            s.failures -= 1;
            s.failure_kind
        })
        .inspect(|_| self.count_effect("failedRequests", 1))
    }

    /// Consumes one pending "gone" watch.
    pub(crate) fn take_gone_watch(&self) -> bool {
        let take = self.with(|s| {
            let take = s.gone_watches > 0;
            s.gone_watches = s.gone_watches.saturating_sub(1);
            take
        });
        self.count_effect("goneWatches", u64::from(take));
        take
    }
}
