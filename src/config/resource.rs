//! `[[resources]]`: what to watch and how much of each object a message carries, and the
//! checks serde cannot express, beside the fields they check.

use serde::{Deserialize, Serialize};

use super::group::GroupSelector;
use super::problems::Problems;
use super::syntax::{check_api_version, check_dns_label};
use super::{ByteSize, Expressions, HumanDuration};

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

/// What each message of a resource says (`[[resources]] mode`).
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ResourceMode {
    /// The object's state (docs/message-contract.md): a fold of the messages is the cluster.
    #[default]
    Objects,
    /// Kubernetes Events as occurrences (docs/events.md): each message says what happened and
    /// how many times since the Event's previous message (`occurrences`), so a consumer can
    /// sum them. Only for `Event` of `events.k8s.io/v1` or `v1`.
    Events,
}

impl ResourceMode {
    /// The default, objects (what serialization and the selection fingerprint leave out).
    pub fn is_objects(&self) -> bool {
        *self == ResourceMode::Objects
    }
}

/// Context a resource's messages carry (`[[resources]] enrich`, docs/message-contract.md
/// "Context"), resolved from the cluster's owner index (`src/informer/owners.rs`).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Enrich {
    /// `owners` (the controller owners, nearest first: a Pod's ReplicaSet, then its
    /// Deployment) and `ownersComplete`; for an Event, its regarding object's. An owner's
    /// own owner is known when the cluster follows the owner's kind.
    Owner,
    /// `node`: a Pod's `spec.nodeName`; for an Event, its regarding Pod's (when the cluster
    /// follows Pods with their spec); with `node_labels`, `nodeLabels` too.
    Node,
    /// `namespaceLabels`: the `namespace_labels` of the object's namespace.
    Namespace,
}

/// Which Events that exist at a first start (no saved state) are sent (`[[resources]]
/// since`, with `mode = "events"`): those whose last occurrence is at most this old, or
/// all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Since {
    /// `"all"`: every Event the first list finds.
    All,
    /// A duration (`"5m"`; `"0"`: none of them).
    Within(HumanDuration),
}

impl Since {
    /// The default: Events that happened in the last five minutes.
    pub const DEFAULT: Since = Since::Within(HumanDuration::from_secs(300));
}

impl Serialize for Since {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Since::All => s.serialize_str("all"),
            Since::Within(d) => d.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Since {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(i64),
        }
        let duration = |v: serde_json::Value| {
            serde_json::from_value::<HumanDuration>(v)
                .map(Since::Within)
                .map_err(|e| serde::de::Error::custom(format!("{e} (or \"all\" for every Event)")))
        };
        match Raw::deserialize(d)? {
            Raw::Text(t) if t.trim() == "all" => Ok(Since::All),
            Raw::Text(t) => duration(t.into()),
            Raw::Number(n) => duration(n.into()),
        }
    }
}

impl schemars::JsonSchema for Since {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Since".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let duration = g.subschema_for::<HumanDuration>();
        schemars::json_schema!({
            "description": "\"all\", or a duration such as \"5m\" (\"0\": none).",
            "anyOf": [ { "const": "all" }, duration ]
        })
    }
}

