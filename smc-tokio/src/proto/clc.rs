//! CLC (connection layer control): the handshake messages exchanged in-band over the TCP
//! connection before any data, as in RFC 7609 section 3.2 and the kernel's `net/smc/smc_clc.h`.
//!
//! The framing is the kernel's; the contents are this crate's own, versioned format:
//!
//! ```text
//! header   0..4  eyecatcher E2 D4 C3 E3 ("SMCT" in EBCDIC; the kernel's is "SMCR", E2 D4 C3 D9)
//!          4     version (CLC_VERSION)
//!          5     type: 1 Proposal, 2 Accept, 3 Confirm, 4 Decline (the kernel's values),
//!                5 Commit (ours: the server's answer to a Confirm, the commit point)
//!          6..8  length of the whole message, header and trailer included (big endian)
//! body     per type, below
//! trailer  the eyecatcher again
//! ```
//!
//! Bodies (all integers big endian):
//! - Proposal: token (16), RMB size wish (u32, 0 = no preference), then sections, each
//!   `kind u8, len u16, value`: kind 1 = shm offer, kind 2 = rdma offer, each at most once.
//! - Accept and Confirm: secret (16), exactly one section: the chosen transport's link details.
//! - Decline: secret (16), reason (u8).
//! - Commit: secret (16).
//!
//! Nothing in a message identifies the host or the process: a shared-memory offer names only
//! the link group the client already has with this server. Same-host intent travels out of
//! band, before the TCP connection exists (the listener's door, `docs/design.md`), and the
//! server learns who the client is from the kernel (`SO_PEERCRED`), not from these bytes.
//!
//! Decoding is incremental ([`decode`] says how many bytes it needs), bounds every length before
//! it looks further, rejects anything it does not know with a [`ClcError`], and never panics.

use std::fmt;

use super::cursor::RingSize;

/// First and last four bytes of every CLC message: "SMCT" in EBCDIC.
pub const CLC_EYECATCHER: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xE3];
/// The CLC version this crate speaks. Version 2 dropped the host and process identity from the
/// shared-memory offer and added [`ClcType::Commit`].
pub const CLC_VERSION: u8 = 2;
/// Length of the fixed header.
pub const CLC_HEADER_LEN: usize = 8;
/// Length of the trailer.
pub const CLC_TRAILER_LEN: usize = 4;
/// Shortest possible message: header and trailer.
pub const CLC_MIN_LEN: usize = CLC_HEADER_LEN + CLC_TRAILER_LEN;
/// Hard upper bound on a message, checked before anything is buffered. The largest version-1
/// message (an Accept with a 107-byte socket name) is under 200 bytes; 1 KiB leaves room for
/// later versions while keeping a hostile peer's cost to one small buffer.
pub const CLC_MAX_LEN: usize = 1024;
/// Longest shm socket name: an abstract Unix socket name fills `sun_path` (108 bytes) less its
/// leading NUL (unix(7)).
pub const SHM_SOCKET_NAME_MAX: usize = 107;

const SECTION_SHM: u8 = 1;
const SECTION_RDMA: u8 = 2;

/// The handshake's 128-bit secret: random, it ties the handshake messages (and, on shm, the
/// side-channel login) to one connection. (A *token* is something else: the 32-bit name of a
/// connection's RMB slot that CDC messages carry, as in the kernel.)
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Secret(pub [u8; 16]);

/// Redacted: the secret (it proves a handshake and, on shm, logs a client into a
/// link group), and `Debug` output ends up in logs.
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// CLC message types, with the kernel's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ClcType {
    /// Client to server: what the client offers.
    Proposal = 1,
    /// Server to client: the chosen transport and the server's link details.
    Accept = 2,
    /// Client to server: the client's link details; after it, data moves to the link.
    Confirm = 3,
    /// Either way: no SMC for this connection; both continue over TCP.
    Decline = 4,
    /// Server to client, answering a Confirm: the server has committed to SMC. The client
    /// moves its data to the link only after it. (The kernel's CLC has no such message; it is
    /// this protocol's commit point, so a server that gives up after its Accept can still
    /// decline in step.)
    Commit = 5,
}

impl ClcType {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Proposal),
            2 => Some(Self::Accept),
            3 => Some(Self::Confirm),
            4 => Some(Self::Decline),
            5 => Some(Self::Commit),
            _ => None,
        }
    }
}

/// Why a side declined SMC. The meanings follow the kernel's `SMC_CLC_DECL_*` codes where they
/// match; the wire values are this protocol's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DeclineReason {
    /// No memory, or no file descriptor, for a receive buffer or a link (`SMC_CLC_DECL_MEM`).
    OutOfMemory = 1,
    /// A handshake step took too long (`SMC_CLC_DECL_TIMEOUT_*`).
    Timeout = 2,
    /// The peer did not offer SMC (`SMC_CLC_DECL_PEERNOSMC`).
    PeerNoSmc = 3,
    /// No transport both sides can use (`SMC_CLC_DECL_NOSMCDEV`, `..._NOSMCDDEV`, `..._NOSMCRDEV`).
    NoCommonTransport = 4,
    /// Too many handshakes in flight; served as TCP instead (the kernel's `SMC_LIMIT_HS`).
    HandshakeCongested = 5,
    /// No common protocol version (`SMC_CLC_DECL_VERSMISMAT`).
    VersionMismatch = 6,
    /// The peer's message did not fit the protocol (`SMC_CLC_DECL_SYNCERR`).
    SyncError = 7,
    /// An internal error on the declining side (`SMC_CLC_DECL_INTERR`).
    Internal = 8,
}

