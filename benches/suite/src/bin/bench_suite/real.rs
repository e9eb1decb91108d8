//! Scale on a real kube-apiserver (`bench-suite --only real-server`): Pods
//! created through the API into etcd (a kube-apiserver and etcd built from their Go modules,
//! `tests/kube/`, started as the real-server tests start them: `tests/support/kube_server.rs`),
//! then one initial sync by kubesink with streaming lists and one with paged lists, each
//! after a fresh API server start (its watch cache filled from etcd, then settled), and the
//! same two syncs of as many Pods on the simulator, side by side in one run:
//!
//! - kubesink: sync time (process start to every object delivered and `kubesink_synced`),
//!   peak RSS (`VmHWM`), steady RSS (mean of the second half of the quiet time after the
//!   sync), CPU seconds (user + system, start to the end of the quiet time);
//! - the server: RSS before kubesink started (settled, watch cache full) and the highest
//!   sampled during the sync, CPU seconds during the sync (and above its rate in the 5 s of
//!   quiet just before: a Go heap of gigabytes goes on collecting after the start), and
//!   (real server) etcd's CPU;
//! - the requests the server counted (`apiserver_request_total` by verb for pods; the
//!   simulator's own counters).
//!
//! Each server is synced four times, streaming, paged, paged, streaming (ABBA), so that
//! neither strategy always runs first after the start, and each figure shows both.
//!
//! No kubelet or scheduler runs (Pods stay Pending) and no controller-manager (the `default`
//! ServiceAccounts are created here): the Pods are what a watcher of topology reads. Their
//! JSON is measured (bytes per Pod of a 500-Pod page, managedFields included) beside the
//! simulator's, which are larger: compare the ratios, not the absolute figures.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use kubesink_bench::http::request;
use kubesink_bench::procfs::{self, Sampler};
use kubesink_bench::procs::Sim;
use kubesink_bench::stats::mib;
use serde_json::{json, Value};

use super::kube_server::{self, ControlPlane};
use super::{Ctx, Kubesink};

/// Namespaces the Pods are spread over (as the simulator runs of the suite).
pub(super) const NAMESPACES: usize = 20;

/// The order of the syncs of each server (ABBA).
const ORDER: [&str; 4] = ["stream", "list", "list", "stream"];

/// Pod creations in flight at once.
const CREATES_IN_FLIGHT: usize = 48;

/// More configuration of a sync's kubesink: keys of its `[[resources]]` entry and of
/// `[watch]`, what its files' names get, and how many kubesinks sync at once (0 or 1: one;
/// more: the server's CPU is for all of them, kubesink's figures the first one's).
#[derive(Default)]
pub(super) struct Extra {
    pub resource: &'static str,
    pub watch: &'static str,
    pub name: &'static str,
    pub clients: usize,
}

/// One initial sync of one server with one strategy.
pub struct Run {
    /// `kube-apiserver` or `simulator`.
    pub server: &'static str,
    /// `stream` or `list`.
    pub strategy: &'static str,
    /// The server's CPU seconds per second in the 5 s before kubesink started.
    pub server_idle_cpu_rate: f64,
    pub pods: usize,
    pub sync_secs: f64,
    pub kubesink_peak: u64,
    pub kubesink_steady: u64,
    pub kubesink_cpu_secs: f64,
    pub server_rss_before: u64,
    pub server_rss_peak: u64,
    pub server_cpu_secs: f64,
    /// etcd's CPU seconds during the sync (the real server only).
    pub etcd_cpu_secs: Option<f64>,
    pub list_requests: f64,
    pub watch_requests: f64,
}

/// The whole part: the Pods' creation and every run.
pub struct Report {
    pub pods: usize,
    /// Seconds to create the Pods through the API, and the rate.
    pub create_secs: f64,
    /// JSON bytes per Pod as each server serves them (a page of up to 500).
    pub real_bytes_per_pod: f64,
    pub sim_bytes_per_pod: f64,
    pub etcd_rss: u64,
    pub runs: Vec<Run>,
}

