//! The Kafka I/O: the librdkafka producer, delivery reports, backpressure, healthcheck and
//! flush (each error classified by `errors.rs`).
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
//!
//! Brokers that answer but lost this producer's state: what each send shows of the producer
//! goes to [`ProducerHealth::step`] (`rebuild.rs`), and when it says so the producer is
//! replaced by a new one with the same properties, the old one purged. The pipeline re-sends
//! what was not confirmed, and that retry goes to the new producer. A wedge librdkafka's
//! statistics reveal (its epoch bumped again and again) ends the send at once; the healthcheck
//! fails until the new producer delivers.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use kubesink_core::backoff::Backoff;
use kubesink_core::SinkError;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer, PurgeConfig};

use crate::context::{BrokerWatch, EpochWatch, KafkaContext, DEFAULT_QUIET};
use crate::errors::{classify, describe_error, needs_new_producer, SendFailure};
use crate::properties::Properties;
use crate::rebuild::{ProducerHealth, Seen};
use crate::request::{KafkaRecord, MAX_TOPIC_LEN};

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

type Producer_ = FutureProducer<KafkaContext>;

/// The producer in use and what its statistics tell of its idempotence state.
#[derive(Clone)]
struct Current {
    producer: Arc<Producer_>,
    epoch: Arc<EpochWatch>,
}

/// One librdkafka producer (the idempotent producer by default) with its delivery
/// bookkeeping; replaced by a fresh one when librdkafka or the broker makes it unusable.
pub struct KafkaService {
    s: Settings,
    current: RwLock<Current>,
    /// What the sends showed of the current producer (`rebuild.rs`).
    health: Mutex<ProducerHealth>,
    /// Times the producer was replaced.
    rebuilds: AtomicU64,
    /// Topics this sink produced to, checked by the healthcheck.
    topics: Mutex<BTreeSet<String>>,
    /// Times an enqueue met `QueueFull` and waited.
    queue_full_waits: AtomicU64,
    watch: BrokerWatch,
    /// Topics a missing-topic watcher looks for ([`KafkaService::watch_for_topic`]).
    missing_topics: Arc<Mutex<BTreeSet<String>>>,
}

fn create_producer(
    name: &str,
    properties: &Properties,
    watch: &BrokerWatch,
) -> Result<Current, KafkaError> {
    let mut cc = ClientConfig::new();
    for (k, v) in &properties.0 {
        cc.set(k, v);
    }
    let epoch = Arc::new(EpochWatch::default());
    let producer = cc.create_with_context(KafkaContext::new(name, watch, &epoch))?;
    Ok(Current {
        producer: Arc::new(producer),
        epoch,
    })
}

/// What the delivery reports of a send showed.
#[derive(Default, Clone, Copy)]
struct Settled {
    /// An error meant the producer must be replaced ([`needs_new_producer`]).
    reset: bool,
    /// A record timed out (`MSG_TIMED_OUT`).
    timed_out: bool,
    /// A record failed otherwise (enqueue errors included).
    other: bool,
}

/// The outage quiet time of a producer with these properties: twice its
/// `reconnect.backoff.max.ms` (librdkafka `CONFIGURATION.md`: the longest wait between two
/// connection attempts to a broker), at least [`DEFAULT_QUIET`], so a broker still down
/// fails again within it.
fn quiet(properties: &Properties) -> Duration {
    properties
        .get("reconnect.backoff.max.ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_QUIET, |ms| {
            DEFAULT_QUIET.max(Duration::from_millis(ms.saturating_mul(2)))
        })
}

