//! The defects the model found, each as its minimal sequence, run with every
//! invariant as stated ([`Strict::ALL`]). All fixed; a new one goes here `#[ignore]`d until
//! it is, with its check tolerated by name meanwhile (`KUBESINK_MODEL_TOLERATE`).

use super::{run_case, Outcome, Setup, Step, Strict};

/// Runs `steps` strictly and panics with the invariant broken and the trace.
fn replay(setup: Setup, steps: &[Step]) {
    if let Err(e) = run_case(setup, Strict::ALL, steps) {
        panic!("{e}");
    }
}

/// The minimal sequence the model found: with two sinks, sink 0 receives `a` at
/// rv 2 while sink 1 has confirmed nothing, so the acknowledged state still says rv 1; the
/// object is deleted and the process crashes before reading the watch's DELETED. The first
/// list after the restart infers the delete with the acknowledged rv 1, and sink 0 receives
/// `deleted` rv 1 after `updated` rv 2 of the same uid: a consumer that ignores messages
/// older than what it holds (per key and uid) keeps a ghost.
#[test]
fn an_inferred_delete_after_a_crash_carries_an_older_resource_version() {
    let setup = Setup {
        sinks: 2,
        coalesce: false,
        max_batch_events: 2,
        markers: false,
        saves: false,
        window: 1,
        filter: false,
    };
    let steps = [
        Step::Create(0),
        Step::Watch(1),
        Step::Update(0),
        Step::Watch(1),
        Step::Delete(0),
        Step::Send {
            sink: 0,
            outcome: Outcome::Ok,
        },
        Step::Crash,
    ];
    replay(setup, &steps);
}

/// The minimal sequence the model found: `a` (uid 1) is delivered and confirmed;
/// the watch sees it re-created (uid 2), which queues the old uid's `deleted` and the new
/// uid's `added`; the process crashes before either is sent. The acknowledged state keeps
/// only the newest `added` of the key (uid 2, unconfirmed) and forgets that uid 1's `deleted`
/// is outstanding (`tracked.rs`, `Acknowledged::for_each`). After the restart `a` is gone:
/// the list infers the `deleted` of uid 2 only, and uid 1's `deleted` never arrives, which
/// the message contract promises ("a re-created object's old-uid `deleted` and the new uid's
/// `added` both arrive"). A destination that removes by key and uid keeps uid 1 forever.
/// The rule: every `deleted` not yet confirmed names its uid in the acknowledged state (a
/// `Former` of the key, `informer/store.rs`), and a restart sends it when its list starts.
#[test]

fn a_crash_between_a_re_creation_and_its_delivery_never_loses_the_old_uids_delete() {
    let setup = Setup {
        sinks: 1,
        coalesce: true,
        max_batch_events: 1,
        markers: false,
        saves: false,
        window: 1,
        filter: false,
    };
    let steps = [
        Step::Create(0),
        Step::Watch(1),
        Step::Send {
            sink: 0,
            outcome: Outcome::Ok,
        },
        Step::Recreate(0),
        Step::Watch(2),
        Step::Crash,
        Step::Delete(0),
    ];
    replay(setup, &steps);
}

/// The minimal sequence the model found: `a` is created and deleted, the watch
/// delivers each and the sink receives each; the watch then restarts two events back (from
/// an older resourceVersion) and replays the ADDED. The key is no longer in the store, so
/// `Decider::stale` has nothing to compare with and the replay is emitted: the destination
/// receives `added` rv 1 after `deleted` rv 2 of the same uid, a deleted object back until
/// the next relist.
#[test]
fn a_replayed_event_of_a_deleted_key_never_resurrects_it() {
    let setup = Setup {
        sinks: 1,
        coalesce: true,
        max_batch_events: 4,
        markers: false,
        saves: false,
        window: 1,
        filter: false,
    };
    let ok = Step::Send {
        sink: 0,
        outcome: Outcome::Ok,
    };
    let steps = [
        Step::Create(0),
        Step::Watch(1),
        ok.clone(),
        Step::Delete(0),
        Step::Watch(1),
        ok.clone(),
        Step::Rewind(2),
        Step::Watch(1),
        ok,
    ];
    replay(setup, &steps);
}

