//! Payload shaping: from the object the watch delivered to the object a message carries, and
//! its fingerprint.
//!
//! Order of operations (each resource's [`Shaper`]): drop `metadata.managedFields`; for a
//! core/v1 Secret without `allow_secret_data`, drop `data` and `stringData`; apply the
//! payload mode (`full`, `metadata`, `fields`) and the extra `drop` pointers; merge the
//! cluster label into `metadata.labels`. The fingerprint is then taken over the result,
//! skipping `metadata.resourceVersion`, so a change confined to dropped fields (or a relist
//! returning the same object) produces the same fingerprint and is suppressed.
//!
//! Never emits Secret data by accident: the data fields are removed before anything else
//! looks at the object.

use std::hash::Hasher;

use kube::api::DynamicObject;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::Xxh3;

use crate::config::{PayloadMode, ResourceConfig};

/// The version of shaping and fingerprinting. Saved state carries fingerprints; when this
/// changes (a shaping rule or the fingerprint's walk), saved fingerprints no longer compare
/// and the state is ignored (a full initial list): bump it with any such change.
pub const SHAPE_VERSION: u32 = 1;

/// Shapes objects of one resource.
#[derive(Clone, Debug)]
pub struct Shaper {
    mode: PayloadMode,
    fields: Vec<String>,
    drop: Vec<String>,
    strip_secret_data: bool,
    label_key: String,
    label_value: String,
    api_version: String,
    kind: String,
}

impl Shaper {
    /// A shaper for `res`, labelling objects with `label_key = label_value`.
    pub fn new(res: &ResourceConfig, label_key: &str, label_value: &str) -> Self {
        Shaper {
            mode: res.payload,
            fields: res.fields.clone(),
            drop: res.drop.clone(),
            strip_secret_data: res.api_version == "v1"
                && res.kind == "Secret"
                && !res.allow_secret_data,
            label_key: label_key.to_owned(),
            label_value: label_value.to_owned(),
            api_version: res.api_version.clone(),
            kind: res.kind.clone(),
        }
    }

    /// Turns a watched object into the emitted object.
    pub fn shape(&self, obj: DynamicObject) -> Value {
        let DynamicObject {
            types,
            mut metadata,
            data,
        } = obj;
        metadata.managed_fields = None;
        metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(self.label_key.clone(), self.label_value.clone());
        let (api_version, kind) = match types {
            Some(t) if !t.api_version.is_empty() && t.kind != "PartialObjectMetadata" => {
                (t.api_version, t.kind)
            }
            _ => (self.api_version.clone(), self.kind.clone()),
        };
        let mut out = Map::new();
        out.insert("apiVersion".into(), Value::String(api_version));
        out.insert("kind".into(), Value::String(kind));
        out.insert(
            "metadata".into(),
            serde_json::to_value(&metadata).unwrap_or_else(|_| Value::Object(Map::new())),
        );
        if self.mode != PayloadMode::Metadata {
            if let Value::Object(body) = data {
                for (k, v) in body {
                    if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    if self.strip_secret_data && (k == "data" || k == "stringData") {
                        continue;
                    }
                    out.insert(k, v);
                }
            }
        }
        let mut out = Value::Object(out);
        if self.mode == PayloadMode::Fields {
            out = self.keep_fields(out);
        }
        for ptr in &self.drop {
            remove_pointer(&mut out, ptr);
        }
        out
    }

    fn keep_fields(&self, full: Value) -> Value {
        let mut kept = Value::Object(Map::new());
        copy_pointer(&full, &mut kept, "/apiVersion");
        copy_pointer(&full, &mut kept, "/kind");
        for p in ["name", "namespace", "uid", "resourceVersion", "labels"] {
            copy_pointer(&full, &mut kept, &format!("/metadata/{p}"));
        }
        for ptr in &self.fields {
            copy_pointer(&full, &mut kept, ptr);
        }
        kept
    }
}

/// XXH3-64 over the structure of `v`, skipping `metadata.resourceVersion` at the top level.
/// Structural (no serialization): types, keys and values are fed in order, with tags and
/// lengths so that different structures never feed the same byte stream.
pub fn fingerprint(v: &Value) -> u64 {
    let mut h = Xxh3::new();
    match v {
        Value::Object(map) => {
            h.write_u8(b'o');
            h.write_usize(map.len());
            for (k, val) in map {
                hash_str(&mut h, k);
                if k == "metadata" {
                    if let Value::Object(meta) = val {
                        h.write_u8(b'o');
                        for (mk, mv) in meta {
                            if mk == "resourceVersion" {
                                continue;
                            }
                            hash_str(&mut h, mk);
                            hash_value(&mut h, mv);
                        }
                        continue;
                    }
                }
                hash_value(&mut h, val);
            }
        }
        other => hash_value(&mut h, other),
    }
    h.finish()
}

fn hash_str(h: &mut Xxh3, s: &str) {
    h.write_usize(s.len());
    h.write(s.as_bytes());
}

