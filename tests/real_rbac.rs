//! `kubesink rbac` on the real RBAC authorizer (`--authorization-mode=Node,RBAC`): kubesink
//! run as a ServiceAccount bound to exactly that output (its token from the TokenRequest
//! API) works, Lease included; with any one permission of it taken away, `kubesink check
//! --online` names what is missing (as that ServiceAccount, and as the admin with `--as`),
//! and `kubesink run` reports the 403 naming the resource.

use kubesink_test_support::{self as support, kube_server, process};

use std::path::Path;
use std::time::Duration;

use kube_server::{create, live_state, namespace, ControlPlane};
use process::{resource_toml, Kubesink, STDOUT_SINK};
use serde_json::{json, Value};
use support::{fold_equals, run_kubesink, try_wait_until, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
/// kubesink's own namespace (its ServiceAccount, its Lease).
const HOME: &str = "rbac-home";
const SA: &str = "kubesink";

fn write_config(dir: &Path, kubeconfig: &Path) -> std::path::PathBuf {
    let resources = [
        resource_toml("v1", "Pod", &[]),
        resource_toml("apps/v1", "Deployment", &[]),
        resource_toml("v1", "ConfigMap", &["rbac-a", "rbac-b"]),
    ]
    .concat();
    let rest = format!(
        "[leader_election]\nenabled = true\nlease_name = \"kubesink-rbac\"\nlease_namespace = \"{HOME}\"\n[pipeline]\nlinger = \"20ms\"\n{resources}{STDOUT_SINK}"
    );
    process::write_config(dir, "real", kubeconfig, &rest)
}

/// The YAML documents of `kubesink rbac`, as JSON.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("---\n")
        .filter(|d| d.lines().any(|l| l.starts_with("kind:")))
        .map(|d| serde_saphyr::from_str::<Value>(d).expect("kubesink rbac YAML"))
        .collect()
}

/// Creates `doc`, or replaces it (the same name) when it exists.
async fn apply(client: &kube::Client, doc: &Value) {
    let api = doc["apiVersion"].as_str().expect("apiVersion");
    let kind = doc["kind"].as_str().expect("kind");
    let ns = doc["metadata"]["namespace"].as_str();
    let name = doc["metadata"]["name"].as_str().expect("name");
    let dynamic = kube_server::dynamic(client, api, kind, ns).await;
    match dynamic.get_opt(name).await.expect("get") {
        Some(existing) => {
            let mut obj: kube::api::DynamicObject =
                serde_json::from_value(doc.clone()).expect("object");
            obj.metadata.resource_version = existing.metadata.resource_version;
            dynamic
                .replace(name, &Default::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("replace {kind} {name}: {e}"));
        }
        None => {
            create(client, doc.clone()).await;
        }
    }
}

/// `kubesink check --online` with `args`: (exit code, stdout + stderr).
async fn check_online(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["check", "--online", "--config"];
    let config = config.display().to_string();
    all.push(&config);
    all.extend(args);
    let run = run_kubesink(&all, b"").await;
    (run.code, format!("{}{}", run.stdout, run.stderr))
}

/// Every (document index, rule index, resource, verb) of the Roles and ClusterRoles.
fn permissions(docs: &[Value]) -> Vec<(usize, usize, String, String)> {
    let mut out = Vec::new();
    for (d, doc) in docs.iter().enumerate() {
        if !matches!(doc["kind"].as_str(), Some("Role" | "ClusterRole")) {
            continue;
        }
        for (r, rule) in doc["rules"].as_array().into_iter().flatten().enumerate() {
            for res in rule["resources"].as_array().into_iter().flatten() {
                for verb in rule["verbs"].as_array().into_iter().flatten() {
                    out.push((
                        d,
                        r,
                        res.as_str().unwrap_or_default().to_owned(),
                        verb.as_str().unwrap_or_default().to_owned(),
                    ));
                }
            }
        }
    }
    out
}

