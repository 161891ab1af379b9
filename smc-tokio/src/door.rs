//! The door: same-host SMC intent, out of band, before the TCP connection exists.
//!
//! The kernel's SMC signals intent with a TCP option on the SYN, which a plain server ignores.
//! User space cannot touch the SYN, and a first in-band message would reach a plain server as
//! garbage. So on one host the intent travels beside the connection instead:
//!
//! 1. Each [`SmcListener`](crate::SmcListener) binds an abstract `SOCK_SEQPACKET` socket, its
//!    door, named after the address it listens on ([`base_name`]; abstract names live in the
//!    network namespace, which is the same-host boundary that matters).
//! 2. A client about to connect to an address looks for that door. Only if it finds one (and
//!    its owner is a uid it trusts, `SO_PEERCRED`) does it bind its TCP socket to a port of its
//!    choosing and hand the socket itself to the door with `SCM_RIGHTS`, then connect.
//! 3. When the listener accepts a connection, it looks the peer's port up among the
//!    registrations (draining the door first if it is not there yet: the registration was sent
//!    before the client's SYN, so it is in the door's queue by then). Registered: the client
//!    gets a verdict on its door connection and the SMC handshake follows in-band. Not
//!    registered: a plain client, handed to the application at once, with no peek and no timer.
//!
//! Why the socket itself: holding the descriptor is proof that the sender owns that port. The
//! server checks it is a bound, unconnected TCP socket without `SO_REUSEADDR`, notes its
//! address and closes it at once (holding it would keep the client's socket open after the
//! client closes it). Our clients bind with `SO_REUSEPORT` and nothing else, so while the
//! socket lives no process of another uid can hold that port on any address; a connection
//! from that port is the registrant's (or another process of its uid, which could ptrace it
//! anyway). Both ends check each other's uid: a process squatting on a door's name, or
//! knocking on a door, gets nothing unless it runs as the same (or an allowed) uid, and the
//! worst either can do is make a connection fall back to TCP.
//!
//! Every outcome of the verdict is safe: a matched client proposes in-band to a server that
//! waits for exactly that; a client that gives up waiting cancels, and if the server matched
//! it anyway (the cancel crossed the verdict), the server finds application bytes, or nothing,
//! where the Proposal would be, and serves the connection as TCP.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::proto::clc::DeclineReason;
use crate::sys::{self, PeerCred};

/// Door messages: magic, version, kind, reason, one spare byte, the client's instance id.
const MAGIC: [u8; 4] = *b"SMCd";
const VERSION: u8 = 1;
const FRAME_LEN: usize = 16;

/// Doors one address can have: the listeners of one `SO_REUSEPORT` group each bind the lowest
/// free index, and a client registers with every door it finds. Sixteen covers a worker per
/// core on common servers; later listeners in a larger group serve TCP only.
const MAX_DOORS: u32 = 16;

/// How long a server keeps a registration whose connection has not arrived. A client waits for
/// its verdict for its handshake timeout (2 s by default) after the connect, then cancels; a
/// registration older than this has been cancelled, or its client is gone.
const ENTRY_TTL: Duration = Duration::from_secs(30);

/// Registrations a door holds at once; beyond it, new ones are answered "congested" at once.
/// Each holds a door connection (a descriptor), so this bounds what a flood of registrations
/// can cost the server.
const MAX_ENTRIES: usize = 4096;

/// How long an accepted door connection may stay silent before its registration arrives. A
/// client sends it right after connecting to the door.
const WAITING_TTL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// Client to server, with the TCP socket attached: "my next connection to you is SMC".
    Register = 1,
    /// Client to server: "I stopped waiting; treat my connection as plain TCP".
    Cancel = 2,
    /// Server to client: "your connection arrived; propose now".
    Matched = 3,
    /// Server to client: "no SMC for this connection" (with a decline reason).
    Unmatched = 4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    kind: Kind,
    reason: u8,
    instance: u64,
}

