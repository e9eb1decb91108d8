//! Lightweight informers: one kube-runtime watcher per [`WatchPlan`] (a resource in one
//! namespace, or in all), a decision step that keeps only keys and fingerprints, and the thin
//! async loop between them.
//!
//! - `plan.rs`: [`WatchPlan`], configuration and discovery resolved into one plan per watch.
//! - `decide.rs`: [`Decider`], the synchronous decision step and its semantics table
//!   (added, updated, suppressed, uid replaced, watch delete, relist sweep).
//! - `store.rs`: [`LightStore`], key, uid, resourceVersion and fingerprint per object;
//!   `facts.rs` those facts outside the store.
//! - `tracked.rs`: [`TrackedStore`], the store shared with the acknowledgements and the state
//!   saver, whose overlay makes the acknowledged state without a second copy.
//! - `payload.rs`: [`Shaper`] (payload modes, Secret data, cluster label) and [`fingerprint`].
//! - `emit.rs`: encoding and publishing the decided changes with their acknowledgements, then
//!   the list's sync marker.
//! - this file: [`Informer`], which reads the watcher, asks the decider and emits.
//!
//! The watcher runs kube-runtime's list/watch protocol (paged list, bookmarks, re-watch from
//! the last resourceVersion, relist on 410 Gone, `default_backoff` on errors); see
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>.
//!
//! Backpressure: each emitted change is awaited into the pipeline; while a sink queue is
//! full this task stops polling the watch stream, so the HTTP body is not read.
//!
//! This module never keeps an object after emitting it.

mod decide;
mod emit;
mod facts;
mod payload;
mod plan;
mod store;
mod tracked;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use decide::{Decider, InformerError, InformerStats, Phase};
pub use facts::{Facts, Rv, Uid};
pub use payload::{fingerprint, Shaper};
pub use plan::WatchPlan;
pub use store::{Entry as StoreEntry, LightStore, Observed, Vanished};
pub use tracked::{Acknowledged, TrackedStore};

use crate::config::PayloadMode;
use crate::pipeline::Publisher;

/// One watch of one resource (one namespace, or all).
pub struct Informer {
    plan: WatchPlan,
    client: Client,
    scope: String,
    decider: Decider,
}

impl Informer {
    /// An informer following `plan` through `client`, deciding with `decider` (which the
    /// caller prepared for the plan: restored state, acknowledgements, sync markers; see
    /// `bridge.rs`).
    pub fn with_decider(plan: WatchPlan, client: Client, decider: Decider) -> Self {
        let scope = plan.scope();
        Informer {
            plan,
            client,
            scope,
            decider,
        }
    }

    /// This informer's counters.
    pub fn stats(&self) -> Arc<InformerStats> {
        self.decider.stats()
    }

    /// `apiVersion Kind (scope)`, for logs and diagnostics.
    pub fn label(&self) -> String {
        format!("{} ({})", self.plan.resource, self.scope)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
    {
        let ar = &self.plan.api_resource;
        match &self.plan.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    /// The watcher stream. In metadata mode the Api is over `PartialObjectMeta`, which makes
    /// kube send `Accept: application/json;as=PartialObjectMetadata…;g=meta.k8s.io;v=v1`, so
    /// only metadata crosses the wire.
    fn events(
        &self,
    ) -> impl Stream<Item = Result<Event<DynamicObject>, watcher::Error>> + Send + 'static {
        let wc = self.plan.watcher_config.clone();
        match self.plan.mode {
            PayloadMode::Metadata => {
                watcher::watcher(self.api::<PartialObjectMeta<DynamicObject>>(), wc)
                    .map_ok(without_body)
                    .default_backoff()
                    .boxed()
            }
            PayloadMode::Full | PayloadMode::Fields => {
                watcher::watcher(self.api::<DynamicObject>(), wc)
                    .default_backoff()
                    .boxed()
            }
        }
    }

    /// Runs until `cancel` fires or the pipeline shuts down.
    pub async fn run(mut self, publisher: Publisher, cancel: CancellationToken) {
        let mut events = self.events();
        let resource = self.plan.resource.clone();
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                next = events.next() => next,
            };
            let event = match next {
                None => break,
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    self.stats().errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(cluster = %resource.cluster, %resource, scope = %self.scope, error = %e, "watch error; retrying with backoff");
                    continue;
                }
            };
            let changes = match self.decider.on_event(event) {
                Ok(changes) => changes,
                Err(e) => {
                    tracing::warn!("{e}");
                    continue;
                }
            };
            if !emit::publish(&mut self.decider, &resource, changes, &publisher, &cancel).await {
                tracing::debug!(%resource, scope = %self.scope, "informer stopped");
                return;
            }
        }
        tracing::debug!(%resource, scope = %self.scope, "informer stopped");
    }
}

/// `PartialObjectMeta` → `DynamicObject` with no body, so the decision step sees one type.
fn without_body(ev: Event<PartialObjectMeta<DynamicObject>>) -> Event<DynamicObject> {
    let f = |m: PartialObjectMeta<DynamicObject>| DynamicObject {
        types: m.types,
        metadata: m.metadata,
        data: Value::Null,
    };
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}
