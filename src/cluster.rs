//! The connection to the Kubernetes API server and API discovery of configured resources.
//!
//! Client: `cluster.kubeconfig` (+ `cluster.context`) when set; else in-cluster service
//! account when `KUBERNETES_SERVICE_HOST` is set; else `KUBECONFIG` / `~/.kube/config`
//! (+ `cluster.context`). TLS verification stays as the kubeconfig says (on by default); a
//! kubeconfig that turns it off (`insecure-skip-tls-verify: true`) gets a warning at start.
//! Never logs a credential: tokens and client keys stay inside kube's client.

use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{pinned_kind, Scope};
use kube::{Client, Config};
use kubesink_core::Resource;

use crate::config::{Cluster, GroupSelector, ResourceConfig, ServedKind};

/// Why the cluster could not be reached or a resource resolved.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig could not be read or used. Its Display says why in full (kube's error
    /// and its causes, each once), so the error has no `source()` to print again.
    #[error("{key} {path}: {}", describe_kubeconfig(error))]
    Kubeconfig {
        /// The configuration key: `cluster.kubeconfig` or `clusters.N.kubeconfig` (with
        /// `(unset)` when the default was used).
        key: String,
        /// The file (or `KUBECONFIG / ~/.kube/config`).
        path: String,
        /// kube's error.
        error: kube::config::KubeconfigError,
    },
    /// The in-cluster service account could not be used.
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    /// Building the HTTP client failed (TLS material...). Its Display says why in full
    /// ([`describe_client`]), so the error has no `source()` to print again.
    #[error("building the Kubernetes client: {}", describe_client(.0))]
    Client(kube::Error),
    /// API discovery failed: the kind is not served, or the API server did not answer.
    #[error("{resource}: API discovery failed: {}{}", describe_discovery(resource, source), if is_transient(source) { "" } else { "; is the CRD installed and the apiVersion right?" })]
    Discovery {
        /// `apiVersion Kind`.
        resource: String,
        /// kube's error.
        source: kube::Error,
    },
    /// Namespaces listed for a cluster-scoped kind.
    #[error("{resource} is cluster-scoped; remove its namespaces list")]
    ClusterScoped {
        /// `apiVersion Kind`.
        resource: String,
    },
}

impl ClusterError {
    /// Whether time can fix it (the API server unreachable, overloaded or failing), as
    /// opposed to the kind not being served or a configuration mistake.
    pub fn is_transient(&self) -> bool {
        match self {
            ClusterError::Discovery { source, .. } => is_transient(source),
            _ => false,
        }
    }

    /// Whether the API server answered 404 (the kind is not served: a CRD not installed).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ClusterError::Discovery {
                source: kube::Error::Discovery(_),
                ..
            }
        ) || matches!(self, ClusterError::Discovery { source: kube::Error::Api(s), .. } if s.code == 404)
    }
}

/// Builds the kube client per the module rules.
///
/// # Errors
/// [`ClusterError`] naming the kubeconfig path or the in-cluster problem.
pub async fn client(cfg: &Cluster) -> Result<Client, ClusterError> {
    client_as(cfg, None).await
}

/// [`client`], impersonating `user` when given (the `Impersonate-User` header, as `kubectl
/// --as`; the API server authorizes each request for that user, and the client's own
/// identity needs the `impersonate` verb on it). `kubesink check --online --as` uses it.
///
/// # Errors
/// As [`client`].
pub async fn client_as(cfg: &Cluster, user: Option<&str>) -> Result<Client, ClusterError> {
    let options = KubeConfigOptions {
        context: cfg.context.clone(),
        ..Default::default()
    };
    let config = if let Some(path) = &cfg.kubeconfig {
        let kc_err = |error| ClusterError::Kubeconfig {
            key: cfg.kubeconfig_key(),
            path: path.display().to_string(),
            error,
        };
        let kc = Kubeconfig::read_from(path).map_err(kc_err)?;
        Config::from_custom_kubeconfig(kc, &options)
            .await
            .map_err(kc_err)?
    } else if cfg.context.is_none() && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        Config::incluster()?
    } else {
        Config::from_kubeconfig(&options)
            .await
            .map_err(|error| ClusterError::Kubeconfig {
                key: format!("{} (unset)", cfg.kubeconfig_key()),
                path: "KUBECONFIG / ~/.kube/config".to_owned(),
                error,
            })?
    };
    // kubesink handles 429 and 5xx itself: counted, logged once, `Retry-After` honoured,
    // backed off per watch. kube's own retry layer would hide them.
    let mut config = config;
    config.default_retry = false;
    if let Some(user) = user {
        config.auth_info.impersonate = Some(user.to_owned());
    }
    if config.accept_invalid_certs {
        tracing::warn!(
            server = %config.cluster_url,
            "TLS verification of the API server is turned off (insecure-skip-tls-verify in the kubeconfig): its identity is not checked; set certificate-authority instead"
        );
    }
    build(config).map_err(ClusterError::Client)
}

