//! `bench-suite`: kubesink's benchmark driver (`scripts/bench.sh` builds and runs it;
//! `BENCHMARKS.md` explains every figure). Side by side, on the same simulated data:
//!
//! 1. memory: peak RSS during the initial sync and steady RSS after it, kubesink (stdout to
//!    /dev/null) vs `baseline-reflector`, per cluster size; fixed cost (0 pods), slope
//!    between the two largest sizes, idle CPU with the largest size cached; an RSS-over-time
//!    plot of the largest initial sync;
//! 2. throughput: initial-list objects/s to stdout, NATS core, NATS JetStream and Kafka,
//!    each as a ratio to `parse-floor` reading the same list;
//! 3. latency: change (the simulator's write, stamped in an annotation) → stdout line read /
//!    JetStream message consumed, at a fixed 2,000 changes/s; for JetStream (`tail.rs`) with
//!    one batch in flight and with the default, on the quiet host and with one core kept busy
//!    by a load generator the suite starts;
//! 4. CPU seconds per 10,000 changes during that churn, kubesink vs the baseline vs the floor;
//! 5. the API server's side (`lists.rs`): paged vs streaming initial lists (the simulator's
//!    CPU and memory, kubesink's peak, LIST requests, sync time) and a cold start of many
//!    namespaces with and without the request budget;
//! 6. many clusters in one process (`fleet.rs`): the same objects over 1, 10 and 50
//!    clusters, with the default list budget and without one (before/after side by side):
//!    peak and steady RSS, sync time, open fds, and an RSS-over-time plot of the cold starts;
//! 7. on a real kube-apiserver (`real.rs`, `--only real-server`, not part of the full run: it
//!    needs the control plane `scripts/kube-build.sh` builds): Pods created through the API
//!    into etcd, kubesink's sync with streaming and paged lists next to the same on the
//!    simulator, and the API server's own memory and CPU for each;
//! 8. side by side with the Go peers (`peers.rs`, `--only peers`, not part of the full run: it
//!    needs the control plane and the peers `scripts/peers-build.sh` builds): kubesink, the
//!    seed's lightweight informer as Lyft Clutch writes it and the same improved, client-go's
//!    metadata-only and full informers and an OpenTelemetry Collector with the k8sobjects
//!    receiver on the same real API server, their sync, memory and CPU, churn latency (each
//!    repeated `--runs` times, the order rotated), and what each delivers after a gap;
//! 9. the cost of a resource's CEL filter (`filters.rs`, `--only filters`): no filter, one
//!    condition, five, on the simulator;
//! 10. one huge cluster split over replicas (`shards.rs`, `--only shards`, not part of the
//!     full run: it needs the control plane): per replica of a scale-out group holding 4
//!     shards against one replica holding the whole cluster, with the API server's
//!     `ShardedListAndWatch` gate on and off: memory, CPU under churn, objects read.
//! 11. the wire encoding and list shape (`wire.rs`, `--only wire`, not part of the full run:
//!     it needs the control plane): metadata as JSON and as protobuf, whole Pods, each with a
//!     streaming list and paged lists, on a real kube-apiserver.
//! 12. Kubernetes Events beside the OpenTelemetry Collector's k8s_events receiver (`events.rs`,
//!     `--only events`, not part of the full run: it needs the control plane and the Go
//!     peers): CPU per 10,000 Events, memory, what each hands on.
//!
//! `bench-suite [--quick] [--only initial-lists|jetstream-tail|fleet|real-server|peers|http|filters|shards|wire|events [--pods N] [--runs N] [--churn-settle SECS] [--rate N]] [--out DIR] [--bin-dir DIR] [--state-size FILE]`:
//! `--only initial-lists` runs part 5 alone (`results-initial-lists-{quick,full}.*`),
//! `--only http` the HTTP sink into a local receiver, each format (`bench_suite/http.rs`,
//! `results-http-*`), `--only jetstream-tail` the JetStream runs of part 3 (`results-jetstream-tail-*`), `--only
//! fleet` part 6 (`results-fleet-{quick,full}.*` and `fleet-rss-{quick,full}.png`); `--quick` runs
//! small sizes in a minute or two (CI runs it so the driver never rots); `--out` (default
//! `docs/bench`) receives `results-{quick,full}.md`, `.json` and the plot; `--bin-dir`
//! (default: this program's directory) holds `kubesink`, `kubesink-sim`, `baseline-reflector`
//! and `parse-floor`; `--state-size` is the output of `cargo bench --bench state_size`.
//! `BENCH_JS_STORAGE=memory` gives the JetStream streams memory storage (default `file`).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kubesink_bench::http::{metric_sum, request};
use kubesink_bench::plot::{self, Series};
use kubesink_bench::procfs::{self, Sample, Sampler};
use kubesink_bench::procs::{self, free_port, spawn, Nats, Proc, Sim, Tansu};
use kubesink_bench::stats::{mean, mib, percentile};
use serde_json::{json, Value};

#[path = "bench_suite/events.rs"]
mod events;
#[path = "bench_suite/filters.rs"]
mod filters;
#[path = "bench_suite/fleet.rs"]
mod fleet;
#[path = "bench_suite/http.rs"]
mod http;
#[allow(dead_code)] // the suite starts a control plane, a part of what the tests use
#[path = "../../../../tests/support/kube_server.rs"]
mod kube_server;
#[path = "bench_suite/lists.rs"]
mod lists;
#[path = "bench_suite/peers.rs"]
mod peers;
#[path = "../../../../tests/support/ports.rs"]
mod ports;
#[path = "bench_suite/real.rs"]
mod real;
#[path = "bench_suite/shards.rs"]
mod shards;
#[path = "bench_suite/tail.rs"]
mod tail;
#[path = "bench_suite/wire.rs"]
mod wire;

