//! [`Name`]: an object name behind one pointer, for the store's table, with room for a
//! fixed-size tail of bytes when the object has one.
//!
//! `Box<str>` is a pointer and a length, 16 bytes in every table slot. [`Name`] keeps the
//! length in the heap allocation instead, as an LEB128 prefix of the UTF-8 bytes: 8 bytes in
//! the slot, one more on the heap (the prefix is one byte for names under 64 bytes, two up to
//! 8,191; Kubernetes names are DNS labels or subdomains, at most 253). At 100,000 objects the
//! table holds about 1.31 slots per object, so each byte moved out of the slot saves 1.31 per
//! object (`cargo bench --bench state_size`). The crates that do this (`thin_str`) keep a
//! `usize` header, 8 bytes on the heap per name, which would save almost nothing here.
//!
//! The tail ([`TAIL`] bytes after the string, the prefix's low bit saying it is there) holds
//! the change paths' fingerprints of the objects that have them: in the slot they would cost
//! 16 bytes × 1.31 per object (and every empty slot too), here 16 bytes, and nothing to an
//! object without them.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;

/// Bytes of the optional tail after the string.
pub const TAIL: usize = 16;

/// An owned UTF-8 string behind a thin pointer: `[LEB128 (length << 1 | has tail)][bytes]
/// [TAIL bytes when it has a tail]` in one allocation of alignment 1. The string is immutable
/// once made; the tail's bytes can be rewritten in place ([`Name::set_tail`]).
pub struct Name(NonNull<u8>);

// SAFETY: a `Name` owns its allocation exclusively, like a `Box<[u8]>`; the tail is written
// only through `&mut self`.
unsafe impl Send for Name {}
// SAFETY: as above: shared access only reads.
unsafe impl Sync for Name {}

/// The LEB128 form of `n`: its bytes and how many there are.
fn leb128(mut n: usize) -> ([u8; 10], usize) {
    let mut out = [0u8; 10];
    let mut i = 0;
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out[i] = byte;
            return (out, i + 1);
        }
        out[i] = byte | 0x80;
        i += 1;
    }
}

fn layout(size: usize) -> Layout {
    match Layout::from_size_align(size, 1) {
        Ok(l) => l,
        // Only for a size beyond `isize::MAX`, which no string in memory has.
        Err(_) => handle_alloc_error(Layout::new::<u8>()),
    }
}

impl Name {
    /// A copy of `s`, without a tail.
    pub fn new(s: &str) -> Name {
        Name::with_tail(s, None)
    }

    /// A copy of `s`, with `tail` after it when given.
    pub fn with_tail(s: &str, tail: Option<[u8; TAIL]>) -> Name {
        let (prefix, n) = leb128(s.len() << 1 | usize::from(tail.is_some()));
        let size = n + s.len() + tail.map_or(0, |_| TAIL);
        let layout = layout(size);
        // SAFETY: the layout has a non-zero size (the prefix is at least one byte).
        let ptr = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            handle_alloc_error(layout)
        };
        // SAFETY: the allocation holds `size` bytes: the prefix, the string, the tail if any.
        unsafe {
            std::ptr::copy_nonoverlapping(prefix.as_ptr(), ptr.as_ptr(), n);
            std::ptr::copy_nonoverlapping(s.as_ptr(), ptr.as_ptr().add(n), s.len());
            if let Some(tail) = tail {
                std::ptr::copy_nonoverlapping(tail.as_ptr(), ptr.as_ptr().add(n + s.len()), TAIL);
            }
        }
        Name(ptr)
    }

    /// The prefix's length, the string's length, and whether a tail follows it.
    fn header(&self) -> (usize, usize, bool) {
        let (mut word, mut shift, mut i) = (0usize, 0u32, 0usize);
        loop {
            // SAFETY: `with_tail` wrote a complete LEB128 prefix at the start of the
            // allocation; reading stops at its last byte (high bit clear).
            let byte = unsafe { *self.0.as_ptr().add(i) };
            word |= usize::from(byte & 0x7f) << shift;
            i += 1;
            if byte & 0x80 == 0 {
                return (i, word >> 1, word & 1 == 1);
            }
            shift += 7;
        }
    }

    /// The tail, when this name has one.
    pub fn tail(&self) -> Option<[u8; TAIL]> {
        let (at, len, has) = self.header();
        has.then(|| {
            let mut out = [0u8; TAIL];
            // SAFETY: a name with a tail has `TAIL` bytes after its string.
            unsafe {
                std::ptr::copy_nonoverlapping(self.0.as_ptr().add(at + len), out.as_mut_ptr(), TAIL)
            };
            out
        })
    }

    /// Rewrites the tail in place; `false` (nothing written) when this name has none:
    /// [`Name::with_tail`] makes one that has.
    pub fn set_tail(&mut self, tail: [u8; TAIL]) -> bool {
        let (at, len, has) = self.header();
        if has {
            // SAFETY: as in `tail`; `&mut self` owns the allocation exclusively.
            unsafe {
                std::ptr::copy_nonoverlapping(tail.as_ptr(), self.0.as_ptr().add(at + len), TAIL)
            };
        }
        has
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        let (at, len, _) = self.header();
        // SAFETY: `new` copied `len` bytes of a `str` (valid UTF-8) after the prefix, and
        // they live as long as `self`.
        unsafe {
            let bytes = std::slice::from_raw_parts(self.0.as_ptr().add(at), len);
            std::str::from_utf8_unchecked(bytes)
        }
    }
}

impl Drop for Name {
    fn drop(&mut self) {
        let (at, len, has) = self.header();
        // SAFETY: the allocation was made by `with_tail` with this very layout.
        unsafe {
            dealloc(
                self.0.as_ptr(),
                layout(at + len + if has { TAIL } else { 0 }),
            )
        }
    }
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl Clone for Name {
    fn clone(&self) -> Name {
        Name::with_tail(self.as_str(), self.tail())
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_every_prefix_length_round_trip() {
        for len in [0, 1, 127, 128, 253, 16_383, 16_384, 70_000] {
            let s: String = "é".repeat(len / 2) + &"a".repeat(len % 2);
            let n = Name::new(&s);
            assert_eq!(n.as_str(), s, "length {len}");
            assert_eq!(&*n.clone(), s.as_str());
            assert_eq!(format!("{n:?}"), format!("{s:?}"));
        }
        assert_eq!(std::mem::size_of::<Name>(), 8);
        assert_eq!(std::mem::size_of::<Option<Name>>(), 8);
        assert_eq!(leb128(300), ([0xac, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], 2));
    }

    #[test]
    fn a_tail_follows_the_string_and_is_rewritten_in_place() {
        for len in [0, 1, 63, 64, 127, 128, 253, 70_000] {
            let s = "n".repeat(len);
            let mut plain = Name::new(&s);
            assert_eq!(plain.tail(), None, "length {len}");
            assert!(
                !plain.set_tail([7; TAIL]),
                "a name without a tail has none written"
            );
            assert_eq!((plain.as_str(), plain.tail()), (s.as_str(), None));

            let mut tailed = Name::with_tail(&s, Some([1; TAIL]));
            assert_eq!(
                (tailed.as_str(), tailed.tail()),
                (s.as_str(), Some([1; TAIL]))
            );
            let mut other = [0u8; TAIL];
            other[TAIL - 1] = 9;
            assert!(tailed.set_tail(other));
            assert_eq!((tailed.as_str(), tailed.tail()), (s.as_str(), Some(other)));
            let copy = tailed.clone();
            assert_eq!((copy.as_str(), copy.tail()), (s.as_str(), Some(other)));
        }
    }
}
