//! What one more cluster costs at rest: kubesink's live heap bytes with `N` clusters
//! (`[[clusters]]`, Pods and Deployments each, one simulator serving them all) once every
//! cluster synced and the process is quiet, for `N` = 1 and `BENCH_CLUSTERS` (default 21):
//! the difference ÷ (N − 1) is the heap of one cluster, its informers and their watches.
//!
//! A counting global allocator counts live bytes per thread kind: the simulator runs on a
//! runtime of its own whose threads are not counted, so only kubesink's heap is (the two
//! share nothing but TCP). RSS is more than heap (allocator pages, thread stacks), so the
//! suite's RSS figures (`bench-suite --only fleet`) are the operator's view; this bench says
//! where the bytes are. With `BENCH_EXIT_AT_REST=1` the process exits at rest without
//! shutting down, so a heap profiler (`heaptrack`) reports everything live at rest as
//! "leaked", by call site.
//!
//! `cargo bench --bench cluster_cost` (prints, asserts nothing)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kubesink::bridge::Bridge;
use kubesink::config::{ClusterEntry, Config, ResourceConfig};
use kubesink_core::{Message, Sink, SinkError};
use kubesink_sim::{SimConfig, Simulator, Workload};

/// Live bytes allocated by counted threads (may go negative for a moment across threads).
static LIVE: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// This thread's allocations are not counted (the simulator's runtime).
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

fn counted() -> bool {
    !UNCOUNTED.try_with(Cell::get).unwrap_or(false)
}

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if counted() {
            LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if counted() {
            LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if counted() {
            LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Discards every message.
struct Null;

#[async_trait]
impl Sink for Null {
    fn name(&self) -> &str {
        "null"
    }
    async fn send(&self, _batch: &[Message]) -> Result<(), SinkError> {
        Ok(())
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
    async fn close(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// kubesink's live heap at rest with `n` clusters on `kubeconfig`.
async fn at_rest(kubeconfig: &std::path::Path, n: usize, exit: bool) -> anyhow::Result<isize> {
    let mut cfg = Config {
        resources: vec![
            ResourceConfig::new("v1", "Pod"),
            ResourceConfig::new("apps/v1", "Deployment"),
        ],
        ..Default::default()
    };
    cfg.server.enabled = false;
    cfg.log.summary_interval = kubesink::config::HumanDuration(Duration::ZERO);
    cfg.clusters = (0..n)
        .map(|i| ClusterEntry {
            name: format!("c{i}"),
            kubeconfig: Some(kubeconfig.to_path_buf()),
            context: None,
            resources: None,
            shards: 1,
        })
        .collect();
    let before = LIVE.load(Ordering::SeqCst);
    let mut clients = Vec::new();
    for spec in cfg.clusters() {
        clients.push(kubesink::cluster::client(&spec).await?);
    }
    let bridge = Bridge::start_with(
        &kubesink::plan::resolve(&cfg)?,
        clients,
        vec![Arc::new(Null) as Arc<dyn Sink>],
        None,
    )
    .await?;
    let started = Instant::now();
    while !bridge
        .informer_stats()
        .iter()
        .all(|(_, s)| s.synced.load(Ordering::SeqCst))
    {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(120), "no sync");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Quiet: the last batches delivered, the queues drained.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let live = LIVE.load(Ordering::SeqCst) - before;
    if exit {
        println!("{n} clusters at rest: {live} bytes live; exiting without shutdown");
        std::process::exit(0);
    }
    bridge.shutdown().await;
    Ok(live)
}

fn main() -> anyhow::Result<()> {
    let many = env("BENCH_CLUSTERS", 21).max(2);
    let pods = env("BENCH_PODS", 100);
    let exit = std::env::var_os("BENCH_EXIT_AT_REST").is_some();
    // The simulator on threads of its own, not counted.
    let sim_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .on_thread_start(|| UNCOUNTED.with(|u| u.set(true)))
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    let sim = sim_rt.block_on(async {
        let sim = Simulator::new(SimConfig::default());
        sim.start(([127, 0, 0, 1], 0).into()).await?;
        sim.write_kubeconfig(&kubeconfig)?;
        sim.populate(&Workload {
            namespaces: 5,
            pods,
            deployments: (pods / 20).max(1),
            seed: 1,
            ..Default::default()
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::Ok(sim)
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let one = rt.block_on(at_rest(&kubeconfig, 1, false))?;
    let more = rt.block_on(at_rest(&kubeconfig, many, exit))?;
    let per = (more - one) as f64 / (many - 1) as f64;
    println!(
        "kubesink heap at rest, {pods} pods + {} Deployments per cluster: 1 cluster {:.1} KiB, {many} clusters {:.1} KiB: {:.1} KiB per cluster",
        (pods / 20).max(1),
        one as f64 / 1024.0,
        more as f64 / 1024.0,
        per / 1024.0
    );
    sim.shutdown();
    Ok(())
}
