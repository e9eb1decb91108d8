//! The NATS I/O: connecting (reconnect policy, event logging), the JetStream stream check or
//! creation, core and JetStream publishing with bounded waits, the healthcheck, and the
//! classification of every client error into a [`SinkError`] kind.
//!
//! A server that is unreachable at start-up does not stop kubesink: the client connects in
//! the background and the stream is checked once it is connected. While the connection is
//! down, failed sends name its cause (the last connection error `connection.rs` keeps,
//! "IO error: Connection refused (os error 111)") instead of a bare timeout.
//!
//! It must never let the client library buffer without limit: the command channel is
//! `client_capacity` long, and every publish, flush and PubAck wait has `publish_timeout`, so
//! during an outage a send fails with [`SinkError::Transient`] and the bounded pipeline holds
//! the backlog. It never prints a secret: messages name the servers (user info removed) and
//! the auth method. It knows nothing of kubesink's configuration: `config.rs` hands it ready
//! [`ConnectOptions`] and settings.

use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, stream};
use async_nats::{ConnectErrorKind, ConnectOptions, ServerAddr};
use futures::stream::{FuturesUnordered, StreamExt};
use kubesink_core::SinkError;

use crate::connection::{is_unreachable, ConnectionWatch, DISCONNECTED};
use crate::request::Publish;

/// Why a connection attempt failed, by the client's error kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The server rejected the credentials.
    Authorization,
    /// The TLS handshake or certificate setup failed.
    Tls,
    /// No answer within `connect_timeout`.
    TimedOut,
    /// A server name did not resolve.
    Dns,
    /// A server URL is invalid.
    BadUrl,
    /// Anything else (refused, reset...).
    Other,
}

impl ConnectFailure {
    fn from_kind(kind: ConnectErrorKind) -> Self {
        match kind {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                ConnectFailure::Authorization
            }
            ConnectErrorKind::Tls => ConnectFailure::Tls,
            ConnectErrorKind::TimedOut => ConnectFailure::TimedOut,
            ConnectErrorKind::Dns => ConnectFailure::Dns,
            ConnectErrorKind::ServerParse => ConnectFailure::BadUrl,
            _ => ConnectFailure::Other,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            ConnectFailure::Authorization => "authorization failed (check the credentials)",
            ConnectFailure::Tls => "TLS failed (check tls.ca_file, cert_file, key_file)",
            ConnectFailure::TimedOut => "timed out",
            ConnectFailure::Dns => "DNS lookup failed",
            ConnectFailure::BadUrl => "invalid server URL",
            ConnectFailure::Other => "connection failed",
        }
    }
}

/// Why the NATS sink could not start.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// The connection failed (unreachable, rejected credentials, TLS).
    #[error("cannot connect to NATS at {servers} (auth: {auth}): {}: {detail}", failure.describe())]
    Connect {
        /// The server URLs, user info removed.
        servers: String,
        /// The auth method's name, never its secret.
        auth: &'static str,
        /// What failed.
        failure: ConnectFailure,
        /// The client's description.
        detail: String,
    },
    /// A file named in the configuration could not be read.
    #[error("{key}: cannot read {path}: {source}")]
    File {
        /// The config key.
        key: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The subject template is invalid.
    #[error("{0}")]
    Template(#[from] kubesink_core::template::TemplateError),
    /// The JetStream stream is missing (and `stream.create = false`) or could not be created.
    #[error("JetStream stream {stream:?} at {servers}: {message}")]
    Stream {
        /// Stream name.
        stream: String,
        /// The server URLs.
        servers: String,
        /// What is wrong and what to do.
        message: String,
    },
}

impl NatsError {
    /// The configuration key an operator should look at.
    pub fn config_key(&self) -> &'static str {
        match self {
            NatsError::Connect {
                failure: ConnectFailure::Authorization,
                ..
            } => "auth",
            NatsError::Connect {
                failure: ConnectFailure::Tls,
                ..
            } => "tls",
            NatsError::Connect { .. } => "servers",
            NatsError::File { key, .. } => key,
            NatsError::Template(_) => "subject",
            NatsError::Stream { .. } => "stream",
        }
    }
}

