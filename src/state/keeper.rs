//! The keeper: saves one cluster's acknowledged informer state on an interval and at
//! shutdown. Each save starts a journal generation, packs every watch's acknowledged state
//! (confirmed entries, and unconfirmed ones for outstanding `added`s) tagged with it, stores
//! it, then drops the journal generations it covers (`journal.rs`). Never saves while this
//! replica may not lead (its fence closed), so a deposed leader cannot overwrite its
//! successor's state.
//!
//! One save at a time: a save requested while another runs (shutdown's final save while an
//! interval save still stores) waits for it, so snapshots are stored, and journal
//! generations dropped, in the order their generations started; an older snapshot can never
//! land over a newer one whose covered journal is already gone. A save, once it has its turn,
//! runs to its end in its own task even when its caller stops waiting (shutdown's deadline),
//! so the next one cannot start while it still writes. The final save is the last: no save
//! runs after it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kubesink_core::state::{StateError, StateStore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::journal::Journal;
use super::snapshot::Writer;
use super::stats::StateStats;
use super::watch_key::WatchKey;
use crate::informer::TrackedStore;
use crate::leader::Fence;

/// The first wait before retrying a failed final save; doubled up to
/// [`FINAL_SAVE_RETRY_MAX`].
const FINAL_SAVE_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between tries of the final save.
const FINAL_SAVE_RETRY_MAX: Duration = Duration::from_secs(2);

/// One watch whose acknowledged state the [`Keeper`] saves.
pub struct Kept {
    /// Identity and selection, written with its section.
    pub key: WatchKey,
    /// The informer's shared store.
    pub store: Arc<TrackedStore>,
}

/// What one save did.
#[derive(Clone, Copy, Debug, Default)]
pub struct SaveReport {
    /// Objects written, all watches (unconfirmed included).
    pub objects: u64,
    /// Of those, unconfirmed: sent as `added`, not yet confirmed by every sink.
    pub unconfirmed: u64,
    /// Size of the state, bytes.
    pub bytes: usize,
    /// Time to pack every watch's acknowledged state (locks included).
    pub pack: Duration,
    /// The longest a watch's store was locked while packed (its informer waits meanwhile).
    pub longest_lock: Duration,
    /// Time the backend took to store the bytes (file: write, fsync, rename).
    pub write: Duration,
    /// Time to drop the journal generations the snapshot covers.
    pub journal_drop: Duration,
}

/// Saves the acknowledged state of every watch: on an interval, and once more at shutdown.
pub struct Keeper {
    store: Arc<dyn StateStore>,
    cluster: String,
    watches: Arc<Vec<Kept>>,
    /// The journal of new keys, rotated at every save (without `state.write_ahead`: none).
    journal: Option<Arc<Journal>>,
    /// Saves only while this replica may emit (leader election): a deposed leader must not
    /// overwrite its successor's state.
    fence: Fence,
    stats: Arc<StateStats>,
    /// The stores' versions at the last successful save: an unchanged state is not rewritten.
    saved: Mutex<Option<Vec<u64>>>,
    /// One save at a time: held, for the whole of a save, by the task that runs it.
    turn: Arc<tokio::sync::Mutex<Turn>>,
    /// Saves requested while another runs, waiting for their turn.
    waiting: AtomicUsize,
    /// When the save that has the turn started it.
    running_since: Mutex<Option<Instant>>,
}

/// The state of the save turn.
#[derive(Debug, Default)]
struct Turn {
    /// The final save took its turn: no save runs after it.
    closed: bool,
}

impl Keeper {
    /// A keeper of `watches` in `store` for cluster `cluster`, rotating `journal` at every
    /// save, saving only while `fence` is open, counting into `stats`.
    pub fn new(
        store: Arc<dyn StateStore>,
        cluster: &str,
        watches: Vec<Kept>,
        journal: Option<Arc<Journal>>,
        fence: Fence,
        stats: Arc<StateStats>,
    ) -> Arc<Self> {
        Arc::new(Keeper {
            store,
            cluster: cluster.to_owned(),
            watches: Arc::new(watches),
            journal,
            fence,
            stats,
            saved: Mutex::new(None),
            turn: Arc::default(),
            waiting: AtomicUsize::new(0),
            running_since: Mutex::new(None),
        })
    }

