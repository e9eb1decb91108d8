//! The owner index: what `[[resources]] enrich` resolves a message's context from
//! (docs/message-contract.md "Context"), one per cluster, never an object.
//!
//! Per indexed object, keyed by its uid: its controller owner (the `ownerReferences` entry
//! with `controller: true`: kind, name, uid), or that it has none (a top), and for a Pod its
//! node (`spec.nodeName`). Filled by the cluster's own watches as they list and watch
//! (every followed kind but Events, and Pods only when an Events resource asks for context),
//! so following ReplicaSets and Deployments is what lets a Pod's message name both; no
//! watch and no object cache of its own. Kinds, names, uids and node names are interned:
//! the Pods of one ReplicaSet share its name and uid. Cost, measured by the
//! `an_indexed_object_costs` test and `cargo bench --bench state_size`: one hash slot of 32
//! bytes (the uid's 16, then the numbers of its owner's kind, name and uid and of its node)
//! at the table's load (7/8 at most, in powers of two), plus each distinct string once.
//!
//! A chain is resolved when a message is made, from what the index holds then: an owner
//! not (yet) seen leaves the chain incomplete (`ownersComplete: false`), and no update is
//! sent when it arrives; the next change of the object carries the whole chain. At a start,
//! the resources that ask for owners wait (a bounded time, `WAIT`) for the initial lists of
//! the kinds that fill the index, so a first list's messages are complete.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kubesink_core::message::{Context, OwnerRef};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::object::RawObject;
use crate::config::{Enrich, ResourceConfig, ResourceMode};

/// How long a resource that asks for owners waits at a start for the initial lists of the
/// kinds that fill the index (a kind whose discovery fails would otherwise hold it forever);
/// after it, messages go out with what is known.
pub const WAIT: Duration = Duration::from_secs(60);

/// The longest chain followed (a cycle of owner references, which Kubernetes does not
/// prevent, ends there as incomplete).
const MAX_DEPTH: usize = 16;

/// No string (`Link::node` of an object without a node).
const NONE: u32 = u32::MAX;

/// One indexed object, 16 bytes: its controller owner's interned kind ([`NONE`]: it has
/// no controller owner, a top), name and uid, and its node ([`NONE`]: none known).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Link {
    kind: u32,
    name: u32,
    uid: u32,
    node: u32,
}

/// Interned strings by number, each counted by the links that name it: the names and uids
/// of owners (shared by all they own) and node names.
#[derive(Debug, Default)]
struct Strings {
    texts: Vec<(Box<str>, u32)>,
    free: Vec<u32>,
    table: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Strings {
    fn hash(&self, s: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, s)
    }

    /// The number of `s`, counted once more.
    fn intern(&mut self, s: &str) -> u32 {
        let hash = self.hash(s);
        let texts = &self.texts;
        if let Some(&i) = self.table.find(hash, |&i| &*texts[i as usize].0 == s) {
            self.texts[i as usize].1 += 1;
            return i;
        }
        let i = match self.free.pop() {
            Some(i) => {
                self.texts[i as usize] = (s.into(), 1);
                i
            }
            None => {
                self.texts.push((s.into(), 1));
                (self.texts.len() - 1) as u32
            }
        };
        let (texts, hasher) = (&self.texts, &self.hasher);
        self.table.insert_unique(hash, i, |&j| {
            std::hash::BuildHasher::hash_one(hasher, &*texts[j as usize].0)
        });
        i
    }

    /// Counts `i` once less, dropping it when nothing names it.
    fn release(&mut self, i: u32) {
        let Some((text, refs)) = self.texts.get_mut(i as usize) else {
            return;
        };
        *refs = refs.saturating_sub(1);
        if *refs > 0 {
            return;
        }
        let text = std::mem::take(text);
        let hash = self.hash(&text);
        if let Ok(e) = self.table.find_entry(hash, |&j| j == i) {
            e.remove();
        }
        self.free.push(i);
    }

