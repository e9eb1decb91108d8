//! `kubesink demo`: the embedded Kubernetes API simulator with a realistic workload, and the
//! bridge streaming its topology to stdout. Nothing to install, nothing to configure.

use std::sync::Arc;

use kubesink_sim::{Churn, SimConfig, Simulator, Workload};

use crate::bridge::{shutdown_signal, Bridge};
use crate::cli::DemoArgs;
use crate::config::{ClusterConfig, Config, ResourceConfig};

/// The demo's configuration: cluster `demo`, the topology kinds plus the simulator's custom
/// kind (FooBar), one stdout sink.
pub fn demo_config(kubeconfig: std::path::PathBuf) -> Config {
    Config {
        cluster: ClusterConfig {
            name: "demo".to_owned(),
            kubeconfig: Some(kubeconfig),
            ..Default::default()
        },
        resources: vec![
            ResourceConfig::new("v1", "Node"),
            ResourceConfig::new("apps/v1", "Deployment"),
            ResourceConfig::new("v1", "Pod"),
            ResourceConfig::new("v1", "Service"),
            ResourceConfig::new("v1", "ConfigMap"),
            ResourceConfig::new(
                "k8s-openapi-tests-custom-resource-definition.com/v1",
                "FooBar",
            ),
        ],
        ..Default::default()
    }
}

/// The demo's usual address for /metrics.
const DEMO_LISTEN: &str = "127.0.0.1:9090";

/// [`DEMO_LISTEN`] when it is free, else a free port (the demo should just work on a machine
/// where something else, a Prometheus or another kubesink, has 9090).
fn default_listen() -> String {
    match std::net::TcpListener::bind(DEMO_LISTEN) {
        Ok(_) => DEMO_LISTEN.to_owned(),
        Err(e) => {
            tracing::info!("{DEMO_LISTEN} is taken ({e}); serving /metrics on a free port instead (--listen sets one)");
            "127.0.0.1:0".to_owned()
        }
    }
}

/// Runs the demo until Ctrl-C.
///
/// # Errors
/// Simulator start-up, kubeconfig writing, or bridge start-up failures.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let sim = Simulator::new(SimConfig::default());
    let addr = sim.start(([127, 0, 0, 1], 0).into()).await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig)?;
    let workload = Workload {
        namespaces: 3,
        pods: args.pods,
        deployments: (args.pods / 10).max(1),
        nodes: (args.pods / 40).max(1),
        services: (args.pods / 10).max(1),
        configmaps: (args.pods / 10).max(1),
        foobars: (args.pods / 20).max(1),
        seed: args.seed,
    };
    sim.populate(&workload)?;
    tracing::info!(%addr, kubeconfig = %kubeconfig.display(), pods = args.pods, churn_per_sec = args.churn, "simulated cluster running (kubectl --kubeconfig works against it)");
    let churn = sim.spawn_churn(Churn {
        rate_per_sec: args.churn,
        seed: args.seed,
    });
    let mut config = demo_config(kubeconfig);
    config.server.listen = args.listen.clone().unwrap_or_else(default_listen);
    let plan = crate::plan::resolve(&config)?;
    let clusters: Vec<_> = plan.units.iter().map(|u| u.cluster.clone()).collect();
    let clients = crate::cluster::usable(&clusters, crate::cluster::clients(&clusters).await)?;
    let sinks: Vec<Arc<dyn kubesink_core::Sink>> =
        crate::sinks::build_all(plan.sinks.iter().map(|s| &s.config)).await?;
    let bridge = Bridge::start_built(&plan, clients, sinks, None).await?;
    if let Some(at) = bridge.server_addr() {
        tracing::info!("demo running: messages on stdout; http://{at}/metrics, /healthz and /readyz; Ctrl-C stops it");
    }
    shutdown_signal().await;
    tracing::info!("demo stopping");
    drop(churn);
    bridge.shutdown().await;
    sim.shutdown();
    Ok(())
}
