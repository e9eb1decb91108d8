//! Changes and messages for tests: [`change`] and [`meta`], the plainest change and message
//! meta, which a test adjusts with struct update syntax, and a finished message for the tests
//! of the crates that bind it to a protocol (the destination crates' CloudEvents bindings)
//! and of this one. Cargo feature `test-fixtures`, never in a production build.

use std::sync::Arc;

use super::{encode, Change, Message, MessageMeta, ObjectJson, Op, Resource};

/// A change of `op` on object `name` in `namespace` (`None`: cluster-scoped) that carries
/// `object`, or none (then `final_state_unknown`, as for an inferred delete); uid `u`,
/// resourceVersion `1`, not from an initial list, nothing held, replaced, changed or
/// given a reason. A test sets what else it needs as
/// `Change { resource_version: rv.to_string(), ..change(op, ns, name, object) }`.
pub fn change(op: Op, namespace: Option<&str>, name: &str, object: Option<ObjectJson>) -> Change {
    Change {
        op,
        namespace: namespace.map(str::to_owned),
        name: name.to_owned(),
        uid: "u".into(),
        resource_version: "1".into(),
        initial: false,
        final_state_unknown: object.is_none(),
        may_be_held: false,
        replaced_uid: None,
        changed: None,
        changes: None,
        occurrences: None,
        context: None,
        reason: None,
        object,
    }
}

/// The meta of an `added` of object `name` in `namespace` (`None`: cluster-scoped) of
/// `resource`: id 32 zeros, uid `u`, observed at 2026-11-30T00:00:00.000Z, no tombstone and
/// no changed paths. A test sets what else it needs with struct update syntax.
pub fn meta(resource: Arc<Resource>, namespace: Option<&str>, name: &str) -> MessageMeta {
    MessageMeta {
        id: "0".repeat(32).into(),
        tombstone_id: None,
        op: Op::Added,
        resource,
        namespace: namespace.map(Into::into),
        name: name.into(),
        uid: "u".into(),
        observed_at: "2026-11-30T00:00:00.000Z".into(),
        changed: None,
        has_changes: false,
    }
}

/// The message of an `op` on Deployment `web/api` of cluster `prod` (uid `u1`,
/// resourceVersion 7, observed at 2026-11-30T10:00:00.123Z), whose object holds a quoted
/// string, so that escaping shows.
pub fn deployment_message(op: Op) -> Message {
    let r = Arc::new(Resource::new(
        "prod",
        "apps",
        "v1",
        "Deployment",
        "deployments",
        true,
    ));
    let c = Change {
        uid: "u1".into(),
        resource_version: "7".into(),
        ..change(
            op,
            Some("web"),
            "api",
            Some(ObjectJson::from_trusted(r#"{"a":"x \"y\""}"#.into())),
        )
    };
    match encode(&r, &c, "2026-11-30T10:00:00.123Z") {
        Ok(m) => m,
        Err(e) => panic!("the fixture encodes: {e}"),
    }
}
