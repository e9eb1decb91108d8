//! Start-up: the saved snapshot and the journal after it, turned into each watch's restored
//! store, or into a reason (logged) why a watch starts without state.
//!
//! # Rules
//!
//! - The snapshot is read first. Missing: no base (the journal alone may still restore a
//!   watch). Unreadable, not a state file, another format version or another cluster: no
//!   state at all (every watch lists and emits everything, `initial`).
//! - Per watch, its section must be intact and of the same selection; otherwise that watch
//!   starts without state (its journal records are ignored with it).
//! - The journal's segments of the snapshot's generation and later are replayed onto the
//!   bases: each record is a key sent as `added` after the snapshot was taken. A key the base
//!   lacks, or has with another uid, becomes **unconfirmed** (downstream may have it: the
//!   first list re-sends it, or sends its `deleted`); the base's other uid becomes a
//!   *former* uid of the key (`informer/store.rs`), whose `deleted` the first list start
//!   sends (downstream may still hold it). A key the base has with the same uid
//!   stays as it is (the snapshot saw that `added` confirmed). A watch without a section but
//!   with records (its run crashed before its first save) is restored from its records alone.
//! - A frame cut short at the end of a file is dropped (it was never durable, so nothing it
//!   records was sent). Any other damage, or a journal of another cluster, means some key
//!   downstream may have is unknown: every watch then starts without state, as with a bad
//!   snapshot.
//! - A store that cannot be *read* (unreachable, refusing) is not a store without state: what
//!   it holds is unknown, not absent. [`read`] returns its error and the caller waits and
//!   reads again (`state.write_ahead = true`, the default: sends would wait for the journal
//!   anyway), or restores nothing (`state.write_ahead = false`: availability before
//!   completeness, as that setting chooses).
//!
//! Never decides what to emit: the watches' `Decider`s do, from the stores returned here.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kubesink_core::clock::now_ms;
use kubesink_core::state::{JournalSegment, StateError, StateStore};

use super::journal::frame::{self, Frame};
use super::snapshot::{self, Snapshot};
use super::watch_key::WatchKey;
use crate::informer::{Facts, LightStore};

/// What [`restore`] found.
pub struct Restored {
    /// For each watch, in order: its restored state, or `None` (it lists and emits everything
    /// as without state; the reason was logged).
    pub stores: Vec<Option<RestoredWatch>>,
    /// The first journal generation of this run: above every generation found, and at least
    /// the wall-clock milliseconds, so this run never appends to an earlier run's segment.
    pub next_generation: u64,
    /// One line for `/readyz`: what was restored, and what was ignored and why.
    pub summary: String,
    /// Watches whose saved state could not be used (each lists and emits everything).
    pub ignored: u64,
}

/// One watch's restored state.
pub struct RestoredWatch {
    /// The keys a destination has or may have (unconfirmed ones included).
    pub store: LightStore,
    /// The resourceVersion of the last list the saved state completed; empty when it never
    /// completed one (restored from the journal alone: the last run crashed before its first
    /// save, or saved during its first list). The events mode's `since` applies again then.
    pub list_resource_version: String,
}

impl std::ops::Deref for RestoredWatch {
    type Target = LightStore;

    fn deref(&self) -> &LightStore {
        &self.store
    }
}

impl Restored {
    /// Objects restored, all watches, and of those the unconfirmed.
    pub fn objects(&self) -> (u64, u64) {
        let mut counts = (0, 0);
        for s in self.stores.iter().flatten() {
            counts.0 += s.len() as u64;
            s.for_each(|_, _, f| counts.1 += u64::from(f.unconfirmed));
        }
        counts
    }
}

/// The summary of a restore: `restored` of `total` watches, and the `ignored` ones with
/// their reason.
fn summarize(restored: usize, total: usize, ignored: &[String]) -> String {
    match ignored {
        [] => format!("{restored} of {total} watches restored"),
        _ => format!(
            "{restored} of {total} watches restored; ignored (full initial list): {}",
            ignored.join("; ")
        ),
    }
}

