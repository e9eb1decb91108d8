//! The deploy kit against a real kube-apiserver's own validation (schemas, admission, the
//! flowcontrol API's rules): every kustomization of `deploy/` applied with a server-side dry
//! run (`kubectl apply --server-side --dry-run=server`, the namespaces created for real
//! first), the API Priority and Fairness component included; and the Helm chart installed,
//! upgraded and uninstalled with Helm's own engine (`scripts/helm_checks.py real`, PyPI
//! helm-python-sdk from the deploy checks' venv) for every set of values the offline checks
//! render.

use kubesink_test_support::kube_server;

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&[u8]>) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(ROOT)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl must be on PATH (scripts/test.sh installs it)");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write stdin");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("kubectl");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The namespaces a rendered manifest's objects live in.
fn namespaces(yaml: &str) -> Vec<String> {
    let mut out: Vec<String> = yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("namespace: "))
        .map(|s| s.trim().trim_matches('"').to_owned())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `to` relative to the directory `from` (both absolute): kustomize takes relative paths only.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (a, b): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..a.len() {
        out.push("..");
    }
    for c in &b[common..] {
        out.push(c);
    }
    out
}

#[test]
fn every_kustomization_is_accepted_by_the_real_api_server() {
    let cp = kube_server::shared();
    let kc = &cp.admin_kubeconfig;
    let dir = tempfile::tempdir().expect("tempdir");
    // The flowcontrol component as a user adds it (scripts/check-deploy.sh does the same).
    let overlay = dir.path().join("apf");
    std::fs::create_dir_all(&overlay).expect("dir");
    let deploy = relative(&overlay, &Path::new(ROOT).join("deploy"));
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: platform\nnamePrefix: acme-\nresources:\n  - {0}/base\ncomponents:\n  - {0}/components/flowcontrol\n",
            deploy.display()
        ),
    )
    .expect("kustomization");
    let targets: Vec<PathBuf> = [
        "base",
        "overlays/kafka",
        "overlays/nats",
        "overlays/scale-out",
        "overlays/sidecar",
    ]
    .iter()
    .map(|o| Path::new(ROOT).join("deploy").join(o))
    .chain([overlay])
    .collect();
    for target in &targets {
        let rendered = Command::new("kubectl")
            .arg("kustomize")
            .arg(target)
            .output()
            .expect("kubectl kustomize");
        assert!(
            rendered.status.success(),
            "kubectl kustomize {}: {}",
            target.display(),
            String::from_utf8_lossy(&rendered.stderr)
        );
        let yaml = String::from_utf8_lossy(&rendered.stdout).into_owned();
        for ns in namespaces(&yaml) {
            // Another rendering may have created it already; any other failure is one.
            let (ok, out) = kubectl(kc, &["create", "namespace", &ns], None);
            assert!(
                ok || out.contains("AlreadyExists"),
                "kubectl create namespace {ns}: {out}"
            );
        }
        let (ok, out) = kubectl(
            kc,
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                // Objects the chart test installed for real may share names (and field
                // managers): only the server's validation is asked for here.
                "--force-conflicts",
                "--field-manager=kubesink-tests",
                "-f",
                "-",
            ],
            Some(yaml.as_bytes()),
        );
        assert!(
            ok,
            "{} refused by the real API server:\n{out}",
            target.display()
        );
        let objects = out
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count();
        assert!(objects >= 5, "{}: {out}", target.display());
        eprintln!(
            "ok   {}: {objects} objects accepted (server dry run)",
            target.display()
        );
    }
}

#[test]
fn the_helm_chart_installs_upgrades_and_uninstalls_on_the_real_api_server() {
    let python = kubesink_test_support::deploy_python();
    let cp = kube_server::shared();
    let out = Command::new(&python)
        .arg(Path::new(ROOT).join("scripts/helm_checks.py"))
        .arg("real")
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
    assert!(text.matches("ok   helm uninstall").count() >= 5, "{text}");
}
