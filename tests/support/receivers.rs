//! What `tests/http.rs` and `tests/otlp.rs` share: the real receivers' directory and the
//! objects their churn creates.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

/// The receivers' directory (`ce-receiver`, `otelcol`): `RECEIVERS_BIN_DIR`, else what
/// `scripts/receivers-build.sh` prints (it builds when needed).
pub fn bin() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("RECEIVERS_BIN_DIR") {
            return PathBuf::from(dir);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/receivers-build.sh");
        let out = Command::new(&script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{} failed: these tests need Go",
            script.display()
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// A Deployment the ReplicaSet controller fills with `replicas` Pods (Recreate: no kubelet
/// makes a Pod ready here).
pub fn deployment(ns: &str, name: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}
            }
        }
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
