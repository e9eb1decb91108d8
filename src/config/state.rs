//! `[state]`: where kubesink keeps the acknowledged informer state between runs (see
//! `docs/restarts.md`), and how often it saves it.
//!
//! The backends `none` and `file` are the bridge's; every other is a destination's section,
//! `[state.NAME]`, implementing
//! [`StateBackendConfig`](kubesink_core::state::StateBackendConfig) in its crate and
//! registered in `src/sinks.rs` by one line of `state_config!` (below): the macro generates
//! [`StateBackend`] and [`StateConfig`] from that list, and everything here (checks,
//! warnings, files, the effective configuration, `crate::state::open`) goes through the
//! registered sections, naming none. Like the rest of the configuration, this module only
//! reads and checks: it never opens the state.

use kubesink_core::state::StateContext;

pub use crate::sinks::{StateBackend, StateConfig};

/// Generates [`StateBackend`] and [`StateConfig`] from the registered state backends: one
/// line each, `/// variant doc  Variant { /// field doc  name: SectionType } if "cargo
/// feature";`, the section type implementing `StateBackendConfig` and `name` its
/// `state.backend` value and its key under `[state]` (the variant's name in lowercase).
/// Invoked once, by the registration list (`src/sinks.rs`).
macro_rules! state_config {
    ($(
        $(#[$vdoc:meta])* $variant:ident {
            $(#[$fdoc:meta])* $field:ident: $config:ty
        } if $feature:literal;
    )*) => {
        /// Where the state is kept.
        #[derive(
            Clone, Copy, Debug, Default, serde::Deserialize, serde::Serialize, PartialEq, Eq, schemars::JsonSchema,
        )]
        #[serde(rename_all = "lowercase")]
        pub enum StateBackend {
            /// No state: every start lists and emits every object as `initial` (and cannot report
            /// the deletes that happened while kubesink was down).
            #[default]
            None,
            /// A local file (`state.path`), written atomically. Follows a restart on the same
            /// volume, not a hand-over to a replica on another node.
            File,
            $( $(#[$vdoc])* #[cfg(feature = $feature)] $variant, )*
        }

        impl StateBackend {
            /// Its name as written in `state.backend` (`"none"`, `"file"`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    StateBackend::None => "none",
                    StateBackend::File => "file",
                    $( #[cfg(feature = $feature)] StateBackend::$variant => stringify!($field), )*
                }
            }

            /// The names of the registered backends a destination's crate keeps (every
            /// backend but `none` and `file`), in registration order.
            pub fn registered() -> &'static [&'static str] {
                &[$( #[cfg(feature = $feature)] stringify!($field), )*]
            }
        }

        /// `[state]`: the acknowledged informer state, saved so that a restart sends only the
        /// differences (and the deletes that happened meanwhile) instead of every object again.
        #[derive(Clone, Debug, serde::Deserialize, serde::Serialize, PartialEq, Eq, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct StateConfig {
            #[doc = concat!("Where the state is kept: `none` (default), `file`", $(", `", stringify!($field), "`",)* ".")]
            #[serde(default)]
            pub backend: StateBackend,
            /// With `backend = "file"` (required there): the state file. Written as a temporary file
            /// in the same directory, fsynced, then renamed over it; the directory must exist and be
            /// writable. Set without a backend it is an error (set `backend = "file"`). Default: none.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub path: Option<std::path::PathBuf>,
            /// How often the state is saved while running (it is also saved at shutdown, after the
            /// pipeline drained). A crash re-sends at most what changed since the last save.
            /// Default `30s`.
            #[serde(default = "state_default_interval")]
            pub interval: $crate::config::HumanDuration,
            /// Record every new object in the state's journal before its `added` may be sent
            /// (`docs/restarts.md`), so that after a crash the restart can send the `deleted` of
            /// objects first sent after the last save and deleted while kubesink was down. Sends wait
            /// for the journal (one append per batch, usually done before the batch is ready); while
            /// the state store cannot be written, they stop; while it cannot be read at start or at a
            /// take-over, the watches wait for it. `false` keeps the sinks flowing then (and starts
            /// without the state it cannot read, with a full initial list), at the price of possible
            /// ghosts downstream after a crash. Default `true`.
            #[serde(default = "state_yes")]
            pub write_ahead: bool,
            $( $(#[$fdoc])* #[cfg(feature = $feature)] #[serde(default)] pub $field: $config, )*
        }

        impl Default for StateConfig {
            fn default() -> Self {
                StateConfig {
                    backend: StateBackend::None,
                    path: None,
                    interval: state_default_interval(),
                    write_ahead: true,
                    $( #[cfg(feature = $feature)] $field: <$config>::default(), )*
                }
            }
        }

        impl StateConfig {
            /// Every registered backend's section, as `(name, section)` in registration
            /// order, whichever backend is selected.
            pub fn sections(&self) -> Vec<(&'static str, &dyn kubesink_core::state::StateBackendConfig)> {
                vec![$( #[cfg(feature = $feature)] (stringify!($field), &self.$field as &dyn kubesink_core::state::StateBackendConfig), )*]
            }

            /// The selected backend's section (`None` for `none` and `file`).
            pub fn selected(&self) -> Option<&dyn kubesink_core::state::StateBackendConfig> {
                match self.backend {
                    StateBackend::None | StateBackend::File => None,
                    $( #[cfg(feature = $feature)] StateBackend::$variant => Some(&self.$field), )*
                }
            }
        }

        fn state_default_interval() -> $crate::config::HumanDuration {
            $crate::config::HumanDuration::from_secs(30)
        }

        fn state_yes() -> bool {
            true
        }
    };
}
pub(crate) use state_config;

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
