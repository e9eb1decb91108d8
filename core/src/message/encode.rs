//! The payload of topology message v1: field order, the deterministic id and the oversize
//! forms (metadata-only, then no object), and the sync marker's payload. See
//! `docs/message-contract.md`.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_128;

use super::context::{Context, Labels, OwnerRef};
use super::model::{ChangedPaths, Message, MessageMeta, Op, SYNCED_NAME};
use super::resource::Resource;

/// A serialized JSON object: the shaped object a message carries, written verbatim into the
/// payload (so the informer serializes each object once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectJson(Box<str>);

impl ObjectJson {
    /// Wraps text the caller produced as one JSON object (the informer's shaper, which writes
    /// it with serde_json and raw fields the API server sent). Not checked: invalid text would
    /// make invalid payloads.
    pub fn from_trusted(text: String) -> Self {
        ObjectJson(text.into_boxed_str())
    }

    /// Serializes a `Value`.
    pub fn from_value(v: &Value) -> Self {
        ObjectJson(v.to_string().into_boxed_str())
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The object parsed back (for tests and diagnostics; `Null` if it does not parse).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

/// One change the informer decided to emit, before encoding.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// What happened.
    pub op: Op,
    /// Namespace, `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
    /// Object uid.
    pub uid: String,
    /// resourceVersion of the observed state (for inferred deletes: the last one seen).
    pub resource_version: String,
    /// Emitted during the informer's first list.
    pub initial: bool,
    /// A delete inferred after a relist or a uid change; the final state is unknown.
    pub final_state_unknown: bool,
    /// The shaped object; `None` when `final_state_unknown`.
    pub object: Option<ObjectJson>,
    /// For an `added`: a destination may already hold this object (this uid), so what it
    /// last received of the key may say "present". True for an `added` re-sent after a
    /// restart, a crash or a hand-over (a restored key the saved state holds as sent but
    /// unconfirmed) and for every `added` of a process's first list (a previous run or
    /// leader may have delivered it). The pipeline never cancels such an `added` against a
    /// later `deleted` of the same uid (`pipeline/queue.rs`): the `deleted` must reach the
    /// destination. Not part of the message; ignored for other ops.
    pub may_be_held: bool,
    /// For a `deleted`: why, when it is not that the object is gone from the cluster (the
    /// `reason` field of the message; absent otherwise).
    pub reason: Option<DeleteReason>,
    /// For an `added` emitted right after the inferred `deleted` of another uid under the
    /// same name (the object was re-created unseen, e.g. while kubesink was down): that uid,
    /// the message's `replacedUid`, also part of its `id` ([`message_id`]). The previous
    /// run may have sent this very `added` before the `deleted` it now follows; with the
    /// same id a JetStream stream drops it as a duplicate within its `duplicate_window`
    /// and the key's last message says "deleted". `None` otherwise.
    pub replaced_uid: Option<String>,
    /// For an `updated`: the resource's change paths whose value changed since the payload
    /// last sent for the key (the message's `changed`, in the order the paths are
    /// configured; see `docs/message-contract.md`); `None` when unknown (state restored from
    /// an older kubesink, or no path saw the change), and for every other op.
    pub changed: Option<ChangedPaths>,
    /// For an `updated` of a resource with `change_values`: the message's `changes`, a JSON
    /// array of `{path, old, new}` (old and new as JSON; either absent when unknown or beyond
    /// the byte bound), one per such path that changed. `None` when none did, and for every
    /// other op.
    pub changes: Option<String>,
    /// For an `added` or `updated` of an Event occurrence (a resource in events mode,
    /// [`Resource::events`]): how many times the Event happened since its previous message
    /// (its whole count on its first), the message's `occurrences`. `None` for objects.
    pub occurrences: Option<u64>,
    /// With `[[resources]] enrich`: the object's owners and node (the message's `owners`,
    /// `ownersComplete` and `node`); `None` without it.
    pub context: Option<Arc<Context>>,
}

/// Why a `deleted` was sent when the object is still in the cluster: the message's `reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DeleteReason {
    /// `leftSelector`: the object stopped matching the resource's label or field selector.
    /// The API server's watch sends such an object as DELETED, with its content before the
    /// change that made it leave (`k8s.io/apiserver` cacher, `convertToWatchEvent`); kubesink
    /// found it still in the cluster, with the same uid, by a LIST of that one name without
    /// the selectors.
    LeftSelector,
    /// `leftFilter`: the object stopped matching the resource's CEL `filter`; the message
    /// carries its state after the change that made it leave.
    LeftFilter,
}

