//! PATCH with JSON merge patch semantics (RFC 7386) for `application/merge-patch+json` and,
//! as an approximation, `application/strategic-merge-patch+json` (lists are replaced, not
//! merged by key). See <https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/>.
//! JSON patch and server-side apply are not supported.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::error::ApiError;
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
pub fn patch(
    store: &mut Store,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    body: &Bytes,
) -> Result<Arc<StoredObject>, ApiError> {
    let p: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid patch: {e}")))?;
    if !p.is_object() {
        return Err(ApiError::bad_request(
            "only merge patches (a JSON object) are supported",
        ));
    }
    let current = store.get(rt, namespace, name)?;
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
