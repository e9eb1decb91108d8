//! End-to-end tests of the NATS sink against a real `nats-server` (each test starts its own
//! on a free port) and the Kubernetes API simulator.
#![cfg(feature = "nats")]

use kubesink_test_support::{self as support, nats_server};

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use kubesink::config::HumanDuration;
use kubesink::config::SinkConfig;
use kubesink::config::{Config, ResourceConfig};
use kubesink_core::{Destination, Message, MessageMeta, Resource, Secret, Sink};
use kubesink_nats::{unescape_token, NatsConfig, NatsMode};
use kubesink_sim::{Churn, SimConfig, Workload};
use nats_server::NatsServer;
use serde_json::{json, Value};
use support::*;

const LONG: Duration = Duration::from_secs(120);

const KINDS: [(&str, &str); 3] = [("v1", "Pod"), ("apps/v1", "Deployment"), ("v1", "Node")];

fn workload(seed: u64) -> Workload {
    Workload {
        namespaces: 3,
        pods: 300,
        deployments: 20,
        nodes: 10,
        seed,
        ..Default::default()
    }
}

fn nats_config(server: &NatsServer, mode: NatsMode) -> NatsConfig {
    let mut c = NatsConfig {
        servers: vec![server.url()],
        mode,
        publish_timeout: HumanDuration::from_secs(1),
        connect_timeout: HumanDuration::from_secs(2),
        ..Default::default()
    };
    c.stream.create = true;
    c
}

/// `config/examples/nats.toml` as written, but for the server address and the kubeconfig
/// (the file uses the current context; here it is the simulator's).
fn example_config(server: &NatsServer, kubeconfig: &Path) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/nats.toml");
    let mut cfg = kubesink::plan::load(Some(&path)).expect("the example loads");
    cfg.cluster.kubeconfig = Some(kubeconfig.to_path_buf());
    cfg.server.listen = "127.0.0.1:0".into();
    for s in &mut cfg.sinks {
        if let SinkConfig::Nats(n) = s {
            n.servers = vec![server.url()];
        }
    }
    cfg
}

/// The test configuration for the simulator of `c`, following [`KINDS`].
fn kinds_config(c: &Cluster) -> Config {
    config(
        &c.kubeconfig,
        KINDS
            .iter()
            .map(|(a, k)| ResourceConfig::new(a, k))
            .collect(),
    )
}

async fn js_client(server: &NatsServer) -> jetstream::Context {
    let client = async_nats::connect(server.url()).await.expect("connect");
    jetstream::new(client)
}

/// Every message the stream holds, in stream order (payloads as JSON).
async fn stream_messages(js: &jetstream::Context, stream: &str) -> Vec<(String, Value)> {
    let mut s = js.get_stream(stream).await.expect("stream exists");
    let total = s.info().await.expect("info").state.messages as usize;
    if total == 0 {
        return Vec::new();
    }
    let consumer = s
        .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
        .await
        .expect("consumer");
    let mut msgs = consumer.messages().await.expect("messages");
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let m = tokio::time::timeout(Duration::from_secs(10), msgs.next())
            .await
            .expect("stream delivers within 10 s")
            .expect("not ended")
            .expect("message");
        out.push((
            m.subject.to_string(),
            serde_json::from_slice(&m.payload).expect("payload is JSON"),
        ));
    }
    out
}

/// The stream's messages folded by the shared oracle (`expect`).
async fn stream_fold(js: &jetstream::Context, stream: &str, expect: Expect) -> Fold {
    let msgs: Vec<Value> = stream_messages(js, stream)
        .await
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    fold_expecting(&msgs, expect)
}

/// How a fold differs from the simulator's objects, for timeouts.
fn fold_diff(want: &Fold, got: &Fold) -> String {
    let missing = want.iter().filter(|(k, v)| got.get(*k) != Some(*v)).count();
    let extra = got.keys().filter(|k| !want.contains_key(*k)).count();
    format!(
        "{missing} missing or stale, {extra} extra of {} wanted",
        want.len()
    )
}

/// Polls the stream's fold until it equals the simulator's objects.
async fn wait_stream_equals_sim(
    js: &jetstream::Context,
    stream: &str,
    c: &Cluster,
    expect: Expect,
) {
    wait_until(
        "the stream's fold to equal the simulator's objects",
        LONG,
        || async {
            let want = sim_state(&c.sim, &KINDS);
            let got = stream_fold(js, stream, expect).await;
            if got == want {
                Ok(())
            } else {
                Err(fold_diff(&want, &got))
            }
        },
    )
    .await
}

