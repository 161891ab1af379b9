//! The shared-memory link's side channel: JOIN (client to server), READY and WELCOME (server to
//! client). After an SMC-D handshake, the client connects to the abstract `SOCK_SEQPACKET`
//! socket the server named in its Accept and sends a [`Join`] proving the handshake's secret,
//! with its region attached (`SCM_RIGHTS`) and the tag of its doorbell; the server answers with a
//! [`Welcome`], with its own region and doorbell tag when it lets the client in. The connection
//! then stays open: its end means the peer process is gone.
//!
//! Where the kernel can (`SO_PASSRIGHTS`, Linux 6.16), the server's side channel refuses
//! descriptors until it knows who connected: anyone may connect to it, and descriptors queued
//! in a connection nobody waits for would come into the server's process. A JOIN sent before
//! fails (`EPERM`); once the server found the connection's process to be a client it waits for,
//! it takes descriptors on that connection and says so with a [`Ready`], and the client sends
//! its JOIN again. A client whose JOIN went through (a server that never refuses) skips a READY
//! that comes before the WELCOME.
//!
//! A side's doorbell is two Unix datagram sockets that it makes and keeps to itself, bound to
//! the abstract names its [`BellTag`] gives: one it rings the peer on
//! ([`BellTag::ring_name`]), shut down for reading, and one it waits on
//! ([`BellTag::wait_name`]), which it connects to the peer's ringing socket so that it takes
//! datagrams from that socket alone. No doorbell descriptor crosses (version 3). In version 2 a
//! side handed over one end of a pair it made, which the other waited on and the maker could
//! read as well, holding the socket's read lock for as long as its copy out faulted; in version
//! 1 a side handed over the end the other rang on, which the maker could connect elsewhere.
//!
//! Both messages are [`SIDE_MSG_LEN`] bytes (one `SOCK_SEQPACKET` message each), integers big
//! endian:
//!
//! | offset | size | JOIN                          | WELCOME                                      |
//! |--------|------|-------------------------------|----------------------------------------------|
//! | 0..8   | 8    | [`JOIN_MAGIC`] (`"SMCTJOIN"`) | [`WELCOME_MAGIC`] (`"SMCTWELC"`)             |
//! | 8..12  | 4    | [`SIDE_VERSION`] (u32)        | [`SIDE_VERSION`] (u32)                       |
//! | 12..16 | 4    | reserved                      | status (u32): 0 welcomed, else a [`JoinRefused`] |
//! | 16..24 | 8    | link group id (u64)           | link group id (u64)                          |
//! | 24..40 | 16   | secret ([`Secret`])            | reserved                                     |
//! | 40..64 | 24   | the client's [`BellTag`]      | the server's [`BellTag`] (zeros in a refusal) |
//!
//! A READY is [`READY_MAGIC`] (`"SMCTREDY"`) and [`SIDE_VERSION`] as above, the rest
//! reserved.
//!
//! Reserved bytes are sent as zeros and ignored. Decoding checks the length, the magic and the
//! version, rejects anything else with a [`SideMsgError`], and never panics; checking the group,
//! the secret and the tag is the caller's job, since only it knows which it expects.

use std::fmt;

use super::clc::Secret;

/// First eight bytes of a JOIN.
pub const JOIN_MAGIC: [u8; 8] = *b"SMCTJOIN";
/// First eight bytes of a WELCOME.
pub const WELCOME_MAGIC: [u8; 8] = *b"SMCTWELC";
/// First eight bytes of a READY.
pub const READY_MAGIC: [u8; 8] = *b"SMCTREDY";
/// The side-channel version this crate speaks: 3, where each side names its doorbell instead of
/// handing over a descriptor of it (see the module documentation).
pub const SIDE_VERSION: u32 = 3;
/// Length of every side-channel message.
pub const SIDE_MSG_LEN: usize = 64;
/// The WELCOME status that lets the client in.
pub const WELCOME_OK: u32 = 0;

