//! Links: the backends that move a connection's bytes into the peer's receive buffer (RMB) and
//! carry CDC messages. The connection engine uses them only through [`Link`], so it does not
//! know whether it runs over shared memory or RDMA.
//!
//! The words mean what they mean in the kernel's `net/smc`:
//!
//! - An **RMB** is a connection's receive ring: the memory its peer writes and it reads. Each
//!   end of a connection has one. *Our RMB* is the one we read (`rx_*`); *the peer's RMB* the
//!   one we write (`tx_*`). Where an RMB lives depends on the link: shared memory keeps it in
//!   its *writer's* region (the peer's RMB lies in our region, which the peer maps read-only;
//!   ours in the peer's region), RDMA in its *reader's* registered memory (ours is ours, and we
//!   write the peer's with RDMA WRITE).
//! - A **token** is the 32-bit name of an RMB slot in its owner's pool: the low 16 bits the
//!   slot, the high 16 bits a generation that changes each time the slot is reused, so a stale
//!   message can never reach the slot's next connection. A connection's CDC messages carry the
//!   sender's token. (The handshake's 128-bit random value is its *secret*,
//!   [`Secret`](crate::proto::clc::Secret), not a token.)
//!
//! A link belongs to a link group (one per pair of processes for shm, one per pair of RDMA
//! ports for verbs).

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::task::{Context, Poll};

use crate::proto::cdc::{CdcMsg, CDC_MSG_LEN};

pub(crate) mod peer_mem;
pub(crate) mod reactor;
pub(crate) mod shm;
#[cfg(feature = "rdma")]
pub(crate) mod verbs;

/// Where [`Link::tx_fill`] lets its `fill` write: a pointer and a length, not a slice. On shared
/// memory the span lies in our region, which a peer of our uid can open for writing too
/// (`fchmod` on the memfd, then `/proc/PID/fd`) and write while we fill it, so a `&mut [u8]`
/// to it would promise an exclusive access nothing can keep. Filled from a file
/// ([`read_file`](Self::read_file)): by the kernel (`pread`), whose writes are no Rust access,
/// or by a byte-wise atomic copy ([`peer_mem`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxSpan {
    ptr: *mut u8,
    len: usize,
}

impl TxSpan {
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes for as long as the span is handed out
    /// (the call of `fill`).
    unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        TxSpan { ptr, len }
    }

    /// Fills the span from the file `fd` at `offset` ([`peer_mem::read_file`]: `pread(2)` until
    /// the span is full or the file ends, through a bounce buffer where the kernel's copy would
    /// be slow); returns the bytes read.
    ///
    /// # Safety
    /// Only during the call of `fill` the span was given to (where it is valid for writes).
    pub(crate) unsafe fn read_file(self, fd: std::os::fd::BorrowedFd<'_>, offset: u64) -> io::Result<usize> {
        // SAFETY: the span is valid for writes of `len` bytes now (our contract).
        unsafe { peer_mem::read_file(fd, self.ptr, self.len, offset) }
    }
}

/// A failure of the link as a whole: every connection of the group is affected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkError {
    /// The peer process went away (its side channel closed).
    PeerGone,
    /// The peer broke the link protocol (its control words or region are invalid).
    Protocol(&'static str),
    /// A local system call failed.
    Io(io::ErrorKind, String),
    /// The link was torn down.
    Closed,
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::PeerGone => f.write_str("peer process is gone"),
            LinkError::Protocol(w) => write!(f, "peer broke the link protocol: {w}"),
            LinkError::Io(_, e) => write!(f, "link i/o error: {e}"),
            LinkError::Closed => f.write_str("link group was torn down"),
        }
    }
}

impl std::error::Error for LinkError {}

impl From<io::Error> for LinkError {
    fn from(e: io::Error) -> Self {
        LinkError::Io(e.kind(), e.to_string())
    }
}

/// The slot of an RMB token (its low 16 bits).
pub(crate) fn token_slot(token: u32) -> u32 {
    token & 0xFFFF
}

/// `m`'s guard if nobody holds it this instant, `None` if somebody does. A lock that a panic
/// left poisoned is taken back, as every blocking `lock` in this crate takes it, and is no longer
/// poisoned: read as "held", it would make every caller that tries it (an RDMA link's completion
/// poll) believe another task works on it, forever.
#[cfg(feature = "rdma")]
pub(crate) fn try_lock<T>(m: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::WouldBlock) => None,
        Err(std::sync::TryLockError::Poisoned(p)) => {
            let g = p.into_inner();
            m.clear_poison();
            Some(g)
        }
    }
}

