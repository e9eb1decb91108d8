//! `kubesink fold` through the real binary: a crafted JSON Lines file (duplicates, deletes,
//! unknown ops, sync markers, a malformed line), a JetStream stream and a Kafka topic that a
//! bridge filled from the simulator under churn (the folded view equals the simulator's
//! objects, keys and uids), a stateless kubesink restart swept by sync markers (no ghosts;
//! JetStream),
//! and `--against-cluster` finding a ghost and a missing object.

use kubesink_test_support::{self as support, kafka_server, nats_server};

use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::ResourceConfig;
use kubesink::config::SinkConfig;
use kubesink_core::Sink;
use kubesink_nats::{NatsConfig, NatsMode};
use kubesink_sim::{Churn, SimConfig, Workload};
use serde_json::{json, Value};
use support::*;

const LONG: Duration = Duration::from_secs(120);
const KINDS: [(&str, &str); 3] = [("v1", "Pod"), ("apps/v1", "Deployment"), ("v1", "Node")];

fn workload(seed: u64) -> Workload {
    Workload {
        namespaces: 3,
        pods: 200,
        deployments: 20,
        nodes: 10,
        seed,
        ..Default::default()
    }
}

fn kinds() -> Vec<ResourceConfig> {
    KINDS
        .iter()
        .map(|(a, k)| ResourceConfig::new(a, k))
        .collect()
}

/// Runs `kubesink fold ARGS` until its view equals the simulator's objects (re-reading the
/// simulator each time: a stopped churn may finish one last write); returns the last run.
/// `kafka`: the broker and topic folded, whose high watermarks are flushed before each fold
/// ([`kafka_server::Tansu::flush_high_watermarks`]).
async fn fold_until_equal(
    c: &Cluster,
    args: &[&str],
    kafka: Option<(&kafka_server::Tansu, &str)>,
) -> FoldRun {
    wait_until(
        &format!("fold {args:?} to equal the simulator"),
        LONG,
        || async {
            if let Some((broker, topic)) = kafka {
                broker.flush_high_watermarks(topic, 4).await;
            }
            let run = run_kubesink(args, b"").await;
            assert_eq!(run.code, Some(0), "fold failed: {}", run.stderr);
            let want = sim_keys(&c.sim, "test", &KINDS);
            let got = view_keys(&run.stdout);
            if got == want {
                Ok(run)
            } else {
                Err(format!(
                    "{}\nstderr: {}",
                    view_diff(&want, &got),
                    run.stderr
                ))
            }
        },
    )
    .await
}

fn line(op: &str, id: &str, name: &str, uid: &str, initial: bool) -> String {
    json!({"id": id, "op": op, "cluster": "c", "apiVersion": "v1", "kind": "Pod",
           "resource": "pods", "namespace": "ns", "name": name, "uid": uid,
           "resourceVersion": id, "initial": initial, "finalStateUnknown": false,
           "observedAt": "2026-11-30T10:00:00.000Z", "object": {"metadata": {"name": name}}})
    .to_string()
}

fn marker(id: &str, initial: bool) -> String {
    json!({"id": id, "op": "synced", "cluster": "c", "apiVersion": "v1", "kind": "Pod",
           "resource": "pods", "scope": "allNamespaces", "count": 2, "resourceVersion": "9",
           "initial": initial, "observedAt": "2026-11-30T10:00:00.000Z"})
    .to_string()
}

