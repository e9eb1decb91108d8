//! `[[sinks]]` entry with `type = "otlp"`: the serde configuration, its checks and `build()`.
//! Connection options (timeouts, headers, `[sinks.auth]`, `[sinks.tls]`) are the HTTP
//! destination's, checked and turned into a client by its crate (`kubesink-http`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use kubesink_core::units::{ByteSize, HumanDuration};
use kubesink_core::{Destination, Secret, Sink, SinkConfigError};
use kubesink_http::{HttpAuth, HttpConfig, HttpTls};
use serde::{Deserialize, Serialize};

use crate::sink::OtlpSink;

/// The OTLP/HTTP path of logs, appended to `endpoint` (OTLP specification, "OTLP/HTTP
/// Request": `/v1/logs`).
pub const LOGS_PATH: &str = "v1/logs";

/// OTLP sink configuration (`[[sinks]]` with `type = "otlp"`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// Name used in logs and metrics; unique among sinks. Default `"otlp"`.
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
    /// Required. The OTLP/HTTP base URL (`http://collector:4318`); requests go to
    /// `{endpoint}/v1/logs`, as `OTEL_EXPORTER_OTLP_ENDPOINT` does.
    pub endpoint: String,
    /// `"gzip"` (default) or `"none"`: the request body's `Content-Encoding`.
    #[serde(default)]
    pub compression: OtlpCompression,
    /// Bound on one request, from connecting to the end of the answer. Default `10s`.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Bound on establishing a connection (TCP and TLS). Default `5s`.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// Largest request body before compression, in bytes; a batch above it is sent as several
    /// requests, in order. At least 16 KiB. Default `4MiB` (the Collector's OTLP receiver
    /// accepts 20 MiB by default).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: ByteSize,
    /// Extra headers on every request (`"X-Scope-OrgID" = "platform"`); values may be
    /// secrets.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Authentication, as the HTTP sink's: `bearer_token`, or `username` and `password`.
    #[serde(default)]
    pub auth: HttpAuth,
    /// TLS of `https://` endpoints, as the HTTP sink's.
    #[serde(default)]
    pub tls: HttpTls,
}

/// `compression`.
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OtlpCompression {
    /// `Content-Encoding: gzip`.
    #[default]
    Gzip,
    /// No compression.
    None,
}

fn default_name() -> String {
    "otlp".to_owned()
}
fn default_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn default_max_body_bytes() -> ByteSize {
    ByteSize(4 << 20)
}

impl OtlpConfig {
    /// An entry with `endpoint` and every default.
    pub fn new(endpoint: impl Into<String>) -> Self {
        OtlpConfig {
            name: default_name(),
            filter: None,
            endpoint: endpoint.into(),
            compression: OtlpCompression::default(),
            timeout: default_timeout(),
            connect_timeout: default_connect_timeout(),
            max_body_bytes: default_max_body_bytes(),
            headers: BTreeMap::new(),
            auth: HttpAuth::default(),
            tls: HttpTls::default(),
        }
    }

    /// The logs URL: `endpoint` with `/v1/logs` appended.
    pub fn logs_url(&self) -> String {
        format!("{}/{LOGS_PATH}", self.endpoint.trim_end_matches('/'))
    }

    /// The same connection as an HTTP sink entry, whose checks and client are reused.
    fn as_http(&self) -> HttpConfig {
        HttpConfig {
            name: self.name.clone(),
            filter: None,
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            max_body_bytes: self.max_body_bytes,
            headers: self.headers.clone(),
            auth: self.auth.clone(),
            tls: self.tls.clone(),
            ..HttpConfig::new(self.logs_url())
        }
    }

    /// Builds the sink (nothing is connected yet).
    ///
    /// # Errors
    /// The first problem `validate` reports, or a TLS file that cannot be read, naming the key.
    pub fn build_sink(&self, index: usize) -> Result<OtlpSink, SinkConfigError> {
        if let Some(e) = self.validate(index).into_iter().next() {
            return Err(e);
        }
        let http = self.as_http();
        let client = http.client(index).map_err(rename)?;
        let url = reqwest::Url::parse(&http.url).map_err(|e| SinkConfigError::Invalid {
            index,
            name: self.name.clone(),
            key: "endpoint".into(),
            message: e.to_string(),
        })?;
        Ok(OtlpSink::new(
            self.name.clone(),
            client,
            url,
            self.compression == OtlpCompression::Gzip,
            self.max_body_bytes.bytes(),
        ))
    }
}

/// An HTTP-entry error in this entry's terms (`url` is `endpoint` here).
fn rename(e: SinkConfigError) -> SinkConfigError {
    match e {
        SinkConfigError::Invalid {
            index,
            name,
            key,
            message,
        } => SinkConfigError::Invalid {
            index,
            name,
            key: if key == "url" { "endpoint".into() } else { key },
            message,
        },
    }
}

#[async_trait]
impl Destination for OtlpConfig {
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
        let http = HttpConfig::reference_example();
        OtlpConfig {
            headers: http.headers,
            auth: http.auth,
            tls: http.tls,
            filter: http.filter,
            ..OtlpConfig::new("https://collector.example:4318")
        }
    }

    fn validate(&self, index: usize) -> Vec<SinkConfigError> {
        let invalid = |message: String| SinkConfigError::Invalid {
            index,
            name: self.name.clone(),
            key: "endpoint".into(),
            message,
        };
        let mut out = Vec::new();
        match reqwest::Url::parse(&self.endpoint) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {
                if u.path().trim_end_matches('/').ends_with("/v1/logs") {
                    let base = self.endpoint.trim_end_matches('/');
                    let base = base.strip_suffix("/v1/logs").unwrap_or(base);
                    out.push(invalid(format!(
                        "{:?} ends with /v1/logs, which kubesink appends itself (endpoint is the base URL, as OTEL_EXPORTER_OTLP_ENDPOINT): use {base:?}",
                        self.endpoint
                    )));
                }
            }
            _ => out.push(invalid(format!(
                "{:?} is not an http:// or https:// URL (is the scheme missing?)",
                self.endpoint
            ))),
        }
        let endpoint_named = !out.is_empty();
        out.extend(
            self.as_http()
                .validate(index)
                .into_iter()
                .map(rename)
                .filter(|e| {
                    !(endpoint_named
                        && matches!(e, SinkConfigError::Invalid { key, .. } if key == "endpoint"))
                }),
        );
        out
    }

    fn warnings(&self, index: usize) -> Vec<String> {
        self.as_http()
            .warnings(index)
            .into_iter()
            .map(|w| w.replace("): url:", "): endpoint:"))
            .collect()
    }

    fn files(&self) -> Vec<(String, PathBuf)> {
        self.as_http().files()
    }

    async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        Ok(Arc::new(self.build_sink(index)?))
    }
}
