//! One configured resource of one cluster: discovery, access in each scope, and the LIST
//! that validates the selectors, gathered into one [`Line`].

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams};
use kube::Client;

use super::{access, discovery, within, Line, Verdict, CONCURRENCY};
use crate::cluster::{self, ClusterError};
use crate::config::ResourceConfig;

/// What was learned in one scope (a namespace, or all of them).
struct Scoped {
    /// `None`: all namespaces (or the cluster scope).
    namespace: Option<String>,
    /// The verbs the access review denied, in `access::WATCH_VERBS` order.
    denied: Vec<&'static str>,
    /// A problem of the access review or the LIST.
    problems: Vec<String>,
}

/// The lines of entry `res` of cluster `cluster_name`: one ([`check`]) for a kind; for the
/// group form, which kinds it resolves to now, then one per kind.
pub(super) async fn check_entry(
    client: &Client,
    cluster_name: &str,
    res: &ResourceConfig,
    timeout: Duration,
) -> Vec<Line> {
    let Some(selector) = res.selector() else {
        return vec![check(client, cluster_name, res, timeout).await];
    };
    let line = |verdict, detail| Line {
        verdict,
        cluster: cluster_name.to_owned(),
        subject: Some(res.display_name()),
        detail,
        unreachable: false,
    };
    let found =
        tokio::time::timeout(timeout, cluster::discover_kinds(client, res, &selector)).await;
    let kinds = match found {
        Err(_) => {
            return vec![line(
                Verdict::Fail,
                format!(
                    "API discovery got no answer within {}",
                    humantime::format_duration(timeout)
                ),
            )]
        }
        Ok(Err(e)) => return vec![line(Verdict::Fail, e.to_string())],
        Ok(Ok(kinds)) => kinds,
    };
    let names: Vec<String> = kinds
        .iter()
        .map(|d| format!("{} {}", d.api_resource.api_version, d.api_resource.kind))
        .collect();
    let detail = match names.is_empty() {
        true => "resolves to no kind now (followed when one is served: a CRD installed)".to_owned(),
        false => format!(
            "resolves to {} kind(s) now: {}",
            names.len(),
            names.join(", ")
        ),
    };
    let mut lines = vec![line(Verdict::Ok, detail)];
    for d in &kinds {
        let ar = &d.api_resource;
        let one = res.for_kind(&ar.api_version, &ar.kind, &ar.plural, d.namespaced);
        lines.push(check(client, cluster_name, &one, timeout).await);
    }
    lines
}

/// Checks `res` of cluster `cluster_name` through `client`.
pub(super) async fn check(
    client: &Client,
    cluster_name: &str,
    res: &ResourceConfig,
    timeout: Duration,
) -> Line {
    let fail = |subject: String, detail: String| Line {
        verdict: Verdict::Fail,
        cluster: cluster_name.to_owned(),
        subject: Some(subject),
        detail,
        unreachable: false,
    };
    let name = format!("{}/{}", res.api_version, res.kind);
    let configured_scope = scope_text(&res.namespaces, false);
    let resolved =
        match tokio::time::timeout(timeout, cluster::resolve(client, cluster_name, res)).await {
            Err(_) => {
                return fail(
                    format!("{name} {configured_scope}"),
                    format!(
                        "API discovery got no answer within {}",
                        humantime::format_duration(timeout)
                    ),
                )
            }
            Ok(Ok(r)) => r,
            Ok(Err(ClusterError::ClusterScoped { .. })) => {
                return fail(
                    format!("{name} {configured_scope}"),
                    "found, but cluster-scoped: remove its namespaces list".to_owned(),
                )
            }
            Ok(Err(e)) if e.is_not_found() => {
                return fail(
                    format!("{name} {configured_scope}"),
                    discovery::diagnose(client, res, timeout).await,
                )
            }
            Ok(Err(e)) => return fail(format!("{name} {configured_scope}"), e.to_string()),
        };
    let namespaced = resolved.resource.namespaced;
    let subject = format!("{name} {}", scope_text(&res.namespaces, !namespaced));
    let ar = &resolved.api_resource;
    let mut problems = Vec::new();
    if let Some(plural) = res.plural.as_deref().filter(|p| *p != ar.plural) {
        problems.push(format!(
            "plural {plural:?} configured, {:?} served: `kubesink rbac` names the wrong resource",
            ar.plural
        ));
    }
    let scopes: Vec<Option<&str>> = if res.namespaces.is_empty() {
        vec![None]
    } else {
        res.namespaces.iter().map(|ns| Some(ns.as_str())).collect()
    };
    let scoped: Vec<Scoped> = futures::stream::iter(scopes)
        .map(|ns| check_scope(client, ar, res, ns, timeout))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let denied = access::denials_text(
        scoped
            .iter()
            .map(|s| (s.namespace.as_deref(), s.denied.as_slice())),
    );
    for problem in scoped.iter().flat_map(|s| &s.problems) {
        if !problems.contains(problem) {
            problems.push(problem.clone());
        }
    }
    if let Some(denied) = denied {
        problems.push(format!(
            "{denied} (`kubesink rbac` prints the RBAC this configuration needs)"
        ));
    }
    if !problems.is_empty() {
        return fail(subject, problems.join("; "));
    }
    let listed = if res.label_selector.is_some() || res.field_selector.is_some() {
        "selector ok"
    } else {
        "list ok"
    };
    Line {
        verdict: Verdict::Ok,
        cluster: cluster_name.to_owned(),
        subject: Some(subject),
        detail: format!("found, {listed}, list+watch allowed"),
        unreachable: false,
    }
}

