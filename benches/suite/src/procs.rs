//! The processes the driver starts: the simulator, kubesink, the comparison programs and the
//! brokers (nats-server, tansu), each on a free port and killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A free TCP port on 127.0.0.1 (bound and released; another process could take it first).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A child process, killed (SIGKILL) and reaped on drop.
pub struct Proc {
    /// The process.
    pub child: Child,
    /// What it is, for messages.
    pub name: String,
}

impl Proc {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stdout, if piped and not yet taken.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Its stderr, if piped and not yet taken.
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// Sends SIGTERM and waits up to `within` for the exit (SIGKILL after that); the exit
    /// status, `None` when it had to be killed.
    pub fn terminate(
        &mut self,
        within: Duration,
    ) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let pid = libc::pid_t::try_from(self.pid())?;
        // SAFETY: kill(2) on the pid of a child not yet reaped (so not reused).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(None)
    }

    /// Fails if it has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited early: {status}", self.name);
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `cmd` as `name`.
pub fn spawn(name: &str, cmd: &mut Command) -> anyhow::Result<Proc> {
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {name} ({cmd:?})"))?;
    Ok(Proc {
        child,
        name: name.to_owned(),
    })
}

/// Waits until `addr` accepts a TCP connection.
pub fn wait_listening(addr: SocketAddr, within: Duration, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if Instant::now() > deadline {
            bail!("{what} did not listen on {addr} within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A running `kubesink-sim` with pods.
pub struct Sim {
    /// The process.
    pub proc: Proc,
    /// Where it serves.
    pub addr: SocketAddr,
    /// A kubeconfig pointing at it.
    pub kubeconfig: PathBuf,
}

impl Sim {
    /// Starts `bin_dir/kubesink-sim` with `pods` pods in 20 namespaces (seed 1) and waits
    /// until it serves (populating 100,000 pods takes a while).
    pub fn start(bin_dir: &Path, pods: usize, dir: &Path) -> anyhow::Result<Sim> {
        Sim::start_with(
            bin_dir,
            &format!("{pods}"),
            &["--pods", &pods.to_string(), "--namespaces", "20"],
            dir,
        )
    }

    /// Starts `bin_dir/kubesink-sim` with the workload `args` (`--pods N`, `--namespaces N`,
    /// …; seed 1), its kubeconfig named after `tag`, and waits until it serves.
    pub fn start_with(bin_dir: &Path, tag: &str, args: &[&str], dir: &Path) -> anyhow::Result<Sim> {
        let kubeconfig = dir.join(format!("kubeconfig-{tag}"));
        // The wait below is for this simulator's file, not one an earlier run left.
        let _ = std::fs::remove_file(&kubeconfig);
        let mut proc = spawn(
            "kubesink-sim",
            Command::new(bin_dir.join("kubesink-sim"))
                .args(args)
                .args(["--seed", "1"])
                .args(["--retained-events", "200000", "--bookmark-interval", "10s"])
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        )?;
        let out = proc.take_stdout().context("sim stdout")?;
        let mut lines = BufReader::new(out).lines();
        let first = lines
            .next()
            .context("kubesink-sim ended before serving")??;
        let addr = first
            .strip_prefix("kubesink-sim serving http://")
            .and_then(|r| r.split_whitespace().next())
            .with_context(|| format!("unexpected first line from kubesink-sim: {first:?}"))?
            .parse()?;
        // The kubeconfig line, then nothing more: drain the pipe in the background.
        std::thread::spawn(move || for _ in lines {});
        let deadline = Instant::now() + Duration::from_secs(10);
        while !kubeconfig.exists() {
            if Instant::now() > deadline {
                bail!("kubesink-sim wrote no kubeconfig");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Sim {
            proc,
            addr,
            kubeconfig,
        })
    }

    /// Starts (rate > 0) or stops (0) churn, stamping changed pods with `STAMP`.
    pub fn churn(&self, rate: f64) -> anyhow::Result<()> {
        crate::http::request(
            self.addr,
            "POST",
            &format!("/_sim/churn?rate={rate}&seed=7&stamp={STAMP}"),
        )?;
        Ok(())
    }

    /// `GET /_sim/stats` as JSON (request counts by resource and path, open watches, …).
    pub fn stats(&self) -> anyhow::Result<serde_json::Value> {
        let stats = crate::http::request(self.addr, "GET", "/_sim/stats")?;
        Ok(serde_json::from_str(&stats)?)
    }

    /// Churn operations applied since the last [`Sim::churn`] start.
    pub fn churn_applied(&self) -> anyhow::Result<u64> {
        let stats = crate::http::request(self.addr, "GET", "/_sim/stats")?;
        let v: serde_json::Value = serde_json::from_str(&stats)?;
        Ok(v["churnApplied"].as_u64().unwrap_or(0))
    }
}

/// The annotation the simulator's churn stamps with the change time (Unix microseconds).
pub const STAMP: &str = "bench.kubesink.io/changed-at";

/// The change time stamped into a message line or object, in Unix microseconds.
pub fn stamp_of(line: &str) -> Option<u64> {
    let key = format!("\"{STAMP}\":\"");
    let at = line.find(&key)? + key.len();
    let rest = &line[at..];
    rest[..rest.find('"')?].parse().ok()
}

/// Now, in Unix microseconds.
pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A nats-server with JetStream (file storage in `dir`) on a free port.
pub struct Nats {
    /// The process.
    pub proc: Proc,
    /// `nats://127.0.0.1:PORT`.
    pub url: String,
}

impl Nats {
    /// Starts it and waits until it listens.
    pub fn start(dir: &Path) -> anyhow::Result<Nats> {
        let port = free_port()?;
        let store = dir.join("nats-store");
        let proc = spawn(
            "nats-server",
            Command::new("nats-server")
                .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
                .arg(&store)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        wait_listening(
            ([127, 0, 0, 1], port).into(),
            Duration::from_secs(20),
            "nats-server",
        )?;
        Ok(Nats {
            proc,
            url: format!("nats://127.0.0.1:{port}"),
        })
    }
}

/// A tansu broker (memory storage) on a free port.
pub struct Tansu {
    /// The process.
    pub proc: Proc,
    /// `127.0.0.1:PORT`.
    pub bootstrap: String,
}

/// The cached tansu binary: `$TANSU_BIN`, else `${TOOLS_CACHE_DIR:-~/.cache/kubesink}/tansu/bin/tansu`.
pub fn tansu_bin() -> PathBuf {
    if let Ok(p) = std::env::var("TANSU_BIN") {
        return p.into();
    }
    let cache = std::env::var("TOOLS_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/kubesink")
        });
    cache.join("tansu/bin/tansu")
}

impl Tansu {
    /// Starts it and waits until it listens.
    pub fn start(dir: &Path) -> anyhow::Result<Tansu> {
        let port = free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let proc = spawn(
            "tansu",
            Command::new(tansu_bin())
                .current_dir(dir)
                .args(["broker", "--listener-url", &format!("tcp://{addr}")])
                .args(["--advertised-listener-url", &format!("tcp://{addr}")])
                .args(["--storage-engine", "memory://tansu/"])
                .env_remove("RUST_LOG")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        wait_listening(addr, Duration::from_secs(30), "tansu")?;
        Ok(Tansu {
            proc,
            bootstrap: addr.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_is_read_from_a_message_line() {
        let line = r#"{"op":"updated","object":{"metadata":{"annotations":{"a":"b","bench.kubesink.io/changed-at":"1764500000123456"}}}}"#;
        assert_eq!(stamp_of(line), Some(1_764_500_000_123_456));
        assert_eq!(stamp_of(r#"{"op":"added"}"#), None);
    }
}
