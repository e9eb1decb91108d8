//! Restart from saved state at scale: messages re-sent, state size and save time.
//!
//! A simulated cluster of `BENCH_PODS` pods (default 100,000) is listed by kubesink with a
//! `file` state store and a counting sink (every `added` of the initial list goes through the
//! state journal first: its size is measured before the first save); the acknowledged state
//! is saved (size, pack time, longest lock of an informer's store, write time, journal drop:
//! the median of five saves while the informers run) and kubesink shuts down. While it is
//! down, 100 pods are updated, 100 created and 100 deleted. A second kubesink starts from the
//! state file and every message it sends is counted, then a third without state, for
//! comparison, and a fourth with state but `write_ahead = false`: the initial lists of the
//! first, third and fourth runs, side by side, give the cost of the journal and of tracking
//! acknowledgements.
//!
//! `cargo bench --bench restart` (prints, asserts nothing about time)

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kubesink::bridge::Bridge;
use kubesink::config::{ClusterConfig, Config, ResourceConfig, StateBackend, StateConfig};
use kubesink::sinks::{Message, Sink, SinkError};
use kubesink::state::SaveReport;
use serde_json::Value;

/// The allocator of the `kubesink` binary, so the figures are the product's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Counts messages by op (and `initial`), keeps nothing else.
#[derive(Default)]
struct Counting {
    ops: Mutex<BTreeMap<String, u64>>,
}

impl Counting {
    fn total(&self) -> u64 {
        self.ops.lock().unwrap().values().sum()
    }
}

