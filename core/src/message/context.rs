//! Where an object runs, as a message carries it (`[[resources]] enrich`,
//! docs/message-contract.md "Context"): the chain of its controller owners, its node and its
//! chosen labels, and its namespace's chosen labels.
//! Resolved by the informer from its owner index (`src/informer/owners.rs`); this module
//! only holds and writes it.

use std::sync::Arc;

use serde::Serialize;

/// One controller owner: what an `ownerReferences` entry with `controller: true` names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRef {
    /// The owner's `apiVersion` (`apps/v1`).
    pub api_version: Arc<str>,
    /// The owner's kind (`ReplicaSet`).
    pub kind: Arc<str>,
    /// The owner's name.
    pub name: Arc<str>,
    /// The owner's uid.
    pub uid: Arc<str>,
}

/// The context of one change (`enrich`): the message's `owners`, `ownersComplete` and
/// `node`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Context {
    /// With `enrich = ["owner"]`: the controller owners, nearest first (a Pod's ReplicaSet,
    /// then its Deployment); empty for an object without a controller owner.
    pub owners: Option<Vec<OwnerRef>>,
    /// Whether `owners` reaches the top: `false` when an owner in the chain was not (yet)
    /// seen by any of the cluster's watches, so its own owner is unknown.
    pub owners_complete: bool,
    /// With `enrich = ["node"]`: the node the Pod runs on (`spec.nodeName`; for an Event,
    /// its regarding Pod's), when known.
    pub node: Option<Arc<str>>,
    /// With `enrich = ["namespace"]`: the `namespace_labels` its namespace has, as
    /// (key, value) in the configured order; `None` when the namespace is not known (not
    /// followed, not seen yet, or a cluster-scoped object).
    pub namespace_labels: Option<Vec<(Arc<str>, Arc<str>)>>,
    /// With `enrich = ["node"]` and `node_labels`: those labels its node has (a Pod's; for
    /// an Event, its regarding Pod's node's), as (key, value) in the configured order;
    /// `None` when the node is not known (no node yet, Nodes not followed, not seen yet).
    pub node_labels: Option<Vec<(Arc<str>, Arc<str>)>>,
}

/// [`Context::namespace_labels`] and [`Context::node_labels`] as the message writes them: a
/// JSON object.
#[derive(Debug)]
pub struct Labels<'a>(pub &'a [(Arc<str>, Arc<str>)]);

impl Serialize for Labels<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (&**k, &**v)))
    }
}

impl Context {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.owners.is_none()
            && self.node.is_none()
            && self.namespace_labels.is_none()
            && self.node_labels.is_none()
    }
}
