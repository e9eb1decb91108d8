//! The journal's byte layout: frames of records, each frame checksummed, written whole by one
//! append. Owns the layout, its checks and the reasons a frame is unusable; never does I/O
//! and never decides what to do about damage (`restore.rs` does).
//!
//! # Layout (format version 1)
//!
//! Integers are little-endian; `uvar` is an unsigned LEB128 integer; `str` is a `uvar` length
//! and UTF-8 bytes (as in the snapshot, `snapshot.rs`).
//!
//! ```text
//! frame   := "KSNKJRNL" version:u32 body_len:u32 body_xxh3:u64 body
//! body    := cluster:str generation:u64 first:u64
//!            watches:uvar (identity:str selection:u64)*  records:uvar record*
//! record  := watch:uvar namespace:str name:str flags:u8
//!            uid:(16 bytes | str if flags&1) rv:(uvar | str if flags&2)
//! ```
//!
//! One record is one `added` about to be sent: the key (`watch` indexes the frame's watch
//! table, `identity` = `{group}/{Kind}/{namespace}` and the selection fingerprint, as in the
//! snapshot), its uid and resourceVersion. `first` numbers the frame's first record (records
//! are numbered from 1 through the life of a journal). About 60 bytes per record with
//! pod-like names.
//!
//! A segment (a file, or the frames of a stream) is frames back to back. A write cut short by
//! a crash leaves at most its own frame damaged, at the end of a file: such a frame was never
//! durable, so nothing it records was sent ([`Parsed::torn`]); damage anywhere else means
//! bytes were changed ([`FrameError`]).

use xxhash_rust::xxh3::xxh3_64;

use crate::informer::{Rv, Uid};
use crate::state::codec::{put_str, put_uid_rv, put_uvar, u32_at, u64_at, Reader};

/// A frame's first eight bytes.
pub const MAGIC: &[u8; 8] = b"KSNKJRNL";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes before a frame's body: magic, version, length, checksum.
const HEAD: usize = 24;

/// Why a frame cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not a journal frame where one must start.
    #[error("{part}: not a kubesink journal frame (it starts with \"{}\", not \"KSNKJRNL\")", .found.escape_ascii())]
    BadMagic {
        /// `segment S, frame N`.
        part: String,
        /// The bytes found.
        found: Vec<u8>,
    },
    /// Written by a kubesink with another journal format.
    #[error("{part}: journal format version {found}, this kubesink reads version {VERSION}")]
    Version {
        /// `segment S, frame N`.
        part: String,
        /// The version found.
        found: u32,
    },
    /// The checksum does not match, or the frame is cut short, and more frames follow.
    #[error("{part}: corrupt (checksum mismatch or cut short) with more bytes after it")]
    Corrupt {
        /// `segment S, frame N`.
        part: String,
    },
    /// The checksum matched but the content does not parse (another writer's bug).
    #[error("{part}: malformed: {what}")]
    Malformed {
        /// `segment S, frame N`.
        part: String,
        /// What could not be read.
        what: String,
    },
}

/// One record: an `added` that was about to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRecord {
    /// Index in [`Frame::watches`].
    pub watch: u32,
    /// Namespace (`""` at cluster scope).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// uid of the object sent.
    pub uid: Uid<'static>,
    /// Its resourceVersion.
    pub rv: Rv<'static>,
}

/// A parsed frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// `cluster.name` of the writer.
    pub cluster: String,
    /// The journal generation it belongs to.
    pub generation: u64,
    /// Number of its first record.
    pub first: u64,
    /// The watch table: `(identity, selection)`.
    pub watches: Vec<(String, u64)>,
    /// The records.
    pub records: Vec<JournalRecord>,
}

/// Appends the record of `(namespace, name)` with `uid` and `rv` for watch `watch` to `buf`
/// (the body of a frame to come).
pub fn put_record(buf: &mut Vec<u8>, watch: u32, namespace: &str, name: &str, uid: &str, rv: &str) {
    put_uvar(buf, u64::from(watch));
    put_str(buf, namespace);
    put_str(buf, name);
    put_uid_rv(buf, &Uid::parse(uid), &Rv::parse(rv), 0);
}

