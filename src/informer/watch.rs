//! The HTTP side of one watch: list-page and watch requests over kube's client, the watch
//! body split into event lines, and every failure classified into a [`WatchFailure`] the informer
//! can act on (relist, back off, honour `Retry-After`, re-watch).
//!
//! Requests follow the API concepts
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/>): paged lists with `limit`
//! and `continue`, then a watch from the list's resourceVersion with
//! `allowWatchBookmarks=true` and `timeoutSeconds`; or a streaming list (KEP-3157,
//! <https://github.com/kubernetes/enhancements/tree/master/keps/sig-api-machinery/3157-watch-list>):
//! one watch with `sendInitialEvents=true&resourceVersionMatch=NotOlderThan` and
//! `resourceVersion` unset (a consistent read). In metadata mode all ask for
//! `PartialObjectMetadata`, so only metadata crosses the wire, in protobuf where the server
//! offers it (`protobuf.rs`; `watch.encoding`), read back as the JSON the server would have
//! sent. Every request first takes a token from its cluster's budget ([`ClusterApi`]).
//!
//! This module decides nothing about objects and never retries: the informer does.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use kube::api::{ApiResource, DynamicObject, ListParams, VersionMatch, WatchParams};
use kube::core::Request;
use kube::Client;

use super::api::{ClusterApi, Verb};
use super::decode::{self, DecodeError, Status};
use super::plan::WatchPlan;
use super::protobuf;
use crate::config::{PayloadMode, WireEncoding};

/// The `timeoutSeconds` of every watch request: the API server ends the watch after it (and
/// kubesink watches again from the last resourceVersion). kube-runtime and client-go use
/// values around 5 minutes too.
pub const WATCH_TIMEOUT_SECS: u32 = 290;

/// At most this many bytes of an error response are read (a `Status` is small; a proxy's
/// error page need not be read whole).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The longest watch event line accepted (a line is one object; Kubernetes objects are
/// limited to ~1.5 MiB by etcd, custom servers may send more): a body that never sends a
/// newline must not grow memory without bound.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// Why a list or watch request did not give what was asked.
#[derive(Debug)]
pub enum WatchFailure {
    /// The resourceVersion or continue token is too old (410 Gone / `Expired`): relist.
    Gone(Status),
    /// The API server answered an error status (401, 403, 404, 429, 5xx...).
    Api {
        /// The `Status` (reconstructed from the HTTP status when the body is not one).
        status: Status,
        /// The `Retry-After` header, when given.
        retry_after: Option<Duration>,
    },
    /// No connection, or the connection broke (refused, reset, TLS, too many open files).
    Transport(String),
    /// A response that does not decode.
    Decode(DecodeError),
    /// Neither an event nor a bookmark arrived for this long: the watch is presumed dead.
    Idle(Duration),
    /// The request could not be built (an invalid selector).
    Request(String),
    /// A streaming list the server does not serve: it refused it (`400`, `422`...), or it
    /// ignores `sendInitialEvents` (an event other than ADDED, or a plain BOOKMARK, before
    /// the initial-events-end bookmark). The reason, in words.
    NoStreaming(String),
    /// A streaming list's watch ended before the initial-events-end bookmark.
    InitialEventsCut {
        /// Initial events received before the end.
        events: u64,
        /// How long after the request it ended.
        elapsed: Duration,
    },
}

impl fmt::Display for WatchFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchFailure::Gone(s) => write!(f, "resourceVersion expired ({s})"),
            WatchFailure::Api { status, .. } => write!(f, "{status}"),
            WatchFailure::Transport(cause) => write!(f, "{cause}"),
            WatchFailure::Decode(e) => write!(f, "{e}"),
            WatchFailure::Idle(d) => write!(
                f,
                "no event or bookmark for {}",
                humantime::format_duration(*d)
            ),
            WatchFailure::Request(e) => write!(f, "invalid request: {e}"),
            WatchFailure::NoStreaming(why) => write!(f, "no streaming list: {why}"),
            WatchFailure::InitialEventsCut { events, elapsed } => write!(
                f,
                "the streaming list ended after {events} initial events and {}, before the \
                 initial-events-end bookmark",
                humantime::format_duration(Duration::from_millis(
                    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
                ))
            ),
        }
    }
}

