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
    /// A build without any sink feature (`--no-default-features`) has no sink type; this
    /// uninhabited variant keeps the enum and its matches well-formed there.
    #[cfg(not(any(feature = "stdout", feature = "nats", feature = "kafka")))]
    #[serde(skip)]
    #[doc(hidden)]
    NoSinkFeature(std::convert::Infallible),
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
            #[cfg(not(any(feature = "stdout", feature = "nats", feature = "kafka")))]
            SinkConfig::NoSinkFeature(never) => match *never {},
        }
    }

    /// Checks settings that serde cannot (returns every problem found). `index` is the
    /// entry's position in `sinks`, used in messages.
    #[cfg_attr(not(any(feature = "nats", feature = "kafka")), allow(unused_variables))]
    pub fn validate(&self, index: usize) -> Vec<SinkConfigError> {
        match self {
            #[cfg(feature = "stdout")]
            SinkConfig::Stdout(_) => Vec::new(),
            #[cfg(feature = "nats")]
            SinkConfig::Nats(c) => c.validate(index),
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(c) => c.validate(index),
            #[cfg(not(any(feature = "stdout", feature = "nats", feature = "kafka")))]
            SinkConfig::NoSinkFeature(never) => match *never {},
        }
    }

    /// Settings that work but weaken security (TLS verification off, credentials without
    /// TLS), one sentence each naming the entry and key; `kubesink check` prints them and
    /// `kubesink run` logs them at start.
    #[cfg_attr(not(any(feature = "nats", feature = "kafka")), allow(unused_variables))]
    pub fn warnings(&self, index: usize) -> Vec<String> {
        match self {
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(c) => c.warnings(index),
            #[cfg(feature = "nats")]
            SinkConfig::Nats(c) => c.warnings(index),
            #[allow(unreachable_patterns)]
            _ => Vec::new(),
        }
    }

    /// Builds the sink (connecting where the destination needs it).
    ///
    /// # Errors
    /// A [`SinkConfigError`] naming the entry and key when the settings cannot work.
    #[cfg_attr(not(any(feature = "nats", feature = "kafka")), allow(unused_variables))]
    pub async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        match self {
            #[cfg(feature = "stdout")]
            SinkConfig::Stdout(c) => Ok(Arc::new(c.build())),
            #[cfg(feature = "nats")]
            SinkConfig::Nats(c) => c.build(index).await,
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(c) => c.build(index).await,
            #[cfg(not(any(feature = "stdout", feature = "nats", feature = "kafka")))]
            SinkConfig::NoSinkFeature(never) => match *never {},
        }
    }
}
