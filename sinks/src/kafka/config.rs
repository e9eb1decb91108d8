//! `[[sinks]]` entry with `type = "kafka"`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Sink, SinkConfigError};

/// Kafka sink configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Name used in logs; unique among sinks. Default `"kafka"`.
    #[serde(default = "default_name")]
    pub name: String,
}

fn default_name() -> String {
    "kafka".to_owned()
}

impl KafkaConfig {
    /// Problems serde cannot see.
    pub fn validate(&self, _index: usize) -> Vec<SinkConfigError> {
        Vec::new()
    }

    /// Builds the sink.
    ///
    /// # Errors
    /// Always, until the Kafka sink is implemented.
    pub async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        Err(SinkConfigError::Invalid {
            index,
            name: self.name.clone(),
            key: "type".into(),
            message: "the Kafka sink is not implemented yet".into(),
        })
    }
}
