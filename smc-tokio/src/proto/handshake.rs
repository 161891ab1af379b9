//! The CLC handshake as two sans-IO state machines, [`ClientHandshake`] and [`ServerHandshake`].
//!
//! They own no socket and read no clock. The driver feeds them received bytes (from a stream it
//! reads no more than [`wanted`](ClientHandshake::wanted) at a time, so that no byte after the
//! handshake is taken from it; of what it is given, a machine takes at most what it wants and
//! says how much), the current time, and its decisions; it takes from them the bytes to send
//! ([`poll_transmit`](ClientHandshake::poll_transmit)), the next deadline
//! ([`poll_timeout`](ClientHandshake::poll_timeout)), events that need a decision
//! ([`poll_event`](ClientHandshake::poll_event)) and finally an [`Outcome`].
//!
//! ```text
//! client                                   server
//!   Proposal  ───────────────────────────▶   (event: Proposal; driver accepts or declines)
//!             ◀───────────────────────────   Accept | Decline
//!   (event: Accepted; driver confirms or declines)
//!   Confirm | Decline ───────────────────▶   (event: Confirmed; driver commits or declines)
//!             ◀───────────────────────────   Commit | Decline
//! ```
//!
//! **The commit point.** The client moves its data to the link only after the server's Commit,
//! and the server sends it only once the link is ready; so neither side is ever committed while
//! the other may still fall back. After an Accept, each side sends exactly one more message,
//! whatever happens (the server a Commit or a Decline, the client a Confirm or a Decline), so
//! the two byte streams stay in step: a side that gives up declines instead of going silent.
//! After any Decline both sides continue over TCP on the same connection.
//!
//! **Deadlines count from when the peer could have answered.** Each wait has its own bound
//! ([`Timeouts`]), started when the message it waits for could first have been sent, so a
//! server's accept lag or a client's link setup is not charged to the other side.
//!
//! A server that gives up waiting may still owe the stream a consumption: a Proposal that was
//! not sent yet, or the client's answer to an Accept it timed out on
//! ([`ServerHandshake::owed_by_peer`]). The driver must consume that message (and answer a late
//! Proposal with a Decline) before the application reads the stream.
//!
//! Anything that leaves the stream in an unknown state (a malformed frame, a message out of
//! order, a timeout with a message half received) ends in [`Outcome::Failed`]: the connection
//! must be closed.

use std::fmt;
use std::time::{Duration, Instant};

use super::clc::{
    decode, Accept, ClcError, ClcHeader, ClcMessage, Commit, Decline, DeclineReason, Decoded, LinkInfo, Proposal,
    Secret, CLC_HEADER_LEN,
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
        /// The handshake's secret.
        secret: Secret,
        /// The link details this side sent.
        local: LinkInfo,
        /// The link details the peer sent.
        peer: LinkInfo,
    },
    /// A Decline was sent or received, or the server stopped waiting for a Proposal: continue
    /// over TCP; the stream is intact.
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
    /// The peer answered with another handshake's secret.
    SecretMismatch,
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
            HandshakeError::SecretMismatch => f.write_str("handshake secret mismatch"),
            HandshakeError::TransportMismatch => f.write_str("confirm names another transport than the accept"),
            HandshakeError::ConfirmMismatch => f.write_str("confirm does not match the accepted link"),
            HandshakeError::Timeout => f.write_str("handshake timed out"),
            HandshakeError::Eof => f.write_str("peer closed the connection during the handshake"),
        }
    }
}

impl std::error::Error for HandshakeError {}

/// How long a client that confirmed waits for the server's final word, as a multiple of the
/// peer bound, and at least [`FINAL_WORD_FLOOR`]. A server answers a Confirm within its own
/// deadline (the handshake timeout, 2 s by default, `SMC_TOKIO_HANDSHAKE_TIMEOUT_MS`), which the
/// client does not know; sixteen of ours, and never less than a minute, is far past any
/// server's that still makes progress.
pub const FINAL_WORD_FACTOR: u32 = 16;

/// The least time a client that confirmed waits for the server's final word (see
/// [`FINAL_WORD_FACTOR`]).
pub const FINAL_WORD_FLOOR: Duration = Duration::from_secs(60);

/// Per-step bounds of a handshake. Each wait starts when the party waited for could first act:
/// a wait for the peer's message when ours was sent, a local decision when the peer's message
/// arrived.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use smc_tokio::proto::handshake::Timeouts;
///
/// let t = Timeouts::uniform(Duration::from_secs(2));
/// assert_eq!(t.peer, t.local);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// How long to wait for each of the peer's messages.
    pub peer: Duration,
    /// How long this side's own decision (setting up its end of the link) may take.
    pub local: Duration,
}

impl Timeouts {
    /// The same bound for every step.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use smc_tokio::proto::handshake::{ServerHandshake, Timeouts};
    ///
    /// let d = Duration::from_millis(500);
    /// let timeouts = Timeouts::uniform(d);
    /// assert_eq!(timeouts, Timeouts { peer: d, local: d });
    /// let now = Instant::now();
    /// assert_eq!(ServerHandshake::new(now, timeouts).poll_timeout(), Some(now + timeouts.peer));
    /// ```
    pub fn uniform(d: Duration) -> Timeouts {
        Timeouts { peer: d, local: d }
    }
}

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

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Takes at most `wanted()` bytes of `data`; returns how many it took and what it has.
    fn push(&mut self, data: &[u8]) -> (usize, Result<Received, HandshakeError>) {
        // A whole message handed over at once (a door frame's payload) is decoded where it
        // lies: what the header-then-rest path below would return after two calls and two
        // copies into `buf` (and its allocations), in one. Anything else (part of a message, a
        // message that does not decode) takes that path, with its errors.
        if self.buf.is_empty() {
            if let Ok(Decoded::Message(m, n)) = decode(data) {
                return (n, Ok(Received::Message(m)));
            }
        }
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

/// An Accept's or a Confirm's bytes from a borrowed link (see
/// [`encode_link_message`](super::clc::encode_link_message)).
fn encode_link(confirm: bool, secret: Secret, link: &LinkInfo) -> Result<Vec<u8>, HandshakeError> {
    super::clc::encode_link_message(confirm, secret, link).map_err(HandshakeError::Malformed)
}

fn decline_bytes(secret: Secret, reason: DeclineReason) -> Vec<u8> {
    // A Decline has no variable fields, so it always encodes.
    ClcMessage::Decline(Decline { secret, reason }).encode().unwrap_or_default()
}

/// An event for which the driver must decide, on the client side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// The server accepted: set the link up, then call [`ClientHandshake::confirm`] or
    /// [`ClientHandshake::decline`].
    Accepted(Accept),
}

/// What the client answered to the Accept.
#[derive(Debug)]
enum Answer {
    Confirmed { local: LinkInfo, peer: LinkInfo },
    Declined(DeclineReason),
}

#[derive(Debug)]
enum ClientState {
    AwaitReply,
    AwaitDecision(LinkInfo),
    AwaitFinal(Answer),
    Done(Outcome),
}

/// The client's side of the handshake.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use smc_tokio::proto::clc::{ClcMessage, Decline, DeclineReason, Proposal, Secret};
/// use smc_tokio::proto::handshake::{ClientHandshake, Outcome, Side, Timeouts};
///
/// let now = Instant::now();
/// let secret = Secret([1; 16]);
/// let proposal = Proposal { secret, rmb_size: 0, shm: None, rdma: None };
/// let mut hs = ClientHandshake::new(proposal, now, Timeouts::uniform(Duration::from_secs(1))).unwrap();
/// let to_send = hs.poll_transmit().unwrap(); // the Proposal
/// assert!(!to_send.is_empty());
///
/// // The server declines.
/// let reply = ClcMessage::Decline(Decline { secret, reason: DeclineReason::NoCommonTransport });
/// let bytes = reply.encode().unwrap();
/// let mut at = 0;
/// while hs.wanted() > 0 {
///     let n = hs.wanted().min(bytes.len() - at);
///     at += hs.handle_input(&bytes[at..at + n], now);
/// }
/// assert_eq!(
///     hs.outcome(),
///     Some(&Outcome::Fallback { reason: DeclineReason::NoCommonTransport, by: Side::Peer })
/// );
/// ```
#[derive(Debug)]
pub struct ClientHandshake {
    secret: Secret,
    state: ClientState,
    /// A Confirm was sent: from then on the server may have committed, whatever the outcome.
    confirmed: bool,
    deadline: Instant,
    timeouts: Timeouts,
    inbox: Inbox,
    transmit: Vec<u8>,
    event: Option<ClientEvent>,
}