/// The wire form (serde field order is the documented order).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Wire<'a> {
    id: &'a str,
    op: Op,
    key: &'a str,
    cluster: &'a str,
    group: &'a str,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<DeleteReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replaced_uid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    changed: Option<&'a ChangedPaths>,
    #[serde(skip_serializing_if = "Option::is_none")]
    changes: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    occurrences: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owners: Option<&'a [OwnerRef]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owners_complete: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_labels: Option<Labels<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace_labels: Option<Labels<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
    observed_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    leader_epoch: Option<u64>,
}

/// The end of one list (initial list or relist) of one watch, as a sync marker reports it:
/// every message of the list was queued before the marker, for every sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Synced {
    /// The namespace the watch covers; `None` for all namespaces or a cluster-scoped kind.
    pub namespace: Option<String>,
    /// Objects the informer knows after the list (the live objects of the watch).
    pub count: u64,
    /// The list's resourceVersion (see the informer's `Decider` for how it is obtained).
    pub resource_version: String,
    /// `true` when the list emitted every live object (`initial: true` messages): the
    /// informer had no usable saved state. `false` when it emitted differences only (a relist,
    /// or a start from saved state), deletes included.
    pub initial: bool,
}

/// What a sync marker covers, as its `scope` field says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SyncScope {
    /// One namespace (the marker's `namespace` field).
    Namespace,
    /// Every namespace of a namespaced kind.
    AllNamespaces,
    /// A cluster-scoped kind.
    Cluster,
}

impl SyncScope {
    /// The scope of a watch of `resource` in `namespace` (`None`: all, or cluster scope).
    pub fn of(resource: &Resource, namespace: Option<&str>) -> Self {
        match (namespace, resource.namespaced) {
            (Some(_), _) => SyncScope::Namespace,
            (None, true) => SyncScope::AllNamespaces,
            (None, false) => SyncScope::Cluster,
        }
    }
}

/// The sync marker's wire form (serde field order is the documented order).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SyncedWire<'a> {
    id: &'a str,
    op: Op,
    key: &'a str,
    cluster: &'a str,
    group: &'a str,
    api_version: &'a str,
    kind: &'a str,
    resource: &'a str,
    scope: SyncScope,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    count: u64,
    resource_version: &'a str,
    initial: bool,
    observed_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    leader_epoch: Option<u64>,
}

/// The deterministic message id: 32 lowercase hex digits of XXH3-128 over cluster, group
/// (empty for core), kind, namespace, name, uid, resourceVersion, op and `finalStateUnknown`,
/// then, for an `added` with [`Change::replaced_uid`], that uid, each followed by a NUL byte.
/// The same change observed again (redelivery, a restart replaying it) gets the same id.
pub fn message_id(r: &Resource, c: &Change) -> String {
    change_id(r, c, c.op.as_str())
}

/// The `replacedUid` of `c`: only an `added` carries one.
fn replaced_uid(c: &Change) -> Option<&str> {
    c.replaced_uid.as_deref().filter(|_| c.op == Op::Added)
}

/// The id of the Kafka tombstone that follows a `deleted` message: [`message_id`]'s
/// derivation with the op token `tombstone` instead of the op, so a consumer that
/// deduplicates by id keeps both the `deleted` record and its tombstone. Deterministic like
/// the message id (a re-sent tombstone has the same id).
pub fn tombstone_id(r: &Resource, c: &Change) -> String {
    change_id(r, c, "tombstone")
}

/// The id of a change with `op_token` in the op's place (see [`message_id`]).
fn change_id(r: &Resource, c: &Change, op_token: &str) -> String {
    let parts = [
        r.cluster.as_str(),
        r.group.as_str(),
        r.kind.as_str(),
        c.namespace.as_deref().unwrap_or(""),
        &c.name,
        &c.uid,
        &c.resource_version,
        op_token,
        if c.final_state_unknown { "fsu" } else { "" },
    ];
    match replaced_uid(c) {
        Some(old) => id_of(&[&parts[..], &[old]].concat()),
        None => id_of(&parts),
    }
}

