//! The `kafka` state backend's store against a real Kafka-protocol broker (tansu): the epoch
//! fence against a deposed writer, the snapshot cut into chunks, and the transactional
//! option on a broker without transactions. The restarts and hand-overs of the whole binary
//! with this backend are in `tests/restart.rs`; the fence under compaction (which tansu does
//! not run) is in `sinks/kafka/src/state/records.rs`, on a model of it.
#![cfg(feature = "kafka")]

use kubesink_test_support::kafka_server;

use std::time::Duration;

use kubesink_core::state::{StateError, StateStore};
use kubesink_core::units::{ByteSize, HumanDuration};
use kubesink_kafka::state::{KafkaStore, StateKafkaConfig};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

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
/// restore reads (never taken for a zombie's writes and ignored).
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
    // A snapshot of the frame's generation (a frame of an older generation is covered by the
    // snapshot, and a restore no longer even holds it: `records.rs`, `Scanner`).
    let state = bytes("after the loss ", 2_500);
    a.save(state.clone(), 1).await.unwrap();
    let (_b, snap, journal) = writer(&cfg, "b").await;
    assert_eq!(
        snap.as_deref(),
        Some(&state[..]),
        "not ignored as a zombie's"
    );
    assert_eq!(journal, vec![b"after the loss".to_vec()]);
}

/// At the store: the topic lost while a writer runs, a journal frame
/// written after it under a new fence, then a crash before any save. The next restore must
/// say the state is damaged ([`StateError::Damaged`]: a full initial list), never return
/// "nothing saved" with that journal (replayed alone, it would make the restart send live
/// objects as non-initial `added` and never the deletes the lost snapshot could infer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_written_after_the_topic_was_lost_is_damaged_state_until_the_next_save() {
    let mut tansu = kafka_server::Tansu::start().await;
    let cfg = config(&tansu);
    let (a, _, _) = writer(&cfg, "a").await;
    a.save(bytes("before the loss ", 3_000), 1).await.unwrap();
    tansu.restart_empty().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while a.append(1, vec![b"after the loss".to_vec()]).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(a); // the crash: no save since the loss

    for who in ["b", "c"] {
        // c: b's restore crashed too before any save; still damaged.
        let store = KafkaStore::new(&cfg, cfg.connection([]).unwrap(), "prod", who);
        // `StateError::Damaged`, by its text.
        match store.load().await {
            Err(e) if e.to_string().contains("damaged or partly lost") => {
                let why = e.to_string();
                assert!(why.contains("deleted or lost its records"), "{why}")
            }
            other => panic!("{who}: the state must be damaged, got {other:?}"),
        }
    }
    // A save makes it whole again.
    let store = KafkaStore::new(&cfg, cfg.connection([]).unwrap(), "prod", "d");
    let damaged = store.load().await;
    assert!(
        damaged
            .as_ref()
            .is_err_and(|e| e.to_string().contains("damaged or partly lost")),
        "{damaged:?}"
    );
    let state = bytes("state of d ", 2_000);
    store.save(state.clone(), 5).await.unwrap();
    let (_e, snap, journal) = writer(&cfg, "e").await;
    assert_eq!(snap.as_deref(), Some(&state[..]));
    assert!(journal.is_empty(), "{journal:?}");
}