#[tokio::test]
async fn a_jsonl_file_folds_duplicates_deletes_unknown_ops_and_markers() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        line("added", "1", "a", "ua", true),
        line("added", "2", "b", "ub", true),
        line("added", "3", "gone", "ug", true),
        marker("m1", true),
        line("updated", "4", "a", "ua", false),
        line("updated", "4", "a", "ua", false), // a redelivery
        line("deleted", "5", "b", "ub", false),
        line("deleted", "5", "b", "ub", false), // the delete again
        line("resized", "6", "a", "ua", false), // an op fold does not know
        String::new(),                          // a blank line
        // A stateless restart: `gone` vanished while kubesink was down and is not listed.
        line("added", "7", "a", "ua", true),
        line("added", "8", "c", "uc", true),
        marker("m2", true),
    ];
    let path = dir.path().join("topology.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    let run = run_kubesink(&["fold", "--file", path.to_str().unwrap()], b"").await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let view: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let keys: Vec<&str> = view.iter().map(|v| v["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["c/core/Pod/ns/a", "c/core/Pod/ns/c"]);
    assert_eq!(view[0]["op"], "added");
    assert_eq!(view[0]["uid"], "ua");
    assert_eq!(view[0]["resourceVersion"], "7");
    assert!(
        view[0].get("object").is_none(),
        "objects only with --objects"
    );
    assert!(
        run.stderr.contains("1 duplicates")
            && run.stderr.contains("1 deletes of keys not in the view")
            && run.stderr.contains("sweeping 1 keys")
            && run.stderr.contains("1 unknown ops skipped"),
        "{}",
        run.stderr
    );

    // stdin, with objects, and the table.
    let input = lines.join("\n");
    let run = run_kubesink(&["fold", "--file", "-", "--objects"], input.as_bytes()).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains(r#""object":{"metadata":{"name":"a"}}"#));
    let run = run_kubesink(&["fold", "--file", "-", "-o", "table"], input.as_bytes()).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let table: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(table.len(), 3, "{}", run.stdout);
    assert!(table[0].starts_with("CLUSTER  KIND  NAMESPACE  NAME  UID"));
    assert!(table[1].starts_with("c        Pod   ns         a     ua"));
}

