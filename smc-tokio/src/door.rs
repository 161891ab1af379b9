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
//! 2. A client about to connect to an address looks for that door. Only if it finds one (and
//!    its owner is a uid it trusts, `SO_PEERCRED`) does it bind its TCP socket to a port of its
//!    choosing and hand the socket itself to the door with `SCM_RIGHTS`, together with its CLC
//!    Proposal, then connect.
//! 3. When the listener accepts a connection, it looks the peer's port up among the
//!    registrations (draining the door first if it is not there yet: the registration was sent
//!    before the client's SYN, so it is in the door's queue by then). Registered: the CLC
//!    handshake continues on the door connection (Accept or Decline, Confirm, Commit). Not
//!    registered: a plain client, handed to the application at once, with no peek and no timer.
//!
//! Why the socket itself: it is the proof. The server keeps the descriptor (a bound TCP socket,
//! not listening) until the connection arrives, and matches them by the socket's own four-tuple:
//! a registration belongs to an accepted connection only if the registered socket is, right
//! then, connected from that peer address to that local address, that is, if it *is* the
//! client's end of that connection. No port reasoning is involved, so no registration can be
//! pinned on somebody else's connection, and two registrations can never both fit one. The
//! descriptor is let go as soon as the connection is matched (or the registration cancelled or
//! stale), so the client's close is not held up for long. Both ends check each other's uid:
//! a process squatting on a door's name, or knocking on a door, gets nothing unless it runs as
//! the same (or an allowed) uid, and the worst it can do is make connections fall back to TCP.
//! Every descriptor that came through a door (and every door connection, which may hold queued
//! ones) is closed off the runtime ([`PeerFd`]): closing somebody else's socket can block.
//!
//! Closing a door connection is the client's cancel: a client that stops waiting for the
//! server's first answer closes it and uses the connection as TCP; the server, finding it closed
//! before or during the handshake, serves the connection as TCP too. Only after its Confirm does
//! a client wait for the server's final word (Commit or Decline), which the server always sends
//! before it closes its end.
//!
//! The messages on a door connection are [`DoorFrame`]s, whose format is in
//! [`proto::door`](crate::proto::door).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::task::{ready, Poll};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::config::Overrides;
use crate::context::Context;
use crate::handshake::Wire;
use crate::proto::clc::{ClcMessage, Decline, DeclineReason, Secret};
use crate::proto::door::{DoorFrame, DoorKind, DOOR_FRAME_MAX, DOOR_VERSION};
pub(crate) use crate::smc::ClientIdentity;
use crate::stats::Counters;
use crate::sys::{self, PeerCred, PeerFd};

/// Doors one address can have: the listeners of one `SO_REUSEPORT` group each bind the lowest
/// free index, and a client registers with every door it finds. Sixteen covers a worker per
/// core on common servers; later listeners in a larger group serve TCP only.
const MAX_DOORS: u32 = 16;

/// How long a server keeps a registration whose connection has not arrived. A client waits for
/// its verdict for its handshake timeout (2 s by default) after the connect, then cancels; a
/// registration older than this has been cancelled, or its client is gone.
const ENTRY_TTL: Duration = Duration::from_secs(30);

/// Registrations (and door connections not registered yet) a door holds at once, at most;
/// beyond it, new ones are answered "congested" at once. Each holds two descriptors (the door
/// connection and the client's socket), so the bound is also at most a quarter of the
/// process's descriptor limit ([`entry_budget`]): a flood of registrations costs the server
/// some of its descriptors, never all of them. 4096 is the door's listen backlog.
const MAX_ENTRIES: usize = 4096;

/// Door connections taken from the door's queue per drain: a flood of knocks is worked off a
/// batch at a time, between which the listener takes TCP connections.
const DRAIN_BATCH: usize = 256;

/// How many registrations a door may hold (see [`MAX_ENTRIES`]).
fn entry_budget() -> usize {
    let quarter = sys::nofile_limit().map_or(MAX_ENTRIES as u64, |n| n / 4);
    usize::try_from(quarter).unwrap_or(MAX_ENTRIES).clamp(16, MAX_ENTRIES)
}

