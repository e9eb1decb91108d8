//! Sink filters and routes on a real kube-apiserver: one kubesink sends the
//! ConfigMaps of team `pay` to one Kafka topic, every other ConfigMap to a second topic,
//! the Secrets' metadata to a JetStream subject only, and the deletes (a change filter on
//! `op`) to a second stream. An object relabelled from one team to the other leaves one
//! topic (`deleted`, `reason: "leftFilter"`) and enters the other (`added`). Each
//! destination, read back and folded, equals the API server filtered by its route (written
//! in Rust apart from the CEL expressions; uid and resourceVersion, `Expect::STRICT`):
//! after churn, after a hand-over between two replicas (leader election on a real Lease, the
//! state in a NATS object store), in which each sink gets exactly the changes made meanwhile
//! and nothing is re-sent, and after the leader is SIGKILLed mid-churn.

use kubesink_test_support::{self as support, kafka_server, kube_server, nats_server, process};

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kube::api::DynamicObject;
use kube_server::{create, delete, live_state, namespace, patch, ControlPlane};
use process::{leader_toml, nats_state_toml, resource_toml, Kubesink};
use serde_json::{json, Value};
use support::{fold_equals, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "routes";
const CONFIGMAPS: &[(&str, &str)] = &[("v1", "ConfigMap")];
const SECRETS: &[(&str, &str)] = &[("v1", "Secret")];
const PAY: &str = r#"kind == "ConfigMap" && has(object.metadata.labels) && "team" in object.metadata.labels && object.metadata.labels.team == "pay""#;

fn write_config(dir: &Path, cp: &ControlPlane, nats: &str, kafka: &str) -> std::path::PathBuf {
    let configmaps = resource_toml("v1", "ConfigMap", &[NS]);
    let secrets = resource_toml("v1", "Secret", &[NS]);
    let (leader, state) = (
        leader_toml("kubesink-routes", NS, false),
        nats_state_toml(nats),
    );
    let rest = format!(
        r#"{leader}[pipeline]
linger = "20ms"
{state}{configmaps}{secrets}payload = "metadata"
[[sinks]]
type = "kafka"
name = "pay"
bootstrap_servers = "{kafka}"
topic = "routes.pay"
filter = '{PAY}'
[[sinks]]
type = "kafka"
name = "rest"
bootstrap_servers = "{kafka}"
topic = "routes.rest"
filter = 'kind == "ConfigMap" && !({PAY})'
[[sinks]]
type = "nats"
name = "secrets"
servers = ["{nats}"]
mode = "jetstream"
subject = "routes.{{kind}}.{{namespace}}.{{name}}"
filter = 'kind == "Secret"'
[sinks.stream]
name = "ROUTES"
create = true
[[sinks]]
type = "nats"
name = "deletes"
servers = ["{nats}"]
mode = "jetstream"
subject = "deletes.{{kind}}.{{namespace}}.{{name}}"
filter = 'op == "deleted"'
[sinks.stream]
name = "DELETES"
create = true
"#
    );
    process::write_config(dir, "real-routes", &cp.admin_kubeconfig, &rest)
}

fn team(o: &DynamicObject) -> Option<&str> {
    o.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("team"))
        .map(String::as_str)
}

/// The destinations, read back.
struct Read {
    pay: kafka_server::Reader,
    rest: kafka_server::Reader,
    nats: String,
}

/// What each destination holds: (pay, rest, secrets, deletes) messages.
struct Held {
    pay: Vec<Value>,
    rest: Vec<Value>,
    secrets: Vec<Value>,
    deletes: Vec<Value>,
}

impl Read {
    fn topic(r: &kafka_server::Reader) -> Vec<Value> {
        r.records()
            .iter()
            .filter_map(|r| r.value.as_ref())
            .filter_map(|v| serde_json::from_slice::<Value>(v).ok())
            .filter(|m| m["op"] != "test-flush")
            .collect()
    }

    async fn held(&self) -> Result<Held, String> {
        Ok(Held {
            pay: Self::topic(&self.pay),
            rest: Self::topic(&self.rest),
            secrets: nats_server::jetstream_messages(&self.nats, "ROUTES").await?,
            deletes: nats_server::jetstream_messages(&self.nats, "DELETES")
                .await
                .unwrap_or_default(),
        })
    }
}

