//! CDC (connection data control) messages: the per-connection control messages that travel over
//! a link after the handshake. They carry the producer cursor (new data is in your ring), the
//! consumer cursor (the piggy-backed ack that frees space in the peer's ring) and the connection
//! state flags. Names follow the kernel's `struct smc_cdc_msg` (net/smc/smc_cdc.h).
//!
//! The encoding is one fixed frame of [`CDC_MSG_LEN`] bytes, network byte order:
//!
//! ```text
//!  0      type (0xFE, the kernel's SMC_CDC_MSG_TYPE)
//!  1      flags (CdcFlags)
//!  2      inline length (0 ..= CDC_INLINE_MAX)
//!  3      reserved, 0
//!  4..8   sequence number
//!  8..12  connection token (names the connection inside its link group)
//! 12..14  producer cursor wrap    14..18 producer cursor count
//! 18..20  consumer cursor wrap    20..24 consumer cursor count
//! 24..64  inline payload (only the first `inline length` bytes are meaningful)
//! 24..28  new ring size, in a message with `RMB_RESIZE` (which carries no inline payload)
//! ```
//!
//! One frame is one 64-byte cache line, so a CDC message on the shared-memory link costs a single
//! cache-line transfer between cores.

use std::fmt;

use super::cursor::Cursor;

/// Length of an encoded CDC message: one 64-byte cache line (x86-64 and aarch64 line size).
pub const CDC_MSG_LEN: usize = 64;
/// Offset of the inline payload in the frame.
const CDC_INLINE_OFFSET: usize = 24;
/// Largest payload that rides inline in a CDC message: what is left of the 64-byte frame.
pub const CDC_INLINE_MAX: usize = CDC_MSG_LEN - CDC_INLINE_OFFSET;
/// Message type byte, the kernel's `SMC_CDC_MSG_TYPE`.
pub const CDC_MSG_TYPE: u8 = 0xFE;

/// The flags of a CDC message: the kernel's producer flags and connection state flags in one byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CdcFlags(u8);

impl CdcFlags {
    /// The sender has data to write but no space in our ring (`write_blocked`): answer with a
    /// consumer cursor update as soon as any space is freed.
    pub const WRITE_BLOCKED: CdcFlags = CdcFlags(0x01);
    /// The sender asks for a consumer cursor update (`cons_curs_upd_req`).
    pub const CONS_CURS_UPD_REQ: CdcFlags = CdcFlags(0x02);
    /// The sender will write no more (`peer_done_writing`): EOF after the produced bytes.
    pub const PEER_DONE_WRITING: CdcFlags = CdcFlags(0x10);
    /// The sender closed the connection in an orderly way (`peer_conn_closed`).
    pub const PEER_CONN_CLOSED: CdcFlags = CdcFlags(0x20);
    /// The sender aborted the connection (`peer_conn_abort`): a reset.
    pub const PEER_CONN_ABORT: CdcFlags = CdcFlags(0x40);
    /// RMB autotuning (ours; the kernel has no such flag): the ring the sender writes into is
    /// now [`CdcMsg::ring_size`] bytes and its producer cursor starts over at `0:0`. Sent only
    /// when everything announced before was consumed, so no byte lives in the old ring.
    pub const RMB_RESIZE: CdcFlags = CdcFlags(0x04);
    /// The sender applied our last [`RMB_RESIZE`](Self::RMB_RESIZE): this message's consumer
    /// cursor is in the new ring (until it arrives, consumer cursors are from the old one).
    pub const RMB_RESIZE_ACK: CdcFlags = CdcFlags(0x08);

    const ALL: u8 = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20 | 0x40;

    /// No flags.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    ///
    /// assert_eq!(CdcFlags::empty().bits(), 0);
    /// assert_eq!(CdcFlags::empty(), CdcFlags::default());
    /// assert!(!CdcFlags::empty().contains(CdcFlags::WRITE_BLOCKED));
    /// ```
    pub const fn empty() -> Self {
        CdcFlags(0)
    }

    /// The raw byte.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::{CdcFlags, CdcMsg};
    ///
    /// let flags = CdcFlags::PEER_DONE_WRITING.with(CdcFlags::PEER_CONN_CLOSED);
    /// assert_eq!(flags.bits(), 0x30);
    /// // The byte that goes on the wire, at offset 1 of the frame.
    /// let mut msg = CdcMsg::new(1, 2);
    /// msg.flags = flags;
    /// assert_eq!(msg.encode()[1], flags.bits());
    /// ```
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Flags from a raw byte, or `None` if it has a bit this version does not define.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    ///
    /// let both = CdcFlags::WRITE_BLOCKED.with(CdcFlags::PEER_DONE_WRITING);
    /// assert_eq!(CdcFlags::from_bits(0x11), Some(both));
    /// // 0x80 is no flag of this version: refused, not dropped.
    /// assert_eq!(CdcFlags::from_bits(0x80), None);
    /// ```
    pub const fn from_bits(bits: u8) -> Option<Self> {
        if bits & !Self::ALL == 0 {
            Some(CdcFlags(bits))
        } else {
            None
        }
    }

