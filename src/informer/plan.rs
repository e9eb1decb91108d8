//! Watch plans: the configuration of one `[[resources]]` entry and its API discovery result,
//! resolved once into what each informer needs (as ripgrep turns `LowArgs` into `HiArgs`), so
//! no raw configuration travels into the informers.

use std::sync::Arc;

use kube::api::ApiResource;
use kubesink_core::Resource;
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use super::changes::ChangePaths;
use super::occurrence::Occurrences;
use super::payload::{Shaper, SHAPE_VERSION};
use crate::config::{PayloadMode, ResourceConfig, ResourceMode};
use kubesink_core::shard::Shard;

/// Everything one informer needs: which objects to watch and how to shape them.
#[derive(Clone)]
pub struct WatchPlan {
    /// The resource's identity, shared by every message of it.
    pub resource: Arc<Resource>,
    /// kube's type information for `Api<DynamicObject>`.
    pub api_resource: ApiResource,
    /// The namespace to watch; `None`: all namespaces, or the cluster scope.
    pub namespace: Option<String>,
    /// `limit` of each list page.
    pub page_size: u32,
    /// Label selector of the list and watch requests.
    pub label_selector: Option<String>,
    /// Field selector of the list and watch requests.
    pub field_selector: Option<String>,
    /// Payload mode; `metadata` makes the watch ask for `PartialObjectMetadata`.
    pub mode: PayloadMode,
    /// From watched object to emitted object.
    pub shaper: Shaper,
    /// Emit `updated`.
    pub updates: bool,
    /// Events mode (`mode = "events"`): how Events are sent as occurrences; `None` for
    /// objects.
    pub occurrences: Option<Occurrences>,
    /// The shard of the cluster this watch follows (its requests' `shardSelector`, and the
    /// client-side check when the server ignores it); `None`: the whole cluster.
    pub shard: Option<Shard>,
}

/// What a watch's selection fingerprint covers, serialized as JSON in this field order.
#[derive(Serialize)]
struct Selection<'a> {
    shape_version: u32,
    label_key: &'a str,
    group: &'a str,
    version: &'a str,
    kind: &'a str,
    namespace: Option<&'a str>,
    label_selector: Option<&'a str>,
    field_selector: Option<&'a str>,
    payload: PayloadMode,
    /// Left out for objects, so states saved before events mode existed still compare.
    #[serde(skip_serializing_if = "ResourceMode::is_objects")]
    mode: ResourceMode,
    fields: &'a [String],
    drop: &'a [String],
    updates: bool,
    allow_secret_data: bool,
    /// Left out when empty, so states saved before `change_paths` existed still compare.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    change_paths: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    ignore_changes: &'a [String],
    /// Left out without shards, for the same reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<String>,
}

impl WatchPlan {
    /// One plan per watch of `res` (one per listed namespace, or one for all), of the
    /// discovered `resource`, labelling objects with `label_key`; `changes` are `res`'s
    /// compiled change paths.
    pub fn expand(
        res: &ResourceConfig,
        changes: Arc<ChangePaths>,
        resource: Arc<Resource>,
        api_resource: ApiResource,
        label_key: &str,
    ) -> Vec<WatchPlan> {
        let namespaces: Vec<Option<String>> = if res.namespaces.is_empty() {
            vec![None]
        } else {
            res.namespaces.iter().cloned().map(Some).collect()
        };
        let shaper = Shaper::for_resource(res, &resource, label_key, changes);
        namespaces
            .into_iter()
            .map(|namespace| WatchPlan {
                resource: resource.clone(),
                api_resource: api_resource.clone(),
                namespace,
                page_size: res.page_size,
                label_selector: res.label_selector.clone(),
                field_selector: res.field_selector.clone(),
                mode: res.payload,
                shaper: shaper.clone(),
                updates: res.updates,
                occurrences: Occurrences::of(res),
                shard: None,
            })
            .collect()
    }

    /// The selection fingerprint of a watch of `res` (discovered as `resource`) in
    /// `namespace`, labelled with `label_key`: XXH3-64 of the JSON of the shaping version,
    /// the cluster label key, group, version, kind, namespace, label and field selectors,
    /// payload mode, `fields`, `drop`, `updates`, `allow_secret_data`, `change_paths` and
    /// `ignore_changes` and the shard's selector (the last three only when set, so a state
    /// saved before they existed still compares). Any change of what the watch emits changes it (the change paths
    /// decide what the saved parts mean; the ignored paths, what the saved fingerprints
    /// cover); `page_size` does not.
    pub fn selection_of(
        res: &ResourceConfig,
        resource: &Resource,
        namespace: Option<&str>,
        label_key: &str,
        shard: Option<Shard>,
    ) -> u64 {
        let s = Selection {
            shape_version: SHAPE_VERSION,
            label_key,
            group: &resource.group,
            version: &resource.version,
            kind: &resource.kind,
            namespace,
            label_selector: res.label_selector.as_deref(),
            field_selector: res.field_selector.as_deref(),
            payload: res.payload,
            mode: res.mode,
            fields: &res.fields,
            drop: &res.drop,
            updates: res.updates,
            allow_secret_data: res.allow_secret_data,
            change_paths: &res.change_paths,
            ignore_changes: &res.ignore_changes,
            shard: shard.map(|s| s.selector()),
        };
        // Serializing plain strings, booleans and an enum cannot fail; an empty fingerprint
        // input would only make every selection compare equal to itself, never to another.
        xxh3_64(&serde_json::to_vec(&s).unwrap_or_default())
    }

