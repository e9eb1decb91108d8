//! # kubesink-kafka: the Kafka destination
//!
//! Everything kubesink does with Kafka (rdkafka over librdkafka): the sink, the topic reader
//! of `kubesink fold`, the state store, and the CloudEvents Kafka binding. Depends on `kubesink-core` only.
//!
//! - `config.rs`: the `[[sinks]]` entry, its validation, its rendering into librdkafka
//!   properties (passthrough map, managed properties, secrets masked) and `build()` (its
//!   [`Destination`](kubesink_core::Destination) registration).
//! - `request.rs`: message → records: the topic dialect of the shared template engine, key,
//!   headers, tombstones.
//! - `properties.rs`: the rendered librdkafka properties and which are credentials.
//! - `errors.rs`: a librdkafka error classified once (too large, fatal, transient, new
//!   producer needed) and described without secrets.
//! - `context.rs`: librdkafka's callbacks (logs, client errors) and what they tell about the
//!   brokers (the last client error).
//! - `service.rs`: the producer, delivery reports, `QueueFull` backpressure, the broker-up
//!   watcher, healthcheck and flush.
//! - `rebuild.rs`: when the producer must be replaced by a new one (the brokers lost or
//!   keep rejecting its idempotent producer id), as a pure state machine.
//! - `sink.rs`: the [`Sink`](kubesink_core::Sink) implementation.
//! - `cloudevents.rs`: the CloudEvents Kafka protocol binding (binary mode header names).
//! - [`state`]: the `kafka` state backend (`[state.kafka]`): the saved informer state in a
//!   compacted topic, fenced by epoch against a deposed writer.
//! - [`reader`]: `kubesink fold --kafka`, every partition of a topic read back from its
//!   first offset.
//!
//! Delivery: record key = message key (one partition per object, in order), the idempotent
//! producer with `acks = all` by default, a batch confirmed only when every record's
//! delivery report succeeded. See `docs/kafka.md`. This sink never decides to drop a
//! message: failures go back to the pipeline.

mod cloudevents;
mod config;
mod context;
mod errors;
mod properties;
pub mod reader;
mod rebuild;
mod request;
mod service;
mod sink;
pub mod state;
#[cfg(test)]
mod tests;

pub use cloudevents::kafka_headers;
pub use config::{
    Acks, Compression, KafkaConfig, KafkaSecurity, Passthrough, Protocol, SaslMechanism,
    DEFAULT_RECONNECT_BACKOFF_MAX_MS, DEFAULT_STATISTICS_INTERVAL_MS, MANAGED_PROPERTIES,
};
pub use context::{BrokerWatch, EpochWatch, KafkaContext};
pub use errors::{classify, describe_error, needs_new_producer, SendFailure};
pub use properties::{is_secret_property, passthrough_files, Properties};
pub use rebuild::{EPOCH_BUMPS_BEFORE_REBUILD, TIMED_OUT_SENDS_BEFORE_REBUILD};
pub use request::{escape, topic_template, CLUSTER_SCOPE, MAX_TOPIC_LEN, TOPIC};
pub use sink::{KafkaSink, RECORD_OVERHEAD_BYTES};
