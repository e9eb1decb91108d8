//! librdkafka's callbacks (its log lines and client errors, into `tracing` with the sink's
//! name) and what they tell about the brokers ([`BrokerWatch`]): librdkafka's last client
//! error since the brokers last answered (e.g. "Connect to ipv4#127.0.0.1:9092 failed:
//! Connection refused"), logged once per outage, and whether a broker-up watcher runs; and
//! what librdkafka's statistics tell about one producer's idempotence state
//! ([`EpochWatch`]: its producer id and epoch). The callbacks run on librdkafka's threads:
//! they only record, notify and log, never block.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kubesink_core::ReadySignal;
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
#[derive(Clone, Default)]
pub struct BrokerWatch {
    inner: Arc<BrokerState>,
    ready: ReadySignal,
}

#[derive(Default)]
struct BrokerState {
    /// librdkafka's last client error since the brokers last answered: (fatal, text).
    last_error: Mutex<Option<(bool, String)>>,
    /// A broker-up watcher task is running.
    watching: AtomicBool,
}

impl BrokerWatch {
    /// librdkafka's last client error since the brokers last answered, e.g. "Connect to
    /// ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)".
    pub fn last_error(&self) -> Option<String> {
        self.lock().as_ref().map(|(_, e)| e.clone())
    }

    /// The signal notified when the brokers answer again.
    pub fn ready(&self) -> &ReadySignal {
        &self.ready
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

    /// The brokers answered: forget the error. Returns whether there was one.
    pub(super) fn clear(&self) -> bool {
        self.lock().take().is_some()
    }

    /// The recorded error when it needs an operator (authentication, TLS).
    pub(super) fn fatal(&self) -> Option<String> {
        self.lock()
            .as_ref()
            .and_then(|(fatal, e)| fatal.then(|| e.clone()))
    }
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

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        use RDKafkaLogLevel as L;
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

    /// One warning per outage; later errors of the same outage at debug level (librdkafka
    /// reports each failed reconnect).
    fn error(&self, error: KafkaError, reason: &str) {
        let fatal = matches!(classify(&error, ""), SendFailure::Fatal(_));
        let text = if reason.is_empty() {
            error.to_string()
        } else {
            format!("{error}: {reason}")
        };
        let summary = error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown);
        if self.watch.note(fatal, text, summary) || fatal {
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
