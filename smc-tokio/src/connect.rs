//! One client connection's establishment, start to finish.
//!
//! ```text
//! policy TcpOnly ─────────────────────────────────────────────▶ plain connect (Disabled)
//! a door at the destination (same host, trusted owner)?
//!   yes: bind, register the socket at the door, connect, wait for the verdict
//!        answered ──▶ CLC on the door (Accept ▶ Confirm ▶ Commit) ──▶ SMC or TCP in step
//!        refused / every door said no / closed / no answer in time ──▶ TCP (nothing was sent)
//!   no:  an in-band peer (or Policy::Always/Never)?
//!        yes: connect, CLC in-band ──▶ SMC or TCP in step; a plain server ──▶ reconnect plain
//!        no:  plain connect (NotProposed): the server never sees a byte of ours
//! ```
//!
//! Deadlines count from when the server could have answered: the verdict wait starts once the
//! TCP connect completed, and each handshake step's bound starts when our previous message
//! went out (`proto::handshake::Timeouts`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::config::{Policy, Settings};
use crate::context::Context;
use crate::door::{self, Registered, Unregistered};
use crate::error::SmcError;
use crate::faults::{self, Point};
use crate::handshake::{Channel, Established, Step, Wire};
use crate::proto::clc::{ClcMessage, DeclineReason, LinkInfo, Proposal};
use crate::proto::handshake::{ClientEvent, ClientHandshake, HandshakeError, Outcome, Side, Timeouts};
use crate::smc::conn::PendingConn;
use crate::stats::{self, DoorEvent};
use crate::sys;
use crate::transport::{FallbackReason, Transport};

/// One client handshake's place under `max_pending_handshakes`, among the context's.
struct ClientSlot<'a>(&'a Context);

impl ClientSlot<'_> {
    /// A place, or `None` when the builder turned `limit_handshake` on and all places are
    /// taken. (The context's `limit_handshake` governs listeners, as the kernel's
    /// `SMC_LIMIT_HS` does; a client opts in per builder.)
    fn take<'a>(ctx: &'a Context, limit: bool, cfg: &Settings) -> Option<ClientSlot<'a>> {
        let n = ctx.client_handshakes().fetch_add(1, Ordering::AcqRel);
        if limit && n >= cfg.max_pending_handshakes {
            ctx.client_handshakes().fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ClientSlot(ctx))
    }
}

impl Drop for ClientSlot<'_> {
    fn drop(&mut self) {
        self.0.client_handshakes().fetch_sub(1, Ordering::AcqRel);
    }
}

