//! The per-connection engine: producer and consumer cursors, flow control, and the decision of
//! when to send a CDC message. Sans-IO: it never touches memory or sockets; the driver copies
//! bytes where the engine says and sends the CDC messages the engine builds.
//!
//! Each connection has two rings:
//! - **tx**: the peer's receive buffer (RMB). We write at `tx_prod`; the peer consumes up to
//!   `peer_cons`, which it tells us in its CDC messages. Free space is `tx_ring - (tx_prod -
//!   peer_cons)`: we never write where the peer has not read.
//! - **rx**: our RMB. The peer writes up to `peer_prod` (from its CDC messages); the
//!   application consumes up to `rx_cons`, which we tell the peer when enough was freed (a tenth
//!   of the ring, the kernel's `smc_rmb_wnd_update_limit`), at once when the peer said it is
//!   `write_blocked`, and with every CDC message we send anyway.
//!
//! Everything that arrives from the peer is validated before it changes any state
//! ([`ConnEngine::on_cdc`]): cursors may only move forward, never past what the other side
//! allows; sequence numbers must follow each other; a closed direction stays closed.
//!
//! **RMB autotuning.** A ring may change size while the connection runs, as TCP autotunes its
//! buffers: a writer that filled the ring asks to grow it ([`ConnEngine::tx_grow_wanted`]); once
//! the driver allows it ([`ConnEngine::tx_resize`], after charging the memory), the writer lets
//! the peer drain the ring, then announces the new size with `RMB_RESIZE` and starts its cursor
//! over at `0:0`. Nothing lives in the old ring at that point, so no byte moves. The reader
//! answers with `RMB_RESIZE_ACK`; consumer cursors it sent before that are from the old ring and
//! are ignored. A reader accepts a size only up to the capacity its driver set
//! ([`ConnEngine::set_rx_max`]: the slot the writer's region reserves for the connection).

use std::fmt;

use super::cdc::{CdcFlags, CdcMsg, CDC_INLINE_MAX};
use super::cursor::{Cursor, CursorError, RingSize};

/// What a handback needs to know of a connection ([`ConnEngine::handback_totals`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandbackTotals {
    /// Bytes of the peer's stream the application consumed.
    pub consumed: u64,
    /// Bytes of ours the peer reported consumed.
    pub acknowledged: u64,
    /// Bytes we wrote.
    pub written: u64,
    /// Where the `written - acknowledged` unacknowledged bytes lie in the ring, oldest first.
    pub unacked: Spans,
}

/// A CDC message or state change from the peer that breaks the protocol. The connection must be
/// aborted; other connections are not affected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// The peer's producer cursor went backwards, beyond the ring, or past unread data.
    BadProducerCursor(CursorError),
    /// The peer's consumer cursor went backwards or past what we produced.
    BadConsumerCursor(CursorError),
    /// A sequence number that does not follow the last one.
    BadSequence {
        /// The sequence number expected.
        expected: u32,
        /// The one received.
        got: u32,
    },
    /// The peer produced data after it said it was done writing.
    DataAfterDone,
    /// Inline data that does not fit the ring or arrives with other new data.
    BadInline,
    /// The peer resized our receive ring to a size that is not a ring size or exceeds the
    /// capacity reserved for it.
    BadResize {
        /// The size announced.
        size: u32,
        /// The most this connection allows.
        max: u32,
    },
    /// The peer resized our receive ring on a connection that allows no resize
    /// ([`ConnEngine::refuse_resize`]).
    ResizeRefused {
        /// The size announced.
        size: u32,
    },
    /// The peer resized our receive ring while bytes it announced were still unread.
    ResizeWithUnreadData,
    /// The peer acknowledged a resize we did not make.
    UnexpectedResizeAck,
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::BadProducerCursor(e) => write!(f, "peer sent a bad producer cursor: {e}"),
            EngineError::BadConsumerCursor(e) => write!(f, "peer sent a bad consumer cursor: {e}"),
            EngineError::BadSequence { expected, got } => {
                write!(f, "peer sent CDC sequence {got}, expected {expected}")
            }
            EngineError::DataAfterDone => f.write_str("peer wrote data after it was done writing"),
            EngineError::BadInline => f.write_str("peer sent inline data that does not fit"),
            EngineError::BadResize { size, max } => {
                write!(f, "peer resized its ring to {size} bytes (allowed: 1 ..= {max})")
            }
            EngineError::ResizeRefused { size } => {
                write!(f, "peer resized its ring to {size} bytes on a link whose rings have a fixed size")
            }
            EngineError::ResizeWithUnreadData => f.write_str("peer resized its ring while data was unread"),
            EngineError::UnexpectedResizeAck => f.write_str("peer acknowledged a ring resize that was not made"),
        }
    }
}

impl std::error::Error for EngineError {}

/// What a valid CDC message changed, so the driver knows whom to wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CdcEffect {
    /// New bytes (or EOF, or an abort) for the reader.
    pub readable: bool,
    /// Space freed in the peer's ring (or an abort) for the writer.
    pub writable: bool,
}

/// Where inline payload bytes of a received CDC message go: the driver copies them into the rx
/// ring at these spans (they are the last `len` bytes before the message's producer cursor).
pub type Spans = [(u32, u32); 2];

/// The state of one SMC connection, both directions.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::engine::ConnEngine;
/// use smc_tokio::proto::cursor::RingSize;
///
/// let ring = RingSize::new(1024).unwrap();
/// let mut a = ConnEngine::new(1, ring, ring);
/// let mut b = ConnEngine::new(2, ring, ring);
///
/// // A writes 100 bytes into B's ring and tells B.
/// assert_eq!(a.tx_free(), 1024);
/// a.tx_commit(100).unwrap();
/// let msg = a.poll_cdc().unwrap();
/// a.on_cdc_sent(&msg);
/// let (effect, _inline) = b.on_cdc(&msg).unwrap();
/// assert!(effect.readable);
/// assert_eq!(b.rx_available(), 100);
/// b.rx_consume(100).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct ConnEngine {
    token: u32,
    tx_ring: RingSize,
    tx_prod: Cursor,
    tx_prod_sent: Cursor,
    peer_cons: Cursor,
    rx_ring: RingSize,
    rx_cons: Cursor,
    rx_cons_sent: Cursor,
    peer_prod: Cursor,
    seq_out: u32,
    seq_in: u32,
    corked: bool,
    push_once: bool,
    autocork: u32,
    /// The peer asked for what we hold (`cons_curs_upd_req`): autocork lets it go, as the
    /// kernel's SMC sends what it holds at that request. Cleared once all is announced.
    peer_wants_data: bool,
    /// We ask the peer for what it holds ([`ConnEngine::ask_for_data`]) with the next message.
    ask_data_due: bool,
    /// The peer's producer cursor when we last asked: once per arrival, not once per look.
    asked_at: Option<Cursor>,
    done_writing: bool,
    done_writing_sent: bool,
    closed: bool,
    closed_sent: bool,
    aborted: bool,
    aborted_sent: bool,
    write_blocked: bool,
    write_blocked_sent: bool,
    peer_write_blocked: bool,
    peer_done_writing: bool,
    peer_closed: bool,
    peer_aborted: bool,
    /// Largest ring the peer accepts for our writes; growth stops there.
    tx_max: RingSize,
    /// Largest ring the peer may resize our receive ring to.
    rx_max: RingSize,
    /// The peer may not resize our receive ring at all ([`ConnEngine::refuse_resize`]).
    resize_refused: bool,
    /// The writer found the ring full since the last resize (a reason to grow).
    tx_filled: bool,
    /// A resize the driver allowed, applied once the peer has consumed everything.
    tx_resize_pending: Option<RingSize>,
    /// The applied resize is not announced yet.
    tx_resize_due: bool,
    /// The peer has not acknowledged our last resize: its consumer cursors are from the old ring.
    tx_resize_unacked: bool,
    /// We owe the peer an acknowledgement of its resize.
    rx_resize_ack_due: bool,
    /// That acknowledgement is of a restart (a resize to the same size): it rides on our next
    /// message instead of forcing one. The peer needs it only to trust our consumer cursors
    /// again, and every message that carries one carries it.
    rx_resize_ack_quiet: bool,
    /// Where the ring starts over once the peer has consumed everything ([`set_tx_restart`]).
    ///
    /// [`set_tx_restart`]: Self::set_tx_restart
    tx_restart_at: Option<u32>,
    /// The resize to announce is a restart: it rides on the next message instead of forcing one.
    tx_restart_quiet: bool,
    /// Bytes committed into the peer's rings since the connection began (across resizes).
    tx_total: u64,
    /// Bytes the application consumed from our rings since the connection began.
    rx_total: u64,
}

impl ConnEngine {
    /// A connection whose outgoing CDC messages carry `token`, writing into a peer ring of
    /// `tx_ring` bytes and reading from our ring of `rx_ring` bytes. All cursors start at 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    ///
    /// // We write into the peer's 64 KiB ring and read from our own 256 KiB one.
    /// let e = ConnEngine::new(7, RingSize::new(64 << 10).unwrap(), RingSize::new(256 << 10).unwrap());
    /// assert_eq!(e.token(), 7);
    /// assert_eq!(e.tx_free(), 64 << 10);
    /// assert_eq!(e.rx_available(), 0);
    /// assert!(e.poll_cdc().is_none()); // nothing to tell yet
    /// ```
    pub fn new(token: u32, tx_ring: RingSize, rx_ring: RingSize) -> Self {
        Self {
            token,
            tx_ring,
            tx_prod: Cursor::default(),
            tx_prod_sent: Cursor::default(),
            peer_cons: Cursor::default(),
            rx_ring,
            rx_cons: Cursor::default(),
            rx_cons_sent: Cursor::default(),
            peer_prod: Cursor::default(),
            seq_out: 0,
            seq_in: 0,
            corked: false,
            push_once: false,
            autocork: 0,
            peer_wants_data: false,
            ask_data_due: false,
            asked_at: None,
            done_writing: false,
            done_writing_sent: false,
            closed: false,
            closed_sent: false,
            aborted: false,
            aborted_sent: false,
            write_blocked: false,
            write_blocked_sent: false,
            peer_write_blocked: false,
            peer_done_writing: false,
            peer_closed: false,
            peer_aborted: false,
            tx_max: tx_ring,
            rx_max: rx_ring,
            resize_refused: false,
            tx_filled: false,
            tx_resize_pending: None,
            tx_resize_due: false,
            tx_resize_unacked: false,
            rx_resize_ack_due: false,
            rx_resize_ack_quiet: false,
            tx_restart_at: None,
            tx_restart_quiet: false,
            tx_total: 0,
            rx_total: 0,
        }
    }

