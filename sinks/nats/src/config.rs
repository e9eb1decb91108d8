//! `[[sinks]]` entry with `type = "nats"`: the serde configuration, its validation and
//! `build()`, which resolves the options into the service's settings, connects and (in
//! JetStream mode) checks or creates the stream.
//!
//! Option names follow the NATS client and server documentation
//! (<https://docs.nats.io/using-nats/developer/connecting>,
//! <https://docs.nats.io/nats-concepts/jetstream/streams>). This module never logs a secret:
//! passwords, tokens and nkey seeds are [`Secret`]s.

use std::path::PathBuf;
use std::sync::Arc;

use async_nats::jetstream::stream;
use async_nats::ServerAddr;
use async_trait::async_trait;
use kubesink_core::units::HumanDuration;
use kubesink_core::{Destination, Secret, Sink, SinkConfigError};
use serde::{Deserialize, Serialize};

use crate::connection;
use crate::connection::redact_url;
use crate::request::subject_template;
use crate::service::{Mode, NatsError, NatsService, Settings, StreamSetup};
use crate::NatsSink;

/// The default subject template: one subject per object.
pub const DEFAULT_SUBJECT: &str = "kubesink.{cluster}.{group}.{kind}.{namespace}.{name}";

/// NATS sink configuration (`[[sinks]]` with `type = "nats"`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// Name used in logs; unique among sinks. Default `"nats"`.
    #[serde(default = "default_name")]
    pub name: String,
    /// A CEL expression choosing what this sink gets (docs/configuration.md, "Sink filters
    /// and routes"). Naming only `object`, `cluster`, `kind` and `ns` it chooses the objects
    /// the sink holds: one that starts matching is sent to this sink as `added`, one that
    /// stops as `deleted` with `reason: "leftFilter"`, and the sink's acknowledged state is
    /// kept apart from the other sinks'. Naming `op` or `changed` it chooses changes: one
    /// it does not match is not sent to this sink. Compiled at start; `kubesink check`
    /// names a syntax error's line and column. Default: everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Server URLs (`nats://host:port`, `tls://host:port`). The client connects to one and
    /// fails over to the others. Default `["nats://127.0.0.1:4222"]`.
    #[serde(default = "default_servers")]
    pub servers: Vec<String>,
    /// Connection name shown by the server (`connz`). Default `"kubesink"`.
    #[serde(default = "default_connection_name")]
    pub connection_name: String,
    /// Subject template; placeholders `{cluster}`, `{group}` (`core` for the core group),
    /// `{version}`, `{kind}`, `{resource}`, `{namespace}` (`_` for cluster-scoped objects),
    /// `{name}`, each a whole token. Values are escaped (see `docs/nats.md`).
    /// Default [`DEFAULT_SUBJECT`].
    #[serde(default = "default_subject")]
    pub subject: String,
    /// `core` (no server acknowledgement; at-most-once across a server failure) or
    /// `jetstream` (every message's PubAck is awaited). Default `jetstream`.
    #[serde(default)]
    pub mode: NatsMode,
    /// How each message is written: `"json"` (the topology message v1 as the payload),
    /// `"cloudevents"` (CloudEvents binary content mode: the same payload plus `ce-`
    /// headers) or `"cloudevents-structured"` (the payload is a CloudEvents JSON envelope
    /// whose `data` is the message; `content-type: application/cloudevents+json`). See
    /// `docs/message-contract.md#cloudevents`. Default `"json"`.
    #[serde(default)]
    pub format: kubesink_core::message::Format,
    /// Bound on one publish, one flush and one PubAck wait. Default `5s`.
    #[serde(default = "default_publish_timeout")]
    pub publish_timeout: HumanDuration,
    /// Bound on establishing a connection (TCP, TLS, auth). Default `5s`.
    #[serde(default = "default_publish_timeout")]
    pub connect_timeout: HumanDuration,
    /// JetStream: messages published and awaiting their PubAck at once, across every batch
    /// in flight (the JetStream context's `max_ack_inflight`, with backpressure: a publish
    /// beyond it waits for a PubAck). Default `256`.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Batches the pipeline may have in flight to this sink at once (1 to 64): the next
    /// batch is published while the PubAcks (or, in core mode, the flush) of the previous
    /// ones are awaited, so one slow PubAck no longer holds everything behind it. Per-key
    /// order is kept: a key is in one batch in flight at most, so its next change is
    /// published only once the previous one is acknowledged, and a failed publish makes
    /// every later change of that key wait (`Sink::max_batches_in_flight`). `1` sends a
    /// batch only once the previous one is confirmed. Default `4`.
    #[serde(default = "default_batches_in_flight")]
    pub batches_in_flight: usize,
    /// Commands the client library may queue while disconnected (async-nats
    /// `client_capacity`); beyond it, publishing waits and times out, so the pipeline (not
    /// the library) holds the backlog. Default `1024`.
    #[serde(default = "default_client_capacity")]
    pub client_capacity: usize,
    /// Authentication; at most one method.
    #[serde(default)]
    pub auth: NatsAuth,
    /// TLS.
    #[serde(default)]
    pub tls: NatsTls,
    /// JetStream stream (used in `jetstream` mode only).
    #[serde(default)]
    pub stream: NatsStream,
}

