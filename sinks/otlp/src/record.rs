//! A topology message as an OpenTelemetry log record, shaped like the Collector's
//! `k8sobjects` receiver in watch mode (opentelemetry-collector-contrib
//! `receiver/k8sobjectsreceiver/unstructured_to_logdata.go`), so kubesink can replace it in an
//! existing pipeline, plus every other field of the message as a `kubesink.*` attribute, so
//! the message can be read back whole ([`crate::reader`]).
//!
//! | part | value |
//! |---|---|
//! | resource attribute `k8s.cluster.name` | the message's `cluster` |
//! | resource attribute `k8s.namespace.name` | its namespace, for a namespaced object (`k8sobjects` sets none in watch mode) |
//! | scope | `kubesink`, the crate's version |
//! | `observed_time_unix_nano` | `observedAt` |
//! | body | a map: `type` = `ADDED`, `MODIFIED` (an `updated`), `DELETED` or `SYNCED` (a sync marker), and `object` = the object (absent when the message has none) |
//! | attributes `k8s.resource.name`, `event.domain`, `event.name` | the resource's plural, `k8s`, the object's name (as `k8sobjects`) |
//! | attributes `kubesink.{field}` | every other top-level field of the message (`kubesink.op`, `kubesink.id`, `kubesink.key`, `kubesink.uid`, `kubesink.resourceVersion`, `kubesink.changed`…), JSON mapped to `AnyValue` |
//!
//! The payload's JSON is read straight into `AnyValue`s (a serde visitor, no
//! `serde_json::Value` between them: a record costs one parse), keeping the message's order of
//! fields in every map. This typed form is the mapping's reference; the sink sends
//! [`crate::wire`]'s bytes, written from the JSON without the tree and equal to this record's
//! encoding (its tests compare them).

use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use kubesink_core::Message;

/// The prefix of the attributes that carry the message's own fields.
pub const FIELD_PREFIX: &str = "kubesink.";

/// The body's `type` of an `op` (the watch event types `k8sobjects` writes; `SYNCED` for a
/// sync marker, which a watch does not have).
pub fn body_type(op: &str) -> &'static str {
    match op {
        "added" => "ADDED",
        "updated" => "MODIFIED",
        "deleted" => "DELETED",
        _ => "SYNCED",
    }
}

/// Reads a JSON value as an OTLP `AnyValue`: numbers that are whole and fit `i64` as
/// `int_value`, other numbers as `double_value`, `null` as an empty value, objects as
/// `kvlist_value` in their order.
struct AnySeed;

