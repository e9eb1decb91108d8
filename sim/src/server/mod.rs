//! The HTTP front: one axum fallback handler that records the request, applies injected
//! faults, parses the Kubernetes REST path (`/api/v1/...`, `/apis/{g}/{v}/...`,
//! `namespaces/{ns}/{plural}/{name}`) and dispatches to discovery, list, watch, get and the
//! writes, answering errors as `Status` objects
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#standard-api-terminology>).
//! Submodules: `connection` (accept loop, unreachable server), `dribble` (slow bodies),
//! `request_info` (what a request is about), `admin` (`/_sim/`), `access_review`
//! (`SelfSubjectAccessReview`), and one per kind of answer. Denied permissions
//! (`Faults::deny`) answer 403 here, before anything is served.
//! This module never mutates objects itself; the store does.

mod access_review;
pub(crate) mod admin;
mod connection;
mod discovery;
mod dribble;
mod list;
mod openapi;
mod patch;
mod request_info;
mod watch;

pub(crate) use connection::serve;
pub use request_info::SIM_USER;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::json;
use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use crate::store::StoredObject;
use crate::{Inner, RecordedRequest};
use request_info::RequestInfo;

/// Largest request body accepted (bytes).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// The router serving everything through [`handle`].
pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new().fallback(handle).with_state(inner)
}

pub(crate) fn json_response(status: u16, body: Bytes) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn json_response_stream(body: Body) -> Response {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(e: &ApiError) -> Response {
    let retry_after = match e {
        ApiError::TooManyRequests { retry_after_secs } => Some(*retry_after_secs),
        _ => None,
    };
    status_response(e, retry_after)
}

/// `e` as a `Status` answer; `retry_after` (seconds) adds the `Retry-After` header and
/// `details.retryAfterSeconds`, as the API server does for 429 and 503.
fn status_response(e: &ApiError, retry_after: Option<u64>) -> Response {
    let mut status = e.to_status();
    if let Some(secs) = retry_after {
        if let Some(map) = status.as_object_mut() {
            let details = map
                .entry("details")
                .or_insert_with(|| Value::Object(Default::default()));
            details["retryAfterSeconds"] = json!(secs);
        }
    }
    let mut resp = json_response(e.status_code(), status.to_string().into());
    if let Some(v) = retry_after.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// The object as answered: its body, or a `PartialObjectMetadata` wrapping its metadata.
pub(crate) fn render_object(o: &StoredObject, meta_only: bool) -> Bytes {
    if !meta_only {
        return o.body.clone();
    }
    let mut out = Vec::with_capacity(o.metadata.len() + 80);
    out.extend_from_slice(
        br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#,
    );
    out.extend_from_slice(&o.metadata);
    out.push(b'}');
    out.into()
}

/// The selectors of a list or watch; a bad one is 400 BadRequest with the parser's message
/// alone, as the API server words it (`unable to parse requirement: …`, `field label not
/// supported: spec.foo`).
/// `kind`'s own selectable fields are accepted (`spec.nodeName` for a Pod…: `selector.rs`).
pub(crate) fn selectors_from_query(
    query: &HashMap<String, String>,
    kind: &str,
) -> Result<Selectors, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields =
        FieldSelector::parse_for(query.get("fieldSelector").map_or("", String::as_str), kind)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Selectors { labels, fields })
}

fn parse_query(q: Option<&str>) -> Result<HashMap<String, String>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q.unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
    Ok(pairs.into_iter().collect())
}

/// Whether the Accept header asks for `PartialObjectMetadata(List)` in meta.k8s.io/v1.
fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let query = match parse_query(parts.uri.query()) {
        Ok(q) => q,
        Err(e) => return error_response(&e),
    };
    if let Some(action) = path.strip_prefix("/_sim/") {
        let body = match axum::body::to_bytes(body, MAX_BODY).await {
            Ok(b) => b,
            Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
        };
        return admin::handle(&inner, &parts.method, action, &query, &body)
            .unwrap_or_else(|e| error_response(&e));
    }
    let response = serve_api(&inner, parts, body, &path, &query).await;
    match inner.faults.dribble_setting() {
        Some(_) => dribble::dribble(inner.clone(), response),
        None => response,
    }
}

