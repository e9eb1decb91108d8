//! Status overrides over real HTTP and with kube-rs: codes and `Status` bodies, path and
//! resource matchers, open watches ending, clearing, and failing discovery.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::discovery::Discovery;
use kubesink_sim::{FaultError, SimConfig, SIM_USER};
use serde_json::json;
use support::*;

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn each_injected_code_answers_the_status_a_real_server_sends() {
    let (sim, addr) = start(SimConfig::default()).await;
    let f = sim.faults();
    for (code, reason) in [
        (401, "Unauthorized"),
        (404, "NotFound"),
        (500, "InternalError"),
    ] {
        f.set_status("/api/v1/pods", code, None).unwrap();
        let resp = get(addr, "/api/v1/pods").await;
        let status = resp.json();
        assert_eq!(resp.status, code);
        assert_eq!(
            (status["kind"].as_str(), status["status"].as_str()),
            (Some("Status"), Some("Failure"))
        );
        assert_eq!(
            (status["code"].as_u64(), status["reason"].as_str()),
            (Some(code as u64), Some(reason))
        );
        assert_eq!(resp.header("retry-after"), None);
    }
    assert_eq!(
        get(addr, "/api/v1/pods").await.json()["message"],
        "Internal error occurred: injected fault"
    );

    f.set_status("/api/v1/pods", 403, None).unwrap();
    let forbidden = get(addr, "/api/v1/pods").await.json();
    assert_eq!(forbidden["reason"], "Forbidden");
    assert_eq!(
        forbidden["message"],
        format!("pods is forbidden: User \"{SIM_USER}\" cannot list resource \"pods\" in API group \"\" at the cluster scope")
    );
    assert_eq!(forbidden["details"], json!({"kind": "pods"}));

    f.set_status("/api/v1/pods", 429, None).unwrap();
    let limited = get(addr, "/api/v1/pods").await;
    assert_eq!(
        limited.header("retry-after"),
        Some("1"),
        "429 defaults to 1 s"
    );
    assert_eq!(limited.json()["reason"], "TooManyRequests");

    f.set_status("/api/v1/pods", 503, Some(7)).unwrap();
    let unavailable = get(addr, "/api/v1/pods").await;
    assert_eq!(unavailable.status, 503);
    assert_eq!(unavailable.header("retry-after"), Some("7"));
    assert_eq!(unavailable.json()["reason"], "ServiceUnavailable");
    assert_eq!(unavailable.json()["details"]["retryAfterSeconds"], 7);
    assert_eq!(
        get(addr, "/api/v1/pods/x").await.status,
        503,
        "gets under the prefix match too"
    );

    f.clear_status("/api/v1/pods");
    assert_eq!(get(addr, "/api/v1/pods").await.status, 200);
    assert_eq!(
        f.set_status("/api", 418, None),
        Err(FaultError::UnsupportedStatus(418))
    );
}

