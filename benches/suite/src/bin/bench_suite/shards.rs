//! One huge cluster spread over replicas (`cluster.shards`; `bench-suite --only
//! shards`): what each replica of a scale-out group of two costs when one cluster is split
//! four ways by namespace hash, against one replica holding the whole cluster, on a real
//! kube-apiserver with its `ShardedListAndWatch` gate on (the server filters each shard's
//! list and watch) and off (each replica reads everything and keeps its shards itself).
//!
//! Per setup: the Pods created through the API (`real.rs`'s Pods, in 20 namespaces named as
//! teams name them, [`NAMESPACES`]), the group
//! started and left to settle (the shards held as the assignment says, every Pod delivered),
//! then a churn window of Pod label patches through the API; measured per replica: the
//! shards it holds, the Pods it follows (`kubesink_objects`), its RSS after the window, its
//! CPU seconds during the window and the objects and events it read and dropped as other
//! shards' (`kubesink_watch_events_total`, `kubesink_shard_foreign_objects_total`); and
//! the API server's CPU during the window. Each group replica is a real `kubesink run`
//! (release build in the full run) with its state in a local nats-server.
//!
//! The initial sync is not what is compared: the first replica to start sees no other member
//! yet and takes every shard for a moment (a fresh group), so its peak is the whole
//! cluster's; what a shard saves shows once the group settled.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use kubesink_bench::http::{metric_sum, request};
use kubesink_bench::procfs;
use kubesink_bench::procs::Nats;
use kubesink_bench::stats::mib;
use serde_json::{json, Value};

use super::kube_server::{self, ControlPlane};
use super::real::{pod, populate_in};
use super::{Ctx, Kubesink};

/// Shards of the cluster, and replicas of the sharded group: twice as many shards as
/// replicas, as docs/operations.md advises (with bounded loads a member holds at most
/// `ceil(1.25 × units / members)`, and with one unit per member some hold two and some none).
const SHARDS: u32 = 4;
const REPLICAS: usize = 2;
/// Patches in flight during the churn window.
const PATCHES_IN_FLIGHT: usize = 16;

/// The namespaces of the Pods: names as teams and platforms give them, not a prefix and a
/// number. The range of a shard is over the top bits of FNV-1a-64 (the API server's hash),
/// in which names that differ only in their last character hardly differ: `bench-0` to
/// `bench-19` all fall into one of four shards (docs/scale-out.md, "Balance"). These 20 fall
/// 6 / 6 / 3 / 5.
const NAMESPACES: [&str; 20] = [
    "payments",
    "checkout",
    "search",
    "catalog",
    "auth",
    "billing",
    "logging",
    "monitoring",
    "ingress-nginx",
    "cert-manager",
    "argocd",
    "istio-system",
    "frontend",
    "backend",
    "data",
    "ml",
    "ci",
    "web",
    "api",
    "cache",
];

/// One replica's figures.
pub struct Replica {
    pub identity: String,
    /// Units (shards, or the whole cluster) it holds.
    pub units: f64,
    /// Pods it follows (`kubesink_objects`).
    pub objects: f64,
    pub rss: u64,
    /// CPU seconds during the churn window.
    pub cpu_secs: f64,
    /// List items and watch events read, and those dropped as other shards', during the
    /// churn window.
    pub read: f64,
    pub foreign: f64,
}

/// One setup.
pub struct Run {
    /// `whole`, `shards, gate on` or `shards, gate off`.
    pub setup: &'static str,
    pub replicas: Vec<Replica>,
    /// Patches applied in the window, and its seconds.
    pub patches: usize,
    pub window_secs: f64,
    /// The API server's CPU seconds during the window.
    pub server_cpu_secs: f64,
}

/// The whole part.
pub struct Report {
    pub pods: usize,
    pub runs: Vec<Run>,
}

/// A running replica and its identity.
struct Member {
    identity: String,
    k: Kubesink,
}

impl Member {
    fn metrics(&self) -> String {
        request(self.k.metrics, "GET", "/metrics").unwrap_or_default()
    }
}