/// Serves one API request: record, count, injected faults, then [`dispatch`].
async fn serve_api(
    inner: &Arc<Inner>,
    parts: axum::http::request::Parts,
    body: Body,
    path: &str,
    query: &HashMap<String, String>,
) -> Response {
    let info = RequestInfo::parse(&parts.method, path, query);
    if let Some(r) = &info.resource {
        inner.count_request(path, r.group, r.plural, info.verb);
    }
    let text_header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let accept = text_header(header::ACCEPT.as_str());
    let impersonate_user = text_header("impersonate-user");
    inner.record_request(RecordedRequest {
        method: parts.method.to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or(path.to_owned(), |p| p.to_string()),
        accept,
        impersonate_user,
        at: std::time::Instant::now(),
    });
    tracing::debug!(method = %parts.method, uri = %parts.uri, "request");
    let delay = inner.faults.delay();
    if !delay.is_zero() {
        inner.faults.count_effect("delayedResponses", 1);
        tokio::time::sleep(delay).await;
    }
    if let Some(kind) = inner.faults.take_failure(path) {
        let e = match kind {
            crate::FailureKind::Internal => ApiError::Internal {
                message: "injected failure".into(),
            },
            crate::FailureKind::TooManyRequests { retry_after_secs } => {
                ApiError::TooManyRequests { retry_after_secs }
            }
        };
        return error_response(&e);
    }
    if let Some((code, retry_after)) = inner.faults.status_override(path, info.group_plural()) {
        return status_response(&info.injected_error(code, retry_after), retry_after);
    }
    // Every authenticated user may review its own access (`system:basic-user`).
    let own_review = info.group_plural() == Some((access_review::GROUP, access_review::PLURAL));
    if let Some(r) = info.resource.as_ref().filter(|_| !own_review) {
        if inner
            .faults
            .denial_of(info.verb, r.group, r.plural, r.namespace)
            .is_some()
        {
            return error_response(&info.injected_error(403, None));
        }
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let meta_only = wants_metadata(&parts.headers);
    let ctx = Ctx {
        inner,
        method: &parts.method,
        path,
        query,
        body: &body,
        meta_only,
    };
    // A deep body is parsed, stored and dropped on a stack big enough for it.
    json::with_stack_for(json::depth_of_bytes(&body), || dispatch(&ctx, path))
        .unwrap_or_else(|e| error_response(&e))
}

struct Ctx<'a> {
    inner: &'a Arc<Inner>,
    method: &'a Method,
    path: &'a str,
    query: &'a HashMap<String, String>,
    body: &'a Bytes,
    meta_only: bool,
}

fn ok_json(v: &Value) -> Result<Response, ApiError> {
    Ok(json_response(200, v.to_string().into()))
}

fn dispatch(ctx: &Ctx<'_>, path: &str) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let unknown = || ApiError::UnknownResource {
        path: path.to_owned(),
    };
    let is_get = *ctx.method == Method::GET;
    match segs.as_slice() {
        ["version"] if is_get => ok_json(&discovery::version(ctx.inner.server_version())),
        ["api"] if is_get => ok_json(&discovery::api_versions(&ctx.inner.addr_string())),
        ["apis"] if is_get => ok_json(&discovery::api_group_list(&ctx.inner.store().registry)),
        ["apis", group] if is_get => {
            ok_json(&discovery::api_group(&ctx.inner.store().registry, group)?)
        }
        ["api", version] if is_get => ok_json(&discovery::resource_list(
            &ctx.inner.store().registry,
            "",
            version,
        )?),
        ["apis", group, version] if is_get => ok_json(&discovery::resource_list(
            &ctx.inner.store().registry,
            group,
            version,
        )?),
        ["openapi", "v3"] if is_get => ok_json(&openapi::root(&ctx.inner.store().registry)),
        ["openapi", "v3", "api", version] if is_get => ok_json(&openapi::group_version(
            &ctx.inner.store().registry,
            "",
            version,
        )?),
        ["openapi", "v3", "apis", group, version] if is_get => ok_json(&openapi::group_version(
            &ctx.inner.store().registry,
            group,
            version,
        )?),
        ["apis", access_review::GROUP, access_review::VERSION, access_review::PLURAL] => {
            if *ctx.method != Method::POST {
                return Err(ApiError::MethodNotAllowed);
            }
            let review = access_review::parse(ctx.body)?;
            let answer = access_review::review(&ctx.inner.faults, &review)?;
            Ok(json_response(201, answer.to_string().into()))
        }
        ["api", version, rest @ ..] => resource_request(ctx, "", version, rest),
        ["apis", group, version, rest @ ..] => resource_request(ctx, group, version, rest),
        _ => Err(unknown()),
    }
}