/// Publishing mode.
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum NatsMode {
    /// Core NATS: a batch counts as delivered when `flush()` returns.
    Core,
    /// JetStream: a batch counts as delivered when every PubAck arrived.
    #[default]
    Jetstream,
}

/// `[sinks.auth]`: at most one of user/password, token, nkey seed, credentials file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsAuth {
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password (with `user`).
    pub password: Option<Secret>,
    /// Authentication token.
    pub token: Option<Secret>,
    /// NKey seed (`SU...`), the user's private key.
    pub nkey_seed: Option<Secret>,
    /// Credentials file (JWT and nkey seed, `.creds`).
    pub credentials_file: Option<PathBuf>,
}

/// `[sinks.tls]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsTls {
    /// PEM file of CA certificates that verify the server (in addition to the system roots).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (mutual TLS; with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Refuse a connection without TLS (`tls_required`). Default `false`; `tls://` URLs
    /// and the server's own `tls_required` turn TLS on regardless (`ca_file` and the client
    /// certificate alone do not). Credentials without it or `tls://` URLs are warned about.
    #[serde(default)]
    pub required: bool,
}

impl NatsTls {
    /// The TLS files with their keys relative to the connection's section (`tls.ca_file`,
    /// `tls.cert_file`, `tls.key_file`), set or not: what `files()` names, what
    /// [`connection_problems`] reads, what `check` names for `[state.nats]`.
    pub fn files(&self) -> [(&'static str, Option<&std::path::Path>); 3] {
        [
            ("tls.ca_file", self.ca_file.as_deref()),
            ("tls.cert_file", self.cert_file.as_deref()),
            ("tls.key_file", self.key_file.as_deref()),
        ]
    }
}

/// `[sinks.stream]`: the JetStream stream the subjects belong to.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsStream {
    /// Stream name. Default `"KUBESINK"`.
    #[serde(default = "default_stream_name")]
    pub name: String,
    /// Create the stream at start-up when it does not exist (an existing stream is used as
    /// it is). Default `false`: a missing stream is a start-up error.
    #[serde(default)]
    pub create: bool,
    /// Subjects of a created stream. Default: the subject template with each placeholder
    /// replaced by `*`.
    #[serde(default)]
    pub subjects: Vec<String>,
    /// Storage of a created stream: `file` or `memory`. Default `file`.
    #[serde(default)]
    pub storage: NatsStorage,
    /// Maximum age of messages of a created stream; `0s` keeps them forever. Default `0s`.
    #[serde(default = "zero")]
    pub max_age: HumanDuration,
    /// Window in which a repeated `Nats-Msg-Id` is stored once. Default `2m`.
    #[serde(default = "default_duplicate_window")]
    pub duplicate_window: HumanDuration,
    /// Messages kept per subject; `1` keeps only the current state of each object.
    /// `-1` is unlimited. Default `-1`.
    #[serde(default = "default_max_msgs_per_subject")]
    pub max_msgs_per_subject: i64,
}

/// Stream storage type.
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum NatsStorage {
    /// On disk.
    #[default]
    File,
    /// In memory.
    Memory,
}

impl Default for NatsStream {
    fn default() -> Self {
        NatsStream {
            name: default_stream_name(),
            create: false,
            subjects: Vec::new(),
            storage: NatsStorage::File,
            max_age: zero(),
            duplicate_window: default_duplicate_window(),
            max_msgs_per_subject: default_max_msgs_per_subject(),
        }
    }
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            name: default_name(),
            filter: None,
            servers: default_servers(),
            connection_name: default_connection_name(),
            subject: default_subject(),
            mode: NatsMode::default(),
            format: Default::default(),
            publish_timeout: default_publish_timeout(),
            connect_timeout: default_publish_timeout(),
            max_in_flight: default_max_in_flight(),
            batches_in_flight: default_batches_in_flight(),
            client_capacity: default_client_capacity(),
            auth: NatsAuth::default(),
            tls: NatsTls::default(),
            stream: NatsStream::default(),
        }
    }
}

