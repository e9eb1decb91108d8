//! The [`Sink`] implementation of NATS: request building (`request.rs`) wired to the
//! client (`service.rs`). Nothing else lives here.

use async_trait::async_trait;
use kubesink_core::message::Format;
use kubesink_core::template::Template;
use kubesink_core::{Message, ReadySignal, Sink, SinkError};

use crate::request;
use crate::service::NatsService;

/// Publishes topology messages to NATS, core or JetStream, in the configured [`Format`].
/// Built by [`NatsConfig::build_sink`](crate::NatsConfig::build_sink).
pub struct NatsSink {
    name: String,
    subjects: Template,
    format: Format,
    service: NatsService,
    batches_in_flight: usize,
}

impl NatsSink {
    pub(super) fn new(
        name: String,
        subjects: Template,
        format: Format,
        service: NatsService,
        batches_in_flight: usize,
    ) -> Self {
        NatsSink {
            name,
            subjects,
            format,
            service,
            batches_in_flight,
        }
    }

    /// The subject a message is published on (a sync marker's: see
    /// [`request::subject`]).
    pub fn subject(&self, m: &Message) -> String {
        request::subject(m, &self.subjects)
    }

    /// The underlying client (tests and benches subscribe with it).
    pub fn client(&self) -> &async_nats::Client {
        self.service.client()
    }
}

#[async_trait]
impl Sink for NatsSink {
    fn name(&self) -> &str {
        &self.name
    }

    /// Refuses a batch with a message over the server's `max_payload` before publishing
    /// anything ([`SinkError::TooLarge`]); otherwise publishes and waits for the
    /// confirmation of the mode (flush, or every PubAck).
    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        let js = self.service.is_jetstream();
        let publishes: Vec<request::Publish> = batch
            .iter()
            .map(|m| request::build(m, &self.subjects, js, self.format))
            .collect();
        if let Some(e) = request::too_large(&self.name, &publishes, self.service.max_payload()) {
            return Err(e);
        }
        self.service.send(&publishes).await
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.service.healthcheck().await
    }

    /// Flushes what the client holds (bounded by `publish_timeout`); nothing while
    /// disconnected, where a flush could only time out.
    async fn close(&self) -> Result<(), SinkError> {
        self.service.close().await
    }

    /// `batches_in_flight` (default 4): concurrent sends share the client's one connection,
    /// which keeps their publishes in order, and the JetStream context's `max_in_flight`
    /// bound on PubAcks awaited.
    fn max_batches_in_flight(&self) -> usize {
        self.batches_in_flight
    }

    fn max_message_bytes(&self) -> Option<usize> {
        match self.service.max_payload() {
            0 => None,
            n => Some(n),
        }
    }

    /// Bumped on every (re)connect of the client.
    fn ready_signal(&self) -> Option<ReadySignal> {
        Some(self.service.watch().ready().clone())
    }

    /// The same signal: a reconnect is when the healthcheck's answer turns, so the readiness
    /// probe looks at once instead of at its next interval.
    fn health_signal(&self) -> Option<ReadySignal> {
        Some(self.service.watch().ready().clone())
    }
}
