//! What an `updated` says changed, without a server: each kind of edit names
//! exactly its paths, configured paths, `ignore_changes` (not sent, not re-sent after a
//! relist or a restart) and state restored without parts (`changed` unknown).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kubesink_core::message::{encode, Change};
use kubesink_core::{Op, Resource};
use serde_json::{json, Value};

use super::restart_tests::saved;
use super::tests::{obj, over_store, U1};
use super::{Decider, Event};
use crate::config::ResourceConfig;
use crate::informer::facts::Parts;
use crate::informer::payload::Shaper;
use crate::informer::store::LightStore;

/// A Deployment as the API server writes it, before any edit.
fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {
            "name": "web", "namespace": "shop", "uid": U1, "resourceVersion": "10",
            "generation": 1, "labels": {"app": "web"},
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
        },
        "spec": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "app", "image": "nginx:1.27"}, {"name": "log", "image": "fluent:3"}]}}},
        "status": {"replicas": 2, "readyReplicas": 2, "observedGeneration": 1}
    })
}

/// The resource the tests' Deployments are of.
fn deployments() -> Arc<Resource> {
    Arc::new(Resource::new(
        "test",
        "apps",
        "v1",
        "Deployment",
        "deployments",
        true,
    ))
}

fn decider_of(res: ResourceConfig, store: Option<LightStore>) -> Decider {
    over_store(Arc::unwrap_or_clone(deployments()), &res, store)
}

/// A decider of `res` that has listed [`deployment`] and is watching.
fn watching(res: ResourceConfig) -> (Decider, Value) {
    let mut d = decider_of(res, None);
    let v = deployment();
    d.on_event(Event::ListStart).unwrap();
    d.on_event(Event::Listed(obj(&v.to_string()))).unwrap();
    d.on_event(Event::ListDone { sweep: true }).unwrap();
    (d, v)
}

/// Applies `edit` to `v` (and moves its resourceVersion on), as a watch MODIFIED.
fn modify(d: &mut Decider, v: &mut Value, edit: impl FnOnce(&mut Value)) -> Vec<Change> {
    edit(v);
    let rv: u64 = v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    v["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
    d.on_event(Event::Applied(obj(&v.to_string()))).unwrap()
}

/// The one change's `changed`, as names.
fn changed(changes: &[Change]) -> Option<Vec<String>> {
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].op, Op::Updated);
    changes[0]
        .changed
        .as_ref()
        .map(|c| c.iter().map(str::to_owned).collect())
}

fn names(paths: &[&str]) -> Option<Vec<String>> {
    Some(paths.iter().map(|p| p.to_string()).collect())
}

#[test]
fn each_kind_of_edit_names_exactly_its_default_paths() {
    let (mut d, mut v) = watching(ResourceConfig::new("apps/v1", "Deployment"));
    // A scale: spec.replicas and the generation it moves.
    let c = modify(&mut d, &mut v, |v| {
        v["spec"]["replicas"] = json!(5);
        v["metadata"]["generation"] = json!(2);
    });
    assert_eq!(changed(&c), names(&["spec"]));
    // An image change.
    let c = modify(&mut d, &mut v, |v| {
        v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.28");
        v["metadata"]["generation"] = json!(3);
    });
    assert_eq!(changed(&c), names(&["spec"]));
    // The controller's status write.
    let c = modify(&mut d, &mut v, |v| {
        v["status"]["observedGeneration"] = json!(3)
    });
    assert_eq!(changed(&c), names(&["status"]));
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["labels"]["tier"] = json!("front")
    });
    assert_eq!(changed(&c), names(&["metadata.labels"]));
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["annotations"]["note"] = json!("x")
    });
    assert_eq!(changed(&c), names(&["metadata.annotations"]));
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "X",
            "name": "owner", "uid": U1, "controller": true}])
    });
    assert_eq!(changed(&c), names(&["metadata.ownerReferences"]));
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["finalizers"] = json!(["f"])
    });
    assert_eq!(changed(&c), names(&["metadata"]));
    // Two sections at once, in slot order.
    let c = modify(&mut d, &mut v, |v| {
        v["status"]["readyReplicas"] = json!(1);
        v["metadata"]["labels"]["tier"] = json!("back");
    });
    assert_eq!(changed(&c), names(&["metadata.labels", "status"]));
    // A managedFields-only touch moves the resourceVersion and sends nothing.
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["managedFields"][0]["manager"] = json!("helm")
    });
    assert_eq!(c, vec![]);
    assert_eq!(d.stats().suppressed.load(Ordering::Relaxed), 1);
}

