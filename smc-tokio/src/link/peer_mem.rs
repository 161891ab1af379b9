//! Copies to and from memory that something outside this process may access at the same time:
//! the peer's region (mapped read-only here, written by the peer process at any time) and, on
//! RDMA, our receive buffers (written by the peer's adapter whenever the peer posts a WRITE).
//!
//! Rust's memory model has no notion of another process, so a plain `memcpy` from such memory
//! is a data race by the letter of the rules (undefined behaviour) whenever a hostile or broken
//! peer writes while we copy. The sound way is what C++ P1478 calls a byte-wise atomic memcpy:
//! every byte is read (or written) by an atomic access, here relaxed loads and stores of whole
//! aligned words with single bytes at the unaligned ends. Relaxed loads no wider than a
//! register are the only atomic accesses Rust allows on read-only memory (the `core::sync::
//! atomic` documentation, "Atomic accesses to read-only memory"), which the peer's region is.
//! Ordering comes from elsewhere: the copy runs after the acquire that published the bytes (the
//! CDC cursor), so a well-behaved peer's bytes are all visible; a peer that scribbles
//! meanwhile gets its own garbage back, never undefined behaviour.
//!
//! On x86-64 and aarch64 a relaxed word load or store compiles to a plain `mov`/`ldr`/`str`, so
//! the cost against `memcpy` is the lost vectorisation (measured in the changelog: `smcperf`
//! stream before and after).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

const WORD: usize = std::mem::size_of::<u64>();
/// Words per step of the main loop: eight independent loads in flight (a cache line).
const UNROLL: usize = 8;

/// Copies `dst.len()` bytes from `src` into `dst` with relaxed atomic loads.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes (mapped and readable; it may be read-only
/// and may be written concurrently by another process or a device) for the whole call, and must
/// not overlap `dst`.
pub(crate) unsafe fn copy_from_peer(src: *const u8, dst: &mut [MaybeUninit<u8>]) {
    let len = dst.len();
    // Bytes until `src` is word aligned (or the whole copy, if it is shorter).
    let head = src.align_offset(WORD).min(len);
    let mut i = 0;
    while i < head {
        // SAFETY: i < len: in bounds of `src` (caller's contract); a byte is always aligned.
        dst[i] = MaybeUninit::new(unsafe { &*src.add(i).cast::<AtomicU8>() }.load(Ordering::Relaxed));
        i += 1;
    }
    let words = (len - head) / WORD;
    // In the loops below, `src + head` is word aligned and each word index is below `words`,
    // so every load is in bounds of `src` and aligned; every store is in bounds of `dst` (same
    // offsets, `dst` is `len` long) and written unaligned.
    // SAFETY: head <= len, so both offsets are in bounds (or one past the end) of their spans.
    let (s, d) = unsafe { (src.add(head), dst.as_mut_ptr().add(head).cast::<u8>()) };
    let mut w = 0;
    while w + UNROLL <= words {
        let mut v = [0u64; UNROLL];
        for (k, slot) in v.iter_mut().enumerate() {
            // SAFETY: see above.
            *slot = unsafe { &*s.add((w + k) * WORD).cast::<AtomicU64>() }.load(Ordering::Relaxed);
        }
        for (k, x) in v.iter().enumerate() {
            // SAFETY: see above.
            unsafe { d.add((w + k) * WORD).cast::<u64>().write_unaligned(*x) };
        }
        w += UNROLL;
    }
    while w < words {
        // SAFETY: see above.
        let x = unsafe { &*s.add(w * WORD).cast::<AtomicU64>() }.load(Ordering::Relaxed);
        // SAFETY: see above.
        unsafe { d.add(w * WORD).cast::<u64>().write_unaligned(x) };
        w += 1;
    }
    let mut i = head + words * WORD;
    while i < len {
        // SAFETY: i < len: in bounds.
        dst[i] = MaybeUninit::new(unsafe { &*src.add(i).cast::<AtomicU8>() }.load(Ordering::Relaxed));
        i += 1;
    }
}

/// Copies `src` to `dst` with relaxed atomic stores (for our RDMA receive buffers, which the
/// peer's adapter may write at any time).
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes (mapped and writable; it may be written
/// or read concurrently by a device or another process) for the whole call, and must not
/// overlap `src`.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) unsafe fn copy_to_peer(dst: *mut u8, src: &[u8]) {
    let len = src.len();
    let head = dst.align_offset(WORD).min(len);
    for (i, b) in src[..head].iter().enumerate() {
        // SAFETY: i < len: in bounds of `dst` (caller's contract).
        unsafe { &*dst.add(i).cast::<AtomicU8>() }.store(*b, Ordering::Relaxed);
    }
    let words = (len - head) / WORD;
    for w in 0..words {
        let at = head + w * WORD;
        let mut b = [0u8; WORD];
        b.copy_from_slice(&src[at..at + WORD]);
        // SAFETY: `dst + head` is word aligned and word w is inside the span.
        unsafe { &*dst.add(at).cast::<AtomicU64>() }.store(u64::from_ne_bytes(b), Ordering::Relaxed);
    }
    for (i, b) in src.iter().enumerate().skip(head + words * WORD) {
        // SAFETY: i < len: in bounds.
        unsafe { &*dst.add(i).cast::<AtomicU8>() }.store(*b, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment of source and destination and every length up to a few words, against
    /// a plain copy (also run under Miri: it checks the accesses are in bounds and aligned).
    #[test]
    fn copies_match_a_plain_copy_at_every_alignment() {
        let src: Vec<u8> = (0..200u8).collect();
        for off in 0..9 {
            for len in [0usize, 1, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65, 100, 150] {
                let mut dst = vec![MaybeUninit::new(0xEEu8); len + 3];
                // SAFETY: off + len <= 200 bytes of `src`, which does not overlap `dst`.
                unsafe { copy_from_peer(src.as_ptr().add(off), &mut dst[3..]) };
                // SAFETY: every byte was initialised (filled with 0xEE, then overwritten).
                let got: Vec<u8> = dst.iter().map(|b| unsafe { b.assume_init() }).collect();
                assert_eq!(&got[..3], &[0xEE; 3]);
                assert_eq!(&got[3..], &src[off..off + len], "from offset {off}, {len} bytes");

                let mut out = vec![0xEEu8; len + 11];
                // SAFETY: `out[off..off + len]` is inside `out` and does not overlap `src`.
                unsafe { copy_to_peer(out.as_mut_ptr().add(off), &src[..len]) };
                assert_eq!(&out[off..off + len], &src[..len], "to offset {off}, {len} bytes");
                assert!(out[..off].iter().chain(&out[off + len..]).all(|b| *b == 0xEE));
            }
        }
    }
}
