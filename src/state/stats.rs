//! Counters of one cluster's state store: saves and the journal, for `/metrics`, `/readyz`
//! and the logs. Written by the keeper and the journal writer; this module only counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kubesink_core::clock::now_ms;
use kubesink_core::{Problem, Streak};

/// The counters of one cluster's state.
#[derive(Debug, Default)]
pub struct StateStats {
    /// Saves that stored a snapshot.
    pub saves: AtomicU64,
    /// Saves that failed (packing or the backend).
    pub save_failures: AtomicU64,
    /// Unix time in milliseconds of the last stored snapshot (0: none yet).
    pub last_save_ms: AtomicU64,
    /// Size of the last stored snapshot, bytes.
    pub bytes: AtomicU64,
    /// Objects in the last stored snapshot (unconfirmed included).
    pub objects: AtomicU64,
    /// Of those, unconfirmed (sent as `added`, not yet confirmed by every sink).
    pub unconfirmed: AtomicU64,
    /// Duration of the last save (packing and storing), milliseconds.
    pub last_save_duration_ms: AtomicU64,
    /// Journal records appended (one per `added` about to be sent).
    pub journal_records: AtomicU64,
    /// Journal records durable (appended and stored); the difference is what sends wait for.
    pub journal_durable: AtomicU64,
    /// Journal frames stored.
    pub journal_frames: AtomicU64,
    /// Journal bytes stored.
    pub journal_bytes: AtomicU64,
    /// Failed journal appends (each retried).
    pub journal_errors: AtomicU64,
    /// Since when journal appends fail (not failing: the last succeeded).
    journal_failing: Streak,
    /// Objects restored at start (or when becoming the leader), all watches.
    pub restored_objects: AtomicU64,
    /// Of those, unconfirmed (re-sent or deleted by the first list).
    pub restored_unconfirmed: AtomicU64,
    /// Watches that could not use the saved state (a full initial list each).
    pub restore_ignored_watches: AtomicU64,
    /// Since when the saved state cannot be read, so the watches wait for it (not waiting:
    /// read, or not tried yet).
    restore_waiting: Streak,
    /// What the restore did, in one line (`/readyz`).
    restore: Problem,
    /// Why the last journal append, save or state read failed, while it does.
    problem: Problem,
}

impl StateStats {
    /// Records an append failure.
    pub fn note_journal_error(&self, e: &dyn std::fmt::Display) {
        self.journal_errors.fetch_add(1, Ordering::Relaxed);
        self.journal_failing.fail();
        self.problem.set(Some(format!("journal: {e}")));
    }

    /// Records a stored frame of `bytes` bytes; returns how long appends had been failing.
    pub fn note_journal_stored(&self, bytes: usize, durable: u64) -> Option<Duration> {
        self.journal_frames.fetch_add(1, Ordering::Relaxed);
        self.journal_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.journal_durable.store(durable, Ordering::Relaxed);
        let failed_for = self.journal_failing.end();
        if failed_for.is_some() {
            self.problem.set(None);
        }
        failed_for
    }

    /// How long journal appends have been failing, if they are.
    pub fn journal_failing_for(&self) -> Option<Duration> {
        self.journal_failing.failing_for()
    }

    /// Journal records appended and not yet durable.
    pub fn journal_pending(&self) -> u64 {
        self.journal_records
            .load(Ordering::Relaxed)
            .saturating_sub(self.journal_durable.load(Ordering::Relaxed))
    }

    /// Records a failed save.
    pub fn note_save_error(&self, e: &dyn std::fmt::Display) {
        self.save_failures.fetch_add(1, Ordering::Relaxed);
        self.problem.set(Some(format!("save: {e}")));
    }

    /// Records a stored snapshot.
    pub fn note_saved(&self, bytes: usize, objects: u64, unconfirmed: u64, took: Duration) {
        self.saves.fetch_add(1, Ordering::Relaxed);
        self.last_save_ms.store(now_ms(), Ordering::Relaxed);
        self.bytes.store(bytes as u64, Ordering::Relaxed);
        self.objects.store(objects, Ordering::Relaxed);
        self.unconfirmed.store(unconfirmed, Ordering::Relaxed);
        self.last_save_duration_ms.store(
            u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if !self.journal_failing.is_failing() {
            self.problem.set(None);
        }
    }

    /// Records that the saved state could not be read (`e`): the watches wait for it.
    pub fn note_restore_waiting(&self, e: &dyn std::fmt::Display) {
        self.restore_waiting.fail();
        self.restore.set(Some(format!(
            "waiting: the saved state cannot be read (the watches start once it is): {e}"
        )));
        self.problem.set(Some(format!("restore: {e}")));
    }

    /// How long the saved state has been unreadable while the watches wait for it, if they do.
    pub fn restore_waiting_for(&self) -> Option<Duration> {
        self.restore_waiting.failing_for()
    }

    /// Records what the restore did (and that it no longer waits).
    pub fn note_restore(&self, objects: u64, unconfirmed: u64, ignored: u64, summary: String) {
        if self.restore_waiting.end().is_some() {
            self.problem.set(None); // the read's problem; no save or append ran yet
        }
        self.restored_objects.store(objects, Ordering::Relaxed);
        self.restored_unconfirmed
            .store(unconfirmed, Ordering::Relaxed);
        self.restore_ignored_watches
            .store(ignored, Ordering::Relaxed);
        self.restore.set(Some(summary));
    }

    /// What the restore did, once it ran.
    pub fn restore(&self) -> Option<String> {
        self.restore.get()
    }

    /// What is wrong, if anything.
    pub fn problem(&self) -> Option<String> {
        self.problem.get()
    }
}