    /// Lets our writes grow the peer's ring up to `max` bytes (its capacity for this
    /// connection, which the peer enforces). Without it the ring keeps its first size.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    ///
    /// let ring = RingSize::new(4096).unwrap();
    /// let mut e = ConnEngine::new(1, ring, ring);
    /// e.set_tx_max(RingSize::new(16384).unwrap());
    /// e.tx_commit(4096).unwrap(); // the ring filled: a reason to grow
    /// assert_eq!(e.tx_grow_wanted().map(RingSize::get), Some(8192));
    /// ```
    pub fn set_tx_max(&mut self, max: RingSize) {
        self.tx_max = max.max(self.tx_ring);
    }

    /// Lets the peer resize our receive ring up to `max` bytes (the capacity the peer's region
    /// reserves for this connection). A larger announcement aborts the connection.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcMsg;
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::{ConnEngine, EngineError};
    ///
    /// let ring = RingSize::new(4096).unwrap();
    /// let mut e = ConnEngine::new(1, ring, ring);
    /// e.set_rx_max(RingSize::new(8192).unwrap());
    /// let mut msg = CdcMsg::new(1, 1);
    /// msg.set_resize(16384);
    /// assert_eq!(e.on_cdc(&msg), Err(EngineError::BadResize { size: 16384, max: 8192 }));
    /// msg.set_resize(8192);
    /// assert!(e.on_cdc(&msg).is_ok());
    /// assert_eq!(e.rx_ring().get(), 8192);
    /// ```
    pub fn set_rx_max(&mut self, max: RingSize) {
        self.rx_max = max.max(self.rx_ring);
    }

    /// Refuses every resize of our receive ring (a protocol error, as a resize past the
    /// largest): for a link whose rings are registered memory of a fixed size, where our
    /// writers never resize and the kernel's SMC speaks no resize, a resize could only shrink
    /// our ring, to one byte, and make us send a message for every byte we consume.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcMsg;
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::{ConnEngine, EngineError};
    ///
    /// let ring = RingSize::new(4096).unwrap();
    /// let mut e = ConnEngine::new(1, ring, ring);
    /// e.refuse_resize();
    /// let mut msg = CdcMsg::new(1, 1);
    /// msg.set_resize(1);
    /// assert_eq!(e.on_cdc(&msg), Err(EngineError::ResizeRefused { size: 1 }));
    /// msg.set_resize(4096); // nor a start over at the same size
    /// assert_eq!(e.on_cdc(&msg), Err(EngineError::ResizeRefused { size: 4096 }));
    /// assert_eq!(e.rx_ring().get(), 4096);
    /// ```
    pub fn refuse_resize(&mut self) {
        self.resize_refused = true;
    }

    /// Lets the ring we write into start over at its beginning whenever the peer has consumed
    /// everything we wrote and our position is `at` bytes or more into it (`None`: never, the
    /// default). A request/response connection then keeps writing the same few cache lines
    /// instead of walking the whole ring, which across many connections no cache holds. The
    /// restart is announced as a resize to the same size, on the next message we send anyway
    /// (it forces none), and the peer's consumer cursors count only after it acknowledged it,
    /// as after a resize. Only for a peer that speaks `RMB_RESIZE` (ours).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::Cursor;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(4096);
    /// // `a` and `b`: the two ends of a connection (4 KiB rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.set_tx_restart(Some(1024));
    /// a.tx_commit(1500).unwrap();
    /// flush(&mut a, &mut b);
    /// b.rx_consume(1500).unwrap();
    /// flush(&mut b, &mut a); // everything consumed, 1500 >= 1024 bytes in: a starts over
    /// assert!(a.poll_cdc().is_none()); // the restart forces no message
    /// assert_eq!(a.tx_spans(10).unwrap()[0], (0, 10)); // the next bytes go at the start
    /// a.tx_commit(10).unwrap();
    /// let msg = a.poll_cdc().unwrap();
    /// assert_eq!((msg.ring_size(), msg.prod), (Some(4096), Cursor::new(0, 10)));
    /// flush(&mut a, &mut b);
    /// assert_eq!(b.rx_available(), 10); // read from the ring's start
    /// ```
    pub fn set_tx_restart(&mut self, at: Option<u32>) {
        self.tx_restart_at = at;
    }

    /// Starts the ring we write into over at `0:0` if [`set_tx_restart`](Self::set_tx_restart)
    /// allows it now: everything we wrote was announced and consumed, we are far enough into
    /// the ring, no resize is under way or wanted (growth goes first: a writer that keeps
    /// filling the ring would otherwise restart on every drain and never grow), and neither
    /// side has ended the connection.
    fn maybe_restart(&mut self) {
        let Some(at) = self.tx_restart_at else { return };
        if self.tx_prod.count < at.max(1)
            || self.tx_prod != self.peer_cons
            || self.tx_prod != self.tx_prod_sent
            || self.tx_resizing()
            || (self.tx_filled && self.tx_ring < self.tx_max)
            || self.done_writing
            || self.aborted
            || self.peer_closed()
        {
            return;
        }
        self.start_over(true);
    }

    /// The size of the peer's ring we write into now.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    ///
    /// let e = ConnEngine::new(1, RingSize::new(4096).unwrap(), RingSize::new(8192).unwrap());
    /// assert_eq!((e.tx_ring().get(), e.rx_ring().get()), (4096, 8192));
    /// ```
    pub fn tx_ring(&self) -> RingSize {
        self.tx_ring
    }

    /// The size of our receive ring now (the peer may resize it).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    ///
    /// let e = ConnEngine::new(1, RingSize::new(4096).unwrap(), RingSize::new(8192).unwrap());
    /// assert_eq!(e.rx_ring().get(), 8192);
    /// ```
    pub fn rx_ring(&self) -> RingSize {
        self.rx_ring
    }

    /// The next ring size worth asking for: twice the current one, up to the peer's capacity,
    /// when the writer filled the ring since the last resize and no resize is under way or
    /// the direction is closing. The driver charges the memory and calls
    /// [`tx_resize`](Self::tx_resize), or leaves it.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    ///
    /// let ring = RingSize::new(4096).unwrap();
    /// let mut e = ConnEngine::new(1, ring, ring);
    /// e.set_tx_max(RingSize::new(6000).unwrap());
    /// assert_eq!(e.tx_grow_wanted(), None); // never filled
    /// e.set_write_blocked(); // wanted more room than there was
    /// assert_eq!(e.tx_grow_wanted().map(RingSize::get), Some(6000)); // capped
    /// ```
    pub fn tx_grow_wanted(&self) -> Option<RingSize> {
        if !self.tx_filled || self.tx_resizing() || self.done_writing {
            return None;
        }
        let next = RingSize::new(self.tx_ring.get().saturating_mul(2).min(self.tx_max.get()))?;
        (next > self.tx_ring).then_some(next)
    }

    /// Resizes the peer's ring to `size` (at most the peer's capacity): the writer stops
    /// (no free space) until the peer has consumed everything announced, then the next CDC
    /// message announces the new size and the producer cursor starts over. Returns `false`
    /// (and changes nothing) when `size` exceeds the capacity, equals the current size, or a
    /// resize is under way.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(4096);
    /// // `a` writes into `b`'s ring, which `b`'s region can hold up to 16 KiB large.
    /// let big = RingSize::new(16384).unwrap();
    /// a.set_tx_max(big);
    /// b.set_rx_max(big);
    /// a.tx_commit(4096).unwrap();
    /// flush(&mut a, &mut b);
    /// assert!(a.tx_resize(big));
    /// assert_eq!(a.tx_free(), 0); // waits for b to drain the old ring
    /// b.rx_consume(4096).unwrap();
    /// flush(&mut b, &mut a); // b's consumer update: the old ring is empty, the resize applies
    /// assert_eq!(a.tx_free(), 16384);
    /// a.tx_commit(10000).unwrap();
    /// flush(&mut a, &mut b); // RMB_RESIZE, then the data in the new ring
    /// assert_eq!((b.rx_ring().get(), b.rx_available()), (16384, 10000));
    /// ```
    pub fn tx_resize(&mut self, size: RingSize) -> bool {
        if size > self.tx_max || size == self.tx_ring || self.tx_resizing() {
            return false;
        }
        self.tx_resize_pending = Some(size);
        self.apply_tx_resize();
        self.ask_to_drain();
        true
    }

    /// A resize is under way: waiting for the drain, not yet announced, or not yet acknowledged.
    fn tx_resizing(&self) -> bool {
        self.tx_resize_pending.is_some() || self.tx_resize_due || self.tx_resize_unacked
    }

    /// While a resize waits for the peer to drain the ring, tells the peer we are blocked
    /// (again), so that it reports when it has read everything: it answers a blocked writer at
    /// half a ring or when empty, and an earlier answer may have used up the last request.
    fn ask_to_drain(&mut self) {
        if self.tx_resize_pending.is_some() {
            self.write_blocked = true;
            self.write_blocked_sent = false;
        }
    }

    /// The driver did not allow the growth [`tx_grow_wanted`](Self::tx_grow_wanted) asked for
    /// (the memory budget is spent): ask again only after the ring fills again.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    ///
    /// let ring = RingSize::new(4096).unwrap();
    /// let mut e = ConnEngine::new(1, ring, ring);
    /// e.set_tx_max(RingSize::new(8192).unwrap());
    /// e.set_write_blocked();
    /// assert!(e.tx_grow_wanted().is_some());
    /// e.tx_grow_declined();
    /// assert!(e.tx_grow_wanted().is_none());
    /// ```
    pub fn tx_grow_declined(&mut self) {
        self.tx_filled = false;
    }

    /// Whether a resize the driver allowed is still waiting for the peer to drain the ring.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    ///
    /// let ring = RingSize::new(4096).unwrap();
    /// let mut e = ConnEngine::new(1, ring, ring);
    /// e.set_tx_max(RingSize::new(8192).unwrap());
    /// e.tx_commit(1).unwrap();
    /// assert!(e.tx_resize(RingSize::new(8192).unwrap()));
    /// assert!(e.tx_resize_waiting()); // one byte is still unread
    /// ```
    pub fn tx_resize_waiting(&self) -> bool {
        self.tx_resize_pending.is_some()
    }

    /// Applies the pending resize if everything written was announced and consumed.
    fn apply_tx_resize(&mut self) {
        let Some(size) = self.tx_resize_pending else { return };
        if self.done_writing {
            // Nothing more will be written: a larger ring would serve nobody.
            self.tx_resize_pending = None;
            return;
        }
        if self.tx_prod != self.peer_cons || self.tx_prod != self.tx_prod_sent || self.aborted {
            return;
        }
        self.tx_resize_pending = None;
        self.tx_ring = size;
        self.tx_filled = false;
        self.start_over(false);
    }

