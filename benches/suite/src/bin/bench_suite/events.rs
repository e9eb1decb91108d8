//! Kubernetes Events side by side with the OpenTelemetry Collector's `k8s_events` receiver
//! (`bench-suite --only events`, not part of the full run: it builds the Go peers and starts
//! a real control plane): on one real kube-apiserver (`tests/kube`), kubesink
//! (`mode = "events"`, stdout sink) and `otelcol-k8sobjects` (the Collector built in
//! benches/peers/otelcol, its `k8s_events` receiver and file exporter to stdout) follow the
//! same namespace at once while a writer makes Events at a set rate: half of them new Events,
//! half count bumps of 64 recurring series (a crash-looping workload's `BackOff`s), as the
//! recorders of client-go do (`series.count` and `lastObservedTime` patched).
//!
//! For each program, over the write window and until its output settles: CPU seconds (user +
//! system, `/proc`), CPU per 10,000 Events written, peak RSS (`VmHWM`) and RSS at the end,
//! and what it handed on: kubesink's messages and the sum of their `occurrences` (against the
//! server's counts: every occurrence once), the Collector's log records. Each run uses a
//! namespace of its own and rotates which program starts first; the figures are medians of
//! the runs with their spread.
//!
//! The rate is what 2 cores running the API server, etcd, both programs and the writer
//! sustain, far below a production cluster's 10,000 Events/s: the CPU figures are per 10,000
//! Events so that they scale, and the writer's achieved rate is shown.

use std::io::BufRead as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use kubesink_bench::procfs;
use kubesink_bench::procs::Proc;
use kubesink_bench::stats::mib;
use serde_json::{json, Value};

use super::kube_server::{self, ControlPlane};
use super::{Ctx, Kubesink};

/// Recurring series bumped by the writer.
const HOT: usize = 64;
/// Writes in flight at once.
const IN_FLIGHT: usize = 32;
/// The programs, in the order of the first run (rotated after).
const PROGRAMS: [&str; 2] = ["kubesink", "k8s_events"];

/// One program's figures in one run.
pub struct Measured {
    pub run: usize,
    pub program: &'static str,
    /// Its position in the start order (0: first).
    pub position: usize,
    /// Events written in the window (creates + bumps) and the window's seconds.
    pub written: u64,
    pub secs: f64,
    /// Occurrences the server counts for the run's Events (the sum of their counts).
    pub server_occurrences: u64,
    /// Messages (kubesink) or log records (Collector) handed on.
    pub out: u64,
    /// kubesink: the sum of `occurrences` of its messages.
    pub occurrences: Option<u64>,
    /// CPU seconds from the window's start until its output settled.
    pub cpu: f64,
    pub hwm: u64,
    pub rss_end: u64,
}

/// Everything `--only events` measured.
pub struct Report {
    pub rate: f64,
    pub runs: Vec<Measured>,
}

/// A program following the run's namespace, and its output counters.
struct Follower {
    program: &'static str,
    proc: Proc,
    out: Arc<AtomicU64>,
    occurrences: Arc<AtomicU64>,
}

fn start(
    ctx: &Ctx,
    peers: &Path,
    program: &'static str,
    kubeconfig: &Path,
    ns: &str,
    run: usize,
) -> anyhow::Result<Follower> {
    let (out, occurrences) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    if program == "kubesink" {
        let text = format!(
            "[cluster]\nname = \"bench\"\nkubeconfig = {:?}\n\n[[resources]]\napi_version = \"events.k8s.io/v1\"\nkind = \"Event\"\nmode = \"events\"\nnamespaces = [{ns:?}]\n\n[[sinks]]\ntype = \"stdout\"\n",
            kubeconfig.display().to_string()
        );
        let mut k = Kubesink::start_text_to(ctx, &text, Stdio::piped(), &format!("events-{run}"))?;
        let stdout = k.proc.take_stdout().context("kubesink stdout")?;
        let (o, n) = (out.clone(), occurrences.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                o.fetch_add(1, Ordering::Relaxed);
                if let Some(v) = number_after(&line, "\"occurrences\":") {
                    n.fetch_add(v, Ordering::Relaxed);
                }
            }
        });
        return Ok(Follower {
            program,
            proc: k.proc,
            out,
            occurrences,
        });
    }
    let log = std::fs::File::create(ctx.dir.path().join(format!("otelcol-events-{run}.log")))?;
    let mut proc = super::peers::start_collector(
        peers,
        kubeconfig,
        &ctx.dir.path().join(format!("otelcol-events-{run}.yaml")),
        "k8s_events",
        &format!("    auth_type: kubeConfig\n    namespaces: [{ns}]\n"),
        log,
    )?;
    let stdout = proc.take_stdout().context("otelcol stdout")?;
    let o = out.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let records: usize = v["resourceLogs"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|rl| rl["scopeLogs"].as_array().into_iter().flatten())
                .map(|sl| sl["logRecords"].as_array().map_or(0, Vec::len))
                .sum();
            o.fetch_add(records as u64, Ordering::Relaxed);
        }
    });
    Ok(Follower {
        program,
        proc,
        out,
        occurrences,
    })
}

