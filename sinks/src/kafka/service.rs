//! The Kafka I/O: the librdkafka producer, delivery reports, backpressure, error
//! classification, healthcheck and flush.
//!
//! Owns the rule "a batch is confirmed only when every record's delivery report is a
//! success". Must never drop a record silently, busy-loop on `QueueFull`, or log a secret
//! (librdkafka's own log lines never contain property values; the properties are printed
//! through [`Properties::redacted`] only). It knows nothing of kubesink's configuration:
//! `config.rs` hands it rendered [`Properties`] and [`Settings`].
//!
//! Brokers that go away: the last client error `context.rs` keeps is named in the errors of
//! failed sends instead of the symptom ("Message timed out"), and an authentication or TLS
//! failure reported there makes the send fatal. After a failed send or healthcheck, a
//! broker-up watcher asks for metadata every half second and notifies the sink's ready
//! signal when the brokers answer again.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use super::config::is_secret_property;
use super::context::{BrokerWatch, KafkaContext};
use super::request::{Record, MAX_TOPIC_LEN};
use crate::SinkError;

/// A librdkafka error for logs and messages: as rdkafka prints it, except that a rejected
/// property's value is left out (rdkafka's `ClientConfig` error carries the value, which
/// may be a credential).
pub fn describe_error(e: &KafkaError) -> String {
    match e {
        KafkaError::ClientConfig(_, description, key, _) => {
            format!("client configuration error: property {key:?}: {description}")
        }
        other => other.to_string(),
    }
}

/// librdkafka properties (`CONFIGURATION.md` of librdkafka), in a stable order.
#[derive(Clone, PartialEq, Eq)]
pub struct Properties(pub Vec<(String, String)>);

impl Properties {
    /// The properties with secret values replaced by `***`, for logs and `kubesink check`.
    pub fn redacted(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .map(|(k, v)| {
                let secret = is_secret_property(k);
                (k.clone(), if secret { "***".into() } else { v.clone() })
            })
            .collect()
    }

    /// The value of one property, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl std::fmt::Debug for Properties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.redacted()).finish()
    }
}

/// What [`KafkaService::new`] needs, resolved by `config.rs`.
pub struct Settings {
    /// Sink name (logs, errors).
    pub sink: String,
    /// The producer's librdkafka properties.
    pub properties: Properties,
    /// `bootstrap.servers`, for messages.
    pub bootstrap_servers: String,
    /// `message.max.bytes`.
    pub message_max_bytes: usize,
    /// How long `close` waits for deliveries.
    pub flush_timeout: Duration,
    /// Timeout of the healthcheck's metadata request.
    pub healthcheck_timeout: Duration,
}

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

type Producer_ = FutureProducer<KafkaContext>;

/// One librdkafka producer (the idempotent producer by default) with its delivery
/// bookkeeping; replaced by a fresh one when librdkafka or the broker makes it unusable.
pub struct KafkaService {
    s: Settings,
    producer: RwLock<Arc<Producer_>>,
    /// Topics this sink produced to, checked by the healthcheck.
    topics: Mutex<BTreeSet<String>>,
    /// Times an enqueue met `QueueFull` and waited.
    queue_full_waits: AtomicU64,
    /// A delivery report settled while waiting for queue room asked for a new producer.
    reset_needed: AtomicBool,
    watch: BrokerWatch,
}

fn create_producer(
    name: &str,
    properties: &Properties,
    watch: &BrokerWatch,
) -> Result<Producer_, KafkaError> {
    let mut cc = ClientConfig::new();
    for (k, v) in &properties.0 {
        cc.set(k, v);
    }
    cc.create_with_context(KafkaContext::new(name, watch))
}

/// Interval and metadata timeout of the broker-up watcher.
const BROKER_UP_POLL: Duration = Duration::from_millis(500);

/// The slice in which `close` flushes librdkafka's queue between checks of its deadline (a
/// blocking call: the pipeline may cancel `close`, and must not wait longer than this for
/// the thread).
const FLUSH_SLICE: Duration = Duration::from_millis(200);

struct Pending {
    index: usize,
    topic: Arc<str>,
    future: DeliveryFuture,
}

