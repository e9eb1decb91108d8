//! Churn: a deterministic (ChaCha8 seeded) mix of pod adds, spec updates (container image →
//! generation bump), status-only updates (restartCount) and deletes that keeps the pod
//! population near its size when churn starts. Same seed and same starting store ⇒ same
//! sequence of operations. Writes go through the store's normal paths, so watchers see
//! ordinary ADDED/MODIFIED/DELETED events.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::random_suffix;
use super::templates::{self, Templates};
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::store::ObjKey;
use crate::Simulator;

/// Background churn settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Churn {
    /// Operations per second (each is one write, so one resourceVersion).
    pub rate_per_sec: f64,
    /// Seed of the operation generator.
    pub seed: u64,
}

/// Counts of applied operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChurnStats {
    /// Pods created.
    pub adds: usize,
    /// Pod spec changes (generation bumped).
    pub spec_updates: usize,
    /// Pod status-only changes.
    pub status_updates: usize,
    /// Pods deleted.
    pub deletes: usize,
}

impl ChurnStats {
    /// Total operations.
    pub fn total(&self) -> usize {
        self.adds + self.spec_updates + self.status_updates + self.deletes
    }
}

/// Running background churn; stops on drop or [`ChurnHandle::stop`].
pub struct ChurnHandle {
    token: CancellationToken,
    stats: Arc<Mutex<ChurnStats>>,
}

impl ChurnHandle {
    /// Stops the churn task.
    pub fn stop(self) {
        self.token.cancel();
    }

    /// Operations applied so far.
    pub fn stats(&self) -> ChurnStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for ChurnHandle {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

struct Churner {
    rng: ChaCha8Rng,
    rt: Arc<ResourceType>,
    pods: Vec<ObjKey>,
    target: usize,
    template: Value,
    /// Annotation stamped with the write's wall-clock time (see [`spawn_stamped_churn`]).
    stamp: Option<String>,
}

/// Sets `metadata.annotations[key]` to the current Unix time in microseconds.
fn stamp_now(obj: &mut Value, key: &str) {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if !annotations.is_object() {
            *annotations = json!({});
        }
        if let Some(a) = annotations.as_object_mut() {
            a.insert(key.to_owned(), json!(micros.to_string()));
        }
    }
}

fn set_name(obj: &mut Value, name: &str) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("name".into(), json!(name));
    }
}

impl Churner {
    fn new(sim: &Simulator, seed: u64, stamp: Option<String>) -> Result<Self, ApiError> {
        let rt = sim.resource("v1", "Pod")?;
        let pods = sim.inner.store().keys(&rt);
        Ok(Churner {
            rng: ChaCha8Rng::seed_from_u64(seed),
            target: pods.len(),
            pods,
            rt,
            template: Templates::load()?.pod,
            stamp,
        })
    }

