//! The real `kubesink` binary as a child process: started with a config file, its stdout
//! (JSON Lines from the stdout sink) collected line by line, its stderr kept in a file;
//! stopped with SIGTERM (clean shutdown) or SIGKILL (a crash). Also the pieces of the
//! config files these tests write ([`write_config`], [`resource_toml`], [`leader_toml`],
//! [`nats_state_toml`], [`STDOUT_SINK`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// `[[sinks]]` writing to stdout, which [`Kubesink`] reads back.
pub const STDOUT_SINK: &str = "[[sinks]]\ntype = \"stdout\"\n";

/// `[leader_election]` on Lease `name` in `namespace`, of a scale-out group when `scale_out`,
/// with timings under which a lost leader or group member is replaced within seconds.
pub fn leader_toml(name: &str, namespace: &str, scale_out: bool) -> String {
    let scale_out = if scale_out { "scale_out = true\n" } else { "" };
    format!(
        "[leader_election]\nenabled = true\n{scale_out}lease_name = {name:?}\nlease_namespace = {namespace:?}\nlease_duration = \"4s\"\nrenew_deadline = \"2500ms\"\nretry_period = \"500ms\"\n"
    )
}

/// `[state]` in JetStream key-value buckets of the NATS server at `url`.
pub fn nats_state_toml(url: &str) -> String {
    format!("[state]\nbackend = \"nats\"\n[state.nats]\nservers = [{url:?}]\n")
}