impl DeclineReason {
    /// Every reason, in wire order.
    pub const ALL: [DeclineReason; 8] = [
        Self::OutOfMemory,
        Self::Timeout,
        Self::PeerNoSmc,
        Self::NoCommonTransport,
        Self::HandshakeCongested,
        Self::VersionMismatch,
        Self::SyncError,
        Self::Internal,
    ];

    /// The reason with wire value `v`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::DeclineReason;
    ///
    /// assert_eq!(DeclineReason::from_u8(2), Some(DeclineReason::Timeout));
    /// assert_eq!(DeclineReason::from_u8(DeclineReason::SyncError as u8), Some(DeclineReason::SyncError));
    /// assert_eq!(DeclineReason::from_u8(0), None);
    /// ```
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|r| *r as u8 == v)
    }

    /// A short lower-case name, as used in stats and logs.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::DeclineReason;
    ///
    /// assert_eq!(DeclineReason::Timeout.as_str(), "timeout");
    /// assert_eq!(DeclineReason::NoCommonTransport.as_str(), "no common transport");
    /// assert_eq!(DeclineReason::HandshakeCongested.to_string(), DeclineReason::HandshakeCongested.as_str());
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OutOfMemory => "out of memory or descriptors",
            Self::Timeout => "timeout",
            Self::PeerNoSmc => "peer has no smc",
            Self::NoCommonTransport => "no common transport",
            Self::HandshakeCongested => "handshake congested",
            Self::VersionMismatch => "version mismatch",
            Self::SyncError => "sync error",
            Self::Internal => "internal error",
        }
    }
}

impl fmt::Display for DeclineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The client's shared-memory offer. It says nothing about who the client is: a server takes
/// it only on a connection the client registered at its door beforehand (same host, verified
/// by the kernel), and knows the client's process from that registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmOffer {
    /// The id of a live shm link group the client already has with this server, 0 if none: the
    /// server reuses it, so the connection costs no new shared memory. Random and seen only by
    /// the two ends of the group.
    pub link_group: u64,
}

/// The client's RDMA offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaOffer {
    /// The local port's GID.
    pub gid: [u8; 16],
    /// The local port number.
    pub port: u8,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 (IB's MTUs).
    pub mtu: u16,
    /// QP number of an existing link group to the server, 0 if none.
    pub qpn: u32,
    /// The server's id of that link group, 0 if none: a random 64-bit value only the two ends
    /// of the group have seen, so another client cannot name (and join) someone else's group.
    pub link_group: u64,
}

/// The client's opening message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The handshake's secret.
    pub secret: Secret,
    /// Size of the server's receive buffer for this connection, which the client provides (each
    /// side writes into buffers in its own shared region and the peer reads them), 0 when the
    /// client offers no link.
    pub rmb_size: u32,
    /// Shared memory, if offered.
    pub shm: Option<ShmOffer>,
    /// RDMA, if offered.
    pub rdma: Option<RdmaOffer>,
}

/// Shared-memory link details, in an Accept (the server's) or a Confirm (the client's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmLinkInfo {
    /// The link group this connection joins.
    pub link_group: u64,
    /// The sender's receive-buffer slot for this connection.
    pub rmb_slot: u32,
    /// That receive buffer's size in bytes.
    pub rmb_size: u32,
    /// Abstract Unix socket name of the server's side channel (Accept only; empty in Confirm).
    pub socket_name: Vec<u8>,
}

/// RDMA link details, in an Accept or a Confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaLinkInfo {
    /// The sender's GID.
    pub gid: [u8; 16],
    /// The sender's QP number.
    pub qpn: u32,
    /// The sender's initial packet sequence number (24 bits).
    pub psn: u32,
    /// Path MTU in bytes.
    pub mtu: u16,
    /// Remote key of the sender's receive buffer.
    pub rkey: u32,
    /// Virtual address of the sender's receive buffer.
    pub rmb_addr: u64,
    /// Size of that receive buffer.
    pub rmb_size: u32,
    /// The sender's token for this connection (the RMB slot and its generation): the peer puts
    /// it in the CDC messages it sends for the connection.
    pub rmb_token: u32,
    /// The server's id of the link group (random, 64 bits), in the Accept and echoed in the
    /// Confirm; a later proposal names the group by it.
    pub link_group: u64,
}

/// The link details of the chosen transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkInfo {
    /// Shared memory (SMC-D).
    Shm(ShmLinkInfo),
    /// RDMA (SMC-R).
    Rdma(RdmaLinkInfo),
}

impl LinkInfo {
    fn section_kind(&self) -> u8 {
        match self {
            LinkInfo::Shm(_) => SECTION_SHM,
            LinkInfo::Rdma(_) => SECTION_RDMA,
        }
    }

    /// Whether `self` and `other` name the same transport.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::{LinkInfo, RdmaLinkInfo, ShmLinkInfo};
    ///
    /// let shm = |rmb_slot| {
    ///     LinkInfo::Shm(ShmLinkInfo { link_group: 1, rmb_slot, rmb_size: 4096, socket_name: vec![] })
    /// };
    /// # let rdma = LinkInfo::Rdma(RdmaLinkInfo {
    /// #     gid: [0; 16], qpn: 1, psn: 1, mtu: 1024, rkey: 1, rmb_addr: 0, rmb_size: 4096, rmb_token: 1,
    /// #     link_group: 1,
    /// # });
    /// assert!(shm(1).same_transport(&shm(2)));
    /// assert!(!shm(1).same_transport(&rdma));
    /// ```
    pub fn same_transport(&self, other: &LinkInfo) -> bool {
        self.section_kind() == other.section_kind()
    }
}

