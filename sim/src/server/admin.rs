//! Admin endpoints under `/_sim/` so the binary can be driven by curl; each maps onto a
//! [`crate::Faults`] switch, a simulator method or a read-only counter. They are neither
//! recorded in the request log nor counted, nor subject to injected faults (while the server
//! is unreachable, a new connection whose first request is for `/_sim/` is still served).
//! Parameters are query parameters; `on` takes `true`/`false` (default `true`); a missing
//! `path_prefix` means every path. [`ADMIN_ENDPOINTS`] is the same list as data, printed by
//! `kubesink-sim --help`.
//!
//! - `POST /_sim/close-watches`: end every open watch
//! - `POST /_sim/fail-watches?count=N`: the next N watches get the 410 ERROR event
//! - `POST /_sim/delay?ms=N`: delay every response (0 disables)
//! - `POST /_sim/fail-requests?count=N&status=500|429&retry_after=S&path_prefix=/api`
//! - `POST /_sim/silence-open-watches`: open watches send nothing more, connection kept
//! - `POST /_sim/silence-watches?on=true&path_prefix=P`: new watches accepted, then silent
//! - `POST /_sim/empty-watches?on=true&path_prefix=P`: watches answer 200 with an empty body
//! - `POST /_sim/damage-watch-events?count=N&kind=truncated|not-json|non-utf8|not-an-event&path_prefix=P`
//! - `POST /_sim/keep-watches-after-crd-delete?on=true`: watches of a deleted CRD stay open, silent
//! - `POST /_sim/set-status?status=C&retry_after=S&path_prefix=P` or `…&group=G&resource=R`:
//!   answer matching requests with a `Status` of code C until cleared
//! - `POST /_sim/clear-status?path_prefix=P` or `?group=G&resource=R`
//! - `POST /_sim/expire-continue?count=N`: the next N lists with `continue` get 410 Expired
//! - `POST /_sim/explicit-empty-continue?on=true`: last pages carry `"continue": ""`
//! - `POST /_sim/dribble?bytes=N&ms=M`: write bodies N bytes at a time, M ms apart (N=0 off)
//! - `POST /_sim/unreachable?on=true&for_ms=M`: cut every connection and refuse service
//!   (for M ms, then resume, if given)
//! - `POST /_sim/reset-connections`: reset every open connection (watches mid-stream), keep
//!   serving new ones
//! - `POST /_sim/insert-raw?apiVersion=v1&kind=Pod&resourceVersion=as-given|assigned` with a
//!   JSON body: store it without validation
//! - `POST /_sim/churn?rate=R&seed=S&stamp=ANNOTATION`: start pod churn at R changes/s
//!   (replacing churn started here before; `rate=0` stops it); with `stamp`, added and updated
//!   pods carry that annotation set to the write's Unix time in microseconds
//! - `POST /_sim/watch-list?mode=on|off|ignored`: streaming lists (`sendInitialEvents`)
//!   served, refused with 422 (the WatchList feature gate off) or ignored (a plain watch, as
//!   servers before 1.27); kept by `clear-faults`
//! - `POST /_sim/break-initial-events?count=N&after=K&how=cut|gone&path_prefix=P`: the next N
//!   streaming lists end after K initial events, before their end bookmark: the body ends
//!   (`cut`) or a 410 Expired ERROR event comes (`gone`)
//! - `POST /_sim/hold-initial-events-end?on=true`: streaming lists hold their
//!   initial-events-end bookmark back after their initial events until `on=false` (or
//!   `clear-faults`) releases them
//! - `POST /_sim/deny?verb=watch&group=&resource=pods&namespace=NS&on=true`: take a
//!   permission away (each parameter left out means any; `group=` is the core group): covered
//!   requests get 403 Forbidden and `SelfSubjectAccessReview`s answer `allowed: false`;
//!   `on=false` gives that rule back, `on=false` with no other parameter every one; kept by
//!   `clear-faults`
//! - `POST /_sim/reset-stats`: zero the request counts (the peak of streaming lists in flight
//!   starts again from those in flight)
//! - `POST /_sim/clear-faults`: clear every fault switch
//! - `GET /_sim/stats` → `{"resourceVersion","watchEventsSent","openWatches",
//!   "damagedWatchEvents","unreachable","churnApplied","streamingListsInFlight",
//!   "streamingListsPeak","requestCounts":{"byResource","byPath"}}` (`churnApplied`:
//!   operations of the churn started with `/_sim/churn`; `streamingListsInFlight`: watches
//!   with `sendInitialEvents=true` before their end bookmark, `streamingListsPeak` the most at
//!   once since the last `reset-stats`); `"faultEffects"`: how often each fault took effect
//!   (`Faults::effects`: failed requests, 410 watches, expired continues, watches closed,
//!   silenced, reset or cut, connections refused, responses delayed)

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use axum::response::Response;
use bytes::Bytes;
use serde_json::json;

