//! The CLC handshake as two sans-IO state machines, [`ClientHandshake`] and [`ServerHandshake`].
//!
//! They own no socket and read no clock. The driver feeds them received bytes (never more than
//! [`wanted`](ClientHandshake::wanted) at a time, so that no byte after the handshake is taken
//! from the stream), the current time, and its decisions; it takes from them the bytes to send
//! ([`poll_transmit`](ClientHandshake::poll_transmit)), the next deadline
//! ([`poll_timeout`](ClientHandshake::poll_timeout)), events that need a decision
//! ([`poll_event`](ClientHandshake::poll_event)) and finally an [`Outcome`].
//!
//! ```text
//! client                                   server
//!   Proposal  ───────────────────────────▶   (event: Proposal; driver accepts or declines)
//!             ◀───────────────────────────   Accept | Decline
//!   (event: Accepted; driver confirms or declines)
//!   Confirm | Decline ───────────────────▶
//! ```
//! After a Decline both sides simply continue over TCP; after a Confirm data moves to the link.
//! Anything that leaves the stream in an unknown state (a malformed frame, a message out of
//! order, a timeout after a message was half received or an Accept was sent) ends in
//! [`Outcome::Failed`]: the connection must be closed.

use std::fmt;
use std::time::{Duration, Instant};

use super::clc::{
    decode, Accept, ClcError, ClcHeader, ClcMessage, Confirm, Decline, DeclineReason, Decoded, LinkInfo, Proposal,
    Token, CLC_HEADER_LEN,
};

/// Which side of the connection made a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// This process.
    Local,
    /// The peer.
    Peer,
}

/// How a handshake ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Both sides agreed on SMC.
    Smc {
        /// The connection token.
        token: Token,
        /// The link details this side sent.
        local: LinkInfo,
        /// The link details the peer sent.
        peer: LinkInfo,
    },
    /// A Decline was sent or received: continue over TCP; the stream is intact.
    Fallback {
        /// Why.
        reason: DeclineReason,
        /// Who declined.
        by: Side,
    },
    /// The stream is in an unknown state: close the connection.
    Failed(HandshakeError),
}

/// Why a handshake failed in a way that leaves the TCP stream unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeError {
    /// The peer's bytes are not this protocol (a plain TCP peer answered).
    NotSmc,
    /// A CLC frame could not be decoded.
    Malformed(ClcError),
    /// A message arrived that does not fit the handshake's state.
    Unexpected {
        /// What arrived.
        got: super::clc::ClcType,
    },
    /// The peer answered with another connection's token.
    TokenMismatch,
    /// The peer's Confirm named another transport than the Accept.
    TransportMismatch,
    /// The peer's Confirm does not match the link the Accept offered (link group, buffer
    /// size), or the link it names was never set up.
    ConfirmMismatch,
    /// The deadline passed while the stream was mid-message or an answer was outstanding.
    Timeout,
    /// The peer closed the connection during the handshake.
    Eof,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::NotSmc => f.write_str("peer does not speak the SMC handshake"),
            HandshakeError::Malformed(e) => write!(f, "malformed handshake message: {e}"),
            HandshakeError::Unexpected { got } => {
                write!(f, "unexpected {got:?} message in the handshake")
            }
            HandshakeError::TokenMismatch => f.write_str("handshake token mismatch"),
            HandshakeError::TransportMismatch => f.write_str("confirm names another transport than the accept"),
            HandshakeError::ConfirmMismatch => f.write_str("confirm does not match the accepted link"),
            HandshakeError::Timeout => f.write_str("handshake timed out"),
            HandshakeError::Eof => f.write_str("peer closed the connection during the handshake"),
        }
    }
}

impl std::error::Error for HandshakeError {}

/// Receive buffer shared by both roles: collects exactly one CLC message.
#[derive(Debug, Default)]
struct Inbox {
    buf: Vec<u8>,
}

enum Received {
    Partial,
    Message(ClcMessage),
    /// A message of an unsupported version, skipped whole.
    UnsupportedVersion,
}

