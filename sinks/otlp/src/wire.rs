//! A topology message's log record as protobuf bytes, written straight from the payload's
//! JSON: the bytes prost writes for [`crate::record::log_record`]'s `LogRecord` (the unit
//! tests compare them on every op, on real Pods and on every JSON shape), without the tree
//! of `AnyValue`s.
//!
//! Protobuf frames a nested message with its length, so a writer needs each map's and
//! array's encoded length before its content. The payload is parsed once into a flat tape
//! of its values, strings borrowed from the payload where they have no escapes; each
//! container's length is known when its parse ends and is kept in its node; the tape is then
//! written in order. What this saves against the tree: an allocation per key, string, map
//! and array, and prost's length walks, which visit a nested map once per level above it
//! (`encoded_len` of a message sums its fields' `encoded_len`s, recursively, at each level).

use std::borrow::Cow;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use kubesink_core::Message;

use crate::record::{body_type, observed_nanos, FIELD_PREFIX};

/// Field numbers (opentelemetry-proto's `common/v1/common.proto`, `logs/v1/logs.proto` and
/// `collector/logs/v1/logs_service.proto`).
pub(crate) mod field {
    /// `AnyValue.string_value`, `.bool_value`, `.int_value`, `.double_value`,
    /// `.array_value`, `.kvlist_value`.
    pub const STRING: u32 = 1;
    pub const BOOL: u32 = 2;
    pub const INT: u32 = 3;
    pub const DOUBLE: u32 = 4;
    pub const ARRAY: u32 = 5;
    pub const KVLIST: u32 = 6;
    /// `ArrayValue.values` and `KeyValueList.values`.
    pub const VALUES: u32 = 1;
    /// `KeyValue.key` and `KeyValue.value`.
    pub const KEY: u32 = 1;
    pub const VALUE: u32 = 2;
    /// `LogRecord.body`, `.attributes`, `.observed_time_unix_nano`.
    pub const BODY: u32 = 5;
    pub const ATTRIBUTES: u32 = 6;
    pub const OBSERVED_TIME: u32 = 11;
    /// `ExportLogsServiceRequest.resource_logs`; `ResourceLogs.resource` and `.scope_logs`;
    /// `ScopeLogs.scope` and `.log_records` (the sink frames its requests with them).
    pub const RESOURCE_LOGS: u32 = 1;
    pub const RESOURCE: u32 = 1;
    pub const SCOPE_LOGS: u32 = 2;
    pub const SCOPE: u32 = 1;
    pub const LOG_RECORDS: u32 = 2;
}

