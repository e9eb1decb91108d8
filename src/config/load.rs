//! Loading: figment layers, per-section extraction (so one bad section does not hide the
//! problems of another), then the semantic checks serde cannot express, in file order. Each
//! check lives beside its section (`problems()`); only what needs the figment (which keys
//! the file or environment set, where a value came from) is here.

use std::fmt;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::Value;
use figment::{Figment, Metadata, Source};
use serde::de::DeserializeOwned;

use super::env::{is_service_link, ENV_PREFIX};
use super::problems::Problems;
use super::Expressions;
use super::{probe, words, SECTIONS};
use super::{
    ClusterConfig, ClusterEntry, Config, LeaderElectionConfig, LogConfig, PipelineConfig,
    ResourceConfig, ServerConfig, SinkConfig, StateConfig, WatchConfig,
};

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
        let message = self.message.trim_end();
        if self.key.is_empty() {
            write!(f, "{message} (from {})", self.source)
        } else {
            write!(f, "{}: {message} (from {})", self.key, self.source)
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
            // A TOML syntax error spans lines (a snippet with a caret): kept under its dash.
            let text = e.to_string().replace(" \n", "\n");
            let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
            writeln!(f, "  - {}", lines.join("\n    "))?;
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
/// JSON pointers, duplicate sink names...). Selectors are validated by the API server; the
/// expressions (filters, change paths) by `exprs`.
pub fn load(file: Option<&Path>, exprs: &dyn Expressions) -> Result<Config, ConfigErrors> {
    load_with_env(file, Env::prefixed(ENV_PREFIX), exprs)
}

/// [`load`] with an explicit environment provider (tests use `Env` over a fixed map).
pub(crate) fn load_with_env(
    file: Option<&Path>,
    env: Env,
    exprs: &dyn Expressions,
) -> Result<Config, ConfigErrors> {
    loader(file, env, exprs)?.run()
}

/// [`load`] for `kubesink check`: with problems, also what did parse (built-in defaults in
/// place of each section that did not), so that the warnings and `--strict`'s missing files
/// of the sections that parsed are reported beside the errors, in one run. The partial
/// configuration is `None` when the file itself could not be read or parsed (nothing parsed).
///
/// # Errors
/// As [`load`], with the partial configuration.
pub fn load_with_partial(
    file: Option<&Path>,
    exprs: &dyn Expressions,
) -> Result<Config, (ConfigErrors, Option<Box<Config>>)> {
    let loader = loader(file, Env::prefixed(ENV_PREFIX), exprs).map_err(|e| (e, None))?;
    match loader.run_partial() {
        (Some(config), errors) if errors.is_empty() => Ok(config),
        (config, errors) => Err((ConfigErrors(errors), config.map(Box::new))),
    }
}

/// Loads only the `[[resources]]` entries, checked as [`load`] checks them, for commands that
/// need no more (`kubesink rbac`). Other sections are neither extracted nor checked (that is
/// `kubesink check`'s job); the layered figment is returned so that a caller can read a
/// section of its own, e.g. `figment.find_value("leader_election")`.
///
/// # Errors
/// [`ConfigErrors`]: unreadable or missing file, TOML syntax, and every problem of the
/// `resources` entries.
pub fn load_resources(
    file: Option<&Path>,
    exprs: &dyn Expressions,
) -> Result<(Vec<ResourceConfig>, Figment), ConfigErrors> {
    let mut loader = loader(file, Env::prefixed(ENV_PREFIX), exprs)?;
    let resources = loader.list::<ResourceConfig>("resources");
    if let Some(resources) = &resources {
        if resources.is_empty() {
            loader.problem("resources", "at least one [[resources]] entry is required");
        }
        for (i, r) in resources.iter().enumerate() {
            for (key, message) in r.problems(&format!("resources.{i}"), loader.exprs) {
                loader.problem(&key, message);
            }
        }
    }
    match resources {
        Some(resources) if loader.errors.is_empty() => Ok((resources, loader.figment)),
        _ => Err(ConfigErrors(loader.errors)),
    }
}

/// A key path as the file spells it: `sinks.0.librdkafka."ssl.keystore.password"` (a key
/// that holds a dot is quoted, as in TOML).
fn dotted(path: &[String]) -> String {
    path.iter()
        .map(|k| {
            if k.contains('.') {
                format!("{k:?}")
            } else {
                k.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The layers, defaults < file < environment, ready to extract.
fn loader<'a>(
    file: Option<&Path>,
    env: Env,
    exprs: &'a dyn Expressions,
) -> Result<Loader<'a>, ConfigErrors> {
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
    // Variables the kubelet writes for Services named `kubesink…` are not configuration
    // (env.rs); skipped before they can read as sections.
    let env = env
        .filter(|k| {
            let name = format!("{ENV_PREFIX}{}", k.as_str());
            !std::env::var(&name).is_ok_and(|v| is_service_link(&name, &v))
        })
        .split("__")
        .filter(|k| k.as_str() != "config")
        .map(|k| k.as_str().to_ascii_lowercase().into());
    let figment = figment.merge(env);
    let file: Option<PathBuf> = file.map(Path::to_path_buf);
    Ok(Loader {
        figment,
        file,
        errors: Vec::new(),
        exprs,
    })
}

struct Loader<'a> {
    figment: Figment,
    file: Option<PathBuf>,
    errors: Vec<ConfigError>,
    /// The checks of the entries' expressions (filters, change paths).
    exprs: &'a dyn Expressions,
}

/// What the shipped deploy files hold where only the user knows the right value (the
/// cluster's name, a broker password): `check` and `run` refuse it wherever it is left, so a
/// copied file cannot start a production run under a made-up name or with a made-up password.
pub const PLACEHOLDER: &str = "CHANGE-ME";

/// Which sections a section's checks read besides its own: a check whose inputs did not
/// parse is not run (with a default in their place it would report what is not there).
fn check_inputs(section: &str) -> &'static [&'static str] {
    match section {
        "cluster" | "clusters" => &["cluster", "clusters", "resources"],
        "leader_election" => &["clusters"],
        _ => &[],
    }
}

impl Loader<'_> {
    fn run(self) -> Result<Config, ConfigErrors> {
        match self.run_partial() {
            (Some(config), errors) if errors.is_empty() => Ok(config),
            (_, errors) => Err(ConfigErrors(errors)),
        }
    }

    /// Every problem, and the configuration as far as it parsed (defaults in place of the
    /// sections that did not); `None` when the file does not parse at all.
    fn run_partial(mut self) -> (Option<Config>, Vec<ConfigError>) {
        // A file that does not parse (TOML syntax) fails every section alike: said once.
        let top = match self.figment.extract::<Value>() {
            Ok(top) => top,
            Err(e) => {
                self.push_figment(e, None);
                return (None, self.errors);
            }
        };
        self.unknown_sections(&top);
        self.placeholders(&top);
        let cluster = self.section::<ClusterConfig>("cluster");
        let clusters = self.list::<ClusterEntry>("clusters");
        let leader_election = self.section::<LeaderElectionConfig>("leader_election");
        let pipeline = self.section::<PipelineConfig>("pipeline");
        let watch = self.section::<WatchConfig>("watch");
        let server = self.section::<ServerConfig>("server");
        let log = self.section::<LogConfig>("log");
        let resources = self.list::<ResourceConfig>("resources");
        let sinks = self.list::<SinkConfig>("sinks");
        // What is left of each entry that did not parse (its bad values taken out): checked
        // here, and kept in the partial configuration `check` warns about.
        let sink_rest = if sinks.is_none() {
            self.sink_remainders()
        } else {
            Vec::new()
        };
        let state = self.section::<StateConfig>("state");
        let state_rest = match &state {
            None => self
                .figment
                .find_value("state")
                .ok()
                .and_then(|v| probe::remainder::<StateConfig>(&v))
                .map(|(rest, _)| rest),
            Some(_) => None,
        };
        let mut failed: Vec<&str> = Vec::new();
        let mut parsed = |name: &'static str, ok: bool| {
            if !ok {
                failed.push(name);
            }
        };
        parsed("cluster", cluster.is_some());
        parsed("clusters", clusters.is_some());
        parsed("leader_election", leader_election.is_some());
        parsed("pipeline", pipeline.is_some());
        parsed("watch", watch.is_some());
        parsed("server", server.is_some());
        parsed("log", log.is_some());
        parsed("resources", resources.is_some());
        parsed("sinks", sinks.is_some());
        parsed("state", state.is_some());
        // The checks across keys run on what parsed, defaults standing in for the rest, so
        // that one run reports every problem; a check reading a section that did not parse
        // is left out.
        let config = Config {
            cluster: cluster.unwrap_or_default(),
            clusters: clusters.unwrap_or_default(),
            leader_election: leader_election.unwrap_or_default(),
            pipeline: pipeline.unwrap_or_default(),
            watch: watch.unwrap_or_default(),
            server: server.unwrap_or_default(),
            log: log.unwrap_or_default(),
            resources: resources.unwrap_or_default(),
            sinks: sinks.unwrap_or_default(),
            state: state.unwrap_or_default(),
        };
        self.check(&config, &failed);
        // The partial configuration `check` warns about: the remainders in place of the
        // defaults (never run: it has errors), so one bad value of a sink or of `[state]`
        // does not hide the other entries' missing files and warnings.
        let mut config = config;
        if !sink_rest.is_empty() {
            config.sinks = sink_rest;
        }
        if let Some(rest) = state_rest {
            config.state = rest;
        }
        (Some(config), self.errors)
    }

    /// Reports every value the file or the environment left at [`PLACEHOLDER`].
    fn placeholders(&mut self, top: &Value) {
        fn walk(
            v: &Value,
            path: &mut Vec<String>,
            out: &mut Vec<(Vec<String>, figment::value::Tag)>,
        ) {
            match v {
                Value::String(tag, s) if s.trim().eq_ignore_ascii_case(PLACEHOLDER) => {
                    out.push((path.clone(), *tag));
                }
                Value::Dict(_, dict) => {
                    for (k, v) in dict {
                        path.push(k.clone());
                        walk(v, path, out);
                        path.pop();
                    }
                }
                Value::Array(_, items) => {
                    for (i, v) in items.iter().enumerate() {
                        path.push(i.to_string());
                        walk(v, path, out);
                        path.pop();
                    }
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        walk(top, &mut Vec::new(), &mut found);
        for (path, tag) in found {
            let key = path.join(".");
            let what = match key.as_str() {
                "cluster.name" => "the cluster's name, carried by every message (in the file, or KUBESINK_CLUSTER__NAME in the environment)",
                k if k.ends_with("password") || k.ends_with("token") || k.ends_with("seed") => {
                    "the credential, best as { env = \"NAME\" } or { file = \"PATH\" } so that the file holds none"
                }
                _ => "the real value",
            };
            let source =
                describe_source(self.figment.get_metadata(tag), &path, self.file.as_deref());
            self.errors.push(ConfigError {
                message: format!("is still the placeholder {PLACEHOLDER:?} of the shipped configuration: set it to {what}"),
                key,
                source,
            });
        }
    }

    /// Reports every top-level key that is not a section, with the nearest section's name.
    fn unknown_sections(&mut self, top: &Value) {
        let Value::Dict(_, top) = top else {
            return;
        };
        for (key, value) in top {
            if SECTIONS.contains(&key.as_str()) {
                continue;
            }
            let path = vec![key.clone()];
            let source = describe_source(
                self.figment.get_metadata(value.tag()),
                &path,
                self.file.as_deref(),
            );
            self.errors.push(ConfigError {
                message: format!(
                    "unknown section {key:?}{}; the sections are: {}",
                    super::words::did_you_mean(key, SECTIONS),
                    SECTIONS.join(", ")
                ),
                key: key.clone(),
                source,
            });
        }
    }

    /// Extracts a table section, reporting every problem in it (`probe.rs`).
    fn section<T: DeserializeOwned>(&mut self, key: &str) -> Option<T> {
        let first = match self.figment.extract_inner::<T>(key) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        let before = self.errors.len();
        if let Ok(value) = self.figment.find_value(key) {
            self.push_found(&value, &[key.to_owned()], probe::all_errors::<T>(&value));
        }
        if self.errors.len() == before {
            self.push_figment(first, Some(key));
        }
        None
    }

    /// Extracts an array-of-tables section, reporting every problem of every element.
    fn list<T: DeserializeOwned>(&mut self, key: &str) -> Option<Vec<T>> {
        let first = match self.figment.extract_inner::<Vec<T>>(key) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        let before = self.errors.len();
        let value = self.figment.find_value(key);
        if let Ok(Value::Dict(tag, _)) = &value {
            let md = self.figment.get_metadata(*tag);
            if md.is_some_and(|md| md.source.is_none() && md.name.contains("environment")) {
                let path = [key.to_owned()];
                self.errors.push(ConfigError {
                    key: key.to_owned(),
                    message: format!(
                        "[[{key}]] entries come from the file only: an environment variable cannot set one (KUBESINK_{}__0__… makes a table, not a list); for a secret, write {{ env = \"NAME\" }} or {{ file = \"PATH\" }} in the file",
                        key.to_ascii_uppercase()
                    ),
                    source: describe_source(md, &path, self.file.as_deref()),
                });
                return None;
            }
        }
        if let Ok(Value::Array(_, items)) = value {
            for (i, item) in items.iter().enumerate() {
                let prefix = [key.to_owned(), i.to_string()];
                self.push_found(item, &prefix, probe::all_errors::<T>(item));
            }
        }
        if self.errors.len() == before {
            self.push_figment(first, Some(key));
        }
        None
    }

    /// The checks serde cannot express, on what is left of each `[[sinks]]` entry that did
    /// not parse once its bad values are taken out ([`probe::remainder`]): a bad value does
    /// not hide the entry's other problems. A problem of a key already reported (its value
    /// taken out, a default in its place) is not said again.
    fn sink_remainders(&mut self) -> Vec<SinkConfig> {
        let Ok(Value::Array(_, items)) = self.figment.find_value("sinks") else {
            return Vec::new();
        };
        let mut rest = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let Some((sink, taken)) = probe::remainder::<SinkConfig>(item) else {
                continue;
            };
            let taken: Vec<String> = taken.iter().map(|p| p.join(".")).collect();
            for (key, message) in self.sink_problems(&sink, i) {
                let shadowed = taken.iter().any(|t| {
                    key == *t
                        || key.starts_with(&format!("{t}."))
                        || t.starts_with(&format!("{key}."))
                });
                if !shadowed {
                    self.problem(&format!("sinks.{i}.{key}"), message);
                }
            }
            rest.push(sink);
        }
        rest
    }

    /// Records the problems found in `value` (at `prefix`), each with its value's source.
    fn push_found(&mut self, value: &Value, prefix: &[String], found: Vec<probe::Found>) {
        for f in found {
            let mut path = prefix.to_vec();
            path.extend(f.path);
            let md = self
                .figment
                .get_metadata(f.tag)
                .or_else(|| self.figment.get_metadata(value.tag()));
            // A sink's own checks name their key in the message ("format: unknown value…"),
            // for when serde could not say where: said once is enough.
            let mut message = words::describe(&f.kind);
            if let Some(rest) = path
                .last()
                .and_then(|last| message.strip_prefix(&format!("{last}: ")))
            {
                message = rest.to_owned();
            }
            self.errors.push(ConfigError {
                key: dotted(&path),
                message,
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
            let message = words::describe(&e.kind);
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

    /// Every semantic problem of `c`, section by section, in file order (each section's
    /// checks live beside it; only what spans sections or needs the figment is here).
    ///
    /// `failed` are the sections that did not parse (`c` holds defaults in their place): the
    /// problems of checks that read them are left out.
    fn check(&mut self, c: &Config, failed: &[&str]) {
        let mut problems = Problems::default();
        problems.extend(super::cluster::problems(c, self.exprs));
        problems.extend(c.leader_election.problems(&c.clusters));
        problems.extend(c.cluster.label_problems());
        problems.extend(c.pipeline.problems());
        problems.extend(c.watch.problems());
        problems.extend(c.server.problems());
        problems.extend(super::resource::list_problems(
            "resources",
            &c.resources,
            self.exprs,
        ));
        if c.sinks.is_empty() {
            problems.add("sinks", "at least one [[sinks]] entry is required");
        }
        problems.extend(c.state.problems());
        if c.leader_election.scale_out && c.leader_election.enabled && c.state.selected().is_none()
        {
            let choice = super::state::shared_choice().map_or_else(
                || "needs a [state] backend every replica reaches (this build has none)".to_owned(),
                |names| format!("needs [state] backend = {names}"),
            );
            problems.add("leader_election.scale_out", format!("{choice}: a cluster moves between replicas and its next holder resumes from its saved state (a file is one replica's; without state every move re-sends the cluster and loses the deletes made during it)"));
        }
        for (key, message) in problems.into_vec() {
            let section = key.split('.').next().unwrap_or_default();
            if failed.contains(&section) || check_inputs(section).iter().any(|s| failed.contains(s))
            {
                continue;
            }
            self.problem(&key, message);
        }
        // Each registered backend's section: beside the rest of the configuration when it is
        // the backend, an error for any of its settings when it is not (neither when a
        // section it reads did not parse).
        if !failed.contains(&"state") {
            let backend = c.state.backend.name();
            let ctx = c.state_context(String::new());
            for (name, section) in c.state.sections() {
                if section.inputs().iter().any(|s| failed.contains(s)) {
                    continue;
                }
                if name == backend {
                    for (key, message) in section.problems_across(&ctx) {
                        self.problem(&format!("state.{name}.{key}"), message);
                    }
                } else if let Some(key) = self.set_keys(&format!("state.{name}")).into_iter().next()
                {
                    self.problem(&key, section.unselected(backend));
                }
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
            for (key, message) in self.sink_problems(s, i) {
                self.problem(&format!("sinks.{i}.{key}"), message);
            }
        }
    }

    /// The problems of the `[[sinks]]` entry at `index`, as `(key inside the entry,
    /// message)`: its destination's own checks, then its expressions'.
    fn sink_problems(&self, s: &SinkConfig, index: usize) -> Vec<(String, String)> {
        let mut found: Vec<(String, String)> = s
            .validate(index)
            .into_iter()
            .map(|e| {
                let kubesink_core::SinkConfigError::Invalid { key, message, .. } = e;
                (key, message)
            })
            .collect();
        found.extend(self.exprs.sink(s));
        found
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
            // A variable set at `path` or above it; failing that, one below it (an unknown
            // section or table is named by the variable that set a key in it).
            let n = rest.len().min(want.len());
            let rank = if rest.len() <= want.len() { n } else { 0 };
            (rest[..n] == want[..n]).then_some((rank, name))
        })
        .max_by_key(|(rank, _)| *rank)
        .map(|(_, name)| name)
}
