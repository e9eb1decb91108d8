//! Security end to end, with the `kubesink` binary against the simulator, a real
//! nats-server and a real Kafka-protocol broker (tansu):
//!
//! - a Secret created the way `kubectl apply` creates it (its whole manifest, data
//!   included, in the `last-applied-configuration` annotation) leaves kubesink without its
//!   values through every payload mode (full, metadata, fields with pointers into the data
//!   and the annotations) and every sink (stdout, NATS, Kafka), and under every spelling of
//!   its apiVersion that `kubesink check` accepts;
//! - credentials (Kafka SASL password and credential passthrough properties, NATS token, nkey
//!   seed and credentials file, kubeconfig token and client key) appear in no log line, no
//!   `kubesink check` output, no metric, no health answer and no error.
#![cfg(all(feature = "nats", feature = "kafka"))]

use kubesink_test_support::{self as support, kafka_server, nats_server, process};

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use kafka_server::{Reader, Tansu};
use kubesink_sim::SimConfig;
use nats_server::NatsServer;
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kubesink");
const LONG: Duration = Duration::from_secs(90);

fn kubesink() -> Command {
    let mut c = process::clean_command(BIN);
    c.env("NO_COLOR", "1");
    c
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// `GET path` on `addr`, the whole response.
fn http_get(addr: &str, path: &str) -> String {
    let Ok(mut conn) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(conn, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut text = String::new();
    let _ = conn.read_to_string(&mut text);
    text
}

fn metrics_addr(log: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains("serving /metrics"))
        .and_then(|l| l.split("addr=").nth(1))
        .map(|a| a.split_whitespace().next().unwrap_or_default().to_owned())
}

const PASSWORD: &str = "hunter2-PW-42";

/// A Secret as `kubectl apply -f` creates it: the applied manifest, compact JSON and a
/// newline, in `kubectl.kubernetes.io/last-applied-configuration`.
fn applied_secret(namespace: &str) -> Value {
    let manifest = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": namespace, "annotations": {"team": "payments"}},
        "type": "Opaque", "data": {"password": b64(PASSWORD)}});
    let mut object = manifest.clone();
    object["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
        json!(format!("{manifest}\n"));
    object
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_secret_leaves_through_no_payload_mode_and_no_sink() {
    let broker = Tansu::start().await;
    broker.create_topic("kubesink.sec", 1).await;
    let nats = NatsServer::start("");
    let c = cluster(SimConfig::default()).await;
    for ns in ["full", "meta", "fields"] {
        c.sim.create(applied_secret(ns)).unwrap();
    }
    let subscriber = async_nats::connect(nats.url()).await.unwrap();
    let mut sub = subscriber.subscribe("kubesink.>").await.unwrap();
    subscriber.flush().await.unwrap();
    let reader = Reader::start(&broker.bootstrap, "kubesink.sec", 1);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("k.toml");
    let secrets = |ns: &str| process::resource_toml("v1", "Secret", &[ns]);
    let (full, meta, fields) = (secrets("full"), secrets("meta"), secrets("fields"));
    std::fs::write(
        &file,
        format!(
            r#"[cluster]
name = "sec"
kubeconfig = {kubeconfig:?}
[server]
listen = "127.0.0.1:0"
{full}{meta}payload = "metadata"
{fields}payload = "fields"
fields = ["/data/password", "/data", "/metadata/annotations", "/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration", "/type"]
[[sinks]]
type = "stdout"
[[sinks]]
type = "nats"
mode = "core"
servers = ["{nats}"]
[[sinks]]
type = "kafka"
bootstrap_servers = "{kafka}"
"#,
            kubeconfig = c.kubeconfig.display().to_string(),
            nats = nats.url(),
            kafka = broker.bootstrap,
        ),
    )
    .unwrap();
    let stderr_path = dir.path().join("stderr.log");
    let mut child = kubesink()
        .args(["run", "--log-level", "debug", "--config"])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut out: Vec<(&str, Value)> = Vec::new();
    tokio::time::timeout(LONG, async {
        while out.iter().filter(|(s, _)| *s == "stdout").count() < 3 {
            let l = lines.next_line().await.unwrap().expect("stdout open");
            out.push(("stdout", serde_json::from_str(&l).unwrap()));
        }
        while out.iter().filter(|(s, _)| *s == "nats").count() < 3 {
            let m = sub.next().await.expect("message");
            out.push(("nats", serde_json::from_slice(&m.payload).unwrap()));
        }
    })
    .await
    .expect("stdout and NATS deliver the three Secrets");
    wait_for("Kafka delivers the three Secrets", LONG, || {
        reader.len() >= 3
    })
    .await;
    for r in reader.records() {
        out.push(("kafka", serde_json::from_slice(&r.value.unwrap()).unwrap()));
    }
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    let addr = metrics_addr(&log).expect("metrics address logged");
    let metrics = http_get(&addr, "/metrics");
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = tokio::time::timeout(LONG, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let log = std::fs::read_to_string(&stderr_path).unwrap();

    assert_eq!(out.len(), 9, "three Secrets through three sinks: {out:?}");
    for (sink, m) in &out {
        let ns = m["namespace"].as_str().unwrap();
        let object = &m["object"];
        assert_eq!(object["kind"], "Secret", "{sink} {ns}");
        assert_eq!(
            object["metadata"]["annotations"]["team"], "payments",
            "{sink} {ns}: other annotations stay: {m}"
        );
        if ns == "fields" {
            assert_eq!(object["type"], "Opaque", "{sink}: the pointers work: {m}");
        }
    }
    let everything = format!("{out:?}\n{log}\n{metrics}");
    for leak in [PASSWORD, &b64(PASSWORD), "last-applied-configuration"] {
        assert!(
            !out.iter().any(|(_, m)| m.to_string().contains(leak)),
            "{leak:?} left kubesink in a message: {out:?}"
        );
        if leak != "last-applied-configuration" {
            assert!(!everything.contains(leak), "{leak:?} leaked:\n{everything}");
        }
    }
}

/// Spellings of core/v1's apiVersion a configuration may try. Each one `check` accepts must
/// keep Secret values out of every payload mode; each it rejects is named with its key and
/// file; and it accepts exactly `v1`.
const CORE_V1_SPELLINGS: &[&str] = &["v1", "/v1", " v1", "v1 ", "\tv1", "v1/", "//v1", "/v1/"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_check_accepts_for_core_v1_secrets_keeps_their_values_out_of_every_payload_mode(
) {
    let c = cluster(SimConfig::default()).await;
    for ns in ["full", "meta", "fields"] {
        c.sim.create(applied_secret(ns)).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let mut accepted = Vec::new();
    for (i, spelling) in CORE_V1_SPELLINGS.iter().enumerate() {
        let file = dir.path().join(format!("k{i}.toml"));
        std::fs::write(
            &file,
            format!(
                r#"[cluster]
name = "sec{i}"
kubeconfig = {kubeconfig:?}
[server]
listen = "127.0.0.1:0"
[log]
summary_interval = "0s"
[[resources]]
api_version = {spelling:?}
kind = "Secret"
namespaces = ["full"]
[[resources]]
api_version = {spelling:?}
kind = "Secret"
namespaces = ["meta"]
payload = "metadata"
[[resources]]
api_version = {spelling:?}
kind = "Secret"
namespaces = ["fields"]
payload = "fields"
fields = ["/data/password", "/data", "/metadata/annotations", "/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration", "/type"]
[[sinks]]
type = "stdout"
"#,
                kubeconfig = c.kubeconfig.display().to_string(),
            ),
        )
        .unwrap();
        let check = kubesink()
            .args(["check", "--config"])
            .arg(&file)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&check.stderr).into_owned();
        if check.status.code() != Some(0) {
            assert_eq!(check.status.code(), Some(1), "{spelling:?}: {stderr}");
            for j in 0..3 {
                assert!(
                    stderr.contains(&format!(
                        "resources.{j}.api_version: {spelling:?} is not an apiVersion"
                    )) && stderr.contains(&format!("(from file {})", file.display())),
                    "{spelling:?}: {stderr}"
                );
            }
            continue;
        }
        accepted.push(*spelling);

        // Accepted: run it; the three Secrets arrive without their values.
        let mut child = kubesink()
            .args(["run", "--config"])
            .arg(&file)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut out: Vec<Value> = Vec::new();
        tokio::time::timeout(LONG, async {
            while out.len() < 3 {
                let l = lines.next_line().await.unwrap().expect("stdout open");
                out.push(serde_json::from_str(&l).unwrap());
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{spelling:?}: the three Secrets within {LONG:?}: {out:?}"));
        child.kill().await.unwrap();
        let namespaces: std::collections::BTreeSet<&str> =
            out.iter().filter_map(|m| m["namespace"].as_str()).collect();
        assert_eq!(
            namespaces.len(),
            3,
            "{spelling:?}: one per payload mode: {out:?}"
        );
        for m in &out {
            let text = m.to_string();
            for leak in [PASSWORD, &b64(PASSWORD), "last-applied-configuration"] {
                assert!(
                    !text.contains(leak),
                    "{spelling:?}: {leak:?} left kubesink: {m}"
                );
            }
            assert_eq!(m["object"]["kind"], "Secret", "{spelling:?}: {m}");
            assert_eq!(m["object"]["apiVersion"], "v1", "{spelling:?}: {m}");
        }
    }
    assert_eq!(
        accepted,
        ["v1"],
        "check accepts exactly one spelling of core/v1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_appear_in_no_log_check_output_metric_health_answer_or_error() {
    let dir = tempfile::tempdir().unwrap();
    nats_server::generate_certs(dir.path());
    let client_key = std::fs::read_to_string(dir.path().join("client-key.pem")).unwrap();
    let client_cert = std::fs::read_to_string(dir.path().join("client.pem")).unwrap();
    let nkey = nkeys::KeyPair::new_user();
    let seed = nkey.seed().unwrap();
    let creds_seed = nkeys::KeyPair::new_user().seed().unwrap();
    let creds_jwt = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJDUkVEUy1KV1QtU0VDUkVUNyJ9.c2lnbmF0dXJl";
    let creds = dir.path().join("user.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{creds_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{creds_seed}\n------END USER NKEY SEED------\n"
        ),
    )
    .unwrap();
    let token = "nats-token-SECRET5";
    let secrets: Vec<String> = vec![
        "kafka-sasl-pw-SECRET1".into(),
        "oauth-client-SECRET2".into(),
        "keystore-pw-SECRET3".into(),
        token.into(),
        seed.clone(),
        creds_seed.clone(),
        creds_jwt.into(),
        "kube-token-SECRET6".into(),
        b64(&client_key),
        client_key
            .lines()
            .nth(1)
            .expect("a line of the key")
            .to_owned(),
    ];

    let c = cluster(SimConfig::default()).await;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {"server": c.sim.url().unwrap()}}],
            "users": [{"name": "u", "user": {
                "token": "kube-token-SECRET6",
                "client-certificate-data": b64(&client_cert),
                "client-key-data": b64(&client_key)}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "u"}}],
            "current-context": "sim"
        })
        .to_string(),
    )
    .unwrap();
    let with_token = NatsServer::start(&format!("authorization {{ token: \"{token}\" }}\n"));
    let open = NatsServer::start("");
    let broker = Tansu::start().await;
    let config = dir.path().join("k.toml");
    std::fs::write(
        &config,
        format!(
            r#"[cluster]
name = "creds"
kubeconfig = {kubeconfig:?}
[server]
listen = "127.0.0.1:0"
[[resources]]
api_version = "v1"
kind = "ConfigMap"
[[sinks]]
type = "nats"
name = "nats-token"
mode = "core"
servers = ["{with_token}"]
[sinks.auth]
token = "{token}"
[[sinks]]
type = "nats"
name = "nats-nkey"
mode = "core"
servers = ["{open}"]
[sinks.auth]
nkey_seed = "{seed}"
[[sinks]]
type = "nats"
name = "nats-creds"
mode = "core"
servers = ["{open}"]
[sinks.auth]
credentials_file = {creds:?}
[[sinks]]
type = "kafka"
bootstrap_servers = "{kafka}"
message_timeout = "2s"
[sinks.security]
protocol = "sasl_plaintext"
sasl_mechanism = "PLAIN"
sasl_username = "kubesink"
sasl_password = "kafka-sasl-pw-SECRET1"
[sinks.librdkafka]
"sasl.oauthbearer.client.secret" = "oauth-client-SECRET2"
"ssl.keystore.password" = "keystore-pw-SECRET3"
"#,
            kubeconfig = kubeconfig.display().to_string(),
            with_token = with_token.url(),
            open = open.url(),
            creds = creds.display().to_string(),
            kafka = broker.bootstrap,
        ),
    )
    .unwrap();
    c.sim
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": "default"}}))
        .unwrap();

    // This build of librdkafka has no OAuth support: `check` and `run` refuse the property
    // alike, naming it but not its value.
    let mut rejected = String::new();
    for command in ["check", "run"] {
        let out = kubesink()
            .args([command, "--config"])
            .arg(&config)
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{command}: {text}");
        assert!(
            text.contains(
                "sinks.3.librdkafka.\"sasl.oauthbearer.client.secret\": librdkafka refuses it: "
            ),
            "{command}: {text}"
        );
        rejected.push_str(&text);
    }
    let without_oauth = std::fs::read_to_string(&config).unwrap().replace(
        "\"sasl.oauthbearer.client.secret\" = \"oauth-client-SECRET2\"\n",
        "",
    );
    std::fs::write(&config, without_oauth).unwrap();

    // `kubesink check`: the effective configuration, secrets masked.
    let check = kubesink()
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .await
        .unwrap();
    let check_text = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert_eq!(check.status.code(), Some(0), "{check_text}");
    assert!(
        check_text.contains("\"ssl.keystore.password\" = \"***\""),
        "{check_text}"
    );
    assert!(
        check_text.contains("warning: sinks[3] (kafka): security.protocol: sasl_plaintext"),
        "{check_text}"
    );

    // `kubesink run`, everything at debug level.
    let stderr_path = dir.path().join("stderr.log");
    let mut child = kubesink()
        .args(["run", "--log-level", "debug", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let addr = wait_until("the metrics address in the log", LONG, || {
        let found = match metrics_addr(&log()) {
            Some(a) => Ok(a),
            None => {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!(
                        "kubesink exited ({status}) before serving metrics; log:\n{}",
                        log()
                    );
                }
                Err(log())
            }
        };
        std::future::ready(found)
    })
    .await;
    wait_for(
        "the NATS sinks delivered and the Kafka sink failed",
        LONG,
        || {
            let m = http_get(&addr, "/metrics");
            ["nats-token", "nats-nkey", "nats-creds"].iter().all(|s| {
                metric(&m, "kubesink_sink_delivered_messages_total", &[("sink", s)])
                    .is_some_and(|v| v >= 1.0)
            }) && metric(&m, "kubesink_sink_errors_total", &[("sink", "kafka")])
                .is_some_and(|v| v >= 1.0)
        },
    )
    .await;
    let answers = format!(
        "{}\n{}\n{}",
        http_get(&addr, "/metrics"),
        http_get(&addr, "/readyz"),
        http_get(&addr, "/healthz")
    );
    assert!(
        answers.contains("Authentication"),
        "the Kafka problem is named: {answers}"
    );
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    tokio::time::timeout(LONG, child.wait())
        .await
        .unwrap()
        .unwrap();
    rejected.push_str(&log());
    let all = format!("{check_text}\n{rejected}\n{answers}");
    assert!(all.contains("kafka client error"), "errors were logged");
    for s in &secrets {
        assert!(!all.contains(s.as_str()), "{s:?} leaked:\n{all}");
    }

    // A start-up error with a rejected credential names the method, not the secret.
    let wrong = std::fs::read_to_string(&config).unwrap().replace(
        &format!("token = \"{token}\""),
        "token = \"wrong-token-SECRET8\"",
    );
    std::fs::write(&config, wrong).unwrap();
    let out = kubesink()
        .args(["run", "--log-level", "debug", "--config"])
        .arg(&config)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("auth: token"), "{text}");
    for s in secrets
        .iter()
        .map(String::as_str)
        .chain(["wrong-token-SECRET8"])
    {
        assert!(!text.contains(s), "{s:?} leaked:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_that_skips_tls_verification_is_warned_about_at_start() {
    let c = cluster(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {
                "server": c.sim.url().unwrap(), "insecure-skip-tls-verify": true}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "u"}}],
            "current-context": "sim"
        })
        .to_string(),
    )
    .unwrap();
    let mut child = kubesink()
        .args(["run"])
        .env("KUBESINK_CLUSTER__NAME", "insecure")
        .env("KUBESINK_CLUSTER__KUBECONFIG", &kubeconfig)
        .env("KUBESINK_SERVER__LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let warning = tokio::time::timeout(LONG, async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if l.contains("TLS verification of the API server is turned off") {
                return l;
            }
        }
        panic!("stderr closed without the warning");
    })
    .await
    .expect("the warning within the timeout");
    assert!(
        warning.contains("WARN") && warning.contains("insecure-skip-tls-verify"),
        "{warning}"
    );
}
