//! The informer's failure policy as a pure table: (where the loop was, what failed) → (what
//! it does next, how long it waits first). No I/O, no logging, no counters: the informer
//! (`mod.rs`) logs and counts; this module only decides, so every row is a unit test, as
//! kube-runtime's `watcher::step` makes recovery a state transition.
//!
//! The one rule every row keeps: **a watch is never restarted from an older
//! resourceVersion than the last event or bookmark it processed.** Retrying "the same
//! request" after a watch failed means watching from the last resourceVersion seen, not from
//! the one the failed watch began at: re-watching from there would replay every event since
//! against the current store, and an older state would go out after a newer one
//! (`resourceVersion` going backwards per key after a connection reset). See the
//! API concepts on resuming watches:
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>.
//!
//! A streaming list's initial events (before the initial-events-end bookmark) are "during a
//! list": nothing of them can be resumed, only listed again.
//!
//! | failure | during a list | during a watch |
//! |---|---|---|
//! | 410 Gone / `Expired` | paged: list again from the first page, at once; streaming: stream again after a backoff (it has no resourceVersion to be too old: a server that keeps answering 410 must not be asked in a tight loop) | relist at once; after a backoff when the watch delivered nothing since the last list (marks the relist unproductive) |
//! | idle (no byte for `idle_timeout`) | list again, backoff | resume, at once |
//! | undecodable response | list again, backoff | resume (it replays the event), backoff from the 2nd; relist after [`DECODE_RETRIES_BEFORE_RELIST`] at one resourceVersion or without a resume point |
//! | 401 / 403 | list again, backoff | resume, backoff |
//! | 404 | list again, backoff | relist, backoff |
//! | 429 / 5xx | list again, backoff or `Retry-After` | resume, backoff or `Retry-After` |
//! | another status (400…) | list again, backoff | relist, backoff (the server refuses the resourceVersion) |
//! | transport (refused, reset…) | list again, backoff | resume, backoff |
//! | request could not be built | list again, backoff | resume, backoff |
//! | no streaming list (refused, or `sendInitialEvents` ignored), or its initial events cut | list again, backoff (with `initial_list = "auto"` the informer falls back to paged lists first: `mod.rs`) | — |
//!
//! "Resume" is a watch from the last resourceVersion processed; without one (never the case
//! after a completed list) it is a relist.

/// After this many undecodable events in a row at one resourceVersion, relist instead of
/// re-watching.
pub(super) const DECODE_RETRIES_BEFORE_RELIST: u32 = 3;

/// What failed, as far as the policy cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failed {
    /// 410 Gone / `Expired`.
    Gone,
    /// No byte (list) or no event or bookmark (watch) for `watch.idle_timeout`.
    Idle,
    /// A response or event line that does not decode; `in_a_row`: how many times in a row
    /// at the same resourceVersion, this one included (1 = the first).
    Decode {
        /// Consecutive failures at one resourceVersion.
        in_a_row: u32,
    },
    /// An error status (not 410).
    Status(u16),
    /// The connection failed or broke.
    Transport,
    /// The request could not be built.
    Request,
    /// The server does not serve the streaming list, or cut its initial events.
    Streaming,
}

/// Where the loop was when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Situation {
    /// The failure happened during a list (else a watch).
    pub listing: bool,
    /// That list is a streaming list (its initial events).
    pub streaming: bool,
    /// The loop knows the last resourceVersion it processed (always, once a list completed).
    pub resume_point: bool,
    /// The watch delivered at least one event or bookmark since the last list completed.
    pub delivered_since_list: bool,
    /// The last relist was already forced by a 410 that came before any event.
    pub unproductive_relist: bool,
}

/// What the loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    /// List (from the first page).
    List,
    /// Watch from the last resourceVersion processed.
    Resume,
}

/// How long the loop waits first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Not at all.
    No,
    /// The next backoff delay.
    Backoff,
    /// The next backoff delay, or the server's `Retry-After` when longer.
    BackoffOrRetryAfter,
}

/// The decision for one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recovery {
    /// Next request.
    pub then: Then,
    /// Wait before it.
    pub wait: Wait,
    /// The relist it starts is unproductive (a 410 before any event): its completion must
    /// not reset the backoff.
    pub unproductive: bool,
}

const fn r(then: Then, wait: Wait) -> Recovery {
    Recovery {
        then,
        wait,
        unproductive: false,
    }
}

