//! A minimal blocking HTTP/1.1 client (one request per connection) for kubesink's
//! `/metrics` and the simulator's `/_sim/` admin endpoints, both on 127.0.0.1, and a
//! Prometheus text-format reader.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context};

/// Sends `method path` to `addr` and returns the body of a 2xx answer.
pub fn request(addr: SocketAddr, method: &str, path: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .with_context(|| format!("reading the answer to {method} {path}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP header in the answer to {method} {path}"))?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if !status.starts_with('2') {
        bail!("{method} {path} answered {status}: {body}");
    }
    if head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"))
    {
        return Ok(dechunk(body));
    }
    Ok(body.to_owned())
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The sum of every sample of metric `name` (all label sets) in Prometheus text format.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_adds_every_label_set_of_exactly_that_metric() {
        let text = "# HELP x\nkubesink_synced{resource=\"a\"} 1\nkubesink_synced{resource=\"b\"} 1\n\
                    kubesink_synced_total 7\nkubesink_sink_delivered_messages_total{sink=\"s\"} 42\n";
        assert_eq!(metric_sum(text, "kubesink_synced"), 2.0);
        assert_eq!(
            metric_sum(text, "kubesink_sink_delivered_messages_total"),
            42.0
        );
        assert_eq!(metric_sum(text, "kubesink_missing"), 0.0);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
