//! `[[sinks]]` entry with `type = "kafka"`: the serde configuration, its validation, its
//! rendering into librdkafka properties and `build()`.
//!
//! Owns the mapping from kubesink's option names to librdkafka's (`CONFIGURATION.md` of
//! librdkafka): every property kubesink sets is listed in [`MANAGED_PROPERTIES`], and the
//! `librdkafka` passthrough map may not set any of them. Must never log a secret: the
//! rendered properties are only ever printed through [`Properties::redacted`], and the
//! passthrough map ([`Passthrough`]) prints a credential property's inline value as `***`
//! in `Debug` and `Serialize` (what `kubesink check` shows), an `{ env }`/`{ file }`
//! reference as itself.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use kubesink_core::units::HumanDuration;
use kubesink_core::{Destination, Secret, Sink, SinkConfigError};
use serde::{Deserialize, Serialize};

use crate::errors::describe_error;
use crate::properties::{is_secret_property, refused_properties, Properties};
use crate::request::topic_template;
use crate::service::{KafkaService, Settings};
use crate::KafkaSink;

/// Kafka sink configuration (`[[sinks]]` with `type = "kafka"`).
///
/// Defaults give the delivery guarantees of `docs/kafka.md`: the idempotent producer with
/// `acks = all`, record key = message key, tombstones after deletes.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Name used in logs; unique among sinks. Default `"kafka"`.
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
    /// Comma-separated `host:port` list (librdkafka `bootstrap.servers`). Required.
    #[serde(default)]
    pub bootstrap_servers: String,
    /// Topic name template. Placeholders: `{cluster}`, `{group}` (`core` for the core
    /// group), `{version}`, `{kind}`, `{resource}`, `{namespace}` (`_cluster` for
    /// cluster-scoped objects). A substituted character outside `[A-Za-z0-9._-]` becomes `_`;
    /// the literal text must use only those characters. Default `"kubesink.{cluster}"`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// `compression.type`: `none`, `gzip`, `snappy`, `lz4` or `zstd`. Default `lz4`.
    #[serde(default)]
    pub compression: Compression,
    /// `acks`: `all` (every in-sync replica), `1` (the leader) or `0` (none: a batch is
    /// confirmed once written to the socket). Default `all`; `idempotence` requires `all`.
    #[serde(default)]
    pub acks: Acks,
    /// `enable.idempotence`: retries neither duplicate nor reorder records within a
    /// partition. Default `true`.
    #[serde(default = "yes")]
    pub idempotence: bool,
    /// After a `deleted` message, also send a tombstone (same key, null value), so a
    /// compacted topic holds exactly the live objects. Default `true`.
    #[serde(default = "yes")]
    pub tombstones: bool,
    /// How each message is written: `"json"` (the topology message v1 as the value),
    /// `"cloudevents"` (CloudEvents binary content mode: the same value plus `ce_` headers)
    /// or `"cloudevents-structured"` (the value is a CloudEvents JSON envelope whose `data`
    /// is the message; `content-type: application/cloudevents+json`). See
    /// `docs/message-contract.md#cloudevents`. Default `"json"`.
    #[serde(default)]
    pub format: kubesink_core::message::Format,
    /// `linger.ms`: how long librdkafka waits to fill a produce request (millisecond
    /// resolution). Default `5ms`.
    #[serde(default = "default_linger")]
    pub linger: HumanDuration,
    /// `message.timeout.ms`: how long librdkafka retries one record before reporting it
    /// failed (the pipeline then retries it again; millisecond resolution). Default `60s`.
    #[serde(default = "default_message_timeout")]
    pub message_timeout: HumanDuration,
    /// `message.max.bytes`: the largest record librdkafka sends, in bytes. Payloads larger
    /// than this minus the key and headers go through the shared oversize policy. Keep it at
    /// or below the topic's `max.message.bytes`. Default 1000000.
    #[serde(default = "default_message_max_bytes")]
    pub message_max_bytes: usize,
    /// `queue.buffering.max.messages`: records librdkafka holds in memory. When it is full,
    /// `send` waits for deliveries to drain (backpressure). Default 100000.
    #[serde(default = "default_queue_max_messages")]
    pub queue_max_messages: usize,
    /// At shutdown, how long `close` waits for librdkafka to deliver what it holds.
    /// Default `30s`.
    #[serde(default = "default_flush_timeout")]
    pub flush_timeout: HumanDuration,
    /// Timeout of the healthcheck's metadata request. Default `10s`.
    #[serde(default = "default_healthcheck_timeout")]
    pub healthcheck_timeout: HumanDuration,
    /// Transport security and authentication (boxed: it is large and usually default).
    #[serde(default)]
    pub security: Box<KafkaSecurity>,
    /// Any other librdkafka property, passed through as is (`"socket.keepalive.enable" =
    /// "true"`). A property kubesink manages is a configuration error. Values of credential
    /// properties ([`is_secret_property`]) are never printed. Unless set here, kubesink sets
    /// `reconnect.backoff.max.ms = 1000` and `statistics.interval.ms = 1000` (the producer's
    /// epoch, to notice a broker that lost its producer id; `"0"` turns that off).
    #[serde(default)]
    pub librdkafka: Passthrough,
}

