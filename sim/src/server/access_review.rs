//! `SelfSubjectAccessReview` (`POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`,
//! in JSON or in the protobuf kubectl sends): "may I do this?", answered (in JSON) from the
//! simulator's denials (`faults/access.rs`), the way `kubectl auth can-i` asks a real API
//! server (<https://kubernetes.io/docs/reference/access-authn-authz/authorization/#checking-api-access>).
//! The review is not stored: the answer is the request with its `status` filled in
//! (`allowed`, and when denied a `reason` naming the simulator's rule, which a real RBAC
//! denial leaves empty), 201 Created as the real server answers. A spec without exactly one
//! of `resourceAttributes` and `nonResourceAttributes` is 422 Invalid; non-resource requests
//! (`/healthz`, discovery paths) are always allowed. Also the discovery entry of the
//! `authorization.k8s.io/v1` group, which serves nothing else. This module never touches the
//! store.

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

/// The magic prefix of a Kubernetes protobuf body (`application/vnd.kubernetes.protobuf`).
const PROTOBUF_MAGIC: &[u8] = b"k8s\0";

/// The review in `body`: JSON, or the protobuf encoding kubectl and client-go send for
/// built-in types (`kubectl auth can-i`), read as far as the review's attributes go.
///
/// # Errors
/// 400 when `body` is neither.
pub fn parse(body: &[u8]) -> Result<Value, ApiError> {
    match body.strip_prefix(PROTOBUF_MAGIC) {
        Some(message) => protobuf::review(message).ok_or_else(|| {
            ApiError::bad_request("the body is not a SelfSubjectAccessReview in protobuf")
        }),
        None => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"))),
    }
}

/// Just enough protobuf (<https://protobuf.dev/programming-guides/encoding/>) to read a
/// `SelfSubjectAccessReview` wrapped in the `runtime.Unknown` envelope, field numbers from
/// `k8s.io/api/authorization/v1/generated.proto`: envelope `raw` = 2; review `spec` = 2;
/// spec `resourceAttributes` = 1, `nonResourceAttributes` = 2; resource attributes
/// `namespace` 1, `verb` 2, `group` 3, `version` 4, `resource` 5, `subresource` 6, `name` 7;
/// non-resource attributes `path` 1, `verb` 2. Other fields are skipped.
mod protobuf {
    use serde_json::{Map, Value};

    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// The length-delimited fields of `message` as (field number, bytes); `None` when it
    /// does not parse.
    fn fields(mut message: &[u8]) -> Option<Vec<(u64, &[u8])>> {
        let mut out = Vec::new();
        while !message.is_empty() {
            let key = varint(&mut message)?;
            match key & 7 {
                0 => {
                    varint(&mut message)?;
                }
                1 => message = message.get(8..)?,
                5 => message = message.get(4..)?,
                2 => {
                    let len = usize::try_from(varint(&mut message)?).ok()?;
                    out.push((key >> 3, message.get(..len)?));
                    message = message.get(len..)?;
                }
                _ => return None,
            }
        }
        Some(out)
    }

    fn field(message: &[u8], number: u64) -> Option<&[u8]> {
        fields(message)?
            .into_iter()
            .find(|(n, _)| *n == number)
            .map(|(_, b)| b)
    }

    fn strings(message: &[u8], names: &[(u64, &str)]) -> Option<Value> {
        let mut out = Map::new();
        for (number, bytes) in fields(message)? {
            if let Some((_, name)) = names.iter().find(|(n, _)| *n == number) {
                let text = std::str::from_utf8(bytes).ok()?;
                out.insert((*name).to_owned(), Value::String(text.to_owned()));
            }
        }
        Some(Value::Object(out))
    }

    /// The review in the envelope `unknown`, as its JSON form.
    pub(super) fn review(unknown: &[u8]) -> Option<Value> {
        let spec = field(field(unknown, 2)?, 2)?;
        let mut out = Map::new();
        if let Some(attributes) = field(spec, 1) {
            let names = [
                (1, "namespace"),
                (2, "verb"),
                (3, "group"),
                (4, "version"),
                (5, "resource"),
                (6, "subresource"),
                (7, "name"),
            ];
            out.insert("resourceAttributes".into(), strings(attributes, &names)?);
        }
        if let Some(attributes) = field(spec, 2) {
            let names = [(1, "path"), (2, "verb")];
            out.insert("nonResourceAttributes".into(), strings(attributes, &names)?);
        }
        let mut review = Map::new();
        review.insert("spec".into(), Value::Object(out));
        Some(Value::Object(review))
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
    fn the_protobuf_kubectl_sends_reads_as_its_json() {
        // `kubectl auth can-i watch pods -n team-a`, as sent by kubectl 1.32.
        let mut body = b"k8s\0".to_vec();
        body.extend_from_slice(&[0x0a, 0x32, 0x0a, 0x17]);
        body.extend_from_slice(b"authorization.k8s.io/v1");
        body.extend_from_slice(&[0x12, 0x17]);
        body.extend_from_slice(b"SelfSubjectAccessReview");
        body.extend_from_slice(&[0x12, 0x3d, 0x0a, 0x10]);
        body.extend_from_slice(&[
            0x0a, 0, 0x12, 0, 0x1a, 0, 0x22, 0, 0x2a, 0, 0x32, 0, 0x38, 0, 0x42, 0,
        ]);
        body.extend_from_slice(&[0x12, 0x1f, 0x0a, 0x1d, 0x0a, 0x06]);
        body.extend_from_slice(b"team-a");
        body.extend_from_slice(&[0x12, 0x05]);
        body.extend_from_slice(b"watch");
        body.extend_from_slice(&[0x1a, 0, 0x22, 0, 0x2a, 0x04]);
        body.extend_from_slice(b"pods");
        body.extend_from_slice(&[
            0x32, 0, 0x3a, 0, 0x1a, 0x08, 0x08, 0, 0x12, 0, 0x1a, 0, 0x20, 0,
        ]);
        body.extend_from_slice(&[0x1a, 0, 0x22, 0]);
        let review = parse(&body).expect("parses");
        assert_eq!(
            review["spec"]["resourceAttributes"],
            json!({"namespace": "team-a", "verb": "watch", "group": "", "version": "",
                   "resource": "pods", "subresource": "", "name": ""})
        );
        assert!(parse(b"k8s\0\x0a\xff").is_err());
        assert!(parse(b"{").is_err());
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
