//! On a real kube-apiserver: metadata-only resources read as protobuf `PartialObjectMetadata`
//! (`watch.encoding = "auto"`, `src/informer/protobuf.rs`) are emitted exactly as when read
//! as JSON (`watch.encoding = "json"`): two kubesinks follow the same objects of every kind
//! the tests use (built-in and custom, namespaced and cluster-scoped, objects made by the
//! controllers and by hand with every `ObjectMeta` field set: owner references with and
//! without their flags, finalizers, `generateName`, a deletion timestamp and grace period,
//! labels and annotations with characters JSON escapes), through the initial list (a
//! streaming list, then paged lists) and the watch, and every message they write is the same
//! text byte for byte but for `observedAt`. And the protobuf one did read protobuf: the API
//! server's own count of responses says which encoding it wrote.

use kubesink_test_support::{self as support, kube_server, ports, process};

use std::collections::BTreeMap;
use std::time::Duration;

use kube_server::{create, delete, patch, ControlPlane};
use process::{resource_toml, Kubesink, STDOUT_SINK};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use support::wait_until;

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "wire";

/// The kinds both kubesinks follow, namespaced ones in [`NS`] only.
const KINDS: &[(&str, &str, bool)] = &[
    ("v1", "Namespace", false),
    ("v1", "Node", false),
    ("v1", "ConfigMap", true),
    ("v1", "Secret", true),
    ("v1", "ServiceAccount", true),
    ("v1", "Service", true),
    ("v1", "Pod", true),
    ("apps/v1", "Deployment", true),
    ("apps/v1", "ReplicaSet", true),
    ("kubesink.test/v1", "Widget", true),
];

/// Annotations whose values JSON escapes or that are not ASCII.
fn awkward() -> Value {
    json!({
        "html": "<b>&amp;</b>",
        "quotes": "\"double\" and 'single' and \\ backslash",
        "lines": "one\ntwo\tthree\u{2028}four",
        "unicode": "ünïcödé ✓ 日本",
        "empty": ""
    })
}

/// Both runs' configuration, in `dir`: the same cluster name (so the same keys and ids), the
/// `[watch]` keys `watch`.
fn write_config(dir: &std::path::Path, cp: &ControlPlane, watch: &str) -> std::path::PathBuf {
    let mut resources = String::new();
    for (api, kind, namespaced) in KINDS {
        let ns: &[&str] = if *namespaced { &[NS] } else { &[] };
        resources.push_str(&resource_toml(api, kind, ns));
        resources.push_str("payload = \"metadata\"\npage_size = 3\n");
    }
    let rest = format!(
        "[pipeline]\nlinger = \"20ms\"\nsync_markers = true\n[watch]\n{watch}\n{resources}{STDOUT_SINK}"
    );
    process::write_config(dir, "wire", &cp.admin_kubeconfig, &rest)
}

/// Each message but its sync markers, keyed by what identifies it (`id`), with its fields
/// as written but `observedAt`.
fn by_id(raw: &[String]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for line in raw {
        let fields: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if fields.get("op").is_some_and(|op| op.get() == "\"synced\"") {
            continue;
        }
        let id = fields
            .get("id")
            .map(|v| v.get().to_owned())
            .unwrap_or_else(|| panic!("no id: {line}"));
        let kept = fields
            .into_iter()
            .filter(|(k, _)| k != "observedAt")
            .map(|(k, v)| (k, v.get().to_owned()))
            .collect();
        out.insert(id, kept);
    }
    out
}

/// The initial-list sync markers written so far.
fn synced(k: &Kubesink) -> usize {
    k.messages()
        .iter()
        .filter(|m| m["op"] == "synced" && m["initial"] == true)
        .count()
}

