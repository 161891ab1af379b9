//! The door: same-host SMC, negotiated beside the connection, before and while it is accepted.
//!
//! The kernel's SMC signals intent with a TCP option on the SYN, which a plain server ignores.
//! User space cannot touch the SYN, and a first in-band message would reach a plain server as
//! garbage. So on one host the whole negotiation travels beside the connection instead, and
//! the TCP stream of an SMC-D connection never carries a byte of it:
//!
//! 1. Each [`SmcListener`](crate::SmcListener) binds an abstract `SOCK_SEQPACKET` socket, its
//!    door, named after the address it listens on ([`base_name`]; abstract names live in the
//!    network namespace, which is the same-host boundary that matters).
//! 2. A client about to connect to an address looks for that door. The first time (per
//!    context, door and runtime) it connects to it and checks that its owner is a uid it
//!    trusts (`SO_PEERCRED`); the door connection then stays open ([`ClientDoors`]) and carries
//!    every later registration and handshake to that listener, each under an id of its own.
//!    A registration names the client's TCP socket (bound to a port of its choosing) by its
//!    kernel cookie and port, and carries its CLC Proposal; then the client connects.
//! 3. When the listener accepts a connection, it looks the peer's port up among the
//!    registrations (reading the door connections first if it is not there yet: the
//!    registration was sent before the client's SYN, so it is queued by then). Registered: the
//!    CLC handshake continues on that door connection under the registration's id (Accept or
//!    Decline, Confirm, Commit). Not registered: a plain client, handed to the application at
//!    once, with no peek and no timer.
//!
//! What proves a registration belongs to the connection: the kernel's own record of the
//! connection's client end, asked by its four-tuple (`sock_diag`, [`sys::TcpDiag`]). The
//! registration matches only if that socket's cookie is the one registered and its owner is the
//! uid of the door connection that registered it: a client can claim only a connection made
//! from a socket of its own uid, the very socket it named. At most one socket has a given
//! four-tuple, and a cookie names one socket for the kernel's lifetime, so no two registrations
//! fit one connection. Both ends check each other's uid once, when the door connection opens: a
//! process squatting on a door's name, or knocking on a door, gets nothing unless it runs as the
//! same (or an allowed) uid, and the worst it can do is make connections fall back to TCP. No
//! descriptor crosses a door: the door connections refuse them, and any that arrive anyway are
//! closed off the runtime ([`PeerFd`]).
//!
//! A Cancel frame is the client's cancel: a client that stops waiting for the server's first
//! answer sends one and uses the connection as TCP; the server, finding the registration
//! cancelled (or its door connection closed) before or during the handshake, serves the
//! connection as TCP too. Only after its Confirm does a client wait for the server's final word
//! (Commit or Decline), which the server always sends before it lets the registration go.
//!
//! The messages on a door connection carry [`DoorFrame`]s, whose format is in
//! [`proto::door`](crate::proto::door): what a connection's users say in one turn of the
//! runtime goes out together, in one message ([`outbox`]).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Semaphore;

use crate::config::{GlobalSettings, Overrides};
use crate::handshake::Wire;
use crate::hash::Map as HashMap;
use crate::proto::clc::{ClcMessage, Decline, DeclineReason, Secret};
use crate::proto::door as proto_door;
use crate::proto::door::{frames, ConnectedTuple, DoorFrame, DoorKind, RegisterHead, DOOR_MSG_MAX, DOOR_VERSION};
pub(crate) use crate::smc::ClientIdentity;
use crate::stats::Counters;
use crate::sys::{self, PeerCred, PeerFd};

mod outbox;
use outbox::{Outbox, Taken, Work};

/// Doors one address can have: the listeners of one `SO_REUSEPORT` group each bind the lowest
/// free index, and a client registers with every door it finds. Sixteen covers a worker per
/// core on common servers; later listeners in a larger group serve TCP only.
const MAX_DOORS: u32 = 16;

/// How long a server keeps a registration whose connection has not arrived. A client waits for
/// its verdict for its handshake timeout (2 s by default) after the connect, then cancels; a
/// registration older than this has been cancelled, or its client misbehaves.
const ENTRY_TTL: Duration = Duration::from_secs(30);

/// How long a registration whose connection a solo door saw (`Door::verify`; its handshake
/// then committed, declined, or is still on) is kept at the most while the kernel still holds
/// our end of that connection, unaccepted: the listener takes no connection
/// from the kernel while its application does not accept (its ready queue is full), and
/// dropping the registration then handed a connection committed to shared memory out as TCP
/// later. Ten times [`ENTRY_TTL`]: past five minutes in the kernel's queue a client has long
/// given up.
const VERIFIED_TTL: Duration = Duration::from_secs(300);

/// How often the sweep asks the kernel whether our ends of connections kept for
/// [`VERIFIED_TTL`] are still there, and of how many at most each time (past that, they wait
/// for a later look): a connection reset in the queue lets its registration go within seconds,
/// at a bounded cost per second.
const VERIFIED_LOOK_EVERY: Duration = Duration::from_secs(1);
const VERIFIED_LOOKS: usize = 256;

/// Registrations a door holds at once, at most; beyond it, new ones are answered "congested"
/// at once. A registration costs no descriptor, only its entry and its Proposal (about 200
/// bytes): 16 384 hold the registrations of 10 000 clients connecting at once with room to spare,
/// in about 4 MiB.
const MAX_REGISTRATIONS: usize = 16_384;

/// Registrations one door connection may have filed at once: four of a client's windows
/// ([`WINDOW`] registrations in flight at most). A registration stays filed after its answer
/// until its connection is accepted, so a client of a listener whose application stops
/// accepting can reach the bound; its next registrations are then refused as congested at once,
/// and the listener hands their connections out as plain clients' (so are those of Cancels
/// that found no room, whose registrations wait out [`ENTRY_TTL`]). One trusted connection could
/// otherwise file all of [`MAX_REGISTRATIONS`] and have every other client's answered
/// "congested".
const CONN_REGISTRATIONS: usize = 4 * WINDOW;

/// Door connections a door holds at once (each is one descriptor; one per client process,
/// runtime and context), at most; also at most a quarter of the process's descriptor limit
/// ([`conn_budget`]): a flood of door connections costs the server some of its descriptors,
/// never all of them. 4096 is the door's listen backlog.
const MAX_CONNS: usize = 4096;

// The shares of the door connections ([`conn_budget`]) and registrations that the clients of
// uids other than the listener's own may hold ([`uid_share`]). With
// other uids trusted (`SMC_TOKIO_SHM_ALLOW_UIDS`), one of them that opens door connections
// without end (one per process, runtime and context of its clients) would otherwise take them
// all, and every other client's connections would go plain.
use crate::smc::manager::{uid_share, UidShare};

/// Door connections taken from the door's queue per drain: a flood of knocks is worked off a
/// batch at a time, between which the listener takes TCP connections.
const DRAIN_BATCH: usize = 256;

/// Frames the listener task reads from the door connections per turn, in all (each gets at
/// most [`READ_MAX`] of them, from where the last turn's ran out; a message is read whole, so a
/// turn may take up to 63 frames more): a turn that read every ready
/// door connection to its bound took over 100 ms on the 2-vCPU VM with 300 door connections
/// kept full, and a current-thread runtime looks at its I/O only every 61 turns of its tasks,
/// so a connect to the listener waited 8 s for its own completion. Four times the most one
/// connection gets in a turn.
pub(crate) const TURN_READS: usize = 4 * READ_MAX;

/// Frames the look-ups of accepted connections read from the door per turn of the listener
/// task, in all, for registrations they have not seen yet (one sent before its connection's
/// SYN is queued somewhere in the door). As many as registrations the door holds
/// ([`MAX_REGISTRATIONS`]): past that, what is queued is not registrations waiting for these
/// connections but clients sending without pause, and a connection whose registration is not
/// found is handed out as TCP (noted as missed). Without a bound in all, each plain
/// connection's look-up read every door connection up to [`READ_MAX`] frames, up to 17
/// times over: 300 door connections kept full made every accept take seconds.
const LOOKUP_READS: usize = MAX_REGISTRATIONS;

/// Door connections the look-ups of one turn of the listener task (and of each application
/// `accept` that takes a connection from the kernel itself) accept and refuse, in all: one
/// batch, as the listener's own drain takes per turn. Any local user may knock on the door (a
/// knock is accepted to read its credentials, then closed unless trusted): without a bound, a
/// flood of knocks made each plain connection's look-up accept up to 17 batches, 4 352 door
/// connections, before its accept went on. Connections kept (trusted, within
/// [`conn_budget`]) do not count: they are accepted once, and the budget bounds them. Once the
/// refusals are spent, look-ups accept nothing more in the turn (the next knock may be
/// anyone's), and a registration behind them is not found: its connection is TCP (noted as
/// missed), as one behind too many frames.
const LOOKUP_REFUSALS: usize = DRAIN_BATCH;

/// Frames read from one door connection per turn: four windows of a client's registrations
/// (`WINDOW`, 64) and their answers. A client that sends without pause (two threads sending
/// Cancels, say) no longer keeps the listener task, and the door's lock, to itself.
const READ_MAX: usize = 256;

/// Frames one registration's inbox holds unread. A handshake takes at most two from its peer
/// (an answer, then a final word; a Confirm, or a Decline); a third is out of protocol, and a
/// peer that went on sending under one id while its handshake was not reading (waiting for a
/// slot, for the connection to be established) would otherwise be held in memory whole.
const INBOX_MAX: usize = 4;

/// What a read of a door connection came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Its queue is empty.
    Empty,
    /// [`READ_MAX`] frames were read; more may wait.
    More,
    /// It closed or broke the protocol, and was ended.
    Ended,
}

/// Connections handed out as plain TCP while the door could not be read to the end (out of
/// descriptors, or a flood of knocks ahead), remembered so that a registration for one, read
/// later, is never committed ([`Door::verify`]), for as long as a registration waits
/// ([`ENTRY_TTL`]): when each client port last had one, in a table of every port (made at the
/// first). Nothing pushes an entry out: a list of four-tuples as long as the door's
/// registrations let a burst of plain connections (any local user's) push a connection out
/// within its client's handshake timeout, and its registration, read then, committed the
/// connection the application had as TCP (the client wrote into a ring nobody read). A port
/// stands for every address's connection from it: a client on a port that missed recently
/// is declined its commit, and stays TCP.
#[derive(Default)]
struct Missed {
    /// Seconds since `epoch`, plus one, when each port last missed (0: never); `None` until
    /// a miss (256 KiB), and again once the last one is older than [`ENTRY_TTL`].
    at: Option<Box<[u32]>>,
    /// When the last miss was (as in `at`).
    last: u32,
    epoch: Option<Instant>,
}

impl Missed {
    /// The door's clock, in whole seconds since the first miss, plus one.
    fn now(&mut self) -> u32 {
        let epoch = *self.epoch.get_or_insert_with(Instant::now);
        u32::try_from(epoch.elapsed().as_secs()).unwrap_or(u32::MAX - 1) + 1
    }

    fn note(&mut self, port: u16) {
        let now = self.now();
        self.at.get_or_insert_with(|| vec![0; 1 << 16].into_boxed_slice())[usize::from(port)] = now;
        self.last = now;
    }

    /// Whether a connection from `port` was handed out as TCP within [`ENTRY_TTL`] (give or
    /// take the clock's second).
    fn recently(&mut self, port: u16) -> bool {
        self.expire();
        let Some(at) = self.at.as_ref().map(|t| t[usize::from(port)]) else { return false };
        at != 0 && u64::from(self.now() - at) <= ENTRY_TTL.as_secs()
    }

    /// Gives the table back once every entry in it is older than [`ENTRY_TTL`] (looked at
    /// here, at each `verify` and at each sweep).
    fn expire(&mut self) {
        if self.at.is_some() && u64::from(self.now() - self.last) > ENTRY_TTL.as_secs() {
            self.at = None;
        }
    }
}

/// How long a client keeps a door connection that no registration uses: a client that
/// connects again within it registers with one message. Ten seconds covers the pauses of
/// connection-per-request clients; an idle door connection costs one descriptor on each side.
const CLIENT_IDLE: Duration = Duration::from_secs(10);

/// How long a sender waits for room on a door connection whose queue is full before it gives up
/// on SMC for that connection: half the default handshake timeout, so a registration that
/// waited still has time for its handshake. The window ([`WINDOW`]) and the pool
/// ([`CLIENT_POOL`]) keep a reading peer's queue short, so a full queue means a peer that
/// stopped reading (none was met at 10 000 connection-per-request clients, `smcperf crr`).
const SEND_WAIT: Duration = Duration::from_secs(1);

/// The first wait before a door message that found the queue full is tried again: a peer
/// that reads frees room within a turn of its runtime.
const SEND_RETRY_FIRST: Duration = Duration::from_millis(1);

// A message's frames have at least three quarters of the wait (`outbox::GATHER_MAX`).
const _: () = assert!(outbox::GATHER_MAX.as_nanos() * 4 <= SEND_WAIT.as_nanos());

/// The longest wait between two tries of one door message: about 20 tries in [`SEND_WAIT`].
const SEND_RETRY_MAX: Duration = Duration::from_millis(64);

/// Registrations a client keeps open on one door connection at once. Each draws at most two
/// answers from the server (its Accept or "no", then its Commit or Decline), so the server's
/// end of a door connection never has more than 128 answers queued for a client that reads
/// it, and never finds it full: its send buffer ([`DOOR_SNDBUF`]) holds about 180 answers of
/// the longest kind and 500 of the usual 100-byte ones (the test
/// `a_window_of_answers_fits_the_send_buffer` checks the first). A client with more
/// handshakes in flight opens another door connection ([`CLIENT_POOL`]).
const WINDOW: usize = 64;

/// Door connections a client keeps to one door from one runtime, at most: [`WINDOW`] times
/// this many registrations in flight, 1024, the listener's default handshake slots and listen
/// backlog. A connection beyond them waits in line for room ([`Room::wait`]) before it
/// connects, in our queue instead of the listener's SYN queue: with 10 000 clients connecting
/// at once, letting all of them register made their connects overflow the listener's backlog
/// (SYNs dropped, connects of 1 to 7 s, the handshakes waiting on them holding every slot: 16%
/// of connections over SMC-D), and sending the excess to TCP at once did the same (4%).
const CLIENT_POOL: usize = 16;

/// How long the line for room on a pool of door connections may stand still (no registration
/// on it ending) before a connection waiting in it connects as plain TCP: as long as a sender
/// waits for room on one ([`SEND_WAIT`]). A line that moves is waited in for up to the
/// connection's handshake timeout: with 10 000 clients connecting at once, each waits its turn
/// for about 0.7 s on this project's 2-CPU test machine (the listener takes 12 000 connections
/// a second), and a fixed one-second wait sent 35-40% of them to TCP, whose connects then
/// waited out SYN retransmits instead (smcperf crr, 10 000 clients).
const ROOM_WAIT: Duration = SEND_WAIT;

/// The send buffer asked for on the server's end of a door connection. The kernel caps it at
/// `net.core.wmem_max` (212 992 by default) and doubles it (socket(7)): at least 416 KiB,
/// twice the default, so that a [`WINDOW`] of answers fits whatever their length.
const DOOR_SNDBUF: libc::c_int = 256 * 1024;

/// Asks for [`DOOR_SNDBUF`] on one end of a door connection; where the kernel refuses, the
/// default serves, with less margin.
fn widen_send_buffer(fd: BorrowedFd<'_>) -> io::Result<()> {
    sys::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &DOOR_SNDBUF)
}

/// How many door connections a door may hold (see [`MAX_CONNS`]).
fn conn_budget() -> usize {
    let quarter = sys::nofile_limit().map_or(MAX_CONNS as u64, |n| n / 4);
    usize::try_from(quarter).unwrap_or(MAX_CONNS).clamp(16, MAX_CONNS)
}

/// The door names of a listener on `addr`, without the index: `smc-tokio/d4/127.0.0.1:8080`,
/// `smc-tokio/d4/[::]:8080`.
pub(crate) fn base_name(addr: SocketAddr) -> String {
    format!("{}{}", door_prefix(), sys::unmap(addr))
}

/// What every door name of this door version begins with: `smc-tokio/d4/`.
fn door_prefix() -> String {
    format!("smc-tokio/d{DOOR_VERSION}/")
}

fn door_name(base: &str, index: u32) -> Vec<u8> {
    format!("{base}/{index}").into_bytes()
}

/// The door of a listener without `SO_REUSEPORT` (so without siblings): a client that finds a
/// trusted door here looks no further, which saves it a failed probe per connection.
fn solo_name(base: &str) -> Vec<u8> {
    format!("{base}/solo").into_bytes()
}

/// A buffer for one door message: a byte more than the longest, so that a longer message,
/// truncated to it, is still found too long. Kept by each reader (the listener's door state, a
/// client's reader task) and reused.
fn message_buffer() -> Box<[u8]> {
    vec![0u8; DOOR_MSG_MAX + 1].into_boxed_slice()
}

/// One door message read without blocking, into `buf` ([`message_buffer`]), and checked whole:
/// its frames. `Ok(None)`: the peer closed. A message that is not 1 to
/// [`DOOR_BATCH_FRAMES`](proto_door::DOOR_BATCH_FRAMES) whole frames is `InvalidData`; so is
/// one that came with descriptors (door connections refuse them where the kernel can; before
/// Linux 6.16 a peer can still send them): it is left queued, none is taken into this
/// process, and the caller ends the connection ([`sys::recv_without_fds`]). `inert`: the
/// socket refuses descriptors since it was made ([`PeerFd::inert`]).
fn recv_message<'b>(
    conn: BorrowedFd<'_>,
    inert: bool,
    buf: &'b mut [u8],
) -> io::Result<Option<proto_door::Frames<'b>>> {
    let (n, flags) = sys::recv_without_fds(conn, buf, 0, inert)?;
    if flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "a door message longer than any"));
    }
    if n == 0 {
        return Ok(None);
    }
    frames(&buf[..n]).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A door connection's socket as both ends send on it: the socket, what it has to send
/// (gathered by turn of the runtime, [`send_loop`]), and the counters of the door messages
/// sent. Its outbox closes with it.
struct DoorSocket {
    fd: AsyncFd<PeerFd>,
    outbox: Arc<Outbox>,
    counters: Arc<Counters>,
}

impl DoorSocket {
    /// Queues the frame `encode` appends to go with the turn's others: the number of the
    /// message it went into ([`Outbox::push`], stamped with the time now).
    fn push(&self, encode: impl FnOnce(&mut Vec<u8>)) -> io::Result<u64> {
        self.outbox.push(tokio::time::Instant::now(), encode)
    }
}

impl Drop for DoorSocket {
    fn drop(&mut self) {
        self.outbox.close();
    }
}

/// What a door connection's sender needs of it (see [`send_loop`]).
trait Sender: Send + Sync + 'static {
    fn socket(&self) -> &DoorSocket;
    /// A message could not be sent (see [`send_loop`]).
    fn send_failed(&self, e: &io::Error);
}

/// Sends the frame `encode` appends on `conn`, and resolves once it went out (or could not).
/// `alone`: its author's registration is the only one open on the connection, so no other
/// task has a frame to add to its message: it goes out at once ([`Outbox::send_now`]),
/// unless frames are queued before it. Otherwise it goes with the turn's others.
async fn send_frame<C: Sender>(conn: &C, alone: bool, encode: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
    match queue_frame(conn.socket(), alone, encode)? {
        None => Ok(()),
        Some(n) => conn.socket().outbox.over(n).await,
    }
}

/// The first half of [`send_frame`], without waiting: `Ok(None)` when the frame went out at
/// once (counted), `Ok(Some(n))` when it waits in message `n` of the outbox.
fn queue_frame(sock: &DoorSocket, alone: bool, encode: impl FnOnce(&mut Vec<u8>)) -> io::Result<Option<u64>> {
    if !alone {
        return sock.push(encode).map(Some);
    }
    let now = tokio::time::Instant::now();
    let sent = sock.outbox.send_now(now, encode, |m| sys::send_msg(sock.fd.get_ref().as_fd(), m))?;
    if sent.is_none() {
        sock.counters.door_message(1);
    }
    Ok(sent)
}

/// The sender of one door connection: sends what its [`Outbox`] gathers, one message at a
/// time, in order, each waiting for room as [`send_waiting`] does, until the connection is
/// gone or it can send no more (a message found no room, or the outbox overflowed: then
/// `conn`'s [`Sender::send_failed`] says what follows). On a multi-threaded runtime it yields
/// once before it looks: a task woken from a worker runs next there, before the other tasks of
/// the turn have added their frames. Counts the frames and messages it sent.
async fn send_loop<C: Sender>(sender: SenderOf<C>) {
    let SenderOf { outbox, conn, .. } = &sender;
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    loop {
        match std::future::poll_fn(|cx| outbox.poll_work(cx)).await {
            Work::Send => {}
            Work::Closed => return,
            Work::Broken(kind) => {
                if let Some(conn) = conn.upgrade() {
                    sender.fail(&conn, &kind.into());
                }
                return;
            }
        }
        if multi {
            tokio::task::yield_now().await;
        }
        // Gone: the outbox is abandoned as this returns (`SenderOf`).
        let Some(conn) = conn.upgrade() else { return };
        while let Some(Taken { n, bytes, frames, born }) = outbox.take() {
            let r = send_waiting(&conn.socket().fd, &bytes, born + SEND_WAIT).await;
            if r.is_ok() {
                conn.socket().counters.door_message(frames);
            }
            outbox.sent(n, r.as_ref().err().map(io::Error::kind), bytes);
            if let Err(e) = r {
                sender.fail(&conn, &e);
                return;
            }
        }
    }
}

/// A sender's hold on its outbox and its connection: however the sender ends (its task
/// dropped with its runtime, also before it first ran, or mid-send), the outbox is abandoned
/// ([`Outbox::abandon`]), so that no author waits for a message nobody will send, and the
/// connection, if it lives on, can send no more ([`Sender::send_failed`]): frames nobody waits
/// for (a server's "no" answers) are lost with the outbox, and the peer reads the end instead
/// of waiting out its handshakes for them. Every other end of a sender has said so already, or
/// its connection is gone.
struct SenderOf<C: Sender> {
    outbox: Arc<Outbox>,
    conn: Weak<C>,
    /// The connection was told already (or is gone).
    told: AtomicBool,
}

impl<C: Sender> SenderOf<C> {
    fn new(outbox: Arc<Outbox>, conn: Weak<C>) -> SenderOf<C> {
        SenderOf { outbox, conn, told: AtomicBool::new(false) }
    }

    /// Tells the connection that it can send no more, once.
    fn fail(&self, conn: &C, e: &io::Error) {
        if !self.told.swap(true, Ordering::Relaxed) {
            conn.send_failed(e);
        }
    }
}

impl<C: Sender> Drop for SenderOf<C> {
    fn drop(&mut self) {
        self.outbox.abandon();
        // Lock-free at both ends (a shutdown, a flag): this may run inside a runtime's drop.
        if let Some(conn) = self.conn.upgrade() {
            self.fail(&conn, &io::Error::new(io::ErrorKind::BrokenPipe, "the door connection's sender went away"));
        }
    }
}

/// Starts `conn`'s sender on `rt`, else on the current runtime. `false` outside of one
/// (nothing would send).
fn start_sender<C: Sender>(outbox: &Arc<Outbox>, conn: &Arc<C>, rt: Option<&tokio::runtime::Handle>) -> bool {
    let Some(rt) = rt.cloned().or_else(|| tokio::runtime::Handle::try_current().ok()) else { return false };
    rt.spawn(send_loop(SenderOf::new(outbox.clone(), Arc::downgrade(conn))));
    true
}

