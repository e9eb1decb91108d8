//! `--against-cluster`: the folded view compared with a live list from the API server of
//! every cluster and resource of the configuration (label and field selectors, namespaces
//! and CEL filters as configured, so both sides cover the same objects).
//!
//! A difference is one of: `missing` (live, not in the view), `ghost` (in the view, not
//! live), `uid` (same key, another object), and with `compare_resource_version` `stale`
//! (same object, another `resourceVersion`; off by default because in `metadata` and
//! `fields` payload modes, and with `drop`, changes kubesink suppresses move the live
//! `resourceVersion` but not the view's). Keys of the view outside the configured
//! clusters and resources are not compared; they are counted.
//!
//! `--repair` ([`repair`]) publishes the `deleted` messages the ghosts lack, through the
//! configured sinks: what a stateless run could not send for objects deleted while it was
//! down (a stream switched from stateless to stateful keeps those ghosts).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{json, Value};

use super::view::View;
use crate::cluster::{self, Resolved};
use crate::informer::Filter;
use crate::plan::{Plan, ResourcePlan};

/// One live object: what the comparison needs.
#[derive(Debug, Clone)]
struct Live {
    uid: String,
    resource_version: String,
}

/// One difference between the view and the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// `missing`, `ghost`, `uid` or `stale`.
    pub kind: &'static str,
    /// The message key.
    pub key: String,
    /// The view's uid and resourceVersion (empty for `missing`).
    pub view: (String, String),
    /// The cluster's uid and resourceVersion (empty for `ghost`).
    pub live: (String, String),
}

impl Drift {
    /// One JSON Lines object: `{"drift", "key", "view": {uid, resourceVersion}, "live": {…}}`.
    pub fn to_json(&self) -> Value {
        let side = |(uid, rv): &(String, String)| {
            (!uid.is_empty()).then(|| json!({"uid": uid, "resourceVersion": rv}))
        };
        json!({"drift": self.kind, "key": self.key, "view": side(&self.view), "live": side(&self.live)})
    }
}

/// The comparison's result.
#[derive(Debug, Default)]
pub struct Report {
    /// The differences, ordered by key.
    pub drifts: Vec<Drift>,
    /// Live objects listed.
    pub live: usize,
    /// Keys of the view that no configured cluster and resource covers (not compared).
    pub not_compared: usize,
    /// The configured resources as discovery resolved them (the repair's messages name
    /// them as kubesink's do).
    pub resources: Vec<Arc<kubesink_core::Resource>>,
}

/// Lists every configured resource of every configured cluster and compares. With `sink`
/// (a `[[sinks]]` name), the live objects are also filtered by that sink's `filter`: what
/// that sink's destination holds.
///
/// # Errors
/// The kubeconfig, API discovery or a list failing (the resource and cluster named); a
/// `sink` the configuration lacks, or whose filter chooses changes (it names `op` or
/// `changed`: its destination is not meant to hold the cluster's objects).
pub async fn compare(
    plan: &Plan,
    view: &View,
    compare_resource_version: bool,
    sink: Option<&str>,
) -> anyhow::Result<Report> {
    let sink_filter = match sink {
        None => None,
        Some(name) => sink_filter(plan, name)?,
    };
    let mut live: BTreeMap<String, Live> = BTreeMap::new();
    let mut resources = Vec::new();
    // (cluster, group, kind, namespaces; empty = all) covered by the lists.
    let mut covered: Vec<(String, String, String, Vec<String>)> = Vec::new();
    for unit in &plan.clusters {
        let spec = &unit.cluster;
        let client = cluster::client(spec).await?;
        // A group-form entry is compared kind by kind, as discovery resolves it now.
        let mut kinds = Vec::new();
        // The owner index's own watches send nothing: nothing of theirs to compare.
        for compiled in unit.resources.iter().filter(|r| !r.index_only) {
            match compiled.config.selector() {
                None => {
                    let resolved = cluster::resolve(&client, &spec.name, &compiled.config).await?;
                    kinds.push((compiled.clone(), resolved));
                }
                Some(s) => {
                    for d in cluster::discover_kinds(&client, &compiled.config, &s).await? {
                        kinds.push((
                            compiled.for_kind(&d.api_resource, d.namespaced),
                            d.resolved(&spec.name),
                        ));
                    }
                }
            }
        }
        for (compiled, resolved) in &kinds {
            let res = &compiled.config;
            resources.push(resolved.resource.clone());
            covered.push((
                spec.name.clone(),
                resolved.resource.group.clone(),
                resolved.resource.kind.clone(),
                res.namespaces.clone(),
            ));
            let apis: Vec<Api<DynamicObject>> = if res.namespaces.is_empty() {
                vec![Api::all_with(client.clone(), &resolved.api_resource)]
            } else {
                res.namespaces
                    .iter()
                    .map(|ns| Api::namespaced_with(client.clone(), ns, &resolved.api_resource))
                    .collect()
            };
            for api in apis {
                list_into(
                    &api,
                    compiled,
                    sink_filter.as_deref(),
                    resolved,
                    &spec.name,
                    &mut live,
                )
                .await?;
            }
        }
    }
    let in_scope = |cluster: &str, group: &str, kind: &str, ns: &str| {
        covered.iter().any(|(c, g, k, nss)| {
            c == cluster
                && g == group
                && k == kind
                && (nss.is_empty() || nss.iter().any(|n| n == ns))
        })
    };
    let mut report = Report {
        live: live.len(),
        resources,
        ..Report::default()
    };
    for e in view.entries() {
        if !in_scope(&e.cluster, &e.group, &e.kind, &e.namespace) {
            report.not_compared += 1;
            continue;
        }
        let mine = (e.uid.clone(), e.resource_version.clone());
        match live.get(&e.key) {
            None => report.drifts.push(Drift {
                kind: "ghost",
                key: e.key.clone(),
                view: mine,
                live: Default::default(),
            }),
            Some(l) if l.uid != e.uid => report.drifts.push(Drift {
                kind: "uid",
                key: e.key.clone(),
                view: mine,
                live: (l.uid.clone(), l.resource_version.clone()),
            }),
            Some(l) if compare_resource_version && l.resource_version != e.resource_version => {
                report.drifts.push(Drift {
                    kind: "stale",
                    key: e.key.clone(),
                    view: mine,
                    live: (l.uid.clone(), l.resource_version.clone()),
                })
            }
            Some(_) => {}
        }
    }
    for (key, l) in &live {
        if view.get(key).is_none() {
            report.drifts.push(Drift {
                kind: "missing",
                key: key.clone(),
                view: Default::default(),
                live: (l.uid.clone(), l.resource_version.clone()),
            });
        }
    }
    report.drifts.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(report)
}

