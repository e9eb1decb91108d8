//! Writes, CustomResourceDefinitions, fixture conformance and the workload generator.

mod support;

use kubesink_sim::{ApiError, SimConfig, Simulator, Workload};
use serde_json::{json, Value};
use support::*;

#[tokio::test]
async fn create_replace_and_delete_follow_optimistic_concurrency() {
    let (sim, addr) = start(SimConfig::default()).await;
    let body = configmap("default", "cm", json!({"a": "b"})).to_string();
    let created = request(
        addr,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        None,
        Some(&body),
    )
    .await;
    assert_eq!(created.status, 201);
    let created = created.json();
    assert_eq!(created["metadata"]["generation"], 1);
    assert_eq!(created["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(created["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    let dup = request(
        addr,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        None,
        Some(&body),
    )
    .await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.json()["reason"], "AlreadyExists");

    let mut update = created.clone();
    update["data"] = json!({"k": "new"});
    let put = request(
        addr,
        "PUT",
        "/api/v1/namespaces/default/configmaps/cm",
        None,
        Some(&update.to_string()),
    )
    .await;
    assert_eq!(put.status, 200);
    assert_ne!(
        put.json()["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );

    let stale = request(
        addr,
        "PUT",
        "/api/v1/namespaces/default/configmaps/cm",
        None,
        Some(&update.to_string()),
    )
    .await;
    assert_eq!(stale.status, 409);
    let status = stale.json();
    assert_eq!(status["reason"], "Conflict");
    assert!(status["message"].as_str().unwrap().contains("the object has been modified; please apply your changes to the latest version and try again"));
    assert_eq!(status["details"]["name"], "cm");

    let mut unconditional = update.clone();
    unconditional["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    assert_eq!(
        request(
            addr,
            "PUT",
            "/api/v1/namespaces/default/configmaps/cm",
            None,
            Some(&unconditional.to_string())
        )
        .await
        .status,
        200
    );

    let deleted = request(
        addr,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/cm",
        None,
        None,
    )
    .await;
    assert_eq!(deleted.status, 200);
    assert_eq!(deleted.json()["metadata"]["name"], "cm");
    let again = request(
        addr,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/cm",
        None,
        None,
    )
    .await;
    assert_eq!(again.status, 404);
    assert_eq!(again.json()["message"], "configmaps \"cm\" not found");
    assert_eq!(
        get(addr, "/api/v1/namespaces/default/configmaps/cm")
            .await
            .status,
        404
    );
    let _ = sim;
}

#[test]
fn library_writes_report_api_errors_with_status_codes() {
    let sim = Simulator::new(SimConfig::default());
    sim.create(configmap("default", "x", json!({}))).unwrap();
    let err = sim
        .create(configmap("default", "x", json!({})))
        .unwrap_err();
    assert!(matches!(err, ApiError::AlreadyExists { .. }));
    assert_eq!(err.status_code(), 409);
    let err = sim
        .delete("v1", "ConfigMap", Some("default"), "nope")
        .unwrap_err();
    assert_eq!(err.status_code(), 404);
    let mut stale = sim.objects("v1", "ConfigMap")[0].clone();
    stale["metadata"]["resourceVersion"] = json!("999");
    assert_eq!(sim.replace(stale).unwrap_err().status_code(), 409);
    let mut spec_change = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "default"}, "spec": {"replicas": 1}});
    sim.create(spec_change.clone()).unwrap();
    spec_change["spec"]["replicas"] = json!(2);
    assert_eq!(
        sim.replace(spec_change.clone()).unwrap()["metadata"]["generation"],
        2
    );
    spec_change["status"] = json!({"replicas": 2});
    assert_eq!(
        sim.replace(spec_change).unwrap()["metadata"]["generation"],
        2,
        "status-only update keeps generation"
    );
}

/// Compares the identifying fields of two objects (not uids, versions or timestamps).
fn same_identity(actual: &Value, recorded: &Value) {
    for pointer in [
        "/kind",
        "/apiVersion",
        "/metadata/name",
        "/metadata/namespace",
        "/spec",
        "/status/status",
        "/reason",
        "/code",
    ] {
        assert_eq!(
            actual.pointer(pointer),
            recorded.pointer(pointer),
            "{pointer}: {actual} vs {recorded}"
        );
    }
}

