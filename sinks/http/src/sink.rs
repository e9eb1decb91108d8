//! The HTTP sink's delivery: batches become POST requests in the configured format, each
//! answer is classified once ([`answer`]), and the batch's outcome is told to the pipeline as
//! the [`Sink`] contract asks (what was confirmed, what to send again, with the receiver's
//! `Retry-After`).
//!
//! - **Order per key.** One-event formats send a batch's keys concurrently (at most
//!   `requests_in_flight` requests) but each key's messages one after the other, the next only
//!   once the receiver answered the previous with 2xx. Batched formats send one request at a
//!   time, in batch order.
//! - **At-least-once.** A batch is confirmed only for the messages whose request got a 2xx.
//!   A request whose answer was lost (timeout, dropped connection) is sent again with the
//!   same CloudEvent `id`, the receiver's idempotency key.
//! - **What the answer means** (RFC 9110 §15):
//!
//!   | answer | meaning | what the sink does |
//!   |---|---|---|
//!   | 2xx | accepted | confirmed |
//!   | 408, 425, 429, 5xx, no answer (connect error, timeout, dropped connection) | try later | retried; `Retry-After` (seconds or HTTP-date) is the pipeline's next delay, up to `retry_max_backoff` |
//!   | 413 | too large | a multi-message body is split in two and sent again at once; a single message goes to the oversize policy |
//!   | 401, 403, 404, 405, 407, 410, 415, 421, 3xx, a certificate refused | needs an operator | retried at the maximum backoff, nothing dropped |
//!   | any other 4xx (400, 409, 422…) | the message is refused | a multi-message body is split in two until the refused message is alone; that one is logged at ERROR, counted (`kubesink_sink_rejected_messages_total`) and not sent again |
//!
//! The one-request-per-event formats with a refused message: the same, without splitting.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use kubesink_core::message::cloudevents::{
    attributes, percent_encode_header, structured, BATCH_CONTENT_TYPE, STRUCTURED_CONTENT_TYPE,
};
use kubesink_core::message::CONTENT_TYPE_JSON;
use kubesink_core::{Message, ReadySignal, Sink, SinkError};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;

use crate::format::{HttpFormat, ENVELOPE_ROOM};
use crate::health::Health;

/// The content type of a JSON Lines body.
pub const JSON_LINES_CONTENT_TYPE: &str = "application/x-ndjson";

/// How much of a failed answer's body goes into the error and the log.
const ANSWER_EXCERPT: usize = 300;

/// The header name of each attribute of [`attributes`] in the HTTP binding's binary content
/// mode (§3.1.3: `ce-{attribute}`), `datacontenttype` excepted: it is `Content-Type`.
const HTTP_NAMES: [Option<&str>; 8] = [
    Some("ce-specversion"),
    Some("ce-id"),
    Some("ce-source"),
    Some("ce-type"),
    Some("ce-subject"),
    Some("ce-time"),
    None,
    Some("ce-dataschema"),
];

/// What `build()` resolved from the configuration.
pub(crate) struct Settings {
    pub name: String,
    pub client: reqwest::Client,
    pub url: reqwest::Url,
    pub health_url: Option<reqwest::Url>,
    pub format: HttpFormat,
    pub max_body_bytes: usize,
    pub requests_in_flight: usize,
}

/// The HTTP sink (`[[sinks]]` with `type = "http"`); see the module documentation.
pub struct HttpSink {
    s: Settings,
    /// The receiver's outages and operator answers: the log, and the readiness without
    /// `health_url`.
    health: Health,
    rejected: AtomicU64,
}