/// The small interface between the connection engine and a backend.
///
/// `tx_*` calls write the peer's RMB and `rx_*` calls read ours (see the module documentation
/// for where each lives). Offsets and lengths are ring spans computed by
/// [`crate::proto::engine`], never wrapping; a backend still checks them against the RMB and
/// refuses what is out of bounds.
pub(crate) trait Link: Send + Sync + fmt::Debug + 'static {
    /// Capacity of each RMB we read from: the largest ring a writer may resize ours to (on shm
    /// the slot size of the peer's region; on verbs our registered ring, which never grows).
    fn rx_rmb_size(&self) -> u32;
    /// Gives back the memory of the peer's RMB with token `rmb` from byte `from` on, for a slot
    /// whose connection is gone and whose ring had grown. Shared memory: the RMB lies in our
    /// region, whose pages go back to the kernel. A no-op where rings do not grow (verbs).
    fn release_tx_rmb(&self, rmb: u32, from: u32) {
        let _ = (rmb, from);
    }
    /// Puts `data` at `offset` of the peer's RMB with token `rmb`. Shared memory: a copy into
    /// our region, where the peer reads it. RDMA: a copy into our send buffer, from which the
    /// next CDC message's RDMA WRITE carries it to the peer's RMB.
    fn tx_write(&self, rmb: u32, offset: u32, data: &[u8]) -> Result<(), LinkError>;
    /// Reads back `dst.len()` bytes we wrote at `offset` of the peer's RMB with token `rmb`,
    /// from our side's copy (shared memory: our region; RDMA: our send buffer). For a handback:
    /// the bytes the peer has not reported consumed are still there, since a byte is written
    /// again only after the peer's consumer cursor passed it.
    fn tx_read(&self, rmb: u32, offset: u32, dst: &mut [u8]) -> Result<(), LinkError>;
    /// As [`tx_write`](Link::tx_write), but lets `fill` write the `len` bytes at `offset` in
    /// place (for sendfile: a `pread` lands where `tx_write` would have copied to, with no
    /// buffer between but where the CPU copies slowly, `peer_mem::read_file`). Returns what
    /// `fill` returned.
    fn tx_fill(
        &self,
        rmb: u32,
        offset: u32,
        len: u32,
        fill: &mut dyn FnMut(TxSpan) -> io::Result<usize>,
    ) -> Result<io::Result<usize>, LinkError>;
    /// The token under which [`rx_read`](Link::rx_read) finds our RMB: the RMB's owner names
    /// it, so on shm (where the peer's region holds it) the peer's token, on verbs ours.
    fn rx_token(&self, our_token: u32, peer_token: u32) -> u32 {
        let _ = our_token;
        peer_token
    }
    /// Stores bytes that arrived inline in a CDC message at their place (`spans`) in our RMB
    /// `rmb`, when this link lets the reader write its own ring (verbs: the RMB is ours). Returns
    /// false when it does not (shm: the ring is the peer's read-only memory), and the connection
    /// keeps the bytes aside instead.
    fn rx_place_inline(&self, rmb: u32, spans: [(u32, u32); 2], data: &[u8]) -> Result<bool, LinkError> {
        let _ = (rmb, spans, data);
        Ok(false)
    }
    /// Copies `dst.len()` bytes at `offset` of our RMB (token `rmb`, from
    /// [`rx_token`](Link::rx_token)) into `dst`.
    fn rx_read(&self, rmb: u32, offset: u32, dst: &mut [MaybeUninit<u8>]) -> Result<(), LinkError>;
    /// Where the `len` bytes at `offset` of our RMB `rmb` lie in this process's memory, for a
    /// reader that lends them to the application instead of copying them, or `None` where this
    /// link lends nothing: its peer could change the bytes while the application holds them,
    /// and only a peer trusted with our memory may (see [`ShmLink`](shm::ShmLink)'s). The
    /// mapping lives as long as the link; the bytes stay as they are while the connection has
    /// not consumed them and has told the peer nothing that frees its ring (an abort or its
    /// answer; after a move to TCP the peer never reuses the ring).
    fn rx_lend(&self, rmb: u32, offset: u32, len: u32) -> Result<Option<std::ptr::NonNull<u8>>, LinkError> {
        let _ = (rmb, offset, len);
        Ok(None)
    }
    /// Hands a CDC message to the peer. `Ok(false)`: the peer's queue is full; the link asks the
    /// peer for space and [`poll_event`](Link::poll_event) reports when to retry.
    fn cdc_send(&self, msg: &CdcMsg) -> Result<bool, LinkError> {
        self.cdc_send_frame(&msg.encode())
    }
    /// Hands an encoded CDC frame to the peer (as [`cdc_send`](Link::cdc_send)).
    fn cdc_send_frame(&self, frame: &[u8; CDC_MSG_LEN]) -> Result<bool, LinkError>;
    /// Takes up to `max` received CDC frames (raw: the caller decodes and validates them).
    /// Non-blocking; `Ok(0)` when none are waiting. Returns `Ok(None)` when another caller is
    /// receiving right now (it will dispatch what arrives).
    fn cdc_recv(&self, out: &mut Vec<[u8; CDC_MSG_LEN]>, max: usize) -> Result<Option<usize>, LinkError>;
    /// A hint, known without a lock or a system call: the next received CDC frame (raw), if it
    /// is there; `None` otherwise, or where the link cannot tell cheaply (the default). A frame
    /// that lands just after is the next look's, and one another caller is taking may still
    /// show.
    fn next_frame(&self) -> Option<[u8; CDC_MSG_LEN]> {
        None
    }
    /// Takes the next received CDC frame if it is there and `_want` says so (raw, as
    /// [`cdc_recv`](Link::cdc_recv)), with what came of the work that follows a receive (on
    /// shared memory, ringing a peer that waits for room): an error there ends the link, and
    /// the frame taken is still to be delivered. `None` when nothing was taken: no frame, not
    /// wanted (it stays first in line), or a link that takes frames only in batches (the
    /// default).
    fn cdc_recv_if(
        &self,
        _want: &mut dyn FnMut(&[u8; CDC_MSG_LEN]) -> bool,
    ) -> Option<([u8; CDC_MSG_LEN], Result<(), LinkError>)> {
        None
    }
    /// Waits for the peer: arms the completion source (doorbell or completion channel) and
    /// polls it. `Ready(Ok(()))`: something may have arrived, or space may have been freed;
    /// call [`cdc_recv`](Link::cdc_recv) and retry blocked sends. Errors end the link.
    fn poll_event(&self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>>;
    /// As [`poll_event`](Link::poll_event), for a caller that polls (adaptive polling): it
    /// never arms the wake-up, and disarms one left from before, so the peer sends without
    /// ringing. `Pending` registers nothing: the caller must poll again. A link with no cheap
    /// unarmed check answers as `poll_event`.
    fn poll_event_unarmed(&self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.poll_event(cx)
    }
    /// Stops watching for CDC space: nobody waits for it any more (the connections that did are
    /// gone or have sent). Only the link group decides this, under its waiters' lock: a send
    /// that goes through does not end the watch, since other connections may have been refused
    /// before it and still wait for the peer's word that space was freed.
    fn clear_space_wait(&self);
    /// Whether it watches for CDC space ([`clear_space_wait`](Link::clear_space_wait) ends
    /// the watch). A sender refused for space that got through on its own retry (the peer
    /// freed space as it asked) leaves the watch on with nobody waiting; the group ends it.
    fn watches_space(&self) -> bool;
    /// Whether CDC frames are waiting to be received (a cheap look at the peer's ring).
    fn has_pending(&self) -> bool;
    /// `true` only when a receive now would find nothing to do (no CDC frame, and nothing else
    /// the link does when received from), known without a lock or a system call; `false`
    /// when there may be work, or the link cannot tell cheaply. A hint: a frame that lands
    /// just after it said `true` is the next look's.
    fn nothing_waiting(&self) -> bool {
        false
    }
    /// The busy-poll budget: how long a waiting task may spin on [`has_pending`](Link::has_pending)
    /// before it sleeps.
    fn busy_poll(&self) -> std::time::Duration;
    /// A mark of how far this link's sends have gone: taken after a CDC message was handed
    /// over, it names that message (and every earlier one) for
    /// [`poll_delivered`](Link::poll_delivered).
    fn tx_mark(&self) -> u64 {
        0
    }
    /// Ready once every message handed over before `mark` was taken (with the bytes it
    /// announces) is in the peer's memory, so that it survives this process's exit. Shared
    /// memory: at once (the bytes and the CDC ring are in our region, which the peer maps).
    /// RDMA: once the message's SEND completed (a reliable-connection completion means the
    /// peer's adapter acknowledged it, and the WRITEs before it).
    fn poll_delivered(&self, cx: &mut Context<'_>, mark: u64) -> Poll<Result<(), LinkError>> {
        let _ = (cx, mark);
        Poll::Ready(Ok(()))
    }
    /// Test hook: the link fails with `err` as a failed work completion or post would fail it
    /// (the link first; its group when its driver, or a task waiting on the link, sees it).
    /// Links that cannot fail that way ignore it.
    #[cfg(feature = "test-util")]
    fn fail_for_test(&self, err: LinkError) {
        let _ = err;
    }
    /// The connection with our token `our_token` is gone (its slot may be reused).
    fn conn_closed(&self, our_token: u32) {
        let _ = our_token;
    }
    /// How long the link may carry nothing before [`test_if_idle`](Link::test_if_idle) tests
    /// it; `None`: never (shared memory has no path between the peers that could break while
    /// both live).
    fn test_interval(&self) -> Option<std::time::Duration> {
        None
    }
    /// Tests the link if nothing completed on it since the last call: sends a message the peer
    /// takes in and drops, whose delivery fails (and fails the link, as any failed delivery
    /// does) where the path to the peer broke. Does nothing when traffic completed meanwhile
    /// (the path worked) or sends are in flight (their completions will tell).
    fn test_if_idle(&self) -> Result<(), LinkError> {
        Ok(())
    }
    /// Whether this is an RDMA link (SMC-R) rather than shared memory (SMC-D).
    fn is_rdma(&self) -> bool {
        false
    }
    /// Whether the peer may lend the bytes we write to its application in place (its
    /// [`rx_lend`](Link::rx_lend)), and so may still hold some of them after the connection
    /// left the link (a move to TCP): the ring we write into must then never be reused. `false`
    /// where the peer reads copies (RDMA writes into its own memory).
    fn peer_may_lend(&self) -> bool {
        false
    }
    /// Moves the link's descriptors (doorbell, side channel, completion channel) to the
    /// reactor of the runtime this is called on: the runtime that drove the link shut down.
    fn rehome(&self) -> Result<(), LinkError>;
    /// A second place to wait for the link's wake-ups, registered with the reactor of the
    /// runtime this is called on: for a link group's connections on a runtime other than the
    /// one whose reactor the link's own descriptors are registered with, which may live
    /// without running (see `smc::group`'s co-drivers). `None`: the link cannot be waited on
    /// twice (an RDMA completion channel hands each event to one reader).
    fn watch(&self) -> Option<Result<Watch, LinkError>> {
        None
    }
    /// As [`poll_event`](Link::poll_event), on `watch` (made by this link's
    /// [`watch`](Link::watch)): ready when frames wait or the peer rang. While it is pending
    /// the link's wake-up stays armed, whatever the link's own waiter does meanwhile.
    fn poll_watch(&self, watch: &Watch, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let _ = (watch, cx);
        Poll::Ready(Err(LinkError::Closed))
    }
    /// Tears the link down: the peer sees it as gone.
    fn teardown(&self);
}

