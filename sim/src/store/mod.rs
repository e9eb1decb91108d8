//! The object store: current objects per resource, one global resourceVersion counter (like
//! etcd's revision: one sequence across all resources, rendered as decimal strings), and an
//! event log of recent changes retained for `retained_events` events. Writes set the server
//! fields the API conventions assign (`uid`, `resourceVersion`, `creationTimestamp`,
//! `generation` bumped when `spec` changes; see
//! <https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#metadata>)
//! and publish each change to live watchers through a broadcast channel. Deleting a
//! CustomResourceDefinition deletes its objects, stops serving its resource and tells that
//! resource's watchers it is gone; a recreated CRD serves its resource anew, readable only
//! from the recreation on. Objects of any nesting depth are handled on a big enough stack
//! (see `crate::json`). This module never speaks HTTP and never renders list or watch bodies.

mod crd;
mod object;
mod raw;
mod snapshot;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::broadcast;

use crd::add_crd_status;
pub use object::{now_rfc3339, StoredObject};
pub use raw::RawResourceVersion;
pub use snapshot::PageRequest;

use crate::error::ApiError;
use crate::json;
use crate::resources::{Registry, ResourceKey, ResourceType};
use crate::validation;

/// (namespace, name); namespace is "" for cluster-scoped objects. Lists sort by this key.
pub type ObjKey = (String, String);

/// Internal store failures (serialization); surface as 500 or 400 through [`ApiError`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object has no `metadata` object.
    #[error("object has no metadata")]
    MissingMetadata,
    /// The object is not a JSON object.
    #[error("the object is not a JSON object")]
    NotAnObject,
    /// JSON (de)serialization failed.
    #[error("json: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal {
            message: e.to_string(),
        }
    }
}

/// The watch event types of `metav1.WatchEvent` that a write produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object replaced.
    Modified,
    /// Object deleted.
    Deleted,
    /// The resource itself stopped being served (its CustomResourceDefinition was deleted);
    /// sent to live watchers after the DELETED events of its objects, never logged.
    ResourceRemoved,
}

/// One change, as kept in the log and sent to live watchers.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion this change created.
    pub rv: u64,
    /// What happened.
    pub event_type: EventType,
    /// Which resource.
    pub resource: ResourceKey,
    /// The object after the change (for DELETED: the last state, stamped with `rv`).
    pub object: Arc<StoredObject>,
    /// The object before the change (None for ADDED).
    pub prev: Option<Arc<StoredObject>>,
}

/// The store. Callers hold it behind one mutex; every method is synchronous and short.
pub struct Store {
    rv: u64,
    compacted_rv: u64,
    retained: usize,
    /// Served resource types (CRD writes change it).
    pub registry: Registry,
    objects: HashMap<ResourceKey, BTreeMap<ObjKey, Arc<StoredObject>>>,
    /// The resourceVersion at which each custom resource started being served (its CRD's
    /// creation): versions before it are not readable for that resource (410 Expired).
    served_since: HashMap<ResourceKey, u64>,
    log: VecDeque<Arc<Event>>,
    tx: broadcast::Sender<Arc<Event>>,
}

fn meta_mut(obj: &mut Value) -> Result<&mut serde_json::Map<String, Value>, ApiError> {
    obj.get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| ApiError::bad_request("Object 'metadata' is missing or not an object"))
}

