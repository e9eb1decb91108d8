//! `[state]`: where kubesink keeps the acknowledged informer state between runs (see
//! `docs/restarts.md`), and how often it saves it.
//!
//! `[state.nats]` belongs to the NATS destination's crate (`kubesink_nats::state::StateNatsConfig`, with the
//! connection options and checks of a NATS sink). Like the rest of the configuration, this
//! module only reads and checks: it never opens the state.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::HumanDuration;
#[cfg(feature = "kafka")]
pub use kubesink_kafka::state::StateKafkaConfig;
#[cfg(feature = "nats")]
pub use kubesink_nats::state::StateNatsConfig;

/// Where the state is kept.
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
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
    /// A NATS JetStream object store (`[state.nats]`): whichever replica runs finds it.
    /// (Cargo feature `nats`.)
    #[cfg(feature = "nats")]
    Nats,
    /// A compacted Kafka topic (`[state.kafka]`): whichever replica runs finds it.
    /// (Cargo feature `kafka`.)
    #[cfg(feature = "kafka")]
    Kafka,
}

impl StateBackend {
    /// Its name as written in `state.backend` (`"none"`, `"file"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            StateBackend::None => "none",
            StateBackend::File => "file",
            #[cfg(feature = "nats")]
            StateBackend::Nats => "nats",
            #[cfg(feature = "kafka")]
            StateBackend::Kafka => "kafka",
        }
    }
}

/// `[state]`: the acknowledged informer state, saved so that a restart sends only the
/// differences (and the deletes that happened meanwhile) instead of every object again.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// `none` (default), `file`, `nats` or `kafka`.
    #[serde(default)]
    pub backend: StateBackend,
    /// With `backend = "file"` (required there): the state file. Written as a temporary file
    /// in the same directory, fsynced, then renamed over it; the directory must exist and be
    /// writable. Set without a backend it is an error (set `backend = "file"`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// How often the state is saved while running (it is also saved at shutdown, after the
    /// pipeline drained). A crash re-sends at most what changed since the last save.
    /// Default `30s`.
    #[serde(default = "default_interval")]
    pub interval: HumanDuration,
    /// Record every new object in the state's journal before its `added` may be sent
    /// (`docs/restarts.md`), so that after a crash the restart can send the `deleted` of
    /// objects first sent after the last save and deleted while kubesink was down. Sends wait
    /// for the journal (one append per batch, usually done before the batch is ready); while
    /// the state store cannot be written, they stop; while it cannot be read at start or at a
    /// take-over, the watches wait for it. `false` keeps the sinks flowing then (and starts
    /// without the state it cannot read, with a full initial list), at the price of possible
    /// ghosts downstream after a crash. Default `true`.
    #[serde(default = "yes")]
    pub write_ahead: bool,
    /// With `backend = "nats"`: the NATS connection and the object store. Any of its
    /// settings without a backend is an error (set `backend = "nats"`).
    #[cfg(feature = "nats")]
    #[serde(default)]
    pub nats: StateNatsConfig,
    /// With `backend = "kafka"`: the compacted topic and its connection (a Kafka sink's, or
    /// its own). Any of its settings without that backend is an error.
    #[cfg(feature = "kafka")]
    #[serde(default)]
    pub kafka: StateKafkaConfig,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            backend: StateBackend::None,
            path: None,
            interval: default_interval(),
            write_ahead: true,
            #[cfg(feature = "nats")]
            nats: StateNatsConfig::default(),
            #[cfg(feature = "kafka")]
            kafka: StateKafkaConfig::default(),
        }
    }
}

fn default_interval() -> HumanDuration {
    HumanDuration::from_secs(30)
}

fn yes() -> bool {
    true
}

impl StateConfig {
    /// Settings that work but weaken security, one sentence each naming the key (the
    /// backend's own: `state.nats.*` credentials without TLS, `state.kafka.librdkafka` TLS
    /// verification off or SASL without TLS).
    pub fn warnings(&self) -> Vec<String> {
        match self.backend {
            #[cfg(feature = "nats")]
            StateBackend::Nats => self
                .nats
                .warnings()
                .into_iter()
                .map(|(key, message)| format!("state.nats.{key}: {message}"))
                .collect(),
            #[cfg(feature = "kafka")]
            StateBackend::Kafka => self
                .kafka
                .warnings()
                .into_iter()
                .map(|(key, message)| format!("state.kafka.{key}: {message}"))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Problems serde cannot see, as `(key, message)` with full dotted keys. A `state.path`
    /// without a backend is one of them; a `[state.nats]` setting without one is found by the
    /// loader, which sees which keys were set (the section always has its defaults here).
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
            #[cfg(feature = "nats")]
            StateBackend::Nats => {
                for (key, message) in self.nats.problems() {
                    bad(&format!("nats.{key}"), message);
                }
            }
            #[cfg(feature = "kafka")]
            StateBackend::Kafka => {
                for (key, message) in self.kafka.problems() {
                    bad(&format!("kafka.{key}"), message);
                }
            }
        }
        errs
    }
}

/// How to fix a `state.path` given without a backend.
const NO_BACKEND_FIX_FILE: &str =
    "set state.backend = \"file\" (KUBESINK_STATE__BACKEND=file), or remove state.path";

/// How to fix a `[state.nats]` setting given without a backend.
#[cfg(feature = "nats")]
pub(super) const NO_BACKEND_FIX_NATS: &str =
    "set state.backend = \"nats\" (KUBESINK_STATE__BACKEND=nats), or remove the [state.nats] settings";

/// How to fix a `[state.kafka]` setting given without its backend.
#[cfg(feature = "kafka")]
pub(super) const NO_BACKEND_FIX_KAFKA: &str =
    "set state.backend = \"kafka\" (KUBESINK_STATE__BACKEND=kafka), or remove the [state.kafka] settings";

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
