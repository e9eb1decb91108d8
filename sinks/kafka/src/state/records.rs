//! The state topic's records and the epoch fence, as pure functions: record keys, the
//! snapshot manifest, and [`scan`], which folds one partition's records (in offset order)
//! into what a restore may use.
//!
//! # Keys (all under the state's prefix `{p}`, so several states share a topic)
//!
//! | key                                   | value                                        |
//! |---------------------------------------|----------------------------------------------|
//! | `{p}/fence/{writer}`                  | who took over (JSON), written first          |
//! | `{p}/snapshot/{epoch}/{generation}/{i}` | chunk `i` of a snapshot                    |
//! | `{p}/manifest/{epoch}/{generation}`   | a complete snapshot: its chunks (JSON)       |
//! | `{p}/journal/{epoch}/{generation}/{n}` | one journal frame                           |
//! | `{p}/lost/{epoch}`                    | the state is partly lost (UTF-8 reason)      |
//!
//! A **lost marker** is written by a writer that found the topic deleted or emptied under
//! it (its earlier records gone) before anything else it writes, and by a restore that
//! found the saved state damaged. Until a valid manifest follows it, the state is damaged:
//! a journal written after the loss is not a state a restore may replay (it lacks the keys
//! of the lost snapshot, whose deletes could then never be sent), so the restore ignores the
//! state, as for a damaged state file: a full initial list.
//!
//! Compaction keeps the last record of each key, so every key is written once: a new save
//! never overwrites the chunks or the manifest a restore may still need (the generation is in
//! the key), and nothing a writer writes shares a key with another writer's (the epoch is in
//! the key). Superseded keys are tombstoned (null value) by the writer once they are covered,
//! and compaction removes them.
//!
//! # The epoch fence
//!
//! A writer (a process, at each restore) first writes its fence record, alone, and waits for
//! its offset: that offset is its **epoch**, assigned by the broker in log order, so two
//! writers never share one and a later writer always has a higher one (a counter kept in the
//! Lease would reset when the Lease is recreated). Every other record carries the writer's
//! id and epoch in its headers and key. Scanning the partition in offset order, a record is
//! **valid** only when the last fence before it is its writer's own: the records a deposed
//! writer (a zombie that the Lease's fence did not stop in time) writes after its successor's
//! fence are ignored, whatever they say. The successor's restore reads everything up to its
//! own fence, so it sees every record the previous writer wrote validly.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The header that carries a record's writer id.
pub const WRITER_HEADER: &str = "kubesink-writer";
/// The header that carries a record's writer epoch (its fence record's offset).
pub const EPOCH_HEADER: &str = "kubesink-epoch";

/// A fence record's value.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Fence {
    /// The writer's id (random, one per restore).
    pub writer: String,
    /// Who wrote it: the leader-election identity (the Pod's name) and process id.
    pub identity: String,
}

/// A manifest record's value: the snapshot stored as `chunks` records of generation
/// `generation`, `bytes` long in all, with this XXH3-64 checksum.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// The snapshot's journal generation.
    pub generation: u64,
    /// How many chunk records.
    pub chunks: u32,
    /// Their total length.
    pub bytes: u64,
    /// XXH3-64 of the whole snapshot.
    pub xxh3: u64,
}

/// What a key names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `fence/{writer}`.
    Fence(String),
    /// `snapshot/{epoch}/{generation}/{i}`.
    Chunk { epoch: i64, generation: u64, i: u32 },
    /// `manifest/{epoch}/{generation}`.
    Manifest { epoch: i64, generation: u64 },
    /// `journal/{epoch}/{generation}/{n}`.
    Journal { epoch: i64, generation: u64, n: u64 },
    /// `lost/{epoch}`: the state was partly lost before this writer's next manifest.
    Lost { epoch: i64 },
}