impl Frame {
    fn encode(self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.kind as u8;
        b[6] = self.reason;
        b[8..].copy_from_slice(&self.instance.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Frame> {
        if b.len() != FRAME_LEN || b[..4] != MAGIC || b[4] != VERSION {
            return None;
        }
        let kind = match b[5] {
            1 => Kind::Register,
            2 => Kind::Cancel,
            3 => Kind::Matched,
            4 => Kind::Unmatched,
            _ => return None,
        };
        Some(Frame { kind, reason: b[6], instance: u64::from_be_bytes(b[8..].try_into().ok()?) })
    }
}

/// The door names of a listener on `addr`, without the index: `smc-tokio/d1/127.0.0.1:8080`,
/// `smc-tokio/d1/[::]:8080`.
pub(crate) fn base_name(addr: SocketAddr) -> String {
    format!("smc-tokio/d{VERSION}/{}", sys::unmap(addr))
}

fn door_name(base: &str, index: u32) -> Vec<u8> {
    format!("{base}/{index}").into_bytes()
}

/// Reads one door message without blocking. `Ok(None)`: the peer closed. Descriptors that
/// arrive with it are returned (only a registration carries one).
fn recv_frame(conn: BorrowedFd<'_>) -> io::Result<Option<(Frame, Vec<OwnedFd>)>> {
    let mut buf = [0u8; FRAME_LEN + 1];
    let (n, fds) = sys::recv_with_fds(conn, &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    let frame =
        Frame::decode(&buf[..n]).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad door message"))?;
    Ok(Some((frame, fds)))
}

fn trusted(uid: u32, allowed: &[u32]) -> bool {
    // SAFETY: geteuid cannot fail and has no preconditions.
    uid == unsafe { libc::geteuid() } || allowed.contains(&uid)
}

// ----- server --------------------------------------------------------------------------------

/// A listener's door and the registrations waiting for their connections.
pub(crate) struct Door {
    name: Vec<u8>,
    listener: AsyncFd<OwnedFd>,
    allowed_uids: Vec<u32>,
    state: Mutex<DoorState>,
}

impl fmt::Debug for Door {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Door").field("name", &String::from_utf8_lossy(&self.name)).finish()
    }
}

/// A door connection accepted whose registration has not arrived yet.
struct Waiting {
    conn: OwnedFd,
    cred: PeerCred,
    since: Instant,
}

struct Entry {
    /// The address the client's socket was bound to (the IP may be the wildcard).
    bound: SocketAddr,
    /// Where it was connected to when we looked, if it was by then: it must be us.
    connected: Option<SocketAddr>,
    conn: OwnedFd,
    cred: PeerCred,
    instance: u64,
    since: Instant,
}

#[derive(Default)]
struct DoorState {
    waiting: Vec<Waiting>,
    /// Registrations by the client's port.
    entries: HashMap<u16, Vec<Entry>>,
    count: usize,
}

/// Who registered a connection, from the kernel (`SO_PEERCRED`) and its registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientIdentity {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    /// The client's link-group manager instance: a restarted process with a reused pid is
    /// another client.
    pub(crate) instance: u64,
}

/// A registration matched to an accepted connection; the client waits for [`answer`].
///
/// [`answer`]: Registration::answer
pub(crate) struct Registration {
    conn: OwnedFd,
    pub(crate) client: ClientIdentity,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration").field("client", &self.client).finish()
    }
}

impl Registration {
    /// Tells the client the verdict: `Ok` to propose now, or the reason there will be no SMC.
    /// Returns whether the client was told to propose: a cancel that arrived first, a client
    /// that went away or a door connection that cannot take the message all mean it was not
    /// (and the connection is plain TCP).
    pub(crate) fn answer(self, verdict: Result<(), DeclineReason>) -> bool {
        // The client's cancel, or its end closing, comes first in its connection's queue if it
        // was sent first: then the client has already gone plain.
        match recv_frame(self.conn.as_fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            _ => return false,
        }
        let frame = match verdict {
            Ok(()) => Frame { kind: Kind::Matched, reason: 0, instance: 0 },
            Err(r) => Frame { kind: Kind::Unmatched, reason: r as u8, instance: 0 },
        };
        sys::send_msg(self.conn.as_fd(), &frame.encode()).is_ok() && verdict.is_ok()
    }
}

