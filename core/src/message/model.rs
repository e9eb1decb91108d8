//! The types of topology message v1 a sink receives: [`Op`], [`MessageMeta`], [`Message`],
//! the routing [`Placeholder`]s and the header constants (the contract is
//! `docs/message-contract.md`; `encode.rs` builds them).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::resource::Resource;

/// The `content-type` header value of every kubesink payload: UTF-8 JSON, one topology
/// message v1 (see `docs/message-contract.md`).
pub const CONTENT_TYPE_JSON: &str = "application/json";

/// The name a sync marker carries in its key and [`MessageMeta::name`], and the token that
/// stands for `{name}` in its NATS subject. No Kubernetes object can have it (names are DNS
/// subdomains or path segments without `%`), and no escaped subject token can be it (the
/// subject escaping writes `%` only as `%XX` with two hex digits; `s` and `y` are not hex).
pub const SYNCED_NAME: &str = "%synced";

/// The kind of change a message reports. Serialized lowercase (`added`, `updated`,
/// `deleted`), and `synced` for the sync marker, the one control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// First sighting of an object (initial list, a watch ADDED, or a re-created object).
    Added,
    /// A known object whose emitted payload changed.
    Updated,
    /// The object is gone (watch DELETED, or inferred after a relist).
    Deleted,
    /// Not a change: a sync marker (`pipeline.sync_markers`), sent after every message of a
    /// list (initial list or relist) of one watch, to every destination of the resource.
    /// Its payload has no object; see [`Synced`] and `docs/message-contract.md`.
    Synced,
}

impl Op {
    /// The lowercase wire name: `added`, `updated`, `deleted` or `synced`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Added => "added",
            Op::Updated => "updated",
            Op::Deleted => "deleted",
            Op::Synced => "synced",
        }
    }

    /// Whether this is the sync marker (a control message, not a change of an object):
    /// never coalesced, sent to every partition (Kafka) or to the reserved subject (NATS).
    pub fn is_marker(self) -> bool {
        self == Op::Synced
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A placeholder of the sinks' destination templates (NATS subject, Kafka topic):
/// `{cluster}`, `{group}`, `{version}`, `{kind}`, `{resource}`, `{namespace}`, `{name}`.
/// One definition, so every sink resolves a placeholder the same way; each sink's template
/// dialect applies its own escaping rule to the value (see `crate::template`).
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
    /// Every placeholder, in documentation order.
    pub const ALL: [Placeholder; 7] = [
        Placeholder::Cluster,
        Placeholder::Group,
        Placeholder::Version,
        Placeholder::Kind,
        Placeholder::Resource,
        Placeholder::Namespace,
        Placeholder::Name,
    ];

    /// Parses a placeholder name without braces (`"kind"`); `None` if unknown.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The name without braces (`"kind"`).
    pub fn name(self) -> &'static str {
        match self {
            Placeholder::Cluster => "cluster",
            Placeholder::Group => "group",
            Placeholder::Version => "version",
            Placeholder::Kind => "kind",
            Placeholder::Resource => "resource",
            Placeholder::Namespace => "namespace",
            Placeholder::Name => "name",
        }
    }

    /// The unescaped value for a message; `None` only for `{namespace}` of a cluster-scoped
    /// object (each template dialect documents the token it writes instead).
    pub fn value(self, m: &MessageMeta) -> Option<&str> {
        let r = &*m.resource;
        Some(match self {
            Placeholder::Cluster => &r.cluster,
            Placeholder::Group => r.group_or_core(),
            Placeholder::Version => &r.version,
            Placeholder::Kind => &r.kind,
            Placeholder::Resource => &r.plural,
            Placeholder::Namespace => return m.namespace.as_deref(),
            Placeholder::Name => &m.name,
        })
    }
}