/// Sends one door message, waiting for room when the connection's queue is full until
/// `deadline`, [`SEND_WAIT`] after the message's first frame came (or [`SEND_RETRY_MAX`] after
/// the first try, if that is later), so that no author waits much longer for its frame's fate,
/// however long the messages before it waited (timed from each send's start, a peer that read
/// a message just under every [`SEND_WAIT`] held the author of the eighth queued one for eight
/// of them). Door connections are not watched for room ([`watch`]): a full queue is rare (the
/// window keeps a reading peer's queue short), so the send is tried again after waits that
/// double from [`SEND_RETRY_FIRST`] to [`SEND_RETRY_MAX`]. Each door connection's sender waits
/// on its own, so a registration sent to the 17 doors of a reuseport group waits
/// [`SEND_WAIT`] in all, not once per door.
async fn send_waiting(conn: &AsyncFd<PeerFd>, msg: &[u8], deadline: tokio::time::Instant) -> io::Result<()> {
    let mut pause = SEND_RETRY_FIRST;
    let mut tried = None;
    loop {
        match sys::send_msg(conn.get_ref().as_fd(), msg) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        let now = tokio::time::Instant::now();
        // A message that waited its time out behind others still has retries for the longest
        // pause: a queue found full once is not a peer that stopped reading.
        let deadline = *tried.get_or_insert(deadline.max(now + SEND_RETRY_MAX));
        if now >= deadline {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        tokio::time::sleep_until((now + pause).min(deadline)).await;
        pause = (pause * 2).min(SEND_RETRY_MAX);
    }
}

/// Registers a door connection with the runtime, for reading only. Watched for room too, every
/// message one end read woke the other end's thread (a socket whose peer frees queue space
/// signals it as writable, and an epoll registration that asks for writability hears it): on
/// `smcperf local --scenario http-close`, whose listener thread sleeps between connections,
/// that was a wake-up of the listener's thread per answer its client read.
fn watch(conn: PeerFd) -> io::Result<AsyncFd<PeerFd>> {
    // SAFETY: the PeerFd owns its descriptor and moves into the AsyncFd.
    unsafe { sys::register(conn, Interest::READABLE) }
}

// ----- one registration's messages -------------------------------------------------------------

/// A door message for one registration, as it arrived.
struct Msg {
    kind: DoorKind,
    reason: u8,
    payload: Vec<u8>,
}

/// The messages of one registration: filled by whoever reads its door connection, taken by the
/// handshake that waits for them. Closed when the registration ends (the peer cancelled it or
/// its door connection closed): what was queued before is still read.
#[derive(Default)]
struct Inbox(Mutex<InboxState>);

#[derive(Default)]
struct InboxState {
    frames: VecDeque<Msg>,
    closed: bool,
    waker: Option<Waker>,
}

impl Inbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, InboxState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, m: Msg) {
        let w = {
            let mut st = self.lock();
            if st.closed {
                return;
            }
            if st.frames.len() >= INBOX_MAX {
                // More than any handshake is sent: the peer does not follow the protocol, and
                // this registration ends (TCP) instead of holding whatever the peer sends.
                st.frames.clear();
                st.closed = true;
            } else {
                st.frames.push_back(m);
            }
            st.waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }

    fn close(&self) {
        let w = {
            let mut st = self.lock();
            st.closed = true;
            st.waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }

    /// The next message without waiting: `Some(None)` once closed and empty, `None` when
    /// nothing is there yet.
    fn try_next(&self) -> Option<Option<Msg>> {
        let mut st = self.lock();
        match st.frames.pop_front() {
            Some(m) => Some(Some(m)),
            None if st.closed => Some(None),
            None => None,
        }
    }

    /// Ready when a message is there or the inbox closed; else `cx` is woken when either
    /// happens.
    fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let mut st = self.lock();
        if !st.frames.is_empty() || st.closed {
            return Poll::Ready(());
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    async fn next(&self) -> Option<Msg> {
        loop {
            if let Some(m) = self.try_next() {
                return m;
            }
            std::future::poll_fn(|cx| self.poll_ready(cx)).await;
        }
    }
}

// ----- server --------------------------------------------------------------------------------

/// A listener's door, the door connections of its clients, and the registrations waiting for
/// their connections.
pub(crate) struct Door {
    name: Vec<u8>,
    /// Closed on a closer: the connections in its backlog close with it, with whatever was
    /// queued in them.
    listener: AsyncFd<PeerFd>,
    /// The listener's settings: the uids it trusts are read from them at each drain.
    settings: Overrides,
    /// The base under those settings (the listener's context's).
    base: Arc<GlobalSettings>,
    counters: Arc<Counters>,
    /// Asks the kernel who owns a connection's client end.
    diag: sys::TcpDiag,
    /// A solo door (a listener without reuseport siblings): every connection to its address
    /// comes to this listener, so it answers registrations before their connections arrive.
    solo: bool,
    /// Door connections held at most ([`conn_budget`]).
    conn_budget: usize,
    /// How many verified registrations' connections a sweep asks the kernel about at most
    /// ([`VERIFIED_LOOKS`]; fewer in tests).
    looks_per_sweep: usize,
    /// The runtime the door was opened on (the listener's), where the senders of its door
    /// connections run, whichever runtime's accept took a connection in: a runtime of the
    /// application's that ends does not take them along.
    rt: Option<tokio::runtime::Handle>,
    /// The port the listener listens on.
    listen_port: u16,
    /// The address it listens on, unless it is the wildcard (then any of this host's).
    listen_ip: Option<std::net::IpAddr>,
    /// Which families a wildcard listener receives (IPv4, IPv6): `0.0.0.0` IPv4 only, `::`
    /// both, or IPv6 only with `IPV6_V6ONLY` (then another process may listen on `0.0.0.0` of
    /// the same port, and an IPv4 connection is its, however its client registered here).
    wildcard_receives: (bool, bool),
    /// The door's listener refuses descriptors (`SO_PASSRIGHTS` off, Linux 6.16 and later), and
    /// so does every connection it accepts, from the moment its client connects (the kernel
    /// copies the option, [`sys::refusal_inherited`]): nothing but bytes can be queued in them,
    /// and they are closed in place ([`PeerFd::inert`]), never on a closer.
    inert_conns: bool,
    /// The kernel could not say who owns a connection (no `tcp_diag`): the door closed, and
    /// registrations are answered "no" at once.
    blind: AtomicBool,
    /// Test hook ([`stall_reads_for_test`](Door::stall_reads_for_test)).
    #[cfg(test)]
    stalled: AtomicBool,
    /// Test hook ([`congest_for_test`](Door::congest_for_test)).
    #[cfg(test)]
    congested: AtomicBool,
    /// Door connections read (tests).
    #[cfg(test)]
    conn_reads: AtomicU64,
    state: Mutex<DoorState>,
}

impl fmt::Debug for Door {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Door").field("name", &String::from_utf8_lossy(&self.name)).finish()
    }
}

/// One client's door connection, at the server.
struct ServerConn {
    /// Its socket, with the listener's counters.
    sock: DoorSocket,
    cred: PeerCred,
    /// Its registrations not matched yet: id to the port they are filed under.
    pending: Mutex<HashMap<u64, u16>>,
    /// Its registrations matched to a connection, whose handshakes read their messages here.
    live: Mutex<HashMap<u64, Live>>,
}

/// A registration whose handshake is on ([`ServerConn`]'s `live`).
struct Live {
    /// Where its handshake reads the client's messages.
    inbox: Arc<Inbox>,
    /// An early registration whose connection was accepted (and checked) before its Confirm
    /// came: proven already, which `verify` takes once. Kept in the entry, so that it goes with
    /// the registration whichever way that leaves (its handshake's end, a Cancel, an inbox
    /// flooded shut), and no later registration of the same id can find it.
    accepted_early: bool,
}

impl Live {
    fn new(inbox: Arc<Inbox>) -> Live {
        Live { inbox, accepted_early: false }
    }
}

impl Sender for ServerConn {
    fn socket(&self) -> &DoorSocket {
        &self.sock
    }

    /// An answer we could not send (the client read nothing for [`SEND_WAIT`]): its handshake
    /// goes on as TCP here, and its client must learn so too, even when it confirmed already
    /// and waits for our final word (else it waits a minute and its connection fails).
    /// Shutting the connection down tells it, and every other registration on the connection,
    /// at once.
    fn send_failed(&self, e: &io::Error) {
        tracing::debug!(error = %e, "cannot send on the door connection: ending it");
        self.shut();
    }
}

impl ServerConn {
    /// A door connection accepted from a client with credentials `cred`, its sender started on
    /// `rt` (the listener's runtime; else the current one). `None` outside of a runtime.
    fn start(
        fd: AsyncFd<PeerFd>,
        cred: PeerCred,
        counters: &Arc<Counters>,
        rt: Option<&tokio::runtime::Handle>,
    ) -> Option<Arc<ServerConn>> {
        let outbox = Arc::new(Outbox::default());
        let conn = Arc::new(ServerConn {
            sock: DoorSocket { fd, outbox: outbox.clone(), counters: counters.clone() },
            cred,
            pending: Mutex::default(),
            live: Mutex::default(),
        });
        start_sender(&outbox, &conn, rt).then_some(conn)
    }

    /// The handshake of the registration `id` whose inbox is `inbox` ended: it is no longer
    /// live (and its mark for `verify` goes with its entry). A later registration of the same
    /// id (filed once this one left `live`, by a Cancel say) keeps its own entry.
    fn end_live(&self, id: u64, inbox: &Arc<Inbox>) {
        let mut live = self.live();
        if live.get(&id).is_some_and(|l| Arc::ptr_eq(&l.inbox, inbox)) {
            live.remove(&id);
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u16>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the client "no SMC" for registration `id`, without waiting (it goes out with the
    /// turn's other answers). A client that keeps to its [`WINDOW`] always has room for it; one
    /// whose connection stays full (it stopped reading, or it registers beyond its window) has
    /// the connection shut down instead ([`send_failed`](Sender::send_failed)), which it reads
    /// as "TCP" for this registration and every other open on it, so that none waits out its
    /// handshake timeout for an answer that was lost.
    fn refuse(&self, counters: &Counters, id: u64, kind: DoorKind, reason: DeclineReason) {
        counters.door(crate::stats::DoorEvent::Unmatched);
        counters.decline(reason, crate::proto::handshake::Side::Local);
        let frame = DoorFrame { kind, reason: reason as u8, id };
        if self.sock.push(|b| frame.encode_into(b, &[])).is_err() {
            // The connection stopped sending: shut already.
            self.shut();
        }
    }

    /// Ends the connection for a client that stopped reading it: nothing more is sent on it,
    /// and its client reads what was sent before, then the end. A client takes the end as the
    /// final word of every handshake still open on the connection (TCP), and the listener
    /// does the same: an answer that found no room was never sent, and a handshake that sent
    /// its Commit is settled, since that Commit is read before the end.
    fn shut(&self) {
        // Our own reads see the end once the client closes its side.
        let _ = sys::shutdown(self.sock.fd.get_ref().as_fd(), std::net::Shutdown::Both);
    }
}

struct Entry {
    conn: Arc<ServerConn>,
    id: u64,
    instance: u64,
    /// The cookie of the client's TCP socket: the connection it makes is the one whose client
    /// end has it.
    cookie: u64,
    /// The client's Proposal (a CLC message, at most `CLC_MAX_LEN` bytes).
    proposal: Vec<u8>,
    since: Instant,
    /// Answered before its connection arrived: where the connection goes when it does.
    early: Option<tokio::sync::oneshot::Sender<(tokio::net::TcpStream, SocketAddr)>>,
    /// The connection's four-tuple (peer, local) as its Connected frame named it and the
    /// kernel confirmed it (`verify`): the handshake committed on it. Matching at accept still
    /// asks the kernel (`take`).
    verified: Option<(SocketAddr, SocketAddr)>,
    /// The cookie of our end of that connection, waiting in the listen queue, as `verify` finds
    /// it (a connection is verified only once our end is that full socket). An accepted socket
    /// with it is that connection, whatever became of its client end: a client that wrote,
    /// closed and left `TIME_WAIT` before a late accept is no longer in the kernel's table, and
    /// the four-tuple alone may since be another socket's.
    ours: Option<u64>,
    /// When the sweep last asked the kernel about our end of its connection: those asked
    /// least recently are asked first.
    looked: Option<Instant>,
}

#[derive(Default)]
struct DoorState {
    conns: Vec<Arc<ServerConn>>,
    /// How many of `conns` each uid's clients hold ([`uid_share`]).
    conns_by_uid: HashMap<u32, usize>,
    /// The listener task, which watches the door connections: woken when one is accepted
    /// elsewhere (at a connection's look-up), so that it watches that one too.
    watcher: Option<Waker>,
    /// Registrations to answer before their connections arrive (a solo door's, with a
    /// shared-memory offer), for the listener task to start.
    early: Vec<Registration>,
    /// Registrations by the port the client's socket is bound to.
    entries: HashMap<u16, Vec<Entry>>,
    count: usize,
    /// How many of `count` each uid's clients filed, as `conns_by_uid` counts connections (the
    /// same shares bound them: [`MAX_REGISTRATIONS`]).
    regs_by_uid: HashMap<u32, usize>,
    /// Client ports of connections handed out as plain TCP while the door's queues could not
    /// be read to the end ([`Missed`]).
    missed: Missed,
    /// When the sweep last asked the kernel about connections kept for [`VERIFIED_TTL`].
    verified_looked: Option<Instant>,
    /// The uids the listener's settings allowed when they were last read, and the settings'
    /// version then ([`Door::trusts`]).
    trusted: Option<(u64, Vec<u32>)>,
    /// Where a drain within a budget starts reading the door connections: after the one
    /// where the last one's budget ran out, so that connections that always have more to read
    /// do not keep the same others from being read.
    read_from: usize,
    /// Frames the look-ups of this turn of the listener task read ([`LOOKUP_READS`] in all).
    lookup_reads: usize,
    /// Door connections the look-ups of this turn refused ([`LOOKUP_REFUSALS`] in all).
    lookup_refusals: usize,
    /// Where door connections are read into ([`message_buffer`]; empty until the first read).
    buf: Box<[u8]>,
    /// Every door connection held, to ask which have something queued: a drain reads those
    /// only. (It asked each with a `recv`, so a look-up for a connection that registered
    /// nothing, from a plain client on this host, cost a system call per door connection held.)
    /// Made at the first connection held or look-up; `Off` where it could not be made or a
    /// connection could not be added or the look failed: every connection is read then, and
    /// the set is made again later ([`READY_RETRY`]).
    ready: Ready,
    /// The numbers of the readable ones, as the last look found them.
    ready_fds: Vec<std::os::fd::RawFd>,
}

/// The door connections' [`sys::ReadySet`], and the connections in it by descriptor number.
#[derive(Default)]
enum Ready {
    #[default]
    Unmade,
    Set(ReadyConns),
    /// Failed (a shortage of memory or descriptors, or the user's limit on epoll watches) at
    /// `since`: every connection is read until the set is made again, `wait` later.
    Off {
        since: Instant,
        wait: Duration,
    },
}

/// The door connections in a [`sys::ReadySet`], and by descriptor number.
struct ReadyConns {
    set: sys::ReadySet,
    by_fd: HashMap<std::os::fd::RawFd, Arc<ServerConn>>,
}

impl ReadyConns {
    fn add(&mut self, conn: &Arc<ServerConn>) -> io::Result<()> {
        let fd = conn.sock.fd.get_ref();
        self.set.add(fd.as_fd())?;
        self.by_fd.insert(std::os::fd::AsRawFd::as_raw_fd(fd), conn.clone());
        Ok(())
    }

    fn remove(&mut self, conn: &ServerConn) {
        let fd = conn.sock.fd.get_ref();
        self.set.remove(fd.as_fd());
        self.by_fd.remove(&std::os::fd::AsRawFd::as_raw_fd(fd));
    }
}

/// Places `0..n` in turn from place `from` (modulo `n`) on: where the last read within a budget
/// ran out.
fn in_turn(n: usize, from: usize) -> impl Iterator<Item = usize> {
    let start = if n == 0 { 0 } else { from % n };
    (0..n).map(move |k| (start + k) % n)
}

/// How long after its readiness set first failed the door makes it again; each failure after
/// doubles the wait, up to [`READY_RETRY_MAX`]. A shortage may pass, but a set made again
/// costs an `epoll_ctl` per door connection under the door's lock, and against the user's
/// limit on epoll watches (which other sockets of the process need too) it fails again: once a
/// second at first, as the address list is read where it cannot be watched.
const READY_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two tries of the readiness set (a minute: a persistent failure
/// costs a set's worth of `epoll_ctl` calls a minute).
const READY_RETRY_MAX: Duration = Duration::from_secs(60);

impl Ready {
    /// Whether the set is to be made now, and if so the wait before the next try should this
    /// one fail: the first wait where there is no set yet, twice the last (up to
    /// [`READY_RETRY_MAX`]) where the last try's wait is over; `None` otherwise.
    fn retry_due(&self) -> Option<Duration> {
        match *self {
            Ready::Unmade => Some(READY_RETRY),
            Ready::Off { since, wait } if since.elapsed() >= wait => Some((wait * 2).min(READY_RETRY_MAX)),
            Ready::Off { .. } | Ready::Set(..) => None,
        }
    }
}

impl DoorState {
    /// The door connections, each with its place, from the one where the last read within a
    /// budget ran out on.
    fn rotation(&self) -> Vec<(usize, Arc<ServerConn>)> {
        in_turn(self.conns.len(), self.read_from).map(|i| (i, self.conns[i].clone())).collect()
    }

    /// Whether `budget` is spent; if so, the next read within a budget starts at place `i`.
    fn spent(&mut self, budget: usize, i: usize) -> bool {
        if budget == 0 {
            self.read_from = i;
        }
        budget == 0
    }

    /// Remembers a connection handed out as plain TCP before its registration could be read.
    fn note_missed(&mut self, (peer, _): (SocketAddr, SocketAddr)) {
        self.missed.note(peer.port());
    }

    /// Drops a registration not matched yet; whether there was one.
    /// A registration not matched yet, by its door connection and id: the port it is filed
    /// under, and its entry.
    fn entry_mut(&mut self, conn: &Arc<ServerConn>, id: u64) -> Option<(u16, &mut Entry)> {
        let port = conn.pending().get(&id).copied()?;
        let e = self.entries.get_mut(&port)?.iter_mut().find(|e| e.id == id && Arc::ptr_eq(&e.conn, conn))?;
        Some((port, e))
    }

    fn remove(&mut self, conn: &Arc<ServerConn>, id: u64) -> bool {
        let Some(port) = conn.pending().remove(&id) else { return false };
        let Some(list) = self.entries.get_mut(&port) else { return false };
        let Some(i) = list.iter().position(|e| e.id == id && Arc::ptr_eq(&e.conn, conn)) else { return false };
        list.swap_remove(i);
        if list.is_empty() {
            self.entries.remove(&port);
        }
        self.unfiled(conn.cred.uid);
        true
    }

    /// A registration of a client of `uid` was filed.
    fn filed(&mut self, uid: u32) {
        self.count += 1;
        *self.regs_by_uid.entry(uid).or_default() += 1;
    }

    /// A registration of a client of `uid` is no longer filed.
    fn unfiled(&mut self, uid: u32) {
        self.count -= 1;
        crate::hash::count_down(&mut self.regs_by_uid, &uid);
    }

    /// Whether a client of `uid` may file another registration: the door's bound, and, for a
    /// uid other than the listener's own (`own`), the shares other uids have of it, as of door
    /// connections ([`uid_share`]). With other uids trusted, one of
    /// them whose clients filed registrations without end (each door connection may hold
    /// [`CONN_REGISTRATIONS`], and it may hold a quarter of the connections) had every other
    /// client's answered "congested".
    fn room_to_file(&self, uid: u32, own: u32) -> bool {
        let by = |u: u32| self.regs_by_uid.get(&u).copied().unwrap_or(0);
        self.count < MAX_REGISTRATIONS
            && uid_share(uid, own, by(uid), self.count - by(own), MAX_REGISTRATIONS) == UidShare::Within
    }

    /// Where, in the list filed under the port of `tuple`'s client, the registration whose
    /// handshake saw that connection is (`Some(None)`: none did); `None`: nothing is filed
    /// under that port.
    fn seen_at(&self, tuple: (SocketAddr, SocketAddr)) -> Option<Option<usize>> {
        Some(self.entries.get(&tuple.0.port())?.iter().position(|e| e.verified == Some(tuple)))
    }

    /// Ends a door connection: its registrations are dropped, its handshakes see the end. Not
    /// those whose connections a handshake saw (`Entry::verified`): committed, they wait for
    /// their connections as ever (a client that made one connection closes its idle door
    /// connection after 10 s, before a slow application's accept; dropped, the connection went
    /// out as TCP with its client on shared memory). They hold the connection's descriptor
    /// until then.
    fn close(&mut self, conn: &Arc<ServerConn>) {
        let ids: Vec<u64> = conn.pending().keys().copied().collect();
        for id in ids {
            if self.entry_mut(conn, id).is_some_and(|(_, e)| e.verified.is_some()) {
                continue;
            }
            self.remove(conn, id);
        }
        for (_, l) in conn.live().drain() {
            l.inbox.close();
        }
        if let Ready::Set(ready) = &mut self.ready {
            ready.remove(conn);
        }
        let before = self.conns.len();
        self.conns.retain(|c| !Arc::ptr_eq(c, conn));
        if self.conns.len() < before {
            crate::hash::count_down(&mut self.conns_by_uid, &conn.cred.uid);
        }
    }

    /// Makes the readiness set of the door connections where there is none yet, or where it
    /// failed [`READY_RETRY`] ago or more.
    fn make_ready(&mut self) {
        let Some(next_wait) = self.ready.retry_due() else { return };
        let made = sys::ReadySet::new().and_then(|set| {
            let mut ready = ReadyConns { set, by_fd: HashMap::default() };
            for c in &self.conns {
                ready.add(c)?;
            }
            Ok(Ready::Set(ready))
        });
        self.ready = made.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "no readiness set for the door connections: each is read");
            Ready::Off { since: Instant::now(), wait: next_wait }
        });
    }

    /// Holds `conn`: among the door connections, and in the set of those asked for readiness.
    fn hold(&mut self, conn: Arc<ServerConn>) {
        self.make_ready();
        if let Ready::Set(ready) = &mut self.ready {
            if let Err(e) = ready.add(&conn) {
                tracing::debug!(error = %e, "a door connection left out of the readiness set: each is read");
                self.ready = Ready::Off { since: Instant::now(), wait: READY_RETRY };
            }
        }
        *self.conns_by_uid.entry(conn.cred.uid).or_default() += 1;
        self.conns.push(conn);
    }

    /// The door connections to read, each with its place: those with something queued, as the
    /// readiness set says (and whether it may have left some out), or every one where there is
    /// no set; either way from the place where the last read within a budget ran out on. (The
    /// kernel reports the same ready connections in the same order look after look: without
    /// the turn, connections kept full would spend every budget before the same others.)
    fn readable_conns(&mut self) -> (Vec<(usize, Arc<ServerConn>)>, bool) {
        self.make_ready();
        let Ready::Set(ready) = &self.ready else { return (self.rotation(), false) };
        match ready.set.ready(&mut self.ready_fds) {
            Ok(more) => {
                let conns = in_turn(self.ready_fds.len(), self.read_from)
                    .filter_map(|i| ready.by_fd.get(&self.ready_fds[i]).map(|c| (i, c.clone())));
                (conns.collect(), more)
            }
            Err(e) => {
                tracing::debug!(error = %e, "the door connections' readiness set failed: each is read");
                self.ready = Ready::Off { since: Instant::now(), wait: READY_RETRY };
                (self.rotation(), false)
            }
        }
    }
}

/// A registration matched to an accepted connection; its client waits for the server's answer
/// on the door connection.
pub(crate) struct Registration {
    conn: Arc<ServerConn>,
    id: u64,
    inbox: Arc<Inbox>,
    counters: Arc<Counters>,
    pub(crate) client: ClientIdentity,
    proposal: Vec<u8>,
    /// Answered before its connection arrived: the connection, once it is accepted.
    early: Option<tokio::sync::oneshot::Receiver<(tokio::net::TcpStream, SocketAddr)>>,
}

/// What [`Door::verify`] found of a connection a client confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verified {
    /// The registrant's, and our end of it is the full socket the listener will accept.
    Yes,
    /// Not the registrant's connection (or not to us, or handed out as TCP already).
    No,
    /// The registrant's, but our end is still a request socket (the listen queue full, or the
    /// client's last ACK not taken in yet), or could not be found or asked about now: asked
    /// again, it may become [`Verified::Yes`].
    NotAccepted,
}

/// Names a registration answered before its connection arrived, for the door's checks.
#[derive(Clone)]
pub(crate) struct EarlyKey {
    conn: Arc<ServerConn>,
    id: u64,
}

impl fmt::Debug for EarlyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EarlyKey").field("id", &self.id).finish()
    }
}