impl KafkaService {
    /// Creates the producer. Does not wait for the brokers.
    ///
    /// # Errors
    /// The [`KafkaError`] when librdkafka rejects a property (its message names it).
    pub fn new(s: Settings) -> Result<Self, KafkaError> {
        let watch = BrokerWatch::default();
        let producer = create_producer(&s.sink, &s.properties, &watch)?;
        tracing::info!(sink = %s.sink, config = ?s.properties, "kafka producer created");
        Ok(KafkaService {
            s,
            producer: RwLock::new(Arc::new(producer)),
            topics: Mutex::new(BTreeSet::new()),
            queue_full_waits: AtomicU64::new(0),
            reset_needed: AtomicBool::new(false),
            watch,
        })
    }

    /// The brokers' reachability as this sink sees it.
    pub fn watch(&self) -> &BrokerWatch {
        &self.watch
    }

    /// Starts the broker-up watcher unless one runs: every [`BROKER_UP_POLL`] it asks for
    /// metadata; once the brokers answer it forgets the last error, logs the recovery and
    /// notifies the ready signal, then ends. Needs a tokio runtime (none: nothing happens).
    fn watch_for_broker_up(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.watch.start_watching() {
            return;
        }
        let producer = self.producer();
        let watch = self.watch.clone();
        let sink = self.s.sink.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(BROKER_UP_POLL).await;
                let p = producer.clone();
                let up = tokio::task::spawn_blocking(move || {
                    p.client().fetch_metadata(None, BROKER_UP_POLL).is_ok()
                })
                .await
                .unwrap_or(false);
                // The sink was dropped meanwhile: only this task holds the producer.
                if Arc::strong_count(&producer) == 1 {
                    break;
                }
                if up {
                    if watch.clear() {
                        tracing::info!(sink = %sink, "kafka brokers answer again");
                    }
                    watch.ready().notify();
                    break;
                }
            }
            watch.stop_watching();
        });
    }

    /// `message` with librdkafka's last client error appended, while there is one.
    fn with_cause(&self, message: String) -> String {
        match self.watch.last_error() {
            Some(cause) => format!("{message}; last broker error: {cause}"),
            None => message,
        }
    }

    /// The producer's properties (print them with `{:?}`: secrets are masked).
    pub fn properties(&self) -> &Properties {
        &self.s.properties
    }

    /// `message.max.bytes`.
    pub fn message_max_bytes(&self) -> usize {
        self.s.message_max_bytes
    }

    /// How many times an enqueue met librdkafka's `QueueFull` and waited.
    pub fn queue_full_waits(&self) -> u64 {
        self.queue_full_waits.load(Ordering::Relaxed)
    }

    /// Records librdkafka holds (queued or awaiting their delivery report).
    pub fn in_flight(&self) -> usize {
        usize::try_from(self.producer().in_flight_count()).unwrap_or(0)
    }

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
            tracing::error!(sink = %self.s.sink, code = ?code, reason = %reason, "fatal producer error: recreating the producer");
        } else if producer_state_lost {
            tracing::warn!(sink = %self.s.sink, "the broker rejected the producer's id or epoch: recreating the producer");
        } else {
            return;
        }
        match create_producer(&self.s.sink, &self.s.properties, &self.watch) {
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
                tracing::error!(sink = %self.s.sink, error = %describe_error(&e), "recreating the producer failed")
            }
        }
    }

    /// Produces `records` (one per message of the batch, in order) and waits for every
    /// delivery report.
    ///
    /// # Errors
    /// [`SinkError::TooLarge`] for a record over a size limit, [`SinkError::Fatal`] for
    /// authorization, unknown topic or TLS, [`SinkError::Partial`] naming the failed
    /// messages, or [`SinkError::Transient`] when none was delivered.
    pub async fn send(&self, records: &[Record<'_>]) -> Result<(), SinkError> {
        let producer = self.producer();
        let mut failures: Vec<Option<(Failure, Arc<str>)>> = vec![None; records.len()];
        let mut pending: VecDeque<Pending> = VecDeque::with_capacity(records.len() * 2);
        let mut reset = false;
        for (i, r) in records.iter().enumerate() {
            match &r.fan_out {
                None => {
                    let target = (&r.topic, None);
                    self.produce(&producer, r, i, target, &mut pending, &mut failures)
                        .await;
                }
                Some(destinations) => {
                    for (topic, partition) in destinations {
                        let target = (topic, Some(*partition));
                        if !self
                            .produce(&producer, r, i, target, &mut pending, &mut failures)
                            .await
                        {
                            break;
                        }
                    }
                }
            }
        }
        while let Some(p) = pending.pop_front() {
            reset |= settle(p, &mut failures).await;
        }
        self.note_topics(records);
        reset |= self.reset_needed.swap(false, Ordering::Relaxed);
        self.reset_if_fatal(&producer, reset);
        let outcome = self.outcome(records, failures);
        match &outcome {
            Ok(()) => {
                self.watch.clear();
            }
            Err(SinkError::Transient { .. } | SinkError::Partial { .. }) => {
                self.watch_for_broker_up()
            }
            Err(_) => {}
        }
        outcome
    }

    /// Enqueues record `i` on `target` (topic, and the partition for a sync marker; none:
    /// by key), then its tombstone if it has one. Returns `false` when it failed (recorded in
    /// `failures`).
    async fn produce(
        &self,
        producer: &Arc<Producer_>,
        r: &Record<'_>,
        i: usize,
        (topic, partition): (&Arc<str>, Option<i32>),
        pending: &mut VecDeque<Pending>,
        failures: &mut [Option<(Failure, Arc<str>)>],
    ) -> bool {
        if topic.len() > MAX_TOPIC_LEN {
            failures[i] = Some((
                Failure::Fatal(format!(
                    "topic {topic:?} is longer than Kafka's {MAX_TOPIC_LEN} characters: shorten `topic`"
                )),
                topic.clone(),
            ));
            return false;
        }
        let mut value = FutureRecord::to(topic)
            .key(r.key)
            .payload(&r.payload[..])
            .headers(r.headers.clone());
        if let Some(p) = partition {
            value = value.partition(p);
        }
        if let Some(ms) = r.timestamp {
            value = value.timestamp(ms);
        }
        if let Err(e) = self
            .enqueue(producer, value, i, topic, pending, failures)
            .await
        {
            failures[i] = Some((classify(&e, topic), topic.clone()));
            return false;
        }
        if let Some(headers) = &r.tombstone {
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(topic).key(r.key).headers(headers.clone());
            if let Some(ms) = r.timestamp {
                record = record.timestamp(ms);
            }
            if let Err(e) = self
                .enqueue(producer, record, i, topic, pending, failures)
                .await
            {
                failures[i] = Some((classify(&e, topic), topic.clone()));
                return false;
            }
        }
        true
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

    fn note_topics(&self, records: &[Record<'_>]) {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        for r in records {
            if !topics.contains(&*r.topic) {
                topics.insert(r.topic.to_string());
            }
        }
    }

    fn outcome(
        &self,
        batch: &[Record<'_>],
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
                sink: self.s.sink.clone(),
                index: i,
                size: batch[i].payload.len(),
                limit: Some(self.s.message_max_bytes),
            });
        }
        if let Some(Some((Failure::Fatal(msg), _))) = failed
            .iter()
            .map(|i| &failures[*i])
            .find(|f| matches!(f, Some((Failure::Fatal(_), _))))
        {
            return Err(SinkError::fatal(&self.s.sink, msg.clone()));
        }
        // Records that timed out while librdkafka could not authenticate: the cause needs an
        // operator, the timeout is only its symptom.
        if let Some(cause) = self.watch.fatal() {
            return Err(SinkError::fatal(
                &self.s.sink,
                format!("{cause}: check security.protocol, sasl_mechanism, sasl_username, sasl_password and the TLS settings"),
            ));
        }
        let message = match &failures[first] {
            Some((Failure::Transient(m), _)) => self.with_cause(m.clone()),
            _ => "delivery failed".into(),
        };
        if failed.len() == batch.len() {
            return Err(SinkError::transient(
                &self.s.sink,
                format!("no record of the batch was delivered: {message}"),
            ));
        }
        Err(SinkError::Partial {
            sink: self.s.sink.clone(),
            failed,
            message,
        })
    }

    /// Topics and their partition counts from the cluster metadata: of `topic` only, or of
    /// every topic the brokers list (`None`). Topics the brokers report an error for are
    /// left out. Bounded by `healthcheck_timeout`.
    ///
    /// # Errors
    /// [`SinkError::Transient`] when the brokers do not answer (or the metadata task fails);
    /// [`SinkError::Fatal`] for authentication or authorization failures.
    pub async fn topic_partitions(
        &self,
        topic: Option<&str>,
    ) -> Result<Vec<(String, usize)>, SinkError> {
        let producer = self.producer();
        let timeout = self.s.healthcheck_timeout;
        let wanted = topic.map(str::to_owned);
        let metadata = tokio::task::spawn_blocking(move || {
            producer.client().fetch_metadata(wanted.as_deref(), timeout)
        })
        .await
        .map_err(|e| SinkError::transient(&self.s.sink, format!("metadata task: {e}")))?
        .map_err(|e| match classify(&e, topic.unwrap_or("")) {
            Failure::Fatal(m) => SinkError::fatal(&self.s.sink, m),
            _ => SinkError::transient(
                &self.s.sink,
                format!(
                    "metadata request to {} failed: {e}",
                    self.s.bootstrap_servers
                ),
            ),
        })?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| (t.name().to_owned(), t.partitions().len()))
            .collect())
    }

    /// Fetches the cluster metadata (brokers reachable, authenticated) and checks that every
    /// topic this sink produced to is present with partitions.
    ///
    /// # Errors
    /// [`SinkError::Transient`] while the brokers do not answer; [`SinkError::Fatal`] for a
    /// fatal producer error, authentication, or a topic missing from the metadata.
    pub async fn healthcheck(&self) -> Result<(), SinkError> {
        let producer = self.producer();
        if let Some((code, reason)) = producer.client().fatal_error() {
            return Err(SinkError::fatal(
                &self.s.sink,
                format!("fatal producer error {code:?}: {reason}"),
            ));
        }
        let timeout = self.s.healthcheck_timeout;
        let p = producer.clone();
        let metadata =
            tokio::task::spawn_blocking(move || p.client().fetch_metadata(None, timeout))
                .await
                .map_err(|e| SinkError::transient(&self.s.sink, format!("metadata task: {e}")))?
                .map_err(|e| {
                    let servers = &self.s.bootstrap_servers;
                    if let Some(cause) = self.watch.fatal() {
                        return SinkError::fatal(&self.s.sink, format!("{servers}: {cause}"));
                    }
                    self.watch_for_broker_up();
                    match classify(&e, "") {
                        Failure::Fatal(m) => {
                            SinkError::fatal(&self.s.sink, format!("{servers}: {m}"))
                        }
                        _ => SinkError::transient(
                            &self.s.sink,
                            self.with_cause(format!("metadata request to {servers} failed: {e}")),
                        ),
                    }
                })?;
        if self.watch.clear() {
            tracing::info!(sink = %self.s.sink, "kafka brokers answer again");
            self.watch.ready().notify();
        }
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
                        &self.s.sink,
                        format!("topic {t:?} is not in the cluster's metadata"),
                    ))
                }
                Some(m) if m.error().is_some() || m.partitions().is_empty() => {
                    return Err(SinkError::transient(
                        &self.s.sink,
                        format!("topic {t:?}: metadata error {:?}", m.error()),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Flushes librdkafka's queue, waiting at most `flush_timeout`, in slices of
    /// [`FLUSH_SLICE`] so that the pipeline's shutdown deadline can cancel it.
    ///
    /// # Errors
    /// [`SinkError::Transient`] naming how many records were left undelivered.
    pub async fn close(&self) -> Result<(), SinkError> {
        let producer = self.producer();
        let started = Instant::now();
        let mut last = Ok(());
        while producer.in_flight_count() > 0 {
            let left = self.s.flush_timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            let p = producer.clone();
            let slice = left.min(FLUSH_SLICE);
            last = tokio::task::spawn_blocking(move || p.flush(slice))
                .await
                .map_err(|e| SinkError::transient(&self.s.sink, format!("flush task: {e}")))?;
            if last.is_ok() {
                break;
            }
        }
        let left = producer.in_flight_count();
        if left == 0 {
            return Ok(());
        }
        let why = match last {
            Err(e) => e.to_string(),
            Ok(()) => "flush timed out".to_owned(),
        };
        tracing::error!(sink = %self.s.sink, undelivered = left, error = %why, "kafka flush deadline passed with records undelivered");
        Err(SinkError::transient(
            &self.s.sink,
            self.with_cause(format!(
                "{left} records not delivered within flush_timeout = {}: {why}",
                humantime::format_duration(self.s.flush_timeout)
            )),
        ))
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