/// The server's acceptance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accept {
    /// The secret from the proposal.
    pub secret: Secret,
    /// The chosen transport and the server's details.
    pub link: LinkInfo,
}

/// The client's confirmation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirm {
    /// The handshake's secret.
    pub secret: Secret,
    /// The client's details for the chosen transport.
    pub link: LinkInfo,
}

/// The server's commitment to SMC, answering the client's Confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// The handshake's secret.
    pub secret: Secret,
}

/// A refusal: both sides continue over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decline {
    /// The handshake's secret.
    pub secret: Secret,
    /// Why.
    pub reason: DeclineReason,
}

/// Any CLC message.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::{decode, ClcMessage, Decline, DeclineReason, Decoded, Secret};
///
/// let msg = ClcMessage::Decline(Decline { secret: Secret([7; 16]), reason: DeclineReason::Timeout });
/// let bytes = msg.encode().unwrap();
///
/// // Incremental: a prefix asks for more, the whole message decodes.
/// assert_eq!(decode(&bytes[..5]).unwrap(), Decoded::NeedMore(8));
/// assert_eq!(decode(&bytes).unwrap(), Decoded::Message(msg, bytes.len()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClcMessage {
    /// See [`Proposal`].
    Proposal(Proposal),
    /// See [`Accept`].
    Accept(Accept),
    /// See [`Confirm`].
    Confirm(Confirm),
    /// See [`Decline`].
    Decline(Decline),
    /// See [`Commit`].
    Commit(Commit),
}

/// Why a CLC message was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClcError {
    /// The first bytes are not the eyecatcher: the peer does not speak this protocol.
    BadEyecatcher,
    /// The length field is below the minimum or above [`CLC_MAX_LEN`].
    BadLength(u16),
    /// A version this crate does not speak. The message is `len` bytes long, so a server can
    /// skip it and decline with [`DeclineReason::VersionMismatch`].
    UnsupportedVersion {
        /// The version in the header.
        version: u8,
        /// The message's length.
        len: u16,
    },
    /// A message type this version does not define.
    UnknownType(u8),
    /// The trailer is not the eyecatcher.
    BadTrailer,
    /// The body ended before a field, or has bytes left over after the last one.
    BadBodyLength,
    /// A section kind this version does not define.
    UnknownSection(u8),
    /// A section kind that may appear once appeared twice.
    DuplicateSection(u8),
    /// An Accept or Confirm without exactly one section.
    SectionCount(usize),
    /// A decline reason this version does not define.
    UnknownDeclineReason(u8),
    /// A field out of its range.
    BadField(&'static str),
}

impl fmt::Display for ClcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClcError::BadEyecatcher => f.write_str("CLC message does not start with the eyecatcher"),
            ClcError::BadLength(l) => {
                write!(f, "CLC length {l} is outside {CLC_MIN_LEN}..={CLC_MAX_LEN}")
            }
            ClcError::UnsupportedVersion { version, .. } => {
                write!(f, "CLC version {version} is not supported (this is {CLC_VERSION})")
            }
            ClcError::UnknownType(t) => write!(f, "unknown CLC message type {t}"),
            ClcError::BadTrailer => f.write_str("CLC message does not end with the eyecatcher"),
            ClcError::BadBodyLength => f.write_str("CLC body length does not match its fields"),
            ClcError::UnknownSection(k) => write!(f, "unknown CLC section kind {k}"),
            ClcError::DuplicateSection(k) => write!(f, "CLC section kind {k} appears twice"),
            ClcError::SectionCount(n) => {
                write!(f, "CLC accept/confirm carries {n} sections, expected 1")
            }
            ClcError::UnknownDeclineReason(r) => write!(f, "unknown CLC decline reason {r}"),
            ClcError::BadField(name) => write!(f, "CLC field {name} is out of range"),
        }
    }
}

impl std::error::Error for ClcError {}

/// The result of [`decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// The buffer holds less than a whole message: at least this many bytes in total are needed.
    NeedMore(usize),
    /// A whole message, and how many bytes of the buffer it took.
    Message(ClcMessage, usize),
}

/// A validated CLC header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClcHeader {
    /// The version (always [`CLC_VERSION`] when returned by [`ClcHeader::parse`]).
    pub version: u8,
    /// The message type.
    pub kind: ClcType,
    /// The whole message's length.
    pub len: usize,
}

impl ClcHeader {
    /// Parses the first [`CLC_HEADER_LEN`] bytes of `buf`; `Ok(None)` if there are fewer. Checks,
    /// in order: eyecatcher, length bounds, version, type.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::{ClcError, ClcHeader, ClcMessage, ClcType, Commit, Secret, CLC_VERSION};
    ///
    /// let bytes = ClcMessage::Commit(Commit { secret: Secret::default() }).encode().unwrap();
    /// let h = ClcHeader::parse(&bytes).unwrap().unwrap();
    /// assert_eq!((h.version, h.kind, h.len), (CLC_VERSION, ClcType::Commit, bytes.len()));
    /// assert_eq!(ClcHeader::parse(&bytes[..5]), Ok(None)); // not a whole header yet
    /// assert_eq!(ClcHeader::parse(b"GET / HTTP/1.1"), Err(ClcError::BadEyecatcher));
    /// ```
    pub fn parse(buf: &[u8]) -> Result<Option<ClcHeader>, ClcError> {
        if !eyecatcher_prefix_matches(buf) {
            return Err(ClcError::BadEyecatcher);
        }
        let Some(h) = buf.get(..CLC_HEADER_LEN) else {
            return Ok(None);
        };
        let len = u16::from_be_bytes([h[6], h[7]]);
        if usize::from(len) < CLC_MIN_LEN || usize::from(len) > CLC_MAX_LEN {
            return Err(ClcError::BadLength(len));
        }
        if h[4] != CLC_VERSION {
            return Err(ClcError::UnsupportedVersion { version: h[4], len });
        }
        let kind = ClcType::from_u8(h[5]).ok_or(ClcError::UnknownType(h[5]))?;
        Ok(Some(ClcHeader { version: h[4], kind, len: usize::from(len) }))
    }
}

