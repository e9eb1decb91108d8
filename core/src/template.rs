//! The one template engine for where a sink sends each message (NATS subjects, Kafka topics).
//!
//! A template is literal text with [`Placeholder`]s in braces (`kubesink.{cluster}.{kind}`).
//! What differs between destinations is a [`Dialect`]: whether placeholders must be whole
//! `.`-separated tokens (NATS), which placeholders are refused (Kafka refuses `{name}`: a topic
//! per object would be unbounded), which literal text is legal, and how a value is escaped.
//! Parsing, errors and rendering are written once, here.
//!
//! This module never looks inside a payload: values come from [`MessageMeta`].

use crate::message::{MessageMeta, Placeholder};

/// What distinguishes one destination's templates from another's.
#[derive(Debug)]
pub struct Dialect {
    /// What the template names, for errors (`subject`, `topic`).
    pub what: &'static str,
    /// `Some(sep)`: the template is `sep`-separated tokens, none empty, each a literal or
    /// exactly one placeholder (NATS subjects, `.`). `None`: placeholders may sit anywhere.
    pub separator: Option<char>,
    /// Placeholders this destination refuses.
    pub excluded: &'static [Placeholder],
    /// Checks literal text (one token with a separator, else each literal run); `Err` says
    /// why it is illegal.
    pub check_literal: fn(&str) -> Result<(), String>,
    /// Appends a placeholder's value, escaped; `None` is `{namespace}` of a cluster-scoped
    /// object.
    pub escape: fn(Option<&str>, &mut String),
}