/// Said wherever a watch falls back to a full initial list: it cannot send the deletes of
/// what vanished while kubesink was down.
const SWEEP_HINT: &str = " (deletes made while kubesink was down cannot be inferred then: consumers that keep their view drop them on the list's sync marker, pipeline.sync_markers, see docs/restarts.md)";

/// The snapshot, as far as it is usable.
enum Base<'a> {
    /// There is none: only the journal can restore a watch.
    Missing,
    /// It cannot be used at all (the reason, logged).
    Unusable(String),
    /// Parsed: sections are checked per watch.
    Snap(Snapshot<'a>),
}

/// What a state store holds, read whole by [`read`]: the snapshot's bytes (`None`: none
/// saved yet) and every journal segment, oldest first.
pub struct Saved {
    snapshot: Option<Vec<u8>>,
    journal: Vec<JournalSegment>,
    /// Why the store's state is known to be damaged or partly lost
    /// ([`StateError::Damaged`]): then nothing of it is used.
    damaged: Option<String>,
}

impl Saved {
    /// What a store returned, without a store: the model test drives [`restore`] with the
    /// snapshot and journal its runs wrote (`pipeline/model_tests.rs`).
    #[cfg(test)]
    pub(crate) fn from_parts(snapshot: Option<Vec<u8>>, journal: Vec<JournalSegment>) -> Self {
        Saved {
            snapshot,
            journal,
            damaged: None,
        }
    }
}

/// Reads the saved snapshot and journal from `store`.
///
/// # Errors
/// The store's [`StateError`] when either cannot be read (the store is unreachable or
/// refuses): what downstream may hold is then unknown, not absent, so the caller waits and
/// reads again rather than start without state (`bridge/watching.rs`: a leader taking over
/// while the NATS state server restarts would start empty and never send the deletes made
/// during the hand-over).
///
/// A store that was read but holds a state known to be damaged or partly lost
/// ([`StateError::Damaged`]) is not an error here: [`restore`] ignores that state (a full
/// initial list), as it ignores a damaged state file.
pub async fn read(store: &dyn StateStore) -> Result<Saved, StateError> {
    let snapshot = match store.load().await {
        Err(StateError::Damaged(reason)) => {
            return Ok(Saved {
                snapshot: None,
                journal: Vec::new(),
                damaged: Some(reason),
            })
        }
        loaded => loaded?,
    };
    let journal = store.load_journal().await?;
    Ok(Saved {
        snapshot,
        journal,
        damaged: None,
    })
}