/// A link's second waiting place ([`Link::watch`]): a duplicate of its wake-up descriptor,
/// registered with another runtime's reactor, and whether its waiter sleeps now (counted in
/// the link's `sleepers` while it does, so that the link's own waiter leaves the wake-up
/// armed for it).
#[derive(Debug)]
pub(crate) struct Watch {
    fd: tokio::io::unix::AsyncFd<crate::sys::PeerFd>,
    asleep: std::sync::atomic::AtomicBool,
    sleepers: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Watch {
    /// `fd` registered with the current runtime's reactor; `sleepers` is the link's count.
    pub(crate) fn new(
        fd: crate::sys::PeerFd,
        sleepers: std::sync::Arc<std::sync::atomic::AtomicU32>,
    ) -> io::Result<Watch> {
        // SAFETY: a `PeerFd` owns its descriptor for as long as it lives, and the `AsyncFd`
        // takes it; `as_raw_fd` always returns that descriptor.
        let fd = unsafe { crate::sys::register(fd, tokio::io::Interest::READABLE) }?;
        Ok(Watch { fd, asleep: std::sync::atomic::AtomicBool::new(false), sleepers })
    }

    pub(crate) fn fd(&self) -> &tokio::io::unix::AsyncFd<crate::sys::PeerFd> {
        &self.fd
    }

    /// Its waiter goes to sleep: counted until it wakes. Called where the link arms its
    /// wake-up, under the lock that the link's own waiter disarms under, so that one sees
    /// the count before it could disarm.
    pub(crate) fn sleep(&self) {
        if !self.asleep.swap(true, std::sync::atomic::Ordering::Relaxed) {
            self.sleepers.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Its waiter is polled again (or gone): no longer counted. Outside the lock: a count
    /// that is one too high a moment longer leaves the wake-up armed, a spurious ring at most.
    pub(crate) fn wake(&self) {
        if self.asleep.swap(false, std::sync::atomic::Ordering::Relaxed) {
            self.sleepers.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.wake();
    }
}

#[cfg(all(test, feature = "rdma"))]
mod tests {
    use std::sync::Mutex;

    /// A lock a panic poisoned is taken back, not taken for one somebody holds (a caller that
    /// read it so would return "busy" forever); one that is held is not.
    #[test]
    fn try_lock_takes_a_poisoned_lock_back_and_leaves_a_held_one() {
        let m = Mutex::new(5u32);
        std::thread::scope(|s| {
            let _ = s
                .spawn(|| {
                    let _g = m.lock().unwrap();
                    panic!("a waker panicked under the lock");
                })
                .join();
        });
        assert!(m.is_poisoned());
        assert_eq!(super::try_lock(&m).map(|g| *g), Some(5));
        assert!(!m.is_poisoned(), "taken back once, it stays usable");
        let held = m.lock().unwrap();
        assert!(super::try_lock(&m).is_none());
        drop(held);
    }
}