impl Inbox {
    /// Bytes to read next: enough for the header, then exactly the rest of the message.
    fn wanted(&self) -> usize {
        if self.buf.len() < CLC_HEADER_LEN {
            return CLC_HEADER_LEN - self.buf.len();
        }
        match ClcHeader::parse(&self.buf) {
            Ok(Some(h)) => h.len.saturating_sub(self.buf.len()),
            Err(ClcError::UnsupportedVersion { len, .. }) => usize::from(len).saturating_sub(self.buf.len()),
            _ => 0,
        }
    }

    /// Takes at most `wanted()` bytes of `data`; returns how many it took and what it has.
    fn push(&mut self, data: &[u8]) -> (usize, Result<Received, HandshakeError>) {
        let take = data.len().min(self.wanted());
        self.buf.extend_from_slice(&data[..take]);
        let r = match decode(&self.buf) {
            Ok(Decoded::NeedMore(_)) => Ok(Received::Partial),
            Ok(Decoded::Message(m, _)) => {
                self.buf.clear();
                Ok(Received::Message(m))
            }
            Err(ClcError::UnsupportedVersion { len, .. }) => {
                if self.buf.len() < usize::from(len) {
                    Ok(Received::Partial)
                } else {
                    self.buf.clear();
                    Ok(Received::UnsupportedVersion)
                }
            }
            Err(ClcError::BadEyecatcher) => Err(HandshakeError::NotSmc),
            Err(e) => Err(HandshakeError::Malformed(e)),
        };
        (take, r)
    }
}

fn encode(msg: &ClcMessage) -> Result<Vec<u8>, HandshakeError> {
    msg.encode().map_err(HandshakeError::Malformed)
}

/// An event for which the driver must decide, on the client side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// The server accepted: set the link up, then call [`ClientHandshake::confirm`] or
    /// [`ClientHandshake::decline`].
    Accepted(Accept),
}

#[derive(Debug)]
enum ClientState {
    AwaitReply,
    AwaitDecision(LinkInfo),
    Done(Outcome),
}

/// The client's side of the handshake.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use smc_tokio::proto::clc::{ClcMessage, Decline, DeclineReason, Proposal, Token};
/// use smc_tokio::proto::handshake::{ClientHandshake, Outcome, Side};
///
/// let now = Instant::now();
/// let token = Token([1; 16]);
/// let proposal = Proposal { token, rmb_size: 0, shm: None, rdma: None };
/// let mut hs = ClientHandshake::new(proposal, now, Duration::from_secs(1)).unwrap();
/// let to_send = hs.poll_transmit().unwrap(); // the Proposal
/// assert!(!to_send.is_empty());
///
/// // The server declines.
/// let reply = ClcMessage::Decline(Decline { token, reason: DeclineReason::NoCommonTransport });
/// let bytes = reply.encode().unwrap();
/// let mut at = 0;
/// while hs.wanted() > 0 {
///     let n = hs.wanted().min(bytes.len() - at);
///     at += hs.handle_input(&bytes[at..at + n]);
/// }
/// assert_eq!(
///     hs.outcome(),
///     Some(&Outcome::Fallback { reason: DeclineReason::NoCommonTransport, by: Side::Peer })
/// );
/// ```
#[derive(Debug)]
pub struct ClientHandshake {
    token: Token,
    state: ClientState,
    deadline: Instant,
    inbox: Inbox,
    transmit: Vec<u8>,
    event: Option<ClientEvent>,
}

impl ClientHandshake {
    /// Starts a handshake: queues the Proposal; the whole handshake must end by `now + timeout`.
    pub fn new(proposal: Proposal, now: Instant, timeout: Duration) -> Result<Self, HandshakeError> {
        let transmit = encode(&ClcMessage::Proposal(proposal.clone()))?;
        Ok(Self {
            token: proposal.token,
            state: ClientState::AwaitReply,
            deadline: now + timeout,
            inbox: Inbox::default(),
            transmit,
            event: None,
        })
    }

