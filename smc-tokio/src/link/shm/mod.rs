//! The shared-memory link (SMC-D): both processes on one host.
//!
//! Each side owns one sealed memfd region ([`region`]) holding its CDC ring and the RMBs it
//! writes into; the peer maps it read-only. Each side's doorbell is two Unix datagram sockets
//! of its own, one to ring on and one to wait on, bound to random abstract names and connected
//! to the peer's by name (`sys::bell_ring`): no doorbell descriptor crosses. A SOCK_SEQPACKET Unix socket in the
//! abstract namespace (per network namespace) carries the setup (a JOIN that proves the
//! handshake's secret, the region's descriptor with `SCM_RIGHTS` and the doorbells' tags in the
//! messages, the peer's credentials with `SO_PEERCRED`) and then stays open: its EOF means the
//! peer process is gone.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::link::reactor::ReactorFd;
use tokio::io::Interest;

use super::{token_slot, Link, LinkError, Watch};
#[cfg(test)]
use crate::proto::cdc::CdcMsg;
use crate::proto::cdc::CDC_MSG_LEN;
use crate::proto::side::{BellTag, Ready, Welcome, SIDE_MSG_LEN};
pub(crate) use crate::proto::side::{Join, JoinRefused};
use crate::stats::Counters;
use crate::sys::{self, Mmap, PeerFd};

pub(crate) mod region;

use region::{clear_want_space, want_space, CdcRx, CdcTx, Layout, Push, RegionView};

/// Our waiting socket (`sys::bell_wait`), through tokio's `AsyncFd` (which needs only its raw
/// descriptor).
#[derive(Debug)]
pub(crate) struct DoorbellFd(PeerFd);

impl AsFd for DoorbellFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for DoorbellFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Rings taken from the doorbell per wake-up: each is a one-byte datagram; a peer can queue as
/// many as its ringing socket's send buffer holds (our waiting socket is connected back to it,
/// so the kernel's queue length does not apply), and we take this many before reporting work
/// again.
const DOORBELL_DRAIN_MAX: usize = 64;

/// Our half of a link before the peer's half arrives: our sealed region and our doorbell.
#[derive(Debug)]
pub(crate) struct ShmLocal {
    map: Mmap,
    memfd: OwnedFd,
    view: RegionView,
    /// The socket we ring the peer on (see `sys::bell_ring`): bound, shut down for reading
    /// (nothing can be queued in it, so it closes in place), not yet connected.
    ring: OwnedFd,
    /// What names our doorbell (sent to the peer); our waiting socket is bound when the
    /// peer's tag is known.
    bell_tag: BellTag,
    /// Where the link counts its doorbells (its context's counters).
    counters: Option<Arc<Counters>>,
}

impl ShmLocal {
    /// Creates, maps, initialises and seals a region with `layout`, and a doorbell.
    pub(crate) fn create(layout: Layout) -> io::Result<ShmLocal> {
        let memfd = sys::memfd(c"smc-tokio-region", layout.total_len)?;
        let map = Mmap::map(memfd.as_fd(), layout.total_len, true)?;
        // SAFETY: the mapping is page aligned, `total_len` bytes long, writable, and is kept
        // alive by `map`, which lives as long as the view (both are fields of this struct and
        // later of the link).
        let view = unsafe { RegionView::new(map.as_ptr(), layout) };
        view.init_header();
        // Nobody (the peer included) can shrink or grow it. The peer gets a read-only
        // descriptor of a file of mode 0400, which it can map only read-only, and cannot open
        // again for writing unless it is our uid (then it could write only into bytes meant
        // for itself, and into those a move to TCP reads back, which are read as untrusted
        // peer memory: see `tx_read`) or has CAP_DAC_OVERRIDE.
        sys::add_seals(memfd.as_fd(), sys::REGION_SEALS)?;
        let (ring, bell_tag) = sys::bell_ring()?;
        Ok(ShmLocal { map, memfd, view, ring, bell_tag, counters: None })
    }

    /// Makes the link count the doorbells it rings and is woken by into `counters`.
    pub(crate) fn counting(mut self, counters: Arc<Counters>) -> ShmLocal {
        self.counters = Some(counters);
        self
    }

    /// What the peer maps: a read-only descriptor of our region (made when it is sent, so a
    /// pending group holds one descriptor less).
    fn region_fd(&self) -> io::Result<OwnedFd> {
        sys::read_only_view(self.memfd.as_fd())
    }

    /// What names our doorbell, for the peer to connect its sockets to.
    pub(crate) fn bell_tag(&self) -> BellTag {
        self.bell_tag
    }
}

/// An established shm link.
#[derive(Debug)]
pub(crate) struct ShmLink {
    ours: RegionView,
    peer: RegionView,
    _ours_map: Mmap,
    _peer_map: Mmap,
    /// Our waiting socket, connected to the peer's ringing socket.
    doorbell: ReactorFd<DoorbellFd>,
    /// Our ringing socket, connected to the peer's waiting socket at the first ring (the
    /// peer binds that one when it has our tag, perhaps after we made our half).
    ring: OwnedFd,
    /// The peer's doorbell.
    peer_bell: BellTag,
    /// `ring` was connected (once, under `ring_connecting`; never again by name: the peer's
    /// name could be taken by somebody else once it is gone).
    ring_connected: AtomicBool,
    /// Held while `ring` is connected, so that two threads ringing at once connect it once.
    ring_connecting: Mutex<()>,
    side: ReactorFd<PeerFd>,
    tx: Mutex<CdcTx>,
    rx: Mutex<CdcRx>,
    /// The peer's CDC frames we have consumed, as `rx` last published it: read without the
    /// lock by [`has_pending`](Link::has_pending) and [`nothing_waiting`](Link::nothing_waiting),
    /// so that threads asking whether frames wait do not write the lock's line, which moved
    /// between the workers of a multi-threaded runtime on every look. Relaxed: a hint, stale
    /// only while another thread takes frames (and then a look finds frames, and the real
    /// receive sorts it out).
    rx_consumed: AtomicU64,
    space_epoch: AtomicU64,
    waiting_space: AtomicBool,
    /// The doorbell's readiness was reported and its counter not yet drained.
    rung_seen: AtomicBool,
    /// Second waiters ([`Link::watch`]) asleep on the doorbell now. While any is, the doorbell
    /// holds an epoch the peer has not rung for, or one whose ring nobody took yet (each
    /// waiter's reactor sees that ring): our own waiter leaves the doorbell armed when it wakes
    /// or polls, since the runtime it runs on may stop running before it arms again, and
    /// whoever takes rings (a drain) arms a fresh epoch after, since a waiter whose reactor
    /// had not looked yet never sees a ring taken before it looked. Raised under `rx`'s lock
    /// (where arming and disarming happen), so the own waiter's look there sees it.
    sleepers: Arc<AtomicU32>,
    busy_poll: Duration,
    closed: AtomicBool,
    counters: Option<Arc<Counters>>,
    /// The peer is our own uid (by its side channel's credentials, not the overflow id): a
    /// process that is already inside our trust domain (it can signal and trace us), so the
    /// bytes it wrote may be lent to the application without a copy ([`Link::rx_lend`]).
    /// Another uid, even an allowed one, could change bytes while the application holds a
    /// reference to them, which Rust does not allow: its bytes are copied out. And only while
    /// we are still the uid the peer sees ([`lend_trust`]).
    lends: bool,
    /// The peer may lend the bytes we write ([`Link::peer_may_lend`]); see [`lend_trust`].
    peer_may_lend: bool,
}

/// Largest peer region we agree to map: 65536 RMBs of 1 GiB would be absurd; 64 GiB of
/// address space is far above any configuration this crate creates.
const MAX_PEER_REGION: u64 = 64 << 30;

