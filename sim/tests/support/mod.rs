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
    let mut stream = TcpStream::connect(addr).await.unwrap();
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
    stream.write_all(req.as_bytes()).await.unwrap();
    BufReader::new(stream)
}

async fn read_head(reader: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    (status, headers)
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