impl Kind {
    /// The key of this record under `prefix`.
    pub fn key(&self, prefix: &str) -> String {
        match self {
            Kind::Fence(w) => format!("{prefix}/fence/{w}"),
            Kind::Chunk {
                epoch,
                generation,
                i,
            } => format!("{prefix}/snapshot/{epoch}/{generation}/{i}"),
            Kind::Manifest { epoch, generation } => {
                format!("{prefix}/manifest/{epoch}/{generation}")
            }
            Kind::Journal {
                epoch,
                generation,
                n,
            } => format!("{prefix}/journal/{epoch}/{generation}/{n}"),
            Kind::Lost { epoch } => format!("{prefix}/lost/{epoch}"),
        }
    }

    /// What `key` names under `prefix`; `None` for another prefix's key or a key this
    /// version does not write.
    pub fn parse(prefix: &str, key: &str) -> Option<Kind> {
        let rest = key.strip_prefix(prefix)?.strip_prefix('/')?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["fence", w] if !w.is_empty() => Some(Kind::Fence((*w).to_owned())),
            ["snapshot", e, g, i] => Some(Kind::Chunk {
                epoch: e.parse().ok()?,
                generation: g.parse().ok()?,
                i: i.parse().ok()?,
            }),
            ["manifest", e, g] => Some(Kind::Manifest {
                epoch: e.parse().ok()?,
                generation: g.parse().ok()?,
            }),
            ["journal", e, g, n] => Some(Kind::Journal {
                epoch: e.parse().ok()?,
                generation: g.parse().ok()?,
                n: n.parse().ok()?,
            }),
            ["lost", e] => Some(Kind::Lost {
                epoch: e.parse().ok()?,
            }),
            _ => None,
        }
    }

    /// The epoch in the key (`None` for a fence).
    pub fn epoch(&self) -> Option<i64> {
        match self {
            Kind::Fence(_) => None,
            Kind::Chunk { epoch, .. }
            | Kind::Manifest { epoch, .. }
            | Kind::Journal { epoch, .. }
            | Kind::Lost { epoch } => Some(*epoch),
        }
    }
}

/// One record of the state's partition, as read.
#[derive(Clone, Debug)]
pub struct Record {
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: String,
    /// Its value; `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// The `kubesink-writer` header.
    pub writer: Option<String>,
    /// The `kubesink-epoch` header.
    pub epoch: Option<i64>,
}

/// What a restore may use, folded from the partition by [`scan`].
#[derive(Debug)]
pub struct Scanned {
    /// The snapshot of the last valid manifest: `Ok(Some(bytes))`, `Ok(None)` when there is
    /// no manifest, `Err(why)` when its chunks are missing or damaged.
    pub snapshot: Result<Option<(Vec<u8>, u64)>, String>,
    /// Valid journal frames, in offset order: (offset, generation, bytes).
    pub journal: Vec<(i64, u64, Vec<u8>)>,
    /// Every live (not tombstoned) key of this prefix, by kind, for clean-up.
    pub live: BTreeSet<Kind>,
    /// Records ignored because a later writer's fence came before them (a zombie's writes).
    pub fenced: u64,
    /// Records whose key this version cannot read, or whose value is damaged.
    pub unreadable: u64,
    /// The last fence's writer and epoch.
    pub last_fence: Option<(String, i64)>,
    /// The reason of a valid lost marker that no valid manifest follows: the state is
    /// damaged (see the module's lost marker).
    pub lost: Option<String>,
}

/// Folds `records` (one partition, offset order) for `prefix` into what a restore may use.
pub fn scan(prefix: &str, records: impl IntoIterator<Item = Record>) -> Scanned {
    let mut scanner = Scanner::new(prefix);
    for r in records {
        scanner.push(r);
    }
    scanner.finish()
}