    /// Whether every flag of `other` is set in `self`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    ///
    /// let flags = CdcFlags::PEER_DONE_WRITING.with(CdcFlags::PEER_CONN_CLOSED);
    /// assert!(flags.contains(CdcFlags::PEER_CONN_CLOSED));
    /// assert!(flags.contains(flags));
    /// assert!(!flags.contains(CdcFlags::PEER_CONN_ABORT));
    /// assert!(!flags.contains(CdcFlags::PEER_CONN_CLOSED.with(CdcFlags::PEER_CONN_ABORT)));
    /// ```
    pub const fn contains(self, other: CdcFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the flags of `other` added.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    ///
    /// // A `const fn`, so flag sets can be constants.
    /// const CLOSING: CdcFlags = CdcFlags::PEER_DONE_WRITING.with(CdcFlags::PEER_CONN_CLOSED);
    /// assert_eq!(CLOSING.bits(), 0x30);
    /// // `self` is left as it was.
    /// let base = CdcFlags::WRITE_BLOCKED;
    /// let _ = base.with(CdcFlags::CONS_CURS_UPD_REQ);
    /// assert_eq!(base, CdcFlags::WRITE_BLOCKED);
    /// ```
    #[must_use]
    pub const fn with(self, other: CdcFlags) -> Self {
        CdcFlags(self.0 | other.0)
    }

    /// Adds the flags of `other`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    ///
    /// let mut flags = CdcFlags::empty();
    /// flags.insert(CdcFlags::PEER_DONE_WRITING);
    /// flags.insert(CdcFlags::PEER_CONN_CLOSED);
    /// assert!(flags.contains(CdcFlags::PEER_CONN_CLOSED));
    /// assert_eq!(flags, CdcFlags::PEER_DONE_WRITING.with(CdcFlags::PEER_CONN_CLOSED));
    /// assert_eq!(flags.bits(), 0x30);
    /// ```
    pub fn insert(&mut self, other: CdcFlags) {
        self.0 |= other.0;
    }
}

impl fmt::Debug for CdcFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::WRITE_BLOCKED, "write_blocked"),
            (Self::CONS_CURS_UPD_REQ, "cons_curs_upd_req"),
            (Self::PEER_DONE_WRITING, "peer_done_writing"),
            (Self::PEER_CONN_CLOSED, "peer_conn_closed"),
            (Self::PEER_CONN_ABORT, "peer_conn_abort"),
            (Self::RMB_RESIZE, "rmb_resize"),
            (Self::RMB_RESIZE_ACK, "rmb_resize_ack"),
        ];
        let mut set = f.debug_set();
        for (flag, name) in names {
            if self.contains(flag) {
                set.entry(&format_args!("{name}"));
            }
        }
        set.finish()
    }
}

/// A decoded CDC message.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::cdc::{CdcFlags, CdcMsg, CDC_MSG_LEN};
/// use smc_tokio::proto::cursor::Cursor;
///
/// let mut msg = CdcMsg::new(7, 42);
/// msg.prod = Cursor::new(0, 14);
/// msg.flags = CdcFlags::WRITE_BLOCKED;
/// msg.set_inline(b"hello").unwrap();
///
/// let frame: [u8; CDC_MSG_LEN] = msg.encode();
/// let back = CdcMsg::decode(&frame).unwrap();
/// assert_eq!(back, msg);
/// assert_eq!(back.inline(), b"hello");
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CdcMsg {
    /// Sequence number, one more for every message the sender sends on this connection.
    pub seq: u32,
    /// The connection this message is for, inside its link group.
    pub token: u32,
    /// Producer cursor: how far the sender has written into our ring.
    pub prod: Cursor,
    /// Consumer cursor: how far the sender has read from its ring (that we write into).
    pub cons: Cursor,
    /// Flags.
    pub flags: CdcFlags,
    inline_len: u8,
    inline: [u8; CDC_INLINE_MAX],
    ring_size: u32,
}

impl fmt::Debug for CdcMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CdcMsg")
            .field("seq", &self.seq)
            .field("token", &self.token)
            .field("prod", &self.prod)
            .field("cons", &self.cons)
            .field("flags", &self.flags)
            .field("inline_len", &self.inline_len)
            .field("ring_size", &self.ring_size)
            .finish()
    }
}

