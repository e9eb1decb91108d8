//! Membership of a scale-out group: each replica renews a Lease of its own
//! (`{group}-member-…`, label `kubesink.io/group`, `kubesink.io/role=member`) and lists the
//! group's Leases to learn the live members and who holds each cluster's Lease.
//!
//! A member is live while its Lease was renewed within its `leaseDurationSeconds`, judged as
//! the leader election judges a holder (`src/leader.rs`): on the reader's monotonic clock
//! since it last saw the record change, so clock skew between nodes does not matter. A live
//! member not seen renewing for `renew_deadline` is *lost*: by its own rule it has stopped
//! every cluster and exited (a frozen one does so when it wakes), so it is given nothing more
//! and its clusters go to the others, which take each cluster's Lease when that expires
//! (logged once at WARN, and `/readyz` lists it apart). The time since its first sight of a
//! record is never more than the time since the renewal that wrote it, so a member still
//! renewing is never counted lost. A member
//! is *settled* once its Lease's `acquireTime` (written when its process started) is
//! `join_after` old on the reader's wall clock; only settled members are given clusters,
//! unless none is (a group that just started). Clock skew only shifts when a new member is
//! given clusters; who may emit is decided by the cluster Leases alone.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::Api;
use xxhash_rust::xxh3::xxh3_64;

/// The label naming a Lease's group.
pub const GROUP_LABEL: &str = "kubesink.io/group";
/// The label saying what a Lease is for: `member` or `cluster`.
pub const ROLE_LABEL: &str = "kubesink.io/role";
/// The annotation holding the cluster's name on its Lease (names may not fit a label value).
pub const CLUSTER_ANNOTATION: &str = "kubesink.io/cluster";
/// The annotation on a membership Lease holding the fingerprint of the member's cluster list
/// ([`clusters_fingerprint`]).
pub const CLUSTERS_ANNOTATION: &str = "kubesink.io/clusters";

/// How many `lease_duration`s a member's Lease may stay expired before a live member deletes
/// it (a crashed replica cannot delete its own; a Deployment's Pod names change each rollout).
const FORGET_AFTER: u32 = 10;

/// The fingerprint of a cluster list: xxh3-64 of the sorted names, in hex. Members compute an
/// assignment only with the members of the same list: two configurations under one group
/// (a rolling update that adds a cluster, or another deployment with the same `lease_name`)
/// would otherwise each give clusters to members that do not know them, and those clusters
/// would wait for a holder.
pub fn clusters_fingerprint(names: &[String]) -> String {
    let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    format!("{:016x}", xxh3_64(sorted.join("\u{0}").as_bytes()))
}

/// A Lease name for `what` in `group`: `{group}-{kind}-{slug}-{hash}`, where the slug keeps
/// what a DNS subdomain name allows of `what` (lowercase, `a-z0-9-`, at most 40 characters)
/// and the hash (xxh3-64 of `what`, 8 hex digits) keeps two names that slug alike apart.
pub fn lease_name(group: &str, kind: &str, what: &str) -> String {
    let slug: String = what
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let slug = slug.trim_matches('-');
    let hash = xxh3_64(what.as_bytes()) as u32;
    format!("{group}-{kind}-{slug}-{hash:08x}")
}

/// What one listing of the group's Leases showed.
#[derive(Debug, Default, Clone)]
pub struct View {
    /// The live members' identities, sorted.
    pub live: Vec<String>,
    /// The live members that are settled (see the module), sorted: whom clusters go to.
    pub settled: Vec<String>,
    /// Per cluster Lease (by the cluster's name): its holder while valid, `None` when free,
    /// expired or absent.
    pub holders: BTreeMap<String, Option<String>>,
    /// Live members whose cluster list differs from this replica's (another configuration
    /// under the same `lease_name`): left out of the assignment, reported.
    pub others: Vec<String>,
    /// Live members not seen renewing for `renew_deadline` (see the module), with how long:
    /// not in `live` or `settled`.
    pub lost: Vec<(String, Duration)>,
    /// Per live member: how long since it was last seen renewing its Lease.
    pub member_renewed: BTreeMap<String, Duration>,
    /// Per cluster Lease with a holder (by the cluster's name): how long since its holder was
    /// last seen renewing it (the failover clock: at `lease_duration` the next holder takes
    /// it).
    pub renewed: BTreeMap<String, Duration>,
    /// Per cluster Lease: its holder, its record ([`crate::leader::Elector::record_of`]) and
    /// when this replica first saw that record, for the cluster's Elector
    /// ([`crate::leader::Elector::seen`]).
    pub seen: BTreeMap<String, (String, String, Instant)>,
}

