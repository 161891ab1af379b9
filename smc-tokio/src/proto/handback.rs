//! Handing an SMC connection's byte stream back to its TCP socket mid-stream.
//!
//! Every SMC connection keeps the TCP connection it started as, idle underneath. When the link
//! under it fails while both processes live, or when the application asks for the socket
//! ([`SmcStream::hand_back`](crate::SmcStream::hand_back), then `into_std`), the connection
//! moves to that socket, in both directions, with nothing lost or repeated.
//!
//! **The exchange** is receiver-driven and in-band on the TCP connection, so it needs nothing
//! from the link (which may be gone). Each side, when it moves (on its own decision, or when the
//! peer's frame arrives on the TCP socket, which carries nothing else while SMC runs):
//!
//! 1. stops reading its receive ring: the bytes its application **consumed** from the peer,
//!    `consumed`, are final; whatever sits unread in the ring will come again over TCP;
//! 2. keeps a copy of what it wrote that the peer has not reported consumed (the bytes between
//!    the peer's last consumer cursor and its own producer cursor, all still in its send-side
//!    ring: flow control never overwrites them);
//! 3. writes its [`HandbackFrame`] (`consumed`) on the TCP socket;
//! 4. reads the peer's frame, the first bytes the peer puts on the socket: the peer's
//!    `consumed` is where the peer's stream of our bytes stops, so this side resends from
//!    there, out of its copy, then carries on with new writes on TCP (and shuts TCP's write
//!    side if its own was shut: the peer reads the end after the last byte, as before).
//!
//! The peer's `consumed` can only lie between what it reported consumed before (the copy's
//! start) and what we wrote (the copy's end); anything else is a protocol violation and ends
//! the connection. Neither side writes application bytes on TCP before its frame, and each
//! reads the other's frame before any byte of the other's stream, so the frames never mix with
//! data. Bytes written but not yet announced (under a cork, or a sendfile in progress) are in
//! the copy and are resent like the rest; data the peer announced but we had not read is
//! resent by the peer.
//!
//! ```text
//!  0..4   magic: "SMCH" in EBCDIC (E2 D4 C3 C8), the CLC eyecatcher's family
//!  4      version (1)
//!  5..8   reserved, 0
//!  8..16  consumed: bytes of the peer's stream this side read over SMC, big endian
//! ```
//!
//! [`Handback`] is one side's exchange: what to write, what it still needs to read, and which
//! bytes to resend. It holds no sockets; the driver feeds it and does the I/O.

use std::fmt;

/// Length of a [`HandbackFrame`] on the wire.
pub const HANDBACK_FRAME_LEN: usize = 16;
/// The frame's first four bytes: "SMCH" in EBCDIC, the family of the CLC eyecatcher ("SMCR"),
/// so that no plain-text protocol begins with it by chance.
pub const HANDBACK_MAGIC: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xC8];
/// The version this implementation speaks.
pub const HANDBACK_VERSION: u8 = 1;

/// The frame a side writes on the TCP socket when it moves there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandbackFrame {
    /// Bytes of the peer's stream this side consumed over SMC: the peer's stream resumes on
    /// TCP at this offset.
    pub consumed: u64,
}

/// What is wrong with a handback, ours or the peer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandbackError {
    /// The frame does not start with [`HANDBACK_MAGIC`]: the peer sent something else on the
    /// TCP socket under an SMC connection.
    BadMagic([u8; 4]),
    /// A version this implementation does not speak.
    UnsupportedVersion(u8),
    /// Reserved bytes that are not zero.
    BadReserved,
    /// The peer says it consumed more than we ever wrote.
    BeyondWritten {
        /// What the peer's frame says.
        consumed: u64,
        /// What we wrote.
        written: u64,
    },
    /// The peer says it consumed less than it had already reported consumed (our copy of the
    /// bytes before that point is gone).
    BeforeAcknowledged {
        /// What the peer's frame says.
        consumed: u64,
        /// What it had reported consumed.
        acknowledged: u64,
    },
    /// The TCP connection ended before the peer's whole frame arrived.
    Truncated {
        /// How many bytes of the frame had arrived.
        got: usize,
    },
}

