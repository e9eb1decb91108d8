//! A resource's CEL filter in the decider, without a server: matching, leaving
//! (`deleted` with `reason: leftFilter`, the leaving state as its object), coming back
//! (`added`), deletes of objects never followed, relists and a restart from saved state
//! under a changed expression.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kubesink_core::message::{encode, Change, DeleteReason};
use kubesink_core::{Op, Resource};
use serde_json::{json, Value};

use super::restart_tests::saved;
use super::tests::{obj, over_store, U1, U2};
use super::{Decider, Event};
use crate::config::ResourceConfig;
use crate::informer::filter::Filter;
use crate::informer::payload::Shaper;
use crate::informer::store::LightStore;
use crate::informer::tracked::TrackedStore;

const NOT_DONE: &str =
    r#"!(has(object.status.phase) && object.status.phase in ["Succeeded", "Failed"])"#;

fn pod(name: &str, uid: &str, rv: u64, phase: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv.to_string()},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
        "status": {"phase": phase}
    })
    .to_string()
}

fn decider(expr: &str, store: Option<LightStore>) -> Decider {
    let res = ResourceConfig::new("v1", "Pod");
    let resource = Resource::new("test", "", "v1", "Pod", "pods", true);
    let filter = Some(Arc::new(Filter::compile(expr).expect("compiles")));
    over_store(resource, &res, store).with_filter(filter)
}

/// (op, name, reason, the object's phase) of each change.
fn summary(changes: &[Change]) -> Vec<(Op, String, Option<DeleteReason>, Value)> {
    changes
        .iter()
        .map(|c| {
            let phase = c
                .object
                .as_ref()
                .map_or(Value::Null, |o| o.to_value()["status"]["phase"].clone());
            (c.op, c.name.clone(), c.reason, phase)
        })
        .collect()
}

/// One whole list of `objects` (start, each listed, the sweeping end): its changes.
pub(super) fn list(d: &mut Decider, objects: &[String]) -> Vec<Change> {
    let mut out = d.on_event(Event::ListStart).unwrap();
    for o in objects {
        out.extend(d.on_event(Event::Listed(obj(o))).unwrap());
    }
    out.extend(d.on_event(Event::ListDone { sweep: true }).unwrap());
    out
}

#[test]
fn only_matching_objects_are_listed_and_a_leaving_one_is_deleted_with_left_filter() {
    let mut d = decider(NOT_DONE, None);
    let out = list(
        &mut d,
        &[pod("a", U1, 1, "Running"), pod("b", U2, 2, "Succeeded")],
    );
    assert_eq!(
        summary(&out),
        [(Op::Added, "a".into(), None, json!("Running"))]
    );
    assert_eq!(d.stats().filtered_out.load(Ordering::Relaxed), 1);
    assert_eq!(d.store().len(), 1, "the store holds only what matched");

    // a completes: it leaves the filter, with the state that made it leave.
    let out = d
        .on_event(Event::Applied(obj(&pod("a", U1, 3, "Succeeded"))))
        .unwrap();
    assert_eq!(
        summary(&out),
        [(
            Op::Deleted,
            "a".into(),
            Some(DeleteReason::LeftFilter),
            json!("Succeeded")
        )]
    );
    assert!(!out[0].final_state_unknown);
    let resource = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
    let msg = encode(&resource, &out[0], "2026-12-05T00:00:00.000Z").unwrap();
    let wire: Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(wire["reason"], "leftFilter", "{wire}");
    assert_eq!(d.stats().left_filter.load(Ordering::Relaxed), 1);
    assert_eq!(d.store().len(), 0);

    // Further changes of an object not followed send nothing; nor does its delete.
    assert!(d
        .on_event(Event::Applied(obj(&pod("a", U1, 4, "Failed"))))
        .unwrap()
        .is_empty());
    assert!(d
        .on_event(Event::Deleted(obj(&pod("b", U2, 5, "Succeeded"))))
        .unwrap()
        .is_empty());

    // b matches again (phase rewritten, as a test can): it comes back as added.
    let out = d
        .on_event(Event::Applied(obj(&pod("b", U2, 6, "Running"))))
        .unwrap();
    assert_eq!(
        summary(&out),
        [(Op::Added, "b".into(), None, json!("Running"))]
    );
    // Its real delete is sent, whatever the final state says.
    let out = d
        .on_event(Event::Deleted(obj(&pod("b", U2, 7, "Succeeded"))))
        .unwrap();
    assert_eq!(
        summary(&out),
        [(Op::Deleted, "b".into(), None, json!("Succeeded"))]
    );
}

#[test]
fn a_relist_sends_left_filter_for_an_object_that_stopped_matching_unseen() {
    let mut d = decider(NOT_DONE, None);
    list(
        &mut d,
        &[pod("a", U1, 1, "Running"), pod("c", U2, 2, "Running")],
    );
    // The watch missed a's completion (410 Gone, relist): the list shows it done.
    let out = list(
        &mut d,
        &[pod("a", U1, 5, "Failed"), pod("c", U2, 2, "Running")],
    );
    assert_eq!(
        summary(&out),
        [(
            Op::Deleted,
            "a".into(),
            Some(DeleteReason::LeftFilter),
            json!("Failed")
        )],
        "a leftFilter delete with its state, not a finalStateUnknown sweep"
    );
}

