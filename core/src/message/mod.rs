//! Topology message v1: the contract downstream teams code against
//! (`docs/message-contract.md`, schema `docs/topology-message-v1.schema.json`), in one module.
//!
//! - [`Resource`] (`resource.rs`): the identity of a watched resource and its partition key.
//! - [`Op`], [`MessageMeta`], [`Message`] and the headers (`model.rs`): what a sink receives.
//! - [`Placeholder`] (`model.rs`): the routing values destination templates may use.
//! - [`encode`], [`message_id`], [`truncate`] (`encode.rs`): the JSON payload, the
//!   deterministic id and the oversize forms; [`encode_synced`] the sync marker (a control
//!   message, `op: "synced"`, that closes a list).
//! - [`cloudevents`]: the opt-in CloudEvents 1.0 binding of a message (a sink's `format`):
//!   its attributes (binary content mode) and its structured envelope.
//!
//! A message is built once and shared by every sink (payload and identity are
//! reference-counted), so fan-out to N sinks does not copy payloads. This module never decides
//! what to emit: that is the informer's job.

pub mod cloudevents;
mod context;
mod encode;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
mod model;
mod resource;

pub use cloudevents::Format;
pub use context::{Context, OwnerRef};
pub use encode::{
    coalesce_changes, encode, encode_synced, encode_synced_with_epoch, encode_with_epoch,
    message_id, now_rfc3339, occurrences_of, synced_id, tombstone_id, truncate, with_changed,
    with_changes, with_occurrences, Change, DeleteReason, ObjectJson, SyncScope, Synced,
    TruncateLevel,
};
pub use model::{
    ChangedPaths, Message, MessageMeta, Op, Placeholder, CONTENT_TYPE_JSON, SYNCED_NAME,
};
pub use resource::Resource;
