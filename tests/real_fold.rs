//! On a real kube-apiserver (with etcd and the controller-manager, `tests/support/kube_server.rs`):
//! what kubesink sends, folded as docs/consumers.md says, equals the live objects exactly
//! (uid and resourceVersion), under churn that real clients and real controllers make:
//! Deployments created, scaled up and down and rolled (the ReplicaSet controller creates and
//! deletes Pods; the garbage collector cascades a Deployment's delete), ConfigMaps and Secrets
//! edited, a CRD's custom objects, a namespace created and deleted (the namespace controller
//! empties it). Secrets' data never leaves the process, in every payload mode. The same
//! stream is delivered to stdout, a JetStream stream (real nats-server) and a Kafka topic
//! (real Kafka-protocol broker), and each destination, read back and folded, holds exactly
//! the live objects. Every `updated` names the paths whose value differs from the key's
//! previous message (`changed`).

use kubesink_test_support::{self as support, kafka_server, kube_server, nats_server, process};

use std::time::Duration;

use kube_server::{configmap, create, delete, live_state, namespace, patch, patch_configmap};
use process::{resource_toml, Kubesink, STDOUT_SINK};
use serde_json::{json, Value};
use support::{fold_equals, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);

/// The kinds the test watches and folds.
const KINDS: &[(&str, &str)] = &[
    ("v1", "Pod"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "ReplicaSet"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("kubesink.test/v1", "Widget"),
];

/// Waits until the fold of `messages()` (a destination read back) equals the live objects
/// of the test's namespaces.
async fn destination_settles<F, Fut>(what: &str, client: &kube::Client, mut messages: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Value>, String>>,
{
    let ours = |o: &kube::api::DynamicObject| {
        o.metadata
            .namespace
            .as_deref()
            .is_some_and(|ns| ns.starts_with("fold-"))
    };
    wait_until(what, LONG, || {
        let read = messages();
        async move {
            let msgs = read.await?;
            let live = live_state(client, KINDS, ours).await;
            fold_equals(&live, &msgs, Expect::STRICT, |key| {
                key.1.starts_with("fold-")
            })
            .map_err(|diff| format!("{} messages: {diff}", msgs.len()))
        }
    })
    .await;
}

/// Waits until the fold equals the live objects of the test's namespaces (`fold-…`; the shared
/// control plane has others), uid and resourceVersion; returns how many there are.
async fn settle(what: &str, client: &kube::Client, k: &Kubesink) -> usize {
    let ours = |o: &kube::api::DynamicObject| {
        o.metadata
            .namespace
            .as_deref()
            .is_some_and(|ns| ns.starts_with("fold-"))
    };
    let started = std::time::Instant::now();
    loop {
        let live = live_state(client, KINDS, ours).await;
        let diff = match fold_equals(&live, &k.messages(), Expect::STRICT, |key| {
            key.1.starts_with("fold-")
        }) {
            Ok(n) => {
                eprintln!("{what}: {n} objects equal after {:?}", started.elapsed());
                return n;
            }
            Err(diff) => diff,
        };
        assert!(
            started.elapsed() < LONG,
            "{what}: the fold never equalled the API server: {diff}\nkubesink stderr:\n{}",
            k.stderr()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fold_equals_the_real_api_server_under_real_controllers_churn() {
    let cp = kube_server::shared_async().await;
    let client = cp.admin().await;
    let (main, gone) = ("fold-main", "fold-gone");
    let secret_modes = [
        "fold-secrets-full",
        "fold-secrets-meta",
        "fold-secrets-fields",
    ];
    for ns in [main, gone].iter().chain(&secret_modes) {
        namespace(cp, ns, json!({"kubesink-test": "fold"})).await;
    }
    create(&client, support::widget_crd()).await;
    support::widget_crd_established(&client).await;

    // Objects before kubesink starts (its initial list), and more after.
    for i in 0..3 {
        create(
            &client,
            kube_server::deployment(main, &format!("web-{i}"), 2, "nginx:1.27"),
        )
        .await;
    }
    create(
        &client,
        kube_server::deployment(gone, "doomed", 3, "busybox"),
    )
    .await;
    for i in 0..10 {
        create(
            &client,
            configmap(main, &format!("cm-{i}"), json!({"n": i.to_string()})),
        )
        .await;
    }
    // Secrets whose values must never be sent: in data, in stringData, and in the annotation
    // `kubectl apply` writes.
    let secret_value = "s3cr3t-value-that-must-not-leak";
    let mut secrets = Vec::new();
    for ns in secret_modes {
        for i in 0..2 {
            let name = format!("secret-{i}");
            let manifest = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": ns},
                "stringData": {"password": format!("{secret_value}-{i}")}});
            create(
                &client,
                json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": name, "namespace": ns, "annotations": {
                        "kubectl.kubernetes.io/last-applied-configuration": manifest.to_string()
                    }},
                    "stringData": {"password": format!("{secret_value}-{i}")}}),
            )
            .await;
            secrets.push((ns, name));
        }
    }

    let nats = nats_server::NatsServer::start("");
    let tansu = kafka_server::Tansu::start().await;
    tansu.create_topic("real.topology", 1).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let resources = [
        resource_toml("v1", "Pod", &[]),
        resource_toml("apps/v1", "Deployment", &[]),
        resource_toml("apps/v1", "ReplicaSet", &[]),
        resource_toml("v1", "ConfigMap", &[]),
        resource_toml("v1", "Secret", &[secret_modes[0], main, gone]),
        resource_toml("v1", "Secret", &[secret_modes[1]]),
        "payload = \"metadata\"\n".into(),
        resource_toml("v1", "Secret", &[secret_modes[2]]),
        "payload = \"fields\"\n".into(),
        "fields = [\"/data\", \"/stringData\", \"/metadata/annotations\", \"/type\"]\n".into(),
        resource_toml("kubesink.test/v1", "Widget", &[]),
    ]
    .concat();
    let rest = format!(
        r#"[pipeline]
linger = "20ms"
{resources}{STDOUT_SINK}[[sinks]]
type = "nats"
servers = ["{}"]
mode = "jetstream"
subject = "kubesink.{{cluster}}.{{kind}}.{{namespace}}.{{name}}"
[sinks.stream]
name = "REAL"
create = true
[[sinks]]
type = "kafka"
bootstrap_servers = "{}"
topic = "real.topology"
"#,
        nats.url(),
        tansu.bootstrap,
    );
    let config = process::write_config(dir.path(), "real", &cp.admin_kubeconfig, &rest);
    let k = Kubesink::start(BIN, &config, dir.path(), "real", &[]);

    let initial = settle("initial list", &client, &k).await;
    assert!(initial > 20, "{initial} objects");

    // Churn through real clients and controllers.
    patch(
        &client,
        "apps/v1",
        "Deployment",
        Some(main),
        "web-0",
        json!({"spec": {"replicas": 6}}),
    )
    .await;
    patch(
        &client,
        "apps/v1",
        "Deployment",
        Some(main),
        "web-1",
        json!({"spec": {"replicas": 0}}),
    )
    .await;
    patch(
        &client,
        "apps/v1",
        "Deployment",
        Some(main),
        "web-2",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:1.28"}]}}}}),
    )
    .await;
    create(&client, kube_server::deployment(main, "web-3", 4, "redis")).await;
    for i in 0..10 {
        if i % 3 == 0 {
            delete(&client, "v1", "ConfigMap", Some(main), &format!("cm-{i}")).await;
        } else {
            patch_configmap(
                &client,
                main,
                &format!("cm-{i}"),
                json!({"n": format!("{i}-edited")}),
            )
            .await;
        }
    }
    for (ns, name) in &secrets {
        patch(&client, "v1", "Secret", Some(ns), name, json!({"stringData": {"password": format!("{secret_value}-edited")}, "metadata": {"labels": {"edited": "yes"}}})).await;
    }
    for i in 0..8 {
        create(
            &client,
            json!({"apiVersion": "kubesink.test/v1", "kind": "Widget",
                "metadata": {"name": format!("w-{i}"), "namespace": main},
                "spec": {"size": i}}),
        )
        .await;
    }
    for i in 0..8 {
        if i % 2 == 0 {
            patch(
                &client,
                "kubesink.test/v1",
                "Widget",
                Some(main),
                &format!("w-{i}"),
                json!({"spec": {"size": i * 10}}),
            )
            .await;
        } else {
            delete(
                &client,
                "kubesink.test/v1",
                "Widget",
                Some(main),
                &format!("w-{i}"),
            )
            .await;
        }
    }
    // The garbage collector deletes web-2's old ReplicaSet's Pods, web-1's Pods, and (below)
    // everything of the namespace being deleted.
    delete(&client, "apps/v1", "Deployment", Some(main), "web-3").await;
    delete(&client, "v1", "Namespace", None, gone).await;
    wait_until(
        "the namespace controller to finish deleting fold-gone",
        LONG,
        || async {
            let api = kube_server::dynamic(&client, "v1", "Namespace", None).await;
            match api.get_opt(gone).await {
                Ok(None) => Ok(()),
                Ok(Some(ns)) => Err(ns.data["status"].to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    // The controllers done: every Deployment rolled out at its replica count, its old
    // ReplicaSets' Pods gone.
    wait_until("the Deployments to be rolled out", LONG, || async {
        let api = kube_server::dynamic(&client, "apps/v1", "Deployment", Some(main)).await;
        let list = api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let pending: Vec<String> = list
            .items
            .iter()
            .filter(|d| {
                let (spec, status) = (&d.data["spec"], &d.data["status"]);
                let replicas = spec["replicas"].as_i64().unwrap_or(1);
                status["observedGeneration"].as_i64() != d.metadata.generation
                    || status["replicas"].as_i64().unwrap_or(0) != replicas
                    || status["updatedReplicas"].as_i64().unwrap_or(0) != replicas
            })
            .map(|d| format!("{:?}: {}", d.metadata.name, d.data["status"]))
            .collect();
        pending
            .is_empty()
            .then_some(())
            .ok_or_else(|| pending.join("; "))
    })
    .await;
    let after = settle("after churn", &client, &k).await;
    assert_eq!(
        after, 35,
        "8 Pods, 3 Deployments, 4 ReplicaSets, 10 ConfigMaps, 6 Secrets, 4 Widgets"
    );
    eprintln!("{after} objects at the end");

    // The same, read back from JetStream and from Kafka.
    let url = nats.url();
    destination_settles(
        "the JetStream stream's fold to equal the API server",
        &client,
        || nats_server::jetstream_messages(&url, "REAL"),
    )
    .await;
    // tansu's high watermark can lag the last batch (kafka_server.rs): one flush record,
    // skipped below.
    tansu.flush_high_watermarks("real.topology", 1).await;
    let reader = kafka_server::Reader::start(&tansu.bootstrap, "real.topology", 1);
    destination_settles(
        "the Kafka topic's fold to equal the API server",
        &client,
        || {
            let records = reader.records();
            async move {
                records
                    .iter()
                    .filter_map(|r| r.value.as_ref())
                    .map(|v| serde_json::from_slice::<Value>(v).map_err(|e| e.to_string()))
                    .filter(|m| m.as_ref().map_or(true, |m| m["op"] != "test-flush"))
                    .collect()
            }
        },
    )
    .await;

    // Secrets: no payload mode let a value out, in any message.
    let messages = k.messages();
    let secret_messages: Vec<&Value> = messages.iter().filter(|m| m["kind"] == "Secret").collect();
    assert!(
        secret_messages.len() >= secrets.len() * 2,
        "{} Secret messages",
        secret_messages.len()
    );
    for m in &messages {
        let text = m.to_string();
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret_value);
        assert!(
            !text.contains(secret_value) && !text.contains(&b64[..b64.len() - 4]),
            "a Secret value left the process: {text}"
        );
    }
    // Real controllers made the churn: Pods the ReplicaSet controller created and deleted.
    let pods_deleted = messages
        .iter()
        .filter(|m| m["kind"] == "Pod" && m["op"] == "deleted")
        .count();
    assert!(pods_deleted >= 6, "{pods_deleted} Pod deletes");
    // Every update names what changed since the key's previous message, through
    // the controllers' status writes, scales, rollouts and adoptions (ownerReferences).
    let checked = support::check_changed(&messages, support::Changed::Covers)
        .unwrap_or_else(|e| panic!("{e}"));
    let updates = messages.iter().filter(|m| m["op"] == "updated").count();
    assert!(checked > 20, "{checked} of {updates} updates checked");
    k.terminate().await;
}
