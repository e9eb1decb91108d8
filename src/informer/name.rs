//! [`Name`]: an object name behind one pointer, for the store's table.
//!
//! `Box<str>` is a pointer and a length, 16 bytes in every table slot. [`Name`] keeps the
//! length in the heap allocation instead, as an LEB128 prefix of the UTF-8 bytes (one byte
//! for names under 128 bytes, which is every name Kubernetes validates as a DNS label or
//! subdomain, at most 253): 8 bytes in the slot, one more on the heap. At 100,000 objects
//! the table holds about 1.31 slots per object, so this saves about 9.5 bytes per object,
//! which pays for most of the change paths' fingerprints (16 bytes per slot;
//! `cargo bench --bench state_size`). The crates that do this (`thin_str`) keep a `usize`
//! header, 8 bytes on the heap per name, which would save almost nothing here.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;

/// An owned UTF-8 string behind a thin pointer: `[LEB128 length][bytes]` in one allocation
/// of alignment 1. Immutable once made.
pub struct Name(NonNull<u8>);

// SAFETY: a `Name` owns its allocation exclusively and never mutates it after `new`, like a
// `Box<str>`.
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
    /// A copy of `s`.
    pub fn new(s: &str) -> Name {
        let (prefix, n) = leb128(s.len());
        let layout = layout(n + s.len());
        // SAFETY: the layout has a non-zero size (the prefix is at least one byte).
        let ptr = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            handle_alloc_error(layout)
        };
        // SAFETY: the allocation holds `n + s.len()` bytes: the prefix, then the string.
        unsafe {
            std::ptr::copy_nonoverlapping(prefix.as_ptr(), ptr.as_ptr(), n);
            std::ptr::copy_nonoverlapping(s.as_ptr(), ptr.as_ptr().add(n), s.len());
        }
        Name(ptr)
    }

    /// The prefix's length and the string's length.
    fn header(&self) -> (usize, usize) {
        let (mut len, mut shift, mut i) = (0usize, 0u32, 0usize);
        loop {
            // SAFETY: `new` wrote a complete LEB128 prefix at the start of the allocation;
            // reading stops at its last byte (high bit clear).
            let byte = unsafe { *self.0.as_ptr().add(i) };
            len |= usize::from(byte & 0x7f) << shift;
            i += 1;
            if byte & 0x80 == 0 {
                return (i, len);
            }
            shift += 7;
        }
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        let (at, len) = self.header();
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
        let (at, len) = self.header();
        // SAFETY: the allocation was made by `new` with this very layout.
        unsafe { dealloc(self.0.as_ptr(), layout(at + len)) }
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
        Name::new(self.as_str())
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
}
