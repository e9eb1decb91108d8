//! The Kafka sink (rdkafka over librdkafka).
//!
//! - `config.rs`: the `[[sinks]]` entry, its validation, its rendering into librdkafka
//!   properties (passthrough map, managed properties, secrets masked) and `build()`.
//! - `request.rs`: message → records: the topic dialect of the shared template engine, key,
//!   headers, tombstones.
//! - `context.rs`: librdkafka's callbacks (logs, client errors) and what they tell about the
//!   brokers (the last client error).
//! - `service.rs`: the producer, delivery reports, `QueueFull` backpressure, error
//!   classification, the broker-up watcher, healthcheck and flush.
//! - `rebuild.rs`: when the producer must be replaced by a new one (the brokers lost or
//!   keep rejecting its idempotent producer id), as a pure state machine.
//! - `sink.rs`: the [`Sink`](crate::Sink) implementation.
//!
//! Delivery: record key = message key (one partition per object, in order), the idempotent
//! producer with `acks = all` by default, a batch confirmed only when every record's
//! delivery report succeeded. See `docs/kafka.md`. This sink never decides to drop a
//! message: failures go back to the pipeline.

mod config;
mod context;
mod rebuild;
mod request;
mod service;
mod sink;
#[cfg(test)]
mod tests;

pub use config::{
    is_secret_property, Acks, Compression, KafkaConfig, KafkaSecurity, Passthrough, Protocol,
    SaslMechanism, DEFAULT_RECONNECT_BACKOFF_MAX_MS, DEFAULT_STATISTICS_INTERVAL_MS,
    MANAGED_PROPERTIES,
};
pub use context::{BrokerWatch, EpochWatch, KafkaContext};
pub use rebuild::{EPOCH_BUMPS_BEFORE_REBUILD, TIMED_OUT_SENDS_BEFORE_REBUILD};
pub use request::{escape, topic_template, CLUSTER_SCOPE, MAX_TOPIC_LEN, TOPIC};
pub use service::{classify, describe_error, needs_new_producer, Failure, Properties};
pub use sink::{KafkaSink, RECORD_OVERHEAD_BYTES};
