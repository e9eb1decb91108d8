//! The `nats` state backend: one object in a NATS JetStream object store
//! (<https://docs.nats.io/nats-concepts/jetstream/obj_store>), so whichever replica runs
//! finds the state (a hand-over between nodes), connected like a NATS sink (same auth and
//! TLS options, `kubesink_sinks::nats::client_options`).
//!
//! A put writes the object's chunks, then its metadata, then purges the old chunks: a reader
//! sees the old or the new object, whole. It connects on first use and the client reconnects
//! forever after; a server that is down at start-up costs a full initial emit (the load
//! fails), never a failed start. Never logs a secret.

use std::time::Duration;

use async_nats::jetstream::{self, object_store};
use async_trait::async_trait;
use kubesink_sinks::nats::{
    client_options, connect_client, server_addrs, servers_text, ClientSettings, ConnectionWatch,
    NatsStorage,
};
use tokio::io::AsyncReadExt;
use tokio::sync::Mutex;

use super::{StateError, StateStore};
use crate::config::StateNatsConfig;

/// The state in a JetStream object store.
pub struct NatsStore {
    config: StateNatsConfig,
    object: String,
    servers: String,
    description: String,
    bucket: Mutex<Option<object_store::ObjectStore>>,
}

impl NatsStore {
    /// The store of `config`; the object defaults to `cluster`. Connects on first use.
    pub fn new(config: &StateNatsConfig, cluster: &str) -> Self {
        let object = config.object.clone().unwrap_or_else(|| cluster.to_owned());
        let servers = servers_text(&config.servers);
        let description = format!("NATS object store {}/{object} at {servers}", config.bucket);
        NatsStore {
            config: config.clone(),
            object,
            servers,
            description,
            bucket: Mutex::new(None),
        }
    }

    fn error(&self, what: &'static str, detail: impl std::fmt::Display) -> StateError {
        StateError::Nats {
            what,
            servers: self.servers.clone(),
            bucket: self.config.bucket.clone(),
            object: self.object.clone(),
            detail: detail.to_string(),
        }
    }

    /// The bucket, connecting (and creating it, with `create`) on first use.
    async fn bucket(&self) -> Result<object_store::ObjectStore, StateError> {
        let mut slot = self.bucket.lock().await;
        if let Some(b) = slot.as_ref() {
            return Ok(b.clone());
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
            &ConnectionWatch::default(),
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
                    storage: match c.storage {
                        NatsStorage::File => jetstream::stream::StorageType::File,
                        NatsStorage::Memory => jetstream::stream::StorageType::Memory,
                    },
                    num_replicas: c.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| self.error("creating the bucket of", e))?,
        };
        *slot = Some(bucket.clone());
        Ok(bucket)
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

    async fn save(&self, bytes: Vec<u8>) -> Result<(), StateError> {
        self.bounded("writing", async {
            let bucket = self.bucket().await?;
            bucket
                .put(self.object.as_str(), &mut bytes.as_slice())
                .await
                .map_err(|e| self.error("writing", e))?;
            Ok(())
        })
        .await
    }
}
