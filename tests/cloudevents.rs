//! The opt-in CloudEvents binding (`format` of a sink) end to end: the simulator → kubesink
//! with three sinks of one broker (`json`, `cloudevents`, `cloudevents-structured`) → a real
//! nats-server or tansu, read back. Every event must be a valid CloudEvent by the official
//! Rust SDK's deserializer, carry the documented attributes, and its data must equal the
//! `json` sink's payload of the same message, byte for byte in binary mode.

use kubesink_test_support::{self as support, nats_server};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudevents::{AttributesReader, Data};
use kubesink::config::SinkConfig;
use kubesink::config::{Config, ResourceConfig};
use kubesink_core::cloudevents::DATASCHEMA;
use kubesink_core::{Format, Sink};
use kubesink_sim::{SimConfig, Workload};
use serde_json::{Map, Value};
use support::*;

const LONG: Duration = Duration::from_secs(60);
const KINDS: [(&str, &str); 3] = [("v1", "Pod"), ("apps/v1", "Deployment"), ("v1", "Node")];

fn workload() -> Workload {
    Workload {
        namespaces: 2,
        pods: 20,
        deployments: 3,
        nodes: 2,
        seed: 21,
        ..Default::default()
    }
}

/// 25 objects and one sync marker per kind.
const EXPECTED: usize = 25 + 3;

fn test_config(c: &Cluster) -> Config {
    let mut cfg = config(
        &c.kubeconfig,
        KINDS
            .iter()
            .map(|(a, k)| ResourceConfig::new(a, k))
            .collect(),
    );
    cfg.pipeline.sync_markers = true;
    cfg
}

async fn start(cfg: &Config, sinks: Vec<Arc<dyn Sink>>) -> kubesink::bridge::Bridge {
    let client = kubesink::cluster::client(&cfg.clusters()[0]).await.unwrap();
    kubesink::bridge::Bridge::start(&plan(cfg), client, sinks)
        .await
        .unwrap()
}

/// Checks one CloudEvent, given as its attributes (from headers or the envelope) and its
/// data, against the topology message `json` (the `json` sink's payload of the same message):
/// the SDK accepts it and every attribute is the documented one.
fn check_event(attrs: &Map<String, Value>, data: &Value, json: &Value) {
    let mut ev = attrs.clone();
    ev.insert("data".into(), data.clone());
    let e: cloudevents::Event = serde_json::from_value(Value::Object(ev.clone()))
        .unwrap_or_else(|err| panic!("not a valid CloudEvent ({err}): {ev:#?}"));
    assert_eq!(e.specversion().as_str(), "1.0");
    assert_eq!(Some(e.id()), json["id"].as_str());
    assert_eq!(e.source(), "kubesink://test");
    assert_eq!(
        e.ty(),
        format!("io.kubesink.topology.{}", json["op"].as_str().unwrap())
    );
    assert_eq!(e.subject(), json["key"].as_str());
    assert_eq!(
        attrs["time"], json["observedAt"],
        "time is observedAt verbatim"
    );
    assert!(e.time().is_some());
    assert_eq!(e.datacontenttype(), Some("application/json"));
    assert_eq!(e.dataschema().map(|u| u.as_str()), Some(DATASCHEMA));
    match e.data() {
        Some(Data::Json(v)) => assert_eq!(v, json, "data is the message"),
        other => panic!("data is not JSON: {other:?}"),
    }
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("JSON")
}

mod nats {
    use super::*;
    use futures::StreamExt;
    use kubesink_nats::{NatsConfig, NatsMode};
    use nats_server::NatsServer;

    /// One received NATS message: subject, headers (name → value), payload.
    type Got = (String, HashMap<String, String>, Vec<u8>);

