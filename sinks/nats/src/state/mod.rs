//! The `nats` state backend: one object in a NATS JetStream object store
//! (<https://docs.nats.io/nats-concepts/jetstream/obj_store>), so whichever replica runs
//! finds the state (a hand-over between nodes), connected like a NATS sink (same auth and
//! TLS options, [`client_options`]).
//!
//! A put writes the object's chunks, then its metadata, then purges the old chunks: a reader
//! sees the old or the new object, whole. It connects on first use and the client reconnects
//! forever after; a server that is down at start-up is never a failed start: the load fails,
//! and the watches wait for it (`bridge/watching.rs`). Never logs a secret.
//!
//! The journal (`journal.rs`) is a JetStream stream beside the bucket, `{bucket}_JOURNAL`
//! (subjects `kubesink-journal.{bucket}.>`, created like the bucket with `create = true`):
//! one message per frame on subject `kubesink-journal.{bucket}.{object}` (the object escaped
//! as a subject token), with its generation in the header `Kubesink-Generation`. An append is
//! durable once its PubAck arrived. Dropping the generations below G purges the subject up
//! to (not including) the sequence after the last known message of a generation below G:
//! the writer appends in generation order, so later generations are never touched.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use async_nats::jetstream::{object_store, stream};
use async_trait::async_trait;
use futures::StreamExt;
use kubesink_core::state::{JournalSegment, StateError, StateStore};
use tokio::io::AsyncReadExt;
use tokio::sync::Mutex;

use crate::{
    client_options, connect_client, escape_token, server_addrs, servers_text, ClientSettings,
    ConnectionWatch, NatsStorage,
};

mod config;

pub use config::StateNatsConfig;

/// A NATS operation of the `nats` state backend failed (carried as
/// [`StateError::Backend`]).
#[derive(Debug, thiserror::Error)]
#[error("state.nats: {what} object {object:?} in bucket {bucket:?} at {servers}: {detail}")]
pub struct NatsStateError {
    /// What was being done (`connecting`, `reading`, `writing`, ...).
    pub what: &'static str,
    /// The servers, user info removed.
    pub servers: String,
    /// The bucket.
    pub bucket: String,
    /// The object.
    pub object: String,
    /// The client's description.
    pub detail: String,
}

/// The header that carries a journal message's generation.
const GENERATION_HEADER: &str = "Kubesink-Generation";

/// The object metadata key that carries the saved state's journal generation
/// ([`StateStore::saved_generation`]).
const GENERATION_METADATA: &str = "kubesink-generation";

/// A live connection: the JetStream context and the bucket.
#[derive(Clone)]
struct Conn {
    js: jetstream::Context,
    bucket: object_store::ObjectStore,
}

/// The state in a JetStream object store, its journal in a stream beside it.
pub struct NatsStore {
    config: StateNatsConfig,
    object: String,
    servers: String,
    description: String,
    /// `{bucket}_JOURNAL`.
    journal_stream: String,
    /// `kubesink-journal.{bucket}.{object}`.
    journal_subject: String,
    conn: Mutex<Option<Conn>>,
    /// The journal stream, once it was found or created.
    stream: Mutex<Option<stream::Stream>>,
    /// The last stream sequence known of each journal generation (from PubAcks and loads).
    sequences: std::sync::Mutex<BTreeMap<u64, u64>>,
}

impl NatsStore {
    /// The store of `config`; the object defaults to `cluster`. Connects on first use.
    pub fn new(config: &StateNatsConfig, cluster: &str) -> Self {
        let object = config.object.clone().unwrap_or_else(|| cluster.to_owned());
        let servers = servers_text(&config.servers);
        let description = format!("NATS object store {}/{object} at {servers}", config.bucket);
        let mut journal_subject = format!("kubesink-journal.{}.", config.bucket);
        escape_token(&object, &mut journal_subject);
        NatsStore {
            journal_stream: format!("{}_JOURNAL", config.bucket),
            journal_subject,
            config: config.clone(),
            object,
            servers,
            description,
            conn: Mutex::new(None),
            stream: Mutex::new(None),
            sequences: std::sync::Mutex::default(),
        }
    }

    fn note_sequence(&self, generation: u64, sequence: u64) {
        let mut seqs = self.sequences.lock().unwrap_or_else(|p| p.into_inner());
        let last = seqs.entry(generation).or_default();
        *last = (*last).max(sequence);
    }