#[tokio::test]
async fn a_malformed_line_or_a_missing_source_is_an_error_that_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    let text = format!(
        "{}\n{}\n{{\"op\": \"added\", \"kind\"\n",
        line("added", "1", "a", "ua", true),
        line("added", "2", "b", "ub", true)
    );
    std::fs::write(&path, text).unwrap();
    let run = run_kubesink(&["fold", "--file", path.to_str().unwrap()], b"").await;
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains(&format!(
            "{} line 3: not a topology message",
            path.display()
        )),
        "{}",
        run.stderr
    );
    let run = run_kubesink(&["fold", "--file", "/nonexistent/x.jsonl"], b"").await;
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("file /nonexistent/x.jsonl: No such file"),
        "{}",
        run.stderr
    );
    // Nothing listens on port 1.
    let run = run_kubesink(
        &[
            "fold",
            "--nats",
            "nats://127.0.0.1:1",
            "--stream",
            "S",
            "--timeout",
            "2s",
        ],
        b"",
    )
    .await;
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("JetStream stream S at nats://127.0.0.1:1: cannot connect"),
        "{}",
        run.stderr
    );
    let run = run_kubesink(
        &[
            "fold",
            "--kafka",
            "127.0.0.1:1",
            "--topic",
            "t",
            "--timeout",
            "2s",
        ],
        b"",
    )
    .await;
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("Kafka topic t at 127.0.0.1:1: brokers unreachable"),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_stream_folds_to_the_simulators_objects_and_a_stateless_restart_sweeps_no_live_object(
) {
    let server = nats_server::NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(21)).unwrap();
    let mut cfg = config(&c.kubeconfig, kinds());
    let mut nats = NatsConfig {
        servers: vec![server.url()],
        mode: NatsMode::Jetstream,
        ..Default::default()
    };
    nats.stream.create = true;
    cfg.sinks = vec![SinkConfig::Nats(nats)];
    cfg.pipeline.sync_markers = true;
    let bridge = start_configured_bridge(&cfg).await;
    c.sim.churn_steps(300, 3).unwrap();
    let churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 200.0,
        seed: 4,
    });
    let url = server.url();
    // Caught up mid-churn: the view is some consistent prefix; then after the churn, equal.
    let run = run_kubesink(&["fold", "--nats", &url, "--stream", "KUBESINK"], b"").await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    churn.stop();
    let run = fold_until_equal(&c, &["fold", "--nats", &url, "--stream", "KUBESINK"], None).await;
    assert!(run
        .stderr
        .contains("caught up with JetStream stream KUBESINK"));
    bridge.shutdown().await;

    // Down without state: deletes now are never sent, and the restart re-sends every live
    // object with the same ids, which JetStream drops as duplicates (`Nats-Msg-Id`, within
    // the 2-minute duplicate_window). The restart's markers then close lists of which
    // almost nothing arrived: fold must not sweep (it would remove live objects), it warns;
    // the 5 deleted pods stay as ghosts, which --against-cluster reports.
    let mut ghosts = std::collections::BTreeSet::new();
    for p in c.sim.objects("v1", "Pod").iter().take(5) {
        let m = &p["metadata"];
        let (ns, name) = (m["namespace"].as_str(), m["name"].as_str().unwrap());
        c.sim.delete("v1", "Pod", ns, name).unwrap();
        ghosts.insert(format!("test/core/Pod/{}/{name}", ns.unwrap_or_default()));
    }
    let bridge = start_configured_bridge(&cfg).await;
    let args = ["fold", "--nats", &url, "--stream", "KUBESINK"];
    wait_until(
        "the fold after the restart: every live object, the ghosts, the warning",
        LONG,
        || async {
            let run = run_kubesink(&args, b"").await;
            let want = sim_keys(&c.sim, "test", &KINDS);
            let got = view_keys(&run.stdout);
            let extra: std::collections::BTreeSet<String> = got
                .keys()
                .filter(|k| !want.contains_key(*k))
                .cloned()
                .collect();
            let live_kept = want.iter().all(|(k, u)| got.get(k) == Some(u));
            if live_kept && extra == ghosts && run.stderr.contains("warning: 3 sync marker(s)") {
                eprintln!("after a stateless restart: {}", run.stderr.trim());
                Ok(())
            } else {
                Err(format!("{}\n{}", view_diff(&want, &got), run.stderr))
            }
        },
    )
    .await;

    // A subject filter the default stream (`kubesink.*.*.*.*.*`) accepts: pods only.
    let pods = run_kubesink(
        &[
            "fold",
            "--nats",
            &url,
            "--stream",
            "KUBESINK",
            "--subject",
            "kubesink.test.core.Pod.*.*",
        ],
        b"",
    )
    .await;
    assert_eq!(pods.code, Some(0), "{}", pods.stderr);
    // The simulator's pods, and the ghosts the skipped sweep left.
    let got = view_keys(&pods.stdout);
    let want = sim_keys(&c.sim, "test", &KINDS[..1]);
    assert!(want.iter().all(|(k, u)| got.get(k) == Some(u)));
    assert_eq!(got.len(), want.len() + ghosts.len());

    // --follow: the view, then each change as it folds.
    let follow = Follower::start(&["fold", "--nats", &url, "--stream", "KUBESINK", "--follow"]);
    wait_for("follow caught up", LONG, || {
        follow.stderr().contains("caught up")
    })
    .await;
    // The view goes to stdout as the "caught up" line goes to stderr: wait for both pipes.
    let expected = sim_keys(&c.sim, "test", &KINDS).len() + ghosts.len();
    wait_for("follow printed the view", LONG, || {
        follow.stdout().len() >= expected
    })
    .await;
    let printed = follow.stdout().len();
    assert_eq!(printed, expected);
    c.sim
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "late"}}))
        .unwrap();
    wait_for("the new node followed", LONG, || {
        follow.stdout()[printed..]
            .iter()
            .any(|l| l.contains(r#""key":"test/core/Node//late""#))
    })
    .await;
    c.sim.delete("v1", "Node", None, "late").unwrap();
    wait_for("its delete followed", LONG, || {
        follow.stdout()[printed..]
            .iter()
            .any(|l| l == r#"{"key":"test/core/Node//late","op":"deleted"}"#)
    })
    .await;
    bridge.shutdown().await;

    let missing = run_kubesink(&["fold", "--nats", &url, "--stream", "NOPE"], b"").await;
    assert_eq!(missing.code, Some(2));
    assert!(
        missing
            .stderr
            .contains(&format!("JetStream stream NOPE at {url}: no such stream")),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_topic_folds_to_the_simulators_objects_after_churn() {
    let broker = kafka_server::Tansu::start().await;
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(31)).unwrap();
    let topic = "kubesink.test";
    broker.create_topic(topic, 4).await;
    let mut cfg = config(&c.kubeconfig, kinds());
    cfg.pipeline.sync_markers = true;
    let kafka = kubesink_kafka::KafkaConfig {
        bootstrap_servers: broker.bootstrap.clone(),
        ..Default::default()
    };
    cfg.sinks = vec![SinkConfig::Kafka(kafka)];
    let args = ["fold", "--kafka", &broker.bootstrap, "--topic", topic];

    let bridge = start_configured_bridge(&cfg).await;
    c.sim.churn_steps(300, 5).unwrap();
    let churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 200.0,
        seed: 6,
    });
    let mid = run_kubesink(&args, b"").await;
    assert_eq!(mid.code, Some(0), "{}", mid.stderr);
    churn.stop();
    fold_until_equal(&c, &args, Some((&broker, topic))).await;
    bridge.shutdown().await;

    let missing = run_kubesink(
        &[
            "fold",
            "--kafka",
            &broker.bootstrap,
            "--topic",
            "nope",
            "--timeout",
            "5s",
        ],
        b"",
    )
    .await;
    assert_eq!(missing.code, Some(2));
    assert!(
        missing.stderr.contains("Kafka topic nope at"),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_cluster_finds_a_ghost_and_a_missing_object_and_agrees_otherwise() {
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(41)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_path = write_config(&c, dir.path());
    // What a topic would hold: kubesink's own messages for the cluster (a bridge with a
    // capturing sink), as JSON Lines.
    let sink = CaptureSink::new();
    let cfg = config(&c.kubeconfig, kinds());
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    let bridge = Bridge::start(&plan(&cfg), client, vec![sink.clone() as Arc<dyn Sink>])
        .await
        .unwrap();
    let live = sim_keys(&c.sim, "test", &KINDS).len();
    wait_for("initial lists delivered", LONG, || sink.len() >= live).await;
    bridge.shutdown().await;
    let jsonl: String = sink.messages().iter().map(|m| format!("{m}\n")).collect();
    let file = dir.path().join("topic.jsonl");
    std::fs::write(&file, &jsonl).unwrap();
    let cfg_arg = config_path.to_str().unwrap();
    let file_arg = file.to_str().unwrap();
    let args = [
        "--config",
        cfg_arg,
        "fold",
        "--file",
        file_arg,
        "--against-cluster",
    ];

    let agree = run_kubesink(&args, b"").await;
    assert_eq!(agree.code, Some(0), "{}\n{}", agree.stdout, agree.stderr);
    assert!(agree.stderr.contains("in agreement with the cluster"));

    // A pod deleted and a node created behind the topic's back.
    let pod = c.sim.objects("v1", "Pod").remove(0);
    let (ns, name) = (
        pod["metadata"]["namespace"].as_str().unwrap().to_owned(),
        pod["metadata"]["name"].as_str().unwrap().to_owned(),
    );
    c.sim.delete("v1", "Pod", Some(&ns), &name).unwrap();
    c.sim
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "late-node"}}))
        .unwrap();
    let drift = run_kubesink(&args, b"").await;
    assert_eq!(drift.code, Some(1), "{}\n{}", drift.stdout, drift.stderr);
    let lines: Vec<Value> = drift
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", drift.stdout);
    let find = |kind: &str| lines.iter().find(|l| l["drift"] == kind).cloned();
    let ghost = find("ghost").expect("a ghost");
    assert_eq!(ghost["key"], format!("test/core/Pod/{ns}/{name}"));
    let missing = find("missing").expect("a missing object");
    assert_eq!(missing["key"], "test/core/Node//late-node");
    assert!(drift
        .stderr
        .contains("DRIFT: 1 missing from the view, 1 ghosts in the view"));

    // A uid mismatch: the same name re-created.
    c.sim
        .create(json!({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": ns}}))
        .unwrap();
    let drift = run_kubesink(&args, b"").await;
    assert_eq!(drift.code, Some(1));
    assert!(
        drift.stdout.contains(r#""drift":"uid""#),
        "{}",
        drift.stdout
    );

    // A configuration that does not load fails before reading anything.
    let bad = run_kubesink(
        &[
            "--config",
            "/nonexistent.toml",
            "fold",
            "--file",
            file_arg,
            "--against-cluster",
        ],
        b"",
    )
    .await;
    assert_eq!(bad.code, Some(2));

    // A filter on the context `enrich` adds: not resolvable from one listing, refused by
    // name rather than reported as drift.
    let text = std::fs::read_to_string(&config_path).unwrap().replace(
        "kind = \"Pod\"\n",
        "kind = \"Pod\"\nenrich = [\"owner\"]\nfilter = 'owners.exists(o, o.kind == \"ReplicaSet\")'\n",
    );
    let context = dir.path().join("context.toml");
    std::fs::write(&context, text).unwrap();
    let args = [
        "--config",
        context.to_str().unwrap(),
        "fold",
        "--file",
        file_arg,
        "--against-cluster",
    ];
    let refused = run_kubesink(&args, b"").await;
    assert_ne!(refused.code, Some(0), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("v1 Pod: the filter \"owners.exists(")
            && refused.stderr.contains("cannot resolve"),
        "{}",
        refused.stderr
    );
}

/// A `kubesink fold --follow` child whose stdout and stderr lines are collected.
struct Follower {
    _child: tokio::process::Child,
    out: Arc<std::sync::Mutex<Vec<String>>>,
    err: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Follower {
    fn start(args: &[&str]) -> Follower {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubesink"))
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start kubesink fold --follow");
        let out: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let err: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let (o, e) = (out.clone(), err.clone());
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                o.lock().unwrap().push(l);
            }
        });
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                e.lock().unwrap().push(l);
            }
        });
        Follower {
            _child: child,
            out,
            err,
        }
    }

    fn stdout(&self) -> Vec<String> {
        self.out.lock().unwrap().clone()
    }

    fn stderr(&self) -> String {
        self.err.lock().unwrap().join("\n")
    }
}

