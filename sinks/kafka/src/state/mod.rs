//! The `kafka` state backend: the snapshot and the journal as records of a compacted Kafka
//! topic, the way Kafka Connect keeps its offsets and configs, so that whichever replica
//! takes over finds them (a hand-over between nodes without NATS).
//!
//! - `records.rs`: the keys, the manifest, the epoch fence and the scan a restore reads.
//! - `config.rs`: `[state.kafka]`, and what the bridge does with it (`StateBackendConfig`).
//! - this file: [`KafkaStore`], the [`StateStore`] over rdkafka.
//!
//! # Operations
//!
//! - **Restore** ([`StateStore::load`], then [`StateStore::load_journal`]): creates the topic
//!   when missing and allowed (`cleanup.policy = compact`; a topic without compaction is
//!   warned about), writes this writer's fence record alone and waits for its offset (the
//!   epoch), then reads the state's partition from its first offset up to that fence and
//!   folds it (`records::scan`). Reading up to one's own fence, not to a high watermark read
//!   beforehand, is what makes the read complete: everything acknowledged before it is
//!   below it (tansu 0.6 also reports a high watermark below the last records of a batch,
//!   `tests/support/kafka_server.rs`; the fence goes alone in its batch).
//! - **Save**: the snapshot cut into `chunk_bytes` records, every one acknowledged
//!   (`acks = all`, idempotent producer, so in order), then the manifest naming them; only
//!   then are the superseded keys tombstoned. A crash at any point leaves the previous
//!   manifest and its chunks whole.
//! - **Journal**: one record per frame, durable once acknowledged; dropping generations
//!   tombstones their keys.
//! - With `transactional = true`, each operation's records go in one transaction of a
//!   producer whose `transactional.id` is fixed per state (KIP-98): `init_transactions` by a
//!   new writer aborts and fences the previous one at the broker, and the restore reads
//!   committed records only.
//!
//! Connects on first use; a broker that is down at start-up is never a failed start: the
//! load fails and the watches wait for it (`bridge/watching.rs`). Never logs a secret.

mod config;
mod records;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kubesink_core::state::{JournalSegment, StateError, StateStore};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tokio::sync::Mutex;

pub use config::{kafka_sinks, StateConnection, StateKafkaConfig};
pub use records::{scan, Fence, Kind, Manifest, Record, Scanned, Scanner};

use records::{EPOCH_HEADER, WRITER_HEADER};

/// A Kafka operation of the `kafka` state backend failed (carried as
/// [`StateError::Backend`]).
#[derive(Debug, thiserror::Error)]
#[error("state.kafka: {what} topic {topic:?} (key {key:?}) at {brokers}: {detail}")]
pub struct KafkaStateError {
    /// What was being done (`creating the topic`, `writing the fence record to`, ...).
    pub what: &'static str,
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// The state's key prefix.
    pub key: String,
    /// The client's description.
    pub detail: String,
}

/// The state store's producer.
type StateProducer = FutureProducer<StateContext>;

/// librdkafka's logs and client errors of the state store's clients, at DEBUG: what matters
/// to an operator reaches them once, through the store's own errors (retried by the journal
/// and the keeper, logged once a minute, in `/readyz` and the metrics); librdkafka's default
/// context would log every broker-down line at ERROR, about four a second, without saying
/// they come from the state store.
#[derive(Clone, Copy)]
struct StateContext;

impl ClientContext for StateContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        tracing::debug!(?level, %fac, "state.kafka: librdkafka: {log_message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, "state.kafka: librdkafka client error: {reason}");
    }
}

impl ConsumerContext for StateContext {}

/// How a group of records did not get written.
enum Written {
    /// Failed (a new producer is used next time).
    Failed(StateError),
    /// The transactional producer was fenced by another writer's `init_transactions`: this
    /// writer no longer holds the state, for good (the description).
    Fenced(String),
    /// The topic is gone or was created again since this writer's fence (the lowest offset
    /// written, `None` when the topic does not exist; the fence's offset).
    Reset(Option<i64>, i64),
}

/// `segment.ms` of a state topic this store creates: one hour.
const SEGMENT_MS: &str = "3600000";
/// `segment.bytes` of a state topic this store creates: 64 MiB.
const SEGMENT_BYTES: &str = "67108864";
/// `min.cleanable.dirty.ratio` of a state topic this store creates.
const MIN_CLEANABLE_DIRTY_RATIO: &str = "0.1";

/// Said with every transaction error.
const TRANSACTIONS: &str = "state.kafka.transactional = true: the brokers must support KIP-98 transactions (tansu 0.6 does not); set it to false to rely on the epoch fence alone";

/// What the store knows between operations.
#[derive(Default)]
struct Inner {
    producer: Option<StateProducer>,
    /// This writer's id and epoch (its fence record's offset), once it wrote its fence.
    writer: Option<(String, i64)>,
    /// Every live key of this state known (read at the restore, written since), for
    /// tombstoning what a save or a journal drop covers.
    live: BTreeSet<Kind>,
    /// The journal read by the last restore, handed to [`StateStore::load_journal`].
    journal: Option<Vec<JournalSegment>>,
    /// Why this writer's earlier records are gone (the topic deleted or emptied under it),
    /// until its lost marker is written (`records.rs`): the first thing after its new fence.
    lost: Option<String>,
    /// Why this writer was fenced at the broker (`transactional = true`: another writer's
    /// `init_transactions` bumped the producer epoch of the shared `transactional.id`). Once
    /// set, every write is refused with [`StateError::Fenced`] and no producer is built again
    /// (a new one's `init_transactions` would fence the successor back); only a new
    /// take-over ([`StateStore::load`], when this replica leads again) clears it.
    fenced: Option<String>,
}