/// Connects once to `servers` with `options` (the client reconnects forever afterwards).
///
/// # Errors
/// [`NatsError::Connect`] naming the servers (`servers_text`, user info removed), the auth
/// method and what failed.
pub async fn connect_client(
    options: ConnectOptions,
    servers: Vec<ServerAddr>,
    servers_text: &str,
    auth_method: &'static str,
) -> Result<async_nats::Client, NatsError> {
    options
        .connect(servers)
        .await
        .map_err(|e| NatsError::Connect {
            servers: servers_text.to_owned(),
            auth: auth_method,
            failure: ConnectFailure::from_kind(e.kind()),
            detail: e.to_string(),
        })
}

/// How a connected sink publishes.
pub enum Mode {
    /// Core NATS: confirmed by `flush()`.
    Core,
    /// JetStream: confirmed by each message's PubAck, with the stream to check or create.
    JetStream(StreamSetup),
}

/// What to do about the JetStream stream at start-up.
pub enum StreamSetup {
    /// The stream must exist; `subjects` are named in the error when it does not.
    Require {
        /// Stream name.
        name: String,
        /// The subjects it should cover, for the error message.
        subjects: Vec<String>,
    },
    /// Create the stream when it does not exist (an existing stream is used as it is).
    Create(Box<stream::Config>),
}

impl StreamSetup {
    fn name(&self) -> &str {
        match self {
            StreamSetup::Require { name, .. } => name,
            StreamSetup::Create(c) => &c.name,
        }
    }
}

#[allow(clippy::large_enum_variant)] // one per sink, built once
enum Publisher {
    Core,
    JetStream {
        js: jetstream::Context,
        stream: String,
    },
}

/// Settings of [`NatsService::connect`], resolved by `config.rs`.
pub struct Settings {
    /// Sink name (logs, errors).
    pub sink: String,
    /// Server addresses.
    pub servers: Vec<ServerAddr>,
    /// The server URLs for messages, user info removed.
    pub servers_text: String,
    /// The auth method's name for messages.
    pub auth_method: &'static str,
    /// Options with auth and TLS applied.
    pub options: ConnectOptions,
    /// Core or JetStream.
    pub mode: Mode,
    /// Bound on each publish, flush and PubAck wait.
    pub publish_timeout: Duration,
    /// JetStream: PubAcks awaited concurrently.
    pub max_in_flight: usize,
    /// The watch `options` were built with (`connection::base_options`).
    pub watch: ConnectionWatch,
}

/// A NATS client (connected, or connecting in the background) with its publishing mode.
pub struct NatsService {
    sink: String,
    servers: String,
    client: async_nats::Client,
    publisher: Publisher,
    /// The stream check still to do (the server was unreachable at start-up).
    stream_setup: tokio::sync::Mutex<Option<StreamSetup>>,
    publish_timeout: Duration,
    max_in_flight: usize,
    watch: ConnectionWatch,
}

impl NatsService {
    /// Connects once to the servers (reconnecting forever afterwards) and in JetStream mode
    /// checks or creates the stream. When no server can be reached (refused, timed out, DNS)
    /// it logs that once and connects in the background instead: the sink is then not ready,
    /// its sends fail as transient naming the cause, and the stream is checked once
    /// connected.
    ///
    /// # Errors
    /// [`NatsError::Connect`] for rejected credentials, TLS or a bad URL, or
    /// [`NatsError::Stream`].
    pub async fn connect(s: Settings) -> Result<Self, NatsError> {
        let connect_error = |e: async_nats::ConnectError| NatsError::Connect {
            servers: s.servers_text.clone(),
            auth: s.auth_method,
            failure: ConnectFailure::from_kind(e.kind()),
            detail: e.to_string(),
        };
        let client = match s.options.clone().connect(s.servers.clone()).await {
            Ok(c) => c,
            Err(e) if is_unreachable(&e) => {
                let err = connect_error(e);
                tracing::warn!(sink = %s.sink, error = %err, "NATS unreachable at start-up: connecting in the background; changes wait in the pipeline");
                s.watch.set_error(Some(err.to_string()));
                // Logged just now in these words: its end is logged with the counts.
                s.watch.outage().started_quietly(&err.to_string());
                s.options
                    .retry_on_initial_connect()
                    .connect(s.servers)
                    .await
                    .map_err(connect_error)?
            }
            Err(e) => return Err(connect_error(e)),
        };
        let (publisher, stream_setup) = match s.mode {
            Mode::Core => (Publisher::Core, None),
            Mode::JetStream(setup) => {
                let js = jetstream::ContextBuilder::new()
                    .timeout(s.publish_timeout)
                    .max_ack_inflight(s.max_in_flight)
                    .backpressure_on_inflight(true)
                    .build(client.clone());
                let stream = setup.name().to_owned();
                let pending = if client.connection_state() == State::Connected {
                    ensure_stream(&js, &setup, &s.servers_text).await?;
                    None
                } else {
                    Some(setup)
                };
                (Publisher::JetStream { js, stream }, pending)
            }
        };
        Ok(NatsService {
            sink: s.sink,
            servers: s.servers_text,
            client,
            publisher,
            stream_setup: tokio::sync::Mutex::new(stream_setup),
            publish_timeout: s.publish_timeout,
            max_in_flight: s.max_in_flight,
            watch: s.watch,
        })
    }