/// What a connection's look-up at the door found.
pub(crate) enum Matched {
    /// A registration whose handshake starts now.
    Handshake(Registration),
    /// A registration answered before the connection came: its handshake takes the connection.
    Early(tokio::sync::oneshot::Sender<(tokio::net::TcpStream, SocketAddr)>),
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration").field("client", &self.client).field("id", &self.id).finish()
    }
}

impl Registration {
    /// For a registration answered before its connection arrived: its key and where its
    /// connection will come.
    pub(crate) fn take_early(
        &mut self,
    ) -> Option<(EarlyKey, tokio::sync::oneshot::Receiver<(tokio::net::TcpStream, SocketAddr)>)> {
        let rx = self.early.take()?;
        Some((EarlyKey { conn: self.conn.clone(), id: self.id }, rx))
    }

    /// Tells the client its connection stays TCP (and why): final, it stops waiting at once.
    pub(crate) fn refuse(self, reason: DeclineReason) {
        self.conn.end_live(self.id, &self.inbox);
        self.conn.refuse(&self.counters, self.id, DoorKind::Refused, reason);
    }

    /// The wire the handshake runs over, starting with the client's Proposal. `None` when the
    /// client cancelled first (it stopped waiting and uses the connection as TCP).
    pub(crate) fn open(self) -> Option<ServerWire> {
        if matches!(self.inbox.try_next(), Some(None)) {
            self.conn.end_live(self.id, &self.inbox);
            return None;
        }
        Some(ServerWire {
            conn: self.conn,
            id: self.id,
            inbox: self.inbox,
            proposal: Some(self.proposal),
            connected: None,
        })
    }
}

/// The server's end of a handshake on the door (see [`Wire`]).
pub(crate) struct ServerWire {
    conn: Arc<ServerConn>,
    id: u64,
    inbox: Arc<Inbox>,
    /// The Proposal that came with the registration, until the machine has read it.
    proposal: Option<Vec<u8>>,
    /// The four-tuple the client said its connection has (with its first CLC message).
    connected: Option<ConnectedTuple>,
}

impl ServerWire {
    /// The four-tuple the client said its connection has, once it said so.
    pub(crate) fn connected(&self) -> Option<ConnectedTuple> {
        self.connected
    }
}

impl fmt::Debug for ServerWire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerWire").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Drop for ServerWire {
    fn drop(&mut self) {
        // Marked when its connection was accepted before its Confirm came (`take`), and
        // cleared by that Confirm's `verify`: a handshake that ended without one leaves no
        // mark for a later registration of the same id to pass `verify` on.
        self.conn.end_live(self.id, &self.inbox);
    }
}

impl Wire for ServerWire {
    /// Resolves once the message went out with its turn's others, or could not (then the
    /// connection is shut: [`Sender::send_failed`]), so that a handshake that sent its Commit
    /// knows it did.
    async fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        let frame = DoorFrame { kind: DoorKind::Clc, reason: 0, id: self.id };
        // An early registration is both pending (until its connection is accepted) and live.
        let alone = self.conn.live().len() <= 1 && self.conn.pending().len() <= 1;
        let sent = send_frame(&*self.conn, alone, |b| frame.encode_into(b, msg)).await;
        if sent.is_err() {
            // Shut by the sender too; at once here, for the handshake's client.
            self.conn.shut();
        }
        sent
    }

    async fn recv(&mut self) -> io::Result<Option<Vec<u8>>> {
        if let Some(p) = self.proposal.take() {
            return Ok(Some(p));
        }
        match self.inbox.next().await {
            Some(m) if m.kind == DoorKind::Clc => Ok(Some(m.payload)),
            Some(m) if m.kind == DoorKind::Connected => match ConnectedTuple::decode(&m.payload) {
                Ok((t, clc)) => {
                    self.connected = Some(t);
                    Ok(Some(clc.to_vec()))
                }
                Err(_) => Ok(None),
            },
            // Cancelled (the client's cancel), its door connection closed, or anything but a
            // CLC message from a client.
            _ => Ok(None),
        }
    }
}

impl Door {
    /// Binds the door of a listener on `local`: the solo name if it has no reuseport siblings
    /// (`reuseport` off), else (or if someone squats on it) the lowest free index for that
    /// address. `None` when all are taken (more listeners in one reuseport group than doors, or
    /// someone squatting on the names), or the kernel cannot tell who owns a connection
    /// (no `sock_diag`): the listener then serves TCP only. `device`: the interface the listener
    /// is bound to (0: none), which its connections' look-ups must name; `v6_only`: an IPv6
    /// listener's `IPV6_V6ONLY`.
    pub(crate) fn open(
        base: Arc<GlobalSettings>,
        counters: Arc<Counters>,
        (local, device, v6_only): (SocketAddr, u32, bool),
        settings: Overrides,
        reuseport: bool,
    ) -> Option<Door> {
        let diag = match sys::TcpDiag::new(device) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "no sock_diag to prove who owns a connection: this listener serves tcp only");
                return None;
            }
        };
        let door_base = base_name(local);
        let ip = sys::unmap(local).ip();
        let solo = (!reuseport).then(|| solo_name(&door_base));
        for name in solo.into_iter().chain((0..MAX_DOORS).map(|i| door_name(&door_base, i))) {
            // Registrations carry no descriptors.
            match sys::seqpacket_listen(&name, crate::faults::doors_take_descriptors()) {
                Ok(fd) => {
                    let inert_conns = sys::refuses_descriptors(fd.as_fd()) && sys::refusal_inherited();
                    // Closed on a closer all the same: one close per listener.
                    let fd = PeerFd::new(fd);
                    // SAFETY: the PeerFd owns its descriptor.
                    let listener = match unsafe { sys::register(fd, Interest::READABLE) } {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot register the smc door with the runtime: serving tcp only");
                            return None;
                        }
                    };
                    let conn_budget = conn_budget();
                    let solo = name.ends_with(b"/solo");
                    return Some(Door {
                        name,
                        listener,
                        settings,
                        base,
                        counters,
                        diag,
                        solo,
                        conn_budget,
                        looks_per_sweep: VERIFIED_LOOKS,
                        rt: tokio::runtime::Handle::try_current().ok(),
                        inert_conns,
                        listen_port: local.port(),
                        listen_ip: Some(ip).filter(|ip| !ip.is_unspecified()),
                        wildcard_receives: match ip {
                            IpAddr::V4(_) => (true, false),
                            IpAddr::V6(_) => (!v6_only, true),
                        },
                        blind: AtomicBool::new(false),
                        #[cfg(test)]
                        stalled: AtomicBool::new(false),
                        #[cfg(test)]
                        congested: AtomicBool::new(false),
                        #[cfg(test)]
                        conn_reads: AtomicU64::new(0),
                        state: Mutex::default(),
                    });
                }
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, door = %door_base, "cannot open the smc door: this listener serves tcp only");
                    return None;
                }
            }
        }
        tracing::warn!(door = %door_base, "every smc door name for this address is taken: this listener serves tcp only");
        None
    }

    /// The door's abstract socket name.
    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DoorState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The registration of the connection from `peer` to our `local` address, if its client
    /// registered one. Reads the door first when it is not known yet, so a registration sent
    /// before the connection is found (unless a flood of knocks is queued ahead of it). Never
    /// waits.
    /// `accepted` is the connection's socket, our end of it.
    pub(crate) fn lookup(&self, peer: SocketAddr, local: SocketAddr, accepted: BorrowedFd<'_>) -> Option<Matched> {
        let (peer, local) = (sys::unmap(peer), sys::unmap(local));
        let mut st = self.lock();
        if let Some(r) = self.take(&mut st, peer, local, accepted) {
            return Some(r);
        }
        // The registration was queued before the client's SYN, so it is somewhere in the
        // door's queues: read batch after batch until it turns up or the queues are empty. The
        // door's queue is at most its backlog deep, so this ends.
        let mut read_all = false;
        let mut budget = LOOKUP_READS.saturating_sub(st.lookup_reads);
        let mut refusals = LOOKUP_REFUSALS.saturating_sub(st.lookup_refusals);
        for _ in 0..=MAX_CONNS / DRAIN_BATCH {
            let before = (budget, refusals);
            let left = self.drain_within(&mut st, &mut budget, &mut refusals);
            st.lookup_reads += before.0 - budget;
            st.lookup_refusals += before.1 - refusals;
            if let Some(r) = self.take(&mut st, peer, local, accepted) {
                return Some(r);
            }
            match left {
                Ok(Left { queued: false, unread: false }) => {
                    read_all = true;
                    break;
                }
                // Messages to read on the connections held, or connections to take while
                // refusals are left: on. (Whatever is left once a budget is spent waits for the
                // listener's turns.)
                Ok(Left { queued, unread }) if budget > 0 && (unread || queued && refusals > 0) => {}
                _ => break,
            }
        }
        if !read_all {
            // Its registration may be in what could not be read: the connection is TCP from
            // now on, and the registration, should it be read later, is never committed.
            st.note_missed((peer, local));
        }
        None
    }

    /// A new turn of the listener task: its look-ups may read [`LOOKUP_READS`] messages again.
    pub(crate) fn begin_turn(&self) {
        let mut st = self.lock();
        st.lookup_reads = 0;
        st.lookup_refusals = 0;
    }

    /// Registrations held now: while there are any, the listener sweeps.
    pub(crate) fn pending(&self) -> usize {
        self.lock().count
    }

    /// Stops taking door connections: clients that look for the door from now on find it
    /// closed, and connect as plain TCP (the listener is closing). Door connections already open
    /// stay until their handshakes end and the door is dropped.
    pub(crate) fn close(&self) {
        // A shut-down listening Unix socket refuses connections.
        let _ = sys::shutdown(self.listener.get_ref().as_fd(), std::net::Shutdown::Both);
    }

    /// Waits until the door has new connections or a door connection has messages, then takes
    /// them in (for the listener task, which is what reads door connections while their
    /// handshakes wait). `Ok(true)`: more may be queued (the caller comes back after other
    /// work). An error (no descriptor for a new connection, say) is returned so that the caller
    /// backs off instead of spinning on a door that stays readable; while it does, it reads the
    /// door connections it holds with `accept` off (new ones wait in the door's queue).
    pub(crate) fn poll_drain(
        &self,
        cx: &mut std::task::Context<'_>,
        budget: &mut usize,
        accept: bool,
    ) -> Poll<io::Result<bool>> {
        #[cfg(test)]
        if self.stalled.load(Ordering::Relaxed) {
            return Poll::Ready(Err(io::Error::other("door reads stalled (test)")));
        }
        let mut st = self.lock();
        match &st.watcher {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.watcher = Some(cx.waker().clone()),
        }
        let (mut progress, mut more) = (false, false);
        for (i, conn) in st.rotation() {
            if st.spent(*budget, i) {
                // The rest at the next turn, from here.
                more = true;
                break;
            }
            if let Poll::Ready(r) = conn.sock.fd.poll_read_ready(cx) {
                progress = true;
                match r {
                    Ok(mut guard) => match self.read_conn(&mut st, &conn, budget) {
                        Read::Empty => guard.clear_ready(),
                        // Its turn is over: back after the listener's other work.
                        Read::More => more = true,
                        Read::Ended => {}
                    },
                    Err(_) => st.close(&conn),
                }
            }
        }
        if more {
            return Poll::Ready(Ok(true));
        }
        if !accept || self.blind.load(Ordering::Relaxed) {
            // Not taking new door connections now (the caller backs off), or the door is shut:
            // its listening socket reports a hang-up for good and accepts nothing, so it is not
            // waited on (it would be ready on every poll); door connections still open are
            // read (a shut door refuses their registrations).
            return if progress { Poll::Ready(Ok(false)) } else { Poll::Pending };
        }
        let mut batch = DRAIN_BATCH;
        let res = match self.listener.poll_read_ready(cx) {
            Poll::Ready(Ok(mut guard)) => match self.accept_conns(&mut st, &mut batch) {
                Ok(true) => Ok(true),
                Ok(false) => {
                    guard.clear_ready();
                    Ok(false)
                }
                Err(e) => Err(e),
            },
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending if progress => Ok(false),
            Poll::Pending => return Poll::Pending,
        };
        Poll::Ready(res)
    }

    /// [`drain_within`](Self::drain_within) without a bound in all.
    #[cfg(test)]
    fn drain(&self, st: &mut DoorState) -> io::Result<bool> {
        let (mut reads, mut refusals) = (usize::MAX, usize::MAX);
        self.drain_within(st, &mut reads, &mut refusals).map(|l| l.queued || l.unread)
    }

    /// Accepts waiting door connections (a batch, refusing at most `refusals`, taken from it)
    /// and reads the messages that have arrived on any (up to [`READ_MAX`] each, and `budget`
    /// in all, taken from it, from the connection where the last budget ran out). What it
    /// left; an error where [`accept_conns`](Self::accept_conns) met one.
    fn drain_within(&self, st: &mut DoorState, budget: &mut usize, refusals: &mut usize) -> io::Result<Left> {
        #[cfg(test)]
        if self.stalled.load(Ordering::Relaxed) {
            return Err(io::Error::other("door reads stalled (test)"));
        }
        let before = st.conns.len();
        let res = self.accept_conns(st, refusals);
        if st.conns.len() > before {
            // New door connections, not watched yet: the listener task polls them next.
            if let Some(w) = &st.watcher {
                w.wake_by_ref();
            }
        }
        let (conns, mut unread) = st.readable_conns();
        for (i, conn) in conns {
            if st.spent(*budget, i) {
                unread = true;
                break;
            }
            unread |= self.read_conn(st, &conn, budget) == Read::More;
        }
        // Messages left unread count as more to take, as door connections left queued do. Door
        // connections that could not be taken (no descriptor, congested closers: those held
        // were read on all the same) are an error: a look-up cannot know that its
        // registration is not among them. (Congested closers once read as "all read", and a
        // connection handed out as TCP then was not noted as missed: its registration, read
        // once the closers came free, was committed, with the application reading TCP.)
        res.map(|queued| Left { queued, unread })
    }

    /// Accepts up to [`DRAIN_BATCH`] waiting door connections, while `refusals` (taken from
    /// it) lasts: each connection refused (untrusted, without credentials, past the budget)
    /// costs one; those kept cost nothing. `Ok(false)`: the door's queue was found empty;
    /// `Ok(true)`: the batch or the refusals ended first; an error: a connection could not be
    /// accepted (it stays queued for a later drain).
    fn accept_conns(&self, st: &mut DoorState, refusals: &mut usize) -> io::Result<bool> {
        if self.blind.load(Ordering::Relaxed) {
            // Shut (see `go_blind`): accepting would fail with EINVAL.
            return Ok(false);
        }
        let congested = !self.inert_conns && sys::closers_congested();
        #[cfg(test)]
        let congested = congested || self.congested.load(Ordering::Relaxed);
        if congested {
            // Every knock would cost a descriptor that waits for a closer (it may hold
            // descriptors its peer queued): the knocks wait in the door's backlog instead, and
            // the clients behind them stay on TCP, as for EMFILE below.
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "descriptor closers congested: not taking door connections",
            ));
        }
        for _ in 0..DRAIN_BATCH {
            if *refusals == 0 {
                return Ok(true);
            }
            let conn = match sys::seqpacket_accept(self.listener.get_ref().as_fd()) {
                Ok(conn) if self.inert_conns => conn.inert(),
                Ok(conn) => conn,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => {
                    // EMFILE and friends: the connections stay queued for a later drain; the
                    // clients behind them get no verdict and stay on TCP.
                    tracing::debug!(error = %e, "door accept");
                    return Err(e);
                }
            };
            let cred = match sys::peer_cred(conn.as_fd()) {
                Ok(cred) => cred,
                Err(e) => {
                    tracing::debug!(error = %e, "door connection without credentials");
                    *refusals -= 1;
                    continue;
                }
            };
            if !self.trusts(st, &cred) {
                // Dropped unread: the closer takes out whatever it queued for us, defused (or,
                // where it could queue nothing but bytes, closed here).
                tracing::debug!(
                    uid = cred.uid,
                    gid = cred.gid,
                    pid = cred.pid,
                    "refusing a door connection from an untrusted peer"
                );
                self.counters.door_refused();
                *refusals -= 1;
                continue;
            }
            if st.conns.len() >= self.conn_budget {
                // Closed: its client's registrations end, and its connections are TCP.
                tracing::debug!(held = st.conns.len(), "door connection budget spent: refusing a client");
                *refusals -= 1;
                continue;
            }
            // SAFETY: geteuid cannot fail and has no preconditions.
            let own = unsafe { libc::geteuid() };
            let held = st.conns_by_uid.get(&cred.uid).copied().unwrap_or(0);
            let others = st.conns.len() - st.conns_by_uid.get(&own).copied().unwrap_or(0);
            if uid_share(cred.uid, own, held, others, self.conn_budget) != UidShare::Within {
                // Closed, as past the budget.
                tracing::debug!(
                    uid = cred.uid,
                    held,
                    others,
                    "door connections of other uids at their share: refusing a client"
                );
                *refusals -= 1;
                continue;
            }
            // Registrations carry no descriptors: refuse them where the kernel can.
            sys::refuse_descriptors(conn.as_fd());
            // Room for a client's window of answers.
            let _ = widen_send_buffer(conn.as_fd());
            // Watched by the listener's runtime, whichever runtime's accept took it in.
            let _rt = self.rt.as_ref().map(tokio::runtime::Handle::enter);
            match watch(conn) {
                Ok(fd) => match ServerConn::start(fd, cred, &self.counters, self.rt.as_ref()) {
                    Some(conn) => st.hold(conn),
                    None => tracing::debug!("no runtime to answer a door connection on"),
                },
                Err(e) => tracing::debug!(error = %e, "cannot watch a door connection"),
            }
        }
        Ok(true)
    }

    /// Reads up to [`READ_MAX`] frames queued on `conn` (without waiting), and at most `budget`
    /// (taken from it), each with the rest of its message, and files them. A connection that
    /// closed or sent nonsense is ended.
    fn read_conn(&self, st: &mut DoorState, conn: &Arc<ServerConn>, budget: &mut usize) -> Read {
        #[cfg(test)]
        self.conn_reads.fetch_add(1, Ordering::Relaxed);
        let mut buf = std::mem::take(&mut st.buf);
        if buf.is_empty() {
            buf = message_buffer();
        }
        let read = self.read_conn_into(st, conn, budget, &mut buf);
        st.buf = buf;
        read
    }

    /// [`read_conn`](Self::read_conn) with a message buffer. The bounds count frames (a message
    /// carries up to [`DOOR_BATCH_FRAMES`](proto_door::DOOR_BATCH_FRAMES)); a message is filed
    /// whole, so a turn may go past them by a message's frames.
    fn read_conn_into(&self, st: &mut DoorState, conn: &Arc<ServerConn>, budget: &mut usize, buf: &mut [u8]) -> Read {
        let mut read = 0;
        while read < READ_MAX {
            if *budget == 0 {
                return Read::More;
            }
            match recv_message(conn.sock.fd.get_ref().as_fd(), conn.sock.fd.get_ref().is_inert(), buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Read::Empty,
                // A frame only a server sends ends the connection before anything of its
                // message is filed.
                Ok(Some(msg)) if msg.clone().any(|(f, _)| !f.kind.client_sends()) => {
                    st.close(conn);
                    return Read::Ended;
                }
                Ok(Some(_)) if !self.trusts(st, &conn.cred) => {
                    // Its uid is no longer one the listener allows (its settings changed since
                    // it was taken in): it ends, with its registrations that no handshake saw,
                    // as a door connection refused at its knock.
                    tracing::debug!(uid = conn.cred.uid, "closing a door connection whose uid is no longer allowed");
                    self.counters.door_refused();
                    st.close(conn);
                    return Read::Ended;
                }
                Ok(Some(msg)) => {
                    for (frame, payload) in msg {
                        read += 1;
                        *budget = budget.saturating_sub(1);
                        self.file(st, conn, frame, payload);
                    }
                }
                // Closed, garbage, or an error: the client's registrations and handshakes end.
                _ => {
                    st.close(conn);
                    return Read::Ended;
                }
            }
        }
        Read::More
    }

    /// Whether the listener trusts `cred` now: its own uid, or one its settings allow. The
    /// allowed uids are read again only once the settings changed ([`GlobalSettings::version`]),
    /// so a run-time change reaches the door connections already open at their next message.
    fn trusts(&self, st: &mut DoorState, cred: &sys::PeerCred) -> bool {
        let version = self.base.version();
        if st.trusted.as_ref().is_none_or(|(seen, _)| *seen != version) {
            st.trusted = Some((version, self.settings.resolve(&self.base).shm.allowed_uids));
        }
        st.trusted.as_ref().is_some_and(|(_, allowed)| cred.trusted(allowed))
    }

    /// Files one frame from a client, of a message [`read_conn`](Self::read_conn) found to hold
    /// only kinds a client sends.
    fn file(&self, st: &mut DoorState, conn: &Arc<ServerConn>, frame: DoorFrame, payload: &[u8]) {
        let id = frame.id;
        match frame.kind {
            DoorKind::Register => {
                let (head, proposal) = match RegisterHead::decode(payload) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::debug!(error = %e, "unusable door registration");
                        conn.refuse(&self.counters, id, DoorKind::Unmatched, DeclineReason::SyncError);
                        return;
                    }
                };
                if self.blind.load(Ordering::Relaxed) {
                    conn.refuse(&self.counters, id, DoorKind::Unmatched, DeclineReason::NoCommonTransport);
                    return;
                }
                if st.missed.recently(head.port) {
                    // Its connection was handed out as TCP already (read after it, past a full
                    // door queue, say): no accept will match it, and its client would wait out
                    // its handshake timeout for an answer. Final only from a solo door: a
                    // member of a reuseport group may have missed another connection from that
                    // port (of another address, or of up to 30 s ago) while a sibling has this
                    // one, and a client ends every door's registration at a final answer.
                    let kind = if self.solo { DoorKind::Refused } else { DoorKind::Unmatched };
                    conn.refuse(&self.counters, id, kind, DeclineReason::HandshakeCongested);
                    return;
                }
                let filed = conn.pending();
                // SAFETY: geteuid cannot fail and has no preconditions.
                let own = unsafe { libc::geteuid() };
                let full = !st.room_to_file(conn.cred.uid, own) || filed.len() >= CONN_REGISTRATIONS;
                let known = filed.contains_key(&id);
                drop(filed);
                if full || known || conn.live().contains_key(&id) {
                    conn.refuse(&self.counters, id, DoorKind::Unmatched, DeclineReason::HandshakeCongested);
                    return;
                }
                conn.pending().insert(id, head.port);
                st.filed(conn.cred.uid);
                // A solo door answers a shared-memory offer at once: the connection can only
                // come here. (RDMA needs the connection's addresses, known at accept.)
                let early = (self.solo && offers_shm(proposal)).then(tokio::sync::oneshot::channel);
                let (tx, rx) = match early {
                    Some((tx, rx)) => (Some(tx), Some(rx)),
                    None => (None, None),
                };
                st.entries.entry(head.port).or_default().push(Entry {
                    conn: conn.clone(),
                    id,
                    instance: head.instance,
                    cookie: head.cookie,
                    proposal: proposal.to_vec(),
                    since: Instant::now(),
                    early: tx,
                    verified: None,
                    ours: None,
                    looked: None,
                });
                if let Some(rx) = rx {
                    let inbox = Arc::new(Inbox::default());
                    conn.live().insert(id, Live::new(inbox.clone()));
                    st.early.push(Registration {
                        conn: conn.clone(),
                        id,
                        inbox,
                        counters: self.counters.clone(),
                        client: identity(conn, head.instance),
                        proposal: proposal.to_vec(),
                        early: Some(rx),
                    });
                    if let Some(w) = &st.watcher {
                        w.wake_by_ref();
                    }
                }
            }
            DoorKind::Clc | DoorKind::Connected => {
                let inbox = conn.live().get(&id).map(|l| l.inbox.clone());
                match inbox {
                    Some(inbox) => {
                        inbox.push(Msg { kind: frame.kind, reason: frame.reason, payload: payload.to_vec() })
                    }
                    // A message before the server spoke is out of turn: the registration is void.
                    None => {
                        st.remove(conn, id);
                    }
                }
            }
            DoorKind::Cancel => {
                let inbox = conn.live().remove(&id).map(|l| l.inbox);
                match inbox {
                    Some(inbox) => inbox.close(),
                    None => {
                        st.remove(conn, id);
                    }
                }
            }
            // Only a server says these: `read_conn` ended the connection for a message with
            // one before it filed any of it.
            DoorKind::Unmatched | DoorKind::Refused => {}
        }
    }

    /// The kernel cannot tell who owns a connection (no `tcp_diag` module, a sandbox that
    /// refuses it): no registration can ever be checked. The door closes (clients from now on
    /// find none and connect as plain TCP at once) and every registration held is answered
    /// "no", so that no client waits for a verdict that cannot come.
    fn go_blind(&self, st: &mut DoorState, why: &str) {
        if self.blind.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(why, door = %String::from_utf8_lossy(&self.name), "cannot prove who owns a connection: this listener serves tcp only");
        self.close();
        // Registrations whose connections a handshake saw already are kept: those handshakes
        // may have committed, and take their connections when they come (`take`).
        let held: Vec<(Arc<ServerConn>, u64)> =
            st.entries.values().flatten().filter(|e| e.verified.is_none()).map(|e| (e.conn.clone(), e.id)).collect();
        for (conn, id) in held {
            st.remove(&conn, id);
            conn.refuse(&self.counters, id, DoorKind::Unmatched, DeclineReason::NoCommonTransport);
        }
    }

    /// Test hook: while `on`, the door's queues cannot be read, as when the process has no
    /// descriptor left for a new door connection.
    #[cfg(test)]
    pub(crate) fn stall_reads_for_test(&self, on: bool) {
        self.stalled.store(on, Ordering::Relaxed);
    }

    /// Test hook: while `on`, the door takes no new door connection, as while the process's
    /// descriptor closers are congested on a kernel before Linux 6.16 (whose door connections
    /// could carry descriptors); those it holds are read on.
    #[cfg(test)]
    pub(crate) fn congest_for_test(&self, on: bool) {
        self.congested.store(on, Ordering::Relaxed);
    }

    /// Test hook: every registration is `by` older, and the sweep's last look at the kernel
    /// long ago.
    #[cfg(test)]
    fn age_for_test(&self, by: Duration) {
        let mut st = self.lock();
        st.verified_looked = None;
        for e in st.entries.values_mut().flatten() {
            e.since = e.since.checked_sub(by).expect("a clock this old");
        }
    }

    /// Test hook: the door goes blind as when the kernel cannot say who owns a connection.
    #[cfg(test)]
    pub(crate) fn go_blind_for_test(&self) {
        let mut st = self.lock();
        self.go_blind(&mut st, "test");
    }

    /// Drops registrations that waited too long for their connections ([`ENTRY_TTL`]), but for
    /// those whose connections a solo door saw while the kernel still holds our end of them, for
    /// the listener to accept ([`VERIFIED_TTL`]).
    pub(crate) fn sweep(&self) {
        let mut st = self.lock();
        let (mut budget, mut refusals) = (TURN_READS, DRAIN_BATCH);
        let _ = self.drain_within(&mut st, &mut budget, &mut refusals);
        // The kernel is asked about waiting connections once a second, at most
        // `VERIFIED_LOOKS` of them (a listen queue of thousands, asked every sweep, made tens of
        // thousands of sock_diag round trips a second on the listener's task); a blind door
        // cannot ask.
        let looks = if st.verified_looked.is_none_or(|t| t.elapsed() >= VERIFIED_LOOK_EVERY)
            && !self.blind.load(Ordering::Relaxed)
        {
            st.verified_looked = Some(Instant::now());
            self.looks_per_sweep
        } else {
            0
        };
        let mut stale: Vec<(Arc<ServerConn>, u64)> = Vec::new();
        // Verified registrations whose connection's our end the kernel is to be asked about:
        // past ENTRY_TTL, kept while our end is there. Those asked least recently first, so
        // that however many wait, each is asked in turn.
        let mut ask: Vec<(Option<Instant>, u16, usize)> = Vec::new();
        for (&port, list) in &st.entries {
            for (i, e) in list.iter().enumerate() {
                let age = e.since.elapsed();
                match e.verified {
                    None if age >= ENTRY_TTL => stale.push((e.conn.clone(), e.id)),
                    None => {}
                    Some(_) if age >= VERIFIED_TTL => stale.push((e.conn.clone(), e.id)),
                    Some(_) if age >= ENTRY_TTL => ask.push((e.looked, port, i)),
                    Some(_) => {}
                }
            }
        }
        if looks > 0 && !ask.is_empty() {
            ask.sort_unstable_by_key(|a| a.0);
            for (_, port, i) in ask.into_iter().take(looks) {
                let Some(e) = st.entries.get_mut(&port).and_then(|l| l.get_mut(i)) else { continue };
                let Some((client, server)) = e.verified else { continue };
                e.looked = Some(Instant::now());
                // Our end is gone (reset before the accept): so is the registration.
                if let Ok(None) = self.diag.owner(server, client) {
                    stale.push((e.conn.clone(), e.id));
                }
            }
        }
        st.missed.expire();
        for (conn, id) in stale {
            st.remove(&conn, id);
        }
    }

    /// The cookie of our end `o` of a connection if it is the full socket the listener will
    /// accept (established, or closed by its client since), not a request socket (the kernel
    /// keeps our end as one, with a cookie of its own, while the listen queue is full).
    fn accepted_end(o: &sys::TcpOwner) -> Option<u64> {
        (o.state == sys::TCP_ESTABLISHED || o.state == sys::TCP_CLOSE_WAIT).then_some(o.cookie)
    }

    /// The place, in the list filed under its port, of the registration whose cookie and uid
    /// the kernel's record of `tuple`'s client end names ([`take`](Self::take)), given the
    /// place of the one whose handshake saw that tuple (`verified`), if any.
    fn owned(&self, st: &mut DoorState, tuple: (SocketAddr, SocketAddr), verified: Option<usize>) -> Option<usize> {
        let (peer, local) = tuple;
        let list = st.entries.get(&peer.port())?;
        match self.diag.owner(peer, local) {
            // The registrant's uid, or, for the socket `verify` saw established with that uid,
            // none: once closed, it lives on as a timewait socket, whose uid the kernel reports
            // as 0 (its cookie stays, and cookies never repeat).
            Ok(Some(o)) => list
                .iter()
                .position(|e| e.cookie == o.cookie && (e.conn.cred.uid == o.uid || e.verified == Some(tuple))),
            // The client end is gone already (its client gave up and closed), or the kernel
            // cannot look sockets up at all: whether it answers for our own end tells which.
            Ok(None) => {
                if matches!(self.diag.answers(local, peer), Ok(false)) {
                    self.go_blind(st, "the kernel finds no socket of an accepted connection");
                }
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, %peer, "cannot tell who owns the connection");
                if matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ENOMEM | libc::EINTR)) {
                    // A passing failure says nothing new: the registration whose connection
                    // the kernel showed at its Connected frame (its handshake committed on
                    // that) keeps it. Any other goes out as TCP, and a Connected frame that
                    // names the tuple later must not commit it.
                    if verified.is_none() {
                        st.note_missed(tuple);
                    }
                    verified
                } else {
                    self.go_blind(st, "sock_diag fails");
                    None
                }
            }
        }
    }

    /// Takes the registration for a connection from `peer` to `local`: the one whose cookie
    /// and uid are those of that connection's client end, as the kernel tells them now. Asked
    /// at every accept, also for a registration whose connection `verify` saw: what it saw was
    /// a four-tuple at that moment, and a four-tuple outlives its socket (a registrant that
    /// reset the connection it had verified left the tuple to whoever connected from that port
    /// next, of any uid; cookies never repeat). The client end may have closed since (its
    /// application wrote and closed); a registration verified on this tuple whose socket the
    /// kernel no longer has, or that another socket holds now, ends here, unless `accepted`
    /// (our end of this one) has the cookie `verify` noted of our end of its connection.
    fn take(
        &self,
        st: &mut DoorState,
        peer: SocketAddr,
        local: SocketAddr,
        accepted: BorrowedFd<'_>,
    ) -> Option<Matched> {
        let tuple = (peer, local);
        let verified = st.seen_at(tuple)?;
        let ours = verified.and_then(|i| st.entries.get(&peer.port())?.get(i)?.ours);
        // A cookie that cannot be read says nothing: the kernel is asked as without one.
        let own = ours.and_then(|ours| Some(sys::socket_cookie(accepted).ok()? == ours));
        let found = if own == Some(true) {
            // Our end is the connection's own: exact, whoever holds the client's end now.
            verified
        } else if own == Some(false) {
            // Another socket than the one our end of its connection was: not its connection,
            // and, the four-tuple having been its until then, nobody else's registration's.
            None
        } else if self.blind.load(Ordering::Relaxed) {
            // The kernel cannot say whose the four-tuple is now: only a registration whose
            // connection a handshake saw on it, before the door went blind, takes it (that
            // handshake may have committed: handed out as TCP, its connection split). Should
            // its client have reset that connection and another socket taken the tuple since,
            // the handshake's connection is aborted with it, and the application reads an
            // error, never another client's bytes.
            verified
        } else {
            match self.owned(st, tuple, verified) {
                // The look-up found the door blind (and dropped every registration no
                // handshake saw): as above, from the list as it is now.
                None if self.blind.load(Ordering::Relaxed) => st.seen_at(tuple)?,
                found => found,
            }
        };
        let Some(i) = found else {
            if let Some(i) = verified {
                // Its client reset its connection: its handshake lets its slot go now, not when
                // the registration would have gone stale.
                let conn = st.entries.get(&peer.port()).and_then(|l| l.get(i)).map(|e| (e.conn.clone(), e.id));
                if let Some((conn, id)) = conn {
                    st.remove(&conn, id);
                }
                // Handed out as TCP: a Connected frame that names this tuple later (another
                // registrant's, whose socket holds it now) is declined.
                st.note_missed(tuple);
            }
            return None;
        };
        let port = peer.port();
        let list = st.entries.get_mut(&port)?;
        let mut e = list.swap_remove(i);
        if list.is_empty() {
            st.entries.remove(&port);
        }
        st.unfiled(e.conn.cred.uid);
        e.conn.pending().remove(&e.id);
        if let Some(tx) = e.early.take() {
            if e.verified.is_none() {
                // Its Connected frame is still to come, to a handshake that is still on (its
                // entry in `live`): `verify` passes it on this mark, or the mark goes with the
                // entry (a refused or cancelled one has left `live` already, and is not marked).
                if let Some(l) = e.conn.live().get_mut(&e.id) {
                    l.accepted_early = true;
                }
            }
            return Some(Matched::Early(tx));
        }
        let inbox = Arc::new(Inbox::default());
        e.conn.live().insert(e.id, Live::new(inbox.clone()));
        let client = identity(&e.conn, e.instance);
        Some(Matched::Handshake(Registration {
            conn: e.conn,
            id: e.id,
            inbox,
            counters: self.counters.clone(),
            client,
            proposal: e.proposal,
            early: None,
        }))
    }

    /// Registrations to answer before their connections arrive, taken by the listener task.
    pub(crate) fn take_early(&self) -> Vec<Registration> {
        std::mem::take(&mut self.lock().early)
    }

    /// Whether a connection to `server` (unmapped) can come to this listener: to its port, and
    /// to its address, or, on a wildcard, in a family the wildcard receives.
    fn receives(&self, server: SocketAddr) -> bool {
        server.port() == self.listen_port
            && match (self.listen_ip, server.ip()) {
                (Some(ip), at) => ip == at,
                (None, IpAddr::V4(_)) => self.wildcard_receives.0,
                (None, IpAddr::V6(_)) => self.wildcard_receives.1,
            }
    }

    /// Whether the connection a client says it made for the early registration `key` is the
    /// one the kernel has, from a socket with the registered cookie, owned by the registrant's
    /// uid, established, and towards our port, and whether our end of it is the full socket the
    /// listener will accept. If so ([`Verified::Yes`]), its accept is matched by our end.
    pub(crate) fn verify(&self, key: &EarlyKey, said: Option<ConnectedTuple>) -> Verified {
        // Under the door's lock, under which an accept takes a registration and marks it
        // accepted (`take`): the registration is either still here or marked, never neither.
        // (Looking at the mark before taking the lock lost a registration accepted in between:
        // its client was declined, 1 connection in about 200 runs of the 1000-connection shm
        // test.)
        let mut st = self.lock();
        // Accepted already: matched at accept by the kernel's record of its client end.
        if key.conn.live().get_mut(&key.id).is_some_and(|l| std::mem::take(&mut l.accepted_early)) {
            return Verified::Yes;
        }
        let Some(t) = said else { return Verified::No };
        let (client, server) = (sys::unmap(t.local), sys::unmap(t.peer));
        // Not to us (a connection to the same port of another of this host's addresses, where
        // another listener may serve it, would pin a slot of ours for nothing), or handed out as
        // plain TCP already, before this registration was read.
        if !self.receives(server) || st.missed.recently(client.port()) {
            return Verified::No;
        }
        let Some((port, e)) = st.entry_mut(&key.conn, key.id) else { return Verified::No };
        if port != client.port() {
            return Verified::No;
        }
        let owner = match self.diag.owner(client, server) {
            Ok(Some(o)) => o,
            _ => return Verified::No,
        };
        if e.cookie != owner.cookie || key.conn.cred.uid != owner.uid || owner.state != sys::TCP_ESTABLISHED {
            return Verified::No;
        }
        // Our end of it too, which must be the full socket the listener will accept: the accept
        // then matches that socket exactly, whatever became of the client's end meanwhile. Its
        // client may write, close and go before the application accepts, and its end is gone
        // from the kernel's table at once when the host's TIME_WAIT table is full (any local
        // user can fill it), which matched the accept to nothing: the connection went to the
        // application as TCP, empty, and the bytes written into the ring were lost. Our end is
        // still a request socket while the listen queue is full (or, for a moment, before the
        // kernel took the client's last ACK in): no commit then, for its client's end may go
        // before ours is a socket an accept could be matched by ([`Verified::NotAccepted`]).
        let ours = match self.diag.owner(server, client) {
            Ok(Some(o)) => match Self::accepted_end(&o) {
                Some(ours) => ours,
                None if o.state == sys::TCP_SYN_RECV => return Verified::NotAccepted,
                None => return Verified::No,
            },
            // No end of ours found, or the look-up failed: the kernel may be turning its
            // request socket into the full one (a look-up between the two can see neither),
            // the listen queue may be full with syncookies on (no end of ours exists yet), or
            // the look-up met a passing error: asked again, it may be found.
            _ => return Verified::NotAccepted,
        };
        e.ours = Some(ours);
        e.verified = Some((client, server));
        Verified::Yes
    }

    /// Turns the early registration in `reg` back into one answered when its connection is
    /// accepted (no handshake slot is free now): `None` when that happened (nothing was said to
    /// its client yet), else the registration back, its connection accepted already and on its
    /// way to `reg`'s receiver.
    pub(crate) fn demote(&self, reg: Registration, key: &EarlyKey) -> Option<Registration> {
        let mut st = self.lock();
        let Some((_, e)) = st.entry_mut(&key.conn, key.id) else { return Some(reg) };
        e.early = None;
        key.conn.end_live(key.id, &reg.inbox);
        None
    }

    /// Drops the early registration `key` if its connection has not been accepted yet;
    /// whether it was still there (if not, its connection is on its way to the handshake).
    pub(crate) fn forget(&self, key: &EarlyKey) -> bool {
        self.lock().remove(&key.conn, key.id)
    }
}

