//! Discovery documents: `/version`, `/api` (APIVersions), `/api/v1` and `/apis/{g}/{v}`
//! (APIResourceList), `/apis` (APIGroupList) and `/apis/{g}` (APIGroup), in the legacy
//! (unaggregated) form (<https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api>),
//! `authorization.k8s.io/v1` among the groups (it serves `selfsubjectaccessreviews`).
//! Clients asking for aggregated discovery get the legacy `application/json` documents and
//! fall back to them, as kubectl and client-go do. Read-only.

use serde_json::{json, Value};

use super::access_review;
use crate::error::ApiError;
use crate::resources::Registry;

/// The `version.Info` document of release `major.minor`.
pub fn version((major, minor): (u32, u32)) -> Value {
    json!({
        "major": major.to_string(),
        "minor": minor.to_string(),
        "emulationMajor": major.to_string(),
        "emulationMinor": minor.to_string(),
        "gitVersion": format!("v{major}.{minor}.0"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-05-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`: the core group's versions.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": vs, "preferredVersion": preferred})
}

fn groups(registry: &Registry) -> Vec<(String, Vec<String>)> {
    // authorization.k8s.io serves access reviews, which are not objects of the registry.
    let mut out: Vec<(String, Vec<String>)> = vec![(
        access_review::GROUP.to_owned(),
        vec![access_review::VERSION.to_owned()],
    )];
    for (g, v) in registry.group_versions() {
        match out.iter_mut().find(|(name, _)| *name == g) {
            Some((_, vs)) => vs.push(v),
            None => out.push((g, vec![v])),
        }
    }
    out
}

/// `/apis`: every non-core group (built-in and from CRDs).
pub fn api_group_list(registry: &Registry) -> Value {
    let gs: Vec<Value> = groups(registry)
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

/// `/apis/{group}`; 404 for an unknown group.
pub fn api_group(registry: &Registry, group: &str) -> Result<Value, ApiError> {
    let (name, vs) = groups(registry)
        .into_iter()
        .find(|(g, _)| g == group)
        .ok_or_else(|| ApiError::UnknownResource {
            path: format!("/apis/{group}"),
        })?;
    let mut doc = group_doc(&name, &vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Ok(doc)
}

/// `/api/v1` or `/apis/{group}/{version}`; 404 if nothing is served there.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Result<Value, ApiError> {
    if (group, version) == (access_review::GROUP, access_review::VERSION) {
        return Ok(json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("{group}/{version}"), "resources": access_review::discovery_entries()}));
    }
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return Err(ApiError::UnknownResource {
            path: format!("{group}/{version}"),
        });
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let resources: Vec<Value> = types.iter().map(|t| t.discovery_entry()).collect();
    Ok(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}
