//! The release as it ships, against a real kube-apiserver: the image scripts/image.sh built,
//! pushed to a registry and pulled back (its unpacked root and `release.env`), and the chart it
//! pushed and pulled with Helm's engine.
//!
//! - The image's binary runs as the image's user (`chroot --userspec`, the user and binary
//!   path from deploy/image.env), seeing only the image's files: its shared libraries, CA
//!   bundle and passwd entry, plus the kubeconfig and configuration copied in (as a Pod's
//!   mounts would be). `kubesink check` passes, `kubesink run` with the stdout sink sends the
//!   `added` of a ConfigMap this test creates after it started, its process runs as that
//!   user, and SIGTERM stops it with exit code 0.
//! - The pulled chart installs into the real API server with the image pinned by digest:
//!   the Deployment's image is `REPOSITORY:TAG@DIGEST` of the pushed image and its
//!   `app.kubernetes.io/version` the image's tag (`scripts/helm_checks.py install-pulled`,
//!   PyPI helm-python-sdk from the deploy checks' venv).
//!
//! Needs `scripts/image.sh` to have run (scripts/test.sh runs it before `cargo test`): it
//! writes `$RELEASE_IMAGE_DIR` (default `${CARGO_TARGET_DIR:-target}/image`); and root, for
//! chroot.

use kubesink_test_support::{kube_server, process, wait_until};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const NS: &str = "release-image";
const WAIT: Duration = Duration::from_secs(120);

/// `KEY=VALUE` lines (deploy/image.env, release.env); `#` comments and blank lines skipped.
fn key_values(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// What scripts/image.sh wrote: `release.env` of `$RELEASE_IMAGE_DIR`, else of the default
/// directory; a missing one fails the test saying how to make it (as tests/real_deploy.rs
/// does for the deploy checks' venv).
fn release() -> BTreeMap<String, String> {
    let dir = std::env::var_os("RELEASE_IMAGE_DIR").map_or_else(
        || {
            std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| Path::new(ROOT).join("target"), PathBuf::from)
                .join("image")
        },
        PathBuf::from,
    );
    let env = dir.join("release.env");
    assert!(
        env.exists(),
        "{} is missing: `scripts/image.sh` builds the image, pushes and pulls it and the chart, and writes it (scripts/test.sh runs it before cargo test)",
        env.display()
    );
    key_values(&env)
}

fn facts() -> BTreeMap<String, String> {
    key_values(&Path::new(ROOT).join("deploy/image.env"))
}

/// Copies `from` to `to` readable by every user (the image's user reads it; the kubeconfig's
/// key is the test control plane's).
fn copy_readable(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_as_its_user_against_the_real_api_server() {
    let (release, facts) = (release(), facts());
    let (user, binary) = (&facts["IMAGE_USER"], &facts["IMAGE_BINARY"]);
    let cp = kube_server::shared_async().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // A copy of the pulled root per run, so the files a Pod would have mounted can be added
    // without changing what scripts/image.sh unpacked.
    let root = dir.path().join("root");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&release["IMAGE_ROOT"])
        .arg(&root)
        .status()
        .expect("cp");
    assert!(copied.success(), "cp -a {}", release["IMAGE_ROOT"]);
    let etc = root.join("etc/kubesink");
    std::fs::create_dir_all(&etc).expect("mkdir");
    copy_readable(&cp.admin_kubeconfig, &etc.join("kubeconfig"));
    let config = process::write_config(
        dir.path(),
        "real-image",
        Path::new("/etc/kubesink/kubeconfig"),
        &format!(
            "{}{}",
            process::resource_toml("v1", "ConfigMap", &[NS]),
            process::STDOUT_SINK
        ),
    );
    copy_readable(&config, &etc.join("kubesink.toml"));
    // The image's binary as its user, in its root: a wrapper the process helper starts like
    // the binary itself (`exec`: the pid it signals is kubesink's).
    let chroot = ["/usr/sbin/chroot", "/usr/bin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chroot (coreutils)");
    let wrapper = dir.path().join("kubesink-in-image");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {chroot} --userspec={user} {} {binary} \"$@\"\n",
            root.display()
        ),
    )
    .expect("wrapper");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let check = process::clean_command(&wrapper)
        .args(["check", "--config", "/etc/kubesink/kubesink.toml"])
        .output()
        .await
        .expect("kubesink check in the image");
    assert!(
        check.status.success(),
        "kubesink check in the image (chroot needs root):\n{}",
        String::from_utf8_lossy(&check.stderr)
    );

    kube_server::namespace(cp, NS, json!({})).await;
    let kubesink = process::Kubesink::start(
        wrapper.to_str().expect("utf-8 path"),
        Path::new("/etc/kubesink/kubesink.toml"),
        dir.path(),
        "image",
        &[],
    );
    let client = cp.admin().await;
    kube_server::create(
        &client,
        kube_server::configmap(NS, "from-the-image", json!({"shipped": "yes"})),
    )
    .await;
    let message = wait_until(
        "the added of the ConfigMap from the image's kubesink",
        WAIT,
        || async {
            kubesink
                .messages()
                .into_iter()
                .find(|m| m["name"] == "from-the-image" && m["op"] == "added")
                .ok_or_else(|| {
                    format!(
                        "{} messages; stderr:\n{}",
                        kubesink.count(),
                        kubesink.stderr()
                    )
                })
        },
    )
    .await;
    assert_eq!(message["cluster"], "real-image", "{message}");
    assert_eq!(message["namespace"], NS, "{message}");
    assert_eq!(message["object"]["data"]["shipped"], "yes", "{message}");
    // The process that sent it (the wrapper's shell and chroot exec'd into it) is the image's
    // binary, run as the image's user.
    let pid = kubesink.pid();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("/proc/PID/exe");
    assert_eq!(
        exe,
        root.join(binary.trim_start_matches('/')),
        "the running binary"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let uid = user.split(':').next().expect("uid");
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line");
    assert!(
        uids.split_whitespace().all(|u| u == uid),
        "kubesink runs as uids {uids}, not the image's {uid}"
    );
    kubesink.terminate().await;
    eprintln!(
        "ok   {} ({} bytes) ran as {user} in its root against the real API server",
        release["IMAGE_REF"], release["IMAGE_SIZE"]
    );
}

#[test]
fn the_pulled_chart_installs_with_the_image_pinned_by_digest() {
    let (release, python) = (release(), kubesink_test_support::deploy_python());
    let cp = kube_server::shared();
    let out = Command::new(&python)
        .arg(Path::new(ROOT).join("scripts/helm_checks.py"))
        .arg("install-pulled")
        .arg(&release["CHART_TGZ"])
        .arg(&release["IMAGE_REF"])
        .arg(&cp.admin_kubeconfig)
        .output()
        .expect("helm_checks.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("the Deployment runs {}", release["IMAGE_REF"])),
        "{text}"
    );
}
