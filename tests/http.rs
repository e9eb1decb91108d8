//! The HTTP sink end to end, on a real kube-apiserver (with its controllers) and a real
//! CloudEvents receiver this project did not write: `tests/receivers/cmd/ce-receiver` decodes
//! every request with the CloudEvents Go SDK's HTTP binding (binary, structured and batched
//! content modes; JSON Lines line by line), validates each event and writes it down; what it
//! wrote, folded, must equal the API server's objects (uid and resourceVersion).
//!
//! - every format at once, one over HTTPS with mutual TLS and a bearer token, through churn
//!   and a 20 s outage of every receiver (readiness falls and comes back);
//! - each failure answer of `sinks/http/src/sink.rs`'s table, injected by the receiver:
//!   429 with `Retry-After`, 500, a stalled request, a dropped connection, 401, and a 400 that
//!   refuses one message for good (counted, not sent again).

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

/// A running `ce-receiver`: the CloudEvents Go SDK behind an HTTP server.
struct Receiver {
    child: Child,
    addr: SocketAddr,
    out: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
}

impl Receiver {
    fn start(dir: &Path, name: &str, args: &[String]) -> Receiver {
        let mut r = Receiver {
            child: Command::new("true").spawn().expect("true"),
            addr: "127.0.0.1:0".parse().expect("addr"),
            out: dir.join(format!("{name}.jsonl")),
            args: args.to_vec(),
            dir: dir.join(name),
        };
        std::fs::create_dir_all(&r.dir).expect("dir");
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let addr_file = self.dir.join("addr");
        let _ = std::fs::remove_file(&addr_file);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .expect("log");
        self.child = Command::new(receivers::bin().join("ce-receiver"))
            .arg("-listen")
            .arg(self.addr.to_string())
            .arg("-out")
            .arg(&self.out)
            .arg("-addr-file")
            .arg(&addr_file)
            .args(&self.args)
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start ce-receiver");
        let started = Instant::now();
        loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                self.addr = a.trim().parse().expect("the receiver's address");
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "ce-receiver did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Sets a fault for the next `count` requests (`mode=status&status=429&retry_after=2`).
    async fn fault(&self, query: &str) {
        let (code, body) = http_get(self.addr, &format!("/fault?{query}")).await;
        assert_eq!(code, 204, "{body}");
    }

    async fn stats(&self) -> Value {
        let (_, body) = http_get(self.addr, "/stats").await;
        serde_json::from_str(&body).expect("stats")
    }

    /// The topology messages it wrote down: a CloudEvent's `data`, or a JSON Lines line.
    fn messages(&self) -> Result<Vec<Value>, String> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).map_err(|e| format!("{e}: {l}"))?;
                Ok(if v.get("specversion").is_some() {
                    v["data"].clone()
                } else {
                    v
                })
            })
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until what `r` wrote down, folded, equals the live objects of namespace `ns`.
async fn settles(what: &str, client: &kube::Client, ns: &str, r: &Receiver) -> usize {
    wait_until(what, LONG, || async {
        let msgs = r.messages()?;
        let live = live_state(client, KINDS, |o| {
            o.metadata.namespace.as_deref() == Some(ns)
        })
        .await;
        fold_equals(&live, &msgs, Expect::STRICT.redelivery(), |key| key.1 == ns)
            .map_err(|diff| format!("{} messages: {diff}", msgs.len()))
    })
    .await
}

/// The sample of `family` for sink `sink` in Prometheus text; panics when it is not exposed,
/// so a metric that went missing cannot pass for a zero.
fn metric(text: &str, family: &str, sink: &str) -> f64 {
    support::metric_value(text, family, &[("sink", sink)])
}

/// `kubesink_sink_errors_total` of `sink` for one error kind (transient, partial, too_large,
/// fatal).
fn errors(text: &str, sink: &str, kind: &str) -> f64 {
    support::metric_value(
        text,
        "kubesink_sink_errors_total",
        &[("sink", sink), ("kind", kind)],
    )
}

