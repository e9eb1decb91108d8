//! The sink against a scripted OTLP endpoint (axum): the request's protobuf decoded back, the
//! k8sobjects shape, partial success, the answers. The real Collector is in `tests/otlp.rs`.

use std::sync::{Arc, Mutex};

use axum::body::Bytes as Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kubesink_core::message::fixtures::deployment_message;
use kubesink_core::message::Op;
use kubesink_core::{Sink, SinkError};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use prost::Message as _;

use crate::OtlpConfig;

#[derive(Default)]
struct Script {
    answers: Vec<(u16, Option<ExportLogsServiceResponse>)>,
    seen: Vec<(HeaderMap, ExportLogsServiceRequest)>,
}

async fn handle(State(s): State<Arc<Mutex<Script>>>, headers: HeaderMap, body: Body) -> Response {
    let raw = if headers.get("content-encoding").is_some_and(|v| v == "gzip") {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut out).unwrap();
        out
    } else {
        body.to_vec()
    };
    let req = ExportLogsServiceRequest::decode(&raw[..]).unwrap();
    let mut s = s.lock().unwrap();
    s.seen.push((headers, req));
    let (status, answer) = if s.answers.is_empty() {
        (200, None)
    } else {
        s.answers.remove(0)
    };
    let body = answer.unwrap_or_default().encode_to_vec();
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/x-protobuf")],
        body,
    )
        .into_response()
}

async fn endpoint(script: Script) -> (String, Arc<Mutex<Script>>) {
    let shared = Arc::new(Mutex::new(script));
    let app = axum::Router::new()
        .route("/v1/logs", axum::routing::post(handle))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), shared)
}

#[tokio::test]
async fn a_message_becomes_a_k8sobjects_shaped_record_and_reads_back_whole() {
    let (url, script) = endpoint(Script::default()).await;
    let sink = OtlpConfig::new(&url).build_sink(0).unwrap();
    let m = deployment_message(Op::Updated);
    sink.send(std::slice::from_ref(&m)).await.unwrap();
    let s = script.lock().unwrap();
    let (headers, req) = &s.seen[0];
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert_eq!(headers["content-encoding"], "gzip");
    let rl = &req.resource_logs[0];
    let res: Vec<(String, String)> = rl
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| {
            (
                kv.key.clone(),
                format!("{:?}", kv.value.as_ref().unwrap().value),
            )
        })
        .collect();
    assert!(
        res.iter()
            .any(|(k, v)| k == "k8s.cluster.name" && v.contains("prod")),
        "{res:?}"
    );
    assert!(
        res.iter()
            .any(|(k, v)| k == "k8s.namespace.name" && v.contains("web")),
        "{res:?}"
    );
    let rec = &rl.scope_logs[0].log_records[0];
    assert_eq!(rec.observed_time_unix_nano, 1_796_032_800_123_000_000);
    let body = format!("{:?}", rec.body);
    assert!(
        body.contains("MODIFIED") && body.contains("\"object\""),
        "{body}"
    );
    let keys: Vec<&str> = rec.attributes.iter().map(|a| a.key.as_str()).collect();
    for want in [
        "k8s.resource.name",
        "event.domain",
        "event.name",
        "kubesink.op",
        "kubesink.id",
        "kubesink.key",
        "kubesink.uid",
        "kubesink.resourceVersion",
    ] {
        assert!(keys.contains(&want), "{want} in {keys:?}");
    }

    // The OTLP JSON of the same request (what the Collector's file exporter writes) reads
    // back as the message itself.
    let otlp_json = serde_json::json!({"resourceLogs": [{
        "resource": {"attributes": [{"key": "k8s.cluster.name", "value": {"stringValue": "prod"}}]},
        "scopeLogs": [{"logRecords": [{
            "body": {"kvlistValue": {"values": [
                {"key": "type", "value": {"stringValue": "MODIFIED"}},
                {"key": "object", "value": {"kvlistValue": {"values": [{"key": "a", "value": {"stringValue": "x \"y\""}}, {"key": "n", "value": {"intValue": "7"}}]}}}
            ]}},
            "attributes": rec.attributes.iter().filter(|a| a.key.starts_with("kubesink.")).map(|a| {
                let v = match a.value.as_ref().unwrap().value.as_ref().unwrap() {
                    opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => serde_json::json!({"stringValue": s}),
                    opentelemetry_proto::tonic::common::v1::any_value::Value::BoolValue(b) => serde_json::json!({"boolValue": b}),
                    other => panic!("{other:?}"),
                };
                serde_json::json!({"key": a.key, "value": v})
            }).collect::<Vec<_>>()
        }]}]
    }]});
    let line = serde_json::to_vec(&otlp_json).unwrap();
    assert!(crate::reader::is_otlp_line(&line));
    let msgs = crate::reader::messages(&line).unwrap();
    let original: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
    let mut want = original.clone();
    want["object"] = serde_json::json!({"a": "x \"y\"", "n": 7});
    assert_eq!(msgs, [want]);
}

