//! # kubesink-core: what every part of kubesink shares
//!
//! The bridge (crate `kubesink`) and each destination (crates `kubesink-stdout`,
//! `kubesink-nats`, `kubesink-kafka`, `kubesink-http`, `kubesink-otlp` under `sinks/`) depend
//! on this crate. A destination never depends on the bridge; the one dependency between
//! destinations is `kubesink-otlp` on `kubesink-http` (OTLP/HTTP is HTTP). It owns the
//! contracts between them and the small tools both sides need:
//!
//! - [`message`]: topology message v1, the contract downstream teams code against: the
//!   watched [`Resource`]'s identity, the [`Message`] a sink receives, its key, id, headers
//!   and oversize forms, and the CloudEvents attributes ([`cloudevents`], [`Format`]; each
//!   destination writes its protocol binding's header names).
//! - [`Sink`] (`sink.rs`): the delivery contract (what `Ok` promises, which errors are
//!   retried, how an oversize message is reported).
//! - [`Destination`] (`destination.rs`): what a `[[sinks]]` entry of a destination's type
//!   can do (name, validate, warn, build its sink; `as_any` for its crate's other parts). The bridge lists the destinations once
//!   (`src/sinks.rs`).
//! - [`state`]: the [`StateStore`](state::StateStore) contract the informer state backends
//!   implement (a file in the bridge, a JetStream object store in the NATS destination's crate, a
//!   compacted topic in the Kafka destination's crate), and
//!   [`StateBackendConfig`](state::StateBackendConfig), what a destination's `[state.NAME]`
//!   section does for the bridge (check, warn, name its files, open its store) with the
//!   [`StateContext`](state::StateContext) it is given.
//! - [`readback`]: what a destination's reader hands `kubesink fold` (records in order, then
//!   "caught up"), and [`ReadOptions`](readback::ReadOptions), the reader's options and
//!   reading as the bridge's registration list offers them.
//! - [`shard`]: one part of a cluster's objects by the hash of their namespace, as the API
//!   server's sharded list and watch defines it (the range and its `shardSelector`).
//! - Tools defined once: [`template`] (destination templates), [`units`] (human durations
//!   and sizes), [`backoff`] (the retry policy), [`Secret`] (values never printed),
//!   [`ReadySignal`] (a sink's "reachable again" that ends the pipeline's retry backoff),
//!   [`Streak`] and [`Problem`] (a failure streak and its problem text), [`outage`] (an
//!   outage of a broker as the log tells it: one line at its start, a summary a minute, one
//!   at its end), [`clock`] (Unix milliseconds).
//!
//! A sink never decides what to drop: delivery policy (retry, backoff, the oversize fallback)
//! lives in the pipeline, so every sink behaves the same way from the outside.

pub mod backoff;
pub mod clock;
mod destination;
pub mod message;
pub mod outage;
pub mod readback;
mod ready;
mod secret;
pub mod shard;
mod sink;
pub mod state;
mod streak;
pub mod template;
pub mod units;
pub mod words;

pub use destination::{Destination, SinkConfigError};
pub use message::{cloudevents, Format, Message, MessageMeta, Op, Resource};
pub use outage::Outage;
pub use ready::{ReadySignal, ReadyWatch};
pub use secret::{Secret, MASK};
pub use sink::{Sink, SinkError};
pub use streak::{Problem, Streak};