    /// Saves requested while another runs, waiting for it.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// How long the save that runs now has been running (`None`: none runs), for the log
    /// line of a shutdown that could not wait for it.
    pub fn running_for(&self) -> Option<std::time::Duration> {
        self.running_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
    }

    /// Where the state goes, for logs.
    pub fn describe(&self) -> &str {
        self.store.describe()
    }

    /// Waits for its turn (a save that runs finishes first), then starts a journal generation
    /// (with a journal), packs the acknowledged state of every watch (each store locked only
    /// while its own section is written, on a blocking thread) with that generation, stores
    /// it, then drops the older journal generations. Returns `Ok(None)` without writing when
    /// nothing changed since the last save and `force` is false, or when the final save
    /// already had its turn. Runs in a task of its own: a caller that stops waiting does not
    /// stop it.
    ///
    /// # Errors
    /// [`StateError`] from the backend or the packing task, and [`StateError::Fenced`] when
    /// this replica may no longer lead.
    pub async fn save(self: &Arc<Self>, force: bool) -> Result<Option<SaveReport>, StateError> {
        self.in_turn(force, false).await
    }

    /// The final save, at shutdown after the pipeline drained: [`Keeper::save`] forced, after
    /// any save that runs or waits, and the last one (later requests write nothing). A
    /// failure is retried (100 ms, doubling to 2 s) until it lands or this replica no longer
    /// leads; the caller bounds the wait with the shutdown deadline.
    ///
    /// # Errors
    /// As [`Keeper::save`].
    pub async fn final_save(self: &Arc<Self>) -> Result<Option<SaveReport>, StateError> {
        self.in_turn(true, true).await
    }

