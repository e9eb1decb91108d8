//! The reference consumers of `examples/consumers/` end to end: the simulator under churn,
//! a bridge writing to a real broker (tansu for Kafka, nats-server for JetStream), and each
//! consumer (Python with confluent-kafka / nats-py, Rust with rdkafka / async-nats) keeping
//! its view with a checkpoint. The Python one is killed (SIGKILL) mid-run and restarted
//! from its checkpoint; at the end each consumer resumes once more, catches up, prints its
//! view, and the view must equal the simulator's objects (keys and uids).
//!
//! Python comes from `CONSUMERS_PYTHON` (scripts/test.sh makes a venv with confluent-kafka
//! and nats-py and sets it). Unset, the Python consumers are skipped with a note, except under
//! CI (`CI=true`), where that is a failure.

use kubesink_test_support::{self as support, kafka_server, nats_server};

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kubesink::config::SinkConfig;
use kubesink::config::{Config, ResourceConfig};
use kubesink_nats::{NatsConfig, NatsMode};
use kubesink_sim::{Churn, SimConfig, Workload};
use support::*;
use tokio::process::{Child, Command};

const LONG: Duration = Duration::from_secs(120);
const KINDS: [(&str, &str); 3] = [("v1", "Pod"), ("apps/v1", "Deployment"), ("v1", "Node")];

/// How to start one consumer: `program prefix… --checkpoint F [--exit-when-caught-up] args…`.
#[derive(Clone)]
struct Consumer {
    name: &'static str,
    program: PathBuf,
    /// The script, for Python.
    prefix: Vec<String>,
    args: Vec<String>,
}

impl Consumer {
    fn command(&self, checkpoint: &Path, exit_when_caught_up: bool) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.prefix).arg("--checkpoint").arg(checkpoint);
        if exit_when_caught_up {
            cmd.arg("--exit-when-caught-up");
        }
        cmd.args(&self.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs continuously (until stopped), folding and checkpointing.
    fn spawn(&self, checkpoint: &Path) -> Child {
        let mut cmd = self.command(checkpoint, false);
        cmd.stdout(Stdio::null());
        cmd.spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.name))
    }

    /// Resumes from the checkpoint until caught up; its printed view.
    async fn catch_up(&self, checkpoint: &Path) -> String {
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            self.command(checkpoint, true).output(),
        )
        .await
        .unwrap_or_else(|_| panic!("{} did not catch up within 60 s", self.name))
        .unwrap_or_else(|e| panic!("run {}: {e}", self.name));
        assert!(
            out.status.success(),
            "{} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/consumers")
}

/// The interpreter of the venv scripts/test.sh builds, or `None` (skip) outside CI.
fn python() -> Option<PathBuf> {
    match std::env::var_os("CONSUMERS_PYTHON") {
        Some(p) => Some(p.into()),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CONSUMERS_PYTHON is unset under CI: scripts/test.sh sets it (a venv with confluent-kafka and nats-py)")
        }
        None => {
            eprintln!(
                "note: CONSUMERS_PYTHON is unset: skipping the Python consumers (scripts/test.sh \
                 creates the venv and sets it)"
            );
            None
        }
    }
}

