//! Protobuf on the wire for metadata-only watches: the API server's
//! `application/vnd.kubernetes.protobuf` encoding of `PartialObjectMetadata`, read and turned
//! into the JSON the rest of the informer reads, so nothing downstream knows which encoding
//! crossed the wire.
//!
//! Why: the API server spends far less CPU encoding protobuf than JSON (BENCHMARKS.md: 4.04 s
//! for client-go's protobuf metadata informer's sync of 100,000 Pods against 10.57 s for the
//! same stream in JSON), and it is what client-go's metadata client asks for
//! (`k8s.io/client-go/metadata`). Only `PartialObjectMetadata` is read this way: every
//! resource, built-in or custom, is served as it in protobuf, and its shape is one small fixed
//! message (`ObjectMeta`). A whole object is not: a custom resource has no protobuf form, and
//! a built-in one would have to be written back as the JSON the server writes, field by field
//! in Go's struct order, for every kind; CBOR (KEP-4222), the other binary encoding, is alpha
//! and off by default in Kubernetes 1.37 (`CBORServingAndStorage`), and sorts every map's keys
//! (`k8s.io/apimachinery/pkg/runtime/serializer/cbor/internal/modes`, `SortBytewiseLexical`),
//! so struct order is lost. `docs/architecture.md` ("Wire encoding") has the measurements.
//!
//! The wire format, from `k8s.io/apimachinery` v0.37 (`pkg/runtime/serializer/protobuf`,
//! `pkg/apis/meta/v1/generated.proto`, `pkg/runtime/generated.proto`):
//! - a list body is the 4 bytes `k8s\0`, then a `runtime.Unknown` whose `raw` is the
//!   `PartialObjectMetadataList` message;
//! - a watch body is frames, each a 4-byte big-endian length and a `metav1.WatchEvent`
//!   message (the stream's raw serializer: no `k8s\0`, no `Unknown`), whose `object.raw` is
//!   an embedded object in the envelope above: `PartialObjectMetadata` for ADDED, MODIFIED,
//!   DELETED and BOOKMARK, `Status` for ERROR;
//! - an error response is a `Status` in the envelope.
//!
//! The JSON written is what the server would have sent, less `metadata.managedFields`, which
//! kubesink never reads (`object.rs`) and which is often half of an object's metadata: the
//! message types here leave its field out, so protobuf skips it without building it.
//! Timestamps are whole seconds, as the server's JSON writes them (`metav1.Time` keeps no
//! fraction either way). Fields a newer server adds to `ObjectMeta` are skipped (protobuf
//! ignores unknown fields); the informer reads none that are not here.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message;
use serde::Serialize;

use super::decode::{DecodeError, Status};

/// The protobuf media type of the Kubernetes API.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The `Accept` of a metadata-only list: protobuf first, then the JSON that kube's
/// `list_metadata` asks for, then plain JSON (client-go's metadata client asks the same,
/// `k8s.io/client-go/metadata/metadata.go`). A server that cannot encode protobuf for the
/// resource (an aggregated API server) answers JSON instead, and the response's
/// `Content-Type` says which came.
pub const ACCEPT_LIST: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// The `Accept` of a metadata-only watch (and streaming list), as [`ACCEPT_LIST`].
pub const ACCEPT_WATCH: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

/// The 4 bytes before every protobuf-encoded object (`protoEncodingPrefix`).
const MAGIC: &[u8] = b"k8s\0";

/// Whether a response's `Content-Type` is protobuf.
pub fn is_protobuf(content_type: Option<&http::HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with(PROTOBUF))
}

/// `runtime.Unknown`: the envelope of an encoded object.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "bytes", tag = "2")]
    raw: Bytes,
}

/// `runtime.TypeMeta`.
#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, tag = "1")]
    api_version: String,
    #[prost(string, tag = "2")]
    kind: String,
}