impl ShmLink {
    /// Completes a link from our half, the peer's region and the peer's doorbell tag. Checks the
    /// peer's memfd before mapping it: sealed against shrinking and growing (so no access can
    /// SIGBUS), large enough for the layout its header claims; and makes our waiting socket,
    /// connected to the peer's ringing socket.
    fn new(
        local: ShmLocal,
        peer_memfd: PeerFd,
        peer_bell: BellTag,
        side: AsyncFd<PeerFd>,
        busy_poll: Duration,
        seen_as: u32,
    ) -> Result<ShmLink, LinkError> {
        let seals =
            sys::get_seals(peer_memfd.as_fd()).map_err(|_| LinkError::Protocol("peer region is not a memfd"))?;
        // No shrink or grow: an access past a shrunk end is SIGBUS. (Writes and hole punching
        // by the peer change only what we read from it, which is untrusted input anyway; a
        // punched hole reads as zeros.)
        let needed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals & needed != needed {
            return Err(LinkError::Protocol("peer region is not sealed against shrink and grow"));
        }
        // A shmem (tmpfs) memfd, not hugetlbfs: a hugetlb page fault with an empty pool is SIGBUS.
        if !sys::is_tmpfs(peer_memfd.as_fd())? {
            return Err(LinkError::Protocol("peer region is not on shmem"));
        }
        // Not our own region sent back (that would alias our writable mapping).
        if sys::same_file(peer_memfd.as_fd(), local.memfd.as_fd())? {
            return Err(LinkError::Protocol("peer sent our own region back"));
        }
        // The peer's doorbell: named, and not ours (we would ring only ourselves). Our waiting
        // socket, connected to the peer's ringing socket below, takes datagrams from it alone.
        if peer_bell.is_none() {
            return Err(LinkError::Protocol("peer named no doorbell"));
        }
        if peer_bell.same_ring(&local.bell_tag) {
            return Err(LinkError::Protocol("peer named our own doorbell"));
        }
        let len = sys::file_len(peer_memfd.as_fd())?;
        if !(4096..=MAX_PEER_REGION).contains(&len) {
            return Err(LinkError::Protocol("peer region size out of range"));
        }
        // The header first, from a page of its own; then only as much as the header's layout
        // needs, which the file was just checked to hold. Mapping the whole file would let a
        // peer with a small layout in a huge sparse file take our address space.
        let header = {
            let page = Mmap::map(peer_memfd.as_fd(), 4096, false)?;
            // SAFETY: the mapping is one page, page aligned and readable.
            unsafe { RegionView::read_header(page.as_ptr()) }
        };
        let layout = Layout::parse(header, len).map_err(|_| LinkError::Protocol("peer region header"))?;
        let peer_map = Mmap::map(peer_memfd.as_fd(), layout.total_len, false)?;
        // SAFETY: the mapping is `layout.total_len` bytes, within the sealed file; it is kept
        // alive by `_peer_map` for as long as the link (and so the view) exists. The view is
        // only ever read through.
        let peer = unsafe { RegionView::new(peer_map.as_ptr(), layout) };
        // Our waiting socket last, once the region is known good: bound and connected in one go
        // (see `sys::bell_ring`).
        let wait = sys::bell_wait(&local.bell_tag, &peer_bell).map_err(|e| match e.raw_os_error() {
            // Nobody has that name, or what has it is connected to another socket and would
            // refuse our connect.
            Some(libc::ECONNREFUSED | libc::ENOENT) => LinkError::Protocol("peer doorbell unreachable"),
            Some(libc::EPERM) => LinkError::Protocol("peer doorbell connected elsewhere"),
            Some(libc::EADDRINUSE) => LinkError::Protocol("our doorbell's name was taken"),
            _ if e.kind() == io::ErrorKind::InvalidData => {
                LinkError::Protocol("our doorbell was reached before it was connected")
            }
            _ => LinkError::from(e),
        })?;
        // SAFETY: DoorbellFd wraps a PeerFd, which owns its descriptor.
        let doorbell = unsafe { sys::register(DoorbellFd(wait), Interest::READABLE) }?;
        let cred = sys::peer_cred(side.get_ref().as_fd()).ok();
        // SAFETY: geteuid cannot fail and has no preconditions.
        let LendTrust { lends, peer_may_lend } = lend_trust(cred.as_ref(), seen_as, unsafe { libc::geteuid() }, |c| {
            sys::could_trace_us(c, side.get_ref().as_fd())
        });
        Ok(ShmLink {
            ours: local.view,
            peer,
            _ours_map: local.map,
            _peer_map: peer_map,
            doorbell: ReactorFd::new(doorbell, Interest::READABLE),
            ring: local.ring,
            peer_bell,
            ring_connected: AtomicBool::new(false),
            ring_connecting: Mutex::new(()),
            side: ReactorFd::new(side, Interest::READABLE | Interest::WRITABLE),
            tx: Mutex::new(CdcTx::new()),
            rx: Mutex::new(CdcRx::new()),
            rx_consumed: AtomicU64::new(0),
            space_epoch: AtomicU64::new(0),
            waiting_space: AtomicBool::new(false),
            rung_seen: AtomicBool::new(false),
            sleepers: Arc::new(AtomicU32::new(0)),
            busy_poll,
            closed: AtomicBool::new(false),
            counters: local.counters,
            lends,
            peer_may_lend,
        })
    }

    fn ring_peer(&self) -> Result<(), LinkError> {
        if let Some(c) = &self.counters {
            c.doorbell(true);
        }
        if !self.ring_connected.load(Ordering::Acquire) {
            let _once = self.ring_connecting.lock().unwrap_or_else(|e| e.into_inner());
            if !self.ring_connected.load(Ordering::Acquire) {
                sys::bell_ring_connect(self.ring.as_fd(), &self.peer_bell).map_err(|e| match e.raw_os_error() {
                    // We ring the peer only after it armed or asked for space, which it does
                    // with its waiting socket made: one that is not there (or connected to
                    // another socket) never will be.
                    Some(libc::ECONNREFUSED | libc::ENOENT | libc::EPERM) => LinkError::PeerGone,
                    _ => LinkError::from(e),
                })?;
                self.ring_connected.store(true, Ordering::Release);
            }
        }
        sys::doorbell_ring(self.ring.as_fd()).map_err(|e| match e.raw_os_error() {
            // The peer closed its waiting socket (it is gone: its side channel says so too,
            // perhaps a moment later), or connected it to another socket (`ECONNRESET` once,
            // then `EPERM`: it stopped listening to us). Either way the message is in the ring,
            // and the side channel, not the ring, decides the group's end.
            Some(libc::ECONNREFUSED | libc::ENOTCONN | libc::ECONNRESET | libc::EPIPE | libc::EPERM) => {
                LinkError::PeerGone
            }
            _ => LinkError::from(e),
        })
    }

    /// `poll_event` and `poll_event_unarmed`: `arm` says whether to arm the doorbell (and
    /// busy-poll first) when nothing is there.
    fn poll_event_inner(&self, cx: &mut Context<'_>, arm: bool) -> Poll<Result<(), LinkError>> {
        if self.closed.load(Ordering::Relaxed) {
            return Poll::Ready(Err(LinkError::Closed));
        }
        if let Poll::Ready(r) = self.poll_side(cx) {
            return Poll::Ready(r.and(Err(LinkError::PeerGone)));
        }
        let Some(doorbell) = self.doorbell.get() else {
            return Poll::Ready(Err(LinkError::Closed));
        };
        loop {
            match doorbell.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    if g.ready().is_read_closed() {
                        // Readiness that no drain clears, which would keep the driver turning
                        // for good. Nothing of the peer's shuts our own socket down (a Unix
                        // datagram socket's shutdown stays with it); should it happen, the
                        // link ends.
                        return Poll::Ready(Err(LinkError::Protocol("doorbell shut down")));
                    }
                    if !self.rung_seen.swap(true, Ordering::Relaxed) {
                        // First sight of this ring: report it at once. The counter is drained on
                        // the next call, after the woken connections had their turn, which keeps
                        // that system call off the round trip.
                        self.disarm();
                        if let Some(c) = &self.counters {
                            c.doorbell(false);
                        }
                        return Poll::Ready(Ok(()));
                    }
                    match self.take_rings(&doorbell.get_ref().0, false) {
                        // More rings may be queued (a peer ringing in a loop): keep the readiness
                        // and report work; the driver bounds what one turn does.
                        Ok(true) => {
                            self.rung_seen.store(false, Ordering::Relaxed);
                            return Poll::Ready(Ok(()));
                        }
                        // Clearing after a drain to EAGAIN is safe: tokio only clears the
                        // readiness it reported, so a ring that raced with the drain survives.
                        Ok(false) => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                    g.clear_ready();
                    self.rung_seen.store(false, Ordering::Relaxed);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => break,
            }
        }
        if self.has_work()? {
            return Poll::Ready(Ok(()));
        }
        if !arm {
            // The caller polls: the peer need not ring (nor we drain a doorbell).
            self.disarm();
            return Poll::Pending;
        }
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        if !rx.arm(&self.ours, &self.peer, self.others_asleep()) {
            return Poll::Ready(Ok(()));
        }
        drop(rx);
        // Space freed between our last look and arming: the peer rang only if it saw our
        // want_space, which was set before we looked, so re-check once more.
        if self.waiting_space.load(Ordering::Relaxed) && self.has_work()? {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }

    /// Whether a second waiter sleeps on the doorbell (see `sleepers`). SeqCst, as the count's
    /// changes: read under `rx`'s lock, where it is raised.
    fn others_asleep(&self) -> bool {
        self.sleepers.load(Ordering::SeqCst) > 0
    }

    /// Takes the rings queued on `fd` (our doorbell, or a second waiter's duplicate of it);
    /// whether more may be queued. Once any were taken, a fresh epoch is armed, which the peer
    /// rings at its next frame (the taken ring's epoch it will not ring again): by a second
    /// waiter (`always`) whoever sleeps, since our own waiter, which no count shows, may have
    /// slept on the epoch rung; by our own waiter while a second one sleeps.
    fn take_rings(&self, fd: &PeerFd, always: bool) -> Result<bool, LinkError> {
        let n = match sys::doorbell_drain(fd.as_fd(), fd.is_inert(), DOORBELL_DRAIN_MAX) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            // The kernel reports once that the peer connected its ringing socket elsewhere
            // (with datagrams still queued in it): it broke its doorbell, and the group ends.
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => {
                return Err(LinkError::Protocol("peer moved its ringing socket"))
            }
            Err(e) => return Err(e.into()),
        };
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        if always || self.others_asleep() {
            // Frames there already: whoever took the rings dispatches them next, and hands
            // what it leaves to the other waiters (`LinkGroup::hand_off`).
            let _ = rx.arm(&self.ours, &self.peer, true);
        }
        Ok(n == DOORBELL_DRAIN_MAX)
    }

