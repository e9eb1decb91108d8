//! One-pass decoding of a watched object.
//!
//! A [`RawObject`] is what kubesink needs of an object, read once from the bytes the API
//! server sent: `apiVersion`, `kind` and `metadata` are parsed (with `metadata.managedFields`
//! skipped without being built: it is often half of a Pod's bytes and never emitted); every
//! other top-level field (`spec`, `status`, `data`...) stays the raw JSON text it was,
//! borrowed from the response buffer. Shaping (`payload.rs`) writes those raw fields into the
//! message as they are, so the bulk of an object is scanned once and copied once, never built
//! as a tree. Compare kube's `DynamicObject`, whose `#[serde(flatten)]` buffers every object
//! as serde `Content`, deserializes it twice and builds all of it.
//!
//! Raw fields are scanned by serde_json's iterative `ignore_value`, so an object nested
//! thousands of levels deep decodes without recursion (nothing here has a depth limit but
//! `metadata`, where Kubernetes allows no deep structure).
//!
//! This module never keeps an object: a `RawObject` borrows the buffer it was read from.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// An object decoded in one pass; see the module docs.
#[derive(Debug, Clone)]
pub struct RawObject<'a> {
    /// `apiVersion`, when present.
    pub api_version: Option<String>,
    /// `kind`, when present.
    pub kind: Option<String>,
    /// `metadata` without `managedFields`.
    pub metadata: Map<String, Value>,
    /// Every other top-level field, in the order received, as raw JSON.
    pub body: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> RawObject<'a> {
    /// Decodes an object from its JSON text.
    ///
    /// # Errors
    /// The serde_json error when the text is not a JSON object of that shape.
    pub fn parse(json: &'a str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    fn meta_str(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).and_then(Value::as_str)
    }

    /// `metadata.name`.
    pub fn name(&self) -> Option<&str> {
        self.meta_str("name")
    }

    /// `metadata.namespace` (`None` for cluster-scoped objects).
    pub fn namespace(&self) -> Option<&str> {
        self.meta_str("namespace").filter(|ns| !ns.is_empty())
    }

    /// `metadata.uid`, empty when absent.
    pub fn uid(&self) -> &str {
        self.meta_str("uid").unwrap_or_default()
    }

    /// `metadata.resourceVersion`, empty when absent.
    pub fn resource_version(&self) -> &str {
        self.meta_str("resourceVersion").unwrap_or_default()
    }

    /// Whether `metadata.deletionTimestamp` is set: the object is being deleted (graceful
    /// deletion, or finalizers pending).
    pub fn is_being_deleted(&self) -> bool {
        self.metadata
            .get("deletionTimestamp")
            .is_some_and(|v| !v.is_null())
    }
}

/// A map key, borrowed when the input allows it.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// `metadata` without `managedFields`.
struct Metadata(Map<String, Value>);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metadata;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object's metadata")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
                let mut out = Map::new();
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    if key == "managedFields" {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        out.insert(key.into_owned(), map.next_value::<Value>()?);
                    }
                }
                Ok(Metadata(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for RawObject<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawObject<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Kubernetes object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawObject<'de>, A::Error> {
                let mut obj = RawObject {
                    api_version: None,
                    kind: None,
                    metadata: Map::new(),
                    body: Vec::new(),
                };
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    match &*key {
                        "apiVersion" => obj.api_version = map.next_value()?,
                        "kind" => obj.kind = map.next_value()?,
                        "metadata" => obj.metadata = map.next_value::<Metadata>()?.0,
                        _ => obj.body.push((key, map.next_value::<&'de RawValue>()?)),
                    }
                }
                Ok(obj)
            }
        }
        d.deserialize_map(V)
    }
}

/// The identity of an object that did not decode as a whole: enough to name it in a log
/// line and to keep it out of a relist's delete sweep.
#[derive(Debug, Default, Deserialize)]
pub struct MinimalMeta {
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace`.
    pub namespace: Option<String>,
}

impl MinimalMeta {
    /// Reads only `metadata.name` and `metadata.namespace` from an object's text; `None`
    /// when even that fails.
    pub fn read(json: &str) -> Option<MinimalMeta> {
        #[derive(Deserialize)]
        struct Wrapper {
            #[serde(default)]
            metadata: MinimalMeta,
        }
        serde_json::from_str::<Wrapper>(json)
            .ok()
            .map(|w| w.metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_parsed_without_managed_fields_and_the_rest_stays_raw() {
        let text = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"ns",
            "uid":"u1","resourceVersion":"7","managedFields":[{"manager":"kubelet"}]},
            "spec":{"nodeName":"n1", "containers":[]},"status":{"phase":"Running"}}"#;
        let o = RawObject::parse(text).unwrap();
        assert_eq!((o.name(), o.namespace()), (Some("web"), Some("ns")));
        assert_eq!((o.uid(), o.resource_version()), ("u1", "7"));
        assert!(!o.metadata.contains_key("managedFields"));
        let fields: Vec<(&str, &str)> = o.body.iter().map(|(k, v)| (&**k, v.get())).collect();
        assert_eq!(
            fields,
            [
                ("spec", r#"{"nodeName":"n1", "containers":[]}"#),
                ("status", r#"{"phase":"Running"}"#)
            ]
        );
        assert!(o.body.iter().all(|(k, _)| matches!(k, Cow::Borrowed(_))));
    }

    #[test]
    fn a_spec_nested_ten_thousand_levels_decodes_without_recursion() {
        let depth = 10_000;
        let text = format!(
            r#"{{"metadata":{{"name":"deep"}},"spec":{}1{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let o = RawObject::parse(&text).unwrap();
        assert_eq!(o.name(), Some("deep"));
        assert_eq!(o.body[0].1.get().len(), 2 * depth + 1);
    }

    #[test]
    fn escaped_keys_and_missing_metadata_decode() {
        let o = RawObject::parse(r#"{"sp\u0065c":{},"kind":"X"}"#).unwrap();
        assert_eq!(o.body[0].0, "spec");
        assert_eq!(o.name(), None);
        assert_eq!(o.uid(), "");
    }

    #[test]
    fn the_minimal_identity_survives_a_body_that_does_not_decode() {
        let text = r#"{"metadata":{"name":"a","namespace":"b","labels":7},"spec":{}}"#;
        assert!(RawObject::parse(text).is_ok());
        let broken = r#"{"metadata":{"name":"a","namespace":"b"},"spec":[1,2"#;
        assert!(RawObject::parse(broken).is_err());
        assert!(MinimalMeta::read(broken).is_none());
        let m =
            MinimalMeta::read(r#"{"metadata":{"name":"a","namespace":"b"},"spec":true}"#).unwrap();
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref()),
            (Some("a"), Some("b"))
        );
    }
}
