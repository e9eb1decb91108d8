//! Status overrides: until cleared, every request a [`RequestMatch`] selects (list, watch,
//! get, write, discovery) is answered with a `Status` of the chosen code instead of being
//! served, as an API server does when credentials expire (401), RBAC denies (403), a resource
//! or API group is gone (404), API Priority and Fairness rejects (429,
//! <https://kubernetes.io/docs/concepts/cluster-administration/flow-control/>) or the server
//! or an aggregated API is failing (500, 503). Setting one ends the open watches it selects,
//! so the client's next request meets it. This module keeps the rules; the server renders
//! the `Status`.

use super::Faults;

/// The HTTP status codes [`Faults::set_status`] can inject, each answered with the `Status`
/// reason the API server uses: 400 BadRequest, 401 Unauthorized, 403 Forbidden, 404
/// NotFound, 410 Expired, 429 TooManyRequests, 500 InternalError, 503 ServiceUnavailable,
/// 504 Timeout.
pub const INJECTABLE_STATUSES: &[u16] = &[400, 401, 403, 404, 410, 429, 500, 503, 504];

/// Errors setting a fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    /// The status code is not in [`INJECTABLE_STATUSES`].
    #[error(
        "status {0} cannot be injected (use one of 400, 401, 403, 404, 410, 429, 500, 503, 504)"
    )]
    UnsupportedStatus(u16),
}

/// Which requests a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestMatch {
    /// Requests whose URL path (without the query) starts with this prefix, e.g. `/apis`,
    /// `/api/v1/pods` (the all-namespaces pods path only) or
    /// `/api/v1/namespaces/x/pods` (one namespace). "" matches every request.
    PathPrefix(String),
    /// Requests for one resource at any version, in any namespace or none: API group ("" for
    /// the core group) and plural (`pods`). Discovery requests never match.
    Resource {
        /// API group, "" for core.
        group: String,
        /// Plural resource name.
        plural: String,
    },
}

impl RequestMatch {
    /// Whether a request of `path` (for `resource` = (group, plural), if it names one) matches.
    pub(crate) fn matches(&self, path: &str, resource: Option<(&str, &str)>) -> bool {
        match self {
            RequestMatch::PathPrefix(p) => path.starts_with(p.as_str()),
            RequestMatch::Resource { group, plural } => {
                resource.is_some_and(|(g, p)| g == group && p == plural)
            }
        }
    }
}

/// One status override.
#[derive(Debug, Clone)]
pub(super) struct StatusOverride {
    matcher: RequestMatch,
    code: u16,
    retry_after: Option<u64>,
}

impl Faults {
    /// Until [`Faults::clear_status`], answers every request whose URL path starts with
    /// `path_prefix` with a `Status` of code `status` (see [`INJECTABLE_STATUSES`]; e.g. 403
    /// carries the RBAC message `pods is forbidden: User "system:serviceaccount:…" cannot list
    /// resource "pods" in API group "" at the cluster scope`). `retry_after` (seconds) adds a
    /// `Retry-After` header and `details.retryAfterSeconds` (429 defaults to 1). Open watches
    /// on matching paths end. Replaces an earlier override of the same prefix.
    /// Errors: [`FaultError::UnsupportedStatus`].
    pub fn set_status(
        &self,
        path_prefix: &str,
        status: u16,
        retry_after: Option<u64>,
    ) -> Result<(), FaultError> {
        self.set_status_for(
            RequestMatch::PathPrefix(path_prefix.to_owned()),
            status,
            retry_after,
        )
    }

    /// Like [`Faults::set_status`] for every request on resource `group`/`plural` (any
    /// namespace, any version, collection or item): a namespaced watch and an all-namespaces
    /// watch of pods both match `("", "pods")`, while `/apis` discovery does not.
    pub fn set_resource_status(
        &self,
        group: &str,
        plural: &str,
        status: u16,
        retry_after: Option<u64>,
    ) -> Result<(), FaultError> {
        self.set_status_for(
            RequestMatch::Resource {
                group: group.to_owned(),
                plural: plural.to_owned(),
            },
            status,
            retry_after,
        )
    }

    /// The general form of [`Faults::set_status`] and [`Faults::set_resource_status`].
    pub fn set_status_for(
        &self,
        matcher: RequestMatch,
        status: u16,
        retry_after: Option<u64>,
    ) -> Result<(), FaultError> {
        if !INJECTABLE_STATUSES.contains(&status) {
            return Err(FaultError::UnsupportedStatus(status));
        }
        let retry_after = retry_after.or((status == 429).then_some(1));
        self.with(|s| {
            s.statuses.retain(|o| o.matcher != matcher);
            s.statuses.push(StatusOverride {
                matcher: matcher.clone(),
                code: status,
                retry_after,
            });
        });
        self.end_watches_matching(&matcher);
        Ok(())
    }

    /// Removes the override set by [`Faults::set_status`] for exactly `path_prefix`.
    pub fn clear_status(&self, path_prefix: &str) {
        let m = RequestMatch::PathPrefix(path_prefix.to_owned());
        self.with(|s| s.statuses.retain(|o| o.matcher != m));
    }

    /// Removes the override set by [`Faults::set_resource_status`] for `group`/`plural`.
    pub fn clear_resource_status(&self, group: &str, plural: &str) {
        let m = RequestMatch::Resource {
            group: group.to_owned(),
            plural: plural.to_owned(),
        };
        self.with(|s| s.statuses.retain(|o| o.matcher != m));
    }

    /// The override for a request of `path` (on `resource` = (group, plural), if any): the
    /// most recently set matching one, as (code, Retry-After seconds).
    pub(crate) fn status_override(
        &self,
        path: &str,
        resource: Option<(&str, &str)>,
    ) -> Option<(u16, Option<u64>)> {
        self.with(|s| {
            s.statuses
                .iter()
                .rev()
                .find(|o| o.matcher.matches(path, resource))
                .map(|o| (o.code, o.retry_after))
        })
    }
}
