//! Door frames: the messages of the same-host negotiation that travels beside a TCP connection,
//! over a listener's door (an abstract `SOCK_SEQPACKET` Unix socket). A client registers its
//! connection there before it connects, with its TCP socket attached (`SCM_RIGHTS`) and its CLC
//! Proposal as payload; the CLC handshake then runs over the same door connection.
//!
//! One frame is one `SOCK_SEQPACKET` message, so the message's length delimits the payload. The
//! header is [`DOOR_HEADER_LEN`] bytes, integers big endian:
//!
//! | offset  | size | field                                                                  |
//! |---------|------|------------------------------------------------------------------------|
//! | 0..4    | 4    | magic, [`DOOR_MAGIC`] (`"SMCd"`)                                       |
//! | 4       | 1    | version, [`DOOR_VERSION`]                                              |
//! | 5       | 1    | kind, [`DoorKind`]: 1 Register, 2 Clc, 3 Unmatched, 4 Refused          |
//! | 6       | 1    | reason: a [`DeclineReason`](super::clc::DeclineReason) byte for Unmatched and Refused, else 0 |
//! | 7       | 1    | spare: sent as 0, ignored                                              |
//! | 8..16   | 8    | instance: the client's link-group manager instance in a Register, else 0 |
//! | 16..    | n    | payload: one CLC message, at most [`CLC_MAX_LEN`] bytes                |
//!
//! Register and Clc frames carry a payload (a Register's is the client's Proposal); Unmatched and
//! Refused frames carry none. [`DoorFrame::decode`] checks all of it and rejects anything else
//! with a [`DoorFrameError`]; it never panics. The payload's CLC message itself is decoded by
//! [`clc::decode`](super::clc::decode).

use std::fmt;

use super::clc::CLC_MAX_LEN;

/// First four bytes of every door frame.
pub const DOOR_MAGIC: [u8; 4] = *b"SMCd";
/// The door protocol version this crate speaks. It is also part of the doors' names, so
/// listeners and clients of different versions do not find each other.
pub const DOOR_VERSION: u8 = 2;
/// Length of a door frame's header; the payload follows it.
pub const DOOR_HEADER_LEN: usize = 16;
/// Longest door frame: the header and the longest payload.
pub const DOOR_FRAME_MAX: usize = DOOR_HEADER_LEN + CLC_MAX_LEN;

/// What a door frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DoorKind {
    /// Client to server, with the client's TCP socket attached and its CLC Proposal as payload:
    /// "my next connection to you proposes SMC".
    Register = 1,
    /// Either way: a CLC message of the handshake (Accept, Decline, Confirm, Commit) as payload.
    Clc = 2,
    /// Server to client, at registration, with a decline reason: "no handshake with me". Another
    /// door of a reuseport group may still take the connection.
    Unmatched = 3,
    /// Server to client, with a decline reason: "your connection reached me, and it stays TCP".
    /// Final: no other door of the group will see the connection.
    Refused = 4,
}

impl DoorKind {
    /// Every kind, in wire order.
    pub const ALL: [DoorKind; 4] = [Self::Register, Self::Clc, Self::Unmatched, Self::Refused];

    /// The kind with wire value `v`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::DoorKind;
    ///
    /// assert_eq!(DoorKind::from_u8(2), Some(DoorKind::Clc));
    /// assert_eq!(DoorKind::from_u8(DoorKind::Refused as u8), Some(DoorKind::Refused));
    /// assert_eq!(DoorKind::from_u8(0), None);
    /// assert_eq!(DoorKind::from_u8(5), None);
    /// ```
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == v)
    }

    /// Whether frames of this kind carry a payload (a CLC message): Register and Clc do,
    /// Unmatched and Refused do not.
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
    /// ```
    pub const fn has_payload(self) -> bool {
        matches!(self, Self::Register | Self::Clc)
    }
}

