//! What the in-process benches share: a simulated cluster of pods served over HTTP, with a
//! kubeconfig pointing at it.

use std::path::PathBuf;

use kubesink_sim::{SimConfig, Simulator, Workload};

/// A running simulator and the files that point at it.
pub struct SimulatedPods {
    /// The simulator (serving on a free port of 127.0.0.1).
    pub sim: Simulator,
    /// The kubeconfig file for `sim`, inside `dir`.
    pub kubeconfig: PathBuf,
    /// A temporary directory for the bench's files; removed when dropped.
    pub dir: tempfile::TempDir,
    /// How many pods `sim` holds.
    pub pods: usize,
}

/// Starts a simulator holding `BENCH_PODS` pods (else `default_pods`) spread over
/// `namespaces` namespaces (seed 1).
///
/// # Errors
/// The simulator cannot listen, or the temporary directory or kubeconfig cannot be written.
pub async fn simulated_pods(
    default_pods: usize,
    namespaces: usize,
) -> anyhow::Result<SimulatedPods> {
    let pods: usize = std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_pods);
    let sim = Simulator::new(SimConfig::default());
    sim.start(([127, 0, 0, 1], 0).into()).await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig)?;
    sim.populate(&Workload {
        namespaces,
        pods,
        seed: 1,
        ..Default::default()
    })?;
    Ok(SimulatedPods {
        sim,
        kubeconfig,
        dir,
        pods,
    })
}
