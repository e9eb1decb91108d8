//! Robustness against an API server that misbehaves in its watch streams, objects and lists,
//! end to end over real HTTP against the simulator's fault switches (`docs/robustness.md`,
//! section "API server"): every case ends with the change delivered (or the one bad object
//! skipped), a counter moved, one clear log line, and the other resources flowing.

use kubesink_test_support::{self as support, logs, run};

use std::time::{Duration, Instant};

use kubesink::config::{HumanDuration, PayloadMode, ResourceConfig};
use kubesink_sim::{DamageKind, RawResourceVersion, SimConfig, Workload};
use run::{configmap, node, Run, CONFIGMAPS, LONG};
use serde_json::{json, Value};
use support::*;

fn configmaps_and_nodes() -> Vec<ResourceConfig> {
    vec![
        ResourceConfig::new("v1", "ConfigMap"),
        ResourceConfig::new("v1", "Node"),
    ]
}

async fn populated(configmaps: usize, nodes: usize, sim: SimConfig) -> Cluster {
    let c = cluster(sim).await;
    c.sim
        .populate(&Workload {
            namespaces: 2,
            configmaps,
            nodes,
            seed: 5,
            ..Default::default()
        })
        .unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_ends_at_once_is_backed_off_counted_and_logged() {
    let c = populated(3, 2, SimConfig::default()).await;
    let run = Run::start(&c, "early-end", configmaps_and_nodes(), |_| {}).await;
    wait_for("initial sync", LONG, || run.synced() && run.sink.len() == 5).await;
    let watches_before = run.count("ConfigMap", |s| &s.watch_requests);

    // Every configmap watch now answers 200 with an empty body; end the one open now.
    c.sim.faults().empty_watches(Some(CONFIGMAPS), true);
    c.sim.faults().close_all_watches();
    wait_for("the first early end", LONG, || {
        run.count("ConfigMap", |s| &s.early_ends) >= 1
    })
    .await;
    c.sim.reset_request_counts();
    // The measurement window the issue asks for: requests in 5 seconds.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let in_5s = c.sim.request_counts().path(CONFIGMAPS).watches;
    eprintln!("watch requests in 5 s against empty watches: {in_5s}");
    assert!(
        in_5s < 5,
        "{in_5s} watch requests in 5 s: the empty watch is re-opened in a loop"
    );
    // And it keeps trying (a positive event after the window, however slow the machine).
    wait_for("the informer re-watches", LONG, || {
        c.sim.request_counts().path(CONFIGMAPS).watches >= 1
    })
    .await;
    let early = run.count("ConfigMap", |s| &s.early_ends);
    assert!(early >= 2, "early ends counted: {early}");
    // The server still holds the resourceVersion (asked with a list at exactly it): an early
    // end, not an expired one; no relist.
    assert_eq!(run.count("ConfigMap", |s| &s.early_ends_gone), 0);
    assert_eq!(run.count("ConfigMap", |s| &s.lists), 1);
    let warned: Vec<String> = run
        .log("watch ended early without any event")
        .into_iter()
        .filter(|l| l.contains("resource=v1 ConfigMap"))
        .collect();
    assert_eq!(
        warned.len(),
        1,
        "the early end is logged once with its rate, not per watch: {warned:#?}"
    );
    assert!(warned[0].contains("WARN"), "{}", warned[0]);

    // The other kind flows meanwhile; the configmaps again once the server behaves.
    c.sim.create(node("node-during")).unwrap();
    wait_for("node added meanwhile", LONG, || {
        run.has("Node", "node-during", "added")
    })
    .await;
    c.sim.faults().empty_watches(None, false);
    c.sim.create(configmap("default", "cm-after")).unwrap();
    wait_for("configmap added after", LONG, || {
        run.has("ConfigMap", "cm-after", "added")
    })
    .await;
    assert!(run.count("ConfigMap", |s| &s.watch_requests) > watches_before);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_watch_event_is_replayed_and_logged_with_its_start_and_position() {
    let c = populated(2, 1, SimConfig::default()).await;
    let run = Run::start(&c, "damaged", configmaps_and_nodes(), |_| {}).await;
    wait_for("initial sync", LONG, || run.synced() && run.sink.len() == 3).await;

    let kinds = [
        (DamageKind::Truncated, "truncated", "ADDED"),
        (DamageKind::NotJson, "not-json", "this is not json"),
        (DamageKind::NonUtf8, "non-utf8", "not utf-8"),
        (DamageKind::NotAnEvent, "not-an-event", "hello"),
    ];
    for (i, (kind, name, quoted)) in kinds.into_iter().enumerate() {
        let cm = format!("cm-{name}");
        c.sim
            .faults()
            .damage_next_watch_events(1, kind, Some(CONFIGMAPS));
        c.sim.create(configmap("default", &cm)).unwrap();
        wait_for(
            &format!("{cm} delivered despite its damaged event"),
            LONG,
            || run.has("ConfigMap", &cm, "added"),
        )
        .await;
        assert_eq!(c.sim.faults().damaged_watch_events(), i as u64 + 1);
        assert_eq!(
            run.count("ConfigMap", |s| &s.decode_errors),
            i as u64 + 1,
            "{name}"
        );
        let lines = run.log("watch event does not decode");
        assert_eq!(lines.len(), i + 1, "one line per damaged event: {lines:#?}");
        let line = &lines[i];
        assert!(
            line.contains("WARN") && line.contains("resource=v1 ConfigMap"),
            "{line}"
        );
        assert!(
            line.contains(quoted),
            "{name}: the line quotes the start: {line}"
        );
        assert!(
            line.contains("line=") && line.contains("after_resource_version="),
            "{name}: the line gives the position: {line}"
        );
    }
    // Replayed by re-watching from the last good resourceVersion: no relist was needed.
    assert_eq!(run.count("ConfigMap", |s| &s.lists), 1);
    // Valid JSON that is not an event is not an API error with an empty Status.
    assert!(
        run.log("watch failed").is_empty(),
        "{:#?}",
        run.log("watch failed")
    );

    // Three times in a row at the same place: relist instead.
    c.sim
        .faults()
        .damage_next_watch_events(3, DamageKind::Truncated, Some(CONFIGMAPS));
    c.sim.create(configmap("default", "cm-thrice")).unwrap();
    wait_for("cm-thrice delivered by a relist", LONG, || {
        run.has("ConfigMap", "cm-thrice", "added")
    })
    .await;
    assert_eq!(run.count("ConfigMap", |s| &s.lists), 2);
    assert_eq!(
        run.log("times after this resourceVersion); relisting")
            .len(),
        1
    );

    c.sim.create(node("node-after")).unwrap();
    wait_for("node flows", LONG, || {
        run.has("Node", "node-after", "added")
    })
    .await;
    run.idle().await;
    let want = sim_state(&c.sim, &[("v1", "ConfigMap"), ("v1", "Node")]);
    assert_eq!(fold(&run.sink.messages()), want);
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_without_a_name_are_skipped_by_name_and_an_opaque_resource_version_flows() {
    // No bookmarks: the last event's resourceVersion stays the resume point.
    let c = populated(
        2,
        1,
        SimConfig {
            bookmark_interval: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await;
    let faults = c.sim.faults();
    let raw = |obj: Value, rv| c.sim.insert_raw("v1", "ConfigMap", obj, rv).unwrap();
    raw(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"namespace": "default", "uid": "uid-nameless-listed"}}),
        RawResourceVersion::Assigned,
    );
    raw(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "opaque", "namespace": "default", "resourceVersion": "abc-17"}}),
        RawResourceVersion::AsGiven,
    );
    // One watch only, so the 410 below meets it.
    let run = Run::start(
        &c,
        "conventions",
        vec![ResourceConfig::new("v1", "ConfigMap")],
        |_| {},
    )
    .await;
    wait_for("initial sync", LONG, || {
        run.synced() && run.has("ConfigMap", "opaque", "added")
    })
    .await;
    let opaque = run.messages_of("ConfigMap", "opaque");
    assert_eq!(opaque[0]["resourceVersion"], "abc-17");

    // A nameless object as a watch event.
    raw(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"namespace": "ns-1", "uid": "uid-nameless-watched"}}),
        RawResourceVersion::Assigned,
    );
    wait_for("both nameless objects skipped", LONG, || {
        run.count("ConfigMap", |s| &s.skipped) == 2
    })
    .await;
    for (ns, uid) in [
        ("default", "uid-nameless-listed"),
        ("ns-1", "uid-nameless-watched"),
    ] {
        let lines = run.log(uid);
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(
            lines[0].contains("without metadata.name") && lines[0].contains(ns),
            "{}",
            lines[0]
        );
    }

    // A watch event with an opaque resourceVersion becomes the resume point; the server
    // refuses to watch from it (400): the informer relists instead of asking forever.
    raw(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "opaque-2", "namespace": "default", "resourceVersion": "xyz"}}),
        RawResourceVersion::AsGiven,
    );
    wait_for("opaque-2 added", LONG, || {
        run.has("ConfigMap", "opaque-2", "added")
    })
    .await;
    faults.close_all_watches();
    wait_for("relisted after the 400", LONG, || {
        run.count("ConfigMap", |s| &s.lists) == 2 && run.stats("ConfigMap").failure().is_none()
    })
    .await;
    assert_eq!(run.count("ConfigMap", |s| &s.other_errors), 1);
    let refused = run.log("refuses to watch from resourceVersion \"xyz\"");
    assert_eq!(refused.len(), 1, "{:#?}", run.log("watch failed"));
    c.sim.create(configmap("default", "cm-after")).unwrap();
    wait_for("watching again", LONG, || {
        run.has("ConfigMap", "cm-after", "added")
    })
    .await;

    // The store kept "abc-17" as text: a delete inferred by a relist reports it.
    faults
        .set_resource_status("", "configmaps", 503, None)
        .unwrap();
    wait_for("the watch refused", LONG, || {
        run.count("ConfigMap", |s| &s.server_errors) >= 1
    })
    .await;
    c.sim
        .delete("v1", "ConfigMap", Some("default"), "opaque")
        .unwrap();
    faults.fail_next_watches_with_gone(1);
    faults.clear_resource_status("", "configmaps");
    wait_for("opaque's delete inferred", LONG, || {
        run.has("ConfigMap", "opaque", "deleted")
    })
    .await;
    let deleted = run.messages_of("ConfigMap", "opaque");
    let deleted = deleted.last().unwrap();
    assert_eq!(deleted["resourceVersion"], "abc-17");
    assert_eq!(deleted["finalStateUnknown"], true);

    // A well-formed event whose object cannot be read at all: that object is skipped, the
    // watch goes on. (Each relist above skipped the two nameless objects again.)
    let skipped = run.count("ConfigMap", |s| &s.skipped);
    raw(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": "not an object"}),
        RawResourceVersion::AsGiven,
    );
    c.sim.create(configmap("default", "cm-last")).unwrap();
    wait_for("the watch went on past it", LONG, || {
        run.has("ConfigMap", "cm-last", "added")
    })
    .await;
    assert_eq!(run.count("ConfigMap", |s| &s.skipped), skipped + 1);
    let unreadable = run.log("watch event's object does not decode; skipped");
    assert_eq!(unreadable.len(), 1, "{unreadable:#?}");
    assert!(unreadable[0].contains("not an object"), "{}", unreadable[0]);
    run.bridge.shutdown().await;
}

