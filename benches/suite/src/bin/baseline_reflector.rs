//! `baseline-reflector`: what an ordinary informer does, as the benchmark suite's memory and
//! CPU anchor. A kube-runtime `reflector` over the full typed `k8s_openapi` `Pod`, all
//! namespaces, with its store kept (every object held, as client-go's and kube-rs's
//! informers do). The system allocator, as an ordinary program has.
//!
//! Connects with the usual kubeconfig rules (`KUBECONFIG`). Writes `synced N` on stdout when
//! the initial list is done (N objects in the store), then `events N` after every 1,000 watch
//! events; errors go to stderr and the watcher retries with kube-runtime's default backoff.
//!
//! `baseline-reflector [--page-size 500]`

use std::pin::pin;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};

/// An ordinary informer: a kube-runtime `reflector` over full `Pod`s from the current
/// kubeconfig's API server, its store kept (BENCHMARKS.md).
#[derive(clap::Parser)]
#[command(name = "baseline-reflector")]
struct Args {
    /// Objects per list page (`limit`).
    #[arg(long, default_value_t = 500)]
    page_size: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args { page_size } = <Args as clap::Parser>::parse();
    let client = Client::try_default().await?;
    let api: Api<Pod> = Api::all(client);
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default().page_size(page_size)),
    )
    .default_backoff();
    let mut stream = pin!(stream);
    let mut events = 0u64;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::InitDone) => println!("synced {}", reader.state().len()),
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                events += 1;
                if events.is_multiple_of(1000) {
                    println!("events {events}");
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("watch error: {e}"),
        }
    }
    Ok(())
}