fn resource_request(
    ctx: &Ctx<'_>,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response, ApiError> {
    let lookup = |plural: &str| {
        ctx.inner
            .store()
            .registry
            .by_path(group, version, plural)
            .ok_or_else(|| ApiError::UnknownResource {
                path: format!("{group}/{version}/{plural}"),
            })
    };
    let (rt, ns, name) = match rest {
        ["namespaces", ns, plural] => (lookup(plural)?, Some(*ns), None),
        ["namespaces", ns, plural, name] => (lookup(plural)?, Some(*ns), Some(*name)),
        [plural] => (lookup(plural)?, None, None),
        [plural, name] => (lookup(plural)?, None, Some(*name)),
        _ => {
            return Err(ApiError::UnknownResource {
                path: rest.join("/"),
            })
        }
    };
    if ns.is_some() && !rt.namespaced {
        return Err(ApiError::UnknownResource {
            path: rest.join("/"),
        });
    }
    match name {
        None => collection(ctx, rt, ns),
        Some(name) => item(ctx, &rt, ns, name),
    }
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    json::parse(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
}

fn collection(
    ctx: &Ctx<'_>,
    rt: Arc<ResourceType>,
    ns: Option<&str>,
) -> Result<Response, ApiError> {
    let watching = matches!(
        ctx.query.get("watch").map(String::as_str),
        Some("true" | "1")
    );
    match *ctx.method {
        Method::GET if watching => watch::watch(
            ctx.inner,
            ctx.path,
            rt,
            ns.map(str::to_owned),
            ctx.query,
            ctx.meta_only,
        ),
        Method::GET => list::list(ctx.inner, &rt, ns, ctx.query, ctx.meta_only),
        Method::POST if rt.namespaced && ns.is_none() => Err(ApiError::MethodNotAllowed),
        Method::POST => {
            let obj = parse_body(ctx.body)?;
            let stored = ctx.inner.store().create(&rt, ns, obj)?;
            Ok(json_response(201, render_object(&stored, ctx.meta_only)))
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

fn item(
    ctx: &Ctx<'_>,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
) -> Result<Response, ApiError> {
    if rt.namespaced && ns.is_none() {
        return Err(ApiError::UnknownResource {
            path: format!("{}/{name}", rt.plural),
        });
    }
    let namespace = ns.unwrap_or("");
    match *ctx.method {
        Method::GET => {
            let obj = ctx.inner.store().get(rt, namespace, name)?;
            Ok(json_response(200, render_object(&obj, ctx.meta_only)))
        }
        Method::PUT => {
            let obj = parse_body(ctx.body)?;
            let stored = ctx.inner.store().replace(rt, ns, Some(name), obj)?;
            Ok(json_response(200, render_object(&stored, ctx.meta_only)))
        }
        Method::PATCH => {
            let stored = patch::patch(&mut ctx.inner.store(), rt, namespace, name, ctx.body)?;
            Ok(json_response(200, render_object(&stored, ctx.meta_only)))
        }
        Method::DELETE => {
            let deleted = ctx.inner.store().delete(rt, namespace, name)?;
            if rt.is_custom() {
                // Custom resources answer a Success Status, as in custom_resource_definition-test.json.
                let status = json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": deleted.uid}
                });
                return ok_json(&status);
            }
            Ok(json_response(200, render_object(&deleted, ctx.meta_only)))
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}