    /// The connection watch (ready signal, last connection error).
    pub fn watch(&self) -> &ConnectionWatch {
        &self.watch
    }

    /// Why the connection is not up, when it is not: the last connection error the client
    /// recorded, or "disconnected".
    fn down_cause(&self) -> Option<String> {
        if self.client.connection_state() == State::Connected {
            return None;
        }
        Some(
            self.watch
                .last_error()
                .unwrap_or_else(|| DISCONNECTED.to_owned()),
        )
    }

    /// The deferred stream check, once connected.
    ///
    /// # Errors
    /// [`SinkError::Transient`] while not connected or without an answer,
    /// [`SinkError::Fatal`] when the stream is missing and may not be created.
    async fn ensure_stream_ready(&self, js: &jetstream::Context) -> Result<(), SinkError> {
        let mut pending = self.stream_setup.lock().await;
        let Some(setup) = pending.as_ref() else {
            return Ok(());
        };
        if let Some(cause) = self.down_cause() {
            return Err(SinkError::transient(
                &self.sink,
                format!("not connected to NATS at {}: {cause}", self.servers),
            ));
        }
        match tokio::time::timeout(
            self.publish_timeout,
            ensure_stream(js, setup, &self.servers),
        )
        .await
        {
            Ok(Ok(())) => {
                *pending = None;
                Ok(())
            }
            Ok(Err(e)) => Err(match setup {
                StreamSetup::Require { .. } => SinkError::fatal(&self.sink, e.to_string()),
                StreamSetup::Create(_) => SinkError::transient(&self.sink, e.to_string()),
            }),
            Err(_) => Err(SinkError::transient(
                &self.sink,
                format!("JetStream stream check at {}: no answer", self.servers),
            )),
        }
    }

    /// The underlying client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Whether messages are published to JetStream (and carry `Nats-Msg-Id`).
    pub fn is_jetstream(&self) -> bool {
        matches!(self.publisher, Publisher::JetStream { .. })
    }

    /// Whether the client is connected now (a sink that started while NATS was unreachable
    /// connects in the background).
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    /// The server's `max_payload` in bytes (headers included); 0 when unknown.
    pub fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    /// Publishes `batch` and waits for its confirmation: `flush()` in core mode, every
    /// PubAck in JetStream mode (at most `max_in_flight` outstanding).
    ///
    /// # Errors
    /// [`SinkError::Transient`] when the connection is down or a wait timed out;
    /// [`SinkError::Partial`] for the PubAcks that failed; [`SinkError::Fatal`] when no
    /// stream stores a subject.
    pub async fn send(&self, batch: &[Publish]) -> Result<(), SinkError> {
        match &self.publisher {
            Publisher::Core => self.send_core(batch).await,
            Publisher::JetStream { js, .. } => self.send_jetstream(js, batch).await,
        }
    }

    /// A transient error naming the operation, the servers and, while the connection is
    /// down, its cause rather than the symptom (a timeout).
    fn transient(&self, what: &str, e: impl std::fmt::Display) -> SinkError {
        let message = match self.down_cause() {
            Some(cause) => format!("{what} to NATS at {}: not connected: {cause}", self.servers),
            None => format!("{what} to NATS at {}: {e}", self.servers),
        };
        SinkError::transient(&self.sink, message)
    }

