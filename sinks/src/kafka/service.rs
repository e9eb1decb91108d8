//! The Kafka I/O: the librdkafka producer, delivery reports, backpressure, error
//! classification, healthcheck and flush.
//!
//! Owns the rule "a batch is confirmed only when every record's delivery report is a
//! success". Must never drop a record silently, busy-loop on `QueueFull`, or log a secret
//! (librdkafka's own log lines never contain property values).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::ClientContext;

use super::config::{KafkaConfig, RenderedConfig};
use super::request::{self, TopicTemplate, MAX_TOPIC_LEN};
use crate::{Message, Op, Sink, SinkError};

/// Bytes of `message.max.bytes` kept for the key, the headers and the record overhead; the
/// payload limit declared to the pipeline is the rest.
pub const RECORD_OVERHEAD_BYTES: usize = 2048;

/// How one failed record is classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The record exceeds a size limit (librdkafka `message.max.bytes` or the topic's
    /// `max.message.bytes`): the shared oversize policy applies.
    TooLarge,
    /// Needs an operator: authorization, authentication, unknown or invalid topic, TLS, or a
    /// fatal producer error.
    Fatal(String),
    /// Anything time can fix: broker down, timeout, leader change, throttling.
    Transient(String),
}

/// Classifies a produce or delivery error (librdkafka error codes, `rdkafka_error_code()`).
pub fn classify(e: &KafkaError, topic: &str) -> Failure {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(C::MessageSizeTooLarge) => Failure::TooLarge,
        Some(
            C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed,
        ) => Failure::Fatal(format!(
            "not authorized to produce to topic {topic:?} ({e}): check the principal's ACLs (WRITE and DESCRIBE on the topic, IDEMPOTENT_WRITE on the cluster for the idempotent producer)"
        )),
        Some(C::SaslAuthenticationFailed | C::Authentication) => Failure::Fatal(format!(
            "authentication failed ({e}): check security.sasl_mechanism, sasl_username and sasl_password"
        )),
        Some(C::UnknownTopic | C::UnknownTopicOrPartition) => Failure::Fatal(format!(
            "topic {topic:?} does not exist and the brokers do not auto-create it ({e}): create it (docs/kafka.md) or fix `topic`"
        )),
        Some(C::InvalidTopic) => Failure::Fatal(format!("topic {topic:?} is invalid ({e})")),
        Some(C::SSL) => Failure::Fatal(format!(
            "TLS error ({e}): check security.ssl_ca_location and the client certificate"
        )),
        Some(C::Fatal) => Failure::Fatal(format!("fatal producer error ({e}); the producer is recreated")),
        Some(c) if needs_new_producer(c) => Failure::Transient(format!(
            "{e} (topic {topic:?}): the broker lost or fenced this producer's id; the producer is recreated"
        )),
        _ => Failure::Transient(format!("{e} (topic {topic:?})")),
    }
}

/// Errors after which the idempotent producer's id, epoch or sequence state is unusable:
/// the sink replaces the producer (a fresh one gets a new producer id). Seen with brokers
/// that lose producer state across an outage (tansu answers `PRODUCER_FENCED`).
pub fn needs_new_producer(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::Fatal
            | C::ProducerFenced
            | C::InvalidProducerEpoch
            | C::OutOfOrderSequenceNumber
            | C::InvalidProducerIdMapping
            | C::UnknownProducerId
    )
}

/// librdkafka callbacks: its log lines and client errors go to `tracing`, tagged with the
/// sink name.
pub struct KafkaContext {
    sink: String,
}

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        use RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(sink = %self.sink, facility = fac, "librdkafka: {log_message}")
            }
            L::Warning => {
                tracing::warn!(sink = %self.sink, facility = fac, "librdkafka: {log_message}")
            }
            L::Notice | L::Info => {
                tracing::info!(sink = %self.sink, facility = fac, "librdkafka: {log_message}")
            }
            L::Debug => {
                tracing::debug!(sink = %self.sink, facility = fac, "librdkafka: {log_message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(sink = %self.sink, error = %error, "kafka client error: {reason}; librdkafka keeps retrying");
    }
}

type Producer_ = FutureProducer<KafkaContext>;

struct Inner {
    name: String,
    config: KafkaConfig,
    rendered: RenderedConfig,
    template: TopicTemplate,
    producer: RwLock<Arc<Producer_>>,
    /// Topics this sink produced to, checked by the healthcheck.
    topics: Mutex<BTreeSet<String>>,
    /// Times an enqueue met `QueueFull` and waited.
    queue_full_waits: AtomicU64,
    /// A delivery report settled while waiting for queue room asked for a new producer.
    reset_needed: AtomicBool,
}

