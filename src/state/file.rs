//! The `file` state backend: one file (`state.path`), replaced atomically on every save by
//! writing a temporary file in the same directory, fsyncing it, renaming it over the state
//! and fsyncing the directory (so the rename survives a power loss). A reader sees the old or
//! the new state, whole. The file follows a restart on the same volume; a ReadWriteOnce
//! volume does not follow a hand-over to a replica on another node (use `nats` for that).
//!
//! The journal (`journal.rs`) lives beside it: files
//! `{state.path}.journal-{generation:020}.{part}`, appended frame by frame, each append
//! followed by an fdatasync (and the directory fsynced when a file is created), so an `Ok`
//! append is on disk. A crash mid-append can leave only the last frame of a file cut short,
//! which the reader drops as torn (`journal/frame.rs`); after a failed append the next one
//! goes to a new part, so a torn frame is never followed by another.
//!
//! Blocking file I/O runs on tokio's blocking threads, never on the informers' workers.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kubesink_core::state::{JournalSegment, StateError, StateStore};

/// The state in a local file, its journal in files beside it.
pub struct FileStore {
    path: PathBuf,
    description: String,
    /// The journal segment open for appending: its generation and file, and the part number
    /// the next file opened gets.
    segment: Arc<Mutex<Segment>>,
}

#[derive(Default)]
struct Segment {
    open: Option<(u64, File)>,
    next_part: u32,
}

impl FileStore {
    /// The store at `path` (nothing is touched until the first load or save).
    pub fn new(path: PathBuf) -> Self {
        let description = format!("file {}", path.display());
        FileStore {
            path,
            description,
            segment: Arc::default(),
        }
    }
}

/// The directory of `path` (`.` for a bare file name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The prefix of journal segment file names: `{file name}.journal-`.
fn segment_prefix(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    format!("{name}.journal-")
}

fn segment_path(path: &Path, generation: u64, part: u32) -> PathBuf {
    dir_of(path).join(format!("{}{generation:020}.{part}", segment_prefix(path)))
}

/// A journal segment file's place in order: (generation, part).
type SegmentOrder = (u64, u32);

/// The journal segments beside `path`, as ((generation, part), file), oldest first.
fn segments(path: &Path) -> Result<Vec<(SegmentOrder, PathBuf)>, StateError> {
    let prefix = segment_prefix(path);
    let dir = dir_of(path);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(err(path, "listing the journal segments in its directory")(
                e,
            ))
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(err(path, "listing the journal segments in its directory"))?;
        let name = entry.file_name();
        let Some(order) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|g| g.split_once('.'))
            .and_then(|(g, p)| Some((g.parse::<u64>().ok()?, p.parse::<u32>().ok()?)))
        else {
            continue;
        };
        out.push((order, entry.path()));
    }
    out.sort();
    Ok(out)
}

/// Appends `frames` to the segment of `generation` in one write and syncs it, opening (and
/// creating, with a directory fsync) the segment when it is not the open one.
fn append_frames(
    path: &Path,
    segment: &Mutex<Segment>,
    generation: u64,
    frames: &[Vec<u8>],
) -> Result<(), StateError> {
    let mut seg = segment.lock().unwrap_or_else(|p| p.into_inner());
    if seg.open.as_ref().is_none_or(|(g, _)| *g != generation) {
        let part = seg.next_part;
        seg.next_part += 1;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment_path(path, generation, part))
            .map_err(err(path, "opening a journal segment beside it"))?;
        #[cfg(unix)]
        File::open(dir_of(path))
            .and_then(|d| d.sync_all())
            .map_err(err(path, "fsyncing its directory"))?;
        seg.open = Some((generation, file));
    }
    let Some((_, file)) = seg.open.as_mut() else {
        return Ok(());
    };
    let written = file
        .write_all(&frames.concat())
        .and_then(|()| file.sync_data());
    if let Err(e) = written {
        // A half-written frame stays at the end of this file (the reader drops it as torn);
        // the retry goes to a new part so that it never follows a torn frame.
        seg.open = None;
        return Err(err(path, "appending to its journal segment")(e));
    }
    Ok(())
}

fn err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> StateError + 'a {
    move |source| StateError::File {
        path: path.display().to_string(),
        what,
        source,
    }
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the dir).
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let dir = dir_of(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(".kubesink-state-")
        .tempfile_in(dir)
        .map_err(err(path, "creating a temporary file in its directory"))?;
    tmp.write_all(bytes)
        .map_err(err(path, "writing the temporary file"))?;
    tmp.as_file()
        .sync_all()
        .map_err(err(path, "fsyncing the temporary file"))?;
    tmp.persist(path)
        .map_err(|e| err(path, "renaming the temporary file over it")(e.error))?;
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err(path, "fsyncing its directory"))?;
    Ok(())
}

#[async_trait]
impl StateStore for FileStore {
    fn describe(&self) -> &str {
        &self.description
    }