/// Why a CDC frame was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CdcError {
    /// The type byte is not [`CDC_MSG_TYPE`].
    BadType(u8),
    /// A flag bit this version does not define.
    UnknownFlags(u8),
    /// The inline length exceeds [`CDC_INLINE_MAX`].
    InlineTooLong(u8),
    /// The reserved byte is not zero.
    Reserved(u8),
    /// A resize (`RMB_RESIZE`) that also claims an inline payload of this length: the two
    /// share the frame's payload area.
    ResizeWithInline(u8),
}

impl fmt::Display for CdcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CdcError::BadType(t) => write!(f, "CDC message has type {t:#04x}, expected 0xfe"),
            CdcError::UnknownFlags(b) => write!(f, "CDC message has unknown flag bits {b:#04x}"),
            CdcError::InlineTooLong(n) => {
                write!(f, "CDC inline length {n} exceeds {CDC_INLINE_MAX}")
            }
            CdcError::Reserved(b) => write!(f, "CDC reserved byte is {b:#04x}, expected 0"),
            CdcError::ResizeWithInline(n) => {
                write!(f, "CDC ring resize claims {n} inline bytes, which it cannot carry")
            }
        }
    }
}

impl std::error::Error for CdcError {}

impl CdcMsg {
    /// A message for connection `token` with sequence number `seq`, zero cursors, no flags and no
    /// inline payload.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::{CdcFlags, CdcMsg};
    /// use smc_tokio::proto::cursor::Cursor;
    ///
    /// let msg = CdcMsg::new(1, 0x0a0b);
    /// assert_eq!((msg.seq, msg.token), (1, 0x0a0b));
    /// assert_eq!((msg.prod, msg.cons), (Cursor::new(0, 0), Cursor::new(0, 0)));
    /// assert_eq!(msg.flags, CdcFlags::empty());
    /// assert!(msg.inline().is_empty());
    /// ```
    pub const fn new(seq: u32, token: u32) -> Self {
        Self {
            seq,
            token,
            prod: Cursor::new(0, 0),
            cons: Cursor::new(0, 0),
            flags: CdcFlags::empty(),
            inline_len: 0,
            inline: [0; CDC_INLINE_MAX],
            ring_size: 0,
        }
    }

    /// The new ring size a message with [`CdcFlags::RMB_RESIZE`] announces; `None` without
    /// the flag.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::{CdcFlags, CdcMsg};
    ///
    /// let mut msg = CdcMsg::new(1, 2);
    /// assert_eq!(msg.ring_size(), None);
    /// msg.set_resize(1 << 20);
    /// assert!(msg.flags.contains(CdcFlags::RMB_RESIZE));
    /// let back = CdcMsg::decode(&msg.encode()).unwrap();
    /// assert_eq!(back.ring_size(), Some(1 << 20));
    /// ```
    pub fn ring_size(&self) -> Option<u32> {
        self.flags.contains(CdcFlags::RMB_RESIZE).then_some(self.ring_size)
    }

    /// Makes this a resize message: sets [`CdcFlags::RMB_RESIZE`] and the new ring size, and
    /// drops any inline payload (the two share the frame's payload area).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcMsg;
    ///
    /// let mut msg = CdcMsg::new(1, 2);
    /// msg.set_inline(b"hi").unwrap();
    /// msg.set_resize(128 << 10);
    /// assert_eq!(msg.inline(), b"");
    /// assert_eq!(msg.ring_size(), Some(128 << 10));
    /// ```
    pub fn set_resize(&mut self, size: u32) {
        self.flags.insert(CdcFlags::RMB_RESIZE);
        self.ring_size = size;
        self.inline = [0; CDC_INLINE_MAX];
        self.inline_len = 0;
    }

    /// The inline payload (empty when there is none).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcMsg;
    ///
    /// let mut msg = CdcMsg::new(1, 7);
    /// assert!(msg.inline().is_empty());
    /// msg.set_inline(b"GET /").unwrap();
    /// assert_eq!(msg.inline(), b"GET /");
    /// ```
    pub fn inline(&self) -> &[u8] {
        // inline_len <= CDC_INLINE_MAX is kept by set_inline and checked by decode.
        &self.inline[..usize::from(self.inline_len)]
    }

