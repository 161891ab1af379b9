//! Closing descriptors another process had a hand in, where no close can hold us up.
//!
//! Closing a descriptor can block the closing thread: the last close of a TCP socket with
//! `SO_LINGER` set and unsent data waits out the linger time (`sk_stream_wait_close`), a file on
//! a FUSE mount waits for its daemon, and closing a Unix socket closes every descriptor still
//! queued in it, in the closing thread, with the same effects (as deep as descriptors nest:
//! a Unix socket in flight can hold more). Any local user can knock on a door, squat on a door
//! name or connect to a side channel, and queue such descriptors there. So:
//!
//! - Nothing that came from a peer is closed on a runtime worker or on the caller of
//!   `connect`/`accept`: dropping a [`PeerFd`] hands it to a closer thread.
//! - A closer defuses before it closes ([`defuse`]): a Unix socket is shut down (so nothing
//!   more can be queued in it) and every message still queued in it is taken out, with its
//!   descriptors, which are defused in turn; every socket's `SO_LINGER` is turned off. After that, the close of a
//!   TCP socket returns at once and the kernel sends what is queued in the background.
//! - What still blocks (a FUSE file, say) holds up one closer, not the others: a watchdog
//!   starts another closer when every closer has been inside one close for longer than
//!   [`STALL`], up to [`MAX_CLOSERS`]. Closers beyond the first leave after [`IDLE_EXIT`] idle.
//! - While every closer is stuck at that bound, or the queue is long ([`queue_high`]), the
//!   closers are *congested* ([`congested`]): no door or side-channel connection that would
//!   need a closer is accepted or opened, and no new link group is set up (connections that
//!   would need one stay TCP), so a peer that blocks every closer cannot go on to fill the
//!   descriptor table with knocks that wait for them. Descriptors that peers send over
//!   connections already open (where the kernel cannot refuse them, before Linux 6.16) still
//!   go to the closers.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// A descriptor another process may have had a hand in: one it sent us (`SCM_RIGHTS`), or a
/// Unix socket it can queue descriptors into (a door, probe or side-channel connection, a
/// doorbell). Dropping it hands the descriptor to a closer thread (see the module docs).
pub(crate) struct PeerFd {
    fd: Option<OwnedFd>,
    disarm: bool,
    /// Closed where it is dropped (see [`PeerFd::inert`]).
    inert: bool,
}

impl PeerFd {
    pub(crate) fn new(fd: OwnedFd) -> PeerFd {
        PeerFd { fd: Some(fd), disarm: true, inert: false }
    }

    /// The same descriptor, closed where it is dropped instead of on a closer. Only for a Unix
    /// socket that has refused descriptors since it was made (a connection accepted from a
    /// listener with `SO_PASSRIGHTS` off, which it inherits when the peer connects): nothing
    /// can be queued in it but bytes, and a Unix socket has no linger, so its close cannot
    /// block.
    pub(crate) fn inert(mut self) -> PeerFd {
        self.inert = true;
        self
    }

    /// The same descriptor, closed on a closer again: its socket is about to take descriptors
    /// ([`allow_descriptors`](crate::sys::allow_descriptors)), and from then on anything may be
    /// queued in it.
    pub(crate) fn taking_descriptors(mut self) -> PeerFd {
        self.inert = false;
        self
    }

    /// Whether it refuses descriptors since it was made ([`PeerFd::inert`]).
    pub(crate) fn is_inert(&self) -> bool {
        self.inert
    }

    /// A descriptor closed on a closer as it is, not defused: for tests whose close must block
    /// as it would undefused (`faults::close_on_a_closer_as_is`).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn as_is(fd: OwnedFd) -> PeerFd {
        PeerFd { fd: Some(fd), disarm: false, inert: false }
    }

    /// The descriptor, to be closed by the caller (a closer, which defuses it first).
    fn into_owned(mut self) -> OwnedFd {
        match self.fd.take() {
            Some(fd) => fd,
            None => unreachable!("a PeerFd is only emptied by drop"),
        }
    }
}

