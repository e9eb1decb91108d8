//! What changed, on a real kube-apiserver: each kind of edit a real client makes
//! (a scale and an image change of a Deployment its real controllers act on, a label edit, a
//! status write through the status subresource, an owner added, a server-side apply that
//! touches only `managedFields`) is sent as an `updated` naming exactly its paths; configured
//! `change_paths` name only themselves, `change_values` carry the old and new values; with
//! `ignore_changes = ["status"]` a status write is
//! sent neither then nor after a restart from saved state, and the next update sent names
//! the status too (relative to the last message sent).

use kubesink_test_support::{self as support, kube_server, process};

use std::path::Path;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube_server::{create, dynamic, namespace, ControlPlane};
use process::{Kubesink, STDOUT_SINK};
use serde_json::{json, Value};
use support::wait_until;

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);

fn write_config(dir: &Path, cp: &ControlPlane, ns: &str, extra: &str) -> std::path::PathBuf {
    let state = dir.join("state").display().to_string();
    // Every update is sent as it was observed, so each edit's own message can be read.
    let rest = format!(
        "[pipeline]\nlinger = \"20ms\"\ncoalesce = false\n[state]\nbackend = \"file\"\npath = {state:?}\n{extra}\n{STDOUT_SINK}"
    );
    process::write_config(dir, &format!("real-{ns}"), &cp.admin_kubeconfig, &rest)
}

/// A merge patch of `name` (of `subresource` when given); returns the resourceVersion the
/// server gave the result.
async fn merge(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    ns: &str,
    name: &str,
    subresource: Option<&str>,
    patch: Value,
) -> String {
    let api = dynamic(client, api_version, kind, Some(ns)).await;
    let p = Patch::Merge(patch);
    let pp = PatchParams::default();
    let obj = match subresource {
        None => api.patch(name, &pp, &p).await,
        Some(sub) => api.patch_subresource(sub, name, &pp, &p).await,
    }
    .unwrap_or_else(|e| panic!("patch {kind} {name}: {e}"));
    obj.metadata.resource_version.expect("resourceVersion")
}

/// A merge patch of the Pod `solo` in `ns` (of its `subresource` when given); returns the
/// resourceVersion the server gave the result.
async fn edit_solo(
    client: &kube::Client,
    ns: &str,
    subresource: Option<&str>,
    patch: Value,
) -> String {
    merge(client, "v1", "Pod", ns, "solo", subresource, patch).await
}

/// The message of `name` at `rv`, once kubesink sent it.
async fn sent_at(k: &Kubesink, name: &str, rv: &str) -> Value {
    wait_until(&format!("the message of {name} at {rv}"), LONG, || {
        let found = k
            .messages()
            .into_iter()
            .find(|m| m["name"] == name && m["resourceVersion"] == rv);
        std::future::ready(found.ok_or_else(|| format!("{} messages", k.count())))
    })
    .await
}

/// One edit: what it is, `(apiVersion, kind)`, name, subresource, merge patch, the paths
/// its `updated` must name.
type Edit<'a> = (
    &'a str,
    (&'a str, &'a str),
    &'a str,
    Option<&'a str>,
    Value,
    Vec<&'a str>,
);

fn changed(m: &Value) -> Option<Vec<&str>> {
    m.get("changed")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
}

