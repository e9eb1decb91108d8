//! Robustness against an API server that refuses, throttles, goes silent, loses a CRD or
//! fails discovery, and against a process that runs out of file descriptors, end to end
//! over real HTTP (`docs/robustness.md`, section "API server"). Failures back off with
//! growth up to `watch.retry_max_backoff` (or longer when `Retry-After` asks), keep the last
//! known state (no deletes inferred from a refusal), are logged once per streak, and every
//! other resource keeps flowing.

use kubesink_test_support::{self as support, run};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kubesink::config::{HumanDuration, ResourceConfig};
use kubesink_sim::workload::foobar_crd;
use kubesink_sim::{SimConfig, Simulator, Workload};
use run::{configmap, node, Run, CONFIGMAPS, LONG};
use serde_json::{json, Value};
use support::*;

const FOOBAR_GROUP: &str = "k8s-openapi-tests-custom-resource-definition.com";
const FOOBARS: &str = "/apis/k8s-openapi-tests-custom-resource-definition.com/v1/foobars";
const CRD_API: &str = "apiextensions.k8s.io/v1";
const CRD_NAME: &str = "foobars.k8s-openapi-tests-custom-resource-definition.com";

/// Quick retries for tests: 250 ms doubling up to `cap`.
fn quick_retries(cap: Duration) -> impl FnOnce(&mut kubesink::config::Config) {
    move |cfg| {
        cfg.watch.retry_initial_backoff = HumanDuration(Duration::from_millis(250));
        cfg.watch.retry_max_backoff = HumanDuration(cap);
    }
}

fn foobar(name: &str) -> Value {
    json!({"apiVersion": FOOBAR_API, "kind": "FooBar",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"prop1": "v", "prop2": [true], "prop4": 1, "prop5": "x"}})
}

/// Arrival times of the list attempts (`watch = false`: LIST pages and streaming lists, as
/// `watch.initial_list` makes them) or of the plain watch requests of `path` since `since`.
fn arrivals(sim: &Simulator, path: &str, watch: bool, since: Instant) -> Vec<Instant> {
    sim.requests()
        .into_iter()
        .filter(|r| {
            let (p, q) = r
                .path_and_query
                .split_once('?')
                .unwrap_or((&r.path_and_query, ""));
            let plain_watch = q.contains("watch=true") && !q.contains("sendInitialEvents=true");
            p == path && plain_watch == watch && r.at >= since
        })
        .map(|r| r.at)
        .collect()
}

