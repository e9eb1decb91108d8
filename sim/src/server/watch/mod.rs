//! Watch streams (`?watch=true`), per the API concepts' "Efficient detection of changes"
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>):
//! newline-delimited `{"type":…,"object":…}` events; `resourceVersion` unset/"0" starts with
//! synthetic ADDED events for current objects; a compacted version answers one 410 ERROR event
//! (except for Events, answered 200 and closed at once, as kube-apiserver does);
//! `allowWatchBookmarks` adds periodic BOOKMARKs; `sendInitialEvents=true` ends the initial
//! ADDED events with a BOOKMARK annotated `k8s.io/initial-events-end: "true"`; selectors apply
//! to events (an object that stops matching is sent as DELETED). Watches of a custom resource
//! end when its CustomResourceDefinition is deleted. This file turns a watch request into a
//! stream (validating the streaming-list parameters as the API server does, and answering
//! the "empty watch", streaming-list support and broken-initial-events switches); `stream`
//! is the stream itself, with the silent/damaged/ended watch faults. This module never
//! writes to the store.

mod stream;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

use super::{json_response, json_response_stream, selectors_from_query};
use crate::error::ApiError;
use crate::faults::{BreakKind, WatchListSupport};
use crate::resources::ResourceType;
use crate::store::PageRequest;
use crate::Inner;
use stream::{Item, WatchStream};

fn gone(requested: &str, oldest: u64) -> Value {
    ApiError::Expired {
        message: format!("too old resource version: {requested} ({oldest})"),
    }
    .to_status()
}

/// Starts a watch of `rt` (in `namespace`, if any) at URL `path` with the query parameters
/// of the request. A watch of a path the `empty_watches` fault selects answers 200 with an
/// empty body. Errors: 400 for bad selectors, timeoutSeconds or a non-numeric
/// resourceVersion.
pub fn watch(
    inner: &Arc<Inner>,
    path: &str,
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    query: &HashMap<String, String>,
    meta_only: bool,
) -> Result<Response, ApiError> {
    let selectors = selectors_from_query(query, &rt.kind)?;
    let support = inner.faults.watch_list();
    // A server that ignores the streaming-list parameters sees a plain watch.
    let flag = |k: &str| {
        let ignored = support == WatchListSupport::Ignored
            && matches!(k, "sendInitialEvents" | "resourceVersionMatch");
        query.get(k).map(String::as_str).filter(|_| !ignored)
    };
    validate_streaming(
        flag("sendInitialEvents"),
        flag("resourceVersionMatch").filter(|m| !m.is_empty()),
        support,
    )?;
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
    if inner.faults.empties_watch(path) {
        return Ok(json_response(200, Bytes::new()));
    }
    // Events are not in kube-apiserver's watch cache (their volume and short TTL): a watch of
    // them from a resourceVersion etcd compacted away is answered 200 and closed at once,
    // with no 410 ERROR event (kubernetes/kubernetes#104171, #137089).
    let event = rt.kind == "Event" && matches!(rt.group.as_str(), "" | "events.k8s.io");
    if event && !send_initial {
        let oldest = inner.store().oldest_readable_rv_for(&rt.key());
        if requested.is_some_and(|r| r > 0 && r < oldest) {
            return Ok(json_response(200, Bytes::new()));
        }
    }
    let control = inner.faults.register_watch(path, &rt.group, &rt.plural);
    let mut st = WatchStream::new(inner, path, rt, control);
    let key = st.key.clone();
    let backlog = &mut st.backlog;
    let (rx, last_rv) = {
        let store = inner.store();
        let rx = store.subscribe();
        let current = store.resource_version();
        let oldest = store.oldest_readable_rv_for(&key);
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
            let broken = send_initial
                .then(|| inner.faults.take_initial_events_break(path))
                .flatten();
            let sent = broken.map_or(usize::MAX, |(after, _)| after);
            backlog.extend(
                page.items
                    .into_iter()
                    .take(sent)
                    .map(|o| Item::Object("ADDED", o)),
            );
            match broken {
                Some((_, BreakKind::Cut)) => backlog.push_back(Item::End),
                Some((_, BreakKind::Gone)) => {
                    backlog.push_back(Item::Error(gone(rv_param.unwrap_or(""), current)))
                }
                None if send_initial => backlog.push_back(Item::InitialEnd(current)),
                None => {}
            }
            if send_initial {
                st.guard.start_initial_events();
                st.end_hold = inner.faults.initial_events_end_hold();
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
    st.namespace = namespace;
    st.selectors = selectors;
    st.meta_only = meta_only;
    st.rx = Some(rx);
    st.last_rv = last_rv;
    st.bookmarks = bookmarks_on
        .then(|| tokio::time::interval_at(tokio::time::Instant::now() + interval, interval));
    st.deadline = timeout.map(|t| Box::pin(tokio::time::sleep(Duration::from_secs(t))));
    let stream = futures::stream::unfold(st, |mut st| async move {
        let chunk = st.next_chunk().await?;
        st.guard
            .inner
            .watch_events_sent
            .fetch_add(1, Ordering::Relaxed);
        Some((Ok::<Bytes, Infallible>(chunk), st))
    });
    Ok(json_response_stream(Body::from_stream(stream)))
}

/// The streaming-list checks of the API server's `validateWatchOptions`
/// (`k8s.io/apiserver/pkg/apis/meta/internalversion/validation`): `sendInitialEvents` needs
/// `resourceVersionMatch=NotOlderThan` and, with the feature gate off, is forbidden;
/// `resourceVersionMatch` on a watch needs `sendInitialEvents` and can only be `NotOlderThan`.
/// Every failure is one cause of a 422 `Invalid` for `ListOptions.meta.k8s.io`.
fn validate_streaming(
    send_initial: Option<&str>,
    rv_match: Option<&str>,
    support: WatchListSupport,
) -> Result<(), ApiError> {
    const NOT_OLDER_THAN: &str = "NotOlderThan";
    let mut causes = Vec::new();
    let mut forbid = |field: &str, message: String| {
        causes.push((
            "FieldValueForbidden".to_owned(),
            format!("Forbidden: {message}"),
            field.to_owned(),
        ))
    };
    if send_initial.is_some() {
        if rv_match != Some(NOT_OLDER_THAN) {
            forbid(
                "resourceVersionMatch",
                format!(
                    "sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}"
                ),
            );
        }
        if support == WatchListSupport::Off {
            forbid(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled".to_owned(),
            );
        }
    }
    if let Some(m) = rv_match {
        if send_initial.is_none() {
            forbid(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
                    .to_owned(),
            );
        }
        if m != NOT_OLDER_THAN {
            causes.push((
                "FieldValueNotSupported".to_owned(),
                format!("Unsupported value: {m:?}: supported values: \"{NOT_OLDER_THAN}\""),
                "resourceVersionMatch".to_owned(),
            ));
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    let message = causes
        .iter()
        .map(|(_, m, f)| format!("{f}: {m}"))
        .collect::<Vec<_>>()
        .join(", ");
    let message = if causes.len() > 1 {
        format!("[{message}]")
    } else {
        message
    };
    Err(ApiError::Invalid {
        group: "meta.k8s.io".to_owned(),
        kind: "ListOptions".to_owned(),
        name: String::new(),
        message,
        causes,
    })
}
