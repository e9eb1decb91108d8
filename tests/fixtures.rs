//! Conformance with real API-server recordings (Kubernetes 1.36, vendored in `tests/fixtures/k8s-replays`,
//! and the release the real-server tests build, recorded by `scripts/record-replays.sh`):
//! every recorded list item and watch event decodes and is emitted faithfully, both from the
//! raw recorded bytes and after being served again by the simulator over HTTP.

use kubesink_test_support as support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kubesink::bridge::Bridge;
use kubesink::config::ResourceConfig;
use kubesink::testing::{RawObject, Shaper};
use kubesink_core::message::{encode, fixtures, Change};
use kubesink_core::Resource;
use kubesink_core::{Op, Sink};
use kubesink_sim::SimConfig;
use serde_json::Value;
use support::*;

/// The recorded releases: `v1-36` (k8s-openapi's recordings), `v1-37` (recorded from the
/// real-server tests' kube-apiserver by `scripts/record-replays.sh`).
const RELEASES: [&str; 2] = ["v1-36", "v1-37"];

/// `RELEASE/FILE` of every recording of [`RECORDINGS`] that exists.
fn recordings() -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k8s-replays");
    let out: Vec<String> = RELEASES
        .iter()
        .flat_map(|r| RECORDINGS.iter().map(move |f| format!("{r}/{f}")))
        .filter(|p| root.join(p).is_file())
        .collect();
    for r in RELEASES {
        assert!(
            out.iter().any(|p| p.starts_with(r)),
            "no recording of {r} in {}",
            root.display()
        );
    }
    out
}