/// Every `kubesink_sink_errors_total` sample, for a failure message.
fn error_samples(text: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with("kubesink_sink_errors_total"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_delivers_the_real_api_servers_objects_through_churn_and_a_receiver_outage() {
    let cp = kube_server::shared_async().await;
    let client = cp.admin().await;
    let ns = "http-formats";
    namespace(cp, ns, json!({"kubesink-test": "http"})).await;
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
    let pki = &cp.pki.dir;
    let token = "t0ken-for-the-receiver";
    // Binary mode over HTTPS: the receiver presents the control plane's serving
    // certificate (127.0.0.1) and requires a client certificate of its CA and the token.
    let tls_args: Vec<String> = [
        "-tls-cert",
        "apiserver.crt",
        "-tls-key",
        "apiserver.key",
        "-client-ca",
        "ca.crt",
    ]
    .chunks(2)
    .flat_map(|p| [p[0].to_owned(), pki.join(p[1]).display().to_string()])
    .chain(["-bearer".to_owned(), token.to_owned()])
    .collect();
    let formats = [
        "cloudevents",
        "cloudevents-structured",
        "cloudevents-batch",
        "jsonl",
    ];
    let mut receivers: Vec<Receiver> = formats
        .iter()
        .map(|f| {
            Receiver::start(
                dir.path(),
                f,
                if *f == "cloudevents" { &tls_args } else { &[] },
            )
        })
        .collect();
    let mut sinks = String::new();
    for (f, r) in formats.iter().zip(&receivers) {
        let scheme = if *f == "cloudevents" { "https" } else { "http" };
        sinks += &format!(
            "[[sinks]]\ntype = \"http\"\nname = {f:?}\nurl = \"{scheme}://{}/events\"\nformat = {f:?}\ntimeout = \"2s\"\nmax_body_bytes = \"64KiB\"\n",
            r.addr
        );
        if *f == "cloudevents" {
            sinks += &format!(
                "health_url = \"https://{}/healthz\"\n[sinks.auth]\nbearer_token = {{ env = \"RECEIVER_TOKEN\" }}\n[sinks.tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
                r.addr,
                pki.join("ca.crt"),
                pki.join("admin.crt"),
                pki.join("admin.key"),
            );
        }
    }
    let config = dir.path().join("kubesink.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"real\"\nkubeconfig = {:?}\n[pipeline]\nlinger = \"20ms\"\nretry_max_backoff = \"2s\"\n{}{sinks}",
            cp.admin_kubeconfig.display().to_string(),
            resources(ns),
        ),
    )
    .expect("config");
    let listen = format!("127.0.0.1:{}", ports::free_port());
    let k = Kubesink::start(
        BIN,
        &config,
        dir.path(),
        "http",
        &[
            ("KUBESINK_SERVER__LISTEN", &listen),
            ("RECEIVER_TOKEN", token),
        ],
    );
    let server: SocketAddr = listen.parse().expect("listen");
    for r in &receivers {
        let n = settles("the initial lists", &client, ns, r).await;
        assert!(n >= 2 + 2 + 6 + 10, "{n} objects");
    }

    // Churn through real clients and controllers, then every receiver down for 20 s while
    // the churn goes on, then back on the same addresses.
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
    for r in &mut receivers {
        r.stop();
    }
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
    wait_until("/readyz says the receiver is down", LONG, || async {
        let (code, body) = http_get(server, "/readyz").await;
        (code == 503).then_some(()).ok_or(format!("{code} {body}"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(down.elapsed())).await;
    for r in &mut receivers {
        r.spawn();
    }
    for r in &receivers {
        let n = settles("after the outage", &client, ns, r).await;
        assert!(n >= 2 + 2 + 6 + 10, "{n} objects");
        let log = r.log();
        assert!(
            !log.contains("rejected a request"),
            "the SDK refused nothing: {log}"
        );
    }
    wait_until("/readyz ready again", LONG, || async {
        let (code, body) = http_get(server, "/readyz").await;
        (code == 200).then_some(()).ok_or(format!("{code} {body}"))
    })
    .await;
    let (_, metrics) = http_get(server, "/metrics").await;
    for f in formats {
        assert_eq!(
            metric(&metrics, "kubesink_sink_rejected_messages_total", f),
            0.0,
            "{f}"
        );
        // The churn during the outage had to be sent to a receiver that was down: each sink
        // failed at least one send, and a refused connection is one to retry, never one
        // that needs an operator (the TLS and token set-up are right).
        let all = error_samples(&metrics);
        assert!(errors(&metrics, f, "transient") >= 1.0, "{f}\n{all}");
        assert_eq!(errors(&metrics, f, "fatal"), 0.0, "{f}\n{all}");
    }

    // `kubesink fold --file` reads what a receiver wrote (CloudEvents envelopes).
    let fold = Command::new(BIN)
        .env("RECEIVER_TOKEN", token)
        .args(["--config"])
        .arg(&config)
        .args(["fold", "--file"])
        .arg(&receivers[2].out)
        .args(["--against-cluster", "--compare-resource-version"])
        .output()
        .expect("kubesink fold");
    let stderr = String::from_utf8_lossy(&fold.stderr);
    assert!(
        fold.status.success() && stderr.contains("in agreement with the cluster"),
        "{stderr}"
    );
    k.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failure_answer_behaves_as_documented() {
    let cp = kube_server::shared_async().await;
    let client = cp.admin().await;
    let ns = "http-faults";
    namespace(cp, ns, json!({"kubesink-test": "http"})).await;
    for i in 0..3 {
        create(&client, configmap(ns, &format!("cm-{i}"), i)).await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let r = Receiver::start(dir.path(), "receiver", &[]);
    let config = dir.path().join("kubesink.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"real\"\nkubeconfig = {:?}\n[pipeline]\nlinger = \"20ms\"\nretry_max_backoff = \"10s\"\n[[resources]]\napi_version = \"v1\"\nkind = \"ConfigMap\"\nnamespaces = [{ns:?}]\n[[sinks]]\ntype = \"http\"\nname = \"hook\"\nurl = \"http://{}/events\"\ntimeout = \"1s\"\nrequests_in_flight = 1\n",
            cp.admin_kubeconfig.display().to_string(),
            r.addr,
        ),
    )
    .expect("config");
    let listen = format!("127.0.0.1:{}", ports::free_port());
    let k = Kubesink::start(
        BIN,
        &config,
        dir.path(),
        "faults",
        &[("KUBESINK_SERVER__LISTEN", &listen)],
    );
    let server: SocketAddr = listen.parse().expect("listen");
    let only = |key: &(String, String, String)| key.0 == "ConfigMap";
    let settled = |what: &'static str| {
        let (client, r) = (&client, &r);
        async move {
            wait_until(what, LONG, || async {
                let msgs = r.messages()?;
                let live = live_state(client, &[("v1", "ConfigMap")], |o| {
                    o.metadata.namespace.as_deref() == Some(ns)
                })
                .await;
                fold_equals(&live, &msgs, Expect::STRICT.redelivery(), |key| {
                    key.1 == ns && only(key)
                })
                .map_err(|diff| format!("{} messages: {diff}", msgs.len()))
            })
            .await
        }
    };
    settled("the initial list").await;

    // Each retried answer: the next requests get it, then the change arrives anyway.
    let mut n = 0;
    for (fault, count) in [
        ("mode=status&status=429&retry_after=3", 2),
        ("mode=status&status=500", 3),
        ("mode=status&status=503&retry_after=1", 1),
        ("mode=stall", 2),
        ("mode=drop", 3),
        ("mode=status&status=401", 1),
    ] {
        let before = r.stats().await["faulted"].as_u64().unwrap_or(0);
        r.fault(&format!("{fault}&count={count}")).await;
        let started = Instant::now();
        n += 1;
        patch_configmap(&client, ns, "cm-0", json!({"n": format!("fault-{n}")})).await;
        settled("after the fault").await;
        let faulted = r.stats().await["faulted"].as_u64().unwrap_or(0) - before;
        assert_eq!(faulted, count, "{fault}: every faulted request was retried");
        if fault.contains("429") {
            // Two answers of Retry-After: 3: at least 6 s before the change got through
            // (a floor; the backoff alone is 0.1 s, then 0.2 s).
            assert!(
                started.elapsed() >= Duration::from_millis(5800),
                "{fault}: {:?}",
                started.elapsed()
            );
        }
        eprintln!("{fault} ×{count}: delivered after {:?}", started.elapsed());
    }

    // The log says what each outage was: a receiver answering 429/5xx refuses (it is
    // reached), one that drops the connection or stalls is out of reach.
    let log = std::fs::read_to_string(&k.log).unwrap_or_default();
    for words in [
        "HTTP receiver answers with errors; retrying with the pipeline's backoff; one out of reach is retried as soon as it accepts connections again, one answering with errors up to pipeline.retry_max_backoff after it is well (set health_url to resume as soon as it is)",
        "HTTP receiver accepts again",
        "HTTP receiver unreachable;",
        "HTTP receiver reachable again",
    ] {
        assert!(log.contains(words), "{words:?} missing from the log: {log}");
    }

    // A 400 refuses the one message of its request for good: counted and logged, not sent
    // again; the key's next change heals the fold.
    r.fault("mode=status&status=400&count=1").await;
    patch_configmap(&client, ns, "cm-1", json!({"n": "refused"})).await;
    wait_until("the refused message counted", LONG, || async {
        let (_, m) = http_get(server, "/metrics").await;
        let got = support::metric(
            &m,
            "kubesink_sink_rejected_messages_total",
            &[("sink", "hook")],
        );
        (got == Some(1.0)).then_some(()).ok_or(format!("{got:?}"))
    })
    .await;
    let log = std::fs::read_to_string(&k.log).unwrap_or_default();
    assert!(
        log.contains("the receiver refused the message for good"),
        "{log}"
    );
    assert!(
        settled_fails_for_cm1(&client, ns, &r).await,
        "the refused change is not in the receiver's file"
    );
    patch_configmap(&client, ns, "cm-1", json!({"n": "healed"})).await;
    settled("after the key's next change").await;
    // Every faulted request above was a failed send of the one message pending (each fault
    // came with one change, delivered before the next): the 429s, 500s, 503, stalls and
    // drops are transient, the 401 needs an operator (fatal, retried at the maximum
    // backoff); the refused 400 is counted as rejected, not as an error, and nothing was
    // too large or partly sent. At least one transient error per retried faulted request
    // (2 + 3 + 1 + 2 + 3 = 11): a failure the receiver did not inject (a connection closing
    // under a retry) could add one.
    let (_, m) = http_get(server, "/metrics").await;
    eprintln!(
        "failed sends: {} transient, {} fatal",
        errors(&m, "hook", "transient"),
        errors(&m, "hook", "fatal")
    );
    let all = error_samples(&m);
    assert!(errors(&m, "hook", "transient") >= 11.0, "{all}");
    assert_eq!(errors(&m, "hook", "fatal"), 1.0, "{all}");
    assert_eq!(errors(&m, "hook", "partial"), 0.0, "{all}");
    assert_eq!(errors(&m, "hook", "too_large"), 0.0, "{all}");
    assert_eq!(
        metric(&m, "kubesink_sink_rejected_messages_total", "hook"),
        1.0,
        "the 400 refused one message"
    );
    k.terminate().await;
}

/// Whether the receiver's fold of `cm-1` lacks the live resourceVersion (the refused change).
async fn settled_fails_for_cm1(client: &kube::Client, ns: &str, r: &Receiver) -> bool {
    let live = live_state(client, &[("v1", "ConfigMap")], |o| {
        o.metadata.namespace.as_deref() == Some(ns)
    })
    .await;
    let msgs = r.messages().unwrap_or_default();
    fold_equals(&live, &msgs, Expect::STRICT.redelivery(), |key| key.1 == ns).is_err()
}

/// A receiver out of reach (stopped: connections refused) that comes back is retried as
/// soon as it accepts connections, not after the pipeline's backoff: with a backoff of ten
/// minutes, the change made while it was down arrives within the wait's timeout (three
/// minutes), found by the readiness probe's TCP connection (no `health_url`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_out_of_reach_is_retried_as_soon_as_it_listens_again() {
    let cp = kube_server::shared_async().await;
    let client = cp.admin().await;
    let ns = "http-listens";
    namespace(cp, ns, json!({"kubesink-test": "http"})).await;
    create(&client, configmap(ns, "cm-0", 0)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = Receiver::start(dir.path(), "receiver", &[]);
    let config = dir.path().join("kubesink.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"real\"\nkubeconfig = {:?}\n[pipeline]\nlinger = \"20ms\"\nretry_initial_backoff = \"10m\"\nretry_max_backoff = \"10m\"\n[[resources]]\napi_version = \"v1\"\nkind = \"ConfigMap\"\nnamespaces = [{ns:?}]\n[[sinks]]\ntype = \"http\"\nname = \"hook\"\nurl = \"http://{}/events\"\ntimeout = \"1s\"\n",
            cp.admin_kubeconfig.display().to_string(),
            r.addr,
        ),
    )
    .expect("config");
    let k = Kubesink::start(BIN, &config, dir.path(), "listens", &[]);
    let arrived = |r: &Receiver, v: &str| {
        r.messages()
            .unwrap_or_default()
            .iter()
            .any(|m| m["name"] == "cm-0" && m["object"]["data"]["n"] == v)
    };
    wait_until("the initial list", LONG, || async {
        arrived(&r, "0").then_some(()).ok_or_else(|| k.stderr())
    })
    .await;
    r.stop();
    patch_configmap(&client, ns, "cm-0", json!({"n": "while-down"})).await;
    wait_until("the receiver logged unreachable", LONG, || async {
        let log = std::fs::read_to_string(&k.log).unwrap_or_default();
        log.contains("HTTP receiver unreachable")
            .then_some(())
            .ok_or(log)
    })
    .await;
    r.spawn();
    wait_until("the change made while it was down", LONG, || async {
        arrived(&r, "while-down")
            .then_some(())
            .ok_or_else(|| k.stderr())
    })
    .await;
    k.terminate().await;
}
