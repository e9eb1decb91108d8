//! `[[resources]]` in the group form (`group`, `kinds`, `exclude`; docs/configuration.md
//! "Whole API groups") on a real kube-apiserver, with CRDs installed, changed and deleted
//! while kubesink runs. After each step the fold of what kubesink wrote equals the server
//! (uid and resourceVersion of every object of the followed kinds):
//! - a CRD installed after the start: its kind followed, its objects sent, within seconds;
//! - a second CRD of the group; a new preferred version of the first (v1 beside v1alpha1):
//!   later changes in the new `apiVersion`;
//! - a restart from saved state: nothing unchanged sent again;
//! - a CRD deleted: its objects' deletes (the API server deletes them first);
//! - a CRD deleted while kubesink is not running: the next start sends its objects' deletes
//!   from the kind's saved state (inferred deletes), then forgets the kind;
//! - beside it, `kinds = ["*"]` over one namespace with exclusions: every namespaced kind
//!   but those excluded.

use kubesink_test_support::{self as support, kube_server, process};

use std::time::{Duration, Instant};

use kube::api::{DeleteParams, DynamicObject};
use kube_server::{create, live_state, namespace, patch, ControlPlane};
use process::{Kubesink, STDOUT_SINK};
use serde_json::{json, Value};
use support::{fold_equals, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(120);
const GROUP: &str = "grp.kubesink.test";
const NS: &str = "grp-a";
const VIEW: &str = "grp-view";

/// A namespaced CRD of [`GROUP`] for `kind`, served at `versions` (the last one stored).
fn crd(kind: &str, versions: &[&str]) -> Value {
    let plural = format!("{}s", kind.to_lowercase());
    let versions: Vec<Value> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            json!({"name": v, "served": true, "storage": i + 1 == versions.len(),
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}})
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {"group": GROUP, "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind, "listKind": format!("{kind}List")},
            "versions": versions}
    })
}