    /// Starts the ring we write into over at `0:0` (everything written was announced and
    /// consumed), to be announced with `RMB_RESIZE`: in a message of its own unless `quiet`
    /// (a restart then rides on the next message sent anyway). The peer's consumer cursors
    /// count again once it acknowledged.
    fn start_over(&mut self, quiet: bool) {
        self.tx_prod = Cursor::default();
        self.tx_prod_sent = Cursor::default();
        self.peer_cons = Cursor::default();
        self.tx_resize_due = true;
        self.tx_resize_unacked = true;
        self.tx_restart_quiet = quiet;
    }

    /// The token this side puts in its CDC messages.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    /// use smc_tokio::proto::pair::{EnginePair};
    ///
    /// let EnginePair { mut a, mut b, ring } = EnginePair::new(100);
    /// let ring = RingSize::new(1024).unwrap();
    /// let mut e = ConnEngine::new(42, ring, ring);
    /// assert_eq!(e.token(), 42);
    /// e.tx_commit(1).unwrap();
    /// assert_eq!(e.poll_cdc().unwrap().token, 42); // outgoing CDC messages carry it
    /// ```
    pub fn token(&self) -> u32 {
        self.token
    }

    /// Sets the token for outgoing CDC messages (a server learns it from the Confirm).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    /// use smc_tokio::proto::engine::ConnEngine;
    /// use smc_tokio::proto::pair::{EnginePair};
    ///
    /// let EnginePair { mut a, mut b, ring } = EnginePair::new(100);
    /// let ring = RingSize::new(1024).unwrap();
    /// let mut e = ConnEngine::new(0, ring, ring);
    /// e.set_token(0x0001_0005); // learnt from the client's Confirm
    /// assert_eq!(e.token(), 0x0001_0005);
    /// e.tx_commit(1).unwrap();
    /// assert_eq!(e.poll_cdc().unwrap().token, 0x0001_0005);
    /// ```
    pub fn set_token(&mut self, token: u32) {
        self.token = token;
    }

    // ----- tx -----------------------------------------------------------------------------

    /// Bytes we may write into the peer's ring now.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(70).unwrap();
    /// assert_eq!(a.tx_free(), 30);
    /// flush(&mut a, &mut b);
    /// b.rx_consume(70).unwrap();
    /// flush(&mut b, &mut a); // b's consumer cursor frees the space
    /// assert_eq!(a.tx_free(), 100);
    /// ```
    pub fn tx_free(&self) -> u32 {
        if self.tx_resize_pending.is_some() {
            // Draining the old ring for a resize: nothing more goes into it.
            return 0;
        }
        // peer_cons <= tx_prod is an invariant kept by on_cdc, so this cannot fail; 0 is the
        // safe answer if it ever did.
        self.tx_ring.free(self.peer_cons, self.tx_prod).unwrap_or(0)
    }

    /// Where the next `len` bytes go in the peer's ring (`len <= tx_free()`).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(90).unwrap();
    /// flush(&mut a, &mut b);
    /// b.rx_consume(90).unwrap();
    /// flush(&mut b, &mut a);
    /// // The next 30 bytes wrap: 10 at the end of the peer's ring, 20 at its start.
    /// assert_eq!(a.tx_spans(30), Some([(90, 10), (0, 20)]));
    /// assert_eq!(a.tx_spans(101), None); // more than is free
    /// ```
    pub fn tx_spans(&self, len: u32) -> Option<Spans> {
        if len > self.tx_free() {
            return None;
        }
        self.tx_ring.spans(self.tx_prod, len).ok()
    }

    /// Records that `len` bytes were copied at [`tx_spans`](Self::tx_spans). They become
    /// visible to the peer with the next CDC message.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert_eq!(a.tx_spans(40), Some([(0, 40), (0, 0)]));
    /// // ... the driver copies 40 bytes there, then:
    /// a.tx_commit(40).unwrap();
    /// assert_eq!(a.tx_free(), 60);
    /// assert!(a.tx_commit(61).is_err()); // more than is free
    /// flush(&mut a, &mut b);
    /// assert_eq!(b.rx_available(), 40);
    /// ```
    pub fn tx_commit(&mut self, len: u32) -> Result<(), CursorError> {
        if len > self.tx_free() {
            return Err(CursorError::StepTooLarge { step: len, size: self.tx_free() });
        }
        self.tx_prod = self.tx_prod.advance(self.tx_ring, len)?;
        self.tx_total += u64::from(len);
        if len > 0 {
            self.write_blocked = false;
            if self.tx_free() == 0 {
                self.tx_filled = true;
            }
        }
        Ok(())
    }

    /// Bytes written but not yet announced to the peer (held by a cork).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.set_corked(true);
    /// a.tx_commit(10).unwrap();
    /// assert_eq!(a.tx_unpublished(), 10); // held by the cork
    /// a.set_corked(false);
    /// flush(&mut a, &mut b);
    /// assert_eq!(a.tx_unpublished(), 0);
    /// assert_eq!(b.rx_available(), 10);
    /// ```
    pub fn tx_unpublished(&self) -> u32 {
        self.tx_ring.distance(self.tx_prod_sent, self.tx_prod).unwrap_or(0)
    }

    /// Bytes the peer has not consumed yet (announced or not).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(30).unwrap();
    /// flush(&mut a, &mut b);
    /// assert_eq!(a.tx_in_flight(), 30); // announced, not yet consumed
    /// b.rx_consume(30).unwrap();
    /// flush(&mut b, &mut a);
    /// assert_eq!(a.tx_in_flight(), 0);
    /// ```
    pub fn tx_in_flight(&self) -> u32 {
        self.tx_ring.used(self.peer_cons, self.tx_prod).unwrap_or(0)
    }

    /// Whether every byte we wrote has been announced and consumed by the peer: the connection
    /// is idle in the tx direction.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert!(a.tx_idle());
    /// a.tx_commit(50).unwrap();
    /// flush(&mut a, &mut b);
    /// assert!(!a.tx_idle()); // the peer has not read it yet
    /// b.rx_consume(50).unwrap();
    /// flush(&mut b, &mut a);
    /// assert!(a.tx_idle());
    /// ```
    pub fn tx_idle(&self) -> bool {
        self.tx_prod == self.peer_cons
    }

    /// Holds back producer-cursor updates while `true` (a cork); releasing it makes the next
    /// [`poll_cdc`](Self::poll_cdc) announce everything written meanwhile.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::Cursor;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.set_corked(true);
    /// a.tx_commit(10).unwrap();
    /// a.tx_commit(20).unwrap();
    /// assert!(a.poll_cdc().is_none()); // held back
    /// a.set_corked(false);
    /// // Both writes are announced in one message.
    /// assert_eq!(a.poll_cdc().unwrap().prod, Cursor::new(0, 30));
    /// ```
    pub fn set_corked(&mut self, corked: bool) {
        self.corked = corked;
    }

    /// Whether producer updates are held back.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert!(!a.corked());
    /// a.set_corked(true);
    /// assert!(a.corked());
    /// ```
    pub fn corked(&self) -> bool {
        self.corked
    }

    /// Records that a writer found no space: the next CDC message tells the peer
    /// (`write_blocked`), so that it answers with its consumer cursor as soon as it frees any.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(100).unwrap(); // the peer's ring is full
    /// a.set_write_blocked();
    /// let msg = a.poll_cdc().unwrap();
    /// assert!(msg.flags.contains(CdcFlags::WRITE_BLOCKED));
    /// a.on_cdc_sent(&msg);
    /// b.on_cdc(&msg).unwrap();
    /// assert!(b.peer_write_blocked()); // b answers once it frees space
    /// ```
    pub fn set_write_blocked(&mut self) {
        self.tx_filled = true;
        if !self.write_blocked {
            self.write_blocked = true;
            self.write_blocked_sent = false;
        }
    }

    /// We will write no more: the next CDC says `peer_done_writing` (a half-close).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(5).unwrap();
    /// a.shutdown_write();
    /// flush(&mut a, &mut b);
    /// assert_eq!(b.rx_available(), 5); // b reads the 5 bytes, then EOF
    /// assert!(b.rx_eof());
    /// // The other direction still flows.
    /// b.tx_commit(7).unwrap();
    /// flush(&mut b, &mut a);
    /// assert_eq!(a.rx_available(), 7);
    /// ```
    pub fn shutdown_write(&mut self) {
        self.done_writing = true;
    }

    /// Whether [`shutdown_write`](Self::shutdown_write) was called.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert!(!a.is_write_shutdown());
    /// a.shutdown_write();
    /// assert!(a.is_write_shutdown());
    /// // A close shuts writing down too.
    /// b.close();
    /// assert!(b.is_write_shutdown());
    /// ```
    pub fn is_write_shutdown(&self) -> bool {
        self.done_writing
    }

    /// The application closed the connection: the next CDC says done writing and closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.close();
    /// flush(&mut a, &mut b);
    /// assert!(b.peer_closed() && b.rx_eof());
    /// assert!(!a.finished()); // b has not closed yet
    /// b.close();
    /// flush(&mut b, &mut a);
    /// assert!(a.finished() && b.finished());
    /// ```
    pub fn close(&mut self) {
        self.done_writing = true;
        self.closed = true;
    }

    /// Aborts the connection: the next CDC says `peer_conn_abort`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(5).unwrap();
    /// a.abort();
    /// let msg = a.poll_cdc().unwrap();
    /// assert!(msg.flags.contains(CdcFlags::PEER_CONN_ABORT));
    /// a.on_cdc_sent(&msg);
    /// b.on_cdc(&msg).unwrap();
    /// assert!(b.peer_aborted());
    /// assert_eq!(b.rx_available(), 0); // the unannounced bytes are discarded
    /// ```
    pub fn abort(&mut self) {
        self.aborted = true;
        self.done_writing = true;
        self.closed = true;
    }

    // ----- rx -----------------------------------------------------------------------------

    /// Bytes the peer produced that the application has not read.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert_eq!(b.rx_available(), 0);
    /// a.tx_commit(25).unwrap();
    /// flush(&mut a, &mut b);
    /// assert_eq!(b.rx_available(), 25);
    /// b.rx_consume(10).unwrap();
    /// assert_eq!(b.rx_available(), 15);
    /// ```
    pub fn rx_available(&self) -> u32 {
        self.rx_ring.used(self.rx_cons, self.peer_prod).unwrap_or(0)
    }

    /// Where the next `len` readable bytes are in our ring (`len <= rx_available()`).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(90).unwrap();
    /// flush(&mut a, &mut b);
    /// b.rx_consume(90).unwrap();
    /// flush(&mut b, &mut a);
    /// a.tx_commit(30).unwrap();
    /// flush(&mut a, &mut b);
    /// // The 30 readable bytes wrap in b's ring.
    /// assert_eq!(b.rx_spans(30), Some([(90, 10), (0, 20)]));
    /// assert_eq!(b.rx_spans(31), None); // more than there is
    /// ```
    pub fn rx_spans(&self, len: u32) -> Option<Spans> {
        if len > self.rx_available() {
            return None;
        }
        self.rx_ring.spans(self.rx_cons, len).ok()
    }

