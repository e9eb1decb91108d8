//! Payload shaping: from the object the watch delivered ([`RawObject`]) to the object a
//! message carries, serialized once, and its fingerprint taken while it is written.
//!
//! Order of operations (each resource's [`Shaper`]): `metadata.managedFields` is never read
//! (see `object.rs`); for a Secret of the core group (as API discovery resolved the resource,
//! whatever the configuration's spelling) without `allow_secret_data`, `data`, `stringData`
//! and every annotation that may hold them are removed ([`secret_annotation`]: the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation, which holds the whole
//! applied manifest, data included, the same of other apply tools, any annotation that
//! looks like a manifest with data, and any annotation that contains one of the Secret's
//! values); so no `fields` or `drop` pointer can select them either. The payload mode
//! (`full`, `metadata`,
//! `fields`) and the extra `drop` pointers apply; the cluster label is merged into
//! `metadata.labels`. Fields no pointer touches are copied as the raw JSON the API server
//! sent; a field a pointer reaches into is parsed (serde_json's default depth limit of 128
//! applies there, and an object too deep for it is reported, not emitted half-shaped).
//!
//! The fingerprint is XXH3-64 over the serialized object with the value of
//! `metadata.resourceVersion` left out, so a relist returning the same object, or a change
//! confined to dropped fields, produces the same fingerprint and is suppressed.
//!
//! Never emits Secret data by accident: those fields are removed before anything else looks
//! at the object.

use std::borrow::Cow;
use std::sync::Arc;

use kubesink_core::message::ObjectJson;
use kubesink_core::Resource;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::Xxh3;

use super::changes::{ChangePaths, DefaultParts};
use super::facts::Parts;
use super::object::RawObject;
use super::store::Values;
use crate::config::{PayloadMode, ResourceConfig, ResourceMode};

/// The version of shaping and fingerprinting. Saved state carries fingerprints; when this
/// changes (a shaping rule or the fingerprint's walk), saved fingerprints no longer compare
/// and the state is ignored (a full initial list): bump it with any such change.
pub const SHAPE_VERSION: u32 = 1;

/// The annotation `kubectl apply` writes: the last applied manifest, Secret data included.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Annotations in which apply tools keep a whole manifest (a Secret's data included):
/// kubectl's, kapp's original manifest, and banzaicloud's k8s-objectmatcher.
pub const MANIFEST_ANNOTATIONS: &[&str] = &[
    LAST_APPLIED,
    "kapp.k14s.io/original",
    "banzaicloud.com/last-applied",
];

/// Secret values shorter than this are not searched for in annotations (a one-letter
/// value would match almost anything).
const MIN_SECRET_VALUE_LEN: usize = 4;

/// Whether a Secret's annotation `value` (under `key`) may carry its data: a known manifest
/// annotation, a value that looks like a manifest with `data` or `stringData` (a JSON
/// object with such a key, or YAML with such a line), or a value that contains one of
/// `values` (the Secret's data, base64 and decoded, and stringData).
pub fn secret_annotation(key: &str, value: &Value, values: &[String]) -> bool {
    if MANIFEST_ANNOTATIONS.contains(&key) {
        return true;
    }
    let Value::String(text) = value else {
        return false;
    };
    let manifest_json = serde_json::from_str::<Map<String, Value>>(text)
        .is_ok_and(|m| m.contains_key("data") || m.contains_key("stringData"));
    let manifest_yaml = text.lines().any(|l| {
        let l = l.trim_start_matches([' ', '-']);
        l.starts_with("data:") || l.starts_with("stringData:")
    });
    manifest_json || manifest_yaml || values.iter().any(|v| text.contains(v.as_str()))
}