/// Sizes and durations of one run.
struct Plan {
    /// Pod counts of the memory runs (the first is the fixed cost: 0).
    sizes: Vec<usize>,
    /// How long steady RSS is observed after the initial sync.
    steady: Duration,
    /// CPU observation with the largest size cached and no changes.
    idle: Duration,
    /// Pods in the latency and CPU-per-change runs.
    churn_pods: usize,
    /// Changes per second of the latency and CPU-per-change runs.
    churn_rate: f64,
    /// How long each churn run lasts.
    churn_for: Duration,
    /// Pods of the paged-vs-streaming comparison.
    list_pods: usize,
    /// Namespaces of the cold start (× 4 resources).
    cold_namespaces: usize,
    /// Cluster counts of the fleet scenario (the first: the single cluster).
    fleet_sizes: Vec<usize>,
    /// Pods of the fleet scenario in all, whatever the split.
    fleet_pods: usize,
    /// Quiet time after each fleet sync (steady RSS: its second half).
    fleet_steady: Duration,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                sizes: vec![0, 1_000, 5_000],
                steady: Duration::from_secs(3),
                idle: Duration::from_secs(5),
                churn_pods: 1_000,
                churn_rate: 2_000.0,
                churn_for: Duration::from_secs(5),
                list_pods: 5_000,
                cold_namespaces: 60,
                fleet_sizes: vec![1, 5, 10],
                fleet_pods: 1_000,
                fleet_steady: Duration::from_secs(2),
            }
        } else {
            Plan {
                sizes: vec![0, 1_000, 10_000, 100_000],
                steady: Duration::from_secs(10),
                idle: Duration::from_secs(60),
                churn_pods: 10_000,
                churn_rate: 2_000.0,
                churn_for: Duration::from_secs(30),
                list_pods: 100_000,
                cold_namespaces: 1_500,
                fleet_sizes: vec![1, 10, 50],
                fleet_pods: 100_000,
                fleet_steady: Duration::from_secs(10),
            }
        }
    }
}

struct Ctx {
    bin: PathBuf,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

/// kubesink's destination in one run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SinkKind {
    Stdout,
    NatsCore,
    JetStream,
    Kafka,
}

impl SinkKind {
    fn label(self) -> &'static str {
        match self {
            SinkKind::Stdout => "stdout",
            SinkKind::NatsCore => "NATS core",
            SinkKind::JetStream => "NATS JetStream",
            SinkKind::Kafka => "Kafka (tansu)",
        }
    }
}

/// A running `kubesink run` and the address of its `/metrics`.
struct Kubesink {
    proc: Proc,
    metrics: std::net::SocketAddr,
}

impl Kubesink {
    /// Starts kubesink following every pod of `sim` into `sink` (TOML of one `[[sinks]]`
    /// entry); stdout piped when `pipe`, else /dev/null.
    fn start(ctx: &Ctx, sim: &Sim, sink: &str, pipe: bool, run: &str) -> anyhow::Result<Self> {
        let body = format!("[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n\n{sink}\n");
        Kubesink::start_config(ctx, sim, &body, pipe, run)
    }

    /// Starts kubesink on `sim` with `body` after the `[cluster]` table (resources, sinks,
    /// other sections); stdout piped when `pipe`, else /dev/null.
    fn start_config(
        ctx: &Ctx,
        sim: &Sim,
        body: &str,
        pipe: bool,
        run: &str,
    ) -> anyhow::Result<Self> {
        let text = format!(
            "[cluster]\nname = \"bench\"\nkubeconfig = {:?}\n\n{body}",
            sim.kubeconfig.display().to_string()
        );
        Kubesink::start_text(ctx, &text, pipe, run)
    }

    /// Starts kubesink with the whole configuration `text` (clusters included); stdout piped
    /// when `pipe`, else /dev/null.
    fn start_text(ctx: &Ctx, text: &str, pipe: bool, run: &str) -> anyhow::Result<Self> {
        let stdout = if pipe { Stdio::piped() } else { Stdio::null() };
        Kubesink::start_text_to(ctx, text, stdout, run)
    }

    /// Starts kubesink with the whole configuration `text`, its stdout to `stdout`.
    fn start_text_to(ctx: &Ctx, text: &str, stdout: Stdio, run: &str) -> anyhow::Result<Self> {
        Kubesink::start_text_logged(ctx, text, stdout, run, "warn")
    }

    /// [`Kubesink::start_text_to`] with `RUST_LOG` = `filter` (its log: `kubesink-{run}.log`
    /// in the suite's directory).
    fn start_text_logged(
        ctx: &Ctx,
        text: &str,
        stdout: Stdio,
        run: &str,
        filter: &str,
    ) -> anyhow::Result<Self> {
        let config = ctx.dir.path().join(format!("kubesink-{run}.toml"));
        std::fs::write(&config, text)?;
        let port = free_port()?;
        let log = std::fs::File::create(ctx.dir.path().join(format!("kubesink-{run}.log")))?;
        let mut cmd = Command::new(ctx.bin.join("kubesink"));
        for (k, _) in std::env::vars() {
            if k.starts_with("KUBESINK_") {
                cmd.env_remove(k);
            }
        }
        let proc = spawn(
            "kubesink",
            cmd.env("KUBESINK_SERVER__LISTEN", format!("127.0.0.1:{port}"))
                .env("RUST_LOG", filter)
                .args(["run", "--config"])
                .arg(&config)
                .stdout(stdout)
                .stderr(log),
        )?;
        Ok(Kubesink {
            proc,
            metrics: ([127, 0, 0, 1], port).into(),
        })
    }

    /// Whether the initial sync is done and everything listed was delivered: `kubesink_synced`
    /// is 1 and the sink confirmed at least as many messages as the informer holds objects
    /// (`kubesink_objects`; the population changes under churn).
    fn synced(&self) -> bool {
        request(self.metrics, "GET", "/metrics").is_ok_and(|t| {
            metric_sum(&t, "kubesink_synced") >= 1.0
                && metric_sum(&t, "kubesink_sink_delivered_messages_total")
                    >= metric_sum(&t, "kubesink_objects")
        })
    }

    /// Messages its sink confirmed (0 until `/metrics` answers).
    fn delivered(&self) -> f64 {
        request(self.metrics, "GET", "/metrics")
            .map(|t| metric_sum(&t, "kubesink_sink_delivered_messages_total"))
            .unwrap_or(0.0)
    }