/// A Pod as a ReplicaSet of a Deployment makes it (labels, owner, two containers with ports,
/// environment, resources, probes and mounts); the server adds the service-account token
/// volume, default tolerations, managedFields and the Pending status.
pub(super) fn pod(namespace: &str, i: usize) -> Value {
    let app = format!("app-{}", i % 500);
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{app}-7d4b9c8f6-{i:06}"),
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": "7d4b9c8f6", "tier": "backend", "team": format!("team-{}", i % 17)},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090", "kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-7d4b9c8f6"), "uid": "3f1c2b9e-6a5d-4c1e-9b7a-2d8e4f6a1c3b", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": format!("registry.example.com/{app}:1.{}.{}", i % 7, i % 13),
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}, {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                    "env": [
                        {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "DATABASE_URL", "value": "postgres://db.example.internal:5432/app"}
                    ],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}},
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "initialDelaySeconds": 15},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]
                },
                {
                    "name": "sidecar",
                    "image": "registry.example.com/proxy:2.4.1",
                    "args": ["--listen=:15001", "--upstream=127.0.0.1:8080"],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}
                }
            ],
            "volumes": [{"name": "config", "configMap": {"name": format!("{app}-config")}}],
            "terminationGracePeriodSeconds": 30
        }
    })
}

/// Creates `NAMESPACES` namespaces, their `default` ServiceAccounts and `pods` Pods through
/// the API; returns the seconds it took.
pub(super) async fn populate(cp: &ControlPlane, pods: usize) -> anyhow::Result<f64> {
    populate_with(cp, pods, pod).await
}

/// [`populate`] with Pod `i` of namespace `ns` made by `make(ns, i)`.
pub(super) async fn populate_with(
    cp: &ControlPlane,
    pods: usize,
    make: fn(&str, usize) -> Value,
) -> anyhow::Result<f64> {
    let namespaces: Vec<String> = (0..NAMESPACES).map(|n| format!("bench-{n}")).collect();
    populate_in(cp, pods, &namespaces, make).await
}

