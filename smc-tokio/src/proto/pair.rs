//! A test harness for the sans-IO core: two machines wired back to back on a clock the caller
//! moves, as a driver would wire them to a socket and a timer.
//!
//! [`HandshakePair`] is a client and a server handshake; [`EnginePair`] is the two ends of a
//! connection's flow control. Nothing here does I/O or reads a clock: bytes move when a
//! `to_*`/[`flush`] call says so, and time is whatever [`HandshakePair::now`] holds. The crate's
//! own tests and examples use it; it serves anyone who drives the machines over another
//! transport and wants to test that driver's decisions.
//!
//! # Examples
//!
//! ```
//! use smc_tokio::proto::handshake::{Outcome, ServerEvent};
//! use smc_tokio::proto::pair::{shm_link, HandshakePair};
//!
//! let mut p = HandshakePair::new();
//! p.to_server(); // the Proposal
//! let Some(ServerEvent::Proposal(_)) = p.server.poll_event() else { panic!() };
//! p.server.accept(shm_link(1), p.now);
//! p.to_client(); // the Accept
//! p.client.poll_event().unwrap();
//! p.client.confirm(shm_link(2), p.now);
//! p.to_server(); // the Confirm
//! p.server.poll_event().unwrap();
//! p.server.commit(p.now);
//! p.to_client(); // the Commit
//! assert!(matches!(p.client.outcome(), Some(Outcome::Smc { .. })));
//! assert!(matches!(p.server.outcome(), Some(Outcome::Smc { .. })));
//! ```

use std::time::{Duration, Instant};

use crate::proto::cdc::CdcMsg;
use crate::proto::clc::{LinkInfo, Proposal, Secret, ShmLinkInfo, ShmOffer};
use crate::proto::cursor::RingSize;
use crate::proto::engine::{CdcEffect, ConnEngine};
use crate::proto::handshake::{ClientHandshake, ServerHandshake, Timeouts};

/// The bound on each handshake step in a [`HandshakePair`]: 2 s, long enough that no step of an
/// example or test times out unless it moves the clock on purpose.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(2);

/// The secret a [`HandshakePair`]'s client proposes with.
pub const PAIR_SECRET: Secret = Secret([7; 16]);

/// A shared-memory link description naming RMB slot `rmb_slot` (link group 1, 4 KiB rings, no
/// side-channel name), as a side accepts or confirms with.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::LinkInfo;
///
/// let LinkInfo::Shm(info) = smc_tokio::proto::pair::shm_link(3) else { panic!() };
/// assert_eq!((info.link_group, info.rmb_slot, info.rmb_size), (1, 3, 4096));
/// ```
pub fn shm_link(rmb_slot: u32) -> LinkInfo {
    LinkInfo::Shm(ShmLinkInfo { link_group: 1, rmb_slot, rmb_size: 4096, socket_name: Vec::new() })
}

/// A shared-memory Proposal with [`PAIR_SECRET`], 4 KiB rings, for a new link group.
pub fn shm_proposal() -> Proposal {
    Proposal { secret: PAIR_SECRET, rmb_size: 4096, shm: Some(ShmOffer { link_group: 0 }), rdma: None }
}

/// A handshake machine that takes its peer's bytes (both machines do).
pub trait TakesInput {
    /// How many bytes the machine wants next (0: none now).
    fn wanted(&self) -> usize;
    /// Hands it bytes at `now`; returns how many it took.
    fn handle_input(&mut self, data: &[u8], now: Instant) -> usize;
}

impl TakesInput for ClientHandshake {
    fn wanted(&self) -> usize {
        ClientHandshake::wanted(self)
    }
    fn handle_input(&mut self, data: &[u8], now: Instant) -> usize {
        ClientHandshake::handle_input(self, data, now)
    }
}

impl TakesInput for ServerHandshake {
    fn wanted(&self) -> usize {
        ServerHandshake::wanted(self)
    }
    fn handle_input(&mut self, data: &[u8], now: Instant) -> usize {
        ServerHandshake::handle_input(self, data, now)
    }
}

/// Hands `bytes` to `hs` as a driver reads a stream: as much as it wants at a time, until it
/// wants no more or the bytes run out. Returns how many bytes it did not take.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::{ClcMessage, Decline, DeclineReason};
/// use smc_tokio::proto::pair::{feed, HandshakePair, PAIR_SECRET};
///
/// let mut p = HandshakePair::new();
/// let decline = ClcMessage::Decline(Decline { secret: PAIR_SECRET, reason: DeclineReason::PeerNoSmc });
/// let mut bytes = decline.encode().unwrap();
/// bytes.extend_from_slice(b"GET / HTTP/1.1"); // what follows is not the handshake's
/// assert_eq!(feed(&mut p.client, &bytes, p.now), 14);
/// assert!(p.client.is_done());
/// ```
pub fn feed(hs: &mut impl TakesInput, bytes: &[u8], now: Instant) -> usize {
    let mut at = 0;
    while hs.wanted() > 0 && at < bytes.len() {
        let n = hs.wanted().min(bytes.len() - at);
        at += hs.handle_input(&bytes[at..at + n], now);
    }
    bytes.len() - at
}