/// One `[[resources]]` entry: a kind to watch (built-in or custom), resolved through API
/// discovery; or, in the group form (`group`, `kinds`), every kind an API group serves,
/// followed as the cluster adds and removes them (docs/configuration.md, "Whole API
/// groups").
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// `apiVersion` of the kind as Kubernetes writes it: `v1` (the core group), `apps/v1`,
    /// `example.com/v1alpha1`. Any other spelling (`/v1`, `v1/`, whitespace) is an error.
    /// Required with `kind`; not with `group`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// PascalCase kind: `Pod`, `Deployment`, a CRD's kind. Required with `api_version`;
    /// not with `group`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The group form: follow every kind this API group serves, each at the group's
    /// preferred version (`"example.com"`; `"core"` or `""` for the core group; `"*"`:
    /// every group). Kinds that cannot be listed and watched, and subresources, are left
    /// out; with `namespaces`, so are cluster-scoped kinds. A CRD installed, given a new
    /// version or deleted while kubesink runs is followed, moved or dropped within seconds
    /// (a watch of CustomResourceDefinitions, and API discovery every 5 minutes). Instead
    /// of `api_version` and `kind`. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// With the group form: only these kinds of the group (`["Widget", "Gadget"]`;
    /// `["*"]`, the default: all of them). Without `group`, `kinds = ["*"]` means every
    /// group (`group = "*"`): with `namespaces`, everything namespaced in them. Default:
    /// all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// With the group form: what not to follow, each a resource as `kubectl` names it:
    /// its plural or Kind (`"secrets"`, `"Lease"`: in any group), either with its group
    /// (`"events.events.k8s.io"`, `"leases.coordination.k8s.io"`; `"events.core"` for the
    /// core group's), or a whole group (`"*.coordination.k8s.io"`). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
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
    /// A CEL expression over the object (`object`, `cluster`, `kind`, `ns`; for Events also
    /// `reason`, `type` and `regarding`, whichever API they are read through): only the
    /// objects it gives `true` for are followed; one that stops matching is sent as `deleted`
    /// with `reason: "leftFilter"`, one that starts matching as `added`. An evaluation error
    /// (a missing field, a type mismatch) is no match, counted in
    /// `kubesink_filter_errors_total`. E.g. `!(has(object.status.phase) &&
    /// object.status.phase in ["Succeeded", "Failed"])`. See docs/configuration.md,
    /// "Filters". Default: none (every object the selectors return).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// What each message says: `objects` (default: the object's state) or `events`
    /// (Kubernetes Events as occurrences, with the count since the Event's previous message:
    /// docs/events.md; only for `Event` of `events.k8s.io/v1` or `v1`).
    #[serde(default, skip_serializing_if = "ResourceMode::is_objects")]
    pub mode: ResourceMode,
    /// With `mode = "events"`: at a first start (no saved state), the Events that already
    /// exist are sent when their last occurrence is at most this old (`"5m"`; `"0"`: none
    /// of them; `"all"`: every one); the others are recorded, so their later occurrences
    /// are sent. Never applies to an Event's update, nor to a start from saved state (which
    /// sends what happened since). Default `"5m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Since>,
    /// With `mode = "events"`: send a `deleted` when an Event leaves the cluster (its TTL
    /// expired: kube-apiserver's `--event-ttl`, 1 h by default). Default `false`: an
    /// Event's deletion is not an occurrence.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub send_deleted: bool,
    /// With `mode = "events"`: at most this many messages a second per Event `reason`, to
    /// each destination (a burst of as many at once). An occurrence beyond it waits in the
    /// destination's queue, where the later occurrences of the same Event fold into it (its
    /// `occurrences` adds them up): nothing is lost, the sums stay exact, and a storm of one
    /// reason neither floods the destination nor delays the other reasons. Default: none
    /// (the bound is the destination's own pace, through coalescing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_rate_limit: Option<u32>,
    /// Context each message carries: `"owner"` (`owners`, the chain of controller owners
    /// up to the top, and `ownersComplete`) and `"node"` (a Pod's node), for an Event those
    /// of the object it regards. Resolved from the kinds this cluster follows, never from an
    /// object cache: with `"owner"` the cluster's owner index watches the workload
    /// controllers (ReplicaSets, Deployments, StatefulSets, DaemonSets, Jobs, CronJobs)
    /// itself, metadata only, sending nothing; follow Pods for an Event's chain. See
    /// docs/message-contract.md, "Context". Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub enrich: Vec<Enrich>,
    /// With `enrich = ["namespace"]`: the labels of the object's namespace each message
    /// carries in `namespaceLabels` (label keys, e.g. `["team", "cost-centre"]`; 1 to 16),
    /// read from v1 Namespaces (watched for the owner index, metadata only, unless an entry
    /// follows them). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_labels: Vec<String>,
    /// With `enrich = ["node"]`: the labels of the object's node each message carries in
    /// `nodeLabels` (label keys, e.g. `["topology.kubernetes.io/zone",
    /// "node.kubernetes.io/instance-type"]`; 1 to 16), read from v1 Nodes (watched for the
    /// owner index, metadata only, unless an entry follows them). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_labels: Vec<String>,
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
            group: None,
            kinds: Vec::new(),
            exclude: Vec::new(),
            namespaces: Vec::new(),
            label_selector: None,
            field_selector: None,
            filter: None,
            mode: ResourceMode::Objects,
            since: None,
            send_deleted: false,
            reason_rate_limit: None,
            enrich: Vec::new(),
            namespace_labels: Vec::new(),
            node_labels: Vec::new(),
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

    /// With `mode = "events"`, which Events a first start sends ([`Since::DEFAULT`] unless
    /// set).
    pub fn since(&self) -> Since {
        self.since.unwrap_or(Since::DEFAULT)
    }

    /// `apiVersion Kind`, used in logs and errors; for the group form `group example.com`
    /// (`group * (kinds Widget, Gadget)`).
    pub fn display_name(&self) -> String {
        match self.selector() {
            None => format!("{} {}", self.api_version, self.kind),
            Some(s) => s.to_string(),
        }
    }

    /// For a group-form entry, the entry of one kind discovery found: its `api_version`,
    /// `kind` and `plural`, every other option kept; without namespaces for a
    /// cluster-scoped kind.
    pub fn for_kind(
        &self,
        api_version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
    ) -> ResourceConfig {
        let mut one = self.clone();
        one.api_version = api_version.to_owned();
        one.kind = kind.to_owned();
        one.group = None;
        one.kinds.clear();
        one.exclude.clear();
        one.plural = Some(plural.to_owned());
        if !namespaced {
            one.namespaces.clear();
        }
        one
    }

    /// In the group form (`group` or `kinds` set), which kinds it follows; `None` for one
    /// kind (`api_version` and `kind`).
    pub fn selector(&self) -> Option<GroupSelector> {
        if self.group.is_none() && self.kinds.is_empty() {
            return None;
        }
        let group = match self.group.as_deref().map(str::trim) {
            None | Some("*") => None,
            Some("core") => Some(String::new()),
            Some(g) => Some(g.to_owned()),
        };
        let kinds = (!self.kinds.is_empty() && !self.kinds.iter().any(|k| k == "*"))
            .then(|| self.kinds.clone());
        Some(GroupSelector {
            group,
            kinds,
            exclude: self.exclude.clone(),
            namespaced_only: !self.namespaces.is_empty(),
        })
    }

    /// Problems serde cannot see, as `(key, message)` with keys under `at_key`
    /// (`resources.2`, `clusters.0.resources.1`): the entry's own, then its expressions'
    /// (`exprs`).
    pub fn problems(&self, at_key: &str, exprs: &dyn Expressions) -> Vec<(String, String)> {
        let at = |k: &str| format!("{at_key}.{k}");
        let mut problems = Problems::default();
        if self.selector().is_some() {
            self.group_problems(&mut problems, &at);
        } else if self.api_version.is_empty() && self.kind.is_empty() {
            problems.add(
                at_key.to_owned(),
                "api_version and kind are required (e.g. api_version = \"apps/v1\", kind = \"Deployment\"), or group to follow a whole API group (group = \"example.com\")",
            );
        } else if let Err(why) = check_api_version(&self.api_version) {
            problems.add(at("api_version"),
                format!(
                    "{:?} is not an apiVersion: {why} (expected \"v1\" for the core group, or \"group/version\" such as \"apps/v1\")",
                    self.api_version
                ),
            );
        }
        let one_kind = self.selector().is_none() && !self.api_version.is_empty();
        if one_kind && self.kind.is_empty() {
            problems.add(
                at("kind"),
                "required, and not set (e.g. \"Deployment\"; or group instead of api_version, to follow a whole API group)",
            );
        } else if one_kind && !self.kind.chars().all(|c| c.is_ascii_alphanumeric()) {
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
        self.mode_problems(&mut problems, &at);
        self.enrich_problems(&mut problems, &at);
        problems.extend(exprs.resource(self, at_key));
        problems.into_vec()
    }
}

