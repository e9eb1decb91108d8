//! List pagination faults over real HTTP and with kube-rs: continue tokens that expire with
//! the real server's 410 and inconsistent-continue token, and an explicit empty `continue`.

mod support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kubesink_sim::{SimConfig, Simulator, EXPIRED_CONTINUE_MESSAGE};
use serde_json::json;
use support::*;

const T: Duration = Duration::from_secs(10);

async fn five_configmaps() -> (Simulator, std::net::SocketAddr) {
    let (sim, addr) = start(SimConfig::default()).await;
    for i in 0..5 {
        sim.create(configmap("default", &format!("c{i}"), json!({})))
            .unwrap();
    }
    (sim, addr)
}

#[tokio::test]
async fn an_expired_continue_answers_410_with_an_inconsistent_token_that_lists_the_rest_at_the_latest_version(
) {
    let (sim, addr) = five_configmaps().await;
    let first = get(addr, "/api/v1/configmaps?limit=2").await.json();
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    sim.create(configmap("default", "c9", json!({}))).unwrap();

    sim.faults().expire_next_continue(1);
    let expired = get(
        addr,
        &format!("/api/v1/configmaps?limit=2&continue={token}"),
    )
    .await;
    assert_eq!(expired.status, 410);
    let status = expired.json();
    assert_eq!(status["reason"], "Expired");
    assert_eq!(status["message"], EXPIRED_CONTINUE_MESSAGE);
    let inconsistent = status["metadata"]["continue"].as_str().unwrap().to_owned();
    assert!(!inconsistent.is_empty() && inconsistent != token);

    let rest = get(addr, &format!("/api/v1/configmaps?continue={inconsistent}"))
        .await
        .json();
    assert_eq!(
        item_names(&rest),
        ["c2", "c3", "c4", "c9"],
        "c9 was created after the first page"
    );
    assert_eq!(
        rest["metadata"]["resourceVersion"],
        sim.resource_version().to_string()
    );

    let consistent = get(addr, &format!("/api/v1/configmaps?continue={token}"))
        .await
        .json();
    assert_eq!(
        item_names(&consistent),
        ["c2", "c3", "c4"],
        "only one was expired"
    );
    request(addr, "POST", "/_sim/expire-continue?count=1", None, None).await;
    assert_eq!(
        get(addr, &format!("/api/v1/configmaps?continue={token}"))
            .await
            .status,
        410
    );
}

#[tokio::test]
async fn kube_sees_the_expired_continue_and_a_paging_watcher_relists() {
    let (sim, _addr) = five_configmaps().await;
    let client = kube_client(&sim).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let page = cms.list(&ListParams::default().limit(2)).await.unwrap();
    sim.faults().expire_next_continue(1);
    let token = page.metadata.continue_.unwrap();
    let err = cms
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 410 && s.reason == "Expired"),
        "{err:?}"
    );

    sim.faults().expire_next_continue(1);
    let stream = watcher::watcher(cms, watcher::Config::default().page_size(2)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let (mut errors, mut names) = (0, Vec::new());
    loop {
        match tokio::time::timeout(T, stream.next())
            .await
            .unwrap()
            .unwrap()
        {
            Err(_) => errors += 1,
            Ok(Event::Init) => names.clear(),
            Ok(Event::InitApply(c)) => names.push(c.metadata.name.unwrap()),
            Ok(Event::InitDone) => break,
            Ok(_) => {}
        }
    }
    assert_eq!(errors, 1, "one 410 on the second page, then a fresh list");
    assert_eq!(names, ["c0", "c1", "c2", "c3", "c4"]);
}

#[tokio::test]
async fn explicit_empty_continue_marks_the_last_page_and_clients_stop_there() {
    let (sim, addr) = five_configmaps().await;
    let whole = get(addr, "/api/v1/configmaps").await.json();
    assert!(
        whole["metadata"].get("continue").is_none(),
        "omitted by default"
    );

    sim.faults().explicit_empty_continue(true);
    let whole = get(addr, "/api/v1/configmaps").await.json();
    assert_eq!(whole["metadata"]["continue"], "");
    let first = get(addr, "/api/v1/configmaps?limit=3").await.json();
    let token = first["metadata"]["continue"].as_str().unwrap();
    assert!(!token.is_empty());
    let last = get(
        addr,
        &format!("/api/v1/configmaps?limit=3&continue={token}"),
    )
    .await
    .json();
    assert_eq!(item_names(&last), ["c3", "c4"]);
    assert_eq!(last["metadata"]["continue"], "");

    let cms: Api<ConfigMap> = Api::namespaced(kube_client(&sim).await, "default");
    let stream = watcher::watcher(cms, watcher::Config::default().page_size(3));
    let mut stream = std::pin::pin!(stream);
    let mut names = Vec::new();
    loop {
        match tokio::time::timeout(T, stream.next())
            .await
            .unwrap()
            .unwrap()
        {
            Ok(Event::InitApply(c)) => names.push(c.metadata.name.unwrap()),
            Ok(Event::InitDone) => break,
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(names.len(), 5);
    request(
        addr,
        "POST",
        "/_sim/explicit-empty-continue?on=false",
        None,
        None,
    )
    .await;
    let whole = get(addr, "/api/v1/configmaps").await.json();
    assert!(whole["metadata"].get("continue").is_none());
}
