//! The snapshot format's tests: round trip, and damage to the header or to one section.

use super::*;
use crate::informer::TrackedStore;

const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";

fn store(n: usize) -> std::sync::Arc<TrackedStore> {
    let mut s = LightStore::new();
    s.begin_list();
    for i in 0..n {
        s.observe(
            Some(&format!("ns-{}", i % 3)),
            &format!("pod-{i}"),
            U1,
            &(1000 + i).to_string(),
            i as u64,
        );
    }
    s.observe(None, "odd", "not-a-uuid", "rv-x", 99);
    TrackedStore::new(s, true)
}

fn file(sections: &[(&str, u64, usize)]) -> Vec<u8> {
    file_with(Writer::new("prod", 1_700_000_000_000, 42), sections)
}

fn file_with(mut w: Writer, sections: &[(&str, u64, usize)]) -> Vec<u8> {
    for (id, sel, n) in sections {
        let s = store(*n);
        s.lock().list_resource_version = "777".into();
        s.acknowledged(|a| w.section(id, *sel, a));
    }
    w.finish()
}

fn keys(s: &LightStore) -> Vec<(Option<String>, String)> {
    s.keys()
}

#[test]
fn a_snapshot_round_trips_every_section_and_entry() {
    let bytes = file(&[("core/Pod/", 7, 100), ("core/Node/", 8, 0)]);
    let snap = parse(&bytes).unwrap();
    assert_eq!(
        (snap.cluster.as_str(), snap.written_at_ms, snap.announced),
        ("prod", 1_700_000_000_000, 2)
    );
    assert_eq!(snap.sections.len(), 2);
    let pods = snap.sections[0].as_ref().unwrap();
    assert_eq!(
        (
            pods.identity.as_str(),
            pods.selection,
            pods.list_resource_version.as_str()
        ),
        ("core/Pod/", 7, "777")
    );
    let restored = pods.store().unwrap();
    let original = store(100);
    assert_eq!(keys(&restored), original.lock().store.keys());
    let want = original
        .lock()
        .store
        .get(Some("ns-1"), "pod-4")
        .map(Facts::into_owned);
    assert_eq!(
        restored.get(Some("ns-1"), "pod-4").map(Facts::into_owned),
        want
    );
    let odd = restored.get(None, "odd").unwrap();
    assert_eq!(
        (odd.uid.render(), odd.rv.render(), odd.fingerprint),
        ("not-a-uuid".into(), "rv-x".into(), 99)
    );
    assert_eq!(snap.sections[1].as_ref().unwrap().store().unwrap().len(), 1);
    // Compact: about 65 bytes per object for these names.
    assert!(bytes.len() < 101 * 70, "{} bytes", bytes.len());
}

#[test]
fn header_damage_makes_the_file_unusable() {
    let bytes = file(&[("core/Pod/", 7, 10)]);
    assert!(matches!(
        parse(b"{\"json\": true}"),
        Err(SnapshotError::BadMagic { .. })
    ));
    assert!(matches!(
        parse(&bytes[..5]),
        Err(SnapshotError::Truncated { .. })
    ));
    assert!(matches!(
        parse(&bytes[..20]),
        Err(SnapshotError::Truncated { .. })
    ));
    let mut other = bytes.clone();
    other[8] = 4;
    assert_eq!(
        parse(&other).unwrap_err(),
        SnapshotError::Version { found: 4 }
    );
    let mut flipped = bytes.clone();
    flipped[26] ^= 0x40; // inside the cluster name
    assert!(matches!(
        parse(&flipped),
        Err(SnapshotError::Corrupt { .. })
    ));
    assert!(parse(&bytes).is_ok());
}