/// The bytes the HTTP/1 connection of a watch reads at a time into its buffer (hyper's
/// `http1_read_buf_exact_size`; by default hyper adapts it up to ~408 KiB). hyper grows a
/// connection's read buffer while reads fill it (a streaming list's initial events do) and
/// never shrinks it, so every watch kept the buffer of its initial list for its life: with
/// Pods and Deployments, most of each cluster's ~1.3 MiB at rest (measured with `cargo bench
/// --bench cluster_cost` and heaptrack; `BENCHMARKS.md`, "Many clusters in one process").
/// 16 KiB reads carry a streaming list at full speed (decoding, not reading, is the cost),
/// and the API server's response heads (well under 1 KiB) fit.
pub const READ_BUFFER: usize = 16 * 1024;

/// kube's client stack as `Client::try_from` builds it (kube 5: TLS per the kubeconfig,
/// connect/read/write timeouts, base URI, authentication, extra headers), with the HTTP/1
/// read buffer of [`READ_BUFFER`]; a cluster URL with `http://` gets no TLS connector (kube
/// builds one anyway, and without a CA in the kubeconfig it loads the system's trust store,
/// ~90 KiB per client, for a connection that never uses it). A kubeconfig with a proxy
/// (`proxy-url`) gets kube's own stack unchanged, which knows how to reach one.
///
/// # Errors
/// kube's, when the TLS material or the credentials cannot be used.
fn build(config: Config) -> Result<Client, kube::Error> {
    use kube::client::ConfigExt;
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    if config.cluster_url.scheme() == Some(&http::uri::Scheme::HTTP) {
        return stack(&config, http);
    }
    let https = config.rustls_https_connector_with_connector(http)?;
    stack(&config, https)
}

/// The client over `connector` (plain or TLS), as [`build`] says.
fn stack<C>(config: &Config, connector: C) -> Result<Client, kube::Error>
where
    C: tower::Service<http::Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read
        + hyper::rt::Write
        + hyper_util::client::legacy::connect::Connection
        + Send
        + Unpin
        + 'static,
    C::Future: Send + 'static,
    C::Error: Into<tower::BoxError>,
{
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;
    let mut connector = hyper_timeout::TimeoutConnector::new(connector);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http_client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http1_read_buf_exact_size(READ_BUFFER)
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// A configured resource resolved through API discovery.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Identity shared by every message of this resource.
    pub resource: Arc<Resource>,
    /// kube's type information for `Api<DynamicObject>`.
    pub api_resource: kube::discovery::ApiResource,
}

/// Resolves `res` of cluster `cluster` with `/api/v1` or `/apis/{group}/{version}`
/// discovery, once. The caller retries ([`ClusterError::is_transient`] tells whether time can
/// help).
///
/// # Errors
/// [`ClusterError::Discovery`] or [`ClusterError::ClusterScoped`].
pub async fn resolve(
    client: &Client,
    cluster: &str,
    res: &ResourceConfig,
) -> Result<Resolved, ClusterError> {
    let (group, version) = res.group_version();
    let gvk = kube::api::GroupVersionKind::gvk(group, version, &res.kind);
    let (ar, caps) = pinned_kind(client, &gvk)
        .await
        .map_err(|source| ClusterError::Discovery {
            resource: res.display_name(),
            source,
        })?;
    if let Some(plural) = res.plural.as_deref().filter(|p| *p != ar.plural) {
        tracing::warn!(
            resource = %res.display_name(),
            configured = plural,
            discovered = %ar.plural,
            "the configured plural differs from API discovery; RBAC generated by `kubesink rbac` names the wrong resource"
        );
    }
    let namespaced = matches!(caps.scope, Scope::Namespaced);
    if !namespaced && !res.namespaces.is_empty() {
        return Err(ClusterError::ClusterScoped {
            resource: res.display_name(),
        });
    }
    Ok(Resolved {
        resource: Arc::new(
            Resource::new(
                cluster,
                &ar.group,
                &ar.version,
                &ar.kind,
                &ar.plural,
                namespaced,
            )
            .with_events(res.mode == crate::config::ResourceMode::Events),
        ),
        api_resource: ar,
    })
}