#[test]
fn data_and_other_top_level_fields_have_their_own_default_paths() {
    let res = ResourceConfig::new("v1", "ConfigMap");
    let resource = Arc::new(Resource::new(
        "test",
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        true,
    ));
    let shaper = Shaper::new(&res, "kubesink.io/cluster", "test");
    let mut d = Decider::new(resource, "all namespaces".into(), shaper, true);
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "shop", "uid": U1, "resourceVersion": "5"},
        "data": {"a": "1"}});
    d.on_event(Event::ListStart).unwrap();
    d.on_event(Event::Listed(obj(&v.to_string()))).unwrap();
    d.on_event(Event::ListDone { sweep: true }).unwrap();
    let c = modify(&mut d, &mut v, |v| v["data"]["a"] = json!("2"));
    assert_eq!(changed(&c), names(&["data"]));
    let c = modify(&mut d, &mut v, |v| v["binaryData"] = json!({"b": "AA=="}));
    assert_eq!(changed(&c), names(&["*"]));
}

#[test]
fn configured_paths_name_only_themselves_and_may_name_none() {
    let mut res = ResourceConfig::new("apps/v1", "Deployment");
    res.change_paths = vec![
        "spec.replicas".into(),
        "spec.template.spec.containers[*].image".into(),
        "metadata.labels['app']".into(),
    ];
    let (mut d, mut v) = watching(res);
    let c = modify(&mut d, &mut v, |v| v["spec"]["replicas"] = json!(3));
    assert_eq!(changed(&c), names(&["spec.replicas"]));
    let c = modify(&mut d, &mut v, |v| {
        v["spec"]["template"]["spec"]["containers"][1]["image"] = json!("fluent:4")
    });
    assert_eq!(
        changed(&c),
        names(&["spec.template.spec.containers[*].image"])
    );
    // A label other than `app`, and the status: none of the configured paths.
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["labels"]["tier"] = json!("x");
        v["status"]["readyReplicas"] = json!(0);
    });
    assert_eq!(changed(&c), Some(vec![]));
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["labels"]["app"] = json!("web2")
    });
    assert_eq!(changed(&c), names(&["metadata.labels['app']"]));
    // The wire form carries it, in the configured spelling.
    let resource = deployments();
    let m = encode(&resource, &c[0], "2026-12-05T00:00:00Z").unwrap();
    let wire: Value = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(wire["changed"], json!(["metadata.labels['app']"]));
}

#[test]
fn an_update_in_ignored_paths_only_is_not_sent_nor_sent_later() {
    let mut res = ResourceConfig::new("apps/v1", "Deployment");
    res.ignore_changes = vec!["status".into(), "metadata.annotations".into()];
    let (mut d, mut v) = watching(res.clone());
    let c = modify(&mut d, &mut v, |v| v["status"]["readyReplicas"] = json!(1));
    assert_eq!(c, vec![]);
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["annotations"]["note"] = json!("y");
        v["status"]["readyReplicas"] = json!(0);
    });
    assert_eq!(c, vec![]);
    assert_eq!(d.stats().ignored.load(Ordering::Relaxed), 2);
    assert_eq!(d.stats().suppressed.load(Ordering::Relaxed), 0);
    // The resourceVersion is tracked even so.
    let held = d.store().get(Some("shop"), "web").unwrap().rv.render();
    assert_eq!(held, "12");
    // A relist sees the same object: nothing.
    d.on_event(Event::ListStart).unwrap();
    assert_eq!(
        d.on_event(Event::Listed(obj(&v.to_string()))).unwrap(),
        vec![]
    );
    d.on_event(Event::ListDone { sweep: true }).unwrap();
    // A restart over the saved store: nothing either.
    let mut restarted = decider_of(res.clone(), Some(saved(&d)));
    restarted.on_event(Event::ListStart).unwrap();
    assert_eq!(
        restarted
            .on_event(Event::Listed(obj(&v.to_string())))
            .unwrap(),
        vec![]
    );
    // A change outside them is sent, naming every path changed since the last message.
    let c = modify(&mut d, &mut v, |v| v["spec"]["replicas"] = json!(4));
    assert_eq!(
        changed(&c),
        names(&["metadata.annotations", "spec", "status"])
    );
    assert_eq!(
        c[0].object.as_ref().unwrap().to_value()["status"]["readyReplicas"],
        0,
        "the message carries the whole object as it is"
    );
    // An ignored field that appears is no change either.
    let mut res = ResourceConfig::new("apps/v1", "Deployment");
    res.ignore_changes = vec!["status.conditions".into()];
    let (mut d, mut v) = watching(res);
    let c = modify(&mut d, &mut v, |v| {
        v["status"]["conditions"] = json!([{"type": "Available"}])
    });
    assert_eq!(c, vec![]);
}

