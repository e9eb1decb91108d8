//! Leader election between real `kubesink` processes against one simulator (which serves
//! Leases with resourceVersion conflicts): exactly one emits; a killed leader is replaced by
//! one that emits under the next leader epoch; a frozen leader that wakes after losing its
//! lease starts no send (what it writes late was handed to the OS before the freeze); a leader
//! cut off from its API server stops emitting before its lease expires (by its own clock: its
//! log against the renewTime it wrote) and exits.
//!
//! Nothing here bounds the test's own wall clock: on a loaded machine the test may observe
//! late, so it asserts order and outcome, and times only from kubesink's own timestamps.

use kubesink_test_support::{self as support, process};

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kubesink_sim::{Churn, SimConfig, Workload};
use process::{resource_toml, STDOUT_SINK};
use support::*;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
/// Short lease timings for the tests (production defaults are 15 s / 10 s / 2 s).
const LEASE: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_millis(2500);
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
        let stdout = Stdio::from(std::fs::File::create(&out).unwrap());
        Self::spawn(config, dir, identity, out, stdout, &[])
    }

    /// Like [`Proc::start`], with stdout a pipe nobody reads: once its buffer (64 KiB) is
    /// full, the stdout sink's writes block and nothing more is delivered. The reading end
    /// stays open in the child handle. A shutdown waits up to 300 s for delivery.
    fn start_unread(config: &Path, dir: &Path, identity: &str) -> Proc {
        let out = dir.join(format!("{identity}.unread"));
        let env = [("KUBESINK_PIPELINE__SHUTDOWN_TIMEOUT", "300s")];
        Self::spawn(config, dir, identity, out, Stdio::piped(), &env)
    }

    fn spawn(
        config: &Path,
        dir: &Path,
        identity: &str,
        out: PathBuf,
        stdout: Stdio,
        env: &[(&str, &str)],
    ) -> Proc {
        let err = dir.join(format!("{identity}.log"));
        // `OTHER_KUBESINK_BIN`: another build of the binary (to run a test against an older
        // commit's behaviour).
        let bin = std::env::var("OTHER_KUBESINK_BIN").unwrap_or_else(|_| BIN.to_owned());
        let mut cmd = Command::new(bin);
        cmd.args(["run", "--config"]).arg(config);
        // `default-…`: the identity left to kubesink, POD_NAME unset (outside Kubernetes).
        if identity.starts_with("default-") {
            cmd.env_remove("KUBESINK_LEADER_ELECTION__IDENTITY")
                .env_remove("POD_NAME");
        } else {
            cmd.env("KUBESINK_LEADER_ELECTION__IDENTITY", identity);
        }
        let child = cmd
            .env("KUBESINK_SERVER__LISTEN", "127.0.0.1:0")
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .stdout(stdout)
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

/// Cluster `le` through `kubeconfig`, and the `[leader_election]` of these tests.
fn leader_toml(kubeconfig: &Path) -> String {
    format!(
        "[cluster]\nname = \"le\"\nkubeconfig = {kubeconfig:?}\n[leader_election]\nenabled = true\nlease_name = \"kubesink-test\"\nlease_namespace = \"default\"\nlease_duration = \"{}ms\"\nrenew_deadline = \"{}ms\"\nretry_period = \"{}ms\"\n",
        LEASE.as_millis(),
        RENEW_DEADLINE.as_millis(),
        RETRY.as_millis()
    )
}

fn config(dir: &Path, kubeconfig: &Path) -> PathBuf {
    let file = dir.join("kubesink.toml");
    let (leader, pods) = (leader_toml(kubeconfig), resource_toml("v1", "Pod", &[]));
    let text = format!(
        "{leader}[pipeline]\nlinger = \"10ms\"\n[log]\nsummary_interval = \"0s\"\n{pods}{STDOUT_SINK}"
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// A simulator with `pods` pods in `namespaces` namespaces (workload `seed`).
async fn populated(namespaces: usize, pods: usize, seed: u64) -> Cluster {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces,
            pods,
            seed,
            ..Default::default()
        })
        .unwrap();
    c
}

/// How long the waits here give an outcome: generous, the machine may be loaded.
const LONG: Duration = Duration::from_secs(60);

/// Waits for a hand-over: until `new` emits, then emits again (it took the Lease and keeps
/// streaming). Returns how long it took, for the log only. What the old leader may still
/// write is for the caller to check: a killed one writes nothing, a frozen one is checked
/// once woken.
async fn takes_over(new: &Proc) -> Duration {
    let started = Instant::now();
    let new_len = new.emitted();
    wait_for_seen("the new leader's first message", LONG, || {
        (new.emitted() != new_len, format!("--- new:\n{}", new.log()))
    })
    .await;
    let grown = new.emitted();
    wait_for("the new leader to keep emitting", LONG, || {
        new.emitted() > grown
    })
    .await;
    started.elapsed()
}

/// The whole lines of `p`'s stdout, parsed (a last line cut by a SIGKILL is left out).
fn lines(p: &Proc) -> Vec<serde_json::Value> {
    std::fs::read_to_string(&p.out)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The distinct `leaderEpoch`s of `p`'s messages; panics on a message without one.
fn epochs(p: &Proc) -> std::collections::BTreeSet<u64> {
    leader_epochs(&lines(p))
}

/// Whether process `pid` is stopped (SIGSTOP delivered: no write of it is in progress).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
        .unwrap_or(false)
}

/// The Lease's `spec.renewTime`, as its holder wrote it.
fn renew_time(sim: &kubesink_sim::Simulator) -> jiff::Timestamp {
    let leases = sim.objects("coordination.k8s.io/v1", "Lease");
    let lease = leases
        .iter()
        .find(|l| l["metadata"]["name"] == "kubesink-test")
        .expect("the lease exists");
    lease["spec"]["renewTime"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("renewTime of {lease:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_emits_and_a_killed_or_frozen_leader_is_replaced_without_overlap() {
    let c = populated(2, 30, 2).await;
    let _churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 20.0,
        seed: 5,
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &c.kubeconfig);

    let mut a = Proc::start(&cfg, dir.path(), "a");
    wait_for("a leads and emits", LONG, || a.emitted() > 0).await;
    let b = Proc::start(&cfg, dir.path(), "b");
    // b follows: it emits nothing while a leads and keeps emitting.
    wait_for("b reported following", LONG, || {
        b.log().contains("following")
    })
    .await;
    // The window in which a second leader would show: two lease durations (b retries every
    // retry period), and a positive event after it: a is still leading and emitting.
    let a_before = a.emitted();
    tokio::time::sleep(LEASE * 2).await;
    wait_for("the leader keeps emitting", LONG, || a.emitted() > a_before).await;
    assert_eq!(b.emitted(), 0, "the follower emitted:\n{}", b.log());
    assert!(!b.log().contains("became the leader"), "{}", b.log());

    // kill -9 the leader: b takes over (once the lease expired).
    a.signal("-KILL");
    let _ = a.exit_code(LONG).await;
    let ended = a.child.try_wait().expect("wait").map(|s| s.signal());
    assert_eq!(ended, Some(Some(9)), "a died of the SIGKILL:\n{}", a.log());
    let took = takes_over(&b).await;
    eprintln!("hand-over after kill -9: {took:?} (lease {LEASE:?}, retry {RETRY:?})");
    assert!(b.log().contains("became the leader"), "{}", b.log());
    // Taking the Lease from a adds one to its transitions: every message of b carries the
    // epoch after a's, so a consumer can tell a's late publishes from b's.
    let a_epochs = epochs(&a);
    assert_eq!(a_epochs.len(), 1, "a led once: {a_epochs:?}");
    let a_epoch = *a_epochs.first().expect("a emitted");
    assert_eq!(
        epochs(&b),
        [a_epoch + 1].into(),
        "b's messages carry the epoch after a's"
    );

    // Freeze the leader (SIGSTOP): c takes over; the old leader, woken, starts no send and
    // exits because it lost the lease.
    let mut b = b;
    let cc = Proc::start(&cfg, dir.path(), "c");
    wait_for("c reported following", LONG, || {
        cc.log().contains("following")
    })
    .await;
    b.signal("-STOP");
    // Once stopped, no write of it is in progress: its output is final until SIGCONT.
    let pid = b.child.id().expect("running");
    wait_for("b stopped", LONG, || is_stopped(pid)).await;
    let frozen_at = b.emitted();
    // Everything b observed, it observed before this instant (`observedAt` is truncated to
    // the millisecond, so it is never later than the instant it stands for).
    let frozen_time = jiff::Timestamp::now();
    let took = takes_over(&cc).await;
    eprintln!("hand-over from a frozen leader: {took:?}");
    b.signal("-CONT");
    let code = b.exit_code(LONG).await;
    assert_eq!(code, Some(3), "the woken leader exits:\n{}", b.log());
    assert!(b.log().contains("lost leadership"), "{}", b.log());
    assert!(cc.emitted() > 0);
    // The woken leader starts no send: its fence closed on the monotonic clock while it was
    // frozen. A write it had already handed to the OS before the freeze (tokio's stdout
    // writes on a blocking thread; a process can freeze between that hand-off and the
    // write) completes when it wakes: no fence can take back bytes handed over, which is
    // what `leaderEpoch` is for. Every such late line carries the deposed leader's epoch,
    // below its successor's, so `kubesink fold` and the reference consumers skip it.
    let successor = *epochs(&cc).last().expect("c's messages carry leaderEpoch");
    let text = std::fs::read(&b.out).unwrap();
    let late = &text[usize::try_from(frozen_at).unwrap()..];
    let late_lines: Vec<serde_json::Value> = String::from_utf8_lossy(late)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    eprintln!(
        "the woken leader wrote {} bytes ({} whole messages) handed over before its freeze",
        late.len(),
        late_lines.len()
    );
    for m in &late_lines {
        assert!(
            m["leaderEpoch"].as_u64().is_some_and(|e| e < successor),
            "a late message of the deposed leader carries an epoch below its successor's {successor}: {m}"
        );
    }
    assert!(
        late_lines.len() <= 500,
        "no more than the one batch the stdout sink had handed over (max_batch_events, 500 by default) is written after the wake: {}",
        late_lines.len()
    );
    // Handed over before the freeze, a late line carries a change b observed before it. A
    // send begun after the wake would carry changes b read from its watch once woken (the
    // churn went on during the freeze), observed after it.
    for m in lines(&b) {
        let observed: jiff::Timestamp = m["observedAt"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("observedAt of {m}"));
        assert!(
            observed <= frozen_time,
            "the woken leader sent a change it observed at {observed}, after its freeze at {frozen_time}: {m}"
        );
    }
}

/// Two replicas on one host (or wherever `POD_NAME` is unset) with default identities: the
/// identity must not be the host name alone, or both would hold the Lease and both emit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_host_with_default_identities_elect_one_leader() {
    let c = populated(1, 20, 4).await;
    let _churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 10.0,
        seed: 6,
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &c.kubeconfig);
    let a = Proc::start(&cfg, dir.path(), "default-a");
    wait_for("a leads and emits", LONG, || a.emitted() > 0).await;
    let b = Proc::start(&cfg, dir.path(), "default-b");
    wait_for_seen("b reported following", LONG, || {
        (b.log().contains("following"), b.log())
    })
    .await;
    let a_before = a.emitted();
    tokio::time::sleep(LEASE * 2).await;
    wait_for("the leader keeps emitting", LONG, || a.emitted() > a_before).await;
    assert_eq!(b.emitted(), 0, "the second replica emitted:\n{}", b.log());
    assert!(!b.log().contains("became the leader"), "{}", b.log());
    // The identities: the host name, then a suffix of each process's own.
    let holder = |log: &str| {
        let line = log.lines().find(|l| l.contains("became the leader"))?;
        let at = line.find("identity=")? + "identity=".len();
        Some(
            line[at..]
                .split_whitespace()
                .next()?
                .trim_matches('"')
                .to_owned(),
        )
    };
    let leader = holder(&a.log()).unwrap_or_else(|| panic!("{}", a.log()));
    let (host, suffix) = leader.rsplit_once('_').unwrap_or_default();
    assert!(!host.is_empty() && suffix.len() == 32, "{leader}");
    assert!(
        b.log().contains(&leader),
        "b follows {leader}:\n{}",
        b.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_before_its_lease_expires() {
    let c = populated(1, 10, 3).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &c.kubeconfig);
    let mut a = Proc::start(&cfg, dir.path(), "solo");
    wait_for("leads and emits", LONG, || a.emitted() > 0).await;
    // A renewal after the first one: a holds the lease in its steady state.
    let first = renew_time(&c.sim);
    wait_for("a renewal", LONG, || renew_time(&c.sim) > first).await;
    c.sim.faults().set_unreachable(true);
    let code = a.exit_code(LONG).await;
    c.sim.faults().set_unreachable(false);
    let log = a.log();
    assert_eq!(code, Some(3), "{log}");
    // By kubesink's own clock: it stopped (and closed its fence) before the lease it last
    // renewed could pass on, i.e. within `lease_duration` of that renewTime. Measured from
    // the renewTime it wrote and the time it logged, not the test's observation.
    let renewed = renew_time(&c.sim);
    let stopped = logged_at(&log, "could not renew the lease");
    let margin = stopped.duration_since(renewed);
    eprintln!("stopped {margin:?} after its last renewal (lease {LEASE:?})");
    assert!(
        margin < jiff::SignedDuration::try_from(LEASE).unwrap(),
        "stopped {margin:?} after its last renewal, lease {LEASE:?}:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_while_draining_exits_at_once_not_at_the_deadline() {
    // A leader shutting down keeps renewing while it drains; when it cannot,
    // its fence closes and nothing more can be sent or saved, so it exits (3) then, rather
    // than waiting out `pipeline.shutdown_timeout` (300 s here) with its delivery blocked.
    let c = populated(2, 600, 5).await; // full payloads: far more than a pipe's 64 KiB
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &c.kubeconfig);
    let mut a = Proc::start_unread(&cfg, dir.path(), "drains");
    wait_for_seen("leads and lists", LONG, || {
        let log = a.log();
        (log.contains("initial sync complete"), log)
    })
    .await;
    let first = renew_time(&c.sim);
    wait_for("a renewal", LONG, || renew_time(&c.sim) > first).await;
    a.signal("-TERM");
    wait_for_seen("the shutdown to begin", LONG, || {
        let log = a.log();
        (log.contains("shutting down"), log)
    })
    .await;
    c.sim.faults().set_unreachable(true);
    let code = a.exit_code(LONG).await;
    c.sim.faults().set_unreachable(false);
    let log = a.log();
    assert_eq!(
        code,
        Some(3),
        "exits as lost leadership while draining (not after the 300 s deadline, 1):\n{log}"
    );
    assert!(log.contains("lost leadership while shutting down"), "{log}");
}

/// A leader election config like [`config`]'s, delivering ConfigMaps to JetStream on `nats`
/// (stream `KUBESINK`, every message kept) with a PubAck wait long enough to outlast a paused
/// server.
#[cfg(feature = "nats")]
fn jetstream_config(dir: &Path, kubeconfig: &Path, nats: &str) -> PathBuf {
    let file = dir.join("kubesink-js.toml");
    let (leader, configmaps) = (
        leader_toml(kubeconfig),
        resource_toml("v1", "ConfigMap", &[]),
    );
    std::fs::write(
        &file,
        format!(
            r#"{leader}[pipeline]
linger = "3s"
max_pending_bytes = "256MiB"
max_batch_bytes = "64MiB"
max_batch_events = 1000
[log]
summary_interval = "0s"
{configmaps}[[sinks]]
type = "nats"
servers = [{nats:?}]
mode = "jetstream"
publish_timeout = "120s"
max_in_flight = 2000
client_capacity = 4000
[sinks.stream]
name = "KUBESINK"
create = true
"#
        ),
    )
    .unwrap();
    file
}

/// ConfigMaps `cm-0`… of ~100 KB each, updated in rounds: each round sets `data.round`.
#[cfg(feature = "nats")]
fn configmaps(sim: &kubesink_sim::Simulator, n: usize, round: usize) {
    let filler = "x".repeat(100 * 1024);
    for i in 0..n {
        let cm = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("cm-{i}"), "namespace": "default"},
            "data": {"round": round.to_string(), "filler": filler},
        });
        if round == 0 {
            sim.create(cm).expect("create");
        } else {
            let mut current = sim
                .objects("v1", "ConfigMap")
                .into_iter()
                .find(|o| o["metadata"]["name"] == format!("cm-{i}"))
                .expect("exists");
            current["data"]["round"] = round.to_string().into();
            sim.replace(current).expect("update");
        }
    }
}

