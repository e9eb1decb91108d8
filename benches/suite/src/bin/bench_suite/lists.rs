//! The API server's side of an initial sync (issue "A good citizen of a big API server"):
//!
//! 1. **paged lists vs streaming lists**: the same pods synced once with
//!    `watch.initial_list = "list"` and once with `"stream"`, each against a fresh simulator:
//!    the simulator's own CPU seconds and RSS growth while it serves the initial state (its
//!    RSS before kubesink starts is the baseline: the populated store), kubesink's peak RSS,
//!    the sync time, and the LIST and watch requests the simulator received;
//! 2. **a cold start of many namespaces**: `N` namespaces × 4 resources (Pods, ConfigMaps,
//!    Services, Deployments), one informer each, with the default request budget
//!    (`watch.requests_per_second` 50, `request_burst` 100) and without one (`0`): the
//!    requests, the most the simulator received in any one second, the time until every
//!    watch synced, kubesink's peak RSS and open file descriptors.
//!
//! What the simulator costs is not what a kube-apiserver costs (it keeps objects as JSON
//! bytes and renders a page from them; a real server reads etcd or its watch cache and
//! converts each object), so the simulator's figures compare the two request shapes on one
//! server, they do not predict a real one.

use std::time::{Duration, Instant};

use anyhow::bail;
use kubesink_bench::http::{metric_sum, request};
use kubesink_bench::procfs::{self, Sampler};
use kubesink_bench::procs::Sim;
use kubesink_bench::stats::mib;
use serde_json::{json, Value};

use super::{Ctx, Kubesink};

/// One initial sync of `pods` with one strategy.
pub struct ListRun {
    pub strategy: &'static str,
    pub pods: usize,
    pub sync_secs: f64,
    pub kubesink_peak: u64,
    /// Simulator: RSS before kubesink started, and the highest sampled during the sync.
    pub sim_rss_before: u64,
    pub sim_rss_peak: u64,
    pub sim_cpu_secs: f64,
    pub kubesink_cpu_secs: f64,
    pub list_requests: u64,
    pub watch_requests: u64,
    /// Seconds the requests waited for the client-side budget, in all (part of the sync).
    pub budget_wait_secs: f64,
}

/// One cold start of many namespaces.
pub struct ColdStart {
    pub label: &'static str,
    pub rate: f64,
    pub burst: u32,
    pub namespaces: usize,
    pub watches: usize,
    pub requests: u64,
    /// The most requests the simulator received within any 1 s (sampled every 100 ms).
    pub max_per_sec: f64,
    pub sync_secs: f64,
    pub kubesink_peak: u64,
    pub fds: usize,
    pub rate_limited: f64,
    pub throttled: f64,
}

fn pods_counts(stats: &Value) -> (u64, u64) {
    let c = &stats["requestCounts"]["byResource"]["pods"];
    (
        c["lists"].as_u64().unwrap_or(0),
        c["watches"].as_u64().unwrap_or(0),
    )
}

fn total_requests(stats: &Value) -> u64 {
    stats["requestCounts"]["byResource"]
        .as_object()
        .map_or(0, |m| {
            m.values()
                .map(|c| c["lists"].as_u64().unwrap_or(0) + c["watches"].as_u64().unwrap_or(0))
                .sum()
        })
}

