//! Side by side with the Go peers on a real kube-apiserver (`bench-suite --only
//! peers`): kubesink (its whole payload, and `payload = "metadata"`), four client-go
//! techniques (`benches/peers`, built by `scripts/peers-build.sh`: the seed's lightweight
//! informer as Lyft Clutch writes it for Pods and the same improved, the metadata-only
//! informer, the shared informer over whole Pods) and an OpenTelemetry Collector, one program
//! at a time against the same control plane (`tests/kube/`) and the same Pods, created
//! through the API:
//!
//! - **initial sync and steady state**: each program started after a fresh API server start
//!   (its watch cache filled from etcd, settled); sync time (start to every Pod handed to the
//!   handler: kubesink's sink confirmed them and `kubesink_synced`; a peer printed `synced N`
//!   once its handler registration synced), peak RSS (`VmHWM`), steady RSS (mean of the second
//!   half of the quiet time after the sync), CPU seconds (start to the end of the quiet time),
//!   the API server's CPU during the sync and its highest RSS, its LIST and WATCH requests;
//! - **churn**: each program started and synced, its watch open, then a settle time of quiet
//!   (so that the churn is not measured in the wake of the sync's CPU burst), then Pods
//!   patched at each of [`CHURN_RATES`]: change → handled latency, CPU per change;
//! - **runs**: the sync and the churn are measured `runs` times, the programs' order rotated
//!   each run (run `k` starts at program `k mod len`); the tables show each figure's median
//!   and its min–max, the JSON every run's values;
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
use kubesink_bench::procs::{now_micros, spawn, stamp_of, Proc, STAMP};
use kubesink_bench::stats::{mib, percentile};
use serde_json::{json, Value};

use super::kube_server::{self, ControlPlane};
use super::real::{self, NAMESPACES};
use super::{watch_lines, Ctx, Kubesink};

/// The programs, in the order they run (each after a fresh API server start; rotated in the
/// later runs).
pub const PROGRAMS: [&str; 7] = [
    "kubesink",
    "kubesink-metadata",
    "clutch",
    "lightweight",
    "metadata",
    "full",
    "k8sobjects",
];

/// Every `LARGE_EVERY`th Pod carries an annotation of `LARGE_BYTES` bytes (5% of the Pods: what
/// tools that keep a manifest, a build record or a sidecar's status in an annotation leave).
pub const LARGE_EVERY: usize = 20;
/// The size of the large annotation, in bytes.
pub const LARGE_BYTES: usize = 32 * 1024;
const LARGE_ANNOTATION: &str = "bench.kubesink.io/build-record";

/// The churn rates (changes/s) asked for, one after the other on one start of each program.
pub const CHURN_RATES: [f64; 2] = [200.0, 1_000.0];

/// How long the churn waits, after its last write, for a program that does not receive
/// updates ([`receives_updates`]) to hand on what it may: it cannot reach the count of the
/// changes applied, so the wait ends on time alone.
pub const NO_UPDATES_WAIT: Duration = Duration::from_secs(10);

/// (stamp, handled, out), Unix microseconds: the churn's write time read from the object's
/// annotation; the time the program handled the change (a client-go peer: its handler ran;
/// kubesink: the message's `observedAt`, millisecond resolution; the Collector: the record's
/// `observedTimeUnixNano`, set by the receiver's watch callback); the time the suite read the
/// change from the program's output (kubesink's stdout, the Collector's file exporter; 0 for
/// the peers, which write to a file the suite reads after).
type Stamps = Arc<Mutex<Vec<(u64, u64, u64)>>>;

/// kubesink's stamped messages by `key@resourceVersion`: (stamp, `observedAt`), Unix
/// microseconds. Matched after a churn with the arrival of each watch event, which kubesink
/// logs at DEBUG (target `kubesink::arrival`, `src/informer/emit.rs`), to split its latency
/// into the way to kubesink (write → arrival: the API server and the network) and the time
/// inside it (arrival → `observedAt`).
type Arrivals = Arc<Mutex<std::collections::HashMap<String, (u64, u64)>>>;

/// The value of `"name":"…"` in a JSON line (its first occurrence; no escapes in it).
fn json_str<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\":\"");
    let at = line.find(&key)? + key.len();
    let rest = line.get(at..)?;
    rest.get(..rest.find('"')?)
}

/// The arrivals kubesink logged (`watch event arrived key=… resource_version=…
/// arrived_us=…`), by `key@resourceVersion`, in Unix microseconds.
fn logged_arrivals(log: &Path) -> std::collections::HashMap<String, u64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let field = |line: &str, name: &str| -> Option<String> {
        let key = format!(" {name}=");
        let at = line.find(&key)? + key.len();
        let rest = line.get(at..)?;
        Some(rest.split_whitespace().next()?.trim_matches('"').to_owned())
    };
    text.lines()
        .filter(|l| l.contains("watch event arrived"))
        .filter_map(|l| {
            let key = field(l, "key")?;
            let rv = field(l, "resource_version")?;
            let at = field(l, "arrived_us")?.parse().ok()?;
            Some((format!("{key}@{rv}"), at))
        })
        .collect()
}

/// `observedAt` of a message line (RFC 3339), in Unix microseconds.
fn observed_at(line: &str) -> Option<u64> {
    const KEY: &str = "\"observedAt\":\"";
    let at = line.find(KEY)? + KEY.len();
    let text = line[at..].split('"').next()?;
    let t = humantime::parse_rfc3339(text).ok()?;
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_micros() as u64)
}

/// Whether `program` is kubesink (its whole payload, or `payload = "metadata"`).
fn is_kubesink(program: &str) -> bool {
    program.starts_with("kubesink")
}

/// Whether `program` hands on a change to an object it already knows. Lyft Clutch's Pod
/// informer (`clutch`) does not: `startInformers` passes `recieveUpdates = false` for Pods
/// (`benches/peers/cmd/peer-informer/main.go`, `clutch`).
pub fn receives_updates(program: &str) -> bool {
    program != "clutch"
}