/// Why a side-channel message was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideMsgError {
    /// The message is not [`SIDE_MSG_LEN`] bytes long; its length.
    BadLength(usize),
    /// The first bytes are not the message's magic ([`JOIN_MAGIC`], [`WELCOME_MAGIC`] or
    /// [`READY_MAGIC`]).
    BadMagic,
    /// A version this crate does not speak.
    BadVersion(u32),
}

impl fmt::Display for SideMsgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SideMsgError::BadLength(n) => {
                write!(f, "side-channel message of {n} bytes, expected {SIDE_MSG_LEN}")
            }
            SideMsgError::BadMagic => f.write_str("side-channel message does not start with its magic"),
            SideMsgError::BadVersion(v) => {
                write!(f, "side-channel version {v} is not supported (this is {SIDE_VERSION})")
            }
        }
    }
}

impl std::error::Error for SideMsgError {}

/// Checks the length, the magic and the version every side-channel message starts with.
fn check(b: &[u8], magic: &[u8; 8]) -> Result<[u8; SIDE_MSG_LEN], SideMsgError> {
    let b: [u8; SIDE_MSG_LEN] = b.try_into().map_err(|_| SideMsgError::BadLength(b.len()))?;
    if b[..8] != magic[..] {
        return Err(SideMsgError::BadMagic);
    }
    let version = u32::from_be_bytes([b[8], b[9], b[10], b[11]]);
    if version != SIDE_VERSION {
        return Err(SideMsgError::BadVersion(version));
    }
    Ok(b)
}

/// A header with `magic` and the version, the rest zeros.
fn header(magic: &[u8; 8]) -> [u8; SIDE_MSG_LEN] {
    let mut b = [0u8; SIDE_MSG_LEN];
    b[..8].copy_from_slice(magic);
    b[8..12].copy_from_slice(&SIDE_VERSION.to_be_bytes());
    b
}

fn u64_at(b: &[u8; SIDE_MSG_LEN], i: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[i..i + 8]);
    u64::from_be_bytes(v)
}

/// Where a [`BellTag`] sits in both messages.
const BELL_AT: std::ops::Range<usize> = 40..64;

fn bell_at(b: &[u8; SIDE_MSG_LEN]) -> BellTag {
    let mut t = [0u8; 24];
    t.copy_from_slice(&b[BELL_AT]);
    BellTag(t)
}

/// What names a side's doorbell: 24 random bytes. The first 16 name the socket it rings on
/// ([`ring_name`](Self::ring_name)), which it binds before it sends the tag; all 24 name the
/// socket it waits on ([`wait_name`](Self::wait_name)), which it binds only once it has the
/// peer's tag, and whose last 8 bytes nobody but the peer has seen until then, so nobody can
/// take that name first. All zeros names none (a refusal's WELCOME carries that).
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::side::BellTag;
///
/// let mut t = [0xAB; 24];
/// t[16..].fill(0x01);
/// let tag = BellTag(t);
/// assert_eq!(&tag.ring_name()[..], &b"smc-tokio/bell/r/abababababababababababababababab"[..]);
/// assert!(tag.wait_name().starts_with(b"smc-tokio/bell/w/abab"));
/// assert!(tag.wait_name().ends_with(b"abab0101010101010101"));
/// assert!(BellTag::NONE.is_none() && !tag.is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BellTag(pub [u8; 24]);

impl BellTag {
    /// No doorbell.
    pub const NONE: BellTag = BellTag([0; 24]);

    /// Whether this is [`NONE`](Self::NONE).
    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }

    /// Whether `other` names the same ringing socket (the same first 16 bytes).
    pub fn same_ring(&self, other: &BellTag) -> bool {
        self.0[..16] == other.0[..16]
    }

    /// The abstract name of the socket the side rings on: `smc-tokio/bell/r/` and the first 16
    /// bytes in lowercase hex.
    pub fn ring_name(&self) -> [u8; 17 + 32] {
        named(b"smc-tokio/bell/r/", &self.0[..16])
    }

    /// The abstract name of the socket the side waits on: `smc-tokio/bell/w/` and all 24 bytes
    /// in lowercase hex. Only names of these two forms are ever connected to, so a peer can
    /// point our rings only at a socket bound under our prefix.
    pub fn wait_name(&self) -> [u8; 17 + 48] {
        named(b"smc-tokio/bell/w/", &self.0)
    }
}

