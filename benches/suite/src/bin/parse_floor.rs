//! `parse-floor`: the least any program must do to follow pods, as the benchmark suite's
//! throughput floor. It reads the same list + watch stream from the same API server as
//! kubesink (paged list of `/api/v1/pods`, then a watch from the list's resourceVersion, over
//! HTTP with kube's client), parses each object and each watch event with serde_json into a
//! `serde_json::Value`, and writes it out again as one JSON line on stdout. Nothing else: no
//! state, no shaping, no fingerprint, no batching.
//!
//! Status lines go to stderr: `listed N` once the list is done (N objects), then `events N`
//! after every 1,000 watch events. With `--list-only` it exits after the list.
//!
//! It uses mimalloc, the `kubesink` binary's allocator (with mimalloc's default options,
//! which favour speed), so a ratio to it compares the work done, not the allocators.
//!
//! `parse-floor [--page-size 500] [--list-only] > /dev/null`

use std::io::Write;

use futures::{AsyncBufReadExt, TryStreamExt};
use kube::Client;
use serde_json::Value;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The floor: list and watch pods from the current kubeconfig's API server and only parse
/// each object or event into a `serde_json::Value` and write it out (BENCHMARKS.md).
#[derive(clap::Parser)]
#[command(name = "parse-floor")]
struct Args {
    /// Objects per list page (`limit`).
    #[arg(long, default_value_t = 500)]
    page_size: u32,
    /// Stop after the list (no watch).
    #[arg(long)]
    list_only: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        page_size,
        list_only,
    } = <Args as clap::Parser>::parse();
    let client = Client::try_default().await?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 << 10, stdout.lock());

    // The list, page by page.
    let mut listed = 0u64;
    let mut token: Option<String> = None;
    let resource_version = loop {
        let mut uri = format!("/api/v1/pods?limit={page_size}");
        if let Some(t) = &token {
            uri.push_str("&continue=");
            uri.push_str(&percent_encode(t));
        }
        let page = client
            .request_text(http::Request::get(uri).body(Vec::new())?)
            .await?;
        let page: Value = serde_json::from_str(&page)?;
        if let Some(items) = page.get("items").and_then(Value::as_array) {
            for item in items {
                serde_json::to_writer(&mut out, item)?;
                out.write_all(b"\n")?;
                listed += 1;
            }
        }
        let meta = page.get("metadata");
        token = meta
            .and_then(|m| m.get("continue"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        if token.is_none() {
            break meta
                .and_then(|m| m.get("resourceVersion"))
                .and_then(Value::as_str)
                .unwrap_or("0")
                .to_owned();
        }
    };
    out.flush()?;
    eprintln!("listed {listed}");
    if list_only {
        return Ok(());
    }

    // The watch: one event per line, each parsed and written.
    let uri = format!(
        "/api/v1/pods?watch=true&resourceVersion={resource_version}&allowWatchBookmarks=true&timeoutSeconds=3600"
    );
    let body = client
        .request_stream(http::Request::get(uri).body(Vec::new())?)
        .await?;
    let mut lines = body.lines();
    let mut events = 0u64;
    while let Some(line) = lines.try_next().await? {
        if line.is_empty() {
            continue;
        }
        let event: Value = serde_json::from_str(&line)?;
        serde_json::to_writer(&mut out, &event)?;
        out.write_all(b"\n")?;
        events += 1;
        if events.is_multiple_of(1000) {
            out.flush()?;
            eprintln!("events {events}");
        }
    }
    out.flush()?;
    Ok(())
}

/// Percent-encodes a continue token for a query string (RFC 3986 unreserved kept).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