fn gaps(times: &[Instant]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_list_backs_off_with_growth_and_other_kinds_flow() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            configmaps: 5,
            nodes: 2,
            seed: 3,
            ..Default::default()
        })
        .unwrap();
    c.sim
        .faults()
        .set_resource_status("", "configmaps", 403, None)
        .unwrap();
    let since = Instant::now();
    let cap = Duration::from_secs(2);
    let run = Run::start(
        &c,
        "forbidden-list",
        vec![
            ResourceConfig::new("v1", "ConfigMap"),
            ResourceConfig::new("v1", "Node"),
        ],
        quick_retries(cap),
    )
    .await;
    wait_for("nodes flow while configmaps are forbidden", LONG, || {
        run.sink.len() == 2
    })
    .await;
    wait_for("seven list attempts", LONG, || {
        arrivals(&c.sim, CONFIGMAPS, false, since).len() >= 7
    })
    .await;
    let gaps = gaps(&arrivals(&c.sim, CONFIGMAPS, false, since));
    // Each wait is at least 250 ms · 2ⁿ up to the cap (jitter only lengthens it, within the
    // cap): they grow, instead of a steady ~1/s.
    for (n, gap) in gaps.iter().enumerate() {
        let floor = (Duration::from_millis(250) * 2u32.pow(n as u32)).min(cap);
        assert!(
            *gap >= floor.mul_f64(0.95),
            "wait {n} was {gap:?}: {gaps:?}"
        );
    }
    eprintln!("waits between forbidden lists: {gaps:?}");
    let failed = run.log("initial list failed: 403 Forbidden");
    assert_eq!(failed.len(), 1, "logged once per streak: {failed:#?}");
    assert!(
        failed[0].contains("WARN") && failed[0].contains("RBAC"),
        "{}",
        failed[0]
    );
    assert_eq!(
        run.log("list started").len(),
        2,
        "once per kind, not per attempt"
    );
    // The simulator saw the seventh list arrive; kubesink counts it once the 403 is back.
    wait_for("kubesink counted seven forbidden lists", LONG, || {
        run.count("ConfigMap", |s| &s.forbidden) >= 7
    })
    .await;
    assert!(run.sink.messages().iter().all(|m| m["kind"] == "Node"));

    c.sim.faults().clear_resource_status("", "configmaps");
    wait_for("configmaps synced once allowed", LONG, || {
        run.synced() && run.sink.len() == 7
    })
    .await;
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_removed_and_recreated_is_picked_up_within_the_backoff_cap() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            foobars: 3,
            nodes: 1,
            seed: 4,
            ..Default::default()
        })
        .unwrap();
    let cap = Duration::from_secs(2);
    let run = Run::start(
        &c,
        "crd-gone",
        vec![
            ResourceConfig::new(FOOBAR_API, "FooBar"),
            ResourceConfig::new("v1", "Node"),
        ],
        quick_retries(cap),
    )
    .await;
    wait_for("initial sync", LONG, || run.synced() && run.sink.len() == 4).await;

    let deleted = Instant::now();
    c.sim
        .delete(CRD_API, "CustomResourceDefinition", None, CRD_NAME)
        .unwrap();
    wait_for("the CRD's objects deleted", LONG, || {
        (0..3).all(|i| run.has("FooBar", &format!("fb-{i}"), "deleted"))
    })
    .await;
    // A long enough 404 streak that an uncapped backoff would now wait far beyond the cap.
    wait_for("a 404 streak", LONG, || {
        run.count("FooBar", |s| &s.not_found) >= 6
    })
    .await;
    c.sim.create(node("node-meanwhile")).unwrap();
    wait_for("nodes flow meanwhile", LONG, || {
        run.has("Node", "node-meanwhile", "added")
    })
    .await;
    let lines = run.log("the resource is not served (CRD removed?)");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let waits = gaps(&arrivals(&c.sim, FOOBARS, false, deleted));
    eprintln!("waits between lists of the removed CRD: {waits:?}");
    assert!(
        waits.last().is_some_and(|w| *w >= cap.mul_f64(0.95)),
        "the waits grow to the cap: {waits:?}"
    );

    c.sim.create(foobar_crd().unwrap()).unwrap();
    c.sim.create(foobar("fb-new")).unwrap();
    wait_for("the recreated CRD's object", LONG, || {
        run.has("FooBar", "fb-new", "added")
    })
    .await;
    // Picked up within the cap: no wait between two lists of the removed CRD came near what
    // an uncapped backoff would wait after that streak (250 ms · 2⁶ = 16 s). Gaps as the
    // simulator saw the requests arrive; 4 × the cap leaves room for a loaded machine.
    let waits = gaps(&arrivals(&c.sim, FOOBARS, false, deleted));
    eprintln!("waits between lists until the CRD's object was back: {waits:?} (cap {cap:?})");
    assert!(
        waits.iter().all(|w| *w <= cap * 4),
        "a wait far beyond the cap: {waits:?}"
    );
    run.idle().await;
    let deletes = run
        .sink
        .messages()
        .into_iter()
        .filter(|m| m["op"] == "deleted")
        .count();
    assert_eq!(deletes, 3);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_during_a_forbidden_window_arrive_exactly_once_allowed_again() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            configmaps: 10,
            nodes: 1,
            seed: 6,
            ..Default::default()
        })
        .unwrap();
    let run = Run::start(
        &c,
        "forbidden-window",
        vec![
            ResourceConfig::new("v1", "ConfigMap"),
            ResourceConfig::new("v1", "Node"),
        ],
        quick_retries(Duration::from_secs(1)),
    )
    .await;
    wait_for("initial sync", LONG, || {
        run.synced() && run.sink.len() == 11
    })
    .await;

    c.sim
        .faults()
        .set_resource_status("", "configmaps", 403, None)
        .unwrap();
    // The open watch ends; wait until the refusal is met, so no delete can slip through it.
    wait_for("the watch refused", LONG, || {
        run.count("ConfigMap", |s| &s.forbidden) >= 1
    })
    .await;
    let victims = ["config-1", "config-4", "config-7"];
    for v in victims {
        c.sim.delete("v1", "ConfigMap", Some("default"), v).unwrap();
    }
    c.sim.create(node("node-during")).unwrap();
    wait_for("refused for a while", LONG, || {
        run.count("ConfigMap", |s| &s.forbidden) >= 5
    })
    .await;
    wait_for("nodes flow", LONG, || {
        run.has("Node", "node-during", "added")
    })
    .await;
    assert!(
        run.sink.messages().iter().all(|m| m["op"] != "deleted"),
        "a refusal is not a deletion"
    );
    assert_eq!(run.log("watch failed: 403 Forbidden").len(), 1);

    c.sim.faults().clear_resource_status("", "configmaps");
    wait_for("the three deletes", LONG, || {
        victims.iter().all(|v| run.has("ConfigMap", v, "deleted"))
    })
    .await;
    run.idle().await;
    let mut deleted: Vec<String> = run
        .sink
        .messages()
        .into_iter()
        .filter(|m| m["op"] == "deleted")
        .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    deleted.sort();
    assert_eq!(deleted, victims);
    let want = sim_state(&c.sim, &[("v1", "ConfigMap"), ("v1", "Node")]);
    assert_eq!(fold(&run.sink.messages()), want);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_answering_404_for_a_while_infers_nothing_and_resumes() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            foobars: 4,
            seed: 8,
            ..Default::default()
        })
        .unwrap();
    let run = Run::start(
        &c,
        "crd-404",
        vec![ResourceConfig::new(FOOBAR_API, "FooBar")],
        quick_retries(Duration::from_secs(1)),
    )
    .await;
    wait_for("initial sync", LONG, || run.synced() && run.sink.len() == 4).await;
    c.sim
        .faults()
        .set_resource_status(FOOBAR_GROUP, "foobars", 404, None)
        .unwrap();
    wait_for("the watch refused", LONG, || {
        run.count("FooBar", |s| &s.not_found) >= 1
    })
    .await;
    c.sim.create(foobar("fb-during")).unwrap();
    wait_for("not served for a while", LONG, || {
        run.count("FooBar", |s| &s.not_found) >= 4
    })
    .await;
    c.sim
        .faults()
        .clear_resource_status(FOOBAR_GROUP, "foobars");
    wait_for("served again", LONG, || {
        run.has("FooBar", "fb-during", "added")
    })
    .await;
    run.idle().await;
    assert!(run.sink.messages().iter().all(|m| m["op"] != "deleted"));
    assert_eq!(run.sink.len(), 5);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_obeyed_beyond_the_backoff_cap() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            configmaps: 3,
            seed: 2,
            ..Default::default()
        })
        .unwrap();
    let run = Run::start(
        &c,
        "throttled",
        vec![ResourceConfig::new("v1", "ConfigMap")],
        quick_retries(Duration::from_millis(500)),
    )
    .await;
    wait_for("initial sync", LONG, || run.synced() && run.sink.len() == 3).await;
    let since = Instant::now();
    c.sim
        .faults()
        .set_resource_status("", "configmaps", 429, Some(2))
        .unwrap();
    wait_for("four throttled watches", LONG, || {
        arrivals(&c.sim, CONFIGMAPS, true, since).len() >= 4
    })
    .await;
    let gaps = gaps(&arrivals(&c.sim, CONFIGMAPS, true, since));
    eprintln!("waits between throttled watches (Retry-After: 2): {gaps:?}");
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_millis(1950)),
        "Retry-After 2 s not waited out (cap 500 ms): {gaps:?}"
    );
    assert!(run.count("ConfigMap", |s| &s.throttled) >= 3);
    assert_eq!(run.log("as Retry-After asks").len(), 1);
    c.sim.faults().clear_resource_status("", "configmaps");
    c.sim.create(configmap("default", "cm-after")).unwrap();
    wait_for("flowing again", LONG, || {
        run.has("ConfigMap", "cm-after", "added")
    })
    .await;
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silenced_watch_is_re_established_within_the_idle_timeout() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            configmaps: 3,
            seed: 2,
            ..Default::default()
        })
        .unwrap();
    let idle = Duration::from_secs(3);
    let run = Run::start(
        &c,
        "silent",
        vec![ResourceConfig::new("v1", "ConfigMap")],
        |cfg| cfg.watch.idle_timeout = HumanDuration(idle),
    )
    .await;
    wait_for("initial sync", LONG, || run.synced() && run.sink.len() == 3).await;
    // Bookmarks (every second) keep a healthy watch well inside the idle timeout.
    wait_for("a bookmark", LONG, || {
        run.count("ConfigMap", |s| &s.bookmarks) >= 2
    })
    .await;
    assert_eq!(run.count("ConfigMap", |s| &s.idle_restarts), 0);

    c.sim.faults().silence_open_watches();
    c.sim.create(configmap("default", "cm-silent")).unwrap();
    wait_for("created while silent, delivered", LONG, || {
        run.has("ConfigMap", "cm-silent", "added")
    })
    .await;
    // The silent watch was given up for its idle timeout (once), and the object came
    // through the watch that replaced it: outcome and cause, not how fast.
    assert_eq!(run.count("ConfigMap", |s| &s.idle_restarts), 1);
    assert_eq!(run.log("watch silent").len(), 1);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_failing_at_start_up_is_retried_in_the_background_and_kubesink_starts() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            configmaps: 2,
            nodes: 1,
            seed: 1,
            ..Default::default()
        })
        .unwrap();
    c.sim.faults().set_status("/api", 503, None).unwrap();
    let run = Run::start(
        &c,
        "discovery-down",
        vec![
            ResourceConfig::new("v1", "ConfigMap"),
            ResourceConfig::new("v1", "Node"),
        ],
        quick_retries(Duration::from_secs(1)),
    )
    .await;
    wait_for("discovery retried", LONG, || {
        run.count("ConfigMap", |s| &s.discovery_errors) >= 3
    })
    .await;
    let ready = run.bridge.observed().readiness();
    assert!(!ready.ok);
    assert!(
        ready.body["problems"]
            .to_string()
            .contains("API discovery failed"),
        "{}",
        ready.body
    );
    let warned = run.log("API discovery failed");
    assert!(!warned.is_empty() && warned.iter().all(|l| l.contains("WARN")));
    assert!(
        warned.len() <= 4,
        "logged at start and once a minute per resource: {warned:#?}"
    );
    c.sim.faults().clear_status("/api");
    wait_for("started once discovery answers", LONG, || {
        run.synced() && run.sink.len() == 3
    })
    .await;
    assert_eq!(run.log("API discovery succeeded").len(), 2);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_failing_discovery_does_not_hold_the_other_resources_back() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            foobars: 2,
            nodes: 2,
            seed: 1,
            ..Default::default()
        })
        .unwrap();
    let group = format!("/apis/{FOOBAR_GROUP}");
    c.sim.faults().set_status(&group, 503, None).unwrap();
    let run = Run::start(
        &c,
        "discovery-partial",
        vec![
            ResourceConfig::new(FOOBAR_API, "FooBar"),
            ResourceConfig::new("v1", "Node"),
        ],
        quick_retries(Duration::from_secs(1)),
    )
    .await;
    wait_for("nodes delivered", LONG, || run.sink.len() == 2).await;
    wait_for("FooBar discovery retried", LONG, || {
        run.count("FooBar", |s| &s.discovery_errors) >= 3
    })
    .await;
    assert!(run.sink.messages().iter().all(|m| m["kind"] == "Node"));
    c.sim.faults().clear_status(&group);
    wait_for("FooBars once their group answers", LONG, || {
        run.synced() && run.sink.len() == 4
    })
    .await;
    run.bridge.shutdown().await;
}