/// Who registered, for link groups: the door connection's pid and uid, and the instance.
fn identity(conn: &ServerConn, instance: u64) -> ClientIdentity {
    ClientIdentity { pid: u32::try_from(conn.cred.pid).unwrap_or(0), uid: conn.cred.uid, instance }
}

/// Whether a Proposal (as registered) offers shared memory.
fn offers_shm(proposal: &[u8]) -> bool {
    matches!(
        crate::proto::clc::decode(proposal),
        Ok(crate::proto::clc::Decoded::Message(ClcMessage::Proposal(p), _)) if p.shm.is_some()
    )
}

// ----- client --------------------------------------------------------------------------------

/// A client's door connections, shared by every connection that registers through them; a
/// context holds one set. Per door name and runtime there is one, or more while more than a
/// [`WINDOW`] of registrations are in flight (up to [`CLIENT_POOL`]). A door connection lives
/// while its runtime does, until its listener closes it, or until it has been idle for
/// [`CLIENT_IDLE`].
#[derive(Default)]
pub(crate) struct ClientDoors(Arc<DoorMap>);

impl fmt::Debug for ClientDoors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let open: usize = lock_map(&self.0).values().map(|p| p.conns.len()).sum();
        f.debug_struct("ClientDoors").field("open", &open).finish()
    }
}

/// A door a client looks for: the address its listener is bound to, and its place among that
/// address's doors. Its name is formatted only to connect to it; a connection that finds an open
/// door connection formats nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct DoorAt {
    addr: SocketAddr,
    /// `None`: the solo door; else a reuseport group member's index.
    index: Option<u32>,
}

impl DoorAt {
    fn name(&self) -> Vec<u8> {
        let base = base_name(self.addr);
        match self.index {
            None => solo_name(&base),
            Some(i) => door_name(&base, i),
        }
    }
}

type DoorKey = (DoorAt, tokio::runtime::Id);
type DoorMap = Mutex<HashMap<DoorKey, Pool>>;

/// A client's door connections to one door from one runtime.
struct Pool {
    conns: Vec<Arc<ClientConn>>,
    room: Arc<Room>,
}

/// Registrations one pool carries at once: a full window on each of its connections.
const POOL_PERMITS: usize = WINDOW * CLIENT_POOL;

/// The room on a pool of door connections: a permit per registration it may carry, each held
/// by a registration ([`Place`]), and a count of registrations that ended (the line moving).
pub(crate) struct Room {
    /// Tokio's semaphore is fair: a permit given back goes to the connection that has waited
    /// longest, never to one that arrived since, so that under a flood the wait for room is
    /// first come, first served, not a lottery that some lose. A [`Place`] holds one (taken
    /// out of the semaphore's count, and added back when the place is dropped).
    permits: Semaphore,
    ended: AtomicU64,
}

impl Room {
    fn new() -> Arc<Room> {
        Arc::new(Room { permits: Semaphore::new(POOL_PERMITS), ended: AtomicU64::new(0) })
    }

    /// A place now, or `None` when the pool is full or others wait before us.
    fn try_take(self: &Arc<Self>) -> Option<Place> {
        self.permits.try_acquire().ok()?.forget();
        Some(Place { room: self.clone() })
    }

    /// Waits in line for a place: while the line moves (a registration ended within
    /// [`ROOM_WAIT`]), until `deadline`. `None`: the line stood still or the deadline passed.
    pub(crate) async fn wait(self: &Arc<Self>, deadline: tokio::time::Instant) -> Option<Place> {
        let acquire = self.permits.acquire();
        tokio::pin!(acquire);
        // `Relaxed`: a count read to see whether it changed; nothing is published with it.
        let mut seen = self.ended.load(Ordering::Relaxed);
        loop {
            let look = deadline.min(tokio::time::Instant::now() + ROOM_WAIT);
            match tokio::time::timeout_at(look, &mut acquire).await {
                Ok(permit) => {
                    // Never closed, so never an error.
                    permit.ok()?.forget();
                    return Some(Place { room: self.clone() });
                }
                Err(_) => {
                    let ended = self.ended.load(Ordering::Relaxed);
                    if ended == seen || tokio::time::Instant::now() >= deadline {
                        return None;
                    }
                    seen = ended;
                }
            }
        }
    }
}

/// A registration's place in its pool ([`Room`]): given back to the longest waiter when the
/// registration ends.
pub(crate) struct Place {
    room: Arc<Room>,
}

impl Place {
    fn of(&self, room: &Arc<Room>) -> bool {
        Arc::ptr_eq(&self.room, room)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.room.ended.fetch_add(1, Ordering::Relaxed);
        self.room.permits.add_permits(1);
    }
}

fn lock_map(m: &DoorMap) -> std::sync::MutexGuard<'_, HashMap<DoorKey, Pool>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One door connection of a client.
struct ClientConn {
    /// Its socket, with the context's counters.
    sock: DoorSocket,
    /// Who owns the door, as the kernel said when we connected: the listener's process, whose
    /// side channel alone may get our region.
    owner: sys::PeerCred,
    next_id: AtomicU64,
    inboxes: Mutex<HashMap<u64, Arc<Inbox>>>,
    /// Its reader stopped (the door closed, the runtime ended, or it idled out): it takes no
    /// more registrations.
    dead: AtomicBool,
}

impl Sender for ClientConn {
    fn socket(&self) -> &DoorSocket {
        &self.sock
    }

    /// A message found no room for [`SEND_WAIT`] (the listener stopped reading), or the door
    /// closed: the frames in it and after it fail to their authors (a registration not sent
    /// is not made; a Confirm not sent leaves its handshake to fall back), and the connection
    /// takes no new registration. Its open ones still read their answers: a server that
    /// committed one sent its Commit before anything that ends the connection.
    fn send_failed(&self, e: &io::Error) {
        tracing::debug!(error = %e, "cannot send on a door connection: no more registrations on it");
        self.dead.store(true, Ordering::Release);
    }
}

