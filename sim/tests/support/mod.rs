//! Shared helpers for the simulator's end-to-end tests: start a simulator on a free port and
//! talk to it over raw HTTP/1.0 (close-delimited bodies, so watch streams can be read line by
//! line without a client library).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use kubesink_sim::{SimConfig, Simulator};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Starts a simulator with `config` on 127.0.0.1:0.
pub async fn start(config: SimConfig) -> (Simulator, SocketAddr) {
    let sim = Simulator::new(config);
    let addr = sim.start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    (sim, addr)
}

/// A complete response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    accept: Option<&str>,
    body: Option<&str>,
) -> BufReader<TcpStream> {
    try_send(addr, method, path, accept, body).await.unwrap()
}

async fn try_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    accept: Option<&str>,
    body: Option<&str>,
) -> std::io::Result<BufReader<TcpStream>> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\n");
    if let Some(a) = accept {
        req.push_str(&format!("Accept: {a}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await?;
    Ok(BufReader::new(stream))
}

async fn read_head(reader: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    try_read_head(reader).await.unwrap()
}

async fn try_read_head(
    reader: &mut BufReader<TcpStream>,
) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    Ok((status, headers))
}

/// Like [`request`], but I/O errors (a refused, reset or closed connection) come back as
/// `Err` instead of panicking; a connection closed before any response reads as status 0.
pub async fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<Response> {
    let mut reader = try_send(addr, method, path, None, body).await?;
    let (status, headers) = try_read_head(&mut reader).await?;
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).await?;
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// The kube-rs config read from the kubeconfig the simulator writes. Note that kube-rs
/// retries 429, 503 and 504 answers by default (up to 15 times, honouring `Retry-After`);
/// set `default_retry = false` to see them.
pub async fn kube_config(sim: &Simulator) -> kube::Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&path).unwrap();
    kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&path).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap()
}

/// A kube-rs client for the simulator (with kube-rs's default retries).
pub async fn kube_client(sim: &Simulator) -> kube::Client {
    kube::Client::try_from(kube_config(sim).await).unwrap()
}

/// A kube-rs client that does not retry 429, 503 and 504 answers.
pub async fn kube_client_without_retries(sim: &Simulator) -> kube::Client {
    let mut config = kube_config(sim).await;
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// Sends one request and reads the whole response.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    accept: Option<&str>,
    body: Option<&str>,
) -> Response {
    let mut reader = send(addr, method, path, accept, body).await;
    let (status, headers) = read_head(&mut reader).await;
    let mut body = String::new();
    reader.read_to_string(&mut body).await.unwrap();
    Response {
        status,
        headers,
        body,
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, None, None).await
}

/// An open watch stream.
pub struct Watch {
    pub status: u16,
    reader: BufReader<TcpStream>,
}

impl Watch {
    /// The next event, or None at end of stream or after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let mut line = String::new();
        match tokio::time::timeout(timeout, self.reader.read_line(&mut line)).await {
            Ok(Ok(0)) | Err(_) => None,
            Ok(Ok(_)) => Some(
                serde_json::from_str(line.trim_end())
                    .unwrap_or_else(|e| panic!("bad event ({e}): {line}")),
            ),
            Ok(Err(e)) => panic!("read error: {e}"),
        }
    }

    /// The next raw line (with its `\n`), or None at end of stream or after `timeout`.
    pub async fn next_line(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let mut line = Vec::new();
        match tokio::time::timeout(timeout, self.reader.read_until(b'\n', &mut line)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => None,
            Ok(Ok(_)) => Some(line),
        }
    }

    /// Whether nothing at all (no byte, no end of stream) arrives for `window`.
    pub async fn silent_for(&mut self, window: Duration) -> bool {
        let mut byte = [0u8; 1];
        tokio::time::timeout(window, self.reader.read(&mut byte))
            .await
            .is_err()
    }

    /// Whether the stream ends (EOF) within `timeout`.
    pub async fn ends_within(&mut self, timeout: Duration) -> bool {
        let mut line = String::new();
        loop {
            line.clear();
            match tokio::time::timeout(timeout, self.reader.read_line(&mut line)).await {
                Ok(Ok(0)) => return true,
                Ok(Ok(_)) => continue,
                Ok(Err(_)) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Collects events until `n` arrived or `timeout` passed between two events.
    pub async fn take(&mut self, n: usize, timeout: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        while out.len() < n {
            match self.next(timeout).await {
                Some(e) => out.push(e),
                None => break,
            }
        }
        out
    }
}

/// Opens a watch (the path must carry `watch=true`).
pub async fn watch(addr: SocketAddr, path: &str, accept: Option<&str>) -> Watch {
    let mut reader = send(addr, "GET", path, accept, None).await;
    let (status, _) = read_head(&mut reader).await;
    Watch { status, reader }
}

/// Polls `cond` every 10 ms until true or `timeout` (then panics with `what`).
pub async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A minimal ConfigMap body.
pub fn configmap(ns: &str, name: &str, labels: Value) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": labels}, "data": {"k": "v"}})
}

/// Names of a list response's items.
pub fn item_names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// A fixture recording from `tests/fixtures/k8s-replays/v1-36` (vendored API-server recordings), parsed.
pub fn fixture(name: &str) -> Value {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/k8s-replays/v1-36");
    let path = dir.join(name);
    serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

/// A kube-rs watcher stream driven in a background task (so it keeps watching while the
/// test waits); items are forwarded with errors as text.
pub type WatcherItems<K> =
    tokio::sync::mpsc::UnboundedReceiver<Result<kube::runtime::watcher::Event<K>, String>>;

/// Drives `stream` in a background task; see [`WatcherItems`].
pub fn spawn_watcher<K: Send + 'static>(
    stream: impl futures::Stream<
            Item = Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>,
        > + Send
        + 'static,
) -> WatcherItems<K> {
    use futures::StreamExt;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item.map_err(|e| e.to_string())).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next watcher item within `timeout` (panics if none arrives or the stream ended).
pub async fn next_item<K>(
    items: &mut WatcherItems<K>,
    timeout: Duration,
) -> Result<kube::runtime::watcher::Event<K>, String> {
    tokio::time::timeout(timeout, items.recv())
        .await
        .expect("watcher item in time")
        .expect("watcher stream open")
}