impl Dialect {
    fn known(&self) -> String {
        Placeholder::ALL
            .iter()
            .filter(|p| !self.excluded.contains(p))
            .map(|p| format!("{{{}}}", p.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn placeholder(&self, template: &str, name: &str) -> Result<Placeholder, TemplateError> {
        match Placeholder::parse(name) {
            Some(p) if !self.excluded.contains(&p) => Ok(p),
            _ => Err(TemplateError::UnknownPlaceholder {
                what: self.what,
                template: template.to_owned(),
                name: name.to_owned(),
                known: self.known(),
            }),
        }
    }

    fn literal(&self, template: &str, text: &str) -> Result<(), TemplateError> {
        (self.check_literal)(text).map_err(|reason| TemplateError::BadLiteral {
            what: self.what,
            template: template.to_owned(),
            literal: text.to_owned(),
            reason,
        })
    }
}

/// Why a template is invalid; each variant names the template and the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template is empty.
    #[error("{what} template is empty")]
    Empty {
        /// `subject` or `topic`.
        what: &'static str,
    },
    /// A `{` without its `}`.
    #[error("{what} template {template:?}: unclosed `{{`")]
    Unclosed {
        /// `subject` or `topic`.
        what: &'static str,
        /// The template.
        template: String,
    },
    /// A placeholder that does not exist or that this destination refuses.
    #[error("{what} template {template:?}: unknown placeholder {{{name}}} (known: {known})")]
    UnknownPlaceholder {
        /// `subject` or `topic`.
        what: &'static str,
        /// The template.
        template: String,
        /// The name inside the braces.
        name: String,
        /// The placeholders this destination accepts.
        known: String,
    },
    /// A token mixes a placeholder with other text (separated dialects only).
    #[error("{what} template {template:?}: token {token:?} must be a literal or exactly one placeholder")]
    NotWholeToken {
        /// `subject` or `topic`.
        what: &'static str,
        /// The template.
        template: String,
        /// The token.
        token: String,
    },
    /// An empty token (`a..b`, a leading or trailing separator).
    #[error("{what} template {template:?} has an empty token")]
    EmptyToken {
        /// `subject` or `topic`.
        what: &'static str,
        /// The template.
        template: String,
    },
    /// Literal text the destination does not allow.
    #[error("{what} template {template:?}: literal {literal:?} {reason}")]
    BadLiteral {
        /// `subject` or `topic`.
        what: &'static str,
        /// The template.
        template: String,
        /// The literal text.
        literal: String,
        /// Why it is refused.
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Value(Placeholder),
}

/// A parsed template of one [`Dialect`].
#[derive(Clone, Debug)]
pub struct Template {
    parts: Vec<Part>,
    dialect: &'static Dialect,
}

impl PartialEq for Template {
    fn eq(&self, other: &Self) -> bool {
        self.parts == other.parts && std::ptr::eq(self.dialect, other.dialect)
    }
}

impl Template {
    /// Parses `template` in `dialect`.
    ///
    /// # Errors
    /// [`TemplateError`] naming the template and the offending part.
    pub fn parse(template: &str, dialect: &'static Dialect) -> Result<Self, TemplateError> {
        if template.is_empty() {
            return Err(TemplateError::Empty { what: dialect.what });
        }
        let mut parts = Vec::new();
        match dialect.separator {
            Some(sep) => {
                for (i, token) in template.split(sep).enumerate() {
                    if i > 0 {
                        push_literal(&mut parts, &sep.to_string());
                    }
                    parse_token(template, token, dialect, &mut parts)?;
                }
            }
            None => parse_free(template, dialect, &mut parts)?,
        }
        Ok(Template { parts, dialect })
    }

    /// Where a message goes (its subject or topic): literals as written, placeholders escaped by the
    /// dialect.
    pub fn render(&self, m: &MessageMeta) -> String {
        let mut out = String::with_capacity(96);
        for p in &self.parts {
            match p {
                Part::Literal(s) => out.push_str(s),
                Part::Value(v) => (self.dialect.escape)(v.value(m), &mut out),
            }
        }
        out
    }

    /// Like [`Template::render`], but `reserved` is written verbatim for `placeholder`
    /// instead of its escaped value: for a token no escaped value can produce (the sync
    /// marker's `%synced` name token in NATS subjects).
    pub fn render_reserved(
        &self,
        m: &MessageMeta,
        placeholder: Placeholder,
        reserved: &str,
    ) -> String {
        let mut out = String::with_capacity(96);
        for p in &self.parts {
            match p {
                Part::Literal(s) => out.push_str(s),
                Part::Value(v) if *v == placeholder => out.push_str(reserved),
                Part::Value(v) => (self.dialect.escape)(v.value(m), &mut out),
            }
        }
        out
    }

    /// Whether `name` is what this template renders for `m` with `free` taking some
    /// non-empty rendered value (every other placeholder rendered from `m`). Used to find the
    /// existing Kafka topics of a resource watched in all namespaces when the topic template
    /// has `{namespace}`. `excluded` lists rendered values `free` may not take.
    pub fn matches(
        &self,
        name: &str,
        m: &MessageMeta,
        free: Placeholder,
        excluded: &[&str],
    ) -> bool {
        enum Piece {
            Fixed(String),
            Free,
        }
        let pieces: Vec<Piece> = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Literal(s) => Piece::Fixed(s.clone()),
                Part::Value(v) if *v == free => Piece::Free,
                Part::Value(v) => {
                    let mut out = String::new();
                    (self.dialect.escape)(v.value(m), &mut out);
                    Piece::Fixed(out)
                }
            })
            .collect();
        // Each free occurrence must take the same value: remember the first one.
        fn go<'a>(
            pieces: &[Piece],
            rest: &'a str,
            taken: Option<&'a str>,
            excluded: &[&str],
        ) -> bool {
            let Some((first, more)) = pieces.split_first() else {
                return rest.is_empty();
            };
            match first {
                Piece::Fixed(f) => rest
                    .strip_prefix(f.as_str())
                    .is_some_and(|r| go(more, r, taken, excluded)),
                Piece::Free => match taken {
                    Some(v) => rest
                        .strip_prefix(v)
                        .is_some_and(|r| go(more, r, taken, excluded)),
                    None => (1..=rest.len())
                        .filter(|i| rest.is_char_boundary(*i))
                        .any(|i| {
                            let v = &rest[..i];
                            !excluded.contains(&v) && go(more, &rest[i..], Some(v), excluded)
                        }),
                },
            }
        }
        go(&pieces, name, None, excluded)
    }

    /// The template with every placeholder replaced by `wildcard` (a NATS stream filter with
    /// `*`).
    pub fn pattern(&self, wildcard: &str) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Literal(s) => s.as_str(),
                Part::Value(_) => wildcard,
            })
            .collect()
    }

    /// Whether the template uses `p`.
    pub fn uses(&self, p: Placeholder) -> bool {
        self.parts.contains(&Part::Value(p))
    }
}

fn push_literal(parts: &mut Vec<Part>, text: &str) {
    if let Some(Part::Literal(last)) = parts.last_mut() {
        last.push_str(text);
    } else if !text.is_empty() {
        parts.push(Part::Literal(text.to_owned()));
    }
}

/// One token of a separated dialect: a whole placeholder, or a literal.
fn parse_token(
    template: &str,
    token: &str,
    d: &'static Dialect,
    parts: &mut Vec<Part>,
) -> Result<(), TemplateError> {
    if token.is_empty() {
        return Err(TemplateError::EmptyToken {
            what: d.what,
            template: template.to_owned(),
        });
    }
    if let Some(name) = token.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        if !name.contains(['{', '}']) {
            parts.push(Part::Value(d.placeholder(template, name)?));
            return Ok(());
        }
    }
    if token.contains(['{', '}']) {
        return Err(TemplateError::NotWholeToken {
            what: d.what,
            template: template.to_owned(),
            token: token.to_owned(),
        });
    }
    d.literal(template, token)?;
    push_literal(parts, token);
    Ok(())
}

