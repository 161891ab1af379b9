//! Door frames: the messages of the same-host negotiation that travels beside a TCP connection,
//! over a listener's door (an abstract `SOCK_SEQPACKET` Unix socket). A client process keeps
//! one door connection per listener and runtime, and runs every registration and handshake of
//! its connections to that listener over it, each under an id of its choosing: it registers a
//! connection before it connects (naming its socket's cookie and port, and carrying its CLC
//! Proposal), and the CLC handshake then runs under the same id.
//!
//! One `SOCK_SEQPACKET` message carries one to [`DOOR_BATCH_FRAMES`] frames back to back, at
//! most [`DOOR_MSG_MAX`] bytes in all: each end gathers what its connections say in one turn of
//! its runtime into one message (one send, one read and one wake-up of the peer, where a message
//! per frame cost each of them per frame). Each frame is a [`DOOR_HEADER_LEN`]-byte header, then
//! its payload; integers big endian:
//!
//! | offset  | size | field                                                                  |
//! |---------|------|------------------------------------------------------------------------|
//! | 0..4    | 4    | magic, [`DOOR_MAGIC`] (`"SMCd"`)                                       |
//! | 4       | 1    | version, [`DOOR_VERSION`]                                              |
//! | 5       | 1    | kind, [`DoorKind`]: 1 Register, 2 Clc, 3 Unmatched, 4 Refused, 5 Cancel, 6 Connected |
//! | 6       | 1    | reason: a [`DeclineReason`](super::clc::DeclineReason) byte for Unmatched and Refused, else 0 |
//! | 7       | 1    | spare: sent as 0, ignored                                              |
//! | 8..16   | 8    | id: the registration the frame is about, chosen by the client          |
//! | 16..18  | 2    | length of the payload                                                  |
//! | 18..    | n    | payload                                                                |
//!
//! A Register's payload is a [`RegisterHead`] ([`REGISTER_HEAD_LEN`] bytes: the client's
//! link-group manager instance, its TCP socket's cookie and port) followed by the client's CLC
//! Proposal; a Clc frame's is one CLC message (Accept, Decline, Confirm, Commit); a Connected
//! frame's is a [`ConnectedTuple`] ([`CONNECTED_LEN`] bytes: the four-tuple of the client's TCP
//! connection, once it is up) followed by one CLC message (the client's first); Unmatched,
//! Refused and Cancel frames carry none. A CLC message is at most [`CLC_MAX_LEN`] bytes.
//! [`frames`] splits a message into its frames, [`DoorFrame::decode`] reads a message of one
//! frame, and [`RegisterHead::decode`] and [`ConnectedTuple::decode`] read the heads; they
//! check all of it, reject anything else with a [`DoorFrameError`] (a message with one bad
//! frame is bad as a whole), and never panic. The CLC message itself is decoded by
//! [`clc::decode`](super::clc::decode).

use std::fmt;

use super::clc::CLC_MAX_LEN;

/// First four bytes of every door frame.
pub const DOOR_MAGIC: [u8; 4] = *b"SMCd";
/// The door protocol version this crate speaks. It is also part of the doors' names, so
/// listeners and clients of different versions do not find each other.
pub const DOOR_VERSION: u8 = 4;
/// Length of a door frame's header; the payload follows it.
pub const DOOR_HEADER_LEN: usize = 18;
/// Frames one message carries at most: a client's window of registrations (64), the most that
/// one turn of a connection-per-request client's runtime has to say to one listener (with 64
/// clients, `smcperf crr`); more wait for the next message. It also bounds what one read
/// files, as a frame count, for the listener's turns.
pub const DOOR_BATCH_FRAMES: usize = 64;
/// Bytes one message carries at most: fifteen frames of the longest kind ([`DOOR_FRAME_MAX`])
/// and a window of the usual ones (about 100 to 250 bytes each). Far below a door connection's
/// send buffer (212 992 bytes by default, `net.core.wmem_default`), which a message must fit.
pub const DOOR_MSG_MAX: usize = 16 * 1024;
/// Length of a Register's [`RegisterHead`], before its Proposal.
pub const REGISTER_HEAD_LEN: usize = 18;
/// Length of a Connected frame's [`ConnectedTuple`], before its CLC message.
pub const CONNECTED_LEN: usize = 37;
/// Longest door frame: the header, the longer of the two heads (a Connected frame's tuple)
/// and the longest CLC message.
pub const DOOR_FRAME_MAX: usize = DOOR_HEADER_LEN + CONNECTED_LEN + CLC_MAX_LEN;

/// What a door frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DoorKind {
    /// Client to server, with a [`RegisterHead`] and the client's CLC Proposal as payload: "my
    /// next connection to you, from the socket with this cookie and port, proposes SMC".
    Register = 1,
    /// Either way: a CLC message of the handshake (Accept, Decline, Confirm, Commit) as payload.
    Clc = 2,
    /// Server to client, at registration, with a decline reason: "no handshake with me". Another
    /// door of a reuseport group may still take the connection.
    Unmatched = 3,
    /// Server to client, with a decline reason: "your connection reached me, and it stays TCP".
    /// Final: no other door of the group will see the connection.
    Refused = 4,
    /// Client to server: "I stopped waiting; the connection is TCP" (before its Confirm).
    Cancel = 5,
    /// Client to server, its first CLC message (Confirm or Decline) after a [`ConnectedTuple`]:
    /// "my connection is up, from here to there". A listener that answered before the
    /// connection arrived checks the tuple with the kernel, and may commit before it accepts.
    Connected = 6,
}