    /// After frames were taken: rings the peer when it asked to hear that its CDC ring has room
    /// (`ring`). A peer that is gone cannot hear it; the frames just taken must still be
    /// delivered (its side channel tells the driver it is gone).
    fn space_freed(&self, ring: bool) -> Result<(), LinkError> {
        match ring.then(|| self.ring_peer()) {
            None | Some(Ok(()) | Err(LinkError::PeerGone)) => Ok(()),
            Some(Err(e)) => Err(e),
        }
    }

    /// Our own waiter disarms (it woke, or polls instead): unless a second waiter sleeps.
    fn disarm(&self) {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        if !self.others_asleep() {
            rx.disarm(&self.ours);
        }
    }

    fn has_work(&self) -> Result<bool, LinkError> {
        let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        if rx.ready(&self.peer) {
            return Ok(true);
        }
        drop(rx);
        if self.waiting_space.load(Ordering::Relaxed) {
            let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            return Ok(tx.space(&self.ours, &self.peer).map_err(|e| LinkError::Protocol(e.0))? > 0);
        }
        Ok(false)
    }

    fn poll_side(&self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let Some(side) = self.side.get() else {
            return Poll::Ready(Err(LinkError::Closed));
        };
        loop {
            let mut guard = match side.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            };
            let mut buf = [0u8; SIDE_MSG_LEN];
            // Nothing is sent on it once joined: a message (with descriptors or not) breaks the
            // link, and one with descriptors is left queued for the socket's close.
            match sys::recv_without_fds(side.get_ref().as_fd(), &mut buf, 0, false) {
                Ok((0, _)) => return Poll::Ready(Err(LinkError::PeerGone)),
                Ok(_) => return Poll::Ready(Err(LinkError::Protocol("unexpected side-channel message"))),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Poll::Ready(Err(LinkError::Protocol("descriptors on the side channel")))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(_) => return Poll::Ready(Err(LinkError::PeerGone)),
            }
        }
    }
}

impl Link for ShmLink {
    fn rx_rmb_size(&self) -> u32 {
        self.peer.layout().rmb_size.get()
    }

    fn release_tx_rmb(&self, rmb: u32, from: u32) {
        if let Err(e) = self.ours.release_rmb(token_slot(rmb), from) {
            // A region this crate made accepts hole punching (it carries no write seal); should
            // the kernel refuse anyway, the pages stay resident until the group goes: memory,
            // not correctness.
            tracing::debug!(error = %e, "cannot release a grown ring's pages");
        }
    }

    fn tx_write(&self, rmb: u32, offset: u32, data: &[u8]) -> Result<(), LinkError> {
        let len = u32::try_from(data.len()).map_err(|_| LinkError::Protocol("write span"))?;
        let p = self.ours.rmb_ptr(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("write span"))?;
        // Copied as peer memory is, not with a plain copy: the connection owning this RMB is
        // its only writer in this process (and holds its lock for the call), but a peer of our
        // uid can reopen the file for writing (`fchmod`) and write the same bytes while we do;
        // with relaxed atomic stores that garbles only its own stream (see `peer_mem`).
        // SAFETY: `rmb_ptr` checked that the span lies inside one RMB of our writable mapping,
        // which the link keeps mapped for as long as it exists; `data` cannot overlap it (it is
        // application memory).
        unsafe { super::peer_mem::copy_to_peer(p, data) };
        Ok(())
    }

    fn tx_read(&self, rmb: u32, offset: u32, dst: &mut [u8]) -> Result<(), LinkError> {
        let len = u32::try_from(dst.len()).map_err(|_| LinkError::Protocol("read-back span"))?;
        let p = self.ours.rmb_ptr(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("read-back span"))?;
        // Copied as peer memory is, not with a plain copy: the connection owning this RMB is
        // its only writer in this process (and holds its lock for the call), but a peer of our
        // uid can reopen the file for writing (`fchmod`) and change the bytes while we copy.
        // What it gets is its own bytes resent to itself over TCP.
        // SAFETY: `u8` and `MaybeUninit<u8>` have the same layout, and every byte of `dst` is
        // initialised, so viewing it as `MaybeUninit` and writing bytes keeps it initialised.
        let dst = unsafe { &mut *(std::ptr::from_mut::<[u8]>(dst) as *mut [MaybeUninit<u8>]) };
        // SAFETY: `rmb_ptr` checked that the span lies inside one RMB of our own mapping, which
        // the link keeps mapped for as long as it exists; `dst` is our memory, not in it.
        unsafe { super::peer_mem::copy_from_peer(p, dst) };
        Ok(())
    }

    fn tx_fill(
        &self,
        rmb: u32,
        offset: u32,
        len: u32,
        fill: &mut dyn FnMut(super::TxSpan) -> io::Result<usize>,
    ) -> Result<io::Result<usize>, LinkError> {
        let p = self.ours.rmb_ptr(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("fill span"))?;
        // SAFETY: as in tx_write: the span is inside our writable mapping, which the link keeps
        // mapped for as long as it exists (beyond this call).
        Ok(fill(unsafe { super::TxSpan::new(p, len as usize) }))
    }

    fn rx_read(&self, rmb: u32, offset: u32, dst: &mut [MaybeUninit<u8>]) -> Result<(), LinkError> {
        let len = u32::try_from(dst.len()).map_err(|_| LinkError::Protocol("read span"))?;
        let p = self.peer.rmb_ptr(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("read span"))?;
        // SAFETY: the span was bounds-checked against the peer's validated layout and lies in
        // our read-only mapping of its region, which the link keeps mapped; `dst` is
        // application memory of the same length. The peer may write these bytes while we copy
        // (only a hostile one would): the copy reads every byte with a relaxed atomic load, the
        // one access Rust allows on read-only memory that another party writes, so that is a
        // race on untrusted data, not undefined behaviour (see `peer_mem`).
        unsafe { super::peer_mem::copy_from_peer(p, dst) };
        Ok(())
    }

    fn rx_lend(&self, rmb: u32, offset: u32, len: u32) -> Result<Option<std::ptr::NonNull<u8>>, LinkError> {
        if !self.lends {
            return Ok(None);
        }
        let p = self.peer.rmb_ptr(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("lend span"))?;
        Ok(std::ptr::NonNull::new(p))
    }

    fn peer_may_lend(&self) -> bool {
        self.peer_may_lend
    }