/// `metav1.WatchEvent`.
#[derive(Clone, PartialEq, Message)]
struct WatchEvent {
    #[prost(string, tag = "1")]
    r#type: String,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

/// `runtime.RawExtension`.
#[derive(Clone, PartialEq, Message)]
struct RawExtension {
    #[prost(bytes = "bytes", tag = "1")]
    raw: Bytes,
}

/// `metav1.PartialObjectMetadataList`.
#[derive(Clone, PartialEq, Message)]
struct PartialObjectMetadataList {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ListMeta>,
    #[prost(message, repeated, tag = "2")]
    items: Vec<PartialObjectMetadata>,
}

/// `metav1.PartialObjectMetadata`.
#[derive(Clone, PartialEq, Message)]
struct PartialObjectMetadata {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

/// `metav1.ListMeta`, as the server's JSON writes it (`omitempty` throughout).
#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    self_link: String,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "String::is_empty")]
    resource_version: String,
    #[prost(string, tag = "3")]
    #[serde(rename = "continue", skip_serializing_if = "String::is_empty")]
    continue_token: String,
    #[prost(int64, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining_item_count: Option<i64>,
}

/// `metav1.ObjectMeta` without `managedFields` (tag 17, skipped unread), as the server's
/// JSON writes it: the fields in Go's struct order, `omitempty` (and `omitzero` for
/// `creationTimestamp`) as its tags say.
#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectMeta {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "String::is_empty")]
    generate_name: String,
    #[prost(string, tag = "3")]
    #[serde(skip_serializing_if = "String::is_empty")]
    namespace: String,
    #[prost(string, tag = "4")]
    #[serde(skip_serializing_if = "String::is_empty")]
    self_link: String,
    #[prost(string, tag = "5")]
    #[serde(skip_serializing_if = "String::is_empty")]
    uid: String,
    #[prost(string, tag = "6")]
    #[serde(skip_serializing_if = "String::is_empty")]
    resource_version: String,
    #[prost(int64, tag = "7")]
    #[serde(skip_serializing_if = "is_zero")]
    generation: i64,
    #[prost(message, optional, tag = "8")]
    #[serde(skip_serializing_if = "Time::absent")]
    creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    #[serde(skip_serializing_if = "Option::is_none")]
    deletion_timestamp: Option<Time>,
    #[prost(int64, optional, tag = "10")]
    #[serde(skip_serializing_if = "Option::is_none")]
    deletion_grace_period_seconds: Option<i64>,
    #[prost(btree_map = "string, string", tag = "11")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    finalizers: Vec<String>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// `metav1.OwnerReference`: the first four fields always written, the flags when set.
#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct OwnerReference {
    #[prost(string, tag = "5")]
    api_version: String,
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, tag = "4")]
    uid: String,
    #[prost(bool, optional, tag = "6")]
    #[serde(skip_serializing_if = "Option::is_none")]
    controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    #[serde(skip_serializing_if = "Option::is_none")]
    block_owner_deletion: Option<bool>,
}

/// `metav1.Time`: whole seconds since the Unix epoch (the nanoseconds are ignored, as
/// `metav1.Time.Unmarshal` ignores them). Written as RFC 3339 in UTC (`2006-01-02T15:04:05Z`),
/// or `null` when zero, as `metav1.Time.MarshalJSON` writes it.
#[derive(Clone, PartialEq, Message)]
struct Time {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

impl Time {
    /// Go's `IsZero` of what `metav1.Time.Unmarshal` makes of it: an empty message (and the
    /// epoch itself, which Go encodes as one) is the zero time.
    fn is_zero(&self) -> bool {
        self.seconds == 0
    }