    /// Records that the application consumed `len` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::Cursor;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(40).unwrap();
    /// flush(&mut a, &mut b);
    /// // ... the application reads 15 bytes from `b.rx_spans(15)`, then:
    /// b.rx_consume(15).unwrap();
    /// assert_eq!(b.rx_available(), 25);
    /// assert_eq!(b.rx_cons(), Cursor::new(0, 15));
    /// assert!(b.rx_consume(26).is_err()); // more than there is
    /// ```
    pub fn rx_consume(&mut self, len: u32) -> Result<(), CursorError> {
        if len > self.rx_available() {
            return Err(CursorError::StepTooLarge { step: len, size: self.rx_available() });
        }
        self.rx_cons = self.rx_cons.advance(self.rx_ring, len)?;
        self.rx_total += u64::from(len);
        Ok(())
    }

    /// How a handback ([`crate::proto::handback`]) sees this connection: the bytes the
    /// application consumed from the peer since the connection began, the bytes we wrote, of
    /// which the peer reported consumed `acknowledged`, and where the unacknowledged ones lie
    /// in the peer's ring (their spans, oldest first; our send-side copy has them at the same
    /// offsets).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// a.tx_commit(90).unwrap();
    /// flush(&mut a, &mut b);
    /// b.rx_consume(30).unwrap();
    /// flush(&mut b, &mut a); // a learns that 30 were consumed
    /// a.tx_commit(20).unwrap(); // wraps: 10 at the end of the ring, 10 at its start
    /// let t = a.handback_totals();
    /// assert_eq!((t.consumed, t.acknowledged, t.written), (0, 30, 110));
    /// assert_eq!(t.unacked, [(30, 70), (0, 10)]);
    /// assert_eq!(b.handback_totals().consumed, 30);
    /// ```
    pub fn handback_totals(&self) -> HandbackTotals {
        let in_flight = self.tx_in_flight();
        HandbackTotals {
            consumed: self.rx_total,
            acknowledged: self.tx_total - u64::from(in_flight),
            written: self.tx_total,
            unacked: self.tx_ring.spans(self.peer_cons, in_flight).unwrap_or_default(),
        }
    }

    /// Our consumer cursor: how far the application has read.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::Cursor;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(60).unwrap();
    /// flush(&mut a, &mut b);
    /// b.rx_consume(60).unwrap();
    /// assert_eq!(b.rx_cons(), Cursor::new(0, 60));
    /// // The next CDC message tells a.
    /// assert_eq!(b.poll_cdc().unwrap().cons, b.rx_cons());
    /// ```
    pub fn rx_cons(&self) -> Cursor {
        self.rx_cons
    }

    /// The peer's producer cursor: how far it has announced data.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::Cursor;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert_eq!(b.peer_prod(), Cursor::default());
    /// a.tx_commit(60).unwrap();
    /// flush(&mut a, &mut b);
    /// assert_eq!(b.peer_prod(), Cursor::new(0, 60));
    /// ```
    pub fn peer_prod(&self) -> Cursor {
        self.peer_prod
    }

    /// The peer will send no more: reads return EOF once [`rx_available`](Self::rx_available)
    /// is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(3).unwrap();
    /// a.shutdown_write();
    /// assert!(!b.rx_eof());
    /// flush(&mut a, &mut b);
    /// assert!(b.rx_eof());
    /// assert_eq!(b.rx_available(), 3); // EOF comes after these
    /// ```
    pub fn rx_eof(&self) -> bool {
        self.peer_done_writing
    }

    /// The peer aborted the connection.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert!(!b.peer_aborted());
    /// a.abort();
    /// flush(&mut a, &mut b);
    /// assert!(b.peer_aborted());
    /// assert!(b.peer_closed()); // an abort is a close too
    /// ```
    pub fn peer_aborted(&self) -> bool {
        self.peer_aborted
    }

    /// The peer closed the connection (orderly or not).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert!(!b.peer_closed());
    /// a.close();
    /// flush(&mut a, &mut b);
    /// assert!(b.peer_closed());
    /// assert!(!b.peer_aborted()); // an orderly close
    /// ```
    pub fn peer_closed(&self) -> bool {
        self.peer_closed || self.peer_aborted
    }

    /// Records that the peer closed (or, `aborted`, aborted), without validating the message
    /// that said so: for a connection that already ended and only waits for the peer's answer
    /// to free its buffers. What the application may still read is unchanged (no EOF is
    /// implied: the connection's end was decided already).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// b.close();
    /// let msg = b.poll_cdc().unwrap();
    /// b.on_cdc_sent(&msg);
    /// assert!(!b.finished()); // waits for the peer's close
    /// // The peer is known to be gone: free the connection without its answer.
    /// b.mark_peer_closed(true);
    /// assert!(b.peer_aborted() && b.finished());
    /// ```
    pub fn mark_peer_closed(&mut self, aborted: bool) {
        self.peer_closed = true;
        self.peer_aborted |= aborted;
    }

    /// Whether we have announced our close (or abort) to the peer.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.close();
    /// assert!(!a.close_sent());
    /// let msg = a.poll_cdc().unwrap();
    /// assert!(msg.flags.contains(CdcFlags::PEER_CONN_CLOSED));
    /// a.on_cdc_sent(&msg);
    /// assert!(a.close_sent());
    /// ```
    pub fn close_sent(&self) -> bool {
        self.closed_sent || self.aborted_sent
    }

    /// Whether the close we announced was an abort.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::EnginePair;
    ///
    /// let EnginePair { mut a, .. } = EnginePair::new(100);
    /// a.abort();
    /// assert!(!a.abort_sent()); // not yet sent
    /// let msg = a.poll_cdc().unwrap();
    /// a.on_cdc_sent(&msg);
    /// assert!(a.abort_sent() && a.close_sent());
    /// ```
    pub fn abort_sent(&self) -> bool {
        self.aborted_sent
    }

    /// Whether both sides have closed and our close has been sent: the connection's buffers can
    /// be reused.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.close();
    /// flush(&mut a, &mut b);
    /// b.close();
    /// assert!(!b.finished()); // b's close is not sent yet
    /// flush(&mut b, &mut a);
    /// assert!(a.finished() && b.finished()); // both rings can be reused
    /// ```
    pub fn finished(&self) -> bool {
        self.close_sent() && self.peer_closed()
    }

    /// The peer's most recent flags told us it is blocked for space.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(100).unwrap();
    /// a.set_write_blocked();
    /// flush(&mut a, &mut b);
    /// assert!(b.peer_write_blocked());
    /// b.rx_consume(100).unwrap();
    /// flush(&mut b, &mut a); // b's consumer cursor answers it
    /// assert!(!b.peer_write_blocked());
    /// assert_eq!(a.tx_free(), 100);
    /// ```
    pub fn peer_write_blocked(&self) -> bool {
        self.peer_write_blocked
    }

    // ----- CDC ----------------------------------------------------------------------------

    /// Validates and applies a CDC message from the peer. Nothing changes on error.
    ///
    /// Inline data (issue: the inline first message) is accepted when the message's producer
    /// cursor covers it: the payload is the last `inline.len()` bytes before `msg.prod`, and
    /// the returned spans say where the driver must copy it in our ring *before* reading.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::engine::{CdcEffect, EngineError};
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(10).unwrap();
    /// let msg = a.poll_cdc().unwrap();
    /// a.on_cdc_sent(&msg);
    /// let (effect, inline) = b.on_cdc(&msg).unwrap();
    /// assert_eq!(effect, CdcEffect { readable: true, writable: false }); // wake b's reader
    /// assert_eq!(inline, None);
    /// // A replay breaks the sequence: refused, and nothing changes.
    /// assert_eq!(b.on_cdc(&msg), Err(EngineError::BadSequence { expected: 2, got: 1 }));
    /// assert_eq!(b.rx_available(), 10);
    /// ```
    pub fn on_cdc(&mut self, msg: &CdcMsg) -> Result<(CdcEffect, Option<Spans>), EngineError> {
        let expected = self.seq_in.wrapping_add(1);
        if msg.seq != expected {
            return Err(EngineError::BadSequence { expected, got: msg.seq });
        }
        // A resize starts our ring over at 0:0 in its new size; the peer may make it only
        // once we consumed everything it announced, and only within the capacity it reserved.
        let (rx_ring, rx_base, rx_cons) = match msg.ring_size() {
            Some(size) => {
                if self.resize_refused {
                    return Err(EngineError::ResizeRefused { size });
                }
                let max = self.rx_max.get();
                let ring = RingSize::new(size).filter(|r| *r <= self.rx_max);
                let ring = ring.ok_or(EngineError::BadResize { size, max })?;
                if self.rx_available() > 0 {
                    return Err(EngineError::ResizeWithUnreadData);
                }
                (ring, Cursor::default(), Cursor::default())
            }
            None => (self.rx_ring, self.peer_prod, self.rx_cons),
        };
        // Producer cursor: forward from the last one, and never more than a ring ahead of
        // what we have consumed (that would overwrite unread data).
        let advance = rx_ring.distance(rx_base, msg.prod).map_err(EngineError::BadProducerCursor)?;
        rx_ring.distance(rx_cons, msg.prod).map_err(EngineError::BadProducerCursor)?;
        if advance > 0 && self.peer_done_writing {
            return Err(EngineError::DataAfterDone);
        }
        let inline = msg.inline();
        let inline_spans = if inline.is_empty() {
            None
        } else {
            // Inline bytes must be exactly the new data this message announces.
            if inline.len() > CDC_INLINE_MAX || advance as usize != inline.len() {
                return Err(EngineError::BadInline);
            }
            Some(rx_ring.spans(rx_base, advance).map_err(|_| EngineError::BadInline)?)
        };
        // Consumer cursor: forward from the last one, and never past what we produced. Until
        // the peer acknowledges our resize, its consumer cursors are from the old ring (all of
        // which it had consumed): they say nothing new and are not compared with the new one.
        let acked = msg.flags.contains(CdcFlags::RMB_RESIZE_ACK);
        if acked && !self.tx_resize_unacked {
            return Err(EngineError::UnexpectedResizeAck);
        }
        let cons_valid = !self.tx_resize_unacked || acked;
        let freed = if cons_valid {
            let freed = self.tx_ring.distance(self.peer_cons, msg.cons).map_err(EngineError::BadConsumerCursor)?;
            self.tx_ring.distance(msg.cons, self.tx_prod).map_err(EngineError::BadConsumerCursor)?;
            freed
        } else {
            0
        };

        let was_eof = self.peer_done_writing;
        let was_closed = self.peer_closed();
        self.seq_in = msg.seq;
        if msg.ring_size().is_some() {
            // A resize to the same size is a restart (`set_tx_restart`): its acknowledgement
            // waits for our next message.
            self.rx_resize_ack_quiet = rx_ring == self.rx_ring;
            self.rx_ring = rx_ring;
            self.rx_cons = Cursor::default();
            self.rx_cons_sent = Cursor::default();
            self.rx_resize_ack_due = true;
        }
        self.peer_prod = msg.prod;
        if cons_valid {
            self.peer_cons = msg.cons;
            self.tx_resize_unacked = false;
        }
        let resizing = self.tx_resize_pending.is_some();
        self.apply_tx_resize();
        let resized = resizing && self.tx_resize_pending.is_none();
        if freed > 0 {
            self.ask_to_drain();
        }
        let f = msg.flags;
        self.peer_write_blocked = f.contains(CdcFlags::WRITE_BLOCKED);
        if f.contains(CdcFlags::CONS_CURS_UPD_REQ) {
            self.peer_write_blocked = true;
            self.peer_wants_data = true;
        }
        self.peer_done_writing |= f.contains(CdcFlags::PEER_DONE_WRITING) || f.contains(CdcFlags::PEER_CONN_CLOSED);
        self.peer_closed |= f.contains(CdcFlags::PEER_CONN_CLOSED);
        let aborted_now = f.contains(CdcFlags::PEER_CONN_ABORT) && !self.peer_aborted;
        self.peer_aborted |= f.contains(CdcFlags::PEER_CONN_ABORT);
        self.maybe_restart();
        let effect = CdcEffect {
            readable: advance > 0 || self.peer_done_writing != was_eof || aborted_now,
            writable: freed > 0 || resized || aborted_now || self.peer_closed() != was_closed,
        };
        Ok((effect, inline_spans))
    }

