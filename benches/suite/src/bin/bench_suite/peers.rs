//! Side by side with the Go peers on a real kube-apiserver (issue 39; `bench-suite --only
//! peers`): kubesink (its whole payload, and `payload = "metadata"`) and three client-go techniques (`benches/peers`, built by
//! `scripts/peers-build.sh`: the seed's lightweight informer as Lyft Clutch builds it, the
//! metadata-only informer, the shared informer over whole Pods), one program at a time against
//! the same control plane (`tests/kube/`) and the same Pods, created through the API:
//!
//! - **initial sync and steady state**: each program started after a fresh API server start
//!   (its watch cache filled from etcd, settled); sync time (start to every Pod handed to the
//!   handler: kubesink's sink confirmed them and `kubesink_synced`; a peer printed `synced N`
//!   once its handler registration synced), peak RSS (`VmHWM`), steady RSS (mean of the second
//!   half of the quiet time after the sync), CPU seconds (start to the end of the quiet time),
//!   the API server's CPU during the sync and its highest RSS, its LIST and WATCH requests;
//! - **a gap**: each program synced, stopped (SIGTERM), `gap` Pods deleted and `gap` created
//!   while it is down, started again and synced: the deletes it delivered for the Pods deleted
//!   while down, the adds for the Pods created, and what it sent again of the Pods that did not
//!   change (kubesink with its file state; the peers have no saved state).
//!
//! Each program's handler does what a bridge does before it sends: kubesink encodes its
//! message to stdout (written to /dev/null, or a file in the gap runs); a peer serializes the
//! object to JSON and appends one line per event to a file. No kubelet or scheduler runs (Pods
//! stay Pending), so the steady state is quiet.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use kubesink_bench::http::{metric_sum, request};
use kubesink_bench::procfs::{self, Sampler};
use kubesink_bench::procs::{spawn, Proc};
use kubesink_bench::stats::mib;
use serde_json::{json, Value};

use super::kube_server::{self, ControlPlane};
use super::real::{self, NAMESPACES};
use super::{watch_lines, Ctx, Kubesink};

/// The programs, in the order they run (each after a fresh API server start).
pub const PROGRAMS: [&str; 5] = [
    "kubesink",
    "kubesink-metadata",
    "lightweight",
    "metadata",
    "full",
];

/// Whether `program` is kubesink (its whole payload, or `payload = "metadata"`).
fn is_kubesink(program: &str) -> bool {
    program.starts_with("kubesink")
}

/// What each program is, for the tables.
pub fn describe(program: &str) -> &'static str {
    match program {
        "kubesink" => "kubesink (lightweight store: key, uid, resourceVersion, fingerprint)",
        "kubesink-metadata" => {
            "kubesink, `payload = \"metadata\"` (asks for `PartialObjectMetadata`, as the metadata informer does)"
        }
        "lightweight" => "the seed's technique (Clutch's LightweightInformer on client-go)",
        "metadata" => "client-go metadata-only informer (metadatainformer)",
        "full" => "client-go shared informer, whole Pods",
        _ => "?",
    }
}

/// One program's initial sync and steady state.
pub struct Sync {
    pub program: &'static str,
    pub pods: usize,
    pub sync_secs: f64,
    pub peak: u64,
    pub steady: u64,
    pub cpu_secs: f64,
    pub server_rss_before: u64,
    pub server_rss_peak: u64,
    pub server_cpu_secs: f64,
    pub lists: f64,
    pub watches: f64,
}

/// One program's restart after a gap.
pub struct Gap {
    pub program: &'static str,
    /// Pods deleted, and created, while it was down.
    pub changed: usize,
    /// Deletes it delivered for the Pods deleted while down.
    pub deletes: usize,
    /// Adds it delivered for the Pods created while down.
    pub adds: usize,
    /// Events it delivered after the restart for Pods that did not change.
    pub resent: usize,
    /// Every event after the restart.
    pub events: usize,
    pub sync_secs: f64,
}

/// The whole part.
pub struct Report {
    pub pods: usize,
    pub create_secs: f64,
    pub syncs: Vec<Sync>,
    pub gaps: Vec<Gap>,
}

/// A running program and how to tell it synced.
enum Running {
    Kubesink(Kubesink),
    Peer {
        proc: Proc,
        lines: Arc<Mutex<Vec<String>>>,
    },
}

