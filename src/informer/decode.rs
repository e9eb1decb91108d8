//! Decoding what the API server sends on a list or watch, per the API concepts
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>):
//! a list page (`metadata.resourceVersion`, `metadata.continue`, `items`), a watch event line
//! (`{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}`), and a `Status`.
//!
//! Objects are not decoded here: a page's items and an event's object stay raw JSON text
//! (`&RawValue`, borrowed from the response) until `object.rs` reads them one by one, so one
//! bad item does not cost a whole page.
//!
//! Every failure is a [`DecodeError`] that quotes the start of the offending bytes (at most
//! [`EXCERPT_BYTES`]), never the whole body: a 5 MiB object must not become a 5 MiB log line.

use std::fmt;

use serde::Deserialize;
use serde_json::value::RawValue;

/// How many bytes of undecodable input an error quotes.
pub const EXCERPT_BYTES: usize = 200;

/// A `Status` object (`kind: Status`), as API errors and watch `ERROR` events carry it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Status {
    /// HTTP status code (410 for an expired resourceVersion).
    #[serde(default)]
    pub code: u16,
    /// Machine-readable reason (`Expired`, `Forbidden`, `NotFound`...).
    #[serde(default)]
    pub reason: String,
    /// Human-readable description.
    #[serde(default)]
    pub message: String,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code, self.reason)?;
        if !self.message.is_empty() {
            write!(f, ": {}", excerpt(self.message.as_bytes()))?;
        }
        Ok(())
    }
}

impl Status {
    /// Reads a `Status` from an error response body; `None` when the body is not one
    /// (a proxy's HTML page, an empty body).
    pub fn from_body(body: &[u8]) -> Option<Status> {
        #[derive(Deserialize)]
        struct Probe {
            kind: Option<String>,
        }
        let probe: Probe = serde_json::from_slice(body).ok()?;
        if probe.kind.as_deref() != Some("Status") {
            return None;
        }
        serde_json::from_slice(body).ok()
    }
}

/// A list page: its items as raw JSON, and where the list continues.
#[derive(Debug, Deserialize)]
pub struct ListPage<'a> {
    /// `metadata` of the list.
    #[serde(default)]
    pub metadata: ListMeta,
    /// The objects, undecoded. `null` and absence both mean none.
    #[serde(borrow, default, deserialize_with = "nullable_items")]
    pub items: Vec<&'a RawValue>,
}

fn nullable_items<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<&'de RawValue>, D::Error> {
    Ok(Option::<Vec<&'de RawValue>>::deserialize(d)?.unwrap_or_default())
}

/// `metadata` of a list.
#[derive(Debug, Default, Deserialize)]
pub struct ListMeta {
    /// The list's resourceVersion: where a watch continues from.
    #[serde(rename = "resourceVersion", default)]
    pub resource_version: Option<String>,
    /// The continue token of the next page; absent or `""` on the last page.
    #[serde(rename = "continue", default)]
    pub continue_token: Option<String>,
}

impl ListMeta {
    /// The continue token, `None` on the last page (absent or explicitly empty).
    pub fn next_page(&self) -> Option<&str> {
        self.continue_token.as_deref().filter(|c| !c.is_empty())
    }
}

/// One watch event line, the object still raw.
#[derive(Debug)]
pub enum WatchLine<'a> {
    /// ADDED.
    Added(&'a RawValue),
    /// MODIFIED.
    Modified(&'a RawValue),
    /// DELETED (the object's final state).
    Deleted(&'a RawValue),
    /// BOOKMARK: a resourceVersion to resume from.
    Bookmark {
        /// The bookmark's resourceVersion.
        resource_version: String,
        /// Annotated `k8s.io/initial-events-end: "true"`: the end of a streaming list's
        /// initial events (KEP-3157).
        initial_events_end: bool,
    },
    /// ERROR with its Status (410 Expired when the resourceVersion is too old).
    Error(Status),
}

/// What went wrong decoding a response, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// What was being decoded: `watch event`, `list page`, `object`.
    pub what: &'static str,
    /// Why, in words (serde_json's message, or "not a watch event").
    pub reason: String,
    /// The first [`EXCERPT_BYTES`] bytes, escaped.
    pub excerpt: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "undecodable {}: {}; starts with {}",
            self.what, self.reason, self.excerpt
        )
    }
}

