//! The fold itself: records in, the current view out, exactly as `docs/consumers.md` tells a
//! consumer to do it. Synchronous and I/O-free, so every rule has a unit test below.
//!
//! Per record, in order:
//! 1. A record without a value (a Kafka tombstone) deletes its key (the broker's record key).
//! 2. The value is one topology message v1 (a structured-mode CloudEvent is unwrapped to its
//!    `data`). Its key is the payload's `key` field when present, else derived from `cluster`,
//!    the group (`group` field, else the part of `apiVersion` before `/`, `core` when none),
//!    `kind`, `namespace` and `name`, as `docs/message-contract.md` defines it.
//! 3. A message whose `id` is the last id applied to its key is a redelivery: skipped
//!    (changes of one key arrive in order, so a copy always follows its original directly).
//! 4. A message whose `leaderEpoch` is below the highest one already seen for its key is a
//!    deposed leader's late publish (a client library wrote it after the successor's
//!    messages): skipped (`docs/consumers.md`, "Leader epochs").
//! 5. `added` and `updated` upsert the key, `deleted` removes it, `synced` (a sync marker)
//!    sweeps its scope (the recipe in `docs/restarts.md`), any other `op` is skipped.

use std::collections::{BTreeMap, HashMap};

use kubesink_core::readback::BrokerRecord;
use kubesink_core::Resource;
use serde_json::{json, Map, Value};

/// A record that cannot be folded.
#[derive(Debug, thiserror::Error)]
pub enum FoldError {
    /// The value is not a JSON object.
    #[error("{at}: not a topology message (JSON object): {reason}")]
    BadJson {
        /// Where (see [`BrokerRecord::at`]).
        at: String,
        /// The parser's message.
        reason: String,
    },
    /// A message without the fields its key is built from.
    #[error("{at}: message has no `{field}`, cannot build its key")]
    MissingField {
        /// Where (see [`BrokerRecord::at`]).
        at: String,
        /// The missing field.
        field: &'static str,
    },
    /// A tombstone without a record key.
    #[error("{at}: tombstone (null value) without a record key")]
    KeylessTombstone {
        /// Where (see [`BrokerRecord::at`]).
        at: String,
    },
}

/// One key of the view: the last message applied to it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// `{cluster}/{group or core}/{Kind}/{namespace}/{name}`.
    pub key: String,
    /// `op` of the last message applied (`added` or `updated`).
    pub op: String,
    /// Its `id`.
    pub id: String,
    /// `cluster`, group (empty for core), `kind`, `namespace` (empty when cluster-scoped), `name`.
    pub cluster: String,
    /// API group, empty for the core group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Object uid.
    pub uid: String,
    /// `resourceVersion` of the last message.
    pub resource_version: String,
    /// `observedAt` of the last message (RFC 3339).
    pub observed_at: String,
    /// The last message's `changed` (an `updated` naming the paths that changed); `None`
    /// when it has none.
    pub changed: Option<Vec<String>>,
    /// The last message's `changes` (old and new values of `change_values` paths).
    pub changes: Option<Value>,
    /// The object, kept only when the view was asked to keep objects.
    pub object: Option<Value>,
    /// The Kafka partition it was read from.
    pub partition: Option<i32>,
    /// The fold sequence number of its last `initial: true` message (0: none).
    initial_seq: u64,
    /// The fold sequence number of its last message applied.
    seq: u64,
}

impl Entry {
    /// The entry as one JSON Lines object: `key`, `op`, `cluster`, `kind`, `namespace`
    /// (absent when cluster-scoped), `name`, `uid`, `resourceVersion`, `observedAt`,
    /// `changed` and `changes` when the last message had them, and `object` when kept.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("key".into(), json!(self.key));
        m.insert("op".into(), json!(self.op));
        m.insert("cluster".into(), json!(self.cluster));
        m.insert("kind".into(), json!(self.kind));
        if !self.namespace.is_empty() {
            m.insert("namespace".into(), json!(self.namespace));
        }
        m.insert("name".into(), json!(self.name));
        m.insert("uid".into(), json!(self.uid));
        m.insert("resourceVersion".into(), json!(self.resource_version));
        m.insert("observedAt".into(), json!(self.observed_at));
        if let Some(c) = &self.changed {
            m.insert("changed".into(), json!(c));
        }
        if let Some(c) = &self.changes {
            m.insert("changes".into(), c.clone());
        }
        if let Some(o) = &self.object {
            m.insert("object".into(), o.clone());
        }
        Value::Object(m)
    }
}