impl Running {
    fn pid(&self) -> u32 {
        match self {
            Running::Kubesink(k) => k.proc.pid(),
            Running::Peer { proc, .. } => proc.pid(),
        }
    }

    /// Waits until the program handed every object of its initial list on (`pods` at
    /// least, when given).
    fn wait_synced(&mut self, pods: Option<usize>, within: Duration) -> anyhow::Result<()> {
        match self {
            Running::Kubesink(k) => match pods {
                Some(n) => {
                    k.wait_delivered(Some(n), within)?;
                    k.wait_delivered(None, within)
                }
                // After a restart with saved state only the differences are sent: synced
                // once `kubesink_synced` and nothing is pending or in flight.
                None => {
                    let deadline = std::time::Instant::now() + within;
                    loop {
                        let text = request(k.metrics, "GET", "/metrics").unwrap_or_default();
                        if metric_sum(&text, "kubesink_synced") >= 1.0
                            && metric_sum(&text, "kubesink_sink_pending_messages") == 0.0
                            && metric_sum(&text, "kubesink_sink_batches_in_flight") == 0.0
                        {
                            return Ok(());
                        }
                        k.proc.check_running()?;
                        if std::time::Instant::now() > deadline {
                            bail!("kubesink not synced and drained within {within:?}");
                        }
                        std::thread::sleep(Duration::from_millis(25));
                    }
                }
            },
            Running::Peer { proc, lines } => {
                super::wait_line(proc, lines, "synced ", within)?;
                let n = lines
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .find_map(|l| l.strip_prefix("synced ")?.parse::<usize>().ok())
                    .unwrap_or(0);
                if let Some(want) = pods {
                    if n < want {
                        bail!("{} synced with {n} events, not {want}", proc.name);
                    }
                }
                Ok(())
            }
        }
    }

    /// SIGTERM, and the clean exit it must make.
    fn stop(self) -> anyhow::Result<()> {
        let (mut proc, name) = match self {
            Running::Kubesink(k) => (k.proc, "kubesink"),
            Running::Peer { proc, .. } => (proc, "peer"),
        };
        match proc.terminate(Duration::from_secs(60))? {
            Some(s) if s.success() => Ok(()),
            Some(s) => bail!("{name} exited with {s} after SIGTERM"),
            None => bail!("{name} did not exit within 60 s of SIGTERM"),
        }
    }
}

