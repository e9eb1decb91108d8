//! Watch plans: the configuration of one `[[resources]]` entry and its API discovery result,
//! resolved once into what each informer needs (as ripgrep turns `LowArgs` into `HiArgs`), so
//! no raw configuration travels into the informers.

use std::sync::Arc;

use kube::api::ApiResource;
use kubesink_sinks::Resource;

use super::payload::Shaper;
use crate::config::{PayloadMode, ResourceConfig};

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
}

impl WatchPlan {
    /// One plan per watch of `res` (one per listed namespace, or one for all), of the
    /// discovered `resource`, labelling objects with `label_key`.
    pub fn expand(
        res: &ResourceConfig,
        resource: Arc<Resource>,
        api_resource: ApiResource,
        label_key: &str,
    ) -> Vec<WatchPlan> {
        let namespaces: Vec<Option<String>> = if res.namespaces.is_empty() {
            vec![None]
        } else {
            res.namespaces.iter().cloned().map(Some).collect()
        };
        let shaper = Shaper::new(res, label_key, &resource.cluster);
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
            })
            .collect()
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