/// Connects with `addr` with SMC settings `cfg` (`limit`: the builder turned
/// `limit_handshake` on).
/// `user`: the socket the application made ([`SmcSocket`](crate::SmcSocket)), connected in
/// place of one of ours: bound where the application bound it, with its options.
pub(crate) async fn establish(
    ctx: &Context,
    addr: SocketAddr,
    cfg: &Settings,
    limit: bool,
    mut user: Option<socket2::Socket>,
) -> io::Result<Established> {
    let user = &mut user;
    if cfg.policy == Policy::TcpOnly {
        return plain(ctx, cfg, addr, FallbackReason::Disabled, user, false).await;
    }
    let Some(slot) = ClientSlot::take(ctx, limit, cfg) else {
        // Too many client handshakes in flight: this one goes plain at once.
        let kernel = kernel_socket(ctx, cfg, addr, user);
        return plain(
            ctx,
            cfg,
            addr,
            FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local },
            user,
            kernel,
        )
        .await;
    };
    // A server that failed an in-band handshake, or whose SMC connections keep ending too
    // soon to pay off (adaptive fallback), is left alone for a while.
    let asker = crate::negative_cache::Asker { ttl: cfg.negative_cache_ttl, adaptive: cfg.adaptive_min_bytes > 0 };
    if ctx.negative_cache().contains(addr, Instant::now(), asker) {
        drop(slot);
        let kernel = kernel_socket(ctx, cfg, addr, user);
        return plain(ctx, cfg, addr, FallbackReason::NegativeCache, user, kernel).await;
    }
    // Held for the handshake's own steps only: every TCP connect made without a handshake
    // (plain, or a door's decline) or before it (in-band, or a door's) lets it go first. Such a connect may
    // wait out SYN retransmissions (a host that is down, a server whose accept queue is full:
    // minutes), which are no handshake, and a place held meanwhile sent every other
    // connection of the process to TCP as congested.
    let mut slot = Some(slot);
    // The verbs library is loaded before the connection exists, off the runtime. The RDMA
    // look-ups of this connect wait for the setup thread until one handshake bound from now,
    // in all.
    let look_up_by = tokio::time::Instant::now() + cfg.handshake_timeout;
    #[cfg(feature = "rdma")]
    crate::smc::rdma::warm_up(cfg, look_up_by).await;
    if let Some(s) = via_door(ctx, addr, cfg, user, look_up_by, (limit, &mut slot)).await? {
        return Ok(s);
    }
    // No door. What follows holds no place: a plain connect, or an in-band handshake, which
    // takes one again once connected (nor while the first connection to the server sets up its
    // link group: that one may be waiting for its own SYN's answer).
    drop(slot);
    // Through the kernel's AF_SMC socket, where wanted, a kernel-SMC server gets SMC from the
    // kernel; for any other server the kernel falls back and we go on as over TCP.
    let kernel = kernel_socket(ctx, cfg, addr, user);
    let inband = cfg.policy.proposes_everywhere() || cfg.inband_peers.contains(addr.ip());
    if !inband {
        // Nothing this side could offer here is switched on (shared memory off, and RDMA off
        // or not built): said as "disabled", not as "no listener", which was never looked for.
        let offers = cfg.shm.enabled || cfg!(feature = "rdma") && cfg.rdma.enabled;
        let why = if offers { FallbackReason::NotProposed } else { FallbackReason::Disabled };
        return plain(ctx, cfg, addr, why, user, kernel).await;
    }
    // Connections opened together to a server we have no link group with wait for the first
    // one's, then share it (before connecting: the server peeks for the Proposal only briefly).
    #[cfg(feature = "rdma")]
    let first = crate::smc::rdma::first_contact(ctx.manager(), addr, cfg).await;
    // The application's options, for a plain reconnection should this connection be spoiled.
    let options = user.as_ref().map(sys::ClientOptions::of);
    let mut tcp = tcp_connect(addr, user.take()).await?;
    if kernel {
        let t = crate::kernel::transport(ctx.counters(), tcp.as_fd(), Transport::Tcp(FallbackReason::NotProposed));
        if t.settled_by_kernel() {
            return Ok(Established::tcp(tcp, t));
        }
    }
    let Some(_slot) = ClientSlot::take(ctx, limit, cfg) else {
        let congested = FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local };
        return tcp_or_refuse(cfg, tcp, congested);
    };
    let local_ip = tcp.local_addr()?.ip();
    // The port lookup for our address (GID tables, sysfs) runs off the runtime, once.
    #[cfg(feature = "rdma")]
    crate::smc::rdma::warm_port(local_ip, cfg, look_up_by).await;
    let prep = Prepared::new(ctx, addr, local_ip, cfg, false)?;
    // An in-band server is given one bound per step: a plain server that waits for its
    // client never answers.
    let timeouts = Timeouts::uniform(cfg.handshake_timeout);
    let (outcome, conn, _) = run(ctx, Channel::<door::ClientWire>::Tcp(&mut tcp), prep, addr, cfg, timeouts).await;
    #[cfg(feature = "rdma")]
    if let Some(first) = first {
        first.settle(cfg.handshake_timeout).await;
    }
    finish_inband(ctx, cfg, addr, (tcp, options), outcome, conn).await
}

/// Puts the kernel's `AF_SMC` socket in `user` when the settings want one and the application
/// gave no socket of its own; whether it did.
fn kernel_socket(ctx: &Context, cfg: &Settings, addr: SocketAddr, user: &mut Option<socket2::Socket>) -> bool {
    if user.is_some() || cfg.policy == Policy::TcpOnly {
        return false;
    }
    *user = crate::kernel::socket(ctx.counters(), cfg.kernel, addr);
    user.is_some()
}

