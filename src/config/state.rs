//! `[state]`: where kubesink keeps the acknowledged informer state between runs (see
//! `docs/restarts.md`), and how often it saves it.
//!
//! The backends `none` and `file` are the bridge's; every other is a destination's section,
//! `[state.NAME]`, implementing
//! [`StateBackendConfig`](kubesink_core::state::StateBackendConfig) in its crate and
//! registered in `src/sinks.rs` by one line of its `state_config!` list, which generates
//! [`StateBackend`] and [`StateConfig`] there; everything here (checks,
//! warnings, files, the effective configuration, `crate::state::open`) goes through the
//! registered sections, naming none. Like the rest of the configuration, this module only
//! reads and checks: it never opens the state.

use kubesink_core::state::StateContext;

use crate::sinks::SinkConfig;

/// What a state backend's section sees of the rest of the configuration: `sinks` as their
/// destinations', the `clusters`' names, whether leader election is on, this replica's
/// `identity` (empty for the checks).
pub fn context(
    sinks: &[SinkConfig],
    clusters: Vec<String>,
    leader_election: bool,
    identity: String,
) -> StateContext<'_> {
    StateContext {
        sinks: sinks
            .iter()
            .map(|s| s.destination() as &dyn kubesink_core::Destination)
            .collect(),
        clusters,
        leader_election,
        identity,
    }
}

pub use crate::sinks::{StateBackend, StateConfig};

impl StateConfig {
    /// Settings of the selected backend's section that work but weaken security or will not
    /// do what was meant
    /// ([`StateBackendConfig::warnings`](kubesink_core::state::StateBackendConfig::warnings)),
    /// one sentence each naming the key (`state.NAME.KEY: ...`).
    pub fn warnings(&self, ctx: &StateContext<'_>) -> Vec<String> {
        let name = self.backend.name();
        self.selected()
            .map(|section| section.warnings(ctx))
            .unwrap_or_default()
            .into_iter()
            .map(|(key, message)| format!("state.{name}.{key}: {message}"))
            .collect()
    }

    /// Problems serde cannot see, as `(key, message)` with full dotted keys: `[state]`'s own,
    /// then the selected backend's section's
    /// ([`StateBackendConfig::problems`](kubesink_core::state::StateBackendConfig::problems)).
    /// A `state.path` without a backend is one of them; a `[state.NAME]` setting without its
    /// backend is found by the loader, which sees which keys were set (the section always has
    /// its defaults here), as is what a section shows only beside the sinks.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        let mut bad = |key: &str, message: String| errs.push((format!("state.{key}"), message));
        if self.interval.get().is_zero() {
            bad("interval", "must be greater than zero".into());
        }
        match self.backend {
            StateBackend::None => {
                if self.path.is_some() {
                    bad("path", format!("names a state file but state.backend is \"none\" (the default), so no state would be kept and every delete made while kubesink is down would be lost at the next restart: {}", NO_BACKEND_FIX_FILE));
                }
            }
            StateBackend::File => match self.path.as_ref().filter(|p| !p.as_os_str().is_empty()) {
                None => bad(
                    "path",
                    "required with state.backend = \"file\": the state file, e.g. \"/var/lib/kubesink/state\"".into(),
                ),
                Some(path) => {
                    if let Some(message) = file_problem(path) {
                        bad("path", message);
                    }
                }
            },
            #[allow(unreachable_patterns)] // a build without any registered backend
            _ => {
                if let Some(section) = self.selected() {
                    let name = self.backend.name();
                    for (key, message) in section.problems() {
                        bad(&format!("{name}.{key}"), message);
                    }
                }
            }
        }
        errs
    }
}

/// How to fix a `state.path` given without a backend.
const NO_BACKEND_FIX_FILE: &str =
    "set state.backend = \"file\" (KUBESINK_STATE__BACKEND=file), or remove state.path";

/// What is wrong with `path` as the state file, if anything a look at the file system can
/// tell: it must not be a directory, and its directory must exist (kubesink writes the state,
/// a temporary file and the journal's files there; it creates no directories).
fn file_problem(path: &std::path::Path) -> Option<String> {
    if path.is_dir() {
        return Some(format!(
            "{} is a directory: give the state file's path inside it, e.g. \"{}\"",
            path.display(),
            path.join("state").display()
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Some(format!(
            "the directory {} does not exist (kubesink writes the state, its temporary file and its journal there, and creates no directory)",
            dir.display()
        ));
    }
    None
}

/// The registered backends' names as a choice, `"a" or "b"` (`"a", "b" or "c"`); `None` when
/// the build registers none.
pub(super) fn shared_choice() -> Option<String> {
    let quoted: Vec<String> = StateBackend::registered()
        .iter()
        .map(|name| format!("{name:?}"))
        .collect();
    match quoted.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        [init @ .., last] => Some(format!("{} or {last}", init.join(", "))),
    }
}