/// [`scan`] one record at a time, keeping only what the restore can still use, so that a
/// restore's memory is bounded by the state, not by the partition (never the whole
/// partition, every cluster's records since the topic was created, in memory at once).
/// Other prefixes' records are counted by the reader and never held (see
/// [`Scanner::wants`]); a valid manifest drops every chunk and manifest it supersedes and
/// the journal frames of generations below its own (the snapshot covers them).
pub struct Scanner {
    prefix: String,
    /// `{prefix}/`, for [`Scanner::wants`].
    prefix_slash: String,
    out: Scanned,
    current: Option<(String, i64)>,
    chunks: BTreeMap<(i64, u64, u32), Vec<u8>>,
    manifests: BTreeMap<(i64, u64), (i64, Manifest)>,
    journal: BTreeMap<(i64, u64, u64), (i64, Vec<u8>)>,
    /// Valid lost markers: epoch -> (offset, reason).
    lost: BTreeMap<i64, (i64, String)>,
    /// The generation of the last valid manifest (its snapshot covers older journal).
    covered_below: u64,
    /// Bytes of values held now (chunks, journal frames).
    held: usize,
    /// The most ever held.
    peak: usize,
}

impl Scanner {
    /// A scanner of `prefix`'s records.
    pub fn new(prefix: &str) -> Scanner {
        Scanner {
            prefix: prefix.to_owned(),
            prefix_slash: format!("{prefix}/"),
            out: Scanned {
                snapshot: Ok(None),
                journal: Vec::new(),
                live: BTreeSet::new(),
                fenced: 0,
                unreadable: 0,
                last_fence: None,
                lost: None,
            },
            current: None,
            chunks: BTreeMap::new(),
            manifests: BTreeMap::new(),
            journal: BTreeMap::new(),
            lost: BTreeMap::new(),
            covered_below: 0,
            held: 0,
            peak: 0,
        }
    }

    /// Whether a record with `key` is this prefix's (the reader copies no other's value).
    pub fn wants(&self, key: &[u8]) -> bool {
        key.starts_with(self.prefix_slash.as_bytes())
    }

    /// Bytes of record values held now, and the most held at once so far.
    pub fn held_bytes(&self) -> (usize, usize) {
        (self.held, self.peak)
    }

    /// Folds the next record (offset order).
    pub fn push(&mut self, r: Record) {
        let Some(kind) = Kind::parse(&self.prefix, &r.key) else {
            if self.wants(r.key.as_bytes()) {
                self.out.unreadable += 1;
            }
            return;
        };
        let Some(value) = r.value else {
            // A tombstone: the key is gone (its record was covered).
            self.out.live.remove(&kind);
            match kind {
                Kind::Chunk {
                    epoch,
                    generation,
                    i,
                } => {
                    if let Some(v) = self.chunks.remove(&(epoch, generation, i)) {
                        self.held -= v.len();
                    }
                }
                Kind::Manifest { epoch, generation } => {
                    self.manifests.remove(&(epoch, generation));
                }
                Kind::Journal {
                    epoch,
                    generation,
                    n,
                } => {
                    if let Some((_, v)) = self.journal.remove(&(epoch, generation, n)) {
                        self.held -= v.len();
                    }
                }
                Kind::Lost { epoch } => {
                    self.lost.remove(&epoch);
                }
                Kind::Fence(_) => {}
            }
            return;
        };
        self.out.live.insert(kind.clone());
        if let Kind::Fence(writer) = &kind {
            self.current = Some((writer.clone(), r.offset));
            return;
        }
        let valid = match (&self.current, &r.writer, r.epoch) {
            (Some((w, e)), Some(rw), Some(re)) => w == rw && *e == re && kind.epoch() == Some(re),
            _ => false,
        };
        if !valid {
            self.out.fenced += 1;
            return;
        }
        match kind {
            Kind::Chunk {
                epoch,
                generation,
                i,
            } => {
                self.held += value.len();
                if let Some(old) = self.chunks.insert((epoch, generation, i), value) {
                    self.held -= old.len();
                }
            }
            Kind::Manifest { epoch, generation } => {
                match serde_json::from_slice::<Manifest>(&value) {
                    Ok(m) if m.generation == generation => {
                        self.manifests.insert((epoch, generation), (r.offset, m));
                        self.supersede(epoch, generation);
                    }
                    Ok(_) => self.out.unreadable += 1,
                    Err(_) => self.out.unreadable += 1,
                }
            }
            Kind::Journal {
                epoch,
                generation,
                n,
            } => {
                if generation >= self.covered_below {
                    self.held += value.len();
                    if let Some((_, old)) = self
                        .journal
                        .insert((epoch, generation, n), (r.offset, value))
                    {
                        self.held -= old.len();
                    }
                }
            }
            Kind::Lost { epoch } => {
                let reason = String::from_utf8_lossy(&value).into_owned();
                self.lost.insert(epoch, (r.offset, reason));
            }
            Kind::Fence(_) => {}
        }
        self.peak = self.peak.max(self.held);
    }

