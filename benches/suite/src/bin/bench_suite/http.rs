//! The HTTP sink into a local receiver: for each `format`, the initial list of the
//! plan's churn pods (objects/s, from kubesink's start to the receiver's 2xx for the last),
//! then the latency from a change (the simulator's write, stamped in an annotation) to the
//! receiver having decoded it, at the plan's churn rate, and the CPU both sides spend per
//! change. The receiver is `tests/receivers`' `ce-receiver` (the CloudEvents Go SDK's HTTP
//! binding decodes every request) writing each event to its stdout, which the bench reads.
//! The OTLP sink runs last, into an OpenTelemetry Collector (`tests/receivers`' `otelcol`).
//! Each format has its own simulator, receiver and kubesink, on the host as it is; the stdout
//! sink runs first as the control (the same churn and clock, no HTTP), so the HTTP rows are
//! read as ratios to it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use kubesink_bench::procs::{spawn, Sim};
use serde_json::{json, Value};

use super::{collect_latency, latency_of, stdout_sink, Ctx, Kubesink, Latency, Plan};

/// The formats measured, in the table's order; `stdout` is the control: the stdout sink,
/// whose lines the bench reads itself, with no HTTP and no receiver.
const FORMATS: [&str; 7] = [
    "stdout",
    "cloudevents",
    "cloudevents-structured",
    "cloudevents-batch",
    "jsonl",
    "otlp",
    "otlp-none",
];

/// One format's run.
pub struct HttpRun {
    /// `format` of the sink.
    pub format: &'static str,
    /// Pods listed.
    pub pods: usize,
    /// Seconds from kubesink's start to every listed pod accepted by the receiver.
    pub sync_secs: f64,
    /// Change → receiver latency during the churn.
    pub lat: Latency,
    /// kubesink's CPU seconds per 10,000 changes during the churn.
    pub cpu_per_10k: f64,
    /// The receiver's CPU seconds per 10,000 changes during the churn.
    pub receiver_cpu_per_10k: f64,
}

fn wait_file(path: &Path, within: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return Ok(text.trim().to_owned());
        }
        if Instant::now() > deadline {
            bail!("{} did not appear within {within:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every format, one after the other.
pub fn runs(ctx: &Ctx, plan: &Plan) -> anyhow::Result<Vec<HttpRun>> {
    let bin = super::built_dir("RECEIVERS_BIN_DIR", "scripts/receivers-build.sh")?;
    let mut out = Vec::new();
    // BENCH_HTTP_FORMATS=stdout,otlp measures some of the formats only (a comparison of builds).
    let only = std::env::var("BENCH_HTTP_FORMATS").ok();
    let wanted = |f: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|w| w.trim() == f))
    };
    for format in FORMATS.into_iter().filter(|f| wanted(f)) {
        let sim = Sim::start(&ctx.bin, plan.churn_pods, ctx.dir.path())?;
        if format == "stdout" {
            let started = Instant::now();
            let mut k = Kubesink::start(ctx, &sim, &stdout_sink(), true, "http-control")?;
            let ms = collect_latency(k.proc.take_stdout().context("stdout")?);
            k.wait_delivered(Some(plan.churn_pods), Duration::from_secs(1800))?;
            let sync_secs = started.elapsed().as_secs_f64();
            out.push(churn(plan, &sim, &k, None, &ms, format, sync_secs)?);
            continue;
        }
        if format.starts_with("otlp") {
            out.push(otlp_run(ctx, plan, &sim, &bin, format)?);
            continue;
        }
        let addr_file = ctx.dir.path().join(format!("receiver-{format}.addr"));
        let mut receiver = spawn(
            "ce-receiver",
            Command::new(bin.join("ce-receiver"))
                .args([
                    "-listen",
                    "127.0.0.1:0",
                    "-out",
                    "/dev/stdout",
                    "-addr-file",
                ])
                .arg(&addr_file)
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        )?;
        let ms = collect_latency(receiver.take_stdout().context("receiver stdout")?);
        let addr = wait_file(&addr_file, Duration::from_secs(20))?;
        let sink = format!(
            "[[sinks]]\ntype = \"http\"\nurl = \"http://{addr}/events\"\nformat = {format:?}\n"
        );
        let started = Instant::now();
        let mut k = Kubesink::start(ctx, &sim, &sink, false, &format!("http-{format}"))?;
        k.wait_delivered(Some(plan.churn_pods), Duration::from_secs(1800))?;
        let sync_secs = started.elapsed().as_secs_f64();
        out.push(churn(
            plan,
            &sim,
            &k,
            Some(receiver.pid()),
            &ms,
            format,
            sync_secs,
        )?);
    }
    Ok(out)
}