#[tokio::test]
async fn a_resource_matcher_covers_every_namespace_while_a_prefix_covers_one_path() {
    let (sim, addr) = start(SimConfig::default()).await;
    let f = sim.faults();
    f.set_status("/api/v1/pods", 403, None).unwrap();
    assert_eq!(get(addr, "/api/v1/pods").await.status, 403);
    assert_eq!(get(addr, "/api/v1/namespaces/x/pods").await.status, 200);
    f.clear_status("/api/v1/pods");

    f.set_resource_status("", "pods", 403, None).unwrap();
    let ns = get(addr, "/api/v1/namespaces/x/pods?watch=true").await;
    assert_eq!(ns.status, 403);
    assert_eq!(
        ns.json()["message"],
        format!("pods is forbidden: User \"{SIM_USER}\" cannot watch resource \"pods\" in API group \"\" in the namespace \"x\"")
    );
    assert_eq!(get(addr, "/api/v1/pods").await.status, 403);
    assert_eq!(get(addr, "/api/v1/configmaps").await.status, 200);
    assert_eq!(
        get(addr, "/api/v1").await.status,
        200,
        "discovery is not the resource"
    );
    f.clear_resource_status("", "pods");
    assert_eq!(get(addr, "/api/v1/namespaces/x/pods").await.status, 200);

    // Over the admin endpoint, for an API group's resource.
    let set = request(
        addr,
        "POST",
        "/_sim/set-status?status=403&group=apps&resource=deployments",
        None,
        None,
    )
    .await;
    assert_eq!(set.status, 200);
    let denied = get(addr, "/apis/apps/v1/namespaces/x/deployments/web")
        .await
        .json();
    assert_eq!(
        denied["message"],
        format!("deployments.apps \"web\" is forbidden: User \"{SIM_USER}\" cannot get resource \"deployments\" in API group \"apps\" in the namespace \"x\"")
    );
    assert_eq!(
        denied["details"],
        json!({"group": "apps", "kind": "deployments", "name": "web"})
    );
    request(
        addr,
        "POST",
        "/_sim/clear-status?group=apps&resource=deployments",
        None,
        None,
    )
    .await;
    assert_eq!(get(addr, "/apis/apps/v1/deployments").await.status, 200);
    let bad = request(
        addr,
        "POST",
        "/_sim/set-status?status=418&path_prefix=/api",
        None,
        None,
    )
    .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn setting_a_status_ends_matching_open_watches_so_the_next_request_meets_it() {
    let (sim, addr) = start(SimConfig::default()).await;
    let mut pods = watch(addr, "/api/v1/namespaces/x/pods?watch=true", None).await;
    let mut cms = watch(addr, "/api/v1/configmaps?watch=true&timeoutSeconds=2", None).await;
    wait_for("watches open", T, || sim.open_watches() == 2).await;
    sim.faults()
        .set_resource_status("", "pods", 401, None)
        .unwrap();
    assert!(pods.ends_within(T).await);
    assert_eq!(sim.open_watches(), 1, "the configmaps watch goes on");
    let again = get(addr, "/api/v1/namespaces/x/pods?watch=true").await;
    assert_eq!(again.status, 401);
    assert!(cms.ends_within(T).await, "ends only at its own timeout");
}

#[tokio::test]
async fn kube_sees_the_injected_status_as_an_api_error() {
    let (sim, _addr) = start(SimConfig::default()).await;
    let pods: Api<Pod> = Api::namespaced(kube_client(&sim).await, "default");
    sim.faults()
        .set_resource_status("", "pods", 403, None)
        .unwrap();
    let err = pods.list(&ListParams::default()).await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
            assert!(
                s.message.contains("cannot list resource \"pods\""),
                "{}",
                s.message
            );
        }
        other => panic!("expected a 403 Status, got {other:?}"),
    }
}

#[tokio::test]
async fn discovery_fails_totally_or_for_one_group_version_as_kube_sees_it() {
    let (sim, _addr) = start(SimConfig::default()).await;
    let client = kube_client_without_retries(&sim).await;
    assert!(Discovery::new(client.clone()).run().await.is_ok());

    // Total: the API server's root discovery documents fail.
    sim.faults().set_status("/api", 500, None).unwrap();
    let err = Discovery::new(client.clone()).run().await.err();
    assert!(
        matches!(err, Some(kube::Error::Api(ref s)) if s.code == 500),
        "{err:?}"
    );
    sim.faults().clear_status("/api");

    // Partial: one aggregated group version is down, the rest still discovers.
    sim.faults()
        .set_status("/apis/apps/v1", 503, Some(2))
        .unwrap();
    let err = Discovery::new(client.clone()).run().await.err();
    assert!(
        matches!(err, Some(kube::Error::Api(ref s)) if s.code == 503),
        "{err:?}"
    );
    let others = Discovery::new(client.clone())
        .filter(&["", "coordination.k8s.io", "events.k8s.io"])
        .run()
        .await
        .unwrap();
    let groups: Vec<String> = others.groups().map(|g| g.name().to_owned()).collect();
    assert!(
        groups.contains(&"coordination.k8s.io".to_owned()),
        "{groups:?}"
    );
    assert!(kube::discovery::group(&client, "apps").await.is_err());
    sim.faults().clear_status("/apis/apps/v1");
    assert!(kube::discovery::group(&client, "apps").await.is_ok());
}

#[tokio::test]
async fn kube_retries_a_503_after_its_retry_after_and_the_request_log_shows_the_wait() {
    let (sim, _addr) = start(SimConfig::default()).await;
    let client = kube_client(&sim).await;
    sim.faults()
        .set_status("/apis/apps/v1", 503, Some(1))
        .unwrap();
    let discovering = tokio::spawn(async move { kube::discovery::group(&client, "apps").await });
    let attempts = || {
        sim.requests()
            .into_iter()
            .filter(|r| r.path_and_query == "/apis/apps/v1")
            .collect::<Vec<_>>()
    };
    wait_for("two attempts", Duration::from_secs(10), || {
        attempts().len() >= 2
    })
    .await;
    sim.faults().clear_status("/apis/apps/v1");
    let group = tokio::time::timeout(Duration::from_secs(10), discovering)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(group.name(), "apps");
    let log = attempts();
    assert!(
        log[1].at.duration_since(log[0].at) >= Duration::from_millis(950),
        "kube-rs waited for Retry-After: {:?}",
        log[1].at.duration_since(log[0].at)
    );
}
