//! The state snapshot: a versioned binary file holding, per watch, the acknowledged
//! lightweight store in its packed form. Owns the byte layout, its checks and the reasons a
//! part is unusable; never decides what to do about them (`mod.rs` does) and never does I/O.
//!
//! # Layout (format version 3)
//!
//! Integers are little-endian; `uvar` is an unsigned LEB128 integer; `str` is a `uvar` length
//! and UTF-8 bytes.
//!
//! ```text
//! file    := "KSNKSTAT" version:u32 header_len:u32 header_xxh3:u64 header section*
//! header  := cluster:str written_at_ms:u64 sections:u32 generation:u64
//! section := body_len:u64 body_xxh3:u64 body
//! body    := identity:str selection:u64 list_rv:str
//!            namespaces:uvar namespace:str*  entries:uvar entry*
//! entry   := namespace_index:uvar name:str flags:u8
//!            uid:(16 bytes | str if flags&1) rv:(uvar | str if flags&2) fingerprint:u64
//!            parts:16 bytes
//! ```
//!
//! `generation` is the state journal's generation the snapshot was taken at: journal
//! segments of this generation and later hold the new keys sent since
//! (`journal.rs`). Entry flag 4 marks an *unconfirmed* object (sent as `added`, not yet
//! confirmed by every sink; its fingerprint is 0). A key may have several entries: its
//! *former* uids (a `deleted` not yet confirmed by every sink, so downstream may still hold
//! that uid; flag 4) come before its current one, and reading them back in order rebuilds
//! them (`LightStore::restore`). `parts` are the 16-bit fingerprints of the resource's
//! change paths (`Parts`; all zero: unknown). Version 2 is the same without
//! `parts` (read as unknown: the first update of each key after the restore has no
//! `changed`); version 1 (before the journal) is version 2 without `generation` (read as
//! 0) and without flag 4. This build reads all three.
//!
//! Each part carries its own XXH3-64 checksum, so truncation or corruption costs only the
//! parts it touches: a damaged header makes the whole file unusable, a damaged section only
//! its watch. `identity` is `{group}/{Kind}/{namespace}`; `selection` the watch's selection
//! fingerprint (`WatchPlan::selection`). About 65 bytes per object with pod-like names in
//! format 2; format 3 adds the 16 bytes of `parts`.

use std::str;

use xxhash_rust::xxh3::xxh3_64;

use super::codec::{self, put_str, put_uvar, put_uvar_fixed, u32_at, u64_at};
use crate::informer::{Acknowledged, Facts, LightStore, Parts, Rv, Uid};

/// The file's first eight bytes.
pub const MAGIC: &[u8; 8] = b"KSNKSTAT";
/// The format version this build writes (it also reads versions 1 and 2).
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format version this build reads.
pub const OLDEST_READABLE_VERSION: u32 = 1;

/// Entry flag: the object is unconfirmed (the uid and resourceVersion text flags are
/// [`codec::UID_TEXT`] and [`codec::RV_TEXT`]).
const UNCONFIRMED: u8 = 4;

/// Why a snapshot, or one of its sections, cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Not a kubesink state file.
    #[error("not a kubesink state file (it starts with \"{}\", not \"KSNKSTAT\")", .found.escape_ascii())]
    BadMagic {
        /// The first bytes found.
        found: Vec<u8>,
    },
    /// Written by a kubesink with another format.
    #[error("state format version {found}, this kubesink reads versions {OLDEST_READABLE_VERSION} to {FORMAT_VERSION}")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// Shorter than it says.
    #[error("truncated {part}: {needed} bytes needed, {available} left")]
    Truncated {
        /// `header` or `section N`.
        part: String,
        /// Bytes the part declares.
        needed: u64,
        /// Bytes there are.
        available: u64,
    },
    /// The checksum does not match: the bytes were changed.
    #[error("corrupt {part}: checksum mismatch")]
    Corrupt {
        /// `header` or `section N`.
        part: String,
    },
    /// The checksum matched but the content does not parse (another writer's bug).
    #[error("malformed {part}: {what}")]
    Malformed {
        /// `header` or `section N`.
        part: String,
        /// What could not be read.
        what: String,
    },
}

