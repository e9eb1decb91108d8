//! A real Kafka-protocol broker for tests: tansu (crates.io, `cargo install tansu --features
//! dynostore`, built and cached by `scripts/test.sh`), started on a free port in a temp dir
//! and killed on drop; an optional TCP proxy in front of it to take "the broker" off the
//! network and back; topic creation through rdkafka's AdminClient; a background consumer.

use crate::ports::free_port;
use crate::proxy::Proxy;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};
use tokio::net::TcpStream;

/// The cached tansu binary: `$TANSU_BIN`, else
/// `${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}/tansu/bin/tansu`.
pub fn tansu_bin() -> PathBuf {
    if let Ok(p) = std::env::var("TANSU_BIN") {
        return p.into();
    }
    let cache = std::env::var("TOOLS_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/kubesink")
        });
    cache.join("tansu/bin/tansu")
}

/// A running tansu broker (memory storage engine).
pub struct Tansu {
    child: Child,
    /// Where the broker itself listens.
    pub broker_addr: SocketAddr,
    /// What clients use (the proxy's address when there is one).
    pub bootstrap: String,
    proxy: Option<Proxy>,
    dir: tempfile::TempDir,
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Tansu {
    /// Starts tansu on a free port and waits until it accepts connections.
    pub async fn start() -> Tansu {
        Self::start_inner(false).await
    }

    /// Starts tansu behind a TCP proxy: clients (and the advertised listener) use the
    /// proxy, so [`Tansu::disconnect`] takes the broker off the network without losing its
    /// in-memory log.
    pub async fn start_behind_proxy() -> Tansu {
        Self::start_inner(true).await
    }

    async fn start_inner(proxied: bool) -> Tansu {
        let bin = tansu_bin();
        assert!(
            bin.exists(),
            "tansu is not installed at {}: run scripts/test.sh (it builds and caches it) or \
             `cargo install tansu --features dynostore --locked --root ~/.cache/kubesink/tansu`",
            bin.display()
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let broker_addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let proxy = if proxied {
            Some(Proxy::start(broker_addr).await)
        } else {
            None
        };
        let advertised = proxy.as_ref().map_or(broker_addr, |p| p.addr);
        let child = spawn_tansu(&bin, dir.path(), broker_addr, advertised);
        let t = Tansu {
            child,
            broker_addr,
            bootstrap: advertised.to_string(),
            proxy,
            dir,
        };
        t.wait_accepting().await;
        t
    }

    async fn wait_accepting(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(self.broker_addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not accept connections within 30 s; log: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the broker (SIGKILL): its connections close, its port refuses connections until
    /// [`Tansu::restart_empty`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the broker and starts a new one on the same address with an empty memory
    /// engine: every topic, record and producer id is gone (what a broker that lost its
    /// state looks like to clients; create the topics again). Its stderr is appended to the
    /// same log.
    pub async fn restart_empty(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let advertised: SocketAddr = self.bootstrap.parse().expect("bootstrap address");
        // The listening port is free once the process is gone: measured, the new broker
        // binds it at once although the clients' connections to the old one were open.
        self.child = spawn_tansu(&tansu_bin(), self.dir.path(), self.broker_addr, advertised);
        self.wait_accepting().await;
    }

    /// The broker's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tansu.log")).unwrap_or_default()
    }

    /// Creates `topic` with `partitions` partitions (replication 1) through the admin API.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .expect("admin client");
        let res = admin
            .create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("create_topics");
        for r in res {
            r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
        }
    }

    /// Makes every partition's high watermark cover the records already in it, by producing
    /// one record (`{"op": "test-flush"}`, which every consumer skips as an op it does not
    /// know) to each. tansu 0.6 (memory engine) reports a high watermark that can stay below
    /// the last records of a multi-record batch until the partition receives another batch:
    /// measured, 4 partitions after bursts of idempotent, lz4 batches and 2 s of quiet,
    /// "last offset read 177, high watermark 175" (real Kafka advances it at the acks=all
    /// commit). Consumers that stop at the high watermark read at start (kubesink fold, the
    /// example consumers) then miss those records for as long as the topic stays quiet; this
    /// is what a test calls before it checks a caught-up view. The flush record goes alone in
    /// its batch, so it is covered too.
    pub async fn flush_high_watermarks(&self, topic: &str, partitions: i32) {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("linger.ms", "0")
            .create()
            .expect("producer");
        for p in 0..partitions {
            producer
                .send(
                    FutureRecord::to(topic)
                        .key("test-flush")
                        .partition(p)
                        .payload(r#"{"op":"test-flush"}"#),
                    Duration::from_secs(10),
                )
                .await
                .unwrap_or_else(|(e, _)| panic!("flush record to {topic}/{p}: {e}"));
        }
    }

    /// Takes the broker off the network: the proxy closes every connection and stops
    /// listening (clients get "connection refused").
    pub fn disconnect(&mut self) {
        self.proxy.as_mut().expect("started behind a proxy").stop();
    }

    /// Puts the broker back on the network (same address).
    pub async fn reconnect(&mut self) {
        self.proxy
            .as_mut()
            .expect("started behind a proxy")
            .resume()
            .await;
    }
}

/// Starts tansu on `listen` (memory engine, empty), advertising `advertised`, its stderr
/// appended to `dir/tansu.log`.
fn spawn_tansu(
    bin: &std::path::Path,
    dir: &std::path::Path,
    listen: SocketAddr,
    advertised: SocketAddr,
) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("tansu.log"))
        .expect("log file");
    Command::new(bin)
        .current_dir(dir)
        .args([
            "broker",
            "--listener-url",
            &format!("tcp://{listen}"),
            "--advertised-listener-url",
            &format!("tcp://{advertised}"),
            "--storage-engine",
            "memory://tansu/",
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn tansu")
}

/// One record as read back.
#[derive(Debug, Clone)]
pub struct Rec {
    /// The partition it was read from.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
    /// Its key, as text.
    pub key: String,
    /// `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// Its headers, as text.
    pub headers: HashMap<String, String>,
}

/// A consumer thread reading every partition of a topic from the beginning.
pub struct Reader {
    records: Arc<Mutex<Vec<Rec>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    /// Starts reading the `partitions` partitions of `topic` on `bootstrap`.
    pub fn start(bootstrap: &str, topic: &str, partitions: i32) -> Reader {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "kubesink-test-reader")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        let records: Arc<Mutex<Vec<Rec>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (records.clone(), stop.clone());
        let bootstrap_owned = bootstrap.to_owned();
        let thread = std::thread::spawn(move || {
            let mut errors = 0;
            while !s.load(Ordering::SeqCst) {
                let m = match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => {
                        // Said (the first 20), so that a reader stuck on an error shows why.
                        errors += 1;
                        if errors <= 20 {
                            eprintln!("test reader of {bootstrap_owned}: {e}");
                        }
                        continue;
                    }
                    None => continue,
                };
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (
                                    h.key.to_owned(),
                                    String::from_utf8_lossy(h.value.unwrap_or_default())
                                        .into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                r.lock().unwrap().push(Rec {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers,
                });
            }
        });
        Reader {
            records,
            stop,
            thread: Some(thread),
        }
    }

    /// The records read so far, in the order they arrived.
    pub fn records(&self) -> Vec<Rec> {
        self.records.lock().unwrap().clone()
    }

    /// How many records it has read so far.
    pub fn len(&self) -> usize {
        self.records.lock().unwrap().len()
    }

    /// Whether it has read no record yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
