//! Emitting what the decider returned: each change encoded once into topology message v1
//! (`kubesink_core::message`) and published to every sink with its acknowledgement handle,
//! then the list's sync marker, if the event ended a list.
//!
//! Owns the order "a list's changes, then its marker" on the publishing side (the queues
//! keep it, see `pipeline/queue.rs`). Never decides what to emit, and never holds an object
//! after publishing it.

use std::sync::Arc;

use kubesink_core::message::{encode_synced_with_epoch, encode_with_epoch, now_rfc3339, Change};
use kubesink_core::Resource;

use super::decide::Decider;
use crate::pipeline::Publisher;

/// Publishes `changes` (from one `Decider::on_event`) in order, then the sync marker the
/// event produced, if any. For a watch event that `arrived` at a known time, each change is
/// logged at DEBUG under the target `kubesink::arrival` with that time and its `observedAt`
/// (`RUST_LOG=info,kubesink::arrival=debug`: the benchmarks split a change's latency into
/// before kubesink and inside it). Returns `false` when the pipeline is shutting down (the informer
/// stops); the changes not published stay unacknowledged. (Cancelling the informer drops
/// this future: the same.)
pub(super) async fn publish(
    decider: &mut Decider,
    resource: &Arc<Resource>,
    changes: Vec<Change>,
    publisher: &Publisher,
    arrived: Option<std::time::SystemTime>,
) -> bool {
    let stamp =
        arrived.filter(|_| tracing::enabled!(target: "kubesink::arrival", tracing::Level::DEBUG));
    for change in changes {
        let observed_at = now_rfc3339();
        if let Some(at) = stamp {
            let key = resource.key(change.namespace.as_deref(), &change.name);
            let arrived_us = at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros());
            tracing::debug!(target: "kubesink::arrival", %key, resource_version = %change.resource_version, arrived_us, observed_at = %observed_at, "watch event arrived");
        }
        let msg = match encode_with_epoch(resource, &change, &observed_at, publisher.leader_epoch())
        {
            Ok(m) => m,
            Err(e) => {
                let key = resource.key(change.namespace.as_deref(), &change.name);
                tracing::error!(%key, error = %e, "encoding the message failed; change skipped");
                decider.abandon(&change);
                continue;
            }
        };
        let ack = decider
            .ack(&msg, &change.resource_version, publisher.sinks())
            .await;
        let throttle = decider.throttle(&change);
        if !publisher
            .publish_acked(msg, ack, change.may_be_held, throttle)
            .await
        {
            return false;
        }
    }
    let Some(synced) = decider.take_synced() else {
        return true;
    };
    let msg =
        match encode_synced_with_epoch(resource, &synced, &now_rfc3339(), publisher.leader_epoch())
        {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "encoding the sync marker failed; marker skipped");
                return true;
            }
        };
    publisher.publish(msg).await
}