/// A `kubesink` child process with `ulimit -n` lowered, its stdout and stderr collected.
struct Child {
    process: tokio::process::Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Child {
    /// `kubesink ARGS` under a soft open-files limit of `soft` (and a hard one of `hard`).
    fn spawn(soft: u64, hard: Option<u64>, args: &[&str]) -> Child {
        use tokio::io::AsyncBufReadExt;
        let mut script = format!("ulimit -S -n {soft}");
        if let Some(h) = hard {
            script.push_str(&format!(" && ulimit -H -n {h}"));
        }
        script.push_str(" && exec \"$0\" \"$@\"");
        let mut process = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_kubesink"))
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn kubesink");
        let collect = |pipe: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let out = lines.clone();
            if let Some(pipe) = pipe {
                tokio::spawn(async move {
                    let mut reader = tokio::io::BufReader::new(pipe).lines();
                    while let Ok(Some(line)) = reader.next_line().await {
                        out.lock().unwrap().push(line);
                    }
                });
            }
            lines
        };
        let stdout = collect(process.stdout.take().map(|p| Box::new(p) as _));
        let stderr = collect(process.stderr.take().map(|p| Box::new(p) as _));
        Child {
            process,
            stdout,
            stderr,
        }
    }

    fn stderr_with(&self, text: &str) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(text))
            .cloned()
            .collect()
    }

    fn added(&self) -> usize {
        self.stdout
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("\"op\":\"added\""))
            .count()
    }

    /// `(soft, hard)` "Max open files" of the running child, from `/proc`.
    fn open_files_limit(&self) -> Option<(String, String)> {
        let pid = self.process.id()?;
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        let mut fields = line["Max open files".len()..].split_whitespace();
        Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
    }
}

