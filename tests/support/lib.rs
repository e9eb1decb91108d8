//! What kubesink's integration tests and benches share, one crate linked into each test
//! binary: a started simulator with a kubeconfig, a capturing sink with fault switches,
//! condition waits with timeouts, the message schema, folds of what was sent (`oracle`), and
//! one module each for the processes a test starts (brokers, a real control plane, kubesink).
//! A test file imports it in one line, e.g.
//! `use kubesink_test_support::{self as support, kube_server, process};`.

#![warn(missing_docs)]

mod changed;
pub mod kafka_server;
pub mod kube_server;
pub mod leases;
pub mod logs;
pub mod nats_server;
mod oracle;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod receivers;
pub mod run;

pub use changed::{check_changed, Changed};
pub use oracle::{fold, fold_equals, fold_expecting, state_diff, Expect, Fold, Oracle, UidFold};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kubesink::config::{ClusterConfig, Config, PipelineConfig, ResourceConfig};
use kubesink_core::{Message, Sink, SinkError};
use kubesink_sim::{SimConfig, Simulator};
use serde_json::Value;

/// The repository's root (the `kubesink` package), for its files: docs, configs, scripts.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The kubesink binary cargo built for this test run: it puts it beside the `deps/` folder
/// that holds the test binary (`target/<profile>/kubesink`), the file
/// `env!("CARGO_BIN_EXE_kubesink")` names in a test of the root package (only a target of
/// that package can read it, at compile time).
///
/// Panics when there is no such file (the test binary was started from elsewhere).
pub fn kubesink_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().expect("the test binary's folder");
    let dir = if dir.ends_with("deps") {
        dir.parent().expect("the profile's folder")
    } else {
        dir
    };
    let bin = dir.join(format!("kubesink{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.is_file(), "no kubesink binary at {}", bin.display());
    bin
}

/// The custom kind the simulator's workload generates.
pub const FOOBAR_API: &str = "k8s-openapi-tests-custom-resource-definition.com/v1";

/// A started simulator and the kubeconfig that points at it.
pub struct Cluster {
    /// The simulator, serving on 127.0.0.1.
    pub sim: Simulator,
    /// A kubeconfig that points at it.
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.sim.shutdown();
    }
}

/// Starts a simulator with `config` on a free port and writes its kubeconfig.
pub async fn cluster(config: SimConfig) -> Cluster {
    let sim = Simulator::new(config);
    sim.start(([127, 0, 0, 1], 0).into())
        .await
        .expect("start simulator");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("write kubeconfig");
    Cluster {
        sim,
        kubeconfig,
        _dir: dir,
    }
}

/// A configuration for tests: cluster `test`, short linger, quick retries.
pub fn config(kubeconfig: &std::path::Path, resources: Vec<ResourceConfig>) -> Config {
    use kubesink::config::HumanDuration;
    Config {
        cluster: ClusterConfig {
            name: "test".into(),
            kubeconfig: Some(kubeconfig.to_path_buf()),
            ..Default::default()
        },
        clusters: Vec::new(),
        leader_election: Default::default(),
        pipeline: PipelineConfig {
            linger: HumanDuration(Duration::from_millis(10)),
            retry_initial_backoff: HumanDuration(Duration::from_millis(20)),
            retry_max_backoff: HumanDuration(Duration::from_millis(200)),
            ..Default::default()
        },
        watch: Default::default(),
        // Tests run in parallel: each server on a free port, no summaries.
        server: kubesink::config::ServerConfig {
            listen: "127.0.0.1:0".into(),
            sink_check_interval: HumanDuration(Duration::from_millis(200)),
            ..Default::default()
        },
        log: kubesink::config::LogConfig {
            summary_interval: HumanDuration(Duration::ZERO),
        },
        resources,
        sinks: vec![],
        state: Default::default(),
    }
}

/// A sink that keeps every confirmed message, with switches to block it or make it fail.
#[derive(Default)]
pub struct CaptureSink {
    /// Its name; `capture` when empty.
    name: String,
    messages: Mutex<Vec<Value>>,
    payloads: Mutex<Vec<bytes::Bytes>>,
    /// While true, `send` waits (a sink that blocks).
    pub blocked: AtomicBool,
    /// While > 0, `send` fails (and decrements it).
    pub fail_next: AtomicUsize,
    /// While true, the destination is down: `send` and `healthcheck` fail.
    pub down: AtomicBool,
    /// How many sends failed (injected or down).
    pub failures: AtomicUsize,
    /// Notified by [`CaptureSink::unblock`].
    pub unblocked: tokio::sync::Notify,
    /// Each `send` takes this long (a slow destination), in milliseconds.
    pub delay_ms: std::sync::atomic::AtomicU64,
}