    /// Waits until its sink confirmed `n` messages (`None`: until [`Kubesink::synced`]).
    fn wait_delivered(&mut self, n: Option<usize>, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let done = match n {
                Some(n) => self.delivered() >= n as f64,
                None => self.synced(),
            };
            if done {
                return Ok(());
            }
            self.proc.check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "kubesink delivered {} messages, not done within {within:?}",
                    self.delivered()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// A directory of tools a build script makes: `$env_var` when set, else what `script` (found
/// above the working directory, e.g. `scripts/peers-build.sh`) prints, building when needed.
fn built_dir(env_var: &str, script: &str) -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os(env_var) {
        return Ok(PathBuf::from(d));
    }
    let path = std::env::current_dir()?
        .ancestors()
        .map(|d| d.join(script))
        .find(|p| p.exists())
        .with_context(|| {
            format!("{script} not found above the working directory (or set {env_var})")
        })?;
    let out = Command::new(&path)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", path.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// What [`churn_window`] measured.
struct ChurnWindow {
    /// Changes the simulator applied (at least 1), and the seconds they took.
    applied: u64,
    secs: f64,
    /// CPU seconds per 10,000 changes of each process asked for, in order.
    cpu_per_10k: Vec<f64>,
    /// The latency samples collected during the window.
    samples: Vec<f64>,
}

/// A churn window on `sim`: `ms` cleared after half a second of quiet, the plan's rate for
/// its time, then 2 s to drain; the CPU each of `pids` spent per 10,000 changes (0 for a
/// process that is gone).
fn churn_window(
    plan: &Plan,
    sim: &Sim,
    pids: &[u32],
    ms: &Arc<Mutex<Vec<f64>>>,
) -> anyhow::Result<ChurnWindow> {
    std::thread::sleep(Duration::from_millis(500));
    ms.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let cpu = |pid: u32| procfs::cpu_seconds(pid).unwrap_or(0.0);
    let before: Vec<f64> = pids.iter().map(|p| cpu(*p)).collect();
    let started = Instant::now();
    sim.churn(plan.churn_rate)?;
    std::thread::sleep(plan.churn_for);
    let applied = sim.churn_applied()?.max(1);
    let secs = started.elapsed().as_secs_f64();
    sim.churn(0.0)?;
    std::thread::sleep(Duration::from_secs(2));
    let cpu_per_10k = pids
        .iter()
        .zip(before)
        .map(|(p, c0)| (cpu(*p) - c0) / applied as f64 * 10_000.0)
        .collect();
    let samples = ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(ChurnWindow {
        applied,
        secs,
        cpu_per_10k,
        samples,
    })
}

/// Collects a child's output lines on a thread: `synced N` / `listed N` status lines.
fn watch_lines(reader: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            l.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    });
    lines
}

