//! # kubesink-nats: the NATS destination
//!
//! Everything kubesink does with NATS (async-nats): the sink (core NATS or JetStream), the
//! JetStream reader of `kubesink fold`, the JetStream object-store state backend, and the
//! CloudEvents NATS binding. Depends on `kubesink-core` only.
//!
//! - `config.rs`: the `[[sinks]]` entry (`type = "nats"`), validation, `build()` (its
//!   [`Destination`](kubesink_core::Destination) registration), and the connection pieces
//!   the crate's other clients (the state store, the reader) share: [`client_options`],
//!   [`connection_problems`].
//! - `request.rs`: message → subject (the subject dialect of the shared template engine,
//!   reversible token escaping) and headers.
//! - `connection.rs`: the connection options (reconnect forever, bounded buffer) and what
//!   its events tell (ready signal on every connect, the last connection error).
//! - `service.rs`: connecting, the stream check or creation, core and JetStream
//!   publishing, error classification.
//! - `sink.rs`: the [`Sink`](kubesink_core::Sink) implementation.
//! - `cloudevents.rs`: the CloudEvents NATS protocol binding (binary mode header names and
//!   their percent-encoding).
//! - [`reader`]: `kubesink fold --jetstream`, a stream read back from its first sequence.
//! - [`state`]: `state.backend = "nats"`, the informer state in a JetStream object store and
//!   its journal in a stream beside it (`[state.nats]`).
//!
//! Delivery: in JetStream mode `send` is `Ok` once every message's PubAck arrived (many in
//! flight, at most `max_in_flight`); each message carries `Nats-Msg-Id` = the message id, so a
//! redelivered batch is stored once within the stream's duplicate window. In core mode `send`
//! is `Ok` once `flush()` returned: the server has the messages, but nothing stores them, so
//! it is at-most-once across a server failure (see `docs/nats.md`).
//!
//! This sink never buffers messages past a `send` call, never decides to drop one (an
//! oversize message is reported as [`SinkError::TooLarge`](kubesink_core::SinkError::TooLarge) before
//! anything of the batch is published; the pipeline applies the shared policy), and never
//! logs a secret.

mod cloudevents;
mod config;
mod connection;
pub mod reader;
mod request;
mod service;
mod sink;
pub mod state;

pub use cloudevents::nats_headers;
pub use config::{
    client_options, connection_problems, plaintext_credentials, server_addrs, servers_text,
    tls_certain, ClientSettings, NatsAuth, NatsConfig, NatsMode, NatsStorage, NatsStream, NatsTls,
    DEFAULT_SUBJECT,
};
pub use connection::{redact_url, ConnectionWatch};
pub use request::{escape_token, subject_template, unescape_token, EMPTY_TOKEN, SUBJECT};
pub use service::{connect_client, ConnectFailure, NatsError};
pub use sink::NatsSink;
