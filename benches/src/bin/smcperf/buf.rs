//! Message buffers placed at a chosen offset from a page boundary.
//!
//! Where a buffer lies within its page decides the speed of a large copy on some CPUs: on AMD
//! Zen 3 and 4, `rep movsb` (and so glibc's `memcpy` from 4 KiB on) runs at a sixteenth of its
//! speed when the destination lies 1 to 31 bytes past the source modulo 4096, and glibc maps a
//! large allocation on its own, 16 bytes past a page boundary (two 64 KiB `Vec`s allocated one
//! after the other lay 64 KiB + 16 bytes apart). The machine's limits are measured between
//! page-aligned buffers, so that such a slow case is not taken for the machine's limit; the
//! rr, crr (server side) and stream scenarios place their buffers where `--buf-offset` says,
//! to show what a transport does with a buffer in such a place.

use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;

/// A page in bytes (4 KiB on x86-64 and most aarch64; only the offset within one matters).
pub(crate) const PAGE: usize = 4096;

/// `--buf-offset`, set once before any run.
static OFFSET: OnceLock<usize> = OnceLock::new();

/// Places the rr and stream buffers of this process `offset` bytes past a page boundary (from
/// then on); the first call wins.
pub(crate) fn set_offset(offset: usize) {
    let _ = OFFSET.set(offset % PAGE);
}

/// `len` bytes, every one `fill`, at a chosen place within a page.
pub(crate) struct PageBuf {
    mem: Vec<u8>,
    at: usize,
    len: usize,
}

impl PageBuf {
    /// From a page boundary on.
    pub(crate) fn new(len: usize, fill: u8) -> PageBuf {
        PageBuf::placed(0, len, fill)
    }

    /// `offset` (below [`PAGE`]) bytes past a page boundary.
    pub(crate) fn placed(offset: usize, len: usize, fill: u8) -> PageBuf {
        let mem = vec![fill; len + 2 * PAGE];
        let at = mem.as_ptr().align_offset(PAGE) + offset % PAGE;
        PageBuf { mem, at, len }
    }

    /// A message buffer of the rr, crr (server side) and stream scenarios: where `--buf-offset`
    /// says, or where the allocator puts it (a plain `Vec`, as an application's would be).
    pub(crate) fn message(len: usize, fill: u8) -> PageBuf {
        match OFFSET.get() {
            Some(&offset) => PageBuf::placed(offset, len, fill),
            None => PageBuf { mem: vec![fill; len], at: 0, len },
        }
    }
}

impl Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.mem[self.at..self.at + self.len]
    }
}

impl DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.at..self.at + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_lie_where_asked_and_hold_their_fill() {
        for offset in [0, 16, 4095] {
            let b = PageBuf::placed(offset, 5000, 7);
            assert_eq!(b.as_ptr() as usize % PAGE, offset);
            assert_eq!(b.len(), 5000);
            assert!(b.iter().all(|x| *x == 7));
        }
        assert_eq!(PageBuf::new(10, 1).as_ptr() as usize % PAGE, 0);
    }
}