/// Starts `program` on the cluster of `kubeconfig`, its events to `out` (kubesink: its
/// stdout; `None`: /dev/null), kubesink's state in `state` when given.
fn start(
    ctx: &Ctx,
    peers: &Path,
    program: &'static str,
    kubeconfig: &Path,
    out: Option<&Path>,
    state: Option<&Path>,
    run: &str,
) -> anyhow::Result<Running> {
    if is_kubesink(program) {
        let payload = if program == "kubesink-metadata" {
            "payload = \"metadata\"\n"
        } else {
            ""
        };
        let state = state.map_or(String::new(), |p| {
            format!(
                "\n[state]\nbackend = \"file\"\npath = {:?}\n",
                p.display().to_string()
            )
        });
        let text = format!(
            "[cluster]\nname = \"bench\"\nkubeconfig = {:?}\n\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n{payload}\n[[sinks]]\ntype = \"stdout\"\n{state}",
            kubeconfig.display().to_string()
        );
        let stdout = match out {
            Some(p) => Stdio::from(std::fs::File::create(p)?),
            None => Stdio::null(),
        };
        return Ok(Running::Kubesink(Kubesink::start_text_to(
            ctx,
            &text,
            stdout,
            &format!("peers-{run}"),
        )?));
    }
    let scratch = ctx.dir.path().join(format!("peer-{run}.events"));
    let out = out.unwrap_or(&scratch);
    let log = std::fs::File::create(ctx.dir.path().join(format!("peer-{run}.log")))?;
    let mut proc = spawn(
        &format!("peer-informer --mode {program}"),
        Command::new(peers.join("peer-informer"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--mode", program, "--out"])
            .arg(out)
            .stdout(Stdio::piped())
            .stderr(log),
    )?;
    let lines = watch_lines(proc.take_stdout().context("stdout")?);
    Ok(Running::Peer { proc, lines })
}

/// One program's initial sync and quiet time, after a fresh API server start.
fn sync_once(
    ctx: &Ctx,
    cp: &ControlPlane,
    peers: &Path,
    program: &'static str,
    pods: usize,
    settle: Duration,
    steady: Duration,
) -> anyhow::Result<Sync> {
    cp.restart_apiserver();
    std::thread::sleep(settle);
    let server = cp.pid("kube-apiserver").context("no kube-apiserver")?;
    let server_before = procfs::memory(server).context("kube-apiserver gone")?.rss;
    let server_cpu0 = procfs::cpu_seconds(server).unwrap_or(0.0);
    let (lists0, watches0) = ctx.rt.block_on(real::pod_requests(cp));
    let server_sampler = Sampler::start(server, Duration::from_millis(50));
    let mut p = start(
        ctx,
        peers,
        program,
        &cp.admin_kubeconfig,
        None,
        None,
        &format!("sync-{program}"),
    )?;
    let sampler = Sampler::start(p.pid(), Duration::from_millis(50));
    p.wait_synced(Some(pods), Duration::from_secs(1800))?;
    let sync_secs = sampler.elapsed();
    let server_cpu = procfs::cpu_seconds(server).unwrap_or(0.0) - server_cpu0;
    let server_samples = server_sampler.stop();
    let (lists1, watches1) = ctx.rt.block_on(real::pod_requests(cp));
    std::thread::sleep(steady);
    let cpu = procfs::cpu_seconds(p.pid()).unwrap_or(0.0);
    let mem = procfs::memory(p.pid()).context("the program exited")?;
    let samples = sampler.stop();
    p.stop()?;
    let from = sync_secs + steady.as_secs_f64() / 2.0;
    let s = Sync {
        program,
        pods,
        sync_secs,
        peak: mem.hwm,
        steady: procfs::mean_rss_since(&samples, from).unwrap_or(mem.rss as f64) as u64,
        cpu_secs: cpu,
        server_rss_before: server_before,
        server_rss_peak: server_samples
            .iter()
            .map(|s| s.rss)
            .max()
            .unwrap_or(server_before),
        server_cpu_secs: server_cpu,
        lists: lists1 - lists0,
        watches: watches1 - watches0,
    };
    eprintln!(
        "   {program}: synced in {:.1} s, peak {:.1} MiB, steady {:.1} MiB, CPU {:.2} s; server RSS {:.0} → {:.0} MiB, CPU {:.2} s; {} LIST, {} WATCH",
        s.sync_secs,
        mib(s.peak),
        mib(s.steady),
        s.cpu_secs,
        mib(s.server_rss_before),
        mib(s.server_rss_peak),
        s.server_cpu_secs,
        s.lists,
        s.watches
    );
    Ok(s)
}

/// The (op, namespace/name) of each event a program wrote to `out`.
fn events(program: &str, out: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text =
        std::fs::read_to_string(out).with_context(|| format!("reading {}", out.display()))?;
    let mut all = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if is_kubesink(program) {
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("{}: not a message: {line:.200}", out.display()))?;
            let op = v["op"].as_str().unwrap_or_default();
            if op == "synced" {
                continue;
            }
            let key = format!(
                "{}/{}",
                v["namespace"].as_str().unwrap_or_default(),
                v["name"].as_str().unwrap_or_default()
            );
            all.push((op.to_owned(), key));
        } else {
            let mut f = line.split('\t');
            let (Some(op), Some(key)) = (f.next(), f.next()) else {
                bail!("{}: not an event line: {line:.200}", out.display());
            };
            all.push((op.to_owned(), key.to_owned()));
        }
    }
    Ok(all)
}