/// A whole frame around `records` (`count` of them, made by [`put_record`]), the first
/// numbered `first`, of generation `generation`, with the watch table `watches`.
pub fn encode(
    cluster: &str,
    generation: u64,
    first: u64,
    watches: &[(String, u64)],
    count: u64,
    records: &[u8],
) -> Vec<u8> {
    let mut body = Vec::with_capacity(records.len() + 64 + watches.len() * 32);
    put_str(&mut body, cluster);
    body.extend_from_slice(&generation.to_le_bytes());
    body.extend_from_slice(&first.to_le_bytes());
    put_uvar(&mut body, watches.len() as u64);
    for (identity, selection) in watches {
        put_str(&mut body, identity);
        body.extend_from_slice(&selection.to_le_bytes());
    }
    put_uvar(&mut body, count);
    body.extend_from_slice(records);
    let mut frame = Vec::with_capacity(HEAD + body.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&VERSION.to_le_bytes());
    // A frame body is at most a few hundred KiB (`journal.rs` bounds its chunks).
    frame.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    frame.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// What a segment holds.
#[derive(Debug, Default)]
pub struct Parsed {
    /// Its usable frames, in order.
    pub frames: Vec<Frame>,
    /// Why its last frame was dropped, when a crash cut its write short (only where
    /// `may_tear`): that frame was never durable, so nothing it records was sent.
    pub torn: Option<String>,
}

/// Parses segment `name` (frames back to back). `may_tear`: the segment is a file whose last
/// write may have been cut short by a crash, so a damaged last frame is dropped as torn
/// rather than reported.
///
/// # Errors
/// [`FrameError`] for damage that a cut-short write cannot explain: then no record of the
/// journal can be trusted.
pub fn parse_segment(name: &str, bytes: &[u8], may_tear: bool) -> Result<Parsed, FrameError> {
    let mut out = Parsed::default();
    let mut at = 0;
    while at < bytes.len() {
        let part = format!("segment {name}, frame {}", out.frames.len() + 1);
        let rest = &bytes[at..];
        let torn = |what: &str| format!("{part}: {what} at its end (a write cut short)");
        if may_tear && rest.iter().all(|b| *b == 0) {
            // A file extended by a write that a power loss cut short can end in zeros.
            out.torn = Some(torn(&format!("{} zero bytes", rest.len())));
            break;
        }
        if rest.len() < HEAD {
            if may_tear && MAGIC.starts_with(&rest[..rest.len().min(8)]) {
                out.torn = Some(torn(&format!("{} bytes of a frame head", rest.len())));
                break;
            }
            return Err(bad_start(part, rest));
        }
        if &rest[..8] != MAGIC {
            return Err(bad_start(part, rest));
        }
        let version = u32_at(rest, 8);
        if version != VERSION {
            return Err(FrameError::Version {
                part,
                found: version,
            });
        }
        let len = u32_at(rest, 12) as usize;
        let sum = u64_at(rest, 16);
        let Some(body) = rest.get(HEAD..HEAD + len) else {
            if may_tear {
                out.torn = Some(torn(&format!("{} of {len} body bytes", rest.len() - HEAD)));
                break;
            }
            return Err(FrameError::Corrupt { part });
        };
        at += HEAD + len;
        if xxh3_64(body) != sum {
            if may_tear && at == bytes.len() {
                out.torn = Some(torn("a checksum mismatch"));
                break;
            }
            return Err(FrameError::Corrupt { part });
        }
        out.frames.push(parse_body(body, &part)?);
    }
    Ok(out)
}

fn bad_start(part: String, rest: &[u8]) -> FrameError {
    FrameError::BadMagic {
        part,
        found: rest.iter().take(8).copied().collect(),
    }
}

fn parse_body(body: &[u8], part: &str) -> Result<Frame, FrameError> {
    let mut r = Reader::new(body);
    let malformed = |what: String| FrameError::Malformed {
        part: part.to_owned(),
        what,
    };
    let cluster = r.str().map_err(malformed)?.to_owned();
    let generation = r.u64().map_err(malformed)?;
    let first = r.u64().map_err(malformed)?;
    let n = r.uvar().map_err(malformed)?;
    let mut watches = Vec::new();
    for _ in 0..n {
        let identity = r.str().map_err(malformed)?.to_owned();
        watches.push((identity, r.u64().map_err(malformed)?));
    }
    let count = r.uvar().map_err(malformed)?;
    let mut records = Vec::new();
    for _ in 0..count {
        let watch = r.uvar().map_err(malformed)?;
        let watch = u32::try_from(watch)
            .ok()
            .filter(|w| (*w as usize) < watches.len())
            .ok_or_else(|| malformed(format!("watch index {watch} out of range")))?;
        let namespace = r.str().map_err(malformed)?.to_owned();
        let name = r.str().map_err(malformed)?.to_owned();
        let (_, uid, rv) = r.uid_rv().map_err(malformed)?;
        records.push(JournalRecord {
            watch,
            namespace,
            name,
            uid: uid.into_owned(),
            rv: rv.into_owned(),
        });
    }
    if r.pos != body.len() {
        return Err(malformed(format!(
            "{} bytes after the last record",
            body.len() - r.pos
        )));
    }
    Ok(Frame {
        cluster,
        generation,
        first,
        watches,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";

    fn frame(generation: u64, first: u64, names: &[&str]) -> Vec<u8> {
        let mut records = Vec::new();
        for n in names {
            put_record(&mut records, 1, "default", n, U1, "42");
        }
        put_record(&mut records, 0, "", "node-a", "odd-uid", "rv-x");
        let watches = [("core/Node/".to_owned(), 8), ("core/Pod/".to_owned(), 7)];
        encode(
            "prod",
            generation,
            first,
            &watches,
            names.len() as u64 + 1,
            &records,
        )
    }

    #[test]
    fn frames_round_trip_with_every_record_form() {
        let bytes = [frame(3, 1, &["a", "b"]), frame(3, 4, &["c"])].concat();
        let parsed = parse_segment("s", &bytes, true).unwrap();
        assert_eq!(parsed.torn, None);
        assert_eq!(parsed.frames.len(), 2);
        let f = &parsed.frames[0];
        assert_eq!((f.cluster.as_str(), f.generation, f.first), ("prod", 3, 1));
        assert_eq!(f.watches[1], ("core/Pod/".to_owned(), 7));
        assert_eq!(f.records.len(), 3);
        assert_eq!(
            (
                f.records[1].watch,
                f.records[1].namespace.as_str(),
                f.records[1].name.as_str()
            ),
            (1, "default", "b")
        );
        assert_eq!(f.records[1].uid.render(), U1);
        assert_eq!(f.records[1].rv, Rv::Number(42));
        let odd = &f.records[2];
        assert_eq!(
            (odd.uid.render(), odd.rv.render()),
            ("odd-uid".into(), "rv-x".into())
        );
        // ~60 bytes per record for pod-like names, plus the frame's head and watch table.
        let one = frame(1, 1, &["web-7d9f8c6b5-x2x4k-0000000000000000"]).len();
        let many = frame(1, 1, &vec!["web-7d9f8c6b5-x2x4k-0000000000000000"; 101]).len();
        assert!(
            (many - one) / 100 <= 64,
            "{} bytes per record",
            (many - one) / 100
        );
    }

    #[test]
    fn a_write_cut_short_at_the_end_of_a_file_is_torn_not_corrupt() {
        let good = frame(3, 1, &["a", "b"]);
        let last = frame(3, 4, &["c"]);
        for cut in [3, HEAD - 1, HEAD + 5, last.len() - 1] {
            let bytes = [&good[..], &last[..cut]].concat();
            let parsed = parse_segment("s", &bytes, true).unwrap();
            assert_eq!(parsed.frames.len(), 1, "cut at {cut}");
            assert!(
                parsed.torn.as_deref().unwrap().contains("frame 2"),
                "{:?}",
                parsed.torn
            );
            // Where nothing can tear (a stream's messages), the same is damage.
            assert!(parse_segment("s", &bytes, false).is_err(), "cut at {cut}");
        }
        let zeros = [&good[..], &[0u8; 100][..]].concat();
        assert_eq!(parse_segment("s", &zeros, true).unwrap().frames.len(), 1);
        let mut flipped = [&good[..], &last[..]].concat();
        let at = flipped.len() - 3;
        flipped[at] ^= 1;
        assert_eq!(parse_segment("s", &flipped, true).unwrap().frames.len(), 1);
    }

    #[test]
    fn damage_before_the_last_frame_is_corrupt_and_other_versions_are_refused() {
        let mut bytes = [frame(3, 1, &["a", "b"]), frame(3, 4, &["c"])].concat();
        bytes[HEAD + 10] ^= 1;
        let e = parse_segment("s", &bytes, true).unwrap_err();
        assert_eq!(
            e,
            FrameError::Corrupt {
                part: "segment s, frame 1".into()
            }
        );
        let mut version = frame(3, 1, &["a"]);
        version[8] = 9;
        assert!(matches!(
            parse_segment("s", &version, true),
            Err(FrameError::Version { found: 9, .. })
        ));
        assert!(matches!(
            parse_segment("s", b"{\"not\": \"a journal, and long enough\"}", true),
            Err(FrameError::BadMagic { .. })
        ));
        assert_eq!(parse_segment("s", b"", true).unwrap().frames, vec![]);
    }
}