/// The policy: see the module's table.
pub(super) fn recover(at: Situation, failed: Failed) -> Recovery {
    use Then::{List, Resume};
    use Wait::{Backoff, BackoffOrRetryAfter, No};
    if at.listing {
        return match failed {
            Failed::Gone if at.streaming => r(List, Backoff),
            Failed::Gone => r(List, No),
            Failed::Status(429 | 500..=599) => r(List, BackoffOrRetryAfter),
            _ => r(List, Backoff),
        };
    }
    // During a watch: "the same request" is a watch from the last resourceVersion seen.
    let resume = if at.resume_point { Resume } else { List };
    match failed {
        Failed::Gone if at.unproductive_relist || !at.delivered_since_list => Recovery {
            then: List,
            wait: Backoff,
            unproductive: true,
        },
        Failed::Gone => r(List, No),
        Failed::Idle => r(resume, No),
        Failed::Decode { in_a_row } if in_a_row >= DECODE_RETRIES_BEFORE_RELIST => r(List, Backoff),
        Failed::Decode { .. } if !at.resume_point => r(List, Backoff),
        Failed::Decode { in_a_row } if in_a_row > 1 => r(Resume, Backoff),
        Failed::Decode { .. } => r(Resume, No),
        Failed::Status(401 | 403) => r(resume, Backoff),
        Failed::Status(404) => r(List, Backoff),
        Failed::Status(429 | 500..=599) => r(resume, BackoffOrRetryAfter),
        Failed::Status(_) => r(List, Backoff),
        Failed::Transport | Failed::Request | Failed::Streaming => r(resume, Backoff),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Then::{List, Resume};
    use Wait::{Backoff, BackoffOrRetryAfter, No};

    const LIST: Situation = Situation {
        listing: true,
        streaming: false,
        resume_point: true,
        delivered_since_list: false,
        unproductive_relist: false,
    };
    /// A watch that delivered events since its list.
    const WATCH: Situation = Situation {
        listing: false,
        streaming: false,
        resume_point: true,
        delivered_since_list: true,
        unproductive_relist: false,
    };

    fn rec(then: Then, wait: Wait) -> Recovery {
        r(then, wait)
    }

    #[test]
    fn a_410_on_a_list_lists_again_at_once() {
        assert_eq!(recover(LIST, Failed::Gone), rec(List, No));
    }

    #[test]
    fn a_410_in_a_streaming_lists_initial_events_streams_again_after_a_backoff() {
        let streaming = Situation {
            streaming: true,
            ..LIST
        };
        assert_eq!(recover(streaming, Failed::Gone), rec(List, Backoff));
        assert_eq!(recover(streaming, Failed::Streaming), rec(List, Backoff));
        assert_eq!(
            recover(streaming, Failed::Status(503)),
            rec(List, BackoffOrRetryAfter)
        );
    }

    #[test]
    fn every_other_list_failure_lists_again_after_a_backoff() {
        for f in [
            Failed::Idle,
            Failed::Decode { in_a_row: 1 },
            Failed::Status(401),
            Failed::Status(403),
            Failed::Status(404),
            Failed::Status(400),
            Failed::Transport,
            Failed::Request,
        ] {
            assert_eq!(recover(LIST, f), rec(List, Backoff), "{f:?}");
        }
    }

    #[test]
    fn a_throttled_list_honours_retry_after() {
        for code in [429, 500, 503] {
            assert_eq!(
                recover(LIST, Failed::Status(code)),
                rec(List, BackoffOrRetryAfter)
            );
        }
    }

    #[test]
    fn a_410_on_a_productive_watch_relists_at_once() {
        assert_eq!(recover(WATCH, Failed::Gone), rec(List, No));
    }

    #[test]
    fn a_410_before_any_event_relists_after_a_backoff_and_marks_it_unproductive() {
        let want = Recovery {
            then: List,
            wait: Backoff,
            unproductive: true,
        };
        let empty = Situation {
            delivered_since_list: false,
            ..WATCH
        };
        assert_eq!(recover(empty, Failed::Gone), want);
        let again = Situation {
            unproductive_relist: true,
            ..WATCH
        };
        assert_eq!(recover(again, Failed::Gone), want);
    }

    #[test]
    fn an_idle_watch_resumes_at_once_from_the_last_resource_version() {
        assert_eq!(recover(WATCH, Failed::Idle), rec(Resume, No));
    }

    #[test]
    fn an_undecodable_event_is_replayed_then_relisted_after_three() {
        assert_eq!(
            recover(WATCH, Failed::Decode { in_a_row: 1 }),
            rec(Resume, No)
        );
        assert_eq!(
            recover(WATCH, Failed::Decode { in_a_row: 2 }),
            rec(Resume, Backoff)
        );
        assert_eq!(
            recover(WATCH, Failed::Decode { in_a_row: 3 }),
            rec(List, Backoff)
        );
    }

    #[test]
    fn an_undecodable_event_without_a_resume_point_relists() {
        let no_point = Situation {
            resume_point: false,
            ..WATCH
        };
        assert_eq!(
            recover(no_point, Failed::Decode { in_a_row: 1 }),
            rec(List, Backoff)
        );
    }

    #[test]
    fn a_forbidden_watch_resumes_after_a_backoff_keeping_the_store() {
        for code in [401, 403] {
            assert_eq!(recover(WATCH, Failed::Status(code)), rec(Resume, Backoff));
        }
    }

    #[test]
    fn a_404_on_a_watch_relists_after_a_backoff() {
        assert_eq!(recover(WATCH, Failed::Status(404)), rec(List, Backoff));
    }

    #[test]
    fn a_throttled_or_failing_server_is_resumed_from_the_last_resource_version() {
        for code in [429, 500, 502, 503, 504] {
            assert_eq!(
                recover(WATCH, Failed::Status(code)),
                rec(Resume, BackoffOrRetryAfter)
            );
        }
    }

    #[test]
    fn a_refused_watch_relists_after_a_backoff() {
        assert_eq!(recover(WATCH, Failed::Status(400)), rec(List, Backoff));
    }

    #[test]
    fn a_connection_reset_resumes_from_the_last_resource_version_not_the_watch_start() {
        assert_eq!(recover(WATCH, Failed::Transport), rec(Resume, Backoff));
        assert_eq!(recover(WATCH, Failed::Request), rec(Resume, Backoff));
    }

    #[test]
    fn without_a_resume_point_a_watch_failure_relists() {
        let no_point = Situation {
            resume_point: false,
            ..WATCH
        };
        for f in [
            Failed::Idle,
            Failed::Status(403),
            Failed::Status(503),
            Failed::Transport,
        ] {
            assert_eq!(recover(no_point, f).then, List, "{f:?}");
        }
    }
}
