//! One accepted connection's life until the application gets it.
//!
//! ```text
//! accepted ─▶ registered at the door (a same-host SMC client)?
//!   yes ─▶ a handshake slot?
//!            yes: handshake task: CLC on the door connection ─▶ SMC, or TCP in step
//!            no (limit_handshake): "refused" on the door ─▶ TCP now
//!   no  ─▶ could it be SMC-R (a listener with an RDMA device, a client on another host)?
//!            yes: task: wait up to the peek timeout for a Proposal ─▶ handshake, or TCP
//!            no:  TCP now
//! ```
//!
//! Every TCP stream a client might still send a Proposal to (a plain client could be an
//! in-band one whose door registration was impossible; a handshake that stopped waiting) is
//! handed out with an [`InbandGuard`](crate::net::inband), which answers a late Proposal with
//! a Decline instead of passing it to the application.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tracing::Instrument;

use crate::config::{Overrides, Policy, Settings};
use crate::context::Context;
use crate::door::{ClientIdentity, Door, EarlyKey, Matched, Registration, ServerWire, Verified};
use crate::handshake::{Channel, Established, Owed, Step};
use crate::proto::clc::{eyecatcher_prefix_matches, DeclineReason, LinkInfo, Proposal, CLC_MAX_LEN};
use crate::proto::handshake::{Outcome, ServerEvent, ServerHandshake, Side, Timeouts};
use crate::smc::conn::PendingConn;
use crate::smc::group::MarkPoll;
use crate::smc::shm::SideListener;
use crate::stats::{self, DoorEvent};
use crate::transport::{FallbackReason, Transport};

/// What becomes of an accepted connection.
// A return value, moved once into the ready queue: boxing the stream would cost an
// allocation per accepted connection to save a copy of a couple hundred bytes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Handoff {
    /// Ready for the application now.
    Now(Established),
    /// A task finishes it (and queues it for `accept`), or it was closed.
    Later,
}

/// What a stray in-band Proposal on a plain connection is answered with: this listener cannot
/// take one there (shared memory needs the door; RDMA needs a device and a peek).
const UNSOLICITED: Owed = Owed::Proposal(DeclineReason::NoCommonTransport);

/// Decides what an accepted connection is (see the module documentation). Never waits.
pub(crate) fn admit(shared: &Arc<ListenerShared>, tcp: TcpStream, peer: SocketAddr) -> Handoff {
    let cfg = shared.settings();
    let local = shared.fixed_local.or_else(|| tcp.local_addr().ok());
    // Only a client on this host can have registered at the door (its name is in this network
    // namespace, and such a client connects from one of this host's addresses, known as such
    // from the moment it was assigned, `is_local_addr`): a look-up for any other would look at
    // every door connection for nothing, on each connection another host opens.
    let matched = match (&shared.door, local) {
        (Some(door), Some(local)) if peer.ip() == local.ip() || crate::sys::is_local_addr(peer) => {
            door.lookup(peer, local, tcp.as_fd())
        }
        _ => None,
    };
    let reg = match matched {
        // Answered before it arrived: its handshake (or what came of it) takes it.
        Some(Matched::Early(tx)) => match tx.send((tcp, peer)) {
            Ok(()) => return Handoff::Later,
            // Its handshake gave up on it: plain TCP, as its client knows.
            Err((tcp, _)) => return hand_out(&shared.ctx, &cfg, tcp, Transport::Tcp(FallbackReason::PeerNoSmc), None),
        },
        Some(Matched::Handshake(r)) => Some(r),
        None => None,
    };
    if cfg.policy == Policy::TcpOnly {
        // SMC was turned off after the door opened (a process-wide setting): a client that
        // registered hears so at once instead of waiting for an answer.
        if let Some(reg) = reg {
            reg.refuse(DeclineReason::PeerNoSmc);
        }
        return hand_out(&shared.ctx, &cfg, tcp, Transport::Tcp(FallbackReason::Disabled), Some(UNSOLICITED));
    }
    if let Some(reg) = reg {
        return registered(shared, cfg, tcp, (local, peer), reg);
    }
    // On the kernel's AF_SMC socket, the kernel has finished its own handshake by now: a
    // kernel-SMC client is the kernel's (no peek, no in-band guard); any other stays ours.
    let plain = if shared.kernel {
        let t = crate::kernel::transport(shared.ctx.counters(), tcp.as_fd(), Transport::Tcp(FallbackReason::PeerNoSmc));
        if t.settled_by_kernel() {
            return hand_out(&shared.ctx, &cfg, tcp, t, None);
        }
        t
    } else {
        Transport::Tcp(FallbackReason::PeerNoSmc)
    };
    if may_be_smc_r(&cfg, local, peer) {
        return peek_or_tcp(shared, tcp, (local, peer), cfg, plain);
    }
    hand_out(&shared.ctx, &cfg, tcp, plain, Some(UNSOLICITED))
}

/// A connection that may be an in-band SMC-R client's: its first bytes are looked at (up to
/// the peek timeout, in a task) where a place among those looked at is free, of its host's
/// share and in all; else it is TCP (`plain`) at once, as at a listener that peeks at nothing,
/// its in-band guard answering a Proposal as congested.
fn peek_or_tcp(
    shared: &Arc<ListenerShared>,
    tcp: TcpStream,
    addrs: (Option<SocketAddr>, SocketAddr),
    cfg: Settings,
    plain: Transport,
) -> Handoff {
    match shared.peek_slot(addrs.1.ip()) {
        Some(peeking) => {
            spawn(shared, tcp, addrs, cfg, Start::Peek(peeking), None);
            Handoff::Later
        }
        None => {
            let congested = Owed::Proposal(DeclineReason::HandshakeCongested);
            hand_out(&shared.ctx, &cfg, tcp, plain, Some(congested))
        }
    }
}

/// A TCP stream for the application, or nothing under [`Policy::Never`].
fn hand_out(ctx: &Context, cfg: &Settings, tcp: TcpStream, t: Transport, owed: Option<Owed>) -> Handoff {
    if cfg.policy == Policy::Never {
        tracing::debug!(transport = %t, "closing: policy requires smc");
        return Handoff::Later;
    }
    ctx.counters().connection(true, t);
    Handoff::Now(Established::Tcp { tcp, transport: t, owed })
}

/// A connection its client registered at our door: it waits for our verdict.
fn registered(
    shared: &Arc<ListenerShared>,
    cfg: Settings,
    tcp: TcpStream,
    addrs: (Option<SocketAddr>, SocketAddr),
    reg: Registration,
) -> Handoff {
    let peer = addrs.1;
    match shared.admit(&cfg) {
        Admit::Now(slot) => start_registered(shared, cfg, tcp, addrs, reg, slot),
        Admit::Queue(ticket) => {
            let shared2 = shared.clone();
            spawn_task(shared, async move {
                let Some(slot) = ticket.slot(&cfg).await else {
                    // The listener closed: the connection is reset with it, as the kernel
                    // resets those left in a closed listener's queue.
                    reg.refuse(DeclineReason::HandshakeCongested);
                    crate::handshake::reset_tcp(tcp);
                    return;
                };
                if let Handoff::Now(s) = start_registered(&shared2, cfg, tcp, addrs, reg, slot) {
                    shared2.deliver(s, peer);
                }
            });
            Handoff::Later
        }
        // No SMC handshake now (with the limit off, the queue for slots is full too): the
        // client hears "no" on the door and uses the connection as TCP; nothing of the
        // negotiation was ever on the stream, so it is handed out as TCP here as well (it was
        // closed when the queue was full, though its client had been told to use it).
        Admit::Congested | Admit::Refuse => {
            reg.refuse(DeclineReason::HandshakeCongested);
            let t =
                Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local });
            hand_out(&shared.ctx, &cfg, tcp, t, None)
        }
    }
}

fn start_registered(
    shared: &Arc<ListenerShared>,
    cfg: Settings,
    tcp: TcpStream,
    addrs: (Option<SocketAddr>, SocketAddr),
    reg: Registration,
    slot: HandshakeSlot,
) -> Handoff {
    let client = reg.client;
    let Some(wire) = reg.open() else {
        // The client stopped waiting (or went away) before we got to it: it uses the
        // connection as TCP.
        let t = Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::Timeout, by: Side::Peer });
        return hand_out(&shared.ctx, &cfg, tcp, t, None);
    };
    shared.ctx.counters().door(DoorEvent::Matched);
    spawn(shared, tcp, addrs, cfg, Start::Door(slot, wire), Some(client));
    Handoff::Later
}

/// Whether an unregistered connection could still be SMC-R: the listener may have an RDMA port
/// for the address the client reached (`local`), and the client is on another host (a
/// same-host client registers at the door).
fn may_be_smc_r(cfg: &Settings, local: Option<SocketAddr>, peer: SocketAddr) -> bool {
    #[cfg(feature = "rdma")]
    {
        cfg.rdma.enabled
            && !crate::sys::is_local_addr(peer)
            && local.is_some_and(|l| crate::smc::rdma::may_serve(l.ip(), cfg))
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (cfg, local, peer);
        false
    }
}

/// How a handshake task starts.
enum Start {
    /// Matched at the door: the handshake runs on the door connection, starting with the
    /// Proposal that came with the registration (slot taken).
    Door(HandshakeSlot, ServerWire),
    /// Unregistered, possibly an in-band SMC-R client: look at the first bytes first (its
    /// place among those peeked at held until they are seen).
    Peek(HostPlace),
}