    fn get(&self, i: u32) -> &str {
        self.texts.get(i as usize).map_or("", |(t, _)| t)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }
}

/// Labels by Namespace (or Node) name: numbers of interned (key, value), sorted.
type LabelsByName = HashMap<Box<str>, Vec<(u32, u32)>>;

#[derive(Debug, Default)]
struct Inner {
    /// Each Namespace's and each Node's labels, as numbers of interned keys and values
    /// (both are few: all their labels are kept, each resource picks its
    /// `namespace_labels` and `node_labels`); by [`Labelled`].
    labelled: [LabelsByName; 2],
    links: HashMap<u128, Link>,
    /// Interned (apiVersion, kind) pairs, by number.
    kinds: Vec<(Arc<str>, Arc<str>)>,
    strings: Strings,
}

/// A cluster's owner index; see the module docs. Shared by the cluster's deciders.
#[derive(Debug)]
pub struct OwnerIndex {
    inner: Mutex<Inner>,
    /// The watches that fill the index and have not completed their first list.
    pending: tokio::sync::watch::Sender<usize>,
}

/// The key of a uid: its 128 bits when it is a UUID (as Kubernetes issues them), else a
/// 128-bit hash of its text.
fn key(uid: &str) -> u128 {
    uuid::Uuid::parse_str(uid)
        .map(|u| u.as_u128())
        .unwrap_or_else(|_| xxhash_rust::xxh3::xxh3_128(uid.as_bytes()))
}

/// The controller owner an object's `metadata.ownerReferences` names, when one does.
pub fn controller_of(metadata: &Map<String, Value>) -> Option<OwnerRef> {
    let refs = metadata.get("ownerReferences")?.as_array()?;
    let r = refs
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))?;
    let text = |k: &str| r.get(k).and_then(Value::as_str).map(Arc::<str>::from);
    Some(OwnerRef {
        api_version: text("apiVersion")?,
        kind: text("kind")?,
        name: text("name")?,
        uid: text("uid")?,
    })
}

/// A Pod's `spec.nodeName`, read from its raw `spec` (scanned, not built).
pub fn node_of(obj: &RawObject<'_>) -> Option<String> {
    #[derive(Deserialize)]
    struct Spec {
        #[serde(rename = "nodeName")]
        node_name: Option<String>,
    }
    let (_, spec) = obj.body.iter().find(|(k, _)| k == "spec")?;
    serde_json::from_str::<Spec>(spec.get())
        .ok()?
        .node_name
        .filter(|n| !n.is_empty())
}

/// The uid of the object an Event regards (`regarding`, or core `involvedObject`).
pub fn regarding_uid(obj: &RawObject<'_>) -> Option<String> {
    #[derive(Deserialize)]
    struct Ref {
        uid: Option<String>,
    }
    let (_, r) = obj
        .body
        .iter()
        .find(|(k, _)| k == "regarding" || k == "involvedObject")?;
    serde_json::from_str::<Ref>(r.get())
        .ok()?
        .uid
        .filter(|u| !u.is_empty())
}

/// The owner index as one watch uses it: the index and the resource's [`Role`].
#[derive(Clone, Debug)]
pub struct OwnerContext {
    /// The cluster's index.
    pub index: Arc<OwnerIndex>,
    /// What the resource does with it.
    pub role: Role,
    /// Set once the watch's first list was reported to the index; shared by the watch's
    /// views (`bridge/routes.rs`), which all see the same list.
    pub reported: Arc<std::sync::atomic::AtomicBool>,
}

impl OwnerContext {
    /// Records `obj` (listed, added or modified) when the resource fills the index.
    pub fn feed(&self, obj: &RawObject<'_>) {
        if self.role.feeds {
            if let (Some(place), Some(name)) = (self.role.fills_labels, obj.name()) {
                let labels = obj.metadata.get("labels").and_then(Value::as_object);
                self.index.note_labels(place, name, labels);
            }
            let node = if self.role.fills_nodes {
                node_of(obj)
            } else {
                None
            };
            self.index.note(
                obj.uid(),
                controller_of(&obj.metadata).as_ref(),
                node.as_deref(),
            );
        }
    }