    /// Left out of the JSON (`creationTimestamp` is `omitzero`).
    fn absent(t: &Option<Time>) -> bool {
        t.as_ref().is_none_or(Time::is_zero)
    }
}

impl Serialize for Time {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_zero() {
            return s.serialize_none();
        }
        match jiff::Timestamp::from_second(self.seconds) {
            Ok(t) => s.collect_str(&t.strftime("%Y-%m-%dT%H:%M:%SZ")),
            Err(e) => Err(serde::ser::Error::custom(format!(
                "timestamp {} s out of range: {e}",
                self.seconds
            ))),
        }
    }
}

/// `metav1.Status`: what an `ERROR` event or an error response carries.
#[derive(Clone, PartialEq, Message)]
struct StatusMessage {
    #[prost(string, tag = "2")]
    status: String,
    #[prost(string, tag = "3")]
    message: String,
    #[prost(string, tag = "4")]
    reason: String,
    #[prost(int32, tag = "6")]
    code: i32,
}

/// A `PartialObjectMetadata` as the server's JSON writes it.
#[derive(Serialize)]
struct PartialJson<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: &'a ObjectMeta,
}

impl<'a> PartialJson<'a> {
    fn of(meta: &'a ObjectMeta) -> Self {
        PartialJson {
            kind: "PartialObjectMetadata",
            api_version: "meta.k8s.io/v1",
            metadata: meta,
        }
    }
}

/// A `Status` as the server's JSON writes it (the fields the informer reads).
#[derive(Serialize)]
struct StatusJson<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: serde_json::Map<String, serde_json::Value>,
    #[serde(skip_serializing_if = "str::is_empty")]
    status: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "is_zero_i32")]
    code: i32,
}

fn is_zero_i32(n: &i32) -> bool {
    *n == 0
}

/// The error of bytes that do not decode as `what`.
fn error(what: &'static str, reason: &dyn std::fmt::Display, bytes: &[u8]) -> DecodeError {
    DecodeError::new(what, format!("protobuf: {reason}"), bytes)
}

/// Opens the `k8s\0` envelope: the object's kind and message bytes.
fn unwrap_envelope(what: &'static str, bytes: &[u8]) -> Result<(String, Bytes), DecodeError> {
    let Some(inner) = bytes.strip_prefix(MAGIC) else {
        return Err(error(what, &"no k8s\\0 prefix", bytes));
    };
    let unknown = Unknown::decode(inner).map_err(|e| error(what, &e, bytes))?;
    let kind = unknown.type_meta.map(|t| t.kind).unwrap_or_default();
    Ok((kind, unknown.raw))
}

/// A list response body (`PartialObjectMetadataList` in its envelope) as the JSON list the
/// server would have sent (`decode::ListPage` reads it).
///
/// # Errors
/// [`DecodeError`] (`list page`) when the body is not that message.
pub fn list_to_json(body: &[u8]) -> Result<Vec<u8>, DecodeError> {
    const WHAT: &str = "list page";
    let (kind, raw) = unwrap_envelope(WHAT, body)?;
    if kind != "PartialObjectMetadataList" {
        return Err(error(
            WHAT,
            &format!("a {kind:?} where a PartialObjectMetadataList was asked for"),
            body,
        ));
    }
    let list = PartialObjectMetadataList::decode(raw).map_err(|e| error(WHAT, &e, body))?;
    #[derive(Serialize)]
    struct ListJson<'a> {
        kind: &'static str,
        #[serde(rename = "apiVersion")]
        api_version: &'static str,
        metadata: &'a ListMeta,
        items: Vec<PartialJson<'a>>,
    }
    let empty_list = ListMeta::default();
    let empty_meta = ObjectMeta::default();
    let json = ListJson {
        kind: "PartialObjectMetadataList",
        api_version: "meta.k8s.io/v1",
        metadata: list.metadata.as_ref().unwrap_or(&empty_list),
        items: list
            .items
            .iter()
            .map(|i| PartialJson::of(i.metadata.as_ref().unwrap_or(&empty_meta)))
            .collect(),
    };
    serde_json::to_vec(&json).map_err(|e| error(WHAT, &e, body))
}