/// What one record changed in the view (printed by `--follow`).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The key was upserted; the value is [`Entry::to_json`].
    Upserted(Value),
    /// The key was removed by `op`: `deleted`, `tombstone` or `swept` (a sync marker).
    Removed {
        /// The key.
        key: String,
        /// What removed it.
        by: &'static str,
    },
}

impl Change {
    /// One JSON Lines object: the entry, or `{"key", "op"}` with `op` = what removed it.
    pub fn to_json(&self) -> Value {
        match self {
            Change::Upserted(v) => v.clone(),
            Change::Removed { key, by } => json!({"key": key, "op": by}),
        }
    }
}

/// Counts of what the fold did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records read.
    pub records: u64,
    /// Upserts and deletes applied.
    pub applied: u64,
    /// Redeliveries skipped (same `id` as the key's last message).
    pub duplicates: u64,
    /// Tombstones (null values) read.
    pub tombstones: u64,
    /// Sync markers read.
    pub markers: u64,
    /// Keys removed by sync markers.
    pub swept: u64,
    /// Messages with an `op` the fold does not know, skipped.
    pub unknown_ops: u64,
    /// `deleted` messages of keys the view did not hold (a delete delivered again after its
    /// key left, or the delete of an object whose earlier messages the source no longer
    /// has: a compacted topic, a stream's retention, a receiver started late).
    pub unknown_deletes: u64,
    /// Sweeps not done because fewer keys of the list arrived than the marker's `count`.
    pub sweeps_skipped: u64,
    /// Messages skipped because their `leaderEpoch` is below one already seen for their key
    /// (a deposed leader's late publishes).
    pub stale_epochs: u64,
}

/// A sync marker's scope: one watch (and on Kafka one partition).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Scope {
    cluster: String,
    group: String,
    kind: String,
    /// `Some` when the marker's `scope` is `namespace`.
    namespace: Option<String>,
    partition: Option<i32>,
}

impl Scope {
    fn contains(&self, e: &Entry) -> bool {
        e.cluster == self.cluster
            && e.group == self.group
            && e.kind == self.kind
            && self.namespace.as_ref().is_none_or(|n| *n == e.namespace)
            && (self.partition.is_none() || self.partition == e.partition)
    }
}

#[derive(Debug, Default)]
struct ScopeState {
    /// The fold sequence number of the scope's last marker (0: none yet).
    last_marker_seq: u64,
    last_id: Option<String>,
}

/// A sweep not done: its marker's list has fewer `initial` messages here than its `count`.
#[derive(Debug)]
struct Skipped {
    scope: Scope,
    /// The scope's previous marker (the list's messages come after it).
    since: u64,
    /// The marker itself.
    at: u64,
    count: u64,
    seen: u64,
}

/// Why the sweeps not done were not done, as far as the records read tell
/// ([`View::skipped_sweeps`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SkippedSweeps {
    /// Lists whose missing messages are each replaced by a later change of the same object
    /// (a stream that keeps the last message per subject or key: JetStream
    /// `max_msgs_per_subject = 1`, a compacted Kafka topic).
    pub replaced: u64,
    /// Lists with messages missing that no later change explains (on JetStream, a stateless
    /// restart within the stream's `duplicate_window`: the re-sent unchanged objects were
    /// dropped as duplicates of their `Nats-Msg-Id`).
    pub missing: u64,
}

/// The current view: one [`Entry`] per live key, ordered by key.
#[derive(Debug, Default)]
pub struct View {
    entries: BTreeMap<String, Entry>,
    scopes: HashMap<Scope, ScopeState>,
    skipped: Vec<Skipped>,
    /// The highest `leaderEpoch` seen per key (kept after a delete: a deposed leader's late
    /// `added` must not bring a deleted key back).
    epochs: HashMap<String, u64>,
    seq: u64,
    keep_objects: bool,
    /// What the fold did so far.
    pub stats: Stats,
}

