//! Copies to and from memory that something outside this process may access at the same time:
//! the peer's region (mapped read-only here, written by the peer process at any time), our own
//! region (which a peer of our uid can open for writing, `fchmod` on the memfd, and write while
//! we do) and, on RDMA, our receive buffers (written by the peer's adapter whenever the peer
//! posts a WRITE).
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
//! the cost of the word loop against `memcpy` is the lost vectorisation: `smcperf local
//! --scenario stream --size 65536` fell from 13.7-14.1 GB/s (plain `memcpy`) to 11.3-12.9 GB/s
//! with it on the development VM (three interleaved runs each). So on x86-64, copies of [`REP_MOVSB_MIN`] bytes and more use
//! the string instruction `rep movsb` in inline assembly instead, which is what glibc's
//! `memcpy` itself uses for copies of this size on CPUs with fast strings (ERMS). That is sound
//! for the same reason: an `asm!` block is opaque to the compiler and only has to behave like
//! some operation Rust could express, and `rep movsb` is architecturally a sequence of single
//! byte loads and stores (Intel SDM vol. 1, MOVS; its fast-string form may reorder the byte
//! stores among themselves, vol. 3 §9.2.4 "Fast-String Operation and Out-of-Order Stores"):
//! exactly a byte-wise relaxed atomic copy, with no ordering beyond it. Rust's inline assembly
//! ABI guarantees the direction flag is clear on entry, so it copies forwards.
//!
//! `rep movsb` has one bad case on AMD Zen 3 (and, by glibc's bug 30994, Zen 4): when the
//! destination lies 1 to 31 bytes past the source modulo 4096 (the page-offset distance), its
//! fast-string path collapses, 64 KiB copies falling from about 48 GB/s to 3 GB/s on the
//! development VM on a day it was an EPYC of family 25 (a scan of all 4096 distances, from
//! either source alignment, found exactly that window). glibc serves a large allocation (from
//! 128 KiB, by default) with its own mapping, 16 bytes past a page boundary, and a ring
//! position is page aligned whenever the messages are whole pages: a reader of such messages
//! into such a buffer is in the window, and a whole connection stays in it (the distance does
//! not change as the copy advances); smaller buffers lie at any 16-byte offset. On those CPUs
//! ([`short_distance_cliff`]) copies in the window use a loop of unaligned 16-byte SSE2 loads
//! and stores instead ([`VECTOR_WINDOW`]), in inline assembly for the same reason as above: a
//! vector load or store is architecturally a set of byte accesses. Other CPUs keep `rep movsb`
//! at every distance, as measured on them.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::sys;

const WORD: usize = std::mem::size_of::<u64>();
/// Words per step of the main loop: eight independent loads in flight (a cache line).
const UNROLL: usize = 8;

/// Copies of at least this many bytes use `rep movsb` on x86-64; shorter ones the word loop.
/// From `cargo bench -p benches --bench peer_copy` on the development VM (on a day it was a
/// Xeon with ERMS and FSRM): the two are equal at 512 bytes; from 1 KiB on `rep movsb` wins (43
/// against 36 GB/s at 1 KiB, 95 against 41 at 4 KiB, 39 against 24 at 64 KiB, where `memcpy`
/// also gives 39). On the EPYC of a later day, at a distance of 0: 38-43 against 27 at 1 KiB,
/// 46 against 30 at 64 KiB.
#[cfg(all(target_arch = "x86_64", not(miri)))]
const REP_MOVSB_MIN: usize = 1024;

/// Copies `len` bytes from `src` to `dst` with `rep movsb` (see the module docs for why that is
/// a byte-wise relaxed atomic copy).
///
/// # Safety
/// `src` valid for reads and `dst` valid for writes of `len` bytes, not overlapping.
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn rep_movsb(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller gives `len` readable bytes at `src` and `len` writable ones at `dst`;
    // `rep movsb` reads and writes exactly those (forwards: the direction flag is clear on entry
    // to inline assembly), uses no stack and leaves the flags as they were.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags)
        );
    }
}

