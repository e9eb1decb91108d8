//! Leader election on real `coordination.k8s.io/v1` Leases of a real kube-apiserver: two
//! replicas under churn; the leader SIGKILLed, then the next one frozen (SIGSTOP) and woken:
//! each time the other takes over, the two never emit at the same time, the woken leader
//! emits nothing more and exits 3, and the stream of every leader, folded in order, equals
//! the API server exactly (uid and resourceVersion).

use kubesink_test_support::{self as support, kube_server, process};

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube_server::{configmap, create, live_state, namespace, patch_configmap, ControlPlane};
use process::{leader_toml, resource_toml, Kubesink, STDOUT_SINK};
use serde_json::json;
use support::{fold_equals, wait_until, Expect};

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(240);
const NS: &str = "leader";

fn write_config(dir: &Path, kubeconfig: &Path) -> std::path::PathBuf {
    let configmaps = resource_toml("v1", "ConfigMap", &[NS]);
    let leader = leader_toml("kubesink-real", NS, false);
    let rest = format!("{leader}[pipeline]\nlinger = \"20ms\"\n{configmaps}{STDOUT_SINK}");
    process::write_config(dir, "real", kubeconfig, &rest)
}

/// Waits until `new` emits, then until it emits again, and checks that `old` emitted
/// nothing meanwhile (the two would overlap).
async fn hand_over(old: &Kubesink, new: &Kubesink) {
    let n = new.count();
    wait_until("the new leader's first message", LONG, || async {
        (new.count() > n).then_some(()).ok_or_else(|| new.stderr())
    })
    .await;
    let old_count = old.count();
    let grown = new.count();
    wait_until("the new leader to keep emitting", LONG, || async {
        (new.count() > grown)
            .then_some(())
            .ok_or_else(|| new.stderr())
    })
    .await;
    assert_eq!(
        old.count(),
        old_count,
        "the old leader emitted after the new one began"
    );
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
    wait_until("b follows", LONG, || async {
        b.stderr()
            .contains("following")
            .then_some(())
            .ok_or_else(|| b.stderr())
    })
    .await;
    assert_eq!(b.count(), 0, "the follower emitted:\n{}", b.stderr());

    // SIGKILL the leader: b takes over.
    let a_pid = a.pid();
    let a_out = {
        let before = a.count();
        let out = a.kill().await;
        eprintln!("a killed (pid {a_pid}) after {before} messages");
        out
    };
    hand_over_killed(&a_out, &b).await;

    // Freeze b (SIGSTOP) with c following: c takes over; b, woken, emits nothing more and
    // exits 3.
    let c = Kubesink::start(BIN, &config, dir.path(), "c", &identity("c"));
    wait_until("c follows", LONG, || async {
        c.stderr()
            .contains("following")
            .then_some(())
            .ok_or_else(|| c.stderr())
    })
    .await;
    b.signal("STOP");
    let frozen_at = b.count();
    hand_over(&b, &c).await;
    let mut b = b;
    let code = b.signal_and_wait("CONT", LONG).await;
    assert_eq!(
        code,
        Some(Some(3)),
        "the woken leader exits 3:\n{}",
        b.stderr()
    );
    assert_eq!(
        b.count(),
        frozen_at,
        "the woken leader emitted after losing its lease"
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

/// The hand-over after a SIGKILL: the dead leader's output is final; the new one emits.
async fn hand_over_killed(_old: &[serde_json::Value], new: &Kubesink) {
    let n = new.count();
    wait_until(
        "the new leader's first message after the kill",
        LONG,
        || async { (new.count() > n).then_some(()).ok_or_else(|| new.stderr()) },
    )
    .await;
    assert!(
        new.stderr().contains("became the leader"),
        "{}",
        new.stderr()
    );
}
