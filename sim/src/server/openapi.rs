//! A minimal OpenAPI v3 surface (`/openapi/v3` and `/openapi/v3/{api/v1|apis/g/v}`) listing,
//! per served kind, a PATCH operation that accepts the `fieldValidation` query parameter.
//! That is what kubectl checks before it relies on server-side field validation
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation>) instead of
//! downloading full schemas; without it `kubectl create -f` fails. Schemas are not served.

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::resources::Registry;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the per-group-version document index.
pub fn root(registry: &Registry) -> Value {
    let mut paths = Map::new();
    let mut gvs = vec![(String::new(), "v1".to_owned())];
    gvs.extend(registry.group_versions());
    for (g, v) in gvs {
        let p = gv_path(&g, &v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=0")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/{gv}`; 404 if nothing is served under that group/version.
pub fn group_version(registry: &Registry, group: &str, version: &str) -> Result<Value, ApiError> {
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return Err(ApiError::UnknownResource {
            path: format!("/openapi/v3/{}", gv_path(group, version)),
        });
    }
    let mut paths = Map::new();
    for t in types {
        let ns = if t.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let path = format!("/{}/{ns}{}/{{name}}", gv_path(group, version), t.plural);
        paths.insert(
            path,
            json!({"patch": {
                "x-kubernetes-group-version-kind": {"group": t.group, "version": t.version, "kind": t.kind},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
                "responses": {"200": {"description": "OK"}}
            }}),
        );
    }
    Ok(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.36.0"},
        "paths": paths,
        "components": {"schemas": {}}
    }))
}