#[tokio::test]
async fn replays_the_recorded_custom_resource_definition_exchanges() {
    let (sim, addr) = start(SimConfig::default()).await;
    let exchanges = fixture("custom_resource_definition-test.json");
    for ex in exchanges.as_array().unwrap() {
        let url = ex["request_url"].as_str().unwrap();
        let method = ex["request_method"].as_str().unwrap();
        let body = ex["request_body"].as_str().filter(|b| !b.is_empty());
        let expected_status = ex["response_status_code"].as_u64().unwrap() as u16;
        let recorded_body = ex["response_body"].as_str().unwrap();
        if url.contains("watch=true") {
            let mut w = watch(addr, url, None).await;
            let recorded: Vec<Value> = recorded_body
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let got = w
                .take(recorded.len(), std::time::Duration::from_secs(5))
                .await;
            assert_eq!(got.len(), recorded.len());
            for (g, r) in got.iter().zip(&recorded) {
                assert_eq!(g["type"], r["type"]);
                same_identity(&g["object"], &r["object"]);
            }
            continue;
        }
        let resp = request(addr, method, url, None, body).await;
        assert_eq!(
            resp.status, expected_status,
            "{method} {url}: {}",
            resp.body
        );
        let recorded: Value = serde_json::from_str(recorded_body).unwrap();
        let actual = resp.json();
        if recorded["kind"] == "CustomResourceDefinition" {
            assert_eq!(actual["metadata"]["name"], recorded["metadata"]["name"]);
            assert_eq!(actual["spec"]["names"], recorded["spec"]["names"]);
        } else if recorded["items"].is_array() {
            assert_eq!(item_names(&actual), item_names(&recorded));
            for (a, r) in actual["items"]
                .as_array()
                .unwrap()
                .iter()
                .zip(recorded["items"].as_array().unwrap())
            {
                same_identity(a, r);
            }
        } else if recorded["kind"] == "Status" {
            same_identity(&actual, &recorded);
            assert_eq!(actual["details"]["name"], recorded["details"]["name"]);
            assert_eq!(actual["details"]["kind"], recorded["details"]["kind"]);
            if recorded["status"] == "Failure" {
                assert_eq!(actual["message"], recorded["message"]);
                assert_eq!(actual["details"]["causes"], recorded["details"]["causes"]);
            }
        } else {
            same_identity(&actual, &recorded);
        }
    }
    // The CRD is gone: its resource is no longer served.
    assert_eq!(
        get(
            addr,
            "/apis/k8s-openapi-tests-custom-resource-definition.com/v1/namespaces/default/foobars"
        )
        .await
        .status,
        404
    );
    let _ = sim;
}

#[tokio::test]
async fn serves_the_recorded_pod_and_deployment_lists_after_loading_their_items() {
    let (sim, addr) = start(SimConfig::default()).await;
    for (file, api_version, kind) in [
        ("pod-list.json", "v1", "Pod"),
        ("deployment-list.json", "apps/v1", "Deployment"),
    ] {
        let ex = &fixture(file)[0];
        let recorded: Value = serde_json::from_str(ex["response_body"].as_str().unwrap()).unwrap();
        for item in recorded["items"].as_array().unwrap() {
            let mut obj = item.clone();
            obj["apiVersion"] = json!(api_version);
            obj["kind"] = json!(kind);
            sim.create(obj).unwrap();
        }
        let resp = get(addr, ex["request_url"].as_str().unwrap()).await;
        assert_eq!(
            resp.status,
            ex["response_status_code"].as_u64().unwrap() as u16
        );
        let actual = resp.json();
        assert_eq!(actual["kind"], recorded["kind"]);
        assert_eq!(actual["apiVersion"], recorded["apiVersion"]);
        assert_eq!(item_names(&actual), item_names(&recorded));
        for (a, r) in actual["items"]
            .as_array()
            .unwrap()
            .iter()
            .zip(recorded["items"].as_array().unwrap())
        {
            assert_eq!(a["spec"], r["spec"]);
            assert_eq!(a["status"], r["status"]);
            assert_eq!(
                a["metadata"]["managedFields"],
                r["metadata"]["managedFields"]
            );
            assert_eq!(
                a["metadata"]["ownerReferences"],
                r["metadata"]["ownerReferences"]
            );
        }
    }
}