/// A ConfigMap whose `data.blob` is `bytes` long.
fn big_configmap(name: &str, bytes: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "default"},
           "data": {"blob": "x".repeat(bytes)}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_mebibyte_object_is_delivered_and_logs_quote_only_its_start() {
    const SIZE: usize = 5 * 1024 * 1024;
    let c = populated(1, 1, SimConfig::default()).await;
    c.sim.create(big_configmap("big-listed", SIZE)).unwrap();
    let run = Run::start(&c, "big", configmaps_and_nodes(), |_| {}).await;
    wait_for("initial sync", LONG, || run.synced() && run.sink.len() == 3).await;
    c.sim.create(big_configmap("big-watched", SIZE)).unwrap();
    // And one whose watch event is cut in the middle of its 5 MiB.
    c.sim
        .faults()
        .damage_next_watch_events(1, DamageKind::Truncated, Some(CONFIGMAPS));
    c.sim.create(big_configmap("big-cut", SIZE)).unwrap();
    c.sim.create(node("node-after")).unwrap();
    wait_for("three big objects and the node", LONG, || {
        ["big-listed", "big-watched", "big-cut"]
            .iter()
            .all(|n| run.has("ConfigMap", n, "added"))
            && run.has("Node", "node-after", "added")
    })
    .await;
    let big: Vec<_> = run
        .sink
        .payloads()
        .into_iter()
        .filter(|p| p.len() > SIZE)
        .collect();
    assert_eq!(big.len(), 3, "each big object delivered whole");
    assert_eq!(run.count("ConfigMap", |s| &s.decode_errors), 1);
    let cut = run.log("watch event does not decode");
    assert_eq!(cut.len(), 1);
    let longest = run.log("").iter().map(String::len).max().unwrap_or(0);
    assert!(
        longest < 2_000,
        "a log line of {longest} bytes: bodies must be quoted, not logged"
    );
    run.bridge.shutdown().await;
}