/// How a request ended when it did not end with a 2xx (the module documentation's table).
/// Shared with the OTLP destination, whose OTLP/HTTP requests are answered the same way.
#[derive(Debug)]
pub enum Failure {
    /// Try later: no answer, or 408, 425, 429, 5xx; `retry_after` from the answer.
    Retry {
        /// What happened, naming the URL.
        message: String,
        /// The answer's `Retry-After`.
        retry_after: Option<Duration>,
        /// The status the receiver answered with; `None`: no answer (it is unreachable).
        status: Option<u16>,
    },
    /// 413: the body is too large for the receiver.
    TooLarge {
        /// What happened, naming the URL.
        message: String,
    },
    /// The receiver refuses the body's messages for good (a 4xx not listed elsewhere).
    Refused {
        /// What happened, naming the URL, with the answer's first bytes.
        message: String,
    },
    /// An operator is needed (credentials, URL, TLS, content type).
    Fatal {
        /// What happened, naming the URL.
        message: String,
    },
}

impl Failure {
    /// What happened, naming the URL.
    pub fn message(&self) -> &str {
        match self {
            Failure::Retry { message, .. }
            | Failure::TooLarge { message }
            | Failure::Refused { message }
            | Failure::Fatal { message } => message,
        }
    }
}

impl HttpSink {
    pub(crate) fn new(s: Settings) -> Self {
        // Without `health_url`, a receiver out of reach is probed with a TCP connection
        // (`Health::listens_again`), but one answering with errors waits out the pipeline's
        // backoff (up to `pipeline.retry_max_backoff`) before the next request finds it well:
        // the log says how to resume as soon as it is.
        let retrying = match s.health_url {
            Some(_) => "retrying with the pipeline's backoff, cut short when health_url answers",
            None => "retrying with the pipeline's backoff; one out of reach is retried as soon as it accepts connections again, one answering with errors up to pipeline.retry_max_backoff after it is well (set health_url to resume as soon as it is)",
        };
        let health = Health::new(&s.name, "HTTP receiver", retrying);
        HttpSink {
            s,
            health,
            rejected: AtomicU64::new(0),
        }
    }

    /// The request body of one message alone (one-event formats), or its piece of a batched
    /// body (without separators).
    fn piece(&self, m: &Message) -> Bytes {
        match self.s.format {
            HttpFormat::CloudEvents | HttpFormat::JsonLines => m.payload.clone(),
            HttpFormat::CloudEventsStructured | HttpFormat::CloudEventsBatch => structured(m),
        }
    }