/// A plain TCP connection (or, under [`Policy::Never`], the error that SMC was refused). With
/// `kernel`, `user` holds the kernel's `AF_SMC` socket (from [`kernel_socket`]): then the
/// kernel's SMC, if the server speaks it.
async fn plain(
    ctx: &Context,
    cfg: &Settings,
    addr: SocketAddr,
    reason: FallbackReason,
    user: &mut Option<socket2::Socket>,
    kernel: bool,
) -> io::Result<Established> {
    if cfg.policy == Policy::Never && !kernel {
        return Err(SmcError::FallbackRefused(reason).into());
    }
    let tcp = tcp_connect(addr, user.take()).await?;
    let t = if kernel {
        crate::kernel::transport(ctx.counters(), tcp.as_fd(), Transport::Tcp(reason))
    } else {
        Transport::Tcp(reason)
    };
    if cfg.policy == Policy::Never && !t.is_smc() {
        return Err(SmcError::FallbackRefused(t.fallback_reason().unwrap_or(reason)).into());
    }
    Ok(Established::tcp(tcp, t))
}

/// A TCP connect from the application's socket, if it gave one, else from a new one.
async fn tcp_connect(addr: SocketAddr, user: Option<socket2::Socket>) -> io::Result<TcpStream> {
    match user {
        Some(sock) => tokio::net::TcpSocket::from_std_stream(sock.into()).connect(addr).await,
        None => TcpStream::connect(addr).await,
    }
}

fn tcp_or_refuse(cfg: &Settings, tcp: TcpStream, reason: FallbackReason) -> io::Result<Established> {
    if cfg.policy == Policy::Never {
        return Err(SmcError::FallbackRefused(reason).into());
    }
    Ok(Established::tcp(tcp, Transport::Tcp(reason)))
}

/// Times a port this client picked is found taken at connect (its last connection's 4-tuple
/// still in TIME_WAIT) before it connects without registering.
const PORT_ATTEMPTS: usize = 4;

