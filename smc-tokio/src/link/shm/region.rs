//! The layout of one side's shared region, and the CDC ring inside it.
//!
//! Each side of a shm link group creates one memfd and is its only intended writer: it maps it
//! read-write, seals it (no shrink, no grow) and sends the peer a read-only descriptor of it
//! (the file's mode 0400), which it can only map read-only. We read our own region back only
//! when a connection moves to TCP (the bytes the peer has not consumed, to send again), and
//! then as we read the peer's: a peer of our uid can reopen the file for writing, so those
//! bytes may change under us. Everything we read from the peer's region is untrusted input,
//! read once, validated, then used.
//!
//! ```text
//! 0      header line (immutable once sent): magic, version, cdc_slots, rmb_count, rmb_size,
//!        rmb_offset, total_len
//! 64     unused (version 1 counted published frames here; frames now carry lap marks)
//! 128    cdc_cons   u64  the peer's CDC frames this side has consumed               (Release)
//! 192    armed      u64  non-zero epoch while this side sleeps and wants a doorbell (SeqCst)
//! 256    want_space u64  non-zero epoch while this side waits for CDC ring space   (SeqCst)
//! 4096   CDC ring: cdc_slots frames of 64 bytes, written by this side; frame number `i`
//!        lies in slot `i % cdc_slots`, and its byte 3 (the CDC message's reserved byte, 0 in
//!        the message itself) holds its lap mark: `(i / cdc_slots) % 255 + 1`
//! ...    RMBs (page aligned): rmb_count rings of rmb_size bytes, written by this side; each is
//!        the receive buffer of one connection on the peer's side
//! ```
//!
//! Memory ordering, for each shared atomic. The peer's region is mapped read-only here, and the
//! only atomic accesses Rust allows on read-only memory are relaxed loads no wider than a
//! register; so every load from the peer's region is relaxed, and where it must acquire, a
//! `fence(Acquire)` follows it (a relaxed load then an acquire fence synchronizes with the
//! writer's release store exactly as an acquire load would):
//! - Lap marks: the writer stores a frame's words 1..8 (relaxed), then its first word, which holds
//!   the lap mark, with Release; the reader loads the first word of the next frame it expects
//!   (relaxed, then an acquire fence) and reads the rest only when the mark is that frame's, so
//!   it sees whole frames (and the RMB bytes the frames announce, written before them). Finding
//!   a frame and reading it is one cache line from the writer's core, where a published count
//!   beside the ring was two in a row (the count's line, then the frame's). Consecutive laps
//!   have different marks and no mark is 0 (a slot never written), so a slot still holding the
//!   frame of the lap before, or nothing, is not taken for the frame expected; the writer is at
//!   most one lap ahead (it waits for `cdc_cons`).
//! - `cdc_cons`: the reader stores with Release after copying frames out; the writer loads it
//!   (relaxed, then an acquire fence) before reusing those slots, so it never overwrites a frame
//!   being read.
//! - Frames and RMB bytes in the peer's region are read with relaxed atomic loads (word by word,
//!   [`read_frame`](RegionView::read_frame) and `peer_mem`): a peer that writes them while we
//!   read races only with itself.
//! - `armed` / `want_space` against a frame's first word / `cdc_cons`: a Dekker pattern. The
//!   sleeper stores its flag, issues a SeqCst fence, then re-checks the other side's frame or
//!   counter; the other side stores its frame or counter, issues a SeqCst fence, then loads the
//!   flag. At least one of them sees the other's store, so a doorbell is never lost.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::proto::cdc::CDC_MSG_LEN;
use crate::proto::cursor::RingSize;

/// "SMCTSHM1", the header's magic.
const MAGIC: u64 = u64::from_be_bytes(*b"SMCTSHM1");
/// Region layout version: 2 finds frames by their lap marks (1 published a frame count).
const VERSION: u64 = 2;
/// The header and control lines fill the first page.
const CDC_RING_OFFSET: usize = 4096;
/// Page size used for alignment of the RMB area (x86-64 and most aarch64 kernels).
const PAGE: usize = 4096;

const OFF_CDC_CONS: usize = 128;
const OFF_ARMED: usize = 192;
const OFF_WANT_SPACE: usize = 256;

/// The byte of a frame that carries its lap mark: the CDC message's reserved byte
/// ([`CdcMsg`](crate::proto::cdc::CdcMsg) encodes it 0, and decoding refuses anything else).
const LAP_MARK_BYTE: usize = 3;

