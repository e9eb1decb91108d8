//! `[state.kafka]`: the Kafka state backend's settings (the compacted topic, and the connection:
//! a Kafka sink's, or its own), and what the bridge does with them through
//! [`StateBackendConfig`] (registered in its list as `state.backend = "kafka"`): its checks
//! (with the connection found among the sinks, and the topic no sink may share), its
//! warnings, the files its own connection reads, and opening its
//! [`KafkaStore`](super::KafkaStore).

use std::path::PathBuf;
use std::sync::Arc;

use kubesink_core::state::{StateBackendConfig, StateContext, StateStore};
use kubesink_core::units::{ByteSize, HumanDuration};
use kubesink_core::Destination;
use serde::{Deserialize, Serialize};

use crate::{KafkaConfig, Passthrough, Properties};

/// `[state.kafka]`: the saved informer state as records of a compacted Kafka topic, the way
/// Kafka Connect keeps its offsets and configs (`offset.storage.topic`, KIP-154 ff.).
///
/// The connection is a `[[sinks]]` Kafka entry's (`sink`, or the only Kafka sink when neither
/// `sink` nor `bootstrap_servers` is set), or its own (`bootstrap_servers` and librdkafka
/// properties in `librdkafka`, e.g. `"security.protocol" = "sasl_ssl"`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StateKafkaConfig {
    /// The name of the `[[sinks]]` Kafka entry whose connection (`bootstrap_servers`,
    /// `[sinks.security]`, its `librdkafka` map) the state uses. Default: the only Kafka sink,
    /// unless `bootstrap_servers` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<String>,
    /// The brokers (`host:port,...`), for a state kept on other brokers than any sink's.
    /// Not together with `sink`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_servers: Option<String>,
    /// librdkafka properties of the connection (librdkafka `CONFIGURATION.md`:
    /// `security.protocol`, `sasl.*`, `ssl.*`...), added to the sink's when `sink` is used.
    /// Credentials are never printed.
    #[serde(default)]
    pub librdkafka: Passthrough,
    /// The topic. Default `"kubesink-state"`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// The prefix of this state's record keys, so that the kubesinks of several clusters can
    /// share the topic. Default: `cluster.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Create the topic, with `cleanup.policy = compact`, when it does not exist. Default
    /// `true`.
    #[serde(default = "yes")]
    pub create: bool,
    /// Partitions of a created topic; a state's records all go to one partition, chosen by
    /// its key among this many (so keep it as the topic was created). Default 1.
    #[serde(default = "one")]
    pub partitions: i32,
    /// Replication factor of a created topic. Default: the brokers' own
    /// (`default.replication.factor`; KIP-464, Kafka 2.4 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i32>,
    /// The largest record value written: a larger snapshot is cut into records of this size.
    /// Keep it below the topic's `max.message.bytes` (broker default 1 MiB). Default
    /// `512KiB`; at least `1KiB`.
    #[serde(default = "default_chunk")]
    pub chunk_bytes: ByteSize,
    /// Bound on one operation (a read to the end, a group of records acknowledged, an admin
    /// request). Default `10s`.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Write through a transactional producer (KIP-98) whose `transactional.id` is
    /// `kubesink-state.{topic}.{key}`: a new writer's `init_transactions` fences the previous
    /// one at the broker, on top of the epoch fence in the records (`docs/restarts.md`).
    /// Needs brokers with transactions (tansu 0.6 has none). Default `false`.
    #[serde(default)]
    pub transactional: bool,
}

impl Default for StateKafkaConfig {
    fn default() -> Self {
        StateKafkaConfig {
            sink: None,
            bootstrap_servers: None,
            librdkafka: Passthrough::default(),
            topic: default_topic(),
            key: None,
            create: true,
            partitions: 1,
            replication_factor: None,
            chunk_bytes: default_chunk(),
            timeout: default_timeout(),
            transactional: false,
        }
    }
}

fn default_topic() -> String {
    "kubesink-state".to_owned()
}
fn default_chunk() -> ByteSize {
    ByteSize(512 * 1024)
}
fn default_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn yes() -> bool {
    true
}
fn one() -> i32 {
    1
}

