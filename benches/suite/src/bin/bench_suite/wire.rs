//! The wire encoding and the list shape on a real kube-apiserver (`bench-suite --only wire`):
//! Pods created through the API (as `real.rs` creates them), then one initial sync per
//! configuration, each after a fresh API server start (its watch cache filled from etcd,
//! then settled), `--runs` rounds with the configurations' order rotated each round (round
//! `r` starts at configuration `r`), so none always runs first:
//!
//! - whole Pods as JSON (the only encoding for them), streaming list and paged lists;
//! - `payload = "metadata"` as JSON (`watch.encoding = "json"`) and as protobuf
//!   `PartialObjectMetadata` (`"auto"`), each with a streaming list and paged lists;
//! - [`CLIENTS`] kubesinks syncing at once, whole Pods and protobuf metadata, each shape: a
//!   fleet of clients restarted together (a roll-out, a node drain) lists at the same time,
//!   and the cheaper shape for one client need not be the cheaper for several.
//!
//! Each figure is the median of the rounds with its spread (min–max): the API server's CPU
//! during the sync, kubesink's CPU, sync time, kubesink's peak and steady RSS, the server's
//! peak RSS (`real::sync_once` measures them).

use std::time::Duration;

use anyhow::Context;
use kubesink_bench::stats::mib;
use serde_json::{json, Value};

use super::kube_server::{self, ControlPlane};
use super::real::{self, Extra, Run};
use super::Ctx;

/// Kubesinks syncing at once in the configurations that measure several clients.
const CLIENTS: usize = 4;

/// One configuration: its name in the tables, the list shape, more keys.
struct Variant {
    name: &'static str,
    strategy: &'static str,
    extra: Extra,
}

fn variants() -> Vec<Variant> {
    let variant = |clients| {
        move |name, strategy, resource, watch, file| Variant {
            name,
            strategy,
            extra: Extra {
                resource,
                watch,
                name: file,
                clients,
            },
        }
    };
    let (v, at_once) = (variant(1), variant(CLIENTS));
    let mut all = vec![
        v(
            "whole Pods, JSON, streaming list",
            "stream",
            "",
            "",
            "-full",
        ),
        v("whole Pods, JSON, paged lists", "list", "", "", "-full"),
        v(
            "metadata, JSON, streaming list",
            "stream",
            "payload = \"metadata\"\n",
            "encoding = \"json\"\n",
            "-meta-json",
        ),
        v(
            "metadata, JSON, paged lists",
            "list",
            "payload = \"metadata\"\n",
            "encoding = \"json\"\n",
            "-meta-json",
        ),
        v(
            "metadata, protobuf, streaming list",
            "stream",
            "payload = \"metadata\"\n",
            "encoding = \"auto\"\n",
            "-meta-pb",
        ),
        v(
            "metadata, protobuf, paged lists",
            "list",
            "payload = \"metadata\"\n",
            "encoding = \"auto\"\n",
            "-meta-pb",
        ),
    ];
    all.extend([
        at_once(
            "4 clients at once: whole Pods, JSON, streaming list",
            "stream",
            "",
            "",
            "-full-x4",
        ),
        at_once(
            "4 clients at once: whole Pods, JSON, paged lists",
            "list",
            "",
            "",
            "-full-x4",
        ),
        at_once(
            "4 clients at once: metadata, protobuf, streaming list",
            "stream",
            "payload = \"metadata\"\n",
            "encoding = \"auto\"\n",
            "-meta-pb-x4",
        ),
        at_once(
            "4 clients at once: metadata, protobuf, paged lists",
            "list",
            "payload = \"metadata\"\n",
            "encoding = \"auto\"\n",
            "-meta-pb-x4",
        ),
    ]);
    all
}

