//! An Event occurrence (`mode = "events"`, docs/events.md) as an OpenTelemetry log record,
//! shaped like the Collector's `k8s_events` receiver (opentelemetry-collector-contrib
//! `receiver/k8seventsreceiver/k8s_event_to_logdata.go`), so kubesink can take its place in
//! an existing pipeline too, plus the message's own fields as `kubesink.*` attributes (so
//! `kubesink fold --file` reads it back, [`crate::reader`]).
//!
//! | part | value |
//! |---|---|
//! | resource attributes | `k8s.cluster.name` (the message's `cluster`); as `k8s_events`: `k8s.node.name` (`event.reportingInstance`, which is the core Event's `source.host` when it has no other), `k8s.object.kind`, `k8s.object.name`, `k8s.object.uid`, `k8s.object.fieldpath`, `k8s.object.api_version`, `k8s.object.resource_version` (of `event.regarding`), each `""` when absent |
//! | `time_unix_nano` | `event.lastTime` (`k8s_events`: the last timestamp, else the event time, else the first) |
//! | `observed_time_unix_nano` | `observedAt` |
//! | severity | from `event.type`: `Normal` INFO, `Warning` WARN, `Error` ERROR, `Critical` FATAL, the type as `severity_text`; none for another type |
//! | body | `event.note`, a string |
//! | attributes | as `k8s_events`: `k8s.event.reason`, `k8s.event.action`, `k8s.event.start_time` (`event.firstTime`, RFC 3339: `k8s_events` writes the Event's creation time in Go's `time.String()` form), `k8s.event.name`, `k8s.event.uid`, `k8s.namespace.name` (of `event.regarding`), `k8s.event.count` (`event.count`); then `kubesink.{field}` for every field of the message, `kubesink.event` and `kubesink.occurrences` included |
//!
//! Each record has a resource of its own (the object the Event is about), as `k8s_events`
//! sends it.