impl CaptureSink {
    /// A capture sink named `capture`, neither blocked nor failing.
    pub fn new() -> Arc<Self> {
        Arc::new(CaptureSink::default())
    }
    /// A capture sink named `name` (the bridge finds a sink's `filter` by its name).
    pub fn named(name: &str) -> Arc<Self> {
        Arc::new(CaptureSink {
            name: name.to_owned(),
            ..CaptureSink::default()
        })
    }
    /// The payloads kept so far, parsed ([`parse_payload`]).
    pub fn messages(&self) -> Vec<Value> {
        self.messages.lock().unwrap().clone()
    }
    /// How many messages it has kept.
    pub fn len(&self) -> usize {
        self.messages.lock().unwrap().len()
    }
    /// The payloads as delivered, byte for byte.
    pub fn payloads(&self) -> Vec<bytes::Bytes> {
        self.payloads.lock().unwrap().clone()
    }
    /// Whether it has kept no message yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Lets a blocked sink send again.
    pub fn unblock(&self) {
        self.blocked.store(false, Ordering::SeqCst);
        self.unblocked.notify_waiters();
    }
}

#[async_trait]
impl Sink for CaptureSink {
    fn name(&self) -> &str {
        match self.name.as_str() {
            "" => "capture",
            name => name,
        }
    }
    async fn send(&self, batch: &[Message]) -> Result<(), SinkError> {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        loop {
            let n = self.unblocked.notified();
            if !self.blocked.load(Ordering::SeqCst) {
                break;
            }
            n.await;
        }
        if self.down.load(Ordering::SeqCst) {
            self.failures.fetch_add(1, Ordering::SeqCst);
            return Err(SinkError::transient("capture", "destination down"));
        }
        if self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            self.failures.fetch_add(1, Ordering::SeqCst);
            return Err(SinkError::transient("capture", "injected failure"));
        }
        let mut out = self.messages.lock().unwrap();
        let mut raw = self.payloads.lock().unwrap();
        for m in batch {
            out.push(parse_payload(&m.payload));
            raw.push(m.payload.clone());
        }
        Ok(())
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(SinkError::transient("capture", "destination down"));
        }
        Ok(())
    }
    async fn close(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// `GET path` on `addr` over plain HTTP/1.0: (status code, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("write request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_owned())
}

/// A payload as a `Value`. A field nested deeper than serde_json's default limit (128) is
/// kept as the string `<N bytes nested too deep to parse>`: the payload itself is checked
/// through [`CaptureSink::payloads`] (a 10,000-level `Value` would also overflow the stack
/// when dropped).
pub fn parse_payload(payload: &[u8]) -> Value {
    if let Ok(v) = serde_json::from_slice(payload) {
        return v;
    }
    let fields: BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_slice(payload).expect("payload is a JSON object");
    let map: serde_json::Map<String, Value> = fields
        .into_iter()
        .map(|(k, v)| {
            let value = serde_json::from_str(v.get()).unwrap_or_else(|_| {
                Value::String(format!(
                    "<{} bytes nested too deep to parse>",
                    v.get().len()
                ))
            });
            (k, value)
        })
        .collect();
    Value::Object(map)
}

/// Creates an object from its JSON text through the API server's REST API (`POST path`), for
/// objects a `Value` cannot hold safely (10,000 levels deep) or that are large.
pub async fn post_json(client: &kube::Client, path: &str, body: String) {
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.into_bytes())
        .expect("request");
    let created = client.request_text(req).await;
    assert!(created.is_ok(), "POST {path}: {:?}", created.err());
}

/// A bridge for `cfg` (its first cluster) delivering to `sink`.
pub async fn start_bridge(cfg: &Config, sink: Arc<dyn Sink>) -> kubesink::bridge::Bridge {
    start_bridge_with(cfg, vec![sink]).await
}

/// The plan `cfg` resolves to, as `kubesink run` resolves it (every test configuration
/// resolves).
pub fn plan(cfg: &Config) -> kubesink::plan::Plan {
    kubesink::plan::resolve(cfg).expect("the configuration resolves")
}

