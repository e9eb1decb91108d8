//! The cost of evaluating a resource's CEL filter on one object, in µs, beside the cost of
//! decoding the same object from its watch line (what every event costs anyway), in one run:
//! the real Pods of a kind cluster's `kube-system` (the streaming-list recording in
//! `tests/fixtures/k8s-replays/v1-36`), each filter of the bench
//! suite's `filters` run (`benches/suite/src/bin/bench_suite/filters.rs`) plus one that reads
//! `metadata` only.
//!
//! `cargo bench --bench filter` (rounds: `BENCH_ROUNDS`, default 20000 evaluations per
//! filter and object). Prints one line per filter: median µs per evaluation over five
//! batches (min–max), and its ratio to the decode.

use std::time::Instant;

use kubesink::testing::{watch_line, Filter, FilterMatch, FilterSubject, RawObject};

/// The allocator of the `kubesink` binary, so the figures are the product's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The bench suite's filters (each matches every running Pod), and a metadata-only one.
const FILTERS: [(&str, &str); 6] = [
    ("a constant", "true"),
    ("a variable", r#"cluster != "lab""#),
    (
        "1 condition",
        r#"!(has(object.status.phase) && object.status.phase in ["Succeeded", "Failed"])"#,
    ),
    (
        "5 conditions",
        r#"!(has(object.status.phase) && object.status.phase in ["Succeeded", "Failed"]) && !ns.startsWith("kube-") && cluster != "lab" && !has(object.metadata.deletionTimestamp) && object.spec.containers.all(c, c.image != "")"#,
    ),
    (
        "a label",
        r#"has(object.metadata.labels.tier) && object.metadata.labels.tier == "control-plane""#,
    ),
    ("the whole object", r#"object.size() > 0"#),
];

fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let lines = pod_lines()?;
    println!(
        "{} real Pods ({} bytes per watch line on average), {rounds} evaluations each per batch",
        lines.len(),
        lines.iter().map(String::len).sum::<usize>() / lines.len().max(1)
    );
    let decode = median_us(rounds, &lines, |line| {
        let d = watch_line(line.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?;
        std::hint::black_box(&d);
        Ok(())
    })?;
    println!("decode a watch line: {}", decode.shown());
    for (name, source) in FILTERS {
        let filter = Filter::compile(source).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let objects: Vec<RawObject<'_>> = lines
            .iter()
            .map(|l| RawObject::parse(object_of(l)))
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut i = 0usize;
        let t = median_us(rounds, &lines, |_| {
            let obj = &objects[i % objects.len()];
            i += 1;
            let got = filter.matches(&FilterSubject {
                obj,
                metadata: &obj.metadata,
                redacted: &|_| false,
                cluster: "prod",
                kind: "Pod",
                resource: &"v1 Pod",
                change: None,
                context: None,
            });
            anyhow::ensure!(got != FilterMatch::Error, "{name} failed");
            std::hint::black_box(got);
            Ok(())
        })?;
        println!(
            "filter {name:>18}: {} ({:.2}× the decode)",
            t.shown(),
            t.median / decode.median
        );
    }
    Ok(())
}

/// Median, min and max of five batches, µs per call.
struct Timing {
    median: f64,
    min: f64,
    max: f64,
}

impl Timing {
    fn shown(&self) -> String {
        format!("{:.2} µs ({:.2}–{:.2})", self.median, self.min, self.max)
    }
}

fn median_us(
    rounds: usize,
    lines: &[String],
    mut f: impl FnMut(&str) -> anyhow::Result<()>,
) -> anyhow::Result<Timing> {
    let mut batches = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        for r in 0..rounds {
            f(&lines[r % lines.len()])?;
        }
        batches.push(started.elapsed().as_secs_f64() * 1e6 / rounds as f64);
    }
    batches.sort_by(f64::total_cmp);
    Ok(Timing {
        median: batches[2],
        min: batches[0],
        max: batches[4],
    })
}

/// The `object` of a watch line, as its text.
fn object_of(line: &str) -> &str {
    let start = line
        .find("\"object\":")
        .map_or(0, |i| i + "\"object\":".len());
    &line[start..line.len() - 1]
}

/// The ADDED events of the recorded streaming list, one watch line each.
fn pod_lines() -> anyhow::Result<Vec<String>> {
    let text = include_str!(
        "../tests/fixtures/k8s-replays/v1-36/watch_event-watch_pods_without_initial_events.json"
    );
    let exchanges: Vec<serde_json::Value> = serde_json::from_str(text)?;
    let body = exchanges
        .first()
        .and_then(|e| e["response_body"].as_str())
        .ok_or_else(|| anyhow::anyhow!("the recording has no response_body"))?;
    let lines: Vec<String> = body
        .lines()
        .filter(|l| l.starts_with(r#"{"type":"ADDED""#))
        .map(str::to_owned)
        .collect();
    anyhow::ensure!(!lines.is_empty(), "the recording has no ADDED event");
    Ok(lines)
}