/// The OTLP sink into an OpenTelemetry Collector (`tests/receivers`' `otelcol`: the OTLP
/// receiver and the file exporter writing OTLP JSON to its stdout, flushed every 10 ms), whose
/// lines the bench expands into messages with the OTLP destination's reader.
/// `format` `otlp-none` sends without compression (`compression = "none"`): gzip's price.
fn otlp_run(
    ctx: &Ctx,
    plan: &Plan,
    sim: &Sim,
    bin: &Path,
    format: &'static str,
) -> anyhow::Result<HttpRun> {
    let port = kubesink_bench::procs::free_port()?;
    let config = ctx.dir.path().join("otelcol-bench.yaml");
    std::fs::write(
        &config,
        format!("receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\nexporters:\n  file:\n    path: /dev/stdout\n    flush_interval: 10ms\nservice:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    logs:\n      receivers: [otlp]\n      exporters: [file]\n"),
    )?;
    let mut collector = spawn(
        "otelcol",
        Command::new(bin.join("otelcol"))
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    )?;
    let ms = collect_otlp_latency(collector.take_stdout().context("otelcol stdout")?);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("otelcol did not listen on {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let compression = if format == "otlp-none" {
        "compression = \"none\"\n"
    } else {
        ""
    };
    let sink = format!(
        "[[sinks]]\ntype = \"otlp\"\nendpoint = \"http://127.0.0.1:{port}\"\n{compression}"
    );
    let started = Instant::now();
    let mut k = Kubesink::start(ctx, sim, &sink, false, &format!("http-{format}"))?;
    k.wait_delivered(Some(plan.churn_pods), Duration::from_secs(1800))?;
    let sync_secs = started.elapsed().as_secs_f64();
    churn(plan, sim, &k, Some(collector.pid()), &ms, format, sync_secs)
}

/// [`collect_latency`] for OTLP JSON lines (one export request a line, many records): a scan
/// without parsing, so the reader keeps up with the Collector. In each record the body's
/// `type` comes before the object's annotations; a stamp counts when the nearest `type`
/// before it is `ADDED` or `MODIFIED` (a `DELETED` carries the stamp of its last write).
fn collect_otlp_latency(out: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<f64>>> {
    use std::io::BufRead as _;
    const TYPE: &str = "{\"key\":\"type\",\"value\":{\"stringValue\":\"";
    let stamp = format!(
        "{{\"key\":\"{}\",\"value\":{{\"stringValue\":\"",
        kubesink_bench::procs::STAMP
    );
    let ms: Arc<Mutex<Vec<f64>>> = Arc::default();
    let m = ms.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let now = kubesink_bench::procs::now_micros();
            // Every body type and every stamp, by position (one linear pass each).
            let mut marks: Vec<(usize, bool)> = line
                .match_indices(TYPE)
                .map(|(i, _)| (i, true))
                .chain(line.match_indices(&stamp).map(|(i, _)| (i, false)))
                .collect();
            marks.sort_unstable();
            let mut got = Vec::new();
            let mut counted = false;
            for (at, is_type) in marks {
                if is_type {
                    let rest = &line[at + TYPE.len()..];
                    counted = rest.starts_with("ADDED") || rest.starts_with("MODIFIED");
                    continue;
                }
                let rest = &line[at + stamp.len()..];
                let value = rest.split('"').next().and_then(|v| v.parse::<u64>().ok());
                if let (true, Some(v)) = (counted, value) {
                    got.push(now.saturating_sub(v) as f64 / 1000.0);
                }
                counted = false;
            }
            m.lock().unwrap_or_else(|p| p.into_inner()).extend(got);
        }
    });
    ms
}

