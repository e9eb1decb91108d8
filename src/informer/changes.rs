//! What changed in an update: a resource's *change paths*, the 16-bit
//! fingerprint of each one's value in the shaped payload ([`Parts`], kept in the store, 16
//! bytes per object), and `ignore_changes`, the paths whose changes alone send nothing.
//!
//! Peers that answer "what changed?" (Botkube's `updateSetting.fields`, Robusta, kubewatch)
//! keep whole objects to diff them; kubesink keeps one small fingerprint per path instead,
//! so an `updated` names the paths whose value differs from the last payload it sent.
//!
//! **Default paths** (no `change_paths` configured): the object's top-level sections, which
//! together cover every field, so an update always names at least one of them:
//! [`DEFAULT_PATHS`]. They are fingerprinted while the payload is written (`payload.rs`),
//! with no parsing. `metadata` is the rest of the metadata without `resourceVersion` (every
//! write moves it) and `generation` (every `spec` change moves it: a scale names `spec`, not
//! `spec` and `metadata`); `*` is every top-level field not named (a Role's `rules`, an
//! Event's `message`, a ConfigMap's `binaryData`).
//!
//! **Configured paths** (`change_paths`, at most [`PART_SLOTS`], one fewer with
//! `ignore_changes`, whose values' fingerprint takes the last slot): JSONPath queries
//! (RFC 9535, by `serde_json_path`), written as in the issue and in Botkube's
//! configuration, without the leading `$`: `spec.replicas`,
//! `spec.template.spec.containers[*].image`, `metadata.labels['app.kubernetes.io/name']`.
//! A path's value is every node it selects, in document order; the shaped object is parsed
//! once per event for them (the default paths need no parse). `changed` then lists the
//! configured paths that changed, in the configured order, and may be empty (the update
//! changed other fields). An empty `change_paths` is the default paths; a leading `$` is
//! accepted (and kept in the name `changed` reports).
//!
//! **`ignore_changes`**: JSONPath queries as above. The store's 64-bit fingerprint of such a
//! resource is taken over the payload *without* the values they select, so an update whose
//! changes all lie there compares equal and sends nothing (its resourceVersion is still
//! recorded, so neither a relist nor a restart sends it later; `metadata.generation`, which
//! the API server moves with a Deployment's annotations as with any `spec` change, is left
//! out with them); it is counted in
//! `kubesink_updates_ignored_total` when its ignored values differ from those of the payload
//! last sent (with configured `change_paths`, the last slot holds their fingerprint, so this
//! is seen whichever paths are configured). The next update that is sent carries the whole object as
//! it is then, ignored fields included, and its `changed` is relative to the payload last
//! sent (so it names an ignored path whose value moved meanwhile).
//!
//! 16 bits per path: a path whose value changed keeps its fingerprint with probability
//! 2⁻¹⁶ and is then missing from `changed`. With the default paths an update always changes
//! one of them; when none differs (such a collision, or a change of `generation` alone) the
//! message says `changed` is unknown (no field) rather than guess. The decision to send an
//! update at all stays with the 64-bit fingerprint.

use std::sync::Arc;

use kubesink_core::message::ChangedPaths;
use serde_json::Value;
use serde_json_path::JsonPath;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::facts::{Parts, PART_SLOTS};
use super::store::{Kept, Values};

/// The default change paths, in slot order: the object's top-level sections.
pub const DEFAULT_PATHS: [&str; PART_SLOTS] = [
    "metadata.labels",
    "metadata.annotations",
    "metadata.ownerReferences",
    "metadata",
    "spec",
    "status",
    "data",
    "*",
];

/// Metadata fields outside every default path: they move on every write (`resourceVersion`)
/// or with every `spec` change (`generation`).
const METADATA_UNTRACKED: [&str; 2] = ["resourceVersion", "generation"];