/// One watch frame (a `WatchEvent` message, the length already taken off) as the JSON event
/// line the server would have sent (`decode::watch_line` reads it).
///
/// # Errors
/// [`DecodeError`] (`watch event`) when the frame is not a `WatchEvent`, or its object is
/// neither a `PartialObjectMetadata` nor (for `ERROR`) a `Status`.
pub fn event_to_json(frame: &[u8]) -> Result<Vec<u8>, DecodeError> {
    const WHAT: &str = "watch event";
    let event = WatchEvent::decode(frame).map_err(|e| error(WHAT, &e, frame))?;
    let raw = event.object.map(|o| o.raw).unwrap_or_default();
    let (kind, message) = unwrap_envelope(WHAT, &raw)?;
    let mut out = Vec::with_capacity(raw.len() + 96);
    out.extend_from_slice(b"{\"type\":");
    serde_json::to_writer(&mut out, &event.r#type).map_err(|e| error(WHAT, &e, frame))?;
    out.extend_from_slice(b",\"object\":");
    match kind.as_str() {
        "PartialObjectMetadata" => {
            let object =
                PartialObjectMetadata::decode(message).map_err(|e| error(WHAT, &e, frame))?;
            let meta = object.metadata.unwrap_or_default();
            serde_json::to_writer(&mut out, &PartialJson::of(&meta))
        }
        "Status" => {
            let s = StatusMessage::decode(message).map_err(|e| error(WHAT, &e, frame))?;
            serde_json::to_writer(&mut out, &status_json(&s))
        }
        other => {
            return Err(error(
                WHAT,
                &format!("a {other:?} in a watch of PartialObjectMetadata"),
                frame,
            ))
        }
    }
    .map_err(|e| error(WHAT, &e, frame))?;
    out.push(b'}');
    Ok(out)
}

fn status_json(s: &StatusMessage) -> StatusJson<'_> {
    StatusJson {
        kind: "Status",
        api_version: "v1",
        metadata: serde_json::Map::new(),
        status: &s.status,
        message: &s.message,
        reason: &s.reason,
        code: s.code,
    }
}

/// An error response body in protobuf: its `Status`, `None` when it is not one.
pub fn status(body: &[u8]) -> Option<Status> {
    let (kind, raw) = unwrap_envelope("status", body).ok()?;
    if kind != "Status" {
        return None;
    }
    let s = StatusMessage::decode(raw).ok()?;
    Some(Status {
        code: u16::try_from(s.code).unwrap_or_default(),
        reason: s.reason,
        message: s.message,
    })
}

