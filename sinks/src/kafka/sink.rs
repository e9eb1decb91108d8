//! The [`Sink`] implementation of Kafka: request building (`request.rs`) wired to the
//! producer (`service.rs`). Nothing else lives here.

use std::sync::Arc;

use async_trait::async_trait;

use super::request::{self, Record};
use super::service::{KafkaService, Properties};
use crate::template::Template;
use crate::{Message, ReadySignal, Sink, SinkError};

/// Bytes of `message.max.bytes` kept for the key, the headers and the record overhead; the
/// payload limit declared to the pipeline is the rest.
pub const RECORD_OVERHEAD_BYTES: usize = 2048;

/// Produces topology messages to Kafka: record key = message key, headers from
/// [`Message::headers`], a tombstone after each `deleted` (when `tombstones`). Built by
/// [`KafkaConfig::build`](super::KafkaConfig::build).
pub struct KafkaSink {
    name: String,
    topics: Template,
    tombstones: bool,
    service: KafkaService,
}

impl KafkaSink {
    pub(super) fn new(
        name: String,
        topics: Template,
        tombstones: bool,
        service: KafkaService,
    ) -> Self {
        KafkaSink {
            name,
            topics,
            tombstones,
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

    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        // Most batches go to one or a few topics: render each once, share it by reference.
        let mut topics: Vec<Arc<str>> = Vec::new();
        let records: Vec<Record<'_>> = batch
            .iter()
            .map(|m| {
                let rendered = self.topics.render(&m.meta);
                let topic = match topics.iter().find(|t| ***t == *rendered) {
                    Some(t) => t.clone(),
                    None => {
                        let t: Arc<str> = rendered.into();
                        topics.push(t.clone());
                        t
                    }
                };
                request::build(m, topic, self.tombstones)
            })
            .collect();
        self.service.send(&records).await
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.service.healthcheck().await
    }

    async fn close(&self) -> Result<(), SinkError> {
        self.service.close().await
    }

    /// Notified when the brokers answer again after a failed send or healthcheck.
    fn ready_signal(&self) -> Option<ReadySignal> {
        Some(self.service.watch().ready().clone())
    }

    fn max_message_bytes(&self) -> Option<usize> {
        Some(
            self.service
                .message_max_bytes()
                .saturating_sub(RECORD_OVERHEAD_BYTES)
                .max(1),
        )
    }
}