/// Pod `i`'s `namespace/name`, as `real::populate` names it.
fn pod_key(i: usize) -> (String, String) {
    let ns = format!("bench-{}", i % NAMESPACES);
    let name = real::pod(&ns, i)["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (ns, name)
}

/// One program's gap: synced, stopped, `gap` Pods deleted (the lowest numbers still there)
/// and `gap` created, started again and synced. `next` is the first free Pod number and
/// `live` the lowest live one; both move on.
#[allow(clippy::too_many_arguments)]
fn gap_once(
    ctx: &Ctx,
    cp: &ControlPlane,
    peers: &Path,
    program: &'static str,
    gap: usize,
    live: &mut usize,
    next: &mut usize,
    settle: Duration,
) -> anyhow::Result<Gap> {
    let dir = ctx.dir.path().join(format!("gap-{program}"));
    std::fs::create_dir_all(&dir)?;
    let state = dir.join("state");
    let first = dir.join("first.out");
    let mut p = start(
        ctx,
        peers,
        program,
        &cp.admin_kubeconfig,
        Some(&first),
        Some(&state),
        &format!("gap1-{program}"),
    )?;
    p.wait_synced(None, Duration::from_secs(1800))?;
    std::thread::sleep(settle);
    p.stop()?;
    let client = ctx
        .rt
        .block_on(kube_server::client_of(&cp.admin_kubeconfig))
        .map_err(anyhow::Error::msg)?;
    let deleted: Vec<String> = (*live..*live + gap)
        .map(|i| {
            let (ns, name) = pod_key(i);
            format!("{ns}/{name}")
        })
        .collect();
    let created: Vec<String> = (*next..*next + gap)
        .map(|i| {
            let (ns, name) = pod_key(i);
            format!("{ns}/{name}")
        })
        .collect();
    ctx.rt.block_on(async {
        for i in *live..*live + gap {
            let (ns, name) = pod_key(i);
            let req = http::Request::delete(format!("/api/v1/namespaces/{ns}/pods/{name}"))
                .header("content-type", "application/json")
                .body(br#"{"gracePeriodSeconds":0}"#.to_vec())?;
            client
                .request_text(req)
                .await
                .with_context(|| format!("deleting {ns}/{name}"))?;
        }
        for i in *next..*next + gap {
            let ns = format!("bench-{}", i % NAMESPACES);
            real::post(
                &client,
                &format!("/api/v1/namespaces/{ns}/pods"),
                real::pod(&ns, i),
            )
            .await?;
        }
        anyhow::Ok(())
    })?;
    *live += gap;
    *next += gap;
    let second = dir.join("second.out");
    let mut p = start(
        ctx,
        peers,
        program,
        &cp.admin_kubeconfig,
        Some(&second),
        Some(&state),
        &format!("gap2-{program}"),
    )?;
    let started = std::time::Instant::now();
    p.wait_synced(None, Duration::from_secs(1800))?;
    let sync_secs = started.elapsed().as_secs_f64();
    std::thread::sleep(settle);
    p.stop()?;
    let after = events(program, &second)?;
    let deleted: std::collections::HashSet<&str> = deleted.iter().map(String::as_str).collect();
    let created: std::collections::HashSet<&str> = created.iter().map(String::as_str).collect();
    let g = Gap {
        program,
        changed: gap,
        deletes: after
            .iter()
            .filter(|(op, k)| op == "deleted" && deleted.contains(k.as_str()))
            .count(),
        adds: after
            .iter()
            .filter(|(op, k)| op == "added" && created.contains(k.as_str()))
            .count(),
        resent: after
            .iter()
            .filter(|(_, k)| !deleted.contains(k.as_str()) && !created.contains(k.as_str()))
            .count(),
        events: after.len(),
        sync_secs,
    };
    eprintln!(
        "   {program}: after a gap of {gap} deletes and {gap} creates: {} deletes, {} adds, {} unchanged Pods re-sent ({} events, synced in {:.1} s)",
        g.deletes, g.adds, g.resent, g.events, g.sync_secs
    );
    Ok(g)
}

/// The peers' bin directory: `PEERS_BIN_DIR`, else what `scripts/peers-build.sh` builds.
fn peers_bin() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("PEERS_BIN_DIR") {
        return Ok(PathBuf::from(d));
    }
    let script = std::env::current_dir()?
        .ancestors()
        .map(|d| d.join("scripts/peers-build.sh"))
        .find(|p| p.exists())
        .context(
            "scripts/peers-build.sh not found above the working directory (or set PEERS_BIN_DIR)",
        )?;
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", script.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// Creates `pods` Pods on a real control plane, then runs every program's sync and gap.
pub fn run(
    ctx: &Ctx,
    pods: usize,
    gap: usize,
    settle: Duration,
    steady: Duration,
) -> anyhow::Result<Report> {
    let peers = peers_bin()?;
    eprintln!("== the Go peers: {}", peers.display());
    eprintln!("== a real kube-apiserver and etcd (tests/kube, built by scripts/kube-build.sh)");
    let cp = ControlPlane::start(kube_server::Options::default());
    eprintln!("== creating {pods} Pods through the API");
    let create_secs = ctx.rt.block_on(real::populate(&cp, pods))?;
    eprintln!("== initial sync and steady state, one program at a time");
    let mut syncs = Vec::new();
    for program in PROGRAMS {
        syncs.push(sync_once(ctx, &cp, &peers, program, pods, settle, steady)?);
    }
    eprintln!("== a gap: each program stopped while {gap} Pods are deleted and {gap} created");
    let (mut live, mut next) = (0, pods);
    let mut gaps = Vec::new();
    for program in PROGRAMS {
        gaps.push(gap_once(
            ctx, &cp, &peers, program, gap, &mut live, &mut next, settle,
        )?);
    }
    Ok(Report {
        pods,
        create_secs,
        syncs,
        gaps,
    })
}

/// The part's tables (Markdown).
pub fn markdown(r: &Report) -> String {
    let mut s = format!(
        "\n## Side by side with the Go peers on a real kube-apiserver ({} Pods)\n\n\
         kube-apiserver and etcd of `tests/kube` (v1.37.2), the peers of `benches/peers` \
         (client-go v0.37.2), one program at a time after a fresh API server start; {} Pods \
         created through the API in {:.0} s. Ratios are to kubesink's figure in this run.\n\n\
         | program | sync (s) | peak RSS (MiB) | steady RSS (MiB) | steady ÷ kubesink | CPU (s) | CPU ÷ kubesink | API server CPU (s) | API server RSS peak (MiB) | LIST | WATCH |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        r.pods, r.pods, r.create_secs
    );
    let base = r.syncs.iter().find(|x| x.program == "kubesink");
    for x in &r.syncs {
        let (rss_ratio, cpu_ratio) = base.map_or((f64::NAN, f64::NAN), |b| {
            (
                x.steady as f64 / b.steady.max(1) as f64,
                x.cpu_secs / b.cpu_secs.max(1e-9),
            )
        });
        s += &format!(
            "| {} | {:.1} | {:.1} | {:.1} | {rss_ratio:.2}× | {:.2} | {cpu_ratio:.2}× | {:.2} | {:.0} | {} | {} |\n",
            describe(x.program),
            x.sync_secs,
            mib(x.peak),
            mib(x.steady),
            x.cpu_secs,
            x.server_cpu_secs,
            mib(x.server_rss_peak),
            x.lists,
            x.watches
        );
    }
    if let Some(g) = r.gaps.first() {
        s += &format!(
            "\n**A gap**: each program stopped (SIGTERM) while {n} Pods were deleted and {n} \
             created, then started again (kubesink with `state.backend = \"file\"`; the peers \
             have no saved state).\n\n\
             | program | deletes delivered | adds delivered | unchanged Pods re-sent | events | sync after the restart (s) |\n\
             |---|---:|---:|---:|---:|---:|\n",
            n = g.changed
        );
        for g in &r.gaps {
            s += &format!(
                "| {} | {} of {} | {} of {} | {} | {} | {:.1} |\n",
                describe(g.program),
                g.deletes,
                g.changed,
                g.adds,
                g.changed,
                g.resent,
                g.events,
                g.sync_secs
            );
        }
    }
    s
}

/// The part's figures (JSON).
pub fn json(r: &Report) -> Value {
    json!({
        "pods": r.pods,
        "create_secs": r.create_secs,
        "syncs": r.syncs.iter().map(|x| json!({
            "program": x.program, "pods": x.pods, "sync_secs": x.sync_secs,
            "peak_bytes": x.peak, "steady_bytes": x.steady, "cpu_secs": x.cpu_secs,
            "server_rss_before_bytes": x.server_rss_before, "server_rss_peak_bytes": x.server_rss_peak,
            "server_cpu_secs": x.server_cpu_secs, "lists": x.lists, "watches": x.watches,
        })).collect::<Vec<_>>(),
        "gaps": r.gaps.iter().map(|g| json!({
            "program": g.program, "changed": g.changed, "deletes": g.deletes, "adds": g.adds,
            "resent": g.resent, "events": g.events, "sync_secs": g.sync_secs,
        })).collect::<Vec<_>>(),
    })
}
