//! Events mode without a server: each message's `occurrences` is what the Event's count
//! rose by since its previous message, so their sum per Event equals its count, through a
//! first start (`since`), updates, a deletion by TTL and a restart from saved state.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kubesink_core::message::{encode, Change};
use kubesink_core::{Op, Resource};
use serde_json::{json, Value};

use super::filter_tests::list;
use super::restart_tests::saved;
use super::tests::{obj, over_store, U1, U2};
use super::{Decider, Event};
use crate::config::{ResourceConfig, ResourceMode, Since};
use crate::informer::occurrence::Occurrences;
use crate::informer::store::LightStore;

fn events_config(since: Since, send_deleted: bool) -> ResourceConfig {
    let mut res = ResourceConfig::new("events.k8s.io/v1", "Event");
    res.mode = ResourceMode::Events;
    res.since = Some(since);
    res.send_deleted = send_deleted;
    res
}

fn decider_over(res: &ResourceConfig, store: Option<LightStore>) -> Decider {
    let resource =
        Resource::new("test", "events.k8s.io", "v1", "Event", "events", true).with_events(true);
    over_store(resource, res, store).with_occurrences(Occurrences::of(res).expect("events mode"))
}

/// An `events.k8s.io/v1` Event that happened `count` times, the last `ago` before now.
fn event(name: &str, uid: &str, rv: u64, count: u64, ago: Duration) -> String {
    let last = humantime::format_rfc3339_micros(SystemTime::now() - ago).to_string();
    let mut v = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv.to_string()},
        "eventTime": last, "reportingController": "kubelet", "reportingInstance": "node-1",
        "action": "Pulling", "reason": "BackOff", "type": "Warning", "note": "Back-off pulling image",
        "regarding": {"kind": "Pod", "namespace": "ns", "name": "web-1", "uid": U2, "apiVersion": "v1"}
    });
    if count > 1 {
        v["series"] = json!({"count": count, "lastObservedTime": last});
    }
    v.to_string()
}

/// (op, name, occurrences) of each change.
fn said(changes: &[Change]) -> Vec<(Op, String, Option<u64>)> {
    changes
        .iter()
        .map(|c| (c.op, c.name.clone(), c.occurrences))
        .collect()
}

const MIN: Duration = Duration::from_secs(60);

#[test]
fn a_first_start_sends_the_events_newer_than_since_and_every_later_occurrence_of_the_others() {
    let mut d = decider_over(&events_config(Since::DEFAULT, false), None);
    let old = event("old", U1, 10, 40, 60 * MIN);
    let new = event("new", U2, 11, 3, MIN);
    assert_eq!(
        said(&list(&mut d, &[old, new])),
        [(Op::Added, "new".into(), Some(3))],
        "only the Event of the last 5 minutes, with its whole count"
    );
    // The old Event happens again: its first occurrences were long ago (the exporter's
    // #196 discarded such updates by their first timestamp); the two new ones are sent.
    let again = event("old", U1, 12, 42, Duration::ZERO);
    assert_eq!(
        said(&d.on_event(Event::Applied(obj(&again))).unwrap()),
        [(Op::Updated, "old".into(), Some(2))]
    );
}

#[test]
fn since_all_sends_every_existing_event_and_since_zero_none() {
    let events = [
        event("a", U1, 10, 40, 600 * MIN),
        event("b", U2, 11, 1, Duration::ZERO),
    ];
    let mut all = decider_over(&events_config(Since::All, false), None);
    assert_eq!(
        said(&list(&mut all, &events)),
        [
            (Op::Added, "a".into(), Some(40)),
            (Op::Added, "b".into(), Some(1))
        ]
    );
    let none = Since::Within(Duration::ZERO.into());
    let mut none = decider_over(&events_config(none, false), None);
    assert_eq!(said(&list(&mut none, &events)), []);
}

#[test]
fn each_count_bump_says_how_many_occurrences_and_nothing_else_is_sent() {
    let mut d = decider_over(&events_config(Since::All, false), None);
    list(&mut d, &[event("e", U1, 10, 5, MIN)]);
    let bump = event("e", U1, 11, 8, Duration::ZERO);
    assert_eq!(
        said(&d.on_event(Event::Applied(obj(&bump))).unwrap()),
        [(Op::Updated, "e".into(), Some(3))],
        "5 -> 8 is three more occurrences"
    );
    // An edit that leaves the count (the same occurrence written again) sends nothing.
    let mut same: Value = serde_json::from_str(&bump).unwrap();
    same["metadata"]["resourceVersion"] = json!("12");
    same["note"] = json!("Back-off pulling image again");
    assert_eq!(
        said(&d.on_event(Event::Applied(obj(&same.to_string()))).unwrap()),
        []
    );
    // The Event's TTL: its deletion is not an occurrence.
    let gone = event("e", U1, 13, 8, Duration::ZERO);
    assert_eq!(said(&d.on_event(Event::Deleted(obj(&gone))).unwrap()), []);
    assert_eq!(d.store().len(), 0);
}

