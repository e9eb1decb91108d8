//! JetStream's tail on a loaded host: the latency from a change (the simulator's
//! write, stamped in an annotation) to a JetStream consumer receiving the stored message, at
//! the plan's churn rate, with `batches_in_flight = 1` (a batch is published only once every
//! PubAck of the previous one arrived) and with the default
//! (several batches in flight), each on the host as it is ("quiet") and with one core kept
//! busy by a load generator this bench starts itself (`yes > /dev/null`, one process at the
//! default priority: what a neighbouring build or a noisy pod does), so "a loaded host" is
//! the same in every run. Each run has its own simulator, nats-server (file storage, or
//! `BENCH_JS_STORAGE`) and kubesink; the quiet runs also time the initial list into
//! JetStream (objects/s), to show that several batches in flight cost no throughput.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kubesink_bench::http::{metric_sum, request};
use kubesink_bench::procfs;
use kubesink_bench::procs::{self, spawn, Nats, Proc, Sim};
use serde_json::{json, Value};

use super::{latency_of, sink_config, Ctx, Kubesink, Latency, Plan, SinkKind};

/// One run: a window, quiet or loaded.
pub struct TailRun {
    /// `batches_in_flight` (`None`: the default).
    pub window: Option<usize>,
    /// With the load generator running during the churn.
    pub loaded: bool,
    /// Seconds from kubesink's start to every listed pod confirmed by JetStream.
    pub sync_secs: f64,
    /// Pods listed.
    pub pods: usize,
    /// Change → consumer latency during the churn.
    pub lat: Latency,
    /// kubesink's CPU seconds per 10,000 changes during the churn.
    pub cpu_per_10k: f64,
    /// Batches JetStream confirmed during the churn, per second.
    pub batches_per_sec: f64,
}