/// The page-offset distances `(dst - src) % 4096` at which [`copy_big`] does not use `rep movsb`.
/// Measured on a Zen 3 (the module docs): 1 to 31 bytes fall to a sixteenth of the speed, 32
/// and up do not. The window reaches 63 because other parts of the family have not been
/// measured, and the vector loop's loss against `rep movsb` between 32 and 63 is about a third,
/// far from the cliff's sixteenfold (64 KiB at a distance of 33: 34 GB/s by `rep movsb`, 22 by
/// the loop; 3 by `rep movsb` at a distance of 16).
#[cfg(all(target_arch = "x86_64", not(miri)))]
const VECTOR_WINDOW: std::ops::RangeInclusive<usize> = 1..=63;

/// Bytes per step of [`copy_blocks`]: four 16-byte registers.
#[cfg(all(target_arch = "x86_64", not(miri)))]
const BLOCK: usize = 64;

// `copy_big` copies a tail shorter than a block as the span's last whole block.
#[cfg(all(target_arch = "x86_64", not(miri)))]
const _: () = assert!(REP_MOVSB_MIN >= BLOCK);

/// Copies `blocks` blocks of [`BLOCK`] bytes from `src` to `dst` with unaligned SSE2 loads and
/// stores (every x86-64 CPU has SSE2).
///
/// # Safety
/// `src` valid for reads and `dst` valid for writes of `blocks * BLOCK` bytes, not overlapping.
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn copy_blocks(src: *const u8, dst: *mut u8, blocks: usize) {
    if blocks == 0 {
        return;
    }
    // SAFETY: the caller gives `blocks * 64` readable bytes at `src` and as many writable ones
    // at `dst`; the loop reads and writes exactly those, 64 at a time, with unaligned accesses
    // (`movdqu` has no alignment requirement), touches no stack and clobbers only the four
    // vector registers and the flags, which are declared.
    unsafe {
        std::arch::asm!(
            "2:",
            "movdqu {a}, [{s}]",
            "movdqu {b}, [{s} + 16]",
            "movdqu {c}, [{s} + 32]",
            "movdqu {d}, [{s} + 48]",
            "movdqu [{t}], {a}",
            "movdqu [{t} + 16], {b}",
            "movdqu [{t} + 32], {c}",
            "movdqu [{t} + 48], {d}",
            "add {s}, 64",
            "add {t}, 64",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) blocks => _,
            s = inout(reg) src => _,
            t = inout(reg) dst => _,
            a = out(xmm_reg) _,
            b = out(xmm_reg) _,
            c = out(xmm_reg) _,
            d = out(xmm_reg) _,
            options(nostack)
        );
    }
}

/// Whether this CPU's `rep movsb` has the short-distance cliff (module docs): AMD's family 0x19
/// (Zen 3 and 4) and later. Read once.
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn short_distance_cliff() -> bool {
    static CLIFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CLIFF.get_or_init(|| {
        use std::arch::x86_64::__cpuid;
        let id = __cpuid(0);
        // "AuthenticAMD", in the order of the registers that hold it.
        let amd = [id.ebx, id.edx, id.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163];
        let sig = __cpuid(1).eax;
        let base = (sig >> 8) & 0xf;
        let family = if base == 0xf { base + ((sig >> 20) & 0xff) } else { base };
        amd && family >= 0x19
    })
}

/// A copy of [`REP_MOVSB_MIN`] bytes or more: `rep movsb`, or [`vector_copy`] where the CPU
/// has the cliff and the distance between the two falls in [`VECTOR_WINDOW`].
///
/// # Safety
/// `src` valid for reads and `dst` valid for writes of `len` bytes, not overlapping, and
/// `len >= REP_MOVSB_MIN`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn copy_big(src: *const u8, dst: *mut u8, len: usize) {
    debug_assert!(len >= REP_MOVSB_MIN);
    if VECTOR_WINDOW.contains(&page_distance(dst as usize, src as usize)) && short_distance_cliff() {
        // SAFETY: our caller's contract, and `len >= REP_MOVSB_MIN >= BLOCK`.
        unsafe { vector_copy(src, dst, len) };
    } else {
        // SAFETY: our caller's contract.
        unsafe { rep_movsb(src, dst, len) };
    }
}

