//! `[[resources]]`: what to watch and how much of each object a message carries, and the
//! checks serde cannot express, beside the fields they check.

use serde::{Deserialize, Serialize};

use super::problems::Problems;
use super::syntax::{check_api_version, check_dns_label};
use super::{ByteSize, Expressions};

/// How much of each object a message carries.
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PayloadMode {
    /// The whole object without `metadata.managedFields` (and without the `drop` paths).
    #[default]
    Full,
    /// Metadata only: the watch asks for `PartialObjectMetadata`, so nothing else crosses the
    /// wire; the message's object is `{apiVersion, kind, metadata}`.
    Metadata,
    /// Only the JSON pointers in `fields` (plus `apiVersion`, `kind` and the identifying
    /// metadata: name, namespace, uid, resourceVersion, labels).
    Fields,
}

/// One `[[resources]]` entry: a kind to watch (built-in or custom), resolved through API
/// discovery.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// `apiVersion` of the kind as Kubernetes writes it: `v1` (the core group), `apps/v1`,
    /// `example.com/v1alpha1`. Any other spelling (`/v1`, `v1/`, whitespace) is an error.
    pub api_version: String,
    /// PascalCase kind: `Pod`, `Deployment`, a CRD's kind.
    pub kind: String,
    /// Namespaces to watch (one watch each). Empty (default): all namespaces, or the
    /// cluster scope for cluster-scoped kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Label selector passed to the API server (`app=web,tier in (a,b)`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// Field selector passed to the API server (`metadata.name=web`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<String>,
    /// A CEL expression over the object (`object`, `cluster`, `kind`, `ns`): only the
    /// objects it gives `true` for are followed; one that stops matching is sent as `deleted`
    /// with `reason: "leftFilter"`, one that starts matching as `added`. An evaluation error
    /// (a missing field, a type mismatch) is no match, counted in
    /// `kubesink_filter_errors_total`. E.g. `!(has(object.status.phase) &&
    /// object.status.phase in ["Succeeded", "Failed"])`. See docs/configuration.md,
    /// "Filters". Default: none (every object the selectors return).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Payload mode: `full` (default), `metadata` or `fields`.
    #[serde(default)]
    pub payload: PayloadMode,
    /// With `payload = "fields"`: JSON pointers (RFC 6901) to keep, e.g. `/spec/nodeName`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// JSON pointers removed from every emitted object, on top of `/metadata/managedFields`
    /// which is always removed. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
    /// The paths an `updated` message's `changed` names when their value changed: JSONPath
    /// queries (RFC 9535) without the leading `$`, e.g. `spec.replicas`,
    /// `spec.template.spec.containers[*].image`, `metadata.labels['app']`; at most 8
    /// (each keeps a 16-bit fingerprint per object). Default (empty): the object's
    /// top-level sections, `metadata.labels`, `metadata.annotations`,
    /// `metadata.ownerReferences`, `metadata` (the rest), `spec`, `status`, `data` and `*`
    /// (any other top-level field). See docs/message-contract.md, "changed".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub change_paths: Vec<String>,
    /// Paths (as `change_paths`) whose changes alone send nothing: an update that changes
    /// only values these select is not emitted (its resourceVersion is still recorded, so
    /// it is not sent later either), and is counted in `kubesink_updates_ignored_total`.
    /// E.g. `["status"]` for spec and metadata changes only. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_changes: Vec<String>,
    /// Paths (as `change_paths`) whose old and new values an `updated` carries in `changes`
    /// (`[{path, old, new}]`) when they changed: small fields such as `spec.replicas`, an
    /// image, `status.phase`; at most 8. Each object keeps its values as JSON text, within
    /// `change_value_max_bytes` per path and `change_values_max_bytes` per object; a value
    /// beyond either bound is reported as changed without it. Not kept in the saved state:
    /// after a restart a key's first update has no `changes`. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub change_values: Vec<String>,
    /// The most bytes of JSON one `change_values` path's value may take to be kept and sent
    /// (a size: `64`, `"1KiB"`; 1 byte to 64 KiB). Default 64.
    #[serde(default = "default_change_value_max_bytes")]
    pub change_value_max_bytes: ByteSize,
    /// The most bytes of `change_values` kept per object, all paths together, filled in the
    /// configured order (1 byte to 64 KiB). Default 256.
    #[serde(default = "default_change_values_max_bytes")]
    pub change_values_max_bytes: ByteSize,
    /// Emit `updated` messages. `false` gives adds and deletes only (the seed's
    /// `receiveUpdates=false`). Default `true`.
    #[serde(default = "yes")]
    pub updates: bool,
    /// For core/v1 Secrets only: emit `data` and `stringData`. Default `false`: they are
    /// removed before fingerprinting, so they never leave the process.
    #[serde(default)]
    pub allow_secret_data: bool,
    /// Page size (`limit`) of the initial list and relists. Default 500.
    #[serde(default = "default_page_size")]
    pub page_size: u32,
    /// The resource's plural name in API paths and RBAC rules (`pods`; a CRD's
    /// `spec.names.plural`). Read only by `kubesink rbac`, which works offline: by default it
    /// takes built-in kinds' plurals from k8s-openapi and guesses others the way Kubernetes'
    /// code generator does (`FooBar` → `foobars`, `Policy` → `policies`). Set it for a CRD
    /// whose plural differs. At run time API discovery is authoritative; a different plural
    /// is logged as a warning (the generated RBAC would not match). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plural: Option<String>,
}

fn yes() -> bool {
    true
}

fn default_page_size() -> u32 {
    500
}

fn default_change_value_max_bytes() -> ByteSize {
    ByteSize(64)
}