    /// Forgets the object `uid` named `name` (deleted, or gone) when the resource fills the
    /// index.
    pub fn unfeed(&self, uid: &str, name: &str) {
        if self.role.feeds {
            self.index.forget(uid);
            if let Some(place) = self.role.fills_labels {
                self.index.forget_labels(place, name);
            }
        }
    }

    /// The watch completed its first list: the index counts it once.
    pub fn first_list_done(&self) {
        if self.role.feeds
            && !self.role.waits
            && !self
                .reported
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            self.index.feeder_synced();
        }
    }

    /// The context of a message about `obj` (an Event occurrence when `event`); `None` when
    /// the resource asks for none.
    pub fn of(&self, obj: &RawObject<'_>, event: bool) -> Option<Arc<Context>> {
        let Role { owners, node, .. } = self.role;
        if !owners && !node && self.role.namespace_labels.is_none() {
            return None;
        }
        let namespace_labels = match (&self.role.namespace_labels, obj.namespace()) {
            (Some(keys), Some(ns)) => self.index.labels(Labelled::Namespace, ns, keys),
            _ => None,
        };
        let node_labels = |at: Option<&str>| match (&self.role.node_labels, at) {
            (Some(keys), Some(n)) => self.index.labels(Labelled::Node, n, keys),
            _ => None,
        };
        let context = if event {
            match regarding_uid(obj).and_then(|u| self.index.of(&u)) {
                Some((chain, complete, at)) => Context {
                    owners: owners.then_some(chain),
                    owners_complete: complete,
                    node_labels: node_labels(at.as_deref().filter(|_| node)),
                    node: at.filter(|_| node),
                    namespace_labels,
                },
                // The regarding object is not indexed (not followed, or not seen yet).
                None => Context {
                    owners: owners.then(Vec::new),
                    owners_complete: false,
                    node: None,
                    node_labels: None,
                    namespace_labels,
                },
            }
        } else {
            let (chain, complete) = match owners {
                true => self.index.chain(controller_of(&obj.metadata)),
                false => (Vec::new(), false),
            };
            let at: Option<Arc<str>> = node.then(|| node_of(obj)).flatten().map(Arc::from);
            Context {
                owners: owners.then_some(chain),
                owners_complete: complete,
                node_labels: node_labels(at.as_deref()),
                node: at,
                namespace_labels,
            }
        };
        Some(Arc::new(context))
    }
}

/// The workload controllers an owner chain passes through (`apiVersion`, `kind`): what a
/// Pod's (or an Event's regarding object's) chain needs indexed up to its top.
pub const OWNER_KINDS: [(&str, &str); 6] = [
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "DaemonSet"),
    ("batch/v1", "Job"),
    ("batch/v1", "CronJob"),
];

