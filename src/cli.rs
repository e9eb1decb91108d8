//! The command line (clap): `run` (default), `check`, `rbac`, `demo`, `fold`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::filter::LevelFilter;

/// kubesink: streams Kubernetes topology changes into message brokers.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// Configuration file (TOML). Overridden by KUBESINK_… environment variables.
    #[arg(long, global = true, env = "KUBESINK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. `info`, `kubesink=debug`. `RUST_LOG` wins.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    /// What to do (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the bridge (the default).
    Run,
    /// Validate the configuration, print it with secrets masked; exit 1 listing every problem.
    /// With `--online`, then ask each configured cluster whether it will work there.
    Check(CheckArgs),
    /// Print least-privilege RBAC (YAML) for the configured resources: list and watch on
    /// exactly those, plus the Lease when leader election is on, bound to the service
    /// account. Works offline. `kubectl apply -f -` takes the output.
    Rbac(RbacArgs),
    /// Start a built-in simulated cluster with a realistic workload and stream its topology
    /// to stdout. Ctrl-C stops it. (Cargo feature `sim`, on by default.)
    #[cfg(feature = "sim")]
    Demo(DemoArgs),
    /// Read a Kafka topic, a JetStream stream or a JSON Lines file from the start, fold it as
    /// consumers do (docs/consumers.md) and print the current view once caught up. With
    /// `--against-cluster`, compare the view with the live objects of the configured
    /// resources (exit 1 when they differ). Exit 2 on errors.
    Fold(FoldArgs),
}

/// `kubesink check` options.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// After the offline checks pass, ask each configured cluster's API server whether the
    /// configuration will work there: one `ok` or `FAIL` line per configured resource of each
    /// cluster (instead of the configuration); exit 1 when a line fails or a cluster is
    /// unreachable.
    ///
    /// Per resource: API discovery (a misspelt kind gets the nearest served one, `kind "Pdo"
    /// not served by v1 (did you mean "Pod"?)`), the label and field selectors (a LIST with
    /// limit=1 in each configured namespace, which the server validates: a bad one shows its
    /// 400 message) and whether `list` and `watch` are allowed there (SelfSubjectAccessReview);
    /// with leader election, `get`, `create` and `update` of the Lease. Access is answered for
    /// the identity the client runs as: the kubeconfig's user, the Pod's service account, or
    /// `--as`.
    #[arg(long)]
    pub online: bool,
    /// Fail (exit 1) on what is only a warning otherwise because it may be fine where
    /// kubesink runs: a file the configuration names and `run` reads (a kubeconfig; a sink's
    /// credentials file, and its certificates and librdkafka `*.location` files when its
    /// connection uses TLS; the state store's credentials, certificates and librdkafka
    /// files) that is not here. For a check run where kubesink runs (its Pod, or CI with the
    /// same files mounted). A file that is here but unusable (a damaged keystore) is found
    /// only by `run`.
    #[arg(long)]
    pub strict: bool,
    /// With `--online`: ask as this user (impersonation, as `kubectl --as`), e.g.
    /// `system:serviceaccount:kubesink:kubesink`; your own identity needs the `impersonate`
    /// verb on it.
    #[arg(long = "as", value_name = "USER", requires = "online")]
    pub as_user: Option<String>,
    /// With `--online`: bound on each request to an API server.
    #[arg(long, default_value = "10s", requires = "online")]
    pub timeout: humantime::Duration,
}

/// `kubesink fold` options: exactly one source (`--file`, or a destination's reader:
/// `--kafka`, `--nats`).
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true)))]
pub struct FoldArgs {
    /// A JSON Lines file, or `-` for stdin: topology messages (the stdout sink's output),
    /// CloudEvents envelopes (what an HTTP receiver wrote down), or OTLP JSON logs requests (an
    /// OpenTelemetry Collector's file exporter fed by the OTLP sink).
    #[arg(long, value_name = "PATH", group = "source")]
    pub file: Option<PathBuf>,
    /// The destinations' sources (`--kafka`, `--nats`: `src/sinks.rs`'s readers).
    #[command(flatten)]
    pub readers: crate::sinks::ReaderArgs,
    /// Output: `json` (JSON Lines, one object per key, ordered by key) or `table`.
    #[arg(long, short = 'o', value_enum, default_value_t = FoldOutput::Json)]
    pub output: FoldOutput,
    /// Include each key's last `object` in the JSON output.
    #[arg(long)]
    pub objects: bool,
    /// After printing the view, keep reading and print each change as it folds (JSON Lines:
    /// the key's new entry, or `{"key", "op": "deleted" | "tombstone" | "swept"}`).
    #[arg(long, conflicts_with = "against_cluster")]
    pub follow: bool,
    /// Compare the view with a live list of the configured clusters and resources (`--config`,
    /// or the defaults with the current kubeconfig) and print the differences as JSON Lines
    /// (`missing`, `ghost`, `uid`); exit 1 when there are any.
    #[arg(long)]
    pub against_cluster: bool,
    /// With `--against-cluster`: the view is what the sink of this name (`--config`'s
    /// `[[sinks]]`) holds, so the live objects are also filtered by its `filter` (a route,
    /// docs/configuration.md). A sink whose filter names `op` or `changed` chooses changes,
    /// not objects, and is refused. With `--repair`, the deletes go through that sink only
    /// (a ghost of one route may be an object another route holds).
    #[arg(long, value_name = "NAME", requires = "against_cluster")]
    pub sink: Option<String>,
    /// With `--against-cluster`: publish a `deleted` message (inferred: `finalStateUnknown:
    /// true`, no `object`) for every ghost, through the sinks of the configuration
    /// (`--config`'s `[[sinks]]`, as `kubesink run` builds them). The repair of a stream whose
    /// kubesink ran without state while objects were deleted (docs/restarts.md). Exit 0 when
    /// ghosts were the only difference; `missing`, `uid` and `stale` are left to kubesink
    /// (its next full list re-sends them).
    #[arg(long, requires = "against_cluster")]
    pub repair: bool,
    /// With `--against-cluster`, also report objects whose resourceVersion differs (`stale`).
    /// Only meaningful for `payload = "full"` resources without `drop` or `ignore_changes`:
    /// the others leave the view's resourceVersion at the last emitted state.
    #[arg(long, requires = "against_cluster")]
    pub compare_resource_version: bool,
    /// Bound on connecting and on the start-up requests to the broker.
    #[arg(long, default_value = "10s")]
    pub timeout: humantime::Duration,
}

