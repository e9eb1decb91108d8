//! What a librdkafka error means for delivery, classified once: too large (the shared
//! oversize policy), fatal (needs an operator), transient (time fixes it), or "this producer's
//! idempotence state is gone" (a new producer is needed); and how an error is described
//! without a credential. Used by the service (send results, delivery reports) and the context
//! (client errors librdkafka reports on its own).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A librdkafka error for logs and messages: as rdkafka prints it, except that a rejected
/// property's value is left out (rdkafka's `ClientConfig` error carries the value, which
/// may be a credential).
pub fn describe_error(e: &KafkaError) -> String {
    match e {
        KafkaError::ClientConfig(_, description, key, _) => {
            format!("client configuration error: property {key:?}: {description}")
        }
        other => other.to_string(),
    }
}

/// How one failed record is classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendFailure {
    /// The record exceeds a size limit (librdkafka `message.max.bytes` or the topic's
    /// `max.message.bytes`): the shared oversize policy applies.
    TooLarge,
    /// Needs an operator: authorization, authentication, unknown or invalid topic, TLS, or a
    /// fatal producer error.
    Fatal(String),
    /// Anything time can fix: broker down, timeout, leader change, throttling.
    Transient(String),
}

/// Classifies a produce or delivery error (librdkafka error codes, `rdkafka_error_code()`).
pub fn classify(e: &KafkaError, topic: &str) -> SendFailure {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(C::MessageSizeTooLarge) => SendFailure::TooLarge,
        Some(
            C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed,
        ) => SendFailure::Fatal(format!(
            "not authorized to produce to topic {topic:?} ({e}): check the principal's ACLs (WRITE and DESCRIBE on the topic, IDEMPOTENT_WRITE on the cluster for the idempotent producer)"
        )),
        Some(C::SaslAuthenticationFailed | C::Authentication) => SendFailure::Fatal(format!(
            "authentication failed ({e}): check security.sasl_mechanism, sasl_username and sasl_password"
        )),
        Some(C::UnknownTopic | C::UnknownTopicOrPartition) => SendFailure::Fatal(format!(
            "topic {topic:?} does not exist and the brokers do not auto-create it ({e}): create it (docs/kafka.md) or fix `topic`"
        )),
        Some(C::InvalidTopic) => SendFailure::Fatal(format!("topic {topic:?} is invalid ({e})")),
        Some(C::SSL) => SendFailure::Fatal(format!(
            "TLS error ({e}): check security.ssl_ca_location and the client certificate"
        )),
        Some(C::Fatal) => SendFailure::Fatal(format!("fatal producer error ({e}); the producer is recreated")),
        Some(c) if needs_new_producer(c) => SendFailure::Transient(format!(
            "{e} (topic {topic:?}): the broker lost or fenced this producer's id; the producer is recreated"
        )),
        _ => SendFailure::Transient(format!("{e} (topic {topic:?})")),
    }
}

/// Errors after which the idempotent producer's id, epoch or sequence state is unusable:
/// the sink replaces the producer (a fresh one gets a new producer id). Seen with brokers
/// that lose producer state across an outage (tansu answers `PRODUCER_FENCED`).
pub fn needs_new_producer(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::Fatal
            | C::ProducerFenced
            | C::InvalidProducerEpoch
            | C::OutOfOrderSequenceNumber
            | C::InvalidProducerIdMapping
            | C::UnknownProducerId
    )
}