impl ResourceConfig {
    /// What the group form forbids or needs: not both forms at once, a group name, kinds
    /// spelt as Kinds, and none of the options that belong to one kind (`mode = "events"`,
    /// `enrich`, `plural`, `allow_secret_data`).
    fn group_problems(&self, problems: &mut Problems, at: &dyn Fn(&str) -> String) {
        for (key, set) in [
            ("api_version", !self.api_version.is_empty()),
            ("kind", !self.kind.is_empty()),
        ] {
            if set {
                problems.add(
                    at(key),
                    "not with group or kinds: an entry follows one kind (api_version and kind) or a whole API group (group, kinds)",
                );
            }
        }
        if let Some(why) = self.group.as_deref().and_then(super::group::group_problem) {
            problems.add(at("group"), why);
        }
        for (j, k) in self.kinds.iter().enumerate() {
            if k != "*" && (k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric())) {
                problems.add(
                    at(&format!("kinds.{j}")),
                    format!("{k:?} is not a Kind (expected e.g. \"Widget\", or \"*\" for all)"),
                );
            }
        }
        for (j, e) in self.exclude.iter().enumerate() {
            if e.trim().is_empty() || e.contains('/') || e.contains(char::is_whitespace) {
                problems.add(
                    at(&format!("exclude.{j}")),
                    format!("{e:?} is not a resource: a plural or Kind, \"plural.group\" or \"*.group\" (e.g. \"leases.coordination.k8s.io\")"),
                );
            }
        }
        for (key, set, why) in [
            ("mode", self.mode != ResourceMode::Objects, "mode = \"events\" follows the Event kind: list it on its own (api_version = \"events.k8s.io/v1\", kind = \"Event\") and exclude it here"),
            ("enrich", !self.enrich.is_empty(), "enrich is per kind: list the kind on its own entry (an entry of its own takes the kind out of the group's)"),
            ("plural", self.plural.is_some(), "API discovery names each kind's plural in the group form"),
        ] {
            if set {
                problems.add(at(key), why);
            }
        }
    }

    /// Whether its messages carry `enrich`'s `what`.
    pub fn enriches(&self, what: Enrich) -> bool {
        self.enrich.contains(&what)
    }

    /// Whether it is core v1 Pods.
    pub fn is_pods(&self) -> bool {
        self.api_version == "v1" && self.kind == "Pod"
    }

    /// Whether it is core v1 Namespaces.
    pub fn is_namespaces(&self) -> bool {
        self.api_version == "v1" && self.kind == "Namespace"
    }

    /// Whether it is core v1 Nodes.
    pub fn is_nodes(&self) -> bool {
        self.api_version == "v1" && self.kind == "Node"
    }

    /// What `enrich` cannot give: a node to other kinds than Pods and Events, a Pod's node
    /// without its spec.
    fn enrich_problems(&self, problems: &mut Problems, at: &dyn Fn(&str) -> String) {
        match (
            self.enriches(Enrich::Namespace),
            self.namespace_labels.len(),
        ) {
            (true, 0) => problems.add(
                at("namespace_labels"),
                "enrich = [\"namespace\"] needs the labels to carry: namespace_labels = [\"team\"]",
            ),
            (true, n) if n > 16 => {
                problems.add(at("namespace_labels"), format!("{n} labels; at most 16"))
            }
            (false, n) if n > 0 => problems.add(
                at("namespace_labels"),
                "only applies with enrich = [\"namespace\"]",
            ),
            _ => {}
        }
        match (self.enriches(Enrich::Node), self.node_labels.len()) {
            (true, n) if n > 16 => {
                problems.add(at("node_labels"), format!("{n} labels; at most 16"))
            }
            (false, n) if n > 0 => {
                problems.add(at("node_labels"), "only applies with enrich = [\"node\"]")
            }
            _ => {}
        }
        if !self.enriches(Enrich::Node) {
            return;
        }
        let events = self.mode == ResourceMode::Events;
        if !self.is_pods() && !events {
            problems.add(
                at("enrich"),
                format!(
                    "\"node\" is a Pod's (spec.nodeName) or an Event's regarding Pod's, not {}'s",
                    self.display_name()
                ),
            );
        }
        if self.is_pods() && self.payload == PayloadMode::Metadata {
            problems.add(
                at("enrich"),
                "\"node\" is read from the Pod's spec.nodeName, which payload = \"metadata\" does not read: use payload = \"fields\" (e.g. fields = [\"/metadata\", \"/spec/nodeName\"]) or \"full\"",
            );
        }
    }

    /// What `mode` forbids or needs: events mode takes Events only, and none of the options
    /// that shape an object's state; `since` and `send_deleted` belong to events mode.
    fn mode_problems(&self, problems: &mut Problems, at: &dyn Fn(&str) -> String) {
        if self.mode == ResourceMode::Objects {
            for (key, set) in [
                ("since", self.since.is_some()),
                ("send_deleted", self.send_deleted),
                ("reason_rate_limit", self.reason_rate_limit.is_some()),
            ] {
                if set {
                    problems.add(at(key), "only applies with mode = \"events\"");
                }
            }
            return;
        }
        if self.reason_rate_limit == Some(0) {
            problems.add(
                at("reason_rate_limit"),
                "must be at least 1 (messages a second per reason); leave it out for no limit",
            );
        }
        if !(self.kind == "Event" && matches!(self.api_version.as_str(), "v1" | "events.k8s.io/v1"))
        {
            problems.add(
                at("mode"),
                format!(
                    "mode = \"events\" follows Kubernetes Events, not {}: use api_version = \"events.k8s.io/v1\" (or \"v1\") and kind = \"Event\"",
                    self.display_name()
                ),
            );
        }
        for (key, set) in [
            ("payload", self.payload != PayloadMode::Full),
            ("fields", !self.fields.is_empty()),
            ("drop", !self.drop.is_empty()),
            ("change_paths", !self.change_paths.is_empty()),
            ("ignore_changes", !self.ignore_changes.is_empty()),
            ("change_values", !self.change_values.is_empty()),
            ("updates", !self.updates),
        ] {
            if set {
                problems.add(
                    at(key),
                    "not used with mode = \"events\": each message carries the occurrence (docs/events.md), and every new occurrence is an update",
                );
            }
        }
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
        if !seen.insert((r.display_name(), r.namespaces.clone())) {
            problems.add(
                format!("{key}.{i}"),
                format!("{} is listed twice", r.display_name()),
            );
        }
    }
    problems.into_vec()
}
