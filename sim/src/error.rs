//! The simulator's API error: one enum whose variants map onto the Kubernetes `Status` object
//! (`kind: Status`, `status: Failure`, `reason`, `message`, `details`, `code`) as described in
//! the API conventions (<https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#response-status-kind>).
//! This module owns the mapping from error to HTTP status code and `Status` JSON; it must never
//! decide *when* an error happens.

use serde_json::{json, Value};

/// An error answered to a client as a Kubernetes `Status` object.
///
/// `group` is the API group ("" for the core group); `resource` is the plural resource name
/// ("pods") as the real server puts it in messages and in `details.kind` for most errors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 404 `NotFound`: the named object does not exist.
    #[error("{} \"{name}\" not found", qualified(.group, .resource))]
    NotFound {
        /// API group ("" for core).
        group: String,
        /// Plural resource name ("pods").
        resource: String,
        /// Object name.
        name: String,
    },
    /// 404 `NotFound`: the path names no known resource.
    #[error("the server could not find the requested resource")]
    UnknownResource {
        /// The request path or what was looked up.
        path: String,
    },
    /// 409 `AlreadyExists`: create of a name that is taken.
    #[error("{} \"{name}\" already exists", qualified(.group, .resource))]
    AlreadyExists {
        /// API group ("" for core).
        group: String,
        /// Plural resource name ("pods").
        resource: String,
        /// Object name.
        name: String,
    },
    /// 409 `Conflict`: optimistic concurrency failure on `metadata.resourceVersion`.
    #[error("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", qualified(.group, .resource))]
    Conflict {
        /// API group ("" for core).
        group: String,
        /// Plural resource name ("pods").
        resource: String,
        /// Object name.
        name: String,
    },
    /// 400 `BadRequest`: malformed body, selector or parameter.
    #[error("{message}")]
    BadRequest {
        /// Human-readable message (the `Status.message`).
        message: String,
    },
    /// 422 `Invalid`: the object fails validation; `causes` are `(field, message)` pairs.
    #[error("{kind}.{group} \"{name}\" is invalid: {message}")]
    Invalid {
        /// API group ("" for core).
        group: String,
        /// Kind ("FooBar").
        kind: String,
        /// Object name.
        name: String,
        /// Human-readable message (the `Status.message`).
        message: String,
        /// `(reason, message, field)` per failure, as `details.causes`.
        causes: Vec<(String, String, String)>,
    },
    /// 410 `Expired`: a resourceVersion or continue token older than the retained window.
    #[error("{message}")]
    Expired {
        /// Human-readable message (the `Status.message`).
        message: String,
    },
    /// 504 `Timeout`: e.g. "Too large resource version".
    #[error("{message}")]
    Timeout {
        /// Human-readable message (the `Status.message`).
        message: String,
    },
    /// 405 `MethodNotAllowed`.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// 500 `InternalError` (also used by injected faults).
    #[error("{message}")]
    Internal {
        /// Human-readable message (the `Status.message`).
        message: String,
    },
    /// 429 `TooManyRequests` (injected faults); the server adds `Retry-After: retry_after_secs`.
    #[error("Too many requests, please try again later.")]
    TooManyRequests {
        /// Seconds for the `Retry-After` header.
        retry_after_secs: u64,
    },
    /// 401 `Unauthorized` (injected faults): the credentials were not accepted.
    #[error("Unauthorized")]
    Unauthorized,
    /// 403 `Forbidden` (injected faults): the authorizer denied the request; `message` is the
    /// RBAC wording (`pods is forbidden: User "…" cannot list resource "pods" …`).
    #[error("{message}")]
    Forbidden {
        /// API group ("" for core or a non-resource path).
        group: String,
        /// Plural resource name ("" for a non-resource path).
        resource: String,
        /// Object name ("" for collections).
        name: String,
        /// Human-readable message (the `Status.message`).
        message: String,
    },
    /// 503 `ServiceUnavailable` (injected faults), e.g. an aggregated API that is down.
    #[error("{message}")]
    ServiceUnavailable {
        /// Human-readable message (the `Status.message`).
        message: String,
    },
    /// 410 `Expired` for a `continue` token whose snapshot is gone; `continue_token` (the
    /// Status's `metadata.continue`) continues the list inconsistently at the latest
    /// resourceVersion, per
    /// <https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks>.
    #[error("{EXPIRED_CONTINUE_MESSAGE}")]
    ExpiredContinue {
        /// The inconsistent-continue token.
        continue_token: String,
    },
}