fn default_name() -> String {
    "nats".to_owned()
}
fn default_servers() -> Vec<String> {
    vec!["nats://127.0.0.1:4222".to_owned()]
}
fn default_connection_name() -> String {
    "kubesink".to_owned()
}
fn default_subject() -> String {
    DEFAULT_SUBJECT.to_owned()
}
fn default_publish_timeout() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn zero() -> HumanDuration {
    HumanDuration::from_secs(0)
}
fn default_max_in_flight() -> usize {
    256
}
fn default_batches_in_flight() -> usize {
    4
}
/// The largest `batches_in_flight`: more only splits the same backlog into smaller batches.
pub const MAX_BATCHES_IN_FLIGHT: usize = 64;
fn default_client_capacity() -> usize {
    1024
}
fn default_stream_name() -> String {
    "KUBESINK".to_owned()
}
fn default_duplicate_window() -> HumanDuration {
    HumanDuration::from_secs(120)
}
fn default_max_msgs_per_subject() -> i64 {
    -1
}

impl NatsAuth {
    /// The configured method's name, for messages (never the secret): `user/password`,
    /// `token`, `nkey`, `credentials file`, or `none`.
    pub fn method(&self) -> &'static str {
        match self {
            NatsAuth { user: Some(_), .. }
            | NatsAuth {
                password: Some(_), ..
            } => "user/password",
            NatsAuth { token: Some(_), .. } => "token",
            NatsAuth {
                nkey_seed: Some(_), ..
            } => "nkey",
            NatsAuth {
                credentials_file: Some(_),
                ..
            } => "credentials file",
            _ => "none",
        }
    }

    fn methods_set(&self) -> usize {
        [
            self.user.is_some() || self.password.is_some(),
            self.token.is_some(),
            self.nkey_seed.is_some(),
            self.credentials_file.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count()
    }
}

/// What every kubesink NATS connection (the sink's, the state store's) is made of besides
/// its servers, authentication and TLS.
#[derive(Clone, Copy, Debug)]
pub struct ClientSettings<'a> {
    /// Name used in logs (`sink` field).
    pub name: &'a str,
    /// Connection name shown by the server (`connz`).
    pub connection_name: &'a str,
    /// Bound on establishing a connection (TCP, TLS, auth).
    pub connect_timeout: std::time::Duration,
    /// Bound on one request (JetStream API calls, PubAck waits).
    pub request_timeout: std::time::Duration,
    /// Commands the client library may queue while disconnected.
    pub client_capacity: usize,
}

/// The problems of a NATS connection's settings serde cannot see, as `(key, message)` with
/// keys relative to the section (`servers`, `auth`, `auth.password`, `tls.key_file`): no or
/// invalid server URLs, more than one auth method, user without password, certificate
/// without key, and, when TLS is certain (`tls.required` or a `tls://` URL), a TLS file that
/// is there but holds no usable certificate or key (so `run` refuses it at start and `check`
/// names it, instead of a TLS failure at the first connection). Shared by the sink and the
/// `[state.nats]` store.
pub fn connection_problems(
    servers: &[String],
    auth: &NatsAuth,
    tls: &NatsTls,
) -> Vec<(&'static str, String)> {
    let mut errs = Vec::new();
    if servers.is_empty() {
        errs.push(("servers", "at least one server URL is needed".to_owned()));
    }
    for s in servers {
        if let Err(e) = s.parse::<async_nats::ServerAddr>() {
            errs.push((
                "servers",
                format!("invalid server URL {:?}: {e}", redact_url(s)),
            ));
        }
    }
    if auth.methods_set() > 1 {
        errs.push((
            "auth",
            "set at most one of user/password, token, nkey_seed, credentials_file".into(),
        ));
    }
    if auth.user.is_some() != auth.password.is_some() {
        errs.push(("auth.password", "user and password go together".into()));
    }
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        errs.push(("tls.key_file", "cert_file and key_file go together".into()));
    }
    // The files are read only when TLS is certain (`files()` uses the same rule): with
    // `nats://` URLs and no `tls.required`, a server that does not demand TLS never has
    // them read.
    if tls_certain(servers, tls) {
        for (key, path) in tls.files() {
            let what = if key == "tls.key_file" {
                PemContent::PrivateKey
            } else {
                PemContent::Certificates
            };
            if let Some(problem) = path.and_then(|p| pem_problem(p, what)) {
                errs.push((key, problem));
            }
        }
    }
    errs
}

/// What a TLS file must hold.
#[derive(Clone, Copy)]
enum PemContent {
    /// At least one `CERTIFICATE` block (a CA bundle, a client certificate chain).
    Certificates,
    /// A private key (PKCS#8, PKCS#1 or SEC1).
    PrivateKey,
}