/// A JSONPath query of the configuration as JSONPath: `$.` prefixed unless the text starts
/// with `$` (or `[`, then `$`).
///
/// # Errors
/// Why it is not one, for `check` and `run` to name with the key: the parser's message
/// (RFC 9535 syntax) about the query as parsed, with the `$.` it was given, and how member
/// names other than letters, digits and `_` are written.
pub fn parse_path(text: &str) -> Result<JsonPath, String> {
    let full = if text.starts_with('$') {
        text.to_owned()
    } else if text.starts_with('[') {
        format!("${text}")
    } else {
        format!("$.{text}")
    };
    JsonPath::parse(&full).map_err(|e| {
        format!(
            "is not a JSONPath (RFC 9535; parsed as {full:?}: {e}). Write it without the \
             leading $, e.g. \"spec.template.spec.containers[*].image\"; a member name with \
             other characters than letters, digits and _ goes in brackets: \
             \"metadata.labels['app.kubernetes.io/name']\""
        )
    })
}

/// One resource's change paths and ignored paths, ready to fingerprint payloads.
#[derive(Clone, Debug)]
pub struct ChangePaths {
    /// The names `changed` reports, by slot.
    names: Arc<[Arc<str>]>,
    /// The configured queries, by slot; empty for the default paths.
    queries: Vec<JsonPath>,
    /// `ignore_changes`.
    ignore: Vec<JsonPath>,
    /// `change_values`: the paths whose old and new values an update carries.
    values: Vec<(Arc<str>, JsonPath)>,
    /// `change_value_max_bytes`: the most bytes of JSON one path's value may take.
    value_max: usize,
    /// `change_values_max_bytes`: the most bytes of values kept per object.
    values_max: usize,
}

/// What [`ChangePaths::fingerprint_object`] takes from a parsed payload.
#[derive(Debug, Default)]
pub struct FromObject {
    /// The configured paths' parts (`None`: the default paths, taken while writing).
    pub parts: Option<Parts>,
    /// The fingerprint without the ignored values (`None`: nothing ignored).
    pub filtered: Option<u64>,
    /// The `change_values`' values (`None`: none configured).
    pub values: Option<Values>,
}

/// One value change of an update: the path, and its old and new JSON (`None`: unknown, or
/// beyond the byte bound).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ValueChange<'a> {
    /// The path as configured.
    pub path: &'a str,
    /// The value in the payload last sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old: Option<&'a serde_json::value::RawValue>,
    /// The value in this payload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<&'a serde_json::value::RawValue>,
}

impl Default for ChangePaths {
    fn default() -> Self {
        ChangePaths {
            names: DEFAULT_PATHS.iter().map(|p| Arc::from(*p)).collect(),
            queries: Vec::new(),
            ignore: Vec::new(),
            values: Vec::new(),
            value_max: 0,
            values_max: 0,
        }
    }
}

impl ChangePaths {
    /// The paths of a resource configured with `change_paths` (empty: the default ones) and
    /// `ignore_changes`. A path that does not parse, or paths beyond [`PART_SLOTS`], are left
    /// out with an error log: `check` and `run` refuse such a configuration before this is
    /// built (`config/resource.rs`), so this is only a second line.
    #[cfg(test)]
    pub fn new(change_paths: &[String], ignore_changes: &[String]) -> Self {
        Self::with_values(change_paths, ignore_changes, &[], 0, 0)
    }

    /// The change paths of `res` (`change_paths`, `ignore_changes`, `change_values` and
    /// their byte bounds), compiled: what the plan holds once per resource.
    pub fn of_resource(res: &crate::config::ResourceConfig) -> Self {
        ChangePaths::with_values(
            &res.change_paths,
            &res.ignore_changes,
            &res.change_values,
            res.change_value_max_bytes.bytes(),
            res.change_values_max_bytes.bytes(),
        )
    }

    /// As [`ChangePaths::new`], with `change_values` and their byte bounds per path
    /// (`value_max`) and per object (`values_max`).
    pub fn with_values(
        change_paths: &[String],
        ignore_changes: &[String],
        change_values: &[String],
        value_max: usize,
        values_max: usize,
    ) -> Self {
        let mut out = ChangePaths::default();
        let parsed = |texts: &[String], key: &str| -> Vec<(Arc<str>, JsonPath)> {
            texts
                .iter()
                .filter_map(|t| match parse_path(t) {
                    Ok(q) => Some((Arc::from(t.as_str()), q)),
                    Err(e) => {
                        tracing::error!(path = %t, key, error = %e, "change path left out: not a JSONPath");
                        None
                    }
                })
                .collect()
        };
        if !change_paths.is_empty() {
            let slots = PART_SLOTS - usize::from(!ignore_changes.is_empty());
            let (names, queries): (Vec<Arc<str>>, Vec<JsonPath>) =
                parsed(change_paths, "change_paths")
                    .into_iter()
                    .take(slots)
                    .unzip();
            out.names = names.into();
            out.queries = queries;
        }
        out.ignore = parsed(ignore_changes, "ignore_changes")
            .into_iter()
            .map(|(_, q)| q)
            .collect();
        out.values = parsed(change_values, "change_values")
            .into_iter()
            .take(PART_SLOTS)
            .collect();
        out.value_max = value_max;
        out.values_max = values_max;
        out
    }

