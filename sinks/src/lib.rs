//! # kubesink-sinks: the `Sink` trait and its implementations
//!
//! This crate owns the boundary between kubesink's pipeline and a destination: the
//! [`Message`] a sink receives, the [`Sink`] contract (what `Ok` promises, which errors are
//! retried, how an oversize message is reported) and one module per destination, each behind
//! a cargo feature that is on by default (`stdout`; `nats` and `kafka` in their own modules).
//!
//! A sink never decides what to drop: delivery policy (retry, backoff, the oversize fallback)
//! lives in the pipeline, so every sink behaves the same way from the outside.
//!
//! Layout follows Vector's sinks: a sink is a module (or a folder) with its `config`
//! (serde struct plus `build()`), the request building (message → destination record) and
//! the I/O with its error classification.

mod config;
#[cfg(feature = "kafka")]
pub mod kafka;
mod message;
#[cfg(feature = "nats")]
pub mod nats;
mod secret;
mod sink;
#[cfg(feature = "stdout")]
pub mod stdout;

pub use config::{SinkConfig, SinkConfigError};
pub use message::{Message, MessageMeta, Op, Placeholder, CONTENT_TYPE_JSON};
pub use secret::Secret;
pub use sink::{Sink, SinkError};