    /// A valid manifest of (`epoch`, `generation`) came: the last valid manifest is the one
    /// a restore uses, so every other snapshot's chunks and manifest, and the journal of
    /// older generations, are no longer needed. (Chunks written after it belong to a later
    /// save, whose manifest comes after them: none is written yet here.)
    fn supersede(&mut self, epoch: i64, generation: u64) {
        let mut freed = 0;
        self.chunks.retain(|(e, g, _), v| {
            let keep = (*e, *g) == (epoch, generation);
            if !keep {
                freed += v.len();
            }
            keep
        });
        self.manifests.retain(|k, _| *k == (epoch, generation));
        self.covered_below = self.covered_below.max(generation);
        let below = self.covered_below;
        self.journal.retain(|(_, g, _), (_, v)| {
            let keep = *g >= below;
            if !keep {
                freed += v.len();
            }
            keep
        });
        self.held -= freed;
    }

    /// What a restore may use.
    pub fn finish(mut self) -> Scanned {
        self.out.last_fence = self.current;
        // The valid manifest written last.
        let last_manifest = self.manifests.values().map(|(o, _)| *o).max();
        if let Some(((epoch, _), (offset, m))) =
            self.manifests.into_iter().max_by_key(|(_, (o, _))| *o)
        {
            self.out.snapshot =
                assemble(epoch, offset, &m, &self.chunks).map(|b| Some((b, m.generation)));
        }
        self.out.lost = self
            .lost
            .into_values()
            .filter(|(o, _)| last_manifest.is_none_or(|m| m < *o))
            .max_by_key(|(o, _)| *o)
            .map(|(o, reason)| {
                format!("{reason} (lost marker at offset {o}, no snapshot saved since)")
            });
        let mut frames: Vec<(i64, u64, Vec<u8>)> = self
            .journal
            .into_iter()
            .map(|((_, g, _), (o, v))| (o, g, v))
            .collect();
        frames.sort_by_key(|(o, _, _)| *o);
        self.out.journal = frames;
        self.out
    }
}

