//! Message → NATS publish: the subject (template plus token escaping) and the headers.
//!
//! Owns the one escaping rule of subject tokens; it must never produce a token NATS treats
//! specially (`.` separates tokens, `*` and `>` are wildcards, whitespace ends the subject;
//! <https://docs.nats.io/nats-concepts/subjects#characters-allowed-and-recommended-for-subject-names>).
//!
//! # Escaping rule (reversible)
//!
//! A placeholder's value becomes one token:
//! - the empty value (cluster-scoped objects have no namespace; the core API group is
//!   rendered as `core` before this) becomes `_`;
//! - every byte outside printable ASCII (`!`..=`~`), and each of `.`, `*`, `>`, `%`, becomes
//!   `%XX` (two uppercase hex digits), like URL percent-encoding;
//! - a value that is exactly `_` becomes `%5F`, so `_` always means "empty".
//!
//! [`unescape_token`] inverts it. Because every value maps to exactly one token and
//! placeholders are whole tokens, two objects differing in any placeholder never share a
//! subject.

use std::fmt::{self, Write as _};

use async_nats::HeaderMap;

use crate::{Message, MessageMeta, Placeholder};

/// The token that stands for an empty value (the namespace of a cluster-scoped object).
pub const EMPTY_TOKEN: &str = "_";

/// Why a subject template is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template is empty or has an empty token (`a..b`, leading or trailing `.`).
    #[error("subject template {0:?} has an empty token")]
    EmptyToken(String),
    /// A token mixes a placeholder with other text, or has an unknown placeholder.
    #[error("subject template token {0:?} must be a literal or exactly one of {{cluster}}, {{group}}, {{version}}, {{kind}}, {{resource}}, {{namespace}}, {{name}}")]
    BadToken(String),
    /// A literal token contains a wildcard or whitespace.
    #[error("subject template token {0:?} contains '*', '>', braces or whitespace")]
    BadLiteral(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(String),
    Field(Placeholder),
}

/// A parsed subject template, e.g. `kubesink.{cluster}.{group}.{kind}.{namespace}.{name}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectTemplate {
    tokens: Vec<Token>,
}

impl SubjectTemplate {
    /// Parses a template: `.`-separated tokens, each a literal or exactly one placeholder.
    ///
    /// # Errors
    /// [`TemplateError`] naming the offending token.
    pub fn parse(template: &str) -> Result<Self, TemplateError> {
        let mut tokens = Vec::new();
        for t in template.split('.') {
            if t.is_empty() {
                return Err(TemplateError::EmptyToken(template.to_owned()));
            }
            let field = t
                .strip_prefix('{')
                .and_then(|t| t.strip_suffix('}'))
                .and_then(Placeholder::parse);
            match field {
                Some(f) => tokens.push(Token::Field(f)),
                None if t.contains(['{', '}']) => {
                    return Err(TemplateError::BadToken(t.to_owned()));
                }
                None if t == "*"
                    || t == ">"
                    || t.chars().any(|c| c.is_whitespace() || c.is_control()) =>
                {
                    return Err(TemplateError::BadLiteral(t.to_owned()));
                }
                None => tokens.push(Token::Literal(t.to_owned())),
            }
        }
        Ok(SubjectTemplate { tokens })
    }

    /// The subject of a message.
    pub fn render(&self, m: &MessageMeta) -> String {
        let mut out = String::with_capacity(96);
        for (i, t) in self.tokens.iter().enumerate() {
            if i > 0 {
                out.push('.');
            }
            match t {
                Token::Literal(s) => out.push_str(s),
                // An empty value (cluster-scoped namespace) escapes to EMPTY_TOKEN.
                Token::Field(f) => escape_token(f.value(m).unwrap_or(""), &mut out),
            }
        }
        out
    }

    /// The stream filter matching every subject this template renders: each placeholder
    /// replaced by `*`.
    pub fn filter(&self) -> String {
        let parts: Vec<&str> = self
            .tokens
            .iter()
            .map(|t| match t {
                Token::Literal(s) => s.as_str(),
                Token::Field(_) => "*",
            })
            .collect();
        parts.join(".")
    }
}