/// How long an accepted door connection may stay silent before its registration arrives. A
/// client sends it right after connecting to the door.
const WAITING_TTL: Duration = Duration::from_secs(2);

/// The header of a CLC frame, either way.
const CLC_FRAME: DoorFrame = DoorFrame { kind: DoorKind::Clc, reason: 0, instance: 0 };

/// The door names of a listener on `addr`, without the index: `smc-tokio/d2/127.0.0.1:8080`,
/// `smc-tokio/d2/[::]:8080`.
pub(crate) fn base_name(addr: SocketAddr) -> String {
    format!("smc-tokio/d{DOOR_VERSION}/{}", sys::unmap(addr))
}

fn door_name(base: &str, index: u32) -> Vec<u8> {
    format!("{base}/{index}").into_bytes()
}

/// The door of a listener without `SO_REUSEPORT` (so without siblings): a client that finds a
/// trusted door here looks no further, which saves it a failed probe per connection.
fn solo_name(base: &str) -> Vec<u8> {
    format!("{base}/solo").into_bytes()
}

/// One door message read without blocking: the frame, its payload, and the descriptors that
/// came with it (only a registration carries one). `Ok(None)`: the peer closed.
type Received = (DoorFrame, Vec<u8>, Vec<PeerFd>);

/// A message that is no frame is `InvalidData`. The buffer has room for a byte more than the
/// longest frame, so a longer message, truncated to it, still decodes as too long.
fn recv_frame(conn: BorrowedFd<'_>) -> io::Result<Option<Received>> {
    let mut buf = [0u8; DOOR_FRAME_MAX + 1];
    let (n, fds) = sys::recv_with_fds(conn, &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    let (frame, payload) = DoorFrame::decode(&buf[..n]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((frame, payload.to_vec(), fds)))
}

/// Sends one door message without blocking (a door connection holds a handful of small
/// messages at most, so it never fills).
fn send_frame(conn: BorrowedFd<'_>, frame: DoorFrame, payload: &[u8]) -> io::Result<()> {
    sys::send_msg(conn, &frame.encode(payload))
}

// ----- server --------------------------------------------------------------------------------

/// A listener's door and the registrations waiting for their connections.
pub(crate) struct Door {
    name: Vec<u8>,
    listener: AsyncFd<OwnedFd>,
    /// The listener's settings: the uids it trusts are read from them at each drain.
    settings: Overrides,
    /// The listener's context: the base of its settings, its counters.
    ctx: Context,
    /// Registrations and unregistered door connections held at most ([`entry_budget`]).
    budget: usize,
    /// The port the listener listens on.
    port: u16,
    state: Mutex<DoorState>,
}

impl fmt::Debug for Door {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Door").field("name", &String::from_utf8_lossy(&self.name)).finish()
    }
}

/// A door connection accepted whose registration has not arrived yet.
struct Waiting {
    conn: PeerFd,
    cred: PeerCred,
    since: Instant,
}

struct Entry {
    /// The client's TCP socket: the connection it makes is the one whose four-tuple it has.
    sock: PeerFd,
    conn: PeerFd,
    cred: PeerCred,
    instance: u64,
    /// The client's Proposal (a CLC message, at most `CLC_MAX_LEN` bytes).
    proposal: Vec<u8>,
    since: Instant,
}

impl Entry {
    /// Whether the client still waits (its door connection is open and silent).
    fn waiting(&self) -> bool {
        matches!(recv_frame(self.conn.as_fd()), Err(ref err) if err.kind() == io::ErrorKind::WouldBlock)
    }
}

#[derive(Default)]
struct DoorState {
    waiting: Vec<Waiting>,
    /// Registrations by the port the client's socket is bound to.
    entries: HashMap<u16, Vec<Entry>>,
    count: usize,
}

impl DoorState {
    fn held(&self) -> usize {
        self.count + self.waiting.len()
    }
}

