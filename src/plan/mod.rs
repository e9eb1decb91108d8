//! The resolve step between the raw configuration and what runs. `config` parses, merges
//! its sources and checks shapes; this module loads it with what it says in other
//! languages checked by the compilers the informer runs (each resource's and each sink's
//! CEL filter, each resource's JSONPath change paths: `expressions.rs`), and
//! [`resolve`]s it once into the [`Plan`] each layer takes its part of (`resolve.rs`).
//! `kubesink check` and `kubesink run` load, warn and resolve through the same code. It
//! never touches the network.

mod expressions;
mod groups;
pub mod kinds;
mod resolve;

use std::path::Path;

use figment::Figment;

use crate::config::{self, Config, ConfigErrors, ResourceConfig};

pub use crate::state::StatePlan;
pub use expressions::Compiled;
pub use resolve::{resolve, LeasePlan, Plan, PlanError, ResourcePlan, SinkPlan, UnitPlan};

/// [`config::load`] with the expressions compiled: the configuration `run` starts from.
///
/// # Errors
/// Every problem found, shapes and expressions alike, each with its key and source.
pub fn load(file: Option<&Path>) -> Result<Config, ConfigErrors> {
    config::load(file, &Compiled)
}

/// [`config::load_with_partial`] with the expressions compiled: what `kubesink check`
/// reports from.
///
/// # Errors
/// As [`load`], with the configuration as far as it parsed.
pub fn load_with_partial(
    file: Option<&Path>,
) -> Result<Config, (ConfigErrors, Option<Box<Config>>)> {
    config::load_with_partial(file, &Compiled)
}

/// [`config::load_resources`] with the resources' expressions compiled (`kubesink rbac`).
///
/// # Errors
/// As [`config::load_resources`].
pub fn load_resources(file: Option<&Path>) -> Result<(Vec<ResourceConfig>, Figment), ConfigErrors> {
    config::load_resources(file, &Compiled)
}

/// Every warning of `c` ([`config::warnings`]), the kinds a built-in group version does not
/// have ([`kinds::kind_warnings`]), then what its filters say that they do not mean
/// ([`expressions::filter_warnings`]).
pub fn warnings(c: &Config) -> Vec<String> {
    let mut out = config::warnings(c);
    out.extend(kind_warnings(c));
    for (prefix, list) in c.resource_lists() {
        out.extend(groups::group_warnings(list, &prefix));
    }
    out.extend(expressions::filter_warnings(c));
    out
}

/// What each `[[resources]]` entry of `c` follows, one line each (`kubesink check`):
/// its kind and scope, or, in the group form, which kinds and how they are found.
pub fn explain_resources(c: &Config) -> Vec<String> {
    let scope_of = |namespaces: &[String]| match namespaces.is_empty() {
        true => "all namespaces".to_owned(),
        false => format!("namespaces {}", namespaces.join(", ")),
    };
    let mut out = Vec::new();
    for (prefix, list) in c.resource_lists() {
        for (i, r) in list.iter().enumerate() {
            let scope = scope_of(&r.namespaces);
            let what = match r.selector() {
                None => format!("{} ({scope}), resolved by API discovery at start", r.display_name()),
                Some(s) => format!(
                    "{s} ({scope}{}): {} that can be listed and watched, at the group's preferred version, found by API discovery at start and followed as CRDs are installed, changed and deleted; a kind another entry lists with the same namespaces is left to it",
                    if s.namespaced_only { "; namespaced kinds only" } else { "" },
                    match s.kinds.is_some() {
                        true => "the kinds named, as the group serves them,",
                        false => "every kind it serves",
                    }
                ),
            };
            out.push(format!("{prefix}resources.{i}: {what}"));
        }
        let index = crate::informer::index_resources(list);
        if !index.is_empty() {
            // Each in its own scope: Nodes and Namespaces are cluster-scoped, the
            // controllers watched where the entries asking for owners watch.
            let names: Vec<String> = index
                .iter()
                .map(|r| format!("{} ({})", r.display_name(), scope_of(&r.namespaces)))
                .collect();
            out.push(format!(
                "{prefix}owner index (enrich): {}, metadata only, sending nothing",
                names.join(", ")
            ));
        }
    }
    out
}

/// The resources of `c`, top-level and per cluster, whose kind a built-in group version does
/// not have ([`kinds::kind_warnings`]): warnings, errors with `check --strict`.
pub fn kind_warnings(c: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (prefix, list) in c.resource_lists() {
        out.extend(kinds::kind_warnings(list, &prefix));
        out.extend(groups::spelling_warnings(list, &prefix));
    }
    out
}
