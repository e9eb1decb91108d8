//! `[[sinks]]` entry with `type = "http"`: the serde configuration, its validation and
//! `build()`, which makes the HTTP client (TLS roots, client certificate, default headers).
//!
//! Names follow the CloudEvents HTTP protocol binding 1.0.2
//! (<https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/http-protocol-binding.md>)
//! and RFC 9110 (status codes, `Retry-After`). No secret is ever logged: the bearer token,
//! the password and custom header values are [`Secret`]s.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine as _;
use kubesink_core::units::{ByteSize, HumanDuration};
use kubesink_core::{Destination, Secret, Sink, SinkConfigError};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::format::HttpFormat;
use crate::sink::{HttpSink, Settings};

/// Headers a configuration may not set: the sink writes them itself per request.
const RESERVED_HEADERS: [&str; 4] = [
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
];

/// Smallest `max_body_bytes` accepted.
const MIN_BODY_BYTES: u64 = 16 * 1024;

/// HTTP sink configuration (`[[sinks]]` with `type = "http"`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Name used in logs and metrics; unique among sinks. Default `"http"`.
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
    /// Required. The URL every request is POSTed to (`http://` or `https://`).
    pub url: String,
    /// How messages become requests (see [`HttpFormat`]). Default `"cloudevents"` (binary
    /// content mode, one event per request: what Knative, Argo Events and most webhook
    /// receivers accept).
    #[serde(default)]
    pub format: HttpFormat,
    /// Bound on one request, from connecting to the end of the answer; then it counts as
    /// failed and is retried. Default `10s`.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Bound on establishing a connection (TCP and TLS). Default `5s`.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// Largest request body in bytes. The batched formats put as many messages in a request
    /// as fit; a message larger than this minus 4 KiB is shrunk by the oversize policy
    /// (metadata only, then no object). At least 16 KiB. Default `1MiB`.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: ByteSize,
    /// Requests in flight at once within a batch in the one-event-per-request formats
    /// (`cloudevents`, `cloudevents-structured`), 1 to 256. Per-key order holds: a key's next
    /// message is sent only once the receiver answered its previous one. The batched formats
    /// send one request at a time. Default `8`.
    #[serde(default = "default_requests_in_flight")]
    pub requests_in_flight: usize,
    /// Extra headers on every request (`"X-Team" = "platform"`); a value may be a secret
    /// (`{ env = "NAME" }` or `{ file = "PATH" }`). `Content-Type`, `Content-Length`, `Host`
    /// and `Transfer-Encoding` are the sink's; `Authorization` is refused together with
    /// `[sinks.auth]`.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Readiness: `GET` this URL (2xx is ready) on each readiness check. Unset (the
    /// default): ready unless the last request failed for a reason other than the message
    /// itself (connection, timeout, 408, 429, 5xx, 401/403/404).
    pub health_url: Option<String>,
    /// Authentication; at most one method.
    #[serde(default)]
    pub auth: HttpAuth,
    /// TLS of `https://` URLs.
    #[serde(default)]
    pub tls: HttpTls,
}

/// `[sinks.auth]`: a bearer token, or basic authentication.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpAuth {
    /// `Authorization: Bearer <token>`.
    pub bearer_token: Option<Secret>,
    /// Basic authentication user (with `password`).
    pub username: Option<String>,
    /// Basic authentication password (with `username`).
    pub password: Option<Secret>,
}

/// `[sinks.tls]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpTls {
    /// CA certificates (PEM) that verify the receiver, besides the system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// Accept any server certificate. Only for tests; warned about.
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

fn default_name() -> String {
    "http".to_owned()
}
fn default_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn default_max_body_bytes() -> ByteSize {
    ByteSize(1 << 20)
}
fn default_requests_in_flight() -> usize {
    8
}

impl HttpConfig {
    /// An entry with `url` and every default.
    pub fn new(url: impl Into<String>) -> Self {
        HttpConfig {
            name: default_name(),
            filter: None,
            url: url.into(),
            format: HttpFormat::default(),
            timeout: default_timeout(),
            connect_timeout: default_connect_timeout(),
            max_body_bytes: default_max_body_bytes(),
            requests_in_flight: default_requests_in_flight(),
            headers: BTreeMap::new(),
            health_url: None,
            auth: HttpAuth::default(),
            tls: HttpTls::default(),
        }
    }

    fn invalid(&self, index: usize, key: &str, message: impl Into<String>) -> SinkConfigError {
        SinkConfigError::Invalid {
            index,
            name: self.name.clone(),
            key: key.to_owned(),
            message: message.into(),
        }
    }

