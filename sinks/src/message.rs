//! The encoded message a sink receives. Built once by the pipeline and shared by every sink
//! (payload and strings are reference-counted), so fan-out to N sinks does not copy payloads.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

/// The `content-type` header value of every kubesink payload: UTF-8 JSON, one topology
/// message v1 (see `docs/message-contract.md`).
pub const CONTENT_TYPE_JSON: &str = "application/json";

/// The kind of change a message reports. Serialized lowercase (`added`, `updated`, `deleted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// First sighting of an object (initial list, a watch ADDED, or a re-created object).
    Added,
    /// A known object whose emitted payload changed.
    Updated,
    /// The object is gone (watch DELETED, or inferred after a relist).
    Deleted,
}

impl Op {
    /// The lowercase wire name: `added`, `updated` or `deleted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Added => "added",
            Op::Updated => "updated",
            Op::Deleted => "deleted",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A placeholder of the sinks' destination templates (NATS subject, Kafka topic):
/// `{cluster}`, `{group}`, `{version}`, `{kind}`, `{resource}`, `{namespace}`, `{name}`.
/// One definition, so every sink resolves a placeholder the same way; each sink applies its own
/// escaping rule to the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placeholder {
    /// `{cluster}`: `cluster.name`.
    Cluster,
    /// `{group}`: the API group, `core` for the core group.
    Group,
    /// `{version}`: the API version (`v1`).
    Version,
    /// `{kind}`: the kind (`Deployment`).
    Kind,
    /// `{resource}`: the plural resource (`deployments`).
    Resource,
    /// `{namespace}`: the namespace; none for cluster-scoped objects.
    Namespace,
    /// `{name}`: the object name.
    Name,
}

impl Placeholder {
    /// Parses a placeholder name without braces (`"kind"`); `None` if unknown.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "cluster" => Placeholder::Cluster,
            "group" => Placeholder::Group,
            "version" => Placeholder::Version,
            "kind" => Placeholder::Kind,
            "resource" => Placeholder::Resource,
            "namespace" => Placeholder::Namespace,
            "name" => Placeholder::Name,
            _ => return None,
        })
    }

    /// The unescaped value for a message; `None` only for `{namespace}` of a cluster-scoped
    /// object (each sink documents the token it writes instead).
    pub fn value(self, m: &MessageMeta) -> Option<&str> {
        Some(match self {
            Placeholder::Cluster => &m.cluster,
            Placeholder::Group if m.group.is_empty() => "core",
            Placeholder::Group => &m.group,
            Placeholder::Version => &m.version,
            Placeholder::Kind => &m.kind,
            Placeholder::Resource => &m.resource,
            Placeholder::Namespace => return m.namespace.as_deref(),
            Placeholder::Name => &m.name,
        })
    }
}

/// Routing and header facts about a message, so a sink never parses the payload.
///
/// Sinks render these as headers (Kafka record headers, NATS headers): `op`, `kind`,
/// `apiVersion`, `cluster`, `namespace` (absent for cluster-scoped objects), `name`,
/// `content-type` and `id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageMeta {
    /// Deterministic message id (32 lowercase hex digits); identical on redelivery.
    pub id: Arc<str>,
    /// The change kind.
    pub op: Op,
    /// `cluster.name` from the configuration.
    pub cluster: Arc<str>,
    /// API group, empty for the core group.
    pub group: Arc<str>,
    /// API version without the group (`v1`).
    pub version: Arc<str>,
    /// `apiVersion` as Kubernetes writes it (`apps/v1`, `v1`).
    pub api_version: Arc<str>,
    /// PascalCase kind (`Deployment`).
    pub kind: Arc<str>,
    /// Plural resource name (`deployments`).
    pub resource: Arc<str>,
    /// Namespace; `None` for cluster-scoped objects.
    pub namespace: Option<Arc<str>>,
    /// Object name.
    pub name: Arc<str>,
}

/// One encoded topology message: key, payload bytes and header facts.
///
/// Cloning is cheap (reference counts only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The partition key: `{cluster}/{group or "core"}/{Kind}/{namespace}/{name}` (namespace
    /// empty for cluster-scoped objects). Every sink uses it for partitioning, ordering and
    /// compaction; see `docs/message-contract.md`.
    pub key: Arc<str>,
    /// The JSON payload: one topology message v1, UTF-8, no trailing newline.
    pub payload: Bytes,
    /// Header and routing facts.
    pub meta: Arc<MessageMeta>,
}

impl Message {
    /// Bytes this message holds in memory (key + payload), the unit of
    /// `pipeline.max_pending_bytes` and `pipeline.max_batch_bytes`.
    pub fn size(&self) -> usize {
        self.key.len() + self.payload.len()
    }

    /// The headers every sink attaches, as `(name, value)` pairs in a fixed order.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let m = &*self.meta;
        [
            Some(("op", m.op.as_str())),
            Some(("kind", &*m.kind)),
            Some(("apiVersion", &*m.api_version)),
            Some(("cluster", &*m.cluster)),
            m.namespace.as_deref().map(|ns| ("namespace", ns)),
            Some(("name", &*m.name)),
            Some(("content-type", CONTENT_TYPE_JSON)),
            Some(("id", &*m.id)),
        ]
        .into_iter()
        .flatten()
    }
}