/// `docs[d]` with `verb` on `resource` taken out of rule `r` (the rest kept).
fn without(docs: &[Value], d: usize, r: usize, resource: &str, verb: &str) -> Value {
    let mut doc = docs[d].clone();
    let rule = doc["rules"][r].clone();
    let others: Vec<Value> = rule["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| *x != resource)
        .cloned()
        .collect();
    let verbs: Vec<Value> = rule["verbs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| *x != verb)
        .cloned()
        .collect();
    // The resource keeps its other verbs; the other resources keep every verb.
    let mut rules: Vec<Value> = doc["rules"].as_array().cloned().unwrap_or_default();
    rules.remove(r);
    if !others.is_empty() {
        let mut keep = rule.clone();
        keep["resources"] = Value::Array(others);
        rules.push(keep);
    }
    if !verbs.is_empty() {
        let mut narrowed = rule;
        narrowed["resources"] = json!([resource]);
        narrowed["verbs"] = Value::Array(verbs);
        rules.push(narrowed);
    }
    doc["rules"] = Value::Array(rules);
    doc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubesink_rbac_is_sufficient_and_minimal_on_the_real_authorizer() {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    let admin = cp.admin().await;
    for ns in [HOME, "rbac-a", "rbac-b"] {
        namespace(cp, ns, json!({})).await;
    }
    for ns in ["rbac-a", "rbac-b"] {
        create(
            &admin,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "settings", "namespace": ns}, "data": {"a": "b"}}),
        )
        .await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sa_kubeconfig = cp.service_account_kubeconfig(HOME, SA, dir.path()).await;
    let config = write_config(dir.path(), &sa_kubeconfig);
    let admin_config_dir = tempfile::tempdir().expect("tempdir");
    let admin_config = write_config(admin_config_dir.path(), &cp.admin_kubeconfig);

    // Without any RBAC: check --online fails, naming the missing permissions.
    let (code, out) = check_online(&config, &[]).await;
    assert_eq!(code, Some(1), "{out}");

    let rbac = run_kubesink(
        &[
            "rbac",
            "--config",
            &config.display().to_string(),
            "--namespace",
            HOME,
            "--service-account",
            SA,
            "--name",
            "kubesink-rbac",
        ],
        b"",
    )
    .await;
    assert_eq!(rbac.code, Some(0), "{}", rbac.stderr);
    let docs = documents(&rbac.stdout);
    assert!(docs.len() >= 4, "{}", rbac.stdout);
    for doc in &docs {
        apply(&admin, doc).await;
    }
    // Sufficient: check --online passes as the ServiceAccount, and as the admin `--as` it.
    let sa_user = format!("system:serviceaccount:{HOME}:{SA}");
    wait_until(
        "check --online to pass with kubesink rbac applied",
        LONG,
        || async {
            let (code, out) = check_online(&config, &[]).await;
            (code == Some(0)).then_some(()).ok_or(out)
        },
    )
    .await;
    let (code, out) = check_online(&admin_config, &["--as", &sa_user]).await;
    assert_eq!(code, Some(0), "--as {sa_user}: {out}");

    // ... and `run` as it lists, watches and leads: the fold equals the API server.
    let k = Kubesink::start(BIN, &config, dir.path(), "rbac", &[]);
    wait_until(
        "kubesink as the ServiceAccount to fold the ConfigMaps",
        LONG,
        || async {
            let live = live_state(&admin, &[("v1", "ConfigMap")], |o| {
                o.metadata
                    .namespace
                    .as_deref()
                    .is_some_and(|n| n == "rbac-a" || n == "rbac-b")
            })
            .await;
            let folded = fold_equals(&live, &k.messages(), Expect::STRICT, |key| {
                key.0 == "ConfigMap"
            });
            match folded {
                Ok(_) if k.stderr().contains("became the leader") => Ok(()),
                Ok(_) => Err(format!("not the leader yet\n{}", k.stderr())),
                Err(diff) => Err(format!("{diff}\n{}", k.stderr())),
            }
        },
    )
    .await;
    k.terminate().await;

    // Minimal: take each permission away in turn; check --online must name it.
    let perms = permissions(&docs);
    assert!(perms.len() >= 9, "{perms:?}");
    for (d, r, resource, verb) in &perms {
        let narrowed = without(&docs, *d, *r, resource, verb);
        apply(&admin, &narrowed).await;
        let what = format!(
            "without {verb} on {resource} ({} {})",
            docs[*d]["kind"], docs[*d]["metadata"]["name"]
        );
        let failed = try_wait_until(LONG, || async {
            let (code, out) = check_online(&config, &[]).await;
            (code == Some(1)).then_some(out.clone()).ok_or(out)
        })
        .await
        .unwrap_or_else(|out| {
            panic!("check --online passed {what}: the permission is not needed:\n{out}")
        });
        // `FAIL real v1/Pod (…): list denied`, `Lease ns/name: update denied`.
        let singular = resource.trim_end_matches('s').to_lowercase();
        let named = failed.lines().filter(|l| l.starts_with("FAIL")).any(|l| {
            let l = l.to_lowercase();
            l.contains(verb.as_str()) && l.contains(&singular)
        });
        assert!(
            named,
            "check --online {what} does not name {verb} on {resource}:\n{failed}"
        );
        // --as says the same.
        let (code, out) = check_online(&admin_config, &["--as", &sa_user]).await;
        assert_eq!(code, Some(1), "--as {what}: {out}");
        eprintln!(
            "ok   {what}: {}",
            failed
                .lines()
                .find(|l| l.starts_with("FAIL"))
                .unwrap_or_default()
        );
        apply(&admin, &docs[*d]).await;
    }

    // `run` without watch on pods: the 403 is reported, naming the resource.
    let (d, r, resource, verb) = perms
        .iter()
        .find(|(_, _, res, verb)| res == "pods" && verb == "watch")
        .expect("watch pods is granted");
    apply(&admin, &without(&docs, *d, *r, resource, verb)).await;
    wait_until("check --online to see watch pods denied", LONG, || async {
        let (code, out) = check_online(&config, &[]).await;
        (code == Some(1)).then_some(()).ok_or(out)
    })
    .await;
    let k = Kubesink::start(BIN, &config, dir.path(), "rbac-denied", &[]);
    wait_until("kubesink to report the 403 on pods", LONG, || async {
        let log = k.stderr();
        log.lines()
            .any(|l| l.contains("403") && l.contains("Pod"))
            .then_some(())
            .ok_or(log)
    })
    .await;
    drop(k);
    apply(&admin, &docs[*d]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_online_on_real_discovery_names_a_misspelt_kind_a_bad_selector_and_a_denied_namespace(
) {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    let admin = cp.admin().await;
    for ns in ["check-home", "check-ok", "check-denied"] {
        namespace(cp, ns, json!({})).await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sa_kubeconfig = cp
        .service_account_kubeconfig("check-home", "checker", dir.path())
        .await;
    // The ServiceAccount may list and watch Services everywhere (so the selector reaches the
    // API server) and ConfigMaps in check-ok only.
    for doc in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "checker-services"},
            "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "checker-services"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "checker-services"},
            "subjects": [{"kind": "ServiceAccount", "name": "checker", "namespace": "check-home"}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "cm-reader", "namespace": "check-ok"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "cm-reader", "namespace": "check-ok"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "checker", "namespace": "check-home"}]}),
    ] {
        apply(&admin, &doc).await;
    }
    let write = |kubeconfig: &Path, name: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                r#"[cluster]