/// The lap mark of frame number `index` in a ring of `slots` frames: 1..=255, different for
/// consecutive laps, never 0 (module docs). Frame numbers are not expected to wrap: at one
/// frame per nanosecond a `u64` lasts 584 years (past a wrap, the lap after and lap 0 could
/// share a mark).
fn lap_mark(index: u64, slots: u32) -> u8 {
    // Every layout's slot count is a power of two (`Layout::new`): the lap is a shift, not a
    // 64-bit division on each frame written, looked for and read (`perf` of `smcperf local
    // --scenario rr --size 14`: the largest part of a spinning reader's look).
    debug_assert!(slots.is_power_of_two());
    // `% 255` leaves 0..=254, which fits.
    ((index >> slots.trailing_zeros()) % 255) as u8 + 1
}

/// Why a peer's region was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RegionError {
    /// The header does not describe a region of this version.
    BadHeader(&'static str),
    /// The memfd is smaller than its header claims.
    TooSmall,
}

impl std::fmt::Display for RegionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegionError::BadHeader(w) => write!(f, "peer region header is invalid: {w}"),
            RegionError::TooSmall => f.write_str("peer region is smaller than its header says"),
        }
    }
}

impl std::error::Error for RegionError {}

/// A validated region layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) cdc_slots: u32,
    pub(crate) rmb_count: u32,
    pub(crate) rmb_size: RingSize,
    pub(crate) rmb_offset: usize,
    pub(crate) total_len: usize,
}

/// Most RMBs one region holds: slot indices travel as 16 bits in connection tokens.
pub(crate) const MAX_RMBS: u32 = 1 << 16;
/// Most CDC slots a region may have, ours or a peer's: the 1024 this crate creates
/// (`config::DEFAULT_CDC_SLOTS`, one per connection of a full group). A link group's final
/// drain (`LinkGroup::drain`) takes sixteen times that before it gives up on a peer, so it
/// empties whatever a stopped peer published; a larger ring could leave announced bytes
/// behind.
pub(crate) const MAX_CDC_SLOTS: u32 = 1024;

impl Layout {
    /// The layout for a new region, or `None` if a parameter is out of range.
    pub(crate) fn new(cdc_slots: u32, rmb_count: u32, rmb_size: u32) -> Option<Layout> {
        if !cdc_slots.is_power_of_two() || cdc_slots > MAX_CDC_SLOTS || rmb_count == 0 || rmb_count > MAX_RMBS {
            return None;
        }
        let rmb_size = RingSize::new(rmb_size)?;
        let cdc_end = CDC_RING_OFFSET + cdc_slots as usize * CDC_MSG_LEN;
        let rmb_offset = cdc_end.div_ceil(PAGE) * PAGE;
        let total_len = rmb_offset.checked_add((rmb_count as usize).checked_mul(rmb_size.get() as usize)?)?;
        Some(Layout { cdc_slots, rmb_count, rmb_size, rmb_offset, total_len })
    }

    fn encode_header(&self) -> [u64; 8] {
        [
            MAGIC,
            VERSION,
            u64::from(self.cdc_slots),
            u64::from(self.rmb_count),
            u64::from(self.rmb_size.get()),
            self.rmb_offset as u64,
            self.total_len as u64,
            0,
        ]
    }

    /// Parses and validates a peer's header against the real size of its memfd: every offset
    /// the layout implies must lie inside the mapping.
    pub(crate) fn parse(h: [u64; 8], actual_len: u64) -> Result<Layout, RegionError> {
        if h[0] != MAGIC {
            return Err(RegionError::BadHeader("magic"));
        }
        if h[1] != VERSION {
            return Err(RegionError::BadHeader("version"));
        }
        let narrow = |v: u64, what| u32::try_from(v).map_err(|_| RegionError::BadHeader(what));
        let l = Layout::new(narrow(h[2], "cdc slots")?, narrow(h[3], "rmb count")?, narrow(h[4], "rmb size")?)
            .ok_or(RegionError::BadHeader("parameters"))?;
        if h[5] != l.rmb_offset as u64 || h[6] != l.total_len as u64 {
            return Err(RegionError::BadHeader("offsets"));
        }
        if actual_len < l.total_len as u64 {
            return Err(RegionError::TooSmall);
        }
        Ok(l)
    }
}

/// A view of a region in memory: ours (writable) or the peer's (read-only). It does not own the
/// memory; the link keeps the mapping alive for as long as the view exists.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegionView {
    base: *mut u8,
    layout: Layout,
}