#[test]
fn send_deleted_sends_an_events_deletion_without_occurrences() {
    let mut d = decider_over(&events_config(Since::All, true), None);
    list(&mut d, &[event("e", U1, 10, 2, MIN)]);
    let gone = d
        .on_event(Event::Deleted(obj(&event("e", U1, 11, 2, MIN))))
        .unwrap();
    assert_eq!(said(&gone), [(Op::Deleted, "e".into(), None)]);
    // A sweep after a relist too (an Event deleted while the watch was down).
    list(&mut d, &[event("f", U2, 12, 1, MIN)]);
    let swept = list(&mut d, &[]);
    assert_eq!(said(&swept), [(Op::Deleted, "f".into(), None)]);
    assert!(swept[0].final_state_unknown);
}

#[test]
fn a_restart_sends_only_what_happened_while_kubesink_was_down() {
    let mut before = decider_over(&events_config(Since::All, false), None);
    list(
        &mut before,
        &[
            event("same", U1, 10, 4, 600 * MIN),
            event("grew", U2, 11, 2, 600 * MIN),
        ],
    );
    let state = saved(&before);
    let mut after = decider_over(&events_config(Since::DEFAULT, false), Some(state));
    // The saved state completed a list (its resourceVersion is saved with it).
    after.store.lock().list_resource_version = "11".into();
    let grew = event("grew", U2, 20, 7, Duration::ZERO);
    // Created while down, and hours old: a start from saved state is not a first start,
    // `since` does not apply.
    let new = event(
        "new",
        "11111111-2222-4333-8444-555555555555",
        21,
        3,
        600 * MIN,
    );
    let same = event("same", U1, 10, 4, 600 * MIN);
    let got = list(&mut after, &[same, grew, new]);
    assert_eq!(
        said(&got),
        [
            (Op::Updated, "grew".into(), Some(5)),
            (Op::Added, "new".into(), Some(3))
        ],
        "no Event sent again; the count that rose sends its difference; none initial"
    );
    assert!(got.iter().all(|c| !c.initial));
}

#[test]
fn a_crash_before_the_first_save_leaves_out_again_what_the_first_start_left_out() {
    let config = events_config(Since::DEFAULT, false);
    let mut first = decider_over(&config, None);
    let old = event("old", U1, 10, 40, 60 * MIN);
    let new = event("new", U2, 11, 3, MIN);
    let sent = list(&mut first, &[old.clone(), new.clone()]);
    assert_eq!(said(&sent), [(Op::Added, "new".into(), Some(3))]);
    // Killed before its first save: what restarts is its journal alone, the `added` of
    // "new" (unconfirmed), and no completed list.
    let mut journal = LightStore::new();
    let id = journal.intern(Some("ns"));
    journal.restore(
        id,
        "new",
        &crate::informer::Facts::unconfirmed(
            crate::informer::Uid::parse(U2),
            crate::informer::Rv::parse("11"),
        ),
    );
    let mut after = decider_over(&config, Some(journal));
    let again = list(&mut after, &[old, new]);
    assert_eq!(
        said(&again),
        [(Op::Added, "new".into(), Some(3))],
        "the unconfirmed Event re-sent (the same message), the old one still left out"
    );
    let resource =
        Resource::new("test", "events.k8s.io", "v1", "Event", "events", true).with_events(true);
    assert_eq!(
        kubesink_core::message::message_id(&resource, &again[0]),
        kubesink_core::message::message_id(&resource, &sent[0]),
        "the same id: a consumer that has it counts it once"
    );
    assert_eq!(
        first
            .stats()
            .events_before_since
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        after
            .stats()
            .events_before_since
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn an_occurrence_message_carries_the_event_and_its_occurrences_in_place_of_the_object() {
    let mut d = decider_over(&events_config(Since::All, false), None);
    let changes = list(&mut d, &[event("e", U1, 10, 6, MIN)]);
    let resource = Arc::new(
        Resource::new("test", "events.k8s.io", "v1", "Event", "events", true).with_events(true),
    );
    let msg = encode(&resource, &changes[0], "2026-12-07T10:00:00.000Z").unwrap();
    let v: Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(v["occurrences"], 6);
    assert!(v.get("object").is_none(), "{v}");
    assert_eq!(v["event"]["count"], 6);
    assert_eq!(v["event"]["reason"], "BackOff");
    assert_eq!(v["event"]["regarding"]["name"], "web-1");
    assert_eq!(
        kubesink_core::message::cloudevents::attributes(&msg)[3].1,
        "io.kubesink.event.added"
    );
    assert_eq!(kubesink_core::message::occurrences_of(&msg), Some(6));
}
