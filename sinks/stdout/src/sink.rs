//! The stdout sink: each message's payload (or its CloudEvents envelope) and `\n`, flushed
//! per batch.

use async_trait::async_trait;
use kubesink_core::message::Format;
use kubesink_core::{Message, Sink, SinkError};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

/// The exit code when standard output was closed by its reader ([`closed_by_reader`]).
pub const STDOUT_CLOSED_EXIT: i32 = 1;

/// Standard output was closed by its reader (`EPIPE`: `kubesink demo | head`, a consumer
/// that died): nothing written there can ever arrive, so retrying would hold the process
/// forever. Rust ignores `SIGPIPE`, which would otherwise end the process as it ends any
/// Unix tool; this does the same, with a line that says so, exiting with
/// [`STDOUT_CLOSED_EXIT`]. What was not confirmed stays out of the saved state, so the next
/// start (with a reader) sends it again.
fn closed_by_reader(sink: &str, batch: usize) -> ! {
    tracing::warn!(sink, batch, "standard output was closed by its reader (broken pipe): nothing more can be delivered to it; exiting (code {STDOUT_CLOSED_EXIT}); the next start sends again what was not delivered");
    std::process::exit(STDOUT_CLOSED_EXIT)
}

/// Writes each message's payload followed by `\n`; flushes once per batch.
pub struct StdoutSink {
    name: String,
    format: Format,
    out: Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    /// `out` is the process's standard output: a broken pipe ends the process
    /// ([`closed_by_reader`]); any other writer's is a transient error.
    pub(crate) process_stdout: bool,
}

impl StdoutSink {
    /// A sink writing JSON Lines to any writer (stdout in production, a pipe or buffer in
    /// tests).
    pub fn new(name: String, out: Box<dyn AsyncWrite + Send + Unpin>) -> Self {
        StdoutSink {
            name,
            format: Format::Json,
            out: Mutex::new(out),
            process_stdout: false,
        }
    }

    /// The same sink writing each line in `format` (`Json` or `CloudEventsStructured`; a
    /// line has no headers, so `CloudEvents` writes the plain message like `Json`).
    pub fn with_format(mut self, format: Format) -> Self {
        self.format = format;
        self
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
            buf.extend_from_slice(&self.format.payload(m));
            buf.push(b'\n');
        }
        let mut out = self.out.lock().await;
        let io = |e: std::io::Error| {
            if self.process_stdout && e.kind() == std::io::ErrorKind::BrokenPipe {
                closed_by_reader(&self.name, batch.len());
            }
            SinkError::transient(&self.name, format!("write to stdout: {e}"))
        };
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::{StdoutConfig, StdoutFormat};
    use kubesink_core::message::fixtures::change;
    use kubesink_core::message::{encode, Change, ObjectJson, Op, Resource};

    #[tokio::test]
    async fn cloudevents_structured_writes_one_envelope_per_line() {
        let r = Arc::new(Resource::new("prod", "", "v1", "Pod", "pods", true));
        let c = Change {
            initial: true,
            ..change(
                Op::Added,
                Some("default"),
                "web",
                Some(ObjectJson::from_trusted("{}".into())),
            )
        };
        let m = encode(&r, &c, "2026-11-30T00:00:00.000Z").unwrap();
        let (writer, mut reader) = tokio::io::duplex(1 << 16);
        let sink = StdoutSink::new("out".into(), Box::new(writer))
            .with_format(StdoutFormat::CloudEventsStructured.into());
        sink.send(&[m.clone(), m.clone()]).await.unwrap();
        drop(sink);
        let mut text = String::new();
        reader.read_to_string(&mut text).await.unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["specversion"], "1.0");
        assert_eq!(v["type"], "io.kubesink.topology.added");
        let data: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(v["data"], data);
        let err = serde_json::from_str::<StdoutConfig>(r#"{"format":"cloudevents"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("format: unknown value \"cloudevents\""),
            "binary mode is refused: {err}"
        );
    }
}