impl DoorKind {
    /// Every kind, in wire order.
    pub const ALL: [DoorKind; 6] =
        [Self::Register, Self::Clc, Self::Unmatched, Self::Refused, Self::Cancel, Self::Connected];

    /// The kind with wire value `v`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::DoorKind;
    ///
    /// assert_eq!(DoorKind::from_u8(2), Some(DoorKind::Clc));
    /// assert_eq!(DoorKind::from_u8(DoorKind::Cancel as u8), Some(DoorKind::Cancel));
    /// assert_eq!(DoorKind::from_u8(0), None);
    /// assert_eq!(DoorKind::from_u8(7), None);
    /// ```
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == v)
    }

    /// Whether a client may send a frame of this kind (the others are a server's answers).
    pub(crate) fn client_sends(self) -> bool {
        match self {
            Self::Register | Self::Clc | Self::Cancel | Self::Connected => true,
            Self::Unmatched | Self::Refused => false,
        }
    }

    /// Whether frames of this kind carry a payload: Register, Clc and Connected do, the others
    /// do not.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::DoorKind;
    ///
    /// assert!(DoorKind::Register.has_payload());
    /// assert!(DoorKind::Clc.has_payload());
    /// assert!(!DoorKind::Unmatched.has_payload());
    /// assert!(!DoorKind::Refused.has_payload());
    /// assert!(!DoorKind::Cancel.has_payload());
    /// ```
    pub const fn has_payload(self) -> bool {
        matches!(self, Self::Register | Self::Clc | Self::Connected)
    }

    /// The longest payload a frame of this kind may have.
    const fn max_payload(self) -> usize {
        match self {
            Self::Register => REGISTER_HEAD_LEN + CLC_MAX_LEN,
            Self::Clc => CLC_MAX_LEN,
            Self::Connected => CONNECTED_LEN + CLC_MAX_LEN,
            _ => 0,
        }
    }
}

/// A door frame's header (its payload travels beside it, see [`DoorFrame::encode`]).
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::door::{DoorFrame, DoorKind, DOOR_HEADER_LEN};
///
/// let frame = DoorFrame { kind: DoorKind::Clc, reason: 0, id: 0x0102_0304_0506_0708 };
/// let bytes = frame.encode(b"a CLC message");
/// assert_eq!(bytes.len(), DOOR_HEADER_LEN + 13);
/// assert_eq!(DoorFrame::decode(&bytes), Ok((frame, &b"a CLC message"[..])));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DoorFrame {
    /// What the frame says.
    pub kind: DoorKind,
    /// For Unmatched and Refused, why: a [`DeclineReason`](super::clc::DeclineReason) byte
    /// (not checked here: a reason this version does not know still ends the wait). 0 otherwise,
    /// and ignored by the receiver.
    pub reason: u8,
    /// The registration the frame is about: chosen by the client in its Register, unique on
    /// its door connection while the registration lives, and repeated in every frame of its
    /// handshake, either way.
    pub id: u64,
}

/// The head of a Register's payload, before the client's Proposal: who registers, and which
/// socket the connection will come from.
///
/// | offset | size | field                                                              |
/// |--------|------|--------------------------------------------------------------------|
/// | 0..8   | 8    | instance: the client's link-group manager (a restarted process with a reused pid is another client) |
/// | 8..16  | 8    | cookie: the client's TCP socket's `SO_COOKIE`                        |
/// | 16..18 | 2    | port: the port that socket is bound to                             |
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::door::{DoorFrame, DoorKind, RegisterHead};
///
/// let head = RegisterHead { instance: 7, cookie: 0xC00C_1E, port: 40_000 };
/// let bytes = head.encode_frame(1, b"a proposal");
/// let (frame, payload) = DoorFrame::decode(&bytes).unwrap();
/// assert_eq!((frame.kind, frame.id), (DoorKind::Register, 1));
/// assert_eq!(RegisterHead::decode(payload), Ok((head, &b"a proposal"[..])));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegisterHead {
    /// The client's link-group manager instance.
    pub instance: u64,
    /// The kernel's cookie of the client's TCP socket (`SO_COOKIE`).
    pub cookie: u64,
    /// The port the client's TCP socket is bound to.
    pub port: u16,
}

impl RegisterHead {
    /// The whole Register frame for registration `id`: header, this head, then `proposal`.
    pub fn encode_frame(&self, id: u64, proposal: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        self.encode_into(&mut b, id, proposal);
        b
    }