/// The message of a 410 for an expired `continue` token, as the API server words it.
pub const EXPIRED_CONTINUE_MESSAGE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    /// The HTTP status code, equal to the `Status.code` field.
    pub fn status_code(&self) -> u16 {
        match self {
            ApiError::NotFound { .. } | ApiError::UnknownResource { .. } => 404,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } => 409,
            ApiError::BadRequest { .. } => 400,
            ApiError::Invalid { .. } => 422,
            ApiError::Expired { .. } | ApiError::ExpiredContinue { .. } => 410,
            ApiError::Timeout { .. } => 504,
            ApiError::MethodNotAllowed => 405,
            ApiError::Internal { .. } => 500,
            ApiError::TooManyRequests { .. } => 429,
            ApiError::Unauthorized => 401,
            ApiError::Forbidden { .. } => 403,
            ApiError::ServiceUnavailable { .. } => 503,
        }
    }

    /// The `Status.reason` (a `metav1.StatusReason` such as `NotFound`, `Conflict`, `Expired`).
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. } | ApiError::UnknownResource { .. } => "NotFound",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } => "Conflict",
            ApiError::BadRequest { .. } => "BadRequest",
            ApiError::Invalid { .. } => "Invalid",
            ApiError::Expired { .. } | ApiError::ExpiredContinue { .. } => "Expired",
            ApiError::Timeout { .. } => "Timeout",
            ApiError::MethodNotAllowed => "MethodNotAllowed",
            ApiError::Internal { .. } => "InternalError",
            ApiError::TooManyRequests { .. } => "TooManyRequests",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::Forbidden { .. } => "Forbidden",
            ApiError::ServiceUnavailable { .. } => "ServiceUnavailable",
        }
    }

    /// The error as a `Status` object, shaped like the recordings in
    /// `shared/fixtures/k8s-replays/v1-36` (`details` carries name/group/kind when known).
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.status_code(),
        });
        let details = match self {
            ApiError::NotFound {
                group,
                resource,
                name,
            }
            | ApiError::AlreadyExists {
                group,
                resource,
                name,
            }
            | ApiError::Conflict {
                group,
                resource,
                name,
            } => Some(json!({"name": name, "group": group, "kind": resource})),
            ApiError::Invalid {
                group,
                kind,
                name,
                causes,
                ..
            } => {
                let causes: Vec<Value> = causes
                    .iter()
                    .map(|(reason, message, field)| json!({"reason": reason, "message": message, "field": field}))
                    .collect();
                Some(json!({"name": name, "group": group, "kind": kind, "causes": causes}))
            }
            ApiError::TooManyRequests { retry_after_secs } => {
                Some(json!({"retryAfterSeconds": retry_after_secs}))
            }
            ApiError::Forbidden {
                group,
                resource,
                name,
                ..
            } => {
                let mut d = json!({});
                if !resource.is_empty() {
                    d["kind"] = json!(resource);
                }
                if !group.is_empty() {
                    d["group"] = json!(group);
                }
                if !name.is_empty() {
                    d["name"] = json!(name);
                }
                Some(d)
            }
            ApiError::ExpiredContinue { continue_token } => {
                status["metadata"] = json!({"continue": continue_token});
                None
            }
            _ => None,
        };
        if let (Some(details), Some(map)) = (details, status.as_object_mut()) {
            map.insert("details".into(), details);
        }
        status
    }

    /// Shorthand for a 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
        }
    }
}
