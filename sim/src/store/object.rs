//! One stored object: its serialized JSON bytes, its `metadata` bytes (for
//! `PartialObjectMetadata` answers) and the parsed fields lists and selectors need. Objects are
//! immutable once built; a write builds a new one. Never holds a `serde_json::Value` tree.

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
    /// `metadata.resourceVersion` as a number.
    pub rv: u64,
}

impl StoredObject {
    /// Serializes `obj` (which must have server fields already set) into a stored object.
    pub fn from_value(obj: &Value, rv: u64) -> Result<Self, StoreError> {
        let meta = obj.get("metadata").ok_or(StoreError::MissingMetadata)?;
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
        Ok(StoredObject {
            body,
            metadata,
            namespace: text("namespace"),
            name: text("name"),
            uid: text("uid"),
            labels,
            rv,
        })
    }

    /// Parses the stored body back into a JSON value.
    pub fn to_value(&self) -> Result<Value, StoreError> {
        serde_json::from_slice(&self.body).map_err(StoreError::Serialize)
    }
}

/// Serializes `obj` compactly into exactly-sized bytes and returns them with a zero-copy
/// slice covering the `metadata` value, so metadata-only answers cost no extra memory.
fn serialize(obj: &Value) -> Result<(Bytes, Bytes), StoreError> {
    let map = obj.as_object().ok_or(StoreError::MissingMetadata)?;
    let mut out = Vec::with_capacity(4096);
    let mut range = 0..0;
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
    let metadata = body.slice(range);
    Ok((body, metadata))
}

/// The current time as RFC 3339 with seconds precision, like `creationTimestamp`.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