/// The kinds a group-form resource (`selector`, of entry `res`) follows now: those API
/// discovery serves in its group (or every group), each at the group's preferred version
/// (else its newest: kube's `recommended_resources`), that can be listed and watched and
/// that `selector` takes ([`GroupSelector::follows`]); of a kind one server serves under
/// two groups (`GROUP_ALIASES`: core Events are events.k8s.io's), only the group it
/// belongs to when both are taken. One request with aggregated discovery (Kubernetes 1.30
/// and later), else one per group version. Sorted by group and kind.
///
/// # Errors
/// [`ClusterError::Discovery`] when the server does not answer (the caller retries).
pub async fn discover_kinds(
    client: &Client,
    res: &ResourceConfig,
    selector: &GroupSelector,
) -> Result<Vec<Discovered>, ClusterError> {
    use kube::discovery::{verbs, Discovery};
    let discovery = || match selector.discovery_group() {
        Some(g) => Discovery::new(client.clone()).filter(&[g]),
        None => Discovery::new(client.clone()),
    };
    let discovered = match discovery().run_aggregated().await {
        Ok(d) => d,
        Err(_) => discovery()
            .run()
            .await
            .map_err(|source| ClusterError::Discovery {
                resource: res.display_name(),
                source,
            })?,
    };
    let mut kinds: Vec<Discovered> = discovered
        .groups()
        .flat_map(|g| g.recommended_resources())
        .filter_map(|(ar, caps)| {
            let namespaced = matches!(caps.scope, Scope::Namespaced);
            let follows = !ar.plural.contains('/')
                && caps.supports_operation(verbs::LIST)
                && caps.supports_operation(verbs::WATCH)
                && selector.follows(ServedKind {
                    group: &ar.group,
                    kind: &ar.kind,
                    plural: &ar.plural,
                    namespaced,
                });
            follows.then_some(Discovered {
                api_resource: ar,
                namespaced,
            })
        })
        .collect();
    let taken: Vec<(String, String)> = kinds
        .iter()
        .map(|k| (k.api_resource.group.clone(), k.api_resource.kind.clone()))
        .collect();
    kinds.retain(|k| {
        let ar = &k.api_resource;
        !crate::config::GROUP_ALIASES
            .iter()
            .any(|(alias, kind, canonical)| {
                *alias == ar.group
                    && *kind == ar.kind
                    && taken.iter().any(|(g, kk)| g == canonical && kk == kind)
            })
    });
    kinds.sort_by(|a, b| {
        let (a, b) = (&a.api_resource, &b.api_resource);
        (&a.group, &a.kind).cmp(&(&b.group, &b.kind))
    });
    Ok(kinds)
}

/// One kind [`discover_kinds`] found.
#[derive(Clone, Debug)]
pub struct Discovered {
    /// kube's type information (group, version, kind, plural).
    pub api_resource: kube::discovery::ApiResource,
    /// Namespace-scoped (kube's `ApiResource` does not say).
    pub namespaced: bool,
}

impl Discovered {
    /// Its group and Kind, what identifies it across versions.
    pub fn group_kind(&self) -> (&str, &str) {
        (&self.api_resource.group, &self.api_resource.kind)
    }

    /// It as [`resolve`] would have resolved it in cluster `cluster`.
    pub fn resolved(&self, cluster: &str) -> Resolved {
        let ar = &self.api_resource;
        Resolved {
            resource: Arc::new(Resource::new(
                cluster,
                &ar.group,
                &ar.version,
                &ar.kind,
                &ar.plural,
                self.namespaced,
            )),
            api_resource: ar.clone(),
        }
    }
}

/// `e` and its sources, each written once (kube's errors often repeat their source, and
/// often say only `client error (SendRequest)` without them: the cause is in the chain).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    // The API server's answer in its own words (kube prints the whole `Status` in Rust's
    // debug form, escaped quotes and all, which buries e.g. a 403 on the Lease).
    if let Some(kube::Error::Api(s)) = e.downcast_ref::<kube::Error>() {
        return format!("{} {}: {}", s.code, s.reason, s.message);
    }
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A kubeconfig error in words, after the key and path that name the file: kube's "failed to
/// read kubeconfig from '\"PATH\"'" repeats the path in doubled quotes, then its cause twice.
fn describe_kubeconfig(e: &kube::config::KubeconfigError) -> String {
    match e {
        kube::config::KubeconfigError::ReadConfig(io, _) => format!("cannot be read: {io}"),
        // The YAML parser quotes the offending line, and a kubeconfig holds tokens and keys:
        // say only where, never repeat the line (it may hold a token).
        kube::config::KubeconfigError::Parse(p) => match p.location() {
            Some(at) => format!(
                "is not a valid kubeconfig: YAML error at line {}, column {} (the file's text is not repeated: it holds credentials)",
                at.line(),
                at.column()
            ),
            None => "is not a valid kubeconfig: YAML error (the file's text is not repeated: it holds credentials)".to_owned(),
        },
        other => error_chain(other),
    }
}

