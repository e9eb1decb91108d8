//! librdkafka's callbacks (its log lines and client errors, into `tracing` with the sink's
//! name) and what they tell about the brokers ([`BrokerWatch`]): librdkafka's last client
//! error since the brokers last answered (e.g. "Connect to ipv4#127.0.0.1:9092 failed:
//! Connection refused"), the brokers' outages as the log tells them (a WARN at the start, a
//! summary a minute, an INFO with the counts at the end, instead of librdkafka's ERROR line
//! per failed reconnect), whether librdkafka reported every broker down, and whether a
//! broker-up watcher runs; and
//! what librdkafka's statistics tell about one producer's idempotence state
//! ([`EpochWatch`]: its producer id and epoch). The callbacks run on librdkafka's threads:
//! they only record, notify and log, never block.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kubesink_core::{Outage, ReadySignal};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;

use crate::errors::{classify, SendFailure};
use crate::rebuild::EPOCH_BUMPS_BEFORE_REBUILD;

/// librdkafka callbacks: its log lines and client errors go to `tracing`, tagged with the
/// sink name; the last client error is kept for the sink's errors ([`BrokerWatch`]); the
/// statistics' producer id and epoch go to the producer's [`EpochWatch`].
pub struct KafkaContext {
    sink: String,
    watch: BrokerWatch,
    epoch: Arc<EpochWatch>,
}

impl KafkaContext {
    /// The context of one producer of sink `sink`, recording into `watch` (shared by the
    /// sink's producers) and `epoch` (this producer's).
    pub fn new(sink: &str, watch: &BrokerWatch, epoch: &Arc<EpochWatch>) -> Self {
        KafkaContext {
            sink: sink.to_owned(),
            watch: watch.clone(),
            epoch: epoch.clone(),
        }
    }
}

/// One producer's idempotence state as librdkafka's statistics (`statistics.interval.ms`)
/// report it: its producer id and epoch, and the epoch at its last successful delivery.
/// When the epoch runs [`EPOCH_BUMPS_BEFORE_REBUILD`] ahead of that, the brokers keep
/// rejecting the producer id, and [`EpochWatch::wedged`] resolves.
#[derive(Debug)]
pub struct EpochWatch {
    producer_id: AtomicI64,
    epoch: AtomicI64,
    at_last_delivery: AtomicI64,
    wedged: tokio::sync::Notify,
}

impl Default for EpochWatch {
    fn default() -> Self {
        EpochWatch {
            producer_id: AtomicI64::new(-1),
            epoch: AtomicI64::new(-1),
            at_last_delivery: AtomicI64::new(-1),
            wedged: tokio::sync::Notify::new(),
        }
    }
}

impl EpochWatch {
    /// Records one statistics report (`eos.producer_id`, `eos.producer_epoch`; -1: none
    /// assigned yet). A producer id seen for the first time counts from its epoch then.
    fn note(&self, producer_id: i64, epoch: i64) {
        let previous = self.producer_id.swap(producer_id, Ordering::Relaxed);
        self.epoch.store(epoch, Ordering::Relaxed);
        if previous != producer_id {
            self.at_last_delivery.store(epoch, Ordering::Relaxed);
        }
        if self.bumps() >= EPOCH_BUMPS_BEFORE_REBUILD {
            self.wedged.notify_one();
        }
    }