impl Door {
    /// Binds the door of a listener on `local`: the lowest free index for that address.
    /// `None` when all are taken (more listeners in one reuseport group than doors, or
    /// someone squatting on the names): the listener then serves TCP only.
    pub(crate) fn open(local: SocketAddr, allowed_uids: Vec<u32>) -> Option<Door> {
        let base = base_name(local);
        for index in 0..MAX_DOORS {
            let name = door_name(&base, index);
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
                    return Some(Door { name, listener, allowed_uids, state: Mutex::default() });
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
    /// before the connection is always found. Never waits.
    pub(crate) fn lookup(&self, peer: SocketAddr, local: SocketAddr) -> Option<Registration> {
        let (peer, local) = (sys::unmap(peer), sys::unmap(local));
        let mut st = self.lock();
        if let Some(r) = st.take(peer, local) {
            return Some(r);
        }
        let _ = self.drain(&mut st);
        st.take(peer, local)
    }

    /// Registrations waiting for their connections now.
    pub(crate) fn pending(&self) -> usize {
        self.lock().count
    }

    /// Waits until the door has new connections, then takes them in (for the listener task).
    /// An error (no descriptor for a new connection, say) is returned so that the caller backs
    /// off instead of spinning on a door that stays readable.
    pub(crate) fn poll_drain(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut guard = ready!(self.listener.poll_read_ready(cx))?;
        let mut st = self.lock();
        match self.drain(&mut st) {
            Ok(()) => {
                guard.clear_ready();
                Poll::Ready(Ok(()))
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Accepts every waiting door connection and reads every registration that has arrived.
    /// `Ok`: the door's queue was found empty; an error: a connection could not be accepted
    /// (it stays queued for a later drain).
    fn drain(&self, st: &mut DoorState) -> io::Result<()> {
        let res = loop {
            match sys::seqpacket_accept(self.listener.get_ref().as_fd()) {
                Ok(conn) => match sys::peer_cred(conn.as_fd()) {
                    Ok(cred) if trusted(cred.uid, &self.allowed_uids) => {
                        st.waiting.push(Waiting { conn, cred, since: Instant::now() })
                    }
                    Ok(cred) => {
                        tracing::debug!(uid = cred.uid, pid = cred.pid, "refusing a door connection from another uid");
                        crate::stats::door_refused();
                    }
                    Err(e) => tracing::debug!(error = %e, "door connection without credentials"),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) => {
                    // EMFILE and friends: the connections stay queued for a later drain; the
                    // clients behind them get no verdict and stay on TCP.
                    tracing::debug!(error = %e, "door accept");
                    break Err(e);
                }
            }
        };
        let waiting = std::mem::take(&mut st.waiting);
        for w in waiting {
            match recv_frame(w.conn.as_fd()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if w.since.elapsed() < WAITING_TTL {
                        st.waiting.push(w);
                    }
                }
                Ok(Some((frame, fds))) if frame.kind == Kind::Register => st.register(w, frame, fds),
                // A closed connection, a message out of order or garbage: drop it.
                _ => {}
            }
        }
        res
    }

    /// Drops registrations whose client cancelled, went away or waited too long, and door
    /// connections that never registered. Returns whether any are left (the caller sweeps
    /// again later while there are).
    pub(crate) fn sweep(&self) -> bool {
        let mut st = self.lock();
        let _ = self.drain(&mut st);
        let mut removed = 0;
        st.entries.retain(|_, list| {
            list.retain(|e| {
                let alive = e.since.elapsed() < ENTRY_TTL
                    && matches!(recv_frame(e.conn.as_fd()), Err(ref err) if err.kind() == io::ErrorKind::WouldBlock);
                if !alive {
                    removed += 1;
                }
                alive
            });
            !list.is_empty()
        });
        st.count -= removed;
        st.count > 0 || !st.waiting.is_empty()
    }
}

impl DoorState {
    fn register(&mut self, w: Waiting, frame: Frame, fds: Vec<OwnedFd>) {
        let refuse = |conn: &OwnedFd, reason: DeclineReason| {
            let f = Frame { kind: Kind::Unmatched, reason: reason as u8, instance: 0 };
            let _ = sys::send_msg(conn.as_fd(), &f.encode());
        };
        let [sock] = fds.as_slice() else {
            tracing::debug!(fds = fds.len(), "door registration without exactly one socket");
            return refuse(&w.conn, DeclineReason::SyncError);
        };
        let (bound, connected) = match sys::registrable_socket(sock.as_fd()) {
            Ok(a) => a,
            Err(why) => {
                tracing::debug!(why, "door registration with an unusable socket");
                return refuse(&w.conn, DeclineReason::SyncError);
            }
        };
        // The socket was proof, and is closed now (with `fds`): holding it would keep the
        // client's socket open after the client closes it.
        drop(fds);
        if self.count >= MAX_ENTRIES {
            return refuse(&w.conn, DeclineReason::HandshakeCongested);
        }
        self.count += 1;
        self.entries.entry(bound.port()).or_default().push(Entry {
            bound,
            connected,
            conn: w.conn,
            cred: w.cred,
            instance: frame.instance,
            since: Instant::now(),
        });
    }

    /// Takes the registration for a connection from `peer` to `local`: the one whose socket was
    /// bound to that port (and that address, or the wildcard), and, if it had connected when we
    /// looked, to `local`. Two that both fit (two sockets of one uid sharing a port through
    /// SO_REUSEPORT) are both answered "no": the connection cannot be told apart, so it stays
    /// plain, and so does the other's.
    fn take(&mut self, peer: SocketAddr, local: SocketAddr) -> Option<Registration> {
        let list = self.entries.get_mut(&peer.port())?;
        let fits = |e: &Entry| {
            e.bound.is_ipv4() == peer.is_ipv4()
                && (e.bound.ip().is_unspecified() || e.bound.ip() == peer.ip())
                && e.connected.is_none_or(|c| c == local)
        };
        let n = list.iter().filter(|e| fits(e)).count();
        if n == 0 {
            return None;
        }
        let mut taken: Vec<Entry> = Vec::with_capacity(n);
        let mut i = 0;
        while i < list.len() {
            if fits(&list[i]) {
                taken.push(list.swap_remove(i));
            } else {
                i += 1;
            }
        }
        if list.is_empty() {
            self.entries.remove(&peer.port());
        }
        self.count -= taken.len();
        if taken.len() > 1 {
            tracing::debug!(%peer, n = taken.len(), "several registrations for one port: all stay tcp");
            for e in taken {
                let client = identity(&e);
                Registration { conn: e.conn, client }.answer(Err(DeclineReason::SyncError));
            }
            return None;
        }
        taken.pop().map(|e| Registration { client: identity(&e), conn: e.conn })
    }
}

fn identity(e: &Entry) -> ClientIdentity {
    ClientIdentity { pid: u32::try_from(e.cred.pid).unwrap_or(0), uid: e.cred.uid, instance: e.instance }
}

// ----- client --------------------------------------------------------------------------------

/// What the door said about a registered connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The server has the connection and waits for the Proposal.
    Matched,
    /// The server will not do SMC on it (for this reason).
    Unmatched(DeclineReason),
    /// The door closed without a verdict (the listener went away).
    Gone,
    /// No verdict within the wait: cancelled; the connection is plain TCP.
    TimedOut,
}

/// A client's registration at the doors of one address.
pub(crate) struct ClientRegistration {
    doors: Vec<OwnedFd>,
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
fn find_doors(dst: SocketAddr, allowed_uids: &[u32]) -> (Vec<OwnedFd>, bool) {
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
    for base in &bases {
        for index in 0..MAX_DOORS {
            match sys::seqpacket_connect(&door_name(base, index)) {
                Ok(fd) => match sys::peer_cred(fd.as_fd()) {
                    Ok(cred) if trusted(cred.uid, allowed_uids) => doors.push(fd),
                    Ok(cred) => {
                        tracing::debug!(uid = cred.uid, door = %base, "door owned by an untrusted uid: not registering");
                        crate::stats::door_refused();
                    }
                    Err(_) => {}
                },
                // A door with a full queue: skip it (its listener is swamped; TCP it is there).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => busy = true,
                // No door at this index: the group ends here.
                Err(_) => break,
            }
        }
    }
    (doors, busy)
}

/// What [`register`] came to.
pub(crate) enum Registered {
    /// Registered: the registration, and the TCP socket (bound, not connected) to connect.
    Yes(ClientRegistration, socket2::Socket),
    /// No door we trust at the destination (or no socket to register): connect as plain TCP.
    NoDoor,
    /// The destination's door had no room for us: its listener is swamped.
    Busy,
}

/// Registers a connection to `dst` at its doors, if `dst` has any we trust.
pub(crate) fn register(dst: SocketAddr, allowed_uids: &[u32], instance: u64) -> Registered {
    let (mut doors, busy) = find_doors(dst, allowed_uids);
    if doors.is_empty() {
        return if busy { Registered::Busy } else { Registered::NoDoor };
    }
    let sock = match sys::bound_tcp_socket(dst) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "no socket to register: connecting as plain tcp");
            return Registered::NoDoor;
        }
    };
    let msg = Frame { kind: Kind::Register, reason: 0, instance }.encode();
    // A door that refused us meanwhile (an untrusted uid: it closed our connection) takes no
    // registration.
    doors.retain(|d| sys::send_with_fds(d.as_fd(), &msg, &[sock.as_fd()]).is_ok());
    if doors.is_empty() {
        return Registered::NoDoor;
    }
    Registered::Yes(ClientRegistration { doors }, sock)
}

impl ClientRegistration {
    /// Waits up to `wait` for the verdict (after the TCP connect completed). On `TimedOut`
    /// the registration was cancelled.
    pub(crate) async fn verdict(&mut self, wait: Duration) -> Verdict {
        let deadline = tokio::time::Instant::now() + wait;
        let doors = std::mem::take(&mut self.doors);
        let mut open = vec![true; doors.len()];
        let mut last_no = None;
        // Registered with the reactor only if the verdict is not there at the first look.
        let mut watched: Vec<AsyncFd<BorrowedFd<'_>>> = Vec::new();
        let verdict = loop {
            let mut matched = false;
            for (i, d) in doors.iter().enumerate() {
                if !open[i] {
                    continue;
                }
                match recv_frame(d.as_fd()) {
                    Ok(Some((f, _))) if f.kind == Kind::Matched => {
                        open[i] = false;
                        matched = true;
                        break;
                    }
                    Ok(Some((f, _))) if f.kind == Kind::Unmatched => {
                        last_no = Some(DeclineReason::from_u8(f.reason).unwrap_or(DeclineReason::Internal));
                        open[i] = false;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // Closed, or a message that makes no sense from a door: no verdict there.
                    _ => open[i] = false,
                }
            }
            if matched {
                break Verdict::Matched;
            }
            if !open.contains(&true) {
                break last_no.map_or(Verdict::Gone, Verdict::Unmatched);
            }
            if watched.is_empty() {
                for d in &doors {
                    // SAFETY: the borrowed descriptor stays open while registered: `doors`
                    // outlives `watched`, which is dropped (deregistering) before `doors`.
                    match unsafe { sys::register(d.as_fd(), Interest::READABLE) } {
                        Ok(w) => watched.push(w),
                        Err(_) => break,
                    }
                }
                if watched.len() != doors.len() {
                    break Verdict::TimedOut;
                }
                // Look again: a verdict that arrived before the registration is seen now.
                continue;
            }
            let ready = std::future::poll_fn(|cx| {
                for (i, w) in watched.iter().enumerate() {
                    if open[i] {
                        if let Poll::Ready(r) = w.poll_read_ready(cx) {
                            if let Ok(mut g) = r {
                                g.clear_ready();
                            }
                            return Poll::Ready(());
                        }
                    }
                }
                Poll::Pending
            });
            if tokio::time::timeout_at(deadline, ready).await.is_err() {
                break Verdict::TimedOut;
            }
        };
        drop(watched);
        let cancel = Frame { kind: Kind::Cancel, reason: 0, instance: 0 }.encode();
        let mut late_match = false;
        for (d, still) in doors.iter().zip(&open) {
            if *still {
                let _ = sys::send_msg(d.as_fd(), &cancel);
                if verdict == Verdict::TimedOut {
                    // A verdict sent before the server read our cancel is in the queue now,
                    // and binds us.
                    if let Ok(Some((f, _))) = recv_frame(d.as_fd()) {
                        late_match |= f.kind == Kind::Matched;
                    }
                }
            }
        }
        if late_match {
            Verdict::Matched
        } else {
            verdict
        }
    }

    /// Gives the registration up (the connect failed or was abandoned).
    pub(crate) fn cancel(mut self) {
        self.cancel_all();
    }

    fn cancel_all(&mut self) {
        let cancel = Frame { kind: Kind::Cancel, reason: 0, instance: 0 }.encode();
        for d in self.doors.drain(..) {
            let _ = sys::send_msg(d.as_fd(), &cancel);
        }
    }
}

impl Drop for ClientRegistration {
    fn drop(&mut self) {
        // A connect dropped before its verdict: tell the doors, so they do not match a later
        // connection from the same port to this registration.
        self.cancel_all();
    }
}
