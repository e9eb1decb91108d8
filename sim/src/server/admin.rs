//! Admin endpoints under `/_sim/` so the binary can be driven by curl; each maps onto a
//! [`crate::Faults`] switch or a read-only counter. They are neither recorded in the request
//! log nor subject to injected faults.
//!
//! - `POST /_sim/close-watches`
//! - `POST /_sim/fail-watches?count=N` (next N watches get the 410 ERROR event)
//! - `POST /_sim/delay?ms=N` (0 disables)
//! - `POST /_sim/fail-requests?count=N&status=500|429&retry_after=S&path_prefix=/api`
//! - `POST /_sim/clear-faults`
//! - `GET /_sim/stats` → `{"resourceVersion","watchEventsSent","openWatches"}`

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::response::Response;
use serde_json::json;

use super::json_response;
use crate::error::ApiError;
use crate::faults::FailureKind;
use crate::Inner;

fn number(query: &HashMap<String, String>, key: &str, default: u64) -> Result<u64, ApiError> {
    match query.get(key) {
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request(format!("{key} must be a number, got {v:?}"))),
        None => Ok(default),
    }
}

/// Handles `/_sim/{action}`; 404 for unknown actions, 400 for bad numbers.
pub fn handle(
    inner: &Inner,
    action: &str,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let faults = &inner.faults;
    match action {
        "close-watches" => faults.close_all_watches(),
        "fail-watches" => faults.fail_next_watches_with_gone(number(query, "count", 1)? as usize),
        "delay" => faults.set_delay(Duration::from_millis(number(query, "ms", 0)?)),
        "clear-faults" => faults.clear(),
        "fail-requests" => {
            let count = number(query, "count", 1)? as usize;
            let kind = match number(query, "status", 500)? {
                500 => FailureKind::Internal,
                429 => FailureKind::TooManyRequests {
                    retry_after_secs: number(query, "retry_after", 1)?,
                },
                other => {
                    return Err(ApiError::bad_request(format!(
                        "status must be 500 or 429, got {other}"
                    )))
                }
            };
            match query.get("path_prefix") {
                Some(p) => faults.fail_next_requests_matching(count, kind, p),
                None => faults.fail_next_requests(count, kind),
            }
        }
        "stats" => {
            let body = json!({
                "resourceVersion": inner.store().resource_version(),
                "watchEventsSent": inner.watch_events_sent.load(Ordering::Relaxed),
                "openWatches": inner.open_watches.load(Ordering::Relaxed),
            });
            return Ok(json_response(200, body.to_string().into()));
        }
        _ => {
            return Err(ApiError::UnknownResource {
                path: format!("/_sim/{action}"),
            })
        }
    }
    Ok(json_response(200, json!({"ok": true}).to_string().into()))
}
