//! Unit tests of the pure parts (template, escaping, config rendering, classification) and
//! fault tests against librdkafka's mock cluster (`rdkafka::mocking::MockCluster`).

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kubesink_core::template::TemplateError;
use kubesink_core::units::HumanDuration;
use kubesink_core::{Destination, Message, MessageMeta, Op, Resource, Secret, Sink, SinkError};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Headers;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

use crate::*;

fn meta(op: Op, kind: &str, ns: Option<&str>, name: &str, id: &str) -> MessageMeta {
    let group = if kind == "Deployment" { "apps" } else { "" };
    let plural = format!("{}s", kind.to_lowercase());
    let resource = Resource::new("prod-eu-1", group, "v1", kind, &plural, ns.is_some());
    MessageMeta {
        id: id.into(),
        op,
        tombstone_id: (op == Op::Deleted).then(|| format!("{id}-tombstone").into()),
        ..kubesink_core::message::fixtures::meta(Arc::new(resource), ns, name)
    }
}

fn msg(op: Op, name: &str, rv: u64) -> Message {
    let m = meta(op, "Pod", Some("default"), name, &format!("{name}-{rv}"));
    Message {
        key: format!("prod-eu-1/core/Pod/default/{name}").into(),
        payload: Bytes::from(format!(
            r#"{{"op":"{op}","name":"{name}","resourceVersion":"{rv}"}}"#
        )),
        meta: Arc::new(m),
    }
}

// ---- topic template ----

#[test]
fn template_substitutes_every_placeholder() {
    let t =
        topic_template("k8s.{cluster}.{group}.{version}.{kind}.{resource}.{namespace}").unwrap();
    let dep = meta(Op::Added, "Deployment", Some("web"), "x", "1");
    assert_eq!(
        t.render(&dep),
        "k8s.prod-eu-1.apps.v1.Deployment.deployments.web"
    );
    let node = meta(Op::Added, "Node", None, "n1", "1");
    assert_eq!(t.render(&node), "k8s.prod-eu-1.core.v1.Node.nodes._cluster");
}

#[test]
fn template_rejects_unknown_placeholders_and_illegal_literals() {
    assert!(matches!(
        topic_template("a.{name}"),
        Err(TemplateError::UnknownPlaceholder { name, .. }) if name == "name"
    ));
    assert!(matches!(
        topic_template("a.{kind"),
        Err(TemplateError::Unclosed { .. })
    ));
    let e = topic_template("a/{kind}").unwrap_err();
    assert!(matches!(e, TemplateError::BadLiteral { .. }));
    assert!(e.to_string().contains("'/'"), "{e}");
    assert!(matches!(
        topic_template(""),
        Err(TemplateError::Empty { .. })
    ));
}

#[test]
fn substituted_values_escape_illegal_characters_to_underscore() {
    let mut out = String::new();
    escape("ex ample.com/v1:ä", &mut out);
    assert_eq!(out, "ex_ample.com_v1__");
}

// ---- configuration ----

/// A config from JSON (same serde shape as the TOML entry; this crate has no toml parser).
fn parse(json: &str) -> KafkaConfig {
    serde_json::from_str(json).unwrap()
}

#[test]
fn defaults_are_the_idempotent_producer_with_acks_all_and_tombstones() {
    let c = parse(r#"{"bootstrap_servers": "b:9092"}"#);
    assert!(c.validate(0).is_empty());
    let r = c.render();
    assert_eq!(r.get("enable.idempotence"), Some("true"));
    assert_eq!(r.get("acks"), Some("all"));
    assert_eq!(r.get("compression.type"), Some("lz4"));
    assert_eq!(r.get("security.protocol"), Some("plaintext"));
    assert!(c.tombstones);
    assert_eq!(c.topic, "kubesink.{cluster}");
}

#[test]
fn a_passthrough_property_kubesink_manages_is_an_error_naming_both() {
    let c = parse(
        r#"{"bootstrap_servers": "b:9092", "librdkafka": {"acks": "1", "delivery.timeout.ms": "5", "socket.keepalive.enable": "true"}}"#,
    );
    let errs: Vec<String> = c.validate(2).iter().map(ToString::to_string).collect();
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].contains("librdkafka.\"acks\"") && errs[0].contains("conflicts with `acks`"),
        "{errs:?}"
    );
    assert!(
        errs[1].contains("librdkafka.\"delivery.timeout.ms\"")
            && errs[1].contains("`message_timeout`"),
        "{errs:?}"
    );
    assert!(errs[0].starts_with("sinks[2] (kafka): "), "{errs:?}");
}