    /// The connection token.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Bytes to send now, if any.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        (!self.transmit.is_empty()).then(|| std::mem::take(&mut self.transmit))
    }

    /// An event that needs the driver's decision.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.event.take()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called, if the handshake is not done.
    pub fn poll_timeout(&self) -> Option<Instant> {
        (!self.is_done()).then_some(self.deadline)
    }

    /// How many bytes to read from the stream next (0: read nothing now).
    pub fn wanted(&self) -> usize {
        match self.state {
            ClientState::AwaitReply => self.inbox.wanted(),
            _ => 0,
        }
    }

    /// Feeds received bytes; returns how many were used (at most [`wanted`](Self::wanted)).
    /// An empty `data` means the peer closed the stream.
    pub fn handle_input(&mut self, data: &[u8]) -> usize {
        if !matches!(self.state, ClientState::AwaitReply) {
            return 0;
        }
        if data.is_empty() {
            self.finish(Outcome::Failed(HandshakeError::Eof));
            return 0;
        }
        let (used, r) = self.inbox.push(data);
        match r {
            Ok(Received::Partial) => {}
            // Servers answer in the client's version; another one is a protocol violation.
            Ok(Received::UnsupportedVersion) => {
                self.finish(Outcome::Failed(HandshakeError::Malformed(ClcError::BadField("reply version"))))
            }
            Ok(Received::Message(ClcMessage::Accept(a))) if a.token == self.token => {
                self.state = ClientState::AwaitDecision(a.link.clone());
                self.event = Some(ClientEvent::Accepted(a));
            }
            Ok(Received::Message(ClcMessage::Decline(d))) if d.token == self.token => {
                self.finish(Outcome::Fallback { reason: d.reason, by: Side::Peer })
            }
            Ok(Received::Message(ClcMessage::Accept(_) | ClcMessage::Decline(_))) => {
                self.finish(Outcome::Failed(HandshakeError::TokenMismatch))
            }
            Ok(Received::Message(m)) => self.finish(Outcome::Failed(HandshakeError::Unexpected { got: m.kind() })),
            Err(e) => self.finish(Outcome::Failed(e)),
        }
        used
    }

    /// Confirms an Accept with this side's link details: the outcome becomes [`Outcome::Smc`].
    /// Does nothing unless an [`ClientEvent::Accepted`] is waiting for a decision.
    pub fn confirm(&mut self, local: LinkInfo) {
        let ClientState::AwaitDecision(peer) = &self.state else {
            return;
        };
        if !peer.same_transport(&local) {
            return self.decline(DeclineReason::Internal);
        }
        let peer = peer.clone();
        match encode(&ClcMessage::Confirm(Confirm { token: self.token, link: local.clone() })) {
            Ok(b) => {
                self.transmit = b;
                self.finish(Outcome::Smc { token: self.token, local, peer });
            }
            Err(_) => self.decline(DeclineReason::Internal),
        }
    }

    /// Declines an Accept: the outcome becomes a local fallback. Does nothing unless a decision
    /// is pending.
    pub fn decline(&mut self, reason: DeclineReason) {
        if !matches!(self.state, ClientState::AwaitDecision(_)) {
            return;
        }
        self.transmit = decline_bytes(self.token, reason);
        self.finish(Outcome::Fallback { reason, by: Side::Local });
    }

    /// Tells the machine the time. Past the deadline: waiting for the reply fails the
    /// connection (the server may still answer); a pending local decision declines with
    /// [`DeclineReason::Timeout`] (the stream is still in step).
    pub fn handle_timeout(&mut self, now: Instant) {
        if now < self.deadline {
            return;
        }
        match self.state {
            ClientState::AwaitReply => self.finish(Outcome::Failed(HandshakeError::Timeout)),
            ClientState::AwaitDecision(_) => self.decline(DeclineReason::Timeout),
            ClientState::Done(_) => {}
        }
    }

    /// Whether the handshake has ended.
    pub fn is_done(&self) -> bool {
        matches!(self.state, ClientState::Done(_))
    }

    /// The outcome, once done. Bytes from [`poll_transmit`](Self::poll_transmit) must still be
    /// sent before acting on it.
    pub fn outcome(&self) -> Option<&Outcome> {
        match &self.state {
            ClientState::Done(o) => Some(o),
            _ => None,
        }
    }

    fn finish(&mut self, o: Outcome) {
        self.event = None;
        self.state = ClientState::Done(o);
    }
}