    /// A JetStream publish or PubAck error: fatal when no stream stores the subject, else
    /// transient naming the connection's cause while it is down.
    fn publish_error(&self, subject: &str, e: &jetstream::context::PublishError) -> SinkError {
        match classify_jetstream(&self.sink, subject, e) {
            fatal @ SinkError::Fatal { .. } => fatal,
            _ => self.transient(&format!("JetStream publish {subject}"), e),
        }
    }

    fn timed_out(&self) -> String {
        format!("timed out after {:?}", self.publish_timeout)
    }

    async fn send_core(&self, batch: &[Publish]) -> Result<(), SinkError> {
        for p in batch {
            let publish = self.client.publish_with_headers(
                p.subject.clone(),
                p.headers.clone(),
                p.payload.clone(),
            );
            match tokio::time::timeout(self.publish_timeout, publish).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(self.transient(&format!("publish {}", p.subject), e)),
                Err(_) => {
                    return Err(self.transient(&format!("publish {}", p.subject), self.timed_out()))
                }
            }
        }
        self.flush().await
    }

    /// At shutdown: `flush()` while connected; while disconnected, nothing can be flushed, so
    /// it says why at once instead of waiting out `publish_timeout`.
    ///
    /// # Errors
    /// [`SinkError::Transient`].
    pub async fn close(&self) -> Result<(), SinkError> {
        if let Some(cause) = self.down_cause() {
            return Err(SinkError::transient(
                &self.sink,
                format!(
                    "closing: not connected to NATS at {}: {cause}",
                    self.servers
                ),
            ));
        }
        self.flush().await
    }

    /// `flush()` bounded by `publish_timeout`; a failure or timeout is transient.
    ///
    /// # Errors
    /// [`SinkError::Transient`].
    pub async fn flush(&self) -> Result<(), SinkError> {
        match tokio::time::timeout(self.publish_timeout, self.client.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.transient("flush", e)),
            Err(_) => Err(self.transient("flush", self.timed_out())),
        }
    }

    async fn send_jetstream(
        &self,
        js: &jetstream::Context,
        batch: &[Publish],
    ) -> Result<(), SinkError> {
        self.ensure_stream_ready(js).await?;
        let t = self.publish_timeout;
        let mut failed: Vec<usize> = Vec::new();
        let mut first: Option<SinkError> = None;
        let mut acks = FuturesUnordered::new();
        let mut note = |i: usize, e: SinkError, failed: &mut Vec<usize>| {
            failed.push(i);
            if first.is_none() {
                first = Some(e);
            }
        };
        // After a failed publish (not a failed PubAck) the connection is down or the client
        // is saturated: the rest of the batch is marked failed instead of waiting a timeout
        // per message.
        let mut stop = false;
        for (i, p) in batch.iter().enumerate() {
            if stop {
                failed.push(i);
                continue;
            }
            while acks.len() >= self.max_in_flight {
                if let Some((i, Err(e))) = acks.next().await {
                    note(i, self.publish_error(&batch[i].subject, &e), &mut failed);
                }
            }
            let publish = tokio::time::timeout(
                t,
                js.publish_with_headers(p.subject.clone(), p.headers.clone(), p.payload.clone()),
            );
            tokio::pin!(publish);
            // While the publish waits (for the context's `max_in_flight` PubAcks, shared with
            // the other batches in flight), this batch's PubAcks are still collected: an
            // uncollected PubAck future keeps its permit, and concurrent sends each waiting
            // for a permit that only the other's PubAcks would free would wait out the
            // timeout.
            let published = loop {
                tokio::select! {
                    biased;
                    r = &mut publish => break r,
                    Some((j, res)) = acks.next(), if !acks.is_empty() => {
                        if let Err(e) = res {
                            note(j, self.publish_error(&batch[j].subject, &e), &mut failed);
                        }
                    }
                }
            };
            match published {
                Ok(Ok(ack)) => acks.push(async move { (i, ack.await) }),
                Ok(Err(e)) => {
                    note(i, self.publish_error(&p.subject, &e), &mut failed);
                    stop = true;
                }
                Err(_) => {
                    let e = self.transient(
                        &format!("JetStream publish {}", p.subject),
                        format!("timed out after {t:?}"),
                    );
                    note(i, e, &mut failed);
                    stop = true;
                }
            }
        }
        while let Some((i, res)) = acks.next().await {
            if let Err(e) = res {
                note(i, self.publish_error(&batch[i].subject, &e), &mut failed);
            }
        }
        let Some(err) = first else {
            return Ok(());
        };
        if failed.len() == batch.len() {
            return Err(err);
        }
        failed.sort_unstable();
        Err(SinkError::Partial {
            sink: self.sink.clone(),
            failed,
            message: err.to_string(),
        })
    }

    /// Connected, and in JetStream mode the stream exists.
    ///
    /// # Errors
    /// [`SinkError::Transient`] while disconnected or without an answer;
    /// [`SinkError::Fatal`] when the stream is missing.
    pub async fn healthcheck(&self) -> Result<(), SinkError> {
        if let Some(cause) = self.down_cause() {
            return Err(SinkError::transient(
                &self.sink,
                format!("not connected to NATS at {}: {cause}", self.servers),
            ));
        }
        let Publisher::JetStream { js, stream } = &self.publisher else {
            return Ok(());
        };
        self.ensure_stream_ready(js).await?;
        match tokio::time::timeout(self.publish_timeout, js.get_stream(stream)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(SinkError::fatal(
                &self.sink,
                format!("JetStream stream {stream:?} at {}: {e}", self.servers),
            )),
            Err(_) => Err(SinkError::transient(
                &self.sink,
                format!("JetStream stream {stream:?} at {}: no answer", self.servers),
            )),
        }
    }
}