    /// Inverts the NATS binding's percent-encoding of header values.
    fn percent_decode(v: &str) -> String {
        let b = v.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    async fn subscribe(client: &async_nats::Client, prefix: &str) -> Arc<Mutex<Vec<Got>>> {
        let mut sub = client.subscribe(format!("{prefix}.>")).await.unwrap();
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let g = got.clone();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let headers = m
                    .headers
                    .iter()
                    .flat_map(|h| h.iter())
                    .flat_map(|(k, vs)| {
                        vs.iter()
                            .map(|v| (k.to_string(), v.as_str().to_owned()))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                g.lock()
                    .unwrap()
                    .push((m.subject.to_string(), headers, m.payload.to_vec()));
            }
        });
        got
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nats_binary_and_structured_events_carry_the_json_formats_payload() {
        let server = NatsServer::start("");
        let c = cluster(SimConfig::default()).await;
        c.sim.populate(&workload()).unwrap();
        let mut cfg = test_config(&c);
        let sink = |prefix: &str, format: Format| {
            SinkConfig::Nats(NatsConfig {
                name: prefix.into(),
                servers: vec![server.url()],
                mode: NatsMode::Core,
                subject: format!("{prefix}.{{cluster}}.{{group}}.{{kind}}.{{namespace}}.{{name}}"),
                format,
                ..Default::default()
            })
        };
        cfg.sinks = vec![
            sink("json", Format::Json),
            sink("ce", Format::CloudEvents),
            sink("ces", Format::CloudEventsStructured),
        ];
        let consumer = async_nats::connect(server.url()).await.unwrap();
        let (plain, binary, structured) = (
            subscribe(&consumer, "json").await,
            subscribe(&consumer, "ce").await,
            subscribe(&consumer, "ces").await,
        );
        consumer.flush().await.unwrap();
        let mut sinks = Vec::new();
        for (i, s) in cfg.sinks.iter().enumerate() {
            sinks.push(s.build(i).await.unwrap());
        }
        let bridge = start(&cfg, sinks).await;
        wait_for("every sink delivered the lists", LONG, || {
            [&plain, &binary, &structured]
                .iter()
                .all(|g| g.lock().unwrap().len() >= EXPECTED)
        })
        .await;
        bridge.shutdown().await;

        let by_id: HashMap<String, Vec<u8>> = plain
            .lock()
            .unwrap()
            .iter()
            .map(|(_, h, p)| (h["id"].clone(), p.clone()))
            .collect();
        assert_eq!(by_id.len(), EXPECTED);

        for (subject, h, payload) in binary.lock().unwrap().iter() {
            let same = &by_id[&h["ce-id"]];
            assert_eq!(
                payload, same,
                "{subject}: the payload is the json format's, byte for byte"
            );
            assert_eq!(h["content-type"], "application/json");
            let attrs: Map<String, Value> = h
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix("ce-")
                        .map(|a| (a.to_owned(), Value::String(percent_decode(v))))
                })
                .collect();
            assert_eq!(attrs.len(), 8, "{subject}: {h:?}");
            let message = json(payload);
            check_event(&attrs, &message, &message);
            if message["op"] == "synced" {
                assert!(
                    h["ce-subject"].ends_with("/%25synced"),
                    "percent-encoded: {h:?}"
                );
            }
            // kubesink's own headers stay, with the new key and group.
            assert_eq!(Some(h["key"].as_str()), message["key"].as_str());
            assert_eq!(Some(h["group"].as_str()), message["group"].as_str());
        }

        for (subject, h, payload) in structured.lock().unwrap().iter() {
            assert_eq!(h["content-type"], "application/cloudevents+json");
            assert!(!h.keys().any(|k| k.starts_with("ce-")), "{subject}: {h:?}");
            let Value::Object(mut envelope) = json(payload) else {
                panic!("{subject}: not an object")
            };
            let data = envelope.remove("data").expect("data");
            let message = json(&by_id[envelope["id"].as_str().unwrap()]);
            check_event(&envelope, &data, &message);
        }
    }
}