/// 32 lowercase hex digits of XXH3-128 over `parts`, each followed by a NUL byte.
fn id_of(parts: &[&str]) -> String {
    let mut buf = String::with_capacity(160);
    for part in parts {
        buf.push_str(part);
        buf.push('\u{0}');
    }
    format!("{:032x}", xxh3_128(buf.as_bytes()))
}

/// The sync marker's id: 32 lowercase hex digits of XXH3-128 over cluster, group, kind,
/// namespace (empty for all namespaces), `synced`, the list's resourceVersion, the count and
/// `initial` (`initial` or empty), each followed by a NUL byte. A redelivered marker has the
/// same id; two lists that saw the same objects at the same resourceVersion do too (nothing
/// changed between them, so treating the second as a repeat is right).
pub fn synced_id(r: &Resource, s: &Synced) -> String {
    id_of(&[
        r.cluster.as_str(),
        r.group.as_str(),
        r.kind.as_str(),
        s.namespace.as_deref().unwrap_or(""),
        Op::Synced.as_str(),
        &s.resource_version,
        &s.count.to_string(),
        if s.initial { "initial" } else { "" },
    ])
}

/// RFC 3339 UTC with milliseconds (`2026-11-29T15:54:42.123Z`), the form of `observedAt`.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Encodes a change of `resource` into the sink [`Message`], observed at `observed_at`
/// (RFC 3339, see [`now_rfc3339`]).
///
/// # Errors
/// Only if serde_json fails to write (non-string map keys cannot occur in a `Value`), which
/// is reported rather than unwrapped.
pub fn encode(
    resource: &Arc<Resource>,
    c: &Change,
    observed_at: &str,
) -> Result<Message, serde_json::Error> {
    encode_with_epoch(resource, c, observed_at, None)
}

/// [`encode`] by a leader of epoch `leader_epoch` (leader election: the Lease's
/// `leaseTransitions` when this replica took it), written as the payload's `leaderEpoch`.
/// A consumer drops a message whose `leaderEpoch` is below one it already applied for the
/// same key: a deposed leader's publishes that a client library wrote after its successor's
/// (`docs/consumers.md`). `None` (no leader election): no field.
///
/// # Errors
/// As [`encode`].
pub fn encode_with_epoch(
    resource: &Arc<Resource>,
    c: &Change,
    observed_at: &str,
    leader_epoch: Option<u64>,
) -> Result<Message, serde_json::Error> {
    let r = &**resource;
    let id = message_id(r, c);
    let key = r.key(c.namespace.as_deref(), &c.name);
    let object_len = c.object.as_ref().map_or(0, |o| o.as_str().len() + 12);
    // Written by kubesink's own serializer (`informer/changes.rs`); text that is not JSON
    // would be left out rather than written.
    let changes: Option<Box<RawValue>> = c
        .changes
        .as_ref()
        .filter(|_| c.op == Op::Updated)
        .and_then(|t| RawValue::from_string(t.clone()).ok());
    let mut payload = Vec::with_capacity(384 + object_len);
    serde_json::to_writer(
        &mut payload,
        &Wire {
            id: &id,
            op: c.op,
            key: &key,
            cluster: &r.cluster,
            group: &r.group,
            api_version: &r.api_version,
            kind: &r.kind,
            resource: &r.plural,
            namespace: c.namespace.as_deref(),
            name: &c.name,
            uid: &c.uid,
            resource_version: &c.resource_version,
            initial: c.initial,
            final_state_unknown: c.final_state_unknown,
            reason: c.reason.filter(|_| c.op == Op::Deleted),
            replaced_uid: replaced_uid(c),
            changed: changed(c),
            changes: changes.as_deref(),
            occurrences: c.occurrences.filter(|_| c.op != Op::Deleted),
            owners: c.context.as_ref().and_then(|x| x.owners.as_deref()),
            owners_complete: c
                .context
                .as_ref()
                .and_then(|x| x.owners.as_ref().map(|_| x.owners_complete)),
            node: c.context.as_ref().and_then(|x| x.node.as_deref()),
            node_labels: c
                .context
                .as_ref()
                .and_then(|x| x.node_labels.as_deref().map(Labels)),
            namespace_labels: c
                .context
                .as_ref()
                .and_then(|x| x.namespace_labels.as_deref().map(Labels)),
            truncated: false,
            observed_at,
            leader_epoch,
        },
    )?;
    // `object` (an Event occurrence's `event`) comes last: splice the shaped object's text
    // in before the closing brace.
    if let Some(object) = &c.object {
        payload.pop();
        payload.extend_from_slice(match r.events {
            true => b",\"event\":",
            false => b",\"object\":",
        });
        payload.extend_from_slice(object.as_str().as_bytes());
        payload.push(b'}');
    }
    Ok(Message {
        key: key.into(),
        payload: Bytes::from(payload),
        meta: Arc::new(MessageMeta {
            id: id.into(),
            tombstone_id: (c.op == Op::Deleted).then(|| tombstone_id(r, c).into()),
            op: c.op,
            resource: resource.clone(),
            namespace: c.namespace.as_deref().map(Into::into),
            name: c.name.as_str().into(),
            uid: c.uid.as_str().into(),
            observed_at: observed_at.into(),
            changed: changed(c).cloned(),
            has_changes: changes.is_some(),
        }),
    })
}

