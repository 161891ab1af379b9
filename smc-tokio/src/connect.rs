//! One client connection's establishment, start to finish.
//!
//! ```text
//! policy TcpOnly ─────────────────────────────────────────────▶ plain connect (Disabled)
//! a door at the destination (same host, trusted owner)?
//!   yes: bind, register the socket at the door, connect, wait for the verdict
//!        Matched ──▶ CLC in-band (Proposal ▶ Accept ▶ Confirm ▶ Commit) ──▶ SMC or TCP in step
//!        Unmatched / Gone / no verdict in time ──▶ TCP (nothing was sent)
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::config::{Policy, Settings};
use crate::door::{self, Registered, Verdict};
use crate::error::SmcError;
use crate::handshake::{advance, Step};
use crate::negative_cache::NegativeCache;
use crate::net::SmcStream;
use crate::proto::clc::{DeclineReason, LinkInfo, Proposal};
use crate::proto::handshake::{ClientEvent, ClientHandshake, HandshakeError, Outcome, Side, Timeouts};
use crate::smc::conn::{PendingConn, SmcConn};
use crate::smc::manager::Manager;
use crate::stats::{self, DoorEvent};
use crate::sys;
use crate::transport::{FallbackReason, Transport};

/// Client handshakes running in this process.
static CLIENT_HANDSHAKES: AtomicUsize = AtomicUsize::new(0);

/// One client handshake's place under `max_pending_handshakes`.
struct ClientSlot;

