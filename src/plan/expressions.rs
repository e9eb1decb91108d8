//! [`Compiled`]: the configuration's expressions checked by compiling them, as the informer
//! will (CEL filters with [`Filter`], change paths with [`parse_path`] into at most
//! [`PART_SLOTS`] fingerprint slots), and the warnings only a compiled filter can give.

use crate::config::{Config, Enrich, Expressions, PayloadMode, ResourceConfig, SinkConfig};
use crate::informer::{parse_path, Filter, FilterPlace, PART_SLOTS};

/// The [`Expressions`] of a configuration that will run.
pub struct Compiled;

impl Expressions for Compiled {
    fn resource(&self, r: &ResourceConfig, key: &str) -> Vec<(String, String)> {
        let at = |k: &str| format!("{key}.{k}");
        let mut problems = Vec::new();
        // With `ignore_changes`, the last slot holds the ignored values' fingerprint.
        let slots = PART_SLOTS - usize::from(!r.ignore_changes.is_empty());
        if r.change_paths.len() > slots {
            problems.push((
                at("change_paths"),
                format!(
                    "{} paths; at most {slots} (each keeps a 16-bit fingerprint per object{})",
                    r.change_paths.len(),
                    if slots < PART_SLOTS {
                        "; with ignore_changes one slot is theirs"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if r.change_values.len() > PART_SLOTS {
            problems.push((
                at("change_values"),
                format!("{} paths; at most {PART_SLOTS}", r.change_values.len()),
            ));
        }
        for (list, paths) in [
            ("change_paths", &r.change_paths),
            ("ignore_changes", &r.ignore_changes),
            ("change_values", &r.change_values),
        ] {
            for (j, path) in paths.iter().enumerate() {
                if let Err(why) = parse_path(path) {
                    problems.push((at(&format!("{list}.{j}")), format!("{path:?} {why}")));
                } else if paths[..j].contains(path) {
                    problems.push((
                        at(&format!("{list}.{j}")),
                        format!("{path:?} is listed twice"),
                    ));
                }
            }
        }
        if let Some(expr) = &r.filter {
            let shown = Filter::shown(expr);
            match Filter::compile(expr) {
                Err(e) => problems.push((at("filter"), format!("{shown}: {e}"))),
                Ok(f) if r.payload == PayloadMode::Metadata => {
                    let beyond = f.reads_beyond_metadata();
                    if !beyond.is_empty() {
                        problems.push((
                            at("filter"),
                            format!(
                                "{shown} reads object.{} but payload = \"metadata\" watches metadata only (PartialObjectMetadata): it would fail on every object",
                                beyond.join(", object.")
                            ),
                        ));
                    }
                }
                Ok(_) => {}
            }
        }
        problems
    }

    fn sink(&self, s: &SinkConfig) -> Vec<(String, String)> {
        let Some(expr) = s.filter() else {
            return Vec::new();
        };
        match Filter::compile_for(expr, FilterPlace::Sink) {
            Ok(_) => Vec::new(),
            Err(e) => vec![("filter".to_owned(), format!("{}: {e}", Filter::shown(expr)))],
        }
    }
}

/// One filter as [`filter_warnings`] checks it.
struct Place<'a> {
    /// Its key.
    at: String,
    /// Its expression.
    expr: &'a str,
    /// The kind it sees; `None`: every configured kind (a sink's).
    kind: Option<&'a str>,
    place: FilterPlace,
    /// The `enrich` of the resources it sees.
    enrich: Vec<Enrich>,
}

/// What the configuration's CEL filters say that they do not mean, each filter compiled
/// once:
/// - a filter comparing `kind` with a name no resource it sees has (`kind == "pod"`: kinds
///   are case-sensitive, `Pod`): that comparison never holds. A resource's filter is
///   compared with its own kind, a sink's with every configured kind;
/// - a sink's object filter reading a field beyond `metadata` while a resource is watched
///   metadata-only (`payload = "metadata"`): a sink's filter applies to every resource, and
///   on those objects it fails (no match, counted). Said unless the filter names `kind` (then
///   it is likely guarded: `kind != "Secret" || …`);
/// - a filter reading a context variable (`owners`, `node`, `namespaceLabels`) that no
///   resource it sees carries (`enrich`): it is empty for every object.
pub(super) fn filter_warnings(c: &Config) -> Vec<String> {
    let mut kinds: Vec<String> = Vec::new();
    let mut metadata_only: Vec<String> = Vec::new();
    let mut filters: Vec<Place> = Vec::new();
    let mut enriched: Vec<Enrich> = Vec::new();
    let clusters = c.clusters();
    for (ci, cluster) in clusters.iter().enumerate() {
        for (i, r) in cluster.resources.iter().enumerate() {
            if !kinds.contains(&r.kind) {
                kinds.push(r.kind.clone());
            }
            let name = r.display_name();
            if r.payload == PayloadMode::Metadata && !metadata_only.contains(&name) {
                metadata_only.push(name);
            }
            enriched.extend(r.enrich.iter().copied());
            if let Some(f) = &r.filter {
                let at = match c.clusters.is_empty() {
                    true => format!("resources.{i}.filter"),
                    false => format!("clusters.{ci}.resources.{i}.filter"),
                };
                filters.push(Place {
                    at,
                    expr: f,
                    kind: Some(&r.kind),
                    place: FilterPlace::Resource,
                    enrich: r.enrich.clone(),
                });
            }
        }
    }
    for (i, s) in c.sinks.iter().enumerate() {
        if let Some(f) = s.filter() {
            let at = format!("sinks.{i}.filter (sink {:?})", s.name());
            filters.push(Place {
                at,
                expr: f,
                kind: None,
                place: FilterPlace::Sink,
                enrich: enriched.clone(),
            });
        }
    }
    let mut out = Vec::new();
    for Place {
        at,
        expr,
        kind: own_kind,
        place,
        enrich,
    } in filters
    {
        let Ok(f) = Filter::compile_for(expr, place) else {
            continue;
        };
        for (var, what, empty) in [
            ("owners", Enrich::Owner, "[]"),
            ("node", Enrich::Node, "\"\""),
            ("nodeLabels", Enrich::Node, "{}"),
            ("namespaceLabels", Enrich::Namespace, "{}"),
        ] {
            if f.uses(var) && !enrich.contains(&what) {
                let whose = match place {
                    FilterPlace::Resource => "its resource has no",
                    FilterPlace::Sink => "no resource has",
                };
                let value = serde_json::to_string(&what).unwrap_or_default();
                out.push(format!(
                    "{at} reads {var}, but {whose} enrich = [{value}]: {var} is {empty} for every object (add it to the resource's enrich)"
                ));
            }
        }
        let seen: Vec<&str> = match own_kind {
            Some(k) => vec![k],
            None => kinds.iter().map(String::as_str).collect(),
        };
        for k in f.compared("kind") {
            if !seen.contains(&k) {
                out.push(format!(
                    "{at} compares kind with {k:?}, which no resource it sees has (kinds are case-sensitive and as configured: {}): that comparison never holds",
                    seen.join(", ")
                ));
            }
        }
        for (path, map, key) in unguarded_keys(expr) {
            // `has()` takes a field selection: a key that is not an identifier has `in` only.
            let has = match key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                true => format!("has({map}.{key}) && …, or "),
                false => String::new(),
            };
            let counted = match place {
                FilterPlace::Resource => "kubesink_filter_errors_total",
                FilterPlace::Sink => "kubesink_sink_filter_errors_total",
            };
            out.push(format!(
                "{at} reads {path}, which an object without that key does not have: the filter fails on such objects (no match, counted in {counted}); guard it, {has}\"{key}\" in {map} && …"
            ));
        }
        let beyond = f.reads_beyond_metadata();
        if place == FilterPlace::Sink
            && !metadata_only.is_empty()
            && !beyond.is_empty()
            && !f.uses("kind")
        {
            out.push(format!(
                "{at} reads object.{} but {} {} watched metadata-only (payload = \"metadata\"): the filter fails on those objects (no match, counted in kubesink_sink_filter_errors_total); guard it with kind, e.g. 'kind != \"Secret\" || …'",
                beyond.join(", object."),
                metadata_only.join(", "),
                if metadata_only.len() == 1 { "is" } else { "are" },
            ));
        }
    }
    out
}

/// The label and annotation keys `expr` selects (`object.metadata.labels.tier`) without
/// asking first whether the object has them (`has(object.metadata.labels.tier)`, or
/// `"tier" in object.metadata.labels`): most objects lack most labels, and selecting a key a
/// map lacks is an error in CEL, not `false`.
///
/// Each as `(the selection as written, the map, the key)`.
fn unguarded_keys(expr: &str) -> Vec<(String, &'static str, String)> {
    let mut out = Vec::new();
    for map in ["object.metadata.labels", "object.metadata.annotations"] {
        // `map.key`, `map["key"]` and `map['key']`.
        let selected = expr.match_indices(map).filter_map(|(at, _)| {
            let rest = &expr[at + map.len()..];
            if let Some(rest) = rest.strip_prefix('.') {
                let key: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                return (!key.is_empty()).then(|| (format!("{map}.{key}"), key));
            }
            let rest = rest.strip_prefix('[')?;
            let quote = rest.chars().next().filter(|q| matches!(q, '"' | '\''))?;
            let key = rest[1..].split(quote).next()?.to_owned();
            Some((format!("{map}[{quote}{key}{quote}]"), key))
        });
        for (path, key) in selected.collect::<Vec<_>>() {
            let dotted = format!("{map}.{key}");
            let guarded = expr.contains(&format!("has({dotted})"))
                || [format!("\"{key}\" in {map}"), format!("'{key}' in {map}")]
                    .iter()
                    .any(|g| expr.contains(g.as_str()));
            if !guarded && !out.iter().any(|(p, _, _)| *p == path) {
                out.push((path, map, key));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warnings(c: &Config) -> Vec<String> {
        crate::plan::warnings(c)
    }

    #[test]
    fn a_sink_filter_reading_beyond_metadata_with_a_metadata_only_resource_is_warned_about() {
        let mut secret = ResourceConfig::new("v1", "Secret");
        secret.payload = PayloadMode::Metadata;
        let sink = |filter: &str| {
            SinkConfig::Stdout(kubesink_stdout::StdoutConfig {
                filter: Some(filter.to_owned()),
                ..Default::default()
            })
        };
        let mut c = Config {
            resources: vec![ResourceConfig::new("v1", "Pod"), secret],
            sinks: vec![sink("object.spec.nodeName == \"n1\"")],
            ..Default::default()
        };
        let w = warnings(&c).join("\n");
        assert!(
            w.contains("sinks.0.filter (sink \"stdout\") reads object.spec but v1 Secret is watched metadata-only"),
            "{w}"
        );
        // Guarded by kind, or reading metadata only: no warning.
        c.sinks = vec![
            sink("kind != \"Pod\" || object.spec.nodeName == \"n1\""),
            sink("ns == \"a\" && has(object.metadata.labels)"),
        ];
        assert!(warnings(&c).is_empty(), "{:?}", warnings(&c));
    }

    #[test]
    fn a_label_read_without_asking_whether_the_object_has_it_is_warned_about() {
        let mut pod = ResourceConfig::new("v1", "Pod");
        pod.filter = Some(r#"object.metadata.labels.tier == "front""#.into());
        let mut c = Config {
            resources: vec![pod],
            sinks: vec![SinkConfig::Stdout(kubesink_stdout::StdoutConfig {
                filter: Some(r#"object.metadata.annotations.team == "a""#.into()),
                ..Default::default()
            })],
            ..Default::default()
        };
        let w = warnings(&c).join("\n");
        assert!(
            w.contains(r#"resources.0.filter reads object.metadata.labels.tier, which an object without that key does not have: the filter fails on such objects (no match, counted in kubesink_filter_errors_total); guard it, has(object.metadata.labels.tier) && …, or "tier" in object.metadata.labels && …"#),
            "{w}"
        );
        assert!(
            w.contains(r#"sinks.0.filter (sink "stdout") reads object.metadata.annotations.team"#),
            "{w}"
        );
        c.resources[0].filter = Some(
            r#"has(object.metadata.labels) && object.metadata.labels["team"] == "payments""#.into(),
        );
        let w = warnings(&c).join("\n");
        assert!(
            w.contains(r#"resources.0.filter reads object.metadata.labels["team"], which"#),
            "{w}"
        );
        // Asked first, either way: no warning.
        c.resources[0].filter = Some(
            r#"has(object.metadata.labels.tier) && object.metadata.labels.tier == "front""#.into(),
        );
        c.sinks = vec![SinkConfig::Stdout(kubesink_stdout::StdoutConfig {
            filter: Some(r#"'team' in object.metadata.annotations && object.metadata.annotations.team == "a""#.into()),
            ..Default::default()
        })];
        assert!(warnings(&c).is_empty(), "{:?}", warnings(&c));
    }

    #[test]
    fn a_filter_comparing_kind_with_a_kind_not_configured_is_warned_about() {
        let mut pod = ResourceConfig::new("v1", "Pod");
        pod.filter = Some(r#"kind == "Pod" && ns != "kube-system""#.into());
        let mut c = Config {
            resources: vec![pod, ResourceConfig::new("v1", "Secret")],
            sinks: vec![SinkConfig::Stdout(kubesink_stdout::StdoutConfig {
                filter: Some(r#"kind in ["pod", "Secret"]"#.into()),
                ..Default::default()
            })],
            ..Default::default()
        };
        let w = warnings(&c).join("\n");
        assert!(
            w.contains(r#"sinks.0.filter (sink "stdout") compares kind with "pod", which no resource it sees has (kinds are case-sensitive and as configured: Pod, Secret)"#),
            "{w}"
        );
        assert!(!w.contains("resources.0"), "{w}");
        c.resources[0].filter = Some(r#"kind == "Secret""#.into());
        let w = warnings(&c).join("\n");
        assert!(
            w.contains(r#"resources.0.filter compares kind with "Secret""#),
            "{w}"
        );
    }
}
