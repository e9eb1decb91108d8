//! PATCH with JSON merge patch semantics (RFC 7386) for `application/merge-patch+json` and,
//! as an approximation, `application/strategic-merge-patch+json` (lists are replaced, not
//! merged by key). See <https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/>.
//! JSON patch and server-side apply are not supported.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::error::ApiError;
use crate::json;
use crate::resources::ResourceType;
use crate::store::{Store, StoredObject};

fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// Applies a merge patch to the current object and stores it like a PUT (a
/// `metadata.resourceVersion` in the patch is a precondition). 404 if absent, 400 on bad JSON.
/// Patches and objects of any nesting depth are merged on a big enough stack.
pub fn patch(
    store: &mut Store,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    body: &Bytes,
) -> Result<Arc<StoredObject>, ApiError> {
    let current = store.get(rt, namespace, name)?;
    let depth = json::depth_of_bytes(body).max(current.depth);
    json::with_stack_for(depth, || patch_existing(store, rt, current, body))
}

fn patch_existing(
    store: &mut Store,
    rt: &ResourceType,
    current: Arc<StoredObject>,
    body: &Bytes,
) -> Result<Arc<StoredObject>, ApiError> {
    let (namespace, name) = (current.namespace.as_str(), current.name.as_str());
    let p: Value =
        json::parse(body).map_err(|e| ApiError::bad_request(format!("invalid patch: {e}")))?;
    if !p.is_object() {
        return Err(ApiError::bad_request(
            "only merge patches (a JSON object) are supported",
        ));
    }
    let mut obj = current.to_value()?;
    let precondition = p.pointer("/metadata/resourceVersion").cloned();
    merge(&mut obj, &p);
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        match precondition {
            Some(rv) => meta.insert("resourceVersion".into(), rv),
            None => meta.remove("resourceVersion"),
        };
    }
    let ns = (!namespace.is_empty()).then_some(namespace);
    store.replace(rt, ns, Some(name), obj)
}