/// What each program is, for the tables.
pub fn describe(program: &str) -> &'static str {
    match program {
        "kubesink" => "kubesink (lightweight store: key, uid, resourceVersion, fingerprint)",
        "kubesink-metadata" => {
            "kubesink, `payload = \"metadata\"` (asks for `PartialObjectMetadata`, as the metadata informer does)"
        }
        "clutch" => {
            "the seed's technique as written (Lyft Clutch's Pod `LightweightInformer`: RESTClient ListWatch, JSON, no updates)"
        }
        "lightweight" => {
            "the seed's technique improved (same store; typed clientset, protobuf; updates forwarded)"
        }
        "metadata" => "client-go metadata-only informer (metadatainformer)",
        "full" => "client-go shared informer, whole Pods",
        "k8sobjects" => {
            "OpenTelemetry Collector, `k8sobjects` receiver (watch, initial state) → file exporter"
        }
        _ => "?",
    }
}

/// A Pod as [`real::pod`] makes it; every [`LARGE_EVERY`]th with a [`LARGE_BYTES`] annotation.
fn peer_pod(namespace: &str, i: usize) -> Value {
    let mut pod = real::pod(namespace, i);
    if i.is_multiple_of(LARGE_EVERY) {
        let filler: String = (0..LARGE_BYTES)
            .map(|k| char::from(b'a' + ((i + k * 7) % 26) as u8))
            .collect();
        pod["metadata"]["annotations"][LARGE_ANNOTATION] = Value::String(filler);
    }
    pod
}

/// One program's initial sync and steady state.
pub struct Sync {
    pub program: &'static str,
    /// The run (0-based).
    pub run: usize,
    /// The program's place (0-based) in that run's order.
    pub position: usize,
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
    /// The program's RSS from its start to the end of the quiet time (the plot).
    pub samples: Vec<procfs::Sample>,
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

/// One program under one churn rate.
pub struct Churn {
    pub program: &'static str,
    /// The run (0-based).
    pub run: usize,
    /// The program's place (0-based) in that run's order.
    pub position: usize,
    /// The rate asked for (changes/s).
    pub target: f64,
    /// Changes the API server accepted, and the rate it took them at.
    pub applied: usize,
    pub rate: f64,
    /// Changes the program handed on (its stamp seen), within the drain time (for a program
    /// that does not receive updates, within [`NO_UPDATES_WAIT`]).
    pub delivered: usize,
    /// Change → handled by the program (see [`Stamps`]), milliseconds.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Change → read from the program's output by the suite (kubesink, the Collector; NaN
    /// for the peers), milliseconds.
    pub out_p50_ms: f64,
    pub out_p99_ms: f64,
    /// kubesink only (NaN for the others): change → the watch event's arrival in kubesink
    /// (the API server and the network), and arrival → `observedAt` (kubesink), ms.
    pub arrival_p50_ms: f64,
    pub arrival_p99_ms: f64,
    pub inside_p50_ms: f64,
    pub inside_p99_ms: f64,
    /// The program's CPU seconds per 10,000 applied changes (from the first change to the
    /// last delivered).
    pub cpu_per_10k: f64,
    /// The API server's CPU seconds per 10,000 applied changes over the same time.
    pub server_cpu_per_10k: f64,
}

/// The whole part.
pub struct Report {
    pub pods: usize,
    pub create_secs: f64,
    /// Every run's syncs, run after run.
    pub syncs: Vec<Sync>,
    pub gaps: Vec<Gap>,
    /// Every run's churns, run after run.
    pub churns: Vec<Churn>,
    pub churn_secs: f64,
    /// How many times the sync and the churn were measured.
    pub runs: usize,
    /// The quiet time between a program's sync and its churn.
    pub churn_settle: Duration,
}

impl Report {
    /// Every run's churn of `program` at `target` writes/s.
    fn churns_of(&self, program: &str, target: f64) -> Vec<&Churn> {
        self.churns
            .iter()
            .filter(|c| c.program == program && c.target == target)
            .collect()
    }
}

/// A running program and how to tell it synced.
struct Running {
    kind: Kind,
    /// kubesink's messages under churn by `key@resourceVersion`: (the change's stamp, its
    /// `observedAt`), Unix microseconds, to be matched with the arrival its log gives.
    arrivals: Option<Arrivals>,
    /// Threads reading its output; stopped and joined by [`Running::stop`].
    readers: Vec<std::thread::JoinHandle<()>>,
    done: Arc<std::sync::atomic::AtomicBool>,
}

enum Kind {
    Kubesink(Kubesink),
    Peer {
        proc: Proc,
        lines: Arc<Mutex<Vec<String>>>,
    },
    /// The Collector: its file exporter writes to stdout, read by a thread that counts the
    /// records and writes them down as a peer's event lines; synced once `expect` records
    /// came.
    Collector {
        proc: Proc,
        records: Arc<std::sync::atomic::AtomicUsize>,
        expect: usize,
    },
}

impl Running {
    fn pid(&self) -> u32 {
        match &self.kind {
            Kind::Kubesink(k) => k.proc.pid(),
            Kind::Peer { proc, .. } | Kind::Collector { proc, .. } => proc.pid(),
        }
    }

    /// Waits until the program handed every object of its initial list on (`pods` at
    /// least, when given).
    fn wait_synced(&mut self, pods: Option<usize>, within: Duration) -> anyhow::Result<()> {
        match &mut self.kind {
            Kind::Kubesink(k) => match pods {
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
            Kind::Peer { proc, lines } => {
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
            Kind::Collector {
                proc,
                records,
                expect,
            } => {
                let want = pods.unwrap_or(*expect);
                let deadline = std::time::Instant::now() + within;
                while records.load(std::sync::atomic::Ordering::Relaxed) < want {
                    proc.check_running()?;
                    if std::time::Instant::now() > deadline {
                        bail!(
                            "the Collector wrote {} records, not {want}, within {within:?}",
                            records.load(std::sync::atomic::Ordering::Relaxed)
                        );
                    }
                    std::thread::sleep(Duration::from_millis(25));
                }
                Ok(())
            }
        }
    }

    /// SIGTERM, and the clean exit it must make; then its output readers are finished.
    fn stop(self) -> anyhow::Result<()> {
        let (mut proc, name) = match self.kind {
            Kind::Kubesink(k) => (k.proc, "kubesink"),
            Kind::Peer { proc, .. } => (proc, "peer"),
            Kind::Collector { proc, .. } => (proc, "otelcol-k8sobjects"),
        };
        let exit = proc.terminate(Duration::from_secs(60))?;
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in self.readers {
            let _ = r.join();
        }
        match exit {
            Some(s) if s.success() => Ok(()),
            Some(s) => bail!("{name} exited with {s} after SIGTERM"),
            None => bail!("{name} did not exit within 60 s of SIGTERM"),
        }
    }
}

/// Reads kubesink's stdout: every added or updated message with a stamp goes into `stamps`,
/// with its `observedAt` and the time it was read.
fn kubesink_reader(
    out: impl std::io::Read + Send + 'static,
    stamps: Stamps,
    arrivals: Arrivals,
) -> std::thread::JoinHandle<()> {
    use std::io::BufRead as _;
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let now = now_micros();
            if let Some(at) = stamp_of(&line) {
                if line.contains("\"op\":\"added\"") || line.contains("\"op\":\"updated\"") {
                    let handled = observed_at(&line).unwrap_or(now);
                    stamps
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((at, handled, now));
                    if let Some((key, rv)) =
                        json_str(&line, "key").zip(json_str(&line, "resourceVersion"))
                    {
                        arrivals
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(format!("{key}@{rv}"), (at, handled));
                    }
                }
            }
        }
    })
}