/// The sinks `cfg` configures, built as kubesink builds them, in its order.
pub async fn build_sinks(cfg: &Config) -> Vec<Arc<dyn Sink>> {
    let mut sinks = Vec::new();
    for (i, s) in cfg.sinks.iter().enumerate() {
        sinks.push(s.build(i).await.expect("sink builds"));
    }
    sinks
}

/// A bridge for `cfg` delivering to the sinks it configures ([`build_sinks`]).
pub async fn start_configured_bridge(cfg: &Config) -> kubesink::bridge::Bridge {
    start_bridge_with(cfg, build_sinks(cfg).await).await
}

/// [`start_bridge`] with several sinks, in the pipeline's order.
pub async fn start_bridge_with(
    cfg: &Config,
    sinks: Vec<Arc<dyn Sink>>,
) -> kubesink::bridge::Bridge {
    let client = kubesink::cluster::client(&cfg.clusters()[0])
        .await
        .expect("client");
    kubesink::bridge::Bridge::start(&plan(cfg), client, sinks)
        .await
        .expect("bridge starts")
}

/// The one wait of the tests: polls `probe` every 20 ms until it answers `Ok(value)`, and
/// returns that value. `Err(observed)` says what it saw this time; after `timeout` the wait
/// panics naming `what` it awaited and the last thing observed. Timeouts are generous (the
/// machine may be loaded): tests assert outcomes and order, never speed.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    match try_wait_until(timeout, probe).await {
        Ok(v) => v,
        Err(observed) => {
            panic!("timed out after {timeout:?} waiting for: {what}\nlast observed: {observed}")
        }
    }
}

/// [`wait_until`] that hands the last observation back instead of panicking, for a caller
/// that gathers more evidence before it fails.
pub async fn try_wait_until<T, F, Fut>(timeout: Duration, mut probe: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let started = tokio::time::Instant::now();
    loop {
        let probed = tokio::time::Instant::now();
        match probe().await {
            Ok(v) => return Ok(v),
            Err(observed) if started.elapsed() > timeout => return Err(observed),
            // A costly probe (a fold of thousands of messages) waits as long as it took, so
            // waiting does not take the CPU from what it waits for.
            Err(_) => {
                let pause = probed
                    .elapsed()
                    .clamp(Duration::from_millis(20), Duration::from_millis(500));
                tokio::time::sleep(pause).await
            }
        }
    }
}

/// [`wait_until`] for a condition without a value to show.
pub async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    wait_until(what, timeout, || {
        std::future::ready(if cond() {
            Ok(())
        } else {
            Err("the condition was false".to_owned())
        })
    })
    .await
}

/// [`wait_until`] for a condition that says what it saw: `check` returns `(holds, observed)`.
pub async fn wait_for_seen(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> (bool, String),
) {
    wait_until(what, timeout, || {
        let (holds, observed) = check();
        std::future::ready(if holds { Ok(()) } else { Err(observed) })
    })
    .await
}

/// The timestamp kubesink wrote on the first line of `log` containing `text` (its human log
/// format starts each line with an RFC 3339 timestamp): for durations by kubesink's own clock,
/// which a loaded test machine does not stretch as it does the test's observations.
pub fn logged_at(log: &str, text: &str) -> jiff::Timestamp {
    let line = log
        .lines()
        .find(|l| l.contains(text))
        .unwrap_or_else(|| panic!("no {text:?} in the log:\n{log}"));
    line_time(line).unwrap_or_else(|| panic!("no timestamp in {line:?}"))
}

/// The timestamp of the last line of `log` that has one.
pub fn last_logged_at(log: &str) -> jiff::Timestamp {
    log.lines()
        .rev()
        .find_map(line_time)
        .unwrap_or_else(|| panic!("no timestamped line in the log:\n{log}"))
}

fn line_time(line: &str) -> Option<jiff::Timestamp> {
    line.split_whitespace().next()?.parse().ok()
}

/// The topology message v1 schema validator.
pub fn schema() -> jsonschema::Validator {
    let text =
        std::fs::read_to_string(Path::new(ROOT).join("docs/topology-message-v1.schema.json"))
            .expect("schema file");
    let schema: Value = serde_json::from_str(&text).expect("schema is JSON");
    jsonschema::validator_for(&schema).expect("schema compiles")
}

/// Panics naming the first of `msgs` that `validator` rejects, and why.
pub fn assert_schema_valid(validator: &jsonschema::Validator, msgs: &[Value]) {
    for m in msgs {
        if let Err(e) = validator.validate(m) {
            panic!("message does not match the schema: {e}\n{m:#}");
        }
    }
}