/// The `librdkafka` passthrough map: property → value. A value is a string, or, like every
/// credential of the configuration, `{ env = "NAME" }` or `{ file = "PATH" }` (read when the
/// configuration loads: [`Secret`]). `Debug` and `Serialize` print a reference as itself (so
/// the printed configuration loads again with the same secret), a credential property's
/// ([`is_secret_property`]) inline value as `***` (refused as a value, so a printed
/// configuration fed back names the property to fill in), and any other value as it is.
/// [`Deref`](std::ops::Deref) gives the resolved values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Passthrough {
    values: BTreeMap<String, String>,
    /// Where each value came from, for printing.
    origins: BTreeMap<String, Secret>,
}

impl Passthrough {
    /// Each property as printed: a reference as itself, a credential's inline value masked.
    fn printed(&self) -> BTreeMap<&str, Printed<'_>> {
        self.origins
            .iter()
            .map(|(k, v)| {
                let printed = if !v.is_inline() || is_secret_property(k) {
                    Printed::Secret(v)
                } else {
                    Printed::Plain(v.expose())
                };
                (k.as_str(), printed)
            })
            .collect()
    }
}

/// One passthrough value as printed.
#[derive(Serialize)]
#[serde(untagged)]
enum Printed<'a> {
    Plain(&'a str),
    Secret(&'a Secret),
}

impl std::fmt::Debug for Printed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Printed::Plain(v) => write!(f, "{v:?}"),
            Printed::Secret(s) => write!(f, "{s:?}"),
        }
    }
}

impl std::ops::Deref for Passthrough {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.values
    }
}

impl From<BTreeMap<String, String>> for Passthrough {
    fn from(m: BTreeMap<String, String>) -> Self {
        let origins = m
            .iter()
            .map(|(k, v)| (k.clone(), Secret::new(v.clone())))
            .collect();
        Passthrough { values: m, origins }
    }
}

impl Passthrough {
    /// Sets one property to a value written inline.
    pub fn insert(&mut self, property: String, value: String) {
        self.origins
            .insert(property.clone(), Secret::new(value.clone()));
        self.values.insert(property, value);
    }
}

impl std::fmt::Debug for Passthrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.printed()).finish()
    }
}

impl Serialize for Passthrough {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.printed().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Passthrough {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let origins = BTreeMap::<String, Secret>::deserialize(d)?;
        let values = origins
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_owned()))
            .collect();
        Ok(Passthrough { values, origins })
    }
}

impl schemars::JsonSchema for Passthrough {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LibrdkafkaProperties".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let value = generator.subschema_for::<Secret>();
        schemars::json_schema!({
            "description": "librdkafka properties passed through as they are (librdkafka CONFIGURATION.md): property = value, a value being a string, { env = \"NAME\" } or { file = \"PATH\" }.",
            "type": "object",
            "additionalProperties": value
        })
    }
}

/// `reconnect.backoff.max.ms` unless the passthrough map sets it: librdkafka's default is
/// 10 s, so a broker that comes back would be used again only up to 10 s later.
pub const DEFAULT_RECONNECT_BACKOFF_MAX_MS: &str = "1000";

