//! # kubesink-http: the HTTP destination
//!
//! The HTTP sink (`type = "http"`): topology messages POSTed to a URL as CloudEvents (binary,
//! structured or batched content mode, HTTP protocol binding 1.0.2) or as JSON Lines, the
//! webhook shape of Knative sinks, Argo Events, kubewatch and most event routers.
//!
//! - `config.rs`: the `[[sinks]]` entry, its checks and the client it builds (timeouts, TLS
//!   with a custom CA and mutual TLS, bearer or basic authentication, custom headers).
//! - `format.rs`: the request formats and the room an envelope takes.
//! - `health.rs`: readiness and the outage log from the answers (shared with the OTLP
//!   destination).
//! - `sink.rs`: delivery: per-key order, what each answer means (retry with `Retry-After`,
//!   split a refused batch, refuse one message for good, call the operator), readiness.
//!
//! It has no reader of its own: what a receiver writes down is folded with
//! `kubesink fold --file` (JSON Lines of messages or of CloudEvents envelopes), and no
//! state store. `docs/http.md` is the user's page.

mod config;
mod format;
mod health;
mod sink;

pub use config::{HttpAuth, HttpConfig, HttpTls};
pub use format::{HttpFormat, ENVELOPE_ROOM};
pub use health::Health;
pub use sink::{
    classify, drain, outcome, pack, retry_after, send_in_order, transport, Failure, HttpSink,
    JSON_LINES_CONTENT_TYPE,
};
