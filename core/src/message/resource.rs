//! The identity of a watched resource, defined once: cluster, API group, version, kind,
//! plural and scope. One [`Resource`] is resolved per configured resource (API discovery) and
//! shared behind an `Arc` by every message of that resource, so nothing is copied per
//! message and the "group or `core`" rule lives in [`Resource::group_or_core`] alone.

use std::fmt;

/// One watched resource (`apps/v1 Deployment` of cluster `prod-eu-1`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Resource {
    /// `cluster.name` from the configuration.
    pub cluster: String,
    /// API group, empty for the core group (`""`, `apps`, `example.com`).
    pub group: String,
    /// API version without the group (`v1`, `v1alpha1`).
    pub version: String,
    /// `apiVersion` as Kubernetes writes it (`v1`, `apps/v1`).
    pub api_version: String,
    /// PascalCase kind (`Deployment`).
    pub kind: String,
    /// Plural resource name (`deployments`), the path segment of the REST API.
    pub plural: String,
    /// Whether objects of this kind live in namespaces.
    pub namespaced: bool,
    /// Its messages are Event occurrences (`[[resources]] mode = "events"`,
    /// docs/events.md): the payload carries `event` and `occurrences` instead of `object`,
    /// and the CloudEvents type is `io.kubesink.event.{op}`.
    pub events: bool,
}

impl Resource {
    /// A resource of `cluster`; `apiVersion` is derived from `group` and `version`.
    pub fn new(
        cluster: &str,
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
    ) -> Self {
        let api_version = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        Resource {
            cluster: cluster.to_owned(),
            group: group.to_owned(),
            version: version.to_owned(),
            api_version,
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            namespaced,
            events: false,
        }
    }

    /// The same resource, its messages Event occurrences when `events` ([`Resource::events`]).
    pub fn with_events(mut self, events: bool) -> Self {
        self.events = events;
        self
    }

    /// The group as keys and templates write it: `core` for the core (empty) group.
    pub fn group_or_core(&self) -> &str {
        if self.group.is_empty() {
            "core"
        } else {
            &self.group
        }
    }

    /// The partition key of an object: `{cluster}/{group or "core"}/{Kind}/{namespace}/{name}`,
    /// namespace empty for cluster-scoped objects (`prod/core/Node//node-1`). Group and kind
    /// are part of it, so a Deployment and an HPA named `web` never share a key. None of the
    /// parts can contain `/` (Kubernetes names and namespaces cannot; `cluster.name` is
    /// checked when the configuration loads).
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.cluster,
            self.group_or_core(),
            self.kind,
            namespace.unwrap_or(""),
            name
        )
    }
}

/// `apiVersion Kind`, as logs and errors name a resource (`apps/v1 Deployment`).
impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.api_version, self.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_group_use_core_for_the_core_group() {
        let node = Resource::new("prod", "", "v1", "Node", "nodes", false);
        assert_eq!(node.api_version, "v1");
        assert_eq!(node.key(None, "node-1"), "prod/core/Node//node-1");
        let deploy = Resource::new("prod", "apps", "v1", "Deployment", "deployments", true);
        assert_eq!(deploy.api_version, "apps/v1");
        assert_eq!(
            deploy.key(Some("web"), "api"),
            "prod/apps/Deployment/web/api"
        );
        assert_eq!(deploy.to_string(), "apps/v1 Deployment");
    }
}
