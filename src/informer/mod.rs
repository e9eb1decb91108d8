//! Lightweight informers: one kube-runtime watcher per (resource, namespace), a
//! [`LightStore`] of keys and fingerprints, and the decision of what to emit.
//!
//! # Semantics (the Lyft Clutch lightweight informer, done right)
//!
//! | watcher event | store | emitted |
//! |---|---|---|
//! | `Init` (list starts: first sync, or relist after 410 Gone / desync) | new list epoch | — |
//! | `InitApply(obj)` / `Apply(obj)`, key unknown | insert | `added` |
//! | same, key known, fingerprint differs | update | `updated` (unless `updates = false`) |
//! | same, key known, fingerprint equal | update rv | nothing (relist duplicates, dropped-field changes) |
//! | same, key known, uid differs | replace | `deleted` (old uid, `finalStateUnknown`), then `added` |
//! | `Delete(obj)` | remove | `deleted` with the final object |
//! | `InitDone` | sweep keys not seen in this list | `deleted`, `finalStateUnknown: true`, each |
//!
//! `initial` is true for changes emitted during the informer's first list. The watcher runs
//! kube-runtime's list/watch protocol (paged list, bookmarks, re-watch from the last
//! resourceVersion, relist on 410 Gone, `default_backoff` on errors); see
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>.
//!
//! Backpressure: each emitted change is awaited into the pipeline; while a sink queue is
//! full this task stops polling the watch stream, so the HTTP body is not read.
//!
//! This module never keeps an object after emitting it.

mod payload;
mod store;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use kubesink_sinks::Op;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use payload::{fingerprint, Shaper};
pub use store::{Entry as StoreEntry, LightStore, Observed, Vanished};

use crate::config::{PayloadMode, ResourceConfig};
use crate::message::{encode, now_rfc3339, Change, KindInfo};
use crate::pipeline::Pipeline;

/// Counters of one informer, readable while it runs.
#[derive(Debug, Default)]
pub struct InformerStats {
    /// Watch and list events read from the API server.
    pub events_received: AtomicU64,
    /// Changes emitted into the pipeline.
    pub emitted: AtomicU64,
    /// Events that changed nothing in the emitted payload.
    pub suppressed: AtomicU64,
    /// Deletes inferred after a relist or uid change.
    pub inferred_deletes: AtomicU64,
    /// Lists started (1 = initial sync only; more = relists).
    pub lists: AtomicU64,
    /// Objects currently known.
    pub objects: AtomicU64,
    /// The first list has completed.
    pub synced: AtomicBool,
    /// Watcher errors (each retried with backoff).
    pub errors: AtomicU64,
}

/// Where an informer is in the list/watch protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the first `Init`.
    Starting,
    /// First list in progress: changes are `initial`.
    InitialList { started: Instant, listed: u64 },
    /// A relist (after 410 Gone or a watch restart) in progress.
    Relist { started: Instant, listed: u64 },
    /// Following the watch stream.
    Watching,
}

/// One watch of one resource (one namespace, or all).
pub struct Informer {
    kind: Arc<KindInfo>,
    client: Client,
    api_resource: ApiResource,
    namespace: Option<String>,
    watcher_config: watcher::Config,
    mode: PayloadMode,
    shaper: Shaper,
    updates: bool,
    scope: String,
    store: LightStore,
    phase: Phase,
    stats: Arc<InformerStats>,
}

/// Why an event could not be turned into a change.
#[derive(Debug, thiserror::Error)]
pub enum InformerError {
    /// An object without `metadata.name`.
    #[error("{resource} in {scope}: object without metadata.name skipped")]
    MissingName {
        /// `apiVersion Kind`.
        resource: String,
        /// Namespace or `all namespaces`.
        scope: String,
    },
    /// JSON encoding of a message failed.
    #[error("{resource} {key}: encoding the message failed: {source}")]
    Encode {
        /// `apiVersion Kind`.
        resource: String,
        /// namespace/name.
        key: String,
        /// The serde error.
        source: serde_json::Error,
    },
}

