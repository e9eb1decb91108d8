//! One huge cluster spread over replicas (`cluster.shards`, `docs/scale-out.md`, "One huge
//! cluster") on a real kube-apiserver: two replicas of a scale-out group split one cluster
//! four ways by the FNV-1a hash of each object's namespace, each shard a unit with its own
//! Lease, watches and saved state (in NATS), under churn (edits, deletes and re-creations
//! under the same names, namespace label changes); one replica SIGKILLed mid-churn and
//! another started in its place, that one frozen (SIGSTOP) past its Leases and woken (it
//! exits 3) and a third started. The cluster's stream (every replica's stdout, each key's
//! messages in holder order) folds to the API server's exact state, uid and resourceVersion,
//! for the ConfigMaps of eight namespaces spread over the four shards and for the
//! cluster-scoped Namespaces (all in one shard); `kubesink fold --against-cluster` agrees.
//! Then, with the churn stopped, a rolling update of one replica sends nothing: every shard
//! resumes from its own saved state.
//!
//! Twice: with the API server's `ShardedListAndWatch` feature gate on (the server filters:
//! its `apiserver_watch_shards_total` counts kubesink's sharded watches, and no replica drops
//! an object itself) and off (the server ignores `shardSelector`: each replica keeps its
//! shard itself, the client-side fallback, counted in
//! `kubesink_shard_foreign_objects_total`). Each runs its own API server, one at a
//! time.

use kubesink_test_support::{self as support, kube_server, leases, nats_server, process};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube_server::{create, delete, live_state, patch, patch_configmap, ControlPlane, Options};
use kubesink::config::{Cluster, Config, Shard};
use leases::{held_as_assigned, observe, per_cluster};
use process::{leader_toml, nats_state_toml, resource_toml, Kubesink, STDOUT_SINK};
use serde_json::json;
use support::{fold_equals, metric_value, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const SHARDS: u32 = 4;
/// Namespaces per shard, and ConfigMaps per namespace.
const PER_SHARD: usize = 2;
const CONFIGMAPS: usize = 4;
const LEASES_NS: &str = "kubesink-leases";
const GROUP: &str = "kss";
const LABEL: &str = "kubesink-test=shards";

/// One scenario at a time: each starts an API server and three kubesinks on two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `PER_SHARD` namespaces for each of the `SHARDS` shards, found by the same hash the API
/// server and kubesink use, so that every shard has objects to follow.
fn namespaces() -> Vec<String> {
    let shards = Shard::all(SHARDS);
    let mut per = vec![Vec::new(); shards.len()];
    for k in 0.. {
        let ns = format!("sh-{k}");
        let at = shards
            .iter()
            .position(|s| s.holds(Some(&ns)))
            .expect("one shard holds every namespace");
        if per[at].len() < PER_SHARD {
            per[at].push(ns);
        }
        if per.iter().all(|p| p.len() == PER_SHARD) {
            break;
        }
    }
    per.concat()
}

/// The units every replica spreads: the shards of cluster `huge`, as the configuration
/// makes them.
fn units() -> Vec<String> {
    let config = Config {
        clusters: Vec::new(),
        cluster: kubesink::config::ClusterConfig {
            name: "huge".into(),
            shards: SHARDS,
            ..Default::default()
        },
        ..Default::default()
    };
    config.units().iter().map(Cluster::unit).collect()
}

fn write_config(dir: &std::path::Path, cp: &ControlPlane, nats: &str) -> std::path::PathBuf {
    let configmaps = resource_toml("v1", "ConfigMap", &[]);
    let namespaces = resource_toml("v1", "Namespace", &[]);
    let (leader, state) = (leader_toml(GROUP, LEASES_NS, true), nats_state_toml(nats));
    let rest = format!(
        r#"shards = {SHARDS}
{leader}[pipeline]
linger = "20ms"
{state}{configmaps}label_selector = "{LABEL}"
{namespaces}label_selector = "{LABEL}"
{STDOUT_SINK}"#
    );
    process::write_config(dir, "huge", &cp.admin_kubeconfig, &rest)
}

fn config_map(ns: &str, name: &str, v: u64) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubesink-test": "shards"}},
        "data": {"v": v.to_string()}})
}