    /// Appends the Register frame for registration `id` to `out` (see [`frames`]).
    pub fn encode_into(&self, out: &mut Vec<u8>, id: u64, proposal: &[u8]) {
        let mut head = [0u8; REGISTER_HEAD_LEN];
        head[..8].copy_from_slice(&self.instance.to_be_bytes());
        head[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        head[16..].copy_from_slice(&self.port.to_be_bytes());
        DoorFrame { kind: DoorKind::Register, reason: 0, id }.encode_parts(out, &head, proposal);
    }

    /// Splits a Register's payload (as [`DoorFrame::decode`] returned it) into its head and
    /// the Proposal after it, which must not be empty nor longer than [`CLC_MAX_LEN`].
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::{DoorFrameError, RegisterHead};
    ///
    /// assert_eq!(RegisterHead::decode(&[0; 18]), Err(DoorFrameError::ShortRegister(18)));
    /// assert!(RegisterHead::decode(&[0; 19]).is_ok());
    /// ```
    pub fn decode(payload: &[u8]) -> Result<(RegisterHead, &[u8]), DoorFrameError> {
        let (head, proposal) = split_head::<REGISTER_HEAD_LEN>(payload, DoorFrameError::ShortRegister)?;
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let port = u16::from_be_bytes([head[16], head[17]]);
        Ok((RegisterHead { instance: u64_at(0), cookie: u64_at(8), port }, proposal))
    }
}

/// The four-tuple of a client's TCP connection, as the client sees it, at the head of a
/// Connected frame.
///
/// | offset | size | field                                                           |
/// |--------|------|-----------------------------------------------------------------|
/// | 0      | 1    | family: 4 or 6                                                  |
/// | 1..17  | 16   | the client's address (IPv4 in the first 4 bytes, the rest 0)    |
/// | 17..19 | 2    | the client's port                                               |
/// | 19..35 | 16   | the server's address, as above                                  |
/// | 35..37 | 2    | the server's port                                               |
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::door::{ConnectedTuple, DoorFrame, DoorKind};
///
/// let t = ConnectedTuple { local: "127.0.0.1:40000".parse().unwrap(), peer: "127.0.0.1:8080".parse().unwrap() };
/// let bytes = t.encode_frame(3, b"a confirm");
/// let (frame, payload) = DoorFrame::decode(&bytes).unwrap();
/// assert_eq!((frame.kind, frame.id), (DoorKind::Connected, 3));
/// assert_eq!(ConnectedTuple::decode(payload), Ok((t, &b"a confirm"[..])));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectedTuple {
    /// The client's end.
    pub local: std::net::SocketAddr,
    /// The server's end.
    pub peer: std::net::SocketAddr,
}

impl ConnectedTuple {
    /// The whole Connected frame for registration `id`: header, this tuple, then `clc`. A pair
    /// of mixed families is written as IPv6 (IPv4 addresses mapped).
    pub fn encode_frame(&self, id: u64, clc: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        self.encode_into(&mut b, id, clc);
        b
    }

    /// Appends the Connected frame for registration `id` to `out` (see [`frames`]).
    pub fn encode_into(&self, out: &mut Vec<u8>, id: u64, clc: &[u8]) {
        use std::net::IpAddr;
        let both_v4 = self.local.is_ipv4() && self.peer.is_ipv4();
        let mut head = [0u8; CONNECTED_LEN];
        head[0] = if both_v4 { 4 } else { 6 };
        for (i, a) in [self.local, self.peer].into_iter().enumerate() {
            let at = 1 + i * 18;
            let ip = &mut head[at..at + 16];
            match (a.ip(), both_v4) {
                (IpAddr::V4(v4), true) => ip[..4].copy_from_slice(&v4.octets()),
                (IpAddr::V4(v4), false) => ip.copy_from_slice(&v4.to_ipv6_mapped().octets()),
                (IpAddr::V6(v6), _) => ip.copy_from_slice(&v6.octets()),
            }
            head[at + 16..at + 18].copy_from_slice(&a.port().to_be_bytes());
        }
        DoorFrame { kind: DoorKind::Connected, reason: 0, id }.encode_parts(out, &head, clc);
    }

    /// Splits a Connected frame's payload into its tuple and the CLC message after it, which
    /// must not be empty nor longer than [`CLC_MAX_LEN`].
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::{ConnectedTuple, DoorFrameError};
    ///
    /// assert_eq!(ConnectedTuple::decode(&[4; 37]), Err(DoorFrameError::ShortConnected(37)));
    /// let mut b = [0u8; 38];
    /// b[0] = 5;
    /// assert_eq!(ConnectedTuple::decode(&b), Err(DoorFrameError::BadFamily(5)));
    /// ```
    pub fn decode(payload: &[u8]) -> Result<(ConnectedTuple, &[u8]), DoorFrameError> {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
        let (head, clc) = split_head::<CONNECTED_LEN>(payload, DoorFrameError::ShortConnected)?;
        let addr = |at: usize| -> Result<SocketAddr, DoorFrameError> {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&head[at..at + 16]);
            let port = u16::from_be_bytes([head[at + 16], head[at + 17]]);
            match head[0] {
                4 if ip[4..].iter().all(|b| *b == 0) => {
                    Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])), port))
                }
                4 => Err(DoorFrameError::BadFamily(4)),
                6 => Ok(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
                f => Err(DoorFrameError::BadFamily(f)),
            }
        };
        Ok((ConnectedTuple { local: addr(1)?, peer: addr(19)? }, clc))
    }
}