/// The minimal sequence the model found: `a` (uid 1) is delivered; the watch sees
/// it re-created (uid 2) and updated, and one batch carries uid 1's `deleted`, uid 2's
/// `added` rv 3 and `updated` rv 4. Only the `updated` is delivered. `retain_failed` re-sends
/// the failed `deleted` and, behind it, every later message of the key, the superseded
/// `added` rv 3 included: the destination receives rv 3 after rv 4 of the same uid (the key
/// moves backwards until rv 4 arrives again), which `deliver.rs` says a partial retry never
/// does. Skipping a kept message that a later kept one of the same key and uid supersedes
/// would keep the order and the final state.
#[test]
fn a_partial_retry_never_sends_a_state_older_than_one_delivered() {
    let setup = Setup {
        sinks: 1,
        coalesce: false,
        max_batch_events: 4,
        markers: false,
        saves: false,
        window: 1,
        filter: false,
    };
    let steps = [
        Step::Create(0),
        Step::Watch(1),
        Step::Send {
            sink: 0,
            outcome: Outcome::Ok,
        },
        Step::Recreate(0),
        Step::Update(0),
        Step::Watch(3),
        Step::Send {
            sink: 0,
            outcome: Outcome::Partial(0b011),
        },
    ];
    replay(setup, &steps);
}

/// The minimal sequence the model found with the case above handled: `b` (uid 1)
/// is delivered; it is re-created (uid 3) while a half list (an unreadable item: no sweep)
/// proves nothing, so the store still holds uid 1; then the watch brings the DELETED of uid
/// 3. Only uid 3's `deleted` went out, and a destination indexing by uid kept uid 1. The rule: a
/// DELETED of a key held with another uid first sends the held uid's inferred `deleted`.
#[test]
fn a_watch_delete_of_a_key_held_with_another_uid_deletes_the_held_uid_too() {
    let setup = Setup {
        sinks: 1,
        coalesce: false,
        max_batch_events: 1,
        markers: false,
        saves: false,
        window: 1,
        filter: false,
    };
    let steps = [
        Step::Create(1),
        Step::Create(0),
        Step::Relist,
        Step::Recreate(1),
        Step::HalfList(1),
        Step::Delete(1),
        Step::Watch(1),
    ];
    replay(setup, &steps);
}

/// Found by the model with a leader that freezes: `c` is listed and its
/// `added` (rv 1) handed to the client library, the send not confirmed; `c` is updated (rv
/// 2); the leader freezes and a successor takes over from the saved state, lists `c` at rv 2
/// and delivers it; the frozen leader wakes and its handed-over `added` rv 1 lands last. A
/// consumer that applies messages in order holds rv 1: the deposed leader's late publish
/// moved `c` backwards. Every message carries `leaderEpoch`; a consumer that skips a message
/// whose epoch is below one seen for its key (`kubesink fold`, docs/consumers.md) holds rv 2.
/// Run with the epoch rule (passes) and without it (the model must see the late publish).
#[test]
fn a_deposed_leaders_late_publish_is_harmless_only_to_a_consumer_that_honours_epochs() {
    let setup = Setup {
        sinks: 1,
        coalesce: false,
        max_batch_events: 1,
        markers: false,
        saves: false,
        window: 1,
        filter: false,
    };
    let steps = [
        Step::Create(2),
        Step::Watch(1),
        Step::SendTo {
            sink: 0,
            slot: 0,
            outcome: Outcome::Fail,
        },
        Step::Update(2),
        Step::TakeOver,
        Step::SendTo {
            sink: 0,
            slot: 0,
            outcome: Outcome::Ok,
        },
    ];
    replay(setup.clone(), &steps);
    let ignoring_epochs = Strict {
        epochs: false,
        ..Strict::ALL
    };
    let e = run_case(setup, ignoring_epochs, &steps).expect_err("the late publish is seen");
    assert!(
        e.starts_with("invariant 1 (before any repair)") && e.contains("got late from epoch 0"),
        "{e}"
    );
}
