//! What the real-server scale-out tests read back (`tests/real_scale_out.rs`,
//! `tests/real_shards.rs`): the holders of a group's unit Leases, a replica's `/metrics` and
//! `/readyz`, and each cluster's messages from every replica in holder order.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use serde_json::Value;

use crate::process::Kubesink;

/// Each unit Lease of group `group` in `namespace` (keyed by its `kubesink.io/cluster`
/// annotation: a cluster, or a shard `cluster#shard-i-of-n`), with its holder while valid
/// (renewed within its duration).
pub async fn holders(
    client: &kube::Client,
    namespace: &str,
    group: &str,
) -> BTreeMap<String, Option<String>> {
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), namespace);
    let selector = format!("kubesink.io/group={group},kubesink.io/role=cluster");
    let Ok(list) = api.list(&ListParams::default().labels(&selector)).await else {
        return BTreeMap::new();
    };
    let now = jiff::Timestamp::now();
    list.items
        .into_iter()
        .map(|l| {
            let cluster = l
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubesink.io/cluster"))
                .cloned()
                .unwrap_or_default();
            let spec = l.spec.unwrap_or_default();
            let holder = spec.holder_identity.unwrap_or_default();
            let valid = !holder.is_empty()
                && spec.renew_time.is_some_and(|r| {
                    now.duration_since(r.0).as_secs_f64()
                        < spec.lease_duration_seconds.unwrap_or(0) as f64
                });
            (cluster, Some(holder).filter(|_| valid))
        })
        .collect()
}

/// Waits until the unit Leases of `group` in `namespace` are held as a group of `members`
/// settles them ([`crate::settled`]: evenly, and as every replica assigns them from these
/// holders), `what` naming the wait; a failure shows the replicas' last log lines.
pub async fn held_as_assigned(
    client: &kube::Client,
    what: &str,
    (namespace, group): (&str, &str),
    units: &[String],
    members: &[&str],
    logs: &[&Kubesink],
    timeout: std::time::Duration,
) {
    crate::wait_until(what, timeout, || async {
        let got = holders(client, namespace, group).await;
        let Err(why) = crate::settled(units, members, &got) else {
            return Ok(());
        };
        let tails: String = logs
            .iter()
            .map(|k| {
                let s = k.stderr();
                let tail: Vec<&str> = s.lines().rev().take(4).collect();
                format!("\n---\n{}", tail.join("\n"))
            })
            .collect();
        Err(format!("{why}: holders {got:?}{tails}"))
    })
    .await;
}

/// The process's `/metrics` and `/readyz` (at the address it logged): the exposition, the
/// readiness status code and body.
pub async fn observe(k: &Kubesink) -> (String, u16, Value) {
    let log = k.stderr();
    let addr = log
        .lines()
        .find(|l| l.contains("serving /metrics"))
        .and_then(|l| l.split("addr=").nth(1))
        .map(|a| a.split_whitespace().next().unwrap_or_default().to_owned())
        .expect("the server's address is logged");
    let addr: std::net::SocketAddr = addr.parse().expect("an address");
    let (_, metrics) = crate::http_get(addr, "/metrics").await;
    let (code, body) = crate::http_get(addr, "/readyz").await;
    (
        metrics,
        code,
        serde_json::from_str(&body).unwrap_or(Value::Null),
    )
}

/// Every cluster's messages from every replica's stdout, in holder order: by `leaderEpoch`,
/// then in the order its holder wrote them. With shards, the epochs of a cluster's shards
/// are their own Leases'; a key stays in one shard, so each key's messages are still in
/// holder order.
pub fn per_cluster(outputs: &[Vec<Value>]) -> BTreeMap<String, Vec<Value>> {
    let mut by: BTreeMap<String, Vec<(u64, usize, usize, Value)>> = BTreeMap::new();
    for (p, out) in outputs.iter().enumerate() {
        for (i, m) in out.iter().enumerate() {
            let cluster = m["cluster"].as_str().unwrap_or_default().to_owned();
            let epoch = m["leaderEpoch"].as_u64().unwrap_or(0);
            by.entry(cluster)
                .or_default()
                .push((epoch, p, i, m.clone()));
        }
    }
    by.into_iter()
        .map(|(c, mut v)| {
            v.sort_by_key(|(e, p, i, _)| (*e, *p, *i));
            (c, v.into_iter().map(|(_, _, _, m)| m).collect())
        })
        .collect()
}
