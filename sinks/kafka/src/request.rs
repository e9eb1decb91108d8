//! Request building: message → Kafka records (topic, key, headers, tombstone).
//!
//! Owns the topic [`Dialect`] of the shared template engine and its escaping rule. Must never
//! look inside the payload: every routing fact comes from
//! [`MessageMeta`](kubesink_core::MessageMeta).

use std::sync::Arc;

use bytes::Bytes;
use kubesink_core::message::{Format, Placeholder};
use kubesink_core::template::{Dialect, Template, TemplateError};
use kubesink_core::{Message, Op};
use rdkafka::message::{Header, OwnedHeaders};

use crate::cloudevents;

/// Longest legal Kafka topic name.
pub const MAX_TOPIC_LEN: usize = 249;

/// What the `{namespace}` placeholder becomes for a cluster-scoped object.
pub const CLUSTER_SCOPE: &str = "_cluster";

/// Topic templates: placeholders anywhere except `{name}` (a topic per object would be
/// unbounded); literal text of `[A-Za-z0-9._-]` only; values escaped by [`escape`];
/// `{namespace}` of a cluster-scoped object is [`CLUSTER_SCOPE`].
pub static TOPIC: Dialect = Dialect {
    what: "topic",
    separator: None,
    excluded: &[Placeholder::Name],
    check_literal,
    escape: |value, out| match value {
        Some(v) => escape(v, out),
        None => out.push_str(CLUSTER_SCOPE),
    },
};

fn check_literal(text: &str) -> Result<(), String> {
    match text.chars().find(|c| !legal_topic_char(*c)) {
        Some(c) => Err(format!(
            "has character {c:?}, not allowed in a Kafka topic name (allowed: A-Z a-z 0-9 . _ -)"
        )),
        None => Ok(()),
    }
}

/// Parses a `topic` template, e.g. `kubesink.{cluster}` or `k8s.{cluster}.{resource}`.
///
/// # Errors
/// [`TemplateError`] for an unknown placeholder, an unclosed `{`, illegal literal
/// characters, or an empty template.
pub fn topic_template(text: &str) -> Result<Template, TemplateError> {
    Template::parse(text, &TOPIC)
}

/// Whether Kafka allows `c` in a topic name (`[A-Za-z0-9._-]`).
pub fn legal_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The escaping rule for substituted values: every character outside `[A-Za-z0-9._-]`
/// becomes `_`. (Kubernetes names, groups, kinds and cluster names never contain one, so
/// in practice values pass through unchanged.)
pub fn escape(value: &str, out: &mut String) {
    out.extend(
        value
            .chars()
            .map(|c| if legal_topic_char(c) { c } else { '_' }),
    );
}

/// One message as Kafka records: its `deleted`/`added`/`updated` record and, after a
/// `deleted` with tombstones on, the tombstone (same key, null value); or a sync marker's
/// records, one per partition of each of its topics. Every record's timestamp is the
/// message's `observedAt`.
pub struct KafkaRecord<'a> {
    /// The topic (for a sync marker: its first destination's, for messages and checks).
    pub topic: Arc<str>,
    /// `None`: one record on `topic`, partitioned by key. `Some`: a sync marker, one record
    /// on each `(topic, partition)` (explicit partitions; possibly none at all when the
    /// resource maps to no existing topic yet).
    pub fan_out: Option<Vec<(Arc<str>, i32)>>,
    /// The record key: the message key.
    pub key: &'a [u8],
    /// The value: the payload in the sink's [`Format`] (shared bytes, or the structured
    /// envelope).
    pub payload: Bytes,
    /// The record timestamp in milliseconds since the Unix epoch: `observedAt`
    /// (`None`: librdkafka's current time, only if `observedAt` does not parse).
    pub timestamp: Option<i64>,
    /// The record headers ([`headers`]).
    pub headers: OwnedHeaders,
    /// The tombstone's headers, when a tombstone follows.
    pub tombstone: Option<OwnedHeaders>,
}

/// The records of `m` on `topic`, written in `format`.
pub fn build(m: &Message, topic: Arc<str>, tombstones: bool, format: Format) -> KafkaRecord<'_> {
    KafkaRecord {
        topic,
        fan_out: None,
        key: m.key.as_bytes(),
        payload: format.payload(m),
        timestamp: m.meta.observed_at_ms(),
        headers: headers(m, format),
        tombstone: (tombstones && m.meta.op == Op::Deleted).then(|| tombstone_headers(m)),
    }
}

/// The records of a sync marker `m`: the same key, payload and headers on every
/// `(topic, partition)` of `destinations`, so a consumer of any partition sees it after that
/// partition's messages of the list. Never a tombstone.
pub fn build_marker<'a>(
    m: &'a Message,
    fallback_topic: Arc<str>,
    destinations: Vec<(Arc<str>, i32)>,
    format: Format,
) -> KafkaRecord<'a> {
    KafkaRecord {
        topic: destinations
            .first()
            .map_or(fallback_topic, |(t, _)| t.clone()),
        fan_out: Some(destinations),
        key: m.key.as_bytes(),
        payload: format.payload(m),
        timestamp: m.meta.observed_at_ms(),
        headers: headers(m, format),
        tombstone: None,
    }
}

/// The record headers of a message: `Message::headers()` (op, kind, apiVersion, group,
/// cluster, namespace, name, key, content-type, id), values as UTF-8 bytes; `content-type`
/// is the format's ([`Format::content_type`]), and in CloudEvents binary mode the event's
/// `ce_` attributes follow ([`cloudevents::kafka_headers`]).
pub fn headers(m: &Message, format: Format) -> OwnedHeaders {
    let mut h = m
        .headers()
        .fold(OwnedHeaders::new_with_capacity(18), |h, (key, value)| {
            let value = if key == "content-type" {
                format.content_type()
            } else {
                value
            };
            h.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        });
    if format == Format::CloudEvents {
        for (key, value) in cloudevents::kafka_headers(m) {
            h = h.insert(Header {
                key,
                value: Some(value.as_bytes()),
            });
        }
    }
    h
}

/// The headers of a tombstone, the same in every format (a tombstone is a compaction
/// instruction, not an event: no CloudEvents attributes): those of its `deleted` message
/// with `op` = `tombstone`, `id` = the tombstone's own id
/// ([`tombstone_id`](kubesink_core::message::tombstone_id)), `tombstone: true`, and no
/// `content-type` (a tombstone has no payload).
pub fn tombstone_headers(m: &Message) -> OwnedHeaders {
    let id = m.meta.tombstone_id.as_deref().unwrap_or(&m.meta.id);
    m.headers()
        .filter(|(k, _)| *k != "content-type")
        .chain([("tombstone", "true")])
        .fold(OwnedHeaders::new_with_capacity(11), |h, (key, value)| {
            let value = match key {
                "op" => "tombstone",
                "id" => id,
                _ => value,
            };
            h.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        })
}
