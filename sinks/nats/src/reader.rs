//! The JetStream source: one stream from its first sequence through an ordered consumer
//! (ephemeral, no acks, nothing left on the server), optionally with a subject filter.
//! Caught up when the consumer reached the stream's last sequence read at start, or has
//! nothing pending (a filter whose last match is older).
//!
//! Its connection is deliberately not the sink's ([`client_options`](crate::client_options)):
//! that one reconnects forever and keeps a bounded buffer, which is right for a service and
//! wrong for a command that must exit 2 naming the servers when they cannot be reached. Here
//! one attempt is bounded by the timeout, and the URL's user info or a `.creds` file
//! authenticates.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use futures::StreamExt;
use kubesink_core::readback::BrokerRecord;
use kubesink_core::readback::{Event, ReadOptions, Reading, SourceError};
use tokio::sync::mpsc;

/// `kubesink fold`'s options for a JetStream stream: `--nats URL --stream S [--subject F]
/// [--nats-credentials FILE]`.
#[derive(Debug, Clone, Default, clap::Args)]
#[group(skip)] // its source option is in `kubesink fold`'s `source` group
pub struct ReadArgs {
    /// NATS server URL(s) (`nats://host:4222`, comma-separated); with `--stream`.
    #[arg(long, value_name = "URL", requires = "stream", group = "source")]
    pub nats: Option<String>,
    /// The JetStream stream (read from its first sequence by an ordered consumer).
    #[arg(long)]
    pub stream: Option<String>,
    /// A subject filter within the stream's subjects (`kubesink.prod.core.Pod.*.*`).
    #[arg(long, requires = "stream")]
    pub subject: Option<String>,
    /// A NATS credentials file (`.creds`).
    #[arg(long, value_name = "FILE")]
    pub nats_credentials: Option<PathBuf>,
}

impl ReadOptions for ReadArgs {
    fn open(
        &self,
        timeout: Duration,
        follow: bool,
        tx: mpsc::Sender<Event>,
    ) -> Option<Result<(Reading, String), String>> {
        let servers = self.nats.clone()?;
        let Some(stream) = self.stream.clone() else {
            return Some(Err("--nats needs --stream".to_owned()));
        };
        let src = JetStreamSource {
            servers,
            stream,
            subject: self.subject.clone(),
            credentials: self.nats_credentials.clone(),
            timeout,
        };
        let what = format!("JetStream stream {} at {}", src.stream, src.servers);
        Some(Ok((Box::pin(read(src, follow, tx)) as Reading, what)))
    }
}

/// Where to read.
#[derive(Debug, Clone)]
pub struct JetStreamSource {
    /// Server URL(s), comma-separated (`nats://host:4222`); user info in the URL is used.
    pub servers: String,
    /// The stream name.
    pub stream: String,
    /// Subject filter (must be within the stream's subjects, e.g. `kubesink.prod.core.Pod.*.*`).
    pub subject: Option<String>,
    /// A `.creds` file (JWT + NKey).
    pub credentials: Option<PathBuf>,
    /// Bound on connecting and on each JetStream request at start.
    pub timeout: Duration,
}

/// Reads the stream into `tx`.
///
/// # Errors
/// [`SourceError`] naming the servers and the stream: unreachable, authorization, no such
/// stream, a filter the stream refuses, a broken consumer.
pub async fn read(
    src: JetStreamSource,
    follow: bool,
    tx: mpsc::Sender<Event>,
) -> Result<(), SourceError> {
    let what = format!("JetStream stream {} at {}", src.stream, src.servers);
    let open = |reason: String| SourceError::Open {
        what: what.clone(),
        reason,
    };
    let mut options = async_nats::ConnectOptions::new()
        .name("kubesink-fold")
        .connection_timeout(src.timeout)
        .request_timeout(Some(src.timeout));
    if let Some(path) = &src.credentials {
        options = options
            .credentials_file(path)
            .await
            .map_err(|e| open(format!("credentials file {}: {e}", path.display())))?;
    }
    let client = tokio::time::timeout(src.timeout, options.connect(src.servers.as_str()))
        .await
        .map_err(|_| open(format!("no connection within {:?}", src.timeout)))?
        .map_err(|e| open(format!("cannot connect: {e}")))?;
    let js = jetstream::new(client);
    let mut stream = js.get_stream(&src.stream).await.map_err(|e| {
        open(match e.kind() {
            jetstream::context::GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                "no such stream".to_owned()
            }
            _ => format!("cannot read the stream's info (is JetStream enabled?): {e}"),
        })
    })?;
    let last = stream
        .info()
        .await
        .map_err(|e| open(format!("stream info: {e}")))?
        .state
        .last_sequence;
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::All,
            filter_subject: src.subject.clone().unwrap_or_default(),
            ..Default::default()
        })
        .await
        .map_err(|e| {
            open(match &src.subject {
                Some(s) => format!(
                    "the stream refused a consumer with subject filter {s} (it must lie within the \
                     stream's subjects: `kubesink.prod.core.Pod.*.*`, not `kubesink.prod.core.Pod.>`, \
                     for the default `kubesink.*.*.*.*.*`): {e}"
                ),
                None => format!("creating an ordered consumer: {e}"),
            })
        })?;
    let mut caught_up = last == 0 || consumer.cached_info().num_pending == 0;
    if caught_up && (tx.send(Event::CaughtUp).await.is_err() || !follow) {
        return Ok(());
    }
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| open(format!("reading messages: {e}")))?;
    while let Some(m) = messages.next().await {
        let m = m.map_err(|e| SourceError::Read {
            what: what.clone(),
            reason: e.to_string(),
        })?;
        let (seq, pending) = match m.info() {
            Ok(i) => (i.stream_sequence, i.pending),
            Err(e) => {
                return Err(SourceError::Read {
                    what: what.clone(),
                    reason: format!("message without JetStream metadata: {e}"),
                })
            }
        };
        let rec = BrokerRecord {
            value: Some(m.payload.to_vec()),
            key: None,
            partition: None,
            at: format!(
                "{} stream sequence {seq} (subject {})",
                src.stream, m.subject
            ),
        };
        if tx.send(Event::Record(rec)).await.is_err() {
            return Ok(());
        }
        if !caught_up && (seq >= last || pending == 0) {
            caught_up = true;
            if tx.send(Event::CaughtUp).await.is_err() || !follow {
                return Ok(());
            }
        }
    }
    Err(SourceError::Read {
        what,
        reason: "the consumer's message stream ended".into(),
    })
}
