//! librdkafka's callbacks (its log lines and client errors, into `tracing` with the sink's
//! name) and what they tell about the brokers ([`BrokerWatch`]): librdkafka's last client
//! error since the brokers last answered (e.g. "Connect to ipv4#127.0.0.1:9092 failed:
//! Connection refused"), logged once per outage, and whether a broker-up watcher runs. The
//! callbacks run on librdkafka's threads: they only record and log, never block.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;

use super::service::{classify, Failure};
use crate::ReadySignal;

/// librdkafka callbacks: its log lines and client errors go to `tracing`, tagged with the
/// sink name; the last client error is kept for the sink's errors ([`BrokerWatch`]).
pub struct KafkaContext {
    sink: String,
    watch: BrokerWatch,
}

impl KafkaContext {
    /// The context of sink `sink`, recording into `watch`.
    pub fn new(sink: &str, watch: &BrokerWatch) -> Self {
        KafkaContext {
            sink: sink.to_owned(),
            watch: watch.clone(),
        }
    }
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
        let fatal = matches!(classify(&error, ""), Failure::Fatal(_));
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