    /// Whether these are the default paths (which cover the whole object).
    pub fn is_default(&self) -> bool {
        self.queries.is_empty()
    }

    /// Whether fingerprinting needs the shaped object parsed (configured, ignored or value
    /// paths).
    pub fn needs_parse(&self) -> bool {
        !self.queries.is_empty() || !self.ignore.is_empty() || !self.values.is_empty()
    }

    /// The value changes between `old` (the values kept for the payload last sent) and
    /// `new`, as the JSON array of `{path, old, new}` a message's `changes` holds: one entry
    /// per path whose value differs (by text, or by hash where one side is beyond a bound),
    /// without the value a side beyond a bound cannot give. `None` when no path changed, and when `old` is unknown
    /// (none kept: the state a restart starts from does not hold values), rather than a
    /// guess.
    pub fn value_changes(&self, old: Option<&Values>, new: &Values) -> Option<String> {
        let old = old?;
        fn raw(v: Option<&str>) -> Option<&serde_json::value::RawValue> {
            v.and_then(|t| serde_json::from_str(t).ok())
        }
        let mut out = Vec::new();
        for (i, (path, _)) in self.values.iter().enumerate() {
            let (Some(after), before) = (new.get(i), old.get(i)) else {
                continue;
            };
            if before.is_some_and(|b| b == after || b.hash() == after.hash()) {
                continue;
            }
            out.push(ValueChange {
                path,
                old: raw(before.and_then(Kept::text)),
                new: raw(after.text()),
            });
        }
        (!out.is_empty()).then(|| serde_json::to_string(&out).unwrap_or_default())
    }

    /// Whether any path is ignored.
    pub fn ignores(&self) -> bool {
        !self.ignore.is_empty()
    }

    /// The `changed` of an update whose slots in `mask` ([`Parts::differing`]) differ;
    /// `None` (unknown) when `mask` is, and for the default paths when no slot is set: they
    /// cover the whole object, so the change was one no path sees (a 16-bit collision, or
    /// `generation` alone).
    pub fn changed(&self, mask: Option<u8>) -> Option<ChangedPaths> {
        let mask = mask?;
        if mask == 0 && self.is_default() {
            return None;
        }
        Some(ChangedPaths {
            mask,
            names: self.names.clone(),
        })
    }

