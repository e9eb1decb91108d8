//! `SelfSubjectAccessReview` (`POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`):
//! "may I do this?", answered from the simulator's denials (`faults/access.rs`), the way
//! `kubectl auth can-i` asks a real API server
//! (<https://kubernetes.io/docs/reference/access-authn-authz/authorization/#checking-api-access>).
//! The review is not stored: the answer is the request with its `status` filled in
//! (`allowed`, and `reason` when denied), 201 Created as the real server answers. A spec
//! without exactly one of `resourceAttributes` and `nonResourceAttributes` is 422 Invalid;
//! non-resource requests (`/healthz`, discovery paths) are always allowed. Also the discovery
//! entry of the `authorization.k8s.io/v1` group, which serves nothing else. This module
//! never touches the store.

use serde_json::{json, Value};

use super::request_info::SIM_USER;
use crate::error::ApiError;
use crate::faults::Faults;

/// The API group of access reviews.
pub const GROUP: &str = "authorization.k8s.io";
/// Its version.
pub const VERSION: &str = "v1";
/// The resource.
pub const PLURAL: &str = "selfsubjectaccessreviews";
const KIND: &str = "SelfSubjectAccessReview";

/// The `APIResourceList` entries of `authorization.k8s.io/v1`.
pub fn discovery_entries() -> Vec<Value> {
    vec![json!({
        "name": PLURAL,
        "singularName": "selfsubjectaccessreview",
        "namespaced": false,
        "kind": KIND,
        "verbs": ["create"],
        "storageVersionHash": "",
    })]
}

fn invalid(message: &str, field: &str) -> ApiError {
    ApiError::Invalid {
        group: GROUP.to_owned(),
        kind: KIND.to_owned(),
        name: String::new(),
        message: format!("{field}: Invalid value: {message}"),
        causes: vec![("FieldValueInvalid".into(), message.into(), field.into())],
    }
}

/// Answers the review in `body`: the request with `status` filled in.
///
/// # Errors
/// 400 when `body` is not a JSON object, 422 when its spec asks nothing or two things.
pub fn review(faults: &Faults, body: &Value) -> Result<Value, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body is not a SelfSubjectAccessReview",
        ));
    }
    let spec = body.get("spec").cloned().unwrap_or(Value::Null);
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let status = match (resource, non_resource) {
        (Some(attributes), None) => {
            let text = |k: &str| attributes.get(k).and_then(Value::as_str).unwrap_or("");
            let namespace = Some(text("namespace")).filter(|ns| !ns.is_empty());
            let (verb, group, plural) = (text("verb"), text("group"), text("resource"));
            match faults.denial_of(verb, group, plural, namespace) {
                None => json!({"allowed": true}),
                Some(rule) => json!({
                    "allowed": false,
                    "reason": format!("User \"{SIM_USER}\" cannot {verb} resource \"{plural}\" in API group \"{group}\" (simulated RBAC: denied by {rule})"),
                }),
            }
        }
        (None, Some(_)) => json!({"allowed": true}),
        _ => {
            return Err(invalid(
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                "spec.resourceAttributes",
            ))
        }
    };
    let mut answer = body.clone();
    answer["apiVersion"] = json!(format!("{GROUP}/{VERSION}"));
    answer["kind"] = json!(KIND);
    if answer.get("metadata").is_none_or(|m| !m.is_object()) {
        answer["metadata"] = json!({});
    }
    answer["status"] = status;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Denial;

    fn ask(faults: &Faults, verb: &str, group: &str, plural: &str, ns: &str) -> Value {
        let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": KIND,
            "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": plural, "namespace": ns}}});
        review(faults, &body).expect("a valid review")["status"].clone()
    }

    #[test]
    fn everything_is_allowed_until_denied_and_a_denial_says_which_rule() {
        let faults = Faults::default();
        assert_eq!(
            ask(&faults, "watch", "", "pods", ""),
            json!({"allowed": true})
        );
        faults.deny(Denial::parse("watch:pods:team-a").expect("a rule"));
        let denied = ask(&faults, "watch", "", "pods", "team-a");
        assert_eq!(denied["allowed"], false);
        assert!(
            denied["reason"]
                .as_str()
                .is_some_and(|r| r.contains("denied by watch:pods:team-a")),
            "{denied}"
        );
        assert_eq!(ask(&faults, "watch", "", "pods", "")["allowed"], false);
        assert_eq!(ask(&faults, "watch", "", "pods", "team-b")["allowed"], true);
        assert_eq!(ask(&faults, "list", "", "pods", "team-a")["allowed"], true);
    }

    #[test]
    fn a_spec_asking_nothing_or_two_things_is_invalid() {
        let faults = Faults::default();
        let e = review(&faults, &json!({"spec": {}})).expect_err("invalid");
        assert_eq!(e.status_code(), 422);
        let both = json!({"spec": {"resourceAttributes": {"verb": "get"},
                                   "nonResourceAttributes": {"path": "/healthz", "verb": "get"}}});
        assert_eq!(
            review(&faults, &both).map_err(|e| e.status_code()),
            Err(422)
        );
        let non_resource =
            json!({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}});
        assert_eq!(
            review(&faults, &non_resource).expect("valid")["status"],
            json!({"allowed": true})
        );
    }
}