impl WatchFailure {
    /// The failure an `ERROR` watch event reports: 410 `Expired` is [`WatchFailure::Gone`],
    /// any other status [`WatchFailure::Api`] (an event carries no `Retry-After`).
    pub fn from_error_event(status: Status) -> Self {
        if status.code == 410 {
            WatchFailure::Gone(status)
        } else {
            WatchFailure::Api {
                status,
                retry_after: None,
            }
        }
    }

    /// The HTTP status, when the API server answered one.
    pub fn code(&self) -> Option<u16> {
        match self {
            WatchFailure::Gone(s) | WatchFailure::Api { status: s, .. } => Some(s.code),
            _ => None,
        }
    }
}

/// The requests of one [`WatchPlan`].
#[derive(Clone)]
pub struct Requests {
    client: Client,
    api: Arc<ClusterApi>,
    request: Request,
    metadata: bool,
    /// Metadata is asked for in protobuf first (`watch.encoding = "auto"`).
    protobuf: bool,
    list: ListParams,
    watch: WatchParams,
    /// The resource has a label or field selector: a DELETED may be an object that stopped
    /// matching it ([`Requests::still_there`]).
    selective: bool,
    /// The selectors in words (`label selector "a=b", field selector "…"`), for errors.
    selectors: String,
    /// The plan's shard: its `shardSelector` goes on every request (`shard.rs`).
    shard: Option<super::Shard>,
}