    fn content_type(&self) -> &'static str {
        match self.s.format {
            HttpFormat::CloudEvents => CONTENT_TYPE_JSON,
            HttpFormat::CloudEventsStructured => STRUCTURED_CONTENT_TYPE,
            HttpFormat::CloudEventsBatch => BATCH_CONTENT_TYPE,
            HttpFormat::JsonLines => JSON_LINES_CONTENT_TYPE,
        }
    }

    /// The request's own headers: `Content-Type`, and in binary mode the `ce-` attributes
    /// (values percent-encoded, HTTP binding §3.1.3.2).
    fn headers(&self, m: Option<&Message>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(self.content_type()));
        if let (HttpFormat::CloudEvents, Some(m)) = (self.s.format, m) {
            for ((_, value), name) in attributes(m).into_iter().zip(HTTP_NAMES) {
                let Some(name) = name else { continue };
                // Percent-encoded values are printable ASCII: always a valid header value.
                if let Ok(v) = HeaderValue::from_str(&percent_encode_header(&value)) {
                    h.insert(HeaderName::from_static(name), v);
                }
            }
        }
        h
    }

    /// One POST; `Ok` for a 2xx.
    async fn post(&self, body: Bytes, headers: HeaderMap) -> Result<(), Failure> {
        let sent = self
            .s
            .client
            .post(self.s.url.clone())
            .headers(headers)
            .body(body)
            .send()
            .await;
        let result = match sent {
            Ok(response) => match classify(&self.s.url, response).await {
                Ok(response) => {
                    drain(response).await;
                    Ok(())
                }
                Err(f) => Err(f),
            },
            Err(e) => Err(transport(&self.s.url, &e)),
        };
        self.health.record(&result);
        result
    }

    /// A message the receiver refused for good: logged, counted, not sent again.
    fn refused(&self, m: &Message, message: &str) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::error!(sink = %self.s.name, key = %m.key, id = %m.meta.id, op = m.meta.op.as_str(), answer = message, "the receiver refused the message for good: it is not sent again (kubesink_sink_rejected_messages_total)");
    }

    /// One event per request: keys concurrently, each key's messages in order.
    async fn send_each(&self, batch: &[Message]) -> Result<(), SinkError> {
        let mut chains: Vec<Vec<usize>> = Vec::new();
        let mut by_key: HashMap<&str, usize> = HashMap::new();
        for (i, m) in batch.iter().enumerate() {
            let chain = *by_key.entry(&m.key).or_insert_with(|| {
                chains.push(Vec::new());
                chains.len() - 1
            });
            chains[chain].push(i);
        }
        let limit = self.s.max_body_bytes;
        let failed: Vec<(usize, Failure)> = futures::stream::iter(chains)
            .map(|chain| async move {
                let mut out = Vec::new();
                for (pos, &i) in chain.iter().enumerate() {
                    let m = &batch[i];
                    let body = self.piece(m);
                    let result = if body.len() > limit {
                        Err(Failure::TooLarge {
                            message: format!(
                                "{} bytes is above max_body_bytes ({limit})",
                                body.len()
                            ),
                        })
                    } else {
                        self.post(body, self.headers(Some(m))).await
                    };
                    match result {
                        Ok(()) => {}
                        Err(Failure::Refused { message }) => self.refused(m, &message),
                        Err(f) => {
                            // This key's later messages wait for this one.
                            let cause = f.message().to_owned();
                            out.push((i, f));
                            out.extend(chain[pos + 1..].iter().map(|&j| {
                                let message =
                                    format!("waits for an earlier message of its key: {cause}");
                                (
                                    j,
                                    Failure::Retry {
                                        message,
                                        retry_after: None,
                                        status: None,
                                    },
                                )
                            }));
                            break;
                        }
                    }
                }
                out
            })
            .buffer_unordered(self.s.requests_in_flight)
            .flat_map(futures::stream::iter)
            .collect()
            .await;
        outcome(&self.s.name, batch, failed)
    }

    /// Many messages per request, one request at a time in batch order. A refused or too
    /// large body of several messages is split in two, first half first, until the message
    /// the receiver refuses is alone.
    async fn send_batched(&self, batch: &[Message]) -> Result<(), SinkError> {
        let pieces: Vec<Bytes> = batch.iter().map(|m| self.piece(m)).collect();
        // A separator (`,` or `\n`) each, and two bytes of brackets.
        let sizes: Vec<usize> = pieces.iter().map(|p| p.len() + 1).collect();
        let max = self.s.max_body_bytes;
        let ranges = pack(&sizes, max.saturating_sub(2));
        send_in_order(
            &self.s.name,
            batch,
            ranges,
            |start, end| {
                let body = self.join(&pieces[start..end]);
                async move {
                    if body.len() > max {
                        return Err(Failure::TooLarge {
                            message: format!(
                                "{} bytes is above max_body_bytes ({max})",
                                body.len()
                            ),
                        });
                    }
                    self.post(body, self.headers(None)).await
                }
            },
            |m, message| self.refused(m, message),
        )
        .await
    }

    /// A batched body of `pieces`: a JSON array, or lines.
    fn join(&self, pieces: &[Bytes]) -> Bytes {
        let mut out = Vec::with_capacity(pieces.iter().map(|p| p.len() + 1).sum::<usize>() + 2);
        match self.s.format {
            HttpFormat::JsonLines => {
                for p in pieces {
                    out.extend_from_slice(p);
                    out.push(b'\n');
                }
            }
            _ => {
                out.push(b'[');
                for (i, p) in pieces.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(p);
                }
                out.push(b']');
            }
        }
        Bytes::from(out)
    }
}