/// Builds the Rust example (a workspace member, not part of kubesink's binary) into this
/// build's target directory; its path.
fn rust_consumer() -> PathBuf {
    let status = std::process::Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args(["build", "--quiet", "-p", "kubesink-consumer-example"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo build");
    assert!(status.success(), "building examples/consumers/rust failed");
    // This test runs from target/debug/deps/.
    let exe = std::env::current_exe().expect("current exe");
    let debug = exe.parent().and_then(Path::parent).expect("target/debug");
    debug.join("kubesink-consumer-example")
}

fn consumers(python_args: (&'static str, Vec<String>), rust_args: Vec<String>) -> Vec<Consumer> {
    let mut out = Vec::new();
    if let Some(py) = python() {
        out.push(Consumer {
            name: python_args.0,
            program: py,
            prefix: vec![examples()
                .join("python")
                .join(python_args.0)
                .display()
                .to_string()],
            args: python_args.1,
        });
    }
    out.push(Consumer {
        name: "rust example",
        program: rust_consumer(),
        prefix: Vec::new(),
        args: rust_args,
    });
    out
}

fn sigterm(child: &Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
}

/// The scenario, for any broker: churn with every consumer running; the first one killed
/// and restarted mid-run; then each resumes and must hold exactly the simulator's objects.
/// `kafka`: the broker and topic, whose records of the keys that differ are dumped on a
/// failure.
async fn run_scenario(
    c: &Cluster,
    consumers: Vec<Consumer>,
    fold_args: &[&str],
    churn_seed: u64,
    kafka: Option<(&kafka_server::Tansu, &str)>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let checkpoint = |i: usize| dir.path().join(format!("consumer-{i}.json"));
    let mut running: Vec<Child> = consumers
        .iter()
        .enumerate()
        .map(|(i, k)| k.spawn(&checkpoint(i)))
        .collect();
    let churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 150.0,
        seed: churn_seed,
    });
    // Mid-run: once the first consumer has checkpointed, kill it (no clean shutdown) and
    // start it again from that checkpoint.
    let first = checkpoint(0);
    wait_for("the first consumer's checkpoint", LONG, || first.exists()).await;
    let written = std::fs::metadata(&first).and_then(|m| m.modified()).ok();
    wait_for("a second checkpoint", LONG, || {
        std::fs::metadata(&first).and_then(|m| m.modified()).ok() != written
    })
    .await;
    running[0].kill().await.expect("SIGKILL");
    running[0] = consumers[0].spawn(&first);
    wait_for("a checkpoint after the restart", LONG, || {
        std::fs::metadata(&first).and_then(|m| m.modified()).ok() != written
    })
    .await;
    churn.stop();
    for child in &running {
        sigterm(child);
    }
    for mut child in running {
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    }
    for (i, k) in consumers.iter().enumerate() {
        let caught_up = try_wait_until(LONG, || async {
            let view = k.catch_up(&checkpoint(i)).await;
            let want = sim_keys(&c.sim, "test", &KINDS);
            let got = view_keys(&view);
            if got == want {
                Ok((got.len(), view))
            } else {
                Err(view)
            }
        })
        .await;
        match caught_up {
            Ok((n, _)) => eprintln!("{}: view of {n} keys equals the simulator's", k.name),
            Err(view) => {
                let want = sim_keys(&c.sim, "test", &KINDS);
                let got = view_keys(&view);
                // What the topic itself folds to, to tell a consumer's mistake from the
                // topic's.
                let fold = run_kubesink(fold_args, b"").await;
                let differ: Vec<String> = want
                    .keys()
                    .chain(got.keys())
                    .filter(|k| want.get(*k) != got.get(*k))
                    .cloned()
                    .collect();
                let records = match kafka {
                    Some((broker, topic)) => kafka_history(&broker.bootstrap, topic, &differ).await,
                    None => String::new(),
                };
                let saved = std::fs::read_to_string(checkpoint(i)).unwrap_or_default();
                panic!(
                    "{}: view != simulator: {}\nkubesink fold of the same source: {}\n{}\nthe topic's records of those keys:\n{records}\nthe consumer's checkpoint: {}",
                    k.name,
                    view_diff(&want, &got),
                    view_diff(&want, &view_keys(&fold.stdout)),
                    fold.stderr,
                    saved.chars().take(4000).collect::<String>()
                );
            }
        }
    }
    // Each key's last `changed` as `kubesink fold` reads it from the same source:
    // every consumer's view says the same, and the churn's updates named what changed.
    wait_until(
        "each view's last changes to equal kubesink fold's",
        LONG,
        || async {
            let fold = last_changes(&run_kubesink(fold_args, b"").await.stdout);
            if !fold.values().any(Option::is_some) {
                return Err("no key's last message names what changed".to_owned());
            }
            for (i, k) in consumers.iter().enumerate() {
                let view = last_changes(&k.catch_up(&checkpoint(i)).await);
                if view != fold {
                    let differ: Vec<_> = fold
                        .iter()
                        .filter(|(key, c)| view.get(*key) != Some(c))
                        .take(5)
                        .collect();
                    return Err(format!("{}: {differ:?}", k.name));
                }
            }
            Ok(())
        },
    )
    .await;
}

/// A printed view's `changed` by key (`None` where the last message had none).
fn last_changes(jsonl: &str) -> std::collections::BTreeMap<String, Option<serde_json::Value>> {
    jsonl
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                v["key"].as_str().unwrap_or_default().to_owned(),
                v.get("changed").cloned(),
            )
        })
        .collect()
}