impl ClientSlot {
    /// A place, or `None` when the builder turned `limit_handshake` on and all places are
    /// taken. (The process-wide `limit_handshake` governs listeners, as the kernel's
    /// `SMC_LIMIT_HS` does; a client opts in per builder.)
    fn take(limit: bool, cfg: &Settings) -> Option<ClientSlot> {
        let n = CLIENT_HANDSHAKES.fetch_add(1, Ordering::AcqRel);
        if limit && n >= cfg.max_pending_handshakes {
            CLIENT_HANDSHAKES.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ClientSlot)
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        CLIENT_HANDSHAKES.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Connects with `addr` with SMC settings `cfg` (`limit`: the builder turned
/// `limit_handshake` on).
pub(crate) async fn establish(addr: SocketAddr, cfg: &Settings, limit: bool) -> io::Result<SmcStream> {
    if cfg.policy == Policy::TcpOnly {
        return plain(cfg, addr, FallbackReason::Disabled).await;
    }
    let Some(_slot) = ClientSlot::take(limit, cfg) else {
        // Too many client handshakes in flight: this one goes plain at once.
        return plain(
            cfg,
            addr,
            FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local },
        )
        .await;
    };
    // A server that failed an in-band handshake, or whose SMC connections keep ending too
    // soon to pay off (adaptive fallback), is left alone for a while.
    if NegativeCache::global().contains(addr, Instant::now()) {
        return plain(cfg, addr, FallbackReason::NegativeCache).await;
    }
    // The verbs library is loaded before the connection exists, off the runtime.
    #[cfg(feature = "rdma")]
    crate::smc::rdma::warm_up(cfg).await;
    if let Some(s) = via_door(addr, cfg).await? {
        return Ok(s);
    }
    let inband = cfg.policy.proposes_everywhere() || cfg.inband_peers.contains(addr.ip());
    if !inband {
        return plain(cfg, addr, FallbackReason::NotProposed).await;
    }
    let tcp = TcpStream::connect(addr).await?;
    let shaken = handshake(tcp, addr, cfg, false).await;
    finish_inband(cfg, addr, shaken).await
}

/// A plain TCP connection (or, under [`Policy::Never`], the error that SMC was refused).
async fn plain(cfg: &Settings, addr: SocketAddr, reason: FallbackReason) -> io::Result<SmcStream> {
    if cfg.policy == Policy::Never {
        return Err(SmcError::FallbackRefused(reason).into());
    }
    Ok(SmcStream::from_tcp(TcpStream::connect(addr).await?, Transport::Tcp(reason)))
}

fn tcp_or_refuse(cfg: &Settings, tcp: TcpStream, reason: FallbackReason) -> io::Result<SmcStream> {
    if cfg.policy == Policy::Never {
        return Err(SmcError::FallbackRefused(reason).into());
    }
    Ok(SmcStream::from_tcp(tcp, Transport::Tcp(reason)))
}

/// Times a port this client picked is found taken at connect (its last connection's 4-tuple
/// still in TIME_WAIT) before it connects without registering.
const PORT_ATTEMPTS: usize = 4;

/// The same-host path. `None`: the destination has no door we trust; nothing was sent.
async fn via_door(addr: SocketAddr, cfg: &Settings) -> io::Result<Option<SmcStream>> {
    let offers = cfg.shm.enabled || cfg!(feature = "rdma") && cfg.rdma.enabled;
    if !offers {
        return Ok(None);
    }
    let manager = Manager::global();
    for attempt in 0.. {
        let (mut reg, sock) = match door::register(addr, &cfg.shm.allowed_uids, manager.instance()) {
            Registered::Yes(reg, sock) => (reg, sock),
            Registered::NoDoor => return Ok(None),
            Registered::Busy => {
                // The listener is swamped: plain TCP now, as its own congestion decline would.
                let reason = FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local };
                return plain(cfg, addr, reason).await.map(Some);
            }
        };
        stats::door(DoorEvent::Registered);
        let tcp = match tokio::net::TcpSocket::from_std_stream(sock.into()).connect(addr).await {
            Ok(t) => t,
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) && attempt + 1 < PORT_ATTEMPTS => {
                reg.cancel();
                continue;
            }
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                reg.cancel();
                tracing::debug!("no free port to register: connecting as plain tcp");
                return plain(
                    cfg,
                    addr,
                    FallbackReason::Declined { reason: DeclineReason::OutOfMemory, by: Side::Local },
                )
                .await
                .map(Some);
            }
            Err(e) => {
                reg.cancel();
                return Err(e);
            }
        };
        // The listener answers when it accepts the connection: microseconds when it runs, later
        // when it is busy or stopped, or when its accept queue overflowed (the kernel then
        // drops our final ACK and takes the connection at its SYN-ACK retransmit, 1 s later;
        // a plain client's first data would nudge it sooner, and we send none). Past the
        // handshake timeout we stop waiting and stay on TCP: overload is never an error.
        let verdict = reg.verdict(cfg.handshake_timeout).await;
        tracing::debug!(?verdict, "door verdict");
        let reason = match verdict {
            Verdict::Matched => {
                let shaken = handshake(tcp, addr, cfg, true).await;
                return finish_registered(cfg, shaken).map(Some);
            }
            Verdict::Unmatched(r) => {
                stats::decline(r, Side::Peer);
                FallbackReason::Declined { reason: r, by: Side::Peer }
            }
            Verdict::TimedOut => {
                stats::door(DoorEvent::TimedOut);
                FallbackReason::Declined { reason: DeclineReason::Timeout, by: Side::Local }
            }
            Verdict::Gone => FallbackReason::PeerNoSmc,
        };
        return tcp_or_refuse(cfg, tcp, reason).map(Some);
    }
    unreachable!("the loop returns")
}

/// What a client handshake came to.
struct Shaken {
    tcp: TcpStream,
    outcome: io::Result<Outcome>,
    conn: Option<Arc<SmcConn>>,
}

