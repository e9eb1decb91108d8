//! Log capture for end-to-end tests: one process-wide tracing subscriber (human format, no
//! colours, `info` as an operator runs kubesink by default) that keeps every line in memory,
//! so a test can assert what an operator would read. Tests of one binary run in parallel in
//! one process: each test names its cluster uniquely (see [`unique_cluster`]) and reads only
//! the lines that carry it (every informer line carries `cluster=NAME` in its span).

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Every line logged in this process since [`install`].
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Every line containing `needle`.
    pub fn lines(&self, needle: &str) -> Vec<String> {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&all)
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Lines of cluster `cluster` (`cluster=NAME` in the span or fields) containing `text`.
    pub fn of(&self, cluster: &str, text: &str) -> Vec<String> {
        self.lines(&format!("cluster={cluster}"))
            .into_iter()
            .filter(|l| l.contains(text))
            .collect()
    }
}

/// Installs the capturing subscriber (once per process) and returns its buffer.
pub fn install() -> Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init();
        logs
    })
    .clone()
}

/// A cluster name no other test of this process uses (and no prefix of another):
/// `NAME-N-x`.
pub fn unique_cluster(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{name}-{}-x", N.fetch_add(1, Ordering::Relaxed))
}
