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

use crate::config::{Cluster, ResourceConfig};

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
    /// API discovery failed: the kind is not served, or the API server did not answer.
    #[error("{resource}: API discovery failed: {source}{}", if is_transient(source) { "" } else { "; is the CRD installed and the apiVersion right?" })]
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
    if let Some(user) = user {
        config.auth_info.impersonate = Some(user.to_owned());
    }
    if config.accept_invalid_certs {
        tracing::warn!(
            server = %config.cluster_url,
            "TLS verification of the API server is turned off (insecure-skip-tls-verify in the kubeconfig): its identity is not checked; set certificate-authority instead"
        );
    }
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