fn changed(c: &Change) -> Option<&ChangedPaths> {
    c.changed.as_ref().filter(|_| c.op == Op::Updated)
}

/// `msg` (an `updated`) with its `changed` replaced by `changed` (`None`: left out, unknown):
/// what a queue sends when it coalesces two updates of a key, the survivor naming the paths
/// of both (`pipeline/queue.rs`). Same key, id and headers. `msg` itself when its payload is
/// not a JSON object (never for kubesink's own messages).
pub fn with_changed(msg: &Message, changed: Option<ChangedPaths>) -> Message {
    let value = match &changed {
        Some(c) => match serde_json::to_string(c) {
            Ok(text) => Some(text),
            Err(_) => return msg.clone(),
        },
        None => None,
    };
    match with_field(msg, "changed", value) {
        Some(mut m) => {
            Arc::make_mut(&mut m.meta).changed = changed;
            m
        }
        None => msg.clone(),
    }
}

/// The `occurrences` of `msg` (an Event occurrence: [`Resource::events`]); `None` when it
/// has none (objects, a `deleted`) or its payload does not parse.
pub fn occurrences_of(msg: &Message) -> Option<u64> {
    if !msg.meta.resource.events {
        return None;
    }
    let text = std::str::from_utf8(&msg.payload).ok()?;
    let RawMap(fields) = serde_json::from_str(text).ok()?;
    let (_, raw) = fields.into_iter().find(|(k, _)| k == "occurrences")?;
    raw.get().parse().ok()
}

/// `msg` (an Event occurrence) with its `occurrences` set to `n`: what a queue sends when it
/// coalesces two occurrences of an Event, the survivor counting both (`pipeline/queue.rs`).
/// Same key, id and headers. `msg` itself when its payload is not a JSON object.
pub fn with_occurrences(msg: &Message, n: u64) -> Message {
    with_field(msg, "occurrences", Some(n.to_string())).unwrap_or_else(|| msg.clone())
}

/// `msg` with its optional top-level field `name` set to the JSON text `value` (placed
/// before `truncated` and `observedAt`, where the wire order has it) or, with `None`,
/// removed; `None` when the payload is not a JSON object or `value` not JSON.
fn with_field(msg: &Message, name: &'static str, value: Option<String>) -> Option<Message> {
    let text = std::str::from_utf8(&msg.payload).ok()?;
    let RawMap(mut fields) = serde_json::from_str(text).ok()?;
    let at = fields.iter().position(|(k, _)| k == name);
    match (value, at) {
        (Some(v), at) => {
            let value = RawValue::from_string(v).ok()?;
            match at {
                Some(i) => fields[i].1 = Cow::Owned(value),
                None => {
                    let before = fields
                        .iter()
                        .position(|(k, _)| k == "truncated" || k == "observedAt")
                        .unwrap_or(fields.len());
                    fields.insert(before, (Cow::Borrowed(name), Cow::Owned(value)));
                }
            }
        }
        (None, Some(i)) => drop(fields.remove(i)),
        (None, None) => {}
    }
    Some(Message {
        key: msg.key.clone(),
        payload: Bytes::from(write_map(&fields)),
        meta: msg.meta.clone(),
    })
}

/// Encodes the sync marker of a list of `resource` (see [`Synced`]), observed at
/// `observed_at`: op `synced`, key `{cluster}/{group}/{Kind}/{namespace}/%synced` (namespace
/// empty unless the watch covers one), name [`SYNCED_NAME`], no object.
///
/// # Errors
/// Only if serde_json fails to write, which cannot happen for these plain fields.
pub fn encode_synced(
    resource: &Arc<Resource>,
    s: &Synced,
    observed_at: &str,
) -> Result<Message, serde_json::Error> {
    encode_synced_with_epoch(resource, s, observed_at, None)
}

