//! An outage of a remote (a NATS server, the Kafka brokers) as the log tells it: one WARN
//! when it starts, at most one WARN per [`SUMMARY_EVERY`] while it lasts (how long, how many
//! failed attempts, the last error), one INFO when it ends (the same counts). The client
//! libraries report every failed reconnect (async-nats an event a second, librdkafka a log
//! line and an error per broker and retry); this is the one place that turns those into
//! those few lines, for the NATS sink, the NATS state store and the Kafka sink.
//!
//! It is the logging side of a failure streak ([`Streak`](crate::Streak) is the `/readyz`
//! side): [`Tally`] is the pure step (state, event, now) → (state, line to log), tested row by
//! row; [`Outage`] holds one behind a mutex, takes the time and writes the lines. Callbacks
//! of client libraries run on their own threads: nothing here blocks or awaits. Never
//! decides anything about delivery.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// While an outage lasts, at most one summary line per this long.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// The counts of an outage: the pure state behind [`Outage`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// When the outage started; `None`: the remote is reachable.
    started: Option<Instant>,
    /// Failed attempts since it started.
    failures: u64,
    /// When the last line about it was logged (its start or a summary).
    last_line: Option<Instant>,
    /// The last error recorded.
    last_error: Option<String>,
}

/// What a [`Tally`] step asks to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    /// The outage started (WARN), with its first cause.
    Started {
        /// What failed first.
        cause: String,
    },
    /// It still lasts (WARN): at most one per summary interval.
    Lasting {
        /// Since its start.
        down_for: Duration,
        /// Failed attempts since its start.
        failures: u64,
        /// The last error recorded.
        last_error: String,
    },
    /// It ended (INFO).
    Ended {
        /// How long it lasted.
        down_for: Duration,
        /// Failed attempts during it.
        failures: u64,
        /// The last error recorded during it.
        last_error: String,
    },
}

impl Tally {
    /// Whether an outage is running.
    pub fn is_down(&self) -> bool {
        self.started.is_some()
    }

    /// The last error recorded during the running outage.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Failed attempts since the running outage started (0: none running).
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Something failed at `now` because of `cause`: a failed attempt when `attempt` (counted),
    /// else the connection lost or an error that says more about the cause (not counted).
    /// Starts an outage when none runs ([`Line::Started`]); during one, returns
    /// [`Line::Lasting`] when `every` passed since its last line.
    pub fn fail(
        &mut self,
        now: Instant,
        cause: &str,
        attempt: bool,
        every: Duration,
    ) -> Option<Line> {
        if attempt {
            self.failures += 1;
        }
        self.last_error = Some(cause.to_owned());
        let Some(started) = self.started else {
            self.started = Some(now);
            self.last_line = Some(now);
            return Some(Line::Started {
                cause: cause.to_owned(),
            });
        };
        let last = self.last_line.unwrap_or(started);
        if now.saturating_duration_since(last) < every {
            return None;
        }
        self.last_line = Some(now);
        Some(Line::Lasting {
            down_for: now.saturating_duration_since(started),
            failures: self.failures,
            last_error: cause.to_owned(),
        })
    }

    /// Records `cause` as the last error without counting an attempt or logging (a detail
    /// learned beside the failure, e.g. a server pool's per-server error). Does nothing when
    /// no outage runs.
    pub fn note(&mut self, cause: &str) {
        if self.started.is_some() {
            self.last_error = Some(cause.to_owned());
        }
    }

    /// The remote answered at `now`: ends the running outage ([`Line::Ended`]); `None` when
    /// none ran.
    pub fn end(&mut self, now: Instant) -> Option<Line> {
        let started = self.started?;
        let ended = Line::Ended {
            down_for: now.saturating_duration_since(started),
            failures: self.failures,
            last_error: self.last_error.take().unwrap_or_default(),
        };
        *self = Tally::default();
        Some(ended)
    }
}