/// Runs the CLC handshake on a connected `tcp`. `registered`: the server matched our door
/// registration, so shared memory is offered and the server is known to speak SMC.
async fn handshake(mut tcp: TcpStream, addr: SocketAddr, cfg: &Settings, registered: bool) -> Shaken {
    let timer = stats::HandshakeTimer::start();
    let manager = Manager::global();
    let shm = if registered { manager.client_offer(addr, &cfg.shm) } else { None };
    let (shm_offer, shm_rmb, _pin) = match shm {
        Some((o, rmb, pin)) => (Some(o), Some(rmb), pin),
        None => (None, None, None),
    };
    #[cfg(feature = "rdma")]
    let local_ip = tcp.local_addr().map(|a| a.ip());
    #[cfg(feature = "rdma")]
    let rdma = match &local_ip {
        Ok(ip) => crate::smc::rdma::client_offer(addr, *ip, shm_rmb.unwrap_or(cfg.shm.rmb_size), cfg),
        Err(_) => None,
    };
    #[cfg(not(feature = "rdma"))]
    let rdma = None;
    #[cfg(feature = "rdma")]
    let offered_rdma = rdma.is_some();
    let rmb_size = match (shm_rmb, &rdma) {
        (Some(r), _) => r,
        (None, Some(_)) => cfg.shm.rmb_size,
        _ => 0,
    };
    let token = match sys::random_token() {
        Ok(t) => t,
        Err(e) => return Shaken { tcp, outcome: Err(e), conn: None },
    };
    let proposal = Proposal { token, rmb_size, shm: shm_offer, rdma };
    // A server that matched our registration answers (or hands us out as TCP) within its own
    // bound; we wait twice that before calling it broken. An in-band server is given one bound:
    // a plain server that waits for its client never answers.
    let peer_wait = if registered { cfg.handshake_timeout * 2 + Duration::from_secs(1) } else { cfg.handshake_timeout };
    let timeouts = Timeouts { peer: peer_wait, local: cfg.handshake_timeout };
    let mut hs = match ClientHandshake::new(proposal, Instant::now(), timeouts) {
        Ok(h) => h,
        Err(e) => return Shaken { tcp, outcome: Err(SmcError::Handshake(e).into()), conn: None },
    };
    // Given back if the connect is dropped (cancelled) or ends without SMC.
    let mut pending = PendingConn::default();
    let outcome = loop {
        match advance(&mut tcp, &mut hs).await {
            Ok(Step::Event(ClientEvent::Accepted(accept))) => match &accept.link {
                LinkInfo::Shm(info) if shm_rmb.is_some() => {
                    let left =
                        hs.poll_timeout().map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
                    match manager.client_accept(addr, token, info, rmb_size, &cfg.shm, left).await {
                        Ok((conn, confirm)) => {
                            pending.set(conn);
                            hs.confirm(LinkInfo::Shm(confirm), Instant::now());
                        }
                        Err(reason) => {
                            tracing::debug!(%reason, "declining the server's shm accept");
                            hs.decline(reason, Instant::now());
                        }
                    }
                }
                #[cfg(feature = "rdma")]
                LinkInfo::Rdma(info) if offered_rdma => {
                    let ip = *local_ip.as_ref().unwrap_or(&std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
                    match crate::smc::rdma::client_accept(manager, addr, ip, info, rmb_size, cfg, cfg.handshake_timeout)
                    {
                        Ok((conn, confirm)) => {
                            pending.set(conn);
                            hs.confirm(LinkInfo::Rdma(confirm), Instant::now());
                        }
                        Err(reason) => {
                            tracing::debug!(%reason, "declining the server's rdma accept");
                            hs.decline(reason, Instant::now());
                        }
                    }
                }
                other => {
                    // A transport this client did not offer: a confused or hostile server.
                    // Decline, and stay on TCP in step.
                    tracing::debug!(link = ?other, "declining an accept for a transport we did not offer");
                    hs.decline(DeclineReason::NoCommonTransport, Instant::now());
                }
            },
            Ok(Step::Done(o)) => break Ok(o),
            Err(e) => break Err(e),
        }
    };
    match &outcome {
        Ok(Outcome::Smc { .. }) => timer.completed(),
        Ok(Outcome::Fallback { reason, by }) => {
            stats::decline(*reason, *by);
            timer.completed();
        }
        _ => drop(timer),
    }
    let conn = match &outcome {
        Ok(Outcome::Smc { .. }) => pending.take(),
        // Anything else: the slot goes back (with `pending`).
        _ => None,
    };
    Shaken { tcp, outcome, conn }
}

/// The end of a handshake with a server that matched our registration: it speaks SMC, so
/// application bytes where its reply should be mean it served us as TCP (it stopped waiting
/// for our Proposal and will drop it), and a closed connection is just that.
fn finish_registered(cfg: &Settings, s: Shaken) -> io::Result<SmcStream> {
    match s.outcome {
        Ok(Outcome::Smc { .. }) => smc_stream(s.tcp, s.conn),
        Ok(Outcome::Fallback { reason, by }) => {
            tracing::debug!(%reason, ?by, "falling back to tcp");
            tcp_or_refuse(cfg, s.tcp, FallbackReason::Declined { reason, by })
        }
        Ok(Outcome::Failed(HandshakeError::NotSmc)) => {
            tcp_or_refuse(cfg, s.tcp, FallbackReason::Declined { reason: DeclineReason::Timeout, by: Side::Peer })
        }
        // The server closed or reset the connection (its listener went away): as with TCP, the
        // connect succeeded and the application reads the end.
        Ok(Outcome::Failed(HandshakeError::Eof)) => tcp_or_refuse(cfg, s.tcp, FallbackReason::PeerNoSmc),
        Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof) => {
            tcp_or_refuse(cfg, s.tcp, FallbackReason::PeerNoSmc)
        }
        Ok(Outcome::Failed(e)) => Err(SmcError::Handshake(e).into()),
        Err(e) => Err(e),
    }
}