/// Every message of stream `KUBESINK`, in stream order, as JSON.
#[cfg(feature = "nats")]
async fn stream_payloads(url: &str) -> Vec<serde_json::Value> {
    use futures::StreamExt;
    let js = async_nats::jetstream::new(async_nats::connect(url).await.expect("connect"));
    let mut stream = js.get_stream("KUBESINK").await.expect("stream");
    let total = stream.info().await.expect("info").state.messages as usize;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .expect("consumer");
    let mut msgs = consumer.messages().await.expect("messages");
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let m = tokio::time::timeout(Duration::from_secs(30), msgs.next())
            .await
            .expect("the stream delivers")
            .expect("not ended")
            .expect("message");
        out.push(serde_json::from_slice(&m.payload).expect("JSON"));
    }
    out
}

/// A leader frozen (SIGSTOP) with JetStream publishes queued in its NATS
/// client (the server stalled meanwhile, so they stay in the client) is replaced; its
/// successor lists and sends newer changes; the old leader, woken, cannot stop the client
/// from writing what it queued: those publishes land after the successor's, with older
/// resourceVersions, and JetStream stores them (their ids differ). Every message carries the
/// leader's epoch (`leaderEpoch`, the Lease's `leaseTransitions`), and `kubesink fold` skips
/// one whose epoch is below one already seen for its key: folded, no key's resourceVersion
/// ever goes backwards. The test first checks that late publishes did land (the window was
/// hit: it cannot pass vacuously).
#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leaders_late_jetstream_publishes_never_move_a_folded_key_backwards() {
    // Whether the frozen leader's queued publishes land late depends on how much its client
    // had queued when it froze, which a loaded machine moves: the scenario runs again (up to
    // three times) until one attempt shows late publishes. Every attempt checks the fold.
    for attempt in 1..=3 {
        let late = frozen_leader_attempt().await;
        eprintln!("attempt {attempt}: {late} late publish(es) landed");
        if late > 0 {
            return;
        }
    }
    panic!(
        "no late publish of the frozen leader landed in 3 attempts: the test never hit its window"
    );
}