/// Why a TLS file that is there cannot be used, as far as its PEM shows: read with the
/// functions async-nats 0.51 reads it with when a connection upgrades to TLS (`tls.rs`:
/// `CertificateDer::pem_reader_iter`, `PrivateKeyDer::from_pem_reader`), so a file that is
/// not PEM, is cut short, or holds no certificate (no private key) is found. What the PEM
/// blocks hold (a certificate's DER, a key that matches its certificate) is checked by
/// rustls at the first connection only. `None` when the PEM is usable, or when the file is
/// not there (a missing file is named by `files()`, often mounted only where kubesink
/// runs). A CA file without a certificate is a problem although async-nats accepts it: every
/// handshake then fails.
fn pem_problem(path: &std::path::Path, what: PemContent) -> Option<String> {
    use async_nats::rustls::pki_types::pem::PemObject;
    use async_nats::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("{} cannot be read: {e}", path.display())),
    };
    let mut reader = std::io::BufReader::new(file);
    let problem = match what {
        PemContent::Certificates => {
            match CertificateDer::pem_reader_iter(&mut reader).collect::<Result<Vec<_>, _>>() {
                Ok(certs) if certs.is_empty() => "holds no PEM CERTIFICATE block".to_owned(),
                Ok(_) => return None,
                Err(e) => format!("is not a PEM certificate file: {e}"),
            }
        }
        PemContent::PrivateKey => match PrivateKeyDer::from_pem_reader(&mut reader) {
            Ok(_) => return None,
            Err(async_nats::rustls::pki_types::pem::Error::NoItemsFound) => {
                "holds no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
                    .to_owned()
            }
            Err(e) => format!("is not a PEM private key file: {e}"),
        },
    };
    Some(format!("{} {problem}", path.display()))
}

/// Whether TLS is certain for a connection, so its TLS files are read: `tls.required`, or
/// a server URL that guarantees it ([`tls_url`]). Otherwise they are read only if a server
/// demands TLS. Shared by the sink's and `[state.nats]`'s file checks.
pub fn tls_certain(servers: &[String], tls: &NatsTls) -> bool {
    tls.required || servers.iter().any(|s| tls_url(s))
}

/// Whether a server URL guarantees TLS: the `tls://` scheme (or `wss://`). `nats://`, and a
/// bare `host:port`, use TLS only when the server demands it (or `tls.required` is set); a
/// `tls.ca_file` or client certificate alone does not turn it on (async-nats upgrades only
/// on `tls_required` or a `tls://` URL).
fn tls_url(server: &str) -> bool {
    let lower = server.trim().to_ascii_lowercase();
    lower.starts_with("tls://") || lower.starts_with("wss://")
}

/// Whether a server URL carries credentials in its user info (`nats://user:pass@host`,
/// `nats://token@host`).
fn url_has_credentials(server: &str) -> bool {
    let rest = server.split_once("://").map_or(server, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    authority.contains('@')
}

/// The credentials of a NATS connection that may cross the network without TLS, as
/// `(key, message)` with keys relative to the section (`auth.token`, `servers`), for the
/// warnings of `kubesink check` and the start-up log. TLS is guaranteed by `tls.required =
/// true` or by `tls://` URLs only; with any other server in the list, every configured
/// credential (user/password, token, NKey, credentials file, user info in a URL) is named.
/// Shared by the sink and the `[state.nats]` store. Never includes a secret.
pub fn plaintext_credentials(
    servers: &[String],
    auth: &NatsAuth,
    tls: &NatsTls,
) -> Vec<(&'static str, String)> {
    if tls.required {
        return Vec::new();
    }
    let plain: Vec<&String> = servers.iter().filter(|s| !tls_url(s)).collect();
    if plain.is_empty() {
        return Vec::new();
    }
    let to = plain
        .iter()
        .map(|s| redact_url(s))
        .collect::<Vec<_>>()
        .join(",");
    let fix = "use tls:// URLs or set tls.required = true outside a trusted network";
    let mut out = Vec::new();
    let mut warn = |key: &'static str, what: &str| {
        out.push((
            key,
            format!("{what} without TLS to {to} (unless the server itself demands TLS); {fix}"),
        ))
    };
    if auth.password.is_some() || auth.user.is_some() {
        warn("auth.password", "the user's password is sent");
    }
    if auth.token.is_some() {
        warn("auth.token", "the token is sent");
    }
    if auth.nkey_seed.is_some() {
        warn(
            "auth.nkey_seed",
            "NKey authentication (public key and signed nonce) and the session it opens go",
        );
    }
    if auth.credentials_file.is_some() {
        warn(
            "auth.credentials_file",
            "the credentials file's user JWT and signed nonce, and the session they open, go",
        );
    }
    if plain.iter().any(|s| url_has_credentials(s)) {
        warn(
            "servers",
            "the user info of a server URL (user/password or token) is sent",
        );
    }
    out
}