/// A message `op` of `kind` `name` was written by every run.
async fn all_saw(all: &[&Kubesink], kind: &str, name: &str, op: &str) {
    wait_until(
        &format!("{op} {kind} {name} from every run"),
        LONG,
        || async {
            let seen = |k: &Kubesink| {
                k.messages()
                    .iter()
                    .any(|m| m["kind"] == kind && m["name"] == name && m["op"] == op)
            };
            all.iter().all(|k| seen(k)).then_some(()).ok_or_else(|| {
                all.iter()
                    .map(|k| k.stderr())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        },
    )
    .await;
}

/// kubesink's counter of protobuf responses, from its `/metrics`.
async fn protobuf_responses(server: std::net::SocketAddr) -> f64 {
    let (_, metrics) = support::http_get(server, "/metrics").await;
    support::metric_value(&metrics, "kubesink_api_protobuf_responses_total", &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_read_as_protobuf_is_emitted_byte_for_byte_as_read_as_json() {
    let cp = kube_server::shared_async().await;
    let client = cp.admin().await;
    create(&client, support::widget_crd()).await;
    support::widget_crd_established(&client).await;
    kube_server::namespace(cp, NS, json!({"team": "a", "x.y/z": "v-1"})).await;
    // Objects made by hand, every ObjectMeta field the JSON writes set on one of them.
    let owner = create(&client, kube_server::configmap(NS, "owner", json!({}))).await;
    let owner_uid = owner.metadata.uid.clone().unwrap_or_default();
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "rich", "namespace": NS, "labels": {"app": "web", "a.b/c": "x"},
                "annotations": awkward(), "finalizers": ["kubesink.test/hold"],
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid,
                     "controller": true, "blockOwnerDeletion": false},
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "0000-1111"}
                ]},
            "data": {"k": "v"}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"generateName": "gen-", "namespace": NS}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": NS, "annotations": awkward()},
            "stringData": {"password": "hunter22"}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "svc", "namespace": NS},
            "spec": {"ports": [{"port": 80}], "selector": {"app": "web"}}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "wire-node", "labels": {"zone": "z1"}, "annotations": awkward()}}),
    )
    .await;
    create(
        &client,
        json!({"apiVersion": "kubesink.test/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": NS, "annotations": awkward()},
            "spec": {"size": 3}}),
    )
    .await;
    // Made by the controllers: a Deployment's ReplicaSet and Pods (owner references with
    // both flags, generateName, a pod-template-hash label).
    create(&client, kube_server::deployment(NS, "web", 2, "nginx")).await;
    wait_until("the Deployment's Pods", LONG, || async {
        let pods = kube_server::dynamic(&client, "v1", "Pod", Some(NS))
            .await
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        (pods.items.len() == 2)
            .then_some(())
            .ok_or_else(|| format!("{} Pods", pods.items.len()))
    })
    .await;

    // Three runs: JSON, and protobuf twice, once streaming its lists and once reading them in
    // pages (of 3: several pages per kind), so both request shapes are read in protobuf.
    let runs: Vec<(&str, &str)> = vec![
        ("json", "encoding = \"json\""),
        ("stream", "initial_list = \"stream\""),
        ("pages", "initial_list = \"list\""),
    ];
    let mut started = Vec::new();
    for (name, watch) in runs {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = write_config(dir.path(), cp, watch);
        let listen = format!("127.0.0.1:{}", ports::free_port());
        let k = Kubesink::start(
            BIN,
            &config,
            dir.path(),
            name,
            &[("KUBESINK_SERVER__LISTEN", &listen)],
        );
        let addr: std::net::SocketAddr = listen.parse().expect("listen address");
        started.push((name, k, addr, dir));
    }
    let all: Vec<&Kubesink> = started.iter().map(|(_, k, _, _)| k).collect();
    let logs = || {
        started
            .iter()
            .map(|(n, k, _, _)| format!("{n}:\n{}", k.stderr()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    wait_until("every run's initial lists", LONG, || async {
        all.iter()
            .all(|k| synced(k) == KINDS.len())
            .then_some(())
            .ok_or_else(|| {
                let counts: Vec<usize> = all.iter().map(|k| synced(k)).collect();
                format!("synced {counts:?} of {}\n{}", KINDS.len(), logs())
            })
    })
    .await;

    // Through the watch: a label edit, a scale (generation), a delete held by a finalizer
    // (deletionTimestamp, deletionGracePeriodSeconds), the finalizer's removal (the DELETED),
    // a new object, a Secret's delete.
    patch(
        &client,
        "v1",
        "ConfigMap",
        Some(NS),
        "rich",
        json!({"metadata": {"labels": {"tier": "front"}}}),
    )
    .await;
    // Each step on `rich` waits for its message in every run: a sink's queue coalesces a key's
    // changes that arrive while it still holds one (`changed` is then the union), so a step
    // taken before the last was written may fold into it in one run and not in another.
    wait_until("rich's new label in every run", LONG, || async {
        let labelled = |k: &Kubesink| {
            k.messages().iter().any(|m| {
                m["name"] == "rich" && m["object"]["metadata"]["labels"]["tier"] == "front"
            })
        };
        all.iter()
            .all(|k| labelled(k))
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    patch(
        &client,
        "apps/v1",
        "Deployment",
        Some(NS),
        "web",
        json!({"spec": {"replicas": 3}}),
    )
    .await;
    delete(&client, "v1", "ConfigMap", Some(NS), "rich").await;
    all_saw(&all, "ConfigMap", "rich", "updated").await;
    wait_until("rich's deletionTimestamp in every run", LONG, || async {
        let marked = |k: &Kubesink| {
            k.messages().iter().any(|m| {
                m["name"] == "rich" && m["object"]["metadata"]["deletionTimestamp"].is_string()
            })
        };
        all.iter()
            .all(|k| marked(k))
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    patch(
        &client,
        "v1",
        "ConfigMap",
        Some(NS),
        "rich",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    create(
        &client,
        kube_server::configmap(NS, "late", json!({"a": "b"})),
    )
    .await;
    delete(&client, "v1", "Secret", Some(NS), "s").await;
    patch(
        &client,
        "kubesink.test/v1",
        "Widget",
        Some(NS),
        "w",
        json!({"metadata": {"labels": {"size": "4"}}}),
    )
    .await;
    all_saw(&all, "ConfigMap", "rich", "deleted").await;
    all_saw(&all, "ConfigMap", "late", "added").await;
    all_saw(&all, "Secret", "s", "deleted").await;
    all_saw(&all, "Widget", "w", "updated").await;
    wait_until("a third Pod in every run", LONG, || async {
        let pods = |k: &Kubesink| {
            k.messages()
                .iter()
                .filter(|m| m["kind"] == "Pod" && m["op"] == "added")
                .count()
        };
        let counts: Vec<usize> = all.iter().map(|k| pods(k)).collect();
        counts
            .iter()
            .all(|n| *n >= 3)
            .then_some(())
            .ok_or_else(|| format!("{counts:?}"))
    })
    .await;

    // The controllers may still be writing (the ReplicaSet's status): compare once every run
    // wrote the same messages, which they do when nothing differs.
    let compared = support::try_wait_until(Duration::from_secs(60), || async {
        let json = by_id(&all[0].raw_messages());
        for (i, k) in all.iter().enumerate().skip(1) {
            let other = by_id(&k.raw_messages());
            if other != json {
                return Err(format!(
                    "{}: {}",
                    started[i].0,
                    first_difference(&json, &other)
                ));
            }
        }
        Ok(json)
    })
    .await;
    let messages = match compared {
        Ok(m) => m,
        Err(diff) => panic!(
            "a protobuf run's messages differ from the JSON run's:\n{diff}\n{}",
            logs()
        ),
    };
    let kinds: std::collections::BTreeSet<String> = messages
        .values()
        .filter_map(|m| m.get("kind").map(|k| k.trim_matches('"').to_owned()))
        .collect();
    for (_, kind, _) in KINDS {
        assert!(
            kinds.contains(*kind),
            "no {kind} message compared: {kinds:?}"
        );
    }
    let awkward_compared = messages
        .values()
        .any(|m| m.get("object").is_some_and(|o| o.contains("ünïcödé")));
    assert!(awkward_compared, "no awkward annotation compared");
    let deleting = messages.values().any(|m| {
        m.get("object")
            .is_some_and(|o| o.contains("deletionGracePeriodSeconds"))
    });
    assert!(deleting, "no deletion grace period compared");
    eprintln!(
        "{} messages of {} kinds equal byte for byte in {} runs",
        messages.len(),
        kinds.len(),
        all.len()
    );

    // The JSON run asked for JSON only; the others got protobuf for every list and watch.
    for (name, _, addr, _) in &started {
        let protobuf = protobuf_responses(*addr).await;
        eprintln!("{name}: {protobuf} protobuf responses");
        if *name == "json" {
            assert_eq!(protobuf, 0.0, "the JSON run read protobuf");
        } else {
            assert!(
                protobuf >= KINDS.len() as f64,
                "{name}: {protobuf} protobuf responses"
            );
        }
    }
    for (_, k, _, _) in started {
        k.terminate().await;
    }
}

/// The first message that differs, in words.
fn first_difference(
    j: &BTreeMap<String, BTreeMap<String, String>>,
    a: &BTreeMap<String, BTreeMap<String, String>>,
) -> String {
    for (id, m) in j {
        match a.get(id) {
            None => return format!("only the JSON run wrote {m:?}"),
            Some(other) if other != m => {
                return format!("json wrote {m:?}\nprotobuf wrote {other:?}");
            }
            _ => {}
        }
    }
    for (id, m) in a {
        if !j.contains_key(id) {
            return format!("only the protobuf run wrote {m:?}");
        }
    }
    "equal".to_owned()
}
