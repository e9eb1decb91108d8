//! Leader election on real `coordination.k8s.io/v1` Leases of a real kube-apiserver: two
//! replicas under churn; the leader SIGKILLed, then the next one frozen (SIGSTOP) and woken:
//! each time the other takes over under the next leader epoch, the woken leader starts no
//! send (what it writes late was handed to the OS before the freeze) and exits 3, and the
//! stream of every leader, folded in order, equals the API server exactly (uid and
//! resourceVersion).

use kubesink_test_support::{self as support, kube_server, leases, process};

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube_server::{configmap, create, live_state, namespace, patch_configmap, ControlPlane};
use process::{leader_toml, resource_toml, Kubesink, STDOUT_SINK};
use serde_json::json;
use support::{fold_equals, leader_epochs, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "leader";

fn write_config(dir: &Path, kubeconfig: &Path) -> std::path::PathBuf {
    let configmaps = resource_toml("v1", "ConfigMap", &[NS]);
    let leader = leader_toml("kubesink-real", NS, false);
    let rest = format!("{leader}[pipeline]\nlinger = \"20ms\"\n{configmaps}{STDOUT_SINK}");
    process::write_config(dir, "real", kubeconfig, &rest)
}

/// Waits until `new` emits, then until it emits again: it took the Lease and keeps streaming.
/// What the old leader may still write is for the caller to check: a killed one writes
/// nothing, a frozen one is checked once woken.
async fn takes_over(new: &Kubesink) {
    new.wait_for_more("the new leader's first message", LONG)
        .await;
    new.wait_for_more("the new leader to keep emitting", LONG)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_or_frozen_leader_on_real_leases_is_replaced_without_overlap_and_the_fold_is_exact(
) {
    let cp: &'static ControlPlane = kube_server::shared_async().await;
    namespace(cp, NS, json!({})).await;
    let client = cp.admin().await;
    for i in 0..20 {
        create(
            &client,
            configmap(NS, &format!("cm-{i:02}"), json!({"v": "0"})),
        )
        .await;
    }
    // Churn: an edit every 50 ms, round robin, until stopped.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, client) = (stop.clone(), client.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("cm-{:02}", n % 20);
                patch_configmap(&client, NS, &name, json!({"v": n.to_string()})).await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            n
        })
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &cp.admin_kubeconfig);
    let identity = |name: &'static str| [("KUBESINK_LEADER_ELECTION__IDENTITY", name)];

    let a = Kubesink::start(BIN, &config, dir.path(), "a", &identity("a"));
    wait_until("a leads and emits", LONG, || async {
        (a.count() > 0).then_some(()).ok_or_else(|| a.stderr())
    })
    .await;
    let b = Kubesink::start(BIN, &config, dir.path(), "b", &identity("b"));
    b.wait_following("b follows", LONG).await;
    assert_eq!(b.count(), 0, "the follower emitted:\n{}", b.stderr());

    // SIGKILL the leader: b takes over. Meanwhile b's failover gauge (seconds since the
    // Lease's holder renewed) climbs past renew_deadline (2.5 s) while b still follows, and
    // falls back once b holds the Lease.
    let renewed = |metrics: &str| {
        support::metric(metrics, "kubesink_leader_lease_renewed_seconds", &[]).unwrap_or(-1.0)
    };
    let before = renewed(&leases::observe(&b).await.0);
    assert!((0.0..2.5).contains(&before), "a renews: {before}s");
    let a_pid = a.pid();
    let a_out = {
        let before = a.count();
        let out = a.kill().await;
        eprintln!("a killed (pid {a_pid}) after {before} messages");
        out
    };
    let climbed = wait_until(
        "b's gauge past renew_deadline while it follows",
        LONG,
        || async {
            let (metrics, _, _) = leases::observe(&b).await;
            let leads = support::metric(&metrics, "kubesink_leader", &[]).unwrap_or(0.0);
            let ago = renewed(&metrics);
            (ago >= 2.5 && leads == 0.0)
                .then_some(ago)
                .ok_or_else(|| format!("{ago}s, leader {leads}"))
        },
    )
    .await;
    hand_over_killed(&a_out, &b).await;
    let after = renewed(&leases::observe(&b).await.0);
    assert!((0.0..2.5).contains(&after), "b renews it now: {after}s");
    eprintln!("b's leader_lease_renewed_seconds: {before:.1}s before the kill, {climbed:.1}s while a was dead, {after:.1}s once b led");

    // Freeze b (SIGSTOP) with c following: c takes over; b, woken, starts no send and
    // exits 3.
    let c = Kubesink::start(BIN, &config, dir.path(), "c", &identity("c"));
    wait_until("c follows", LONG, || async {
        c.stderr()
            .contains("following")
            .then_some(())
            .ok_or_else(|| c.stderr())
    })
    .await;
    let frozen_time = b.freeze().await;
    takes_over(&c).await;
    // What b wrote before the freeze has been read from its pipe by now (c's take-over
    // took a lease duration at least).
    let frozen_at = b.count();
    let mut b = b;
    let code = b.signal_and_wait("CONT", LONG).await;
    assert_eq!(
        code,
        Some(Some(3)),
        "the woken leader exits 3:\n{}",
        b.stderr()
    );
    // Woken, b starts no send: its fence closed on the monotonic clock while it was frozen.
    // Only a write it had handed to the OS before the freeze may complete now (the stdout
    // sink writes on a blocking thread; docs/robustness.md): at most one batch, under the
    // deposed epoch, of changes observed before the freeze. A send begun after the wake
    // would carry changes b read from its watch once woken (the churn went on).
    let b_out = b.output().await;
    let late = &b_out[frozen_at..];
    eprintln!("the woken leader wrote {} messages late", late.len());
    assert!(
        late.len() <= 500,
        "no more than one batch (max_batch_events, 500 by default) is written after the wake: {}",
        late.len()
    );
    let successor = *leader_epochs(&c.messages()).last().expect("c emitted");
    assert!(
        leader_epochs(late).iter().all(|e| *e < successor),
        "the late messages carry the deposed epoch, below c's {successor}: {:?}",
        leader_epochs(late)
    );
    let sent_after = process::observed_after(&b_out, frozen_time);
    assert!(
        sent_after.is_empty(),
        "the woken leader sent changes it observed after its freeze at {frozen_time}: {sent_after:#?}"
    );

    stop.store(true, Ordering::Relaxed);
    let edits = churn.await.expect("churn");
    eprintln!("{edits} edits under churn");
    // Every leader's stream in order, folded: equals the API server.
    wait_until(
        "the fold of a, b and c to equal the API server",
        LONG,
        || async {
            let live = live_state(&client, &[("v1", "ConfigMap")], |o| {
                o.metadata.namespace.as_deref() == Some(NS)
            })
            .await;
            let (b, c) = (b.messages(), c.messages());
            let all = a_out.iter().chain(&b).chain(&c);
            fold_equals(&live, all, Expect::STRICT.restarts(), |_| true).map(|_| ())
        },
    )
    .await;
    c.terminate().await;
}

/// The hand-over after a SIGKILL: the new leader emits, says it became the leader, and its
/// messages carry the epoch after the dead leader's (`old`, its final output): taking the
/// Lease adds one to its transitions, which is how a consumer tells late publishes of the
/// deposed leader from the successor's.
async fn hand_over_killed(old: &[serde_json::Value], new: &Kubesink) {
    takes_over(new).await;
    assert!(
        new.stderr().contains("became the leader"),
        "{}",
        new.stderr()
    );
    let old_epochs = leader_epochs(old);
    assert_eq!(
        old_epochs.len(),
        1,
        "the old leader led once: {old_epochs:?}"
    );
    let old_epoch = *old_epochs.first().expect("the old leader emitted");
    assert_eq!(
        leader_epochs(&new.messages()),
        [old_epoch + 1].into(),
        "the new leader's messages carry the epoch after the old one's"
    );
}