/// The watches the owner index of a cluster with `resources` adds (each metadata-only; none
/// of their changes is sent): of every kind of [`OWNER_KINDS`] that no entry follows in
/// every namespace the resources asking for `owner` watch (all of them when one watches
/// all); of v1 Nodes when a resource asks for `node_labels`, and of v1 Namespaces when one
/// asks for `namespace_labels`, unless an entry follows them. Group-form entries never fill
/// the index, so they do not count as following a kind.
pub fn index_resources(resources: &[ResourceConfig]) -> Vec<ResourceConfig> {
    let asking: Vec<&ResourceConfig> = resources
        .iter()
        .filter(|r| r.enriches(Enrich::Owner) && r.selector().is_none())
        .collect();
    // Where the controllers are needed: every namespace when one asker watches them all.
    let mut namespaces: Vec<String> = match asking.iter().any(|r| r.namespaces.is_empty()) {
        true => Vec::new(),
        false => asking.iter().flat_map(|r| r.namespaces.clone()).collect(),
    };
    namespaces.sort();
    namespaces.dedup();
    // An entry fills the index with its kind where it watches: everywhere, or in every
    // namespace needed (Nodes and Namespaces are cluster-scoped: their entries list none).
    let followed = |api: &str, kind: &str| {
        resources.iter().any(|r| {
            r.selector().is_none()
                && r.mode == ResourceMode::Objects
                && r.api_version == api
                && r.kind == kind
                && (r.namespaces.is_empty()
                    || (!namespaces.is_empty()
                        && namespaces.iter().all(|n| r.namespaces.contains(n))))
        })
    };
    let labels = [
        (
            ("v1", "Node"),
            resources
                .iter()
                .any(|r| r.enriches(Enrich::Node) && !r.node_labels.is_empty()),
        ),
        (
            ("v1", "Namespace"),
            resources.iter().any(|r| r.enriches(Enrich::Namespace)),
        ),
    ];
    let controllers = OWNER_KINDS.iter().map(|k| (*k, !asking.is_empty()));
    labels
        .into_iter()
        .chain(controllers)
        .filter(|((api, kind), wanted)| *wanted && !followed(api, kind))
        .map(|((api, kind), _)| {
            let mut r = ResourceConfig::new(api, kind);
            r.payload = crate::config::PayloadMode::Metadata;
            if OWNER_KINDS.contains(&(api, kind)) {
                r.namespaces = namespaces.clone();
            }
            r
        })
        .collect()
}

/// `resources` and, after them, the watches the owner index adds ([`index_resources`]):
/// everything a cluster with `resources` lists and watches.
pub fn with_index_resources(resources: &[ResourceConfig]) -> Vec<ResourceConfig> {
    let mut all = resources.to_vec();
    all.extend(index_resources(resources));
    all
}

/// Whose labels the index keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Labelled {
    /// v1 Namespaces' (`namespace_labels`).
    Namespace = 0,
    /// v1 Nodes' (`node_labels`).
    Node = 1,
}

/// What one resource does with its cluster's owner index ([`roles`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Role {
    /// Its objects fill the index.
    pub feeds: bool,
    /// It is Pods that fill the index: their nodes go in too.
    pub fills_nodes: bool,
    /// It is Namespaces (or Nodes) that fill the index: their labels go in too.
    pub fills_labels: Option<Labelled>,
    /// Its messages carry `owners`.
    pub owners: bool,
    /// Its messages carry `node`.
    pub node: bool,
    /// Its messages carry `namespaceLabels`: these labels of their namespace.
    pub namespace_labels: Option<Arc<[String]>>,
    /// Its messages carry `nodeLabels`: these labels of their node.
    pub node_labels: Option<Arc<[String]>>,
    /// Its watches wait for the index's first fill ([`OwnerIndex::ready`]) before listing:
    /// it asks for context. The first fill is the first lists of the resources that fill
    /// the index and do not wait themselves; so a resource that both asks and fills (Pods
    /// for Events, ReplicaSets for their Deployments) may send an incomplete chain in its
    /// first list when it lists an object before the owner's own first list went by.
    pub waits: bool,
}

/// Each resource's role (in order), and the number of watches that fill the index (`None`:
/// no resource asks for context, no index). Every followed kind but Events fills it (any
/// object may own another); Pods only when an Events resource asks for context (a Pod owns
/// nothing, and its own chain starts from its own `ownerReferences`).
pub fn roles(resources: &[(&ResourceConfig, usize)]) -> (Vec<Role>, Option<usize>) {
    let events_context = resources
        .iter()
        .any(|(r, _)| r.mode == ResourceMode::Events && !r.enrich.is_empty());
    if !resources.iter().any(|(r, _)| !r.enrich.is_empty()) {
        return (vec![Role::default(); resources.len()], None);
    }
    let mut feeders = 0;
    let roles = resources
        .iter()
        .map(|(r, scopes)| {
            let feeds = r.mode != ResourceMode::Events && (!r.is_pods() || events_context);
            let waits = !r.enrich.is_empty();
            // A watch that waits is not waited for (it would wait for itself).
            if feeds && !waits {
                feeders += scopes;
            }
            Role {
                feeds,
                fills_nodes: feeds && r.is_pods(),
                fills_labels: match (feeds, r.is_namespaces(), r.is_nodes()) {
                    (true, true, _) => Some(Labelled::Namespace),
                    (true, _, true) => Some(Labelled::Node),
                    _ => None,
                },
                owners: r.enriches(Enrich::Owner),
                node: r.enriches(Enrich::Node),
                namespace_labels: r
                    .enriches(Enrich::Namespace)
                    .then(|| r.namespace_labels.clone().into()),
                node_labels: (r.enriches(Enrich::Node) && !r.node_labels.is_empty())
                    .then(|| r.node_labels.clone().into()),
                waits,
            }
        })
        .collect();
    (roles, Some(feeders))
}

