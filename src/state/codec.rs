//! The byte-level pieces the snapshot (`snapshot.rs`) and the journal's frames
//! (`journal/frame.rs`) are both made of: little-endian integers, unsigned LEB128 varints
//! (`uvar`), length-prefixed UTF-8 strings (`str`), and an object's uid and resourceVersion in
//! their compact forms behind one flags byte. Never panics on bad input: every read returns
//! what was wrong as text, which each format wraps in its own error with the part it read.

use std::str;

use crate::informer::{Rv, Uid};

/// Flag: the uid is text (`str`), not 16 UUID bytes.
pub const UID_TEXT: u8 = 1;
/// Flag: the resourceVersion is text (`str`), not a `uvar`.
pub const RV_TEXT: u8 = 2;

/// Appends `n` as an unsigned LEB128 integer.
pub fn put_uvar(b: &mut Vec<u8>, mut n: u64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            b.push(byte);
            return;
        }
        b.push(byte | 0x80);
    }
}

/// Writes `n` as a LEB128 integer padded to exactly `out.len()` (10) bytes, for a count
/// patched in after the fact.
pub fn put_uvar_fixed(out: &mut [u8], mut n: u64) {
    let last = out.len() - 1;
    for (i, slot) in out.iter_mut().enumerate() {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        *slot = if i == last { byte } else { byte | 0x80 };
    }
}

/// Appends `s` as a `uvar` length and its UTF-8 bytes.
pub fn put_str(b: &mut Vec<u8>, s: &str) {
    put_uvar(b, s.len() as u64);
    b.extend_from_slice(s.as_bytes());
}

/// Appends the flags byte (`extra` ORed into [`UID_TEXT`] / [`RV_TEXT`]), then `uid` (16
/// bytes or `str`) and `rv` (`uvar` or `str`).
pub fn put_uid_rv(b: &mut Vec<u8>, uid: &Uid<'_>, rv: &Rv<'_>, extra: u8) {
    let mut flags = extra;
    if matches!(uid, Uid::Text(_)) {
        flags |= UID_TEXT;
    }
    if matches!(rv, Rv::Text(_)) {
        flags |= RV_TEXT;
    }
    b.push(flags);
    match uid {
        Uid::Uuid(bytes) => b.extend_from_slice(bytes),
        Uid::Text(t) => put_str(b, t),
    }
    match rv {
        Rv::Number(n) => put_uvar(b, *n),
        Rv::Text(t) => put_str(b, t),
    }
}

/// The `u32` at `at` (the caller checked the length).
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The `u64` at `at` (the caller checked the length).
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A cursor over bytes; a failed read says what and where, never panics.
pub struct Reader<'a> {
    b: &'a [u8],
    /// The offset of the next read.
    pub pos: usize,
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `b`.
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.b.len());
        let Some(end) = end else {
            return Err(format!("{n} bytes needed at offset {}", self.pos));
        };
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// One byte.
    pub fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32_at(self.take(4)?, 0))
    }

    /// `N` bytes.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64_at(self.take(8)?, 0))
    }

    /// An unsigned LEB128 integer of at most 64 bits.
    pub fn uvar(&mut self) -> Result<u64, String> {
        let mut n = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.byte()?;
            if shift == 63 && byte > 1 {
                break;
            }
            n |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(format!("integer too long at offset {}", self.pos))
    }

    /// A `str`.
    pub fn str(&mut self) -> Result<&'a str, String> {
        let len = self.uvar()?;
        let len = usize::try_from(len).map_err(|_| "string too long".to_owned())?;
        let bytes = self.take(len)?;
        str::from_utf8(bytes).map_err(|e| format!("string not UTF-8: {e}"))
    }

    /// What [`put_uid_rv`] wrote: the flags byte, the uid and the resourceVersion.
    pub fn uid_rv(&mut self) -> Result<(u8, Uid<'a>, Rv<'a>), String> {
        let flags = self.byte()?;
        let uid = if flags & UID_TEXT == 0 {
            let mut a = [0; 16];
            a.copy_from_slice(self.take(16)?);
            Uid::Uuid(a)
        } else {
            Uid::Text(self.str()?.into())
        };
        let rv = if flags & RV_TEXT == 0 {
            Rv::Number(self.uvar()?)
        } else {
            Rv::Text(self.str()?.into())
        };
        Ok((flags, uid, rv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_varints_round_trip_at_every_width() {
        for n in [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            let mut b = Vec::new();
            put_uvar(&mut b, n);
            assert_eq!(Reader::new(&b).uvar().unwrap(), n);
            let mut fixed = [0u8; 10];
            put_uvar_fixed(&mut fixed, n);
            assert_eq!(Reader::new(&fixed).uvar().unwrap(), n);
        }
        assert!(Reader::new(&[0xff; 11]).uvar().is_err());
    }

    #[test]
    fn uids_and_resource_versions_round_trip_in_both_forms_with_extra_flags() {
        let u = Uid::parse("ef5a35d5-973f-4ec9-9925-a67e7648ea58");
        for (uid, rv) in [
            (u.clone(), Rv::Number(42)),
            (Uid::Text("odd".into()), Rv::Text("rv-x".into())),
        ] {
            let mut b = Vec::new();
            put_uid_rv(&mut b, &uid, &rv, 4);
            let (flags, got_uid, got_rv) = Reader::new(&b).uid_rv().unwrap();
            assert_eq!((flags & 4, got_uid, got_rv), (4, uid, rv));
        }
        assert!(
            Reader::new(&[0]).uid_rv().is_err(),
            "cut short: an error, no panic"
        );
    }
}