impl View {
    /// Who clusters are assigned to: the settled members, or every live one when none is.
    pub fn assignees(&self) -> &[String] {
        if self.settled.is_empty() {
            &self.live
        } else {
            &self.settled
        }
    }
}

/// This replica's membership. A clone renews the same Lease (the renewals run apart from
/// the listing).
#[derive(Clone)]
pub struct Membership {
    api: Api<Lease>,
    group: String,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    join_after: Duration,
    /// The members counted lost, as last logged (a member that renews again is live again).
    lost: std::collections::BTreeSet<String>,
    /// When this process joined (its Lease's `acquireTime`).
    joined: Timestamp,
    /// [`clusters_fingerprint`] of this replica's clusters.
    fingerprint: String,
    /// Per Lease name: its holder and record (renewTime, resourceVersion) and when first
    /// seen.
    observed: HashMap<String, (String, String, Instant)>,
}

impl Membership {
    /// This replica (`identity`) in `group`, its Leases in `api`'s namespace, with the
    /// group's `(lease_duration, renew_deadline)`. `clusters` are this replica's cluster
    /// names (their fingerprint goes on its Lease).
    pub fn new(
        api: Api<Lease>,
        group: &str,
        identity: &str,
        clusters: &[String],
        (lease_duration, renew_deadline): (Duration, Duration),
        join_after: Duration,
    ) -> Self {
        Membership {
            api,
            group: group.to_owned(),
            name: lease_name(group, "member", identity),
            identity: identity.to_owned(),
            lease_duration,
            renew_deadline,
            join_after,
            lost: std::collections::BTreeSet::new(),
            joined: Timestamp::now(),
            fingerprint: clusters_fingerprint(clusters),
            observed: HashMap::new(),
        }
    }

    /// The name of this replica's membership Lease.
    pub fn lease(&self) -> &str {
        &self.name
    }

    /// Renews (or creates) this replica's membership Lease.
    ///
    /// # Errors
    /// The API server's error (a 409 Conflict means another process of the same identity
    /// wrote it meanwhile: retried at the next period).
    pub async fn renew(&self) -> Result<(), kube::Error> {
        let now = MicroTime(Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(crate::leader::lease_seconds(self.lease_duration)),
            acquire_time: Some(MicroTime(self.joined)),
            renew_time: Some(now),
            ..Default::default()
        };
        let annotations =
            BTreeMap::from([(CLUSTERS_ANNOTATION.to_owned(), self.fingerprint.clone())]);
        match self.api.get_opt(&self.name).await? {
            Some(mut lease) => {
                lease.spec = Some(spec);
                lease
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .extend(annotations);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await?;
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        labels: Some(BTreeMap::from([
                            (GROUP_LABEL.to_owned(), self.group.clone()),
                            (ROLE_LABEL.to_owned(), "member".to_owned()),
                        ])),
                        annotations: Some(annotations),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await?;
            }
        }
        Ok(())
    }