/// The state as records of a compacted Kafka topic.
pub struct KafkaStore {
    config: StateKafkaConfig,
    connection: StateConnection,
    brokers: String,
    prefix: String,
    partition: i32,
    identity: String,
    description: String,
    inner: Mutex<Inner>,
    /// The next journal record number of this writer.
    next_record: AtomicU64,
    /// Whether the topic's compaction was checked (warned about once).
    checked: AtomicBool,
}

impl KafkaStore {
    /// The store of `config` on `connection`; the key prefix defaults to `cluster`.
    /// `identity` (the leader-election identity, the Pod's name) goes into fence records.
    /// Connects on first use.
    pub fn new(
        config: &StateKafkaConfig,
        connection: StateConnection,
        cluster: &str,
        identity: &str,
    ) -> Self {
        let prefix = config.key.clone().unwrap_or_else(|| cluster.to_owned());
        let brokers = connection
            .properties
            .get("bootstrap.servers")
            .unwrap_or_default()
            .to_owned();
        let partitions = u64::try_from(config.partitions.max(1)).unwrap_or(1);
        let partition =
            i32::try_from(xxhash_rust::xxh3::xxh3_64(prefix.as_bytes()) % partitions).unwrap_or(0);
        let description = format!(
            "Kafka topic {} partition {partition} key {prefix:?} at {brokers} ({})",
            config.topic, connection.source
        );
        KafkaStore {
            config: config.clone(),
            connection,
            brokers,
            prefix,
            partition,
            identity: format!("{identity} (pid {})", std::process::id()),
            description,
            inner: Mutex::new(Inner::default()),
            next_record: AtomicU64::new(0),
            checked: AtomicBool::new(false),
        }
    }

