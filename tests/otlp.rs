//! The OTLP sink end to end, on a real kube-apiserver (with its controllers) and a real
//! OpenTelemetry Collector built from its own Go modules (`tests/receivers/cmd/otelcol`: the
//! OTLP receiver and the file exporter): what the Collector wrote down, read back with
//! `kubesink fold --file` (OTLP JSON) and folded, must equal the API server's objects (uid
//! and resourceVersion), through churn and a 20 s Collector outage.

use kubesink_test_support::{self as support, kube_server, ports, process, receivers};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_server::{create, delete, live_state, namespace, patch, patch_configmap};
use process::Kubesink;
use receivers::{configmap, resources, KINDS};
use serde_json::{json, Value};
use support::{fold_equals, http_get, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(180);

/// A running Collector writing what it receives to `dir/logs-N.json`.
struct Collector {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    /// Files written so far, one per start (the file exporter's buffer is flushed at a
    /// graceful stop).
    files: Vec<PathBuf>,
}

impl Collector {
    fn start(dir: &Path) -> Collector {
        let mut c = Collector {
            child: Command::new("true").spawn().expect("true"),
            addr: ([127, 0, 0, 1], ports::free_port()).into(),
            dir: dir.to_owned(),
            files: Vec::new(),
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let file = self.dir.join(format!("logs-{}.json", self.files.len()));
        let config = self.dir.join("otelcol.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: {}\nexporters:\n  file:\n    path: {}\n    flush_interval: 100ms\nservice:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    logs:\n      receivers: [otlp]\n      exporters: [file]\n",
                self.addr,
                file.display()
            ),
        )
        .expect("collector config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("otelcol.log"))
            .expect("log");
        self.child = Command::new(receivers::bin().join("otelcol"))
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start otelcol");
        self.files.push(file);
        let started = Instant::now();
        while std::net::TcpStream::connect(self.addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "otelcol did not listen: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A graceful stop (SIGTERM: the Collector flushes its exporters), waited for.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("otelcol.log")).unwrap_or_default()
    }

    /// Every line the Collector wrote, in order.
    fn lines(&self) -> Vec<String> {
        self.files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The topology messages of every log record it wrote.
    fn messages(&self) -> Result<Vec<Value>, String> {
        let mut out = Vec::new();
        for line in self.lines() {
            out.extend(kubesink_otlp::reader::messages(line.as_bytes())?);
        }
        Ok(out)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn settles(what: &str, client: &kube::Client, ns: &str, c: &Collector) -> usize {
    wait_until(what, LONG, || async {
        let msgs = c.messages()?;
        let live = live_state(client, KINDS, |o| {
            o.metadata.namespace.as_deref() == Some(ns)
        })
        .await;
        fold_equals(&live, &msgs, Expect::STRICT.redelivery(), |key| key.1 == ns)
            .map_err(|diff| format!("{} messages: {diff}", msgs.len()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collectors_file_folds_to_the_real_api_server_through_churn_and_a_collector_outage() {
    let cp = kube_server::shared_async().await;
    let client = cp.admin().await;
    let ns = "otlp-main";
    namespace(cp, ns, json!({"kubesink-test": "otlp"})).await;
    for i in 0..2 {
        create(
            &client,
            kube_server::deployment(ns, &format!("web-{i}"), 3, "nginx:1.27"),
        )
        .await;
    }
    for i in 0..10 {
        create(&client, configmap(ns, &format!("cm-{i}"), i)).await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut collector = Collector::start(dir.path());
    let resources = resources(ns);
    let config = dir.path().join("kubesink.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"real\"\nkubeconfig = {:?}\n[pipeline]\nlinger = \"20ms\"\nretry_max_backoff = \"2s\"\n{resources}[[sinks]]\ntype = \"otlp\"\nendpoint = \"http://{}\"\ntimeout = \"2s\"\n",
            cp.admin_kubeconfig.display().to_string(),
            collector.addr,
        ),
    )
    .expect("config");
    let listen = format!("127.0.0.1:{}", ports::free_port());
    let k = Kubesink::start(
        BIN,
        &config,
        dir.path(),
        "otlp",
        &[("KUBESINK_SERVER__LISTEN", &listen)],
    );
    let server: SocketAddr = listen.parse().expect("listen");
    let n = settles("the initial lists", &client, ns, &collector).await;
    assert!(n >= 2 + 2 + 6 + 10, "{n} objects");

    // The k8sobjects shape: body {type, object}, event.name, k8s.resource.name, and the
    // cluster as a resource attribute.
    let first: Value = serde_json::from_str(&collector.lines()[0]).expect("OTLP JSON");
    let text = first.to_string();
    for want in [
        "\"k8s.cluster.name\"",
        "\"k8s.resource.name\"",
        "\"event.domain\"",
        "\"key\":\"type\"",
        "\"key\":\"object\"",
        "\"stringValue\":\"ADDED\"",
    ] {
        assert!(
            text.contains(want),
            "{want} in {}",
            &text[..text.len().min(2000)]
        );
    }

    // Churn, then the Collector down for 20 s while the churn goes on.
    patch(
        &client,
        "apps/v1",
        "Deployment",
        Some(ns),
        "web-0",
        json!({"spec": {"replicas": 5}}),
    )
    .await;
    for i in 0..5 {
        patch_configmap(&client, ns, &format!("cm-{i}"), json!({"n": "edited"})).await;
    }
    settles("after the first churn", &client, ns, &collector).await;
    collector.stop();
    let down = Instant::now();
    patch(
        &client,
        "apps/v1",
        "Deployment",
        Some(ns),
        "web-1",
        json!({"spec": {"replicas": 1}}),
    )
    .await;
    for i in 5..10 {
        delete(&client, "v1", "ConfigMap", Some(ns), &format!("cm-{i}")).await;
    }
    for i in 10..15 {
        create(&client, configmap(ns, &format!("cm-{i}"), i)).await;
    }
    wait_until("/readyz says the endpoint is down", LONG, || async {
        let (code, body) = http_get(server, "/readyz").await;
        (code == 503).then_some(()).ok_or(format!("{code} {body}"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(down.elapsed())).await;
    collector.spawn();
    settles("after the outage", &client, ns, &collector).await;
    wait_until("/readyz ready again", LONG, || async {
        let (code, body) = http_get(server, "/readyz").await;
        (code == 200).then_some(()).ok_or(format!("{code} {body}"))
    })
    .await;

    // `kubesink fold --file` reads the Collector's output itself.
    let all = dir.path().join("collector-all.json");
    std::fs::write(&all, collector.lines().join("\n") + "\n").expect("write");
    let fold = Command::new(BIN)
        .args(["--config"])
        .arg(&config)
        .args(["fold", "--file"])
        .arg(&all)
        .args(["--against-cluster", "--compare-resource-version"])
        .output()
        .expect("kubesink fold");
    let stderr = String::from_utf8_lossy(&fold.stderr);
    assert!(
        fold.status.success() && stderr.contains("in agreement with the cluster"),
        "{stderr}"
    );
    let (_, metrics) = http_get(server, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kubesink_sink_rejected_messages_total{sink=\"otlp\"} 0")),
        "nothing rejected"
    );
    k.terminate().await;
}