use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::AnyValue;
use opentelemetry_proto::tonic::logs::v1::{LogRecord, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde::de::Deserializer;
use serde_json::Value;

use kubesink_core::Message;

use crate::record::{kv, observed_nanos, text, Fields, FIELD_PREFIX};

/// The severity of an Event's `type` (`k8s_events`' map, case-insensitive).
fn severity(type_: &str) -> Option<SeverityNumber> {
    match type_.to_ascii_lowercase().as_str() {
        "normal" => Some(SeverityNumber::Info),
        "warning" => Some(SeverityNumber::Warn),
        "error" => Some(SeverityNumber::Error),
        "critical" => Some(SeverityNumber::Fatal),
        _ => None,
    }
}

/// An RFC 3339 time in nanoseconds since the Unix epoch (0, which the encoding leaves out,
/// when it does not parse).
fn nanos(t: &str) -> u64 {
    humantime::parse_rfc3339_weak(t)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .unwrap_or(0)
}

/// The resource and the log record of `m`, an Event occurrence.
///
/// # Errors
/// The payload is not a JSON object (never, for a message kubesink encoded).
pub fn event_record(m: &Message) -> Result<(Resource, LogRecord), serde_json::Error> {
    let meta = &*m.meta;
    let v: Value = serde_json::from_slice(&m.payload)?;
    let event = &v["event"];
    let regarding = &event["regarding"];
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let resource = Resource {
        attributes: vec![
            kv("k8s.cluster.name", text(&meta.resource.cluster)),
            kv("k8s.node.name", text(s(&event["reportingInstance"]))),
            kv("k8s.object.kind", text(s(&regarding["kind"]))),
            kv("k8s.object.name", text(s(&regarding["name"]))),
            kv("k8s.object.uid", text(s(&regarding["uid"]))),
            kv("k8s.object.fieldpath", text(s(&regarding["fieldPath"]))),
            kv("k8s.object.api_version", text(s(&regarding["apiVersion"]))),
            kv(
                "k8s.object.resource_version",
                text(s(&regarding["resourceVersion"])),
            ),
        ],
        ..Default::default()
    };
    let mut attributes = vec![
        kv("k8s.event.reason", text(s(&event["reason"]))),
        kv("k8s.event.action", text(s(&event["action"]))),
        kv("k8s.event.start_time", text(s(&event["firstTime"]))),
        kv("k8s.event.name", text(&*meta.name)),
        kv("k8s.event.uid", text(&*meta.uid)),
        kv("k8s.namespace.name", text(s(&regarding["namespace"]))),
    ];
    if let Some(count) = event["count"].as_i64().filter(|&n| n != 0) {
        attributes.push(kv(
            "k8s.event.count",
            AnyValue {
                value: Some(Any::IntValue(count)),
            },
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(&m.payload);
    let fields = de.deserialize_map(Fields)?;
    de.end()?;
    for (key, value) in fields {
        if value.value.is_some() {
            attributes.push(kv(format!("{FIELD_PREFIX}{key}"), value));
        }
    }
    let type_ = s(&event["type"]);
    let severity = severity(&type_);
    Ok((
        resource,
        LogRecord {
            time_unix_nano: nanos(event["lastTime"].as_str().unwrap_or_default()),
            observed_time_unix_nano: observed_nanos(meta),
            severity_number: severity.map_or(0, |s| s as i32),
            severity_text: if severity.is_some() {
                type_
            } else {
                String::new()
            },
            body: Some(text(s(&event["note"]))),
            attributes,
            ..Default::default()
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubesink_core::message::{encode, fixtures, Change, ObjectJson};
    use kubesink_core::{Op, Resource as Res};
    use opentelemetry_proto::tonic::common::v1::KeyValue;
    use std::sync::Arc;

    fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Any> {
        attrs
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn an_occurrence_is_the_record_k8s_events_writes_plus_the_messages_fields() {
        let resource = Arc::new(
            Res::new("prod", "events.k8s.io", "v1", "Event", "events", true).with_events(true),
        );
        let event = serde_json::json!({"reason": "BackOff", "type": "Warning",
            "note": "Back-off restarting failed container", "action": "Starting",
            "regarding": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "p-uid",
                "apiVersion": "v1", "resourceVersion": "41", "fieldPath": "spec.containers{app}"},
            "reportingController": "kubelet", "reportingInstance": "node-1", "count": 8,
            "firstTime": "2026-12-07T10:00:00Z", "lastTime": "2026-12-07T10:05:00.5Z"});
        let change = Change {
            uid: "e-uid".into(),
            occurrences: Some(3),
            ..fixtures::change(
                Op::Updated,
                Some("shop"),
                "web-1.18c2a",
                Some(ObjectJson::from_value(&event)),
            )
        };
        let m = encode(&resource, &change, "2026-12-07T10:05:01.000Z").unwrap();
        let (res, rec) = event_record(&m).unwrap();
        let text_of = |a: Option<&Any>| match a {
            Some(Any::StringValue(s)) => s.clone(),
            other => panic!("not a string: {other:?}"),
        };
        for (key, want) in [
            ("k8s.cluster.name", "prod"),
            ("k8s.node.name", "node-1"),
            ("k8s.object.kind", "Pod"),
            ("k8s.object.name", "web-1"),
            ("k8s.object.uid", "p-uid"),
            ("k8s.object.fieldpath", "spec.containers{app}"),
            ("k8s.object.api_version", "v1"),
            ("k8s.object.resource_version", "41"),
        ] {
            assert_eq!(text_of(attr(&res.attributes, key)), want, "{key}");
        }
        for (key, want) in [
            ("k8s.event.reason", "BackOff"),
            ("k8s.event.action", "Starting"),
            ("k8s.event.start_time", "2026-12-07T10:00:00Z"),
            ("k8s.event.name", "web-1.18c2a"),
            ("k8s.event.uid", "e-uid"),
            ("k8s.namespace.name", "shop"),
            ("kubesink.op", "updated"),
        ] {
            assert_eq!(text_of(attr(&rec.attributes, key)), want, "{key}");
        }
        assert_eq!(
            attr(&rec.attributes, "k8s.event.count"),
            Some(&Any::IntValue(8))
        );
        assert_eq!(
            attr(&rec.attributes, "kubesink.occurrences"),
            Some(&Any::IntValue(3))
        );
        assert!(attr(&rec.attributes, "kubesink.event").is_some());
        assert_eq!(rec.severity_number, SeverityNumber::Warn as i32);
        assert_eq!(rec.severity_text, "Warning");
        assert_eq!(rec.body, Some(text("Back-off restarting failed container")));
        assert_eq!(rec.time_unix_nano, nanos("2026-12-07T10:05:00.5Z"));
        assert!(rec.time_unix_nano > 0);
        assert_eq!(rec.observed_time_unix_nano, nanos("2026-12-07T10:05:01Z"));
    }
}
