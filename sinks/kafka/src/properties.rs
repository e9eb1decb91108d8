//! librdkafka properties as the producer receives them (`CONFIGURATION.md` of librdkafka),
//! and which of them are credentials, so that nothing prints a secret: `config.rs` renders
//! them, `service.rs` creates producers from them, both print them only redacted.

/// Whether a librdkafka property holds a credential whose value is never printed
/// (librdkafka `CONFIGURATION.md`): every `*password*`, `*secret*` and `*passphrase*`
/// property (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`,
/// `sasl.oauthbearer.client.secret`...), private keys given inline (`ssl.key.pem`,
/// `sasl.oauthbearer.assertion.private.key.pem`), and `sasl.oauthbearer.config`, which may
/// carry a secret.
pub fn is_secret_property(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["password", "secret", "passphrase", "private.key", "key.pem"]
        .iter()
        .any(|w| n.contains(w))
        || n == "sasl.oauthbearer.config"
        || n == "ssl_key"
}

/// librdkafka properties (`CONFIGURATION.md` of librdkafka), in a stable order.
#[derive(Clone, PartialEq, Eq)]
pub struct Properties(pub Vec<(String, String)>);

impl Properties {
    /// The properties with secret values replaced by `***`, for logs and `kubesink check`.
    pub fn redacted(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .map(|(k, v)| {
                let secret = is_secret_property(k);
                (k.clone(), if secret { "***".into() } else { v.clone() })
            })
            .collect()
    }

    /// The value of one property, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl std::fmt::Debug for Properties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.redacted()).finish()
    }
}

/// Whether passthrough property `name` names a file librdkafka reads (`ssl.*.location`,
/// `ssl.crl.location`, `sasl.kerberos.keytab`...).
fn is_file_property(name: &str) -> bool {
    name.ends_with(".location") || name.ends_with(".keytab")
}

/// The files a passthrough map names that librdkafka reads when the client is created: the
/// `ssl.*` ones with TLS (`tls`), the `sasl.*` ones with SASL (`sasl`), as `(property,
/// path)`. A missing one stops the start (`kubesink check` names it: a warning, an error
/// with `--strict`).
pub fn passthrough_files(
    properties: &std::collections::BTreeMap<String, String>,
    tls: bool,
    sasl: bool,
) -> impl Iterator<Item = (String, std::path::PathBuf)> + '_ {
    properties
        .iter()
        .filter(|(k, v)| is_file_property(k) && !v.is_empty())
        .filter(move |(k, _)| (tls && k.starts_with("ssl.")) || (sasl && k.starts_with("sasl.")))
        .map(|(k, v)| (k.clone(), std::path::PathBuf::from(v)))
}

/// What librdkafka refuses in a passthrough map, one entry per problem: `(Some(property),
/// message)` for a property it refuses alone (an unknown name, with the nearest known one; a
/// bad value), then, only when each is accepted alone, `(None, message)` for what it refuses
/// of them together (found by creating a producer with the map; no connection is made). Each
/// property is tried alone so that one run reports them all (librdkafka stops at the first).
/// A credential property's value ([`is_secret_property`]) is never quoted. Empty when
/// librdkafka accepts the map: what the sink's build, or the state store's, would refuse at
/// start.
pub fn refused_properties(
    properties: &std::collections::BTreeMap<String, String>,
) -> Vec<(Option<String>, String)> {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaConfRes;
    let redact = |mut text: String| {
        for (k, v) in properties {
            if is_secret_property(k) && !v.is_empty() {
                text = text.replace(v.as_str(), "***");
            }
        }
        text
    };
    let mut refused = Vec::new();
    for (name, value) in properties {
        let mut one = rdkafka::ClientConfig::new();
        one.set(name, value);
        let message = match one.create_native_config() {
            Ok(_) => continue,
            Err(KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, ..)) => format!(
                "librdkafka has no such property{}",
                kubesink_core::words::did_you_mean(name, &property_names())
            ),
            Err(KafkaError::ClientConfig(_, description, ..)) => {
                format!("librdkafka refuses it: {}", redact(description))
            }
            Err(e) => format!("librdkafka refuses it: {}", redact(e.to_string())),
        };
        refused.push((Some(name.clone()), message));
    }
    if refused.is_empty() && !properties.is_empty() {
        let mut all = rdkafka::ClientConfig::new();
        // A file that is not here is its own finding (a missing file, named with its path);
        // left in, librdkafka would refuse the whole map for the first one, without the path.
        for (k, v) in properties
            .iter()
            .filter(|(k, v)| !is_file_property(k) || std::path::Path::new(v.as_str()).is_file())
        {
            all.set(k, v);
        }
        if let Err(e) = all.create::<rdkafka::producer::BaseProducer>() {
            let text = match e {
                KafkaError::ClientCreation(text) => text,
                e => e.to_string(),
            };
            refused.push((
                None,
                format!(
                    "librdkafka refuses these properties together: {}",
                    redact(text)
                ),
            ));
        }
    }
    refused
}