    async fn load(&self) -> Result<Option<Vec<u8>>, StateError> {
        let path = self.path.clone();
        let read = tokio::task::spawn_blocking(move || match std::fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err(&path, "reading")(e)),
        });
        read.await.map_err(|e| StateError::Task {
            what: "reading",
            detail: e.to_string(),
        })?
    }

    async fn save(&self, bytes: Vec<u8>, _generation: u64) -> Result<(), StateError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .map_err(|e| StateError::Task {
                what: "writing",
                detail: e.to_string(),
            })?
    }

    async fn append(&self, generation: u64, frames: Vec<Vec<u8>>) -> Result<(), StateError> {
        let (path, open) = (self.path.clone(), self.segment.clone());
        tokio::task::spawn_blocking(move || append_frames(&path, &open, generation, &frames))
            .await
            .map_err(|e| StateError::Task {
                what: "journal append",
                detail: e.to_string(),
            })?
    }

    async fn load_journal(&self) -> Result<Vec<JournalSegment>, StateError> {
        let path = self.path.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for (_, file) in segments(&path)? {
                let bytes = match std::fs::read(&file) {
                    Ok(b) => b,
                    // Dropped between the listing and the read: a newer snapshot covers it.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(err(&path, "reading a journal segment beside it")(e)),
                };
                out.push(JournalSegment {
                    name: file.display().to_string(),
                    bytes,
                    may_tear: true,
                });
            }
            Ok(out)
        });
        read.await.map_err(|e| StateError::Task {
            what: "journal read",
            detail: e.to_string(),
        })?
    }

    async fn drop_journal_before(&self, generation: u64) -> Result<(), StateError> {
        let (path, open) = (self.path.clone(), self.segment.clone());
        let drop = tokio::task::spawn_blocking(move || {
            {
                let mut seg = open.lock().unwrap_or_else(|p| p.into_inner());
                if seg.open.as_ref().is_some_and(|(g, _)| *g < generation) {
                    seg.open = None;
                }
            }
            for ((g, _), file) in segments(&path)? {
                if g >= generation {
                    break;
                }
                match std::fs::remove_file(&file) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(err(&path, "removing an old journal segment beside it")(e))
                    }
                }
            }
            Ok(())
        });
        drop.await.map_err(|e| StateError::Task {
            what: "journal cleanup",
            detail: e.to_string(),
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn saves_replace_the_file_whole_and_a_missing_file_is_no_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path().join("state"));
        assert_eq!(store.load().await.unwrap(), None);
        store.save(b"first".to_vec(), 0).await.unwrap();
        store.save(b"second".to_vec(), 0).await.unwrap();
        assert_eq!(store.load().await.unwrap().as_deref(), Some(&b"second"[..]));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
        let missing = FileStore::new(dir.path().join("no/such/dir/state"));
        let e = missing
            .save(b"x".to_vec(), 0)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no/such/dir/state") && e.contains("temporary file"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn journal_segments_are_appended_listed_in_order_and_dropped_below_a_generation() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path().join("state"));
        assert!(store.load_journal().await.unwrap().is_empty());
        store.append(7, vec![b"a".to_vec()]).await.unwrap();
        store.append(7, vec![b"b".to_vec()]).await.unwrap();
        store.append(12, vec![b"c".to_vec()]).await.unwrap();
        std::fs::write(dir.path().join("state.journal-notanumber"), b"x").unwrap();
        std::fs::write(
            dir.path().join("other.journal-00000000000000000001.0"),
            b"x",
        )
        .unwrap();
        let segs = store.load_journal().await.unwrap();
        let got: Vec<(&[u8], bool)> = segs.iter().map(|s| (&s.bytes[..], s.may_tear)).collect();
        assert_eq!(got, [(&b"ab"[..], true), (&b"c"[..], true)]);
        assert!(
            segs[0]
                .name
                .ends_with("state.journal-00000000000000000007.0"),
            "{}",
            segs[0].name
        );
        store.drop_journal_before(12).await.unwrap();
        let segs = store.load_journal().await.unwrap();
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].bytes, b"c");
        store.append(12, vec![b"d".to_vec()]).await.unwrap();
        assert_eq!(store.load_journal().await.unwrap()[0].bytes, b"cd");
        // An append of an older generation after its segments were dropped (a frame that was
        // in flight at the save) opens a new part: harmless, a later drop removes it.
        store.append(7, vec![b"e".to_vec()]).await.unwrap();
        let segs = store.load_journal().await.unwrap();
        assert_eq!(segs.len(), 2);
        assert!(segs[0].name.ends_with("07.2"), "{}", segs[0].name);
    }

    #[test]
    fn after_a_failed_append_the_next_one_goes_to_a_new_part() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let segment = Mutex::new(Segment::default());
        append_frames(&path, &segment, 3, &[b"good".to_vec()]).unwrap();
        // Make the open file refuse writes (as a full disk would): a read-only handle.
        {
            let mut seg = segment.lock().unwrap();
            let readonly = File::open(segment_path(&path, 3, 0)).unwrap();
            seg.open = Some((3, readonly));
        }
        let e = append_frames(&path, &segment, 3, &[b"lost".to_vec()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("appending to its journal segment"), "{e}");
        append_frames(&path, &segment, 3, &[b"re".to_vec(), b"tried".to_vec()]).unwrap();
        let parts: Vec<(SegmentOrder, Vec<u8>)> = segments(&path)
            .unwrap()
            .into_iter()
            .map(|(o, f)| (o, std::fs::read(f).unwrap()))
            .collect();
        assert_eq!(
            parts,
            [((3, 0), b"good".to_vec()), ((3, 1), b"retried".to_vec())]
        );
    }
}