/// Each watch's restored store from what [`read`] returned (see the module rules), for
/// cluster `cluster`; `store` names the store in log lines. An `Err` (the store could not be
/// read, and the caller chose not to wait: `state.write_ahead = false`) restores nothing.
/// Never fails: every problem is logged and costs the affected watches a full emit.
pub fn restore(
    saved: Result<Saved, StateError>,
    store: &str,
    cluster: &str,
    watches: &[WatchKey],
) -> Restored {
    let started = Instant::now();
    // No watch restored: because none was saved (`None`), or every watch's state ignored.
    let none = |next_generation: u64, ignored_because: Option<&str>| Restored {
        stores: watches.iter().map(|_| None).collect(),
        next_generation,
        summary: format!(
            "no state used: {}",
            ignored_because.unwrap_or("none saved yet")
        ),
        ignored: ignored_because.map_or(0, |_| watches.len() as u64),
    };
    let saved = match saved {
        Ok(saved) => saved,
        Err(e) => {
            tracing::warn!(store, error = %e, "saved informer state ignored: it cannot be read; every watch lists and emits everything (initial){SWEEP_HINT}");
            return none(now_ms(), Some(&format!("it cannot be read: {e}")));
        }
    };
    if let Some(reason) = &saved.damaged {
        // What survived (a journal without its snapshot, a snapshot without a chunk) is
        // not replayed: its keys would be re-sent as non-initial `added`, and the deletes the
        // lost part could have inferred never sent, with a sync marker that sweeps nothing.
        tracing::warn!(store, "saved informer state ignored: it is damaged or partly lost ({reason}); every watch lists and emits everything (initial){SWEEP_HINT}; the next save overwrites it");
        return none(
            now_ms(),
            Some(&format!("it is damaged or partly lost: {reason}")),
        );
    }
    let base = match saved.snapshot.as_deref() {
        None => Base::Missing,
        Some(bytes) => match snapshot::parse(bytes) {
            Err(e) => {
                tracing::warn!(store, "saved informer state ignored: {e}; every watch lists and emits everything (initial){SWEEP_HINT}; the next save overwrites it");
                Base::Unusable(e.to_string())
            }
            Ok(snap) if snap.cluster != cluster => {
                let reason = format!(
                    "it is of cluster {:?}, this kubesink is cluster.name = {cluster:?}",
                    snap.cluster
                );
                tracing::warn!(store, "saved informer state ignored: {reason}; every watch lists and emits everything (initial){SWEEP_HINT}; the next save overwrites it");
                Base::Unusable(reason)
            }
            Ok(snap) => Base::Snap(snap),
        },
    };
    let from_generation = match &base {
        Base::Unusable(why) => return none(now_ms(), Some(why)),
        Base::Missing => 0,
        Base::Snap(s) => s.generation,
    };
    let journal = match parse_journal(&saved.journal, store, cluster, from_generation) {
        Ok(j) => j,
        Err(reason) => {
            tracing::warn!(store, "saved informer state ignored: {reason}; it may lack keys downstream has, so every watch lists and emits everything (initial){SWEEP_HINT}; the next save overwrites it");
            return none(now_ms(), Some(&reason));
        }
    };
    let next_generation = journal
        .max_generation
        .max(from_generation)
        .saturating_add(1)
        .max(now_ms());
    let snap = match &base {
        Base::Snap(s) => Some(s),
        _ => None,
    };
    if snap.is_none() && journal.frames.is_empty() {
        tracing::info!(
            store,
            "no saved informer state yet: every watch lists and emits everything (initial)"
        );
        return none(next_generation, None);
    }
    // A journal without a snapshot is a state only when it is whole: a run numbers its
    // records from 1, and drops a generation only after a snapshot covering it was stored.
    // When the oldest frame kept does not start at record 1, a snapshot was stored and is
    // gone (deleted, or its store lost it): replaying the rest alone would send live
    // objects as non-initial `added` and never the deletes the lost snapshot could infer
    // so the state is damaged, for every backend alike.
    if snap.is_none() {
        if let Some(oldest) = journal
            .frames
            .iter()
            .min_by_key(|f| (f.generation, f.first))
        {
            if oldest.first > 1 {
                let reason = format!(
                    "it has a journal but no snapshot, and the journal's oldest frame (generation {}) starts at record {}: a snapshot covered the records before it and is gone",
                    oldest.generation, oldest.first
                );
                tracing::warn!(store, "saved informer state ignored: it is damaged or partly lost ({reason}); every watch lists and emits everything (initial){SWEEP_HINT}; the next save overwrites it");
                return none(
                    now_ms(),
                    Some(&format!("it is damaged or partly lost: {reason}")),
                );
            }
        }
    }
    if let Some(snap) = snap {
        let damaged = snap.sections.iter().filter(|s| s.is_err()).count();
        if damaged > 0 || snap.sections.len() != snap.announced as usize {
            tracing::warn!(store, damaged, found = snap.sections.len(), announced = snap.announced, "saved informer state is partly damaged; the watches of the damaged parts list and emit everything");
        }
    }
    let age = snap
        .and_then(|s| UNIX_EPOCH.checked_add(Duration::from_millis(s.written_at_ms)))
        .and_then(|written| SystemTime::now().duration_since(written).ok())
        .unwrap_or_default();
    let records = journal.by_watch();
    let mut ignored = Vec::new();
    let stores: Vec<Option<RestoredWatch>> = watches
        .iter()
        .map(|w| {
            // A view with no saved state of its own starts from its seed's (`WatchKey::seed`).
            let own = records.contains_key(w.identity.as_str())
                || snap.is_some_and(|s| s.section(&w.identity).is_some());
            let seeded;
            let w = match &w.seed {
                Some(seed) if !own => {
                    tracing::info!(watch = %w.identity, from = %seed, "no saved state of this view yet: it starts from the shared view's (the sink had every object until its filter)");
                    seeded = WatchKey {
                        identity: seed.clone(),
                        selection: w.selection,
                        seed: None,
                    };
                    &seeded
                }
                _ => w,
            };
            restore_watch(snap, w, age, records.get(w.identity.as_str())).unwrap_or_else(|reason| {
                ignored.push(format!("{}: {reason}", w.identity));
                None
            })
        })
        .collect();
    tracing::debug!(elapsed = ?started.elapsed(), snapshot_bytes = saved.snapshot.as_ref().map_or(0, Vec::len), journal_frames = journal.frames.len(), "informer state loaded");
    Restored {
        summary: summarize(stores.iter().flatten().count(), stores.len(), &ignored),
        ignored: ignored.len() as u64,
        stores,
        next_generation,
    }
}

