//! One SMC connection: the engine's state behind a lock, the wakers of the tasks that wait on
//! it, and the copies between the application's buffers and the link.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use tokio::io::ReadBuf;
use tokio::net::TcpStream;

use crate::error::SmcError;
use crate::link::LinkError;
use crate::proto::cdc::CdcMsg;
use crate::proto::cursor::RingSize;
use crate::proto::engine::ConnEngine;
use crate::smc::group::LinkGroup;
use crate::sys;
use crate::transport::HandbackCause;

/// Whether received bytes copied out are consumed (a read) or left for the next read (a peek).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    Consume,
    Peek,
}

/// The most a copying [`SmcConn::poll_lend`] takes at once: tokio's `BufReader` holds 8 KiB;
/// twice that halves the calls of a bulk reader, and the buffer exists only on streams whose
/// `AsyncBufRead` copies (TCP, or a link that lends nothing).
pub(crate) const SCRATCH_LEN: usize = 16 * 1024;

/// What [`SmcConn::poll_lend`] hands the application.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lent {
    /// `len` received bytes where they lie in the ring, at `ptr` in the link's mapping (which
    /// lives as long as the connection's group, so as long as the connection).
    Ring { ptr: std::ptr::NonNull<u8>, len: usize },
    /// This many received bytes copied into the caller's buffer (the link lends nothing).
    Copied(usize),
}

/// Why a connection ended abnormally.
#[derive(Debug, Clone)]
enum ConnError {
    /// The peer aborted (reset) the connection.
    Reset,
    /// The peer went away without an SMC close: its process is gone (the link group's side
    /// channel closed, RDMA retries ran out), or the TCP connection under the SMC one ended
    /// (`tcp_reset`: with a reset). Decided after every message the peer published was
    /// dispatched, so the bytes it sent are all known: reads return them, then the end TCP
    /// would report ([`ConnError::end_of_stream`]).
    PeerGone { tcp_reset: bool },
    /// The link failed under the connection (a local system call, an RDMA work completion):
    /// reads return the bytes that arrived before, then this error.
    LinkFailed(String),
    /// The link group was torn down here (its runtime shut down): nothing more can be read.
    Closed,
    /// The peer broke the protocol (a bad cursor, sequence or flags; its region, control words
    /// or CDC messages invalid): the connection ends at once.
    Protocol(String),
    /// The TCP connection failed while the connection moved to it (a handback).
    Tcp(io::ErrorKind, String),
    /// The runtime whose reactor holds the connection's TCP socket shut down while the
    /// application still held the stream: as tokio's stream of such a runtime, it reads and
    /// writes nothing more.
    RuntimeGone,
}

impl ConnError {
    fn from_link(e: &LinkError) -> ConnError {
        match e {
            LinkError::PeerGone => ConnError::PeerGone { tcp_reset: false },
            LinkError::Io(_, w) => ConnError::LinkFailed(w.clone()),
            LinkError::Protocol(w) => ConnError::Protocol((*w).to_string()),
            LinkError::Closed => ConnError::Closed,
        }
    }

    /// Whether the bytes received before the end are still read (the end was the peer's or
    /// the link's, not a lie in what was received).
    fn drains(&self) -> bool {
        matches!(self, ConnError::PeerGone { .. } | ConnError::LinkFailed(_))
    }

    /// What a read returns once the bytes received before the end are read. A peer that went
    /// away having read everything we sent, over a TCP connection that was not reset, ended
    /// as a TCP peer that closes ends: EOF. Otherwise as one that closes with unread data (or
    /// dies under a reset): a reset.
    fn end_of_stream(&self, engine: &ConnEngine) -> io::Result<usize> {
        match self {
            ConnError::PeerGone { tcp_reset: false } if engine.tx_idle() => Ok(0),
            e => Err(e.to_io()),
        }
    }

    /// What a shutdown of a connection that ended with this returns: nothing to shut down on a
    /// connection the peer reset or left, `Ok` as tokio's shutdown of a reset TCP socket is
    /// (its `ENOTCONN` is taken for success); the error for one that failed otherwise.
    fn after_shutdown(&self) -> io::Result<()> {
        match self {
            ConnError::Reset | ConnError::PeerGone { .. } => Ok(()),
            e => Err(e.to_io()),
        }
    }

    fn to_io(&self) -> io::Error {
        match self {
            ConnError::Reset => io::Error::new(io::ErrorKind::ConnectionReset, "smc connection reset by peer"),
            ConnError::PeerGone { .. } => SmcError::PeerGone.into(),
            ConnError::LinkFailed(w) => SmcError::LinkFailed(w.clone()).into(),
            ConnError::Closed => {
                SmcError::LinkFailed("the link group was torn down (its runtime shut down)".into()).into()
            }
            ConnError::Protocol(w) => SmcError::Protocol(w.clone()).into(),
            ConnError::Tcp(kind, w) => io::Error::new(*kind, w.clone()),
            ConnError::RuntimeGone => io::Error::other(
                "the runtime that held this stream's tcp socket shut down (use a stream on a runtime that runs)",
            ),
        }
    }
}

/// The task that watches a connection's TCP socket ([`SmcConn::watch_tcp`]); dropping it stops
/// the task.
#[derive(Debug)]
pub(crate) struct Watcher(Option<tokio::task::JoinHandle<()>>);

impl Watcher {
    /// The task, to be stopped by its new owner.
    pub(crate) fn take(mut self) -> Option<tokio::task::JoinHandle<()>> {
        self.0.take()
    }

    /// Whether the task still watches (it has not ended, by an event or with its runtime).
    fn is_running(&self) -> bool {
        self.0.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// Watches the TCP connection under an SMC connection: nothing arrives on it while SMC runs, so
/// any readiness is its end, the peer's handback frame, or a protocol violation.
fn watch(tcp: Arc<TcpStream>, conn: Weak<SmcConn>) -> impl std::future::Future<Output = ()> {
    // Made before the future, so that it goes with it however the task ends (its runtime may
    // drop it, even before its first turn).
    let gone = WatcherGone { conn: conn.clone(), delivered: false };
    watch_until(tcp, conn, gone)
}

/// Tells the connection that its watcher ended ([`SmcConn::watcher_gone`]): a socket held for
/// the peer's close is not left without a watcher, and a stream whose watcher went without its
/// word (its runtime shut down) is not left waiting for that word.
struct WatcherGone {
    conn: Weak<SmcConn>,
    /// The watcher gave the connection its word ([`SmcConn::on_tcp_event`]).
    delivered: bool,
}

impl Drop for WatcherGone {
    fn drop(&mut self) {
        if let Some(c) = self.conn.upgrade() {
            c.watcher_gone(self.delivered);
        }
    }
}

async fn watch_until(tcp: Arc<TcpStream>, conn: Weak<SmcConn>, mut gone: WatcherGone) {
    let mut b = [0u8; 1];
    let res = tcp.peek(&mut b).await;
    // A peer announces its SMC close before it lets its TCP socket go. Over shared memory the
    // announcement is in our memory by the time the FIN arrives, and `on_tcp_event` drains the
    // link before it decides. Over RDMA it may still be on the wire (the SEND and the FIN take
    // different paths), so it gets a grace period to arrive; so does a reset, which a peer
    // sends when it went before its close was known delivered (`tcp_end`), as it may have been.
    if matches!(res, Ok(0) | Err(_)) {
        let until = tokio::time::Instant::now() + TCP_CLOSE_GRACE_RDMA;
        while tokio::time::Instant::now() < until {
            match conn.upgrade() {
                // A turn of the link's dispatch where no other task has it (`progress`), not
                // a wait for it (`drain`): connections whose TCP sockets end at once, while the
                // peer floods the link, each waited for the dispatch lock every 5 ms on every
                // runtime thread. `on_tcp_event` drains once, at the end.
                Some(c) if !c.closed_by_peer() && c.transport() == crate::transport::Transport::SmcR => {
                    let _ = c.group().progress();
                }
                _ => break,
            };
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    if let Some(c) = conn.upgrade() {
        c.on_tcp_event(res);
    }
    gone.delivered = true;
}

/// How long a TCP close may precede, over RDMA, the SMC close it follows. The close is a CDC
/// SEND posted before the peer closed TCP; on a live fabric it lands within microseconds, and
/// on the soft-RoCE guests (the slowest path we run, ~2 ms round trips) well within this. A
/// peer that died without a close is meanwhile still read to its last byte.
const TCP_CLOSE_GRACE_RDMA: std::time::Duration = std::time::Duration::from_millis(500);

/// Puts bytes into the peer's ring: `(link, our token, spans, n)` to the bytes it put.
type Fill<'a> = dyn FnMut(&Arc<dyn crate::link::Link>, u32, [(u32, u32); 2], u32) -> Result<u32, FillError> + 'a;

/// Why filling the ring failed.
enum FillError {
    Link(LinkError),
    Io(io::Error),
}

/// Bytes that arrived inline in a CDC message, and where they sit in our ring.
struct Inline {
    at: crate::proto::cursor::Cursor,
    len: usize,
    data: [u8; crate::proto::cdc::CDC_INLINE_MAX],
}

/// Received bytes a peek took ([`ConnState::peeked`]): a buffer, and how much of its front
/// has been consumed since (taken off without moving the rest).
#[derive(Default)]
struct Peeked {
    buf: Vec<u8>,
    head: usize,
}

impl Peeked {
    fn len(&self) -> usize {
        self.buf.len() - self.head
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.head..]
    }

    /// Consumes `n` of the bytes (all of them, if fewer); the buffer goes once they are.
    fn consume(&mut self, n: usize) {
        self.head += n.min(self.len());
        if self.head == self.buf.len() {
            *self = Peeked::default();
        }
    }

    /// Appends bytes peeked past the ones held; the consumed front makes room first where it is
    /// half the buffer or more (so a buffer moves each byte at most once more).
    fn extend(&mut self, bytes: &[u8]) {
        if self.head > 0 && self.head >= self.buf.len() / 2 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        self.buf.extend_from_slice(bytes);
    }
}

struct ConnState {
    engine: ConnEngine,
    /// Cork guards alive.
    corks: usize,
    /// Largest write sent inline in its CDC message (0: never).
    inline_max: usize,
    /// The last inline payload received, read from here instead of the peer's memory.
    inline: Option<Inline>,
    /// Received bytes that a peek (or a copying lend) showed and nothing consumed yet, from the
    /// consumer cursor on: later peeks and reads take them from here, not from the peer's
    /// memory again, so a read returns what a peek showed (as TCP's `MSG_PEEK` promises)
    /// whatever the peer wrote there since, or sent inline against its ring. At most what is
    /// available; given up when the reads move to TCP ([`SmcConn::release_reads`]).
    peeked: Peeked,
    /// The peer's token: its RMB slot we read from, and the token our CDC messages carry.
    /// `None` on the server until the client's Confirm arrives.
    peer_token: Option<u32>,
    /// Who waits to read ([`Waiters`]).
    rx_waiters: Waiters,
    /// A readiness poll (`poll_read_ready`) left its waker in `rx_waiters.task` and has not
    /// found the connection readable since: a read of the same task (a `poll_peek` beside a
    /// `poll_read_ready`) then does not hold the waker out while it drains ([`HeldWaker`]),
    /// since a wake it kept from that poll would be lost with the bytes it leaves for it.
    /// Cleared when the poll finds the connection readable; one left set by a poll that was
    /// dropped only costs the reads that follow their held waker. (A readiness future's waker
    /// is not in that slot, so no read can take its wake.)
    rx_ready_waits: bool,
    /// Who waits to write ([`Waiters`]).
    tx_waiters: Waiters,
    error: Option<ConnError>,
    /// Kept until our close is announced, so the peer never sees the TCP connection close
    /// before the SMC close; over shared memory, once released, until the peer's close too
    /// ([`SmcConn::let_tcp_go`]).
    tcp: Option<Arc<TcpStream>>,
    /// `tcp` is kept open for the peer's close, in the context's budget.
    tcp_hold: Option<crate::smc::manager::TcpHold>,
    /// The task that watches `tcp` while it is held: a peer's move or end of TCP meets our close
    /// as it did before ([`SmcConn::on_tcp_event`]). Stopped when the hold ends.
    held_watcher: Option<Watcher>,
    /// The application dropped its handle.
    released: bool,
    /// Released with the peer's answer still to come: since when the peer last showed it
    /// reads (our release, or the last CDC message of the peer's that said it consumed more of
    /// what we wrote). See [`SmcConn::end_if_silent`].
    lingering: Option<std::time::Instant>,
    /// What the peer had not read of ours when `lingering` last began ([`SmcConn::on_cdc`]).
    linger_unread: u32,
    /// The connection's end (its error, or the peer's abort) was reported to a read or a write
    /// ([`SmcConn::report_end`]): reads find the end of stream now, writes `BrokenPipe`.
    end_reported: bool,
    /// The watcher went without its word while the application held the stream (its runtime
    /// shut down): the stream fails at its next use ([`SmcConn::claim_watch_lost`]).
    watch_lost: bool,
    /// The link group failed: nothing can be sent, and the slot went with the group.
    link_down: bool,
    /// A CDC send met the RDMA link failed before its group did (`flush_cdc_inline`): a flush
    /// that finds its message still owed ends the group itself ([`SmcConn::delivery_failed`])
    /// instead of waiting for the driver to look.
    send_failed: Option<LinkError>,
    /// The TCP socket's keepalive settings from before `fail_link` turned keepalive on to
    /// probe a peer whose side of the link went away ([`probe_peer_host`]); put back once the
    /// connection moved.
    keepalive_before: Option<Keepalive>,
    /// The slot must never be reused when it is let go (after a move to TCP towards a peer that
    /// may hold its bytes lent): every path that lets it go reads this under the lock.
    retire_slot: bool,
    /// Readiness as tokio models it: a connection is taken to be readable (writable) until a
    /// read (write) finds nothing to do; then it waits for the peer. See `poll_ready`.
    rx_ready_hint: bool,
    tx_ready_hint: bool,
    /// Bytes were written since a read last returned some: a reply may be on its way, and a
    /// reader that finds nothing may spin for it (busy polling). A read that just returned
    /// bytes and finds nothing more (a reader draining until it would block) does not spin.
    awaiting_reply: bool,
    /// The engine knows how large the peer may grow our receive ring (its region's slot
    /// size, known once the link is up: set at the first CDC message, which only an
    /// established link delivers).
    rx_max_set: bool,
    /// Adaptive polling (see [`WaitClock`]).
    wait: WaitClock,
    /// Whether a lone connection's spin for its reply pays (see [`Backoff`]).
    solo: Backoff,
    /// Whether the byte stream is moving, or moved, to the TCP socket (a handback).
    handback: Handback,
    /// The application shut its write side while the handback ran: shut TCP's once it is over.
    shutdown_after_handback: bool,
    /// Bytes the last [`SmcConn::poll_lend`] handed out that `consume` may still take (0: none);
    /// a read or the application's release ends them, and a move to TCP voids them (`voided`).
    lent: u32,
    /// The application may hold a reference to ring bytes (from `poll_lend` until the next
    /// `consume`, read or release). Meanwhile nothing may tell the peer that its ring is free:
    /// an abort or its answer waits (`abort_owed`). A move to TCP need not wait: after one,
    /// neither side ever reuses the ring it wrote into (see `handback_over`).
    live: bool,
    /// An abort (ours, or the answer to the peer's) held back while bytes are lent, or while
    /// bytes the peer sent before its abort are unread ([`SmcConn::pay_abort`]).
    abort_owed: bool,
    /// CDC messages that came while a move ran, taken in if it fails (at most
    /// [`MOVING_CDC_MAX`]; older ones are folded into the engine, see
    /// [`SmcConn::fold_moving_cdc`]).
    moving_cdc: Vec<CdcMsg>,
    /// Why a message folded in while the move ran broke the protocol: the connection's error if
    /// the move fails.
    moving_cdc_fault: Option<String>,
}

/// CDC messages kept whole while a move runs: as many as a CDC ring holds
/// ([`MAX_CDC_SLOTS`](crate::link::shm::region::MAX_CDC_SLOTS)). A peer that writes small
/// pieces sends a message for each, and can send thousands before its ring fills.
const MOVING_CDC_MAX: usize = 1024;

/// Who reads: the handle that lends ring bytes (`fill_buf`) and so may end a lend, or another
/// handle of a stream whose owned read half lends (reached through a write half's `as_ref`),
/// which may neither take bytes that half may still hold nor end its hold on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reader {
    Lender,
    Other,
}

/// Where a connection's byte stream is (see [`crate::proto::handback`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handback {
    /// On the link.
    Smc,
    /// The exchange on the TCP socket runs: reads and writes wait for it.
    Moving(HandbackCause),
    /// On the TCP socket: the stream reads and writes it directly (the cause is in
    /// `SmcConn::on_tcp`, where the streams read it without the lock).
    Moved,
}

/// The error a connection's I/O returns once its stream moved to the TCP socket: the stream
/// repeats the call there ([`SmcConn::is_moved_error`]).
#[derive(Debug)]
struct MovedToTcp;

impl std::fmt::Display for MovedToTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the connection moved to its tcp socket")
    }
}

impl std::error::Error for MovedToTcp {}

fn moved() -> io::Error {
    io::Error::other(MovedToTcp)
}

/// How [`SmcConn::moved_to_tcp`] reads a cause back from `SmcConn::on_tcp` (0: not moved).
fn cause_code(c: HandbackCause) -> u8 {
    match c {
        HandbackCause::Requested => 1,
        HandbackCause::LinkFailed => 2,
        HandbackCause::Peer => 3,
    }
}

/// Adaptive polling, one connection's part: whether its reader polls when it finds nothing.
/// (A link group's driver keeps one too, for its own waits between batches of work.)
/// A poll is for one wait and lasts at most the budget from the wait's start; a reader polls
/// (its task stays runnable and looks again on the runtime's next turn, after the thread's
/// other tasks) instead of sleeping on the doorbell. Whether it polls follows what polling
/// achieved: a poll that saw its data arrive keeps the connection polling; one whose budget ran
/// out first (an idle connection, a slow peer) makes the next 1, 2, 4, ... 64 waits sleep at
/// once before it tries again. So request/response connections poll, and idle or slow ones cost
/// one budget of polling per 64 waits at most. (A first version averaged the waits' lengths;
/// a connection whose doorbell wake-ups alone exceeded the budget could never come back to
/// polling, and HTTP with one connection ran at 7 or 97 us per request depending on its start.)
#[derive(Debug, Default)]
pub(crate) struct WaitClock {
    /// Polling budget in nanoseconds (0: off).
    budget: u64,
    /// When the reader started waiting ([`clock_ns`](crate::smc::group::clock_ns)).
    since: Option<u64>,
    /// This wait polls (until the budget runs out).
    polling: bool,
    /// Whether polling pays: a failed poll makes the next 1, 2, 4, ... 64 waits sleep at once.
    tries: Backoff,
    /// Looks in this wait since the clock was last read.
    looks: u32,
}

