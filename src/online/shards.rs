//! With `shards > 1`: whether the cluster's API server filters lists by shard (its
//! `ShardedListAndWatch` feature gate, `docs/scale-out.md`, "One huge cluster"), asked with
//! one LIST of the cluster's first resource, `limit=1`, carrying shard 0's `shardSelector`.
//! A server that filtered says so in the answer's `metadata.shardInfo` (`k8s.io/apimachinery`
//! `ListMeta.ShardInfo`); one that ignored the parameter answers without it. The LIST asks for
//! whole objects: a metadata-only answer (`PartialObjectMetadataList`) lacks `shardInfo` even
//! when filtered (v0.37.2 `endpoints/handlers/response.go`, `asPartialObjectMetadataList`,
//! copies only `resourceVersion`, `continue` and `remainingItemCount`), one reason the
//! informer tells a server that ignores the selector by the objects it answers instead
//! (`informer/shard.rs`). Either way `run` works: without the gate each shard's watches read
//! the whole of each resource and keep only their shard.

use std::time::Duration;

use kube::api::ListParams;
use kube::Client;

use super::{within, Line, Verdict};
use crate::cluster;
use crate::config::{Cluster, Shard};

/// The line about `cluster`'s shards, or `None` when it has none (or no resource to ask
/// with).
pub(super) async fn check(client: &Client, cluster: &Cluster, timeout: Duration) -> Option<Line> {
    let shard = Shard::all(cluster.shards).into_iter().next()?;
    let res = cluster.resources.first()?;
    let line = |verdict, detail: String| {
        Some(Line {
            verdict,
            cluster: cluster.name.clone(),
            subject: Some(format!("shards ({})", cluster.shards)),
            detail,
            unreachable: false,
        })
    };
    let resolved =
        match tokio::time::timeout(timeout, cluster::resolve(client, &cluster.name, res)).await {
            Ok(Ok(r)) => r,
            // The resource's own line says what is wrong with it.
            _ => {
                return line(
                    Verdict::Fail,
                    format!(
                        "not asked: {}/{} did not resolve (its line says why)",
                        res.api_version, res.kind
                    ),
                )
            }
        };
    let url = <kube::api::DynamicObject as kube::Resource>::url_path(&resolved.api_resource, None);
    let asked = kube::core::Request::new(url)
        .list(&ListParams::default().limit(1))
        .map_err(|e| e.to_string())
        .and_then(|req| {
            let (mut parts, body) = req.into_parts();
            parts.uri = shard.on(&parts.uri)?;
            Ok(http::Request::from_parts(parts, body))
        });
    let req = match asked {
        Ok(r) => r,
        Err(e) => {
            return line(
                Verdict::Fail,
                format!("the request could not be built: {e}"),
            )
        }
    };
    #[derive(serde::Deserialize)]
    struct List {
        #[serde(default)]
        metadata: Meta,
    }
    #[derive(Default, serde::Deserialize)]
    struct Meta {
        #[serde(default, rename = "shardInfo")]
        shard_info: Option<serde_json::Value>,
    }
    let spread = spread(client, cluster.shards, timeout).await;
    match within(timeout, client.request::<List>(req)).await {
        Ok(List {
            metadata: Meta {
                shard_info: Some(_),
            },
        }) => line(
            Verdict::Ok,
            format!("the API server filters lists and watches by shard (ShardedListAndWatch on): each replica reads only its shards; {spread}"),
        ),
        Ok(_) => line(
            Verdict::Ok,
            format!("the API server ignores shardSelector (ShardedListAndWatch off, or before Kubernetes 1.36): each shard's watches will read the whole of each resource and keep only their shard (a replica holding k of the {} shards reads it k times; kubesink_shard_foreign_objects_total counts what is dropped): turn the gate on; {spread}", cluster.shards),
        ),
        Err(e) => line(
            Verdict::Fail,
            format!("a LIST of {}/{} with shard 0's shardSelector failed: {e}", res.api_version, res.kind),
        ),
    }
}

/// How today's namespaces spread over the shards, in words: `namespaces per shard: 6 / 6 / 3
/// / 5`, and a warning when one shard has more than twice its share (names that differ only
/// in their last character hash close together in the top bits the ranges split on:
/// docs/scale-out.md, "Balance"). Objects are not counted: namespaces are what a shard holds.
async fn spread(client: &Client, shards: u32, timeout: Duration) -> String {
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let list = match within(timeout, api.list_metadata(&ListParams::default())).await {
        Ok(l) => l,
        Err(e) => {
            return format!(
                "today's namespaces could not be listed to show their spread over the shards: {e}"
            )
        }
    };
    let all = Shard::all(shards);
    let mut counts = vec![0usize; all.len()];
    for name in list.items.iter().filter_map(|n| n.metadata.name.as_deref()) {
        if let Some(i) = all.iter().position(|s| s.holds(Some(name))) {
            counts[i] += 1;
        }
    }
    let total: usize = counts.iter().sum();
    let words = counts
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(" / ");
    // Cluster-scoped objects (Nodes, Namespaces) hash the empty namespace: all in one shard.
    let scoped = all
        .iter()
        .position(|s| s.holds(None))
        .map_or(String::new(), |i| {
            format!(" (cluster-scoped objects, Nodes and Namespaces, all in shard {i})")
        });
    let most = counts.iter().copied().max().unwrap_or(0);
    let uneven = total > 0 && most * all.len() > 2 * total;
    match uneven {
        true => format!("today's {total} namespaces per shard: {words}{scoped}: uneven (names that differ only in their last characters fall into one shard; docs/scale-out.md, \"Balance\")"),
        false => format!("today's {total} namespaces per shard: {words}{scoped}"),
    }
}