/// A door frame's header (its payload travels beside it, see [`DoorFrame::encode`]).
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::door::{DoorFrame, DoorKind, DOOR_HEADER_LEN};
///
/// let frame = DoorFrame { kind: DoorKind::Register, reason: 0, instance: 0x0102_0304_0506_0708 };
/// let bytes = frame.encode(b"a proposal");
/// assert_eq!(bytes.len(), DOOR_HEADER_LEN + 10);
/// assert_eq!(DoorFrame::decode(&bytes), Ok((frame, &b"a proposal"[..])));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DoorFrame {
    /// What the frame says.
    pub kind: DoorKind,
    /// For Unmatched and Refused, why: a [`DeclineReason`](super::clc::DeclineReason) byte
    /// (not checked here: a reason this version does not know still ends the wait). 0 otherwise.
    pub reason: u8,
    /// In a Register, the client's link-group manager instance (a restarted process with a
    /// reused pid is another client); 0 otherwise.
    pub instance: u64,
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
    /// A frame of a kind that carries no payload (Unmatched, Refused) came with this many bytes
    /// of it.
    UnexpectedPayload {
        /// The frame's kind.
        kind: DoorKind,
        /// The payload's length.
        len: usize,
    },
    /// A frame of a kind that carries a CLC message (Register, Clc) came without one.
    MissingPayload(DoorKind),
    /// The payload is longer than [`CLC_MAX_LEN`]; its length.
    PayloadTooLong(usize),
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
            DoorFrameError::MissingPayload(kind) => write!(f, "door {kind:?} frame without its CLC message"),
            DoorFrameError::PayloadTooLong(n) => {
                write!(f, "door frame payload of {n} bytes exceeds {CLC_MAX_LEN}")
            }
        }
    }
}

impl std::error::Error for DoorFrameError {}

impl DoorFrame {
    /// The frame with `payload` after its header, ready to send as one message. Nothing is
    /// checked: a payload belongs to Register and Clc frames only, and is at most
    /// [`CLC_MAX_LEN`] bytes, or the receiver's [`decode`](Self::decode) rejects the frame.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::{DoorFrame, DoorKind};
    ///
    /// // An Unmatched answer with reason 5 (handshake congested): a header and nothing else.
    /// let bytes = DoorFrame { kind: DoorKind::Unmatched, reason: 5, instance: 0 }.encode(&[]);
    /// assert_eq!(bytes, b"SMCd\x02\x03\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00");
    /// ```
    pub fn encode(&self, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(DOOR_HEADER_LEN + payload.len());
        b.extend_from_slice(&DOOR_MAGIC);
        b.push(DOOR_VERSION);
        b.push(self.kind as u8);
        b.push(self.reason);
        b.push(0);
        b.extend_from_slice(&self.instance.to_be_bytes());
        b.extend_from_slice(payload);
        b
    }