#[test]
fn a_key_re_created_unseen_outside_the_filter_sends_only_the_old_uids_delete() {
    let mut d = decider(NOT_DONE, None);
    list(&mut d, &[pod("a", U1, 1, "Running")]);
    // Deleted and created again under its name while the watch was down; the new object is
    // done, so the filter leaves it out: no destination ever got uid U2.
    let out = list(&mut d, &[pod("a", U2, 7, "Failed")]);
    let got: Vec<_> = out
        .iter()
        .map(|c| (c.op, c.uid.clone(), c.final_state_unknown))
        .collect();
    assert_eq!(got, vec![(Op::Deleted, U1.to_owned(), true)]);
    assert!(d.store().get(Some("ns"), "a").is_none());
}

#[test]
fn a_restart_under_a_changed_expression_sends_the_difference_only() {
    let mut first = decider("true", None);
    list(
        &mut first,
        &[pod("a", U1, 1, "Running"), pod("b", U2, 2, "Succeeded")],
    );
    // Restarted with the filter: b leaves (it is still there), a is unchanged.
    let mut d = decider(NOT_DONE, Some(saved(&first)));
    let out = list(
        &mut d,
        &[pod("a", U1, 1, "Running"), pod("b", U2, 2, "Succeeded")],
    );
    assert_eq!(
        summary(&out),
        [(
            Op::Deleted,
            "b".into(),
            Some(DeleteReason::LeftFilter),
            json!("Succeeded")
        )]
    );
    // And back without it: b comes back as added, a still nothing.
    let mut again = decider("true", Some(saved(&d)));
    let out = list(
        &mut again,
        &[pod("a", U1, 1, "Running"), pod("b", U2, 2, "Succeeded")],
    );
    assert_eq!(
        summary(&out),
        [(Op::Added, "b".into(), None, json!("Succeeded"))]
    );
}

#[test]
fn an_evaluation_error_is_no_match_and_counted() {
    // status.nodeName is absent on these Pods: an error, not a crash, not a match.
    let mut d = decider("object.status.nodeName == 'n1'", None);
    let out = list(&mut d, &[pod("a", U1, 1, "Running")]);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(d.stats().filter_errors.load(Ordering::Relaxed), 1);
    assert_eq!(d.stats().filtered_out.load(Ordering::Relaxed), 1);
}

/// A decider serving a filtered sink's view: the resource's filter, then the sink's.
fn view(resource_expr: Option<&str>, sink_expr: &str) -> Decider {
    use crate::informer::filter::Place;
    let res = ResourceConfig::new("v1", "Pod");
    let resource = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
    let shaper = Shaper::new(&res, "kubesink.io/cluster", "test");
    let own = resource_expr.map(|e| Arc::new(Filter::compile(e).expect("compiles")));
    let sink = Filter::compile_for(sink_expr, Place::Sink).expect("compiles");
    Decider::with_store(
        resource,
        "all namespaces".into(),
        shaper,
        true,
        TrackedStore::new(LightStore::new(), true),
        false,
        Arc::default(),
    )
    .with_filter(own)
    .with_sink_filter(Arc::new(sink), Arc::default())
}

#[test]
fn a_sinks_object_filter_narrows_the_resources_and_leaving_either_is_left_filter() {
    let mut d = view(Some(NOT_DONE), r#"object.metadata.name.startsWith("pay-")"#);
    let out = list(
        &mut d,
        &[
            pod("pay-1", U1, 10, "Running"),
            pod("pay-2", U2, 11, "Succeeded"),
            pod(
                "shop-1",
                "00000000-0000-4000-8000-000000000003",
                12,
                "Running",
            ),
        ],
    );
    let names: Vec<_> = summary(&out).into_iter().map(|s| (s.0, s.1)).collect();
    assert_eq!(names, vec![(Op::Added, "pay-1".to_owned())]);
    // Leaving the resource's filter: deleted, leftFilter, for this view too.
    let out = d
        .on_event(Event::Applied(obj(&pod("pay-1", U1, 13, "Failed"))))
        .unwrap();
    assert_eq!(
        summary(&out),
        vec![(
            Op::Deleted,
            "pay-1".into(),
            Some(DeleteReason::LeftFilter),
            json!("Failed")
        )]
    );
    // A delete of an object the view never followed sends nothing.
    let out = d
        .on_event(Event::Deleted(obj(&pod(
            "shop-1",
            "00000000-0000-4000-8000-000000000003",
            14,
            "Running",
        ))))
        .unwrap();
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_change_filter_drops_the_changes_it_does_not_match_and_settles_them() {
    let mut d = view(
        None,
        r#"op == "deleted" || object.status.phase == "Failed""#,
    );
    let out = list(
        &mut d,
        &[pod("a", U1, 10, "Running"), pod("b", U2, 11, "Failed")],
    );
    let names: Vec<_> = summary(&out).into_iter().map(|s| (s.0, s.1)).collect();
    assert_eq!(names, vec![(Op::Added, "b".to_owned())]);
    // A dropped change is settled as if delivered; the one sent waits for its sink.
    assert_eq!(
        crate::informer::tracked::acknowledged_keys(&d.store),
        vec![("ns".to_owned(), "a".to_owned(), "10".to_owned())]
    );
    let out = d
        .on_event(Event::Applied(obj(&pod("a", U1, 12, "Failed"))))
        .unwrap();
    assert_eq!(summary(&out)[0].0, Op::Updated);
    // An inferred delete (no object) is seen through a stub of its key.
    let out = list(&mut d, &[pod("b", U2, 11, "Failed")]);
    let names: Vec<_> = summary(&out).into_iter().map(|s| (s.0, s.1)).collect();
    assert_eq!(names, vec![(Op::Deleted, "a".to_owned())]);
    // Counted as the sink's, not the resource's.
    let sink = d.sink_counts.clone().expect("a sink's filter");
    assert_eq!(sink.filtered_out.load(Ordering::Relaxed), 1);
    assert_eq!(d.stats().filtered_out.load(Ordering::Relaxed), 0);
}
