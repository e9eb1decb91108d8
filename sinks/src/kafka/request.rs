//! Request building: message → Kafka record parts (topic, key, headers).
//!
//! Owns the topic template and its escaping rule. Must never look inside the payload: every
//! routing fact comes from [`MessageMeta`].

use rdkafka::message::{Header, OwnedHeaders};

use crate::{Message, MessageMeta, Placeholder};

/// Longest legal Kafka topic name.
pub const MAX_TOPIC_LEN: usize = 249;

/// What the `{namespace}` placeholder becomes for a cluster-scoped object.
pub const CLUSTER_SCOPE: &str = "_cluster";

/// Why a topic template is invalid.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// `{name}` is not one of the placeholders.
    #[error("unknown placeholder {{{0}}} (known: {{cluster}}, {{group}}, {{version}}, {{kind}}, {{resource}}, {{namespace}})")]
    UnknownPlaceholder(String),
    /// A `{` without its `}`.
    #[error("unclosed `{{` in topic template")]
    Unclosed,
    /// Literal text with a character Kafka does not allow in topic names.
    #[error("character {0:?} is not allowed in a Kafka topic name (allowed: A-Z a-z 0-9 . _ -)")]
    IllegalChar(char),
    /// The template is empty.
    #[error("topic template is empty")]
    Empty,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Placeholder),
}

/// A parsed `topic` template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
}

/// Whether Kafka allows `c` in a topic name (`[A-Za-z0-9._-]`).
pub fn legal_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The escaping rule for substituted values: every character outside `[A-Za-z0-9._-]`
/// becomes `_`. (Kubernetes names, groups, kinds and cluster names never contain one, so
/// in practice values pass through unchanged.)
pub fn escape(value: &str, out: &mut String) {
    out.extend(
        value
            .chars()
            .map(|c| if legal_topic_char(c) { c } else { '_' }),
    );
}

impl TopicTemplate {
    /// Parses `template`.
    ///
    /// # Errors
    /// [`TemplateError`] for an unknown placeholder, an unclosed `{`, illegal literal
    /// characters, or an empty template.
    pub fn parse(template: &str) -> Result<Self, TemplateError> {
        if template.is_empty() {
            return Err(TemplateError::Empty);
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let lit = &rest[..open];
            Self::check_literal(lit)?;
            if !lit.is_empty() {
                parts.push(Part::Lit(lit.to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or(TemplateError::Unclosed)?;
            // `{name}` is not a topic placeholder: a topic per object would be unbounded.
            let var = match Placeholder::parse(&after[..close]) {
                Some(Placeholder::Name) | None => {
                    return Err(TemplateError::UnknownPlaceholder(after[..close].to_owned()))
                }
                Some(p) => p,
            };
            parts.push(Part::Var(var));
            rest = &after[close + 1..];
        }
        Self::check_literal(rest)?;
        if !rest.is_empty() {
            parts.push(Part::Lit(rest.to_owned()));
        }
        Ok(TopicTemplate { parts })
    }

    fn check_literal(lit: &str) -> Result<(), TemplateError> {
        match lit.chars().find(|c| !legal_topic_char(*c)) {
            Some(c) => Err(TemplateError::IllegalChar(c)),
            None => Ok(()),
        }
    }

    /// Whether the topic is the same for every message of one cluster (no per-object
    /// placeholder), so the healthcheck can name it once the cluster is known.
    pub fn is_static(&self) -> bool {
        self.parts
            .iter()
            .all(|p| matches!(p, Part::Lit(_) | Part::Var(Placeholder::Cluster)))
    }

    /// The topic of a message. The result may exceed [`MAX_TOPIC_LEN`]; the caller checks.
    pub fn render(&self, m: &MessageMeta) -> String {
        let mut out = String::with_capacity(64);
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v) => escape(v.value(m).unwrap_or(CLUSTER_SCOPE), &mut out),
            }
        }
        out
    }
}

/// The record headers of a message: `Message::headers()` (op, kind, apiVersion, cluster,
/// namespace, name, content-type, id), values as UTF-8 bytes.
pub fn headers(m: &Message) -> OwnedHeaders {
    m.headers()
        .fold(OwnedHeaders::new_with_capacity(8), |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        })
}

/// The headers of a tombstone: the same as its `deleted` message, with `op` = `tombstone`
/// and no `content-type` (a tombstone has no payload).
pub fn tombstone_headers(m: &Message) -> OwnedHeaders {
    m.headers().filter(|(k, _)| *k != "content-type").fold(
        OwnedHeaders::new_with_capacity(8),
        |h, (key, value)| {
            let value = if key == "op" { "tombstone" } else { value };
            h.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        },
    )
}
