//! # kubesink: Kubernetes topology changes into message brokers
//!
//! The data path, in the order a change travels it:
//!
//! 1. `cluster`: the kube client ([`cluster::client`]) and API discovery, which turns each
//!    configured resource into a [`kubesink_core::Resource`] identity.
//! 2. `informer`: lightweight informers. Each configured resource becomes one `WatchPlan`
//!    per namespace (or one for all); an `Informer` runs kubesink's own list/watch loop for it and
//!    hands every event to its `Decider`, the synchronous decision step that owns the
//!    `LightStore` (key, uid, resourceVersion and a 64-bit payload fingerprint per object,
//!    never the object) and returns the changes to emit: added, updated, deleted, and the
//!    deletes inferred after a relist.
//! 3. [`kubesink_core::message`]: each change is encoded once into topology message v1 (the
//!    contract in `docs/message-contract.md`: partition key, deterministic id, headers).
//! 4. `pipeline`: the informers publish through a `Publisher` into one keyed, coalescing,
//!    bounded queue per sink; a worker per sink batches (events, bytes, linger) and delivers
//!    at-least-once with retries. A full queue stops the informers reading (backpressure).
//! 5. [`sinks`]: the one list of destinations, each a crate under `sinks/` (stdout, NATS,
//!    Kafka, HTTP, OTLP) whose config implements `kubesink_core::Destination` and builds a
//!    `kubesink_core::Sink` for each `[[sinks]]` entry.
//!
//! Beside the path, [`state`] keeps the acknowledged informer state (what every sink
//! confirmed) in a file, a NATS object store (with a stream for the journal) or a compacted
//! Kafka topic, with a journal of the new keys sent since the
//! last save (recorded before any sink may send them), so a restart, a crash, or another
//! replica taking over sends only the differences and the deletes it missed.
//!
//! [`config`] loads and checks the configuration; [`bridge`] wires the path together and
//! shuts it down; [`leader`] elects one replica on a Lease; [`observe`] serves metrics and
//! health and logs summaries; [`rbac`] derives
//! the RBAC a configuration needs; [`online`] is `kubesink check --online` (asks each
//! cluster whether the configuration will work there: discovery, selectors, access); [`fold`] is `kubesink fold`, the reference consumer
//! (reads a topic or stream back and compares it with the cluster); [`limits`] raises and checks the open-files limit; [`cli`]
//! and `demo` (cargo feature `sim`, on by default) are the binary's
//! edge. With the `test-util` feature, [`testing`] exposes the informer's parts to the
//! benches and tests.

pub mod bridge;
pub mod cli;
pub mod cluster;
pub mod code_pages;
pub mod config;
#[cfg(feature = "sim")]
pub mod demo;
pub mod fold;
mod informer;
pub mod leader;
pub mod limits;
pub mod observe;
pub mod online;
mod pipeline;
pub mod plan;
pub mod rbac;
pub mod run;
pub mod scale_out;
pub mod sinks;
pub mod state;

pub use informer::{FailureKind, InformerStats};
pub use pipeline::{Pipeline, SinkHandle, SinkStats};

/// The informer's parts, for benches and tests (cargo feature `test-util`).
#[cfg(feature = "test-util")]
pub mod testing {
    pub use crate::informer::{
        watch_line, Acknowledged, Decider, DecodeError, Event, Facts, Filter, FilterMatch,
        FilterSubject, InformerError, LightStore, MinimalMeta, Observed, OwnerIndex, Parts, Phase,
        RawObject, Rv, ShapeError, Shaped, Shaper, StoreEntry, TrackedStore, Uid, Vanished,
        WatchPlan,
    };
}