/// The values of a Secret's `data` (base64 as sent, and decoded when it is text) and
/// `stringData`, at least [`MIN_SECRET_VALUE_LEN`] long.
fn secret_values(body: &[(Cow<'_, str>, &RawValue)]) -> Vec<String> {
    use base64::Engine;
    let mut out = Vec::new();
    for (k, raw) in body {
        if k != "data" && k != "stringData" {
            continue;
        }
        let Ok(map) = serde_json::from_str::<Map<String, Value>>(raw.get()) else {
            continue;
        };
        for v in map.values() {
            let Value::String(s) = v else { continue };
            out.push(s.clone());
            if k == "data" {
                if let Ok(text) = base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map(String::from_utf8)
                {
                    out.extend(text.ok());
                }
            }
        }
    }
    out.retain(|v| v.len() >= MIN_SECRET_VALUE_LEN);
    out
}

/// A shaped object: its JSON and fingerprints.
#[derive(Debug, Clone, PartialEq)]
pub struct Shaped {
    /// The emitted object.
    pub object: ObjectJson,
    /// XXH3-64 of `object` without the value of `metadata.resourceVersion` (and, with
    /// `ignore_changes`, without the values the ignored paths select: `changes.rs`).
    pub fingerprint: u64,
    /// The 16-bit fingerprints of the resource's change paths (`changes.rs`).
    pub parts: Parts,
    /// The `change_values`' values (`None`: the resource has none).
    pub values: Option<Values>,
}

/// Why an object could not be shaped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("field {field:?} could not be read for the pointer {pointer:?}: {reason}")]
pub struct ShapeError {
    /// The top-level field.
    pub field: String,
    /// The configured pointer that reaches into it.
    pub pointer: String,
    /// serde_json's message (e.g. the recursion limit of deeply nested data).
    pub reason: String,
}

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
    changes: Arc<ChangePaths>,
    /// Events mode: the shaped object is the Event's occurrence (`occurrence.rs`), its
    /// fingerprint the Event's count.
    events: bool,
}

/// One top-level field of the shaped object: raw as received, or parsed because a pointer
/// reaches into it.
enum Field<'a> {
    Raw(&'a RawValue),
    Parsed(Value),
}

/// The shaped object's top-level fields after `metadata`, in order.
type Body<'a> = Vec<(Cow<'a, str>, Field<'a>)>;

impl Shaper {
    /// A shaper for the objects of `resource` (as API discovery resolved `res`), labelling
    /// them with `label_key` = the resource's cluster. Whether Secret data is removed is
    /// decided here, from the discovered group and kind (core group, `Secret`), never from
    /// how the configuration spells its apiVersion; so is the apiVersion a metadata-only
    /// payload names. `changes` are `res`'s change paths, compiled once per resource
    /// ([`ChangePaths::of_resource`]).
    pub fn for_resource(
        res: &ResourceConfig,
        resource: &Resource,
        label_key: &str,
        changes: Arc<ChangePaths>,
    ) -> Self {
        Shaper {
            mode: res.payload,
            fields: res.fields.clone(),
            drop: res.drop.clone(),
            strip_secret_data: resource.group.is_empty()
                && resource.kind == "Secret"
                && !res.allow_secret_data,
            label_key: label_key.to_owned(),
            label_value: resource.cluster.clone(),
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            changes,
            events: res.mode == ResourceMode::Events,
        }
    }

    /// The resource's change paths.
    pub fn changes(&self) -> &ChangePaths {
        &self.changes
    }

    /// A shaper for `res` without API discovery (tests, fuzzing, recorded fixtures): the
    /// resource as discovery would be asked for it ([`ResourceConfig::group_version`]),
    /// labelling objects with `label_key = label_value`.
    #[cfg(any(test, feature = "test-util"))]
    pub fn new(res: &ResourceConfig, label_key: &str, label_value: &str) -> Self {
        let (group, version) = res.group_version();
        let resource = Resource::new(label_value, group, version, &res.kind, "", true);
        Shaper::for_resource(
            res,
            &resource,
            label_key,
            Arc::new(ChangePaths::of_resource(res)),
        )
    }

    /// What a resource's filter sees of `obj` (`filter.rs`): its metadata redacted as the
    /// message's is (a Secret's annotations that repeat its data removed), and whether a
    /// top-level field is left out of the message for secrecy (`data`, `stringData`).
    pub fn filter_view<'o>(
        &self,
        obj: &'o RawObject<'_>,
    ) -> (Cow<'o, Map<String, Value>>, impl Fn(&str) -> bool) {
        let strip = self.strip_secret_data;
        let mut metadata = Cow::Borrowed(&obj.metadata);
        if strip {
            if let Some(Value::Object(a)) = metadata.to_mut().get_mut("annotations") {
                let values = secret_values(&obj.body);
                a.retain(|k, v| !secret_annotation(k, v, &values));
            }
        }
        (metadata, move |k: &str| {
            strip && (k == "data" || k == "stringData")
        })
    }

    /// Turns a watched object into the emitted object and its fingerprint.
    ///
    /// # Errors
    /// [`ShapeError`] when a `fields` or `drop` pointer reaches into a field that cannot be
    /// parsed (nested deeper than serde_json's limit).
    pub fn shape(&self, obj: &RawObject<'_>) -> Result<Shaped, ShapeError> {
        if self.events {
            // An occurrence changes when the Event happens again: its count is what the
            // store keeps in place of the payload's fingerprint (decide.rs takes the
            // difference as the message's `occurrences`).
            let o = super::occurrence::read(obj);
            return Ok(Shaped {
                object: o.object,
                fingerprint: o.count,
                parts: Parts::UNKNOWN,
                values: None,
            });
        }
        let mut metadata = obj.metadata.clone();
        if self.strip_secret_data {
            if let Some(Value::Object(a)) = metadata.get_mut("annotations") {
                let values = secret_values(&obj.body);
                a.retain(|k, v| !secret_annotation(k, v, &values));
            }
        }
        let mut body: Body<'_> = match self.mode {
            PayloadMode::Metadata => Vec::new(),
            PayloadMode::Full | PayloadMode::Fields => obj
                .body
                .iter()
                .filter(|(k, _)| !(self.strip_secret_data && (k == "data" || k == "stringData")))
                .map(|(k, v)| (k.clone(), Field::Raw(v)))
                .collect(),
        };
        if self.mode == PayloadMode::Fields {
            (metadata, body) = self.keep_fields(metadata, body)?;
        }
        for ptr in &self.drop {
            drop_pointer(&mut metadata, &mut body, ptr)?;
        }
        // `labels: null` (or anything but a map, which the API never sends) becomes a map:
        // every emitted object carries the cluster label.
        let labels = metadata
            .entry("labels")
            .or_insert_with(|| Value::Object(Map::new()));
        if !labels.is_object() {
            *labels = Value::Object(Map::new());
        }
        if let Value::Object(l) = labels {
            l.insert(
                self.label_key.clone(),
                Value::String(self.label_value.clone()),
            );
        }
        let (api_version, kind) = match (&obj.api_version, &obj.kind) {
            (Some(a), Some(k)) if !a.is_empty() && k != "PartialObjectMetadata" => {
                (a.as_str(), k.as_str())
            }
            _ => (self.api_version.as_str(), self.kind.as_str()),
        };
        let mut shaped = write(api_version, kind, &metadata, &body);
        if self.changes.needs_parse() {
            // The text was just written by serde_json and raw fields the server sent, so it
            // parses; a failure would leave the default parts and whole fingerprint.
            if let Ok(v) = serde_json::from_str::<Value>(shaped.object.as_str()) {
                let got = self.changes.fingerprint_object(v);
                shaped.parts = got.parts.unwrap_or(shaped.parts);
                shaped.fingerprint = got.filtered.unwrap_or(shaped.fingerprint);
                shaped.values = got.values;
            }
        }
        Ok(shaped)
    }

    /// `fields` mode: identity metadata and the listed pointers only.
    fn keep_fields<'a>(
        &self,
        metadata: Map<String, Value>,
        body: Body<'a>,
    ) -> Result<(Map<String, Value>, Body<'a>), ShapeError> {
        let mut meta_out = Map::new();
        for k in ["name", "namespace", "uid", "resourceVersion", "labels"] {
            if let Some(v) = metadata.get(k) {
                meta_out.insert(k.to_owned(), v.clone());
            }
        }
        let meta_value = Value::Object(metadata);
        let mut kept: Vec<(Cow<'a, str>, Value)> = Vec::new();
        for ptr in &self.fields {
            let Some((first, rest)) = split_pointer(ptr) else {
                continue;
            };
            if first == "metadata" {
                let mut wrapped = Value::Object(std::mem::take(&mut meta_out));
                copy_pointer(&meta_value, &mut wrapped, rest);
                meta_out = into_map(wrapped);
                continue;
            }
            let Some((key, field)) = body.iter().find(|(k, _)| *k == first) else {
                continue;
            };
            let src = parse_field(key, field, ptr)?;
            let i = match kept.iter().position(|(k, _)| k == key) {
                Some(i) => i,
                None => {
                    kept.push((key.clone(), Value::Object(Map::new())));
                    kept.len() - 1
                }
            };
            if rest.is_empty() {
                kept[i].1 = src;
            } else {
                copy_pointer(&src, &mut kept[i].1, rest);
            }
        }
        let body = kept
            .into_iter()
            .map(|(k, v)| (k, Field::Parsed(v)))
            .collect();
        Ok((meta_out, body))
    }
}

