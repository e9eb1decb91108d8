//! The process-wide budget of lists in flight (`watch.max_concurrent_lists`): across every
//! cluster of the process, at most that many informers read a list (initial list or relist)
//! at once; the others wait for a slot, first come first served.
//!
//! # Why
//!
//! A list is the expensive part of an informer's life: while it is read, its HTTP buffers,
//! the objects being decoded and (with paged lists) the item being read and the rest of the
//! last chunk of its page (pages are split as they arrive: `decode.rs`, `PageSplitter`; a
//! protobuf page, one message, is decoded whole) are in memory. A cold start of a fleet (`[[clusters]]` × 50) starts every cluster's
//! lists at once, so its peak grows with the number of clusters although the objects, and
//! the steady state, are the same as one large cluster's. With a budget the peak is that of
//! `max_concurrent_lists` lists, whatever the number of clusters; on two cores the lists of
//! one process are decoded no faster with more of them at once, so the sync does not take
//! longer (measured in `BENCHMARKS.md`, "Many clusters in one process").
//!
//! # What holds a slot
//!
//! A paged list from before its first page request until its last page was decided; a
//! streaming list (KEP-3157) from before its request until its BOOKMARK annotated
//! `k8s.io/initial-events-end` was decided: the watch it goes on as holds no slot. Every way
//! out of a list releases the slot (a [`ListSlot`] is released when dropped): completion, an
//! error, 410 Gone, a fallback to paged lists, the informer's cancellation. The backoff
//! before a retried list holds none. The one-name lookups of a DELETED object under a
//! selector (`Requests::still_there`) are not lists of the informer and take none.
//!
//! # Fairness and backpressure
//!
//! Slots are handed out in the order asked (`tokio::sync::Semaphore` is fair), so a cluster
//! whose informers asked first lists first, and no informer waits behind a later one. A list
//! that waits for the pipeline (a full sink queue) keeps its slot; the lists without one
//! could not have sent anything either, since backpressure holds every informer.
//!
//! This module never sends a request and never decides anything about objects.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// The process's list slots and what they did; shared by every informer of every cluster.
#[derive(Debug)]
pub struct ListBudget {
    /// `None`: no limit (`watch.max_concurrent_lists = 0`).
    slots: Option<Arc<Semaphore>>,
    /// `watch.max_concurrent_lists` (0: no limit).
    limit: usize,
    /// Lists being read now.
    pub in_flight: AtomicU64,
    /// The most lists read at once since the start.
    pub peak: AtomicU64,
    /// Lists waiting for a slot now.
    pub waiting: AtomicU64,
    /// Lists that had to wait for a slot, since the start.
    pub waits: AtomicU64,
    /// Time lists waited for a slot, in all, in nanoseconds.
    pub wait_nanos: AtomicU64,
}

impl ListBudget {
    /// A budget of `max` lists at once; 0 means no limit (every list starts at once, as before
    /// the budget existed).
    pub fn new(max: usize) -> Self {
        ListBudget {
            slots: (max > 0).then(|| Arc::new(Semaphore::new(max))),
            limit: max,
            in_flight: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
        }
    }

    /// The configured limit (0: none).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Time lists waited for a slot, in all.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.wait_nanos.load(Ordering::Relaxed))
    }

    /// Waits for a slot (at once while one is free, or without a limit) and returns it; the
    /// slot is given back when the returned [`ListSlot`] is dropped. A list that has to wait
    /// logs it at DEBUG (in the informer's span), with how many lists are in flight, and
    /// again when its turn came. Cancel-safe: a wait that is dropped leaves the queue.
    pub async fn acquire(self: &Arc<Self>) -> ListSlot {
        let permit = match &self.slots {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(TryAcquireError::Closed) => None,
                Err(TryAcquireError::NoPermits) => self.wait(slots).await,
            },
        };
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        ListSlot {
            budget: self.clone(),
            _permit: permit,
        }
    }

    /// Queues for a slot of `slots` (none is free), counting the wait.
    async fn wait(&self, slots: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
        /// Counts the list in `waiting` until its turn comes or its wait is dropped.
        struct Waiting<'a>(&'a AtomicU64);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let queued = self.waiting.fetch_add(1, Ordering::Relaxed) + 1;
        let _waiting = Waiting(&self.waiting);
        tracing::debug!(
            max_concurrent_lists = self.limit,
            in_flight = self.in_flight.load(Ordering::Relaxed),
            waiting = queued,
            "list waits for a slot (watch.max_concurrent_lists)"
        );
        let started = Instant::now();
        // The semaphore is never closed; were it, the list would go without a slot.
        let permit = slots.clone().acquire_owned().await.ok();
        let waited = started.elapsed();
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.wait_nanos.fetch_add(
            u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        tracing::debug!(waited = ?waited, "list got its slot");
        permit
    }
}

/// A list's slot in the [`ListBudget`]: held while the list is read, given back when dropped.
#[derive(Debug)]
pub struct ListSlot {
    budget: Arc<ListBudget>,
    /// `None` without a limit.
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for ListSlot {
    fn drop(&mut self) {
        self.budget.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_more_slots_than_the_limit_and_each_is_given_back_when_dropped() {
        let budget = Arc::new(ListBudget::new(2));
        let a = budget.acquire().await;
        let b = budget.acquire().await;
        assert_eq!(budget.in_flight.load(Ordering::Relaxed), 2);
        let third = tokio::spawn({
            let budget = budget.clone();
            async move {
                let _slot = budget.acquire().await;
            }
        });
        while budget.waiting.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!third.is_finished());
        drop(a);
        third.await.unwrap();
        drop(b);
        assert_eq!(budget.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(budget.peak.load(Ordering::Relaxed), 2);
        assert_eq!(budget.waits.load(Ordering::Relaxed), 1);
        assert_eq!(budget.waiting.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn slots_go_to_the_lists_in_the_order_they_asked() {
        let budget = Arc::new(ListBudget::new(1));
        let first = budget.acquire().await;
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (mine, order) = (budget.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _slot = mine.acquire().await;
                order.lock().unwrap().push(i);
            }));
            // Each asks before the next one does.
            while budget.waiting.load(Ordering::Relaxed) < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_the_queue_and_holds_nothing() {
        let budget = Arc::new(ListBudget::new(1));
        let held = budget.acquire().await;
        let waiter = tokio::spawn({
            let budget = budget.clone();
            async move {
                let _slot = budget.acquire().await;
            }
        });
        while budget.waiting.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(budget.waiting.load(Ordering::Relaxed), 0);
        drop(held);
        // The slot is free again: taken at once, no wait counted.
        let _again = budget.acquire().await;
        assert_eq!(budget.waits.load(Ordering::Relaxed), 0);
        assert_eq!(budget.in_flight.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn zero_is_no_limit() {
        let budget = Arc::new(ListBudget::new(0));
        let slots: Vec<ListSlot> =
            futures::future::join_all((0..100).map(|_| budget.acquire())).await;
        assert_eq!(budget.in_flight.load(Ordering::Relaxed), 100);
        assert_eq!(budget.waits.load(Ordering::Relaxed), 0);
        drop(slots);
        assert_eq!(budget.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(budget.limit(), 0);
    }
}