/// Writes a snapshot: [`Writer::new`], [`Writer::section`] per watch, [`Writer::finish`].
pub struct Writer {
    buf: Vec<u8>,
    header_start: usize,
    sections: u32,
    version: u32,
}

impl Writer {
    /// A snapshot of cluster `cluster`, written at `written_at_ms` (milliseconds since the
    /// Unix epoch; informational), taken at journal generation `generation`.
    pub fn new(cluster: &str, written_at_ms: u64, generation: u64) -> Self {
        Self::of_version(FORMAT_VERSION, cluster, written_at_ms, generation)
    }

    /// A writer of an older format `version` (2: without parts), as an earlier kubesink
    /// wrote it: what the tests of reading old states start from.
    #[cfg(test)]
    pub fn new_of_version(version: u32, cluster: &str, written_at_ms: u64) -> Self {
        Self::of_version(version, cluster, written_at_ms, 0)
    }

    fn of_version(version: u32, cluster: &str, written_at_ms: u64, generation: u64) -> Self {
        let mut buf = Vec::with_capacity(1 << 16);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&version.to_le_bytes());
        buf.extend_from_slice(&[0; 12]); // header length and checksum, patched by finish
        let header_start = buf.len();
        put_str(&mut buf, cluster);
        buf.extend_from_slice(&written_at_ms.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes()); // section count, patched by finish
        buf.extend_from_slice(&generation.to_le_bytes());
        Writer {
            buf,
            header_start,
            sections: 0,
            version,
        }
    }

    /// Appends one watch's acknowledged state. Returns the number of objects written and, of
    /// those, the unconfirmed.
    pub fn section(
        &mut self,
        identity: &str,
        selection: u64,
        state: &Acknowledged<'_>,
    ) -> (u64, u64) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 16]); // body length and checksum, patched below
        let body = self.buf.len();
        let b = &mut self.buf;
        put_str(b, identity);
        b.extend_from_slice(&selection.to_le_bytes());
        put_str(b, state.list_resource_version());
        let namespaces = state.namespaces();
        put_uvar(b, namespaces.len() as u64);
        for ns in namespaces {
            put_str(b, ns);
        }
        let count_at = b.len();
        b.extend_from_slice(&[0; 10]); // entry count, a fixed-width uvar patched below
        let (mut count, mut unconfirmed) = (0u64, 0u64);
        let parts = self.version >= 3;
        state.for_each(|ns, name, facts| {
            count += 1;
            unconfirmed += u64::from(facts.unconfirmed);
            put_entry(b, ns, name, facts, parts);
        });
        put_uvar_fixed(&mut b[count_at..count_at + 10], count);
        let len = (self.buf.len() - body) as u64;
        let sum = xxh3_64(&self.buf[body..]);
        self.buf[start..start + 8].copy_from_slice(&len.to_le_bytes());
        self.buf[start + 8..start + 16].copy_from_slice(&sum.to_le_bytes());
        self.sections += 1;
        (count, unconfirmed)
    }

    /// The finished file.
    pub fn finish(mut self) -> Vec<u8> {
        let end = self.header_start + header_len(&self.buf[self.header_start..]);
        self.buf[end - 12..end - 8].copy_from_slice(&self.sections.to_le_bytes());
        let len = (end - self.header_start) as u32;
        let sum = xxh3_64(&self.buf[self.header_start..end]);
        self.buf[12..16].copy_from_slice(&len.to_le_bytes());
        self.buf[16..24].copy_from_slice(&sum.to_le_bytes());
        self.buf
    }
}

/// The length of a version 2 header body at the start of `b` (cluster str, u64, u32, u64).
fn header_len(b: &[u8]) -> usize {
    let mut r = codec::Reader::new(b);
    let _ = r.str();
    r.pos + 20
}

