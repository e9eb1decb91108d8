//! One open watch stream: the state machine that turns the backlog (initial ADDED events,
//! replayed events, a 410 ERROR) and then live store events into newline-delimited
//! `{"type":…,"object":…}` lines, adds BOOKMARKs, applies selectors to events (an object that
//! stops matching is sent as DELETED), and obeys the watch faults: end, go silent, damage
//! the next events, end (or go silent) when the resource's CRD is deleted. Polled lazily:
//! nothing is produced while the client is not reading, and a watcher that lags more than the
//! live channel holds is closed. Never writes to the store.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use crate::faults::WatchControl;
use crate::json;
use crate::resources::{ResourceKey, ResourceType};
use crate::selector::Selectors;
use crate::server::render_object;
use crate::store::{Event, EventType, StoredObject};
use crate::Inner;

/// How many bytes of queued events one write joins at most (Go's HTTP server writes a
/// response in chunks of its buffer; 64 KiB keeps a chunk well under what a client buffers).
const WRITE_BATCH_BYTES: usize = 64 * 1024;

/// One entry of the backlog written before live events.
pub(super) enum Item {
    Object(&'static str, Arc<StoredObject>),
    Live(Arc<Event>),
    InitialEnd(u64),
    Error(Value),
    /// The response body ends here (a streaming list cut before its end bookmark).
    End,
}

/// Counts the stream in `open_watches` and in the fault registry while it lives, and in
/// `streaming_lists` while it is a streaming list before its end bookmark.
pub(super) struct OpenWatch {
    pub inner: Arc<Inner>,
    pub id: u64,
    /// Counted in `streaming_lists` (its end bookmark is not written yet).
    pub initial_pending: bool,
}

impl OpenWatch {
    /// Counts a streaming list in flight (and the peak).
    pub fn start_initial_events(&mut self) {
        if !self.initial_pending {
            self.initial_pending = true;
            let now = self.inner.streaming_lists.fetch_add(1, Ordering::SeqCst) + 1;
            self.inner
                .streaming_lists_peak
                .fetch_max(now, Ordering::SeqCst);
        }
    }

    /// Its initial events ended (the end bookmark is written, or the stream ends).
    fn end_initial_events(&mut self) {
        if self.initial_pending {
            self.initial_pending = false;
            self.inner.streaming_lists.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        if self.initial_pending {
            self.inner
                .streaming_lists_cut
                .fetch_add(1, Ordering::SeqCst);
        }
        self.end_initial_events();
        self.inner.open_watches.fetch_sub(1, Ordering::Relaxed);
        self.inner.faults.unregister_watch(self.id);
    }
}

pub(super) struct WatchStream {
    pub guard: OpenWatch,
    /// The request's URL path, which damage rules match.
    pub path: String,
    pub rt: Arc<ResourceType>,
    pub key: ResourceKey,
    pub namespace: Option<String>,
    pub selectors: Selectors,
    pub meta_only: bool,
    pub backlog: VecDeque<Item>,
    pub rx: Option<broadcast::Receiver<Arc<Event>>>,
    pub last_rv: u64,
    pub bookmarks: Option<tokio::time::Interval>,
    pub deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    pub end: CancellationToken,
    pub silence: CancellationToken,
    pub shutdown: CancellationToken,
    /// Sends nothing more; only `end` or shutdown finish it.
    pub silent: bool,
    /// The end-bookmark hold this streaming list began under
    /// (`Faults::hold_initial_events_end`), taken when the request came: a release lets out
    /// every list begun before it, including one still writing its initial events.
    pub end_hold: Option<CancellationToken>,
    pub done: bool,
}

impl WatchStream {
    pub fn new(
        inner: &Arc<Inner>,
        path: &str,
        rt: Arc<ResourceType>,
        control: WatchControl,
    ) -> Self {
        inner.open_watches.fetch_add(1, Ordering::Relaxed);
        WatchStream {
            guard: OpenWatch {
                inner: inner.clone(),
                id: control.id,
                initial_pending: false,
            },
            path: path.to_owned(),
            key: rt.key(),
            rt,
            namespace: None,
            selectors: Selectors::default(),
            meta_only: false,
            backlog: VecDeque::new(),
            rx: None,
            last_rv: 0,
            bookmarks: None,
            deadline: None,
            end: control.end,
            silence: control.silence,
            shutdown: inner.shutdown.clone(),
            silent: control.silent_from_start,
            end_hold: None,
            done: false,
        }
    }

    fn visible(&self, o: &StoredObject) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == o.namespace)
            && self
                .selectors
                .matches(&o.namespace, &o.name, &o.labels, &o.body)
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
        let mut obj = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
        if !self.meta_only {
            bookmark_zero_fields(&self.rt.kind, &mut obj);
        }
        line("BOOKMARK", obj.to_string().as_bytes())
    }

    /// A real event's line, damaged if a damage rule takes it.
    fn event(&self, event_type: &str, obj: &StoredObject) -> Bytes {
        let intact = line(event_type, &render_object(obj, self.meta_only));
        match self.guard.inner.faults.take_damage(&self.path) {
            Some(kind) => kind.apply(&intact),
            None => intact,
        }
    }

