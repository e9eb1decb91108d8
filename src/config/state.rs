//! `[state]`: where kubesink keeps the acknowledged informer state between runs (see
//! `docs/restarts.md`), and how often it saves it.
//!
//! The connection options of `[state.nats]` are those of a NATS sink, with the same types
//! (`NatsAuth`, `NatsTls`) and checks (`kubesink_sinks::nats::connection_problems`). Like the
//! rest of the configuration, this module only reads and checks: it never opens the state.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::HumanDuration;

/// Where the state is kept.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
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
}

/// `[state]`: the acknowledged informer state, saved so that a restart sends only the
/// differences (and the deletes that happened meanwhile) instead of every object again.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// `none` (default), `file` or `nats`.
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
        }
    }
}

fn default_interval() -> HumanDuration {
    HumanDuration::from_secs(30)
}

/// `[state.nats]`: a JetStream object store holding the state as one object
/// (<https://docs.nats.io/nats-concepts/jetstream/obj_store>), and a stream beside it,
/// `{bucket}_JOURNAL`, holding the journal of new objects between saves.
#[cfg(feature = "nats")]
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StateNatsConfig {
    /// Server URLs (`nats://host:port`, `tls://host:port`), as for the NATS sink.
    /// Default `["nats://127.0.0.1:4222"]`.
    #[serde(default = "default_servers")]
    pub servers: Vec<String>,
    /// Connection name shown by the server (`connz`). Default `"kubesink-state"`.
    #[serde(default = "default_connection_name")]
    pub connection_name: String,
    /// Bound on establishing the connection (TCP, TLS, auth). Default `5s`.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// Bound on one JetStream request while loading or saving. Default `10s`.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Object store bucket (letters, digits, `-`, `_`). Default `"KUBESINK_STATE"`.
    #[serde(default = "default_bucket")]
    pub bucket: String,
    /// Object name in the bucket. Default: `cluster.name`, so kubesinks of several clusters
    /// can share a bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// Create the bucket, and the journal stream `{bucket}_JOURNAL` (subjects
    /// `kubesink-journal.{bucket}.>`), when they do not exist. Default `true`.
    #[serde(default = "yes")]
    pub create: bool,
    /// Storage of a created bucket and journal stream: `file` or `memory`. Default `file`.
    #[serde(default)]
    pub storage: kubesink_sinks::nats::NatsStorage,
    /// Replicas of a created bucket and journal stream in a JetStream cluster (1 to 5).
    /// Default 1.
    #[serde(default = "one")]
    pub replicas: usize,
    /// Authentication; at most one method (as `[sinks.auth]` of a NATS sink).
    #[serde(default)]
    pub auth: kubesink_sinks::nats::NatsAuth,
    /// TLS (as `[sinks.tls]` of a NATS sink).
    #[serde(default)]
    pub tls: kubesink_sinks::nats::NatsTls,
}

#[cfg(feature = "nats")]
impl Default for StateNatsConfig {
    fn default() -> Self {
        StateNatsConfig {
            servers: default_servers(),
            connection_name: default_connection_name(),
            connect_timeout: default_connect_timeout(),
            timeout: default_timeout(),
            bucket: default_bucket(),
            object: None,
            create: true,
            storage: Default::default(),
            replicas: 1,
            auth: Default::default(),
            tls: Default::default(),
        }
    }
}

#[cfg(feature = "nats")]
fn default_servers() -> Vec<String> {
    vec!["nats://127.0.0.1:4222".to_owned()]
}
#[cfg(feature = "nats")]
fn default_connection_name() -> String {
    "kubesink-state".to_owned()
}
#[cfg(feature = "nats")]
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(5)
}
#[cfg(feature = "nats")]
fn default_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
#[cfg(feature = "nats")]
fn default_bucket() -> String {
    "KUBESINK_STATE".to_owned()
}
fn yes() -> bool {
    true
}
#[cfg(feature = "nats")]
fn one() -> usize {
    1
}

impl StateConfig {
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
                let n = &self.nats;
                for (key, message) in
                    kubesink_sinks::nats::connection_problems(&n.servers, &n.auth, &n.tls)
                {
                    bad(&format!("nats.{key}"), message);
                }
                if n.connect_timeout.get().is_zero() {
                    bad("nats.connect_timeout", "must be greater than zero".into());
                }
                if n.timeout.get().is_zero() {
                    bad("nats.timeout", "must be greater than zero".into());
                }
                if n.bucket.is_empty()
                    || !n
                        .bucket
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    bad(
                        "nats.bucket",
                        format!(
                            "{:?} is not a bucket name: use letters, digits, '-' and '_'",
                            n.bucket
                        ),
                    );
                }
                if n.object.as_deref() == Some("") {
                    bad(
                        "nats.object",
                        "must not be empty (leave it out for cluster.name)".into(),
                    );
                }
                if !(1..=5).contains(&n.replicas) {
                    bad("nats.replicas", "must be between 1 and 5".into());
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