/// Follows a peer's event file (its writer flushes every 100 ms) until `done`: every added or
/// updated line with a stamp goes into `stamps`, with the time the handler ran.
fn peer_tail(
    path: PathBuf,
    stamps: Stamps,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    use std::io::{Read as _, Seek as _};
    std::thread::spawn(move || {
        let (mut offset, mut partial) = (0u64, String::new());
        loop {
            let finished = done.load(std::sync::atomic::Ordering::Relaxed);
            if let Ok(mut f) = std::fs::File::open(&path) {
                let mut chunk = String::new();
                if f.seek(std::io::SeekFrom::Start(offset)).is_ok()
                    && f.read_to_string(&mut chunk).is_ok()
                {
                    offset += chunk.len() as u64;
                    partial.push_str(&chunk);
                    let complete = partial.rfind('\n').map_or(0, |i| i + 1);
                    let mut got = Vec::new();
                    for line in partial[..complete].lines() {
                        let f: Vec<&str> = line.split('\t').collect();
                        if f.len() >= 6 && (f[0] == "added" || f[0] == "updated") {
                            if let (Ok(at), Ok(handled)) = (f[4].parse(), f[5].parse()) {
                                got.push((at, handled, 0));
                            }
                        }
                    }
                    partial.drain(..complete);
                    stamps.lock().unwrap_or_else(|p| p.into_inner()).extend(got);
                }
            }
            if finished {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// The string value that follows `{"key":"KEY","value":{"stringValue":"` in `line`, from `at`.
fn otlp_string<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let marker = format!("{{\"key\":\"{key}\",\"value\":{{\"stringValue\":\"");
    let at = line.find(&marker)? + marker.len();
    line[at..].split('"').next()
}

/// The first `observedTimeUnixNano` of `line`, in Unix microseconds.
fn observed_nanos(line: &str) -> Option<u64> {
    const KEY: &str = "\"observedTimeUnixNano\":\"";
    let at = line.find(KEY)? + KEY.len();
    let nanos: u64 = line[at..].split('"').next()?.parse().ok()?;
    Some(nanos / 1000)
}

/// The records of one line of the Collector's file exporter (OTLP JSON, one export request a
/// line; the k8sobjects receiver hands each watch event on alone, so a line holds one
/// record): (op, namespace/name, stamp, observed time in Unix microseconds). A scan, not a
/// parse, so that the reader keeps up; a line with more than one record is parsed whole.
fn otlp_records(line: &str) -> Vec<(&'static str, String, Option<u64>, Option<u64>)> {
    const TYPE: &str = "{\"key\":\"type\",\"value\":{\"stringValue\":\"";
    let op_of = |t: &str| match t {
        "ADDED" => Some("added"),
        "MODIFIED" => Some("updated"),
        "DELETED" => Some("deleted"),
        _ => None,
    };
    let types: Vec<&'static str> = line
        .match_indices(TYPE)
        .filter_map(|(i, _)| op_of(line[i + TYPE.len()..].split('"').next()?))
        .collect();
    if types.len() == 1 {
        let key = format!(
            "{}/{}",
            otlp_string(line, "k8s.namespace.name").unwrap_or_default(),
            otlp_string(line, "event.name").unwrap_or_default()
        );
        let stamp = otlp_string(line, STAMP).and_then(|v| v.parse().ok());
        return vec![(types[0], key, stamp, observed_nanos(line))];
    }
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        return Vec::new();
    };
    let kv = |values: &Value, key: &str| -> Option<Value> {
        values
            .as_array()?
            .iter()
            .find(|e| e["key"] == key)
            .map(|e| e["value"].clone())
    };
    let mut all = Vec::new();
    for rl in v["resourceLogs"].as_array().into_iter().flatten() {
        let ns = kv(&rl["resource"]["attributes"], "k8s.namespace.name")
            .and_then(|v| v["stringValue"].as_str().map(str::to_owned))
            .unwrap_or_default();
        for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
            for r in sl["logRecords"].as_array().into_iter().flatten() {
                let body = &r["body"]["kvlistValue"]["values"];
                let Some(op) = kv(body, "type").and_then(|t| op_of(t["stringValue"].as_str()?))
                else {
                    continue;
                };
                let name = kv(&r["attributes"], "event.name")
                    .and_then(|v| v["stringValue"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let stamp = kv(body, "object")
                    .and_then(|o| kv(&o["kvlistValue"]["values"], "metadata"))
                    .and_then(|m| kv(&m["kvlistValue"]["values"], "annotations"))
                    .and_then(|a| kv(&a["kvlistValue"]["values"], STAMP))
                    .and_then(|s| s["stringValue"].as_str()?.parse().ok());
                let observed = r["observedTimeUnixNano"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(|n| n / 1000);
                all.push((op, format!("{ns}/{name}"), stamp, observed));
            }
        }
    }
    all
}

/// Reads the Collector's stdout (its file exporter's output): counts the records, writes each
/// down in `file` as a peer's event line (the time read as the time handled), and puts
/// every stamped add or update into `stamps` when given.
fn collector_reader(
    out: impl std::io::Read + Send + 'static,
    file: PathBuf,
    records: Arc<std::sync::atomic::AtomicUsize>,
    stamps: Option<Stamps>,
) -> std::thread::JoinHandle<()> {
    use std::io::{BufRead as _, Write as _};
    std::thread::spawn(move || {
        let Ok(f) = std::fs::File::create(&file) else {
            eprintln!("   cannot write {}", file.display());
            return;
        };
        let mut w = std::io::BufWriter::new(f);
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let now = now_micros();
            for (op, key, stamp, observed) in otlp_records(&line) {
                let shown = stamp.map_or_else(|| "-".to_owned(), |s| s.to_string());
                let _ = writeln!(w, "{op}\t{key}\t-\t-\t{shown}\t{now}");
                if let (Some(at), Some(stamps), true) = (stamp, &stamps, op != "deleted") {
                    stamps.lock().unwrap_or_else(|p| p.into_inner()).push((
                        at,
                        observed.unwrap_or(now),
                        now,
                    ));
                }
                records.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _ = w.flush();
    })
}

/// Starts the Collector peer (`otelcol-k8sobjects`, benches/peers/otelcol) with the receiver
/// `receiver` and its `settings` (YAML lines indented under it), its logs handed to the file
/// exporter on its stdout (piped), its own log to `log`; the configuration is written to
/// `config`.
pub(super) fn start_collector(
    peers: &Path,
    kubeconfig: &Path,
    config: &Path,
    receiver: &str,
    settings: &str,
    log: std::fs::File,
) -> anyhow::Result<Proc> {
    std::fs::write(
        config,
        format!(
            "receivers:\n  {receiver}:\n{settings}\
             exporters:\n  file:\n    path: /dev/stdout\n    flush_interval: 10ms\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    logs:\n      receivers: [{receiver}]\n      exporters: [file]\n"
        ),
    )?;
    spawn(
        &format!("otelcol-k8sobjects ({receiver})"),
        Command::new(peers.join("otelcol-k8sobjects"))
            .env("KUBECONFIG", kubeconfig)
            .arg("--config")
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(log),
    )
}

/// Starts `program` on the cluster of `kubeconfig` (`pods` Pods live), its events to `out`
/// (kubesink: its stdout; `None`: /dev/null, or a scratch file for the peers), kubesink's
/// state in `state` when given; with `stamps`, every stamped change it hands on is recorded
/// there (kubesink's stdout is then read by the suite, not written to `out`).
#[allow(clippy::too_many_arguments)]
fn start(
    ctx: &Ctx,
    peers: &Path,
    program: &'static str,
    kubeconfig: &Path,
    pods: usize,
    out: Option<&Path>,
    state: Option<&Path>,
    stamps: Option<&Stamps>,
    run: &str,
) -> anyhow::Result<Running> {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
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
        let stdout = match (stamps, out) {
            (Some(_), _) => Stdio::piped(),
            (None, Some(p)) => Stdio::from(std::fs::File::create(p)?),
            (None, None) => Stdio::null(),
        };
        // Under churn, each watch event's arrival is logged beside its observedAt.
        let log = if stamps.is_some() {
            "warn,kubesink::arrival=debug"
        } else {
            "warn"
        };
        let mut k = Kubesink::start_text_logged(ctx, &text, stdout, &format!("peers-{run}"), log)?;
        let mut arrivals = None;
        if let Some(stamps) = stamps {
            let out = k.proc.take_stdout().context("kubesink stdout")?;
            let found = Arrivals::default();
            readers.push(kubesink_reader(out, stamps.clone(), found.clone()));
            arrivals = Some(found);
        }
        return Ok(Running {
            arrivals,
            kind: Kind::Kubesink(k),
            readers,
            done,
        });
    }
    let scratch = ctx.dir.path().join(format!("peer-{run}.events"));
    let out = out.unwrap_or(&scratch);
    let log = std::fs::File::create(ctx.dir.path().join(format!("peer-{run}.log")))?;
    if program == "k8sobjects" {
        let mut proc = start_collector(
            peers,
            kubeconfig,
            &ctx.dir.path().join(format!("otelcol-{run}.yaml")),
            "k8sobjects",
            "    auth_type: kubeConfig\n    include_initial_state: true\n    objects:\n      - name: pods\n        mode: watch\n",
            log,
        )?;
        let records = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stdout = proc.take_stdout().context("otelcol stdout")?;
        readers.push(collector_reader(
            stdout,
            out.to_owned(),
            records.clone(),
            stamps.cloned(),
        ));
        return Ok(Running {
            arrivals: None,
            kind: Kind::Collector {
                proc,
                records,
                expect: pods,
            },
            readers,
            done,
        });
    }
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
    if let Some(stamps) = stamps {
        readers.push(peer_tail(out.to_owned(), stamps.clone(), done.clone()));
    }
    Ok(Running {
        arrivals: None,
        kind: Kind::Peer { proc, lines },
        readers,
        done,
    })
}

/// One program's initial sync and quiet time, after a fresh API server start; `run` and
/// `position` are written down with it.
#[allow(clippy::too_many_arguments)]
fn sync_once(
    ctx: &Ctx,
    cp: &ControlPlane,
    peers: &Path,
    program: &'static str,
    pods: usize,
    settle: Duration,
    steady: Duration,
    (run, position): (usize, usize),
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
        pods,
        None,
        None,
        None,
        &format!("sync-{program}-{run}"),
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
        run,
        position,
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
        samples,
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
    let live_pods = *next - *live;
    let mut p = start(
        ctx,
        peers,
        program,
        &cp.admin_kubeconfig,
        live_pods,
        Some(&first),
        Some(&state),
        None,
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
                peer_pod(&ns, i),
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
        live_pods,
        Some(&second),
        Some(&state),
        None,
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

/// Stamps Pods `cursor, cursor + 1, …` (wrapping over `live..next`) with the write time at
/// `rate` changes/s for `secs` seconds: a merge PATCH of the [`STAMP`] annotation, 64 in
/// flight at most. Returns the changes the API server accepted and the seconds they took.
async fn stamp_pods(
    client: &kube::Client,
    live: usize,
    next: usize,
    cursor: &mut usize,
    rate: f64,
    secs: f64,
) -> anyhow::Result<(usize, f64)> {
    use futures::StreamExt as _;
    let total = (rate * secs) as usize;
    let span = (next - live).max(1);
    let first = *cursor;
    *cursor += total;
    let started = tokio::time::Instant::now();
    let mut writes = std::pin::pin!(futures::stream::iter(0..total)
        .then(|k| async move {
            tokio::time::sleep_until(started + Duration::from_secs_f64(k as f64 / rate)).await;
            k
        })
        .map(|k| {
            let client = client.clone();
            async move {
                let (ns, name) = pod_key(live + (first + k) % span);
                let body = json!({"metadata": {"annotations": {STAMP: now_micros().to_string()}}});
                let req = http::Request::patch(format!("/api/v1/namespaces/{ns}/pods/{name}"))
                    .header("content-type", "application/merge-patch+json")
                    .body(serde_json::to_vec(&body)?)?;
                client
                    .request_text(req)
                    .await
                    .with_context(|| format!("patching {ns}/{name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(64));
    let mut applied = 0;
    while let Some(r) = writes.next().await {
        if let Err(e) = r {
            eprintln!("   a churn write failed: {e:#}");
        } else {
            applied += 1;
        }
    }
    Ok((applied, started.elapsed().as_secs_f64()))
}

/// One program under churn: started and synced (its watch open), `settle` of quiet, then
/// each of [`CHURN_RATES`] for `secs` seconds; per rate the changes applied, those delivered
/// within `drain` (a program that does not receive updates: within [`NO_UPDATES_WAIT`]), the
/// change → delivered latency and the CPU per 10,000 changes of the program and of the API
/// server; `run` and `position` are written down with each rate's row.
#[allow(clippy::too_many_arguments)]
fn churn_once(
    ctx: &Ctx,
    cp: &ControlPlane,
    peers: &Path,
    program: &'static str,
    live: usize,
    next: usize,
    cursor: &mut usize,
    secs: f64,
    drain: Duration,
    settle: Duration,
    (run, position): (usize, usize),
) -> anyhow::Result<Vec<Churn>> {
    let stamps: Stamps = Arc::default();
    let open_watches = || {
        ctx.rt.block_on(cp.metric(
            "apiserver_longrunning_requests",
            &[("verb", "WATCH"), ("resource", "pods")],
        ))
    };
    let watches0 = open_watches();
    let out = ctx.dir.path().join(format!("churn-{program}-{run}.out"));
    let mut p = start(
        ctx,
        peers,
        program,
        &cp.admin_kubeconfig,
        next - live,
        Some(&out),
        None,
        Some(&stamps),
        &format!("churn-{program}-{run}"),
    )?;
    p.wait_synced(Some(next - live), Duration::from_secs(1800))?;
    // Changes made before the program's watch is open would be missed by a program that lists
    // and then watches from a later resourceVersion (the Collector's receiver does).
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while open_watches() < watches0 + 1.0 {
        if std::time::Instant::now() > deadline {
            bail!("{program} opened no watch of Pods within 600 s of its sync");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Quiet before the first change, so that the churn is not measured in the wake of the
    // sync's CPU burst (the program's, the API server's, the collector's of either).
    std::thread::sleep(settle);
    let client = ctx
        .rt
        .block_on(kube_server::client_of(&cp.admin_kubeconfig))
        .map_err(anyhow::Error::msg)?;
    let server = cp.pid("kube-apiserver").context("no kube-apiserver")?;
    let mut rows = Vec::new();
    for target in CHURN_RATES {
        let seen = |from: u64, to: u64| -> Vec<(u64, u64, u64)> {
            stamps
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(at, _, _)| (from..to).contains(at))
                .copied()
                .collect()
        };
        let cpu0 = procfs::cpu_seconds(p.pid()).unwrap_or(0.0);
        let server_cpu0 = procfs::cpu_seconds(server).unwrap_or(0.0);
        let from = now_micros();
        let (applied, took) = ctx
            .rt
            .block_on(stamp_pods(&client, live, next, cursor, target, secs))?;
        let to = now_micros();
        if receives_updates(program) {
            let deadline = std::time::Instant::now() + drain;
            while seen(from, to).len() < applied && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        } else {
            // It drops every change to a Pod it knows: no count to wait for, only time.
            std::thread::sleep(NO_UPDATES_WAIT);
        }
        let cpu = procfs::cpu_seconds(p.pid()).unwrap_or(0.0) - cpu0;
        let server_cpu = procfs::cpu_seconds(server).unwrap_or(0.0) - server_cpu0;
        let got = seen(from, to);
        let ms: Vec<f64> = got
            .iter()
            .map(|(at, handled, _)| handled.saturating_sub(*at) as f64 / 1000.0)
            .collect();
        let out_ms: Vec<f64> = got
            .iter()
            .filter(|(_, _, out)| *out > 0)
            .map(|(at, _, out)| out.saturating_sub(*at) as f64 / 1000.0)
            .collect();
        let per_10k = |c: f64| c / applied.max(1) as f64 * 10_000.0;
        // kubesink: its log's arrivals matched with its messages of this rate's changes.
        let (mut before, mut inside) = (Vec::new(), Vec::new());
        if let Some(arrivals) = &p.arrivals {
            let logged = logged_arrivals(
                &ctx.dir
                    .path()
                    .join(format!("kubesink-peers-churn-{program}-{run}.log")),
            );
            let ours = arrivals.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for (id, (at, observed)) in ours.iter().filter(|(_, (at, _))| (from..to).contains(at)) {
                if let Some(arrived) = logged.get(id) {
                    before.push(arrived.saturating_sub(*at) as f64 / 1000.0);
                    inside.push(observed.saturating_sub(*arrived) as f64 / 1000.0);
                }
            }
        }
        let nan = |v: &[f64], p| percentile(v, p).unwrap_or(f64::NAN);
        let row = Churn {
            program,
            run,
            position,
            target,
            applied,
            rate: applied as f64 / took.max(1e-9),
            delivered: ms.len(),
            p50_ms: percentile(&ms, 50.0).unwrap_or(f64::NAN),
            p99_ms: percentile(&ms, 99.0).unwrap_or(f64::NAN),
            max_ms: percentile(&ms, 100.0).unwrap_or(f64::NAN),
            out_p50_ms: percentile(&out_ms, 50.0).unwrap_or(f64::NAN),
            out_p99_ms: percentile(&out_ms, 99.0).unwrap_or(f64::NAN),
            arrival_p50_ms: nan(&before, 50.0),
            arrival_p99_ms: nan(&before, 99.0),
            inside_p50_ms: nan(&inside, 50.0),
            inside_p99_ms: nan(&inside, 99.0),
            cpu_per_10k: per_10k(cpu),
            server_cpu_per_10k: per_10k(server_cpu),
        };
        eprintln!(
            "   {program} (run {}) at {target:.0}/s asked: {} changes at {:.0}/s, {} delivered, handled p50 {:.1} ms, p99 {:.1} ms, max {:.0} ms; out p50 {:.1} ms, p99 {:.1} ms; CPU/10k changes {:.2} s (API server {:.2} s)",
            run + 1, row.applied, row.rate, row.delivered, row.p50_ms, row.p99_ms, row.max_ms, row.out_p50_ms, row.out_p99_ms, row.cpu_per_10k, row.server_cpu_per_10k
        );
        rows.push(row);
    }
    p.stop()?;
    Ok(rows)
}

/// The programs in run `k`'s order: [`PROGRAMS`] rotated to start at program `k mod len`.
fn order(k: usize) -> impl Iterator<Item = &'static str> {
    (0..PROGRAMS.len()).map(move |i| PROGRAMS[(k + i) % PROGRAMS.len()])
}

/// Creates `pods` Pods on a real control plane, then measures every program's sync and churn
/// (each rate for `churn_secs`, after `churn_settle` of quiet) `runs` times, the order rotated
/// each run, and its gap once. `checkpoint` gets the report so far after each run (no gaps
/// yet), so that a long run cut short still leaves its finished runs on disk.
#[allow(clippy::too_many_arguments)]
pub fn run(
    ctx: &Ctx,
    pods: usize,
    gap: usize,
    settle: Duration,
    steady: Duration,
    churn_secs: f64,
    churn_settle: Duration,
    runs: usize,
    checkpoint: &dyn Fn(&Report) -> anyhow::Result<()>,
) -> anyhow::Result<Report> {
    let runs = runs.max(1);
    let peers = super::built_dir("PEERS_BIN_DIR", "scripts/peers-build.sh")?;
    eprintln!("== the Go peers: {}", peers.display());
    eprintln!("== a real kube-apiserver and etcd (tests/kube, built by scripts/kube-build.sh)");
    let cp = ControlPlane::start(kube_server::Options::default());
    eprintln!("== creating {pods} Pods through the API");
    let create_secs = ctx.rt.block_on(real::populate_with(&cp, pods, peer_pod))?;
    let mut syncs = Vec::new();
    let mut churns = Vec::new();
    let mut cursor = 0;
    for k in 0..runs {
        let programs: Vec<&'static str> = order(k).collect();
        eprintln!(
            "== run {} of {runs}: initial sync and steady state, one program at a time ({})",
            k + 1,
            programs.join(", ")
        );
        for (position, program) in programs.iter().copied().enumerate() {
            syncs.push(sync_once(
                ctx,
                &cp,
                &peers,
                program,
                pods,
                settle,
                steady,
                (k, position),
            )?);
        }
        eprintln!(
            "== run {} of {runs}: churn: each program synced, {} s of quiet, then {:?} changes/s for {churn_secs} s each",
            k + 1,
            churn_settle.as_secs_f64(),
            CHURN_RATES
        );
        for (position, program) in programs.iter().copied().enumerate() {
            churns.extend(churn_once(
                ctx,
                &cp,
                &peers,
                program,
                0,
                pods,
                &mut cursor,
                churn_secs,
                Duration::from_secs(120),
                churn_settle,
                (k, position),
            )?);
        }
        let so_far = Report {
            pods,
            create_secs,
            syncs,
            gaps: Vec::new(),
            churns,
            churn_secs,
            runs: k + 1,
            churn_settle,
        };
        checkpoint(&so_far)?;
        (syncs, churns) = (so_far.syncs, so_far.churns);
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
        churns,
        churn_secs,
        runs,
        churn_settle,
    })
}

/// The median, min and max of the `values` that are numbers; `None` when none is.
fn spread_of(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((median, v[0], v[n - 1]))
}

/// The median of the `values` that are numbers; NaN when none is.
fn median(values: &[f64]) -> f64 {
    spread_of(values).map_or(f64::NAN, |(m, _, _)| m)
}

/// A figure over the runs, for the tables: the median, then the min–max in parentheses when
/// they differ as shown (`8.3 (7.9–9.1)`); `—` when no run has it.
fn cell(values: &[f64], decimals: usize) -> String {
    match spread_of(values) {
        None => "—".to_owned(),
        Some((m, lo, hi)) => {
            let f = |v: f64| format!("{v:.decimals$}");
            if f(lo) == f(hi) {
                f(m)
            } else {
                format!("{} ({}–{})", f(m), f(lo), f(hi))
            }
        }
    }
}

/// A figure over the runs, for the JSON: its median, min and max (null when no run has it).
fn summary(values: &[f64]) -> Value {
    spread_of(values).map_or(
        Value::Null,
        |(m, lo, hi)| json!({"median": m, "min": lo, "max": hi}),
    )
}

/// The part's tables (Markdown): each figure the median of the runs, and their min–max.
pub fn markdown(r: &Report) -> String {
    let over_runs = if r.runs > 1 {
        format!(
            "The sync and the churn were measured {} times, the programs' order rotated each run \
             (run k starts at the k-th program); each figure is the median of the runs, their \
             min–max in parentheses when they differ; ratios are of the medians.",
            r.runs
        )
    } else {
        "One run.".to_owned()
    };
    let mut s = format!(
        "\n## Side by side with the Go peers on a real kube-apiserver ({} Pods)\n\n\
         kube-apiserver and etcd of `tests/kube` (v1.37.2), the peers of `benches/peers` \
         (client-go v0.37.2; the Collector's contrib v0.148.0), one program at a time after a \
         fresh API server start; {} Pods created through the API in {:.0} s, one in {} with a \
         {} KiB annotation. Ratios are to kubesink's figure in this run. {over_runs}\n\n\
         | program | sync (s) | peak RSS (MiB) | steady RSS (MiB) | steady ÷ kubesink | CPU (s) | CPU ÷ kubesink | API server CPU (s) | API server RSS peak (MiB) | LIST | WATCH |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        r.pods,
        r.pods,
        r.create_secs,
        LARGE_EVERY,
        LARGE_BYTES / 1024
    );
    let syncs_of =
        |program: &str| -> Vec<&Sync> { r.syncs.iter().filter(|x| x.program == program).collect() };
    let base = syncs_of("kubesink");
    let base_steady = median(&base.iter().map(|b| b.steady as f64).collect::<Vec<_>>());
    let base_cpu = median(&base.iter().map(|b| b.cpu_secs).collect::<Vec<_>>());
    for program in PROGRAMS {
        let xs = syncs_of(program);
        if xs.is_empty() {
            continue;
        }
        let of = |f: &dyn Fn(&Sync) -> f64| xs.iter().map(|x| f(x)).collect::<Vec<f64>>();
        let steady = of(&|x| mib(x.steady));
        let cpu = of(&|x| x.cpu_secs);
        let rss_ratio = median(&of(&|x| x.steady as f64)) / base_steady.max(1.0);
        let cpu_ratio = median(&cpu) / base_cpu.max(1e-9);
        s += &format!(
            "| {} | {} | {} | {} | {rss_ratio:.2}× | {} | {cpu_ratio:.2}× | {} | {} | {} | {} |\n",
            describe(program),
            cell(&of(&|x| x.sync_secs), 1),
            cell(&of(&|x| mib(x.peak)), 1),
            cell(&steady, 1),
            cell(&cpu, 2),
            cell(&of(&|x| x.server_cpu_secs), 2),
            cell(&of(&|x| mib(x.server_rss_peak)), 0),
            cell(&of(&|x| x.lists), 0),
            cell(&of(&|x| x.watches), 0),
        );
    }
    if !r.churns.is_empty() {
        s += &format!(
            "\n**Churn**: each program synced, then its watch open, then {:.0} s of quiet, then \
             Pods patched (an annotation stamped with the write time) at each rate for {:.0} s. \
             Handled: from the write to the program handling the change (a client-go peer: its \
             handler ran; kubesink: the message's `observedAt`, in milliseconds; the Collector: \
             the record's `observedTimeUnixNano`). Out: to the suite reading it from the \
             program's output (kubesink's stdout, the Collector's file exporter on stdout; the \
             peers write a file read afterwards).\n\n\
             | program | rate asked (/s) | rate (/s) | delivered of applied | handled p50 ms | p99 ms | max ms | out p50 ms | out p99 ms | CPU s / 10k changes | ÷ kubesink | API server CPU s / 10k |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            r.churn_settle.as_secs_f64(),
            r.churn_secs
        );
        for target in CHURN_RATES {
            let base_cpu = median(
                &r.churns_of("kubesink", target)
                    .iter()
                    .map(|b| b.cpu_per_10k)
                    .collect::<Vec<_>>(),
            );
            for program in PROGRAMS {
                let cs = r.churns_of(program, target);
                if cs.is_empty() {
                    continue;
                }
                let of = |f: &dyn Fn(&Churn) -> f64| cs.iter().map(|c| f(c)).collect::<Vec<f64>>();
                let cpu = of(&|c| c.cpu_per_10k);
                let ratio = median(&cpu) / base_cpu.max(1e-9);
                s += &format!(
                    "| {} | {target:.0} | {} | {} of {} | {} | {} | {} | {} | {} | {} | {ratio:.2}× | {} |\n",
                    describe(program),
                    cell(&of(&|c| c.rate), 0),
                    cell(&of(&|c| c.delivered as f64), 0),
                    cell(&of(&|c| c.applied as f64), 0),
                    cell(&of(&|c| c.p50_ms), 1),
                    cell(&of(&|c| c.p99_ms), 1),
                    cell(&of(&|c| c.max_ms), 0),
                    cell(&of(&|c| c.out_p50_ms), 1),
                    cell(&of(&|c| c.out_p99_ms), 1),
                    cell(&cpu, 2),
                    cell(&of(&|c| c.server_cpu_per_10k), 2),
                );
            }
        }
        s += "\nkubesink's *handled* split where its watch event arrived (the time the piece of the watch body that completed the event was read, logged by kubesink at DEBUG, target `kubesink::arrival`): write → arrival is the API server and the network, arrival → `observedAt` is kubesink.\n\n| program | rate asked (/s) | write → arrival p50 ms | p99 ms | arrival → observedAt p50 ms | p99 ms |\n|---|---:|---:|---:|---:|---:|\n";
        for target in CHURN_RATES {
            for program in PROGRAMS.into_iter().filter(|p| is_kubesink(p)) {
                let cs = r.churns_of(program, target);
                if cs.is_empty() {
                    continue;
                }
                let of = |f: &dyn Fn(&Churn) -> f64| cs.iter().map(|c| f(c)).collect::<Vec<f64>>();
                s += &format!(
                    "| {} | {target:.0} | {} | {} | {} | {} |\n",
                    describe(program),
                    cell(&of(&|c| c.arrival_p50_ms), 1),
                    cell(&of(&|c| c.arrival_p99_ms), 1),
                    cell(&of(&|c| c.inside_p50_ms), 1),
                    cell(&of(&|c| c.inside_p99_ms), 1),
                );
            }
        }
        let deaf: Vec<&str> = PROGRAMS
            .into_iter()
            .filter(|p| !receives_updates(p) && r.churns.iter().any(|c| c.program == *p))
            .map(describe)
            .collect();
        if !deaf.is_empty() {
            let who = deaf.join("; ");
            let mut chars = who.chars();
            let who: String = chars
                .next()
                .map(|c| c.to_uppercase().chain(chars).collect())
                .unwrap_or_default();
            s += &format!(
                "\n{who} does not receive updates to a Pod it knows (Clutch's `startInformers` \
                 passes `recieveUpdates = false` for Pods): the suite does not wait for it to \
                 deliver every change, only {} s after the last write, and its delivered count \
                 is what it handed on in that time. Its CPU, over the writes and those {} s, is \
                 the cost of receiving and decoding the watch events it then drops.\n",
                NO_UPDATES_WAIT.as_secs(),
                NO_UPDATES_WAIT.as_secs()
            );
        }
    }
    if let Some(g) = r.gaps.first() {
        s += &format!(
            "\n**A gap** (once per program, not repeated over the runs): each program stopped \
             (SIGTERM) while {n} Pods were deleted and {n} created, then started again \
             (kubesink with `state.backend = \"file\"`; the peers have no saved state).\n\n\
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

/// The part's figures (JSON): every run's values (`syncs`, `churns`, each with its run and
/// its place in that run's order), and per program the median, min and max of each figure
/// over the runs (`sync_summary`, `churn_summary`).
pub fn json(r: &Report) -> Value {
    let sync_summary: Vec<Value> = PROGRAMS
        .into_iter()
        .filter_map(|program| {
            let xs: Vec<&Sync> = r.syncs.iter().filter(|x| x.program == program).collect();
            if xs.is_empty() {
                return None;
            }
            let of =
                |f: &dyn Fn(&Sync) -> f64| summary(&xs.iter().map(|x| f(x)).collect::<Vec<_>>());
            Some(json!({
                "program": program, "runs": xs.len(),
                "sync_secs": of(&|x| x.sync_secs),
                "peak_bytes": of(&|x| x.peak as f64),
                "steady_bytes": of(&|x| x.steady as f64),
                "cpu_secs": of(&|x| x.cpu_secs),
                "server_rss_peak_bytes": of(&|x| x.server_rss_peak as f64),
                "server_cpu_secs": of(&|x| x.server_cpu_secs),
                "lists": of(&|x| x.lists),
                "watches": of(&|x| x.watches),
            }))
        })
        .collect();
    let churn_summary: Vec<Value> = CHURN_RATES
        .into_iter()
        .flat_map(|target| PROGRAMS.into_iter().map(move |program| (target, program)))
        .filter_map(|(target, program)| {
            let cs = r.churns_of(program, target);
            if cs.is_empty() {
                return None;
            }
            let of =
                |f: &dyn Fn(&Churn) -> f64| summary(&cs.iter().map(|c| f(c)).collect::<Vec<_>>());
            Some(json!({
                "program": program, "target_per_sec": target, "runs": cs.len(),
                "receives_updates": receives_updates(program),
                "applied": of(&|c| c.applied as f64),
                "rate_per_sec": of(&|c| c.rate),
                "delivered": of(&|c| c.delivered as f64),
                "p50_ms": of(&|c| c.p50_ms),
                "p99_ms": of(&|c| c.p99_ms),
                "max_ms": of(&|c| c.max_ms),
                "out_p50_ms": of(&|c| c.out_p50_ms),
                "out_p99_ms": of(&|c| c.out_p99_ms),
                "arrival_p50_ms": of(&|c| c.arrival_p50_ms),
                "arrival_p99_ms": of(&|c| c.arrival_p99_ms),
                "inside_p50_ms": of(&|c| c.inside_p50_ms),
                "inside_p99_ms": of(&|c| c.inside_p99_ms),
                "cpu_secs_per_10k": of(&|c| c.cpu_per_10k),
                "server_cpu_secs_per_10k": of(&|c| c.server_cpu_per_10k),
            }))
        })
        .collect();
    json!({
        "pods": r.pods,
        "create_secs": r.create_secs,
        "runs": r.runs,
        "churn_settle_secs": r.churn_settle.as_secs_f64(),
        "no_updates_wait_secs": NO_UPDATES_WAIT.as_secs_f64(),
        "programs": PROGRAMS.iter().map(|p| json!({
            "program": p, "description": describe(p), "receives_updates": receives_updates(p),
        })).collect::<Vec<_>>(),
        "syncs": r.syncs.iter().map(|x| json!({
            "program": x.program, "run": x.run, "position": x.position, "pods": x.pods,
            "sync_secs": x.sync_secs,
            "peak_bytes": x.peak, "steady_bytes": x.steady, "cpu_secs": x.cpu_secs,
            "server_rss_before_bytes": x.server_rss_before, "server_rss_peak_bytes": x.server_rss_peak,
            "server_cpu_secs": x.server_cpu_secs, "lists": x.lists, "watches": x.watches,
        })).collect::<Vec<_>>(),
        "sync_summary": sync_summary,
        "churn_secs": r.churn_secs,
        "churns": r.churns.iter().map(|c| json!({
            "program": c.program, "run": c.run, "position": c.position,
            "target_per_sec": c.target, "applied": c.applied,
            "rate_per_sec": c.rate, "delivered": c.delivered, "p50_ms": c.p50_ms,
            "p99_ms": c.p99_ms, "max_ms": c.max_ms, "out_p50_ms": c.out_p50_ms,
            "out_p99_ms": c.out_p99_ms, "cpu_secs_per_10k": c.cpu_per_10k,
            "arrival_p50_ms": c.arrival_p50_ms, "arrival_p99_ms": c.arrival_p99_ms,
            "inside_p50_ms": c.inside_p50_ms, "inside_p99_ms": c.inside_p99_ms,
            "server_cpu_secs_per_10k": c.server_cpu_per_10k,
        })).collect::<Vec<_>>(),
        "churn_summary": churn_summary,
        "gaps": r.gaps.iter().map(|g| json!({
            "program": g.program, "changed": g.changed, "deletes": g.deletes, "adds": g.adds,
            "resent": g.resent, "events": g.events, "sync_secs": g.sync_secs,
        })).collect::<Vec<_>>(),
    })
}

/// The RSS-over-time plot of every program's initial sync and quiet time (the first run's).
pub fn plot(path: &Path, r: &Report) -> anyhow::Result<()> {
    use kubesink_bench::plot::{rss_over_time, Series};
    use plotters::style::RGBColor;
    const COLORS: [RGBColor; 7] = [
        RGBColor(44, 160, 44),
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(127, 127, 127),
    ];
    let series: Vec<Series<'_>> = r
        .syncs
        .iter()
        .filter(|x| x.run == 0)
        .zip(COLORS.iter().cycle())
        .map(|(x, c)| Series {
            label: x.program,
            samples: &x.samples,
            color: *c,
        })
        .collect();
    rss_over_time(
        path,
        &format!(
            "RSS from start through the sync of {} real Pods and 30 s of quiet",
            r.pods
        ),
        &series,
    )
}