/// `addrs`: the connection's local address (if it could be read) and its peer's.
fn spawn(
    shared: &Arc<ListenerShared>,
    tcp: TcpStream,
    addrs: (Option<SocketAddr>, SocketAddr),
    cfg: Settings,
    start: Start,
    client: Option<ClientIdentity>,
) {
    let peer = addrs.1;
    let addrs = addrs.0.map(|local| (local, peer));
    let span = tracing::debug_span!("smc_accept", %peer, transport = tracing::field::Empty);
    let task = shared.clone();
    spawn_task(
        shared,
        async move {
            // Boxed at the first poll, as in `spawn_early`.
            let (stream, t) = match Box::pin(serve(&task, tcp, addrs, &cfg, start, client)).await {
                Some(s) => s,
                None => return,
            };
            tracing::Span::current().record("transport", tracing::field::display(t));
            task.ctx.counters().connection(true, t);
            task.deliver(stream, peer);
        }
        .instrument(span),
    );
}

/// Spawns one of the listener's tasks for a connection (its handshake, or its wait for a
/// handshake slot). If the task panics (on a runtime built without timers, every one does at
/// its first timer), the listener ends as when its own task panics: its accepts fail, saying
/// why, where the connection was lost without a word and, on such a runtime, so was every later
/// one while the accepts waited for good. Not at a runtime's shutdown during another panic
/// ([`Orphan`] tells the two apart): the listener's own task reports that.
fn spawn_task(shared: &Arc<ListenerShared>, fut: impl Future<Output = ()> + Send + 'static) {
    const PANICKED: &str =
        "an smc listener's connection task panicked (a runtime built without `enable_time`?): it accepts no more";
    tokio::spawn(orphaning(shared, PANICKED, None, fut));
}

/// Ends the listener when a task of its ends otherwise than it should: unwound by its own panic
/// (`panicked`), or, where `dropped` is given, ended or dropped unfinished before the listener
/// closed (the listener's own task, with its runtime). The door closes, so same-host clients
/// stop registering with nobody to answer, what was queued is reset, and every waiting `accept`
/// is woken to meet the error. It holds the listener, and whether its task is being polled
/// ([`MarkPoll`]): a task dropped while its thread unwinds from another panic (a runtime
/// dropped during the application's) is not one that panicked.
struct Orphan {
    shared: Arc<ListenerShared>,
    in_poll: Arc<AtomicBool>,
    panicked: &'static str,
    dropped: Option<&'static str>,
}

impl Drop for Orphan {
    fn drop(&mut self) {
        let why = if std::thread::panicking() && self.in_poll.load(Ordering::Relaxed) {
            Some(self.panicked)
        } else {
            self.dropped
        };
        if let Some(why) = why {
            self.shared.orphan(why);
        }
    }
}

/// `fut`, as a task of the listener's that ends it as [`Orphan`] says. The guard is made with
/// the future, not in its first poll: a task dropped before it ever ran (its runtime shut down
/// at once) counts as dropped.
fn orphaning(
    shared: &Arc<ListenerShared>,
    panicked: &'static str,
    dropped: Option<&'static str>,
    fut: impl Future<Output = ()> + Send,
) -> impl Future<Output = ()> + Send {
    let in_poll = Arc::new(AtomicBool::new(false));
    let orphan = Orphan { shared: shared.clone(), in_poll: in_poll.clone(), panicked, dropped };
    MarkPoll::new(in_poll, async move {
        let _orphan = orphan;
        fut.await
    })
}

/// Finishes one connection's establishment: `None` when it was closed instead.
async fn serve(
    shared: &Arc<ListenerShared>,
    mut tcp: TcpStream,
    addrs: Option<(SocketAddr, SocketAddr)>,
    cfg: &Settings,
    start: Start,
    client: Option<ClientIdentity>,
) -> Option<(Established, Transport)> {
    // `inband_place`: an in-band handshake's place in its host's share, held as long as its
    // slot.
    let (slot, mut wire, inband_place) = match start {
        Start::Door(slot, wire) => (slot, Some(wire), None),
        Start::Peek(peeking) => {
            let deadline = tokio::time::Instant::now() + cfg.peek_timeout;
            let first = shared.unless_closed(peek_class(&tcp, deadline)).await;
            drop(peeking);
            let first = match first {
                Some(Ok(c)) => c,
                // The listener closed: the connection goes with it, reset as the kernel resets
                // those of a closed listener's queue.
                None => {
                    crate::handshake::reset_tcp(tcp);
                    return None;
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "closing a connection that failed before its first bytes");
                    return None;
                }
            };
            let t = match first {
                Some(Class::Smc) => None,
                None => Some((FallbackReason::ClientSilent, Some(Owed::Proposal(DeclineReason::Timeout)))),
                Some(Class::Plain) => Some((FallbackReason::PeerNoSmc, None)),
            };
            if let Some((reason, owed)) = t {
                return tcp_out(cfg, tcp, Transport::Tcp(reason), owed);
            }
            // The Proposal is on the stream: answer it, as the guard would.
            let congested = |tcp| {
                let t = Transport::Tcp(FallbackReason::Declined {
                    reason: DeclineReason::HandshakeCongested,
                    by: Side::Local,
                });
                shared.ctx.counters().decline(DeclineReason::HandshakeCongested, Side::Local);
                tcp_out(cfg, tcp, t, Some(Owed::Proposal(DeclineReason::HandshakeCongested)))
            };
            let place = match addrs.map(|(_, peer)| shared.inband_place(peer.ip(), cfg)) {
                Some(None) => {
                    tracing::debug!("this client's host runs its share of the handshakes already");
                    return congested(tcp);
                }
                place => place.flatten(),
            };
            let slot = match shared.admit(cfg) {
                Admit::Now(slot) => slot,
                Admit::Queue(ticket) => match ticket.slot(cfg).await {
                    Some(slot) => slot,
                    // The listener closed: the connection is reset with it.
                    None => {
                        crate::handshake::reset_tcp(tcp);
                        return None;
                    }
                },
                Admit::Congested | Admit::Refuse => return congested(tcp),
            };
            (slot, None, place)
        }
    };
    let on_door = wire.is_some();
    let timer = stats::HandshakeTimer::start(shared.ctx.counters());
    let mut hs = ServerHandshake::new(Instant::now(), Timeouts::uniform(cfg.handshake_timeout));
    let mut pending = Pending::default();
    let outcome = {
        let chan = match &mut wire {
            Some(w) => Channel::Wire(w),
            None => Channel::Tcp(&mut tcp),
        };
        let run = std::pin::pin!(drive(chan, addrs, &mut hs, cfg, shared, client.as_ref(), &mut pending, None));
        shared.unless_closed(run).await
    };
    drop((slot, inband_place));
    let Some(outcome) = outcome else {
        // The listener is gone: decline what can still be declined, so the client continues
        // over TCP (and reads the end of the connection) instead of failing, then close.
        let chan = match &mut wire {
            Some(w) => Channel::Wire(w),
            None => Channel::Tcp(&mut tcp),
        };
        if end_at_close(&mut hs, chan, &mut pending).await {
            crate::handshake::reset_tcp(tcp);
        }
        tracing::debug!("listener dropped during the handshake");
        return None;
    };
    drop(wire);
    timer.end(&outcome);
    match outcome {
        Ok(Outcome::Smc { .. }) => {
            let conn = pending.conn.take()?;
            let t = conn.transport();
            Some((Established::smc(tcp, conn, t), t))
        }
        Ok(Outcome::Fallback { reason, by }) => {
            shared.ctx.counters().decline(reason, by);
            pending.release();
            // On the door the stream carried nothing: it is plain TCP as it is. In-band, a
            // message the client still owes is taken off the stream before the application's
            // bytes.
            let owed = hs.owed_by_peer().filter(|_| !on_door).map(|o| match o {
                crate::proto::handshake::PeerOwes::Proposal => Owed::Proposal(reason),
                crate::proto::handshake::PeerOwes::Answer => Owed::Answer,
            });
            tcp_out(cfg, tcp, Transport::Tcp(FallbackReason::Declined { reason, by }), owed)
        }
        // A same-host client that closed its door connection (its cancel), or sent nonsense
        // there: the stream is untouched, so it is a TCP connection.
        Ok(Outcome::Failed(e)) if on_door => {
            pending.release();
            tcp_out(cfg, tcp, failed_on_door(Ok(e)), None)
        }
        Err(e) if on_door => {
            pending.release();
            tcp_out(cfg, tcp, failed_on_door(Err(e)), None)
        }
        Ok(Outcome::Failed(e)) => {
            tracing::debug!(error = %e, "closing connection after failed handshake");
            pending.release();
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "closing connection after failed handshake");
            pending.release();
            None
        }
    }
}

