//! The `Sink` trait: the delivery contract between the pipeline and each sink (one
//! configured `[[sinks]]` entry, built by its destination).

use std::time::Duration;

use async_trait::async_trait;

use crate::{Message, ReadySignal};

/// One configured sink: where the pipeline delivers topology messages.
///
/// # Contract
///
/// - **`send` returns `Ok(())` only when the destination has durably accepted every message of
///   the batch**, by that destination's own definition (Kafka: every record's delivery report
///   succeeded under the configured `acks`; NATS JetStream: every PubAck arrived; NATS core:
///   `flush()` returned, which is at-most-once across a server failure; stdout: the lines were
///   written and flushed). After `Ok`, the pipeline forgets the batch.
/// - **Order per key.** Messages of one key appear in a batch in the order they happened, and
///   the pipeline never sends a newer change for a key before an older one is confirmed. A
///   sink must keep batch order for messages of the same key (one Kafka partition per key with
///   the idempotent producer; one NATS connection publishes in order).
/// - **Errors are retried, never dropped.** Any `Err` makes the pipeline retry the messages
///   that were not confirmed, with capped exponential backoff, for as long as it runs.
///   [`SinkError::Partial`] names the messages that failed so only those are sent again;
///   every other variant means "nothing of this batch counts as delivered", so a retry may
///   duplicate messages the destination did accept. Consumers deduplicate with the message
///   id (`id` header and field), which is identical on redelivery.
///   [`SinkError::is_fatal`] errors (authorization, unknown topic or stream, bad TLS) are
///   retried at the maximum backoff and logged as errors, because they need an operator.
/// - **Oversize.** A message larger than the destination accepts is reported with
///   [`SinkError::TooLarge`] (or avoided up front when [`Sink::max_message_bytes`] is known).
///   The pipeline then applies the one oversize policy shared by all sinks: the message is
///   re-encoded in its metadata-only form with `"truncated": true` (object reduced to
///   `apiVersion`, `kind` and `metadata`), and if that is still too large, with no object at
///   all. The change is never dropped and never retried forever; truncations are counted.
/// - `send` must not hold messages after returning: on `Err`, the pipeline owns them again.
/// - **Backoff ends when the destination is back.** While it waits between retries, the
///   pipeline also waits on the sink's [`Sink::ready_signal`]: a sink that learns that its
///   destination is reachable again (NATS: the client's `Connected` event; Kafka: a metadata
///   request answered after the brokers were down) calls [`ReadySignal::notify`], and the
///   pipeline retries at once with its backoff reset. The bridge's readiness probe notifies
///   the same signal when a healthcheck passes again, so a sink without connection events
///   still resumes within one `server.sink_check_interval`.
/// - Cancellation: the pipeline may drop a `send` or `close` future when its shutdown
///   deadline passes; the batch then counts as undelivered. Both must therefore be
///   cancel-safe and must not block a thread for longer than a short slice (a blocking
///   client call is made in steps of at most a few hundred milliseconds).
#[async_trait]
pub trait Sink: Send + Sync {
    /// The sink's configured name, used in logs and errors.
    fn name(&self) -> &str;

    /// Delivers a batch (1..=`pipeline.max_batch_events` messages). See the trait contract.
    ///
    /// # Errors
    /// [`SinkError`]; every variant leads to a retry of what was not confirmed.
    async fn send(&self, batch: &[Message]) -> Result<(), SinkError>;

    /// Whether the destination is reachable and ready (connected, stream or topic exists).
    ///
    /// # Errors
    /// Why the sink is not ready, naming the destination.
    async fn healthcheck(&self) -> Result<(), SinkError>;

    /// Flushes whatever the client library still buffers and closes connections.
    /// Called once at shutdown, after the last `send`, and cancelled when the shutdown
    /// deadline (`pipeline.shutdown_timeout`, counted from the signal) passes.
    ///
    /// # Errors
    /// What could not be flushed.
    async fn close(&self) -> Result<(), SinkError>;

    /// The pipeline gave up on the `send` it was running (the leadership fence closed during
    /// it, see `kubesink::leader`): drop whatever the client library still holds of it, so
    /// none of it is written after this replica stopped being the leader. What was already
    /// written stays written (at-least-once: the next leader sends it again). The default
    /// does nothing (a sink whose `send` holds nothing once its future is dropped).
    async fn abandon(&self) {}

    /// The largest payload in bytes the destination accepts, when known up front (NATS
    /// `max_payload`, Kafka `message.max.bytes`). The pipeline shrinks larger messages before
    /// sending them. `None` (the default) means no known limit.
    fn max_message_bytes(&self) -> Option<usize> {
        None
    }