fn default_change_values_max_bytes() -> ByteSize {
    ByteSize(256)
}

impl ResourceConfig {
    /// A resource with every option at its default.
    pub fn new(api_version: &str, kind: &str) -> Self {
        ResourceConfig {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespaces: Vec::new(),
            label_selector: None,
            field_selector: None,
            filter: None,
            payload: PayloadMode::Full,
            fields: Vec::new(),
            drop: Vec::new(),
            change_paths: Vec::new(),
            ignore_changes: Vec::new(),
            change_values: Vec::new(),
            change_value_max_bytes: default_change_value_max_bytes(),
            change_values_max_bytes: default_change_values_max_bytes(),
            updates: true,
            allow_secret_data: false,
            page_size: default_page_size(),
            plural: None,
        }
    }

    /// The `(group, version)` API discovery is asked for: `group/version`, or the core group
    /// (`""`) for a bare version. `check` accepts only well-formed apiVersions, so `v1` is
    /// the one spelling of the core group.
    pub fn group_version(&self) -> (&str, &str) {
        match self.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", self.api_version.as_str()),
        }
    }

    /// `apiVersion Kind`, used in logs and errors.
    pub fn display_name(&self) -> String {
        format!("{} {}", self.api_version, self.kind)
    }

    /// Problems serde cannot see, as `(key, message)` with keys under `at_key`
    /// (`resources.2`, `clusters.0.resources.1`): the entry's own, then its expressions'
    /// (`exprs`).
    pub fn problems(&self, at_key: &str, exprs: &dyn Expressions) -> Vec<(String, String)> {
        let at = |k: &str| format!("{at_key}.{k}");
        let mut problems = Problems::default();
        if let Err(why) = check_api_version(&self.api_version) {
            problems.add(at("api_version"),
                format!(
                    "{:?} is not an apiVersion: {why} (expected \"v1\" for the core group, or \"group/version\" such as \"apps/v1\")",
                    self.api_version
                ),
            );
        }
        if self.kind.is_empty() || !self.kind.chars().all(|c| c.is_ascii_alphanumeric()) {
            problems.add(
                at("kind"),
                format!(
                    "{:?} is not a Kind (expected e.g. \"Deployment\")",
                    self.kind
                ),
            );
        }
        if self.payload == PayloadMode::Fields && self.fields.is_empty() {
            problems.add(
                at("fields"),
                "payload = \"fields\" needs at least one JSON pointer in fields",
            );
        }
        if self.payload != PayloadMode::Fields && !self.fields.is_empty() {
            problems.add(
                at("fields"),
                "fields is only used with payload = \"fields\"",
            );
        }
        for (j, ptr) in self.fields.iter().enumerate() {
            if !ptr.starts_with('/') || ptr.len() < 2 {
                problems.add(
                    at(&format!("fields.{j}")),
                    format!("{ptr:?} is not a JSON pointer (RFC 6901), e.g. \"/spec/nodeName\""),
                );
            }
        }
        for (j, ptr) in self.drop.iter().enumerate() {
            if !ptr.starts_with('/') || ptr.len() < 2 {
                problems.add(
                    at(&format!("drop.{j}")),
                    format!(
                        "{ptr:?} is not a JSON pointer (RFC 6901), e.g. \"/status/conditions\""
                    ),
                );
            }
        }
        for (key, n) in [
            ("change_value_max_bytes", self.change_value_max_bytes),
            ("change_values_max_bytes", self.change_values_max_bytes),
        ] {
            if !(1..=65_536).contains(&n.0) {
                problems.add(at(key), format!("{} bytes; 1 byte to 64 KiB", n.0));
            }
        }
        for (key, set) in [
            ("change_paths", !self.change_paths.is_empty()),
            ("ignore_changes", !self.ignore_changes.is_empty()),
            ("change_values", !self.change_values.is_empty()),
        ] {
            if set && !self.updates {
                problems.add(
                    at(key),
                    "only applies with updates = true (no update is sent anyway)",
                );
            }
        }
        for (j, ns) in self.namespaces.iter().enumerate() {
            if let Err(why) = check_dns_label(ns) {
                problems.add(at(&format!("namespaces.{j}")), format!("{ns:?} {why}"));
            }
        }
        if self.page_size == 0 {
            problems.add(at("page_size"), "must be at least 1");
        }
        if let Some(plural) = &self.plural {
            if check_dns_label(plural).is_err() {
                problems.add(
                    at("plural"),
                    format!(
                        "{plural:?} is not a resource name: lowercase letters and digits, \
                         e.g. \"foobars\""
                    ),
                );
            }
        }
        if self.allow_secret_data && !(self.api_version == "v1" && self.kind == "Secret") {
            problems.add(at("allow_secret_data"), "only applies to v1 Secret");
        }
        problems.extend(exprs.resource(self, at_key));
        problems.into_vec()
    }
}

/// Problems of a whole `[[resources]]` list at `key` (`resources`): empty, a resource listed
/// twice, and each entry's own ([`ResourceConfig::problems`]).
pub fn list_problems(
    key: &str,
    resources: &[ResourceConfig],
    exprs: &dyn Expressions,
) -> Vec<(String, String)> {
    let mut problems = Problems::default();
    if resources.is_empty() {
        problems.add(key, format!("at least one [[{key}]] entry is required"));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, r) in resources.iter().enumerate() {
        problems.extend(r.problems(&format!("{key}.{i}"), exprs));
        if !seen.insert((r.api_version.clone(), r.kind.clone(), r.namespaces.clone())) {
            problems.add(
                format!("{key}.{i}"),
                format!("{} is listed twice", r.display_name()),
            );
        }
    }
    problems.into_vec()
}