/// Waits until the shards are held as the assignment over `replicas` (name, process) says.
async fn held(client: &kube::Client, what: &str, replicas: &[(&str, &Kubesink)]) {
    let members: Vec<&str> = replicas.iter().map(|(name, _)| *name).collect();
    let logs: Vec<&Kubesink> = replicas.iter().map(|(_, k)| *k).collect();
    let at = (LEASES_NS, GROUP);
    held_as_assigned(client, what, at, &units(), &members, &logs, LONG).await;
}

/// Waits until every replica's `/readyz` answers 200: every shard it holds is listed.
async fn ready(replicas: &[(&str, &Kubesink)]) {
    wait_until(
        "the replicas ready (every held shard listed)",
        LONG,
        || async {
            let mut not = Vec::new();
            for (name, k) in replicas {
                let (_, code, body) = observe(k).await;
                if code != 200 {
                    not.push(format!("{name}: /readyz {code} {body}"));
                }
            }
            not.is_empty().then_some(()).ok_or_else(|| not.join("; "))
        },
    )
    .await;
}

/// The scenario, on an API server whose `ShardedListAndWatch` gate is `gate`.
async fn four_shards_over_two_replicas(gate: bool) {
    let _one = SERIAL.lock().await;
    let options = Options {
        feature_gates: vec![format!("ShardedListAndWatch={gate}")],
        ..Default::default()
    };
    let cp = tokio::task::spawn_blocking(move || ControlPlane::start(options))
        .await
        .expect("control plane");
    let client = cp.admin().await;
    let nats = nats_server::NatsServer::start("");
    let namespaces = namespaces();
    for ns in namespaces.iter().map(String::as_str).chain([LEASES_NS]) {
        create(
            &client,
            json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"kubesink-test": "shards", "v": "0"}}}),
        )
        .await;
    }
    let keys: Vec<(String, String)> = namespaces
        .iter()
        .flat_map(|ns| (0..CONFIGMAPS).map(move |i| (ns.clone(), format!("cm-{i}"))))
        .collect();
    for (ns, name) in &keys {
        create(&client, config_map(ns, name, 0)).await;
    }
    // Churn: an edit every 40 ms, round robin over every key; every 11th a delete and a
    // re-create under the same name (a new uid, the same shard); every 17th a namespace's
    // label changes (a cluster-scoped update).
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, client, keys, namespaces) = (
            stop.clone(),
            client.clone(),
            keys.clone(),
            namespaces.clone(),
        );
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (ns, name) = &keys[n as usize % keys.len()];
                if n.is_multiple_of(11) {
                    delete(&client, "v1", "ConfigMap", Some(ns), name).await;
                    create(&client, config_map(ns, name, n)).await;
                } else {
                    patch_configmap(&client, ns, name, json!({"v": n.to_string()})).await;
                }
                if n.is_multiple_of(17) {
                    let ns = &namespaces[n as usize % namespaces.len()];
                    patch(
                        &client,
                        "v1",
                        "Namespace",
                        None,
                        ns,
                        json!({"metadata": {"labels": {"v": n.to_string()}}}),
                    )
                    .await;
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            n
        })
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &cp, &nats.url());
    // `check --online` tells which of the two this API server is.
    let checked = support::run_kubesink(
        &[
            "check",
            "--online",
            "--config",
            &config.display().to_string(),
        ],
        b"",
    )
    .await;
    let said = format!("{}{}", checked.stdout, checked.stderr);
    let want = match gate {
        true => "the API server filters lists and watches by shard",
        false => "the API server ignores shardSelector",
    };
    assert!(
        checked.code == Some(0)
            && said.contains("huge shards (4): ")
            && said.contains(want)
            && said.contains("namespaces per shard: "),
        "check --online, gate {gate}: {:?}\n{said}",
        checked.code
    );
    for l in said.lines().filter(|l| l.contains("shards (4)")) {
        eprintln!("gate {gate}: check --online: {l}");
    }
    let id = |name: &'static str| [("KUBESINK_LEADER_ELECTION__IDENTITY", name)];
    let a = Kubesink::start(BIN, &config, dir.path(), "a", &id("a"));
    let b = Kubesink::start(BIN, &config, dir.path(), "b", &id("b"));
    held(&client, "four shards over a and b", &[("a", &a), ("b", &b)]).await;

    // Each replica follows only its shards (both ready: every held shard listed): with the
    // gate on the server filtered (no replica dropped an object itself, and the server's
    // sharded-watch gauge counts kubesink's watches: at least one, as the gauge was once
    // seen at 2 with four shards watched); with it off, the replicas dropped the other
    // shards' objects themselves.
    wait_until("the replicas to have read their shards", LONG, || async {
        let (ma, ca, _) = observe(&a).await;
        let (mb, cb, _) = observe(&b).await;
        let foreign: f64 = [&ma, &mb]
            .iter()
            .map(|m| metric_value(m, "kubesink_shard_foreign_objects_total", &[]))
            .sum();
        let delivered: f64 = [&ma, &mb]
            .iter()
            .map(|m| metric_value(m, "kubesink_sink_delivered_messages_total", &[]))
            .sum();
        let sharded_watches = cp
            .metric("apiserver_watch_shards_total", &[("resource", "configmaps")])
            .await;
        let ok = match gate {
            true => foreign == 0.0 && sharded_watches >= 1.0 && delivered > 0.0,
            false => foreign > 0.0 && delivered > 0.0,
        } && ca == 200
            && cb == 200;
        ok.then_some(()).ok_or_else(|| {
            format!("gate {gate}: foreign {foreign}, delivered {delivered}, the API server's sharded watches of ConfigMaps {sharded_watches}, /readyz a {ca} b {cb}")
        })
    })
    .await;

    // SIGKILL b mid-churn: a takes its shards; then b2 joins and takes some back.
    let b_out = b.kill().await;
    held(&client, "a alone holds the four shards", &[("a", &a)]).await;
    let mut b2 = Kubesink::start(BIN, &config, dir.path(), "b2", &id("b2"));
    held(
        &client,
        "four shards over a and b2",
        &[("a", &a), ("b2", &b2)],
    )
    .await;

    // SIGSTOP b2 past its Leases mid-churn: a takes its shards; b2, woken, exits 3 and
    // starts no send (the fences of its shards closed at their renew deadline): nothing it
    // wrote carries a change observed after its freeze; b3 joins. The freeze comes once b2
    // streams its shards' churn, so that it has changes to send when it wakes.
    b2.wait_for_more("b2 streams its shards' churn", LONG).await;
    let frozen_time = b2.freeze().await;
    eprintln!("gate {gate}: b2 frozen after {} messages", b2.count());
    held(&client, "the frozen b2's shards taken by a", &[("a", &a)]).await;
    let code = b2.signal_and_wait("CONT", LONG).await;
    assert_eq!(
        code,
        Some(Some(3)),
        "b2 woke after losing its Leases: exits 3\n{}",
        b2.stderr()
    );
    let b2_out = b2.output().await;
    let sent_after = process::observed_after(&b2_out, frozen_time);
    assert!(
        sent_after.is_empty(),
        "b2 sent changes it observed after its freeze at {frozen_time}: {sent_after:#?}"
    );
    let b3 = Kubesink::start(BIN, &config, dir.path(), "b3", &id("b3"));
    held(
        &client,
        "four shards over a and b3",
        &[("a", &a), ("b3", &b3)],
    )
    .await;

    stop.store(true, Ordering::Relaxed);
    let edits = churn.await.expect("churn");
    eprintln!("gate {gate}: {edits} edits under churn");
    let mut final_out = Vec::new();
    wait_until(
        "the cluster's fold to equal the API server",
        LONG,
        || async {
            let labelled = |o: &kube::api::DynamicObject| {
                o.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubesink-test"))
                    .is_some_and(|v| v == "shards")
            };
            let live = live_state(
                &client,
                &[("v1", "ConfigMap"), ("v1", "Namespace")],
                labelled,
            )
            .await;
            let outputs = vec![a.messages(), b_out.clone(), b2_out.clone(), b3.messages()];
            let msgs = per_cluster(&outputs).remove("huge").unwrap_or_default();
            fold_equals(&live, &msgs, Expect::STRICT.restarts(), |_| true)
        },
    )
    .await;
    // What an operator runs: `kubesink fold --against-cluster` with the sharded
    // configuration compares the stream with the whole cluster.
    let stream = dir.path().join("stream.jsonl");
    let outputs = vec![a.messages(), b_out.clone(), b2_out.clone(), b3.messages()];
    let lines: Vec<String> = per_cluster(&outputs)
        .remove("huge")
        .unwrap_or_default()
        .iter()
        .map(|m| m.to_string())
        .collect();
    std::fs::write(&stream, lines.join("\n") + "\n").expect("stream file");
    let folded = support::run_kubesink(
        &[
            "fold",
            "--config",
            &config.display().to_string(),
            "--file",
            &stream.display().to_string(),
            "--against-cluster",
        ],
        b"",
    )
    .await;
    assert_eq!(
        folded.code,
        Some(0),
        "fold --against-cluster, gate {gate}:\n{}{}",
        folded.stdout,
        folded.stderr
    );
    ready(&[("a", &a), ("b3", &b3)]).await;
    // The figure docs/scale-out.md gives: what each replica read (list items and watch
    // events) and what it dropped as another shard's, gate on against gate off.
    for (name, k) in [("a", &a), ("b3", &b3)] {
        let (m, ..) = observe(k).await;
        let read: f64 = ["listed", "added", "modified", "deleted"]
            .iter()
            .map(|t| metric_value(&m, "kubesink_watch_events_total", &[("type", t)]))
            .sum();
        let foreign = metric_value(&m, "kubesink_shard_foreign_objects_total", &[]);
        eprintln!("figure: gate {gate}: replica {name} read {read} objects and events, dropped {foreign} of other shards");
    }
    // A rolling update with the churn stopped: b3 leaves (SIGTERM: drain, save, release; a
    // takes its shards), b4 joins and takes its share back from a. Each move resumes from
    // that shard's own saved state, and nothing changed: nothing may be sent.
    let a_before = a.messages().len();
    final_out.push(b3.terminate().await);
    let b4 = Kubesink::start(BIN, &config, dir.path(), "b4", &id("b4"));
    held(
        &client,
        "four shards over a and b4",
        &[("a", &a), ("b4", &b4)],
    )
    .await;
    ready(&[("a", &a), ("b4", &b4)]).await;
    let resent: Vec<String> = a.messages()[a_before..]
        .iter()
        .chain(b4.messages().iter())
        .map(|m| format!("{} {} {}", m["op"], m["key"], m["initial"]))
        .collect();
    eprintln!(
        "figure: gate {gate}: {} messages sent by the moves of a rolling update with nothing changed",
        resent.len()
    );
    assert!(
        resent.is_empty(),
        "gate {gate}: the moves re-sent {} messages: {:?}",
        resent.len(),
        &resent[..resent.len().min(5)]
    );
    final_out.push(b4.terminate().await);
    final_out.push(a.terminate().await);
    // Every message names the cluster, never a shard.
    let clusters: std::collections::BTreeSet<String> = final_out
        .iter()
        .chain([&b_out, &b2_out])
        .flatten()
        .filter_map(|m| m["cluster"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        clusters,
        std::collections::BTreeSet::from(["huge".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_shards_over_two_replicas_fold_exactly_with_the_servers_sharded_list_and_watch() {
    four_shards_over_two_replicas(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_shards_over_two_replicas_fold_exactly_with_the_client_side_fallback() {
    four_shards_over_two_replicas(false).await;
}
