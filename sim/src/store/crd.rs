//! CustomResourceDefinition bookkeeping the store applies when a CRD is created: the
//! apiextensions defaults and the status of an established CRD
//! (<https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/>).
//! Serving, unserving and the cascade on delete stay in the store itself.

use serde_json::{json, Value};

use super::now_rfc3339;

/// Applies the apiextensions defaults (`spec.names.listKind`, `spec.conversion`) and sets the
/// status a real server reports once a CRD is established.
pub(super) fn add_crd_status(obj: &mut Value) {
    if let Some(names) = obj
        .pointer_mut("/spec/names")
        .and_then(Value::as_object_mut)
    {
        if !names.contains_key("listKind") {
            let list_kind = names
                .get("kind")
                .and_then(Value::as_str)
                .map(|k| format!("{k}List"))
                .unwrap_or_default();
            names.insert("listKind".into(), Value::String(list_kind));
        }
    }
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("conversion")
            .or_insert_with(|| json!({"strategy": "None"}));
    }
    let names = obj.pointer("/spec/names").cloned().unwrap_or(Value::Null);
    let now = now_rfc3339();
    if let Some(map) = obj.as_object_mut() {
        map.insert(
            "status".into(),
            json!({
                "acceptedNames": names,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts", "message": "no conflicts found"},
                    {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}
                ],
                "storedVersions": ["v1"]
            }),
        );
    }
}
