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
