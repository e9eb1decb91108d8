//! # kubesink-otlp: the OTLP destination
//!
//! The OTLP sink (`type = "otlp"`): each change an OpenTelemetry log record, exported over
//! OTLP/HTTP (protobuf, gzip) to a Collector or any OTLP endpoint, shaped like the
//! Collector's `k8sobjects` receiver so kubesink can take its place in an existing pipeline.
//!
//! - `config.rs`: the `[[sinks]]` entry; its connection options are the HTTP destination's.
//! - `record.rs`: a topology message as a log record (the mapping table).
//! - `wire.rs`: the same record's protobuf written straight from the payload's JSON (what
//!   the sink sends).
//! - `event.rs`: an Event occurrence (`mode = "events"`) as a log record shaped like the
//!   Collector's `k8s_events` receiver.
//! - `sink.rs`: export requests, what each answer means (partial success, retries), order.
//! - `reader.rs`: the Collector's file exporter output read back as topology messages, for
//!   `kubesink fold --file`.
//!
//! `docs/otlp.md` is the user's page.

mod config;
pub mod event;
pub mod reader;
pub mod record;
mod sink;
pub mod wire;

pub use config::{OtlpCompression, OtlpConfig, LOGS_PATH};
pub use sink::{OtlpSink, PROTOBUF};
