//! The JSON Lines source: a file, or `-` for stdin (kubesink's stdout sink writes this
//! format). Caught up at the end of the input; `--follow` then waits for more lines (a file
//! being appended to) until interrupted; on stdin, `--follow` counts a 0.5 s pause as caught
//! up and then reads until the pipe closes. Blank lines are skipped. Lines may be topology
//! messages, CloudEvents envelopes (the view unwraps them), or OTLP JSON logs requests (an
//! OpenTelemetry Collector's file exporter: each of its log records written by the OTLP sink
//! is one message).

use std::path::Path;

use kubesink_core::readback::BrokerRecord;
use kubesink_core::readback::{Event, SourceError};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

/// How long stdin may pause, with `--follow`, before the input counts as caught up.
const STDIN_IDLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Reads `path` (`-`: stdin) line by line into `tx`; `Event::CaughtUp` at the end of input
/// (with `--follow` on stdin: after a pause of [`STDIN_IDLE`]).
///
/// # Errors
/// [`SourceError::Open`] / [`SourceError::Read`] naming the path (and the line).
pub async fn read(path: &Path, follow: bool, tx: mpsc::Sender<Event>) -> Result<(), SourceError> {
    let name = path.display().to_string();
    let input: Box<dyn AsyncRead + Send + Unpin> = if name == "-" {
        Box::new(tokio::io::stdin())
    } else {
        Box::new(
            tokio::fs::File::open(path)
                .await
                .map_err(|e| SourceError::Open {
                    what: format!("file {name}"),
                    reason: e.to_string(),
                })?,
        )
    };
    let mut reader = BufReader::new(input);
    let mut line = String::new();
    let mut number = 0u64;
    let mut caught_up = false;
    // A pipe (`-`) has no end to catch up with while its writer runs: with `--follow`, a pause
    // of STDIN_IDLE with no partial line counts as caught up (`kubesink run | kubesink fold
    // --file - --follow`). `read_line` keeps what it read when the timeout cancels it, so
    // the line is resumed, not lost.
    let pipe_follow = follow && name == "-";
    let mut resume = false;
    loop {
        if !resume {
            line.clear();
        }
        resume = false;
        let read = reader.read_line(&mut line);
        let read = if pipe_follow && !caught_up {
            match tokio::time::timeout(STDIN_IDLE, read).await {
                Ok(r) => r,
                Err(_) => {
                    resume = true;
                    if line.is_empty() {
                        caught_up = true;
                        if tx.send(Event::CaughtUp).await.is_err() {
                            return Ok(());
                        }
                    }
                    continue;
                }
            }
        } else {
            read.await
        };
        let n = read.map_err(|e| SourceError::Read {
            what: format!("{name} line {}", number + 1),
            reason: e.to_string(),
        })?;
        if n == 0 {
            if !caught_up {
                caught_up = true;
                if tx.send(Event::CaughtUp).await.is_err() {
                    return Ok(());
                }
            }
            if !follow || name == "-" {
                return Ok(());
            }
            // A file being appended to: look again shortly (no inotify dependency for this).
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            continue;
        }
        number += 1;
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{name} line {number}");
        #[cfg(feature = "otlp")]
        if kubesink_otlp::reader::is_otlp_line(line.trim_start().as_bytes()) {
            // A line of an OpenTelemetry Collector's file exporter: the topology messages of
            // its log records (the OTLP sink's records, `sinks/otlp`).
            let messages =
                kubesink_otlp::reader::messages(line.trim().as_bytes()).map_err(|reason| {
                    SourceError::Read {
                        what: format!("{at} (OTLP JSON)"),
                        reason,
                    }
                })?;
            for (i, m) in messages.into_iter().enumerate() {
                let rec = BrokerRecord {
                    value: Some(m.to_string().into_bytes()),
                    key: None,
                    partition: None,
                    at: format!("{at} log record {}", i + 1),
                };
                if tx.send(Event::Record(rec)).await.is_err() {
                    return Ok(());
                }
            }
            continue;
        }
        let rec = BrokerRecord {
            value: Some(line.trim_end().as_bytes().to_vec()),
            key: None,
            partition: None,
            at,
        };
        if tx.send(Event::Record(rec)).await.is_err() {
            return Ok(());
        }
    }
}