/// Waits until every route's fold equals the API server filtered by that route; returns
/// what the destinations hold then.
async fn converged(what: &str, client: &kube::Client, read: &Read) -> Held {
    wait_until(what, LONG, || async {
        let held = read.held().await?;
        let ours = |o: &DynamicObject| o.metadata.namespace.as_deref() == Some(NS);
        let pay = live_state(client, CONFIGMAPS, |o| ours(o) && team(o) == Some("pay")).await;
        let rest = live_state(client, CONFIGMAPS, |o| ours(o) && team(o) != Some("pay")).await;
        let secrets = live_state(client, SECRETS, ours).await;
        let strict = Expect::STRICT.restarts();
        fold_equals(&pay, &held.pay, strict, |_| true).map_err(|d| format!("pay: {d}"))?;
        fold_equals(&rest, &held.rest, strict, |_| true).map_err(|d| format!("rest: {d}"))?;
        fold_equals(&secrets, &held.secrets, strict, |_| true)
            .map_err(|d| format!("secrets: {d}"))?;
        Ok::<_, String>(held)
    })
    .await
}

fn cm(name: &str, team: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": {"team": team}},
        "data": {"v": "0"}})
}

fn secret(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NS}, "stringData": {"password": "hunter2"}})
}

async fn relabel(client: &kube::Client, name: &str, team: &str) {
    let labels = json!({"metadata": {"labels": {"team": team}}});
    patch(client, "v1", "ConfigMap", Some(NS), name, labels).await;
}

async fn touch(client: &kube::Client, name: &str, v: &str) {
    patch(
        client,
        "v1",
        "ConfigMap",
        Some(NS),
        name,
        json!({"data": {"v": v}}),
    )
    .await;
}