fn put_entry(b: &mut Vec<u8>, ns: u32, name: &str, facts: &Facts<'_>, parts: bool) {
    put_uvar(b, u64::from(ns));
    put_str(b, name);
    let extra = if facts.unconfirmed { UNCONFIRMED } else { 0 };
    codec::put_uid_rv(b, &facts.uid, &facts.rv, extra);
    b.extend_from_slice(&facts.fingerprint.to_le_bytes());
    if parts {
        b.extend_from_slice(&facts.parts.to_bytes());
    }
}

/// A parsed snapshot: the header, and each section checked but not yet decoded.
#[derive(Debug)]
pub struct Snapshot<'a> {
    /// `cluster.name` of the kubesink that wrote it.
    pub cluster: String,
    /// When it was written, milliseconds since the Unix epoch.
    pub written_at_ms: u64,
    /// Sections the header announces.
    pub announced: u32,
    /// The journal generation it was taken at (0 for version 1).
    pub generation: u64,
    /// The sections found, in file order.
    pub sections: Vec<Result<Section<'a>, Damaged>>,
}

impl<'a> Snapshot<'a> {
    /// The section of the watch `identity`, whole or damaged (a damaged one's identity is
    /// known when its header could be read).
    pub fn section(&self, identity: &str) -> Option<&Result<Section<'a>, Damaged>> {
        self.sections.iter().find(|s| match s {
            Ok(s) => s.identity == identity,
            Err(d) => d.identity.as_deref() == Some(identity),
        })
    }
}

/// A section whose checksum matched.
#[derive(Debug)]
pub struct Section<'a> {
    /// `{group}/{Kind}/{namespace}` of the watch.
    pub identity: String,
    /// The watch's selection fingerprint when it was saved.
    pub selection: u64,
    /// The resourceVersion of the watch's last completed list.
    pub list_resource_version: String,
    part: String,
    rest: &'a [u8],
    /// The file's format version (entries of versions before 3 have no parts).
    version: u32,
}

/// A section that cannot be used.
#[derive(Debug)]
pub struct Damaged {
    /// Its identity, if still readable (unverified: the bytes failed their check).
    pub identity: Option<String>,
    /// Why.
    pub error: SnapshotError,
}

/// Parses a snapshot's header and checks each section.
///
/// # Errors
/// [`SnapshotError`] when the header is unusable (magic, version, truncation, checksum):
/// then no part of the file can be trusted.
pub fn parse(bytes: &[u8]) -> Result<Snapshot<'_>, SnapshotError> {
    let truncated = |needed: usize| SnapshotError::Truncated {
        part: "header".into(),
        needed: needed as u64,
        available: bytes.len() as u64,
    };
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        if bytes.len() < 8 && MAGIC.starts_with(bytes) {
            return Err(truncated(8));
        }
        return Err(SnapshotError::BadMagic {
            found: bytes.iter().take(8).copied().collect(),
        });
    }
    if bytes.len() < 24 {
        return Err(truncated(24));
    }
    let found = u32_at(bytes, 8);
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&found) {
        return Err(SnapshotError::Version { found });
    }
    let header_len = u32_at(bytes, 12) as usize;
    let header_sum = u64_at(bytes, 16);
    let header = bytes
        .get(24..24 + header_len)
        .ok_or(truncated(24 + header_len))?;
    if xxh3_64(header) != header_sum {
        return Err(SnapshotError::Corrupt {
            part: "header".into(),
        });
    }
    let mut r = Reader::new(header, "header");
    let cluster = r.str()?.to_owned();
    let written_at_ms = r.u64()?;
    let announced = r.u32()?;
    let generation = if found >= 2 { r.u64()? } else { 0 };
    let mut sections = Vec::new();
    let mut at = 24 + header_len;
    while at < bytes.len() {
        let part = format!("section {}", sections.len() + 1);
        let Some(head) = bytes.get(at..at + 16) else {
            sections.push(Err(Damaged {
                identity: None,
                error: SnapshotError::Truncated {
                    part,
                    needed: 16,
                    available: (bytes.len() - at) as u64,
                },
            }));
            break;
        };
        let len = u64_at(head, 0);
        let sum = u64_at(head, 8);
        let start = at + 16;
        let available = (bytes.len() - start) as u64;
        if len > available {
            let body = &bytes[start..];
            sections.push(Err(Damaged {
                identity: Reader::new(body, &part).str().ok().map(str::to_owned),
                error: SnapshotError::Truncated {
                    part,
                    needed: len,
                    available,
                },
            }));
            break;
        }
        // `len <= available`, which fits in memory, so it fits in usize.
        let end = start + len as usize;
        let body = &bytes[start..end];
        at = end;
        if xxh3_64(body) != sum {
            let identity = Reader::new(body, &part).str().ok().map(str::to_owned);
            sections.push(Err(Damaged {
                identity,
                error: SnapshotError::Corrupt { part },
            }));
            continue;
        }
        sections.push(Section::parse(body, part, found).map_err(|error| Damaged {
            identity: None,
            error,
        }));
    }
    Ok(Snapshot {
        cluster,
        written_at_ms,
        announced,
        generation,
        sections,
    })
}

