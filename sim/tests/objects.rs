//! Objects that stress clients and the server: 10,000 levels deep, 5 MiB large, inserted raw
//! against the conventions (no name, opaque resourceVersion), and the Lease and Event kinds
//! (leader election with optimistic concurrency, both Event APIs in discovery).

mod support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kubesink_sim::{RawResourceVersion, SimConfig};
use serde_json::json;
use support::*;

const T: Duration = Duration::from_secs(10);
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";

/// The deepest nesting of objects and arrays in JSON text (strings skipped), without parsing.
fn depth(text: &str) -> usize {
    let (mut d, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                d += 1;
                max = max.max(d);
            }
            b'}' | b']' => d -= 1,
            _ => {}
        }
    }
    max
}

/// A Deployment whose `spec` nests `levels` objects (`{"a":{"a":…"leaf"…}}`).
fn deep_deployment(name: &str, levels: usize, leaf: &str) -> String {
    let mut spec = String::with_capacity(levels * 6 + 16);
    for _ in 0..levels {
        spec.push_str("{\"a\":");
    }
    spec.push_str(&format!("\"{leaf}\""));
    spec.push_str(&"}".repeat(levels));
    format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"{name}","namespace":"default"}},"spec":{spec}}}"#
    )
}

#[tokio::test]
async fn a_spec_nested_ten_thousand_levels_is_created_stored_served_changed_and_deleted() {
    let (sim, addr) = start(SimConfig::default()).await;
    let rv = sim.resource_version();
    let mut w = watch(
        addr,
        &format!("{DEPLOYMENTS}?watch=true&resourceVersion={rv}"),
        None,
    )
    .await;
    wait_for("watch open", T, || sim.open_watches() == 1).await;

    let body = deep_deployment("deep", 10_000, "first");
    let created = request(addr, "POST", DEPLOYMENTS, None, Some(&body)).await;
    assert_eq!(
        created.status,
        201,
        "{}",
        &created.body[..created.body.len().min(300)]
    );
    assert_eq!(depth(&created.body), 10_001);

    let got = get(addr, &format!("{DEPLOYMENTS}/deep")).await;
    assert_eq!(got.status, 200);
    assert_eq!(depth(&got.body), 10_001);
    assert!(got.body.contains("\"first\""));
    let list = get(addr, DEPLOYMENTS).await;
    assert_eq!((list.status, depth(&list.body)), (200, 10_003));
    let added = w.next_line(T).await.unwrap();
    let added = String::from_utf8(added).unwrap();
    assert!(added.starts_with("{\"type\":\"ADDED\""));
    assert_eq!(depth(&added), 10_002);

    let replaced = request(
        addr,
        "PUT",
        &format!("{DEPLOYMENTS}/deep"),
        None,
        Some(&deep_deployment("deep", 10_000, "second")),
    )
    .await;
    assert_eq!(
        replaced.status,
        200,
        "{}",
        &replaced.body[..replaced.body.len().min(300)]
    );
    assert!(replaced.body.contains("\"generation\":2"));
    let patched = request(
        addr,
        "PATCH",
        &format!("{DEPLOYMENTS}/deep"),
        None,
        Some(r#"{"metadata":{"labels":{"patched":"yes"}}}"#),
    )
    .await;
    assert_eq!(patched.status, 200);
    assert!(patched.body.contains("\"patched\":\"yes\"") && patched.body.contains("\"second\""));

    let deleted = request(addr, "DELETE", &format!("{DEPLOYMENTS}/deep"), None, None).await;
    assert_eq!(deleted.status, 200);
    assert_eq!(depth(&deleted.body), 10_001);
    for expected in ["MODIFIED", "MODIFIED", "DELETED"] {
        let line = String::from_utf8(w.next_line(T).await.unwrap()).unwrap();
        assert!(
            line.starts_with(&format!("{{\"type\":\"{expected}\"")),
            "{}",
            &line[..60]
        );
    }
    assert_eq!(get(addr, &format!("{DEPLOYMENTS}/deep")).await.status, 404);
}

#[tokio::test]
async fn a_five_mebibyte_object_is_accepted_and_served_to_kube() {
    let (sim, addr) = start(SimConfig::default()).await;
    let big = "x".repeat(5 * 1024 * 1024);
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big", "namespace": "default"}, "data": {"blob": big}}).to_string();
    let created = request(
        addr,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        None,
        Some(&body),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        &created.body[..created.body.len().min(300)]
    );
    let cms: Api<ConfigMap> = Api::namespaced(kube_client(&sim).await, "default");
    let got = cms.get("big").await.unwrap();
    assert_eq!(got.data.unwrap()["blob"].len(), 5 * 1024 * 1024);
    let listed = cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
}

#[tokio::test]
async fn raw_objects_without_a_name_or_with_an_opaque_resource_version_appear_in_lists_and_watches()
{
    let (sim, addr) = start(SimConfig::default()).await;
    let rv = sim.resource_version();
    let mut w = watch(
        addr,
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"),
        None,
    )
    .await;
    wait_for("watch open", T, || sim.open_watches() == 1).await;
    let nameless = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "default", "resourceVersion": "abc-17"}, "data": {"k": "v"}});
    let resp = request(
        addr,
        "POST",
        "/_sim/insert-raw?apiVersion=v1&kind=ConfigMap&resourceVersion=as-given",
        None,
        Some(&nameless.to_string()),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let ev = w.next(T).await.unwrap();
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(
        ev["object"]["metadata"],
        json!({"namespace": "default", "resourceVersion": "abc-17"})
    );

    sim.insert_raw(
        "v1",
        "ConfigMap",
        json!({"kind": "ConfigMap", "data": {"no": "metadata"}}),
        RawResourceVersion::Assigned,
    )
    .unwrap();
    let list = get(addr, "/api/v1/configmaps").await.json();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(
        items[0]["metadata"],
        json!({"resourceVersion": sim.resource_version().to_string()})
    );
    assert_eq!(items[1]["metadata"]["resourceVersion"], "abc-17");
    assert!(items.iter().all(|i| i["metadata"].get("name").is_none()));
    assert_eq!(
        list["metadata"]["resourceVersion"],
        sim.resource_version().to_string()
    );

    // kube-rs decodes them (ObjectMeta.name is optional) and shows the opaque version.
    let cms: Api<ConfigMap> = Api::namespaced(kube_client(&sim).await, "default");
    let listed = cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.name, None);
    assert_eq!(
        listed.items[0].metadata.resource_version.as_deref(),
        Some("abc-17")
    );

    let bad = request(addr, "POST", "/_sim/insert-raw?kind=Nope", None, Some("{}")).await;
    assert_eq!(bad.status, 404);
}