/// Every record of `keys` in `topic` (read from the beginning until it stops growing), one
/// line each: partition, offset, op, id, uid, resourceVersion; for a failure message.
async fn kafka_history(bootstrap: &str, topic: &str, keys: &[String]) -> String {
    let reader = kafka_server::Reader::start(bootstrap, topic, 4);
    let mut last = usize::MAX;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let n = reader.len();
        if n == last {
            break;
        }
        last = n;
    }
    let mut out = String::new();
    for r in reader.records().iter().filter(|r| keys.contains(&r.key)) {
        let m: serde_json::Value = r
            .value
            .as_deref()
            .and_then(|v| serde_json::from_slice(v).ok())
            .unwrap_or_default();
        out.push_str(&format!(
            "  {} p{} @{} op={} id={} uid={} rv={}\n",
            r.key,
            r.partition,
            r.offset,
            if r.value.is_none() {
                "tombstone"
            } else {
                m["op"].as_str().unwrap_or("?")
            },
            m["id"].as_str().unwrap_or(""),
            m["uid"].as_str().unwrap_or(""),
            m["resourceVersion"].as_str().unwrap_or("")
        ));
    }
    out
}

fn setup_config(c: &Cluster) -> Config {
    c.sim
        .populate(&Workload {
            namespaces: 3,
            pods: 150,
            deployments: 15,
            nodes: 8,
            seed: 51,
            ..Default::default()
        })
        .unwrap();
    let mut cfg = config(
        &c.kubeconfig,
        KINDS
            .iter()
            .map(|(a, k)| ResourceConfig::new(a, k))
            .collect(),
    );
    cfg.pipeline.sync_markers = true;
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jetstream_consumers_keep_the_simulators_objects_across_a_crash() {
    let server = nats_server::NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    let mut cfg = setup_config(&c);
    let mut nats = NatsConfig {
        servers: vec![server.url()],
        mode: NatsMode::Jetstream,
        ..Default::default()
    };
    nats.stream.create = true;
    nats.stream.max_msgs_per_subject = 1;
    cfg.sinks = vec![SinkConfig::Nats(nats)];
    let bridge = start_configured_bridge(&cfg).await;
    let url = server.url();
    let list = consumers(
        (
            "jetstream_view.py",
            vec![
                "--server".into(),
                url.clone(),
                "--stream".into(),
                "KUBESINK".into(),
            ],
        ),
        vec![
            "jetstream".into(),
            "--server".into(),
            url,
            "--stream".into(),
            "KUBESINK".into(),
        ],
    );
    let url = server.url();
    run_scenario(
        &c,
        list,
        &["fold", "--nats", &url, "--stream", "KUBESINK"],
        61,
        None,
    )
    .await;
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_consumers_keep_the_simulators_objects_across_a_crash() {
    let broker = kafka_server::Tansu::start().await;
    let c = cluster(SimConfig::default()).await;
    let mut cfg = setup_config(&c);
    let topic = "kubesink.test";
    broker.create_topic(topic, 4).await;
    // One record per batch: tansu 0.6 serves a fetch from an offset inside a batch with the
    // next batch (the rest of that batch is skipped), and keeps the high watermark at the last
    // batch's base offset + 1 (docs/kafka.md, "Findings with tansu 0.6"). The consumers resume
    // from arbitrary checkpointed offsets, which Kafka serves exactly; with single-record
    // batches tansu does too.
    cfg.sinks = vec![SinkConfig::Kafka(kubesink_kafka::KafkaConfig {
        bootstrap_servers: broker.bootstrap.clone(),
        librdkafka: std::collections::BTreeMap::from([(
            "batch.num.messages".to_string(),
            "1".to_string(),
        )])
        .into(),
        ..Default::default()
    })];
    let bridge = start_configured_bridge(&cfg).await;
    let b = broker.bootstrap.clone();
    let list = consumers(
        (
            "kafka_view.py",
            vec![
                "--bootstrap".into(),
                b.clone(),
                "--topic".into(),
                topic.into(),
            ],
        ),
        vec![
            "kafka".into(),
            "--bootstrap".into(),
            b,
            "--topic".into(),
            topic.into(),
        ],
    );
    let b = broker.bootstrap.clone();
    run_scenario(
        &c,
        list,
        &["fold", "--kafka", &b, "--topic", topic],
        71,
        Some((&broker, topic)),
    )
    .await;
    bridge.shutdown().await;
}
