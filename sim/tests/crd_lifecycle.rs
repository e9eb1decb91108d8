//! CustomResourceDefinition removal and return over real HTTP and with a kube-rs watcher:
//! objects go, discovery and paths answer 404, open watches end after the DELETED events (or
//! stay open and silent with the server-bug fault), and a recreated CRD serves anew.

mod support;

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kubesink_sim::workload::{foobar_crd, FOOBAR_API_VERSION};
use kubesink_sim::{SimConfig, Simulator};
use serde_json::{json, Value};
use support::*;

const T: Duration = Duration::from_secs(10);
const GROUP: &str = "k8s-openapi-tests-custom-resource-definition.com";
const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const CRD_NAME: &str = "foobars.k8s-openapi-tests-custom-resource-definition.com";
const FOOBARS: &str =
    "/apis/k8s-openapi-tests-custom-resource-definition.com/v1/namespaces/default/foobars";

fn foobar(name: &str) -> Value {
    json!({
        "apiVersion": FOOBAR_API_VERSION, "kind": "FooBar",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"prop1": "v", "prop2": [true], "prop4": 1, "prop5": "x"}
    })
}

async fn create_crd(addr: std::net::SocketAddr) {
    let crd = foobar_crd().unwrap().to_string();
    let resp = request(addr, "POST", CRD_PATH, None, Some(&crd)).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
}

async fn delete_crd(addr: std::net::SocketAddr) {
    let resp = request(
        addr,
        "DELETE",
        &format!("{CRD_PATH}/{CRD_NAME}"),
        None,
        None,
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
}

async fn with_two_foobars() -> (Simulator, std::net::SocketAddr) {
    let (sim, addr) = start(SimConfig::default()).await;
    create_crd(addr).await;
    for name in ["fb1", "fb2"] {
        let resp = request(addr, "POST", FOOBARS, None, Some(&foobar(name).to_string())).await;
        assert_eq!(resp.status, 201, "{}", resp.body);
    }
    (sim, addr)
}

#[tokio::test]
async fn deleting_a_crd_removes_its_objects_discovery_and_paths_and_ends_its_watches() {
    let (sim, addr) = with_two_foobars().await;
    let rv = sim.resource_version();
    let mut w = watch(
        addr,
        &format!("{FOOBARS}?watch=true&resourceVersion={rv}"),
        None,
    )
    .await;
    let mut pods = watch(addr, "/api/v1/pods?watch=true", None).await;
    wait_for("watches open", T, || sim.open_watches() == 2).await;

    delete_crd(addr).await;
    let deleted = w.take(2, T).await;
    let names: Vec<&str> = deleted
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "DELETED");
            e["object"]["metadata"]["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(names, ["fb1", "fb2"]);
    assert!(
        w.ends_within(T).await,
        "the watch ends after the DELETED events"
    );
    assert!(
        pods.silent_for(Duration::from_millis(200)).await,
        "other watches go on"
    );
    assert!(sim.objects(FOOBAR_API_VERSION, "FooBar").is_empty());

    assert_eq!(get(addr, &format!("/apis/{GROUP}/v1")).await.status, 404);
    assert_eq!(get(addr, &format!("/apis/{GROUP}")).await.status, 404);
    let groups = get(addr, "/apis").await.json();
    assert!(!groups.to_string().contains(GROUP));
    let list = get(addr, FOOBARS).await;
    assert_eq!(
        (list.status, list.json()["reason"].as_str()),
        (404, Some("NotFound"))
    );
    assert_eq!(
        get(addr, &format!("{FOOBARS}?watch=true")).await.status,
        404
    );
    assert_eq!(get(addr, &format!("{FOOBARS}/fb1")).await.status, 404);

    // Recreated: served again, empty; older versions are not readable for it.
    create_crd(addr).await;
    let empty = get(addr, FOOBARS).await.json();
    assert_eq!(item_names(&empty), Vec::<String>::new());
    let mut old = watch(
        addr,
        &format!("{FOOBARS}?watch=true&resourceVersion={rv}"),
        None,
    )
    .await;
    let gone = old.next(T).await.unwrap();
    assert_eq!(
        (gone["type"].as_str(), gone["object"]["code"].as_u64()),
        (Some("ERROR"), Some(410))
    );
    let resp = request(
        addr,
        "POST",
        FOOBARS,
        None,
        Some(&foobar("fb3").to_string()),
    )
    .await;
    assert_eq!(resp.status, 201);
    assert_eq!(item_names(&get(addr, FOOBARS).await.json()), ["fb3"]);
}

#[tokio::test]
async fn with_the_server_bug_fault_watches_of_a_deleted_crd_stay_open_and_silent() {
    let (sim, addr) = with_two_foobars().await;
    let rv = sim.resource_version();
    let resp = request(
        addr,
        "POST",
        "/_sim/keep-watches-after-crd-delete?on=true",
        None,
        None,
    )
    .await;
    assert_eq!(resp.status, 200);
    let mut w = watch(
        addr,
        &format!("{FOOBARS}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"),
        None,
    )
    .await;
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    delete_crd(addr).await;
    assert_eq!(w.take(2, T).await.len(), 2, "the DELETED events still come");
    assert!(
        w.silent_for(Duration::from_millis(1500)).await,
        "then nothing, not even bookmarks"
    );
    assert_eq!(sim.open_watches(), 1);
    create_crd(addr).await;
    request(
        addr,
        "POST",
        FOOBARS,
        None,
        Some(&foobar("fb3").to_string()),
    )
    .await;
    assert!(
        w.silent_for(Duration::from_millis(300)).await,
        "blind to the new incarnation"
    );
}

#[tokio::test]
async fn a_kube_watcher_sees_the_deletes_then_the_recreated_resources_objects() {
    let (sim, addr) = with_two_foobars().await;
    let client = kube_client(&sim).await;
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", "FooBar"), "foobars");
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item.map_err(|e| e.to_string())).is_err() {
                return;
            }
        }
    });
    let name = |o: &DynamicObject| o.metadata.name.clone().unwrap_or_default();
    let mut initial = Vec::new();
    loop {
        match next(&mut rx).await {
            Ok(Event::InitApply(o)) => initial.push(name(&o)),
            Ok(Event::InitDone) => break,
            _ => {}
        }
    }
    assert_eq!(initial, ["fb1", "fb2"]);
    wait_for("watch open", T, || sim.open_watches() == 1).await;

    delete_crd(addr).await;
    let mut deleted = Vec::new();
    while deleted.len() < 2 {
        if let Ok(Event::Delete(o)) = next(&mut rx).await {
            deleted.push(name(&o));
        }
    }
    assert_eq!(deleted, ["fb1", "fb2"]);
    let err = next(&mut rx)
        .await
        .expect_err("the re-watch or relist meets a 404");
    assert!(
        err.contains("404") || err.contains("NotFound") || err.contains("not find"),
        "{err}"
    );

    create_crd(addr).await;
    request(
        addr,
        "POST",
        FOOBARS,
        None,
        Some(&foobar("fb3").to_string()),
    )
    .await;
    loop {
        match next(&mut rx).await {
            Ok(Event::InitApply(o)) | Ok(Event::Apply(o)) if name(&o) == "fb3" => break,
            _ => {}
        }
    }
}

type Item = Result<Event<DynamicObject>, String>;

async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Item>) -> Item {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("watcher item in time")
        .expect("stream open")
}