    fn parse_url(
        &self,
        index: usize,
        key: &str,
        url: &str,
    ) -> Result<reqwest::Url, SinkConfigError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| self.invalid(index, key, format!("{url:?} is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(self.invalid(
                index,
                key,
                format!("{url:?}: the scheme must be http:// or https:// (is it missing?)"),
            ));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(self.invalid(
                index,
                key,
                "credentials in the URL are refused (they would be logged); use [sinks.auth]",
            ));
        }
        Ok(parsed)
    }

    /// The default headers of every request: authentication and `headers`.
    fn header_map(&self, index: usize) -> Result<HeaderMap, Vec<SinkConfigError>> {
        let mut map = HeaderMap::new();
        let mut problems = Vec::new();
        for (name, value) in &self.headers {
            let key = format!("headers.{name}");
            let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
                problems.push(self.invalid(index, &key, "not a valid HTTP header name"));
                continue;
            };
            if RESERVED_HEADERS.contains(&header.as_str()) || header.as_str().starts_with("ce-") {
                problems.push(self.invalid(
                    index,
                    &key,
                    "the sink sets this header itself (Content-Type, Content-Length, Host, Transfer-Encoding, and ce-* where it sends CloudEvents)",
                ));
                continue;
            }
            if header == reqwest::header::AUTHORIZATION && self.auth.is_set() {
                problems.push(self.invalid(
                    index,
                    &key,
                    "set either headers.Authorization or [sinks.auth], not both",
                ));
                continue;
            }
            match HeaderValue::from_str(value.expose()) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    map.insert(header, v);
                }
                Err(_) => problems.push(self.invalid(
                    index,
                    &key,
                    "the value has characters a header cannot carry (control characters, newlines)",
                )),
            }
        }
        let auth = match (
            &self.auth.bearer_token,
            &self.auth.username,
            &self.auth.password,
        ) {
            (Some(token), None, None) => {
                Some(("auth.bearer_token", format!("Bearer {}", token.expose())))
            }
            (None, Some(user), Some(_)) if user.contains(':') => {
                problems.push(self.invalid(
                    index,
                    "auth.username",
                    "a basic authentication user name cannot contain ':' (RFC 7617)",
                ));
                None
            }
            (None, Some(user), Some(password)) => {
                let pair = format!("{user}:{}", password.expose());
                let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
                Some(("auth.password", format!("Basic {encoded}")))
            }
            (None, None, None) => None,
            (Some(_), _, _) => {
                problems.push(self.invalid(
                    index,
                    "auth",
                    "set bearer_token or username/password, not both",
                ));
                None
            }
            (None, Some(_), None) => {
                problems.push(self.invalid(index, "auth.password", "username needs a password"));
                None
            }
            (None, None, Some(_)) => {
                problems.push(self.invalid(index, "auth.username", "password needs a username"));
                None
            }
        };
        if let Some((key, value)) = auth {
            match HeaderValue::from_str(&value) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    map.insert(reqwest::header::AUTHORIZATION, v);
                }
                Err(_) => problems.push(self.invalid(
                    index,
                    key,
                    "the value has characters a header cannot carry",
                )),
            }
        }
        if problems.is_empty() {
            Ok(map)
        } else {
            Err(problems)
        }
    }

    /// Every problem of the entry that can be seen without building it.
    fn problems(&self, index: usize) -> Vec<SinkConfigError> {
        let mut out = Vec::new();
        match self.parse_url(index, "url", &self.url) {
            Err(e) => out.push(e),
            Ok(u)
                if u.scheme() == "http"
                    && (self.tls.cert_file.is_some() || self.tls.ca_file.is_some()) =>
            {
                out.push(self.invalid(
                    index,
                    "tls",
                    "TLS files are set but url is http://; use https://",
                ));
            }
            Ok(_) => {}
        }
        if let Some(h) = &self.health_url {
            if let Err(e) = self.parse_url(index, "health_url", h) {
                out.push(e);
            }
        }
        if self.max_body_bytes.0 < MIN_BODY_BYTES {
            out.push(self.invalid(
                index,
                "max_body_bytes",
                format!(
                    "{} bytes is below the minimum of 16 KiB",
                    self.max_body_bytes.0
                ),
            ));
        }
        if !(1..=256).contains(&self.requests_in_flight) {
            out.push(self.invalid(
                index,
                "requests_in_flight",
                format!("{} is outside 1 to 256", self.requests_in_flight),
            ));
        }
        for (key, d) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if d.get().is_zero() {
                out.push(self.invalid(index, key, "must be greater than 0"));
            }
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            out.push(self.invalid(
                index,
                "tls",
                "cert_file and key_file go together (mutual TLS)",
            ));
        }
        if let Err(e) = self.header_map(index) {
            out.extend(e);
        }
        out
    }

    /// Builds the sink: the client (roots, client certificate, timeouts) and its headers.
    /// Nothing is connected: a receiver that is down is the pipeline's to retry.
    ///
    /// # Errors
    /// The first problem [`Destination::validate`] reports, or a TLS file that cannot be read
    /// or parsed, naming the key.
    pub fn build_sink(&self, index: usize) -> Result<HttpSink, SinkConfigError> {
        if let Some(e) = self.problems(index).into_iter().next() {
            return Err(e);
        }
        let url = self.parse_url(index, "url", &self.url)?;
        let health_url = match &self.health_url {
            Some(h) => Some(self.parse_url(index, "health_url", h)?),
            None => None,
        };
        let client = self.client(index)?;
        Ok(HttpSink::new(Settings {
            name: self.name.clone(),
            client,
            url,
            health_url,
            format: self.format,
            max_body_bytes: self.max_body_bytes.bytes(),
            requests_in_flight: self.requests_in_flight,
        }))
    }

    /// The HTTP client of this entry: timeouts, default headers (authentication and
    /// `headers`), TLS roots and client certificate, no redirects. The OTLP destination builds its
    /// client with it too.
    ///
    /// # Errors
    /// A header that cannot be sent, or a TLS file that cannot be read or parsed, naming the
    /// key.
    pub fn client(&self, index: usize) -> Result<reqwest::Client, SinkConfigError> {
        let mut client = reqwest::Client::builder()
            .use_rustls_tls()
            .user_agent(concat!("kubesink/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(self.connect_timeout.get())
            .timeout(self.timeout.get())
            .default_headers(self.header_map(index).map_err(|mut e| e.remove(0))?)
            // A redirect would re-send the body somewhere the configuration does not name.
            .redirect(reqwest::redirect::Policy::none());
        if let Some(ca) = &self.tls.ca_file {
            let pem = read(self, index, "tls.ca_file", ca)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                self.invalid(
                    index,
                    "tls.ca_file",
                    format!("{}: not PEM certificates: {e}", ca.display()),
                )
            })?;
            if certs.is_empty() {
                return Err(self.invalid(
                    index,
                    "tls.ca_file",
                    format!("{}: holds no certificate", ca.display()),
                ));
            }
            for c in certs {
                client = client.add_root_certificate(c);
            }
        }
        if let (Some(cert), Some(key)) = (&self.tls.cert_file, &self.tls.key_file) {
            let mut pem = read(self, index, "tls.cert_file", cert)?;
            pem.push(b'\n');
            pem.extend(read(self, index, "tls.key_file", key)?);
            let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                self.invalid(
                    index,
                    "tls.cert_file",
                    format!(
                        "{} with {}: not a PEM certificate and key: {e}",
                        cert.display(),
                        key.display()
                    ),
                )
            })?;
            client = client.identity(identity);
        }
        if self.tls.insecure_skip_verify {
            client = client.danger_accept_invalid_certs(true);
        }
        client
            .build()
            .map_err(|e| self.invalid(index, "tls", format!("the HTTP client cannot be made: {e}")))
    }
}

