//! The `kubesink-sim` binary: starts a simulator, optionally populated with a workload and
//! churn, writes a kubeconfig, and serves until Ctrl-C. Faults are driven over `/_sim/…`;
//! `--help` lists every admin endpoint.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kubesink_sim::{Churn, Denial, SimConfig, Simulator, WatchListSupport, Workload};

/// A Kubernetes API server simulator for kubesink's tests, benchmarks and demo.
///
/// Faults are switched over HTTP with the admin endpoints listed below, e.g.
/// `curl -X POST 'http://ADDR/_sim/set-status?status=403&path_prefix=/api/v1/pods'`.
#[derive(Debug, Parser)]
#[command(name = "kubesink-sim", version, after_help = kubesink_sim::admin_help())]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to write a kubeconfig pointing at the simulator.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Pods to generate.
    #[arg(long, default_value_t = 0)]
    pods: usize,
    /// Deployments to generate (each with one ReplicaSet).
    #[arg(long, default_value_t = 0)]
    deployments: usize,
    /// Nodes to generate.
    #[arg(long, default_value_t = 0)]
    nodes: usize,
    /// Services to generate.
    #[arg(long, default_value_t = 0)]
    services: usize,
    /// ConfigMaps to generate.
    #[arg(long, default_value_t = 0)]
    configmaps: usize,
    /// FooBar custom objects to generate (registers the FooBar CRD).
    #[arg(long, default_value_t = 0)]
    foobars: usize,
    /// Namespaces to spread objects over.
    #[arg(long, default_value_t = 1)]
    namespaces: usize,
    /// Churn rate in changes per second (0 = none); the same churn `POST /_sim/churn`
    /// changes or stops (`rate=0`).
    #[arg(long, default_value_t = 0.0)]
    churn: f64,
    /// Seed for generated names and churn.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Interval between watch bookmarks (e.g. "1s", "500ms").
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    bookmark_interval: Duration,
    /// Change events retained for watch resumption and consistent lists.
    #[arg(long, default_value_t = 10_000)]
    retained_events: usize,
    /// Streaming lists (watches with `sendInitialEvents=true`, KEP-3157): `on` (served, as
    /// Kubernetes 1.32 and 1.34+), `off` (422 Invalid, the WatchList feature gate off, as
    /// 1.33) or `ignored` (a plain watch, as servers before 1.27); `POST
    /// /_sim/watch-list?mode=…` changes it.
    #[arg(long, default_value = "on", value_parser = watch_list)]
    watch_list: WatchListSupport,
    /// The release `/version` reports, `MAJOR.MINOR` (what is served does not change:
    /// `--watch-list` says whether lists stream).
    #[arg(long, default_value = "1.36", value_parser = server_version)]
    server_version: (u32, u32),
    /// Take a permission away, as a missing RBAC rule would (repeatable):
    /// `VERB:RESOURCE[.GROUP][:NAMESPACE]`, `*` for any verb or resource, e.g. `watch:pods`,
    /// `list:deployments.apps:team-a`. Covered requests get 403 Forbidden and
    /// `SelfSubjectAccessReview`s answer `allowed: false`. Default: everything allowed;
    /// `POST /_sim/deny` changes it.
    #[arg(long, value_name = "RULE", value_parser = denial)]
    deny: Vec<Denial>,
}

fn denial(s: &str) -> Result<Denial, String> {
    Denial::parse(s).map_err(|e| e.to_string())
}

fn server_version(s: &str) -> Result<(u32, u32), String> {
    s.split_once('.')
        .and_then(|(ma, mi)| Some((ma.parse().ok()?, mi.parse().ok()?)))
        .ok_or_else(|| format!("{s:?} is not MAJOR.MINOR, such as 1.36"))
}

fn watch_list(s: &str) -> Result<WatchListSupport, String> {
    WatchListSupport::from_name(s).ok_or_else(|| format!("{s:?} is not on, off or ignored"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let sim = Simulator::new(SimConfig {
        bookmark_interval: args.bookmark_interval,
        retained_events: args.retained_events,
    });
    sim.faults().set_watch_list(args.watch_list);
    sim.set_server_version(args.server_version.0, args.server_version.1);
    for rule in args.deny {
        sim.faults().deny(rule);
    }
    let workload = Workload {
        namespaces: args.namespaces,
        pods: args.pods,
        deployments: args.deployments,
        nodes: args.nodes,
        services: args.services,
        configmaps: args.configmaps,
        foobars: args.foobars,
        seed: args.seed,
    };
    sim.populate(&workload).context("populating the workload")?;
    let addr = sim
        .start(args.listen)
        .await
        .context("binding the listen address")?;
    println!(
        "kubesink-sim serving http://{addr} (resourceVersion {})",
        sim.resource_version()
    );
    if let Some(path) = &args.kubeconfig {
        sim.write_kubeconfig(path)
            .with_context(|| format!("writing kubeconfig {}", path.display()))?;
        println!("kubeconfig written to {}", path.display());
    }
    // The admin churn: `POST /_sim/churn?rate=0` stops it, `/_sim/stats` counts it.
    sim.set_churn(Churn {
        rate_per_sec: args.churn,
        seed: args.seed,
    });
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    tracing::info!("shutting down");
    sim.shutdown();
    Ok(())
}
