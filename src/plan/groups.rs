//! What `check` can tell offline of the group-form entries (`group`, `kinds`, `exclude`)
//! of one cluster's resources, from the built-in kinds k8s-openapi knows (`kinds.rs`):
//! - a kind or an `exclude` entry that names no built-in kind of a built-in group (a typo:
//!   `"secrtes"`, `"Secrte"`), or a kind spelt in lower case, with the nearest name;
//! - an entry whose `kinds` are all excluded (it follows nothing);
//! - an entry whose RBAC grants Secrets (`kubesink rbac` cannot leave out what `exclude`
//!   does), so that nobody reads "excluded" as "not readable";
//! - two entries that can follow the same kind in overlapping but different namespaces
//!   (the same namespaces are handled at run time: the later entry leaves the kind).
//!
//! Custom resources are not known offline: a name in a group that is not built in is taken
//! as written (`check --online` lists what each entry resolves to).

use crate::config::{excludes_group, group_name, GroupSelector, ResourceConfig, ServedKind};

use super::kinds::{builtin, nearest, BUILTINS};

/// What the group-form entries among `resources` (keys under `{prefix}resources`) name
/// that matches nothing: typos, lower-case kinds, entries whose kinds are all excluded.
/// Errors with `check --strict`, as [`super::kinds::kind_warnings`].
pub fn spelling_warnings(resources: &[ResourceConfig], prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, r) in resources.iter().enumerate() {
        let Some(s) = r.selector() else { continue };
        let key = format!("{prefix}resources.{i}");
        out.extend(spelling(&s, &key));
        if let Some(kinds) = &s.kinds {
            let followed = kinds.iter().any(|k| {
                !s.exclude.iter().any(|e| {
                    e.split_once('.')
                        .map_or(e.as_str(), |(name, _)| name)
                        .eq_ignore_ascii_case(k)
                })
            });
            if !followed {
                out.push(format!(
                    "{key} ({}): every kind of kinds is excluded: the entry follows nothing",
                    r.display_name()
                ));
            }
        }
    }
    out
}

/// The other warnings of the group-form entries among `resources`: Secrets their RBAC
/// grants, and overlaps with other entries.
pub fn group_warnings(resources: &[ResourceConfig], prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, r) in resources.iter().enumerate() {
        let Some(s) = r.selector() else { continue };
        let key = format!("{prefix}resources.{i}");
        if grants_secrets(&s) {
            let excluded = !s.follows(secret(true));
            let why = match excluded {
                true => "exclude leaves Secrets out of the messages, but RBAC cannot exclude",
                false => "the entry follows Secrets (their data is never sent without allow_secret_data, which the group form does not take)",
            };
            out.push(format!(
                "{key} ({}): `kubesink rbac` grants list and watch of every resource of the core group here, Secrets included ({why}): a list returns their data to kubesink's service account; to keep Secrets unreadable, name the kinds instead (group = \"core\", kinds = [\"ConfigMap\", ...])",
                r.display_name()
            ));
        }
    }
    for (i, a) in resources.iter().enumerate() {
        for (j, b) in resources.iter().enumerate().skip(i + 1) {
            if (a.selector().is_some() || b.selector().is_some()) && overlap(a, b) {
                out.push(format!(
                    "{prefix}resources.{i} ({}) and {prefix}resources.{j} ({}) can follow the same kinds in overlapping namespaces: every change of those is reported twice; give them the same namespaces (the later entry then leaves a kind to the earlier) or exclude the kinds from one",
                    a.display_name(),
                    b.display_name()
                ));
            }
        }
    }
    out
}

/// v1 Secret as discovery serves it, namespace-scoped or not.
fn secret(namespaced: bool) -> ServedKind<'static> {
    ServedKind {
        group: "",
        kind: "Secret",
        plural: "secrets",
        namespaced,
    }
}