use super::json_response;
use crate::error::ApiError;
use crate::faults::{
    BreakKind, DamageKind, Denial, FailureKind, FaultError, RequestMatch, WatchListSupport,
};
use crate::store::RawResourceVersion;
use crate::{Inner, Simulator};

/// One admin endpoint, for `--help` and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminEndpoint {
    /// HTTP method to use ("POST" or "GET").
    pub method: &'static str,
    /// Path and an example query, e.g. `/_sim/delay?ms=500`.
    pub example: &'static str,
    /// What it does.
    pub what: &'static str,
}

const fn ep(method: &'static str, example: &'static str, what: &'static str) -> AdminEndpoint {
    AdminEndpoint {
        method,
        example,
        what,
    }
}

/// Every admin endpoint with an example call (see the module docs for all parameters).
pub const ADMIN_ENDPOINTS: &[AdminEndpoint] = &[
    ep("POST", "/_sim/close-watches", "end every open watch"),
    ep("POST", "/_sim/fail-watches?count=1", "the next N watches get one 410 Expired ERROR event"),
    ep("POST", "/_sim/delay?ms=500", "delay every response (0 disables)"),
    ep("POST", "/_sim/fail-requests?count=3&status=429&retry_after=2&path_prefix=/api", "fail the next N requests with 500 or 429 + Retry-After"),
    ep("POST", "/_sim/silence-open-watches", "open watches send nothing more, ever; connections stay open"),
    ep("POST", "/_sim/silence-watches?on=true&path_prefix=/api/v1/pods", "new matching watches are accepted, then send nothing"),
    ep("POST", "/_sim/empty-watches?on=true&path_prefix=/api/v1/pods", "matching watches answer 200 with an empty body"),
    ep("POST", "/_sim/damage-watch-events?count=1&kind=truncated&path_prefix=/api/v1/pods", "send the next N real watch events damaged: truncated, not-json, non-utf8, not-an-event"),
    ep("POST", "/_sim/keep-watches-after-crd-delete?on=true", "watches of a deleted CRD stay open and silent (server bug)"),
    ep("POST", "/_sim/set-status?status=403&path_prefix=/api/v1/pods", "answer matching requests (or group=G&resource=R) with a Status of that code until cleared; retry_after=S adds Retry-After"),
    ep("POST", "/_sim/clear-status?path_prefix=/api/v1/pods", "remove a status override (path_prefix=P or group=G&resource=R)"),
    ep("POST", "/_sim/expire-continue?count=1", "the next N lists with a continue token get 410 Expired + inconsistent token"),
    ep("POST", "/_sim/explicit-empty-continue?on=true", "last list pages carry \"continue\": \"\""),
    ep("POST", "/_sim/dribble?bytes=64&ms=20", "write response bodies N bytes at a time, M ms apart (bytes=0 disables)"),
    ep("POST", "/_sim/unreachable?on=true&for_ms=2000", "cut every connection and close new ones at once (for M ms if given); on=false resumes"),
    ep("POST", "/_sim/reset-connections", "reset every open connection mid-stream (no final chunk); new connections are served"),
    ep("POST", "/_sim/insert-raw?apiVersion=v1&kind=ConfigMap&resourceVersion=as-given", "store the JSON body without validation (resourceVersion=as-given keeps an opaque one)"),
    ep("POST", "/_sim/churn?rate=2000&seed=1&stamp=bench.kubesink.io/changed-at", "start pod churn at R changes/s (rate=0 stops); stamp=A sets annotation A of added/updated pods to the write's Unix microseconds"),
    ep("POST", "/_sim/watch-list?mode=off", "streaming lists (sendInitialEvents) on (served), off (422: the WatchList feature gate off) or ignored (a plain watch, as before 1.27)"),
    ep("POST", "/_sim/break-initial-events?count=1&after=10&how=cut", "the next N streaming lists end after K initial events, before the end bookmark: cut (the body ends) or gone (a 410 ERROR event)"),
    ep("POST", "/_sim/hold-initial-events-end?on=true", "streaming lists hold their initial-events-end bookmark back after their initial events until on=false (or clear-faults)"),
    ep("POST", "/_sim/deny?verb=watch&group=&resource=pods", "take a permission away (verb, group, resource, namespace; each left out: any): 403 Forbidden and SelfSubjectAccessReview allowed=false; on=false gives it back (alone: all)"),
    ep("POST", "/_sim/reset-stats", "zero the list/watch request counts"),
    ep("POST", "/_sim/clear-faults", "clear every fault switch"),
    ep("GET", "/_sim/stats", "resourceVersion, watch events sent, open watches, damaged events, streaming lists in flight and their peak, request counts, faultEffects (how often each fault took effect)"),
];

