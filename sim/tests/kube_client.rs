//! Fidelity checks with the real kube-rs 5 client: kubeconfig, watcher (paged and streaming
//! lists, relist after 410), metadata watcher, discovery of a CRD-defined kind.

mod support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{GroupVersionKind, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use kubesink_sim::{SimConfig, Simulator, Workload};
use serde_json::json;
use support::*;
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(10);

async fn client_for(sim: &Simulator) -> Client {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&path).unwrap();
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&path).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

/// Drives a watcher stream in a background task (so it keeps watching while the test waits)
/// and forwards its events; errors (e.g. a 410) are skipped because a relist follows them.
fn drive<K: Send + 'static>(
    stream: impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
) -> mpsc::UnboundedReceiver<Event<K>> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(ev) = item {
                if tx.send(ev).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

async fn next_event<K>(rx: &mut mpsc::UnboundedReceiver<Event<K>>) -> Event<K> {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("watcher event in time")
        .expect("stream open")
}

#[tokio::test]
async fn kube_client_lists_pages_through_the_written_kubeconfig() {
    let (sim, _addr) = start(SimConfig::default()).await;
    sim.populate(&Workload {
        pods: 12,
        deployments: 2,
        ..Workload::default()
    })
    .unwrap();
    let client = client_for(&sim).await;
    let pods: Api<Pod> = Api::all(client);
    let page = pods.list(&ListParams::default().limit(5)).await.unwrap();
    assert_eq!(page.items.len(), 5);
    assert_eq!(page.metadata.remaining_item_count, Some(7));
    let rest = pods
        .list(
            &ListParams::default()
                .limit(100)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 7);
    assert!(rest.items[0].metadata.owner_references.is_some());
}

#[tokio::test]
async fn watcher_relists_after_a_410_and_sees_live_changes() {
    let (sim, _addr) = start(SimConfig::default()).await;
    sim.populate(&Workload {
        pods: 3,
        ..Workload::default()
    })
    .unwrap();
    let client = client_for(&sim).await;
    let api: Api<Pod> = Api::all(client);
    let mut stream = drive(watcher::watcher(
        api,
        watcher::Config::default().page_size(2),
    ));
    assert!(matches!(next_event(&mut stream).await, Event::Init));
    let mut initial = 0;
    loop {
        match next_event(&mut stream).await {
            Event::InitApply(_) => initial += 1,
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, 3);
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    sim.churn_steps(1, 5).unwrap();
    assert!(matches!(
        next_event(&mut stream).await,
        Event::Apply(_) | Event::Delete(_)
    ));

    sim.faults().fail_next_watches_with_gone(1);
    sim.faults().close_all_watches();
    assert!(
        matches!(next_event(&mut stream).await, Event::Init),
        "relist after 410"
    );
    let watch_requests: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.path_and_query.contains("watch=true"))
        .collect();
    assert!(watch_requests.len() >= 2);
    println!("kube-rs watcher requests: {:?}", sim.requests());
    assert!(watch_requests
        .iter()
        .all(|r| r.path_and_query.contains("allowWatchBookmarks=true")));
}

#[tokio::test]
async fn streaming_list_watcher_receives_the_initial_events_end_bookmark() {
    let (sim, _addr) = start(SimConfig::default()).await;
    sim.populate(&Workload {
        pods: 4,
        ..Workload::default()
    })
    .unwrap();
    let api: Api<Pod> = Api::all(client_for(&sim).await);
    let mut stream = drive(watcher::watcher(
        api,
        watcher::Config::default().streaming_lists(),
    ));
    let mut seen = Vec::new();
    loop {
        match next_event(&mut stream).await {
            Event::InitDone => break,
            Event::InitApply(p) => seen.push(p.metadata.name.unwrap()),
            _ => {}
        }
    }
    assert_eq!(seen.len(), 4);
    assert!(sim
        .requests()
        .iter()
        .any(|r| r.path_and_query.contains("sendInitialEvents=true")));
    println!("kube-rs streaming-list requests: {:?}", sim.requests());
}

#[tokio::test]
async fn metadata_watcher_sends_the_partial_object_metadata_accept_header() {
    let (sim, _addr) = start(SimConfig::default()).await;
    sim.create(configmap("default", "a", json!({"app": "x"})))
        .unwrap();
    let api: Api<PartialObjectMeta<ConfigMap>> = Api::all(client_for(&sim).await);
    let mut stream = drive(watcher::watcher(api, watcher::Config::default()));
    let mut names = Vec::new();
    loop {
        match next_event(&mut stream).await {
            Event::InitDone => break,
            Event::InitApply(m) => names.push(m.metadata.name.unwrap()),
            _ => {}
        }
    }
    assert_eq!(names, vec!["a"]);
    let accepts: Vec<String> = sim
        .requests()
        .into_iter()
        .filter_map(|r| r.accept)
        .collect();
    assert!(
        accepts
            .iter()
            .any(|a| a.contains("as=PartialObjectMetadataList")),
        "{accepts:?}"
    );
    println!("kube-rs metadata requests: {:?}", sim.requests());
}

#[tokio::test]
async fn crd_registration_makes_the_kind_discoverable_and_watchable() {
    let (sim, _addr) = start(SimConfig::default()).await;
    let client = client_for(&sim).await;
    let gvk = GroupVersionKind::gvk(
        "k8s-openapi-tests-custom-resource-definition.com",
        "v1",
        "FooBar",
    );
    assert!(kube::discovery::pinned_kind(&client, &gvk).await.is_err());
    let crd = kubesink_sim::workload::foobar_crd().unwrap();
    let crd_api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    crd_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .unwrap();
    let (resource, caps) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
    assert_eq!(resource.plural, "foobars");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    let foobars: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let mut stream = drive(watcher::watcher(
        foobars.clone(),
        watcher::Config::default(),
    ));
    assert!(matches!(next_event(&mut stream).await, Event::Init));
    assert!(matches!(next_event(&mut stream).await, Event::InitDone));
    let fb: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "k8s-openapi-tests-custom-resource-definition.com/v1", "kind": "FooBar",
        "metadata": {"name": "fb1"}, "spec": {"prop1": "v", "prop2": [true], "prop4": 1, "prop5": "x"}
    }))
    .unwrap();
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    foobars.create(&PostParams::default(), &fb).await.unwrap();
    match next_event(&mut stream).await {
        Event::Apply(obj) => assert_eq!(obj.metadata.name.as_deref(), Some("fb1")),
        other => panic!("unexpected {other:?}"),
    }
    let invalid: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "k8s-openapi-tests-custom-resource-definition.com/v1", "kind": "FooBar",
        "metadata": {"name": "bad"}, "spec": {"prop1": "v"}
    }))
    .unwrap();
    let err = foobars
        .create(&PostParams::default(), &invalid)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err:?}"
    );
    let listed: Vec<_> = foobars
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.metadata.name)
        .collect();
    assert_eq!(listed, vec![Some("fb1".to_owned())]);
}
