//! The Kafka source: every partition of one topic from its first offset, with an rdkafka
//! consumer that is **assigned** the partitions (`Offset::Beginning`), so it joins no
//! consumer group and commits nothing. Caught up when every partition reached the high
//! watermark read at start.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kubesink_core::readback::BrokerRecord;
use kubesink_core::readback::{Event, ReadOptions, Reading, SourceError};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;

/// `kubesink fold`'s options for a Kafka topic: `--kafka BOOTSTRAP --topic T [-X P=V]…`.
#[derive(Debug, Clone, Default, clap::Args)]
#[group(skip)] // its source option is in `kubesink fold`'s `source` group
pub struct ReadArgs {
    /// Kafka bootstrap servers (`host:9092,host2:9092`); with `--topic`.
    #[arg(long, value_name = "BOOTSTRAP", requires = "topic", group = "source")]
    pub kafka: Option<String>,
    /// The Kafka topic (every partition is read from its first offset; no consumer group).
    #[arg(long)]
    pub topic: Option<String>,
    /// A librdkafka property for the Kafka consumer (`-X security.protocol=sasl_ssl`); repeatable.
    #[arg(short = 'X', long = "kafka-property", value_name = "PROPERTY=VALUE")]
    pub kafka_property: Vec<String>,
}

impl ReadOptions for ReadArgs {
    fn open(
        &self,
        timeout: Duration,
        follow: bool,
        tx: mpsc::Sender<Event>,
    ) -> Option<Result<(Reading, String), String>> {
        let bootstrap = self.kafka.clone()?;
        let Some(topic) = self.topic.clone() else {
            return Some(Err("--kafka needs --topic".to_owned()));
        };
        let properties = self
            .kafka_property
            .iter()
            .map(|p| match p.split_once('=') {
                Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
                None => Err(format!("-X {p}: expected property=value")),
            })
            .collect::<Result<Vec<_>, String>>();
        let properties = match properties {
            Ok(p) => p,
            Err(why) => return Some(Err(why)),
        };
        let src = KafkaSource {
            bootstrap,
            topic,
            properties,
            timeout,
        };
        let what = format!("Kafka topic {} at {}", src.topic, src.bootstrap);
        Some(Ok((Box::pin(read(src, follow, tx)) as Reading, what)))
    }
}

/// Where to read.
#[derive(Debug, Clone)]
pub struct KafkaSource {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The topic.
    pub topic: String,
    /// Extra librdkafka properties (`-X security.protocol=sasl_ssl`, …).
    pub properties: Vec<(String, String)>,
    /// Bound on the metadata and watermark requests at start.
    pub timeout: Duration,
}

/// Reads the topic into `tx` (on a blocking thread: librdkafka's poll blocks).
///
/// # Errors
/// [`SourceError`] naming the brokers and the topic: unreachable, no such topic, a property
/// librdkafka rejects.
pub async fn read(
    src: KafkaSource,
    follow: bool,
    tx: mpsc::Sender<Event>,
) -> Result<(), SourceError> {
    tokio::task::spawn_blocking(move || read_blocking(&src, follow, &tx))
        .await
        .map_err(|e| SourceError::Read {
            what: "the Kafka reader thread".into(),
            reason: e.to_string(),
        })?
}

fn read_blocking(
    src: &KafkaSource,
    follow: bool,
    tx: &mpsc::Sender<Event>,
) -> Result<(), SourceError> {
    let what = format!("Kafka topic {} at {}", src.topic, src.bootstrap);
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &src.bootstrap)
        // Never used to commit: the partitions are assigned, not subscribed.
        .set("group.id", "kubesink-fold")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false");
    for (k, v) in &src.properties {
        cfg.set(k, v);
    }
    let consumer: BaseConsumer = cfg.create().map_err(|e| SourceError::Open {
        what: what.clone(),
        reason: format!("creating the consumer: {e}"),
    })?;
    let metadata = consumer
        .fetch_metadata(Some(&src.topic), src.timeout)
        .map_err(|e| SourceError::Open {
            what: what.clone(),
            reason: format!(
                "brokers unreachable or refusing within {:?}: {e}",
                src.timeout
            ),
        })?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == src.topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(SourceError::Open {
            what,
            reason: "no such topic (or it has no partitions)".into(),
        });
    }
    // Where "caught up" is: the high watermark of each partition now.
    let mut pending: HashMap<i32, i64> = HashMap::new();
    for &p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(&src.topic, p, src.timeout)
            .map_err(|e| SourceError::Open {
                what: what.clone(),
                reason: format!("reading the watermarks of partition {p}: {e}"),
            })?;
        if high > low {
            pending.insert(p, high);
        }
    }
    let mut tpl = TopicPartitionList::new();
    for &p in &partitions {
        tpl.add_partition_offset(&src.topic, p, Offset::Beginning)
            .map_err(|e| SourceError::Open {
                what: what.clone(),
                reason: e.to_string(),
            })?;
    }
    consumer.assign(&tpl).map_err(|e| SourceError::Open {
        what: what.clone(),
        reason: format!("assigning the partitions: {e}"),
    })?;
    let mut caught_up = false;
    let mut last_error: Option<(Instant, String)> = None;
    loop {
        if !caught_up && pending.is_empty() {
            caught_up = true;
            if tx.blocking_send(Event::CaughtUp).is_err() || !follow {
                return Ok(());
            }
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(e)) => {
                // librdkafka retries by itself; report once in a while, not per poll.
                let now = Instant::now();
                if last_error
                    .as_ref()
                    .is_none_or(|(t, _)| now.duration_since(*t) > Duration::from_secs(10))
                {
                    tracing::warn!(topic = %src.topic, error = %e, "kafka consumer error (retrying)");
                    last_error = Some((now, e.to_string()));
                }
            }
            Some(Ok(m)) => {
                let (p, offset) = (m.partition(), m.offset());
                if pending.get(&p).is_some_and(|high| offset + 1 >= *high) {
                    pending.remove(&p);
                }
                let rec = BrokerRecord {
                    value: m.payload().map(<[u8]>::to_vec),
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    partition: Some(p),
                    at: format!("{} partition {p} offset {offset}", src.topic),
                };
                if tx.blocking_send(Event::Record(rec)).is_err() {
                    return Ok(());
                }
            }
        }
        if !caught_up && !pending.is_empty() {
            // A partition whose last records were compacted away or are control records:
            // the position tells where it stands.
            if let Ok(pos) = consumer.position() {
                for e in pos.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        if pending.get(&e.partition()).is_some_and(|high| o >= *high) {
                            pending.remove(&e.partition());
                        }
                    }
                }
            }
        }
    }
}