/// `topic.metadata.propagation.max.ms` unless the passthrough map sets it: how long
/// librdkafka waits for a topic it does not see before it fails the records to it as
/// `UNKNOWN_TOPIC` (librdkafka CONFIGURATION.md; its default, 30 s, would keep a sink whose
/// topic is missing "ready" and silent for 30 s). 5 s is several times a
/// topic's usual propagation after its creation; a slower one costs one retry, as the sink
/// then looks for the topic itself (`service.rs`, `TOPIC_POLL`: 1 s doubling to 5 s).
pub const DEFAULT_TOPIC_PROPAGATION_MAX_MS: &str = "5000";

/// `statistics.interval.ms` unless the passthrough map sets it: the sink reads the
/// idempotent producer's epoch from librdkafka's statistics to notice a broker that keeps
/// rejecting its producer id (`rebuild.rs`). `"0"` in the passthrough map turns that off
/// (a wedged producer is then replaced after a message timeout only).
pub const DEFAULT_STATISTICS_INTERVAL_MS: &str = "1000";

/// `[sinks.security]` of a Kafka sink.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSecurity {
    /// `security.protocol`: `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`. Default
    /// `plaintext`.
    #[serde(default)]
    pub protocol: Protocol,
    /// `sasl.mechanism`: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`. Required with a
    /// `sasl_*` protocol.
    #[serde(default)]
    pub sasl_mechanism: Option<SaslMechanism>,
    /// `sasl.username`. Required with a `sasl_*` protocol.
    #[serde(default)]
    pub sasl_username: Option<String>,
    /// `sasl.password`; never logged. Required with a `sasl_*` protocol.
    #[serde(default)]
    pub sasl_password: Option<Secret>,
    /// `ssl.ca.location`: PEM file of the CA that signed the brokers' certificates.
    /// Default: the system's CA store.
    #[serde(default)]
    pub ssl_ca_location: Option<String>,
    /// `ssl.certificate.location`: PEM client certificate (mutual TLS).
    #[serde(default)]
    pub ssl_certificate_location: Option<String>,
    /// `ssl.key.location`: PEM private key of the client certificate.
    #[serde(default)]
    pub ssl_key_location: Option<String>,
    /// `ssl.key.password`: the private key's passphrase; never logged.
    #[serde(default)]
    pub ssl_key_password: Option<Secret>,
}

impl KafkaSecurity {
    /// Whether the protocol is `ssl` or `sasl_ssl`: librdkafka reads the TLS files only then.
    pub fn uses_tls(&self) -> bool {
        matches!(self.protocol, Protocol::Ssl | Protocol::SaslSsl)
    }
}

/// Why librdkafka cannot use the TLS files of `s` that are there, as `(key, message)` with
/// keys relative to the entry (`security.ssl_ca_location`, ...): librdkafka reads them when
/// the producer is created, so `run` refuses them at start; found here by creating a producer
/// with each (the CA file alone, the certificate with its key and passphrase; no
/// connection is made). Only with `ssl` or `sasl_ssl`, as librdkafka reads them only then;
/// a file that is not there is named by `files()` instead.
pub fn tls_file_problems(s: &KafkaSecurity) -> Vec<(&'static str, String)> {
    use rdkafka::error::KafkaError;
    if !s.uses_tls() {
        return Vec::new();
    }
    let present = |p: &Option<String>| {
        p.clone()
            .filter(|p| std::path::Path::new(p.as_str()).is_file())
    };
    let refused = |properties: &[(&str, String)]| {
        let mut c = rdkafka::ClientConfig::new();
        // Its log would say "No bootstrap.servers configured" at every start: the error
        // returned is what counts.
        c.set_log_level(rdkafka::config::RDKafkaLogLevel::Emerg);
        c.set("security.protocol", "ssl");
        for (k, v) in properties {
            c.set(*k, v.as_str());
        }
        match c.create::<rdkafka::producer::BaseProducer>() {
            Ok(_) => None,
            Err(KafkaError::ClientCreation(text)) => Some(text),
            Err(e) => Some(e.to_string()),
        }
    };
    let mut problems = Vec::new();
    if let Some(ca) = present(&s.ssl_ca_location) {
        if let Some(text) = refused(&[("ssl.ca.location", ca.clone())]) {
            problems.push((
                "security.ssl_ca_location",
                format!("librdkafka cannot use {ca}: {text}"),
            ));
        }
    }
    if let (Some(cert), Some(key)) = (
        present(&s.ssl_certificate_location),
        present(&s.ssl_key_location),
    ) {
        let mut properties = vec![
            ("ssl.certificate.location", cert.clone()),
            ("ssl.key.location", key.clone()),
        ];
        if let Some(pw) = &s.ssl_key_password {
            properties.push(("ssl.key.password", pw.expose().to_owned()));
        }
        if let Some(text) = refused(&properties) {
            // librdkafka names the property it failed on ("ssl.certificate.location failed:
            // ..."); a pair that loads but does not match ("Private key check failed") is the
            // key's finding. Its text never holds the passphrase (OpenSSL's reasons only).
            let (at, file) = if text.starts_with("ssl.certificate.location") {
                ("security.ssl_certificate_location", cert)
            } else {
                ("security.ssl_key_location", key)
            };
            problems.push((at, format!("librdkafka cannot use {file}: {text}")));
        }
    }
    problems
}