/// Whether `buf` (of any length) is consistent with a CLC message so far: its first
/// `min(len, 4)` bytes match the eyecatcher. An empty buffer matches.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::{eyecatcher_prefix_matches, CLC_EYECATCHER};
///
/// assert!(eyecatcher_prefix_matches(&[]));
/// assert!(eyecatcher_prefix_matches(&CLC_EYECATCHER[..1]));
/// assert!(!eyecatcher_prefix_matches(b"HTTP/1.1 200 OK"));
/// ```
pub fn eyecatcher_prefix_matches(buf: &[u8]) -> bool {
    let n = buf.len().min(CLC_EYECATCHER.len());
    buf[..n] == CLC_EYECATCHER[..n]
}

/// Decodes one message from the front of `buf`.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::{decode, ClcMessage, Commit, Decoded, Secret, CLC_HEADER_LEN};
///
/// let msg = ClcMessage::Commit(Commit { secret: Secret([3; 16]) });
/// let mut bytes = msg.encode().unwrap();
/// let len = bytes.len();
/// assert_eq!(decode(&bytes[..3]), Ok(Decoded::NeedMore(CLC_HEADER_LEN)));
/// // Whatever follows the message is not consumed.
/// bytes.extend_from_slice(b"application data");
/// assert_eq!(decode(&bytes), Ok(Decoded::Message(msg, len)));
/// ```
pub fn decode(buf: &[u8]) -> Result<Decoded, ClcError> {
    let Some(header) = ClcHeader::parse(buf)? else {
        return Ok(Decoded::NeedMore(CLC_HEADER_LEN));
    };
    let Some(msg) = buf.get(..header.len) else {
        return Ok(Decoded::NeedMore(header.len));
    };
    let (body, trailer) = msg[CLC_HEADER_LEN..].split_at(header.len - CLC_MIN_LEN);
    if trailer != CLC_EYECATCHER {
        return Err(ClcError::BadTrailer);
    }
    let mut r = Reader { buf: body };
    let secret = Secret(r.array()?);
    let msg = match header.kind {
        ClcType::Proposal => {
            let rmb_size = r.u32()?;
            if rmb_size != 0 && RingSize::new(rmb_size).is_none() {
                return Err(ClcError::BadField("proposal rmb size"));
            }
            let mut p = Proposal { secret, rmb_size, shm: None, rdma: None };
            while !r.buf.is_empty() {
                let (kind, mut s) = r.section()?;
                match kind {
                    SECTION_SHM if p.shm.is_none() => p.shm = Some(ShmOffer { link_group: s.u64()? }),
                    SECTION_RDMA if p.rdma.is_none() => {
                        let o = RdmaOffer {
                            gid: s.array()?,
                            port: s.u8()?,
                            mtu: s.u16()?,
                            qpn: s.u32()?,
                            link_group: s.u64()?,
                        };
                        check_mtu(o.mtu)?;
                        p.rdma = Some(o);
                    }
                    SECTION_SHM | SECTION_RDMA => return Err(ClcError::DuplicateSection(kind)),
                    other => return Err(ClcError::UnknownSection(other)),
                }
                s.finish()?;
            }
            ClcMessage::Proposal(p)
        }
        ClcType::Accept | ClcType::Confirm => {
            let link = r.link_section()?;
            if !r.buf.is_empty() {
                return Err(ClcError::SectionCount(2));
            }
            if header.kind == ClcType::Accept {
                ClcMessage::Accept(Accept { secret, link })
            } else {
                ClcMessage::Confirm(Confirm { secret, link })
            }
        }
        ClcType::Decline => {
            let v = r.u8()?;
            let reason = DeclineReason::from_u8(v).ok_or(ClcError::UnknownDeclineReason(v))?;
            ClcMessage::Decline(Decline { secret, reason })
        }
        ClcType::Commit => ClcMessage::Commit(Commit { secret }),
    };
    r.finish()?;
    Ok(Decoded::Message(msg, header.len))
}

fn check_mtu(mtu: u16) -> Result<(), ClcError> {
    match mtu {
        256 | 512 | 1024 | 2048 | 4096 => Ok(()),
        _ => Err(ClcError::BadField("rdma mtu")),
    }
}