/// Starts the handshake of a registration at a solo door before its connection arrives (the
/// listener task calls this as registrations come in): the Accept travels while the TCP
/// handshake does, and a Confirm that names a connection the kernel confirms is committed
/// before the connection is accepted, so that no client waits for the listener's accept.
pub(crate) fn start_early(shared: &Arc<ListenerShared>, mut reg: Registration) {
    let Some((key, tcp_rx)) = reg.take_early() else { return };
    // Whatever becomes of the handshake, the registration stays filed until its connection is
    // accepted, and an early ending hands that connection out with the reason its client was
    // told. It goes before that with its door connection, when the sweep finds it stale (after
    // `ENTRY_TTL`, or `VERIFIED_TTL` for one whose connection the door saw), or with the
    // listener. Dropped at the ending instead, a registration whose connection the listener
    // had not taken yet was matched by nothing at accept: the application read a plain
    // client's reason, or the right one, as the accept and the ending raced.
    let cfg = shared.settings();
    if cfg.policy == Policy::TcpOnly {
        reg.refuse(DeclineReason::PeerNoSmc);
        deliver_tcp_when_accepted(shared, tcp_rx, cfg, Transport::Tcp(FallbackReason::Disabled));
        return;
    }
    if shared.ready.is_full() {
        // The application is not accepting: a handshake could not end before it does, and
        // the client would wait for one. It goes on as TCP at once, as a kernel listener's
        // backlog takes a connection whoever accepts it later.
        // (`refuse` counts the decline.)
        reg.refuse(DeclineReason::HandshakeCongested);
        let t = Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local });
        deliver_tcp_when_accepted(shared, tcp_rx, cfg, t);
        return;
    }
    match shared.admit(&cfg) {
        Admit::Now(slot) => spawn_early(shared, reg, key, tcp_rx, cfg, slot),
        Admit::Queue(ticket) => {
            let shared2 = shared.clone();
            spawn_task(shared, async move {
                match ticket.slot(&cfg).await {
                    Some(slot) => spawn_early(&shared2, reg, key, tcp_rx, cfg, slot),
                    // No slot will come: the listener closed.
                    None => reg.refuse(DeclineReason::HandshakeCongested),
                }
            });
        }
        Admit::Congested | Admit::Refuse => {
            // No slot now: the registration is answered when its connection is accepted, as
            // at a door of a reuseport group (where the limit applies as it always did).
            let Some(door) = &shared.door else { return };
            let Some(reg) = door.demote(reg, &key) else { return };
            // Accepted already: its connection comes on `tcp_rx`; decide for it as at accept.
            let task = shared.clone();
            spawn_task(shared, async move {
                let shared = task;
                let Ok((tcp, peer)) = tcp_rx.await else { return };
                let local = shared.fixed_local.or_else(|| tcp.local_addr().ok());
                if let Handoff::Now(s) = registered(&shared, cfg, tcp, (local, peer), reg) {
                    shared.deliver(s, peer);
                }
            });
        }
    }
}

/// Hands the connection that comes on `tcp_rx` (once the listener accepts it) to the
/// application as TCP, for reason `t`. Waits until the listener closes at the most: the
/// registration whose sender would end the wait lives in the listener's door, which this task
/// holds, so that nothing else ends it then. A connection on its way at the close is reset, as
/// those left in the kernel's queue are.
fn deliver_tcp_when_accepted(
    shared: &Arc<ListenerShared>,
    mut tcp_rx: tokio::sync::oneshot::Receiver<(TcpStream, SocketAddr)>,
    cfg: Settings,
    t: Transport,
) {
    let task = shared.clone();
    spawn_task(shared, async move {
        let shared = task;
        match shared.unless_closed(&mut tcp_rx).await {
            Some(Ok((tcp, peer))) => deliver_tcp(&shared, &cfg, tcp, peer, t),
            Some(Err(_)) => {}
            None => reset_on_its_way(&mut tcp_rx),
        }
    });
}

/// At the listener's close: the early registration's connection, if the listener took it from
/// the kernel already and it is on its way on `tcp_rx`, is reset as those left in the kernel's
/// queue are.
fn reset_on_its_way(tcp_rx: &mut tokio::sync::oneshot::Receiver<(TcpStream, SocketAddr)>) {
    if let Ok((tcp, _)) = tcp_rx.try_recv() {
        crate::handshake::reset_tcp(tcp);
    }
}

fn deliver_tcp(shared: &ListenerShared, cfg: &Settings, tcp: TcpStream, peer: SocketAddr, t: Transport) {
    if let Some((s, t)) = tcp_out(cfg, tcp, t, None) {
        shared.ctx.counters().connection(true, t);
        shared.deliver(s, peer);
    }
}

fn spawn_early(
    shared: &Arc<ListenerShared>,
    reg: Registration,
    key: EarlyKey,
    tcp_rx: tokio::sync::oneshot::Receiver<(TcpStream, SocketAddr)>,
    cfg: Settings,
    slot: HandshakeSlot,
) {
    let span = tracing::debug_span!("smc_accept_early", transport = tracing::field::Empty);
    let task = shared.clone();
    // The task holds only the arguments; the handshake's state (kilobytes) is boxed once, at
    // its first poll. Spawned whole, that state was copied at each step of `spawn`: with the
    // moves into `unless_closed` (here and in `serve`), copies were 8% of a listener's CPU time
    // under a connection per request (`perf` of `smcperf server`, `--scenario crr`), 3% after.
    spawn_task(shared, async move { Box::pin(serve_early(task, reg, key, tcp_rx, cfg, slot)).await }.instrument(span));
}

/// The handshake of an early registration, then its connection once accepted.
async fn serve_early(
    shared: Arc<ListenerShared>,
    reg: Registration,
    key: EarlyKey,
    mut tcp_rx: tokio::sync::oneshot::Receiver<(TcpStream, SocketAddr)>,
    cfg: Settings,
    slot: HandshakeSlot,
) {
    let Some(door) = shared.door.as_ref() else { return };
    let client = reg.client;
    let Some(mut wire) = reg.open() else {
        // Cancelled before we began: the connection, if it comes, is TCP.
        let t = Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::Timeout, by: Side::Peer });
        return deliver_tcp_when_accepted(&shared, tcp_rx, cfg, t);
    };
    shared.ctx.counters().door(DoorEvent::Matched);
    let timer = stats::HandshakeTimer::start(shared.ctx.counters());
    let mut hs = ServerHandshake::new(Instant::now(), Timeouts::uniform(cfg.handshake_timeout));
    let mut pending = Pending::default();
    let outcome = {
        // Stalls (test-util) are keyed by the listener's address; no connection exists yet.
        let listen = shared.bound.map(|l| (l, l));
        let run = std::pin::pin!(drive(
            Channel::Wire(&mut wire),
            listen,
            &mut hs,
            &cfg,
            &shared,
            Some(&client),
            &mut pending,
            Some((door, &key)),
        ));
        // Pinned in place and lent: moved into `unless_closed`, the drive's state was copied.
        shared.unless_closed(run).await
    };
    drop(slot);
    let Some(outcome) = outcome else {
        let _ = end_at_close(&mut hs, Channel::Wire(&mut wire), &mut pending).await;
        door.forget(&key);
        reset_on_its_way(&mut tcp_rx);
        return;
    };
    drop(wire);
    timer.end(&outcome);
    let t = match outcome {
        Ok(Outcome::Smc { .. }) => {
            // Committed: the connection is ours to hand out once the listener accepts it, which
            // may be late (the application does not accept, and its ready queue is full): the
            // sweep keeps the registration, and with it the wait, while the kernel holds our
            // end of the connection, up to five minutes; the listener's close ends it too. It
            // stays in `pending` meanwhile, so that a task dropped while it waits (its runtime
            // shutting down) aborts it too.
            let tcp = shared.unless_closed(tcp_rx).await.and_then(Result::ok);
            match tcp {
                Some((tcp, peer)) => {
                    if let Some(conn) = pending.conn.take() {
                        let t = conn.transport();
                        tracing::Span::current().record("transport", tracing::field::display(t));
                        shared.ctx.counters().connection(true, t);
                        shared.deliver(Established::smc(tcp, conn, t), peer);
                    }
                }
                None => {
                    door.forget(&key);
                    // Committed: aborted.
                    pending.conn.release();
                }
            }
            return;
        }
        Ok(Outcome::Fallback { reason, by }) => {
            shared.ctx.counters().decline(reason, by);
            Transport::Tcp(FallbackReason::Declined { reason, by })
        }
        Ok(Outcome::Failed(e)) => failed_on_door(Ok(e)),
        Err(e) => failed_on_door(Err(e)),
    };
    pending.release();
    deliver_tcp_when_accepted(&shared, tcp_rx, cfg, t);
}

/// What a connection whose door handshake failed is: TCP, since its stream carried nothing of
/// the handshake. A client that cancelled (or closed its door connection) or sent nonsense is
/// the peer's doing; a door that failed us is ours.
fn failed_on_door(e: Result<crate::proto::handshake::HandshakeError, io::Error>) -> Transport {
    use crate::proto::handshake::HandshakeError;
    let (reason, by) = match e {
        Ok(e) => {
            tracing::debug!(error = %e, "handshake on the door ended without smc");
            match e {
                HandshakeError::Eof | HandshakeError::Timeout => (DeclineReason::Timeout, Side::Peer),
                _ => (DeclineReason::SyncError, Side::Peer),
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "the door failed during the handshake");
            (DeclineReason::Internal, Side::Local)
        }
    };
    Transport::Tcp(FallbackReason::Declined { reason, by })
}

/// Ends a handshake whose listener was dropped: declines if it still can, and sends what the
/// handshake owes (its Decline, or a Commit it decided on before the listener went, which the
/// client, confirmed, waits for). A committed connection is aborted, as the kernel resets the
/// connections left in a closed listener's queue: its client reads a reset, not the clean end
/// of a server that read what it sent and closed. Returns whether it committed.
async fn end_at_close(hs: &mut ServerHandshake, mut chan: Channel<'_, ServerWire>, pending: &mut Pending) -> bool {
    hs.handle_timeout(Instant::now() + Duration::from_secs(365 * 24 * 3600));
    let flushed = tokio::time::timeout(Duration::from_secs(1), chan.flush(hs)).await;
    if let Ok(Err(e)) = flushed {
        // Nothing more went out (a door message goes whole or not at all; a partial CLC
        // message commits nobody): the client is not committed, and the connection goes as
        // one that never was.
        tracing::debug!(error = %e, "the handshake's last word did not go out");
        pending.conn.not_committed();
    }
    let committed = pending.conn.is_committed();
    // A committed connection is aborted; its slot goes back once the client answers.
    pending.release();
    committed
}

