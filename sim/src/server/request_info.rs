//! What a request is about, read from its method, path and query alone (no registry lookup,
//! so removed resources still parse), like the API server's `RequestInfo`: the verb (`get`,
//! `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, or the
//! lowercase method for non-resource paths such as discovery) and, for resource paths
//! (`/api/{v}/…`, `/apis/{g}/{v}/…`), the group, version, plural, namespace and name. Used to
//! match faults, count requests and word injected `Status` answers; never to serve them.

use std::collections::HashMap;

use axum::http::Method;

use crate::error::ApiError;

/// The user named in injected 403 messages, as a service account of kubesink would be.
pub const SIM_USER: &str = "system:serviceaccount:kubesink:kubesink";

/// The resource a request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceRef<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub plural: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestInfo<'a> {
    pub path: &'a str,
    pub verb: &'static str,
    pub resource: Option<ResourceRef<'a>>,
}

fn method_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::HEAD => "head",
        _ => "other",
    }
}

impl<'a> RequestInfo<'a> {
    /// Parses `method` `path` `?query`.
    pub fn parse(method: &Method, path: &'a str, query: &HashMap<String, String>) -> Self {
        let segs: Vec<&'a str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let non_resource = RequestInfo {
            path,
            verb: method_verb(method),
            resource: None,
        };
        let (group, version, rest) = match segs.as_slice() {
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return non_resource,
        };
        let (namespace, plural, name) = match rest {
            ["namespaces", ns, plural, name, ..] => (Some(*ns), *plural, Some(*name)),
            ["namespaces", ns, plural] => (Some(*ns), *plural, None),
            [plural, name, ..] => (None, *plural, Some(*name)),
            [plural] => (None, *plural, None),
            [] => return non_resource,
        };
        let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        let verb = match (method, name.is_some()) {
            (&Method::GET | &Method::HEAD, true) => "get",
            (&Method::GET | &Method::HEAD, false) if watching => "watch",
            (&Method::GET | &Method::HEAD, false) => "list",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, true) => "delete",
            (&Method::DELETE, false) => "deletecollection",
            _ => method_verb(method),
        };
        RequestInfo {
            path,
            verb,
            resource: Some(ResourceRef {
                group,
                version,
                plural,
                namespace,
                name,
            }),
        }
    }

    /// (group, plural) of the resource, if the request names one.
    pub fn group_plural(&self) -> Option<(&'a str, &'a str)> {
        self.resource.as_ref().map(|r| (r.group, r.plural))
    }

    /// The error an injected `code` answers for this request, worded as the API server words
    /// it (the caller checked the code is one of `INJECTABLE_STATUSES`).
    pub fn injected_error(&self, code: u16, retry_after: Option<u64>) -> ApiError {
        match code {
            400 => ApiError::bad_request("the server rejected the request (injected fault)"),
            401 => ApiError::Unauthorized,
            403 => self.forbidden(),
            410 => ApiError::Expired {
                message: "too old resource version (injected fault)".into(),
            },
            429 => ApiError::TooManyRequests {
                retry_after_secs: retry_after.unwrap_or(1),
            },
            500 => ApiError::Internal {
                message: "Internal error occurred: injected fault".into(),
            },
            503 => ApiError::ServiceUnavailable {
                message: "the server is currently unable to handle the request".into(),
            },
            504 => ApiError::Timeout {
                message: "the server was unable to return a response in the time allotted, but may still be processing the request".into(),
            },
            _ => ApiError::UnknownResource {
                path: self.path.to_owned(),
            },
        }
    }

    /// The RBAC denial the authorizer answers, e.g. `pods is forbidden: User "…" cannot list
    /// resource "pods" in API group "" at the cluster scope`.
    fn forbidden(&self) -> ApiError {
        let Some(r) = &self.resource else {
            return ApiError::Forbidden {
                group: String::new(),
                resource: String::new(),
                name: String::new(),
                message: format!(
                    "forbidden: User \"{SIM_USER}\" cannot {} path \"{}\"",
                    self.verb, self.path
                ),
            };
        };
        let qualified = if r.group.is_empty() {
            r.plural.to_owned()
        } else {
            format!("{}.{}", r.plural, r.group)
        };
        let subject = match r.name {
            Some(n) => format!("{qualified} \"{n}\""),
            None => qualified,
        };
        let scope = match r.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_owned(),
        };
        ApiError::Forbidden {
            group: r.group.to_owned(),
            resource: r.plural.to_owned(),
            name: r.name.unwrap_or_default().to_owned(),
            message: format!(
                "{subject} is forbidden: User \"{SIM_USER}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
                self.verb, r.plural, r.group
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info<'a>(method: Method, path: &'a str, watch: bool) -> RequestInfo<'a> {
        let mut q = HashMap::new();
        if watch {
            q.insert("watch".to_owned(), "true".to_owned());
        }
        RequestInfo::parse(&method, path, &q)
    }

    #[test]
    fn verbs_and_resources_follow_the_api_server_request_info() {
        let w = info(Method::GET, "/api/v1/namespaces/x/pods", true);
        assert_eq!(w.verb, "watch");
        assert_eq!(w.group_plural(), Some(("", "pods")));
        assert_eq!(w.resource.as_ref().and_then(|r| r.namespace), Some("x"));
        let g = info(
            Method::GET,
            "/apis/apps/v1/namespaces/x/deployments/d",
            false,
        );
        assert_eq!(g.verb, "get");
        assert_eq!(g.group_plural(), Some(("apps", "deployments")));
        assert_eq!(info(Method::GET, "/api/v1/pods", false).verb, "list");
        assert_eq!(info(Method::PUT, "/api/v1/nodes/n", false).verb, "update");
        let d = info(Method::GET, "/apis/apps/v1", false);
        assert_eq!((d.verb, d.resource), ("get", None));
        let ns = info(Method::GET, "/api/v1/namespaces/default", false);
        assert_eq!(ns.group_plural(), Some(("", "namespaces")));
    }

    #[test]
    fn forbidden_messages_name_verb_resource_group_and_scope() {
        let list = info(Method::GET, "/api/v1/pods", false).injected_error(403, None);
        assert_eq!(
            list.to_string(),
            format!("pods is forbidden: User \"{SIM_USER}\" cannot list resource \"pods\" in API group \"\" at the cluster scope")
        );
        let watch = info(Method::GET, "/apis/apps/v1/namespaces/x/deployments", true)
            .injected_error(403, None);
        assert_eq!(
            watch.to_string(),
            format!("deployments.apps is forbidden: User \"{SIM_USER}\" cannot watch resource \"deployments\" in API group \"apps\" in the namespace \"x\"")
        );
        let discovery = info(Method::GET, "/apis", false).injected_error(403, None);
        assert_eq!(
            discovery.to_string(),
            format!("forbidden: User \"{SIM_USER}\" cannot get path \"/apis\"")
        );
    }
}
