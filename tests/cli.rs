//! The `kubesink` binary end to end: `check` exit codes and messages, `run` writing JSON
//! Lines to stdout against the simulator and exiting 0 on SIGTERM, and `demo`.

mod support;

use std::process::Stdio;
use std::time::Duration;

use kubesink_sim::{SimConfig, Workload};
use serde_json::Value;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");

fn kubesink() -> Command {
    let mut c = Command::new(BIN);
    // A clean environment for configuration: only what each test sets.
    for (k, _) in std::env::vars() {
        if k.starts_with("KUBESINK_") {
            c.env_remove(k);
        }
    }
    c.env_remove("RUST_LOG");
    // Tests run in parallel: the HTTP server on a free port.
    c.env("KUBESINK_SERVER__LISTEN", "127.0.0.1:0");
    c.kill_on_drop(true);
    c
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
    // The semantic checks run only once every section parsed; fix the env and look again.
    let out = kubesink()
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
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

/// Reads `n` JSON lines from the child's stdout, failing after `timeout`.
async fn read_lines(child: &mut Child, n: usize, timeout: Duration) -> Vec<Value> {
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
    let msgs = read_lines(&mut child, 60, Duration::from_secs(60)).await;
    assert_schema_valid(&schema(), &msgs);
    let kinds: std::collections::BTreeSet<_> =
        msgs.iter().filter_map(|m| m["kind"].as_str()).collect();
    assert!(
        kinds.contains("Pod") && kinds.contains("Node") && kinds.contains("FooBar"),
        "{kinds:?}"
    );
    assert_eq!(signal_and_wait(&mut child, "-INT").await, Some(0));
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
    let mut cases: Vec<(String, Vec<(&str, String)>, &str, &str)> = vec![
        (
            format!("{name}[state]\npath = {state_file:?}\n"),
            vec![],
            "state.path: ",
            "state.backend = \"file\"",
        ),
        (
            name.to_owned(),
            vec![("KUBESINK_STATE__PATH", state_file.clone())],
            "state.path: ",
            "state.backend = \"file\"",
        ),
    ];
    if cfg!(feature = "nats") {
        cases.push((
            format!("{name}[state.nats]\nbucket = \"KUBESINK_STATE\"\n"),
            vec![],
            "state.nats.bucket: ",
            "state.backend = \"nats\"",
        ));
        cases.push((
            name.to_owned(),
            vec![("KUBESINK_STATE__NATS__BUCKET", "B".to_owned())],
            "state.nats.bucket: ",
            "state.backend = \"nats\"",
        ));
    }
    for (toml, env, key, fix) in &cases {
        std::fs::write(&file, toml).unwrap();
        let mut cmd = kubesink();
        cmd.args(["check", "--config"]).arg(&file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{toml:?} {env:?}: {stderr}");
        let source = match env.first() {
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