fn read(
    c: &HttpConfig,
    index: usize,
    key: &str,
    path: &PathBuf,
) -> Result<Vec<u8>, SinkConfigError> {
    std::fs::read(path).map_err(|e| c.invalid(index, key, format!("{}: {e}", path.display())))
}

impl HttpAuth {
    fn is_set(&self) -> bool {
        self.bearer_token.is_some() || self.username.is_some() || self.password.is_some()
    }
}

#[async_trait]
impl Destination for HttpConfig {
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
        HttpConfig {
            filter: Some(r#"ns == "payments""#.into()),
            headers: BTreeMap::from([("X-Team".to_owned(), Secret::new("platform"))]),
            health_url: Some("https://receiver.example/healthz".into()),
            auth: HttpAuth {
                bearer_token: Some(Secret::new("token")),
                username: Some("kubesink".into()),
                password: Some(Secret::new("password")),
            },
            tls: HttpTls {
                ca_file: Some("/etc/kubesink/ca.pem".into()),
                cert_file: Some("/etc/kubesink/client.pem".into()),
                key_file: Some("/etc/kubesink/client-key.pem".into()),
                insecure_skip_verify: false,
            },
            ..HttpConfig::new("https://receiver.example/events")
        }
    }

    fn validate(&self, index: usize) -> Vec<SinkConfigError> {
        self.problems(index)
    }

    fn warnings(&self, index: usize) -> Vec<String> {
        let mut out = Vec::new();
        let plain = self.url.starts_with("http://");
        let secret_header = self
            .headers
            .keys()
            .any(|h| h.eq_ignore_ascii_case("authorization"));
        if plain && (self.auth.is_set() || secret_header) {
            out.push(format!(
                "sinks[{index}] ({}): url: credentials are sent over plain http:// (anyone on the path reads them); use https://",
                self.name
            ));
        }
        if self.tls.insecure_skip_verify {
            out.push(format!(
                "sinks[{index}] ({}): tls.insecure_skip_verify: the receiver's certificate is not verified (anyone on the path can read and answer)",
                self.name
            ));
        }
        out
    }

    fn files(&self) -> Vec<(String, PathBuf)> {
        [
            ("tls.ca_file", &self.tls.ca_file),
            ("tls.cert_file", &self.tls.cert_file),
            ("tls.key_file", &self.tls.key_file),
        ]
        .into_iter()
        .filter_map(|(k, p)| p.clone().map(|p| (k.to_owned(), p)))
        .collect()
    }

    async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        Ok(Arc::new(self.build_sink(index)?))
    }
}
