//! The `kubesink` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: the informer's parse → shape → encode path allocates and
/// frees many small JSON nodes per object, and glibc's malloc/free took ~30% of the CPU in a
/// profile of `cargo bench --bench throughput` (see docs/architecture.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use kubesink::cli::{init_logging, Cli, Command};
use kubesink::config;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log_level);
    let command = cli.command.unwrap_or(Command::Run);
    let result = match command {
        Command::Check => return check(cli.config.as_deref()),
        #[cfg(feature = "sim")]
        Command::Demo(args) => kubesink::demo::run(args).await,
        Command::Run => match config::load(cli.config.as_deref()) {
            Ok(c) => kubesink::bridge::run(c).await,
            Err(e) => {
                eprint!("{e}");
                return ExitCode::FAILURE;
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `kubesink check`: prints the effective configuration (secrets masked) or every problem.
fn check(file: Option<&std::path::Path>) -> ExitCode {
    match config::load(file) {
        Ok(c) => match toml::to_string_pretty(&c) {
            Ok(text) => {
                println!("# effective configuration (secrets masked)\n{text}");
                let warnings = config::warnings(&c);
                for w in &warnings {
                    eprintln!("warning: {w}");
                }
                match warnings.len() {
                    0 => eprintln!("configuration OK"),
                    n => eprintln!("configuration OK, with {n} warning(s)"),
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("configuration is valid but could not be printed: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprint!("{e}");
            ExitCode::FAILURE
        }
    }
}
