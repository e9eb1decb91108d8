//! `kubesink check --online`: what the offline check cannot know, asked of each configured
//! cluster's API server before the first run.
//!
//! For every configured resource of every cluster (config order), one [`Line`]:
//! - **discovery**: the apiVersion and kind resolve, through the same
//!   [`crate::cluster::resolve`] `run` uses; when they do not, [`discovery`] says what the
//!   server serves instead (the nearest kind, the group's versions, the nearest group);
//! - **access**: a `SelfSubjectAccessReview` per verb (`list`, `watch`) and scope (each
//!   configured namespace, or all), [`access`]; the answer is for the identity the client
//!   runs as (the kubeconfig's user, the Pod's service account, or `--as`);
//! - **list**: a LIST with `limit=1` and the configured label and field selectors in each
//!   scope, so the API server validates the selectors (a bad one is 400 with its message) and
//!   the list `run` starts with is known to work.
//!
//! A group-form entry (`group`, `kinds`) gets one line saying which kinds it resolves to
//! now (the discovery `run` makes, `crate::cluster::discover_kinds`), then the three checks
//! above for each of them.
//!
//! With `shards > 1`, one line saying whether the API server filters by shard and how
//! today's namespaces spread over the shards (`shards.rs`). With leader election, one more
//! line for the Lease (`get`, `create`, `update`) on the cluster that holds it. A cluster that does not answer `/version` gets one line naming it
//! and the error, and nothing else is asked of it. Every request is bounded by a timeout.
//!
//! This module only reads (discovery, LIST, access reviews, which the server does not
//! store): it never writes an object.

mod access;
mod discovery;
mod resource;
mod shards;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;

use crate::config::Cluster;
use crate::plan::Plan;

/// How many resources of a cluster (and namespaces of a resource) are checked at once.
const CONCURRENCY: usize = 4;

/// What `--online` was asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bound on each request to an API server.
    pub timeout: Duration,
    /// Ask as this user (the `Impersonate-User` header, as `kubectl --as`), e.g. the
    /// service account kubesink will run as; `None`: as the client's own identity.
    pub impersonate: Option<String>,
}

/// The verdict of one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Everything on the line was found and allowed.
    Ok,
    /// Something on the line would make `run` fail.
    Fail,
}