    /// Decodes one frame (one whole message): its header and its payload (empty but for
    /// Register and Clc). The spare byte is ignored.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::door::{DoorFrame, DoorFrameError, DoorKind};
    ///
    /// let frame = DoorFrame { kind: DoorKind::Clc, reason: 0, instance: 0 };
    /// let mut bytes = frame.encode(b"a CLC message");
    /// assert_eq!(DoorFrame::decode(&bytes), Ok((frame, &b"a CLC message"[..])));
    ///
    /// assert_eq!(DoorFrame::decode(&bytes[..15]), Err(DoorFrameError::TooShort(15)));
    /// assert_eq!(DoorFrame::decode(&bytes[..16]), Err(DoorFrameError::MissingPayload(DoorKind::Clc)));
    /// bytes[4] = 1; // another version
    /// assert_eq!(DoorFrame::decode(&bytes), Err(DoorFrameError::BadVersion(1)));
    /// ```
    pub fn decode(b: &[u8]) -> Result<(DoorFrame, &[u8]), DoorFrameError> {
        let Some((header, payload)) = b.split_first_chunk::<DOOR_HEADER_LEN>() else {
            return Err(DoorFrameError::TooShort(b.len()));
        };
        if header[..4] != DOOR_MAGIC {
            return Err(DoorFrameError::BadMagic);
        }
        if header[4] != DOOR_VERSION {
            return Err(DoorFrameError::BadVersion(header[4]));
        }
        let kind = DoorKind::from_u8(header[5]).ok_or(DoorFrameError::UnknownKind(header[5]))?;
        if payload.len() > CLC_MAX_LEN {
            return Err(DoorFrameError::PayloadTooLong(payload.len()));
        }
        match (kind.has_payload(), payload.is_empty()) {
            (true, true) => return Err(DoorFrameError::MissingPayload(kind)),
            (false, false) => return Err(DoorFrameError::UnexpectedPayload { kind, len: payload.len() }),
            _ => {}
        }
        let mut instance = [0u8; 8];
        instance.copy_from_slice(&header[8..]);
        Ok((DoorFrame { kind, reason: header[6], instance: u64::from_be_bytes(instance) }, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_frame_layout() {
        let frame = DoorFrame { kind: DoorKind::Register, reason: 0, instance: 0x1122_3344_5566_7788 };
        let bytes = frame.encode(&[0xAA, 0xBB]);
        assert_eq!(
            bytes,
            [b'S', b'M', b'C', b'd', 2, 1, 0, 0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xAA, 0xBB]
        );
        let refused = DoorFrame { kind: DoorKind::Refused, reason: 7, instance: 0 }.encode(&[]);
        assert_eq!(refused, [b'S', b'M', b'C', b'd', 2, 4, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn round_trip_every_kind() {
        for kind in DoorKind::ALL {
            let payload: &[u8] = if kind.has_payload() { b"payload" } else { b"" };
            for (reason, instance) in [(0, 0), (8, u64::MAX), (0xFF, 0x0102_0304_0506_0708)] {
                let frame = DoorFrame { kind, reason, instance };
                let bytes = frame.encode(payload);
                assert_eq!(bytes.len(), DOOR_HEADER_LEN + payload.len());
                assert_eq!(DoorFrame::decode(&bytes), Ok((frame, payload)));
            }
        }
        // The longest payload.
        let frame = DoorFrame { kind: DoorKind::Clc, reason: 0, instance: 0 };
        let long = vec![0x5A; CLC_MAX_LEN];
        let bytes = frame.encode(&long);
        assert_eq!(bytes.len(), DOOR_FRAME_MAX);
        assert_eq!(DoorFrame::decode(&bytes), Ok((frame, &long[..])));
    }

    #[test]
    fn the_spare_byte_is_ignored() {
        let frame = DoorFrame { kind: DoorKind::Unmatched, reason: 5, instance: 1 };
        let mut bytes = frame.encode(&[]);
        bytes[7] = 0xEE;
        assert_eq!(DoorFrame::decode(&bytes), Ok((frame, &[][..])));
    }

    #[test]
    fn every_error() {
        let good = DoorFrame { kind: DoorKind::Register, reason: 0, instance: 9 }.encode(b"p");
        assert_eq!(DoorFrame::decode(&[]), Err(DoorFrameError::TooShort(0)));
        assert_eq!(DoorFrame::decode(&good[..DOOR_HEADER_LEN - 1]), Err(DoorFrameError::TooShort(15)));

        let mut b = good.clone();
        b[3] = b'D';
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::BadMagic));

        let mut b = good.clone();
        b[4] = 3;
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::BadVersion(3)));

        for k in [0, 5, 0xFF] {
            let mut b = good.clone();
            b[5] = k;
            assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::UnknownKind(k)));
        }

        for kind in [DoorKind::Unmatched, DoorKind::Refused] {
            let b = DoorFrame { kind, reason: 1, instance: 0 }.encode(b"xyz");
            assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::UnexpectedPayload { kind, len: 3 }));
        }

        for kind in [DoorKind::Register, DoorKind::Clc] {
            let b = DoorFrame { kind, reason: 0, instance: 0 }.encode(&[]);
            assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::MissingPayload(kind)));
        }

        let b = DoorFrame { kind: DoorKind::Clc, reason: 0, instance: 0 }.encode(&vec![0; CLC_MAX_LEN + 1]);
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::PayloadTooLong(CLC_MAX_LEN + 1)));
        // Bounded before anything else about the payload is looked at.
        let b = DoorFrame { kind: DoorKind::Refused, reason: 0, instance: 0 }.encode(&vec![0; CLC_MAX_LEN + 1]);
        assert_eq!(DoorFrame::decode(&b), Err(DoorFrameError::PayloadTooLong(CLC_MAX_LEN + 1)));
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
        ];
        let texts: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(texts[0], "door frame of 3 bytes is shorter than its 16-byte header");
        assert_eq!(texts[4], "door Refused frame carries 2 payload bytes, expected none");
        assert_eq!(texts[6], "door frame payload of 2000 bytes exceeds 1024");
        let err: &dyn std::error::Error = &all[1];
        assert!(err.to_string().contains("SMCd"));
    }

    #[test]
    fn arbitrary_frames_never_panic() {
        // Every length around the header, every kind byte, with and without a payload.
        for len in 0..=DOOR_HEADER_LEN + 2 {
            for kind in 0..=6u8 {
                let mut b = DoorFrame { kind: DoorKind::Clc, reason: 0, instance: 0 }.encode(&[1, 2]);
                b[5] = kind;
                b.truncate(len);
                if let Ok((f, payload)) = DoorFrame::decode(&b) {
                    assert_eq!(f.encode(payload), b);
                }
            }
        }
    }
}