    /// The identity in saved state of a watch of `resource` in `namespace`:
    /// `{group or "core"}/{Kind}/{namespace}` (namespace empty for all namespaces or the
    /// cluster scope). Computed from the configuration, before discovery (which confirms the
    /// group and kind).
    pub fn identity_of(resource: &Resource, namespace: Option<&str>) -> String {
        format!(
            "{}/{}/{}",
            resource.group_or_core(),
            resource.kind,
            namespace.unwrap_or("")
        )
    }

    /// The watch's scope in words: `namespace x`, `all namespaces` or `cluster`.
    pub fn scope(&self) -> String {
        match (&self.namespace, self.resource.namespaced) {
            (Some(ns), _) => format!("namespace {ns}"),
            (None, true) => "all namespaces".to_owned(),
            (None, false) => "cluster".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selection_changes_with_what_is_emitted_and_not_with_the_page_size() {
        let r = Resource::new("prod", "", "v1", "Pod", "pods", true);
        let base = ResourceConfig::new("v1", "Pod");
        let sel = |res: &ResourceConfig, ns: Option<&str>, label: &str| {
            WatchPlan::selection_of(res, &r, ns, label, None)
        };
        let s0 = sel(&base, None, "kubesink.io/cluster");
        assert_eq!(s0, sel(&base.clone(), None, "kubesink.io/cluster"));
        let mut paged = base.clone();
        paged.page_size = 7;
        assert_eq!(s0, sel(&paged, None, "kubesink.io/cluster"));
        let mut changed = Vec::new();
        for f in [
            |r: &mut ResourceConfig| r.label_selector = Some("a=b".into()),
            |r: &mut ResourceConfig| r.field_selector = Some("metadata.name=x".into()),
            |r: &mut ResourceConfig| r.payload = PayloadMode::Metadata,
            |r: &mut ResourceConfig| r.drop = vec!["/status".into()],
            |r: &mut ResourceConfig| r.updates = false,
            |r: &mut ResourceConfig| r.allow_secret_data = true,
        ] {
            let mut res = base.clone();
            f(&mut res);
            changed.push(sel(&res, None, "kubesink.io/cluster"));
        }
        changed.push(sel(&base, Some("web"), "kubesink.io/cluster"));
        changed.push(sel(&base, None, "example.com/cluster"));
        let v2 = Resource::new("prod", "", "v2", "Pod", "pods", true);
        changed.push(WatchPlan::selection_of(
            &base,
            &v2,
            None,
            "kubesink.io/cluster",
            None,
        ));
        changed.push(WatchPlan::selection_of(
            &base,
            &r,
            None,
            "kubesink.io/cluster",
            Some(Shard { index: 0, count: 2 }),
        ));
        for (i, c) in changed.iter().enumerate() {
            assert_ne!(*c, s0, "change {i} kept the selection");
        }
    }

    #[test]
    fn secret_redaction_follows_the_discovered_resource_not_the_configured_spelling() {
        use super::super::object::RawObject;
        let secret = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns",
            "annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"data\":{\"password\":\"aHVudGVyMg==\"}}"}},
            "type":"Opaque","data":{"password":"aHVudGVyMg=="}}"#;
        let discovered = Arc::new(Resource::new("prod", "", "v1", "Secret", "secrets", true));
        let api_resource = ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
        };
        // The shaper of the first watch `res` plans, as discovery resolved it.
        let shaper = |res: &ResourceConfig| {
            let changes = Arc::new(ChangePaths::of_resource(res));
            let plans =
                WatchPlan::expand(res, changes, discovered.clone(), api_resource.clone(), "l");
            plans[0].shaper.clone()
        };
        // Spellings discovery has resolved to core/v1 Secrets (a configuration that `check`
        // rejects can still reach a plan through the library).
        for spelling in ["v1", "/v1", " v1"] {
            for mode in [
                PayloadMode::Full,
                PayloadMode::Metadata,
                PayloadMode::Fields,
            ] {
                let mut res = ResourceConfig::new(spelling, "Secret");
                res.payload = mode;
                if mode == PayloadMode::Fields {
                    res.fields = vec!["/data".into(), "/metadata/annotations".into()];
                }
                let shaped = shaper(&res)
                    .shape(&RawObject::parse(secret).unwrap())
                    .unwrap();
                let text = shaped.object.as_str();
                assert!(
                    !text.contains("aHVudGVyMg") && !text.contains("last-applied"),
                    "{spelling:?} {mode:?}: {text}"
                );
                assert!(
                    text.starts_with(r#"{"apiVersion":"v1","kind":"Secret""#),
                    "{text}"
                );
            }
            // Metadata mode receives PartialObjectMetadata: the message names the discovered
            // apiVersion, not the configured text.
            let partial = secret
                .replace(r#""kind":"Secret""#, r#""kind":"PartialObjectMetadata""#)
                .replace(r#""apiVersion":"v1""#, r#""apiVersion":"meta.k8s.io/v1""#);
            let mut res = ResourceConfig::new(spelling, "Secret");
            res.payload = PayloadMode::Metadata;
            let shaped = shaper(&res)
                .shape(&RawObject::parse(&partial).unwrap())
                .unwrap();
            let text = shaped.object.as_str();
            assert!(
                text.starts_with(r#"{"apiVersion":"v1","kind":"Secret""#),
                "{text}"
            );
            assert!(!text.contains("last-applied"), "{spelling:?}: {text}");
        }
    }
}