impl ClientConn {
    fn inboxes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Inbox>>> {
        self.inboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it has room for another registration (fewer than a [`WINDOW`] open).
    fn has_room(&self) -> bool {
        !self.dead.load(Ordering::Acquire) && self.inboxes().len() < WINDOW
    }

    /// A new registration's id and inbox.
    fn open_inbox(&self) -> (u64, Arc<Inbox>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let inbox = Arc::new(Inbox::default());
        self.inboxes().insert(id, inbox.clone());
        (id, inbox)
    }

    fn die(&self) {
        self.dead.store(true, Ordering::Release);
        // Its registrations end with their inboxes, giving their permits back: a dead
        // connection leaves room for a new one in the pool.
        for (_, inbox) in self.inboxes().drain() {
            inbox.close();
        }
    }

    /// Reads the messages queued (without waiting, at most [`READ_MAX`] frames, and the rest of
    /// the message that reaches it) into their
    /// registrations' inboxes. `Ok(true)`: the queue is empty; `Ok(false)`: more may wait (a
    /// listener that sends without pause does not keep the runtime's thread); an error: the
    /// door connection is over.
    fn read_all(&self, buf: &mut [u8]) -> io::Result<bool> {
        let mut read = 0;
        while read < READ_MAX {
            match recv_message(self.sock.fd.get_ref().as_fd(), self.sock.fd.get_ref().is_inert(), buf) {
                Ok(Some(msg)) => {
                    let inboxes = self.inboxes();
                    let mut wake = Vec::new();
                    for (frame, payload) in msg {
                        read += 1;
                        // A late answer to a registration given up is dropped.
                        if let Some(inbox) = inboxes.get(&frame.id) {
                            wake.push((
                                inbox.clone(),
                                Msg { kind: frame.kind, reason: frame.reason, payload: payload.to_vec() },
                            ));
                        }
                    }
                    drop(inboxes);
                    for (inbox, m) in wake {
                        inbox.push(m);
                    }
                }
                Ok(None) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

/// Reads a client's door connection for as long as it lives, filing what arrives by
/// registration. Dropped with its runtime: the connection then dies with it.
fn client_reader(map: Weak<DoorMap>, key: DoorKey, conn: Arc<ClientConn>) -> impl Future<Output = ()> + Send {
    /// Ends the connection however the reader ends (its runtime dropping it included, also
    /// before it first ran: made before the task, and so never dropped under the map's lock,
    /// which its drop takes).
    struct Ending(Weak<DoorMap>, DoorKey, Arc<ClientConn>);
    impl Drop for Ending {
        fn drop(&mut self) {
            if let Some(map) = self.0.upgrade() {
                let mut m = lock_map(&map);
                if let Some(pool) = m.get_mut(&self.1) {
                    pool.conns.retain(|c| !Arc::ptr_eq(c, &self.2));
                    if pool.conns.is_empty() {
                        m.remove(&self.1);
                    }
                }
            }
            self.2.die();
        }
    }
    let ending = Ending(map.clone(), key, conn.clone());
    async move {
        let _ending = ending;
        read_door_replies(map, conn).await;
    }
}

/// The loop of [`client_reader`]: returns when the door connection ended or idled out.
async fn read_door_replies(map: Weak<DoorMap>, conn: Arc<ClientConn>) {
    let mut idle = Box::pin(tokio::time::sleep(CLIENT_IDLE));
    let mut buf = message_buffer();
    loop {
        let readable = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = conn.sock.fd.poll_read_ready(cx) {
                return Poll::Ready(Some(r));
            }
            idle.as_mut().poll(cx).map(|()| None)
        })
        .await;
        match readable {
            Some(Ok(mut guard)) => match conn.read_all(&mut buf) {
                Ok(true) => guard.clear_ready(),
                // Readiness kept: the next turn reads on, after the runtime ran others.
                Ok(false) => tokio::task::yield_now().await,
                Err(e) => {
                    tracing::debug!(error = %e, "door connection ended");
                    return;
                }
            },
            Some(Err(_)) => return,
            None => {
                // Idle: closed only if no registration uses it, decided under the map's lock,
                // under which registrations are opened.
                let Some(map) = map.upgrade() else { return };
                let m = lock_map(&map);
                if conn.inboxes().is_empty() {
                    drop(m);
                    return;
                }
                drop(m);
                idle.as_mut().reset(tokio::time::Instant::now() + CLIENT_IDLE);
            }
        }
    }
}

/// What a drain of the door left ([`Door::drain_within`]).
#[derive(Debug, Clone, Copy)]
struct Left {
    /// Door connections may still wait in the door's queue (a batch or the refusals ended
    /// first).
    queued: bool,
    /// Messages were left unread on connections held (a budget ended first).
    unread: bool,
}

/// What a client found at one door name.
enum Found {
    /// A trusted door, its connection open (new or kept), and a fresh registration on it.
    Door(Reg),
    /// Nobody there.
    Absent,
    /// A door with a full queue.
    Busy,
    /// Every door connection this runtime may have to the door carries a full window: a place
    /// is waited for in line here.
    Full(Arc<Room>),
    /// A door owned by an untrusted uid.
    Untrusted,
    /// No descriptor or memory to look.
    Starved,
}

impl ClientDoors {
    /// A registration slot on the door `at`: on an open connection of this runtime with
    /// room in its window, or on a new one (`probe`: an unconnected socket to connect with,
    /// taken and given back; `reserved`: a place waited for, used if it is this door's).
    fn open(
        &self,
        counters: &Arc<Counters>,
        at: DoorAt,
        allowed_uids: &[u32],
        probe: &mut Option<OwnedFd>,
        reserved: &mut Option<Place>,
    ) -> Found {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return Found::Absent };
        let key = (at, rt.id());
        let mut map = lock_map(&self.0);
        let (room, place) = match map.get_mut(&key) {
            Some(pool) => {
                pool.conns.retain(|c| !c.dead.load(Ordering::Acquire));
                // Whom to trust is each connection's own (its builder's allowed uids): a
                // connection opened for a builder that trusts the door's owner is no door for
                // one that does not. (Before, a pooled connection was used without a look at
                // its owner, and the owner a builder had allowed served every builder.)
                if pool.conns.iter().any(|c| !c.owner.trusted(allowed_uids)) {
                    tracing::debug!("door owned by a peer this connection does not trust: not registering");
                    counters.door_refused();
                    return Found::Untrusted;
                }
                let Some(place) = reserved.take_if(|p| p.of(&pool.room)).or_else(|| pool.room.try_take()) else {
                    return Found::Full(pool.room.clone());
                };
                // Every registration holds a place, so a place finds a connection with room,
                // or room for a new one (unless one died since the look: rare, waited out).
                if let Some(conn) = pool.conns.iter().find(|c| c.has_room()) {
                    let (id, inbox) = conn.open_inbox();
                    return Found::Door(Reg { conn: conn.clone(), id, inbox, open: false, _place: place });
                }
                if pool.conns.len() >= CLIENT_POOL {
                    return Found::Full(pool.room.clone());
                }
                (pool.room.clone(), place)
            }
            None => {
                let room = Room::new();
                let Some(place) = room.try_take() else { return Found::Full(room) };
                (room, place)
            }
        };
        let fd = match probe.take() {
            Some(fd) => fd,
            None => match sys::seqpacket_socket() {
                Ok(fd) => fd,
                Err(e) => return if sys::is_starved(&e) { Found::Starved } else { Found::Absent },
            },
        };
        // Where the kernel lets the socket refuse descriptors (it did before connecting), none
        // can be queued in it and it is closed in place. Elsewhere the door's owner could queue
        // some, and it goes to a closer when it closes: not while the closers are congested
        // (this connection stays TCP).
        let inert = sys::refuses_descriptors(fd.as_fd());
        if !inert && sys::closers_congested() {
            *probe = Some(fd);
            return Found::Starved;
        }
        let name = at.name();
        let fd = match sys::seqpacket_connect_with(fd, &name) {
            Ok(fd) if inert => PeerFd::new(fd).inert(),
            Ok(fd) => PeerFd::new(fd),
            Err((fd, e)) => {
                *probe = Some(fd);
                return if e.kind() == io::ErrorKind::WouldBlock {
                    full_door(&name, allowed_uids, counters)
                } else if sys::is_starved(&e) {
                    Found::Starved
                } else {
                    Found::Absent
                };
            }
        };
        // Connected: whoever owns the door may have queued descriptors for us already (unless
        // the socket refused them), so from here on the connection is a PeerFd, closed off this
        // thread unless inert.
        let owner = match sys::peer_cred(fd.as_fd()) {
            Ok(cred) if cred.trusted(allowed_uids) => cred,
            Ok(cred) => {
                tracing::debug!(uid = cred.uid, gid = cred.gid, "door owned by an untrusted peer: not registering");
                counters.door_refused();
                return Found::Untrusted;
            }
            Err(e) => return if sys::is_starved(&e) { Found::Starved } else { Found::Absent },
        };
        // Room for a window of registrations and their Confirms while the listener is busy.
        let _ = widen_send_buffer(fd.as_fd());
        let fd = match watch(fd) {
            Ok(fd) => fd,
            Err(e) => return if sys::is_starved(&e) { Found::Starved } else { Found::Absent },
        };
        counters.door_connection();
        let outbox = Arc::new(Outbox::default());
        let conn = Arc::new(ClientConn {
            sock: DoorSocket { fd, outbox: outbox.clone(), counters: counters.clone() },
            owner,
            next_id: AtomicU64::new(1),
            inboxes: Mutex::default(),
            dead: AtomicBool::new(false),
        });
        let (id, inbox) = conn.open_inbox();
        map.entry(key).or_insert_with(|| Pool { conns: Vec::new(), room }).conns.push(conn.clone());
        // Spawned outside the map's lock: a runtime that is shutting down drops the task inside
        // `spawn`, and its drop takes that lock to end the connection.
        drop(map);
        rt.spawn(client_reader(Arc::downgrade(&self.0), key, conn.clone()));
        rt.spawn(send_loop(SenderOf::new(outbox, Arc::downgrade(&conn))));
        Found::Door(Reg { conn, id, inbox, open: false, _place: place })
    }
}

/// A client's registration at the doors of one address (one per member of a reuseport group
/// that has a door). Dropping it cancels what is still open.
pub(crate) struct ClientRegistration {
    doors: Vec<Reg>,
    from_user: bool,
    /// The port the socket is bound to.
    port: u16,
}

/// One registration on one door connection.
struct Reg {
    conn: Arc<ClientConn>,
    id: u64,
    inbox: Arc<Inbox>,
    /// Sent, and not settled: dropping it sends a Cancel.
    open: bool,
    /// Its place in the pool, given back (to the longest waiter) after `drop` has run.
    _place: Place,
}

impl Drop for Reg {
    fn drop(&mut self) {
        self.conn.inboxes().remove(&self.id);
        if self.open {
            // Without waiting, after whatever this registration sent before: a Cancel that
            // is not sent (no room, the connection or its runtime gone) is replaced by the
            // server's own bound (the registration goes stale, the handshake times out).
            let frame = DoorFrame { kind: DoorKind::Cancel, reason: 0, id: self.id };
            let _ = self.conn.sock.push(|b| frame.encode_into(b, &[]));
        }
    }
}

impl fmt::Debug for ClientRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientRegistration").field("doors", &self.doors.len()).finish()
    }
}

/// The doors that may receive a connection to `dst`: the listener bound to exactly that
/// address, and, when `dst` is this host's, listeners bound to the wildcard of its port; with
/// every member of their reuseport groups. Doors owned by an untrusted uid are skipped.
pub(crate) struct Lookup {
    /// Trusted doors, each with a fresh registration slot (given back if dropped unsent).
    doors: Vec<Reg>,
    /// A door had a full queue.
    busy: bool,
    /// Our connections to a door had no room: a place is waited for here.
    full: Option<Arc<Room>>,
    /// The look-up stopped for want of a descriptor or memory.
    starved: bool,
}

/// Looks for the doors of `dst` (see [`Lookup`]), with a registration slot at each.
/// `reserved`: a place waited for after an earlier look found a door's pool full (see
/// [`Lookup::room`]), used at that door instead of a new one.
pub(crate) fn find_doors(
    doors: &ClientDoors,
    counters: &Arc<Counters>,
    dst: SocketAddr,
    allowed_uids: &[u32],
    mut reserved: Option<Place>,
) -> Lookup {
    let dst = sys::unmap(dst);
    let mut found = Lookup { doors: Vec::new(), busy: false, full: None, starved: false };
    // Only a listener of this host can be behind a door: a door named for another host's
    // address is anyone's who bound the name first (an allowed uid's, or one that maps to it
    // from a user namespace), which would then take the connection's bytes in shared memory
    // and leave its real server an empty TCP connection.
    // (Nor for an unspecified destination, which Linux connects to the socket's own address or
    // to loopback: the door named for the unspecified address is a wildcard listener's, or
    // anyone's, not necessarily that of the listener the connection reaches.)
    if dst.ip().is_unspecified() || !sys::is_local_addr(dst) {
        return found;
    }
    // One socket serves every refused probe; a new one only after a door took it.
    let mut probe: Option<OwnedFd> = None;
    let reserved = &mut reserved;
    if look_at(doors, counters, dst, allowed_uids, &mut probe, reserved, &mut found).is_break() {
        return found;
    }
    // A listener bound to exactly `dst` takes the connection before any wildcard one does, so
    // the wildcards are looked at only when it has no door.
    if found.doors.is_empty() {
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), dst.port());
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), dst.port());
        let wildcards = [(dst.is_ipv4() && v4 != dst).then_some(v4), (v6 != dst).then_some(v6)];
        for addr in wildcards.into_iter().flatten() {
            if !found.doors.is_empty()
                || look_at(doors, counters, addr, allowed_uids, &mut probe, reserved, &mut found).is_break()
            {
                break;
            }
        }
    }
    found
}

/// Looks at the doors of a listener bound to `addr` (its solo door, else its reuseport group's),
/// adding a registration slot at each trusted one to `found`. `Break`: the look-up is over
/// (`found` says why: busy, full or starved).
fn look_at(
    doors: &ClientDoors,
    counters: &Arc<Counters>,
    addr: SocketAddr,
    allowed_uids: &[u32],
    probe: &mut Option<OwnedFd>,
    reserved: &mut Option<Place>,
    found: &mut Lookup,
) -> std::ops::ControlFlow<()> {
    use std::ops::ControlFlow::{Break, Continue};
    let places = std::iter::once(None).chain((0..MAX_DOORS).map(Some));
    for (index, place) in places.enumerate() {
        match doors.open(counters, DoorAt { addr, index: place }, allowed_uids, probe, reserved) {
            Found::Door(reg) => {
                found.doors.push(reg);
                if index == 0 {
                    // A solo listener has no siblings.
                    break;
                }
            }
            Found::Starved => {
                found.starved = true;
                return Break(());
            }
            // A full queue at a name of `addr`'s own address where the kernel would hand the
            // connection to a wildcard listener: not that listener's door (anybody may bind
            // the name, and fill its queue to make every client give up), so on as past an
            // absent one, to the wildcard's doors.
            Found::Busy if squatted(addr) => {
                if index > 0 {
                    break;
                }
            }
            // A door with a full queue (its listener is swamped), or no room left on our
            // connections to it: nowhere to register. Not only at that door: the connection
            // may land on its listener, which would not know it, and a registration at the
            // others would wait out its timeout.
            Found::Busy => {
                found.doors.clear();
                found.busy = true;
                return Break(());
            }
            Found::Full(room) => {
                found.doors.clear();
                found.full = Some(room);
                return Break(());
            }
            Found::Untrusted => {}
            // No solo door: look for a reuseport group's. No door at an index: the group ends
            // here.
            Found::Absent => {
                if index > 0 {
                    break;
                }
            }
        }
    }
    Continue(())
}

/// A door whose queue is full: [`Found::Busy`] if its owner is one we would register with,
/// [`Found::Untrusted`] if it is not (as a door that answers is not, though judged by the
/// socket's owner here, where an answering door is judged by its `SO_PEERCRED`). Anybody may
/// bind a door's name (the next index of a reuseport group's, or a specific address's where
/// the listener is bound to the wildcard) and fill its queue: a full queue alone ended every
/// client's look-up, and sent it to TCP. The owner comes from the kernel's list of listening
/// Unix sockets ([`full_door_owner`]); where it cannot tell, busy, as before.
fn full_door(name: &[u8], allowed_uids: &[u32], counters: &Counters) -> Found {
    match full_door_owner(name) {
        Some(uid) if !sys::uid_trusted(uid, allowed_uids) => {
            tracing::debug!(uid, "full door owned by an untrusted uid: not a door of ours");
            counters.door_refused();
            Found::Untrusted
        }
        _ => Found::Busy,
    }
}

/// How often the kernel's list of doors is read at most, while clients meet full doors: once a
/// second, on a thread of its own (`smc-tokio-doors`), never on the thread of `connect`. A
/// read of a long list is slow (the kernel walks every Unix socket of the namespace, and a
/// stranger may keep many), so the interval from a read's start to the next is also at least
/// ten times what the read took: a stranger who makes reads slow makes them rarer, not
/// costlier.
const DOOR_OWNERS_INTERVAL: Duration = Duration::from_secs(1);
/// Read intervals an owner is known for after the last read that listed it: three. A name
/// that one read missed (its squatter let it go just then and took it back after) keeps its
/// owner until two more reads have missed it too; and an owner is forgotten by the time the
/// name may have changed hands.
const DOOR_OWNERS_KEPT_FOR: u32 = 3;

/// The owners of the doors of this network namespace, as the kernel listed them lately.
struct DoorOwners {
    /// Door names, the uids that own their listeners, and when the last read that listed each
    /// began.
    owners: HashMap<Vec<u8>, (u32, Instant)>,
    /// The interval between reads now (at least [`DOOR_OWNERS_INTERVAL`]).
    interval: Duration,
    /// A read is under way.
    reading: bool,
    /// No read begins before this.
    next: Option<Instant>,
}

/// The uid that owns the listener on the door name `name`, as the kernel's recent lists of
/// listening seqpacket sockets said ([`sys::seqpacket_listeners`], door names only): from a
/// read that listed it within [`DOOR_OWNERS_KEPT_FOR`] read intervals; `None` when none did.
/// Never waits: a name not known, or a list a read interval old, asks for a read on a thread
/// of its own, at most one every interval, whose list answers the clients after it. So while
/// a stranger's full door is not known yet, clients find it busy (TCP), as before; once a read
/// has listed it, they pass it over.
fn full_door_owner(name: &[u8]) -> Option<u32> {
    static OWNERS: std::sync::OnceLock<Mutex<DoorOwners>> = std::sync::OnceLock::new();
    let owners = OWNERS.get_or_init(|| {
        Mutex::new(DoorOwners {
            owners: HashMap::default(),
            interval: DOOR_OWNERS_INTERVAL,
            reading: false,
            next: None,
        })
    });
    let now = Instant::now();
    let mut o = owners.lock().unwrap_or_else(|e| e.into_inner());
    let kept_for = o.interval * DOOR_OWNERS_KEPT_FOR;
    let owner = o.owners.get(name).filter(|(_, seen)| now.duration_since(*seen) < kept_for).map(|(uid, _)| *uid);
    if o.reading || o.next.is_some_and(|next| now < next) {
        return owner;
    }
    // Due: a read now, for a name not known, or to keep what is known current.
    o.reading = true;
    o.next = Some(now + o.interval);
    /// Lets the next read begin however this one ends (a panic in a subscriber included).
    struct Done(&'static Mutex<DoorOwners>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).reading = false;
        }
    }
    let read = move || {
        let _done = Done(owners);
        let began = Instant::now();
        let list = sys::seqpacket_listeners(door_prefix().as_bytes());
        let took = began.elapsed();
        let mut o = owners.lock().unwrap_or_else(|e| e.into_inner());
        o.interval = DOOR_OWNERS_INTERVAL.max(took * 10);
        o.next = Some(began + o.interval);
        match list {
            Ok(l) => {
                if !l.whole {
                    tracing::debug!("more listening unix sockets than a read takes: full doors may go unjudged");
                }
                for (n, uid) in l.owners {
                    o.owners.insert(n, (uid, began));
                }
            }
            Err(e) => tracing::debug!(error = %e, "could not read who owns the doors"),
        }
        let kept_for = o.interval * DOOR_OWNERS_KEPT_FOR;
        o.owners.retain(|_, (_, seen)| began.duration_since(*seen) < kept_for);
    };
    // A small stack: the read needs little (its buffer is on the heap). No thread now: the
    // next read is due an interval later.
    if std::thread::Builder::new().name("smc-tokio-doors".into()).stack_size(64 << 10).spawn(read).is_err() {
        o.reading = false;
    }
    owner
}

/// Whether doors named after `addr` cannot be its listener's: `addr` is a specific address, and
/// the kernel would hand a connection to it to a listener bound to the wildcard. Asked only of
/// a door whose queue is full (a look at the kernel's table, where a door that answers is
/// checked by its owner instead); `false` when the kernel cannot say.
fn squatted(addr: SocketAddr) -> bool {
    !addr.ip().is_unspecified()
        && sys::TcpDiag::new(0).and_then(|d| d.listener_is_wildcard(addr)).is_ok_and(|w| w == Some(true))
}

impl Lookup {
    /// When our connections to a door of the address had no room for the registration: the
    /// room to wait in line at for a place, and look again with it.
    pub(crate) fn room(&self) -> Option<Arc<Room>> {
        self.full.clone()
    }

    /// Why there is no door to register at, when there is none.
    pub(crate) fn none(&self) -> Option<Unregistered> {
        if !self.doors.is_empty() {
            None
        } else if self.busy || self.full.is_some() {
            Some(Unregistered::Busy)
        } else if self.starved {
            Some(Unregistered::Starved)
        } else {
            Some(Unregistered::NoDoor)
        }
    }
}

/// What [`register`] came to.
pub(crate) enum Registered {
    /// Registered: the registration, and the TCP socket (bound, not connected) to connect.
    Yes(ClientRegistration, socket2::Socket),
    /// Not registered, and why.
    No(Unregistered),
}

/// Why a connection was not registered at a door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unregistered {
    /// No door we trust at the destination (or no socket to register): connect as plain TCP.
    NoDoor,
    /// The destination's door had no room for us: its listener is swamped.
    Busy,
    /// This process ran out of descriptors (or memory) looking for doors or making the
    /// socket: connect as plain TCP, declined locally for resources.
    Starved,
}

/// Registers a connection to `dst` at the doors `found` for it (see [`find_doors`]), with
/// the CLC `proposal` it makes.
/// `user`: the application's socket, registered (and later connected) in place of a new one
/// of ours when there is a door; it stays in `user` otherwise. An unbound one is bound to the
/// wildcard address and a port the kernel picks.
pub(crate) async fn register(
    found: Lookup,
    dst: SocketAddr,
    instance: u64,
    proposal: &[u8],
    user: &mut Option<socket2::Socket>,
) -> Registered {
    if let Some(why) = found.none() {
        return Registered::No(why);
    }
    // Until sent, a registration has nothing to cancel.
    let mut regs = found.doors;
    let from_user = user.is_some();
    let (sock, port) = match user.take() {
        Some(sock) => match sys::bind_if_unbound(&sock, dst) {
            Ok(()) => {
                let port = sock.local_addr().ok().and_then(|a| a.as_socket()).map(|a| a.port());
                (sock, port)
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot bind the application's socket: connecting as plain tcp");
                *user = Some(sock);
                return Registered::No(Unregistered::NoDoor);
            }
        },
        None => match sys::bound_tcp_socket(dst) {
            Ok((s, port)) => (s, Some(port)),
            Err(e) => {
                tracing::debug!(error = %e, "no socket to register: connecting as plain tcp");
                return Registered::No(if sys::is_starved(&e) { Unregistered::Starved } else { Unregistered::NoDoor });
            }
        },
    };
    let Some((port, cookie)) = port.zip(sys::socket_cookie(sock.as_fd()).ok()) else {
        if from_user {
            *user = Some(sock);
        }
        return Registered::No(Unregistered::NoDoor);
    };
    let head = RegisterHead { instance, cookie, port };
    let mut full = false;
    // Queued at every door first (each door connection's sender waits for room on its own, so
    // the wait is bounded by SEND_WAIT in all, not per door), then waited for: the
    // registration must be in the door's queue before our SYN is in the listener's.
    // A registration alone on its door connection goes out at once (see `send_frame`).
    let queued: Vec<io::Result<Option<u64>>> = regs
        .iter()
        .map(|reg| {
            let alone = regs.len() == 1 && reg.conn.inboxes().len() == 1;
            queue_frame(&reg.conn.sock, alone, |b| head.encode_into(b, reg.id, proposal))
        })
        .collect();
    // Open from the moment it is queued: dropped before it went out, it is cancelled after it.
    for (reg, q) in regs.iter_mut().zip(&queued) {
        reg.open = q.is_ok();
    }
    for (reg, q) in regs.iter_mut().zip(queued) {
        let sent = match q {
            Ok(None) => Ok(()),
            Ok(Some(n)) => reg.conn.sock.outbox.over(n).await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            reg.open = false;
            full |= e.kind() == io::ErrorKind::WouldBlock;
        }
    }
    // A door that took no registration (it closed its connection: it does not trust us; or it
    // had no room for it: its listener is swamped) is left.
    regs.retain(|r| r.open);
    if regs.is_empty() {
        if from_user {
            *user = Some(sock);
        }
        return Registered::No(if full { Unregistered::Busy } else { Unregistered::NoDoor });
    }
    Registered::Yes(ClientRegistration { doors: regs, from_user, port }, sock)
}

impl ClientRegistration {
    /// Whether the registered socket is the application's.
    pub(crate) fn is_users(&self) -> bool {
        self.from_user
    }

    /// The port the registered socket is bound to.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The wire the rest of the handshake runs over, once the TCP connection is up. `secret` is
    /// the Proposal's: a door that answers "no handshake" reads to the machine as that
    /// connection's Decline. `connected`: the connection's (local, peer) addresses, told to
    /// the listener with our first message (a listener that answered before the connection
    /// arrived checks them, and may commit before it accepts).
    pub(crate) fn into_wire(self, secret: Secret, connected: Option<(SocketAddr, SocketAddr)>) -> ClientWire {
        let doors = self.doors.into_iter().map(Some).collect();
        let connected = connected.map(|(local, peer)| ConnectedTuple { local, peer });
        ClientWire { doors, chosen: None, secret, last_no: None, connected }
    }
}

/// The client's end of a handshake on the door (see [`Wire`]). Until a door answers, every door
/// of the address is listened to (the connection reached one member of a reuseport group);
/// the first to answer is the one, and the others are cancelled.
pub(crate) struct ClientWire {
    doors: Vec<Option<Reg>>,
    chosen: Option<usize>,
    secret: Secret,
    last_no: Option<DeclineReason>,
    /// Told with our first message, then `None`.
    connected: Option<ConnectedTuple>,
}

impl fmt::Debug for ClientWire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientWire").field("chosen", &self.chosen).finish_non_exhaustive()
    }
}

impl ClientWire {
    /// Whether a door has answered (a handshake is under way with its listener).
    pub(crate) fn answered(&self) -> bool {
        self.chosen.is_some()
    }

    /// The handshake with the chosen door came to an end both sides agree on (SMC, or a
    /// fallback in step): nothing is left to cancel there.
    pub(crate) fn settled(&mut self) {
        if let Some(Some(r)) = self.chosen.map(|i| &mut self.doors[i]) {
            r.open = false;
        }
    }

