//! Loading and checking: figment layers, per-section extraction (so one bad section does not
//! hide the problems of another) and semantic checks serde cannot express.

use std::fmt;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::Value;
use figment::{Figment, Metadata, Source};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{
    ClusterConfig, ClusterEntry, Config, LeaderElectionConfig, LogConfig, PayloadMode,
    PipelineConfig, ResourceConfig, ServerConfig, SinkConfig, StateConfig, WatchConfig,
};

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "KUBESINK_";

/// One configuration problem: the key, what is wrong, and where the value came from.
///
/// Displays as `pipeline.linger: invalid duration "5 parsecs" (from env KUBESINK_PIPELINE__LINGER)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key (`pipeline.linger`, `resources.2.kind`); empty for the file itself.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// Where the value came from: `file PATH`, `env NAME` or `default`.
    pub source: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{} (from {})", self.message, self.source)
        } else {
            write!(f, "{}: {} (from {})", self.key, self.message, self.source)
        }
    }
}

/// Every problem found while loading; never empty.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        writeln!(
            f,
            "{n} configuration problem{}:",
            if n == 1 { "" } else { "s" }
        )?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

/// Loads the configuration: defaults < `file` (TOML) < `KUBESINK_…` environment variables.
///
/// `file` is the path given with `--config` or `KUBESINK_CONFIG`; when given it must exist.
///
/// # Errors
/// [`ConfigErrors`] with every problem found: unreadable or missing file, TOML syntax,
/// unknown keys, bad types or units, and semantic problems (missing `cluster.name`, bad
/// JSON pointers, duplicate sink names...). Selectors are validated by the API server.
pub fn load(file: Option<&Path>) -> Result<Config, ConfigErrors> {
    load_with_env(file, Env::prefixed(ENV_PREFIX))
}

/// [`load`] with an explicit environment provider (tests use `Env` over a fixed map).
pub(crate) fn load_with_env(file: Option<&Path>, env: Env) -> Result<Config, ConfigErrors> {
    loader(file, env)?.run()
}

/// Loads only the `[[resources]]` entries, checked as [`load`] checks them, for commands that
/// need no more (`kubesink rbac`). Other sections are neither extracted nor checked (that is
/// `kubesink check`'s job); the layered figment is returned so that a caller can read a
/// section of its own, e.g. `figment.find_value("leader_election")`.
///
/// # Errors
/// [`ConfigErrors`]: unreadable or missing file, TOML syntax, and every problem of the
/// `resources` entries.
pub fn load_resources(file: Option<&Path>) -> Result<(Vec<ResourceConfig>, Figment), ConfigErrors> {
    let mut loader = loader(file, Env::prefixed(ENV_PREFIX))?;
    let resources = loader.list::<ResourceConfig>("resources");
    if let Some(resources) = &resources {
        if resources.is_empty() {
            loader.problem("resources", "at least one [[resources]] entry is required");
        }
        for (i, r) in resources.iter().enumerate() {
            loader.check_resource(&format!("resources.{i}"), r);
        }
    }
    match resources {
        Some(resources) if loader.errors.is_empty() => Ok((resources, loader.figment)),
        _ => Err(ConfigErrors(loader.errors)),
    }
}

/// The layers, defaults < file < environment, ready to extract.
fn loader(file: Option<&Path>, env: Env) -> Result<Loader, ConfigErrors> {
    let mut figment = Figment::from(Serialized::defaults(Config::default()));
    if let Some(path) = file {
        if !path.is_file() {
            return Err(ConfigErrors(vec![ConfigError {
                key: String::new(),
                message: format!(
                    "config file {} does not exist or is not a file",
                    path.display()
                ),
                source: "--config / KUBESINK_CONFIG".to_owned(),
            }]));
        }
        figment = figment.merge(Toml::file_exact(path));
    }
    let env = env
        .split("__")
        .filter(|k| k.as_str() != "config")
        .map(|k| k.as_str().to_ascii_lowercase().into());
    let figment = figment.merge(env);
    let file: Option<PathBuf> = file.map(Path::to_path_buf);
    Ok(Loader {
        figment,
        file,
        errors: Vec::new(),
    })
}

struct Loader {
    figment: Figment,
    file: Option<PathBuf>,
    errors: Vec<ConfigError>,
}