    fn step(&mut self, sim: &Simulator, stats: &mut ChurnStats) -> Result<(), ApiError> {
        let pop = self.pods.len();
        let mut op = self.rng.random_range(0..4u8);
        if pop == 0 || (op == 3 && pop + self.target / 10 < self.target) {
            op = 0;
        } else if op == 0 && pop > self.target + self.target / 10 + 1 {
            op = 3;
        }
        let idx = if pop == 0 {
            0
        } else {
            self.rng.random_range(0..pop)
        };
        let mut store = sim.inner.store();
        match op {
            0 => {
                let mut obj = match self.pods.get(idx) {
                    Some((ns, name)) => store.get(&self.rt, ns, name)?.to_value()?,
                    None => templates::named(&self.template, "web-0-churn", Some("default")),
                };
                let prefix = obj
                    .pointer("/metadata/generateName")
                    .and_then(Value::as_str)
                    .unwrap_or("web-churn-")
                    .to_owned();
                let name = format!("{prefix}{}", random_suffix(&mut self.rng, 5));
                let mut obj = {
                    set_name(&mut obj, &name);
                    templates::named(
                        &obj,
                        &name,
                        obj.pointer("/metadata/namespace")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                            .as_deref(),
                    )
                };
                if let Some(key) = &self.stamp {
                    stamp_now(&mut obj, key);
                }
                match store.create(&self.rt, None, obj) {
                    Ok(created) => {
                        self.pods
                            .push((created.namespace.clone(), created.name.clone()));
                        stats.adds += 1;
                    }
                    Err(ApiError::AlreadyExists { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            1 | 2 => {
                let Some((ns, name)) = self.pods.get(idx).cloned() else {
                    return Ok(());
                };
                let mut obj = match store.get(&self.rt, &ns, &name) {
                    Ok(o) => o.to_value()?,
                    Err(ApiError::NotFound { .. }) => {
                        self.pods.swap_remove(idx);
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                };
                if op == 1 {
                    let image = format!(
                        "registry.k8s.io/coredns/coredns:v1.12.{}",
                        self.rng.random_range(0..100)
                    );
                    if let Some(slot) = obj.pointer_mut("/spec/containers/0/image") {
                        *slot = json!(image);
                    }
                    stats.spec_updates += 1;
                } else {
                    let restarts = obj
                        .pointer("/status/containerStatuses/0/restartCount")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    match obj.pointer_mut("/status/containerStatuses/0/restartCount") {
                        Some(slot) => *slot = json!(restarts + 1),
                        None => obj["status"] = json!({"phase": "Running"}),
                    }
                    stats.status_updates += 1;
                }
                if let Some(key) = &self.stamp {
                    stamp_now(&mut obj, key);
                }
                store.replace(&self.rt, None, None, obj)?;
            }
            _ => {
                let (ns, name) = self.pods.swap_remove(idx);
                match store.delete(&self.rt, &ns, &name) {
                    Ok(_) => stats.deletes += 1,
                    Err(ApiError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

/// Applies `steps` operations from a generator seeded with `seed`.
pub(crate) fn churn_steps(
    sim: &Simulator,
    steps: usize,
    seed: u64,
) -> Result<ChurnStats, ApiError> {
    let mut churner = Churner::new(sim, seed, None)?;
    let mut stats = ChurnStats::default();
    for _ in 0..steps {
        churner.step(sim, &mut stats)?;
    }
    Ok(stats)
}

/// Spawns churn at `churn.rate_per_sec` on the current tokio runtime.
pub(crate) fn spawn_churn(sim: &Simulator, churn: Churn) -> ChurnHandle {
    spawn_stamped_churn(sim, churn, None)
}

/// Like [`spawn_churn`]; with `stamp`, every added or updated pod carries that annotation
/// set to the write's wall-clock time (Unix microseconds, a decimal string), so a consumer
/// can measure change-to-delivery latency. Deletes are not stamped (the final object keeps
/// its last stamp).
pub(crate) fn spawn_stamped_churn(
    sim: &Simulator,
    churn: Churn,
    stamp: Option<String>,
) -> ChurnHandle {
    let token = CancellationToken::new();
    let stats = Arc::new(Mutex::new(ChurnStats::default()));
    let handle = ChurnHandle {
        token: token.clone(),
        stats: stats.clone(),
    };
    let sim = sim.clone();
    tokio::spawn(async move {
        let mut churner = match Churner::new(&sim, churn.seed, stamp) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "churn could not start");
                return;
            }
        };
        let start = tokio::time::Instant::now();
        let mut done: u64 = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = sim.inner.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let due = (start.elapsed().as_secs_f64() * churn.rate_per_sec.max(0.0)) as u64;
            let mut local = ChurnStats::default();
            while done < due && done + 10_000 > due {
                if let Err(e) = churner.step(&sim, &mut local) {
                    tracing::warn!(error = %e, "churn step failed");
                }
                done += 1;
            }
            done = done.max(due);
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            s.adds += local.adds;
            s.spec_updates += local.spec_updates;
            s.status_updates += local.status_updates;
            s.deletes += local.deletes;
        }
    });
    handle
}