impl ClientHandshake {
    /// Starts a handshake: queues the Proposal, sent at `now`; the server's reply is awaited
    /// until `now + timeouts.peer`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let offer = Some(ShmOffer { link_group: 0 });
    /// let proposal = Proposal { secret: Secret([1; 16]), rmb_size: 1 << 16, shm: offer, rdma: None };
    /// let mut c = ClientHandshake::new(proposal.clone(), now, timeouts).unwrap();
    /// let bytes = c.poll_transmit().unwrap(); // the Proposal, to write to the stream
    /// assert_eq!(decode(&bytes), Ok(Decoded::Message(ClcMessage::Proposal(proposal.clone()), bytes.len())));
    /// // A Proposal that cannot be encoded is refused.
    /// assert!(ClientHandshake::new(Proposal { rmb_size: u32::MAX, ..proposal }, now, timeouts).is_err());
    /// ```
    pub fn new(proposal: Proposal, now: Instant, timeouts: Timeouts) -> Result<Self, HandshakeError> {
        let transmit = encode(&ClcMessage::Proposal(proposal.clone()))?;
        Ok(Self { transmit, ..Self::after_proposal(proposal.secret, now, timeouts) })
    }

    /// Starts a handshake whose Proposal, with `secret`, went out another way at `now` (on a
    /// listener's door, with the registration): nothing is queued to send, and the server's
    /// reply is awaited until `now + timeouts.peer`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let mut c = ClientHandshake::after_proposal(Secret([1; 16]), now, timeouts);
    /// assert_eq!(c.poll_transmit(), None);
    /// assert_eq!(c.poll_timeout(), Some(now + timeouts.peer));
    /// assert_eq!(c.secret(), Secret([1; 16]));
    /// ```
    pub fn after_proposal(secret: Secret, now: Instant, timeouts: Timeouts) -> Self {
        Self {
            secret,
            state: ClientState::AwaitReply,
            confirmed: false,
            deadline: now + timeouts.peer,
            timeouts,
            inbox: Inbox::default(),
            transmit: Vec::new(),
            event: None,
        }
    }

    /// The handshake's secret.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let c = ClientHandshake::new(Proposal { secret: Secret([9; 16]), ..proposal }, now, timeouts).unwrap();
    /// assert_eq!(c.secret(), Secret([9; 16])); // the Proposal's
    /// assert_eq!(format!("{:?}", c.secret()), "Secret(<redacted>)"); // a secret: kept out of logs
    /// ```
    pub fn secret(&self) -> Secret {
        self.secret
    }

