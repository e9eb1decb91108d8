//! The connection to the Kubernetes API server and API discovery of configured resources.
//!
//! Client: `cluster.kubeconfig` (+ `cluster.context`) when set; else in-cluster service
//! account when `KUBERNETES_SERVICE_HOST` is set; else `KUBECONFIG` / `~/.kube/config`
//! (+ `cluster.context`). TLS verification stays as the kubeconfig says (on by default).

use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{pinned_kind, Scope};
use kube::{Client, Config};
use kubesink_sinks::Resource;

use crate::config::{ClusterConfig, ResourceConfig};

/// Why the cluster could not be reached or a resource resolved.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig could not be read or used.
    #[error("cluster.kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file (or `KUBECONFIG / ~/.kube/config`).
        path: String,
        /// kube's error.
        source: kube::config::KubeconfigError,
    },
    /// The in-cluster service account could not be used.
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    /// Building the HTTP client failed (TLS material...).
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// API discovery could not be done now (connection failure, 429, 5xx: the API server
    /// or an aggregated API is starting or failing); worth retrying.
    #[error("resources.{index} ({resource}): API discovery failed: {source}")]
    DiscoveryUnavailable {
        /// Position in `resources`.
        index: usize,
        /// `apiVersion Kind`.
        resource: String,
        /// kube's error.
        source: kube::Error,
    },
    /// API discovery does not know the kind.
    #[error("resources.{index} ({resource}): not served by the API server (API discovery: {source}); is the CRD installed and the apiVersion right?")]
    UnknownKind {
        /// Position in `resources`.
        index: usize,
        /// `apiVersion Kind`.
        resource: String,
        /// kube's error.
        source: kube::Error,
    },
    /// Namespaces listed for a cluster-scoped kind.
    #[error(
        "resources.{index}.namespaces: {resource} is cluster-scoped; remove the namespaces list"
    )]
    ClusterScoped {
        /// Position in `resources`.
        index: usize,
        /// `apiVersion Kind`.
        resource: String,
    },
}

/// Builds the kube client per the module rules.
///
/// # Errors
/// [`ClusterError`] naming the kubeconfig path or the in-cluster problem.
pub async fn client(cfg: &ClusterConfig) -> Result<Client, ClusterError> {
    let options = KubeConfigOptions {
        context: cfg.context.clone(),
        ..Default::default()
    };
    let config = if let Some(path) = &cfg.kubeconfig {
        let kc_err = |source| ClusterError::Kubeconfig {
            path: path.display().to_string(),
            source,
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
            .map_err(|source| ClusterError::Kubeconfig {
                path: "KUBECONFIG / ~/.kube/config".to_owned(),
                source,
            })?
    };
    // kubesink handles 429 and 5xx itself: counted, logged once, `Retry-After` honoured,
    // backed off per watch. kube's own retry layer would hide them.
    let mut config = config;
    config.default_retry = false;
    Client::try_from(config).map_err(ClusterError::Client)
}

/// A configured resource resolved through API discovery.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Identity shared by every message of this resource.
    pub resource: Arc<Resource>,
    /// kube's type information for `Api<DynamicObject>`.
    pub api_resource: kube::discovery::ApiResource,
}

impl ClusterError {
    /// Whether trying again later may succeed ([`ClusterError::DiscoveryUnavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, ClusterError::DiscoveryUnavailable { .. })
    }
}

/// Resolves `res` (entry `index`) of cluster `cluster` with one `/api/v1` or
/// `/apis/{group}/{version}` discovery request. The caller retries transient failures
/// (the bridge does, in the background, while the other resources run).
///
/// # Errors
/// [`ClusterError::DiscoveryUnavailable`] for a connection failure, 429 or 5xx;
/// [`ClusterError::UnknownKind`] for a kind the server does not serve;
/// [`ClusterError::ClusterScoped`] for namespaces listed for a cluster-scoped kind.
pub async fn resolve(
    client: &Client,
    cluster: &str,
    index: usize,
    res: &ResourceConfig,
) -> Result<Resolved, ClusterError> {
    let (group, version) = match res.api_version.split_once('/') {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (String::new(), res.api_version.clone()),
    };
    let gvk = kube::api::GroupVersionKind::gvk(&group, &version, &res.kind);
    let (ar, caps) = pinned_kind(client, &gvk).await.map_err(|source| {
        let resource = res.display_name();
        if is_transient(&source) {
            ClusterError::DiscoveryUnavailable {
                index,
                resource,
                source,
            }
        } else {
            ClusterError::UnknownKind {
                index,
                resource,
                source,
            }
        }
    })?;
    let namespaced = matches!(caps.scope, Scope::Namespaced);
    if !namespaced && !res.namespaces.is_empty() {
        return Err(ClusterError::ClusterScoped {
            index,
            resource: res.display_name(),
        });
    }
    Ok(Resolved {
        resource: Arc::new(Resource::new(
            cluster,
            &ar.group,
            &ar.version,
            &ar.kind,
            &ar.plural,
            namespaced,
        )),
        api_resource: ar,
    })
}

fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::Discovery(_) => false,
        _ => true,
    }
}