    fn cdc_send_frame(&self, frame: &[u8; CDC_MSG_LEN]) -> Result<bool, LinkError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(LinkError::Closed);
        }
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match tx.push(&self.ours, &self.peer, frame).map_err(|e| LinkError::Protocol(e.0))? {
                Push::Sent { ring } => {
                    // The watch for space stays on: connections refused before this send wait
                    // for the peer's ring, and only the group knows when none waits any more
                    // (`clear_space_wait`). Ended here, a peer that consumed just before this
                    // push would find `want_space` clear and ring nobody, and a refused
                    // connection would wait for unrelated traffic.
                    drop(tx);
                    if ring {
                        // The message is in the ring either way. A peer that is gone will never
                        // read it; its side channel tells the driver so, which ends the group
                        // after dispatching what the peer published (failing the send here
                        // would end this connection before its received bytes are read).
                        match self.ring_peer() {
                            Ok(()) | Err(LinkError::PeerGone) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    return Ok(true);
                }
                Push::Full => {
                    let epoch = self.space_epoch.fetch_add(1, Ordering::Relaxed) + 1;
                    self.waiting_space.store(true, Ordering::Relaxed);
                    if want_space(&mut tx, epoch, &self.ours, &self.peer).map_err(|e| LinkError::Protocol(e.0))? {
                        return Ok(false);
                    }
                    // Space appeared while we asked: try again.
                }
            }
        }
    }

    fn cdc_recv(&self, out: &mut Vec<[u8; CDC_MSG_LEN]>, max: usize) -> Result<Option<usize>, LinkError> {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let before = out.len();
        let ring = rx.pop(&self.ours, &self.peer, max, out);
        self.rx_consumed.store(rx.consumed(), Ordering::Relaxed);
        drop(rx);
        self.space_freed(ring)?;
        Ok(Some(out.len() - before))
    }

    fn cdc_recv_if(
        &self,
        want: &mut dyn FnMut(&[u8; CDC_MSG_LEN]) -> bool,
    ) -> Option<([u8; CDC_MSG_LEN], Result<(), LinkError>)> {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let (frame, ring) = rx.pop_if(&self.ours, &self.peer, want)?;
        self.rx_consumed.store(rx.consumed(), Ordering::Relaxed);
        drop(rx);
        Some((frame, self.space_freed(ring)))
    }

    fn poll_event(&self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.poll_event_inner(cx, true)
    }

    fn poll_event_unarmed(&self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.poll_event_inner(cx, false)
    }

    fn clear_space_wait(&self) {
        if self.waiting_space.swap(false, Ordering::Relaxed) {
            clear_want_space(&self.ours);
        }
    }

    fn watches_space(&self) -> bool {
        self.waiting_space.load(Ordering::Relaxed)
    }

    fn has_pending(&self) -> bool {
        !self.nothing_waiting()
    }

    fn next_frame(&self) -> Option<[u8; CDC_MSG_LEN]> {
        // As `nothing_waiting`: `rx_consumed` may lag behind another thread's receive, and the
        // frame read then is one taken already; whoever acts on the hint takes frames under the
        // lock (`cdc_recv_if`), which finds out.
        self.peer.read_frame(self.rx_consumed.load(Ordering::Relaxed))
    }

    fn nothing_waiting(&self) -> bool {
        // Two loads and no lock: a hint (module docs of `region` for the lap marks; cdc_recv
        // reads and checks what the peer wrote, here only compared). `rx_consumed` may lag
        // behind another thread's receive; `frame_absent` then errs towards "something waits",
        // never towards "nothing" while a frame waits.
        self.peer.frame_absent(self.rx_consumed.load(Ordering::Relaxed))
    }

    fn busy_poll(&self) -> Duration {
        self.busy_poll
    }

    fn watch(&self) -> Option<Result<Watch, LinkError>> {
        let doorbell = self.doorbell.get()?;
        let made = doorbell.get_ref().0.as_fd().try_clone_to_owned().and_then(|dup| {
            // The duplicate refuses descriptors as the original does (the same socket).
            let fd = if doorbell.get_ref().0.is_inert() { PeerFd::new(dup).inert() } else { PeerFd::new(dup) };
            Watch::new(fd, self.sleepers.clone())
        });
        Some(made.map_err(LinkError::from))
    }

    fn poll_watch(&self, watch: &Watch, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        watch.wake();
        if self.closed.load(Ordering::Relaxed) {
            return Poll::Ready(Err(LinkError::Closed));
        }
        match watch.fd().poll_read_ready(cx) {
            Poll::Ready(Ok(mut g)) => {
                if g.ready().is_read_closed() {
                    return Poll::Ready(Err(LinkError::Protocol("doorbell shut down")));
                }
                // Taken here too: the own waiter may not run to take them, and a full queue
                // would stop the peer's rings. (That waiter then finds none, and goes on.)
                match self.take_rings(watch.fd().get_ref(), true) {
                    // More may be queued: the readiness stays for the next poll.
                    Ok(true) => {}
                    Ok(false) => g.clear_ready(),
                    Err(e) => return Poll::Ready(Err(e)),
                }
                return Poll::Ready(Ok(()));
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
            Poll::Pending => {}
        }
        if self.has_work()? {
            return Poll::Ready(Ok(()));
        }
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        // Armed for good (`keep`): the own waiter may be asleep on the same epoch, and
        // whether it is cannot be told from here.
        if !rx.arm(&self.ours, &self.peer, true) {
            return Poll::Ready(Ok(()));
        }
        watch.sleep();
        drop(rx);
        // As in `poll_event_inner`: space freed between the last look and the arming.
        if self.waiting_space.load(Ordering::Relaxed) && self.has_work()? {
            watch.wake();
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }

    fn rehome(&self) -> Result<(), LinkError> {
        self.doorbell.rehome()?;
        self.side.rehome()?;
        Ok(())
    }

    fn teardown(&self) {
        if !self.closed.swap(true, Ordering::Relaxed) {
            // A side channel lost in a failed move is closed already: the peer saw EOF then.
            if let Some(side) = self.side.get() {
                // The peer sees EOF.
                let _ = sys::shutdown(side.get_ref().as_fd(), std::net::Shutdown::Both);
            }
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        self.teardown();
    }
}

// ---------------------------------------------------------------------------------------------
// Side channel: JOIN (client to server) and WELCOME (server to client), `proto::side`.

/// Why joining failed, for the client's decline reason.
#[derive(Debug)]
pub(crate) enum JoinError {
    /// The server's side channel cannot be reached: another host or network namespace.
    Unreachable(io::Error),
    /// The server refused, or the exchange broke.
    Refused(String),
    /// The exchange took too long.
    Timeout,
    /// This process had no descriptor (or memory) for the exchange or the link.
    Starved(io::Error),
    /// The side channel is owned by another process than the listener that sent the Accept
    /// (`SO_PEERCRED` of each): our region is not handed to it.
    Impostor { door: sys::PeerCred, side: sys::PeerCred },
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::Unreachable(e) => write!(f, "server side channel unreachable: {e}"),
            JoinError::Refused(w) => write!(f, "link group join refused: {w}"),
            JoinError::Timeout => f.write_str("link group join timed out"),
            JoinError::Starved(e) => write!(f, "no resources to join a link group: {e}"),
            JoinError::Impostor { door, side } => write!(
                f,
                "side channel owned by pid {} uid {}, not by the listener's process (pid {} uid {})",
                side.pid, side.uid, door.pid, door.uid
            ),
        }
    }
}