/// The same-host path: the whole handshake on the door, none of it on the TCP stream. `None`:
/// the destination has no door we trust; nothing was sent. `slot`, the connect's handshake
/// place (`limit`: the builder limits them), is let go before a plain connect, and while the
/// connection is made and another's first contact awaited; the handshake takes one again once
/// connected.
async fn via_door<'c>(
    ctx: &'c Context,
    addr: SocketAddr,
    cfg: &Settings,
    user: &mut Option<socket2::Socket>,
    look_up_by: tokio::time::Instant,
    (limit, slot): (bool, &mut Option<ClientSlot<'c>>),
) -> io::Result<Option<Established>> {
    #[cfg(not(feature = "rdma"))]
    let _ = look_up_by;
    let offers = cfg.shm.enabled || cfg!(feature = "rdma") && cfg.rdma.enabled;
    if !offers {
        return Ok(None);
    }
    let manager = ctx.manager();
    #[cfg(feature = "rdma")]
    let mut first = None;
    for attempt in 0.. {
        // Doors are looked for before anything is made for them: most destinations have none.
        let found = find_room(ctx, addr, cfg).await;
        if let Some(why) = found.none() {
            return unregistered(ctx, cfg, addr, user, why, slot).await;
        }
        #[cfg(feature = "rdma")]
        if attempt == 0 {
            // The port lookup for the address (GID tables, sysfs) runs off the runtime, once.
            crate::smc::rdma::warm_port(addr.ip(), cfg, look_up_by).await;
            // The first connection may be waiting for its SYN's answer: no place held here.
            *slot = None;
            first = crate::smc::rdma::first_contact(manager, addr, cfg).await;
        }
        // The Proposal is made before the connection exists: nothing in it depends on the
        // connection (a same-host connection's local address is the destination's).
        let prep = Prepared::new(ctx, addr, addr.ip(), cfg, true)?;
        let (reg, sock) = match door::register(found, addr, manager.instance(), &prep.bytes, user).await {
            Registered::Yes(reg, sock) => (reg, sock),
            Registered::No(why) => return unregistered(ctx, cfg, addr, user, why, slot).await,
        };
        ctx.counters().door(DoorEvent::Registered);
        let from_user = reg.is_users();
        // The connect waits out SYN retransmissions where the listener's queue is full (an
        // application that does not accept): no handshake, and no place held meanwhile.
        *slot = None;
        let tcp = match tokio::net::TcpSocket::from_std_stream(sock.into()).connect(addr).await {
            Ok(t) => t,
            // The application's socket cannot be bound again: its error is the caller's, as
            // tokio's connect from that socket would report it.
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) && attempt + 1 < PORT_ATTEMPTS && !from_user => {
                drop(reg);
                continue;
            }
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) && !from_user => {
                drop(reg);
                tracing::debug!("no free port to register: connecting as plain tcp");
                let reason = FallbackReason::Declined { reason: DeclineReason::OutOfMemory, by: Side::Local };
                return plain(ctx, cfg, addr, reason, user, false).await.map(Some);
            }
            Err(e) => return Err(e),
        };
        // The handshake takes a place again; with none free the connection stays TCP (the
        // registration cancelled as it goes).
        match ClientSlot::take(ctx, limit, cfg) {
            Some(s) => *slot = Some(s),
            None => {
                drop(reg);
                let congested = FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local };
                return tcp_or_refuse(cfg, tcp, congested).map(Some);
            }
        }
        // Our own address, told to the listener: learned once per destination address (an
        // application's socket may be bound to any of the host's addresses: asked each time).
        let known = if from_user { None } else { sys::known_source(addr.ip()) };
        let local = match known {
            Some(ip) => Some(SocketAddr::new(ip, reg.port())),
            None => tcp.local_addr().ok().inspect(|l| {
                if !from_user {
                    sys::learn_source(addr.ip(), l.ip());
                }
            }),
        };
        let connected = local.map(|local| (local, addr));
        let mut wire = reg.into_wire(prep.proposal.secret, connected);
        // The listener answers when it accepts the connection: microseconds when it runs, later
        // when it is busy or stopped, or when its accept queue overflowed (the kernel then
        // drops our final ACK and takes the connection at its SYN-ACK retransmit, 1 s later;
        // a plain client's first data would nudge it sooner, and we send none). Past the
        // handshake timeout we stop waiting and stay on TCP: overload is never an error.
        let timeouts = Timeouts { peer: cfg.handshake_timeout, local: cfg.handshake_timeout };
        let (outcome, conn, confirmed) = run(ctx, Channel::Wire(&mut wire), prep, addr, cfg, timeouts).await;
        let answered = wire.answered();
        if matches!(outcome, Ok(Outcome::Smc { .. } | Outcome::Fallback { .. })) {
            wire.settled();
        }
        if known.is_some() && !matches!(outcome, Ok(Outcome::Smc { .. })) {
            // The address we told may be what failed it: the next connection asks the kernel.
            sys::forget_source(addr.ip());
        }
        // Anything still open is cancelled.
        drop(wire);
        #[cfg(feature = "rdma")]
        if let Some(first) = first {
            first.settle(cfg.handshake_timeout).await;
        }
        return finish_door(ctx, cfg, tcp, outcome, conn, confirmed, answered).map(Some);
    }
    unreachable!("the loop returns")
}

/// A connection that no door took: plain TCP (its handshake place let go first), or nothing
/// done yet when there was no door.
async fn unregistered(
    ctx: &Context,
    cfg: &Settings,
    addr: SocketAddr,
    user: &mut Option<socket2::Socket>,
    why: Unregistered,
    slot: &mut Option<ClientSlot<'_>>,
) -> io::Result<Option<Established>> {
    let reason = match why {
        Unregistered::NoDoor => return Ok(None),
        // No descriptor (or memory) to look for doors or register: plain TCP, said as what it
        // is rather than "no listener".
        Unregistered::Starved => DeclineReason::OutOfMemory,
        // The listener is swamped: plain TCP now, as its own congestion decline would.
        Unregistered::Busy => DeclineReason::HandshakeCongested,
    };
    let reason = FallbackReason::Declined { reason, by: Side::Local };
    *slot = None;
    plain(ctx, cfg, addr, reason, user, false).await.map(Some)
}