#[tokio::test]
async fn re_serves_recorded_watch_objects_with_send_initial_events() {
    let (sim, addr) = start(SimConfig::default()).await;
    let ex = &fixture("watch_event-watch_pods_without_initial_events.json")[0];
    let recorded: Vec<Value> = ex["response_body"]
        .as_str()
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for ev in recorded.iter().filter(|e| e["type"] == "ADDED") {
        sim.create(ev["object"].clone()).unwrap();
    }
    let mut w = watch(addr, ex["request_url"].as_str().unwrap(), None).await;
    let got = w
        .take(recorded.len(), std::time::Duration::from_secs(5))
        .await;
    let types = |evs: &[Value]| {
        evs.iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(types(&got), types(&recorded));
    let last = got.last().unwrap();
    assert_eq!(
        last["object"]["metadata"]["annotations"],
        recorded.last().unwrap()["object"]["metadata"]["annotations"]
    );
    for (g, r) in got
        .iter()
        .zip(&recorded)
        .filter(|(g, _)| g["type"] == "ADDED")
    {
        same_identity(&g["object"], &r["object"]);
    }
}

#[test]
fn workload_is_deterministic_under_a_seed_with_realistic_pods() {
    let names = |seed: u64| {
        let sim = Simulator::new(SimConfig::default());
        let w = Workload {
            namespaces: 3,
            pods: 30,
            deployments: 4,
            nodes: 2,
            services: 2,
            configmaps: 2,
            foobars: 2,
            seed,
        };
        sim.populate(&w).unwrap();
        let stats = sim.churn_steps(40, seed).unwrap();
        let pods = sim.objects("v1", "Pod");
        (
            sim,
            pods.iter()
                .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>(),
            stats,
        )
    };
    let (sim, a, stats_a) = names(42);
    let (_, b, stats_b) = names(42);
    let (_, c, _) = names(43);
    assert_eq!(a, b);
    assert_eq!(stats_a, stats_b);
    assert_ne!(a, c);
    assert_eq!(stats_a.total(), 40);
    assert!(
        a.len().abs_diff(30) <= 6,
        "population roughly stable: {}",
        a.len()
    );

    let pods = sim.objects("v1", "Pod");
    let rs_names: Vec<String> = sim
        .objects("apps/v1", "ReplicaSet")
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(rs_names.len(), 4);
    for pod in &pods {
        let size = serde_json::to_vec(pod).unwrap().len();
        assert!((7_000..=9_500).contains(&size), "pod size {size}");
        let owner = pod["metadata"]["ownerReferences"][0]["name"]
            .as_str()
            .unwrap();
        assert!(rs_names.iter().any(|r| r == owner), "owner {owner} exists");
        assert!(pod["spec"]["nodeName"]
            .as_str()
            .unwrap()
            .starts_with("node-"));
        assert!(pod["metadata"]["managedFields"].is_array());
    }
    assert_eq!(sim.objects("v1", "Node").len(), 2);
    assert_eq!(
        sim.objects(
            "k8s-openapi-tests-custom-resource-definition.com/v1",
            "FooBar"
        )
        .len(),
        2
    );
    assert_eq!(sim.objects("v1", "Namespace").len(), 3);
}

#[tokio::test]
async fn spawned_churn_writes_at_its_rate_and_stops_on_drop() {
    let sim = Simulator::new(SimConfig::default());
    sim.populate(&Workload {
        pods: 20,
        ..Workload::default()
    })
    .unwrap();
    let start_rv = sim.resource_version();
    let handle = sim.spawn_churn(kubesink_sim::Churn {
        rate_per_sec: 500.0,
        seed: 3,
    });
    wait_for("churn writes", std::time::Duration::from_secs(10), || {
        sim.resource_version() >= start_rv + 50
    })
    .await;
    assert!(handle.stats().total() > 0);
    drop(handle);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let stopped_at = sim.resource_version();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        sim.resource_version(),
        stopped_at,
        "no writes after the handle is dropped"
    );
}

#[tokio::test]
async fn shutdown_ends_open_watches() {
    let (sim, addr) = start(SimConfig::default()).await;
    let mut w = watch(addr, "/api/v1/pods?watch=true", None).await;
    wait_for("watch open", std::time::Duration::from_secs(5), || {
        sim.open_watches() == 1
    })
    .await;
    sim.shutdown();
    assert!(w.ends_within(std::time::Duration::from_secs(5)).await);
}