/// The parsed server addresses (invalid ones left out: [`connection_problems`] reports them).
pub fn server_addrs(servers: &[String]) -> Vec<ServerAddr> {
    servers
        .iter()
        .filter_map(|s| s.parse::<ServerAddr>().ok())
        .collect()
}

/// The server list for messages: URLs joined by `,`, user info removed.
pub fn servers_text(servers: &[String]) -> String {
    servers
        .iter()
        .map(|s| redact_url(s))
        .collect::<Vec<_>>()
        .join(",")
}

/// The client options of a kubesink NATS connection: the shared base (name, timeouts,
/// bounded client buffer, reconnect forever, connection events logged) with `auth` and `tls`
/// applied (<https://docs.nats.io/using-nats/developer/connecting>).
///
/// # Errors
/// [`NatsError::File`] when the credentials file cannot be read.
pub async fn client_options(
    c: &ClientSettings<'_>,
    auth: &NatsAuth,
    tls: &NatsTls,
    watch: &connection::ConnectionWatch,
) -> Result<async_nats::ConnectOptions, NatsError> {
    let mut opts = connection::base_options(
        c.name,
        c.connection_name,
        c.connect_timeout,
        c.request_timeout,
        c.client_capacity,
        watch,
    )
    .require_tls(tls.required);
    if let (Some(user), Some(pass)) = (&auth.user, &auth.password) {
        opts = opts.user_and_password(user.clone(), pass.expose().to_owned());
    }
    if let Some(token) = &auth.token {
        opts = opts.token(token.expose().to_owned());
    }
    if let Some(seed) = &auth.nkey_seed {
        opts = opts.nkey(seed.expose().to_owned());
    }
    if let Some(path) = &auth.credentials_file {
        opts = opts
            .credentials_file(path)
            .await
            .map_err(|source| NatsError::File {
                key: "auth.credentials_file",
                path: path.display().to_string(),
                // async-nats says "loading creds file 'PATH': CAUSE": the path is said once.
                source: {
                    let text = source.to_string();
                    let cause = text
                        .split_once("': ")
                        .map_or_else(|| text.clone(), |(_, cause)| cause.to_owned());
                    std::io::Error::new(source.kind(), cause)
                },
            })?;
    }
    if let Some(ca) = &tls.ca_file {
        opts = opts.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        opts = opts.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(opts)
}

impl NatsConfig {
    /// The stream subjects a created stream gets: `stream.subjects`, or the template with
    /// each placeholder token replaced by `*`.
    pub fn stream_subjects(&self) -> Vec<String> {
        if !self.stream.subjects.is_empty() {
            return self.stream.subjects.clone();
        }
        subject_template(&self.subject)
            .map(|t| vec![t.pattern("*")])
            .unwrap_or_default()
    }

    /// The server list for messages: URLs joined by `,`, user info removed.
    fn servers_text(&self) -> String {
        servers_text(&self.servers)
    }

    /// The service settings: connection options with auth and TLS, the publishing mode and
    /// its stream setup.
    async fn settings(&self) -> Result<Settings, NatsError> {
        let watch = connection::ConnectionWatch::new(&self.name);
        let opts = client_options(
            &ClientSettings {
                name: &self.name,
                connection_name: &self.connection_name,
                connect_timeout: self.connect_timeout.get(),
                request_timeout: self.publish_timeout.get(),
                client_capacity: self.client_capacity,
            },
            &self.auth,
            &self.tls,
            &watch,
        )
        .await?;
        let s = &self.stream;
        let mode = match self.mode {
            NatsMode::Core => Mode::Core,
            NatsMode::Jetstream if s.create => {
                Mode::JetStream(StreamSetup::Create(Box::new(stream::Config {
                    name: s.name.clone(),
                    subjects: self.stream_subjects(),
                    storage: match s.storage {
                        NatsStorage::File => stream::StorageType::File,
                        NatsStorage::Memory => stream::StorageType::Memory,
                    },
                    max_age: s.max_age.get(),
                    duplicate_window: s.duplicate_window.get(),
                    max_messages_per_subject: s.max_msgs_per_subject,
                    ..Default::default()
                })))
            }
            NatsMode::Jetstream => Mode::JetStream(StreamSetup::Require {
                name: s.name.clone(),
                subjects: self.stream_subjects(),
            }),
        };
        Ok(Settings {
            sink: self.name.clone(),
            servers: server_addrs(&self.servers),
            servers_text: self.servers_text(),
            auth_method: self.auth.method(),
            options: opts,
            mode,
            publish_timeout: self.publish_timeout.get(),
            max_in_flight: self.max_in_flight,
            watch,
        })
    }

    /// [`Destination::build`] returning the concrete sink (tests, benches).
    ///
    /// # Errors
    /// As [`Destination::build`].
    pub async fn build_sink(&self, index: usize) -> Result<NatsSink, SinkConfigError> {
        if let Some(e) = self.validate(index).into_iter().next() {
            return Err(e);
        }
        let invalid = |e: NatsError| {
            let key = e.config_key();
            // The entry's key is said once (the error's own text may start with it).
            let text = e.to_string();
            let message = text
                .strip_prefix(&format!("{key}: "))
                .map_or_else(|| text.clone(), str::to_owned);
            SinkConfigError::Invalid {
                index,
                name: self.name.clone(),
                key: key.to_owned(),
                message,
            }
        };
        let subjects = subject_template(&self.subject).map_err(|e| invalid(e.into()))?;
        let service = NatsService::connect(self.settings().await.map_err(invalid)?)
            .await
            .map_err(invalid)?;
        if service.is_connected() {
            tracing::info!(
                sink = %self.name,
                servers = %self.servers_text(),
                mode = ?self.mode,
                max_payload = service.max_payload(),
                "NATS sink ready"
            );
        } else {
            // Never "ready" while nothing is connected.
            tracing::info!(
                sink = %self.name,
                servers = %self.servers_text(),
                mode = ?self.mode,
                "NATS sink started, not connected: connecting in the background (/readyz says when it is ready)"
            );
        }
        Ok(NatsSink::new(
            self.name.clone(),
            subjects,
            self.format,
            service,
            self.batches_in_flight,
        ))
    }
}

/// The registration of `type = "nats"` (listed in the bridge's `src/sinks.rs`).
#[async_trait]
impl Destination for NatsConfig {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn filter(&self) -> Option<&str> {
        self.filter.as_deref()
    }

    fn reference_example() -> Self {
        let mut n = NatsConfig::default();
        n.auth.user = Some("u".into());
        n.auth.password = Some(Secret::new("p"));
        n.auth.token = Some(Secret::new("t"));
        n.auth.nkey_seed = Some(Secret::new("s"));
        n.auth.credentials_file = Some("/c".into());
        n.tls.ca_file = Some("/ca".into());
        n.tls.cert_file = Some("/cert".into());
        n.tls.key_file = Some("/key".into());
        n.stream.subjects = vec!["a.>".into()];
        n.filter = Some(r#"ns == "payments""#.into());
        n
    }

    /// Problems serde cannot see, every one found. `index` is the entry's position.
    fn validate(&self, index: usize) -> Vec<SinkConfigError> {
        let mut errs = Vec::new();
        let mut bad = |key: &str, message: String| {
            errs.push(SinkConfigError::Invalid {
                index,
                name: self.name.clone(),
                key: key.to_owned(),
                message,
            })
        };
        let (servers, auth_tls): (Vec<_>, Vec<_>) =
            connection_problems(&self.servers, &self.auth, &self.tls)
                .into_iter()
                .partition(|(key, _)| *key == "servers");
        for (key, message) in servers {
            bad(key, message);
        }
        if let Err(e) = subject_template(&self.subject) {
            bad("subject", e.to_string());
        }
        if self.publish_timeout.get().is_zero() {
            bad("publish_timeout", "must be greater than 0".into());
        }
        if self.connect_timeout.get().is_zero() {
            bad("connect_timeout", "must be greater than 0".into());
        }
        if self.max_in_flight == 0 {
            bad("max_in_flight", "must be at least 1".into());
        }
        if !(1..=MAX_BATCHES_IN_FLIGHT).contains(&self.batches_in_flight) {
            bad(
                "batches_in_flight",
                format!(
                    "must be from 1 to {MAX_BATCHES_IN_FLIGHT}, found {}",
                    self.batches_in_flight
                ),
            );
        }
        if self.client_capacity == 0 {
            bad("client_capacity", "must be at least 1".into());
        }
        for (key, message) in auth_tls {
            bad(key, message);
        }
        if self.mode == NatsMode::Jetstream {
            if self.stream.name.is_empty()
                || self
                    .stream
                    .name
                    .contains(|c: char| c == '.' || c == '*' || c == '>' || c.is_whitespace())
            {
                bad(
                    "stream.name",
                    format!(
                        "invalid stream name {:?}: must be non-empty without '.', '*', '>' or whitespace",
                        self.stream.name
                    ),
                );
            }
            if self.stream.max_msgs_per_subject == 0 || self.stream.max_msgs_per_subject < -1 {
                bad(
                    "stream.max_msgs_per_subject",
                    "must be -1 (unlimited) or at least 1".into(),
                );
            }
        }
        errs
    }

    /// `auth.credentials_file`, read when the sink is built, and the `tls.*` files when TLS
    /// is certainly used (`tls.required`, or a `tls://` server): a missing one stops `run`.
    /// With neither, they are read only if a server demands TLS, so they are not named:
    /// `check` must not say "run refuses to start without it" of files `run` never reads.
    fn files(&self) -> Vec<(String, std::path::PathBuf)> {
        let mut files = vec![(
            "auth.credentials_file",
            self.auth.credentials_file.as_deref(),
        )];
        if tls_certain(&self.servers, &self.tls) {
            files.extend(self.tls.files());
        }
        files
            .into_iter()
            .filter_map(|(key, p)| p.map(|p| (key.to_owned(), p.to_path_buf())))
            .collect()
    }

    /// Settings that work but weaken security, one sentence each naming the entry and key:
    /// every credential that may go without TLS ([`plaintext_credentials`]). TLS verification
    /// itself cannot be turned off.
    fn warnings(&self, index: usize) -> Vec<String> {
        plaintext_credentials(&self.servers, &self.auth, &self.tls)
            .into_iter()
            .map(|(key, message)| format!("sinks[{index}] ({}): {key}: {message}", self.name))
            .collect()
    }

    /// Connects (one attempt per server, bounded by `connect_timeout`), and in JetStream mode
    /// checks the stream exists or creates it (`stream.create`).
    ///
    /// # Errors
    /// A [`SinkConfigError`] naming the servers, the auth method (never the secret) and what
    /// failed: invalid settings, unreachable servers, rejected credentials, TLS, a missing
    /// stream.
    async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        Ok(Arc::new(self.build_sink(index).await?))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    // This crate has no TOML parser; these tests write the equivalent JSON (the TOML
    // forms are tested in the root crate: config/examples/nats.toml, config/kubesink.toml).
    fn parse(json: &str) -> NatsConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_are_jetstream_one_subject_per_object() {
        let c = parse("{}");
        assert_eq!(c, NatsConfig::default());
        assert_eq!(c.mode, NatsMode::Jetstream);
        assert_eq!(c.stream_subjects(), vec!["kubesink.*.*.*.*.*".to_owned()]);
        assert!(c.validate(0).is_empty());
    }

    #[test]
    fn durations_parse_as_text_with_a_unit() {
        let c = parse(
            r#"{"publish_timeout": "250ms", "connect_timeout": "1500ms", "stream": {"max_age": "1h"}}"#,
        );
        assert_eq!(c.publish_timeout.get(), Duration::from_millis(250));
        assert_eq!(c.connect_timeout.get(), Duration::from_millis(1500));
        assert_eq!(c.stream.max_age.get(), Duration::from_secs(3600));
    }

    #[test]
    fn validation_reports_every_problem() {
        let c = parse(
            r#"{"servers": ["nats://a b"], "subject": "x.{nope}", "max_in_flight": 0,
                "batches_in_flight": 0,
                "auth": {"user": "u", "token": "t"}, "tls": {"cert_file": "c"},
                "stream": {"max_msgs_per_subject": 0}}"#,
        );
        let keys: Vec<String> = c
            .validate(2)
            .into_iter()
            .map(|SinkConfigError::Invalid { key, .. }| key)
            .collect();
        assert_eq!(
            keys,
            [
                "servers",
                "subject",
                "max_in_flight",
                "batches_in_flight",
                "auth",
                "auth.password",
                "tls.key_file",
                "stream.max_msgs_per_subject"
            ]
        );
    }

    #[test]
    fn tls_files_that_are_there_but_unusable_are_named_when_tls_is_certain() {
        let dir = std::env::temp_dir().join(format!("kubesink-nats-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let cert = "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n";
        let key = "-----BEGIN PRIVATE KEY-----\nMC4CAQA=\n-----END PRIVATE KEY-----\n";
        let garbage = write("garbage.pem", "not PEM at all\n");
        let cut = write("cut.pem", "-----BEGIN CERTIFICATE-----\nMIIBAA==\n");
        let cert_only = write("cert.pem", cert);
        let key_only = write("key.pem", key);
        let problems = |servers: &str, required: bool, ca: &str, cert: &str, key: &str| {
            let c = parse(&format!(
                r#"{{"servers": [{servers:?}], "tls": {{"ca_file": {ca:?}, "cert_file": {cert:?}, "key_file": {key:?}, "required": {required}}}}}"#
            ));
            connection_problems(&c.servers, &c.auth, &c.tls)
        };
        let found = problems("tls://h:4222", false, &garbage, &cut, &cert_only);
        let keys: Vec<&str> = found.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            ["tls.ca_file", "tls.cert_file", "tls.key_file"],
            "{found:?}"
        );
        assert!(
            found[0].1 == format!("{garbage} holds no PEM CERTIFICATE block"),
            "{found:?}"
        );
        assert!(
            found[1]
                .1
                .starts_with(&format!("{cut} is not a PEM certificate file: ")),
            "{found:?}"
        );
        assert!(
            found[2]
                .1
                .starts_with(&format!("{cert_only} holds no PEM private key")),
            "{found:?}"
        );
        // tls.required makes TLS certain with a nats:// server too.
        let found = problems("nats://h", true, &garbage, &cert_only, &key_only);
        assert_eq!(
            found.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ["tls.ca_file"],
            "{found:?}"
        );
        // Usable files, a missing one (named elsewhere, as a warning), TLS not certain.
        assert_eq!(
            problems("nats://h", true, &cert_only, &cert_only, &key_only),
            []
        );
        assert_eq!(
            problems(
                "nats://h",
                true,
                "/nonexistent/ca.pem",
                &cert_only,
                &key_only
            ),
            []
        );
        assert_eq!(problems("nats://h", false, &garbage, &cut, &cert_only), []);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn batches_in_flight_defaults_to_4_and_takes_1_to_64() {
        assert_eq!(parse("{}").batches_in_flight, 4);
        let problems = |n: usize| {
            parse(&format!(r#"{{"batches_in_flight": {n}}}"#))
                .validate(0)
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
        };
        assert!(problems(1).is_empty());
        assert!(problems(64).is_empty());
        for n in [0, 65] {
            let p = problems(n);
            assert_eq!(p.len(), 1, "{p:?}");
            assert!(
                p[0].contains("batches_in_flight") && p[0].contains(&format!("found {n}")),
                "{p:?}"
            );
        }
    }

    #[test]
    fn every_credential_without_tls_is_warned_about_naming_its_key() {
        let warnings = |json: &str| parse(json).warnings(3);
        for (json, key) in [
            (r#"{"auth": {"token": "t"}}"#, "auth.token"),
            (
                r#"{"auth": {"user": "u", "password": "p"}}"#,
                "auth.password",
            ),
            (r#"{"auth": {"nkey_seed": "SU"}}"#, "auth.nkey_seed"),
            (
                r#"{"auth": {"credentials_file": "/c"}, "tls": {"ca_file": "/ca"}}"#,
                "auth.credentials_file",
            ),
            (r#"{"servers": ["nats://u:p@h:4222"]}"#, "servers"),
            (r#"{"servers": ["tok@h:4222"]}"#, "servers"),
            (
                r#"{"servers": ["tls://a:4222", "nats://b:4222"], "auth": {"token": "t"}}"#,
                "auth.token",
            ),
        ] {
            let w = warnings(json);
            assert_eq!(w.len(), 1, "{json}: {w:?}");
            assert!(
                w[0].starts_with(&format!("sinks[3] (nats): {key}: ")) && w[0].contains("TLS"),
                "{json}: {w:?}"
            );
            assert!(!w[0].contains(":p@") && !w[0].contains("tok@"), "{w:?}");
        }
        assert!(
            warnings(r#"{"servers": ["tls://a:4222", "nats://b:4222"], "auth": {"token": "t"}}"#)
                [0]
            .contains("nats://b:4222"),
            "names the plaintext server"
        );
        for json in [
            "{}",
            r#"{"servers": ["tls://h:4222"], "auth": {"token": "t"}}"#,
            r#"{"servers": ["TLS://h:4222", "tls://u:p@i:4222"]}"#,
            r#"{"auth": {"user": "u", "password": "p"}, "tls": {"required": true}}"#,
        ] {
            assert_eq!(warnings(json), Vec::<String>::new(), "{json}");
        }
    }

    #[test]
    fn secrets_never_appear_in_debug_or_serialized_form() {
        let c = parse(r#"{"auth": {"user": "u", "password": "hunter2"}}"#);
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!serde_json::to_string(&c).unwrap().contains("hunter2"));
        assert_eq!(c.auth.method(), "user/password");
    }
}
