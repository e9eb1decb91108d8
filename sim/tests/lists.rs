//! List semantics over real HTTP: pagination, resourceVersion rules, selectors, metadata-only.

mod support;

use std::collections::HashSet;

use kubesink_sim::{SimConfig, Workload};
use serde_json::json;
use support::*;

#[tokio::test]
async fn pagination_returns_every_object_once_at_the_first_pages_resource_version() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.populate(&Workload {
        pods: 25,
        deployments: 3,
        namespaces: 2,
        ..Workload::default()
    })
    .unwrap();
    let before: HashSet<String> = sim
        .objects("v1", "Pod")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let first = get(addr, "/api/v1/pods?limit=10").await.json();
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(first["metadata"]["remainingItemCount"], 15);
    let mut seen = item_names(&first);
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    // Writes between pages must not show up in later pages.
    sim.churn_steps(20, 7).unwrap();
    loop {
        let page = get(addr, &format!("/api/v1/pods?limit=10&continue={token}"))
            .await
            .json();
        assert_eq!(page["metadata"]["resourceVersion"], rv.as_str());
        seen.extend(item_names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_owned(),
            _ => break,
        }
    }
    assert_eq!(seen.len(), 25, "no duplicates or losses: {seen:?}");
    assert_eq!(seen.iter().cloned().collect::<HashSet<_>>(), before);
    let mut sorted = seen.clone();
    sorted.sort();
    let namespaces: Vec<&str> = sim
        .objects("v1", "Pod")
        .iter()
        .map(|p| {
            if p["metadata"]["namespace"] == "default" {
                "a"
            } else {
                "b"
            }
        })
        .collect();
    assert!(
        namespaces.windows(2).all(|w| w[0] <= w[1]),
        "sorted by namespace first"
    );
}

#[tokio::test]
async fn expired_continue_token_answers_410() {
    let (sim, addr) = start(SimConfig {
        retained_events: 5,
        ..SimConfig::default()
    })
    .await;
    for i in 0..6 {
        sim.create(configmap("default", &format!("c{i}"), json!({})))
            .unwrap();
    }
    let first = get(addr, "/api/v1/configmaps?limit=2").await.json();
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    for i in 0..10 {
        sim.create(configmap("default", &format!("d{i}"), json!({})))
            .unwrap();
    }
    let resp = get(
        addr,
        &format!("/api/v1/configmaps?limit=2&continue={token}"),
    )
    .await;
    assert_eq!(resp.status, 410);
    assert_eq!(resp.json()["reason"], "Expired");
}

#[tokio::test]
async fn resource_version_match_follows_the_api_concepts() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.create(configmap("default", "a", json!({}))).unwrap();
    let rv_after_a = sim.resource_version();
    sim.create(configmap("default", "b", json!({}))).unwrap();
    let current = sim.resource_version();

    let exact = get(addr, &format!("/api/v1/namespaces/default/configmaps?resourceVersion={rv_after_a}&resourceVersionMatch=Exact")).await.json();
    assert_eq!(item_names(&exact), vec!["a"]);
    assert_eq!(exact["metadata"]["resourceVersion"], rv_after_a.to_string());

    let any = get(addr, "/api/v1/configmaps?resourceVersion=0")
        .await
        .json();
    assert_eq!(item_names(&any), vec!["a", "b"]);

    let not_older = get(
        addr,
        &format!(
            "/api/v1/configmaps?resourceVersion={rv_after_a}&resourceVersionMatch=NotOlderThan"
        ),
    )
    .await
    .json();
    assert_eq!(
        not_older["metadata"]["resourceVersion"],
        current.to_string()
    );

    let too_new = get(
        addr,
        &format!("/api/v1/configmaps?resourceVersion={}", current + 5),
    )
    .await;
    assert_eq!(too_new.status, 504);
    assert_eq!(too_new.json()["reason"], "Timeout");
    assert!(too_new.json()["message"]
        .as_str()
        .unwrap()
        .contains("Too large resource version"));

    sim.delete("v1", "ConfigMap", Some("default"), "a").unwrap();
    let exact_before_delete = get(
        addr,
        &format!("/api/v1/configmaps?resourceVersion={current}&resourceVersionMatch=Exact"),
    )
    .await
    .json();
    assert_eq!(item_names(&exact_before_delete), vec!["a", "b"]);
}

#[tokio::test]
async fn exact_list_older_than_the_window_answers_410() {
    let (sim, addr) = start(SimConfig {
        retained_events: 3,
        ..SimConfig::default()
    })
    .await;
    for i in 0..10 {
        sim.create(configmap("default", &format!("c{i}"), json!({})))
            .unwrap();
    }
    let resp = get(
        addr,
        "/api/v1/configmaps?resourceVersion=2&resourceVersionMatch=Exact",
    )
    .await;
    assert_eq!(resp.status, 410);
    assert_eq!(resp.json()["reason"], "Expired");
}