impl std::error::Error for DecodeError {}

impl DecodeError {
    pub(crate) fn new(what: &'static str, reason: impl fmt::Display, input: &[u8]) -> Self {
        DecodeError {
            what,
            reason: reason.to_string(),
            excerpt: excerpt(input),
        }
    }
}

/// The first [`EXCERPT_BYTES`] bytes of `input`, as a quoted string with invalid UTF-8 and
/// control characters escaped, and `…` when cut.
pub fn excerpt(input: &[u8]) -> String {
    let cut = &input[..input.len().min(EXCERPT_BYTES)];
    let mut text = format!("{:?}", String::from_utf8_lossy(cut));
    if input.len() > EXCERPT_BYTES {
        text.push('…');
    }
    text
}

/// Decodes a list page.
///
/// # Errors
/// [`DecodeError`] when the body is not a list.
pub fn list_page(body: &[u8]) -> Result<ListPage<'_>, DecodeError> {
    serde_json::from_slice(body).map_err(|e| DecodeError::new("list page", e, body))
}

/// Decodes one watch event line (without its newline).
///
/// # Errors
/// [`DecodeError`] for anything that is not a watch event: a truncated or garbled line,
/// bytes that are not UTF-8, valid JSON without `type` and `object`, an unknown type, an
/// `ERROR` event whose object is not a `Status` with a code (never reported as an API error).
pub fn watch_line(line: &[u8]) -> Result<WatchLine<'_>, DecodeError> {
    #[derive(Deserialize)]
    struct Line<'a> {
        #[serde(rename = "type")]
        kind: Option<&'a str>,
        #[serde(borrow)]
        object: Option<&'a RawValue>,
    }
    let err = |reason: &dyn fmt::Display| DecodeError::new("watch event", reason, line);
    let parsed: Line<'_> = serde_json::from_slice(line).map_err(|e| err(&e))?;
    let (Some(kind), Some(object)) = (parsed.kind, parsed.object) else {
        return Err(err(
            &"valid JSON but not a watch event (no \"type\" and \"object\")",
        ));
    };
    match kind {
        "ADDED" => Ok(WatchLine::Added(object)),
        "MODIFIED" => Ok(WatchLine::Modified(object)),
        "DELETED" => Ok(WatchLine::Deleted(object)),
        "BOOKMARK" => bookmark(object.get()).map_err(|e| err(&e)),
        "ERROR" => match serde_json::from_str::<Status>(object.get()) {
            Ok(status) if status.code != 0 => Ok(WatchLine::Error(status)),
            Ok(_) => Err(err(&"ERROR event without a Status code")),
            Err(e) => Err(err(&format!("ERROR event without a Status: {e}"))),
        },
        other => Err(err(&format!("unknown watch event type {other:?}"))),
    }
}

/// The annotation on the BOOKMARK that ends a streaming list's initial events (KEP-3157,
/// `metav1.InitialEventsAnnotationKey`).
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

