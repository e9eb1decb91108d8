//! The NATS sink: core NATS or JetStream (async-nats).
//!
//! - `config`: the `[[sinks]]` entry (`type = "nats"`), validation, `build()`.
//! - `request`: message → subject (template, reversible token escaping) and headers.
//! - `service`: connection (auth, TLS, reconnect forever, event logs), stream check or
//!   creation, error classification.
//! - this module: the [`Sink`] implementation.
//!
//! Delivery: in JetStream mode `send` is `Ok` once every message's PubAck arrived (many in
//! flight, at most `max_in_flight`); each message carries `Nats-Msg-Id` = the message id, so a
//! redelivered batch is stored once within the stream's duplicate window. In core mode `send`
//! is `Ok` once `flush()` returned: the server has the messages, but nothing stores them, so
//! it is at-most-once across a server failure (see `docs/nats.md`).
//!
//! This module never buffers messages past a `send` call, never decides to drop one (an
//! oversize message is reported as [`SinkError::TooLarge`] before anything of the batch is
//! published; the pipeline applies the shared policy), and never logs a secret.

mod config;
mod request;
mod service;

use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream;
use async_trait::async_trait;
use futures::stream::{FuturesUnordered, StreamExt};

pub use config::{
    NatsAuth, NatsConfig, NatsMode, NatsStorage, NatsStream, NatsTls, DEFAULT_SUBJECT,
};
pub use request::{escape_token, unescape_token, SubjectTemplate, TemplateError, EMPTY_TOKEN};
pub use service::{redact_url, NatsError};

use crate::{Message, Sink, SinkError};

/// Publishes topology messages to NATS. Built by [`NatsConfig::build`].
pub struct NatsSink {
    name: String,
    servers: String,
    client: async_nats::Client,
    /// `Some` in JetStream mode.
    jetstream: Option<jetstream::Context>,
    stream: String,
    subjects: SubjectTemplate,
    publish_timeout: Duration,
    max_in_flight: usize,
}

impl NatsSink {
    async fn connect(config: &NatsConfig) -> Result<NatsSink, NatsError> {
        let subjects = SubjectTemplate::parse(&config.subject)?;
        let client = service::connect(config).await?;
        let jetstream = match config.mode {
            NatsMode::Core => None,
            NatsMode::Jetstream => {
                let js = jetstream::ContextBuilder::new()
                    .timeout(config.publish_timeout)
                    .max_ack_inflight(config.max_in_flight)
                    .backpressure_on_inflight(true)
                    .build(client.clone());
                service::ensure_stream(&js, config).await?;
                Some(js)
            }
        };
        tracing::info!(
            sink = %config.name,
            servers = %service::servers_text(config),
            mode = ?config.mode,
            max_payload = client.server_info().max_payload,
            "NATS sink ready"
        );
        Ok(NatsSink {
            name: config.name.clone(),
            servers: service::servers_text(config),
            client,
            jetstream,
            stream: config.stream.name.clone(),
            subjects,
            publish_timeout: config.publish_timeout,
            max_in_flight: config.max_in_flight,
        })
    }

    /// The subject a message is published on.
    pub fn subject(&self, m: &Message) -> String {
        self.subjects.render(&m.meta)
    }

    /// The underlying client (tests and benches subscribe with it).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The first message of `batch` that exceeds the server's `max_payload` with its headers.
    fn too_large(&self, batch: &[Message]) -> Option<SinkError> {
        let limit = self.client.server_info().max_payload;
        if limit == 0 {
            return None;
        }
        let js = self.jetstream.is_some();
        batch.iter().enumerate().find_map(|(index, m)| {
            let size = m.payload.len() + request::headers_wire_len(m, js);
            (size > limit).then(|| SinkError::TooLarge {
                sink: self.name.clone(),
                index,
                size,
                limit: Some(limit),
            })
        })
    }

