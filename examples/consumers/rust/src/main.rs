//! A reference consumer of kubesink's output, as a team would write it from the docs
//! (docs/consumers.md): keeps the current view of the cluster, resumes from a checkpoint,
//! knows when it has caught up, sweeps with sync markers.
//!
//! ```sh
//! kubesink-consumer-example --checkpoint view.json kafka --bootstrap localhost:9092 --topic kubesink.prod
//! kubesink-consumer-example --checkpoint view.json jetstream --server nats://localhost:4222 --stream KUBESINK
//! ```
//!
//! Without a checkpoint file it rebuilds from the start; with one, it resumes from the saved
//! position. With `--exit-when-caught-up` it prints the view as JSON Lines once caught up
//! and exits; otherwise it keeps folding, checkpointing every second, until SIGTERM/Ctrl-C.

mod jetstream;
mod kafka;
mod view;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Args {
    /// The checkpoint file (view + broker position).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Print the view and exit once caught up.
    #[arg(long)]
    exit_when_caught_up: bool,
    #[command(subcommand)]
    source: Source,
}

#[derive(Subcommand)]
enum Source {
    /// Every partition of a Kafka topic.
    Kafka {
        #[arg(long)]
        bootstrap: String,
        #[arg(long)]
        topic: String,
    },
    /// A JetStream stream.
    Jetstream {
        #[arg(long)]
        server: String,
        #[arg(long)]
        stream: String,
        /// A subject filter within the stream's subjects (`kubesink.prod.core.Pod.*.*`).
        #[arg(long)]
        subject: Option<String>,
    },
}

/// Resolves on SIGTERM or Ctrl-C.
async fn stopped() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.source {
        Source::Kafka { bootstrap, topic } => {
            kafka::run(
                &bootstrap,
                &topic,
                &args.checkpoint,
                args.exit_when_caught_up,
            )
            .await
        }
        Source::Jetstream {
            server,
            stream,
            subject,
        } => {
            jetstream::run(
                &server,
                &stream,
                subject,
                &args.checkpoint,
                args.exit_when_caught_up,
            )
            .await
        }
    }
}
