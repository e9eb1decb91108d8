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

/// A list page read whole: its items as raw JSON, and where the list continues. The
/// reference the [`PageSplitter`]'s tests compare with (lists are read split).
#[cfg(test)]
#[derive(Debug, Deserialize)]
pub struct ListPage<'a> {
    /// `metadata` of the list.
    #[serde(default)]
    pub metadata: ListMeta,
    /// The objects, undecoded. `null` and absence both mean none.
    #[serde(borrow, default, deserialize_with = "nullable_items")]
    pub items: Vec<&'a RawValue>,
}

#[cfg(test)]
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

/// A JSON list response split into its items as its bytes arrive, so that a page is never
/// held whole: what it keeps is the item being read and the bytes of the last chunk after it
/// (a page of 500 whole Pods is ~4.5 MB; read whole, with its buffer's doublings, it cost the
/// paged initial list ~25 MB of peak the streaming list did not have: BENCHMARKS.md).
///
/// The list is a JSON object whose `items` is an array of values (or `null`); its other
/// members are kept raw only for `metadata`, read at the end ([`PageSplitter::finish`]):
/// Go's encoder writes `metadata` before `items` for built-in lists and, for a custom
/// resource's `UnstructuredList` (a map, its keys sorted), after them, so either order is
/// taken. Strings are scanned with their escapes; nothing is unescaped or parsed here
/// except the member names and `metadata`.
#[derive(Debug, Default)]
pub struct PageSplitter {
    /// Bytes received and not yet consumed.
    buf: Vec<u8>,
    /// Where scanning resumes in `buf`.
    pos: usize,
    /// Bytes of `buf` already handed out or skipped (dropped at the next call).
    consumed: usize,
    /// Bytes dropped from the front of `buf` so far (for error positions).
    dropped: usize,
    /// Where the list's structure is.
    at: At,
    /// The value being scanned.
    value: Scan,
    /// The member whose value is being read.
    member: Option<String>,
    /// `metadata`, raw.
    metadata: Option<Vec<u8>>,
}

/// Where a [`PageSplitter`] is in the list's structure.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the list's `{`.
    #[default]
    Start,
    /// Before a member name or the list's `}` (`first`: no member yet).
    Member { first: bool },
    /// Before the `:` after a member name.
    Colon,
    /// In the value of a member other than `items`.
    Value,
    /// Before `items`' `[` (or `null`).
    ItemsOpen,
    /// In the `null` of `items`.
    ItemsNull,
    /// Before an item or the array's `]` (`first`: no item yet).
    Item { first: bool },
    /// In an item.
    InItem,
    /// After an item: `,` or `]`.
    AfterItem,
    /// After a member's value: `,` or `}`.
    AfterValue,
    /// After the list's `}`.
    Done,
}

/// The scan of one JSON value: where it started, how deep, inside a string or a scalar.
#[derive(Debug, Default, Clone, Copy)]
struct Scan {
    start: usize,
    started: bool,
    depth: u32,
    in_string: bool,
    escaped: bool,
    scalar: bool,
}

