//! Kafka: partitions assigned (not subscribed: no consumer group, no commits), starting from
//! the checkpoint's offsets or the beginning. Caught up = every partition reached the high
//! watermark read at start.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::view::Checkpoint;

/// Partition → next offset to read.
type Offsets = BTreeMap<i32, i64>;

pub async fn run(
    bootstrap: &str,
    topic: &str,
    checkpoint: &Path,
    exit_when_caught_up: bool,
) -> anyhow::Result<()> {
    let mut view: Checkpoint<Offsets> = Checkpoint::load(checkpoint)?;
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused-no-commits")
        .set("enable.auto.commit", "false")
        .create()?;
    let timeout = Duration::from_secs(10);
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("Kafka at {bootstrap}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        bail!("Kafka topic {topic} at {bootstrap}: no such topic");
    }
    let mut tpl = TopicPartitionList::new();
    let mut behind = BTreeMap::new(); // partition → high watermark at start, while not reached
    for &p in &partitions {
        let next = view.position.get(&p).copied();
        tpl.add_partition_offset(topic, p, next.map_or(Offset::Beginning, Offset::Offset))?;
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
        if high > low.max(next.unwrap_or(0)) {
            behind.insert(p, high);
        }
    }
    consumer.assign(&tpl)?;
    let stop = crate::stopped();
    tokio::pin!(stop);
    let mut saved = Instant::now();
    while !(behind.is_empty() && exit_when_caught_up) {
        tokio::select! {
            _ = &mut stop => break,
            m = tokio::time::timeout(Duration::from_millis(200), consumer.recv()) => {
                if let Ok(Ok(m)) = m {
                    let key = m.key().map(String::from_utf8_lossy);
                    view.apply(m.payload(), key.as_deref(), Some(m.partition()))
                        .with_context(|| format!("partition {} offset {}", m.partition(), m.offset()))?;
                    view.position.insert(m.partition(), m.offset() + 1);
                    if behind.get(&m.partition()).is_some_and(|h| m.offset() + 1 >= *h) {
                        behind.remove(&m.partition());
                    }
                }
            }
        }
        if saved.elapsed() > Duration::from_secs(1) {
            view.save(checkpoint)?;
            saved = Instant::now();
        }
    }
    view.save(checkpoint)?;
    if behind.is_empty() {
        view.print();
    }
    Ok(())
}