    /// Bytes to send now, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// let bytes = c.poll_transmit().unwrap(); // write these to the stream
    /// assert!(matches!(decode(&bytes), Ok(Decoded::Message(ClcMessage::Proposal(_), _))));
    /// assert_eq!(c.poll_transmit(), None); // handed out once
    /// ```
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        (!self.transmit.is_empty()).then(|| std::mem::take(&mut self.transmit))
    }

    /// An event that needs the driver's decision.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal.clone(), now, timeouts).unwrap();
    /// c.poll_transmit();
    /// feed(&mut c, &ClcMessage::Accept(Accept { secret: PAIR_SECRET, link: shm_link(1) }).encode().unwrap(), now);
    /// // `c` has received the server's Accept.
    /// let Some(ClientEvent::Accepted(accept)) = c.poll_event() else { panic!("no accept") };
    /// assert_eq!(accept.link, shm_link(1)); // the server's link details
    /// assert_eq!(c.poll_event(), None); // handed out once; now confirm or decline
    /// ```
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.event.take()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called, if the handshake is not done.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// let deadline = c.poll_timeout().unwrap();
    /// assert_eq!(deadline, now + timeouts.peer); // for the server's reply
    /// c.handle_timeout(deadline);
    /// assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Timeout)));
    /// assert_eq!(c.poll_timeout(), None);
    /// ```
    pub fn poll_timeout(&self) -> Option<Instant> {
        (!self.is_done()).then_some(self.deadline)
    }

    /// How many bytes to read from the stream next (0: read nothing now). A whole message
    /// handed over at once (from a message channel) is taken at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// let reply = ClcMessage::Decline(Decline { secret: PAIR_SECRET, reason: DeclineReason::Timeout }).encode().unwrap();
    /// assert_eq!(c.wanted(), CLC_HEADER_LEN); // the reply's header first
    /// assert_eq!(c.handle_input(&reply[..CLC_HEADER_LEN], now), CLC_HEADER_LEN);
    /// assert_eq!(c.wanted(), reply.len() - CLC_HEADER_LEN); // then exactly the rest
    /// c.handle_input(&reply[CLC_HEADER_LEN..], now);
    /// assert_eq!(c.wanted(), 0);
    /// ```
    pub fn wanted(&self) -> usize {
        match self.state {
            ClientState::AwaitReply | ClientState::AwaitFinal(_) => self.inbox.wanted(),
            _ => 0,
        }
    }

    /// Whether this side has sent a Confirm. Before that, a client may still walk away and use
    /// the connection as TCP; from then on the server may have committed, so only the server's
    /// Decline (or its closing the channel without a final word, which it sends before any
    /// close) makes the connection TCP, and it stays true once the handshake has ended, however
    /// it ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal.clone(), now, timeouts).unwrap();
    /// c.poll_transmit();
    /// feed(&mut c, &ClcMessage::Accept(Accept { secret: PAIR_SECRET, link: shm_link(1) }).encode().unwrap(), now);
    /// // `c` has received the server's Accept.
    /// assert!(!c.has_confirmed()); // it may still walk away
    /// c.confirm(shm_link(2), now);
    /// assert!(c.has_confirmed());
    /// ```
    pub fn has_confirmed(&self) -> bool {
        self.confirmed
    }

    /// Whether the next byte from the server is the first of its reply to the Proposal. A
    /// driver that may meet a server which handed the connection to its application (and so
    /// will send application bytes instead) looks at that byte without taking it, and calls
    /// [`peer_sent_data`](Self::peer_sent_data) when it is not the eyecatcher's.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// assert!(c.awaits_reply_start());
    /// c.handle_input(&CLC_EYECATCHER[..1], now); // the reply has begun
    /// assert!(!c.awaits_reply_start());
    /// ```
    pub fn awaits_reply_start(&self) -> bool {
        matches!(self.state, ClientState::AwaitReply) && self.inbox.is_empty()
    }

    /// The server's first bytes are not a CLC message (nothing was taken from the stream): the
    /// outcome becomes [`HandshakeError::NotSmc`]. Does nothing unless
    /// [`awaits_reply_start`](Self::awaits_reply_start).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// // The driver peeks at the server's first byte: not the eyecatcher's.
    /// let first = b"HTTP/1.1 400 Bad Request\r\n"[0];
    /// if c.awaits_reply_start() && !eyecatcher_prefix_matches(&[first]) {
    ///     c.peer_sent_data();
    /// }
    /// assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::NotSmc)));
    /// ```
    pub fn peer_sent_data(&mut self) {
        if self.awaits_reply_start() {
            self.finish(Outcome::Failed(HandshakeError::NotSmc));
        }
    }

    /// Feeds bytes received at `now`; returns how many were used: at most
    /// [`wanted`](Self::wanted), or, where `data` starts with a whole CLC message and none is
    /// under way, that message's length (a message channel hands one over whole). Never a byte
    /// past the message. An empty `data` means the peer closed the stream.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// let mut stream = ClcMessage::Decline(Decline { secret: PAIR_SECRET, reason: DeclineReason::PeerNoSmc }).encode().unwrap();
    /// stream.extend_from_slice(b"application bytes");
    /// let mut at = 0;
    /// while c.wanted() > 0 {
    ///     at += c.handle_input(&stream[at..], now);
    /// }
    /// assert_eq!(&stream[at..], b"application bytes"); // left on the stream
    /// assert_eq!(c.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::PeerNoSmc, by: Side::Peer }));
    /// ```
    pub fn handle_input(&mut self, data: &[u8], now: Instant) -> usize {
        if !matches!(self.state, ClientState::AwaitReply | ClientState::AwaitFinal(_)) {
            return 0;
        }
        if data.is_empty() {
            self.finish(Outcome::Failed(HandshakeError::Eof));
            return 0;
        }
        let (used, r) = self.inbox.push(data);
        let msg = match r {
            Ok(Received::Partial) => return used,
            Ok(Received::Message(m)) => m,
            // Servers answer in the client's version; another one is a protocol violation.
            Ok(Received::UnsupportedVersion) => {
                self.finish(Outcome::Failed(HandshakeError::Malformed(ClcError::BadField("reply version"))));
                return used;
            }
            Err(e) => {
                self.finish(Outcome::Failed(e));
                return used;
            }
        };
        if !matches!(msg, ClcMessage::Proposal(_) | ClcMessage::Confirm(_)) && msg.secret() != self.secret {
            self.finish(Outcome::Failed(HandshakeError::SecretMismatch));
            return used;
        }
        match (std::mem::replace(&mut self.state, ClientState::AwaitReply), msg) {
            (ClientState::AwaitReply, ClcMessage::Accept(a)) => {
                self.state = ClientState::AwaitDecision(a.link.clone());
                self.deadline = now + self.timeouts.local;
                self.event = Some(ClientEvent::Accepted(a));
            }
            (ClientState::AwaitReply, ClcMessage::Decline(d)) => {
                self.finish(Outcome::Fallback { reason: d.reason, by: Side::Peer })
            }
            (ClientState::AwaitFinal(Answer::Confirmed { local, peer }), ClcMessage::Commit(_)) => {
                self.finish(Outcome::Smc { secret: self.secret, local, peer })
            }
            (ClientState::AwaitFinal(Answer::Confirmed { .. }), ClcMessage::Decline(d)) => {
                self.finish(Outcome::Fallback { reason: d.reason, by: Side::Peer })
            }
            (ClientState::AwaitFinal(Answer::Declined(reason)), ClcMessage::Decline(_)) => {
                self.finish(Outcome::Fallback { reason, by: Side::Local })
            }
            (_, m) => self.finish(Outcome::Failed(HandshakeError::Unexpected { got: m.kind() })),
        }
        used
    }

    /// Confirms an Accept with this side's link details at `now`; the server's Commit is
    /// awaited next. Past the decision's deadline it declines with
    /// [`DeclineReason::Timeout`] instead. Does nothing unless an [`ClientEvent::Accepted`] is
    /// waiting for a decision.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal.clone(), now, timeouts).unwrap();
    /// c.poll_transmit();
    /// feed(&mut c, &ClcMessage::Accept(Accept { secret: PAIR_SECRET, link: shm_link(1) }).encode().unwrap(), now);
    /// // `c` has received the server's Accept of `shm_link(1)`; our end of the link is ready.
    /// c.confirm(shm_link(2), now);
    /// let confirm = c.poll_transmit().unwrap();
    /// assert!(matches!(decode(&confirm), Ok(Decoded::Message(ClcMessage::Confirm(_), _))));
    /// // The server's Commit ends the handshake.
    /// let commit = ClcMessage::Commit(Commit { secret: PAIR_SECRET }).encode().unwrap();
    /// let mut at = 0;
    /// while c.wanted() > 0 {
    ///     at += c.handle_input(&commit[at..], now);
    /// }
    /// assert_eq!(c.outcome(), Some(&Outcome::Smc { secret: PAIR_SECRET, local: shm_link(2), peer: shm_link(1) }));
    /// ```
    pub fn confirm(&mut self, local: LinkInfo, now: Instant) {
        let peer = match std::mem::replace(&mut self.state, ClientState::AwaitReply) {
            ClientState::AwaitDecision(peer) => peer,
            other => {
                self.state = other;
                return;
            }
        };
        if now >= self.deadline {
            return self.declined(DeclineReason::Timeout, now);
        }
        if !peer.same_transport(&local) {
            return self.declined(DeclineReason::Internal, now);
        }
        match encode_link(true, self.secret, &local) {
            Ok(b) => {
                self.transmit = b;
                self.state = ClientState::AwaitFinal(Answer::Confirmed { local, peer });
                self.confirmed = true;
                // From here on the server may commit, so only its word settles the connection:
                // it sends a Commit or a Decline within its own deadline, which this side does
                // not know (a server with a longer handshake timeout, or a loaded one, answers
                // later). We wait for it far longer than any server's deadline; past that the
                // server has made no progress at all, and the connection fails rather than
                // guess (never TCP: the server may have committed).
                self.deadline = now + self.timeouts.peer.saturating_mul(FINAL_WORD_FACTOR).max(FINAL_WORD_FLOOR);
            }
            Err(_) => self.declined(DeclineReason::Internal, now),
        }
    }

    /// Declines an Accept at `now`: the server's answer (its Decline) is awaited next, then
    /// the outcome is a local fallback. Does nothing unless a decision is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal.clone(), now, timeouts).unwrap();
    /// c.poll_transmit();
    /// feed(&mut c, &ClcMessage::Accept(Accept { secret: PAIR_SECRET, link: shm_link(1) }).encode().unwrap(), now);
    /// // `c` has received the server's Accept, and cannot set up its end of the link.
    /// c.decline(DeclineReason::OutOfMemory, now);
    /// let sent = c.poll_transmit().unwrap();
    /// assert!(matches!(decode(&sent), Ok(Decoded::Message(ClcMessage::Decline(_), _))));
    /// assert!(!c.is_done()); // the server's final word is still due
    /// feed(&mut c, &ClcMessage::Decline(Decline { secret: PAIR_SECRET, reason: DeclineReason::OutOfMemory }).encode().unwrap(), now);
    /// // ... it arrives (the server's Decline):
    /// assert_eq!(c.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::OutOfMemory, by: Side::Local }));
    /// ```
    pub fn decline(&mut self, reason: DeclineReason, now: Instant) {
        if matches!(self.state, ClientState::AwaitDecision(_)) {
            self.declined(reason, now);
        }
    }

    /// Declines the pending decision (the caller checked there was one): the Decline goes out,
    /// and the server's answer is awaited until `now + timeouts.peer`.
    fn declined(&mut self, reason: DeclineReason, now: Instant) {
        self.transmit = decline_bytes(self.secret, reason);
        self.event = None;
        self.state = ClientState::AwaitFinal(Answer::Declined(reason));
        self.deadline = now + self.timeouts.peer;
    }

    /// Tells the machine the time. Past the deadline: a pending local decision declines with
    /// [`DeclineReason::Timeout`] (the stream stays in step); a wait for the server fails the
    /// connection, since the server may still answer.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal.clone(), now, timeouts).unwrap();
    /// c.poll_transmit();
    /// feed(&mut c, &ClcMessage::Accept(Accept { secret: PAIR_SECRET, link: shm_link(1) }).encode().unwrap(), now);
    /// // `c` has received the server's Accept at `now`; the local decision has `timeouts.local`.
    /// c.handle_timeout(now + timeouts.local);
    /// let sent = c.poll_transmit().unwrap(); // declined for us, in step with the server
    /// let declined = Decline { secret: PAIR_SECRET, reason: DeclineReason::Timeout };
    /// assert_eq!(decode(&sent), Ok(Decoded::Message(ClcMessage::Decline(declined), sent.len())));
    /// // A wait for the server fails the connection instead.
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// c.handle_timeout(now + timeouts.peer);
    /// assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Timeout)));
    /// ```
    pub fn handle_timeout(&mut self, now: Instant) {
        if now < self.deadline {
            return;
        }
        match self.state {
            ClientState::AwaitReply | ClientState::AwaitFinal(_) => {
                self.finish(Outcome::Failed(HandshakeError::Timeout))
            }
            ClientState::AwaitDecision(_) => self.decline(DeclineReason::Timeout, now),
            ClientState::Done(_) => {}
        }
    }

    /// Whether the handshake has ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// assert!(!c.is_done());
    /// c.handle_input(&[], now); // the server closed the connection
    /// assert!(c.is_done());
    /// assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Eof)));
    /// ```
    pub fn is_done(&self) -> bool {
        matches!(self.state, ClientState::Done(_))
    }

    /// The outcome, once done. Bytes from [`poll_transmit`](Self::poll_transmit) must still be
    /// sent before acting on it.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut c = ClientHandshake::new(proposal, now, timeouts).unwrap();
    /// assert_eq!(c.outcome(), None); // still waiting for the server
    /// let decline = Decline { secret: PAIR_SECRET, reason: DeclineReason::HandshakeCongested };
    /// feed(&mut c, &ClcMessage::Decline(decline).encode().unwrap(), now);
    /// // ... the server declines: continue over TCP on the same connection.
    /// let Some(Outcome::Fallback { reason, by }) = c.outcome() else { panic!("{:?}", c.outcome()) };
    /// assert_eq!((*reason, *by), (DeclineReason::HandshakeCongested, Side::Peer));
    /// ```
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