/// One value of the payload on the tape, in document order.
enum Node<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(Cow<'a, str>),
    /// An array: its `ArrayValue`'s encoded length, then its `count` values.
    Array {
        len: usize,
        count: usize,
    },
    /// An object: its `KeyValueList`'s encoded length, then `count` pairs of a `Key` and a
    /// value.
    Map {
        len: usize,
        count: usize,
    },
    /// The key of the pair whose value follows.
    Key(Cow<'a, str>),
}

/// The bytes a length-delimited field of `len` bytes takes (a field number below 16).
pub(crate) fn framed(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// Writes the key and length of a length-delimited field of `len` bytes.
pub(crate) fn frame(out: &mut Vec<u8>, field: u32, len: usize) {
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
}

/// A `KeyValue`'s key's encoded length (none when empty: proto3 leaves an empty string out).
fn key_len(key: &str) -> usize {
    if key.is_empty() {
        0
    } else {
        framed(key.len())
    }
}

/// A `KeyValue`'s encoded length: its key and its value's `AnyValue` of `value_len` bytes.
fn kv_len(key: &str, value_len: usize) -> usize {
    key_len(key) + framed(value_len)
}

/// A string `AnyValue`'s encoded length.
fn string_len(s: &str) -> usize {
    framed(s.len())
}

impl Node<'_> {
    /// The encoded length of the `AnyValue` this node starts.
    fn any_len(&self) -> usize {
        match self {
            Node::Null | Node::Key(_) => 0,
            Node::Bool(_) => 2,
            Node::Int(i) => 1 + encoded_len_varint(*i as u64),
            Node::Double(_) => 9,
            Node::Str(s) => string_len(s),
            Node::Array { len, .. } | Node::Map { len, .. } => framed(*len),
        }
    }
}

/// Parses one JSON value onto the tape; its value is the `AnyValue`'s encoded length. The
/// numbers as [`crate::record`] maps them: whole and within `i64` an `int_value`, otherwise a
/// `double_value`.
struct Value<'t, 'a>(&'t mut Vec<Node<'a>>);

impl<'t, 'de> Value<'t, 'de> {
    fn push(self, node: Node<'de>) -> usize {
        let len = node.any_len();
        self.0.push(node);
        len
    }
}

impl<'de> DeserializeSeed<'de> for Value<'_, 'de> {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Value<'_, 'de> {
    type Value = usize;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<usize, E> {
        Ok(self.push(Node::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<usize, E> {
        Ok(self.push(Node::Int(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<usize, E> {
        Ok(self.push(match i64::try_from(v) {
            Ok(i) => Node::Int(i),
            Err(_) => Node::Double(v as f64),
        }))
    }

    fn visit_f64<E>(self, v: f64) -> Result<usize, E> {
        Ok(self.push(Node::Double(v)))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<usize, E> {
        Ok(self.push(Node::Str(Cow::Borrowed(v))))
    }

    fn visit_str<E>(self, v: &str) -> Result<usize, E> {
        Ok(self.push(Node::Str(Cow::Owned(v.to_owned()))))
    }

    fn visit_string<E>(self, v: String) -> Result<usize, E> {
        Ok(self.push(Node::Str(Cow::Owned(v))))
    }

    fn visit_unit<E>(self) -> Result<usize, E> {
        Ok(self.push(Node::Null))
    }

    fn visit_none<E>(self) -> Result<usize, E> {
        Ok(self.push(Node::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let tape = self.0;
        let at = tape.len();
        tape.push(Node::Array { len: 0, count: 0 });
        let (mut len, mut count) = (0, 0);
        while let Some(n) = seq.next_element_seed(Value(&mut *tape))? {
            len += framed(n);
            count += 1;
        }
        tape[at] = Node::Array { len, count };
        Ok(framed(len))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let tape = self.0;
        let at = tape.len();
        tape.push(Node::Map { len: 0, count: 0 });
        let (mut len, mut count) = (0, 0);
        while let Some(key) = map.next_key_seed(Key)? {
            let k = key_len(&key);
            tape.push(Node::Key(key));
            let n = map.next_value_seed(Value(&mut *tape))?;
            len += framed(k + framed(n));
            count += 1;
        }
        tape[at] = Node::Map { len, count };
        Ok(framed(len))
    }
}

/// A map's key, borrowed from the payload when it has no escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

/// The payload's top-level fields: each key, where its value starts on the tape, and its
/// `AnyValue`'s encoded length.
struct Top<'t, 'a>(&'t mut Vec<Node<'a>>);

impl<'de> Visitor<'de> for Top<'_, 'de> {
    type Value = Vec<(Cow<'de, str>, usize, usize)>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let tape = self.0;
        let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(16));
        while let Some(key) = map.next_key_seed(Key)? {
            let at = tape.len();
            let len = map.next_value_seed(Value(&mut *tape))?;
            fields.push((key, at, len));
        }
        Ok(fields)
    }
}

/// Writes the `AnyValue` starting at `tape[*i]` and moves `i` past it.
fn write_any(tape: &[Node<'_>], i: &mut usize, out: &mut Vec<u8>) {
    let Some(node) = tape.get(*i) else { return };
    *i += 1;
    match node {
        Node::Null | Node::Key(_) => {}
        Node::Bool(b) => {
            encode_key(field::BOOL, WireType::Varint, out);
            encode_varint(u64::from(*b), out);
        }
        Node::Int(v) => {
            encode_key(field::INT, WireType::Varint, out);
            encode_varint(*v as u64, out);
        }
        Node::Double(d) => {
            encode_key(field::DOUBLE, WireType::SixtyFourBit, out);
            out.extend_from_slice(&d.to_le_bytes());
        }
        Node::Str(s) => write_string(out, s),
        Node::Array { len, count } => {
            frame(out, field::ARRAY, *len);
            for _ in 0..*count {
                let n = tape.get(*i).map_or(0, Node::any_len);
                frame(out, field::VALUES, n);
                write_any(tape, i, out);
            }
        }
        Node::Map { len, count } => {
            frame(out, field::KVLIST, *len);
            for _ in 0..*count {
                // The tape holds a `Key` before each value of a map (`Value::visit_map`).
                let key = match tape.get(*i) {
                    Some(Node::Key(k)) => {
                        *i += 1;
                        k.as_ref()
                    }
                    _ => "",
                };
                let n = tape.get(*i).map_or(0, Node::any_len);
                frame(out, field::VALUES, kv_len(key, n));
                write_pair(out, key, n, |out| write_any(tape, i, out));
            }
        }
    }
}

/// A string `AnyValue`'s content.
fn write_string(out: &mut Vec<u8>, s: &str) {
    frame(out, field::STRING, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// A `KeyValue`'s content: `key`, then the value's `AnyValue` of `n` bytes written by
/// `value`.
fn write_pair(out: &mut Vec<u8>, key: &str, n: usize, value: impl FnOnce(&mut Vec<u8>)) {
    if !key.is_empty() {
        frame(out, field::KEY, key.len());
        out.extend_from_slice(key.as_bytes());
    }
    frame(out, field::VALUE, n);
    value(out);
}

/// An attribute's value: a string of kubesink's own, or a payload field's value on the tape.
enum Attr<'s> {
    Text(&'s str),
    Tape { at: usize, len: usize },
}

/// The protobuf bytes of `m`'s `LogRecord` ([`crate::record`]'s mapping), written straight
/// from the payload.
///
/// # Errors
/// The payload is not a JSON object (never, for a message kubesink encoded).
pub fn encoded_log_record(m: &Message) -> Result<Vec<u8>, serde_json::Error> {
    let meta = &*m.meta;
    let mut tape = Vec::with_capacity(m.payload.len() / 16);
    let mut de = serde_json::Deserializer::from_slice(&m.payload);
    let mut fields = de.deserialize_map(Top(&mut tape))?;
    de.end()?;
    // A null field is left out, as the typed record leaves out an empty value.
    fields.retain(|(_, at, _)| !matches!(tape.get(*at), Some(Node::Null) | None));

    let kind = body_type(meta.op.as_str());
    let object = fields
        .iter()
        .find(|(k, _, _)| k == "object")
        .map(|&(_, at, len)| (at, len));
    let mut body = framed(kv_len("type", string_len(kind)));
    if let Some((_, len)) = object {
        body += framed(kv_len("object", len));
    }

    let mut attributes: Vec<(Cow<'_, str>, Attr<'_>)> = Vec::with_capacity(fields.len() + 3);
    attributes.push((
        Cow::Borrowed("k8s.resource.name"),
        Attr::Text(&meta.resource.plural),
    ));
    if !meta.name.is_empty() {
        attributes.push((Cow::Borrowed("event.domain"), Attr::Text("k8s")));
        attributes.push((Cow::Borrowed("event.name"), Attr::Text(&meta.name)));
    }
    for (key, at, len) in &fields {
        if key == "object" {
            continue;
        }
        attributes.push((
            Cow::Owned(format!("{FIELD_PREFIX}{key}")),
            Attr::Tape { at: *at, len: *len },
        ));
    }
    let attr_len = |a: &Attr<'_>| match a {
        Attr::Text(s) => string_len(s),
        Attr::Tape { len, .. } => *len,
    };

    let observed = observed_nanos(meta);
    let total = framed(framed(body))
        + attributes
            .iter()
            .map(|(k, a)| framed(kv_len(k, attr_len(a))))
            .sum::<usize>()
        + if observed == 0 { 0 } else { 2 + 8 };
    let mut out = Vec::with_capacity(total);

    // Fields in tag order, as prost writes them: body (5), attributes (6), observed (11).
    frame(&mut out, field::BODY, framed(body));
    frame(&mut out, field::KVLIST, body);
    frame(&mut out, field::VALUES, kv_len("type", string_len(kind)));
    write_pair(&mut out, "type", string_len(kind), |out| {
        write_string(out, kind)
    });
    if let Some((at, len)) = object {
        frame(&mut out, field::VALUES, kv_len("object", len));
        write_pair(&mut out, "object", len, |out| {
            write_any(&tape, &mut { at }, out)
        });
    }
    for (key, a) in &attributes {
        let n = attr_len(a);
        frame(&mut out, field::ATTRIBUTES, kv_len(key, n));
        write_pair(&mut out, key, n, |out| match a {
            Attr::Text(s) => write_string(out, s),
            Attr::Tape { at, .. } => write_any(&tape, &mut { *at }, out),
        });
    }
    if observed != 0 {
        encode_key(field::OBSERVED_TIME, WireType::SixtyFourBit, &mut out);
        out.extend_from_slice(&observed.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubesink_core::message::fixtures::deployment_message;
    use kubesink_core::message::Op;
    use prost::Message as _;

    fn with_payload(op: Op, payload: &str) -> Message {
        let mut m = deployment_message(op);
        m.payload = bytes::Bytes::from(payload.to_owned());
        m
    }

    fn same(m: &Message) {
        let prost = crate::record::log_record(m).map(|r| r.encode_to_vec());
        let direct = encoded_log_record(m);
        match (prost, direct) {
            (Ok(p), Ok(d)) => assert!(
                p == d,
                "payload {}:\nprost  {p:02x?}\ndirect {d:02x?}",
                String::from_utf8_lossy(&m.payload)
            ),
            (Err(_), Err(_)) => {}
            (p, d) => panic!("one refused, the other not: {p:?} {d:?}"),
        }
    }

    #[test]
    fn every_op_of_the_fixture_is_the_bytes_prost_writes() {
        for op in [Op::Added, Op::Updated, Op::Deleted, Op::Synced] {
            same(&deployment_message(op));
        }
    }

    #[test]
    fn every_json_shape_is_the_bytes_prost_writes() {
        for object in [
            r#"{}"#,
            r#"{"a":null,"b":true,"c":false,"d":0,"e":-1,"f":9223372036854775807,"g":9223372036854775808,"h":18446744073709551615,"i":-9223372036854775808,"j":1.5,"k":-0.0,"l":1e300}"#,
            r#"{"":"empty key","s":"","t":"é \"quoted\" \u00e9 \n","u":[],"v":{},"w":[null,[],{},[[1]],{"x":{"y":{"z":[true]}}}]}"#,
            r#"{"long":"0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"}"#,
        ] {
            for op in [Op::Added, Op::Updated] {
                let payload = format!(
                    r#"{{"op":"{}","cluster":"prod","object":{object},"nothing":null,"changed":["spec","status"],"n":3,"observedAt":"2026-11-30T10:00:00.123Z"}}"#,
                    op.as_str()
                );
                same(&with_payload(op, &payload));
            }
        }
        // No object, no observedAt, a top-level null object, an empty name.
        same(&with_payload(
            Op::Deleted,
            r#"{"op":"deleted","object":null,"key":"web/api"}"#,
        ));
        let mut m = with_payload(Op::Synced, r#"{"op":"synced"}"#);
        std::sync::Arc::make_mut(&mut m.meta).name = "".into();
        same(&m);
        // Not an object: both refuse.
        same(&with_payload(Op::Added, "[1]"));
        same(&with_payload(Op::Added, r#"{"a":1} x"#));
    }

    #[test]
    fn real_pods_are_the_bytes_prost_writes() {
        for v in ["v1-36", "v1-37"] {
            let path = format!(
                "{}/../../tests/fixtures/k8s-replays/{v}/pod-list.json",
                env!("CARGO_MANIFEST_DIR")
            );
            let Ok(text) = std::fs::read_to_string(&path) else {
                panic!("{path} is part of the tree")
            };
            // A recording: the exchanges' response bodies hold the PodList.
            let exchanges: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let body = exchanges[0]["response_body"].as_str().unwrap_or_default();
            let list: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            let items = list["items"].as_array().cloned().unwrap_or_default();
            assert!(!items.is_empty(), "{path} holds Pods");
            for pod in items {
                let payload = serde_json::json!({"op": "added", "cluster": "prod", "object": pod});
                same(&with_payload(Op::Added, &payload.to_string()));
            }
        }
    }
}