/// The doors for `addr`, with a registration slot at each. When this runtime's door
/// connections to one carry all the registrations they may, waits in line (first come, first
/// served) for one to end, before anything is connected: the connection waits here rather
/// than in the listener's SYN queue. It waits while the line moves, up to its handshake
/// timeout ([`door::Room::wait`]); past that, nothing is found (busy).
async fn find_room(ctx: &Context, addr: SocketAddr, cfg: &Settings) -> door::Lookup {
    let deadline = tokio::time::Instant::now() + cfg.handshake_timeout;
    let mut reserved = None;
    loop {
        let found = door::find_doors(ctx.doors(), ctx.counters(), addr, &cfg.shm.allowed_uids, reserved.take());
        let Some(room) = found.room() else { return found };
        match room.wait(deadline).await {
            Some(place) => reserved = Some(place),
            None => return found,
        }
    }
}

/// A Proposal, and what it offered.
struct Prepared {
    proposal: Proposal,
    bytes: Vec<u8>,
    shm_rmb: Option<u32>,
    rmb_size: u32,
    /// The link group the proposal names, kept from idling out meanwhile.
    _pin: Option<crate::smc::group::GroupPin>,
    offered: Offered,
}

impl Prepared {
    /// What this client proposes to `addr`, its connection coming from `local_ip`; shared
    /// memory only to a listener found at its door (`same_host`).
    fn new(
        ctx: &Context,
        addr: SocketAddr,
        local_ip: std::net::IpAddr,
        cfg: &Settings,
        same_host: bool,
    ) -> io::Result<Prepared> {
        let shm = if same_host { ctx.manager().client_offer(addr, &cfg.shm) } else { None };
        let (shm_offer, shm_rmb, pin) = match shm {
            Some((o, rmb, pin)) => (Some(o), Some(rmb), pin),
            None => (None, None, None),
        };
        #[cfg(feature = "rdma")]
        let rdma =
            crate::smc::rdma::client_offer(ctx.manager(), addr, local_ip, shm_rmb.unwrap_or(cfg.shm.rmb_size), cfg);
        #[cfg(not(feature = "rdma"))]
        let rdma = {
            let _ = local_ip;
            None
        };
        let offered = Offered {
            #[cfg(feature = "rdma")]
            rdma: rdma.is_some(),
            #[cfg(feature = "rdma")]
            local_ip,
        };
        let rmb_size = match (shm_rmb, &rdma) {
            (Some(r), _) => r,
            (None, Some(_)) => cfg.shm.rmb_size,
            _ => 0,
        };
        let proposal = Proposal { secret: sys::random_secret()?, rmb_size, shm: shm_offer, rdma };
        let bytes = ClcMessage::Proposal(proposal.clone())
            .encode()
            .map_err(|e| io::Error::from(SmcError::Handshake(HandshakeError::Malformed(e))))?;
        Ok(Prepared { proposal, bytes, shm_rmb, rmb_size, _pin: pin, offered })
    }
}

/// Runs the client's handshake over `chan` to its outcome: the outcome, the connection set up
/// for SMC (if it came to that), and whether we confirmed.
async fn run<W: Wire>(
    ctx: &Context,
    mut chan: Channel<'_, W>,
    prep: Prepared,
    addr: SocketAddr,
    cfg: &Settings,
    timeouts: Timeouts,
) -> (io::Result<Outcome>, PendingConn, bool) {
    let timer = stats::HandshakeTimer::start(ctx.counters());
    let mut hs = if matches!(chan, Channel::Wire(_)) {
        // The Proposal went with the registration.
        ClientHandshake::after_proposal(prep.proposal.secret, Instant::now(), timeouts)
    } else {
        match ClientHandshake::new(prep.proposal.clone(), Instant::now(), timeouts) {
            Ok(h) => h,
            Err(e) => return (Err(SmcError::Handshake(e).into()), PendingConn::default(), false),
        }
    };
    // Given back if the connect is dropped (cancelled) or ends without SMC.
    let mut pending = PendingConn::default();
    faults::stall(addr, Point::ClientBeforeHandshake).await;
    let outcome = loop {
        match chan.advance(&mut hs).await {
            Ok(Step::Event(ClientEvent::Accepted(accept))) => {
                let server = chan.peer_process();
                accepted(ctx, &mut hs, &accept, &mut pending, (addr, server), &prep, cfg).await;
            }
            Ok(Step::Done(o)) => break Ok(o),
            Err(e) => break Err(e),
        }
    };
    timer.end(&outcome);
    if let Ok(Outcome::Fallback { reason, by }) = &outcome {
        ctx.counters().decline(*reason, *by);
    }
    let conn = match &outcome {
        // Held by the guard until a stream takes it: a connect dropped before that (a settle
        // below it waits) aborts it.
        Ok(Outcome::Smc { .. }) => {
            pending.committed();
            std::mem::take(&mut pending)
        }
        // The server's final word: it did not commit, and will not write.
        Ok(Outcome::Fallback { .. }) => {
            pending.peer_will_not_write();
            PendingConn::default()
        }
        // Anything else: the connection goes with `pending`, as far as the handshake got.
        _ => PendingConn::default(),
    };
    (outcome, conn, hs.has_confirmed())
}

