//! `[[resources]] enrich` (docs/message-contract.md "Context") on a real kube-apiserver with
//! kube-controller-manager, whose controllers make the owner chains (a Deployment's
//! ReplicaSets and their Pods, a Job's Pods) and write real Events about them:
//! - every Pod message's `owners` equals the chain of controller owners read from the server
//!   at that moment, `ownersComplete: true`, from the first list on (the Pods wait for the
//!   owner kinds' first lists), through a rollout (new ReplicaSet, Pods re-created), the
//!   Deployment's deletion with its ReplicaSet orphaned (the chain shortens), a restart from
//!   saved state and a scale-up after it;
//! - a Pod's `node` is its `spec.nodeName`, its `nodeLabels` its node's chosen labels (a
//!   metadata watch of Nodes), its `namespaceLabels` the chosen labels of its
//!   namespace, and a namespace relabelled sends nothing for its Pods: their next change
//!   carries the new labels;
//! - an Event's `owners` and `node` are its regarding object's: a Pod's chain and node, a
//!   ReplicaSet's Deployment, nothing above a Deployment;

use kubesink_test_support::{self as support, kube_server, process};

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use kube_server::{create, namespace, patch, ControlPlane};
use process::{resource_toml, Kubesink, STDOUT_SINK};
use serde_json::{json, Value};
use support::wait_until;

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "ctx";

/// A chain as the messages write it: `(kind, name, uid)`, nearest owner first.
type Chain = Vec<(String, String, String)>;

/// The configuration: Pods with `owner` and `node`, their owner kinds metadata-only, Events
/// with context, a stdout sink.
fn write_config(dir: &std::path::Path, cp: &ControlPlane) -> std::path::PathBuf {
    let mut rest = String::from(
        "[pipeline]\nlinger = \"20ms\"\nsync_markers = true\n[state]\nbackend = \"file\"\npath = \"state/state\"\ninterval = \"1s\"\n",
    );
    rest.push_str(&resource_toml("v1", "Pod", &[NS]));
    rest.push_str(
        "enrich = [\"owner\", \"node\", \"namespace\"]\nnamespace_labels = [\"team\", \"cost-centre\"]\nnode_labels = [\"topology.kubernetes.io/zone\"]\n",
    );
    rest.push_str(&resource_toml("v1", "Namespace", &[]));
    rest.push_str("payload = \"metadata\"\n");
    rest.push_str(&resource_toml("v1", "Node", &[]));
    rest.push_str("payload = \"metadata\"\n");
    for (api, kind) in [
        ("apps/v1", "ReplicaSet"),
        ("apps/v1", "Deployment"),
        ("batch/v1", "Job"),
    ] {
        rest.push_str(&resource_toml(api, kind, &[NS]));
        rest.push_str("payload = \"metadata\"\n");
    }
    rest.push_str(&resource_toml("events.k8s.io/v1", "Event", &[NS]));
    rest.push_str("mode = \"events\"\nsince = \"all\"\nenrich = [\"owner\", \"node\"]\nnode_labels = [\"topology.kubernetes.io/zone\"]\n");
    rest.push_str(STDOUT_SINK);
    process::write_config(dir, "ctx", &cp.admin_kubeconfig, &rest)
}

/// The chain of controller owners of `ns/name` of `api_version`/`kind`, read from the
/// server owner by owner.
async fn server_chain(client: &kube::Client, ns: &str, kind: &str, name: &str) -> Chain {
    let mut chain = Vec::new();
    let (mut api, mut kind, mut name) = (api_of(kind).to_owned(), kind.to_owned(), name.to_owned());
    loop {
        let obj = kube_server::dynamic(client, &api, &kind, Some(ns))
            .await
            .get(&name)
            .await
            .unwrap_or_else(|e| panic!("get {kind} {name}: {e}"));
        let Some(owner) = obj
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.controller == Some(true))
        else {
            return chain;
        };
        chain.push((owner.kind.clone(), owner.name.clone(), owner.uid.clone()));
        (api, kind, name) = (owner.api_version, owner.kind, owner.name);
    }
}

fn api_of(kind: &str) -> &'static str {
    match kind {
        "Pod" => "v1",
        "Job" => "batch/v1",
        _ => "apps/v1",
    }
}

