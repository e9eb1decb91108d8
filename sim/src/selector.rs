//! Label and field selectors as the API server parses them
//! (<https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors>,
//! <https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/>).
//! Label selectors support `=`, `==`, `!=`, `in (a,b)`, `notin (a,b)`, `key`, `!key`; field
//! selectors support `metadata.name` and `metadata.namespace` on every kind, and the fields the
//! API server selects on per kind ([`kind_fields`]), with `=`, `==`, `!=`.
//! This module only parses and matches; it never touches the store.

use std::collections::BTreeMap;

/// A selector string that does not parse; the message names the offending requirement.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectorError {
    /// A label requirement could not be parsed.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// A field selector term could not be parsed or names an unsupported field.
    #[error("{0}")]
    Field(String),
}

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; all requirements must hold (logical AND).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_value(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

impl LabelSelector {
    /// Parses a `labelSelector` query value. An empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for term in split_terms(s) {
            reqs.push(
                Self::parse_term(term.trim())
                    .ok_or_else(|| SelectorError::Label(term.trim().to_owned()))?,
            );
        }
        Ok(LabelSelector(reqs))
    }

    fn parse_term(t: &str) -> Option<LabelReq> {
        if let Some(open) = t.find('(') {
            let inner = t[open + 1..].strip_suffix(')')?;
            let mut head = t[..open].split_whitespace();
            let (key, op) = (head.next()?, head.next()?);
            if head.next().is_some() || !valid_key(key) {
                return None;
            }
            let values: Vec<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
            if values.iter().any(|v| !valid_value(v)) {
                return None;
            }
            return match op {
                "in" => Some(LabelReq::In(key.into(), values)),
                "notin" => Some(LabelReq::NotIn(key.into(), values)),
                _ => None,
            };
        }
        let kv = |sep: &str| {
            t.split_once(sep)
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        };
        let req = if let Some(k) = t.strip_prefix('!') {
            LabelReq::NotExists(k.trim().to_owned())
        } else if let Some((k, v)) = kv("!=") {
            LabelReq::NotEq(k, v)
        } else if let Some((k, v)) = kv("==").or_else(|| kv("=")) {
            LabelReq::Eq(k, v)
        } else {
            LabelReq::Exists(t.to_owned())
        };
        let ok = match &req {
            LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => valid_key(k) && valid_value(v),
            LabelReq::Exists(k) | LabelReq::NotExists(k) => valid_key(k),
            _ => false,
        };
        ok.then_some(req)
    }

    /// Whether `labels` satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => labels.get(k) == Some(v),
            LabelReq::NotEq(k, v) => labels.get(k) != Some(v),
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// Whether the selector is empty (selects everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Name,
    Namespace,
    /// A field of the object's body: its JSON pointer and how an absent one reads.
    Body(&'static str, Absent),
}

/// How the API server renders a selectable field the object does not set.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Absent {
    /// `""` (strings: an unscheduled Pod's `spec.nodeName`).
    Empty,
    /// `"false"` (booleans: `strconv.FormatBool`).
    False,
    /// `"0"` (integers).
    Zero,
}

/// The fields the API server selects on for `kind`, besides `metadata.name` and
/// `metadata.namespace`: (field, JSON pointer, how an absent one reads). From the registries'
/// `ToSelectableFields`/`GetAttrs` (`k8s.io/kubernetes/pkg/registry/...`, Kubernetes 1.36):
/// `core/pod`, `core/node`, `core/namespace`, `core/secret`, `core/event`, `apps/replicaset`,
/// `batch/job`. Any other field is 400 `field label not supported`.
fn kind_fields(kind: &str) -> &'static [(&'static str, &'static str, Absent)] {
    use Absent::{Empty, False, Zero};
    match kind {
        "Pod" => &[
            ("spec.nodeName", "/spec/nodeName", Empty),
            ("spec.restartPolicy", "/spec/restartPolicy", Empty),
            ("spec.schedulerName", "/spec/schedulerName", Empty),
            ("spec.serviceAccountName", "/spec/serviceAccountName", Empty),
            ("spec.hostNetwork", "/spec/hostNetwork", False),
            ("status.phase", "/status/phase", Empty),
            ("status.podIP", "/status/podIP", Empty),
            (
                "status.nominatedNodeName",
                "/status/nominatedNodeName",
                Empty,
            ),
        ],
        "Node" => &[("spec.unschedulable", "/spec/unschedulable", False)],
        "Namespace" => &[("status.phase", "/status/phase", Empty)],
        "Secret" => &[("type", "/type", Empty)],
        "Event" => &[
            ("involvedObject.kind", "/involvedObject/kind", Empty),
            (
                "involvedObject.namespace",
                "/involvedObject/namespace",
                Empty,
            ),
            ("involvedObject.name", "/involvedObject/name", Empty),
            ("involvedObject.uid", "/involvedObject/uid", Empty),
            (
                "involvedObject.apiVersion",
                "/involvedObject/apiVersion",
                Empty,
            ),
            (
                "involvedObject.resourceVersion",
                "/involvedObject/resourceVersion",
                Empty,
            ),
            (
                "involvedObject.fieldPath",
                "/involvedObject/fieldPath",
                Empty,
            ),
            ("reason", "/reason", Empty),
            ("type", "/type", Empty),
        ],
        "ReplicaSet" => &[("status.replicas", "/status/replicas", Zero)],
        "Job" => &[("status.successful", "/status/succeeded", Zero)],
        _ => &[],
    }
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(Field, bool, String)>);