/// `prefix` and `bytes` in lowercase hex, in an array of exactly that length.
fn named<const N: usize>(prefix: &[u8; 17], bytes: &[u8]) -> [u8; N] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut n = [0u8; N];
    n[..prefix.len()].copy_from_slice(prefix);
    for (i, b) in bytes.iter().enumerate() {
        n[prefix.len() + 2 * i] = HEX[usize::from(b >> 4)];
        n[prefix.len() + 2 * i + 1] = HEX[usize::from(b & 15)];
    }
    n
}

/// The server's word that its connection takes descriptors now: the client sends its JOIN
/// (again). It carries nothing else.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::side::{Join, Ready, SIDE_MSG_LEN};
///
/// let bytes: [u8; SIDE_MSG_LEN] = Ready.encode();
/// assert_eq!(Ready::decode(&bytes), Ok(Ready));
/// assert!(Join::decode(&bytes).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready;

impl Ready {
    /// The READY message.
    pub fn encode(&self) -> [u8; SIDE_MSG_LEN] {
        header(&READY_MAGIC)
    }

    /// Decodes a READY (its reserved bytes ignored).
    pub fn decode(b: &[u8]) -> Result<Ready, SideMsgError> {
        check(b, &READY_MAGIC).map(|_| Ready)
    }
}

/// A client's request to join a pending link group: the group the server's Accept named, the
/// secret of the handshake that led to it (the proof that the client took part in it), and the
/// tag of the client's doorbell.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::Secret;
/// use smc_tokio::proto::side::{BellTag, Join, SIDE_MSG_LEN};
///
/// let join = Join { link_group: 7, secret: Secret([1; 16]), bell: BellTag([3; 24]) };
/// let bytes: [u8; SIDE_MSG_LEN] = join.encode();
/// assert_eq!(Join::decode(&bytes), Ok(join));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    /// The link group to join.
    pub link_group: u64,
    /// The secret of the handshake that named the group.
    pub secret: Secret,
    /// The client's doorbell, whose sockets the server's connect to.
    pub bell: BellTag,
}

impl Join {
    /// The JOIN message.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::Secret;
    /// use smc_tokio::proto::side::{BellTag, Join, JOIN_MAGIC};
    ///
    /// let bytes = Join { link_group: 0x0102, secret: Secret([9; 16]), bell: BellTag([5; 24]) }.encode();
    /// assert_eq!(bytes[..8], JOIN_MAGIC);
    /// assert_eq!(bytes[8..12], [0, 0, 0, 3]); // the version
    /// assert_eq!(bytes[16..24], [0, 0, 0, 0, 0, 0, 1, 2]); // the group
    /// assert_eq!(bytes[24..40], [9; 16]); // the secret
    /// assert_eq!(bytes[40..64], [5; 24]); // the doorbell
    /// ```
    pub fn encode(&self) -> [u8; SIDE_MSG_LEN] {
        let mut b = header(&JOIN_MAGIC);
        b[16..24].copy_from_slice(&self.link_group.to_be_bytes());
        b[24..40].copy_from_slice(&self.secret.0);
        b[BELL_AT].copy_from_slice(&self.bell.0);
        b
    }

    /// Decodes a JOIN (one whole message).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::clc::Secret;
    /// use smc_tokio::proto::side::{BellTag, Join, SideMsgError, Welcome};
    ///
    /// let bytes = Join { link_group: 3, secret: Secret([2; 16]), bell: BellTag([1; 24]) }.encode();
    /// assert_eq!(Join::decode(&bytes[..40]), Err(SideMsgError::BadLength(40)));
    /// // A WELCOME is no JOIN.
    /// assert_eq!(Join::decode(&Welcome::accepted(3, BellTag([1; 24])).encode()), Err(SideMsgError::BadMagic));
    /// ```
    pub fn decode(b: &[u8]) -> Result<Join, SideMsgError> {
        let b = check(b, &JOIN_MAGIC)?;
        let mut secret = [0u8; 16];
        secret.copy_from_slice(&b[24..40]);
        Ok(Join { link_group: u64_at(&b, 16), secret: Secret(secret), bell: bell_at(&b) })
    }
}