    /// Puts `data` inline. Fails, leaving the message unchanged, if it is longer than
    /// [`CDC_INLINE_MAX`].
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::{CdcError, CdcMsg, CDC_INLINE_MAX};
    ///
    /// let mut msg = CdcMsg::new(1, 7);
    /// msg.set_inline(b"ping").unwrap();
    /// // Too long: refused, and the message keeps its payload.
    /// let too_long = [0u8; CDC_INLINE_MAX + 1];
    /// assert_eq!(msg.set_inline(&too_long), Err(CdcError::InlineTooLong(too_long.len() as u8)));
    /// assert_eq!(msg.inline(), b"ping");
    /// ```
    pub fn set_inline(&mut self, data: &[u8]) -> Result<(), CdcError> {
        if data.len() > CDC_INLINE_MAX {
            return Err(CdcError::InlineTooLong(data.len().min(255) as u8));
        }
        if self.flags.contains(CdcFlags::RMB_RESIZE) && !data.is_empty() {
            return Err(CdcError::ResizeWithInline(data.len() as u8));
        }
        self.inline[..data.len()].copy_from_slice(data);
        self.inline[data.len()..].fill(0);
        self.inline_len = data.len() as u8;
        Ok(())
    }

    /// Encodes the message into one frame.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::{CdcMsg, CDC_MSG_LEN, CDC_MSG_TYPE};
    ///
    /// let frame: [u8; CDC_MSG_LEN] = CdcMsg::new(1, 0x0102_0304).encode();
    /// assert_eq!(frame[0], CDC_MSG_TYPE);
    /// assert_eq!(&frame[4..8], &[0, 0, 0, 1]); // the sequence number, big endian
    /// assert_eq!(&frame[8..12], &[1, 2, 3, 4]); // the token
    /// ```
    pub fn encode(&self) -> [u8; CDC_MSG_LEN] {
        let mut b = [0u8; CDC_MSG_LEN];
        b[0] = CDC_MSG_TYPE;
        b[1] = self.flags.bits();
        b[2] = self.inline_len;
        b[4..8].copy_from_slice(&self.seq.to_be_bytes());
        b[8..12].copy_from_slice(&self.token.to_be_bytes());
        b[12..14].copy_from_slice(&self.prod.wrap.to_be_bytes());
        b[14..18].copy_from_slice(&self.prod.count.to_be_bytes());
        b[18..20].copy_from_slice(&self.cons.wrap.to_be_bytes());
        b[20..24].copy_from_slice(&self.cons.count.to_be_bytes());
        if self.flags.contains(CdcFlags::RMB_RESIZE) {
            b[2] = 0;
            b[CDC_INLINE_OFFSET..CDC_INLINE_OFFSET + 4].copy_from_slice(&self.ring_size.to_be_bytes());
        } else {
            b[CDC_INLINE_OFFSET..].copy_from_slice(&self.inline);
        }
        b
    }

    /// The connection token of an encoded frame, read without decoding the rest (which may be
    /// anything: the token only says whose the frame is, and [`decode`](Self::decode) checks
    /// it all).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcMsg;
    ///
    /// let mut frame = CdcMsg::new(1, 0x0a0b).encode();
    /// assert_eq!(CdcMsg::token_of(&frame), 0x0a0b);
    /// frame[0] = 0xff; // no CDC message, still a token
    /// assert_eq!(CdcMsg::token_of(&frame), 0x0a0b);
    /// ```
    pub fn token_of(b: &[u8; CDC_MSG_LEN]) -> u32 {
        u32::from_be_bytes([b[8], b[9], b[10], b[11]])
    }