/// A simulator with `namespaces` namespaces, one ConfigMap in each, and a kubesink
/// configuration that watches ConfigMaps with one watch per namespace.
async fn many_namespaces(namespaces: usize) -> (Cluster, tempfile::TempDir, String) {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces,
            configmaps: namespaces,
            seed: 1,
            ..Default::default()
        })
        .unwrap();
    let names: Vec<String> = c
        .sim
        .objects("v1", "Namespace")
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names.len(), namespaces);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubesink.toml");
    let text = format!(
        r#"[cluster]
name = "fds"
kubeconfig = {kubeconfig:?}
[server]
enabled = false
[log]
summary_interval = "0s"
[watch]
retry_initial_backoff = "200ms"
retry_max_backoff = "1s"
[[resources]]
api_version = "v1"
kind = "ConfigMap"
namespaces = {names:?}
[[sinks]]
type = "stdout"
"#,
        kubeconfig = c.kubeconfig.display().to_string(),
    );
    std::fs::write(&file, text).unwrap();
    let path = file.display().to_string();
    (c, dir, path)
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_soft_open_files_limit_is_raised_and_many_namespaces_sync() {
    let (_c, _dir, config) = many_namespaces(150).await;
    // 150 watches (and as many lists at first) cannot fit under 100 open files.
    let child = Child::spawn(100, None, &["--config", &config, "run"]);
    wait_for("one added per namespace", LONG, || child.added() == 150).await;
    let (soft, hard) = child.open_files_limit().expect("/proc limits");
    assert_eq!(soft, hard, "the soft limit was raised to the hard one");
    assert_eq!(
        child.stderr_with("raised the open-files soft limit").len(),
        1
    );
    assert!(child.stderr_with("too many open files").is_empty());
    assert!(child.stderr_with("watches need about").is_empty());
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_open_files_limit_too_low_is_warned_about_and_named_when_it_bites() {
    let (_c, _dir, config) = many_namespaces(150).await;
    let check = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -S -n 100 && ulimit -H -n 100 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_kubesink"))
        .args(["--config", &config, "check"])
        .output()
        .await
        .expect("kubesink check");
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: 150 watches need about 214 open files")
            && stderr.contains("limit is 100"),
        "{stderr}"
    );

    let child = Child::spawn(100, Some(100), &["--config", &config, "run"]);
    wait_for("the start-up warning", LONG, || {
        !child
            .stderr_with("150 watches need about 214 open files")
            .is_empty()
    })
    .await;
    wait_for("failures named", LONG, || {
        !child.stderr_with("too many open files (EMFILE").is_empty()
    })
    .await;
    // Logged once per failure by kubesink, not again by kube's client.
    assert!(child.stderr_with("failed with error").is_empty());
}
