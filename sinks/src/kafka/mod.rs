//! The Kafka sink (rdkafka over librdkafka).
//!
//! - `config`: the `[[sinks]]` entry, its validation and rendering into librdkafka
//!   properties (passthrough map, managed properties, secrets masked).
//! - `request`: message → record: topic template with its escaping rule, key, headers,
//!   tombstones.
//! - `service`: the producer, delivery reports, `QueueFull` backpressure, error
//!   classification, healthcheck and flush.
//!
//! Delivery: record key = message key (one partition per object, in order), the idempotent
//! producer with `acks = all` by default, a batch confirmed only when every record's
//! delivery report succeeded. See `docs/kafka.md`. This module never decides to drop a
//! message: failures go back to the pipeline.

mod config;
mod request;
mod service;
#[cfg(test)]
mod tests;

pub use config::{
    Acks, Compression, KafkaConfig, KafkaSecurity, Protocol, RenderedConfig, SaslMechanism,
    MANAGED_PROPERTIES,
};
pub use request::{escape, TemplateError, TopicTemplate, CLUSTER_SCOPE, MAX_TOPIC_LEN};
pub use service::{
    classify, needs_new_producer, Failure, KafkaSink, KafkaSinkError, RECORD_OVERHEAD_BYTES,
};