/// One run of the frozen-leader scenario: returns how many of the frozen leader's publishes
/// landed after a newer message of their key; panics if the fold moved a key backwards.
#[cfg(feature = "nats")]
async fn frozen_leader_attempt() -> usize {
    const N: usize = 200;
    let server = support::nats_server::NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    configmaps(&c.sim, N, 0);
    let dir = tempfile::tempdir().unwrap();
    let cfg = jetstream_config(dir.path(), &c.kubeconfig, &server.url());
    let mut a = Proc::start(&cfg, dir.path(), "a");
    wait_for_seen("a leads", LONG, || {
        let log = a.log();
        (log.contains("became the leader"), log)
    })
    .await;
    let b = Proc::start(&cfg, dir.path(), "b");
    wait_for("b follows", LONG, || b.log().contains("following")).await;
    // a's initial list is in the stream.
    let deadline = Instant::now() + LONG;
    while stream_payloads(&server.url()).await.len() < N {
        assert!(
            Instant::now() < deadline,
            "a's list never reached the stream"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The server stalls; round 1 (20 MB) goes to a, which hands it to its client: what the
    // sockets cannot take stays queued in the client. Then a freezes.
    server.pause();
    configmaps(&c.sim, N, 1);
    // A linger of 3 s gathers the round into one batch, all of it handed to the client.
    tokio::time::sleep(Duration::from_secs(6)).await;
    a.signal("-STOP");
    let pid = a.child.id().expect("running");
    wait_for("a stopped", LONG, || is_stopped(pid)).await;
    server.resume();

    // b takes over, lists, and sends round 2.
    wait_for("b leads", LONG, || b.log().contains("became the leader")).await;
    configmaps(&c.sim, N, 2);
    let deadline = Instant::now() + LONG;
    loop {
        let msgs = stream_payloads(&server.url()).await;
        let latest = c.sim.objects("v1", "ConfigMap");
        let want: std::collections::HashSet<String> = latest
            .iter()
            .map(|o| {
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        let have = msgs
            .iter()
            .filter(|m| want.contains(m["resourceVersion"].as_str().unwrap_or_default()))
            .count();
        if have >= N {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b's round 2 never reached the stream ({have})\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // a wakes: its client writes what it queued; a, deposed, exits.
    a.signal("-CONT");
    let code = a.exit_code(LONG).await;
    eprintln!("a exited with {code:?}");
    let mut last = 0;
    let mut msgs = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        msgs = stream_payloads(&server.url()).await;
        if msgs.len() == last {
            break;
        }
        last = msgs.len();
    }

    // The window was hit: some key's resourceVersion goes backwards in stream order.
    let rv = |m: &serde_json::Value| {
        m["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut newest: std::collections::HashMap<String, u64> = Default::default();
    let mut late = 0;
    for m in msgs.iter().filter(|m| m["op"] != "synced") {
        let k = m["key"].as_str().unwrap_or_default().to_owned();
        let seen = newest.entry(k).or_default();
        if rv(m) < *seen {
            late += 1;
        }
        *seen = (*seen).max(rv(m));
    }
    eprintln!(
        "{} messages in the stream, {late} landed after a newer one of their key",
        msgs.len()
    );
    if late == 0 {
        eprintln!(
            "no late publish landed in this attempt; a's log:\n{}",
            a.log()
        );
    }

    // Folded as `kubesink fold` does: no key ever moves backwards.
    let mut view = kubesink::fold::view::View::new(false);
    let mut folded: std::collections::HashMap<String, u64> = Default::default();
    let mut backwards = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let rec = kubesink_core::readback::BrokerRecord {
            value: Some(m.to_string().into_bytes()),
            key: None,
            partition: None,
            at: format!("stream sequence {}", i + 1),
        };
        view.apply(rec).expect("folds");
        let k = m["key"].as_str().unwrap_or_default();
        if let Some(e) = view.get(k) {
            let now = e.resource_version.parse::<u64>().unwrap_or(0);
            let before = folded.insert(k.to_owned(), now).unwrap_or(0);
            if now < before {
                backwards.push(format!("{k}: {before} -> {now} at {}", i + 1));
            }
        }
    }
    eprintln!(
        "fold skipped {} stale-epoch messages",
        view.stats.stale_epochs
    );
    assert!(
        backwards.is_empty(),
        "folded resourceVersions went backwards: {backwards:?}"
    );
    late
}