/// Splits a batch whose messages take `sizes` bytes in a request body into consecutive
/// ranges whose sum stays within `max`; a message larger than that alone is a range of its
/// own. Shared with the OTLP destination.
pub fn pack(sizes: &[usize], max: usize) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    let (mut start, mut total) = (0, 0);
    for (i, s) in sizes.iter().enumerate() {
        if i > start && total + s > max {
            ranges.push((start, i));
            (start, total) = (i, 0);
        }
        total += s;
    }
    if start < sizes.len() {
        ranges.push((start, sizes.len()));
    }
    ranges
}

/// Sends the consecutive `ranges` of `batch` (from [`pack`]) one request at a time, in
/// order, with `send(start, end)`. A refused or too large request of several messages is
/// split in two, first half first, until the message the receiver refuses is alone, which
/// goes to `refused` (and counts as delivered); any other failure returns that request and
/// everything after it ([`outcome`]). The batched path of both the HTTP and the OTLP sink.
///
/// # Errors
/// What [`outcome`] makes of the first failure.
pub async fn send_in_order<F, Fut>(
    sink: &str,
    batch: &[Message],
    ranges: Vec<(usize, usize)>,
    mut send: F,
    refused: impl Fn(&Message, &str),
) -> Result<(), SinkError>
where
    F: FnMut(usize, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), Failure>>,
{
    let mut todo: VecDeque<(usize, usize)> = ranges.into();
    while let Some((start, end)) = todo.pop_front() {
        match send(start, end).await {
            Ok(()) => {}
            Err(Failure::Refused { .. } | Failure::TooLarge { .. }) if end - start > 1 => {
                let mid = start + (end - start) / 2;
                todo.push_front((mid, end));
                todo.push_front((start, mid));
            }
            Err(Failure::Refused { message }) => refused(&batch[start], &message),
            Err(f) => {
                let message = format!(
                    "not sent: an earlier request of the batch failed: {}",
                    f.message()
                );
                let mut failed = vec![(start, f)];
                failed.extend((start + 1..batch.len()).map(|j| {
                    (
                        j,
                        Failure::Retry {
                            message: message.clone(),
                            retry_after: None,
                            status: None,
                        },
                    )
                }));
                return outcome(sink, batch, failed);
            }
        }
    }
    Ok(())
}

/// The error for a batch whose messages `failed` (ascending) were not confirmed, the
/// others were (or were refused for good): the whole-batch kind when nothing got
/// through, else [`SinkError::Partial`].
pub fn outcome(
    sink: &str,
    batch: &[Message],
    mut failed: Vec<(usize, Failure)>,
) -> Result<(), SinkError> {
    if failed.is_empty() {
        return Ok(());
    }
    failed.sort_by_key(|(i, _)| *i);
    let name = sink;
    if failed.len() < batch.len() {
        return Err(SinkError::Partial {
            sink: name.to_owned(),
            message: failed[0].1.message().to_owned(),
            failed: failed.into_iter().map(|(i, _)| i).collect(),
        });
    }
    if let Some((index, _)) = failed
        .iter()
        .find(|(_, f)| matches!(f, Failure::TooLarge { .. }))
    {
        return Err(SinkError::TooLarge {
            sink: name.to_owned(),
            index: *index,
            size: batch[*index].payload.len(),
            limit: None,
        });
    }
    if let Some((_, f)) = failed
        .iter()
        .find(|(_, f)| matches!(f, Failure::Fatal { .. }))
    {
        return Err(SinkError::fatal(name, f.message()));
    }
    let retry_after = failed
        .iter()
        .filter_map(|(_, f)| match f {
            Failure::Retry { retry_after, .. } => *retry_after,
            _ => None,
        })
        .max();
    Err(SinkError::Transient {
        sink: name.to_owned(),
        message: failed[0].1.message().to_owned(),
        retry_after,
    })
}