/// A registration matched to an accepted connection; its client waits for the server's answer
/// on the door connection.
pub(crate) struct Registration {
    conn: PeerFd,
    counters: Arc<Counters>,
    pub(crate) client: ClientIdentity,
    proposal: Vec<u8>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration").field("client", &self.client).finish()
    }
}

/// Answers "no SMC" on a door connection, and counts it (every path that refuses comes here:
/// the door's budget, an unusable registration, a listener turned `TcpOnly`, a full or
/// congested handshake queue): a door "no SMC" and a decline sent, by its reason.
fn refuse_on(counters: &Counters, conn: &PeerFd, kind: DoorKind, reason: DeclineReason) {
    counters.door(crate::stats::DoorEvent::Unmatched);
    counters.decline(reason, crate::proto::handshake::Side::Local);
    let _ = send_frame(conn.as_fd(), DoorFrame { kind, reason: reason as u8, instance: 0 }, &[]);
}

impl Registration {
    /// Tells the client its connection stays TCP (and why): final, it stops waiting at once.
    pub(crate) fn refuse(self, reason: DeclineReason) {
        refuse_on(&self.counters, &self.conn, DoorKind::Refused, reason);
    }

    /// The wire the handshake runs over, starting with the client's Proposal. `None` when the
    /// client closed its door connection first (it stopped waiting and uses the connection as
    /// TCP), or the connection cannot be watched.
    pub(crate) fn open(self) -> Option<ServerWire> {
        match recv_frame(self.conn.as_fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // Closed, or a message out of turn: the client is not waiting for us.
            _ => return None,
        }
        // SAFETY: the PeerFd owns its descriptor and moves into the AsyncFd.
        let conn = unsafe { sys::register(self.conn, Interest::READABLE) }.ok()?;
        Some(ServerWire { conn, proposal: Some(self.proposal) })
    }
}

/// The server's end of a handshake on the door (see [`Wire`]).
pub(crate) struct ServerWire {
    conn: AsyncFd<PeerFd>,
    /// The Proposal that came with the registration, until the machine has read it.
    proposal: Option<Vec<u8>>,
}

impl fmt::Debug for ServerWire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerWire").finish_non_exhaustive()
    }
}