/// Writes `dir/kubesink.toml`: a `[cluster]` named `name` that reads `kubeconfig`, followed
/// by `rest` (more keys of `[cluster]`, then the other tables); returns its path.
pub fn write_config(dir: &Path, name: &str, kubeconfig: &Path, rest: &str) -> PathBuf {
    let path = dir.join("kubesink.toml");
    let text = format!(
        "[cluster]\nname = {name:?}\nkubeconfig = {:?}\n{rest}",
        kubeconfig.display().to_string()
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// `[[resources]]` of `kind` in `api_version`, in `namespaces` (all when empty).
pub fn resource_toml(api_version: &str, kind: &str, namespaces: &[&str]) -> String {
    let mut t = format!("[[resources]]\napi_version = {api_version:?}\nkind = {kind:?}\n");
    if !namespaces.is_empty() {
        t.push_str(&format!("namespaces = {namespaces:?}\n"));
    }
    t
}

/// A command for the kubesink binary `bin` with a clean environment for configuration: no
/// `KUBESINK_` variable and no `RUST_LOG` but what the caller sets; killed when dropped.
pub fn clean_command(bin: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("KUBESINK_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("RUST_LOG");
    cmd.kill_on_drop(true);
    cmd
}

/// A running `kubesink run --config FILE`.
pub struct Kubesink {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    /// The same lines as written, for byte-for-byte comparisons.
    raw: Arc<Mutex<Vec<String>>>,
    /// Lines that were not JSON (only the last one, cut by a SIGKILL, is acceptable).
    broken: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Kubesink {
    /// Starts the binary (`bin`, from `env!("CARGO_BIN_EXE_kubesink")`) with `config`, in
    /// `dir` (its working directory; stderr goes to `dir/<name>.log`), with a clean
    /// `KUBESINK_` environment and `extra_env`.
    pub fn start(
        bin: &str,
        config: &Path,
        dir: &Path,
        name: &str,
        extra_env: &[(&str, &str)],
    ) -> Kubesink {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut cmd = clean_command(bin);
        // Tests run in parallel: the HTTP server on a free port.
        cmd.env("KUBESINK_SERVER__LISTEN", "127.0.0.1:0");
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .args(["run", "--config"])
            .arg(config)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("start kubesink");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines: Arc<Mutex<Vec<Value>>> = Arc::default();
        let broken: Arc<Mutex<Vec<String>>> = Arc::default();
        let raw: Arc<Mutex<Vec<String>>> = Arc::default();
        let (sink, bad, text) = (lines.clone(), broken.clone(), raw.clone());
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                match serde_json::from_str::<Value>(&l) {
                    Ok(v) => {
                        sink.lock().unwrap().push(v);
                        text.lock().unwrap().push(l);
                    }
                    Err(e) => bad.lock().unwrap().push(format!("{e}: {l}")),
                }
            }
        });
        Kubesink {
            child,
            lines,
            raw,
            broken,
            reader: Some(reader),
            log,
        }
    }

    /// The messages written so far.
    pub fn messages(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    /// The messages written so far, each the text of its line as written.
    pub fn raw_messages(&self) -> Vec<String> {
        self.raw.lock().unwrap().clone()
    }

    /// The process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Sends `signal` (`STOP`, `CONT`...) without waiting.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal}");
    }

    /// Sends SIGSTOP and waits until the process is stopped (no write of it is in progress
    /// from then on); returns that instant. Whatever it observed, it observed before that
    /// instant, so every message it ever sends must carry an `observedAt` no later than it
    /// (`observedAt` is truncated to the millisecond): see [`observed_after`].
    pub async fn freeze(&self) -> jiff::Timestamp {
        self.signal("STOP");
        let stat = format!("/proc/{}/stat", self.pid());
        let started = std::time::Instant::now();
        loop {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            if state
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
            {
                return jiff::Timestamp::now();
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "not stopped 60 s after SIGSTOP: {state}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How many messages were written so far.
    pub fn count(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (at most `timeout`) until it wrote a message after this call; panics naming
    /// `what`, with its stderr, when it did not.
    pub async fn wait_for_more(&self, what: &str, timeout: Duration) {
        let before = self.count();
        crate::wait_until(what, timeout, || async {
            (self.count() > before)
                .then_some(())
                .ok_or_else(|| self.stderr())
        })
        .await;
    }

    /// Waits (at most `timeout`) until it logged that it follows another replica's lead
    /// (leader election); panics naming `what`, with its stderr, when it did not.
    pub async fn wait_following(&self, what: &str, timeout: Duration) {
        self.wait_logged(what, "following", timeout).await;
    }

    /// Waits (at most `timeout`) until its stderr contains `text`; panics naming `what`,
    /// with its stderr, when it did not.
    pub async fn wait_logged(&self, what: &str, text: &str, timeout: Duration) {
        crate::wait_until(what, timeout, || async {
            self.stderr()
                .contains(text)
                .then_some(())
                .ok_or_else(|| self.stderr())
        })
        .await;
    }

    /// How it exited, if it did (a crash shows here: a signal, no code).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL (no shutdown, no final save), then every complete line it wrote before dying
    /// (a last line cut by the kill is dropped). Fails if it had exited on its own before:
    /// a crash is not the kill the test meant.
    pub async fn kill(mut self) -> Vec<Value> {
        if let Some(status) = self.exited() {
            panic!(
                "kubesink exited on its own before the SIGKILL ({status}):\n{}",
                self.stderr()
            );
        }
        self.child.kill().await.expect("SIGKILL");
        let lines = self.drain().await;
        let broken = self.broken.lock().unwrap().clone();
        assert!(
            broken.len() <= 1,
            "stdout lines that are not JSON: {broken:?}"
        );
        lines
    }

    /// SIGTERM, waits for the exit (code 0 expected), then every line it wrote.
    pub async fn terminate(mut self) -> Vec<Value> {
        let pid = self.child.id().expect("running").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("exits within 60 s of SIGTERM")
            .expect("wait");
        assert_eq!(status.code(), Some(0), "stderr:\n{}", self.stderr());
        let lines = self.drain().await;
        let broken = self.broken.lock().unwrap().clone();
        assert!(
            broken.is_empty(),
            "stdout lines that are not JSON: {broken:?}"
        );
        lines
    }

    /// Sends `signal` (`TERM`, `INT`) and waits at most `within` for the exit: its code, or
    /// `None` when it was still running then (it is killed when dropped).
    pub async fn signal_and_wait(&mut self, signal: &str, within: Duration) -> Option<Option<i32>> {
        let pid = self.child.id().expect("running").to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill");
        assert!(status.success());
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => Some(status.expect("wait").code()),
            Err(_) => None,
        }
    }

    /// Every message it wrote, once it exited: waits for the end of its stdout (the lines
    /// still in the pipe when it exited are read too).
    pub async fn output(&mut self) -> Vec<Value> {
        assert!(self.exited().is_some(), "output() of a running kubesink");
        self.drain().await
    }

    async fn drain(&mut self) -> Vec<Value> {
        if let Some(r) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), r).await;
        }
        self.messages()
    }
}

/// The messages of `messages` observed after `instant` (their `observedAt`); panics on a
/// message without a readable `observedAt`. A replica frozen at `instant` ([`Kubesink::freeze`])
/// and woken after losing its leadership starts no send: at most a write it had handed to the
/// OS before the freeze completes (docs/robustness.md), and that carries only changes
/// observed before it. A send begun after the wake would carry changes observed since.
pub fn observed_after(messages: &[Value], instant: jiff::Timestamp) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| {
            let observed: jiff::Timestamp = m["observedAt"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("observedAt of {m}"));
            observed > instant
        })
        .cloned()
        .collect()
}