fn decline_bytes(token: Token, reason: DeclineReason) -> Vec<u8> {
    // A Decline has no variable fields, so it always encodes.
    ClcMessage::Decline(Decline { token, reason }).encode().unwrap_or_default()
}

/// An event for which the driver must decide, on the server side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// A client proposed: choose a transport and call [`ServerHandshake::accept`], or call
    /// [`ServerHandshake::decline`].
    Proposal(Proposal),
}

#[derive(Debug)]
enum ServerState {
    AwaitProposal,
    AwaitDecision,
    AwaitConfirm(LinkInfo),
    Done(Outcome),
}

/// The server's side of the handshake. Start it once the stream's first bytes matched the
/// eyecatcher.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use smc_tokio::proto::clc::{decode, ClcMessage, Decoded, DeclineReason, Proposal, Token};
/// use smc_tokio::proto::handshake::{Outcome, ServerEvent, ServerHandshake, Side};
///
/// let now = Instant::now();
/// let mut hs = ServerHandshake::new(now, Duration::from_secs(1));
/// let proposal = Proposal { token: Token([9; 16]), rmb_size: 0, shm: None, rdma: None };
/// let bytes = ClcMessage::Proposal(proposal.clone()).encode().unwrap();
/// let mut at = 0;
/// while hs.wanted() > 0 {
///     let n = hs.wanted();
///     at += hs.handle_input(&bytes[at..at + n]);
/// }
/// assert_eq!(hs.poll_event(), Some(ServerEvent::Proposal(proposal)));
/// hs.decline(DeclineReason::NoCommonTransport);
/// let reply = hs.poll_transmit().unwrap();
/// assert!(matches!(decode(&reply).unwrap(), Decoded::Message(ClcMessage::Decline(_), _)));
/// assert_eq!(
///     hs.outcome(),
///     Some(&Outcome::Fallback { reason: DeclineReason::NoCommonTransport, by: Side::Local })
/// );
/// ```
#[derive(Debug)]
pub struct ServerHandshake {
    token: Token,
    state: ServerState,
    deadline: Instant,
    inbox: Inbox,
    transmit: Vec<u8>,
    event: Option<ServerEvent>,
}

impl ServerHandshake {
    /// Starts waiting for a Proposal; the whole handshake must end by `now + timeout`.
    pub fn new(now: Instant, timeout: Duration) -> Self {
        Self {
            token: Token::default(),
            state: ServerState::AwaitProposal,
            deadline: now + timeout,
            inbox: Inbox::default(),
            transmit: Vec::new(),
            event: None,
        }
    }

    /// The connection token (zero until the Proposal has arrived).
    pub fn token(&self) -> Token {
        self.token
    }