impl PageSplitter {
    /// Appends the next bytes of the response.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete item, as a range of [`PageSplitter::item`]'s bytes; `None` when
    /// more bytes are needed (or the list ended: [`PageSplitter::done`]).
    ///
    /// # Errors
    /// What is wrong with the bytes, and at which offset of the body.
    pub fn next(&mut self) -> Result<Option<std::ops::Range<usize>>, String> {
        self.compact();
        loop {
            let Some(&b) = self.buf.get(self.pos) else {
                return Ok(None);
            };
            let ws = matches!(b, b' ' | b'\t' | b'\r' | b'\n');
            match self.at {
                At::Start
                | At::Member { .. }
                | At::Colon
                | At::ItemsOpen
                | At::Item { .. }
                | At::AfterItem
                | At::AfterValue
                | At::Done
                    if ws =>
                {
                    self.pos += 1;
                }
                At::Start if b == b'{' => self.step(At::Member { first: true }),
                At::Member { first: true } if b == b'}' => self.step(At::Done),
                At::Member { .. } if b == b'"' => {
                    let start = self.pos;
                    let Some(end) = string_end(&self.buf, start) else {
                        return Ok(None);
                    };
                    let name: String = serde_json::from_slice(&self.buf[start..end])
                        .map_err(|e| self.error(&format!("member name: {e}")))?;
                    self.member = Some(name);
                    self.pos = end;
                    self.consumed = end;
                    self.at = At::Colon;
                }
                At::Colon if b == b':' => {
                    let items = self.member.as_deref() == Some("items");
                    self.step(if items { At::ItemsOpen } else { At::Value });
                    self.value = Scan::default();
                }
                At::ItemsOpen if b == b'[' => self.step(At::Item { first: true }),
                At::ItemsOpen if b == b'n' => {
                    self.value = Scan::default();
                    self.at = At::ItemsNull;
                }
                At::Item { first: true } if b == b']' => self.step(At::AfterValue),
                At::Item { .. } if !matches!(b, b']' | b',' | b'}' | b':') => {
                    self.value = Scan::default();
                    self.at = At::InItem;
                }
                At::AfterItem if b == b',' => self.step(At::Item { first: false }),
                At::AfterItem if b == b']' => self.step(At::AfterValue),
                At::AfterValue if b == b',' => self.step(At::Member { first: false }),
                At::AfterValue if b == b'}' => self.step(At::Done),
                At::Value | At::ItemsNull | At::InItem => {
                    let Some(end) = self.scan() else {
                        return Ok(None);
                    };
                    let range = self.value.start..end;
                    self.consumed = end;
                    match self.at {
                        At::InItem => {
                            self.at = At::AfterItem;
                            return Ok(Some(range));
                        }
                        At::ItemsNull if &self.buf[range.clone()] != b"null" => {
                            return Err(self.error("items is neither an array nor null"));
                        }
                        At::Value if self.member.as_deref() == Some("metadata") => {
                            self.metadata = Some(self.buf[range].to_vec());
                        }
                        _ => {}
                    }
                    self.at = At::AfterValue;
                }
                _ => {
                    return Err(self.error(&format!(
                        "unexpected {:?} ({:?})",
                        char::from(b),
                        self.at
                    )))
                }
            }
        }
    }

    /// The bytes of an item [`PageSplitter::next`] returned (valid until the next call).
    pub fn item(&self, range: std::ops::Range<usize>) -> &[u8] {
        &self.buf[range]
    }

    /// Whether the list's closing `}` was read.
    pub fn done(&self) -> bool {
        self.at == At::Done
    }

    /// The list's `metadata` once the body ended.
    ///
    /// # Errors
    /// The body ended before the list did, or `metadata` is not a list's.
    pub fn finish(&self) -> Result<ListMeta, String> {
        if !self.done()
            || self.buf[self.pos..]
                .iter()
                .any(|b| !b.is_ascii_whitespace())
        {
            return Err(self.error("the body ended before the list did"));
        }
        match &self.metadata {
            None => Ok(ListMeta::default()),
            Some(raw) => serde_json::from_slice::<Option<ListMeta>>(raw)
                .map(Option::unwrap_or_default)
                .map_err(|e| format!("metadata: {e}")),
        }
    }

    /// Moves past one structural byte to `next`.
    fn step(&mut self, next: At) {
        self.pos += 1;
        self.consumed = self.pos;
        self.at = next;
    }

    /// Drops what was handed out or skipped, so `buf` holds only the value being read and
    /// what follows it.
    fn compact(&mut self) {
        if self.consumed > 0 {
            self.buf.drain(..self.consumed);
            self.pos -= self.consumed;
            if self.value.started {
                self.value.start = self.value.start.saturating_sub(self.consumed);
            }
            self.dropped += self.consumed;
            self.consumed = 0;
        }
    }

    /// Scans the value in `self.value` on from `self.pos`; its end (exclusive) once
    /// complete, `None` when the bytes so far end inside it.
    fn scan(&mut self) -> Option<usize> {
        let v = &mut self.value;
        while let Some(&b) = self.buf.get(self.pos) {
            if !v.started && b.is_ascii_whitespace() {
                self.pos += 1;
                continue;
            }
            if !v.started {
                v.start = self.pos;
                v.started = true;
                match b {
                    b'{' | b'[' => v.depth = 1,
                    b'"' => v.in_string = true,
                    _ => v.scalar = true,
                }
                self.pos += 1;
                continue;
            }
            if v.in_string {
                if v.escaped {
                    v.escaped = false;
                } else if b == b'\\' {
                    v.escaped = true;
                } else if b == b'"' {
                    v.in_string = false;
                    if v.depth == 0 {
                        self.pos += 1;
                        return Some(self.pos);
                    }
                }
            } else if v.scalar {
                if matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\r' | b'\n') {
                    return Some(self.pos);
                }
            } else {
                match b {
                    b'"' => v.in_string = true,
                    b'{' | b'[' => v.depth += 1,
                    b'}' | b']' => {
                        v.depth -= 1;
                        if v.depth == 0 {
                            self.pos += 1;
                            return Some(self.pos);
                        }
                    }
                    _ => {}
                }
            }
            self.pos += 1;
        }
        None
    }

    /// `what` at the current offset of the body, with an excerpt from there.
    fn error(&self, what: &str) -> String {
        format!(
            "{what} at byte {} of the list page: {}",
            self.dropped + self.pos,
            excerpt(&self.buf[self.pos.min(self.buf.len())..])
        )
    }
}

