//! Structural validation of custom resources against their CRD's `openAPIV3Schema`: only
//! `type`, `required`, `properties`, `items` and `x-kubernetes-int-or-string`, producing the
//! 422 `Invalid` Status the real server sends (causes `FieldValueRequired` /
//! `FieldValueTypeInvalid`; see `custom_resource_definition-test.json`). Built-in types are
//! never validated here.

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceType;

/// (reason, message, field) of one validation failure.
type Cause = (String, String, String);

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    let actual = type_name(value);
    let mismatch = |expected: &str, causes: &mut Vec<Cause>| {
        causes.push((
            "FieldValueTypeInvalid".into(),
            format!("Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""),
            path.to_owned(),
        ));
    };
    if schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
    {
        if actual != "integer" && actual != "string" {
            mismatch("integer,string", causes);
        }
        return;
    }
    let ok = match schema.get("type").and_then(Value::as_str) {
        None => true,
        Some("number") => actual == "number" || actual == "integer",
        Some(t) => t == actual,
    };
    if !ok {
        if let Some(t) = schema.get("type").and_then(Value::as_str) {
            mismatch(t, causes);
        }
        return;
    }
    let join = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    if let Some(obj) = value.as_object() {
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(r) = req.as_str() {
                let server_filled =
                    path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&r);
                if !obj.contains_key(r) && !server_filled {
                    causes.push((
                        "FieldValueRequired".into(),
                        "Required value".into(),
                        join(r),
                    ));
                }
            }
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (k, sub) in props {
                if path.is_empty() && (k == "metadata" || k == "apiVersion" || k == "kind") {
                    continue;
                }
                if let Some(v) = obj.get(k) {
                    check(sub, v, &join(k), causes);
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            check(items, v, &format!("{path}[{i}]"), causes);
        }
    }
}

/// Validates `obj` (a custom resource named `name`) against `rt.schema`; Ok for built-ins.
/// Errors: 422 `Invalid` with one cause per failure.
pub fn validate(rt: &ResourceType, name: &str, obj: &Value) -> Result<(), ApiError> {
    let Some(schema) = &rt.schema else {
        return Ok(());
    };
    let mut causes = Vec::new();
    check(schema, obj, "", &mut causes);
    if causes.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = causes.iter().map(|(_, m, f)| format!("{f}: {m}")).collect();
    let message = if parts.len() == 1 {
        parts.join("")
    } else {
        format!("[{}]", parts.join(", "))
    };
    Err(ApiError::Invalid {
        group: rt.group.clone(),
        kind: rt.kind.clone(),
        name: name.to_owned(),
        message,
        causes,
    })
}
