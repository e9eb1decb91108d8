//! What `tests/http.rs` and `tests/otlp.rs` share: the real receivers' directory and the
//! objects their churn creates.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{json, Value};

/// The receivers' directory (`ce-receiver`, `otelcol`): `RECEIVERS_BIN_DIR`, else what
/// `scripts/receivers-build.sh` prints (it builds when needed).
pub fn bin() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        crate::kube_server::built_dir(
            "RECEIVERS_BIN_DIR",
            "scripts/receivers-build.sh",
            "these tests need Go",
        )
    })
}

/// A ConfigMap holding `n`.
pub fn configmap(ns: &str, name: &str, n: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns}, "data": {"n": n.to_string()}})
}

/// The kinds both tests watch and fold.
pub const KINDS: &[(&str, &str)] = &[
    ("v1", "Pod"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "ReplicaSet"),
    ("v1", "ConfigMap"),
];

/// `[[resources]]` of [`KINDS`] limited to namespace `ns`.
pub fn resources(ns: &str) -> String {
    KINDS
        .iter()
        .map(|(a, k)| {
            format!("[[resources]]\napi_version = {a:?}\nkind = {k:?}\nnamespaces = [{ns:?}]\n")
        })
        .collect()
}
