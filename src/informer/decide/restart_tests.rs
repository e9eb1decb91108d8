//! The decider's restart behaviour, without a server: starting from saved state (the first
//! list is a relist), the acknowledged state it keeps, and the sync markers it leaves.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kubesink_core::message::encode;
use kubesink_core::{Op, Resource};

use super::tests::{decider, obj, pod, summary, synced, U1, U2};
use super::{Decider, Event, Phase};
use crate::config::ResourceConfig;
use crate::informer::payload::Shaper;
use crate::informer::store::LightStore;
use crate::informer::tracked::{acknowledged_keys, unconfirmed_keys, TrackedStore};

/// A copy of `d`'s store, as a state snapshot would carry it.
pub(super) fn saved(d: &Decider) -> LightStore {
    let store = d.store();
    let table = store.namespace_table().to_vec();
    let mut copy = LightStore::new();
    store.for_each(|ns, name, facts| {
        let id = copy.intern(Some(&table[ns as usize]));
        copy.restore(id, name, &facts);
    });
    copy
}

fn over(store: Arc<TrackedStore>, restored: bool) -> Decider {
    let res = ResourceConfig::new("v1", "Pod");
    let resource = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
    let shaper = Shaper::new(&res, "kubesink.io/cluster", "test");
    Decider::with_store(
        resource,
        "all namespaces".into(),
        shaper,
        true,
        store,
        restored,
        Arc::default(),
    )
}

fn restored(store: LightStore) -> Decider {
    over(TrackedStore::new(store, false), true)
}

#[test]
fn a_restored_store_makes_the_first_list_emit_only_differences_never_initial() {
    let before = synced(&[
        pod("same", U1, 1, "v1"),
        pod("changed", U1, 2, "v1"),
        pod("gone", U1, 3, "v1"),
        pod("recreated", U1, 4, "v1"),
    ]);
    let mut d = restored(saved(&before));
    assert_eq!(d.stats().objects.load(Ordering::Relaxed), 4);
    d.on_event(Event::ListStart).unwrap();
    assert!(
        matches!(d.phase(), Phase::Relist { .. }),
        "not an initial list"
    );
    let mut out = Vec::new();
    for p in [
        pod("same", U1, 9, "v1"), // only the resourceVersion moved: nothing
        pod("changed", U1, 10, "v2"),
        pod("new", U1, 11, "v1"),
        pod("recreated", U2, 12, "v1"),
    ] {
        out.extend(d.on_event(Event::Listed(obj(&p))).unwrap());
    }
    out.extend(d.on_event(Event::ListDone { sweep: true }).unwrap());
    assert_eq!(
        summary(&out),
        [
            (Op::Updated, "changed", false, false),
            (Op::Added, "new", false, false),
            (Op::Deleted, "recreated", false, true),
            (Op::Added, "recreated", false, false),
            (Op::Deleted, "gone", false, true),
        ]
    );
    assert_eq!(
        out[4].resource_version, "12",
        "the list that showed it gone: newer than any state a previous run sent"
    );
    assert!(d.stats().synced.load(Ordering::Relaxed));
    assert_eq!(d.store().len(), 4);
}

#[test]
fn an_empty_restored_store_still_lists_without_initial() {
    let mut d = restored(LightStore::new());
    d.on_event(Event::ListStart).unwrap();
    let c = d
        .on_event(Event::Listed(obj(&pod("a", U1, 1, "v1"))))
        .unwrap();
    assert_eq!(summary(&c), [(Op::Added, "a", false, false)]);
}