    /// Deletes this replica's membership Lease (at shutdown, so the others reassign its
    /// clusters at once instead of after its Lease expires).
    pub async fn leave(&self) {
        match self.api.delete(&self.name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(lease = %self.name, "left the scale-out group"),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %crate::cluster::error_chain(&e), "deleting the membership Lease failed; it expires on its own")
            }
        }
    }

    /// Lists the group's Leases: the live and settled members, and each cluster Lease's
    /// holder.
    ///
    /// # Errors
    /// The API server's error.
    pub async fn view(&mut self) -> Result<View, kube::Error> {
        let leases = self
            .api
            .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={}", self.group)))
            .await?;
        let seen_now = Instant::now();
        let wall_now = Timestamp::now();
        let mut view = View::default();
        let mut still = HashMap::new();
        let mut forget = Vec::new();
        for lease in leases.items {
            let Some(name) = lease.metadata.name.clone() else {
                continue;
            };
            let role = meta_value(lease.metadata.labels.as_ref(), ROLE_LABEL);
            let spec = lease.spec.clone().unwrap_or_default();
            let holder = spec.holder_identity.clone().unwrap_or_default();
            let record = crate::leader::Elector::record_of(&lease);
            let first_seen = match self.observed.get(&name) {
                Some((h, r, at)) if *r == record && *h == holder => *at,
                _ => seen_now,
            };
            still.insert(name.clone(), (holder.clone(), record.clone(), first_seen));
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.lease_duration, Duration::from_secs);
            // A record this replica renewed itself is live from its own renewal (the first
            // sight of it is now).
            let live = !holder.is_empty() && first_seen.elapsed() < duration;
            let fingerprint = meta_value(lease.metadata.annotations.as_ref(), CLUSTERS_ANNOTATION);
            match role.as_str() {
                "member" if live && fingerprint != self.fingerprint => {
                    view.others.push(holder);
                }
                "member"
                    if live
                        && holder != self.identity
                        && first_seen.elapsed() >= self.renew_deadline =>
                {
                    view.lost.push((holder, first_seen.elapsed()));
                }
                "member" if live => {
                    view.member_renewed
                        .insert(holder.clone(), first_seen.elapsed());
                    let settled = spec.acquire_time.as_ref().is_some_and(|t| {
                        wall_now.duration_since(t.0).as_secs_f64() >= self.join_after.as_secs_f64()
                    });
                    if settled {
                        view.settled.push(holder.clone());
                    }
                    view.live.push(holder);
                }
                "cluster" => {
                    let cluster =
                        meta_value(lease.metadata.annotations.as_ref(), CLUSTER_ANNOTATION);
                    view.seen
                        .insert(cluster.clone(), (holder.clone(), record, first_seen));
                    if !holder.is_empty() {
                        view.renewed.insert(cluster.clone(), first_seen.elapsed());
                    }
                    view.holders.insert(cluster, Some(holder).filter(|_| live));
                }
                "member"
                    if name != self.name && first_seen.elapsed() >= duration * FORGET_AFTER =>
                {
                    forget.push((name.clone(), lease.metadata.resource_version.clone()));
                }
                _ => {}
            }
        }
        self.observed = still;
        // A member expired long ago (a crashed replica): delete its Lease, on the condition
        // that it is still the record seen (a replica that came back and renewed keeps it).
        for (name, rv) in forget {
            let dp = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    resource_version: rv,
                    uid: None,
                }),
                ..Default::default()
            };
            match self.api.delete(&name, &dp).await {
                Ok(_) => {
                    tracing::info!(lease = %name, "deleted the membership Lease of a replica gone for {FORGET_AFTER} lease durations")
                }
                Err(e) => {
                    tracing::debug!(lease = %name, error = %crate::cluster::error_chain(&e), "deleting a long-expired membership Lease failed; retried at the next listing")
                }
            }
        }
        view.live.sort_unstable();
        view.live.dedup();
        view.settled.sort_unstable();
        view.settled.dedup();
        view.others.sort_unstable();
        view.others.dedup();
        view.lost.sort_unstable();
        view.lost.dedup_by(|a, b| a.0 == b.0);
        self.log_lost(&view);
        Ok(view)
    }

    /// Logs each member the first time it is counted lost, and again live if it renews.
    fn log_lost(&mut self, view: &View) {
        let lost: std::collections::BTreeSet<String> =
            view.lost.iter().map(|(m, _)| m.clone()).collect();
        for (member, ago) in &view.lost {
            if !self.lost.contains(member) {
                tracing::warn!(
                    %member,
                    "scale-out member lost: its membership Lease was not renewed for {:.1}s (renew_deadline {}: it has stopped); its clusters go to the other members, each taken when its cluster Lease expires (lease_duration {})",
                    ago.as_secs_f64(),
                    humantime::format_duration(self.renew_deadline),
                    humantime::format_duration(self.lease_duration),
                );
            }
        }
        for member in self.lost.difference(&lost) {
            if view.live.contains(member) {
                tracing::info!(%member, "scale-out member renews its membership Lease again");
            }
        }
        self.lost = lost;
    }
}

/// The value of `key` in a Lease's labels or annotations, or "" when absent.
fn meta_value(map: Option<&BTreeMap<String, String>>, key: &str) -> String {
    map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_lists_fingerprint_ignores_order_and_duplicates() {
        let a = clusters_fingerprint(&["b".into(), "a".into()]);
        assert_eq!(
            a,
            clusters_fingerprint(&["a".into(), "b".into(), "a".into()])
        );
        assert_ne!(
            a,
            clusters_fingerprint(&["a".into(), "b".into(), "c".into()])
        );
        assert_ne!(
            clusters_fingerprint(&["ab".into()]),
            clusters_fingerprint(&["a".into(), "b".into()])
        );
    }

    #[test]
    fn lease_names_are_dns_names_that_keep_different_clusters_apart() {
        let a = lease_name("kubesink", "cluster", "Prod_EU/1");
        assert!(a.starts_with("kubesink-cluster-prod-eu-1-"), "{a}");
        assert!(a
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        assert_ne!(a, lease_name("kubesink", "cluster", "prod-eu-1"));
        let long = lease_name("kubesink", "member", &"x".repeat(300));
        assert!(long.len() < 80, "{long}");
    }
}