/// [`encode_synced`] by a leader of epoch `leader_epoch` (see [`encode_with_epoch`]).
///
/// # Errors
/// As [`encode_synced`].
pub fn encode_synced_with_epoch(
    resource: &Arc<Resource>,
    s: &Synced,
    observed_at: &str,
    leader_epoch: Option<u64>,
) -> Result<Message, serde_json::Error> {
    let r = &**resource;
    let id = synced_id(r, s);
    let namespace = s.namespace.as_deref();
    let key = r.key(namespace, SYNCED_NAME);
    let payload = serde_json::to_vec(&SyncedWire {
        id: &id,
        op: Op::Synced,
        key: &key,
        cluster: &r.cluster,
        group: &r.group,
        api_version: &r.api_version,
        kind: &r.kind,
        resource: &r.plural,
        scope: SyncScope::of(r, namespace),
        namespace,
        count: s.count,
        resource_version: &s.resource_version,
        initial: s.initial,
        observed_at,
        leader_epoch,
    })?;
    Ok(Message {
        key: key.into(),
        payload: Bytes::from(payload),
        meta: Arc::new(MessageMeta {
            id: id.into(),
            tombstone_id: None,
            op: Op::Synced,
            resource: resource.clone(),
            namespace: namespace.map(Into::into),
            name: SYNCED_NAME.into(),
            uid: "".into(),
            observed_at: observed_at.into(),
            changed: None,
            has_changes: false,
        }),
    })
}

/// The `changes` a queue sends when it coalesces `earlier` (an `updated` never sent) into
/// `later`, the update that replaces it: per path, the old value of the first and the new of
/// the last (a path whose value came back is left out); paths only one of them changed keep
/// their entry. `None` when `later` needs no rewrite; with `Some(None)` its `changes` go
/// (unknown: `earlier` was not an `updated`, so the sink never had the old values).
pub fn coalesce_changes(earlier: &Message, later: &Message) -> Option<Option<String>> {
    fn changes_of(m: &Message) -> Option<Vec<Value>> {
        if !m.meta.has_changes {
            return None;
        }
        let text = std::str::from_utf8(&m.payload).ok()?;
        let RawMap(fields) = serde_json::from_str(text).ok()?;
        let (_, raw) = fields.into_iter().find(|(k, _)| k == "changes")?;
        serde_json::from_str(raw.get()).ok()
    }
    if earlier.meta.op != Op::Updated {
        return later.meta.has_changes.then_some(None);
    }
    let earlier_changes = changes_of(earlier)?;
    let later_changes = changes_of(later);
    let path = |v: &Value| v.get("path").and_then(Value::as_str).map(str::to_owned);
    let mut merged: Vec<Value> = Vec::new();
    let later_changes = later_changes.unwrap_or_default();
    for l in &later_changes {
        let mut entry = l.clone();
        if let Some(e) = earlier_changes.iter().find(|e| path(e) == path(l)) {
            match (e.get("old"), entry.as_object_mut()) {
                (Some(old), Some(m)) => drop(m.insert("old".into(), old.clone())),
                (None, Some(m)) => drop(m.remove("old")),
                _ => {}
            }
            if entry.get("old").is_some() && entry.get("old") == entry.get("new") {
                continue; // changed and changed back
            }
        }
        merged.push(entry);
    }
    for e in &earlier_changes {
        if !later_changes.iter().any(|l| path(l) == path(e)) {
            merged.push(e.clone());
        }
    }
    Some((!merged.is_empty()).then(|| Value::Array(merged).to_string()))
}

/// `msg` (an `updated`) with its `changes` replaced by `changes` (JSON array text; `None`:
/// left out). Same key, id and headers. `msg` itself when its payload is not a JSON object.
pub fn with_changes(msg: &Message, changes: Option<String>) -> Message {
    let has_changes = changes.is_some();
    match with_field(msg, "changes", changes) {
        Some(mut m) => {
            Arc::make_mut(&mut m.meta).has_changes = has_changes;
            m
        }
        None => msg.clone(),
    }
}

