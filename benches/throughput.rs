//! Messages/s through the whole path (simulator over HTTP → list/watch loop → lightweight informer →
//! pipeline → stdout sink writing to /dev/null), side by side with the serde_json floor
//! (parse + write of the same objects) measured in the same run, so the ratio is what counts
//! on a noisy machine.
//!
//! `cargo bench --bench throughput` (pods: `BENCH_PODS`, default 20000)

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubesink::bridge::Bridge;
use kubesink::config::{ClusterConfig, Config, ResourceConfig};
use kubesink_core::Sink;
use kubesink_stdout::StdoutSink;

/// The allocator of the `kubesink` binary, so the figures are the product's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let common::SimulatedPods {
        sim,
        kubeconfig,
        dir: _dir,
        pods,
    } = common::simulated_pods(20_000, 20).await?;

    // Floor: serde_json parse + write of the same objects.
    let wire: Vec<Vec<u8>> = sim
        .objects("v1", "Pod")
        .iter()
        .map(serde_json::to_vec)
        .collect::<Result<_, _>>()?;
    let mean = wire.iter().map(Vec::len).sum::<usize>() / wire.len().max(1);
    let mut out = Vec::with_capacity(16 << 10);
    let t = Instant::now();
    for w in &wire {
        let v: serde_json::Value = serde_json::from_slice(w)?;
        out.clear();
        serde_json::to_writer(&mut out, &v)?;
    }
    let floor = wire.len() as f64 / t.elapsed().as_secs_f64();
    drop(wire);

    // kubesink: initial list of every pod through to /dev/null.
    let config = Config {
        cluster: ClusterConfig {
            name: "bench".into(),
            kubeconfig: Some(kubeconfig),
            ..Default::default()
        },
        resources: vec![ResourceConfig::new("v1", "Pod")],
        sinks: vec![],
        server: kubesink::config::ServerConfig {
            enabled: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let devnull = tokio::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .await?;
    let sink: Arc<dyn Sink> = Arc::new(StdoutSink::new("devnull".into(), Box::new(devnull)));
    let client = kubesink::cluster::client(&config.clusters()[0]).await?;
    let t = Instant::now();
    let bridge = Bridge::start(&kubesink::plan::resolve(&config)?, client, vec![sink]).await?;
    let stats = bridge.pipeline().sinks()[0].stats().clone();
    while stats.delivered.load(Ordering::Relaxed) < pods as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = t.elapsed();
    let rate = pods as f64 / elapsed.as_secs_f64();
    bridge.shutdown().await;
    sim.shutdown();
    println!("objects: {pods} pods, mean {mean} bytes");
    println!("serde_json parse+write floor: {floor:.0} objects/s");
    println!("kubesink initial list → stdout sink (/dev/null): {rate:.0} messages/s ({elapsed:.2?}), {:.2}x the floor", rate / floor);
    Ok(())
}