/// [`populate_with`] over the namespaces `namespaces` (Pod `i` in `namespaces[i % len]`).
pub(super) async fn populate_in(
    cp: &ControlPlane,
    pods: usize,
    namespaces: &[String],
    make: fn(&str, usize) -> Value,
) -> anyhow::Result<f64> {
    let client = kube_server::client_of(&cp.admin_kubeconfig)
        .await
        .map_err(anyhow::Error::msg)?;
    let started = Instant::now();
    for ns in namespaces {
        post(
            &client,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await?;
        post(
            &client,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        )
        .await?;
    }
    let mut done = 0usize;
    let mut creates = futures::stream::iter(0..pods)
        .map(|i| {
            let client = client.clone();
            async move {
                let ns = &namespaces[i % namespaces.len()];
                post(
                    &client,
                    &format!("/api/v1/namespaces/{ns}/pods"),
                    make(ns, i),
                )
                .await
            }
        })
        .buffer_unordered(CREATES_IN_FLIGHT);
    while let Some(r) = creates.next().await {
        r?;
        done += 1;
        if done.is_multiple_of(10_000) {
            eprintln!(
                "   {done} Pods created ({:.0}/s)",
                done as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// POSTs `body` to `path`; a 409 (exists already) counts as done. Retries a 429 or 5xx.
pub(super) async fn post(client: &kube::Client, path: &str, body: Value) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec(&body)?;
    for attempt in 0..10u32 {
        let req = http::Request::post(path)
            .header("content-type", "application/json")
            .body(bytes.clone())?;
        match client.request_text(req).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 429 || s.code >= 500 => {
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(5))).await;
            }
            Err(e) => bail!("POST {path}: {e}"),
        }
    }
    bail!("POST {path}: still refused after 10 attempts")
}

/// JSON bytes per Pod of the first page of up to 500 Pods served by `client`'s server.
async fn bytes_per_pod(client: &kube::Client) -> anyhow::Result<f64> {
    let req = http::Request::get("/api/v1/pods?limit=500").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let items = serde_json::from_str::<Value>(&text)?["items"]
        .as_array()
        .map_or(0, Vec::len);
    if items == 0 {
        bail!("the server listed no Pods");
    }
    Ok(text.len() as f64 / items as f64)
}

/// Pods requests: (LIST, WATCH). `apiserver_request_total` counts a request when it ends,
/// so a watch still open (the streaming list's, kubesink's watch) is counted from
/// `apiserver_longrunning_requests`, the gauge of the requests in progress.
pub(super) async fn pod_requests(cp: &ControlPlane) -> (f64, f64) {
    let by_verb = cp.requests_by_verb("", "pods").await;
    let open = cp
        .metric(
            "apiserver_longrunning_requests",
            &[("verb", "WATCH"), ("resource", "pods")],
        )
        .await;
    (
        by_verb.get("LIST").copied().unwrap_or(0.0),
        by_verb.get("WATCH").copied().unwrap_or(0.0) + open,
    )
}

/// kubesink's sync of the server at `kubeconfig` with `strategy`, the server process
/// `server_pid` observed (and etcd's, when given); `requests` reads the server's (LIST,
/// WATCH) counters.
#[allow(clippy::too_many_arguments)]
pub(super) fn sync_once(
    ctx: &Ctx,
    server: &'static str,
    kubeconfig: &std::path::Path,
    strategy: &'static str,
    extra: &Extra,
    pods: usize,
    steady: Duration,
    server_pid: u32,
    etcd_pid: Option<u32>,
    mut requests: impl FnMut() -> anyhow::Result<(f64, f64)>,
) -> anyhow::Result<Run> {
    let idle0 = procfs::cpu_seconds(server_pid).unwrap_or(0.0);
    std::thread::sleep(Duration::from_secs(5));
    let server_cpu0 = procfs::cpu_seconds(server_pid).unwrap_or(0.0);
    let server_idle_cpu_rate = (server_cpu0 - idle0) / 5.0;
    let server_before = procfs::memory(server_pid).context("server gone")?.rss;
    let etcd_cpu0 = etcd_pid.and_then(procfs::cpu_seconds);
    let (lists0, watches0) = requests()?;
    let server_sampler = Sampler::start(server_pid, Duration::from_millis(50));
    let text = format!(
        "[cluster]\nname = \"bench\"\nkubeconfig = {:?}\n\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n{}\n[[sinks]]\ntype = \"stdout\"\n\n[watch]\ninitial_list = \"{strategy}\"\n{}",
        kubeconfig.display().to_string(),
        extra.resource,
        extra.watch,
    );
    let mut others = Vec::new();
    for i in 1..extra.clients.max(1) {
        others.push(Kubesink::start_text(
            ctx,
            &text,
            false,
            &format!("real-{server}-{strategy}{}-{i}", extra.name),
        )?);
    }
    let mut k = Kubesink::start_text(
        ctx,
        &text,
        false,
        &format!("real-{server}-{strategy}{}", extra.name),
    )?;
    let sampler = Sampler::start(k.proc.pid(), Duration::from_millis(50));
    for o in others.iter_mut().chain(std::iter::once(&mut k)) {
        o.wait_delivered(Some(pods), Duration::from_secs(1800))?;
        o.wait_delivered(None, Duration::from_secs(600))?;
    }
    let sync_secs = sampler.elapsed();
    drop(others);
    let server_cpu = procfs::cpu_seconds(server_pid).unwrap_or(0.0) - server_cpu0;
    let etcd_cpu = etcd_pid
        .and_then(procfs::cpu_seconds)
        .zip(etcd_cpu0)
        .map(|(b, a)| b - a);
    let server_samples = server_sampler.stop();
    let (lists1, watches1) = requests()?;
    std::thread::sleep(steady);
    let kubesink_cpu = procfs::cpu_seconds(k.proc.pid()).unwrap_or(0.0);
    let mem = procfs::memory(k.proc.pid()).context("kubesink gone")?;
    let samples = sampler.stop();
    let from = sync_secs + steady.as_secs_f64() / 2.0;
    let run = Run {
        server,
        strategy,
        server_idle_cpu_rate,
        pods,
        sync_secs,
        kubesink_peak: mem.hwm,
        kubesink_steady: procfs::mean_rss_since(&samples, from).unwrap_or(mem.rss as f64) as u64,
        kubesink_cpu_secs: kubesink_cpu,
        server_rss_before: server_before,
        server_rss_peak: server_samples
            .iter()
            .map(|s| s.rss)
            .max()
            .unwrap_or(server_before),
        server_cpu_secs: server_cpu,
        etcd_cpu_secs: etcd_cpu,
        list_requests: lists1 - lists0,
        watch_requests: watches1 - watches0,
    };
    eprintln!(
        "   {server} {strategy}: synced in {:.1} s, kubesink peak {:.1} MiB, steady {:.1} MiB, CPU {:.2} s; server RSS {:.0} → {:.0} MiB, CPU {:.2} s (idle rate {:.2}/s); {} LIST, {} WATCH",
        run.sync_secs,
        mib(run.kubesink_peak),
        mib(run.kubesink_steady),
        run.kubesink_cpu_secs,
        mib(run.server_rss_before),
        mib(run.server_rss_peak),
        run.server_cpu_secs,
        run.server_idle_cpu_rate,
        run.list_requests,
        run.watch_requests
    );
    Ok(run)
}

/// Creates `pods` Pods on a real control plane, then syncs it and a simulator of as many
/// Pods with streaming and paged lists; `settle` is the quiet time after an API server start
/// before its RSS is read, `steady` the quiet time after each sync.
pub fn run(ctx: &Ctx, pods: usize, settle: Duration, steady: Duration) -> anyhow::Result<Report> {
    eprintln!("== a real kube-apiserver and etcd (tests/kube, built by scripts/kube-build.sh)");
    let cp = ControlPlane::start(kube_server::Options::default());
    eprintln!("== creating {pods} Pods through the API");
    let create_secs = ctx.rt.block_on(populate(&cp, pods))?;
    eprintln!(
        "   {pods} Pods in {create_secs:.0} s ({:.0}/s)",
        pods as f64 / create_secs
    );
    let mut runs = Vec::new();
    let mut real_bytes_per_pod = 0.0;
    for strategy in ORDER {
        // A fresh API server each time: its watch cache filled from etcd, nothing served yet.
        cp.restart_apiserver();
        let client = ctx
            .rt
            .block_on(kube_server::client_of(&cp.admin_kubeconfig))
            .map_err(anyhow::Error::msg)?;
        real_bytes_per_pod = ctx.rt.block_on(bytes_per_pod(&client))?;
        std::thread::sleep(settle);
        let pid = cp.pid("kube-apiserver").context("no kube-apiserver")?;
        runs.push(sync_once(
            ctx,
            "kube-apiserver",
            &cp.admin_kubeconfig,
            strategy,
            &Extra::default(),
            pods,
            steady,
            pid,
            cp.pid("etcd"),
            || Ok(ctx.rt.block_on(pod_requests(&cp))),
        )?);
    }
    let etcd_rss = cp.pid("etcd").and_then(procfs::memory).map_or(0, |m| m.rss);
    drop(cp);
    let mut sim_bytes_per_pod = 0.0;
    for strategy in ORDER {
        let sim = Sim::start_with(
            &ctx.bin,
            &format!("real-compare-{strategy}"),
            &[
                "--pods",
                &pods.to_string(),
                "--namespaces",
                &NAMESPACES.to_string(),
            ],
            ctx.dir.path(),
        )?;
        let page = request(sim.addr, "GET", "/api/v1/pods?limit=500")?;
        let items = serde_json::from_str::<Value>(&page)?["items"]
            .as_array()
            .map_or(0, Vec::len);
        sim_bytes_per_pod = page.len() as f64 / items.max(1) as f64;
        request(sim.addr, "POST", "/_sim/reset-stats")?;
        std::thread::sleep(settle);
        let counts = || -> anyhow::Result<(f64, f64)> {
            let stats = sim.stats()?;
            let c = &stats["requestCounts"]["byResource"]["pods"];
            Ok((
                c["lists"].as_f64().unwrap_or(0.0),
                c["watches"].as_f64().unwrap_or(0.0),
            ))
        };
        runs.push(sync_once(
            ctx,
            "simulator",
            &sim.kubeconfig,
            strategy,
            &Extra::default(),
            pods,
            steady,
            sim.proc.pid(),
            None,
            counts,
        )?);
    }
    Ok(Report {
        pods,
        create_secs,
        real_bytes_per_pod,
        sim_bytes_per_pod,
        etcd_rss,
        runs,
    })
}

/// The part's table (Markdown).
pub fn markdown(r: &Report) -> String {
    let col = |server: &str, strategy: &str| -> Vec<&Run> {
        r.runs
            .iter()
            .filter(|x| x.server == server && x.strategy == strategy)
            .collect()
    };
    let cols = [
        col("kube-apiserver", "stream"),
        col("kube-apiserver", "list"),
        col("simulator", "stream"),
        col("simulator", "list"),
    ];
    let row = |name: &str, f: &dyn Fn(&Run) -> String| {
        let cells: Vec<String> = cols
            .iter()
            .map(|runs| match runs.is_empty() {
                true => "—".to_owned(),
                false => runs.iter().map(|r| f(r)).collect::<Vec<_>>().join(" / "),
            })
            .collect();
        format!("| {name} | {} |\n", cells.join(" | "))
    };
    let mut md = format!(
        "\n### {} Pods on a real kube-apiserver and on the simulator\n\nCreated through the API in {:.0} s ({:.0} Pods/s, {CREATES_IN_FLIGHT} in flight). JSON per Pod as served: kube-apiserver {:.0} bytes, simulator {:.0} bytes. etcd RSS at the end: {:.0} MiB.\n\nEach cell: the first and the second sync of that kind (order streaming, paged, paged, streaming after each server start).\n\n| | kube-apiserver, streaming list | kube-apiserver, paged lists | simulator, streaming list | simulator, paged lists |\n|---|---:|---:|---:|---:|\n",
        r.pods,
        r.create_secs,
        r.pods as f64 / r.create_secs,
        r.real_bytes_per_pod,
        r.sim_bytes_per_pod,
        mib(r.etcd_rss)
    );
    md += &row("initial sync (s)", &|r| format!("{:.1}", r.sync_secs));
    md += &row("kubesink peak RSS (MiB)", &|r| {
        format!("{:.1}", mib(r.kubesink_peak))
    });
    md += &row("kubesink steady RSS (MiB)", &|r| {
        format!("{:.1}", mib(r.kubesink_steady))
    });
    md += &row("kubesink CPU (s)", &|r| {
        format!("{:.2}", r.kubesink_cpu_secs)
    });
    md += &row("server RSS before (MiB)", &|r| {
        format!("{:.0}", mib(r.server_rss_before))
    });
    md += &row("server RSS peak during the sync (MiB)", &|r| {
        format!("{:.0}", mib(r.server_rss_peak))
    });
    md += &row("server RSS growth (MiB)", &|r| {
        format!(
            "{:.0}",
            mib(r.server_rss_peak.saturating_sub(r.server_rss_before))
        )
    });
    md += &row("server CPU during the sync (s)", &|r| {
        format!("{:.2}", r.server_cpu_secs)
    });
    md += &row("server CPU above its idle rate (s)", &|r| {
        format!(
            "{:.2}",
            r.server_cpu_secs - r.server_idle_cpu_rate * r.sync_secs
        )
    });
    md += &row("etcd CPU during the sync (s)", &|r| {
        r.etcd_cpu_secs
            .map_or_else(|| "—".to_owned(), |c| format!("{c:.2}"))
    });
    md += &row("LIST requests (pods)", &|r| {
        format!("{:.0}", r.list_requests)
    });
    md += &row("WATCH requests (pods)", &|r| {
        format!("{:.0}", r.watch_requests)
    });
    md
}

/// Every figure of the part (JSON).
pub fn json(r: &Report) -> Value {
    json!({
        "pods": r.pods,
        "create_secs": r.create_secs,
        "real_bytes_per_pod": r.real_bytes_per_pod,
        "sim_bytes_per_pod": r.sim_bytes_per_pod,
        "etcd_rss_bytes": r.etcd_rss,
        "runs": r.runs.iter().map(|x| json!({
            "server": x.server,
            "strategy": x.strategy,
            "pods": x.pods,
            "sync_secs": x.sync_secs,
            "kubesink_peak_bytes": x.kubesink_peak,
            "kubesink_steady_bytes": x.kubesink_steady,
            "kubesink_cpu_secs": x.kubesink_cpu_secs,
            "server_rss_before_bytes": x.server_rss_before,
            "server_rss_peak_bytes": x.server_rss_peak,
            "server_cpu_secs": x.server_cpu_secs,
            "server_idle_cpu_rate": x.server_idle_cpu_rate,
            "etcd_cpu_secs": x.etcd_cpu_secs,
            "list_requests": x.list_requests,
            "watch_requests": x.watch_requests,
        })).collect::<Vec<_>>(),
    })
}