fn str_field(obj: &Value, pointer: &str) -> Option<String> {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

impl Store {
    /// An empty store with the built-in resources; `retained` events are kept in the log and
    /// live watchers may lag at most `channel_capacity` events before being closed.
    pub fn new(retained: usize, channel_capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(channel_capacity.max(16));
        Store {
            rv: 0,
            compacted_rv: 0,
            retained,
            registry: Registry::default(),
            objects: HashMap::new(),
            served_since: HashMap::new(),
            log: VecDeque::new(),
            tx,
        }
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Compacts the history at a new revision: the revision moves on by one with no event of
    /// any served resource (a write elsewhere in etcd, such as a Lease or an Event) and every
    /// older version becomes unreadable, so each watch or `continue` from before it gets
    /// 410 Expired, whatever the order the clients come back in, while a list made after it
    /// and the watch from that list's resourceVersion are served. Returns the new revision.
    pub fn compact(&mut self) -> u64 {
        self.rv += 1;
        self.compacted_rv = self.rv;
        self.log.clear();
        self.rv
    }

    /// The oldest resourceVersion of `resource` that can still be read or watched from:
    /// versions below it have been compacted out of the log, or come before the creation of
    /// the CRD that serves the resource, so a watch or `continue` from before a CRD was
    /// (re)created gets 410 Expired, as from a real API server's fresh watch cache.
    pub fn oldest_readable_rv_for(&self, resource: &ResourceKey) -> u64 {
        self.compacted_rv
            .max(self.served_since.get(resource).copied().unwrap_or(0))
    }

    /// A live-event receiver; subscribe while holding the lock, then read the backlog, so no
    /// event is lost or duplicated between them.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Logged events of `resource` with rv > `after`. The caller checks the window first.
    pub fn events_after(&self, resource: &ResourceKey, after: u64) -> Vec<Arc<Event>> {
        let start = self.log.partition_point(|e| e.rv <= after);
        self.log
            .range(start..)
            .filter(|e| e.resource == *resource)
            .cloned()
            .collect()
    }

    /// The current object `name` of `rt` in `namespace`.
    pub fn get(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
        self.objects
            .get(&rt.key())
            .and_then(|m| m.get(&(namespace.to_owned(), name.to_owned())))
            .cloned()
            .ok_or_else(|| not_found(rt, name))
    }

    /// Keys of all current objects of a resource, sorted.
    pub fn keys(&self, rt: &ResourceType) -> Vec<ObjKey> {
        self.objects
            .get(&rt.key())
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn resolve_namespace(
        rt: &ResourceType,
        path_ns: Option<&str>,
        obj: &Value,
    ) -> Result<String, ApiError> {
        if !rt.namespaced {
            return Ok(String::new());
        }
        let body_ns = str_field(obj, "/metadata/namespace").filter(|s| !s.is_empty());
        match (path_ns, body_ns) {
            (Some(p), Some(b)) if p != b => Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            )),
            (Some(p), _) => Ok(p.to_owned()),
            (None, Some(b)) => Ok(b),
            (None, None) => Ok("default".to_owned()),
        }
    }

    fn stamp(rt: &ResourceType, obj: &mut Value, namespace: &str) -> Result<(), ApiError> {
        let map = obj
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("the body is not a JSON object"))?;
        map.insert("kind".into(), Value::String(rt.kind.clone()));
        map.insert("apiVersion".into(), Value::String(rt.api_version()));
        let meta = meta_mut(obj)?;
        if namespace.is_empty() {
            meta.remove("namespace");
        } else {
            meta.insert("namespace".into(), Value::String(namespace.to_owned()));
        }
        Ok(())
    }

    /// Creates an object (POST semantics). `path_ns` is the namespace from the URL, if any.
    /// Errors: 400 (no name, namespace mismatch), 409 AlreadyExists, 422 Invalid (CR schema).
    pub fn create(
        &mut self,
        rt: &ResourceType,
        path_ns: Option<&str>,
        obj: Value,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let depth = json::depth_of_value(&obj);
        json::with_stack_for(depth, move || self.create_now(rt, path_ns, obj))
    }

    fn create_now(
        &mut self,
        rt: &ResourceType,
        path_ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let namespace = Self::resolve_namespace(rt, path_ns, &obj)?;
        Self::stamp(rt, &mut obj, &namespace)?;
        let mut name = str_field(&obj, "/metadata/name").unwrap_or_default();
        if name.is_empty() {
            let prefix =
                str_field(&obj, "/metadata/generateName").ok_or_else(|| ApiError::Invalid {
                    group: rt.group.clone(),
                    kind: rt.kind.clone(),
                    name: String::new(),
                    message: "metadata.name: Required value: name or generateName is required"
                        .into(),
                    causes: vec![(
                        "FieldValueRequired".into(),
                        "Required value: name or generateName is required".into(),
                        "metadata.name".into(),
                    )],
                })?;
            let suffix: String = uuid::Uuid::new_v4()
                .simple()
                .to_string()
                .chars()
                .take(5)
                .collect();
            name = format!("{prefix}{suffix}");
        }
        validation::validate(rt, &name, &obj)?;
        let key = (namespace, name.clone());
        if self
            .objects
            .get(&rt.key())
            .is_some_and(|m| m.contains_key(&key))
        {
            return Err(ApiError::AlreadyExists {
                group: rt.group.clone(),
                resource: rt.plural.clone(),
                name,
            });
        }
        let new_type =
            if rt.plural == "customresourcedefinitions" && rt.group == "apiextensions.k8s.io" {
                let t = ResourceType::from_crd(&obj)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                add_crd_status(&mut obj);
                Some(t)
            } else {
                None
            };
        let rv = self.rv + 1;
        let meta = meta_mut(&mut obj)?;
        meta.insert("name".into(), Value::String(name));
        meta.insert(
            "uid".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        let stored = Arc::new(StoredObject::from_value(&obj, rv)?);
        self.rv = rv;
        self.objects
            .entry(rt.key())
            .or_default()
            .insert(key, stored.clone());
        if let Some(t) = new_type {
            self.served_since.insert(t.key(), rv);
            self.registry.register(t);
        }
        self.record(EventType::Added, rt.key(), stored.clone(), None);
        Ok(stored)
    }

    /// Replaces an object (PUT semantics). A non-empty `metadata.resourceVersion` in the body
    /// must equal the current one, else 409 Conflict (optimistic concurrency,
    /// <https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#concurrency-control-and-consistency>);
    /// an empty one replaces unconditionally. 404 if absent; 400 if `path_name` differs from
    /// the body's name.
    pub fn replace(
        &mut self,
        rt: &ResourceType,
        path_ns: Option<&str>,
        path_name: Option<&str>,
        obj: Value,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let depth = json::depth_of_value(&obj);
        json::with_stack_for(depth, move || self.replace_now(rt, path_ns, path_name, obj))
    }

    fn replace_now(
        &mut self,
        rt: &ResourceType,
        path_ns: Option<&str>,
        path_name: Option<&str>,
        mut obj: Value,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let namespace = Self::resolve_namespace(rt, path_ns, &obj)?;
        Self::stamp(rt, &mut obj, &namespace)?;
        let name = str_field(&obj, "/metadata/name").unwrap_or_default();
        if let Some(p) = path_name {
            if p != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({name}) does not match the name on the URL ({p})"
                )));
            }
        }
        let old = self.get(rt, &namespace, &name)?;
        json::with_stack_for(old.depth, move || {
            self.replace_existing(rt, namespace, name, old, obj)
        })
    }

    /// The rest of [`Store::replace`] once the current object `old` is known.
    fn replace_existing(
        &mut self,
        rt: &ResourceType,
        namespace: String,
        name: String,
        old: Arc<StoredObject>,
        mut obj: Value,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let sent_rv = str_field(&obj, "/metadata/resourceVersion").unwrap_or_default();
        if !sent_rv.is_empty() && sent_rv != old.rv.to_string() {
            return Err(ApiError::Conflict {
                group: rt.group.clone(),
                resource: rt.plural.clone(),
                name,
            });
        }
        validation::validate(rt, &name, &obj)?;
        let old_value = old.to_value()?;
        let old_gen = old_value
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if old_value.get("spec") != obj.get("spec") {
            old_gen + 1
        } else {
            old_gen
        };
        let rv = self.rv + 1;
        let meta = meta_mut(&mut obj)?;
        meta.insert("uid".into(), Value::String(old.uid.clone()));
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        if let Some(ts) = old_value.pointer("/metadata/creationTimestamp") {
            meta.insert("creationTimestamp".into(), ts.clone());
        }
        meta.insert("generation".into(), json!(generation));
        // A write that changes nothing is a no-op, as in the real API server: no new
        // resourceVersion and no watch event.
        let mut unchanged = old_value.clone();
        meta_mut(&mut unchanged)?.insert("resourceVersion".into(), Value::String(rv.to_string()));
        if unchanged == obj {
            return Ok(old);
        }
        let stored = Arc::new(StoredObject::from_value(&obj, rv)?);
        self.rv = rv;
        self.objects
            .entry(rt.key())
            .or_default()
            .insert((namespace, name), stored.clone());
        self.record(EventType::Modified, rt.key(), stored.clone(), Some(old));
        Ok(stored)
    }

    /// Deletes an object immediately (no finalizers or grace periods); returns the deleted
    /// object stamped with the deletion's resourceVersion. Deleting a CRD also deletes its
    /// custom objects (each a DELETED event), stops serving its resource (discovery and paths
    /// answer 404) and sends the resource's live watchers a `ResourceRemoved` event after
    /// those DELETED events. 404 if absent.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let old = self.get(rt, namespace, name)?;
        json::with_stack_for(old.depth, || self.delete_existing(rt, old))
    }

    fn delete_existing(
        &mut self,
        rt: &ResourceType,
        old: Arc<StoredObject>,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let removed =
            if rt.plural == "customresourcedefinitions" && rt.group == "apiextensions.k8s.io" {
                ResourceType::from_crd(&old.to_value()?).ok()
            } else {
                None
            };
        if let Some(t) = &removed {
            for (ns, n) in self.keys(t) {
                self.delete(t, &ns, &n)?;
            }
            self.registry.unregister(&t.group, &t.version, &t.plural);
        }
        let rv = self.rv + 1;
        let mut value = old.to_value()?;
        meta_mut(&mut value)?.insert("resourceVersion".into(), Value::String(rv.to_string()));
        let stored = Arc::new(StoredObject::from_value(&value, rv)?);
        self.rv = rv;
        if let Some(m) = self.objects.get_mut(&rt.key()) {
            m.remove(&(old.namespace.clone(), old.name.clone()));
        }
        if let Some(t) = removed {
            // Not logged: it only tells live watchers to end (or, with the fault, go silent).
            let _ = self.tx.send(Arc::new(Event {
                rv,
                event_type: EventType::ResourceRemoved,
                resource: t.key(),
                object: stored.clone(),
                prev: None,
            }));
        }
        self.record(EventType::Deleted, rt.key(), stored.clone(), Some(old));
        Ok(stored)
    }

    pub(super) fn record(
        &mut self,
        event_type: EventType,
        resource: ResourceKey,
        object: Arc<StoredObject>,
        prev: Option<Arc<StoredObject>>,
    ) {
        let ev = Arc::new(Event {
            rv: object.rv,
            event_type,
            resource,
            object,
            prev,
        });
        self.log.push_back(ev.clone());
        while self.log.len() > self.retained {
            match self.log.pop_front() {
                Some(old) => self.compacted_rv = old.rv,
                None => break,
            }
        }
        if self.retained == 0 {
            self.compacted_rv = self.rv;
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(ev);
    }
}

fn not_found(rt: &ResourceType, name: &str) -> ApiError {
    ApiError::NotFound {
        group: rt.group.clone(),
        resource: rt.plural.clone(),
        name: name.to_owned(),
    }
}