    async fn send_core(&self, batch: &[Message]) -> Result<(), SinkError> {
        let t = self.publish_timeout;
        for m in batch {
            let subject = self.subject(m);
            let publish = self.client.publish_with_headers(
                subject.clone(),
                request::headers(m, false),
                m.payload.clone(),
            );
            match tokio::time::timeout(t, publish).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(service::transient(
                        &self.name,
                        &self.servers,
                        &format!("publish {subject}"),
                        e,
                    ))
                }
                Err(_) => {
                    return Err(service::transient(
                        &self.name,
                        &self.servers,
                        &format!("publish {subject}"),
                        format!("timed out after {t:?} (disconnected?)"),
                    ))
                }
            }
        }
        self.flush().await
    }

    /// `flush()` bounded by `publish_timeout`; a failure or timeout is transient.
    async fn flush(&self) -> Result<(), SinkError> {
        let t = self.publish_timeout;
        match tokio::time::timeout(t, self.client.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(service::transient(&self.name, &self.servers, "flush", e)),
            Err(_) => Err(service::transient(
                &self.name,
                &self.servers,
                "flush",
                format!("timed out after {t:?} (disconnected?)"),
            )),
        }
    }

    async fn send_jetstream(
        &self,
        js: &jetstream::Context,
        batch: &[Message],
    ) -> Result<(), SinkError> {
        let t = self.publish_timeout;
        let mut failed: Vec<usize> = Vec::new();
        let mut first: Option<SinkError> = None;
        let mut acks = FuturesUnordered::new();
        let mut note = |i: usize, e: SinkError, failed: &mut Vec<usize>| {
            failed.push(i);
            if first.is_none() {
                first = Some(e);
            }
        };
        // After a failed publish (not a failed PubAck) the connection is down or the client
        // is saturated: the rest of the batch is marked failed instead of waiting a timeout
        // per message.
        let mut stop = false;
        for (i, m) in batch.iter().enumerate() {
            if stop {
                failed.push(i);
                continue;
            }
            let subject = self.subject(m);
            let publish = js.publish_with_headers(
                subject.clone(),
                request::headers(m, true),
                m.payload.clone(),
            );
            match tokio::time::timeout(t, publish).await {
                Ok(Ok(ack)) => acks.push(async move { (i, subject, ack.await) }),
                Ok(Err(e)) => {
                    let e = service::classify_jetstream(&self.name, &subject, &e);
                    note(i, e, &mut failed);
                    stop = true;
                }
                Err(_) => {
                    let e = SinkError::transient(
                        &self.name,
                        format!(
                            "JetStream publish to {subject} at {}: timed out after {t:?}",
                            self.servers
                        ),
                    );
                    note(i, e, &mut failed);
                    stop = true;
                }
            }
            while acks.len() >= self.max_in_flight {
                if let Some((i, subject, Err(e))) = acks.next().await {
                    note(
                        i,
                        service::classify_jetstream(&self.name, &subject, &e),
                        &mut failed,
                    );
                }
            }
        }
        while let Some((i, subject, res)) = acks.next().await {
            if let Err(e) = res {
                note(
                    i,
                    service::classify_jetstream(&self.name, &subject, &e),
                    &mut failed,
                );
            }
        }
        let Some(err) = first else {
            return Ok(());
        };
        if failed.len() == batch.len() {
            return Err(err);
        }
        failed.sort_unstable();
        Err(SinkError::Partial {
            sink: self.name.clone(),
            failed,
            message: err.to_string(),
        })
    }
}

#[async_trait]
impl Sink for NatsSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        if let Some(e) = self.too_large(batch) {
            return Err(e);
        }
        match &self.jetstream {
            Some(js) => self.send_jetstream(js, batch).await,
            None => self.send_core(batch).await,
        }
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        if self.client.connection_state() != State::Connected {
            return Err(SinkError::transient(
                &self.name,
                format!("not connected to NATS at {}", self.servers),
            ));
        }
        if let Some(js) = &self.jetstream {
            match tokio::time::timeout(self.publish_timeout, js.get_stream(&self.stream)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    return Err(SinkError::fatal(
                        &self.name,
                        format!(
                            "JetStream stream {:?} at {}: {e}",
                            self.stream, self.servers
                        ),
                    ))
                }
                Err(_) => {
                    return Err(SinkError::transient(
                        &self.name,
                        format!(
                            "JetStream stream {:?} at {}: no answer",
                            self.stream, self.servers
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    async fn close(&self) -> Result<(), SinkError> {
        self.flush().await
    }

    fn max_message_bytes(&self) -> Option<usize> {
        match self.client.server_info().max_payload {
            0 => None,
            n => Some(n),
        }
    }
}
