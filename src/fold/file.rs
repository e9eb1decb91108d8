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
        let start = line.trim_start().as_bytes();
        if let Some(format) = crate::sinks::line_formats()
            .iter()
            .find(|f| f.recognises(start))
        {
            // A line as a destination's receiver wrote it down (an OpenTelemetry Collector's
            // file exporter): the topology messages it carries.
            let messages =
                format
                    .messages(line.trim().as_bytes())
                    .map_err(|reason| SourceError::Read {
                        what: format!("{at} ({})", format.name()),
                        reason,
                    })?;
            for (i, m) in messages.into_iter().enumerate() {
                let rec = BrokerRecord {
                    value: Some(m.to_string().into_bytes()),
                    key: None,
                    partition: None,
                    at: format!("{at} {} {}", format.item(), i + 1),
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

#[cfg(all(test, feature = "otlp"))]
mod tests {
    use super::*;

    /// Reads `text` as a file and returns what the source sent, or its error.
    async fn read_text(text: &str) -> Result<Vec<BrokerRecord>, SourceError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, text).expect("write the file");
        let (tx, mut rx) = mpsc::channel(64);
        let result = read(&path, false, tx).await;
        let mut records = Vec::new();
        while let Ok(event) = rx.try_recv() {
            if let Event::Record(r) = event {
                records.push(r);
            }
        }
        result.map(|()| records)
    }

    #[tokio::test]
    async fn a_line_in_a_registered_format_is_unpacked_and_a_bad_one_is_named_with_it() {
        let otlp = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"attributes":[{"key":"kubesink.op","value":{"stringValue":"added"}}],"body":{"kvlistValue":{"values":[]}}}]}]}]}"#;
        let plain = r#"{"op":"added"}"#;
        let records = read_text(&format!("{plain}\n  {otlp}\n"))
            .await
            .expect("both lines read");
        assert!(
            records[0].at.ends_with("in.jsonl line 1"),
            "{}",
            records[0].at
        );
        assert_eq!(records[0].value.as_deref(), Some(plain.as_bytes()));
        assert!(
            records.len() >= 2 && records[1].at.ends_with("line 2 log record 1"),
            "{:?}",
            records.iter().map(|r| &r.at).collect::<Vec<_>>()
        );
        let e = read_text("{\"resourceLogs\": 5}\n")
            .await
            .expect_err("not an array");
        assert!(e.to_string().contains("line 1 (OTLP JSON)"), "{e}");
    }
}