/// The snapshot of manifest `m` (epoch `epoch`, at `offset`) from its chunks, checked.
fn assemble(
    epoch: i64,
    offset: i64,
    m: &Manifest,
    chunks: &BTreeMap<(i64, u64, u32), Vec<u8>>,
) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(usize::try_from(m.bytes).unwrap_or(0).min(1 << 30));
    for i in 0..m.chunks {
        match chunks.get(&(epoch, m.generation, i)) {
            Some(c) => bytes.extend_from_slice(c),
            None => {
                return Err(format!(
                    "the snapshot of the manifest at offset {offset} (epoch {epoch}, generation {}) lacks chunk {i} of {}",
                    m.generation, m.chunks
                ))
            }
        }
    }
    if bytes.len() as u64 != m.bytes || xxhash_rust::xxh3::xxh3_64(&bytes) != m.xxh3 {
        return Err(format!(
            "the snapshot of the manifest at offset {offset} (epoch {epoch}, generation {}) does not match its checksum ({} bytes, {} expected)",
            m.generation,
            bytes.len(),
            m.bytes
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Log {
        records: Vec<Record>,
    }

    impl Log {
        fn next(&self) -> i64 {
            self.records.len() as i64
        }
        fn fence(&mut self, w: &str) -> i64 {
            let offset = self.next();
            self.records.push(Record {
                offset,
                key: Kind::Fence(w.into()).key("p"),
                value: Some(b"{}".to_vec()),
                writer: None,
                epoch: None,
            });
            offset
        }
        fn put(&mut self, w: &str, epoch: i64, kind: Kind, value: Option<Vec<u8>>) {
            let offset = self.next();
            self.records.push(Record {
                offset,
                key: kind.key("p"),
                value,
                writer: Some(w.into()),
                epoch: Some(epoch),
            });
        }
        fn snapshot(&mut self, w: &str, epoch: i64, generation: u64, bytes: &[u8], chunk: usize) {
            let parts: Vec<&[u8]> = bytes.chunks(chunk).collect();
            for (i, c) in parts.iter().enumerate() {
                let i = i as u32;
                self.put(
                    w,
                    epoch,
                    Kind::Chunk {
                        epoch,
                        generation,
                        i,
                    },
                    Some(c.to_vec()),
                );
            }
            let m = Manifest {
                generation,
                chunks: parts.len() as u32,
                bytes: bytes.len() as u64,
                xxh3: xxhash_rust::xxh3::xxh3_64(bytes),
            };
            self.put(
                w,
                epoch,
                Kind::Manifest { epoch, generation },
                Some(serde_json::to_vec(&m).unwrap()),
            );
        }
        /// Compaction: the last record of each key, in offset order; tombstones kept.
        fn compacted(&self) -> Vec<Record> {
            let mut last: BTreeMap<&str, usize> = BTreeMap::new();
            for (i, r) in self.records.iter().enumerate() {
                last.insert(&r.key, i);
            }
            let keep: BTreeSet<usize> = last.into_values().collect();
            keep.into_iter().map(|i| self.records[i].clone()).collect()
        }
    }

    fn snap(s: &Scanned) -> Option<Vec<u8>> {
        s.snapshot.clone().unwrap().map(|(b, _)| b)
    }

    #[test]
    fn keys_round_trip_and_other_prefixes_are_not_ours() {
        for k in [
            Kind::Fence("w1".into()),
            Kind::Chunk {
                epoch: 7,
                generation: 9,
                i: 3,
            },
            Kind::Manifest {
                epoch: 7,
                generation: 9,
            },
            Kind::Journal {
                epoch: 7,
                generation: 9,
                n: 11,
            },
        ] {
            assert_eq!(Kind::parse("p", &k.key("p")), Some(k.clone()));
            assert_eq!(Kind::parse("p2", &k.key("p")), None);
            assert_eq!(Kind::parse("p", &k.key("p/x")), None);
        }
    }

    /// The zombie's clean-up after its own (ignored) save: tombstones of its previous
    /// snapshot, the one its successor restored from.
    fn zombie_cleans_up(log: &mut Log, epoch: i64, generation: u64, chunks: u32) {
        for i in 0..chunks {
            log.put(
                "a",
                epoch,
                Kind::Chunk {
                    epoch,
                    generation,
                    i,
                },
                None,
            );
        }
        log.put("a", epoch, Kind::Manifest { epoch, generation }, None);
    }

    #[test]
    fn a_zombies_writes_after_its_successors_fence_are_ignored_before_and_after_compaction() {
        let mut log = Log { records: vec![] };
        let e1 = log.fence("a");
        log.snapshot("a", e1, 10, b"state of a, generation 10", 8);
        log.put(
            "a",
            e1,
            Kind::Journal {
                epoch: e1,
                generation: 10,
                n: 0,
            },
            Some(b"frame a".to_vec()),
        );
        // b takes over: its restore (reading up to its fence) sees a's state...
        let e2 = log.fence("b");
        let seen_by_b = scan("p", log.records.clone());
        assert_eq!(snap(&seen_by_b).unwrap(), b"state of a, generation 10");
        assert_eq!(seen_by_b.journal.len(), 1);
        let before_copy = log.records.len();
        // ...and copies it forward under its own epoch (KafkaStore::restore).
        log.put(
            "b",
            e2,
            Kind::Journal {
                epoch: e2,
                generation: 10,
                n: 0,
            },
            Some(b"frame a".to_vec()),
        );
        log.snapshot("b", e2, 10, b"state of a, generation 10", 8);
        // Then b tombstones what its copy covers: a's journal (a's fence and snapshot too in
        // the store; left here, as the zombie's own clean-up below removes the snapshot).
        log.put(
            "b",
            e2,
            Kind::Journal {
                epoch: e1,
                generation: 10,
                n: 0,
            },
            None,
        );
        // a, a zombie, goes on: a newer snapshot (and manifest), a journal frame, then it
        // tombstones its previous snapshot as its save covers it.
        log.snapshot("a", e1, 11, b"zombie state", 5);
        log.put(
            "a",
            e1,
            Kind::Journal {
                epoch: e1,
                generation: 11,
                n: 1,
            },
            Some(b"zombie frame".to_vec()),
        );
        zombie_cleans_up(&mut log, e1, 10, 4);
        // Before b saved: the next restore gets the state b took over, not the zombie's.
        for records in [log.records.clone(), log.compacted()] {
            let s = scan("p", records);
            assert_eq!(snap(&s).unwrap(), b"state of a, generation 10");
            assert_eq!(s.journal.len(), 1, "{:?}", s.journal);
            assert_eq!(s.journal[0].2, b"frame a");
        }
        assert!(scan("p", log.records.clone()).fenced >= 4);
        // Without b's copy, the zombie's clean-up would have destroyed it: what the copy is for.
        let mut no_copy = Log {
            records: log.records[..before_copy].to_vec(),
        };
        no_copy.snapshot("a", e1, 11, b"zombie state", 5);
        zombie_cleans_up(&mut no_copy, e1, 10, 4);
        assert_eq!(snap(&scan("p", no_copy.compacted())), None);
        // b saves; the zombie writes again.
        log.snapshot("b", e2, 20, b"state of b", 4);
        log.snapshot("a", e1, 12, b"zombie again", 64);
        for records in [log.records.clone(), log.compacted()] {
            let s = scan("p", records);
            assert_eq!(snap(&s).unwrap(), b"state of b");
            assert_eq!(s.last_fence, Some(("b".into(), e2)));
        }
    }

    #[test]
    fn a_save_cut_short_keeps_the_previous_snapshot_and_a_missing_chunk_is_reported() {
        let mut log = Log { records: vec![] };
        let e = log.fence("a");
        log.snapshot("a", e, 1, b"first snapshot!", 4);
        // Chunks of the next save, no manifest yet (a crash in the middle).
        log.put(
            "a",
            e,
            Kind::Chunk {
                epoch: e,
                generation: 2,
                i: 0,
            },
            Some(b"seco".to_vec()),
        );
        assert_eq!(
            snap(&scan("p", log.compacted())).unwrap(),
            b"first snapshot!"
        );
        // A chunk the manifest names is gone (tombstoned): reported, not a wrong snapshot.
        log.put(
            "a",
            e,
            Kind::Chunk {
                epoch: e,
                generation: 1,
                i: 2,
            },
            None,
        );
        let err = scan("p", log.compacted()).snapshot.unwrap_err();
        assert!(err.contains("lacks chunk 2 of 4"), "{err}");
    }

    #[test]
    fn a_lost_marker_makes_the_state_damaged_until_a_snapshot_follows_it() {
        let mut log = Log {
            records: Vec::new(),
        };
        // The topic lost its records: the writer's new fence, its lost marker, a journal
        // frame written after the loss.
        let e = log.fence("w1");
        log.put(
            "w1",
            e,
            Kind::Lost { epoch: e },
            Some(b"the topic no longer exists".to_vec()),
        );
        let journal = Kind::Journal {
            epoch: e,
            generation: 5,
            n: 0,
        };
        log.put("w1", e, journal, Some(b"frame".to_vec()));
        for records in [log.records.clone(), log.compacted()] {
            let s = scan("p", records);
            assert_eq!(snap(&s), None);
            assert_eq!(s.journal.len(), 1, "the journal is read");
            let lost = s.lost.expect("the state is damaged");
            assert!(lost.contains("the topic no longer exists"), "{lost}");
        }
        // A snapshot saved after it: the state is whole again.
        log.snapshot("w1", e, 6, b"state", 2);
        for records in [log.records.clone(), log.compacted()] {
            let s = scan("p", records);
            assert_eq!(snap(&s).as_deref(), Some(&b"state"[..]));
            assert_eq!(s.lost, None);
        }
        // A zombie's lost marker after a successor's fence is not the successor's state.
        let e2 = log.fence("w2");
        log.put("w1", e, Kind::Lost { epoch: e }, Some(b"late".to_vec()));
        let s = scan("p", log.records.clone());
        assert_eq!(s.lost, None, "fenced: {}", s.fenced);
        // Tombstoned by the writer's clean-up: gone.
        log.put("w2", e2, Kind::Lost { epoch: e2 }, Some(b"again".to_vec()));
        assert!(scan("p", log.records.clone()).lost.is_some());
        log.put("w2", e2, Kind::Lost { epoch: e2 }, None);
        assert_eq!(scan("p", log.compacted()).lost, None);
    }

    /// A restore must not hold every record of the partition (every state's, every save
    /// since the topic was created) before folding. The scanner, fed as the
    /// reader does (other prefixes' values never copied), holds at most one snapshot being
    /// written beside the current one, and the journal not yet covered.
    #[test]
    fn a_restore_holds_one_or_two_snapshots_not_the_partition() {
        const SNAPSHOT: usize = 100 * 1024;
        let mut log = Log {
            records: Vec::new(),
        };
        let e = log.fence("w1");
        let mut partition_bytes = 0;
        for save in 1..=100u64 {
            // Journal frames of this generation, then the save (its chunks, its manifest),
            // with another cluster's state interleaved in the same partition.
            for n in 0..5 {
                let kind = Kind::Journal {
                    epoch: e,
                    generation: save,
                    n: save * 10 + n,
                };
                log.put("w1", e, kind, Some(vec![b'j'; 1_000]));
            }
            let state = vec![(save % 251) as u8; SNAPSHOT];
            log.snapshot("w1", e, save + 1, &state, 10 * 1024);
            let other = Record {
                offset: log.next(),
                key: "other/snapshot/0/1/0".into(),
                value: Some(vec![0; SNAPSHOT]),
                writer: None,
                epoch: None,
            };
            log.records.push(other);
        }
        for r in &log.records {
            partition_bytes += r.value.as_ref().map_or(0, Vec::len);
        }
        let mut scanner = Scanner::new("p");
        let mut copied = 0;
        for r in log.records.clone() {
            if scanner.wants(r.key.as_bytes()) {
                copied += r.value.as_ref().map_or(0, Vec::len);
                scanner.push(r);
            }
        }
        let (held, peak) = scanner.held_bytes();
        let scanned = scanner.finish();
        assert_eq!(snap(&scanned), Some(vec![100u8; SNAPSHOT]));
        assert!(scanned.journal.is_empty(), "every frame is covered");
        eprintln!(
            "partition {partition_bytes} bytes, this state's {copied}, held at the end {held}, at most {peak}"
        );
        assert!(
            peak <= 2 * SNAPSHOT + 5 * 1_000,
            "held at most {peak} bytes of a {partition_bytes}-byte partition"
        );
        assert!(held <= SNAPSHOT, "{held}");
    }

    #[test]
    fn records_before_any_fence_or_without_headers_are_not_used() {
        let mut log = Log { records: vec![] };
        log.snapshot("a", 0, 1, b"no fence", 4);
        let s = scan("p", log.records.clone());
        assert_eq!(snap(&s), None);
        assert_eq!(s.fenced, 3);
    }
}
