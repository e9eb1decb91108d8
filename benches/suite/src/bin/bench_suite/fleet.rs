//! Many clusters in one process ("Fleet"): the same objects split over 1, 10 and
//! 50 clusters (`[[clusters]]`, Pods and Deployments each, stdout sink to /dev/null), with
//! the default list budget (`watch.max_concurrent_lists`) and without one (`0`: every list
//! at once, no budget), side by side in one run. Per run: kubesink's
//! peak RSS (`VmHWM` once every cluster synced), steady RSS (the mean of the second half of
//! the quiet time after the sync), the initial sync time (from the start until every watch's
//! `kubesink_synced` is 1 and the sink confirmed every object), the most open file
//! descriptors, the most lists read at once and the time lists waited for a slot; the RSS
//! samples of the cold starts of the largest fleet are plotted.
//!
//! One simulator serves every cluster of a run: each `[[clusters]]` entry is its own client,
//! connections, informers and stores on the same simulated API server, which holds
//! `total / clusters` pods, so kubesink reads `total` objects whatever the split (its stores
//! intern per watch, so identical names in two clusters share nothing). That costs one
//! simulator process instead of 50 and changes nothing on kubesink's side; the simulator's
//! own RSS is not kubesink's and is not reported.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kubesink_bench::http::{metric_sum, request};
use kubesink_bench::procfs::{self, Sample, Sampler};
use kubesink_bench::procs::Sim;
use kubesink_bench::stats::mib;
use serde_json::{json, Value};

use super::{Ctx, Kubesink};

/// The budget of the "after" runs: kubesink's default `watch.max_concurrent_lists`.
pub const DEFAULT_BUDGET: usize = 16;

/// One Deployment per this many pods in each cluster (the 2,500 pods, 125
/// Deployments).
const PODS_PER_DEPLOYMENT: usize = 20;

/// What one fleet run measured.
pub struct FleetRun {
    pub clusters: usize,
    /// `watch.max_concurrent_lists` (0: no limit).
    pub budget: usize,
    pub pods: usize,
    pub deployments: usize,
    pub sync_secs: f64,
    pub peak: u64,
    pub steady: u64,
    pub fds: usize,
    /// `kubesink_watch_lists_in_flight_peak`.
    pub lists_peak: f64,
    /// `kubesink_watch_list_slot_wait_seconds_total`.
    pub slot_wait_secs: f64,
    pub cpu_secs: f64,
    pub samples: Vec<Sample>,
}

impl FleetRun {
    fn label(&self) -> String {
        match (self.clusters, self.budget) {
            (1, _) => "1 cluster".into(),
            (n, 0) => format!("{n} clusters, no budget (before)"),
            (n, b) => format!("{n} clusters, max_concurrent_lists = {b}"),
        }
    }
}

/// Every run of the scenario: `sizes` clusters (the first is the single cluster, run once)
/// sharing `total_pods` pods, each with the default budget and with none; `steady` of quiet
/// after each sync.
pub fn runs(
    ctx: &Ctx,
    sizes: &[usize],
    total_pods: usize,
    steady: Duration,
) -> anyhow::Result<Vec<FleetRun>> {
    let mut out = Vec::new();
    for &n in sizes {
        let pods = total_pods / n;
        let deployments = (pods / PODS_PER_DEPLOYMENT).max(1);
        let sim = Sim::start_with(
            &ctx.bin,
            &format!("fleet-{n}"),
            &[
                "--pods",
                &pods.to_string(),
                "--deployments",
                &deployments.to_string(),
                "--namespaces",
                "20",
            ],
            ctx.dir.path(),
        )?;
        let budgets: &[usize] = if n == 1 {
            &[DEFAULT_BUDGET]
        } else {
            &[0, DEFAULT_BUDGET]
        };
        for &budget in budgets {
            eprintln!(
                "== fleet: {n} cluster(s) × {pods} pods + {deployments} Deployments, max_concurrent_lists = {budget}"
            );
            let run = one(ctx, &sim, n, pods, deployments, budget, steady)?;
            eprintln!(
                "   all synced in {:.1} s; peak {:.1} MiB, steady {:.1} MiB, {} fds, at most {:.0} lists at once, {:.1} s waited for a slot, {:.1} CPU s",
                run.sync_secs,
                mib(run.peak),
                mib(run.steady),
                run.fds,
                run.lists_peak,
                run.slot_wait_secs,
                run.cpu_secs
            );
            out.push(run);
        }
    }
    Ok(out)
}