name = "real"
kubeconfig = {:?}
[[resources]]
api_version = "apps/v1"
kind = "Deploymnet"
[[resources]]
api_version = "v1"
kind = "Service"
label_selector = "tier in (web"
[[resources]]
api_version = "v1"
kind = "ConfigMap"
namespaces = ["check-ok", "check-denied"]
[[sinks]]
type = "stdout"
"#,
                kubeconfig.display().to_string()
            ),
        )
        .expect("config");
        path
    };
    let as_sa = write(&sa_kubeconfig, "sa.toml");
    let as_admin = write(&cp.admin_kubeconfig, "admin.toml");
    let expect = |out: &str, who: &str| {
        let fails: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
        assert!(
            fails
                .iter()
                .any(|l| l.contains("Deploymnet") && l.contains("did you mean \"Deployment\"")),
            "{who}: the misspelt kind:\n{out}"
        );
        assert!(
            fails
                .iter()
                .any(|l| l.contains("Service") && l.contains("tier in (web")),
            "{who}: the selector the API server rejects:\n{out}"
        );
        assert!(
            fails.iter().any(|l| l.contains("ConfigMap")
                && l.contains("denied in namespace check-denied")
                && !l.contains("denied in namespace check-ok")),
            "{who}: the denied namespace:\n{out}"
        );
    };
    wait_until("the Role to be in force", LONG, || async {
        let (code, out) = check_online(&as_sa, &[]).await;
        (code == Some(1)
            && !out.lines().any(|l| {
                l.starts_with("FAIL") && l.contains("check-ok") && !l.contains("check-denied")
            }))
        .then_some(())
        .ok_or(out)
    })
    .await;
    let (code, out) = check_online(&as_sa, &[]).await;
    assert_eq!(code, Some(1), "{out}");
    expect(&out, "as the ServiceAccount");
    let (code, out) = check_online(
        &as_admin,
        &["--as", "system:serviceaccount:check-home:checker"],
    )
    .await;
    assert_eq!(code, Some(1), "{out}");
    expect(&out, "as the admin --as the ServiceAccount");
    // The admin itself may do everything: only the kind and the selector fail.
    let (code, out) = check_online(&as_admin, &[]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        !out.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("ConfigMap")),
        "{out}"
    );
}
