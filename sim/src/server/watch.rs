//! Watch streams (`?watch=true`), per the API concepts' "Efficient detection of changes"
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>):
//! newline-delimited `{"type":…,"object":…}` events; `resourceVersion` unset/"0" starts with
//! synthetic ADDED events for current objects; a compacted version answers one 410 ERROR event;
//! `allowWatchBookmarks` adds periodic BOOKMARKs; `sendInitialEvents=true` ends the initial
//! ADDED events with a BOOKMARK annotated `k8s.io/initial-events-end: "true"`; selectors apply
//! to events (an object that stops matching is sent as DELETED). The body is a lazily polled
//! stream: nothing is produced while the client is not reading, and a watcher that lags more
//! than the live channel holds is closed. This module never writes to the store.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use super::{json_response_stream, render_object, selectors_from_query};
use crate::error::ApiError;
use crate::resources::{ResourceKey, ResourceType};
use crate::selector::Selectors;
use crate::store::{Event, EventType, PageRequest, StoredObject};
use crate::Inner;

enum Item {
    Object(&'static str, Arc<StoredObject>),
    Live(Arc<Event>),
    InitialEnd(u64),
    Error(Value),
}

struct OpenWatch(Arc<Inner>);

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::Relaxed);
    }
}

struct WatchStream {
    guard: OpenWatch,
    rt: Arc<ResourceType>,
    key: ResourceKey,
    namespace: Option<String>,
    selectors: Selectors,
    meta_only: bool,
    backlog: VecDeque<Item>,
    rx: Option<broadcast::Receiver<Arc<Event>>>,
    last_rv: u64,
    bookmarks: Option<tokio::time::Interval>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    closed: CancellationToken,
    shutdown: CancellationToken,
    done: bool,
}