/// One remote's outages, logged as [`Tally`] says: WARN at the start, a WARN summary at most
/// every [`SUMMARY_EVERY`], INFO at the end. Every line carries `sink = NAME` and says what is
/// unreachable (`NATS`, `Kafka brokers`) and how it is retried. Shared by reference between a
/// client's callbacks; cheap when nothing fails (one uncontended lock per call).
#[derive(Debug)]
pub struct Outage {
    name: String,
    what: &'static str,
    retrying: &'static str,
    every: Duration,
    tally: Mutex<Tally>,
    /// The latest failure was an answer (the remote refused: an HTTP 5xx, 429…), not a
    /// remote out of reach: the lines say so.
    answering: AtomicBool,
}

/// Formats a duration for a log line in tenths of a second (`12.3s`, `1m 5.2s`).
fn tenths(d: Duration) -> String {
    let tenths = d.as_millis() / 100;
    let (mins, rest) = (tenths / 600, tenths % 600);
    if mins > 0 {
        format!("{mins}m {}.{}s", rest / 10, rest % 10)
    } else {
        format!("{}.{}s", rest / 10, rest % 10)
    }
}

impl Outage {
    /// The outages of `what` (`"NATS"`, `"Kafka brokers"`) as seen by `name` (the `sink`
    /// field of the lines); `retrying` says how the client retries, for the first line
    /// (`"reconnecting every second at most"`).
    pub fn new(name: &str, what: &'static str, retrying: &'static str) -> Self {
        Outage {
            name: name.to_owned(),
            what,
            retrying,
            every: SUMMARY_EVERY,
            tally: Mutex::new(Tally::default()),
            answering: AtomicBool::new(false),
        }
    }

    /// The same with another summary interval (tests).
    pub fn with_summary_every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A failed attempt (counted; see [`Tally::fail`]), logged as the outage's start or
    /// summary when it is one.
    pub fn failed(&self, cause: &str) {
        self.answering.store(false, Ordering::Relaxed);
        let line = self.tally().fail(Instant::now(), cause, true, self.every);
        self.log(line);
    }

    /// A failed attempt the remote answered (an HTTP 5xx, 429: it refused, it is not out of
    /// reach), counted and logged as [`Outage::failed`] in those words.
    pub fn failed_answering(&self, cause: &str) {
        self.answering.store(true, Ordering::Relaxed);
        let line = self.tally().fail(Instant::now(), cause, true, self.every);
        self.log(line);
    }

    /// The connection was lost (not an attempt: not counted); starts an outage when none
    /// runs.
    pub fn lost(&self, cause: &str) {
        self.answering.store(false, Ordering::Relaxed);
        let line = self.tally().fail(Instant::now(), cause, false, self.every);
        self.log(line);
    }

    /// An outage the caller already logged in its own words (a server unreachable at
    /// start-up): starts it without a line, so its end is still logged with its counts.
    pub fn started_quietly(&self, cause: &str) {
        let _ = self.tally().fail(Instant::now(), cause, false, self.every);
    }

    /// A more precise cause of the running outage (not counted, not logged).
    pub fn note(&self, cause: &str) {
        self.tally().note(cause);
    }

    /// The remote answered: logs the end of the running outage with its counts. Returns
    /// whether one ran.
    pub fn recovered(&self) -> bool {
        let line = self.tally().end(Instant::now());
        let ran = line.is_some();
        self.log(line);
        ran
    }

    /// Whether an outage is running.
    pub fn is_down(&self) -> bool {
        self.tally().is_down()
    }

    /// Whether an outage is running and its latest failure had no answer (the remote out of
    /// reach, not refusing).
    pub fn is_unanswered(&self) -> bool {
        !self.answering.load(Ordering::Relaxed) && self.is_down()
    }

    /// Failed attempts since the running outage started (0: none running).
    pub fn failures(&self) -> u64 {
        self.tally().failures()
    }

