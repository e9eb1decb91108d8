//! The [`Sink`] implementation of Kafka: request building (`request.rs`) wired to the
//! producer (`service.rs`). Nothing else lives here.

use std::sync::Arc;

use async_trait::async_trait;
use kubesink_core::message::{Format, Placeholder};
use kubesink_core::template::Template;
use kubesink_core::{Message, ReadySignal, Sink, SinkError};

use crate::properties::Properties;
use crate::request::{self, KafkaRecord, CLUSTER_SCOPE};
use crate::service::KafkaService;

/// Bytes of `message.max.bytes` kept for the key, the headers and the record overhead; the
/// payload limit declared to the pipeline is the rest.
pub const RECORD_OVERHEAD_BYTES: usize = 2048;

/// Further bytes kept in the CloudEvents formats: the `ce_` headers (binary mode) or the
/// envelope around the payload (structured mode), each well under this.
pub const CLOUDEVENTS_OVERHEAD_BYTES: usize = 1024;

/// Produces topology messages to Kafka: record key = message key, headers from
/// [`Message::headers`], the value in the configured [`Format`], record timestamp =
/// `observedAt`, a tombstone after each `deleted` (when `tombstones`), a sync marker on every
/// partition of its topics. Built by [`KafkaConfig::build_sink`](crate::KafkaConfig::build_sink).
pub struct KafkaSink {
    name: String,
    topics: Template,
    tombstones: bool,
    format: Format,
    service: KafkaService,
}

impl KafkaSink {
    pub(super) fn new(
        name: String,
        topics: Template,
        tombstones: bool,
        format: Format,
        service: KafkaService,
    ) -> Self {
        KafkaSink {
            name,
            topics,
            tombstones,
            format,
            service,
        }
    }

    /// The producer's librdkafka properties (print them with `{:?}`: secrets are masked).
    pub fn properties(&self) -> &Properties {
        self.service.properties()
    }

    /// How many times an enqueue met librdkafka's `QueueFull` and waited for deliveries
    /// (backpressure from `queue_max_messages`).
    pub fn queue_full_waits(&self) -> u64 {
        self.service.queue_full_waits()
    }

    /// Records librdkafka holds (queued or awaiting their delivery report).
    pub fn in_flight(&self) -> usize {
        self.service.in_flight()
    }

    /// Every `(topic, partition)` a sync marker goes to: each partition of `topic` (the
    /// rendered template); or, when the template has `{namespace}` and the marker covers all
    /// namespaces of a namespaced kind, each partition of every existing topic the template
    /// renders for the resource with some namespace (none yet: nowhere).
    ///
    /// # Errors
    /// The metadata request's error; [`SinkError::Fatal`] when `topic` does not exist (as a
    /// message to it would be); [`SinkError::Transient`] when it has no partitions yet.
    async fn marker_destinations(
        &self,
        m: &Message,
        topic: &Arc<str>,
    ) -> Result<Vec<(Arc<str>, i32)>, SinkError> {
        let meta = &m.meta;
        let every_namespace = self.topics.uses(Placeholder::Namespace)
            && meta.namespace.is_none()
            && meta.resource.namespaced;
        let found: Vec<(String, usize)> = if every_namespace {
            self.service
                .topic_partitions(None)
                .await?
                .into_iter()
                .filter(|(name, _)| {
                    self.topics
                        .matches(name, meta, Placeholder::Namespace, &[CLUSTER_SCOPE])
                })
                .collect()
        } else {
            let found = self.service.topic_partitions(Some(topic)).await?;
            match found.into_iter().find(|(name, _)| **name == **topic) {
                Some((_, 0)) => {
                    return Err(SinkError::transient(
                        &self.name,
                        format!("topic {topic:?} has no partitions in the metadata yet"),
                    ))
                }
                Some(t) => vec![t],
                None => {
                    self.service.watch_for_topic(topic);
                    return Err(SinkError::fatal(
                        &self.name,
                        format!("topic {topic:?} does not exist and the brokers do not auto-create it: create it (docs/kafka.md) or fix `topic`"),
                    ));
                }
            }
        };
        let mut destinations = Vec::new();
        for (name, partitions) in found {
            let name: Arc<str> = name.into();
            let count = i32::try_from(partitions).unwrap_or(i32::MAX);
            destinations.extend((0..count).map(|p| (name.clone(), p)));
        }
        Ok(destinations)
    }

    /// librdkafka's last client error since the brokers last answered.
    pub fn last_broker_error(&self) -> Option<String> {
        self.service.watch().last_error()
    }
}

#[async_trait]
impl Sink for KafkaSink {
    fn name(&self) -> &str {
        &self.name
    }

    /// Produces each message as its records (a sync marker: one per partition of each of its
    /// topics, found in the cluster metadata) and waits for every delivery report.
    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        // Most batches go to one or a few topics: render each once, share it by reference.
        let mut topics: Vec<Arc<str>> = Vec::new();
        let mut records: Vec<KafkaRecord<'_>> = Vec::with_capacity(batch.len());
        for m in batch {
            let rendered = self.topics.render(&m.meta);
            let topic = match topics.iter().find(|t| ***t == *rendered) {
                Some(t) => t.clone(),
                None => {
                    let t: Arc<str> = rendered.into();
                    topics.push(t.clone());
                    t
                }
            };
            records.push(if m.meta.op.is_marker() {
                let destinations = self.marker_destinations(m, &topic).await?;
                request::build_marker(m, topic, destinations, self.format)
            } else {
                request::build(m, topic, self.tombstones, self.format)
            });
        }
        self.service.send(&records).await
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.service.healthcheck().await
    }

    async fn close(&self) -> Result<(), SinkError> {
        self.service.close().await
    }

    /// Purges librdkafka's queue: a deposed leader writes nothing more of the abandoned send.
    async fn abandon(&self) {
        self.service.abandon().await
    }

    /// Producers replaced because the brokers lost or kept rejecting the producer id.
    fn client_rebuilds(&self) -> u64 {
        self.service.rebuilds()
    }

    /// Notified when the brokers answer again after a failed send or healthcheck.
    fn ready_signal(&self) -> Option<ReadySignal> {
        Some(self.service.watch().ready().clone())
    }

    /// Notified when librdkafka reports every broker down, and when they answer after that.
    fn health_signal(&self) -> Option<ReadySignal> {
        Some(self.service.watch().health().clone())
    }

    fn max_message_bytes(&self) -> Option<usize> {
        Some(
            self.service
                .message_max_bytes()
                .saturating_sub(RECORD_OVERHEAD_BYTES)
                .saturating_sub(match self.format {
                    Format::Json => 0,
                    _ => CLOUDEVENTS_OVERHEAD_BYTES,
                })
                .max(1),
        )
    }
}