fn smc_stream(tcp: TcpStream, conn: Option<Arc<SmcConn>>) -> io::Result<SmcStream> {
    // The machine agreed on a link we have no connection for: cannot happen, since confirm()
    // is only called with one; fail loudly rather than pretend.
    let conn = conn.ok_or_else(|| io::Error::other("handshake agreed on a link without a connection"))?;
    let t = conn.transport();
    Ok(SmcStream::from_smc(tcp, conn, t))
}

/// How long a server whose handshake timed out is left alone at first (doubling on each further
/// timeout, up to the negative cache's TTL): a busy SMC server is retried soon, a silent plain
/// one less and less often.
const TIMEOUT_BACKOFF: Duration = Duration::from_secs(2);

/// The end of an in-band handshake, where the server may not speak SMC at all.
async fn finish_inband(cfg: &Settings, addr: SocketAddr, s: Shaken) -> io::Result<SmcStream> {
    if matches!(s.outcome, Ok(Outcome::Smc { .. } | Outcome::Fallback { .. })) {
        NegativeCache::global().answered(addr);
    }
    let err = match s.outcome {
        Ok(Outcome::Smc { .. }) => return smc_stream(s.tcp, s.conn),
        Ok(Outcome::Fallback { reason, by }) => {
            tracing::debug!(%reason, ?by, "falling back to tcp");
            return tcp_or_refuse(cfg, s.tcp, FallbackReason::Declined { reason, by });
        }
        Ok(Outcome::Failed(e)) => io::Error::from(SmcError::Handshake(e)),
        Err(e) => e,
    };
    // The server is not ours (or misbehaved) and the stream is unusable: remember it and,
    // unless the policy requires SMC, connect again as plain TCP.
    drop(s.tcp);
    let timed_out = SmcError::from_io(&err) == Some(&SmcError::Handshake(HandshakeError::Timeout));
    let cache = NegativeCache::global();
    if timed_out {
        // Silent: a plain server waiting for its client, or an SMC server too busy to answer.
        cache.insert_backoff(addr, Instant::now(), TIMEOUT_BACKOFF, cfg.negative_cache_ttl);
    } else {
        cache.insert(addr, Instant::now(), cfg.negative_cache_ttl);
    }
    tracing::debug!(%err, timed_out, "in-band peer did not complete the handshake; connecting as plain tcp");
    match cfg.policy {
        Policy::Never => Err(err),
        _ => Ok(SmcStream::from_tcp(TcpStream::connect(addr).await?, Transport::Tcp(FallbackReason::PeerNoSmc))),
    }
}