impl<'a> Section<'a> {
    fn parse(body: &'a [u8], part: String, version: u32) -> Result<Self, SnapshotError> {
        let mut r = Reader::new(body, &part);
        let identity = r.str()?.to_owned();
        let selection = r.u64()?;
        let list_resource_version = r.str()?.to_owned();
        let rest = &body[r.at()..];
        Ok(Section {
            identity,
            selection,
            list_resource_version,
            part,
            rest,
            version,
        })
    }

    /// Decodes the entries into a store.
    ///
    /// # Errors
    /// [`SnapshotError::Malformed`] when the (checksummed) bytes do not parse.
    pub fn store(&self) -> Result<LightStore, SnapshotError> {
        let mut r = Reader::new(self.rest, &self.part);
        let mut store = LightStore::new();
        let namespaces = r.uvar()?;
        let mut ids = Vec::new();
        for _ in 0..namespaces {
            let ns = r.str()?;
            ids.push(store.intern(Some(ns)));
        }
        let entries = r.uvar()?;
        for _ in 0..entries {
            let ns = r.uvar()?;
            let id = usize::try_from(ns)
                .ok()
                .and_then(|i| ids.get(i))
                .copied()
                .ok_or_else(|| r.malformed(format!("namespace index {ns} out of range")))?;
            let name = r.str()?;
            let (flags, uid, rv) = r.uid_rv()?;
            let fingerprint = r.u64()?;
            let parts = if self.version >= 3 {
                Parts::from_bytes(r.array()?)
            } else {
                Parts::UNKNOWN
            };
            store.restore(
                id,
                name,
                &Facts {
                    uid,
                    rv,
                    fingerprint,
                    parts,
                    unconfirmed: flags & UNCONFIRMED != 0,
                },
            );
        }
        if r.at() != self.rest.len() {
            return Err(r.malformed(format!(
                "{} bytes after the last entry",
                self.rest.len() - r.at()
            )));
        }
        Ok(store)
    }
}

/// A cursor over checked bytes ([`codec::Reader`]) whose failures are
/// [`SnapshotError::Malformed`] naming the part read.
struct Reader<'a> {
    r: codec::Reader<'a>,
    part: &'a str,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8], part: &'a str) -> Self {
        Reader {
            r: codec::Reader::new(b),
            part,
        }
    }

    fn malformed(&self, what: String) -> SnapshotError {
        SnapshotError::Malformed {
            part: self.part.to_owned(),
            what,
        }
    }

    fn at(&self) -> usize {
        self.r.pos
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.r.u32().map_err(|w| self.malformed(w))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        self.r.u64().map_err(|w| self.malformed(w))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        self.r.array().map_err(|w| self.malformed(w))
    }

    fn uvar(&mut self) -> Result<u64, SnapshotError> {
        self.r.uvar().map_err(|w| self.malformed(w))
    }

    fn str(&mut self) -> Result<&'a str, SnapshotError> {
        self.r.str().map_err(|w| self.malformed(w))
    }

    #[allow(clippy::type_complexity)] // the three fields of one entry
    fn uid_rv(&mut self) -> Result<(u8, Uid<'a>, Rv<'a>), SnapshotError> {
        self.r.uid_rv().map_err(|w| self.malformed(w))
    }
}

#[cfg(test)]
mod tests;
