//! The NATS I/O: connecting (reconnect policy, event logging), the JetStream stream check or
//! creation, core and JetStream publishing with bounded waits, the healthcheck, and the
//! classification of every client error into a [`SinkError`] kind.
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
use async_nats::{ConnectErrorKind, ConnectOptions, Event, ServerAddr};
use futures::stream::{FuturesUnordered, StreamExt};

use super::request::Publish;
use crate::backoff::Backoff;
use crate::SinkError;

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
    Template(#[from] crate::template::TemplateError),
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

/// `nats://user:pass@host:4222` → `nats://***@host:4222`.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        (None, Some(at)) => format!("***{}", &url[at..]),
        _ => url.to_owned(),
    }
}

/// Reconnect delays: 100 ms doubling to at most 5 s, forever (no jitter: async-nats calls
/// the delay callback with the attempt number).
const RECONNECT: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).without_jitter();

/// The connection options every NATS sink starts from: its name, timeouts, bounded client
/// buffer, reconnect forever with [`RECONNECT`] delays, and connection events logged with the
/// sink name. `config.rs` adds authentication and TLS.
pub fn base_options(
    sink: &str,
    connection_name: &str,
    connect_timeout: Duration,
    request_timeout: Duration,
    client_capacity: usize,
) -> ConnectOptions {
    let sink = sink.to_owned();
    ConnectOptions::new()
        .name(connection_name)
        .connection_timeout(connect_timeout)
        .request_timeout(Some(request_timeout))
        .client_capacity(client_capacity)
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| RECONNECT.delay(attempts))
        .event_callback(move |event| {
            let sink = sink.clone();
            async move {
                match event {
                    Event::Connected => tracing::info!(sink = %sink, "NATS connected"),
                    Event::Disconnected => {
                        tracing::warn!(sink = %sink, "NATS disconnected; reconnecting")
                    }
                    Event::ServerError(e) => {
                        tracing::error!(sink = %sink, error = %e, "NATS server error")
                    }
                    Event::ClientError(e) => {
                        tracing::error!(sink = %sink, error = %e, "NATS client error")
                    }
                    // The connection closed because the sink closed it (shutdown).
                    Event::Closed => tracing::info!(sink = %sink, "NATS connection closed"),
                    other => tracing::warn!(sink = %sink, event = %other, "NATS connection event"),
                }
            }
        })
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
}

/// A connected NATS client with its publishing mode.
pub struct NatsService {
    sink: String,
    servers: String,
    client: async_nats::Client,
    publisher: Publisher,
    publish_timeout: Duration,
    max_in_flight: usize,
}

impl NatsService {
    /// Connects once to the servers (reconnecting forever afterwards) and in JetStream mode
    /// checks or creates the stream.
    ///
    /// # Errors
    /// [`NatsError::Connect`] or [`NatsError::Stream`].
    pub async fn connect(s: Settings) -> Result<Self, NatsError> {
        let client = connect_client(s.options, s.servers, &s.servers_text, s.auth_method).await?;
        let publisher = match s.mode {
            Mode::Core => Publisher::Core,
            Mode::JetStream(setup) => {
                let js = jetstream::ContextBuilder::new()
                    .timeout(s.publish_timeout)
                    .max_ack_inflight(s.max_in_flight)
                    .backpressure_on_inflight(true)
                    .build(client.clone());
                let stream = setup.name().to_owned();
                ensure_stream(&js, setup, &s.servers_text).await?;
                Publisher::JetStream { js, stream }
            }
        };
        Ok(NatsService {
            sink: s.sink,
            servers: s.servers_text,
            client,
            publisher,
            publish_timeout: s.publish_timeout,
            max_in_flight: s.max_in_flight,
        })
    }

    /// The underlying client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Whether messages are published to JetStream (and carry `Nats-Msg-Id`).
    pub fn is_jetstream(&self) -> bool {
        matches!(self.publisher, Publisher::JetStream { .. })
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

    fn transient(&self, what: &str, e: impl std::fmt::Display) -> SinkError {
        SinkError::transient(
            &self.sink,
            format!("{what} to NATS at {}: {e}", self.servers),
        )
    }

    fn timed_out(&self) -> String {
        format!("timed out after {:?} (disconnected?)", self.publish_timeout)
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
            let publish =
                js.publish_with_headers(p.subject.clone(), p.headers.clone(), p.payload.clone());
            match tokio::time::timeout(t, publish).await {
                Ok(Ok(ack)) => acks.push(async move { (i, ack.await) }),
                Ok(Err(e)) => {
                    note(
                        i,
                        classify_jetstream(&self.sink, &p.subject, &e),
                        &mut failed,
                    );
                    stop = true;
                }
                Err(_) => {
                    let e = SinkError::transient(
                        &self.sink,
                        format!(
                            "JetStream publish to {} at {}: timed out after {t:?}",
                            p.subject, self.servers
                        ),
                    );
                    note(i, e, &mut failed);
                    stop = true;
                }
            }
            while acks.len() >= self.max_in_flight {
                if let Some((i, Err(e))) = acks.next().await {
                    let subject = &batch[i].subject;
                    note(i, classify_jetstream(&self.sink, subject, &e), &mut failed);
                }
            }
        }
        while let Some((i, res)) = acks.next().await {
            if let Err(e) = res {
                let subject = &batch[i].subject;
                note(i, classify_jetstream(&self.sink, subject, &e), &mut failed);
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
        if self.client.connection_state() != State::Connected {
            return Err(SinkError::transient(
                &self.sink,
                format!("not connected to NATS at {}", self.servers),
            ));
        }
        let Publisher::JetStream { js, stream } = &self.publisher else {
            return Ok(());
        };
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
    setup: StreamSetup,
    servers: &str,
) -> Result<(), NatsError> {
    let err = |stream: &str, message: String| NatsError::Stream {
        stream: stream.to_owned(),
        servers: servers.to_owned(),
        message,
    };
    match setup {
        StreamSetup::Require { name, subjects } => match js.get_stream(&name).await {
            Ok(_) => Ok(()),
            Err(e) => Err(err(
                &name,
                format!(
                    "not available ({e}); create it (subjects covering {subjects:?}) or set stream.create = true"
                ),
            )),
        },
        StreamSetup::Create(cfg) => {
            let name = cfg.name.clone();
            js.get_or_create_stream(*cfg)
                .await
                .map(|_| ())
                .map_err(|e| err(&name, format!("cannot create it: {e}")))
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
    fn urls_lose_their_user_info_in_messages() {
        assert_eq!(
            redact_url("nats://bob:hunter2@nats.example:4222"),
            "nats://***@nats.example:4222"
        );
        assert_eq!(redact_url("tls://nats:4222"), "tls://nats:4222");
        assert_eq!(redact_url("bob:pw@host:4222"), "***@host:4222");
    }

    #[test]
    fn reconnect_delay_backs_off_to_five_seconds() {
        assert_eq!(RECONNECT.delay(0), Duration::from_millis(100));
        assert_eq!(RECONNECT.delay(3), Duration::from_millis(800));
        assert_eq!(RECONNECT.delay(100), Duration::from_secs(5));
    }

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