/// What [`repair`] published.
#[derive(Debug, Default)]
pub struct Repaired {
    /// `deleted` messages published to every sink.
    pub deletes: usize,
    /// The sinks they went through, by name.
    pub sinks: Vec<String>,
}

/// Tries per batch before the repair gives up on a sink (each waits twice as long as the
/// one before, from a quarter second).
const SEND_TRIES: u32 = 6;

/// Publishes, through every sink of `plan` (`[[sinks]]`, built as `kubesink run` builds
/// them; with `sink`, through that one only), one `deleted` message per `ghost` of `report`: in the message contract's shape,
/// inferred (`finalStateUnknown: true`, no `object`), with the uid and resourceVersion the
/// view last had, so a consumer removes the key (and a Kafka sink adds its tombstone). Its id
/// is the one kubesink itself would give that inferred delete, so a consumer deduplicating
/// by id, or JetStream within its duplicate window, takes a second repair as a repeat.
///
/// # Errors
/// A sink that cannot be built, or that does not confirm a batch after [`SEND_TRIES`] tries.
pub async fn repair(
    plan: &Plan,
    view: &View,
    report: &Report,
    sink: Option<&str>,
) -> anyhow::Result<Repaired> {
    use kubesink_core::message::{encode, now_rfc3339, Change};
    let observed_at = now_rfc3339();
    let mut messages = Vec::new();
    for d in report.drifts.iter().filter(|d| d.kind == "ghost") {
        let Some(e) = view.get(&d.key) else { continue };
        let Some(resource) = report
            .resources
            .iter()
            .find(|r| r.cluster == e.cluster && r.group == e.group && r.kind == e.kind)
        else {
            continue;
        };
        let change = Change {
            op: kubesink_core::Op::Deleted,
            namespace: (!e.namespace.is_empty()).then(|| e.namespace.clone()),
            name: e.name.clone(),
            uid: e.uid.clone(),
            resource_version: e.resource_version.clone(),
            initial: false,
            final_state_unknown: true,
            object: None,
            may_be_held: false,
            replaced_uid: None,
            changed: None,
            changes: None,
            occurrences: None,
            context: None,
            reason: None,
        };
        messages.push(encode(resource, &change, &observed_at)?);
    }
    let mut repaired = Repaired {
        deletes: messages.len(),
        ..Repaired::default()
    };
    if messages.is_empty() {
        return Ok(repaired);
    }
    // With `--sink`, a ghost may be an object another route holds: only that sink is repaired.
    let sinks: Vec<_> = crate::sinks::build_all(plan.sinks.iter().map(|s| &s.config))
        .await?
        .into_iter()
        .filter(|s| sink.is_none_or(|name| s.name() == name))
        .collect();
    let batch = plan.pipeline.max_batch_events.max(1);
    for sink in sinks {
        for chunk in messages.chunks(batch) {
            let mut wait = Duration::from_millis(250);
            let mut tries = 0;
            loop {
                tries += 1;
                match sink.send(chunk).await {
                    Ok(()) => break,
                    Err(e) if tries < SEND_TRIES => {
                        tracing::warn!(sink = sink.name(), error = %e, retry_in = ?wait, "repair: the sink did not confirm the deletes; retrying");
                        tokio::time::sleep(wait).await;
                        wait *= 2;
                    }
                    Err(e) => {
                        anyhow::bail!(
                            "repair: sink {} did not confirm the deletes after {tries} tries: {e}",
                            sink.name()
                        )
                    }
                }
            }
        }
        if let Err(e) = sink.close().await {
            anyhow::bail!("repair: closing sink {}: {e}", sink.name());
        }
        repaired.sinks.push(sink.name().to_owned());
    }
    Ok(repaired)
}

