//! The opt-in CloudEvents 1.0 binding of a topology message (a sink's `format`), defined once
//! for every sink: the context attributes, the binary content mode's header names per
//! protocol binding, and the structured content mode's JSON envelope. See
//! `docs/message-contract.md#cloudevents`.
//!
//! | attribute | value |
//! |---|---|
//! | `specversion` | `1.0` |
//! | `id` | the message id (sync markers: their id) |
//! | `source` | `kubesink://{cluster}` ([`source`]) |
//! | `type` | `io.kubesink.topology.{op}`: `added`, `updated`, `deleted`, `synced`; for Event occurrences (`mode = "events"`) `io.kubesink.event.{op}` |
//! | `subject` | the message key |
//! | `time` | the payload's `observedAt` |
//! | `datacontenttype` | `application/json` |
//! | `dataschema` | [`DATASCHEMA`], the `$id` of `docs/topology-message-v1.schema.json` |
//!
//! The event data is the topology message v1 payload, byte for byte as `format = "json"`
//! sends it. The binary content mode's header names belong to each protocol binding, so each
//! destination writes its own from [`attributes`]: `cloudevents.rs` in the Kafka crate
//! (`ce_{attribute}`, Kafka protocol binding 1.0 §3.2) and in the NATS crate (`ce-{attribute}`,
//! percent-encoded, NATS protocol binding §3.1).
//!
//! Why not the `cloudevents-sdk` crate: its Kafka binding needs rdkafka 0.38 built with cmake
//! (kubesink links rdkafka 0.39; two versions of librdkafka cannot be linked into one
//! binary), its NATS binding targets async-nats 0.42 and structured mode only, and its
//! `Event` would make every payload be parsed into a `serde_json::Value` and written again.
//! The attributes are eight fixed strings, written here; the tests check the result with the
//! SDK's own deserializer.

use std::borrow::Cow;
use std::fmt::Write as _;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::model::{Message, CONTENT_TYPE_JSON};

/// The `specversion` kubesink writes.
pub const SPECVERSION: &str = "1.0";

/// The `dataschema` of every event: the `$id` of `docs/topology-message-v1.schema.json`.
pub const DATASCHEMA: &str = "https://kubesink.io/schemas/topology-message-v1.schema.json";

/// The prefix of `type`: `io.kubesink.topology.added` and so on.
pub const TYPE_PREFIX: &str = "io.kubesink.topology.";

/// The prefix of an Event occurrence's `type` (`mode = "events"`):
/// `io.kubesink.event.added` and so on.
pub const EVENT_TYPE_PREFIX: &str = "io.kubesink.event.";

/// The content type of a structured-mode message (the JSON event format).
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";

/// The content type of a batched-mode body (HTTP protocol binding §3.3): a JSON array of
/// structured-mode events.
pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";

/// How a sink writes each message (`format` of a `[[sinks]]` entry).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// `"json"` (default): the topology message v1 as the payload, kubesink's headers.
    #[default]
    Json,
    /// `"cloudevents"`: CloudEvents binary content mode: the same payload, plus the event's
    /// attributes as headers (`ce_` on Kafka, `ce-` on NATS).
    #[serde(rename = "cloudevents")]
    CloudEvents,
    /// `"cloudevents-structured"`: CloudEvents structured content mode: the payload is the
    /// JSON event format envelope with `data` = the topology message,
    /// `content-type: application/cloudevents+json`.
    #[serde(rename = "cloudevents-structured")]
    CloudEventsStructured,
}

/// Reads a `format` value, naming the key in the error: a `[[sinks]]` entry is an internally
/// tagged enum, whose errors lose the field's path (`sinks.0: …`), so the message says
/// `format` itself.
pub fn parse_format<'de, D: serde::Deserializer<'de>>(
    d: D,
    allowed: &[Format],
) -> Result<Format, D::Error> {
    parse_format_of(d, allowed, Format::as_str)
}

/// [`parse_format`] for a destination's own format type (`allowed`, spelled by `as_str`).
pub fn parse_format_of<'de, D: serde::Deserializer<'de>, F: Copy>(
    d: D,
    allowed: &[F],
    as_str: fn(F) -> &'static str,
) -> Result<F, D::Error> {
    let text = String::deserialize(d)?;
    allowed
        .iter()
        .copied()
        .find(|f| as_str(*f) == text)
        .ok_or_else(|| {
            let names: Vec<String> = allowed
                .iter()
                .map(|f| format!("{:?}", as_str(*f)))
                .collect();
            serde::de::Error::custom(format!(
                "format: unknown value {text:?}; expected {}",
                names.join(" or ")
            ))
        })
}

/// `format`'s JSON Schema: one of its spellings.
impl schemars::JsonSchema for Format {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Format".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "How each message is written: \"json\" (the topology message v1), \"cloudevents\" (binary content mode) or \"cloudevents-structured\" (a CloudEvents JSON envelope).",
            "enum": ["json", "cloudevents", "cloudevents-structured"]
        })
    }
}

impl<'de> Deserialize<'de> for Format {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        parse_format(
            d,
            &[
                Format::Json,
                Format::CloudEvents,
                Format::CloudEventsStructured,
            ],
        )
    }
}

