//! [`HttpFormat`]: how messages become requests, and the room an envelope takes beside a
//! message ([`ENVELOPE_ROOM`]); read by the configuration and by the sink alike.

use serde::{Deserialize, Serialize};

/// Room left in a request body beyond one message's payload: a structured envelope's
/// attributes (the key twice, escaped, at most ~1.5 KiB) and a batch's brackets. A message
/// larger than `max_body_bytes` minus this is shrunk by the pipeline's oversize policy.
pub const ENVELOPE_ROOM: usize = 4096;

/// How messages become HTTP requests (`format`). Request bodies are the topology message v1
/// (`docs/message-contract.md`), bare or in a CloudEvents envelope
/// (`docs/message-contract.md#cloudevents`).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub enum HttpFormat {
    /// CloudEvents binary content mode: one event per request, the message as the body
    /// (`Content-Type: application/json`), the attributes as `ce-` headers.
    #[default]
    #[serde(rename = "cloudevents")]
    CloudEvents,
    /// CloudEvents structured content mode: one event per request, the body a JSON event
    /// envelope (`application/cloudevents+json`).
    #[serde(rename = "cloudevents-structured")]
    CloudEventsStructured,
    /// CloudEvents batched content mode: many events per request, the body a JSON array of
    /// envelopes (`application/cloudevents-batch+json`).
    #[serde(rename = "cloudevents-batch")]
    CloudEventsBatch,
    /// JSON Lines: many messages per request, one topology message per line
    /// (`application/x-ndjson`).
    #[serde(rename = "jsonl")]
    JsonLines,
}

/// Read by hand so that an unknown value names the key (`format: unknown value …`): a
/// `[[sinks]]` entry is an internally tagged enum, whose errors lose the field's path.
impl<'de> Deserialize<'de> for HttpFormat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        kubesink_core::message::cloudevents::parse_format_of(
            d,
            &HttpFormat::ALL,
            HttpFormat::as_str,
        )
    }
}

impl HttpFormat {
    /// Every format, in documentation order.
    pub const ALL: [HttpFormat; 4] = [
        HttpFormat::CloudEvents,
        HttpFormat::CloudEventsStructured,
        HttpFormat::CloudEventsBatch,
        HttpFormat::JsonLines,
    ];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpFormat::CloudEvents => "cloudevents",
            HttpFormat::CloudEventsStructured => "cloudevents-structured",
            HttpFormat::CloudEventsBatch => "cloudevents-batch",
            HttpFormat::JsonLines => "jsonl",
        }
    }

    /// Whether a request carries many messages.
    pub fn batched(self) -> bool {
        matches!(self, HttpFormat::CloudEventsBatch | HttpFormat::JsonLines)
    }
}