impl View {
    /// An empty view; `keep_objects` keeps each key's last `object` (memory: the objects).
    pub fn new(keep_objects: bool) -> View {
        View {
            keep_objects,
            ..View::default()
        }
    }

    /// The sweeps not done so far ([`Stats::sweeps_skipped`]), told apart by what the
    /// records read since show: each missing list message replaced by a later change of its
    /// object, or messages missing.
    pub fn skipped_sweeps(&self) -> SkippedSweeps {
        let mut out = SkippedSweeps::default();
        for s in &self.skipped {
            let changed_later = self
                .entries
                .values()
                .filter(|e| s.scope.contains(e) && e.initial_seq <= s.since && e.seq > s.at)
                .count() as u64;
            if s.seen + changed_later >= s.count {
                out.replaced += 1;
            } else {
                out.missing += 1;
            }
        }
        out
    }

    /// The live keys, ordered by key.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// The entry of `key`.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Number of live keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the view has no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Folds one record; returns what changed (nothing for a duplicate, a skipped `op`, or
    /// a delete of a key the view does not hold).
    ///
    /// # Errors
    /// [`FoldError`] naming the record's position when it is not a message.
    pub fn apply(&mut self, rec: BrokerRecord) -> Result<Vec<Change>, FoldError> {
        self.seq += 1;
        self.stats.records += 1;
        let Some(bytes) = rec.value else {
            self.stats.tombstones += 1;
            let key = rec.key.ok_or(FoldError::KeylessTombstone { at: rec.at })?;
            return Ok(self.remove(key, "tombstone").into_iter().collect());
        };
        let parsed: Value = serde_json::from_slice(&bytes).map_err(|e| FoldError::BadJson {
            at: rec.at.clone(),
            reason: e.to_string(),
        })?;
        let mut msg = match parsed {
            Value::Object(m) => m,
            other => {
                return Err(FoldError::BadJson {
                    at: rec.at,
                    reason: format!("a JSON {} instead of an object", type_name(&other)),
                })
            }
        };
        // A structured-mode CloudEvent (`application/cloudevents+json`) carries the message
        // in `data`.
        if msg.contains_key("specversion") {
            if let Some(Value::Object(data)) = msg.remove("data") {
                msg = data;
            }
        }
        let op = str_field(&msg, "op").to_owned();
        match op.as_str() {
            "added" | "updated" | "deleted" => self.change(&op, msg, rec.partition, &rec.at),
            "synced" => self.marker(&msg, rec.partition, &rec.at),
            _ => {
                self.stats.unknown_ops += 1;
                Ok(Vec::new())
            }
        }
    }