impl Wire for ServerWire {
    async fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        send_frame(self.conn.get_ref().as_fd(), CLC_FRAME, msg)
    }

    async fn recv(&mut self) -> io::Result<Option<Vec<u8>>> {
        if let Some(p) = self.proposal.take() {
            return Ok(Some(p));
        }
        loop {
            let mut guard = self.conn.readable().await?;
            match guard.try_io(|c| recv_frame(c.get_ref().as_fd())) {
                Ok(Ok(Some((f, payload, _)))) if f.kind == DoorKind::Clc => return Ok(Some(payload)),
                // Closed (the client's cancel), or anything but a CLC message from a client.
                Ok(Ok(_)) => return Ok(None),
                Ok(Err(e)) if e.kind() == io::ErrorKind::InvalidData => return Ok(None),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

impl Door {
    /// Binds the door of a listener on `local`: the solo name if it has no reuseport siblings
    /// (`reuseport` off), else (or if someone squats on it) the lowest free index for that
    /// address. `None` when all are taken (more listeners in one reuseport group than doors, or
    /// someone squatting on the names): the listener then serves TCP only.
    pub(crate) fn open(ctx: Context, local: SocketAddr, settings: Overrides, reuseport: bool) -> Option<Door> {
        let base = base_name(local);
        let solo = (!reuseport).then(|| solo_name(&base));
        for name in solo.into_iter().chain((0..MAX_DOORS).map(|i| door_name(&base, i))) {
            match sys::seqpacket_listen(&name) {
                Ok(fd) => {
                    // SAFETY: an OwnedFd owns its descriptor.
                    let listener = match unsafe { sys::register(fd, Interest::READABLE) } {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot register the smc door with the runtime: serving tcp only");
                            return None;
                        }
                    };
                    let budget = entry_budget();
                    let port = local.port();
                    return Some(Door { name, listener, settings, ctx, budget, port, state: Mutex::default() });
                }
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, door = %base, "cannot open the smc door: this listener serves tcp only");
                    return None;
                }
            }
        }
        tracing::warn!(door = %base, "every smc door name for this address is taken: this listener serves tcp only");
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
    /// registered one. Drains the door first when it is not known yet, so a registration sent
    /// before the connection is found (unless a flood of knocks is queued ahead of it). Never
    /// waits.
    pub(crate) fn lookup(&self, peer: SocketAddr, local: SocketAddr) -> Option<Registration> {
        let (peer, local) = (sys::unmap(peer), sys::unmap(local));
        let mut st = self.lock();
        if let Some(r) = st.take(self.ctx.counters(), peer, local) {
            return Some(r);
        }
        // The registration was queued before the client's SYN, so it is somewhere in the
        // door's queue: drain batch after batch until it turns up or the queue is empty. A
        // single batch missed registrations queued behind more than a batch of knocks (a storm
        // of 2000 connects under load lost about one in 2000 that way, as "no smc"). The queue
        // is at most the door's backlog deep, so this ends.
        for _ in 0..=MAX_ENTRIES / DRAIN_BATCH {
            let more = self.drain(&mut st);
            if let Some(r) = st.take(self.ctx.counters(), peer, local) {
                return Some(r);
            }
            if !matches!(more, Ok(true)) {
                break;
            }
        }
        None
    }

    /// Registrations and unregistered door connections held now: while there are any, the
    /// listener sweeps.
    pub(crate) fn pending(&self) -> usize {
        self.lock().held()
    }

    /// Stops taking registrations: clients that look for the door from now on find it closed,
    /// and connect as plain TCP (the listener is closing).
    pub(crate) fn close(&self) {
        // SAFETY: plain syscall on a descriptor we own; a shut-down listening Unix socket
        // refuses connections.
        unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(self.listener.get_ref()), libc::SHUT_RDWR) };
    }

    /// Waits until the door has new connections, then takes a batch in (for the listener
    /// task). `Ok(true)`: more may be queued (the caller comes back after other work). An error
    /// (no descriptor for a new connection, say) is returned so that the caller backs off
    /// instead of spinning on a door that stays readable.
    pub(crate) fn poll_drain(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<bool>> {
        let mut guard = ready!(self.listener.poll_read_ready(cx))?;
        let mut st = self.lock();
        match self.drain(&mut st) {
            Ok(true) => Poll::Ready(Ok(true)),
            Ok(false) => {
                guard.clear_ready();
                Poll::Ready(Ok(false))
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Accepts up to [`DRAIN_BATCH`] waiting door connections and reads every registration
    /// that has arrived. `Ok(false)`: the door's queue was found empty; `Ok(true)`: the batch
    /// ended first; an error: a connection could not be accepted (it stays queued for a later
    /// drain).
    fn drain(&self, st: &mut DoorState) -> io::Result<bool> {
        let mut res = Ok(true);
        // Read when the first knock of this drain comes in: current settings, once a batch.
        let mut allowed: Option<Vec<u32>> = None;
        for _ in 0..DRAIN_BATCH {
            match sys::seqpacket_accept(self.listener.get_ref().as_fd()) {
                Ok(conn) => match sys::peer_cred(conn.as_fd()) {
                    Ok(cred)
                        if cred.trusted(
                            allowed.get_or_insert_with(|| self.settings.resolve(self.ctx.settings()).shm.allowed_uids),
                        ) =>
                    {
                        if st.held() >= self.budget {
                            refuse_on(
                                self.ctx.counters(),
                                &conn,
                                DoorKind::Unmatched,
                                DeclineReason::HandshakeCongested,
                            );
                        } else {
                            st.waiting.push(Waiting { conn, cred, since: Instant::now() });
                        }
                    }
                    // Dropped unread: the closer takes out whatever it queued for us, defused.
                    Ok(cred) => {
                        tracing::debug!(
                            uid = cred.uid,
                            gid = cred.gid,
                            pid = cred.pid,
                            "refusing a door connection from an untrusted peer"
                        );
                        self.ctx.counters().door_refused();
                    }
                    Err(e) => tracing::debug!(error = %e, "door connection without credentials"),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    res = Ok(false);
                    break;
                }
                Err(e) => {
                    // EMFILE and friends: the connections stay queued for a later drain; the
                    // clients behind them get no verdict and stay on TCP.
                    tracing::debug!(error = %e, "door accept");
                    res = Err(e);
                    break;
                }
            }
        }
        let waiting = std::mem::take(&mut st.waiting);
        for w in waiting {
            match recv_frame(w.conn.as_fd()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && w.since.elapsed() < WAITING_TTL => {
                    st.waiting.push(w);
                }
                Ok(Some((frame, payload, fds))) if frame.kind == DoorKind::Register => {
                    st.register(self.ctx.counters(), w, frame, payload, fds)
                }
                // A closed connection, a message out of order or garbage: drop it.
                _ => {}
            }
        }
        res
    }

    /// Drops registrations whose client cancelled, went away or waited too long, and door
    /// connections that never registered.
    pub(crate) fn sweep(&self) {
        let mut st = self.lock();
        let _ = self.drain(&mut st);
        let mut removed = 0;
        let port = self.port;
        st.entries.retain(|_, list| {
            list.retain_mut(|e| {
                let alive = e.since.elapsed() < ENTRY_TTL && e.waiting();
                if !alive {
                    removed += 1;
                    // A client that stopped waiting uses its connection to us as TCP: its
                    // socket's options stay as it set them. Any other socket (never connected,
                    // or connected elsewhere) is nobody's connection of ours.
                    if sys::socket_tuple(e.sock.as_fd()).is_some_and(|(_, to)| to.port() == port) {
                        e.sock.keep_options();
                    }
                }
                alive
            });
            !list.is_empty()
        });
        st.count -= removed;
    }
}

impl DoorState {
    fn register(&mut self, counters: &Counters, w: Waiting, frame: DoorFrame, proposal: Vec<u8>, fds: Vec<PeerFd>) {
        let mut fds = fds.into_iter();
        let (Some(sock), None) = (fds.next(), fds.next()) else {
            tracing::debug!("door registration without exactly one socket");
            return refuse_on(counters, &w.conn, DoorKind::Unmatched, DeclineReason::SyncError);
        };
        let port = match sys::registrable_socket(sock.as_fd()) {
            Ok(p) => p,
            Err(why) => {
                tracing::debug!(why, "door registration with an unusable socket");
                return refuse_on(counters, &w.conn, DoorKind::Unmatched, DeclineReason::SyncError);
            }
        };
        // The registration is the one message that carries a descriptor: from here on the
        // connection carries CLC frames only, and refuses descriptors where the kernel can.
        sys::refuse_descriptors(w.conn.as_fd());
        self.count += 1;
        self.entries.entry(port).or_default().push(Entry {
            sock,
            conn: w.conn,
            cred: w.cred,
            instance: frame.instance,
            proposal,
            since: Instant::now(),
        });
    }

    /// Takes the registration for a connection from `peer` to `local`: the one whose socket is
    /// that connection's client end (its four-tuple, seen from the other side). At most one
    /// socket in the system has that four-tuple.
    fn take(&mut self, counters: &Arc<Counters>, peer: SocketAddr, local: SocketAddr) -> Option<Registration> {
        let list = self.entries.get_mut(&peer.port())?;
        let i = list.iter().position(|e| sys::socket_tuple(e.sock.as_fd()) == Some((peer, local)))?;
        let mut e = list.swap_remove(i);
        if list.is_empty() {
            self.entries.remove(&peer.port());
        }
        self.count -= 1;
        // The proof has served; the socket is let go now (on the closer thread), its options
        // as the client set them: it is the client's connection.
        e.sock.keep_options();
        Some(Registration { client: identity(&e), conn: e.conn, counters: counters.clone(), proposal: e.proposal })
    }
}

fn identity(e: &Entry) -> ClientIdentity {
    ClientIdentity { pid: u32::try_from(e.cred.pid).unwrap_or(0), uid: e.cred.uid, instance: e.instance }
}

// ----- client --------------------------------------------------------------------------------

/// A client's registration at the doors of one address (one per member of a reuseport group
/// that has a door). Dropping it closes them: the registration is cancelled.
pub(crate) struct ClientRegistration {
    doors: Vec<PeerFd>,
    port: PortClaim,
    from_user: bool,
}

/// Ports of this process's registrations in flight. Our client sockets bind with
/// `SO_REUSEPORT`, so two of them could share a port; a door that holds two registrations for
/// one port cannot tell their connections apart and serves both as TCP. A port stays claimed
/// until its handshake is over.
static PORTS_IN_FLIGHT: Mutex<std::collections::BTreeSet<u16>> = Mutex::new(std::collections::BTreeSet::new());

fn ports_in_flight() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<u16>> {
    PORTS_IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port claimed for a registration in flight (see [`PORTS_IN_FLIGHT`]).
struct PortClaim(u16);

impl Drop for PortClaim {
    fn drop(&mut self) {
        ports_in_flight().remove(&self.0);
    }
}

impl fmt::Debug for ClientRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientRegistration").field("doors", &self.doors.len()).finish()
    }
}

/// The doors that may receive a connection to `dst`: the listener bound to exactly that
/// address, and, when `dst` is this host's, listeners bound to the wildcard of its port; with
/// every member of their reuseport groups. Doors owned by an untrusted uid are skipped. Also
/// says whether a door was found too busy to take a connection.
/// What [`find_doors`] saw at a destination.
struct Lookup {
    /// Trusted doors that took a connection.
    doors: Vec<PeerFd>,
    /// A door had a full queue.
    busy: bool,
    /// The look-up stopped for want of a descriptor or memory.
    starved: bool,
}

fn find_doors(counters: &Counters, dst: SocketAddr, allowed_uids: &[u32]) -> Lookup {
    let dst = sys::unmap(dst);
    let mut bases = vec![base_name(dst)];
    if sys::is_local_ip(dst.ip()) {
        if dst.is_ipv4() {
            bases.push(base_name(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), dst.port())));
        }
        bases.push(base_name(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), dst.port())));
        bases.dedup();
    }
    let mut doors = Vec::new();
    let mut busy = false;
    let mut starved = false;
    // One socket serves every refused probe; a new one only after a door took it.
    let mut probe: Option<OwnedFd> = None;
    for (i, base) in bases.iter().enumerate() {
        // A listener bound to exactly `dst` takes the connection before any wildcard one does.
        if i > 0 && !doors.is_empty() {
            break;
        }
        let names = std::iter::once(solo_name(base)).chain((0..MAX_DOORS).map(|i| door_name(base, i)));
        for (index, name) in names.enumerate() {
            let fd = match probe.take() {
                Some(fd) => fd,
                None => match sys::seqpacket_socket() {
                    Ok(fd) => fd,
                    Err(e) => {
                        starved = sys::is_starved(&e);
                        return Lookup { doors, busy, starved };
                    }
                },
            };
            match sys::seqpacket_connect_with(fd, &name) {
                // Connected: whoever owns the door may have queued descriptors for us already,
                // so from here on the connection is a PeerFd, closed off this thread.
                Ok(fd) => {
                    let fd = PeerFd::new(fd);
                    match sys::peer_cred(fd.as_fd()) {
                        Ok(cred) if cred.trusted(allowed_uids) => {
                            doors.push(fd);
                            if index == 0 {
                                // A solo listener has no siblings.
                                break;
                            }
                        }
                        Ok(cred) => {
                            tracing::debug!(uid = cred.uid, gid = cred.gid, door = %base, "door owned by an untrusted peer: not registering");
                            counters.door_refused();
                        }
                        Err(e) => starved |= sys::is_starved(&e),
                    }
                }
                // A door with a full queue: skip it (its listener is swamped; TCP it is there).
                Err((fd, e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    busy = true;
                    probe = Some(fd);
                }
                // No solo door: look for a reuseport group's. No door at an index: the group
                // ends here.
                Err((fd, e)) => {
                    probe = Some(fd);
                    starved |= sys::is_starved(&e);
                    if index > 0 {
                        break;
                    }
                }
            }
        }
    }
    Lookup { doors, busy, starved }
}