#[cfg(feature = "kafka")]
mod kafka {
    use super::*;
    use kubesink_kafka::KafkaConfig;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message as _};
    use rdkafka::{Offset, TopicPartitionList};
    use support::kafka_server::Tansu;

    /// One record: headers, value (`None`: tombstone), timestamp in ms.
    type Got = (HashMap<String, String>, Option<Vec<u8>>, Option<i64>);

    /// Reads every record of `topic` (one partition) until `n` arrived or `LONG` passed.
    fn read(bootstrap: &str, topic: &str, n: usize) -> Vec<Got> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "kubesink-cloudevents-test")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let deadline = std::time::Instant::now() + LONG;
        let mut out = Vec::new();
        while out.len() < n && std::time::Instant::now() < deadline {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            let v = String::from_utf8_lossy(h.value.unwrap_or_default());
                            (h.key.to_owned(), v.into_owned())
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push((
                headers,
                m.payload().map(<[u8]>::to_vec),
                m.timestamp().to_millis(),
            ));
        }
        out
    }

    fn observed_at_ms(message: &Value) -> i64 {
        let t = humantime::parse_rfc3339(message["observedAt"].as_str().unwrap()).unwrap();
        let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
        i64::try_from(d.as_millis()).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kafka_binary_and_structured_events_carry_the_json_formats_payload() {
        let broker = Tansu::start().await;
        let c = cluster(SimConfig::default()).await;
        c.sim.populate(&workload()).unwrap();
        let mut cfg = test_config(&c);
        let sink = |topic: &str, format: Format| {
            SinkConfig::Kafka(KafkaConfig {
                name: topic.into(),
                bootstrap_servers: broker.bootstrap.clone(),
                topic: topic.into(),
                format,
                ..Default::default()
            })
        };
        cfg.sinks = vec![
            sink("json", Format::Json),
            sink("ce", Format::CloudEvents),
            sink("ces", Format::CloudEventsStructured),
        ];
        for t in ["json", "ce", "ces"] {
            broker.create_topic(t, 1).await;
        }
        let mut sinks = Vec::new();
        for (i, s) in cfg.sinks.iter().enumerate() {
            sinks.push(s.build(i).await.unwrap());
        }
        let bridge = start(&cfg, sinks).await;
        // One delete, for a `deleted` record and its tombstone.
        let pod = c.sim.objects("v1", "Pod").remove(0);
        let (ns, name) = (
            pod["metadata"]["namespace"].as_str().unwrap().to_owned(),
            pod["metadata"]["name"].as_str().unwrap().to_owned(),
        );
        wait_for("the lists delivered", LONG, || {
            bridge.pipeline().sinks().iter().all(|s| {
                s.stats()
                    .delivered
                    .load(std::sync::atomic::Ordering::SeqCst)
                    >= EXPECTED as u64
            })
        })
        .await;
        c.sim.delete("v1", "Pod", Some(&ns), &name).unwrap();
        let n = EXPECTED + 2; // + deleted + tombstone
        let bootstrap = broker.bootstrap.clone();
        let (plain, binary, structured) = tokio::task::spawn_blocking(move || {
            (
                read(&bootstrap, "json", n),
                read(&bootstrap, "ce", n),
                read(&bootstrap, "ces", n),
            )
        })
        .await
        .unwrap();
        bridge.shutdown().await;
        assert_eq!(
            (plain.len(), binary.len(), structured.len()),
            (n, n, n),
            "records per topic"
        );

        let mut by_id: HashMap<String, Vec<u8>> = HashMap::new();
        for (h, v, ts) in &plain {
            match v {
                Some(v) => {
                    let m = json(v);
                    assert_eq!(*ts, Some(observed_at_ms(&m)), "timestamp = observedAt");
                    by_id.insert(h["id"].clone(), v.clone());
                }
                None => assert_eq!(h["tombstone"], "true"),
            }
        }
        let deleted = plain
            .iter()
            .find(|(h, v, _)| v.is_some() && h["op"] == "deleted")
            .expect("the deleted record");
        let tombstone = plain
            .iter()
            .find(|(_, v, _)| v.is_none())
            .expect("the tombstone");
        let (dh, th) = (&deleted.0, &tombstone.0);
        assert_eq!(th["op"], "tombstone");
        assert_eq!(th["id"].len(), 32);
        assert_ne!(th["id"], dh["id"], "a tombstone has its own id");
        assert_eq!(
            (th["key"].as_str(), &tombstone.2),
            (dh["key"].as_str(), &deleted.2)
        );

        for (h, v, ts) in &binary {
            let Some(v) = v else {
                assert!(
                    !h.keys().any(|k| k.starts_with("ce_")),
                    "a tombstone is no event"
                );
                continue;
            };
            assert_eq!(v, &by_id[&h["ce_id"]], "the value is the json format's");
            assert_eq!(h["content-type"], "application/json");
            let mut attrs: Map<String, Value> = h
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix("ce_")
                        .map(|a| (a.to_owned(), Value::String(v.clone())))
                })
                .collect();
            attrs.insert("datacontenttype".into(), h["content-type"].clone().into());
            let message = json(v);
            assert_eq!(*ts, Some(observed_at_ms(&message)));
            check_event(&attrs, &message, &message);
        }

        for (h, v, ts) in &structured {
            let Some(v) = v else { continue };
            assert_eq!(h["content-type"], "application/cloudevents+json");
            let Value::Object(mut envelope) = json(v) else {
                panic!("not an object")
            };
            let data = envelope.remove("data").expect("data");
            let message = json(&by_id[envelope["id"].as_str().unwrap()]);
            assert_eq!(*ts, Some(observed_at_ms(&message)));
            check_event(&envelope, &data, &message);
        }
    }
}
