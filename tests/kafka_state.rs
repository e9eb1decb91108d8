//! The `kafka` state backend's store against a real Kafka-protocol broker (tansu): the epoch
//! fence against a deposed writer, the snapshot cut into chunks, and the transactional
//! option on a broker without transactions. The restarts and hand-overs of the whole binary
//! with this backend are in `tests/restart.rs`; the fence under compaction (which tansu does
//! not run) is in `destinations/kafka/src/state/records.rs`, on a model of it.
#![cfg(feature = "kafka")]

#[path = "support/kafka_server.rs"]
mod kafka_server;
#[path = "support/ports.rs"]
mod ports;

use std::time::Duration;

use kubesink_core::state::StateStore;
use kubesink_core::units::{ByteSize, HumanDuration};
use kubesink_kafka::state::{KafkaStore, StateKafkaConfig};

fn config(tansu: &kafka_server::Tansu) -> StateKafkaConfig {
    StateKafkaConfig {
        bootstrap_servers: Some(tansu.bootstrap.clone()),
        chunk_bytes: ByteSize(1024),
        timeout: HumanDuration(Duration::from_secs(5)),
        ..Default::default()
    }
}

/// A writer: what a replica's store is after it took over (its restore ran).
async fn writer(cfg: &StateKafkaConfig, who: &str) -> (KafkaStore, Option<Vec<u8>>, Vec<Vec<u8>>) {
    let connection = cfg.connection([]).expect("connection");
    let store = KafkaStore::new(cfg, connection, "prod", who);
    let snapshot = store.load().await.expect("load");
    let journal = store
        .load_journal()
        .await
        .expect("load_journal")
        .into_iter()
        .map(|s| s.bytes)
        .collect();
    (store, snapshot, journal)
}

fn bytes(tag: &str, len: usize) -> Vec<u8> {
    tag.bytes().cycle().take(len).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_writers_late_writes_never_reach_the_next_restore() {
    let tansu = kafka_server::Tansu::start().await;
    let cfg = config(&tansu);
    // a: the first leader. Its snapshot (5,000 bytes) takes 5 chunks of 1 KiB.
    let (a, snap, journal) = writer(&cfg, "a").await;
    assert_eq!((snap, journal.len()), (None, 0), "nothing saved yet");
    let state_a = bytes("state of a ", 5_000);
    a.save(state_a.clone(), 10).await.unwrap();
    a.append(10, vec![b"frame a1".to_vec(), b"frame a2".to_vec()])
        .await
        .unwrap();

    // b takes over: it reads exactly what a wrote.
    let (b, snap, journal) = writer(&cfg, "b").await;
    assert_eq!(snap.as_deref(), Some(&state_a[..]));
    assert_eq!(journal, vec![b"frame a1".to_vec(), b"frame a2".to_vec()]);

    // a, not stopped in time, goes on: a save (whose clean-up tombstones its previous
    // snapshot), journal frames, a journal drop.
    a.save(bytes("zombie ", 3_000), 11).await.unwrap();
    a.append(11, vec![b"zombie frame".to_vec()]).await.unwrap();
    a.drop_journal_before(11).await.unwrap();

    // c, taking over before b saved anything of its own, gets the state b took over.
    let (_c, snap, journal) = writer(&cfg, "c").await;
    assert_eq!(
        snap.as_deref(),
        Some(&state_a[..]),
        "not the zombie's state"
    );
    assert_eq!(journal, vec![b"frame a1".to_vec(), b"frame a2".to_vec()]);

    // b (deposed by c now, a zombie in turn) and a both write; d gets c's state: the one c
    // copied forward at its take-over.
    b.save(bytes("b late ", 2_000), 20).await.unwrap();
    a.save(bytes("a later ", 2_000), 12).await.unwrap();
    let (d, snap, journal) = writer(&cfg, "d").await;
    assert_eq!(snap.as_deref(), Some(&state_a[..]));
    assert_eq!(journal.len(), 2);

    // d saves its own; the next restore reads it, with no journal (d dropped what it covers).
    let state_d = bytes("state of d ", 4_321);
    d.save(state_d.clone(), 30).await.unwrap();
    d.drop_journal_before(30).await.unwrap();
    let (_e, snap, journal) = writer(&cfg, "e").await;
    assert_eq!(snap.as_deref(), Some(&state_d[..]));
    assert!(journal.is_empty(), "{journal:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_larger_than_a_record_is_chunked_and_read_back_whole() {
    let tansu = kafka_server::Tansu::start().await;
    let mut cfg = config(&tansu);
    cfg.chunk_bytes = ByteSize(64 * 1024);
    let (a, _, _) = writer(&cfg, "a").await;
    // 2.5 MiB: more than a broker's default message.max.bytes (1 MiB), in 40 records.
    let big: Vec<u8> = (0..2_621_440u32).map(|i| (i % 251) as u8).collect();
    a.save(big.clone(), 1).await.unwrap();
    let (_b, snap, _) = writer(&cfg, "b").await;
    assert_eq!(snap.map(|s| s.len()), Some(big.len()));
    let (_c, snap, _) = writer(&cfg, "c").await;
    assert!(snap.as_deref() == Some(&big[..]), "read back byte for byte");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transactional_option_on_a_broker_without_transactions_is_a_clear_error() {
    let tansu = kafka_server::Tansu::start().await;
    let mut cfg = config(&tansu);
    cfg.transactional = true;
    let connection = cfg.connection([]).unwrap();
    let store = KafkaStore::new(&cfg, connection, "prod", "a");
    let err = store
        .load()
        .await
        .expect_err("tansu 0.6 has no transactions");
    let text = err.to_string();
    eprintln!("{text}");
    assert!(
        text.starts_with("state.kafka: ")
            && text.contains("state.kafka.transactional = true")
            && text.contains(&tansu.bootstrap),
        "{text}"
    );
}

/// The broker loses the topic while a writer runs (tansu's memory engine restarted; on Kafka,
/// the topic deleted): the writer's next write fails, saying so; the one after creates the
/// topic and writes a new fence first, so what it writes from then on is what the next
/// restore reads (it used to be taken for a zombie's writes and ignored, found by a newcomer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_topic_lost_while_running_is_created_again_and_fenced_before_the_next_write() {
    let mut tansu = kafka_server::Tansu::start().await;
    let cfg = config(&tansu);
    let (a, _, _) = writer(&cfg, "a").await;
    a.save(bytes("before the loss ", 3_000), 1).await.unwrap();
    tansu.restart_empty().await;
    let mut failures = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match a.append(1, vec![b"after the loss".to_vec()]).await {
            Ok(()) => break,
            Err(e) => failures.push(e.to_string()),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the journal never recovered: {failures:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        failures
            .iter()
            .any(|f| f.contains("the topic was deleted or lost its records")),
        "{failures:?}"
    );
    let state = bytes("after the loss ", 2_500);
    a.save(state.clone(), 2).await.unwrap();
    let (_b, snap, journal) = writer(&cfg, "b").await;
    assert_eq!(
        snap.as_deref(),
        Some(&state[..]),
        "not ignored as a zombie's"
    );
    assert_eq!(journal, vec![b"after the loss".to_vec()]);
}