/// The simulator's current objects of the given (apiVersion, kind)s, folded the same way.
pub fn sim_state(sim: &Simulator, kinds: &[(&str, &str)]) -> Fold {
    let mut state = Fold::new();
    for (api, kind) in kinds {
        for o in sim.objects(api, kind) {
            state.insert(
                (
                    kind.to_string(),
                    o["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                ),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
    }
    state
}

/// The simulator's `kind` objects that `keep` keeps, as the exact state a fold must equal:
/// (kind, namespace, name) → (uid, resourceVersion).
pub fn sim_uid_state(
    sim: &Simulator,
    api_version: &str,
    kind: &str,
    keep: impl Fn(&Value) -> bool,
) -> UidFold {
    sim.objects(api_version, kind)
        .iter()
        .filter(|o| keep(o))
        .map(|o| {
            let m = &o["metadata"];
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (
                (kind.to_owned(), s(&m["namespace"]), s(&m["name"])),
                (s(&m["uid"]), s(&m["resourceVersion"])),
            )
        })
        .collect()
}

/// `[[clusters]]` entries for `names`, each through `kubeconfig` (the scale-out tests run one
/// API server under several names).
pub fn clusters_toml(names: &[String], kubeconfig: &std::path::Path) -> String {
    names
        .iter()
        .map(|name| format!("[[clusters]]\nname = \"{name}\"\nkubeconfig = {kubeconfig:?}\n"))
        .collect()
}

/// Whether a scale-out group of `members` settled with the cluster Leases held as `holders`
/// says (as read back): every one of `clusters` is held by one of `members`, evenly
/// (`c / m` or `c / m + 1` each), and the assignment every replica computes from these
/// holders (`kubesink::scale_out::assign`) is these holders, so nothing moves any more.
/// `Err` says what is not so yet.
pub fn settled(
    clusters: &[String],
    members: &[&str],
    holders: &BTreeMap<String, Option<String>>,
) -> Result<(), String> {
    let members: Vec<String> = members.iter().map(|m| (*m).to_owned()).collect();
    let mut held = holders.clone();
    held.retain(|c, _| clusters.contains(c));
    let mut loads: BTreeMap<&str, usize> = members.iter().map(|m| (m.as_str(), 0)).collect();
    for c in clusters {
        let holder = held.get(c).cloned().flatten();
        match holder.as_deref().and_then(|h| loads.get_mut(h)) {
            Some(n) => *n += 1,
            None => return Err(format!("{c} is held by {holder:?}, not one of {members:?}")),
        }
    }
    let base = clusters.len() / members.len().max(1);
    if loads.values().any(|n| *n != base && *n != base + 1) {
        return Err(format!("uneven: {loads:?}"));
    }
    let again: BTreeMap<String, Option<String>> =
        kubesink::scale_out::assign::assign(clusters, &members, &held)
            .into_iter()
            .map(|(c, m)| (c, Some(m)))
            .collect();
    if again != held {
        return Err(format!("the replicas would still move clusters: {loads:?}"));
    }
    Ok(())
}

/// The distinct `leaderEpoch`s of `messages`; panics on a message without one.
pub fn leader_epochs(messages: &[Value]) -> std::collections::BTreeSet<u64> {
    messages
        .iter()
        .map(|m| {
            m["leaderEpoch"]
                .as_u64()
                .unwrap_or_else(|| panic!("a message without leaderEpoch: {m}"))
        })
        .collect()
}

/// The sum of the samples of `name` whose labels include every `labels` pair, from the
/// Prometheus text `exposition`; `None` when no such series is exposed (a labelled counter
/// appears only once incremented). For waits; assertions use [`metric_value`].
pub fn metric(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let values: Vec<f64> = exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())?
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// [`metric`], panicking when the series is absent (so "is 0" cannot pass for a metric that
/// is not exposed at all), naming the metric, the labels and the series of that name.
pub fn metric_value(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric(exposition, name, labels).unwrap_or_else(|| {
        let same_name: Vec<&str> = exposition
            .lines()
            .filter(|l| !l.starts_with('#') && l.starts_with(name))
            .take(10)
            .collect();
        panic!("metric {name} with labels {labels:?} is not exposed; series of that name: {same_name:#?}")
    })
}

/// Deletes each of `objects` (as the simulator lists them) of `api_version` `kind`.
pub fn delete_each(sim: &Simulator, api_version: &str, kind: &str, objects: &[Value]) {
    for o in objects {
        let m = &o["metadata"];
        sim.delete(
            api_version,
            kind,
            m["namespace"].as_str(),
            m["name"].as_str().expect("a listed object has a name"),
        )
        .expect("delete");
    }
}

/// The simulator's current objects of the given (apiVersion, kind)s as a consumer's view
/// would hold them: message key (cluster `cluster`) → uid.
pub fn sim_keys(
    sim: &Simulator,
    cluster: &str,
    kinds: &[(&str, &str)],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (api, kind) in kinds {
        let group = api.split_once('/').map_or("core", |(g, _)| g);
        for o in sim.objects(api, kind) {
            let m = &o["metadata"];
            out.insert(
                format!(
                    "{cluster}/{group}/{kind}/{}/{}",
                    m["namespace"].as_str().unwrap_or_default(),
                    m["name"].as_str().unwrap_or_default()
                ),
                m["uid"].as_str().unwrap_or_default().to_owned(),
            );
        }
    }
    out
}

/// A printed view (JSON Lines with `key` and `uid`, as `kubesink fold` and the reference
/// consumers print it) as key → uid.
pub fn view_keys(jsonl: &str) -> BTreeMap<String, String> {
    jsonl
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (
                v["key"].as_str().unwrap_or_default().to_owned(),
                v["uid"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// How two views differ, for assertion messages: (missing, extra, other uid) counts and a
/// few examples.
pub fn view_diff(want: &BTreeMap<String, String>, got: &BTreeMap<String, String>) -> String {
    let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let uid: Vec<&String> = want
        .iter()
        .filter(|(k, u)| got.get(*k).is_some_and(|g| g != *u))
        .map(|(k, _)| k)
        .collect();
    format!(
        "{} missing {:?}, {} extra {:?}, {} other uid {:?}",
        missing.len(),
        missing.iter().take(3).collect::<Vec<_>>(),
        extra.len(),
        extra.iter().take(3).collect::<Vec<_>>(),
        uid.len(),
        uid.iter().take(3).collect::<Vec<_>>()
    )
}

/// One run of `kubesink fold` (the real binary, clean `KUBESINK_` environment).
pub struct FoldRun {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// What it wrote to stdout.
    pub stdout: String,
    /// What it wrote to stderr.
    pub stderr: String,
}

/// Runs `kubesink <args>` to completion (at most 60 s), with `stdin` as its input.
pub async fn run_kubesink(args: &[&str], stdin: &[u8]) -> FoldRun {
    use tokio::io::AsyncWriteExt;
    let mut child = process::clean_command(kubesink_bin())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start kubesink");
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin).await.expect("write stdin");
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubesink {args:?} did not finish within 60 s"))
        .expect("kubesink output");
    FoldRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The deploy checks' Python (helm-python-sdk, kubernetes-validate): `DEPLOY_CHECKS_PYTHON`,
/// else the venv `scripts/check-deploy.sh --tools` makes in the tools cache; panics, saying how
/// to install it, when it is missing.
pub fn deploy_python() -> PathBuf {
    let python = std::env::var_os("DEPLOY_CHECKS_PYTHON").map_or_else(
        || {
            let cache = std::env::var_os("TOOLS_CACHE_DIR").map_or_else(
                || PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/kubesink"),
                PathBuf::from,
            );
            cache.join("deploy-venv/bin/python")
        },
        PathBuf::from,
    );
    assert!(
        python.exists(),
        "{} is missing: `scripts/check-deploy.sh --tools` installs it (scripts/test.sh does)",
        python.display()
    );
    python
}

/// The `widgets.kubesink.test` CRD (kind `Widget`, namespaced, `spec` free-form): the
/// custom resource of the real-server tests.
pub fn widget_crd() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.kubesink.test"},
        "spec": {
            "group": "kubesink.test",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}}
            }]
        }
    })
}

/// Waits until the CRD is established (its kind served).
pub async fn widget_crd_established(client: &kube::Client) {
    wait_until(
        "the Widget CRD established",
        std::time::Duration::from_secs(240),
        || async {
            let api = kube_server::dynamic(
                client,
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                None,
            )
            .await;
            let crd = api
                .get("widgets.kubesink.test")
                .await
                .map_err(|e| e.to_string())?;
            let established = crd.data["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                });
            established
                .then_some(())
                .ok_or_else(|| crd.data["status"].to_string())
        },
    )
    .await;
}
