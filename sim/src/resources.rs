//! The resource registry: which (group, version, plural) the simulator serves, with the
//! discovery fields of `metav1.APIResource` (name, singularName, namespaced, kind, verbs,
//! shortNames). Built-in types are fixed; CustomResourceDefinitions add and remove entries
//! (<https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/>).
//! This module never stores objects.

use std::sync::Arc;

use serde_json::{json, Value};

/// Errors turning a CustomResourceDefinition body into a resource type.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// A required CRD field (`spec.group`, `spec.names.plural`, …) is missing.
    #[error("CustomResourceDefinition is missing {0}")]
    MissingField(&'static str),
}

/// One served resource, e.g. `apps/v1 deployments`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// API group, "" for the core group.
    pub group: String,
    /// API version within the group, e.g. "v1".
    pub version: String,
    /// Plural resource name used in paths ("pods").
    pub plural: String,
    /// Singular name ("pod").
    pub singular: String,
    /// Kind ("Pod"); the list kind is `{kind}List`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Short names for kubectl ("po").
    pub short_names: Vec<String>,
    /// The CRD's `openAPIV3Schema` for this version, if any (custom resources only).
    pub schema: Option<Value>,
}

/// Registry key: "group/version/plural".
pub type ResourceKey = Arc<str>;

impl ResourceType {
    fn builtin(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        short: &[&str],
    ) -> Self {
        ResourceType {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            schema: None,
        }
    }

    /// `apiVersion` of the objects: "v1" or "group/version".
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The registry key "group/version/plural".
    pub fn key(&self) -> ResourceKey {
        Arc::from(format!("{}/{}/{}", self.group, self.version, self.plural))
    }

    /// Whether this is a custom resource (served because of a CRD).
    pub fn is_custom(&self) -> bool {
        self.schema.is_some() || !BUILTIN_GROUPS.contains(&self.group.as_str())
    }

    /// The `metav1.APIResource` discovery entry.
    pub fn discovery_entry(&self) -> Value {
        json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["create", "delete", "get", "list", "update", "watch"],
            "shortNames": self.short_names,
            "storageVersionHash": "",
        })
    }

    /// Builds the resource type a CustomResourceDefinition (apiextensions.k8s.io/v1) declares,
    /// using its first served version.
    pub fn from_crd(crd: &Value) -> Result<Self, ResourceError> {
        let spec = crd.get("spec").ok_or(ResourceError::MissingField("spec"))?;
        let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        let group = s(spec.get("group")).ok_or(ResourceError::MissingField("spec.group"))?;
        let names = spec
            .get("names")
            .ok_or(ResourceError::MissingField("spec.names"))?;
        let plural =
            s(names.get("plural")).ok_or(ResourceError::MissingField("spec.names.plural"))?;
        let kind = s(names.get("kind")).ok_or(ResourceError::MissingField("spec.names.kind"))?;
        let singular = s(names.get("singular")).unwrap_or_else(|| kind.to_lowercase());
        let short_names = names
            .get("shortNames")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let versions = spec.get("versions").and_then(Value::as_array);
        let version = versions
            .and_then(|vs| {
                vs.iter()
                    .find(|v| v.get("served").and_then(Value::as_bool).unwrap_or(true))
            })
            .ok_or(ResourceError::MissingField("spec.versions"))?;
        let version_name =
            s(version.get("name")).ok_or(ResourceError::MissingField("spec.versions[].name"))?;
        let schema = version
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .unwrap_or_else(
                || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        Ok(ResourceType {
            group,
            version: version_name,
            plural,
            singular,
            kind,
            namespaced: spec.get("scope").and_then(Value::as_str) != Some("Cluster"),
            short_names,
            schema: Some(schema),
        })
    }
}

const BUILTIN_GROUPS: &[&str] = &[
    "",
    "apps",
    "apiextensions.k8s.io",
    "coordination.k8s.io",
    "events.k8s.io",
];

/// The set of served resources, in registration order.
#[derive(Debug, Clone)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
}

impl Default for Registry {
    /// The built-in resources: v1 pods, services, configmaps, secrets, nodes, namespaces,
    /// events; apps/v1 deployments, replicasets; apiextensions.k8s.io/v1
    /// customresourcedefinitions; coordination.k8s.io/v1 leases (leader election);
    /// events.k8s.io/v1 events (the newer Event API beside core v1 events).
    fn default() -> Self {
        let b = ResourceType::builtin;
        let types = vec![
            b("", "v1", "pods", "Pod", true, &["po"]),
            b("", "v1", "services", "Service", true, &["svc"]),
            b("", "v1", "configmaps", "ConfigMap", true, &["cm"]),
            b("", "v1", "secrets", "Secret", true, &[]),
            b("", "v1", "nodes", "Node", false, &["no"]),
            b("", "v1", "namespaces", "Namespace", false, &["ns"]),
            b("", "v1", "events", "Event", true, &["ev"]),
            b("apps", "v1", "deployments", "Deployment", true, &["deploy"]),
            b("apps", "v1", "replicasets", "ReplicaSet", true, &["rs"]),
            b(
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                "CustomResourceDefinition",
                false,
                &["crd", "crds"],
            ),
            b("coordination.k8s.io", "v1", "leases", "Lease", true, &[]),
            b("events.k8s.io", "v1", "events", "Event", true, &["ev"]),
        ];
        Registry {
            types: types.into_iter().map(Arc::new).collect(),
        }
    }
}

impl Registry {
    /// Looks a resource up by the path segments `group`, `version`, `plural`.
    pub fn by_path(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
    }

    /// Looks a resource up by `apiVersion` ("v1", "apps/v1") and `kind`.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.kind == kind)
            .cloned()
    }

    /// All resources of one group/version (for `APIResourceList`).
    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.types
            .iter()
            .filter(|t| t.group == group && t.version == version)
            .cloned()
            .collect()
    }

    /// Distinct non-core (group, version) pairs in registration order.
    pub fn group_versions(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for t in &self.types {
            if !t.group.is_empty() && !out.iter().any(|(g, v)| *g == t.group && *v == t.version) {
                out.push((t.group.clone(), t.version.clone()));
            }
        }
        out
    }

    /// Adds (or replaces) a resource type.
    pub fn register(&mut self, t: ResourceType) -> Arc<ResourceType> {
        let t = Arc::new(t);
        self.types
            .retain(|x| !(x.group == t.group && x.version == t.version && x.plural == t.plural));
        self.types.push(t.clone());
        t
    }

    /// Removes a resource type; returns it if it was registered.
    pub fn unregister(
        &mut self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceType>> {
        let found = self.by_path(group, version, plural)?;
        self.types.retain(|x| !Arc::ptr_eq(x, &found));
        Some(found)
    }
}