#[test]
fn a_restart_keeps_the_parts_and_a_state_without_them_says_changed_is_unknown() {
    let res = ResourceConfig::new("apps/v1", "Deployment");
    let (d, v) = watching(res.clone());
    // With the parts saved: the first update after the restart names its path.
    let mut restarted = decider_of(res.clone(), Some(saved(&d)));
    restarted.on_event(Event::ListStart).unwrap();
    let mut edited = v.clone();
    edited["spec"]["replicas"] = json!(9);
    edited["metadata"]["resourceVersion"] = json!("20");
    let c = restarted
        .on_event(Event::Listed(obj(&edited.to_string())))
        .unwrap();
    assert_eq!(changed(&c), names(&["spec"]));
    // A state of an older kubesink (no parts): the update goes out, `changed` unknown,
    // and the one after it knows again.
    let mut old = saved(&d);
    let facts = old.get(Some("shop"), "web").unwrap().into_owned();
    let id = old.intern(Some("shop"));
    old.restore(
        id,
        "web",
        &crate::informer::Facts {
            parts: Parts::UNKNOWN,
            ..facts
        },
    );
    let mut restarted = decider_of(res, Some(old));
    restarted.on_event(Event::ListStart).unwrap();
    let c = restarted
        .on_event(Event::Listed(obj(&edited.to_string())))
        .unwrap();
    assert_eq!(changed(&c), None);
    let resource = deployments();
    let wire: Value =
        serde_json::from_slice(&encode(&resource, &c[0], "t").unwrap().payload).unwrap();
    assert!(wire.get("changed").is_none(), "unknown is no field");
    restarted.on_event(Event::ListDone { sweep: true }).unwrap();
    let mut v = edited;
    let c = modify(&mut restarted, &mut v, |v| {
        v["status"]["replicas"] = json!(9)
    });
    assert_eq!(changed(&c), names(&["status"]));
}

/// The one change's `changes`, parsed.
fn value_changes(changes: &[Change]) -> Option<Value> {
    assert_eq!(changes.len(), 1, "{changes:?}");
    changes[0]
        .changes
        .as_deref()
        .map(|t| serde_json::from_str(t).unwrap())
}