#[test]
fn sync_markers_close_each_list_with_its_count_and_whether_it_was_complete() {
    let mut d = decider(ResourceConfig::new("v1", "Pod")).with_sync_markers(None);
    d.on_event(Event::ListStart).unwrap();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        d.on_event(Event::Listed(obj(&pod(name, U1, 10 + i as u64, "v1"))))
            .unwrap();
        assert_eq!(d.take_synced(), None, "only at the end of a list");
    }
    d.on_event(Event::ListDone { sweep: true }).unwrap();
    let m = d.take_synced().expect("a marker after the initial list");
    assert_eq!(
        (m.count, m.resource_version.as_str(), m.initial, m.namespace),
        (3, "12", true, None)
    );
    assert_eq!(d.take_synced(), None, "taken once");
    d.on_event(Event::Applied(obj(&pod("d", U1, 13, "v1"))))
        .unwrap();
    assert_eq!(d.take_synced(), None, "watch events leave none");
    // A relist that misses b: the sweep deletes it, and the marker counts what is left.
    d.on_event(Event::ListStart).unwrap();
    for (name, rv) in [("a", 10), ("c", 12), ("d", 13)] {
        d.on_event(Event::Listed(obj(&pod(name, U1, rv, "v1"))))
            .unwrap();
    }
    d.note_list_resource_version("20");
    let sweep = d.on_event(Event::ListDone { sweep: true }).unwrap();
    assert_eq!(summary(&sweep), [(Op::Deleted, "b", false, true)]);
    let m = d.take_synced().unwrap();
    assert_eq!(
        (m.count, m.resource_version.as_str(), m.initial),
        (3, "20", false)
    );
    // Without markers, nothing.
    let mut plain = synced(&[pod("a", U1, 1, "v1")]);
    assert_eq!(plain.take_synced(), None);
    // From saved state: differences only, so not a complete list.
    let mut r = restored(saved(&plain)).with_sync_markers(Some("ns".into()));
    r.on_event(Event::ListStart).unwrap();
    r.on_event(Event::ListDone { sweep: true }).unwrap();
    let m = r.take_synced().unwrap();
    assert_eq!(
        (m.count, m.initial, m.namespace.as_deref()),
        (0, false, Some("ns"))
    );
}

fn emit(d: &mut Decider, ev: Event<'_>, acks: &mut Vec<crate::pipeline::Ack>) {
    let r = Arc::new(Resource::new("test", "", "v1", "Pod", "pods", true));
    for c in d.on_event(ev).unwrap() {
        let msg = encode(&r, &c, "2026-11-30T00:00:00.000Z").unwrap();
        let ack = futures::executor::block_on(d.ack(&msg, &c.resource_version, 2));
        acks.push(ack.unwrap());
    }
}

/// Both sinks (`emit` acknowledges for two) settle every change in `acks`.
fn settle_all(acks: &mut Vec<crate::pipeline::Ack>) {
    for a in acks.drain(..) {
        a.settle();
        a.settle();
    }
}

/// A decider over a tracked store after its first list of `pods`, and the acknowledgements
/// of what it emitted, none settled.
fn listed_tracked(pods: &[String]) -> (Arc<TrackedStore>, Decider, Vec<crate::pipeline::Ack>) {
    let store = TrackedStore::new(LightStore::new(), true);
    let mut d = over(store.clone(), false);
    let mut acks = Vec::new();
    emit(&mut d, Event::ListStart, &mut acks);
    for p in pods {
        emit(&mut d, Event::Listed(obj(p)), &mut acks);
    }
    emit(&mut d, Event::ListDone { sweep: true }, &mut acks);
    (store, d, acks)
}