    fn error(&self, what: &'static str, detail: impl std::fmt::Display) -> StateError {
        StateError::Backend(Box::new(KafkaStateError {
            what,
            brokers: self.brokers.clone(),
            topic: self.config.topic.clone(),
            key: self.prefix.clone(),
            detail: detail.to_string(),
        }))
    }

    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in &self.connection.properties.0 {
            c.set(k, v);
        }
        c
    }

    fn timeout(&self) -> Duration {
        self.config.timeout.get()
    }

    /// The producer, created (and, transactional, initialised) on first use; never for a
    /// writer fenced at the broker.
    async fn producer(&self, inner: &mut Inner) -> Result<StateProducer, StateError> {
        if inner.fenced.is_some() {
            return Err(StateError::Fenced);
        }
        if let Some(p) = &inner.producer {
            return Ok(p.clone());
        }
        let mut c = self.client_config();
        let max = self.config.chunk_bytes.bytes().saturating_add(64 * 1024);
        c.set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "0")
            .set("compression.type", "none")
            .set("message.max.bytes", max.to_string())
            // A topic that is gone fails its records at once (UnknownTopicOrPartition) rather
            // than after librdkafka's default 30 s: the store then creates it and fences again.
            .set(
                "topic.metadata.propagation.max.ms",
                (self.timeout() / 2)
                    .as_millis()
                    .clamp(100, 5_000)
                    .to_string(),
            )
            .set("message.timeout.ms", self.timeout().as_millis().to_string());
        if self.config.transactional {
            c.set(
                "transactional.id",
                format!("kubesink-state.{}.{}", self.config.topic, self.prefix),
            );
        }
        let producer: StateProducer = c
            .create_with_context(StateContext)
            .map_err(|e| self.error("creating the producer for", e))?;
        if self.config.transactional {
            let p = producer.clone();
            let t = self.timeout();
            tokio::task::spawn_blocking(move || p.init_transactions(t))
                .await
                .map_err(|e| self.error("initialising transactions on", e))?
                .map_err(|e| {
                    self.error(
                        "initialising transactions on",
                        format!("{e} ({TRANSACTIONS})"),
                    )
                })?;
        }
        inner.producer = Some(producer.clone());
        Ok(producer)
    }

    /// Makes sure the topic exists (creating it, compacted, when allowed) and has the
    /// state's partition; warns once when it is not compacted.
    async fn ensure_topic(&self, producer: &StateProducer) -> Result<(), StateError> {
        let topic = self.config.topic.clone();
        let t = self.timeout();
        let p = producer.clone();
        let partitions = tokio::task::spawn_blocking(move || {
            p.client().fetch_metadata(Some(&topic), t).map(|m| {
                m.topics()
                    .iter()
                    .find(|x| x.name() == topic && x.error().is_none())
                    .map(|x| x.partitions().len())
            })
        })
        .await
        .map_err(|e| self.error("reading the metadata of", e))?
        .map_err(|e| self.error("reading the metadata of", e))?;
        let admin: AdminClient<StateContext> = self
            .client_config()
            .create_with_context(StateContext)
            .map_err(|e| self.error("creating the admin client for", e))?;
        let options = AdminOptions::new().request_timeout(Some(t));
        match partitions {
            Some(n) if n > usize::try_from(self.partition).unwrap_or(0) => {}
            Some(n) => {
                return Err(self.error(
                    "opening",
                    format!("the topic has {n} partitions, and this state's key goes to partition {} of state.kafka.partitions = {}", self.partition, self.config.partitions),
                ))
            }
            None if !self.config.create => {
                return Err(self.error(
                    "opening",
                    "no such topic (create it with cleanup.policy=compact, or set state.kafka.create = true)",
                ))
            }
            None => {
                // -1: the brokers' default.replication.factor (KIP-464).
                let replication =
                    TopicReplication::Fixed(self.config.replication_factor.unwrap_or(-1));
                // Compaction never touches the active segment: with the brokers' defaults
                // (1 GiB or 7 days) a state saved every 30 s would keep every save of a week.
                // Segments roll hourly or at 64 MiB, and a tenth of dirty records is enough
                // to clean, so a restore reads little more than the live keys.
                let new = NewTopic::new(&self.config.topic, self.config.partitions, replication)
                    .set("cleanup.policy", "compact")
                    .set("segment.ms", SEGMENT_MS)
                    .set("segment.bytes", SEGMENT_BYTES)
                    .set("min.cleanable.dirty.ratio", MIN_CLEANABLE_DIRTY_RATIO);
                let created = admin
                    .create_topics(
                        &[new],
                        &AdminOptions::new()
                            .request_timeout(Some(t))
                            .operation_timeout(Some(t)),
                    )
                    .await
                    .map_err(|e| self.error("creating", e))?;
                for r in created {
                    match r {
                        Ok(_) => tracing::info!(topic = %self.config.topic, partitions = self.config.partitions, "state topic created (cleanup.policy=compact, segment.ms=3600000, segment.bytes=67108864, min.cleanable.dirty.ratio=0.1)"),
                        Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((_, code)) => return Err(self.error("creating", code)),
                    }
                }
            }
        }
        self.check_compaction(&admin, &options).await;
        Ok(())
    }

    /// Warns (once) when the topic's `cleanup.policy` has no `compact`: the state's old
    /// records would then be deleted by retention, the current ones with them.
    async fn check_compaction(&self, admin: &AdminClient<StateContext>, options: &AdminOptions) {
        if self.checked.swap(true, Ordering::Relaxed) {
            return;
        }
        let described = admin
            .describe_configs(&[ResourceSpecifier::Topic(&self.config.topic)], options)
            .await;
        // Ok(None): described, but no `cleanup.policy` entry (tansu lists only the
        // settings a topic was created with): the broker default, `delete`.
        let policy: Result<Option<String>, String> = match described {
            Ok(rs) => match rs.into_iter().next() {
                Some(Ok(r)) => Ok(r
                    .entries
                    .into_iter()
                    .find(|e| e.name == "cleanup.policy")
                    .and_then(|e| e.value)),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("no answer".into()),
            },
            Err(e) => Err(e.to_string()),
        };
        let topic = &self.config.topic;
        match policy {
            Ok(Some(p)) if p.contains("compact") => {}
            Ok(p) => {
                let p = p.unwrap_or_else(|| "delete (the broker default)".into());
                tracing::warn!(%topic, cleanup_policy = %p, "state.kafka: the state topic {topic} is not compacted (cleanup.policy = {p}): retention will delete the saved state with the old records, and a restart after that lists everything again and cannot send the deletes made meanwhile; set cleanup.policy=compact on the topic (kafka-configs --alter --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact)");
            }
            Err(e) => {
                tracing::warn!(%topic, error = %e, "state.kafka: could not read the state topic's cleanup.policy (DescribeConfigs): make sure it is compact")
            }
        }
    }

    /// Sends `records` (key, value or tombstone) in order on the state's partition, and waits
    /// for every acknowledgement; in a transaction when configured. With a writer (after its
    /// fence) they carry its headers; without one, the records are its fence. Returns the
    /// offset of each.
    async fn write(
        &self,
        inner: &mut Inner,
        what: &'static str,
        records: Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<Vec<i64>, StateError> {
        if inner.fenced.is_some() {
            return Err(StateError::Fenced);
        }
        let epoch = inner.writer.as_ref().map(|(_, e)| *e);
        let written = match self.try_write(inner, what, records).await {
            Ok(offsets) => match (epoch, offsets.iter().min()) {
                // At or below this writer's own fence (every record it writes lands after
                // it): the topic was deleted and created again, or lost by its broker
                // (tansu's memory engine on a restart), since the fence. At: the first
                // writer's fence is at offset 0, where the emptied topic's next record lands.
                (Some(e), Some(&low)) if low <= e => Err(Written::Reset(Some(low), e)),
                _ => Ok(offsets),
            },
            Err((e, code)) => match code {
                Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                    Err(Written::Reset(None, epoch.unwrap_or_default()))
                }
                code if self.config.transactional && self.fenced_code(inner, code) => {
                    Err(Written::Fenced(e.to_string()))
                }
                _ => Err(Written::Failed(e)),
            },
        };
        match written {
            Ok(offsets) => Ok(offsets),
            Err(Written::Fenced(detail)) => {
                // Another writer's init_transactions fenced this producer (KIP-98): it took
                // the state over. Retrying with a new producer would bump the epoch again
                // and fence the successor back, and so on while this zombie lives.
                inner.producer = None;
                inner.fenced = Some(detail.clone());
                tracing::error!(store = %self.description, error = %detail, "state.kafka: this writer's transactional producer was fenced: another writer took the state over (init_transactions, KIP-98); every write of this store is refused from now on (this replica no longer leads), and no new producer is made that would fence the successor back");
                Err(StateError::Fenced)
            }
            Err(Written::Failed(e)) => {
                // A failed or timed-out record can leave an idempotent producer unable to go
                // on (librdkafka keeps its sequence numbers: `rebuild.rs` of the sink): the
                // next operation starts with a new producer, and repeats the whole group.
                inner.producer = None;
                Err(e)
            }
            Err(Written::Reset(low, e)) => {
                // What this writer wrote is gone with the topic, and what it writes now would
                // have no fence before it: every later restore would ignore it. The next
                // operation creates the topic (with `create`) and writes a new fence first;
                // the next save stores the whole state again.
                let detail = match low {
                    None => "the topic no longer exists".to_owned(),
                    Some(low) => format!(
                        "a record landed at offset {low}, at or below this writer's fence at offset {e}"
                    ),
                };
                self.reset(inner, &detail, e);
                Err(self.error(
                    what,
                    format!("{detail}: the topic was deleted or lost its records; a new fence is written first on the next try"),
                ))
            }
        }
    }

    /// The topic was deleted, emptied or created again since this writer's fence at offset
    /// `fence` (`detail` says how it was found): what it wrote is gone, and what it writes
    /// now would have no fence before it (every later restore would ignore it). The next
    /// operation creates the topic (with `create`), writes a new fence and a lost marker
    /// first (`records.rs`); the next save stores the whole state again.
    fn reset(&self, inner: &mut Inner, detail: &str, fence: i64) {
        inner.producer = None;
        inner.writer = None;
        inner.live.clear();
        inner.lost = Some(format!(
            "the state topic was deleted or lost its records while a writer ran ({detail}; its fence was at offset {fence})"
        ));
        self.checked.store(false, Ordering::Relaxed);
        tracing::warn!(store = %self.description, %detail, "state.kafka: the state topic was deleted or lost its records since this writer's fence: writing a new fence (and creating the topic, with state.kafka.create) before the next write; the next save stores the whole state again");
    }

    /// Whether this writer's fence record is still where it wrote it: `Ok(false)` after a
    /// [`KafkaStore::reset`] when the topic is gone, holds fewer records than the fence's
    /// offset, or holds another record there (deleted and created again, then written past
    /// that offset: the offsets of new writes alone cannot show that). A fence compacted
    /// away (another writer took over and tombstoned it) is [`StateError::Fenced`]. `Ok(true)`
    /// without a fence yet, or when the broker's answer does not tell.
    async fn fence_held(&self, inner: &mut Inner) -> Result<bool, StateError> {
        let Some((writer, epoch)) = inner.writer.clone() else {
            return Ok(true);
        };
        let mine = Kind::Fence(writer).key(&self.prefix);
        let consumer = self.consumer(Offset::Offset(epoch))?;
        let (topic, partition, t) = (self.config.topic.clone(), self.partition, self.timeout());
        let found = tokio::task::spawn_blocking(move || -> Result<Option<String>, String> {
            let metadata = consumer
                .client()
                .fetch_metadata(Some(&topic), t)
                .map_err(|e| e.to_string())?;
            let exists = metadata.topics().iter().any(|x| {
                x.name() == topic
                    && x.error().is_none()
                    && x.partitions().iter().any(|p| p.id() == partition)
            });
            if !exists {
                return Ok(Some("the topic no longer exists".into()));
            }
            // An emptied topic (or one created again, by a broker that creates topics on a
            // metadata request, as tansu does) ends at or before the fence's offset: a read
            // there would wait for a record that never comes, not fail as out of range
            // (the first writer's fence is at offset 0, found by tests/restart.rs).
            let watermarks = consumer.fetch_watermarks(&topic, partition, t);
            tracing::debug!(?watermarks, fence = epoch, "state.kafka: fence check: the partition's offsets");
            if let Ok((_, high)) = watermarks {
                if high <= epoch {
                    return Ok(Some(format!(
                        "the topic ends at offset {high}, at or before this writer's fence at offset {epoch}: it was emptied or created again"
                    )));
                }
            }
            let deadline = Instant::now() + t;
            while Instant::now() < deadline {
                match consumer.poll(Duration::from_millis(100)) {
                    None => {}
                    Some(Ok(m)) if m.offset() == epoch => {
                        let key = m.key().map(String::from_utf8_lossy).unwrap_or_default();
                        if key == mine {
                            tracing::debug!(fence = epoch, "state.kafka: fence check: this writer's fence record is in place");
                        }
                        return Ok((key != mine).then(|| {
                            format!("the record at this writer's fence offset {epoch} is another's ({key:?}): the topic was created again and written past it")
                        }));
                    }
                    Some(Ok(m)) => {
                        return Err(format!("fenced: this writer's fence record at offset {epoch} was compacted away (the next record is at offset {}): another writer took the state over", m.offset()));
                    }
                    Some(Err(e)) => match e.rdkafka_error_code() {
                        Some(RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::AutoOffsetReset) => {
                            return Ok(Some(format!("the topic holds no record at this writer's fence offset {epoch}: it was emptied or created again")));
                        }
                        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                            return Ok(Some("the topic no longer exists".into()));
                        }
                        // The broker went away or failed mid-check: no answer now, the
                        // next check asks again with a new consumer. Not polled on: a
                        // consumer whose broker restarted empty meanwhile fetches by the
                        // topic id it knew, and librdkafka 2.12.1 crashed (SIGSEGV in
                        // `rd_kafka_metadata_update_op`, a NULL topic name) on tansu 0.6's
                        // answer to that fetch (found by tests/restart.rs; docs/kafka.md).
                        _ => {
                            tracing::debug!(error = %e, "state.kafka: consumer error while checking the fence; no answer this time");
                            return Ok(None);
                        }
                    },
                }
            }
            // No answer either way: nothing to act on.
            tracing::debug!(fence = epoch, "state.kafka: fence check: no record read at the fence's offset within the timeout; taken as held");
            Ok(None)
        })
        .await
        .map_err(|e| self.error("checking the fence record in", e))?;
        match found {
            Ok(None) => Ok(true),
            Ok(Some(detail)) => {
                self.reset(inner, &detail, epoch);
                Ok(false)
            }
            Err(why) if why.starts_with("fenced: ") => {
                tracing::warn!(store = %self.description, %why, "state.kafka: not writing: this replica no longer holds the state");
                Err(StateError::Fenced)
            }
            Err(why) => Err(self.error("checking the fence record in", why)),
        }
    }

    /// A consumer of the state's partition, assigned (no group, commits nothing) from
    /// `from`; reading committed records only.
    fn consumer(&self, from: Offset) -> Result<BaseConsumer<StateContext>, StateError> {
        let mut c = self.client_config();
        c.set("group.id", "kubesink-state")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "error")
            .set("isolation.level", "read_committed");
        for k in [
            "compression.type",
            "acks",
            "enable.idempotence",
            "linger.ms",
            "message.timeout.ms",
            "queue.buffering.max.messages",
            "statistics.interval.ms",
            "topic.metadata.propagation.max.ms",
        ] {
            c.remove(k);
        }
        let max = self.config.chunk_bytes.bytes().saturating_add(64 * 1024);
        c.set("fetch.message.max.bytes", max.max(1024 * 1024).to_string())
            // librdkafka prefetches up to 64 MiB by default; a restore folds as it reads, so
            // half of that bounds its memory without slowing the read (4 MiB made a
            // 520 MB restore five times slower against tansu).
            .set("queued.max.messages.kbytes", "32768");
        let consumer: BaseConsumer<StateContext> = c
            .create_with_context(StateContext)
            .map_err(|e| self.error("creating the consumer for", e))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.config.topic, self.partition, from)
            .map_err(|e| self.error("reading", e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| self.error("reading", e))?;
        Ok(consumer)
    }

    async fn try_write(
        &self,
        inner: &mut Inner,
        what: &'static str,
        records: Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<Vec<i64>, (StateError, Option<RDKafkaErrorCode>)> {
        let plain = |e: StateError| (e, None);
        let producer = self.producer(inner).await.map_err(plain)?;
        let writer = inner.writer.clone();
        let transactional = self.config.transactional;
        if transactional {
            producer.begin_transaction().map_err(|e| {
                let code = e.rdkafka_error_code();
                (self.error(what, format!("{e} ({TRANSACTIONS})")), code)
            })?;
        }
        let mut futures = Vec::with_capacity(records.len());
        for (key, value) in &records {
            let mut record = FutureRecord::to(&self.config.topic)
                .key(key.as_str())
                .partition(self.partition);
            if let Some((writer, epoch)) = &writer {
                let epoch = epoch.to_string();
                record = record.headers(
                    OwnedHeaders::new()
                        .insert(Header {
                            key: WRITER_HEADER,
                            value: Some(writer.as_str()),
                        })
                        .insert(Header {
                            key: EPOCH_HEADER,
                            value: Some(epoch.as_str()),
                        }),
                );
            }
            if let Some(v) = value {
                record = record.payload(v.as_slice());
            }
            futures.push(
                producer
                    .send_result(record)
                    .map_err(|(e, _)| (self.error(what, &e), e.rdkafka_error_code()))?,
            );
        }
        let limit = self.timeout() + Duration::from_secs(1);
        let mut offsets = Vec::with_capacity(futures.len());
        for f in futures {
            let report = tokio::time::timeout(limit, f)
                .await
                .map_err(|_| {
                    plain(self.error(what, format!("no acknowledgement within {limit:?}")))
                })?
                .map_err(|_| plain(self.error(what, "the producer was dropped")))?;
            match report {
                Ok(d) => offsets.push(d.offset),
                Err((e, _)) => return Err((self.error(what, &e), e.rdkafka_error_code())),
            }
        }
        if transactional {
            let p = producer.clone();
            let t = self.timeout();
            tokio::task::spawn_blocking(move || p.commit_transaction(t))
                .await
                .map_err(|e| plain(self.error(what, e)))?
                .map_err(|e| {
                    let code = e.rdkafka_error_code();
                    (self.error(what, format!("{e} ({TRANSACTIONS})")), code)
                })?;
        }
        Ok(offsets)
    }

    /// Whether a failed write (error `code`) says this writer's transactional producer was
    /// fenced by another's `init_transactions`: `PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH`
    /// or librdkafka's own `_FENCED`, as the error itself or as the producer's fatal error
    /// (a fenced producer's queued records fail as purged, `_PURGE_QUEUE`, or `_FATAL`).
    fn fenced_code(&self, inner: &Inner, code: Option<RDKafkaErrorCode>) -> bool {
        let fenced = |c: RDKafkaErrorCode| {
            matches!(
                c,
                RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::InvalidProducerEpoch
                    | RDKafkaErrorCode::Fenced
            )
        };
        code.is_some_and(fenced)
            || inner
                .producer
                .as_ref()
                .and_then(|p| p.client().fatal_error())
                .is_some_and(|(c, _)| fenced(c))
    }

    /// Writes a new fence record: this writer's epoch from now on.
    async fn fence(&self, inner: &mut Inner) -> Result<i64, StateError> {
        let writer = new_writer_id();
        let value = serde_json::to_vec(&Fence {
            writer: writer.clone(),
            identity: self.identity.clone(),
        })
        .map_err(|e| self.error("writing the fence record to", e))?;
        inner.writer = None;
        let offsets = self
            .write(
                inner,
                "writing the fence record to",
                vec![(Kind::Fence(writer.clone()).key(&self.prefix), Some(value))],
            )
            .await?;
        let epoch = offsets.first().copied().unwrap_or_default();
        inner.live.insert(Kind::Fence(writer.clone()));
        inner.writer = Some((writer, epoch));
        tracing::info!(store = %self.description, epoch, identity = %self.identity, "state.kafka: took over the state (fence record written)");
        Ok(epoch)
    }

    /// Takes the state over: the topic made sure of, then a new fence; returns the epoch.
    async fn take_over(&self, inner: &mut Inner) -> Result<i64, StateError> {
        let producer = self.producer(inner).await?;
        self.ensure_topic(&producer).await?;
        self.fence(inner).await
    }

    /// Writes this writer's lost marker (`records.rs`) under `epoch`: until a snapshot
    /// follows it, a restore takes the state for damaged.
    async fn mark_lost(
        &self,
        inner: &mut Inner,
        epoch: i64,
        reason: &str,
    ) -> Result<(), StateError> {
        let kind = Kind::Lost { epoch };
        self.write(
            inner,
            "marking the state partly lost in",
            vec![(kind.key(&self.prefix), Some(reason.as_bytes().to_vec()))],
        )
        .await?;
        inner.live.insert(kind);
        inner.lost = None;
        Ok(())
    }

    /// The restore: fence, read up to the fence, fold.
    ///
    /// # Errors
    /// [`StateError::Damaged`] when the state read is damaged or partly lost (a snapshot
    /// whose chunks are missing or fail their checksum, a lost marker no snapshot follows):
    /// a lost marker of this writer keeps it so until its next save.
    async fn restore(&self, inner: &mut Inner) -> Result<Option<Vec<u8>>, StateError> {
        // A take-over (this replica leads, again): the one thing that lifts a broker's fence.
        inner.fenced = None;
        let epoch = self.take_over(inner).await?;
        let (scanned, read, peak) = self.read_to(epoch).await?;
        // What was read decides (below); a loss seen before this restore is in it.
        inner.lost = None;
        inner.live = scanned.live;
        if scanned.fenced > 0 {
            tracing::warn!(store = %self.description, ignored = scanned.fenced, "state.kafka: records written by a deposed writer after another took over were ignored (a zombie's late writes)");
        }
        if scanned.unreadable > 0 {
            tracing::warn!(store = %self.description, unreadable = scanned.unreadable, "state.kafka: records of this state's key that this version cannot read were ignored");
        }
        // Copy forward (below): what was read, written again under this writer's epoch.
        let journal: Vec<(u64, Vec<u8>)> = scanned
            .journal
            .iter()
            .map(|(_, g, b)| (*g, b.clone()))
            .collect();
        inner.journal = Some(
            scanned
                .journal
                .into_iter()
                .map(|(offset, generation, bytes)| JournalSegment {
                    name: format!(
                        "{} partition {} offset {offset} (generation {generation})",
                        self.config.topic, self.partition
                    ),
                    bytes,
                    may_tear: false,
                })
                .collect(),
        );
        tracing::debug!(store = %self.description, records = read, peak_bytes = peak, epoch, "state.kafka: read the state up to this writer's fence");
        let damage = match (scanned.snapshot, scanned.lost) {
            (Err(why), _) => Err(why),
            (Ok(_), Some(why)) => Err(why),
            (Ok(s), None) => Ok(s),
        };
        let snapshot = match damage {
            Ok(s) => s,
            Err(why) => {
                // Not "never saved": the journal that survived lacks what the lost part held.
                // Marked under this epoch first, so that a crash before the next
                // save finds the state damaged again; then the old records are covered.
                tracing::warn!(store = %self.description, reason = %why, "state.kafka: the saved snapshot cannot be used (the state is damaged or partly lost): it is ignored, every watch lists and emits everything (initial)");
                self.mark_lost(inner, epoch, &why).await?;
                self.clean_up(inner, epoch, None).await;
                inner.journal = Some(Vec::new());
                return Err(StateError::Damaged(why));
            }
        };
        // Copy forward: what was read, written again under this writer's epoch before
        // anything of older epochs is tombstoned. A deposed writer may still tombstone its
        // own records (its saves clean up after themselves); from here on nothing a restore
        // needs is under its epoch.
        match &snapshot {
            Some((bytes, generation)) => {
                self.write_snapshot(inner, epoch, *generation, bytes, journal)
                    .await?;
                self.clean_up(inner, epoch, Some(*generation)).await;
            }
            None if journal.is_empty() => self.clean_up(inner, epoch, None).await,
            None => {
                // No snapshot to anchor a manifest: the journal alone, under this epoch.
                self.write_journal(inner, epoch, journal, "copying the journal forward in")
                    .await?;
                self.clean_up(inner, epoch, None).await;
            }
        }
        Ok(snapshot.map(|(bytes, _)| bytes))
    }

    /// Reads the state's partition from its first offset through offset `last`, folding
    /// this prefix's records as they come ([`Scanner`]): other states' values are never
    /// copied, and a snapshot's chunks are dropped as soon as a newer manifest supersedes
    /// them, so memory follows this state's size, not the partition's. Returns what was
    /// folded, the records read, and the most value bytes held at once.
    async fn read_to(&self, last: i64) -> Result<(Scanned, u64, usize), StateError> {
        let consumer = self.consumer(Offset::Beginning)?;
        let quiet = self.timeout();
        let mut scanner = Scanner::new(&self.prefix);
        let read = tokio::task::spawn_blocking(move || {
            let mut read = 0u64;
            let mut last_progress = Instant::now();
            loop {
                if last_progress.elapsed() > quiet {
                    return Err(format!(
                        "no record for {quiet:?} before reaching this writer's fence at offset {last} ({read} read)"
                    ));
                }
                match consumer.poll(Duration::from_millis(100)) {
                    None => {}
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "state.kafka: consumer error (retrying)")
                    }
                    Some(Ok(m)) => {
                        last_progress = Instant::now();
                        read += 1;
                        let offset = m.offset();
                        let key = m.key().unwrap_or_default();
                        if scanner.wants(key) {
                            let header = |name: &str| {
                                m.headers().and_then(|h| {
                                    h.iter().find(|x| x.key == name).and_then(|x| {
                                        x.value.and_then(|v| {
                                            std::str::from_utf8(v).ok().map(str::to_owned)
                                        })
                                    })
                                })
                            };
                            scanner.push(Record {
                                offset,
                                key: String::from_utf8_lossy(key).into_owned(),
                                value: m.payload().map(<[u8]>::to_vec),
                                writer: header(WRITER_HEADER),
                                epoch: header(EPOCH_HEADER).and_then(|e| e.parse().ok()),
                            });
                        }
                        if offset >= last {
                            let peak = scanner.held_bytes().1;
                            return Ok((scanner.finish(), read, peak));
                        }
                    }
                }
            }
        })
        .await
        .map_err(|e| self.error("reading", e))?;
        read.map_err(|e| self.error("reading", e))
    }

    /// Tombstones `kinds` (best effort: what fails stays known and is tried again later).
    async fn tombstone(&self, inner: &mut Inner, kinds: Vec<Kind>) {
        if kinds.is_empty() {
            return;
        }
        let records = kinds.iter().map(|k| (k.key(&self.prefix), None)).collect();
        match self
            .write(inner, "tombstoning covered records of", records)
            .await
        {
            Ok(_) => {
                for k in &kinds {
                    inner.live.remove(k);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "state.kafka: covered records not tombstoned yet (tried again at the next save; compaction keeps them meanwhile)")
            }
        }
    }

    /// This writer's epoch, writing its fence first when it has none yet (a save before any
    /// restore).
    async fn epoch(&self, inner: &mut Inner) -> Result<i64, StateError> {
        let epoch = match &inner.writer {
            Some((_, e)) => *e,
            None => self.take_over(inner).await?,
        };
        if let Some(reason) = inner.lost.clone() {
            self.mark_lost(inner, epoch, &reason).await?;
        }
        Ok(epoch)
    }

    /// Journal records of this writer under `epoch`, one per `(generation, frame)`, added to
    /// `records` (key, value) and `kinds`.
    fn journal_records(
        &self,
        epoch: i64,
        frames: Vec<(u64, Vec<u8>)>,
        records: &mut Vec<(String, Option<Vec<u8>>)>,
        kinds: &mut Vec<Kind>,
    ) {
        for (generation, frame) in frames {
            let kind = Kind::Journal {
                epoch,
                generation,
                n: self.next_record.fetch_add(1, Ordering::Relaxed),
            };
            records.push((kind.key(&self.prefix), Some(frame)));
            kinds.push(kind);
        }
    }

    /// Writes `frames` (generation, frame) as this writer's journal records under `epoch`.
    async fn write_journal(
        &self,
        inner: &mut Inner,
        epoch: i64,
        frames: Vec<(u64, Vec<u8>)>,
        what: &'static str,
    ) -> Result<(), StateError> {
        let (mut records, mut kinds) = (Vec::new(), Vec::new());
        self.journal_records(epoch, frames, &mut records, &mut kinds);
        self.write(inner, what, records).await?;
        inner.live.extend(kinds);
        Ok(())
    }

    /// Writes snapshot `bytes` of `generation` under `epoch`: its chunks and `journal`
    /// frames (generation, bytes) first, every one acknowledged, then the manifest naming
    /// the chunks. A crash before the manifest leaves the previous one whole.
    async fn write_snapshot(
        &self,
        inner: &mut Inner,
        epoch: i64,
        generation: u64,
        bytes: &[u8],
        journal: Vec<(u64, Vec<u8>)>,
    ) -> Result<(), StateError> {
        let chunk = self.config.chunk_bytes.bytes().max(1);
        let parts: Vec<&[u8]> = if bytes.is_empty() {
            vec![&[]]
        } else {
            bytes.chunks(chunk).collect()
        };
        let chunks =
            u32::try_from(parts.len()).map_err(|_| self.error("writing", "too many chunks"))?;
        let mut records = Vec::with_capacity(parts.len() + journal.len());
        let mut kinds = Vec::with_capacity(records.capacity());
        for (i, part) in (0u32..).zip(&parts) {
            let kind = Kind::Chunk {
                epoch,
                generation,
                i,
            };
            records.push((kind.key(&self.prefix), Some(part.to_vec())));
            kinds.push(kind);
        }
        self.journal_records(epoch, journal, &mut records, &mut kinds);
        self.write(inner, "writing the snapshot to", records)
            .await?;
        inner.live.extend(kinds);
        let manifest = serde_json::to_vec(&Manifest {
            generation,
            chunks,
            bytes: bytes.len() as u64,
            xxh3: xxhash_rust::xxh3::xxh3_64(bytes),
        })
        .map_err(|e| self.error("writing", e))?;
        let m = Kind::Manifest { epoch, generation };
        self.write(
            inner,
            "writing the snapshot's manifest to",
            vec![(m.key(&self.prefix), Some(manifest))],
        )
        .await?;
        inner.live.insert(m);
        Ok(())
    }

    /// Tombstones what this writer's state at `epoch` covers: other writers' fences and every
    /// key of other epochs, and, once it has a snapshot of generation `current`, the chunks
    /// and manifests of its other snapshots.
    async fn clean_up(&self, inner: &mut Inner, epoch: i64, current: Option<u64>) {
        let writer = inner.writer.clone().unwrap_or_default().0;
        let covered: Vec<Kind> = inner
            .live
            .iter()
            .filter(|k| match k {
                Kind::Fence(w) => *w != writer,
                Kind::Chunk {
                    epoch: e,
                    generation: g,
                    ..
                }
                | Kind::Manifest {
                    epoch: e,
                    generation: g,
                } => *e != epoch || current.is_some_and(|c| c != *g),
                Kind::Journal { epoch: e, .. } => *e != epoch,
                Kind::Lost { epoch: e } => *e != epoch || current.is_some(),
            })
            .cloned()
            .collect();
        self.tombstone(inner, covered).await;
    }
}