/// Routing and header facts about a message, so a sink never parses the payload.
///
/// Sinks render these as headers (Kafka record headers, NATS headers), see
/// [`Message::headers`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageMeta {
    /// Deterministic message id (32 lowercase hex digits); identical on redelivery.
    pub id: Box<str>,
    /// The id of the Kafka tombstone that follows a `deleted` message ([`tombstone_id`]);
    /// `None` for every other op.
    pub tombstone_id: Option<Box<str>>,
    /// The change kind.
    pub op: Op,
    /// The watched resource, shared by every message of it.
    pub resource: Arc<Resource>,
    /// Namespace; `None` for cluster-scoped objects. For a sync marker: the namespace its
    /// watch covers, `None` for a watch of all namespaces or of a cluster-scoped kind.
    pub namespace: Option<Box<str>>,
    /// Object name; [`SYNCED_NAME`] for a sync marker.
    pub name: Box<str>,
    /// Object uid; empty for a sync marker. The pipeline never coalesces two changes of a key
    /// whose uids differ (a re-created object).
    pub uid: Box<str>,
    /// The payload's `observedAt` (RFC 3339, UTC, milliseconds).
    pub observed_at: Box<str>,
    /// An `updated`'s `changed` (`None`: none in the payload), so a queue that coalesces two
    /// updates of a key can give the survivor the union ([`ChangedPaths`]).
    pub changed: Option<ChangedPaths>,
    /// The payload has `changes` (an `updated`'s old and new values), so a queue that
    /// coalesces two updates merges them without reading payloads that have none.
    pub has_changes: bool,
}

/// The `changed` of an `updated`: which of a resource's change paths changed since the
/// payload last sent for its key. A bit mask over `names` (bit `i` = `names[i]`, at most 8),
/// the resource's change paths in their order, shared by every message of the resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedPaths {
    /// Bit `i` set: `names[i]` changed.
    pub mask: u8,
    /// The resource's change paths.
    pub names: Arc<[Arc<str>]>,
}

impl ChangedPaths {
    /// The names of the paths that changed, in path order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.names
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < 8 && self.mask & (1 << i) != 0)
            .map(|(_, n)| &**n)
    }

    /// The paths of `self` or `other` (two updates of one key, `other` the earlier).
    pub fn union(&self, other: &ChangedPaths) -> ChangedPaths {
        ChangedPaths {
            mask: self.mask | other.mask,
            names: self.names.clone(),
        }
    }
}

impl serde::Serialize for ChangedPaths {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl MessageMeta {
    /// `observedAt` as milliseconds since the Unix epoch (the Kafka record timestamp);
    /// `None` when it does not parse as RFC 3339.
    pub fn observed_at_ms(&self) -> Option<i64> {
        let t = humantime::parse_rfc3339_weak(&self.observed_at).ok()?;
        let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
        i64::try_from(d.as_millis()).ok()
    }
}

/// One encoded topology message: key, payload bytes and header facts.
///
/// Cloning is cheap (reference counts only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The partition key ([`Resource::key`]). Every sink uses it for partitioning, ordering
    /// and compaction; see `docs/message-contract.md`.
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

    /// The headers every sink attaches, as `(name, value)` pairs in a fixed order: `op`,
    /// `kind`, `apiVersion`, `group` (the API group, empty for the core group), `cluster`,
    /// `namespace` (absent when the message has none), `name`, `key` (the message key),
    /// `content-type` and `id`. Values are never escaped.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let m = &*self.meta;
        let r = &*m.resource;
        [
            Some(("op", m.op.as_str())),
            Some(("kind", r.kind.as_str())),
            Some(("apiVersion", r.api_version.as_str())),
            Some(("group", r.group.as_str())),
            Some(("cluster", r.cluster.as_str())),
            m.namespace.as_deref().map(|ns| ("namespace", ns)),
            Some(("name", &*m.name)),
            Some(("key", &*self.key)),
            Some(("content-type", CONTENT_TYPE_JSON)),
            Some(("id", &*m.id)),
        ]
        .into_iter()
        .flatten()
    }
}