impl Requests {
    /// Requests for `plan` through `client`, within the cluster's budget `api`, metadata in
    /// the `encoding` asked for.
    pub fn new(
        plan: &WatchPlan,
        client: Client,
        api: Arc<ClusterApi>,
        encoding: WireEncoding,
    ) -> Self {
        let path = <DynamicObject as kube::Resource>::url_path(
            &plan.api_resource as &ApiResource,
            plan.namespace.as_deref(),
        );
        let mut list = ListParams::default().limit(plan.page_size);
        // kubesink handles 429/5xx itself (counted, logged once, Retry-After honoured).
        let mut watch = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
        if let Some(l) = &plan.label_selector {
            list = list.labels(l);
            watch = watch.labels(l);
        }
        if let Some(f) = &plan.field_selector {
            list = list.fields(f);
            watch = watch.fields(f);
        }
        Requests {
            client,
            api,
            request: Request::new(path),
            metadata: plan.mode == PayloadMode::Metadata,
            protobuf: plan.mode == PayloadMode::Metadata && encoding == WireEncoding::Auto,
            list,
            watch,
            selective: plan.label_selector.is_some() || plan.field_selector.is_some(),
            selectors: [
                plan.label_selector
                    .as_ref()
                    .map(|l| format!("label selector {l:?}")),
                plan.field_selector
                    .as_ref()
                    .map(|f| format!("field selector {f:?}")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" or "),
            shard: plan.shard,
        }
    }

    /// The client the requests go through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// When `status` is the API server rejecting this resource's label or field selector (a
    /// 400 that does not speak of the streaming list's parameters, to a request carrying a
    /// selector): that, in words, naming the selector. A 400 or 422 about
    /// `sendInitialEvents` is a server without streaming lists instead.
    pub fn selector_rejected(&self, status: &Status) -> Option<String> {
        const STREAMING: [&str; 4] = [
            "sendinitialevents",
            "resourceversionmatch",
            "watchlist",
            "allowwatchbookmarks",
        ];
        let message = status.message.to_ascii_lowercase();
        let streaming = STREAMING.iter().any(|p| message.contains(p));
        (status.code == 400 && self.selective && !streaming).then(|| {
            format!(
                "{} rejected by the API server: {}",
                self.selectors, status.message
            )
        })
    }

    /// Whether the object of a watch DELETED is still in the cluster with the same uid, so
    /// that it stopped matching the resource's selectors rather than went away: the API
    /// server's watch sends both as DELETED (`k8s.io/apiserver` cacher,
    /// `convertToWatchEvent`: an object whose new state fails the filter is sent as DELETED
    /// with its previous content). One LIST of that name, `fieldSelector=metadata.name=…`
    /// (and `metadata.namespace`, fields every resource supports), without the resource's
    /// selectors, `limit=1`, a consistent read (newer than the event); it needs only the
    /// `list` the informer has, and goes through the cluster's budget.
    ///
    /// `None` when the resource has no selector (a DELETED is then a delete) or the answer
    /// did not come (error, undecodable body): the `deleted` then carries no reason.
    pub async fn still_there(
        &self,
        namespace: Option<&str>,
        name: &str,
        uid: &str,
        idle_timeout: Duration,
    ) -> Option<bool> {
        if !self.selective || uid.is_empty() {
            return None;
        }
        let mut fields = format!("metadata.name={name}");
        if let Some(ns) = namespace {
            fields.push_str(&format!(",metadata.namespace={ns}"));
        }
        let lp = ListParams::default().limit(1).fields(&fields);
        let bytes = match self.list_whole(&lp, idle_timeout).await {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(name, error = %e, "could not tell whether a deleted object left the selector");
                return None;
            }
        };
        #[derive(serde::Deserialize)]
        struct List {
            #[serde(default)]
            items: Vec<Item>,
        }
        #[derive(serde::Deserialize)]
        struct Item {
            metadata: Meta,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(default)]
            uid: String,
        }
        let list: List = serde_json::from_slice(&bytes).ok()?;
        Some(list.items.iter().any(|i| i.metadata.uid == uid))
    }

    /// One list page (`continue_token` for the pages after the first), read item by item as
    /// it arrives ([`PageItems`]): the page is never held whole. A body that stalls (no byte
    /// for `idle_timeout`) fails as [`WatchFailure::Idle`].
    ///
    /// # Errors
    /// [`WatchFailure`] for any error status (410 as [`WatchFailure::Gone`]), transport failure or
    /// stall before the body starts.
    pub async fn list_page_items(
        &self,
        continue_token: Option<&str>,
        idle_timeout: Duration,
    ) -> Result<PageItems, WatchFailure> {
        let mut lp = self.list.clone();
        lp.continue_token = continue_token.map(str::to_owned);
        let (body, wire) = self.list_request(&lp).await?;
        let mut split = decode::PageSplitter::default();
        let body = match wire {
            Wire::Json => Some(body),
            // A protobuf list is one message: decoded whole, then split as JSON.
            Wire::Protobuf => {
                split.push(&whole_json(body, wire, idle_timeout).await?);
                None
            }
        };
        Ok(PageItems {
            body,
            idle_timeout,
            split,
        })
    }

    /// Whether the server still holds `resource_version`: a one-item list at exactly it
    /// (`resourceVersionMatch=Exact`), read whole and dropped.
    ///
    /// # Errors
    /// [`WatchFailure::Gone`] when it no longer does (410: etcd compacted it); any other
    /// [`WatchFailure`] when the question could not be asked.
    pub async fn holds(
        &self,
        resource_version: &str,
        idle_timeout: Duration,
    ) -> Result<(), WatchFailure> {
        let lp = self
            .list
            .clone()
            .limit(1)
            .at(resource_version)
            .matching(VersionMatch::Exact);
        // Read to its end, so that the connection serves the next request.
        self.list_whole(&lp, idle_timeout).await.map(drop)
    }

    /// One LIST with `lp`, read whole (a protobuf answer as the JSON list it stands for).
    async fn list_whole(
        &self,
        lp: &ListParams,
        idle_timeout: Duration,
    ) -> Result<Bytes, WatchFailure> {
        let (body, wire) = self.list_request(lp).await?;
        whole_json(body, wire, idle_timeout).await.map(Bytes::from)
    }

    /// Sends one LIST with `lp`, for the whole objects or their metadata as the payload mode
    /// asks: the body of a success and the encoding the server chose.
    async fn list_request(
        &self,
        lp: &ListParams,
    ) -> Result<(kube::client::Body, Wire), WatchFailure> {
        let mut req = if self.metadata {
            self.request.list_metadata(lp)
        } else {
            self.request.list(lp)
        }
        .map_err(|e| WatchFailure::Request(e.to_string()))?;
        self.ask_protobuf(&mut req, protobuf::ACCEPT_LIST);
        self.send(req, Verb::List).await
    }

    /// A watch from `resource_version`, as a stream of event lines.
    ///
    /// # Errors
    /// [`WatchFailure`] for any error status (410 as [`WatchFailure::Gone`]) or transport failure.
    pub async fn watch(
        &self,
        resource_version: &str,
        idle_timeout: Duration,
    ) -> Result<Lines, WatchFailure> {
        let req = self.watch_request(&self.watch, resource_version)?;
        let (body, wire) = self.send(req, Verb::Watch).await?;
        Ok(Lines::new(body, wire, idle_timeout))
    }

    /// A watch request with `params` from `resource_version` ("" for none), for the whole
    /// objects or their metadata as the payload mode asks.
    fn watch_request(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> Result<http::Request<Vec<u8>>, WatchFailure> {
        let mut req = if self.metadata {
            self.request.watch_metadata(params, resource_version)
        } else {
            self.request.watch(params, resource_version)
        }
        .map_err(|e| WatchFailure::Request(e.to_string()))?;
        self.ask_protobuf(&mut req, protobuf::ACCEPT_WATCH);
        Ok(req)
    }

    /// Sets `req`'s `Accept` to `accept` (protobuf first, JSON after it) when metadata is
    /// read in protobuf; else leaves kube's JSON `Accept`.
    fn ask_protobuf(&self, req: &mut http::Request<Vec<u8>>, accept: &'static str) {
        if self.protobuf {
            req.headers_mut()
                .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
        }
    }

    /// A streaming list: a watch that first sends the current state as ADDED events and
    /// ends it with a BOOKMARK annotated `k8s.io/initial-events-end: "true"`, then goes on
    /// as a watch from there. `resourceVersion` is left unset, so the state is a consistent
    /// read (the API server serves it from its watch cache once that is as fresh as etcd).
    ///
    /// `still_wanted` is asked once the cluster's budget gave the request its turn (the wait
    /// can be long, and another watch of the resource may have found the server without
    /// streaming lists meanwhile): when it says no, nothing is sent.
    ///
    /// # Errors
    /// As [`Requests::watch`]; a server without streaming lists answers an error status
    /// (422 `Invalid` when its `WatchList` feature gate is off); [`WatchFailure::NoStreaming`]
    /// when `still_wanted` said no.
    pub async fn stream(
        &self,
        idle_timeout: Duration,
        still_wanted: impl FnOnce() -> Result<(), String>,
    ) -> Result<Lines, WatchFailure> {
        let req = self.watch_request(&self.watch.clone().initial_events(), "")?;
        self.api.wait_turn().await;
        still_wanted().map_err(WatchFailure::NoStreaming)?;
        let (body, wire) = self.send_now(req, Verb::Watch).await?;
        Ok(Lines::new(body, wire, idle_timeout))
    }

    /// Sends `req` once the cluster's budget has a token for it.
    async fn send(
        &self,
        req: http::Request<Vec<u8>>,
        verb: Verb,
    ) -> Result<(kube::client::Body, Wire), WatchFailure> {
        self.api.wait_turn().await;
        self.send_now(req, verb).await
    }

    /// Sends `req`, whose turn in the budget came: the body of a success and the encoding
    /// the server chose for it (its `Content-Type`).
    async fn send_now(
        &self,
        req: http::Request<Vec<u8>>,
        verb: Verb,
    ) -> Result<(kube::client::Body, Wire), WatchFailure> {
        self.api.count(verb);
        let (mut parts, body) = req.into_parts();
        if let Some(shard) = &self.shard {
            parts.uri = shard.on(&parts.uri).map_err(WatchFailure::Request)?;
        }
        // A watch is a stream of small events; compression would only add latency (and
        // kube's decompression handles only one gzip member per body).
        parts.headers.insert(
            http::header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
        let req = http::Request::from_parts(parts, kube::client::Body::from(body));
        let res = self
            .client
            .send(req)
            .await
            .map_err(|e| WatchFailure::Transport(cause(&e)))?;
        let code = res.status();
        let wire = if protobuf::is_protobuf(res.headers().get(http::header::CONTENT_TYPE)) {
            Wire::Protobuf
        } else {
            Wire::Json
        };
        if code.is_success() {
            if wire == Wire::Protobuf {
                self.api.note_protobuf();
            }
            return Ok((res.into_body(), wire));
        }
        let retry_after = res
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = read_limited(res.into_body(), MAX_ERROR_BODY).await;
        let decoded = match wire {
            Wire::Protobuf => protobuf::status(&body),
            Wire::Json => Status::from_body(&body),
        };
        let status = decoded.unwrap_or_else(|| Status {
            code: code.as_u16(),
            reason: code.canonical_reason().unwrap_or("").to_owned(),
            message: super::decode::excerpt(&body),
        });
        let status = Status {
            code: code.as_u16(),
            ..status
        };
        if code == http::StatusCode::GONE {
            return Err(WatchFailure::Gone(status));
        }
        Err(WatchFailure::Api {
            status,
            retry_after,
        })
    }
}

/// A list page read item by item as its bytes arrive (see [`decode::PageSplitter`]).
pub struct PageItems {
    /// The response body; `None` once it ended.
    body: Option<kube::client::Body>,
    idle_timeout: Duration,
    split: decode::PageSplitter,
}

impl PageItems {
    /// The next item of the page (raw JSON), `None` after the last one.
    ///
    /// # Errors
    /// [`WatchFailure::Idle`] when no byte came for the idle timeout,
    /// [`WatchFailure::Transport`] when the body broke off, [`WatchFailure::Decode`] when the
    /// page is not a list (or an item not UTF-8).
    pub async fn next_item(&mut self) -> Result<Option<&str>, WatchFailure> {
        let undecodable = |e: &dyn std::fmt::Display, at: &[u8]| {
            WatchFailure::Decode(decode::DecodeError::new("list page", e, at))
        };
        let range = loop {
            match self.split.next() {
                Ok(Some(range)) => break range,
                Ok(None) if self.body.is_none() => {
                    return match self.split.done() {
                        true => Ok(None),
                        false => Err(undecodable(&"the body ended before the list did", b"")),
                    }
                }
                Ok(None) => self.read_more().await?,
                Err(e) => return Err(undecodable(&e, b"")),
            }
        };
        let item = self.split.item(range);
        std::str::from_utf8(item)
            .map(Some)
            .map_err(|e| undecodable(&e, item))
    }

    /// The list's metadata (its resourceVersion and continue token), after the last item.
    ///
    /// # Errors
    /// [`WatchFailure::Decode`] when the page did not end as a list.
    pub fn metadata(&self) -> Result<decode::ListMeta, WatchFailure> {
        self.split
            .finish()
            .map_err(|e| WatchFailure::Decode(decode::DecodeError::new("list page", &e, b"")))
    }

    /// Reads the next chunk of the body into the splitter (or notes that it ended).
    async fn read_more(&mut self) -> Result<(), WatchFailure> {
        let Some(body) = &mut self.body else {
            return Ok(());
        };
        match next_data(body, self.idle_timeout).await? {
            Some(data) => self.split.push(&data),
            None => self.body = None,
        }
        Ok(())
    }
}

/// All of a list response's `body` in `wire` (each piece waited for at most
/// `idle_timeout`), as JSON: a protobuf list as the JSON list it stands for.
///
/// # Errors
/// As [`next_data`]; [`WatchFailure::Decode`] when a protobuf body is not a list.
async fn whole_json(
    mut body: kube::client::Body,
    wire: Wire,
    idle_timeout: Duration,
) -> Result<Vec<u8>, WatchFailure> {
    let mut out = Vec::new();
    while let Some(data) = next_data(&mut body, idle_timeout).await? {
        out.extend_from_slice(&data);
    }
    match wire {
        Wire::Json => Ok(out),
        Wire::Protobuf => protobuf::list_to_json(&out).map_err(WatchFailure::Decode),
    }
}

/// The next piece of `body`'s data, waited for at most `idle_timeout`: `None` once the body
/// ended (a frame without data, trailers, is an empty piece).
///
/// # Errors
/// [`WatchFailure::Idle`] when nothing came in time, [`WatchFailure::Transport`] when the
/// body broke off.
async fn next_data(
    body: &mut kube::client::Body,
    idle_timeout: Duration,
) -> Result<Option<Bytes>, WatchFailure> {
    match tokio::time::timeout(idle_timeout, body.frame()).await {
        Err(_) => Err(WatchFailure::Idle(idle_timeout)),
        Ok(None) => Ok(None),
        Ok(Some(Err(e))) => Err(WatchFailure::Transport(cause(&e))),
        Ok(Some(Ok(frame))) => Ok(Some(frame.into_data().unwrap_or_default())),
    }
}

/// Reads at most `limit` bytes of a body (errors end the read).
async fn read_limited(mut body: kube::client::Body, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let take = data.len().min(limit - out.len());
                    out.extend_from_slice(&data[..take]);
                }
            }
            _ => break,
        }
    }
    out
}