/// Top-level keys only, to report unknown sections before looking inside known ones.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read only for its unknown-field check
struct Sections {
    cluster: Option<Value>,
    clusters: Option<Value>,
    leader_election: Option<Value>,
    pipeline: Option<Value>,
    watch: Option<Value>,
    server: Option<Value>,
    log: Option<Value>,
    resources: Option<Value>,
    sinks: Option<Value>,
    state: Option<Value>,
}

impl Loader {
    fn run(mut self) -> Result<Config, ConfigErrors> {
        if let Err(e) = self.figment.extract::<Sections>() {
            self.push_figment(e, None);
            return Err(ConfigErrors(self.errors));
        }
        let cluster = self.section::<ClusterConfig>("cluster");
        let clusters = self.list::<ClusterEntry>("clusters");
        let leader_election = self.section::<LeaderElectionConfig>("leader_election");
        let pipeline = self.section::<PipelineConfig>("pipeline");
        let watch = self.section::<WatchConfig>("watch");
        let server = self.section::<ServerConfig>("server");
        let log = self.section::<LogConfig>("log");
        let resources = self.list::<ResourceConfig>("resources");
        let sinks = self.list::<SinkConfig>("sinks");
        let state = self.section::<StateConfig>("state");
        let (
            Some(cluster),
            Some(clusters),
            Some(leader_election),
            Some(pipeline),
            Some(watch),
            Some(server),
            Some(log),
            Some(resources),
            Some(sinks),
            Some(state),
        ) = (
            cluster,
            clusters,
            leader_election,
            pipeline,
            watch,
            server,
            log,
            resources,
            sinks,
            state,
        )
        else {
            return Err(ConfigErrors(self.errors));
        };
        let config = Config {
            cluster,
            clusters,
            leader_election,
            pipeline,
            watch,
            server,
            log,
            resources,
            sinks,
            state,
        };
        self.check(&config);
        if self.errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(self.errors))
        }
    }

    /// Extracts a table section. serde stops at a section's first bad key, so on error every
    /// key is probed alone (over the defaults) to report all of its problems.
    fn section<T: DeserializeOwned + Serialize + Default>(&mut self, key: &str) -> Option<T> {
        let first = match self.figment.extract_inner::<T>(key) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        let before = self.errors.len();
        if let Ok(Value::Dict(_, dict)) = self.figment.find_value(key) {
            for (k, v) in dict {
                let probe = Figment::from(Serialized::defaults(T::default()))
                    .merge(Serialized::default(&k, v));
                if let Err(e) = probe.extract::<T>() {
                    let md = self.figment.find_metadata(&format!("{key}.{k}")).cloned();
                    self.push_probe(e, &[key.to_owned()], md.as_ref());
                }
            }
        }
        if self.errors.len() == before {
            self.push_figment(first, Some(key));
        }
        None
    }

    /// Extracts an array-of-tables section, reporting the problems of every element.
    fn list<T: DeserializeOwned>(&mut self, key: &str) -> Option<Vec<T>> {
        let first = match self.figment.extract_inner::<Vec<T>>(key) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        let before = self.errors.len();
        if let Ok(Value::Array(_, items)) = self.figment.find_value(key) {
            let md = self.figment.find_metadata(key).cloned();
            for (i, item) in items.iter().enumerate() {
                if let Err(e) = item.deserialize::<T>() {
                    self.push_probe(e, &[key.to_owned(), i.to_string()], md.as_ref());
                }
            }
        }
        if self.errors.len() == before {
            self.push_figment(first, Some(key));
        }
        None
    }

    /// Records the errors of a probe extraction under `prefix`, with the real value's source.
    fn push_probe(&mut self, errors: figment::Error, prefix: &[String], md: Option<&Metadata>) {
        for e in errors {
            let mut path: Vec<String> = prefix.to_vec();
            path.extend(e.path.iter().cloned());
            if let figment::error::Kind::UnknownField(field, _) = &e.kind {
                if path.last() != Some(field) {
                    path.push(field.clone());
                }
            }
            self.errors.push(ConfigError {
                key: path.join("."),
                message: describe_kind(&e.kind),
                source: describe_source(md, &path, self.file.as_deref()),
            });
        }
    }

    /// Records figment errors. `section` is the key passed to `extract_inner`: figment 0.10
    /// appends it to the end of the error path instead of the front, so it is moved back.
    fn push_figment(&mut self, errors: figment::Error, section: Option<&str>) {
        for e in errors {
            let mut path = e.path.clone();
            if let Some(sec) = section {
                if path.last().map(String::as_str) == Some(sec) {
                    path.pop();
                }
                path.insert(0, sec.to_owned());
            }
            if let figment::error::Kind::UnknownField(field, _) = &e.kind {
                if path.last() != Some(field) {
                    path.push(field.clone());
                }
            }
            let key = path.join(".");
            let message = describe_kind(&e.kind);
            let source = describe_source(e.metadata.as_ref(), &path, self.file.as_deref());
            self.errors.push(ConfigError {
                key,
                message,
                source,
            });
        }
    }

    /// Adds a semantic problem for `key`, finding where its value came from.
    fn problem(&mut self, key: &str, message: impl Into<String>) {
        let md = self.figment.find_metadata(key);
        let path: Vec<String> = key.split('.').map(str::to_owned).collect();
        let source = describe_source(md, &path, self.file.as_deref());
        self.errors.push(ConfigError {
            key: key.to_owned(),
            message: message.into(),
            source,
        });
    }

    /// The dotted keys under `key` that the file or the environment set (not the built-in
    /// defaults), in key order; a list counts as one key.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    fn set_keys(&self, key: &str) -> Vec<String> {
        fn walk(figment: &Figment, key: String, v: &Value, out: &mut Vec<String>) {
            if let Value::Dict(_, dict) = v {
                for (k, v) in dict {
                    walk(figment, format!("{key}.{k}"), v, out);
                }
                return;
            }
            let default = figment
                .find_metadata(&key)
                .is_none_or(|md| matches!(md.source, Some(Source::Code(_))));
            if !default {
                out.push(key);
            }
        }
        let mut out = Vec::new();
        if let Ok(v) = self.figment.find_value(key) {
            walk(&self.figment, key.to_owned(), &v, &mut out);
        }
        out
    }

    fn check_cluster_name(&mut self, key: &str, name: &str) {
        if let Err(why) = check_label_value(name) {
            self.problem(key, format!("{name:?} {why}"));
        } else if name.contains('/') {
            self.problem(key, "must not contain '/' (it is part of the message key)");
        }
    }

    fn check(&mut self, c: &Config) {
        if c.clusters.is_empty() {
            if c.cluster.name.is_empty() {
                self.problem(
                    "cluster.name",
                    "required: the cluster's name, carried by every message (set it in the file or KUBESINK_CLUSTER__NAME)",
                );
            } else {
                self.check_cluster_name("cluster.name", &c.cluster.name);
            }
        } else {
            if !c.cluster.name.is_empty()
                || c.cluster.kubeconfig.is_some()
                || c.cluster.context.is_some()
            {
                self.problem(
                    "clusters",
                    "use either [cluster] (name, kubeconfig, context) or [[clusters]], not both (cluster.label applies to all)",
                );
            }
            let mut names = std::collections::HashSet::new();
            for (i, e) in c.clusters.iter().enumerate() {
                self.check_cluster_name(&format!("clusters.{i}.name"), &e.name);
                if !names.insert(e.name.clone()) {
                    self.problem(
                        &format!("clusters.{i}.name"),
                        format!("cluster name {:?} is used twice", e.name),
                    );
                }
                for (j, r) in e.resources.iter().flatten().enumerate() {
                    self.check_resource(&format!("clusters.{i}.resources.{j}"), r);
                }
            }
        }
        let le = &c.leader_election;
        if le.enabled {
            if le.renew_deadline >= le.lease_duration {
                self.problem(
                    "leader_election.renew_deadline",
                    "must be shorter than leader_election.lease_duration (the leader must stop before its lease can expire)",
                );
            }
            if le.retry_period >= le.renew_deadline || le.retry_period.0.is_zero() {
                self.problem(
                    "leader_election.retry_period",
                    "must be greater than zero and shorter than leader_election.renew_deadline",
                );
            } else if le.renew_deadline.0 + 2 * le.retry_period.0 >= le.lease_duration.0
                && le.renew_deadline < le.lease_duration
            {
                // The leader learns that it missed its renew deadline at the end of a renew
                // attempt: up to one retry_period of sleep plus one of request time after
                // the deadline. Only then does it stop and exit; until then it must still hold
                // the lease, or another replica could take over while it runs.
                self.problem(
                    "leader_election.lease_duration",
                    format!(
                        "must be longer than renew_deadline + 2 × retry_period ({} + 2 × {}): a leader that cannot renew stops up to two retry periods after its renew deadline, and must not outlive its lease",
                        humantime::format_duration(le.renew_deadline.0),
                        humantime::format_duration(le.retry_period.0)
                    ),
                );
            }
            if let Some(name) = &le.cluster {
                if !c.clusters.iter().any(|e| &e.name == name) {
                    self.problem(
                        "leader_election.cluster",
                        format!("{name:?} is not the name of a [[clusters]] entry"),
                    );
                }
            }
        }
        if let Err(why) = check_label_key(&c.cluster.label) {
            self.problem("cluster.label", format!("{:?} {why}", c.cluster.label));
        }
        let p = &c.pipeline;
        for (key, v) in [
            ("pipeline.max_pending", p.max_pending),
            ("pipeline.max_batch_events", p.max_batch_events),
            ("pipeline.max_pending_bytes", p.max_pending_bytes.bytes()),
            ("pipeline.max_batch_bytes", p.max_batch_bytes.bytes()),
        ] {
            if v == 0 {
                self.problem(key, "must be at least 1");
            }
        }
        if p.retry_initial_backoff.0.is_zero() {
            self.problem(
                "pipeline.retry_initial_backoff",
                "must be greater than zero",
            );
        }
        if p.retry_max_backoff < p.retry_initial_backoff {
            self.problem(
                "pipeline.retry_max_backoff",
                "must not be shorter than pipeline.retry_initial_backoff",
            );
        }
        let w = &c.watch;
        if w.idle_timeout.0 < std::time::Duration::from_secs(1) {
            self.problem("watch.idle_timeout", "must be at least 1s");
        }
        if w.retry_initial_backoff.0.is_zero() {
            self.problem("watch.retry_initial_backoff", "must be greater than zero");
        }
        if w.retry_max_backoff < w.retry_initial_backoff {
            self.problem(
                "watch.retry_max_backoff",
                "must not be shorter than watch.retry_initial_backoff",
            );
        }
        if c.server.enabled {
            if let Err(e) = c.server.listen.parse::<std::net::SocketAddr>() {
                self.problem(
                    "server.listen",
                    format!(
                        "{:?} is not an address:port ({e}), e.g. \"0.0.0.0:9090\"",
                        c.server.listen
                    ),
                );
            }
        }
        if c.server.sink_check_interval.0.is_zero() {
            self.problem("server.sink_check_interval", "must be greater than zero");
        }
        if c.resources.is_empty() {
            self.problem("resources", "at least one [[resources]] entry is required");
        }
        let mut seen = std::collections::HashSet::new();
        for (i, r) in c.resources.iter().enumerate() {
            self.check_resource(&format!("resources.{i}"), r);
            if !seen.insert((r.api_version.clone(), r.kind.clone(), r.namespaces.clone())) {
                self.problem(
                    &format!("resources.{i}"),
                    format!("{} is listed twice", r.display_name()),
                );
            }
        }
        if c.sinks.is_empty() {
            self.problem("sinks", "at least one [[sinks]] entry is required");
        }
        for (key, message) in c.state.problems() {
            self.problem(&key, message);
        }
        #[cfg(feature = "nats")]
        if c.state.backend == super::StateBackend::None {
            if let Some(key) = self.set_keys("state.nats").into_iter().next() {
                self.problem(
                    &key,
                    format!(
                        "is a [state.nats] setting but state.backend is \"none\" (the default), so no state would be kept and every delete made while kubesink is down would be lost at the next restart: {}",
                        super::state::NO_BACKEND_FIX_NATS
                    ),
                );
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, s) in c.sinks.iter().enumerate() {
            if !names.insert(s.name().to_owned()) {
                self.problem(
                    &format!("sinks.{i}.name"),
                    format!(
                        "sink name {:?} is used twice; names must be unique",
                        s.name()
                    ),
                );
            }
            for e in s.validate(i) {
                let kubesink_core::SinkConfigError::Invalid { key, message, .. } = e;
                self.problem(&format!("sinks.{i}.{key}"), message);
            }
        }
    }

    fn check_resource(&mut self, at_key: &str, r: &ResourceConfig) {
        let at = |k: &str| format!("{at_key}.{k}");
        if let Err(why) = check_api_version(&r.api_version) {
            self.problem(
                &at("api_version"),
                format!(
                    "{:?} is not an apiVersion: {why} (expected \"v1\" for the core group, or \"group/version\" such as \"apps/v1\")",
                    r.api_version
                ),
            );
        }
        if r.kind.is_empty() || !r.kind.chars().all(|c| c.is_ascii_alphanumeric()) {
            self.problem(
                &at("kind"),
                format!("{:?} is not a Kind (expected e.g. \"Deployment\")", r.kind),
            );
        }
        if r.payload == PayloadMode::Fields && r.fields.is_empty() {
            self.problem(
                &at("fields"),
                "payload = \"fields\" needs at least one JSON pointer in fields",
            );
        }
        if r.payload != PayloadMode::Fields && !r.fields.is_empty() {
            self.problem(
                &at("fields"),
                "fields is only used with payload = \"fields\"",
            );
        }
        for (j, ptr) in r.fields.iter().enumerate() {
            if !ptr.starts_with('/') || ptr.len() < 2 {
                self.problem(
                    &at(&format!("fields.{j}")),
                    format!("{ptr:?} is not a JSON pointer (RFC 6901), e.g. \"/spec/nodeName\""),
                );
            }
        }
        for (j, ptr) in r.drop.iter().enumerate() {
            if !ptr.starts_with('/') || ptr.len() < 2 {
                self.problem(
                    &at(&format!("drop.{j}")),
                    format!(
                        "{ptr:?} is not a JSON pointer (RFC 6901), e.g. \"/status/conditions\""
                    ),
                );
            }
        }
        for (j, ns) in r.namespaces.iter().enumerate() {
            if let Err(why) = check_dns_label(ns) {
                self.problem(&at(&format!("namespaces.{j}")), format!("{ns:?} {why}"));
            }
        }
        if r.page_size == 0 {
            self.problem(&at("page_size"), "must be at least 1");
        }
        if let Some(plural) = &r.plural {
            if check_dns_label(plural).is_err() {
                self.problem(
                    &at("plural"),
                    format!(
                        "{plural:?} is not a resource name: lowercase letters and digits, \
                         e.g. \"foobars\""
                    ),
                );
            }
        }
        if r.allow_secret_data && !(r.api_version == "v1" && r.kind == "Secret") {
            self.problem(&at("allow_secret_data"), "only applies to v1 Secret");
        }
    }
}