/// The churn part of a run: latency samples from `ms` (cleared first), CPU of kubesink and of
/// the receiver (`None`: none) per change.
fn churn(
    plan: &Plan,
    sim: &Sim,
    k: &Kubesink,
    receiver: Option<u32>,
    ms: &Arc<Mutex<Vec<f64>>>,
    format: &'static str,
    sync_secs: f64,
) -> anyhow::Result<HttpRun> {
    let pids: Vec<u32> = std::iter::once(k.proc.pid()).chain(receiver).collect();
    let w = super::churn_window(plan, sim, &pids, ms)?;
    let (cpu_per_10k, receiver_cpu_per_10k) = (
        w.cpu_per_10k[0],
        w.cpu_per_10k.get(1).copied().unwrap_or(0.0),
    );
    let (samples, applied, secs) = (w.samples, w.applied, w.secs);
    let lat = latency_of(format, &samples, applied, secs);
    eprintln!(
        "   {format}: initial list {sync_secs:.2} s ({:.0}/s); p50 {:.1} ms, p99 {:.1} ms ({} changes); CPU/10k changes kubesink {cpu_per_10k:.2} s, receiver {receiver_cpu_per_10k:.2} s",
        plan.churn_pods as f64 / sync_secs.max(1e-9),
        lat.p50,
        lat.p99,
        lat.samples
    );
    Ok(HttpRun {
        format,
        pods: plan.churn_pods,
        sync_secs,
        lat,
        cpu_per_10k,
        receiver_cpu_per_10k,
    })
}

/// The Markdown table of the runs.
pub fn markdown(runs: &[HttpRun]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nHTTP sink into a local CloudEvents receiver (the Go SDK's HTTP binding), and the OTLP sink into an OpenTelemetry Collector (OTLP receiver, file exporter); a fresh simulator, receiver and kubesink per row, default options:\n"
    );
    let _ = writeln!(
        s,
        "| format | initial list of {} pods (s) | objects/s | changes/s | p50 ms | p99 ms | max ms | changes | kubesink CPU s / 10k changes | receiver CPU s / 10k changes |",
        runs.first().map_or(0, |r| r.pods)
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {:.2} |",
            match r.format {
                "stdout" => "stdout (control: no HTTP)".to_owned(),
                "otlp" => "OTLP sink (gzip) into an OpenTelemetry Collector".to_owned(),
                "otlp-none" => "OTLP sink, `compression = \"none\"`".to_owned(),
                f => format!("`{f}`"),
            },
            r.sync_secs,
            r.pods as f64 / r.sync_secs.max(1e-9),
            r.lat.rate,
            r.lat.p50,
            r.lat.p99,
            r.lat.max,
            r.lat.samples,
            r.cpu_per_10k,
            r.receiver_cpu_per_10k,
        );
    }
    s
}

/// The runs as JSON.
pub fn json(runs: &[HttpRun]) -> Value {
    json!(runs
        .iter()
        .map(|r| json!({
            "format": r.format,
            "pods": r.pods,
            "sync_secs": r.sync_secs,
            "objects_per_sec": r.pods as f64 / r.sync_secs.max(1e-9),
            "changes_per_sec": r.lat.rate,
            "samples": r.lat.samples,
            "p50_ms": r.lat.p50,
            "p99_ms": r.lat.p99,
            "max_ms": r.lat.max,
            "kubesink_cpu_s_per_10k": r.cpu_per_10k,
            "receiver_cpu_s_per_10k": r.receiver_cpu_per_10k,
        }))
        .collect::<Vec<_>>())
}