/// A dialect without separator: placeholders anywhere between literal runs.
fn parse_free(
    template: &str,
    d: &'static Dialect,
    parts: &mut Vec<Part>,
) -> Result<(), TemplateError> {
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let literal = &rest[..open];
        if !literal.is_empty() {
            d.literal(template, literal)?;
            push_literal(parts, literal);
        }
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| TemplateError::Unclosed {
            what: d.what,
            template: template.to_owned(),
        })?;
        parts.push(Part::Value(d.placeholder(template, &after[..close])?));
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        d.literal(template, rest)?;
        push_literal(parts, rest);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::message::Resource;

    fn plain(v: Option<&str>, out: &mut String) {
        out.push_str(v.unwrap_or("-"));
    }

    fn no_braces(s: &str) -> Result<(), String> {
        if s.contains(' ') {
            Err("contains a space".into())
        } else {
            Ok(())
        }
    }

    static DOTTED: Dialect = Dialect {
        what: "subject",
        separator: Some('.'),
        excluded: &[],
        check_literal: no_braces,
        escape: plain,
    };
    static FREE: Dialect = Dialect {
        what: "topic",
        separator: None,
        excluded: &[Placeholder::Name],
        check_literal: no_braces,
        escape: plain,
    };

    fn meta(ns: Option<&str>) -> MessageMeta {
        let pods = Resource::new("prod", "", "v1", "Pod", "pods", true);
        MessageMeta {
            id: "0".into(),
            ..crate::message::fixtures::meta(Arc::new(pods), ns, "web")
        }
    }

    #[test]
    fn renders_literals_and_escaped_values() {
        let t = Template::parse("k.{cluster}.{group}.{namespace}.{name}", &DOTTED).unwrap();
        assert_eq!(t.render(&meta(Some("ns"))), "k.prod.core.ns.web");
        assert_eq!(t.render(&meta(None)), "k.prod.core.-.web");
        assert_eq!(t.pattern("*"), "k.*.*.*.*");
        let t = Template::parse("k8s-{cluster}_{resource}", &FREE).unwrap();
        assert_eq!(t.render(&meta(None)), "k8s-prod_pods");
        assert!(t.uses(Placeholder::Resource) && !t.uses(Placeholder::Kind));
    }

    #[test]
    fn reserved_tokens_are_written_verbatim_and_matching_finds_free_values() {
        let t = Template::parse("k.{cluster}.{namespace}.{name}", &DOTTED).unwrap();
        assert_eq!(
            t.render_reserved(&meta(None), Placeholder::Name, "%x"),
            "k.prod.-.%x"
        );
        let t = Template::parse("k8s-{cluster}-{namespace}-{resource}", &FREE).unwrap();
        let m = meta(None);
        assert!(t.matches("k8s-prod-web-pods", &m, Placeholder::Namespace, &[]));
        assert!(t.matches("k8s-prod-a-b-c-pods", &m, Placeholder::Namespace, &[]));
        assert!(!t.matches("k8s-prod--pods", &m, Placeholder::Namespace, &[]));
        assert!(!t.matches("k8s-prod-web-nodes", &m, Placeholder::Namespace, &[]));
        assert!(!t.matches("k8s-other-web-pods", &m, Placeholder::Namespace, &[]));
        assert!(!t.matches("k8s-prod-_c-pods", &m, Placeholder::Namespace, &["_c"]));
        let twice = Template::parse("{namespace}.x.{namespace}", &FREE).unwrap();
        assert!(twice.matches("a.x.a", &m, Placeholder::Namespace, &[]));
        assert!(!twice.matches("a.x.b", &m, Placeholder::Namespace, &[]));
    }

    #[test]
    fn errors_name_the_offending_part() {
        let e = |t, d| Template::parse(t, d).unwrap_err();
        assert!(matches!(e("", &DOTTED), TemplateError::Empty { .. }));
        assert!(matches!(
            e("a..b", &DOTTED),
            TemplateError::EmptyToken { .. }
        ));
        assert!(matches!(
            e("a.{kind}-{name}", &DOTTED),
            TemplateError::NotWholeToken { .. }
        ));
        assert!(matches!(
            e("a.{uid}", &DOTTED),
            TemplateError::UnknownPlaceholder { .. }
        ));
        assert!(matches!(
            e("a.b c", &DOTTED),
            TemplateError::BadLiteral { .. }
        ));
        assert!(matches!(
            e("t-{kind", &FREE),
            TemplateError::Unclosed { .. }
        ));
        let name = e("t-{name}", &FREE);
        assert!(matches!(name, TemplateError::UnknownPlaceholder { .. }));
        assert!(!name.to_string().contains("{name},"), "{name}");
        assert!(e("t {kind}", &FREE)
            .to_string()
            .contains("\"t \" contains a space"));
    }
}