/// A message's `owners` as a [`Chain`]; `None` without the field.
fn owners(m: &Value) -> Option<Chain> {
    let list = m.get("owners")?.as_array()?;
    Some(
        list.iter()
            .map(|o| {
                let s = |k: &str| o[k].as_str().unwrap_or_default().to_owned();
                (s("kind"), s("name"), s("uid"))
            })
            .collect(),
    )
}

/// The Pods of `ns` on the server: name → uid.
async fn server_pods(client: &kube::Client, ns: &str) -> BTreeMap<String, String> {
    let pods: Api<DynamicObject> = kube_server::dynamic(client, "v1", "Pod", Some(ns)).await;
    pods.list(&ListParams::default())
        .await
        .expect("list Pods")
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.metadata.uid.unwrap_or_default(),
            )
        })
        .collect()
}

/// Every Pod on the server has a message (the last of its uid) whose `owners` equal its
/// chain on the server now, complete.
async fn pods_agree(
    client: &kube::Client,
    ns: &str,
    k: &Kubesink,
    done: &[Value],
) -> Result<usize, String> {
    let msgs: Vec<Value> = done.iter().cloned().chain(k.messages()).collect();
    let pods = server_pods(client, ns).await;
    for (name, uid) in &pods {
        let last = msgs
            .iter()
            .rev()
            .find(|m| m["kind"] == "Pod" && m["uid"] == uid.as_str())
            .ok_or_else(|| format!("no message of Pod {name} yet"))?;
        let want = server_chain(client, ns, "Pod", name).await;
        if owners(last).as_ref() != Some(&want) || last["ownersComplete"] != true {
            return Err(format!(
                "Pod {name}: message owners {:?} complete {}, server {want:?}",
                owners(last),
                last["ownersComplete"]
            ));
        }
    }
    Ok(pods.len())
}

