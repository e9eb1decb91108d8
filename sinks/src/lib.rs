//! # kubesink-sinks: the message contract, the `Sink` trait and its implementations
//!
//! This crate owns the boundary between kubesink's pipeline and a destination:
//!
//! - [`message`]: topology message v1, the contract downstream teams code against: the
//!   watched [`Resource`]'s identity, the [`Message`] a sink receives, its key, id, headers
//!   and oversize forms, and its opt-in CloudEvents binding ([`cloudevents`], [`Format`]).
//! - [`Sink`] (`sink.rs`): the delivery contract (what `Ok` promises, which errors are
//!   retried, how an oversize message is reported).
//! - One module per destination, each behind a cargo feature that is on by default:
//!   [`stdout`], [`nats`], [`kafka`]. The broker folders have the same files, as Vector's
//!   sinks do: `config.rs` (options, validation, `build`), `request.rs` (message → record or
//!   subject), `service.rs` (the client and its error classification), `sink.rs` (the
//!   `impl Sink`), `mod.rs` (re-exports).
//! - What both the bridge and the sinks need, defined once: [`template`] (destination
//!   templates), [`units`] (human durations and sizes), [`backoff`] (the retry policy),
//!   [`Secret`] (values never printed), [`ReadySignal`] (a sink's "reachable again" that
//!   ends the pipeline's retry backoff).
//!
//! A sink never decides what to drop: delivery policy (retry, backoff, the oversize fallback)
//! lives in the pipeline, so every sink behaves the same way from the outside.

pub mod backoff;
mod config;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod message;
#[cfg(feature = "nats")]
pub mod nats;
mod ready;
mod secret;
mod sink;
#[cfg(feature = "stdout")]
pub mod stdout;
pub mod template;
pub mod units;

pub use config::{SinkConfig, SinkConfigError};
pub use message::{cloudevents, Format, Message, MessageMeta, Op, Resource};
pub use ready::{ReadySignal, ReadyWatch};
pub use secret::Secret;
pub use sink::{Sink, SinkError};