/// The error without figment's own location suffix.
fn describe_kind(kind: &figment::error::Kind) -> String {
    match kind {
        figment::error::Kind::UnknownField(field, expected) => {
            format!(
                "unknown key {field:?} (expected one of: {})",
                expected.join(", ")
            )
        }
        figment::error::Kind::Message(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Describes where the value at `path` came from: `file PATH`, `env KUBESINK_A__B`, `default`.
pub(crate) fn describe_source(
    md: Option<&Metadata>,
    path: &[String],
    file: Option<&Path>,
) -> String {
    let Some(md) = md else {
        return match file {
            Some(f) => format!("file {}", f.display()),
            None => "default".to_owned(),
        };
    };
    match &md.source {
        Some(Source::File(p)) => format!("file {}", p.display()),
        Some(Source::Code(_)) => "default: not set in the file or the environment".to_owned(),
        Some(other) => other.to_string(),
        None if md.name.contains("environment") => match env_var_for(path) {
            Some(name) => format!("env {name}"),
            None => format!("env {ENV_PREFIX}{}", path.join("__").to_ascii_uppercase()),
        },
        None => md.name.to_string(),
    }
}

/// The environment variable, spelled as it is set, that gave the value at `path`: figment
/// matches the `KUBESINK_` prefix without regard to case and splits the rest at `__`, and a
/// variable may set a whole table (`KUBESINK_PIPELINE='{linger = "1s"}'`), so this is the set
/// variable whose path is the longest prefix of `path`.
fn env_var_for(path: &[String]) -> Option<String> {
    let want: Vec<String> = path.iter().map(|p| p.to_ascii_lowercase()).collect();
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter_map(|name| {
            let trimmed = name.trim();
            let prefix = trimmed.get(..ENV_PREFIX.len())?;
            if !prefix.eq_ignore_ascii_case(ENV_PREFIX) {
                return None;
            }
            let rest: Vec<String> = trimmed[ENV_PREFIX.len()..]
                .split("__")
                .map(str::to_ascii_lowercase)
                .collect();
            let matches = rest.len() <= want.len() && rest[..] == want[..rest.len()];
            matches.then_some((rest.len(), name))
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, name)| name)
}

/// Kubernetes label value syntax: at most 63 characters of `[A-Za-z0-9._-]`, starting and
/// ending alphanumeric (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set).
fn check_label_value(v: &str) -> Result<(), &'static str> {
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
fn check_label_key(k: &str) -> Result<(), &'static str> {
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
fn check_api_version(v: &str) -> Result<(), String> {
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
fn check_dns_label(v: &str) -> Result<(), &'static str> {
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