#[tokio::test]
async fn partial_success_is_counted_and_not_retried_and_answers_are_classified() {
    let partial = ExportLogsServiceResponse {
        partial_success: Some(ExportLogsPartialSuccess {
            rejected_log_records: 2,
            error_message: "bad attribute".into(),
        }),
    };
    let (url, script) = endpoint(Script {
        answers: vec![(200, Some(partial)), (503, None), (401, None), (400, None)],
        ..Script::default()
    })
    .await;
    let sink = OtlpConfig::new(&url).build_sink(0).unwrap();
    let m = deployment_message(Op::Added);
    sink.send(&[m.clone(), m.clone()]).await.unwrap();
    assert_eq!(sink.rejected(), 2);
    assert!(matches!(
        sink.send(std::slice::from_ref(&m)).await,
        Err(SinkError::Transient { .. })
    ));
    assert!(sink.healthcheck().await.is_err());
    assert!(sink
        .send(std::slice::from_ref(&m))
        .await
        .unwrap_err()
        .is_fatal());
    sink.send(std::slice::from_ref(&m)).await.unwrap();
    assert_eq!(
        sink.rejected(),
        3,
        "the 400 refused the one record for good"
    );
    assert_eq!(script.lock().unwrap().seen.len(), 4);
}

#[test]
fn the_logs_url_and_the_checks_speak_of_endpoint() {
    use kubesink_core::Destination;
    assert_eq!(
        OtlpConfig::new("http://c:4318/").logs_url(),
        "http://c:4318/v1/logs"
    );
    let errors: Vec<String> = OtlpConfig::new("ftp://c")
        .validate(1)
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.iter().any(|e| e
            .contains("sinks[1] (otlp): endpoint: \"ftp://c\" is not an http:// or https:// URL")),
        "{errors:?}"
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    let errors: Vec<String> = OtlpConfig::new("otel-collector:4318")
        .validate(0)
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains(
            "\"otel-collector:4318\" is not an http:// or https:// URL (is the scheme missing?)"
        ),
        "{errors:?}"
    );
    let errors: Vec<String> = OtlpConfig::new("http://c:4318/v1/logs")
        .validate(0)
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("ends with /v1/logs") && e.contains("use \"http://c:4318\"")),
        "{errors:?}"
    );
}

/// The request framed around records encoded once is the request prost encodes from the same
/// records: resources grouped in the order they first appear, records in batch order.
#[test]
fn the_framed_request_is_the_bytes_prost_writes() {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::resource::v1::Resource;

    let mut messages = Vec::new();
    for (i, op) in [Op::Added, Op::Updated, Op::Deleted, Op::Updated]
        .into_iter()
        .enumerate()
    {
        let mut m = deployment_message(op);
        if i % 2 == 1 {
            let meta = std::sync::Arc::make_mut(&mut m.meta);
            meta.namespace = Some(format!("ns-{i}").into());
        }
        messages.push(m);
    }
    let records: Vec<LogRecord> = messages
        .iter()
        .map(|m| crate::record::log_record(m).unwrap())
        .collect();
    let resources: Vec<(String, Option<String>)> = messages
        .iter()
        .map(|m| {
            (
                m.meta.resource.cluster.clone(),
                m.meta.namespace.as_deref().map(str::to_owned),
            )
        })
        .collect();
    let items: Vec<super::Item> = records
        .iter()
        .zip(&resources)
        .map(|(r, res)| super::Item {
            resource: super::object_resource(res).encode_to_vec().into(),
            record: r.encode_to_vec(),
        })
        .collect();

    let string = |s: &str| AnyValue {
        value: Some(
            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s.into()),
        ),
    };
    let mut expected = ExportLogsServiceRequest::default();
    let mut seen: Vec<&(String, Option<String>)> = Vec::new();
    for (record, resource) in records.iter().zip(&resources) {
        let at = match seen.iter().position(|r| *r == resource) {
            Some(at) => at,
            None => {
                seen.push(resource);
                let mut attributes = vec![KeyValue {
                    key: "k8s.cluster.name".into(),
                    value: Some(string(&resource.0)),
                    ..Default::default()
                }];
                if let Some(ns) = &resource.1 {
                    attributes.push(KeyValue {
                        key: "k8s.namespace.name".into(),
                        value: Some(string(ns)),
                        ..Default::default()
                    });
                }
                expected.resource_logs.push(ResourceLogs {
                    resource: Some(Resource {
                        attributes,
                        ..Default::default()
                    }),
                    scope_logs: vec![ScopeLogs {
                        scope: Some(InstrumentationScope {
                            name: "kubesink".into(),
                            version: env!("CARGO_PKG_VERSION").into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                });
                seen.len() - 1
            }
        };
        expected.resource_logs[at].scope_logs[0]
            .log_records
            .push(record.clone());
    }
    assert!(
        expected.resource_logs.len() >= 2,
        "the batch spans several resources"
    );
    assert_eq!(super::OtlpSink::request(&items), expected.encode_to_vec());
}
