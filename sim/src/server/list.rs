//! List requests: `limit`/`continue` pagination served from the snapshot at the first page's
//! resourceVersion, `metadata.remainingItemCount`, and the `resourceVersion` /
//! `resourceVersionMatch` semantics of
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions>
//! (unset = most recent, "0" = any, NotOlderThan = at least, Exact = that snapshot; too new
//! → 504 Timeout, older than the retained window → 410 Expired). A `continue` token whose
//! snapshot is gone (or that the `expire_next_continue` fault expires) answers 410 with an
//! inconsistent-continue token (rv -1: continue at the latest version), as in
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks>.
//! The body is written by concatenating stored bytes. This module never writes to the store.

use std::collections::HashMap;

use axum::response::Response;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{json_response, render_object, selectors_from_query};
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::store::{ObjKey, PageRequest};
use crate::Inner;

/// The opaque continue token: base64 of this JSON (like the real server's
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"key"}`). `rv` -1 continues inconsistently at the
/// latest resourceVersion.
#[derive(Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: i64,
    start: ObjKey,
}

/// The 410 for an expired `token`, carrying the inconsistent-continue token.
fn expired_continue(token: ContinueToken) -> ApiError {
    ApiError::ExpiredContinue {
        continue_token: encode(&ContinueToken { rv: -1, ..token }),
    }
}

fn encode(token: &ContinueToken) -> String {
    let text = serde_json::to_vec(token).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

fn decode(s: &str) -> Result<ContinueToken, ApiError> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|e| ApiError::bad_request(format!("continue key is not valid: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("continue key is not valid: {e}")))
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))
}

fn too_large(requested: u64, current: u64) -> ApiError {
    ApiError::Timeout {
        message: format!("Too large resource version: {requested}, current: {current}"),
    }
}

/// Answers a list of `rt` (in `namespace`, if any). `meta_only` answers a
/// `PartialObjectMetadataList`. Errors: 400 (selector, limit, continue, resourceVersion),
/// 410 Expired, 504 Timeout.
pub fn list(
    inner: &Inner,
    rt: &ResourceType,
    namespace: Option<&str>,
    query: &HashMap<String, String>,
    meta_only: bool,
) -> Result<Response, ApiError> {
    let selectors = selectors_from_query(query, &rt.kind)?;
    let param = |k: &str| query.get(k).map(String::as_str).filter(|s| !s.is_empty());
    let limit = match param("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        None => 0,
    };
    let key = rt.key();
    let store = inner.store();
    let current = store.resource_version();
    let oldest = store.oldest_readable_rv_for(&key);
    let (at_rv, after) = if let Some(c) = param("continue") {
        let token = decode(c)?;
        if inner.faults.take_expired_continue() {
            return Err(expired_continue(token));
        }
        match u64::try_from(token.rv) {
            Err(_) => (current, Some(token.start)),
            Ok(rv) if rv < oldest => return Err(expired_continue(token)),
            Ok(rv) => (rv, Some(token.start)),
        }
    } else {
        let rv = param("resourceVersion");
        match (rv, param("resourceVersionMatch")) {
            (None, Some(m)) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch: {m} is forbidden unless resourceVersion is provided"
                )))
            }
            (None, None) => (current, None),
            (Some(r), Some("Exact")) => {
                let r = parse_rv(r)?;
                if r > current {
                    return Err(too_large(r, current));
                }
                if r < oldest {
                    return Err(ApiError::Expired {
                        message: format!("too old resource version: {r} ({})", oldest + 1),
                    });
                }
                (r, None)
            }
            (Some(r), None | Some("NotOlderThan")) => {
                let r = parse_rv(r)?;
                if r > current {
                    return Err(too_large(r, current));
                }
                (current, None)
            }
            (Some(_), Some(m)) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch: Unsupported value: \"{m}\""
                )))
            }
        }
    };
    let page = store.page(&PageRequest {
        resource: &key,
        namespace,
        at_rv,
        after: after.as_ref(),
        limit,
        selectors: &selectors,
    });
    drop(store);

    let mut meta = json!({"resourceVersion": at_rv.to_string()});
    if let Some(start) = page.next_start {
        meta["continue"] = json!(encode(&ContinueToken {
            v: "meta.k8s.io/v1".into(),
            rv: i64::try_from(at_rv).unwrap_or(i64::MAX),
            start
        }));
        meta["remainingItemCount"] = json!(page.remaining);
    } else if inner.faults.empty_continue_on_last_page() {
        meta["continue"] = json!("");
    }
    let (kind, api_version) = if meta_only {
        (
            "PartialObjectMetadataList".to_owned(),
            "meta.k8s.io/v1".to_owned(),
        )
    } else {
        (format!("{}List", rt.kind), rt.api_version())
    };
    let rendered: Vec<bytes::Bytes> = page
        .items
        .iter()
        .map(|o| render_object(o, meta_only))
        .collect();
    let mut out = Vec::with_capacity(rendered.iter().map(|b| b.len() + 1).sum::<usize>() + 256);
    out.extend_from_slice(format!("{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{meta},\"items\":[").as_bytes());
    for (i, b) in rendered.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b);
    }
    out.extend_from_slice(b"]}");
    Ok(json_response(200, out.into()))
}