/// Why a JOIN was refused: the status of the WELCOME that answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum JoinRefused {
    /// No pending link group with that id, or the secret is not one of its handshakes'.
    UnknownGroup = 1,
    /// The peer's credentials (its uid) are not allowed.
    Credentials = 2,
    /// The peer's region or doorbell was missing (no region, or no tag). A region or a tag
    /// found unusable after the WELCOME (the checks of the region, the connects of the
    /// doorbell) ends the side channel instead.
    BadRegion = 3,
}

impl JoinRefused {
    /// Every reason, in wire order.
    pub const ALL: [JoinRefused; 3] = [Self::UnknownGroup, Self::Credentials, Self::BadRegion];

    /// The reason with wire value `v` (a WELCOME's status); `None` for 0 ([`WELCOME_OK`]) and
    /// for values this version does not define.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::side::JoinRefused;
    ///
    /// assert_eq!(JoinRefused::from_u32(2), Some(JoinRefused::Credentials));
    /// assert_eq!(JoinRefused::from_u32(JoinRefused::BadRegion as u32), Some(JoinRefused::BadRegion));
    /// assert_eq!(JoinRefused::from_u32(0), None);
    /// assert_eq!(JoinRefused::from_u32(4), None);
    /// ```
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|r| *r as u32 == v)
    }
}

/// The server's answer to a JOIN: the group it answers for, [`WELCOME_OK`] or why the JOIN was
/// refused ([`JoinRefused`]; kept raw, so that a status this version does not know still reads
/// as a refusal), and the server's doorbell when it lets the client in.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::side::{BellTag, JoinRefused, Welcome};
///
/// let no = Welcome::refused(7, JoinRefused::Credentials);
/// assert_eq!(Welcome::decode(&no.encode()), Ok(no));
/// assert!(!no.is_accepted());
/// assert_eq!(no.refusal(), Some(JoinRefused::Credentials));
/// assert!(no.bell.is_none());
/// assert!(Welcome::accepted(7, BellTag([4; 24])).is_accepted());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// The link group the JOIN named.
    pub link_group: u64,
    /// [`WELCOME_OK`], or a [`JoinRefused`] value.
    pub status: u32,
    /// The server's doorbell, whose sockets the client's connect to ([`BellTag::NONE`] in a
    /// refusal).
    pub bell: BellTag,
}

impl Welcome {
    /// A WELCOME that lets the client into `link_group`, naming the server's doorbell.
    pub const fn accepted(link_group: u64, bell: BellTag) -> Welcome {
        Welcome { link_group, status: WELCOME_OK, bell }
    }

    /// A WELCOME that refuses the client's JOIN for `link_group`, saying why.
    pub const fn refused(link_group: u64, why: JoinRefused) -> Welcome {
        Welcome { link_group, status: why as u32, bell: BellTag::NONE }
    }

    /// Whether the client is let in (the status is [`WELCOME_OK`]).
    pub const fn is_accepted(&self) -> bool {
        self.status == WELCOME_OK
    }

    /// Why the JOIN was refused, when the status is a reason this version defines.
    pub fn refusal(&self) -> Option<JoinRefused> {
        JoinRefused::from_u32(self.status)
    }

    /// The WELCOME message.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::side::{JoinRefused, Welcome, WELCOME_MAGIC};
    ///
    /// let bytes = Welcome::refused(0x0102, JoinRefused::BadRegion).encode();
    /// assert_eq!(bytes[..8], WELCOME_MAGIC);
    /// assert_eq!(bytes[8..12], [0, 0, 0, 3]); // the version
    /// assert_eq!(bytes[12..16], [0, 0, 0, 3]); // the status
    /// assert_eq!(bytes[16..24], [0, 0, 0, 0, 0, 0, 1, 2]); // the group
    /// assert!(bytes[24..].iter().all(|&b| b == 0)); // no doorbell in a refusal
    /// ```
    pub fn encode(&self) -> [u8; SIDE_MSG_LEN] {
        let mut b = header(&WELCOME_MAGIC);
        b[12..16].copy_from_slice(&self.status.to_be_bytes());
        b[16..24].copy_from_slice(&self.link_group.to_be_bytes());
        b[BELL_AT].copy_from_slice(&self.bell.0);
        b
    }