/// `EMFILE`: the process reached its open-files limit (`RLIMIT_NOFILE`); the same number on
/// Linux and the BSDs.
const EMFILE: i32 = 24;
/// `ENFILE`: the system-wide open-files table is full.
const ENFILE: i32 = 23;

/// The cause of a transport error in words: the innermost error's message (`Connection
/// refused`), prefixed by kube's description (`client error (Connect)`). Running out of file
/// descriptors is named plainly, with what to do, since every open watch holds a connection
/// (HTTP/1.1: one TCP connection per watch).
pub fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost: &(dyn std::error::Error + 'static) = e;
    let mut os_error = None;
    loop {
        if let Some(io) = innermost.downcast_ref::<std::io::Error>() {
            os_error = os_error.or(io.raw_os_error());
        }
        match innermost.source() {
            Some(next) => innermost = next,
            None => break,
        }
    }
    let top = e.to_string();
    let inner = innermost.to_string();
    let text = if top.contains(&inner) {
        top
    } else {
        format!("{top}: {inner}")
    };
    match os_error {
        Some(EMFILE) => format!(
            "too many open files (EMFILE: the process's open-files limit is reached; each open \
             watch holds a connection: raise the limit or watch fewer namespaces): {text}"
        ),
        Some(ENFILE) => {
            format!(
                "too many open files in the system (ENFILE: the kernel's table is full): {text}"
            )
        }
        _ => text,
    }
}

