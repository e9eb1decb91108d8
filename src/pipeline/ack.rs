//! Acknowledgements: how a change tells its informer's store that every sink is done with it
//! ([`Settle`], [`Ack`]), and the write-ahead position a batch waits for before it may be
//! sent ([`WriteAhead`], [`Durability`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Told when a sink is done with a change (see [`Ack`]).
pub trait Settle: Send + Sync {
    /// Called once per sink the change was queued for: after that sink confirmed it, or when
    /// coalescing replaced it in that sink's queue. Never for a sink that did not deliver
    /// it. Called from the sink's worker or a publisher, outside the queue's lock; must not
    /// block.
    fn settle(&self);

    /// The point of a write-ahead log that must be durable before any sink sends the change
    /// (the state journal of new keys, `state/journal.rs`); `None`: no condition.
    fn write_ahead(&self) -> Option<&WriteAhead> {
        None
    }
}

/// How far one write-ahead log is durable, shared by its writer (which publishes the durable
/// position) and the senders that wait for it (which say how far they need it, so the writer
/// can store at once on demand rather than on a timer).
#[derive(Debug)]
pub struct Durability {
    durable: tokio::sync::watch::Receiver<u64>,
    /// The highest position a sender waits for.
    wanted: AtomicU64,
    demand: tokio::sync::Notify,
}

impl Durability {
    /// The durability whose durable position `durable` publishes (the writer keeps the
    /// sender; dropping it releases every waiting sender).
    pub fn new(durable: tokio::sync::watch::Receiver<u64>) -> Arc<Self> {
        Arc::new(Durability {
            durable,
            wanted: AtomicU64::new(0),
            demand: tokio::sync::Notify::new(),
        })
    }

    /// The durable position.
    pub fn durable(&self) -> u64 {
        *self.durable.borrow()
    }

    /// The highest position a sender has waited for.
    pub fn wanted(&self) -> u64 {
        self.wanted.load(Ordering::Acquire)
    }

    /// Resolves when a sender starts waiting for a position (or already did since the last
    /// call): the writer's cue to store what it holds.
    pub async fn demanded(&self) {
        self.demand.notified().await
    }
}

/// A position in a write-ahead log: a change carrying it is sent only once the log is
/// durable up to it (group commit: the worker waits once per batch, for the highest
/// position in it). Positions of one log grow with every record; a coalesced change is
/// replaced by a newer one, whose position is not lower.
#[derive(Clone, Debug)]
pub struct WriteAhead {
    log: Arc<Durability>,
    position: u64,
}

impl WriteAhead {
    /// Position `position` of the log `log`.
    pub fn new(log: Arc<Durability>, position: u64) -> Self {
        WriteAhead { log, position }
    }

    /// The position.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Whether the log is durable up to this position.
    pub fn is_durable(&self) -> bool {
        self.log.durable() >= self.position
    }

    /// Waits until the log is durable up to this position, telling its writer it is wanted.
    /// Returns `false` when the log closed first (its writer stopped): the caller then sends
    /// without the guarantee, which only a writer that died unexpectedly can cause (at
    /// shutdown the log outlives the pipeline).
    pub async fn wait(&self) -> bool {
        let mut rx = self.log.durable.clone();
        if *rx.borrow_and_update() >= self.position {
            return true;
        }
        self.log.wanted.fetch_max(self.position, Ordering::AcqRel);
        self.log.demand.notify_one();
        // Bound first: the `Ref` the wait returns borrows `rx` and must be dropped before it.
        let durable = rx.wait_for(|d| *d >= self.position).await.is_ok();
        durable
    }

    /// Whether `other` is a position of the same log.
    pub(super) fn same_log(&self, other: &WriteAhead) -> bool {
        Arc::ptr_eq(&self.log, &other.log)
    }
}

/// The acknowledgement handle a change carries through the queues: one reference-counted
/// object per change, shared by every sink's copy.
pub type Ack = Arc<dyn Settle>;