    /// Decodes a WELCOME (one whole message). Any status decodes: whether it lets the client
    /// in is [`is_accepted`](Self::is_accepted).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::side::{BellTag, SideMsgError, Welcome};
    ///
    /// let w = Welcome { link_group: 5, status: 99, bell: BellTag::NONE };
    /// let mut bytes = w.encode();
    /// assert_eq!(Welcome::decode(&bytes), Ok(w));
    /// bytes[11] = 2; // version 2
    /// assert_eq!(Welcome::decode(&bytes), Err(SideMsgError::BadVersion(2)));
    /// ```
    pub fn decode(b: &[u8]) -> Result<Welcome, SideMsgError> {
        let b = check(b, &WELCOME_MAGIC)?;
        Ok(Welcome {
            link_group: u64_at(&b, 16),
            status: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            bell: bell_at(&b),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_join_layout() {
        let j = Join {
            link_group: 0x1122_3344_5566_7788,
            secret: Secret(*b"0123456789abcdef"),
            bell: BellTag(*b"fedcba9876543210zyxwvuts"),
        };
        let mut want = [0u8; SIDE_MSG_LEN];
        want[..8].copy_from_slice(b"SMCTJOIN");
        want[8..12].copy_from_slice(&[0, 0, 0, 3]);
        want[16..24].copy_from_slice(&[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        want[24..40].copy_from_slice(b"0123456789abcdef");
        want[40..64].copy_from_slice(b"fedcba9876543210zyxwvuts");
        assert_eq!(j.encode(), want);
    }

    #[test]
    fn known_welcome_layout() {
        let w = Welcome::refused(0x1122_3344_5566_7788, JoinRefused::UnknownGroup);
        let mut want = [0u8; SIDE_MSG_LEN];
        want[..8].copy_from_slice(b"SMCTWELC");
        want[8..12].copy_from_slice(&[0, 0, 0, 3]);
        want[12..16].copy_from_slice(&[0, 0, 0, 1]);
        want[16..24].copy_from_slice(&[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(w.encode(), want);
        let ok = Welcome::accepted(0, BellTag(*b"0123456789abcdef01234567")).encode();
        assert_eq!(ok[12..16], [0, 0, 0, 0]);
        assert_eq!(ok[40..64], *b"0123456789abcdef01234567");
        assert!(ok[24..40].iter().all(|&b| b == 0));
    }

    #[test]
    fn round_trips() {
        for (group, secret) in [(0, [0; 16]), (u64::MAX, [0xFF; 16]), (0x1122_3344_5566_7788, [9; 16])] {
            let mut tag = [7u8; 24];
            tag[..16].copy_from_slice(&secret);
            let j = Join { link_group: group, secret: Secret(secret), bell: BellTag(tag) };
            assert_eq!(Join::decode(&j.encode()), Ok(j));
            for status in [WELCOME_OK, 1, 2, 3, 4, u32::MAX] {
                let w = Welcome { link_group: group, status, bell: BellTag(tag) };
                assert_eq!(Welcome::decode(&w.encode()), Ok(w));
            }
        }
        for why in JoinRefused::ALL {
            let w = Welcome::refused(1, why);
            assert_eq!(Welcome::decode(&w.encode()).map(|w| w.refusal()), Ok(Some(why)));
            assert!(!w.is_accepted());
        }
        assert_eq!(Welcome::accepted(1, BellTag([1; 24])).refusal(), None);
        assert_eq!(Welcome { link_group: 1, status: 77, bell: BellTag::NONE }.refusal(), None);
    }

    #[test]
    fn reserved_bytes_are_ignored() {
        let j = Join { link_group: 4, secret: Secret([6; 16]), bell: BellTag([7; 24]) };
        let mut b = j.encode();
        b[12..16].fill(0xEE);
        assert_eq!(Join::decode(&b), Ok(j));
        let w = Welcome { link_group: 4, status: 0, bell: BellTag([8; 24]) };
        let mut b = w.encode();
        b[24..40].fill(0xEE);
        assert_eq!(Welcome::decode(&b), Ok(w));
    }

    #[test]
    fn every_error() {
        let join = Join { link_group: 1, secret: Secret([2; 16]), bell: BellTag([3; 24]) }.encode();
        let welcome = Welcome::accepted(1, BellTag([3; 24])).encode();
        for (bytes, decode) in [
            (join, (|b| Join::decode(b).map(drop)) as fn(&[u8]) -> Result<(), SideMsgError>),
            (welcome, |b| Welcome::decode(b).map(drop)),
        ] {
            assert_eq!(decode(&bytes), Ok(()));
            assert_eq!(decode(&[]), Err(SideMsgError::BadLength(0)));
            assert_eq!(decode(&bytes[..SIDE_MSG_LEN - 1]), Err(SideMsgError::BadLength(63)));
            let mut long = bytes.to_vec();
            long.push(0);
            assert_eq!(decode(&long), Err(SideMsgError::BadLength(65)));
            let mut b = bytes;
            b[7] ^= 1;
            assert_eq!(decode(&b), Err(SideMsgError::BadMagic));
            let mut b = bytes;
            b[8] = 1;
            assert_eq!(decode(&b), Err(SideMsgError::BadVersion(0x0100_0003)));
            let mut b = bytes;
            b[11] = 0;
            assert_eq!(decode(&b), Err(SideMsgError::BadVersion(0)));
            // Versions 1 and 2 handed over a doorbell end: refused, so such a peer stays on TCP.
            for old in [1, 2] {
                let mut b = bytes;
                b[11] = old;
                assert_eq!(decode(&b), Err(SideMsgError::BadVersion(u32::from(old))));
            }
        }
        // Each message's magic is only its own.
        assert_eq!(Join::decode(&welcome), Err(SideMsgError::BadMagic));
        assert_eq!(Welcome::decode(&join), Err(SideMsgError::BadMagic));
    }

    #[test]
    fn errors_display() {
        assert_eq!(SideMsgError::BadLength(40).to_string(), "side-channel message of 40 bytes, expected 64");
        assert_eq!(SideMsgError::BadVersion(1).to_string(), "side-channel version 1 is not supported (this is 3)");
        let err: &dyn std::error::Error = &SideMsgError::BadMagic;
        assert!(err.to_string().contains("magic"));
    }

    #[test]
    fn bell_names() {
        let mut tag = [0u8; 24];
        tag[0] = 0x0F;
        tag[15] = 0xA0;
        tag[23] = 0x5C;
        let tag = BellTag(tag);
        assert_eq!(&tag.ring_name()[..], b"smc-tokio/bell/r/0f0000000000000000000000000000a0");
        assert_eq!(&tag.wait_name()[..], b"smc-tokio/bell/w/0f0000000000000000000000000000a0000000000000005c");
        // The waiting name is not the ringing one, and differs with the last 8 bytes alone.
        let mut other = tag;
        other.0[16] = 1;
        assert!(tag.same_ring(&other));
        assert_ne!(tag.wait_name(), other.wait_name());
        assert_eq!(tag.ring_name(), other.ring_name());
    }

    #[test]
    fn refusal_values() {
        assert_eq!(JoinRefused::UnknownGroup as u32, 1);
        assert_eq!(JoinRefused::Credentials as u32, 2);
        assert_eq!(JoinRefused::BadRegion as u32, 3);
        for why in JoinRefused::ALL {
            assert_eq!(JoinRefused::from_u32(why as u32), Some(why));
        }
        assert_eq!(JoinRefused::from_u32(WELCOME_OK), None);
    }
}