/// How far [`truncate`] reduces a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruncateLevel {
    /// Keep `apiVersion`, `kind` and `metadata` of the object.
    MetadataOnly,
    /// Drop the object entirely.
    NoObject,
}

/// The shared oversize policy: re-encodes `msg` with `"truncated": true` and its object
/// reduced per `level` (`{apiVersion, kind, metadata}`, or no object at all); returns `None`
/// when nothing can be removed any more. Same key, id and headers. Works on the raw JSON
/// text of the envelope and the object, so an object of any depth can be truncated.
pub fn truncate(msg: &Message, level: TruncateLevel) -> Option<Message> {
    let text = std::str::from_utf8(&msg.payload).ok()?;
    let RawMap(mut fields) = serde_json::from_str(text).ok()?;
    let truncated = RawValue::from_string("true".to_owned()).ok()?;
    let object_at = fields.iter().position(|(k, _)| k == "object")?;
    match level {
        TruncateLevel::MetadataOnly => {
            let RawMap(obj) = serde_json::from_str(fields[object_at].1.get()).ok()?;
            let kept: Vec<_> = obj
                .into_iter()
                .filter(|(k, _)| matches!(&**k, "apiVersion" | "kind" | "metadata"))
                .collect();
            let reduced = RawValue::from_string(write_map(&kept)).ok()?;
            fields[object_at].1 = Cow::Owned(reduced);
        }
        TruncateLevel::NoObject => {
            fields.remove(object_at);
        }
    }
    match fields.iter().position(|(k, _)| k == "truncated") {
        Some(i) => fields[i].1 = Cow::Owned(truncated),
        None => {
            let at = fields
                .iter()
                .position(|(k, _)| k == "observedAt")
                .unwrap_or(fields.len());
            fields.insert(at, (Cow::Borrowed("truncated"), Cow::Owned(truncated)));
        }
    }
    Some(Message {
        key: msg.key.clone(),
        payload: Bytes::from(write_map(&fields)),
        meta: msg.meta.clone(),
    })
}

type RawField<'a> = (Cow<'a, str>, Cow<'a, RawValue>);

/// A JSON object's top-level fields in order, values as raw text.
struct RawMap<'a>(Vec<RawField<'a>>);

impl<'de> Deserialize<'de> for RawMap<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawMap<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawMap<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Cow<'de, str>>()? {
                    let v: &'de RawValue = map.next_value()?;
                    out.push((k, Cow::Borrowed(v)));
                }
                Ok(RawMap(out))
            }
        }
        d.deserialize_map(V).map_err(de::Error::custom)
    }
}