/// An event for which the driver must decide, on the server side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// A client proposed: choose a transport and call [`ServerHandshake::accept`], or call
    /// [`ServerHandshake::decline`].
    Proposal(Proposal),
    /// The client confirmed the Accept with its link details: check them against the link,
    /// then call [`ServerHandshake::commit`] or [`ServerHandshake::decline`].
    Confirmed(LinkInfo),
}

/// A client message that a server which stopped waiting still has to take from the stream
/// before the application reads it ([`ServerHandshake::owed_by_peer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerOwes {
    /// The Proposal: answer it with a Decline (or, if the application already wrote, drop it
    /// silently: the client takes application bytes for "handed out as TCP").
    Proposal,
    /// The client's Confirm or Decline answering our Accept: drop it (our Decline already went).
    Answer,
}

#[derive(Debug)]
enum ServerState {
    AwaitProposal,
    AwaitDecision,
    AwaitAnswer(LinkInfo),
    AwaitCommit { local: LinkInfo, peer: LinkInfo },
    Done(Outcome),
}

/// The server's side of the handshake. Start it on a connection whose client is known to
/// propose (registered at the listener's door) or whose first bytes matched the eyecatcher.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use smc_tokio::proto::clc::{decode, ClcMessage, Decoded, DeclineReason, Proposal, Secret};
/// use smc_tokio::proto::handshake::{Outcome, ServerEvent, ServerHandshake, Side, Timeouts};
///
/// let now = Instant::now();
/// let mut hs = ServerHandshake::new(now, Timeouts::uniform(Duration::from_secs(1)));
/// let proposal = Proposal { secret: Secret([9; 16]), rmb_size: 0, shm: None, rdma: None };
/// let bytes = ClcMessage::Proposal(proposal.clone()).encode().unwrap();
/// let mut at = 0;
/// while hs.wanted() > 0 {
///     let n = hs.wanted();
///     at += hs.handle_input(&bytes[at..at + n], now);
/// }
/// assert_eq!(hs.poll_event(), Some(ServerEvent::Proposal(proposal)));
/// hs.decline(DeclineReason::NoCommonTransport, now);
/// let reply = hs.poll_transmit().unwrap();
/// assert!(matches!(decode(&reply).unwrap(), Decoded::Message(ClcMessage::Decline(_), _)));
/// assert_eq!(
///     hs.outcome(),
///     Some(&Outcome::Fallback { reason: DeclineReason::NoCommonTransport, by: Side::Local })
/// );
/// ```
#[derive(Debug)]
pub struct ServerHandshake {
    secret: Secret,
    state: ServerState,
    deadline: Instant,
    timeouts: Timeouts,
    inbox: Inbox,
    transmit: Vec<u8>,
    event: Option<ServerEvent>,
    owed: Option<PeerOwes>,
}

impl ServerHandshake {
    /// Starts waiting, from `now`, for a Proposal (until `now + timeouts.peer`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use smc_tokio::proto::{clc::*, handshake::*};
    ///
    /// let now = Instant::now();
    /// let timeouts = Timeouts { peer: Duration::from_millis(200), local: Duration::from_secs(1) };
    /// let s = ServerHandshake::new(now, timeouts);
    /// assert_eq!(s.wanted(), CLC_HEADER_LEN); // the Proposal's header first
    /// assert_eq!(s.poll_timeout(), Some(now + timeouts.peer));
    /// assert!(!s.is_done());
    /// ```
    pub fn new(now: Instant, timeouts: Timeouts) -> Self {
        Self {
            secret: Secret::default(),
            state: ServerState::AwaitProposal,
            deadline: now + timeouts.peer,
            timeouts,
            inbox: Inbox::default(),
            transmit: Vec::new(),
            event: None,
            owed: None,
        }
    }

    /// The handshake's secret (zero until the Proposal has arrived).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// assert_eq!(s.secret(), Secret::default()); // zero until the Proposal arrives
    /// let bytes = ClcMessage::Proposal(proposal).encode().unwrap();
    /// let mut at = 0;
    /// while s.wanted() > 0 {
    ///     at += s.handle_input(&bytes[at..], now);
    /// }
    /// assert_eq!(s.secret(), PAIR_SECRET);
    /// ```
    pub fn secret(&self) -> Secret {
        self.secret
    }