fn tcp_out(cfg: &Settings, tcp: TcpStream, t: Transport, owed: Option<Owed>) -> Option<(Established, Transport)> {
    if cfg.policy == Policy::Never {
        tracing::debug!(transport = %t, "closing: policy requires smc");
        return None;
    }
    let s = Established::Tcp { tcp, transport: t, owed };
    Some((s, t))
}

/// The connection set up between Accept and Commit, and what its checks need.
#[derive(Default)]
struct Pending {
    conn: PendingConn,
    proposed_rmb: u32,
    #[cfg(feature = "rdma")]
    rdma: Option<crate::smc::rdma::ServerPending>,
}

impl Pending {
    /// No SMC: give the slot back, and drop a group set up for a client that will not join.
    fn release(&mut self) {
        if self.conn.is_committed() {
            self.conn.release();
            return;
        }
        let Some(conn) = self.conn.take() else { return };
        let group = conn.group().clone();
        group.unregister(conn.our_token());
        group.manager().abandon_pending(&group);
        // A new rdma group waits for nobody but this handshake's Confirm.
        #[cfg(feature = "rdma")]
        if self.rdma.is_some() && group.link().is_none() && group.conn_count() == 0 {
            group.fail(crate::link::LinkError::Closed);
        }
    }
}

/// Runs the server handshake to its outcome, making the decisions.
/// `early`: the handshake of a registration answered before its connection arrived, whose
/// Confirm must name a connection the kernel confirms (see [`Door::verify`]).
#[allow(clippy::too_many_arguments)]
async fn drive(
    mut chan: Channel<'_, ServerWire>,
    addrs: Option<(SocketAddr, SocketAddr)>,
    hs: &mut ServerHandshake,
    cfg: &Settings,
    shared: &ListenerShared,
    client: Option<&ClientIdentity>,
    pending: &mut Pending,
    early: Option<(&Door, &EarlyKey)>,
) -> io::Result<Outcome> {
    loop {
        let step = chan.advance(hs).await.inspect_err(|_| {
            // The handshake failed on its channel: what it was sending did not go out (a door
            // message goes whole or not at all; a CLC message cut short commits nobody), a
            // Commit among it included.
            pending.conn.not_committed();
        })?;
        match step {
            Step::Event(ServerEvent::Proposal(p)) => {
                tracing::debug!(shm = p.shm.is_some(), rdma = p.rdma.is_some(), "proposal");
                if let Some((local, _)) = addrs {
                    crate::faults::stall(local, crate::faults::Point::ServerBeforeAccept).await;
                }
                match choose(addrs, &p, cfg, shared, client, pending).await {
                    Ok(info) => {
                        pending.proposed_rmb = p.rmb_size;
                        hs.accept(info, Instant::now());
                    }
                    Err(reason) => {
                        tracing::debug!(%reason, "declining proposal");
                        hs.decline(reason, Instant::now());
                    }
                }
            }
            Step::Event(ServerEvent::Confirmed(link)) => {
                if let Some((local, _)) = addrs {
                    crate::faults::stall(local, crate::faults::Point::ServerBeforeCommit).await;
                }
                if let Some((door, key)) = early {
                    let said = match &chan {
                        Channel::Wire(w) => w.connected(),
                        Channel::Tcp(_) => None,
                    };
                    match verify_early(door, key, said).await {
                        Verified::Yes => {}
                        Verified::No => {
                            tracing::debug!(?said, "the confirmed connection is not the registrant's");
                            hs.decline(DeclineReason::SyncError, Instant::now());
                            continue;
                        }
                        Verified::NotAccepted => {
                            tracing::debug!(?said, "our end of the confirmed connection waits in a full listen queue");
                            hs.decline(DeclineReason::HandshakeCongested, Instant::now());
                            continue;
                        }
                    }
                }
                match check_confirm(&link, cfg, shared, pending).await {
                    Ok(()) => {
                        hs.commit(Instant::now());
                        // From here, letting the connection go aborts it (`PendingConn`).
                        pending.conn.committed();
                        if let Some((local, _)) = addrs {
                            crate::faults::stall(local, crate::faults::Point::ServerAfterCommit).await;
                        }
                    }
                    Err((reason, why)) => {
                        tracing::debug!(why, %reason, "confirm not taken");
                        hs.decline(reason, Instant::now());
                    }
                }
            }
            Step::Done(o) => return Ok(o),
        }
    }
}

/// Picks the transport for a Proposal and sets our end up: shared memory first (only for a
/// client registered at our door, so known to be on this host), then RDMA.
async fn choose(
    addrs: Option<(SocketAddr, SocketAddr)>,
    p: &Proposal,
    cfg: &Settings,
    shared: &ListenerShared,
    client: Option<&ClientIdentity>,
    pending: &mut Pending,
) -> Result<LinkInfo, DeclineReason> {
    if cfg.policy == Policy::TcpOnly {
        return Err(DeclineReason::NoCommonTransport);
    }
    let shm = match (&p.shm, client) {
        (Some(_), Some(c)) => {
            shared.ctx.manager().server_conn_create(&shared.side_listener, p, c, &cfg.shm, cfg.handshake_timeout)
        }
        _ => Err(DeclineReason::NoCommonTransport),
    };
    match shm {
        Ok((conn, info)) => {
            pending.conn.set(conn);
            Ok(LinkInfo::Shm(info))
        }
        #[cfg(feature = "rdma")]
        Err(shm_reason) if p.rdma.is_some() => {
            let (local, peer) = addrs.map(|(l, p)| (l.ip(), p.ip())).ok_or(shm_reason)?;
            let _setup = shared.rdma_setup(cfg).ok_or_else(|| {
                tracing::debug!("half the handshake slots wait for rdma setup already");
                DeclineReason::HandshakeCongested
            })?;
            // Setup steps wait for their turn on the setup thread until the handshake's bound:
            // past it the connection goes on as TCP; the look-ups go on for later connections,
            // and a setup step that had not begun never runs.
            let deadline = crate::smc::rdma::setup_deadline(cfg);
            crate::smc::rdma::warm_up(cfg, deadline).await;
            crate::smc::rdma::warm_port(local, cfg, deadline).await;
            let manager = shared.ctx.manager();
            match crate::smc::rdma::server_conn_create(manager, p, local, peer, cfg, (cfg.handshake_timeout, deadline))
                .await
            {
                Ok((conn, info, rp)) => {
                    pending.rdma = Some(rp);
                    pending.conn.adopt(conn);
                    Ok(LinkInfo::Rdma(info))
                }
                Err(DeclineReason::NoCommonTransport) => Err(shm_reason),
                Err(r) => Err(r),
            }
        }
        Err(r) => {
            let _ = addrs;
            Err(r)
        }
    }
}

/// How long an early handshake waits for our end of its connection to become the full socket
/// the listener will accept ([`Door::verify`]): the kernel makes it when it takes the client's
/// last ACK in, which on this host's loopback is done by the time the client's Confirm comes,
/// unless the softirq that does it was deferred (a few milliseconds on a loaded host) or the
/// listen queue is full, which may last until the application accepts. A choice, not a
/// measurement: far above the first, far below a handshake's bound.
const OUR_END_WAIT: Duration = Duration::from_millis(20);

/// [`Door::verify`], asked again while our end is a request socket, for [`OUR_END_WAIT`] at
/// most: after 1, 2, 4 and 8 ms, then at the end (each look asks the kernel under the door's
/// lock, which the listener's accepts take too, and a full listen queue is when many look).
async fn verify_early(door: &Door, key: &EarlyKey, said: Option<crate::proto::door::ConnectedTuple>) -> Verified {
    let until = tokio::time::Instant::now() + OUR_END_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        let v = door.verify(key, said);
        let now = tokio::time::Instant::now();
        if v != Verified::NotAccepted || now >= until {
            return v;
        }
        tokio::time::sleep(pause.min(until - now)).await;
        pause *= 2;
    }
}

