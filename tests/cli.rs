//! The `kubesink` binary end to end: `check` exit codes and messages, `run` writing JSON
//! Lines to stdout against the simulator and exiting 0 on SIGTERM, and `demo`.

use kubesink_test_support as support;

use std::process::Stdio;
use std::time::Duration;

use kubesink_sim::{SimConfig, Workload};
use serde_json::Value;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");

fn kubesink() -> Command {
    // A clean environment for configuration: only what each test sets.
    let mut c = support::process::clean_command(BIN);
    // Tests run in parallel: the HTTP server on a free port.
    c.env("KUBESINK_SERVER__LISTEN", "127.0.0.1:0");
    c
}

/// The support crate finds the binary at run time (`run_kubesink`): the file cargo names.
#[test]
fn the_support_crate_runs_the_binary_cargo_built() {
    assert_eq!(support::kubesink_bin(), std::path::Path::new(BIN));
    let root = std::path::Path::new(support::ROOT).canonicalize().unwrap();
    assert_eq!(
        root,
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .canonicalize()
            .unwrap()
    );
}

#[tokio::test]
async fn check_accepts_the_reference_config_and_prints_it() {
    let out = kubesink()
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/kubesink.toml"),
        ])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("name = \"prod-eu-1\"") && stdout.contains("[[sinks]]"),
        "{stdout}"
    );
}

#[tokio::test]
async fn check_lists_every_problem_with_key_and_source_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[cluster]\nlabel = \"no spaces allowed\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nfields = [\"/spec\"]\n").unwrap();
    let out = kubesink()
        .args(["check", "--config"])
        .arg(&file)
        .env("KUBESINK_PIPELINE__LINGER", "5 parsecs")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("pipeline.linger: invalid duration \"5 parsecs\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("(from env KUBESINK_PIPELINE__LINGER)"),
        "{stderr}"
    );
    // The checks across keys of the sections that parsed are in the same run.
    for want in [
        "cluster.name: required",
        "cluster.label: \"no spaces allowed\"",
        "resources.0.fields: fields is only used with payload = \"fields\"",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in {stderr}");
    }
    assert!(
        stderr.contains(&format!("(from file {})", file.display())),
        "{stderr}"
    );
    let out = kubesink()
        .args(["check", "--config", "/nonexistent.toml"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml does not exist"));
}

/// A first configuration with three mistakes in one `[[resources]]` entry and two misspelt
/// environment variables: one `check` names all five, in the file's terms.
#[tokio::test]
async fn check_reports_every_mistake_of_a_first_config_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("first.toml");
    std::fs::write(
        &file,
        "[cluster]\nname = \"prod-eu-1\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nnamespaces = \"default\"\npayload = \"ful\"\npage_size = \"big\"\n",
    )
    .unwrap();
    let (code, stderr) = check(
        &file,
        &[
            ("KUBESINK_CLUSTER__NAEM", "x"),
            ("KUBESINK_PIPELNE__LINGER", "50ms"),
        ],
    )
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    for want in [
        "5 configuration problems:",
        "resources.0.namespaces: expected a list, such as [\"a\", \"b\"], found the string \"default\"",
        "resources.0.payload: \"ful\" is not one of \"full\", \"metadata\" or \"fields\" (did you mean \"full\"?)",
        "resources.0.page_size: expected a whole number (0 or more), found the string \"big\"",
        "cluster.naem: unknown key \"naem\" (did you mean \"name\"?)",
        "(from env KUBESINK_CLUSTER__NAEM)",
        "pipelne: unknown section \"pipelne\" (did you mean \"pipeline\"?)",
        "(from env KUBESINK_PIPELNE__LINGER)",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in {stderr}");
    }
    assert!(!stderr.contains('`') && !stderr.contains("u32"), "{stderr}");
}