/// The length of the frame at the start of `buf` (its 4-byte big-endian prefix), `None` while
/// fewer than 4 bytes are there.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    let prefix: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(prefix)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(kind: &str, api_version: &str, message: &impl Message) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: api_version.into(),
                kind: kind.into(),
            }),
            raw: message.encode_to_vec().into(),
        };
        [MAGIC, &unknown.encode_to_vec()].concat()
    }

    fn meta() -> ObjectMeta {
        ObjectMeta {
            name: "web-0".into(),
            namespace: "shop".into(),
            uid: "u-1".into(),
            resource_version: "42".into(),
            generation: 3,
            creation_timestamp: Some(Time {
                seconds: 1_765_000_000,
                nanos: 5,
            }),
            labels: [("b".into(), "2".into()), ("a".into(), "<&>".into())].into(),
            owner_references: vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "StatefulSet".into(),
                name: "web".into(),
                uid: "u-0".into(),
                controller: Some(true),
                block_owner_deletion: Some(false),
            }],
            finalizers: vec!["f".into()],
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_watch_frame_reads_as_the_json_line_the_server_writes() {
        let object = PartialObjectMetadata {
            metadata: Some(meta()),
        };
        let event = WatchEvent {
            r#type: "MODIFIED".into(),
            object: Some(RawExtension {
                raw: envelope("PartialObjectMetadata", "meta.k8s.io/v1", &object).into(),
            }),
        };
        let line = event_to_json(&event.encode_to_vec()).unwrap();
        let want = r#"{"type":"MODIFIED","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"web-0","namespace":"shop","uid":"u-1","resourceVersion":"42","generation":3,"creationTimestamp":"2025-12-06T05:46:40Z","labels":{"a":"<&>","b":"2"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"StatefulSet","name":"web","uid":"u-0","controller":true,"blockOwnerDeletion":false}],"finalizers":["f"]}}}"#;
        assert_eq!(String::from_utf8(line).unwrap(), want);
    }

    #[test]
    fn an_error_event_and_an_error_response_read_as_their_status() {
        let s = StatusMessage {
            status: "Failure".into(),
            message: "too old resource version: 1 (5)".into(),
            reason: "Expired".into(),
            code: 410,
        };
        let event = WatchEvent {
            r#type: "ERROR".into(),
            object: Some(RawExtension {
                raw: envelope("Status", "v1", &s).into(),
            }),
        };
        let line = event_to_json(&event.encode_to_vec()).unwrap();
        match super::super::decode::watch_line(&line).unwrap() {
            super::super::decode::WatchLine::Error(st) => {
                assert_eq!((st.code, st.reason.as_str()), (410, "Expired"))
            }
            other => panic!("{other:?}"),
        }
        let st = status(&envelope("Status", "v1", &s)).unwrap();
        assert_eq!(st.message, "too old resource version: 1 (5)");
        assert!(status(b"{\"kind\":\"Status\"}").is_none());
    }

    #[test]
    fn a_list_reads_as_the_json_list_and_a_bookmark_keeps_only_its_version() {
        let list = PartialObjectMetadataList {
            metadata: Some(ListMeta {
                resource_version: "77".into(),
                continue_token: "abc".into(),
                remaining_item_count: Some(5),
                ..ListMeta::default()
            }),
            items: vec![PartialObjectMetadata {
                metadata: Some(meta()),
            }],
        };
        let json = list_to_json(&envelope(
            "PartialObjectMetadataList",
            "meta.k8s.io/v1",
            &list,
        ))
        .unwrap();
        let page: super::super::decode::ListPage<'_> = serde_json::from_slice(&json).unwrap();
        assert_eq!(page.metadata.next_page(), Some("abc"));
        assert_eq!(page.items.len(), 1);
        let bookmark = PartialObjectMetadata {
            metadata: Some(ObjectMeta {
                resource_version: "99".into(),
                creation_timestamp: Some(Time::default()),
                annotations: [("k8s.io/initial-events-end".into(), "true".into())].into(),
                ..ObjectMeta::default()
            }),
        };
        let event = WatchEvent {
            r#type: "BOOKMARK".into(),
            object: Some(RawExtension {
                raw: envelope("PartialObjectMetadata", "meta.k8s.io/v1", &bookmark).into(),
            }),
        };
        let line = event_to_json(&event.encode_to_vec()).unwrap();
        assert_eq!(
            String::from_utf8(line.clone()).unwrap(),
            r#"{"type":"BOOKMARK","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"99","annotations":{"k8s.io/initial-events-end":"true"}}}}"#
        );
    }

    #[test]
    fn damaged_bytes_are_decode_errors_not_panics() {
        for bytes in [&b""[..], b"\xff\xff\xff", b"k8s\0\xff", b"k8s"] {
            assert!(list_to_json(bytes).is_err());
            let _ = event_to_json(bytes);
        }
        let wrong = envelope("Pod", "v1", &PartialObjectMetadata::default());
        let err = list_to_json(&wrong).unwrap_err().to_string();
        assert!(err.contains("\"Pod\""), "{err}");
        assert_eq!(frame_len(&[0, 0, 1, 2, 9]), Some(258));
        assert_eq!(frame_len(&[0, 0]), None);
    }
}