fn hash_value(h: &mut Xxh3, v: &Value) {
    match v {
        Value::Null => h.write_u8(b'n'),
        Value::Bool(b) => h.write_u8(if *b { b't' } else { b'f' }),
        // Numbers by value and representation, without formatting them: integers and
        // floats get different tags, so `1` and `1.0` differ as they do in the JSON.
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                h.write_u8(b'u');
                h.write_u64(u);
            } else if let Some(i) = n.as_i64() {
                h.write_u8(b'i');
                h.write_i64(i);
            } else {
                h.write_u8(b'f');
                h.write_u64(n.as_f64().unwrap_or(f64::NAN).to_bits());
            }
        }
        Value::String(s) => {
            h.write_u8(b's');
            hash_str(h, s);
        }
        Value::Array(a) => {
            h.write_u8(b'a');
            h.write_usize(a.len());
            for x in a {
                hash_value(h, x);
            }
        }
        Value::Object(m) => {
            h.write_u8(b'o');
            h.write_usize(m.len());
            for (k, x) in m {
                hash_str(h, k);
                hash_value(h, x);
            }
        }
    }
}

/// Decodes one RFC 6901 reference token (`~1` → `/`, `~0` → `~`).
fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Removes the value at `ptr` (RFC 6901), if present.
pub fn remove_pointer(v: &mut Value, ptr: &str) {
    let Some((parent, last)) = ptr.rsplit_once('/') else {
        return;
    };
    let target = if parent.is_empty() {
        Some(v)
    } else {
        v.pointer_mut(parent)
    };
    match target {
        Some(Value::Object(m)) => {
            m.remove(&unescape(last));
        }
        Some(Value::Array(a)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < a.len() {
                    a.remove(i);
                }
            }
        }
        _ => {}
    }
}

/// Copies the value at `ptr` from `src` into `dst`, creating parent objects (array indices
/// in the path are copied as object keys of the index, keeping the pointer stable).
fn copy_pointer(src: &Value, dst: &mut Value, ptr: &str) {
    let Some(found) = src.pointer(ptr) else {
        return;
    };
    let mut cur = dst;
    let tokens: Vec<String> = ptr.split('/').skip(1).map(unescape).collect();
    let Some((last, parents)) = tokens.split_last() else {
        return;
    };
    for t in parents {
        let Value::Object(m) = cur else {
            return;
        };
        cur = m
            .entry(t.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if let Value::Object(m) = cur {
        m.insert(last.clone(), found.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                         "labels": {"app": "web"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    #[test]
    fn full_mode_drops_managed_fields_and_merges_cluster_label() {
        let s = Shaper::new(
            &ResourceConfig::new("v1", "Pod"),
            "kubesink.io/cluster",
            "prod",
        );
        let v = s.shape(pod());
        assert!(v.pointer("/metadata/managedFields").is_none());
        assert_eq!(v["metadata"]["labels"]["kubesink.io/cluster"], "prod");
        assert_eq!(v["metadata"]["labels"]["app"], "web");
        assert_eq!(v["spec"]["nodeName"], "n1");
    }

    #[test]
    fn fingerprint_ignores_resource_version_only() {
        let s = Shaper::new(&ResourceConfig::new("v1", "Pod"), "l", "c");
        let a = s.shape(pod());
        let mut b = a.clone();
        b["metadata"]["resourceVersion"] = json!("6");
        assert_eq!(fingerprint(&a), fingerprint(&b));
        b["status"]["phase"] = json!("Failed");
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn fingerprint_tells_numbers_apart() {
        let fp = |v: serde_json::Value| fingerprint(&v);
        assert_ne!(fp(json!({"a": 1})), fp(json!({"a": 2})));
        assert_ne!(fp(json!({"a": 1})), fp(json!({"a": 1.0})));
        assert_ne!(fp(json!({"a": -1})), fp(json!({"a": 1})));
        assert_ne!(fp(json!({"a": 1})), fp(json!({"a": "1"})));
        assert_eq!(fp(json!({"a": 0.5})), fp(json!({"a": 0.5})));
    }

    #[test]
    fn fields_mode_keeps_only_listed_pointers_and_identity() {
        let mut r = ResourceConfig::new("v1", "Pod");
        r.payload = PayloadMode::Fields;
        r.fields = vec!["/spec/nodeName".into()];
        let v = Shaper::new(&r, "l", "c").shape(pod());
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                                "labels": {"app": "web", "l": "c"}},
                   "spec": {"nodeName": "n1"}})
        );
    }

    #[test]
    fn secret_data_is_removed_unless_allowed() {
        let secret: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "ns"},
            "type": "Opaque", "data": {"password": "aHVudGVyMg=="}, "stringData": {"x": "y"}
        }))
        .unwrap();
        let mut r = ResourceConfig::new("v1", "Secret");
        let v = Shaper::new(&r, "l", "c").shape(secret.clone());
        assert!(v.get("data").is_none() && v.get("stringData").is_none());
        assert_eq!(v["type"], "Opaque");
        r.allow_secret_data = true;
        let v = Shaper::new(&r, "l", "c").shape(secret);
        assert_eq!(v["data"]["password"], "aHVudGVyMg==");
    }

    #[test]
    fn drop_pointers_remove_paths_with_escapes() {
        let mut r = ResourceConfig::new("v1", "Pod");
        r.drop = vec!["/status".into(), "/metadata/labels/app".into()];
        let v = Shaper::new(&r, "a/b", "c").shape(pod());
        assert!(v.get("status").is_none());
        assert!(v.pointer("/metadata/labels/app").is_none());
        let mut v2 = v.clone();
        remove_pointer(&mut v2, "/metadata/labels/a~1b");
        assert!(v2.pointer("/metadata/labels/a~1b").is_none());
        assert!(v.pointer("/metadata/labels/a~1b").is_some());
    }
}