/// Checks the client's Confirm against the link we accepted, and finishes our end of it; an
/// error says why not, and the reason to decline with.
async fn check_confirm(
    link: &LinkInfo,
    cfg: &Settings,
    shared: &ListenerShared,
    pending: &mut Pending,
) -> Result<(), (DeclineReason, &'static str)> {
    #[cfg(not(feature = "rdma"))]
    let _ = shared;
    let mismatch = |why| (DeclineReason::SyncError, why);
    let Some(conn) = pending.conn.get() else {
        return Err(mismatch("no connection was accepted"));
    };
    match link {
        LinkInfo::Shm(c) => {
            let group = conn.group().clone();
            if c.link_group != group.id || c.rmb_size != pending.proposed_rmb {
                return Err(mismatch("link group or rmb size differs from the accept"));
            }
            // The client confirms once it has our WELCOME; our join task installs the link
            // right after sending it, so this waits at most a few task turns.
            if !group.wait_established(cfg.handshake_timeout).await {
                return Err(mismatch("the link group was never joined"));
            }
            conn.confirm(c.rmb_slot);
            Ok(())
        }
        #[cfg(feature = "rdma")]
        LinkInfo::Rdma(c) => {
            let rp = pending.rdma.as_ref().ok_or(mismatch("rdma confirm without an rdma accept"))?;
            // A second setup step: it waits among the handshakes that wait for one, as the
            // first did (`ListenerShared::rdma_setup`).
            let _setup = shared
                .rdma_setup(cfg)
                .ok_or((DeclineReason::HandshakeCongested, "half the handshake slots wait for rdma setup already"))?;
            let deadline = crate::smc::rdma::setup_deadline(cfg);
            crate::smc::rdma::server_confirm(conn, rp, c, deadline).await.map_err(|(reason, why)| {
                tracing::debug!(%why, "rdma confirm");
                (reason, "rdma confirm not taken")
            })
        }
        #[allow(unreachable_patterns)]
        _ => Err(mismatch("a transport we did not accept")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Not our eyecatcher (or EOF): a plain client.
    Plain,
    /// A whole CLC message is there (or one whose header is invalid: the handshake declines
    /// it at once). Only then does the connection take a handshake slot: a client that sends
    /// our eyecatcher and stops holds none (a remote one could otherwise hold every slot for a
    /// handshake timeout each, and send the door's clients to TCP). A message of another
    /// version, which the handshake reads whole before it answers, counts once it is whole
    /// too: its eight-byte header alone held a slot for the handshake timeout.
    Smc,
}

fn classify(seen: &[u8]) -> Option<Class> {
    use crate::proto::clc::{decode, ClcError, Decoded};
    if !eyecatcher_prefix_matches(seen) {
        return Some(Class::Plain);
    }
    match decode(seen) {
        Ok(Decoded::NeedMore(_)) => None,
        Err(ClcError::UnsupportedVersion { len, .. }) if seen.len() < usize::from(len) => None,
        _ => Some(Class::Smc),
    }
}

/// Waits (up to `deadline`) until the first bytes decide what the client is: not our
/// eyecatcher, or a whole CLC message. `None`: it sent nothing decisive in time (then a
/// Proposal that comes later is answered by the in-band guard).
async fn peek_class(tcp: &TcpStream, deadline: tokio::time::Instant) -> io::Result<Option<Class>> {
    let mut buf = [0u8; CLC_MAX_LEN];
    // After a matching prefix shorter than a message, the socket stays readable, so waiting for
    // readiness would spin: back off instead. Only a client that trickles its first bytes gets
    // here; the backoff caps at 16 ms.
    let mut backoff = Duration::from_millis(1);
    loop {
        let n = match tokio::time::timeout_at(deadline, tcp.peek(&mut buf)).await {
            Ok(r) => r?,
            Err(_) => return Ok(None),
        };
        if n == 0 {
            return Ok(Some(Class::Plain));
        }
        if let Some(c) = classify(&buf[..n]) {
            return Ok(Some(c));
        }
        if tokio::time::timeout_at(deadline, tokio::time::sleep(backoff)).await.is_err() {
            return Ok(None);
        }
        backoff = (backoff * 2).min(Duration::from_millis(16));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::clc::CLC_EYECATCHER;

    /// A connection finished after its listener closed (its handshake ended as the listener
    /// went) is reset, as one left in the queue is: its client reads a reset, not an end.
    #[tokio::test]
    async fn a_connection_finished_after_the_listener_closed_is_reset() {
        use tokio::io::AsyncReadExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, peer) = l.accept().await.unwrap();
        let q = ReadyQueue::default();
        q.close();
        q.push((Established::tcp(server, Transport::Tcp(FallbackReason::PeerNoSmc)), peer));
        let e = client.read(&mut [0u8; 4]).await.expect_err("an end, not a reset");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    }

    #[test]
    fn classification() {
        assert_eq!(classify(b""), None);
        assert_eq!(classify(&CLC_EYECATCHER[..1]), None);
        assert_eq!(classify(&CLC_EYECATCHER[..3]), None);
        // A message is Smc only whole (or with a header the handshake declines at once).
        let proposal = proposal_bytes();
        assert_eq!(classify(&CLC_EYECATCHER), None);
        assert_eq!(classify(&proposal[..proposal.len() - 1]), None);
        assert_eq!(classify(&proposal), Some(Class::Smc));
        let mut too_long = proposal[..8].to_vec();
        too_long[6..8].copy_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(classify(&too_long), Some(Class::Smc), "declined at once, not waited for");
        // Another version's message: read whole before it is answered, so Smc only whole.
        let mut other_version = proposal.clone();
        other_version[4] = crate::proto::clc::CLC_VERSION + 1;
        assert_eq!(classify(&other_version[..8]), None, "another version's header alone");
        assert_eq!(classify(&other_version[..other_version.len() - 1]), None);
        assert_eq!(classify(&other_version), Some(Class::Smc));
        assert_eq!(classify(b"G"), Some(Class::Plain));
        assert_eq!(classify(&[0xE2, 0xD4, 0x00]), Some(Class::Plain));
        assert_eq!(classify(&[0x16, 0x03, 0x01, 0x00]), Some(Class::Plain), "TLS client hello");
    }

    /// A connection task of the listener that panics ends the listener, whose accepts then
    /// fail with the reason; one that ends, or is dropped unpolled, does not. (On a runtime
    /// without timers every handshake task panics at its first timer: the listener's accepts
    /// waited for good while each connection was lost.)
    #[tokio::test]
    async fn a_connection_task_that_panics_ends_the_listener() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let shared = Arc::new(ListenerShared::new(Context::new(), &tcp, None, false, Overrides::default(), READY_CAP));
        spawn_task(&shared, async {});
        tokio::task::yield_now().await;
        assert!(shared.orphaned().is_none() && !shared.is_closed(), "a task that ended");
        // Spawned on a runtime that goes before it ever runs: dropped unpolled.
        let task = shared.clone();
        std::thread::spawn(move || {
            let other = tokio::runtime::Builder::new_current_thread().build().unwrap();
            other.block_on(async { spawn_task(&task, async { panic!("never polled") }) });
        })
        .join()
        .unwrap();
        assert!(shared.orphaned().is_none() && !shared.is_closed(), "a task dropped unpolled");
        spawn_task(&shared, async { panic!("a connection task's own panic") });
        for _ in 0..100 {
            if shared.is_closed() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let e = shared.orphaned().expect("the listener ended");
        assert!(e.to_string().contains("connection task panicked"), "{e}");
    }

    /// One client host (an IPv4 address, an IPv6 /64) runs at most half a listener's
    /// handshakes in-band, all in-band clients together three quarters: the rest stay for the
    /// other hosts and for the door's same-host clients. A place is free again when a
    /// handshake ends.
    #[tokio::test]
    async fn one_host_runs_at_most_half_the_handshakes_in_band() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let shared = Arc::new(ListenerShared::new(Context::new(), &tcp, None, false, Overrides::default(), READY_CAP));
        let cfg = Settings { max_pending_handshakes: 64, ..Settings::default() };
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        // Bounded, so that a missing bound fails the test instead of looping.
        let take = |host: &str| {
            std::iter::from_fn(|| shared.inband_place(ip(host), &cfg))
                .take(cfg.max_pending_handshakes + 1)
                .collect::<Vec<_>>()
        };
        let a: Vec<_> = ["2001:db8::1", "2001:db8::2:3"].iter().flat_map(|h| take(h)).collect();
        assert_eq!(a.len(), 32, "one IPv6 /64, one host: half");
        let b = take("192.0.2.1");
        assert_eq!(b.len(), 16, "another host: what is left of three quarters");
        assert!(shared.inband_place(ip("::ffff:192.0.2.1"), &cfg).is_none(), "the same host, IPv4-mapped");
        assert!(shared.inband_place(ip("192.0.2.2"), &cfg).is_none(), "all in-band clients together: three quarters");
        drop(a);
        let c = take("::ffff:192.0.2.1");
        assert_eq!(c.len(), 16, "the rest of its half, IPv4-mapped");
        assert_eq!(take("192.0.2.2").len(), 16, "places given back: what is left of three quarters");
    }

    /// An in-band client whose host runs its share of the handshakes already is declined as
    /// congested and handed out as TCP at once, with `limit_handshake` on or off (off, the
    /// slot queue is not where it waits): no slot is taken, its Proposal is answered with
    /// that Decline once the application reads, and the stream then carries its bytes.
    #[tokio::test]
    async fn a_host_past_its_in_band_share_goes_tcp_at_once_limit_on_or_off() {
        use crate::proto::clc::{decode, ClcMessage, Decoded};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for limit in [true, false] {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let shared =
                Arc::new(ListenerShared::new(Context::new(), &l, None, false, Overrides::default(), READY_CAP));
            let cfg = Settings { max_pending_handshakes: 4, limit_handshake: limit, ..Settings::default() };
            let mut client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
            let (s, peer) = l.accept().await.unwrap();
            let held: Vec<_> = std::iter::from_fn(|| shared.inband_place(peer.ip(), &cfg)).take(5).collect();
            assert_eq!(held.len(), 2, "the host's half of four");
            client.write_all(&proposal_bytes()).await.unwrap();
            let place = shared.peek_slot(peer.ip()).unwrap();
            let addrs = Some((s.local_addr().unwrap(), peer));
            let run = serve(&shared, s, addrs, &cfg, Start::Peek(place), None);
            let (e, t) = tokio::time::timeout(Duration::from_secs(10), run).await.expect("at once").expect("a stream");
            let congested = FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local };
            assert_eq!(t, Transport::Tcp(congested), "limit_handshake {limit}");
            assert_eq!(shared.in_flight.load(Ordering::Acquire), 0, "no slot taken");
            let mut stream = crate::SmcStream::from_established(shared.ctx.clone(), e);
            let mut buf = [0u8; 5];
            let (read, answer) = tokio::join!(stream.read_exact(&mut buf), async {
                let mut got = Vec::new();
                loop {
                    if let Decoded::Message(m, _) = decode(&got).unwrap() {
                        client.write_all(b"hello").await.unwrap();
                        return m;
                    }
                    let mut b = [0u8; 64];
                    let n = client.read(&mut b).await.unwrap();
                    assert!(n > 0, "an end before the Decline");
                    got.extend_from_slice(&b[..n]);
                }
            });
            read.unwrap();
            assert_eq!(&buf, b"hello", "the client's bytes after its Proposal");
            match answer {
                ClcMessage::Decline(d) => assert_eq!(d.reason, DeclineReason::HandshakeCongested),
                m => panic!("not a Decline: {m:?}"),
            }
            drop(held);
        }
    }

    /// A connection whose host holds its half of the places where first bytes are looked at is
    /// TCP at once, its guard owing a congested Decline; another host's is looked at (a task).
    #[tokio::test]
    async fn a_host_past_its_peek_share_is_tcp_at_once_with_a_congested_decline_owed() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut shared = ListenerShared::new(Context::new(), &l, None, false, Overrides::default(), READY_CAP);
        shared.peek_max = 4;
        let shared = Arc::new(shared);
        let cfg = Settings::default();
        let plain = Transport::Tcp(FallbackReason::PeerNoSmc);
        let ip: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let held: Vec<_> = std::iter::from_fn(|| shared.peek_slot(ip)).take(5).collect();
        assert_eq!(held.len(), 2, "the host's half of four");
        let _c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, peer) = l.accept().await.unwrap();
        match peek_or_tcp(&shared, s, (None, peer), cfg.clone(), plain) {
            Handoff::Now(Established::Tcp { transport, owed, .. }) => {
                assert_eq!(transport, plain);
                assert!(matches!(owed, Some(Owed::Proposal(DeclineReason::HandshakeCongested))), "{owed:?}");
            }
            _ => panic!("not TCP at once"),
        }
        // Another host (its address as the listener sees it), with places left in all.
        let _c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let other = "192.0.2.7:4000".parse().unwrap();
        assert!(matches!(peek_or_tcp(&shared, s, (None, other), cfg, plain), Handoff::Later), "looked at");
        let fourth = shared.peek_slot("192.0.2.8".parse().unwrap());
        assert!(fourth.is_some(), "two of the host's, the look, and this one");
        assert!(shared.peek_slot("192.0.2.9".parse().unwrap()).is_none(), "the look holds its place");
        drop((held, fourth));
    }

    /// A listener looks at the first bytes of at most as many connections at once as its ready
    /// queue holds (within bounds), of one client host's at most half of that; a place is free
    /// again when a look ends.
    #[tokio::test]
    async fn peeks_are_bounded_by_the_ready_queue_and_per_host() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let new = |cap| ListenerShared::new(Context::new(), &tcp, None, false, Overrides::default(), cap);
        assert_eq!(new(16).peek_max, READY_CAP, "a small backlog's");
        assert_eq!(new(1 << 20).peek_max, 4 * READY_CAP, "a huge backlog's");
        let mut shared = new(READY_CAP);
        shared.peek_max = 4;
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let (a, b) = (shared.peek_slot(ip("192.0.2.1")), shared.peek_slot(ip("::ffff:192.0.2.1")));
        assert!(a.is_some() && b.is_some());
        assert!(shared.peek_slot(ip("192.0.2.1")).is_none(), "a third look at one host's while two run");
        let others = [shared.peek_slot(ip("2001:db8::1")), shared.peek_slot(ip("192.0.2.2"))];
        assert!(others.iter().all(Option::is_some), "other hosts' looks");
        assert!(shared.peek_slot(ip("192.0.2.3")).is_none(), "a fifth look while four run");
        drop(a);
        assert!(shared.peek_slot(ip("192.0.2.1")).is_some(), "a place freed by a look that ended");
        drop(b);
    }

    fn proposal_bytes() -> Vec<u8> {
        use crate::proto::clc::{ClcMessage, Proposal};
        let p = Proposal { secret: crate::sys::random_secret().unwrap(), rmb_size: 64 << 10, shm: None, rdma: None };
        ClcMessage::Proposal(p).encode().unwrap()
    }

    /// A client that sends our eyecatcher, or all of a Proposal but its last byte, and stops is
    /// not taken for an SMC client (which would hold a handshake slot): at the deadline it is
    /// one that said nothing decisive. Its Proposal's last byte makes it one.
    #[tokio::test]
    async fn only_a_whole_message_makes_a_client_smc() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let proposal = proposal_bytes();
        let wait = || tokio::time::Instant::now() + Duration::from_millis(200);
        assert_eq!(peek_class(&s, wait()).await.unwrap(), None, "nothing sent");
        c.try_write(&proposal[..CLC_EYECATCHER.len()]).unwrap();
        assert_eq!(peek_class(&s, wait()).await.unwrap(), None, "the eyecatcher alone");
        c.try_write(&proposal[CLC_EYECATCHER.len()..proposal.len() - 1]).unwrap();
        assert_eq!(peek_class(&s, wait()).await.unwrap(), None, "all but a byte");
        c.try_write(&proposal[proposal.len() - 1..]).unwrap();
        // The whole message answers as soon as it is in: a deadline far off, so that only a
        // message never recognised runs into it.
        let far = tokio::time::Instant::now() + Duration::from_secs(10);
        assert_eq!(peek_class(&s, far).await.unwrap(), Some(Class::Smc));
    }
}