/// How a missing-topic watcher looks for its topic: after 1 s, doubling to 5 s (jittered
/// within the cap). A few seconds between a user creating the topic and the first record in it,
/// instead of the pipeline's `retry_max_backoff` (30 s by default) that a fatal error waits.
pub const TOPIC_POLL: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));

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
        let watch = BrokerWatch::new(&s.sink, quiet(&s.properties));
        let current = create_producer(&s.sink, &s.properties, &watch)?;
        tracing::info!(sink = %s.sink, config = ?s.properties, "kafka producer created");
        Ok(KafkaService {
            s,
            current: RwLock::new(current),
            health: Mutex::new(ProducerHealth::default()),
            rebuilds: AtomicU64::new(0),
            topics: Mutex::new(BTreeSet::new()),
            queue_full_waits: AtomicU64::new(0),
            watch,
            missing_topics: Arc::default(),
        })
    }

    /// The brokers' reachability as this sink sees it.
    pub fn watch(&self) -> &BrokerWatch {
        &self.watch
    }

    /// Starts the broker-up watcher unless one runs: every [`BROKER_UP_POLL`] it asks for
    /// metadata; once the brokers answer it forgets the last error and notifies the ready
    /// signal, and it ends once the outage is logged as over (the brokers answer and no
    /// connection failed for [`BrokerWatch::quiet`]). Needs a tokio runtime (none: nothing
    /// happens).
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
            let mut notified = false;
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
                    let lasting = watch.answered();
                    if !notified {
                        tracing::debug!(sink = %sink, "kafka brokers answer a metadata request");
                        watch.ready().notify();
                        notified = true;
                    }
                    // Until the outage is logged as over (no connection failed for a while).
                    if !lasting {
                        break;
                    }
                }
            }
            watch.stop_watching();
        });
    }

    /// Starts a missing-topic watcher for `topic` unless one runs: it asks the brokers for
    /// the topic's metadata after [`TOPIC_POLL`] delays (1 s doubling to 5 s) and, once the
    /// topic exists with partitions, logs it and notifies the ready signal, which ends the
    /// pipeline's wait (a missing topic is a fatal error, retried at `retry_max_backoff`,
    /// 30 s by default): a topic created while kubesink runs is used within about 5 s. Ends
    /// with the sink. Needs a tokio runtime (none: nothing happens).
    pub(crate) fn watch_for_topic(&self, topic: &str) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self
            .missing_topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(topic.to_owned())
        {
            return;
        }
        let producer = self.producer();
        let missing = self.missing_topics.clone();
        let ready = self.watch.ready().clone();
        let sink = self.s.sink.clone();
        let topic = topic.to_owned();
        let timeout = self.s.healthcheck_timeout.min(TOPIC_POLL.max);
        tracing::info!(sink = %sink, topic = %topic, "waiting for the topic to be created: looking for it after 1 s, then every 5 s at most");
        rt.spawn(async move {
            let started = Instant::now();
            for (checks, delay) in (1u64..).zip(TOPIC_POLL.delays()) {
                tokio::time::sleep(delay).await;
                // The sink was dropped meanwhile (or its producer replaced; the next failed
                // send watches again).
                if Arc::strong_count(&producer) == 1 {
                    break;
                }
                let (p, t) = (producer.clone(), topic.clone());
                let found = tokio::task::spawn_blocking(move || {
                    p.client().fetch_metadata(Some(&t), timeout).is_ok_and(|m| {
                        m.topics().iter().any(|m| {
                            m.name() == t && m.error().is_none() && !m.partitions().is_empty()
                        })
                    })
                })
                .await
                .unwrap_or(false);
                if found {
                    tracing::info!(sink = %sink, topic = %topic, checks, waited_ms = started.elapsed().as_millis() as u64, "the topic exists now: sending to it");
                    ready.notify();
                    break;
                }
            }
            missing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&topic);
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
        self.current().producer
    }

    fn current(&self) -> Current {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many times the producer was replaced by a new one.
    pub fn rebuilds(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    /// Why the producer keeps the sink from being ready, while it does (it was replaced and
    /// the new one has not delivered yet).
    pub fn producer_problem(&self) -> Option<String> {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .problem()
    }

    /// Feeds what a send showed of `current` to [`ProducerHealth::step`] and replaces the
    /// producer when it says so. Returns the reason of the replacement.
    async fn observe(&self, current: &Current, seen: Seen) -> Option<String> {
        let reason = {
            let mut h = self.health.lock().unwrap_or_else(PoisonError::into_inner);
            // What an old producer showed says nothing about the new one.
            if !Arc::ptr_eq(&self.current().producer, &current.producer) {
                return None;
            }
            let (next, reason) = h.step(seen);
            *h = next;
            reason?
        };
        self.rebuild(current, &reason).await;
        Some(reason)
    }

    /// Replaces `old` by a new producer with the same properties, then purges `old` (its
    /// queued and in-flight records fail at once with a purge error; the pipeline sends
    /// them again, to the new producer) and lets it go on a blocking thread (dropping a
    /// producer flushes and joins librdkafka's threads).
    async fn rebuild(&self, old: &Current, reason: &str) {
        let fatal = old.producer.client().fatal_error();
        match create_producer(&self.s.sink, &self.s.properties, &self.watch) {
            Ok(new) => {
                {
                    let mut w = self.current.write().unwrap_or_else(PoisonError::into_inner);
                    if !Arc::ptr_eq(&w.producer, &old.producer) {
                        return;
                    }
                    *w = new;
                }
                let n = self.rebuilds.fetch_add(1, Ordering::Relaxed) + 1;
                match fatal {
                    Some((code, why)) => {
                        tracing::error!(sink = %self.s.sink, code = ?code, fatal = %why, reason, rebuilds = n, "fatal producer error: replaced the producer by a new one")
                    }
                    None => {
                        tracing::warn!(sink = %self.s.sink, reason, rebuilds = n, "replaced the Kafka producer by a new one; what it did not deliver is sent again")
                    }
                }
                let old = old.producer.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    old.purge(PurgeConfig::default().queue().inflight());
                })
                .await;
                // The retry need not wait for the pipeline's backoff.
                self.watch.ready().notify();
            }
            Err(e) => {
                tracing::error!(sink = %self.s.sink, error = %describe_error(&e), reason, "creating a new Kafka producer failed; the next failure tries again")
            }
        }
    }

    /// The pipeline abandoned a send (the leadership fence closed during it): purges what
    /// librdkafka still queues or has in flight (`rd_kafka_purge` with `RD_KAFKA_PURGE_F_QUEUE
    /// | RD_KAFKA_PURGE_F_INFLIGHT`), so a deposed leader writes none of it later. Records
    /// already on the wire may still land (the broker is not told); the next leader re-sends
    /// them (at-least-once).
    pub async fn abandon(&self) {
        let producer = self.producer();
        let _ = tokio::task::spawn_blocking(move || {
            producer.purge(PurgeConfig::default().queue().inflight());
        })
        .await;
    }

    /// Whether the brokers answer a metadata request (within `healthcheck_timeout`).
    async fn brokers_answer(&self, producer: &Arc<Producer_>) -> bool {
        let p = producer.clone();
        let timeout = self.s.healthcheck_timeout;
        tokio::task::spawn_blocking(move || p.client().fetch_metadata(None, timeout).is_ok())
            .await
            .unwrap_or(false)
    }

    /// Produces `records` (one per message of the batch, in order) and waits for every
    /// delivery report.
    ///
    /// # Errors
    /// [`SinkError::TooLarge`] for a record over a size limit, [`SinkError::Fatal`] for
    /// authorization, unknown topic or TLS, [`SinkError::Partial`] naming the failed
    /// messages, or [`SinkError::Transient`] when none was delivered.
    pub async fn send(&self, records: &[KafkaRecord<'_>]) -> Result<(), SinkError> {
        let current = self.current();
        let producer = current.producer.clone();
        let mut reports = Reports {
            pending: VecDeque::with_capacity(records.len() * 2),
            failures: vec![None; records.len()],
            settled: Settled::default(),
            epoch: current.epoch.clone(),
            missing: BTreeSet::new(),
        };
        for (i, r) in records.iter().enumerate() {
            match &r.fan_out {
                None => {
                    let target = (&r.topic, None);
                    self.produce(&producer, r, i, target, &mut reports).await;
                }
                Some(destinations) => {
                    for (topic, partition) in destinations {
                        let target = (topic, Some(*partition));
                        if !self.produce(&producer, r, i, target, &mut reports).await {
                            break;
                        }
                    }
                }
            }
        }
        // Why the producer was replaced while this batch waited for its reports.
        let mut replaced: Option<String> = None;
        while let Some(mut p) = reports.pending.pop_front() {
            let report = loop {
                if replaced.is_some() {
                    break (&mut p.future).await;
                }
                tokio::select! {
                    r = &mut p.future => break r,
                    () = current.epoch.wedged() => {
                        let seen = Seen::EpochBumps {
                            producer_id: current.epoch.producer_id(),
                            bumps: current.epoch.bumps(),
                            brokers_answer: self.brokers_answer(&current.producer).await,
                        };
                        replaced = self.observe(&current, seen).await;
                    }
                }
            };
            reports.settle(report.ok(), p.index, p.topic);
        }
        self.note_topics(records);
        for topic in &reports.missing {
            self.watch_for_topic(topic);
        }
        if replaced.is_none() {
            let seen = self.seen(&current, &reports).await;
            replaced = self.observe(&current, seen).await;
        }
        let mut outcome = self.outcome(records, reports.failures);
        if let Some(why) = &replaced {
            if let Err(SinkError::Transient { message, .. } | SinkError::Partial { message, .. }) =
                &mut outcome
            {
                *message = format!(
                    "{message}; the producer was replaced by a new one ({why}), which gets the retry"
                );
            }
        }
        match &outcome {
            Ok(()) => {
                self.watch.answered();
            }
            Err(SinkError::Transient { .. } | SinkError::Partial { .. }) => {
                self.watch_for_broker_up()
            }
            Err(_) => {}
        }
        if replaced.is_some() {
            // Dropping a producer blocks (flush, joining librdkafka's threads): not here.
            let old = (producer, current);
            tokio::task::spawn_blocking(move || drop(old));
        }
        outcome
    }

    /// What this send showed of the producer, for [`ProducerHealth::step`].
    async fn seen(&self, current: &Current, reports: &Reports) -> Seen {
        let settled = reports.settled;
        if let Some((code, reason)) = current.producer.client().fatal_error() {
            return Seen::StateLost(format!("librdkafka fatal error {code:?}: {reason}"));
        }
        if settled.reset {
            return Seen::StateLost(
                "the broker rejected the producer's id, epoch or sequence numbers".into(),
            );
        }
        if reports.failures.iter().all(Option::is_none) {
            return Seen::Delivered;
        }
        if settled.timed_out && !settled.other {
            let brokers_answer = self.brokers_answer(&current.producer).await;
            return Seen::TimedOut { brokers_answer };
        }
        Seen::OtherFailure
    }

    /// Enqueues record `i` on `target` (topic, and the partition for a sync marker; none:
    /// by key), then its tombstone if it has one. Returns `false` when it failed (recorded in
    /// `reports`).
    async fn produce(
        &self,
        producer: &Arc<Producer_>,
        r: &KafkaRecord<'_>,
        i: usize,
        (topic, partition): (&Arc<str>, Option<i32>),
        reports: &mut Reports,
    ) -> bool {
        if topic.len() > MAX_TOPIC_LEN {
            reports.fail(
                i,
                SendFailure::Fatal(format!(
                    "topic {topic:?} is longer than Kafka's {MAX_TOPIC_LEN} characters: shorten `topic`"
                )),
                topic,
            );
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
        if let Err(e) = self.enqueue(producer, value, i, topic, reports).await {
            reports.fail_enqueue(i, &e, topic);
            return false;
        }
        if let Some(headers) = &r.tombstone {
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(topic).key(r.key).headers(headers.clone());
            if let Some(ms) = r.timestamp {
                record = record.timestamp(ms);
            }
            if let Err(e) = self.enqueue(producer, record, i, topic, reports).await {
                reports.fail_enqueue(i, &e, topic);
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
        reports: &mut Reports,
    ) -> Result<(), KafkaError> {
        loop {
            match producer.send_result(record) {
                Ok(future) => {
                    reports.pending.push_back(Pending {
                        index,
                        topic: topic.clone(),
                        future,
                    });
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.queue_full_waits.fetch_add(1, Ordering::Relaxed);
                    match reports.pending.pop_front() {
                        Some(p) => {
                            let report = p.future.await.ok();
                            reports.settle(report, p.index, p.topic);
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

    fn note_topics(&self, records: &[KafkaRecord<'_>]) {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        for r in records {
            if !topics.contains(&*r.topic) {
                topics.insert(r.topic.to_string());
            }
        }
    }

    fn outcome(
        &self,
        batch: &[KafkaRecord<'_>],
        failures: Vec<Option<(SendFailure, Arc<str>)>>,
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
            .find(|i| matches!(failures[*i], Some((SendFailure::TooLarge, _))))
        {
            return Err(SinkError::TooLarge {
                sink: self.s.sink.clone(),
                index: i,
                size: batch[i].payload.len(),
                limit: Some(self.s.message_max_bytes),
            });
        }
        if let Some(Some((SendFailure::Fatal(msg), _))) = failed
            .iter()
            .map(|i| &failures[*i])
            .find(|f| matches!(f, Some((SendFailure::Fatal(_), _))))
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
            Some((SendFailure::Transient(m), _)) => self.with_cause(m.clone()),
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
            SendFailure::Fatal(m) => SinkError::fatal(&self.s.sink, m),
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
    /// topic this sink produced to is present with partitions, and that the producer is not
    /// a replacement that has yet to deliver.
    ///
    /// # Errors
    /// [`SinkError::Transient`] while the brokers do not answer or the new producer has not
    /// delivered yet; [`SinkError::Fatal`] for a fatal producer error, authentication, or a
    /// topic missing from the metadata.
    pub async fn healthcheck(&self) -> Result<(), SinkError> {
        let producer = self.producer();
        if let Some((code, reason)) = producer.client().fatal_error() {
            return Err(SinkError::fatal(
                &self.s.sink,
                format!("fatal producer error {code:?}: {reason}"),
            ));
        }
        let servers = &self.s.bootstrap_servers;
        let all_down = || {
            // Brokers that refuse us (authentication, TLS) look "down" to librdkafka too:
            // the refusal is the cause to report, and it is fatal.
            if let Some(cause) = self.watch.fatal() {
                return SinkError::fatal(&self.s.sink, format!("{servers}: {cause}"));
            }
            self.watch_for_broker_up();
            SinkError::transient(
                &self.s.sink,
                self.with_cause(format!(
                    "every broker of {servers} is down (librdkafka ALL_BROKERS_DOWN)"
                )),
            )
        };
        // librdkafka's "every broker down" fails the check at once, also while the metadata
        // request waits (it would wait healthcheck_timeout for a broker that is gone).
        let went_down = self.watch.went_down();
        tokio::pin!(went_down);
        went_down.as_mut().enable();
        if self.watch.all_down() {
            return Err(all_down());
        }
        let timeout = self.s.healthcheck_timeout;
        let p = producer.clone();
        let fetched = tokio::select! {
            r = tokio::task::spawn_blocking(move || p.client().fetch_metadata(None, timeout)) => r,
            () = &mut went_down => return Err(all_down()),
        };
        let metadata = fetched
            .map_err(|e| SinkError::transient(&self.s.sink, format!("metadata task: {e}")))?
            .map_err(|e| {
                if let Some(cause) = self.watch.fatal() {
                    return SinkError::fatal(&self.s.sink, format!("{servers}: {cause}"));
                }
                self.watch_for_broker_up();
                match classify(&e, "") {
                    SendFailure::Fatal(m) => {
                        SinkError::fatal(&self.s.sink, format!("{servers}: {m}"))
                    }
                    _ => SinkError::transient(
                        &self.s.sink,
                        self.with_cause(format!("metadata request to {servers} failed: {e}")),
                    ),
                }
            })?;
        if self.watch.last_error().is_some() {
            self.watch.ready().notify();
        }
        self.watch.answered();
        if let Some(p) = self.producer_problem() {
            return Err(SinkError::transient(&self.s.sink, p));
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

/// Whether an error code says the topic does not exist.
fn is_missing_topic(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownTopicOrPartition)
    )
}

/// The delivery reports one send waits for, and what those that arrived showed.
struct Reports {
    pending: VecDeque<Pending>,
    /// Per message of the batch: its first failure, and the topic it went to.
    failures: Vec<Option<(SendFailure, Arc<str>)>>,
    settled: Settled,
    /// The producer's, told of each delivery.
    epoch: Arc<EpochWatch>,
    /// Topics the brokers said do not exist.
    missing: BTreeSet<Arc<str>>,
}

impl Reports {
    /// Records one delivery report (`None`: the producer was dropped before it) against its
    /// message (`index`, `topic`).
    fn settle(
        &mut self,
        report: Option<rdkafka::producer::future_producer::OwnedDeliveryResult>,
        index: usize,
        topic: Arc<str>,
    ) {
        let failure = match report {
            Some(Ok(_)) => {
                self.epoch.delivered();
                return;
            }
            Some(Err((e, _))) => {
                let code = e.rdkafka_error_code();
                self.settled.reset |= code.is_some_and(needs_new_producer);
                if is_missing_topic(code) {
                    self.missing.insert(topic.clone());
                }
                if code == Some(RDKafkaErrorCode::MessageTimedOut) {
                    self.settled.timed_out = true;
                } else {
                    self.settled.other = true;
                }
                classify(&e, &topic)
            }
            None => {
                self.settled.other = true;
                SendFailure::Transient("producer dropped before the delivery report".into())
            }
        };
        if self.failures[index].is_none() {
            self.failures[index] = Some((failure, topic));
        }
    }

    /// Records librdkafka's refusal `e` to enqueue message `index`.
    fn fail_enqueue(&mut self, index: usize, e: &KafkaError, topic: &Arc<str>) {
        if is_missing_topic(e.rdkafka_error_code()) {
            self.missing.insert(topic.clone());
        }
        self.fail(index, classify(e, topic), topic);
    }

    /// Records a failure to enqueue message `index`.
    fn fail(&mut self, index: usize, failure: SendFailure, topic: &Arc<str>) {
        self.settled.other = true;
        self.failures[index] = Some((failure, topic.clone()));
    }
}