    /// Decodes one frame. Cursors are returned as sent: validating them against the ring and
    /// the connection's last known state is the engine's job, since only it knows both.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::{CdcError, CdcMsg};
    ///
    /// let msg = CdcMsg::new(3, 9);
    /// let mut frame = msg.encode();
    /// assert_eq!(CdcMsg::decode(&frame), Ok(msg));
    /// frame[0] = 0x00; // not a CDC message
    /// assert_eq!(CdcMsg::decode(&frame), Err(CdcError::BadType(0)));
    /// ```
    pub fn decode(b: &[u8; CDC_MSG_LEN]) -> Result<Self, CdcError> {
        if b[0] != CDC_MSG_TYPE {
            return Err(CdcError::BadType(b[0]));
        }
        let flags = CdcFlags::from_bits(b[1]).ok_or(CdcError::UnknownFlags(b[1]))?;
        let inline_len = b[2];
        if usize::from(inline_len) > CDC_INLINE_MAX {
            return Err(CdcError::InlineTooLong(inline_len));
        }
        if b[3] != 0 {
            return Err(CdcError::Reserved(b[3]));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let resize = flags.contains(CdcFlags::RMB_RESIZE);
        if resize && inline_len != 0 {
            return Err(CdcError::ResizeWithInline(inline_len));
        }
        let mut inline = [0u8; CDC_INLINE_MAX];
        // Bytes past inline_len are ignored, so a peer cannot smuggle data through them.
        let n = usize::from(inline_len);
        inline[..n].copy_from_slice(&b[CDC_INLINE_OFFSET..CDC_INLINE_OFFSET + n]);
        Ok(Self {
            seq: u32_at(4),
            token: Self::token_of(b),
            prod: Cursor::new(u16_at(12), u32_at(14)),
            cons: Cursor::new(u16_at(18), u32_at(20)),
            flags,
            inline_len,
            inline,
            ring_size: if resize { u32_at(CDC_INLINE_OFFSET) } else { 0 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_bad_frames() {
        let good = CdcMsg::new(1, 2).encode();
        let mut b = good;
        b[0] = 0;
        assert_eq!(CdcMsg::decode(&b), Err(CdcError::BadType(0)));
        let mut b = good;
        b[1] = 0x80;
        assert_eq!(CdcMsg::decode(&b), Err(CdcError::UnknownFlags(0x80)));
        let mut b = good;
        b[2] = CDC_INLINE_MAX as u8 + 1;
        assert_eq!(CdcMsg::decode(&b), Err(CdcError::InlineTooLong(CDC_INLINE_MAX as u8 + 1)));
        let mut b = good;
        b[3] = 1;
        assert_eq!(CdcMsg::decode(&b), Err(CdcError::Reserved(1)));
        let mut b = good;
        b[1] = CdcFlags::RMB_RESIZE.bits();
        b[2] = 1;
        assert_eq!(CdcMsg::decode(&b), Err(CdcError::ResizeWithInline(1)));
        let mut m = CdcMsg::new(1, 2);
        m.set_resize(4096);
        assert_eq!(m.set_inline(b"x"), Err(CdcError::ResizeWithInline(1)));
        assert_eq!(CdcMsg::decode(&m.encode()), Ok(m));
    }

    #[test]
    fn set_inline_bounds() {
        let mut m = CdcMsg::new(0, 0);
        assert!(m.set_inline(&[1; CDC_INLINE_MAX]).is_ok());
        assert_eq!(m.inline().len(), CDC_INLINE_MAX);
        assert_eq!(m.set_inline(&[1; CDC_INLINE_MAX + 1]), Err(CdcError::InlineTooLong(41)));
        assert_eq!(m.inline().len(), CDC_INLINE_MAX, "failed set leaves the message as it was");
        m.set_inline(b"ab").unwrap();
        assert_eq!(m.inline(), b"ab");
    }

    #[test]
    fn flags_debug_names() {
        let f = CdcFlags::PEER_DONE_WRITING.with(CdcFlags::WRITE_BLOCKED);
        assert_eq!(format!("{f:?}"), "{write_blocked, peer_done_writing}");
    }

    proptest! {
        #[test]
        fn round_trip(seq in any::<u32>(), token in any::<u32>(), pw in any::<u16>(), pc in any::<u32>(),
                      cw in any::<u16>(), cc in any::<u32>(), flags in any::<u8>(),
                      data in proptest::collection::vec(any::<u8>(), 0..=CDC_INLINE_MAX)) {
            let mut m = CdcMsg::new(seq, token);
            m.prod = Cursor::new(pw, pc);
            m.cons = Cursor::new(cw, cc);
            m.flags = CdcFlags(flags & CdcFlags::ALL & !CdcFlags::RMB_RESIZE.bits());
            m.set_inline(&data).unwrap();
            let d = CdcMsg::decode(&m.encode()).unwrap();
            prop_assert_eq!(d, m);
            prop_assert_eq!(d.inline(), &data[..]);
            // The same message as a resize: the size travels, the payload cannot.
            m.set_resize(pc);
            let d = CdcMsg::decode(&m.encode()).unwrap();
            prop_assert_eq!(d, m);
            prop_assert_eq!(d.ring_size(), Some(pc));
            prop_assert_eq!(d.inline(), &[][..]);
        }

        #[test]
        fn arbitrary_frames_never_panic(v in proptest::collection::vec(any::<u8>(), CDC_MSG_LEN)) {
            let frame: [u8; CDC_MSG_LEN] = v.try_into().unwrap();
            if let Ok(m) = CdcMsg::decode(&frame) {
                prop_assert!(m.inline().len() <= CDC_INLINE_MAX);
                // A frame that decodes re-encodes to itself except for ignored inline padding.
                let again = m.encode();
                prop_assert_eq!(&again[..CDC_INLINE_OFFSET], &frame[..CDC_INLINE_OFFSET]);
            }
        }
    }
}