impl fmt::Display for HandbackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandbackError::BadMagic(m) => {
                write!(f, "bytes on the tcp connection that are no handback frame ({m:02x?})")
            }
            HandbackError::UnsupportedVersion(v) => write!(f, "handback frame version {v} is not spoken here"),
            HandbackError::BadReserved => f.write_str("handback frame with reserved bytes set"),
            HandbackError::BeyondWritten { consumed, written } => {
                write!(f, "peer says it consumed {consumed} bytes of our stream, but we wrote {written}")
            }
            HandbackError::BeforeAcknowledged { consumed, acknowledged } => write!(
                f,
                "peer says it consumed {consumed} bytes of our stream, but had reported {acknowledged} consumed"
            ),
            HandbackError::Truncated { got } => {
                write!(
                    f,
                    "the tcp connection ended after {got} of the peer's {HANDBACK_FRAME_LEN} handback frame bytes"
                )
            }
        }
    }
}

impl std::error::Error for HandbackError {}

impl HandbackFrame {
    /// The frame's bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::handback::{HandbackFrame, HANDBACK_MAGIC};
    ///
    /// let b = HandbackFrame { consumed: 0x0102 }.encode();
    /// assert_eq!(&b[..4], &HANDBACK_MAGIC);
    /// assert_eq!(&b[14..], &[0x01, 0x02]);
    /// assert_eq!(HandbackFrame::decode(&b), Ok(HandbackFrame { consumed: 0x0102 }));
    /// ```
    pub fn encode(&self) -> [u8; HANDBACK_FRAME_LEN] {
        let mut b = [0u8; HANDBACK_FRAME_LEN];
        b[..4].copy_from_slice(&HANDBACK_MAGIC);
        b[4] = HANDBACK_VERSION;
        b[8..].copy_from_slice(&self.consumed.to_be_bytes());
        b
    }

    /// Decodes a frame; every field is checked.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::handback::{HandbackError, HandbackFrame};
    ///
    /// let mut b = HandbackFrame { consumed: 7 }.encode();
    /// b[4] = 9;
    /// assert_eq!(HandbackFrame::decode(&b), Err(HandbackError::UnsupportedVersion(9)));
    /// assert!(matches!(HandbackFrame::decode(b"GET / HTTP/1.1\r\n"), Err(HandbackError::BadMagic(_))));
    /// ```
    pub fn decode(b: &[u8; HANDBACK_FRAME_LEN]) -> Result<HandbackFrame, HandbackError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != HANDBACK_MAGIC {
            return Err(HandbackError::BadMagic(magic));
        }
        if b[4] != HANDBACK_VERSION {
            return Err(HandbackError::UnsupportedVersion(b[4]));
        }
        if b[5..8] != [0, 0, 0] {
            return Err(HandbackError::BadReserved);
        }
        let mut c = [0u8; 8];
        c.copy_from_slice(&b[8..]);
        Ok(HandbackFrame { consumed: u64::from_be_bytes(c) })
    }
}

/// One side's handback (see the module documentation).
///
/// # Examples
///
/// Two sides, back to back: A wrote 10 bytes (B reported 4 consumed, and consumed 6 by the
/// time it moves); B wrote nothing, A consumed nothing.
///
/// ```
/// use smc_tokio::proto::handback::Handback;
///
/// let mut a = Handback::new(0, 4, 10, false);
/// let mut b = Handback::new(6, 0, 0, false);
/// // Each writes its frame, and reads the other's.
/// let (fa, fb) = (a.frame_to_write().to_vec(), b.frame_to_write().to_vec());
/// a.frame_written(fa.len());
/// b.frame_written(fb.len());
/// assert_eq!(a.on_peer_bytes(&fb).unwrap(), fb.len());
/// assert_eq!(b.on_peer_bytes(&fa).unwrap(), fa.len());
/// // A resends what B had not consumed: its bytes 6..10.
/// assert_eq!(a.resend(), Some((6, 10)));
/// a.resent(4);
/// assert_eq!(b.resend(), None);
/// assert!(a.is_done() && b.is_done());
/// ```
#[derive(Debug, Clone)]
pub struct Handback {
    frame: [u8; HANDBACK_FRAME_LEN],
    frame_at: usize,
    peer: [u8; HANDBACK_FRAME_LEN],
    peer_got: usize,
    /// What the peer had reported consumed of our stream: our copy starts here.
    acknowledged: u64,
    /// What we wrote: our copy ends here.
    written: u64,
    /// Where the peer's stream of our bytes stops (from its frame).
    peer_consumed: Option<u64>,
    /// The next of our bytes to resend.
    resend_at: u64,
    /// Our write side was shut before the move: shut TCP's after the resend.
    shutdown: bool,
    shutdown_done: bool,
}