    /// The consumer-cursor update threshold: a tenth of the ring, as the kernel's
    /// `smc_rmb_wnd_update_limit`.
    fn cons_update_limit(&self) -> u32 {
        (self.rx_ring.get() / 10).max(1)
    }

    /// Whether a consumer-cursor update is owed to the peer: a tenth of the ring was freed; or
    /// the peer is blocked for space and either half the ring is free again or we have read
    /// everything (nothing else would make us send). A blocked writer usually sleeps, so waking
    /// it for a sliver of space wastes the wake-up; waiting for half the ring amortises it.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(50).unwrap();
    /// flush(&mut a, &mut b);
    /// b.rx_consume(9).unwrap();
    /// assert!(!b.cons_update_due()); // less than a tenth of the ring freed
    /// b.rx_consume(1).unwrap();
    /// assert!(b.cons_update_due());
    /// ```
    pub fn cons_update_due(&self) -> bool {
        let freed = self.rx_ring.distance(self.rx_cons_sent, self.rx_cons).unwrap_or(0);
        if freed == 0 {
            return false;
        }
        if freed >= self.cons_update_limit() && !self.peer_write_blocked {
            return true;
        }
        self.peer_write_blocked && (freed >= self.rx_ring.get() / 2 || self.rx_available() == 0)
    }

    /// The CDC message to send now, if anything needs telling. Call
    /// [`on_cdc_sent`](Self::on_cdc_sent) once it was handed to the link; until then the engine
    /// keeps offering it (so a full CDC ring loses nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::Cursor;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// assert!(a.poll_cdc().is_none()); // nothing to tell
    /// a.tx_commit(10).unwrap();
    /// let msg = a.poll_cdc().unwrap();
    /// assert_eq!((msg.seq, msg.prod), (1, Cursor::new(0, 10)));
    /// assert_eq!(a.poll_cdc(), Some(msg)); // offered until it is handed to the link
    /// a.on_cdc_sent(&msg);
    /// assert!(a.poll_cdc().is_none());
    /// ```
    #[inline]
    pub fn poll_cdc(&self) -> Option<CdcMsg> {
        // This runs several times per message on a busy connection, mostly with nothing new:
        // that answer takes a few compares, and only a message to build takes the call.
        if self.owes_nothing() {
            return None;
        }
        self.build_cdc()
    }

    /// Whether nothing at all is owed: nothing written since the last announcement, no flag
    /// to tell, no consumer update due. (Bytes written may still be held back, by a cork or
    /// autocork: [`build_cdc`](Self::build_cdc) decides.)
    #[inline]
    fn owes_nothing(&self) -> bool {
        self.tx_prod == self.tx_prod_sent
            && !((self.done_writing && !self.done_writing_sent)
                || (self.closed && !self.closed_sent)
                || (self.aborted && !self.aborted_sent)
                || (self.write_blocked && !self.write_blocked_sent)
                || self.ask_data_due
                || self.tx_resize_due
                || self.rx_resize_ack_due)
            // A read moves the consumer cursor, most often by less than an update is due for:
            // that answer too is taken here, without a message built to be thrown away.
            && (self.rx_cons == self.rx_cons_sent || !self.cons_update_due())
    }

    /// [`poll_cdc`](Self::poll_cdc) past its first look: something may be owed.
    #[inline(never)]
    fn build_cdc(&self) -> Option<CdcMsg> {
        // Whether a cork or autocork holds what was written matters only when something was.
        let prod = if self.tx_prod == self.tx_prod_sent || self.holding() { self.tx_prod_sent } else { self.tx_prod };
        let prod_due = prod != self.tx_prod_sent;
        let held = prod != self.tx_prod;
        let flags_due = (self.done_writing && !self.done_writing_sent && !held)
            || (self.closed && !self.closed_sent && !held)
            || (self.aborted && !self.aborted_sent)
            || (self.write_blocked && !self.write_blocked_sent)
            || self.ask_data_due
            || (self.tx_resize_due && !self.tx_restart_quiet)
            || (self.rx_resize_ack_due && !self.rx_resize_ack_quiet);
        if !(prod_due || flags_due || self.cons_update_due()) {
            return None;
        }
        let mut msg = CdcMsg::new(self.seq_out.wrapping_add(1), self.token);
        msg.prod = prod;
        msg.cons = self.rx_cons;
        let mut flags = CdcFlags::empty();
        if self.write_blocked {
            flags.insert(CdcFlags::WRITE_BLOCKED);
        }
        if (prod_due && self.autocork > 0) || self.ask_data_due {
            // Autocork holds later writes until this data is consumed: ask the peer to say so.
            // Or a peek wants more than is there: ask the peer for what its autocork holds.
            flags.insert(CdcFlags::CONS_CURS_UPD_REQ);
        }
        let all_announced = !held || self.aborted;
        if self.done_writing && all_announced {
            flags.insert(CdcFlags::PEER_DONE_WRITING);
        }
        if self.closed && all_announced {
            flags.insert(CdcFlags::PEER_CONN_CLOSED);
        }
        if self.aborted {
            flags.insert(CdcFlags::PEER_CONN_ABORT);
        }
        if self.rx_resize_ack_due {
            flags.insert(CdcFlags::RMB_RESIZE_ACK);
        }
        msg.flags = flags;
        if self.tx_resize_due {
            msg.set_resize(self.tx_ring.get());
        }
        Some(msg)
    }

    /// Whether bytes written but not announced are held back now. An abort discards them. A
    /// half-close or close, a flush, or a full ring push them. Otherwise a cork holds them, and
    /// so does autocork while earlier announced bytes are still unconsumed by the peer and fewer
    /// than the autocork size are waiting (the first write on an idle connection never waits).
    fn holding(&self) -> bool {
        if self.aborted {
            return true;
        }
        if self.done_writing || self.push_once || self.tx_free() == 0 {
            return false;
        }
        if self.corked {
            return true;
        }
        if self.autocork > 0 {
            if self.peer_wants_data {
                return false;
            }
            let outstanding = self.tx_ring.distance(self.peer_cons, self.tx_prod_sent).unwrap_or(0) > 0;
            return outstanding && self.tx_unpublished() < self.autocork;
        }
        false
    }

    /// Announces everything written so far with the next CDC message, cork or not (a flush).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.set_corked(true);
    /// a.tx_commit(10).unwrap();
    /// assert!(a.poll_cdc().is_none());
    /// a.push(); // a flush: announce what is there
    /// flush(&mut a, &mut b);
    /// assert_eq!(b.rx_available(), 10);
    /// a.tx_commit(5).unwrap();
    /// assert!(a.poll_cdc().is_none()); // the cork stays for later writes
    /// ```
    pub fn push(&mut self) {
        if self.tx_prod != self.tx_prod_sent {
            self.push_once = true;
        }
    }

    /// A peek found fewer bytes than it wanted: asks the peer, with the next message, for what
    /// its autocork may hold back (it holds small writes until we consume, and a peek does
    /// not), once per arrival of bytes. Returns whether a message is now owed.
    ///
    /// # Examples
    ///
    /// ```
    /// # use smc_tokio::proto::pair::{flush, EnginePair};
    /// # let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// a.set_autocork(64);
    /// a.tx_commit(10).unwrap();
    /// flush(&mut a, &mut b);
    /// a.tx_commit(10).unwrap();
    /// assert!(a.poll_cdc().is_none()); // held: the first 10 bytes are unconsumed
    /// assert!(b.ask_for_data());
    /// assert!(!b.ask_for_data(), "once per arrival");
    /// flush(&mut b, &mut a);
    /// flush(&mut a, &mut b);
    /// assert_eq!(b.rx_available(), 20);
    /// ```
    pub fn ask_for_data(&mut self) -> bool {
        if self.asked_at == Some(self.peer_prod) {
            return false;
        }
        self.asked_at = Some(self.peer_prod);
        self.ask_data_due = true;
        true
    }

    /// Coalesces small writes while earlier data is unconsumed, up to `limit` bytes (0: off),
    /// as the kernel's `autocorking_size`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.set_autocork(50);
    /// a.tx_commit(10).unwrap();
    /// flush(&mut a, &mut b); // the first write on an idle connection goes at once
    /// a.tx_commit(10).unwrap();
    /// assert!(a.poll_cdc().is_none()); // held: b has not read the first write yet
    /// a.tx_commit(40).unwrap();
    /// assert!(a.poll_cdc().is_some()); // 50 bytes wait: sent
    /// ```
    pub fn set_autocork(&mut self, limit: u32) {
        self.autocork = limit;
    }

