//! The deploy kit against the binary: the RBAC checked into `deploy/` is exactly what
//! `kubesink rbac` prints for the configuration beside it, with the flags' defaults matching
//! `deploy/base`; and `kubesink rbac` fails with the key on a bad configuration.
//! (scripts/check-deploy.sh checks the rendered manifests: schemas, Pod Security, compose.)

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn kubesink_rbac(args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("KUBESINK_") {
            c.env_remove(k);
        }
    }
    c.arg("rbac").args(args).output().unwrap()
}

fn assert_rbac_file_is_generated(dir: &str, extra: &[&str]) {
    let config = format!("{ROOT}/{dir}/kubesink.toml");
    let mut args = vec!["--config", config.as_str()];
    args.extend_from_slice(extra);
    let out = kubesink_rbac(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubesink rbac failed: {stderr}");
    let file = Path::new(ROOT).join(dir).join("rbac.yaml");
    let committed = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        committed,
        "{} is not `kubesink rbac {}`: regenerate it",
        file.display(),
        args.join(" ")
    );
}

#[test]
fn base_rbac_yaml_is_kubesink_rbac_of_the_base_config_with_default_flags() {
    assert_rbac_file_is_generated("deploy/base", &[]);
    let committed = std::fs::read_to_string(format!("{ROOT}/deploy/base/rbac.yaml")).unwrap();
    // What the base needs, and only that: a ClusterRole for the four default kinds and the
    // Lease of [leader_election].
    assert!(committed.contains("kind: ClusterRole\n"));
    assert!(
        committed.contains("  - nodes\n  - pods\n  - services\n  verbs:\n  - list\n  - watch\n")
    );
    assert!(committed.contains("  resourceNames:\n  - kubesink\n  resources:\n  - leases\n"));
    assert!(
        !committed.contains("- get\n  - list"),
        "no get on watched resources"
    );
}

#[test]
fn sidecar_rbac_yaml_is_a_namespaced_role_for_the_apps_service_account() {
    assert_rbac_file_is_generated(
        "deploy/overlays/sidecar",
        &["--namespace", "shop", "--service-account", "shop-app"],
    );
    let committed =
        std::fs::read_to_string(format!("{ROOT}/deploy/overlays/sidecar/rbac.yaml")).unwrap();
    assert!(!committed.contains("ClusterRole"), "{committed}");
    assert!(
        !committed.contains("leases"),
        "no leader election in a sidecar"
    );
}

#[test]
fn rbac_on_a_bad_config_exits_1_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "[[resources]]\napi_version = \"v1\"\nkind = \"Node\"\nnamespaces = [\"default\"]\n",
    )
    .unwrap();
    let out = kubesink_rbac(&["--config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr,
        "resources.0.namespaces: v1 Node is cluster-scoped; remove the namespaces list\n"
    );
    std::fs::write(
        &file,
        "[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\npage_size = 0\n",
    )
    .unwrap();
    let out = kubesink_rbac(&["--config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("resources.0.page_size: must be at least 1 (from file ")
            && stderr.contains("bad.toml)"),
        "{stderr}"
    );
}