    /// How many batches the pipeline may have in flight to this sink at once (at least 1;
    /// the default, 1, sends a batch only once the previous one is confirmed). Above 1,
    /// `send` is called concurrently; the pipeline keeps per-key order by never putting a
    /// key in two batches in flight, and keeps a sync marker's batch alone in flight. Worth
    /// it for a destination whose confirmations are per message and independent (JetStream
    /// PubAcks), where waiting for the slowest confirmation of a batch before publishing the
    /// next holds everything behind it. The sink must then bound its own outstanding work
    /// across the concurrent sends (NATS: `max_in_flight` PubAcks).
    fn max_batches_in_flight(&self) -> usize {
        1
    }

    /// How many times the sink replaced its client because the destination stopped
    /// accepting it while it answered (Kafka: a new producer after the brokers lost or kept
    /// rejecting its idempotent producer id). Default 0: the sink never does.
    fn client_rebuilds(&self) -> u64 {
        0
    }

    /// How many messages the destination refused for good, each reported at ERROR and not
    /// retried (HTTP: a 4xx answer that names the message, not the connection, the
    /// credentials or the URL; `sinks/http`). Such a message counts as delivered: it is the
    /// one exception to "never dropped", for a destination that says retrying cannot help.
    /// Default 0: the sink never does.
    fn rejected(&self) -> u64 {
        0
    }

    /// The signal this sink bumps when its destination becomes reachable again (see the
    /// contract). `None` (the default): the sink has no such event; the pipeline then makes
    /// its own signal, which only the readiness probe bumps.
    fn ready_signal(&self) -> Option<ReadySignal> {
        None
    }

    /// A signal this sink bumps when it learns, between two healthchecks, that the answer of
    /// [`Sink::healthcheck`] changed (Kafka: librdkafka reported every broker down, or they
    /// answer again after that). The bridge's readiness probe then runs the healthcheck at
    /// once instead of at its next `server.sink_check_interval`, so `/readyz` tells within
    /// seconds. It is a [`ReadySignal`] (a generation counter) used for "look again", not for
    /// "reachable again". `None` (the default): the probe's interval alone.
    fn health_signal(&self) -> Option<ReadySignal> {
        None
    }
}

/// Why a [`Sink`] did not confirm a batch.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A transient failure (connection lost, timeout, broker busy): retry the whole batch.
    #[error("{sink}: transient error: {message}")]
    Transient {
        /// Sink name.
        sink: String,
        /// What happened, with the destination (server, topic, subject).
        message: String,
        /// Hint from the destination on when to retry (e.g. throttling), if any.
        retry_after: Option<Duration>,
    },
    /// Only some messages failed: retry exactly those (indices into the batch).
    #[error("{sink}: {} of the batch's messages failed: {message}", failed.len())]
    Partial {
        /// Sink name.
        sink: String,
        /// Indices (into the batch passed to `send`) of the messages not delivered, ascending.
        failed: Vec<usize>,
        /// The first failure's description.
        message: String,
    },
    /// Message `index` of the batch is larger than the destination accepts (`limit` bytes,
    /// when known). The pipeline applies the oversize policy and sends the batch again.
    #[error("{sink}: message {index} of the batch is too large ({size} bytes, limit {limit:?})")]
    TooLarge {
        /// Sink name.
        sink: String,
        /// Index into the batch.
        index: usize,
        /// Payload size in bytes.
        size: usize,
        /// The destination's limit in bytes, when known.
        limit: Option<usize>,
    },
    /// A failure that needs an operator (authorization denied, unknown topic or stream, TLS
    /// misconfiguration). Still retried, at the maximum backoff, never dropped.
    #[error("{sink}: {message}")]
    Fatal {
        /// Sink name.
        sink: String,
        /// What is wrong, naming the destination and what to check.
        message: String,
    },
}

impl SinkError {
    /// Whether the error needs an operator rather than time.
    pub fn is_fatal(&self) -> bool {
        matches!(self, SinkError::Fatal { .. })
    }

    /// Builds a [`SinkError::Transient`] with no retry hint.
    pub fn transient(sink: &str, message: impl Into<String>) -> Self {
        SinkError::Transient {
            sink: sink.to_owned(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// Builds a [`SinkError::Fatal`].
    pub fn fatal(sink: &str, message: impl Into<String>) -> Self {
        SinkError::Fatal {
            sink: sink.to_owned(),
            message: message.into(),
        }
    }
}