    /// Like [`poll_cdc`](Self::poll_cdc), carrying the newly produced bytes inline when the
    /// connection was idle and they fit: `data` must be exactly the bytes written since the
    /// last announcement (the driver keeps them). The bytes are still in the ring too, so the
    /// peer may read them from either place.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(5).unwrap(); // after copying b"hello" to `a.tx_spans(5)`
    /// let msg = a.poll_cdc_inline(b"hello").unwrap();
    /// assert_eq!(msg.inline(), b"hello");
    /// a.on_cdc_sent(&msg);
    /// // b copies the payload into its ring at the spans on_cdc returns.
    /// let (_, spans) = b.on_cdc(&msg).unwrap();
    /// assert_eq!(spans, Some([(0, 5), (0, 0)]));
    /// ```
    pub fn poll_cdc_inline(&self, data: &[u8]) -> Option<CdcMsg> {
        let mut msg = self.poll_cdc()?;
        let new = self.tx_ring.distance(self.tx_prod_sent, msg.prod).unwrap_or(0) as usize;
        // A resize message has no room for a payload: its bytes are read from the ring.
        if new > 0 && new == data.len() && new <= CDC_INLINE_MAX && msg.ring_size().is_none() {
            // set_inline cannot fail: the length was checked.
            let _ = msg.set_inline(data);
        }
        Some(msg)
    }

    /// A message that restates the current announced state (the next sequence number, the
    /// cursors already announced, no flags), for tests and diagnostics.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cdc::CdcFlags;
    /// use smc_tokio::proto::cursor::Cursor;
    /// use smc_tokio::proto::engine::CdcEffect;
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(10).unwrap();
    /// flush(&mut a, &mut b);
    /// let msg = a.state_msg(a.token());
    /// assert_eq!((msg.seq, msg.prod, msg.flags), (2, Cursor::new(0, 10), CdcFlags::empty()));
    /// // It tells b nothing new.
    /// assert_eq!(b.on_cdc(&msg).unwrap().0, CdcEffect::default());
    /// ```
    pub fn state_msg(&self, token: u32) -> CdcMsg {
        let mut msg = CdcMsg::new(self.seq_out.wrapping_add(1), token);
        msg.prod = self.tx_prod_sent;
        msg.cons = self.rx_cons_sent;
        msg
    }