/// The journal frames to replay.
struct Replay {
    /// Frames of generation `from` and later, in order.
    frames: Vec<Frame>,
    /// The highest generation of any frame (0: none).
    max_generation: u64,
}

impl Replay {
    /// Records by watch identity: `(selection, namespace, name, facts)`.
    fn by_watch(&self) -> HashMap<&str, Vec<(u64, &str, &str, Facts<'static>)>> {
        let mut out: HashMap<&str, Vec<_>> = HashMap::new();
        for f in &self.frames {
            for r in &f.records {
                let Some((identity, selection)) = f.watches.get(r.watch as usize) else {
                    continue;
                };
                out.entry(identity.as_str()).or_default().push((
                    *selection,
                    r.namespace.as_str(),
                    r.name.as_str(),
                    Facts::unconfirmed(r.uid.clone(), r.rv.clone()),
                ));
            }
        }
        out
    }
}

/// Checks every journal segment, keeping the frames of generation `from` on.
fn parse_journal(
    segments: &[JournalSegment],
    store: &str,
    cluster: &str,
    from: u64,
) -> Result<Replay, String> {
    let mut replay = Replay {
        frames: Vec::new(),
        max_generation: 0,
    };
    for seg in segments {
        let parsed = frame::parse_segment(&seg.name, &seg.bytes, seg.may_tear)
            .map_err(|e| format!("its journal of new objects is damaged: {e}"))?;
        if let Some(torn) = parsed.torn {
            tracing::info!(store, %torn, "state journal: dropped a frame a crash cut short (never durable, so nothing it records was sent)");
        }
        for f in parsed.frames {
            if f.cluster != cluster {
                return Err(format!(
                    "its journal ({}) is of cluster {:?}, this kubesink is cluster.name = {cluster:?}",
                    seg.name, f.cluster
                ));
            }
            replay.max_generation = replay.max_generation.max(f.generation);
            if f.generation >= from {
                replay.frames.push(f);
            }
        }
    }
    Ok(replay)
}