    /// The configured paths' parts, with `ignore_changes` the 64-bit fingerprint without
    /// the ignored values, and the `change_values`' values, from the shaped object `object`
    /// (parsed; its `metadata.resourceVersion` is removed here, as it is from every
    /// fingerprint).
    pub fn fingerprint_object(&self, mut object: Value) -> FromObject {
        if let Some(Value::Object(m)) = object.get_mut("metadata") {
            m.remove("resourceVersion");
        }
        let mut out = FromObject::default();
        // The ignored values, read once: where they are (removed below for the filtered
        // fingerprint) and, with configured paths, their own part.
        let mut ignored_pointers: Vec<String> = Vec::new();
        let mut ignored_part = Xxh3::with_seed(PART_SLOTS as u64);
        for q in &self.ignore {
            for node in q.query_located(&object).iter() {
                hash_node(&mut ignored_part, node.node());
                ignored_pointers.push(node.location().to_json_pointer());
            }
        }
        if !self.queries.is_empty() {
            let mut parts = Parts::UNKNOWN;
            for (slot, q) in self.queries.iter().enumerate() {
                let mut h = Xxh3::with_seed(slot as u64);
                for node in q.query(&object).iter() {
                    hash_node(&mut h, node);
                }
                parts.0[slot] = h.digest() as u16;
            }
            if self.ignores() {
                // The last slot (never a configured path's: `config/resource.rs` keeps it
                // free) is the ignored values': an update they alone changed is then told
                // from one that changed nothing (`kubesink_updates_ignored_total`).
                parts.0[PART_SLOTS - 1] = ignored_part.digest() as u16;
            }
            out.parts = Some(parts);
        }
        if !self.values.is_empty() {
            let mut budget = self.values_max;
            let values: Vec<Kept> =
                self.values
                    .iter()
                    .map(|(_, q)| {
                        let nodes = q.query(&object).all();
                        let text = match nodes.as_slice() {
                            [] => "null".to_owned(),
                            [one] => one.to_string(),
                            many => Value::Array(many.iter().map(|v| (*v).clone()).collect())
                                .to_string(),
                        };
                        if text.len() <= self.value_max && text.len() <= budget {
                            budget -= text.len();
                            Kept::Text(text.into_boxed_str())
                        } else {
                            Kept::Beyond(xxh3_64(text.as_bytes()))
                        }
                    })
                    .collect();
            out.values = Some(values.into_boxed_slice());
        }
        if self.ignores() {
            for p in &ignored_pointers {
                remove_at(&mut object, p);
            }
            // `metadata.generation` is the API server's counter of the writes that changed
            // what it tracks: `spec` (and, for a Deployment, its annotations), or a
            // deletionTimestamp. It moves in the same write as the change, which is compared
            // on its own here, so leaving it out loses nothing and an ignored change (a
            // Deployment's annotations) does not come back through it.
            if let Some(Value::Object(m)) = object.get_mut("metadata") {
                m.remove("generation");
            }
            out.filtered = Some(xxh3_64(&serde_json::to_vec(&object).unwrap_or_default()));
        }
        out
    }
}

/// Feeds one selected node's JSON, and a separator, to a path's hash.
fn hash_node(h: &mut Xxh3, node: &Value) {
    h.update(&serde_json::to_vec(node).unwrap_or_default());
    h.update(b"\0");
}

/// Removes the value at JSON pointer `p`: an object member is removed; an array element
/// becomes `null`, so the pointers of its later siblings still hold.
fn remove_at(v: &mut Value, p: &str) {
    let Some((parent, last)) = p.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match v.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.remove(&last);
        }
        Some(Value::Array(a)) => {
            if let Some(e) = last.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                *e = Value::Null;
            }
        }
        _ => {}
    }
}

/// The default paths' parts, fed while `payload.rs` writes the object: each metadata
/// member and top-level field's JSON text goes to its slot.
pub(super) struct DefaultParts {
    slots: [Xxh3; PART_SLOTS],
}

impl DefaultParts {
    /// Empty slots.
    pub fn new() -> Self {
        DefaultParts {
            slots: std::array::from_fn(|i| Xxh3::with_seed(i as u64)),
        }
    }

    /// A metadata member `key` whose value's JSON is `json`.
    pub fn metadata(&mut self, key: &str, json: &[u8]) {
        let slot = match key {
            "labels" => 0,
            "annotations" => 1,
            "ownerReferences" => 2,
            k if METADATA_UNTRACKED.contains(&k) => return,
            _ => 3,
        };
        self.feed(slot, key, json);
    }

    /// A top-level field `key` (after `metadata`) whose value's JSON is `json`.
    pub fn field(&mut self, key: &str, json: &[u8]) {
        let slot = match key {
            "spec" => 4,
            "status" => 5,
            "data" => 6,
            _ => 7,
        };
        self.feed(slot, key, json);
    }

    fn feed(&mut self, slot: usize, key: &str, json: &[u8]) {
        let h = &mut self.slots[slot];
        h.update(key.as_bytes());
        h.update(b"\0");
        h.update(json);
        h.update(b"\0");
    }

