//! Records list and watch exchanges from the real kube-apiserver of the tests
//! (`tests/support/kube_server.rs`), in the shape of `tests/fixtures/k8s-replays/`, so the
//! conformance replays (`tests/fixtures.rs`) include the Kubernetes release pinned in
//! `tests/kube/go.mod`. `scripts/record-replays.sh` runs it with `RECORD_REPLAYS_INTO=DIR` and
//! writes the files there (`tests/fixtures/k8s-replays/v1-37`, committed); without the
//! variable it records into a temporary directory and checks what it recorded has the
//! recordings' shape, so the recorder itself is tested on every run.

use kubesink_test_support::kube_server;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_server::{create, namespace};
use serde_json::{json, Value};

/// One recorded exchange, as the k8s-openapi recordings write it.
fn exchange(url: &str, method: &str, status: u16, body: &str) -> Value {
    json!({
        "request_url": url,
        "request_method": method,
        "request_body": "",
        "request_content_type": null,
        "response_status_code": status,
        "response_body": body,
    })
}

/// GETs `url` (a list, or a watch that ends by its `timeoutSeconds`) with the admin client:
/// (status, body).
async fn get(client: &kube::Client, url: &str) -> (u16, String) {
    let req = http::Request::get(url).body(Vec::new()).expect("request");
    match client.send(req.map(Into::into)).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let bytes = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
        Err(e) => panic!("GET {url}: {e}"),
    }
}

fn write(dir: &Path, name: &str, exchanges: Vec<Value>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&exchanges).expect("json"),
    )
    .expect("write recording");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_lists_and_watches_of_the_real_api_server() {
    let cp = kube_server::shared_async().await;
    let client = cp.admin().await;
    let ns = "recorded";
    namespace(cp, ns, json!({})).await;
    create(
        &client,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}}}}),
    )
    .await;
    // The ReplicaSet controller makes the Pods.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let pods_url = format!("/api/v1/namespaces/{ns}/pods");
    loop {
        let (_, body) = get(&client, &pods_url).await;
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        if v["items"].as_array().map_or(0, Vec::len) == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "3 Pods: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dir = match std::env::var_os("RECORD_REPLAYS_INTO") {
        Some(d) => PathBuf::from(d),
        None => tempfile::tempdir().expect("tempdir").keep(),
    };
    std::fs::create_dir_all(&dir).expect("recording dir");

    let mut written = Vec::new();
    for (name, url) in [
        ("pod-list.json", pods_url.clone()),
        (
            "deployment-list.json",
            format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        ),
        ("api_versions-list.json", "/api".to_owned()),
    ] {
        let (status, body) = get(&client, &url).await;
        assert_eq!(status, 200, "{url}: {body}");
        written.push(write(
            &dir,
            name,
            vec![exchange(&url, "GET", status, &body)],
        ));
    }
    // A plain watch (ADDED for what exists), and the streaming-list form ending with the
    // initial-events-end bookmark; both end by their timeout.
    for (name, query) in [
        ("watch_event-watch_pods.json", "watch=true&timeoutSeconds=2"),
        (
            "watch_event-watch_pods_without_initial_events.json",
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=3",
        ),
    ] {
        let url = format!("{pods_url}?{query}");
        let (status, body) = get(&client, &url).await;
        assert_eq!(status, 200, "{url}: {body}");
        written.push(write(&dir, name, vec![exchange(&url, "GET", status, &body)]));
    }
    // The recordings' shape: what tests/fixtures.rs reads.
    for path in &written {
        let text = std::fs::read_to_string(path).expect("read back");
        let exchanges: Vec<Value> = serde_json::from_str(&text).expect("a JSON array");
        for ex in &exchanges {
            let body = ex["response_body"].as_str().expect("response_body");
            if ex["request_url"]
                .as_str()
                .unwrap_or_default()
                .contains("watch=true")
            {
                let events: Vec<Value> = body
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| serde_json::from_str(l).expect("a watch event per line"))
                    .collect();
                assert!(
                    events.iter().filter(|e| e["type"] == "ADDED").count() >= 3,
                    "{body}"
                );
                if ex["request_url"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("sendInitialEvents")
                {
                    assert!(
                        events.iter().any(|e| e["type"] == "BOOKMARK"
                            && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"]
                                == "true"),
                        "no initial-events-end bookmark: {body}"
                    );
                }
            } else {
                serde_json::from_str::<Value>(body).expect("a JSON body");
            }
        }
    }
    eprintln!("recorded {} files into {}", written.len(), dir.display());
}
