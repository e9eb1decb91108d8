//! The group form of `[[resources]]` (`group`, `kinds`, `exclude`): which of the kinds API
//! discovery finds an entry follows. Pure: the discovery itself is `crate::cluster`'s, the
//! following as kinds come and go `crate::bridge`'s (`groups.rs`).

use std::fmt;

/// What a group-form entry follows ([`super::ResourceConfig::selector`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSelector {
    /// The API group (`""`: the core group); `None`: every group.
    pub group: Option<String>,
    /// Only these kinds (case-sensitive, as discovery spells them); `None`: all.
    pub kinds: Option<Vec<String>>,
    /// `exclude`, as configured (see [`GroupSelector::excludes`]).
    pub exclude: Vec<String>,
    /// The entry lists namespaces: cluster-scoped kinds cannot be watched in them.
    pub namespaced_only: bool,
}

/// One kind as API discovery serves it, what a [`GroupSelector`] decides on.
#[derive(Clone, Copy, Debug)]
pub struct ServedKind<'a> {
    /// Its group (`""`: core).
    pub group: &'a str,
    /// Its Kind.
    pub kind: &'a str,
    /// Its plural (the resource's name in URLs and RBAC).
    pub plural: &'a str,
    /// Namespace-scoped.
    pub namespaced: bool,
}

impl GroupSelector {
    /// Whether the entry follows `k` (a kind that can be listed and watched; subresources
    /// are never offered): in its group, one of its kinds, not excluded, and namespaced
    /// when the entry lists namespaces.
    pub fn follows(&self, k: ServedKind<'_>) -> bool {
        self.group.as_deref().is_none_or(|g| g == k.group)
            && self
                .kinds
                .as_ref()
                .is_none_or(|kinds| kinds.iter().any(|w| w == k.kind))
            && (!self.namespaced_only || k.namespaced)
            && !self.exclude.iter().any(|e| excludes(e, k))
    }

    /// The groups discovery needs asking about: the one group, or `None` for all.
    pub fn discovery_group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Whether a CustomResourceDefinition named `name` (`plural.group`) may concern this
    /// entry: its group is the entry's, or the entry takes every group.
    pub fn concerns_crd(&self, name: &str) -> bool {
        match &self.group {
            None => true,
            Some(g) => name.split_once('.').is_some_and(|(_, group)| group == g),
        }
    }
}

/// Whether `exclude` entry `e` names `k`: the group alone (`coordination.k8s.io`) or as
/// `*.group`; the plural or Kind (case ignored) alone, in any group; or `plural.group` /
/// `Kind.group` (`core` for the core group).
fn excludes(e: &str, k: ServedKind<'_>) -> bool {
    let e = e.trim();
    if excludes_group(e, k.group) {
        return true;
    }
    let group_name = group_name(k.group);
    let names = |r: &str| r.eq_ignore_ascii_case(k.plural) || r.eq_ignore_ascii_case(k.kind);
    match e.split_once('.') {
        None => names(e),
        Some((r, g)) => names(r) && g == group_name,
    }
}

/// Whether `exclude` entry `e` names the whole API group `group` (`""`: core): the group's
/// name alone, or `*.group`.
pub fn excludes_group(e: &str, group: &str) -> bool {
    let name = group_name(group);
    e == name || e.strip_prefix("*.") == Some(name)
}

/// How the configuration names API group `group`: itself, or `core` for the core group
/// (`""`).
pub fn group_name(group: &str) -> &str {
    match group {
        "" => "core",
        g => g,
    }
}

impl fmt::Display for GroupSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.group.as_deref() {
            None => f.write_str("group *")?,
            Some(g) => write!(f, "group {}", group_name(g))?,
        }
        if let Some(kinds) = &self.kinds {
            write!(f, " (kinds {})", kinds.join(", "))?;
        }
        if !self.exclude.is_empty() {
            write!(f, " (except {})", self.exclude.join(", "))?;
        }
        Ok(())
    }
}

/// What is wrong with `group` as a `group` value, if anything: an API group name is a DNS
/// subdomain (lowercase letters, digits, `-` and `.`), or `"*"`, `"core"`, `""`.
pub fn group_problem(group: &str) -> Option<String> {
    if matches!(group, "*" | "core" | "") {
        return None;
    }
    let ok = group.len() <= 253
        && group.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    (!ok).then(|| {
        format!(
            "{group:?} is not an API group: a DNS subdomain such as \"example.com\" or \"apps\" (\"core\" for the core group, \"*\" for every group)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind<'a>(
        group: &'a str,
        kind: &'a str,
        plural: &'a str,
        namespaced: bool,
    ) -> ServedKind<'a> {
        ServedKind {
            group,
            kind,
            plural,
            namespaced,
        }
    }

    fn selector(group: Option<&str>, kinds: Option<&[&str]>, exclude: &[&str]) -> GroupSelector {
        GroupSelector {
            group: group.map(str::to_owned),
            kinds: kinds.map(|k| k.iter().map(|s| s.to_string()).collect()),
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
            namespaced_only: false,
        }
    }

    #[test]
    fn an_entry_follows_its_group_its_kinds_and_nothing_it_excludes() {
        let widget = kind("example.com", "Widget", "widgets", true);
        let lease = kind("coordination.k8s.io", "Lease", "leases", true);
        let core_event = kind("", "Event", "events", true);
        let new_event = kind("events.k8s.io", "Event", "events", true);
        let node = kind("", "Node", "nodes", false);

        let group = selector(Some("example.com"), None, &[]);
        assert!(group.follows(widget));
        assert!(!group.follows(lease));

        let some = selector(Some("example.com"), Some(&["Gadget"]), &[]);
        assert!(!some.follows(widget));

        let all = selector(None, None, &["*.coordination.k8s.io", "events.core"]);
        assert!(all.follows(widget) && all.follows(new_event) && all.follows(node));
        assert!(!all.follows(lease) && !all.follows(core_event));
        for e in [
            "coordination.k8s.io",
            "leases",
            "Lease",
            "leases.coordination.k8s.io",
        ] {
            assert!(!selector(None, None, &[e]).follows(lease), "{e}");
        }
        assert!(selector(None, None, &["leases.apps"]).follows(lease));
        let events = selector(None, None, &["events"]);
        assert!(!events.follows(core_event) && !events.follows(new_event));
        let only_new = selector(None, None, &["events.events.k8s.io"]);
        assert!(only_new.follows(core_event) && !only_new.follows(new_event));

        let core = selector(Some(""), None, &[]);
        assert!(core.follows(node) && !core.follows(widget));
        let mut namespaced = selector(None, None, &[]);
        namespaced.namespaced_only = true;
        assert!(namespaced.follows(widget) && !namespaced.follows(node));
    }

    #[test]
    fn a_crd_concerns_the_entry_of_its_group_or_of_every_group() {
        assert!(selector(Some("example.com"), None, &[]).concerns_crd("widgets.example.com"));
        assert!(!selector(Some("example.com"), None, &[]).concerns_crd("widgets.other.io"));
        assert!(!selector(Some("example.com"), None, &[]).concerns_crd("widgets.sub.example.com"));
        assert!(selector(None, None, &[]).concerns_crd("widgets.other.io"));
    }

    #[test]
    fn group_names_are_dns_subdomains_or_the_special_spellings() {
        for ok in ["*", "core", "", "example.com", "apps", "a-b.c1"] {
            assert_eq!(group_problem(ok), None, "{ok}");
        }
        for bad in ["Example.com", "apps/v1", "a..b", "-a", " apps"] {
            assert!(group_problem(bad).is_some(), "{bad}");
        }
    }
}
