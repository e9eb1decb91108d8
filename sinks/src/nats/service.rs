//! The NATS I/O: connecting (auth, TLS, reconnect policy, event logging), the JetStream
//! stream check or creation, and the classification of every client error into a
//! [`SinkError`] kind.
//!
//! It must never let the client library buffer without limit: the command channel is
//! `client_capacity` long, and every publish, flush and PubAck wait has `publish_timeout`, so
//! during an outage `send` fails with [`SinkError::Transient`] and the bounded pipeline holds
//! the backlog. It never prints a secret: messages name the servers (user info removed) and
//! the auth method.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_nats::{ConnectErrorKind, ConnectOptions, Event, ServerAddr};

use super::config::{NatsConfig, NatsStorage};
use crate::SinkError;

/// Why the NATS sink could not start.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// The connection failed (unreachable, rejected credentials, TLS).
    #[error("cannot connect to NATS at {servers} (auth: {auth}): {kind}: {detail}")]
    Connect {
        /// The server URLs, user info removed.
        servers: String,
        /// The auth method's name, never its secret.
        auth: &'static str,
        /// What failed, in words.
        kind: String,
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
    Template(#[from] super::request::TemplateError),
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
            NatsError::Connect { kind, .. } if kind.starts_with("authorization") => "auth",
            NatsError::Connect { kind, .. } if kind.starts_with("TLS") => "tls",
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

/// The server list for messages: URLs joined by `,`, user info removed.
pub fn servers_text(config: &NatsConfig) -> String {
    config
        .servers
        .iter()
        .map(|s| redact_url(s))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reconnect delay: 100 ms doubling to at most 5 s, forever.
fn reconnect_delay(attempts: usize) -> Duration {
    let exp = u32::try_from(attempts.min(6)).unwrap_or(6);
    Duration::from_millis(100 * 2u64.pow(exp)).min(Duration::from_secs(5))
}

/// Connects once to the configured servers (reconnecting forever afterwards).
///
/// # Errors
/// [`NatsError::Connect`] or [`NatsError::File`].
pub async fn connect(config: &NatsConfig) -> Result<async_nats::Client, NatsError> {
    let sink = config.name.clone();
    let mut opts = ConnectOptions::new()
        .name(&config.connection_name)
        .connection_timeout(config.connect_timeout)
        .request_timeout(Some(config.publish_timeout))
        .client_capacity(config.client_capacity)
        .max_reconnects(None)
        .reconnect_delay_callback(reconnect_delay)
        .require_tls(config.tls.required)
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
                    other => tracing::warn!(sink = %sink, event = %other, "NATS connection event"),
                }
            }
        });
    let auth = &config.auth;
    if let (Some(user), Some(pass)) = (&auth.user, &auth.password) {
        opts = opts.user_and_password(user.clone(), pass.expose().to_owned());
    }
    if let Some(token) = &auth.token {
        opts = opts.token(token.expose().to_owned());
    }
    if let Some(seed) = &auth.nkey_seed {
        opts = opts.nkey(seed.expose().to_owned());
    }
    if let Some(path) = &auth.credentials_file {
        opts = opts
            .credentials_file(path)
            .await
            .map_err(|source| NatsError::File {
                key: "auth.credentials_file",
                path: path.display().to_string(),
                source,
            })?;
    }
    if let Some(ca) = &config.tls.ca_file {
        opts = opts.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&config.tls.cert_file, &config.tls.key_file) {
        opts = opts.add_client_certificate(cert.clone(), key.clone());
    }
    let addrs: Vec<ServerAddr> = config
        .servers
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    opts.connect(addrs).await.map_err(|e| {
        let kind = match e.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                "authorization failed (check the credentials)"
            }
            ConnectErrorKind::Tls => "TLS failed (check tls.ca_file, cert_file, key_file)",
            ConnectErrorKind::TimedOut => "timed out",
            ConnectErrorKind::Dns => "DNS lookup failed",
            ConnectErrorKind::ServerParse => "invalid server URL",
            _ => "connection failed",
        };
        NatsError::Connect {
            servers: servers_text(config),
            auth: config.auth.method(),
            kind: kind.to_owned(),
            detail: e.to_string(),
        }
    })
}

/// Checks the stream exists, or creates it when `stream.create` (an existing stream is used
/// as it is).
///
/// # Errors
/// [`NatsError::Stream`].
pub async fn ensure_stream(js: &jetstream::Context, config: &NatsConfig) -> Result<(), NatsError> {
    let s = &config.stream;
    let err = |message: String| NatsError::Stream {
        stream: s.name.clone(),
        servers: servers_text(config),
        message,
    };
    if !s.create {
        return match js.get_stream(&s.name).await {
            Ok(_) => Ok(()),
            Err(e) => Err(err(format!(
                "not available ({e}); create it (subjects covering {:?}) or set stream.create = true",
                config.stream_subjects()
            ))),
        };
    }
    let cfg = stream::Config {
        name: s.name.clone(),
        subjects: config.stream_subjects(),
        storage: match s.storage {
            NatsStorage::File => stream::StorageType::File,
            NatsStorage::Memory => stream::StorageType::Memory,
        },
        max_age: s.max_age,
        duplicate_window: s.duplicate_window,
        max_messages_per_subject: s.max_msgs_per_subject,
        ..Default::default()
    };
    js.get_or_create_stream(cfg)
        .await
        .map(|_| ())
        .map_err(|e| err(format!("cannot create it: {e}")))
}

/// A core publish or flush error.
pub fn transient(sink: &str, servers: &str, what: &str, e: impl std::fmt::Display) -> SinkError {
    SinkError::transient(sink, format!("{what} to NATS at {servers}: {e}"))
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
        assert_eq!(reconnect_delay(0), Duration::from_millis(100));
        assert_eq!(reconnect_delay(3), Duration::from_millis(800));
        assert_eq!(reconnect_delay(100), Duration::from_secs(5));
    }

    #[test]
    fn stream_not_found_is_fatal_and_timeouts_are_transient() {
        use jetstream::context::{PublishError, PublishErrorKind};
        let nf = PublishError::new(PublishErrorKind::StreamNotFound);
        assert!(classify_jetstream("n", "a.b", &nf).is_fatal());
        let to = PublishError::new(PublishErrorKind::TimedOut);
        assert!(!classify_jetstream("n", "a.b", &to).is_fatal());
    }
}