/// The connection a Kafka state store uses, resolved from [`StateKafkaConfig`] and the sinks.
#[derive(Clone, Debug)]
pub struct StateConnection {
    /// `bootstrap.servers` and the other connection properties (security, passthrough).
    pub properties: Properties,
    /// Where they come from, for logs: `sink "events"` or `state.kafka.bootstrap_servers`.
    pub source: String,
}

/// Properties that only tune a producer's batching or delivery: left out of a reused sink's
/// properties (the state store sets its own).
const PRODUCER_TUNING: &[&str] = &[
    "compression.type",
    "acks",
    "enable.idempotence",
    "linger.ms",
    "message.timeout.ms",
    "message.max.bytes",
    "queue.buffering.max.messages",
    "statistics.interval.ms",
];

impl StateKafkaConfig {
    /// The connection, from the sinks' Kafka entries (`sinks`: name and config).
    ///
    /// # Errors
    /// A message for `state.kafka.sink` (no such Kafka sink, or none / several to choose
    /// from) or `state.kafka.bootstrap_servers` (empty, or given with `sink`).
    pub fn connection<'a>(
        &self,
        sinks: impl IntoIterator<Item = &'a KafkaConfig>,
    ) -> Result<StateConnection, (&'static str, String)> {
        let sinks: Vec<&KafkaConfig> = sinks.into_iter().collect();
        let mut p: Vec<(String, String)> = match (&self.sink, &self.bootstrap_servers) {
            (Some(_), Some(_)) => {
                return Err((
                    "bootstrap_servers",
                    "is given together with state.kafka.sink: set one (sink reuses that sink's connection)".into(),
                ))
            }
            (None, Some(b)) if b.trim().is_empty() => {
                return Err((
                    "bootstrap_servers",
                    "must not be empty: a comma-separated host:port list".into(),
                ))
            }
            (None, Some(b)) => vec![("bootstrap.servers".into(), b.clone())],
            (Some(name), None) => match sinks.iter().find(|s| &s.name == name) {
                Some(s) => connection_of(s),
                None => {
                    return Err((
                        "sink",
                        format!(
                            "{name:?} is not the name of a [[sinks]] entry of type \"kafka\" (Kafka sinks: {})",
                            names(&sinks)
                        ),
                    ))
                }
            },
            (None, None) => match sinks.as_slice() {
                [s] => connection_of(s),
                [] => {
                    return Err((
                        "bootstrap_servers",
                        "required: no [[sinks]] entry of type \"kafka\" to take the connection from (set state.kafka.bootstrap_servers, or state.kafka.sink)".into(),
                    ))
                }
                _ => {
                    return Err((
                        "sink",
                        format!(
                            "required with several Kafka sinks: name the one whose connection the state uses ({})",
                            names(&sinks)
                        ),
                    ))
                }
            },
        };
        for (k, v) in self.librdkafka.iter() {
            p.retain(|(x, _)| x != k);
            p.push((k.clone(), v.clone()));
        }
        let source = match (&self.sink, sinks.as_slice()) {
            (Some(name), _) => format!("sink {name:?}"),
            (None, [s]) if self.bootstrap_servers.is_none() => format!("sink {:?}", s.name),
            _ => "state.kafka.bootstrap_servers".into(),
        };
        Ok(StateConnection {
            properties: Properties(p),
            source,
        })
    }

    /// Settings of its own connection (`librdkafka`) that work but weaken security, as
    /// `(key, message)` with keys relative to `[state.kafka]`: TLS certificate or host name
    /// verification turned off, SASL credentials without TLS. A reused sink's own are warned
    /// about with the sink.
    pub fn warnings(&self) -> Vec<(String, String)> {
        let is = |k: &str, v: &str| {
            self.librdkafka
                .get(k)
                .is_some_and(|x| x.trim().eq_ignore_ascii_case(v))
        };
        let mut w = Vec::new();
        if is("enable.ssl.certificate.verification", "false") {
            w.push((
                "librdkafka.\"enable.ssl.certificate.verification\"".to_owned(),
                "TLS certificate verification is turned off: the brokers' identity is not checked"
                    .to_owned(),
            ));
        }
        if is("ssl.endpoint.identification.algorithm", "none") {
            w.push((
                "librdkafka.\"ssl.endpoint.identification.algorithm\"".to_owned(),
                "TLS host name verification is turned off: any certificate of the CA is accepted for any broker".to_owned(),
            ));
        }
        if self.chunk_bytes.0 > 1024 * 1024 - 64 * 1024 {
            w.push((
                "chunk_bytes".to_owned(),
                format!("{} bytes per record is above what a broker with the default max.message.bytes (1 MiB) accepts with its overhead: make sure the topic's max.message.bytes allows it, or the saves fail", self.chunk_bytes.0),
            ));
        }
        if is("security.protocol", "sasl_plaintext") {
            w.push((
                "librdkafka.\"security.protocol\"".to_owned(),
                "sasl_plaintext sends the SASL credentials without TLS; use sasl_ssl outside a trusted network".to_owned(),
            ));
        }
        w
    }

    /// Problems serde cannot see, as `(key, message)` with keys relative to `[state.kafka]`
    /// (the bridge prefixes `state.kafka.`); the connection is checked by
    /// [`StateKafkaConfig::connection`].
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        let mut bad = |key: &str, message: String| errs.push((key.to_owned(), message));
        if let Err(e) = crate::request::topic_template(&self.topic) {
            bad("topic", e.to_string());
        } else if self.topic.contains('{') {
            bad(
                "topic",
                format!(
                    "{:?} is a template: the state topic is one fixed name",
                    self.topic
                ),
            );
        }
        if self.key.as_deref() == Some("") {
            bad(
                "key",
                "must not be empty (leave it out for cluster.name)".into(),
            );
        }
        if self.partitions < 1 {
            bad("partitions", "must be at least 1".into());
        }
        if self.replication_factor.is_some_and(|r| r < 1) {
            bad(
                "replication_factor",
                "must be at least 1 (leave it out for the brokers' default)".into(),
            );
        }
        if self.chunk_bytes.0 < 1024 {
            bad("chunk_bytes", "must be at least 1KiB".into());
        } else if self.chunk_bytes.0 > 100 * 1024 * 1024 {
            bad(
                "chunk_bytes",
                "must be at most 100MiB (and below the topic's max.message.bytes)".into(),
            );
        }
        if self.timeout.get().is_zero() {
            bad("timeout", "must be greater than zero".into());
        }
        // What librdkafka itself refuses (an unknown property, a bad value) is found now,
        // not when the watches wait for a store that can never open.
        for (property, message) in crate::properties::refused_properties(&self.librdkafka) {
            let key = property.map_or_else(
                || "librdkafka".to_owned(),
                |p| format!("librdkafka.\"{p}\""),
            );
            bad(&key, message);
        }
        for key in self.librdkafka.keys() {
            if key == "bootstrap.servers" || key == "metadata.broker.list" {
                bad(
                    &format!("librdkafka.\"{key}\""),
                    "set state.kafka.bootstrap_servers (or state.kafka.sink) instead: the brokers are not a passthrough property".into(),
                );
            }
            if key == "transactional.id" || key == "enable.idempotence" || key == "acks" {
                bad(
                    &format!("librdkafka.\"{key}\""),
                    "is managed by the state store (acks = all, idempotence on; transactional.id with state.kafka.transactional)".into(),
                );
            }
        }
        errs
    }
}