impl Handback {
    /// A handback of a side that consumed `consumed` bytes of the peer's stream, wrote
    /// `written` bytes of its own, of which the peer reported `acknowledged` consumed
    /// (`acknowledged <= written`), and whose write side is `shutdown` or not.
    pub fn new(consumed: u64, acknowledged: u64, written: u64, shutdown: bool) -> Handback {
        Handback {
            frame: HandbackFrame { consumed }.encode(),
            frame_at: 0,
            peer: [0; HANDBACK_FRAME_LEN],
            peer_got: 0,
            acknowledged: acknowledged.min(written),
            written,
            peer_consumed: None,
            resend_at: written,
            shutdown,
            shutdown_done: false,
        }
    }

    /// What is left of our frame to write on the TCP socket (empty once it is written).
    pub fn frame_to_write(&self) -> &[u8] {
        &self.frame[self.frame_at..]
    }

    /// `n` more bytes of our frame were written.
    pub fn frame_written(&mut self, n: usize) {
        self.frame_at = (self.frame_at + n).min(HANDBACK_FRAME_LEN);
    }

    /// How many bytes of the peer's frame are still to be read (read no more than this off the
    /// socket before the frame is complete: what follows it is the peer's stream).
    pub fn peer_frame_wanted(&self) -> usize {
        HANDBACK_FRAME_LEN - self.peer_got
    }

    /// Takes bytes read off the socket towards the peer's frame; returns how many it took (at
    /// most [`peer_frame_wanted`](Self::peer_frame_wanted)). The frame is checked once whole.
    pub fn on_peer_bytes(&mut self, data: &[u8]) -> Result<usize, HandbackError> {
        let n = data.len().min(self.peer_frame_wanted());
        self.peer[self.peer_got..self.peer_got + n].copy_from_slice(&data[..n]);
        self.peer_got += n;
        if self.peer_got == HANDBACK_FRAME_LEN && self.peer_consumed.is_none() {
            let f = HandbackFrame::decode(&self.peer)?;
            if f.consumed > self.written {
                return Err(HandbackError::BeyondWritten { consumed: f.consumed, written: self.written });
            }
            if f.consumed < self.acknowledged {
                return Err(HandbackError::BeforeAcknowledged {
                    consumed: f.consumed,
                    acknowledged: self.acknowledged,
                });
            }
            self.peer_consumed = Some(f.consumed);
            self.resend_at = f.consumed;
        }
        Ok(n)
    }

    /// The TCP connection ended while `peer_frame_wanted() > 0`.
    pub fn peer_eof(&self) -> HandbackError {
        HandbackError::Truncated { got: self.peer_got }
    }

    /// Whether the peer's frame arrived (what follows on the socket is its stream).
    pub fn peer_frame_read(&self) -> bool {
        self.peer_consumed.is_some()
    }

    /// Our bytes still to resend, as offsets in our stream `[from, to)`: `None` until our frame
    /// is written and the peer's read, and once everything is resent.
    pub fn resend(&self) -> Option<(u64, u64)> {
        (self.frame_at == HANDBACK_FRAME_LEN && self.peer_consumed.is_some() && self.resend_at < self.written)
            .then_some((self.resend_at, self.written))
    }

    /// `n` more bytes were resent.
    pub fn resent(&mut self, n: u64) {
        self.resend_at = (self.resend_at + n).min(self.written);
    }

    /// Where our copy of the unacknowledged bytes starts, in our stream.
    pub fn copy_start(&self) -> u64 {
        self.acknowledged
    }

    /// Whether TCP's write side is to be shut now (our side was shut before the move, and
    /// everything is resent).
    pub fn shutdown_wanted(&self) -> bool {
        self.shutdown && !self.shutdown_done && self.frame_at == HANDBACK_FRAME_LEN && self.sent_all()
    }

    /// TCP's write side was shut.
    pub fn shutdown_sent(&mut self) {
        self.shutdown_done = true;
    }

    fn sent_all(&self) -> bool {
        self.peer_consumed.is_some() && self.resend_at >= self.written
    }