    /// The parts.
    pub fn finish(&self) -> Parts {
        let mut parts = Parts::UNKNOWN;
        for (p, h) in parts.0.iter_mut().zip(self.slots.iter()) {
            *p = h.digest() as u16;
        }
        if !parts.is_known() {
            // Sixteen zero bytes mean unknown; one odd bit keeps a real value known.
            parts.0[0] = 1;
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_parse_without_a_dollar_and_bad_ones_are_named() {
        for ok in [
            "spec.replicas",
            "spec.template.spec.containers[*].image",
            "metadata.labels['app.kubernetes.io/name']",
            "$.status.phase",
        ] {
            assert!(parse_path(ok).is_ok(), "{ok}");
        }
        assert!(parse_path("spec..[").is_err());
    }

    #[test]
    fn configured_parts_change_only_with_their_paths_value() {
        let paths = ChangePaths::new(
            &[
                "spec.replicas".into(),
                "spec.template.spec.containers[*].image".into(),
            ],
            &[],
        );
        let obj = |replicas: u32, image: &str, rv: &str| {
            json!({"metadata": {"name": "web", "resourceVersion": rv},
                   "spec": {"replicas": replicas, "template": {"spec": {"containers": [
                       {"name": "a", "image": image}, {"name": "b", "image": "sidecar"}]}}}})
        };
        let a = paths.fingerprint_object(obj(1, "nginx:1", "1")).parts;
        let b = paths.fingerprint_object(obj(2, "nginx:1", "2")).parts;
        let c = paths.fingerprint_object(obj(2, "nginx:2", "3")).parts;
        let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
        let names = |m| -> Vec<String> {
            paths
                .changed(m)
                .unwrap()
                .iter()
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(names(a.differing(&b)), ["spec.replicas"]);
        assert_eq!(
            names(b.differing(&c)),
            ["spec.template.spec.containers[*].image"]
        );
        assert_eq!(names(c.differing(&c)), Vec::<String>::new());
    }

    #[test]
    fn ignored_values_are_left_out_of_the_filtered_fingerprint() {
        let paths = ChangePaths::new(&[], &["status".into(), "metadata.annotations".into()]);
        let obj = |phase: &str, note: &str, rv: &str, replicas: u32| {
            json!({"metadata": {"name": "web", "resourceVersion": rv, "annotations": {"n": note}},
                   "spec": {"replicas": replicas}, "status": {"phase": phase}})
        };
        let f = |v| paths.fingerprint_object(v).filtered.unwrap();
        let base = f(obj("Pending", "a", "1", 1));
        assert_eq!(base, f(obj("Running", "b", "2", 1)));
        assert_ne!(base, f(obj("Pending", "a", "3", 2)));
        // The generation the API server moves with a Deployment's annotations neither.
        let mut bumped = obj("Pending", "c", "4", 1);
        bumped["metadata"]["generation"] = json!(2);
        assert_eq!(base, f(bumped));
        // An ignored field that appears is no change either.
        let mut without = obj("Pending", "a", "1", 1);
        without.as_object_mut().unwrap().remove("status");
        assert_eq!(base, f(without));
    }

    #[test]
    fn an_ignored_array_element_keeps_its_siblings_pointers() {
        let mut v = json!({"a": [1, 2, 3]});
        remove_at(&mut v, "/a/0");
        remove_at(&mut v, "/a/2");
        assert_eq!(v, json!({"a": [null, 2, null]}));
        let mut v = json!({"m": {"x/y": 1, "z": 2}});
        remove_at(&mut v, "/m/x~1y");
        assert_eq!(v, json!({"m": {"z": 2}}));
    }

    #[test]
    fn default_parts_put_each_section_in_its_slot_and_skip_the_untracked() {
        let parts = |meta: &[(&str, &str)], fields: &[(&str, &str)]| {
            let mut d = DefaultParts::new();
            for (k, v) in meta {
                d.metadata(k, v.as_bytes());
            }
            for (k, v) in fields {
                d.field(k, v.as_bytes());
            }
            d.finish()
        };
        let base = parts(
            &[("name", "\"a\""), ("resourceVersion", "\"1\"")],
            &[("spec", "{}")],
        );
        let moved = parts(
            &[
                ("name", "\"a\""),
                ("resourceVersion", "\"2\""),
                ("generation", "2"),
            ],
            &[("spec", "{\"x\":1}")],
        );
        let paths = ChangePaths::default();
        let changed = paths.changed(base.differing(&moved)).unwrap();
        assert_eq!(changed.iter().collect::<Vec<_>>(), ["spec"]);
        assert_eq!(paths.changed(base.differing(&base)), None);
        assert_eq!(paths.changed(Parts::UNKNOWN.differing(&base)), None);
    }
}
