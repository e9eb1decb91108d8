//! A failure streak and the problem text beside it: the one definition behind "failing
//! since" and "what is wrong" in the sink, informer and state counters (`/readyz`, the
//! `*_failing_seconds` metrics, the logs).
//!
//! Two types, because one problem text can be written by several sources (a sink's send
//! errors and its healthcheck; the state's journal, saves and restore): [`Streak`] is when a
//! streak started, [`Problem`] the latest description. Both are lock-free or touched only
//! when something fails, never on the hot path of a healthy run. How a streak of a broker's
//! connection is told in the log (start, a summary a minute, end) is [`crate::outage`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::now_ms;

/// When the current failure streak started, as Unix milliseconds (0: not failing).
#[derive(Debug, Default)]
pub struct Streak {
    since_ms: AtomicU64,
}

impl Streak {
    /// Records a failure: the first of a streak sets its start; later ones keep it.
    pub fn fail(&self) {
        let _ = self
            .since_ms
            .compare_exchange(0, now_ms(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Ends the streak; returns how long it lasted, or `None` when it was not failing.
    pub fn end(&self) -> Option<Duration> {
        match self.since_ms.swap(0, Ordering::Relaxed) {
            0 => None,
            since => Some(Duration::from_millis(now_ms().saturating_sub(since))),
        }
    }

    /// How long the current streak has lasted; `None` when not failing.
    pub fn failing_for(&self) -> Option<Duration> {
        match self.since_ms.load(Ordering::Relaxed) {
            0 => None,
            since => Some(Duration::from_millis(now_ms().saturating_sub(since))),
        }
    }

    /// Whether a streak is running.
    pub fn is_failing(&self) -> bool {
        self.since_ms.load(Ordering::Relaxed) != 0
    }
}

/// The latest description of what is wrong, if anything (a mutex touched only on failures
/// and recoveries; a poisoned lock is taken over, since the text is always whole).
#[derive(Debug, Default)]
pub struct Problem {
    text: Mutex<Option<String>>,
}

impl Problem {
    /// Replaces the description (`None`: nothing is wrong).
    pub fn set(&self, text: Option<String>) {
        *self.text.lock().unwrap_or_else(|p| p.into_inner()) = text;
    }

    /// The description, if something is wrong.
    pub fn get(&self) -> Option<String> {
        self.text.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_starts_at_its_first_failure_and_ends_once() {
        let s = Streak::default();
        assert!(!s.is_failing());
        assert_eq!(s.failing_for(), None);
        s.fail();
        let start = s.since_ms.load(Ordering::Relaxed);
        assert_ne!(start, 0);
        s.fail();
        assert_eq!(
            s.since_ms.load(Ordering::Relaxed),
            start,
            "a later failure keeps the start"
        );
        assert!(s.is_failing());
        assert!(s.failing_for().is_some());
        assert!(s.end().is_some());
        assert_eq!(s.end(), None, "ended once");
        assert!(!s.is_failing());
    }

    #[test]
    fn a_problem_is_replaced_whole() {
        let p = Problem::default();
        assert_eq!(p.get(), None);
        p.set(Some("a".into()));
        p.set(Some("b".into()));
        assert_eq!(p.get().as_deref(), Some("b"));
        p.set(None);
        assert_eq!(p.get(), None);
    }
}