    /// Bytes to send now, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// feed(&mut s, &ClcMessage::Proposal(proposal.clone()).encode().unwrap(), now);
    /// // The client's Proposal has arrived at `s`.
    /// assert_eq!(s.poll_transmit(), None); // nothing to send before a decision
    /// s.accept(shm_link(1), now);
    /// let accept = s.poll_transmit().unwrap(); // write these to the stream
    /// assert!(matches!(decode(&accept), Ok(Decoded::Message(ClcMessage::Accept(_), _))));
    /// assert_eq!(s.poll_transmit(), None); // handed out once
    /// ```
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        (!self.transmit.is_empty()).then(|| std::mem::take(&mut self.transmit))
    }

    /// An event that needs the driver's decision.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// feed(&mut s, &ClcMessage::Proposal(proposal.clone()).encode().unwrap(), now);
    /// // The client's Proposal has arrived at `s`.
    /// let Some(ServerEvent::Proposal(p)) = s.poll_event() else { panic!("no proposal") };
    /// assert_eq!(p.shm, Some(ShmOffer { link_group: 0 })); // what the client offers
    /// assert_eq!(s.poll_event(), None); // handed out once; now accept or decline
    /// ```
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.event.take()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called, if not done.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// assert_eq!(s.poll_timeout(), Some(now + timeouts.peer)); // for the Proposal
    /// let later = now + std::time::Duration::from_millis(5);
    /// feed(&mut s, &ClcMessage::Proposal(proposal).encode().unwrap(), later);
    /// assert_eq!(s.poll_timeout(), Some(later + timeouts.local)); // for our decision, from the Proposal
    /// ```
    pub fn poll_timeout(&self) -> Option<Instant> {
        (!self.is_done()).then_some(self.deadline)
    }

    /// How many bytes to read from the stream next (0: read nothing now).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// let mut bytes = ClcMessage::Proposal(proposal).encode().unwrap();
    /// let len = bytes.len();
    /// bytes.extend_from_slice(b"GET / HTTP/1.1\r\n"); // what the client sends next
    /// let mut at = 0;
    /// while s.wanted() > 0 {
    ///     at += s.handle_input(&bytes[at..], now);
    /// }
    /// assert_eq!(at, len); // exactly the Proposal
    /// ```
    pub fn wanted(&self) -> usize {
        match self.state {
            ServerState::AwaitProposal | ServerState::AwaitAnswer(_) => self.inbox.wanted(),
            _ => 0,
        }
    }

    /// After the outcome: a client message still on its way that must be taken from the
    /// stream before application bytes (the server stopped waiting for it).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// s.handle_timeout(now + timeouts.peer); // no Proposal in time: serve the connection as TCP
    /// assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local }));
    /// // The Proposal may still come: take it off the stream before the application reads.
    /// assert_eq!(s.owed_by_peer(), Some(PeerOwes::Proposal));
    /// ```
    pub fn owed_by_peer(&self) -> Option<PeerOwes> {
        self.owed
    }

    /// Whether the next byte from the client is the first of its Proposal. A driver serving a
    /// client that may have given up on SMC (and so sends application bytes instead) looks at
    /// that byte without taking it, and calls [`peer_sent_data`](Self::peer_sent_data) when it
    /// is not the eyecatcher's.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// assert!(s.awaits_proposal_start());
    /// s.handle_input(&CLC_EYECATCHER[..2], now); // a Proposal has begun
    /// assert!(!s.awaits_proposal_start());
    /// ```
    pub fn awaits_proposal_start(&self) -> bool {
        matches!(self.state, ServerState::AwaitProposal) && self.inbox.is_empty()
    }

    /// The client's first bytes are application data, not a Proposal (nothing was taken): the
    /// outcome is a fallback with [`DeclineReason::PeerNoSmc`], the stream intact. Does nothing
    /// unless [`awaits_proposal_start`](Self::awaits_proposal_start).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// // The driver peeks at the client's first byte: not the eyecatcher's.
    /// let first = b"GET / HTTP/1.1\r\n"[0];
    /// if s.awaits_proposal_start() && !eyecatcher_prefix_matches(&[first]) {
    ///     s.peer_sent_data();
    /// }
    /// assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::PeerNoSmc, by: Side::Peer }));
    /// assert_eq!(s.poll_transmit(), None); // nothing is sent to such a client
    /// ```
    pub fn peer_sent_data(&mut self) {
        if self.awaits_proposal_start() {
            self.finish(Outcome::Fallback { reason: DeclineReason::PeerNoSmc, by: Side::Peer });
        }
    }

    /// Feeds bytes received at `now`; returns how many were used: at most
    /// [`wanted`](Self::wanted), or, where `data` starts with a whole CLC message and none is
    /// under way, that message's length (a door frame hands one over whole). Never a byte past
    /// the message. An empty `data` means EOF.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// let bytes = ClcMessage::Proposal(proposal.clone()).encode().unwrap();
    /// // The stream may deliver a byte at a time.
    /// for b in &bytes {
    ///     assert_eq!(s.handle_input(std::slice::from_ref(b), now), 1);
    /// }
    /// assert_eq!(s.poll_event(), Some(ServerEvent::Proposal(proposal)));
    /// ```
    pub fn handle_input(&mut self, data: &[u8], now: Instant) -> usize {
        let awaiting_proposal = matches!(self.state, ServerState::AwaitProposal);
        if !awaiting_proposal && !matches!(self.state, ServerState::AwaitAnswer(_)) {
            return 0;
        }
        if data.is_empty() {
            self.finish(Outcome::Failed(HandshakeError::Eof));
            return 0;
        }
        let (used, r) = self.inbox.push(data);
        match r {
            Ok(Received::Partial) => {}
            Ok(Received::UnsupportedVersion) if awaiting_proposal => {
                // Skipped whole; the framing is intact, so decline and stay on TCP. The secret is
                // unknown (it sits in a body we do not parse) and stays zero.
                self.send_decline(DeclineReason::VersionMismatch)
            }
            Ok(Received::Message(ClcMessage::Proposal(p))) if awaiting_proposal => {
                self.secret = p.secret;
                self.state = ServerState::AwaitDecision;
                self.deadline = now + self.timeouts.local;
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
                let local = match std::mem::replace(&mut self.state, ServerState::AwaitDecision) {
                    ServerState::AwaitAnswer(local) => local,
                    other => {
                        self.state = other;
                        return used;
                    }
                };
                if c.secret != self.secret || !local.same_transport(&c.link) {
                    // Framing is sound and the client awaits our final word: decline in step
                    // (that ends the machine: the state taken above is not put back).
                    tracing::debug!(secret_ok = c.secret == self.secret, "declining a confirm that does not fit");
                    self.send_decline(DeclineReason::SyncError)
                } else {
                    self.event = Some(ServerEvent::Confirmed(c.link.clone()));
                    self.state = ServerState::AwaitCommit { local, peer: c.link };
                    self.deadline = now + self.timeouts.local;
                }
            }
            Ok(Received::Message(ClcMessage::Decline(d))) if !awaiting_proposal => {
                if d.secret == self.secret {
                    // The client waits for our final word even after declining.
                    self.transmit = decline_bytes(self.secret, d.reason);
                    self.finish(Outcome::Fallback { reason: d.reason, by: Side::Peer })
                } else {
                    self.send_decline(DeclineReason::SyncError)
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

    /// Accepts the pending Proposal at `now` with this side's link details; the client's
    /// answer is awaited next. Past the decision's deadline it declines with
    /// [`DeclineReason::Timeout`] instead. Does nothing unless a [`ServerEvent::Proposal`] is
    /// waiting for a decision.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// feed(&mut s, &ClcMessage::Proposal(proposal.clone()).encode().unwrap(), now);
    /// // The client's Proposal has arrived at `s`.
    /// assert!(matches!(s.poll_event(), Some(ServerEvent::Proposal(_))));
    /// s.accept(shm_link(1), now);
    /// assert!(matches!(decode(&s.poll_transmit().unwrap()), Ok(Decoded::Message(ClcMessage::Accept(_), _))));
    /// // The client's Confirm or Decline is awaited next, for `timeouts.peer`.
    /// assert!(s.wanted() > 0);
    /// assert_eq!(s.poll_timeout(), Some(now + timeouts.peer));
    /// ```
    pub fn accept(&mut self, local: LinkInfo, now: Instant) {
        if !matches!(self.state, ServerState::AwaitDecision) {
            return;
        }
        if now >= self.deadline {
            return self.send_decline(DeclineReason::Timeout);
        }
        match encode_link(false, self.secret, &local) {
            Ok(b) => {
                self.transmit = b;
                self.state = ServerState::AwaitAnswer(local);
                self.deadline = now + self.timeouts.peer;
            }
            Err(_) => self.send_decline(DeclineReason::Internal),
        }
    }

    /// Commits to SMC at `now`, once the link the Confirm names is ready: sends the Commit and
    /// the outcome becomes [`Outcome::Smc`]. Past the decision's deadline it declines with
    /// [`DeclineReason::Timeout`] instead. Does nothing unless a [`ServerEvent::Confirmed`] is
    /// waiting for a decision.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// feed(&mut s, &ClcMessage::Proposal(proposal.clone()).encode().unwrap(), now);
    /// s.poll_event();
    /// s.accept(shm_link(1), now);
    /// s.poll_transmit();
    /// feed(&mut s, &ClcMessage::Confirm(Confirm { secret: PAIR_SECRET, link: shm_link(2) }).encode().unwrap(), now);
    /// // `s` accepted with `shm_link(1)`; the client's Confirm has arrived.
    /// let Some(ServerEvent::Confirmed(peer)) = s.poll_event() else { panic!("no confirm") };
    /// // ... the link to `peer` is ready:
    /// s.commit(now);
    /// assert!(matches!(decode(&s.poll_transmit().unwrap()), Ok(Decoded::Message(ClcMessage::Commit(_), _))));
    /// assert_eq!(s.outcome(), Some(&Outcome::Smc { secret: PAIR_SECRET, local: shm_link(1), peer }));
    /// ```
    pub fn commit(&mut self, now: Instant) {
        if !matches!(self.state, ServerState::AwaitCommit { .. }) {
            return;
        }
        if now >= self.deadline {
            return self.send_decline(DeclineReason::Timeout);
        }
        let ServerState::AwaitCommit { local, peer } = std::mem::replace(&mut self.state, ServerState::AwaitDecision)
        else {
            return;
        };
        // A Commit has no variable fields, so it always encodes.
        self.transmit = ClcMessage::Commit(Commit { secret: self.secret }).encode().unwrap_or_default();
        self.finish(Outcome::Smc { secret: self.secret, local, peer });
    }

    /// Declines the pending Proposal or Confirm: the outcome becomes a local fallback. Does
    /// nothing unless a decision is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// feed(&mut s, &ClcMessage::Proposal(proposal.clone()).encode().unwrap(), now);
    /// s.poll_event();
    /// s.accept(shm_link(1), now);
    /// s.poll_transmit();
    /// feed(&mut s, &ClcMessage::Confirm(Confirm { secret: PAIR_SECRET, link: shm_link(2) }).encode().unwrap(), now);
    /// // `s` accepted with `shm_link(1)`; the client's Confirm has arrived.
    /// assert!(matches!(s.poll_event(), Some(ServerEvent::Confirmed(_))));
    /// s.decline(DeclineReason::OutOfMemory, now); // the link could not be set up
    /// assert!(matches!(decode(&s.poll_transmit().unwrap()), Ok(Decoded::Message(ClcMessage::Decline(_), _))));
    /// assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::OutOfMemory, by: Side::Local }));
    /// ```
    pub fn decline(&mut self, reason: DeclineReason, _now: Instant) {
        if matches!(self.state, ServerState::AwaitDecision | ServerState::AwaitCommit { .. }) {
            self.send_decline(reason);
        }
    }

    fn send_decline(&mut self, reason: DeclineReason) {
        self.transmit = decline_bytes(self.secret, reason);
        self.finish(Outcome::Fallback { reason, by: Side::Local });
    }

    /// Tells the machine the time. Past the deadline:
    /// - waiting for the Proposal with nothing of it received: a local fallback (nothing is
    ///   sent), and the Proposal is [owed](Self::owed_by_peer);
    /// - waiting for the client's answer to our Accept with nothing of it received: a Decline
    ///   goes out (the client is waiting for our final word) and the answer is owed;
    /// - a pending decision declines with [`DeclineReason::Timeout`];
    /// - a message half received fails the connection.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// feed(&mut s, &ClcMessage::Proposal(proposal.clone()).encode().unwrap(), now);
    /// // The client's Proposal arrived at `now`; our decision has `timeouts.local`.
    /// s.handle_timeout(now + timeouts.local / 2);
    /// assert!(!s.is_done());
    /// s.handle_timeout(now + timeouts.local);
    /// assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local }));
    /// assert!(s.poll_transmit().is_some()); // the Decline, for the client
    /// ```
    pub fn handle_timeout(&mut self, now: Instant) {
        if now < self.deadline {
            return;
        }
        match self.state {
            ServerState::AwaitProposal if self.inbox.is_empty() => {
                self.owed = Some(PeerOwes::Proposal);
                self.finish(Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local });
            }
            ServerState::AwaitAnswer(_) if self.inbox.is_empty() => {
                self.owed = Some(PeerOwes::Answer);
                self.send_decline(DeclineReason::Timeout);
            }
            ServerState::AwaitDecision | ServerState::AwaitCommit { .. } => self.send_decline(DeclineReason::Timeout),
            ServerState::AwaitProposal | ServerState::AwaitAnswer(_) => {
                self.finish(Outcome::Failed(HandshakeError::Timeout))
            }
            ServerState::Done(_) => {}
        }
    }

    /// Whether the handshake has ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// assert!(!s.is_done());
    /// s.handle_input(&[], now); // the client closed the connection
    /// assert!(s.is_done());
    /// assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Eof)));
    /// ```
    pub fn is_done(&self) -> bool {
        matches!(self.state, ServerState::Done(_))
    }

    /// The outcome, once done (send what [`poll_transmit`](Self::poll_transmit) holds first).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::{clc::*, handshake::*, pair::*};
    /// let HandshakePair { now, timeouts, .. } = HandshakePair::new();
    /// let proposal = shm_proposal();
    /// let mut s = ServerHandshake::new(now, timeouts);
    /// assert_eq!(s.outcome(), None);
    /// let mut bytes = ClcMessage::Proposal(proposal).encode().unwrap();
    /// bytes[4] = 99; // a CLC version this side does not speak
    /// let mut at = 0;
    /// while s.wanted() > 0 {
    ///     at += s.handle_input(&bytes[at..], now);
    /// }
    /// // Skipped whole and declined: the stream stays usable as TCP.
    /// assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::VersionMismatch, by: Side::Local }));
    /// ```
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
mod model;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::clc::{ClcType, Confirm, ShmLinkInfo, CLC_EYECATCHER, CLC_VERSION};
    use crate::proto::pair::TakesInput;

    const T: Duration = Duration::from_secs(2);

    fn t() -> Timeouts {
        Timeouts::uniform(T)
    }

    fn secret() -> Secret {
        Secret([0x42; 16])
    }

    fn proposal() -> Proposal {
        Proposal { secret: secret(), rmb_size: 0, shm: None, rdma: None }
    }

    fn shm(slot: u32, name: &[u8]) -> LinkInfo {
        LinkInfo::Shm(ShmLinkInfo { link_group: 1, rmb_slot: slot, rmb_size: 4096, socket_name: name.to_vec() })
    }

    fn rdma() -> LinkInfo {
        LinkInfo::Rdma(crate::proto::clc::RdmaLinkInfo {
            gid: [0; 16],
            qpn: 1,
            psn: 1,
            mtu: 1024,
            rkey: 1,
            rmb_addr: 0,
            rmb_size: 4096,
            rmb_token: 1,
            link_group: 1,
        })
    }

    /// Feeds `bytes` in chunks of at most `chunk` (a short read at a time, as a driver may get
    /// them); returns bytes left over.
    fn feed_chunked(hs: &mut impl TakesInput, bytes: &[u8], chunk: usize, now: Instant) -> usize {
        let mut at = 0;
        while hs.wanted() > 0 && at < bytes.len() {
            let n = hs.wanted().min(chunk).min(bytes.len() - at);
            at += hs.handle_input(&bytes[at..at + n], now);
        }
        bytes.len() - at
    }

    fn msg(m: ClcMessage) -> Vec<u8> {
        m.encode().unwrap()
    }

    fn decoded(b: &[u8]) -> ClcMessage {
        match decode(b).unwrap() {
            Decoded::Message(m, n) => {
                assert_eq!(n, b.len(), "exactly one message");
                m
            }
            other => panic!("not a whole message: {other:?}"),
        }
    }

    /// Runs both machines against each other, every byte passing between them; returns both
    /// outcomes and checks that each side consumed exactly what the other sent.
    fn run(
        server_decides: impl FnOnce(&mut ServerHandshake, Proposal),
        client_decides: impl FnOnce(&mut ClientHandshake, Accept),
        server_commits: impl FnOnce(&mut ServerHandshake, LinkInfo),
        chunk: usize,
    ) -> (Outcome, Outcome) {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        let mut s = ServerHandshake::new(now, t());
        let p = c.poll_transmit().unwrap();
        assert!(c.awaits_reply_start());
        assert_eq!(feed_chunked(&mut s, &p, chunk, now), 0);
        let Some(ServerEvent::Proposal(prop)) = s.poll_event() else { panic!("no proposal") };
        server_decides(&mut s, prop);
        let reply = s.poll_transmit().unwrap();
        assert_eq!(feed_chunked(&mut c, &reply, chunk, now), 0);
        if let Some(ClientEvent::Accepted(a)) = c.poll_event() {
            client_decides(&mut c, a);
            let answer = c.poll_transmit().expect("the client always answers an accept");
            assert!(!c.is_done(), "the client waits for the server's final word");
            assert_eq!(feed_chunked(&mut s, &answer, chunk, now), 0);
            if let Some(ServerEvent::Confirmed(peer)) = s.poll_event() {
                server_commits(&mut s, peer);
            }
            let last = s.poll_transmit().expect("the server always answers the client's answer");
            assert_eq!(feed_chunked(&mut c, &last, chunk, now), 0);
        }
        assert!(c.poll_transmit().is_none() && s.poll_transmit().is_none(), "nothing left to send");
        assert_eq!((c.wanted(), s.wanted()), (0, 0), "nothing left to read");
        (c.outcome().unwrap().clone(), s.outcome().unwrap().clone())
    }

    #[test]
    fn full_smc_handshake_any_chunking() {
        for chunk in [1, 3, 8, 1000] {
            let (c, s) = run(
                |s, _| s.accept(shm(1, b"srv"), Instant::now()),
                |c, a| {
                    assert_eq!(a.link, shm(1, b"srv"));
                    c.confirm(shm(2, b""), Instant::now())
                },
                |s, peer| {
                    assert_eq!(peer, shm(2, b""));
                    s.commit(Instant::now())
                },
                chunk,
            );
            assert_eq!(c, Outcome::Smc { secret: secret(), local: shm(2, b""), peer: shm(1, b"srv") });
            assert_eq!(s, Outcome::Smc { secret: secret(), local: shm(1, b"srv"), peer: shm(2, b"") });
        }
    }

    #[test]
    fn every_server_decline_reason_falls_back_on_both_sides() {
        for reason in DeclineReason::ALL {
            let (c, s) = run(
                |s, _| s.decline(reason, Instant::now()),
                |_, _| panic!("no accept"),
                |_, _| panic!("no confirm"),
                5,
            );
            assert_eq!(c, Outcome::Fallback { reason, by: Side::Peer });
            assert_eq!(s, Outcome::Fallback { reason, by: Side::Local });
        }
    }

    #[test]
    fn every_client_decline_reason_falls_back_on_both_sides() {
        for reason in DeclineReason::ALL {
            let (c, s) = run(
                |s, _| s.accept(shm(1, b"x"), Instant::now()),
                |c, _| c.decline(reason, Instant::now()),
                |_, _| panic!("no confirm"),
                7,
            );
            assert_eq!(c, Outcome::Fallback { reason, by: Side::Local });
            assert_eq!(s, Outcome::Fallback { reason, by: Side::Peer });
        }
    }

    #[test]
    fn a_server_that_gives_up_after_the_confirm_declines_in_step() {
        for reason in [DeclineReason::Timeout, DeclineReason::OutOfMemory, DeclineReason::SyncError] {
            let (c, s) = run(
                |s, _| s.accept(shm(1, b"x"), Instant::now()),
                |c, _| c.confirm(shm(2, b""), Instant::now()),
                |s, _| s.decline(reason, Instant::now()),
                4,
            );
            assert_eq!(c, Outcome::Fallback { reason, by: Side::Peer });
            assert_eq!(s, Outcome::Fallback { reason, by: Side::Local });
        }
    }

    #[test]
    fn client_never_reads_past_the_reply_or_the_final_word() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        c.poll_transmit();
        let mut bytes = msg(ClcMessage::Decline(Decline { secret: secret(), reason: DeclineReason::PeerNoSmc }));
        bytes.extend_from_slice(b"application data");
        assert_eq!(feed_chunked(&mut c, &bytes, 1 << 20, now), b"application data".len());
        assert!(c.is_done());
        assert_eq!(c.wanted(), 0);

        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        c.poll_transmit();
        let mut bytes = msg(ClcMessage::Accept(Accept { secret: secret(), link: shm(1, b"a") }));
        assert_eq!(feed_chunked(&mut c, &bytes, 1 << 20, now), 0);
        c.confirm(shm(2, b""), now);
        bytes = msg(ClcMessage::Commit(Commit { secret: secret() }));
        bytes.extend_from_slice(b"more");
        assert_eq!(feed_chunked(&mut c, &bytes, 1 << 20, now), 4);
        assert!(matches!(c.outcome(), Some(Outcome::Smc { .. })));
    }

    #[test]
    fn a_whole_message_handed_over_at_once_is_taken_in_one_call_and_no_further() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        c.poll_transmit();
        let accept = msg(ClcMessage::Accept(Accept { secret: secret(), link: shm(1, b"a") }));
        let mut bytes = accept.clone();
        bytes.extend_from_slice(b"next");
        assert_eq!(c.handle_input(&bytes, now), accept.len());
        assert!(matches!(c.poll_event(), Some(ClientEvent::Accepted(_))));
        c.confirm(shm(2, b""), now);
        let commit = msg(ClcMessage::Commit(Commit { secret: secret() }));
        assert_eq!(c.handle_input(&commit, now), commit.len());
        assert!(matches!(c.outcome(), Some(Outcome::Smc { .. })));

        let mut s = ServerHandshake::new(now, t());
        let p = msg(ClcMessage::Proposal(proposal()));
        let mut bytes = p.clone();
        bytes.extend_from_slice(&p);
        assert_eq!(s.handle_input(&bytes, now), p.len(), "one message, not the next");
        assert!(matches!(s.poll_event(), Some(ServerEvent::Proposal(_))));

        // What does not decode whole goes the header-first way, and fails as it did.
        let mut s = ServerHandshake::new(now, t());
        let mut bad = p.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        assert_eq!(s.handle_input(&bad, now), CLC_HEADER_LEN);
        s.handle_input(&bad[CLC_HEADER_LEN..], now);
        assert!(matches!(s.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(ClcError::BadTrailer)))));
    }

    #[test]
    fn client_meets_plain_server() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        feed_chunked(&mut c, b"HTTP/1.1 400 Bad Request\r\n", 100, now);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::NotSmc)));

        // A driver that looked at the first byte without taking it.
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        assert!(c.awaits_reply_start());
        c.peer_sent_data();
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::NotSmc)));
        // Once a reply has started, it no longer applies.
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        feed_chunked(&mut c, &CLC_EYECATCHER[..2], 100, now);
        assert!(!c.awaits_reply_start());
        c.peer_sent_data();
        assert!(!c.is_done());
    }

    #[test]
    fn client_meets_echo_server() {
        // An echo server sends our own Proposal back.
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        let p = c.poll_transmit().unwrap();
        feed_chunked(&mut c, &p, 100, now);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Unexpected { got: ClcType::Proposal })));
    }

    #[test]
    fn client_rejects_wrong_secret_eof_timeout_version_and_early_commit() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        let d = msg(ClcMessage::Decline(Decline { secret: Secret([0; 16]), reason: DeclineReason::Timeout }));
        feed_chunked(&mut c, &d, 100, now);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::SecretMismatch)));

        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        assert_eq!(c.handle_input(&[], now), 0);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Eof)));

        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        c.handle_timeout(now + T / 2);
        assert!(!c.is_done());
        assert_eq!(c.poll_timeout(), Some(now + T));
        c.handle_timeout(now + T);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Timeout)));
        assert_eq!(c.poll_timeout(), None);

        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        let mut d = msg(ClcMessage::Decline(Decline { secret: secret(), reason: DeclineReason::Timeout }));
        d[4] = CLC_VERSION + 1;
        feed_chunked(&mut c, &d, 100, now);
        assert!(matches!(c.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(_)))));

        // A Commit before any Accept, and a Commit answering our Decline.
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        feed_chunked(&mut c, &msg(ClcMessage::Commit(Commit { secret: secret() })), 100, now);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Unexpected { got: ClcType::Commit })));
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        feed_chunked(&mut c, &msg(ClcMessage::Accept(Accept { secret: secret(), link: shm(1, b"a") })), 100, now);
        c.decline(DeclineReason::Internal, now);
        feed_chunked(&mut c, &msg(ClcMessage::Commit(Commit { secret: secret() })), 100, now);
        assert_eq!(c.outcome(), Some(&Outcome::Failed(HandshakeError::Unexpected { got: ClcType::Commit })));
    }

    #[test]
    fn client_timeout_while_deciding_declines_and_still_waits_for_the_final_word() {
        let now = Instant::now();
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        c.poll_transmit();
        // The Accept arrives late in the server's window; the local decision gets its own bound
        // from then.
        let later = now + T - Duration::from_millis(1);
        feed_chunked(&mut c, &msg(ClcMessage::Accept(Accept { secret: secret(), link: shm(1, b"a") })), 100, later);
        assert!(matches!(c.poll_event(), Some(ClientEvent::Accepted(_))));
        assert_eq!(c.poll_timeout(), Some(later + T));
        c.handle_timeout(now + T);
        assert!(!c.is_done(), "the local decision's deadline is counted from the Accept");
        c.handle_timeout(later + T);
        assert!(!c.is_done(), "declined; the server's answer is awaited");
        let sent = c.poll_transmit().unwrap();
        assert!(matches!(decoded(&sent), ClcMessage::Decline(Decline { reason: DeclineReason::Timeout, .. })));
        feed_chunked(
            &mut c,
            &msg(ClcMessage::Decline(Decline { secret: secret(), reason: DeclineReason::Timeout })),
            100,
            later,
        );
        assert_eq!(c.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local }));

        // A confirm past the deadline declines instead.
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        feed_chunked(&mut c, &msg(ClcMessage::Accept(Accept { secret: secret(), link: shm(1, b"a") })), 100, now);
        c.confirm(shm(2, b""), now + T);
        assert!(matches!(decoded(&c.poll_transmit().unwrap()), ClcMessage::Decline(_)));
    }

    #[test]
    fn client_confirm_with_other_transport_declines() {
        let (c, s) = run(
            |s, _| s.accept(shm(1, b"x"), Instant::now()),
            |c, _| c.confirm(rdma(), Instant::now()),
            |_, _| panic!("no confirm"),
            64,
        );
        assert_eq!(c, Outcome::Fallback { reason: DeclineReason::Internal, by: Side::Local });
        assert_eq!(s, Outcome::Fallback { reason: DeclineReason::Internal, by: Side::Peer });
    }

    #[test]
    fn server_declines_unsupported_version_and_stays_in_step() {
        let now = Instant::now();
        let mut s = ServerHandshake::new(now, t());
        let mut p = msg(ClcMessage::Proposal(proposal()));
        p[4] = 7;
        p.extend_from_slice(b"after");
        assert_eq!(feed_chunked(&mut s, &p, 3, now), 5);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::VersionMismatch, by: Side::Local }));
        assert!(s.poll_transmit().is_some());
    }

    #[test]
    fn server_declines_malformed_body_but_fails_bad_framing() {
        let now = Instant::now();
        let good = msg(ClcMessage::Proposal(Proposal {
            secret: secret(),
            rmb_size: 0,
            shm: Some(crate::proto::clc::ShmOffer { link_group: 0 }),
            rdma: None,
        }));
        // Unknown section kind: framing intact, decline.
        let mut b = good.clone();
        b[CLC_HEADER_LEN + 20] = 99;
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &b, 100, now);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::SyncError, by: Side::Local }));

        // Bad trailer: framing broken, fail.
        let mut b = good.clone();
        let n = b.len();
        b[n - 2] = 0;
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &b, 100, now);
        assert!(matches!(s.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(ClcError::BadTrailer)))));

        // Bad length.
        let mut b = good;
        b[6..8].copy_from_slice(&5000u16.to_be_bytes());
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &b, 100, now);
        assert!(matches!(s.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(ClcError::BadLength(5000))))));

        // Garbage after the eyecatcher.
        let mut b = Vec::from(CLC_EYECATCHER);
        b.extend_from_slice(&[0xff; 20]);
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &b, 100, now);
        assert!(matches!(s.outcome(), Some(Outcome::Failed(HandshakeError::Malformed(_)))));
    }

    #[test]
    fn server_rejects_out_of_order_messages() {
        let now = Instant::now();
        for m in [
            ClcMessage::Accept(Accept { secret: secret(), link: shm(1, b"") }),
            ClcMessage::Confirm(Confirm { secret: secret(), link: shm(1, b"") }),
            ClcMessage::Decline(Decline { secret: secret(), reason: DeclineReason::Timeout }),
            ClcMessage::Commit(Commit { secret: secret() }),
        ] {
            let kind = m.kind();
            let mut s = ServerHandshake::new(now, t());
            feed_chunked(&mut s, &msg(m), 100, now);
            assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Unexpected { got: kind })));
        }
    }

    fn accepted_server(now: Instant) -> ServerHandshake {
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &msg(ClcMessage::Proposal(proposal())), 100, now);
        s.poll_event();
        s.accept(shm(1, b"n"), now);
        s.poll_transmit();
        s
    }

    #[test]
    fn server_answers_a_confirm_that_does_not_fit_with_a_decline() {
        let now = Instant::now();
        let mut s = accepted_server(now);
        feed_chunked(
            &mut s,
            &msg(ClcMessage::Confirm(Confirm { secret: Secret([1; 16]), link: shm(2, b"") })),
            100,
            now,
        );
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::SyncError, by: Side::Local }));
        assert!(matches!(decoded(&s.poll_transmit().unwrap()), ClcMessage::Decline(_)));

        let mut s = accepted_server(now);
        feed_chunked(&mut s, &msg(ClcMessage::Confirm(Confirm { secret: secret(), link: rdma() })), 100, now);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::SyncError, by: Side::Local }));

        let mut s = accepted_server(now);
        feed_chunked(&mut s, &msg(ClcMessage::Proposal(proposal())), 100, now);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Unexpected { got: ClcType::Proposal })));
    }

    #[test]
    fn server_timeouts_owe_the_late_message_and_keep_the_stream_in_step() {
        let now = Instant::now();
        // No proposal yet: fall back without sending anything; the proposal is owed.
        let mut s = ServerHandshake::new(now, t());
        s.handle_timeout(now + T);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local }));
        assert_eq!(s.owed_by_peer(), Some(PeerOwes::Proposal));
        assert!(s.poll_transmit().is_none());

        // Half a proposal: the stream is mid-message, fail.
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &msg(ClcMessage::Proposal(proposal()))[..10], 100, now);
        s.handle_timeout(now + T);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Timeout)));

        // A proposal not decided in time: decline.
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &msg(ClcMessage::Proposal(proposal())), 100, now);
        s.handle_timeout(now + T);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local }));
        assert_eq!(s.owed_by_peer(), None);
        let d = s.poll_transmit().unwrap();
        assert!(matches!(decoded(&d), ClcMessage::Decline(Decline { secret: t, .. }) if t == secret()));

        // An accept decided late declines instead.
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &msg(ClcMessage::Proposal(proposal())), 100, now);
        s.accept(shm(1, b"n"), now + T);
        assert!(matches!(decoded(&s.poll_transmit().unwrap()), ClcMessage::Decline(_)));

        // The client's answer to the Accept does not come in time: decline, and the answer is
        // owed. The client that confirmed meanwhile reads our Decline as the final word.
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &c.poll_transmit().unwrap(), 100, now);
        s.poll_event();
        s.accept(shm(1, b"n"), now);
        feed_chunked(&mut c, &s.poll_transmit().unwrap(), 100, now);
        c.poll_event();
        s.handle_timeout(now + T);
        assert_eq!(s.owed_by_peer(), Some(PeerOwes::Answer));
        let final_word = s.poll_transmit().unwrap();
        c.confirm(shm(2, b""), now + T / 2);
        let late_confirm = c.poll_transmit().unwrap();
        assert!(matches!(decoded(&late_confirm), ClcMessage::Confirm(_)), "owed by the client, taken by the driver");
        feed_chunked(&mut c, &final_word, 100, now + T);
        assert_eq!(c.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Peer }));

        // A confirmed link not committed in time: decline.
        let mut s = accepted_server(now);
        feed_chunked(&mut s, &msg(ClcMessage::Confirm(Confirm { secret: secret(), link: shm(2, b"") })), 100, now);
        assert!(matches!(s.poll_event(), Some(ServerEvent::Confirmed(_))));
        s.commit(now + T);
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::Timeout, by: Side::Local }));
        assert!(matches!(decoded(&s.poll_transmit().unwrap()), ClcMessage::Decline(_)));

        let mut s = ServerHandshake::new(now, t());
        s.handle_input(&[], now);
        assert_eq!(s.outcome(), Some(&Outcome::Failed(HandshakeError::Eof)));
    }

    #[test]
    fn server_deadlines_count_per_step() {
        let now = Instant::now();
        let mut s = ServerHandshake::new(now, Timeouts { peer: T, local: T / 4 });
        assert_eq!(s.poll_timeout(), Some(now + T));
        let at = now + T / 2;
        feed_chunked(&mut s, &msg(ClcMessage::Proposal(proposal())), 100, at);
        assert_eq!(s.poll_timeout(), Some(at + T / 4), "the decision is ours, with the local bound");
        s.poll_event();
        let accepted = at + T / 8;
        s.accept(shm(1, b"n"), accepted);
        assert_eq!(s.poll_timeout(), Some(accepted + T), "the client's answer gets the peer bound from the accept");
    }

    #[test]
    fn server_meets_a_client_that_sent_data_instead() {
        let now = Instant::now();
        let mut s = ServerHandshake::new(now, t());
        assert!(s.awaits_proposal_start());
        s.peer_sent_data();
        assert_eq!(s.outcome(), Some(&Outcome::Fallback { reason: DeclineReason::PeerNoSmc, by: Side::Peer }));
        assert!(s.poll_transmit().is_none(), "nothing is sent to such a client");
        let mut s = ServerHandshake::new(now, t());
        feed_chunked(&mut s, &CLC_EYECATCHER[..1], 1, now);
        s.peer_sent_data();
        assert!(!s.is_done(), "a proposal has started");
    }

    #[test]
    fn decisions_out_of_state_are_ignored() {
        let now = Instant::now();
        let mut s = ServerHandshake::new(now, t());
        s.accept(shm(1, b""), now);
        s.decline(DeclineReason::Internal, now);
        s.commit(now);
        assert!(!s.is_done());
        assert!(s.poll_transmit().is_none());
        let mut c = ClientHandshake::new(proposal(), now, t()).unwrap();
        c.poll_transmit();
        c.confirm(shm(1, b""), now);
        c.decline(DeclineReason::Internal, now);
        assert!(!c.is_done());
        assert!(c.poll_transmit().is_none());
    }
}