/// Pods of `owner` (by name prefix) on the server.
async fn pods_of(client: &kube::Client, ns: &str, prefix: &str) -> Vec<String> {
    server_pods(client, ns)
        .await
        .into_keys()
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_name_the_owner_chain_and_node_the_server_has() {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    namespace(cp, NS, json!({"team": "a", "other": "x"})).await;
    let client = cp.admin().await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ctx-node",
            "labels": {"topology.kubernetes.io/zone": "zone-a", "other": "x"}}}),
    )
    .await;
    create(&client, kube_server::deployment(NS, "web", 2, "nginx:1")).await;
    let solo = create(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "solo", "namespace": NS},
            "spec": {"nodeName": "ctx-node", "containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "batch", "namespace": NS},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}]}}}}),
    )
    .await;
    wait_until("the controllers' Pods", LONG, || async {
        let (web, batch) = (
            pods_of(&client, NS, "web-").await,
            pods_of(&client, NS, "batch-").await,
        );
        (web.len() == 2 && batch.len() == 1)
            .then_some(())
            .ok_or_else(|| format!("{web:?} {batch:?}"))
    })
    .await;

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("state")).expect("state directory");
    let config = write_config(dir.path(), cp);
    let k = Kubesink::start(BIN, &config, dir.path(), "ctx", &[]);
    wait_until("every resource's first list", LONG, || async {
        let synced = k
            .messages()
            .iter()
            .filter(|m| m["op"] == "synced" && m["initial"] == true)
            .count();
        (synced == 7)
            .then_some(())
            .ok_or_else(|| format!("{synced} synced\n{}", k.stderr()))
    })
    .await;
    // The first list: every Pod's chain whole, though the Pods may list before their owners.
    let n = pods_agree(&client, NS, &k, &[]).await.expect("first list");
    assert_eq!(n, 4);
    let first = k.messages();
    let of = |name: &str| {
        first
            .iter()
            .find(|m| m["kind"] == "Pod" && m["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no message of {name}"))
    };
    assert_eq!(of("solo")["node"], "ctx-node");
    let zone_a = json!({"topology.kubernetes.io/zone": "zone-a"});
    assert_eq!(of("solo")["nodeLabels"], zone_a, "the node's chosen labels");
    for m in first
        .iter()
        .filter(|m| m["kind"] == "Pod" && m["op"] != "synced")
    {
        assert_eq!(m["namespaceLabels"], json!({"team": "a"}), "{m}");
    }
    assert_eq!(owners(&of("solo")), Some(vec![]));
    let web_pod = pods_of(&client, NS, "web-").await.remove(0);
    assert!(
        of(&web_pod).get("node").is_none() && of(&web_pod).get("nodeLabels").is_none(),
        "an unscheduled Pod has no node"
    );
    assert_eq!(owners(&of(&web_pod)).map(|c| c.len()), Some(2));

    // Events: the controllers' (about the Deployment and the ReplicaSet) and two of the
    // test's, about a Deployment's Pod and about the scheduled one.
    let pod_uid = server_pods(&client, NS).await[&web_pod].clone();
    for (name, pod, uid) in [
        ("about-web", web_pod.as_str(), pod_uid.as_str()),
        (
            "about-solo",
            "solo",
            solo.metadata.uid.as_deref().unwrap_or_default(),
        ),
    ] {
        create(
            &client,
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": name, "namespace": NS},
                "eventTime": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
                "reportingController": "example.com/probe", "reportingInstance": "probe-1",
                "action": "Probing", "reason": "Unhealthy", "type": "Warning",
                "regarding": {"kind": "Pod", "namespace": NS, "name": pod, "uid": uid, "apiVersion": "v1"}}),
        )
        .await;
    }
    let event = |name: &str| {
        let name = name.to_owned();
        let k = &k;
        async move {
            wait_until(&format!("Event {name}"), LONG, || async {
                k.messages()
                    .into_iter()
                    .find(|m| m["kind"] == "Event" && m["name"] == name.as_str())
                    .ok_or_else(|| "not yet".to_owned())
            })
            .await
        }
    };
    let about_web = event("about-web").await;
    assert_eq!(
        owners(&about_web),
        Some(server_chain(&client, NS, "Pod", &web_pod).await)
    );
    assert_eq!(about_web["ownersComplete"], true);
    let about_solo = event("about-solo").await;
    assert_eq!(about_solo["node"], "ctx-node");
    assert_eq!(about_solo["nodeLabels"], zone_a);
    assert_eq!(owners(&about_solo), Some(vec![]));
    // The controllers' own Events, by what they regard.
    let deployment_uid = kube_server::dynamic(&client, "apps/v1", "Deployment", Some(NS))
        .await
        .get("web")
        .await
        .expect("Deployment")
        .metadata
        .uid
        .unwrap_or_default();
    wait_until(
        "the controllers' Events with their context",
        LONG,
        || async {
            let msgs = k.messages();
            let about = |kind: &str| {
                msgs.iter()
                    .filter(|m| m["kind"] == "Event" && m["event"]["regarding"]["kind"] == kind)
                    .cloned()
                    .collect::<Vec<_>>()
            };
            let (on_deploy, on_rs) = (about("Deployment"), about("ReplicaSet"));
            if on_deploy.is_empty() || on_rs.is_empty() {
                return Err(format!(
                    "{} about the Deployment, {} about ReplicaSets",
                    on_deploy.len(),
                    on_rs.len()
                ));
            }
            for m in &on_deploy {
                assert_eq!(owners(m), Some(vec![]), "{m}");
                assert_eq!(m["ownersComplete"], true, "{m}");
            }
            for m in &on_rs {
                assert_eq!(
                    owners(m),
                    Some(vec![(
                        "Deployment".into(),
                        "web".into(),
                        deployment_uid.clone()
                    )]),
                    "{m}"
                );
            }
            Ok(())
        },
    )
    .await;

    // The namespace relabelled: nothing is sent for its Pods (a context is read when a
    // message is made), and a Pod's next change carries the new label.
    let pods_sent = |k: &Kubesink| {
        k.messages()
            .iter()
            .filter(|m| m["kind"] == "Pod" && m["op"] != "synced")
            .count()
    };
    patch(
        &client,
        "v1",
        "Namespace",
        None,
        NS,
        json!({"metadata": {"labels": {"team": "b", "cost-centre": "42"}}}),
    )
    .await;
    wait_until("the Namespace's new labels", LONG, || async {
        k.messages()
            .iter()
            .any(|m| m["kind"] == "Namespace" && m["object"]["metadata"]["labels"]["team"] == "b")
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    let before_relabel = pods_sent(&k);
    patch(
        &client,
        "v1",
        "Pod",
        Some(NS),
        "solo",
        json!({"metadata": {"labels": {"seen": "relabelled"}}}),
    )
    .await;
    let solo_now = wait_until("solo's change after the relabel", LONG, || async {
        k.messages()
            .into_iter()
            .find(|m| {
                m["name"] == "solo" && m["object"]["metadata"]["labels"]["seen"] == "relabelled"
            })
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(
        solo_now["namespaceLabels"],
        json!({"team": "b", "cost-centre": "42"})
    );
    assert_eq!(pods_sent(&k), before_relabel + 1, "only solo's own change");

    // A rollout: a new ReplicaSet, the Pods re-created under it.
    patch(
        &client,
        "apps/v1",
        "Deployment",
        Some(NS),
        "web",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}}),
    )
    .await;
    wait_until(
        "the rollout's Pods, their owners as on the server",
        LONG,
        || async {
            let web = pods_of(&client, NS, "web-").await;
            if web.contains(&web_pod) || web.len() != 2 {
                return Err(format!("web Pods {web:?}"));
            }
            pods_agree(&client, NS, &k, &[]).await.map(|_| ())
        },
    )
    .await;

    // The Deployment deleted, its ReplicaSets orphaned (the garbage collector removes their
    // owner reference): a Pod's next change names the ReplicaSet alone.
    kube_server::dynamic(&client, "apps/v1", "Deployment", Some(NS))
        .await
        .delete("web", &DeleteParams::orphan())
        .await
        .expect("delete the Deployment, orphaning");
    let rs = server_chain(&client, NS, "Pod", &pods_of(&client, NS, "web-").await[0]).await[0]
        .1
        .clone();
    wait_until("the ReplicaSet orphaned", LONG, || async {
        let chain = server_chain(&client, NS, "ReplicaSet", &rs).await;
        chain
            .is_empty()
            .then_some(())
            .ok_or_else(|| format!("{chain:?}"))
    })
    .await;
    for p in pods_of(&client, NS, "web-").await {
        patch(
            &client,
            "v1",
            "Pod",
            Some(NS),
            &p,
            json!({"metadata": {"labels": {"seen": "orphaned"}}}),
        )
        .await;
    }
    wait_until(
        "the orphans' Pods, owners as on the server",
        LONG,
        || async {
            let labelled = k
                .messages()
                .iter()
                .filter(|m| {
                    m["kind"] == "Pod" && m["object"]["metadata"]["labels"]["seen"] == "orphaned"
                })
                .count();
            if labelled < 2 {
                return Err(format!("{labelled} labelled"));
            }
            pods_agree(&client, NS, &k, &[]).await.map(|_| ())
        },
    )
    .await;

    // A restart from saved state: a Pod labelled while kubesink was down, then a scale-up.
    let before = k.terminate().await;
    let web = pods_of(&client, NS, "web-").await;
    patch(
        &client,
        "v1",
        "Pod",
        Some(NS),
        &web[0],
        json!({"metadata": {"labels": {"seen": "down"}}}),
    )
    .await;
    let k = Kubesink::start(BIN, &config, dir.path(), "ctx-2", &[]);
    patch(
        &client,
        "apps/v1",
        "ReplicaSet",
        Some(NS),
        &rs,
        json!({"spec": {"replicas": 3}}),
    )
    .await;
    wait_until(
        "after the restart: the down-time change and the new Pod",
        LONG,
        || async {
            let msgs = k.messages();
            let down = msgs
                .iter()
                .find(|m| m["kind"] == "Pod" && m["object"]["metadata"]["labels"]["seen"] == "down")
                .ok_or_else(|| "no message of the down-time label".to_owned())?;
            if owners(down)
                != Some(vec![(
                    "ReplicaSet".into(),
                    rs.clone(),
                    server_chain(&client, NS, "Pod", &web[0]).await[0].2.clone(),
                )])
            {
                return Err(format!("down-time change: {down}"));
            }
            let web_now = pods_of(&client, NS, "web-").await;
            if web_now.len() != 3 {
                return Err(format!("{web_now:?}"));
            }
            pods_agree(&client, NS, &k, &before).await.map(|_| ())
        },
    )
    .await;
    // Nothing unchanged went out again: the second run's Pod messages are the two changes.
    let again: Vec<String> = k
        .messages()
        .iter()
        .filter(|m| m["kind"] == "Pod" && m["op"] != "synced")
        .map(|m| format!("{} {}", m["op"], m["name"]))
        .collect();
    assert_eq!(again.len(), 2, "{again:?}");
    k.terminate().await;
}

