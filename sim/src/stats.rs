//! Request counters: how many list and watch requests each resource and each URL path
//! received (counted on arrival, before any injected fault answers them), so tests can
//! assert a client's pace: "fewer than 5 watch requests in 5 s", "no request before the
//! `Retry-After` passed". Read through `Simulator::request_counts` and `GET /_sim/stats`.
//! This module only counts; it never answers requests.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// List and watch requests of one resource or path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerbCounts {
    /// GET requests for a collection without `watch` (pages count one each).
    pub lists: u64,
    /// GET requests for a collection with `watch=true` (or `1`).
    pub watches: u64,
}

/// Request counts since start or the last `Simulator::reset_request_counts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// By resource, named `plural` for the core group and `plural.group` otherwise
    /// (`pods`, `deployments.apps`), over every namespace and version.
    pub by_resource: BTreeMap<String, VerbCounts>,
    /// By URL path without the query (`/api/v1/pods`, `/api/v1/namespaces/x/pods`).
    pub by_path: BTreeMap<String, VerbCounts>,
}

/// The `by_resource` key of `group`/`plural`.
pub fn resource_key(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

impl RequestCounts {
    /// Counts of resource `group`/`plural` (zero if never requested).
    pub fn resource(&self, group: &str, plural: &str) -> VerbCounts {
        self.by_resource
            .get(&resource_key(group, plural))
            .copied()
            .unwrap_or_default()
    }

    /// Counts of URL `path` (zero if never requested).
    pub fn path(&self, path: &str) -> VerbCounts {
        self.by_path.get(path).copied().unwrap_or_default()
    }

    /// Counts one request of `verb` ("list" or "watch"; others are ignored).
    pub(crate) fn count(&mut self, path: &str, group: &str, plural: &str, verb: &str) {
        let bump = |c: &mut VerbCounts| match verb {
            "list" => c.lists += 1,
            "watch" => c.watches += 1,
            _ => {}
        };
        if verb != "list" && verb != "watch" {
            return;
        }
        bump(
            self.by_resource
                .entry(resource_key(group, plural))
                .or_default(),
        );
        bump(self.by_path.entry(path.to_owned()).or_default());
    }

    /// `{"byResource": {"pods": {"lists": 1, "watches": 2}}, "byPath": {…}}`.
    pub fn to_json(&self) -> Value {
        let map = |m: &BTreeMap<String, VerbCounts>| {
            m.iter()
                .map(|(k, c)| (k.clone(), json!({"lists": c.lists, "watches": c.watches})))
                .collect::<serde_json::Map<String, Value>>()
        };
        json!({"byResource": map(&self.by_resource), "byPath": map(&self.by_path)})
    }
}