fn bookmark(object: &str) -> Result<WatchLine<'static>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Annotations {
        #[serde(rename = "k8s.io/initial-events-end", default)]
        initial_events_end: Option<String>,
    }
    #[derive(Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion", default)]
        resource_version: String,
        #[serde(default)]
        annotations: Option<Annotations>,
    }
    #[derive(Deserialize)]
    struct Object {
        metadata: Meta,
    }
    let o: Object = serde_json::from_str(object)?;
    Ok(WatchLine::Bookmark {
        resource_version: o.metadata.resource_version,
        initial_events_end: o
            .metadata
            .annotations
            .and_then(|a| a.initial_events_end)
            .is_some_and(|v| v == "true"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_lines_of_every_type_decode() {
        let l = watch_line(br#"{"type":"ADDED","object":{"metadata":{"name":"a"}}}"#).unwrap();
        assert!(matches!(l, WatchLine::Added(o) if o.get() == r#"{"metadata":{"name":"a"}}"#));
        assert!(matches!(
            watch_line(br#"{"type":"DELETED","object":{}}"#).unwrap(),
            WatchLine::Deleted(_)
        ));
        let b = watch_line(br#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"12","annotations":{"k8s.io/initial-events-end":"true"}}}}"#).unwrap();
        assert!(
            matches!(b, WatchLine::Bookmark { resource_version, initial_events_end: true } if resource_version == "12")
        );
        // Only the annotation with the value "true" ends the initial events.
        for plain in [
            r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"13"}}}"#,
            r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"13","annotations":null}}}"#,
            r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"13","annotations":{"k8s.io/initial-events-end":"false"}}}}"#,
        ] {
            assert!(
                matches!(
                    watch_line(plain.as_bytes()).unwrap(),
                    WatchLine::Bookmark {
                        initial_events_end: false,
                        ..
                    }
                ),
                "{plain}"
            );
        }
        let e = watch_line(br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version"}}"#).unwrap();
        assert!(matches!(e, WatchLine::Error(s) if s.code == 410 && s.reason == "Expired"));
    }

    #[test]
    fn damaged_lines_are_errors_that_quote_the_start() {
        let cut = br#"{"type":"MODIFIED","object":{"metadata":{"name":"web","resourceVer"#;
        let e = watch_line(cut).unwrap_err();
        assert!(e.reason.contains("EOF"), "{e}");
        assert!(e.excerpt.contains("MODIFIED"), "{e}");
        let e = watch_line(b"<html>502 Bad Gateway</html>").unwrap_err();
        assert!(e.to_string().contains("undecodable watch event"), "{e}");
        let e = watch_line(b"{\"type\":\"ADDED\",\"object\":{\"a\":\"\xff\xfe\"}}").unwrap_err();
        assert!(e.excerpt.contains('\u{fffd}'), "{e}");
        let e = watch_line(br#"{"hello":"world"}"#).unwrap_err();
        assert!(e.reason.contains("not a watch event"), "{e}");
        // An ERROR event must carry a Status with a code: `{}` is not an API error.
        let e = watch_line(br#"{"type":"ERROR","object":{}}"#).unwrap_err();
        assert!(e.reason.contains("without a Status code"), "{e}");
        let e = watch_line(br#"{"type":"PATCHED","object":{}}"#).unwrap_err();
        assert!(e.reason.contains("PATCHED"), "{e}");
        let long = vec![b'x'; 5000];
        let e = watch_line(&long).unwrap_err();
        assert!(e.excerpt.len() < EXCERPT_BYTES + 10 && e.excerpt.ends_with('…'));
    }

    #[test]
    fn list_pages_give_items_raw_and_the_next_page() {
        let p = list_page(br#"{"kind":"PodList","metadata":{"resourceVersion":"9","continue":"abc"},"items":[{"a":1},{"b":[2]}]}"#).unwrap();
        assert_eq!(p.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(p.metadata.next_page(), Some("abc"));
        assert_eq!(
            p.items.iter().map(|i| i.get()).collect::<Vec<_>>(),
            [r#"{"a":1}"#, r#"{"b":[2]}"#]
        );
        let last = list_page(br#"{"metadata":{"resourceVersion":"9","continue":""},"items":null}"#)
            .unwrap();
        assert_eq!(last.metadata.next_page(), None);
        assert!(last.items.is_empty());
    }

    #[test]
    fn a_status_body_is_recognised_and_anything_else_is_not() {
        let s = Status::from_body(br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods is forbidden","reason":"Forbidden","code":403}"#).unwrap();
        assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
        assert_eq!(s.to_string(), "403 Forbidden: \"pods is forbidden\"");
        assert!(Status::from_body(b"<html>").is_none());
        assert!(Status::from_body(br#"{"kind":"PodList"}"#).is_none());
    }
}