/// With `transactional = true` (KIP-98), a successor's
/// `init_transactions` fences the previous writer's producer. The fenced writer must stay
/// fenced: every later write is refused ([`StateError::Fenced`]) and never builds a new
/// producer, whose own `init_transactions` would bump the epoch and fence the successor back
/// (a ping-pong until the zombie exits). Against librdkafka's mock cluster, which has
/// transactions (tansu 0.6 has none) but gives a new producer id to every
/// `init_transactions` instead of fencing the previous one: the broker's fence is injected
/// as the `PRODUCER_FENCED` answer to the zombie's next `AddPartitionsToTxn`, and what
/// matters is that no later write of the zombie goes through (each would come from a new
/// producer whose `init_transactions` fences the successor on a real broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transactional_writer_stays_fenced_and_never_fences_its_successor_back() {
    let mock = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    mock.create_topic("kubesink-state", 1, 1).expect("topic");
    let cfg = StateKafkaConfig {
        bootstrap_servers: Some(mock.bootstrap_servers()),
        chunk_bytes: ByteSize(1024),
        timeout: HumanDuration(Duration::from_secs(5)),
        transactional: true,
        ..Default::default()
    };
    let (a, _, _) = writer(&cfg, "a").await;
    a.save(bytes("state of a ", 2_000), 1)
        .await
        .expect("a saves while it leads");
    a.append(1, vec![b"a1".to_vec()]).await.expect("a appends");

    // b takes over: its producer's init_transactions fences a's.
    let (b, snap, _) = writer(&cfg, "b").await;
    assert_eq!(snap.map(|s| s.len()), Some(2_000));
    mock.request_errors(
        RDKafkaApiKey::AddPartitionsToTxn,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED],
    );
    for attempt in 0..3 {
        // The journal writer and the keeper retry: every try is refused.
        let appended = a.append(1, vec![b"zombie".to_vec()]).await;
        assert!(
            matches!(appended, Err(StateError::Fenced)),
            "attempt {attempt}: {appended:?}"
        );
        let saved = a.save(bytes("zombie ", 1_000), 2).await;
        assert!(
            matches!(saved, Err(StateError::Fenced)),
            "attempt {attempt}: {saved:?}"
        );
    }
    // b was never fenced back: it writes, and the next writer reads b's state.
    b.append(3, vec![b"b1".to_vec()]).await.expect("b appends");
    let state_b = bytes("state of b ", 1_500);
    b.save(state_b.clone(), 4).await.expect("b saves");
    let (_c, snap, _) = writer(&cfg, "c").await;
    assert_eq!(snap.as_deref(), Some(&state_b[..]));
}

/// The topic deleted and created again by another kubesink (another cluster's state shares
/// it), which wrote past this writer's fence offset before this writer's next save. The
/// offsets of that save are above its fence, so they do not look like a reset, and its
/// records, with no fence of theirs before them in the new topic, would be ignored by every
/// restore as a zombie's. The writer must see the reset (its fence record
/// is not at its offset any more) and fence again before the save.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_created_again_and_written_past_the_fence_by_another_state_is_a_reset() {
    let mut tansu = kafka_server::Tansu::start().await;
    let cfg = config(&tansu);
    let (a, _, _) = writer(&cfg, "a").await;
    a.save(bytes("before the loss ", 3_000), 1).await.unwrap();
    tansu.restart_empty().await;
    // Another cluster's kubesink creates the topic again and saves 20 KiB (20 chunks): its
    // records go past a's fence offset.
    let other = KafkaStore::new(&cfg, cfg.connection([]).unwrap(), "elsewhere", "o");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match other.load().await {
            Ok(_) => break,
            Err(e) => assert!(std::time::Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    other.save(bytes("other ", 20_000), 1).await.unwrap();

    let state = bytes("a after the loss ", 2_500);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while let Err(e) = a.save(state.clone(), 2).await {
        assert!(std::time::Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_b, snap, _) = writer(&cfg, "b").await;
    assert_eq!(
        snap.as_deref(),
        Some(&state[..]),
        "a's save after the reset is its state, not a zombie's writes"
    );
}

/// `VmHWM` (peak resident set) of this process, in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Measured: the peak RSS of a take-over's restore after 100 saves of a
/// 5,183,701-byte snapshot (100,000 pods in the restart bench) in 512 KiB chunks, on tansu,
/// which never compacts (so the partition holds every save: ~520 MB of values). The peak is
/// reset (`/proc/self/clear_refs`) right before the restore. Run:
/// `cargo test --test kafka_state take_over_peak_rss -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: writes ~520 MB to tansu"]
async fn take_over_peak_rss_after_100_saves_of_100k_objects() {
    let tansu = kafka_server::Tansu::start().await;
    let mut cfg = config(&tansu);
    cfg.chunk_bytes = ByteSize(512 * 1024);
    cfg.timeout = HumanDuration(Duration::from_secs(30));
    let (a, _, _) = writer(&cfg, "a").await;
    let mut snapshot: Vec<u8> = (0..5_183_701u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for g in 1..=100u64 {
        snapshot[0] = g as u8;
        a.save(snapshot.clone(), g).await.expect("save");
    }
    drop(a);
    let before = peak_rss_kib();
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let baseline = peak_rss_kib();
    let started = std::time::Instant::now();
    let (_b, snap, _) = writer(&cfg, "b").await;
    let peak = peak_rss_kib();
    assert_eq!(snap.as_deref(), Some(&snapshot[..]));
    eprintln!(
        "take-over restore after 100 saves of {} bytes: {:?}; peak RSS {} MiB (before the restore {} MiB; peak while saving {} MiB)",
        snapshot.len(),
        started.elapsed(),
        peak / 1024,
        baseline / 1024,
        before / 1024
    );
}