/// The admin endpoints as text for `--help`.
pub fn admin_help() -> String {
    let mut out = String::from("Admin endpoints (fault injection and counters):\n");
    for e in ADMIN_ENDPOINTS {
        out.push_str(&format!("  {} {}\n      {}\n", e.method, e.example, e.what));
    }
    out
}

fn number(query: &HashMap<String, String>, key: &str, default: u64) -> Result<u64, ApiError> {
    match query.get(key) {
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request(format!("{key} must be a number, got {v:?}"))),
        None => Ok(default),
    }
}

fn switch(query: &HashMap<String, String>) -> Result<bool, ApiError> {
    match query.get("on").map(String::as_str) {
        None | Some("true" | "1") => Ok(true),
        Some("false" | "0") => Ok(false),
        Some(v) => Err(ApiError::bad_request(format!(
            "on must be true or false, got {v:?}"
        ))),
    }
}

fn matcher(query: &HashMap<String, String>) -> Result<RequestMatch, ApiError> {
    match (
        query.get("path_prefix"),
        query.get("group"),
        query.get("resource"),
    ) {
        (Some(p), None, None) => Ok(RequestMatch::PathPrefix(p.clone())),
        (None, group, Some(plural)) => Ok(RequestMatch::Resource {
            group: group.cloned().unwrap_or_default(),
            plural: plural.clone(),
        }),
        _ => Err(ApiError::bad_request(
            "give either path_prefix or resource (with group, \"\" for core)",
        )),
    }
}