// SAFETY: the view is a pointer into a shared mapping that outlives it. Control words and CDC
// frames are accessed only through atomics (relaxed loads on the peer's read-only region); RMB
// bytes are copied in (ours) or out (the peer's) with the copies of `peer_mem` (relaxed atomic
// words, or `rep movsb` and vector loops, which Rust sees as no reference) after the atomics
// published them. We are the only intended writer of our region, but a peer of our uid can
// reopen it for writing (the file's mode is ours to change), so neither region is taken to be
// free of races: a peer racing our copies makes us read garbage it could have sent anyway,
// never memory outside the mapping, and never through a Rust reference it writes under.
unsafe impl Send for RegionView {}
// SAFETY: as above.
unsafe impl Sync for RegionView {}

impl RegionView {
    /// A view of `len` bytes at `base`, which must stay mapped, 64-byte aligned, for the
    /// view's life, and hold at least `layout.total_len` bytes.
    ///
    /// # Safety
    /// `base` must point to at least `layout.total_len` bytes, aligned to 64, readable (and
    /// writable if the view is used to write) for as long as the view is used.
    pub(crate) unsafe fn new(base: *mut u8, layout: Layout) -> RegionView {
        RegionView { base, layout }
    }

    /// Writes the header of a fresh region of ours.
    pub(crate) fn init_header(&self) {
        for (i, w) in self.layout.encode_header().iter().enumerate() {
            self.atomic(i * 8).store(*w, Ordering::Relaxed);
        }
    }

    /// Reads a peer region's header (to be checked with [`Layout::parse`]).
    ///
    /// # Safety
    /// `base` must point to at least 64 readable bytes aligned to 8.
    pub(crate) unsafe fn read_header(base: *const u8) -> [u64; 8] {
        let mut h = [0u64; 8];
        for (i, w) in h.iter_mut().enumerate() {
            // SAFETY: in bounds and aligned per the caller's contract; atomics because the peer
            // owns that memory and could write it concurrently.
            *w = unsafe { &*base.add(i * 8).cast::<AtomicU64>() }.load(Ordering::Relaxed);
        }
        h
    }

    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    fn atomic(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= CDC_RING_OFFSET);
        // SAFETY: `off` is one of the fixed control offsets inside the first page, 8-aligned;
        // the mapping is at least one page and lives as long as the view (constructor contract).
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    pub(crate) fn cdc_cons(&self) -> &AtomicU64 {
        self.atomic(OFF_CDC_CONS)
    }
    pub(crate) fn armed(&self) -> &AtomicU64 {
        self.atomic(OFF_ARMED)
    }
    pub(crate) fn want_space(&self) -> &AtomicU64 {
        self.atomic(OFF_WANT_SPACE)
    }

    fn frame_ptr(&self, index: u64) -> *mut u8 {
        // `cdc_slots` is a power of two (`Layout::new`): the mask is `index % cdc_slots`.
        let slot = (index & u64::from(self.layout.cdc_slots - 1)) as usize;
        // SAFETY: slot < cdc_slots, so the frame lies inside the CDC ring, which the layout
        // places inside the mapping.
        unsafe { self.base.add(CDC_RING_OFFSET + slot * CDC_MSG_LEN) }
    }

    /// Word `i` (0..8) of the frame slot that holds frame number `index`.
    fn frame_word(&self, index: u64, i: usize) -> &AtomicU64 {
        debug_assert!(i < CDC_MSG_LEN / 8);
        // SAFETY: frames are 64-byte aligned inside the mapping (frame_ptr), and word i < 8 of
        // one lies inside it; the mapping outlives the view (constructor contract).
        unsafe { &*self.frame_ptr(index).add(i * 8).cast::<AtomicU64>() }
    }