    fn storage(&self) -> stream::StorageType {
        match self.config.storage {
            NatsStorage::File => stream::StorageType::File,
            NatsStorage::Memory => stream::StorageType::Memory,
        }
    }

    /// The journal stream, finding (or, with `create`, creating) it on first use; `None`
    /// when it does not exist and `create` is off.
    async fn journal(&self, create: bool) -> Result<Option<stream::Stream>, StateError> {
        let mut slot = self.stream.lock().await;
        if let Some(s) = slot.as_ref() {
            return Ok(Some(s.clone()));
        }
        let js = self.connect().await?.js;
        let found = match js.get_stream(&self.journal_stream).await {
            Ok(s) => s,
            Err(e) => match e.kind() {
                jetstream::context::GetStreamErrorKind::JetStream(j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
                {
                    if !create {
                        return Ok(None);
                    }
                    if !self.config.create {
                        return Err(self.error(
                            "opening the journal stream of",
                            format!("no stream {} (create it with subjects [\"kubesink-journal.{}.>\"], or set state.nats.create = true)", self.journal_stream, self.config.bucket),
                        ));
                    }
                    js.get_or_create_stream(stream::Config {
                        name: self.journal_stream.clone(),
                        description: Some(
                            "kubesink: journal of new objects between state saves".into(),
                        ),
                        subjects: vec![format!("kubesink-journal.{}.>", self.config.bucket)],
                        storage: self.storage(),
                        num_replicas: self.config.replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| self.error("creating the journal stream of", e))?
                }
                _ => return Err(self.error("opening the journal stream of", e)),
            },
        };
        *slot = Some(found.clone());
        Ok(Some(found))
    }

    fn error(&self, what: &'static str, detail: impl std::fmt::Display) -> StateError {
        StateError::Backend(Box::new(NatsStateError {
            what,
            servers: self.servers.clone(),
            bucket: self.config.bucket.clone(),
            object: self.object.clone(),
            detail: detail.to_string(),
        }))
    }

    /// The bucket, connecting (and creating it, with `create`) on first use.
    async fn bucket(&self) -> Result<object_store::ObjectStore, StateError> {
        Ok(self.connect().await?.bucket)
    }

    /// The connection and the bucket, connecting (and creating the bucket, with `create`) on
    /// first use.
    async fn connect(&self) -> Result<Conn, StateError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = &self.config;
        let options = client_options(
            &ClientSettings {
                name: "state",
                connection_name: &c.connection_name,
                connect_timeout: c.connect_timeout.get(),
                request_timeout: c.timeout.get(),
                client_capacity: 64,
            },
            &c.auth,
            &c.tls,
            &ConnectionWatch::new("state"),
        )
        .await
        .map_err(|e| self.error("connecting to", e))?;
        let client = connect_client(
            options,
            server_addrs(&c.servers),
            &self.servers,
            c.auth.method(),
        )
        .await
        .map_err(|e| self.error("connecting to", e))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(c.timeout.get())
            .build(client);
        let bucket = match js.get_object_store(&c.bucket).await {
            Ok(b) => b,
            Err(e) if !c.create => {
                return Err(self.error(
                    "opening",
                    format!("{e}; create the bucket or set state.nats.create = true"),
                ))
            }
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: c.bucket.clone(),
                    description: Some("kubesink: acknowledged informer state".into()),
                    storage: self.storage(),
                    num_replicas: c.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| self.error("creating the bucket of", e))?,
        };
        let conn = Conn { js, bucket };
        *slot = Some(conn.clone());
        Ok(conn)
    }

    async fn bounded<T>(
        &self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<T, StateError>>,
    ) -> Result<T, StateError> {
        // Object transfers are many requests; bound the whole by a generous multiple.
        let limit = self.config.timeout.get() * 6 + Duration::from_secs(1);
        tokio::time::timeout(limit, f)
            .await
            .map_err(|_| self.error(what, format!("no answer within {limit:?}")))?
    }
}

#[async_trait]
impl StateStore for NatsStore {
    fn describe(&self) -> &str {
        &self.description
    }

    async fn load(&self) -> Result<Option<Vec<u8>>, StateError> {
        self.bounded("reading", async {
            let bucket = self.bucket().await?;
            let mut object = match bucket.get(&self.object).await {
                Ok(o) => o,
                Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(self.error("reading", e)),
            };
            let mut bytes = Vec::new();
            object
                .read_to_end(&mut bytes)
                .await
                .map_err(|e| self.error("reading", e))?;
            Ok(Some(bytes))
        })
        .await
    }