/// What this client offered besides shared memory, for checking the server's Accept.
struct Offered {
    #[cfg(feature = "rdma")]
    rdma: bool,
    #[cfg(feature = "rdma")]
    local_ip: std::net::IpAddr,
}

/// The client's decision on the server's Accept: set our end of the link up and confirm, or
/// decline.
async fn accepted(
    ctx: &Context,
    hs: &mut ClientHandshake,
    accept: &crate::proto::clc::Accept,
    pending: &mut PendingConn,
    (addr, server): (SocketAddr, Option<crate::sys::PeerCred>),
    prep: &Prepared,
    cfg: &Settings,
) {
    let manager = ctx.manager();
    let (secret, rmb_size, offered) = (prep.proposal.secret, prep.rmb_size, &prep.offered);
    match &accept.link {
        LinkInfo::Shm(info) if prep.shm_rmb.is_some() => {
            // Shared memory is offered only at a door, whose owner is known once it answered.
            let Some(owner) = server else {
                hs.decline(DeclineReason::SyncError, Instant::now());
                return;
            };
            let left = hs.poll_timeout().map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
            match manager.client_conn_create((addr, owner), secret, info, rmb_size, &cfg.shm, left).await {
                Ok((conn, confirm)) => {
                    pending.set(conn);
                    faults::stall(addr, Point::ClientBeforeConfirm).await;
                    hs.confirm(LinkInfo::Shm(confirm), Instant::now());
                    pending.peer_may_write();
                }
                Err(reason) => {
                    tracing::debug!(%reason, "declining the server's shm accept");
                    hs.decline(reason, Instant::now());
                }
            }
        }
        #[cfg(feature = "rdma")]
        LinkInfo::Rdma(info) if offered.rdma => {
            // Setup waits for its turn on the process's setup thread within what is left of
            // the handshake's bound: past it, the step never runs and the connection goes on
            // as TCP.
            let left = hs.poll_timeout().map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
            let bounds = (cfg.handshake_timeout, tokio::time::Instant::now() + left);
            match crate::smc::rdma::client_conn_create(manager, addr, offered.local_ip, info, rmb_size, cfg, bounds)
                .await
            {
                Ok((conn, confirm)) => {
                    pending.adopt(conn);
                    hs.confirm(LinkInfo::Rdma(confirm), Instant::now());
                    pending.peer_may_write();
                }
                Err(reason) => {
                    tracing::debug!(%reason, "declining the server's rdma accept");
                    hs.decline(reason, Instant::now());
                }
            }
        }
        other => {
            // A transport this client did not offer: a confused or hostile server. Decline,
            // and stay on TCP in step.
            let _ = offered;
            tracing::debug!(link = ?other, "declining an accept for a transport we did not offer");
            hs.decline(DeclineReason::NoCommonTransport, Instant::now());
        }
    }
}