/// The Kafka sink: one librdkafka producer (the idempotent producer by default), record key
/// = message key, headers from [`Message::headers`], a tombstone after each `deleted`.
pub struct KafkaSink {
    inner: Arc<Inner>,
}

/// Why the producer could not be created.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSinkError {
    /// librdkafka rejected a property (its message names the property).
    #[error("librdkafka rejected the configuration: {0}")]
    Client(#[from] KafkaError),
    /// The topic template is invalid.
    #[error("topic: {0}")]
    Template(#[from] super::request::TemplateError),
}

fn create_producer(name: &str, rendered: &RenderedConfig) -> Result<Producer_, KafkaError> {
    let mut cc = ClientConfig::new();
    for (k, v) in &rendered.0 {
        cc.set(k, v);
    }
    cc.create_with_context(KafkaContext {
        sink: name.to_owned(),
    })
}

struct Pending {
    index: usize,
    topic: Arc<str>,
    future: DeliveryFuture,
}

impl KafkaSink {
    /// Creates the producer from a validated configuration. Does not wait for the brokers.
    ///
    /// # Errors
    /// [`KafkaSinkError`] when librdkafka rejects the configuration.
    pub fn new(config: &KafkaConfig) -> Result<Self, KafkaSinkError> {
        let rendered = config.render();
        let template = TopicTemplate::parse(&config.topic)?;
        let producer = create_producer(&config.name, &rendered)?;
        tracing::info!(sink = %config.name, config = ?rendered, "kafka producer created");
        Ok(KafkaSink {
            inner: Arc::new(Inner {
                name: config.name.clone(),
                config: config.clone(),
                rendered,
                template,
                producer: RwLock::new(Arc::new(producer)),
                topics: Mutex::new(BTreeSet::new()),
                queue_full_waits: AtomicU64::new(0),
                reset_needed: AtomicBool::new(false),
            }),
        })
    }

    /// The rendered librdkafka configuration (print it with `{:?}`: secrets are masked).
    pub fn rendered_config(&self) -> &RenderedConfig {
        &self.inner.rendered
    }

    /// How many times an enqueue met librdkafka's `QueueFull` and waited for deliveries
    /// (backpressure from `queue_max_messages`).
    pub fn queue_full_waits(&self) -> u64 {
        self.inner.queue_full_waits.load(Ordering::Relaxed)
    }

    /// Records librdkafka holds (queued or awaiting their delivery report).
    pub fn in_flight(&self) -> usize {
        usize::try_from(self.inner.producer().in_flight_count()).unwrap_or(0)
    }

    /// Starts a background task that runs the healthcheck with backoff (1 s doubling to
    /// 30 s) until it passes, logging each failure as "not ready", then logs "ready". It
    /// stops when the sink is dropped.
    pub fn spawn_readiness_probe(&self) {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut delay = Duration::from_secs(1);
            loop {
                let Some(inner) = weak.upgrade() else { return };
                match inner.healthcheck().await {
                    Ok(()) => {
                        tracing::info!(sink = %inner.name, servers = %inner.config.bootstrap_servers, "kafka sink ready");
                        return;
                    }
                    Err(e) => tracing::warn!(
                        sink = %inner.name,
                        error = %e,
                        retry_in = ?delay,
                        "kafka sink not ready: brokers unreachable or refusing; retrying (messages wait in the pipeline)"
                    ),
                }
                drop(inner);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        });
    }
}