    fn change(
        &mut self,
        op: &str,
        mut msg: Map<String, Value>,
        partition: Option<i32>,
        at: &str,
    ) -> Result<Vec<Change>, FoldError> {
        let (cluster, group, kind) = identity(&msg, at)?;
        let namespace = str_field(&msg, "namespace").to_owned();
        let name = required(&msg, "name", at)?.to_owned();
        let key = match msg.get("key").and_then(Value::as_str) {
            Some(k) => k.to_owned(),
            None => Resource::new(&cluster, &group, "", &kind, "", !namespace.is_empty())
                .key(Some(&namespace), &name),
        };
        if self.stale(&key, &msg) {
            return Ok(Vec::new());
        }
        let id = str_field(&msg, "id").to_owned();
        let initial = msg.get("initial").and_then(Value::as_bool) == Some(true);
        if let Some(e) = self
            .entries
            .get_mut(&key)
            .filter(|e| !id.is_empty() && e.id == id)
        {
            self.stats.duplicates += 1;
            // The same change sent again by a new list (a stateless restart re-sends unchanged
            // objects with the same id): nothing to apply, but the list did see the key.
            if initial {
                e.initial_seq = self.seq;
            }
            return Ok(Vec::new());
        }
        if op == "deleted" {
            let removed = self.remove(key, "deleted");
            if removed.is_none() {
                self.stats.unknown_deletes += 1;
            }
            return Ok(removed.into_iter().collect());
        }
        self.stats.applied += 1;
        let previous_initial = self.entries.get(&key).map_or(0, |e| e.initial_seq);
        let entry = Entry {
            key: key.clone(),
            op: op.to_owned(),
            id,
            uid: str_field(&msg, "uid").to_owned(),
            resource_version: str_field(&msg, "resourceVersion").to_owned(),
            observed_at: str_field(&msg, "observedAt").to_owned(),
            changed: msg.get("changed").and_then(Value::as_array).map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            }),
            changes: msg.get("changes").filter(|c| c.is_array()).cloned(),
            object: if self.keep_objects {
                msg.remove("object")
            } else {
                None
            },
            cluster,
            group,
            kind,
            namespace,
            name,
            partition,
            initial_seq: if initial { self.seq } else { previous_initial },
            seq: self.seq,
        };
        let json = entry.to_json();
        self.entries.insert(key, entry);
        Ok(vec![Change::Upserted(json)])
    }

    /// Whether `msg` (of key `key`) carries a `leaderEpoch` below the highest seen for the
    /// key (counted, skipped); otherwise its epoch becomes the key's highest.
    fn stale(&mut self, key: &str, msg: &Map<String, Value>) -> bool {
        let Some(epoch) = msg.get("leaderEpoch").and_then(Value::as_u64) else {
            return false;
        };
        match self.epochs.get_mut(key) {
            Some(seen) if *seen > epoch => {
                self.stats.stale_epochs += 1;
                true
            }
            Some(seen) => {
                *seen = epoch;
                false
            }
            None => {
                self.epochs.insert(key.to_owned(), epoch);
                false
            }
        }
    }

    fn remove(&mut self, key: String, by: &'static str) -> Option<Change> {
        self.entries.remove(&key)?;
        self.stats.applied += 1;
        Some(Change::Removed { key, by })
    }

    /// The sweep of `docs/restarts.md` ("Consumers: the recipe"): a marker with a new id
    /// and `initial: true` removes every key of its scope that got no `initial: true`
    /// message since the scope's previous marker.
    fn marker(
        &mut self,
        msg: &Map<String, Value>,
        partition: Option<i32>,
        at: &str,
    ) -> Result<Vec<Change>, FoldError> {
        self.stats.markers += 1;
        let (cluster, group, kind) = identity(msg, at)?;
        // A deposed leader's late marker must not sweep what its successor sent. On Kafka a
        // marker is written to every partition and the partitions are read one after the
        // other, so its epochs are compared within a partition: a successor's marker read in
        // partition 0 says nothing of the markers partition 1 holds before it (compared
        // across partitions, every older marker read later counted as a deposed leader's).
        let marker_key = match (str_field(msg, "key"), partition) {
            ("", _) => String::new(),
            (key, Some(p)) => format!("{key}#{p}"),
            (key, None) => key.to_owned(),
        };
        if !marker_key.is_empty() && self.stale(&marker_key, msg) {
            return Ok(Vec::new());
        }
        let scope = Scope {
            cluster,
            group,
            kind,
            namespace: (str_field(msg, "scope") == "namespace")
                .then(|| str_field(msg, "namespace").to_owned()),
            partition,
        };
        let id = str_field(msg, "id").to_owned();
        let initial = msg.get("initial").and_then(Value::as_bool) == Some(true);
        let state = self.scopes.entry(scope.clone()).or_default();
        let sweep_before =
            (initial && state.last_id.as_deref() != Some(&id)).then_some(state.last_marker_seq);
        state.last_marker_seq = self.seq;
        state.last_id = Some(id);
        let Some(since) = sweep_before else {
            return Ok(Vec::new());
        };
        // Without partitions the marker's `count` is what this scope should have seen. Fewer
        // means messages of the list are missing here, e.g. a JetStream stream dropped the
        // list's re-sent unchanged objects as duplicates of their `Nats-Msg-Id` (a stateless
        // restart within `duplicate_window`): sweeping would remove live objects.
        if partition.is_none() {
            if let Some(count) = msg.get("count").and_then(Value::as_u64) {
                let seen = self
                    .entries
                    .values()
                    .filter(|e| scope.contains(e) && e.initial_seq > since)
                    .count() as u64;
                if seen < count {
                    self.stats.sweeps_skipped += 1;
                    self.skipped.push(Skipped {
                        scope,
                        since,
                        at: self.seq,
                        count,
                        seen,
                    });
                    return Ok(Vec::new());
                }
            }
        }
        let gone: Vec<String> = self
            .entries
            .values()
            .filter(|e| scope.contains(e) && e.initial_seq <= since)
            .map(|e| e.key.clone())
            .collect();
        let mut changes = Vec::with_capacity(gone.len());
        for key in gone {
            self.stats.swept += 1;
            changes.extend(self.remove(key, "swept"));
        }
        Ok(changes)
    }
}

