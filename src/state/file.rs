//! The `file` state backend: one file (`state.path`), replaced atomically on every save by
//! writing a temporary file in the same directory, fsyncing it, renaming it over the state
//! and fsyncing the directory (so the rename survives a power loss). A reader sees the old or
//! the new state, whole. The file follows a restart on the same volume; a ReadWriteOnce
//! volume does not follow a hand-over to a replica on another node (use `nats` for that).
//!
//! Blocking file I/O runs on tokio's blocking threads, never on the informers' workers.

use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::{StateError, StateStore};

/// The state in a local file.
pub struct FileStore {
    path: PathBuf,
    description: String,
}

impl FileStore {
    /// The store at `path` (nothing is touched until the first load or save).
    pub fn new(path: PathBuf) -> Self {
        let description = format!("file {}", path.display());
        FileStore { path, description }
    }
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
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
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

    async fn save(&self, bytes: Vec<u8>) -> Result<(), StateError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .map_err(|e| StateError::Task {
                what: "writing",
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
        store.save(b"first".to_vec()).await.unwrap();
        store.save(b"second".to_vec()).await.unwrap();
        assert_eq!(store.load().await.unwrap().as_deref(), Some(&b"second"[..]));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
        let missing = FileStore::new(dir.path().join("no/such/dir/state"));
        let e = missing.save(b"x".to_vec()).await.unwrap_err().to_string();
        assert!(
            e.contains("no/such/dir/state") && e.contains("temporary file"),
            "{e}"
        );
    }
}