/// A Deployment whose `spec` nests `levels` objects: `{"a":{"a":…"leaf"…}}`.
fn deep_deployment(name: &str, levels: usize) -> String {
    format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"{name}","namespace":"default"}},"spec":{}"leaf"{}}}"#,
        "{\"a\":".repeat(levels),
        "}".repeat(levels)
    )
}

fn plain_deployment(name: &str) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"replicas": 1}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_nested_ten_thousand_levels_is_delivered_whole_or_skipped_by_a_pointer_into_it() {
    const LEVELS: usize = 10_000;
    const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
    let c = cluster(SimConfig::default()).await;
    let client = kubesink::cluster::client(&kubesink::config::Cluster {
        kubeconfig: Some(c.kubeconfig.clone()),
        ..Default::default()
    })
    .await
    .expect("client");
    // In the list: one deep object between two plain ones, on one page.
    post_json(&client, DEPLOYMENTS, plain_deployment("plain-1")).await;
    post_json(&client, DEPLOYMENTS, deep_deployment("deep-listed", LEVELS)).await;
    post_json(&client, DEPLOYMENTS, plain_deployment("plain-2")).await;

    let deployments = |tweak: fn(&mut ResourceConfig)| {
        let mut r = ResourceConfig::new("apps/v1", "Deployment");
        tweak(&mut r);
        vec![r]
    };
    let full = Run::start(&c, "deep-full", deployments(|_| {}), |_| {}).await;
    let dropping = Run::start(
        &c,
        "deep-drop",
        deployments(|r| r.drop = vec!["/spec/a/a/a".into()]),
        |_| {},
    )
    .await;
    let fields = Run::start(
        &c,
        "deep-fields",
        deployments(|r| {
            r.payload = PayloadMode::Fields;
            r.fields = vec!["/spec/a".into()];
        }),
        |_| {},
    )
    .await;
    let runs = [&full, &dropping, &fields];
    for run in runs {
        wait_for("initial sync", LONG, || run.synced()).await;
    }
    // As watch events.
    post_json(
        &client,
        DEPLOYMENTS,
        deep_deployment("deep-watched", LEVELS),
    )
    .await;
    post_json(&client, DEPLOYMENTS, plain_deployment("plain-3")).await;
    for run in runs {
        wait_for("the plain objects", LONG, || {
            ["plain-1", "plain-2", "plain-3"]
                .iter()
                .all(|n| run.has("Deployment", n, "added"))
        })
        .await;
    }
    wait_for("full mode delivers both deep objects", LONG, || {
        full.has("Deployment", "deep-listed", "added")
            && full.has("Deployment", "deep-watched", "added")
    })
    .await;
    let deep_payloads = full
        .sink
        .payloads()
        .into_iter()
        .filter(|p| p.windows(5).filter(|w| w == b"{\"a\":").count() == LEVELS)
        .count();
    assert_eq!(deep_payloads, 2, "each deep spec delivered whole");

    for run in [&dropping, &fields] {
        wait_for("both deep objects skipped", LONG, || {
            run.count("Deployment", |s| &s.skipped) == 2
        })
        .await;
        assert!(!run.has("Deployment", "deep-listed", "added"));
        assert!(!run.has("Deployment", "deep-watched", "added"));
        for name in ["deep-listed", "deep-watched"] {
            let lines = run.log(&format!("default/{name}: object skipped"));
            assert_eq!(lines.len(), 1, "{:#?}", run.log("skipped"));
            assert!(lines[0].contains("recursion limit"), "{}", lines[0]);
            assert!(lines[0].len() < 1_000, "{}", lines[0]);
        }
    }
    for run in [full, dropping, fields] {
        run.bridge.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pagination_survives_an_explicit_empty_continue_and_an_expired_token() {
    let c = populated(30, 0, SimConfig::default()).await;
    c.sim.faults().explicit_empty_continue(true);
    let mut configmaps = ResourceConfig::new("v1", "ConfigMap");
    configmaps.page_size = 10;
    // One watch only, so the 410 below meets it; paged lists (streaming has no pages).
    let run = Run::start(&c, "pages", vec![configmaps], |cfg| {
        cfg.watch.initial_list = kubesink::config::InitialList::List;
    })
    .await;
    wait_for("initial sync", LONG, || {
        run.synced() && run.sink.len() == 30
    })
    .await;
    // 30 objects in pages of 10; the last says `"continue": ""` and ends the list.
    assert_eq!(run.count("ConfigMap", |s| &s.list_requests), 3);

    // A relist whose continue token expires after the first page (410 with a new,
    // inconsistent token): the list starts over, and the objects of pages two and three,
    // unseen by the broken list, are not inferred deleted.
    c.sim.faults().expire_next_continue(1);
    c.sim.faults().fail_next_watches_with_gone(1);
    c.sim.faults().close_all_watches();
    wait_for("relist restarted and done", LONG, || {
        run.count("ConfigMap", |s| &s.lists) == 3 && run.stats("ConfigMap").failure().is_none()
    })
    .await;
    run.idle().await;
    // Three pages, the first page and the expired second, three pages again.
    assert_eq!(run.count("ConfigMap", |s| &s.list_requests), 3 + 2 + 3);
    assert_eq!(run.count("ConfigMap", |s| &s.gone), 2);
    assert_eq!(run.count("ConfigMap", |s| &s.inferred_deletes), 0);
    assert!(run.sink.messages().iter().all(|m| m["op"] != "deleted"));
    assert_eq!(run.log("continue token expired").len(), 1);
    assert_eq!(
        run.log("relist started").len(),
        1,
        "a restart is not a new relist"
    );
    c.sim.create(configmap("default", "cm-after")).unwrap();
    wait_for("watching again", LONG, || {
        run.has("ConfigMap", "cm-after", "added")
    })
    .await;
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dribbling_server_is_waited_for_and_a_stalled_list_is_retried() {
    let c = cluster(SimConfig::default()).await;
    c.sim
        .populate(&Workload {
            namespaces: 1,
            pods: 40,
            seed: 9,
            ..Default::default()
        })
        .unwrap();
    // ~120 KB of pods in 2 KiB chunks 100 ms apart: the list takes ~6 s, far beyond the
    // idle timeout, while no pause reaches it.
    c.sim.faults().dribble(2048, Duration::from_millis(100));
    let started = Instant::now();
    let run = Run::start(
        &c,
        "dribble",
        vec![ResourceConfig::new("v1", "Pod")],
        |cfg| {
            cfg.watch.idle_timeout = HumanDuration(Duration::from_secs(2));
            // A stalled streaming list is `streaming::auto_falls_back_when_a_quiet_server_…`.
            cfg.watch.initial_list = kubesink::config::InitialList::List;
        },
    )
    .await;
    wait_for("initial sync through the dribble", LONG, || {
        run.synced() && run.sink.len() == 40
    })
    .await;
    let took = started.elapsed();
    assert!(
        took > Duration::from_secs(2),
        "the dribble was on: {took:?}"
    );
    assert_eq!(run.count("Pod", |s| &s.idle_restarts), 0);
    assert_eq!(run.count("Pod", |s| &s.lists), 1);
    eprintln!("initial sync of 40 pods dribbled in 2 KiB chunks every 100 ms: {took:?}");

    // A server that stops sending in the middle of a list: the list is abandoned after the
    // idle timeout and tried again, until the server recovers.
    c.sim.faults().dribble(2048, Duration::from_secs(30));
    c.sim.faults().fail_next_watches_with_gone(1);
    c.sim.faults().close_all_watches();
    wait_for("a stalled list given up", LONG, || {
        run.count("Pod", |s| &s.idle_restarts) >= 1
    })
    .await;
    let stalled = run.log("no byte of the list arrived for 2s");
    assert!(
        !stalled.is_empty() && stalled[0].contains("WARN"),
        "{stalled:#?}"
    );
    c.sim.faults().dribble(0, Duration::ZERO);
    wait_for("relisted", LONG, || {
        run.synced() && run.count("Pod", |s| &s.lists) >= 3
    })
    .await;
    wait_for("relist complete", LONG, || {
        run.stats("Pod").failure().is_none()
    })
    .await;
    run.idle().await;
    assert!(run.sink.messages().iter().all(|m| m["op"] != "deleted"));
    run.bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_error_names_its_cause_not_only_client_error_send_request() {
    let logs = logs::install();
    let c = cluster(SimConfig::default()).await;
    let client = kubesink::cluster::client(&kubesink::config::Cluster {
        kubeconfig: Some(c.kubeconfig.clone()),
        ..Default::default()
    })
    .await
    .expect("client");
    // The API server goes away: its port refuses connections.
    c.sim.shutdown();
    let lease = logs::unique_cluster("lease-cause");
    let cfg = kubesink::config::LeaderElectionConfig {
        enabled: true,
        lease_name: lease.clone(),
        lease_namespace: Some("default".into()),
        retry_period: HumanDuration(Duration::from_millis(50)),
        ..Default::default()
    };
    let mut elector = kubesink::leader::Elector::new(client, &cfg);
    let campaign = tokio::spawn(async move { elector.acquire().await });
    let needle = format!("lease=default/{lease} ");
    let line = wait_until("the lease error logged", LONG, || {
        let lines = logs.lines(&needle);
        std::future::ready(
            lines
                .into_iter()
                .find(|l| l.contains("cannot read or take the lease"))
                .ok_or_else(|| "not yet".to_owned()),
        )
    })
    .await;
    campaign.abort();
    assert!(
        line.contains("Connection refused") || line.contains("tcp connect error"),
        "the cause is in the line: {line}"
    );
}
