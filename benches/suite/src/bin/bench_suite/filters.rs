//! The cost of CEL filters: the same simulator, churn and stdout sink with no
//! filter, a resource filter of one condition and one of five, each matching every Pod (so
//! every variant sends the same messages and the difference is the evaluation alone); then
//! two stdout sinks without a filter and two with a sink filter each (two routes: a view
//! per sink, `src/bridge/routes.rs`, each deciding every event again): the initial list's
//! objects/s, then kubesink's CPU per 10,000 changes and the change → stdout latency at the
//! plan's churn rate. A fresh simulator and kubesink per variant.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use kubesink_bench::procs::Sim;
use serde_json::{json, Value};

use super::{collect_latency, latency_of, Ctx, Kubesink, Latency, Plan};

const ONE: &str =
    r#"!(has(object.status.phase) && object.status.phase in ["Succeeded", "Failed"])"#;

/// One variant: its name, the resource's filter and one entry per stdout sink (its filter).
/// Every filter matches every Pod of the simulator.
pub struct Variant {
    pub name: &'static str,
    pub resource: Option<&'static str>,
    pub sinks: &'static [Option<&'static str>],
}

/// The variants, in order; a ratio is to the first variant with as many sinks.
pub const VARIANTS: [Variant; 5] = [
    Variant {
        name: "no filter",
        resource: None,
        sinks: &[None],
    },
    Variant {
        name: "1 condition",
        resource: Some(ONE),
        sinks: &[None],
    },
    Variant {
        name: "5 conditions",
        resource: Some(
            r#"!(has(object.status.phase) && object.status.phase in ["Succeeded", "Failed"]) && !ns.startsWith("kube-") && cluster != "lab" && !has(object.metadata.deletionTimestamp) && object.spec.containers.all(c, c.image != "")"#,
        ),
        sinks: &[None],
    },
    Variant {
        name: "2 sinks, no filter",
        resource: None,
        sinks: &[None, None],
    },
    Variant {
        name: "2 sinks, a 1-condition filter each (2 routes)",
        resource: None,
        sinks: &[Some(ONE), Some(ONE)],
    },
];

/// One variant's run.
pub struct FilterRun {
    pub name: &'static str,
    pub expr: Option<&'static str>,
    /// Stdout sinks (each line is written once per sink).
    pub sinks: usize,
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
    for Variant {
        name,
        resource,
        sinks,
    } in VARIANTS
    {
        let sim = Sim::start(&ctx.bin, plan.churn_pods, ctx.dir.path())?;
        let filter = resource.map_or(String::new(), |e| format!("filter = '{e}'\n"));
        let mut body = format!("[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n{filter}\n");
        for (i, f) in sinks.iter().enumerate() {
            body += &format!("[[sinks]]\ntype = \"stdout\"\nname = \"out-{i}\"\n");
            if let Some(f) = f {
                body += &format!("filter = '{f}'\n");
            }
        }
        let expr = resource.or(sinks.iter().flatten().next().copied());
        let started = Instant::now();
        let mut k =
            Kubesink::start_config(ctx, &sim, &body, true, &format!("filters-{}", out.len()))?;
        let ms = collect_latency(k.proc.take_stdout().context("stdout")?);
        // Delivered counts each sink's confirmations.
        k.wait_delivered(
            Some(plan.churn_pods * sinks.len()),
            Duration::from_secs(1800),
        )?;
        let list_secs = started.elapsed().as_secs_f64();
        let w = super::churn_window(plan, &sim, &[k.proc.pid()], &ms)?;
        let run = FilterRun {
            name,
            expr,
            sinks: sinks.len(),
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
        "\n## Filters (CEL): the cost of evaluating them ({pods} Pods)\n\n\
         The simulator's Pods, stdout sinks, one kubesink per variant; every filter matches \
         every Pod, so every variant sends the same messages (twice with two sinks: changes/s \
         counts each change once). Ratios are to the first run with as many sinks and no \
         filter. The last row is two routes: a view per sink, each deciding every event.\n\n\
         | filter | initial list objects/s | ÷ none | changes/s | p50 ms | p99 ms | CPU s / 10k changes | ÷ none |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in runs {
        let base = runs.iter().find(|b| b.sinks == r.sinks);
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
                    "filter": r.name, "expression": r.expr, "sinks": r.sinks, "pods": r.pods,
                    "list_per_sec": r.list_per_sec, "changes_per_sec": r.lat.rate,
                    "p50_ms": r.lat.p50, "p99_ms": r.lat.p99, "cpu_secs_per_10k": r.cpu_per_10k,
                })
            })
            .collect(),
    )
}