/// Every property name librdkafka knows, global and topic, aliases included: the first
/// column of the table `rd_kafka_conf_properties_show` writes (its CONFIGURATION.md), read
/// through a temporary file once. The candidates of "did you mean"; empty if the table cannot
/// be written (the suggestion is then left out).
fn property_names() -> Vec<&'static str> {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    NAMES
        .get_or_init(|| {
            let table = properties_table().unwrap_or_default();
            let mut names: Vec<String> = table
                .lines()
                .filter_map(|l| l.split_once('|'))
                .map(|(name, _)| name.trim())
                // Names are lower case with dots and underscores; the header ("Property")
                // and the separator ("-----") are not.
                .filter(|n| {
                    n.starts_with(|c: char| c.is_ascii_lowercase())
                        && n.chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_'
                        })
                })
                .map(str::to_owned)
                .collect();
            names.sort();
            names.dedup();
            names
        })
        .iter()
        .map(String::as_str)
        .collect()
}

/// librdkafka's property table (Markdown), as `rd_kafka_conf_properties_show` writes it.
fn properties_table() -> Option<String> {
    use std::io::Read;
    // SAFETY: `tmpfile` returns an open stream or NULL (checked); librdkafka writes its table
    // into it; the stream is flushed, rewound and read through its descriptor, then closed
    // once. `rdkafka::bindings::FILE` is libc's `FILE`.
    unsafe {
        let f = libc::tmpfile();
        if f.is_null() {
            return None;
        }
        rdkafka::bindings::rd_kafka_conf_properties_show(f);
        libc::fflush(f);
        libc::rewind(f);
        let fd = libc::dup(libc::fileno(f));
        libc::fclose(f);
        if fd < 0 {
            return None;
        }
        let mut file = <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let mut text = String::new();
        file.read_to_string(&mut text).ok()?;
        Some(text)
    }
}

#[cfg(test)]
mod refused_tests {
    use super::*;
    use std::collections::BTreeMap;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_refused_property_is_named_at_once_with_the_nearest_known_name() {
        let refused = refused_properties(&map(&[
            ("ssl.keystore.locaton", "/k.p12"),
            ("sasl.oauthbearer.client.secrt", "x"),
            ("socket.keepalive.enabel", "true"),
            ("linger.ms", "soon"),
            ("sasl.password", "hunter2-but-longer"),
            ("compresion.type", "zstd"),
            ("client.id", "fine"),
        ]));
        let by_name: BTreeMap<_, _> = refused
            .iter()
            .map(|(k, m)| (k.clone().unwrap_or_default(), m.clone()))
            .collect();
        assert_eq!(by_name.len(), 5, "{refused:?}");
        assert_eq!(
            by_name["ssl.keystore.locaton"],
            "librdkafka has no such property (did you mean \"ssl.keystore.location\"?)"
        );
        assert_eq!(
            by_name["sasl.oauthbearer.client.secrt"],
            "librdkafka has no such property (did you mean \"sasl.oauthbearer.client.secret\"?)"
        );
        assert_eq!(
            by_name["socket.keepalive.enabel"],
            "librdkafka has no such property (did you mean \"socket.keepalive.enable\"?)"
        );
        assert_eq!(
            by_name["compresion.type"],
            "librdkafka has no such property (did you mean \"compression.type\"?)"
        );
        assert!(
            by_name["linger.ms"].starts_with("librdkafka refuses it: Invalid value"),
            "{refused:?}"
        );
    }

    #[test]
    fn a_refused_secret_value_is_never_quoted() {
        // Each alone is accepted (strings); together librdkafka refuses the key at creation.
        let refused = refused_properties(&map(&[
            ("security.protocol", "ssl"),
            ("ssl.key.pem", "hunter2secret"),
            ("ssl.certificate.pem", "not-a-certificate"),
        ]));
        assert_eq!(refused.len(), 1, "{refused:?}");
        let (property, message) = &refused[0];
        assert_eq!(property, &None);
        assert!(
            message.starts_with("librdkafka refuses these properties together: "),
            "{message}"
        );
        assert!(!message.contains("hunter2secret"), "{message}");
    }

    #[test]
    fn accepted_maps_are_not_refused_and_the_names_come_from_librdkafka() {
        assert!(refused_properties(&BTreeMap::new()).is_empty());
        assert!(refused_properties(&map(&[("socket.keepalive.enable", "true")])).is_empty());
        let names = property_names();
        // Properties with a default, without one, aliases, and
        // topic properties.
        for known in [
            "socket.timeout.ms",
            "client.id",
            "ssl.keystore.location",
            "sasl.oauthbearer.client.secret",
            "bootstrap.servers",
            "acks",
            "message.timeout.ms",
        ] {
            assert!(names.contains(&known), "{known} in {names:?}");
        }
        // Every name is one librdkafka knows.
        for name in &names {
            let mut c = rdkafka::ClientConfig::new();
            c.set(*name, "");
            assert!(
                !matches!(
                    c.create_native_config(),
                    Err(rdkafka::error::KafkaError::ClientConfig(
                        rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
                        ..
                    ))
                ),
                "librdkafka knows {name}"
            );
        }
        assert!(names.len() > 100, "{}", names.len());
    }
}