impl std::fmt::Debug for PeerFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PeerFd").field(&self.as_raw_fd()).finish()
    }
}

impl AsFd for PeerFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.fd {
            Some(fd) => fd.as_fd(),
            None => unreachable!("a PeerFd is only emptied by drop"),
        }
    }
}

impl AsRawFd for PeerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl Drop for PeerFd {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            if self.inert {
                drop(fd);
            } else {
                close_later(fd, self.disarm);
            }
        }
    }
}

/// How long a closer lets descriptors gather after it was woken, before it closes them.
/// Descriptors come in bursts (a flood of knocks, a link group's teardown), and waking a thread
/// is the expensive part of handing one over: measured when each same-host connection still
/// handed the closer two or three descriptors, in `smcperf local --scenario crr --conns 64` a
/// wake per descriptor was five futex calls per connection and the closer took 8% of all CPU. 200 us keeps the wait
/// well under a round trip of the slowest client while gathering a dozen per wake-up there.
const CLOSER_GATHER: Duration = Duration::from_micros(200);

/// A close that has not returned after this long is stuck (a defused close of any socket
/// returns in microseconds; only a file whose close waits for somebody else, a FUSE daemon,
/// takes longer): when every closer is stuck, the watchdog starts another. Also how often the
/// watchdog looks while descriptors wait.
const STALL: Duration = Duration::from_millis(100);

/// Closers at most. Each costs a thread with a small stack; a peer that can make closes block
/// for good (a FUSE file it serves) holds one per such descriptor, so this bounds what it can
/// cost us. Beyond it descriptors wait in the queue until a closer comes free.
const MAX_CLOSERS: usize = 16;

/// A closer beyond the first that has had nothing to do for this long leaves.
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// Descriptors waiting for a closer at which the closers count as congested even while one
/// of them works: an eighth of the descriptor limit, between 64 and 4096 (the door's bound on
/// its connections is a quarter, `door::MAX_CONNS` at most). A defused close takes a few
/// system calls, so the queue gets this long only when closes are slow or blocked; the process
/// then stops taking descriptors from others before the waiting ones cost it a fair share of
/// its descriptor table.
fn queue_high() -> usize {
    static HIGH: OnceLock<usize> = OnceLock::new();
    *HIGH.get_or_init(|| {
        let eighth = super::nofile_limit().map_or(4096, |n| n / 8);
        usize::try_from(eighth).unwrap_or(4096).clamp(64, 4096)
    })
}

/// Whether the closers are congested (see the module docs): every closer is stuck in a close
/// at [`MAX_CLOSERS`], or [`queue_high`] descriptors wait. While they are, the process takes no
/// new descriptor from another process; callers keep their connections on TCP.
pub(crate) fn congested() -> bool {
    // Ordering: a hint read without the pool's lock; it is written under the lock whenever the
    // queue or the closers' state changes, and a stale read costs one connection's choice.
    CONGESTED.load(Ordering::Relaxed)
}

/// How long a door or side channel that takes no connection while the closers are congested
/// waits before it looks again: the watchdog's period ([`STALL`]), the soonest a stuck closer
/// is seen free or replaced.
pub(crate) const CONGESTED_RETRY: Duration = STALL;

/// Stack of a closer thread: it only makes system calls.
const CLOSER_STACK: usize = 128 << 10;

/// Messages taken out of one Unix socket's queue before it is closed. A peer can queue at most
/// its send buffer's worth (about 200 KiB of the smallest messages, a few thousand); what is
/// left beyond this is closed by the kernel when the socket is, in the closer.
const DRAIN_MAX: usize = 8192;

/// Descriptors one defuse handles at most (a socket, what is queued in it, what is queued in
/// those, ...): the bound on a nested flood; the rest is closed undefused, in the closer.
const DEFUSE_MAX: usize = 1 << 16;

