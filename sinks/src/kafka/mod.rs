//! The Kafka sink (rdkafka). Placeholder until issue 4 lands: building it fails with
//! a clear error.

mod config;

pub use config::KafkaConfig;