/// The part's result: every run of every configuration.
pub struct Report {
    pub pods: usize,
    pub create_secs: f64,
    pub rounds: usize,
    /// Per configuration (in [`variants`]' order): its name and its runs in round order.
    pub runs: Vec<(&'static str, Vec<Run>)>,
}

/// Creates `pods` Pods, then syncs each configuration once per round, `rounds` rounds.
pub fn run(
    ctx: &Ctx,
    pods: usize,
    rounds: usize,
    settle: Duration,
    steady: Duration,
) -> anyhow::Result<Report> {
    eprintln!("== a real kube-apiserver and etcd (tests/kube, built by scripts/kube-build.sh)");
    let cp = ControlPlane::start(kube_server::Options::default());
    eprintln!("== creating {pods} Pods through the API");
    let create_secs = ctx.rt.block_on(real::populate(&cp, pods))?;
    let all = variants();
    let mut runs: Vec<(&'static str, Vec<Run>)> =
        all.iter().map(|v| (v.name, Vec::new())).collect();
    for round in 0..rounds {
        eprintln!("== round {} of {rounds}", round + 1);
        for i in 0..all.len() {
            let at = (i + round) % all.len();
            let v = &all[at];
            cp.restart_apiserver();
            std::thread::sleep(settle);
            let pid = cp.pid("kube-apiserver").context("no kube-apiserver")?;
            eprintln!("   {}", v.name);
            let run = real::sync_once(
                ctx,
                "kube-apiserver",
                &cp.admin_kubeconfig,
                v.strategy,
                &v.extra,
                pods,
                steady,
                pid,
                cp.pid("etcd"),
                || Ok(ctx.rt.block_on(real::pod_requests(&cp))),
            )?;
            runs[at].1.push(run);
        }
    }
    Ok(Report {
        pods,
        create_secs,
        rounds,
        runs,
    })
}

/// The median of `values` and their spread, `"4.04 (3.90–4.20)"`; one value alone.
fn median_spread(values: &[f64], decimals: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let Some((lo, hi)) = sorted.first().zip(sorted.last()) else {
        return "–".into();
    };
    let median = sorted[sorted.len() / 2];
    if sorted.len() == 1 {
        format!("{median:.decimals$}")
    } else {
        format!("{median:.decimals$} ({lo:.decimals$}–{hi:.decimals$})")
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The part's table (Markdown).
pub fn markdown(r: &Report) -> String {
    let mut md = format!(
        "\n### Wire encoding and list shape: {} Pods on a real kube-apiserver\n\nCreated through the API in {:.0} s. Each configuration synced once per round after a fresh API server start, {} rounds, the order rotated each round; each cell the median (min–max). The API server's CPU is during the sync, less its idle rate before it; with 4 clients at once, it and the LIST and WATCH counts are for the four, kubesink's figures the first one's.\n\n| configuration | API server CPU (s) | kubesink CPU (s) | sync (s) | kubesink peak RSS (MiB) | steady RSS (MiB) | API server peak RSS (MiB) | LIST | WATCH |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        r.pods, r.create_secs, r.rounds
    );
    for (name, runs) in &r.runs {
        let f =
            |g: &dyn Fn(&Run) -> f64, d| median_spread(&runs.iter().map(g).collect::<Vec<_>>(), d);
        md.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} |\n",
            f(
                &|x| x.server_cpu_secs - x.server_idle_cpu_rate * x.sync_secs,
                2
            ),
            f(&|x| x.kubesink_cpu_secs, 2),
            f(&|x| x.sync_secs, 1),
            f(&|x| mib(x.kubesink_peak), 1),
            f(&|x| mib(x.kubesink_steady), 1),
            f(&|x| mib(x.server_rss_peak), 0),
            median(&runs.iter().map(|x| x.list_requests).collect::<Vec<_>>()),
            median(&runs.iter().map(|x| x.watch_requests).collect::<Vec<_>>()),
        ));
    }
    md
}

/// Every run's figures (JSON).
pub fn json(r: &Report) -> Value {
    json!({
        "pods": r.pods,
        "create_secs": r.create_secs,
        "rounds": r.rounds,
        "configurations": r.runs.iter().map(|(name, runs)| json!({
            "name": name,
            "runs": runs.iter().map(|x| json!({
                "strategy": x.strategy,
                "sync_secs": x.sync_secs,
                "server_cpu_secs": x.server_cpu_secs,
                "server_idle_cpu_rate": x.server_idle_cpu_rate,
                "kubesink_cpu_secs": x.kubesink_cpu_secs,
                "kubesink_peak_bytes": x.kubesink_peak,
                "kubesink_steady_bytes": x.kubesink_steady,
                "server_rss_before_bytes": x.server_rss_before,
                "server_rss_peak_bytes": x.server_rss_peak,
                "etcd_cpu_secs": x.etcd_cpu_secs,
                "list_requests": x.list_requests,
                "watch_requests": x.watch_requests,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