impl Inner {
    fn producer(&self) -> Arc<Producer_> {
        self.producer
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// After a fatal error, or a delivery error that means the broker no longer accepts
    /// this producer's id or epoch ([`needs_new_producer`]), librdkafka's producer is
    /// unusable: replace it with a fresh one.
    fn reset_if_fatal(&self, current: &Arc<Producer_>, producer_state_lost: bool) {
        if let Some((code, reason)) = current.client().fatal_error() {
            tracing::error!(sink = %self.name, code = ?code, reason = %reason, "fatal producer error: recreating the producer");
        } else if producer_state_lost {
            tracing::warn!(sink = %self.name, "the broker rejected the producer's id or epoch: recreating the producer");
        } else {
            return;
        }
        match create_producer(&self.name, &self.rendered) {
            Ok(p) => {
                let mut w = self
                    .producer
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                if Arc::ptr_eq(&w, current) {
                    *w = Arc::new(p);
                }
            }
            Err(e) => {
                tracing::error!(sink = %self.name, error = %e, "recreating the producer failed")
            }
        }
    }

    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        let producer = self.producer();
        let mut failures: Vec<Option<(Failure, Arc<str>)>> = vec![None; batch.len()];
        let mut pending: VecDeque<Pending> = VecDeque::with_capacity(batch.len() * 2);
        let mut used: Vec<Arc<str>> = Vec::new();
        let mut reset = false;
        for (i, m) in batch.iter().enumerate() {
            let rendered = self.template.render(&m.meta);
            let topic: Arc<str> = match used.iter().find(|t| ***t == *rendered) {
                Some(t) => t.clone(),
                None => {
                    let t: Arc<str> = rendered.into();
                    used.push(t.clone());
                    t
                }
            };
            if topic.len() > MAX_TOPIC_LEN {
                failures[i] = Some((
                    Failure::Fatal(format!(
                        "topic {topic:?} is longer than Kafka's {MAX_TOPIC_LEN} characters: shorten `topic`"
                    )),
                    topic.clone(),
                ));
                continue;
            }
            let tombstone = self.config.tombstones && m.meta.op == Op::Deleted;
            let value = FutureRecord::to(&topic)
                .key(m.key.as_bytes())
                .payload(&m.payload[..])
                .headers(request::headers(m));
            if let Err(e) = self
                .enqueue(&producer, value, i, &topic, &mut pending, &mut failures)
                .await
            {
                failures[i] = Some((classify(&e, &topic), topic.clone()));
                continue;
            }
            if tombstone {
                let record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic)
                    .key(m.key.as_bytes())
                    .headers(request::tombstone_headers(m));
                if let Err(e) = self
                    .enqueue(&producer, record, i, &topic, &mut pending, &mut failures)
                    .await
                {
                    failures[i] = Some((classify(&e, &topic), topic.clone()));
                }
            }
        }
        while let Some(p) = pending.pop_front() {
            reset |= settle(p, &mut failures).await;
        }
        self.note_topics(&used);
        reset |= self.reset_needed.swap(false, Ordering::Relaxed);
        self.reset_if_fatal(&producer, reset);
        self.outcome(batch, failures)
    }

    /// Enqueues one record; on `QueueFull` waits for the oldest outstanding delivery of this
    /// batch (or, with none, for librdkafka's queue to drain) and tries again.
    async fn enqueue<'a>(
        &self,
        producer: &Arc<Producer_>,
        mut record: FutureRecord<'a, [u8], [u8]>,
        index: usize,
        topic: &Arc<str>,
        pending: &mut VecDeque<Pending>,
        failures: &mut [Option<(Failure, Arc<str>)>],
    ) -> Result<(), KafkaError> {
        loop {
            match producer.send_result(record) {
                Ok(future) => {
                    pending.push_back(Pending {
                        index,
                        topic: topic.clone(),
                        future,
                    });
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.queue_full_waits.fetch_add(1, Ordering::Relaxed);
                    match pending.pop_front() {
                        Some(p) => {
                            if settle(p, failures).await {
                                self.reset_needed.store(true, Ordering::Relaxed);
                            }
                        }
                        None => {
                            // Records of an earlier (cancelled) batch fill the queue: wait
                            // until librdkafka delivered some (flush returns once the
                            // queue is empty, or after the timeout).
                            let p = producer.clone();
                            let _ = tokio::task::spawn_blocking(move || {
                                p.flush(Duration::from_millis(500))
                            })
                            .await;
                        }
                    }
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    fn note_topics(&self, used: &[Arc<str>]) {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        for t in used {
            if !topics.contains(&**t) {
                topics.insert(t.to_string());
            }
        }
    }

    fn outcome(
        &self,
        batch: &[Message],
        failures: Vec<Option<(Failure, Arc<str>)>>,
    ) -> Result<(), SinkError> {
        let failed: Vec<usize> = (0..failures.len())
            .filter(|i| failures[*i].is_some())
            .collect();
        let Some(&first) = failed.first() else {
            return Ok(());
        };
        if let Some(i) = failed
            .iter()
            .copied()
            .find(|i| matches!(failures[*i], Some((Failure::TooLarge, _))))
        {
            return Err(SinkError::TooLarge {
                sink: self.name.clone(),
                index: i,
                size: batch[i].payload.len(),
                limit: Some(self.config.message_max_bytes),
            });
        }
        if let Some(Some((Failure::Fatal(msg), _))) = failed
            .iter()
            .map(|i| &failures[*i])
            .find(|f| matches!(f, Some((Failure::Fatal(_), _))))
        {
            return Err(SinkError::fatal(&self.name, msg.clone()));
        }
        let message = match &failures[first] {
            Some((Failure::Transient(m), _)) => m.clone(),
            _ => "delivery failed".into(),
        };
        if failed.len() == batch.len() {
            return Err(SinkError::transient(
                &self.name,
                format!("no record of the batch was delivered: {message}"),
            ));
        }
        Err(SinkError::Partial {
            sink: self.name.clone(),
            failed,
            message,
        })
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        let producer = self.producer();
        if let Some((code, reason)) = producer.client().fatal_error() {
            return Err(SinkError::fatal(
                &self.name,
                format!("fatal producer error {code:?}: {reason}"),
            ));
        }
        let timeout = Duration::from_millis(self.config.healthcheck_timeout_ms);
        let p = producer.clone();
        let metadata =
            tokio::task::spawn_blocking(move || p.client().fetch_metadata(None, timeout))
                .await
                .map_err(|e| SinkError::transient(&self.name, format!("metadata task: {e}")))?
                .map_err(|e| {
                    let servers = &self.config.bootstrap_servers;
                    match classify(&e, "") {
                        Failure::Fatal(m) => {
                            SinkError::fatal(&self.name, format!("{servers}: {m}"))
                        }
                        _ => SinkError::transient(
                            &self.name,
                            format!("metadata request to {servers} failed: {e}"),
                        ),
                    }
                })?;
        let wanted: Vec<String> = self
            .topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        for t in wanted {
            match metadata.topics().iter().find(|m| m.name() == t) {
                None => {
                    return Err(SinkError::fatal(
                        &self.name,
                        format!("topic {t:?} is not in the cluster's metadata"),
                    ))
                }
                Some(m) if m.error().is_some() || m.partitions().is_empty() => {
                    return Err(SinkError::transient(
                        &self.name,
                        format!("topic {t:?}: metadata error {:?}", m.error()),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    async fn close(&self) -> Result<(), SinkError> {
        let producer = self.producer();
        let timeout = Duration::from_millis(self.config.flush_timeout_ms);
        let p = producer.clone();
        let res = tokio::task::spawn_blocking(move || p.flush(timeout))
            .await
            .map_err(|e| SinkError::transient(&self.name, format!("flush task: {e}")))?;
        match res {
            Ok(()) => Ok(()),
            Err(e) => {
                let left = producer.in_flight_count();
                tracing::error!(sink = %self.name, undelivered = left, error = %e, "kafka flush deadline passed with records undelivered");
                Err(SinkError::transient(
                    &self.name,
                    format!(
                        "{left} records not delivered within flush_timeout_ms = {}: {e}",
                        self.config.flush_timeout_ms
                    ),
                ))
            }
        }
    }
}

/// Waits for one delivery report and records a failure against its message. Returns
/// whether the error means the producer must be replaced ([`needs_new_producer`]).
async fn settle(p: Pending, failures: &mut [Option<(Failure, Arc<str>)>]) -> bool {
    let mut reset = false;
    let failure = match p.future.await {
        Ok(Ok(_)) => None,
        Ok(Err((e, _))) => {
            reset = e.rdkafka_error_code().is_some_and(needs_new_producer);
            Some(classify(&e, &p.topic))
        }
        Err(_) => Some(Failure::Transient(
            "producer dropped before the delivery report".into(),
        )),
    };
    if let Some(f) = failure {
        if failures[p.index].is_none() {
            failures[p.index] = Some((f, p.topic));
        }
    }
    reset
}

#[async_trait]
impl Sink for KafkaSink {
    fn name(&self) -> &str {
        &self.inner.name
    }

    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        self.inner.send(batch).await
    }

    /// Fetches the cluster metadata (brokers reachable, authenticated) and checks that every
    /// topic this sink produced to is present with partitions.
    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.inner.healthcheck().await
    }

    /// Flushes librdkafka's queue, waiting at most `flush_timeout_ms`.
    async fn close(&self) -> Result<(), SinkError> {
        self.inner.close().await
    }

    fn max_message_bytes(&self) -> Option<usize> {
        Some(
            self.inner
                .config
                .message_max_bytes
                .saturating_sub(RECORD_OVERHEAD_BYTES)
                .max(1),
        )
    }
}
