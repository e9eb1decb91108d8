//! Leader election between real `kubesink` processes against one simulator (which serves
//! Leases with resourceVersion conflicts): exactly one emits; a killed leader is replaced
//! within lease duration + retry period and the two never emit at the same time; a frozen
//! leader that wakes after losing its lease emits nothing more; a leader cut off from its API
//! server stops emitting before its lease expires and exits.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kubesink_sim::{Churn, SimConfig, Workload};
use support::*;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
/// Short lease timings for the tests (production defaults are 15 s / 10 s / 2 s).
const LEASE: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);

/// A kubesink process writing JSON Lines to `out`.
struct Proc {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Proc {
    fn start(config: &Path, dir: &Path, identity: &str) -> Proc {
        let out = dir.join(format!("{identity}.jsonl"));
        let err = dir.join(format!("{identity}.log"));
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(config)
            .env("KUBESINK_LEADER_ELECTION__IDENTITY", identity)
            .env("KUBESINK_SERVER__LISTEN", "127.0.0.1:0")
            .env_remove("RUST_LOG")
            .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Proc { child, out, err }
    }

    /// Bytes written to stdout so far.
    fn emitted(&self) -> u64 {
        std::fs::metadata(&self.out).map(|m| m.len()).unwrap_or(0)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running").to_string();
        assert!(std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    }

    async fn exit_code(&mut self, within: Duration) -> Option<i32> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .and_then(|s| s.ok())
            .and_then(|s| s.code())
    }
}

fn config(dir: &Path, kubeconfig: &Path) -> PathBuf {
    let file = dir.join("kubesink.toml");
    std::fs::write(
        &file,
        format!(
            r#"[cluster]
name = "le"
kubeconfig = {kubeconfig:?}
[leader_election]
enabled = true
lease_name = "kubesink-test"
lease_namespace = "default"
lease_duration = "{}ms"
renew_deadline = "{}ms"
retry_period = "{}ms"
[pipeline]
linger = "10ms"
[log]
summary_interval = "0s"
[[resources]]
api_version = "v1"
kind = "Pod"
[[sinks]]
type = "stdout"
"#,
            LEASE.as_millis(),
            RENEW_DEADLINE.as_millis(),
            RETRY.as_millis()
        ),
    )
    .unwrap();
    file
}

async fn until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Instant {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Instant::now()
}

/// Watches two outputs during a hand-over: when `old` last grew and `new` first grew.
async fn hand_over(old: &Proc, new: &Proc, timeout: Duration) -> (Instant, Instant) {
    let deadline = Instant::now() + timeout;
    let (mut old_len, mut old_last) = (old.emitted(), Instant::now());
    let new_len = new.emitted();
    loop {
        let now = Instant::now();
        assert!(
            now < deadline,
            "no hand-over within {timeout:?}\n--- new:\n{}",
            new.log()
        );
        let o = old.emitted();
        if o != old_len {
            old_len = o;
            old_last = now;
        }
        if new.emitted() != new_len {
            return (old_last, now);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_emits_and_a_killed_or_frozen_leader_is_replaced_without_overlap() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            pods: 30,
            seed: 2,
            ..Default::default()
        })
        .unwrap();
    let _churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 20.0,
        seed: 5,
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &c.kubeconfig);

    let mut a = Proc::start(&cfg, dir.path(), "a");
    until("a leads and emits", Duration::from_secs(60), || {
        a.emitted() > 0
    })
    .await;
    let b = Proc::start(&cfg, dir.path(), "b");
    // b follows: it emits nothing while a leads and keeps emitting.
    let a_before = a.emitted();
    until("b reported following", Duration::from_secs(30), || {
        b.log().contains("following")
    })
    .await;
    tokio::time::sleep(LEASE * 2).await; // the window in which a second leader would show
    assert_eq!(b.emitted(), 0, "the follower emitted:\n{}", b.log());
    assert!(a.emitted() > a_before, "the leader keeps emitting");

    // kill -9 the leader: b takes over within lease duration + retry period (+ its list).
    let killed = Instant::now();
    a.signal("-KILL");
    let (_, b_first) = hand_over(&a, &b, Duration::from_secs(60)).await;
    let handover = b_first - killed;
    eprintln!("hand-over after kill -9: {handover:?}");
    assert!(
        handover <= LEASE + RETRY + Duration::from_secs(5),
        "hand-over took {handover:?}"
    );
    assert!(b.log().contains("became the leader"));
    let _ = a.exit_code(Duration::from_secs(5)).await;

    // Freeze the leader (SIGSTOP): c takes over; the old leader, woken, emits nothing more
    // and exits because it lost the lease.
    let mut b = b;
    let cc = Proc::start(&cfg, dir.path(), "c");
    until("c reported following", Duration::from_secs(30), || {
        cc.log().contains("following")
    })
    .await;
    b.signal("-STOP");
    // A write already inside the kernel when the signal arrived still completes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let frozen_at = b.emitted();
    let (_, c_first) = hand_over(&b, &cc, Duration::from_secs(60)).await;
    assert_eq!(b.emitted(), frozen_at);
    b.signal("-CONT");
    let code = b.exit_code(Duration::from_secs(30)).await;
    assert_eq!(code, Some(3), "the woken leader exits:\n{}", b.log());
    assert_eq!(
        b.emitted(),
        frozen_at,
        "the woken leader emitted after losing its lease"
    );
    assert!(b.log().contains("lost leadership"), "{}", b.log());
    assert!(cc.emitted() > 0 && c_first.elapsed() < Duration::from_secs(120));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_before_its_lease_expires() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            pods: 10,
            seed: 3,
            ..Default::default()
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &c.kubeconfig);
    let mut a = Proc::start(&cfg, dir.path(), "solo");
    until("leads and emits", Duration::from_secs(60), || {
        a.emitted() > 0
    })
    .await;
    tokio::time::sleep(RETRY * 3).await;
    let cut = Instant::now();
    c.sim.faults().set_unreachable(true);
    let code = a.exit_code(Duration::from_secs(30)).await;
    let stopped = cut.elapsed();
    c.sim.faults().set_unreachable(false);
    assert_eq!(code, Some(3), "{}", a.log());
    // Its last renewal was at most one retry period before the cut; it stops within the
    // renew deadline of it, before the lease (LEASE after that renewal) could pass on.
    assert!(
        stopped < LEASE,
        "stopped {stopped:?} after the cut:\n{}",
        a.log()
    );
    assert!(a.log().contains("could not renew the lease"), "{}", a.log());
}