// ----- the listener's side: admission, the ready queue, the accept loop --------------------

/// A finished connection waiting for `accept`, and its peer.
type Ready = (Established, SocketAddr);

/// The kernel backlog [`SmcListener::bind`](crate::SmcListener::bind) listens with. tokio's `TcpListener::bind` takes
/// mio's, which follows std's 128; a listener that also runs handshakes is scheduled less
/// promptly than a bare accept loop, and 1000 concurrent connects overflowed a 128-deep queue
/// on the 2-vCPU VM (`nstat`: `TcpExtListenOverflows` 937, SYN retransmits 729, connects of
/// 1 to 6 s) where 1024 absorbed them. The kernel caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 1024;

/// Finished connections a listener holds for `accept()`, as the kernel's accept queue does:
/// as many as its backlog ([`LISTEN_BACKLOG`] where the backlog is not ours to know: a
/// listener made from a listening socket). While it is full the listener's task stops taking
/// connections from the kernel, whose own backlog then applies, and clients that register are
/// told at once to stay on TCP (the handshake could not end before the application accepts).
pub(crate) const READY_CAP: usize = LISTEN_BACKLOG as usize;

/// How often a listener drops door registrations that were cancelled or went stale, while it
/// has any. Registrations normally live microseconds (matched on accept); the sweep only
/// reclaims those of clients that gave up or died.
const DOOR_SWEEP: Duration = Duration::from_millis(100);

/// What a listener, its task and its handshake tasks share. Not the listening socket: the
/// `SmcListener` holds that alone (its task only for the length of a turn), so that the
/// socket's descriptor closes when the listener is dropped, as tokio's does, whatever
/// handshakes still hold this.
pub(crate) struct ListenerShared {
    /// The address every connection arrives at, when the listener is bound to one (not a
    /// wildcard): an accepted connection's local address, known without asking.
    fixed_local: Option<SocketAddr>,
    /// The listening socket's own address, read once.
    bound: Option<SocketAddr>,
    /// The listening socket has the default `SO_LINGER` (off), which its accepted sockets
    /// inherit: made by us, and its descriptor never lent out.
    pub(crate) default_linger: std::sync::atomic::AtomicBool,
    pub(crate) door: Option<Door>,
    /// The listening socket is the kernel's `AF_SMC` one: its connections are classified with
    /// `smc_diag` as they are accepted.
    pub(crate) kernel: bool,
    /// The builder's values, changed at run time by the listener's setters.
    pub(crate) overrides: std::sync::RwLock<Overrides>,
    /// The context the listener was bound in: its settings under the overrides, its link
    /// groups and counters.
    pub(crate) ctx: Context,
    /// Handshakes running now.
    pub(crate) in_flight: AtomicUsize,
    /// Connections waiting for a handshake slot (`limit_handshake` off).
    waiting: AtomicUsize,
    /// Signalled when a handshake slot frees.
    freed: Notify,
    /// Handshakes that wait for RDMA link setup now ([`rdma_setup`](Self::rdma_setup)).
    #[cfg(feature = "rdma")]
    rdma_setups: AtomicUsize,
    /// In-band handshakes running now, per client host and all together
    /// ([`inband_place`](Self::inband_place)).
    inband: Arc<Mutex<HostShares>>,
    /// Connections whose first bytes are being looked at now, per client host and all together
    /// ([`peek_slot`](Self::peek_slot)).
    peeking: Arc<Mutex<HostShares>>,
    /// How many at most: the ready queue's capacity, within [`READY_CAP`] and four times it
    /// (a listener made with a small backlog would let a few silent connections a second
    /// take every place; a huge one would bound nothing).
    peek_max: usize,
    pub(crate) side_listener: SideListener,
    pub(crate) ready: ReadyQueue,
    closed: AtomicBool,
    closing: Notify,
    /// Why the listener's task ended while the listener lived ([`run`]'s guard): its runtime
    /// shut down, or it panicked. `accept` then fails with it, as tokio's fails once its
    /// runtime shut down, instead of waiting for a task that will never wake it.
    orphaned: std::sync::OnceLock<&'static str>,
}

/// Places held now (a look at a connection's first bytes, an in-band handshake), per client
/// host ([`crate::sys::host_of`]) and in all ([`HostShares::take`]).
#[derive(Default)]
struct HostShares {
    all: usize,
    by_host: std::collections::HashMap<std::net::Ipv6Addr, usize>,
}

impl HostShares {
    /// A place for a client at `peer` while its host holds fewer than `host_max` places and
    /// all hosts together fewer than `all_max`; `None` past either.
    fn take(this: &Arc<Mutex<Self>>, peer: std::net::IpAddr, host_max: usize, all_max: usize) -> Option<HostPlace> {
        let host = crate::sys::host_of(peer);
        let mut c = this.lock().unwrap_or_else(|e| e.into_inner());
        if c.all >= all_max || c.by_host.get(&host).is_some_and(|n| *n >= host_max) {
            return None;
        }
        c.all += 1;
        *c.by_host.entry(host).or_default() += 1;
        Some(HostPlace(this.clone(), host))
    }
}