/// One core kept busy while the returned process lives (it is killed on drop): a `yes`
/// writing to /dev/null.
fn load_generator() -> anyhow::Result<Proc> {
    spawn(
        "yes (load generator)",
        Command::new("yes")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// The four runs, windows side by side: (1, quiet), (default, quiet), (default, loaded),
/// (1, loaded). Each run has its own simulator (`plan.churn_pods` pods): a simulator that
/// already churned for one run is slower in the next (its retained events), which made the
/// second run of a shared one look worse whatever it measured.
pub fn runs(ctx: &Ctx, plan: &Plan) -> anyhow::Result<Vec<TailRun>> {
    let mut out = Vec::new();
    for (window, loaded) in [
        (Some(1), false),
        (None, false),
        (None, true),
        (Some(1), true),
    ] {
        let run = out.len() + 70;
        // Its own kubeconfig file: `Sim::start` names it after the pod count, which would
        // overwrite the shared simulator's (same pod count) and point every later scenario
        // at this one once it is gone (found by the quick run in CI: "kubesink delivered 0
        // messages").
        let pods = plan.churn_pods.to_string();
        let sim = Sim::start_with(
            &ctx.bin,
            &format!("tail-{run}"),
            &["--pods", &pods, "--namespaces", "20"],
            ctx.dir.path(),
        )?;
        let r = measure(ctx, plan, &sim, window, loaded, run)?;
        eprintln!(
                "   JetStream, batches_in_flight {}, {}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} samples, {:.0} batches/s, {:.2} CPU s/10k); initial list {:.2} s",
                window.map_or("default".into(), |w| w.to_string()),
                if loaded { "one core busy" } else { "quiet" },
                r.lat.p50,
                r.lat.p99,
                r.lat.max,
                r.lat.samples,
                r.batches_per_sec,
                r.cpu_per_10k,
                r.sync_secs
            );
        out.push(r);
    }
    Ok(out)
}

/// One run: a fresh nats-server and kubesink (`batches_in_flight = window`), the initial
/// list timed, then `plan.churn_for` of churn at `plan.churn_rate` with a consumer reading
/// new messages (with the load generator when `loaded`).
pub fn measure(
    ctx: &Ctx,
    plan: &Plan,
    sim: &Sim,
    window: Option<usize>,
    loaded: bool,
    run: usize,
) -> anyhow::Result<TailRun> {
    let dir = ctx.dir.path().join(format!("nats-{run}"));
    std::fs::create_dir_all(&dir)?;
    let nats = Nats::start(&dir)?;
    let mut sink = sink_config(SinkKind::JetStream, run, Some(&nats), None);
    if let Some(w) = window {
        sink = sink.replace(
            "[sinks.stream]",
            &format!("batches_in_flight = {w}\n[sinks.stream]"),
        );
    }
    let started = Instant::now();
    let mut k = Kubesink::start(ctx, sim, &sink, false, &format!("tail-{run}"))?;
    k.wait_delivered(None, Duration::from_secs(600))?;
    let sync_secs = started.elapsed().as_secs_f64();
    let ms: Arc<Mutex<Vec<f64>>> = Arc::default();
    let m = ms.clone();
    let url = nats.url.clone();
    let consumer = ctx.rt.spawn(async move {
        use async_nats::jetstream::consumer::{pull, DeliverPolicy};
        use futures::StreamExt;
        let client = async_nats::connect(url).await?;
        let js = async_nats::jetstream::new(client);
        let stream = js.get_stream(format!("BENCH{run}")).await?;
        let consumer = stream
            .create_consumer(pull::OrderedConfig {
                deliver_policy: DeliverPolicy::New,
                ..Default::default()
            })
            .await?;
        let mut messages = consumer.messages().await?;
        while let Some(msg) = messages.next().await {
            let msg = msg?;
            let now = procs::now_micros();
            let text = String::from_utf8_lossy(&msg.payload);
            if let Some(at) = procs::stamp_of(&text) {
                if text.contains("\"op\":\"added\"") || text.contains("\"op\":\"updated\"") {
                    m.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(now.saturating_sub(at) as f64 / 1000.0);
                }
            }
        }
        anyhow::Ok(())
    });
    // The consumer subscribes before the churn starts (DeliverPolicy::New).
    std::thread::sleep(Duration::from_millis(500));
    let batches = |k: &Kubesink| {
        request(k.metrics, "GET", "/metrics")
            .map(|t| metric_sum(&t, "kubesink_sink_batches_total"))
            .unwrap_or(0.0)
    };
    let (cpu_before, batches_before) = (
        procfs::cpu_seconds(k.proc.pid()).unwrap_or(0.0),
        batches(&k),
    );
    let load = if loaded {
        Some(load_generator()?)
    } else {
        None
    };
    let churn_started = Instant::now();
    sim.churn(plan.churn_rate)?;
    std::thread::sleep(plan.churn_for);
    let applied = sim.churn_applied()?;
    let secs = churn_started.elapsed().as_secs_f64();
    sim.churn(0.0)?;
    let cpu = procfs::cpu_seconds(k.proc.pid()).unwrap_or(0.0) - cpu_before;
    let batches_per_sec = (batches(&k) - batches_before) / secs;
    drop(load);
    // What is still on its way arrives (its latency counts).
    std::thread::sleep(Duration::from_secs(1));
    consumer.abort();
    k.proc
        .check_running()
        .context("kubesink during the churn")?;
    let ms = ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(TailRun {
        window,
        loaded,
        sync_secs,
        pods: plan.churn_pods,
        lat: latency_of("NATS JetStream", &ms, applied, secs),
        cpu_per_10k: cpu / applied.max(1) as f64 * 10_000.0,
        batches_per_sec,
    })
}

fn window_label(w: Option<usize>) -> String {
    w.map_or("default (4)".into(), |w| w.to_string())
}

/// The Markdown table of the runs.
pub fn markdown(runs: &[TailRun]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nJetStream tail (change → JetStream consumer; a fresh simulator, nats-server and kubesink per run; \"one core busy\": a `yes > /dev/null` load generator during the churn):\n"
    );
    let _ = writeln!(
        s,
        "| batches_in_flight | host | changes/s | p50 ms | p99 ms | max ms | changes | kubesink CPU s / 10k changes | batches/s | initial list of {} pods (s) | objects/s |",
        runs.first().map_or(0, |r| r.pods)
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {:.0} | {:.2} | {:.0} |",
            window_label(r.window),
            if r.loaded { "one core busy" } else { "quiet" },
            r.lat.rate,
            r.lat.p50,
            r.lat.p99,
            r.lat.max,
            r.lat.samples,
            r.cpu_per_10k,
            r.batches_per_sec,
            r.sync_secs,
            r.pods as f64 / r.sync_secs.max(1e-9),
        );
    }
    s
}

/// The runs as JSON.
pub fn json(runs: &[TailRun]) -> Value {
    json!(runs
        .iter()
        .map(|r| json!({
            "batches_in_flight": r.window,
            "loaded": r.loaded,
            "changes_per_sec": r.lat.rate,
            "samples": r.lat.samples,
            "p50_ms": r.lat.p50,
            "p99_ms": r.lat.p99,
            "max_ms": r.lat.max,
            "pods": r.pods,
            "initial_list_secs": r.sync_secs,
            "kubesink_cpu_secs_per_10k_changes": r.cpu_per_10k,
            "batches_per_sec": r.batches_per_sec,
        }))
        .collect::<Vec<_>>())
}
