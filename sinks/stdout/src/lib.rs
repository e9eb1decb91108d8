//! # kubesink-stdout: the stdout destination
//!
//! The stdout sink: JSON Lines, one topology message per line, flushed per batch.
//!
//! It writes to the process's standard output and nothing else ever does: logs go to
//! stderr, so `kubesink run > topology.jsonl` captures a clean stream. `format =
//! "cloudevents-structured"` writes each message as a CloudEvents JSON envelope instead. It
//! has no size limit and confirms a batch once the lines are written and flushed.
//!
//! - `config.rs`: the `[[sinks]]` entry (`type = "stdout"`) and its
//!   [`Destination`](kubesink_core::Destination) registration.
//! - `sink.rs`: the [`Sink`](kubesink_core::Sink) implementation.
//!
//! It has no reader (`kubesink fold --file` reads what it wrote) and no state store.

mod config;
mod sink;

pub use config::{StdoutConfig, StdoutFormat};
pub use sink::{StdoutSink, STDOUT_CLOSED_EXIT};
