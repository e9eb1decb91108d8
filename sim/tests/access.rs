//! Simulated authorization over real HTTP and with kube-rs: `SelfSubjectAccessReview`
//! answers, denials set with `/_sim/deny` (403 on the requests they cover, reviews that
//! agree), and bad selectors answered 400 with the API server's wording.

mod support;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kubesink_sim::{Denial, SimConfig, SIM_USER};
use serde_json::{json, Value};
use support::*;

const REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

fn review_body(verb: &str, group: &str, resource: &str, namespace: Option<&str>) -> String {
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
           "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                           "namespace": namespace}}})
    .to_string()
}

async fn allowed(
    addr: std::net::SocketAddr,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
) -> Value {
    let resp = request(
        addr,
        "POST",
        REVIEWS,
        None,
        Some(&review_body(verb, "", resource, namespace)),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    resp.json()["status"].clone()
}

#[tokio::test]
async fn access_reviews_allow_everything_until_a_permission_is_denied_and_requests_agree() {
    let (sim, addr) = start(SimConfig::default()).await;
    assert_eq!(
        allowed(addr, "watch", "pods", None).await,
        json!({"allowed": true})
    );
    let resp = request(
        addr,
        "POST",
        "/_sim/deny?verb=watch&group=&resource=pods&namespace=team-a",
        None,
        None,
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        sim.faults().denials(),
        vec![Denial::parse("watch:pods:team-a").unwrap()]
    );

    let denied = allowed(addr, "watch", "pods", Some("team-a")).await;
    assert_eq!(denied["allowed"], false);
    assert!(
        denied["reason"].as_str().unwrap().contains(SIM_USER),
        "{denied}"
    );
    assert_eq!(
        allowed(addr, "watch", "pods", None).await["allowed"],
        false,
        "a watch of all namespaces includes team-a"
    );
    assert_eq!(
        allowed(addr, "watch", "pods", Some("team-b")).await["allowed"],
        true
    );
    assert_eq!(
        allowed(addr, "list", "pods", Some("team-a")).await["allowed"],
        true
    );

    // The requests the review speaks of are answered the same way.
    let watch = get(
        addr,
        "/api/v1/namespaces/team-a/pods?watch=true&timeoutSeconds=1",
    )
    .await;
    assert_eq!(watch.status, 403);
    assert_eq!(
        watch.json()["message"],
        format!("pods is forbidden: User \"{SIM_USER}\" cannot watch resource \"pods\" in API group \"\" in the namespace \"team-a\"")
    );
    assert_eq!(
        get(addr, "/api/v1/namespaces/team-a/pods").await.status,
        200
    );
    assert_eq!(
        get(
            addr,
            "/api/v1/namespaces/team-b/pods?watch=true&timeoutSeconds=1"
        )
        .await
        .status,
        200
    );

    // Denials are the cluster's RBAC, not a passing fault: clear-faults keeps them.
    request(addr, "POST", "/_sim/clear-faults", None, None).await;
    assert_eq!(
        allowed(addr, "watch", "pods", Some("team-a")).await["allowed"],
        false
    );
    // on=false gives the rule back; with no rule, every rule.
    request(
        addr,
        "POST",
        "/_sim/deny?verb=watch&group=&resource=pods&namespace=team-a&on=false",
        None,
        None,
    )
    .await;
    assert!(sim.faults().denials().is_empty());
    sim.faults().deny(Denial::parse("*:*").unwrap());
    assert_eq!(
        allowed(addr, "get", "configmaps", Some("x")).await["allowed"],
        false
    );
    assert_eq!(
        get(addr, "/apis/apps/v1/deployments").await.status,
        403,
        "denied everywhere"
    );
    request(addr, "POST", "/_sim/deny?on=false", None, None).await;
    assert_eq!(
        allowed(addr, "get", "configmaps", Some("x")).await["allowed"],
        true
    );
}

#[tokio::test]
async fn access_reviews_are_discoverable_and_answer_kube_rs() {
    let (sim, addr) = start(SimConfig::default()).await;
    let groups = get(addr, "/apis").await.json();
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "authorization.k8s.io"),
        "{groups}"
    );
    let resources = get(addr, "/apis/authorization.k8s.io/v1").await.json();
    assert_eq!(
        resources["resources"][0]["name"],
        "selfsubjectaccessreviews"
    );
    assert_eq!(resources["resources"][0]["verbs"], json!(["create"]));

    sim.faults()
        .deny(Denial::parse("update:leases.coordination.k8s.io:kubesink").unwrap());
    let api: Api<SelfSubjectAccessReview> = Api::all(kube_client(&sim).await);
    let ask = |verb: &str| SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_owned()),
                group: Some("coordination.k8s.io".to_owned()),
                resource: Some("leases".to_owned()),
                namespace: Some("kubesink".to_owned()),
                name: Some("kubesink".to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let pp = PostParams::default();
    let get_answer = api.create(&pp, &ask("get")).await.unwrap();
    assert!(get_answer.status.unwrap().allowed);
    let update_answer = api.create(&pp, &ask("update")).await.unwrap();
    assert!(!update_answer.status.unwrap().allowed);

    // Even a denial of everything leaves a user free to ask about its own access.
    sim.faults().deny(Denial::parse("*:*").unwrap());
    assert!(
        !api.create(&pp, &ask("get"))
            .await
            .unwrap()
            .status
            .unwrap()
            .allowed
    );

    let empty = request(addr, "POST", REVIEWS, None, Some(r#"{"spec":{}}"#)).await;
    assert_eq!(
        (empty.status, empty.json()["reason"].clone()),
        (422, json!("Invalid"))
    );
    assert_eq!(get(addr, REVIEWS).await.status, 405);
}

#[tokio::test]
async fn bad_selectors_are_400_with_the_api_servers_message() {
    let (_sim, addr) = start(SimConfig::default()).await;
    let label = get(addr, "/api/v1/pods?limit=1&labelSelector=app%20in%20(web").await;
    assert_eq!(label.status, 400);
    let status = label.json();
    assert_eq!(status["reason"], "BadRequest");
    assert_eq!(
        status["message"],
        "unable to parse requirement: app in (web"
    );
    let field = get(addr, "/api/v1/pods?limit=1&fieldSelector=spec.foo%3Dx").await;
    assert_eq!(field.status, 400);
    assert_eq!(
        field.json()["message"],
        "field label not supported: spec.foo"
    );
    assert_eq!(
        get(
            addr,
            "/api/v1/pods?limit=1&labelSelector=app%3Dweb&fieldSelector=metadata.name%3Dx"
        )
        .await
        .status,
        200
    );
}