/// The Kafka entries among `sinks` (every `[[sinks]]` entry, in order), in order: those a
/// state may take its connection from ([`StateKafkaConfig::connection`]).
pub fn kafka_sinks<'a>(sinks: &[&'a dyn Destination]) -> Vec<&'a KafkaConfig> {
    sinks
        .iter()
        .filter_map(|s| s.as_any().downcast_ref::<KafkaConfig>())
        .collect()
}

impl StateBackendConfig for StateKafkaConfig {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn problems(&self) -> Vec<(String, String)> {
        StateKafkaConfig::problems(self)
    }

    /// The sinks, where its connection may come from.
    fn inputs(&self) -> &'static [&'static str] {
        &["sinks"]
    }

    /// The connection ([`StateKafkaConfig::connection`] among the Kafka sinks), then every
    /// Kafka sink whose topic, for one of the clusters, is the state's: the state's records
    /// are not topology messages and must never reach a sink's consumers.
    fn problems_across(&self, ctx: &StateContext<'_>) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Err((key, message)) = self.connection(kafka_sinks(&ctx.sinks)) {
            out.push((key.to_owned(), message));
        }
        let state_topic = &self.topic;
        for (i, sink) in ctx.sinks.iter().enumerate() {
            let Some(k) = sink.as_any().downcast_ref::<KafkaConfig>() else {
                continue;
            };
            let clash = ctx
                .clusters
                .iter()
                .any(|cluster| k.topic.replace("{cluster}", cluster) == *state_topic);
            if clash {
                out.push((
                    "topic".to_owned(),
                    format!(
                        "{state_topic:?} is also the topic of sink {:?} (sinks.{i}.topic = {:?}): the state's records would reach its consumers; give the state its own topic",
                        k.name, k.topic
                    ),
                ));
            }
        }
        out
    }

    fn warnings(&self, _ctx: &StateContext<'_>) -> Vec<(String, String)> {
        StateKafkaConfig::warnings(self)
    }

    /// The files its own `librdkafka` properties name, as far as `security.protocol` uses
    /// them (a reused sink's are named with the sink).
    fn files(&self) -> Vec<(String, PathBuf)> {
        let map = &self.librdkafka;
        let protocol = map
            .get("security.protocol")
            .map(|p| p.to_ascii_lowercase())
            .unwrap_or_default();
        let (tls, sasl) = (protocol.ends_with("ssl"), protocol.starts_with("sasl"));
        crate::passthrough_files(map, tls, sasl)
            .map(|(k, p)| (format!("librdkafka.\"{k}\""), p))
            .collect()
    }

    /// Takes the connection from the Kafka sinks or its own, and fences by
    /// [`StateContext::identity`].
    fn open(
        &self,
        unit: &str,
        multi: bool,
        ctx: &StateContext<'_>,
    ) -> Result<Arc<dyn StateStore>, (String, String)> {
        let mut kafka = self.clone();
        if multi {
            kafka.key = kafka.key.map(|k| format!("{k}.{unit}"));
        }
        let connection = kafka
            .connection(kafka_sinks(&ctx.sinks))
            .map_err(|(key, message)| (key.to_owned(), message))?;
        Ok(Arc::new(super::KafkaStore::new(
            &kafka,
            connection,
            unit,
            &ctx.identity,
        )))
    }
}

fn names(sinks: &[&KafkaConfig]) -> String {
    if sinks.is_empty() {
        return "none".into();
    }
    sinks
        .iter()
        .map(|s| format!("{:?}", s.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A sink's connection properties: what it renders, minus its producer tuning.
fn connection_of(sink: &KafkaConfig) -> Vec<(String, String)> {
    sink.render()
        .0
        .into_iter()
        .filter(|(k, _)| !PRODUCER_TUNING.contains(&k.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weakened_security_of_its_own_connection_is_warned_about_naming_the_key() {
        let mut c = StateKafkaConfig::default();
        assert!(c.warnings().is_empty());
        for (k, v) in [
            ("enable.ssl.certificate.verification", "False"),
            ("ssl.endpoint.identification.algorithm", "none"),
            ("security.protocol", "SASL_PLAINTEXT"),
        ] {
            c.librdkafka.insert(k.into(), v.into());
        }
        let keys: Vec<String> = c.warnings().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "librdkafka.\"enable.ssl.certificate.verification\"",
                "librdkafka.\"ssl.endpoint.identification.algorithm\"",
                "librdkafka.\"security.protocol\""
            ]
        );
    }
}