/// How a response body is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// JSON: a watch is newline-delimited event lines.
    Json,
    /// Protobuf (`protobuf.rs`): a watch is length-prefixed `WatchEvent` frames.
    Protobuf,
}

/// A watch response body split into event lines (protobuf frames read back as the JSON
/// lines the server would have sent).
pub struct Lines {
    body: kube::client::Body,
    wire: Wire,
    buf: BytesMut,
    /// How much of `buf` is known to hold no newline: a line that spans many frames (a
    /// multi-MiB object) is scanned once, not once per frame.
    searched: usize,
    idle_timeout: Duration,
    ended: bool,
    /// When the last piece of the body was read: the arrival of every line it completed
    /// (more is read only once no complete line is left, so the line handed out next ends
    /// in that piece).
    arrived: std::time::SystemTime,
}

impl Lines {
    /// The lines of a watch response `body` encoded as `wire`, `idle_timeout` of silence
    /// allowed.
    fn new(body: kube::client::Body, wire: Wire, idle_timeout: Duration) -> Self {
        Lines {
            body,
            wire,
            buf: BytesMut::new(),
            searched: 0,
            idle_timeout,
            ended: false,
            arrived: std::time::SystemTime::now(),
        }
    }

    /// When the line last handed out arrived: the time the piece of the body that completed
    /// it was read (`emit.rs` logs it beside `observedAt` at DEBUG, target
    /// `kubesink::arrival`, so the time an event spends in kubesink can be told from the time
    /// it took to reach it).
    pub fn arrived(&self) -> std::time::SystemTime {
        self.arrived
    }

