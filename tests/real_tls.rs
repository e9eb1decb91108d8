//! Client certificates on a real kube-apiserver: one that is X.509 version 1 (what
//! `openssl x509 -req` makes without an extension file, and kubectl accepts) is refused by
//! rustls, which kube's client uses; `check --online` and `run` say what is wrong with it
//! and how to re-issue it, once, naming the kubeconfig and its user.

use kubesink_test_support::{self as support, kube_server, process};

use std::path::Path;

use kube_server::{openssl, write_kubeconfig, ControlPlane, User};
use process::{resource_toml, STDOUT_SINK};

/// Signs `dir/v1.csr` with the control plane's CA into `dir/{out}`, with the extension
/// file `ext` when given (without one, openssl makes X.509 version 1).
fn sign(cp: &ControlPlane, dir: &Path, out: &str, ext: Option<&str>) {
    let ca = |f: &str| cp.pki.dir.join(f).display().to_string();
    let (ca_crt, ca_key) = (ca("ca.crt"), ca("ca.key"));
    let mut args = vec![
        "x509",
        "-req",
        "-in",
        "v1.csr",
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-CAserial",
        "v1.srl",
        "-days",
        "2",
        "-out",
        out,
    ];
    if let Some(ext) = ext {
        args.extend(["-extfile", ext]);
    }
    openssl(dir, &args);
}

/// Writes `dir/v1.kubeconfig` for the control plane, authenticating with `dir/{cert}` and
/// the key of the CSR.
fn kubeconfig(cp: &ControlPlane, dir: &Path, cert: &str) -> std::path::PathBuf {
    let pem = |p: &Path| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).expect("pem"))
    };
    let path = dir.join("v1.kubeconfig");
    write_kubeconfig(
        &path,
        &format!("https://127.0.0.1:{}", cp.port),
        &pem(&cp.pki.dir.join("ca.crt")),
        User::Cert {
            cert: pem(&dir.join(cert)),
            key: pem(&dir.join("v1.key")),
        },
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_client_certificate_is_named_with_how_to_reissue_it() {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // `CN=kubesink-v1, O=system:masters`, signed without extensions: X.509 version 1.
    openssl(
        dir.path(),
        &[
            "req",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            "v1.key",
            "-out",
            "v1.csr",
            "-subj",
            "/O=system:masters/CN=kubesink-v1",
        ],
    );
    sign(cp, dir.path(), "v1.crt", None);
    let v1 = kubeconfig(cp, dir.path(), "v1.crt");
    let rest = format!(
        "{}{STDOUT_SINK}",
        resource_toml("v1", "ConfigMap", &["default"])
    );
    let config = process::write_config(dir.path(), "v1-cert", &v1, &rest);
    let config_arg = config.display().to_string();
    let said = "the kubeconfig user's client certificate (client-certificate or client-certificate-data) is X.509 version 1, which kube's TLS (rustls) refuses although kubectl accepts it; re-issue it as version 3";
    let check = support::run_kubesink(&["check", "--online", "--config", &config_arg], b"").await;
    let out = format!("{}{}", check.stdout, check.stderr);
    assert_eq!(check.code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "FAIL v1-cert: cannot connect, nothing checked: building the Kubernetes client: {said}"
        )),
        "{out}"
    );
    assert!(!out.contains("UnsupportedCertVersion"), "{out}");
    // `run` refuses to start with the same words, once.
    let run = support::run_kubesink(&["run", "--config", &config_arg], b"").await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(run.stderr.matches(said).count(), 1, "{}", run.stderr);

    // The advice works: the same CSR signed with the extension file the message gives.
    std::fs::write(
        dir.path().join("v3.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .expect("ext");
    sign(cp, dir.path(), "v3.crt", Some("v3.ext"));
    kubeconfig(cp, dir.path(), "v3.crt");
    let check = support::run_kubesink(&["check", "--online", "--config", &config_arg], b"").await;
    assert_eq!(check.code, Some(0), "{}{}", check.stdout, check.stderr);
}