/// Paged lists, then streaming lists, of `pods` pods.
pub fn list_vs_stream(ctx: &Ctx, pods: usize) -> anyhow::Result<Vec<ListRun>> {
    let mut out = Vec::new();
    for strategy in ["list", "stream"] {
        eprintln!("== initial list of {pods} pods: {strategy}");
        let sim = Sim::start_with(
            &ctx.bin,
            &format!("{pods}-{strategy}"),
            &["--pods", &pods.to_string(), "--namespaces", "20"],
            ctx.dir.path(),
        )?;
        request(sim.addr, "POST", "/_sim/reset-stats")?;
        let sim_pid = sim.proc.pid();
        let sim_before = procfs::memory(sim_pid).map_or(0, |m| m.rss);
        let sim_cpu0 = procfs::cpu_seconds(sim_pid).unwrap_or(0.0);
        let sim_sampler = Sampler::start(sim_pid, Duration::from_millis(50));
        let sink =
            format!("[[sinks]]\ntype = \"stdout\"\n\n[watch]\ninitial_list = \"{strategy}\"\n");
        let mut k = Kubesink::start(ctx, &sim, &sink, false, &format!("lists-{strategy}"))?;
        let started = Instant::now();
        k.wait_delivered(Some(pods), Duration::from_secs(1800))?;
        // `synced` too: the sweep ran (with paged lists, the last page arrived).
        k.wait_delivered(None, Duration::from_secs(600))?;
        let sync_secs = started.elapsed().as_secs_f64();
        let sim_cpu = procfs::cpu_seconds(sim_pid).unwrap_or(0.0) - sim_cpu0;
        let kubesink_cpu = procfs::cpu_seconds(k.proc.pid()).unwrap_or(0.0);
        let sim_samples = sim_sampler.stop();
        let peak = procfs::memory(k.proc.pid()).map_or(0, |m| m.hwm);
        let (lists, watches) = pods_counts(&sim.stats()?);
        let budget_wait_secs = request(k.metrics, "GET", "/metrics")
            .map(|t| metric_sum(&t, "kubesink_api_rate_limit_wait_seconds_total"))
            .unwrap_or(0.0);
        let run = ListRun {
            strategy,
            pods,
            sync_secs,
            kubesink_peak: peak,
            sim_rss_before: sim_before,
            sim_rss_peak: sim_samples
                .iter()
                .map(|s| s.rss)
                .max()
                .unwrap_or(sim_before),
            sim_cpu_secs: sim_cpu,
            kubesink_cpu_secs: kubesink_cpu,
            list_requests: lists,
            watch_requests: watches,
            budget_wait_secs,
        };
        eprintln!(
            "   sync {:.1} s; kubesink peak {:.1} MiB, {:.2} CPU s; simulator +{:.1} MiB, {:.2} CPU s; {} LIST, {} watch requests",
            run.sync_secs,
            mib(run.kubesink_peak),
            run.kubesink_cpu_secs,
            mib(run.sim_rss_peak.saturating_sub(run.sim_rss_before)),
            run.sim_cpu_secs,
            run.list_requests,
            run.watch_requests
        );
        drop(k);
        drop(sim);
        out.push(run);
    }
    Ok(out)
}