impl Inner {
    fn kind(&mut self, api_version: &str, kind: &str) -> u32 {
        if let Some(i) = self
            .kinds
            .iter()
            .position(|(a, k)| &**a == api_version && &**k == kind)
        {
            return i as u32;
        }
        self.kinds.push((Arc::from(api_version), Arc::from(kind)));
        (self.kinds.len() - 1) as u32
    }

    /// The controller owner `l` names, `None` for a top.
    fn owner_ref(&self, l: &Link) -> Option<OwnerRef> {
        let (api_version, kind) = self.kinds.get(l.kind as usize)?.clone();
        Some(OwnerRef {
            api_version,
            kind,
            name: self.strings.get(l.name).into(),
            uid: self.strings.get(l.uid).into(),
        })
    }

    fn forget_labels(&mut self, place: Labelled, name: &str) {
        for (k, v) in self.labelled[place as usize]
            .remove(name)
            .unwrap_or_default()
        {
            self.strings.release(k);
            self.strings.release(v);
        }
    }

    fn forget(&mut self, uid: &str) {
        if let Some(l) = self.links.remove(&key(uid)) {
            for i in [l.name, l.uid, l.node] {
                if i != NONE {
                    self.strings.release(i);
                }
            }
        }
    }

    /// The chain from `first` (an object's controller owner) up, and whether it reaches a
    /// top.
    fn chain(&self, first: Option<OwnerRef>) -> (Vec<OwnerRef>, bool) {
        let mut out = Vec::new();
        let mut next = first;
        while let Some(r) = next {
            if out.len() == MAX_DEPTH {
                return (out, false);
            }
            let link = self.links.get(&key(&r.uid));
            out.push(r);
            match link {
                None => return (out, false),
                Some(l) => next = self.owner_ref(l),
            }
        }
        (out, true)
    }
}