async fn synced(k: &Kubesink, names: &[&str]) {
    wait_until("the initial list", LONG, || {
        let msgs = k.messages();
        let missing: Vec<&&str> = names
            .iter()
            .filter(|n| !msgs.iter().any(|m| m["name"] == **n))
            .collect();
        std::future::ready(if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("{missing:?} not sent yet"))
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_edit_of_a_real_client_names_exactly_its_paths_and_ignored_ones_stay_unsent() {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    let ns = "changes";
    namespace(cp, ns, json!({})).await;
    let client = cp.admin().await;
    let owner = create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "owner", "namespace": ns}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "solo", "namespace": ns, "labels": {"app": "solo"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}}),
    )
    .await;

    // Default paths.
    let dir = tempfile::tempdir().expect("tempdir");
    let resources = format!(
        r#"[[resources]]
api_version = "v1"
kind = "Pod"
namespaces = ["{ns}"]
[[resources]]
api_version = "apps/v1"
kind = "Deployment"
namespaces = ["{ns}"]
"#
    );
    let config = write_config(dir.path(), cp, ns, &resources);
    let k = Kubesink::start(BIN, &config, dir.path(), "default", &[]);
    synced(&k, &["solo", "web"]).await;
    let (pods, deployments) = (("v1", "Pod"), ("apps/v1", "Deployment"));
    let edits: Vec<Edit> = vec![
        (
            "a scale",
            deployments,
            "web",
            None,
            json!({"spec": {"replicas": 2}}),
            vec!["spec"],
        ),
        (
            "an image change",
            deployments,
            "web",
            None,
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "c", "image": "nginx:1.28"}]}}}}),
            vec!["spec"],
        ),
        (
            "a label edit",
            pods,
            "solo",
            None,
            json!({"metadata": {"labels": {"tier": "front"}}}),
            vec!["metadata.labels"],
        ),
        (
            "a status write",
            pods,
            "solo",
            Some("status"),
            json!({"status": {"conditions": [{"type": "kubesink.test/Checked", "status": "True"}]}}),
            vec!["status"],
        ),
        (
            "an owner added",
            pods,
            "solo",
            None,
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "owner", "uid": owner.metadata.uid.clone().expect("uid")}]}}),
            vec!["metadata.ownerReferences"],
        ),
        (
            "an annotation",
            pods,
            "solo",
            None,
            json!({"metadata": {"annotations": {"note": "x"}}}),
            vec!["metadata.annotations"],
        ),
    ];
    for (what, (api_version, kind), name, sub, patch, want) in edits {
        let rv = merge(&client, api_version, kind, ns, name, sub, patch).await;
        let m = sent_at(&k, name, &rv).await;
        assert_eq!(m["op"], "updated", "{what}: {m}");
        assert_eq!(changed(&m), Some(want), "{what}: {m}");
    }
    // A server-side apply by another field manager of a value already there: the server
    // records the new manager in managedFields (the resourceVersion moves); nothing is sent.
    let api = dynamic(&client, "v1", "Pod", Some(ns)).await;
    let touched = api
        .patch(
            "solo",
            &PatchParams::apply("kubesink-test-touch").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "solo", "namespace": ns, "labels": {"tier": "front"}}})),
        )
        .await
        .expect("apply");
    let touched_rv = touched.metadata.resource_version.expect("resourceVersion");
    let after = edit_solo(
        &client,
        ns,
        None,
        json!({"metadata": {"labels": {"after": "touch"}}}),
    )
    .await;
    let m = sent_at(&k, "solo", &after).await;
    assert_eq!(changed(&m), Some(vec!["metadata.labels"]), "{m}");
    let all = k.terminate().await;
    assert!(
        !all.iter()
            .any(|m| m["name"] == "solo" && m["resourceVersion"] == touched_rv.as_str()),
        "a managedFields-only touch is not sent"
    );
    // Every update of the run, controllers' included, names what its objects say changed.
    let checked =
        support::check_changed(&all, support::Changed::Exact).unwrap_or_else(|e| panic!("{e}"));
    assert!(checked >= 7, "{checked} updates checked");

    // Configured paths and ignored ones (a new selection: the saved state is ignored once).
    let resources = format!(
        r#"[[resources]]
api_version = "v1"
kind = "Pod"
namespaces = ["{ns}"]
ignore_changes = ["status"]
[[resources]]
api_version = "apps/v1"
kind = "Deployment"
namespaces = ["{ns}"]
change_paths = ["spec.replicas", "spec.template.spec.containers[*].image"]
change_values = ["spec.replicas", "spec.template.spec.containers[*].image"]
"#
    );
    let config = write_config(dir.path(), cp, ns, &resources);
    let k = Kubesink::start(BIN, &config, dir.path(), "configured", &[]);
    synced(&k, &["solo", "web"]).await;
    let rv = merge(
        &client,
        "apps/v1",
        "Deployment",
        ns,
        "web",
        None,
        json!({"spec": {"replicas": 3}}),
    )
    .await;
    let m = sent_at(&k, "web", &rv).await;
    assert_eq!(changed(&m), Some(vec!["spec.replicas"]), "{m}");
    assert_eq!(
        m["changes"],
        json!([{"path": "spec.replicas", "old": 2, "new": 3}]),
        "the old and new values: {m}"
    );
    // The deployment controller's status write after it changes neither configured path.
    wait_until(
        "a Deployment update naming no configured path",
        LONG,
        || {
            let found = k.messages().iter().any(|m| {
                m["kind"] == "Deployment" && m["op"] == "updated" && changed(m) == Some(vec![])
            });
            std::future::ready(if found {
                Ok(())
            } else {
                Err(format!("{:#?}", k.messages()))
            })
        },
    )
    .await;
    let status = edit_solo(
        &client,
        ns,
        Some("status"),
        json!({"status": {"conditions": [{"type": "kubesink.test/Checked", "status": "False"}]}}),
    )
    .await;
    // A label edit after it is sent: the status write before it was not.
    let label = edit_solo(
        &client,
        ns,
        None,
        json!({"metadata": {"labels": {"tier": "back"}}}),
    )
    .await;
    let m = sent_at(&k, "solo", &label).await;
    assert_eq!(
        changed(&m),
        Some(vec!["metadata.labels", "status"]),
        "relative to the last message sent, whose status was the older one: {m}"
    );
    let status_again = edit_solo(
        &client,
        ns,
        Some("status"),
        json!({"status": {"conditions": [{"type": "kubesink.test/Checked", "status": "Unknown"}]}}),
    )
    .await;
    let first = k.terminate().await;
    for rv in [&status, &status_again] {
        assert!(
            !first
                .iter()
                .any(|m| m["name"] == "solo" && m["resourceVersion"] == rv.as_str()),
            "the ignored status write at {rv} was sent: {first:#?}"
        );
    }
    assert!(first
        .iter()
        .filter(|m| m["kind"] == "Deployment" && m["op"] == "updated")
        .all(|m| m.get("changed").is_some()));

    // A restart from the saved state sends nothing for the Pod, whose only change since the
    // last message sent is ignored; its next label edit names the status too.
    let k = Kubesink::start(BIN, &config, dir.path(), "restarted", &[]);
    let label = edit_solo(
        &client,
        ns,
        None,
        json!({"metadata": {"labels": {"tier": "again"}}}),
    )
    .await;
    let m = sent_at(&k, "solo", &label).await;
    assert_eq!(
        changed(&m),
        Some(vec!["metadata.labels", "status"]),
        "the parts came back from the saved state: {m}"
    );
    let second = k.terminate().await;
    let solo: Vec<&Value> = second.iter().filter(|m| m["name"] == "solo").collect();
    assert_eq!(solo.len(), 1, "only the label edit: {solo:#?}");
    assert!(second.iter().all(|m| m["initial"] != true), "{second:#?}");
}