impl fmt::Display for SubjectTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.filter())
    }
}

/// Appends `value` as one subject token, escaped by the module's rule.
pub fn escape_token(value: &str, out: &mut String) {
    if value.is_empty() {
        out.push_str(EMPTY_TOKEN);
        return;
    }
    if value == EMPTY_TOKEN {
        out.push_str("%5F");
        return;
    }
    for b in value.bytes() {
        match b {
            b'.' | b'*' | b'>' | b'%' => {
                let _ = write!(out, "%{b:02X}");
            }
            b'!'..=b'~' => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
}

/// Inverts [`escape_token`]: the value a subject token stands for. `None` when the token is
/// not a valid escaped form (bad `%XX`, or bytes that are not UTF-8).
pub fn unescape_token(token: &str) -> Option<String> {
    if token == EMPTY_TOKEN {
        return Some(String::new());
    }
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = token.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The headers of a message: the contract's headers (`op`, `kind`, `apiVersion`, `cluster`,
/// `namespace`, `name`, `content-type`, `id`), plus `Nats-Msg-Id` (the message id) in
/// JetStream mode so the stream stores a redelivered change once within its duplicate window
/// (<https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive#message-deduplication>).
pub fn headers(m: &Message, jetstream: bool) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in m.headers() {
        h.insert(k, v);
    }
    if jetstream {
        h.insert(async_nats::header::NATS_MESSAGE_ID, &*m.meta.id);
    }
    h
}

/// Bytes the headers take on the wire (`NATS/1.0\r\n`, `name: value\r\n` each, `\r\n`); the
/// server's `max_payload` bounds headers plus payload.
pub fn headers_wire_len(m: &Message, jetstream: bool) -> usize {
    let mut len = b"NATS/1.0\r\n".len() + 2;
    for (k, v) in m.headers() {
        len += k.len() + 2 + v.len() + 2;
    }
    if jetstream {
        len += "Nats-Msg-Id".len() + 2 + m.meta.id.len() + 2;
    }
    len
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::*;
    use crate::Op;

    fn meta(group: &str, kind: &str, ns: Option<&str>, name: &str) -> MessageMeta {
        MessageMeta {
            id: "0123456789abcdef0123456789abcdef".into(),
            op: Op::Added,
            cluster: "prod-eu-1".into(),
            group: group.into(),
            version: "v1".into(),
            api_version: if group.is_empty() {
                "v1".into()
            } else {
                format!("{group}/v1").into()
            },
            kind: kind.into(),
            resource: format!("{}s", kind.to_lowercase()).into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        }
    }

    fn default_template() -> SubjectTemplate {
        SubjectTemplate::parse(super::super::DEFAULT_SUBJECT).unwrap()
    }

    #[test]
    fn default_subject_has_one_token_per_identity_part() {
        let t = default_template();
        assert_eq!(
            t.render(&meta("apps", "Deployment", Some("default"), "web")),
            "kubesink.prod-eu-1.apps.Deployment.default.web"
        );
        assert_eq!(
            t.render(&meta("", "Node", None, "node-1")),
            "kubesink.prod-eu-1.core.Node._.node-1"
        );
        assert_eq!(
            t.render(&meta(
                "",
                "Pod",
                Some("kube-system"),
                "coredns-5d78c9869d-x2x4k"
            )),
            "kubesink.prod-eu-1.core.Pod.kube-system.coredns-5d78c9869d-x2x4k"
        );
    }

    #[test]
    fn dotted_names_and_group_names_are_escaped_into_one_token() {
        let t = default_template();
        let s = t.render(&meta(
            "rbac.authorization.k8s.io",
            "ClusterRole",
            None,
            "system:controller:job.controller",
        ));
        assert_eq!(
            s,
            "kubesink.prod-eu-1.rbac%2Eauthorization%2Ek8s%2Eio.ClusterRole._.system:controller:job%2Econtroller"
        );
        assert_eq!(s.split('.').count(), 6);
    }

    #[test]
    fn escaping_round_trips_every_special_character() {
        for v in [
            "",
            "_",
            "a.b",
            "a*b",
            "a>b",
            "50%",
            "%2E",
            "sp ace",
            "tab\tx",
            "ünïcode",
            "__",
            "a_b",
            ".",
            "..",
            "*",
            ">",
            "x%",
            "%",
            "@:~!",
        ] {
            let mut tok = String::new();
            escape_token(v, &mut tok);
            assert!(!tok.is_empty(), "{v:?}");
            assert!(
                !tok.contains(['.', '*', '>']) && !tok.chars().any(char::is_whitespace),
                "{v:?} -> {tok:?}"
            );
            assert!(tok.is_ascii());
            assert_eq!(unescape_token(&tok).as_deref(), Some(v), "{tok:?}");
        }
    }

    #[test]
    fn different_objects_never_share_a_subject() {
        let t = default_template();
        let names = [
            "a", "a.b", "a%2Eb", "a_b", "_", "a-b", "a.b.c", "a..b", "a.b-c", "a-b.c", "%5F",
        ];
        let namespaces = [None, Some("default"), Some("a.b"), Some("_"), Some("a")];
        let kinds = [
            ("", "Pod"),
            ("apps", "Pod"),
            ("apps.v1", "Pod"),
            ("", "Node"),
        ];
        let mut seen = HashSet::new();
        let mut n = 0;
        for (g, k) in kinds {
            for ns in namespaces {
                for name in names {
                    let s = t.render(&meta(g, k, ns, name));
                    assert!(seen.insert(s.clone()), "collision on {s}");
                    n += 1;
                }
            }
        }
        assert_eq!(seen.len(), n);
    }

    #[test]
    fn template_placeholders_must_be_whole_tokens() {
        assert!(SubjectTemplate::parse("k8s.{kind}.{name}").is_ok());
        assert!(matches!(
            SubjectTemplate::parse("k8s.{kind}-{name}"),
            Err(TemplateError::BadToken(_))
        ));
        assert!(matches!(
            SubjectTemplate::parse("k8s.{uid}"),
            Err(TemplateError::BadToken(_))
        ));
        assert!(matches!(
            SubjectTemplate::parse("k8s..{name}"),
            Err(TemplateError::EmptyToken(_))
        ));
        assert!(matches!(
            SubjectTemplate::parse("k8s.>"),
            Err(TemplateError::BadLiteral(_))
        ));
        assert_eq!(
            SubjectTemplate::parse("k8s.{resource}.{version}.{name}")
                .unwrap()
                .filter(),
            "k8s.*.*.*"
        );
    }

    #[test]
    fn headers_carry_the_contract_and_msg_id_in_jetstream_mode() {
        let m = Message {
            key: "prod-eu-1/apps/Deployment/default/web".into(),
            payload: bytes::Bytes::from_static(b"{}"),
            meta: Arc::new(meta("apps", "Deployment", Some("default"), "web")),
        };
        let h = headers(&m, true);
        assert_eq!(h.get("op").map(|v| v.as_str()), Some("added"));
        assert_eq!(h.get("namespace").map(|v| v.as_str()), Some("default"));
        assert_eq!(
            h.get("content-type").map(|v| v.as_str()),
            Some("application/json")
        );
        assert_eq!(
            h.get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str()),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert!(headers(&m, false)
            .get(async_nats::header::NATS_MESSAGE_ID)
            .is_none());
        let wire = |h: &HeaderMap| {
            let mut n = 12;
            for (k, vs) in h.iter() {
                for v in vs {
                    n += k.to_string().len() + 2 + v.as_str().len() + 2;
                }
            }
            n
        };
        assert_eq!(headers_wire_len(&m, true), wire(&headers(&m, true)));
        assert_eq!(headers_wire_len(&m, false), wire(&headers(&m, false)));
    }
}