/// The configuration `kubesink fold --against-cluster` reads: cluster `test` (the
/// simulator), Pods, Deployments and Nodes.
fn write_config(c: &Cluster, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kubesink.toml");
    std::fs::write(
        &path,
        format!(
            "[cluster]\nname = \"test\"\nkubeconfig = \"{}\"\n\n\
             [[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n\n\
             [[resources]]\napi_version = \"apps/v1\"\nkind = \"Deployment\"\n\n\
             [[resources]]\napi_version = \"v1\"\nkind = \"Node\"\n",
            c.kubeconfig.display()
        ),
    )
    .unwrap();
    path
}

/// One stateless kubesink run with sync markers until its initial lists are closed; its
/// messages as JSON Lines.
async fn stateless_run(c: &Cluster) -> String {
    let sink = CaptureSink::new();
    let mut cfg = config(&c.kubeconfig, kinds());
    cfg.pipeline.sync_markers = true;
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    let bridge = Bridge::start(&plan(&cfg), client, vec![sink.clone() as Arc<dyn Sink>])
        .await
        .unwrap();
    wait_for("the three initial lists' markers", LONG, || {
        sink.messages()
            .iter()
            .filter(|m| m["op"] == "synced")
            .count()
            >= KINDS.len()
    })
    .await;
    bridge.shutdown().await;
    sink.messages().iter().map(|m| format!("{m}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_restart_with_sync_markers_leaves_no_ghosts_in_the_fold() {
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(43)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_path = write_config(&c, dir.path());
    let first = stateless_run(&c).await;
    // While kubesink is down: 5 pods deleted (no message will ever say so), a node added.
    let victims: Vec<_> = c.sim.objects("v1", "Pod").into_iter().take(5).collect();
    delete_each(&c.sim, "v1", "Pod", &victims);
    c.sim
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "new"}}))
        .unwrap();
    let second = stateless_run(&c).await;
    let file = dir.path().join("topic.jsonl");
    std::fs::write(&file, format!("{first}{second}")).unwrap();
    let args = [
        "--config",
        config_path.to_str().unwrap(),
        "fold",
        "--file",
        file.to_str().unwrap(),
        "--against-cluster",
    ];
    let run = run_kubesink(&args, b"").await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("sweeping 5 keys"), "{}", run.stderr);
    eprintln!("{}", run.stderr.trim());

    // The same topic without its markers: the 5 pods stay, and the drift check says so.
    let unmarked: String = format!("{first}{second}")
        .lines()
        .filter(|l| !l.contains(r#""op":"synced""#))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&file, unmarked).unwrap();
    let run = run_kubesink(&args, b"").await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(
        run.stdout.matches(r#""drift":"ghost""#).count(),
        5,
        "{}",
        run.stdout
    );
}

/// A stream a stateless kubesink filled keeps the objects deleted while it was down as
/// ghosts (switching it to a state store later does not send their deletes): `fold
/// --against-cluster --repair` publishes them through the configured sink, and the stream
/// then folds to the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_cluster_repair_publishes_the_deletes_of_the_ghosts_through_the_configured_sink() {
    let server = nats_server::NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(51)).unwrap();
    let url = server.url();
    let mut cfg = config(&c.kubeconfig, kinds());
    let mut nats = NatsConfig {
        servers: vec![url.clone()],
        mode: NatsMode::Jetstream,
        ..Default::default()
    };
    nats.stream.create = true;
    cfg.sinks = vec![SinkConfig::Nats(nats)];
    let bridge = start_configured_bridge(&cfg).await;
    let stream = ["fold", "--nats", &url, "--stream", "KUBESINK"];
    fold_until_equal(&c, &stream, None).await;
    bridge.shutdown().await;

    // Deleted while no kubesink runs: never sent.
    let mut ghosts = Vec::new();
    for p in c.sim.objects("v1", "Pod").iter().take(4) {
        let m = &p["metadata"];
        let (ns, name) = (m["namespace"].as_str(), m["name"].as_str().unwrap());
        c.sim.delete("v1", "Pod", ns, name).unwrap();
        ghosts.push(format!("test/core/Pod/{}/{name}", ns.unwrap_or_default()));
    }
    let dir = tempfile::tempdir().unwrap();
    let config_path = write_config(&c, dir.path());
    let mut text = std::fs::read_to_string(&config_path).unwrap();
    text.push_str(&format!(
        "\n[[sinks]]\ntype = \"nats\"\nservers = [\"{url}\"]\nmode = \"jetstream\"\n"
    ));
    std::fs::write(&config_path, text).unwrap();
    let cfg_arg = config_path.to_str().unwrap();
    let against = [
        "--config",
        cfg_arg,
        "fold",
        "--nats",
        &url,
        "--stream",
        "KUBESINK",
        "--against-cluster",
    ];
    let drift = run_kubesink(&against, b"").await;
    assert_eq!(drift.code, Some(1), "{}\n{}", drift.stdout, drift.stderr);
    assert!(
        drift.stderr.contains("4 ghosts in the view"),
        "{}",
        drift.stderr
    );

    let mut repair = against.to_vec();
    repair.push("--repair");
    let repaired = run_kubesink(&repair, b"").await;
    assert_eq!(
        repaired.code,
        Some(0),
        "{}\n{}",
        repaired.stdout,
        repaired.stderr
    );
    assert!(
        repaired
            .stderr
            .contains("repaired: 4 `deleted` messages (finalStateUnknown) published for the ghosts through sink(s) nats"),
        "{}",
        repaired.stderr
    );

    // The stream now folds to the cluster: the ghosts are gone, nothing else moved.
    let after = run_kubesink(&against, b"").await;
    assert_eq!(after.code, Some(0), "{}\n{}", after.stdout, after.stderr);
    assert!(
        after.stderr.contains("in agreement with the cluster"),
        "{}",
        after.stderr
    );
    let view = fold_until_equal(&c, &stream, None).await;
    for g in &ghosts {
        assert!(!view.stdout.contains(g.as_str()), "{g} still in the view");
    }
}