#[test]
fn the_acknowledged_state_follows_only_settled_changes() {
    let (store, mut d, mut acks) = listed_tracked(&[pod("a", U1, 1, "v1"), pod("b", U1, 2, "v1")]);
    assert_eq!(acknowledged_keys(&store), [], "nothing confirmed yet");
    let ack = |name: &str, rv: &str| ("ns".to_owned(), name.to_owned(), rv.to_owned());
    assert_eq!(
        unconfirmed_keys(&store),
        [ack("a", "1"), ack("b", "2")],
        "sent, so downstream may have them"
    );
    settle_all(&mut acks);
    assert_eq!(unconfirmed_keys(&store), []);
    assert_eq!(acknowledged_keys(&store), [ack("a", "1"), ack("b", "2")]);
    // An update and a delete in flight: the acknowledged state keeps the confirmed facts.
    emit(
        &mut d,
        Event::Applied(obj(&pod("a", U1, 3, "v2"))),
        &mut acks,
    );
    emit(
        &mut d,
        Event::Deleted(obj(&pod("b", U1, 4, "v1"))),
        &mut acks,
    );
    assert_eq!(acknowledged_keys(&store), [ack("a", "1"), ack("b", "2")]);
    assert_eq!(store.outstanding(), 2);
    for a in acks.drain(..) {
        a.settle();
    }
    assert_eq!(
        acknowledged_keys(&store),
        [ack("a", "1"), ack("b", "2")],
        "one sink of two"
    );
    let update = d
        .on_event(Event::Applied(obj(&pod("a", U1, 5, "v3"))))
        .unwrap();
    assert_eq!(update.len(), 1);
    d.abandon(&update[0]); // never published
    assert_eq!(
        store.outstanding(),
        2,
        "a still has its earlier change outstanding"
    );
    // A relist sweep is a change too.
    emit(&mut d, Event::ListStart, &mut acks);
    emit(&mut d, Event::ListDone { sweep: true }, &mut acks);
    assert_eq!(acknowledged_keys(&store), [ack("a", "1"), ack("b", "2")]);
    assert_eq!(store.outstanding(), 2);
}

#[test]
fn unconfirmed_keys_are_sent_again_when_listed_and_deleted_when_gone() {
    use crate::informer::facts::{Facts, Rv, Uid};
    // A previous run sent "kept" and "gone" as `added` (its journal says so) without every
    // sink's confirmation, and "known" was confirmed.
    let mut saved = saved(&synced(&[pod("known", U1, 1, "v1")]));
    let ns = saved.intern(Some("ns"));
    for (name, rv) in [("kept", "2"), ("gone", "3")] {
        saved.restore(ns, name, &Facts::unconfirmed(Uid::parse(U2), Rv::parse(rv)));
    }
    let store = TrackedStore::new(saved, true);
    let mut d = over(store.clone(), true);
    let mut acks = Vec::new();
    emit(&mut d, Event::ListStart, &mut acks);
    for p in [pod("known", U1, 1, "v1"), pod("kept", U2, 2, "v1")] {
        emit(&mut d, Event::Listed(obj(&p)), &mut acks);
    }
    d.note_list_resource_version("9");
    let before_sweep = acks.len();
    emit(&mut d, Event::ListDone { sweep: true }, &mut acks);
    assert_eq!(
        (before_sweep, acks.len()),
        (1, 2),
        "kept re-sent, gone deleted"
    );
    let key = |name: &str, rv: &str| ("ns".to_owned(), name.to_owned(), rv.to_owned());
    // Until confirmed, both stay unconfirmed in what a save would write.
    assert_eq!(
        unconfirmed_keys(&store),
        [key("gone", "3"), key("kept", "2")]
    );
    settle_all(&mut acks);
    assert_eq!(unconfirmed_keys(&store), []);
    assert_eq!(
        acknowledged_keys(&store),
        [key("kept", "2"), key("known", "1")]
    );
}