    /// Records that `msg` (from [`poll_cdc`](Self::poll_cdc)) was handed to the link.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::pair::{flush, EnginePair};
    ///
    /// let EnginePair { mut a, mut b, .. } = EnginePair::new(100);
    /// // `a` and `b`: the two ends of a connection (100-byte rings); `flush(x, y)` delivers what `x` owes `y`.
    /// a.tx_commit(10).unwrap();
    /// let msg = a.poll_cdc().unwrap();
    /// assert_eq!(a.tx_unpublished(), 10);
    /// a.on_cdc_sent(&msg);
    /// assert_eq!(a.tx_unpublished(), 0);
    /// assert!(a.poll_cdc().is_none()); // nothing more to tell
    /// ```
    pub fn on_cdc_sent(&mut self, msg: &CdcMsg) {
        let freed_now = self.rx_ring.distance(self.rx_cons_sent, msg.cons).unwrap_or(0);
        self.seq_out = msg.seq;
        self.tx_prod_sent = msg.prod;
        if msg.prod == self.tx_prod {
            self.push_once = false;
            self.peer_wants_data = false;
        }
        if msg.flags.contains(CdcFlags::CONS_CURS_UPD_REQ) {
            self.ask_data_due = false;
        }
        self.rx_cons_sent = msg.cons;
        let f = msg.flags;
        if f.contains(CdcFlags::WRITE_BLOCKED) {
            self.write_blocked_sent = true;
        }
        if f.contains(CdcFlags::RMB_RESIZE) {
            self.tx_resize_due = false;
            self.tx_restart_quiet = false;
        }
        if f.contains(CdcFlags::RMB_RESIZE_ACK) {
            self.rx_resize_ack_due = false;
        }
        self.done_writing_sent |= f.contains(CdcFlags::PEER_DONE_WRITING);
        self.closed_sent |= f.contains(CdcFlags::PEER_CONN_CLOSED);
        self.aborted_sent |= f.contains(CdcFlags::PEER_CONN_ABORT);
        // The peer's request (write_blocked or cons_curs_upd_req) is answered once a message
        // carries what it asked for: everything read, or half the ring freed since the last
        // update. Any other message leaves it pending.
        if self.rx_available() == 0 || freed_now >= self.rx_ring.get() / 2 {
            self.peer_write_blocked = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::proto::pair::{flush, EnginePair};

    fn pair(ring: u32) -> (ConnEngine, ConnEngine) {
        let EnginePair { a, b, .. } = EnginePair::new(ring);
        (a, b)
    }

    #[test]
    fn flow_control_blocks_and_wakes() {
        let (mut a, mut b) = pair(100);
        a.tx_commit(100).unwrap();
        assert_eq!(a.tx_free(), 0);
        assert!(a.tx_commit(1).is_err());
        a.set_write_blocked();
        flush(&mut a, &mut b);
        assert_eq!(b.rx_available(), 100);
        assert!(b.peer_write_blocked());
        // A blocked writer is answered once half the ring is free, or when everything was read.
        b.rx_consume(1).unwrap();
        assert!(!b.cons_update_due());
        b.rx_consume(49).unwrap();
        assert!(b.cons_update_due());
        let e = flush(&mut b, &mut a);
        assert!(e[0].writable);
        assert_eq!(a.tx_free(), 50);
        a.tx_commit(50).unwrap();
        a.set_write_blocked();
        flush(&mut a, &mut b);
        b.rx_consume(100).unwrap();
        assert!(b.cons_update_due(), "all read");
        flush(&mut b, &mut a);
        a.tx_commit(99).unwrap();
        a.set_write_blocked();
        flush(&mut a, &mut b);
        b.rx_consume(99).unwrap();
        assert!(b.cons_update_due());
        flush(&mut b, &mut a);
        assert_eq!(a.tx_free(), 100);
    }

    #[test]
    fn consumer_updates_follow_the_tenth_rule() {
        let (mut a, mut b) = pair(1000);
        a.tx_commit(500).unwrap();
        flush(&mut a, &mut b);
        b.rx_consume(99).unwrap();
        assert!(!b.cons_update_due(), "below a tenth of the ring");
        b.rx_consume(1).unwrap();
        assert!(b.cons_update_due());
        flush(&mut b, &mut a);
        assert_eq!(a.tx_free(), 600);
    }

    #[test]
    fn cork_holds_producer_updates() {
        let (mut a, mut b) = pair(1000);
        a.set_corked(true);
        a.tx_commit(10).unwrap();
        a.tx_commit(20).unwrap();
        assert!(a.poll_cdc().is_none());
        assert_eq!(a.tx_unpublished(), 30);
        // A flush pushes what is there; the cork stays for later writes.
        a.push();
        flush(&mut a, &mut b);
        assert_eq!(b.rx_available(), 30);
        a.tx_commit(5).unwrap();
        assert!(a.poll_cdc().is_none());
        // Uncorking pushes at once.
        a.set_corked(false);
        flush(&mut a, &mut b);
        assert_eq!(b.rx_available(), 35);
        // A full ring pushes under a cork; so does a half-close (as TCP_CORK and shutdown).
        a.set_corked(true);
        a.tx_commit(a.tx_free()).unwrap();
        flush(&mut a, &mut b);
        assert_eq!(b.rx_available(), 1000);
        b.rx_consume(1000).unwrap();
        flush(&mut b, &mut a);
        a.tx_commit(7).unwrap();
        assert!(a.poll_cdc().is_none());
        a.shutdown_write();
        flush(&mut a, &mut b);
        assert_eq!(b.rx_available(), 7);
        assert!(b.rx_eof());
    }

    #[test]
    fn an_update_request_survives_unrelated_messages() {
        // B asks for a consumer update (autocork); A sends data of its own before it has read
        // B's bytes: the request must stay pending until A's update answers it.
        let (mut a, mut b) = pair(1000);
        b.set_autocork(100);
        b.tx_commit(10).unwrap();
        flush(&mut b, &mut a);
        assert!(a.peer_write_blocked());
        a.tx_commit(5).unwrap(); // a greeting, sent before reading
        flush(&mut a, &mut b);
        assert!(a.peer_write_blocked(), "an unrelated message does not answer the request");
        b.tx_commit(3).unwrap();
        assert!(b.poll_cdc().is_none(), "held by autocork");
        a.rx_consume(10).unwrap();
        assert!(a.cons_update_due());
        flush(&mut a, &mut b);
        assert!(!a.peer_write_blocked());
        assert!(b.poll_cdc().is_some(), "released once the peer has read everything");
    }

    #[test]
    fn autocork_coalesces_while_data_is_in_flight() {
        let (mut a, mut b) = pair(1000);
        a.set_autocork(100);
        // The first write on an idle connection goes at once, asking for a consumer update.
        a.tx_commit(10).unwrap();
        let m = a.poll_cdc().unwrap();
        assert!(m.flags.contains(CdcFlags::CONS_CURS_UPD_REQ));
        a.on_cdc_sent(&m);
        b.on_cdc(&m).unwrap();
        // While it is unconsumed, small writes wait ...
        a.tx_commit(10).unwrap();
        a.tx_commit(10).unwrap();
        assert!(a.poll_cdc().is_none());
        // ... until the peer has read everything and says so ...
        b.rx_consume(10).unwrap();
        assert!(b.cons_update_due());
        flush(&mut b, &mut a);
        let m = a.poll_cdc().unwrap();
        assert_eq!(a.tx_ring.distance(Cursor::default(), m.prod), Ok(30));
        a.on_cdc_sent(&m);
        b.on_cdc(&m).unwrap();
        // ... or until the autocork size is reached.
        a.tx_commit(99).unwrap();
        assert!(a.poll_cdc().is_none());
        a.tx_commit(1).unwrap();
        assert!(a.poll_cdc().is_some());
    }

    #[test]
    fn half_close_and_close() {
        let (mut a, mut b) = pair(64);
        a.tx_commit(5).unwrap();
        a.shutdown_write();
        let e = flush(&mut a, &mut b);
        assert!(e.iter().any(|e| e.readable));
        assert!(b.rx_eof());
        assert_eq!(b.rx_available(), 5);
        // The other direction still flows.
        b.tx_commit(7).unwrap();
        flush(&mut b, &mut a);
        assert_eq!(a.rx_available(), 7);
        a.close();
        flush(&mut a, &mut b);
        b.close();
        flush(&mut b, &mut a);
        assert!(a.finished() && b.finished());
    }

    #[test]
    fn abort_is_seen() {
        let (mut a, mut b) = pair(64);
        a.tx_commit(5).unwrap();
        a.abort();
        let e = flush(&mut a, &mut b);
        assert!(e[0].readable && e[0].writable);
        assert!(b.peer_aborted());
        // Aborting discards unannounced data.
        assert_eq!(b.rx_available(), 0);
    }

    #[test]
    fn bad_cursors_and_sequences_are_rejected_without_change() {
        let (mut a, mut b) = pair(100);
        a.tx_commit(50).unwrap();
        let good = a.poll_cdc().unwrap();

        let mut m = good;
        m.seq = 5;
        assert_eq!(b.on_cdc(&m), Err(EngineError::BadSequence { expected: 1, got: 5 }));

        let mut m = good;
        m.prod = Cursor::new(0, 100);
        assert!(matches!(b.on_cdc(&m), Err(EngineError::BadProducerCursor(_))));
        let mut m = good;
        m.prod = Cursor::new(1, 1); // 101 bytes ahead of what we consumed
        assert!(matches!(b.on_cdc(&m), Err(EngineError::BadProducerCursor(_))));
        let mut m = good;
        m.cons = Cursor::new(0, 1); // b never produced anything
        assert!(matches!(b.on_cdc(&m), Err(EngineError::BadConsumerCursor(_))));
        assert_eq!(b.rx_available(), 0, "nothing changed");

        b.on_cdc(&good).unwrap();
        // Backwards producer cursor.
        let mut m = good;
        m.seq = 2;
        m.prod = Cursor::new(0, 10);
        assert!(matches!(b.on_cdc(&m), Err(EngineError::BadProducerCursor(_))));
        // Data after done writing.
        let mut m = good;
        m.seq = 2;
        m.flags = CdcFlags::PEER_DONE_WRITING;
        b.on_cdc(&m).unwrap();
        let mut m = good;
        m.seq = 3;
        m.prod = Cursor::new(0, 60);
        assert_eq!(b.on_cdc(&m), Err(EngineError::DataAfterDone));
    }

    #[test]
    fn inline_payload_spans() {
        let (mut a, mut b) = pair(100);
        a.tx_commit(95).unwrap();
        flush(&mut a, &mut b);
        b.rx_consume(95).unwrap();
        flush(&mut b, &mut a);
        a.tx_commit(10).unwrap();
        let m = a.poll_cdc_inline(b"0123456789").unwrap();
        assert_eq!(m.inline(), b"0123456789");
        a.on_cdc_sent(&m);
        let (_, spans) = b.on_cdc(&m).unwrap();
        assert_eq!(spans, Some([(95, 5), (0, 5)]));
        // Inline that does not match the announced bytes is refused.
        a.tx_commit(3).unwrap();
        let mut m = a.poll_cdc().unwrap();
        m.set_inline(b"toolong").unwrap();
        assert_eq!(b.on_cdc(&m), Err(EngineError::BadInline));
    }

    /// Two engines where `a` may grow `b`'s ring from 4 KiB up to 16 KiB.
    fn growing_pair() -> (ConnEngine, ConnEngine) {
        let (mut a, mut b) = pair(4096);
        let max = RingSize::new(16384).unwrap();
        a.set_tx_max(max);
        b.set_rx_max(max);
        (a, b)
    }

    #[test]
    fn a_full_ring_grows_after_it_drains_and_nothing_is_lost() {
        let (mut a, mut b) = growing_pair();
        a.tx_commit(4096).unwrap();
        assert_eq!(a.tx_grow_wanted().map(RingSize::get), Some(8192));
        flush(&mut a, &mut b);
        assert!(a.tx_resize(RingSize::new(8192).unwrap()));
        assert_eq!(a.tx_grow_wanted(), None, "one resize at a time");
        assert!(a.tx_resize_waiting());
        assert_eq!(a.tx_free(), 0);
        // b reads half: not empty yet, so the resize waits.
        b.rx_consume(2048).unwrap();
        flush(&mut b, &mut a);
        assert!(a.tx_resize_waiting());
        a.set_write_blocked();
        flush(&mut a, &mut b);
        b.rx_consume(2048).unwrap();
        let e = flush(&mut b, &mut a);
        assert!(e.iter().any(|e| e.writable), "the applied resize wakes the writer");
        assert!(!a.tx_resize_waiting());
        assert_eq!((a.tx_ring().get(), a.tx_free()), (8192, 8192));
        a.tx_commit(8000).unwrap();
        let m = a.poll_cdc().unwrap();
        assert_eq!((m.ring_size(), m.prod), (Some(8192), Cursor::new(0, 8000)));
        a.on_cdc_sent(&m);
        b.on_cdc(&m).unwrap();
        assert_eq!((b.rx_ring().get(), b.rx_available(), b.rx_spans(8000)), (8192, 8000, Some([(0, 8000), (0, 0)])));
        // b owes an acknowledgement, even with nothing else to say.
        let ack = b.poll_cdc().unwrap();
        assert!(ack.flags.contains(CdcFlags::RMB_RESIZE_ACK));
        b.on_cdc_sent(&ack);
        a.on_cdc(&ack).unwrap();
        assert!(b.poll_cdc().is_none());
        b.rx_consume(8000).unwrap();
        flush(&mut b, &mut a);
        assert_eq!(a.tx_free(), 8192);
        // Growth stops at the capacity.
        a.tx_commit(8192).unwrap();
        assert_eq!(a.tx_grow_wanted().map(RingSize::get), Some(16384));
        assert!(!a.tx_resize(RingSize::new(32768).unwrap()), "beyond the peer's capacity");
    }

    #[test]
    fn consumer_cursors_from_the_old_ring_are_ignored_until_the_ack() {
        let (mut a, mut b) = growing_pair();
        a.tx_commit(4096).unwrap();
        flush(&mut a, &mut b);
        b.rx_consume(4096).unwrap();
        flush(&mut b, &mut a);
        assert!(a.tx_resize(RingSize::new(16384).unwrap()));
        assert!(!a.tx_resize_waiting(), "an empty ring resizes at once");
        // b sends something before it sees the resize: its cursor is in the old ring.
        b.tx_commit(10).unwrap();
        let before = b.poll_cdc().unwrap();
        assert_eq!(before.cons, Cursor::new(1, 0));
        b.on_cdc_sent(&before);
        a.tx_commit(100).unwrap();
        a.on_cdc(&before).unwrap();
        assert_eq!(a.tx_free(), 16384 - 100, "the stale cursor frees nothing");
        flush(&mut a, &mut b);
        b.rx_consume(100).unwrap();
        let ack = b.poll_cdc().unwrap();
        assert!(ack.flags.contains(CdcFlags::RMB_RESIZE_ACK));
        b.on_cdc_sent(&ack);
        a.on_cdc(&ack).unwrap();
        assert_eq!(a.tx_free(), 16384);
        // A second ack is a protocol error, and changes nothing.
        let mut again = b.state_msg(2);
        again.flags = CdcFlags::RMB_RESIZE_ACK;
        assert_eq!(a.on_cdc(&again), Err(EngineError::UnexpectedResizeAck));
    }

    #[test]
    fn bad_resizes_are_refused_without_change() {
        let (mut a, mut b) = growing_pair();
        a.tx_commit(10).unwrap();
        flush(&mut a, &mut b);
        // While 10 bytes are unread.
        let mut m = a.state_msg(1);
        m.set_resize(8192);
        assert_eq!(b.on_cdc(&m), Err(EngineError::ResizeWithUnreadData));
        b.rx_consume(10).unwrap();
        // Beyond the capacity, or no ring at all.
        m.set_resize(32768);
        assert_eq!(b.on_cdc(&m), Err(EngineError::BadResize { size: 32768, max: 16384 }));
        m.set_resize(0);
        assert_eq!(b.on_cdc(&m), Err(EngineError::BadResize { size: 0, max: 16384 }));
        // A producer cursor beyond the new ring.
        m.set_resize(8192);
        m.prod = Cursor::new(0, 9000);
        assert!(matches!(b.on_cdc(&m), Err(EngineError::BadProducerCursor(_))));
        assert_eq!((b.rx_ring().get(), b.rx_cons(), b.peer_prod()), (4096, Cursor::new(0, 10), Cursor::new(0, 10)));
        // Without a capacity (the verbs link), growth is refused.
        let (_, mut fixed) = pair(4096);
        let mut m = CdcMsg::new(1, 1);
        m.set_resize(8192);
        assert_eq!(fixed.on_cdc(&m), Err(EngineError::BadResize { size: 8192, max: 4096 }));
    }

    /// A corked writer pushing far more than the ring through it, growing as it goes, with
    /// the driver's loop: grow if wanted, write what fits or report blocked, send.
    #[test]
    fn a_corked_writer_grows_the_ring_and_delivers_everything() {
        let (mut a, mut b) = growing_pair();
        a.set_corked(true);
        let (mut left, mut got) = (64u32 << 10, 0u32);
        for _ in 0..10_000 {
            if left == 0 && got == 64 << 10 {
                break;
            }
            if let Some(next) = a.tx_grow_wanted() {
                assert!(a.tx_resize(next));
            }
            let free = a.tx_free();
            if left > 0 {
                if free > 0 {
                    let k = free.min(left);
                    a.tx_commit(k).unwrap();
                    left -= k;
                } else {
                    a.set_write_blocked();
                }
            } else {
                // The tail does not fill the grown ring: the cork holds it until released.
                a.set_corked(false);
            }
            flush(&mut a, &mut b);
            let k = b.rx_available();
            b.rx_consume(k).unwrap();
            got += k;
            flush(&mut b, &mut a);
        }
        assert_eq!((left, got), (0, 64 << 10));
        assert_eq!(a.tx_ring().get(), 16384);
    }

    #[test]
    fn a_closing_writer_does_not_resize() {
        let (mut a, mut b) = growing_pair();
        a.tx_commit(4096).unwrap();
        flush(&mut a, &mut b);
        assert!(a.tx_resize(RingSize::new(8192).unwrap()));
        a.shutdown_write();
        b.rx_consume(4096).unwrap();
        flush(&mut b, &mut a);
        assert!(!a.tx_resize_waiting());
        assert_eq!(a.tx_ring().get(), 4096);
        let m = a.poll_cdc().unwrap();
        assert_eq!(m.ring_size(), None);
        assert!(m.flags.contains(CdcFlags::PEER_DONE_WRITING));
    }

    /// One direction's bytes: a model of the reader's ring (as the writer fills it) and the
    /// counts of bytes written into it and read out.
    struct Lane {
        ring: Vec<u8>,
        written: u64,
        read: u64,
    }

    impl Lane {
        fn new(len: usize) -> Lane {
            Lane { ring: vec![0; len], written: 0, read: 0 }
        }

        /// `w` writes the next `k` bytes of the stream where its engine says, and commits them.
        fn write(&mut self, w: &mut ConnEngine, k: u32) -> Spans {
            let spans = w.tx_spans(k).expect("room for the bytes");
            for (off, len) in spans {
                for i in off..off + len {
                    self.ring[i as usize] = (self.written % 251) as u8;
                    self.written += 1;
                }
            }
            w.tx_commit(k).unwrap();
            spans
        }

        /// `r` reads `k` bytes where its engine says and consumes them; the first byte that is
        /// not the stream's next is an error.
        fn read(&mut self, r: &mut ConnEngine, k: u32) -> Result<(), String> {
            for (off, len) in r.rx_spans(k).expect("bytes to read") {
                for i in off..off + len {
                    if self.ring[i as usize] != (self.read % 251) as u8 {
                        return Err(format!("byte {} of the stream", self.read));
                    }
                    self.read += 1;
                }
            }
            r.rx_consume(k).unwrap();
            Ok(())
        }
    }

    /// Request/response traffic of `rounds` messages of `size` bytes each way, with real bytes
    /// (a numbered stream per direction, checked where the reader's engine says they lie);
    /// returns the CDC messages sent and the furthest offset either side wrote at.
    fn request_response(a: &mut ConnEngine, b: &mut ConnEngine, rounds: u32, size: u32) -> (usize, u32) {
        fn one(w: &mut ConnEngine, r: &mut ConnEngine, lane: &mut Lane, size: u32) -> (usize, u32) {
            let spans = lane.write(w, size);
            let reach = spans.iter().map(|(off, len)| off + len).max().unwrap_or(0);
            // The reader's driver flushes after every message it takes in, as `SmcConn` does.
            let msgs = flush(w, r).len() + flush(r, w).len();
            assert_eq!(r.rx_available(), size);
            lane.read(r, size).unwrap();
            (msgs, reach)
        }
        let (mut ab, mut ba) = (Lane::new(a.tx_ring().get() as usize), Lane::new(b.tx_ring().get() as usize));
        let (mut msgs, mut furthest) = (0, 0);
        for _ in 0..rounds {
            let (m1, r1) = one(a, b, &mut ab, size);
            let (m2, r2) = one(b, a, &mut ba, size);
            msgs += m1 + m2;
            furthest = furthest.max(r1).max(r2);
        }
        // The last consumer updates and acknowledgements.
        msgs += flush(a, b).len() + flush(b, a).len();
        (msgs, furthest)
    }

    #[test]
    fn a_restarting_ring_keeps_request_response_at_its_start_and_sends_no_more_messages() {
        let (mut a, mut b) = pair(64 << 10);
        let (plain, reach) = request_response(&mut a, &mut b, 1000, 1000);
        assert!(reach > 60 << 10, "without restarts the whole ring is walked ({reach})");
        let (mut a, mut b) = pair(64 << 10);
        a.set_tx_restart(Some(4096));
        b.set_tx_restart(Some(4096));
        let (restarting, reach) = request_response(&mut a, &mut b, 1000, 1000);
        assert!(reach <= 4096 + 1000, "a restarting ring went {reach} bytes in");
        assert_eq!(restarting, plain, "restarts forced CDC messages of their own");
        assert_eq!((a.tx_total, b.rx_total, b.tx_total, a.rx_total), (1_000_000, 1_000_000, 1_000_000, 1_000_000));
    }

    /// `b` answers with one byte, which carries its consumer cursor to `a`.
    fn answer(a: &mut ConnEngine, b: &mut ConnEngine) {
        b.tx_commit(1).unwrap();
        flush(b, a);
        a.rx_consume(1).unwrap();
    }

    /// A pair of 8 KiB rings where `a` restarts 1 KiB in, after `a` wrote and announced `n`
    /// bytes.
    fn restarting_after(n: u32) -> (ConnEngine, ConnEngine) {
        let (mut a, mut b) = pair(8192);
        a.set_tx_restart(Some(1024));
        a.tx_commit(n).unwrap();
        flush(&mut a, &mut b);
        (a, b)
    }

    #[test]
    fn a_ring_restarts_only_once_everything_written_was_announced_and_consumed() {
        // Everything consumed, 2000 bytes in: the next bytes go at the start.
        let (mut a, mut b) = restarting_after(2000);
        b.rx_consume(2000).unwrap();
        answer(&mut a, &mut b);
        assert_eq!(a.tx_spans(1).unwrap()[0].0, 0);
        // Not yet 1024 bytes in: no restart.
        let (mut a, mut b) = restarting_after(1000);
        b.rx_consume(1000).unwrap();
        answer(&mut a, &mut b);
        assert_eq!(a.tx_spans(1).unwrap()[0].0, 1000);
        // Consumed only in part: no restart.
        let (mut a, mut b) = restarting_after(2000);
        b.rx_consume(1999).unwrap();
        answer(&mut a, &mut b);
        assert_eq!(a.tx_spans(1).unwrap()[0].0, 2000);
        // Written but held by a cork: no restart either.
        let (mut a, mut b) = restarting_after(2000);
        a.set_corked(true);
        a.tx_commit(10).unwrap();
        b.rx_consume(2000).unwrap();
        answer(&mut a, &mut b);
        assert_eq!(a.tx_spans(1).unwrap()[0].0, 2010);
        // The peer closed: no restart (nothing more would be read from the ring).
        let (mut a, mut b) = restarting_after(2000);
        b.rx_consume(2000).unwrap();
        b.close();
        flush(&mut b, &mut a);
        assert_eq!(a.tx_spans(1).unwrap()[0].0, 2000);
        // A writer that filled a ring that may grow grows it first.
        let (mut a, mut b) = growing_pair();
        a.set_tx_restart(Some(1024));
        a.tx_commit(4096).unwrap();
        flush(&mut a, &mut b);
        b.rx_consume(4096).unwrap();
        answer(&mut a, &mut b);
        assert_eq!(a.tx_grow_wanted().map(RingSize::get), Some(8192));
        // A reader that gets a restart while bytes are unread refuses it.
        let (_, mut b) = pair(8192);
        let mut msg = CdcMsg::new(1, 1);
        msg.prod = Cursor::new(0, 100);
        b.on_cdc(&msg).unwrap();
        let mut restart = CdcMsg::new(2, 1);
        restart.set_resize(8192);
        assert_eq!(b.on_cdc(&restart), Err(EngineError::ResizeWithUnreadData));
    }

    proptest! {
        /// Random writes, reads, resizes and CDC exchanges, with real bytes: `a` writes a
        /// numbered byte stream into a model of `b`'s ring slot (16 KiB) at the spans its
        /// engine names; `b` reads at its spans and must see the stream in order. In half the
        /// runs `a`'s ring also starts over whenever it can (at a random depth that changes as
        /// it runs), so restarts and resizes mix. (Both directions at once: the
        /// request/response test above.)
        #[test]
        fn random_resizes_and_restarts_keep_the_byte_stream(
            restart in proptest::option::of(0u32..8192),
            ops in proptest::collection::vec((0u8..8, 0u32..20000), 1..400),
        ) {
            let (mut a, mut b) = growing_pair();
            a.set_tx_restart(restart);
            let mut lane = Lane::new(16384);
            for (op, n) in ops {
                match op {
                    0 => {
                        let k = n.min(a.tx_free());
                        lane.write(&mut a, k);
                    }
                    1 => {
                        let k = n.min(b.rx_available());
                        prop_assert_eq!(lane.read(&mut b, k), Ok(()));
                    }
                    2 => { flush(&mut a, &mut b); }
                    3 => { flush(&mut b, &mut a); }
                    4 => { if let Some(next) = a.tx_grow_wanted() { a.tx_resize(next); } }
                    5 => { if let Some(size) = RingSize::new(n % 16384 + 1) { a.tx_resize(size); } }
                    6 => { if restart.is_some() { a.set_tx_restart(Some(n % 8192)); } }
                    _ => { if a.tx_free() == 0 { a.set_write_blocked(); } }
                }
                prop_assert!(u64::from(b.rx_available()) <= lane.written - lane.read);
                prop_assert!(a.tx_in_flight() <= a.tx_ring().get());
                prop_assert!(b.rx_ring().get() <= 16384);
            }
            flush(&mut a, &mut b);
            prop_assert_eq!(u64::from(b.rx_available()), lane.written - lane.read);
            // Liveness: with a reader that keeps reading, a waiting resize completes and the
            // writer gets room again, with no other prompt than the CDC exchange itself.
            for _ in 0..8 {
                let k = b.rx_available();
                b.rx_consume(k).unwrap();
                flush(&mut b, &mut a);
                flush(&mut a, &mut b);
            }
            prop_assert!(!a.tx_resize_waiting());
            prop_assert!(a.tx_free() > 0);
            // A writer that fills the ring and says it is blocked gets all of it back once the
            // reader reads, a restart acknowledged or not.
            let k = a.tx_free();
            a.tx_commit(k).unwrap();
            a.set_write_blocked();
            for _ in 0..4 {
                flush(&mut a, &mut b);
                let k = b.rx_available();
                b.rx_consume(k).unwrap();
                flush(&mut b, &mut a);
            }
            prop_assert_eq!(a.tx_free(), a.tx_ring().get());
        }

        /// Random writes, reads and CDC exchanges between two engines: no byte is lost or
        /// duplicated, the writer never overruns the reader, and both sides agree at the end.
        #[test]
        fn random_exchanges_conserve_bytes(ring in 1u32..5000, ops in proptest::collection::vec((0u8..5, 0u32..6000), 1..300)) {
            let (mut a, mut b) = pair(ring);
            let (mut written, mut read) = (0u64, 0u64);
            for (op, n) in ops {
                match op {
                    0 => { let k = n.min(a.tx_free()); a.tx_commit(k).unwrap(); written += u64::from(k); }
                    1 => { let k = n.min(b.rx_available()); b.rx_consume(k).unwrap(); read += u64::from(k); }
                    2 => { flush(&mut a, &mut b); }
                    3 => { flush(&mut b, &mut a); }
                    _ => { a.set_corked(n % 2 == 0); }
                }
                prop_assert!(u64::from(b.rx_available()) <= written - read);
                prop_assert!(a.tx_in_flight() <= ring);
            }
            a.set_corked(false);
            flush(&mut a, &mut b);
            let rest = b.rx_available();
            b.rx_consume(rest).unwrap();
            prop_assert_eq!(read + u64::from(rest), written);
            // Return every consumer cursor so the writer sees an empty ring.
            while b.rx_ring.distance(b.rx_cons_sent, b.rx_cons).unwrap() > 0 {
                let mut m = b.poll_cdc().unwrap_or_else(|| {
                    let mut m = CdcMsg::new(b.seq_out.wrapping_add(1), 2);
                    m.prod = b.tx_prod_sent;
                    m
                });
                m.cons = b.rx_cons;
                b.on_cdc_sent(&m);
                a.on_cdc(&m).unwrap();
            }
            prop_assert!(a.tx_idle());
        }
    }
}