#[test]
fn section_damage_costs_only_that_watch() {
    let bytes = file(&[("core/Pod/", 7, 50), ("core/Node/", 8, 5)]);
    let snap = parse(&bytes).unwrap();
    assert!(snap.sections.iter().all(Result::is_ok));
    // Flip a byte among the pods' entries: the header is 24 + 25 bytes ("prod"), the
    // section's length and checksum 16 more.
    let mut corrupt = bytes.clone();
    corrupt[24 + 25 + 16 + 200] ^= 1;
    let snap = parse(&corrupt).unwrap();
    let damaged = snap.sections[0].as_ref().unwrap_err();
    assert!(
        matches!(damaged.error, SnapshotError::Corrupt { .. }),
        "{damaged:?}"
    );
    assert_eq!(damaged.identity.as_deref(), Some("core/Pod/"));
    assert!(
        snap.sections[1].as_ref().is_ok(),
        "the nodes' section is intact"
    );
    // Cut in the middle of the nodes' section.
    let truncated = &bytes[..bytes.len() - 20];
    let snap = parse(truncated).unwrap();
    assert!(snap.sections[0].is_ok());
    let damaged = snap.sections[1].as_ref().unwrap_err();
    assert!(matches!(damaged.error, SnapshotError::Truncated { .. }));
    assert_eq!(damaged.identity.as_deref(), Some("core/Node/"));
    assert_eq!(snap.announced, 2);
}

/// `bytes` (version 2, [`Writer::new_of_version`]) as the version 1 format wrote it: no generation in the header.
fn as_version_1(bytes: &[u8]) -> Vec<u8> {
    let header_len = u32_at(bytes, 12) as usize;
    let header = &bytes[24..24 + header_len - 8];
    let mut v1 = Vec::new();
    v1.extend_from_slice(MAGIC);
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&(header.len() as u32).to_le_bytes());
    v1.extend_from_slice(&xxh3_64(header).to_le_bytes());
    v1.extend_from_slice(header);
    v1.extend_from_slice(&bytes[24 + header_len..]);
    v1
}

#[test]
fn the_generation_and_unconfirmed_entries_round_trip_and_version_1_is_still_read() {
    let s = store(3);
    {
        let mut t = s.lock();
        let before = t.store.get(Some("ns-1"), "pod-1").map(Facts::into_owned);
        t.note_change(Some("ns-1"), "new", None, 1);
        t.note_added(Some("ns-1"), "new", U1, "2000");
        t.store.observe(Some("ns-1"), "new", U1, "2000", 5);
        assert!(before.is_some());
    }
    let mut w = Writer::new("prod", 1, 42);
    s.acknowledged(|a| w.section("core/Pod/", 7, a));
    let bytes = w.finish();
    let snap = parse(&bytes).unwrap();
    assert_eq!(snap.generation, 42);
    let restored = snap.sections[0].as_ref().unwrap().store().unwrap();
    let new = restored.get(Some("ns-1"), "new").unwrap();
    assert!(
        new.unconfirmed,
        "an outstanding add is saved as unconfirmed"
    );
    assert_eq!((new.rv.render(), new.fingerprint), ("2000".into(), 0));
    assert!(!restored.get(Some("ns-1"), "pod-1").unwrap().unconfirmed);

    let v2 = Writer::new_of_version(2, "prod", 1);
    let old = as_version_1(&file_with(v2, &[("core/Pod/", 7, 10)]));
    let snap = parse(&old).unwrap();
    assert_eq!((snap.generation, snap.announced), (0, 1));
    assert_eq!(
        snap.sections[0].as_ref().unwrap().store().unwrap().len(),
        11
    );
}

#[test]
fn change_path_parts_round_trip_and_a_version_2_state_restores_them_as_unknown() {
    let parts = Parts([1, 2, 3, 4, 5, 6, 7, 0xffff]);
    let with_parts = || {
        let mut s = LightStore::new();
        s.begin_list();
        s.observe_parts(Some("ns"), "web", U1, "10", 77, parts);
        TrackedStore::new(s, true)
    };
    for (version, want) in [(3, parts), (2, Parts::UNKNOWN)] {
        let mut w = Writer::new_of_version(version, "prod", 1);
        with_parts().acknowledged(|a| w.section("core/Pod/", 7, a));
        let bytes = w.finish();
        let snap = parse(&bytes).unwrap();
        let restored = snap.sections[0].as_ref().unwrap().store().unwrap();
        let facts = restored.get(Some("ns"), "web").unwrap();
        assert_eq!(
            (facts.fingerprint, facts.parts),
            (77, want),
            "format version {version}"
        );
    }
}