fn into_map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `/a/b/c` → (`a`, `/b/c`), the first token unescaped (RFC 6901).
fn split_pointer(ptr: &str) -> Option<(String, &str)> {
    let rest = ptr.strip_prefix('/')?;
    let (first, rest) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    Some((unescape(first), rest))
}

fn parse_field(key: &str, field: &Field<'_>, ptr: &str) -> Result<Value, ShapeError> {
    match field {
        Field::Parsed(v) => Ok(v.clone()),
        Field::Raw(raw) => serde_json::from_str(raw.get()).map_err(|e| ShapeError {
            field: key.to_owned(),
            pointer: ptr.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// Applies one `drop` pointer to metadata or body.
fn drop_pointer(
    metadata: &mut Map<String, Value>,
    body: &mut Body<'_>,
    ptr: &str,
) -> Result<(), ShapeError> {
    let Some((first, rest)) = split_pointer(ptr) else {
        return Ok(());
    };
    if first == "metadata" {
        let mut wrapped = Value::Object(std::mem::take(metadata));
        remove_pointer(&mut wrapped, rest);
        *metadata = into_map(wrapped);
        return Ok(());
    }
    let Some(i) = body.iter().position(|(k, _)| *k == first) else {
        return Ok(());
    };
    if rest.is_empty() {
        body.remove(i);
        return Ok(());
    }
    let mut v = parse_field(&body[i].0, &body[i].1, ptr)?;
    remove_pointer(&mut v, rest);
    body[i].1 = Field::Parsed(v);
    Ok(())
}

/// Serializes the shaped object and fingerprints it without the resourceVersion's value.
fn write(
    api_version: &str,
    kind: &str,
    metadata: &Map<String, Value>,
    body: &[(Cow<'_, str>, Field<'_>)],
) -> Shaped {
    let size: usize = body
        .iter()
        .map(|(k, f)| {
            k.len()
                + match f {
                    Field::Raw(r) => r.get().len(),
                    Field::Parsed(_) => 64,
                }
        })
        .sum();
    let mut out: Vec<u8> = Vec::with_capacity(size + 512);
    let mut rv_span = (0, 0);
    let mut parts = DefaultParts::new();
    out.extend_from_slice(b"{\"apiVersion\":");
    push_json(&mut out, api_version);
    out.extend_from_slice(b",\"kind\":");
    push_json(&mut out, kind);
    out.extend_from_slice(b",\"metadata\":{");
    for (i, (k, v)) in metadata.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_json(&mut out, k);
        out.push(b':');
        let start = out.len();
        push_json(&mut out, v);
        if k == "resourceVersion" {
            rv_span = (start, out.len());
        }
        parts.metadata(k, &out[start..]);
    }
    out.push(b'}');
    for (k, f) in body {
        out.push(b',');
        push_json(&mut out, k);
        out.push(b':');
        let start = out.len();
        match f {
            Field::Raw(r) => out.extend_from_slice(r.get().as_bytes()),
            Field::Parsed(v) => push_json(&mut out, v),
        }
        parts.field(k, &out[start..]);
    }
    out.push(b'}');
    let mut h = Xxh3::new();
    h.update(&out[..rv_span.0]);
    h.update(&out[rv_span.1..]);
    let fingerprint = h.digest();
    // Every part written is JSON: strings and values by serde_json, raw fields as the API
    // server sent them (already validated when they were scanned).
    let text = String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    Shaped {
        object: ObjectJson::from_trusted(text),
        fingerprint,
        parts: parts.finish(),
        values: None,
    }
}

fn push_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    // Writing a `str` or a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
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

    const POD: &str = r#"{"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":"p","namespace":"ns","uid":"u","resourceVersion":"5",
                    "labels":{"app":"web"},"managedFields":[{"manager":"kubelet"}]},
        "spec":{"nodeName":"n1","containers":[{"name":"c","image":"i"}]},
        "status":{"phase":"Running"}}"#;

    fn shape(res: &ResourceConfig, text: &str) -> (Value, u64) {
        let s = Shaper::new(res, "kubesink.io/cluster", "prod")
            .shape(&RawObject::parse(text).unwrap())
            .unwrap();
        (s.object.to_value(), s.fingerprint)
    }

    #[test]
    fn full_mode_drops_managed_fields_and_merges_cluster_label() {
        let (v, _) = shape(&ResourceConfig::new("v1", "Pod"), POD);
        assert!(v.pointer("/metadata/managedFields").is_none());
        assert_eq!(v["metadata"]["labels"]["kubesink.io/cluster"], "prod");
        assert_eq!(v["metadata"]["labels"]["app"], "web");
        assert_eq!(v["spec"]["nodeName"], "n1");
        assert_eq!(v["status"]["phase"], "Running");
    }

    #[test]
    fn fingerprint_ignores_resource_version_only() {
        let res = ResourceConfig::new("v1", "Pod");
        let (_, a) = shape(&res, POD);
        let (_, b) = shape(
            &res,
            &POD.replace(r#""resourceVersion":"5""#, r#""resourceVersion":"6""#),
        );
        assert_eq!(a, b);
        let (_, c) = shape(&res, &POD.replace("Running", "Failed"));
        assert_ne!(a, c);
        let (_, d) = shape(
            &res,
            &POD.replace(r#""manager":"kubelet""#, r#""manager":"other""#),
        );
        assert_eq!(a, d, "managedFields are not part of the payload");
    }

    #[test]
    fn metadata_mode_keeps_identity_and_uses_the_resource_kind() {
        let mut r = ResourceConfig::new("v1", "Pod");
        r.payload = PayloadMode::Metadata;
        let partial = r#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1",
            "metadata":{"name":"p","namespace":"ns"}}"#;
        let (v, _) = shape(&r, partial);
        assert_eq!(v["kind"], "Pod");
        assert_eq!(v["apiVersion"], "v1");
        assert!(v.get("spec").is_none());
    }

    #[test]
    fn fields_mode_keeps_only_listed_pointers_and_identity() {
        let mut r = ResourceConfig::new("v1", "Pod");
        r.payload = PayloadMode::Fields;
        r.fields = vec!["/spec/nodeName".into(), "/metadata/namespace".into()];
        let (v, _) = shape(&r, POD);
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                                "labels": {"app": "web", "kubesink.io/cluster": "prod"}},
                   "spec": {"nodeName": "n1"}})
        );
    }

    #[test]
    fn secret_data_and_the_applied_manifest_are_removed_unless_allowed() {
        let secret = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns",
            "annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"data\":{\"password\":\"aHVudGVyMg==\"}}","team":"a"}},
            "type":"Opaque","data":{"password":"aHVudGVyMg=="},"stringData":{"x":"y"}}"#;
        let mut r = ResourceConfig::new("v1", "Secret");
        let (v, _) = shape(&r, secret);
        assert!(v.get("data").is_none() && v.get("stringData").is_none());
        assert!(!v.to_string().contains("aHVudGVyMg"));
        assert_eq!(v["metadata"]["annotations"]["team"], "a");
        assert_eq!(v["type"], "Opaque");
        r.allow_secret_data = true;
        let (v, _) = shape(&r, secret);
        assert_eq!(v["data"]["password"], "aHVudGVyMg==");
    }

    #[test]
    fn no_pointer_and_no_annotation_of_any_apply_tool_lets_secret_values_out() {
        // "hunter2-pw" is aHVudGVyMi1wdw== in base64.
        let secret = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns",
            "annotations":{
                "kubectl.kubernetes.io/last-applied-configuration":"{}",
                "kapp.k14s.io/original":"{}",
                "example.com/manifest":"{\"kind\":\"Secret\",\"stringData\":{}}",
                "example.com/yaml":"kind: Secret\ndata:\n  k: v\n",
                "example.com/copy":"the password is hunter2-pw",
                "example.com/b64":"aHVudGVyMi1wdw==",
                "team":"a", "short":"a"}},
            "type":"Opaque","data":{"password":"aHVudGVyMi1wdw==","tiny":"YQ=="},"stringData":{"token":"tok-123456"}}"#;
        let leaks = |v: &Value| {
            let t = v.to_string();
            t.contains("hunter2") || t.contains("aHVudGVyMi1wdw") || t.contains("tok-123456")
        };
        let annotation_keys = |v: &Value| -> Vec<String> {
            v["metadata"]["annotations"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default()
        };
        // Metadata mode asks the API server for PartialObjectMetadata: no data to compare
        // with, so only the manifest annotations can be recognised there (an annotation
        // holding a bare copy of a value is caught in full and fields modes only).
        let mut partial: Value = serde_json::from_str(secret).unwrap();
        partial["kind"] = json!("PartialObjectMetadata");
        for k in ["data", "stringData", "type"] {
            partial.as_object_mut().unwrap().remove(k);
        }
        let partial = partial.to_string();
        let mut r = ResourceConfig::new("v1", "Secret");
        r.payload = PayloadMode::Metadata;
        let (v, _) = shape(&r, &partial);
        assert_eq!(
            annotation_keys(&v),
            ["example.com/b64", "example.com/copy", "short", "team"],
            "{v}"
        );
        for mode in [
            PayloadMode::Full,
            PayloadMode::Metadata,
            PayloadMode::Fields,
        ] {
            let mut r = ResourceConfig::new("v1", "Secret");
            r.payload = mode;
            if mode == PayloadMode::Fields {
                r.fields = vec![
                    "/data/password".into(),
                    "/data".into(),
                    "/stringData/token".into(),
                    "/metadata/annotations".into(),
                    "/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration"
                        .into(),
                    "/type".into(),
                ];
            }
            let (v, _) = shape(&r, secret);
            assert!(!leaks(&v), "{mode:?}: {v}");
            assert_eq!(annotation_keys(&v), ["short", "team"], "{mode:?}: {v}");
        }
        let mut r = ResourceConfig::new("v1", "Secret");
        r.allow_secret_data = true;
        let (v, _) = shape(&r, secret);
        assert!(leaks(&v), "allowed per resource: everything stays");
    }

    #[test]
    fn drop_pointers_remove_paths_with_escapes() {
        let mut r = ResourceConfig::new("v1", "Pod");
        r.drop = vec![
            "/status".into(),
            "/metadata/labels/app".into(),
            "/spec/containers/0/image".into(),
        ];
        let (v, _) = shape(&r, POD);
        assert!(v.get("status").is_none());
        assert!(v.pointer("/metadata/labels/app").is_none());
        assert!(v.pointer("/spec/containers/0/image").is_none());
        assert_eq!(v["spec"]["containers"][0]["name"], "c");
        let mut v2 = v.clone();
        remove_pointer(&mut v2, "/metadata/labels/kubesink.io~1cluster");
        assert!(v2
            .pointer("/metadata/labels/kubesink.io~1cluster")
            .is_none());
    }

    #[test]
    fn a_pointer_into_a_too_deep_field_is_an_error_not_a_crash() {
        let deep = format!(
            r#"{{"metadata":{{"name":"d"}},"spec":{{"a":{}1{}}}}}"#,
            "[".repeat(5000),
            "]".repeat(5000)
        );
        let mut r = ResourceConfig::new("v1", "Pod");
        let full = Shaper::new(&r, "l", "c")
            .shape(&RawObject::parse(&deep).unwrap())
            .unwrap();
        assert!(
            full.object.as_str().contains(&"[".repeat(5000)),
            "full mode copies it raw"
        );
        r.drop = vec!["/spec/b".into()];
        let e = Shaper::new(&r, "l", "c")
            .shape(&RawObject::parse(&deep).unwrap())
            .unwrap_err();
        assert_eq!((e.field.as_str(), e.pointer.as_str()), ("spec", "/spec/b"));
        assert!(e.reason.contains("recursion"), "{e}");
    }
}