    /// Bytes to send now, if any.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        (!self.transmit.is_empty()).then(|| std::mem::take(&mut self.transmit))
    }

    /// An event that needs the driver's decision.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.event.take()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called, if not done.
    pub fn poll_timeout(&self) -> Option<Instant> {
        (!self.is_done()).then_some(self.deadline)
    }

    /// How many bytes to read from the stream next (0: read nothing now).
    pub fn wanted(&self) -> usize {
        match self.state {
            ServerState::AwaitProposal | ServerState::AwaitConfirm(_) => self.inbox.wanted(),
            _ => 0,
        }
    }

    /// Feeds received bytes; returns how many were used. An empty `data` means EOF.
    pub fn handle_input(&mut self, data: &[u8]) -> usize {
        if !matches!(self.state, ServerState::AwaitProposal | ServerState::AwaitConfirm(_)) {
            return 0;
        }
        if data.is_empty() {
            self.finish(Outcome::Failed(HandshakeError::Eof));
            return 0;
        }
        let (used, r) = self.inbox.push(data);
        let awaiting_proposal = matches!(self.state, ServerState::AwaitProposal);
        match r {
            Ok(Received::Partial) => {}
            Ok(Received::UnsupportedVersion) if awaiting_proposal => {
                // Skipped whole; the framing is intact, so decline and stay on TCP. The token is
                // unknown (it sits in a body we do not parse) and stays zero.
                self.send_decline(DeclineReason::VersionMismatch)
            }
            Ok(Received::Message(ClcMessage::Proposal(p))) if awaiting_proposal => {
                self.token = p.token;
                self.state = ServerState::AwaitDecision;
                self.event = Some(ServerEvent::Proposal(p));
            }
            Err(HandshakeError::Malformed(
                e @ (ClcError::UnknownSection(_)
                | ClcError::DuplicateSection(_)
                | ClcError::BadField(_)
                | ClcError::BadBodyLength),
            )) if awaiting_proposal => {
                // Header and trailer were sound, so the stream is still in step: decline.
                tracing::debug!(error = %e, "declining a malformed proposal");
                self.send_decline(DeclineReason::SyncError)
            }
            Ok(Received::Message(ClcMessage::Confirm(c))) if !awaiting_proposal => {
                let ServerState::AwaitConfirm(local) = &self.state else {
                    return used;
                };
                if c.token != self.token {
                    self.finish(Outcome::Failed(HandshakeError::TokenMismatch))
                } else if !local.same_transport(&c.link) {
                    self.finish(Outcome::Failed(HandshakeError::TransportMismatch))
                } else {
                    let local = local.clone();
                    self.finish(Outcome::Smc { token: self.token, local, peer: c.link })
                }
            }
            Ok(Received::Message(ClcMessage::Decline(d))) if !awaiting_proposal => {
                if d.token == self.token {
                    self.finish(Outcome::Fallback { reason: d.reason, by: Side::Peer })
                } else {
                    self.finish(Outcome::Failed(HandshakeError::TokenMismatch))
                }
            }
            Ok(Received::UnsupportedVersion) => {
                self.finish(Outcome::Failed(HandshakeError::Malformed(ClcError::BadField("confirm version"))))
            }
            Ok(Received::Message(m)) => self.finish(Outcome::Failed(HandshakeError::Unexpected { got: m.kind() })),
            Err(e) => self.finish(Outcome::Failed(e)),
        }
        used
    }

    /// Accepts the pending Proposal with this side's link details; the Confirm is awaited next.
    /// Does nothing unless a [`ServerEvent::Proposal`] is waiting for a decision.
    pub fn accept(&mut self, local: LinkInfo) {
        if !matches!(self.state, ServerState::AwaitDecision) {
            return;
        }
        match encode(&ClcMessage::Accept(Accept { token: self.token, link: local.clone() })) {
            Ok(b) => {
                self.transmit = b;
                self.state = ServerState::AwaitConfirm(local);
            }
            Err(_) => self.send_decline(DeclineReason::Internal),
        }
    }

    /// Declines the pending Proposal: the outcome becomes a local fallback.
    pub fn decline(&mut self, reason: DeclineReason) {
        if matches!(self.state, ServerState::AwaitDecision) {
            self.send_decline(reason);
        }
    }

    fn send_decline(&mut self, reason: DeclineReason) {
        self.transmit = decline_bytes(self.token, reason);
        self.finish(Outcome::Fallback { reason, by: Side::Local });
    }

    /// Tells the machine the time. Past the deadline: a pending decision declines with
    /// [`DeclineReason::Timeout`]; a half-received Proposal, or an Accept whose Confirm has not
    /// come, fails the connection.
    pub fn handle_timeout(&mut self, now: Instant) {
        if now < self.deadline {
            return;
        }
        match self.state {
            ServerState::AwaitDecision => self.send_decline(DeclineReason::Timeout),
            ServerState::AwaitProposal | ServerState::AwaitConfirm(_) => {
                self.finish(Outcome::Failed(HandshakeError::Timeout))
            }
            ServerState::Done(_) => {}
        }
    }

    /// Whether the handshake has ended.
    pub fn is_done(&self) -> bool {
        matches!(self.state, ServerState::Done(_))
    }

    /// The outcome, once done (send what [`poll_transmit`](Self::poll_transmit) holds first).
    pub fn outcome(&self) -> Option<&Outcome> {
        match &self.state {
            ServerState::Done(o) => Some(o),
            _ => None,
        }
    }

    fn finish(&mut self, o: Outcome) {
        self.event = None;
        self.state = ServerState::Done(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::clc::{ClcType, ShmLinkInfo, CLC_EYECATCHER, CLC_VERSION};

    const T: Duration = Duration::from_secs(2);

    fn token() -> Token {
        Token([0x42; 16])
    }

    fn proposal() -> Proposal {
        Proposal { token: token(), rmb_size: 0, shm: None, rdma: None }
    }

    fn shm(slot: u32, name: &[u8]) -> LinkInfo {
        LinkInfo::Shm(ShmLinkInfo { link_group: 1, rmb_slot: slot, rmb_size: 4096, socket_name: name.to_vec() })
    }

    /// Feeds `bytes` in chunks of at most `chunk`, as a driver would; returns bytes left over.
    fn feed_client(hs: &mut ClientHandshake, bytes: &[u8], chunk: usize) -> usize {
        let mut at = 0;
        while hs.wanted() > 0 && at < bytes.len() {
            let n = hs.wanted().min(chunk).min(bytes.len() - at);
            at += hs.handle_input(&bytes[at..at + n]);
        }
        bytes.len() - at
    }

    fn feed_server(hs: &mut ServerHandshake, bytes: &[u8], chunk: usize) -> usize {
        let mut at = 0;
        while hs.wanted() > 0 && at < bytes.len() {
            let n = hs.wanted().min(chunk).min(bytes.len() - at);
            at += hs.handle_input(&bytes[at..at + n]);
        }
        bytes.len() - at
    }

    fn msg(m: ClcMessage) -> Vec<u8> {
        m.encode().unwrap()
    }

    /// Runs both machines against each other; returns both outcomes.
    fn run(
        server_decides: impl FnOnce(&mut ServerHandshake, Proposal),
        client_decides: impl FnOnce(&mut ClientHandshake, Accept),
        chunk: usize,
    ) -> (Outcome, Outcome) {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        let mut s = ServerHandshake::new(now, T);
        let p = c.poll_transmit().unwrap();
        assert_eq!(feed_server(&mut s, &p, chunk), 0);
        let Some(ServerEvent::Proposal(prop)) = s.poll_event() else { panic!("no proposal") };
        server_decides(&mut s, prop);
        let reply = s.poll_transmit().unwrap();
        assert_eq!(feed_client(&mut c, &reply, chunk), 0);
        if let Some(ClientEvent::Accepted(a)) = c.poll_event() {
            client_decides(&mut c, a);
            let last = c.poll_transmit().unwrap();
            assert_eq!(feed_server(&mut s, &last, chunk), 0);
        }
        (c.outcome().unwrap().clone(), s.outcome().unwrap().clone())
    }

    #[test]
    fn full_smc_handshake_any_chunking() {
        for chunk in [1, 3, 8, 1000] {
            let (c, s) = run(
                |s, _| s.accept(shm(1, b"srv")),
                |c, a| {
                    assert_eq!(a.link, shm(1, b"srv"));
                    c.confirm(shm(2, b""))
                },
                chunk,
            );
            assert_eq!(c, Outcome::Smc { token: token(), local: shm(2, b""), peer: shm(1, b"srv") });
            assert_eq!(s, Outcome::Smc { token: token(), local: shm(1, b"srv"), peer: shm(2, b"") });
        }
    }

    #[test]
    fn every_server_decline_reason_falls_back_on_both_sides() {
        for reason in DeclineReason::ALL {
            let (c, s) = run(|s, _| s.decline(reason), |_, _| panic!("no accept"), 5);
            assert_eq!(c, Outcome::Fallback { reason, by: Side::Peer });
            assert_eq!(s, Outcome::Fallback { reason, by: Side::Local });
        }
    }

    #[test]
    fn every_client_decline_reason_falls_back_on_both_sides() {
        for reason in DeclineReason::ALL {
            let (c, s) = run(|s, _| s.accept(shm(1, b"x")), |c, _| c.decline(reason), 7);
            assert_eq!(c, Outcome::Fallback { reason, by: Side::Local });
            assert_eq!(s, Outcome::Fallback { reason, by: Side::Peer });
        }
    }

    #[test]
    fn client_never_reads_past_the_reply() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        c.poll_transmit();
        let mut bytes = msg(ClcMessage::Decline(Decline { token: token(), reason: DeclineReason::PeerNoSmc }));
        bytes.extend_from_slice(b"application data");
        assert_eq!(feed_client(&mut c, &bytes, 1 << 20), b"application data".len());
        assert!(c.is_done());
        assert_eq!(c.wanted(), 0);
    }

    #[test]
    fn client_meets_plain_server() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        feed_client(&mut c, b"HTTP/1.1 400 Bad Request\r\n", 100);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::NotSmc)));
    }

    #[test]
    fn client_meets_echo_server() {
        // An echo server sends our own Proposal back.
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        let p = c.poll_transmit().unwrap();
        feed_client(&mut c, &p, 100);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Unexpected { got: ClcType::Proposal })));
    }

    #[test]
    fn client_rejects_wrong_token_eof_timeout_and_version() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        let d = msg(ClcMessage::Decline(Decline { token: Token([0; 16]), reason: DeclineReason::Timeout }));
        feed_client(&mut c, &d, 100);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::TokenMismatch)));

        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        assert_eq!(c.handle_input(&[]), 0);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Eof)));

        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        c.handle_timeout(now + T / 2);
        assert!(!c.is_done());
        assert_eq!(c.poll_timeout(), Some(now + T));
        c.handle_timeout(now + T);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Timeout)));
        assert_eq!(c.poll_timeout(), None);

        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        let mut d = msg(ClcMessage::Decline(Decline { token: token(), reason: DeclineReason::Timeout }));
        d[4] = CLC_VERSION + 1;
        feed_client(&mut c, &d, 100);
        assert!(matches!(c.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(_)))));
    }

    #[test]
    fn client_timeout_while_deciding_declines() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        c.poll_transmit();
        feed_client(&mut c, &msg(ClcMessage::Accept(Accept { token: token(), link: shm(1, b"a") })), 100);
        assert!(matches!(c.poll_event(), Some(ClientEvent::Accepted(_))));
        c.handle_timeout(now + T);
        assert_eq!(c.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local }));
        let sent = c.poll_transmit().unwrap();
        assert!(matches!(
            decode(&sent),
            Ok(Decoded::Message(ClcMessage::Decline(Decline { reason: DeclineReason::Timeout, .. }), _))
        ));
    }

    #[test]
    fn client_confirm_with_other_transport_declines() {
        let (c, s) = run(
            |s, _| s.accept(shm(1, b"x")),
            |c, _| {
                c.confirm(LinkInfo::Rdma(crate::proto::clc::RdmaLinkInfo {
                    gid: [0; 16],
                    qpn: 1,
                    psn: 1,
                    mtu: 1024,
                    rkey: 1,
                    rmb_addr: 0,
                    rmb_size: 4096,
                    rmb_token: 1,
                    link_group: 1,
                }))
            },
            64,
        );
        assert_eq!(c, Outcome::Fallback { reason: DeclineReason::Internal, by: Side::Local });
        assert_eq!(s, Outcome::Fallback { reason: DeclineReason::Internal, by: Side::Peer });
    }

    #[test]
    fn server_declines_unsupported_version_and_stays_in_step() {
        let now = Instant::now();
        let mut s = ServerHandshake::new(now, T);
        let mut p = msg(ClcMessage::Proposal(proposal()));
        p[4] = 7;
        p.extend_from_slice(b"after");
        assert_eq!(feed_server(&mut s, &p, 3), 5);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::VersionMismatch, by: Side::Local }));
        assert!(s.poll_transmit().is_some());
    }

    #[test]
    fn server_declines_malformed_body_but_fails_bad_framing() {
        let now = Instant::now();
        let good = msg(ClcMessage::Proposal(Proposal {
            token: token(),
            rmb_size: 0,
            shm: Some(crate::proto::clc::ShmOffer { host_id: [0; 16], pid: 1, instance: 2, link_group: 0 }),
            rdma: None,
        }));
        // Unknown section kind: framing intact, decline.
        let mut b = good.clone();
        b[CLC_HEADER_LEN + 20] = 99;
        let mut s = ServerHandshake::new(now, T);
        feed_server(&mut s, &b, 100);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::SyncError, by: Side::Local }));

        // Bad trailer: framing broken, fail.
        let mut b = good.clone();
        let n = b.len();
        b[n - 2] = 0;
        let mut s = ServerHandshake::new(now, T);
        feed_server(&mut s, &b, 100);
        assert!(matches!(s.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(ClcError::BadTrailer)))));

        // Bad length.
        let mut b = good;
        b[6..8].copy_from_slice(&5000u16.to_be_bytes());
        let mut s = ServerHandshake::new(now, T);
        feed_server(&mut s, &b, 100);
        assert!(matches!(s.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(ClcError::BadLength(5000))))));

        // Garbage after the eyecatcher.
        let mut b = Vec::from(CLC_EYECATCHER);
        b.extend_from_slice(&[0xff; 20]);
        let mut s = ServerHandshake::new(now, T);
        feed_server(&mut s, &b, 100);
        assert!(matches!(s.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(_)))));
    }

    #[test]
    fn server_rejects_out_of_order_messages() {
        let now = Instant::now();
        for m in [
            ClcMessage::Accept(Accept { token: token(), link: shm(1, b"") }),
            ClcMessage::Confirm(Confirm { token: token(), link: shm(1, b"") }),
            ClcMessage::Decline(Decline { token: token(), reason: DeclineReason::Timeout }),
        ] {
            let kind = m.kind();
            let mut s = ServerHandshake::new(now, T);
            feed_server(&mut s, &msg(m), 100);
            assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Unexpected { got: kind })));
        }
    }

    #[test]
    fn server_confirm_checks() {
        let now = Instant::now();
        let setup = || {
            let mut s = ServerHandshake::new(now, T);
            feed_server(&mut s, &msg(ClcMessage::Proposal(proposal())), 100);
            s.poll_event();
            s.accept(shm(1, b"n"));
            s.poll_transmit();
            s
        };
        let mut s = setup();
        feed_server(&mut s, &msg(ClcMessage::Confirm(Confirm { token: Token([1; 16]), link: shm(2, b"") })), 100);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::TokenMismatch)));

        let mut s = setup();
        let rdma = LinkInfo::Rdma(crate::proto::clc::RdmaLinkInfo {
            gid: [0; 16],
            qpn: 1,
            psn: 1,
            mtu: 1024,
            rkey: 1,
            rmb_addr: 0,
            rmb_size: 4096,
            rmb_token: 1,
            link_group: 1,
        });
        feed_server(&mut s, &msg(ClcMessage::Confirm(Confirm { token: token(), link: rdma })), 100);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::TransportMismatch)));

        let mut s = setup();
        feed_server(&mut s, &msg(ClcMessage::Proposal(proposal())), 100);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Unexpected { got: ClcType::Proposal })));

        let mut s = setup();
        s.handle_timeout(now + T);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Timeout)));
    }

    #[test]
    fn server_timeouts() {
        let now = Instant::now();
        let mut s = ServerHandshake::new(now, T);
        feed_server(&mut s, &msg(ClcMessage::Proposal(proposal()))[..10], 100);
        s.handle_timeout(now + T);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Timeout)));

        let mut s = ServerHandshake::new(now, T);
        feed_server(&mut s, &msg(ClcMessage::Proposal(proposal())), 100);
        s.handle_timeout(now + T);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local }));
        let d = s.poll_transmit().unwrap();
        assert!(
            matches!(decode(&d), Ok(Decoded::Message(ClcMessage::Decline(Decline { token: t, .. }), _)) if t == token())
        );

        let mut s = ServerHandshake::new(now, T);
        s.handle_input(&[]);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Eof)));
    }

    #[test]
    fn decisions_out_of_state_are_ignored() {
        let now = Instant::now();
        let mut s = ServerHandshake::new(now, T);
        s.accept(shm(1, b""));
        s.decline(DeclineReason::Internal);
        assert!(!s.is_done());
        assert!(s.poll_transmit().is_none());
        let mut c = ClientHandshake::new(proposal(), now, T).unwrap();
        c.poll_transmit();
        c.confirm(shm(1, b""));
        c.decline(DeclineReason::Internal);
        assert!(!c.is_done());
        assert!(c.poll_transmit().is_none());
    }
}