/// One cold start of `n` clusters on `sim`.
fn one(
    ctx: &Ctx,
    sim: &Sim,
    n: usize,
    pods: usize,
    deployments: usize,
    budget: usize,
    steady: Duration,
) -> anyhow::Result<FleetRun> {
    let kubeconfig = sim.kubeconfig.display().to_string();
    let mut body = String::new();
    if n == 1 {
        body.push_str(&format!(
            "[cluster]\nname = \"fleet\"\nkubeconfig = {kubeconfig:?}\n\n"
        ));
    } else {
        for i in 0..n {
            body.push_str(&format!(
                "[[clusters]]\nname = \"fleet-{i}\"\nkubeconfig = {kubeconfig:?}\n\n"
            ));
        }
    }
    body.push_str(
        "[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n\n[[resources]]\napi_version = \"apps/v1\"\nkind = \"Deployment\"\n\n[[sinks]]\ntype = \"stdout\"\n\n",
    );
    body.push_str(&format!("[watch]\nmax_concurrent_lists = {budget}\n"));
    let mut k = Kubesink::start_text(ctx, &body, false, &format!("fleet-{n}-{budget}"))?;
    let pid = k.proc.pid();
    let watches = (n * 2) as f64;
    let objects = (n * (pods + deployments)) as f64;
    let sampler = Sampler::start(pid, Duration::from_millis(50));
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut fds = 0;
    loop {
        fds = fds.max(procfs::open_fds(pid).unwrap_or(0));
        if let Ok(t) = request(k.metrics, "GET", "/metrics") {
            if metric_sum(&t, "kubesink_synced") >= watches
                && metric_sum(&t, "kubesink_sink_delivered_messages_total") >= objects
            {
                break;
            }
        }
        k.proc.check_running()?;
        if Instant::now() > deadline {
            bail!("{n} clusters did not sync within 30 min");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let sync_secs = sampler.elapsed();
    let peak = procfs::memory(pid).context("kubesink gone")?.hwm;
    let quiet_until = Instant::now() + steady;
    while Instant::now() < quiet_until {
        fds = fds.max(procfs::open_fds(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = request(k.metrics, "GET", "/metrics")?;
    let cpu_secs = procfs::cpu_seconds(pid).unwrap_or(0.0);
    let samples = sampler.stop();
    let from = sync_secs + steady.as_secs_f64() / 2.0;
    let steady_rss = procfs::mean_rss_since(&samples, from)
        .map_or_else(|| procfs::memory(pid).map_or(0, |m| m.rss), |m| m as u64);
    Ok(FleetRun {
        clusters: n,
        budget,
        pods: n * pods,
        deployments: n * deployments,
        sync_secs,
        peak,
        steady: steady_rss,
        fds,
        lists_peak: metric_sum(&text, "kubesink_watch_lists_in_flight_peak"),
        slot_wait_secs: metric_sum(&text, "kubesink_watch_list_slot_wait_seconds_total"),
        cpu_secs,
        samples,
    })
}

/// The single cluster's run and the largest fleet's runs without and with the budget.
fn extremes(runs: &[FleetRun]) -> Option<(&FleetRun, Option<&FleetRun>, &FleetRun)> {
    let single = runs.iter().find(|r| r.clusters == 1)?;
    let most = runs.iter().map(|r| r.clusters).max()?;
    let before = runs.iter().find(|r| r.clusters == most && r.budget == 0);
    let after = runs.iter().find(|r| r.clusters == most && r.budget != 0)?;
    Some((single, before, after))
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

/// The table and the targets, in Markdown.
pub fn markdown(runs: &[FleetRun]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let w = &mut s;
    let Some(first) = runs.first() else {
        return s;
    };
    let _ = writeln!(w, "\nMany clusters in one process: {} pods and {} Deployments in all, split over 1 to {} clusters (Pods and Deployments each, stdout sink; one simulator serves every cluster):\n", first.pods, first.deployments, runs.iter().map(|r| r.clusters).max().unwrap_or(1));
    let _ = writeln!(w, "| clusters | max_concurrent_lists | all synced (s) | peak RSS (MiB) | steady RSS (MiB) | open fds | most lists at once | waited for a slot (s) | CPU (s) |");
    let _ = writeln!(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let budget = if r.budget == 0 {
            "0 (none: before)".to_owned()
        } else {
            r.budget.to_string()
        };
        let _ = writeln!(
            w,
            "| {} | {budget} | {:.1} | {:.1} | {:.1} | {} | {:.0} | {:.1} | {:.1} |",
            r.clusters,
            r.sync_secs,
            mib(r.peak),
            mib(r.steady),
            r.fds,
            r.lists_peak,
            r.slot_wait_secs,
            r.cpu_secs
        );
    }
    if let Some((one, before, after)) = extremes(runs) {
        let n = after.clusters;
        let _ = writeln!(w, "\nTargets ({n} clusters with the default budget ÷ 1 cluster of the same objects; before = no budget):\n");
        let _ = writeln!(w, "| figure | 1 cluster | {n} clusters, before | {n} clusters, after | after ÷ 1 cluster | target | |");
        let _ = writeln!(w, "|---|---:|---:|---:|---:|---|---|");
        let rows: [(&str, f64, Option<f64>, f64, f64); 3] = [
            (
                "peak RSS (MiB)",
                mib(one.peak),
                before.map(|b| mib(b.peak)),
                mib(after.peak),
                1.5,
            ),
            (
                "steady RSS (MiB)",
                mib(one.steady),
                before.map(|b| mib(b.steady)),
                mib(after.steady),
                1.3,
            ),
            (
                "initial sync (s)",
                one.sync_secs,
                before.map(|b| b.sync_secs),
                after.sync_secs,
                1.2,
            ),
        ];
        for (what, single, b, a, target) in rows {
            let ratio = a / single;
            let _ = writeln!(
                w,
                "| {what} | {single:.1} | {} | {a:.1} | {ratio:.2}× | ≤ {target}× | {} |",
                b.map_or("—".into(), |b| format!("{b:.1}")),
                verdict(ratio <= target)
            );
        }
    }
    s
}

/// Every run, as JSON (RSS samples left out).
pub fn json(runs: &[FleetRun]) -> Value {
    json!(runs
        .iter()
        .map(|r| json!({
            "clusters": r.clusters, "max_concurrent_lists": r.budget, "pods": r.pods,
            "deployments": r.deployments, "sync_secs": r.sync_secs, "peak_bytes": r.peak,
            "steady_bytes": r.steady, "open_fds": r.fds, "lists_in_flight_peak": r.lists_peak,
            "slot_wait_secs": r.slot_wait_secs, "cpu_secs": r.cpu_secs,
        }))
        .collect::<Vec<_>>())
}

/// The RSS-over-time plot of the cold starts: the single cluster and the largest fleet
/// without and with the budget.
pub fn plot(path: &std::path::Path, runs: &[FleetRun]) -> anyhow::Result<()> {
    use kubesink_bench::plot::{rss_over_time, Series};
    use plotters::style::RGBColor;
    let Some((one, before, after)) = extremes(runs) else {
        return Ok(());
    };
    let labels = (one.label(), before.map(FleetRun::label), after.label());
    let mut series = vec![Series {
        label: &labels.0,
        samples: &one.samples,
        color: RGBColor(44, 160, 44),
    }];
    if let (Some(b), Some(label)) = (before, labels.1.as_deref()) {
        series.push(Series {
            label,
            samples: &b.samples,
            color: RGBColor(214, 39, 40),
        });
    }
    series.push(Series {
        label: &labels.2,
        samples: &after.samples,
        color: RGBColor(31, 119, 180),
    });
    rss_over_time(
        path,
        &format!(
            "RSS during the cold start of {} pods: 1 cluster vs {} clusters",
            one.pods, after.clusters
        ),
        &series,
    )
}