impl From<FaultError> for ApiError {
    fn from(e: FaultError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

/// Handles `/_sim/{action}` (`body` is read only by `insert-raw`); 404 for unknown actions,
/// 400 for bad parameters.
pub fn handle(
    inner: &Arc<Inner>,
    _method: &Method,
    action: &str,
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let faults = &inner.faults;
    let prefix = query.get("path_prefix").map(String::as_str);
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
            match prefix {
                Some(p) => faults.fail_next_requests_matching(count, kind, p),
                None => faults.fail_next_requests(count, kind),
            }
        }
        "silence-open-watches" => faults.silence_open_watches(),
        "silence-watches" => faults.silence_watches(prefix, switch(query)?),
        "empty-watches" => faults.empty_watches(prefix, switch(query)?),
        "damage-watch-events" => {
            let name = query.get("kind").map_or("truncated", String::as_str);
            let kind = DamageKind::from_name(name).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "kind must be truncated, not-json, non-utf8 or not-an-event, got {name:?}"
                ))
            })?;
            faults.damage_next_watch_events(number(query, "count", 1)? as usize, kind, prefix);
        }
        "keep-watches-after-crd-delete" => {
            faults.keep_watches_open_after_crd_delete(switch(query)?)
        }
        "set-status" => {
            let status = u16::try_from(number(query, "status", 500)?)
                .map_err(|_| ApiError::bad_request("status out of range"))?;
            let retry_after = query
                .contains_key("retry_after")
                .then(|| number(query, "retry_after", 0))
                .transpose()?;
            faults.set_status_for(matcher(query)?, status, retry_after)?;
        }
        "clear-status" => match matcher(query)? {
            RequestMatch::PathPrefix(p) => faults.clear_status(&p),
            RequestMatch::Resource { group, plural } => {
                faults.clear_resource_status(&group, &plural)
            }
        },
        "expire-continue" => faults.expire_next_continue(number(query, "count", 1)? as usize),
        "explicit-empty-continue" => faults.explicit_empty_continue(switch(query)?),
        "dribble" => faults.dribble(
            number(query, "bytes", 0)? as usize,
            Duration::from_millis(number(query, "ms", 0)?),
        ),
        "unreachable" => {
            let on = switch(query)?;
            faults.set_unreachable(on);
            if on && query.contains_key("for_ms") {
                let sim = Simulator {
                    inner: inner.clone(),
                };
                let pause = Duration::from_millis(number(query, "for_ms", 0)?);
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    sim.faults().set_unreachable(false);
                });
            }
        }
        "reset-connections" => faults.reset_connections(),
        "insert-raw" => {
            let api_version = query.get("apiVersion").map_or("v1", String::as_str);
            let kind = query
                .get("kind")
                .ok_or_else(|| ApiError::bad_request("kind is required"))?;
            let rv = match query.get("resourceVersion").map(String::as_str) {
                None | Some("assigned") => RawResourceVersion::Assigned,
                Some("as-given") => RawResourceVersion::AsGiven,
                Some(v) => {
                    return Err(ApiError::bad_request(format!(
                        "resourceVersion must be assigned or as-given, got {v:?}"
                    )))
                }
            };
            let obj = crate::json::with_stack_for(crate::json::depth_of_bytes(body), || {
                let obj = crate::json::parse(body).map_err(|e| {
                    ApiError::bad_request(format!("the body is not valid JSON: {e}"))
                })?;
                Simulator {
                    inner: inner.clone(),
                }
                .insert_raw(api_version, kind, obj, rv)
            });
            obj?;
        }
        "churn" => {
            let rate = query
                .get("rate")
                .map(|v| {
                    v.parse::<f64>()
                        .ok()
                        .filter(|r| r.is_finite() && *r >= 0.0)
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "rate must be a number of changes per second, got {v:?}"
                            ))
                        })
                })
                .transpose()?
                .unwrap_or(0.0);
            let churn = crate::Churn {
                rate_per_sec: rate,
                seed: number(query, "seed", 1)?,
            };
            let mut slot = inner.admin_churn.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(old) = slot.take() {
                old.stop();
            }
            if rate > 0.0 {
                let sim = Simulator {
                    inner: inner.clone(),
                };
                *slot = Some(crate::workload::spawn_stamped_churn(
                    &sim,
                    churn,
                    query.get("stamp").cloned(),
                ));
            }
        }
        "watch-list" => {
            let name = query.get("mode").map_or("on", String::as_str);
            let mode = WatchListSupport::from_name(name).ok_or_else(|| {
                ApiError::bad_request(format!("mode must be on, off or ignored, got {name:?}"))
            })?;
            faults.set_watch_list(mode);
        }
        "break-initial-events" => {
            let name = query.get("how").map_or("cut", String::as_str);
            let how = BreakKind::from_name(name).ok_or_else(|| {
                ApiError::bad_request(format!("how must be cut or gone, got {name:?}"))
            })?;
            faults.break_initial_events(
                number(query, "count", 1)? as usize,
                number(query, "after", 0)? as usize,
                how,
                prefix,
            );
        }
        "deny" => {
            let field = |k: &str| query.get(k).cloned();
            let denial = Denial {
                verb: field("verb"),
                group: field("group"),
                resource: field("resource"),
                namespace: field("namespace"),
            };
            match (switch(query)?, denial == Denial::default()) {
                (true, _) => faults.deny(denial),
                (false, true) => faults.clear_denials(),
                (false, false) => faults.undeny(&denial),
            }
        }
        "hold-initial-events-end" => faults.hold_initial_events_end(switch(query)?),
        "reset-stats" => Simulator {
            inner: inner.clone(),
        }
        .reset_request_counts(),
        "stats" => {
            let sim = Simulator {
                inner: inner.clone(),
            };
            let body = json!({
                "resourceVersion": inner.store().resource_version(),
                "watchEventsSent": inner.watch_events_sent.load(Ordering::Relaxed),
                "openWatches": inner.open_watches.load(Ordering::Relaxed),
                "damagedWatchEvents": faults.damaged_watch_events(),
                "unreachable": faults.is_unreachable(),
                "streamingListsInFlight": inner.streaming_lists.load(Ordering::SeqCst),
                "streamingListsPeak": inner.streaming_lists_peak.load(Ordering::SeqCst),
                "churnApplied": inner
                    .admin_churn
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map_or(0, |c| c.stats().total()),
                "requestCounts": sim.request_counts().to_json(),
                "faultEffects": faults.effects(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimConfig;

    #[test]
    fn every_listed_endpoint_is_handled_and_documented_in_the_module_docs() {
        let source = include_str!("admin.rs");
        let docs: String = source
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the unreachable endpoint's timer");
        let _enter = rt.enter();
        for e in ADMIN_ENDPOINTS {
            let sim = Simulator::new(SimConfig::default());
            let (path, query) = e.example.split_once('?').unwrap_or((e.example, ""));
            let query: HashMap<String, String> =
                serde_urlencoded::from_str(query).unwrap_or_default();
            let action = path.trim_start_matches("/_sim/");
            let body = Bytes::from_static(br#"{"metadata":{"resourceVersion":"abc-17"}}"#);
            let resp = handle(&sim.inner, &Method::POST, action, &query, &body);
            assert_eq!(
                resp.map(|r| r.status().as_u16()).map_err(|e| e.to_string()),
                Ok(200),
                "{}",
                e.example
            );
            assert!(
                docs.contains(&format!("{} {path}", e.method)),
                "{path} missing from the module docs"
            );
        }
        assert_eq!(
            ADMIN_ENDPOINTS.len(),
            docs.matches("`POST /_sim/").count() + docs.matches("`GET /_sim/").count()
        );
    }
}
