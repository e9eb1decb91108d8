//! A topology message for the tests of the crates that bind it to a protocol (the destination
//! crates' CloudEvents bindings) and of this one: cargo feature `test-fixtures`, never in a
//! production build.

use std::sync::Arc;

use super::{encode, Change, Message, ObjectJson, Op, Resource};

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
        op,
        namespace: Some("web".into()),
        name: "api".into(),
        uid: "u1".into(),
        resource_version: "7".into(),
        initial: false,
        final_state_unknown: false,
        may_be_held: false,
        replaced_uid: None,
        changed: None,
        changes: None,
        reason: None,
        object: Some(ObjectJson::from_trusted(r#"{"a":"x \"y\""}"#.into())),
    };
    match encode(&r, &c, "2026-11-30T10:00:00.123Z") {
        Ok(m) => m,
        Err(e) => panic!("the fixture encodes: {e}"),
    }
}