/// A client-building error in words. A client certificate of X.509 version 1 (what
/// `openssl x509 -req` makes without an extension file) is refused by rustls, kube's TLS
/// (webpki reads version 3 only: "invalid private key: invalid peer certificate:
/// UnsupportedCertVersion"), while kubectl's Go TLS takes it: say so and how to re-issue
/// it. The rest as [`error_chain`].
fn describe_client(e: &kube::Error) -> String {
    let chain = error_chain(e);
    if chain.contains("UnsupportedCertVersion") {
        return "the kubeconfig user's client certificate (client-certificate or client-certificate-data) is X.509 version 1, which kube's TLS (rustls) refuses although kubectl accepts it; re-issue it as version 3: sign the CSR with an extension file, e.g. `openssl x509 -req -in user.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -out user.crt -extfile <(printf 'basicConstraints=CA:FALSE\\nkeyUsage=digitalSignature\\nextendedKeyUsage=clientAuth')`, or have the cluster sign it (a CertificateSigningRequest for signer kubernetes.io/kube-apiserver-client issues version 3)".to_owned();
    }
    chain
}

/// A discovery error in words: kube says a kind is missing with Rust's debug output of the
/// `GroupVersionKind`; this names the kind and the `apiVersion` instead (`resource` is
/// `apiVersion Kind`). The rest as [`error_chain`].
fn describe_discovery(resource: &str, source: &kube::Error) -> String {
    use kube::error::DiscoveryError;
    match source {
        kube::Error::Discovery(DiscoveryError::MissingKind(_)) => {
            let (api_version, kind) = resource.rsplit_once(' ').unwrap_or(("", resource));
            format!("kind {kind:?} is not served by {api_version}")
        }
        other => error_chain(other),
    }
}

fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::Discovery(_) => false,
        _ => true,
    }
}

/// One kube client per cluster, in order (what `Bridge::start_built` takes beside them),
/// or why it could not be built ([`ClusterError`] names the cluster's kubeconfig key).
pub async fn clients(clusters: &[Cluster]) -> Vec<Result<Client, ClusterError>> {
    let mut clients = Vec::with_capacity(clusters.len());
    for c in clusters {
        clients.push(client(c).await);
    }
    clients
}

/// The clients of `clusters` as [`clients`] built them, checked for a start: every cluster
/// failing (one cluster alone included) stops it, naming the first error; one failing among
/// others is logged and left to the bridge, which retries it.
///
/// # Errors
/// The first [`ClusterError`] when no client could be built.
pub fn usable(
    clusters: &[Cluster],
    clients: Vec<Result<Client, ClusterError>>,
) -> Result<Vec<Result<Client, ClusterError>>, ClusterError> {
    if clients.iter().all(Result::is_err) {
        if let Some(Err(e)) = clients.into_iter().next() {
            return Err(e);
        }
        return Ok(Vec::new());
    }
    for (c, r) in clusters.iter().zip(&clients) {
        if let Err(e) = r {
            tracing::error!(cluster = %c.name, error = %e, "this cluster's client cannot be built: its watches wait, retried with the [watch] backoff (/readyz names them); the other clusters run");
        }
    }
    Ok(clients)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_that_cannot_be_read_is_named_once_with_its_cause_once() {
        let e = ClusterError::Kubeconfig {
            key: "clusters.1.kubeconfig".into(),
            path: "/nonexistent/a".into(),
            error: kube::config::KubeconfigError::ReadConfig(
                std::io::Error::from(std::io::ErrorKind::NotFound),
                "/nonexistent/a".into(),
            ),
        };
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "clusters.1.kubeconfig /nonexistent/a: cannot be read: entity not found"
        );
    }

    #[test]
    fn a_kind_not_served_is_named_in_words_not_in_rust_debug_output() {
        let gvk = kube::api::GroupVersionKind::gvk("apps", "v1", "Deploymnet");
        let e = ClusterError::Discovery {
            resource: "apps/v1 Deploymnet".into(),
            source: kube::Error::Discovery(kube::error::DiscoveryError::MissingKind(format!(
                "{gvk:?}"
            ))),
        };
        assert_eq!(
            e.to_string(),
            "apps/v1 Deploymnet: API discovery failed: kind \"Deploymnet\" is not served by apps/v1; is the CRD installed and the apiVersion right?"
        );
    }
}