/// The unsigned integer right after `key` in `line` (a scan: the reader keeps up).
fn number_after(line: &str, key: &str) -> Option<u64> {
    let at = line.find(key)? + key.len();
    let digits = line[at..].trim_start();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// A `events.k8s.io/v1` Event about Pod `pod`, happened once just now.
fn event(ns: &str, name: &str, pod: &str) -> Value {
    let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": now, "reportingController": "kubelet", "reportingInstance": "node-1",
        "action": "Pulling", "reason": "BackOff", "type": "Warning",
        "note": "Back-off restarting failed container",
        "regarding": {"kind": "Pod", "namespace": ns, "name": pod, "apiVersion": "v1"}})
}

/// Writes `rate` Events a second for `secs` into `ns` (every other one a bump of one of the
/// [`HOT`] series, already created); returns the writes that succeeded.
async fn write(client: &kube::Client, ns: &str, rate: f64, secs: f64) -> anyhow::Result<u64> {
    let api = kube_server::dynamic(client, "events.k8s.io/v1", "Event", Some(ns)).await;
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..HOT).map(|_| AtomicU64::new(1)).collect());
    let total = (rate * secs) as u64;
    let start = tokio::time::Instant::now();
    let ok = futures::stream::iter(0..total)
        .map(|i| {
            let (api, counts) = (api.clone(), counts.clone());
            async move {
                tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
                if i % 2 == 0 {
                    let obj: kube::api::DynamicObject =
                        serde_json::from_value(event(ns, &format!("new-{i}"), "web-0")).ok()?;
                    api.create(&Default::default(), &obj).await.ok().map(|_| ())
                } else {
                    let h = (i as usize / 2) % HOT;
                    let to = counts[h].fetch_add(1, Ordering::Relaxed) + 1;
                    let now =
                        humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
                    let patch = json!({"series": {"count": to, "lastObservedTime": now}});
                    api.patch(
                        &format!("hot-{h}"),
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await
                    .ok()
                    .map(|_| ())
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .filter(|r| std::future::ready(r.is_some()))
        .count()
        .await;
    Ok(ok as u64)
}

/// The sum of the counts of the Events of `ns` on the server (`series.count`, else 1).
async fn server_occurrences(client: &kube::Client, ns: &str) -> anyhow::Result<u64> {
    let api = kube_server::dynamic(client, "events.k8s.io/v1", "Event", Some(ns)).await;
    let list = api.list(&Default::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|e| e.data["series"]["count"].as_u64().unwrap_or(1))
        .sum())
}

/// Waits until every follower's output stopped growing for two seconds (at most a minute).
fn settle(followers: &[Follower]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last: Vec<u64> = followers
        .iter()
        .map(|f| f.out.load(Ordering::Relaxed))
        .collect();
    let mut still = Instant::now();
    while Instant::now() < deadline && still.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(200));
        let now: Vec<u64> = followers
            .iter()
            .map(|f| f.out.load(Ordering::Relaxed))
            .collect();
        if now != last {
            (last, still) = (now, Instant::now());
        }
    }
}

/// `runs` runs of `secs` seconds at `rate` Events a second.
pub fn run(ctx: &Ctx, rate: f64, secs: f64, runs: usize) -> anyhow::Result<Report> {
    let peers = super::built_dir("PEERS_BIN_DIR", "scripts/peers-build.sh")?;
    eprintln!("== the Collector: {}", peers.display());
    let cp = ControlPlane::start(kube_server::Options::default());
    let client = ctx
        .rt
        .block_on(kube_server::client_of(&cp.admin_kubeconfig))
        .map_err(anyhow::Error::msg)?;
    let mut measured = Vec::new();
    for k in 0..runs.max(1) {
        let ns = format!("bench-events-{k}");
        ctx.rt.block_on(super::real::post(
            &client,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        ))?;
        let order: Vec<&'static str> = (0..PROGRAMS.len())
            .map(|i| PROGRAMS[(i + k) % PROGRAMS.len()])
            .collect();
        eprintln!(
            "== run {} of {runs}: {} ({rate} Events/s for {secs} s)",
            k + 1,
            order.join(", ")
        );
        let mut followers = Vec::new();
        for program in &order {
            followers.push(start(ctx, &peers, program, &cp.admin_kubeconfig, &ns, k)?);
            std::thread::sleep(Duration::from_secs(2));
        }
        // Both follow once each hands on the recurring series' creation.
        ctx.rt.block_on(async {
            for h in 0..HOT {
                let body = event(&ns, &format!("hot-{h}"), &format!("web-{h}"));
                super::real::post(
                    &client,
                    &format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
                    body,
                )
                .await?;
            }
            anyhow::Ok(())
        })?;
        let ready = Instant::now() + Duration::from_secs(120);
        while followers
            .iter()
            .any(|f| f.out.load(Ordering::Relaxed) < HOT as u64)
        {
            anyhow::ensure!(
                Instant::now() < ready,
                "not following after 2 minutes: {:?}",
                followers
                    .iter()
                    .map(|f| (f.program, f.out.load(Ordering::Relaxed)))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let before: Vec<(f64, u64)> = followers
            .iter()
            .map(|f| {
                (
                    procfs::cpu_seconds(f.proc.pid()).unwrap_or(0.0),
                    f.out.load(Ordering::Relaxed),
                )
            })
            .collect();
        let began = Instant::now();
        let written = ctx.rt.block_on(write(&client, &ns, rate, secs))?;
        let window = began.elapsed().as_secs_f64();
        settle(&followers);
        let server = ctx.rt.block_on(server_occurrences(&client, &ns))?;
        for (position, (f, (cpu0, out0))) in followers.iter().zip(&before).enumerate() {
            let pid = f.proc.pid();
            let mem = procfs::memory(pid).unwrap_or_default();
            let m = Measured {
                run: k,
                program: f.program,
                position,
                written,
                secs: window,
                server_occurrences: server,
                out: f.out.load(Ordering::Relaxed) - out0,
                // The run's namespace is its own: every occurrence kubesink handed on.
                occurrences: (f.program == "kubesink")
                    .then(|| f.occurrences.load(Ordering::Relaxed)),
                cpu: procfs::cpu_seconds(pid).unwrap_or(0.0) - cpu0,
                hwm: mem.hwm,
                rss_end: mem.rss,
            };
            eprintln!(
                "   {}: {} written in {:.1} s, {} handed on, cpu {:.2} s, peak {:.1} MiB, end {:.1} MiB{}",
                m.program,
                m.written,
                m.secs,
                m.out,
                m.cpu,
                mib(m.hwm),
                mib(m.rss_end),
                m.occurrences
                    .map(|o| format!(", occurrences {o} (server {server})"))
                    .unwrap_or_default()
            );
            measured.push(m);
        }
        for mut f in followers {
            f.proc.terminate(Duration::from_secs(10))?;
        }
    }
    Ok(Report {
        rate,
        runs: measured,
    })
}

fn cell(values: &[f64], decimals: usize) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => "–".into(),
        1 => format!("{:.*}", decimals, v[0]),
        n => format!(
            "{:.*} ({:.*}–{:.*})",
            decimals,
            v[n / 2],
            decimals,
            v[0],
            decimals,
            v[n - 1]
        ),
    }
}

/// The table: one row per program, medians (min–max) over the runs.
pub fn markdown(r: &Report) -> String {
    let runs = r.runs.iter().map(|m| m.run).max().map_or(0, |n| n + 1);
    let mut s = format!(
        "\n## Kubernetes Events beside the OpenTelemetry Collector's k8s_events receiver\n\n\
         One real kube-apiserver and etcd; both programs follow the same namespace at once while \
         the writer makes {} Events/s (half new Events, half count bumps of {HOT} recurring \
         series), {runs} run(s), the start order rotated. Medians (min–max).\n\n\
         | program | Events written/s | handed on | occurrences (server) | CPU s | CPU s per 10,000 Events | peak RSS MiB | RSS at end MiB |\n|---|---|---|---|---|---|---|---|\n",
        r.rate
    );
    for program in PROGRAMS {
        let of: Vec<&Measured> = r.runs.iter().filter(|m| m.program == program).collect();
        let col = |f: &dyn Fn(&Measured) -> f64, d: usize| {
            cell(&of.iter().map(|m| f(m)).collect::<Vec<_>>(), d)
        };
        let occ = if program == "kubesink" {
            of.iter()
                .map(|m| format!("{} ({})", m.occurrences.unwrap_or(0), m.server_occurrences))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            "–".into()
        };
        s.push_str(&format!(
            "| {program} | {} | {} | {occ} | {} | {} | {} | {} |\n",
            col(&|m| m.written as f64 / m.secs, 0),
            col(&|m| m.out as f64, 0),
            col(&|m| m.cpu, 2),
            col(&|m| m.cpu / m.written.max(1) as f64 * 10_000.0, 2),
            col(&|m| mib(m.hwm), 1),
            col(&|m| mib(m.rss_end), 1),
        ));
    }
    s
}

/// The raw figures.
pub fn json(r: &Report) -> Value {
    json!({
        "rate": r.rate,
        "runs": r.runs.iter().map(|m| json!({
            "run": m.run, "program": m.program, "position": m.position,
            "written": m.written, "secs": m.secs, "server_occurrences": m.server_occurrences,
            "handed_on": m.out, "occurrences": m.occurrences, "cpu_seconds": m.cpu,
            "peak_rss_bytes": m.hwm, "rss_end_bytes": m.rss_end,
        })).collect::<Vec<_>>(),
    })
}