/// Descriptors a defuse holds at once, taken out of queues and not yet closed (beyond one
/// message's worth, up to 253): a socket with more queued is drained again once those are
/// closed, and one met while this many are held is closed undrained (the kernel closes what it
/// holds). Without a bound, a peer that queued thousands of descriptors made a closer take the
/// process's whole descriptor table while it worked through them, and every accept and connect
/// of the process failed meanwhile.
const HOLD_MAX: usize = 256;

/// Descriptors all closers together hold at once, taken out of queues and not yet closed:
/// a sixteenth of the descriptor limit, between 16 and 4096. A closer stuck in a close (a file
/// on a FUSE mount whose daemon never answers) keeps what it holds for as long as it is stuck,
/// and every closer can be: without a bound of all, a peer that sent such a file after two
/// messages of 253 descriptors made each of the [`MAX_CLOSERS`] closers hold about 500 of ours,
/// some 8 000, and the process's own accepts and connects failed with `EMFILE`. A queue taken
/// out while the others hold the rest is taken out only as far as the bound allows; what it
/// still holds is closed by the kernel with it, in the closer.
fn hold_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let sixteenth = super::nofile_limit().map_or(4096, |n| n / 16);
        usize::try_from(sixteenth).unwrap_or(4096).clamp(16, 4096)
    })
}

/// Descriptors the closers hold now (see [`hold_budget`]). Ordering: a count with nothing
/// published through it, Relaxed throughout; the compare-exchange keeps it within the budget.
static HELD: AtomicUsize = AtomicUsize::new(0);

#[cfg(test)]
thread_local! {
    /// A budget of this thread's own for its defuses (tests): what other tests' closers hold
    /// at the same time does not change what it may take.
    static OWN_BUDGET: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Takes up to `want` descriptors' worth of the closers' budget; returns how many it got.
fn take_hold(want: usize) -> usize {
    #[cfg(test)]
    if let Some(left) = OWN_BUDGET.get() {
        let n = want.min(left);
        OWN_BUDGET.set(Some(left - n));
        HELD.fetch_add(n, Ordering::Relaxed);
        return n;
    }
    let budget = hold_budget();
    let mut now = HELD.load(Ordering::Relaxed);
    loop {
        let n = want.min(budget.saturating_sub(now));
        if n == 0 {
            return 0;
        }
        match HELD.compare_exchange_weak(now, now + n, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return n,
            Err(seen) => now = seen,
        }
    }
}

/// Gives `n` descriptors' worth back to the closers' budget.
fn give_hold(n: usize) {
    #[cfg(test)]
    if let Some(left) = OWN_BUDGET.get() {
        OWN_BUDGET.set(Some(left + n));
    }
    if n > 0 {
        HELD.fetch_sub(n, Ordering::Relaxed);
    }
}

/// What the closers have done, for [`crate::Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CloserStats {
    /// Descriptors closed, those found queued inside Unix sockets included.
    pub(crate) closed: u64,
    /// Descriptors found queued inside Unix sockets about to be closed.
    pub(crate) drained: u64,
    /// Closers started because every closer was stuck in a close.
    pub(crate) stalls: u64,
    /// Closer threads running now.
    pub(crate) threads: u64,
    /// Descriptors waiting to be closed now.
    pub(crate) queued: u64,
    /// The closers are congested now ([`congested`]).
    pub(crate) congested: bool,
}

static CONGESTED: AtomicBool = AtomicBool::new(false);
static CLOSED: AtomicU64 = AtomicU64::new(0);
static DRAINED: AtomicU64 = AtomicU64::new(0);
static STALLS: AtomicU64 = AtomicU64::new(0);

/// What the closers have done so far.
pub(crate) fn closer_stats() -> CloserStats {
    let (threads, queued) = match pool() {
        Some(p) => {
            let st = p.lock();
            (st.workers.len() as u64, st.queue.len() as u64)
        }
        None => (0, 0),
    };
    CloserStats {
        closed: CLOSED.load(Ordering::Relaxed),
        drained: DRAINED.load(Ordering::Relaxed),
        stalls: STALLS.load(Ordering::Relaxed),
        threads,
        queued,
        congested: congested(),
    }
}