    /// Publishes frame number `index` in our ring: its lap mark in byte 3 (module docs), the
    /// other words first, the first word last with Release.
    pub(crate) fn write_frame(&self, index: u64, frame: &[u8; CDC_MSG_LEN]) {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&frame[i * 8..i * 8 + 8]);
            w
        };
        for i in 1..CDC_MSG_LEN / 8 {
            self.frame_word(index, i).store(u64::from_ne_bytes(word(i)), Ordering::Relaxed);
        }
        let mut first = word(0);
        first[LAP_MARK_BYTE] = lap_mark(index, self.layout.cdc_slots);
        self.frame_word(index, 0).store(u64::from_ne_bytes(first), Ordering::Release);
    }

    /// Whether frame number `index` of the peer's ring is there: its slot holds that frame's lap
    /// mark. Relaxed, no fence: whoever reads the frame checks again ([`read_frame`]).
    ///
    /// [`read_frame`]: Self::read_frame
    pub(crate) fn frame_ready(&self, index: u64) -> bool {
        self.mark_at(index) == lap_mark(index, self.layout.cdc_slots)
    }

    /// Whether the slot of frame number `index` of the peer's ring still holds what it held
    /// before that frame was written: the lap before's mark, or nothing (0) in the first lap.
    /// A hint that frame `index` is not there which errs only the other way: asked with an
    /// index that readers have passed meanwhile, whose slot holds a later lap already, it says
    /// "there".
    pub(crate) fn frame_absent(&self, index: u64) -> bool {
        let slots = u64::from(self.layout.cdc_slots);
        let before = if index < slots { 0 } else { lap_mark(index - slots, self.layout.cdc_slots) };
        self.mark_at(index) == before
    }

    /// The lap mark in the slot of frame number `index` (relaxed).
    fn mark_at(&self, index: u64) -> u8 {
        self.frame_word(index, 0).load(Ordering::Relaxed).to_ne_bytes()[LAP_MARK_BYTE]
    }

    /// Reads frame number `index` of the peer's ring if it is there (its lap mark is in its
    /// slot), word by word with atomic loads: the peer may be scribbling on it, and we only ever
    /// get some 64 bytes, never undefined behaviour. The mark is cleared in the copy, so the
    /// frame is the CDC message as encoded.
    pub(crate) fn read_frame(&self, index: u64) -> Option<[u8; CDC_MSG_LEN]> {
        let mut first = self.frame_word(index, 0).load(Ordering::Relaxed).to_ne_bytes();
        if first[LAP_MARK_BYTE] != lap_mark(index, self.layout.cdc_slots) {
            return None;
        }
        // The acquire of the writer's Release store of the first word (module docs).
        fence(Ordering::Acquire);
        first[LAP_MARK_BYTE] = 0;
        let mut out = [0u8; CDC_MSG_LEN];
        out[..8].copy_from_slice(&first);
        for i in 1..CDC_MSG_LEN / 8 {
            let w = self.frame_word(index, i).load(Ordering::Relaxed);
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_ne_bytes());
        }
        Some(out)
    }

    /// A pointer to byte `offset` of RMB `slot`, valid for `len` bytes, or `None` when the span
    /// is outside that RMB.
    pub(crate) fn rmb_ptr(&self, slot: u32, offset: u32, len: u32) -> Option<*mut u8> {
        if slot >= self.layout.rmb_count || u64::from(offset) + u64::from(len) > u64::from(self.layout.rmb_size.get()) {
            return None;
        }
        let at = self.layout.rmb_offset + slot as usize * self.layout.rmb_size.get() as usize + offset as usize;
        // SAFETY: slot < rmb_count and offset + len <= rmb_size, so the span lies inside the
        // RMB area, which the layout places inside the mapping.
        Some(unsafe { self.base.add(at) })
    }

    /// Returns the pages of RMB `slot` from byte `from` to its end to the kernel (a ring that
    /// grew gives back what it grew into when its slot is freed). Only whole pages inside the
    /// slot are released; the next writer of the slot finds zero pages there. Call it on our
    /// own (writable) region only, for a slot no connection uses.
    pub(crate) fn release_rmb(&self, slot: u32, from: u32) -> std::io::Result<()> {
        let size = self.layout.rmb_size.get() as usize;
        if slot >= self.layout.rmb_count || from as usize >= size {
            return Ok(());
        }
        let start = self.layout.rmb_offset + slot as usize * size;
        let lo = (start + from as usize).next_multiple_of(PAGE);
        let hi = (start + size) / PAGE * PAGE;
        if hi <= lo {
            return Ok(());
        }
        // SAFETY: [lo, hi) lies inside the slot (checked above), which the layout places inside
        // this mapping; MADV_REMOVE only drops the pages' contents (the mapping stays valid and
        // reads as zeros afterwards), and no connection uses the slot (caller's contract), so
        // nobody relies on those bytes. The mapping is ours and shared-writable, which
        // MADV_REMOVE requires.
        let rc = unsafe { libc::madvise(self.base.add(lo).cast(), hi - lo, libc::MADV_REMOVE) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// Our side of the CDC traffic: the frames we publish in our ring.
#[derive(Debug)]
pub(crate) struct CdcTx {
    /// Frames published.
    prod: u64,
    /// The peer's `cdc_cons` as last read (validated). A push reads the shared counter again
    /// only when this says the ring is full: while the peer keeps up, its consumer line stays
    /// in its own cache and a push costs no cache-line transfer for it.
    cons_seen: u64,
    /// The peer's `armed` epoch we last rang for, so one sleep costs one doorbell.
    rung_epoch: u64,
}

/// The result of [`CdcTx::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    /// Published; ring the peer's doorbell if `ring` is set.
    Sent { ring: bool },
    /// The peer has not consumed enough of our ring: wait for space.
    Full,
}

/// A protocol violation found in the peer's control words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ControlError(pub(crate) &'static str);

impl CdcTx {
    pub(crate) fn new() -> Self {
        CdcTx { prod: 0, cons_seen: 0, rung_epoch: 0 }
    }

    /// Frames the peer has not consumed yet, per its (validated) `cdc_cons`, read now.
    fn in_flight(&mut self, peer: &RegionView) -> Result<u64, ControlError> {
        // Relaxed on the read-only mapping, then the acquire (module docs).
        let cons = peer.cdc_cons().load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if cons > self.prod || cons < self.cons_seen {
            return Err(ControlError("peer CDC consumer count is out of range"));
        }
        self.cons_seen = cons;
        Ok(self.prod - cons)
    }

    /// Publishes one frame in `ours` unless the ring is full.
    pub(crate) fn push(
        &mut self,
        ours: &RegionView,
        peer: &RegionView,
        frame: &[u8; CDC_MSG_LEN],
    ) -> Result<Push, ControlError> {
        let slots = u64::from(ours.layout.cdc_slots);
        if self.prod - self.cons_seen >= slots && self.in_flight(peer)? >= slots {
            return Ok(Push::Full);
        }
        ours.write_frame(self.prod, frame);
        self.prod += 1;
        fence(Ordering::SeqCst);
        let epoch = peer.armed().load(Ordering::Relaxed);
        let ring = epoch != 0 && epoch != self.rung_epoch;
        if ring {
            self.rung_epoch = epoch;
        }
        Ok(Push::Sent { ring })
    }

    /// Free frame slots now.
    pub(crate) fn space(&mut self, ours: &RegionView, peer: &RegionView) -> Result<u64, ControlError> {
        Ok(u64::from(ours.layout.cdc_slots).saturating_sub(self.in_flight(peer)?))
    }
}

/// Our side of the peer's CDC traffic: how far we have read the peer's ring.
#[derive(Debug)]
pub(crate) struct CdcRx {
    cons: u64,
    /// Our `armed` epoch counter.
    epoch: u64,
    /// The peer's `want_space` epoch we last rang for.
    space_epoch: u64,
    /// Our `armed` holds an epoch (we stored one and have not cleared it).
    armed: bool,
}

impl CdcRx {
    pub(crate) fn new() -> Self {
        CdcRx { cons: 0, epoch: 0, space_epoch: 0, armed: false }
    }

    /// The peer's frames consumed so far (what our `cdc_cons` says).
    pub(crate) fn consumed(&self) -> u64 {
        self.cons
    }

    /// Whether the next frame of the peer's ring is there (its lap mark is in its slot).
    pub(crate) fn ready(&self, peer: &RegionView) -> bool {
        peer.frame_ready(self.cons)
    }

    /// Copies out up to `max` frames, those whose lap marks say they are there, in order, then
    /// publishes our consumer count. Returns whether the peer waits for space (ring its doorbell
    /// then). Whatever the peer writes, a call reads at most `max` frames of its ring, each
    /// untrusted.
    pub(crate) fn pop(
        &mut self,
        ours: &RegionView,
        peer: &RegionView,
        max: usize,
        out: &mut Vec<[u8; CDC_MSG_LEN]>,
    ) -> bool {
        let mut n = 0;
        while n < max as u64 {
            let Some(frame) = peer.read_frame(self.cons + n) else { break };
            out.push(frame);
            n += 1;
        }
        self.consume(ours, peer, n)
    }

    /// Copies out the next frame if it is there and `want` says so, then publishes our consumer
    /// count, as [`pop`](Self::pop) does for one frame. Returns the frame, and whether the peer
    /// waits for space; `None` when the frame is not there or not wanted (nothing consumed).
    pub(crate) fn pop_if(
        &mut self,
        ours: &RegionView,
        peer: &RegionView,
        want: &mut dyn FnMut(&[u8; CDC_MSG_LEN]) -> bool,
    ) -> Option<([u8; CDC_MSG_LEN], bool)> {
        let frame = peer.read_frame(self.cons).filter(|f| want(f))?;
        Some((frame, self.consume(ours, peer, 1)))
    }

    /// Counts `n` frames copied out as consumed and publishes the count; whether the peer waits
    /// for space.
    fn consume(&mut self, ours: &RegionView, peer: &RegionView, n: u64) -> bool {
        if n == 0 {
            return false;
        }
        self.cons += n;
        ours.cdc_cons().store(self.cons, Ordering::Release);
        fence(Ordering::SeqCst);
        let want = peer.want_space().load(Ordering::Relaxed);
        let ring = want != 0 && want != self.space_epoch;
        if ring {
            self.space_epoch = want;
        }
        ring
    }

    /// Arms our doorbell before sleeping. Returns `false` when frames arrived in the meantime,
    /// so the caller must not sleep; it then disarms again unless `keep` (another waiter of
    /// ours sleeps on the doorbell, and the peer must go on ringing for it).
    pub(crate) fn arm(&mut self, ours: &RegionView, peer: &RegionView, keep: bool) -> bool {
        self.epoch += 1;
        ours.armed().store(self.epoch, Ordering::SeqCst);
        self.armed = true;
        fence(Ordering::SeqCst);
        if self.ready(peer) {
            if !keep {
                ours.armed().store(0, Ordering::SeqCst);
                self.armed = false;
            }
            return false;
        }
        true
    }

    /// Disarms after waking, or before polling. Relaxed: a peer that still sees the old epoch
    /// rings once more, which costs a spurious wake-up and loses nothing. Writes the shared
    /// line only when armed, so a polling caller does not bounce it between cores.
    pub(crate) fn disarm(&mut self, ours: &RegionView) {
        if std::mem::take(&mut self.armed) {
            ours.armed().store(0, Ordering::Relaxed);
        }
    }
}

/// Asks the peer for CDC ring space: sets `want_space`, then re-checks. Returns `true` when
/// the caller must wait for a doorbell (the peer will ring once it consumed), `false` when space
/// appeared meanwhile.
pub(crate) fn want_space(
    tx: &mut CdcTx,
    epoch: u64,
    ours: &RegionView,
    peer: &RegionView,
) -> Result<bool, ControlError> {
    ours.want_space().store(epoch, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if tx.space(ours, peer)? > 0 {
        ours.want_space().store(0, Ordering::Relaxed);
        return Ok(false);
    }
    Ok(true)
}

/// Clears `want_space`.
pub(crate) fn clear_want_space(ours: &RegionView) {
    ours.want_space().store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region on plain, 64-byte aligned heap memory: the ring code runs without shared memory
    /// (and so under Miri).
    struct Plain {
        buf: Vec<AlignedLine>,
        layout: Layout,
    }

    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct AlignedLine([u8; 64]);

    impl Plain {
        fn new(layout: Layout) -> Plain {
            Plain { buf: vec![AlignedLine([0; 64]); layout.total_len.div_ceil(64)], layout }
        }
        fn view(&mut self) -> RegionView {
            // SAFETY: the buffer is 64-aligned, at least total_len bytes, and outlives the view
            // within each test.
            let v = unsafe { RegionView::new(self.buf.as_mut_ptr().cast(), self.layout) };
            v.init_header();
            v
        }
    }

    fn small() -> Layout {
        Layout::new(4, 2, 256).unwrap()
    }

    #[test]
    fn layout_bounds() {
        let l = Layout::new(1024, 1024, 65536).unwrap();
        assert_eq!(l.rmb_offset, 4096 + 65536);
        assert_eq!(l.total_len, 4096 + 65536 + 1024 * 65536);
        assert!(Layout::new(3, 1, 1).is_none(), "cdc slots must be a power of two");
        assert!(Layout::new(4, 0, 1).is_none());
        assert!(Layout::new(4, MAX_RMBS + 1, 1).is_none());
        assert!(Layout::new(4, 1, 0).is_none());
        assert!(Layout::new(MAX_CDC_SLOTS * 2, 1, 4096).is_none(), "more CDC slots than a drain empties");
    }

    #[test]
    fn header_round_trip_and_validation() {
        let mut p = Plain::new(small());
        let v = p.view();
        // SAFETY: the plain buffer holds the header.
        let h = unsafe { RegionView::read_header(p.buf.as_ptr().cast()) };
        assert_eq!(Layout::parse(h, v.layout().total_len as u64), Ok(small()));
        assert_eq!(Layout::parse(h, v.layout().total_len as u64 - 1), Err(RegionError::TooSmall));
        let mut bad = h;
        bad[0] = 0;
        assert!(Layout::parse(bad, u64::MAX).is_err());
        let mut bad = h;
        bad[4] = u64::MAX;
        assert!(Layout::parse(bad, u64::MAX).is_err());
        let mut bad = h;
        bad[5] += 1;
        assert_eq!(Layout::parse(bad, u64::MAX), Err(RegionError::BadHeader("offsets")));
        let mut bad = h;
        bad[2] = 3;
        assert!(Layout::parse(bad, u64::MAX).is_err());
    }

    #[test]
    fn rmb_spans_are_bounded() {
        let mut p = Plain::new(small());
        let v = p.view();
        assert!(v.rmb_ptr(0, 0, 256).is_some());
        assert!(v.rmb_ptr(1, 255, 1).is_some());
        assert!(v.rmb_ptr(1, 255, 2).is_none());
        assert!(v.rmb_ptr(2, 0, 1).is_none());
        assert!(v.rmb_ptr(0, u32::MAX, u32::MAX).is_none());
    }

    #[test]
    fn ring_fills_drains_and_rings_doorbells_once_per_sleep() {
        let (mut pa, mut pb) = (Plain::new(small()), Plain::new(small()));
        let (a, b) = (pa.view(), pb.view());
        let mut tx = CdcTx::new();
        let mut rx = CdcRx::new();
        // Byte 3 is the lap mark's on the ring, 0 in what the reader gets.
        let frame = |i: u8| {
            let mut f = [i; CDC_MSG_LEN];
            f[LAP_MARK_BYTE] = 0;
            f
        };

        // B sleeps: the first frame rings, the second does not (same epoch).
        assert!(rx.arm(&b, &a, false));
        assert_eq!(tx.push(&a, &b, &frame(1)).unwrap(), Push::Sent { ring: true });
        assert_eq!(tx.push(&a, &b, &frame(2)).unwrap(), Push::Sent { ring: false });
        rx.disarm(&b);
        assert_eq!(tx.push(&a, &b, &frame(3)).unwrap(), Push::Sent { ring: false });
        assert_eq!(tx.push(&a, &b, &frame(4)).unwrap(), Push::Sent { ring: false });
        assert_eq!(tx.push(&a, &b, &frame(5)).unwrap(), Push::Full);

        // A asks for space; B's pop answers with a doorbell.
        assert!(want_space(&mut tx, 1, &a, &b).unwrap());
        let mut out = Vec::new();
        assert!(rx.pop(&b, &a, 2, &mut out));
        assert_eq!(out, vec![frame(1), frame(2)]);
        clear_want_space(&a);
        assert_eq!(tx.space(&a, &b).unwrap(), 2);
        assert_eq!(tx.push(&a, &b, &frame(5)).unwrap(), Push::Sent { ring: false });
        out.clear();
        assert!(!rx.pop(&b, &a, 10, &mut out));
        assert_eq!(out, vec![frame(3), frame(4), frame(5)]);
        // Arming with frames pending refuses to sleep.
        tx.push(&a, &b, &frame(6)).unwrap();
        assert!(!rx.arm(&b, &a, false));
        assert_eq!(b.armed().load(Ordering::Relaxed), 0);
        // One that keeps it armed for another waiter leaves its epoch for the peer.
        assert!(!rx.arm(&b, &a, true));
        assert_ne!(b.armed().load(Ordering::Relaxed), 0);
    }

    #[test]
    fn lap_marks_tell_each_lap_from_the_one_before() {
        for slots in [1, 4, 1 << 16] {
            for lap in 0..600u64 {
                let (this, next) =
                    (lap_mark(lap * u64::from(slots), slots), lap_mark((lap + 1) * u64::from(slots), slots));
                assert_ne!(this, 0, "slots {slots}, lap {lap}");
                assert_ne!(this, next, "slots {slots}, lap {lap}");
                // Every frame of a lap has the lap's mark.
                assert_eq!(lap_mark(lap * u64::from(slots) + u64::from(slots) - 1, slots), this);
            }
        }
    }

    #[test]
    fn a_reader_takes_only_frames_of_the_lap_it_expects() {
        let (mut pa, mut pb) = (Plain::new(small()), Plain::new(small()));
        let (a, b) = (pa.view(), pb.view());
        let (mut tx, mut rx) = (CdcTx::new(), CdcRx::new());
        let mut out = Vec::new();
        // A slot never written is no frame.
        assert!(!rx.ready(&a));
        assert!(!rx.pop(&b, &a, 10, &mut out));
        assert!(out.is_empty());
        // A full lap, read.
        for i in 0..4u8 {
            tx.push(&a, &b, &[i; CDC_MSG_LEN]).unwrap();
        }
        rx.pop(&b, &a, 10, &mut out);
        assert_eq!(out.len(), 4);
        assert!(out.iter().all(|f| f[LAP_MARK_BYTE] == 0));
        // The slots still hold the first lap: not frames 4..8.
        assert!(!rx.ready(&a));
        out.clear();
        rx.pop(&b, &a, 10, &mut out);
        assert!(out.is_empty());
        // The second lap's first two frames, and only those.
        tx.push(&a, &b, &[7; CDC_MSG_LEN]).unwrap();
        tx.push(&a, &b, &[8; CDC_MSG_LEN]).unwrap();
        assert!(rx.ready(&a));
        rx.pop(&b, &a, 10, &mut out);
        assert_eq!(out.iter().map(|f| f[0]).collect::<Vec<_>>(), [7, 8]);
        // A frame whose first word is not yet written (its mark still the lap before) is not
        // read, even though the rest of the slot is new.
        a.frame_word(6, 1).store(u64::MAX, Ordering::Relaxed);
        assert!(!rx.ready(&a));
        out.clear();
        rx.pop(&b, &a, 10, &mut out);
        assert!(out.is_empty());
        // A mark from a lap that is not the expected one (a hostile or confused peer) is no
        // frame either.
        let mut w = a.frame_word(6, 0).load(Ordering::Relaxed).to_ne_bytes();
        w[LAP_MARK_BYTE] = lap_mark(6, 4) + 1;
        a.frame_word(6, 0).store(u64::from_ne_bytes(w), Ordering::Relaxed);
        assert!(!rx.ready(&a));
    }

    #[test]
    fn hostile_marks_give_at_most_max_frames_a_pop_and_one_lap_a_region() {
        let (mut pa, mut pb) = (Plain::new(small()), Plain::new(small()));
        let (a, b) = (pa.view(), pb.view());
        let mut rx = CdcRx::new();
        let mut out = Vec::new();
        // The peer (a) marks every slot as frames of the first lap, with no frame written: a
        // pop takes at most `max`, and the region at most one lap, however often it is asked.
        let mark_all = |lap: u64| {
            for i in 0..4 {
                let index = lap * 4 + i;
                let mut w = [0xEE; 8];
                w[LAP_MARK_BYTE] = lap_mark(index, 4);
                a.frame_word(index, 0).store(u64::from_ne_bytes(w), Ordering::Relaxed);
            }
        };
        mark_all(0);
        assert!(!rx.pop(&b, &a, 3, &mut out));
        assert_eq!(out.len(), 3);
        for _ in 0..10 {
            rx.pop(&b, &a, 100, &mut out);
        }
        assert_eq!(out.len(), 4, "one lap of frames, then nothing until the peer writes again");
        assert!(out.iter().all(|f| f[LAP_MARK_BYTE] == 0 && f[0] == 0xEE));
        // Marks of a lap further on are no frames; the next lap's are, once written.
        for i in 4..8 {
            let mut w = [0xEE; 8];
            w[LAP_MARK_BYTE] = lap_mark(i + 8, 4);
            a.frame_word(i, 0).store(u64::from_ne_bytes(w), Ordering::Relaxed);
        }
        assert!(!rx.ready(&a));
        assert!(!a.frame_absent(4), "a mark that is neither the frame's nor the lap before's may be work");
        rx.pop(&b, &a, 100, &mut out);
        assert_eq!(out.len(), 4);
        mark_all(1);
        rx.pop(&b, &a, 100, &mut out);
        assert_eq!(out.len(), 8);
        assert!(a.frame_absent(8), "the slot of frame 8 holds frame 4's lap: nothing waits");
    }

    #[test]
    fn hostile_counters_are_errors() {
        let (mut pa, mut pb) = (Plain::new(small()), Plain::new(small()));
        let (a, b) = (pa.view(), pb.view());
        // A peer that claims to have consumed frames we never sent. A push reads the peer's
        // consumer count only once our cached one says the ring is full, so fill it first.
        let mut tx = CdcTx::new();
        for _ in 0..4 {
            tx.push(&b, &a, &[0; CDC_MSG_LEN]).unwrap();
        }
        a.cdc_cons().store(5, Ordering::Relaxed);
        assert!(tx.push(&b, &a, &[0; CDC_MSG_LEN]).is_err());
        // ... or takes back a consumption it published.
        let mut tx = CdcTx::new();
        a.cdc_cons().store(0, Ordering::Relaxed);
        for _ in 0..4 {
            tx.push(&b, &a, &[0; CDC_MSG_LEN]).unwrap();
        }
        a.cdc_cons().store(2, Ordering::Relaxed);
        assert_eq!(tx.space(&b, &a).unwrap(), 2);
        a.cdc_cons().store(1, Ordering::Relaxed);
        assert!(tx.space(&b, &a).is_err());
    }
}