/// A client and a server handshake on one clock. The client's Proposal is queued at creation;
/// nothing moves until [`to_server`](Self::to_server) or [`to_client`](Self::to_client).
#[derive(Debug)]
pub struct HandshakePair {
    /// The client's machine.
    pub client: ClientHandshake,
    /// The server's machine.
    pub server: ServerHandshake,
    /// The pair's clock: what every call of the harness passes as `now`.
    pub now: Instant,
    /// The bounds both machines were made with ([`PAIR_TIMEOUT`] for every step).
    pub timeouts: Timeouts,
}

impl Default for HandshakePair {
    fn default() -> Self {
        HandshakePair::new()
    }
}

impl HandshakePair {
    /// A client proposing [`shm_proposal`] and a server waiting for it.
    pub fn new() -> HandshakePair {
        HandshakePair::with_proposal(shm_proposal())
    }

    /// A client proposing `proposal` and a server waiting for it.
    ///
    /// # Panics
    ///
    /// If `proposal` cannot be encoded (a ring size that is not a power of two, say).
    pub fn with_proposal(proposal: Proposal) -> HandshakePair {
        let now = Instant::now();
        let timeouts = Timeouts::uniform(PAIR_TIMEOUT);
        let client = ClientHandshake::new(proposal, now, timeouts).expect("an encodable proposal");
        HandshakePair { client, server: ServerHandshake::new(now, timeouts), now, timeouts }
    }

    /// Moves what the client has to send into the server; returns the bytes it did not take.
    pub fn to_server(&mut self) -> usize {
        let bytes = self.client.poll_transmit().unwrap_or_default();
        feed(&mut self.server, &bytes, self.now)
    }

    /// Moves what the server has to send into the client; returns the bytes it did not take.
    pub fn to_client(&mut self) -> usize {
        let bytes = self.server.poll_transmit().unwrap_or_default();
        feed(&mut self.client, &bytes, self.now)
    }

    /// Moves the clock on by `d` and tells both machines the time.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::handshake::{HandshakeError, Outcome};
    /// use smc_tokio::proto::pair::HandshakePair;
    ///
    /// let mut p = HandshakePair::new();
    /// p.advance(p.timeouts.peer); // the server never answers
    /// assert_eq!(p.client.outcome(), Some(&Outcome::Failed(HandshakeError::Timeout)));
    /// ```
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
    }
}

/// The two ends of one connection's flow control: `a` (token 1) writes into `b`'s ring and
/// reads from its own, and `b` (token 2) the other way; both rings are `ring` bytes.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::pair::{flush, EnginePair};
///
/// let EnginePair { mut a, mut b, .. } = EnginePair::new(4096);
/// a.tx_commit(100).unwrap(); // 100 bytes written into b's ring
/// flush(&mut a, &mut b); // a's CDC message tells b
/// assert_eq!(b.rx_available(), 100);
/// ```
#[derive(Debug)]
pub struct EnginePair {
    /// One end (token 1).
    pub a: ConnEngine,
    /// The other end (token 2).
    pub b: ConnEngine,
    /// The size of both rings.
    pub ring: RingSize,
}

impl EnginePair {
    /// Two ends with rings of `ring` bytes.
    ///
    /// # Panics
    ///
    /// If `ring` is not a valid ring size (see [`RingSize::new`]).
    pub fn new(ring: u32) -> EnginePair {
        let ring = RingSize::new(ring).expect("a valid ring size");
        EnginePair { a: ConnEngine::new(1, ring, ring), b: ConnEngine::new(2, ring, ring), ring }
    }
}

/// Delivers every CDC message `from` owes to `to`, in order, as a link would; returns what each
/// did at `to`.
///
/// # Panics
///
/// If `to` refuses a message (out of sequence, out of bounds): between two engines of one pair
/// that is a bug in the engine.
pub fn flush(from: &mut ConnEngine, to: &mut ConnEngine) -> Vec<CdcEffect> {
    let mut effects = Vec::new();
    while let Some(msg) = from.poll_cdc() {
        from.on_cdc_sent(&msg);
        effects.push(deliver(to, &msg));
    }
    effects
}

fn deliver(to: &mut ConnEngine, msg: &CdcMsg) -> CdcEffect {
    match to.on_cdc(msg) {
        Ok((effect, _)) => effect,
        Err(e) => panic!("the peer engine refused a CDC message of its pair: {e}"),
    }
}