/// Through a leader hand-over (SIGTERM) and a leader killed (SIGKILL, the next replica taking
/// over once the Lease expired): each new leader's Pod messages carry whole chains, as the
/// server has them, and the Pods a new leader lists again unchanged are not re-sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_sends_whole_chains() {
    let ns = "ctx-lead";
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    namespace(cp, ns, json!({})).await;
    let client = cp.admin().await;
    create(&client, kube_server::deployment(ns, "web", 2, "nginx:1")).await;
    wait_until("the Deployment's Pods", LONG, || async {
        let web = pods_of(&client, ns, "web-").await;
        (web.len() == 2)
            .then_some(())
            .ok_or_else(|| format!("{web:?}"))
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("state")).expect("state directory");
    let mut rest = format!(
        "{}[pipeline]\nlinger = \"20ms\"\nsync_markers = true\n[state]\nbackend = \"file\"\npath = \"state/state\"\ninterval = \"1s\"\n",
        process::leader_toml("ctx-lease", ns, false)
    );
    rest.push_str(&resource_toml("v1", "Pod", &[ns]));
    rest.push_str("enrich = [\"owner\"]\n");
    for kind in ["ReplicaSet", "Deployment"] {
        rest.push_str(&resource_toml("apps/v1", kind, &[ns]));
        rest.push_str("payload = \"metadata\"\n");
    }
    rest.push_str(STDOUT_SINK);
    let config = process::write_config(dir.path(), "lead", &cp.admin_kubeconfig, &rest);
    let identity = |name: &'static str| [("KUBESINK_LEADER_ELECTION__IDENTITY", name)];
    let scale = |n: i32| {
        let client = client.clone();
        async move {
            patch(
                &client,
                "apps/v1",
                "Deployment",
                Some(ns),
                "web",
                json!({"spec": {"replicas": n}}),
            )
            .await
        }
    };
    let pods_messages = |msgs: &[Value]| {
        msgs.iter()
            .filter(|m| m["kind"] == "Pod" && m["op"] != "synced")
            .count()
    };

    let a = Kubesink::start(BIN, &config, dir.path(), "a", &identity("a"));
    wait_until("a's first lists, whole chains", LONG, || async {
        pods_agree(&client, ns, &a, &[]).await.map(|_| ())
    })
    .await;
    let b = Kubesink::start(BIN, &config, dir.path(), "b", &identity("b"));
    b.wait_following("b follows", LONG).await;
    let a = a.terminate().await;
    scale(3).await;
    wait_until("b leads: the new Pod, its chain whole", LONG, || async {
        if pods_of(&client, ns, "web-").await.len() != 3 {
            return Err("not scaled yet".to_owned());
        }
        pods_agree(&client, ns, &b, &a).await.map(|_| ())
    })
    .await;
    assert_eq!(
        pods_messages(&b.messages()),
        1,
        "b sends the new Pod only: {:#?}",
        b.messages()
    );

    let c = Kubesink::start(BIN, &config, dir.path(), "c", &identity("c"));
    c.wait_following("c follows", LONG).await;
    let b = b.kill().await;
    scale(4).await;
    let before: Vec<Value> = a.iter().chain(b.iter()).cloned().collect();
    wait_until(
        "c leads after the Lease expired: whole chains",
        LONG,
        || async {
            if pods_of(&client, ns, "web-").await.len() != 4 {
                return Err("not scaled yet".to_owned());
            }
            pods_agree(&client, ns, &c, &before).await.map(|_| ())
        },
    )
    .await;
    let from_c: Vec<Value> = c
        .messages()
        .into_iter()
        .filter(|m| m["kind"] == "Pod" && m["op"] != "synced")
        .collect();
    assert!(
        from_c
            .iter()
            .all(|m| m["ownersComplete"] == true && owners(m).is_some_and(|o| o.len() == 2)),
        "{from_c:#?}"
    );
    c.terminate().await;
}

