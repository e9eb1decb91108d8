//! The NATS sink: core NATS or JetStream (async-nats).
//!
//! - `config.rs`: the `[[sinks]]` entry (`type = "nats"`), validation, `build()`, and the
//!   connection pieces kubesink's other NATS client (the `[state]` store) shares:
//!   [`client_options`], [`connection_problems`].
//! - `request.rs`: message → subject (the subject dialect of the shared template engine,
//!   reversible token escaping) and headers.
//! - `connection.rs`: the connection options (reconnect forever, bounded buffer) and what
//!   its events tell (ready signal on every connect, the last connection error).
//! - `service.rs`: connecting, the stream check or creation, core and JetStream
//!   publishing, error classification.
//! - `sink.rs`: the [`Sink`](crate::Sink) implementation.
//!
//! Delivery: in JetStream mode `send` is `Ok` once every message's PubAck arrived (many in
//! flight, at most `max_in_flight`); each message carries `Nats-Msg-Id` = the message id, so a
//! redelivered batch is stored once within the stream's duplicate window. In core mode `send`
//! is `Ok` once `flush()` returned: the server has the messages, but nothing stores them, so
//! it is at-most-once across a server failure (see `docs/nats.md`).
//!
//! This sink never buffers messages past a `send` call, never decides to drop one (an
//! oversize message is reported as [`SinkError::TooLarge`](crate::SinkError::TooLarge) before
//! anything of the batch is published; the pipeline applies the shared policy), and never
//! logs a secret.

mod config;
mod connection;
mod request;
mod service;
mod sink;

pub use config::{
    client_options, connection_problems, plaintext_credentials, server_addrs, servers_text,
    ClientSettings, NatsAuth, NatsConfig, NatsMode, NatsStorage, NatsStream, NatsTls,
    DEFAULT_SUBJECT,
};
pub use connection::ConnectionWatch;
pub use request::{escape_token, subject_template, unescape_token, EMPTY_TOKEN, SUBJECT};
pub use service::{connect_client, redact_url, ConnectFailure, NatsError};
pub use sink::NatsSink;