#[test]
fn old_and_new_values_within_the_bounds_and_paths_beyond_them_without() {
    let mut res = ResourceConfig::new("apps/v1", "Deployment");
    res.change_values = vec![
        "spec.replicas".into(),
        "spec.template.spec.containers[*].image".into(),
        "metadata.annotations".into(),
    ];
    res.change_value_max_bytes = crate::config::ByteSize(50);
    res.change_values_max_bytes = crate::config::ByteSize(70);
    let (mut d, mut v) = watching(res.clone());
    let c = modify(&mut d, &mut v, |v| v["spec"]["replicas"] = json!(5));
    assert_eq!(
        value_changes(&c),
        Some(json!([{"path": "spec.replicas", "old": 2, "new": 5}]))
    );
    // Several nodes: an array of them.
    let c = modify(&mut d, &mut v, |v| {
        v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.28")
    });
    assert_eq!(
        value_changes(&c),
        Some(json!([{"path": "spec.template.spec.containers[*].image",
            "old": ["nginx:1.27", "fluent:3"], "new": ["nginx:1.28", "fluent:3"]}]))
    );
    // The annotations (42 bytes of JSON) still fit: 1 + 25 + 42 ≤ 70.
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!("22")
    });
    assert_eq!(
        value_changes(&c),
        Some(json!([{"path": "metadata.annotations",
            "old": {"deployment.kubernetes.io/revision": "1"},
            "new": {"deployment.kubernetes.io/revision": "22"}}]))
    );
    // A longer image leaves no room for the annotations in the object's 70 bytes: they are
    // kept as a hash, unchanged, so not reported; the image is, with both values.
    let c = modify(&mut d, &mut v, |v| {
        v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.28-alpine")
    });
    assert_eq!(
        value_changes(&c),
        Some(json!([{"path": "spec.template.spec.containers[*].image",
            "old": ["nginx:1.28", "fluent:3"], "new": ["nginx:1.28-alpine", "fluent:3"]}]))
    );
    // Beyond the room, a change is still seen, without the values it cannot give.
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!("23")
    });
    assert_eq!(
        value_changes(&c),
        Some(json!([{"path": "metadata.annotations"}]))
    );
    // An image beyond the per-path bound (50 bytes): reported with its old value only.
    let long = format!("registry.example.com/team/{}:1", "x".repeat(30));
    let c = modify(&mut d, &mut v, |v| {
        v["spec"]["template"]["spec"]["containers"][0]["image"] = json!(long)
    });
    assert_eq!(
        value_changes(&c),
        Some(json!([{"path": "spec.template.spec.containers[*].image",
            "old": ["nginx:1.28-alpine", "fluent:3"]}]))
    );
    // A change of no value path: no `changes`; a label edit names its path in `changed`.
    let c = modify(&mut d, &mut v, |v| {
        v["metadata"]["labels"]["tier"] = json!("x")
    });
    assert_eq!(value_changes(&c), None);
    assert_eq!(changed(&c), names(&["metadata.labels"]));
    // The wire form.
    let c = modify(&mut d, &mut v, |v| v["spec"]["replicas"] = json!(6));
    let resource = deployments();
    let wire: Value =
        serde_json::from_slice(&encode(&resource, &c[0], "t").unwrap().payload).unwrap();
    assert_eq!(
        wire["changes"],
        json!([{"path": "spec.replicas", "old": 5, "new": 6}])
    );
    // A restart keeps no values: the first update after it has no `changes`, the next has.
    let mut restarted = decider_of(res, Some(saved(&d)));
    restarted.on_event(Event::ListStart).unwrap();
    restarted
        .on_event(Event::Listed(obj(&v.to_string())))
        .unwrap();
    restarted.on_event(Event::ListDone { sweep: true }).unwrap();
    let c = modify(&mut restarted, &mut v, |v| v["spec"]["replicas"] = json!(7));
    assert_eq!(value_changes(&c), None);
    assert_eq!(changed(&c), names(&["spec"]));
    let c = modify(&mut restarted, &mut v, |v| v["spec"]["replicas"] = json!(8));
    assert_eq!(
        value_changes(&c),
        Some(json!([{"path": "spec.replicas", "old": 7, "new": 8}]))
    );
}

#[test]
fn an_ignored_update_keeps_the_old_values_of_the_payload_last_sent() {
    let mut res = ResourceConfig::new("apps/v1", "Deployment");
    res.change_values = vec!["status.readyReplicas".into(), "spec.replicas".into()];
    res.ignore_changes = vec!["status".into()];
    let (mut d, mut v) = watching(res);
    assert_eq!(
        modify(&mut d, &mut v, |v| v["status"]["readyReplicas"] = json!(1)),
        vec![]
    );
    let c = modify(&mut d, &mut v, |v| v["spec"]["replicas"] = json!(3));
    assert_eq!(
        value_changes(&c),
        Some(json!([
            {"path": "status.readyReplicas", "old": 2, "new": 1},
            {"path": "spec.replicas", "old": 2, "new": 3}
        ]))
    );
}

#[test]
fn an_ignored_update_is_counted_as_ignored_also_with_configured_paths_that_miss_it() {
    // With `change_paths = ["spec.replicas"]` the status write must count as ignored, not as
    // suppressed (no configured path saw it).
    let mut res = ResourceConfig::new("apps/v1", "Deployment");
    res.change_paths = vec!["spec.replicas".into()];
    res.ignore_changes = vec!["status".into()];
    let (mut d, mut v) = watching(res);
    let c = modify(&mut d, &mut v, |v| v["status"]["readyReplicas"] = json!(1));
    assert_eq!(c, vec![]);
    assert_eq!(
        (
            d.stats().ignored.load(Ordering::Relaxed),
            d.stats().suppressed.load(Ordering::Relaxed)
        ),
        (1, 0)
    );
    // The ignored values' slot is never named.
    let c = modify(&mut d, &mut v, |v| {
        v["spec"]["replicas"] = json!(4);
        v["status"]["readyReplicas"] = json!(2);
    });
    assert_eq!(changed(&c), names(&["spec.replicas"]));
}