/// What a reader's look decided ([`WaitClock::look`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Look {
    /// Until when to poll ([`clock_ns`](crate::smc::group::clock_ns)); `None`: sleep.
    pub(crate) until: Option<u64>,
    /// This look started the wait (the deadline is new).
    pub(crate) started: bool,
    /// The wait has polled for [`YIELD_AFTER_NS`]: give the CPU to any other thread that wants
    /// it before looking again.
    pub(crate) yield_cpu: bool,
}

/// A polling wait that has lasted this long offers its CPU to the system's other threads at
/// each reading of the clock (once per [`LOOKS_PER_CLOCK`] looks), as the kernel's busy
/// polling checks whether it should reschedule. Without it, where the runtimes had more threads
/// than the machine CPUs (`smcperf local --runtime multi`: two runtimes of two workers on two
/// CPUs), polling readers kept the threads with work off the CPUs: http at 64 connections ran
/// 10-18% slower with polling than without. A same-host round trip takes 1-2 us (p50-p99 on
/// the 2-vCPU VM), so request/response waits end long before this and never yield: an
/// unconditional yield every 8 looks halved one connection's round trips on `multi`.
const YIELD_AFTER_NS: u64 = 5_000;

/// While a wait polls, the clock is read at its start and then once every this many looks.
/// A look costs 0.1-0.3 us on the 2-vCPU VM (`smcperf local --scenario rr --size 14` under
/// `perf`), of which the clock took about a tenth when read at every look; the budget may be
/// overrun by this many looks, a few microseconds against the 50 us default.
const LOOKS_PER_CLOCK: u32 = 8;

/// Longest a reader spins inside its own poll, whatever the busy-poll budget: the spin holds
/// the thread, and the connections that share it (the peer itself, on a one-thread runtime)
/// cannot run meanwhile. A same-host 14-byte round trip takes 0.9-1.2 us at p50 and under 2 us
/// at p99 on the 2-vCPU VM (`smcperf local --scenario rr --size 14 --busy-poll 50`), so this
/// covers the replies busy polling is for; past it the wait goes on through the runtime
/// (adaptive polling, the driver's busy looks).
const MAX_READER_SPIN: std::time::Duration = std::time::Duration::from_micros(5);

/// How long a connection alone on its link group spins inside its poll for the reply it awaits,
/// at the first look of a wait, with adaptive polling on and busy polling off: a same-host
/// 14-byte round trip takes 0.7-0.8 us at p50 on the 2-vCPU VM, so most replies end the spin,
/// and one that does not costs the thread about a microsecond (the clock is read once per
/// [`SPIN_LOOKS_PER_CLOCK`] looks) before the wait goes on through the runtime, and makes the
/// next waits skip the spin ([`Backoff`]). `smcperf local --scenario
/// rr --size 14`: 1.13 M round trips/s without, 1.24-1.29 M with a spin of 0.5, 1 or 2 us. Not
/// where the group serves many connections: each reader that spun held the thread from the
/// others (`--scenario grpc`: 1.19-1.35x TCP with a 1 us spin for every reader awaiting a
/// reply, 1.44-1.59x without; `rr --size 1k --conns 200 --runtime multi`: 3.5x against 4.75x).
const SOLO_SPIN: std::time::Duration = std::time::Duration::from_micros(1);

/// Looks at the peer's ring between two readings of the clock in a reader's spin: each look
/// is one `pause` (tens of nanoseconds) and one load of a line that stays cached until the
/// peer publishes, so 16 keep the spin within a microsecond of its budget; reading the clock
/// on every look made it two fifths of the spin's samples (`perf` on `smcperf local --scenario
/// rr --size 14 --busy-poll 50`).
const SPIN_LOOKS_PER_CLOCK: u32 = 16;

/// Most waits a failed poll makes sleep before the next try: an idle connection polls one
/// budget in this many waits.
const MAX_POLL_BACKOFF: u32 = 64;

/// A reader's spin for its reply ([`SmcConn::spin_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spin {
    /// Busy polling, for this long.
    Busy(std::time::Duration),
    /// A lone connection's spin ([`SOLO_SPIN`]), whose outcome its [`Backoff`] learns.
    Solo,
}

/// Whether a try that may not pay, made at the start of a wait (a reader's poll, a lone
/// connection's spin), is worth making: one that missed makes the next 1, 2, 4, ...
/// [`MAX_POLL_BACKOFF`] waits skip it; one that paid makes the next wait try at once. So a
/// connection whose peer answers within the try keeps trying, and one whose peer is idle, slow
/// or on its own thread tries once per 64 waits. A spin's: a server whose clients (each a link
/// group of its own) ask now and then spins once per 64 of their requests.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    /// Waits left that do not try.
    skip: u32,
    /// How many waits the last miss made skip (doubles with each miss; 0 after a try that paid).
    backoff: u32,
}

impl Backoff {
    /// Whether this wait tries (consuming one skipped wait if not).
    pub(crate) fn try_now(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// Whether the next wait would try.
    pub(crate) fn ready(&self) -> bool {
        self.skip == 0
    }

    /// The try saw what it waited for.
    pub(crate) fn paid(&mut self) {
        self.backoff = 0;
    }

    /// The try ended without it.
    pub(crate) fn missed(&mut self) {
        self.backoff = (self.backoff * 2).clamp(1, MAX_POLL_BACKOFF);
        self.skip = self.backoff;
    }
}

impl WaitClock {
    /// Whether the reader's next look would start a wait that polls: adaptive polling is on,
    /// no wait is under way, and no failed poll still says to sleep.
    pub(crate) fn first_look_polls(&self) -> bool {
        self.budget > 0 && self.since.is_none() && self.tries.ready()
    }

    /// A clock with this polling budget (0: never polls).
    pub(crate) fn new(budget: std::time::Duration) -> WaitClock {
        WaitClock { budget: u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX), ..WaitClock::default() }
    }

    /// The reader waits (again) at `now` ([`clock_ns`](crate::smc::group::clock_ns)): returns
    /// until when to poll, if this wait polls and its budget is not spent.
    pub(crate) fn poll_until(&mut self, now: u64) -> Option<u64> {
        if self.budget == 0 {
            return None;
        }
        let since = match self.since {
            Some(since) => since,
            None => {
                // A new wait: poll, unless an earlier failed poll still says to sleep.
                self.since = Some(now);
                self.polling = self.tries.try_now();
                now
            }
        };
        if !self.polling {
            return None;
        }
        let until = since.saturating_add(self.budget);
        if now < until {
            return Some(until);
        }
        // The budget ran out before the data came: sleep now, and for the next waits.
        self.polling = false;
        self.tries.missed();
        None
    }

    /// The reader waits (again), reading the clock only when it must: at a wait's start, and
    /// then once per [`LOOKS_PER_CLOCK`] looks while it polls.
    pub(crate) fn look(&mut self, clock: impl FnOnce() -> u64) -> Look {
        let mut look = Look { until: None, started: false, yield_cpu: false };
        if self.budget == 0 {
            return look;
        }
        match self.since {
            Some(since) if self.polling => {
                self.looks += 1;
                if self.looks < LOOKS_PER_CLOCK {
                    look.until = Some(since.saturating_add(self.budget));
                    return look;
                }
                self.looks = 0;
                let now = clock();
                look.until = self.poll_until(now);
                look.yield_cpu = look.until.is_some() && now.saturating_sub(since) >= YIELD_AFTER_NS;
            }
            Some(_) => {}
            None => {
                self.looks = 0;
                look.until = self.poll_until(clock());
                look.started = true;
            }
        }
        look
    }

    /// Data arrived for a waiting reader: the wait ends. If it was polling, polling worked.
    pub(crate) fn end(&mut self) {
        if self.since.take().is_some() && self.polling {
            self.tries.paid();
        }
        self.polling = false;
    }
}

pub(crate) struct SmcConn {
    group: Arc<LinkGroup>,
    our_token: u32,
    /// The connection's span: what the crate logs about the connection after its handshake is
    /// logged in it, with the peer's address, the transport, the link group and the slot.
    span: tracing::Span,
    state: Mutex<ConnState>,
    me: Weak<SmcConn>,
    /// Notified when a handback ends (moved, or failed).
    handback_over: tokio::sync::Notify,
    /// What was left of `ConnState::lent` when a handback counted consumed bytes: the peer
    /// sends those bytes again on TCP, where a `consume` of them must skip them. Set under the
    /// state's lock when the move starts; taken by `consume`, cleared by the stream's first
    /// read on TCP (after which a `consume` of them is no longer the next thing on the
    /// stream). Relaxed: the reading handle's own operations are ordered among themselves,
    /// and the move's store is ordered before them by the lock and the `on_tcp` flag.
    voided: std::sync::atomic::AtomicU32,
    /// Bytes at the head of the TCP socket's stream that the application consumed before the
    /// stream moved there (a `consume` of `voided` bytes): the stream's reads on TCP take them
    /// off first. Relaxed, as `voided`: only the reading handle touches it.
    tcp_skip: std::sync::atomic::AtomicU64,
    /// Where the stream is, read without the lock on every operation of the stream: 0 on the
    /// link (or moving), else [`cause_code`] of the cause once a handback finished (it never
    /// changes again). Release on the store, Acquire on the load: a stream that sees it set
    /// sees the connection's final state.
    on_tcp: std::sync::atomic::AtomicU8,
    /// As `on_tcp`, for the reads alone: set once a move read the peer's frame
    /// ([`release_reads`](Self::release_reads)), when the bytes start coming over TCP.
    rx_on_tcp: std::sync::atomic::AtomicU8,
    /// The group forgot the connection ([`LinkGroup::forget_conn`] or its end): frames for its
    /// token are no longer delivered to it. Set under the group's lock, read without it by the
    /// dispatcher (relaxed: a frame that races the forgetting was delivered before too).
    forgotten: AtomicBool,
}

impl std::fmt::Debug for SmcConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcConn").field("group", &self.group.id).field("token", &self.our_token).finish()
    }
}

fn wake(w: &mut Option<Waker>) {
    if let Some(w) = w.take() {
        w.wake();
    }
}

/// Keeps `waker` in `slot`, cloning it only when the slot holds another task's (or none).
pub(crate) fn register(slot: &mut Option<Waker>, waker: &Waker) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
        *slot = Some(waker.clone());
    }
}

/// Most wakers of readiness futures kept per direction. A future dropped before its wake
/// leaves its waker behind (tokio takes a dropped future's entry out; ours are plain wakers),
/// so a list that reaches this wakes everyone in it and starts over: readiness may be
/// spurious, and the futures still pending register again. From the count of tasks a server
/// might have waiting on one stream at once, not from a measurement.
const MAX_FUTURE_WAKERS: usize = 32;

/// Adds `waker` to `list` unless the list holds one that wakes the same task; a full list
/// ([`MAX_FUTURE_WAKERS`]) is woken and emptied first.
fn register_future(list: &mut Vec<Waker>, waker: &Waker) {
    if list.iter().any(|w| w.will_wake(waker)) {
        return;
    }
    if list.len() >= MAX_FUTURE_WAKERS {
        for w in list.drain(..) {
            w.wake();
        }
    }
    list.push(waker.clone());
}

/// Who waits for one direction of a connection: the task of the last `poll_*` call (one, as
/// tokio keeps for those: reads and writes, `poll_read_ready`, `poll_write_ready`), and every
/// pending readiness future (`ready()`, `readable()`, `writable()`) of any number of tasks,
/// all of which tokio wakes. A future dropped before its wake leaves its waker until then.
#[derive(Default)]
struct Waiters {
    task: Option<Waker>,
    futures: Vec<Waker>,
}

impl Waiters {
    /// Keeps `cx`'s waker: in the slot of the `poll_*` calls, or, for a readiness future
    /// (`future`), beside those of the others.
    fn register(&mut self, cx: &Context<'_>, future: bool) {
        if future {
            register_future(&mut self.futures, cx.waker());
        } else {
            register(&mut self.task, cx.waker());
        }
    }

    /// Wakes everyone who waits.
    fn wake(&mut self) {
        wake(&mut self.task);
        wake_all(&mut self.futures);
    }
}

/// Wakes every readiness future in `futures`.
fn wake_all(futures: &mut Vec<Waker>) {
    // Most wakes find no readiness future waiting: no drain to set up and tear down.
    if !futures.is_empty() {
        for w in futures.drain(..) {
            w.wake();
        }
    }
}

/// A reading task's own waker, held out of `rx_waiters.task` while a read drains the link itself
/// (between the two attempts of [`SmcConn::poll_received`]): bytes for its connection that the
/// drain delivers would otherwise wake the very task that is running, which the runtime then
/// polls once more for nothing after it returns. A wake that finds the slot empty is lost, so
/// only that slot is held, and only by a read: every wake of it announces something the read's
/// second attempt looks at under the lock (bytes, the end, an error, a move to TCP starting or
/// ending), and that attempt puts the waker back before it waits. Not while a readiness poll of
/// the same task waits on it too (`rx_ready_waits`): the read would take the wake that poll
/// needs. Never `tx_waiters.task`, which also waits for CDC space (a flush) that a write does not look
/// at again.
#[derive(Default)]
struct HeldWaker(Option<Waker>);

impl HeldWaker {
    /// Takes `slot`'s waker when it wakes the task of `cx`.
    fn hold(&mut self, slot: &mut Option<Waker>, cx: Option<&Context<'_>>) {
        if let Some(cx) = cx {
            self.0 = slot.take_if(|w| w.will_wake(cx.waker()));
        }
    }

    /// Puts the waker back, unless the slot holds another one by now.
    fn restore(&mut self, slot: &mut Option<Waker>) {
        if slot.is_none() {
            *slot = self.0.take();
        }
    }
}