/// What [`register`] came to.
pub(crate) enum Registered {
    /// Registered: the registration, and the TCP socket (bound, not connected) to connect.
    Yes(ClientRegistration, socket2::Socket),
    /// No door we trust at the destination (or no socket to register): connect as plain TCP.
    NoDoor,
    /// The destination's door had no room for us: its listener is swamped.
    Busy,
    /// This process ran out of descriptors (or memory) looking for doors or making the
    /// socket: connect as plain TCP, declined locally for resources.
    Starved,
}

/// Registers a connection to `dst` at its doors, if `dst` has any we trust, with the CLC
/// `proposal` it makes.
/// `user`: the application's socket, registered (and later connected) in place of a new one
/// of ours when there is a door; it stays in `user` otherwise. An unbound one is bound to the
/// wildcard address and a port the kernel picks.
pub(crate) fn register(
    counters: &Counters,
    dst: SocketAddr,
    allowed_uids: &[u32],
    instance: u64,
    proposal: &[u8],
    user: &mut Option<socket2::Socket>,
) -> Registered {
    let Lookup { mut doors, busy, starved } = find_doors(counters, dst, allowed_uids);
    if doors.is_empty() {
        return if busy {
            Registered::Busy
        } else if starved {
            Registered::Starved
        } else {
            Registered::NoDoor
        };
    }
    let from_user = user.is_some();
    let sock = match user.take() {
        Some(sock) => match sys::bind_if_unbound(&sock, dst) {
            Ok(()) => sock,
            Err(e) => {
                tracing::debug!(error = %e, "cannot bind the application's socket: connecting as plain tcp");
                *user = Some(sock);
                return Registered::NoDoor;
            }
        },
        None => match sys::bound_tcp_socket(dst, |p| ports_in_flight().contains(&p)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "no socket to register: connecting as plain tcp");
                return if sys::is_starved(&e) { Registered::Starved } else { Registered::NoDoor };
            }
        },
    };
    let give_back = |sock: socket2::Socket, user: &mut Option<socket2::Socket>| {
        if from_user {
            *user = Some(sock);
        }
    };
    let Some(port) = sock.local_addr().ok().and_then(|a| a.as_socket()).map(|a| a.port()) else {
        give_back(sock, user);
        return Registered::NoDoor;
    };
    // Claimed under the set's lock: another registration of ours that bound the same port
    // meanwhile loses, and connects as plain TCP.
    if !ports_in_flight().insert(port) {
        give_back(sock, user);
        return Registered::NoDoor;
    }
    let port = PortClaim(port);
    let msg = DoorFrame { kind: DoorKind::Register, reason: 0, instance }.encode(proposal);
    // A door that refused us meanwhile (an untrusted uid: it closed our connection) takes no
    // registration.
    doors.retain(|d| sys::send_with_fds(d.as_fd(), &msg, &[sock.as_fd()]).is_ok());
    if doors.is_empty() {
        give_back(sock, user);
        return Registered::NoDoor;
    }
    Registered::Yes(ClientRegistration { doors, port, from_user }, sock)
}