/// The end of a same-host handshake. The TCP stream carried none of it, so the connection is
/// TCP wherever it is not SMC, except after our Confirm, where only the server's final word can
/// settle it (it always sends one before it closes the door).
fn finish_door(
    ctx: &Context,
    cfg: &Settings,
    tcp: TcpStream,
    outcome: io::Result<Outcome>,
    conn: PendingConn,
    confirmed: bool,
    answered: bool,
) -> io::Result<Established> {
    let reason = match outcome {
        Ok(Outcome::Smc { .. }) => return smc_stream(tcp, conn),
        Ok(Outcome::Fallback { reason, by }) => {
            tracing::debug!(%reason, ?by, "falling back to tcp");
            FallbackReason::Declined { reason, by }
        }
        // No answer in time: we stop waiting (overload is not refusal).
        Ok(Outcome::Failed(HandshakeError::Timeout)) if !answered => {
            ctx.counters().door(DoorEvent::TimedOut);
            FallbackReason::Declined { reason: DeclineReason::Timeout, by: Side::Local }
        }
        // The door closed: the listener went away (or refused our uid) without a final word.
        Ok(Outcome::Failed(HandshakeError::Eof)) => FallbackReason::PeerNoSmc,
        Ok(Outcome::Failed(e)) if !confirmed => {
            tracing::debug!(error = %e, "the door's answer made no sense: staying on tcp");
            FallbackReason::Declined { reason: DeclineReason::SyncError, by: Side::Local }
        }
        // Our message was never sent (a door message goes whole or not at all): if it was our
        // Confirm, the server, which commits only on one, cannot have committed, so TCP is
        // right also after we confirmed. No room in time: the listener is swamped; the door
        // closed: the listener went away (its final word, if any, said no more than TCP). Our
        // own end gone (its sender went with its runtime) reads as a closed door too: it
        // happens only as the runtime, and this connect with it, goes away.
        Err(e) if door::NotSent::is(&e) => {
            tracing::debug!(error = %e, "our answer did not go out on the door: staying on tcp");
            match e.kind() {
                io::ErrorKind::WouldBlock => {
                    FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local }
                }
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => FallbackReason::PeerNoSmc,
                _ => FallbackReason::Declined { reason: DeclineReason::Internal, by: Side::Local },
            }
        }
        Err(e) if !confirmed => {
            tracing::debug!(error = %e, "the door failed: staying on tcp");
            FallbackReason::Declined { reason: DeclineReason::Internal, by: Side::Local }
        }
        // After our Confirm the server may have committed: we cannot tell, so the connection
        // fails rather than guess.
        Ok(Outcome::Failed(e)) => return Err(SmcError::Handshake(e).into()),
        Err(e) => return Err(e),
    };
    tcp_or_refuse(cfg, tcp, reason)
}

fn smc_stream(tcp: TcpStream, mut conn: PendingConn) -> io::Result<Established> {
    // The machine agreed on a link we have no connection for: cannot happen, since confirm()
    // is only called with one; fail loudly rather than pretend.
    let conn = conn.take().ok_or_else(|| io::Error::other("handshake agreed on a link without a connection"))?;
    let t = conn.transport();
    Ok(Established::smc(tcp, conn, t))
}

/// How long a server whose handshake timed out is left alone at first (doubling on each further
/// timeout, up to the negative cache's TTL): a busy SMC server is retried soon, a silent plain
/// one less and less often.
const TIMEOUT_BACKOFF: Duration = Duration::from_secs(2);