fn wait_line(
    proc: &mut Proc,
    lines: &Mutex<Vec<String>>,
    prefix: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|l| l.starts_with(prefix))
        {
            return Ok(());
        }
        if let Err(e) = proc.check_running() {
            let lines = lines.lock().unwrap_or_else(|p| p.into_inner());
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            bail!("{e}; its last stderr lines:\n{tail}");
        }
        if Instant::now() > deadline {
            bail!("{} printed no {prefix:?} within {within:?}", proc.name);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn baseline(ctx: &Ctx, sim: &Sim) -> anyhow::Result<(Proc, Arc<Mutex<Vec<String>>>)> {
    let mut p = spawn(
        "baseline-reflector",
        Command::new(ctx.bin.join("baseline-reflector"))
            .env("KUBECONFIG", &sim.kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    )?;
    let lines = watch_lines(p.take_stdout().context("stdout")?);
    Ok((p, lines))
}

fn floor(ctx: &Ctx, sim: &Sim) -> anyhow::Result<(Proc, Arc<Mutex<Vec<String>>>)> {
    let mut p = spawn(
        "parse-floor",
        Command::new(ctx.bin.join("parse-floor"))
            .env("KUBECONFIG", &sim.kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )?;
    let lines = watch_lines(p.take_stderr().context("stderr")?);
    Ok((p, lines))
}

/// One program's memory over an initial sync and the quiet time after it.
#[derive(Clone, Default)]
struct MemRun {
    pods: usize,
    sync_secs: f64,
    peak: u64,
    steady: u64,
    idle_cpu_pct: Option<f64>,
    samples: Vec<Sample>,
}

/// Samples `proc` from its start until `synced` returns, then for `after` (CPU measured over
/// that time when `idle`).
fn observe(
    mut proc: Proc,
    pods: usize,
    after: Duration,
    idle: bool,
    mut synced: impl FnMut(&mut Proc) -> anyhow::Result<bool>,
) -> anyhow::Result<MemRun> {
    let sampler = Sampler::start(proc.pid(), Duration::from_millis(50));
    let deadline = Instant::now() + Duration::from_secs(1800);
    while !synced(&mut proc)? {
        if Instant::now() > deadline {
            bail!("{} did not sync {pods} pods within 30 min", proc.name);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let sync_secs = sampler.elapsed();
    let cpu0 = procfs::cpu_seconds(proc.pid()).unwrap_or(0.0);
    std::thread::sleep(after);
    let cpu1 = procfs::cpu_seconds(proc.pid()).unwrap_or(0.0);
    let mem = procfs::memory(proc.pid()).context("process gone")?;
    let samples = sampler.stop();
    // Steady: the mean of the second half of the quiet time.
    let from = sync_secs + after.as_secs_f64() / 2.0;
    let tail: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= from)
        .map(|s| s.rss as f64)
        .collect();
    Ok(MemRun {
        pods,
        sync_secs,
        peak: mem.hwm,
        steady: mean(&tail).unwrap_or(mem.rss as f64) as u64,
        idle_cpu_pct: idle.then(|| (cpu1 - cpu0) / after.as_secs_f64() * 100.0),
        samples,
    })
}

fn stdout_sink() -> String {
    "[[sinks]]\ntype = \"stdout\"\n".into()
}

fn memory_runs(ctx: &Ctx, plan: &Plan) -> anyhow::Result<Vec<(MemRun, MemRun)>> {
    let mut out = Vec::new();
    let largest = plan.sizes.iter().copied().max().unwrap_or(0);
    for &pods in &plan.sizes {
        eprintln!("== memory: {pods} pods");
        let sim = Sim::start(&ctx.bin, pods, ctx.dir.path())?;
        let idle = pods == largest;
        let after = if idle { plan.idle } else { plan.steady };
        let k = Kubesink::start(ctx, &sim, &stdout_sink(), false, &format!("mem-{pods}"))?;
        let metrics = k.metrics;
        let ks = observe(k.proc, pods, after, idle, |p| {
            p.check_running()?;
            let Ok(text) = request(metrics, "GET", "/metrics") else {
                return Ok(false);
            };
            Ok(metric_sum(&text, "kubesink_synced") >= 1.0
                && metric_sum(&text, "kubesink_sink_delivered_messages_total") >= pods as f64)
        })?;
        eprintln!(
            "   kubesink: sync {:.1} s, peak {:.1} MiB, steady {:.1} MiB",
            ks.sync_secs,
            mib(ks.peak),
            mib(ks.steady)
        );
        let (b, lines) = baseline(ctx, &sim)?;
        let bs = observe(b, pods, plan.steady, false, |p| {
            p.check_running()?;
            Ok(lines
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|l| l.starts_with("synced")))
        })?;
        eprintln!(
            "   baseline: sync {:.1} s, peak {:.1} MiB, steady {:.1} MiB",
            bs.sync_secs,
            mib(bs.peak),
            mib(bs.steady)
        );
        drop(sim);
        out.push((ks, bs));
    }
    Ok(out)
}

/// Objects/s and objects per CPU second of one initial list.
#[derive(Clone, Copy, Default)]
struct Rate {
    per_sec: f64,
    per_cpu_sec: f64,
}

fn rate(n: usize, started: Instant, pid: u32) -> Rate {
    let secs = started.elapsed().as_secs_f64();
    let cpu = procfs::cpu_seconds(pid).unwrap_or(f64::NAN);
    Rate {
        per_sec: n as f64 / secs,
        per_cpu_sec: n as f64 / cpu,
    }
}

/// Mean size of a pod as served (bytes of JSON).
fn mean_object_bytes(sim: &Sim) -> anyhow::Result<f64> {
    let page = request(sim.addr, "GET", "/api/v1/pods?limit=200")?;
    let v: Value = serde_json::from_str(&page)?;
    let items = v["items"].as_array().context("no items")?;
    let sizes: Vec<f64> = items
        .iter()
        .map(|i| serde_json::to_vec(i).map_or(0.0, |b| b.len() as f64))
        .collect();
    mean(&sizes).context("no pods")
}

fn sink_config(kind: SinkKind, run: usize, nats: Option<&Nats>, kafka: Option<&Tansu>) -> String {
    match kind {
        SinkKind::Stdout => stdout_sink(),
        SinkKind::NatsCore => format!(
            "[[sinks]]\ntype = \"nats\"\nservers = [{:?}]\nmode = \"core\"\nsubject = \"bench{run}.{{namespace}}.{{name}}\"\n",
            nats.map_or("", |n| n.url.as_str())
        ),
        SinkKind::JetStream => format!(
            "[[sinks]]\ntype = \"nats\"\nservers = [{:?}]\nmode = \"jetstream\"\nsubject = \"bench{run}.{{namespace}}.{{name}}\"\n[sinks.stream]\nname = \"BENCH{run}\"\ncreate = true\nmax_msgs_per_subject = 1\nstorage = {:?}\n",
            nats.map_or("", |n| n.url.as_str()),
            std::env::var("BENCH_JS_STORAGE").unwrap_or_else(|_| "file".into())
        ),
        SinkKind::Kafka => format!(
            "[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = {:?}\ntopic = \"bench{run}\"\ncompression = \"lz4\"\nacks = \"all\"\nidempotence = true\n",
            kafka.map_or("", |k| k.bootstrap.as_str())
        ),
    }
}

fn create_topic(ctx: &Ctx, bootstrap: &str, topic: &str) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    ctx.rt.block_on(async {
        let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()?;
        let res = admin
            .create_topics(
                &[NewTopic::new(topic, 6, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await?;
        for r in res {
            r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
        }
        Ok(())
    })
}

struct Throughput {
    pods: usize,
    mean_bytes: f64,
    floor: Rate,
    sinks: Vec<(SinkKind, Option<Rate>, String)>,
}

fn throughput_runs(ctx: &Ctx, pods: usize) -> anyhow::Result<Throughput> {
    eprintln!("== throughput: initial list of {pods} pods");
    let sim = Sim::start(&ctx.bin, pods, ctx.dir.path())?;
    let mean_bytes = mean_object_bytes(&sim)?;
    eprintln!("   mean pod {mean_bytes:.0} bytes of JSON");
    let (mut f, lines) = floor(ctx, &sim)?;
    let started = Instant::now();
    wait_line(&mut f, &lines, "listed", Duration::from_secs(1800))?;
    let floor_rate = rate(pods, started, f.pid());
    drop(f);
    eprintln!(
        "   parse-floor: {:.0}/s, {:.0}/CPU s",
        floor_rate.per_sec, floor_rate.per_cpu_sec
    );
    let nats = Nats::start(ctx.dir.path())?;
    let kafka = if procs::tansu_bin().exists() {
        Some(Tansu::start(ctx.dir.path())?)
    } else {
        None
    };
    let mut sinks = Vec::new();
    for (run, kind) in [
        SinkKind::Stdout,
        SinkKind::NatsCore,
        SinkKind::JetStream,
        SinkKind::Kafka,
    ]
    .into_iter()
    .enumerate()
    {
        if kind == SinkKind::Kafka {
            match &kafka {
                Some(k) => create_topic(ctx, &k.bootstrap, &format!("bench{run}"))?,
                None => {
                    sinks.push((
                        kind,
                        None,
                        format!("skipped: no tansu at {}", procs::tansu_bin().display()),
                    ));
                    continue;
                }
            }
        }
        let config = sink_config(kind, run, Some(&nats), kafka.as_ref());
        let started = Instant::now();
        let mut k = Kubesink::start(ctx, &sim, &config, false, &format!("tp-{run}"))?;
        let note = match k.wait_delivered(Some(pods), Duration::from_secs(1800)) {
            Ok(()) => {
                let r = rate(pods, started, k.proc.pid());
                eprintln!(
                    "   {}: {:.0}/s ({:.2}x), {:.0}/CPU s ({:.2}x)",
                    kind.label(),
                    r.per_sec,
                    r.per_sec / floor_rate.per_sec,
                    r.per_cpu_sec,
                    r.per_cpu_sec / floor_rate.per_cpu_sec
                );
                sinks.push((kind, Some(r), String::new()));
                continue;
            }
            Err(e) => format!("failed: {e:#}"),
        };
        eprintln!("   {}: {note}", kind.label());
        sinks.push((kind, None, note));
    }
    Ok(Throughput {
        pods,
        mean_bytes,
        floor: floor_rate,
        sinks,
    })
}

#[derive(Default, Clone)]
struct Latency {
    label: &'static str,
    rate: f64,
    samples: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

fn latency_of(label: &'static str, ms: &[f64], applied: u64, secs: f64) -> Latency {
    Latency {
        label,
        rate: applied as f64 / secs,
        samples: ms.len(),
        p50: percentile(ms, 50.0).unwrap_or(f64::NAN),
        p99: percentile(ms, 99.0).unwrap_or(f64::NAN),
        max: percentile(ms, 100.0).unwrap_or(f64::NAN),
    }
}

/// Reads `out` line by line on a thread; for every added/updated object with a stamp, the
/// milliseconds from the stamp to the line's arrival go into the returned list.
fn collect_latency(out: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<f64>>> {
    let ms: Arc<Mutex<Vec<f64>>> = Arc::default();
    let m = ms.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let now = procs::now_micros();
            if let Some(at) = procs::stamp_of(&line) {
                // kubesink's `op`, or the watch event's `type` (parse-floor).
                if [
                    "\"op\":\"added\"",
                    "\"op\":\"updated\"",
                    "\"type\":\"ADDED\"",
                    "\"type\":\"MODIFIED\"",
                ]
                .iter()
                .any(|op| line.contains(op))
                {
                    m.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(now.saturating_sub(at) as f64 / 1000.0);
                }
            }
        }
    });
    ms
}

/// Latency from the stamped change to the line kubesink writes on stdout, and, side by side
/// on the same watch, to the line parse-floor writes (what the simulator and the machine
/// add by themselves).
fn latency_stdout(ctx: &Ctx, plan: &Plan, sim: &Sim) -> anyhow::Result<[Latency; 2]> {
    let mut k = Kubesink::start(ctx, sim, &stdout_sink(), true, "lat-stdout")?;
    let ms = collect_latency(k.proc.take_stdout().context("stdout")?);
    let mut f = spawn(
        "parse-floor",
        Command::new(ctx.bin.join("parse-floor"))
            .env("KUBECONFIG", &sim.kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )?;
    let floor_ms = collect_latency(f.take_stdout().context("stdout")?);
    let floor_lines = watch_lines(f.take_stderr().context("stderr")?);
    k.wait_delivered(None, Duration::from_secs(600))?;
    wait_line(&mut f, &floor_lines, "listed", Duration::from_secs(600))?;
    let started = Instant::now();
    sim.churn(plan.churn_rate)?;
    std::thread::sleep(plan.churn_for);
    let applied = sim.churn_applied()?;
    let secs = started.elapsed().as_secs_f64();
    sim.churn(0.0)?;
    std::thread::sleep(Duration::from_secs(1));
    let ms = ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let floor_ms = floor_ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok([
        latency_of("stdout", &ms, applied, secs),
        latency_of(
            "parse-floor (same watch, control)",
            &floor_ms,
            applied,
            secs,
        ),
    ])
}

/// CPU seconds per 10,000 changes during churn, for each program following the same churn.
fn cpu_per_change(ctx: &Ctx, plan: &Plan, sim: &Sim) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let mut k = Kubesink::start(ctx, sim, &stdout_sink(), false, "cpu")?;
    let (mut b, bl) = baseline(ctx, sim)?;
    let (mut f, fl) = floor(ctx, sim)?;
    k.wait_delivered(None, Duration::from_secs(600))?;
    wait_line(&mut b, &bl, "synced", Duration::from_secs(600))?;
    wait_line(&mut f, &fl, "listed", Duration::from_secs(600))?;
    std::thread::sleep(Duration::from_secs(1));
    let pids = [
        ("kubesink", k.proc.pid()),
        ("baseline-reflector", b.pid()),
        ("parse-floor", f.pid()),
    ];
    let before: Vec<f64> = pids
        .iter()
        .map(|(_, p)| procfs::cpu_seconds(*p).unwrap_or(0.0))
        .collect();
    sim.churn(plan.churn_rate)?;
    std::thread::sleep(plan.churn_for);
    let applied = sim.churn_applied()?.max(1);
    sim.churn(0.0)?;
    std::thread::sleep(Duration::from_secs(2));
    Ok(pids
        .iter()
        .zip(before)
        .map(|((name, pid), b)| {
            let used = procfs::cpu_seconds(*pid).unwrap_or(0.0) - b;
            (*name, used / applied as f64 * 10_000.0)
        })
        .collect())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "{cores} cores, {cpu}; load average at the end {}",
        load.join(" ")
    )
}

/// The benchmark suite's driver (BENCHMARKS.md): starts the simulator, kubesink, the
/// baseline reflector and the parse floor side by side and writes the tables and the plot.
#[derive(clap::Parser)]
#[command(name = "bench-suite")]
struct Args {
    /// Small sizes and short windows (a few minutes; what CI runs so the driver never rots).
    #[arg(long)]
    quick: bool,
    /// Where the results (`results-*.md`, `.json`, the PNG) are written.
    #[arg(long, default_value = "docs/bench")]
    out: PathBuf,
    /// Directory of the binaries (`kubesink`, `kubesink-sim`, `baseline-reflector`,
    /// `parse-floor`). Default: this program's own directory.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Output of `cargo bench --bench state_size`, to report the informer state per object.
    #[arg(long)]
    state_size: Option<PathBuf>,
    /// Run one part alone: `initial-lists` (paged vs streaming lists, the cold start),
    /// `jetstream-tail` (change → JetStream latency with one batch in flight and with the
    /// default, on a quiet host and with one core busy) or `fleet` (many clusters in one
    /// process, with and without the list budget).
    /// `real-server` (Pods created on a real kube-apiserver, synced with streaming and
    /// paged lists, next to the simulator).
    /// `peers` (kubesink beside client-go's informers, the seed's technique as written and
    /// improved among them, on a real kube-apiserver: sync, memory, CPU, churn latency, and
    /// what each delivers after a gap).
    /// `http` (the HTTP sink into a local CloudEvents receiver: initial list, latency and CPU
    /// per change, each format).
    /// `wire` (metadata as JSON and as protobuf, whole Pods, each with a streaming list and
    /// paged lists, on a real kube-apiserver: its CPU and kubesink's, three rounds rotated).
    /// `events` (Kubernetes Events beside the OpenTelemetry Collector's k8s_events receiver on
    /// a real kube-apiserver: CPU per 10,000 Events, memory, what each hands on).
    #[arg(long, value_parser = ["initial-lists", "jetstream-tail", "fleet", "real-server", "peers", "http", "filters", "shards", "wire", "events"])]
    only: Option<String>,
    /// With `--only peers`: the number of Pods (default 100,000; 1,000 with `--quick`); the
    /// gap deletes and creates 1% of them (at least 10). The results file names the count
    /// when it is not the default (`results-peers-10000.md`). With `--only wire`: the number
    /// of Pods (default 20,000; 1,000 with `--quick`).
    #[arg(long, requires = "only")]
    pods: Option<usize>,
    /// With `--only peers`: how many times the sync and the churn are measured, the
    /// programs' order rotated each run (run k starts at the k-th program); the tables show
    /// each figure's median and min–max, the JSON every run (default 3; 1 with `--quick`).
    /// The gap is measured once.
    #[arg(long, requires = "only", value_parser = clap::value_parser!(u64).range(1..))]
    runs: Option<u64>,
    /// With `--only peers`: seconds of quiet between a program's sync and its churn, so that
    /// the churn is not measured in the wake of the sync's CPU burst (default 20; 5 with
    /// `--quick`).
    #[arg(long, requires = "only")]
    churn_settle: Option<u64>,
    /// With `--only events`: Events written per second (default 400; 100 with `--quick`),
    /// for 30 s (5 s with `--quick`).
    #[arg(long, requires = "only")]
    rate: Option<f64>,
}

fn main() -> anyhow::Result<()> {
    let Args {
        quick,
        out,
        bin_dir: bin,
        state_size,
        only,
        pods: peer_pods,
        runs: peer_runs,
        churn_settle,
        rate,
    } = <Args as clap::Parser>::parse();
    let bin = match bin {
        Some(b) => b,
        None => std::env::current_exe()?
            .parent()
            .context("no directory")?
            .to_path_buf(),
    };
    for b in [
        "kubesink",
        "kubesink-sim",
        "baseline-reflector",
        "parse-floor",
    ] {
        if !bin.join(b).exists() {
            bail!("{} is missing: build with `cargo build --release --workspace --bins` (scripts/bench.sh does)", bin.join(b).display());
        }
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let plan = Plan::new(quick);
    let ctx = Ctx {
        bin,
        dir: tempfile::tempdir()?,
        rt: tokio::runtime::Runtime::new()?,
    };
    let started = Instant::now();
    let mode = if quick { "quick" } else { "full" };

    if only.as_deref() == Some("jetstream-tail") {
        eprintln!(
            "== JetStream tail: {} pods, {} changes/s, quiet and with one core busy",
            plan.churn_pods, plan.churn_rate
        );
        let runs = tail::runs(&ctx, &plan)?;
        let md = format!(
            "<!-- written by bench-suite --only jetstream-tail ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            tail::markdown(&runs)
        );
        std::fs::write(out.join(format!("results-jetstream-tail-{mode}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-jetstream-tail-{mode}.json")),
            serde_json::to_string_pretty(&tail::json(&runs))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }
    if only.as_deref() == Some("filters") {
        eprintln!(
            "== filters (CEL): {} pods, {} changes/s, no filter, a resource filter of 1 and 5 conditions, two routes",
            plan.churn_pods, plan.churn_rate
        );
        let runs = filters::runs(&ctx, &plan)?;
        let md = format!(
            "<!-- written by bench-suite --only filters ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            filters::markdown(&runs)
        );
        std::fs::write(out.join(format!("results-filters-{mode}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-filters-{mode}.json")),
            serde_json::to_string_pretty(&filters::json(&runs))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }
    if only.as_deref() == Some("http") {
        eprintln!(
            "== HTTP sink: {} pods, {} changes/s, each format into a local receiver",
            plan.churn_pods, plan.churn_rate
        );
        let runs = http::runs(&ctx, &plan)?;
        let md = format!(
            "<!-- written by bench-suite --only http ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            http::markdown(&runs)
        );
        std::fs::write(out.join(format!("results-http-{mode}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-http-{mode}.json")),
            serde_json::to_string_pretty(&http::json(&runs))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }
    if only.as_deref() == Some("peers") {
        let (pods, gap) = match (peer_pods, quick) {
            (Some(n), _) => (n, (n / 100).max(10)),
            (None, true) => (1_000, 100),
            (None, false) => (100_000, 1_000),
        };
        let name = match peer_pods {
            Some(n) => format!("{n}"),
            None => mode.to_owned(),
        };
        let (settle, steady) = if quick {
            (Duration::from_secs(2), Duration::from_secs(3))
        } else {
            (Duration::from_secs(15), Duration::from_secs(30))
        };
        let churn_secs = if quick { 3.0 } else { 30.0 };
        let churn_settle = Duration::from_secs(churn_settle.unwrap_or(if quick { 5 } else { 20 }));
        let runs = peer_runs.unwrap_or(if quick { 1 } else { 3 });
        let partial = |ext: &str| out.join(format!("results-peers-{name}.partial.{ext}"));
        let checkpoint = |r: &peers::Report| -> anyhow::Result<()> {
            std::fs::write(partial("md"), peers::markdown(r))?;
            std::fs::write(
                partial("json"),
                serde_json::to_string_pretty(&peers::json(r))?,
            )?;
            Ok(())
        };
        let report = peers::run(
            &ctx,
            pods,
            gap,
            settle,
            steady,
            churn_secs,
            churn_settle,
            usize::try_from(runs).context("--runs")?,
            &checkpoint,
        )?;
        for ext in ["md", "json"] {
            std::fs::remove_file(partial(ext))?;
        }
        peers::plot(&out.join(format!("peers-rss-{name}.png")), &report)?;
        let md = format!(
            "<!-- written by bench-suite --only peers ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            peers::markdown(&report)
        );
        std::fs::write(out.join(format!("results-peers-{name}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-peers-{name}.json")),
            serde_json::to_string_pretty(&peers::json(&report))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }
    if only.as_deref() == Some("events") {
        let rate = rate.unwrap_or(if quick { 100.0 } else { 400.0 });
        let secs = if quick { 5.0 } else { 30.0 };
        let runs = peer_runs.unwrap_or(if quick { 1 } else { 3 });
        let report = events::run(&ctx, rate, secs, usize::try_from(runs).context("--runs")?)?;
        let md = format!(
            "<!-- written by bench-suite --only events ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            events::markdown(&report)
        );
        std::fs::write(out.join(format!("results-events-{mode}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-events-{mode}.json")),
            serde_json::to_string_pretty(&events::json(&report))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }
    if only.as_deref() == Some("wire") {
        let pods = peer_pods.unwrap_or(if quick { 1_000 } else { 20_000 });
        let (rounds, settle, steady) = if quick {
            (1, Duration::from_secs(2), Duration::from_secs(2))
        } else {
            (3, Duration::from_secs(15), Duration::from_secs(10))
        };
        let report = wire::run(&ctx, pods, rounds, settle, steady)?;
        let name = if quick {
            "quick".to_owned()
        } else {
            pods.to_string()
        };
        let md = format!(
            "<!-- written by bench-suite --only wire ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            wire::markdown(&report)
        );
        std::fs::write(out.join(format!("results-wire-{name}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-wire-{name}.json")),
            serde_json::to_string_pretty(&wire::json(&report))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }
    if only.as_deref() == Some("real-server") {
        let pods = if quick { 2_000 } else { 100_000 };
        let (settle, steady) = if quick {
            (Duration::from_secs(2), Duration::from_secs(3))
        } else {
            (Duration::from_secs(15), Duration::from_secs(10))
        };
        let report = real::run(&ctx, pods, settle, steady)?;
        let md = format!(
            "<!-- written by bench-suite --only real-server ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            real::markdown(&report)
        );
        std::fs::write(out.join(format!("results-real-server-{mode}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-real-server-{mode}.json")),
            serde_json::to_string_pretty(&real::json(&report))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }
    if only.as_deref() == Some("shards") {
        let (pods, patches) = if quick {
            (2_000, 500)
        } else {
            (40_000, 10_000)
        };
        let report = shards::run(&ctx, pods, patches)?;
        let md = format!(
            "<!-- written by bench-suite --only shards ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            shards::markdown(&report)
        );
        std::fs::write(out.join(format!("results-shards-{mode}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-shards-{mode}.json")),
            serde_json::to_string_pretty(&shards::json(&report))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }
    if only.as_deref() == Some("fleet") {
        let runs = fleet::runs(&ctx, &plan.fleet_sizes, plan.fleet_pods, plan.fleet_steady)?;
        let plot_path = out.join(format!("fleet-rss-{mode}.png"));
        fleet::plot(&plot_path, &runs)?;
        let md = format!(
            "<!-- written by bench-suite --only fleet ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            fleet::markdown(&runs)
        );
        std::fs::write(out.join(format!("results-fleet-{mode}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-fleet-{mode}.json")),
            serde_json::to_string_pretty(&fleet::json(&runs))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        eprintln!("wrote {}", plot_path.display());
        return Ok(());
    }
    if only.is_some() {
        let lists = lists::list_vs_stream(&ctx, plan.list_pods)?;
        let cold = lists::cold_starts(&ctx, plan.cold_namespaces)?;
        let md = format!(
            "<!-- written by bench-suite --only initial-lists ({mode} mode); do not edit -->\nMachine: {}. ({:.0} s)\n{}",
            machine(),
            started.elapsed().as_secs_f64(),
            lists::markdown(&lists, &cold)
        );
        std::fs::write(out.join(format!("results-initial-lists-{mode}.md")), &md)?;
        std::fs::write(
            out.join(format!("results-initial-lists-{mode}.json")),
            serde_json::to_string_pretty(&lists::json(&lists, &cold))?,
        )?;
        std::io::stdout().write_all(md.as_bytes())?;
        return Ok(());
    }

    let mem = memory_runs(&ctx, &plan)?;
    let largest = plan.sizes.iter().copied().max().unwrap_or(0);
    let tp = throughput_runs(&ctx, largest.max(5_000))?;
    eprintln!(
        "== latency and CPU per change: {} pods, {} changes/s",
        plan.churn_pods, plan.churn_rate
    );
    let sim = Sim::start(&ctx.bin, plan.churn_pods, ctx.dir.path())?;
    let [lat_stdout, lat_floor] = latency_stdout(&ctx, &plan, &sim)?;
    let tail = tail::runs(&ctx, &plan)?;
    // Row "latency, JetStream": the default window on the quiet host.
    let lat_js = tail
        .iter()
        .find(|r| r.window.is_none() && !r.loaded)
        .map(|r| r.lat.clone())
        .unwrap_or_default();
    for l in [&lat_stdout, &lat_floor, &lat_js] {
        eprintln!(
            "   {}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} samples, {:.0} changes/s)",
            l.label, l.p50, l.p99, l.max, l.samples, l.rate
        );
    }
    let cpu = cpu_per_change(&ctx, &plan, &sim)?;
    drop(sim);
    let initial_lists = lists::list_vs_stream(&ctx, plan.list_pods)?;
    let cold = lists::cold_starts(&ctx, plan.cold_namespaces)?;
    let fleet_runs = fleet::runs(&ctx, &plan.fleet_sizes, plan.fleet_pods, plan.fleet_steady)?;
    fleet::plot(&out.join(format!("fleet-rss-{mode}.png")), &fleet_runs)?;

    let state = state_size
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| {
            t.lines()
                .find(|l| l.contains("bytes/object"))
                .map(str::to_owned)
        });
    let plot_path = out.join(format!("initial-sync-rss-{mode}.png"));
    if let Some((k, b)) = mem.last() {
        plot::rss_over_time(
            &plot_path,
            &format!("RSS during the initial sync of {} pods", k.pods),
            &[
                Series {
                    label: "kubesink (stdout sink)",
                    samples: &k.samples,
                    color: plotters::style::RGBColor(31, 119, 180),
                },
                Series {
                    label: "kube-runtime reflector, full Pod",
                    samples: &b.samples,
                    color: plotters::style::RGBColor(214, 39, 40),
                },
            ],
        )?;
    }
    let report = Report {
        mode,
        plan: &plan,
        mem: &mem,
        tp: &tp,
        lat: [&lat_stdout, &lat_js, &lat_floor],
        cpu: &cpu,
        lists: &initial_lists,
        cold: &cold,
        tail: &tail,
        fleet: &fleet_runs,
        state,
        elapsed: started.elapsed(),
    };
    let md = report.markdown();
    std::fs::write(out.join(format!("results-{mode}.md")), &md)?;
    std::fs::write(
        out.join(format!("results-{mode}.json")),
        serde_json::to_string_pretty(&report.json())?,
    )?;
    std::io::stdout().write_all(md.as_bytes())?;
    eprintln!(
        "wrote {}/results-{mode}.md, .json and {}",
        out.display(),
        plot_path.display()
    );
    Ok(())
}

struct Report<'a> {
    mode: &'static str,
    plan: &'a Plan,
    mem: &'a [(MemRun, MemRun)],
    tp: &'a Throughput,
    lat: [&'a Latency; 3],
    cpu: &'a [(&'static str, f64)],
    lists: &'a [lists::ListRun],
    cold: &'a [lists::ColdStart],
    tail: &'a [tail::TailRun],
    fleet: &'a [fleet::FleetRun],
    state: Option<String>,
    elapsed: Duration,
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

impl Report<'_> {
    fn slope(&self) -> Option<f64> {
        let n = self.mem.len();
        if n < 3 {
            return None;
        }
        let (a, b) = (&self.mem[n - 2].0, &self.mem[n - 1].0);
        Some((b.steady as f64 - a.steady as f64) / (b.pods - a.pods) as f64)
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        let w = &mut s;
        use std::fmt::Write as _;
        let _ = writeln!(
            w,
            "<!-- written by bench-suite ({} mode); do not edit -->",
            self.mode
        );
        let _ = writeln!(
            w,
            "Machine: {}. Mode: {} ({:.0} s).\n",
            machine(),
            self.mode,
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(w, "Memory (RSS, MiB; stdout sink to /dev/null; steady = mean over the last {:.0} s of {:.0} s after the sync):\n", self.plan.steady.as_secs_f64() / 2.0, self.plan.steady.as_secs_f64());
        let _ = writeln!(w, "| pods | kubesink peak | kubesink steady | kubesink sync (s) | reflector peak | reflector steady | reflector sync (s) |");
        let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|");
        for (k, b) in self.mem {
            let _ = writeln!(
                w,
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                k.pods,
                mib(k.peak),
                mib(k.steady),
                k.sync_secs,
                mib(b.peak),
                mib(b.steady),
                b.sync_secs
            );
        }
        let largest = self.mem.last().map(|m| &m.0);
        let fixed = self.mem.first().map(|m| &m.0);
        let mut rows: Vec<[String; 4]> = Vec::new();
        if let Some(l) = largest {
            rows.push([
                format!("steady RSS, {} pods", l.pods),
                format!("{:.1} MiB", mib(l.steady)),
                "≤ 48 MiB (100k)".into(),
                verdict(mib(l.steady) <= 48.0).into(),
            ]);
            rows.push([
                format!("peak RSS during the initial sync, {} pods", l.pods),
                format!("{:.1} MiB", mib(l.peak)),
                "≤ 64 MiB (100k)".into(),
                verdict(mib(l.peak) <= 64.0).into(),
            ]);
        }
        if let Some(f) = fixed {
            rows.push([
                "fixed cost (RSS, 0 pods)".into(),
                format!("{:.1} MiB", mib(f.steady)),
                "≤ 20 MiB".into(),
                verdict(mib(f.steady) <= 20.0).into(),
            ]);
        }
        if let Some(slope) = self.slope() {
            let n = self.mem.len();
            rows.push([
                format!(
                    "slope, {}→{} pods",
                    self.mem[n - 2].0.pods,
                    self.mem[n - 1].0.pods
                ),
                format!("{slope:.0} B/object"),
                "≤ 160 B/object".into(),
                verdict(slope <= 160.0).into(),
            ]);
        }
        if let Some(st) = &self.state {
            rows.push([
                "informer state (`cargo bench --bench state_size`)".into(),
                st.trim().to_owned(),
                "—".into(),
                "—".into(),
            ]);
        }
        let f = self.tp.floor;
        for (kind, r, note) in &self.tp.sinks {
            let target = match kind {
                SinkKind::Stdout => Some(0.8),
                SinkKind::NatsCore => Some(0.6),
                _ => None,
            };
            match r {
                Some(r) => {
                    let ratio = r.per_sec / f.per_sec;
                    rows.push([
                        format!("throughput, {}", kind.label()),
                        format!(
                            "{:.0}/s = {:.2}× floor ({:.2}× per CPU s)",
                            r.per_sec,
                            ratio,
                            r.per_cpu_sec / f.per_cpu_sec
                        ),
                        target.map_or("measured".into(), |t| format!("≥ {t}× floor")),
                        target.map_or("—".into(), |t| verdict(ratio >= t).into()),
                    ]);
                }
                None => rows.push([
                    format!("throughput, {}", kind.label()),
                    note.clone(),
                    "—".into(),
                    "—".into(),
                ]),
            }
        }
        for (i, l) in self.lat.iter().enumerate() {
            let control = i == 2;
            rows.push([
                format!("latency change → {}, {:.0} changes/s", l.label, l.rate),
                format!(
                    "p50 {:.1} / p99 {:.1} / max {:.1} ms ({} changes)",
                    l.p50, l.p99, l.max, l.samples
                ),
                if control {
                    "—".into()
                } else {
                    "p99 ≤ 50 ms".into()
                },
                if control {
                    "—".into()
                } else {
                    verdict(l.p99 <= 50.0).into()
                },
            ]);
        }
        if let Some(r) = self.tail.iter().find(|r| r.window.is_none() && r.loaded) {
            rows.push([
                format!(
                    "latency change → NATS JetStream, one core busy, {:.0} changes/s",
                    r.lat.rate
                ),
                format!(
                    "p50 {:.1} / p99 {:.1} / max {:.1} ms ({} changes)",
                    r.lat.p50, r.lat.p99, r.lat.max, r.lat.samples
                ),
                "p99 ≤ 50 ms".into(),
                verdict(r.lat.p99 <= 50.0).into(),
            ]);
        }
        if let Some(idle) = largest.and_then(|l| l.idle_cpu_pct) {
            rows.push([
                format!(
                    "idle CPU, {} pods cached, {:.0} s",
                    largest.map_or(0, |l| l.pods),
                    self.plan.idle.as_secs_f64()
                ),
                format!("{idle:.2}% of one core"),
                "≤ 1%".into(),
                verdict(idle <= 1.0).into(),
            ]);
        }
        for (name, c) in self.cpu {
            rows.push([
                format!("CPU per 10,000 changes, {name}"),
                format!("{c:.2} s"),
                "—".into(),
                "—".into(),
            ]);
        }
        let _ = writeln!(w, "\nFigures (throughput: initial list of {} pods of {:.0} bytes mean JSON; parse-floor {:.0}/s, {:.0}/CPU s):\n", self.tp.pods, self.tp.mean_bytes, f.per_sec, f.per_cpu_sec);
        let _ = writeln!(w, "| figure | measured | target | |");
        let _ = writeln!(w, "|---|---|---|---|");
        for r in rows {
            let _ = writeln!(w, "| {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
        }
        w.push_str(&tail::markdown(self.tail));
        w.push_str(&lists::markdown(self.lists, self.cold));
        w.push_str(&fleet::markdown(self.fleet));
        s
    }

    fn json(&self) -> Value {
        json!({
            "mode": self.mode,
            "machine": machine(),
            "memory": self.mem.iter().map(|(k, b)| json!({
                "pods": k.pods,
                "kubesink": {"peak_bytes": k.peak, "steady_bytes": k.steady, "sync_secs": k.sync_secs, "idle_cpu_pct": k.idle_cpu_pct},
                "baseline": {"peak_bytes": b.peak, "steady_bytes": b.steady, "sync_secs": b.sync_secs},
            })).collect::<Vec<_>>(),
            "slope_bytes_per_object": self.slope(),
            "throughput": {
                "pods": self.tp.pods,
                "mean_object_bytes": self.tp.mean_bytes,
                "floor": {"per_sec": self.tp.floor.per_sec, "per_cpu_sec": self.tp.floor.per_cpu_sec},
                "sinks": self.tp.sinks.iter().map(|(k, r, note)| json!({
                    "sink": k.label(),
                    "per_sec": r.map(|r| r.per_sec),
                    "per_cpu_sec": r.map(|r| r.per_cpu_sec),
                    "note": note,
                })).collect::<Vec<_>>(),
            },
            "latency": self.lat.iter().map(|l| json!({
                "sink": l.label, "changes_per_sec": l.rate, "samples": l.samples,
                "p50_ms": l.p50, "p99_ms": l.p99, "max_ms": l.max,
            })).collect::<Vec<_>>(),
            "cpu_seconds_per_10k_changes": self.cpu.iter().map(|(n, c)| json!({"program": n, "seconds": c})).collect::<Vec<_>>(),
            "state_size": self.state,
            "api_server": lists::json(self.lists, self.cold),
            "jetstream_tail": tail::json(self.tail),
            "fleet": fleet::json(self.fleet),
        })
    }
}
