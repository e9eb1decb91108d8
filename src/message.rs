//! Topology message v1: the contract downstream teams code against
//! (`docs/message-contract.md`, schema `docs/topology-message-v1.schema.json`).
//!
//! This module owns the message's shape, its partition key and its deterministic id, and
//! the oversize fallback (metadata-only form). It never decides what to emit: that is the
//! informer's job.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use kubesink_sinks::{Message, MessageMeta, Op};
use serde::Serialize;
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_128;

/// Identity of the watched kind, shared by every message of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindInfo {
    /// `cluster.name`.
    pub cluster: Arc<str>,
    /// API group (`""` for core).
    pub group: Arc<str>,
    /// Version (`v1`).
    pub version: Arc<str>,
    /// `apiVersion` (`apps/v1`, `v1`).
    pub api_version: Arc<str>,
    /// Kind (`Deployment`).
    pub kind: Arc<str>,
    /// Plural resource (`deployments`).
    pub resource: Arc<str>,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

/// One change the informer decided to emit, before encoding.
#[derive(Clone, Debug)]
pub struct Change<'a> {
    /// What happened.
    pub op: Op,
    /// Namespace, `None` for cluster-scoped objects.
    pub namespace: Option<&'a str>,
    /// Object name.
    pub name: &'a str,
    /// Object uid.
    pub uid: &'a str,
    /// resourceVersion of the observed state (for inferred deletes: the last one seen).
    pub resource_version: &'a str,
    /// Emitted during the informer's first list.
    pub initial: bool,
    /// A delete inferred after a relist or a uid change; the final state is unknown.
    pub final_state_unknown: bool,
    /// The shaped object; `None` when `final_state_unknown`.
    pub object: Option<&'a Value>,
}

/// The wire form (serde field order is the documented order).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Wire<'a> {
    id: &'a str,
    op: Op,
    cluster: &'a str,
    api_version: &'a str,
    kind: &'a str,
    resource: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    name: &'a str,
    uid: &'a str,
    resource_version: &'a str,
    initial: bool,
    final_state_unknown: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
    observed_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    object: Option<&'a Value>,
}

/// The partition key: `{cluster}/{group or "core"}/{Kind}/{namespace}/{name}`, namespace empty
/// for cluster-scoped objects (`prod/core/Node//node-1`). Group and kind are part of it, so a
/// Deployment and an HPA named `web` never share a key. None of the parts can contain `/`
/// (Kubernetes names and namespaces cannot; `cluster.name` is checked).
pub fn message_key(k: &KindInfo, namespace: Option<&str>, name: &str) -> String {
    let group = if k.group.is_empty() { "core" } else { &k.group };
    format!(
        "{}/{}/{}/{}/{}",
        k.cluster,
        group,
        k.kind,
        namespace.unwrap_or(""),
        name
    )
}

/// The deterministic message id: 32 lowercase hex digits of XXH3-128 over cluster, group,
/// kind, namespace, name, uid, resourceVersion, op and `finalStateUnknown`. The same change
/// observed again (redelivery, a restart replaying it) gets the same id.
pub fn message_id(k: &KindInfo, c: &Change<'_>) -> String {
    let mut buf = String::with_capacity(160);
    for part in [
        &*k.cluster,
        &*k.group,
        &*k.kind,
        c.namespace.unwrap_or(""),
        c.name,
        c.uid,
        c.resource_version,
        c.op.as_str(),
        if c.final_state_unknown { "fsu" } else { "" },
    ] {
        buf.push_str(part);
        buf.push('\u{0}');
    }
    format!("{:032x}", xxh3_128(buf.as_bytes()))
}

/// RFC 3339 UTC with milliseconds (`2026-11-29T15:54:42.123Z`).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Encodes a change into the sink [`Message`].
///
/// # Errors
/// Only if serde_json fails to write (non-string map keys cannot occur in a `Value`), which
/// is reported rather than unwrapped.
pub fn encode(
    k: &KindInfo,
    c: &Change<'_>,
    observed_at: &str,
) -> Result<Message, serde_json::Error> {
    let id = message_id(k, c);
    let payload = serde_json::to_vec(&Wire {
        id: &id,
        op: c.op,
        cluster: &k.cluster,
        api_version: &k.api_version,
        kind: &k.kind,
        resource: &k.resource,
        namespace: c.namespace,
        name: c.name,
        uid: c.uid,
        resource_version: c.resource_version,
        initial: c.initial,
        final_state_unknown: c.final_state_unknown,
        truncated: false,
        observed_at,
        object: c.object,
    })?;
    Ok(Message {
        key: message_key(k, c.namespace, c.name).into(),
        payload: Bytes::from(payload),
        meta: Arc::new(MessageMeta {
            id: id.into(),
            op: c.op,
            cluster: k.cluster.clone(),
            group: k.group.clone(),
            version: k.version.clone(),
            api_version: k.api_version.clone(),
            kind: k.kind.clone(),
            resource: k.resource.clone(),
            namespace: c.namespace.map(Arc::from),
            name: c.name.into(),
        }),
    })
}

/// The shared oversize policy: re-encodes `msg` with `"truncated": true` and its object
/// reduced per `level` (`{apiVersion, kind, metadata}`, or no object at all);
/// returns `None` when nothing can be removed any more. Same key, id and headers.
pub fn truncate(msg: &Message, level: TruncateLevel) -> Option<Message> {
    let mut v: Value = serde_json::from_slice(&msg.payload).ok()?;
    let map = v.as_object_mut()?;
    map.insert("truncated".into(), Value::Bool(true));
    match level {
        TruncateLevel::MetadataOnly => {
            let obj = map.get_mut("object")?.as_object_mut()?;
            obj.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
        }
        TruncateLevel::NoObject => {
            map.remove("object");
        }
    }
    let payload = serde_json::to_vec(&v).ok()?;
    Some(Message {
        key: msg.key.clone(),
        payload: Bytes::from(payload),
        meta: msg.meta.clone(),
    })
}

/// How far [`truncate`] reduces a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruncateLevel {
    /// Keep `apiVersion`, `kind` and `metadata` of the object.
    MetadataOnly,
    /// Drop the object entirely.
    NoObject,
}