/// Copies `len` bytes with [`copy_blocks`], the tail as the span's last whole block.
///
/// # Safety
/// `src` valid for reads and `dst` valid for writes of `len` bytes, not overlapping, and
/// `len >= BLOCK`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn vector_copy(src: *const u8, dst: *mut u8, len: usize) {
    debug_assert!(len >= BLOCK);
    let whole = len / BLOCK;
    // SAFETY: `whole` blocks fit in `len` bytes of both spans. The bytes past them (fewer than
    // a block) are copied as the span's last block, which overlaps bytes already copied: the
    // same bytes stored again, in bounds since `len >= BLOCK`.
    unsafe {
        copy_blocks(src, dst, whole);
        if len % BLOCK != 0 {
            copy_blocks(src.add(len - BLOCK), dst.add(len - BLOCK), 1);
        }
    }
}

/// Copies `len` bytes between memory no other process or device writes during the copy (our
/// RDMA send pool, which the adapter only reads): `memcpy`, but with [`copy_big`]'s choice for
/// long copies, since glibc's `memcpy` (2.36, Debian 12's) uses `rep movsb` at every distance
/// from 4 KiB on.
///
/// # Safety
/// `src` valid for reads and `dst` valid for writes of `len` bytes, not overlapping, and
/// neither written by anyone else during the call.
#[cfg(feature = "rdma")]
pub(crate) unsafe fn copy_private(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if len >= REP_MOVSB_MIN {
        // SAFETY: our caller's contract, and the length is checked above.
        unsafe { copy_big(src, dst, len) };
        return;
    }
    // SAFETY: our caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Copies `dst.len()` bytes from `src` into `dst` with relaxed atomic loads.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes (mapped and readable; it may be read-only
/// and may be written concurrently by another process or a device) for the whole call, and must
/// not overlap `dst`.
pub(crate) unsafe fn copy_from_peer(src: *const u8, dst: &mut [MaybeUninit<u8>]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if dst.len() >= REP_MOVSB_MIN {
        // SAFETY: `src` is readable for `dst.len()` bytes (our contract), `dst` is ours, they
        // do not overlap, and the length is checked above.
        unsafe { copy_big(src, dst.as_mut_ptr().cast(), dst.len()) };
        return;
    }
    // SAFETY: our own contract.
    unsafe { copy_from_peer_words(src, dst) }
}

/// [`copy_from_peer`] with word loads only, whatever the length.
///
/// # Safety
/// As [`copy_from_peer`].
pub(crate) unsafe fn copy_from_peer_words(src: *const u8, dst: &mut [MaybeUninit<u8>]) {
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
/// peer's adapter may write at any time, and for our shared-memory region, which a peer of our
/// uid can open for writing).
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes (mapped and writable; it may be written
/// or read concurrently by a device or another process) for the whole call, and must not
/// overlap `src`.
pub(crate) unsafe fn copy_to_peer(dst: *mut u8, src: &[u8]) {
    let len = src.len();
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if len >= REP_MOVSB_MIN {
        // SAFETY: `dst` is writable for `len` bytes (our contract), `src` is `len` bytes of
        // ours, they do not overlap, and the length is checked above.
        unsafe { copy_big(src.as_ptr(), dst, len) };
        return;
    }
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

/// The page-offset distances `(dst - src) % 4096` at which the kernel's own copy into user
/// memory (`copy_to_user`, `rep movsb` on CPUs with fast short strings) is slow on
/// [`short_distance_cliff`] CPUs. Measured with `pread(2)` of a page-cached file into a mapping
/// on the EPYC (family 25) development VM, at every distance from 0 to 72, 4090 to 4095 and
/// each 256th, file offsets 0 and 100: 64 KiB reads at 1 to 31 bytes ran at 2.6-2.8 GB/s,
/// against 25-27 GB/s at 0, 32, 64 and the far distances, and 19-25 GB/s at 33 to 63 and 65
/// to 72 (one copy there beats two). 4 KiB reads: 2.1 against 7.0-7.3 GB/s. Only this
/// direction (into user memory) was measured.
#[cfg(any(test, all(target_arch = "x86_64", not(miri))))]
const KERNEL_WINDOW: std::ops::RangeInclusive<usize> = 1..=31;

/// Bytes [`read_file_bounced`] reads at a time: sixteen pages, which stay in the L2 cache
/// between the kernel's copy into them and ours out of them (512 KiB on Zen 3), and a whole
/// number of pages, so that every read after the first starts at the same page offset.
#[cfg(any(test, all(target_arch = "x86_64", not(miri))))]
const BOUNCE_LEN: usize = 64 << 10;

/// Page size: the period of the copy distances (module docs).
#[cfg(any(test, all(target_arch = "x86_64", not(miri))))]
const PAGE: usize = 4096;

/// How far `dst` lies past `src` modulo a page: what decides whether a string copy between them
/// is slow (module docs). Modulo a power of two that divides the address space, so the
/// wrapping difference gives it whichever lies higher.
#[cfg(any(test, all(target_arch = "x86_64", not(miri))))]
fn page_distance(dst: usize, src: usize) -> usize {
    dst.wrapping_sub(src) % PAGE
}

/// Whether the kernel's copy of a file's bytes from `offset` to `dst` falls in
/// [`KERNEL_WINDOW`]: the page cache holds the byte at `offset` at `offset % 4096` into a page,
/// and the distance stays the same along the copy.
#[cfg(any(test, all(target_arch = "x86_64", not(miri))))]
fn kernel_copy_in_window(dst: usize, offset: u64) -> bool {
    KERNEL_WINDOW.contains(&page_distance(dst, (offset % PAGE as u64) as usize))
}

/// Reads up to `len` bytes of the file `fd` from `offset` into `dst` (`pread(2)` until `len`
/// bytes or the end of the file); returns how many it read. Where the kernel's copy would fall
/// in [`KERNEL_WINDOW`] on a CPU with the cliff (a ring position 1 to 31 bytes past the file
/// offset, modulo 4096: a sendfile after a short header, say), the file is read through a
/// bounce buffer at a distance of 0 instead and copied out of it with [`copy_to_peer`], whose
/// vector loop has no cliff ([`read_file_bounced`]): two fast copies instead of one at a tenth
/// of the speed.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes for the whole call (it may be memory another
/// process or a device accesses at the same time: the kernel writes it, or [`copy_to_peer`]).
pub(crate) unsafe fn read_file(fd: BorrowedFd<'_>, dst: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if kernel_copy_in_window(dst as usize, offset) && short_distance_cliff() {
        // SAFETY: our caller's contract.
        return unsafe { read_file_bounced(fd, dst, len, offset) };
    }
    // SAFETY: our caller's contract.
    unsafe { sys::pread_full(fd, dst, len, offset) }
}

/// [`read_file`] through this thread's bounce buffer ([`BOUNCE_LEN`] bytes and a page, kept for
/// the thread's life once used): each piece is read to the page offset it has in the file, then
/// copied to `dst`. A thread whose thread-locals are being destroyed reads straight into `dst`.
///
/// # Safety
/// As [`read_file`].
#[cfg(any(test, all(target_arch = "x86_64", not(miri))))]
unsafe fn read_file_bounced(fd: BorrowedFd<'_>, dst: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    thread_local! {
        static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let through = |bounce: &mut Vec<u8>| {
        if bounce.is_empty() {
            bounce.resize(BOUNCE_LEN + PAGE, 0);
        }
        let mut done = 0;
        while done < len {
            let at = offset + done as u64;
            // Where in the buffer a byte lies at `at`'s page offset (below a page).
            let start = page_distance((at % PAGE as u64) as usize, bounce.as_ptr() as usize);
            let want = (len - done).min(BOUNCE_LEN);
            let piece = &mut bounce[start..start + want];
            debug_assert_eq!(piece.as_ptr() as usize % PAGE, (at % PAGE as u64) as usize);
            // SAFETY: `piece` is `want` bytes of our own buffer, writable.
            let n = unsafe { sys::pread_full(fd, piece.as_mut_ptr(), want, at) }?;
            // SAFETY: `done + n <= len`, so the `n` bytes at `dst + done` are inside the span the
            // caller gives (valid for writes); our buffer is not in it.
            unsafe { copy_to_peer(dst.add(done), &piece[..n]) };
            done += n;
            if n < want {
                break; // end of file
            }
        }
        Ok(done)
    };
    // Nothing in `through` comes back here, so the buffer is never borrowed already; it is
    // gone only while the thread ends.
    match BOUNCE.try_with(|b| b.try_borrow_mut().map(|mut b| through(&mut b))) {
        Ok(Ok(read)) => read,
        // SAFETY: our caller's contract.
        _ => unsafe { sys::pread_full(fd, dst, len, offset) },
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// Every page-offset distance from 0 to 70 between source and destination (the vector
    /// loop's window and either side of it), at lengths that end on a block and off one, in
    /// both directions and through every copy that takes the window's choice (the vector loop
    /// itself too, so that it is tested on CPUs that never choose it): the copy is exact and
    /// touches nothing around it.
    #[test]
    fn copies_at_every_short_page_distance_match_a_plain_copy() {
        type Copy = unsafe fn(*const u8, *mut u8, usize);
        /// # Safety
        /// As `copy_from_peer`, with `dst` valid for writes of `len` bytes.
        unsafe fn from_peer(src: *const u8, dst: *mut u8, len: usize) {
            // SAFETY: `dst` is valid for writes of `len` bytes and nothing else refers to it
            // (our contract); any byte is a valid `MaybeUninit<u8>`.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst.cast::<MaybeUninit<u8>>(), len) };
            // SAFETY: our contract is `copy_from_peer`'s.
            unsafe { copy_from_peer(src, dst) }
        }
        /// # Safety
        /// As `copy_to_peer`, with `src` valid for reads of `len` bytes.
        unsafe fn to_peer(src: *const u8, dst: *mut u8, len: usize) {
            // SAFETY: `src` is valid for reads of `len` initialised bytes, and the contract is
            // `copy_to_peer`'s.
            unsafe { copy_to_peer(dst, std::slice::from_raw_parts(src, len)) }
        }
        let mut copies: Vec<(&str, Copy)> = vec![("from peer", from_peer), ("to peer", to_peer)];
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        copies.push(("vector loop", vector_copy));
        #[cfg(feature = "rdma")]
        copies.push(("private", copy_private));
        let mut space = vec![0u8; 6 * PAGE];
        let base = space.as_ptr().align_offset(PAGE);
        let src: Vec<u8> = (0..5200u32).map(|i| (i * 13 + i / 251) as u8).collect();
        for (name, copy) in copies {
            for from in [0usize, 5] {
                for distance in 0..=70usize {
                    for len in [64usize, 65, 200, 1024, 1025, 1087, 1088, 5000] {
                        // The source at `base + from`, the destination two pages on plus the
                        // distance: at most `base + 2 * PAGE + 75 + 5000 < 6 * PAGE` bytes in,
                        // and more than `len` bytes past the source's end, so the two do not
                        // overlap.
                        let at = base + 2 * PAGE + from + distance;
                        space.iter_mut().for_each(|b| *b = 0xEE);
                        space[base + from..base + from + len].copy_from_slice(&src[..len]);
                        let p = space.as_mut_ptr();
                        // SAFETY: both spans lie inside `space` and do not overlap (above); no
                        // reference into `space` is alive during the call.
                        unsafe { copy(p.add(base + from), p.add(at), len) };
                        let what = format!("{name}, distance {distance}, from {from}, {len} bytes");
                        assert_eq!(&space[at..at + len], &src[..len], "{what}");
                        assert!(space[..base + from].iter().all(|b| *b == 0xEE), "{what}");
                        assert!(space[base + from + len..at].iter().all(|b| *b == 0xEE), "{what}");
                        assert!(space[at + len..].iter().all(|b| *b == 0xEE), "{what}");
                    }
                }
            }
        }
    }

    /// A file read into a span at every page-offset distance from 0 to 40 from the file offset
    /// (the kernel's window and past it), from file offsets at and off a page, at lengths within
    /// one bounce piece and across several, and past the end of the file, both as chosen and
    /// always through the bounce buffer: the span gets the file's bytes, the count is right,
    /// and nothing around the span is touched.
    #[test]
    fn file_reads_at_every_short_page_distance_match_the_file() {
        const SIZE: usize = 200_000;
        const MAX: usize = 300_000;
        let contents: Vec<u8> = (0..SIZE as u32).map(|i| (i * 31 + i / 4093) as u8).collect();
        let path = std::env::temp_dir().join(format!("smc-peer-mem-read-file.{}", std::process::id()));
        std::fs::write(&path, &contents).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        type Read = unsafe fn(BorrowedFd<'_>, *mut u8, usize, u64) -> io::Result<usize>;
        let reads: [(&str, Read); 2] = [("as chosen", read_file), ("bounced", read_file_bounced)];
        let mut space = vec![0xEEu8; MAX + 3 * PAGE];
        let base = space.as_ptr().align_offset(PAGE) + PAGE;
        for (name, read) in reads {
            for offset in [0usize, 100, 4095, SIZE - 10] {
                for distance in 0..=40usize {
                    for len in [1usize, 1000, 4096, 70_000, MAX] {
                        let at = base + (offset + distance) % PAGE;
                        // SAFETY: `at + len <= base + PAGE + MAX`, inside `space`; no reference
                        // into it is alive during the call.
                        let n = unsafe { read(file.as_fd(), space.as_mut_ptr().add(at), len, offset as u64) };
                        let what = format!("{name}, distance {distance}, file offset {offset}, {len} bytes");
                        let want = len.min(SIZE - offset);
                        assert_eq!(n.unwrap(), want, "{what}");
                        assert_eq!(&space[at..at + want], &contents[offset..offset + want], "{what}");
                        assert!(space[..at].iter().rev().take(64).all(|b| *b == 0xEE), "{what}");
                        assert!(space[at + want..].iter().take(64).all(|b| *b == 0xEE), "{what}");
                        space[at..at + want].fill(0xEE);
                    }
                }
            }
        }
    }

    /// The window is chosen by the distance from the file offset's place in its page to the
    /// destination's, 1 to 31 bytes past it, whatever the page of either.
    #[test]
    fn the_kernel_window_is_the_distance_past_the_file_offset() {
        for offset in [0u64, 100, 4095, (3 << 12) + 5] {
            for distance in [0usize, 1, 16, 31, 32, 63, 4064, 4095] {
                for page in [0usize, 7, 1 << 20] {
                    let dst = (page << 12) + (offset as usize % PAGE + distance) % PAGE;
                    assert_eq!(
                        kernel_copy_in_window(dst, offset),
                        (1..=31).contains(&distance),
                        "offset {offset}, distance {distance}, page {page}"
                    );
                }
            }
        }
    }

    /// The CPU check agrees with the kernel's reading of the same CPU (`/proc/cpuinfo`'s vendor
    /// and family).
    #[cfg(all(target_arch = "x86_64", not(miri), target_os = "linux"))]
    #[test]
    fn the_cliff_check_agrees_with_proc_cpuinfo() {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let field = |name: &str| {
            info.lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
                .unwrap()
        };
        let family: u32 = field("cpu family").parse().unwrap();
        let expected = field("vendor_id") == "AuthenticAMD" && family >= 0x19;
        assert_eq!(short_distance_cliff(), expected, "vendor {}, family {family}", field("vendor_id"));
    }

    /// Every alignment of source and destination and every length up to a few words, against
    /// a plain copy (also run under Miri: it checks the accesses are in bounds and aligned).
    #[test]
    fn copies_match_a_plain_copy_at_every_alignment() {
        let src: Vec<u8> = (0..3100u32).map(|i| (i * 7 + i / 256) as u8).collect();
        for off in 0..9 {
            for len in [0usize, 1, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65, 100, 150, 1023, 1024, 1025, 3000] {
                let mut dst = vec![MaybeUninit::new(0xEEu8); len + 3];
                // SAFETY: off + len <= 3100 bytes of `src`, which does not overlap `dst`.
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
