//! The oracle of `changed`: for every `updated` of a stream, the default change
//! paths whose value differs between the object the key's previous message carried and the
//! object this one carries, computed from the two objects (what a consumer holds), must all
//! be named in the message's `changed`. A path may be named that did not differ in the end
//! (two updates coalesced, the value changed and back), so the check is "covers", and in
//! `Exact` mode, where nothing coalesced, also "no more than".
//!
//! A path is missed by design with probability 2⁻¹⁶ per changed path (its 16-bit
//! fingerprint collides, docs/message-contract.md): over N updates about N/43,000 misses are
//! expected, so the oracle fails on more than 1 + N/10,000 of them (a bug misses
//! systematically; a test that fails at the documented collision rate would be flaky).

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};

/// How strictly [`check_changed`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// `changed` names exactly the paths that differ, and is on every `updated` that follows
    /// a message with an object.
    Exact,
    /// `changed` names at least the paths that differ (coalescing may add paths), and is on
    /// every `updated` that follows a message with an object.
    Covers,
    /// As `Covers` where `changed` is present; it may be absent (a restart from state
    /// without it).
    CoversOrUnknown,
}

/// The default paths' values of `object`, by path (`docs/message-contract.md`).
pub fn sections(object: &Value) -> HashMap<&'static str, Value> {
    let mut out = HashMap::new();
    let empty = Map::new();
    let meta = object
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut rest = Map::new();
    for (k, v) in meta {
        match k.as_str() {
            "labels" => drop(out.insert("metadata.labels", v.clone())),
            "annotations" => drop(out.insert("metadata.annotations", v.clone())),
            "ownerReferences" => drop(out.insert("metadata.ownerReferences", v.clone())),
            "resourceVersion" | "generation" | "managedFields" => {}
            _ => drop(rest.insert(k.clone(), v.clone())),
        }
    }
    out.insert("metadata", Value::Object(rest));
    let mut other = Map::new();
    for (k, v) in object.as_object().unwrap_or(&empty) {
        match k.as_str() {
            "apiVersion" | "kind" | "metadata" => {}
            "spec" => drop(out.insert("spec", v.clone())),
            "status" => drop(out.insert("status", v.clone())),
            "data" => drop(out.insert("data", v.clone())),
            _ => drop(other.insert(k.clone(), v.clone())),
        }
    }
    out.insert("*", Value::Object(other));
    out
}

/// The default paths whose value differs between `before` and `after`.
pub fn differing(before: &Value, after: &Value) -> BTreeSet<&'static str> {
    let (b, a) = (sections(before), sections(after));
    [
        "metadata.labels",
        "metadata.annotations",
        "metadata.ownerReferences",
        "metadata",
        "spec",
        "status",
        "data",
        "*",
    ]
    .into_iter()
    .filter(|p| b.get(p) != a.get(p))
    .collect()
}

/// Checks every `updated` of `msgs` (in delivery order) against the object of its key's
/// previous message; returns how many were checked.
///
/// # Errors
/// The first message whose `changed` misses a path that differs (or, `Exact`, names one that
/// does not, or is absent), with both objects' differing paths.
pub fn check_changed(msgs: &[Value], mode: Changed) -> Result<usize, String> {
    let mut last: HashMap<String, Value> = HashMap::new();
    let mut checked = 0;
    let mut missed: Vec<String> = Vec::new();
    for m in msgs {
        let Some(key) = m["key"].as_str() else {
            continue;
        };
        let object = m.get("object").filter(|o| o.is_object());
        if m["op"] == "updated" {
            if let (Some(before), Some(after)) = (last.get(key), object) {
                let want = differing(before, after);
                let got: Option<BTreeSet<&str>> = m
                    .get("changed")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect());
                let what = || {
                    format!(
                        "{key} at resourceVersion {}: changed {got:?}, the objects differ in {want:?} ({mode:?})",
                        m["resourceVersion"]
                    )
                };
                match (&got, mode) {
                    (Some(got), _) if !got.is_superset(&want) && !got.is_empty() => {
                        // A path missed while another was named: a collision, or a bug.
                        missed.push(what());
                    }
                    (Some(got), Changed::Exact) if *got != want => return Err(what()),
                    (Some(got), _) if !got.is_superset(&want) => return Err(what()),
                    // No default path differs (`generation` alone, or a re-send of what the
                    // consumer already has): `changed` is left out by design.
                    (None, _) if want.is_empty() => {}
                    (None, Changed::CoversOrUnknown) | (Some(_), _) => {}
                    (None, _) => return Err(what()),
                }
                checked += 1;
            }
        }
        match (m["op"].as_str(), object) {
            (Some("deleted"), _) => drop(last.remove(key)),
            (Some("added" | "updated"), Some(o)) => drop(last.insert(key.to_owned(), o.clone())),
            _ => {}
        }
    }
    if missed.len() > 1 + checked / 10_000 {
        return Err(format!(
            "{} of {checked} updates miss a path that differs:\n{}",
            missed.len(),
            missed.join("\n")
        ));
    }
    Ok(checked)
}