/// Splits a payload into its fixed `N`-byte head and the CLC message after it, which must not
/// be empty (`short` of the payload's length) nor longer than [`CLC_MAX_LEN`].
fn split_head<const N: usize>(
    payload: &[u8],
    short: fn(usize) -> DoorFrameError,
) -> Result<(&[u8; N], &[u8]), DoorFrameError> {
    match payload.split_first_chunk::<N>() {
        Some((_, [])) | None => Err(short(payload.len())),
        Some((_, clc)) if clc.len() > CLC_MAX_LEN => Err(DoorFrameError::PayloadTooLong(clc.len())),
        Some((head, clc)) => Ok((head, clc)),
    }
}

/// Why a door frame was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorFrameError {
    /// The frame is shorter than its header; the frame's length.
    TooShort(usize),
    /// The first bytes are not [`DOOR_MAGIC`].
    BadMagic,
    /// A version this crate does not speak.
    BadVersion(u8),
    /// A kind this version does not define.
    UnknownKind(u8),
    /// A frame of a kind that carries no payload (Unmatched, Refused, Cancel) came with this
    /// many bytes of it.
    UnexpectedPayload {
        /// The frame's kind.
        kind: DoorKind,
        /// The payload's length.
        len: usize,
    },
    /// A frame of a kind that carries a payload (Register, Clc) came without one.
    MissingPayload(DoorKind),
    /// The payload (or a Register's Proposal) is longer than its kind allows; its length.
    PayloadTooLong(usize),
    /// A Register's payload of this many bytes has no room for its head and a Proposal.
    ShortRegister(usize),
    /// A Connected frame's payload of this many bytes has no room for its tuple and a CLC
    /// message.
    ShortConnected(usize),
    /// A Connected frame's tuple has a family byte that is neither 4 nor 6 (or an IPv4
    /// address with bytes past its fourth).
    BadFamily(u8),
    /// A frame's header says its payload is `said` bytes long, and only `left` follow it.
    Truncated {
        /// The payload's length, as the header gave it.
        said: usize,
        /// The bytes after the header.
        left: usize,
    },
    /// [`DoorFrame::decode`] was given a message with this many bytes after its first frame.
    Trailing(usize),
    /// A message of this many bytes, longer than [`DOOR_MSG_MAX`].
    MessageTooLong(usize),
    /// A message of more than [`DOOR_BATCH_FRAMES`] frames.
    TooManyFrames,
}

impl fmt::Display for DoorFrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DoorFrameError::TooShort(n) => {
                write!(f, "door frame of {n} bytes is shorter than its {DOOR_HEADER_LEN}-byte header")
            }
            DoorFrameError::BadMagic => f.write_str("door frame does not start with the magic \"SMCd\""),
            DoorFrameError::BadVersion(v) => {
                write!(f, "door frame version {v} is not supported (this is {DOOR_VERSION})")
            }
            DoorFrameError::UnknownKind(k) => write!(f, "unknown door frame kind {k}"),
            DoorFrameError::UnexpectedPayload { kind, len } => {
                write!(f, "door {kind:?} frame carries {len} payload bytes, expected none")
            }
            DoorFrameError::MissingPayload(kind) => write!(f, "door {kind:?} frame without its payload"),
            DoorFrameError::PayloadTooLong(n) => {
                write!(f, "door frame payload of {n} bytes is longer than its kind allows")
            }
            DoorFrameError::ShortRegister(n) => {
                write!(
                    f,
                    "door registration of {n} bytes has no room for its {REGISTER_HEAD_LEN}-byte head and a proposal"
                )
            }
            DoorFrameError::ShortConnected(n) => write!(
                f,
                "door connected frame of {n} bytes has no room for its {CONNECTED_LEN}-byte tuple and a clc message"
            ),
            DoorFrameError::BadFamily(v) => write!(f, "door connected frame with address family {v}"),
            DoorFrameError::Truncated { said, left } => {
                write!(f, "door frame says its payload is {said} bytes, and {left} follow its header")
            }
            DoorFrameError::Trailing(n) => write!(f, "{n} bytes after a door message's only frame"),
            DoorFrameError::MessageTooLong(n) => {
                write!(f, "door message of {n} bytes is longer than the {DOOR_MSG_MAX} a message may be")
            }
            DoorFrameError::TooManyFrames => {
                write!(f, "door message of more than the {DOOR_BATCH_FRAMES} frames a message may carry")
            }
        }
    }
}

impl std::error::Error for DoorFrameError {}

impl DoorFrame {
    /// The frame with `payload` after its header, ready to send as one message. Nothing is
    /// checked: a payload belongs to Register and Clc frames only, within their bounds, or the
    /// receiver's [`decode`](Self::decode) rejects the frame.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::{DoorFrame, DoorKind};
    ///
    /// // An Unmatched answer to registration 9 with reason 5 (handshake congested).
    /// let bytes = DoorFrame { kind: DoorKind::Unmatched, reason: 5, id: 9 }.encode(&[]);
    /// assert_eq!(bytes, b"SMCd\x04\x03\x05\x00\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00");
    /// ```
    pub fn encode(&self, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(DOOR_HEADER_LEN + payload.len());
        self.encode_into(&mut b, payload);
        b
    }

