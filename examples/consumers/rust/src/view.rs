//! The fold every kubesink consumer does (docs/consumers.md): a view keyed by the message
//! key, deduplication by the key's last id, upsert/delete by `op`, and the sync-marker sweep
//! (docs/restarts.md, "Consumers: the recipe"). The view and the broker position are saved
//! together in one checkpoint file, atomically (write, fsync, rename).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
    pub op: String,
    pub uid: String,
    pub resource_version: String,
    pub observed_at: String,
    /// The last message's `changed` (an `updated` naming the paths that changed); absent in
    /// checkpoints written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<Value>,
    pub partition: Option<i32>,
    /// `[cluster, group, kind, namespace]`: what a sync marker's scope is compared with.
    pub scope: [String; 4],
    /// The fold sequence number of the key's last `initial: true` message (0: none).
    pub initial_seq: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ScopeState {
    pub last_marker_seq: u64,
    pub last_id: String,
}

/// The view plus the broker position `P` it reflects.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Checkpoint<P> {
    pub position: P,
    pub entries: BTreeMap<String, Entry>,
    /// Scope (`cluster/group/kind/namespace-or-*/partition-or-*`) → its last marker.
    pub scopes: HashMap<String, ScopeState>,
    pub seq: u64,
}

fn text<'a>(m: &'a Value, field: &str) -> &'a str {
    m[field].as_str().unwrap_or_default()
}

/// The group as keys write it: the `group` field, else from `apiVersion`; `core` if empty.
fn group(m: &Value) -> String {
    let g = match m["group"].as_str() {
        Some(g) => g,
        None => text(m, "apiVersion").split_once('/').map_or("", |(g, _)| g),
    };
    if g.is_empty() { "core" } else { g }.to_owned()
}

impl<P: Default + Serialize + for<'de> Deserialize<'de>> Checkpoint<P> {
    /// Folds one record: `value` is the payload, `None` for a Kafka tombstone.
    pub fn apply(
        &mut self,
        value: Option<&[u8]>,
        record_key: Option<&str>,
        partition: Option<i32>,
    ) -> anyhow::Result<()> {
        self.seq += 1;
        let Some(value) = value else {
            if let Some(k) = record_key {
                self.entries.remove(k);
            }
            return Ok(());
        };
        let mut m: Value = serde_json::from_slice(value).context("payload is not JSON")?;
        if m.get("specversion").is_some() && m["data"].is_object() {
            m = m["data"].take(); // a structured-mode CloudEvent
        }
        let op = text(&m, "op").to_owned();
        match op.as_str() {
            "synced" => {
                self.marker(&m, partition);
                return Ok(());
            }
            "added" | "updated" | "deleted" => {}
            _ => return Ok(()), // an op this consumer does not know: skip it
        }
        let scope = [
            text(&m, "cluster").to_owned(),
            group(&m),
            text(&m, "kind").to_owned(),
            text(&m, "namespace").to_owned(),
        ];
        let key = match m["key"].as_str() {
            Some(k) => k.to_owned(),
            None => format!(
                "{}/{}/{}/{}/{}",
                scope[0],
                scope[1],
                scope[2],
                scope[3],
                text(&m, "name")
            ),
        };
        if let Some(e) = self
            .entries
            .get_mut(&key)
            .filter(|e| e.id == text(&m, "id"))
        {
            if m["initial"] == true {
                e.initial_seq = self.seq; // a new list re-sent it unchanged: seen
            }
            return Ok(()); // a redelivery: the key's last message again
        }
        let old = self.entries.get(&key);
        if op == "deleted" {
            self.entries.remove(&key);
            return Ok(());
        }
        let initial_seq = if m["initial"] == true {
            self.seq
        } else {
            old.map_or(0, |e| e.initial_seq)
        };
        let entry = Entry {
            id: text(&m, "id").to_owned(),
            op,
            uid: text(&m, "uid").to_owned(),
            resource_version: text(&m, "resourceVersion").to_owned(),
            observed_at: text(&m, "observedAt").to_owned(),
            changed: m.get("changed").filter(|c| c.is_array()).cloned(),
            partition,
            scope,
            initial_seq,
        };
        self.entries.insert(key, entry);
        Ok(())
    }

    /// A marker with a new id and `initial: true` removes every key of its scope that got
    /// no `initial: true` message since the scope's previous marker.
    fn marker(&mut self, m: &Value, partition: Option<i32>) {
        let ns = (text(m, "scope") == "namespace").then(|| text(m, "namespace").to_owned());
        let (cluster, group, kind) = (
            text(m, "cluster").to_owned(),
            group(m),
            text(m, "kind").to_owned(),
        );
        let scope_key = format!(
            "{cluster}/{group}/{kind}/{}/{}",
            ns.as_deref().unwrap_or("*"),
            partition.map_or("*".to_owned(), |p| p.to_string())
        );
        let state = self.scopes.entry(scope_key).or_default();
        let since = state.last_marker_seq;
        let sweep = m["initial"] == true && state.last_id != text(m, "id");
        state.last_marker_seq = self.seq;
        state.last_id = text(m, "id").to_owned();
        if !sweep {
            return;
        }
        let in_scope = |e: &Entry| {
            e.scope[0] == cluster
                && e.scope[1] == group
                && e.scope[2] == kind
                && ns.as_ref().is_none_or(|n| *n == e.scope[3])
                && (partition.is_none() || partition == e.partition)
        };
        let seen = self
            .entries
            .values()
            .filter(|e| in_scope(e) && e.initial_seq > since)
            .count();
        if partition.is_none() && (seen as u64) < m["count"].as_u64().unwrap_or(0) {
            return; // some of the list never arrived (JetStream dropped re-sends as duplicates)
        }
        self.entries
            .retain(|_, e| !(in_scope(e) && e.initial_seq <= since));
    }

    /// The view as JSON Lines, ordered by key: key, op, uid, resourceVersion, observedAt,
    /// and `changed` when the key's last message had it.
    pub fn print(&self) {
        for (key, e) in &self.entries {
            let mut line = serde_json::json!({"key": key, "op": e.op, "uid": e.uid,
                "resourceVersion": e.resource_version, "observedAt": e.observed_at});
            if let Some(c) = &e.changed {
                line["changed"] = c.clone();
            }
            println!("{line}");
        }
    }

    /// The checkpoint in `path`, or an empty view at the default position.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("checkpoint {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("checkpoint {}", path.display())),
        }
    }

    /// Writes view and position together: a crash leaves the old checkpoint or the new one.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        use std::io::Write;
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(self)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("checkpoint {}", path.display()))
    }
}