/// Checks the stream exists, or creates it (an existing stream is used as it is).
async fn ensure_stream(
    js: &jetstream::Context,
    setup: &StreamSetup,
    servers: &str,
) -> Result<(), NatsError> {
    let err = |stream: &str, message: String| NatsError::Stream {
        stream: stream.to_owned(),
        servers: servers.to_owned(),
        message,
    };
    match setup {
        StreamSetup::Require { name, subjects } => match js.get_stream(name).await {
            Ok(_) => Ok(()),
            Err(e) => Err(err(
                name,
                format!(
                    "not available ({e}); create it (subjects covering {subjects:?}) or set stream.create = true"
                ),
            )),
        },
        StreamSetup::Create(cfg) => {
            let name = cfg.name.clone();
            match js.get_or_create_stream((**cfg).clone()).await {
                Ok(_) => Ok(()),
                // Another process created it between our look and our create (replicas
                // starting together): the server refuses the second create ("subjects
                // overlap with an existing stream", 10065, found by scripts/chaos.sh seed
                // 73289); the stream it refused for is the one to use.
                Err(create) => match js.get_stream(&name).await {
                    Ok(_) => Ok(()),
                    Err(_) => Err(err(&name, format!("cannot create it: {create}"))),
                },
            }
        }
    }
}

/// A JetStream publish or PubAck error, by kind.
pub fn classify_jetstream(
    sink: &str,
    subject: &str,
    e: &jetstream::context::PublishError,
) -> SinkError {
    use jetstream::context::PublishErrorKind as K;
    match e.kind() {
        K::StreamNotFound => SinkError::fatal(
            sink,
            format!("no JetStream stream stores subject {subject}: check stream.name and stream.subjects"),
        ),
        _ => SinkError::transient(sink, format!("JetStream publish to {subject}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_not_found_is_fatal_and_timeouts_are_transient() {
        use jetstream::context::{PublishError, PublishErrorKind};
        let nf = PublishError::new(PublishErrorKind::StreamNotFound);
        assert!(classify_jetstream("n", "a.b", &nf).is_fatal());
        let to = PublishError::new(PublishErrorKind::TimedOut);
        assert!(!classify_jetstream("n", "a.b", &to).is_fatal());
    }

    #[test]
    fn the_config_key_follows_the_failure_kind() {
        let connect = |failure| NatsError::Connect {
            servers: "nats://h:1".into(),
            auth: "token",
            failure,
            detail: String::new(),
        };
        assert_eq!(connect(ConnectFailure::Authorization).config_key(), "auth");
        assert_eq!(connect(ConnectFailure::Tls).config_key(), "tls");
        assert_eq!(connect(ConnectFailure::Other).config_key(), "servers");
    }
}