/// The sum of `kubesink_watch_events_total`'s series of type `t`.
fn events(text: &str, t: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with("kubesink_watch_events_total{") && l.contains(&format!("type=\"{t}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn read_total(text: &str) -> f64 {
    ["listed", "added", "modified", "deleted"]
        .iter()
        .map(|t| events(text, t))
        .sum()
}

/// Starts `replicas` replicas of a scale-out group on the cluster at `kubeconfig`, split
/// `shards` ways (1: whole), state in NATS at `nats`; `group` names its Leases.
fn start_group(
    ctx: &Ctx,
    kubeconfig: &std::path::Path,
    nats: &str,
    shards: u32,
    replicas: usize,
    group: &str,
) -> anyhow::Result<Vec<Member>> {
    (0..replicas)
        .map(|i| {
            let identity = format!("{group}-r{i}");
            let text = format!(
                "[cluster]\nname = \"bench\"\nkubeconfig = {:?}\nshards = {shards}\n\n[leader_election]\nenabled = true\nscale_out = true\nidentity = \"{identity}\"\nlease_name = \"{group}\"\nlease_namespace = \"default\"\nlease_duration = \"4s\"\nrenew_deadline = \"2500ms\"\nretry_period = \"500ms\"\n\n[state]\nbackend = \"nats\"\n[state.nats]\nservers = [\"{nats}\"]\nobject = \"{group}\"\n\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n\n[[sinks]]\ntype = \"stdout\"\n",
                kubeconfig.display().to_string()
            );
            let k = Kubesink::start_text(ctx, &text, false, &identity)?;
            Ok(Member { identity, k })
        })
        .collect()
}

/// Waits until the group holds every unit once and follows every Pod, then 3 s more.
fn settle(members: &mut [Member], units: f64, pods: usize, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let texts: Vec<String> = members.iter().map(Member::metrics).collect();
        let held: f64 = texts
            .iter()
            .map(|t| metric_sum(t, "kubesink_scale_out_held_clusters"))
            .sum();
        let objects: f64 = texts
            .iter()
            .map(|t| metric_sum(t, "kubesink_objects"))
            .sum();
        if held == units && objects >= pods as f64 {
            std::thread::sleep(Duration::from_secs(3));
            return Ok(());
        }
        for m in members.iter_mut() {
            m.k.proc.check_running()?;
        }
        if Instant::now() > deadline {
            bail!("the group did not settle within {within:?}: {held} of {units} units held, {objects} of {pods} Pods followed");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Patches `count` Pods' labels through the API, `PATCHES_IN_FLIGHT` at once; returns the
/// seconds it took.
async fn churn(cp: &ControlPlane, pods: usize, count: usize, round: usize) -> anyhow::Result<f64> {
    let client = kube_server::client_of(&cp.admin_kubeconfig)
        .await
        .map_err(anyhow::Error::msg)?;
    let started = Instant::now();
    let mut patches = futures::stream::iter(0..count)
        .map(|n| {
            let client = client.clone();
            async move {
                // Spread over every namespace (Pod i lives in NAMESPACES[i % 20]).
                let i = (n * 7919) % pods;
                let ns = NAMESPACES[i % NAMESPACES.len()];
                let name = format!("app-{}-7d4b9c8f6-{i:06}", i % 500);
                let body = serde_json::to_vec(
                    &json!({"metadata": {"labels": {"churn": format!("{round}-{n}")}}}),
                )?;
                let req = http::Request::patch(format!("/api/v1/namespaces/{ns}/pods/{name}"))
                    .header("content-type", "application/merge-patch+json")
                    .body(body)?;
                client
                    .request_text(req)
                    .await
                    .with_context(|| format!("PATCH {ns}/{name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(PATCHES_IN_FLIGHT);
    while let Some(r) = patches.next().await {
        r?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// One setup on `cp`: the group started, settled, a churn window of `patches`, measured.
#[allow(clippy::too_many_arguments)]
fn measure(
    ctx: &Ctx,
    cp: &ControlPlane,
    nats: &Nats,
    setup: &'static str,
    shards: u32,
    replicas: usize,
    pods: usize,
    patches: usize,
    round: usize,
) -> anyhow::Result<Run> {
    let group = format!("shards{round}");
    let mut members = start_group(
        ctx,
        &cp.admin_kubeconfig,
        &nats.url,
        shards,
        replicas,
        &group,
    )?;
    let units = f64::from(shards.max(1));
    settle(&mut members, units, pods, Duration::from_secs(900))?;
    let server = cp.pid("kube-apiserver").context("no kube-apiserver")?;
    let cpu = |pid: u32| procfs::cpu_seconds(pid).unwrap_or(0.0);
    let before: Vec<(f64, f64, f64)> = members
        .iter()
        .map(|m| {
            let t = m.metrics();
            (
                cpu(m.k.proc.pid()),
                read_total(&t),
                metric_sum(&t, "kubesink_shard_foreign_objects_total"),
            )
        })
        .collect();
    let server0 = cpu(server);
    let window_secs = ctx.rt.block_on(churn(cp, pods, patches, round))?;
    // Let the last events arrive before reading the counters.
    std::thread::sleep(Duration::from_secs(2));
    let server_cpu_secs = cpu(server) - server0;
    let replicas = members
        .iter()
        .zip(before)
        .map(|(m, (cpu0, read0, foreign0))| {
            let t = m.metrics();
            Replica {
                identity: m.identity.clone(),
                units: metric_sum(&t, "kubesink_scale_out_held_clusters"),
                objects: metric_sum(&t, "kubesink_objects"),
                rss: procfs::memory(m.k.proc.pid()).map_or(0, |x| x.rss),
                cpu_secs: cpu(m.k.proc.pid()) - cpu0,
                read: read_total(&t) - read0,
                foreign: metric_sum(&t, "kubesink_shard_foreign_objects_total") - foreign0,
            }
        })
        .collect::<Vec<_>>();
    for r in &replicas {
        eprintln!(
            "   {setup}: {} holds {} unit(s), {} Pods, RSS {:.1} MiB; during {patches} patches: CPU {:.2} s, read {}, dropped {}",
            r.identity,
            r.units + 0.0,
            r.objects + 0.0,
            mib(r.rss),
            r.cpu_secs,
            r.read,
            r.foreign
        );
    }
    eprintln!("   {setup}: the API server's CPU during the window {server_cpu_secs:.2} s ({window_secs:.1} s)");
    Ok(Run {
        setup,
        replicas,
        patches,
        window_secs,
        server_cpu_secs,
    })
}

/// The part: a control plane with the gate on (whole cluster, then 4 shards over 4
/// replicas), then one with it off (4 shards over 4 replicas).
pub fn run(ctx: &Ctx, pods: usize, patches: usize) -> anyhow::Result<Report> {
    let nats = Nats::start(ctx.dir.path())?;
    let mut runs = Vec::new();
    for gate in [true, false] {
        eprintln!("== a real kube-apiserver with ShardedListAndWatch={gate}, {pods} Pods");
        let cp = ControlPlane::start(kube_server::Options {
            feature_gates: vec![format!("ShardedListAndWatch={gate}")],
            ..Default::default()
        });
        let namespaces: Vec<String> = NAMESPACES.iter().map(|n| (*n).to_owned()).collect();
        let secs = ctx.rt.block_on(populate_in(&cp, pods, &namespaces, pod))?;
        eprintln!("   {pods} Pods created in {secs:.0} s");
        // (setup, shards, replicas) on this control plane.
        let setups: &[(&'static str, u32, usize)] = match gate {
            true => &[("whole", 1, 1), ("shards, gate on", SHARDS, REPLICAS)],
            false => &[("shards, gate off", SHARDS, REPLICAS)],
        };
        for &(setup, shards, replicas) in setups {
            let round = runs.len();
            runs.push(measure(
                ctx, &cp, &nats, setup, shards, replicas, pods, patches, round,
            )?);
        }
    }
    Ok(Report { pods, runs })
}

/// The part's table (Markdown): a row per replica of each setup.
pub fn markdown(r: &Report) -> String {
    let mut md = format!(
        "\n### One cluster of {} Pods (20 namespaces, 6 / 6 / 3 / 5 per shard) split {SHARDS} ways over {REPLICAS} replicas, on a real kube-apiserver\n\nAfter the group settled, a churn window of Pod label patches through the API. Per replica: the units it holds (a shard, or the whole cluster), the Pods it follows, its RSS after the window, and during the window its CPU, the list items and watch events it read and those it dropped as other shards'.\n\n| setup | replica | units | Pods | RSS (MiB) | CPU in the window (s) | read | dropped | API server CPU (s) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        r.pods
    );
    for run in &r.runs {
        for (i, x) in run.replicas.iter().enumerate() {
            let server = match i {
                0 => format!(
                    "{:.2} ({} patches in {:.1} s)",
                    run.server_cpu_secs, run.patches, run.window_secs
                ),
                _ => String::new(),
            };
            md += &format!(
                "| {} | {} | {} | {} | {:.1} | {:.2} | {} | {} | {server} |\n",
                run.setup,
                x.identity,
                // `+ 0.0`: a sum of no series is -0.
                x.units + 0.0,
                x.objects + 0.0,
                mib(x.rss),
                x.cpu_secs,
                x.read + 0.0,
                x.foreign + 0.0
            );
        }
    }
    md
}

/// The part as JSON.
pub fn json(r: &Report) -> Value {
    json!({
        "pods": r.pods,
        "shards": SHARDS,
        "replicas": REPLICAS,
        "runs": r.runs.iter().map(|run| json!({
            "setup": run.setup,
            "patches": run.patches,
            "window_secs": run.window_secs,
            "server_cpu_secs": run.server_cpu_secs,
            "replicas": run.replicas.iter().map(|x| json!({
                "identity": x.identity,
                "units": x.units,
                "objects": x.objects,
                "rss_bytes": x.rss,
                "cpu_secs": x.cpu_secs,
                "read": x.read,
                "foreign": x.foreign,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