    fn render(&mut self, item: Item) -> Option<Bytes> {
        match item {
            Item::Object(t, o) => Some(self.event(t, &o)),
            Item::InitialEnd(rv) => {
                self.guard.end_initial_events();
                Some(self.bookmark(rv, true))
            }
            Item::Error(status) => Some(line("ERROR", status.to_string().as_bytes())),
            Item::End => None,
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
                Some(self.event(t, &obj))
            }
        }
    }

    /// `first` and the events queued behind it, up to [`WRITE_BATCH_BYTES`], as one chunk:
    /// the API server flushes a watch response only when no event is queued
    /// (`k8s.io/apiserver/pkg/endpoints/handlers/watch.go`: `if len(ch) == 0 {
    /// flusher.Flush() }`), so initial events leave in large writes, not one per event. An
    /// ERROR or the end of the body is never joined.
    fn with_queued_events(&mut self, first: Bytes) -> Bytes {
        if self.done {
            return first;
        }
        let mut chunk: Option<BytesMut> = None;
        let mut len = first.len();
        let held = self.end_hold.as_ref().is_some_and(|t| !t.is_cancelled());
        while len < WRITE_BATCH_BYTES
            && match self.backlog.front() {
                Some(Item::Object(..) | Item::Live(_)) => true,
                Some(Item::InitialEnd(_)) => !held,
                _ => false,
            }
        {
            let Some(item) = self.backlog.pop_front() else {
                break;
            };
            if let Some(b) = self.render(item) {
                let buf = chunk.get_or_insert_with(|| BytesMut::from(&first[..]));
                buf.extend_from_slice(&b);
                len += b.len();
                // The stream counts one event per chunk; these ride along.
                self.guard
                    .inner
                    .watch_events_sent
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        chunk.map_or(first, BytesMut::freeze)
    }

    /// Waits while the end-bookmark hold this list began under is on
    /// (`Faults::hold_initial_events_end`); false when the stream must end meanwhile.
    async fn wait_for_hold(&mut self) -> bool {
        let Some(hold) = self.end_hold.clone() else {
            return true;
        };
        tokio::select! {
            _ = hold.cancelled() => true,
            _ = self.end.cancelled() => false,
            _ = self.shutdown.cancelled() => false,
        }
    }

    /// Waits, sending nothing, until the stream must end.
    async fn stay_silent(&mut self) -> Option<Bytes> {
        tokio::select! {
            _ = self.end.cancelled() => {}
            _ = self.shutdown.cancelled() => {}
        }
        None
    }

    /// The next chunk to write, or None to end the response body.
    pub async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        loop {
            if self.silence.is_cancelled() {
                self.silent = true;
            }
            if self.silent {
                return self.stay_silent().await;
            }
            let expired = self.deadline.as_ref().is_some_and(|d| d.is_elapsed());
            if self.end.is_cancelled() || self.shutdown.is_cancelled() || expired {
                return None;
            }
            if matches!(self.backlog.front(), Some(Item::InitialEnd(_)))
                && !self.wait_for_hold().await
            {
                return None;
            }
            if let Some(item) = self.backlog.pop_front() {
                match item {
                    Item::End => {
                        self.done = true;
                        return None;
                    }
                    Item::Error(_) => self.done = true,
                    _ => {}
                }
                let Some(first) = self.render(item) else {
                    continue;
                };
                return Some(self.with_queued_events(first));
            }
            let rx = self.rx.as_mut()?;
            let bookmarks = self.bookmarks.as_mut();
            let deadline = self.deadline.as_mut();
            tokio::select! {
                biased;
                _ = self.end.cancelled() => return None,
                _ = self.shutdown.cancelled() => return None,
                _ = self.silence.cancelled() => continue,
                _ = async { match deadline { Some(d) => d.await, None => std::future::pending().await } } => return None,
                received = rx.recv() => match received {
                    Ok(ev) if ev.event_type == EventType::ResourceRemoved => {
                        if ev.resource != self.key {
                            continue;
                        }
                        if self.guard.inner.faults.keeps_watches_after_crd_delete() {
                            self.silent = true;
                            continue;
                        }
                        return None;
                    }
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

/// `{"type":"<event_type>","object":<object>}\n`.
pub(super) fn line(event_type: &str, object: &[u8]) -> Bytes {
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
    json::with_stack_for(obj.depth, || {
        let mut v = obj.to_value().ok()?;
        v.pointer_mut("/metadata")?
            .as_object_mut()?
            .insert("resourceVersion".into(), Value::String(rv.to_string()));
        StoredObject::from_value(&v, rv).ok()
    })
}

/// The fields a real kube-apiserver's BOOKMARK object carries beside its metadata: the Go
/// type's zero value, encoded as JSON (fields without `omitempty` stay, as `null` or `0`), so
/// a client that decodes a bookmark as the kind's type meets them. Read off Kubernetes 1.37.2's
/// kube-apiserver (tests/kube), streaming lists of each kind, 2026-12-04; a kind not listed
/// here (ConfigMap, Secret, custom resources) carries metadata only, as there.
fn bookmark_zero_fields(kind: &str, obj: &mut Value) {
    let extra = match kind {
        "Pod" => json!({"spec": {"containers": null}, "status": {}}),
        "Deployment" => json!({
            "spec": {"replicas": 0, "selector": null, "template": {"metadata": {}, "spec": {"containers": null}}, "strategy": {}},
            "status": {}
        }),
        "ReplicaSet" => json!({
            "spec": {"replicas": 0, "selector": null, "template": {"metadata": {}, "spec": {"containers": null}}},
            "status": {"replicas": 0}
        }),
        "Node" => json!({"spec": {}, "status": {
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "", "architecture": ""}
        }}),
        "Service" => json!({"spec": {}, "status": {"loadBalancer": {}}}),
        "Namespace" => json!({"spec": {}, "status": {}}),
        "Lease" => json!({"spec": {}}),
        _ => return,
    };
    if let (Some(o), Some(e)) = (obj.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
}