/// When a closer entered the close it is in, in nanoseconds since [`Pool::epoch`] plus one;
/// 0 while it is not closing anything.
type Busy = Arc<AtomicU64>;

struct Pool {
    epoch: Instant,
    state: Mutex<Closing>,
    /// Closers waiting for work.
    work: Condvar,
    /// The watchdog waiting.
    watch: Condvar,
}

#[derive(Default)]
struct Closing {
    /// Descriptors to close, each with whether to defuse it first.
    queue: VecDeque<(OwnedFd, bool)>,
    /// Closers waiting on `work` (a push must wake one).
    idle: usize,
    /// Every closer's busy mark.
    workers: Vec<Busy>,
    /// The watchdog waits on `watch` without a timeout (the queue was empty).
    watch_idle: bool,
    /// Every closer is stuck in a close at [`MAX_CLOSERS`] (set by the watchdog, cleared when a
    /// close returns).
    capped: bool,
}

impl Closing {
    /// Publishes whether the closers are congested, after the queue or `capped` changed.
    fn note(&self) {
        let waiting = self.queue.len() + HELD.load(Ordering::Relaxed);
        CONGESTED.store(self.capped || waiting >= queue_high(), Ordering::Relaxed);
    }
}

fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<&'static Pool>> = OnceLock::new();
    *POOL.get_or_init(|| {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            epoch: Instant::now(),
            state: Mutex::default(),
            work: Condvar::new(),
            watch: Condvar::new(),
        }));
        let mut st = pool.lock();
        if let Err(e) = pool.spawn_closer(&mut st) {
            tracing::warn!(error = %e, "cannot start the descriptor closer thread: closing in place");
            return None;
        }
        if let Err(e) = std::thread::Builder::new()
            .name("smc-tokio-closer-watch".into())
            .stack_size(CLOSER_STACK)
            .spawn(move || pool.watchdog())
        {
            // One closer still works; only a stuck one would not be replaced.
            tracing::warn!(error = %e, "cannot start the closer watchdog: a stuck close will hold the others up");
        }
        drop(st);
        Some(pool)
    })
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Closing> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    fn spawn_closer(&'static self, st: &mut Closing) -> io::Result<()> {
        let busy: Busy = Arc::default();
        let mine = busy.clone();
        std::thread::Builder::new()
            .name("smc-tokio-closer".into())
            .stack_size(CLOSER_STACK)
            .spawn(move || self.closer(mine))?;
        st.workers.push(busy);
        Ok(())
    }

    fn closer(&'static self, busy: Busy) {
        let mut st = self.lock();
        loop {
            if st.queue.is_empty() {
                st.idle += 1;
                let (next, wait) = self.work.wait_timeout(st, IDLE_EXIT).unwrap_or_else(|p| p.into_inner());
                st = next;
                st.idle -= 1;
                if st.queue.is_empty() {
                    if wait.timed_out() && st.workers.len() > 1 {
                        st.workers.retain(|b| !Arc::ptr_eq(b, &busy));
                        return;
                    }
                    continue;
                }
                // Woken for a burst: let it gather (see CLOSER_GATHER).
                drop(st);
                std::thread::sleep(CLOSER_GATHER);
                st = self.lock();
                continue;
            }
            let Some((fd, disarm)) = st.queue.pop_front() else { continue };
            st.note();
            // Ordering: the mark is read by the watchdog only under the pool's lock or as a
            // hint (Relaxed both ways); the lock orders everything that matters.
            busy.store(self.now(), Ordering::Relaxed);
            drop(st);
            defuse_and_close(fd, disarm);
            busy.store(0, Ordering::Relaxed);
            st = self.lock();
            // With nothing queued this closer goes idle: no longer all stuck. With more queued it
            // takes the next one, which may block as well: the watchdog decides.
            if st.queue.is_empty() && std::mem::take(&mut st.capped) {
                st.note();
            }
        }
    }

    /// Starts a closer whenever every closer has been inside one close for longer than
    /// [`STALL`] while descriptors wait.
    fn watchdog(&'static self) {
        let mut st = self.lock();
        loop {
            if st.queue.is_empty() {
                st.watch_idle = true;
                st = self.watch.wait(st).unwrap_or_else(|p| p.into_inner());
                st.watch_idle = false;
                continue;
            }
            let now = self.now();
            let stall = u64::try_from(STALL.as_nanos()).unwrap_or(u64::MAX);
            let all_stuck = st.idle == 0
                && st.workers.iter().all(|b| {
                    let since = b.load(Ordering::Relaxed);
                    since != 0 && now.saturating_sub(since) > stall
                });
            if all_stuck {
                if st.workers.len() < MAX_CLOSERS {
                    match self.spawn_closer(&mut st) {
                        Ok(()) => {
                            STALLS.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                closers = st.workers.len(),
                                "every descriptor closer is stuck in a close: started another"
                            );
                        }
                        Err(e) => {
                            // No more closers to be had: as congested as at the bound.
                            if !std::mem::replace(&mut st.capped, true) {
                                st.note();
                            }
                            tracing::warn!(error = %e, "cannot start another descriptor closer");
                        }
                    }
                } else if !std::mem::replace(&mut st.capped, true) {
                    st.note();
                    tracing::warn!(
                        closers = MAX_CLOSERS,
                        "every descriptor closer is stuck in a close, and no more are started: descriptors wait, and none is taken from other processes"
                    );
                }
            } else if std::mem::take(&mut st.capped) {
                st.note();
            }
            st = self.watch.wait_timeout(st, STALL).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// Closes `fd` on a closer thread (see the module docs), or here if no closer can be started;
/// with `disarm`, defuses it first ([`defuse`]).
pub(crate) fn close_later(fd: OwnedFd, disarm: bool) {
    let Some(pool) = pool() else {
        defuse_and_close(fd, disarm);
        return;
    };
    let mut st = pool.lock();
    st.queue.push_back((fd, disarm));
    st.note();
    // Only a waiting closer needs the wake-up (a futex call); a busy one takes the descriptor
    // after its current one. The watchdog is woken once per burst (it sleeps only while the
    // queue is empty).
    let wake = st.idle > 0;
    let watch = std::mem::take(&mut st.watch_idle);
    drop(st);
    if wake {
        pool.work.notify_one();
    }
    if watch {
        pool.watch.notify_one();
    }
}

/// A descriptor a defuse works on: whether to defuse it, and whether it was taken out of a
/// queue (and so counts in [`HELD`] until it is closed).
struct Work {
    fd: OwnedFd,
    disarm: bool,
    held: bool,
}

/// Defuses (with `disarm`) and closes `fd` and whatever was queued in it; returns the most
/// descriptors it held at once.
fn defuse_and_close(fd: OwnedFd, disarm: bool) -> usize {
    let mut work = vec![Work { fd, disarm, held: false }];
    let (mut handled, mut most) = (0usize, 0usize);
    while let Some(w) = work.pop() {
        handled += 1;
        if w.disarm && handled <= DEFUSE_MAX {
            let before = work.len();
            let more = defuse(w.fd.as_fd(), &mut work, HOLD_MAX.saturating_sub(before));
            most = most.max(work.len() + 1);
            if more {
                // Drained again after what it gave is closed (beneath it on the stack).
                work.insert(before, w);
                continue;
            }
        }
        let held = w.held;
        drop(w.fd);
        if held {
            give_hold(1);
        }
        CLOSED.fetch_add(1, Ordering::Relaxed);
    }
    most
}

/// Makes the close of `fd` unable to block on anything a peer did to it: a Unix socket is shut
/// down and its queue taken out, until `room` more descriptors are in `found` or the closers'
/// budget is spent (to be defused in turn); a socket's linger is turned off. Anything else is
/// left as it is. Returns whether the socket's queue may hold more, and should be taken out
/// again once what it gave is closed.
fn defuse(fd: BorrowedFd<'_>, found: &mut Vec<Work>, room: usize) -> bool {
    match socket_domain(fd) {
        Some(libc::AF_UNIX) => {
            // After it nothing more can be queued in this socket, while what is queued stays
            // readable.
            let _ = super::shutdown(fd, std::net::Shutdown::Both);
            if room == 0 {
                // As many held as may be: closed undrained.
                return false;
            }
            let before = found.len();
            let more = drain_queue(fd, found, before + room);
            DRAINED.fetch_add((found.len() - before) as u64, Ordering::Relaxed);
            // Taken out again only if this turn took something: with the closers' budget spent
            // by others (stuck in closes), the socket is closed undrained instead of drained
            // again and again for nothing.
            more && found.len() > before
        }
        Some(_) => {
            disarm_linger(fd);
            false
        }
        None => false,
    }
}

/// The socket's address family, `None` for a descriptor that is not a socket.
fn socket_domain(fd: BorrowedFd<'_>) -> Option<libc::c_int> {
    super::getsockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN, 0 as libc::c_int).ok()
}