fn fixture(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/k8s-replays")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Every object in a recording: list items, and watch event objects (BOOKMARK excluded).
fn recorded_objects(name: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for ex in fixture(name) {
        if ex["request_method"] != "GET" || ex["response_status_code"] != 200 {
            continue;
        }
        let body = ex["response_body"].as_str().unwrap();
        if ex["request_url"].as_str().unwrap().contains("watch=true") {
            for line in body.lines().filter(|l| !l.trim().is_empty()) {
                let ev: Value = serde_json::from_str(line).unwrap();
                let t = ev["type"].as_str().unwrap().to_owned();
                if t != "BOOKMARK" {
                    out.push((t, ev["object"].clone()));
                }
            }
        } else {
            let list: Value = serde_json::from_str(body).unwrap();
            if let Some(items) = list["items"].as_array() {
                let (api, kind) = (
                    list["apiVersion"].clone(),
                    list["kind"]
                        .as_str()
                        .unwrap_or("")
                        .trim_end_matches("List")
                        .to_owned(),
                );
                for mut it in items.iter().cloned() {
                    it["apiVersion"] = api.clone();
                    it["kind"] = Value::String(kind.clone());
                    out.push(("LIST".to_owned(), it));
                }
            }
        }
    }
    out
}

const RECORDINGS: [&str; 5] = [
    "pod-list.json",
    "deployment-list.json",
    "watch_event-watch_pods.json",
    "watch_event-watch_pods_without_initial_events.json",
    "custom_resource_definition-test.json",
];

#[test]
fn every_recorded_object_decodes_and_encodes_to_a_schema_valid_message() {
    let validator = schema();
    let mut n = 0;
    for rec in recordings() {
        let rec = rec.as_str();
        let objects = recorded_objects(rec);
        assert!(!objects.is_empty(), "{rec}: no objects found");
        for (event, obj) in objects {
            let api_version = obj["apiVersion"].as_str().unwrap().to_owned();
            let kind_name = obj["kind"].as_str().unwrap().to_owned();
            // Decoded from the recorded text, as the informer decodes a list item or event.
            let text = obj.to_string();
            let raw = RawObject::parse(&text).unwrap_or_else(|e| panic!("{rec}: {e}"));
            let result = Shaper::new(
                &ResourceConfig::new(&api_version, &kind_name),
                "kubesink.io/cluster",
                "rec",
            )
            .shape(&raw)
            .unwrap_or_else(|e| panic!("{rec}: {e}"));
            let shaped = result.object.to_value();
            // Faithful: everything but managedFields survives, the label is added.
            let mut expect = obj.clone();
            expect["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("managedFields");
            expect["metadata"]["labels"]["kubesink.io/cluster"] = Value::from("rec");
            assert_eq!(shaped, expect, "{rec}: {event} {}", obj["metadata"]["name"]);
            let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
            let plural = format!("{}s", kind_name.to_lowercase());
            let resource = Arc::new(Resource::new(
                "rec", group, version, &kind_name, &plural, true,
            ));
            let m = &shaped["metadata"];
            let op = if event == "DELETED" {
                Op::Deleted
            } else {
                Op::Added
            };
            let (ns, name) = (m["namespace"].as_str(), m["name"].as_str().unwrap());
            let change = Change {
                uid: m["uid"].as_str().unwrap().to_owned(),
                resource_version: m["resourceVersion"].as_str().unwrap().to_owned(),
                initial: event == "LIST",
                ..fixtures::change(op, ns, name, Some(result.object.clone()))
            };
            let msg = encode(&resource, &change, "2026-06-15T04:16:00.000Z").unwrap();
            let v: Value = serde_json::from_slice(&msg.payload).unwrap();
            assert_schema_valid(&validator, std::slice::from_ref(&v));
            assert_ne!(result.fingerprint, 0);
            n += 1;
        }
    }
    assert!(n >= 20, "only {n} recorded objects found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_pods_served_by_the_simulator_are_emitted_with_their_recorded_content() {
    let c = cluster(SimConfig::default()).await;
    let mut want = std::collections::BTreeMap::new();
    let recs = RELEASES.iter().flat_map(|r| {
        [
            format!("{r}/pod-list.json"),
            format!("{r}/watch_event-watch_pods_without_initial_events.json"),
        ]
    });
    for rec in recs {
        let rec = rec.as_str();
        for (_, mut obj) in recorded_objects(rec) {
            let meta = obj["metadata"].as_object_mut().unwrap();
            for server_set in ["uid", "resourceVersion", "creationTimestamp", "generation"] {
                meta.remove(server_set);
            }
            let name = (
                meta["namespace"].as_str().unwrap_or_default().to_owned(),
                meta["name"].as_str().unwrap().to_owned(),
            );
            if want.contains_key(&name) {
                continue;
            }
            c.sim
                .create(obj.clone())
                .unwrap_or_else(|e| panic!("{rec} {name:?}: {e}"));
            want.insert(name, obj);
        }
    }
    let cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "Pod")]);
    let sink = CaptureSink::new();
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    let sinks: Vec<Arc<dyn Sink>> = vec![sink.clone()];
    let bridge = Bridge::start(&plan(&cfg), client, sinks).await.unwrap();
    wait_for("every recorded pod", Duration::from_secs(60), || {
        sink.len() >= want.len()
    })
    .await;
    assert!(bridge.informer_stats()[0].1.received() >= want.len() as u64);
    bridge.shutdown().await;
    let msgs = sink.messages();
    assert_eq!(msgs.len(), want.len());
    for m in &msgs {
        let key = (
            m["namespace"].as_str().unwrap_or_default().to_owned(),
            m["name"].as_str().unwrap().to_owned(),
        );
        let rec = &want[&key];
        assert_eq!(m["object"]["spec"], rec["spec"], "{}", m["name"]);
        assert_eq!(m["object"]["status"], rec["status"], "{}", m["name"]);
        assert_eq!(
            m["object"]["metadata"]["ownerReferences"],
            rec["metadata"]["ownerReferences"]
        );
        assert!(m["object"]["metadata"]["managedFields"].is_null());
    }
    assert_schema_valid(&schema(), &msgs);
}
