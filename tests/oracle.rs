//! The shared oracle (`support/oracle.rs`) sees each kind of bug it exists for: a wrong op,
//! a wrong uid, a duplicate, a key going backwards, an id that is not the change's; and lets
//! through what the contract allows (coalesced `added`s, redelivery where the test expects it,
//! the re-list of a stateless restart).

use kubesink_test_support as support;

use serde_json::{json, Value};
use support::{fold, fold_expecting, Expect, Oracle};

/// A message of Pod `default/{name}` with the documented id.
fn msg(op: &str, name: &str, uid: &str, rv: &str) -> Value {
    let fsu = op == "deleted" && rv.ends_with('!');
    let rv = rv.trim_end_matches('!');
    let raw = format!(
        "c\0\0Pod\0default\0{name}\0{uid}\0{rv}\0{op}\0{}\0",
        if fsu { "fsu" } else { "" }
    );
    let id = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(raw.as_bytes()));
    let mut m = json!({"id": id, "op": op, "key": format!("c/core/Pod/default/{name}"),
        "cluster": "c", "group": "", "apiVersion": "v1", "kind": "Pod", "resource": "pods",
        "namespace": "default", "name": name, "uid": uid, "resourceVersion": rv,
        "initial": false, "finalStateUnknown": fsu, "observedAt": "2026-12-01T00:00:00.000Z"});
    if !fsu {
        m["object"] = json!({"metadata": {"name": name, "uid": uid, "resourceVersion": rv}});
    }
    m
}

fn violations(msgs: &[Value], expect: Expect) -> Vec<String> {
    let mut o = Oracle::new(expect);
    for m in msgs {
        o.apply(m);
    }
    o.violations().to_vec()
}

/// Exactly one violation, containing `what` and naming the key.
fn one(msgs: &[Value], expect: Expect, what: &str) {
    let v = violations(msgs, expect);
    assert_eq!(v.len(), 1, "want one violation ({what}): {v:#?}");
    assert!(v[0].contains(what), "{v:#?}");
    assert!(v[0].starts_with("c/core/Pod/default/"), "{v:#?}");
}

#[test]
fn a_correct_stream_folds_to_the_live_objects() {
    let msgs = [
        msg("added", "a", "u1", "1"),
        msg("updated", "a", "u1", "3"),
        msg("added", "b", "u2", "2"),
        msg("deleted", "b", "u2", "4"),
        // `a` re-created: the old uid's inferred delete, then the new uid.
        msg("deleted", "a", "u1", "3!"),
        msg("added", "a", "u3", "5"),
        // A coalesced `added` arrives as `updated`.
        msg("updated", "c", "u4", "7"),
        json!({"op": "synced", "cluster": "c", "kind": "Pod", "id": "m"}),
    ];
    let f = fold(&msgs);
    let keys: Vec<(&str, &str)> = f
        .iter()
        .map(|(k, rv)| (k.2.as_str(), rv.as_str()))
        .collect();
    assert_eq!(keys, [("a", "5"), ("c", "7")]);
}

#[test]
#[should_panic(expected = "added for a key already present")]
fn fold_panics_on_a_violation() {
    fold(&[msg("added", "a", "u1", "1"), msg("added", "a", "u1", "2")]);
}

#[test]
fn a_wrong_op_is_a_violation() {
    let s = Expect::STRICT;
    one(
        &[msg("added", "a", "u1", "1"), msg("added", "a", "u1", "2")],
        s,
        "added for a key already present",
    );
    one(
        &[
            msg("added", "a", "u1", "1"),
            msg("deleted", "a", "u1", "2"),
            msg("deleted", "a", "u1", "3"),
        ],
        s,
        "deleted again for a key already deleted",
    );
    // The delete of a uid the stream never carried: an `added` an earlier run may have
    // delivered, never cancelled, so its `deleted` goes alone.
    assert!(violations(&[msg("deleted", "a", "u1", "1")], s).is_empty());
    one(
        &[msg("updated", "a", "u1", "1")],
        s.uncoalesced(),
        "updated for an absent key",
    );
    one(
        &[
            msg("added", "a", "u1", "1"),
            msg("deleted", "a", "u1", "2"),
            msg("updated", "a", "u1", "3"),
        ],
        s,
        "updated of a uid already deleted",
    );
    one(
        &[json!({"op": "resized", "key": "c/core/Pod/default/a"})],
        s,
        "unknown op",
    );
}

#[test]
fn a_uid_change_without_a_delete_is_a_violation() {
    let s = Expect::STRICT;
    one(
        &[msg("added", "a", "u1", "1"), msg("added", "a", "u2", "2")],
        s,
        "uid changed from u1 without a delete",
    );
    one(
        &[msg("added", "a", "u1", "1"), msg("updated", "a", "u2", "2")],
        s,
        "uid changed from u1 without a delete",
    );
    one(
        &[msg("added", "a", "u1", "1"), msg("deleted", "a", "u2", "2")],
        s,
        "deleted of uid u2 while u1 is present",
    );
}

#[test]
fn a_resource_version_going_back_is_a_violation() {
    one(
        &[
            msg("added", "a", "u1", "10"),
            msg("updated", "a", "u1", "9"),
        ],
        Expect::STRICT,
        "resourceVersion went back from 10",
    );
    // Decimal, not lexicographic: 9 → 10 is forward.
    assert!(violations(
        &[
            msg("added", "a", "u1", "9"),
            msg("updated", "a", "u1", "10")
        ],
        Expect::STRICT
    )
    .is_empty());
}

