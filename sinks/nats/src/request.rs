//! Request building: message → NATS publish (subject, headers, payload).
//!
//! Owns the subject [`Dialect`] of the shared template engine and its one escaping rule of
//! subject tokens; it must never produce a token NATS treats specially (`.` separates tokens,
//! `*` and `>` are wildcards, whitespace ends the subject;
//! <https://docs.nats.io/nats-concepts/subjects#characters-allowed-and-recommended-for-subject-names>).
//! Never looks inside the payload: every routing fact comes from
//! [`MessageMeta`](kubesink_core::MessageMeta).
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
//!
//! The one reserved token: a sync marker's `{name}` is `%synced` ([`SYNCED_NAME`]), written
//! verbatim. Escaping only ever writes `%` followed by two hex digits, so no object's subject
//! can contain it, and [`unescape_token`] refuses it.

use std::fmt::Write as _;

use async_nats::HeaderMap;
use bytes::Bytes;
use kubesink_core::message::{Format, Placeholder, SYNCED_NAME};
use kubesink_core::template::{Dialect, Template};
use kubesink_core::{Message, SinkError};

use crate::cloudevents;

/// The token that stands for an empty value (the namespace of a cluster-scoped object).
pub const EMPTY_TOKEN: &str = "_";

/// Subject templates: `.`-separated tokens, each a literal or exactly one placeholder;
/// literals without wildcards or whitespace; values escaped by [`escape_token`].
pub static SUBJECT: Dialect = Dialect {
    what: "subject",
    separator: Some('.'),
    excluded: &[],
    check_literal,
    escape: |value, out| escape_token(value.unwrap_or(""), out),
};

fn check_literal(token: &str) -> Result<(), String> {
    if token == "*" || token == ">" {
        return Err("is a wildcard".into());
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace or control characters".into());
    }
    Ok(())
}

/// Parses a subject template, e.g. `kubesink.{cluster}.{group}.{kind}.{namespace}.{name}`.
///
/// # Errors
/// [`kubesink_core::template::TemplateError`] naming the offending token.
pub fn subject_template(text: &str) -> Result<Template, kubesink_core::template::TemplateError> {
    Template::parse(text, &SUBJECT)
}

/// One publish: subject, headers and the shared payload bytes.
#[derive(Debug)]
pub struct Publish {
    /// The subject.
    pub subject: String,
    /// The headers ([`headers`]).
    pub headers: HeaderMap,
    /// The payload (a reference to the message's bytes, not a copy).
    pub payload: Bytes,
}

/// The subject of `m`: the template rendered with escaped values; for a sync marker, with
/// [`SYNCED_NAME`] (`%synced`) verbatim as the `{name}` token, a token no escaped value can
/// produce, and `{namespace}` as usual (`_` when the marker covers all namespaces or a
/// cluster-scoped kind). The marker thus travels on a subject of the same shape as its
/// resource's objects, and a stream that stores them stores it.
pub fn subject(m: &Message, subjects: &Template) -> String {
    if m.meta.op.is_marker() {
        subjects.render_reserved(&m.meta, Placeholder::Name, SYNCED_NAME)
    } else {
        subjects.render(&m.meta)
    }
}

/// The publish of `m` on the subject `subjects` renders ([`subject`]), written in `format`.
pub fn build(m: &Message, subjects: &Template, jetstream: bool, format: Format) -> Publish {
    Publish {
        subject: subject(m, subjects),
        headers: headers(m, jetstream, format),
        payload: format.payload(m),
    }
}

/// The first publish of `batch` that exceeds the server's `max_payload` (`limit`, 0 = none)
/// with its headers, as [`SinkError::TooLarge`] (the index is the message's in the batch).
pub fn too_large(sink: &str, batch: &[Publish], limit: usize) -> Option<SinkError> {
    if limit == 0 {
        return None;
    }
    batch.iter().enumerate().find_map(|(index, p)| {
        let size = p.payload.len() + wire_len(&p.headers);
        (size > limit).then(|| SinkError::TooLarge {
            sink: sink.to_owned(),
            index,
            size,
            limit: Some(limit),
        })
    })
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

/// The headers of a message: the contract's headers ([`Message::headers`]: `op`, `kind`,
/// `apiVersion`, `group`, `cluster`, `namespace`, `name`, `key`, `content-type`, `id`, with
/// the format's `content-type`), plus `Nats-Msg-Id` (the message id) in JetStream mode so the
/// stream stores a redelivered change once within its duplicate window
/// (<https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive#message-deduplication>),
/// plus the CloudEvents attributes as `ce-` headers in binary mode
/// ([`cloudevents::nats_headers`]).
pub fn headers(m: &Message, jetstream: bool, format: Format) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in m.headers() {
        let v = if k == "content-type" {
            format.content_type()
        } else {
            v
        };
        h.insert(k, v);
    }
    if jetstream {
        h.insert(async_nats::header::NATS_MESSAGE_ID, &*m.meta.id);
    }
    if format == Format::CloudEvents {
        for (k, v) in cloudevents::nats_headers(m) {
            h.insert(k, &*v);
        }
    }
    h
}