/// `compression.type`.
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// No compression.
    None,
    /// gzip.
    Gzip,
    /// Snappy.
    Snappy,
    /// LZ4 (the default).
    #[default]
    Lz4,
    /// Zstandard.
    Zstd,
}

/// `acks`: `"all"`, `"1"` or `"0"`; also as librdkafka's `acks` takes it, a number, with
/// `-1` for all (librdkafka CONFIGURATION.md, `request.required.acks`).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub enum Acks {
    /// Every in-sync replica (the default).
    #[default]
    #[serde(rename = "all")]
    All,
    /// The partition leader only.
    #[serde(rename = "1")]
    Leader,
    /// No acknowledgement.
    #[serde(rename = "0")]
    None,
}

/// `acks`'s JSON Schema: `"all"`, `"1"` or `"0"`, or librdkafka's numbers.
impl schemars::JsonSchema for Acks {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Acks".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "\"all\" (every in-sync replica), \"1\" (the leader) or \"0\" (none); also -1, 1 or 0.",
            "anyOf": [
                { "type": "string", "enum": ["all", "1", "0", "-1"] },
                { "type": "integer", "enum": [-1, 1, 0] }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for Acks {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Acks;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"all\", \"1\" or \"0\" (or -1, 1, 0)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Acks, E> {
                match v.trim() {
                    "all" | "-1" => Ok(Acks::All),
                    "1" => Ok(Acks::Leader),
                    "0" => Ok(Acks::None),
                    _ => Err(E::unknown_variant(v, &["all", "1", "0"])),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Acks, E> {
                match v {
                    -1 => Ok(Acks::All),
                    1 => Ok(Acks::Leader),
                    0 => Ok(Acks::None),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Signed(v), &self)),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Acks, E> {
                match v {
                    1 => Ok(Acks::Leader),
                    0 => Ok(Acks::None),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Unsigned(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `security.protocol`.
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// No TLS, no SASL (the default).
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL without TLS.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

/// `sasl.mechanism`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub enum SaslMechanism {
    /// `PLAIN`.
    #[serde(rename = "PLAIN")]
    Plain,
    /// `SCRAM-SHA-256`.
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// `SCRAM-SHA-512`.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

fn default_name() -> String {
    "kafka".to_owned()
}
fn default_topic() -> String {
    "kubesink.{cluster}".to_owned()
}
fn yes() -> bool {
    true
}
fn default_linger() -> HumanDuration {
    HumanDuration::from_millis(5)
}
fn default_message_timeout() -> HumanDuration {
    HumanDuration::from_secs(60)
}
fn default_message_max_bytes() -> usize {
    1_000_000
}
fn default_queue_max_messages() -> usize {
    100_000
}
fn default_flush_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_healthcheck_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            name: default_name(),
            filter: None,
            bootstrap_servers: String::new(),
            topic: default_topic(),
            compression: Compression::default(),
            acks: Acks::default(),
            idempotence: true,
            tombstones: true,
            format: Default::default(),
            linger: default_linger(),
            message_timeout: default_message_timeout(),
            message_max_bytes: default_message_max_bytes(),
            queue_max_messages: default_queue_max_messages(),
            flush_timeout: default_flush_timeout(),
            healthcheck_timeout: default_healthcheck_timeout(),
            security: Box::default(),
            librdkafka: Passthrough::default(),
        }
    }
}

/// Every librdkafka property kubesink sets, with the kubesink option that sets it. Aliases
/// (librdkafka `CONFIGURATION.md`) are listed too, so a passthrough cannot set the same
/// property under another name.
pub const MANAGED_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "bootstrap_servers"),
    ("metadata.broker.list", "bootstrap_servers"),
    ("compression.type", "compression"),
    ("compression.codec", "compression"),
    ("acks", "acks"),
    ("request.required.acks", "acks"),
    ("enable.idempotence", "idempotence"),
    ("linger.ms", "linger"),
    ("queue.buffering.max.ms", "linger"),
    ("message.timeout.ms", "message_timeout"),
    ("delivery.timeout.ms", "message_timeout"),
    ("message.max.bytes", "message_max_bytes"),
    ("queue.buffering.max.messages", "queue_max_messages"),
    ("security.protocol", "security.protocol"),
    ("sasl.mechanism", "security.sasl_mechanism"),
    ("sasl.mechanisms", "security.sasl_mechanism"),
    ("sasl.username", "security.sasl_username"),
    ("sasl.password", "security.sasl_password"),
    ("ssl.ca.location", "security.ssl_ca_location"),
    (
        "ssl.certificate.location",
        "security.ssl_certificate_location",
    ),
    ("ssl.key.location", "security.ssl_key_location"),
    ("ssl.key.password", "security.ssl_key_password"),
];

impl KafkaConfig {
    fn invalid(&self, index: usize, key: &str, message: impl Into<String>) -> SinkConfigError {
        SinkConfigError::Invalid {
            index,
            name: self.name.clone(),
            key: key.to_owned(),
            message: message.into(),
        }
    }

    /// The librdkafka properties of this configuration: the managed ones, then the
    /// passthrough map. Call after [`Destination::validate`].
    pub fn render(&self) -> Properties {
        let mut p: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: String| p.push((k.to_owned(), v));
        set("bootstrap.servers", self.bootstrap_servers.clone());
        set(
            "compression.type",
            match self.compression {
                Compression::None => "none",
                Compression::Gzip => "gzip",
                Compression::Snappy => "snappy",
                Compression::Lz4 => "lz4",
                Compression::Zstd => "zstd",
            }
            .into(),
        );
        set(
            "acks",
            match self.acks {
                Acks::All => "all",
                Acks::Leader => "1",
                Acks::None => "0",
            }
            .into(),
        );
        set("enable.idempotence", self.idempotence.to_string());
        set("linger.ms", self.linger.get().as_millis().to_string());
        set(
            "message.timeout.ms",
            self.message_timeout.get().as_millis().to_string(),
        );
        set("message.max.bytes", self.message_max_bytes.to_string());
        set(
            "queue.buffering.max.messages",
            self.queue_max_messages.to_string(),
        );
        let s = &self.security;
        set(
            "security.protocol",
            match s.protocol {
                Protocol::Plaintext => "plaintext",
                Protocol::Ssl => "ssl",
                Protocol::SaslPlaintext => "sasl_plaintext",
                Protocol::SaslSsl => "sasl_ssl",
            }
            .into(),
        );
        if let Some(m) = s.sasl_mechanism {
            set(
                "sasl.mechanism",
                match m {
                    SaslMechanism::Plain => "PLAIN",
                    SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
                    SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
                }
                .into(),
            );
        }
        if let Some(u) = &s.sasl_username {
            set("sasl.username", u.clone());
        }
        if let Some(pw) = &s.sasl_password {
            set("sasl.password", pw.expose().to_owned());
        }
        for (k, v) in [
            ("ssl.ca.location", &s.ssl_ca_location),
            ("ssl.certificate.location", &s.ssl_certificate_location),
            ("ssl.key.location", &s.ssl_key_location),
        ] {
            if let Some(v) = v {
                set(k, v.clone());
            }
        }
        if let Some(pw) = &s.ssl_key_password {
            set("ssl.key.password", pw.expose().to_owned());
        }
        if !self.librdkafka.contains_key("reconnect.backoff.max.ms") {
            set(
                "reconnect.backoff.max.ms",
                DEFAULT_RECONNECT_BACKOFF_MAX_MS.to_owned(),
            );
        }
        if !self
            .librdkafka
            .contains_key("topic.metadata.propagation.max.ms")
        {
            set(
                "topic.metadata.propagation.max.ms",
                DEFAULT_TOPIC_PROPAGATION_MAX_MS.to_owned(),
            );
        }
        if !self.librdkafka.contains_key("statistics.interval.ms") {
            set(
                "statistics.interval.ms",
                DEFAULT_STATISTICS_INTERVAL_MS.to_owned(),
            );
        }
        for (k, v) in self.librdkafka.iter() {
            set(k, v.clone());
        }
        Properties(p)
    }

    /// [`Destination::build`] returning the concrete sink (tests, benches).
    ///
    /// # Errors
    /// As [`Destination::build`].
    pub fn build_sink(&self, index: usize) -> Result<KafkaSink, SinkConfigError> {
        if let Some(e) = self.validate(index).into_iter().next() {
            return Err(e);
        }
        let topics =
            topic_template(&self.topic).map_err(|e| self.invalid(index, "topic", e.to_string()))?;
        for w in self.warnings(index) {
            tracing::warn!(sink = %self.name, "{w}");
        }
        let service = KafkaService::new(Settings {
            sink: self.name.clone(),
            properties: self.render(),
            bootstrap_servers: self.bootstrap_servers.clone(),
            message_max_bytes: self.message_max_bytes,
            flush_timeout: self.flush_timeout.get(),
            healthcheck_timeout: self.healthcheck_timeout.get(),
        })
        .map_err(|e| {
            self.invalid(
                index,
                "librdkafka",
                format!(
                    "librdkafka rejected the configuration: {}",
                    describe_error(&e)
                ),
            )
        })?;
        Ok(KafkaSink::new(
            self.name.clone(),
            topics,
            self.tombstones,
            self.format,
            service,
        ))
    }
}

/// The registration of `type = "kafka"` (listed in the bridge's `src/sinks.rs`).
#[async_trait]
impl Destination for KafkaConfig {
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
        KafkaConfig {
            filter: Some(r#"ns == "payments""#.into()),
            security: Box::new(KafkaSecurity {
                protocol: Protocol::SaslSsl,
                sasl_mechanism: Some(SaslMechanism::Plain),
                sasl_username: Some("u".into()),
                sasl_password: Some(Secret::new("p")),
                ssl_ca_location: Some("/ca".into()),
                ssl_certificate_location: Some("/c".into()),
                ssl_key_location: Some("/k".into()),
                ssl_key_password: Some(Secret::new("p")),
            }),
            ..Default::default()
        }
    }

    /// Problems serde cannot see: a missing `bootstrap_servers`, a bad topic template,
    /// `idempotence` without `acks = "all"`, incomplete SASL or TLS settings, and passthrough
    /// properties kubesink manages (naming both keys). Returns every problem found.
    fn validate(&self, index: usize) -> Vec<SinkConfigError> {
        let mut errs = Vec::new();
        if self.bootstrap_servers.trim().is_empty() {
            errs.push(self.invalid(
                index,
                "bootstrap_servers",
                "required: a comma-separated host:port list",
            ));
        }
        if let Err(e) = topic_template(&self.topic) {
            errs.push(self.invalid(index, "topic", e.to_string()));
        }
        if self.idempotence && self.acks != Acks::All {
            errs.push(self.invalid(
                index,
                "acks",
                "idempotence = true requires acks = \"all\" (set idempotence = false to use another acks)",
            ));
        }
        if self.message_max_bytes < 1000 {
            errs.push(self.invalid(index, "message_max_bytes", "must be at least 1000"));
        }
        if self.queue_max_messages == 0 {
            errs.push(self.invalid(index, "queue_max_messages", "must be at least 1"));
        }
        let s = &self.security;
        let sasl = matches!(s.protocol, Protocol::SaslPlaintext | Protocol::SaslSsl);
        if sasl {
            if s.sasl_mechanism.is_none() {
                errs.push(self.invalid(
                    index,
                    "security.sasl_mechanism",
                    "required with a sasl_* protocol: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
                ));
            }
            if s.sasl_username.as_deref().unwrap_or_default().is_empty() {
                errs.push(self.invalid(
                    index,
                    "security.sasl_username",
                    "required with a sasl_* protocol",
                ));
            }
            if s.sasl_password.is_none() {
                errs.push(self.invalid(
                    index,
                    "security.sasl_password",
                    "required with a sasl_* protocol",
                ));
            }
        } else if s.sasl_mechanism.is_some()
            || s.sasl_username.is_some()
            || s.sasl_password.is_some()
        {
            errs.push(self.invalid(
                index,
                "security.protocol",
                "SASL settings are given but the protocol is not sasl_plaintext or sasl_ssl",
            ));
        }
        if s.ssl_certificate_location.is_some() != s.ssl_key_location.is_some() {
            errs.push(self.invalid(
                index,
                "security.ssl_key_location",
                "ssl_certificate_location and ssl_key_location go together (mutual TLS)",
            ));
        }
        for (key, message) in tls_file_problems(s) {
            errs.push(self.invalid(index, key, message));
        }
        for (property, message) in refused_properties(&self.librdkafka) {
            let key = property.map_or_else(
                || "librdkafka".to_owned(),
                |p| format!("librdkafka.\"{p}\""),
            );
            errs.push(self.invalid(index, &key, message));
        }
        for key in self.librdkafka.keys() {
            if let Some((_, option)) = MANAGED_PROPERTIES.iter().find(|(p, _)| p == key) {
                errs.push(self.invalid(
                    index,
                    &format!("librdkafka.\"{key}\""),
                    format!(
                        "conflicts with `{option}`, which kubesink manages; set `{option}` instead"
                    ),
                ));
            }
        }
        errs
    }

    /// `security.ssl_ca_location`, `ssl_certificate_location` and `ssl_key_location`:
    /// librdkafka reads them when the producer is created (a missing one stops `run`).
    fn files(&self) -> Vec<(String, std::path::PathBuf)> {
        let s = &self.security;
        // librdkafka reads the TLS files only with TLS, and a keytab only with SASL: with
        // other protocols `run` starts without them, and `check` must not say it would not.
        let tls = s.uses_tls();
        let sasl = matches!(s.protocol, Protocol::SaslPlaintext | Protocol::SaslSsl);
        let mut files: Vec<(String, std::path::PathBuf)> = Vec::new();
        if tls {
            for (key, path) in [
                ("security.ssl_ca_location", &s.ssl_ca_location),
                (
                    "security.ssl_certificate_location",
                    &s.ssl_certificate_location,
                ),
                ("security.ssl_key_location", &s.ssl_key_location),
            ] {
                if let Some(p) = path {
                    files.push((key.to_owned(), p.into()));
                }
            }
        }
        // librdkafka's other files, given through the passthrough (`ssl.keystore.location`,
        // `ssl.crl.location`, `sasl.kerberos.keytab`...).
        files.extend(
            crate::properties::passthrough_files(&self.librdkafka, tls, sasl)
                .map(|(k, v)| (format!("librdkafka.\"{k}\""), v)),
        );
        files
    }

    /// Settings that work but weaken security, one sentence each (for `kubesink check` and
    /// the start-up log): TLS certificate or host name verification turned off through the
    /// passthrough map (`enable.ssl.certificate.verification = "false"`,
    /// `ssl.endpoint.identification.algorithm = "none"`), and credentials sent without TLS
    /// (`sasl_plaintext`).
    fn warnings(&self, index: usize) -> Vec<String> {
        let mut w = Vec::new();
        let at = |key: &str| format!("sinks[{index}] ({}): {key}", self.name);
        let off = |k: &str, v: &str| {
            self.librdkafka
                .get(k)
                .is_some_and(|x| x.trim().eq_ignore_ascii_case(v))
        };
        if off("enable.ssl.certificate.verification", "false") {
            w.push(format!(
                "{}: TLS certificate verification is turned off: the brokers' identity is not checked",
                at("librdkafka.\"enable.ssl.certificate.verification\"")
            ));
        }
        if off("ssl.endpoint.identification.algorithm", "none") {
            w.push(format!(
                "{}: TLS host name verification is turned off: any certificate of the CA is accepted for any broker",
                at("librdkafka.\"ssl.endpoint.identification.algorithm\"")
            ));
        }
        if self.security.protocol == Protocol::SaslPlaintext {
            w.push(format!(
                "{}: sasl_plaintext sends the SASL credentials without TLS; use sasl_ssl outside a trusted network",
                at("security.protocol")
            ));
        }
        w
    }

    /// Builds the sink: validates and creates the producer, which connects in the
    /// background. A broker that is down does not fail the build: the sink reports not ready
    /// and delivery retries until the brokers answer.
    ///
    /// # Errors
    /// A [`SinkConfigError`] for invalid settings, or a property librdkafka rejects.
    async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        Ok(Arc::new(self.build_sink(index)?))
    }
}
