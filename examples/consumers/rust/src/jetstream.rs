//! JetStream: an ordered consumer (ephemeral, nothing left on the server) from the sequence
//! after the checkpoint's, or the first. Caught up = the stream's last sequence at start was
//! folded, or nothing is pending.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use futures::StreamExt;

use crate::view::Checkpoint;

pub async fn run(
    server: &str,
    stream: &str,
    subject: Option<String>,
    checkpoint: &Path,
    exit_when_caught_up: bool,
) -> anyhow::Result<()> {
    // Position: the last stream sequence folded.
    let mut view: Checkpoint<u64> = Checkpoint::load(checkpoint)?;
    let client = async_nats::connect(server)
        .await
        .with_context(|| format!("NATS at {server}"))?;
    let js = jetstream::new(client);
    let mut s = js
        .get_stream(stream)
        .await
        .with_context(|| format!("JetStream stream {stream} at {server}"))?;
    let last = s.info().await?.state.last_sequence;
    let consumer = s
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: view.position + 1,
            },
            filter_subject: subject.unwrap_or_default(),
            ..Default::default()
        })
        .await?;
    let mut caught_up = view.position >= last || consumer.cached_info().num_pending == 0;
    let mut messages = consumer.messages().await?;
    let stop = crate::stopped();
    tokio::pin!(stop);
    let mut saved = Instant::now();
    while !(caught_up && exit_when_caught_up) {
        tokio::select! {
            _ = &mut stop => break,
            m = tokio::time::timeout(Duration::from_millis(200), messages.next()) => {
                if let Ok(Some(m)) = m {
                    let m = m?;
                    let info = m.info().map_err(|e| anyhow::anyhow!("{e}"))?;
                    let (seq, pending) = (info.stream_sequence, info.pending);
                    view.apply(Some(&m.payload), None, None)
                        .with_context(|| format!("stream sequence {seq}"))?;
                    view.position = seq;
                    caught_up |= seq >= last || pending == 0;
                }
            }
        }
        if saved.elapsed() > Duration::from_secs(1) {
            view.save(checkpoint)?;
            saved = Instant::now();
        }
    }
    view.save(checkpoint)?;
    if caught_up {
        view.print();
    }
    Ok(())
}