    async fn in_turn(
        self: &Arc<Self>,
        force: bool,
        last: bool,
    ) -> Result<Option<SaveReport>, StateError> {
        let keeper = self.clone();
        let task = tokio::spawn(async move {
            keeper.waiting.fetch_add(1, Ordering::SeqCst);
            let mut turn = keeper.turn.clone().lock_owned().await;
            keeper.waiting.fetch_sub(1, Ordering::SeqCst);
            if turn.closed {
                return Ok(None);
            }
            turn.closed = last;
            keeper.set_running(Some(Instant::now()));
            let mut result = keeper.save_inner(force).await;
            // The final save is retried (the caller's shutdown deadline bounds the wait): a
            // first failure can be the very write that finds the state store reset, and the
            // next try stores the whole state again. A replica that no longer
            // leads does not retry.
            let mut delay = FINAL_SAVE_RETRY;
            while last
                && result.as_ref().is_err_and(|e| {
                    !matches!(e, StateError::Fenced | StateError::Superseded { .. })
                })
            {
                if let Err(e) = &result {
                    keeper.stats.note_save_error(e);
                    tracing::warn!(store = keeper.describe(), error = %e, retry_in = ?delay, "the final save of the informer state failed; retrying until the shutdown deadline");
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(FINAL_SAVE_RETRY_MAX);
                result = keeper.save_inner(true).await;
            }
            keeper.set_running(None);
            if let Err(e) = &result {
                if !matches!(e, StateError::Fenced | StateError::Superseded { .. }) {
                    keeper.stats.note_save_error(e);
                }
            }
            result
        });
        task.await.map_err(|e| StateError::Task {
            what: "saving",
            detail: e.to_string(),
        })?
    }

    fn set_running(&self, since: Option<Instant>) {
        *self.running_since.lock().unwrap_or_else(|p| p.into_inner()) = since;
    }

    async fn save_inner(&self, force: bool) -> Result<Option<SaveReport>, StateError> {
        if !self.fence.is_open() {
            return Err(StateError::Fenced);
        }
        let versions: Vec<u64> = self.watches.iter().map(|w| w.store.version()).collect();
        let unchanged = self
            .saved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            == Some(&versions);
        if unchanged && !force {
            // Nothing to write: ask the store whether it still holds the last save (a state
            // topic lost while quiet is otherwise found only by the next write).
            if self.store.verify().await? {
                return Ok(None);
            }
            tracing::warn!(
                store = self.describe(),
                "the saved informer state was lost from the store: saving it whole again"
            );
        }
        let started = Instant::now();
        // Records appended from here on are in the new generation; everything before is in
        // what is packed next (confirmed, or unconfirmed while outstanding).
        let generation = self.journal.as_ref().map_or(0, |j| j.rotate());
        let (watches, cluster) = (self.watches.clone(), self.cluster.clone());
        let packed = tokio::task::spawn_blocking(move || pack(&cluster, &watches, generation))
            .await
            .map_err(|e| StateError::Task {
                what: "packing",
                detail: e.to_string(),
            })?;
        let (bytes, mut report) = packed;
        if !self.fence.is_open() {
            return Err(StateError::Fenced);
        }
        let writing = Instant::now();
        // A successor's newer state is never overwritten: the fence
        // is this replica's own clock, the saved generation the store's word.
        self.not_superseded(generation).await?;
        // A save raced against the fence: a leader deposed while it
        // writes abandons the write rather than landing a state after its successor's.
        tokio::select! {
            biased;
            _ = self.fence.closed() => return Err(StateError::Fenced),
            saved = self.store.save(bytes, generation) => saved?,
        }
        report.write = writing.elapsed();
        *self.saved.lock().unwrap_or_else(|p| p.into_inner()) = Some(versions);
        self.stats.note_saved(
            report.bytes,
            report.objects,
            report.unconfirmed,
            started.elapsed(),
        );
        if self.journal.is_some() {
            // Checked again: a successor that saved since must keep the journal it read.
            self.not_superseded(generation).await?;
            let dropping = Instant::now();
            // Dropping journal generations is fenced too: a deposed leader's purge could
            // delete frames its successor relies on.
            let dropped = tokio::select! {
                biased;
                _ = self.fence.closed() => return Err(StateError::Fenced),
                dropped = self.store.drop_journal_before(generation) => dropped,
            };
            if let Err(e) = dropped {
                tracing::warn!(store = self.describe(), error = %e, "dropping the journal the saved state covers failed; the next save tries again (a restart replays a little more)");
            }
            report.journal_drop = dropping.elapsed();
        }
        Ok(Some(report))
    }

    /// `Err(`[`StateError::Superseded`]`)` when the store holds a state of a newer
    /// generation than `generation` (another replica took over and saved since; see
    /// [`StateStore::saved_generation`]). Without a journal every generation is 0: nothing
    /// to compare.
    async fn not_superseded(&self, generation: u64) -> Result<(), StateError> {
        if generation == 0 {
            return Ok(());
        }
        match self.store.saved_generation().await? {
            Some(saved) if saved > generation => {
                tracing::warn!(store = self.describe(), saved, ours = generation, "not saving the informer state: another replica saved a newer one since (it took over); this replica no longer leads");
                Err(StateError::Superseded {
                    saved,
                    ours: generation,
                })
            }
            _ => Ok(()),
        }
    }

    /// Saves every `interval` until `cancel` fires (the final save is the caller's, after the
    /// pipeline drained: [`Keeper::final_save`], which waits for a save this task runs). A
    /// failed save is logged and retried at the next tick.
    pub fn spawn(
        self: &Arc<Self>,
        interval: Duration,
        cancel: CancellationToken,
    ) -> JoinHandle<()> {
        let keeper = self.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match keeper.save(false).await {
                    Ok(Some(r)) => {
                        tracing::debug!(store = keeper.describe(), objects = r.objects, unconfirmed = r.unconfirmed, bytes = r.bytes, pack = ?r.pack, longest_lock = ?r.longest_lock, write = ?r.write, journal_drop = ?r.journal_drop, "informer state saved")
                    }
                    Ok(None) => {}
                    // Logged where it was found.
                    Err(StateError::Superseded { .. }) => {}
                    Err(StateError::Fenced) => {
                        tracing::debug!(
                            store = keeper.describe(),
                            "not saving the informer state: this replica may no longer lead"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(store = keeper.describe(), error = %e, "saving the informer state failed; retrying at the next interval")
                    }
                }
            }
        })
    }
}