/// Takes the messages queued in the (shut down) Unix socket `fd` out, without waiting, and
/// keeps the descriptors they carried in `found`, until it holds `until` of them or the
/// closers' budget ([`hold_budget`]) is spent; returns whether it stopped there (more may be
/// queued). A message is taken whole when there is room for the most one can carry;
/// otherwise, once something was taken, it is left for the next drain; with nothing taken, the
/// descriptors that fit in the room left are taken, and the kernel closes the others
/// (`MSG_CTRUNC`), here, undefused.
fn drain_queue(fd: BorrowedFd<'_>, found: &mut Vec<Work>, until: usize) -> bool {
    /// The most descriptors one message carries (the kernel's `SCM_MAX_FD`).
    const PER_MESSAGE: usize = 253;
    let mut data = [0u8; 4096];
    let start = found.len();
    for _ in 0..DRAIN_MAX {
        let want = until.saturating_sub(found.len()).min(PER_MESSAGE);
        if want < PER_MESSAGE && found.len() > start {
            // Room for less than a whole message: what was taken is closed first, and the rest
            // taken out after, whole where the budget allows.
            return true;
        }
        let room = take_hold(want);
        if room == 0 {
            return true;
        }
        let got = super::recvmsg_some_fds(fd, &mut data, libc::MSG_DONTWAIT, Some(room));
        let taken = got.as_ref().map_or(0, |(_, fds, _)| fds.len());
        if taken > room {
            // Not expected (the control buffer has room for `room`), but every descriptor
            // taken counts.
            HELD.fetch_add(taken - room, Ordering::Relaxed);
        }
        give_hold(room.saturating_sub(taken));
        match got {
            // End of stream, with nothing attached (an empty datagram that carried descriptors
            // is not the end).
            Ok((0, fds, flags)) if fds.is_empty() && flags & libc::MSG_CTRUNC == 0 => return false,
            Ok((_, fds, _)) => {
                found.extend(fds.into_iter().map(|f| Work { fd: f.into_owned(), disarm: true, held: true }));
            }
            // EAGAIN: the queue is empty. Anything else: nothing more to take.
            Err(_) => return false,
        }
    }
    false
}

