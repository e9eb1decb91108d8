//! "May kubesink do this?", asked with `SelfSubjectAccessReview`
//! (`authorization.k8s.io/v1`, what `kubectl auth can-i` sends): the API server's authorizer
//! answers for the identity of the request, so the answer holds for kubesink only when the
//! check runs as kubesink (in its Pod, with its kubeconfig, or impersonating its service
//! account with `--as`). The verbs are those `kubesink rbac` grants (`src/rbac.rs`).

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::Client;

use super::{within, CallError, Line, Verdict};
use crate::config::LeaderElectionConfig;

/// The verbs every watched resource needs: the informer lists and watches.
pub(super) const WATCH_VERBS: [&str; 2] = ["list", "watch"];
/// The verbs on the Lease: read it, create it when missing, renew or take it over.
const LEASE_VERBS: [&str; 3] = ["get", "create", "update"];
/// With `leader_election.scale_out`, on every Lease of the namespace (`src/scale_out/`): the
/// same as `kubesink rbac` grants.
const SCALE_OUT_LEASE_VERBS: [&str; 5] = ["get", "list", "create", "update", "delete"];

/// The attributes of "may I `verb` `resource` of `group` in `namespace` (`None`: all
/// namespaces, or the cluster scope), named `name` (`None`: any)".
pub(super) fn attributes(
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> ResourceAttributes {
    ResourceAttributes {
        verb: Some(verb.to_owned()),
        group: Some(group.to_owned()),
        resource: Some(resource.to_owned()),
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        ..Default::default()
    }
}

/// Whether the API server allows `attributes` to the client's identity.
///
/// # Errors
/// [`CallError`]: the review could not be created (timeout, connection, a `Status`).
pub(super) async fn review(
    client: &Client,
    attributes: ResourceAttributes,
    timeout: Duration,
) -> Result<bool, CallError> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attributes),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = within(timeout, api.create(&PostParams::default(), &review)).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The denials of every scope in one phrase (`watch denied (all namespaces)`, `list+watch
/// denied in namespaces a, b`), or `None` when nothing was denied. Scopes with the same
/// denied verbs are named together, in the order given.
pub(super) fn denials_text<'a>(
    scopes: impl Iterator<Item = (Option<&'a str>, &'a [&'static str])>,
) -> Option<String> {
    let mut by_verbs: Vec<(String, Vec<Option<&'a str>>)> = Vec::new();
    for (namespace, denied) in scopes {
        if denied.is_empty() {
            continue;
        }
        let verbs = denied.join("+");
        match by_verbs.iter_mut().find(|(v, _)| *v == verbs) {
            Some((_, namespaces)) => namespaces.push(namespace),
            None => by_verbs.push((verbs, vec![namespace])),
        }
    }
    let phrases: Vec<String> = by_verbs
        .into_iter()
        .map(|(verbs, namespaces)| {
            let named: Vec<&str> = namespaces.iter().flatten().copied().collect();
            match named.as_slice() {
                [] => format!("{verbs} denied"),
                [one] => format!("{verbs} denied in namespace {one}"),
                many => format!("{verbs} denied in namespaces {}", many.join(", ")),
            }
        })
        .collect();
    (!phrases.is_empty()).then(|| phrases.join("; "))
}

/// The Lease line: `get`, `create` and `update` of the configured Lease, in the namespace
/// `run` would use ([`crate::leader::namespace`]).
pub(super) async fn lease(
    client: &Client,
    cluster_name: &str,
    config: &LeaderElectionConfig,
    timeout: Duration,
) -> Line {
    let namespace = crate::leader::namespace(config);
    let mut denied = Vec::new();
    let mut problems = Vec::new();
    // Scale-out's Leases are named at run time (one per replica and per cluster), listed by
    // label and deleted by a leaving replica: every verb on any Lease of the namespace.
    let verbs: &[&str] = if config.scale_out {
        &SCALE_OUT_LEASE_VERBS
    } else {
        &LEASE_VERBS
    };
    for &verb in verbs {
        // `create` cannot be restricted to a name (RBAC does not know it yet).
        let name = (verb != "create" && !config.scale_out).then_some(config.lease_name.as_str());
        let attributes = attributes(
            verb,
            "coordination.k8s.io",
            "leases",
            Some(&namespace),
            name,
        );
        match review(client, attributes, timeout).await {
            Ok(true) => {}
            Ok(false) => denied.push(verb),
            Err(e) => problems.push(format!("access review of {verb} failed: {e}")),
        }
    }
    if !denied.is_empty() {
        problems.push(format!(
            "{} denied (`kubesink rbac` prints the RBAC this configuration needs)",
            denied.join("+")
        ));
    }
    let (verdict, detail) = if problems.is_empty() {
        (Verdict::Ok, format!("{} allowed", verbs.join("+")))
    } else {
        (Verdict::Fail, problems.join("; "))
    };
    Line {
        verdict,
        cluster: cluster_name.to_owned(),
        subject: Some(if config.scale_out {
            format!(
                "Leases {namespace}/{0}-member-… and {namespace}/{0}-cluster-… (scale-out)",
                config.lease_name
            )
        } else {
            format!("Lease {namespace}/{}", config.lease_name)
        }),
        detail,
        unreachable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_are_grouped_by_verbs_and_name_their_namespaces() {
        let watch: &[&str] = &["watch"];
        let both: &[&str] = &["list", "watch"];
        let none: &[&str] = &[];
        assert_eq!(denials_text([(None, none)].into_iter()), None);
        assert_eq!(
            denials_text([(None, watch)].into_iter()).as_deref(),
            Some("watch denied")
        );
        assert_eq!(
            denials_text(
                [
                    (Some("a"), watch),
                    (Some("b"), none),
                    (Some("c"), watch),
                    (Some("d"), both)
                ]
                .into_iter()
            )
            .as_deref(),
            Some("watch denied in namespaces a, c; list+watch denied in namespace d")
        );
    }
}