/// Reads what is left of an accepted answer's body (up to 64 KiB), so that the connection
/// goes back to the pool instead of being closed.
pub async fn drain(mut response: reqwest::Response) {
    let mut read = 0;
    while read < 64 * 1024 {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            Ok(None) | Err(_) => break,
        }
    }
}

/// Classifies an answer (module documentation's table): the response itself for a 2xx (its
/// body unread), else the [`Failure`], with `Retry-After` and the body's first bytes.
///
/// # Errors
/// The [`Failure`] of any answer other than 2xx.
pub async fn classify(
    url: &reqwest::Url,
    response: reqwest::Response,
) -> Result<reqwest::Response, Failure> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| retry_after(v, SystemTime::now()));
    let excerpt = excerpt(response).await;
    let message = format!("POST {url}: HTTP {status}{excerpt}");
    Err(match status {
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_EARLY | StatusCode::TOO_MANY_REQUESTS => {
            Failure::Retry {
                message,
                retry_after,
                status: Some(status.as_u16()),
            }
        }
        s if s.is_server_error() => Failure::Retry {
            message,
            retry_after,
            status: Some(s.as_u16()),
        },
        StatusCode::PAYLOAD_TOO_LARGE => Failure::TooLarge { message },
        StatusCode::UNAUTHORIZED
        | StatusCode::FORBIDDEN
        | StatusCode::NOT_FOUND
        | StatusCode::METHOD_NOT_ALLOWED
        | StatusCode::PROXY_AUTHENTICATION_REQUIRED
        | StatusCode::GONE
        | StatusCode::UNSUPPORTED_MEDIA_TYPE
        | StatusCode::MISDIRECTED_REQUEST => Failure::Fatal { message },
        s if s.is_client_error() => Failure::Refused { message },
        // 1xx and 3xx (redirects are not followed: the body would go where the
        // configuration does not say).
        _ => Failure::Fatal { message },
    })
}

/// Up to [`ANSWER_EXCERPT`] bytes of an answer's body, as `": text"`, read within the
/// request's timeout.
async fn excerpt(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < ANSWER_EXCERPT {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(ANSWER_EXCERPT);
    let text = String::from_utf8_lossy(&body);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {}", text.replace(['\n', '\r'], " "))
    }
}

/// A request that got no answer: a certificate refused needs an operator; anything else
/// (refused or dropped connection, timeout) is retried.
pub fn transport(url: &reqwest::Url, e: &reqwest::Error) -> Failure {
    let mut chain = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        chain.push_str(": ");
        chain.push_str(&s.to_string());
        source = s.source();
    }
    let what = if e.is_timeout() {
        "timed out"
    } else {
        "failed"
    };
    let message = format!("POST {url} {what}: {chain}");
    if chain.contains("certificate") || chain.contains("CertificateRequired") {
        Failure::Fatal { message }
    } else {
        Failure::Retry {
            message,
            retry_after: None,
            status: None,
        }
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): a number of seconds, or an HTTP-date (how long until
/// then, 0 when past).
pub fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[async_trait]
impl Sink for HttpSink {
    fn name(&self) -> &str {
        &self.s.name
    }

    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        if self.s.format.batched() {
            self.send_batched(batch).await
        } else {
            self.send_each(batch).await
        }
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        let name = &self.s.name;
        let Some(url) = &self.s.health_url else {
            if self.health.listens_again(&self.s.url).await {
                return Ok(());
            }
            return self.health.check(name, &self.s.url);
        };
        match self.s.client.get(url.clone()).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(SinkError::transient(
                name,
                format!("GET {url}: HTTP {}", r.status()),
            )),
            Err(e) => Err(SinkError::transient(
                name,
                transport(url, &e).message().replace("POST", "GET"),
            )),
        }
    }

    async fn close(&self) -> Result<(), SinkError> {
        Ok(())
    }

    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.s.max_body_bytes.saturating_sub(ENVELOPE_ROOM))
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
