//! The sink against a scripted local receiver (axum): each answer of the module's table, the
//! splitting of a refused batch, per-key order under failures, binary-mode headers. The real
//! receiver (the CloudEvents Go SDK) is in `tests/http.rs`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes as Body;
use axum::extract::State;
use axum::http::{HeaderMap as AxumHeaders, StatusCode as AxumStatus};
use axum::response::{IntoResponse, Response};
use kubesink_core::message::fixtures::change;
use kubesink_core::message::{encode, Change, ObjectJson, Op, Resource};
use kubesink_core::{Destination, Message, Sink, SinkError};

use super::*;
use crate::{HttpConfig, HttpFormat};

/// One scripted answer: status and `Retry-After`.
type Answer = (u16, Option<&'static str>);

#[derive(Default)]
struct Script {
    /// Answers in order; then 202.
    answers: VecDeque<Answer>,
    /// A body containing this is refused with 400 (a "poison" message).
    refuse_containing: Option<&'static str>,
    /// Every request: headers and body.
    seen: Vec<(AxumHeaders, Body)>,
}

type Shared = Arc<Mutex<Script>>;

async fn handle(State(script): State<Shared>, headers: AxumHeaders, body: Body) -> Response {
    let mut s = script.lock().unwrap();
    s.seen.push((headers, body.clone()));
    let poison = s
        .refuse_containing
        .is_some_and(|p| String::from_utf8_lossy(&body).contains(p));
    if poison {
        return (AxumStatus::BAD_REQUEST, "field spec is invalid").into_response();
    }
    match s.answers.pop_front() {
        Some((status, retry)) => {
            let mut r = (AxumStatus::from_u16(status).unwrap(), "scripted").into_response();
            if let Some(after) = retry {
                r.headers_mut()
                    .insert("retry-after", after.parse().unwrap());
            }
            r
        }
        None => AxumStatus::ACCEPTED.into_response(),
    }
}

async fn receiver(script: Script) -> (String, Shared) {
    let shared = Arc::new(Mutex::new(script));
    let app = axum::Router::new()
        .route("/events", axum::routing::post(handle))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/events"), shared)
}

fn msg(name: &str, rv: u32) -> Message {
    let r = Arc::new(Resource::new("prod", "", "v1", "Pod", "pods", true));
    let op = if rv == 1 { Op::Added } else { Op::Updated };
    let object = ObjectJson::from_trusted(format!(r#"{{"n":"{name} é"}}"#));
    let c = Change {
        uid: format!("uid-{name}"),
        resource_version: rv.to_string(),
        ..change(op, Some("default"), name, Some(object))
    };
    encode(&r, &c, "2026-12-05T10:00:00.000Z").unwrap()
}

fn sink(url: &str, format: HttpFormat) -> HttpSink {
    let mut c = HttpConfig::new(url);
    c.format = format;
    c.timeout = kubesink_core::units::HumanDuration::from_millis(2000);
    c.build_sink(0).unwrap()
}

fn names(seen: &[(AxumHeaders, Body)]) -> Vec<String> {
    seen.iter()
        .flat_map(|(_, b)| {
            let text = String::from_utf8_lossy(b).into_owned();
            text.match_indices("\"name\":\"")
                .map(|(i, _)| {
                    let rest = &text[i + 8..];
                    rest[..rest.find('"').unwrap()].to_owned()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn binary_mode_sends_the_attributes_as_ce_headers_and_the_message_as_the_body() {
    let (url, script) = receiver(Script::default()).await;
    let s = sink(&url, HttpFormat::CloudEvents);
    let m = msg("web-1", 1);
    s.send(std::slice::from_ref(&m)).await.unwrap();
    let seen = &script.lock().unwrap().seen;
    let (h, body) = &seen[0];
    assert_eq!(body, &m.payload);
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(h["ce-specversion"], "1.0");
    assert_eq!(h["ce-id"], &*m.meta.id);
    assert_eq!(h["ce-type"], "io.kubesink.topology.added");
    assert_eq!(h["ce-subject"], &*m.key);
    assert_eq!(h["ce-source"], "kubesink://prod");
    assert!(
        h.get("ce-datacontenttype").is_none(),
        "Content-Type carries it"
    );
    assert!(h["user-agent"].to_str().unwrap().starts_with("kubesink/"));
}

#[tokio::test]
async fn batched_modes_fill_bodies_up_to_the_bound_in_order() {
    for format in [HttpFormat::CloudEventsBatch, HttpFormat::JsonLines] {
        let (url, script) = receiver(Script::default()).await;
        let mut c = HttpConfig::new(&url);
        c.format = format;
        c.max_body_bytes = kubesink_core::units::ByteSize(16 * 1024);
        let s = c.build_sink(0).unwrap();
        let batch: Vec<Message> = (0..200).map(|i| msg(&format!("p{i}"), 1)).collect();
        s.send(&batch).await.unwrap();
        let seen = &script.lock().unwrap().seen;
        assert!(seen.len() > 1, "{format:?}: 200 messages do not fit 16 KiB");
        for (h, b) in seen {
            assert!(b.len() <= 16 * 1024);
            let ct = h["content-type"].to_str().unwrap();
            match format {
                HttpFormat::JsonLines => assert_eq!(ct, "application/x-ndjson"),
                _ => {
                    assert_eq!(ct, "application/cloudevents-batch+json");
                    let v: serde_json::Value = serde_json::from_slice(b).unwrap();
                    assert!(v.as_array().is_some_and(|a| a[0]["specversion"] == "1.0"));
                }
            }
        }
        let expected: Vec<String> = (0..200).map(|i| format!("p{i}")).collect();
        assert_eq!(
            names(seen),
            expected,
            "{format:?}: every message once, in order"
        );
    }
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_and_a_500_is_transient() {
    let (url, _script) = receiver(Script {
        answers: [(429, Some("7")), (500, None)].into(),
        ..Script::default()
    })
    .await;
    let s = sink(&url, HttpFormat::CloudEventsBatch);
    match s.send(&[msg("a", 1)]).await {
        Err(SinkError::Transient {
            retry_after,
            message,
            ..
        }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(7)));
            assert!(message.contains("429"), "{message}");
        }
        other => panic!("429: {other:?}"),
    }
    assert!(
        s.healthcheck().await.is_err(),
        "not ready after a failed request"
    );
    match s.send(&[msg("a", 1)]).await {
        Err(SinkError::Transient {
            retry_after: None, ..
        }) => {}
        other => panic!("500: {other:?}"),
    }
    s.send(&[msg("a", 1)]).await.unwrap();
    s.healthcheck().await.unwrap();
}

#[tokio::test]
async fn credentials_url_and_media_type_answers_need_an_operator() {
    for status in [401, 403, 404, 415] {
        let (url, _script) = receiver(Script {
            answers: [(status, None)].into(),
            ..Script::default()
        })
        .await;
        let s = sink(&url, HttpFormat::CloudEvents);
        let err = s.send(&[msg("a", 1)]).await.unwrap_err();
        assert!(err.is_fatal(), "{status}: {err}");
        assert_eq!(s.rejected(), 0);
    }
}

#[tokio::test]
async fn a_refused_message_is_isolated_by_splitting_counted_and_not_sent_again() {
    let (url, script) = receiver(Script {
        refuse_containing: Some("\"name\":\"bad\""),
        ..Script::default()
    })
    .await;
    let s = sink(&url, HttpFormat::CloudEventsBatch);
    let mut batch: Vec<Message> = (0..16).map(|i| msg(&format!("p{i}"), 1)).collect();
    batch.insert(11, msg("bad", 1));
    s.send(&batch).await.unwrap();
    assert_eq!(s.rejected(), 1);
    let script = script.lock().unwrap();
    let accepted: Vec<String> = script
        .seen
        .iter()
        .filter(|(_, b)| !String::from_utf8_lossy(b).contains("\"name\":\"bad\""))
        .flat_map(|x| names(std::slice::from_ref(x)))
        .collect();
    let expected: Vec<String> = (0..16).map(|i| format!("p{i}")).collect();
    assert_eq!(
        accepted, expected,
        "every other message accepted once, in order"
    );
    // 17 messages: the whole, then halves down to the one: at most 2·log2(17)+1 requests.
    assert!(script.seen.len() <= 11, "{} requests", script.seen.len());
}

#[tokio::test]
async fn one_event_modes_refuse_a_message_alone_and_keep_each_keys_order_on_failure() {
    let (url, script) = receiver(Script {
        refuse_containing: Some("\"name\":\"bad\""),
        ..Script::default()
    })
    .await;
    let s = sink(&url, HttpFormat::CloudEventsStructured);
    s.send(&[msg("a", 1), msg("bad", 1), msg("a", 2)])
        .await
        .unwrap();
    assert_eq!(s.rejected(), 1);
    assert_eq!(script.lock().unwrap().seen.len(), 3);

    // A 503 for the first request: whichever key it hit, that key's later message is not
    // sent, the other key's are; the failed ones come back as a partial failure.
    let (url, script) = receiver(Script {
        answers: [(503, Some("1"))].into(),
        ..Script::default()
    })
    .await;
    let mut c = HttpConfig::new(&url);
    c.requests_in_flight = 1;
    let s = c.build_sink(0).unwrap();
    let batch = [msg("a", 1), msg("b", 1), msg("a", 2), msg("b", 2)];
    match s.send(&batch).await {
        Err(SinkError::Partial { failed, .. }) => assert_eq!(failed, [0, 2]),
        other => panic!("{other:?}"),
    }
    assert_eq!(names(&script.lock().unwrap().seen), ["a", "b", "b"]);
}

#[tokio::test]
async fn a_failed_request_of_a_batched_send_returns_it_and_everything_after_it() {
    let (url, _script) = receiver(Script {
        answers: [(202, None), (502, None)].into(),
        ..Script::default()
    })
    .await;
    let mut c = HttpConfig::new(&url);
    c.format = HttpFormat::JsonLines;
    c.max_body_bytes = kubesink_core::units::ByteSize(16 * 1024);
    let s = c.build_sink(0).unwrap();
    let batch: Vec<Message> = (0..200).map(|i| msg(&format!("p{i}"), 1)).collect();
    match s.send(&batch).await {
        Err(SinkError::Partial { failed, .. }) => {
            assert!(failed[0] > 0 && failed.len() < 200);
            assert_eq!(failed, (failed[0]..200).collect::<Vec<_>>());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_413_for_one_message_goes_to_the_oversize_policy() {
    let (url, _script) = receiver(Script {
        answers: [(413, None)].into(),
        ..Script::default()
    })
    .await;
    let s = sink(&url, HttpFormat::CloudEvents);
    match s.send(&[msg("a", 1)]).await {
        Err(SinkError::TooLarge { index: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.max_message_bytes(),
        Some((1 << 20) - crate::ENVELOPE_ROOM)
    );
}

#[tokio::test]
async fn a_stalled_receiver_times_out_and_a_closed_port_is_transient() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts, never answers.
    let _held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let mut c = HttpConfig::new(format!("http://{addr}/events"));
    c.timeout = kubesink_core::units::HumanDuration::from_millis(300);
    let err = c
        .build_sink(0)
        .unwrap()
        .send(&[msg("a", 1)])
        .await
        .unwrap_err();
    assert!(
        matches!(err, SinkError::Transient { .. }) && err.to_string().contains("timed out"),
        "{err}"
    );

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = sink(&format!("http://{closed}/"), HttpFormat::CloudEvents)
        .send(&[msg("a", 1)])
        .await
        .unwrap_err();
    assert!(matches!(err, SinkError::Transient { .. }), "{err}");
}

#[test]
fn retry_after_takes_seconds_or_an_http_date() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let v = |s: &str| HeaderValue::from_str(s).unwrap();
    assert_eq!(retry_after(&v("120"), now), Some(Duration::from_secs(120)));
    let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
    assert_eq!(retry_after(&v(&later), now), Some(Duration::from_secs(30)));
    let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
    assert_eq!(retry_after(&v(&past), now), Some(Duration::ZERO));
    assert_eq!(retry_after(&v("soon"), now), None);
    assert_eq!(retry_after(&v("-3"), now), None);
}

#[test]
fn packing_keeps_order_and_the_bound_and_puts_a_large_piece_alone() {
    let p = |n: usize| Bytes::from(vec![b'x'; n]);
    let pieces = [p(40), p(40), p(40), p(200), p(10)];
    // As send_batched measures a body: a separator each, two bytes of brackets.
    let sizes: Vec<usize> = pieces.iter().map(|p| p.len() + 1).collect();
    let body = |max: usize| max - 2;
    assert_eq!(pack(&sizes, body(100)), [(0, 2), (2, 3), (3, 4), (4, 5)]);
    assert_eq!(pack(&sizes, body(1000)), [(0, 5)]);
    assert!(pack(&[], body(100)).is_empty());
}

#[test]
fn the_configuration_names_each_problem() {
    let check = |c: HttpConfig| -> Vec<String> {
        c.validate(2).into_iter().map(|e| e.to_string()).collect()
    };
    let mut c = HttpConfig::new("ftp://x/");
    c.max_body_bytes = kubesink_core::units::ByteSize(100);
    c.requests_in_flight = 0;
    c.auth.username = Some("u".into());
    c.headers.insert(
        "Content-Type".into(),
        kubesink_core::Secret::new("text/plain"),
    );
    c.headers
        .insert("host".into(), kubesink_core::Secret::new("elsewhere"));
    let errors = check(c).join("\n");
    for want in [
        "sinks[2] (http): url: \"ftp://x/\": the scheme must be http:// or https://",
        "max_body_bytes: 100 bytes is below the minimum of 16 KiB",
        "requests_in_flight: 0 is outside 1 to 256",
        "headers.Content-Type: the sink sets this header itself",
        "headers.host: the sink sets this header itself",
    ] {
        assert!(errors.contains(want), "{want} in:\n{errors}");
    }
    let mut c = HttpConfig::new("https://user:pw@x/");
    c.auth.username = Some("u".into());
    let errors = check(c).join("\n");
    assert!(
        errors.contains("credentials in the URL are refused"),
        "{errors}"
    );
    assert!(
        errors.contains("auth.password: username needs a password"),
        "{errors}"
    );

    let mut c = HttpConfig::new("http://x/");
    c.auth.bearer_token = Some(kubesink_core::Secret::new("t"));
    assert!(check(c.clone()).is_empty());
    let warnings = c.warnings(0).join("\n");
    assert!(
        warnings.contains("credentials are sent over plain http://"),
        "{warnings}"
    );
    let err = HttpConfig {
        tls: crate::HttpTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        },
        ..HttpConfig::new("https://x/")
    }
    .build_sink(0)
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("tls.ca_file: /nonexistent/ca.pem"), "{err}");
}

#[test]
fn formats_read_and_write_their_spellings_and_an_unknown_one_names_the_key() {
    for f in HttpFormat::ALL {
        let v = serde_json::to_value(f).unwrap();
        assert_eq!(v, f.as_str());
        assert_eq!(serde_json::from_value::<HttpFormat>(v).unwrap(), f);
    }
    let err = serde_json::from_str::<HttpConfig>(r#"{"url":"http://x/","format":"xml"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("format: unknown value \"xml\"; expected \"cloudevents\" or"),
        "{err}"
    );
}