/// `ignore_changes = ["metadata.annotations", "status.observedGeneration"]` on a Deployment:
/// the API server moves its `metadata.generation` with an annotation change, and the
/// deployment controller then writes `status.observedGeneration`; neither write is sent
/// (before, the generation made the annotation write an update). A label edit after them is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_deployment_annotation_is_not_sent_through_the_generation_it_moves() {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    let ns = "changes-annotations";
    namespace(cp, ns, json!({})).await;
    let client = cp.admin().await;
    create(
        &client,
        kube_server::deployment(ns, "quiet", 0, "nginx:1.27"),
    )
    .await;
    let api = dynamic(&client, "apps/v1", "Deployment", Some(ns)).await;
    // The controller's writes after the create, done before kubesink starts.
    let caught_up = || async {
        wait_until("the deployment controller caught up", LONG, || {
            let api = api.clone();
            async move {
                let d = api.get("quiet").await.map_err(|e| e.to_string())?;
                let generation = d.metadata.generation.unwrap_or_default();
                match d.data["status"]["observedGeneration"].as_i64() {
                    Some(seen) if seen == generation => {
                        Ok((generation, d.metadata.resource_version.unwrap_or_default()))
                    }
                    seen => Err(format!("generation {generation}, observed {seen:?}")),
                }
            }
        })
        .await
    };
    let (before, _) = caught_up().await;

    let dir = tempfile::tempdir().expect("tempdir");
    let resources = format!(
        r#"[[resources]]
api_version = "apps/v1"
kind = "Deployment"
namespaces = ["{ns}"]
ignore_changes = ["metadata.annotations", "status.observedGeneration"]
"#
    );
    let config = write_config(dir.path(), cp, ns, &resources);
    let k = Kubesink::start(BIN, &config, dir.path(), "annotations", &[]);
    synced(&k, &["quiet"]).await;
    let edit = |patch: Value| merge(&client, "apps/v1", "Deployment", ns, "quiet", None, patch);
    let annotated = edit(json!({"metadata": {"annotations": {"team": "blue"}}})).await;
    let (after, observed) = caught_up().await;
    assert_eq!(
        after,
        before + 1,
        "the API server moves a Deployment's generation with its annotations"
    );
    let label = edit(json!({"metadata": {"labels": {"tier": "back"}}})).await;
    let m = sent_at(&k, "quiet", &label).await;
    assert_eq!(
        changed(&m),
        Some(vec!["metadata.labels", "metadata.annotations", "status"]),
        "relative to the last message sent (its status had the older observedGeneration): {m}"
    );
    let all = k.terminate().await;
    let sent: Vec<&Value> = all.iter().filter(|m| m["name"] == "quiet").collect();
    for rv in [&annotated, &observed] {
        assert!(
            !sent.iter().any(|m| m["resourceVersion"] == rv.as_str()),
            "the write at {rv} was sent: {sent:#?}"
        );
    }
    assert_eq!(
        sent.len(),
        2,
        "the initial list and the label edit: {sent:#?}"
    );
}