#[test]
fn the_changes_for_unconfirmed_keys_are_an_add_and_an_inferred_delete() {
    use crate::informer::facts::{Facts, Rv, Uid};
    let mut saved = LightStore::new();
    let ns = saved.intern(Some("ns"));
    for name in ["kept", "gone", "recreated"] {
        saved.restore(
            ns,
            name,
            &Facts::unconfirmed(Uid::parse(U1), Rv::parse("5")),
        );
    }
    let mut d = restored(saved);
    d.on_event(Event::ListStart).unwrap();
    let mut out = Vec::new();
    for p in [pod("kept", U1, 5, "v1"), pod("recreated", U2, 8, "v1")] {
        out.extend(d.on_event(Event::Listed(obj(&p))).unwrap());
    }
    out.extend(d.on_event(Event::ListDone { sweep: true }).unwrap());
    assert_eq!(
        summary(&out),
        [
            (Op::Added, "kept", false, false),
            (Op::Deleted, "recreated", false, true),
            (Op::Added, "recreated", false, false),
            (Op::Deleted, "gone", false, true),
        ]
    );
    assert_eq!(
        (out[1].uid.as_str(), out[3].resource_version.as_str()),
        (U1, "8"),
        "the inferred delete carries the list's resourceVersion"
    );
}

#[test]
fn a_re_sent_unconfirmed_key_may_be_held_even_when_the_watch_brings_it() {
    use crate::informer::facts::{Facts, Rv, Uid};
    // "kept" was sent by a crashed run and never confirmed; the first list is a half list
    // (an unreadable item without a key: no sweep), so it stays unconfirmed until the watch
    // brings it. Its `added` may repeat one downstream holds: never cancellable.
    let mut saved = LightStore::new();
    let ns = saved.intern(Some("ns"));
    saved.restore(
        ns,
        "kept",
        &Facts::unconfirmed(Uid::parse(U2), Rv::parse("2")),
    );
    let mut d = over(TrackedStore::new(saved, false), true);
    d.on_event(Event::ListStart).unwrap();
    d.on_event(Event::ListDone { sweep: false }).unwrap();
    let c = d
        .on_event(Event::Applied(obj(&pod("kept", U2, 3, "v1"))))
        .unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].op, Op::Added);
    assert!(c[0].may_be_held);
    // A key the watch creates now is new to every destination.
    let c = d
        .on_event(Event::Applied(obj(&pod("fresh", U1, 4, "v1"))))
        .unwrap();
    assert!(!c[0].may_be_held);
}

/// A store rebuilt from `store`'s acknowledged state in the order a snapshot writes it.
fn saved_acknowledged(store: &TrackedStore) -> LightStore {
    store.acknowledged(|a| {
        let table = a.namespaces().to_vec();
        let mut copy = LightStore::new();
        a.for_each(|ns, name, facts| {
            let id = copy.intern(Some(&table[ns as usize]));
            copy.restore(id, name, facts);
        });
        copy
    })
}

/// "a" listed as U1 and confirmed, then seen re-created as U2 by the watch: the tracked
/// store, the decider and the two unsettled acknowledgements (the old uid's `deleted`, the
/// new uid's `added`).
fn recreated_unsettled() -> (Arc<TrackedStore>, Decider, Vec<crate::pipeline::Ack>) {
    let (store, mut d, mut acks) = listed_tracked(&[pod("a", U1, 1, "v1")]);
    settle_all(&mut acks);
    emit(
        &mut d,
        Event::Applied(obj(&pod("a", U2, 3, "v1"))),
        &mut acks,
    );
    assert_eq!(acks.len(), 2, "the old uid's deleted, the new uid's added");
    (store, d, acks)
}