fn check_link(link: &LinkInfo) -> Result<(), ClcError> {
    match link {
        LinkInfo::Shm(s) => {
            if RingSize::new(s.rmb_size).is_none() {
                return Err(ClcError::BadField("shm rmb size"));
            }
            if s.socket_name.len() > SHM_SOCKET_NAME_MAX {
                return Err(ClcError::BadField("shm socket name"));
            }
        }
        LinkInfo::Rdma(r) => {
            check_mtu(r.mtu)?;
            if RingSize::new(r.rmb_size).is_none() {
                return Err(ClcError::BadField("rdma rmb size"));
            }
            if r.psn >= 1 << 24 {
                return Err(ClcError::BadField("rdma psn"));
            }
        }
    }
    Ok(())
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ClcError> {
        if self.buf.len() < n {
            return Err(ClcError::BadBodyLength);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ClcError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, ClcError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, ClcError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, ClcError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, ClcError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn section(&mut self) -> Result<(u8, Reader<'a>), ClcError> {
        let kind = self.u8()?;
        let len = self.u16()?;
        Ok((kind, Reader { buf: self.bytes(usize::from(len))? }))
    }
    fn link_section(&mut self) -> Result<LinkInfo, ClcError> {
        if self.buf.is_empty() {
            return Err(ClcError::SectionCount(0));
        }
        let (kind, mut s) = self.section()?;
        let link = match kind {
            SECTION_SHM => {
                let link_group = s.u64()?;
                let rmb_slot = s.u32()?;
                let rmb_size = s.u32()?;
                let name_len = usize::from(s.u8()?);
                if name_len > SHM_SOCKET_NAME_MAX {
                    return Err(ClcError::BadField("shm socket name"));
                }
                let socket_name = s.bytes(name_len)?.to_vec();
                LinkInfo::Shm(ShmLinkInfo { link_group, rmb_slot, rmb_size, socket_name })
            }
            SECTION_RDMA => LinkInfo::Rdma(RdmaLinkInfo {
                gid: s.array()?,
                qpn: s.u32()?,
                psn: s.u32()?,
                mtu: s.u16()?,
                rkey: s.u32()?,
                rmb_addr: s.u64()?,
                rmb_size: s.u32()?,
                rmb_token: s.u32()?,
                link_group: s.u64()?,
            }),
            other => return Err(ClcError::UnknownSection(other)),
        };
        s.finish()?;
        check_link(&link)?;
        Ok(link)
    }
    fn finish(&self) -> Result<(), ClcError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ClcError::BadBodyLength)
        }
    }
}

struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn section(&mut self, kind: u8, f: impl FnOnce(&mut Vec<u8>)) {
        self.buf.push(kind);
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        f(&mut self.buf);
        // Sections are at most a few hundred bytes (bounded fields), far below u16::MAX.
        let len = (self.buf.len() - at - 2) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_be_bytes());
    }
    /// A link's section, its fields checked first ([`check_link`]).
    fn link(&mut self, link: &LinkInfo) -> Result<(), ClcError> {
        check_link(link)?;
        match link {
            LinkInfo::Shm(s) => self.section(SECTION_SHM, |b| {
                b.extend_from_slice(&s.link_group.to_be_bytes());
                b.extend_from_slice(&s.rmb_slot.to_be_bytes());
                b.extend_from_slice(&s.rmb_size.to_be_bytes());
                b.push(s.socket_name.len() as u8);
                b.extend_from_slice(&s.socket_name);
            }),
            LinkInfo::Rdma(r) => self.section(SECTION_RDMA, |b| {
                b.extend_from_slice(&r.gid);
                b.extend_from_slice(&r.qpn.to_be_bytes());
                b.extend_from_slice(&r.psn.to_be_bytes());
                b.extend_from_slice(&r.mtu.to_be_bytes());
                b.extend_from_slice(&r.rkey.to_be_bytes());
                b.extend_from_slice(&r.rmb_addr.to_be_bytes());
                b.extend_from_slice(&r.rmb_size.to_be_bytes());
                b.extend_from_slice(&r.rmb_token.to_be_bytes());
                b.extend_from_slice(&r.link_group.to_be_bytes());
            }),
        }
        Ok(())
    }
}

impl ClcMessage {
    /// The message's type.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::{ClcMessage, ClcType, Decline, DeclineReason, Secret};
    ///
    /// let msg = ClcMessage::Decline(Decline { secret: Secret::default(), reason: DeclineReason::Internal });
    /// assert_eq!(msg.kind(), ClcType::Decline);
    /// assert_eq!(msg.kind() as u8, 4); // the kernel's number
    /// ```
    pub fn kind(&self) -> ClcType {
        match self {
            ClcMessage::Proposal(_) => ClcType::Proposal,
            ClcMessage::Accept(_) => ClcType::Accept,
            ClcMessage::Confirm(_) => ClcType::Confirm,
            ClcMessage::Decline(_) => ClcType::Decline,
            ClcMessage::Commit(_) => ClcType::Commit,
        }
    }

    /// The message's secret.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::{ClcMessage, Commit, Proposal, Secret};
    ///
    /// let secret = Secret([5; 16]);
    /// let proposal = ClcMessage::Proposal(Proposal { secret, rmb_size: 0, shm: None, rdma: None });
    /// assert_eq!(proposal.secret(), secret);
    /// assert_eq!(ClcMessage::Commit(Commit { secret }).secret(), secret);
    /// ```
    pub fn secret(&self) -> Secret {
        match self {
            ClcMessage::Proposal(m) => m.secret,
            ClcMessage::Accept(m) => m.secret,
            ClcMessage::Confirm(m) => m.secret,
            ClcMessage::Decline(m) => m.secret,
            ClcMessage::Commit(m) => m.secret,
        }
    }