#[test]
fn idempotence_requires_acks_all_and_sasl_requires_credentials() {
    let c = parse(
        r#"{"bootstrap_servers": "b:9092", "acks": "1", "security": {"protocol": "sasl_ssl"}}"#,
    );
    let all = c
        .validate(0)
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    for want in [
        "acks: idempotence = true requires acks = \"all\"",
        "security.sasl_mechanism: required",
        "security.sasl_username: required",
        "security.sasl_password: required",
    ] {
        assert!(all.contains(want), "missing {want:?} in {all}");
    }
    let c = parse(r#"{"topic": "a/b"}"#);
    let all = format!("{:?}", c.validate(0));
    assert!(
        all.contains("bootstrap_servers") && all.contains("not allowed"),
        "{all}"
    );
}

fn sasl_config(servers: &str) -> KafkaConfig {
    KafkaConfig {
        bootstrap_servers: servers.into(),
        security: Box::new(KafkaSecurity {
            protocol: Protocol::SaslPlaintext,
            sasl_mechanism: Some(SaslMechanism::ScramSha512),
            sasl_username: Some("kubesink".into()),
            sasl_password: Some(Secret::new("hunter2-very-secret")),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn sasl_settings_render_into_librdkafka_properties_with_the_password_masked_in_debug() {
    let c = sasl_config("b:9092");
    assert!(c.validate(0).is_empty(), "{:?}", c.validate(0));
    let r = c.render();
    assert_eq!(r.get("security.protocol"), Some("sasl_plaintext"));
    assert_eq!(r.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
    assert_eq!(r.get("sasl.username"), Some("kubesink"));
    assert_eq!(r.get("sasl.password"), Some("hunter2-very-secret"));
    let shown = format!("{r:?} {c:?} {}", serde_json::to_string(&c).unwrap());
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("***"));
}

#[test]
fn credential_passthrough_values_print_masked_and_reach_librdkafka_intact() {
    let c = parse(
        r#"{"bootstrap_servers": "b:9092", "librdkafka": {
            "sasl.oauthbearer.client.secret": "oauth-s3cret", "ssl.keystore.password": "ks-s3cret",
            "ssl.key.pem": "-----BEGIN PRIVATE KEY-----", "client.id": "kubesink-dev"}}"#,
    );
    let shown = format!(
        "{c:?} {} {:?}",
        serde_json::to_string(&c).unwrap(),
        c.render()
    );
    assert!(
        !shown.contains("s3cret") && !shown.contains("BEGIN"),
        "{shown}"
    );
    assert!(
        shown.contains("kubesink-dev"),
        "other values are shown: {shown}"
    );
    assert_eq!(
        c.render().get("sasl.oauthbearer.client.secret"),
        Some("oauth-s3cret")
    );
    for p in [
        "sasl.password",
        "ssl.key.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "ssl.keystore.password",
        "ssl.key.pem",
    ] {
        assert!(is_secret_property(p), "{p}");
    }
    assert!(!is_secret_property("ssl.key.location"));
}

#[test]
fn turning_tls_verification_off_is_warned_about() {
    let c = parse(r#"{"bootstrap_servers": "b:9092"}"#);
    assert!(c.warnings(0).is_empty());
    let c = parse(
        r#"{"bootstrap_servers": "b:9092", "security": {"protocol": "ssl"}, "librdkafka": {
            "enable.ssl.certificate.verification": "false",
            "ssl.endpoint.identification.algorithm": "none"}}"#,
    );
    let w = c.warnings(1).join("\n");
    assert!(
        w.contains("sinks[1] (kafka): librdkafka.\"enable.ssl.certificate.verification\": TLS certificate verification is turned off"),
        "{w}"
    );
    assert!(w.contains("host name verification is turned off"), "{w}");
    assert_eq!(
        c.render().get("reconnect.backoff.max.ms"),
        Some(DEFAULT_RECONNECT_BACKOFF_MAX_MS)
    );
}

#[test]
fn statistics_are_on_for_the_producer_epoch_unless_the_passthrough_sets_them() {
    let c = parse(r#"{"bootstrap_servers": "b:9092"}"#);
    assert_eq!(
        c.render().get("statistics.interval.ms"),
        Some(DEFAULT_STATISTICS_INTERVAL_MS)
    );
    let c =
        parse(r#"{"bootstrap_servers": "b:9092", "librdkafka": {"statistics.interval.ms": "0"}}"#);
    let r = c.render();
    assert_eq!(r.get("statistics.interval.ms"), Some("0"));
    assert_eq!(
        r.0.iter()
            .filter(|(k, _)| k == "statistics.interval.ms")
            .count(),
        1,
        "set once: {r:?}"
    );
}

/// A passthrough credential given as a reference prints as itself, never as `"***"`: the
/// printed configuration, loaded again, must not run with the password `***`.
#[test]
fn passthrough_values_may_be_references_printed_as_themselves_and_the_mask_is_refused() {
    std::env::set_var("PASSTHROUGH_TEST_SECRET", "env-s3cret");
    let dir = std::env::temp_dir().join(format!("passthrough-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("keystore-password");
    std::fs::write(&key_file, "file-s3cret\n").unwrap();
    let c = parse(&format!(
        r#"{{"bootstrap_servers": "b:9092", "librdkafka": {{
            "sasl.oauthbearer.client.secret": {{"env": "PASSTHROUGH_TEST_SECRET"}},
            "ssl.keystore.password": {{"file": {:?}}},
            "ssl.key.password": "inline-s3cret",
            "client.id": "kubesink-dev"}}}}"#,
        key_file.display().to_string()
    ));
    let rendered = c.render();
    assert_eq!(
        rendered.get("sasl.oauthbearer.client.secret"),
        Some("env-s3cret")
    );
    assert_eq!(rendered.get("ssl.keystore.password"), Some("file-s3cret"));
    assert_eq!(rendered.get("ssl.key.password"), Some("inline-s3cret"));
    let printed = serde_json::to_value(&c.librdkafka).unwrap();
    assert_eq!(
        printed,
        serde_json::json!({
            "sasl.oauthbearer.client.secret": {"env": "PASSTHROUGH_TEST_SECRET"},
            "ssl.keystore.password": {"file": key_file.display().to_string()},
            "ssl.key.password": "***",
            "client.id": "kubesink-dev"
        })
    );
    assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");
    // The printed references load again to the same values; the mask is refused, naming
    // what to write instead.
    let again: Passthrough = serde_json::from_value(serde_json::json!({
        "sasl.oauthbearer.client.secret": printed["sasl.oauthbearer.client.secret"],
        "ssl.keystore.password": printed["ssl.keystore.password"],
    }))
    .unwrap();
    assert_eq!(
        again.get("ssl.keystore.password").map(String::as_str),
        Some("file-s3cret")
    );
    let masked = serde_json::from_value::<Passthrough>(printed).unwrap_err();
    assert!(
        masked
            .to_string()
            .contains("is the mask `kubesink check` prints"),
        "{masked}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rejected_property_is_named_without_its_value() {
    let e = KafkaError::ClientConfig(
        rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
        "not supported in this build".into(),
        "sasl.oauthbearer.client.secret".into(),
        "oauth-s3cret".into(),
    );
    let text = describe_error(&e);
    assert!(text.contains("sasl.oauthbearer.client.secret"), "{text}");
    assert!(!text.contains("oauth-s3cret"), "{text}");
}

#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_sasl_password_appears_in_no_log_line() {
    // A closed port: the producer logs its connection attempts and failures.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let buf = LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    // Global, because librdkafka logs from its own threads.
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let mut c = sasl_config(&format!("127.0.0.1:{port}"));
    c.healthcheck_timeout = HumanDuration::from_millis(500);
    let sink = Arc::new(c.build_sink(0).unwrap());
    let text = || String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
    // What the bridge's readiness probe does: run the healthcheck, log the error.
    let err = sink.healthcheck().await.expect_err("no broker");
    tracing::warn!(error = %err, "sink not ready");
    wait_for(
        "the outage logged from librdkafka's connection failures",
        Duration::from_secs(20),
        || text().contains("Kafka brokers unreachable"),
    )
    .await;
    let t = text();
    assert!(
        t.contains("sasl.username"),
        "the rendered config is logged: {t}"
    );
    assert!(!t.contains("hunter2"), "password leaked:\n{t}");
}

// ---- classification ----

#[test]
fn errors_are_classified_too_large_fatal_or_transient() {
    use rdkafka::error::RDKafkaErrorCode as C;
    let e = |c| KafkaError::MessageProduction(c);
    assert_eq!(
        classify(&e(C::MessageSizeTooLarge), "t"),
        SendFailure::TooLarge
    );
    for c in [
        C::TopicAuthorizationFailed,
        C::SaslAuthenticationFailed,
        C::UnknownTopicOrPartition,
        C::UnknownTopic,
        C::SSL,
    ] {
        assert!(
            matches!(classify(&e(c), "t"), SendFailure::Fatal(_)),
            "{c:?}"
        );
    }
    for c in [
        C::MessageTimedOut,
        C::NotLeaderForPartition,
        C::AllBrokersDown,
        C::RequestTimedOut,
    ] {
        assert!(
            matches!(classify(&e(c), "t"), SendFailure::Transient(_)),
            "{c:?}"
        );
    }
    let m = match classify(&e(C::TopicAuthorizationFailed), "kubesink.prod") {
        SendFailure::Fatal(m) => m,
        other => panic!("{other:?}"),
    };
    assert!(m.contains("kubesink.prod") && m.contains("ACL"), "{m}");
}

// ---- mock cluster ----

async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sink_for(servers: &str, tweak: impl FnOnce(&mut KafkaConfig)) -> KafkaSink {
    let mut c = KafkaConfig {
        bootstrap_servers: servers.into(),
        topic: "topology".into(),
        message_timeout: HumanDuration::from_millis(3000),
        ..Default::default()
    };
    tweak(&mut c);
    assert!(c.validate(0).is_empty(), "{:?}", c.validate(0));
    c.build_sink(0).unwrap()
}

/// (partition, key, value, op header) of every record in `topic`, read from the start.
#[derive(Debug, Clone)]
struct Rec {
    partition: i32,
    key: String,
    value: Option<String>,
    headers: HashMap<String, String>,
}

fn read_all(servers: &str, topic: &str, partitions: i32, want: usize) -> Vec<Rec> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", "kubesink-test")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.len() < want && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Rec {
                partition: m.partition(),
                key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                value: m.payload().map(|p| String::from_utf8_lossy(p).into_owned()),
                headers,
            });
        }
    }
    // Anything beyond `want` would be a duplicate: give it a moment to show up.
    let extra_deadline = std::time::Instant::now() + Duration::from_millis(500);
    while std::time::Instant::now() < extra_deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            out.push(Rec {
                partition: m.partition(),
                key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                value: m.payload().map(|p| String::from_utf8_lossy(p).into_owned()),
                headers: HashMap::new(),
            });
        }
    }
    out
}

