//! A real 410 Gone and a real connection reset, from a real kube-apiserver, with kubesink
//! behind a TCP proxy that can cut it off:
//! - cut off while objects are created, changed and deleted and etcd compacts past its
//!   resourceVersion (the watch cache off: the watch reaches etcd), or while the API server
//!   restarts (the watch cache on, and new: it starts after kubesink's resourceVersion): the
//!   watch kubesink resumes gets 410 Gone, it relists, sends exactly what changed meanwhile
//!   (the deletes inferred, `finalStateUnknown`) and nothing else;
//! - a watch connection reset mid-stream resumes from the last resourceVersion seen: no
//!   relist, no object re-sent as `added`, nothing lost (an object's updates may be sent
//!   coalesced, so their count is bounded, not exact).

use kubesink_test_support::{self as support, kube_server, process, proxy};

use std::collections::BTreeSet;
use std::time::Duration;

use kube_server::{configmap, create, delete, live_state, patch_configmap, ControlPlane, Options};
use process::{resource_toml, Kubesink, STDOUT_SINK};
use proxy::Proxy;
use serde_json::{json, Value};
use support::{fold_equals, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "gone";

async fn start(options: Options) -> ControlPlane {
    tokio::task::spawn_blocking(move || ControlPlane::start(options))
        .await
        .expect("control plane")
}

/// The API server, 40 ConfigMaps in namespace `gone`, a proxy in front, and kubesink through
/// it, synced.
struct Setup {
    cp: ControlPlane,
    proxy: Proxy,
    k: Kubesink,
    _dir: tempfile::TempDir,
}

async fn setup(options: Options) -> Setup {
    let cp = start(options).await;
    let client = cp.admin().await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )
    .await;
    for i in 0..40 {
        create(
            &client,
            configmap(NS, &format!("cm-{i:02}"), json!({"i": i.to_string()})),
        )
        .await;
    }
    let proxy = Proxy::start(([127, 0, 0, 1], cp.port).into()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("proxied.kubeconfig");
    cp.write_admin_kubeconfig_via(&kubeconfig, proxy.addr);
    let configmaps = resource_toml("v1", "ConfigMap", &[NS]);
    let rest = format!(
        "[pipeline]\nlinger = \"20ms\"\nsync_markers = true\n[watch]\nretry_initial_backoff = \"100ms\"\nretry_max_backoff = \"1s\"\n{configmaps}{STDOUT_SINK}"
    );
    let config = process::write_config(dir.path(), "real", &kubeconfig, &rest);
    let k = Kubesink::start(BIN, &config, dir.path(), "gone", &[]);
    let s = Setup {
        cp,
        proxy,
        k,
        _dir: dir,
    };
    s.converged().await;
    s
}

impl Setup {
    /// Waits until the fold equals the live ConfigMaps (uid and resourceVersion); returns
    /// their number.
    async fn converged(&self) -> usize {
        let client = self.cp.admin().await;
        wait_until("the fold to equal the API server", LONG, || async {
            let live = live_state(&client, &[("v1", "ConfigMap")], |o| {
                o.metadata.namespace.as_deref() == Some(NS)
            })
            .await;
            fold_equals(&live, &self.k.messages(), Expect::STRICT, |_| true)
                .map_err(|diff| format!("{diff}\nkubesink stderr:\n{}", self.k.stderr()))
        })
        .await
    }

    /// While kubesink is cut off: 5 deletes, 5 updates, 5 creates; returns the names of each.
    async fn changes(&self) -> [BTreeSet<String>; 3] {
        let client = self.cp.admin().await;
        let mut out = [BTreeSet::new(), BTreeSet::new(), BTreeSet::new()];
        for i in 0..5 {
            let name = format!("cm-{i:02}");
            delete(&client, "v1", "ConfigMap", Some(NS), &name).await;
            out[0].insert(name);
            let name = format!("cm-{:02}", 10 + i);
            patch_configmap(&client, NS, &name, json!({"i": "changed"})).await;
            out[1].insert(name);
            let name = format!("new-{i}");
            create(
                &client,
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": NS}}),
            )
            .await;
            out[2].insert(name);
        }
        out
    }
}

/// The messages after the first `from`, object changes only (no sync markers).
fn changes_after(k: &Kubesink, from: usize) -> Vec<Value> {
    k.messages()
        .into_iter()
        .skip(from)
        .filter(|m| m["op"] != "synced")
        .collect()
}

fn names(msgs: &[Value], op: &str, inferred: bool) -> BTreeSet<String> {
    msgs.iter()
        .filter(|m| m["op"] == op && m["finalStateUnknown"].as_bool().unwrap_or(false) == inferred)
        .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The checks after a real 410: exactly the changes, the deletes inferred, a relist logged.
async fn assert_relisted_exactly(s: &Setup, before: usize, changed: &[BTreeSet<String>; 3]) {
    assert_eq!(s.converged().await, 40);
    let sent = changes_after(&s.k, before);
    let [deleted, updated, created] = changed;
    assert_eq!(
        &names(&sent, "deleted", true),
        deleted,
        "inferred deletes: {sent:#?}"
    );
    assert_eq!(&names(&sent, "updated", false), updated, "{sent:#?}");
    assert_eq!(&names(&sent, "added", false), created, "{sent:#?}");
    assert_eq!(sent.len(), 15, "nothing else is sent: {sent:#?}");
    assert!(
        sent.iter().all(|m| m["initial"] != true),
        "a relist sends differences, not initial: {sent:#?}"
    );
    let log = s.k.stderr();
    assert!(
        log.contains("(410 Gone)") && log.contains("vanished=5"),
        "the 410 Gone and the relist's 5 inferred deletes are logged:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_while_etcd_compacts_past_its_resource_version_gets_410_and_infers_the_deletes() {
    // No watch cache: the watch kubesink resumes is served from etcd, which answers a
    // compacted revision with 410 Gone.
    let mut s = setup(Options {
        apiserver_args: vec!["--watch-cache=false".into()],
        ..Default::default()
    })
    .await;
    let before = s.k.count();
    s.proxy.stop();
    let changed = s.changes().await;
    let revision = s.cp.compact_etcd();
    eprintln!("etcd compacted at revision {revision}");
    s.proxy.resume().await;
    assert_relisted_exactly(&s, before, &changed).await;
    s.k.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_while_the_api_server_restarts_gets_410_from_its_new_watch_cache() {
    // The watch cache on (the default): a restarted API server's cache begins after
    // kubesink's resourceVersion, so the watch it resumes is too old for it.
    let mut s = setup(Options::default()).await;
    let before = s.k.count();
    s.proxy.stop();
    let changed = s.changes().await;
    let cp = &s.cp;
    tokio::task::block_in_place(|| cp.restart_apiserver());
    s.proxy.resume().await;
    assert_relisted_exactly(&s, before, &changed).await;
    s.k.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reset_mid_stream_resumes_from_the_last_resource_version() {
    let s = setup(Options::default()).await;
    let client = s.cp.admin().await;
    let before = s.k.count();
    // Changes before, across and after a few resets: every one arrives once, in order.
    for round in 0..4 {
        for i in 0..5 {
            patch_configmap(
                &client,
                NS,
                &format!("cm-{:02}", 20 + i),
                json!({"round": round.to_string()}),
            )
            .await;
        }
        s.proxy.reset();
    }
    assert_eq!(s.converged().await, 40);
    let sent = changes_after(&s.k, before);
    // Coalescing may merge two rounds of one object: at most 20 updates, at least the last
    // of each, and nothing but those five objects.
    let touched: BTreeSet<String> = sent
        .iter()
        .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(touched.len(), 5, "{sent:#?}");
    assert!(sent.iter().all(|m| m["op"] == "updated"), "{sent:#?}");
    assert!(sent.len() <= 20, "{sent:#?}");
    let log = s.k.stderr();
    assert!(
        !log.contains("relist"),
        "a reset within the watch cache's window needs no relist:\n{log}"
    );
}
