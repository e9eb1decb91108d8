//! `[state.nats]`: the NATS state backend's settings (the connection options and checks of a
//! NATS sink, the object store and its journal stream), and what the bridge does with them
//! through [`StateBackendConfig`] (registered in its list as `state.backend = "nats"`): its
//! checks, its warnings (credentials without TLS, a server on the loopback), the files it
//! reads, and opening its [`NatsStore`](super::NatsStore).

use std::path::PathBuf;
use std::sync::Arc;

use kubesink_core::state::{StateBackendConfig, StateContext, StateStore};
use kubesink_core::units::HumanDuration;
use serde::{Deserialize, Serialize};

/// `[state.nats]`: a JetStream object store holding the state as one object
/// (<https://docs.nats.io/nats-concepts/jetstream/obj_store>), and a stream beside it,
/// `{bucket}_JOURNAL`, holding the journal of new objects between saves.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
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
    pub storage: crate::NatsStorage,
    /// Replicas of a created bucket and journal stream in a JetStream cluster (1 to 5).
    /// Default 1.
    #[serde(default = "one")]
    pub replicas: usize,
    /// Authentication; at most one method (as `[sinks.auth]` of a NATS sink).
    #[serde(default)]
    pub auth: crate::NatsAuth,
    /// TLS (as `[sinks.tls]` of a NATS sink).
    #[serde(default)]
    pub tls: crate::NatsTls,
}

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

fn default_servers() -> Vec<String> {
    vec!["nats://127.0.0.1:4222".to_owned()]
}
fn default_connection_name() -> String {
    "kubesink-state".to_owned()
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn default_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_bucket() -> String {
    "KUBESINK_STATE".to_owned()
}
fn yes() -> bool {
    true
}
fn one() -> usize {
    1
}

impl StateNatsConfig {
    /// Settings that work but weaken security, as `(key, message)` with keys relative to
    /// `[state.nats]`: every credential that would cross the network without TLS.
    pub fn warnings(&self) -> Vec<(&'static str, String)> {
        crate::plaintext_credentials(&self.servers, &self.auth, &self.tls)
    }

    /// Problems serde cannot see, as `(key, message)` with keys relative to `[state.nats]`
    /// (the bridge prefixes `state.nats.`).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        let mut bad = |key: &str, message: String| errs.push((key.to_owned(), message));
        for (key, message) in crate::connection_problems(&self.servers, &self.auth, &self.tls) {
            bad(key, message);
        }
        if self.connect_timeout.get().is_zero() {
            bad("connect_timeout", "must be greater than zero".into());
        }
        if self.timeout.get().is_zero() {
            bad("timeout", "must be greater than zero".into());
        }
        if self.bucket.is_empty()
            || !self
                .bucket
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bad(
                "bucket",
                format!(
                    "{:?} is not a bucket name: use letters, digits, '-' and '_'",
                    self.bucket
                ),
            );
        }
        if self.object.as_deref() == Some("") {
            bad(
                "object",
                "must not be empty (leave it out for cluster.name)".into(),
            );
        }
        if !(1..=5).contains(&self.replicas) {
            bad("replicas", "must be between 1 and 5".into());
        }
        errs
    }
}

impl StateBackendConfig for StateNatsConfig {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn problems(&self) -> Vec<(String, String)> {
        StateNatsConfig::problems(self)
    }

    /// Without any backend, the setting's cost is said: no state at all.
    fn unselected(&self, backend: &str) -> String {
        let message = if backend == "none" {
            "is a [state.nats] setting but state.backend is \"none\" (the default), so no state would be kept and every delete made while kubesink is down would be lost at the next restart".to_owned()
        } else {
            format!("is a [state.nats] setting but state.backend is \"{backend}\", so it would be ignored")
        };
        format!("{message}: set state.backend = \"nats\" (KUBESINK_STATE__BACKEND=nats), or remove the [state.nats] settings")
    }

    /// Credentials that would cross the network without TLS; then each server on the
    /// loopback (in a Pod, `127.0.0.1` is the Pod itself: no other replica, nor the Pod after
    /// it is rescheduled, finds that store).
    fn warnings(&self, ctx: &StateContext<'_>) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = StateNatsConfig::warnings(self)
            .into_iter()
            .map(|(key, message)| (key.to_owned(), message))
            .collect();
        for server in &self.servers {
            if is_loopback(server) {
                let why = if ctx.leader_election {
                    "the other replicas (leader_election.enabled) and a rescheduled Pod do not reach it, so the one that takes over does not find the state"
                } else {
                    "in a Pod that is the Pod itself, so a rescheduled Pod does not find the state"
                };
                out.push((
                    "servers".to_owned(),
                    format!(
                        "{:?} is this machine's loopback: {why}; name the NATS service every replica reaches",
                        crate::redact_url(server)
                    ),
                ));
            }
        }
        out
    }

    /// The credentials file, then the TLS files where TLS is certain to be used.
    fn files(&self) -> Vec<(String, PathBuf)> {
        let mut files = Vec::new();
        if let Some(p) = &self.auth.credentials_file {
            files.push(("auth.credentials_file".to_owned(), p.clone()));
        }
        if crate::tls_certain(&self.servers, &self.tls) {
            for (key, p) in self.tls.files() {
                if let Some(p) = p {
                    files.push((key.to_owned(), p.to_path_buf()));
                }
            }
        }
        files
    }

    fn open(
        &self,
        unit: &str,
        multi: bool,
        _ctx: &StateContext<'_>,
    ) -> Result<Arc<dyn StateStore>, (String, String)> {
        let mut nats = self.clone();
        if multi {
            nats.object = nats.object.map(|o| format!("{o}.{unit}"));
        }
        Ok(Arc::new(super::NatsStore::new(&nats, unit)))
    }
}

/// Whether a server URL (`nats://host:port`, `host:port`) names the loopback.
fn is_loopback(server: &str) -> bool {
    let rest = server.split_once("://").map_or(server, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let host = if let Some(v6) = rest.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        rest.split([':', '/']).next().unwrap_or_default()
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
