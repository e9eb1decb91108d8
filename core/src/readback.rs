//! What a destination's reader hands `kubesink fold`: the records of a topic, stream or file
//! in order, then [`Event::CaughtUp`] once it reached what the broker held at start. A
//! reader never writes to the broker (no consumer group, no commit, no durable consumer);
//! the fold itself (`src/fold/view.rs` in the bridge) reads only these types.

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