async fn send_msg(sock: &AsyncFd<PeerFd>, msg: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    loop {
        let mut g = sock.writable().await?;
        match g.try_io(|s| sys::send_with_fds(s.get_ref().as_fd(), msg, fds)) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

async fn recv_msg(sock: &AsyncFd<PeerFd>) -> io::Result<(Vec<u8>, Vec<PeerFd>)> {
    loop {
        let mut g = sock.readable().await?;
        let mut buf = [0u8; SIDE_MSG_LEN + 1];
        match g.try_io(|s| sys::recv_with_fds(s.get_ref().as_fd(), &mut buf)) {
            Ok(Ok((n, fds))) => return Ok((buf[..n].to_vec(), fds)),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// Who may lend ring bytes in place on a link ([`lend_trust`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LendTrust {
    /// We may lend the peer's bytes to our application (`Link::rx_lend`).
    pub(crate) lends: bool,
    /// The peer may lend ours to its application: the ring we write into must never be reused
    /// after the connection leaves the link (`Link::peer_may_lend`).
    pub(crate) peer_may_lend: bool,
}

/// Decides lending on a side channel whose peer's credentials are `peer` (`None`: unreadable),
/// where the peer sees us as uid `seen_as` and our effective uid is `euid` now.
///
/// The kernel records a connecting socket's credentials when it connects and a listening
/// socket's when it starts listening, so each side may see the other as it was earlier:
/// `seen_as` is our euid then (the client's before it connects, the server's when its side
/// channel started listening). We lend only to a peer of our own uid (not the overflow ids),
/// and only while we are still the uid the peer sees, so that the peer's view of us is exact;
/// then a peer that lends saw us as its own uid, which was `seen_as`, and we treat the peer as
/// one that may lend whenever its uid is `seen_as` (or our uid now: wider is safe). A uid is
/// the same from either side of a user namespace's mapping (only an unmapped one is shown as
/// the overflow id, which never lends), so the two sides agree.
///
/// A uid is not enough: the application gets a `&[u8]` over the peer's region, which the peer
/// can write at any time, and safe code that reads it twice (a UTF-8 check, then the chars)
/// must not see it change. So we lend only to a peer that could change our memory anyway
/// (`could_trace`: [`sys::could_trace_us`]), and not, say, to a process of our uid in another
/// container or under a Yama policy that keeps it from tracing us. Each side decides that
/// alone; the other's view of it (`peer_may_lend`) stays the wider guess, which is safe.
pub(crate) fn lend_trust(
    peer: Option<&sys::PeerCred>,
    seen_as: u32,
    euid: u32,
    could_trace: impl FnOnce(&sys::PeerCred) -> bool,
) -> LendTrust {
    let Some(c) = peer else { return LendTrust { lends: false, peer_may_lend: true } };
    LendTrust {
        lends: c.trusted_by(euid, &[]) && seen_as == euid && could_trace(c),
        peer_may_lend: c.uid == seen_as || c.uid == euid,
    }
}

/// Client side: joins the server's pending link group over the side channel `name` with `join`
/// (which names `local`'s doorbell), and completes the link. The side channel must be owned by the
/// process `owner` (the listener whose door sent the Accept).
pub(crate) async fn join(
    name: &[u8],
    owner: sys::PeerCred,
    join: Join,
    local: ShmLocal,
    busy_poll: Duration,
    timeout: Duration,
) -> Result<ShmLink, JoinError> {
    // Descriptor or memory exhaustion is ours, not the server's refusal: said as such.
    let broke =
        |e: io::Error| if sys::is_starved(&e) { JoinError::Starved(e) } else { JoinError::Refused(e.to_string()) };
    // Our uid as the server will see it: the kernel records a connecting socket's credentials
    // when it connects.
    // SAFETY: geteuid cannot fail and has no preconditions.
    let seen_as = unsafe { libc::geteuid() };
    let fd = PeerFd::new(sys::seqpacket_connect(name).map_err(|e| {
        if sys::is_starved(&e) {
            JoinError::Starved(e)
        } else {
            JoinError::Unreachable(e)
        }
    })?);
    // Only the process whose door answered gets our region: a name in the abstract namespace
    // is anyone's to bind once its owner lets it go.
    let side = sys::peer_cred(fd.as_fd()).map_err(broke)?;
    // (A process outside our pid namespace shows as pid 0 on both: its uid still has to match.
    // Refusing it would end SMC-D between containers of one network namespace whose pid
    // namespaces differ.)
    if (side.pid, side.uid) != (owner.pid, owner.uid) {
        return Err(JoinError::Impostor { door: owner, side });
    }
    // SAFETY: a PeerFd owns its descriptor.
    let sock = unsafe { sys::register(fd, Interest::READABLE | Interest::WRITABLE) }.map_err(broke)?;
    let exchange = async {
        let region = local.region_fd().map_err(broke)?;
        let join_msg = join.encode();
        match send_msg(&sock, &join_msg, &[region.as_fd()]).await {
            Ok(()) => {}
            // The server's connection refuses descriptors until it knows who connected
            // (`SO_PASSRIGHTS`): its READY says it takes them now.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                #[cfg(test)]
                tests::JOINS_RESENT.with(|n| n.set(n.get() + 1));
                let (msg, fds) = recv_msg(&sock).await.map_err(broke)?;
                if Ready::decode(&msg).is_err() || !fds.is_empty() {
                    return Err(JoinError::Refused("no ready for a join refused for its region".into()));
                }
                send_msg(&sock, &join_msg, &[region.as_fd()]).await.map_err(broke)?;
            }
            Err(e) => return Err(broke(e)),
        }
        drop(region);
        let (mut msg, mut fds) = recv_msg(&sock).await.map_err(broke)?;
        if Ready::decode(&msg).is_ok() && fds.is_empty() {
            // Our JOIN went through before the server said it takes descriptors (its accept
            // came first): the WELCOME follows.
            (msg, fds) = recv_msg(&sock).await.map_err(broke)?;
        }
        let welcome = Welcome::decode(&msg).map_err(|_| JoinError::Refused("malformed welcome".into()))?;
        if !welcome.is_accepted() {
            return Err(JoinError::Refused(format!("server refused with status {}", welcome.status)));
        }
        if welcome.link_group != join.link_group {
            return Err(JoinError::Refused("welcome for another group".into()));
        }
        if fds.len() != 1 {
            return Err(JoinError::Refused("welcome without its one region".into()));
        }
        // The exchange was the one that carries descriptors: none from here on.
        sys::refuse_descriptors(sock.get_ref().as_fd());
        let peer_memfd = fds.pop().ok_or_else(|| JoinError::Refused("no region".into()))?;
        Ok((peer_memfd, welcome.bell))
    };
    let (peer_memfd, peer_doorbell) =
        tokio::time::timeout(timeout, exchange).await.map_err(|_| JoinError::Timeout)??;
    ShmLink::new(local, peer_memfd, peer_doorbell, sock, busy_poll, seen_as).map_err(|e| match e {
        LinkError::Io(kind @ io::ErrorKind::OutOfMemory, w) => JoinError::Starved(io::Error::new(kind, w)),
        e => JoinError::Refused(e.to_string()),
    })
}

/// What the server decides about a JOIN.
pub(crate) struct Admission {
    pub(crate) local: ShmLocal,
    pub(crate) busy_poll: Duration,
}

/// Server side: serves one side-channel connection: reads the JOIN, asks `admit` (which checks
/// the group, the secret and the peer's credentials and hands over our half), answers, and
/// completes the link. A connection that refuses descriptors (as a side channel's do from the
/// moment their peer connects, where the kernel can; its peer is a client we wait for) takes
/// them from here on, and says so with a READY first.
pub(crate) async fn answer_join(
    fd: PeerFd,
    timeout: Duration,
    listen_euid: u32,
    admit: impl FnOnce(Join, sys::PeerCred) -> Result<Admission, JoinRefused>,
) -> Result<(u64, ShmLink), String> {
    // Asked of the socket itself, not of how its listener was set up: a connection that
    // refuses descriptors but was not taken for inert (the process could not find out whether
    // refusal is inherited) must still say READY, or its client would wait for it.
    let refused = sys::refuses_descriptors(fd.as_fd());
    // It takes descriptors from here on (the JOIN's region), whatever is queued in it then.
    let fd = fd.taking_descriptors();
    if refused && !sys::allow_descriptors(fd.as_fd()) {
        return Err("the side channel cannot take the join's region".to_string());
    }
    // SAFETY: a PeerFd owns its descriptor.
    let sock = unsafe { sys::register(fd, Interest::READABLE | Interest::WRITABLE) }.map_err(|e| e.to_string())?;
    let work = async {
        if refused {
            send_msg(&sock, &Ready.encode(), &[]).await.map_err(|e| e.to_string())?;
        }
        let (msg, mut fds) = recv_msg(&sock).await.map_err(|e| e.to_string())?;
        let join = Join::decode(&msg).map_err(|_| "malformed join")?;
        let cred = sys::peer_cred(sock.get_ref().as_fd()).map_err(|e| e.to_string())?;
        let refuse = |why: JoinRefused| Welcome::refused(join.link_group, why).encode();
        if fds.len() != 1 || join.bell.is_none() {
            let _ = send_msg(&sock, &refuse(JoinRefused::BadRegion), &[]).await;
            return Err("join without its one region and a doorbell".to_string());
        }
        let admission = match admit(join, cred) {
            Ok(a) => a,
            Err(why) => {
                let _ = send_msg(&sock, &refuse(why), &[]).await;
                return Err(format!("join refused: {why:?}"));
            }
        };
        // The JOIN was the one message that carries descriptors to us: none from here on.
        sys::refuse_descriptors(sock.get_ref().as_fd());
        let peer_memfd = fds.pop().ok_or("no region")?;
        let region = admission.local.region_fd().map_err(|e| e.to_string())?;
        let welcome = Welcome::accepted(join.link_group, admission.local.bell_tag());
        send_msg(&sock, &welcome.encode(), &[region.as_fd()]).await.map_err(|e| e.to_string())?;
        Ok::<_, String>((join.link_group, admission, peer_memfd, join.bell))
    };
    let (id, admission, peer_memfd, peer_doorbell) =
        tokio::time::timeout(timeout, work).await.map_err(|_| "join timed out".to_string())??;
    let link = ShmLink::new(admission.local, peer_memfd, peer_doorbell, sock, admission.busy_poll, listen_euid)
        .map_err(|e| e.to_string())?;
    Ok((id, link))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::proto::clc::Secret;

    #[test]
    fn lending_is_decided_from_what_each_side_sees_of_the_other() {
        let cred = |uid| sys::PeerCred { pid: 1, uid, gid: uid };
        let t = |peer: Option<u32>, seen_as, euid| {
            let c = peer.map(cred);
            let t = lend_trust(c.as_ref(), seen_as, euid, |_| true);
            (t.lends, t.peer_may_lend)
        };
        // A peer of our uid that could not trace us is not lent to; it may still lend (it
        // decides from its own side), so our rings are kept.
        let untraceable = lend_trust(Some(&cred(1000)), 1000, 1000, |_| false);
        assert_eq!((untraceable.lends, untraceable.peer_may_lend), (false, true));
        // Both sides 1000 throughout: both lend, both keep the rings after a move.
        assert_eq!(t(Some(1000), 1000, 1000), (true, true));
        // Another uid: nobody lends, rings go back.
        assert_eq!(t(Some(1001), 1000, 1000), (false, false));
        // A server whose side channel began listening as root and that is 1000 now, with a
        // client of 1000: the client sees root and does not lend, and the server must not lend
        // either (the client would give its ring back after a move), but it keeps its own
        // ring (the client's uid is what it is now).
        assert_eq!(t(Some(1000), 0, 1000), (false, true));
        // The client of that server: it sees root, and is 1000 throughout.
        assert_eq!(t(Some(0), 1000, 1000), (false, false));
        // A server that listened as 1000 and is root now, with a client of 1000: the client
        // sees 1000 and lends; the server keeps its ring, and does not lend.
        assert_eq!(t(Some(1000), 1000, 0), (false, true));
        // Unreadable credentials: no lending, and the ring is kept.
        assert_eq!(t(None, 1000, 1000), (false, true));
        // The overflow uid never lends, but its ring is kept if it could be us.
        let (ou, _) = sys::overflow_ids();
        assert_eq!(t(Some(ou), ou, ou), (false, true));
    }

    /// A connected socket for the side channel of a hand-built link.
    fn side() -> AsyncFd<PeerFd> {
        let (a, _b) = sys::unix_pair(libc::SOCK_SEQPACKET).unwrap();
        // SAFETY: a PeerFd owns its descriptor.
        unsafe { sys::register(PeerFd::new(a), Interest::READABLE) }.unwrap()
    }

    fn small() -> Layout {
        Layout::new(8, 2, 4096).unwrap()
    }

    fn err_of(r: Result<ShmLink, LinkError>) -> LinkError {
        r.expect_err("the hostile region or doorbell must be refused")
    }

    /// What a hostile (or broken) peer might send instead of a sealed region and a doorbell:
    /// every case is refused before anything is mapped or rung.
    #[tokio::test]
    async fn hostile_regions_and_doorbells_are_refused() {
        let theirs = ShmLocal::create(small()).unwrap();
        let dup = |fd: &OwnedFd| PeerFd::new(fd.try_clone().unwrap());
        // What names a side's doorbell.
        let bell = |l: &ShmLocal| l.bell_tag;

        // An unsealed memfd (it could shrink under us: SIGBUS on the next access).
        let unsealed = sys::memfd(c"hostile", small().total_len).unwrap();
        let e = err_of(ShmLink::new(
            ShmLocal::create(small()).unwrap(),
            PeerFd::new(unsealed),
            bell(&theirs),
            side(),
            Duration::ZERO,
            0,
        ));
        assert_eq!(e, LinkError::Protocol("peer region is not sealed against shrink and grow"));

        // Sealed against growth but not against shrinking.
        let grow_only = sys::memfd(c"hostile", small().total_len).unwrap();
        sys::add_seals(grow_only.as_fd(), libc::F_SEAL_GROW).unwrap();
        let e = err_of(ShmLink::new(
            ShmLocal::create(small()).unwrap(),
            PeerFd::new(grow_only),
            bell(&theirs),
            side(),
            Duration::ZERO,
            0,
        ));
        assert_eq!(e, LinkError::Protocol("peer region is not sealed against shrink and grow"));

        // Our own region sent back.
        let ours = ShmLocal::create(small()).unwrap();
        let own = dup(&ours.memfd);
        let e = err_of(ShmLink::new(ours, own, bell(&theirs), side(), Duration::ZERO, 0));
        assert_eq!(e, LinkError::Protocol("peer sent our own region back"));

        // No doorbell named, a name nobody has bound, a doorbell connected to another one (it
        // would refuse our rings), and our own doorbell named (we would ring only ourselves).
        let (busy, busy_tag) = sys::bell_ring().unwrap();
        let (_other_ring, other_tag) = sys::bell_ring().unwrap();
        let other = sys::bell_wait(&other_tag, &busy_tag).unwrap();
        sys::bell_ring_connect(busy.as_fd(), &other_tag).unwrap();
        for (tag, want) in [
            (BellTag::NONE, "peer named no doorbell"),
            (BellTag([0x77; 24]), "peer doorbell unreachable"),
            (busy_tag, "peer doorbell connected elsewhere"),
        ] {
            let e = err_of(ShmLink::new(
                ShmLocal::create(small()).unwrap(),
                dup(&theirs.memfd),
                tag,
                side(),
                Duration::ZERO,
                0,
            ));
            assert_eq!(e, LinkError::Protocol(want));
        }
        drop((busy, other));
        // Our own ringing socket named, with our waiting name or another.
        for last in [None, Some(0x42)] {
            let ours = ShmLocal::create(small()).unwrap();
            let mut own = bell(&ours);
            if let Some(b) = last {
                own.0[16..].fill(b);
            }
            let e = err_of(ShmLink::new(ours, dup(&theirs.memfd), own, side(), Duration::ZERO, 0));
            assert_eq!(e, LinkError::Protocol("peer named our own doorbell"));
        }

        // A sealed region smaller than its header claims.
        let short = sys::memfd(c"hostile", 8192).unwrap();
        let map = Mmap::map(short.as_fd(), 8192, true).unwrap();
        // SAFETY: the first 64 bytes of the fresh mapping hold the header; the view writes only
        // those (init_header) and is dropped before the mapping.
        unsafe { RegionView::new(map.as_ptr(), small()) }.init_header();
        drop(map);
        sys::add_seals(short.as_fd(), sys::REGION_SEALS).unwrap();
        let e = err_of(ShmLink::new(
            ShmLocal::create(small()).unwrap(),
            PeerFd::new(short),
            bell(&theirs),
            side(),
            Duration::ZERO,
            0,
        ));
        assert_eq!(e, LinkError::Protocol("peer region header"));

        // A small layout in a huge sparse file: accepted, and only the layout is mapped, not
        // the gigabyte of address space the file would take.
        let huge = sys::memfd(c"hostile", 1 << 30).unwrap();
        let map = Mmap::map(huge.as_fd(), 4096, true).unwrap();
        // SAFETY: the first 64 bytes of the fresh mapping hold the header; the view writes only
        // those (init_header) and is dropped before the mapping.
        unsafe { RegionView::new(map.as_ptr(), small()) }.init_header();
        drop(map);
        sys::add_seals(huge.as_fd(), sys::REGION_SEALS).unwrap();
        let link = ShmLink::new(
            ShmLocal::create(small()).unwrap(),
            PeerFd::new(huge),
            bell(&theirs),
            side(),
            Duration::ZERO,
            0,
        )
        .unwrap();
        assert_eq!(link._peer_map.len(), small().total_len);
        drop(link);

        // The genuine article is accepted.
        assert!(ShmLink::new(
            ShmLocal::create(small()).unwrap(),
            dup(&theirs.memfd),
            bell(&theirs),
            side(),
            Duration::ZERO,
            0
        )
        .is_ok());
    }

    /// Two ends of a link joined over a real side channel named after `tag`: (client,
    /// server). The server checks the join's secret and the client's pid as it answers.
    pub(crate) async fn joined(layout: Layout, tag: &str) -> (ShmLink, ShmLink) {
        joined_over(layout, tag, false).await
    }

    /// [`joined`], over a side channel whose listener refuses descriptors (`refusing`, where
    /// the kernel can), as a real one does until it knows the client.
    async fn joined_over(layout: Layout, tag: &str, refusing: bool) -> (ShmLink, ShmLink) {
        let name = format!("smc-tokio-test-{}-{tag}", std::process::id()).into_bytes();
        let listener = sys::seqpacket_listen(&name, !refusing).unwrap();
        let inert = refusing && sys::refuses_descriptors(listener.as_fd());
        if refusing {
            // A stranger gets no descriptor in where the kernel can refuse it.
            let stranger = sys::seqpacket_connect(&name).unwrap();
            let (a, _b) = sys::unix_pair(libc::SOCK_SEQPACKET).unwrap();
            let sent = sys::send_with_fds(stranger.as_fd(), b"x", &[a.as_fd()]);
            assert_eq!(sent.is_err(), inert, "a stranger's descriptor: {sent:?}");
            let _ = sys::seqpacket_accept(listener.as_fd()).unwrap();
        }
        let secret = Secret([3; 16]);
        let server = tokio::spawn(async move {
            // SAFETY: an OwnedFd owns its descriptor.
            let l = unsafe { sys::register(listener, Interest::READABLE) }.unwrap();
            // Not marked inert: whether to say READY is asked of the socket.
            let fd = loop {
                let mut g = l.readable().await.unwrap();
                if let Ok(r) = g.try_io(|l| sys::seqpacket_accept(l.get_ref().as_fd())) {
                    break r.unwrap();
                }
            };
            answer_join(fd, Duration::from_secs(5), 0, |j, cred| {
                assert_eq!(j.secret, Secret([3; 16]));
                assert_eq!(cred.pid as u32, std::process::id());
                Ok(Admission { local: ShmLocal::create(layout).unwrap(), busy_poll: Duration::ZERO })
            })
            .await
            .unwrap()
        });
        let local = ShmLocal::create(layout).unwrap();
        let client = join(
            &name,
            sys::peer_cred(sys::unix_pair(libc::SOCK_SEQPACKET).unwrap().0.as_fd()).unwrap(),
            Join { link_group: 7, secret, bell: local.bell_tag() },
            local,
            Duration::ZERO,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let (id, server) = server.await.unwrap();
        assert_eq!(id, 7);
        (client, server)
    }

    std::thread_local! {
        /// JOINs this thread's clients sent again after a READY.
        pub(super) static JOINS_RESENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A side channel that refuses descriptors until it knows who connected: the client's
    /// JOIN, refused at first (sent before the server's task accepted: one thread runs both),
    /// goes again once the server's READY says it takes them, and the two ends are linked as
    /// over any other side channel.
    #[tokio::test]
    async fn a_side_channel_that_refuses_descriptors_takes_the_join_after_its_ready() {
        let resent = JOINS_RESENT.with(std::cell::Cell::get);
        let (client, server) = joined_over(small(), "ready", true).await;
        let refusing = sys::refusal_inherited();
        assert_eq!(JOINS_RESENT.with(std::cell::Cell::get) - resent, usize::from(refusing), "JOINs sent again");
        let frame = CdcMsg::new(1, 9).encode();
        assert_eq!(client.cdc_send_frame(&frame), Ok(true));
        let mut got = Vec::new();
        assert_eq!(server.cdc_recv(&mut got, 4), Ok(Some(1)));
        assert_eq!(got, [frame]);
    }

    /// A side channel whose owner is not the process whose door answered (a name squatted
    /// after its listener let it go): the client hands it nothing, not even the JOIN.
    #[tokio::test]
    async fn a_side_channel_owned_by_another_process_gets_nothing() {
        let name = format!("smc-tokio-test-{}-impostor", std::process::id()).into_bytes();
        let listener = sys::seqpacket_listen(&name, true).unwrap();
        let (a, _b) = sys::unix_pair(libc::SOCK_SEQPACKET).unwrap();
        let us = sys::peer_cred(a.as_fd()).unwrap();
        let door = sys::PeerCred { pid: us.pid + 1, ..us };
        match join_as(&name, door).await {
            Err(JoinError::Impostor { door: d, side }) => assert_eq!((d, side), (door, us)),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("joined a side channel of another process"),
        }
        // The connection was made and closed with nothing sent on it.
        // (Its descriptor is closed off this thread, by a closer: the end comes soon after.)
        let conn = sys::seqpacket_accept(listener.as_fd()).unwrap();
        let mut buf = [0u8; 256];
        let (n, fds) = recv_soon(&conn, &mut buf).await;
        assert_eq!((n, fds.len()), (0, 0), "an end, no JOIN and no descriptors");
        // The same listener, asked for by its real owner, is joined as far as the JOIN.
        let join = {
            let name = name.clone();
            tokio::spawn(async move { drop(join_as(&name, us).await) })
        };
        let conn = loop {
            if let Ok(c) = sys::seqpacket_accept(listener.as_fd()) {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let (n, fds) = recv_soon(&conn, &mut buf).await;
        assert_eq!((n, fds.len()), (SIDE_MSG_LEN, 1), "the JOIN, with the region");
        assert!(!Join::decode(&buf[..n]).unwrap().bell.is_none(), "the JOIN names the doorbell");
        join.abort();
    }

    /// The next message on `conn` (or its end), waited for up to 5 s.
    async fn recv_soon(conn: &PeerFd, buf: &mut [u8]) -> (usize, Vec<PeerFd>) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match sys::recv_with_fds(conn.as_fd(), buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                r => return r.unwrap(),
            }
        }
    }

    /// A join of group 7 over the side channel `name`, expecting it to be `owner`'s.
    async fn join_as(name: &[u8], owner: sys::PeerCred) -> Result<ShmLink, JoinError> {
        let local = ShmLocal::create(small()).unwrap();
        let id = Join { link_group: 7, secret: Secret([3; 16]), bell: local.bell_tag() };
        join(name, owner, id, local, Duration::ZERO, Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn link_pair_over_a_real_side_channel() {
        let (client, server) = joined(Layout::new(8, 4, 4096).unwrap(), "pair").await;

        // Data and a CDC from client to server.
        client.tx_write(2, 100, b"hello").unwrap();
        let mut m = CdcMsg::new(1, 2);
        m.prod = crate::proto::cursor::Cursor::new(0, 105);
        assert!(client.cdc_send(&m).unwrap());
        let mut frames = Vec::new();
        assert_eq!(server.cdc_recv(&mut frames, 10).unwrap(), Some(1));
        assert_eq!(CdcMsg::decode(&frames[0]).unwrap(), m);
        let mut buf = [MaybeUninit::new(0u8); 5];
        server.rx_read(2, 100, &mut buf).unwrap();
        // SAFETY: rx_read initialised all 5 bytes.
        let got: [u8; 5] = unsafe { std::mem::transmute(buf) };
        assert_eq!(&got, b"hello");
        // Out-of-bounds spans are refused.
        assert!(server.rx_read(4, 0, &mut [MaybeUninit::new(0u8); 1]).is_err());
        assert!(client.tx_write(0, 4095, b"ab").is_err());

        // The server sleeps; a CDC from the client wakes it through the doorbell.
        let waiter = tokio::spawn(async move {
            std::future::poll_fn(|cx| server.poll_event(cx)).await.unwrap();
            let mut frames = Vec::new();
            server.cdc_recv(&mut frames, 10).unwrap();
            (server, frames.len())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut m2 = m;
        m2.seq = 2;
        client.cdc_send(&m2).unwrap();
        let (server, n) = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert_eq!(n, 1);

        // Client gone: the server's link reports it.
        drop(client);
        let r = tokio::time::timeout(Duration::from_secs(5), std::future::poll_fn(|cx| server.poll_event(cx)))
            .await
            .unwrap();
        assert_eq!(r, Err(LinkError::PeerGone));
    }

    /// A second waiter (`Link::watch`, a co-driver's) asleep on the doorbell is rung whatever
    /// the link's own waiter does meanwhile: polling without arming (which disarms the doorbell
    /// when nobody else sleeps on it) leaves it armed, since the runtime of the own waiter may
    /// stop running before it arms again, and the second waiter would then sleep through the
    /// peer's frames.
    #[tokio::test]
    async fn a_second_waiter_is_rung_while_the_own_waiter_polls_without_arming() {
        let (client, server) = joined(Layout::new(8, 4, 4096).unwrap(), "watch").await;
        let server = Arc::new(server);
        let watch = server.watch().expect("a shared-memory link can be watched twice").unwrap();
        let second = {
            let server = server.clone();
            tokio::spawn(async move { std::future::poll_fn(|cx| server.poll_watch(&watch, cx)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!second.is_finished(), "nothing came: the second waiter sleeps");
        let own = std::future::poll_fn(|cx| Poll::Ready(server.poll_event_unarmed(cx))).await;
        assert!(own.is_pending(), "nothing came: the own waiter polls on");
        assert!(client.cdc_send(&CdcMsg::new(1, 2)).unwrap());
        let woken = tokio::time::timeout(Duration::from_secs(5), second).await;
        assert_eq!(woken.expect("the peer rang for the second waiter").unwrap(), Ok(()));
        // Awake, it is no longer counted: the own waiter disarms again when it polls.
        assert_eq!(server.sleepers.load(Ordering::SeqCst), 0);
    }

    /// A ring that the link's own waiter takes (drains) before a second waiter's reactor looked
    /// is one that second waiter never sees, and the peer does not ring the same epoch again:
    /// the taker arms a fresh epoch for it. Two runtimes, each run only when the test says, as
    /// two synchronous wrappers' runtimes are: the second waiter's sleeps while the own waiter's
    /// takes a ring, then the own waiter's stops and the second's runs; the peer's next frame
    /// must wake it.
    #[test]
    fn a_ring_the_own_waiter_takes_leaves_a_fresh_epoch_for_a_second_waiter() {
        let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (own_rt, second_rt) = (runtime(), runtime());
        let (client, server) = own_rt.block_on(joined(Layout::new(8, 4, 4096).unwrap(), "taken"));
        let server = Arc::new(server);
        let watch = {
            let _in = second_rt.enter();
            server.watch().expect("a shared-memory link can be watched twice").unwrap()
        };
        let second = {
            let server = server.clone();
            second_rt.spawn(async move { std::future::poll_fn(|cx| server.poll_watch(&watch, cx)).await })
        };
        second_rt.block_on(tokio::task::yield_now());
        assert_eq!(server.sleepers.load(Ordering::SeqCst), 1, "the second waiter sleeps");
        own_rt.block_on(async {
            assert!(client.cdc_send(&CdcMsg::new(1, 2)).unwrap());
            // The own waiter's reactor sees the ring; then its first sight of it, the frame
            // taken, and the drain.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let first = std::future::poll_fn(|cx| Poll::Ready(server.poll_event_unarmed(cx))).await;
            assert_eq!(first, Poll::Ready(Ok(())));
            assert!(server.rung_seen.load(Ordering::Relaxed), "it saw the ring");
            let mut frames = Vec::new();
            assert_eq!(server.cdc_recv(&mut frames, 10).unwrap(), Some(1));
            let again = std::future::poll_fn(|cx| Poll::Ready(server.poll_event_unarmed(cx))).await;
            assert!(again.is_pending(), "the ring drained, nothing left: {again:?}");
            assert!(!server.rung_seen.load(Ordering::Relaxed), "it took the ring");
        });
        // The own waiter's runtime stops; the second's runs, and the peer sends again.
        assert!(client.cdc_send(&CdcMsg::new(1, 2)).unwrap());
        let woken = second_rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), second).await });
        assert_eq!(woken.expect("the peer rang a fresh epoch").unwrap(), Ok(()));
    }

    /// A send that goes through after others were refused for want of CDC space leaves the
    /// watch for space on: the connections refused before it still wait for the peer's word
    /// that it freed slots, which the peer gives only while our `want_space` says so. Ended by
    /// that send, a peer that consumed just before it would ring nobody, and a refused
    /// connection would wait for unrelated traffic. Only `clear_space_wait` (the group, once no
    /// connection waits) ends the watch.
    #[tokio::test]
    async fn a_send_that_goes_through_keeps_the_watch_for_those_refused_before_it() {
        let (client, server) = joined(Layout::new(4, 4, 4096).unwrap(), "space").await;
        let mut m = CdcMsg::new(1, 2);
        let mut sent = 0;
        while client.cdc_send(&m).unwrap() {
            sent += 1;
            m.seq += 1;
        }
        assert_eq!(sent, 4, "the ring holds its four slots");
        assert!(client.waiting_space.load(Ordering::Relaxed));
        let wanted = client.ours.want_space().load(Ordering::Relaxed);
        assert_ne!(wanted, 0, "a refused send asks the peer to ring");

        // The peer takes a frame (and rings: it saw the request), and another send finds room.
        let mut frames = Vec::new();
        assert_eq!(server.cdc_recv(&mut frames, 1).unwrap(), Some(1));
        assert!(client.cdc_send(&m).unwrap());
        assert!(
            client.waiting_space.load(Ordering::Relaxed),
            "a send that went through ended the watch of those refused before it"
        );
        assert_eq!(client.ours.want_space().load(Ordering::Relaxed), wanted);

        // The group, finding nobody waiting any more, ends it.
        client.clear_space_wait();
        assert!(!client.waiting_space.load(Ordering::Relaxed));
        assert_eq!(client.ours.want_space().load(Ordering::Relaxed), 0);
    }

    /// A peer that connects its waiting socket to another socket stops taking our rings: the
    /// link says the peer is gone at the next ring (the side channel, not the ring, then ends
    /// the group).
    #[tokio::test]
    async fn a_peer_doorbell_connected_elsewhere_ends_its_rings() {
        use std::os::linux::net::SocketAddrExt;
        let (client, server) = joined(Layout::new(8, 4, 4096).unwrap(), "elsewhere").await;
        client.ring_peer().unwrap();
        let name = format!("smc-tokio-test-elsewhere-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let _third = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
        // What the peer can do with its own waiting socket.
        let w = server.doorbell.get().unwrap().get_ref().0.as_fd().try_clone_to_owned().unwrap();
        std::os::unix::net::UnixDatagram::from(w).connect_addr(&addr).unwrap();
        assert_eq!(client.ring_peer(), Err(LinkError::PeerGone));
        assert_eq!(client.ring_peer(), Err(LinkError::PeerGone));
    }

    /// The peer's descriptor of our region is read-only: it cannot be mapped writable, and
    /// the file's mode keeps other uids from opening it again for writing.
    #[test]
    fn the_peer_gets_a_read_only_region() {
        let local = ShmLocal::create(small()).unwrap();
        let theirs = local.region_fd().unwrap();
        let theirs = theirs.as_fd();
        // SAFETY: plain fcntl on a borrowed, open descriptor.
        let flags = unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
        assert_eq!(sys::fstat(theirs).unwrap().st_mode & 0o777, 0o400);
        assert!(Mmap::map(theirs, small().total_len, true).is_err(), "a writable mapping of the peer's view");
        assert!(Mmap::map(theirs, small().total_len, false).is_ok());
        assert!(sys::same_file(theirs, local.memfd.as_fd()).unwrap());
    }

    /// A slot's pages are given back for real when it is released: the memfd's allocated
    /// blocks (what `Shmem` counts for it) drop by the released span.
    #[test]
    fn released_rings_give_their_pages_back() {
        let layout = Layout::new(64, 2, 256 << 10).unwrap();
        let local = ShmLocal::create(layout).unwrap();
        let blocks = || sys::fstat(local.memfd.as_fd()).unwrap().st_blocks;
        let before = blocks();
        let p = local.view.rmb_ptr(1, 0, 256 << 10).unwrap();
        // SAFETY: the span lies inside our own writable mapping (rmb_ptr checked it).
        unsafe { std::ptr::write_bytes(p, 0xAB, 256 << 10) };
        let touched = blocks();
        // 512-byte blocks: 256 KiB is 512 of them.
        assert!(touched >= before + 512, "{before} -> {touched}");
        local.view.release_rmb(1, 16 << 10).unwrap();
        let released = blocks();
        assert_eq!(touched - released, (240 << 10) / 512, "{touched} -> {released}");
        // What was kept still reads as written; what was released reads as zeros.
        // SAFETY: both bytes lie inside the slot, in our mapping.
        unsafe {
            assert_eq!(*p, 0xAB);
            assert_eq!(*p.add(200 << 10), 0);
        }
    }
}