fn line(event_type: &str, object: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(event_type.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// Re-serializes `obj` with `metadata.resourceVersion = rv` (for DELETED-by-selector events).
fn restamp(obj: &StoredObject, rv: u64) -> Option<StoredObject> {
    let mut v = obj.to_value().ok()?;
    v.pointer_mut("/metadata")?
        .as_object_mut()?
        .insert("resourceVersion".into(), Value::String(rv.to_string()));
    StoredObject::from_value(&v, rv).ok()
}

impl WatchStream {
    fn visible(&self, o: &StoredObject) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == o.namespace)
            && self.selectors.matches(&o.namespace, &o.name, &o.labels)
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let (kind, api_version) = if self.meta_only {
            (
                "PartialObjectMetadata".to_owned(),
                "meta.k8s.io/v1".to_owned(),
            )
        } else {
            (self.rt.kind.clone(), self.rt.api_version())
        };
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
        line("BOOKMARK", obj.to_string().as_bytes())
    }

    fn render(&self, item: Item) -> Option<Bytes> {
        match item {
            Item::Object(t, o) => Some(line(t, &render_object(&o, self.meta_only))),
            Item::InitialEnd(rv) => Some(self.bookmark(rv, true)),
            Item::Error(status) => Some(line("ERROR", status.to_string().as_bytes())),
            Item::Live(ev) => {
                let now = self.visible(&ev.object);
                let before = ev.prev.as_ref().is_some_and(|p| self.visible(p));
                let (t, obj) = match ev.event_type {
                    EventType::Added if now => ("ADDED", ev.object.clone()),
                    EventType::Deleted if before => ("DELETED", ev.object.clone()),
                    EventType::Modified if now && before => ("MODIFIED", ev.object.clone()),
                    EventType::Modified if now => ("ADDED", ev.object.clone()),
                    EventType::Modified if before => {
                        let prev = ev.prev.as_ref()?;
                        (
                            "DELETED",
                            Arc::new(restamp(prev, ev.rv).unwrap_or_else(|| (**prev).clone())),
                        )
                    }
                    _ => return None,
                };
                Some(line(t, &render_object(&obj, self.meta_only)))
            }
        }
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        loop {
            let expired = self.deadline.as_ref().is_some_and(|d| d.is_elapsed());
            if self.closed.is_cancelled() || self.shutdown.is_cancelled() || expired {
                return None;
            }
            if let Some(item) = self.backlog.pop_front() {
                if matches!(item, Item::Error(_)) {
                    self.done = true;
                }
                match self.render(item) {
                    Some(b) => return Some(b),
                    None => continue,
                }
            }
            let rx = self.rx.as_mut()?;
            let bookmarks = self.bookmarks.as_mut();
            let deadline = self.deadline.as_mut();
            tokio::select! {
                biased;
                _ = self.closed.cancelled() => return None,
                _ = self.shutdown.cancelled() => return None,
                _ = async { match deadline { Some(d) => d.await, None => std::future::pending().await } } => return None,
                received = rx.recv() => match received {
                    Ok(ev) => {
                        if ev.rv <= self.last_rv {
                            continue;
                        }
                        self.last_rv = ev.rv;
                        if ev.resource == self.key {
                            if let Some(b) = self.render(Item::Live(ev)) {
                                return Some(b);
                            }
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::info!(lagged = n, resource = %self.key, "closing watch that fell behind");
                        return None;
                    }
                    Err(RecvError::Closed) => return None,
                },
                _ = async { match bookmarks { Some(i) => { i.tick().await; } None => std::future::pending::<()>().await } } => {
                    return Some(self.bookmark(self.last_rv, false));
                }
            }
        }
    }
}

fn gone(requested: &str, oldest: u64) -> Value {
    ApiError::Expired {
        message: format!("too old resource version: {requested} ({oldest})"),
    }
    .to_status()
}

/// Starts a watch of `rt` (in `namespace`, if any) with the query parameters of the request.
/// Errors: 400 for bad selectors or a non-numeric resourceVersion.
pub fn watch(
    inner: &Arc<Inner>,
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    query: &HashMap<String, String>,
    meta_only: bool,
) -> Result<Response, ApiError> {
    let selectors = selectors_from_query(query)?;
    let flag = |k: &str| query.get(k).map(String::as_str);
    let send_initial = flag("sendInitialEvents") == Some("true");
    let bookmarks_on = flag("allowWatchBookmarks") == Some("true");
    let rv_param = flag("resourceVersion").filter(|s| !s.is_empty());
    let timeout = match flag("timeoutSeconds") {
        Some(t) => Some(
            t.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t}")))?,
        ),
        None => None,
    };
    let requested = match rv_param {
        Some(r) => Some(
            r.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {r}")))?,
        ),
        None => None,
    };
    let key = rt.key();
    let mut backlog = VecDeque::new();
    let (rx, last_rv) = {
        let store = inner.store();
        let rx = store.subscribe();
        let current = store.resource_version();
        let oldest = store.oldest_readable_rv();
        if inner.faults.take_gone_watch() {
            backlog.push_back(Item::Error(gone(rv_param.unwrap_or("0"), current)));
        } else if send_initial
            || requested.unwrap_or(0) == 0 && flag("sendInitialEvents") != Some("false")
        {
            let page = store.page(&PageRequest {
                resource: &key,
                namespace: namespace.as_deref(),
                at_rv: current,
                after: None,
                limit: 0,
                selectors: &selectors,
            });
            backlog.extend(page.items.into_iter().map(|o| Item::Object("ADDED", o)));
            if send_initial {
                backlog.push_back(Item::InitialEnd(current));
            }
        } else if let Some(r) = requested.filter(|r| *r < oldest) {
            backlog.push_back(Item::Error(gone(&r.to_string(), oldest + 1)));
        } else if let Some(r) = requested {
            backlog.extend(store.events_after(&key, r).into_iter().map(Item::Live));
        }
        (rx, current.max(requested.unwrap_or(0)))
    };
    let interval = inner
        .config
        .bookmark_interval
        .max(Duration::from_millis(10));
    inner.open_watches.fetch_add(1, Ordering::Relaxed);
    let state = WatchStream {
        guard: OpenWatch(inner.clone()),
        rt,
        key,
        namespace,
        selectors,
        meta_only,
        backlog,
        rx: Some(rx),
        last_rv,
        bookmarks: bookmarks_on
            .then(|| tokio::time::interval_at(tokio::time::Instant::now() + interval, interval)),
        deadline: timeout.map(|t| Box::pin(tokio::time::sleep(Duration::from_secs(t)))),
        closed: inner.faults.watch_token(),
        shutdown: inner.shutdown.clone(),
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        let chunk = st.next_chunk().await?;
        st.guard.0.watch_events_sent.fetch_add(1, Ordering::Relaxed);
        Some((Ok::<Bytes, Infallible>(chunk), st))
    });
    Ok(json_response_stream(Body::from_stream(stream)))
}
