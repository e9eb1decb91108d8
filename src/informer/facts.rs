//! What the store remembers of one object (uid, resourceVersion, fingerprint), in the store's
//! compact form but outside its table: the acknowledged state keeps these for keys with
//! unacknowledged changes, and the state snapshot writes and reads them.
//!
//! Owns the compact encodings' two cases (a UUID uid as 16 bytes or its text; a decimal
//! resourceVersion as a `u64` or its text). Never renders or parses more than it is asked to:
//! the common case (UUID, decimal) stays in bytes and integers.

use std::borrow::Cow;

use uuid::Uuid;

/// A canonical lowercase UUID (what the API server issues) as 16 bytes.
pub(super) fn uuid_bytes(uid: &str) -> Option<[u8; 16]> {
    Uuid::try_parse(uid)
        .ok()
        .filter(|u| u.hyphenated().to_string() == uid)
        .map(|u| *u.as_bytes())
}

/// A decimal resourceVersion (what etcd-backed servers issue) that renders back identically.
pub(super) fn decimal_rv(rv: &str) -> Option<u64> {
    rv.parse::<u64>().ok().filter(|n| n.to_string() == rv)
}

/// A uid: 16 bytes when it is a canonical lowercase UUID (what the API server issues), else
/// its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Uid<'a> {
    /// A canonical UUID.
    Uuid([u8; 16]),
    /// Any other text.
    Text(Cow<'a, str>),
}

/// A resourceVersion: a `u64` when decimal and rendering back identically (etcd-backed
/// servers), else its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rv<'a> {
    /// A decimal resourceVersion.
    Number(u64),
    /// Any other text (opaque, as the API conventions allow).
    Text(Cow<'a, str>),
}

/// How many change paths a resource can have: the slots of [`Parts`].
pub const PART_SLOTS: usize = 8;

/// The 16-bit fingerprints of an object's change paths, one per slot (the paths of
/// `changes.rs`'s [`super::changes::ChangePaths`], in their order): what lets an `updated`
/// say which paths changed without the old object. 16 bytes per object: the memory budget
/// for the default paths (`docs/architecture.md`, "Lightweight informer"). All zero means
/// unknown (state saved by a kubesink without them, an unconfirmed object, a layout of
/// other paths): the next update's `changed` is then unknown rather than guessed. 16 bits
/// per path: a path that changed keeps its 16-bit fingerprint with probability 2⁻¹⁶, and
/// is then missing from `changed` (docs/message-contract.md says so); whether anything
/// changed at all is still decided by the 64-bit fingerprint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Parts(pub [u16; PART_SLOTS]);

impl Parts {
    /// Unknown parts.
    pub const UNKNOWN: Parts = Parts([0; PART_SLOTS]);

    /// Whether these are known (not [`Parts::UNKNOWN`]).
    pub fn is_known(&self) -> bool {
        *self != Parts::UNKNOWN
    }

    /// The slots whose fingerprints differ between `self` (before) and `after`, as a bit mask
    /// (bit `i` = slot `i`); `None` when either side is unknown.
    pub fn differing(&self, after: &Parts) -> Option<u8> {
        if !self.is_known() || !after.is_known() {
            return None;
        }
        let mut mask = 0u8;
        for (i, (a, b)) in self.0.iter().zip(after.0.iter()).enumerate() {
            if a != b {
                mask |= 1 << i;
            }
        }
        Some(mask)
    }

    /// The 16 bytes of the saved state (little-endian slots).
    pub fn to_bytes(self) -> [u8; 2 * PART_SLOTS] {
        let mut out = [0; 2 * PART_SLOTS];
        for (i, p) in self.0.iter().enumerate() {
            out[2 * i..2 * i + 2].copy_from_slice(&p.to_le_bytes());
        }
        out
    }

    /// Parts from [`Parts::to_bytes`]'s form.
    pub fn from_bytes(b: [u8; 2 * PART_SLOTS]) -> Parts {
        let mut out = [0; PART_SLOTS];
        for (i, p) in out.iter_mut().enumerate() {
            *p = u16::from_le_bytes([b[2 * i], b[2 * i + 1]]);
        }
        Parts(out)
    }
}