/// Records one listed object's key, uid and resourceVersion.
fn insert_live(
    resolved: &Resolved,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    out: &mut BTreeMap<String, Live>,
) {
    let name = meta.name.as_deref().unwrap_or_default();
    let key = resolved.resource.key(meta.namespace.as_deref(), name);
    out.insert(
        key,
        Live {
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
        },
    );
}

/// The compiled object filter of the sink named `name` (`None`: it has none).
fn sink_filter(plan: &Plan, name: &str) -> anyhow::Result<Option<Arc<Filter>>> {
    let Some(sink) = plan.sinks.iter().find(|s| s.name() == name) else {
        let names: Vec<&str> = plan.sinks.iter().map(|s| s.name()).collect();
        anyhow::bail!(
            "--sink {name:?}: the configuration has no sink of that name (it has {})",
            names.join(", ")
        );
    };
    let (Some(expr), Some(filter)) = (sink.config.filter(), &sink.filter) else {
        return Ok(None);
    };
    if filter.on_changes() {
        anyhow::bail!(
            "--sink {name:?}: its filter {} names op or changed: it chooses changes, not objects, so its destination is not a copy of the cluster to compare",
            Filter::shown(expr)
        );
    }
    Ok(Some(filter.clone()))
}

async fn list_into(
    api: &Api<DynamicObject>,
    compiled: &ResourcePlan,
    sink: Option<&Filter>,
    resolved: &Resolved,
    cluster: &str,
    out: &mut BTreeMap<String, Live>,
) -> anyhow::Result<()> {
    let res = &compiled.config;
    let mut params = ListParams::default().limit(res.page_size.max(1));
    if let Some(l) = &res.label_selector {
        params = params.labels(l);
    }
    if let Some(f) = &res.field_selector {
        params = params.fields(f);
    }
    let filters: Vec<&Filter> = compiled.filter.as_deref().into_iter().chain(sink).collect();
    // The context (`enrich`) comes from the owner index a running kubesink fills from every
    // followed kind; one listing of one kind cannot rebuild it, and evaluated without it such
    // a filter would call every followed object drift.
    if let Some(f) = filters.iter().find(|f| f.uses_context()) {
        anyhow::bail!(
            "{}: the filter {} reads owners, node, nodeLabels or namespaceLabels, which --against-cluster cannot resolve (they come from the owner index of a running kubesink): fold without --against-cluster, or compare a configuration without that filter",
            res.display_name(),
            Filter::shown(f.source())
        );
    }
    if !filters.is_empty() {
        return list_filtered_into(api, params, compiled, &filters, resolved, cluster, out).await;
    }
    loop {
        // Only names, uids and resourceVersions are compared: a metadata-only list
        // (PartialObjectMetadataList) spares decoding and holding whole objects.
        let page = api.list_metadata(&params).await.map_err(|e| {
            anyhow::anyhow!("cluster {cluster}: listing {}: {e}", res.display_name())
        })?;
        for o in &page.items {
            insert_live(resolved, &o.metadata, out);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(()),
        }
    }
}

/// [`list_into`] with CEL filters (the resource's, a sink's): whole objects listed (an
/// expression may read any field), and only those every filter matches kept, evaluated as
/// the informer evaluates them (the same redaction of Secrets).
async fn list_filtered_into(
    api: &Api<DynamicObject>,
    mut params: ListParams,
    compiled: &ResourcePlan,
    filters: &[&Filter],
    resolved: &Resolved,
    cluster: &str,
    out: &mut BTreeMap<String, Live>,
) -> anyhow::Result<()> {
    use crate::informer::{FilterMatch, FilterSubject as Subject, RawObject, Shaper};
    let res = &compiled.config;
    let shaper = Shaper::for_resource(res, &resolved.resource, "", compiled.changes.clone());
    loop {
        let page = api.list(&params).await.map_err(|e| {
            anyhow::anyhow!("cluster {cluster}: listing {}: {e}", res.display_name())
        })?;
        for o in &page.items {
            let text = serde_json::to_string(o)?;
            let obj = RawObject::parse(&text)?;
            let (metadata, redacted) = shaper.filter_view(&obj);
            let subject = Subject::new(&obj, &metadata, &redacted, &resolved.resource, None);
            if filters
                .iter()
                .all(|f| f.matches(&subject) == FilterMatch::Yes)
            {
                insert_live(resolved, &o.metadata, out);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(()),
        }
    }
}