impl OwnerIndex {
    /// An empty index whose readiness waits for `feeders` watches' first lists.
    pub fn new(feeders: usize) -> Self {
        OwnerIndex {
            inner: Mutex::default(),
            pending: tokio::sync::watch::Sender::new(feeders),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The index holds no invariant a panic could break half-way (each call is one
        // insert or remove): a poisoned lock is used as it is.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the object `uid`: its controller owner (`None`: it has none) and its node.
    pub fn note(&self, uid: &str, owner: Option<&OwnerRef>, node: Option<&str>) {
        if uid.is_empty() {
            return;
        }
        let mut inner = self.lock();
        let k = key(uid);
        if let Some(l) = inner.links.get(&k) {
            let same_owner = match (inner.kinds.get(l.kind as usize), owner) {
                (None, None) => true,
                (Some((api, kind)), Some(o)) => {
                    (
                        &**api,
                        &**kind,
                        inner.strings.get(l.name),
                        inner.strings.get(l.uid),
                    ) == (&*o.api_version, &*o.kind, &*o.name, &*o.uid)
                }
                _ => false,
            };
            let same_node = match (l.node, node) {
                (NONE, None) => true,
                (n, Some(node)) if n != NONE => inner.strings.get(n) == node,
                _ => false,
            };
            if same_owner && same_node {
                return;
            }
        }
        let link = match owner {
            Some(o) => Link {
                kind: inner.kind(&o.api_version, &o.kind),
                name: inner.strings.intern(&o.name),
                uid: inner.strings.intern(&o.uid),
                node: NONE,
            },
            None => Link {
                kind: NONE,
                name: NONE,
                uid: NONE,
                node: NONE,
            },
        };
        let link = Link {
            node: node.map_or(NONE, |n| inner.strings.intern(n)),
            ..link
        };
        inner.forget(uid);
        inner.links.insert(k, link);
    }

    /// Forgets the object `uid` (deleted, or gone while the watch was down).
    pub fn forget(&self, uid: &str) {
        self.lock().forget(uid);
    }

    /// Records Namespace (or Node) `name`'s labels (`metadata.labels`).
    pub fn note_labels(&self, place: Labelled, name: &str, labels: Option<&Map<String, Value>>) {
        let mut inner = self.lock();
        let mut kept: Vec<(u32, u32)> = labels
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
            .map(|(k, v)| (inner.strings.intern(k), inner.strings.intern(v)))
            .collect();
        kept.sort_unstable();
        inner.forget_labels(place, name);
        inner.labelled[place as usize].insert(name.into(), kept);
    }

    /// Forgets Namespace (or Node) `name` (deleted).
    pub fn forget_labels(&self, place: Labelled, name: &str) {
        self.lock().forget_labels(place, name);
    }

    /// The labels `keys` Namespace (or Node) `name` has, in the order of `keys`; `None`
    /// when the index does not hold it.
    pub fn labels(
        &self,
        place: Labelled,
        name: &str,
        keys: &[String],
    ) -> Option<Vec<(Arc<str>, Arc<str>)>> {
        let inner = self.lock();
        let labels = inner.labelled[place as usize].get(name)?;
        Some(
            keys.iter()
                .filter_map(|k| {
                    let (_, v) = labels.iter().find(|(lk, _)| inner.strings.get(*lk) == k)?;
                    Some((Arc::from(k.as_str()), Arc::from(inner.strings.get(*v))))
                })
                .collect(),
        )
    }

    /// The owners of an object whose controller owner is `first`, nearest first, and whether
    /// the chain reaches a top (every owner in it was seen).
    pub fn chain(&self, first: Option<OwnerRef>) -> (Vec<OwnerRef>, bool) {
        self.lock().chain(first)
    }

    /// The owners and node of the indexed object `uid` (an Event's regarding object):
    /// `None` when it is not indexed.
    pub fn of(&self, uid: &str) -> Option<(Vec<OwnerRef>, bool, Option<Arc<str>>)> {
        let inner = self.lock();
        let link = inner.links.get(&key(uid))?;
        let first = inner.owner_ref(link);
        let node = (link.node != NONE).then(|| Arc::from(inner.strings.get(link.node)));
        let (owners, complete) = inner.chain(first);
        Some((owners, complete, node))
    }

    /// Objects indexed.
    pub fn objects(&self) -> usize {
        self.lock().links.len()
    }

    /// One watch that fills the index completed its first list.
    pub fn feeder_synced(&self) {
        self.pending.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Waits until every watch that fills the index completed its first list, or `wait`.
    /// Returns whether they did.
    pub async fn ready(&self, wait: Duration) -> bool {
        let mut rx = self.pending.subscribe();
        tokio::time::timeout(wait, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(kind: &str, name: &str, uid: &str) -> OwnerRef {
        OwnerRef {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    const RS: &str = "00000000-0000-0000-0000-0000000000a1";
    const DEP: &str = "00000000-0000-0000-0000-0000000000d1";
    const POD: &str = "00000000-0000-0000-0000-0000000000b1";

    #[test]
    fn a_chain_reaches_its_top_once_every_owner_is_seen() {
        let i = OwnerIndex::new(0);
        let rs = r("ReplicaSet", "web-1", RS);
        // Before the ReplicaSet is seen: the Pod's own owner, incomplete.
        assert_eq!(i.chain(Some(rs.clone())), (vec![rs.clone()], false));
        i.note(RS, Some(&r("Deployment", "web", DEP)), None);
        let (owners, complete) = i.chain(Some(rs.clone()));
        assert_eq!(owners.len(), 2);
        assert!(!complete, "the Deployment not seen yet");
        i.note(DEP, None, None);
        assert_eq!(
            i.chain(Some(rs.clone())),
            (vec![rs.clone(), r("Deployment", "web", DEP)], true)
        );
        // No controller owner: an empty, complete chain.
        assert_eq!(i.chain(None), (vec![], true));
        // The Deployment deleted: incomplete again.
        i.forget(DEP);
        assert!(!i.chain(Some(rs)).1);
    }

    #[test]
    fn an_indexed_pod_gives_an_event_its_owners_and_node() {
        let i = OwnerIndex::new(0);
        i.note(POD, Some(&r("ReplicaSet", "web-1", RS)), Some("node-a"));
        i.note(RS, Some(&r("Deployment", "web", DEP)), None);
        i.note(DEP, None, None);
        let (owners, complete, node) = i.of(POD).expect("indexed");
        assert_eq!(
            owners.iter().map(|o| &*o.name).collect::<Vec<_>>(),
            ["web-1", "web"]
        );
        assert!(complete);
        assert_eq!(node.as_deref(), Some("node-a"));
        assert!(i.of("not-indexed").is_none());
    }

    #[test]
    fn interned_strings_go_with_the_last_object_that_names_them() {
        let i = OwnerIndex::new(0);
        let pods: Vec<String> = (0..3).map(|n| format!("pod-{n}")).collect();
        for p in &pods {
            i.note(p, Some(&r("ReplicaSet", "web-1", RS)), Some("node-a"));
        }
        // Name, uid and node once, shared by the three.
        assert_eq!(i.lock().strings.len(), 3);
        for p in &pods {
            i.forget(p);
        }
        assert_eq!(i.lock().strings.len(), 0);
        assert_eq!(i.objects(), 0);
        // A moved owner reference replaces the old one.
        i.note("p", Some(&r("ReplicaSet", "a", RS)), None);
        i.note("p", Some(&r("ReplicaSet", "b", RS)), None);
        assert_eq!(&*i.chain(Some(r("Pod", "p", "p"))).0[1].name, "b");
        assert_eq!(i.lock().strings.len(), 2);
    }

    #[test]
    fn a_cycle_of_owner_references_ends_incomplete() {
        let i = OwnerIndex::new(0);
        i.note("a", Some(&r("X", "b", "b")), None);
        i.note("b", Some(&r("X", "a", "a")), None);
        let (owners, complete) = i.chain(Some(r("X", "a", "a")));
        assert_eq!(owners.len(), MAX_DEPTH);
        assert!(!complete);
    }

    #[tokio::test]
    async fn readiness_waits_for_every_feeder_or_the_bound() {
        let i = Arc::new(OwnerIndex::new(2));
        assert!(!i.ready(Duration::from_millis(20)).await);
        i.feeder_synced();
        assert!(!i.ready(Duration::from_millis(20)).await);
        let waiting = tokio::spawn({
            let i = i.clone();
            async move { i.ready(Duration::from_secs(60)).await }
        });
        i.feeder_synced();
        assert!(waiting.await.expect("joined"));
    }

    #[test]
    fn the_kinds_that_own_fill_the_index_and_those_that_ask_wait_for_them() {
        let with = |api: &str, kind: &str, enrich: &[Enrich]| ResourceConfig {
            enrich: enrich.to_vec(),
            ..ResourceConfig::new(api, kind)
        };
        let pods = with("v1", "Pod", &[Enrich::Owner]);
        let rs = with("apps/v1", "ReplicaSet", &[]);
        let deploys = with("apps/v1", "Deployment", &[]);
        let (r, feeders) = roles(&[(&pods, 1), (&rs, 2), (&deploys, 1)]);
        assert_eq!(
            feeders,
            Some(3),
            "two namespaces of ReplicaSets, one of Deployments"
        );
        assert!(!r[0].feeds && r[0].waits && r[0].owners && !r[0].node);
        assert!(r[1].feeds && !r[1].waits && !r[1].owners);
        assert!(!r[0].fills_nodes && !r[1].fills_nodes && r[1].fills_labels.is_none());
        // An Events resource that asks for context: Pods fill the index too (their owners
        // and nodes), and still wait, so they are not waited for.
        let events = ResourceConfig {
            mode: ResourceMode::Events,
            ..with("events.k8s.io/v1", "Event", &[Enrich::Owner, Enrich::Node])
        };
        let (r, feeders) = roles(&[(&pods, 1), (&rs, 2), (&events, 1)]);
        assert_eq!(feeders, Some(2));
        assert!(r[0].feeds && r[0].waits && r[0].fills_nodes);
        assert!(!r[2].feeds && r[2].waits && r[2].node);
        // Namespaces fill the index with their labels.
        let namespaces = with("v1", "Namespace", &[]);
        let (r, _) = roles(&[(&pods, 1), (&namespaces, 1)]);
        assert!(r[1].feeds && r[1].fills_labels == Some(Labelled::Namespace) && !r[1].fills_nodes);
        // Nodes with theirs, and a resource with node_labels reads them.
        let nodes = with("v1", "Node", &[]);
        let zoned = ResourceConfig {
            node_labels: vec!["topology.kubernetes.io/zone".into()],
            ..with("v1", "Pod", &[Enrich::Node])
        };
        let (r, _) = roles(&[(&zoned, 1), (&nodes, 1)]);
        assert_eq!(r[1].fills_labels, Some(Labelled::Node));
        assert_eq!(r[0].node_labels.as_deref(), Some(&zoned.node_labels[..]));
        // Nobody asks: no index at all.
        assert_eq!(roles(&[(&rs, 1)]).1, None);
    }

    #[test]
    fn the_index_watches_what_no_entry_follows_where_its_askers_watch() {
        let with = |api: &str, kind: &str, enrich: &[Enrich]| ResourceConfig {
            enrich: enrich.to_vec(),
            ..ResourceConfig::new(api, kind)
        };
        let names = |rs: &[ResourceConfig]| -> Vec<String> {
            index_resources(rs)
                .iter()
                .map(|r| format!("{} {:?}", r.kind, r.namespaces))
                .collect()
        };
        let mut pods = with(
            "v1",
            "Pod",
            &[Enrich::Owner, Enrich::Node, Enrich::Namespace],
        );
        pods.namespaces = vec!["b".into(), "a".into()];
        pods.node_labels = vec!["topology.kubernetes.io/zone".into()];
        let mut rs = with("apps/v1", "ReplicaSet", &[]);
        rs.namespaces = vec!["a".into()];
        let deploys = with("apps/v1", "Deployment", &[]);
        assert_eq!(
            names(&[pods.clone(), rs, deploys]),
            [
                "Node []",
                "Namespace []",
                "ReplicaSet [\"a\", \"b\"]",
                "StatefulSet [\"a\", \"b\"]",
                "DaemonSet [\"a\", \"b\"]",
                "Job [\"a\", \"b\"]",
                "CronJob [\"a\", \"b\"]",
            ],
            "ReplicaSets followed in a only; Deployments everywhere"
        );
        assert!(index_resources(&[with("v1", "Pod", &[])]).is_empty());
        assert!(index_resources(&[pods])
            .iter()
            .all(|r| r.payload == crate::config::PayloadMode::Metadata));
    }

    #[test]
    fn an_indexed_object_costs() {
        // The figure in the module docs: a table slot's key and value.
        assert_eq!(std::mem::size_of::<(u128, Link)>(), 32);
    }
}