    /// Appends the frame with `payload` to `out` (a message being gathered, see [`frames`]).
    pub fn encode_into(&self, out: &mut Vec<u8>, payload: &[u8]) {
        self.encode_parts(out, &[], payload);
    }

    /// Appends the frame with a payload of `head` then `rest` to `out`. A payload longer than
    /// a length field holds is written with the field's largest value, which no receiver takes.
    fn encode_parts(&self, b: &mut Vec<u8>, head: &[u8], rest: &[u8]) {
        let len = u16::try_from(head.len() + rest.len()).unwrap_or(u16::MAX);
        b.reserve(DOOR_HEADER_LEN + head.len() + rest.len());
        b.extend_from_slice(&DOOR_MAGIC);
        b.push(DOOR_VERSION);
        b.push(self.kind as u8);
        b.push(self.reason);
        b.push(0);
        b.extend_from_slice(&self.id.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(head);
        b.extend_from_slice(rest);
    }

    /// Decodes a message of exactly one frame: its header and its payload (empty but for
    /// Register, Clc and Connected). The spare byte is ignored.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::{DoorFrame, DoorFrameError, DoorKind};
    ///
    /// let frame = DoorFrame { kind: DoorKind::Clc, reason: 0, id: 3 };
    /// let mut bytes = frame.encode(b"a CLC message");
    /// assert_eq!(DoorFrame::decode(&bytes), Ok((frame, &b"a CLC message"[..])));
    ///
    /// assert_eq!(DoorFrame::decode(&bytes[..17]), Err(DoorFrameError::TooShort(17)));
    /// assert_eq!(DoorFrame::decode(&bytes[..20]), Err(DoorFrameError::Truncated { said: 13, left: 2 }));
    /// let mut two = bytes.clone();
    /// frame.encode_into(&mut two, b"another");
    /// assert_eq!(DoorFrame::decode(&two), Err(DoorFrameError::Trailing(25)));
    /// bytes[4] = 2; // another version
    /// assert_eq!(DoorFrame::decode(&bytes), Err(DoorFrameError::BadVersion(2)));
    /// ```
    pub fn decode(b: &[u8]) -> Result<(DoorFrame, &[u8]), DoorFrameError> {
        match DoorFrame::decode_first(b)? {
            (frame, payload, []) => Ok((frame, payload)),
            (_, _, rest) => Err(DoorFrameError::Trailing(rest.len())),
        }
    }

    /// Decodes the frame at the start of `b`: its header, its payload, and the bytes after it.
    fn decode_first(b: &[u8]) -> Result<(DoorFrame, &[u8], &[u8]), DoorFrameError> {
        let Some((header, after)) = b.split_first_chunk::<DOOR_HEADER_LEN>() else {
            return Err(DoorFrameError::TooShort(b.len()));
        };
        if header[..4] != DOOR_MAGIC {
            return Err(DoorFrameError::BadMagic);
        }
        if header[4] != DOOR_VERSION {
            return Err(DoorFrameError::BadVersion(header[4]));
        }
        let kind = DoorKind::from_u8(header[5]).ok_or(DoorFrameError::UnknownKind(header[5]))?;
        let len = usize::from(u16::from_be_bytes([header[16], header[17]]));
        // Bounded before anything else about the payload is looked at.
        if len > kind.max_payload().max(CLC_MAX_LEN) {
            return Err(DoorFrameError::PayloadTooLong(len));
        }
        let Some((payload, rest)) = after.split_at_checked(len) else {
            return Err(DoorFrameError::Truncated { said: len, left: after.len() });
        };
        match (kind.has_payload(), payload.is_empty()) {
            (true, true) => return Err(DoorFrameError::MissingPayload(kind)),
            (false, false) => return Err(DoorFrameError::UnexpectedPayload { kind, len }),
            _ => {}
        }
        if len > kind.max_payload() {
            return Err(DoorFrameError::PayloadTooLong(len));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&header[8..16]);
        Ok((DoorFrame { kind, reason: header[6], id: u64::from_be_bytes(id) }, payload, rest))
    }
}

/// The frames of one message, each with its payload, once the whole message was checked: at
/// least one frame and at most [`DOOR_BATCH_FRAMES`], at most [`DOOR_MSG_MAX`] bytes, every
/// frame whole and valid, nothing after the last. A message with anything wrong is rejected as
/// a whole, so that none of its frames is acted on. (Whether each frame may come from the
/// sender, a Register from a server say, is the receiver's to check.)
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::door::{frames, DoorFrame, DoorFrameError, DoorKind, RegisterHead};
///
/// let mut msg = RegisterHead { instance: 7, cookie: 8, port: 40_000 }.encode_frame(1, b"a proposal");
/// let cancel = DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 2 };
/// cancel.encode_into(&mut msg, &[]);
/// let got: Vec<_> = frames(&msg).unwrap().map(|(f, _)| (f.kind, f.id)).collect();
/// assert_eq!(got, [(DoorKind::Register, 1), (DoorKind::Cancel, 2)]);
///
/// msg.push(0); // a byte that is no frame
/// assert_eq!(frames(&msg).err(), Some(DoorFrameError::TooShort(1)));
/// assert_eq!(frames(&[]).err(), Some(DoorFrameError::TooShort(0)));
/// ```
pub fn frames(msg: &[u8]) -> Result<Frames<'_>, DoorFrameError> {
    if msg.len() > DOOR_MSG_MAX {
        return Err(DoorFrameError::MessageTooLong(msg.len()));
    }
    let mut rest = msg;
    let mut count = 0;
    loop {
        let (_, _, after) = DoorFrame::decode_first(rest)?;
        count += 1;
        if count > DOOR_BATCH_FRAMES {
            return Err(DoorFrameError::TooManyFrames);
        }
        if after.is_empty() {
            return Ok(Frames { rest: msg });
        }
        rest = after;
    }
}