fn message(name: &str, namespace: Option<&str>, id: &str, payload: Value) -> Message {
    let configmaps = Resource::new("test", "", "v1", "ConfigMap", "configmaps", true);
    let meta = MessageMeta {
        id: id.into(),
        ..kubesink_core::message::fixtures::meta(Arc::new(configmaps), namespace, name)
    };
    Message {
        key: format!("test/core/ConfigMap/{}/{name}", namespace.unwrap_or("")).into(),
        payload: Bytes::from(payload.to_string()),
        meta: Arc::new(meta),
    }
}

#[test]
fn example_config_loads_as_written() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/nats.toml");
    let cfg = kubesink::plan::load(Some(&path)).expect("the example loads");
    let SinkConfig::Nats(n) = &cfg.sinks[0] else {
        panic!("the example's sink is NATS");
    };
    assert_eq!(n.mode, NatsMode::Jetstream);
    assert!(n.stream.create);
    assert_eq!(n.stream.max_msgs_per_subject, 1);
    assert!(n.validate(0).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_delivery_of_a_churning_cluster_folds_to_the_simulators_state() {
    let server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(3)).unwrap();
    let mut cfg = kinds_config(&c);
    cfg.sinks = vec![SinkConfig::Nats(nats_config(&server, NatsMode::Core))];

    // The consumer subscribes before anything is published (core NATS keeps nothing).
    let consumer = async_nats::connect(server.url()).await.unwrap();
    let mut sub = consumer.subscribe("kubesink.>").await.unwrap();
    consumer.flush().await.unwrap();
    let received = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let r = received.clone();
    let reader = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let v: Value = serde_json::from_slice(&m.payload).expect("JSON");
            let h = m.headers.expect("headers");
            assert_eq!(h.get("op").map(|x| x.as_str()), v["op"].as_str());
            assert_eq!(h.get("id").map(|x| x.as_str()), v["id"].as_str());
            assert_eq!(
                h.get("content-type").map(|x| x.as_str()),
                Some("application/json")
            );
            r.lock().unwrap().push(v);
        }
    });

    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    bridge.pipeline().sinks()[0]
        .sink()
        .healthcheck()
        .await
        .expect("healthy");
    let churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 200.0,
        seed: 9,
    });
    wait_for("churn under way", LONG, || {
        received.lock().unwrap().len() > 600
    })
    .await;
    churn.stop();
    // The simulator is read on every poll: the churn task may finish one last write after
    // `stop()` returns.
    wait_for_seen(
        "the core subscription's fold to equal the simulator",
        LONG,
        || {
            let want = sim_state(&c.sim, &KINDS);
            let got = fold(&received.lock().unwrap());
            if got == want {
                return (true, String::new());
            }
            let stats = &bridge.pipeline().sinks()[0].stats();
            (
                false,
                format!(
                    "{}; received {}, delivered {}, errors {}\nserver log:\n{}",
                    fold_diff(&want, &got),
                    received.lock().unwrap().len(),
                    stats.delivered.load(Ordering::SeqCst),
                    stats.errors.load(Ordering::SeqCst),
                    server.log()
                ),
            )
        },
    )
    .await;
    assert_schema_valid(&schema(), &received.lock().unwrap());
    bridge.shutdown().await;
    reader.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_delivery_with_the_example_config_holds_exactly_the_live_objects() {
    let server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(4)).unwrap();
    let cfg = example_config(&server, &c.kubeconfig);
    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    bridge.pipeline().sinks()[0]
        .sink()
        .healthcheck()
        .await
        .expect("healthy: connected and the stream exists");
    let churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 200.0,
        seed: 11,
    });
    wait_for("churn under way", LONG, || {
        bridge.pipeline().sinks()[0]
            .stats()
            .delivered
            .load(Ordering::SeqCst)
            > 700
    })
    .await;
    churn.stop();
    let js = js_client(&server).await;
    wait_stream_equals_sim(&js, "KUBESINK", &c, Expect::STRICT.last_per_key()).await;
    // max_msgs_per_subject = 1: one message per subject, so the stream is the topology
    // (plus the delete markers of deleted objects).
    let msgs = stream_messages(&js, "KUBESINK").await;
    let subjects: std::collections::HashSet<&str> = msgs.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(subjects.len(), msgs.len());
    let live = msgs.iter().filter(|(_, v)| v["op"] != "deleted").count();
    assert_eq!(live, sim_state(&c.sim, &KINDS).len());
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_second_outage_mid_churn_loses_nothing_and_memory_stays_bounded() {
    let mut server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(5)).unwrap();
    let mut cfg = kinds_config(&c);
    cfg.pipeline.max_pending = 100;
    cfg.pipeline.max_batch_events = 50;
    cfg.sinks = vec![SinkConfig::Nats(nats_config(&server, NatsMode::Jetstream))];
    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    let stats = bridge.pipeline().sinks()[0].stats().clone();
    wait_for("initial list delivered", LONG, || {
        stats.delivered.load(Ordering::SeqCst) >= 330
    })
    .await;
    let churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 100.0,
        seed: 12,
    });
    wait_for("churn delivered", LONG, || {
        stats.delivered.load(Ordering::SeqCst) >= 400
    })
    .await;

    server.stop();
    let errors_before = stats.errors.load(Ordering::SeqCst);
    // The outage itself: the scenario is "the server is gone for 10 s".
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        stats.errors.load(Ordering::SeqCst) > errors_before,
        "sends failed during the outage"
    );
    let queue = &bridge.pipeline().sinks()[0];
    assert!(
        queue.high_water() <= 100,
        "high water {}",
        queue.high_water()
    );
    server.restart();

    wait_for("delivering again", LONG, || {
        stats.delivered.load(Ordering::SeqCst) >= 600
    })
    .await;
    churn.stop();
    let js = js_client(&server).await;
    wait_stream_equals_sim(&js, "KUBESINK", &c, Expect::STRICT).await;
    let queue = &bridge.pipeline().sinks()[0];
    assert!(
        queue.high_water() <= 100,
        "high water {}",
        queue.high_water()
    );
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_batch_with_the_same_msg_id_is_stored_once() {
    let server = NatsServer::start("");
    let sink = nats_config(&server, NatsMode::Jetstream)
        .build_sink(0)
        .await
        .expect("sink");
    let batch: Vec<Message> = (0..20)
        .map(|i| {
            message(
                &format!("cm-{i}"),
                Some("default"),
                &format!("{i:032x}"),
                json!({"n": i}),
            )
        })
        .collect();
    sink.send(&batch).await.expect("first delivery");
    sink.send(&batch).await.expect("redelivery");
    sink.send(&batch[5..10]).await.expect("partial redelivery");
    let js = js_client(&server).await;
    let mut stream = js.get_stream("KUBESINK").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 20);
    let last = stream
        .get_last_raw_message_by_subject("kubesink.test.core.ConfigMap.default.cm-7")
        .await
        .unwrap();
    let stored = last;
    assert_eq!(
        stored
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str()),
        Some(format!("{:032x}", 7).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_is_a_clear_startup_error() {
    let server = NatsServer::start("");
    let mut cfg = nats_config(&server, NatsMode::Jetstream);
    cfg.stream.create = false;
    cfg.stream.name = "TOPOLOGY".into();
    let err = cfg.build_sink(0).await.err().expect("fails").to_string();
    assert!(
        err.contains("TOPOLOGY") && err.contains("stream.create"),
        "{err}"
    );
    assert!(err.contains(&server.url()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_share_the_stream_one_of_them_creates() {
    // Each round, 32 sinks start at once on a server without the stream: every one must
    // come up (one creates the stream, the others find it), as replicas restarted together.
    let server = NatsServer::start("");
    for round in 0..30 {
        let mut cfg = nats_config(&server, NatsMode::Jetstream);
        cfg.stream.name = format!("RACE{round}");
        cfg.stream.subjects = vec![format!("race{round}.>")];
        let starts = (0..32).map(|i| {
            let cfg = cfg.clone();
            async move {
                cfg.build_sink(i)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        });
        for r in futures::future::join_all(starts).await {
            r.unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_while_a_sink_still_connects_stops_the_process_cleanly() {
    // A server that takes the connection and never answers: the NATS sink's start waits
    // (`connect_timeout`), and a SIGTERM meanwhile ends the process with 0, not by the
    // signal's default action (exit 143: the handlers were installed only once running).
    let c = cluster(SimConfig::default()).await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = silent.local_addr().expect("addr");
    let dir = tempfile::tempdir().expect("tempdir");
    let rest = format!(
        "[[sinks]]\ntype = \"nats\"\nservers = [\"nats://{addr}\"]\nconnect_timeout = \"60s\"\n"
    );
    let cfg = support::process::write_config(dir.path(), "starting", &c.kubeconfig, &rest);
    let bin = env!("CARGO_BIN_EXE_kubesink");
    let mut k = support::process::Kubesink::start(bin, &cfg, dir.path(), "starting", &[]);
    let _held = tokio::time::timeout(Duration::from_secs(60), silent.accept())
        .await
        .expect("the sink connects within 60 s")
        .expect("accept");
    let code = k.signal_and_wait("TERM", Duration::from_secs(30)).await;
    assert_eq!(code, Some(Some(0)), "stderr:\n{}", k.stderr());
}

async fn delivers_one(cfg: &NatsConfig) {
    let sink = cfg.build_sink(0).await.expect("connects");
    sink.healthcheck().await.expect("healthy");
    let mut sub = sink.client().subscribe("kubesink.>").await.unwrap();
    sink.client().flush().await.unwrap();
    let m = message(
        "auth-check",
        Some("default"),
        &"a".repeat(32),
        json!({"ok": true}),
    );
    sink.send(std::slice::from_ref(&m))
        .await
        .expect("delivered");
    let got = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("received")
        .expect("message");
    assert_eq!(&got.payload[..], &m.payload[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_password_connects_and_a_wrong_password_names_server_and_method_not_secret() {
    let server = NatsServer::start("authorization { user: kubesink, password: \"s3cret-pw\" }\n");
    let mut cfg = nats_config(&server, NatsMode::Core);
    cfg.auth.user = Some("kubesink".into());
    cfg.auth.password = Some(Secret::new("s3cret-pw"));
    delivers_one(&cfg).await;

    cfg.auth.password = Some(Secret::new("wrong-pw-123"));
    let err = cfg.build_sink(0).await.err().expect("rejected").to_string();
    eprintln!("the error an operator sees: {err}");
    assert!(err.contains(&server.url()), "{err}");
    assert!(err.contains("user/password"), "{err}");
    assert!(err.contains("authorization"), "{err}");
    assert!(
        !err.contains("wrong-pw-123") && !err.contains("s3cret-pw"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nkey_authentication_connects() {
    let user = nkeys::KeyPair::new_user();
    let server = NatsServer::start(&format!(
        "authorization {{ users = [ {{ nkey: {} }} ] }}\n",
        user.public_key()
    ));
    let mut cfg = nats_config(&server, NatsMode::Core);
    cfg.auth.nkey_seed = Some(Secret::new(user.seed().unwrap()));
    delivers_one(&cfg).await;

    let other = nkeys::KeyPair::new_user();
    cfg.auth.nkey_seed = Some(Secret::new(other.seed().unwrap()));
    let err = cfg.build_sink(0).await.err().expect("rejected").to_string();
    assert!(err.contains("nkey") && err.contains(&server.url()), "{err}");
    assert!(!err.contains(&other.seed().unwrap()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_connects_with_generated_certificates() {
    let dir = tempfile::tempdir().unwrap();
    nats_server::generate_certs(dir.path());
    let p = |f: &str| dir.path().join(f);
    let conf = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true, timeout: 5 }}\n",
        p("server.pem").display(),
        p("server-key.pem").display(),
        p("ca.pem").display()
    );
    let ca = p("ca.pem");
    let (cert, key) = (p("client.pem"), p("client-key.pem"));
    let server = NatsServer::start_in(dir, &conf);
    let mut cfg = nats_config(&server, NatsMode::Core);
    cfg.tls.required = true;
    cfg.tls.ca_file = Some(ca.clone());
    cfg.tls.cert_file = Some(cert);
    cfg.tls.key_file = Some(key);
    delivers_one(&cfg).await;

    // Without the client certificate the server refuses the handshake.
    cfg.tls.cert_file = None;
    cfg.tls.key_file = None;
    let err = cfg.build_sink(0).await.err().expect("rejected").to_string();
    assert!(err.contains(&server.url()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotted_and_unusual_names_get_distinct_reversible_subjects() {
    let server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    let names = [
        "app.config.v2",
        "app-config-v2",
        "app.config-v2",
        "a",
        "a.b.c.d.e.f",
        "x--y.z",
        "0.0.1",
    ];
    for n in names {
        c.sim
            .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": n, "namespace": "default"}, "data": {"k": "v"}}))
            .unwrap();
    }
    for n in ["node-1.eu-west-1.compute.internal", "node-1"] {
        c.sim
            .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}))
            .unwrap();
    }
    let mut cfg = config(
        &c.kubeconfig,
        vec![
            ResourceConfig::new("v1", "ConfigMap"),
            ResourceConfig::new("v1", "Node"),
        ],
    );
    cfg.sinks = vec![SinkConfig::Nats(nats_config(&server, NatsMode::Jetstream))];
    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    let js = js_client(&server).await;
    let total = names.len() + 2;
    wait_for("every object delivered", LONG, || {
        bridge.pipeline().sinks()[0]
            .stats()
            .delivered
            .load(Ordering::SeqCst)
            >= total as u64
    })
    .await;
    let msgs = stream_messages(&js, "KUBESINK").await;
    assert_eq!(msgs.len(), total);
    let mut subjects = std::collections::HashSet::new();
    for (subject, v) in &msgs {
        assert!(subjects.insert(subject.clone()), "shared subject {subject}");
        let tokens: Vec<&str> = subject.split('.').collect();
        assert_eq!(tokens.len(), 6, "{subject}");
        assert_eq!(unescape_token(tokens[5]).as_deref(), v["name"].as_str());
        let ns = unescape_token(tokens[4]).unwrap();
        assert_eq!(ns, v["namespace"].as_str().unwrap_or(""));
    }
    assert!(subjects.contains("kubesink.test.core.ConfigMap.default.app%2Econfig%2Ev2"));
    assert!(subjects.contains("kubesink.test.core.Node._.node-1%2Eeu-west-1%2Ecompute%2Einternal"));
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_over_max_payload_is_sent_truncated_and_counted() {
    let server = NatsServer::start("max_payload: 4096\n");
    let c = cluster(SimConfig::default()).await;
    let big = "x".repeat(20_000);
    c.sim
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "big", "namespace": "default"}, "data": {"blob": big}}))
        .unwrap();
    c.sim
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "small", "namespace": "default"}, "data": {"k": "v"}}))
        .unwrap();
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "ConfigMap")]);
    for mode in [NatsMode::Jetstream, NatsMode::Core] {
        let mut n = nats_config(&server, mode);
        n.name = format!("nats-{mode:?}");
        n.stream.name = "BIG".into();
        cfg.sinks.push(SinkConfig::Nats(n));
    }
    let sinks = build_sinks(&cfg).await;
    assert_eq!(sinks[0].max_message_bytes(), Some(4096));
    let consumer = async_nats::connect(server.url()).await.unwrap();
    let mut sub = consumer.subscribe("kubesink.>").await.unwrap();
    consumer.flush().await.unwrap();
    let bridge = start_bridge_with(&cfg, sinks).await;
    // Both sinks publish on the same subjects, so the subscription sees each object twice
    // (the core sink's and the JetStream sink's), in any interleaving: wait for all four.
    let mut core = Vec::new();
    while core.len() < 4 {
        let m = tokio::time::timeout(LONG, sub.next())
            .await
            .expect("core messages arrive")
            .expect("message");
        core.push(serde_json::from_slice::<Value>(&m.payload).unwrap());
    }
    let js = js_client(&server).await;
    wait_for("JetStream sink delivered all", LONG, || {
        bridge.pipeline().sinks()[0]
            .stats()
            .delivered
            .load(Ordering::SeqCst)
            >= 2
    })
    .await;
    // Messages published by either sink on the same subjects: the JetStream stream has them.
    let stored: Vec<Value> = stream_messages(&js, "BIG")
        .await
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    for msgs in [&core, &stored] {
        let by_name = |n: &str| {
            msgs.iter()
                .find(|m| m["name"] == n)
                .unwrap_or_else(|| panic!("{n} delivered"))
        };
        assert_eq!(by_name("big")["truncated"], true);
        assert!(by_name("big")["object"]["data"].is_null());
        assert_eq!(by_name("big")["object"]["metadata"]["name"], "big");
        assert!(by_name("small").get("truncated").is_none());
    }
    for h in bridge.pipeline().sinks() {
        assert_eq!(
            h.stats().truncated.load(Ordering::SeqCst),
            1,
            "{}",
            h.sink().name()
        );
    }
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_only_its_headers_push_over_max_payload_is_reported_too_large() {
    let server = NatsServer::start("max_payload: 4096\n");
    for mode in [NatsMode::Core, NatsMode::Jetstream] {
        let sink = nats_config(&server, mode)
            .build_sink(0)
            .await
            .expect("sink");
        let fits = message("fits", Some("default"), &"1".repeat(32), json!({"a": 1}));
        let mut edge = message("edge", Some("default"), &"2".repeat(32), json!({}));
        edge.payload = Bytes::from(vec![b' '; 4096 - 10]);
        let err = sink
            .send(&[fits.clone(), edge.clone()])
            .await
            .expect_err("too large");
        match err {
            kubesink_core::SinkError::TooLarge { index, limit, .. } => {
                assert_eq!((index, limit), (1, Some(4096)), "{mode:?}");
            }
            other => panic!("{mode:?}: {other}"),
        }
        sink.send(&[fits]).await.expect("the rest is deliverable");
    }
}

/// A duration in seconds from the environment (longer manual runs), else `default`.
fn secs_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `n` ConfigMaps `cm-{from}..` in namespace `default`.
fn create_configmaps(c: &Cluster, from: usize, n: usize) {
    for i in from..from + n {
        c.sim
            .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm-{i}"), "namespace": "default"}, "data": {"i": i.to_string()}}))
            .unwrap();
    }
}

const CONFIGMAPS: [(&str, &str); 1] = [("v1", "ConfigMap")];

/// Polls the stream's fold of ConfigMaps until it equals the simulator's (the stream may
/// not exist yet: a sink that started without a server creates it once connected).
async fn wait_configmaps_in_stream(js: &jetstream::Context, stream: &str, c: &Cluster) {
    wait_until(
        "the stream's ConfigMaps to equal the simulator's",
        LONG,
        || async {
            let want = sim_state(&c.sim, &CONFIGMAPS);
            let got = match js.get_stream(stream).await {
                Ok(_) => stream_fold(js, stream, Expect::STRICT).await,
                Err(_) => Fold::new(),
            };
            if got == want {
                Ok(())
            } else {
                Err(fold_diff(&want, &got))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_resumes_within_seconds_of_the_server_coming_back_not_after_the_backoff() {
    let mut server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    create_configmaps(&c, 0, 10);
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "ConfigMap")]);
    // Waits between retries longer than the test waits: after a 20 s outage the backoff
    // alone would retry no sooner than 280 s after the restart (300 s after the first
    // failure), so delivery within LONG (120 s) of the restart shows the backoff was cut
    // short, however slow the machine, without timing it.
    cfg.pipeline.retry_initial_backoff = HumanDuration::from_secs(300);
    cfg.pipeline.retry_max_backoff = HumanDuration::from_secs(600);
    cfg.sinks = vec![SinkConfig::Nats(nats_config(&server, NatsMode::Jetstream))];
    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    let h = &bridge.pipeline().sinks()[0];
    let stats = h.stats().clone();
    wait_for("initial list delivered", LONG, || {
        stats.delivered.load(Ordering::SeqCst) >= 10
    })
    .await;

    server.stop();
    create_configmaps(&c, 10, 40);
    // Sends fail naming the cause ("connection refused"), not the symptom (a PubAck timeout).
    wait_for("a failed send naming the cause", LONG, || {
        stats.errors.load(Ordering::SeqCst) > 0
            && stats
                .problem()
                .is_some_and(|p| p.to_lowercase().contains("connection refused"))
    })
    .await;
    // The outage itself: the server is gone for 20 s (the two minutes:
    // KUBESINK_OUTAGE_SECS=120).
    tokio::time::sleep(Duration::from_secs(secs_from_env(
        "KUBESINK_OUTAGE_SECS",
        20,
    )))
    .await;
    assert!(stats.delivered.load(Ordering::SeqCst) < 50);
    server.restart();
    let back = std::time::Instant::now();
    wait_for(
        "delivery after the restart, before the backoff's own retry (the backoff was not cut short)",
        LONG,
        || stats.delivered.load(Ordering::SeqCst) >= 50,
    )
    .await;
    eprintln!("delivered {:?} after the server came back", back.elapsed());
    let js = js_client(&server).await;
    wait_configmaps_in_stream(&js, "KUBESINK", &c).await;
    let conns: Vec<_> = server
        .connections()
        .into_iter()
        .filter(|(n, _)| n == "kubesink")
        .collect();
    assert_eq!(conns.len(), 1, "one connection: {conns:?}");
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_at_start_up_lets_other_sinks_flow_and_is_used_once_it_is_up() {
    let mut server = NatsServer::start("");
    server.stop();
    let c = cluster(SimConfig::default()).await;
    create_configmaps(&c, 0, 30);
    let mut cfg = config(&c.kubeconfig, vec![ResourceConfig::new("v1", "ConfigMap")]);
    cfg.sinks = vec![SinkConfig::Nats(nats_config(&server, NatsMode::Jetstream))];
    let mut sinks = build_sinks(&cfg).await;
    let err = sinks[0].healthcheck().await.expect_err("not connected");
    assert!(
        err.to_string()
            .to_lowercase()
            .contains("connection refused"),
        "{err}"
    );
    let capture = CaptureSink::new();
    sinks.push(capture.clone());
    let bridge = start_bridge_with(&cfg, sinks).await;
    wait_for("the other sink got everything", LONG, || {
        capture.len() >= 30
    })
    .await;
    let nats = &bridge.pipeline().sinks()[0];
    wait_for("the NATS sink reports failed sends", LONG, || {
        nats.stats().errors.load(Ordering::SeqCst) > 0
    })
    .await;
    let (text, _) = bridge.observed().metrics();
    assert!(
        metric_value(
            &text,
            "kubesink_sink_errors_total",
            &[("sink", "nats"), ("kind", "transient")]
        ) > 0.0,
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "kubesink_sink_ready", &[("sink", "nats")]),
        0.0
    );
    assert_eq!(
        nats.held(),
        30,
        "held for the NATS sink, bounded by its queue"
    );

    server.restart();
    let js = js_client(&server).await;
    wait_configmaps_in_stream(&js, "KUBESINK", &c).await;
    assert_eq!(capture.len(), 30, "the other sink got each change once");
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_flapping_for_thirty_seconds_loses_nothing_over_one_connection() {
    let mut server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(6)).unwrap();
    let mut cfg = kinds_config(&c);
    cfg.pipeline.max_pending = 200;
    cfg.pipeline.retry_max_backoff = HumanDuration::from_secs(5);
    cfg.sinks = vec![SinkConfig::Nats(nats_config(&server, NatsMode::Jetstream))];
    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    let stats = bridge.pipeline().sinks()[0].stats().clone();
    wait_for("initial list delivered", LONG, || {
        stats.delivered.load(Ordering::SeqCst) >= 330
    })
    .await;
    let churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 50.0,
        seed: 13,
    });
    // The scenario itself: down 2 s, up 3 s, for 30 s (the minute:
    // KUBESINK_FLAP_SECS=60).
    for _ in 0..secs_from_env("KUBESINK_FLAP_SECS", 30) / 5 {
        server.stop();
        tokio::time::sleep(Duration::from_secs(2)).await;
        server.restart();
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    churn.stop();
    let js = js_client(&server).await;
    wait_stream_equals_sim(&js, "KUBESINK", &c, Expect::STRICT).await;
    let h = &bridge.pipeline().sinks()[0];
    assert!(h.high_water() <= 200, "high water {}", h.high_water());
    assert!(
        stats.errors.load(Ordering::SeqCst) > 0,
        "the outages were felt"
    );
    let conns: Vec<_> = server
        .connections()
        .into_iter()
        .filter(|(n, _)| n == "kubesink")
        .collect();
    assert_eq!(conns.len(), 1, "one client, one connection: {conns:?}");
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_markers_arrive_on_the_reserved_subject_after_every_message_of_their_list() {
    let server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(21)).unwrap();
    let mut cfg = kinds_config(&c);
    cfg.pipeline.sync_markers = true;
    cfg.pipeline.max_batch_events = 50;
    cfg.sinks = vec![SinkConfig::Nats(nats_config(&server, NatsMode::Jetstream))];
    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    let js = js_client(&server).await;
    let msgs = wait_until("three markers in the stream", LONG, || async {
        let msgs = stream_messages(&js, "KUBESINK").await;
        match msgs.iter().filter(|(_, m)| m["op"] == "synced").count() {
            n if n == KINDS.len() => Ok(msgs),
            n => Err(format!("{n} markers in {} messages", msgs.len())),
        }
    })
    .await;
    bridge.shutdown().await;
    for (api, kind) in KINDS {
        let group = api.split_once('/').map_or("core", |(g, _)| g);
        let subject = format!("kubesink.test.{group}.{kind}._.%synced");
        let at = msgs
            .iter()
            .position(|(s, _)| *s == subject)
            .unwrap_or_else(|| panic!("no marker on {subject}"));
        let marker = &msgs[at].1;
        let listed = msgs[..at]
            .iter()
            .filter(|(_, m)| m["kind"] == kind && m["op"] != "synced")
            .count();
        let live = c.sim.objects(api, kind).len();
        assert_eq!(listed, live, "{kind}: every object before its marker");
        assert!(
            msgs[at + 1..].iter().all(|(_, m)| m["kind"] != kind),
            "{kind}: a message of the list after its marker"
        );
        assert_eq!(marker["count"], live as u64);
        let scope = if kind == "Node" {
            "cluster"
        } else {
            "allNamespaces"
        };
        assert_eq!(marker["scope"], scope);
        assert_eq!(marker["initial"], true);
    }
    let values: Vec<Value> = msgs.into_iter().map(|(_, m)| m).collect();
    assert_schema_valid(&schema(), &values);
}

/// Several batches in flight (`batches_in_flight`, default 4) keep per-key order, and a
/// PubAck failure in the middle of a batch makes only that key wait. The stream is a work
/// queue holding at most 40 messages (`discard = new`): while it is full the server answers
/// each publish with a failed PubAck ("maximum messages exceeded"), so batches fail in part,
/// at whatever message the stream filled up, while others are in flight. A consumer then
/// drains it (each message removed once acked) during churn, and every message it reads, in
/// stream order, goes through the oracle (per key and uid the resourceVersions never
/// decrease; a delete never precedes its object's last state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_keeps_per_key_order_with_several_batches_in_flight_and_puback_failures() {
    use jetstream::consumer::{pull, AckPolicy};
    use jetstream::stream::{Config as StreamConfig, DiscardPolicy, RetentionPolicy, StorageType};
    let server = NatsServer::start("");
    let js = js_client(&server).await;
    let stream = js
        .create_stream(StreamConfig {
            name: "ORDER".into(),
            subjects: vec!["kubesink.>".into()],
            retention: RetentionPolicy::WorkQueue,
            discard: DiscardPolicy::New,
            max_messages: 40,
            storage: StorageType::Memory,
            ..Default::default()
        })
        .await
        .expect("stream created");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(31)).unwrap();
    let mut cfg = kinds_config(&c);
    cfg.pipeline.max_batch_events = 25;
    // Full batches of 25, so the stream's 40 cannot end at a batch's edge and some batch
    // fails in part. With the tests' short linger a loaded machine cuts smaller batches,
    // which can fill the stream at an edge: then every failure is a whole batch's (a
    // transient error, not a partial one) and the wait below timed out (1 of 1 run beside
    // two busy loops).
    cfg.pipeline.linger = HumanDuration::from_millis(1000);
    cfg.pipeline.retry_max_backoff = HumanDuration::from_millis(300);
    let mut nats = nats_config(&server, NatsMode::Jetstream);
    nats.stream.create = false;
    nats.stream.name = "ORDER".into();
    assert_eq!(nats.batches_in_flight, 4, "the default");
    cfg.sinks = vec![SinkConfig::Nats(nats)];
    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    let handle = bridge.pipeline().sinks()[0].clone();
    let stats = handle.stats().clone();
    let partial = || stats.errors_by_kind[1].load(Ordering::SeqCst);
    // Nobody reads yet: the stream fills up in the middle of the initial list's batches.
    wait_for("publishes failing in the middle of a batch", LONG, || {
        partial() > 0
    })
    .await;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("reader".into()),
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("consumer");
    let received: Arc<std::sync::Mutex<Vec<Value>>> = Arc::default();
    let reader = {
        let received = received.clone();
        tokio::spawn(async move {
            let mut msgs = consumer.messages().await.expect("messages");
            while let Some(Ok(m)) = msgs.next().await {
                let v: Value = serde_json::from_slice(&m.payload).expect("payload is JSON");
                received.lock().expect("lock").push(v);
                m.double_ack().await.expect("ack");
            }
        })
    };
    let churn = c.sim.spawn_churn(Churn {
        rate_per_sec: 150.0,
        seed: 32,
    });
    let failed_before = partial();
    wait_for("more publishes failing during the churn", LONG, || {
        partial() > failed_before && stats.delivered.load(Ordering::SeqCst) >= 600
    })
    .await;
    churn.stop();
    wait_until(
        "the consumer's fold to equal the simulator's objects",
        LONG,
        || async {
            let want = sim_state(&c.sim, &KINDS);
            let msgs = received.lock().expect("lock").clone();
            let got = fold_expecting(&msgs, Expect::STRICT.redelivery());
            if got == want {
                Ok(())
            } else {
                Err(fold_diff(&want, &got))
            }
        },
    )
    .await;
    reader.abort();
    // What the test is about happened: several batches were in flight at some point of the
    // run (checked over the whole run: at the first failed publish alone, a loaded machine
    // may still have had one).
    assert!(
        handle.batches_high_water() >= 2,
        "several batches were in flight (high water {})",
        handle.batches_high_water()
    );
    bridge.shutdown().await;
    let msgs = received.lock().expect("lock").clone();
    let mut oracle = Oracle::new(Expect::STRICT.redelivery());
    for m in &msgs {
        oracle.apply(m);
    }
    oracle.assert_clean();
    assert!(
        stats.retried.load(Ordering::SeqCst) > 0,
        "messages were re-sent after failed PubAcks"
    );
    assert!(
        handle.batches_high_water() <= 4,
        "never more than the window"
    );
}

/// `max_in_flight` bounds the PubAcks awaited across every batch in flight. With a bound
/// smaller than what the batches in flight publish (4 PubAcks; 4 batches of 10), concurrent
/// sends each hold some permits and wait for one that only another's PubAcks free: each
/// send keeps collecting its own PubAcks while its publish waits, so none waits out
/// `publish_timeout` (every send succeeds at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_puback_bound_shared_by_several_batches_in_flight_never_waits_out_a_timeout() {
    let server = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    c.sim.populate(&workload(41)).unwrap();
    let mut cfg = kinds_config(&c);
    cfg.pipeline.max_batch_events = 10;
    let mut nats = nats_config(&server, NatsMode::Jetstream);
    nats.max_in_flight = 4;
    nats.batches_in_flight = 4;
    cfg.sinks = vec![SinkConfig::Nats(nats)];
    let bridge = start_bridge_with(&cfg, build_sinks(&cfg).await).await;
    let handle = bridge.pipeline().sinks()[0].clone();
    let js = js_client(&server).await;
    wait_stream_equals_sim(&js, "KUBESINK", &c, Expect::STRICT).await;
    bridge.shutdown().await;
    assert!(
        handle.batches_high_water() >= 2,
        "several batches were in flight (high water {})",
        handle.batches_high_water()
    );
    assert_eq!(
        handle.stats().errors.load(Ordering::SeqCst),
        0,
        "no send failed (a publish waiting for a PubAck permit timed out)"
    );
}