/// The snapshot of `watches` at journal generation `generation`, and what packing it took.
fn pack(cluster: &str, watches: &[Kept], generation: u64) -> (Vec<u8>, SaveReport) {
    let started = Instant::now();
    let mut w = Writer::new(cluster, kubesink_core::clock::now_ms(), generation);
    let mut report = SaveReport::default();
    for kept in watches {
        let locked = Instant::now();
        let (objects, unconfirmed) = kept
            .store
            .acknowledged(|a| w.section(&kept.key.identity, kept.key.selection, a));
        report.objects += objects;
        report.unconfirmed += unconfirmed;
        report.longest_lock = report.longest_lock.max(locked.elapsed());
    }
    let bytes = w.finish();
    report.bytes = bytes.len();
    report.pack = started.elapsed();
    (bytes, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::informer::{Facts, LightStore};
    use crate::state::file::FileStore;
    use crate::state::journal::frame;

    const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";

    fn key() -> WatchKey {
        WatchKey {
            identity: "core/Pod/".into(),
            selection: 7,
            seed: None,
        }
    }

    #[tokio::test]
    async fn a_save_rotates_the_journal_and_drops_the_generations_it_covers() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> = Arc::new(FileStore::new(dir.path().join("state")));
        let stats = Arc::new(StateStats::default());
        let journal = Journal::new("prod", &[key()], 100, stats.clone());
        let tracked = TrackedStore::new(LightStore::new(), true);
        {
            // An `added` still outstanding: it goes into the snapshot as unconfirmed.
            let mut t = tracked.lock();
            t.note_change(Some("ns"), "a", None, 1);
            t.note_added(Some("ns"), "a", U1, "5");
            t.store.observe(Some("ns"), "a", U1, "5", 9);
        }
        let records = [("core/Pod/".to_owned(), 7)];
        let mut body = Vec::new();
        frame::put_record(&mut body, 0, "ns", "a", U1, "5");
        store
            .append(100, vec![frame::encode("prod", 100, 1, &records, 1, &body)])
            .await
            .unwrap();
        let keeper = Keeper::new(
            store.clone(),
            "prod",
            vec![Kept {
                key: key(),
                store: tracked.clone(),
            }],
            Some(journal.clone()),
            Fence::open(),
            stats.clone(),
        );
        let r = keeper.save(false).await.unwrap().expect("saved");
        assert_eq!((r.objects, r.unconfirmed), (1, 1));
        let snap_bytes = store.load().await.unwrap().unwrap();
        let snap = crate::state::parse(&snap_bytes).unwrap();
        assert_eq!(snap.generation, 101, "the generation started by this save");
        let restored = snap.sections[0].as_ref().unwrap().store().unwrap();
        assert!(restored.get(Some("ns"), "a").unwrap().unconfirmed);
        assert!(
            store.load_journal().await.unwrap().is_empty(),
            "generation 100 dropped"
        );
        assert_eq!(stats.saves.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(
            keeper.save(false).await.unwrap().map(|r| r.objects),
            None,
            "unchanged"
        );
        tracked.settled(Some("ns"), "a", None);
        keeper.save(false).await.unwrap().expect("changed: saved");
        let snap_bytes = store.load().await.unwrap().unwrap();
        let restored = crate::state::parse(&snap_bytes).unwrap().sections[0]
            .as_ref()
            .unwrap()
            .store()
            .unwrap();
        assert_eq!(
            restored
                .get(Some("ns"), "a")
                .map(Facts::into_owned)
                .map(|f| f.unconfirmed),
            Some(false),
            "confirmed once settled"
        );
    }

    /// A state store whose snapshot writes wait until the test releases them, one at a time
    /// (a slow state store); everything else goes to a file store at once.
    struct HeldStore {
        inner: FileStore,
        /// The saves that entered and wait, oldest first: their release.
        held: Mutex<Vec<tokio::sync::oneshot::Sender<()>>>,
        entered: std::sync::atomic::AtomicUsize,
        /// What [`StateStore::saved_generation`] answers (0: nothing known), as if another
        /// replica had saved that generation.
        saved_generation: std::sync::atomic::AtomicU64,
    }

    impl HeldStore {
        fn entered(&self) -> usize {
            self.entered.load(std::sync::atomic::Ordering::SeqCst)
        }

        /// Lets the newest waiting save go on; false when none waits.
        fn release_newest(&self) -> bool {
            match self.held.lock().unwrap().pop() {
                Some(go) => go.send(()).is_ok(),
                None => false,
            }
        }
    }

    #[async_trait::async_trait]
    impl StateStore for HeldStore {
        fn describe(&self) -> &str {
            "held store"
        }
        async fn load(&self) -> Result<Option<Vec<u8>>, StateError> {
            self.inner.load().await
        }
        async fn save(&self, bytes: Vec<u8>, generation: u64) -> Result<(), StateError> {
            let (go, wait) = tokio::sync::oneshot::channel();
            self.held.lock().unwrap().push(go);
            self.entered
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = wait.await;
            self.inner.save(bytes, generation).await
        }
        async fn saved_generation(&self) -> Result<Option<u64>, StateError> {
            let g = self
                .saved_generation
                .load(std::sync::atomic::Ordering::SeqCst);
            Ok(Some(g).filter(|g| *g > 0))
        }
        async fn append(&self, generation: u64, frames: Vec<Vec<u8>>) -> Result<(), StateError> {
            self.inner.append(generation, frames).await
        }
        async fn load_journal(&self) -> Result<Vec<super::super::JournalSegment>, StateError> {
            self.inner.load_journal().await
        }
        async fn drop_journal_before(&self, generation: u64) -> Result<(), StateError> {
            self.inner.drop_journal_before(generation).await
        }
    }

    /// A keeper of one watch (key `ns/a` known) over a [`HeldStore`] in a temporary
    /// directory, with a journal, saving while `fence` is open.
    struct HeldKeeper {
        _dir: tempfile::TempDir,
        held: Arc<HeldStore>,
        store: Arc<dyn StateStore>,
        tracked: Arc<TrackedStore>,
        keeper: Arc<Keeper>,
    }

    fn held_keeper(fence: Fence) -> HeldKeeper {
        let dir = tempfile::tempdir().unwrap();
        let held = Arc::new(HeldStore {
            inner: FileStore::new(dir.path().join("state")),
            held: Mutex::default(),
            entered: Default::default(),
            saved_generation: Default::default(),
        });
        let store: Arc<dyn StateStore> = held.clone();
        let stats = Arc::new(StateStats::default());
        let journal = Journal::new("prod", &[key()], 100, stats.clone());
        let tracked = TrackedStore::new(LightStore::new(), true);
        tracked.lock().store.observe(Some("ns"), "a", U1, "5", 9);
        let keeper = Keeper::new(
            store.clone(),
            "prod",
            vec![Kept {
                key: key(),
                store: tracked.clone(),
            }],
            Some(journal),
            fence,
            stats,
        );
        HeldKeeper {
            _dir: dir,
            held,
            store,
            tracked,
            keeper,
        }
    }

    /// Polls `cond` every 5 ms; panics with `what` after 20 s.
    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_never_overwrites_a_newer_state_a_successor_saved_nor_drops_its_journal() {
        // A deposed leader frozen (SIGSTOP) past its fence's last check must not land its
        // older state over its successor's. The store's saved
        // generation is the successor's word; the fence stays open here on purpose.
        let HeldKeeper {
            _dir,
            held,
            store,
            keeper,
            ..
        } = held_keeper(Fence::open());
        use std::sync::atomic::Ordering::SeqCst;
        held.saved_generation.store(1_000, SeqCst);
        store.append(100, vec![b"frame".to_vec()]).await.unwrap();
        let k = keeper.clone();
        let saving = tokio::spawn(async move { k.save(true).await });
        until("the save to end, or to write", || {
            saving.is_finished() || held.entered() > 0
        })
        .await;
        assert_eq!(held.entered(), 0, "nothing written");
        let refused = saving.await.unwrap();
        assert!(
            matches!(
                refused,
                Err(StateError::Superseded {
                    saved: 1_000,
                    ours: 101
                })
            ),
            "{refused:?}"
        );
        assert!(held.inner.load().await.unwrap().is_none());
        assert_eq!(store.load_journal().await.unwrap().len(), 1, "journal kept");
        // An older saved generation (this replica's own earlier save) is overwritten.
        held.saved_generation.store(50, SeqCst);
        let k = keeper.clone();
        let saving = tokio::spawn(async move { k.save(true).await });
        until("the save writing", || held.entered() == 1).await;
        assert!(held.release_newest());
        saving.await.unwrap().unwrap();
        assert!(held.inner.load().await.unwrap().is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_save_requested_while_another_stores_lands_after_it_and_keeps_the_journal_it_needs() {
        let HeldKeeper {
            _dir,
            held,
            store,
            tracked,
            keeper,
        } = held_keeper(Fence::open());
        // The interval save: packed at generation 101, its write held.
        let k = keeper.clone();
        let interval = tokio::spawn(async move { k.save(false).await });
        until("the interval save writing", || held.entered() == 1).await;
        // Meanwhile a new key is sent: journaled in generation 101, outstanding in the store.
        const U2: &str = "0b6d3e63-3a49-4f0a-9d52-3c7c2f1e8a11";
        {
            let mut t = tracked.lock();
            t.note_change(Some("ns"), "b", None, 1);
            t.note_added(Some("ns"), "b", U2, "6");
            t.store.observe(Some("ns"), "b", U2, "6", 10);
        }
        let mut body = Vec::new();
        frame::put_record(&mut body, 0, "ns", "b", U2, "6");
        let records = [("core/Pod/".to_owned(), 7)];
        store
            .append(101, vec![frame::encode("prod", 101, 2, &records, 1, &body)])
            .await
            .unwrap();
        // Shutdown's final save, while the interval save still writes.
        let k = keeper.clone();
        let last = tokio::spawn(async move { k.final_save().await });
        until(
            "the final save writing too, or waiting for its turn",
            || held.entered() == 2 || keeper.waiting() == 1,
        )
        .await;
        // The store answers the newest write first, then the older.
        while !(interval.is_finished() && last.is_finished()) {
            if !held.release_newest() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        interval.await.unwrap().unwrap();
        last.await.unwrap().unwrap();

        let snap_bytes = store.load().await.unwrap().unwrap();
        let snap = crate::state::parse(&snap_bytes).unwrap();
        assert_eq!(
            snap.generation, 102,
            "the final save's snapshot is the one stored, not the interval save's"
        );
        let saved = crate::state::read(&*store).await;
        let restored = crate::state::restore(saved, store.describe(), "prod", &[key()]);
        let restored = restored.stores[0].as_ref().expect("state restored");
        assert!(restored.get(Some("ns"), "a").is_some());
        assert!(
            restored.get(Some("ns"), "b").is_some(),
            "the key sent between the two saves is known after a restart (in the snapshot or \
             its journal)"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_save_still_writing_when_the_fence_closes_is_abandoned_and_drops_no_journal() {
        // A leader deposed while its save writes must not land that
        // state, nor drop journal generations, after its successor took over.
        let fence =
            Fence::open_until_for_tests(std::time::Instant::now() + Duration::from_secs(3600));
        let HeldKeeper {
            _dir,
            held,
            store,
            keeper,
            ..
        } = held_keeper(fence.clone());
        let mut body = Vec::new();
        frame::put_record(&mut body, 0, "ns", "a", U1, "5");
        let records = [("core/Pod/".to_owned(), 7)];
        store
            .append(100, vec![frame::encode("prod", 100, 1, &records, 1, &body)])
            .await
            .unwrap();
        let k = keeper.clone();
        let save = tokio::spawn(async move { k.save(true).await });
        until("the save writing", || held.entered() == 1).await;
        fence.close_for_tests();
        let result = tokio::time::timeout(Duration::from_secs(20), save)
            .await
            .expect("the fenced save returns without waiting for the store")
            .unwrap();
        assert!(matches!(result, Err(StateError::Fenced)), "{result:?}");
        held.release_newest();
        assert!(store.load().await.unwrap().is_none(), "nothing was stored");
        assert_eq!(
            store.load_journal().await.unwrap().len(),
            1,
            "the journal generation the successor needs is still there"
        );
    }

    /// A file store whose first `fail` saves fail (a state topic found lost at the final
    /// save: the first write finds it gone, the next creates it again).
    struct FlakyStore {
        inner: FileStore,
        fail: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl StateStore for FlakyStore {
        fn describe(&self) -> &str {
            "flaky store"
        }
        async fn load(&self) -> Result<Option<Vec<u8>>, StateError> {
            self.inner.load().await
        }
        async fn save(&self, bytes: Vec<u8>, generation: u64) -> Result<(), StateError> {
            use std::sync::atomic::Ordering::SeqCst;
            if self
                .fail
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(StateError::Backend("the topic no longer exists".into()));
            }
            self.inner.save(bytes, generation).await
        }
        async fn append(&self, generation: u64, frames: Vec<Vec<u8>>) -> Result<(), StateError> {
            self.inner.append(generation, frames).await
        }
        async fn load_journal(&self) -> Result<Vec<super::super::JournalSegment>, StateError> {
            self.inner.load_journal().await
        }
        async fn drop_journal_before(&self, generation: u64) -> Result<(), StateError> {
            self.inner.drop_journal_before(generation).await
        }
    }

    /// The final save is retried: a store that fails it once (a state topic lost while the
    /// writer was quiet, found by that very save) would otherwise lose every change since
    /// the last save, and the next start would list everything. Retried within the
    /// shutdown deadline (the caller's), it lands.
    #[tokio::test]
    async fn the_final_save_is_retried_until_it_lands() {
        let dir = tempfile::tempdir().unwrap();
        let flaky = Arc::new(FlakyStore {
            inner: FileStore::new(dir.path().join("state")),
            fail: 2.into(),
        });
        let store: Arc<dyn StateStore> = flaky.clone();
        let stats = Arc::new(StateStats::default());
        let tracked = TrackedStore::new(LightStore::new(), true);
        tracked.lock().store.observe(Some("ns"), "a", U1, "5", 9);
        let kept = vec![Kept {
            key: key(),
            store: tracked,
        }];
        let keeper = Keeper::new(store.clone(), "prod", kept, None, Fence::open(), stats);
        let saved = tokio::time::timeout(Duration::from_secs(20), keeper.final_save())
            .await
            .expect("within the deadline");
        assert!(saved.as_ref().is_ok_and(Option::is_some), "{saved:?}");
        assert_eq!(flaky.fail.load(std::sync::atomic::Ordering::SeqCst), 0);
        let bytes = store.load().await.unwrap().expect("the final save landed");
        let restored = crate::state::parse(&bytes).unwrap().sections[0]
            .as_ref()
            .unwrap()
            .store()
            .unwrap();
        assert!(restored.get(Some("ns"), "a").is_some());
    }

    #[tokio::test]
    async fn a_replica_that_may_no_longer_lead_does_not_save() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> = Arc::new(FileStore::new(dir.path().join("state")));
        let stats = Arc::new(StateStats::default());
        let closed = crate::leader::Fence::closed_for_tests();
        let keeper = Keeper::new(store.clone(), "prod", Vec::new(), None, closed, stats);
        assert!(matches!(keeper.save(true).await, Err(StateError::Fenced)));
        assert!(store.load().await.unwrap().is_none(), "nothing written");
    }
}