/// (op, name, reason) of each message of `msgs` about `name`.
fn about(msgs: &[Value], name: &str) -> Vec<(String, Option<String>)> {
    msgs.iter()
        .filter(|m| m["name"] == name)
        .map(|m| {
            (
                m["op"].as_str().unwrap_or_default().to_owned(),
                m["reason"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// (op, name) of the messages after the first `from`.
fn since(msgs: &[Value], from: usize) -> BTreeSet<(String, String)> {
    msgs[from..]
        .iter()
        .map(|m| {
            (
                m["op"].as_str().unwrap_or_default().to_owned(),
                m["name"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_fold_exact_per_sink_through_leaving_a_filter_a_hand_over_and_a_crash() {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    namespace(cp, NS, json!({})).await;
    let client = cp.admin().await;
    for i in 0..12usize {
        let team = if i.is_multiple_of(2) { "pay" } else { "shop" };
        create(&client, cm(&format!("cm-{i:02}"), team)).await;
    }
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unlabelled", "namespace": NS}}),
    )
    .await;
    for i in 0..4 {
        create(&client, secret(&format!("s-{i}"))).await;
    }
    let nats = nats_server::NatsServer::start("");
    let tansu = kafka_server::Tansu::start().await;
    tansu.create_topic("routes.pay", 1).await;
    tansu.create_topic("routes.rest", 1).await;
    let read = Read {
        pay: kafka_server::Reader::start(&tansu.bootstrap, "routes.pay", 1),
        rest: kafka_server::Reader::start(&tansu.bootstrap, "routes.rest", 1),
        nats: nats.url(),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), cp, &nats.url(), &tansu.bootstrap);

    // `check` prints the compiled routes.
    let check = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .expect("check");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{out}");
    assert!(
        out.contains(
            "#   v1 ConfigMap → kafka \"pay\" (topic \"routes.pay\"): the objects matching (kind == \"ConfigMap\""
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "#   v1 Secret → nats \"deletes\" (subject \"deletes.{kind}.{namespace}.{name}\", stream \"DELETES\"): the changes matching (op == \"deleted\"); own state"
        ),
        "{out}"
    );

    let first = Kubesink::start(BIN, &config, dir.path(), "first", &[]);
    let held = converged("the first leader's routes", &client, &read).await;
    assert!(held.pay.iter().all(|m| m["kind"] == "ConfigMap"));
    assert!(held.secrets.iter().all(|m| m["kind"] == "Secret"));
    assert!(
        held.secrets
            .iter()
            .all(|m| m["object"].get("data").is_none()),
        "metadata only"
    );
    assert_eq!(held.pay.len(), 6, "the 6 ConfigMaps of team pay, once each");
    assert_eq!(
        held.rest.len(),
        8,
        "the 6 of team shop, the unlabelled one and kube-root-ca.crt (the controller-manager's)"
    );
    assert!(held.deletes.is_empty(), "{:?}", held.deletes);
    // `kubesink fold --against-cluster --sink` compares a topic with what its route holds.
    let fold = |topic: &str, sink: Option<&str>| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["fold", "--kafka", &tansu.bootstrap, "--topic", topic])
            .args(["--against-cluster", "--config"])
            .arg(&config);
        if let Some(s) = sink {
            cmd.args(["--sink", s]);
        }
        let out = cmd.output().expect("fold");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // tansu's high watermark lags its last batch (kafka_server.rs); fold stops there.
    tansu.flush_high_watermarks("routes.pay", 1).await;
    let (code, stdout, stderr) = fold("routes.pay", Some("pay"));
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let (code, stdout, stderr) = fold("routes.pay", None);
    assert_eq!(
        code,
        Some(1),
        "without --sink every ConfigMap is expected: {stdout}"
    );
    assert!(stdout.contains("\"missing\""), "{stdout}");
    assert!(stderr.contains("compare with --sink NAME"), "{stderr}");
    let (code, _, stderr) = fold("routes.pay", Some("deletes"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("names op or changed"), "{stderr}");
    // A standby: it takes over when the first stops.
    let second = Kubesink::start(BIN, &config, dir.path(), "second", &[]);

    // Leaving and entering a route.
    relabel(&client, "cm-00", "shop").await;
    relabel(&client, "cm-01", "pay").await;
    delete(&client, "v1", "ConfigMap", Some(NS), "cm-02").await;
    delete(&client, "v1", "ConfigMap", Some(NS), "cm-03").await;
    create(&client, cm("cm-20", "pay")).await;
    touch(&client, "cm-04", "1").await;
    delete(&client, "v1", "Secret", Some(NS), "s-0").await;
    create(&client, secret("s-9")).await;
    let held = converged("the routes after churn", &client, &read).await;
    let left = |op: &str| (op.to_owned(), Some("leftFilter".to_owned()));
    assert_eq!(
        about(&held.pay, "cm-00"),
        vec![("added".into(), None), left("deleted")]
    );
    assert_eq!(about(&held.rest, "cm-00"), vec![("added".into(), None)]);
    assert_eq!(
        about(&held.rest, "cm-01"),
        vec![("added".into(), None), left("deleted")]
    );
    assert_eq!(about(&held.pay, "cm-01"), vec![("added".into(), None)]);
    let deleted: BTreeSet<_> = wait_until("the deletes' stream", LONG, || async {
        let d = nats_server::jetstream_messages(&read.nats, "DELETES").await?;
        let names: BTreeSet<String> = d
            .iter()
            .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        match names.len() {
            3 => Ok((d, names)),
            _ => Err(format!("{names:?}")),
        }
    })
    .await
    .1;
    assert_eq!(
        deleted,
        ["cm-02", "cm-03", "s-0"].map(str::to_owned).into(),
        "the deletes only: a relabel is not a delete for this route"
    );

    // A hand-over (SIGTERM: the state saved): each route gets exactly what changed.
    let counts = (held.pay.len(), held.rest.len(), held.secrets.len());
    let first = first.terminate().await;
    assert!(first.is_empty(), "no stdout sink");
    relabel(&client, "cm-06", "shop").await;
    touch(&client, "cm-05", "2").await;
    create(&client, cm("cm-21", "pay")).await;
    delete(&client, "v1", "Secret", Some(NS), "s-1").await;
    let held = converged("the routes after the hand-over", &client, &read).await;
    let pair = |op: &str, name: &str| (op.to_owned(), name.to_owned());
    assert_eq!(
        since(&held.pay, counts.0),
        [pair("deleted", "cm-06"), pair("added", "cm-21")].into(),
        "{:#?}",
        &held.pay[counts.0..]
    );
    assert_eq!(
        since(&held.rest, counts.1),
        [pair("added", "cm-06"), pair("updated", "cm-05")].into(),
        "{:#?}",
        &held.rest[counts.1..]
    );
    assert_eq!(
        since(&held.secrets, counts.2),
        [pair("deleted", "s-1")].into(),
        "{:#?}",
        &held.secrets[counts.2..]
    );
    assert_eq!(held.pay.len() - counts.0, 2, "nothing re-sent");
    assert_eq!(held.rest.len() - counts.1, 2, "nothing re-sent");
    assert_eq!(held.secrets.len() - counts.2, 1, "nothing re-sent");

    // The leader SIGKILLed mid-churn; a new replica takes over from the saved state.
    let churn = async {
        for round in 0..6usize {
            for i in [4usize, 8, 10] {
                let name = format!("cm-{i:02}");
                let team = if (round + i).is_multiple_of(2) {
                    "pay"
                } else {
                    "shop"
                };
                relabel(&client, &name, team).await;
            }
            touch(&client, "cm-07", &round.to_string()).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    };
    let kill = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        second.kill().await
    };
    let ((), _) = tokio::join!(churn, kill);
    let third = Kubesink::start(BIN, &config, dir.path(), "third", &[]);
    converged("the routes after a SIGKILL", &client, &read).await;
    let _ = third.terminate().await;
}