#[async_trait]
impl Sink for Counting {
    fn name(&self) -> &str {
        "counting"
    }
    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        let mut ops = self.ops.lock().unwrap();
        for m in batch {
            let initial = m.payload.windows(14).any(|w| w == b"\"initial\":true");
            let fsu = m
                .payload
                .windows(24)
                .any(|w| w == b"\"finalStateUnknown\":true");
            let label = format!(
                "{}{}{}",
                m.meta.op,
                if initial { " initial" } else { "" },
                if fsu { " finalStateUnknown" } else { "" }
            );
            *ops.entry(label).or_default() += 1;
        }
        Ok(())
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
    async fn close(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Runs a bridge until its list is done and the sink has everything; returns it running.
async fn run(config: &Config, sink: &Arc<Counting>) -> anyhow::Result<(Bridge, Duration)> {
    let client = kubesink::cluster::client(&config.cluster).await?;
    let t = Instant::now();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let bridge = Bridge::start(config, client, sinks).await?;
    loop {
        let synced = bridge
            .informer_stats()
            .iter()
            .all(|(_, s)| s.synced.load(Ordering::Relaxed));
        let emitted: u64 = bridge
            .informer_stats()
            .iter()
            .map(|(_, s)| s.emitted())
            .sum();
        let idle = bridge.pipeline().sinks().iter().all(|h| h.held() == 0);
        if synced && idle && sink.total() >= emitted {
            return Ok((bridge, t.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let common::SimulatedPods {
        sim,
        kubeconfig,
        dir,
        pods,
    } = common::simulated_pods(100_000, 50).await?;
    // Pods 0..300 are updated and deleted while kubesink is down, and pod 300 is the template
    // of the created ones.
    anyhow::ensure!(
        pods > 300,
        "BENCH_PODS must be at least 301 (pods 0..300 change while kubesink is down), got {pods}"
    );
    let state_file = dir.path().join("state");
    let config = Config {
        cluster: ClusterConfig {
            name: "bench".into(),
            kubeconfig: Some(kubeconfig),
            ..Default::default()
        },
        resources: vec![ResourceConfig::new("v1", "Pod")],
        sinks: vec![],
        state: StateConfig {
            backend: StateBackend::File,
            path: Some(state_file.clone()),
            interval: kubesink::config::HumanDuration::from_secs(3600),
            ..Default::default()
        },
        ..Default::default()
    };

    // First run: the full initial list (through the journal), then saves while the
    // informers run.
    let first = Arc::new(Counting::default());
    let (bridge, listed) = run(&config, &first).await?;
    let journal_bytes: u64 = std::fs::read_dir(dir.path())?
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("state.journal-")
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    let mut reports: Vec<SaveReport> = Vec::new();
    for _ in 0..5 {
        if let Some(r) = bridge.save_state().await {
            reports.push(r?);
        }
    }
    bridge.shutdown().await;
    let size = std::fs::metadata(&state_file)?.len();

    // While down: 100 updates, 100 creates, 100 deletes.
    let objects = sim.objects("v1", "Pod");
    for o in &objects[..100] {
        let mut o = o.clone();
        o["metadata"]["labels"]["restarted"] = Value::from("yes");
        sim.replace(o)?;
    }
    for o in &objects[100..200] {
        let m = &o["metadata"];
        sim.delete(
            "v1",
            "Pod",
            m["namespace"].as_str(),
            m["name"].as_str().unwrap_or_default(),
        )?;
    }
    for i in 0..100 {
        let mut o = objects[300].clone();
        if let Some(m) = o["metadata"].as_object_mut() {
            for k in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "managedFields",
            ] {
                m.remove(k);
            }
            m.insert(
                "name".into(),
                Value::from(format!("created-while-down-{i}")),
            );
        }
        sim.create(o)?;
    }

    // Second run: from the state file.
    let second = Arc::new(Counting::default());
    let (bridge, relisted) = run(&config, &second).await?;
    bridge.shutdown().await;
    // Third run: without state (as before issue 8).
    let mut stateless = config.clone();
    stateless.state = StateConfig::default();
    let third = Arc::new(Counting::default());
    let (bridge, listed_stateless) = run(&stateless, &third).await?;
    bridge.shutdown().await;
    // Fourth run: with state, without the journal, from nothing (another file).
    let mut no_journal = config.clone();
    no_journal.state.path = Some(dir.path().join("state-without-journal"));
    no_journal.state.write_ahead = false;
    let fourth = Arc::new(Counting::default());
    let (bridge, listed_no_journal) = run(&no_journal, &fourth).await?;
    bridge.shutdown().await;
    sim.shutdown();

    let per_s = |d: Duration| pods as f64 / d.as_secs_f64();
    println!(
        "objects: {pods} pods; initial list with state and journal {listed:.2?} ({:.0}/s), with state without journal {listed_no_journal:.2?} ({:.0}/s), without state {listed_stateless:.2?} ({:.0}/s): journal + tracking cost {:.1}% of the stateless rate",
        per_s(listed),
        per_s(listed_no_journal),
        per_s(listed_stateless),
        (1.0 - per_s(listed) / per_s(listed_stateless)) * 100.0,
    );
    println!(
        "journal of the initial list: {journal_bytes} bytes ({:.1} bytes/object), dropped by the first save",
        journal_bytes as f64 / pods as f64
    );
    println!(
        "state: {size} bytes ({:.1} bytes/object); save (median of {}): pack {:.2?} (longest informer lock {:.2?}), write+fsync+rename {:.2?}, journal drop {:.2?}",
        size as f64 / pods as f64,
        reports.len(),
        median(reports.iter().map(|r| r.pack).collect()),
        median(reports.iter().map(|r| r.longest_lock).collect()),
        median(reports.iter().map(|r| r.write).collect()),
        median(reports.iter().map(|r| r.journal_drop).collect()),
    );
    println!(
        "restart after 100 updates + 100 creates + 100 deletes while down: {} messages {:?} (list {relisted:.2?})",
        second.total(),
        second.ops.lock().unwrap()
    );
    println!(
        "the same restart without state: {} messages {:?}",
        third.total(),
        third.ops.lock().unwrap()
    );
    Ok(())
}
