//! The OTLP sink's delivery: a batch becomes one or more `ExportLogsServiceRequest`s
//! (protobuf, gzip) POSTed in order to `{endpoint}/v1/logs`, one at a time, so per-key order
//! holds. The answers follow the OTLP specification ("OTLP/HTTP Response", "Failures",
//! "Throttling"), read through the HTTP destination's classification:
//!
//! | answer | what the sink does |
//! |---|---|
//! | 2xx | confirmed; a `partial_success` with `rejected_log_records` > 0 means the Collector dropped that many for good: they are counted (`kubesink_sink_rejected_messages_total`) and its `error_message` logged, not sent again (the specification: MUST NOT retry) |
//! | 429, 502, 503, 504 (retryable per the specification), 408, 425, any other 5xx, no answer | retried with the pipeline's backoff; `Retry-After` honoured. The specification calls a 500 not retryable; kubesink retries it anyway, because dropping the topology on a Collector that crashed mid-request loses state no later change restores |
//! | 413 | a request of several records is split in two; a single record gets the oversize policy |
//! | 401, 403, 404, 405, 415… | an operator is needed: retried at the maximum backoff |
//! | 400 and other 4xx | the request is refused: split in two until the refused record is alone, which is counted and logged, not sent again |

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use kubesink_core::{Message, ReadySignal, Sink, SinkError};
use kubesink_http::{classify, pack, send_in_order, transport, Failure, Health};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;
use reqwest::header::{HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};

use crate::event::event_record;
use crate::wire::{encoded_log_record, field, frame, framed};

/// The content type of an OTLP/HTTP protobuf request.
pub const PROTOBUF: &str = "application/x-protobuf";

/// The OTLP sink (`[[sinks]]` with `type = "otlp"`); see the module documentation.
pub struct OtlpSink {
    name: String,
    client: reqwest::Client,
    url: reqwest::Url,
    gzip: bool,
    max_body_bytes: usize,
    health: Health,
    rejected: AtomicU64,
}

/// A record ready to send: its `Resource` and the `LogRecord`, each protobuf-encoded once (a
/// retry, or a request split after a 413, sends these bytes again).
struct Item {
    resource: std::sync::Arc<[u8]>,
    record: Vec<u8>,
}

/// An object's record's resource: its cluster and, for a namespaced object, its namespace.
type ResourceKey = (String, Option<String>);

impl OtlpSink {
    pub(crate) fn new(
        name: String,
        client: reqwest::Client,
        url: reqwest::Url,
        gzip: bool,
        max_body_bytes: usize,
    ) -> Self {
        let health = Health::new(
            &name,
            "OTLP endpoint",
            "retrying with the pipeline's backoff; one out of reach is retried as soon as it accepts connections again",
        );
        OtlpSink {
            name,
            client,
            url,
            gzip,
            max_body_bytes,
            health,
            rejected: AtomicU64::new(0),
        }
    }

    /// The encoded `ExportLogsServiceRequest` of `items`: one `ResourceLogs` per resource
    /// (an object's: its cluster and namespace; an Event occurrence's: the object it is
    /// about) in the order they first appear, each record in batch order within it (a key's
    /// records share a resource, so their order holds). Framed here around the records
    /// encoded once: the bytes prost writes for the same request (a unit test compares them),
    /// without copying each record's tree into a request and walking it again.
    fn request(items: &[Item]) -> Vec<u8> {
        let mut groups: Vec<(&[u8], Vec<&[u8]>)> = Vec::new();
        for item in items {
            match groups.iter_mut().find(|(r, _)| **r == *item.resource) {
                Some((_, records)) => records.push(&item.record),
                None => groups.push((&item.resource, vec![&item.record])),
            }
        }
        let scope = InstrumentationScope {
            name: "kubesink".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        }
        .encode_to_vec();
        let total: usize = items.iter().map(|i| framed(i.record.len())).sum();
        let mut out = Vec::with_capacity(total + groups.len() * 128);
        for (resource, records) in groups {
            let scope_logs =
                framed(scope.len()) + records.iter().map(|r| framed(r.len())).sum::<usize>();
            frame(
                &mut out,
                field::RESOURCE_LOGS,
                framed(resource.len()) + framed(scope_logs),
            );
            frame(&mut out, field::RESOURCE, resource.len());
            out.extend_from_slice(resource);
            frame(&mut out, field::SCOPE_LOGS, scope_logs);
            frame(&mut out, field::SCOPE, scope.len());
            out.extend_from_slice(&scope);
            for r in records {
                frame(&mut out, field::LOG_RECORDS, r.len());
                out.extend_from_slice(r);
            }
        }
        out
    }