/// `namespaces` × 4 resources, with the default budget and without one.
pub fn cold_starts(ctx: &Ctx, namespaces: usize) -> anyhow::Result<Vec<ColdStart>> {
    let n = namespaces.to_string();
    let pods = (namespaces * 2).to_string();
    let sim = Sim::start_with(
        &ctx.bin,
        &format!("cold-{namespaces}"),
        &[
            "--namespaces",
            &n,
            "--pods",
            &pods,
            "--configmaps",
            &n,
            "--services",
            &n,
            "--deployments",
            &n,
        ],
        ctx.dir.path(),
    )?;
    // The simulator's namespaces: "default", then "ns-1", "ns-2", …
    let names: Vec<String> = (0..namespaces)
        .map(|i| {
            if i == 0 {
                "default".to_owned()
            } else {
                format!("ns-{i}")
            }
        })
        .collect();
    let list = serde_json::to_string(&names)?;
    let mut resources = String::new();
    for (api_version, kind) in [
        ("v1", "Pod"),
        ("v1", "ConfigMap"),
        ("v1", "Service"),
        ("apps/v1", "Deployment"),
    ] {
        resources.push_str(&format!(
            "[[resources]]\napi_version = \"{api_version}\"\nkind = \"{kind}\"\nnamespaces = {list}\n\n"
        ));
    }
    let watches = namespaces * 4;
    let mut out = Vec::new();
    for (label, rate, burst) in [("default budget", 50.0, 100u32), ("no limit", 0.0, 100)] {
        eprintln!("== cold start: {namespaces} namespaces x 4 resources, {label}");
        request(sim.addr, "POST", "/_sim/reset-stats")?;
        let config = format!(
            "{resources}[[sinks]]\ntype = \"stdout\"\n\n[watch]\nrequests_per_second = {rate}\nrequest_burst = {burst}\n"
        );
        let k = Kubesink::start_config(ctx, &sim, &config, false, &format!("cold-{rate}"))?;
        let started = Instant::now();
        let sampler = Sampler::start(k.proc.pid(), Duration::from_millis(100));
        let mut samples: Vec<(f64, u64)> = Vec::new();
        let mut last_metrics = Instant::now() - Duration::from_secs(10);
        let mut fds = 0;
        let deadline = started + Duration::from_secs(1800);
        loop {
            let t = started.elapsed().as_secs_f64();
            samples.push((t, total_requests(&sim.stats()?)));
            if last_metrics.elapsed() >= Duration::from_secs(1) {
                last_metrics = Instant::now();
                fds = fds.max(procfs::open_fds(k.proc.pid()).unwrap_or(0));
                if let Ok(text) = request(k.metrics, "GET", "/metrics") {
                    if metric_sum(&text, "kubesink_synced") >= watches as f64 {
                        break;
                    }
                }
            }
            if Instant::now() > deadline {
                bail!("{watches} watches did not sync within 30 min");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let sync_secs = started.elapsed().as_secs_f64();
        let text = request(k.metrics, "GET", "/metrics")?;
        let mut max_per_sec: f64 = 0.0;
        for (i, (t0, c0)) in samples.iter().enumerate() {
            for (t1, c1) in &samples[i..] {
                if t1 - t0 > 1.0 {
                    break;
                }
                max_per_sec = max_per_sec.max((c1 - c0) as f64);
            }
        }
        let peak = procfs::memory(k.proc.pid()).map_or(0, |m| m.hwm);
        drop(sampler);
        let run = ColdStart {
            label,
            rate,
            burst,
            namespaces,
            watches,
            requests: total_requests(&sim.stats()?),
            max_per_sec,
            sync_secs,
            kubesink_peak: peak,
            fds,
            rate_limited: metric_sum(&text, "kubesink_api_rate_limited_requests_total"),
            throttled: metric_sum(&text, "kubesink_api_errors_total"),
        };
        eprintln!(
            "   {} requests, at most {:.0} in one second; all {} watches synced in {:.1} s; peak {:.1} MiB, {} fds; {:.0} requests waited for the budget",
            run.requests,
            run.max_per_sec,
            run.watches,
            run.sync_secs,
            mib(run.kubesink_peak),
            run.fds,
            run.rate_limited
        );
        drop(k);
        out.push(run);
    }
    Ok(out)
}

/// The two tables, in Markdown.
pub fn markdown(lists: &[ListRun], cold: &[ColdStart]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let w = &mut s;
    if let Some(first) = lists.first() {
        let _ = writeln!(w, "\nInitial list of {} pods, paged vs streaming (`watch.initial_list`; a fresh simulator each; simulator RSS growth over its populated store):\n", first.pods);
        let _ = writeln!(w, "| strategy | LIST requests | watch requests | sync (s) | of which waiting for the request budget (s) | kubesink peak (MiB) | kubesink CPU (s) | simulator RSS growth (MiB) | simulator CPU (s) |");
        let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in lists {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} |",
                r.strategy,
                r.list_requests,
                r.watch_requests,
                r.sync_secs,
                r.budget_wait_secs,
                mib(r.kubesink_peak),
                r.kubesink_cpu_secs,
                mib(r.sim_rss_peak.saturating_sub(r.sim_rss_before)),
                r.sim_cpu_secs
            );
        }
    }
    if let Some(first) = cold.first() {
        let _ = writeln!(w, "\nCold start of {} namespaces × 4 resources ({} watches, `initial_list = \"auto\"`):\n", first.namespaces, first.watches);
        let _ = writeln!(w, "| budget | requests | most in 1 s | all synced (s) | waited for the budget | 429 / errors | kubesink peak (MiB) | open fds |");
        let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for c in cold {
            let budget = if c.rate > 0.0 {
                format!("{}/s, burst {}", c.rate, c.burst)
            } else {
                "none (0)".into()
            };
            let _ = writeln!(
                w,
                "| {budget} | {} | {:.0} | {:.1} | {:.0} | {:.0} | {:.1} | {} |",
                c.requests,
                c.max_per_sec,
                c.sync_secs,
                c.rate_limited,
                c.throttled,
                mib(c.kubesink_peak),
                c.fds
            );
        }
    }
    s
}

/// The two tables, as JSON.
pub fn json(lists: &[ListRun], cold: &[ColdStart]) -> Value {
    json!({
        "initial_list": lists.iter().map(|r| json!({
            "strategy": r.strategy, "pods": r.pods, "sync_secs": r.sync_secs,
            "kubesink_peak_bytes": r.kubesink_peak, "kubesink_cpu_secs": r.kubesink_cpu_secs,
            "sim_rss_before_bytes": r.sim_rss_before, "sim_rss_peak_bytes": r.sim_rss_peak,
            "sim_cpu_secs": r.sim_cpu_secs, "list_requests": r.list_requests,
            "watch_requests": r.watch_requests, "budget_wait_secs": r.budget_wait_secs,
        })).collect::<Vec<_>>(),
        "cold_start": cold.iter().map(|c| json!({
            "budget": c.label, "requests_per_second": c.rate, "request_burst": c.burst,
            "namespaces": c.namespaces, "watches": c.watches, "requests": c.requests,
            "max_requests_in_one_second": c.max_per_sec, "sync_secs": c.sync_secs,
            "rate_limited_requests": c.rate_limited, "api_errors": c.throttled,
            "kubesink_peak_bytes": c.kubesink_peak, "open_fds": c.fds,
        })).collect::<Vec<_>>(),
    })
}