/// One line of the report: a resource of a cluster, the Lease, or a cluster that could not
/// be asked at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// Ok or failed.
    pub verdict: Verdict,
    /// The cluster's name.
    pub cluster: String,
    /// What was checked (`v1/Pod (all namespaces)`, `Lease default/kubesink`); `None` for
    /// the cluster itself.
    pub subject: Option<String>,
    /// What was found, or what is wrong.
    pub detail: String,
    /// Whether the cluster could not be reached (the only line of that cluster).
    pub unreachable: bool,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Ok => "ok",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{verdict:<4} {}", self.cluster)?;
        if let Some(subject) = &self.subject {
            write!(f, " {subject}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// Every line, in configuration order: clusters, then their resources, then the Lease.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The lines.
    pub lines: Vec<Line>,
}

impl Report {
    /// Whether every line is ok.
    pub fn passed(&self) -> bool {
        self.lines.iter().all(|l| l.verdict == Verdict::Ok)
    }

    /// One sentence: how many lines passed and failed, and which clusters were unreachable.
    pub fn summary(&self) -> String {
        let failed = self
            .lines
            .iter()
            .filter(|l| l.verdict == Verdict::Fail)
            .count();
        let mut out = format!(
            "online check: {} ok, {failed} failed",
            self.lines.len() - failed
        );
        let unreachable: Vec<&str> = self
            .lines
            .iter()
            .filter(|l| l.unreachable)
            .map(|l| l.cluster.as_str())
            .collect();
        if !unreachable.is_empty() {
            out.push_str(&format!(
                "; unreachable, not checked: {}",
                unreachable.join(", ")
            ));
        }
        // The brokers are not asked: said, so that "0 failed" is not read as "sinks fine".
        out.push_str(" (the Kubernetes side only: sinks are not checked; `run`'s /readyz says whether they answer)");
        out
    }
}

/// Checks every cluster of `plan` (at once; the report keeps configuration order).
pub async fn run(plan: &Plan, options: &Options) -> Report {
    let checks = plan.clusters.iter().enumerate().map(|(i, unit)| {
        let lease = plan
            .lease
            .as_ref()
            .filter(|l| l.at == i)
            .map(|l| &l.election);
        check_cluster(&unit.cluster, lease, options)
    });
    let lines = futures::future::join_all(checks)
        .await
        .into_iter()
        .flatten()
        .collect();
    Report { lines }
}

/// The lines of one cluster: its resources, then the Lease when it holds it.
async fn check_cluster(
    cluster: &Cluster,
    lease: Option<&crate::config::LeaderElectionConfig>,
    options: &Options,
) -> Vec<Line> {
    let unreachable = |detail: String| {
        vec![Line {
            verdict: Verdict::Fail,
            cluster: cluster.name.clone(),
            subject: None,
            detail,
            unreachable: true,
        }]
    };
    let client = match crate::cluster::client_as(cluster, options.impersonate.as_deref()).await {
        Ok(c) => c,
        Err(e) => return unreachable(format!("cannot connect, nothing checked: {e}")),
    };
    match within(options.timeout, client.apiserver_version()).await {
        Ok(_) => {}
        Err(e) if e.is_api() => {
            return unreachable(format!(
                "the API server refused /version, nothing checked: {e}"
            ))
        }
        Err(e) => return unreachable(format!("cluster unreachable, nothing checked: {e}")),
    }
    // The owner index's own watches need their access too.
    let all = crate::informer::with_index_resources(&cluster.resources);
    let mut lines: Vec<Line> = futures::stream::iter(&all)
        .map(|res| resource::check_entry(&client, &cluster.name, res, options.timeout))
        .buffered(CONCURRENCY)
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    lines.extend(shards::check(&client, cluster, options.timeout).await);
    if let Some(le) = lease {
        lines.push(access::lease(&client, &cluster.name, le, options.timeout).await);
    }
    lines
}

/// Why a request got no useful answer.
#[derive(Debug)]
pub(crate) enum CallError {
    /// No answer within the timeout.
    Timeout(Duration),
    /// The client's error (an API `Status`, or the connection).
    Kube(kube::Error),
}

impl CallError {
    /// Whether the API server answered with a `Status`.
    fn is_api(&self) -> bool {
        matches!(self, CallError::Kube(kube::Error::Api(_)))
    }

    /// The `Status` code, when the API server answered with one.
    pub(crate) fn code(&self) -> Option<u16> {
        match self {
            CallError::Kube(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        }
    }

    /// The `Status` message alone, or the whole error.
    pub(crate) fn message(&self) -> String {
        match self {
            CallError::Kube(kube::Error::Api(s)) => s.message.clone(),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Timeout(t) => {
                write!(f, "no answer within {}", humantime::format_duration(*t))
            }
            CallError::Kube(kube::Error::Api(s)) => {
                write!(f, "{} {}: {}", s.code, s.reason, s.message)
            }
            CallError::Kube(e) => f.write_str(&crate::cluster::error_chain(e)),
        }
    }
}

/// `call`, bounded by `timeout`.
pub(crate) async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(CallError::Kube),
        Err(_) => Err(CallError::Timeout(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(verdict: Verdict, subject: Option<&str>, detail: &str) -> Line {
        Line {
            verdict,
            cluster: "prod-eu-1".into(),
            subject: subject.map(str::to_owned),
            detail: detail.into(),
            unreachable: subject.is_none(),
        }
    }

    #[test]
    fn lines_align_their_verdicts_and_the_summary_names_unreachable_clusters() {
        let ok = line(
            Verdict::Ok,
            Some("v1/Pod (all namespaces)"),
            "found, list ok, list+watch allowed",
        );
        assert_eq!(
            ok.to_string(),
            "ok   prod-eu-1 v1/Pod (all namespaces): found, list ok, list+watch allowed"
        );
        let down = line(
            Verdict::Fail,
            None,
            "cluster unreachable, nothing checked: x",
        );
        assert_eq!(
            down.to_string(),
            "FAIL prod-eu-1: cluster unreachable, nothing checked: x"
        );
        let report = Report {
            lines: vec![ok, down],
        };
        assert!(!report.passed());
        assert!(report
            .summary()
            .starts_with("online check: 1 ok, 1 failed; unreachable, not checked: prod-eu-1 (the Kubernetes side only: sinks are not checked"));
    }
}