fn batch(names: usize, rv: u64) -> Vec<Message> {
    (0..names)
        .map(|i| msg(Op::Updated, &format!("pod-{i}"), rv))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_carry_key_headers_and_a_tombstone_follows_each_delete() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("topology", 3, 1).unwrap();
    let servers = mock.bootstrap_servers();
    let sink = sink_for(&servers, |_| {});
    let b = vec![msg(Op::Added, "a", 1), msg(Op::Deleted, "a", 2)];
    sink.send(&b).await.unwrap();
    sink.healthcheck().await.unwrap();
    sink.close().await.unwrap();
    let recs = tokio::task::spawn_blocking(move || read_all(&servers, "topology", 3, 3))
        .await
        .unwrap();
    assert_eq!(recs.len(), 3, "{recs:?}");
    assert!(recs.iter().all(|r| r.key == "prod-eu-1/core/Pod/default/a"));
    assert!(recs.iter().all(|r| r.partition == recs[0].partition));
    let ops: Vec<&str> = recs.iter().map(|r| r.headers["op"].as_str()).collect();
    assert_eq!(ops, ["added", "deleted", "tombstone"]);
    assert!(recs[2].value.is_none(), "tombstone has a null value");
    let t = &recs[2].headers;
    assert_eq!(
        (t["id"].as_str(), t["tombstone"].as_str()),
        ("a-2-tombstone", "true"),
        "a tombstone has its own id and says what it is"
    );
    assert!(!t.contains_key("content-type"));
    assert_eq!(recs[1].headers["id"], "a-2");
    assert_eq!(recs[0].headers["key"], "prod-eu-1/core/Pod/default/a");
    assert_eq!(recs[0].headers["group"], "");
    let h = &recs[0].headers;
    assert_eq!(h["kind"], "Pod");
    assert_eq!(h["apiVersion"], "v1");
    assert_eq!(h["cluster"], "prod-eu-1");
    assert_eq!(h["namespace"], "default");
    assert_eq!(h["name"], "a");
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(h["id"], "a-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_fails_the_batch_and_broker_up_lets_the_retry_succeed() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("topology", 1, 1).unwrap();
    let servers = mock.bootstrap_servers();
    let sink = sink_for(&servers, |c| {
        c.message_timeout = HumanDuration::from_millis(1500);
        c.healthcheck_timeout = HumanDuration::from_millis(1000);
    });
    sink.send(&batch(5, 1)).await.unwrap();
    mock.broker_down(1).unwrap();
    let err = sink.send(&batch(5, 2)).await.unwrap_err();
    assert!(
        matches!(err, SinkError::Transient { .. }),
        "broker down is transient: {err}"
    );
    assert!(
        sink.healthcheck().await.is_err(),
        "not ready while the broker is down"
    );
    assert!(
        sink.last_broker_error().is_some(),
        "librdkafka's client error is kept"
    );
    let ready = sink.ready_signal().expect("kafka has a ready signal");
    let before = ready.generation();
    mock.broker_up(1).unwrap();
    // The broker-up watcher notices within a few of its 500 ms polls.
    wait_for(
        "the ready signal after broker up",
        Duration::from_secs(20),
        || ready.generation() > before,
    )
    .await;
    assert_eq!(sink.last_broker_error(), None, "forgotten once it answers");
    sink.send(&batch(5, 2)).await.unwrap();
    sink.close().await.unwrap();
    let recs = tokio::task::spawn_blocking(move || read_all(&servers, "topology", 1, 10))
        .await
        .unwrap();
    // Every record of the retried batch arrived after the first batch's.
    let last: Vec<&str> = recs[recs.len() - 5..]
        .iter()
        .map(|r| r.value.as_deref().unwrap_or_default())
        .collect();
    assert!(
        last.iter().all(|v| v.contains("\"resourceVersion\":\"2\"")),
        "{last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_retriable_produce_errors_are_retried_without_duplicates_or_reordering() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("topology", 1, 1).unwrap();
    let servers = mock.bootstrap_servers();
    let sink = sink_for(&servers, |_| {});
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        ],
    );
    let mut all = Vec::new();
    for rv in 1..=4 {
        let b = batch(20, rv);
        sink.send(&b).await.unwrap();
        all.extend(b);
    }
    sink.close().await.unwrap();
    let recs = tokio::task::spawn_blocking(move || read_all(&servers, "topology", 1, 80))
        .await
        .unwrap();
    let got: Vec<String> = recs.iter().filter_map(|r| r.value.clone()).collect();
    let want: Vec<String> = all
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(got, want, "exactly once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_mid_stream_keeps_per_key_order() {
    let mock = MockCluster::new(3).unwrap();
    mock.create_topic("topology", 3, 3).unwrap();
    let servers = mock.bootstrap_servers();
    let sink = sink_for(&servers, |_| {});
    for rv in 1..=10u64 {
        if rv == 4 || rv == 7 {
            for p in 0..3 {
                mock.partition_leader("topology", p, Some(((p + rv as i32) % 3) + 1))
                    .unwrap();
            }
        }
        let b = batch(10, rv);
        let mut tries = 0;
        while let Err(e) = sink.send(&b).await {
            tries += 1;
            assert!(tries < 20, "{e}");
        }
    }
    sink.close().await.unwrap();
    let recs = tokio::task::spawn_blocking(move || read_all(&servers, "topology", 3, 100))
        .await
        .unwrap();
    let mut last: HashMap<String, (i32, u64)> = HashMap::new();
    for r in &recs {
        let v = r.value.as_deref().unwrap_or_default();
        let rv: u64 = v
            .split("\"resourceVersion\":\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        if let Some((p, prev)) = last.get(&r.key) {
            assert_eq!(*p, r.partition, "one key, one partition");
            assert!(rv >= *prev, "{} went back from {prev} to {rv}", r.key);
        }
        last.insert(r.key.clone(), (r.partition, rv));
    }
    assert_eq!(last.len(), 10);
    assert!(last.values().all(|(_, rv)| *rv == 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_full_waits_for_deliveries_and_confirms_everything() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("topology", 2, 1).unwrap();
    mock.broker_round_trip_time(1, Duration::from_millis(20))
        .unwrap();
    let servers = mock.bootstrap_servers();
    let sink = sink_for(&servers, |c| c.queue_max_messages = 5);
    let b = batch(300, 1);
    sink.send(&b).await.unwrap();
    assert!(sink.queue_full_waits() > 0, "the queue did fill up");
    sink.close().await.unwrap();
    let recs = tokio::task::spawn_blocking(move || read_all(&servers, "topology", 2, 300))
        .await
        .unwrap();
    assert_eq!(recs.len(), 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_message_max_bytes_is_reported_too_large_with_its_index() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("topology", 1, 1).unwrap();
    let sink = sink_for(&mock.bootstrap_servers(), |c| c.message_max_bytes = 4000);
    assert_eq!(sink.max_message_bytes(), Some(4000 - RECORD_OVERHEAD_BYTES));
    let mut b = batch(3, 1);
    b[1].payload = Bytes::from(vec![b'x'; 10_000]);
    match sink.send(&b).await {
        Err(SinkError::TooLarge { index, size, .. }) => {
            assert_eq!((index, size), (1, 10_000));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_authorization_failure_is_fatal_and_names_the_topic() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("topology", 1, 1).unwrap();
    let sink = sink_for(&mock.bootstrap_servers(), |c| {
        c.message_timeout = HumanDuration::from_millis(2000)
    });
    mock.topic_error(
        "topology",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
    )
    .unwrap();
    let err = sink.send(&batch(2, 1)).await.unwrap_err();
    assert!(err.is_fatal(), "{err}");
    assert!(err.to_string().contains("topology"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_against_a_dead_broker_succeeds_and_reports_not_ready() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = KafkaConfig {
        bootstrap_servers: format!("127.0.0.1:{port}"),
        healthcheck_timeout: HumanDuration::from_millis(500),
        ..Default::default()
    };
    let sink = Destination::build(&c, 0)
        .await
        .expect("no connection is needed to build");
    let err = sink.healthcheck().await.unwrap_err();
    assert!(!err.is_fatal(), "{err}");
    assert!(err.to_string().contains(&port.to_string()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_reports_the_records_it_could_not_flush_before_its_deadline() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("topology", 1, 1).unwrap();
    let sink = Arc::new(sink_for(&mock.bootstrap_servers(), |c| {
        c.flush_timeout = HumanDuration::from_millis(300);
        c.message_timeout = HumanDuration::from_secs(30);
    }));
    sink.send(&batch(2, 1)).await.unwrap();
    mock.broker_down(1).unwrap();
    let s = sink.clone();
    let pending = tokio::spawn(async move { s.send(&batch(5, 2)).await });
    wait_for("records queued", Duration::from_secs(10), || {
        sink.in_flight() >= 5
    })
    .await;
    let err = sink.close().await.unwrap_err();
    assert!(
        err.to_string()
            .contains("not delivered within flush_timeout"),
        "{err}"
    );
    pending.abort();
}

/// A TLS file that is there but unusable must not pass `check` and the start unnoticed:
/// librdkafka refuses it when the producer is created, so `validate` names it, at its key,
/// with librdkafka's reason. Real PEM files made by `openssl`.
#[test]
fn tls_files_that_are_there_but_unusable_are_named_at_their_keys() {
    let dir = std::env::temp_dir().join(format!("kubesink-kafka-pem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name).display().to_string();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("openssl must be installed (scripts/test.sh installs it)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "key.pem",
                "-out",
                "cert.pem",
                "-days",
                "1",
                "-subj",
                "/CN=kubesink-test",
            ],
        ]
        .concat(),
    );
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-out",
        "other.pem",
    ]);
    std::fs::write(dir.join("garbage.pem"), "not PEM at all\n").unwrap();
    let security = |ca: &str, cert: &str, key: &str| KafkaSecurity {
        protocol: Protocol::Ssl,
        ssl_ca_location: Some(path(ca)),
        ssl_certificate_location: Some(path(cert)),
        ssl_key_location: Some(path(key)),
        ..Default::default()
    };
    assert_eq!(
        config::tls_file_problems(&security("cert.pem", "cert.pem", "key.pem")),
        [],
        "usable files"
    );
    let found = config::tls_file_problems(&security("garbage.pem", "cert.pem", "other.pem"));
    let keys: Vec<&str> = found.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        ["security.ssl_ca_location", "security.ssl_key_location"],
        "{found:?}"
    );
    assert!(
        found[0].1.starts_with(&format!(
            "librdkafka cannot use {}: ssl.ca.location failed",
            path("garbage.pem")
        )) && found[1].1.starts_with(&format!(
            "librdkafka cannot use {}: ssl.key.location failed",
            path("other.pem")
        )),
        "{found:?}"
    );
    let found = config::tls_file_problems(&security("cert.pem", "garbage.pem", "key.pem"));
    assert_eq!(
        found.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        ["security.ssl_certificate_location"],
        "{found:?}"
    );
    // Not read without TLS; a file that is not there is `files()`'s finding.
    let mut plain = security("garbage.pem", "garbage.pem", "other.pem");
    plain.protocol = Protocol::Plaintext;
    assert_eq!(config::tls_file_problems(&plain), []);
    let mut missing = security("cert.pem", "cert.pem", "key.pem");
    missing.ssl_ca_location = Some(path("nonexistent.pem"));
    assert_eq!(config::tls_file_problems(&missing), []);
    std::fs::remove_dir_all(&dir).unwrap();
}