impl<'de> DeserializeSeed<'de> for AnySeed {
    type Value = AnyValue;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<AnyValue, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AnySeed {
    type Value = AnyValue;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<AnyValue, E> {
        Ok(some(Any::BoolValue(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<AnyValue, E> {
        Ok(some(Any::IntValue(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<AnyValue, E> {
        Ok(some(match i64::try_from(v) {
            Ok(i) => Any::IntValue(i),
            Err(_) => Any::DoubleValue(v as f64),
        }))
    }

    fn visit_f64<E>(self, v: f64) -> Result<AnyValue, E> {
        Ok(some(Any::DoubleValue(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<AnyValue, E> {
        Ok(some(Any::StringValue(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<AnyValue, E> {
        Ok(some(Any::StringValue(v)))
    }

    fn visit_unit<E>(self) -> Result<AnyValue, E> {
        Ok(AnyValue { value: None })
    }

    fn visit_none<E>(self) -> Result<AnyValue, E> {
        Ok(AnyValue { value: None })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AnyValue, A::Error> {
        let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(AnySeed)? {
            values.push(v);
        }
        Ok(some(Any::ArrayValue(ArrayValue { values })))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<AnyValue, A::Error> {
        let values = Fields
            .visit_map(map)?
            .into_iter()
            .map(|(k, v)| kv(k, v))
            .collect();
        Ok(some(Any::KvlistValue(KeyValueList { values })))
    }
}

/// Reads a JSON object as its fields, in order. (A message has no repeated keys: kubesink's
/// encoder writes each field once and copies the object as the API server wrote it, from Go
/// structs and maps.)
pub(crate) struct Fields;

impl<'de> Visitor<'de> for Fields {
    type Value = Vec<(String, AnyValue)>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields: Vec<(String, AnyValue)> = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key::<String>()? {
            fields.push((key, map.next_value_seed(AnySeed)?));
        }
        Ok(fields)
    }
}

fn some(v: Any) -> AnyValue {
    AnyValue { value: Some(v) }
}

pub(crate) fn kv(key: impl Into<String>, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(value),
        ..Default::default()
    }
}

pub(crate) fn text(s: impl Into<String>) -> AnyValue {
    AnyValue {
        value: Some(Any::StringValue(s.into())),
    }
}

/// The record's `observed_time_unix_nano`: the message's `observedAt` in nanoseconds since
/// the Unix epoch (0, which the encoding leaves out, when it has none).
pub(crate) fn observed_nanos(meta: &kubesink_core::message::MessageMeta) -> u64 {
    meta.observed_at_ms()
        .and_then(|ms| u64::try_from(ms).ok())
        .map_or(0, |ms| ms.saturating_mul(1_000_000))
}

/// The log record of `m`.
///
/// # Errors
/// The payload is not a JSON object (never, for a message kubesink encoded).
pub fn log_record(m: &Message) -> Result<LogRecord, serde_json::Error> {
    let meta = &*m.meta;
    let mut body = vec![kv("type", text(body_type(meta.op.as_str())))];
    let mut attributes = vec![kv("k8s.resource.name", text(&meta.resource.plural))];
    if !meta.name.is_empty() {
        attributes.push(kv("event.domain", text("k8s")));
        attributes.push(kv("event.name", text(&*meta.name)));
    }
    let mut de = serde_json::Deserializer::from_slice(&m.payload);
    let fields = de.deserialize_map(Fields)?;
    de.end()?;
    for (key, value) in fields {
        match (key.as_str(), value.value.is_some()) {
            (_, false) => {}
            ("object", true) => body.push(kv("object", value)),
            (_, true) => attributes.push(kv(format!("{FIELD_PREFIX}{key}"), value)),
        }
    }
    Ok(LogRecord {
        observed_time_unix_nano: observed_nanos(meta),
        body: Some(AnyValue {
            value: Some(Any::KvlistValue(KeyValueList { values: body })),
        }),
        attributes,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A JSON value as an OTLP `AnyValue` (numbers that are whole and fit `i64` as `int_value`;
    /// `null` as an empty value).
    fn any(v: Value) -> AnyValue {
        let value = match v {
            Value::Null => None,
            Value::Bool(b) => Some(Any::BoolValue(b)),
            Value::Number(n) => Some(match n.as_i64() {
                Some(i) => Any::IntValue(i),
                None => Any::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
            }),
            Value::String(s) => Some(Any::StringValue(s)),
            Value::Array(a) => Some(Any::ArrayValue(ArrayValue {
                values: a.into_iter().map(any).collect(),
            })),
            Value::Object(m) => Some(Any::KvlistValue(KeyValueList {
                values: m.into_iter().map(|(k, v)| kv(k, any(v))).collect(),
            })),
        };
        AnyValue { value }
    }

    /// `v` with every map's entries in key order.
    fn sorted(v: AnyValue) -> AnyValue {
        let value = v.value.map(|v| match v {
            Any::KvlistValue(l) => {
                let mut values: Vec<KeyValue> = l
                    .values
                    .into_iter()
                    .map(|kv| KeyValue {
                        value: kv.value.map(sorted),
                        ..kv
                    })
                    .collect();
                values.sort_by(|a, b| a.key.cmp(&b.key));
                Any::KvlistValue(KeyValueList { values })
            }
            Any::ArrayValue(a) => Any::ArrayValue(ArrayValue {
                values: a.values.into_iter().map(sorted).collect(),
            }),
            other => other,
        });
        AnyValue { value }
    }

    #[test]
    fn the_payload_reads_as_the_json_value_maps_it() {
        let payloads = [
            r#"{"op":"updated","object":{"metadata":{"name":"a","labels":{"z":"1","a":"fr\u00f6"}},"spec":{"replicas":3,"weight":1.5,"big":18446744073709551615,"neg":-2,"whole":2.0,"none":null,"list":[1,"x",[true,false],{"k":null}]}},"changed":["/spec"],"leaderEpoch":null}"#,
            r#"{"op":"synced","object":null}"#,
            r#"{}"#,
        ];
        for json in payloads {
            let by_seed = AnySeed
                .deserialize(&mut serde_json::Deserializer::from_str(json))
                .expect("seed");
            let by_value = any(serde_json::from_str::<Value>(json).expect("value"));
            assert_eq!(sorted(by_seed), sorted(by_value), "{json}");
        }
    }
}