    fn log(&self, line: Option<Line>) {
        let (sink, what) = (&self.name, self.what);
        let (down, recovered) = match self.answering.load(Ordering::Relaxed) {
            true => ("answers with errors", "accepts again"),
            false => ("unreachable", "reachable again"),
        };
        match line {
            None => {}
            Some(Line::Started { cause }) => tracing::warn!(
                sink = %sink,
                cause = %cause,
                "{what} {down}; {}, changes wait (one line a minute while it lasts, one when it ends)",
                self.retrying
            ),
            Some(Line::Lasting {
                down_for,
                failures,
                last_error,
            }) => tracing::warn!(
                sink = %sink,
                down_for = %tenths(down_for),
                failed_attempts = failures,
                last_error = %last_error,
                "{what} still {down}; {}",
                self.retrying
            ),
            Some(Line::Ended {
                down_for,
                failures,
                last_error,
            }) => tracing::info!(
                sink = %sink,
                down_for = %tenths(down_for),
                failed_attempts = failures,
                last_error = %last_error,
                "{what} {recovered}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn an_outage_starts_once_then_is_summed_up_once_a_minute() {
        let t0 = Instant::now();
        let mut t = Tally::default();
        assert_eq!(
            t.fail(t0, "refused", true, MIN),
            Some(Line::Started {
                cause: "refused".into()
            })
        );
        for s in 1..60 {
            assert_eq!(t.fail(at(t0, s), "refused", true, MIN), None, "second {s}");
        }
        assert_eq!(
            t.fail(at(t0, 60), "timed out", true, MIN),
            Some(Line::Lasting {
                down_for: MIN,
                failures: 61,
                last_error: "timed out".into()
            })
        );
        assert_eq!(t.fail(at(t0, 61), "refused", true, MIN), None);
        assert!(matches!(
            t.fail(at(t0, 120), "refused", true, MIN),
            Some(Line::Lasting { failures: 63, .. })
        ));
    }

    #[test]
    fn the_end_reports_duration_attempts_and_last_error_and_resets() {
        let t0 = Instant::now();
        let mut t = Tally::default();
        assert_eq!(t.end(t0), None, "no outage, nothing to end");
        assert!(t.fail(t0, "connection lost", false, MIN).is_some());
        assert_eq!(t.failures(), 0, "losing the connection is not an attempt");
        t.fail(at(t0, 1), "refused", true, MIN);
        t.note("nats://a:4222: Connection refused (os error 111)");
        t.fail(at(t0, 2), "refused", true, MIN);
        t.note("nats://a:4222: Connection refused (os error 111)");
        assert!(t.is_down());
        assert_eq!(
            t.end(at(t0, 10)),
            Some(Line::Ended {
                down_for: Duration::from_secs(10),
                failures: 2,
                last_error: "nats://a:4222: Connection refused (os error 111)".into()
            })
        );
        assert_eq!(t, Tally::default());
        assert_eq!(t.end(at(t0, 11)), None, "ended once");
        assert!(
            matches!(
                t.fail(at(t0, 12), "refused", true, MIN),
                Some(Line::Started { .. })
            ),
            "the next failure starts the next outage"
        );
    }

    #[test]
    fn a_note_outside_an_outage_is_ignored() {
        let mut t = Tally::default();
        t.note("stale");
        assert_eq!(t, Tally::default());
    }

    #[test]
    fn durations_are_logged_in_tenths_of_a_second() {
        assert_eq!(tenths(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(tenths(Duration::from_millis(65_250)), "1m 5.2s");
        assert_eq!(tenths(Duration::ZERO), "0.0s");
    }

    #[test]
    fn the_shared_outage_counts_across_threads() {
        let o = std::sync::Arc::new(Outage::new("s", "NATS", "reconnecting"));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let o = o.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        o.failed("refused");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(o.failures(), 400);
        assert!(o.recovered());
        assert!(!o.is_down());
        assert!(!o.recovered());
    }
}
