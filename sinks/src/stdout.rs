//! The stdout sink: JSON Lines, one topology message per line, flushed per batch.
//!
//! It writes to the process's standard output and nothing else ever does: logs go to
//! stderr, so `kubesink run > topology.jsonl` captures a clean stream. It has no size limit
//! and confirms a batch once the lines are written and flushed.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use crate::{Message, Sink, SinkError};

/// `[[sinks]]` entry with `type = "stdout"`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StdoutConfig {
    /// Name used in logs. Default `"stdout"`.
    #[serde(default = "default_name")]
    pub name: String,
}

fn default_name() -> String {
    "stdout".to_owned()
}

impl Default for StdoutConfig {
    fn default() -> Self {
        StdoutConfig {
            name: default_name(),
        }
    }
}

impl StdoutConfig {
    /// Builds the sink writing to the process's standard output.
    pub fn build(&self) -> StdoutSink {
        StdoutSink::new(self.name.clone(), Box::new(tokio::io::stdout()))
    }
}

/// Writes each message's payload followed by `\n`; flushes once per batch.
pub struct StdoutSink {
    name: String,
    out: Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
}

impl StdoutSink {
    /// A sink writing JSON Lines to any writer (stdout in production, a pipe or buffer in
    /// tests).
    pub fn new(name: String, out: Box<dyn AsyncWrite + Send + Unpin>) -> Self {
        StdoutSink {
            name,
            out: Mutex::new(out),
        }
    }
}

#[async_trait]
impl Sink for StdoutSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        let mut buf = Vec::with_capacity(batch.iter().map(|m| m.payload.len() + 1).sum());
        for m in batch {
            buf.extend_from_slice(&m.payload);
            buf.push(b'\n');
        }
        let mut out = self.out.lock().await;
        let io =
            |e: std::io::Error| SinkError::transient(&self.name, format!("write to stdout: {e}"));
        out.write_all(&buf).await.map_err(io)?;
        out.flush().await.map_err(io)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }

    async fn close(&self) -> Result<(), SinkError> {
        let mut out = self.out.lock().await;
        out.flush()
            .await
            .map_err(|e| SinkError::transient(&self.name, format!("flush stdout: {e}")))
    }
}