impl Informer {
    /// An informer for `res` of `kind` (described to kube by `api_resource`), watching
    /// `namespace` or, when `None`, all namespaces (or the cluster scope).
    pub fn new(
        kind: Arc<KindInfo>,
        client: Client,
        api_resource: ApiResource,
        namespace: Option<String>,
        res: &ResourceConfig,
        label_key: &str,
    ) -> Self {
        let scope = match (&namespace, kind.namespaced) {
            (Some(ns), _) => format!("namespace {ns}"),
            (None, true) => "all namespaces".to_owned(),
            (None, false) => "cluster".to_owned(),
        };
        let mut wc = watcher::Config::default().page_size(res.page_size);
        if let Some(l) = &res.label_selector {
            wc = wc.labels(l);
        }
        if let Some(f) = &res.field_selector {
            wc = wc.fields(f);
        }
        Informer {
            shaper: Shaper::new(res, label_key, &kind.cluster),
            kind,
            client,
            api_resource,
            namespace,
            watcher_config: wc,
            mode: res.payload,
            updates: res.updates,
            scope,
            store: LightStore::new(),
            phase: Phase::Starting,
            stats: Arc::new(InformerStats::default()),
        }
    }

    /// This informer's counters.
    pub fn stats(&self) -> Arc<InformerStats> {
        self.stats.clone()
    }