/// Waits until `kind`'s CRD is established and its `version` served.
async fn served(client: &kube::Client, kind: &str, version: &str) {
    let gvk = kube::api::GroupVersionKind::gvk(GROUP, version, kind);
    wait_until(&format!("{kind} served at {version}"), LONG, || async {
        let (ar, _) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| e.to_string())?;
        kube::Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ar)
            .list(&Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
}

fn object(kind: &str, version: &str, name: &str, n: i64) -> Value {
    json!({"apiVersion": format!("{GROUP}/{version}"), "kind": kind,
        "metadata": {"name": name, "namespace": NS}, "spec": {"n": n}})
}

/// The live objects of the group's `kinds` (at their `api_version`) in [`NS`].
async fn live(client: &kube::Client, kinds: &[(&str, &str)]) -> support::UidFold {
    let ours = |o: &DynamicObject| o.metadata.namespace.as_deref() == Some(NS);
    live_state(client, kinds, ours).await
}

/// Waits until the fold of `prior` messages and `k`'s of the group's kinds equals the
/// server's `kinds`; returns how long it took.
async fn settle(
    what: &str,
    client: &kube::Client,
    prior: &[Value],
    k: &Kubesink,
    kinds: &[(&str, &str)],
) -> Duration {
    let started = Instant::now();
    let names: Vec<String> = ["Gizmo", "Doohickey"].map(String::from).to_vec();
    wait_until(what, LONG, || async {
        let want = live(client, kinds).await;
        let msgs: Vec<Value> = prior.iter().cloned().chain(k.messages()).collect();
        fold_equals(&want, &msgs, Expect::STRICT.restarts(), |key| {
            key.1 == NS && names.contains(&key.0)
        })
        .map(|_| ())
        .map_err(|diff| format!("{diff}\nstderr:\n{}", k.stderr()))
    })
    .await;
    let took = started.elapsed();
    eprintln!("{what}: the fold equals the server after {took:?}");
    took
}

fn write_config(dir: &std::path::Path, cp: &ControlPlane) -> std::path::PathBuf {
    let rest = format!(
        r#"[pipeline]
linger = "20ms"
[state]
backend = "file"
path = "state/state"
interval = "1s"
[[resources]]
group = "{GROUP}"
namespaces = ["{NS}"]
[[resources]]
kinds = ["*"]
namespaces = ["{VIEW}"]
exclude = ["events", "*.{GROUP}", "serviceaccounts"]
{STDOUT_SINK}"#
    );
    process::write_config(dir, "grp", &cp.admin_kubeconfig, &rest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_installed_changed_and_deleted_while_running_are_followed() {
    let cp = kube_server::shared_async().await;
    let client = cp.admin().await;
    namespace(cp, NS, json!({})).await;
    namespace(cp, VIEW, json!({})).await;
    let crds = kube_server::dynamic(
        &client,
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        None,
    )
    .await;
    // A control plane kept from an earlier run may still have the test's CRDs.
    for kind in ["gizmos", "doohickeys"] {
        let name = format!("{kind}.{GROUP}");
        let _ = crds.delete(&name, &DeleteParams::default()).await;
        wait_until(&format!("{name} gone"), LONG, || async {
            match crds.get_opt(&name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("state")).expect("state dir");
    let config = write_config(dir.path(), cp);
    let k = Kubesink::start(BIN, &config, dir.path(), "grp", &[]);
    k.wait_logged("the group discovered", "kubesink running", LONG)
        .await;

    // A CRD installed while kubesink runs.
    create(&client, crd("Gizmo", &["v1alpha1"])).await;
    served(&client, "Gizmo", "v1alpha1").await;
    for i in 0..3 {
        create(&client, object("Gizmo", "v1alpha1", &format!("g-{i}"), i)).await;
    }
    let gizmo = [(&*format!("{GROUP}/v1alpha1"), "Gizmo")];
    let took = settle("a CRD installed", &client, &[], &k, &gizmo).await;
    assert!(took < LONG);

    // A second kind of the group, and a newer version of the first.
    create(&client, crd("Doohickey", &["v1"])).await;
    served(&client, "Doohickey", "v1").await;
    create(&client, object("Doohickey", "v1", "d-0", 0)).await;
    let mut moved = crd("Gizmo", &["v1alpha1", "v1"]);
    moved["metadata"]["resourceVersion"] = crds
        .get(&format!("gizmos.{GROUP}"))
        .await
        .expect("get CRD")
        .metadata
        .resource_version
        .into();
    crds.replace(
        &format!("gizmos.{GROUP}"),
        &Default::default(),
        &serde_json::from_value(moved).expect("CRD"),
    )
    .await
    .expect("add v1 to the Gizmo CRD");
    served(&client, "Gizmo", "v1").await;
    k.wait_logged(
        "Gizmo followed at v1",
        "a kind's preferred version changed",
        LONG,
    )
    .await;
    patch(
        &client,
        &format!("{GROUP}/v1"),
        "Gizmo",
        Some(NS),
        "g-1",
        json!({"spec": {"n": 11}}),
    )
    .await;
    let both = [
        (&*format!("{GROUP}/v1"), "Gizmo"),
        (&*format!("{GROUP}/v1"), "Doohickey"),
    ];
    settle("a second kind, and a new version", &client, &[], &k, &both).await;
    let g1 = k
        .messages()
        .into_iter()
        .rev()
        .find(|m| m["kind"] == "Gizmo" && m["name"] == "g-1")
        .expect("g-1's messages");
    assert_eq!(g1["apiVersion"], format!("{GROUP}/v1"), "{g1}");
    // The move sends each object once more, as updated in its new apiVersion, never as
    // added: they are the same objects (uid, resourceVersion).
    for name in ["g-0", "g-2"] {
        let sent: Vec<String> = k
            .messages()
            .iter()
            .filter(|m| m["kind"] == "Gizmo" && m["name"] == name)
            .map(|m| {
                format!(
                    "{} {}",
                    m["op"].as_str().unwrap_or(""),
                    m["apiVersion"].as_str().unwrap_or("")
                )
            })
            .collect();
        let want = [
            format!("added {GROUP}/v1alpha1"),
            format!("updated {GROUP}/v1"),
        ];
        assert_eq!(sent, want, "{name}");
    }

    // The `kinds = ["*"]` view of one namespace: its ConfigMaps (and the root CA one the
    // controllers publish), not its excluded ServiceAccounts.
    create(
        &client,
        kube_server::configmap(VIEW, "seen", json!({"a": "1"})),
    )
    .await;
    wait_until("the namespace view", LONG, || async {
        let msgs = k.messages();
        let kinds: Vec<&str> = msgs
            .iter()
            .filter(|m| m["namespace"] == VIEW)
            .filter_map(|m| m["kind"].as_str())
            .collect();
        (kinds.contains(&"ConfigMap") && !kinds.contains(&"ServiceAccount"))
            .then_some(())
            .ok_or_else(|| format!("{kinds:?}"))
    })
    .await;
    assert!(
        !k.messages()
            .iter()
            .any(|m| m["namespace"] == VIEW && m["kind"] == "ServiceAccount"),
        "an excluded kind was sent"
    );

    // A restart from saved state sends nothing that did not change.
    let prior = k.terminate().await;
    let before = prior.len();
    let k = Kubesink::start(BIN, &config, dir.path(), "grp", &[]);
    create(&client, object("Gizmo", "v1", "g-3", 3)).await;
    settle("after a restart", &client, &prior, &k, &both).await;
    let resent: Vec<String> = k
        .messages()
        .iter()
        .filter(|m| m["namespace"] == NS && m["name"] != "g-3")
        .map(|m| format!("{} {} {}", m["op"], m["kind"], m["name"]))
        .collect();
    assert!(
        resent.is_empty(),
        "sent again after a restart ({before} before): {resent:?}"
    );

    // A CRD deleted: the API server deletes its objects, the watch sends their deletes.
    crds.delete(&format!("doohickeys.{GROUP}"), &DeleteParams::default())
        .await
        .expect("delete the Doohickey CRD");
    let gizmo_v1 = [(&*format!("{GROUP}/v1"), "Gizmo")];
    settle("a CRD deleted", &client, &prior, &k, &gizmo_v1).await;

    // A CRD deleted while kubesink is not running: the next start finds the kind in the
    // list of kinds it followed, no longer served, and sends the deletes of what its saved
    // state holds (inferred: finalStateUnknown).
    let prior: Vec<Value> = prior.into_iter().chain(k.terminate().await).collect();
    crds.delete(&format!("gizmos.{GROUP}"), &DeleteParams::default())
        .await
        .expect("delete the Gizmo CRD");
    wait_until("the Gizmo CRD gone", LONG, || async {
        match crds.get_opt(&format!("gizmos.{GROUP}")).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let mut k = Kubesink::start(BIN, &config, dir.path(), "grp", &[]);
    wait_until("every Gizmo deleted downstream", LONG, || async {
        let msgs: Vec<Value> = prior.iter().cloned().chain(k.messages()).collect();
        let o = support::fold_expecting(&msgs, Expect::STRICT.restarts());
        let left: Vec<_> = o.keys().filter(|key| key.0 == "Gizmo").collect();
        left.is_empty()
            .then_some(())
            .ok_or_else(|| format!("{left:?}\n{}", k.stderr()))
    })
    .await;
    let inferred: Vec<String> = k
        .messages()
        .iter()
        .filter(|m| m["kind"] == "Gizmo")
        .map(|m| format!("{} {} {}", m["op"], m["name"], m["finalStateUnknown"]))
        .collect();
    assert_eq!(inferred.len(), 4, "{inferred:?}");
    assert!(
        inferred
            .iter()
            .all(|m| m.starts_with("\"deleted\"") && m.ends_with("true")),
        "{inferred:?}"
    );
    // Once those deletes are saved as acknowledged the kind is forgotten: a third start
    // sends nothing of it.
    k.wait_logged(
        "the retired kind done",
        "a retired kind's deletes are acknowledged",
        LONG,
    )
    .await;
    let _ = k.exited();
    let all: Vec<Value> = prior.into_iter().chain(k.terminate().await).collect();

    // `kubesink fold --against-cluster` compares the group-form entries kind by kind, as
    // discovery resolves them now: every kind namespaced in the view's namespace included.
    let file = dir.path().join("all.jsonl");
    let jsonl: String = all.iter().map(|m| format!("{m}\n")).collect();
    std::fs::write(&file, jsonl).expect("write the messages");
    let fold = process::clean_command(BIN)
        .args([
            "--config",
            config.to_str().unwrap_or_default(),
            "fold",
            "--file",
        ])
        .arg(&file)
        .arg("--against-cluster")
        .current_dir(dir.path())
        .output()
        .await
        .expect("kubesink fold");
    let stderr = String::from_utf8_lossy(&fold.stderr);
    assert_eq!(
        fold.status.code(),
        Some(0),
        "{stderr}\n{}",
        String::from_utf8_lossy(&fold.stdout)
    );
    assert!(stderr.contains("in agreement with the cluster"), "{stderr}");
}