/// A place in a [`HostShares`], given back when dropped.
struct HostPlace(Arc<Mutex<HostShares>>, std::net::Ipv6Addr);

impl Drop for HostPlace {
    fn drop(&mut self) {
        let mut c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        c.all -= 1;
        crate::hash::count_down(&mut c.by_host, &self.1);
    }
}

/// A handshake's place among those waiting for RDMA setup ([`ListenerShared::rdma_setup`]).
#[cfg(feature = "rdma")]
struct RdmaSetup<'a>(&'a AtomicUsize);

#[cfg(feature = "rdma")]
impl Drop for RdmaSetup<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl fmt::Debug for ListenerShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerShared").field("local", &self.bound).finish()
    }
}

impl ListenerShared {
    pub(crate) fn settings(&self) -> Settings {
        self.overrides.read().unwrap_or_else(|e| e.into_inner()).resolve(self.ctx.settings())
    }

    /// A listener's shared state around its listening socket (and door).
    pub(crate) fn new(
        ctx: Context,
        tcp: &TcpListener,
        door: Option<Door>,
        kernel: bool,
        overrides: Overrides,
        ready_cap: usize,
    ) -> ListenerShared {
        let bound = tcp.local_addr().ok();
        let fixed_local = bound.filter(|a| !a.ip().is_unspecified());
        ListenerShared {
            fixed_local,
            bound,
            default_linger: std::sync::atomic::AtomicBool::new(false),
            door,
            kernel,
            overrides: std::sync::RwLock::new(overrides),
            ctx,
            in_flight: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
            #[cfg(feature = "rdma")]
            rdma_setups: AtomicUsize::new(0),
            inband: Arc::default(),
            peeking: Arc::default(),
            peek_max: ready_cap.clamp(READY_CAP, 4 * READY_CAP),
            side_listener: SideListener::default(),
            ready: ReadyQueue::with_cap(ready_cap),
            closed: AtomicBool::new(false),
            closing: Notify::new(),
            orphaned: std::sync::OnceLock::new(),
        }
    }

    /// A place to look at the first bytes (up to the peek timeout) of an off-host connection
    /// from `peer`, while fewer are looked at than `peek_max`, and fewer than half of that of
    /// `peer`'s host: each holds a descriptor and a task whether or not the application
    /// accepts, and a flood of connections to an SMC-R-capable listener otherwise held as many
    /// as came within the timeout (taken from the kernel's backlog at once, which then bounded
    /// nothing); one host that opened connections and sent nothing took every place, and the
    /// SMC-R clients of every other host went to TCP meanwhile. Past it, connections go out as
    /// TCP at once, as at a listener that peeks at nothing.
    fn peek_slot(&self, peer: std::net::IpAddr) -> Option<HostPlace> {
        let place = HostShares::take(&self.peeking, peer, (self.peek_max / 2).max(1), self.peek_max);
        if place.is_none() {
            tracing::debug!(
                peeking = self.peek_max,
                "as many off-host connections looked at as may be, of this host's or in all: handed out at once"
            );
        }
        place
    }

    /// Ends the listener for `why`, which its accepts then fail with (unless it closed first).
    fn orphan(&self, why: &'static str) {
        if self.is_closed() {
            return;
        }
        tracing::debug!(why, "smc listener orphaned");
        let _ = self.orphaned.set(why);
        // Wakes every `accept` waiting, to meet the reason.
        self.close();
    }

    /// Why the listener's task ended while the listener lived, if it did (see `orphaned`).
    pub(crate) fn orphaned(&self) -> Option<io::Error> {
        self.orphaned.get().map(|why| io::Error::other(*why))
    }

    /// Queues a finished connection for `accept` (reset if the listener is gone).
    pub(crate) fn deliver(&self, e: Established, peer: SocketAddr) {
        self.ready.push((e, peer));
    }

    /// Whether the listener was dropped.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Runs `f` to its end, or until the listener is dropped (then `None`).
    async fn unless_closed<F: Future>(&self, f: F) -> Option<F::Output> {
        let closed = self.closed();
        let mut f = std::pin::pin!(f);
        let mut closed = std::pin::pin!(closed);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = f.as_mut().poll(cx) {
                return Poll::Ready(Some(r));
            }
            closed.as_mut().poll(cx).map(|()| None)
        })
        .await
    }

    /// Resolves when the listener is dropped.
    pub(crate) async fn closed(&self) {
        loop {
            let n = self.closing.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.is_closed() {
                return;
            }
            n.await;
        }
    }

    /// Stops the listener: its door closes, waiting handshakes end, and the connections it took
    /// in but did not hand out are reset. The listening socket is not this state's: it closes
    /// with the `SmcListener` (those in the kernel's queue are reset then, by the kernel), or
    /// goes on listening for whoever took it over (`into_std`) or holds it too (a socket
    /// activation manager, pre-forked workers).
    pub(crate) fn close(&self) {
        let first = !self.closed.swap(true, Ordering::AcqRel);
        if !first {
            return;
        }
        if let Some(d) = &self.door {
            d.close();
        }
        self.ready.close();
        self.closing.notify_waiters();
    }

    /// A place for an in-band handshake of a client at `peer`, or `None` when that client's
    /// host runs half the listener's handshakes (`max_pending_handshakes`) already, or all
    /// in-band clients together three quarters. The slots are shared with the door's
    /// same-host clients: one remote host that opened connections with Proposals and never
    /// confirmed (each held its slot for the handshake timeout) took every slot, and every
    /// other client went to TCP as congested. A quarter stays for the door's clients, and one
    /// address (or /64) leaves the other hosts a quarter at least; a host with several takes
    /// a share for each.
    fn inband_place(&self, peer: std::net::IpAddr, cfg: &Settings) -> Option<HostPlace> {
        let max = cfg.max_pending_handshakes;
        HostShares::take(&self.inband, peer, (max / 2).max(1), (max * 3 / 4).max(1))
    }

    /// Takes a handshake slot if one is free.
    fn try_slot(self: &Arc<Self>, max: usize) -> Option<HandshakeSlot> {
        let mut n = self.in_flight.load(Ordering::Acquire);
        loop {
            if n >= max {
                return None;
            }
            match self.in_flight.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(HandshakeSlot(self.clone())),
                Err(cur) => n = cur,
            }
        }
    }

    /// A place among the handshakes that wait for RDMA link setup, or `None` when half the
    /// listener's handshake slots (`max_pending_handshakes`, at least one) wait for it
    /// already. RDMA setup runs on one thread for the process, one step at a time, and any
    /// host may send Proposals that name RDMA: without this bound, such handshakes, queued
    /// behind one another, could hold every slot of the listener and send its same-host
    /// clients to TCP as "congested".
    #[cfg(feature = "rdma")]
    fn rdma_setup(&self, cfg: &Settings) -> Option<RdmaSetup<'_>> {
        let max = (cfg.max_pending_handshakes / 2).max(1);
        self.rdma_setups
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| RdmaSetup(&self.rdma_setups))
    }

    /// Admits a connection to a handshake: a slot at once; or, when all are taken,
    /// "congested" (`limit_handshake` on: no SMC, TCP now), or a place in a queue as long as
    /// the bound (off), or a refusal when the queue is full too.
    pub(crate) fn admit(self: &Arc<Self>, cfg: &Settings) -> Admit {
        // At least 1 (`Settings::bounded`).
        let max = cfg.max_pending_handshakes;
        if let Some(slot) = self.try_slot(max) {
            return Admit::Now(slot);
        }
        if cfg.limit_handshake {
            return Admit::Congested;
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= max {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Admit::Refuse;
        }
        Admit::Queue(QueueTicket(self.clone()))
    }
}

/// The answer of [`ListenerShared::admit`].
pub(crate) enum Admit {
    Now(HandshakeSlot),
    Queue(QueueTicket),
    Congested,
    Refuse,
}

/// A place in the queue for a handshake slot (`limit_handshake` off).
pub(crate) struct QueueTicket(Arc<ListenerShared>);