/// A random writer id (a UUID v4, simple form).
fn new_writer_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[async_trait]
impl StateStore for KafkaStore {
    fn describe(&self) -> &str {
        &self.description
    }

    async fn load(&self) -> Result<Option<Vec<u8>>, StateError> {
        let mut inner = self.inner.lock().await;
        self.restore(&mut inner).await
    }

    async fn save(&self, bytes: Vec<u8>, generation: u64) -> Result<(), StateError> {
        let mut inner = self.inner.lock().await;
        // A topic created again and written past this writer's fence takes new writes at
        // higher offsets: only the fence record itself shows the reset.
        self.fence_held(&mut inner).await?;
        let epoch = self.epoch(&mut inner).await?;
        self.write_snapshot(&mut inner, epoch, generation, &bytes, Vec::new())
            .await?;
        self.clean_up(&mut inner, epoch, Some(generation)).await;
        Ok(())
    }

    async fn append(&self, generation: u64, frames: Vec<Vec<u8>>) -> Result<(), StateError> {
        let mut inner = self.inner.lock().await;
        let epoch = self.epoch(&mut inner).await?;
        let frames = frames.into_iter().map(|f| (generation, f)).collect();
        self.write_journal(&mut inner, epoch, frames, "appending to the journal in")
            .await
    }

    async fn verify(&self) -> Result<bool, StateError> {
        let mut inner = self.inner.lock().await;
        self.fence_held(&mut inner).await
    }

    async fn load_journal(&self) -> Result<Vec<JournalSegment>, StateError> {
        let mut inner = self.inner.lock().await;
        if inner.journal.is_none() {
            self.restore(&mut inner).await?;
        }
        Ok(inner.journal.take().unwrap_or_default())
    }

    async fn drop_journal_before(&self, generation: u64) -> Result<(), StateError> {
        let mut inner = self.inner.lock().await;
        let Some((_, epoch)) = inner.writer.clone() else {
            return Ok(());
        };
        let covered: Vec<Kind> = inner
            .live
            .iter()
            .filter(|k| match k {
                Kind::Journal {
                    epoch: e,
                    generation: g,
                    ..
                } => *e != epoch || *g < generation,
                _ => false,
            })
            .cloned()
            .collect();
        self.tombstone(&mut inner, covered).await;
        Ok(())
    }
}
