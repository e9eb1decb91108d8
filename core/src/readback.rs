//! What a destination's reader hands `kubesink fold`: the records of a topic, stream or file
//! in order, then [`Event::CaughtUp`] once it reached what the broker held at start. A
//! reader never writes to the broker (no consumer group, no commit, no durable consumer);
//! the fold itself (`src/fold/view.rs` in the bridge) reads only these types.
//!
//! A destination with a reader offers it as [`ReadOptions`]: command-line options of its own
//! (`clap::Args`, in its crate), which the bridge's one registration list (`src/sinks.rs`)
//! flattens into `kubesink fold`'s, and the reading they name.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;

/// A destination's form of a line in a JSON Lines file: what a receiver of its protocol
/// writes down (an OpenTelemetry Collector's file exporter, for OTLP), which `kubesink fold
/// --file` unpacks into the topology messages it carries. A line no format recognises is
/// read as one message.
pub trait LineFormat: Sync {
    /// The format's name in errors (`OTLP JSON`).
    fn name(&self) -> &'static str;

    /// What one message of a line is called where it is named (`log record`).
    fn item(&self) -> &'static str;

    /// Whether `line` (leading white space removed) is in this format.
    fn recognises(&self, line: &[u8]) -> bool;

    /// The topology messages of `line`, in order.
    ///
    /// # Errors
    /// Why the line, recognised as this format, cannot be unpacked, in words.
    fn messages(&self, line: &[u8]) -> Result<Vec<serde_json::Value>, String>;
}

/// A source being read: resolves once it stopped (at its end, or on an error).
pub type Reading = Pin<Box<dyn Future<Output = Result<(), SourceError>> + Send>>;

/// A destination's reader as `kubesink fold` offers it.
pub trait ReadOptions {
    /// The reading of the source these options name, sending into `tx` (and, with `follow`,
    /// going on after [`Event::CaughtUp`]), with what it reads in words (`Kafka topic t at
    /// host:9092`); `timeout` bounds each request at start. `None` when these options name no
    /// source (another reader's, or the file's, were given).
    ///
    /// # Errors
    /// `Some(Err(..))`: the options name a source but cannot be read as given (a property
    /// that is not `key=value`), in words naming the option.
    fn open(
        &self,
        timeout: Duration,
        follow: bool,
        tx: mpsc::Sender<Event>,
    ) -> Option<Result<(Reading, String), String>>;
}

/// One record as a source read it.
#[derive(Debug, Clone)]
pub struct BrokerRecord {
    /// The payload; `None` for a Kafka tombstone (null value).
    pub value: Option<Vec<u8>>,
    /// The broker's key (the Kafka record key), when it has one.
    pub key: Option<String>,
    /// The Kafka partition; `None` for other sources. Sync markers sweep per partition.
    pub partition: Option<i32>,
    /// Where it was read, for errors: `line 12`, `partition 3 offset 44`, `stream sequence 9`.
    pub at: String,
}

/// What a source sends.
#[derive(Debug)]
pub enum Event {
    /// The next record.
    Record(BrokerRecord),
    /// Every record the source held at start was sent (sent once).
    CaughtUp,
}

/// A source that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Opening: the file, the brokers, the topic or stream.
    #[error("{what}: {reason}")]
    Open {
        /// The file, topic or stream and where (`Kafka topic t at host:9092`).
        what: String,
        /// Why.
        reason: String,
    },
    /// Reading after it was opened.
    #[error("reading {what}: {reason}")]
    Read {
        /// What was read.
        what: String,
        /// Why.
        reason: String,
    },
}