    /// Reads what door `i` has; `Some` ends the wait.
    fn take(&mut self, i: usize) -> Option<io::Result<Option<Vec<u8>>>> {
        let got = self.doors[i].as_ref()?.inbox.try_next()?;
        match got {
            Some(m) if m.kind == DoorKind::Clc => {
                if self.chosen.is_none() {
                    self.chosen = Some(i);
                    // The connection is this door's listener's: cancel the others.
                    for (j, d) in self.doors.iter_mut().enumerate() {
                        if j != i {
                            *d = None;
                        }
                    }
                }
                Some(Ok(Some(m.payload)))
            }
            Some(m) if m.kind == DoorKind::Unmatched && self.chosen.is_none() => {
                self.last_no = Some(DeclineReason::from_u8(m.reason).unwrap_or(DeclineReason::Internal));
                if let Some(r) = &mut self.doors[i] {
                    r.open = false;
                }
                self.doors[i] = None;
                self.all_said_no()
            }
            // The listener that got the connection says it stays TCP: no other door will answer.
            Some(m) if m.kind == DoorKind::Refused && self.chosen.is_none() => {
                self.last_no = Some(DeclineReason::from_u8(m.reason).unwrap_or(DeclineReason::Internal));
                if let Some(r) = &mut self.doors[i] {
                    r.open = false;
                }
                self.doors.iter_mut().for_each(|d| *d = None);
                self.all_said_no()
            }
            // Its door connection closed, or nonsense from a door: nothing more from it.
            _ => {
                if let Some(r) = &mut self.doors[i] {
                    r.open = false;
                }
                self.doors[i] = None;
                if self.chosen == Some(i) {
                    return Some(Ok(None));
                }
                self.all_said_no()
            }
        }
    }

    /// When every door has refused or closed: their "no", as a Decline for the machine, or
    /// the end of the stream.
    fn all_said_no(&self) -> Option<io::Result<Option<Vec<u8>>>> {
        if self.doors.iter().any(Option::is_some) {
            return None;
        }
        Some(Ok(self
            .last_no
            .map(|reason| ClcMessage::Decline(Decline { secret: self.secret, reason }).encode().unwrap_or_default())))
    }
}

/// A client's handshake message that did not go out on its door connection (no room in time,
/// the listener closed the door, its sender went away, a failed send): since the server commits
/// only on our Confirm, a handshake whose message was not sent may stay TCP, also after it
/// confirmed ([`NotSent::is`]).
#[derive(Debug)]
pub(crate) struct NotSent(io::Error);

impl NotSent {
    /// `e`, the reason a message did not go out, marked as such.
    pub(crate) fn wrap(e: io::Error) -> io::Error {
        io::Error::new(e.kind(), NotSent(e))
    }

    /// Whether `e` is the error of a message that did not go out.
    pub(crate) fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|e| e.is::<NotSent>())
    }
}

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "our door message was not sent: {}", self.0)
    }
}

impl std::error::Error for NotSent {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl Wire for ClientWire {
    fn peer_process(&self) -> Option<sys::PeerCred> {
        Some(self.chosen.and_then(|i| self.doors[i].as_ref())?.conn.owner)
    }

    async fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        // The client speaks only after a door answered.
        let r = self.chosen.and_then(|i| self.doors[i].as_ref()).ok_or_else(|| io::Error::other("no door answered"))?;
        let connected = self.connected.take();
        let alone = r.conn.inboxes().len() == 1;
        let sent = send_frame(&*r.conn, alone, |b| match connected {
            Some(t) => t.encode_into(b, r.id, msg),
            None => DoorFrame { kind: DoorKind::Clc, reason: 0, id: r.id }.encode_into(b, msg),
        })
        .await;
        // A door message goes whole or not at all, and the outbox fails only messages that did
        // not go: the server never read this one (if it was our Confirm, it cannot commit).
        sent.map_err(NotSent::wrap)
    }

    async fn recv(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            for i in 0..self.doors.len() {
                if let Some(r) = self.take(i) {
                    return r;
                }
            }
            if let Some(r) = self.all_said_no() {
                return r;
            }
            std::future::poll_fn(|cx| {
                let mut any = Poll::Pending;
                for d in self.doors.iter().flatten() {
                    if d.inbox.poll_ready(cx).is_ready() {
                        any = Poll::Ready(());
                    }
                }
                any
            })
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smc::manager::OTHER_UID_SHARE;
    use std::os::fd::AsRawFd;

    /// A trusted client that sends without pause on its door connection does not keep the
    /// listener's turn: a read of the door takes a bounded number of its messages, says that
    /// more wait, and comes back after the listener's other work.
    #[tokio::test]
    async fn a_door_connection_sending_without_pause_gets_a_bounded_turn() {
        use crate::proto::door::{DoorFrame, DoorKind};
        // Its task has not run yet (nothing here yields before the look below): the look is the
        // first to take the connection in and read it.
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let door = listener.door_for_test().expect("a door");
        let client = roomy_door_connection(door);
        for id in 1..=1000u64 {
            let frame = DoorFrame { kind: DoorKind::Cancel, reason: 0, id }.encode(&[]);
            sys::send_with_fds(client.as_fd(), &frame, &[]).unwrap();
        }
        let mut st = door.lock();
        assert!(
            matches!(door.drain(&mut st), Ok(true)),
            "a look at the door read 1000 messages of one connection in one turn"
        );
        assert_eq!(st.conns.len(), 1, "the connection was ended");
    }

    /// One door connection files at most [`CONN_REGISTRATIONS`] registrations at once; the
    /// rest are answered "congested" at once, and the door keeps room for other clients.
    #[tokio::test]
    async fn one_door_connection_files_a_bounded_number_of_registrations() {
        use crate::proto::door::RegisterHead;
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let door = listener.door_for_test().expect("a door");
        let client = roomy_door_connection(door);
        // Proposals without shared memory: filed, and not answered before their connection
        // comes (none will).
        let proposal = proposal(None);
        let sent = CONN_REGISTRATIONS as u64 + 40;
        for id in 1..=sent {
            let frame = RegisterHead { instance: 1, cookie: id, port: 10_000 + id as u16 }.encode_frame(id, &proposal);
            sys::send_with_fds(client.as_fd(), &frame, &[]).unwrap();
        }
        {
            let mut st = door.lock();
            while matches!(door.drain(&mut st), Ok(true)) {}
            assert_eq!(st.count, CONN_REGISTRATIONS, "filed up to the bound");
            assert_eq!(st.conns.len(), 1, "the connection stays");
        }
        let mut refused = Vec::new();
        for (frame, _) in sent_frames(&client).await {
            assert_eq!((frame.kind, frame.reason), (DoorKind::Unmatched, DeclineReason::HandshakeCongested as u8));
            refused.push(frame.id);
        }
        assert_eq!(refused, (CONN_REGISTRATIONS as u64 + 1..=sent).collect::<Vec<_>>(), "the rest answered congested");
    }

    /// A registration read after its connection was handed out as TCP (its client's port
    /// missed) is answered at once: no accept of this door will match it, and its client waited
    /// out its handshake timeout for an answer. Refused (final) by a solo door; unmatched (not
    /// final) by a member of a reuseport group, which may have missed another connection from
    /// that port while a sibling has this one.
    #[tokio::test]
    async fn a_registration_read_after_its_connection_missed_is_refused_at_once() {
        use crate::proto::door::RegisterHead;
        for (reuseport, kind) in [(false, DoorKind::Refused), (true, DoorKind::Unmatched)] {
            let (queue, door) = door_of_a_queue(reuseport);
            let server = queue.local_addr().unwrap();
            let client = roomy_door_connection(&door);
            door.lock().note_missed((SocketAddr::from(([127, 0, 0, 1], 40_001)), server));
            let proposal = proposal(None);
            for (id, port) in [(1, 40_001), (2, 40_002)] {
                let frame = RegisterHead { instance: 1, cookie: id, port }.encode_frame(id, &proposal);
                sys::send_with_fds(client.as_fd(), &frame, &[]).unwrap();
            }
            {
                let mut st = door.lock();
                while matches!(door.drain(&mut st), Ok(true)) {}
                assert_eq!(st.count, 1, "reuseport {reuseport}: the other one is filed");
            }
            let answers: Vec<_> = sent_frames(&client).await.into_iter().map(|(f, _)| (f.id, f.kind)).collect();
            assert_eq!(answers, vec![(1, kind)], "reuseport {reuseport}");
        }
    }

    /// Drains `door` until it holds `n` door connections (within 10 s).
    fn take_in(door: &Door, n: usize) {
        let mut st = door.lock();
        let deadline = Instant::now() + Duration::from_secs(10);
        while st.conns.len() < n && Instant::now() < deadline {
            let _ = door.drain(&mut st);
        }
        assert_eq!(st.conns.len(), n, "the door connections were not taken in");
    }

    /// A listener whose door holds `n` connections, the one at place `sending` with a frame
    /// queued; the clients' ends.
    async fn door_with_one_sending(n: usize, sending: usize) -> (crate::SmcListener, Vec<OwnedFd>) {
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let door = listener.door_for_test().expect("a door");
        let clients: Vec<OwnedFd> = (0..n).map(|_| sys::seqpacket_connect(door.name()).unwrap()).collect();
        take_in(door, n);
        let cancel = DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 7 }.encode(&[]);
        sys::send_with_fds(clients[sending].as_fd(), &cancel, &[]).unwrap();
        (listener, clients)
    }

    /// A look-up for a connection that registered nothing (a plain client on this host) reads
    /// only the door connections with something queued: with 100 held and one of them sending,
    /// one (it asked each of the 100, a system call each).
    #[tokio::test]
    async fn a_look_up_reads_only_the_door_connections_with_something_queued() {
        crate::sys::raise_fd_limit();
        let (listener, _clients) = door_with_one_sending(100, 37).await;
        let door = listener.door_for_test().expect("a door");
        let queue = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = queue.local_addr().unwrap();
        door.begin_turn();
        let before = door.conn_reads.load(Ordering::Relaxed);
        let _client = std::net::TcpStream::connect(server).unwrap();
        let (ours, peer) = queue.accept().unwrap();
        assert!(door.lookup(peer, server, ours.as_fd()).is_none(), "a plain connection matched");
        let reads = door.conn_reads.load(Ordering::Relaxed) - before;
        assert_eq!(reads, 1, "door connections read for one look-up");
    }

