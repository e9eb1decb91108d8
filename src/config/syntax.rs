//! The syntax of Kubernetes names the configuration carries (label keys and values, DNS
//! labels, apiVersions), as the API conventions define them. Pure functions: each returns
//! why a value is refused, for the section's check to put in its message.

/// Kubernetes label value syntax: at most 63 characters of `[A-Za-z0-9._-]`, starting and
/// ending alphanumeric (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set).
pub(super) fn check_label_value(v: &str) -> Result<(), &'static str> {
    if v.len() > 63 {
        return Err("is longer than 63 characters (a label value)");
    }
    let ok_chars = v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let ends = v.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if ok_chars && ends {
        Ok(())
    } else {
        Err("is not a valid label value: use [A-Za-z0-9._-], starting and ending alphanumeric")
    }
}

/// Label key: optional DNS-subdomain prefix and `/`, then a name like a label value.
pub(super) fn check_label_key(k: &str) -> Result<(), &'static str> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        if p.is_empty() || p.len() > 253 || !p.split('.').all(|l| check_dns_label(l).is_ok()) {
            return Err("has an invalid prefix: expected a DNS subdomain such as kubesink.io");
        }
    }
    if name.is_empty() {
        return Err("has an empty name part");
    }
    check_label_value(name).map_err(|_| {
        "has an invalid name part: use [A-Za-z0-9._-], at most 63, alphanumeric at both ends"
    })
}

/// An apiVersion as Kubernetes writes it: `version` (the core group) or `group/version`, the
/// group a DNS subdomain and the version a DNS-1035 label (`v1`, `v1beta1`). Anything else
/// (`/v1`, `v1/`, `a/b/c`, whitespace, capitals) is refused: discovery would resolve some of
/// these spellings to a kind all the same, and every decision about the resource is then made
/// from what discovery resolved.
pub(super) fn check_api_version(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err("it is empty".to_owned());
    }
    if v.chars().any(char::is_whitespace) {
        return Err("it contains whitespace".to_owned());
    }
    let (group, version) = match v.split_once('/') {
        Some((g, v)) => (Some(g), v),
        None => (None, v),
    };
    if version.contains('/') {
        return Err("it has more than one '/'".to_owned());
    }
    match group {
        Some("") => {
            return Err(
                "the group before '/' is empty (the core group is written without it: \"v1\")"
                    .to_owned(),
            )
        }
        Some(g) if g.len() > 253 || !g.split('.').all(|l| check_dns_label(l).is_ok()) => {
            return Err(format!(
                "the group {g:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.')"
            ))
        }
        _ => {}
    }
    if version.is_empty() {
        return Err("the version after '/' is empty".to_owned());
    }
    if check_dns_label(version).is_err() || !version.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(format!(
            "the version {version:?} is not a lowercase DNS label starting with a letter, such as \"v1\" or \"v1beta1\""
        ));
    }
    Ok(())
}

/// RFC 1123 DNS label (namespace names).
pub(super) fn check_dns_label(v: &str) -> Result<(), &'static str> {
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !v.starts_with('-')
        && !v.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err("is not a valid name: lowercase RFC 1123 label, at most 63 characters")
    }
}