/// Only Pods configured, with `enrich = ["owner", "node", "namespace"]`: the owner index
/// watches the workload controllers', Nodes' and Namespaces' metadata itself, so every Pod's
/// chain is whole (a Deployment's through its ReplicaSet, a StatefulSet's), a bound Pod has
/// its node's and namespace's labels, while the sink receives Pods only; and `kubesink
/// rbac` for that configuration grants those watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_chains_need_no_followed_controllers() {
    const OWN: &str = "ctx-index";
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    namespace(cp, OWN, json!({"team": "idx"})).await;
    let client = cp.admin().await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "idx-node",
            "labels": {"topology.kubernetes.io/zone": "zone-b"}}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bound", "namespace": OWN},
            "spec": {"nodeName": "idx-node", "containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    create(&client, kube_server::deployment(OWN, "api", 2, "nginx:1")).await;
    create(
        &client,
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": OWN},
            "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rest = String::from("[pipeline]\nlinger = \"20ms\"\n");
    rest.push_str(&resource_toml("v1", "Pod", &[OWN]));
    rest.push_str("enrich = [\"owner\", \"node\", \"namespace\"]\nnode_labels = [\"topology.kubernetes.io/zone\"]\nnamespace_labels = [\"team\"]\n");
    rest.push_str(STDOUT_SINK);
    let config = process::write_config(dir.path(), "idx", &cp.admin_kubeconfig, &rest);
    let k = Kubesink::start(BIN, &config, dir.path(), "idx", &[]);
    wait_until("the controllers' Pods, whole chains", LONG, || async {
        let n = pods_agree(&client, OWN, &k, &[]).await?;
        (n == 4)
            .then_some(())
            .ok_or_else(|| format!("{n} Pods\n{}", k.stderr()))
    })
    .await;
    // A rollout while running: the new ReplicaSet reaches the index through its own watch.
    patch(
        &client,
        "apps/v1",
        "Deployment",
        Some(OWN),
        "api",
        json!({"spec": {"template": {"metadata": {"labels": {"rev": "2"}}}}}),
    )
    .await;
    wait_until("the rollout's Pods, whole chains", LONG, || async {
        let rs = kube_server::dynamic(&client, "apps/v1", "ReplicaSet", Some(OWN))
            .await
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        (rs.items.len() == 2)
            .then_some(())
            .ok_or_else(|| "not yet two ReplicaSets".to_owned())?;
        pods_agree(&client, OWN, &k, &[]).await.map(|_| ())
    })
    .await;
    // Nodes' and Namespaces' labels too, from the index's own metadata watches.
    let bound = k
        .messages()
        .into_iter()
        .find(|m| m["kind"] == "Pod" && m["name"] == "bound")
        .expect("the bound Pod's message");
    assert_eq!(
        bound["nodeLabels"],
        json!({"topology.kubernetes.io/zone": "zone-b"}),
        "{bound}"
    );
    assert_eq!(bound["namespaceLabels"], json!({"team": "idx"}), "{bound}");
    let kinds: std::collections::BTreeSet<String> = k
        .messages()
        .iter()
        .filter_map(|m| m["kind"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        vec!["Pod".to_owned()],
        "the index's watches send nothing"
    );
    let rbac = process::clean_command(BIN)
        .args(["--config", config.to_str().unwrap_or_default(), "rbac"])
        .output()
        .await
        .expect("kubesink rbac");
    let rbac = String::from_utf8_lossy(&rbac.stdout);
    for plural in [
        "replicasets",
        "deployments",
        "statefulsets",
        "jobs",
        "cronjobs",
        "nodes",
        "namespaces",
    ] {
        assert!(rbac.contains(plural), "{plural} not granted:\n{rbac}");
    }
    k.terminate().await;
}
