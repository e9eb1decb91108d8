//! Bytes of lightweight-informer state per cached object, measured with a counting global
//! allocator at 100,000 objects shaped like a large cluster's pods (50 namespaces,
//! ReplicaSet-style names, UUID uids, decimal resourceVersions).
//!
//! `cargo bench --bench state_size`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kubesink::testing::{LightStore, Parts};

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn main() {
    const N: usize = 100_000;
    let keys: Vec<(String, String, String)> = (0..N)
        .map(|i| {
            let ns = format!("team-{:02}", i % 50);
            let name = format!("checkout-api-{}-7d9f8b6c5d-{:05x}", i % 400, i);
            let uid = uuid::Uuid::from_u128(0x9f3e_0000_4000_8000_0000_0000_0000_0000 | i as u128)
                .to_string();
            (ns, name, uid)
        })
        .collect();
    let before = LIVE.load(Ordering::Relaxed);
    let mut store = LightStore::new();
    store.begin_list();
    for (i, (ns, name, uid)) in keys.iter().enumerate() {
        store.observe(Some(ns), name, uid, &(1_000_000 + i).to_string(), i as u64);
    }
    store.end_list();
    let after = LIVE.load(Ordering::Relaxed);
    let bytes = after - before;
    let avg_name = keys.iter().map(|k| k.1.len()).sum::<usize>() as f64 / N as f64;
    println!(
        "lightweight store without change paths' fingerprints: {N} objects, {bytes} bytes allocated, {:.1} bytes/object (entry {} bytes, mean name {avg_name:.1} bytes)",
        bytes as f64 / N as f64,
        std::mem::size_of::<kubesink::testing::StoreEntry>(),
    );
    // As kubesink runs: every object keeps its change paths' fingerprints (the default paths
    // when none are configured; the first run's objects and the restored ones alike).
    let before = LIVE.load(Ordering::Relaxed);
    let mut with_parts = LightStore::new();
    with_parts.begin_list();
    for (i, (ns, name, uid)) in keys.iter().enumerate() {
        let parts = Parts([i as u16 | 1, 2, 3, 4, 5, 6, 7, 8]);
        let rv = (1_000_000 + i).to_string();
        with_parts.observe_parts(Some(ns), name, uid, &rv, i as u64, parts);
    }
    with_parts.end_list();
    let parts_bytes = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "as kubesink runs, with the change paths' fingerprints (`changed`): {:.1} bytes/object (+{:.1})",
        parts_bytes as f64 / N as f64,
        (parts_bytes as f64 - bytes as f64) / N as f64
    );
    assert_eq!(with_parts.len(), N);
    drop(with_parts);
    // For comparison, the naive keys-only cache: HashMap<"ns/name", (uid, rv)> as Strings.
    let before = LIVE.load(Ordering::Relaxed);
    let mut naive = std::collections::HashMap::new();
    for (i, (ns, name, uid)) in keys.iter().enumerate() {
        naive.insert(
            format!("{ns}/{name}"),
            (uid.clone(), (1_000_000 + i).to_string()),
        );
    }
    let naive_bytes = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "naive keys-only map: {:.1} bytes/object ({:.2}x the lightweight store)",
        naive_bytes as f64 / N as f64,
        naive_bytes as f64 / bytes as f64
    );
    assert_eq!(store.len(), N);
    drop(naive);
    owner_index();
}

/// The owner index (`enrich`, src/informer/owners.rs) at issue 58's shape: 100,000 Pods on
/// 500 nodes (indexed as for an Events resource with context), 20,000 ReplicaSets, 5,000
/// Deployments.
fn owner_index() {
    use kubesink_core::message::OwnerRef;
    let uid = |kind: u128, i: usize| {
        uuid::Uuid::from_u128((kind << 96) | 0x4000_8000_0000_0000_0000 | i as u128).to_string()
    };
    let owner = |kind: &str, name: String, uid: String| OwnerRef {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
    };
    let (pods, sets, deploys) = (100_000, 20_000, 5_000);
    let before = LIVE.load(Ordering::Relaxed);
    let index = kubesink::testing::OwnerIndex::new(0);
    for d in 0..deploys {
        index.note(&uid(3, d), None, None);
    }
    for s in 0..sets {
        let d = s % deploys;
        let dep = owner("Deployment", format!("checkout-api-{d}"), uid(3, d));
        index.note(&uid(2, s), Some(&dep), None);
    }
    let owners_only = LIVE.load(Ordering::Relaxed) - before;
    for p in 0..pods {
        let s = p % sets;
        let rs = owner(
            "ReplicaSet",
            format!("checkout-api-{}-7d9f8b6c5d", s % deploys),
            uid(2, s),
        );
        let node = format!("ip-10-0-{}-{}.ec2.internal", p % 500 / 250, p % 250);
        index.note(&uid(1, p), Some(&rs), Some(&node));
    }
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    let n = pods + sets + deploys;
    println!(
        "owner index, {sets} ReplicaSets and {deploys} Deployments (what a Pod resource with enrich needs): {owners_only} bytes allocated, {:.1} bytes/object",
        owners_only as f64 / (sets + deploys) as f64,
    );
    println!(
        "owner index with {pods} Pods too (an Events resource with enrich): {n} objects, {bytes} bytes allocated, {:.1} bytes/object",
        bytes as f64 / n as f64,
    );
    assert_eq!(index.objects(), n);
}