    /// Encodes the message. Fails with [`ClcError::BadField`] when a field is outside the range
    /// that [`decode`] accepts, so that everything encoded also decodes.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::{decode, ClcError, ClcMessage, Decoded, Proposal, ShmOffer, Secret, CLC_EYECATCHER};
    ///
    /// let offer = Some(ShmOffer { link_group: 0 });
    /// let p = Proposal { secret: Secret([1; 16]), rmb_size: 1 << 16, shm: offer, rdma: None };
    /// let bytes = ClcMessage::Proposal(p.clone()).encode().unwrap();
    /// assert!(bytes.starts_with(&CLC_EYECATCHER) && bytes.ends_with(&CLC_EYECATCHER));
    /// assert_eq!(decode(&bytes), Ok(Decoded::Message(ClcMessage::Proposal(p.clone()), bytes.len())));
    /// // What `decode` would refuse is not encoded.
    /// let too_big = ClcMessage::Proposal(Proposal { rmb_size: u32::MAX, ..p });
    /// assert_eq!(too_big.encode(), Err(ClcError::BadField("proposal rmb size")));
    /// ```
    pub fn encode(&self) -> Result<Vec<u8>, ClcError> {
        encode_with(self.kind(), self.secret(), |w| {
            match self {
                ClcMessage::Proposal(p) => {
                    if p.rmb_size != 0 && RingSize::new(p.rmb_size).is_none() {
                        return Err(ClcError::BadField("proposal rmb size"));
                    }
                    w.buf.extend_from_slice(&p.rmb_size.to_be_bytes());
                    if let Some(o) = &p.shm {
                        w.section(SECTION_SHM, |b| b.extend_from_slice(&o.link_group.to_be_bytes()));
                    }
                    if let Some(o) = &p.rdma {
                        check_mtu(o.mtu)?;
                        w.section(SECTION_RDMA, |b| {
                            b.extend_from_slice(&o.gid);
                            b.push(o.port);
                            b.extend_from_slice(&o.mtu.to_be_bytes());
                            b.extend_from_slice(&o.qpn.to_be_bytes());
                            b.extend_from_slice(&o.link_group.to_be_bytes());
                        });
                    }
                }
                ClcMessage::Accept(Accept { link, .. }) | ClcMessage::Confirm(Confirm { link, .. }) => w.link(link)?,
                ClcMessage::Decline(d) => w.buf.push(d.reason as u8),
                ClcMessage::Commit(_) => {}
            }
            Ok(())
        })
    }
}

/// The bytes of an Accept (`confirm` false) or a Confirm (`true`) with `secret` and `link`, as
/// [`ClcMessage::encode`] makes them, from a borrowed link: a handshake keeps its link after
/// sending it, without a copy.
pub(crate) fn encode_link_message(confirm: bool, secret: Secret, link: &LinkInfo) -> Result<Vec<u8>, ClcError> {
    let kind = if confirm { ClcType::Confirm } else { ClcType::Accept };
    encode_with(kind, secret, |w| w.link(link))
}