    /// A record was delivered: the epoch it has now is the producer's working one.
    pub(super) fn delivered(&self) {
        self.at_last_delivery
            .store(self.epoch.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Epoch bumps since the last successful delivery (as of the last statistics report).
    pub(super) fn bumps(&self) -> i64 {
        let at = self.at_last_delivery.load(Ordering::Relaxed);
        if at < 0 {
            return 0;
        }
        self.epoch.load(Ordering::Relaxed).saturating_sub(at)
    }

    /// The producer id of the last statistics report (-1: none yet).
    pub(super) fn producer_id(&self) -> i64 {
        self.producer_id.load(Ordering::Relaxed)
    }

    /// Resolves once a statistics report showed [`EPOCH_BUMPS_BEFORE_REBUILD`] bumps since the
    /// last delivery (at once if one did since the last wait). Cancel-safe.
    pub(super) async fn wedged(&self) {
        self.wedged.notified().await;
    }
}

/// The part of librdkafka's statistics JSON (`STATISTICS.md`) the sink reads; the rest is
/// skipped without being decoded.
#[derive(serde::Deserialize)]
struct Statistics {
    eos: Option<Eos>,
}

#[derive(serde::Deserialize)]
struct Eos {
    producer_id: i64,
    producer_epoch: i64,
}

/// What the sink knows of its brokers' reachability, shared by the librdkafka context (which
/// records client errors from librdkafka's threads), the service and the broker-up watcher.
///
/// - The last client error since the brokers last answered (named in failed sends).
/// - The outage as the log tells it ([`Outage`]): librdkafka reports every failed connection
///   (a `FAIL` log line and a `BrokerTransportFailure` error per broker and retry, every
///   `reconnect.backoff.max.ms`); here the first starts an outage (one WARN), the errors are
///   counted as failed attempts, a summary is logged a minute, and once the brokers answer
///   again and no connection failed for [`BrokerWatch::quiet`] one INFO says how long it
///   lasted and how many attempts failed. Waiting for the quiet keeps a cluster with one
///   broker of several down in one outage instead of one per healthcheck.
/// - Whether librdkafka reported every broker down (`ALL_BROKERS_DOWN`, raised as soon as the
///   last broker connection fails, e.g. a killed broker's closed socket): the healthcheck
///   then fails at once instead of waiting `healthcheck_timeout` for metadata, and the
///   health signal makes the readiness probe run it at once. (A broker that stops answering
///   without closing its connections is found by librdkafka's own timeouts:
///   `socket.timeout.ms` for requests, `socket.connection.setup.timeout.ms` for connects,
///   librdkafka `CONFIGURATION.md`.)
#[derive(Clone)]
pub struct BrokerWatch {
    inner: Arc<BrokerState>,
    ready: ReadySignal,
    health: ReadySignal,
}

impl Default for BrokerWatch {
    /// The watch of a sink named `kafka` with the default quiet time.
    fn default() -> Self {
        BrokerWatch::new("kafka", DEFAULT_QUIET)
    }
}

/// How long no broker connection may fail before an outage counts as over: twice kubesink's
/// default `reconnect.backoff.max.ms` (1 s), so a broker still down is retried at least once
/// in it.
pub const DEFAULT_QUIET: Duration = Duration::from_secs(2);

struct BrokerState {
    /// librdkafka's last client error since the brokers last answered: (fatal, text).
    last_error: Mutex<Option<(bool, String)>>,
    /// A broker-up watcher task is running.
    watching: AtomicBool,
    /// librdkafka reported every broker down, and no metadata request answered since.
    all_down: AtomicBool,
    /// Notified when librdkafka reports every broker down.
    went_down: tokio::sync::Notify,
    /// When a broker connection last failed.
    last_failure: Mutex<Option<Instant>>,
    outage: Outage,
    quiet: Duration,
}

impl BrokerWatch {
    /// The watch of sink `sink`; an outage ends once the brokers answer and no connection
    /// failed for `quiet` (see the type's doc).
    pub fn new(sink: &str, quiet: Duration) -> Self {
        BrokerWatch {
            inner: Arc::new(BrokerState {
                last_error: Mutex::new(None),
                watching: AtomicBool::new(false),
                all_down: AtomicBool::new(false),
                went_down: tokio::sync::Notify::new(),
                last_failure: Mutex::new(None),
                outage: Outage::new(
                    sink,
                    "Kafka brokers",
                    "librdkafka reconnects (reconnect.backoff.max.ms)",
                ),
                quiet,
            }),
            ready: ReadySignal::default(),
            health: ReadySignal::default(),
        }
    }

    /// librdkafka's last client error since the brokers last answered, e.g. "Connect to
    /// ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)".
    pub fn last_error(&self) -> Option<String> {
        self.lock().as_ref().map(|(_, e)| e.clone())
    }

    /// The signal notified when the brokers answer again.
    pub fn ready(&self) -> &ReadySignal {
        &self.ready
    }

    /// The signal notified when librdkafka reports every broker down, and when they answer
    /// again after that: the readiness probe runs the healthcheck at once.
    pub fn health(&self) -> &ReadySignal {
        &self.health
    }

    /// The brokers' outages as they are logged.
    pub fn outage(&self) -> &Outage {
        &self.inner.outage
    }

    /// How long no connection may fail before an outage counts as over.
    pub fn quiet(&self) -> Duration {
        self.inner.quiet
    }

    /// Whether librdkafka reported every broker down and no metadata request answered since.
    pub fn all_down(&self) -> bool {
        self.inner.all_down.load(Ordering::Acquire)
    }

    /// Resolves when librdkafka next reports every broker down (create and
    /// [`enable`](tokio::sync::futures::Notified::enable) it before looking at
    /// [`BrokerWatch::all_down`], so a report in between is not missed).
    pub(super) fn went_down(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.went_down.notified()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(bool, String)>> {
        self.inner
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks a broker-up watcher as running; returns whether one was running already.
    pub(super) fn start_watching(&self) -> bool {
        self.inner.watching.swap(true, Ordering::AcqRel)
    }

    /// The broker-up watcher ended.
    pub(super) fn stop_watching(&self) {
        self.inner.watching.store(false, Ordering::Release);
    }

    /// Records a client error; returns whether it is the first since the brokers answered.
    /// "All broker connections are down" is a summary: it does not replace a more specific
    /// error already recorded (the connection failure that led to it).
    fn note(&self, fatal: bool, text: String, summary: bool) -> bool {
        let mut e = self.lock();
        let first = e.is_none();
        if first || !summary {
            *e = Some((fatal, text));
        }
        first
    }

    /// A broker connection failed (`attempt`: a failed connection attempt, counted; else a
    /// line that names the cause better): the outage starts or goes on.
    fn connection_failed(&self, cause: &str, attempt: bool) {
        *self
            .inner
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        if attempt {
            self.inner.outage.failed(cause);
        } else if self.inner.outage.is_down() {
            self.inner.outage.note(cause);
        } else {
            self.inner.outage.lost(cause);
        }
    }

    /// librdkafka reported every broker down.
    fn everything_down(&self) {
        if !self.inner.all_down.swap(true, Ordering::AcqRel) {
            self.health.notify();
        }
        self.inner.went_down.notify_waiters();
    }

    /// The brokers answered a metadata request or a send: forgets the last error and the
    /// "every broker down" report, and ends the outage when no connection failed for
    /// [`BrokerWatch::quiet`] (logged with its counts). Returns whether an outage still runs.
    pub(super) fn answered(&self) -> bool {
        self.lock().take();
        if self.inner.all_down.swap(false, Ordering::AcqRel) {
            self.health.notify();
        }
        if !self.inner.outage.is_down() {
            return false;
        }
        let quiet = self
            .inner
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none_or(|t| t.elapsed() >= self.inner.quiet);
        if quiet {
            self.inner.outage.recovered();
        }
        !quiet
    }

    /// The recorded error when it needs an operator (authentication, TLS).
    pub(super) fn fatal(&self) -> Option<String> {
        self.lock()
            .as_ref()
            .and_then(|(fatal, e)| fatal.then(|| e.clone()))
    }
}

/// librdkafka log facilities of a failed broker connection (`FAIL`: "Connect to ... failed:
/// Connection refused", "Disconnected"; `REQTMOUT`: requests timed out on a connection;
/// `ALLBROKERSDOWN`): part of the outage, not lines of their own.
const CONNECTION_FACILITIES: [&str; 3] = ["FAIL", "REQTMOUT", "ALLBROKERSDOWN"];

/// librdkafka client errors that mean "a broker connection failed" (counted as failed
/// attempts of the outage) rather than something an operator must fix.
fn is_connection_failure(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::BrokerTransportFailure | C::Resolve | C::AllBrokersDown | C::OperationTimedOut
    )
}

impl ClientContext for KafkaContext {
    /// Only the idempotence state (`eos`) is read, into the producer's [`EpochWatch`].
    fn stats_raw(&self, statistics: &[u8]) {
        match serde_json::from_slice::<Statistics>(statistics) {
            Ok(Statistics { eos: Some(e) }) => self.epoch.note(e.producer_id, e.producer_epoch),
            Ok(Statistics { eos: None }) => {}
            Err(e) => {
                tracing::debug!(sink = %self.sink, error = %e, "librdkafka statistics not understood")
            }
        }
    }

    /// librdkafka's log lines into `tracing` at their level, except a failed broker
    /// connection at WARN or ERROR ([`CONNECTION_FACILITIES`]): that is the outage's (its first
    /// line starts it; the others are at debug level).
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        use RDKafkaLogLevel as L;
        let severe = matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        );
        if severe && CONNECTION_FACILITIES.contains(&fac) {
            self.watch.connection_failed(log_message, false);
            tracing::debug!(sink = %self.sink, facility = fac, "librdkafka: {log_message}");
            return;
        }
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(sink = %self.sink, facility = fac, "librdkafka: {log_message}")
            }
            L::Warning => {
                tracing::warn!(sink = %self.sink, facility = fac, "librdkafka: {log_message}")
            }
            L::Notice | L::Info => {
                tracing::info!(sink = %self.sink, facility = fac, "librdkafka: {log_message}")
            }
            L::Debug => {
                tracing::debug!(sink = %self.sink, facility = fac, "librdkafka: {log_message}")
            }
        }
    }

    /// A failed broker connection ([`is_connection_failure`]) goes to the outage (counted;
    /// "all brokers down" also fails the healthcheck at once). Any other client error
    /// (authentication, TLS, ...) is logged at WARN, once per outage unless it is fatal
    /// (librdkafka reports each failed reconnect).
    fn error(&self, error: KafkaError, reason: &str) {
        let fatal = matches!(classify(&error, ""), SendFailure::Fatal(_));
        let text = if reason.is_empty() {
            error.to_string()
        } else {
            format!("{error}: {reason}")
        };
        let code = error.rdkafka_error_code();
        let summary = code == Some(RDKafkaErrorCode::AllBrokersDown);
        let first = self.watch.note(fatal, text, summary);
        if summary {
            self.watch.everything_down();
        }
        if !fatal && code.is_some_and(is_connection_failure) {
            let cause = if reason.is_empty() {
                error.to_string()
            } else {
                reason.to_owned()
            };
            // "All brokers down" is a summary of the failures that led to it: their lines
            // start the outage and name its cause.
            if !summary {
                self.watch.connection_failed(&cause, true);
            }
            tracing::debug!(sink = %self.sink, error = %error, "kafka client error: {reason}");
        } else if first || fatal {
            tracing::warn!(sink = %self.sink, error = %error, "kafka client error: {reason}; librdkafka keeps retrying (repeats are logged at debug level until the brokers answer)");
        } else {
            tracing::debug!(sink = %self.sink, error = %error, "kafka client error: {reason}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn epoch_bumps_count_from_the_last_delivery_and_a_new_producer_id() {
        let w = EpochWatch::default();
        w.note(-1, -1);
        assert_eq!(w.bumps(), 0, "no producer id yet");
        w.note(1, 0);
        w.note(1, 4);
        assert_eq!(w.bumps(), 4);
        w.delivered();
        w.note(1, 6);
        assert_eq!(w.bumps(), 2, "counted from the epoch at the last delivery");
        w.note(2, 0);
        assert_eq!(w.bumps(), 0, "a new producer id starts over");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), w.wedged())
                .await
                .is_err(),
            "not wedged yet"
        );
        w.note(2, EPOCH_BUMPS_BEFORE_REBUILD);
        tokio::time::timeout(Duration::from_secs(5), w.wedged())
            .await
            .expect("wedged once the epoch ran that far ahead");
    }

    #[test]
    fn connection_failures_are_one_outage_and_other_errors_stay_apart() {
        let watch = BrokerWatch::new("k", Duration::ZERO);
        let ctx = KafkaContext::new("k", &watch, &Arc::new(EpochWatch::default()));
        let refused = "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)";
        ctx.log(RDKafkaLogLevel::Error, "FAIL", refused);
        assert!(
            watch.outage().is_down(),
            "librdkafka's FAIL line starts the outage"
        );
        assert_eq!(watch.outage().failures(), 0, "a log line is not an attempt");
        for _ in 0..5 {
            ctx.error(
                KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
                refused,
            );
        }
        assert_eq!(
            watch.outage().failures(),
            5,
            "each failed connection counts"
        );
        assert!(!watch.all_down());
        let generation = watch.health().generation();
        ctx.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        assert!(watch.all_down());
        assert_eq!(
            watch.health().generation(),
            generation + 1,
            "the probe looks again"
        );
        assert_eq!(watch.outage().failures(), 5, "a summary, not an attempt");
        assert!(
            watch
                .last_error()
                .is_some_and(|e| e.contains("Connection refused")),
            "the specific error is kept over the summary"
        );
        ctx.error(
            KafkaError::Global(RDKafkaErrorCode::Authentication),
            "SASL authentication error",
        );
        assert_eq!(watch.outage().failures(), 5, "not a connection failure");
        assert!(watch.fatal().is_some());
        assert!(!watch.answered(), "quiet (0 s): the outage ends");
        assert!(!watch.outage().is_down());
        assert!(!watch.all_down());
        assert_eq!(watch.health().generation(), generation + 2);
    }

    #[test]
    fn an_outage_lasts_while_connections_keep_failing() {
        let watch = BrokerWatch::new("k", Duration::from_secs(60));
        let ctx = KafkaContext::new("k", &watch, &Arc::new(EpochWatch::default()));
        ctx.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "broker 2: Connection refused",
        );
        assert!(
            watch.answered(),
            "the others answer, but a connection failed within the quiet time"
        );
        assert!(watch.outage().is_down());
    }

    #[test]
    fn only_the_eos_object_of_the_statistics_is_read() {
        let w = Arc::new(EpochWatch::default());
        let ctx = KafkaContext::new("k", &BrokerWatch::default(), &w);
        ctx.stats_raw(br#"{"name": "p", "brokers": {"b": {"x": [1, 2]}}, "eos": {"idemp_state": "Assigned", "producer_id": 7, "producer_epoch": 3, "epoch_cnt": 1}}"#);
        assert_eq!(w.producer_id(), 7);
        ctx.stats_raw(br#"{"name": "p", "eos": {"producer_id": 7, "producer_epoch": 5}}"#);
        assert_eq!(w.bumps(), 2);
        ctx.stats_raw(b"not json");
        assert_eq!(
            w.producer_id(),
            7,
            "a report it cannot read changes nothing"
        );
    }
}