/// `(all namespaces)`, `(namespace a)`, `(namespaces a, b)` or `(cluster-scoped)`.
fn scope_text(namespaces: &[String], cluster_scoped: bool) -> String {
    match namespaces {
        _ if cluster_scoped => "(cluster-scoped)".to_owned(),
        [] => "(all namespaces)".to_owned(),
        [one] => format!("(namespace {one})"),
        many => format!("(namespaces {})", many.join(", ")),
    }
}

/// Access and the LIST in one scope. The LIST is sent only when the review allowed it: a
/// denied one would only repeat the denial.
async fn check_scope(
    client: &Client,
    ar: &kube::discovery::ApiResource,
    res: &ResourceConfig,
    namespace: Option<&str>,
    timeout: Duration,
) -> Scoped {
    let mut scoped = Scoped {
        namespace: namespace.map(str::to_owned),
        denied: Vec::new(),
        problems: Vec::new(),
    };
    let where_ = namespace.map_or(String::new(), |ns| format!(" in namespace {ns}"));
    for verb in access::WATCH_VERBS {
        let attributes = access::attributes(verb, &ar.group, &ar.plural, namespace, None);
        match access::review(client, attributes, timeout).await {
            Ok(true) => {}
            Ok(false) => scoped.denied.push(verb),
            Err(e) => scoped
                .problems
                .push(format!("access review of {verb}{where_} failed: {e}")),
        }
    }
    if scoped.denied.contains(&"list") || !scoped.problems.is_empty() {
        return scoped;
    }
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    let mut params = ListParams::default().limit(1);
    if let Some(labels) = &res.label_selector {
        params = params.labels(labels);
    }
    if let Some(fields) = &res.field_selector {
        params = params.fields(fields);
    }
    match within(timeout, api.list_metadata(&params)).await {
        Ok(_) => {}
        Err(e) if e.code() == Some(400) => {
            let which = match (&res.label_selector, &res.field_selector) {
                (Some(l), Some(f)) => format!("label selector {l:?} or field selector {f:?}"),
                (Some(l), None) => format!("label selector {l:?}"),
                (None, Some(f)) => format!("field selector {f:?}"),
                (None, None) => "the list".to_owned(),
            };
            // The same in every namespace: said once ([`check`] drops repeats).
            scoped.problems.push(format!(
                "{which} rejected by the API server: {}",
                e.message()
            ));
        }
        Err(e) => scoped.problems.push(format!("list{where_} failed: {e}")),
    }
    scoped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_read_as_configured() {
        let ns = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(scope_text(&[], false), "(all namespaces)");
        assert_eq!(scope_text(&[], true), "(cluster-scoped)");
        assert_eq!(scope_text(&ns(&["a"]), false), "(namespace a)");
        assert_eq!(scope_text(&ns(&["a", "b"]), false), "(namespaces a, b)");
    }
}