/// The end (exclusive) of the JSON string starting at `start` (its `"`), `None` when `buf`
/// ends inside it.
fn string_end(buf: &[u8], start: usize) -> Option<usize> {
    let mut escaped = false;
    for (i, &b) in buf.iter().enumerate().skip(start + 1) {
        match (escaped, b) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => return Some(i + 1),
            _ => {}
        }
    }
    None
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

/// Decodes a list page whole (the [`PageSplitter`]'s reference).
///
/// # Errors
/// [`DecodeError`] when the body is not a list.
#[cfg(test)]
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

    /// The items and metadata of `body` through a [`PageSplitter`] fed `chunk` bytes at a
    /// time.
    fn split(body: &[u8], chunk: usize) -> Result<(Vec<String>, ListMeta), String> {
        let mut s = PageSplitter::default();
        let mut items = Vec::new();
        for part in body.chunks(chunk.max(1)) {
            s.push(part);
            while let Some(r) = s.next()? {
                items.push(String::from_utf8(s.item(r).to_vec()).map_err(|e| e.to_string())?);
            }
        }
        Ok((items, s.finish()?))
    }

    #[test]
    fn a_page_split_as_it_arrives_has_the_items_and_metadata_of_the_whole_page() {
        let pages = [
            // Built-in list order, and a custom resource's (keys sorted: metadata last).
            r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"c1"},"items":[{"metadata":{"name":"a"},"x":"}]\"{["},{"metadata":{"name":"b"},"n":[1,[2,{"y":null}]],"t":true}]}"#,
            r#"{"apiVersion":"example.com/v1","items":[{"metadata":{"name":"a"}}],"kind":"WidgetList","metadata":{"continue":"","resourceVersion":"7"}}"#,
            "{ \"kind\" : \"PodList\" ,\n \"metadata\" : { \"resourceVersion\" : \"9\" } ,\n \"items\" : [ { \"a\" : 1 } ,\n { \"b\" : \"\\u00e9\\\\\" } ] }\n",
            r#"{"kind":"PodList","metadata":{"resourceVersion":"3"},"items":null}"#,
            r#"{"kind":"PodList","metadata":{"resourceVersion":"3"},"items":[]}"#,
            r#"{"kind":"PodList","metadata":{"resourceVersion":"3"}}"#,
            r#"{}"#,
        ];
        for page in pages {
            let whole = list_page(page.as_bytes()).unwrap();
            let want: Vec<String> = whole.items.iter().map(|i| i.get().to_owned()).collect();
            for chunk in [1, 2, 3, 7, 64, page.len()] {
                let (items, meta) = split(page.as_bytes(), chunk)
                    .unwrap_or_else(|e| panic!("{page} in chunks of {chunk}: {e}"));
                assert_eq!(items, want, "{page} in chunks of {chunk}");
                assert_eq!(meta.resource_version, whole.metadata.resource_version);
                assert_eq!(meta.next_page(), whole.metadata.next_page());
            }
        }
    }

    #[test]
    fn a_page_that_is_cut_or_not_a_list_is_an_error_naming_where() {
        for (page, want) in [
            (
                r#"{"kind":"PodList","items":[{"a":1},{"b":"#,
                "the body ended before the list did",
            ),
            (
                r#"{"kind":"PodList","items":[{"a":1}]"#,
                "the body ended before the list did",
            ),
            (r#"[{"a":1}]"#, "unexpected '['"),
            (r#"{"items":[{"a":1},]}"#, "unexpected ']'"),
            (r#"{"items":"no"}"#, "unexpected '\"'"),
            (r#"{"items":nothing}"#, "items is neither an array nor null"),
            (
                r#"{"metadata":{"resourceVersion":5},"items":[]}"#,
                "metadata:",
            ),
        ] {
            let got = split(page.as_bytes(), 3).map(|_| ()).unwrap_err();
            assert!(got.contains(want), "{page}: {got}");
        }
    }

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