/// A message of `kind` with `secret`, its body written by `body`, framed.
fn encode_with(
    kind: ClcType,
    secret: Secret,
    body: impl FnOnce(&mut Writer) -> Result<(), ClcError>,
) -> Result<Vec<u8>, ClcError> {
    let mut w = Writer { buf: Vec::with_capacity(128) };
    w.buf.extend_from_slice(&CLC_EYECATCHER);
    w.buf.extend_from_slice(&[CLC_VERSION, kind as u8, 0, 0]);
    w.buf.extend_from_slice(&secret.0);
    body(&mut w)?;
    w.buf.extend_from_slice(&CLC_EYECATCHER);
    // Bounded fields keep every message far below CLC_MAX_LEN (checked in tests).
    let len = w.buf.len() as u16;
    w.buf[6..8].copy_from_slice(&len.to_be_bytes());
    Ok(w.buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Handshake messages end up in debug logs; the secret they carry must not.
    #[test]
    fn debug_output_never_shows_the_secret() {
        let secret = Secret([0xA7; 16]);
        let msgs = [
            ClcMessage::Proposal(Proposal { secret, rmb_size: 0, shm: Some(ShmOffer { link_group: 4 }), rdma: None }),
            ClcMessage::Confirm(Confirm { secret, link: shm_link(b"name") }),
            ClcMessage::Decline(Decline { secret, reason: DeclineReason::Timeout }),
        ];
        for m in msgs {
            let d = format!("{m:?} {m:#?}");
            assert!(!d.to_ascii_lowercase().contains("a7a7") && !d.contains("167"), "{d}");
            assert!(d.contains("<redacted>"), "{d}");
        }
    }

    fn shm_link(name: &[u8]) -> LinkInfo {
        LinkInfo::Shm(ShmLinkInfo { link_group: 9, rmb_slot: 3, rmb_size: 65536, socket_name: name.to_vec() })
    }

    fn rdma_link() -> LinkInfo {
        LinkInfo::Rdma(RdmaLinkInfo {
            gid: [1; 16],
            qpn: 77,
            psn: 0xABCDEF,
            mtu: 1024,
            rkey: 5,
            rmb_addr: 0xdead_beef,
            rmb_size: 1 << 20,
            rmb_token: 0x0001_0002,
            link_group: 0x1234_5678_9abc_def0,
        })
    }

    fn samples() -> Vec<ClcMessage> {
        let t = Secret([0x5a; 16]);
        vec![
            ClcMessage::Proposal(Proposal { secret: t, rmb_size: 0, shm: None, rdma: None }),
            ClcMessage::Proposal(Proposal {
                secret: t,
                rmb_size: 1 << 16,
                shm: Some(ShmOffer { link_group: u64::MAX }),
                rdma: Some(RdmaOffer { gid: [3; 16], port: 1, mtu: 4096, qpn: 0, link_group: 0 }),
            }),
            ClcMessage::Accept(Accept { secret: t, link: shm_link(&[b'x'; SHM_SOCKET_NAME_MAX]) }),
            ClcMessage::Accept(Accept { secret: t, link: rdma_link() }),
            ClcMessage::Confirm(Confirm { secret: t, link: shm_link(b"") }),
            ClcMessage::Confirm(Confirm { secret: t, link: rdma_link() }),
            ClcMessage::Decline(Decline { secret: t, reason: DeclineReason::HandshakeCongested }),
            ClcMessage::Commit(Commit { secret: t }),
        ]
    }

    #[test]
    fn round_trips_and_sizes() {
        for m in samples() {
            let b = m.encode().unwrap();
            assert!(b.len() <= CLC_MAX_LEN / 4, "{} bytes", b.len());
            assert_eq!(decode(&b).unwrap(), Decoded::Message(m.clone(), b.len()));
            // Every strict prefix asks for more and never errors.
            for n in 0..b.len() {
                match decode(&b[..n]).unwrap() {
                    Decoded::NeedMore(k) => assert!(k > n && k <= b.len()),
                    other => panic!("prefix {n} decoded as {other:?}"),
                }
            }
            // Trailing bytes belong to whatever follows and are not consumed.
            let mut longer = b.clone();
            longer.extend_from_slice(b"GET / HTTP/1.1");
            assert_eq!(decode(&longer).unwrap(), Decoded::Message(m, b.len()));
        }
    }

    /// An Accept's bytes: the header (eyecatcher, version, type, length), the secret, the
    /// shared-memory section (kind, length, group, slot, size, name), the trailer.
    #[test]
    fn known_accept_layout() {
        let link = LinkInfo::Shm(ShmLinkInfo {
            link_group: 0x0102_0304_0506_0708,
            rmb_slot: 9,
            rmb_size: 0x1_0000,
            socket_name: b"ab".to_vec(),
        });
        let mut want = vec![0xE2, 0xD4, 0xC3, 0xE3, 2, 2, 0, 50];
        want.extend_from_slice(&[0x77; 16]);
        want.extend_from_slice(&[1, 0, 19, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 9, 0, 1, 0, 0, 2, b'a', b'b']);
        want.extend_from_slice(&[0xE2, 0xD4, 0xC3, 0xE3]);
        assert_eq!(encode_link_message(false, Secret([0x77; 16]), &link).unwrap(), want);
        let whole = ClcMessage::Accept(Accept { secret: Secret([0x77; 16]), link }).encode().unwrap();
        assert_eq!(whole, want);
    }

    /// An Accept or a Confirm encoded from a borrowed link is the message's own encoding, and
    /// a link that cannot be encoded is refused the same way.
    #[test]
    fn accepts_and_confirms_encode_alike_from_a_borrowed_link() {
        for m in samples() {
            let (confirm, secret, link) = match &m {
                ClcMessage::Accept(a) => (false, a.secret, &a.link),
                ClcMessage::Confirm(c) => (true, c.secret, &c.link),
                _ => continue,
            };
            assert_eq!(encode_link_message(confirm, secret, link), m.encode(), "{m:?}");
        }
        let long = shm_link(&[b'x'; SHM_SOCKET_NAME_MAX + 1]);
        let whole = ClcMessage::Accept(Accept { secret: Secret([1; 16]), link: long.clone() }).encode();
        assert!(whole.is_err());
        assert_eq!(encode_link_message(false, Secret([1; 16]), &long), whole);
    }

    #[test]
    fn every_decline_reason_round_trips() {
        for r in DeclineReason::ALL {
            let m = ClcMessage::Decline(Decline { secret: Secret::default(), reason: r });
            let b = m.encode().unwrap();
            assert_eq!(decode(&b).unwrap(), Decoded::Message(m, b.len()));
            assert_eq!(DeclineReason::from_u8(r as u8), Some(r));
        }
        assert_eq!(DeclineReason::from_u8(0), None);
        assert_eq!(DeclineReason::from_u8(9), None);
    }

    fn decline_bytes() -> Vec<u8> {
        ClcMessage::Decline(Decline { secret: Secret::default(), reason: DeclineReason::Timeout }).encode().unwrap()
    }

    #[test]
    fn header_errors() {
        assert_eq!(decode(b"GET / HTTP/1.1\r\n"), Err(ClcError::BadEyecatcher));
        assert_eq!(decode(&[0xE2, 0xD4, 0x00]), Err(ClcError::BadEyecatcher));
        assert_eq!(decode(&[0xE2, 0xD4]), Ok(Decoded::NeedMore(CLC_HEADER_LEN)));
        assert_eq!(decode(&[]), Ok(Decoded::NeedMore(CLC_HEADER_LEN)));

        let mut b = decline_bytes();
        b[4] = 1;
        assert_eq!(decode(&b), Err(ClcError::UnsupportedVersion { version: 1, len: b.len() as u16 }));

        let mut b = decline_bytes();
        b[5] = 9;
        assert_eq!(decode(&b), Err(ClcError::UnknownType(9)));

        for bad in [0u16, 11, 1025, u16::MAX] {
            let mut b = decline_bytes();
            b[6..8].copy_from_slice(&bad.to_be_bytes());
            assert_eq!(decode(&b), Err(ClcError::BadLength(bad)));
        }

        let mut b = decline_bytes();
        let n = b.len();
        b[n - 1] = 0;
        assert_eq!(decode(&b), Err(ClcError::BadTrailer));
    }

    #[test]
    fn length_boundaries() {
        // The smallest and largest lengths the header allows are accepted by the header check
        // and then judged by the body.
        let mut b = vec![0u8; CLC_MAX_LEN];
        b[..4].copy_from_slice(&CLC_EYECATCHER);
        b[4] = CLC_VERSION;
        b[5] = ClcType::Decline as u8;
        b[6..8].copy_from_slice(&(CLC_MAX_LEN as u16).to_be_bytes());
        b[CLC_MAX_LEN - 4..].copy_from_slice(&CLC_EYECATCHER);
        b[CLC_HEADER_LEN + 16] = DeclineReason::Timeout as u8;
        assert_eq!(decode(&b), Err(ClcError::BadBodyLength));
        // One more byte than allowed is refused from the header alone.
        b[6..8].copy_from_slice(&(CLC_MAX_LEN as u16 + 1).to_be_bytes());
        assert_eq!(decode(&b[..CLC_HEADER_LEN]), Err(ClcError::BadLength(CLC_MAX_LEN as u16 + 1)));
        let mut b = Vec::from(CLC_EYECATCHER);
        b.extend_from_slice(&[CLC_VERSION, 4, 0, CLC_MIN_LEN as u8]);
        b.extend_from_slice(&CLC_EYECATCHER);
        assert_eq!(decode(&b), Err(ClcError::BadBodyLength));
    }

    #[test]
    fn body_errors() {
        let mut b = decline_bytes();
        let n = b.len();
        b[n - 5] = 0;
        assert_eq!(decode(&b), Err(ClcError::UnknownDeclineReason(0)));

        // A proposal with an unknown section kind and one with a duplicate section.
        let p = ClcMessage::Proposal(Proposal {
            secret: Secret::default(),
            rmb_size: 0,
            shm: Some(ShmOffer { link_group: 0 }),
            rdma: None,
        });
        let good = p.encode().unwrap();
        let sec = CLC_HEADER_LEN + 16 + 4;
        let mut b = good.clone();
        b[sec] = 7;
        assert_eq!(decode(&b), Err(ClcError::UnknownSection(7)));
        // Duplicate: append a second copy of the section and fix the length.
        let section = good[sec..good.len() - 4].to_vec();
        let mut b = good[..good.len() - 4].to_vec();
        b.extend_from_slice(&section);
        b.extend_from_slice(&CLC_EYECATCHER);
        let len = b.len() as u16;
        b[6..8].copy_from_slice(&len.to_be_bytes());
        assert_eq!(decode(&b), Err(ClcError::DuplicateSection(1)));
        // A section whose length runs past the body.
        let mut b = good.clone();
        b[sec + 1..sec + 3].copy_from_slice(&500u16.to_be_bytes());
        assert_eq!(decode(&b), Err(ClcError::BadBodyLength));

        // Fields out of range are refused by both encode and decode.
        let bad = ClcMessage::Accept(Accept { secret: Secret::default(), link: shm_link(&[0; 108]) });
        assert_eq!(bad.encode(), Err(ClcError::BadField("shm socket name")));
        let mut l = rdma_link();
        if let LinkInfo::Rdma(r) = &mut l {
            r.mtu = 1500;
        }
        let bad = ClcMessage::Confirm(Confirm { secret: Secret::default(), link: l });
        assert_eq!(bad.encode(), Err(ClcError::BadField("rdma mtu")));
        let bad =
            ClcMessage::Proposal(Proposal { secret: Secret::default(), rmb_size: u32::MAX, shm: None, rdma: None });
        assert_eq!(bad.encode(), Err(ClcError::BadField("proposal rmb size")));

        // A commit with a body.
        let mut b = ClcMessage::Commit(Commit { secret: Secret::default() }).encode().unwrap();
        b.insert(b.len() - 4, 0);
        let len = b.len() as u16;
        b[6..8].copy_from_slice(&len.to_be_bytes());
        assert_eq!(decode(&b), Err(ClcError::BadBodyLength));

        // An accept with no section.
        let mut b = Vec::from(CLC_EYECATCHER);
        b.extend_from_slice(&[CLC_VERSION, 2, 0, 28]);
        b.extend_from_slice(&[0; 16]);
        b.extend_from_slice(&CLC_EYECATCHER);
        assert_eq!(decode(&b), Err(ClcError::SectionCount(0)));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(mut v in proptest::collection::vec(any::<u8>(), 0..300), keep_header in any::<bool>()) {
            if keep_header && v.len() >= 8 {
                v[..4].copy_from_slice(&CLC_EYECATCHER);
                v[4] = CLC_VERSION;
                v[5] = (v[5] % 5) + 1;
                let len = (v.len() as u16).max(12);
                v[6..8].copy_from_slice(&len.to_be_bytes());
                if v.len() >= 12 {
                    let n = v.len();
                    v[n - 4..].copy_from_slice(&CLC_EYECATCHER);
                }
            }
            match decode(&v) {
                Ok(Decoded::Message(m, n)) => {
                    prop_assert!(n <= v.len());
                    // Whatever decodes re-encodes (sections in canonical order) and decodes back.
                    let again = m.encode().unwrap();
                    prop_assert_eq!(again.len(), n);
                    prop_assert_eq!(decode(&again).unwrap(), Decoded::Message(m, n));
                }
                Ok(Decoded::NeedMore(n)) => prop_assert!(n > v.len() && n <= CLC_MAX_LEN),
                Err(_) => {}
            }
        }

        #[test]
        fn proposals_round_trip(secret in any::<[u8; 16]>(), rmb in prop_oneof![Just(0u32), 1u32..=RingSize::MAX],
                                shm in proptest::option::of(any::<u64>()),
                                rdma in proptest::option::of(any::<([u8; 16], u8, u32, u64)>()), mtu_i in 0usize..5) {
            let mtu = [256u16, 512, 1024, 2048, 4096][mtu_i];
            let m = ClcMessage::Proposal(Proposal {
                secret: Secret(secret),
                rmb_size: rmb,
                shm: shm.map(|link_group| ShmOffer { link_group }),
                rdma: rdma.map(|(gid, port, qpn, link_group)| RdmaOffer { gid, port, mtu, qpn, link_group }),
            });
            let b = m.encode().unwrap();
            prop_assert_eq!(decode(&b).unwrap(), Decoded::Message(m, b.len()));
        }
    }
}