fn str_field<'a>(m: &'a Map<String, Value>, field: &str) -> &'a str {
    m.get(field).and_then(Value::as_str).unwrap_or_default()
}

fn required<'a>(
    m: &'a Map<String, Value>,
    field: &'static str,
    at: &str,
) -> Result<&'a str, FoldError> {
    match m.get(field).and_then(Value::as_str) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(FoldError::MissingField {
            at: at.to_owned(),
            field,
        }),
    }
}

/// (cluster, group, kind): the group from the `group` field, else from `apiVersion`.
fn identity(m: &Map<String, Value>, at: &str) -> Result<(String, String, String), FoldError> {
    let cluster = required(m, "cluster", at)?.to_owned();
    let kind = required(m, "kind", at)?.to_owned();
    let group = match m.get("group").and_then(Value::as_str) {
        Some(g) => g.to_owned(),
        None => {
            let api_version = required(m, "apiVersion", at)?;
            api_version
                .split_once('/')
                .map_or("", |(g, _)| g)
                .to_owned()
        }
    };
    Ok((cluster, group, kind))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(v: Value) -> BrokerRecord {
        BrokerRecord {
            value: Some(v.to_string().into_bytes()),
            key: None,
            partition: None,
            at: "test".into(),
        }
    }

    fn msg(op: &str, id: &str, ns: &str, name: &str, uid: &str, initial: bool) -> Value {
        json!({"id": id, "op": op, "cluster": "c", "apiVersion": "apps/v1", "kind": "Deployment",
               "namespace": ns, "name": name, "uid": uid, "resourceVersion": "1",
               "initial": initial, "observedAt": "2026-11-30T00:00:00.000Z", "object": {}})
    }

    fn marker(id: &str, initial: bool) -> Value {
        json!({"id": id, "op": "synced", "cluster": "c", "apiVersion": "apps/v1",
               "kind": "Deployment", "scope": "allNamespaces", "count": 1, "initial": initial})
    }

    fn keys(v: &View) -> Vec<&str> {
        v.entries().map(|e| e.key.as_str()).collect()
    }

    #[test]
    fn the_key_is_derived_from_the_payload_when_the_message_has_none() {
        let mut v = View::new(false);
        v.apply(rec(msg("added", "1", "default", "web", "u1", false)))
            .unwrap();
        let mut node = msg("added", "2", "", "n1", "u2", false);
        node["apiVersion"] = json!("v1");
        node["kind"] = json!("Node");
        node.as_object_mut().unwrap().remove("namespace");
        v.apply(rec(node)).unwrap();
        assert_eq!(
            keys(&v),
            ["c/apps/Deployment/default/web", "c/core/Node//n1"]
        );
    }

    #[test]
    fn a_key_field_in_the_payload_wins_over_derivation() {
        let mut v = View::new(false);
        let mut m = msg("added", "1", "default", "web", "u1", false);
        m["key"] = json!("c/apps/Deployment/default/web");
        m["group"] = json!("apps");
        v.apply(rec(m)).unwrap();
        assert_eq!(keys(&v), ["c/apps/Deployment/default/web"]);
    }

    #[test]
    fn a_redelivered_message_is_skipped_and_a_delete_removes() {
        let mut v = View::new(false);
        v.apply(rec(msg("added", "1", "ns", "a", "u1", false)))
            .unwrap();
        assert!(v
            .apply(rec(msg("added", "1", "ns", "a", "u1", false)))
            .unwrap()
            .is_empty());
        assert_eq!(v.stats.duplicates, 1);
        v.apply(rec(msg("deleted", "2", "ns", "a", "u1", false)))
            .unwrap();
        assert!(v.is_empty());
    }

    #[test]
    fn a_tombstone_removes_its_record_key_and_unknown_ops_are_skipped() {
        let mut v = View::new(false);
        v.apply(rec(msg("added", "1", "ns", "a", "u1", false)))
            .unwrap();
        v.apply(rec(msg("resized", "2", "ns", "a", "u1", false)))
            .unwrap();
        assert_eq!(v.stats.unknown_ops, 1);
        assert_eq!(v.len(), 1);
        let changes = v
            .apply(BrokerRecord {
                value: None,
                key: Some("c/apps/Deployment/ns/a".into()),
                partition: Some(0),
                at: "t".into(),
            })
            .unwrap();
        assert_eq!(
            changes,
            [Change::Removed {
                key: "c/apps/Deployment/ns/a".into(),
                by: "tombstone"
            }]
        );
    }

    #[test]
    fn an_initial_marker_sweeps_keys_its_list_did_not_send_once() {
        let mut v = View::new(false);
        v.apply(rec(msg("added", "1", "ns", "ghost", "u1", true)))
            .unwrap();
        v.apply(rec(msg("added", "2", "ns", "live", "u2", true)))
            .unwrap();
        v.apply(rec(marker("m1", true))).unwrap();
        assert_eq!(v.len(), 2, "the first list sent both");
        // A stateless restart: only `live` is listed again.
        v.apply(rec(msg("added", "3", "ns", "live", "u2", true)))
            .unwrap();
        v.apply(rec(marker("m2", true))).unwrap();
        assert_eq!(keys(&v), ["c/apps/Deployment/ns/live"]);
        assert_eq!(v.stats.swept, 1);
        // A list that re-sends an unchanged object (same id) still counts it as seen.
        v.apply(rec(msg("added", "3", "ns", "live", "u2", true)))
            .unwrap();
        v.apply(rec(marker("m4", true))).unwrap();
        assert_eq!(keys(&v), ["c/apps/Deployment/ns/live"]);
        // A list whose messages did not all arrive (count 3, one seen) sweeps nothing.
        v.apply(rec(msg("added", "9", "ns", "other", "u9", false)))
            .unwrap();
        v.apply(rec(msg("added", "3", "ns", "live", "u2", true)))
            .unwrap();
        let mut short = marker("m5", true);
        short["count"] = json!(3);
        v.apply(rec(short)).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v.stats.sweeps_skipped, 1);
        v.apply(rec(msg("deleted", "10", "ns", "other", "u9", false)))
            .unwrap();
        // A repeated marker and a relist marker (initial: false) sweep nothing.
        v.apply(rec(marker("m5", true))).unwrap();
        v.apply(rec(marker("m3", false))).unwrap();
        assert_eq!(v.len(), 1);
    }

    /// A deposed leader's publishes written after its successor's
    /// (`leaderEpoch` lower than one already applied to the key) are skipped, also after a
    /// delete and for a sync marker; keys only the old leader touched keep its messages.
    #[test]
    fn a_lower_leader_epoch_than_seen_for_the_key_is_skipped() {
        let mut v = View::new(false);
        let with = |mut m: Value, epoch: u64, rv: &str| {
            m["leaderEpoch"] = epoch.into();
            m["resourceVersion"] = rv.into();
            m
        };
        let a = |op: &str, id: &str, name: &str| msg(op, id, "ns", name, "u1", false);
        v.apply(rec(with(a("added", "1", "p"), 4, "5"))).unwrap();
        v.apply(rec(with(a("updated", "2", "p"), 5, "6"))).unwrap();
        // The zombie's (epoch 4) late update of p, and its late `added` of q after the
        // successor deleted q.
        v.apply(rec(with(a("added", "3", "q"), 5, "7"))).unwrap();
        v.apply(rec(with(a("deleted", "4", "q"), 5, "8"))).unwrap();
        assert!(v
            .apply(rec(with(a("updated", "5", "p"), 4, "5")))
            .unwrap()
            .is_empty());
        assert!(v
            .apply(rec(with(a("added", "6", "q"), 4, "7")))
            .unwrap()
            .is_empty());
        assert_eq!(v.stats.stale_epochs, 2);
        assert_eq!(keys(&v), vec!["c/apps/Deployment/ns/p"]);
        assert_eq!(
            v.get("c/apps/Deployment/ns/p").unwrap().resource_version,
            "6"
        );
        // A late marker of the old leader sweeps nothing.
        let mut m = with(marker("m1", true), 5, "9");
        m["key"] = "c/apps/Deployment//%synced".into();
        v.apply(rec(m.clone())).unwrap();
        m["id"] = "m0".into();
        m["leaderEpoch"] = 4.into();
        assert!(v.apply(rec(m)).unwrap().is_empty());
        assert_eq!(v.stats.stale_epochs, 3);
        // On Kafka every partition holds every marker, read one partition after the
        // other: partition 1's markers of epoch 4, read after partition 0's of epoch 5, are
        // not a deposed leader's; within partition 1 a later epoch-4 marker is.
        let on = |mut m: Value, id: &str, epoch: u64, p: i32| {
            m["id"] = id.into();
            m["leaderEpoch"] = epoch.into();
            let mut r = rec(m);
            r.partition = Some(p);
            r
        };
        let mut k = marker("k", false);
        k["key"] = "c/apps/Deployment//%synced".into();
        v.apply(on(k.clone(), "k1", 5, 0)).unwrap();
        v.apply(on(k.clone(), "k2", 4, 1)).unwrap();
        v.apply(on(k.clone(), "k3", 5, 1)).unwrap();
        assert_eq!(
            v.stats.stale_epochs, 3,
            "no partition's own order went back"
        );
        v.apply(on(k, "k4", 4, 1)).unwrap();
        assert_eq!(v.stats.stale_epochs, 4);
        // Messages without an epoch (no leader election) are folded as before.
        v.apply(rec(a("added", "7", "r"))).unwrap();
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn a_list_whose_messages_later_changes_replaced_is_told_from_one_with_messages_missing() {
        // A fresh stream keeping one message per subject: `a` changed after the list, and
        // its `updated` replaced its `added` of the list.
        let mut v = View::new(false);
        v.apply(rec(msg("added", "2", "ns", "b", "u2", true)))
            .unwrap();
        v.apply(rec(msg("added", "3", "ns", "c", "u3", true)))
            .unwrap();
        let mut m = marker("m1", true);
        m["count"] = json!(3);
        v.apply(rec(m)).unwrap();
        assert_eq!(v.stats.sweeps_skipped, 1);
        v.apply(rec(msg("updated", "4", "ns", "a", "u1", false)))
            .unwrap();
        assert_eq!(
            v.skipped_sweeps(),
            SkippedSweeps {
                replaced: 1,
                missing: 0
            }
        );
        // A list of which a message is simply not there (dropped as a duplicate).
        let mut v = View::new(false);
        v.apply(rec(msg("added", "2", "ns", "b", "u2", true)))
            .unwrap();
        let mut m = marker("m1", true);
        m["count"] = json!(2);
        v.apply(rec(m)).unwrap();
        assert_eq!(
            v.skipped_sweeps(),
            SkippedSweeps {
                replaced: 0,
                missing: 1
            }
        );
    }

    #[test]
    fn a_structured_cloudevent_is_unwrapped() {
        let mut v = View::new(false);
        let ce = json!({"specversion": "1.0", "id": "1", "source": "c", "type": "io.kubesink.topology.added",
                        "data": msg("added", "1", "ns", "a", "u1", false)});
        v.apply(rec(ce)).unwrap();
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn bad_input_names_where_it_is() {
        let mut v = View::new(false);
        let e = v
            .apply(BrokerRecord {
                value: Some(b"{not json".to_vec()),
                key: None,
                partition: None,
                at: "line 7".into(),
            })
            .unwrap_err();
        assert!(
            e.to_string().starts_with("line 7: not a topology message"),
            "{e}"
        );
        let mut m = msg("added", "1", "ns", "a", "u1", false);
        m.as_object_mut().unwrap().remove("name");
        let e = v.apply(rec(m)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "test: message has no `name`, cannot build its key"
        );
    }
}
