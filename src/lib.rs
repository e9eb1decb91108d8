//! # kubesink: Kubernetes topology changes into message brokers
//!
//! The data path, one module each:
//!
//! 1. [`cluster`]: the kube client and API discovery of each configured resource.
//! 2. [`informer`]: lightweight informers. A kube-runtime watcher per resource (and
//!    namespace); a [`informer::LightStore`] that keeps key, uid, resourceVersion and a 64-bit
//!    payload fingerprint per object, never the object; the add/update/delete decisions,
//!    including deletes inferred after a relist.
//! 3. [`message`]: topology message v1 (the contract in `docs/message-contract.md`), its
//!    partition key and deterministic id.
//! 4. [`pipeline`]: per-sink keyed, coalescing, bounded queues with batching (events, bytes,
//!    linger), at-least-once retries and backpressure that stops the informers reading.
//! 5. `kubesink_sinks`: the `Sink` trait and the destinations.
//!
//! [`config`] loads and checks the configuration; [`bridge`] wires the path together;
//! [`cli`] and [`demo`] are the binary's edge.

pub mod bridge;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod demo;
pub mod informer;
pub mod message;
pub mod pipeline;

pub use kubesink_sinks as sinks;
