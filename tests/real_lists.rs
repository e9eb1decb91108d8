//! How kubesink reads a real kube-apiserver's state, counted by the API server itself
//! (`apiserver_request_total`): with `watch.initial_list = "auto"` on this v1.37 server,
//! paged LISTs from the watch cache, for JSON and for metadata read in protobuf alike (the
//! shape cheaper for the server), with no streaming list tried; with `initial_list =
//! "stream"`, a streaming list (KEP-3157 `WatchList`) with no LIST request at all; and a
//! continue token that expires mid-list (etcd compacted between two pages: 410 Gone on the
//! next page), after which the list starts over and the fold is still exact. (A server
//! without streaming lists, found out by `auto` on its own, is the simulator's to show:
//! `tests/streaming.rs`; on this version `auto` does not try.)
//!
//! Each test runs its own API server (no controller-manager: nothing else lists), on the test
//! binary's etcd under a key prefix of its own.

use kubesink_test_support::{self as support, kube_server, process};

use std::time::Duration;

use kube_server::{configmap, create, live_state, ControlPlane, Options};
use process::{resource_toml, Kubesink, STDOUT_SINK};
use serde_json::json;
use support::{fold_equals, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);

async fn start(options: Options) -> ControlPlane {
    tokio::task::spawn_blocking(move || ControlPlane::start(options))
        .await
        .expect("control plane")
}