impl SmcConn {
    /// A connection on `group` that writes into the peer's RMBs of `tx_ring` bytes (through our
    /// slot `our_token`) and reads from ours of `rx_ring` bytes.
    pub(crate) fn new(
        group: Arc<LinkGroup>,
        our_token: u32,
        peer_token: Option<u32>,
        tx_ring: RingSize,
        rx_ring: RingSize,
        cfg: &crate::config::ShmConfig,
    ) -> Arc<SmcConn> {
        let mut engine = ConnEngine::new(peer_token.unwrap_or(0), tx_ring, rx_ring);
        engine.set_autocork(cfg.autocork);
        if let Some(max) = RingSize::new(group.tx_rmb_capacity) {
            engine.set_tx_max(max);
        }
        let span = tracing::debug_span!(
            "smc_conn",
            group = group.id,
            slot = crate::link::token_slot(our_token),
            peer = tracing::field::Empty,
            transport = tracing::field::Empty,
        );
        // tokio takes an accepted socket to be readable until a read finds nothing, and a
        // connected one to be writable only: the same here.
        let accepted = group.role == crate::smc::group::Role::Server;
        Arc::new_cyclic(|me| SmcConn {
            group,
            our_token,
            span,
            state: Mutex::new(ConnState {
                engine,
                corks: 0,
                inline_max: cfg.inline_max,
                inline: None,
                peeked: Peeked::default(),
                peer_token,
                rx_waiters: Waiters::default(),
                rx_ready_waits: false,
                tx_waiters: Waiters::default(),
                error: None,
                tcp: None,
                tcp_hold: None,
                held_watcher: None,
                released: false,
                lingering: None,
                linger_unread: 0,
                end_reported: false,
                watch_lost: false,
                link_down: false,
                send_failed: None,
                keepalive_before: None,
                retire_slot: false,
                rx_ready_hint: accepted,
                tx_ready_hint: true,
                awaiting_reply: false,
                rx_max_set: false,
                wait: WaitClock::new(cfg.adaptive_poll),
                solo: Backoff::default(),
                handback: Handback::Smc,
                shutdown_after_handback: false,
                lent: 0,
                live: false,
                abort_owed: false,
                moving_cdc: Vec::new(),
                moving_cdc_fault: None,
            }),
            me: me.clone(),
            handback_over: tokio::sync::Notify::new(),
            voided: std::sync::atomic::AtomicU32::new(0),
            tcp_skip: std::sync::atomic::AtomicU64::new(0),
            on_tcp: std::sync::atomic::AtomicU8::new(0),
            rx_on_tcp: std::sync::atomic::AtomicU8::new(0),
            forgotten: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, ConnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn our_token(&self) -> u32 {
        self.our_token
    }

    /// Lets the ring we write into start over at its beginning once the peer consumed
    /// everything and we are `at` bytes in ([`ConnEngine::set_tx_restart`]): for peers that
    /// speak `RMB_RESIZE`, set before the connection carries bytes.
    pub(crate) fn restart_tx_at(&self, at: u32) {
        self.lock().engine.set_tx_restart(Some(at));
    }

    /// The connection's span (see the field).
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Names the connection in its span, once it is handed to the application.
    pub(crate) fn describe(&self, peer: Option<std::net::SocketAddr>, transport: crate::transport::Transport) {
        if let Some(p) = peer {
            self.span.record("peer", tracing::field::display(p));
        }
        self.span.record("transport", tracing::field::display(transport));
    }

    /// The group forgets the connection (under its lock): no frame is delivered to it after.
    pub(crate) fn forget(&self) {
        self.forgotten.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the group forgot the connection.
    pub(crate) fn forgotten(&self) -> bool {
        self.forgotten.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn group(&self) -> &Arc<LinkGroup> {
        &self.group
    }

    /// SMC-R on a verbs link, SMC-D on shared memory.
    pub(crate) fn transport(&self) -> crate::transport::Transport {
        if self.group.link().is_some_and(|l| l.is_rdma()) {
            crate::transport::Transport::SmcR
        } else {
            crate::transport::Transport::SmcD
        }
    }

    /// Server side: the client's Confirm named its token.
    pub(crate) fn confirm(&self, peer_token: u32) {
        let mut st = self.lock();
        st.peer_token = Some(peer_token);
        // Nothing can have been sent yet (there was no peer token), so only the token changes;
        // what was received meanwhile is kept.
        st.engine.set_token(peer_token);
        self.flush_cdc(&mut st);
    }

    /// Holds the connection's TCP socket (kept until our close is announced, or the stream moved
    /// to it) and starts watching it: its end, or the peer's handback frame, is answered from
    /// now on, whether or not the application has the stream yet.
    pub(crate) fn watch_tcp(self: &Arc<Self>, tcp: Arc<TcpStream>) -> Watcher {
        self.lock().tcp = Some(tcp.clone());
        // The stream is this runtime's from now on, as its socket is: so is a wait on its link.
        self.group.drive_here();
        let task = tokio::spawn(tracing::Instrument::instrument(watch(tcp, Arc::downgrade(self)), self.span.clone()));
        Watcher(Some(task))
    }

    // ----- application side ------------------------------------------------------------------

    pub(crate) fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.poll_copied(Some(cx), buf, Take::Consume, Reader::Lender).map_ok(drop)
    }

    /// Copies up to `buf.remaining()` received bytes into `buf` without consuming them: the
    /// next read returns them again. Resolves to the number of bytes copied (0 at EOF).
    pub(crate) fn poll_peek(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        reader: Reader,
    ) -> Poll<io::Result<usize>> {
        self.poll_copied(Some(cx), buf, Take::Peek, reader)
    }

    /// A vectored read that does not wait: the bytes there fill `bufs` in order under one look
    /// (`WouldBlock` when nothing has arrived and no end either), so that an end that follows
    /// them is left for the next read instead of being met in a later buffer and reported
    /// (once) to a read that returns bytes. With only empty buffers: `Ok(0)` once readable.
    pub(crate) fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>], reader: Reader) -> io::Result<usize> {
        let r = self.poll_received(None, true, reader, 0, |st, avail| {
            let (mut left, mut total, reported) = (avail, 0usize, st.end_reported);
            for b in bufs.iter_mut() {
                let n = left.min(u32::try_from(b.len()).unwrap_or(u32::MAX));
                if n == 0 {
                    if left == 0 {
                        break;
                    }
                    continue;
                }
                match self.copy_out(st, &mut ReadBuf::new(&mut b[..]), n, Take::Consume) {
                    Ok(()) => (left, total) = (left - n, total + n as usize),
                    // The bytes of the buffers before are consumed: they are returned, and the
                    // error is the next read's.
                    Err(_) if total > 0 => {
                        st.end_reported = reported;
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(total)
        });
        match r {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// A read that does not wait: `WouldBlock` when nothing has arrived (and no end either).
    pub(crate) fn try_read(&self, buf: &mut ReadBuf<'_>, reader: Reader) -> io::Result<usize> {
        self.try_copied(buf, Take::Consume, reader)
    }

    /// A peek that does not wait, as [`try_read`](Self::try_read).
    pub(crate) fn try_peek(&self, buf: &mut ReadBuf<'_>, reader: Reader) -> io::Result<usize> {
        self.try_copied(buf, Take::Peek, reader)
    }

    fn try_copied(&self, buf: &mut ReadBuf<'_>, take: Take, reader: Reader) -> io::Result<usize> {
        match self.poll_copied(None, buf, take, reader) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Waits until bytes (or the end, or an error) are there, then copies them into `buf`,
    /// consuming them or not; resolves to how many were copied. Without a context (`try_read`)
    /// it does not wait: where it would, it answers `WouldBlock` and stores no waker.
    fn poll_copied(
        &self,
        cx: Option<&mut Context<'_>>,
        buf: &mut ReadBuf<'_>,
        take: Take,
        reader: Reader,
    ) -> Poll<io::Result<usize>> {
        let consuming = take == Take::Consume;
        // A `poll_read`, not a `try_read`: tokio clears readiness after a short `poll_read`
        // only (a `try_*` call clears it when it would block).
        let polled = cx.is_some();
        if buf.remaining() == 0 {
            // As tokio's read into no room: it waits until the stream is readable (bytes, the
            // end or an error), then reads nothing; `try_read` says `WouldBlock` before that.
            return self.poll_received(cx, consuming, reader, 0, |_, _| Ok(0));
        }
        self.poll_received(cx, consuming, reader, 0, |st, avail| {
            let room = u32::try_from(buf.remaining()).unwrap_or(u32::MAX);
            let n = avail.min(room);
            if consuming && polled && n < room {
                // Everything there was read: no longer readable until more comes, as tokio
                // clears a socket's readiness after a `poll_read` shorter than its buffer.
                st.rx_ready_hint = false;
            }
            if !consuming && n < room && st.engine.ask_for_data() {
                // A peek that wants more than is there consumes nothing, and an autocorking
                // writer holds its next bytes until we do: a reader that peeks until a whole
                // message is there would wait for good. Ask for them.
                self.flush_cdc(st);
            }
            self.copy_out(st, buf, n, take).map(|()| n as usize)
        })
    }

    /// Waits until received bytes are there, then lends the application the first contiguous
    /// run of them ([`Lent::Ring`]) where `may_lend` and the link allow it, else copies up to
    /// [`SCRATCH_LEN`] of them into `scratch` ([`Lent::Copied`]); nothing is consumed until
    /// [`consume`](Self::consume). `Copied(0)` at the end of the stream. Whatever an earlier
    /// call lent is given back first.
    ///
    /// The caller must hold the only way to read the connection for as long as the application
    /// holds ring bytes: every read gives them back.
    pub(crate) fn poll_lend(
        &self,
        cx: &mut Context<'_>,
        scratch: &mut Vec<u8>,
        may_lend: bool,
    ) -> Poll<io::Result<Lent>> {
        self.poll_received(Some(cx), true, Reader::Lender, Lent::Copied(0), |st, avail| {
            let (Some(link), Some(peer_token)) = (self.group.link(), st.peer_token) else {
                return Err(io::Error::other("smc connection read before it was established"));
            };
            let Some(spans) = st.engine.rx_spans(avail) else {
                return Err(io::Error::other("rx span"));
            };
            // The first span is the run up to the ring's end (or all of it); never empty here.
            let (off, len) = spans.into_iter().find(|s| s.1 > 0).unwrap_or((0, 0));
            // Not once the connection ended: an abort may have gone out (the peer then reuses
            // the ring once it answers), though what is left is still read, by copying.
            // Nor while a peek's copy holds the first bytes: those are lent from the copy.
            let lendable = may_lend && st.error.is_none() && !st.engine.close_sent() && st.peeked.is_empty();
            let lend =
                if lendable { link.rx_lend(link.rx_token(self.our_token, peer_token), off, len) } else { Ok(None) };
            match lend {
                Ok(Some(ptr)) => {
                    st.lent = len;
                    st.live = true;
                    Ok(Lent::Ring { ptr, len: len as usize })
                }
                Ok(None) => {
                    if scratch.len() < SCRATCH_LEN {
                        scratch.resize(SCRATCH_LEN, 0);
                    }
                    let mut rb = ReadBuf::new(scratch);
                    let n = avail.min(SCRATCH_LEN as u32);
                    self.copy_out(st, &mut rb, n, Take::Peek)?;
                    st.lent = n;
                    Ok(Lent::Copied(n as usize))
                }
                Err(e) => Err(self.fail_reported(st, ConnError::from_link(&e))),
            }
        })
    }

    /// The application is done with `amt` of the bytes the last [`poll_lend`](Self::poll_lend)
    /// handed out (more are taken as all that is left of them): they are consumed, and, as the
    /// application holds no reference to them any more, whatever waited for that goes on.
    /// Those a move counted as not consumed (the peer sent them again on TCP) are skipped there
    /// ([`tcp_skip`](Self::tcp_skip)). Returns how many were consumed here; fewer than `amt`
    /// where a read came between.
    pub(crate) fn consume(&self, amt: usize) -> usize {
        let mut st = self.lock();
        let amt = u32::try_from(amt).unwrap_or(u32::MAX);
        let n = amt.min(st.lent);
        let voided = self.voided.load(std::sync::atomic::Ordering::Relaxed);
        let skip = (amt - n).min(voided);
        self.voided.store(voided - skip, std::sync::atomic::Ordering::Relaxed);
        if skip > 0 {
            self.tcp_skip.fetch_add(u64::from(skip), std::sync::atomic::Ordering::Relaxed);
        }
        if n > 0 && st.engine.rx_consume(n).is_ok() {
            // An inline copy is only a shortcut for a read at its position: the bytes are in
            // the ring too (lending links are shm, copying ones peek at the ring), and the
            // position is behind us now.
            st.inline = None;
            st.peeked.consume(n as usize);
            st.lent -= n;
            if st.engine.rx_available() == 0 {
                // Everything there was read, as a short read tells tokio.
                st.rx_ready_hint = false;
            }
            self.flush_cdc(&mut st);
        }
        self.end_live(&mut st);
        self.pay_abort(&mut st);
        self.maybe_finish(st);
        n as usize
    }

    /// Claims up to `max` of the bytes the stream must take off the TCP socket before its next
    /// read there (0: none); a caller that takes fewer gives the rest back with
    /// [`unclaim_tcp_skip`](Self::unclaim_tcp_skip). Two readers of one stream claim apart, so
    /// no byte is skipped twice.
    pub(crate) fn claim_tcp_skip(&self, max: u64) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let mut left = self.tcp_skip.load(Relaxed);
        loop {
            let n = left.min(max);
            if n == 0 {
                return 0;
            }
            match self.tcp_skip.compare_exchange_weak(left, left - n, Relaxed, Relaxed) {
                Ok(_) => return n,
                Err(now) => left = now,
            }
        }
    }

    /// Gives back `n` claimed bytes that were not taken off.
    pub(crate) fn unclaim_tcp_skip(&self, n: u64) {
        self.tcp_skip.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether bytes are still to skip.
    pub(crate) fn has_tcp_skip(&self) -> bool {
        self.tcp_skip.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Drops every byte still to skip (the stream ended within them).
    pub(crate) fn clear_tcp_skip(&self) {
        self.tcp_skip.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// The stream read on TCP after its move: bytes handed out before the move are read again
    /// now, and a `consume` no longer refers to them.
    pub(crate) fn forget_voided(&self) {
        if self.voided.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            self.voided.store(0, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Ends whatever was lent, from a handle that can prove the application holds none of it
    /// any more (see [`SmcStream::hand_back`](crate::SmcStream::hand_back), and the drop of an
    /// owned read half).
    pub(crate) fn give_back(&self) {
        let mut st = self.lock();
        self.end_lend(&mut st);
        self.maybe_finish(st);
    }

    /// A read through the lending handle: the application holds no lent bytes any more, and a
    /// consuming read also ends what `consume` could still take (a peek leaves it: the bytes
    /// are still at the head of the stream).
    fn end_read(&self, st: &mut ConnState, consuming: bool) {
        if consuming {
            self.end_lend(st);
        } else {
            self.end_live(st);
        }
    }

    /// Ends whatever was lent (the application reads again, or let go of the stream).
    fn end_lend(&self, st: &mut ConnState) {
        st.lent = 0;
        self.end_live(st);
    }

    /// The application holds no reference to ring bytes any more: a held-back abort goes out.
    fn end_live(&self, st: &mut ConnState) {
        if !std::mem::take(&mut st.live) {
            return;
        }
        self.pay_abort(st);
    }

    /// Sends the abort held back (`abort_owed`) once nothing holds it back any more: no bytes
    /// lent, and, after the peer's abort, none of its bytes left unread (the answer lets the
    /// peer reuse the ring they are in).
    fn pay_abort(&self, st: &mut ConnState) {
        let unread = st.engine.peer_aborted() && st.engine.rx_available() > 0;
        if st.abort_owed && !st.live && !unread {
            st.abort_owed = false;
            st.engine.abort();
            self.flush_cdc(st);
        }
    }

    /// Aborts the connection (ours, or the answer to the peer's), or, while the application may
    /// hold ring bytes (which the abort would let the peer overwrite), owes it until it lets go.
    fn abort_or_owe(&self, st: &mut ConnState) {
        if st.live {
            st.abort_owed = true;
        } else {
            st.engine.abort();
        }
    }

    /// The waiting part of every read: until bytes (or the end, or an error) are there; then
    /// `take` gets the bytes available (more than 0) and says what the read returns, `eof` at
    /// the end of the stream. Whatever was lent is given back first ([`end_read`](Self::end_read)).
    fn poll_received<R: Copy>(
        &self,
        mut cx: Option<&mut Context<'_>>,
        consuming: bool,
        reader: Reader,
        eof: R,
        mut take: impl FnMut(&mut ConnState, u32) -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        let mut solo_spun = false;
        let mut held = HeldWaker::default();
        // A frame of ours was next on the link after the first attempt, which left it to the
        // second.
        let mut pending = false;
        for attempt in 0..2 {
            let mut st = self.lock();
            self.claim_watch_lost(&mut st);
            // The next frame on the link, if ours, comes straight to us. Anything else (another
            // connection's frame first, frames behind ours) goes the usual way before this poll
            // goes on, as if `progress` had run before the lock: not under the connection's
            // lock, since the dispatch takes the locks of the connections it delivers to.
            if pending {
                let taken = self.take_own_frame(&mut st);
                if !matches!(taken, Ok(true)) || self.group.link().is_some_and(|l| l.has_pending()) {
                    drop(st);
                    match taken {
                        Err(e) => self.group.fail(e),
                        Ok(_) => drop(self.group.progress()),
                    }
                    st = self.lock();
                    self.claim_watch_lost(&mut st);
                }
            }
            if reader == Reader::Other {
                // Another handle of a stream whose read half lends (a write half's `as_ref`):
                // it must not take, nor end the hold on, bytes that half may still hold.
                // Bytes lent, or copied out for that half: its `consume` takes them.
                if consuming && (st.live || st.lent > 0) {
                    return Poll::Ready(Err(io::ErrorKind::WouldBlock.into()));
                }
            } else if attempt == 0 {
                self.end_read(&mut st, consuming);
            }
            if attempt > 0 {
                held.restore(&mut st.rx_waiters.task);
            }
            // A peer's abort ends the stream after the bytes it announced before, as a TCP
            // reset leaves the receive queue readable.
            if let Some(e) = st.error.as_ref().filter(|e| !e.drains() && !matches!(e, ConnError::Reset)) {
                let e = e.to_io();
                return Poll::Ready(Self::report_end(&mut st, e).map_or(Ok(eof), Err));
            }
            if let Some(p) = self.gate(&mut st, cx.as_deref_mut(), true) {
                return p;
            }
            let avail = st.engine.rx_available();
            if avail > 0 {
                if consuming {
                    st.awaiting_reply = false;
                }
                if solo_spun {
                    st.solo.paid();
                }
                return Poll::Ready(take(&mut st, avail));
            }
            if st.engine.peer_aborted() {
                // Every byte of its ring was read: the answer to its abort, held back until
                // now, lets the peer reuse the ring.
                self.pay_abort(&mut st);
                return Poll::Ready(Self::report_end(&mut st, ConnError::Reset.to_io()).map_or(Ok(eof), Err));
            }
            if st.engine.rx_eof() {
                return Poll::Ready(Ok(eof));
            }
            if let Some(e) = &st.error {
                // The peer or the link ended the connection, and every byte received before
                // has been read.
                return Poll::Ready(match e.end_of_stream(&st.engine) {
                    Ok(_) => Ok(eof),
                    Err(e) => Self::report_end(&mut st, e).map_or(Ok(eof), Err),
                });
            }
            if attempt == 0 {
                // Fast path: drain the link ourselves rather than wait for the driver's turn,
                // spinning first while a reply is awaited (`spin_kind`).
                // Not when frames wait already (the reply, most often, which came while this
                // reader's task was on its way): the spin would end at its first look, after
                // taking the group's spin slot and counting itself.
                let spin = if st.awaiting_reply && self.group.link().is_some_and(|l| !l.has_pending()) {
                    self.spin_kind(&mut st)
                } else {
                    None
                };
                if !st.rx_ready_waits {
                    held.hold(&mut st.rx_waiters.task, cx.as_deref());
                }
                drop(st);
                match spin {
                    Some(Spin::Busy(budget)) => self.spin_for_frames(budget),
                    Some(Spin::Solo) => {
                        self.spin_for_frames(SOLO_SPIN);
                        solo_spun = true;
                    }
                    None => {}
                }
                // A frame of ours next on the link (a small message on an idle connection, most
                // often) is taken under our lock at the next attempt; anything else is
                // dispatched now.
                pending = self.group.next_frame_is(self.our_token);
                if !pending {
                    self.group.progress();
                }
                continue;
            }
            if solo_spun {
                // The reply did not come within the spin (bytes would have returned above).
                st.solo.missed();
            }
            st.rx_ready_hint = false;
            match cx.as_mut() {
                Some(cx) => {
                    if self.wait_readable(&mut st, cx, false) {
                        // Not under the connection's lock: another thread may want it.
                        drop(st);
                        std::thread::yield_now();
                    }
                }
                None => return Poll::Ready(Err(io::ErrorKind::WouldBlock.into())),
            }
        }
        Poll::Pending
    }

    /// Readiness for `interest`, as tokio's `TcpStream::poll_read_ready`/`poll_write_ready`
    /// report it: readable while bytes, the end or an error wait to be read (or until a read
    /// found nothing since the last time it was readable), writable while the peer's ring has
    /// room or a write would fail at once (or until a write found no room); `READ_CLOSED` and
    /// `WRITE_CLOSED` once that direction has ended. Pending registers the task's waker for
    /// the directions asked (one waker per direction, as tokio keeps for `poll_*`).
    pub(crate) fn poll_ready(&self, cx: &mut Context<'_>, interest: tokio::io::Interest) -> Poll<tokio::io::Ready> {
        self.poll_ready_as(cx, interest, false)
    }

    /// As [`poll_ready`](Self::poll_ready), for a readiness future (`ready()`, `readable()`,
    /// `writable()`): its waker is kept beside those of every other pending one, and all are
    /// woken, as tokio does for its futures.
    pub(crate) fn poll_ready_future(
        &self,
        cx: &mut Context<'_>,
        interest: tokio::io::Interest,
    ) -> Poll<tokio::io::Ready> {
        self.poll_ready_as(cx, interest, true)
    }

    fn poll_ready_as(
        &self,
        cx: &mut Context<'_>,
        interest: tokio::io::Interest,
        future: bool,
    ) -> Poll<tokio::io::Ready> {
        use tokio::io::Ready;
        // An error or a close is told to the readers' waiters: a wait for either (`ERROR`, and
        // `PRIORITY`, which also resolves at the read side's close, as tokio's does) waits there.
        let rx_side = interest.is_readable() || interest.is_error() || interest.is_priority();
        let mut yield_cpu = false;
        for attempt in 0..2 {
            let mut st = self.lock();
            self.claim_watch_lost(&mut st);
            match st.handback {
                Handback::Smc => {}
                Handback::Moving(_) if st.error.is_none() => {
                    // Only the directions asked: a reader and a writer may wait at once, each in
                    // its own task, and the end of the move wakes both. Once the peer's frame
                    // is in, reads are the socket's: so is their readiness.
                    if let (true, true, Some(tcp)) = (interest.is_readable(), self.reads_released(), st.tcp.clone()) {
                        if tcp.poll_read_ready(cx).is_ready() {
                            // The read that follows finds out what is there. Readiness futures
                            // that lost the socket's one waker to a later poll hear it from
                            // here.
                            st.rx_ready_waits = false;
                            wake_all(&mut st.rx_waiters.futures);
                            return Poll::Ready(Ready::READABLE);
                        }
                        if future {
                            // The socket keeps the waker of the last poll only (tokio's
                            // `poll_read_ready`): every other pending future is woken by the
                            // one that finds the socket readable, or at the end of the move.
                            st.rx_waiters.register(cx, true);
                        }
                    } else if rx_side {
                        st.rx_waiters.register(cx, future);
                        st.rx_ready_waits |= !future;
                    }
                    if interest.is_writable() {
                        st.tx_waiters.register(cx, future);
                    }
                    return Poll::Pending;
                }
                // Over (or failed): the caller's next operation finds out what happened.
                _ => {
                    st.rx_ready_waits = false;
                    let mut r = Ready::EMPTY;
                    for (asked, ready) in [
                        (interest.is_readable(), Ready::READABLE),
                        (interest.is_writable(), Ready::WRITABLE),
                        (interest.is_error(), Ready::ERROR),
                        (interest.is_priority(), Ready::PRIORITY),
                    ] {
                        if asked {
                            r |= ready;
                        }
                    }
                    return Poll::Ready(r);
                }
            }
            let mut r = Ready::EMPTY;
            if interest.is_error() && (st.error.is_some() || st.engine.peer_aborted()) {
                r |= Ready::ERROR;
            }
            if interest.is_priority() && (st.engine.rx_eof() || st.engine.peer_aborted() || st.error.is_some()) {
                // No urgent data over SMC: only the read side's close, as tokio reports it.
                r |= Ready::READ_CLOSED;
            }
            if interest.is_readable() {
                let closed = st.engine.rx_eof() || st.engine.peer_aborted() || st.error.is_some();
                if closed {
                    r |= Ready::READABLE | Ready::READ_CLOSED;
                } else if st.rx_ready_hint || st.engine.rx_available() > 0 {
                    r |= Ready::READABLE;
                }
            }
            if interest.is_writable() {
                let closed = st.error.is_some() || st.engine.peer_aborted() || st.engine.peer_closed();
                if closed {
                    r |= Ready::WRITABLE | Ready::WRITE_CLOSED;
                } else if st.engine.is_write_shutdown() || st.tx_ready_hint || st.engine.tx_free() > 0 {
                    // After our own shutdown a write fails at once: writable, as tokio's
                    // socket is (its write side shows closed only at a hang-up or a reset).
                    r |= Ready::WRITABLE;
                }
            }
            if !r.is_empty() {
                if r.is_readable() {
                    st.rx_ready_hint = true;
                    st.rx_ready_waits = false;
                }
                if r.is_writable() {
                    st.tx_ready_hint = true;
                }
                return Poll::Ready(r);
            }
            if interest.is_writable() {
                // The peer sends a consumer update when it frees room only if it knows we wait.
                st.engine.set_write_blocked();
                self.flush_cdc(&mut st);
            }
            if attempt == 0 {
                drop(st);
                self.group.progress();
                continue;
            }
            if rx_side {
                // A read of the same task holds `rx_waiters.task` while it drains; a future's waker
                // is not in that slot, so no read can take its wake-up.
                st.rx_ready_waits |= !future;
                if self.wait_readable(&mut st, cx, future) {
                    yield_cpu = true;
                }
            }
            if interest.is_writable() {
                st.tx_waiters.register(cx, future);
            }
        }
        if yield_cpu {
            std::thread::yield_now();
        }
        Poll::Pending
    }

    /// The reader found nothing: keeps `cx`'s waker, then either polls (adaptive polling: the
    /// task looks again on the runtime's next turn, where attempt 0 drains the link, and the
    /// driver leaves the doorbell disarmed meanwhile) or sleeps. Returns whether the caller
    /// should offer its CPU to other threads ([`Look::yield_cpu`]) once it let go of `st`.
    /// `future`: the waker is a readiness future's ([`Waiters::register`]).
    fn wait_readable(&self, st: &mut ConnState, cx: &Context<'_>, future: bool) -> bool {
        st.rx_waiters.register(cx, future);
        let was = st.wait.polling;
        let look = st.wait.look(crate::smc::group::clock_ns);
        self.poll_changed(was, st.wait.polling);
        match look.until {
            Some(until) => {
                if look.started {
                    // The deadline is fixed for the whole wait: tell the group once.
                    self.group.poll_until(until);
                }
                cx.waker().wake_by_ref();
                look.yield_cpu
            }
            None => {
                self.group.sleeping();
                false
            }
        }
    }

    /// Whether a reader that awaits a reply spins for it inside its poll: for the busy-poll
    /// budget (at most [`MAX_READER_SPIN`]) where it is set, else for [`SOLO_SPIN`] if the
    /// connection is alone on its link group and polls adaptively, at the first look of a wait
    /// only (the looks that follow go through the runtime), while its wait clock polls and its
    /// spins pay ([`Backoff`]); `None`: it does not spin.
    fn spin_kind(&self, st: &mut ConnState) -> Option<Spin> {
        let busy = self.group.link()?.busy_poll().min(MAX_READER_SPIN);
        if !busy.is_zero() {
            Some(Spin::Busy(busy))
        } else if st.wait.first_look_polls() && self.group.alone() && st.solo.try_now() {
            Some(Spin::Solo)
        } else {
            None
        }
    }

    fn spin_for_frames(&self, budget: std::time::Duration) {
        let Some(link) = self.group.link() else {
            return;
        };
        // One spinner per group: the others wait as without busy polling.
        let Some(_slot) = self.group.spin_slot() else {
            return;
        };
        self.group.manager().counters.reader_spin();
        let seen = self.group.frames_seen();
        // The clock is read once per `SPIN_LOOKS_PER_CLOCK` looks: read on every one, it made most
        // of each look's time, and a frame that arrived waited for it. The first read comes
        // after the first round of looks: a frame there already (a reply that came while the
        // request's writer still returned) pays for no clock. Frames that another thread took
        // meanwhile (maybe ours) end the spin too.
        let mut until = None;
        loop {
            for _ in 0..SPIN_LOOKS_PER_CLOCK {
                if link.has_pending() || self.group.frames_seen() != seen {
                    return;
                }
                std::hint::spin_loop();
            }
            let now = std::time::Instant::now();
            if now >= *until.get_or_insert(now + budget) {
                return;
            }
        }
    }

    /// A reader's shortest way to its bytes: takes the link's next CDC frame if it is this
    /// connection's and applies it under the lock the reader holds, as the group's dispatch
    /// would (`on_cdc`), without looking the connection up, counting a reference or taking
    /// its lock again. Only in the connection's plain state, where `on_cdc` does nothing but
    /// apply the message and its ending (`maybe_finish`) has nothing to do: on SMC, not
    /// failed, not lingering, not released, no TCP kept for the peer's close. Returns whether
    /// a frame was taken; an error ends the group ([`LinkGroup::dispatch_own`]), which the
    /// caller does once it has let the lock go.
    fn take_own_frame(&self, st: &mut ConnState) -> Result<bool, LinkError> {
        if st.handback != Handback::Smc
            || st.error.is_some()
            || st.lingering.is_some()
            || st.released
            || st.tcp_hold.is_some()
            || self.forgotten()
        {
            return Ok(false);
        }
        self.group.dispatch_own(self.our_token, |frame| match CdcMsg::decode(frame) {
            Ok(msg) => self.apply_cdc(st, &msg),
            Err(e) => {
                tracing::debug!(parent: &self.span, error = %e, "aborting connection: malformed CDC message");
                self.fail_locked(st, ConnError::Protocol(format!("malformed CDC message: {e}")));
            }
        })
    }

    /// Copies `n` available bytes into `buf`, and, reading, consumes them (and owes the peer a
    /// consumer update). Bytes an earlier peek showed come from our copy of them (`peeked`),
    /// so that the peer's memory is read once per byte; a read takes bytes that came inline
    /// from our copy of the CDC frame (no access to the peer's memory: one cache line fewer to
    /// pull across cores), and so does a peek, which keeps whatever it copied in `peeked`.
    fn copy_out(&self, st: &mut ConnState, buf: &mut ReadBuf<'_>, n: u32, take: Take) -> io::Result<()> {
        let (Some(link), Some(peer_token)) = (self.group.link(), st.peer_token) else {
            return Err(io::Error::other("smc connection read before it was established"));
        };
        let mut held = 0usize;
        if !st.peeked.is_empty() {
            held = st.peeked.len().min(n as usize);
            buf.put_slice(&st.peeked.bytes()[..held]);
            if take == Take::Consume {
                // `peeked` is at most what is available, which covers it.
                let _ = st.engine.rx_consume(held as u32);
                st.peeked.consume(held);
            }
        }
        // Where the rest starts, past the consumer cursor: a peek consumed nothing.
        let skip = if take == Take::Peek { held as u32 } else { 0 };
        let mut first = 0usize;
        // The inline copy serves the bytes at the consumer cursor, past nothing peeked. A read
        // lets go of a copy it does not use (its position is behind, or too long for the read);
        // a peek leaves it.
        let cons = st.engine.rx_cons();
        let at_cursor = |inl: &Inline| skip == 0 && cons == inl.at && inl.len <= n as usize - held;
        let inline = match take {
            Take::Consume => st.inline.take().filter(|i| at_cursor(i)),
            Take::Peek => st.inline.take_if(|i| at_cursor(i)),
        };
        if let Some(inl) = inline {
            buf.put_slice(&inl.data[..inl.len]);
            match take {
                // rx_available covered n >= inl.len bytes.
                Take::Consume => drop(st.engine.rx_consume(inl.len as u32)),
                Take::Peek => st.peeked.extend(&inl.data[..inl.len]),
            }
            first = inl.len;
        }
        let n = n - held as u32 - first as u32;
        if n == 0 {
            // What was peeked, or the inline copy, was all of it (a small message on an idle
            // connection): no spans to work out.
            if take == Take::Consume {
                self.flush_cdc(st);
                self.pay_abort(st);
            }
            return Ok(());
        }
        let past = skip + if take == Take::Peek { first as u32 } else { 0 };
        let Some(mut spans) = st.engine.rx_spans(past + n) else {
            return Err(io::Error::other("rx span"));
        };
        let mut cut = past;
        for s in spans.iter_mut() {
            let d = cut.min(s.1);
            (s.0, s.1, cut) = (s.0 + d, s.1 - d, cut - d);
        }
        let mut done = 0usize;
        for (off, len) in spans {
            if len == 0 {
                continue;
            }
            // SAFETY: rx_read writes exactly `len` bytes into this part of the unfilled region
            // (or fails without claiming them); they are marked initialized only afterwards.
            let dst = unsafe { &mut buf.unfilled_mut()[done..done + len as usize] };
            if let Err(e) = link.rx_read(link.rx_token(self.our_token, peer_token), off, dst) {
                return Err(self.fail_reported(st, ConnError::from_link(&e)));
            }
            done += len as usize;
        }
        // SAFETY: the first `done` unfilled bytes were written by rx_read above.
        unsafe { buf.assume_init(done) };
        buf.advance(done);
        match take {
            Take::Consume => {
                // rx_spans succeeded for n, so consuming n cannot fail.
                let _ = st.engine.rx_consume(n);
                self.flush_cdc(st);
                self.pay_abort(st);
            }
            Take::Peek => {
                let filled = buf.filled();
                st.peeked.extend(&filled[filled.len() - done..]);
            }
        }
        Ok(())
    }

    pub(crate) fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.write_to(Some(cx), data)
    }

    /// A write that does not wait: `WouldBlock` when the peer's ring is full.
    pub(crate) fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        match self.write_to(None, data) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// A vectored write that does not wait: `WouldBlock` when the peer's ring is full.
    pub(crate) fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self.write_vectored_to(None, bufs) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_to(&self, cx: Option<&mut Context<'_>>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_produce(cx, data.len(), Some(data), &mut |link, token, spans, n| {
            let mut at = 0usize;
            for (off, len) in spans {
                if len > 0 {
                    link.tx_write(token, off, &data[at..at + len as usize]).map_err(FillError::Link)?;
                    at += len as usize;
                }
            }
            Ok(n)
        })
    }

    pub(crate) fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write_vectored_to(Some(cx), bufs)
    }

    fn write_vectored_to(&self, cx: Option<&mut Context<'_>>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let first = bufs.iter().find(|b| !b.is_empty()).map(|b| &b[..]);
        // Inline only when a single buffer carries everything (the common small-write case).
        let inline = first.filter(|f| f.len() == total);
        self.poll_produce(cx, total, inline, &mut |link, token, spans, n| {
            // Walk the buffers and the (at most two) ring spans together.
            let mut src = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty());
            let mut cur: &[u8] = &[];
            let mut left = n as usize;
            for (mut off, len) in spans {
                let mut room = len as usize;
                while room > 0 && left > 0 {
                    if cur.is_empty() {
                        cur = src.next().unwrap_or(&[]);
                        if cur.is_empty() {
                            return Err(FillError::Link(LinkError::Protocol("vectored write ran out of data")));
                        }
                    }
                    let k = cur.len().min(room).min(left);
                    link.tx_write(token, off, &cur[..k]).map_err(FillError::Link)?;
                    cur = &cur[k..];
                    off += k as u32;
                    room -= k;
                    left -= k;
                }
            }
            Ok(n)
        })
    }

    /// Sends up to `*remaining` bytes of `file` from `*offset`, reading them straight into the
    /// peer's ring. Advances both; `*remaining` becomes 0 at the end of the file.
    pub(crate) fn poll_sendfile(
        &self,
        cx: &mut Context<'_>,
        file: BorrowedFd<'_>,
        offset: &mut u64,
        remaining: &mut u64,
    ) -> Poll<io::Result<()>> {
        while *remaining > 0 {
            let want = usize::try_from(*remaining).unwrap_or(usize::MAX);
            let at = *offset;
            let res = self.poll_produce(Some(&mut *cx), want, None, &mut |link, token, spans, n| {
                let mut got = 0u32;
                for (off, len) in spans {
                    if len == 0 {
                        continue;
                    }
                    let filled = link
                        // SAFETY: `tx_fill` hands out a span valid for writes for this call.
                        .tx_fill(token, off, len, &mut |span| unsafe { span.read_file(file, at + u64::from(got)) })
                        .map_err(FillError::Link)?
                        .map_err(FillError::Io)?;
                    got += filled as u32;
                    if filled < len as usize {
                        break; // end of file
                    }
                }
                Ok(got.min(n))
            });
            match res {
                Poll::Ready(Ok(0)) => *remaining = 0,
                Poll::Ready(Ok(k)) => {
                    *offset += k as u64;
                    *remaining -= k as u64;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Puts up to `want` bytes into the peer's ring with `fill` (which returns how many it put;
    /// fewer means its source ended), waiting for space as needed. `inline` is the source when
    /// it is a plain buffer, so a small write on an idle connection can ride in its CDC message.
    fn poll_produce(
        &self,
        mut cx: Option<&mut Context<'_>>,
        want: usize,
        inline: Option<&[u8]>,
        fill: &mut Fill<'_>,
    ) -> Poll<io::Result<usize>> {
        if want == 0 {
            // As a send of nothing on TCP: nothing goes, but a connection that can take no
            // more says so.
            let mut st = self.lock();
            self.claim_watch_lost(&mut st);
            return Poll::Ready(Self::refuses_writes(&mut st).map_or(Ok(0), Err));
        }
        for attempt in 0..2 {
            let mut st = self.lock();
            self.claim_watch_lost(&mut st);
            if st.error.is_some() {
                if let Some(e) = Self::refuses_writes(&mut st) {
                    return Poll::Ready(Err(e));
                }
            }
            if let Some(p) = self.gate(&mut st, cx.as_deref_mut(), false) {
                return p;
            }
            if let Some(e) = Self::refuses_writes(&mut st) {
                return Poll::Ready(Err(e));
            }
            if let Some(next) = st.engine.tx_grow_wanted() {
                // RMB autotuning: the ring filled; grow it if the process budget allows.
                if self.group.grow_slot(self.our_token, next.get()) && st.engine.tx_resize(next) {
                    tracing::trace!(parent: &self.span, size = next.get(), "growing the peer's ring");
                } else {
                    st.engine.tx_grow_declined();
                }
            }
            let free = st.engine.tx_free();
            if free > 0 {
                let n = free.min(u32::try_from(want).unwrap_or(u32::MAX));
                let Some(link) = self.group.link() else {
                    return Poll::Ready(Err(io::Error::other("smc connection written before it was established")));
                };
                let Some(spans) = st.engine.tx_spans(n) else {
                    return Poll::Ready(Err(io::Error::other("tx span")));
                };
                let idle = st.engine.tx_idle();
                let filled = match fill(link, self.our_token, spans, n) {
                    Ok(k) => k.min(n),
                    Err(FillError::Io(e)) => return Poll::Ready(Err(e)),
                    Err(FillError::Link(e)) => {
                        return Poll::Ready(Err(self.fail_reported(&mut st, ConnError::from_link(&e))));
                    }
                };
                // tx_spans succeeded for n >= filled, so committing cannot fail.
                let _ = st.engine.tx_commit(filled);
                st.awaiting_reply |= filled > 0;
                let inline = inline.filter(|d| idle && d.len() == filled as usize && d.len() <= st.inline_max);
                self.flush_cdc_inline(&mut st, inline);
                return Poll::Ready(Ok(filled as usize));
            }
            st.engine.set_write_blocked();
            self.flush_cdc(&mut st);
            if attempt == 0 {
                drop(st);
                self.group.progress();
                continue;
            }
            st.tx_ready_hint = false;
            match cx.as_mut() {
                Some(cx) => st.tx_waiters.register(cx, false),
                None => return Poll::Ready(Err(io::ErrorKind::WouldBlock.into())),
            }
        }
        Poll::Pending
    }

    /// Holds back producer updates until the matching [`uncork`](Self::uncork).
    pub(crate) fn cork(&self) {
        let mut st = self.lock();
        st.corks += 1;
        st.engine.set_corked(true);
    }

    /// Releases one cork; the last one pushes everything written meanwhile, in this call.
    pub(crate) fn uncork(&self) {
        let mut st = self.lock();
        st.corks = st.corks.saturating_sub(1);
        if st.corks == 0 {
            st.engine.set_corked(false);
            self.flush_cdc(&mut st);
        }
    }

    /// Announces everything written so far, cork or not, and resolves once it is out of this
    /// process's hands: every CDC message owed is in the link (none waits for CDC space) and
    /// the link has delivered it ([`Link::poll_delivered`](crate::link::Link::poll_delivered):
    /// at once over shared memory, on the SEND's completion over RDMA). A process that exits
    /// after a flush (or a shutdown) loses none of what it wrote, as with TCP, whose bytes are
    /// the kernel's once written.
    pub(crate) fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.lock();
        self.claim_watch_lost(&mut st);
        if let Some(e) = &st.error {
            return Poll::Ready(Err(e.to_io()));
        }
        if let Some(p) = self.gate(&mut st, Some(cx), false) {
            return p;
        }
        st.engine.push();
        self.poll_handed_over(cx, st)
    }

    /// Sends what the engine owes and waits until it is handed over and delivered (see
    /// [`poll_flush`](Self::poll_flush)).
    fn poll_handed_over(&self, cx: &mut Context<'_>, mut st: MutexGuard<'_, ConnState>) -> Poll<io::Result<()>> {
        self.flush_cdc(&mut st);
        if let Some(e) = &st.error {
            return Poll::Ready(Err(e.to_io()));
        }
        let Some(link) = self.group.link() else {
            return Poll::Ready(Ok(()));
        };
        if let Some(e) = st.send_failed.clone() {
            // Our message met the failed link: nothing will retry it on the link.
            drop(st);
            return self.delivery_failed(cx, e);
        }
        if st.peer_token.is_some() && st.engine.poll_cdc().is_some() {
            // A message waits for CDC space; `retry_cdc` wakes us when it went.
            st.tx_waiters.register(cx, false);
            return Poll::Pending;
        }
        let mark = link.tx_mark();
        drop(st);
        match link.poll_delivered(cx, mark) {
            Poll::Ready(Err(e)) => self.delivery_failed(cx, e),
            r => r.map_err(|e| ConnError::from_link(&e).to_io()),
        }
    }

    /// The link failed before what a flush waits for was delivered. Not the flush's error yet:
    /// the group ends with the link (as its driver does once it sees the failure; it may not
    /// have yet), which moves the connection to TCP where it can, and the bytes not delivered
    /// go again there. So the flush waits for the move and goes on over TCP, or for the
    /// connection's end, whose error it reports.
    fn delivery_failed(&self, cx: &mut Context<'_>, e: LinkError) -> Poll<io::Result<()>> {
        if self.group.is_alive() {
            self.group.end_on_link_error(e.clone());
        }
        let mut st = self.lock();
        if let Some(err) = &st.error {
            return Poll::Ready(Err(err.to_io()));
        }
        if let Some(p) = self.gate(&mut st, Some(cx), false) {
            return p;
        }
        // Still on the link with no error, the wait goes on where `fail_link` ran (the peer's side
        // went away: the TCP connection tells whether the peer moves, and so do we, or is gone,
        // and the connection ends; a host that went silent is found by the keepalive it turned
        // on), or where another thread ends the group and has yet to run it for this
        // connection. Either way `fail_link` or what follows it wakes the writers.
        if st.link_down || (!self.group.is_alive() && !st.engine.finished()) {
            st.tx_waiters.register(cx, false);
            return Poll::Pending;
        }
        Poll::Ready(Err(ConnError::from_link(&e).to_io()))
    }

    /// Test hook: sends the CDC message this connection would send next (or a plain state
    /// update), after `corrupt` edited its encoded bytes. The engine does not record it.
    #[cfg(feature = "test-util")]
    pub(crate) fn send_corrupt_cdc(
        &self,
        corrupt: impl FnOnce(&mut [u8; crate::proto::cdc::CDC_MSG_LEN]),
    ) -> io::Result<()> {
        let st = self.lock();
        let (Some(link), Some(token)) = (self.group.link(), st.peer_token) else {
            return Err(io::Error::other("not established"));
        };
        let msg = st.engine.poll_cdc().unwrap_or_else(|| st.engine.state_msg(token));
        let mut frame = msg.encode();
        corrupt(&mut frame);
        let sent = link.cdc_send_frame(&frame).map_err(|e| io::Error::other(e.to_string()))?;
        if !sent {
            // Refused for want of space: as every refused sender does, wait for it, so the
            // group ends the link's watch for space once nobody waits (`retry_waiters`).
            if let Some(me) = self.me.upgrade() {
                self.group.wait_cdc_space(&me);
            }
        }
        Ok(())
    }

    /// The link group's id.
    pub(crate) fn group_id(&self) -> u64 {
        self.group.id
    }

    /// The end `e` of the connection (its error, or the peer's abort) for a read or a write to
    /// return: the first time only, as a TCP socket reports its error once (`sock_error`
    /// clears it) and is shut both ways after a reset. `None` after: a read then returns the
    /// end of stream and a write `BrokenPipe`, so a loop that reads on after an error until
    /// the end ends, as over TCP. A flush or a shutdown reports the error every time without
    /// using up the report: they say whether what was written got through, which it did not.
    fn report_end(st: &mut ConnState, e: io::Error) -> Option<io::Error> {
        (!std::mem::replace(&mut st.end_reported, true)).then_some(e)
    }

    /// Half-close without waiting (a dropped write half): the peer reads EOF after the bytes
    /// written so far.
    pub(crate) fn shutdown(&self) -> io::Result<()> {
        // No claim of a lost watcher here: this is a dropped write half's, which closes our
        // side in order, as tokio's (a direct `shutdown(2)`) does after its runtime went.
        let mut st = self.lock();
        if let Some(e) = &st.error {
            return e.after_shutdown();
        }
        match st.handback {
            Handback::Smc => {}
            Handback::Moving(_) => {
                st.shutdown_after_handback = true;
                return Ok(());
            }
            Handback::Moved => return Err(moved()),
        }
        st.engine.shutdown_write();
        self.flush_cdc(&mut st);
        Ok(())
    }

    /// Half-close: the peer reads EOF after the bytes written so far. Resolves as
    /// [`poll_flush`](Self::poll_flush) does, once the close is delivered.
    pub(crate) fn poll_shutdown(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.lock();
        self.claim_watch_lost(&mut st);
        if let Some(e) = &st.error {
            return Poll::Ready(e.after_shutdown());
        }
        if let Some(p) = self.gate(&mut st, Some(cx), false) {
            return p;
        }
        st.engine.shutdown_write();
        self.poll_handed_over(cx, st)
    }

    /// Why the connection takes no more bytes from the application, if it does not: an error
    /// that ended it, our own shutdown, or the peer's abort or close. The end of a connection
    /// is reported once ([`report_end`](Self::report_end)), `BrokenPipe` after.
    fn refuses_writes(st: &mut ConnState) -> Option<io::Error> {
        let ended = || io::Error::new(io::ErrorKind::BrokenPipe, "smc connection ended (its error was reported)");
        if let Some(e) = &st.error {
            let e = e.to_io();
            return Some(Self::report_end(st, e).unwrap_or_else(ended));
        }
        if st.engine.is_write_shutdown() {
            return Some(io::Error::new(io::ErrorKind::BrokenPipe, "write after shutdown"));
        }
        if st.engine.peer_aborted() {
            return Some(Self::report_end(st, ConnError::Reset.to_io()).unwrap_or_else(ended));
        }
        if st.engine.peer_closed() {
            return Some(io::Error::new(io::ErrorKind::BrokenPipe, "smc peer closed the connection"));
        }
        None
    }

    /// The application dropped the stream: close (or, with unread data or when `abort` is set
    /// (a zero `SO_LINGER`), abort, as TCP resets a connection closed with unread data).
    pub(crate) fn release(&self, abort: bool, watcher: Option<tokio::task::JoinHandle<()>>) {
        let mut st = self.lock();
        st.released = true;
        if matches!(st.handback, Handback::Moving(_)) {
            // Let go while a move runs: its resend waits for room as TCP writes do, and a peer
            // that answered and never reads would hold it (and the connection, its copy and
            // its slot) for good, where the kernel ends a TCP socket dropped so by its orphan
            // limits. The bound a silent host gets applies from now on, to data held back by
            // a zero window too (`TCP_USER_TIMEOUT`), and the peer's frame no longer takes it
            // off (`release_reads`).
            if let Some(tcp) = st.tcp.as_deref() {
                if let Err(e) = socket2::SockRef::from(tcp).set_tcp_user_timeout(Some(SILENT_HOST_BOUND)) {
                    tracing::debug!(parent: &self.span, error = %e, "cannot bound a released move's resend");
                }
            }
        }
        // The stream's watcher: kept only while the TCP socket is held for the peer's close
        // (`let_tcp_go`), else stopped below.
        st.held_watcher = watcher.map(|w| Watcher(Some(w)));
        // The application let go of the stream, and of every byte lent through it.
        self.end_lend(&mut st);
        if std::mem::take(&mut st.abort_owed) {
            // The answer to the peer's abort, held back while its bytes were unread.
            st.engine.abort();
            self.flush_cdc(&mut st);
        }
        if st.error.is_none() && st.handback == Handback::Smc {
            // Unread bytes make it an abort, whether or not the peer's end of stream came
            // after them, as TCP resets a connection closed with data unread (the FIN aside).
            if abort || st.engine.rx_available() > 0 {
                st.engine.abort();
            } else {
                st.engine.set_corked(false);
                st.engine.close();
            }
            self.flush_cdc(&mut st);
        }
        st.rx_waiters = Waiters::default();
        st.tx_waiters = Waiters::default();
        if std::mem::take(&mut st.wait.polling) {
            self.group.poll_stop();
        }
        if st.tcp_hold.is_none() {
            st.held_watcher = None;
        }
        let (done, retire) = (Self::done(&st), st.retire_slot);
        if !done {
            st.lingering = Some(std::time::Instant::now());
            st.linger_unread = st.engine.tx_in_flight();
        }
        drop(st);
        // A close whose socket could not be handed to the runtime waits here, unlocked.
        crate::smc::tcp_end::settle_deferred();
        if done {
            self.group.forget_conn(self.our_token, retire);
        } else {
            self.group.watch_lingering();
        }
    }

    /// Forgets a connection the application let go of whose peer has said nothing on it (no
    /// close, no abort, no consumer update that reads a tenth of the ring or all that was left:
    /// our readers report each tenth they free; the kernel's only when we wait for room or ask)
    /// for as long as TCP keeps an orphaned socket whose peer does not close (`TCP_LINGER2` of
    /// its TCP socket: `net.ipv4.tcp_fin_timeout`, 60 s, unless set on the socket; a negative
    /// one, none), as the kernel forgets such a socket: its slot is retired (never used again
    /// while the group lives: the peer may still read, or lend, what it holds), and the TCP
    /// socket, where the connection still holds it, goes with a reset. Nothing else is sent: a
    /// peer that got our close reads what we wrote and then the end, as from TCP, and its
    /// writes fail already (our close was a full one); one that never got it (it left its CDC
    /// ring full) reads what was announced, then `SmcError::PeerGone`. Without this,
    /// a peer that never answered a close (stopped, or hostile) held the connection, its slot
    /// and its memory for as long as the link group lived. A connection moving to TCP is left
    /// to the move (which forgets it once over). Returns how long until it would be forgotten
    /// (`None`: not waiting for its peer, or forgotten now).
    pub(crate) fn end_if_silent(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let mut st = self.lock();
        let since = st.lingering?;
        if Self::done(&st) {
            st.lingering = None;
            return None;
        }
        let bound = st.tcp.as_deref().map_or(ORPHAN_LINGER, |t| sys::orphan_linger(t).unwrap_or(ORPHAN_LINGER));
        if st.handback != Handback::Smc {
            return Some(bound);
        }
        let silent = now.saturating_duration_since(since);
        if silent < bound {
            return Some(bound - silent);
        }
        st.lingering = None;
        tracing::debug!(parent: &self.span, ?silent, "the peer never answered our close: forgetting the connection");
        if let Some(tcp) = st.tcp.as_deref() {
            // Ended with a reset either way. The peer has our close in order (its watcher
            // drains the ring before it reads the socket's end): its TCP end may go without a
            // FIN exchange. Or it never took it (the peer left its CDC ring full: a stopped
            // process, say): what it reads of ours may lack the bytes announced with the close,
            // and a FIN would end that as a whole stream, where a reset says it was cut short.
            sys::set_zero_linger(tcp);
        }
        Self::drop_tcp(&mut st);
        drop(st);
        self.group.forget_conn(self.our_token, true);
        None
    }

    /// Tells the group when this reader starts or stops polling.
    fn poll_changed(&self, was: bool, is: bool) {
        match (was, is) {
            (false, true) => self.group.poll_start(),
            (true, false) => self.group.poll_stop(),
            _ => {}
        }
    }

    // ----- link side -------------------------------------------------------------------------

    /// Sends every CDC message the engine owes. Called with the state locked.
    fn flush_cdc(&self, st: &mut ConnState) {
        self.flush_cdc_inline(st, None);
    }

    /// As `flush_cdc`; the first message carries `inline` (the bytes just written on an idle
    /// connection) when they are exactly what it announces.
    fn flush_cdc_inline(&self, st: &mut ConnState, mut inline: Option<&[u8]>) {
        if st.peer_token.is_none() || st.link_down || st.handback != Handback::Smc {
            return;
        }
        let Some(link) = self.group.link() else {
            return;
        };
        let mut registered = false;
        loop {
            let msg = match inline.take() {
                Some(data) => st.engine.poll_cdc_inline(data),
                None => st.engine.poll_cdc(),
            };
            let Some(msg) = msg else { break };
            match link.cdc_send(&msg) {
                Ok(true) => st.engine.on_cdc_sent(&msg),
                Ok(false) if !registered => {
                    // Register as a waiter, then try once more: the link's "want space" flag
                    // is cleared only when no waiter is registered, so a refusal after our
                    // registration leaves the flag set for us; one before it could have been
                    // cleared by a driver that found the list empty meanwhile.
                    if let Some(me) = self.me.upgrade() {
                        self.group.wait_cdc_space(&me);
                    }
                    registered = true;
                }
                Ok(false) => return,
                // An RDMA link failed under the send (a failed completion or post, seen before
                // its group saw it; nothing of this message was announced). Not this
                // connection's end: the group ends with the link as soon as its driver looks,
                // and the connection moves to TCP (ours failed) or waits for the TCP
                // connection's word (the peer's side went away), as `fail_link` says; the
                // message stays owed, and what it announces goes again over TCP. (A shared-
                // memory send that fails has put its message in the ring already: it must not
                // be sent again.)
                Err(e @ (LinkError::Io(..) | LinkError::PeerGone)) if link.is_rdma() => {
                    if st.send_failed.is_none() {
                        st.send_failed = Some(e);
                        // A flush waiting for CDC space finds it and ends the group.
                        st.tx_waiters.wake();
                    }
                    return;
                }
                Err(e) => {
                    st.error.get_or_insert(ConnError::from_link(&e));
                    st.rx_waiters.wake();
                    st.tx_waiters.wake();
                    return;
                }
            }
        }
        if st.engine.close_sent() {
            self.let_tcp_go(st);
        }
    }

    /// Our close is announced: the TCP connection under us has nothing more to carry, and
    /// ends. Over shared memory, once the application let go of the stream, it ends without
    /// TCP's FIN exchange: kept open, with the stream's watcher, while the peer's application
    /// holds its end (within the context's budget,
    /// [`Manager::hold_tcp`](crate::smc::manager::Manager::hold_tcp)), then reset by whichever
    /// end lets go last, so no socket of either end goes through `FIN_WAIT`, `LAST_ACK` or
    /// `TIME_WAIT`; an abort of ours resets it at once, as TCP's does. A reset loses nothing:
    /// both closes are in the rings, which the peer's watcher drains before it reads the
    /// socket's end. Over RDMA (a FIN or reset could overtake the CDC message it follows) the
    /// socket ends with a FIN once the close is delivered, and with a reset if it never is
    /// ([`FinOnDelivery`](crate::smc::tcp_end::FinOnDelivery)). Past the budget, without a
    /// running watcher and on every other path the socket is closed as before.
    fn let_tcp_go(&self, st: &mut ConnState) {
        let quiet = st.released && st.handback == Handback::Smc && !self.group.link().is_some_and(|l| l.is_rdma());
        if let (true, Some(tcp)) = (quiet, &st.tcp) {
            if st.engine.peer_closed() || st.engine.abort_sent() {
                // The stream's own reference goes right after this.
                sys::set_zero_linger(&**tcp);
            } else if st.tcp_hold.is_some() {
                return;
            } else if st.held_watcher.as_ref().is_some_and(Watcher::is_running) {
                if let Some(hold) = self.group.manager().hold_tcp() {
                    st.tcp_hold = Some(hold);
                    return;
                }
            }
        }
        if let (Some(link), Some(tcp)) = (self.group.link().filter(|l| l.is_rdma()), st.tcp.take()) {
            if st.engine.abort_sent() {
                // An abort ends TCP with a reset, as TCP's own abort does.
                sys::set_zero_linger(&*tcp);
            } else {
                crate::smc::tcp_end::FinOnDelivery::new(link.clone(), tcp).spawn();
            }
        }
        Self::drop_tcp(st);
    }

    /// Lets go of the TCP socket, any hold on it and the watcher kept with the hold.
    fn drop_tcp(st: &mut ConnState) {
        st.tcp = None;
        st.tcp_hold = None;
        st.held_watcher = None;
    }

    /// The watcher task ended or was dropped (its runtime shut down, say): a socket held for
    /// the peer's close, which nothing watches now, is closed as it would have been without
    /// the hold. One dropped before its word (`delivered`) under a stream the application still
    /// holds on SMC leaves the stream to fail at its next use ([`Self::claim_watch_lost`]), and
    /// wakes whoever waits on it: nothing would see the peer's end or its move to TCP any more
    /// (a read waiting for either waited for good). Not at once: a runtime that shuts down
    /// drops its tasks in no set order, and an application task dropped after the watcher
    /// still closes its stream in order. Deliberate stops come after the move or the release.
    fn watcher_gone(&self, delivered: bool) {
        let mut st = self.lock();
        if st.tcp_hold.is_some() {
            Self::drop_tcp(&mut st);
        }
        if !delivered && Self::held_on_smc(&st) {
            st.watch_lost = true;
            st.rx_waiters.wake();
            st.tx_waiters.wake();
        }
    }

    /// Whether the application still holds the stream, on SMC, and it has not ended.
    fn held_on_smc(st: &ConnState) -> bool {
        !st.released && st.handback == Handback::Smc && st.error.is_none()
    }

    /// A stream whose watcher went without its word (its runtime shut down) fails when the
    /// application uses it ([`ConnError::RuntimeGone`]), as tokio's stream of a runtime that
    /// shut down fails its reads and writes; the peer reads an abort.
    fn claim_watch_lost(&self, st: &mut ConnState) {
        if st.watch_lost && Self::held_on_smc(st) {
            tracing::debug!(parent: &self.span, "the runtime of the stream's tcp socket shut down: the stream fails");
            self.fail_locked(st, ConnError::RuntimeGone);
        }
    }

    /// Retries CDC messages that found the link full.
    pub(crate) fn retry_cdc(&self) {
        let mut st = self.lock();
        self.flush_cdc(&mut st);
        if st.engine.poll_cdc().is_none() {
            // A flush or shutdown waiting for its message to go can finish.
            st.tx_waiters.wake();
        }
        self.maybe_finish(st);
        crate::smc::tcp_end::settle_deferred();
    }

    fn maybe_finish(&self, mut st: MutexGuard<'_, ConnState>) {
        if st.tcp_hold.is_some() && st.engine.peer_closed() {
            // The peer let go too: the TCP connection we kept for its close ends.
            self.let_tcp_go(&mut st);
        }
        let (done, retire) = (st.released && Self::done(&st), st.retire_slot);
        drop(st);
        if done {
            self.group.forget_conn(self.our_token, retire);
        }
    }

    /// Whether the connection's RMB slot may be reused: both sides announced their close (an
    /// abort counts, and is always answered), or the link is gone. A slot is never reused while
    /// the peer may still read it for the old connection.
    fn done(st: &ConnState) -> bool {
        st.engine.finished() || st.link_down
    }

    /// A CDC message for this connection.
    pub(crate) fn on_cdc(&self, msg: &CdcMsg) {
        let mut st = self.lock();
        if st.handback != Handback::Smc {
            // The stream is moving to TCP: what the link still says of it is void if the move
            // goes through (the peer resends whatever we did not consume), and is taken in if
            // it fails (`handback_over`): what the peer wrote, and its close, before it went.
            if matches!(st.handback, Handback::Moving(_)) {
                if st.moving_cdc.len() == MOVING_CDC_MAX {
                    self.fold_moving_cdc(&mut st);
                }
                st.moving_cdc.push(*msg);
            }
            return;
        }
        if st.error.is_some() {
            // Failed already, and our abort went out: only the peer's close or abort (its answer)
            // matters now, and its cursors are no longer checked.
            use crate::proto::cdc::CdcFlags;
            let aborted = msg.flags.contains(CdcFlags::PEER_CONN_ABORT);
            if aborted || msg.flags.contains(CdcFlags::PEER_CONN_CLOSED) {
                st.engine.mark_peer_closed(aborted);
            }
            self.maybe_finish(st);
            return;
        }
        self.apply_cdc(&mut st, msg);
        if st.lingering.is_some() {
            // Let go of and waiting for the peer's answer: a slow reader of what we wrote
            // before our close is not a silent one, where it says what it read. Only reading a
            // tenth of the ring, or all that was left, since the wait began or was last renewed
            // counts (a consumer update of ours reports at least a tenth, `cons_update_due`,
            // and so does one of the kernel's). Any message did, and a peer that sent empty
            // ones kept a connection it never answered, its slot and its memory, for good; one
            // that read a byte a linger would keep it for as many lingers as the ring has
            // bytes. A tenth a linger bounds that to ten or so (the last bytes renew once more;
            // so can each byte of a ring under 20 bytes). A peer that reads without saying so
            // (the kernel reports only when our side waits for room or asks) is forgotten
            // after the linger while it reads, as before: what it holds stays readable.
            let (left, now) = (st.linger_unread, st.engine.tx_in_flight());
            let read = left.saturating_sub(now);
            if read > 0 && read >= left.min(st.engine.tx_ring().get() / 10) {
                st.lingering = Some(std::time::Instant::now());
                st.linger_unread = now;
            }
        }
        self.maybe_finish(st);
    }

    /// Makes room among the messages a move keeps ([`MOVING_CDC_MAX`]): the older half is taken
    /// into the engine now, as a failed move would take it (its cursors and flags counted, bytes
    /// that came inline placed in the ring), without its other effects, which a failed move's
    /// end brings about for all at once (the wake-ups) or which the kept messages after it
    /// bring (a close or an abort is a peer's last message). If the move goes through, this is
    /// void, as the kept messages are; a message that breaks the protocol is the connection's
    /// error if the move fails.
    fn fold_moving_cdc(&self, st: &mut ConnState) {
        let n = st.moving_cdc.len() / 2;
        let older: Vec<CdcMsg> = st.moving_cdc.drain(..n).collect();
        if st.moving_cdc_fault.is_some() {
            return;
        }
        self.set_rx_max(st);
        for msg in &older {
            let placed = match st.engine.on_cdc(msg) {
                Ok((_, inline)) => self.place_inline(st, inline, msg),
                Err(e) => {
                    st.moving_cdc_fault = Some(e.to_string());
                    return;
                }
            };
            if let Err(e) = placed {
                st.moving_cdc_fault = Some(e.to_string());
                return;
            }
            if msg.ring_size().is_some() {
                st.inline = None;
            }
        }
    }

    /// Places the bytes that came inline in `msg` at `spans` of our ring (where the engine
    /// returned spans) if the link wants them there (a verbs link, whose peer wrote nothing into
    /// our ring for them); whether it did.
    fn place_inline(
        &self,
        st: &ConnState,
        spans: Option<crate::proto::engine::Spans>,
        msg: &CdcMsg,
    ) -> Result<bool, LinkError> {
        match (spans, self.group.link(), st.peer_token) {
            (Some(spans), Some(link), Some(peer)) => {
                link.rx_place_inline(link.rx_token(self.our_token, peer), spans, msg.inline())
            }
            _ => Ok(false),
        }
    }

    /// The largest ring the peer may resize ours to, told to the engine once the link is known.
    fn set_rx_max(&self, st: &mut ConnState) {
        if !st.rx_max_set {
            let Some(link) = self.group.link() else { return };
            if link.is_rdma() {
                // Registered rings of a fixed size: no resize (`ConnEngine::refuse_resize`).
                st.engine.refuse_resize();
                st.rx_max_set = true;
            } else if let Some(max) = RingSize::new(link.rx_rmb_size()) {
                st.engine.set_rx_max(max);
                st.rx_max_set = true;
            }
        }
    }

    /// Takes in one CDC message of a connection that has not ended.
    fn apply_cdc(&self, st: &mut ConnState, msg: &CdcMsg) {
        self.set_rx_max(st);
        let at = st.engine.peer_prod();
        match st.engine.on_cdc(msg) {
            Ok((effect, inline)) => {
                let placed = match self.place_inline(st, inline, msg) {
                    Ok(p) => p,
                    Err(e) => {
                        self.fail_locked(st, ConnError::from_link(&e));
                        return;
                    }
                };
                if msg.ring_size().is_some() {
                    // The ring started over: an inline copy kept from the old one names a
                    // position that means something else now.
                    st.inline = None;
                }
                if inline.is_some() && !placed {
                    let mut data = [0u8; crate::proto::cdc::CDC_INLINE_MAX];
                    let len = msg.inline().len();
                    data[..len].copy_from_slice(msg.inline());
                    st.inline = Some(Inline { at, len, data });
                }
                if effect.readable {
                    let was = st.wait.polling;
                    st.wait.end();
                    self.poll_changed(was, st.wait.polling);
                    // Readable until a read finds nothing, as tokio's readiness is: a task
                    // woken for these bytes finds the stream readable though another took them.
                    st.rx_ready_hint = true;
                    st.rx_waiters.wake();
                }
                if effect.writable {
                    st.tx_waiters.wake();
                }
                if st.engine.peer_aborted() {
                    st.error.get_or_insert(ConnError::Reset);
                    // Answer the abort, so the peer knows we stopped reading its ring and may
                    // reuse the slot: once the bytes it announced before are read (a read that
                    // finds the ring empty answers), or the stream is let go, and nothing of
                    // it is lent.
                    st.abort_owed = true;
                    self.pay_abort(st);
                }
                // A blocked writer on the other side waits for our consumer cursor.
                self.flush_cdc(st);
            }
            Err(e) => {
                tracing::debug!(parent: &self.span, error = %e, "aborting connection: bad CDC message");
                self.fail_locked(st, ConnError::Protocol(e.to_string()));
            }
        }
    }

    /// [`fail_locked`](Self::fail_locked) by a read or write that returns the error: that
    /// counts as its report ([`report_end`](Self::report_end)).
    fn fail_reported(&self, st: &mut ConnState, err: ConnError) -> io::Error {
        let e = err.to_io();
        self.fail_locked(st, err);
        st.end_reported = true;
        e
    }

    fn fail_locked(&self, st: &mut ConnState, err: ConnError) {
        if st.error.is_none() {
            st.error = Some(err);
            self.abort_or_owe(st);
            self.flush_cdc(st);
        }
        st.rx_waiters.wake();
        st.tx_waiters.wake();
    }

    /// The peer sent something that does not decode.
    pub(crate) fn fail_protocol(&self, what: String) {
        let mut st = self.lock();
        self.fail_locked(&mut st, ConnError::Protocol(what));
        self.maybe_finish(st);
    }

    /// The link group failed; the group has already forgotten this connection (and, for a
    /// peer that went away, dispatched every message it had published first).
    pub(crate) fn fail_link(&self, err: &LinkError) {
        tracing::debug!(parent: &self.span, error = %err, "link group failed under the connection");
        let mut st = self.lock();
        let moving = st.handback != Handback::Smc
            || match err {
                // Our link failed while both processes may live: the stream moves to the TCP
                // socket (now, before the link is torn down: the copy of our unacknowledged
                // bytes comes from it), and the peer follows when our frame arrives.
                LinkError::Io(..) => self.start_handback(&mut st, HandbackCause::LinkFailed),
                // The peer's side of the link went away: either its process died, or its link
                // failed and it is moving to TCP. The TCP connection tells which: its end (the
                // watcher then ends this connection as before, once the bytes in our ring are
                // read), or the peer's frame (we move too). Until then reads take what is in our
                // ring, and writes go into it (resent over TCP if the peer moves). Over RDMA the
                // path between the hosts may have broken under two live processes, neither of
                // which then speaks first: if TCP says nothing for `PEER_WORD_BOUND`, we move.
                LinkError::PeerGone => Self::movable(&st),
                // A peer that broke the protocol is not followed to TCP; a group torn down here
                // (its runtime shut down) has nothing left to run the move on.
                LinkError::Protocol(_) | LinkError::Closed => false,
            };
        st.link_down = true;
        // Writers wake whatever was decided: a flush that found the link failed waits for
        // this word.
        st.tx_waiters.wake();
        if moving {
            if matches!(err, LinkError::PeerGone) && st.handback == Handback::Smc {
                if st.keepalive_before.is_none() {
                    st.keepalive_before = st.tcp.as_deref().and_then(probe_peer_host);
                }
                if self.group.link().is_some_and(|l| l.is_rdma()) {
                    self.move_unless_told();
                }
            }
            return;
        }
        if st.error.is_none() {
            st.error = Some(ConnError::from_link(err));
        }
        if let (Some(tcp), true) = (st.tcp.as_deref(), self.group.link().is_some_and(|l| l.is_rdma())) {
            // Over RDMA what we wrote last may not have reached the peer, and a FIN (when the
            // application lets go) would read as a clean end after it: the end is a reset.
            // (Over shared memory what we wrote is in the ring the peer maps.)
            sys::set_zero_linger(tcp);
        }
        Self::drop_tcp(&mut st);
        st.rx_waiters.wake();
    }

    /// The RDMA peer's side of the link went away and its TCP connection has said nothing yet
    /// (see [`Self::fail_link`]). A peer process that died has had its TCP connection closed
    /// by its kernel before our queue pair gave up on it (the transport's retries take half a
    /// second), and the watcher acts on that end within its grace for a close in flight
    /// ([`TCP_CLOSE_GRACE_RDMA`]), so a TCP connection still silent after [`PEER_WORD_BOUND`]
    /// belongs to a live process whose link broke too, waiting as we do: we move first, and it
    /// follows our frame. A peer host that went silent does not answer the frame either; the
    /// probe's bound on unacknowledged data ([`probe_peer_host`]) ends the move, and the
    /// connection ends as when the peer goes away (the bytes in our ring are read first).
    fn move_unless_told(&self) {
        self.later(PEER_WORD_BOUND, |c| {
            let mut st = c.lock();
            // Not one the application let go of: its close could not reach the peer, and the
            // release ends it when the group does.
            if st.handback != Handback::Smc || st.released {
                return;
            }
            if c.start_handback(&mut st, HandbackCause::LinkFailed) {
                tracing::debug!(parent: &c.span, "the rdma peer's tcp connection is silent: moving first");
            } else if st.error.is_none() && !st.engine.peer_closed() {
                // No move can start (our close went out, or the runtime is shutting down), and
                // the link is gone: the connection ends as one whose peer went away (its ring
                // read first), instead of waiting for a word nothing here may be left to hear.
                tracing::debug!(parent: &c.span, "the rdma peer's side is gone and no move can start");
                c.fail_locked(&mut st, ConnError::PeerGone { tcp_reset: false });
                c.maybe_finish(st);
            }
        });
    }

    /// Runs `f` on this connection after `delay`, on the current runtime, if the connection
    /// still exists then; without a runtime (a drop outside any), never.
    fn later(&self, delay: std::time::Duration, f: impl FnOnce(Arc<SmcConn>) + Send + 'static) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let me = self.me.clone();
        rt.spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(c) = me.upgrade() {
                f(c);
            }
        });
    }

    // ----- the move to the TCP socket (see `proto::handback`) ---------------------------------

    /// Moves the byte stream to the TCP socket because of `cause`, unless it moves already;
    /// returns whether it moves (or moved). It cannot where the socket is no longer held (our
    /// close went out), the connection ended (an error, the peer's close or abort), or there is
    /// no runtime to run the exchange on.
    pub(crate) fn hand_back(&self, cause: HandbackCause) -> bool {
        let mut st = self.lock();
        st.handback != Handback::Smc || self.start_handback(&mut st, cause)
    }

    /// The error of a stream whose runtime shut down under it ([`ConnError::RuntimeGone`]), met
    /// now or before, for a caller that would otherwise start on its socket (a move to TCP
    /// runs on that socket, which the runtime's reactor took with it).
    pub(crate) fn runtime_gone(&self) -> Option<io::Error> {
        let mut st = self.lock();
        self.claim_watch_lost(&mut st);
        st.error.as_ref().filter(|e| matches!(e, ConnError::RuntimeGone)).map(ConnError::to_io)
    }

    /// Whether the stream is on the TCP socket (cheap: the streams ask on every operation).
    pub(crate) fn on_tcp(&self) -> bool {
        self.moved_to_tcp().is_some()
    }

    /// Where the stream is: `None` on the link (or moving), the cause once on TCP. Lock-free.
    pub(crate) fn moved_to_tcp(&self) -> Option<HandbackCause> {
        cause_of(self.on_tcp.load(std::sync::atomic::Ordering::Acquire))
    }

    /// A move read the peer's frame ([`release_reads`](Self::release_reads)): the peer's
    /// stream follows on the TCP socket, and reads take it there while our resend still goes
    /// out.
    fn reads_released(&self) -> bool {
        self.rx_on_tcp.load(std::sync::atomic::Ordering::Acquire) != 0
    }

    /// Where the stream's bytes come from, as [`moved_to_tcp`](Self::moved_to_tcp): the cause
    /// from the moment a move read the peer's frame (reads are the socket's then, while our
    /// resend may still go out), not only once the move is over. Lock-free.
    pub(crate) fn reads_moved_to_tcp(&self) -> Option<HandbackCause> {
        self.moved_to_tcp().or_else(|| cause_of(self.rx_on_tcp.load(std::sync::atomic::Ordering::Acquire)))
    }
}

/// The cause that [`cause_code`] stored (0: none).
fn cause_of(code: u8) -> Option<HandbackCause> {
    match code {
        1 => Some(HandbackCause::Requested),
        2 => Some(HandbackCause::LinkFailed),
        3 => Some(HandbackCause::Peer),
        _ => None,
    }
}

impl SmcConn {
    /// Whether `e` is the error of an operation that found the stream on TCP (see [`MovedToTcp`]).
    pub(crate) fn is_moved_error(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|i| i.is::<MovedToTcp>())
    }

    /// Resolves once a handback started on this connection is over: `Ok` on TCP, else the
    /// connection's error.
    pub(crate) async fn handed_back(&self) -> io::Result<()> {
        loop {
            let over = self.handback_over.notified();
            {
                let st = self.lock();
                if let Some(e) = &st.error {
                    return Err(e.to_io());
                }
                match st.handback {
                    Handback::Moved => return Ok(()),
                    Handback::Moving(_) => {}
                    Handback::Smc => return Err(io::Error::other("the connection did not move to its tcp socket")),
                }
            }
            over.await;
        }
    }

    /// Reads (`read`) and writes while a handback runs wait for it (without a context: they
    /// would block); once it is over they are TCP's. `None` on the link.
    fn gate<T>(&self, st: &mut ConnState, cx: Option<&mut Context<'_>>, read: bool) -> Option<Poll<io::Result<T>>> {
        match st.handback {
            Handback::Smc => None,
            // The peer's frame is in: its stream is on the socket, for the stream's reads.
            Handback::Moving(_) if read && self.reads_released() => Some(Poll::Ready(Err(moved()))),
            Handback::Moving(_) => Some(match cx {
                Some(cx) => {
                    if read { &mut st.rx_waiters } else { &mut st.tx_waiters }.register(cx, false);
                    Poll::Pending
                }
                None => Poll::Ready(Err(io::ErrorKind::WouldBlock.into())),
            }),
            Handback::Moved => Some(Poll::Ready(Err(moved()))),
        }
    }

    /// Whether the stream can still move to its TCP socket: we hold the socket (our close has
    /// not gone out), and the connection has not ended (an error, the peer's close or abort).
    fn movable(st: &ConnState) -> bool {
        st.tcp.is_some() && st.error.is_none() && !st.engine.peer_closed() && !st.engine.peer_aborted()
    }

    /// Freezes the SMC side of the stream and starts the exchange (see [`Self::hand_back`]).
    fn start_handback(&self, st: &mut ConnState, cause: HandbackCause) -> bool {
        let Some(tcp) = st.tcp.clone().filter(|_| Self::movable(st) && !st.engine.close_sent()) else {
            return false;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return false };
        let Some(me) = self.me.upgrade() else { return false };
        let t = st.engine.handback_totals();
        // Our bytes the peer has not reported consumed, from our side's copy of its ring.
        let mut copy = vec![0u8; usize::try_from(t.written - t.acknowledged).unwrap_or(0)];
        if !copy.is_empty() {
            let Some(link) = self.group.link() else { return false };
            let mut at = 0usize;
            for (off, len) in t.unacked {
                let len = len as usize;
                if len > 0 && link.tx_read(self.our_token, off, &mut copy[at..at + len]).is_err() {
                    return false;
                }
                at += len;
            }
        }
        let hb =
            crate::proto::handback::Handback::new(t.consumed, t.acknowledged, t.written, st.engine.is_write_shutdown());
        tracing::debug!(
            parent: &self.span,
            %cause,
            consumed = t.consumed,
            written = t.written,
            resend_at_most = copy.len(),
            "moving the connection to its tcp socket"
        );
        // A peer host that died answers nothing, and a frame nobody acknowledges is retransmitted
        // for a quarter of an hour: every move is bounded as a silent peer's is (about 13 s),
        // and the socket's own settings go back once it moved.
        if st.keepalive_before.is_none() {
            st.keepalive_before = probe_peer_host(&tcp);
        }
        // What the application was handed and did not consume is not consumed: the peer sends
        // it again on TCP, where a later `consume` of it skips it. Bytes it may still hold stay
        // as they are: the peer never reuses the ring after a move (`handback_over`).
        self.voided.store(std::mem::take(&mut st.lent), std::sync::atomic::Ordering::Relaxed);
        st.handback = Handback::Moving(cause);
        if std::mem::take(&mut st.wait.polling) {
            self.group.poll_stop();
        }
        // Ends the move however the task ends: a task dropped unfinished (its runtime shut
        // down) fails it, so no reader waits for a move that nobody runs. A runtime that is
        // shutting down drops the task inside `spawn`, where this thread holds the
        // connection's lock: that drop only marks the move as never started (`spawn` below
        // then undoes it under the lock it holds) instead of taking the lock again.
        struct Over {
            conn: Option<Arc<SmcConn>>,
            /// Given to `handback_over`, which lets it go before the move is seen to be over.
            tcp: Option<Arc<TcpStream>>,
            spawn: Arc<std::sync::atomic::AtomicU8>,
        }
        impl Drop for Over {
            fn drop(&mut self) {
                use std::sync::atomic::Ordering::AcqRel;
                let Some(c) = self.conn.take() else { return };
                // AcqRel: the spawning thread's exchange after `spawn` reads this mark.
                if self
                    .spawn
                    .compare_exchange(SPAWNING, DROPPED_IN_SPAWN, AcqRel, std::sync::atomic::Ordering::Acquire)
                    .is_ok()
                {
                    return;
                }
                let e = io::Error::other("the runtime that ran the move to tcp shut down");
                if let Some(tcp) = self.tcp.take() {
                    c.handback_over(Err(crate::smc::handback::Failure::Tcp(e)), tcp);
                }
            }
        }
        const SPAWNING: u8 = 0;
        const SPAWNED: u8 = 1;
        const DROPPED_IN_SPAWN: u8 = 2;
        let spawn = Arc::new(std::sync::atomic::AtomicU8::new(SPAWNING));
        let mut over = Over { conn: Some(me), tcp: Some(tcp), spawn: spawn.clone() };
        rt.spawn(tracing::Instrument::instrument(
            async move {
                // Polled, so not dropped inside `spawn`: from now on a drop fails the move (on
                // a multi-threaded runtime this may run before `spawn` returned).
                over.spawn.store(SPAWNED, std::sync::atomic::Ordering::Release);
                let mut hb = hb;
                let conn = over.conn.clone();
                let released = move || {
                    if let Some(c) = conn {
                        c.release_reads();
                    }
                };
                let wait = crate::smc::handback::PEER_FRAME_WAIT;
                let Some(tcp) = over.tcp.as_deref() else { return };
                let res = crate::smc::handback::exchange(tcp, &mut hb, &copy, released, wait).await;
                if let (Some(c), Some(tcp)) = (over.conn.take(), over.tcp.take()) {
                    c.handback_over(res, tcp);
                }
            },
            self.span.clone(),
        ));
        let ord = std::sync::atomic::Ordering::AcqRel;
        let was = spawn.compare_exchange(SPAWNING, SPAWNED, ord, std::sync::atomic::Ordering::Acquire);
        if was == Err(DROPPED_IN_SPAWN) {
            // The runtime is shutting down and dropped the task unrun: no move, the stream
            // stays as it was, and its caller ends it as one that cannot move.
            tracing::debug!(parent: &self.span, "no move to tcp: the runtime is shutting down");
            if let (Some(before), Some(tcp)) = (st.keepalive_before.take(), st.tcp.as_deref()) {
                before.restore(tcp);
            }
            st.handback = Handback::Smc;
            st.lent = self.voided.swap(0, std::sync::atomic::Ordering::Relaxed);
            return false;
        }
        true
    }

    /// A move read the peer's frame: the peer's stream (its resend of what we had not consumed,
    /// then what it writes next) follows on the TCP socket, and the stream's reads take it there
    /// from now on, while our own resend may still be going out. Reads wait only for the peer's
    /// frame, not for our resend: with both directions full, each side's resend can need the
    /// other side's application to read before it fits in the sockets' buffers, and reads held
    /// for it left both moves waiting on each other for good.
    fn release_reads(&self) {
        let mut st = self.lock();
        if let Handback::Moving(cause) = st.handback {
            self.rx_on_tcp.store(cause_code(cause), std::sync::atomic::Ordering::Release);
            // The peer sends what we did not consume again on TCP, where the reads go now:
            // what a peek showed of it is read there.
            st.peeked = Peeked::default();
            // The peer answered, so its host is there: the probe's bound on unacknowledged
            // data (`probe_peer_host`) would now only cut a resend its application is slow to
            // read, which TCP would wait out, while our application holds the stream (once it
            // let go, the bound stays: `release`).
            if !st.released {
                if let (Some(before), Some(tcp)) = (st.keepalive_before.take(), st.tcp.as_deref()) {
                    before.restore(tcp);
                }
            }
            st.rx_waiters.wake();
        }
    }

    /// The exchange ended: the stream is on TCP, or the connection ends as the result says.
    fn handback_over(&self, res: Result<(), crate::smc::handback::Failure>, tcp: Arc<TcpStream>) {
        use crate::smc::handback::Failure;
        if res.is_err() {
            // A failed move may take in what the link said while it ran: every message the
            // peer published before its end counts, as when its TCP connection ends under SMC
            // (`on_tcp_event`), not only those its group's driver had dispatched by now.
            self.group.drain();
        }
        let mut st = self.lock();
        let Handback::Moving(cause) = st.handback else { return };
        // What the socket needs, first: then the move's hold on it and the connection's go,
        // before anyone can learn that the move is over (`on_tcp`, lock-free), so that the
        // stream's is the only one left and `into_std` on another thread takes the socket.
        match &res {
            Ok(()) => {
                if st.shutdown_after_handback {
                    let _ = socket2::SockRef::from(&*tcp).shutdown(std::net::Shutdown::Write);
                }
                if let Some(before) = st.keepalive_before.take() {
                    // The socket is the application's stream now: its own settings again.
                    before.restore(&tcp);
                }
            }
            // After the peer's frame the stream is the socket's, but our resend did not all go
            // (the socket broke, or the runtime that ran the move ended): the connection is
            // reset now, so that neither side reads a stream with a gap in it, or its clean end.
            Err(_) if self.reads_released() => crate::sys::reset_now(&*tcp),
            // The connection is over for both: the peer learns it when the socket closes (the
            // stream's last holder lets it go), from a reset, whatever failed (a silent peer, a
            // frame that broke the exchange, the socket, the peer gone): what the move was to
            // send again is lost, and a FIN would read, for a peer that moved too, as the clean
            // end of a whole stream.
            Err(_) => crate::sys::set_zero_linger(&tcp),
        }
        drop(tcp);
        Self::drop_tcp(&mut st);
        let counters = &self.group.manager().counters;
        // A peer that may lend (over shared memory, of our uid) may hold bytes of the ring we
        // write into, lent to its application in place, across the move (its count does not
        // wait for them, or the move would wait on the application; a failed move ends without
        // one): that ring is never given back to the group. One ring per move, which is rare.
        // A peer of another uid copies, and RDMA lends nothing: their rings go back.
        st.retire_slot = self.group.link().is_none_or(|l| l.peer_may_lend());
        // A move that failed after the peer's frame came: the peer is on TCP, and the reads may
        // have taken its stream there already, so they stay there (they report the reset made
        // above, or what broke the socket before it); the ring is not read again.
        match res {
            Err(f) if self.reads_released() => {
                tracing::debug!(parent: &self.span, error = ?f, "the move to tcp failed after the peer's frame: reset");
                counters.handback(false);
                st.handback = Handback::Moved;
                self.on_tcp.store(cause_code(cause), std::sync::atomic::Ordering::Release);
            }
            Ok(()) => {
                tracing::debug!(parent: &self.span, %cause, "the connection moved to its tcp socket");
                st.handback = Handback::Moved;
                self.on_tcp.store(cause_code(cause), std::sync::atomic::Ordering::Release);
                counters.handback(true);
            }
            Err(f) => {
                if !matches!(f, Failure::PeerGone { .. }) {
                    // The peer may be alive and still hold the connection (a silent one, one
                    // that broke the exchange, a failed socket under a live process): its
                    // writes into our ring, or its reads of it, may come later, so the slot is
                    // never given to another connection.
                    st.retire_slot = true;
                }
                let err = match f {
                    // Not a move: the peer is gone. What it sent is read from the ring, then the
                    // end TCP would report, as for any peer that goes away.
                    Failure::PeerGone { reset } => ConnError::PeerGone { tcp_reset: reset },
                    Failure::Tcp(e) => ConnError::Tcp(e.kind(), format!("moving the connection to tcp: {e}")),
                    Failure::Protocol(e) => ConnError::Protocol(e.to_string()),
                    Failure::Silent => {
                        let wait = crate::smc::handback::PEER_FRAME_WAIT.as_secs();
                        let e = format!("moving the connection to tcp: the peer's frame did not come within {wait} s");
                        ConnError::Tcp(io::ErrorKind::TimedOut, e)
                    }
                };
                tracing::debug!(parent: &self.span, error = %err.to_io(), "the move to tcp did not happen");
                if !matches!(err, ConnError::PeerGone { .. }) {
                    counters.handback(false);
                }
                st.handback = Handback::Smc;
                // The ring is still read (drained). What the application consumed of the bytes
                // handed out while the move ran was counted for TCP (`tcp_skip`): it is
                // consumed from the ring now, where those bytes still are; the rest of what was
                // handed out is its head again.
                let skipped = self.tcp_skip.swap(0, std::sync::atomic::Ordering::Relaxed);
                if skipped > 0 && st.engine.rx_consume(u32::try_from(skipped).unwrap_or(u32::MAX)).is_ok() {
                    st.inline = None;
                    st.peeked.consume(usize::try_from(skipped).unwrap_or(usize::MAX));
                }
                st.lent = self.voided.swap(0, std::sync::atomic::Ordering::Relaxed);
                // What the peer sent while the move ran (bytes, its close), before it went: the
                // messages folded in meanwhile first (their fault, if one broke the protocol),
                // then those kept.
                if let Some(fault) = st.moving_cdc_fault.take() {
                    st.moving_cdc.clear();
                    self.fail_locked(&mut st, ConnError::Protocol(fault));
                }
                for m in std::mem::take(&mut st.moving_cdc) {
                    if st.error.is_some() {
                        break;
                    }
                    self.apply_cdc(&mut st, &m);
                }
                // A peer that closed in order before it went ends the stream as TCP's FIN does,
                // whatever our frame met on its socket after.
                let err = if st.engine.peer_closed() && !st.engine.peer_aborted() {
                    ConnError::PeerGone { tcp_reset: false }
                } else {
                    err
                };
                st.error.get_or_insert(err);
            }
        }
        // The link's word during a move that went through (or failed after the peer's frame)
        // is void.
        st.moving_cdc = Vec::new();
        st.moving_cdc_fault = None;
        // The link has no more use for the connection: its slot goes back to the group, or is
        // retired (above).
        st.link_down = true;
        st.rx_waiters.wake();
        st.tx_waiters.wake();
        let retire = st.retire_slot;
        drop(st);
        self.group.forget_conn(self.our_token, retire);
        self.handback_over.notify_waiters();
    }

    /// Whether the peer closed (or aborted) the SMC connection, or it failed.
    pub(crate) fn closed_by_peer(&self) -> bool {
        let st = self.lock();
        st.engine.peer_closed() || st.error.is_some()
    }

    /// The TCP connection under this SMC connection became readable: EOF, a reset, or bytes
    /// (which an SMC peer never sends). Unless the peer already closed the SMC connection in
    /// order, that aborts it. Pending CDC messages are taken first, because the peer announces
    /// its close before it closes TCP.
    pub(crate) fn on_tcp_event(&self, res: io::Result<usize>) {
        // Everything the peer published before its TCP connection ended is dispatched first: a
        // live peer announces its close before it lets its TCP socket go, and a dead one
        // published all it ever will.
        if self.lock().handback != Handback::Smc {
            // The exchange reads the socket now.
            return;
        }
        self.group.drain();
        let mut st = self.lock();
        if st.handback != Handback::Smc {
            return;
        }
        if st.tcp_hold.is_some() && !st.engine.peer_closed() {
            // Held for the peer's close, and the peer put its move's frame on the socket or
            // ended it: it is closed as it would have been without the hold, and the peer's
            // exchange meets that end.
            Self::drop_tcp(&mut st);
            return;
        }
        if st.engine.peer_closed() || st.error.is_some() {
            // Closed in order (or ended already): the TCP close follows the SMC one.
            return self.maybe_finish(st);
        }
        match res {
            Ok(n) if n > 0 => {
                // The only bytes a peer puts on the socket under SMC: its handback frame (the
                // exchange checks it). We move too.
                if !self.start_handback(&mut st, HandbackCause::Peer) {
                    tracing::debug!(parent: &self.span, "bytes on the tcp connection under smc");
                    self.fail_locked(&mut st, ConnError::Protocol("bytes on the tcp connection under smc".into()));
                }
            }
            res => {
                tracing::debug!(parent: &self.span, ?res, "tcp connection ended under smc without an smc close");
                // The peer is gone (or stopped speaking SMC): what it sent is still read, then
                // the end TCP would report. The abort tells a peer that is still there that we
                // stopped reading its ring.
                self.fail_locked(&mut st, ConnError::PeerGone { tcp_reset: res.is_err() });
                if self.group.link().is_some_and(|l| l.is_rdma()) {
                    self.expect_abort_answer();
                }
            }
        }
        self.maybe_finish(st);
    }

    /// Aborts a committed connection no stream took (its handshake was cut off after the
    /// commit, or a closed listener's queue held it), and lets it go after a bound if its peer
    /// never answers ([`retire_if_unanswered`](Self::retire_if_unanswered)).
    pub(crate) fn abort_unclaimed(&self) {
        self.release(true, None);
        self.retire_if_unanswered();
    }

    /// A connection aborted before its stream existed (its handshake was cut off after the
    /// commit) waits for the peer's answer before its slot goes back, and the peer may never
    /// answer: the Commit may not have reached it (cut off too), and a peer that never
    /// committed drops an abort for a connection it does not have. Past [`PEER_ANSWER_BOUND`]
    /// unanswered, the connection is forgotten and its slot retired (never used again by the
    /// group, whose memory stays as long as the group does), so the group can go idle.
    /// Without a runtime to time it (a drop outside any), it waits for the group's end.
    fn retire_if_unanswered(&self) {
        self.if_unanswered(|c| {
            tracing::debug!(parent: &c.span, "peer never answered the abort of a connection cut off after its commit");
            c.group.forget_conn(c.our_token, true);
        });
    }

    /// Runs `act` if our abort is still unanswered [`PEER_ANSWER_BOUND`] from now, the
    /// connection's group alive.
    fn if_unanswered(&self, act: impl FnOnce(&SmcConn) + Send + 'static) {
        self.later(PEER_ANSWER_BOUND, |c| {
            let unanswered = !Self::done(&c.lock());
            if unanswered && c.group.is_alive() {
                act(&c);
            }
        });
    }

    /// Over RDMA nothing else says that a peer process died (shared memory has its side
    /// channel; the kernel's SMC-R has LLC test-link messages): a send to a destroyed queue pair
    /// may never complete with an error. A peer that is there answers our abort at once; one
    /// that has not within [`PEER_ANSWER_BOUND`] is taken for gone, and its link group with it,
    /// so the group's slots and registered memory are not held forever.
    fn expect_abort_answer(&self) {
        self.if_unanswered(|c| {
            tracing::warn!(parent: &c.span, "rdma peer never answered an abort: taking its link group for gone");
            c.group.end_on_link_error(LinkError::PeerGone);
        });
    }
}

/// The peer's side of the link went away, and the TCP connection decides whether it moves or
/// died ([`SmcConn::fail_link`]). A process that died has its TCP connection closed by its
/// kernel; a host that died or went silent says nothing on a socket that carries no data under
/// SMC. TCP keepalive asks its kernel, so that such a connection ends (`ETIMEDOUT`) instead of
/// waiting for good: probes from 5 s of silence, every 2 s, 4 unanswered ones end it (about
/// 13 s; a live host's kernel answers at once, whatever its process does). The same 13 s bound
/// unacknowledged data (`TCP_USER_TIMEOUT`, or the socket's own bound if shorter): a move we
/// start ourselves ([`SmcConn::move_unless_told`]) writes its frame, and a frame a silent host
/// never acknowledges would otherwise be retransmitted for a quarter of an hour (`tcp_retries2`)
/// before the connection ends, with no keepalive probe meanwhile. The socket's own settings,
/// returned, go back once the connection moved ([`Keepalive::restore`]); the keepalive of a
/// socket whose application turned it on is left as it is (the bound still applies).
fn probe_peer_host(tcp: &TcpStream) -> Option<Keepalive> {
    let sock = socket2::SockRef::from(tcp);
    let before = Keepalive {
        on: sock.keepalive().ok()?,
        time: sock.tcp_keepalive_time().ok()?,
        interval: sock.tcp_keepalive_interval().ok()?,
        retries: sock.tcp_keepalive_retries().ok()?,
        user_timeout: sock.tcp_user_timeout().ok()?,
    };
    let bound = before.user_timeout.map_or(SILENT_HOST_BOUND, |t| t.min(SILENT_HOST_BOUND));
    // The application's own keepalive probes already; while data is unacknowledged (a move's
    // frame) no probe goes out, so the bound applies whoever probes.
    let set = if before.on {
        sock.set_tcp_user_timeout(Some(bound))
    } else {
        let ka = socket2::TcpKeepalive::new()
            .with_time(std::time::Duration::from_secs(5))
            .with_interval(std::time::Duration::from_secs(2))
            .with_retries(4);
        sock.set_tcp_keepalive(&ka).and_then(|()| sock.set_tcp_user_timeout(Some(bound)))
    };
    if let Err(e) = set {
        tracing::debug!(error = %e, "cannot turn tcp keepalive on to probe the peer's host");
        before.restore(tcp);
        return None;
    }
    Some(before)
}

/// How long a move's data may stay unacknowledged (or, held back by a zero window,
/// untransmitted) before the kernel ends the connection: 5 s + 4 * 2 s, what the keepalive
/// probes of [`probe_peer_host`] take to give up.
const SILENT_HOST_BOUND: std::time::Duration = std::time::Duration::from_secs(13);

/// A TCP socket's keepalive settings.
#[derive(Debug, Clone, Copy)]
struct Keepalive {
    on: bool,
    time: std::time::Duration,
    interval: std::time::Duration,
    retries: u32,
    /// `TCP_USER_TIMEOUT` (`None`: the system's retransmission limit).
    user_timeout: Option<std::time::Duration>,
}

impl Keepalive {
    /// Puts these settings back on `tcp`.
    fn restore(self, tcp: &TcpStream) {
        let sock = socket2::SockRef::from(tcp);
        let ka =
            socket2::TcpKeepalive::new().with_time(self.time).with_interval(self.interval).with_retries(self.retries);
        // Each on its own: one that fails leaves the others to go back.
        let results =
            [sock.set_tcp_keepalive(&ka), sock.set_keepalive(self.on), sock.set_tcp_user_timeout(self.user_timeout)];
        for e in results.into_iter().filter_map(Result::err) {
            tracing::debug!(error = %e, "cannot put the tcp socket's keepalive settings back");
        }
    }
}

/// How long the TCP connection of an RDMA peer whose side of the link went away may stay
/// silent before we move to it ([`SmcConn::fail_link`]): a dead process's kernel closes it
/// within a round trip, half a second before our queue pair gives up on its peer (the retry
/// budget set in `link::verbs`), and the watcher takes that end after at most
/// [`TCP_CLOSE_GRACE_RDMA`] (500 ms), so a peer process that died has always been found dead
/// a second after the link failed. Should the move start first anyway, its frame meets the
/// closed connection, and the connection ends as the watcher would have ended it.
const PEER_WORD_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a connection we let go of waits for its peer to say anything when its TCP socket
/// cannot tell (it was let go already): the kernel's default `net.ipv4.tcp_fin_timeout`, how
/// long an orphaned TCP socket waits for its peer's close.
const ORPHAN_LINGER: std::time::Duration = std::time::Duration::from_secs(60);

/// How long an RDMA peer may take to answer an abort before its link group is taken for gone:
/// the kernel's SMC-R default interval between link tests (`SMC_LLC_TESTLINK_DEFAULT_TIME`, 30 s).
const PEER_ANSWER_BOUND: std::time::Duration = std::time::Duration::from_secs(30);

/// A connection registered during a handshake that has not been handed to the application.
/// Dropping the guard (a failed, abandoned or cancelled handshake) lets it go as far as the
/// handshake got: before the peer could write into it, its slot goes back to the group; once
/// it may (a client's Confirm went out: the server may commit and write), its slot is retired,
/// never used again while the group lives, since over RDMA the peer writes into our memory
/// and a reused slot would take a stale writer's bytes (over shared memory it writes into its
/// own: the peer is sent a close, for an end it may have committed to, and the slot goes
/// back); once committed, it is aborted, as an
/// established connection whose application lets go of it with nothing read, so that the
/// peer reads a reset rather than a clean end (its slot goes back once the peer answers).
#[derive(Debug, Default)]
pub(crate) struct PendingConn(Option<Arc<SmcConn>>, Held);

/// How far a [`PendingConn`]'s handshake got.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Held {
    #[default]
    Open,
    PeerMayWrite,
    Committed,
}

impl PendingConn {
    /// A guard holding `conn`.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn holding(conn: Arc<SmcConn>) -> PendingConn {
        PendingConn(Some(conn), Held::Open)
    }

    /// Takes over the connection `other` holds (releasing any this one held).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn adopt(&mut self, mut other: PendingConn) {
        if let Some(c) = other.take() {
            self.set(c);
        }
    }

    pub(crate) fn set(&mut self, conn: Arc<SmcConn>) {
        self.release();
        self.0 = Some(conn);
    }

    pub(crate) fn get(&self) -> Option<&Arc<SmcConn>> {
        self.0.as_ref()
    }

    /// Hands the connection over (to the stream that takes it from here): the guard no longer
    /// holds it.
    pub(crate) fn take(&mut self) -> Option<Arc<SmcConn>> {
        self.1 = Held::Open;
        self.0.take()
    }

    /// The peer may write into the connection from now on (a client's Confirm is going out).
    pub(crate) fn peer_may_write(&mut self) {
        if self.1 == Held::Open {
            self.1 = Held::PeerMayWrite;
        }
    }

    /// The peer will not write into the connection after all (it declined, as its final word).
    pub(crate) fn peer_will_not_write(&mut self) {
        if self.1 == Held::PeerMayWrite {
            self.1 = Held::Open;
        }
    }

    /// The handshake committed to the connection.
    pub(crate) fn committed(&mut self) {
        self.1 = Held::Committed;
    }

    /// The handshake's Commit did not go out after all: the peer never committed.
    pub(crate) fn not_committed(&mut self) {
        if self.1 == Held::Committed {
            self.1 = Held::Open;
        }
    }

    /// Whether the handshake committed to the connection held.
    pub(crate) fn is_committed(&self) -> bool {
        self.0.is_some() && self.1 == Held::Committed
    }

    /// Lets the connection go now (see the type's docs).
    pub(crate) fn release(&mut self) {
        let held = std::mem::take(&mut self.1);
        let Some(c) = self.0.take() else { return };
        match held {
            Held::PeerMayWrite if c.group().link().is_some_and(|l| l.is_rdma()) => {
                c.group().forget_conn(c.our_token(), true)
            }
            // Our Confirm went out: the server may have committed and handed its end to its
            // application. It is sent our close (its application reads the end of the stream,
            // as from a TCP connect given up after the connection was made), and its slot goes
            // back once its application lets go; said nothing, it read the end from our TCP
            // socket's close alone, and retired the slot after its bound, for the group's life.
            // (An abort where the server's bytes came unread, as TCP resets a socket closed with
            // data unread; nothing, where the CDC ring has no room: the wait for it holds no
            // connection, and the server then holds and retires the slot as before.) Where the
            // server never committed, our close ends its pending end, which it lets go anyway.
            // Over shared memory the peer writes into its own region, never into ours, and
            // reads ours only where our messages say: our slot can go back at once, and the
            // server's answer finds no connection.
            Held::PeerMayWrite => {
                c.release(false, None);
                c.group().unregister(c.our_token());
            }
            Held::Open => c.group().unregister(c.our_token()),
            Held::Committed => c.abort_unclaimed(),
        }
    }
}

impl Drop for PendingConn {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::{register_future, Backoff, Look, WaitClock, LOOKS_PER_CLOCK, MAX_FUTURE_WAKERS, MAX_POLL_BACKOFF};

    /// What a peek took is handed out in order, consumed from the front without moving the
    /// rest, compacted when more is appended past a consumed half, and let go once empty.
    #[test]
    fn peeked_bytes_come_back_in_order_and_go_once_consumed() {
        let mut p = super::Peeked::default();
        p.extend(b"abcd");
        p.extend(b"efgh");
        assert_eq!(p.bytes(), b"abcdefgh");
        p.consume(3);
        assert_eq!((p.bytes(), p.head), (&b"defgh"[..], 3), "consumed from the front, not moved");
        p.extend(b"ij");
        assert_eq!((p.bytes(), p.head), (&b"defghij"[..], 3), "under half consumed: appended");
        p.consume(2);
        p.extend(b"k");
        assert_eq!((p.bytes(), p.head), (&b"fghijk"[..], 0), "half or more consumed: compacted");
        p.consume(100);
        assert!(p.is_empty());
        assert_eq!(p.buf.capacity(), 0, "let go once empty");
    }

    /// The probe of a peer's host turns keepalive on with its own timing and hands back the
    /// socket's settings, which go back on as they were; a socket whose application turned
    /// keepalive on is left alone.
    #[tokio::test]
    async fn probing_a_peer_host_puts_the_sockets_keepalive_back() {
        use std::time::Duration;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let _s = l.accept().await.unwrap();
        let sock = socket2::SockRef::from(&c);
        let settings = |sock: &socket2::SockRef<'_>| {
            (
                sock.keepalive().unwrap(),
                sock.tcp_keepalive_time().unwrap(),
                sock.tcp_keepalive_interval().unwrap(),
                sock.tcp_keepalive_retries().unwrap(),
                sock.tcp_user_timeout().unwrap(),
            )
        };
        // An application's own bound on unacknowledged data, longer than the probe's, which
        // replaces it for a while.
        sock.set_tcp_user_timeout(Some(Duration::from_secs(20))).unwrap();
        let before = settings(&sock);
        assert!(!before.0, "a new socket does not keep alive");
        let saved = super::probe_peer_host(&c).expect("probes");
        assert_eq!(
            settings(&sock),
            (true, Duration::from_secs(5), Duration::from_secs(2), 4, Some(Duration::from_secs(13)))
        );
        saved.restore(&c);
        assert_eq!(settings(&sock), before);

        // The application's own keepalive is left as it is; unacknowledged data is bounded
        // all the same, by the shorter of the two bounds.
        let ka = socket2::TcpKeepalive::new().with_time(Duration::from_secs(30));
        sock.set_tcp_keepalive(&ka).unwrap();
        sock.set_tcp_user_timeout(Some(Duration::from_secs(7))).unwrap();
        let mine = settings(&sock);
        let saved = super::probe_peer_host(&c).expect("bounds");
        assert_eq!(settings(&sock), mine, "the application's 7 s are shorter");
        saved.restore(&c);
        assert_eq!(settings(&sock), mine);
        sock.set_tcp_user_timeout(None).unwrap();
        let mine = settings(&sock);
        let saved = super::probe_peer_host(&c).expect("bounds");
        assert_eq!(settings(&sock), (mine.0, mine.1, mine.2, mine.3, Some(Duration::from_secs(13))));
        saved.restore(&c);
        assert_eq!(settings(&sock), mine);
    }

    /// A connection let go of with bytes its peer has not read waits for the peer's answer
    /// from the release on, and from each message of the peer's that says it read a tenth of
    /// the ring more, or all of it; a message that says less (nothing, only flags, a byte)
    /// does not keep it.
    #[tokio::test]
    async fn a_released_connection_waits_longer_for_a_reader_not_for_empty_messages() {
        use std::sync::Arc;
        use std::time::Duration;

        use crate::proto::cdc::{CdcFlags, CdcMsg};
        use crate::proto::cursor::{Cursor, RingSize};
        use crate::smc::group::{GroupTimes, LinkGroup, Role, TxRmbs};

        let manager = crate::smc::manager::Manager::new(Arc::default(), Arc::new(crate::config::RmbBudget::new()));
        let times = GroupTimes { idle_timeout: Duration::from_secs(60), poll_window: Duration::ZERO };
        let group = LinkGroup::new(7, Role::Client, TxRmbs::shm(4, 4096, 4096), times, manager);
        let ring = RingSize::new(4096).unwrap();
        let conn = super::SmcConn::new(group, 1, Some(2), ring, ring, &crate::config::ShmConfig::default());
        {
            let mut st = conn.lock();
            st.engine.tx_commit(1000).unwrap();
            let sent = st.engine.poll_cdc().unwrap();
            st.engine.on_cdc_sent(&sent);
        }
        conn.release(false, None);
        let since = || conn.lock().lingering.expect("waits for the peer's answer");
        let released = since();
        let mut seq = 0;
        let mut from_peer = |cons: u32, flags: CdcFlags| {
            seq += 1;
            let mut m = CdcMsg::new(seq, 1);
            m.cons = Cursor::new(0, cons);
            m.flags = flags;
            m
        };
        for (msg, what) in [
            (from_peer(0, CdcFlags::empty()), "an empty message"),
            (from_peer(0, CdcFlags::CONS_CURS_UPD_REQ), "a request for our cursor"),
            (from_peer(0, CdcFlags::WRITE_BLOCKED), "a blocked writer's"),
            (from_peer(1, CdcFlags::empty()), "a byte read"),
            (from_peer(408, CdcFlags::empty()), "less than a tenth of the ring read in all"),
        ] {
            std::thread::sleep(Duration::from_millis(2));
            conn.on_cdc(&msg);
            assert_eq!(since(), released, "{what} kept the connection");
        }
        // A tenth of the 4 KiB ring (409 bytes) read since the release, in small reads.
        std::thread::sleep(Duration::from_millis(2));
        conn.on_cdc(&from_peer(409, CdcFlags::empty()));
        let read = since();
        assert!(read > released, "a tenth of the ring read did not keep it");
        std::thread::sleep(Duration::from_millis(2));
        conn.on_cdc(&from_peer(409, CdcFlags::empty()));
        conn.on_cdc(&from_peer(817, CdcFlags::empty()));
        assert_eq!(since(), read, "less than a tenth more kept it");
        // The rest, less than a tenth: everything read.
        std::thread::sleep(Duration::from_millis(2));
        conn.on_cdc(&from_peer(1000, CdcFlags::empty()));
        assert!(since() > read, "everything read did not keep it");
    }

    /// Readiness futures dropped before their wake leave their wakers in the list; it never
    /// holds more than [`MAX_FUTURE_WAKERS`]: one more wakes all it holds (each once, as a
    /// spurious readiness) and starts over. A task already in it is not added twice.
    #[test]
    fn the_wakers_of_readiness_futures_stay_bounded() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::task::{Wake, Waker};

        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let tasks: Vec<Arc<Count>> = (0..MAX_FUTURE_WAKERS + 5).map(|_| Arc::new(Count(AtomicUsize::new(0)))).collect();
        let mut list = Vec::new();
        for t in &tasks[..MAX_FUTURE_WAKERS] {
            register_future(&mut list, &Waker::from(t.clone()));
            register_future(&mut list, &Waker::from(t.clone()));
        }
        assert_eq!(list.len(), MAX_FUTURE_WAKERS, "each task once");
        assert!(tasks.iter().all(|t| t.0.load(Ordering::SeqCst) == 0));
        for t in &tasks[MAX_FUTURE_WAKERS..] {
            register_future(&mut list, &Waker::from(t.clone()));
        }
        assert!(list.len() <= MAX_FUTURE_WAKERS);
        assert_eq!(list.len(), 5, "the full list was woken and emptied, the newcomers kept");
        assert!(tasks[..MAX_FUTURE_WAKERS].iter().all(|t| t.0.load(Ordering::SeqCst) == 1));
        assert!(tasks[MAX_FUTURE_WAKERS..].iter().all(|t| t.0.load(Ordering::SeqCst) == 0));
    }

    #[test]
    fn a_missed_spin_makes_the_next_waits_skip_it_and_a_paid_one_ends_that() {
        let mut c = Backoff::default();
        // Spins that see their replies spin on.
        for _ in 0..10 {
            assert!(c.try_now());
            c.paid();
        }
        // Misses back off: 1, 2, 4, ... 64 waits without a spin, then one spin.
        let mut skipped = Vec::new();
        for _ in 0..9 {
            let mut n = 0;
            while !c.try_now() {
                n += 1;
            }
            skipped.push(n);
            c.missed();
        }
        assert_eq!(skipped, [0, 1, 2, 4, 8, 16, 32, 64, 64]);
        // A spin that pays brings the next wait's spin back at once after the backoff.
        while !c.try_now() {}
        c.paid();
        assert!(c.try_now());
        c.missed();
        assert!(!c.try_now(), "one wait skipped after a single miss");
        assert!(c.try_now());
    }

    const US: u64 = 1_000;

    fn clock(budget_us: u64) -> WaitClock {
        WaitClock { budget: budget_us * US, ..WaitClock::default() }
    }

    /// One wait from `t`: polls, or not, until the data comes `after` later (the reader looks
    /// again every microsecond while it polls). Returns whether it polled.
    fn wait(w: &mut WaitClock, t: u64, after: u64) -> bool {
        let polled = w.poll_until(t).is_some();
        let mut now = t;
        while now < t + after && w.poll_until(now).is_some() {
            now += US;
        }
        w.end();
        polled
    }

    #[test]
    fn a_poll_lasts_at_most_the_budget_from_the_wait_start() {
        let mut w = clock(50);
        assert_eq!(w.poll_until(1_000 * US), Some(1_050 * US));
        assert_eq!(w.poll_until(1_030 * US), Some(1_050 * US), "the same deadline");
        assert_eq!(w.poll_until(1_051 * US), None);
        assert_eq!(w.poll_until(1_052 * US), None, "and it stays asleep");
        w.end();
    }

    #[test]
    fn request_response_keeps_polling() {
        let mut w = clock(50);
        for i in 0..1000 {
            assert!(wait(&mut w, i * 100 * US, 5 * US), "wait {i}");
        }
    }

    #[test]
    fn idle_connections_back_off_to_one_poll_in_64_waits() {
        let mut w = clock(50);
        let mut polls = 0;
        let n = 1000;
        for i in 0..n {
            polls += u32::from(wait(&mut w, i * 10_000_000 * US, 5_000_000 * US));
        }
        // 1 + 1 + 1 + 1 + 1 + 1 + 1 polls while the backoff doubles to 64, then one in 65.
        assert!(polls <= 7 + n as u32 / (MAX_POLL_BACKOFF + 1), "{polls} polls");
        assert!(polls >= n as u32 / (MAX_POLL_BACKOFF + 1), "it keeps trying: {polls} polls");
    }

    #[test]
    fn a_successful_try_brings_polling_back_at_once() {
        let mut w = clock(50);
        let mut t = 0;
        // Slow replies: polls fail and the backoff grows.
        for _ in 0..50 {
            wait(&mut w, t, 500 * US);
            t += 1_000 * US;
        }
        assert!(w.tries.backoff >= 32);
        // Fast replies again: at the next try, polling resumes and stays.
        let mut first = None;
        for i in 0..200 {
            if wait(&mut w, t, 5 * US) && first.is_none() {
                first = Some(i);
            }
            t += 1_000 * US;
        }
        let first = first.expect("polling came back");
        assert!(first <= MAX_POLL_BACKOFF as usize, "{first}");
        for _ in 0..100 {
            assert!(wait(&mut w, t, 5 * US));
            t += 1_000 * US;
        }
    }

    #[test]
    fn a_polling_wait_reads_the_clock_at_its_start_and_once_per_looks_per_clock_looks() {
        let mut w = clock(50);
        let reads = std::cell::Cell::new(0u32);
        let now = std::cell::Cell::new(1_000 * US);
        let read = || {
            reads.set(reads.get() + 1);
            now.get()
        };
        let polls = |until: u64| Look { until: Some(until), started: false, yield_cpu: false };
        assert_eq!(w.look(read), Look { started: true, ..polls(1_050 * US) }, "a new wait reads the clock");
        for i in 1..LOOKS_PER_CLOCK {
            assert_eq!(w.look(read), polls(1_050 * US), "look {i}");
        }
        assert_eq!(reads.get(), 1);
        now.set(1_051 * US);
        let sleeps = Look { until: None, started: false, yield_cpu: false };
        assert_eq!(w.look(read), sleeps, "the budget is spent, seen at the next reading");
        assert_eq!(reads.get(), 2);
        assert_eq!(w.look(read), sleeps, "and the wait sleeps without the clock");
        assert_eq!(reads.get(), 2);
        w.end();
        // The failed poll makes the next wait sleep at once; it still reads the clock once.
        assert_eq!(w.look(read), Look { started: true, ..sleeps });
        assert_eq!(reads.get(), 3);
        assert_eq!(clock(0).look(|| unreachable!("off never reads the clock")), sleeps);
    }

    #[test]
    fn a_wait_that_polled_for_a_while_offers_its_cpu_at_each_clock_reading() {
        let mut w = clock(50);
        let now = std::cell::Cell::new(1_000 * US);
        assert!(w.look(|| now.get()).started);
        let mut yields = Vec::new();
        // One look per microsecond: the clock is read at looks 8, 16, 24, ...
        for i in 1..=40u64 {
            now.set((1_000 + i) * US);
            let l = w.look(|| now.get());
            assert!(l.until.is_some(), "look {i} polls");
            if l.yield_cpu {
                yields.push(i);
            }
        }
        // A round trip's wait (under 5 us) never yields; past 5 us, every clock reading does.
        assert_eq!(yields, vec![8, 16, 24, 32, 40]);
        w.end();
        let mut w = clock(50);
        now.set(0);
        w.look(|| now.get());
        for i in 1..LOOKS_PER_CLOCK as u64 {
            now.set(i * 500);
            assert!(!w.look(|| now.get()).yield_cpu);
        }
        now.set(4 * US);
        assert!(!w.look(|| now.get()).yield_cpu, "4 us into the wait: no yield");
    }

    #[test]
    fn off_never_polls() {
        let mut w = clock(0);
        assert!(!wait(&mut w, 5, 10));
        assert_eq!(w.poll_until(100), None);
    }
}
