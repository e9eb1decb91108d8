//! Simulated authorization: the verbs the simulated user may not use on which resources, in
//! which namespaces. By default everything is allowed (the simulator has no RBAC); each
//! [`Denial`] takes one permission away, as a missing RBAC rule would. Denials are answered
//! twice, consistently: a request they cover gets 403 Forbidden with the RBAC authorizer's
//! message, and a `SelfSubjectAccessReview` asking about it
//! (<https://kubernetes.io/docs/reference/access-authn-authz/authorization/#checking-api-access>)
//! answers `allowed: false`. Denials are the cluster's configuration, not a passing fault:
//! [`Faults::clear`] keeps them ([`Faults::clear_denials`] removes them). This module keeps
//! the rules; the server applies them.

use super::{Faults, RequestMatch};

/// One permission taken away: `verb` on `resource` of `group` in `namespace`; `None` in a
/// field means any.
///
/// A denial with a namespace also denies the request at the cluster scope (a list or watch
/// of all namespaces), since a grant for all namespaces would include that one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Denial {
    /// The verb (`list`, `watch`, `get`, `create`, `update`, …); `None`: every verb.
    pub verb: Option<String>,
    /// The API group ("" for the core group); `None`: every group.
    pub group: Option<String>,
    /// The plural resource name (`pods`); `None`: every resource.
    pub resource: Option<String>,
    /// The namespace; `None`: every namespace and the cluster scope.
    pub namespace: Option<String>,
}

/// A `--deny` rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a denial: expected VERB:RESOURCE[.GROUP][:NAMESPACE], e.g. watch:pods, list:deployments.apps:team-a (* for any verb or resource)")]
pub struct DenialParseError(pub String);

impl Denial {
    /// Parses `VERB:RESOURCE[.GROUP][:NAMESPACE]` (kubectl's spelling of a resource in a
    /// group, `deployments.apps`), with `*` for any verb or resource: `watch:pods`,
    /// `list:deployments.apps:team-a`, `*:leases.coordination.k8s.io`. A resource without a
    /// group is in the core group.
    ///
    /// # Errors
    /// [`DenialParseError`] naming the text.
    pub fn parse(text: &str) -> Result<Denial, DenialParseError> {
        let bad = || DenialParseError(text.to_owned());
        let mut parts = text.split(':');
        let (Some(verb), Some(resource)) = (parts.next(), parts.next()) else {
            return Err(bad());
        };
        let namespace = parts.next();
        if parts.next().is_some() || verb.is_empty() || resource.is_empty() {
            return Err(bad());
        }
        if namespace.is_some_and(str::is_empty) {
            return Err(bad());
        }
        let any = |s: &str| (s != "*").then(|| s.to_owned());
        let (resource, group) = match resource.split_once('.') {
            Some((r, g)) => (r, any(g)),
            None if resource == "*" => (resource, None),
            None => (resource, Some(String::new())),
        };
        Ok(Denial {
            verb: any(verb),
            group,
            resource: any(resource),
            namespace: namespace.map(str::to_owned),
        })
    }

    /// Whether this denial covers `verb` on `group`/`resource` in `namespace` (`None`: the
    /// cluster scope).
    pub fn covers(&self, verb: &str, group: &str, resource: &str, namespace: Option<&str>) -> bool {
        let is = |rule: &Option<String>, value: &str| rule.as_deref().is_none_or(|r| r == value);
        is(&self.verb, verb)
            && is(&self.group, group)
            && is(&self.resource, resource)
            && match (&self.namespace, namespace) {
                (None, _) | (Some(_), None) => true,
                (Some(rule), Some(ns)) => rule == ns,
            }
    }
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = self.verb.as_deref().unwrap_or("*");
        let resource = self.resource.as_deref().unwrap_or("*");
        write!(f, "{verb}:{resource}")?;
        match self.group.as_deref() {
            Some("") => {}
            Some(g) => write!(f, ".{g}")?,
            None if self.resource.is_some() => write!(f, ".*")?,
            None => {}
        }
        if let Some(ns) = &self.namespace {
            write!(f, ":{ns}")?;
        }
        Ok(())
    }
}

impl Faults {
    /// Takes a permission away (see [`Denial`]): requests it covers get 403 Forbidden and
    /// access reviews about them answer `allowed: false`. Open watches of the resource end,
    /// so their next request meets the denial.
    pub fn deny(&self, denial: Denial) {
        let ends = match (&denial.group, &denial.resource) {
            (Some(group), Some(plural)) => RequestMatch::Resource {
                group: group.clone(),
                plural: plural.clone(),
            },
            _ => RequestMatch::PathPrefix(String::new()),
        };
        {
            let mut rules = self.denials.lock().unwrap_or_else(|p| p.into_inner());
            if !rules.contains(&denial) {
                rules.push(denial);
            }
        }
        self.end_watches_matching(&ends);
    }

    /// Gives back a permission taken by [`Faults::deny`] with exactly this rule.
    pub fn undeny(&self, denial: &Denial) {
        self.denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|d| d != denial);
    }

    /// Removes every denial: everything is allowed again.
    pub fn clear_denials(&self) {
        self.denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// The denials in force, in the order they were added.
    pub fn denials(&self) -> Vec<Denial> {
        self.denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The first denial covering `verb` on `group`/`resource` in `namespace`, if any.
    pub fn denial_of(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> Option<Denial> {
        self.denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|d| d.covers(verb, group, resource, namespace))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_in_kubectl_spelling_and_print_back() {
        for text in [
            "watch:pods",
            "list:deployments.apps:team-a",
            "*:leases.coordination.k8s.io",
            "*:*",
            "get:*:x",
        ] {
            assert_eq!(Denial::parse(text).unwrap().to_string(), text);
        }
        let d = Denial::parse("watch:pods").unwrap();
        assert_eq!(
            (d.verb.as_deref(), d.group.as_deref(), d.resource.as_deref()),
            (Some("watch"), Some(""), Some("pods"))
        );
        for bad in ["", "watch", "watch:", ":pods", "watch:pods:", "a:b:c:d"] {
            assert!(Denial::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_namespaced_denial_also_denies_the_cluster_scope_but_not_other_namespaces() {
        let d = Denial::parse("watch:pods:team-a").unwrap();
        assert!(d.covers("watch", "", "pods", Some("team-a")));
        assert!(d.covers("watch", "", "pods", None));
        assert!(!d.covers("watch", "", "pods", Some("team-b")));
        assert!(!d.covers("list", "", "pods", Some("team-a")));
        assert!(!d.covers("watch", "apps", "pods", Some("team-a")));
        let everywhere = Denial::parse("*:deployments.apps").unwrap();
        assert!(everywhere.covers("list", "apps", "deployments", Some("x")));
        assert!(!everywhere.covers("list", "", "deployments", Some("x")));
    }
}