#[tokio::test]
async fn label_selectors_apply_each_operator_on_lists() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.create(configmap(
        "default",
        "a",
        json!({"app": "web", "tier": "front"}),
    ))
    .unwrap();
    sim.create(configmap("default", "b", json!({"app": "api"})))
        .unwrap();
    sim.create(configmap(
        "other",
        "c",
        json!({"app": "db", "tier": "back"}),
    ))
    .unwrap();
    let names = |q: &'static str| async move {
        let resp = get(addr, &format!("/api/v1/configmaps?labelSelector={q}")).await;
        assert_eq!(resp.status, 200, "{q}: {}", resp.body);
        item_names(&resp.json())
    };
    assert_eq!(names("app%3Dweb").await, vec!["a"]);
    assert_eq!(names("app%3D%3Dapi").await, vec!["b"]);
    assert_eq!(names("app!%3Dweb").await, vec!["b", "c"]);
    assert_eq!(names("app%20in%20(web,db)").await, vec!["a", "c"]);
    assert_eq!(names("app%20notin%20(web,db)").await, vec!["b"]);
    assert_eq!(names("tier").await, vec!["a", "c"]);
    assert_eq!(names("!tier").await, vec!["b"]);
    assert_eq!(names("tier,app%20in%20(web,api)").await, vec!["a"]);

    let field = |q: &'static str| async move {
        item_names(
            &get(addr, &format!("/api/v1/configmaps?fieldSelector={q}"))
                .await
                .json(),
        )
    };
    assert_eq!(field("metadata.name%3Db").await, vec!["b"]);
    assert_eq!(field("metadata.namespace%3D%3Dother").await, vec!["c"]);
    assert_eq!(field("metadata.namespace!%3Dother").await, vec!["a", "b"]);

    let bad = get(addr, "/api/v1/configmaps?labelSelector=app%20in%20(web").await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.json()["message"],
        "unable to parse requirement: app in (web",
        "the API server's words, without a prefix of its own"
    );
    let bad_field = get(addr, "/api/v1/configmaps?fieldSelector=spec.x%3D1").await;
    assert_eq!(bad_field.status, 400);
    assert!(bad_field.json()["message"]
        .as_str()
        .unwrap()
        .contains("spec.x"));
}

#[tokio::test]
async fn metadata_only_accept_returns_partial_object_metadata_and_is_recorded() {
    let (sim, addr) = start(SimConfig::default()).await;
    sim.populate(&Workload {
        pods: 3,
        ..Workload::default()
    })
    .unwrap();
    let accept =
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let list = request(addr, "GET", "/api/v1/pods?limit=500", Some(accept), None)
        .await
        .json();
    assert_eq!(list["kind"], "PartialObjectMetadataList");
    assert_eq!(list["apiVersion"], "meta.k8s.io/v1");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0]["kind"], "PartialObjectMetadata");
    assert!(items[0].get("spec").is_none());
    assert!(items[0]["metadata"]["ownerReferences"].is_array());
    let recorded = sim.requests();
    let last = recorded
        .iter()
        .rev()
        .find(|r| r.path_and_query == "/api/v1/pods?limit=500")
        .unwrap();
    assert_eq!(last.accept.as_deref(), Some(accept));
    assert_eq!(last.method, "GET");
}

#[tokio::test]
async fn discovery_lists_builtin_groups_and_unknown_paths_are_404_status() {
    let (_sim, addr) = start(SimConfig::default()).await;
    let version = get(addr, "/version").await.json();
    assert!(version["gitVersion"].as_str().unwrap().starts_with("v1.36"));
    assert_eq!(get(addr, "/api").await.json()["versions"], json!(["v1"]));
    let core = get(addr, "/api/v1").await.json();
    let nodes = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "nodes")
        .unwrap();
    assert_eq!(nodes["namespaced"], false);
    assert_eq!(nodes["kind"], "Node");
    let apps = get(addr, "/apis/apps/v1").await.json();
    assert_eq!(apps["groupVersion"], "apps/v1");
    assert!(apps["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "deployments" && r["shortNames"] == json!(["deploy"])));
    let groups = get(addr, "/apis").await.json();
    assert_eq!(groups["kind"], "APIGroupList");
    let missing = get(addr, "/apis/nope/v1/things").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["kind"], "Status");
    assert_eq!(missing.json()["reason"], "NotFound");
}