impl ClientRegistration {
    /// Whether the registered socket is the application's.
    pub(crate) fn is_users(&self) -> bool {
        self.from_user
    }

    /// The wire the rest of the handshake runs over, once the TCP connection is up. `secret` is
    /// the Proposal's: a door that answers "no handshake" reads to the machine as that
    /// connection's Decline.
    pub(crate) fn into_wire(self, secret: Secret) -> io::Result<ClientWire> {
        let doors = self.doors.into_iter().map(|d| Some(DoorFd::Plain(d))).collect();
        Ok(ClientWire { doors, chosen: None, secret, last_no: None, _port: self.port })
    }
}

/// The client's end of a handshake on the door (see [`Wire`]). Until a door answers, every door
/// of the address is listened to (the connection reached one member of a reuseport group);
/// the first to answer is the one, and the others are closed (cancelled).
pub(crate) struct ClientWire {
    doors: Vec<Option<DoorFd>>,
    chosen: Option<usize>,
    secret: Secret,
    last_no: Option<DeclineReason>,
    _port: PortClaim,
}

impl fmt::Debug for ClientWire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientWire").field("chosen", &self.chosen).finish_non_exhaustive()
    }
}

/// A client's door connection, registered with the reactor only once it has to be waited for
/// (the answer is often there by the time the TCP connect completes).
enum DoorFd {
    Plain(PeerFd),
    Watched(AsyncFd<PeerFd>),
}