/// Creates `n` ConfigMaps in a new namespace `ns` (no controller-manager here: no
/// ServiceAccount wait is needed for ConfigMaps).
async fn config_maps(cp: &ControlPlane, ns: &str, n: usize) {
    let client = cp.admin().await;
    create(
        &client,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    for i in 0..n {
        create(
            &client,
            configmap(ns, &format!("cm-{i:04}"), json!({"i": i.to_string()})),
        )
        .await;
    }
}

fn write_config(
    dir: &std::path::Path,
    cp: &ControlPlane,
    ns: &str,
    watch: &str,
    resource: &str,
) -> std::path::PathBuf {
    let configmaps = resource_toml("v1", "ConfigMap", &[ns]);
    let rest = format!(
        "[pipeline]\nlinger = \"20ms\"\nsync_markers = true\n[watch]\n{watch}\n{configmaps}{resource}\n{STDOUT_SINK}"
    );
    process::write_config(dir, "real", &cp.admin_kubeconfig, &rest)
}

/// Waits until kubesink's fold equals the live ConfigMaps of `ns`, uid and resourceVersion.
async fn converged(cp: &ControlPlane, k: &Kubesink, ns: &str) -> usize {
    let client = cp.admin().await;
    wait_until("the fold to equal the API server", LONG, || async {
        let live = live_state(&client, &[("v1", "ConfigMap")], |o| {
            o.metadata.namespace.as_deref() == Some(ns)
        })
        .await;
        fold_equals(&live, &k.messages(), Expect::STRICT, |_| true)
            .map_err(|diff| format!("{diff}\nkubesink stderr:\n{}", k.stderr()))
    })
    .await
}

/// The sync marker of the initial list arrived.
async fn synced(k: &Kubesink) {
    wait_until("the initial list's sync marker", LONG, || async {
        k.messages()
            .iter()
            .any(|m| m["op"] == "synced" && m["initial"] == true)
            .then_some(())
            .ok_or_else(|| k.stderr())
    })
    .await;
}

/// Starts a kubesink on the ConfigMaps of `ns` with `resource`'s settings and waits for its
/// initial sync; with it (and the directory it runs in, kept while it runs) the LIST requests
/// of ConfigMaps the API server counted from before its start to its sync marker. Counted
/// before the test's own LISTs and while the watch runs: a request is counted in
/// `apiserver_request_total` when it ends, so a running watch is not among them.
async fn synced_counting_lists(
    cp: &ControlPlane,
    ns: &str,
    watch: &str,
    resource: &str,
) -> (Kubesink, tempfile::TempDir, f64) {
    let before = cp.requests_by_verb("", "configmaps").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), cp, ns, watch, resource);
    let k = Kubesink::start(BIN, &config, dir.path(), ns, &[]);
    synced(&k).await;
    let after = cp.requests_by_verb("", "configmaps").await;
    eprintln!("configmaps requests at the sync of {resource:?}: {after:?} (before {before:?})");
    let lists = after.get("LIST").unwrap_or(&0.0) - before.get("LIST").unwrap_or(&0.0);
    (k, dir, lists)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_pages_json_and_protobuf_metadata_and_stream_sends_no_list_request() {
    let cp = start(Options::default()).await;
    config_maps(&cp, "shapes", 120).await;
    // `auto` on 1.37: paged LISTs from the watch cache for both encodings, no streaming list
    // refused or tried.
    for resource in ["page_size = 50", "page_size = 50\npayload = \"metadata\""] {
        let (k, _dir, lists) = synced_counting_lists(&cp, "shapes", "", resource).await;
        assert!(
            lists >= 3.0,
            "three pages of 50 ({resource:?}): {lists} LISTs"
        );
        assert!(
            !k.stderr().contains("does not serve streaming lists"),
            "no fallback: {}",
            k.stderr()
        );
        assert_eq!(converged(&cp, &k, "shapes").await, 120);
        k.terminate().await;
    }
    // `stream`, metadata in protobuf: a streaming list, no LIST.
    let (k, _dir, lists) = synced_counting_lists(
        &cp,
        "shapes",
        "initial_list = \"stream\"",
        "payload = \"metadata\"",
    )
    .await;
    assert_eq!(lists, 0.0, "kubesink sent {lists} LIST requests");
    let watches = cp
        .metric(
            "apiserver_longrunning_requests",
            &[("resource", "configmaps"), ("verb", "WATCH")],
        )
        .await;
    assert!(watches >= 1.0, "no watch of configmaps running: {watches}");
    // One more object through the watch the list became.
    create(
        &cp.admin().await,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "after", "namespace": "shapes"}}),
    )
    .await;
    // 120 + the namespace's kube-root-ca.crt is made by the controller-manager, absent here.
    assert_eq!(converged(&cp, &k, "shapes").await, 121);
    k.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continue_token_that_expires_mid_list_starts_the_list_over() {
    // Lists from etcd (no watch cache), one page of 10 every 5 s: etcd is compacted while the
    // list is between pages, so the next page's continue token is too old (410 Gone).
    let cp = start(Options {
        apiserver_args: vec!["--watch-cache=false".into()],
        ..Default::default()
    })
    .await;
    config_maps(&cp, "expire", 60).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &cp,
        "expire",
        "initial_list = \"list\"\nrequests_per_second = 0.2\nrequest_burst = 1",
        "page_size = 10",
    );
    let before = cp.requests_by_verb("", "configmaps").await;
    let k = Kubesink::start(BIN, &config, dir.path(), "expire", &[]);
    // After the first page and before the last: compact past the list's resourceVersion,
    // and change what the list would have shown.
    let client = cp.admin().await;
    wait_until("kubesink's first page", LONG, || async {
        let now = cp.requests_by_verb("", "configmaps").await;
        (now.get("LIST").unwrap_or(&0.0) - before.get("LIST").unwrap_or(&0.0) >= 1.0)
            .then_some(())
            .ok_or_else(|| format!("{now:?}"))
    })
    .await;
    kube_server::delete(&client, "v1", "ConfigMap", Some("expire"), "cm-0059").await;
    kube_server::patch_configmap(&client, "expire", "cm-0001", json!({"i": "changed"})).await;
    let revision = cp.compact_etcd();
    eprintln!("etcd compacted at revision {revision}");
    synced(&k).await;
    let after = cp.requests_by_verb("", "configmaps").await;
    assert_eq!(converged(&cp, &k, "expire").await, 59);
    eprintln!("configmaps requests: {after:?} (before {before:?})");
    let gone = after.get("LIST").unwrap_or(&0.0) - before.get("LIST").unwrap_or(&0.0);
    // 6 pages, plus those read again after the 410.
    assert!(
        gone > 6.0,
        "the list was not started over: {gone} LISTs:\n{}",
        k.stderr()
    );
    assert!(
        k.stderr().contains("continue token expired (410)"),
        "the real 410 is logged:\n{}",
        k.stderr()
    );
    k.terminate().await;
}
