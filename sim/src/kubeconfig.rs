//! Writes a kubeconfig (as JSON, which YAML parsers accept) pointing at the simulator over
//! plain HTTP with no credentials, so kube-rs (`Config::from_custom_kubeconfig`,
//! `KUBECONFIG=`) and `kubectl --kubeconfig` can talk to it
//! (<https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/>).

use serde_json::{json, Value};

/// Name used for the cluster, user and context entries.
pub const CONTEXT_NAME: &str = "kubesink-sim";

/// The kubeconfig document for a server at `url` ("http://127.0.0.1:PORT"), with
/// `current-context` set and default namespace "default".
pub fn kubeconfig(url: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT_NAME, "cluster": {"server": url}}],
        "users": [{"name": CONTEXT_NAME, "user": {}}],
        "contexts": [{"name": CONTEXT_NAME, "context": {"cluster": CONTEXT_NAME, "user": CONTEXT_NAME, "namespace": "default"}}],
        "current-context": CONTEXT_NAME,
        "preferences": {}
    })
}
