//! A running bridge as the robustness tests drive it: a capturing sink, a cluster name of its
//! own (its log lines carry it, see `logs.rs`), and short names for its counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::{Config, ResourceConfig};
use kubesink::InformerStats;
use kubesink_core::Sink;
use serde_json::{json, Value};

use crate::logs;
use crate::{config, wait_for, CaptureSink, Cluster};

/// How long a robustness test waits for an outcome.
pub const LONG: Duration = Duration::from_secs(60);
/// The simulator's path of every ConfigMap (to inject faults on, to count requests of).
pub const CONFIGMAPS: &str = "/api/v1/configmaps";

/// A bridge with a capturing sink, under a cluster name of its own (its log lines carry it).
pub struct Run {
    /// The running bridge.
    pub bridge: Bridge,
    /// Its only sink.
    pub sink: Arc<CaptureSink>,
    /// Its cluster name, unique in the process.
    pub cluster: String,
    /// The process's captured log.
    pub logs: logs::Logs,
}

impl Run {
    /// Starts a bridge on `c` for `resources` under a cluster name made from `name`, with
    /// [`config`] changed by `tweak`.
    pub async fn start(
        c: &Cluster,
        name: &str,
        resources: Vec<ResourceConfig>,
        tweak: impl FnOnce(&mut Config),
    ) -> Run {
        let logs = logs::install();
        let cluster = logs::unique_cluster(name);
        let mut cfg = config(&c.kubeconfig, resources);
        cfg.cluster.name = cluster.clone();
        tweak(&mut cfg);
        let client = kubesink::cluster::client(&cfg.clusters()[0])
            .await
            .expect("client");
        let sink = CaptureSink::new();
        let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
        let bridge = Bridge::start(&crate::plan(&cfg), client, sinks)
            .await
            .expect("bridge starts");
        Run {
            bridge,
            sink,
            cluster,
            logs,
        }
    }

    /// The counters of the (single) watch of `kind`.
    pub fn stats(&self, kind: &str) -> Arc<InformerStats> {
        self.bridge
            .informer_stats()
            .iter()
            .find(|(label, _)| label.split(' ').nth(1) == Some(kind))
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| panic!("no watch of {kind}"))
    }

    /// One counter (`get`) of the watch of `kind`.
    pub fn count(&self, kind: &str, get: impl Fn(&InformerStats) -> &AtomicU64) -> u64 {
        get(&self.stats(kind)).load(Ordering::SeqCst)
    }

    /// Whether every watch has synced.
    pub fn synced(&self) -> bool {
        self.bridge
            .informer_stats()
            .iter()
            .all(|(_, s)| s.synced.load(Ordering::SeqCst))
    }

    /// Messages of `kind` named `name`, in order.
    pub fn messages_of(&self, kind: &str, name: &str) -> Vec<Value> {
        self.sink
            .messages()
            .into_iter()
            .filter(|m| m["kind"] == kind && m["name"] == name)
            .collect()
    }

    /// Whether a message `op` of `kind` `name` was delivered.
    pub fn has(&self, kind: &str, name: &str, op: &str) -> bool {
        self.messages_of(kind, name).iter().any(|m| m["op"] == op)
    }

    /// This run's log lines containing `text`.
    pub fn log(&self, text: &str) -> Vec<String> {
        self.logs.of(&self.cluster, text)
    }

    /// Waits until no sink holds a message.
    pub async fn idle(&self) {
        wait_for("pipeline idle", LONG, || {
            self.bridge.pipeline().sinks().iter().all(|h| h.held() == 0)
        })
        .await;
    }
}

/// A ConfigMap `name` in `ns` with one key.
pub fn configmap(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": ns}, "data": {"k": "v"}})
}

/// A Node `name`.
pub fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}