/// The frames of a message [`frames`] checked, in order.
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Frames<'a> {
    type Item = (DoorFrame, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        // Checked whole by `frames`: this cannot fail, and ends the walk if it did.
        let (frame, payload, rest) = DoorFrame::decode_first(self.rest).ok()?;
        self.rest = rest;
        Some((frame, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_frame_layout() {
        let head = RegisterHead { instance: 0x1122_3344_5566_7788, cookie: 0x0102_0304_0506_0708, port: 0xABCD };
        let bytes = head.encode_frame(0x99, &[0xAA, 0xBB]);
        let mut want = vec![b'S', b'M', b'C', b'd', 4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x99, 0, 20];
        want.extend_from_slice(&[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        want.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 0xAB, 0xCD, 0xAA, 0xBB]);
        assert_eq!(bytes, want);
        let refused = DoorFrame { kind: DoorKind::Refused, reason: 7, id: 0 }.encode(&[]);
        assert_eq!(refused, [b'S', b'M', b'C', b'd', 4, 4, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    /// A Connected frame's bytes, in both families: four-byte addresses when both ends are
    /// IPv4 (padded to sixteen), else both as IPv6 (an IPv4 end mapped).
    #[test]
    fn known_connected_layout() {
        let v4_local = [127, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let v4_peer = [127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mapped_local = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 2];
        let v6_peer = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let cases = [("127.0.0.1:80", 4, v4_local, v4_peer), ("[::1]:80", 6, mapped_local, v6_peer)];
        for (peer, family, local_ip, peer_ip) in cases {
            let tuple = ConnectedTuple { local: "127.0.0.2:4660".parse().unwrap(), peer: peer.parse().unwrap() };
            let mut want = vec![b'S', b'M', b'C', b'd', 4, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 40, family];
            want.extend_from_slice(&local_ip);
            want.extend_from_slice(&[0x12, 0x34]);
            want.extend_from_slice(&peer_ip);
            want.extend_from_slice(&[0, 80]);
            want.extend_from_slice(b"clc");
            assert_eq!(tuple.encode_frame(5, b"clc"), want, "to {peer}");
        }
    }

    #[test]
    fn round_trip_every_kind() {
        for kind in DoorKind::ALL {
            let payload: &[u8] = if kind.has_payload() { b"payload" } else { b"" };
            for (reason, id) in [(0, 0), (8, u64::MAX), (0xFF, 0x0102_0304_0506_0708)] {
                let frame = DoorFrame { kind, reason, id };
                let bytes = frame.encode(payload);
                assert_eq!(bytes.len(), DOOR_HEADER_LEN + payload.len());
                assert_eq!(DoorFrame::decode(&bytes), Ok((frame, payload)));
            }
        }
        // The longest payloads.
        let frame = DoorFrame { kind: DoorKind::Clc, reason: 0, id: 0 };
        let long = vec![0x5A; CLC_MAX_LEN];
        let bytes = frame.encode(&long);
        assert_eq!(DoorFrame::decode(&bytes), Ok((frame, &long[..])));
        let head = RegisterHead { instance: 1, cookie: 2, port: 3 };
        let bytes = head.encode_frame(4, &long);
        assert_eq!(bytes.len(), DOOR_HEADER_LEN + REGISTER_HEAD_LEN + CLC_MAX_LEN);
        let tuple = ConnectedTuple { local: "[::1]:1".parse().unwrap(), peer: "[::1]:2".parse().unwrap() };
        assert_eq!(tuple.encode_frame(4, &long).len(), DOOR_FRAME_MAX, "the longest frame is a Connected one");
        let (f, payload) = DoorFrame::decode(&bytes).unwrap();
        assert_eq!(f, DoorFrame { kind: DoorKind::Register, reason: 0, id: 4 });
        assert_eq!(RegisterHead::decode(payload), Ok((head, &long[..])));
    }

    #[test]
    fn the_spare_byte_is_ignored() {
        let frame = DoorFrame { kind: DoorKind::Unmatched, reason: 5, id: 1 };
        let mut bytes = frame.encode(&[]);
        bytes[7] = 0xEE;
        assert_eq!(DoorFrame::decode(&bytes), Ok((frame, &[][..])));
    }

    #[test]
    fn every_error() {
        let good = DoorFrame { kind: DoorKind::Clc, reason: 0, id: 9 }.encode(b"p");
        assert_eq!(DoorFrame::decode(&[]), Err(DoorFrameError::TooShort(0)));
        assert_eq!(DoorFrame::decode(&good[..DOOR_HEADER_LEN - 1]), Err(DoorFrameError::TooShort(17)));
        assert_eq!(DoorFrame::decode(&good[..DOOR_HEADER_LEN]), Err(DoorFrameError::Truncated { said: 1, left: 0 }));
        let mut b = good.clone();
        b.push(0);
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::Trailing(1)));

        let mut b = good.clone();
        b[3] = b'D';
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::BadMagic));

        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::BadVersion(2)));

        for k in [0, 7, 0xFF] {
            let mut b = good.clone();
            b[5] = k;
            assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::UnknownKind(k)));
        }

        for kind in [DoorKind::Unmatched, DoorKind::Refused, DoorKind::Cancel] {
            let b = DoorFrame { kind, reason: 1, id: 0 }.encode(b"xyz");
            assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::UnexpectedPayload { kind, len: 3 }));
        }

        for kind in [DoorKind::Register, DoorKind::Clc, DoorKind::Connected] {
            let b = DoorFrame { kind, reason: 0, id: 0 }.encode(&[]);
            assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::MissingPayload(kind)));
        }

        let b = DoorFrame { kind: DoorKind::Clc, reason: 0, id: 0 }.encode(&vec![0; CLC_MAX_LEN + 1]);
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::PayloadTooLong(CLC_MAX_LEN + 1)));
        // Bounded before anything else about the payload is looked at.
        let b = DoorFrame { kind: DoorKind::Refused, reason: 0, id: 0 }.encode(&vec![0; CLC_MAX_LEN + 1]);
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::PayloadTooLong(CLC_MAX_LEN + 1)));
        let b = DoorFrame { kind: DoorKind::Register, reason: 0, id: 0 }.encode(&vec![0; DOOR_FRAME_MAX]);
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::PayloadTooLong(DOOR_FRAME_MAX)));

        assert_eq!(RegisterHead::decode(&[0; 5]), Err(DoorFrameError::ShortRegister(5)));
        assert_eq!(RegisterHead::decode(&[0; REGISTER_HEAD_LEN]), Err(DoorFrameError::ShortRegister(18)));
        let long = vec![0; REGISTER_HEAD_LEN + CLC_MAX_LEN + 1];
        assert_eq!(RegisterHead::decode(&long), Err(DoorFrameError::PayloadTooLong(CLC_MAX_LEN + 1)));
    }

    #[test]
    fn connected_tuples_round_trip_in_both_families() {
        let cases = [
            ("127.0.0.1:40000", "127.0.0.1:8080"),
            ("[::1]:40000", "[::1]:8080"),
            ("127.0.0.1:1", "[::ffff:127.0.0.2]:2"),
        ];
        for (l, p) in cases {
            let t = ConnectedTuple { local: l.parse().unwrap(), peer: p.parse().unwrap() };
            let bytes = t.encode_frame(9, b"clc");
            let (f, payload) = DoorFrame::decode(&bytes).unwrap();
            assert_eq!(f.kind, DoorKind::Connected);
            let (got, clc) = ConnectedTuple::decode(payload).unwrap();
            assert_eq!(clc, b"clc");
            if t.local.is_ipv4() && t.peer.is_ipv4() {
                assert_eq!(got, t);
            } else {
                // Mixed families travel as IPv6, the IPv4 side mapped.
                assert_eq!(got.peer, t.peer);
                assert_eq!(got.local.port(), t.local.port());
            }
        }
        let mut bad = ConnectedTuple { local: "1.2.3.4:5".parse().unwrap(), peer: "1.2.3.4:6".parse().unwrap() }
            .encode_frame(1, b"x");
        bad[DOOR_HEADER_LEN + 10] = 1;
        let (_, payload) = DoorFrame::decode(&bad).unwrap();
        assert_eq!(ConnectedTuple::decode(payload), Err(DoorFrameError::BadFamily(4)));
    }

    /// A message of several frames: each is read back in order with its payload; the most a
    /// message may carry is taken, one frame or byte more is not, and one bad frame anywhere
    /// rejects the whole message.
    #[test]
    fn messages_carry_frames_back_to_back() {
        let register = RegisterHead { instance: 1, cookie: 2, port: 3 };
        let tuple = ConnectedTuple { local: "127.0.0.1:1".parse().unwrap(), peer: "127.0.0.1:2".parse().unwrap() };
        let mut msg = Vec::new();
        register.encode_into(&mut msg, 1, b"proposal");
        tuple.encode_into(&mut msg, 2, b"confirm");
        DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 3 }.encode_into(&mut msg, &[]);
        DoorFrame { kind: DoorKind::Clc, reason: 0, id: 4 }.encode_into(&mut msg, b"commit");
        let got: Vec<(DoorFrame, &[u8])> = frames(&msg).unwrap().collect();
        assert_eq!(got.len(), 4);
        assert_eq!((got[0].0.kind, got[0].0.id), (DoorKind::Register, 1));
        assert_eq!(RegisterHead::decode(got[0].1), Ok((register, &b"proposal"[..])));
        assert_eq!((got[1].0.kind, got[1].0.id), (DoorKind::Connected, 2));
        assert_eq!(ConnectedTuple::decode(got[1].1), Ok((tuple, &b"confirm"[..])));
        assert_eq!((got[2].0.kind, got[2].0.id, got[2].1), (DoorKind::Cancel, 3, &[][..]));
        assert_eq!((got[3].0.kind, got[3].0.id, got[3].1), (DoorKind::Clc, 4, &b"commit"[..]));

        // A bad frame anywhere, or a cut one at the end: nothing of the message is taken.
        for at in [0, 1, 3] {
            let mut bad = Vec::new();
            for i in 0..4u64 {
                let f = DoorFrame { kind: DoorKind::Cancel, reason: 0, id: i };
                f.encode_into(&mut bad, if i == at { b"x" } else { b"" });
            }
            let err = DoorFrameError::UnexpectedPayload { kind: DoorKind::Cancel, len: 1 };
            assert_eq!(frames(&bad).err(), Some(err), "bad frame {at}");
        }
        assert_eq!(frames(&msg[..msg.len() - 1]).err(), Some(DoorFrameError::Truncated { said: 6, left: 5 }));

        // The most frames a message carries, and one more.
        let mut many = Vec::new();
        for i in 0..DOOR_BATCH_FRAMES as u64 {
            DoorFrame { kind: DoorKind::Cancel, reason: 0, id: i }.encode_into(&mut many, &[]);
        }
        let ids: Vec<u64> = frames(&many).unwrap().map(|(f, _)| f.id).collect();
        assert_eq!(ids, (0..DOOR_BATCH_FRAMES as u64).collect::<Vec<_>>());
        DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 99 }.encode_into(&mut many, &[]);
        assert_eq!(frames(&many).err(), Some(DoorFrameError::TooManyFrames));

        // The longest message holds fifteen of the longest frames; a byte more is refused.
        let long = vec![0x5A; CLC_MAX_LEN];
        let mut big = Vec::new();
        for i in 0..15 {
            tuple.encode_into(&mut big, i, &long);
        }
        assert!(big.len() <= DOOR_MSG_MAX);
        assert_eq!(frames(&big).unwrap().count(), 15);
        big.resize(DOOR_MSG_MAX + 1, 0);
        assert_eq!(frames(&big).err(), Some(DoorFrameError::MessageTooLong(DOOR_MSG_MAX + 1)));
    }

    #[test]
    fn errors_display() {
        let all = [
            DoorFrameError::TooShort(3),
            DoorFrameError::BadMagic,
            DoorFrameError::BadVersion(1),
            DoorFrameError::UnknownKind(9),
            DoorFrameError::UnexpectedPayload { kind: DoorKind::Refused, len: 2 },
            DoorFrameError::MissingPayload(DoorKind::Register),
            DoorFrameError::PayloadTooLong(2000),
            DoorFrameError::ShortRegister(4),
            DoorFrameError::ShortConnected(4),
            DoorFrameError::BadFamily(9),
            DoorFrameError::Truncated { said: 30, left: 2 },
            DoorFrameError::Trailing(5),
            DoorFrameError::MessageTooLong(20_000),
            DoorFrameError::TooManyFrames,
        ];
        let texts: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(texts[0], "door frame of 3 bytes is shorter than its 18-byte header");
        assert_eq!(texts[4], "door Refused frame carries 2 payload bytes, expected none");
        assert_eq!(texts[6], "door frame payload of 2000 bytes is longer than its kind allows");
        assert!(texts[7].contains("18-byte head"));
        assert_eq!(texts[10], "door frame says its payload is 30 bytes, and 2 follow its header");
        assert!(texts[12].contains("16384"));
        assert!(texts[13].contains("64 frames"));
        let err: &dyn std::error::Error = &all[1];
        assert!(err.to_string().contains("SMCd"));
    }

    #[test]
    fn arbitrary_frames_never_panic() {
        // Every length around the header, every kind byte, with and without a payload, with the
        // length field telling the truth (then decoded) and not (then refused).
        for len in 0..=DOOR_HEADER_LEN + REGISTER_HEAD_LEN + 2 {
            for (kind, honest) in (0..=8u8).flat_map(|k| [(k, true), (k, false)]) {
                let mut b = DoorFrame { kind: DoorKind::Clc, reason: 0, id: 0 }.encode(&[1; 40]);
                b[5] = kind;
                b.truncate(len);
                if honest && len >= DOOR_HEADER_LEN {
                    b[16..18].copy_from_slice(&((len - DOOR_HEADER_LEN) as u16).to_be_bytes());
                }
                let got = DoorFrame::decode(&b);
                assert_eq!(got.is_ok(), frames(&b).is_ok());
                if !honest && len >= DOOR_HEADER_LEN {
                    assert!(got.is_err(), "a length that is not the payload's");
                }
                if let Ok((f, payload)) = got {
                    assert_eq!(f.encode(payload), b);
                    if f.kind == DoorKind::Register {
                        if let Ok((h, p)) = RegisterHead::decode(payload) {
                            assert_eq!(h.encode_frame(f.id, p), b);
                        }
                    }
                    if f.kind == DoorKind::Connected {
                        let _ = ConnectedTuple::decode(payload);
                    }
                }
            }
        }
    }
}