/// One object's facts: uid, resourceVersion and the fingerprint of its emitted payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts<'a> {
    /// The uid.
    pub uid: Uid<'a>,
    /// The last resourceVersion seen.
    pub rv: Rv<'a>,
    /// XXH3-64 of the emitted payload (see `payload::fingerprint`).
    pub fingerprint: u64,
    /// The change paths' fingerprints of the last emitted payload ([`Parts`]).
    pub parts: Parts,
    /// The object was sent as `added` and no sink has confirmed it yet (as far as the saved
    /// state knows): downstream may or may not have it, and `fingerprint` is not what it has.
    /// Restored from the write-ahead journal or from a snapshot taken while the `added` was
    /// outstanding (`state/journal.rs`). The next list re-sends it (`added`) when it is
    /// still there, or sends its `deleted` when it is gone.
    pub unconfirmed: bool,
}

impl<'a> Uid<'a> {
    /// The compact form of `uid`.
    pub fn parse(uid: &'a str) -> Self {
        match uuid_bytes(uid) {
            Some(b) => Uid::Uuid(b),
            None => Uid::Text(Cow::Borrowed(uid)),
        }
    }

    /// The uid as the API server wrote it.
    pub fn render(&self) -> String {
        match self {
            Uid::Uuid(b) => Uuid::from_bytes(*b).hyphenated().to_string(),
            Uid::Text(t) => t.to_string(),
        }
    }

    /// An owned copy.
    pub fn into_owned(self) -> Uid<'static> {
        match self {
            Uid::Uuid(b) => Uid::Uuid(b),
            Uid::Text(t) => Uid::Text(Cow::Owned(t.into_owned())),
        }
    }
}

impl<'a> Rv<'a> {
    /// The compact form of `rv`.
    pub fn parse(rv: &'a str) -> Self {
        match decimal_rv(rv) {
            Some(n) => Rv::Number(n),
            None => Rv::Text(Cow::Borrowed(rv)),
        }
    }

    /// The resourceVersion as the API server wrote it.
    pub fn render(&self) -> String {
        match self {
            Rv::Number(n) => n.to_string(),
            Rv::Text(t) => t.to_string(),
        }
    }

    /// An owned copy.
    pub fn into_owned(self) -> Rv<'static> {
        match self {
            Rv::Number(n) => Rv::Number(n),
            Rv::Text(t) => Rv::Text(Cow::Owned(t.into_owned())),
        }
    }
}

impl Facts<'_> {
    /// Facts from the texts the API server wrote (compacted where possible).
    pub fn from_text(uid: &str, rv: &str, fingerprint: u64) -> Facts<'static> {
        Facts {
            uid: Uid::parse(uid).into_owned(),
            rv: Rv::parse(rv).into_owned(),
            fingerprint,
            parts: Parts::UNKNOWN,
            unconfirmed: false,
        }
    }

    /// The facts of an object sent as `added` and not yet confirmed by every sink: its uid
    /// and resourceVersion, no fingerprint (see [`Facts::unconfirmed`]).
    pub fn unconfirmed(uid: Uid<'_>, rv: Rv<'_>) -> Facts<'static> {
        Facts {
            uid: uid.into_owned(),
            rv: rv.into_owned(),
            fingerprint: 0,
            parts: Parts::UNKNOWN,
            unconfirmed: true,
        }
    }

    /// An owned copy.
    pub fn into_owned(self) -> Facts<'static> {
        Facts {
            uid: self.uid.into_owned(),
            rv: self.rv.into_owned(),
            fingerprint: self.fingerprint,
            parts: self.parts,
            unconfirmed: self.unconfirmed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_forms_round_trip_and_odd_texts_stay_text() {
        let u = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";
        assert!(matches!(Uid::parse(u), Uid::Uuid(_)));
        assert_eq!(Uid::parse(u).render(), u);
        let upper = u.to_uppercase();
        assert!(matches!(Uid::parse(&upper), Uid::Text(_)));
        assert_eq!(Uid::parse(&upper).render(), upper);
        assert_eq!(Rv::parse("42"), Rv::Number(42));
        assert!(matches!(Rv::parse("007"), Rv::Text(_)));
        assert_eq!(Rv::parse("007").render(), "007");
        let f = Facts::from_text("x", "abc", 7);
        assert_eq!((f.uid.render(), f.rv.render()), ("x".into(), "abc".into()));
    }
}