#[tokio::test]
async fn leases_support_get_create_update_and_a_stale_update_answers_409_conflict() {
    let (sim, _addr) = start(SimConfig::default()).await;
    let leases: Api<Lease> = Api::namespaced(kube_client(&sim).await, "kube-system");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "kubesink", "namespace": "kube-system"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut mine = leases.get("kubesink").await.unwrap();
    assert_eq!(
        mine.metadata.resource_version,
        created.metadata.resource_version
    );
    mine.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let renewed = leases
        .replace("kubesink", &PostParams::default(), &mine)
        .await
        .unwrap();
    assert_ne!(
        renewed.metadata.resource_version,
        mine.metadata.resource_version
    );

    // `mine` still carries the old resourceVersion: another holder's write conflicts.
    let err = leases
        .replace("kubesink", &PostParams::default(), &mine)
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
            assert_eq!(
                s.message,
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"kubesink\": the object has been modified; please apply your changes to the latest version and try again"
            );
        }
        other => panic!("expected 409, got {other:?}"),
    }
    let current = leases.get("kubesink").await.unwrap();
    assert_eq!(current.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn both_event_apis_and_leases_are_in_discovery() {
    let (sim, addr) = start(SimConfig::default()).await;
    let client = kube_client(&sim).await;
    for (group, kind, plural) in [
        ("", "Event", "events"),
        ("events.k8s.io", "Event", "events"),
        ("coordination.k8s.io", "Lease", "leases"),
    ] {
        let (resource, caps) =
            kube::discovery::pinned_kind(&client, &GroupVersionKind::gvk(group, "v1", kind))
                .await
                .unwrap_or_else(|e| panic!("{group}/{kind}: {e}"));
        assert_eq!(resource.plural, plural);
        assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    }
    let core = get(addr, "/api/v1").await.json();
    assert!(core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "events"));
}
