//! Raw inserts: objects stored without validation or defaulting, so clients can be tested
//! against objects that break the API conventions (no `metadata.name`, no `metadata`, an
//! opaque non-decimal `metadata.resourceVersion`). They are logged and sent to watchers like
//! any write. This module never validates anything.

use std::sync::Arc;

use serde_json::Value;

use super::{EventType, Store, StoredObject};
use crate::error::ApiError;
use crate::json;
use crate::resources::ResourceType;

/// What `metadata.resourceVersion` a raw insert (`Simulator::insert_raw`) stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawResourceVersion {
    /// The store's next decimal resourceVersion, as for any write.
    Assigned,
    /// Whatever the body says, e.g. the opaque "abc-17", or nothing at all.
    AsGiven,
}

impl Store {
    /// Stores `obj` without validation or defaulting (see `Simulator::insert_raw`): keyed by
    /// `metadata.namespace`/`metadata.name` ("" when missing), recorded as ADDED or MODIFIED.
    /// With [`RawResourceVersion::Assigned`] `metadata.resourceVersion` (and `metadata` if
    /// missing) is set to the new decimal version. Errors: 400 if `obj` is not an object.
    pub fn insert_raw(
        &mut self,
        rt: &ResourceType,
        obj: Value,
        resource_version: RawResourceVersion,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let depth = json::depth_of_value(&obj);
        json::with_stack_for(depth, move || {
            let mut obj = obj;
            let map = obj
                .as_object_mut()
                .ok_or_else(|| ApiError::bad_request("the body is not a JSON object"))?;
            let rv = self.rv + 1;
            if resource_version == RawResourceVersion::Assigned {
                let meta = map
                    .entry("metadata")
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
                }
            }
            let stored = Arc::new(StoredObject::from_value(&obj, rv)?);
            self.rv = rv;
            let key = (stored.namespace.clone(), stored.name.clone());
            let prev = self
                .objects
                .entry(rt.key())
                .or_default()
                .insert(key, stored.clone());
            let event_type = if prev.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            };
            self.record(event_type, rt.key(), stored.clone(), prev);
            Ok(stored)
        })
    }
}
