//! Why a configured resource did not resolve, in words that point at the fix: the nearest
//! kind the group/version serves (`kind "Pdo" not served by v1 (did you mean "Pod"?)`), the
//! group/version the kind is served under instead, the versions a group serves, the nearest
//! group. Only asked after discovery failed, so the extra requests cost nothing on the way
//! that works.

use crate::plan::kinds::nearest;
use std::time::Duration;

use kube::discovery::Discovery;
use kube::Client;

use super::within;
use crate::config::ResourceConfig;

/// What to tell about `res`, whose discovery answered 404 or without its kind.
pub(super) async fn diagnose(client: &Client, res: &ResourceConfig, timeout: Duration) -> String {
    let (group, version) = res.group_version();
    let listed = if group.is_empty() {
        within(timeout, client.list_core_api_resources(version)).await
    } else {
        within(timeout, client.list_api_group_resources(&res.api_version)).await
    };
    match listed {
        Ok(list) => {
            let mut kinds: Vec<&str> = list
                .resources
                .iter()
                .filter(|r| !r.name.contains('/'))
                .map(|r| r.kind.as_str())
                .collect();
            kinds.sort_unstable();
            kinds.dedup();
            let not_served = format!("kind {:?} not served by {}", res.kind, res.api_version);
            if let Some(near) = nearest(&res.kind, kinds.iter().copied()) {
                return format!("{not_served} (did you mean {near:?}?)");
            }
            match served_elsewhere(client, &res.kind, timeout).await {
                Some(elsewhere) => format!("{not_served} (served by {elsewhere})"),
                None => format!("{not_served}; is its CRD installed?"),
            }
        }
        Err(e) if e.code() == Some(404) => version_not_served(client, res, timeout).await,
        Err(e) => format!("API discovery of {} failed: {e}", res.api_version),
    }
}

/// The group/version is not served: what the group serves, or the nearest group.
async fn version_not_served(client: &Client, res: &ResourceConfig, timeout: Duration) -> String {
    let (group, version) = res.group_version();
    if group.is_empty() {
        let versions = within(timeout, client.list_core_api_versions())
            .await
            .map(|v| v.versions.join(", "))
            .unwrap_or_default();
        return format!(
            "apiVersion {:?} not served (the core group serves {versions})",
            res.api_version
        );
    }
    let groups = match within(timeout, client.list_api_groups()).await {
        Ok(g) => g.groups,
        Err(e) => return format!("apiVersion {:?} not served ({e})", res.api_version),
    };
    if let Some(g) = groups.iter().find(|g| g.name == group) {
        let versions: Vec<&str> = g.versions.iter().map(|v| v.version.as_str()).collect();
        return format!(
            "{group}/{version} not served (the API group {group} serves {})",
            versions.join(", ")
        );
    }
    let mut names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    names.sort_unstable();
    match nearest(group, names.iter().copied()) {
        Some(near) => format!("API group {group:?} not served (did you mean {near:?}?)"),
        None => format!("API group {group:?} not served; is its CRD installed?"),
    }
}

/// Where the server serves a kind spelt `kind` (ignoring case): `apps/v1`, or `apps/v1 as
/// "Deployment"` when the case differs, from a full discovery (one request per group
/// version).
async fn served_elsewhere(client: &Client, kind: &str, timeout: Duration) -> Option<String> {
    let discovery = tokio::time::timeout(timeout, Discovery::new(client.clone()).run())
        .await
        .ok()?
        .ok()?;
    let mut found: Vec<String> = discovery
        .groups()
        .flat_map(|g| g.versions().flat_map(|v| g.versioned_resources(v)))
        .filter(|(ar, _)| ar.kind.eq_ignore_ascii_case(kind))
        .map(|(ar, _)| match ar.kind == kind {
            true => ar.api_version.clone(),
            false => format!("{} as {:?}", ar.api_version, ar.kind),
        })
        .collect();
    found.sort();
    found.dedup();
    (!found.is_empty()).then(|| found.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_kind_is_a_small_edit_or_a_case_away() {
        let kinds = ["ConfigMap", "Node", "Pod", "PodTemplate", "Service"];
        let near = |w: &str| nearest(w, kinds.iter().copied());
        assert_eq!(near("Pdo"), Some("Pod"));
        assert_eq!(near("pod"), Some("Pod"));
        assert_eq!(near("Servcie"), Some("Service"));
        assert_eq!(near("Configmap"), Some("ConfigMap"));
        assert_eq!(near("Foo"), None);
        assert_eq!(near("Deployment"), None);
        assert_eq!(
            nearest("Deploymnet", ["DaemonSet", "Deployment"].into_iter()),
            Some("Deployment")
        );
        assert_eq!(nearest("app", ["apps", "batch"].into_iter()), Some("apps"));
    }
}