/// Whether the RBAC of `s` grants Secrets: every resource of the core group (or of every
/// group), or a kind named Secret.
fn grants_secrets(s: &GroupSelector) -> bool {
    s.group.as_deref().is_none_or(str::is_empty)
        && s.kinds
            .as_ref()
            .is_none_or(|kinds| kinds.iter().any(|k| k == "Secret"))
}

/// The kinds and `exclude` entries of `s` that name nothing built in, in a built-in group.
fn spelling(s: &GroupSelector, key: &str) -> Vec<String> {
    let groups: Vec<&str> = match &s.group {
        Some(g) => vec![g.as_str()],
        None => Vec::new(),
    };
    let builtin_group = |g: &str| BUILTINS.iter().any(|b| b.group == g);
    let mut out = Vec::new();
    for (j, k) in s.kinds.iter().flatten().enumerate() {
        if k.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.push(format!(
                "{key}.kinds.{j}: {k:?} starts in lower case, and kinds are Kinds as discovery spells them (\"Widget\", not \"widget\" nor \"widgets\"): it matches nothing"
            ));
            continue;
        }
        if let Some(g) = groups.first().filter(|g| builtin_group(g)) {
            if builtin(g, k).is_none() {
                let near = nearest(k, BUILTINS.iter().filter(|b| b.group == *g).map(|b| b.kind))
                    .map(|n| format!("; did you mean {n:?}?"))
                    .unwrap_or_default();
                out.push(format!(
                    "{key}.kinds.{j}: the built-in group {} has no kind {k:?}{near}",
                    group_name(g)
                ));
            }
        }
    }
    for (j, e) in s.exclude.iter().enumerate() {
        let e = e.trim();
        let (name, group) = match e.split_once('.') {
            None => (e, None),
            Some((name, group)) => (name, Some(if group == "core" { "" } else { group })),
        };
        // A whole group (`*.group`, or a group's name alone) is taken as written.
        if name == "*" || (group.is_none() && BUILTINS.iter().any(|b| b.group == e)) {
            continue;
        }
        let known = |b: &&super::kinds::Builtin| {
            b.plural.eq_ignore_ascii_case(name) || b.kind.eq_ignore_ascii_case(name)
        };
        let in_group = |b: &&super::kinds::Builtin| group.is_none_or(|g| b.group == g);
        let custom = group.is_some_and(|g| !builtin_group(g));
        if custom || BUILTINS.iter().filter(in_group).any(|b| known(&b)) {
            continue;
        }
        // Not a built-in kind: a custom resource's plural in any group, or a typo. A name
        // close to a built-in one is said to be a typo; in a built-in group, any name.
        let candidates = BUILTINS
            .iter()
            .filter(in_group)
            .flat_map(|b| [b.plural, b.kind]);
        match (nearest(name, candidates), group) {
            (Some(near), _) => out.push(format!(
                "{key}.exclude.{j}: {e:?} names no built-in kind; did you mean {near:?}? (a custom resource's plural is taken as written)"
            )),
            (None, Some(g)) => out.push(format!(
                "{key}.exclude.{j}: the built-in group {} has no resource {name:?}: it excludes nothing",
                group_name(g)
            )),
            (None, None) => {}
        }
    }
    out
}