    /// Places go in turn from where the last budget ran out, around the end.
    #[test]
    fn places_go_in_turn_from_where_the_last_read_stopped() {
        assert_eq!(in_turn(4, 6).collect::<Vec<_>>(), [2, 3, 0, 1]);
        assert_eq!(in_turn(3, 0).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(in_turn(0, 5).count(), 0);
    }

    /// Tries of the readiness set wait a second after the first failure, twice as long after
    /// each further one, and at most a minute.
    #[test]
    fn readiness_set_tries_back_off_to_a_minute() {
        let secs = Duration::from_secs;
        let off = |ago: u64, wait: u64| Ready::Off { since: Instant::now() - secs(ago), wait: secs(wait) };
        assert_eq!(Ready::Unmade.retry_due(), Some(READY_RETRY));
        assert_eq!(off(0, 1).retry_due(), None);
        assert_eq!(off(1, 1).retry_due(), Some(secs(2)));
        assert_eq!(off(5, 4).retry_due(), Some(secs(8)));
        assert_eq!(off(40, 32).retry_due(), Some(READY_RETRY_MAX));
        assert_eq!(off(61, 60).retry_due(), Some(READY_RETRY_MAX));
    }

    /// A readiness set that failed is made again once its wait is over, with every connection
    /// the door holds: the door reads all of them meanwhile, and only the ready ones after (it
    /// read all of them for as long as the listener lived).
    #[tokio::test]
    async fn a_failed_readiness_set_is_made_again() {
        let (listener, _clients) = door_with_one_sending(10, 4).await;
        let door = listener.door_for_test().expect("a door");
        let mut st = door.lock();
        st.ready = Ready::Off { since: Instant::now(), wait: Duration::from_secs(3600) };
        assert_eq!(st.readable_conns().0.len(), 10, "while the set is off, every connection is read");
        st.ready = Ready::Off { since: Instant::now() - READY_RETRY, wait: READY_RETRY };
        let (conns, _) = st.readable_conns();
        assert!(matches!(st.ready, Ready::Set(..)), "the set was not made again");
        let four = st.conns[4].clone();
        assert_eq!(conns.len(), 1, "connections read once the set was made again");
        assert!(Arc::ptr_eq(&conns[0].1, &four), "the one read is not the one with a frame");
    }

    /// Drains within a budget take the door connections with something queued in turn: three
    /// kept full do not spend every budget before a fourth is read (the kernel reports the
    /// ready ones in the same order look after look).
    #[tokio::test]
    async fn drains_within_a_budget_take_the_ready_connections_in_turn() {
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let door = listener.door_for_test().expect("a door");
        let clients: Vec<OwnedFd> = (0..4).map(|_| roomy_door_connection(door)).collect();
        take_in(door, clients.len());
        let frame = DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 7 }.encode(&[]);
        let message = frame.repeat(proto_door::DOOR_BATCH_FRAMES);
        // Three with 32 messages of 64 frames each (eight budgets of frames), then one with a frame.
        for c in &clients[..3] {
            for _ in 0..32 {
                sys::send_with_fds(c.as_fd(), &message, &[]).unwrap();
            }
        }
        sys::send_with_fds(clients[3].as_fd(), &frame, &[]).unwrap();
        let mut st = door.lock();
        let last = st.conns[3].clone();
        let queued = |c: &ServerConn| {
            let mut n: libc::c_int = 0;
            // SAFETY: FIONREAD writes one c_int.
            unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(c.sock.fd.get_ref()), libc::FIONREAD, &mut n) };
            n
        };
        assert!(queued(&last) > 0);
        for _ in 0..4 {
            let (mut budget, mut refusals) = (READ_MAX, usize::MAX);
            let _ = door.drain_within(&mut st, &mut budget, &mut refusals);
        }
        assert_eq!(queued(&last), 0, "the connection with one frame was not read in four budgets");
    }

    /// A door connection whose messages bring descriptors (a door as on a kernel before Linux
    /// 6.16, where a client can queue them before the door takes its connection in) is ended at
    /// the first such message, which is left queued: the door takes none of its descriptors
    /// into the process (it took each message's, up to 253, and went on reading).
    #[cfg(feature = "test-util")]
    #[tokio::test]
    async fn a_door_message_with_descriptors_ends_its_connection() {
        crate::faults::doors_take_descriptors_as_before_6_16(true);
        let listener = crate::SmcListener::bind("127.0.0.1:0").await;
        crate::faults::doors_take_descriptors_as_before_6_16(false);
        let listener = listener.unwrap();
        let door = listener.door_for_test().expect("a door");
        let client = sys::seqpacket_connect(door.name()).unwrap();
        let (x, x_peer) = std::os::unix::net::UnixStream::pair().unwrap();
        // A frame the door takes from any client (a cancel of a registration it does not have).
        let cancel = DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 7 }.encode(&[]);
        for _ in 0..3 {
            sys::send_with_any_fds(client.as_fd(), &cancel, &[x.as_fd(); 200]).unwrap();
        }
        drop(x);
        {
            let mut st = door.lock();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(door.drain(&mut st), Ok(true)) && Instant::now() < deadline {}
            assert!(st.conns.is_empty(), "the connection that sent descriptors is still served");
        }
        // Its close, on a closer, took the messages and their descriptors with it.
        x_peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(std::io::Read::read(&mut &x_peer, &mut [0u8; 1]).unwrap(), 0);
    }

    /// A door connection that another runtime's accept took in (the application's, say) is
    /// watched and answered by the listener's runtime: that runtime's end does not take it
    /// along, and its registrations are answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_door_connection_taken_in_by_another_runtime_outlives_it() {
        use crate::proto::door::RegisterHead;
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let door = listener.door_for_test().expect("a door");
        let client = roomy_door_connection(door);
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let mut st = door.lock();
                    while matches!(door.drain(&mut st), Ok(true)) {}
                    assert_eq!(st.conns.len(), 1, "taken in");
                });
            })
            .join()
            .unwrap();
        });
        let proposal = proposal(Some(crate::proto::clc::ShmOffer { link_group: 0 }));
        let frame = RegisterHead { instance: 1, cookie: 1, port: 20_001 }.encode_frame(1, &proposal);
        sys::send_with_fds(client.as_fd(), &frame, &[]).unwrap();
        let mut buf = message_buffer();
        let deadline = Instant::now() + Duration::from_secs(5);
        let answer = loop {
            match recv_message(client.as_fd(), false, &mut buf) {
                Ok(Some(mut msg)) => break msg.next().map(|(f, p)| (f.kind, f.id, p.to_vec())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                other => panic!("no answer: {:?}", other.map(|m| m.map(|f| f.count()))),
            }
        };
        let (kind, id, payload) = answer.expect("a frame");
        assert_eq!((kind, id), (DoorKind::Clc, 1));
        let accept = crate::proto::clc::decode(&payload).unwrap();
        assert!(matches!(accept, crate::proto::clc::Decoded::Message(ClcMessage::Accept(_), _)), "answered {accept:?}");
    }

    /// A message with a frame no client sends ends the door connection before anything of it
    /// is filed: the registrations ahead of that frame in the message are not taken in.
    #[tokio::test]
    async fn a_message_with_a_servers_frame_is_not_filed_at_all() {
        use crate::proto::door::RegisterHead;
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let door = listener.door_for_test().expect("a door");
        let client = roomy_door_connection(door);
        // Shared-memory offers: a solo door answers them at once, so filed ones would be
        // queued for the listener task to answer.
        let proposal = proposal(Some(crate::proto::clc::ShmOffer { link_group: 0 }));
        let mut msg = Vec::new();
        for id in 1..=3u64 {
            RegisterHead { instance: 1, cookie: id, port: 20_000 + id as u16 }.encode_into(&mut msg, id, &proposal);
        }
        DoorFrame { kind: DoorKind::Unmatched, reason: 0, id: 4 }.encode_into(&mut msg, &[]);
        sys::send_with_fds(client.as_fd(), &msg, &[]).unwrap();
        {
            let mut st = door.lock();
            while matches!(door.drain(&mut st), Ok(true)) {}
            assert_eq!(st.count, 0, "registrations filed from a message that ended the connection");
            assert!(st.early.is_empty(), "registrations to answer from a message that ended the connection");
            assert!(st.conns.is_empty(), "the connection stays");
        }
        assert!(sent_frames(&client).await.is_empty(), "answers to a message that was not filed");
    }

    /// A registrant cannot have a connection to another listener confirmed as one to ours: a
    /// connection to the same port of another address of this host (here 127.0.0.2, where a
    /// listener of its own waits) is refused, though the kernel's record of it matches the
    /// registration's socket and uid.
    #[tokio::test]
    async fn a_connection_to_another_address_of_the_port_is_not_confirmed() {
        use crate::proto::door::ConnectedTuple;
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let door = listener.door_for_test().expect("a door");
        let Ok(other) = std::net::TcpListener::bind(("127.0.0.2", port)) else {
            eprintln!("SKIPPED: 127.0.0.2:{port} is taken");
            return;
        };
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let (client, key, _door_conn) = register_and_connect(door, &sock, 7, other.local_addr().unwrap());
        let _accepted = other.accept().unwrap();
        let said = |server: SocketAddr| Some(ConnectedTuple { local: client, peer: server });
        assert_eq!(
            door.verify(&key, said(other.local_addr().unwrap())),
            Verified::No,
            "confirmed a connection to another listener"
        );
    }

    /// Registers the bound socket `sock` at `door` under `id` with a shared-memory offer, on a
    /// door connection of its own (returned), connects it to `server`, and has the door read
    /// the registration: the client's address and the registration's key.
    fn register_and_connect(
        door: &Door,
        sock: &socket2::Socket,
        id: u64,
        server: SocketAddr,
    ) -> (SocketAddr, EarlyKey, OwnedFd) {
        use crate::proto::clc::ShmOffer;
        use crate::proto::door::RegisterHead;
        let client = sock.local_addr().unwrap().as_socket().unwrap();
        let cookie = sys::socket_cookie(sock.as_fd()).unwrap();
        let frame = RegisterHead { instance: 1, cookie, port: client.port() }
            .encode_frame(id, &proposal(Some(ShmOffer { link_group: 0 })));
        let door_conn = sys::seqpacket_connect(door.name()).unwrap();
        sys::send_with_fds(door_conn.as_fd(), &frame, &[]).unwrap();
        sock.connect(&server.into()).unwrap();
        let mut st = door.lock();
        let _ = door.drain(&mut st);
        let conn = st.conns.last().expect("the door connection").clone();
        (client, EarlyKey { conn, id }, door_conn)
    }

    /// While its listener backs off taking new door connections (closers congested, no
    /// descriptor), the door still reads the ones it holds: their clients' registrations would
    /// wait out the backoff (100 ms) otherwise. New ones wait in its queue meanwhile.
    #[tokio::test]
    async fn a_door_that_takes_no_new_connections_still_reads_those_it_holds() {
        use crate::proto::clc::ShmOffer;
        use crate::proto::door::RegisterHead;
        let (_queue, door) = door_for_a_queue();
        let held = sys::seqpacket_connect(door.name()).unwrap();
        // Drains (taking new connections or not) until `done`, letting the runtime's reactor
        // run in between.
        async fn drain_until(door: &Door, accept: bool, what: &str, done: impl Fn(&Door) -> bool) {
            let t = Instant::now();
            loop {
                let mut budget = TURN_READS;
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                let _ = door.poll_drain(&mut cx, &mut budget, accept);
                if done(door) {
                    return;
                }
                assert!(t.elapsed() < Duration::from_secs(10), "{what}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        drain_until(&door, true, "the door connection was not taken", |d| d.lock().conns.len() == 1).await;
        // A knock waits in the queue; the held connection registers.
        let _knock = sys::seqpacket_connect(door.name()).unwrap();
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let client = sock.local_addr().unwrap().as_socket().unwrap();
        let head = RegisterHead { instance: 1, cookie: sys::socket_cookie(sock.as_fd()).unwrap(), port: client.port() };
        let frame = head.encode_frame(7, &proposal(Some(ShmOffer { link_group: 0 })));
        sys::send_with_fds(held.as_fd(), &frame, &[]).unwrap();
        drain_until(&door, false, "the held connection's registration was not read", |d| d.lock().count == 1).await;
        assert_eq!(door.lock().conns.len(), 1, "a new door connection taken while not taking any");
        drain_until(&door, true, "the knock was not taken once the door takes connections again", |d| {
            d.lock().conns.len() == 2
        })
        .await;
    }

    /// However many verified registrations wait for the sweep to ask about our ends of their
    /// connections (past ENTRY_TTL, kept while our end is there), each is asked about in turn,
    /// those asked least recently first: the kernel is asked about a bounded number a second,
    /// and asking in the map's order, which stays the same, asked about the same ones every
    /// second while the rest waited for good.
    #[tokio::test]
    async fn the_sweep_asks_about_every_waiting_connection_in_turn() {
        let (queue, mut door) = door_for_a_queue();
        door.looks_per_sweep = 1;
        let server = queue.local_addr().unwrap();
        let socks: Vec<_> = (0..3).map(|id| seen(&door, 10 + id, server)).collect();
        door.age_for_test(ENTRY_TTL + Duration::from_secs(1));
        for _ in 0..3 {
            door.lock().verified_looked = None;
            door.sweep();
        }
        {
            let st = door.lock();
            let entries: Vec<_> = st.entries.values().flatten().collect();
            assert_eq!(entries.len(), 3, "registrations whose our ends are there dropped");
            assert!(entries.iter().all(|e| e.looked.is_some()), "three sweeps of one look each skipped one");
        }
        // One whose client reset its connection (our end goes with it): dropped at its look.
        let mut socks = socks;
        let (sock, client, _door_conn) = socks.remove(0);
        sock.set_linger(Some(Duration::ZERO)).unwrap();
        drop(sock);
        within_10s("our end outlived its client's reset", || !matches!(door.diag.owner(server, client), Ok(Some(_))));
        for _ in 0..3 {
            door.lock().verified_looked = None;
            door.sweep();
        }
        assert_eq!(door.lock().entries.values().flatten().count(), 2, "the registration whose our end went");
        drop(socks);
    }

    /// Connections handed out as TCP are remembered for a registration's lifetime however many
    /// come after: a burst of plain connections (anyone's) pushed an earlier one out of a list
    /// as long as the door's registrations, and that connection's registration, read then,
    /// could commit it. Past that lifetime they are forgotten, and their table goes.
    #[test]
    fn no_burst_of_misses_pushes_an_earlier_one_out() {
        let mut st = DoorState::default();
        let server = SocketAddr::from(([127, 0, 0, 1], 80));
        let victim = SocketAddr::from(([127, 0, 0, 1], 40_000));
        assert!(!st.missed.recently(victim.port()));
        st.note_missed((victim, server));
        for i in 0..2 * MAX_REGISTRATIONS as u32 {
            let from = SocketAddr::from(([127, 1, (i >> 8) as u8, i as u8], 1024 + (i % 30_000) as u16));
            st.note_missed((from, server));
        }
        assert!(st.missed.recently(victim.port()), "a burst of misses pushed the first one out");
        assert!(!st.missed.recently(39_999), "a port that never missed");
        // Past ENTRY_TTL after the last miss (the door's clock moved on): forgotten, and the
        // table given back.
        let epoch = st.missed.epoch.expect("the clock started");
        st.missed.epoch = Some(epoch.checked_sub(ENTRY_TTL + Duration::from_secs(2)).expect("a clock this old"));
        assert!(!st.missed.recently(victim.port()), "a miss outlived ENTRY_TTL");
        assert!(st.missed.at.is_none(), "the table outlived its last entry");
    }

    /// A registration whose connection `verify` saw is matched at accept only to that very
    /// socket: the kernel is asked again then. A registrant that reset the connection it had
    /// verified left its four-tuple to the next socket bound to that port (anyone's), whose
    /// connection must not be served to the registrant's handshake.
    #[tokio::test]
    async fn a_verified_registration_does_not_match_the_next_socket_on_its_four_tuple() {
        use crate::proto::door::ConnectedTuple;
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        let door = listener.door_for_test().expect("a door");
        let bound = || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_reuse_address(true).unwrap();
            s
        };
        let first = bound();
        first.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let cookie = sys::socket_cookie(first.as_fd()).unwrap();
        let (client, key, _door_conn) = register_and_connect(door, &first, 7, server);
        assert_eq!(
            door.verify(&key, Some(ConnectedTuple { local: client, peer: server })),
            Verified::Yes,
            "its own connection"
        );
        // Reset: the four-tuple is free at once (no TIME_WAIT), and another socket takes it.
        first.set_linger(Some(std::time::Duration::ZERO)).unwrap();
        drop(first);
        let next = bound();
        next.bind(&client.into()).unwrap();
        next.connect(&server.into()).unwrap();
        assert_ne!(sys::socket_cookie(next.as_fd()).unwrap(), cookie);
        let mut st = door.lock();
        assert!(
            door.take(&mut st, client, server, next.as_fd()).is_none(),
            "another socket's connection matched the registration"
        );
        assert_eq!(st.count, 0, "the registration, whose connection is gone, ended");
        assert!(st.missed.recently(client.port()), "a later Connected frame naming the tuple would pass");
    }

    /// Looks at `done` every 5 ms, on this thread, until it holds; fails saying `what` after
    /// 10 s (a bound to fail by, not a speed expected).
    fn within_10s(what: &str, mut done: impl FnMut() -> bool) {
        let t = Instant::now();
        while !done() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A listening socket that never accepts (connections wait in its queue) and a solo door
    /// for it, in a context of its own.
    fn door_for_a_queue() -> (std::net::TcpListener, Door) {
        door_of_a_queue(false)
    }

    /// [`door_for_a_queue`], the door a member of a reuseport group's where `reuseport`.
    fn door_of_a_queue(reuseport: bool) -> (std::net::TcpListener, Door) {
        let queue = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ctx = crate::Context::new();
        let server = queue.local_addr().unwrap();
        let door = Door::open(
            ctx.settings_handle().clone(),
            ctx.counters().clone(),
            (server, 0, false),
            Overrides::default(),
            reuseport,
        )
        .expect("a door");
        (queue, door)
    }

    /// Registers a new socket of 127.0.0.1 at `door` under `id`, connects it to `server` and
    /// has the door verify the connection, as its handshake does: the socket, its address and
    /// its door connection.
    fn seen(door: &Door, id: u64, server: SocketAddr) -> (socket2::Socket, SocketAddr, OwnedFd) {
        use crate::proto::door::ConnectedTuple;
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let (client, key, door_conn) = register_and_connect(door, &sock, id, server);
        assert_eq!(
            door.verify(&key, Some(ConnectedTuple { local: client, peer: server })),
            Verified::Yes,
            "its own connection"
        );
        (sock, client, door_conn)
    }

    /// A registration whose connection a solo door saw (its handshake ran, and may have
    /// committed) lives while the kernel holds our end of that connection unaccepted (an
    /// application that does not accept keeps the listener from taking connections from the
    /// kernel), also when its client's door connection closes: the sweep dropped it after 30
    /// s, and the door connection's end at once, and the connection, accepted later, went out
    /// as TCP with its client on shared memory. Once our end is gone, it goes; and a door gone
    /// blind meanwhile keeps it for its handshake (before, it dropped it, and handed its
    /// connection out as TCP).
    #[tokio::test]
    async fn a_seen_registration_waits_for_its_connection_while_the_kernel_holds_it() {
        let (queue, door) = door_for_a_queue();
        let server = queue.local_addr().unwrap();
        let (first, client, door_conn) = seen(&door, 7, server);
        // Its client's door connection closes (an idle one does after 10 s).
        drop(door_conn);
        // Its end shows once no process holds the descriptor: a child another thread is
        // spawning holds copies of the process's descriptors until it execs.
        within_10s("the door connection's end was not read", || {
            let mut st = door.lock();
            let _ = door.drain(&mut st);
            st.conns.is_empty()
        });
        assert_eq!(door.lock().count, 1, "dropped with its door connection");
        door.age_for_test(ENTRY_TTL + Duration::from_secs(1));
        door.sweep();
        assert_eq!(door.lock().count, 1, "dropped while its connection waits in the kernel's queue");
        // Reset by its client before the accept: our end is gone, and so is the registration.
        first.set_linger(Some(Duration::ZERO)).unwrap();
        drop(first);
        // The kernel may take the reset in a softirq of its own, later: wait for it.
        within_10s("our end outlived its client's reset", || !matches!(door.diag.owner(server, client), Ok(Some(_))));
        // Not asked again within a second of the last look (a look in the future: no test
        // thread's stall can make a second pass).
        door.lock().verified_looked = Some(Instant::now() + Duration::from_secs(3600));
        door.sweep();
        assert_eq!(door.lock().count, 1, "the kernel asked again within a second");
        door.age_for_test(Duration::ZERO);
        door.sweep();
        assert_eq!(door.lock().count, 0, "kept for a connection that is gone");
        // Blind: the registration is kept for its handshake, which takes its connection.
        let (_second, client2, _c2) = seen(&door, 8, server);
        door.go_blind_for_test();
        assert_eq!(door.lock().count, 1, "a seen registration was dropped as the door went blind");
        // Our end of its connection, as the listener accepts it (behind the first's, reset).
        let accepted = loop {
            let (s, from) = queue.accept().unwrap();
            if from == client2 {
                break s;
            }
        };
        let mut st = door.lock();
        assert!(door.take(&mut st, client, server, accepted.as_fd()).is_none());
        assert!(matches!(door.take(&mut st, client2, server, accepted.as_fd()), Some(Matched::Early(_))));
        assert_eq!(st.count, 0);
    }

    /// With other uids trusted, the clients of any one of them hold at most a quarter of the
    /// door connections and all of them together half ([`uid_share`]): the rest stay for the clients of the listener's own uid, which no
    /// share bounds. (One other uid's door connections took the whole budget before, and every
    /// other client's connections went plain.) Needs root (and uids to take), to connect as
    /// other uids from a child process.
    #[tokio::test]
    async fn other_uids_hold_at_most_their_shares_of_the_door_connections() {
        // SAFETY: geteuid cannot fail and has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: not root");
            return;
        }
        const STRANGERS: [u32; 3] = [4242, 4243, 4244];
        let queue = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ctx = crate::Context::new();
        let shm = STRANGERS.iter().fold(crate::config::ShmConfig::default(), |c, &u| c.allow_uid(u));
        let trusting = Overrides { shm: Some(shm), ..Default::default() };
        let server = queue.local_addr().unwrap();
        let mut door =
            Door::open(ctx.settings_handle().clone(), ctx.counters().clone(), (server, 0, false), trusting, false)
                .expect("a door");
        door.conn_budget = 8;
        let take = |door: &Door| {
            let mut st = door.lock();
            let mut refusals = 100;
            door.accept_conns(&mut st, &mut refusals).unwrap();
            let by = |u: &u32| st.conns_by_uid.get(u).copied().unwrap_or(0);
            (st.conns.len(), STRANGERS.iter().map(by).collect::<Vec<_>>())
        };
        let mut held = Vec::new();
        for uid in STRANGERS {
            match sys::seqpacket_connect_as(uid, door.name(), 8) {
                Ok(socks) => held.push(socks),
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    eprintln!("skipped: cannot take uid {uid}: {e}");
                    return;
                }
                Err(e) => panic!("connecting as uid {uid}: {e}"),
            }
        }
        assert_eq!(take(&door), (4, vec![2, 2, 0]), "other uids held more than their shares");
        held.push((0..5).map(|_| sys::seqpacket_connect(door.name()).unwrap()).collect());
        assert_eq!(take(&door), (8, vec![2, 2, 0]), "the listener's own uid did not get the rest");
        // Ending one of another uid's connections gives its place back.
        let conn = door.lock().conns.iter().find(|c| c.cred.uid == STRANGERS[0]).cloned().unwrap();
        door.lock().close(&conn);
        assert_eq!(door.lock().conns_by_uid.get(&STRANGERS[0]).copied(), Some(1));
        drop(held);
    }

    /// A flood of knocks on the door (any local user may knock) costs the look-ups of one turn
    /// of the listener task one batch of refusals in all, not up to 17 batches of accepts for
    /// each plain connection's look-up; the rest waits for the listener's own turns. Door
    /// connections it keeps (trusted, within the budget) cost nothing: a burst of new clients
    /// is taken in whole.
    #[tokio::test]
    async fn knocks_cost_the_look_ups_of_a_turn_one_batch_of_refusals() {
        crate::sys::raise_fd_limit();
        /// Knocks on `door`, then two plain connections looked up in one turn: how many of the
        /// knocks the look-ups took from the door's queue.
        fn taken_by_two_look_ups(queue: &std::net::TcpListener, door: &Door, knocks: usize) -> usize {
            let server = queue.local_addr().unwrap();
            let held: Vec<OwnedFd> = (0..knocks).map(|_| sys::seqpacket_connect(door.name()).unwrap()).collect();
            door.begin_turn();
            for _ in 0..2 {
                let client = std::net::TcpStream::connect(server).unwrap();
                let (ours, peer) = queue.accept().unwrap();
                assert!(door.lookup(peer, server, ours.as_fd()).is_none(), "a plain connection matched");
                drop(client);
            }
            let mut left = 0;
            while sys::seqpacket_accept(door.listener.get_ref().as_fd()).is_ok() {
                left += 1;
            }
            drop(held);
            knocks - left
        }
        // Every knock refused (no budget for door connections, as for a stranger's).
        let (queue, mut door) = door_for_a_queue();
        door.conn_budget = 0;
        assert_eq!(taken_by_two_look_ups(&queue, &door, 400), LOOKUP_REFUSALS, "knocks refused in the turn");
        // Every knock kept (trusted, within the budget).
        let (queue, mut door) = door_for_a_queue();
        door.conn_budget = 1000;
        assert_eq!(taken_by_two_look_ups(&queue, &door, 400), 400, "a burst of trusted clients was cut short");
        assert_eq!(door.lock().conns.len(), 400);
    }

    /// With the turn's refusals spent (strangers knocking), a look-up still reads what the
    /// door connections it holds have sent: a registration behind a full read of its
    /// connection's frames is found. (Before, the look-up stopped once its accepts were spent,
    /// with frames left unread on a trusted client's connection.)
    #[tokio::test]
    async fn spent_refusals_leave_the_held_connections_read() {
        use crate::proto::door::{DoorFrame, DoorKind};
        const _: () = assert!(5 * 60 > READ_MAX, "the frames must take more than one read");
        let (queue, mut door) = door_for_a_queue();
        let server = queue.local_addr().unwrap();
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        // A trusted client's connection, held, with more frames queued than one read takes
        // (cancels of registrations nobody made), then its registration.
        let client_conn = sys::seqpacket_connect(door.name()).unwrap();
        let _ = door.drain(&mut door.lock());
        assert_eq!(door.lock().conns.len(), 1);
        for batch in 0..5u64 {
            let mut msg = Vec::new();
            for i in 0..60 {
                DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 1000 + batch * 60 + i }.encode_into(&mut msg, &[]);
            }
            sys::send_with_fds(client_conn.as_fd(), &msg, &[]).unwrap();
        }
        let head = crate::proto::door::RegisterHead {
            instance: 1,
            cookie: sys::socket_cookie(sock.as_fd()).unwrap(),
            port: sock.local_addr().unwrap().as_socket().unwrap().port(),
        };
        let frame = head.encode_frame(7, &proposal(Some(crate::proto::clc::ShmOffer { link_group: 0 })));
        sys::send_with_fds(client_conn.as_fd(), &frame, &[]).unwrap();
        // Strangers' knocks (no room for more door connections), more than a turn refuses.
        door.conn_budget = 1;
        let _knocks: Vec<OwnedFd> =
            (0..LOOKUP_REFUSALS + 10).map(|_| sys::seqpacket_connect(door.name()).unwrap()).collect();
        sock.connect(&server.into()).unwrap();
        let (ours, peer) = queue.accept().unwrap();
        door.begin_turn();
        assert!(door.lookup(peer, server, ours.as_fd()).is_some(), "the registration was not found");
    }

    /// A registration that leaves `live` before its handshake ran (its client cancelled it, or
    /// flooded its inbox shut) takes its accepted-early mark with it: a later registration of
    /// the same id on the same door connection is checked by `verify` as any other. (Before,
    /// `take` marked it at accept, the cancel left the mark, and the next registration's
    /// Connected frame passed `verify` on it whatever connection it named: its handshake
    /// committed a connection the kernel was never asked about.)
    #[tokio::test]
    async fn a_cancelled_early_registration_leaves_no_mark_for_the_next_of_its_id() {
        use crate::proto::clc::ShmOffer;
        use crate::proto::door::{ConnectedTuple, DoorFrame, DoorKind, RegisterHead};
        let (queue, door) = door_for_a_queue();
        let server = queue.local_addr().unwrap();
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let (client, key, door_conn) = register_and_connect(&door, &sock, 7, server);
        let mut early = door.take_early();
        assert_eq!(early.len(), 1, "a solo door answers a shared-memory offer early");
        let reg = early.pop().unwrap();
        // The listener takes the connection from the kernel: matched early, and marked for the
        // Connected frame still to come.
        let (accepted, _) = queue.accept().unwrap();
        {
            let mut st = door.lock();
            let found = door.take(&mut st, client, server, accepted.as_fd());
            assert!(matches!(found, Some(Matched::Early(_))), "not matched early");
        }
        let marked = |conn: &ServerConn| conn.live().get(&7).is_some_and(|l| l.accepted_early);
        assert!(marked(&key.conn), "not marked at accept");
        // Its client cancels before the handshake opened the registration.
        let cancel = DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 7 }.encode(&[]);
        sys::send_with_fds(door_conn.as_fd(), &cancel, &[]).unwrap();
        within_10s("the cancel was not read", || {
            let mut st = door.lock();
            let _ = door.drain(&mut st);
            !key.conn.live().contains_key(&7)
        });
        assert!(!marked(&key.conn), "the cancel left the mark");
        assert!(reg.open().is_none(), "a cancelled registration opened");
        // The same id again, and a Connected frame naming a connection that is not its.
        let other = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        other.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let head = RegisterHead { instance: 1, cookie: sys::socket_cookie(other.as_fd()).unwrap(), port: 1 };
        let frame = head.encode_frame(7, &proposal(Some(ShmOffer { link_group: 0 })));
        sys::send_with_fds(door_conn.as_fd(), &frame, &[]).unwrap();
        within_10s("the second registration was not filed", || {
            let mut st = door.lock();
            let _ = door.drain(&mut st);
            key.conn.pending().contains_key(&7)
        });
        let bogus = ConnectedTuple { local: SocketAddr::from(([127, 0, 0, 1], 1)), peer: server };
        assert_eq!(door.verify(&key, Some(bogus)), Verified::No, "a connection nobody checked passed verify");
    }

    /// Trusted clients that keep many door connections full do not keep the listener from
    /// accepting: a turn of the listener task and an accepted connection's look-up each read a
    /// bounded number of door messages in all, and the turns alternate which of the two queues
    /// comes first. (Before, no accept finished within the bound; with the alternation alone,
    /// each connect waited about 8 s for the runtime to look at its I/O.)
    #[tokio::test(flavor = "current_thread")]
    async fn door_connections_kept_readable_do_not_starve_the_accepts() {
        use crate::proto::door::{DoorFrame, DoorKind};
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let door = listener.door_for_test().expect("a door");
        // More ready connections than a turn's budget (128).
        let conns: Vec<OwnedFd> = (0..300).map(|_| sys::seqpacket_connect(door.name()).unwrap()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flood = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let frame = DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 1 }.encode(&[]);
                while !stop.load(Ordering::Relaxed) {
                    for c in &conns {
                        let _ = sys::send_with_fds(c.as_fd(), &frame, &[]);
                    }
                }
            })
        };
        // Plain clients are accepted while the flood goes on (a generous bound: this fails by
        // never finishing, not by being slow).
        let accepted = tokio::time::timeout(Duration::from_secs(30), async {
            for _ in 0..20 {
                let c = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (s, _) = listener.accept().await.unwrap();
                drop((c, s));
            }
        })
        .await;
        stop.store(true, Ordering::Relaxed);
        flood.join().unwrap();
        assert!(accepted.is_ok(), "the door's clients kept the listener from accepting");
    }

    /// A registered client that resets its connection before the listener accepts it leaves
    /// no socket for either end's four-tuple in the kernel's tables; the door still knows the
    /// kernel answers (it finds our listener for our end) and stays open.
    #[tokio::test]
    async fn a_connection_reset_before_its_accept_does_not_shut_the_door() {
        use crate::proto::door::RegisterHead;
        let listener = crate::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        let door = listener.door_for_test().expect("a door");
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let client = sock.local_addr().unwrap().as_socket().unwrap();
        let cookie = sys::socket_cookie(sock.as_fd()).unwrap();
        let frame = RegisterHead { instance: 1, cookie, port: client.port() }.encode_frame(7, &proposal(None));
        let door_conn = sys::seqpacket_connect(door.name()).unwrap();
        sys::send_with_fds(door_conn.as_fd(), &frame, &[]).unwrap();
        sock.connect(&server.into()).unwrap();
        sock.set_linger(Some(Duration::ZERO)).unwrap();
        drop(sock);
        let mut st = door.lock();
        let _ = door.drain(&mut st);
        assert_eq!(st.count, 1);
        assert!(door.take(&mut st, client, server, door_conn.as_fd()).is_none());
        assert!(!door.blind.load(Ordering::Relaxed), "a reset connection shut the door");
    }

    /// A registration whose connection a handshake saw is matched at its accept by our end of
    /// that connection, also once its client end is gone from the kernel's tables: here its
    /// client wrote and closed, and its socket went at once (a network namespace of its own with
    /// `tcp_max_tw_buckets` 0, which any local user can bring about on the host by filling the
    /// TIME_WAIT table), as it goes a minute after the close otherwise. Our end is learned when
    /// the door verifies the connection, and the registration is matched by it before
    /// [`ENTRY_TTL`] or past it (swept, and kept for a late accept). Before,
    /// an accept within the first 30 s found no client end and handed the connection out as
    /// TCP, its client committed to shared memory with its bytes there. A socket that is not
    /// that connection's end is not matched to it.
    #[test]
    fn a_seen_registration_is_matched_by_our_end_after_its_client_end_is_gone() {
        use std::io::Write;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: needs root (a network namespace of its own)");
            return;
        }
        std::thread::spawn(|| {
            // SAFETY: unshare with CLONE_NEWNET moves this thread alone into a new network
            // namespace; every socket below is made on this thread, so in it.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "{}", io::Error::last_os_error());
            let up = std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status();
            assert!(up.is_ok_and(|s| s.success()), "ip link set lo up");
            std::fs::write("/proc/sys/net/ipv4/tcp_max_tw_buckets", "0").unwrap();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (queue, door) = door_for_a_queue();
                let server = queue.local_addr().unwrap();
                // A seen registration whose client wrote and closed, and whose client end the
                // kernel no longer has; our end is noted by `verify`, and the sweep keeps the
                // registration past ENTRY_TTL or not (`late`) while our end waits in the queue.
                let after_its_client = |id: u64, late: bool| {
                    let (sock, client, door_conn) = seen(&door, id, server);
                    if late {
                        door.age_for_test(ENTRY_TTL + Duration::from_secs(1));
                        door.sweep();
                        assert_eq!(door.lock().count, 1, "kept while our end waits in the queue");
                    }
                    let mut sock = std::net::TcpStream::from(OwnedFd::from(sock));
                    sock.write_all(b"bye").unwrap();
                    drop(sock);
                    within_10s("the client end outlived its close", || {
                        !matches!(door.diag.owner(client, server), Ok(Some(_)))
                    });
                    (client, door_conn)
                };
                for mode in [true, false] {
                    let (client, _door_conn) = after_its_client(7, mode);
                    let (accepted, _) = queue.accept().unwrap();
                    let stranger = std::net::TcpStream::connect(server).unwrap();
                    let _stranger_here = queue.accept().unwrap();
                    let mut st = door.lock();
                    assert!(
                        door.take(&mut st, client, server, stranger.as_fd()).is_none(),
                        "{mode:?}: another socket matched"
                    );
                    assert_eq!(st.count, 0, "{mode:?}: a registration whose connection is not this one ends");
                    drop(st);
                    // Again, and this time the connection accepted is its own.
                    let (client, _door_conn) = after_its_client(8, mode);
                    let (next, _) = queue.accept().unwrap();
                    let mut st = door.lock();
                    assert!(
                        matches!(door.take(&mut st, client, server, next.as_fd()), Some(Matched::Early(_))),
                        "{mode:?}: an accept of a seen connection whose client end is gone went out as TCP"
                    );
                    drop(st);
                    drop((accepted, next));
                }
            });
        })
        .join()
        .unwrap();
    }

    /// A listener bound to a device (`SO_BINDTODEVICE`, as in a VRF) and clients bound to it
    /// too: the door finds their connections' ends by naming the device, so every connection
    /// is SMC-D and the door stays open. (Its look-ups named no device before: they found no
    /// socket of such a connection, and the door went blind at its first one.)
    #[tokio::test]
    async fn a_listener_bound_to_a_device_serves_clients_bound_to_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let sock = crate::SmcSocket::new_v4().unwrap();
        // Needs CAP_NET_RAW; the tests run as root.
        sock.bind_device(Some(b"lo")).unwrap();
        sock.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let listener = crate::SmcListener::builder().listen_socket(sock, 64).unwrap();
        let server = listener.local_addr().unwrap();
        crate::testing::spawn_echo_of_five(listener);
        for bound in [true, true, false, true] {
            let sock = crate::SmcSocket::new_v4().unwrap();
            if bound {
                sock.bind_device(Some(b"lo")).unwrap();
            }
            let mut c = sock.connect(server).await.unwrap();
            c.write_all(b"hello").await.unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"hello");
            assert_eq!(c.transport(), crate::Transport::SmcD, "a client bound to the device: {bound}");
        }
    }

    /// A peer that goes on sending under one registration while its handshake is not reading
    /// is held to [`INBOX_MAX`] messages: the next one ends the registration, and what it sent
    /// is let go.
    #[test]
    fn an_inbox_holds_a_handshakes_messages_and_no_flood() {
        let inbox = Inbox::default();
        let msg = || Msg { kind: DoorKind::Clc, reason: 0, payload: vec![0; 1000] };
        for _ in 0..INBOX_MAX {
            inbox.push(msg());
        }
        assert_eq!(inbox.lock().frames.len(), INBOX_MAX);
        assert!(!inbox.lock().closed);
        for _ in 0..1000 {
            inbox.push(msg());
        }
        assert!(inbox.lock().frames.is_empty(), "a flood was held");
        assert!(matches!(inbox.try_next(), Some(None)), "the registration goes on");
    }

    /// A connection to `door` with room for many messages in its socket (SO_SNDBUFFORCE: the
    /// tests run as root).
    fn roomy_door_connection(door: &Door) -> OwnedFd {
        let client = sys::seqpacket_connect(door.name()).unwrap();
        let room: libc::c_int = 8 << 20;
        sys::setsockopt(client.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &room).unwrap();
        client
    }

    /// An encoded Proposal of 64 KiB rings, with `shm` as its shared-memory offer.
    fn proposal(shm: Option<crate::proto::clc::ShmOffer>) -> Vec<u8> {
        use crate::proto::clc::{ClcMessage, Proposal};
        let p = Proposal { secret: sys::random_secret().unwrap(), rmb_size: 64 << 10, shm, rdma: None };
        ClcMessage::Proposal(p).encode().unwrap()
    }

    /// A door connection's two ends: ours as the listener holds it (its sender started), and
    /// the client's.
    /// A client's wire to the door at the other end of `theirs`, as after the door answered:
    /// its registration is the only one open on its connection, whose sender runs on `rt`.
    fn client_wire(rt: &tokio::runtime::Handle) -> (ClientWire, OwnedFd) {
        let (ours, theirs) = sys::unix_pair(libc::SOCK_SEQPACKET).expect("a socket pair");
        let fd = watch(PeerFd::new(ours)).expect("register with the runtime");
        let outbox = Arc::new(Outbox::default());
        let conn = Arc::new(ClientConn {
            sock: DoorSocket { fd, outbox: outbox.clone(), counters: Arc::new(Counters::default()) },
            owner: PeerCred { pid: 0, uid: 0, gid: 0 },
            next_id: AtomicU64::new(1),
            inboxes: Mutex::default(),
            dead: AtomicBool::new(false),
        });
        rt.spawn(send_loop(SenderOf::new(outbox, Arc::downgrade(&conn))));
        let (id, inbox) = conn.open_inbox();
        let place = Room::new().try_take().expect("room in a new pool");
        let reg = Reg { conn, id, inbox, open: true, _place: place };
        let wire = ClientWire {
            doors: vec![Some(reg)],
            chosen: Some(0),
            secret: Secret([7; 16]),
            last_no: None,
            connected: None,
        };
        (wire, theirs)
    }

    /// A client's handshake message that did not go out says so ([`NotSent`]), whatever
    /// stopped it: the door closed (before, taken as sent, and the client waited for a final
    /// word), or the connection's sender gone (before, also taken as sent). The client may then
    /// stay TCP after its Confirm, since the server commits only on a Confirm it read.
    #[tokio::test]
    async fn a_client_message_that_did_not_go_out_says_so() {
        let confirm = [1u8; 24];
        // Sent: the door reads it.
        let (mut wire, door) = client_wire(&tokio::runtime::Handle::current());
        wire.send(&confirm).await.expect("sent");
        let mut ids = Vec::new();
        assert!(!drain(&door, &mut ids));
        assert_eq!(ids, [1]);
        // The door closed.
        let (mut wire, door) = client_wire(&tokio::runtime::Handle::current());
        drop(door);
        let err = wire.send(&confirm).await.expect_err("the door is closed");
        assert!(NotSent::is(&err), "{err:?}");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        // The sender went away with its runtime before it sent.
        let other = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let (mut wire, door) = client_wire(other.handle());
        // Queued behind a frame, so that it waits for the sender (a lone frame goes at once).
        wire.doors[0]
            .as_ref()
            .unwrap()
            .conn
            .sock
            .push(|b| {
                DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 9 }.encode_into(b, &[]);
            })
            .expect("queued");
        let send = tokio::spawn(async move { wire.send(&confirm).await });
        tokio::task::yield_now().await;
        tokio::task::spawn_blocking(move || drop(other)).await.expect("the runtime dropped");
        let err = send.await.expect("the send's task").expect_err("its sender is gone");
        assert!(NotSent::is(&err), "{err:?}");
        let mut ids = Vec::new();
        drain(&door, &mut ids);
        assert!(ids.is_empty(), "nothing went out: {ids:?}");
    }

    fn server_conn() -> (Arc<ServerConn>, OwnedFd) {
        let (ours, theirs) = sys::unix_pair(libc::SOCK_SEQPACKET).expect("a socket pair");
        let fd = watch(PeerFd::new(ours)).expect("register with the runtime");
        let counters = Arc::new(Counters::default());
        (ServerConn::start(fd, PeerCred { pid: 0, uid: 0, gid: 0 }, &counters, None).expect("a runtime"), theirs)
    }

    /// The frames of every message queued at `client`'s end, once the door's senders had their
    /// turns (what the door said in a turn of its runtime goes out when its tasks yield).
    async fn sent_frames(client: &OwnedFd) -> Vec<(DoorFrame, Vec<u8>)> {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        let mut got = Vec::new();
        let mut buf = message_buffer();
        while let Ok(Some(msg)) = recv_message(client.as_fd(), false, &mut buf) {
            got.extend(msg.map(|(f, p)| (f, p.to_vec())));
        }
        got
    }

    /// Reads every frame queued at the client's end, until the queue is empty (`false`) or
    /// the connection ended (`true`).
    fn drain(client: &OwnedFd, ids: &mut Vec<u64>) -> bool {
        let mut buf = message_buffer();
        loop {
            match recv_message(client.as_fd(), false, &mut buf) {
                Ok(Some(msg)) => ids.extend(msg.map(|(f, _)| f.id)),
                Ok(None) => return true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Sends the client answers it does not read (ids 0, 1, ...) until its queue is full;
    /// returns how many were sent.
    fn fill(conn: &ServerConn) -> u64 {
        let mut sent = 0;
        while sys::send_msg(
            conn.sock.fd.get_ref().as_fd(),
            &DoorFrame { kind: DoorKind::Refused, reason: 0, id: sent }.encode(&[]),
        )
        .is_ok()
        {
            sent += 1;
        }
        sent
    }

    /// A handshake's end of `conn` (under id `u64::MAX`), and a Commit for it to send.
    fn commit_on(conn: &Arc<ServerConn>) -> (ServerWire, Vec<u8>) {
        let wire = ServerWire {
            conn: conn.clone(),
            id: u64::MAX,
            inbox: Arc::new(Inbox::default()),
            proposal: None,
            connected: None,
        };
        let commit = ClcMessage::Commit(crate::proto::clc::Commit { secret: Secret([7; 16]) }).encode().unwrap();
        (wire, commit)
    }

    /// A Commit that finds no room within SEND_WAIT fails, and the client then reads what was
    /// sent before and the end: its confirmed handshake ends as TCP, as ours does, instead of
    /// waiting for a final word that never comes.
    #[tokio::test]
    async fn a_server_answer_that_finds_no_room_ends_the_connection() {
        let (conn, client) = server_conn();
        let counters = Counters::default();
        let sent = fill(&conn);
        assert!(sent > 0);
        let (mut wire, commit) = commit_on(&conn);
        assert_eq!(wire.send(&commit).await.map_err(|e| e.kind()), Err(io::ErrorKind::WouldBlock));
        let mut ids = Vec::new();
        assert!(drain(&client, &mut ids), "the connection was not shut down");
        assert_eq!(ids, (0..sent).collect::<Vec<_>>(), "what was sent before the end arrives, in order");
        // Nothing more is sent on it.
        conn.refuse(&counters, sent, DoorKind::Refused, DeclineReason::HandshakeCongested);
        assert!(drain(&client, &mut Vec::new()));
    }

    /// An answer that finds the queue full is sent once the client reads and frees room,
    /// within the wait: a door connection is not watched for room, so the send tries again.
    #[tokio::test(start_paused = true)]
    async fn an_answer_that_finds_the_queue_full_goes_out_once_the_client_reads() {
        let (conn, client) = server_conn();
        let sent = fill(&conn);
        let (mut wire, commit) = commit_on(&conn);
        let reader = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut ids = Vec::new();
            assert!(!drain(&client, &mut ids), "the connection ended while the answer waited");
            ids
        };
        let started = tokio::time::Instant::now();
        let (answer, ids) = tokio::join!(wire.send(&commit), reader);
        answer.expect("the answer was not sent once there was room");
        assert_eq!(ids, (0..sent).collect::<Vec<_>>());
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < SEND_WAIT,
            "sent after {waited:?}: before the room was freed, or past the wait"
        );
        let mut after = Vec::new();
        assert!(!drain(&client, &mut after));
        assert_eq!(after, [u64::MAX], "the answer arrives after what was queued before it");
    }

    /// A sender that goes away with its runtime before it sent a queued "no" ends the
    /// connection: the client reads the end at once, as the final word of its registrations,
    /// instead of waiting out its handshakes for answers that were lost with the outbox.
    #[tokio::test]
    async fn a_sender_gone_with_its_runtime_ends_the_connection() {
        let (ours, client) = sys::unix_pair(libc::SOCK_SEQPACKET).expect("a socket pair");
        let fd = watch(PeerFd::new(ours)).expect("register with the runtime");
        let counters = Arc::new(Counters::default());
        // The sender's runtime is never driven: its task does not run before the runtime goes.
        let other = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let conn = ServerConn::start(fd, PeerCred { pid: 0, uid: 0, gid: 0 }, &counters, Some(other.handle()))
            .expect("started");
        conn.refuse(&counters, 7, DoorKind::Refused, DeclineReason::HandshakeCongested);
        let mut ids = Vec::new();
        assert!(!drain(&client, &mut ids), "the connection ended before its sender went");
        // Dropped where blocking is allowed (a runtime may not be dropped inside another).
        tokio::task::spawn_blocking(move || drop(other)).await.expect("the runtime dropped");
        // The end shows once no process holds our descriptor: a child another thread is
        // spawning holds copies of the process's descriptors until it execs.
        within_10s("the connection outlived its sender", || drain(&client, &mut ids));
        assert!(ids.is_empty(), "{ids:?}");
        drop(conn);
    }

    /// Every author's wait is bounded from when its frame came, not from when the sender got
    /// to its message: against a client that reads one message every 0.9 s, a Commit queued
    /// behind two messages fails within [`SEND_WAIT`] of its send, where timing each message
    /// from its own send's start had it wait 2.1 s and go out.
    #[tokio::test(start_paused = true)]
    async fn a_frame_waits_for_room_no_longer_than_the_wait_behind_slow_messages() {
        let (conn, client) = server_conn();
        let counters = Counters::default();
        let sent = fill(&conn);
        let started = tokio::time::Instant::now();
        // Two messages ahead of the Commit, their frames 0.3 s apart (a message takes frames
        // for GATHER_MAX only).
        conn.refuse(&counters, sent, DoorKind::Refused, DeclineReason::HandshakeCongested);
        tokio::time::sleep(Duration::from_millis(300)).await;
        conn.refuse(&counters, sent + 1, DoorKind::Refused, DeclineReason::HandshakeCongested);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (mut wire, commit) = commit_on(&conn);
        let reader = async {
            // One message every 0.9 s, from the start, then what is left.
            let mut buf = message_buffer();
            let mut ids = Vec::new();
            for _ in 0..4 {
                tokio::time::sleep_until(started + Duration::from_millis(900) * (ids.len() as u32 + 1)).await;
                match recv_message(client.as_fd(), false, &mut buf) {
                    Ok(Some(msg)) => ids.extend(msg.map(|(f, _)| f.id)),
                    other => panic!("{:?}", other.map(|m| m.map(|_| ()))),
                }
            }
            let ended = drain(&client, &mut ids);
            (ids, ended)
        };
        let queued = tokio::time::Instant::now();
        let ((answer, waited), (ids, ended)) = tokio::join!(
            async {
                let r = wire.send(&commit).await;
                (r, queued.elapsed())
            },
            reader
        );
        assert!(waited <= SEND_WAIT + SEND_RETRY_MAX, "the Commit's author waited {waited:?}");
        assert_eq!(answer.map_err(|e| e.kind()), Err(io::ErrorKind::WouldBlock), "after {waited:?}");
        // The first refusal went out when the client first read; the second found no room
        // within its wait, and it and the Commit behind it failed: the connection ended after
        // what was sent before.
        assert!(ended, "the connection was not shut down");
        assert_eq!(ids, (0..=sent).collect::<Vec<_>>());
    }

    /// A door connection is registered for reading only. The kernel signals a Unix socket as
    /// writable each time its peer reads a message from it (room freed), and a registration
    /// that asked for writability woke our thread for each of them. Read from the kernel's
    /// own record of the runtime's registrations (`/proc/self/fdinfo` of its epoll instance).
    #[tokio::test]
    async fn a_door_connection_is_watched_for_reading_only() {
        let (conn, _client) = server_conn();
        let fd = conn.sock.fd.get_ref().as_fd().as_raw_fd();
        // The socket's inode too: an entry of another test's epoll under a reused number is not
        // this socket's.
        let ino =
            std::fs::metadata(format!("/proc/self/fd/{fd}")).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
        let mut masks = Vec::new();
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let is_epoll =
                std::fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy() == "anon_inode:[eventpoll]");
            let info = entry.path().to_string_lossy().replace("/fd/", "/fdinfo/");
            let Some(text) = is_epoll.then(|| std::fs::read_to_string(info).ok()).flatten() else { continue };
            for line in text.lines() {
                let mut words = line.split_whitespace();
                if words.next() == Some("tfd:") && words.next() == Some(fd.to_string().as_str()) {
                    let same = line
                        .split_whitespace()
                        .any(|w| w.strip_prefix("ino:").is_some_and(|i| u64::from_str_radix(i, 16) == Ok(ino)));
                    if let (true, Some("events:"), Some(hex)) = (same, words.next(), words.next()) {
                        masks.push(u32::from_str_radix(hex, 16).unwrap());
                    }
                }
            }
        }
        assert!(!masks.is_empty(), "no epoll instance has the door connection");
        for m in masks {
            assert_ne!(m & libc::EPOLLIN as u32, 0, "not watched for reading: {m:#x}");
            assert_eq!(m & libc::EPOLLOUT as u32, 0, "watched for room: {m:#x}");
        }
    }

    /// A "no" that finds no room (within [`SEND_WAIT`], like every answer) is not dropped
    /// while the client waits for it: the connection ends, which the client reads as "TCP" for
    /// every registration on it.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_that_finds_no_room_ends_the_connection() {
        let (conn, client) = server_conn();
        let counters = Counters::default();
        let sent = fill(&conn);
        conn.refuse(&counters, sent, DoorKind::Refused, DeclineReason::HandshakeCongested);
        tokio::time::sleep(SEND_WAIT + Duration::from_millis(100)).await;
        let mut ids = Vec::new();
        assert!(drain(&client, &mut ids), "the connection was not shut down");
        assert_eq!(ids, (0..sent).collect::<Vec<_>>());
    }

    /// A client's window of registrations draws at most two answers each; the server's end,
    /// with the send buffer it asks for, holds all of them at the longest an answer can be, so
    /// a client that keeps to its window never has an answer refused for room.
    #[test]
    fn a_window_of_answers_fits_the_send_buffer() {
        let (server, _client) = sys::unix_pair(libc::SOCK_SEQPACKET).expect("a socket pair");
        widen_send_buffer(server.as_fd()).expect("SO_SNDBUF");
        let longest = DoorFrame { kind: DoorKind::Clc, reason: 0, id: 1 }.encode(&[0; crate::proto::clc::CLC_MAX_LEN]);
        for i in 0..2 * WINDOW {
            sys::send_msg(server.as_fd(), &longest).unwrap_or_else(|e| panic!("answer {i} of {}: {e}", 2 * WINDOW));
        }
    }

    /// A connection whose client end is the registrant's but whose end of ours is still a
    /// request socket (here the listener defers its accept until data comes, as a full listen
    /// queue does until there is room) is not verified, so not committed: its client's end may
    /// go before ours is a socket an accept could be matched by. Once ours is the full socket,
    /// it is.
    #[tokio::test]
    async fn a_connection_whose_end_of_ours_is_a_request_socket_is_not_verified_yet() {
        use crate::proto::door::ConnectedTuple;
        use std::io::Write;
        let (queue, door) = door_for_a_queue();
        let server = queue.local_addr().unwrap();
        let secs: libc::c_int = 30;
        // SAFETY: setsockopt on a socket we own, with a c_int option value of the right size.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&queue),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                std::ptr::addr_of!(secs).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        let (client, key, _door_conn) = register_and_connect(&door, &sock, 7, server);
        let said = Some(ConnectedTuple { local: client, peer: server });
        assert_eq!(door.verify(&key, said), Verified::NotAccepted);
        assert!(door.lock().count == 1, "kept: it may still be accepted");
        let mut sock = std::net::TcpStream::from(OwnedFd::from(sock));
        sock.write_all(b"x").unwrap();
        within_10s("our end never became the full socket", || door.verify(&key, said) == Verified::Yes);
    }

    /// Registrations of clients of uids other than the listener's own are bounded as their
    /// door connections are: a quarter of the door's bound each, half together; the listener's
    /// own uid's only by the bound itself.
    #[test]
    fn other_uids_file_at_most_their_shares_of_registrations() {
        let own = 1000;
        let (a, b, c) = (2001, 2002, 2003);
        let mut st = DoorState::default();
        let filled = |st: &mut DoorState, uid: u32| {
            let mut n = 0;
            while st.room_to_file(uid, own) {
                st.filed(uid);
                n += 1;
            }
            n
        };
        assert_eq!(filled(&mut st, a), MAX_REGISTRATIONS / OTHER_UID_SHARE, "one other uid: a quarter");
        assert_eq!(filled(&mut st, b), MAX_REGISTRATIONS / OTHER_UID_SHARE, "a second: a quarter too");
        assert_eq!(filled(&mut st, c), 0, "all others together: half");
        assert_eq!(filled(&mut st, own), MAX_REGISTRATIONS / 2, "the listener's own uid: the rest");
        assert!(!st.room_to_file(own, own), "the door's bound holds for its own uid too");
        st.unfiled(a);
        assert_eq!(filled(&mut st, c), 1, "the place another uid left");
        assert_eq!(st.regs_by_uid.get(&a), Some(&(MAX_REGISTRATIONS / OTHER_UID_SHARE - 1)));
        assert_eq!(st.count, MAX_REGISTRATIONS);
    }

    /// A door named for an address of another host is never registered with, whoever bound it
    /// (here a trusted uid: our own): only a listener of this host can be behind a door, and
    /// one bound for another host's address would take the connection's bytes while its real
    /// server got an empty TCP connection. A door of this host's address is.
    #[tokio::test]
    async fn no_door_is_looked_at_for_another_hosts_address() {
        let pid = std::process::id().to_be_bytes();
        // TEST-NET-3 (RFC 5737): never this host's.
        let remote =
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(203, 0, 113, pid[3])), u16::from_be_bytes([pid[1], pid[2]]));
        let local = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, pid[1], pid[2], pid[3])), 9);
        let doors = ClientDoors::default();
        let counters = Arc::new(Counters::default());
        // And none for an unspecified destination, which Linux connects to another address.
        let unspecified = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), u16::from_be_bytes([pid[2], pid[3]]) | 1);
        for (addr, found) in [(remote, 0), (unspecified, 0), (local, 1)] {
            let squatter = sys::seqpacket_listen(&DoorAt { addr, index: None }.name(), false).expect("a door");
            let lookup = find_doors(&doors, &counters, addr, &[], None);
            assert_eq!(lookup.doors.len(), found, "{addr}");
            let knocked = sys::seqpacket_accept(squatter.as_fd()).is_ok();
            assert_eq!(knocked, found == 1, "{addr}: the door was connected to");
        }
    }

    /// A client keeps a window of registrations per door connection, opens another connection
    /// when all it has are full, and past its pool of them says "full" until one ends; the room
    /// a registration leaves goes to the connection that waited for it, not to one that
    /// arrived since.
    #[tokio::test]
    async fn a_client_spreads_registrations_over_a_bounded_pool_and_serves_waiters_in_turn() {
        // An address of this process's own: door names are abstract, so nothing is bound to it.
        let pid = std::process::id().to_be_bytes();
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, pid[1], pid[2], pid[3])), 9);
        let at = DoorAt { addr, index: None };
        let _door = sys::seqpacket_listen(&at.name(), false).expect("a door");
        let doors = ClientDoors::default();
        let counters = Arc::new(Counters::default());
        // Our own uid is trusted without being listed.
        let uid: [u32; 0] = [];
        let open = |reserved: &mut Option<Place>| doors.open(&counters, at, &uid, &mut None, reserved);
        let mut regs = Vec::new();
        for i in 0..WINDOW * CLIENT_POOL {
            match open(&mut None) {
                Found::Door(reg) => regs.push(reg),
                _ => panic!("registration {i} found no room"),
            }
        }
        let conns: std::collections::HashSet<*const ClientConn> = regs.iter().map(|r| Arc::as_ptr(&r.conn)).collect();
        assert_eq!(conns.len(), CLIENT_POOL, "one connection per window");
        assert!(regs.iter().all(|r| r.conn.inboxes().len() == WINDOW));
        let Found::Full(room) = open(&mut None) else { panic!("room beyond the pool") };
        // A connection waits in line for room.
        let far = tokio::time::Instant::now() + Duration::from_secs(60);
        let waiter = tokio::spawn(async move { room.wait(far).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        // A registration that ends makes room on its connection; it goes to the waiter: one
        // that looks for room now still finds none.
        let freed = Arc::as_ptr(&regs.pop().expect("one").conn);
        assert!(matches!(open(&mut None), Found::Full(_)), "a newcomer took the waiter's room");
        let place = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("room given to the waiter")
            .expect("the waiter ran")
            .expect("a place while the line moves");
        // The waiter registers with it, on the connection that had room.
        match open(&mut Some(place)) {
            Found::Door(reg) => assert_eq!(Arc::as_ptr(&reg.conn), freed),
            _ => panic!("no room with the place waited for"),
        }
    }

    /// A pool whose every place is held, for the tests of the line.
    fn full_room() -> (Arc<Room>, Vec<Place>) {
        let room = Room::new();
        let held = std::iter::from_fn(|| room.try_take()).collect::<Vec<_>>();
        assert_eq!(held.len(), POOL_PERMITS);
        (room, held)
    }

    /// A line that stands still (no registration ends) sends its waiters to TCP after
    /// ROOM_WAIT, however far their deadline.
    #[tokio::test(start_paused = true)]
    async fn a_line_that_stands_still_is_left() {
        let (room, _held) = full_room();
        let start = tokio::time::Instant::now();
        assert!(room.wait(start + Duration::from_secs(60)).await.is_none());
        assert_eq!(start.elapsed(), ROOM_WAIT);
    }

    /// A line that moves is waited in past ROOM_WAIT, and in order: the second in line gets
    /// the second place given back, 1.8 s in; a deadline ends the wait even while it moves.
    #[tokio::test(start_paused = true)]
    async fn a_line_that_moves_is_waited_in_until_the_deadline() {
        let (room, mut held) = full_room();
        let start = tokio::time::Instant::now();
        let far = start + Duration::from_secs(60);
        let waiters: Vec<_> = (0..3)
            .map(|i| {
                let room = room.clone();
                let deadline = if i == 2 { start + Duration::from_millis(2500) } else { far };
                // Each waiter keeps its place (returned with the time it got it).
                tokio::spawn(async move { room.wait(deadline).await.map(|place| (start.elapsed(), place)) })
            })
            .collect();
        tokio::task::yield_now().await;
        // A place given back every 0.9 s: the line moves, slower than ROOM_WAIT.
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(900)).await;
            drop(held.pop());
        }
        let mut got = Vec::new();
        let mut places = Vec::new();
        for w in waiters {
            let (at, place) = w.await.expect("the waiter ran").unzip();
            got.push(at);
            places.push(place);
        }
        assert_eq!(got[0], Some(Duration::from_millis(900)));
        assert_eq!(got[1], Some(Duration::from_millis(1800)), "the second waiter left a moving line");
        assert_eq!(got[2], None, "the third waiter outlived its deadline");
        assert!(start.elapsed() <= Duration::from_millis(2800 + 1000), "{:?}", start.elapsed());
    }
}
