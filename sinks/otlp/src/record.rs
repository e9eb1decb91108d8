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

use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use serde_json::Value;

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

/// A JSON value as an OTLP `AnyValue` (numbers that are whole and fit `i64` as `int_value`;
/// `null` as an empty value).
pub fn any(v: Value) -> AnyValue {
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

fn kv(key: impl Into<String>, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(value),
        ..Default::default()
    }
}

fn text(s: impl Into<String>) -> AnyValue {
    AnyValue {
        value: Some(Any::StringValue(s.into())),
    }
}

/// The log record of `m`.
///
/// # Errors
/// The payload is not a JSON object (never, for a message kubesink encoded).
pub fn log_record(m: &Message) -> Result<LogRecord, serde_json::Error> {
    let Value::Object(mut fields) = serde_json::from_slice::<Value>(&m.payload)? else {
        return Err(serde::de::Error::custom("the payload is not a JSON object"));
    };
    let meta = &*m.meta;
    let mut body = vec![kv("type", text(body_type(meta.op.as_str())))];
    match fields.remove("object") {
        Some(Value::Null) | None => {}
        Some(object) => body.push(kv("object", any(object))),
    }
    let mut attributes = vec![kv("k8s.resource.name", text(&meta.resource.plural))];
    if !meta.name.is_empty() {
        attributes.push(kv("event.domain", text("k8s")));
        attributes.push(kv("event.name", text(&*meta.name)));
    }
    attributes.extend(
        fields
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| kv(format!("{FIELD_PREFIX}{k}"), any(v))),
    );
    let observed = meta
        .observed_at_ms()
        .and_then(|ms| u64::try_from(ms).ok())
        .map_or(0, |ms| ms.saturating_mul(1_000_000));
    Ok(LogRecord {
        observed_time_unix_nano: observed,
        body: Some(AnyValue {
            value: Some(Any::KvlistValue(KeyValueList { values: body })),
        }),
        attributes,
        ..Default::default()
    })
}