impl QueueTicket {
    /// Waits for a slot; `None` when the listener closes first.
    pub(crate) async fn slot(self, cfg: &Settings) -> Option<HandshakeSlot> {
        // At least 1 (`Settings::bounded`).
        let max = cfg.max_pending_handshakes;
        loop {
            let freed = self.0.freed.notified();
            if self.0.is_closed() {
                return None;
            }
            if let Some(slot) = self.0.try_slot(max) {
                return Some(slot);
            }
            let closed = self.0.closed();
            tokio::pin!(freed, closed);
            let closed_first = std::future::poll_fn(|cx| {
                if closed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                freed.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if closed_first {
                return None;
            }
        }
    }
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A running handshake's place under `max_pending_handshakes`.
pub(crate) struct HandshakeSlot(Arc<ListenerShared>);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

/// Finished connections waiting for `accept`, and who waits for them.
pub(crate) struct ReadyQueue {
    inner: Mutex<ReadyInner>,
    /// How many connections it holds at most ([`READY_CAP`]).
    cap: usize,
}

impl Default for ReadyQueue {
    fn default() -> Self {
        ReadyQueue::with_cap(READY_CAP)
    }
}

#[derive(Default)]
struct ReadyInner {
    items: VecDeque<Ready>,
    /// `accept()` futures waiting, by id: every one is woken when a connection arrives, so
    /// none is left asleep while another is cancelled.
    waiters: Vec<(u64, Waker)>,
    next_id: u64,
    /// The waker of the latest `poll_accept` call (tokio's contract for it).
    poll_waker: Option<Waker>,
    /// The listener task, waiting for room.
    room_waker: Option<Waker>,
    closed: bool,
}

/// Who is polling for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiter {
    /// `poll_accept`: one slot, the latest call's waker.
    Poll,
    /// An `accept()` future, registered under this id (0: not yet).
    Future(u64),
}

impl ReadyQueue {
    /// A queue that holds at most `cap` connections (at least one).
    pub(crate) fn with_cap(cap: usize) -> ReadyQueue {
        ReadyQueue { inner: Mutex::default(), cap: cap.max(1) }
    }

    /// Whether it holds as many connections as it may.
    pub(crate) fn is_full(&self) -> bool {
        self.lock().items.len() >= self.cap
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReadyInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, item: Ready) {
        let wakers = {
            let mut q = self.lock();
            if q.closed {
                // A handshake that ended as the listener closed: nobody will take it.
                drop(q);
                item.0.reset();
                return;
            }
            q.items.push_back(item);
            let mut w: Vec<Waker> = q.waiters.drain(..).map(|(_, w)| w).collect();
            w.extend(q.poll_waker.take());
            w
        };
        for w in wakers {
            w.wake();
        }
    }

    /// The next connection, or registers `waiter`'s waker.
    pub(crate) fn pop_or_wait(&self, cx: &mut std::task::Context<'_>, waiter: &mut Waiter) -> Option<Ready> {
        let mut q = self.lock();
        if let Some(item) = q.items.pop_front() {
            if let Some(w) = q.room_waker.take() {
                w.wake();
            }
            return Some(item);
        }
        match waiter {
            Waiter::Poll => q.poll_waker = Some(cx.waker().clone()),
            Waiter::Future(id) => {
                if *id == 0 {
                    q.next_id += 1;
                    *id = q.next_id;
                }
                let id = *id;
                match q.waiters.iter_mut().find(|(i, _)| *i == id) {
                    Some((_, w)) => w.clone_from(cx.waker()),
                    None => q.waiters.push((id, cx.waker().clone())),
                }
            }
        }
        None
    }

    pub(crate) fn forget(&self, id: u64) {
        if id != 0 {
            self.lock().waiters.retain(|(i, _)| *i != id);
        }
    }

    /// Wakes every task waiting for a connection without giving it one: each tries the
    /// kernel's queue itself, and meets what the listener task met there (EMFILE, say), as
    /// tokio's accept callers do.
    fn wake_waiters(&self) {
        let wakers = {
            let mut q = self.lock();
            let mut w: Vec<Waker> = q.waiters.drain(..).map(|(_, w)| w).collect();
            w.extend(q.poll_waker.take());
            w
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    fn poll_room(&self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let mut q = self.lock();
        if q.items.len() < self.cap || q.closed {
            return Poll::Ready(());
        }
        q.room_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn close(&self) {
        let (items, wakers) = {
            let mut q = self.lock();
            q.closed = true;
            let mut w: Vec<Waker> = q.waiters.drain(..).map(|(_, w)| w).collect();
            w.extend(q.poll_waker.take());
            (std::mem::take(&mut q.items), w)
        };
        // Connections nobody will accept are reset, as the kernel resets those left in a
        // closed listener's queue.
        items.into_iter().for_each(|(e, _)| e.reset());
        for w in wakers {
            w.wake();
        }
    }
}

/// Connections the listener's task takes from the kernel per wake-up before it yields to other
/// tasks (so a storm of connections cannot starve the connections already established).
pub(crate) const ACCEPT_BATCH: usize = 64;

/// Rounds of reading the door per turn of the listener's task: each round looks at every door
/// connection that is ready, within the turn's bound of messages in all
/// ([`TURN_READS`](crate::door::TURN_READS)). Clients that keep sending get the rest of their
/// messages read at the next turn, after the accepts.
const DOOR_ROUNDS: usize = 4;

/// The listener's task: takes connections from the kernel while there is room for them, lets
/// the door take registrations in, and sweeps stale ones. The two queues are served in turns
/// that alternate which goes first: every ready descriptor polled costs a unit of the runtime's
/// cooperative budget, and with the door always first, clients that kept enough door
/// connections readable left none for the accepts.
///
/// Its end otherwise than at the listener's close (dropped unfinished with its runtime, or
/// unwound by a panic: a runtime without timers panics at the door's first timer) ends the
/// listener ([`Orphan`]).
pub(crate) fn run(shared: Arc<ListenerShared>, tcp: std::sync::Weak<TcpListener>) -> impl Future<Output = ()> + Send {
    const PANICKED: &str =
        "the smc listener's task panicked (a runtime built without `enable_time`?): it accepts no more";
    const SHUT_DOWN: &str = "the runtime the smc listener was bound on shut down: it accepts no more";
    orphaning(&shared, PANICKED, Some(SHUT_DOWN), turns(shared.clone(), tcp))
}

/// The listener task's turns, until the listener closes (or is dropped: `tcp` is the
/// listener's, held only for a turn).
async fn turns(shared: Arc<ListenerShared>, tcp: std::sync::Weak<TcpListener>) {
    let mut sweep: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut backoff: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut door_backoff: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut door_first = false;
    std::future::poll_fn(|cx| {
        let Some(tcp) = tcp.upgrade().filter(|_| !shared.is_closed()) else {
            return Poll::Ready(());
        };
        door_first = !door_first;
        if let Some(door) = &shared.door {
            door.begin_turn();
        }
        if door_first {
            poll_door(&shared, cx, &mut door_backoff, &mut sweep);
        }
        poll_accepts(&shared, &tcp, cx, &mut backoff);
        if !door_first {
            poll_door(&shared, cx, &mut door_backoff, &mut sweep);
        }
        Poll::Pending
    })
    .await
}

/// The accepts of one turn of the listener's task: up to [`ACCEPT_BATCH`] connections, while
/// there is room for them. Leaves the task to be woken when there is more to do.
fn poll_accepts(
    shared: &Arc<ListenerShared>,
    tcp: &TcpListener,
    cx: &mut std::task::Context<'_>,
    backoff: &mut Option<Pin<Box<tokio::time::Sleep>>>,
) {
    // After an accept error (EMFILE and the like), back off instead of spinning on a queue
    // that stays readable; the connections stay in the kernel's queue meanwhile. The door
    // backs off on its own: a door that fails does not stop TCP connections from being taken.
    if let Some(b) = backoff {
        if b.as_mut().poll(cx).is_pending() {
            return;
        }
        *backoff = None;
    }
    for _ in 0..ACCEPT_BATCH {
        // A listener closed during this turn (dropped, or turned into a std one, on another
        // worker) takes no more: the rest are for the socket's other holders, or its new one.
        if shared.is_closed() || shared.ready.poll_room(cx).is_pending() {
            return;
        }
        match tcp.poll_accept(cx) {
            Poll::Ready(Ok((tcp, peer))) => {
                if let Handoff::Now(s) = admit(shared, tcp, peer) {
                    shared.deliver(s, peer);
                }
            }
            Poll::Ready(Err(e)) => {
                // `accept` callers get such errors themselves: those waiting try again.
                tracing::debug!(error = %e, "accept");
                shared.ready.wake_waiters();
                *backoff = Some(Box::pin(tokio::time::sleep(Duration::from_millis(10))));
                cx.waker().wake_by_ref();
                return;
            }
            Poll::Pending => return,
        }
    }
    // A full batch: let other tasks run, then go on.
    cx.waker().wake_by_ref();
}

/// The door's part of one turn of the listener's task: new door connections and their
/// messages ([`DOOR_ROUNDS`]), early registrations started, stale ones swept.
fn poll_door(
    shared: &Arc<ListenerShared>,
    cx: &mut std::task::Context<'_>,
    door_backoff: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    sweep: &mut Option<Pin<Box<tokio::time::Sleep>>>,
) {
    if door_backoff.as_mut().is_some_and(|b| b.as_mut().poll(cx).is_ready()) {
        *door_backoff = None;
    }
    let Some(door) = shared.door.as_ref() else { return };
    // Backing off takes no new door connections (the closers congested, no descriptor), but
    // reads those held: their clients' handshakes would wait out the backoff otherwise.
    let mut accept = door_backoff.is_none();
    let mut rounds = 0;
    let mut budget = crate::door::TURN_READS;
    loop {
        match door.poll_drain(cx, &mut budget, accept) {
            // A full batch: take TCP connections too, then come back.
            Poll::Ready(Ok(true)) => {
                cx.waker().wake_by_ref();
                break;
            }
            Poll::Ready(Ok(false)) => {
                rounds += 1;
                if rounds == DOOR_ROUNDS {
                    cx.waker().wake_by_ref();
                    break;
                }
            }
            Poll::Ready(Err(e)) => {
                tracing::debug!(error = %e, "door");
                let wait = if e.kind() == std::io::ErrorKind::ResourceBusy {
                    crate::sys::CONGESTED_RETRY
                } else {
                    Duration::from_millis(10)
                };
                let mut b = Box::pin(tokio::time::sleep(wait));
                // Registers the wake at its end.
                let _ = b.as_mut().poll(cx);
                *door_backoff = Some(b);
                if !accept {
                    break;
                }
                // The held connections once more, not taking new ones: a connection read empty
                // above had its readiness used up, and is watched again only once polled
                // Pending (its next registration would wait out the backoff otherwise).
                accept = false;
            }
            Poll::Pending => break,
        }
    }
    for reg in door.take_early() {
        start_early(shared, reg);
    }
    if door.pending() > 0 {
        let t = sweep.get_or_insert_with(|| Box::pin(tokio::time::sleep(DOOR_SWEEP)));
        if t.as_mut().poll(cx).is_ready() {
            *sweep = None;
            door.sweep();
            cx.waker().wake_by_ref();
        }
    }
}