#[test]
fn a_crash_before_a_re_creation_is_delivered_still_sends_the_old_uids_delete() {
    // The model test's case: "a" (U1) is confirmed; the watch sees it
    // re-created (U2), and neither the old uid's `deleted` nor the new uid's `added` is
    // confirmed when the process crashes. A destination may hold U1, U2 or both.
    let (store, _d, _acks) = recreated_unsettled();
    let named = store.acknowledged(|a| {
        let mut v = Vec::new();
        a.for_each(|_, name, f| v.push((name.to_owned(), f.uid.render(), f.unconfirmed)));
        v
    });
    assert_eq!(
        named,
        [("a".into(), U1.into(), true), ("a".into(), U2.into(), true)],
        "the saved state names both uids, the former first"
    );

    // Restarted from it, with "a" gone meanwhile: both uids' deletes, the old one first,
    // sent when the list starts, carrying the newer uid's resourceVersion.
    let restarted = TrackedStore::new(saved_acknowledged(&store), true);
    let mut d = over(restarted.clone(), true);
    let first = d.on_event(Event::ListStart).unwrap();
    assert_eq!(
        summary(&first),
        [(Op::Deleted, "a", false, true)],
        "owed at once"
    );
    assert_eq!(
        (first[0].uid.as_str(), first[0].resource_version.as_str()),
        (U1, "3")
    );
    d.note_list_resource_version("9");
    let swept = d.on_event(Event::ListDone { sweep: true }).unwrap();
    assert_eq!(
        (summary(&swept), swept[0].uid.as_str()),
        (vec![(Op::Deleted, "a", false, true)], U2)
    );
    // A list that starts again (the first failed half-way) owes nothing more.
    assert_eq!(d.on_event(Event::ListStart).unwrap(), []);

    // And with "a" still there (U2): the old uid's delete, then the re-sent `added`.
    let restarted = TrackedStore::new(saved_acknowledged(&store), true);
    let mut d = over(restarted.clone(), true);
    let mut acks = Vec::new();
    emit(&mut d, Event::ListStart, &mut acks);
    emit(
        &mut d,
        Event::Listed(obj(&pod("a", U2, 3, "v1"))),
        &mut acks,
    );
    emit(&mut d, Event::ListDone { sweep: true }, &mut acks);
    assert_eq!(acks.len(), 2, "deleted U1, added U2 again");
    let formers = |s: &TrackedStore| {
        s.acknowledged(|a| {
            let mut n = 0;
            a.for_each(|_, _, f| n += usize::from(f.uid.render() == U1));
            n
        })
    };
    assert_eq!(formers(&restarted), 1, "named until every sink settled it");
    settle_all(&mut acks);
    assert_eq!(formers(&restarted), 0);
    assert_eq!(
        acknowledged_keys(&restarted),
        [("ns".to_owned(), "a".to_owned(), "3".to_owned())]
    );
}

#[test]
fn after_an_owed_delete_the_keys_object_goes_out_again_as_an_added_naming_the_old_uid() {
    // Found by scripts/chaos.sh (seed 45401): "a" (U1) confirmed, re-created (U2); the new
    // uid's `added` is confirmed, the old uid's `deleted` is not, then the crash. The restart
    // owes U1's `deleted`; U2 is confirmed and unchanged, so the list said nothing of it,
    // and a destination folding by key ended with the `deleted`: the live object lost.
    // (With both unconfirmed, the re-sent `added` had the previous run's id, and JetStream
    // dropped it as a duplicate: the same end.)
    let (store, _d, mut acks) = recreated_unsettled();
    let added = acks.pop().unwrap();
    added.settle();
    added.settle();

    let restarted = TrackedStore::new(saved_acknowledged(&store), true);
    let mut d = over(restarted, true);
    let first = d.on_event(Event::ListStart).unwrap();
    assert_eq!(
        (summary(&first), first[0].uid.as_str()),
        (vec![(Op::Deleted, "a", false, true)], U1),
        "the owed delete"
    );
    let listed = d
        .on_event(Event::Listed(obj(&pod("a", U2, 3, "v1"))))
        .unwrap();
    assert_eq!(summary(&listed), [(Op::Added, "a", false, false)]);
    assert_eq!(
        (listed[0].uid.as_str(), listed[0].replaced_uid.as_deref()),
        (U2, Some(U1)),
        "the added names the uid whose delete came first, so its id is its own"
    );
    assert!(listed[0].may_be_held);
    // Once: the key's next change is plain again.
    let next = d
        .on_event(Event::Listed(obj(&pod("a", U2, 4, "v2"))))
        .unwrap();
    assert_eq!(
        (summary(&next), next[0].replaced_uid.as_deref()),
        (vec![(Op::Updated, "a", false, false)], None)
    );
}