impl DoorFd {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            DoorFd::Plain(fd) => fd.as_fd(),
            DoorFd::Watched(a) => a.get_ref().as_fd(),
        }
    }

    /// Registers the descriptor in `slot` with the reactor (once).
    fn watch(slot: &mut Option<DoorFd>) -> io::Result<()> {
        *slot = match slot.take() {
            // SAFETY: the PeerFd owns its descriptor and moves into the AsyncFd.
            Some(DoorFd::Plain(fd)) => Some(DoorFd::Watched(unsafe { sys::register(fd, Interest::READABLE) }?)),
            other => other,
        };
        Ok(())
    }
}

impl ClientWire {
    /// Whether a door has answered (a handshake is under way with its listener).
    pub(crate) fn answered(&self) -> bool {
        self.chosen.is_some()
    }

    /// Reads what door `i` has; `Some` ends the wait.
    fn take(&mut self, i: usize) -> Option<io::Result<Option<Vec<u8>>>> {
        let d = self.doors[i].as_ref()?;
        match recv_frame(d.fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Ok(Some((f, payload, _))) if f.kind == DoorKind::Clc => {
                if self.chosen.is_none() {
                    self.chosen = Some(i);
                    // The connection is this door's listener's: cancel the others.
                    for (j, d) in self.doors.iter_mut().enumerate() {
                        if j != i {
                            *d = None;
                        }
                    }
                }
                Some(Ok(Some(payload)))
            }
            Ok(Some((f, _, _))) if f.kind == DoorKind::Unmatched && self.chosen.is_none() => {
                self.last_no = Some(DeclineReason::from_u8(f.reason).unwrap_or(DeclineReason::Internal));
                self.doors[i] = None;
                self.all_said_no()
            }
            // The listener that got the connection says it stays TCP: no other door will answer.
            Ok(Some((f, _, _))) if f.kind == DoorKind::Refused && self.chosen.is_none() => {
                self.last_no = Some(DeclineReason::from_u8(f.reason).unwrap_or(DeclineReason::Internal));
                self.doors.iter_mut().for_each(|d| *d = None);
                self.all_said_no()
            }
            // Closed, or nonsense from a door: nothing more from it.
            _ => {
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

impl Wire for ClientWire {
    async fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        // The client speaks only after a door answered.
        let d = self.chosen.and_then(|i| self.doors[i].as_ref()).ok_or_else(|| io::Error::other("no door answered"))?;
        match send_frame(d.fd(), CLC_FRAME, msg) {
            // The server closed the door: it did so after its final word, which is still
            // queued for us to read; what we sent is moot.
            Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => Ok(()),
            r => r,
        }
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
            // Wait until a door has something (readiness is edge-triggered: clear it only
            // where the read found nothing, which the next round checks again). Registering a
            // descriptor that is already readable reports it at once.
            for d in self.doors.iter_mut() {
                DoorFd::watch(d)?;
            }
            std::future::poll_fn(|cx| {
                for d in self.doors.iter().flatten() {
                    let DoorFd::Watched(d) = d else { continue };
                    if let Poll::Ready(r) = d.poll_read_ready(cx) {
                        let mut g = r?;
                        g.clear_ready();
                        return Poll::Ready(Ok::<(), io::Error>(()));
                    }
                }
                Poll::Pending
            })
            .await?;
        }
    }
}
