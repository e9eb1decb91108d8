//! Restart from saved state at scale: messages re-sent, state size and save time.
//!
//! A simulated cluster of `BENCH_PODS` pods (default 100,000) is listed by kubesink with a
//! `file` state store and a counting sink, in three modes interleaved over five rounds
//! (medians side by side, the machine being shared): with state and its journal (every
//! `added` of the initial list recorded first: size and appends measured before the first
//! save), with state without the journal (`write_ahead = false`), without state. On the
//! first journal run the acknowledged state is saved five times while the informers run
//! (size, pack time, longest lock of an informer's store, write time, journal drop:
//! medians). While kubesink is down, 100 pods are updated, 100 created and 100 deleted; a
//! kubesink starts from the state file and every message it sends is counted, then one
//! without state, for comparison.
//!
//! The Kafka row (Cargo feature `kafka`, tansu as `tests/` start it): the same list with the
//! state in a compacted topic, five saves (snapshot bytes, write time: chunks, manifest and
//! tombstones acknowledged), five restores as a replica taking over does them (fence, read up
//! to it, copy forward), and the restart after the same downtime changes from that state.
//!
//! `cargo bench --bench restart` (prints, asserts nothing about time)

#[path = "common/mod.rs"]
mod common;
#[cfg(feature = "kafka")]
use kubesink_test_support as support;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kubesink::bridge::Bridge;
use kubesink::config::{ClusterConfig, Config, ResourceConfig, StateBackend, StateConfig};
use kubesink::state::SaveReport;
use kubesink_core::{Message, Sink, SinkError};
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
    let client = kubesink::cluster::client(&config.clusters()[0]).await?;
    let t = Instant::now();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let bridge = Bridge::start(&kubesink::plan::resolve(config)?, client, sinks).await?;
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

    // A stateless list first, so that no run below pays for a cold simulator (its first
    // list serializes every object); its time is not reported.
    let mut stateless = config.clone();
    stateless.state = StateConfig::default();
    let (bridge, _) = run(&stateless, &Arc::new(Counting::default())).await?;
    bridge.shutdown().await;

    // The initial list in three modes, interleaved over ROUNDS rounds (the machine is shared
    // and noisy: the medians side by side are the figure): with state and journal, with
    // state without the journal, without state. Round 0's journal run is the one whose state
    // the restart below starts from; the others start from empty files of their own.
    const ROUNDS: usize = 5;
    let mut listed: [Vec<Duration>; 3] = Default::default();
    let (mut journal_bytes, mut records, mut appends, mut journal_wait) = (0u64, 0.0, 0.0, 0.0);
    let mut reports: Vec<SaveReport> = Vec::new();
    let mut size = 0;
    for round in 0..ROUNDS {
        for (mode, list) in listed.iter_mut().enumerate() {
            let mut c = match mode {
                0 | 1 => config.clone(),
                _ => stateless.clone(),
            };
            if round > 0 || mode == 1 {
                c.state.path = Some(dir.path().join(format!("scratch-{round}-{mode}")));
            }
            c.state.write_ahead = mode == 0;
            let (bridge, took) = run(&c, &Arc::new(Counting::default())).await?;
            list.push(took);
            if round == 0 && mode == 0 {
                let (exposition, _) = bridge.observed().metrics();
                let metric = |name: &str| {
                    exposition
                        .lines()
                        .find(|l| l.starts_with(name))
                        .and_then(|l| l.rsplit(' ').next())
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0)
                };
                journal_wait = metric("kubesink_sink_journal_wait_seconds_total");
                records = metric("kubesink_state_journal_records_total");
                appends = metric("kubesink_state_journal_appends_total");
                journal_bytes = std::fs::read_dir(dir.path())?
                    .filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with("state.journal-")
                    })
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum();
                // Saves while the informers run.
                for _ in 0..5 {
                    if let Some(r) = bridge.save_state().await {
                        reports.push(r?);
                    }
                }
                bridge.shutdown().await;
                size = std::fs::metadata(&state_file)?.len();
            } else {
                bridge.shutdown().await;
            }
        }
    }

    // The Kafka row: the state in a compacted topic on tansu.
    #[cfg(feature = "kafka")]
    let tansu = support::kafka_server::Tansu::start().await;
    #[cfg(feature = "kafka")]
    let kafka_config = {
        let mut c = config.clone();
        c.state.backend = StateBackend::Kafka;
        c.state.path = None;
        c.state.kafka.bootstrap_servers = Some(tansu.bootstrap.clone());
        c
    };
    #[cfg(feature = "kafka")]
    let (kafka_reports, kafka_reads, kafka_listed) = {
        let (bridge, took) = run(&kafka_config, &Arc::new(Counting::default())).await?;
        let mut reports: Vec<SaveReport> = Vec::new();
        for _ in 0..5 {
            if let Some(r) = bridge.save_state().await {
                reports.push(r?);
            }
        }
        bridge.shutdown().await;
        // Restores as a replica taking over does them: fence, read up to it, copy forward.
        let mut reads = Vec::new();
        for _ in 0..5 {
            let store = kubesink::state::open(
                &kubesink::plan::resolve(&kafka_config)?.state,
                "bench",
                false,
            )
            .ok_or_else(|| anyhow::anyhow!("no Kafka state store"))?;
            let started = Instant::now();
            kubesink::state::read(&*store).await?;
            reads.push(started.elapsed());
        }
        (reports, reads, took)
    };

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
    // From the Kafka state.
    #[cfg(feature = "kafka")]
    let from_kafka = {
        let counted = Arc::new(Counting::default());
        let (bridge, _) = run(&kafka_config, &counted).await?;
        bridge.shutdown().await;
        counted
    };
    // Third run: without state (stateless: a full initial list).
    let third = Arc::new(Counting::default());
    let (bridge, _) = run(&stateless, &third).await?;
    bridge.shutdown().await;
    sim.shutdown();

    let range = |v: &[Duration]| {
        let (lo, hi) = (v.iter().min(), v.iter().max());
        format!(
            "{:.2?}..{:.2?}",
            lo.copied().unwrap_or_default(),
            hi.copied().unwrap_or_default()
        )
    };
    let ranges = [range(&listed[0]), range(&listed[1]), range(&listed[2])];
    let [journal, no_journal, no_state] = listed.map(median);
    let per_s = |d: Duration| pods as f64 / d.as_secs_f64();
    println!(
        "objects: {pods} pods; initial list, medians of {ROUNDS} interleaved rounds (range): with state and journal {journal:.2?} ({:.0}/s; {}), with state without journal {no_journal:.2?} ({:.0}/s; {}), without state {no_state:.2?} ({:.0}/s; {}); journal + tracking at {:.2}x the stateless rate, the journal alone at {:.2}x",
        per_s(journal),
        ranges[0],
        per_s(no_journal),
        ranges[1],
        per_s(no_state),
        ranges[2],
        per_s(journal) / per_s(no_state),
        per_s(journal) / per_s(no_journal),
    );
    println!(
        "journal of the initial list: {journal_bytes} bytes ({:.1} bytes/object), {records} records in {appends} appends ({:.0} records per write + fdatasync), the sink's batches waited {journal_wait:.3} s for it in all; dropped by the first save",
        journal_bytes as f64 / pods as f64,
        records / appends.max(1.0),
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
    #[cfg(feature = "kafka")]
    {
        let reads = kafka_reads.clone();
        println!(
            "kafka state (tansu, memory engine; chunks of 512 KiB): {} bytes ({:.1} bytes/object); initial list with it {kafka_listed:.2?}; save (median of {}): pack {:.2?}, write (chunks, manifest, tombstones acknowledged) {:.2?}, journal drop {:.2?}; restore read as at a take-over (fence, read to it, copy forward; median of {}, range {}): {:.2?}",
            kafka_reports.last().map_or(0, |r| r.bytes),
            kafka_reports.last().map_or(0, |r| r.bytes) as f64 / pods as f64,
            kafka_reports.len(),
            median(kafka_reports.iter().map(|r| r.pack).collect()),
            median(kafka_reports.iter().map(|r| r.write).collect()),
            median(kafka_reports.iter().map(|r| r.journal_drop).collect()),
            reads.len(),
            range(&reads),
            median(kafka_reads),
        );
        println!(
            "restart from the kafka state after the same changes: {} messages {:?}",
            from_kafka.total(),
            from_kafka.ops.lock().unwrap()
        );
    }
    Ok(())
}