    /// Whether the exchange is over: the connection is a TCP connection from here on.
    pub fn is_done(&self) -> bool {
        self.frame_at == HANDBACK_FRAME_LEN && self.sent_all() && (!self.shutdown || self.shutdown_done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The offset in a ring of `ring` bytes of byte `at` of a stream whose byte `end` would go
    /// to ring offset `end_offset` (the producer cursor's position), for `end - ring <= at <=
    /// end`: where a byte still in the ring lies (the model's writers read their copies so).
    fn ring_offset(ring: u32, end_offset: u32, end: u64, at: u64) -> Option<u32> {
        let back = end.checked_sub(at)?;
        if back > u64::from(ring) || end_offset >= ring {
            return None;
        }
        let back = back as u32;
        Some(if back <= end_offset { end_offset - back } else { ring - (back - end_offset) })
    }

    #[test]
    fn frames_round_trip_and_every_field_is_checked() {
        for c in [0, 1, u64::MAX, 1 << 40] {
            assert_eq!(
                HandbackFrame::decode(&HandbackFrame { consumed: c }.encode()),
                Ok(HandbackFrame { consumed: c })
            );
        }
        let mut b = HandbackFrame { consumed: 1 }.encode();
        b[6] = 1;
        assert_eq!(HandbackFrame::decode(&b), Err(HandbackError::BadReserved));
        let mut b = HandbackFrame { consumed: 1 }.encode();
        b[0] = b'S';
        assert!(matches!(HandbackFrame::decode(&b), Err(HandbackError::BadMagic(_))));
    }

    #[test]
    fn a_peer_that_claims_what_cannot_be_is_refused() {
        let mut h = Handback::new(0, 10, 20, false);
        let err = h.on_peer_bytes(&HandbackFrame { consumed: 21 }.encode()).unwrap_err();
        assert_eq!(err, HandbackError::BeyondWritten { consumed: 21, written: 20 });
        let mut h = Handback::new(0, 10, 20, false);
        let err = h.on_peer_bytes(&HandbackFrame { consumed: 9 }.encode()).unwrap_err();
        assert_eq!(err, HandbackError::BeforeAcknowledged { consumed: 9, acknowledged: 10 });
        let mut h = Handback::new(0, 0, 0, false);
        assert_eq!(h.on_peer_bytes(&[0xE2, 0xD4]).unwrap(), 2);
        assert_eq!(h.peer_eof(), HandbackError::Truncated { got: 2 });
    }

    #[test]
    fn ring_offsets_of_bytes_still_in_the_ring() {
        // A 16-byte ring; 40 bytes written, so the next goes to offset 8.
        assert_eq!(ring_offset(16, 8, 40, 39), Some(7));
        assert_eq!(ring_offset(16, 8, 40, 30), Some(14)); // before the wrap
        assert_eq!(ring_offset(16, 8, 40, 20), None); // overwritten long ago
    }

    #[test]
    fn nothing_is_resent_before_our_frame_is_out() {
        let mut h = Handback::new(0, 0, 5, false);
        h.on_peer_bytes(&HandbackFrame { consumed: 2 }.encode()).unwrap();
        assert_eq!(h.resend(), None, "our frame first");
        h.frame_written(HANDBACK_FRAME_LEN - 1);
        assert_eq!(h.resend(), None);
        h.frame_written(1);
        assert_eq!(h.resend(), Some((2, 5)));
    }

    /// One direction of a connection: a writer with a ring, a reader, the SMC part up to a cut
    /// point, then the handback. `App` is what each application did.
    #[derive(Debug, Clone)]
    struct Dir {
        /// The writer's whole stream (SMC part and what it writes after the move).
        data: Vec<u8>,
        /// Bytes written over SMC before the move.
        written: usize,
        /// Bytes the reader consumed of them.
        consumed: usize,
        /// Of those, the part the reader had reported (`acknowledged <= consumed`).
        acknowledged: usize,
        /// The writer shut its write side before the move.
        shut: bool,
    }

    /// The writer's ring: bytes at their offsets, as the links keep them.
    fn ring_of(data: &[u8], written: usize, ring: u32) -> (Vec<u8>, u32) {
        let mut r = vec![0u8; ring as usize];
        for (i, b) in data[..written].iter().enumerate() {
            r[i % ring as usize] = *b;
        }
        (r, (written % ring as usize) as u32)
    }

    /// Runs both sides' handbacks over two simulated TCP pipes delivered in chunks of
    /// `chunk`, and returns what each reader ends up with: what it consumed over SMC, then
    /// what it reads off TCP after the peer's frame (to the end if the writer shut).
    fn run(ab: &Dir, ba: &Dir, ring: u32, chunk: usize, a_first: bool) -> (Vec<u8>, Vec<u8>) {
        let mut sides = [
            Handback::new(ba.consumed as u64, ab.acknowledged as u64, ab.written as u64, ab.shut),
            Handback::new(ab.consumed as u64, ba.acknowledged as u64, ba.written as u64, ba.shut),
        ];
        let dirs = [ab, ba];
        let rings = [ring_of(&ab.data, ab.written, ring), ring_of(&ba.data, ba.written, ring)];
        // Each side's copy of its unacknowledged bytes, taken from its ring at the move.
        let copies: Vec<Vec<u8>> = (0..2)
            .map(|s| {
                let (r, end_off) = &rings[s];
                (sides[s].copy_start()..dirs[s].written as u64)
                    .map(|at| r[ring_offset(ring, *end_off, dirs[s].written as u64, at).unwrap() as usize])
                    .collect()
            })
            .collect();
        // pipes[s]: bytes side s wrote on TCP, not yet read by the other side.
        let mut pipes: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        let mut closed = [false, false];
        let mut received: [Vec<u8>; 2] = [ba.data[..ba.consumed].to_vec(), ab.data[..ab.consumed].to_vec()];
        let mut app_sent = [false, false];
        let order = if a_first { [0, 1] } else { [1, 0] };
        for _round in 0..10_000 {
            for &s in &order {
                let o = 1 - s;
                // Write our frame, a chunk at a time.
                let f = sides[s].frame_to_write().to_vec();
                let n = f.len().min(chunk);
                pipes[s].extend_from_slice(&f[..n]);
                sides[s].frame_written(n);
                // Read the peer's frame, no more than it wants.
                if !sides[s].peer_frame_read() {
                    let want = sides[s].peer_frame_wanted().min(chunk).min(pipes[o].len());
                    let bytes: Vec<u8> = pipes[o].drain(..want).collect();
                    sides[s].on_peer_bytes(&bytes).expect("a valid peer frame");
                } else {
                    // The peer's stream.
                    let n = pipes[o].len().min(chunk);
                    received[s].extend(pipes[o].drain(..n));
                }
                // Resend, then the application's later bytes, then the end.
                if let Some((from, to)) = sides[s].resend() {
                    let start = (from - sides[s].copy_start()) as usize;
                    let n = ((to - from) as usize).min(chunk);
                    pipes[s].extend_from_slice(&copies[s][start..start + n]);
                    sides[s].resent(n as u64);
                }
                if sides[s].shutdown_wanted() {
                    sides[s].shutdown_sent();
                    closed[s] = true;
                }
                if sides[s].is_done() && !app_sent[s] {
                    pipes[s].extend_from_slice(&dirs[s].data[dirs[s].written..]);
                    app_sent[s] = true;
                }
            }
            if sides.iter().all(|h| h.is_done()) && app_sent == [true, true] && pipes.iter().all(|p| p.is_empty()) {
                break;
            }
        }
        assert!(sides.iter().all(|h| h.is_done()), "the exchange finished");
        for s in 0..2 {
            if dirs[s].shut {
                assert!(closed[s], "a shut writer shuts TCP after its resend");
            }
        }
        (received[0].clone(), received[1].clone())
    }

    /// A direction cut at a random point: what was written over SMC, what the reader had
    /// reported consumed (at most a ring behind, as flow control keeps it), what it consumed,
    /// whether the writer shut its side, and what it writes after the move.
    fn dir(max: usize, ring: usize) -> impl Strategy<Value = Dir> {
        (0..max, 0..max, 0..=ring, any::<bool>(), any::<u8>(), any::<u64>()).prop_map(
            move |(written, after, ack_back, shut, seed, pick)| {
                let acknowledged = written.saturating_sub(ack_back);
                let consumed = acknowledged + (pick as usize) % (written - acknowledged + 1);
                let total = written + if shut { 0 } else { after };
                // Bytes that differ from their neighbours, so a byte out of place shows.
                let data = (0..total).map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed).collect();
                Dir { data, written, consumed, acknowledged, shut }
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Both directions, random cut points, acknowledgements behind what was consumed,
        /// unread bytes in the ring, half-closed writers, random TCP chunking and who moves
        /// first: each reader ends with exactly the writer's stream, in order, once.
        #[test]
        fn every_byte_arrives_once_in_order(
            ab in dir(300, 64),
            ba in dir(300, 64),
            chunk in 1usize..40,
            a_first in any::<bool>(),
        ) {
            let (at_a, at_b) = run(&ab, &ba, 64, chunk, a_first);
            // B reads A's stream; A reads B's.
            prop_assert_eq!(at_a, ba.data.clone());
            prop_assert_eq!(at_b, ab.data.clone());
        }

        #[test]
        fn ring_offsets_agree_with_a_plain_ring(ring in 1u32..100, end in 0u64..1000, back in 0u64..100) {
            let at = end.saturating_sub(back);
            let got = ring_offset(ring, (end % u64::from(ring)) as u32, end, at);
            if end - at <= u64::from(ring) {
                prop_assert_eq!(got, Some((at % u64::from(ring)) as u32));
            } else {
                prop_assert_eq!(got, None);
            }
        }
    }
}