/// Whether entries `a` and `b`, one of them in the group form, can follow a kind in
/// overlapping but different namespaces. Offline, a kind listed by `api_version` and
/// `kind` is judged with its built-in plural and scope when known (namespaced otherwise).
fn overlap(a: &ResourceConfig, b: &ResourceConfig) -> bool {
    let namespaces = |x: &ResourceConfig, y: &ResourceConfig| {
        x.namespaces.is_empty()
            || y.namespaces.is_empty()
            || x.namespaces.iter().any(|n| y.namespaces.contains(n))
    };
    if a.namespaces == b.namespaces || !namespaces(a, b) {
        return false;
    }
    match (a.selector(), b.selector()) {
        (Some(x), Some(y)) => {
            let drops = |s: &GroupSelector, g: &str| s.exclude.iter().any(|e| excludes_group(e, g));
            let groups = match (&x.group, &y.group) {
                (Some(p), Some(q)) => p == q,
                (Some(g), None) => !drops(&y, g),
                (None, Some(g)) => !drops(&x, g),
                (None, None) => true,
            };
            let kinds = match (&x.kinds, &y.kinds) {
                (Some(p), Some(q)) => p.iter().any(|k| q.contains(k)),
                _ => true,
            };
            groups && kinds
        }
        (Some(s), None) | (None, Some(s)) => {
            let one = if a.selector().is_none() { a } else { b };
            let (group, _) = one.group_version();
            let known = builtin(group, &one.kind);
            // A custom kind's plural is not known offline without `plural`: an exclusion by
            // plural is then not seen.
            let plural = known
                .map(|b| b.plural.to_owned())
                .or_else(|| one.plural.clone())
                .unwrap_or_default();
            s.follows(ServedKind {
                group,
                kind: &one.kind,
                plural: &plural,
                namespaced: known.is_none_or(|b| b.namespaced),
            })
        }
        (None, None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(toml: &str) -> ResourceConfig {
        toml::from_str(toml).expect("an entry")
    }

    #[test]
    fn typos_lower_case_kinds_secrets_and_empty_entries_are_named() {
        let w = |toml: &str| {
            let r = [entry(toml)];
            let mut all = spelling_warnings(&r, "");
            all.extend(group_warnings(&r, ""));
            all.join("\n")
        };
        assert!(w(r#"group = "*"
exclude = ["secrtes", "evnets", "widgets", "*.coordination.k8s.io", "coordination.k8s.io", "leases.coordination.k8s.io"]
namespaces = ["a"]"#)
            .contains(r#"resources.0.exclude.0: "secrtes" names no built-in kind; did you mean "secrets"?"#));
        let all = w(r#"group = "*"
exclude = ["secrtes", "evnets", "widgets", "*.coordination.k8s.io", "coordination.k8s.io", "leases.coordination.k8s.io"]
namespaces = ["a"]"#);
        assert!(all.contains("exclude.1: \"evnets\""), "{all}");
        assert!(
            !all.contains("exclude.2")
                && !all.contains("exclude.3")
                && !all.contains("exclude.4")
                && !all.contains("exclude.5"),
            "{all}"
        );
        assert!(
            all.contains("Secrets included (the entry follows Secrets"),
            "{all}"
        );
        let core = w(r#"group = "core"
kinds = ["pod", "Secrte"]"#);
        assert!(
            core.contains("kinds.0: \"pod\" starts in lower case"),
            "{core}"
        );
        assert!(
            core.contains(
                r#"kinds.1: the built-in group core has no kind "Secrte"; did you mean "Secret"?"#
            ),
            "{core}"
        );
        let excluded = w(r#"group = "*"
exclude = ["secrets"]"#);
        assert!(
            excluded
                .contains("exclude leaves Secrets out of the messages, but RBAC cannot exclude"),
            "{excluded}"
        );
        assert!(w(r#"group = "apps""#).is_empty());
        assert!(w(r#"group = "example.com"
kinds = ["Widget"]
exclude = ["widget"]"#)
        .contains("every kind of kinds is excluded"));
    }

    #[test]
    fn overlaps_read_exclusions_plurals_and_scopes() {
        let pair = |a: &str, b: &str| {
            !group_warnings(&[entry(a), entry(b)], "")
                .iter()
                .all(|w| !w.contains("overlapping"))
        };
        let star = "group = \"*\"\nnamespaces = [\"payments\"]\nexclude = [\"pods\", \"*.cert-manager.io\"]";
        assert!(
            !pair(star, "api_version = \"v1\"\nkind = \"Pod\""),
            "excluded by plural"
        );
        assert!(!pair(star, "group = \"cert-manager.io\""), "excluded group");
        assert!(
            !pair(star, "api_version = \"v1\"\nkind = \"Node\""),
            "cluster-scoped"
        );
        assert!(pair(star, "api_version = \"v1\"\nkind = \"ConfigMap\""));
        assert!(pair(star, "group = \"example.com\""));
    }
}