    /// From now on, `idle_timeout` of silence is [`WatchFailure::Idle`] (a streaming list
    /// has a shorter bound during its initial events than the watch it goes on as).
    pub fn set_idle_timeout(&mut self, idle_timeout: Duration) {
        self.idle_timeout = idle_timeout;
    }

    /// The next complete line (without its newline); `None` when the server ended the
    /// watch. A last line without newline is returned too (it may be cut; decoding says).
    ///
    /// # Errors
    /// [`WatchFailure::Idle`] when nothing arrived for the idle timeout, [`WatchFailure::Transport`]
    /// when the connection broke, [`WatchFailure::Decode`] for a line over [`MAX_LINE_BYTES`].
    pub async fn next_line(&mut self) -> Result<Option<Bytes>, WatchFailure> {
        if self.wire == Wire::Protobuf {
            return self.next_frame().await;
        }
        loop {
            let unsearched = self.buf.get(self.searched..).unwrap_or_default();
            if let Some(i) = memchr::memchr(b'\n', unsearched) {
                let i = self.searched + i;
                self.searched = 0;
                let mut line = self.buf.split_to(i + 1);
                line.truncate(i);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line.freeze()));
            }
            self.searched = self.buf.len();
            if self.ended {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                self.searched = 0;
                return Ok(Some(self.buf.split().freeze()));
            }
            if self.buf.len() > MAX_LINE_BYTES {
                return Err(WatchFailure::Decode(DecodeError {
                    what: "watch event",
                    reason: format!("no newline within {MAX_LINE_BYTES} bytes"),
                    excerpt: super::decode::excerpt(&self.buf),
                }));
            }
            if self.buf.is_empty() {
                // Every line read was handed out: give the buffer back before a wait that may
                // last minutes on a quiet watch (what a burst grew, a streaming list's 64 KiB
                // writes, would otherwise stay for the life of the watch). Its capacity says
                // nothing of the allocation behind it (what is left after the lines split
                // off, often 0), so it is dropped whatever it says; a busy stream pays one
                // allocation per frame.
                self.buf = BytesMut::new();
                self.searched = 0;
            }
            self.read_more().await?;
        }
    }

    /// The next protobuf frame, as the JSON line it stands for; `None` when the server
    /// ended the watch between frames.
    ///
    /// # Errors
    /// As [`Lines::next_line`]; [`WatchFailure::Decode`] for a frame that is not a watch
    /// event, or a watch that ended inside a frame.
    async fn next_frame(&mut self) -> Result<Option<Bytes>, WatchFailure> {
        loop {
            if let Some(len) = protobuf::frame_len(&self.buf) {
                if len > MAX_LINE_BYTES {
                    return Err(WatchFailure::Decode(DecodeError {
                        what: "watch event",
                        reason: format!(
                            "a protobuf frame of {len} bytes, over the limit of {MAX_LINE_BYTES}"
                        ),
                        excerpt: super::decode::excerpt(&self.buf),
                    }));
                }
                if self.buf.len() >= 4 + len {
                    let frame = self.buf.split_to(4 + len);
                    let line =
                        protobuf::event_to_json(&frame[4..]).map_err(WatchFailure::Decode)?;
                    return Ok(Some(Bytes::from(line)));
                }
            }
            if self.ended {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(WatchFailure::Decode(DecodeError {
                    what: "watch event",
                    reason: format!(
                        "the watch ended inside a protobuf frame ({} bytes of it)",
                        self.buf.len()
                    ),
                    excerpt: String::new(),
                }));
            }
            if self.buf.is_empty() {
                // As in next_line: no buffer kept over a quiet watch.
                self.buf = BytesMut::new();
            }
            self.read_more().await?;
        }
    }

    /// Waits for the next piece of the body (at most the idle timeout) and appends it;
    /// marks the end of the body.
    async fn read_more(&mut self) -> Result<(), WatchFailure> {
        match next_data(&mut self.body, self.idle_timeout).await? {
            None => self.ended = true,
            Some(data) if data.is_empty() => {}
            Some(data) => {
                self.buf.extend_from_slice(&data);
                self.arrived = std::time::SystemTime::now();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a source, as hyper's and kube's errors nest.
    #[derive(Debug)]
    struct Wrapped(&'static str, std::io::Error);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }

    fn lines_of(body: &[u8]) -> Lines {
        Lines::new(
            kube::client::Body::from(body.to_vec()),
            Wire::Json,
            Duration::from_secs(5),
        )
    }

    #[tokio::test]
    async fn lines_skip_blank_ones_return_a_last_unterminated_one_and_then_end_for_good() {
        let mut lines = lines_of(b"{\"a\":1}\n\n  \r\n{\"b\":2}\n{\"c\":");
        let mut got = Vec::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            got.push(String::from_utf8(line.to_vec()).unwrap());
        }
        assert_eq!(got, ["{\"a\":1}", "{\"b\":2}", "{\"c\":"]);
        // Asked again after the end: still the end (no panic on the scan position).
        assert!(lines.next_line().await.unwrap().is_none());
        assert!(lines.next_line().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_line_longer_than_the_limit_is_a_decode_failure() {
        let mut lines = lines_of(&vec![b'x'; MAX_LINE_BYTES + 2]);
        let err = lines.next_line().await.err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("no newline within")));
    }

    #[test]
    fn running_out_of_file_descriptors_is_named() {
        let e = Wrapped(
            "client error (Connect)",
            std::io::Error::from_raw_os_error(EMFILE),
        );
        let text = cause(&e);
        assert!(text.starts_with("too many open files (EMFILE"), "{text}");
        assert!(text.contains("client error (Connect)"), "{text}");
        let refused = Wrapped(
            "client error (Connect)",
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        );
        assert_eq!(
            cause(&refused),
            "client error (Connect): connection refused"
        );
    }
}
