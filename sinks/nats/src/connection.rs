//! The NATS connection's life: the options every sink starts from (reconnect policy, bounded
//! client buffer), and what the client's callbacks learn ([`ConnectionWatch`]): every
//! (re)connect notifies the sink's [`ReadySignal`], which ends the pipeline's retry backoff;
//! the last connection error the client recorded (from the server pool the reconnect
//! callback receives: "IO error: Connection refused (os error 111)") is kept for the errors
//! of failed sends; an outage is logged as [`Outage`] tells it (a WARN at its start, a
//! summary a minute, an INFO with its duration and failed attempts at its end).
//!
//! It only observes: it never changes which server the client picks, and never logs a
//! secret (server URLs lose their user info).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::{ConnectErrorKind, ConnectOptions, Event};
use kubesink_core::backoff::Backoff;
use kubesink_core::{Outage, ReadySignal};

/// Whether a connection attempt failed because no server could be reached at all (refused,
/// timed out, host or network unreachable, DNS): such a start-up failure is waited out in
/// the background. Everything else (rejected credentials, TLS, a server that closed the
/// connection during the handshake) needs an operator and stays a start-up error.
pub(super) fn is_unreachable(e: &async_nats::ConnectError) -> bool {
    use std::io::ErrorKind as K;
    match e.kind() {
        ConnectErrorKind::TimedOut | ConnectErrorKind::Dns => true,
        ConnectErrorKind::Io => std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                matches!(
                    io.kind(),
                    K::ConnectionRefused
                        | K::TimedOut
                        | K::HostUnreachable
                        | K::NetworkUnreachable
                        | K::AddrNotAvailable
                )
            }),
        _ => false,
    }
}

/// Reconnect delays: 100 ms doubling to at most 1 s, forever (no jitter: async-nats calls
/// the delay callback with the attempt number). A short cap, so a server that comes back is
/// used again within about a second; one TCP connection attempt per second costs little.
const RECONNECT: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).without_jitter();

/// What the connection callbacks learn, shared between them and the service: the ready
/// signal bumped on every (re)connect, the last connection error, and the outage as the log
/// tells it ([`Outage`]: one WARN when the connection is lost or cannot be made, a summary a
/// minute while it lasts, one INFO with the counts when it is back).
#[derive(Clone)]
pub struct ConnectionWatch {
    ready: ReadySignal,
    inner: Arc<WatchState>,
}

struct WatchState {
    last_error: Mutex<Option<String>>,
    outage: Outage,
}

impl Default for ConnectionWatch {
    /// The watch of a client named `nats`.
    fn default() -> Self {
        ConnectionWatch::new("nats")
    }
}

impl ConnectionWatch {
    /// The watch of the client of `name` (a sink's name, `state` for the state store): the
    /// `sink` field of its log lines.
    pub fn new(name: &str) -> Self {
        ConnectionWatch {
            ready: ReadySignal::default(),
            inner: Arc::new(WatchState {
                last_error: Mutex::new(None),
                outage: Outage::new(name, "NATS", RETRYING),
            }),
        }
    }

    /// The signal bumped on every connect.
    pub fn ready(&self) -> &ReadySignal {
        &self.ready
    }

    /// The connection's outages as they are logged.
    pub fn outage(&self) -> &Outage {
        &self.inner.outage
    }

    /// The last connection error the client recorded (server and cause, no credentials),
    /// while the connection is not up.
    pub fn last_error(&self) -> Option<String> {
        self.inner
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_error(&self, e: Option<String>) {
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = e;
    }

    /// Records the per-server errors of the client's server pool (called before each
    /// reconnect attempt): the outage's most precise cause (the events say only "IO error").
    fn note_pool(&self, pool: &[async_nats::Server]) {
        let errors: Vec<String> = pool
            .iter()
            .filter_map(|s| {
                s.last_error
                    .as_ref()
                    .map(|e| format!("{}: {e}", redact_url(s.addr.as_url_str())))
            })
            .collect();
        if errors.is_empty() {
            return;
        }
        let text = errors.join("; ");
        self.inner.outage.note(&text);
        self.set_error(Some(text));
    }

    /// One connection event, logged as an operator needs it: connects and the outages
    /// between them through [`Outage`] (async-nats' own per-event lines are filtered out by
    /// the binary's log filter), server errors at ERROR.
    fn on_event(&self, sink: &str, event: Event) {
        match event {
            Event::Connected => {
                if !self.inner.outage.recovered() {
                    tracing::info!(sink = %sink, "NATS connected");
                }
                self.set_error(None);
                self.ready.notify();
            }
            Event::Disconnected => {
                if self.last_error().is_none() {
                    self.set_error(Some(DISCONNECTED.to_owned()));
                }
                self.inner.outage.lost("connection lost");
            }
            Event::ServerError(e) => {
                tracing::error!(sink = %sink, error = %e, "NATS server error")
            }
            // A failed (re)connect attempt: counted; its cause is the server pool's
            // (`note_pool`), the event's text is only the error kind ("IO error").
            Event::ClientError(e) => {
                let cause = match self.last_error() {
                    Some(c) if c != DISCONNECTED => c,
                    _ => e.to_string(),
                };
                self.inner.outage.failed(&cause);
                tracing::debug!(sink = %sink, error = %e, "NATS connection attempt failed")
            }
            // The connection closed because the sink closed it (shutdown).
            Event::Closed => tracing::info!(sink = %sink, "NATS connection closed"),
            other => tracing::warn!(sink = %sink, event = %other, "NATS connection event"),
        }
    }
}

/// How the outage's first line says the client retries.
const RETRYING: &str = "reconnecting every second at most";

/// The cause named while disconnected before the client recorded a connection error.
pub(super) const DISCONNECTED: &str = "disconnected";

/// The connection options every NATS sink starts from: its name, timeouts, bounded client
/// buffer, reconnect forever with [`RECONNECT`] delays, and connection events observed by
/// `watch` and logged with the sink name (an outage as [`Outage`] tells it). `config.rs`
/// adds authentication and TLS.
pub fn base_options(
    sink: &str,
    connection_name: &str,
    connect_timeout: Duration,
    request_timeout: Duration,
    client_capacity: usize,
    watch: &ConnectionWatch,
) -> ConnectOptions {
    let sink = sink.to_owned();
    let (watch, watch2) = (watch.clone(), watch.clone());
    ConnectOptions::new()
        .name(connection_name)
        .connection_timeout(connect_timeout)
        .request_timeout(Some(request_timeout))
        .client_capacity(client_capacity)
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| RECONNECT.delay(attempts))
        // Only observes: `None` keeps the client's own server selection. The pool snapshot
        // carries each server's last connection error, which the events do not.
        .reconnect_to_server_callback(move |pool, _info| {
            watch2.note_pool(&pool);
            async { None }
        })
        .event_callback(move |event| {
            watch.on_event(&sink, event);
            async {}
        })
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
    fn reconnect_delay_backs_off_to_one_second() {
        assert_eq!(RECONNECT.delay(0), Duration::from_millis(100));
        assert_eq!(RECONNECT.delay(3), Duration::from_millis(800));
        assert_eq!(RECONNECT.delay(100), Duration::from_secs(1));
    }
}