    fn resource_name(&self) -> String {
        format!("{} {}", self.kind.api_version, self.kind.kind)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &self.api_resource),
            None => Api::all_with(self.client.clone(), &self.api_resource),
        }
    }

    /// The watcher stream. In metadata mode the Api is over `PartialObjectMeta`, which makes
    /// kube send `Accept: application/json;as=PartialObjectMetadata…;g=meta.k8s.io;v=v1`, so
    /// only metadata crosses the wire.
    fn events(
        &self,
    ) -> impl Stream<Item = Result<Event<DynamicObject>, watcher::Error>> + Send + 'static {
        let wc = self.watcher_config.clone();
        match self.mode {
            PayloadMode::Metadata => {
                watcher::watcher(self.api::<PartialObjectMeta<DynamicObject>>(), wc)
                    .map_ok(|ev| map_event(ev, meta_to_dynamic))
                    .default_backoff()
                    .boxed()
            }
            _ => watcher::watcher(self.api::<DynamicObject>(), wc)
                .default_backoff()
                .boxed(),
        }
    }

    /// Runs until `cancel` fires or the pipeline shuts down.
    pub async fn run(mut self, pipeline: Pipeline, cancel: CancellationToken) {
        let mut events = self.events();
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                next = events.next() => next,
            };
            let Some(next) = next else { break };
            let event = match next {
                Ok(ev) => ev,
                Err(e) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(resource = %self.resource_name(), scope = %self.scope, error = %e, "watch error; retrying with backoff");
                    continue;
                }
            };
            let keep_going = tokio::select! {
                _ = cancel.cancelled() => false,
                ok = self.handle(event, &pipeline) => ok,
            };
            if !keep_going {
                break;
            }
        }
        tracing::debug!(resource = %self.resource_name(), scope = %self.scope, "informer stopped");
    }

    /// Applies one watcher event; returns `false` once the pipeline refuses changes.
    async fn handle(&mut self, event: Event<DynamicObject>, pipeline: &Pipeline) -> bool {
        match event {
            Event::Init => {
                self.stats.lists.fetch_add(1, Ordering::Relaxed);
                self.store.begin_list();
                let started = Instant::now();
                self.phase = if self.stats.synced.load(Ordering::Relaxed) {
                    tracing::info!(resource = %self.resource_name(), scope = %self.scope, "relist started");
                    Phase::Relist { started, listed: 0 }
                } else {
                    tracing::info!(resource = %self.resource_name(), scope = %self.scope, "initial list started");
                    Phase::InitialList { started, listed: 0 }
                };
                true
            }
            Event::InitApply(obj) => {
                self.stats.events_received.fetch_add(1, Ordering::Relaxed);
                if let Phase::InitialList { listed, started } | Phase::Relist { listed, started } =
                    &mut self.phase
                {
                    *listed += 1;
                    if *listed % 10_000 == 0 {
                        let (listed, elapsed) = (*listed, started.elapsed());
                        tracing::info!(resource = %self.resource_name(), scope = %self.scope, listed, ?elapsed, "listing");
                    }
                }
                let initial = matches!(self.phase, Phase::InitialList { .. });
                self.apply(obj, initial, pipeline).await
            }
            Event::InitDone => {
                let vanished = self.store.end_list();
                let (kind, started, listed) = match self.phase {
                    Phase::InitialList { started, listed } => {
                        ("initial sync complete", started, listed)
                    }
                    Phase::Relist { started, listed } => ("relist complete", started, listed),
                    _ => ("list complete", Instant::now(), 0),
                };
                tracing::info!(resource = %self.resource_name(), scope = %self.scope, objects = listed, vanished = vanished.len(), elapsed = ?started.elapsed(), "{kind}");
                self.phase = Phase::Watching;
                self.stats.synced.store(true, Ordering::Relaxed);
                self.stats
                    .objects
                    .store(self.store.len() as u64, Ordering::Relaxed);
                for v in vanished {
                    self.stats.inferred_deletes.fetch_add(1, Ordering::Relaxed);
                    let change = Change {
                        op: Op::Deleted,
                        namespace: v.namespace.as_deref(),
                        name: &v.name,
                        uid: &v.uid,
                        resource_version: &v.rv,
                        initial: false,
                        final_state_unknown: true,
                        object: None,
                    };
                    if !self.emit(&change, pipeline).await {
                        return false;
                    }
                }
                true
            }
            Event::Apply(obj) => {
                self.stats.events_received.fetch_add(1, Ordering::Relaxed);
                self.apply(obj, false, pipeline).await
            }
            Event::Delete(obj) => {
                self.stats.events_received.fetch_add(1, Ordering::Relaxed);
                let Some(name) = obj.metadata.name.clone() else {
                    self.warn_missing_name();
                    return true;
                };
                let ns = obj.metadata.namespace.clone();
                let uid = obj.metadata.uid.clone().unwrap_or_default();
                let rv = obj.metadata.resource_version.clone().unwrap_or_default();
                self.store.remove(ns.as_deref(), &name);
                self.stats
                    .objects
                    .store(self.store.len() as u64, Ordering::Relaxed);
                let shaped = self.shaper.shape(obj);
                let change = Change {
                    op: Op::Deleted,
                    namespace: ns.as_deref(),
                    name: &name,
                    uid: &uid,
                    resource_version: &rv,
                    initial: false,
                    final_state_unknown: false,
                    object: Some(&shaped),
                };
                self.emit(&change, pipeline).await
            }
        }
    }

    fn warn_missing_name(&self) {
        let e = InformerError::MissingName {
            resource: self.resource_name(),
            scope: self.scope.clone(),
        };
        tracing::warn!("{e}");
    }

    async fn apply(&mut self, obj: DynamicObject, initial: bool, pipeline: &Pipeline) -> bool {
        let Some(name) = obj.metadata.name.clone() else {
            self.warn_missing_name();
            return true;
        };
        let ns = obj.metadata.namespace.clone();
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        let shaped: Value = self.shaper.shape(obj);
        let fp = fingerprint(&shaped);
        let observed = self.store.observe(ns.as_deref(), &name, &uid, &rv, fp);
        self.stats
            .objects
            .store(self.store.len() as u64, Ordering::Relaxed);
        let op = match observed {
            Observed::New => Op::Added,
            Observed::Changed if self.updates => Op::Updated,
            Observed::Changed | Observed::Unchanged => {
                self.stats.suppressed.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            Observed::Replaced { old_uid, old_rv } => {
                self.stats.inferred_deletes.fetch_add(1, Ordering::Relaxed);
                let gone = Change {
                    op: Op::Deleted,
                    namespace: ns.as_deref(),
                    name: &name,
                    uid: &old_uid,
                    resource_version: &old_rv,
                    initial: false,
                    final_state_unknown: true,
                    object: None,
                };
                if !self.emit(&gone, pipeline).await {
                    return false;
                }
                Op::Added
            }
        };
        let change = Change {
            op,
            namespace: ns.as_deref(),
            name: &name,
            uid: &uid,
            resource_version: &rv,
            initial,
            final_state_unknown: false,
            object: Some(&shaped),
        };
        self.emit(&change, pipeline).await
    }

    async fn emit(&self, change: &Change<'_>, pipeline: &Pipeline) -> bool {
        let msg = match encode(&self.kind, change, &now_rfc3339()) {
            Ok(m) => m,
            Err(source) => {
                let e = InformerError::Encode {
                    resource: self.resource_name(),
                    key: format!("{}/{}", change.namespace.unwrap_or(""), change.name),
                    source,
                };
                tracing::error!("{e}");
                return true;
            }
        };
        self.stats.emitted.fetch_add(1, Ordering::Relaxed);
        pipeline.publish(msg).await
    }
}

fn map_event<A, B>(ev: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

fn meta_to_dynamic(m: PartialObjectMeta<DynamicObject>) -> DynamicObject {
    DynamicObject {
        types: m.types,
        metadata: m.metadata,
        data: Value::Null,
    }
}