    async fn save(&self, bytes: Vec<u8>, generation: u64) -> Result<(), StateError> {
        self.bounded("writing", async {
            let bucket = self.bucket().await?;
            let meta = object_store::ObjectMetadata {
                name: self.object.clone(),
                metadata: [(GENERATION_METADATA.to_owned(), generation.to_string())].into(),
                ..Default::default()
            };
            bucket
                .put(meta, &mut bytes.as_slice())
                .await
                .map_err(|e| self.error("writing", e))?;
            Ok(())
        })
        .await
    }

    async fn saved_generation(&self) -> Result<Option<u64>, StateError> {
        self.bounded("reading the metadata of", async {
            let bucket = self.bucket().await?;
            match bucket.info(&self.object).await {
                Ok(info) => Ok(info
                    .metadata
                    .get(GENERATION_METADATA)
                    .and_then(|g| g.parse().ok())),
                Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => Ok(None),
                Err(e) => Err(self.error("reading the metadata of", e)),
            }
        })
        .await
    }

    async fn append(&self, generation: u64, frames: Vec<Vec<u8>>) -> Result<(), StateError> {
        let what = "appending to the journal of";
        let limit = self.config.timeout.get() * 2;
        let appended = tokio::time::timeout(limit, async {
            self.journal(true).await?;
            let js = self.connect().await?.js;
            // Published in order, then every PubAck awaited: one round trip per group.
            let mut acks = Vec::with_capacity(frames.len());
            for frame in frames {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(GENERATION_HEADER, generation.to_string().as_str());
                let ack = js
                    .publish_with_headers(self.journal_subject.clone(), headers, frame.into())
                    .await
                    .map_err(|e| self.error(what, e))?;
                acks.push(ack);
            }
            for ack in acks {
                let ack = ack.await.map_err(|e| self.error(what, e))?;
                self.note_sequence(generation, ack.sequence);
            }
            Ok(())
        })
        .await;
        appended.map_err(|_| self.error(what, format!("no PubAck within {limit:?}")))?
    }

    async fn load_journal(&self) -> Result<Vec<JournalSegment>, StateError> {
        let what = "reading the journal of";
        self.bounded(what, async {
            let Some(stream) = self.journal(false).await? else {
                return Ok(Vec::new()); // nothing was ever journaled here
            };
            let consumer = stream
                .create_consumer(OrderedConfig {
                    deliver_policy: DeliverPolicy::All,
                    filter_subject: self.journal_subject.clone(),
                    ..Default::default()
                })
                .await
                .map_err(|e| self.error(what, e))?;
            let mut out = Vec::new();
            if consumer.cached_info().num_pending == 0 {
                return Ok(out);
            }
            let mut messages = consumer.messages().await.map_err(|e| self.error(what, e))?;
            while let Some(m) = messages.next().await {
                let m = m.map_err(|e| self.error(what, e))?;
                let info = m.info().map_err(|e| self.error(what, e))?;
                let (sequence, pending) = (info.stream_sequence, info.pending);
                let generation = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(GENERATION_HEADER))
                    .and_then(|g| g.as_str().parse::<u64>().ok());
                if let Some(g) = generation {
                    self.note_sequence(g, sequence);
                }
                out.push(JournalSegment {
                    name: format!("{} sequence {sequence}", self.journal_stream),
                    bytes: m.payload.to_vec(),
                    may_tear: false,
                });
                if pending == 0 {
                    break;
                }
            }
            Ok(out)
        })
        .await
    }

    async fn drop_journal_before(&self, generation: u64) -> Result<(), StateError> {
        let what = "dropping old journal generations of";
        let below: Option<u64> = {
            let mut seqs = self.sequences.lock().unwrap_or_else(|p| p.into_inner());
            let bound = seqs.range(..generation).map(|(_, s)| *s).max();
            seqs.retain(|g, _| *g >= generation);
            bound
        };
        let Some(last) = below else {
            return Ok(());
        };
        self.bounded(what, async {
            let Some(stream) = self.journal(false).await? else {
                return Ok(());
            };
            stream
                .purge()
                .filter(self.journal_subject.clone())
                .sequence(last + 1)
                .await
                .map_err(|e| self.error(what, e))?;
            Ok(())
        })
        .await
    }
}
