//! `[[sinks]]` configuration: one entry per destination, tagged by `type`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Sink;

/// One `[[sinks]]` entry. The `type` key selects the destination; the other keys are the
/// destination's own (see each variant's struct).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
#[allow(clippy::large_enum_variant)] // built once at start-up; size does not matter
pub enum SinkConfig {
    /// `type = "stdout"`: JSON Lines on standard output.
    #[cfg(feature = "stdout")]
    Stdout(crate::stdout::StdoutConfig),
    /// `type = "nats"`: NATS core or JetStream.
    #[cfg(feature = "nats")]
    Nats(crate::nats::NatsConfig),
    /// `type = "kafka"`: Kafka through librdkafka.
    #[cfg(feature = "kafka")]
    Kafka(crate::kafka::KafkaConfig),
}

/// Why a sink could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SinkConfigError {
    /// A setting is invalid; `key` is the dotted config key inside the `[[sinks]]` entry.
    #[error("sinks[{index}] ({name}): {key}: {message}")]
    Invalid {
        /// Position of the entry in `sinks`.
        index: usize,
        /// The sink's name.
        name: String,
        /// The key inside the entry.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl SinkConfig {
    /// The sink's configured name.
    pub fn name(&self) -> &str {
        match self {
            #[cfg(feature = "stdout")]
            SinkConfig::Stdout(c) => &c.name,
            #[cfg(feature = "nats")]
            SinkConfig::Nats(c) => &c.name,
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(c) => &c.name,
        }
    }

    /// Checks settings that serde cannot (returns every problem found). `index` is the
    /// entry's position in `sinks`, used in messages.
    pub fn validate(&self, index: usize) -> Vec<SinkConfigError> {
        match self {
            #[cfg(feature = "stdout")]
            SinkConfig::Stdout(_) => Vec::new(),
            #[cfg(feature = "nats")]
            SinkConfig::Nats(c) => c.validate(index),
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(c) => c.validate(index),
        }
    }

    /// Builds the sink (connecting where the destination needs it).
    ///
    /// # Errors
    /// A [`SinkConfigError`] naming the entry and key when the settings cannot work.
    pub async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        match self {
            #[cfg(feature = "stdout")]
            SinkConfig::Stdout(c) => Ok(Arc::new(c.build())),
            #[cfg(feature = "nats")]
            SinkConfig::Nats(c) => c.build(index).await,
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(c) => c.build(index).await,
        }
    }
}