/// The end of an in-band handshake, where the server may not speak SMC at all: `tcp` and, for
/// a socket of the application's, its options, which a plain reconnection keeps.
async fn finish_inband(
    ctx: &Context,
    cfg: &Settings,
    addr: SocketAddr,
    (tcp, options): (TcpStream, Option<sys::ClientOptions>),
    outcome: io::Result<Outcome>,
    conn: PendingConn,
) -> io::Result<Established> {
    if matches!(outcome, Ok(Outcome::Smc { .. } | Outcome::Fallback { .. })) {
        ctx.negative_cache().answered(addr);
    }
    let err = match outcome {
        Ok(Outcome::Smc { .. }) => return smc_stream(tcp, conn),
        Ok(Outcome::Fallback { reason, by }) => {
            tracing::debug!(%reason, ?by, "falling back to tcp");
            return tcp_or_refuse(cfg, tcp, FallbackReason::Declined { reason, by });
        }
        Ok(Outcome::Failed(e)) => io::Error::from(SmcError::Handshake(e)),
        Err(e) => e,
    };
    // The server is not ours (or misbehaved) and the stream is unusable: remember it and,
    // unless the policy requires SMC, connect again as plain TCP.
    drop(tcp);
    let timed_out = SmcError::from_io(&err) == Some(&SmcError::Handshake(HandshakeError::Timeout));
    let cache = ctx.negative_cache();
    if timed_out {
        // Silent: a plain server waiting for its client, or an SMC server too busy to answer.
        cache.insert_backoff(addr, Instant::now(), TIMEOUT_BACKOFF, cfg.negative_cache_ttl);
    } else {
        cache.insert(addr, Instant::now(), cfg.negative_cache_ttl);
    }
    tracing::debug!(%err, timed_out, "in-band peer did not complete the handshake; connecting as plain tcp");
    if cfg.policy == Policy::Never {
        return Err(err);
    }
    // On a socket of the application's, a new one with its options.
    let tcp = match options {
        Some(o) => tokio::net::TcpSocket::from_std_stream(o.socket(addr)?.into()).connect(addr).await?,
        None => TcpStream::connect(addr).await?,
    };
    Ok(Established::tcp(tcp, Transport::Tcp(FallbackReason::PeerNoSmc)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{SmcListener, SmcStream};
    use crate::sys;
    use crate::transport::Transport;
    use std::net::{IpAddr, SocketAddr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The commit point is the server's receipt of our Confirm: a door message of ours that did
    /// not go out (a door message goes whole or not at all; `ClientWire` marks it, see
    /// `a_client_message_that_did_not_go_out_says_so`) leaves the connection TCP, also after we
    /// confirmed, whatever stopped it (`OutOfMemory` stands for any other failed send). What
    /// fails after a Confirm that went out still fails it: the server may have committed.
    #[tokio::test]
    async fn a_confirm_that_did_not_go_out_leaves_the_connection_tcp() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ctx = Context::new();
        let cfg = Settings::default();
        let kinds = [
            (
                io::ErrorKind::WouldBlock,
                FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local },
            ),
            (io::ErrorKind::BrokenPipe, FallbackReason::PeerNoSmc),
            (io::ErrorKind::ConnectionReset, FallbackReason::PeerNoSmc),
            (io::ErrorKind::OutOfMemory, FallbackReason::Declined { reason: DeclineReason::Internal, by: Side::Local }),
        ];
        for (kind, why) in kinds {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let not_sent = crate::door::NotSent::wrap(kind.into());
            match finish_door(&ctx, &cfg, tcp, Err(not_sent), PendingConn::default(), true, true) {
                Ok(Established::Tcp { transport, .. }) => assert_eq!(transport, Transport::Tcp(why), "{kind:?}"),
                other => panic!("{kind:?}: {other:?}"),
            }
        }
        for kind in [io::ErrorKind::BrokenPipe, io::ErrorKind::OutOfMemory] {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let after = finish_door(&ctx, &cfg, tcp, Err(kind.into()), PendingConn::default(), true, true);
            assert_eq!(after.map(|_| ()).map_err(|e| e.kind()), Err(kind), "a failure after the Confirm went out");
        }
    }

    /// The source address learned for a destination in 127/8 is the kernel's (127.0.0.1), and
    /// connections that use it get shared memory. A connection that tells a wrong one loses
    /// nothing: the listener matches it at accept by the kernel's record, or declines it
    /// (then it stays TCP and the address is asked again).
    #[tokio::test]
    async fn the_learned_source_is_the_kernels_and_a_wrong_one_loses_nothing() {
        // An address no other test connects to: the learned sources are process-wide.
        let dst: IpAddr = "127.0.0.77".parse().unwrap();
        let listener = SmcListener::bind(SocketAddr::new(dst, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        crate::testing::spawn_echo_of_five(listener);
        let round = || async move {
            let mut c = SmcStream::connect(addr).await.unwrap();
            c.write_all(b"hello").await.unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"hello");
            c.transport()
        };
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        sys::forget_source(dst);
        assert_eq!(round().await, Transport::SmcD);
        assert_eq!(sys::known_source(dst), Some(loopback));
        for _ in 0..5 {
            assert_eq!(round().await, Transport::SmcD, "with the learned source");
        }
        let wrong: IpAddr = "127.0.0.9".parse().unwrap();
        for _ in 0..5 {
            sys::learn_source(dst, wrong);
            match round().await {
                Transport::SmcD => assert_eq!(sys::known_source(dst), Some(wrong)),
                t => {
                    assert!(!t.is_smc());
                    assert_eq!(sys::known_source(dst), None, "a declined connection's source is kept");
                }
            }
        }
        sys::forget_source(dst);
        assert_eq!(round().await, Transport::SmcD);
        assert_eq!(sys::known_source(dst), Some(loopback));
    }
}