    fn body(&self, items: &[Item]) -> Result<Bytes, Failure> {
        let raw = Self::request(items);
        if !self.gzip {
            return Ok(Bytes::from(raw));
        }
        let mut gz = flate2::write::GzEncoder::new(
            Vec::with_capacity(raw.len() / 4),
            flate2::Compression::fast(),
        );
        gz.write_all(&raw)
            .and_then(|()| gz.finish())
            .map(Bytes::from)
            .map_err(|e| Failure::Retry {
                message: format!("gzip: {e}"),
                retry_after: None,
                status: None,
            })
    }

    /// One export; on a 2xx, the count of records the endpoint rejected (partial success).
    async fn export(&self, items: &[Item]) -> Result<(), Failure> {
        let body = self.body(items)?;
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
        if self.gzip {
            request = request.header(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        let result = match request.body(body).send().await {
            Ok(response) => match classify(&self.url, response).await {
                Ok(response) => {
                    self.partial_success(response).await;
                    Ok(())
                }
                Err(f) => Err(f),
            },
            Err(e) => Err(transport(&self.url, &e)),
        };
        self.health.record(&result);
        result
    }

    /// Reads a 2xx answer: an `ExportLogsServiceResponse` whose `partial_success` names the
    /// records the endpoint dropped for good (an empty or unreadable body: none).
    async fn partial_success(&self, response: reqwest::Response) {
        let Ok(bytes) = response.bytes().await else {
            return;
        };
        let Ok(answer) = ExportLogsServiceResponse::decode(bytes) else {
            return;
        };
        if let Some(partial) = answer.partial_success {
            if partial.rejected_log_records > 0 {
                let n = u64::try_from(partial.rejected_log_records).unwrap_or(0);
                self.rejected.fetch_add(n, Ordering::Relaxed);
                tracing::error!(sink = %self.name, rejected = n, reason = %partial.error_message, "the OTLP endpoint dropped log records for good (partial success): they are not sent again (kubesink_sink_rejected_messages_total)");
            }
        }
    }

    fn refused(&self, m: &Message, message: &str) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::error!(sink = %self.name, key = %m.key, id = %m.meta.id, answer = message, "the OTLP endpoint refused the record for good: it is not sent again (kubesink_sink_rejected_messages_total)");
    }
}

/// An object's record's resource: `k8s.cluster.name` and, for a namespaced object,
/// `k8s.namespace.name`.
fn object_resource((cluster, namespace): &ResourceKey) -> Resource {
    let mut attributes = vec![attr("k8s.cluster.name", cluster)];
    if let Some(ns) = namespace {
        attributes.push(attr("k8s.namespace.name", ns));
    }
    Resource {
        attributes,
        ..Default::default()
    }
}

fn attr(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(
                opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                    value.to_owned(),
                ),
            ),
        }),
        ..Default::default()
    }
}

#[async_trait]
impl Sink for OtlpSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        let mut items = Vec::with_capacity(batch.len());
        // Objects' resources, encoded once per (cluster, namespace) of the batch.
        let mut resources: Vec<(ResourceKey, std::sync::Arc<[u8]>)> = Vec::new();
        for m in batch {
            let fatal = |e: serde_json::Error| {
                SinkError::fatal(&self.name, format!("message {}: {e}", m.meta.id))
            };
            if m.meta.resource.events {
                let (resource, record) = event_record(m).map_err(fatal)?;
                items.push(Item {
                    resource: resource.encode_to_vec().into(),
                    record: record.encode_to_vec(),
                });
                continue;
            }
            let record = encoded_log_record(m).map_err(fatal)?;
            let key = (
                m.meta.resource.cluster.clone(),
                m.meta.namespace.as_deref().map(str::to_owned),
            );
            let resource = match resources.iter().find(|(k, _)| *k == key) {
                Some((_, r)) => r.clone(),
                None => {
                    let r: std::sync::Arc<[u8]> = object_resource(&key).encode_to_vec().into();
                    resources.push((key, r.clone()));
                    r
                }
            };
            items.push(Item { resource, record });
        }
        let sizes: Vec<usize> = items.iter().map(|i| i.record.len() + 8).collect();
        let ranges = pack(&sizes, self.max_body_bytes.saturating_sub(1024));
        send_in_order(
            &self.name,
            batch,
            ranges,
            |start, end| self.export(&items[start..end]),
            |m, message| self.refused(m, message),
        )
        .await
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        if self.health.listens_again(&self.url).await {
            return Ok(());
        }
        self.health.check(&self.name, &self.url)
    }

    async fn close(&self) -> Result<(), SinkError> {
        Ok(())
    }

    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.max_body_bytes.saturating_sub(4096))
    }

    fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    fn health_signal(&self) -> Option<ReadySignal> {
        Some(self.health.signal())
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