/// Bytes headers take on the wire (`NATS/1.0\r\n`, `name: value\r\n` each, `\r\n`); the
/// server's `max_payload` bounds headers plus payload.
pub fn wire_len(h: &HeaderMap) -> usize {
    let mut len = b"NATS/1.0\r\n".len() + 2;
    for (k, vs) in h.iter() {
        for v in vs {
            len += AsRef::<str>::as_ref(k).len() + 2 + v.as_str().len() + 2;
        }
    }
    len
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::*;
    use kubesink_core::message::{MessageMeta, Resource};
    use kubesink_core::template::TemplateError;

    fn meta(group: &str, kind: &str, ns: Option<&str>, name: &str) -> MessageMeta {
        let plural = format!("{}s", kind.to_lowercase());
        let resource = Resource::new("prod-eu-1", group, "v1", kind, &plural, true);
        MessageMeta {
            id: "0123456789abcdef0123456789abcdef".into(),
            ..kubesink_core::message::fixtures::meta(Arc::new(resource), ns, name)
        }
    }

    fn default_template() -> Template {
        subject_template(super::super::DEFAULT_SUBJECT).unwrap()
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
    fn a_sync_marker_goes_to_the_reserved_name_token_no_object_can_produce() {
        let t = default_template();
        let r = Arc::new(Resource::new("prod-eu-1", "", "v1", "Pod", "pods", true));
        let s = kubesink_core::message::Synced {
            namespace: None,
            count: 1,
            resource_version: "5".into(),
            initial: true,
        };
        let marker = kubesink_core::message::encode_synced(&r, &s, "t").unwrap();
        assert_eq!(
            subject(&marker, &t),
            "kubesink.prod-eu-1.core.Pod._.%synced"
        );
        assert_eq!(unescape_token("%synced"), None);
        let mut tok = String::new();
        escape_token(SYNCED_NAME, &mut tok);
        assert_eq!(tok, "%25synced", "an object so named would not collide");
        let h = headers(&marker, true, Format::Json);
        assert_eq!(h.get("op").map(|v| v.as_str()), Some("synced"));
    }

    #[test]
    fn template_placeholders_must_be_whole_tokens() {
        assert!(subject_template("k8s.{kind}.{name}").is_ok());
        assert!(matches!(
            subject_template("k8s.{kind}-{name}"),
            Err(TemplateError::NotWholeToken { .. })
        ));
        assert!(matches!(
            subject_template("k8s.{uid}"),
            Err(TemplateError::UnknownPlaceholder { .. })
        ));
        assert!(matches!(
            subject_template("k8s..{name}"),
            Err(TemplateError::EmptyToken { .. })
        ));
        assert!(matches!(
            subject_template("k8s.>"),
            Err(TemplateError::BadLiteral { .. })
        ));
        assert_eq!(
            subject_template("k8s.{resource}.{version}.{name}")
                .unwrap()
                .pattern("*"),
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
        let h = headers(&m, true, Format::Json);
        assert_eq!(h.get("op").map(|v| v.as_str()), Some("added"));
        assert_eq!(h.get("namespace").map(|v| v.as_str()), Some("default"));
        assert_eq!(h.get("group").map(|v| v.as_str()), Some("apps"));
        assert_eq!(
            h.get("key").map(|v| v.as_str()),
            Some("prod-eu-1/apps/Deployment/default/web")
        );
        assert_eq!(
            h.get("content-type").map(|v| v.as_str()),
            Some("application/json")
        );
        assert_eq!(
            h.get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str()),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert!(headers(&m, false, Format::Json)
            .get(async_nats::header::NATS_MESSAGE_ID)
            .is_none());
        let ce = headers(&m, false, Format::CloudEvents);
        assert_eq!(ce.get("ce-specversion").map(|v| v.as_str()), Some("1.0"));
        assert_eq!(
            ce.get("ce-datacontenttype").map(|v| v.as_str()),
            Some("application/json")
        );
        let structured = headers(&m, false, Format::CloudEventsStructured);
        assert_eq!(
            structured.get("content-type").map(|v| v.as_str()),
            Some("application/cloudevents+json")
        );
        assert!(structured.get("ce-id").is_none());
        // The wire length, counted by hand for one header map.
        let h = headers(&m, false, Format::Json);
        let by_hand = 12
            + m.headers()
                .map(|(k, v)| k.len() + 2 + v.len() + 2)
                .sum::<usize>();
        assert_eq!(wire_len(&h), by_hand);
    }
}