fn write_map(fields: &[RawField<'_>]) -> String {
    let mut out = String::with_capacity(
        fields
            .iter()
            .map(|(k, v)| k.len() + v.get().len() + 4)
            .sum::<usize>()
            + 2,
    );
    out.push('{');
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::String(k.to_string()).to_string());
        out.push(':');
        out.push_str(v.get());
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn change(op: Op, object: Option<Value>) -> Change {
        let object = object.as_ref().map(ObjectJson::from_value);
        Change {
            uid: "ef5a35d5-973f-4ec9-9925-a67e7648ea58".into(),
            resource_version: "17".into(),
            ..crate::message::fixtures::change(op, Some("default"), "web", object)
        }
    }

    #[test]
    fn a_context_writes_owners_then_whether_complete_then_the_node() {
        let r = Arc::new(Resource::new("prod", "", "v1", "Pod", "pods", true));
        let obj = json!({"apiVersion": "v1", "kind": "Pod"});
        let plain = encode(&r, &change(Op::Added, Some(obj.clone())), "t").unwrap();
        let v: Value = serde_json::from_slice(&plain.payload).unwrap();
        for field in [
            "owners",
            "ownersComplete",
            "node",
            "nodeLabels",
            "namespaceLabels",
        ] {
            assert!(v.get(field).is_none(), "{field} without enrich");
        }
        let rs = OwnerRef {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "web-7d9f".into(),
            uid: "u-rs".into(),
        };
        let c = Change {
            context: Some(Arc::new(Context {
                owners: Some(vec![rs]),
                owners_complete: false,
                node: Some("node-a".into()),
                namespace_labels: Some(vec![("team".into(), "pay".into())]),
                node_labels: Some(vec![("topology.kubernetes.io/zone".into(), "eu-1a".into())]),
            })),
            ..change(Op::Added, Some(obj))
        };
        let m = encode(&r, &c, "t").unwrap();
        let text = std::str::from_utf8(&m.payload).unwrap();
        assert!(
            text.contains(r#""owners":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-7d9f","uid":"u-rs"}],"ownersComplete":false,"node":"node-a","nodeLabels":{"topology.kubernetes.io/zone":"eu-1a"},"namespaceLabels":{"team":"pay"},"observedAt""#),
            "{text}"
        );
        // Context is not part of the id: the same change with or without it.
        assert_eq!(m.meta.id, plain.meta.id);
    }

    #[test]
    fn payload_fields_key_and_meta_follow_the_contract() {
        let r = Arc::new(Resource::new(
            "prod",
            "apps",
            "v1",
            "Deployment",
            "deployments",
            true,
        ));
        let obj = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}});
        let m = encode(
            &r,
            &change(Op::Updated, Some(obj)),
            "2026-11-30T00:00:00.000Z",
        )
        .unwrap();
        let text = std::str::from_utf8(&m.payload).unwrap();
        let order = [
            "id",
            "op",
            "key",
            "cluster",
            "group",
            "apiVersion",
            "kind",
            "resource",
            "namespace",
            "name",
            "uid",
            "resourceVersion",
            "initial",
            "finalStateUnknown",
            "observedAt",
            "object",
        ];
        let at: Vec<usize> = order
            .iter()
            .map(|f| {
                text.find(&format!("\"{f}\":"))
                    .unwrap_or_else(|| panic!("{f} in {text}"))
            })
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "field order: {text}");
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(v.as_object().unwrap().len(), order.len());
        assert_eq!(&*m.key, "prod/apps/Deployment/default/web");
        assert_eq!(
            (v["key"].as_str(), v["group"].as_str()),
            (Some(&*m.key), Some("apps"))
        );
        assert_eq!(v["id"], &*m.meta.id);
        assert_eq!(m.meta.id.len(), 32);
        assert!(Arc::ptr_eq(&m.meta.resource, &r));
    }

    #[test]
    fn the_id_is_stable_and_depends_on_every_input() {
        let r = Resource::new("prod", "", "v1", "Pod", "pods", true);
        let a = change(Op::Added, Some(json!({})));
        assert_eq!(message_id(&r, &a), message_id(&r, &a.clone()));
        let mut b = a.clone();
        b.resource_version = "18".into();
        assert_ne!(message_id(&r, &a), message_id(&r, &b));
        let mut c = a.clone();
        c.final_state_unknown = true;
        assert_ne!(message_id(&r, &a), message_id(&r, &c));
    }

    #[test]
    fn an_added_that_replaced_a_uid_names_it_and_has_its_own_id() {
        let r = Arc::new(Resource::new("prod", "", "v1", "Pod", "pods", true));
        let plain = change(Op::Added, Some(json!({})));
        let mut after = plain.clone();
        after.replaced_uid = Some("old-uid".into());
        let m = encode(&r, &after, "2026-12-05T00:00:00Z").unwrap();
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(v["replacedUid"], "old-uid");
        // The documented derivation: the usual parts, then the replaced uid.
        let by_hand = format!(
            "{:032x}",
            xxh3_128(b"prod\0\0Pod\0default\0web\0ef5a35d5-973f-4ec9-9925-a67e7648ea58\x0017\0added\0\0old-uid\0")
        );
        assert_eq!(v["id"], by_hand.as_str());
        assert_ne!(message_id(&r, &after), message_id(&r, &plain));
        // Only an `added` carries it.
        let mut deleted = change(Op::Deleted, None);
        deleted.replaced_uid = Some("old-uid".into());
        let v: Value = serde_json::from_slice(&encode(&r, &deleted, "t").unwrap().payload).unwrap();
        assert!(v.get("replacedUid").is_none());
        assert_eq!(
            message_id(&r, &deleted),
            message_id(&r, &change(Op::Deleted, None))
        );
    }

    #[test]
    fn the_id_does_not_depend_on_the_new_fields_and_a_tombstone_has_its_own() {
        let r = Arc::new(Resource::new("prod", "", "v1", "Pod", "pods", true));
        let d = change(Op::Deleted, None);
        // The documented derivation, written out: the new payload fields (key, group) are
        // not inputs, so ids of v1 messages are the same as before they were added.
        let by_hand = format!(
            "{:032x}",
            xxh3_128(b"prod\0\0Pod\0default\0web\0ef5a35d5-973f-4ec9-9925-a67e7648ea58\x0017\0deleted\0fsu\0")
        );
        assert_eq!(message_id(&r, &d), by_hand);
        let m = encode(&r, &d, "t").unwrap();
        let tomb = m.meta.tombstone_id.as_deref().unwrap();
        assert_eq!(tomb, tombstone_id(&r, &d));
        assert_eq!(tomb.len(), 32);
        assert_ne!(tomb, &*m.meta.id);
        let a = encode(&r, &change(Op::Added, Some(json!({}))), "t").unwrap();
        assert!(a.meta.tombstone_id.is_none(), "only deletes have one");
    }

    #[test]
    fn a_sync_marker_has_its_scope_count_and_no_object() {
        let r = Arc::new(Resource::new("prod", "", "v1", "Pod", "pods", true));
        let s = Synced {
            namespace: None,
            count: 3,
            resource_version: "42".into(),
            initial: true,
        };
        let m = encode_synced(&r, &s, "2026-11-30T00:00:00.000Z").unwrap();
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(v["op"], "synced");
        assert_eq!(v["scope"], "allNamespaces");
        assert_eq!(
            (v["count"].as_u64(), v["resourceVersion"].as_str()),
            (Some(3), Some("42"))
        );
        assert!(v.get("object").is_none() && v.get("namespace").is_none());
        assert_eq!(&*m.key, "prod/core/Pod//%synced");
        assert_eq!(
            (v["key"].as_str(), v["group"].as_str()),
            (Some(&*m.key), Some(""))
        );
        assert_eq!((m.meta.op, &*m.meta.name), (Op::Synced, SYNCED_NAME));
        assert_eq!(v["id"], synced_id(&r, &s));
        let one_ns = Synced {
            namespace: Some("web".into()),
            ..s.clone()
        };
        let m2 = encode_synced(&r, &one_ns, "t").unwrap();
        let v2: Value = serde_json::from_slice(&m2.payload).unwrap();
        assert_eq!(
            (v2["scope"].as_str(), v2["namespace"].as_str()),
            (Some("namespace"), Some("web"))
        );
        assert_ne!(m.meta.id, m2.meta.id);
        let node = Resource::new("prod", "", "v1", "Node", "nodes", false);
        assert_eq!(SyncScope::of(&node, None), SyncScope::Cluster);
        let relist = Synced {
            initial: false,
            ..s
        };
        assert_ne!(synced_id(&r, &relist), m.meta.id.to_string());
    }

    #[test]
    fn truncation_keeps_metadata_then_drops_the_object() {
        let r = Arc::new(Resource::new("prod", "", "v1", "Pod", "pods", true));
        let obj = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
                         "spec": {"big": "x".repeat(1000)}});
        let m = encode(&r, &change(Op::Added, Some(obj)), "t").unwrap();
        let meta_only = truncate(&m, TruncateLevel::MetadataOnly).unwrap();
        let text = std::str::from_utf8(&meta_only.payload).unwrap();
        assert!(text.find("\"truncated\":true").unwrap() < text.find("\"observedAt\"").unwrap());
        let v: Value = serde_json::from_slice(&meta_only.payload).unwrap();
        assert_eq!(v["truncated"], true);
        assert!(v["object"].get("spec").is_none());
        assert_eq!(v["object"]["metadata"]["name"], "web");
        let none = truncate(&meta_only, TruncateLevel::NoObject).unwrap();
        let v: Value = serde_json::from_slice(&none.payload).unwrap();
        assert!(v.get("object").is_none());
        assert_eq!((none.key.clone(), none.meta.clone()), (m.key, m.meta));
    }

    #[test]
    fn an_object_nested_thousands_of_levels_deep_can_be_truncated() {
        let r = Arc::new(Resource::new("prod", "", "v1", "Pod", "pods", true));
        let deep = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"d"}},"spec":{}1{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let mut c = change(Op::Added, None);
        c.final_state_unknown = false;
        c.object = Some(ObjectJson::from_trusted(deep));
        let m = encode(&r, &c, "t").unwrap();
        let small = truncate(&m, TruncateLevel::MetadataOnly).unwrap();
        let v: Value = serde_json::from_slice(&small.payload).unwrap();
        assert_eq!(v["object"]["metadata"]["name"], "d");
        assert_eq!(v["truncated"], true);
    }
}