/// Turns `SO_LINGER` off on a socket about to be closed, so that its close does not wait (the
/// kernel still sends what is queued, in the background). No linger: nothing.
fn disarm_linger(fd: BorrowedFd<'_>) {
    let off = libc::linger { l_onoff: 0, l_linger: 0 };
    if super::getsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, off).is_ok_and(|l| l.l_onoff != 0) {
        let _ = super::setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixDatagram, UnixStream};

    fn read_eof(s: &UnixStream) -> usize {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 1];
        (&*s).read(&mut buf).unwrap()
    }

    /// A descriptor handed to the closer is closed (its peer reads EOF), off this thread.
    #[test]
    fn the_closer_closes() {
        let (a, b) = UnixStream::pair().unwrap();
        close_later(OwnedFd::from(a), true);
        assert_eq!(read_eof(&b), 0);
    }

    /// A pipe: its write end is what the tests send, since its read end sees the end only once
    /// every copy of the write end is closed (a socket's peer sees it at the first copy's
    /// shutdown, which a defuse does).
    fn pipe() -> (OwnedFd, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: two new descriptors nothing else owns.
        unsafe {
            use std::os::fd::FromRawFd;
            (OwnedFd::from_raw_fd(fds[1]), std::fs::File::from_raw_fd(fds[0]))
        }
    }

    /// Whether every copy of a pipe's write end is closed: its read end reads the end.
    fn all_closed(read_end: &std::fs::File) -> bool {
        let mut pfd = libc::pollfd { fd: read_end.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; waits up to 10 s.
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        n == 1 && pfd.revents & libc::POLLHUP != 0
    }

    /// A peer that queued thousands of descriptors in a Unix socket we close (here 40 messages
    /// of 253 copies of a pipe) does not make the defuse hold them all at once: it takes at
    /// most `HOLD_MAX`, and never more than the closers' budget, out before it closes them,
    /// and every copy is closed in the end.
    #[test]
    fn a_flood_of_queued_descriptors_is_closed_a_few_hundred_at_a_time() {
        /// The most descriptors one message carries (the kernel's `SCM_MAX_FD`).
        const PER_MESSAGE: usize = 253;
        let queue = |messages: usize| {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let (sent, read_end) = pipe();
            let copies = vec![sent.as_fd(); PER_MESSAGE];
            for _ in 0..messages {
                super::super::send_with_any_fds(theirs.as_fd(), b"f", &copies).unwrap();
            }
            (ours, read_end)
        };
        let (ours, read_end) = queue(40);
        for budget in [4096, 100] {
            OWN_BUDGET.set(Some(budget));
            let (ours, read_end) = queue(4);
            let held = defuse_and_close(OwnedFd::from(ours), true);
            // A message at a time (whole where the budget allows), and the socket.
            assert_eq!(held, PER_MESSAGE.min(budget) + 1, "with a budget of {budget}");
            assert!(all_closed(&read_end), "a copy was left open");
            assert_eq!(OWN_BUDGET.get(), Some(budget), "the budget was not given back");
        }
        OWN_BUDGET.set(None);
        let held = defuse_and_close(OwnedFd::from(ours), true);
        assert!(held <= HOLD_MAX.min(hold_budget()) + 1, "held {held} descriptors at once");
        assert!(all_closed(&read_end), "a copy was left open");
    }

    /// While other closers hold the whole budget (stuck in closes, say), a socket's queue is
    /// not taken out at all: the socket is closed with what it holds (the kernel closes that),
    /// and nothing is left open. With a budget of one, a message of three descriptors gives
    /// one, and the kernel closes the other two.
    #[test]
    fn a_spent_budget_takes_nothing_out_and_still_closes_everything() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (sent, read_end) = pipe();
        for _ in 0..3 {
            super::super::send_with_fds(theirs.as_fd(), b"f", &[sent.as_fd()]).unwrap();
        }
        drop(sent);
        OWN_BUDGET.set(Some(0));
        let held = defuse_and_close(OwnedFd::from(ours), true);
        assert_eq!(held, 1, "descriptors were taken out past the budget");
        assert!(all_closed(&read_end), "a copy was left open");

        let (ours, theirs) = UnixStream::pair().unwrap();
        let (sent, read_end) = pipe();
        super::super::send_with_any_fds(theirs.as_fd(), b"f", &[sent.as_fd(), sent.as_fd(), sent.as_fd()]).unwrap();
        drop(sent);
        OWN_BUDGET.set(Some(1));
        let held = defuse_and_close(OwnedFd::from(ours), true);
        assert_eq!(held, 2, "one descriptor of the budget, and the socket");
        assert_eq!(OWN_BUDGET.get(), Some(1), "the budget was not given back");
        assert!(all_closed(&read_end), "a copy was left open");
        OWN_BUDGET.set(None);
    }

    /// A socket queued in a Unix socket we close, and one queued in that one (nested), are
    /// taken out and closed too, with their lingers off.
    #[test]
    fn queued_descriptors_are_taken_out_and_defused_as_deep_as_they_nest() {
        let (outer_ours, outer_theirs) = UnixStream::pair().unwrap();
        let (inner_a, inner_b) = UnixStream::pair().unwrap();
        let (leaf, leaf_peer) = UnixStream::pair().unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let lingering = std::net::TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
        let (_server_end, _) = tcp.accept().unwrap();
        super::super::setsockopt(
            lingering.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &libc::linger { l_onoff: 1, l_linger: 3600 },
        )
        .unwrap();
        let lingering_dup = lingering.try_clone().unwrap();
        // leaf goes into inner_b's queue (sent from inner_a), inner_b into outer_ours's queue.
        super::super::send_with_fds(inner_a.as_fd(), b"leaf", &[leaf.as_fd(), lingering.as_fd()]).unwrap();
        super::super::send_with_fds(outer_theirs.as_fd(), b"inner", &[inner_b.as_fd()]).unwrap();
        drop((leaf, inner_b, lingering));
        let before = closer_stats();
        close_later(OwnedFd::from(outer_ours), true);
        // leaf's only other holder was inner_b's queue: closing it there gives its peer EOF.
        assert_eq!(read_eof(&leaf_peer), 0);
        // The queued TCP socket's linger was turned off (we still hold a copy to look at).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let off = libc::linger { l_onoff: 0, l_linger: 0 };
            let l = super::super::getsockopt(lingering_dup.as_fd(), libc::SOL_SOCKET, libc::SO_LINGER, off).unwrap();
            if l.l_onoff == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the queued socket kept its linger");
            std::thread::sleep(Duration::from_millis(5));
        }
        let after = closer_stats();
        assert!(after.drained >= before.drained + 3, "{before:?} -> {after:?}");
        assert!((&outer_theirs).write_all(b"more").is_err(), "our end of the outer socket is closed");
    }

    /// A close that blocks holds up one closer, not the others: the watchdog starts another.
    #[test]
    fn a_stuck_close_does_not_hold_up_the_others() {
        // A lingering socket with unsent data towards a peer that never reads, whose last
        // close is ours and is told to keep its options: the closer blocks in it for a minute
        // (until the peer is dropped at the end, which resets it).
        let (s, peer) = crate::faults::socket_whose_close_blocks(Duration::from_secs(60)).unwrap();
        drop(PeerFd::as_is(s));
        // Give the closer time to enter the stuck close, then hand it more.
        std::thread::sleep(Duration::from_millis(20));
        let (a, b) = UnixStream::pair().unwrap();
        close_later(OwnedFd::from(a), true);
        // Within the read's 10 s bound, far inside the stuck close's minute.
        assert_eq!(read_eof(&b), 0);
        assert!(closer_stats().stalls >= 1, "{:?}", closer_stats());
        drop(peer);
    }

    /// A datagram doorbell's queue is taken out too.
    #[test]
    fn a_datagram_sockets_queue_is_taken_out() {
        let (ours, theirs) = UnixDatagram::pair().unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        super::super::send_with_fds(theirs.as_fd(), b"r", &[x.as_fd()]).unwrap();
        drop(x);
        close_later(OwnedFd::from(ours), true);
        assert_eq!(read_eof(&y), 0);
    }
}