impl FieldSelector {
    /// Parses a `fieldSelector` query value for any kind: `metadata.name` and
    /// `metadata.namespace` only. See [`FieldSelector::parse_for`].
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        Self::parse_for(s, "")
    }

    /// Parses a `fieldSelector` query value for `kind`; an unsupported field is a 400 like the
    /// real server's `field label not supported: spec.foo`.
    pub fn parse_for(s: &str, kind: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for term in s.split(',') {
            let term = term.trim();
            let (field, negate, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, false, v)
            } else {
                return Err(SelectorError::Field(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                )));
            };
            let field = match field.trim() {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => match kind_fields(kind).iter().find(|(f, _, _)| *f == other) {
                    Some((_, pointer, absent)) => Field::Body(pointer, *absent),
                    None => {
                        return Err(SelectorError::Field(format!(
                            "field label not supported: {other}"
                        )))
                    }
                },
            };
            reqs.push((field, negate, value.trim().to_owned()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether an object with this namespace ("" if cluster-scoped), name and JSON body
    /// matches. The body is parsed only when a term selects on one of its fields.
    pub fn matches(&self, namespace: &str, name: &str, body: &[u8]) -> bool {
        let mut parsed: Option<serde_json::Value> = None;
        self.0.iter().all(|(field, negate, value)| {
            let actual = match field {
                Field::Name => name.to_owned(),
                Field::Namespace => namespace.to_owned(),
                Field::Body(pointer, absent) => {
                    let obj = parsed.get_or_insert_with(|| {
                        serde_json::from_slice(body).unwrap_or(serde_json::Value::Null)
                    });
                    match obj.pointer(pointer) {
                        Some(serde_json::Value::String(s)) => s.clone(),
                        Some(serde_json::Value::Bool(b)) => b.to_string(),
                        Some(serde_json::Value::Number(n)) => n.to_string(),
                        _ => match absent {
                            Absent::Empty => String::new(),
                            Absent::False => "false".to_owned(),
                            Absent::Zero => "0".to_owned(),
                        },
                    }
                }
            };
            (actual == *value) != *negate
        })
    }
}

/// Label and field selector together, as given on one list or watch request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selectors {
    /// The `labelSelector` parameter.
    pub labels: LabelSelector,
    /// The `fieldSelector` parameter.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Whether an object matches both selectors (`body`: its JSON, read only for a field
    /// selector on a field of it).
    pub fn matches(
        &self,
        namespace: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
        body: &[u8],
    ) -> bool {
        self.labels.matches(labels) && self.fields.matches(namespace, name, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn set_based_requirements_keep_commas_inside_parentheses() {
        let sel = LabelSelector::parse("app in (web, api),tier notin (db),env").unwrap();
        assert!(sel.matches(&labels(&[("app", "api"), ("env", "x")])));
        assert!(!sel.matches(&labels(&[("app", "api"), ("tier", "db"), ("env", "x")])));
        assert!(!sel.matches(&labels(&[("app", "api")])));
    }

    #[test]
    fn equality_and_existence_operators_match_like_the_api_server() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        assert!(LabelSelector::parse("a=1").unwrap().matches(&l));
        assert!(LabelSelector::parse("a==1,b!=3").unwrap().matches(&l));
        assert!(!LabelSelector::parse("!a").unwrap().matches(&l));
        assert!(LabelSelector::parse("!c").unwrap().matches(&l));
        assert!(LabelSelector::parse("c!=1").unwrap().matches(&l));
    }

    #[test]
    fn malformed_selectors_are_rejected() {
        assert!(LabelSelector::parse("a in (x").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
        assert!(FieldSelector::parse("spec.nodeName=x").is_err());
        assert!(FieldSelector::parse_for("spec.nodeName=x", "ConfigMap").is_err());
        let pod = br#"{"spec":{"nodeName":"n1"},"status":{"phase":"Running"}}"#;
        let f =
            FieldSelector::parse_for("spec.nodeName=n1,status.phase!=Succeeded", "Pod").unwrap();
        assert!(f.matches("default", "p", pod));
        let f = FieldSelector::parse_for("status.phase=Succeeded", "Pod").unwrap();
        assert!(!f.matches("default", "p", pod));
        // An absent field reads as the API server renders it: "" for a string, "false".
        let f = FieldSelector::parse_for("spec.nodeName=,spec.hostNetwork=false", "Pod").unwrap();
        assert!(f.matches("default", "p", b"{}"));
        assert!(FieldSelector::parse("metadata.name").is_err());
    }

    #[test]
    fn field_selectors_match_name_and_namespace() {
        let f = FieldSelector::parse("metadata.name=x,metadata.namespace!=kube-system").unwrap();
        assert!(f.matches("default", "x", b"{}"));
        assert!(!f.matches("kube-system", "x", b"{}"));
        assert!(!f.matches("default", "y", b"{}"));
    }
}