#[test]
fn a_duplicate_is_a_violation_unless_redelivery_is_expected() {
    let a1 = msg("added", "a", "u1", "1");
    let mut again = a1.clone();
    again["observedAt"] = json!("2026-12-01T00:00:01.000Z");
    one(
        &[a1.clone(), again.clone()],
        Expect::STRICT,
        "duplicate of #0",
    );
    assert!(violations(&[a1.clone(), again.clone()], Expect::STRICT.redelivery()).is_empty());
    // Even with redelivery, a repeat after a newer message of the key is one.
    one(
        &[a1.clone(), msg("updated", "a", "u1", "2"), again],
        Expect::STRICT.redelivery(),
        "repeat of #0 after a newer message",
    );
    // A redelivered delete of an absent key is a duplicate, not a delete of an absent key.
    let d = msg("deleted", "a", "u1", "2");
    assert!(violations(&[a1, d.clone(), d], Expect::STRICT.redelivery()).is_empty());
}

#[test]
fn an_id_is_its_documented_derivation_and_names_one_change() {
    let mut wrong = msg("added", "a", "u1", "1");
    wrong["id"] = json!("0123456789abcdef0123456789abcdef");
    one(&[wrong], Expect::STRICT, "not the documented derivation");
    let a1 = msg("added", "a", "u1", "1");
    let mut other = a1.clone();
    other["object"]["spec"] = json!({"x": 1});
    one(
        &[a1, other],
        Expect::STRICT.redelivery(),
        "carries two different changes (fields [\"object\"] differ)",
    );
}

#[test]
fn a_stateless_restart_may_re_list_over_present_keys() {
    let relisted = |m: Value| {
        let mut m = m;
        m["initial"] = json!(true);
        m
    };
    let msgs = [
        relisted(msg("added", "a", "u1", "1")),
        msg("updated", "a", "u1", "2"),
        relisted(msg("added", "b", "u2", "3")),
        // Restart: `a` re-listed at its last state (another op, so another id), `b` unchanged
        // (the same id again), `b` then re-created while down, seen only by the next list.
        relisted(msg("added", "a", "u1", "2")),
        relisted(msg("added", "b", "u2", "3")),
        relisted(msg("added", "b", "u3", "4")),
    ];
    assert!(violations(&msgs, Expect::STRICT.restarts()).is_empty());
    let f = fold_expecting(&msgs, Expect::STRICT.restarts());
    assert_eq!(f.len(), 2);
    assert!(violations(&msgs, Expect::STRICT).len() >= 3);
}

#[test]
fn after_a_restart_a_delete_may_come_again_inferred_with_the_last_acknowledged_version() {
    // The process that saw the delete crashed before its state acknowledged it: the next one
    // infers the delete, with the resourceVersion it last acknowledged.
    let msgs = [
        msg("added", "a", "u1", "5"),
        msg("deleted", "a", "u1", "9"),
        msg("deleted", "a", "u1", "5!"),
    ];
    let mut o = Oracle::new(Expect::STRICT.restarts());
    for m in &msgs {
        o.apply(m);
    }
    assert!(o.violations().is_empty(), "{:#?}", o.violations());
    assert_eq!(o.notes().len(), 1, "tolerated, and said so");
    let v = violations(&msgs, Expect::STRICT);
    assert!(
        v.iter()
            .any(|v| v.contains("deleted again for a key already deleted")),
        "{v:#?}"
    );
    assert!(
        v.iter()
            .any(|v| v.contains("resourceVersion went back from 9")),
        "{v:#?}"
    );
}

#[test]
fn the_changed_oracle_sees_a_missing_or_extra_path_and_lets_a_coalesced_extra_through() {
    use support::{check_changed, Changed};
    let obj = |replicas: u32, phase: &str| {
        json!({"metadata": {"name": "a", "resourceVersion": replicas.to_string(),
            "labels": {"x": "1"}}, "spec": {"replicas": replicas}, "status": {"phase": phase}})
    };
    let added = json!({"key": "k", "op": "added", "object": obj(1, "Pending")});
    let updated = |changed: Value| {
        json!({"key": "k", "op": "updated", "resourceVersion": "2", "changed": changed,
            "object": obj(2, "Pending")})
    };
    assert_eq!(
        check_changed(&[added.clone(), updated(json!(["spec"]))], Changed::Exact),
        Ok(1)
    );
    // One miss is within the collision rate; two are not.
    let twice = |changed: Value| {
        let mut again = updated(changed.clone());
        again["object"]["spec"]["replicas"] = json!(3);
        vec![added.clone(), updated(changed), again]
    };
    assert_eq!(
        check_changed(&twice(json!(["spec"])), Changed::Exact),
        Ok(2)
    );
    assert!(check_changed(&twice(json!(["status"])), Changed::Covers).is_err());
    assert_eq!(
        check_changed(
            &[added.clone(), updated(json!(["status"]))],
            Changed::Covers
        ),
        Ok(1)
    );
    for (changed, mode) in [
        (json!([]), Changed::Covers),
        (json!(["spec", "status"]), Changed::Exact),
    ] {
        assert!(
            check_changed(&[added.clone(), updated(changed.clone())], mode).is_err(),
            "{changed} {mode:?}"
        );
    }
    assert_eq!(
        check_changed(
            &[added.clone(), updated(json!(["spec", "status"]))],
            Changed::Covers
        ),
        Ok(1)
    );
    let mut unknown = updated(Value::Null);
    unknown.as_object_mut().unwrap().remove("changed");
    assert!(check_changed(&[added.clone(), unknown.clone()], Changed::Exact).is_err());
    assert!(check_changed(&[added.clone(), unknown.clone()], Changed::Covers).is_err());
    assert_eq!(
        check_changed(&[added, unknown], Changed::CoversOrUnknown),
        Ok(1)
    );
}