impl Format {
    /// The configuration spelling (`json`, `cloudevents`, `cloudevents-structured`).
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::CloudEvents => "cloudevents",
            Format::CloudEventsStructured => "cloudevents-structured",
        }
    }

    /// The `content-type` header of a message in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json | Format::CloudEvents => CONTENT_TYPE_JSON,
            Format::CloudEventsStructured => STRUCTURED_CONTENT_TYPE,
        }
    }

    /// The payload of `m` in this format: the message's own bytes (shared, not copied), or
    /// the structured envelope ([`structured`]).
    pub fn payload(self, m: &Message) -> Bytes {
        match self {
            Format::Json | Format::CloudEvents => m.payload.clone(),
            Format::CloudEventsStructured => structured(m),
        }
    }
}

/// The `source` of `cluster`'s events: `kubesink://{cluster}` (an absolute URI; cluster names
/// are label values, so valid URI authorities).
pub fn source(cluster: &str) -> String {
    format!("kubesink://{cluster}")
}

/// The context attributes of `m` in documentation order, `datacontenttype` included:
/// `(attribute name, value)`.
pub fn attributes(m: &Message) -> [(&'static str, Cow<'_, str>); 8] {
    let meta = &*m.meta;
    [
        ("specversion", Cow::Borrowed(SPECVERSION)),
        ("id", Cow::Borrowed(&*meta.id)),
        ("source", Cow::Owned(source(&meta.resource.cluster))),
        (
            "type",
            Cow::Owned(format!(
                "{}{}",
                match meta.resource.events {
                    true => EVENT_TYPE_PREFIX,
                    false => TYPE_PREFIX,
                },
                meta.op.as_str()
            )),
        ),
        ("subject", Cow::Borrowed(&*m.key)),
        ("time", Cow::Borrowed(&*meta.observed_at)),
        ("datacontenttype", Cow::Borrowed(CONTENT_TYPE_JSON)),
        ("dataschema", Cow::Borrowed(DATASCHEMA)),
    ]
}

/// The structured content mode payload: the JSON event format, the attributes in
/// documentation order, then `"data"` = the topology message's bytes verbatim.
pub fn structured(m: &Message) -> Bytes {
    let mut out = Vec::with_capacity(m.payload.len() + 384);
    out.push(b'{');
    for (name, value) in attributes(m) {
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        // serde_json writes a string with the escapes JSON needs; it cannot fail for &str.
        let _ = serde_json::to_writer(&mut out, &*value);
        out.push(b',');
    }
    out.extend_from_slice(b"\"data\":");
    out.extend_from_slice(&m.payload);
    out.push(b'}');
    Bytes::from(out)
}

/// The header value encoding of the HTTP protocol binding (§3.1.3.2), which the NATS binding
/// (§3.1.3.2) takes over word for word: space, `"`, `%` and every byte
/// outside printable ASCII become `%XY` (uppercase hex of each UTF-8 byte). Borrows `value`
/// when nothing needs encoding (the usual case).
pub fn percent_encode_header(value: &str) -> Cow<'_, str> {
    if value
        .bytes()
        .all(|b| matches!(b, b'!'..=b'~') && b != b'"' && b != b'%')
    {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    for b in value.bytes() {
        match b {
            b' ' | b'"' | b'%' => {
                let _ = write!(out, "%{b:02X}");
            }
            b'!'..=b'~' => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::fixtures::deployment_message;
    use crate::message::Op;

    #[test]
    fn attributes_follow_the_documented_mapping() {
        let m = deployment_message(Op::Updated);
        let a: Vec<(&str, String)> = attributes(&m)
            .into_iter()
            .map(|(k, v)| (k, v.into_owned()))
            .collect();
        assert_eq!(
            a,
            [
                ("specversion", "1.0".to_owned()),
                ("id", m.meta.id.to_string()),
                ("source", "kubesink://prod".into()),
                ("type", "io.kubesink.topology.updated".into()),
                ("subject", "prod/apps/Deployment/web/api".into()),
                ("time", "2026-11-30T10:00:00.123Z".into()),
                ("datacontenttype", "application/json".into()),
                ("dataschema", DATASCHEMA.into()),
            ]
        );
    }

    #[test]
    fn the_structured_envelope_carries_the_payload_verbatim_as_data() {
        let m = deployment_message(Op::Added);
        let env: serde_json::Value = serde_json::from_slice(&structured(&m)).unwrap();
        let data: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(env["data"], data);
        assert_eq!(env["type"], "io.kubesink.topology.added");
        assert_eq!(env["subject"], &*m.key);
        let text = String::from_utf8(structured(&m).to_vec()).unwrap();
        let payload = std::str::from_utf8(&m.payload).unwrap();
        assert!(text.ends_with(&format!("\"data\":{payload}}}")), "{text}");
    }

    #[test]
    fn format_spellings() {
        for f in [
            Format::Json,
            Format::CloudEvents,
            Format::CloudEventsStructured,
        ] {
            let v = serde_json::to_value(f).unwrap();
            assert_eq!(v, f.as_str());
            assert_eq!(serde_json::from_value::<Format>(v).unwrap(), f);
        }
        assert!(serde_json::from_value::<Format>("xml".into()).is_err());
    }

    #[test]
    fn header_values_are_percent_encoded_as_the_bindings_say() {
        assert_eq!(
            percent_encode_header("prod/core/Pod//%synced"),
            "prod/core/Pod//%25synced"
        );
        assert_eq!(
            percent_encode_header("Euro \u{20AC} \u{1F600}"),
            "Euro%20%E2%82%AC%20%F0%9F%98%80"
        );
        assert_eq!(percent_encode_header("a\"b"), "a%22b");
    }
}