/// One watch's store from its snapshot section (if any) and journal records; `Ok(None)`
/// when nothing was saved or journaled for it, `Err` with the reason (logged) when its state
/// cannot be used.
fn restore_watch(
    snap: Option<&Snapshot<'_>>,
    w: &WatchKey,
    age: Duration,
    records: Option<&Vec<(u64, &str, &str, Facts<'static>)>>,
) -> Result<Option<RestoredWatch>, String> {
    let watch = w.identity.as_str();
    let ignored = |reason: String| {
        tracing::warn!(%watch, "saved state ignored for this watch: {reason}; it lists and emits everything (initial){SWEEP_HINT}");
        Err(reason)
    };
    // A state cut short loses its last sections: say so rather than "no state for it".
    let truncated = snap.is_some_and(|s| {
        s.sections.len() < s.announced as usize
            || s.sections.iter().any(|p| {
                matches!(p, Err(d) if matches!(d.error, super::SnapshotError::Truncated { .. }))
            })
    });
    let found = snap.and_then(|snap| snap.section(&w.identity));
    let (mut store, list_rv) = match found {
        Some(Err(d)) => return ignored(d.error.to_string()),
        Some(Ok(s)) if s.selection != w.selection => {
            return ignored("the resource's selection changed since the save (apiVersion, namespaces, selectors, payload, fields, drop, updates, allow_secret_data, change_paths, ignore_changes or cluster.label): what it emits differs".into());
        }
        Some(Ok(s)) => match s.store() {
            Ok(store) => (store, s.list_resource_version.clone()),
            Err(e) => return ignored(e.to_string()),
        },
        None if records.is_some_and(|r| !r.is_empty()) => (LightStore::new(), String::new()),
        None if truncated => return ignored("its part is missing from a truncated state".into()),
        // Nothing saved and nothing journaled for it: a plain initial list.
        None if snap.is_none() => return Ok(None),
        None => return ignored("no saved state for it (a watch added since the save)".into()),
    };
    let (mut replayed, mut other_selection) = (0u64, 0u64);
    for (selection, ns, name, facts) in records.into_iter().flatten() {
        if *selection != w.selection {
            other_selection += 1;
            continue;
        }
        let ns = Some(*ns).filter(|n| !n.is_empty());
        if store
            .get(ns, name)
            .is_some_and(|known| known.uid == facts.uid)
        {
            continue; // the snapshot saw this `added` confirmed
        }
        let id = store.intern(ns);
        store.restore(id, name, facts);
        replayed += 1;
    }
    let mut unconfirmed = 0u64;
    store.for_each(|_, _, f| unconfirmed += u64::from(f.unconfirmed));
    if other_selection > 0 {
        tracing::warn!(%watch, records = other_selection, "state journal: records of another selection of this watch ignored");
    }
    let saved_ago = Duration::from_secs(age.as_secs());
    match found {
        Some(_) => {
            tracing::info!(%watch, objects = store.len(), unconfirmed, journal_records = replayed, list_resource_version = %list_rv, ?saved_ago, "saved state restored: the first list emits only the differences")
        }
        None => {
            tracing::info!(%watch, objects = store.len(), unconfirmed, "saved state restored from the journal alone (the last run stopped before its first save): the first list re-sends these objects and deletes those gone")
        }
    }
    Ok(Some(RestoredWatch {
        store,
        list_resource_version: list_rv,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::informer::TrackedStore;
    use crate::state::file::FileStore;
    use crate::state::snapshot::Writer;

    const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";
    const U2: &str = "1d0f26d0-5b32-4c1a-ba4f-4c897e871cf9";

    fn pods() -> WatchKey {
        WatchKey {
            identity: "core/Pod/".into(),
            selection: 7,
            seed: None,
        }
    }

    fn nodes() -> WatchKey {
        WatchKey {
            identity: "core/Node/".into(),
            selection: 8,
            seed: None,
        }
    }

    /// A snapshot of generation `generation` with pods `names` (uid U1, confirmed) and no
    /// nodes.
    fn snapshot(generation: u64, names: &[&str]) -> Vec<u8> {
        let mut s = LightStore::new();
        for (i, n) in names.iter().enumerate() {
            s.observe(Some("ns"), n, U1, &(10 + i).to_string(), 1);
        }
        let tracked = TrackedStore::new(s, true);
        let mut w = Writer::new("prod", 1, generation);
        tracked.acknowledged(|a| w.section(&pods().identity, pods().selection, a));
        TrackedStore::new(LightStore::new(), true)
            .acknowledged(|a| w.section(&nodes().identity, nodes().selection, a));
        w.finish()
    }

    /// A journal frame of generation `generation` recording pods `(name, uid)`, with the pod
    /// watch's selection `selection`, written by cluster `cluster`.
    fn journal(cluster: &str, generation: u64, selection: u64, pods: &[(&str, &str)]) -> Vec<u8> {
        let mut records = Vec::new();
        for (name, uid) in pods {
            frame::put_record(&mut records, 0, "ns", name, uid, "99");
        }
        let watches = [("core/Pod/".to_owned(), selection)];
        frame::encode(
            cluster,
            generation,
            1,
            &watches,
            pods.len() as u64,
            &records,
        )
    }

    async fn restored(store: &FileStore) -> Restored {
        restore(
            read(store).await,
            store.describe(),
            "prod",
            &[pods(), nodes()],
        )
    }

    /// (name, uid, unconfirmed) of the restored pods, sorted.
    fn pod_facts(r: &Restored) -> Vec<(String, String, bool)> {
        let Some(s) = &r.stores[0] else {
            return Vec::new();
        };
        let mut v = Vec::new();
        s.for_each(|_, name, f| v.push((name.to_owned(), f.uid.render(), f.unconfirmed)));
        v.sort();
        v
    }

    fn fact(name: &str, uid: &str, unconfirmed: bool) -> (String, String, bool) {
        (name.into(), uid.into(), unconfirmed)
    }

    fn dir_store() -> (tempfile::TempDir, FileStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path().join("state"));
        (dir, store)
    }

    #[tokio::test]
    async fn journal_records_after_the_snapshot_become_unconfirmed_keys() {
        let (_dir, store) = dir_store();
        store
            .save(snapshot(5, &["known", "recreated"]), 0)
            .await
            .unwrap();
        // Generation 4 is older than the snapshot: covered by it, ignored.
        store
            .append(4, vec![journal("prod", 4, 7, &[("stale", U1)])])
            .await
            .unwrap();
        let after = [("new", U2), ("known", U1), ("recreated", U2)];
        store
            .append(5, vec![journal("prod", 5, 7, &after)])
            .await
            .unwrap();
        store
            .append(6, vec![journal("prod", 6, 9, &[("other-selection", U1)])])
            .await
            .unwrap();
        let r = restored(&store).await;
        assert_eq!(
            pod_facts(&r),
            [
                fact("known", U1, false),
                fact("new", U2, true),
                fact("recreated", U2, true),
            ]
        );
        let mut former = Vec::new();
        if let Some(s) = &r.stores[0] {
            s.for_each_former(|_, name, f| former.push((name.to_owned(), f.uid.render(), f.sent)));
        }
        assert_eq!(
            former,
            [("recreated".to_owned(), U1.to_owned(), false)],
            "the snapshot's uid of a re-created key is former: its `deleted` is owed"
        );
        assert!(
            r.stores[1].as_ref().is_some_and(|s| s.is_empty()),
            "nodes restored, empty"
        );
        assert!(r.next_generation > 6 && r.next_generation >= now_ms() - 60_000);
    }

    #[tokio::test]
    async fn without_a_snapshot_the_journal_alone_restores_the_watches_it_names() {
        let (_dir, store) = dir_store();
        let r = restored(&store).await;
        assert!(r.stores.iter().all(Option::is_none), "nothing saved at all");
        store
            .append(3, vec![journal("prod", 3, 7, &[("a", U1), ("b", U1)])])
            .await
            .unwrap();
        let r = restored(&store).await;
        assert_eq!(pod_facts(&r), [fact("a", U1, true), fact("b", U1, true)]);
        assert!(
            r.stores[1].is_none(),
            "nothing was sent for nodes: an initial list"
        );
    }

    /// For every backend: a journal whose oldest frame does not start at
    /// record 1 lost the snapshot that covered the records before it (the state file or
    /// object deleted, a state topic lost): the state is damaged, every watch lists and
    /// emits everything, never the rest of the journal alone.
    #[tokio::test]
    async fn a_journal_whose_start_was_dropped_without_its_snapshot_is_damaged_state() {
        let (_dir, store) = dir_store();
        let mut records = Vec::new();
        frame::put_record(&mut records, 0, "ns", "a", U1, "99");
        let watches = [("core/Pod/".to_owned(), 7)];
        let later = frame::encode("prod", 4, 37, &watches, 1, &records);
        store.append(4, vec![later]).await.unwrap();
        let r = restored(&store).await;
        assert!(r.stores.iter().all(Option::is_none), "{}", r.summary);
        assert!(
            r.summary.contains("damaged or partly lost"),
            "{}",
            r.summary
        );
        assert!(r.summary.contains("starts at record 37"), "{}", r.summary);
    }

    #[tokio::test]
    async fn a_torn_last_frame_is_dropped_and_any_other_damage_drops_all_state() {
        let (dir, store) = dir_store();
        store.save(snapshot(5, &["known"]), 0).await.unwrap();
        store
            .append(5, vec![journal("prod", 5, 7, &[("a", U1)])])
            .await
            .unwrap();
        let torn = journal("prod", 5, 7, &[("b", U1)]);
        store
            .append(5, vec![torn[..torn.len() / 2].to_vec()])
            .await
            .unwrap();
        let r = restored(&store).await;
        assert_eq!(
            pod_facts(&r),
            [fact("a", U1, true), fact("known", U1, false)]
        );

        // A flipped byte in the first frame, with the second after it: corrupt.
        let seg = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains(".journal-"))
            .unwrap();
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes[30] ^= 1;
        std::fs::write(&seg, &bytes).unwrap();
        let r = restored(&store).await;
        assert!(
            r.stores.iter().all(Option::is_none),
            "every watch lists and emits everything"
        );
    }

    #[tokio::test]
    async fn a_journal_of_another_cluster_or_a_bad_snapshot_drops_all_state() {
        let (_dir, store) = dir_store();
        store.save(snapshot(5, &["known"]), 0).await.unwrap();
        store
            .append(5, vec![journal("elsewhere", 5, 7, &[("a", U1)])])
            .await
            .unwrap();
        assert!(restored(&store).await.stores.iter().all(Option::is_none));
        let (_dir, store) = dir_store();
        store.save(b"not a snapshot".to_vec(), 0).await.unwrap();
        store
            .append(5, vec![journal("prod", 5, 7, &[("a", U1)])])
            .await
            .unwrap();
        let r = restored(&store).await;
        assert!(
            r.stores.iter().all(Option::is_none),
            "the journal alone is not trusted"
        );
        assert_eq!(r.ignored, 2);
        assert!(
            r.summary
                .contains("not a kubesink state file (it starts with \"not a sn\""),
            "{}",
            r.summary
        );
    }

    #[tokio::test]
    async fn the_summary_names_each_ignored_watch_and_why() {
        let (_dir, store) = dir_store();
        let mut bytes = snapshot(5, &["known"]);
        let last = bytes.len() - 3; // inside the (last) node section
        bytes[last] ^= 1;
        store.save(bytes, 0).await.unwrap();
        let r = restored(&store).await;
        assert_eq!(
            (r.stores[0].is_some(), r.stores[1].is_none(), r.ignored),
            (true, true, 1)
        );
        assert_eq!(
            r.summary,
            "1 of 2 watches restored; ignored (full initial list): core/Node/: corrupt section 2: checksum mismatch"
        );
        // Cut in the middle of the pods' section: that watch is truncated, the next missing.
        let good = snapshot(5, &["a", "b", "c"]);
        store
            .save(good[..good.len() - 40].to_vec(), 0)
            .await
            .unwrap();
        let r = restored(&store).await;
        assert!(
            r.summary.contains("missing from a truncated state"),
            "{}",
            r.summary
        );
    }
}
