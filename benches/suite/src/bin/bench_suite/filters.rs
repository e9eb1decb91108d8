//! The cost of a resource's CEL filter (issue 42): the same simulator, churn and stdout sink
//! with no filter, a filter of one condition and a filter of five, each matching every Pod
//! (so every variant sends the same messages and the difference is the evaluation alone):
//! the initial list's objects/s, then kubesink's CPU per 10,000 changes and the change →
//! stdout latency at the plan's churn rate. A fresh simulator and kubesink per variant.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use kubesink_bench::procs::Sim;
use serde_json::{json, Value};

use super::{collect_latency, latency_of, Ctx, Kubesink, Latency, Plan};

/// (name, expression) of each variant; `None`: no filter. Each matches every Pod of the
/// simulator.
pub const VARIANTS: [(&str, Option<&str>); 3] = [
    ("no filter", None),
    (
        "1 condition",
        Some(r#"!(has(object.status.phase) && object.status.phase in ["Succeeded", "Failed"])"#),
    ),
    (
        "5 conditions",
        Some(
            r#"!(has(object.status.phase) && object.status.phase in ["Succeeded", "Failed"]) && !ns.startsWith("kube-") && cluster != "lab" && !has(object.metadata.deletionTimestamp) && object.spec.containers.all(c, c.image != "")"#,
        ),
    ),
];

/// One variant's run.
pub struct FilterRun {
    pub name: &'static str,
    pub expr: Option<&'static str>,
    pub pods: usize,
    /// Objects/s of the initial list (kubesink's start to the last Pod on stdout).
    pub list_per_sec: f64,
    pub lat: Latency,
    /// kubesink's CPU seconds per 10,000 changes during the churn.
    pub cpu_per_10k: f64,
}

/// Every variant, one after the other.
pub fn runs(ctx: &Ctx, plan: &Plan) -> anyhow::Result<Vec<FilterRun>> {
    let mut out = Vec::new();
    for (name, expr) in VARIANTS {
        let sim = Sim::start(&ctx.bin, plan.churn_pods, ctx.dir.path())?;
        let filter = expr.map_or(String::new(), |e| format!("filter = '{e}'\n"));
        let body = format!(
            "[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n{filter}\n[[sinks]]\ntype = \"stdout\"\n"
        );
        let started = Instant::now();
        let mut k =
            Kubesink::start_config(ctx, &sim, &body, true, &format!("filters-{}", out.len()))?;
        let ms = collect_latency(k.proc.take_stdout().context("stdout")?);
        k.wait_delivered(Some(plan.churn_pods), Duration::from_secs(1800))?;
        let list_secs = started.elapsed().as_secs_f64();
        let w = super::churn_window(plan, &sim, &[k.proc.pid()], &ms)?;
        let run = FilterRun {
            name,
            expr,
            pods: plan.churn_pods,
            list_per_sec: plan.churn_pods as f64 / list_secs.max(1e-9),
            lat: latency_of(name, &w.samples, w.applied, w.secs),
            cpu_per_10k: w.cpu_per_10k[0],
        };
        eprintln!(
            "   {name}: initial list {:.0} objects/s; p50 {:.1} ms, p99 {:.1} ms ({} changes at {:.0}/s); CPU/10k changes {:.2} s",
            run.list_per_sec, run.lat.p50, run.lat.p99, run.lat.samples, run.lat.rate, run.cpu_per_10k
        );
        out.push(run);
    }
    Ok(out)
}

/// The part's table (Markdown).
pub fn markdown(runs: &[FilterRun]) -> String {
    let pods = runs.first().map_or(0, |r| r.pods);
    let mut s = format!(
        "\n## Resource filters (CEL): the cost of evaluating them ({pods} Pods)\n\n\
         The simulator's Pods, the stdout sink, one kubesink per variant; every filter matches \
         every Pod, so every variant sends the same messages. Ratios are to the run without \
         a filter.\n\n\
         | filter | initial list objects/s | ÷ none | changes/s | p50 ms | p99 ms | CPU s / 10k changes | ÷ none |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let base = runs.first();
    for r in runs {
        let (list_ratio, cpu_ratio) = base.map_or((f64::NAN, f64::NAN), |b| {
            (
                r.list_per_sec / b.list_per_sec.max(1e-9),
                r.cpu_per_10k / b.cpu_per_10k.max(1e-9),
            )
        });
        s += &format!(
            "| {} | {:.0} | {list_ratio:.2}× | {:.0} | {:.1} | {:.1} | {:.2} | {cpu_ratio:.2}× |\n",
            r.name, r.list_per_sec, r.lat.rate, r.lat.p50, r.lat.p99, r.cpu_per_10k
        );
    }
    s += "\nThe expressions:\n\n";
    for r in runs {
        if let Some(e) = r.expr {
            s += &format!("- {}: `{e}`\n", r.name);
        }
    }
    s
}

/// The part's figures (JSON).
pub fn json(runs: &[FilterRun]) -> Value {
    Value::Array(
        runs.iter()
            .map(|r| {
                json!({
                    "filter": r.name, "expression": r.expr, "pods": r.pods,
                    "list_per_sec": r.list_per_sec, "changes_per_sec": r.lat.rate,
                    "p50_ms": r.lat.p50, "p99_ms": r.lat.p99, "cpu_secs_per_10k": r.cpu_per_10k,
                })
            })
            .collect(),
    )
}
