//! "The destination is reachable again": the one signal by which a sink (or the bridge's
//! readiness probe) wakes the pipeline's worker out of its retry backoff, so that delivery
//! resumes as soon as a broker is back instead of when the backoff runs out.
//!
//! It is a generation counter (a `tokio::sync::watch` channel): [`ReadySignal::notify`] bumps
//! it, a [`ReadyWatch`] resolves [`ReadyWatch::changed`] when the generation moved since it
//! last looked. A counter rather than an edge-triggered notification, so a reconnect that
//! happens while a `send` is still failing is not missed: the worker marks the generation
//! seen before each `send` and, after a failure, waits for whichever comes first, the backoff
//! or a newer generation.
//!
//! This module only carries the signal; it never decides to retry (the pipeline does).

use std::sync::Arc;

use tokio::sync::watch;

/// The sending side: held by a sink (NATS: the connection's `Connected` event; Kafka: the
/// broker-up watcher) and by the pipeline's handle of that sink. Cheap to clone; every clone
/// bumps the same counter.
#[derive(Clone, Debug)]
pub struct ReadySignal(Arc<watch::Sender<u64>>);

impl Default for ReadySignal {
    fn default() -> Self {
        ReadySignal(Arc::new(watch::Sender::new(0)))
    }
}

impl ReadySignal {
    /// A new signal at generation 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The destination is reachable again: wakes every [`ReadyWatch`] waiting on it.
    pub fn notify(&self) {
        self.0.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// A watch that sees the notifications from now on.
    pub fn subscribe(&self) -> ReadyWatch {
        ReadyWatch(self.0.subscribe())
    }

    /// How many times [`ReadySignal::notify`] was called.
    pub fn generation(&self) -> u64 {
        *self.0.borrow()
    }
}

/// The receiving side, owned by one worker.
#[derive(Debug)]
pub struct ReadyWatch(watch::Receiver<u64>);

impl ReadyWatch {
    /// Marks the current generation as seen: only a later [`ReadySignal::notify`] makes
    /// [`ReadyWatch::changed`] resolve.
    pub fn mark_seen(&mut self) {
        self.0.borrow_and_update();
    }

    /// Resolves once the generation moved since it was last seen (at once if it already
    /// has), and marks it seen. Never resolves when every [`ReadySignal`] is gone.
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_notification_before_the_wait_is_not_missed() {
        let s = ReadySignal::new();
        let mut w = s.subscribe();
        w.mark_seen();
        s.notify();
        tokio::time::timeout(Duration::from_secs(1), w.changed())
            .await
            .expect("the earlier notification counts");
        assert!(
            tokio::time::timeout(Duration::from_secs(1), w.changed())
                .await
                .is_err(),
            "seen once, then it waits for the next"
        );
        assert_eq!(s.generation(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_without_sender_waits_forever_instead_of_spinning() {
        let mut w = ReadySignal::new().subscribe();
        assert!(tokio::time::timeout(Duration::from_secs(5), w.changed())
            .await
            .is_err());
    }
}