/// `kubesink fold --output`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum FoldOutput {
    /// JSON Lines.
    Json,
    /// Aligned columns.
    Table,
}

/// `kubesink rbac` options. The defaults match `deploy/base/`.
#[derive(Debug, Clone, clap::Args)]
pub struct RbacArgs {
    /// The service account kubesink runs as.
    #[arg(long, default_value = "kubesink")]
    pub service_account: String,
    /// The service account's namespace; also the Lease's, unless
    /// `leader_election.lease_namespace` is set.
    #[arg(long, default_value = "kubesink")]
    pub namespace: String,
    /// Name of the generated ClusterRole, Roles and bindings (`NAME-leader-election` for the
    /// Lease's); also the Lease's name unless `leader_election.lease_name` is set.
    #[arg(long, default_value = "kubesink")]
    pub name: String,
}

/// `kubesink demo` options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Pods in the simulated cluster.
    #[arg(long, default_value_t = 200)]
    pub pods: usize,
    /// Changes per second applied by the simulated workload.
    #[arg(long, default_value_t = 20.0)]
    pub churn: f64,
    /// Seed of the simulated workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where kubesink serves /metrics, /healthz and /readyz during the demo. Default
    /// 127.0.0.1:9090, or a free port when 9090 is taken (the address is logged); an address
    /// given here must be free.
    #[arg(long)]
    pub listen: Option<String>,
}

/// Filter directives that quiet client libraries whose own lines kubesink writes better,
/// each unless the filter names the library (`RUST_LOG=async_nats=debug` wins):
/// - kube's client logs every failed request at ERROR ("failed with error client error
///   (Connect)"); the informers log each failure themselves, classified and once per streak,
///   so kube's line would only say it twice;
/// - async-nats logs each connection event at INFO (`event: client error: nats: IO error`
///   once a second while a server is down) and each connect; the NATS clients log their
///   connection's outages themselves (`kubesink_core::outage`: a WARN at the start, a
///   summary a minute, an INFO with the counts at the end). Its WARN and ERROR lines stay.
///
/// `max` is the filter's most verbose level (`EnvFilter::max_level_hint`, `None`: unknown): a directive never makes a
/// library louder than the filter asked (`--log-level error` keeps async-nats' WARN lines out).
pub fn quieted_libraries(named: &str, max: Option<LevelFilter>) -> Vec<String> {
    [
        (
            "kube_client",
            "kube_client::client::builder",
            LevelFilter::OFF,
        ),
        ("async_nats", "async_nats", LevelFilter::WARN),
    ]
    .into_iter()
    .filter(|(library, _, level)| !named.contains(library) && max.is_none_or(|m| m > *level))
    .map(|(_, target, level)| format!("{target}={level}"))
    .collect()
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// Installs the tracing subscriber writing to stderr. Colours (ANSI escape codes) only when
/// stderr is a terminal and `NO_COLOR` is unset (<https://no-color.org>): in a Pod, stderr is
/// never a terminal, and `kubectl logs` would show the codes.
pub fn init_logging(format: LogFormat, level: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let mut filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let named = std::env::var("RUST_LOG").unwrap_or_default() + level;
    for directive in quieted_libraries(&named, filter.max_level_hint()) {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noisy_libraries_are_quieted_unless_named_or_already_quieter() {
        let info = Some(LevelFilter::INFO);
        assert_eq!(
            quieted_libraries("info", info),
            ["kube_client::client::builder=off", "async_nats=warn"]
        );
        assert_eq!(
            quieted_libraries("info,async_nats=debug", info),
            ["kube_client::client::builder=off"],
            "a filter naming async_nats wins"
        );
        assert_eq!(
            quieted_libraries("kube_client=debug", None),
            ["async_nats=warn"]
        );
        assert_eq!(
            quieted_libraries("error", Some(LevelFilter::ERROR)),
            ["kube_client::client::builder=off"],
            "never louder than the filter"
        );
        assert!(quieted_libraries("off", Some(LevelFilter::OFF)).is_empty());
    }
}
