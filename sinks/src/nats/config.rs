//! `[[sinks]]` entry with `type = "nats"`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Sink, SinkConfigError};

/// NATS sink configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// Name used in logs; unique among sinks. Default `"nats"`.
    #[serde(default = "default_name")]
    pub name: String,
}

fn default_name() -> String {
    "nats".to_owned()
}

impl NatsConfig {
    /// Problems serde cannot see.
    pub fn validate(&self, _index: usize) -> Vec<SinkConfigError> {
        Vec::new()
    }

    /// Builds the sink.
    ///
    /// # Errors
    /// Always, until the NATS sink is implemented.
    pub async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        Err(SinkConfigError::Invalid {
            index,
            name: self.name.clone(),
            key: "type".into(),
            message: "the NATS sink is not implemented yet".into(),
        })
    }
}
