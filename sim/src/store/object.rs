//! One stored object: its serialized JSON bytes, its `metadata` bytes (for
//! `PartialObjectMetadata` answers) and the parsed fields lists and selectors need. Objects are
//! immutable once built; a write builds a new one. Never holds a `serde_json::Value` tree, so
//! serving an object never recurses into it, however deep it is.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::Value;

use super::StoreError;

/// An object as stored: ~the size of its JSON, shared by `Arc` between the current state, the
/// event log and watch streams.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredObject {
    /// The whole object as compact JSON (with kind, apiVersion and server-set metadata).
    pub body: Bytes,
    /// `metadata` alone as compact JSON (a slice of `body`, sharing its memory).
    pub metadata: Bytes,
    /// `metadata.namespace`, "" for cluster-scoped objects.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// The resourceVersion of the write that stored it (`metadata.resourceVersion` in the
    /// body, unless a raw insert kept an opaque one).
    pub rv: u64,
    /// Nesting depth of `body` (see `json::depth_of_bytes`): deep objects are parsed and
    /// changed on a big stack.
    pub depth: usize,
}

impl StoredObject {
    /// Serializes `obj` (which must have server fields already set) into a stored object. A
    /// missing `metadata` (raw inserts only) reads as `{}`. Errors: `obj` is not an object.
    /// A deep `obj` must be passed inside `json::with_stack_for`.
    pub fn from_value(obj: &Value, rv: u64) -> Result<Self, StoreError> {
        let empty = Value::Object(Default::default());
        let meta = obj.get("metadata").unwrap_or(&empty);
        let text = |k: &str| {
            meta.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let labels = meta
            .get("labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let (body, metadata) = serialize(obj)?;
        let depth = crate::json::depth_of_bytes(&body);
        Ok(StoredObject {
            body,
            metadata,
            namespace: text("namespace"),
            name: text("name"),
            uid: text("uid"),
            labels,
            rv,
            depth,
        })
    }

    /// Parses the stored body back into a JSON value, with no nesting limit. A deep result
    /// must be used and dropped inside `json::with_stack_for(self.depth, …)`.
    pub fn to_value(&self) -> Result<Value, StoreError> {
        crate::json::parse_with_depth(&self.body, self.depth).map_err(StoreError::Serialize)
    }
}

/// Serializes `obj` compactly into exactly-sized bytes and returns them with a zero-copy
/// slice covering the `metadata` value, so metadata-only answers cost no extra memory.
fn serialize(obj: &Value) -> Result<(Bytes, Bytes), StoreError> {
    let map = obj.as_object().ok_or(StoreError::NotAnObject)?;
    let mut out = Vec::with_capacity(4096);
    let mut range = usize::MAX..usize::MAX;
    out.push(b'{');
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, k)?;
        out.push(b':');
        let start = out.len();
        serde_json::to_writer(&mut out, v)?;
        if k == "metadata" {
            range = start..out.len();
        }
    }
    out.push(b'}');
    // Copy so the stored allocation is exactly the JSON's size (a grown Vec may be 2x).
    let body = Bytes::copy_from_slice(&out);
    let metadata = if range.start == usize::MAX {
        Bytes::from_static(b"{}")
    } else {
        body.slice(range)
    };
    Ok((body, metadata))
}

/// The current time as RFC 3339 with seconds precision, like `creationTimestamp`.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