/// `kubesink check --config FILE` with `env` set: its exit code and stderr.
async fn check(file: &std::path::Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = kubesink();
    cmd.args(["check", "--config"])
        .arg(file)
        .env_remove("KUBESINK_CLUSTER__NAME");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Reads `n` JSON lines from the child's stdout, failing after `timeout`; the pipe is closed
/// after them (the child's next write fails).
async fn read_lines(child: &mut Child, n: usize, timeout: Duration) -> Vec<Value> {
    read_lines_then(child, n, timeout, false).await
}

/// [`read_lines`]; with `drain`, the rest of stdout is read (and dropped) in the background
/// until the child closes it, so the child never writes into a closed pipe.
async fn read_lines_then(
    child: &mut Child,
    n: usize,
    timeout: Duration,
    drain: bool,
) -> Vec<Value> {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut out = Vec::new();
    tokio::time::timeout(timeout, async {
        while out.len() < n {
            match lines.next_line().await.unwrap() {
                Some(l) => out.push(
                    serde_json::from_str::<Value>(&l)
                        .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}")),
                ),
                None => panic!("stdout closed after {} lines", out.len()),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "timed out after {timeout:?} with {} of {n} lines",
            out.len()
        )
    });
    if drain {
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    }
    out
}

async fn signal_and_wait(child: &mut Child, signal: &str) -> Option<i32> {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("exits after the signal")
        .unwrap();
    status.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_streams_schema_valid_json_lines_and_exits_0_on_sigterm() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 40,
            nodes: 5,
            seed: 8,
            ..Default::default()
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("k.toml");
    std::fs::write(
        &file,
        format!(
            "[cluster]\nname = \"e2e\"\nkubeconfig = {:?}\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Node\"\n[[sinks]]\ntype = \"stdout\"\n",
            c.kubeconfig.display().to_string()
        ),
    )
    .unwrap();
    let mut child = kubesink()
        .args(["run", "--config"])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let msgs = read_lines(&mut child, 45, Duration::from_secs(60)).await;
    assert_schema_valid(&schema(), &msgs);
    assert!(msgs
        .iter()
        .all(|m| m["cluster"] == "e2e" && m["op"] == "added"));
    assert_eq!(signal_and_wait(&mut child, "-TERM").await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_shows_messages_within_seconds_and_stops_on_ctrl_c() {
    let mut child = kubesink()
        .args([
            "demo",
            "--pods",
            "20",
            "--churn",
            "50",
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Read on until it exits: a closed pipe would end it with exit 1 before the signal (as
    // the next test wants), which made this test depend on how fast the demo writes.
    let msgs = read_lines_then(&mut child, 60, Duration::from_secs(60), true).await;
    assert_schema_valid(&schema(), &msgs);
    let kinds: std::collections::BTreeSet<_> =
        msgs.iter().filter_map(|m| m["kind"].as_str()).collect();
    assert!(
        kinds.contains("Pod") && kinds.contains("Node") && kinds.contains("FooBar"),
        "{kinds:?}"
    );
    assert_eq!(signal_and_wait(&mut child, "-INT").await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_when_port_9090_is_taken_and_says_where_metrics_are() {
    // Port 9090 taken: by this test, or by whoever had it already.
    let _held = std::net::TcpListener::bind("127.0.0.1:9090");
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr.log");
    let mut child = kubesink()
        .args(["demo", "--pods", "20"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let log = wait_until(
        "the demo's address in its log",
        Duration::from_secs(30),
        || {
            let log = std::fs::read_to_string(&err).unwrap_or_default();
            async move {
                if log.contains("demo running") {
                    Ok(log)
                } else {
                    Err(log)
                }
            }
        },
    )
    .await;
    assert!(log.contains("127.0.0.1:9090 is taken"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("demo running"))
        .unwrap_or_default()
        .to_owned();
    let at = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_default();
    let addr: std::net::SocketAddr = at.parse().unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_ne!(addr.port(), 9090, "{line}");
    wait_until(
        "messages delivered, seen in /metrics",
        Duration::from_secs(60),
        || async move {
            let (code, body) = http_get(addr, "/metrics").await;
            match metric(&body, "kubesink_sink_delivered_messages_total", &[]) {
                Some(n) if code == 200 && n > 0.0 => Ok(()),
                other => Err(format!("{code}: {other:?}")),
            }
        },
    )
    .await;
    assert_eq!(signal_and_wait(&mut child, "-INT").await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_piped_into_a_reader_that_stops_reading_exits_instead_of_retrying_forever() {
    // `kubesink demo | head -3`: once the reader is gone every write fails with EPIPE.
    // EPIPE is not transient: retried forever, the pipeline would never end. It exits,
    // saying why.
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr.log");
    let mut child = kubesink()
        .args([
            "demo",
            "--pods",
            "200",
            "--churn",
            "200",
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let msgs = read_lines(&mut child, 3, Duration::from_secs(60)).await; // the pipe's reader is dropped
    assert_eq!(msgs.len(), 3);
    let exited = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
    let log = std::fs::read_to_string(&err).unwrap_or_default();
    let status = exited
        .unwrap_or_else(|_| panic!("still running 60 s after its reader left:\n{log}"))
        .unwrap();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("closed by its reader"), "{log}");
}

#[tokio::test]
async fn check_warns_when_two_resources_are_the_same_objects_under_two_api_groups() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.toml");
    std::fs::write(
        &file,
        "[cluster]\nname = \"p\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Event\"\n[[resources]]\napi_version = \"events.k8s.io/v1\"\nkind = \"Event\"\n",
    )
    .unwrap();
    let out = kubesink()
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a warning, not an error: {stderr}"
    );
    assert!(
        stderr.contains("warning: resources.0 (v1 Event) and resources.1 (events.k8s.io/v1 Event) are the same objects under two API groups: every change is reported twice"),
        "{stderr}"
    );
    assert!(
        stderr.contains("configuration OK, with 1 warning(s)"),
        "{stderr}"
    );
}

#[tokio::test]
async fn check_rejects_a_state_location_without_a_backend_from_the_file_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let name = "[cluster]\nname = \"p\"\n";
    let state_file = dir.path().join("state").display().to_string();
    // (file contents, environment variable, key reported, fix named)
    let file_path = format!("{name}[state]\npath = {state_file:?}\n");
    let env_path = ("KUBESINK_STATE__PATH", state_file.as_str());
    let mut cases = vec![
        (
            file_path.as_str(),
            None,
            "state.path: ",
            "state.backend = \"file\"",
        ),
        (
            name,
            Some(env_path),
            "state.path: ",
            "state.backend = \"file\"",
        ),
    ];
    let file_nats = format!("{name}[state.nats]\nbucket = \"KUBESINK_STATE\"\n");
    if cfg!(feature = "nats") {
        let env_nats = ("KUBESINK_STATE__NATS__BUCKET", "B");
        cases.push((
            file_nats.as_str(),
            None,
            "state.nats.bucket: ",
            "state.backend = \"nats\"",
        ));
        cases.push((
            name,
            Some(env_nats),
            "state.nats.bucket: ",
            "state.backend = \"nats\"",
        ));
    }
    for (toml, env, key, fix) in cases {
        std::fs::write(&file, toml).unwrap();
        let mut cmd = kubesink();
        cmd.args(["check", "--config"]).arg(&file);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{toml:?} {env:?}: {stderr}");
        let source = match env {
            Some((k, _)) => format!("(from env {k})"),
            None => format!("(from file {})", file.display()),
        };
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(key) && l.contains(fix) && l.ends_with(&source)),
            "{toml:?} {env:?}: {stderr}"
        );
    }
    // Naming the backend makes the same file valid.
    std::fs::write(
        &file,
        format!("{name}[state]\nbackend = \"file\"\npath = {state_file:?}\n"),
    )
    .unwrap();
    let out = kubesink()
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every credential a configuration can send, over plaintext and over TLS.
#[cfg(all(feature = "nats", feature = "kafka"))]
fn credentials_config(kubeconfig: &std::path::Path) -> String {
    format!(
        r#"[cluster]
name = "creds"
kubeconfig = {kubeconfig:?}
[[resources]]
api_version = "v1"
kind = "ConfigMap"
[[sinks]]
type = "stdout"
[[sinks]]
type = "nats"
name = "n-token"
servers = ["nats://127.0.0.1:1"]
[sinks.auth]
token = "token-SECRET1"
[[sinks]]
type = "nats"
name = "n-user"
servers = ["127.0.0.1:1"]
[sinks.auth]
user = "u"
password = "password-SECRET2"
[[sinks]]
type = "nats"
name = "n-nkey"
servers = ["nats://127.0.0.1:1"]
[sinks.auth]
nkey_seed = "SUSEED-SECRET3"
[[sinks]]
type = "nats"
name = "n-creds"
servers = ["nats://127.0.0.1:1"]
[sinks.auth]
credentials_file = "/etc/kubesink/nats.creds"
[sinks.tls]
ca_file = "/etc/kubesink/ca.pem"
[[sinks]]
type = "nats"
name = "n-url"
servers = ["nats://u:url-SECRET4@127.0.0.1:1"]
[[sinks]]
type = "nats"
name = "n-mixed"
servers = ["tls://127.0.0.1:1", "nats://127.0.0.2:1"]
[sinks.auth]
token = "token-SECRET5"
[[sinks]]
type = "nats"
name = "n-tls-url"
servers = ["tls://127.0.0.1:1"]
[sinks.auth]
token = "token-SECRET6"
[[sinks]]
type = "nats"
name = "n-tls-required"
servers = ["nats://127.0.0.1:1"]
[sinks.auth]
token = "token-SECRET7"
[sinks.tls]
required = true
[[sinks]]
type = "nats"
name = "n-anonymous"
servers = ["nats://127.0.0.1:1"]
[[sinks]]
type = "kafka"
name = "k-plain"
bootstrap_servers = "127.0.0.1:1"
[sinks.security]
protocol = "sasl_plaintext"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "u"
sasl_password = "sasl-SECRET8"
[[sinks]]
type = "kafka"
name = "k-tls"
bootstrap_servers = "127.0.0.1:1"
[sinks.security]
protocol = "sasl_ssl"
sasl_mechanism = "PLAIN"
sasl_username = "u"
sasl_password = "sasl-SECRET9"
[state]
backend = "nats"
[state.nats]
servers = ["nats://127.0.0.1:1"]
[state.nats.auth]
user = "u"
password = "state-SECRET10"
"#
    )
}

/// The warnings `check` and `run` must give for [`credentials_config`], as (key, text).
#[cfg(all(feature = "nats", feature = "kafka"))]
const PLAINTEXT_WARNINGS: &[&str] = &[
    "sinks[1] (n-token): auth.token: ",
    "sinks[2] (n-user): auth.password: ",
    "sinks[3] (n-nkey): auth.nkey_seed: ",
    "sinks[4] (n-creds): auth.credentials_file: ",
    "sinks[5] (n-url): servers: ",
    "sinks[6] (n-mixed): auth.token: ",
    "sinks[10] (k-plain): security.protocol: sasl_plaintext",
    "state.nats.auth.password: ",
];

#[cfg(all(feature = "nats", feature = "kafka"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_run_warn_about_every_credential_sent_without_tls() {
    let c = cluster(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("creds.toml");
    std::fs::write(&file, credentials_config(&c.kubeconfig)).unwrap();
    let out = kubesink()
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "warnings, not errors: {stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("warning: "))
        .filter(|l| !l.contains("open files"))
        // Warned about too, not about TLS: the credentials file is not here, the state
        // store is on the loopback.
        .filter(|l| !l.contains("does not exist here") && !l.contains("loopback"))
        .collect();
    for want in PLAINTEXT_WARNINGS {
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with(want) && w.contains("TLS")),
            "no warning {want:?} in {warnings:#?}"
        );
    }
    assert_eq!(
        warnings.len(),
        PLAINTEXT_WARNINGS.len(),
        "over TLS (tls:// URLs, tls.required) or without credentials: no warning: {warnings:#?}"
    );
    for w in &warnings {
        assert!(!w.contains("SECRET"), "a warning shows a credential: {w}");
    }
    assert!(
        warnings.iter().any(|w| w.starts_with("sinks[6]")
            && w.contains("nats://127.0.0.2:1")
            && !w.contains("tls://127.0.0.1:1")),
        "the mixed list names its plaintext server: {warnings:#?}"
    );

    // `run` logs the same warnings at start (before it connects anywhere).
    let mut child = kubesink()
        .args(["run", "--config"])
        .arg(&file)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut missing: Vec<&str> = PLAINTEXT_WARNINGS.to_vec();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while !missing.is_empty() {
            let Some(l) = lines.next_line().await.unwrap() else {
                break;
            };
            if l.contains("WARN") {
                missing.retain(|w| !l.contains(w));
            }
            seen.push(l);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("run did not log {missing:?}; stderr: {seen:#?}"));
    assert!(
        missing.is_empty(),
        "run did not log {missing:?}; stderr: {seen:#?}"
    );
    let _ = child.kill().await;
}

/// The shipped Kafka overlay as it is: `check` and `run` refuse its two placeholders (the
/// cluster's name and the SASL password), naming each key; with the name from the
/// environment, only the password is left.
#[tokio::test]
async fn check_and_run_refuse_the_shipped_placeholders_naming_each_key() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/overlays/kafka/kubesink.toml");
    for command in ["check", "run"] {
        let out = kubesink()
            .args([command, "--config"])
            .arg(&file)
            .env_remove("KUBESINK_CLUSTER__NAME")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        for want in [
            "cluster.name: is still the placeholder \"CHANGE-ME\"",
            "sinks.0.security.sasl_password: is still the placeholder \"CHANGE-ME\"",
        ] {
            assert!(
                stderr.contains(want),
                "{command}: missing {want:?} in {stderr}"
            );
        }
    }
    let (code, stderr) = check(&file, &[("KUBESINK_CLUSTER__NAME", "prod-eu-1")]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("1 configuration problem:") && stderr.contains("sasl_password"),
        "{stderr}"
    );
}

#[tokio::test]
async fn check_strict_makes_a_missing_kubeconfig_an_error_naming_its_entry() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet.toml");
    std::fs::write(
        &file,
        "[[clusters]]\nname = \"a\"\nkubeconfig = \"/nonexistent/a\"\n[[clusters]]\nname = \"b\"\nkubeconfig = \"/nonexistent/b\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n",
    )
    .unwrap();
    let (code, stderr) = check(&file, &[]).await;
    assert_eq!(code, Some(0), "a warning without --strict: {stderr}");
    assert!(
        stderr.contains("warning: clusters.1.kubeconfig: /nonexistent/b does not exist here"),
        "{stderr}"
    );
    let out = kubesink()
        .args(["check", "--strict", "--config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for key in ["clusters.0.kubeconfig", "clusters.1.kubeconfig"] {
        assert!(
            stderr.contains(&format!("error (--strict): {key}: /nonexistent/")),
            "{stderr}"
        );
    }
    assert!(
        !stderr.contains("warning: clusters."),
        "not twice: {stderr}"
    );
    // No cluster's kubeconfig is here: check says run refuses, and run says why.
    let (_, stderr) = check(&file, &[]).await;
    assert!(
        stderr.contains("/nonexistent/b does not exist here or is not a file (`kubesink run` refuses to start without it: no cluster's kubeconfig is here;"),
        "{stderr}"
    );
    let (code, stderr) = command(&["run"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "no cluster's client could be built (all 2 failed), so kubesink cannot start"
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains("fine if it is mounted"),
        "run says what is missing where it runs: {stderr}"
    );
}

#[tokio::test]
async fn run_with_an_unreadable_kubeconfig_names_its_key_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.toml");
    std::fs::write(
        &file,
        "[cluster]\nname = \"a\"\nkubeconfig = \"/nonexistent/a\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"stdout\"\n",
    )
    .unwrap();
    let out = kubesink()
        .args(["run", "--config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: cluster.kubeconfig /nonexistent/a: "),
        "{stderr}"
    );
}

/// `kubesink check|run --config FILE` (`args` after the command): exit code and stderr.
async fn command(args: &[&str], file: &std::path::Path) -> (Option<i32>, String) {
    let out = kubesink()
        .args(args)
        .arg("--config")
        .arg(file)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A TLS file that is there but unusable (otherwise `run` fails only at the first TLS
/// connection, or when librdkafka refuses the producer): `check` and `run` both name it at
/// its key, with the path and why, for a NATS sink with TLS certain and a Kafka sink with
/// `ssl`; without TLS certain it is not read.
#[tokio::test]
async fn a_tls_file_that_is_there_but_unusable_is_named_by_check_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("ca.pem");
    std::fs::write(&garbage, "not PEM at all\n").unwrap();
    let file = dir.path().join("k.toml");
    let write = |required: bool| {
        std::fs::write(
            &file,
            format!("[cluster]\nname = \"a\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"nats\"\nservers = [\"nats://127.0.0.1:1\"]\nmode = \"core\"\n[sinks.tls]\nca_file = {garbage:?}\nrequired = {required}\n[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = \"127.0.0.1:1\"\n[sinks.security]\nprotocol = \"ssl\"\nssl_ca_location = {garbage:?}\n"),
        )
        .unwrap();
    };
    write(true);
    let path = garbage.display().to_string();
    for args in [&["check"][..], &["run"][..]] {
        let (code, stderr) = command(args, &file).await;
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "sinks.0.tls.ca_file: {path} holds no PEM CERTIFICATE block"
            )),
            "{args:?}: {stderr}"
        );
        if args == ["check"] {
            assert!(
                stderr.contains(&format!("sinks.1.security.ssl_ca_location: librdkafka cannot use {path}: ssl.ca.location failed")),
                "{stderr}"
            );
        }
    }
    // nats:// without tls.required: the file is read only if the server demands TLS (the
    // Kafka sink's, with ssl, still is).
    write(false);
    let (code, stderr) = command(&["check"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        !stderr.contains("sinks.0.tls.ca_file")
            && stderr.contains("sinks.1.security.ssl_ca_location: librdkafka cannot use"),
        "{stderr}"
    );
}

#[tokio::test]
async fn check_refuses_an_unknown_librdkafka_property_of_a_kafka_sink_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kafka.toml");
    std::fs::write(
        &file,
        "[cluster]\nname = \"a\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = \"127.0.0.1:1\"\n[sinks.security]\nprotocol = \"ssl\"\n[sinks.librdkafka]\n\"socket.keepalive.enabel\" = \"true\"\n\"socket.timeout.ms\" = \"soon\"\n\"ssl.keystore.location\" = \"/nonexistent/k.p12\"\n",
    )
    .unwrap();
    for args in [&["check"][..], &["run"][..]] {
        let (code, stderr) = command(args, &file).await;
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("sinks.0.librdkafka.\"socket.keepalive.enabel\": librdkafka has no such property (did you mean \"socket.keepalive.enable\"?)")
                && stderr.contains("sinks.0.librdkafka.\"socket.timeout.ms\": librdkafka refuses it: Invalid value"),
            "{args:?}: {stderr}"
        );
        if args == ["check"] {
            assert!(
                stderr.contains("warning: sinks.0.librdkafka.\"ssl.keystore.location\": /nonexistent/k.p12 does not exist here"),
                "a file of a passthrough property, beside the errors: {stderr}"
            );
        }
    }
}

#[tokio::test]
async fn check_names_a_missing_nats_credentials_file_that_run_refuses_and_strict_fails() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nats.toml");
    std::fs::write(
        &file,
        "[cluster]\nname = \"a\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"nats\"\nservers = [\"nats://127.0.0.1:1\"]\nmode = \"core\"\n[sinks.auth]\ncredentials_file = \"/nonexistent/nats.creds\"\n[sinks.tls]\nca_file = \"/nonexistent/ca.pem\"\nrequired = true\n",
    )
    .unwrap();
    let (code, stderr) = command(&["check"], &file).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: sinks.0.tls.ca_file: /nonexistent/ca.pem does not exist here"),
        "a TLS file too: {stderr}"
    );
    assert!(
        stderr.contains(
            "warning: sinks.0.auth.credentials_file: /nonexistent/nats.creds does not exist here"
        ),
        "{stderr}"
    );
    let (code, stderr) = command(&["check", "--strict"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error (--strict): sinks.0.auth.credentials_file: /nonexistent/nats.creds"),
        "{stderr}"
    );
    // What check names is what run refuses.
    let (code, stderr) = command(&["run"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("auth.credentials_file") && stderr.contains("/nonexistent/nats.creds"),
        "{stderr}"
    );
}

/// `kubesink check` of `file`, then `check` of what it printed: both pass.
async fn check_round_trips(file: &std::path::Path, dir: &std::path::Path) {
    let out = kubesink()
        .args(["check", "--config"])
        .arg(file)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = dir.join("printed.toml");
    std::fs::write(&printed, &stdout).unwrap();
    let again = kubesink()
        .args(["check", "--config"])
        .arg(&printed)
        .output()
        .await
        .unwrap();
    assert_eq!(
        again.status.code(),
        Some(0),
        "what check printed for {} does not load again: {}\n{stdout}",
        file.display(),
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        stdout,
        "and prints the same"
    );
}

#[tokio::test]
async fn the_configuration_check_prints_loads_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("config/kubesink.toml")];
    for example in ["fleet", "kafka", "nats", "stdout"] {
        files.push(root.join(format!("config/examples/{example}.toml")));
    }
    let own = [
        ("none.toml", "[cluster]\nname = \"a\"\n"),
        (
            "file.toml",
            "[cluster]\nname = \"a\"\n[state]\nbackend = \"file\"\npath = \"/tmp/state\"\n",
        ),
        (
            "nats.toml",
            "[cluster]\nname = \"a\"\n[state]\nbackend = \"nats\"\n[state.nats]\nservers = [\"nats://n:4222\"]\n",
        ),
        (
            "kafka.toml",
            "[cluster]\nname = \"a\"\n[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = \"k:9092\"\n[state]\nbackend = \"kafka\"\n",
        ),
    ];
    for (name, text) in own {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        files.push(f);
    }
    for f in files {
        check_round_trips(&f, dir.path()).await;
    }
}

/// With leader election, the Lease cluster's missing kubeconfig stops `run`, so `check` must
/// not warn of it as "this cluster cannot be watched without it" (as if the fleet went on).
/// `check` says what `run` does with each missing kubeconfig, and `run` refuses exactly the
/// one `check` says it refuses.
#[tokio::test]
async fn check_says_which_missing_kubeconfig_run_refuses_to_start_without() {
    let dir = tempfile::tempdir().unwrap();
    let reachable = dir.path().join("b.kubeconfig");
    std::fs::write(
        &reachable,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: b\n  context:\n    cluster: b\n    user: b\ncurrent-context: b\nusers:\n- name: b\n  user: {}\n",
    )
    .unwrap();
    let file = dir.path().join("fleet.toml");
    std::fs::write(
        &file,
        format!(
            "[[clusters]]\nname = \"a\"\nkubeconfig = \"/nonexistent/a\"\n[[clusters]]\nname = \"b\"\nkubeconfig = {reachable:?}\n[[clusters]]\nname = \"c\"\nkubeconfig = \"/nonexistent/c\"\n[leader_election]\nenabled = true\ncluster = \"a\"\nlease_namespace = \"default\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"stdout\"\n"
        ),
    )
    .unwrap();
    let (code, stderr) = check(&file, &[]).await;
    assert_eq!(code, Some(0), "warnings without --strict: {stderr}");
    assert!(
        stderr.contains("warning: clusters.0.kubeconfig: /nonexistent/a does not exist here or is not a file (`kubesink run` refuses to start without it: cluster \"a\" holds the leader-election Lease;"),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: clusters.2.kubeconfig: /nonexistent/c does not exist here or is not a file (cluster \"c\" cannot be watched without it: the other clusters run, it is retried;"),
        "{stderr}"
    );
    let (code, stderr) = command(&["check", "--strict"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error (--strict): clusters.0.kubeconfig: /nonexistent/a does not exist or is not a file (`kubesink run` refuses to start without it")
            && !stderr.contains("fine if it is mounted"),
        "{stderr}"
    );
    let (code, stderr) = command(&["run"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("clusters.0.kubeconfig /nonexistent/a")
            && stderr.contains("holds the leader-election Lease"),
        "{stderr}"
    );
}

/// Errors must not hide warnings or, with `--strict`, missing files: fixing the errors must
/// not reveal a second list. One run says it all.
#[tokio::test]
async fn check_reports_warnings_and_strict_errors_beside_the_errors_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mixed.toml");
    std::fs::write(
        &file,
        "[cluster]\nname = \"a\"\n[pipeline]\nmax_pending = 0\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nnamespaces = [\"x\"]\n[[sinks]]\ntype = \"nats\"\nservers = [\"nats://127.0.0.1:1\"]\nmode = \"core\"\n[sinks.auth]\ncredentials_file = \"/nonexistent/nats.creds\"\n",
    )
    .unwrap();
    let (code, stderr) = command(&["check"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("pipeline.max_pending: must be at least 1"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "warning: resources.0 (v1 Pod) and resources.1 (v1 Pod) watch the same objects"
        ),
        "the warnings of what parsed come too: {stderr}"
    );
    assert!(
        stderr.contains(
            "warning: sinks.0.auth.credentials_file: /nonexistent/nats.creds does not exist here"
        ),
        "{stderr}"
    );
    let (code, stderr) = command(&["check", "--strict"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("pipeline.max_pending: must be at least 1")
            && stderr.contains("error (--strict): sinks.0.auth.credentials_file: /nonexistent/nats.creds does not exist or is not a file")
            && stderr.contains("warning: resources.0 (v1 Pod) and resources.1 (v1 Pod)")
            && !stderr.contains("warning: sinks.0.auth.credentials_file"),
        "{stderr}"
    );
}

/// A malformed kubeconfig's YAML error must not quote the offending line (it may hold the
/// token); and files `run` never reads (TLS files of a connection without TLS) must not be
/// said to stop it.
#[tokio::test]
async fn a_malformed_kubeconfig_is_named_without_its_text_and_unused_tls_files_are_not_required() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("broken.kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user: {\"token\": \"SuperSecretTok3n\" [}\n",
    )
    .unwrap();
    let file = dir.path().join("k.toml");
    std::fs::write(
        &file,
        format!("[cluster]\nname = \"a\"\nkubeconfig = {kubeconfig:?}\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"nats\"\nservers = [\"nats://127.0.0.1:1\"]\nmode = \"core\"\n[sinks.tls]\nca_file = \"/nonexistent/ca.pem\"\n"),
    )
    .unwrap();
    let (code, stderr) = command(&["run"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("is not a valid kubeconfig: YAML error at line")
            && !stderr.contains("SuperSecretTok3n"),
        "{stderr}"
    );
    let (code, stderr) = command(&["check", "--strict"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error (--strict): cluster.kubeconfig ")
            && stderr.contains("is not a valid kubeconfig: YAML error at line")
            && !stderr.contains("SuperSecretTok3n"),
        "check reports the kubeconfig run cannot use: {stderr}"
    );
    assert!(
        !stderr.contains("ca.pem"),
        "a nats:// connection without tls.required reads no TLS file: {stderr}"
    );
    let (code, stderr) = command(&["check"], &file).await;
    assert_eq!(code, Some(0), "a warning without --strict: {stderr}");
    assert!(stderr.contains("warning: cluster.kubeconfig "), "{stderr}");
}

/// One bad value in a `[[sinks]]` entry must not hide any sink's missing files and
/// warnings.
#[tokio::test]
async fn a_bad_value_in_one_sink_does_not_hide_the_other_sinks_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    std::fs::write(
        &file,
        "[cluster]\nname = \"a\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"nats\"\nname = \"n\"\nservers = [\"nats://127.0.0.1:1\"]\nmode = \"core\"\n[sinks.auth]\ncredentials_file = \"/nonexistent/n.creds\"\n[[sinks]]\ntype = \"kafka\"\nname = \"k\"\nbootstrap_servers = \"127.0.0.1:1\"\ncompression = \"brotli\"\n",
    )
    .unwrap();
    let (code, stderr) = command(&["check", "--strict"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("sinks.1.compression")
            && stderr
                .contains("error (--strict): sinks.0.auth.credentials_file: /nonexistent/n.creds"),
        "{stderr}"
    );
}

/// A misspelt built-in kind is known offline: `check` and `kubesink rbac` warn about it,
/// naming the entry and the nearest kind (it would watch nothing and grant a resource that
/// does not exist), and still do their job.
#[tokio::test]
async fn check_and_rbac_name_a_misspelt_builtin_kind_and_the_nearest() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.toml");
    std::fs::write(
        &file,
        "[cluster]\nname = \"p\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[resources]]\napi_version = \"apps/v1\"\nkind = \"Deploymnet\"\n",
    )
    .unwrap();
    let want = "warning: resources.1 (apps/v1 Deploymnet): apps/v1 has no kind \"Deploymnet\" (its kinds: ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet); did you mean \"Deployment\"?";
    let (code, stderr) = command(&["check"], &file).await;
    assert_eq!(code, Some(0), "a warning, not an error: {stderr}");
    assert!(stderr.contains(want), "{stderr}");
    assert!(
        stderr.contains("configuration OK, with 1 warning(s)"),
        "{stderr}"
    );
    // An error with --strict, said once.
    let (code, stderr) = command(&["check", "--strict"], &file).await;
    assert_eq!(code, Some(1), "{stderr}");
    let error = want.replacen("warning: ", "error (--strict): ", 1);
    assert_eq!(stderr.matches(&error).count(), 1, "{stderr}");
    assert!(!stderr.contains(want), "{stderr}");
    let out = kubesink()
        .args(["rbac", "--config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(want), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("kind: ClusterRole"));
}
