//! The RDMA link (SMC-R): one reliable-connected queue pair per link group.
//!
//! - **RMBs** (our receive rings) come from a pool mapped once per link group; each slot is
//!   registered with remote-write access the first time a connection uses it, and its address
//!   and rkey travel in the CLC Accept/Confirm. The peer writes into it; we only read.
//! - **Send buffers**: each connection has a local buffer the size of the peer's RMB (a slot of
//!   the send pool, registered for local access). `tx_write`/`tx_fill` put bytes there at the
//!   ring offset; when the engine sends a CDC message that moves the producer cursor, the link
//!   posts RDMA WRITEs of exactly the new span(s) to the same offsets of the peer's RMB and then
//!   the CDC message as an inline SEND, in one chain. RC delivers them in order, so the peer
//!   never sees a cursor before the bytes it covers. A send-buffer byte is written again only
//!   after the peer's consumer cursor passed it, which an honest peer reports only after it
//!   received our later SEND, and so after our WRITE was executed: the HCA does not read a
//!   buffer we are rewriting. A peer that reports consumption of bytes it has not received (it
//!   can guess our producer cursor) can make the adapter read a span while we rewrite it; that
//!   garbles only the bytes sent to that peer, and is a device's read beside our writes, not
//!   an access of our program that races with them. When the CDC message carries the new bytes
//!   inline, the WRITE is skipped.
//! - **CDC receive**: `RQ_DEPTH` 64-byte receive buffers, pre-posted and re-posted as each
//!   completes.
//! - **Send-queue bound**: at most `SQ_DEPTH` work requests outstanding (the kernel's
//!   `smcr_max_send_wr` idea); a CDC message that does not fit waits (`cdc_send` returns
//!   `Ok(false)`) and is retried when completions free room. Only the SEND of each chain is
//!   signaled; its completion frees the whole chain.
//! - **Completion channel**: a non-blocking fd, waited on by the link group's driver through
//!   tokio's `AsyncFd`. `poll_event` polls the CQ, arms it, polls again, and only then
//!   waits; on wake-up it drains every channel event until EAGAIN (tokio readiness is
//!   edge-triggered) and acks them in batches. Completions taken by other callers (busy-poll,
//!   `cdc_recv`) are kept in the link's queue, so none is lost between batches.
//! - **Link confirmation**: the client's QP reaches RTS before the server's reaches RTR (the
//!   server learns the client's QP number from the Confirm). So the client sends nothing until
//!   the server's first message, a `LINK_UP` frame the server posts as soon as its QP is ready
//!   (the role of the kernel's LLC CONFIRM LINK).
//! - **Errors**: a failed work completion or a failed post ends the link (and its group) with a
//!   typed [`LinkError`]; the next connection builds a new group.

pub(crate) mod device;
pub(crate) mod ffi;

/// Test hook: links created while it is set send CDC frames from registered buffers, as on a
/// device that grants no inline data (the soft-RoCE device grants it, so the path is otherwise
/// not reachable in the test bed). Relaxed: a switch read when a link is made, through which
/// nothing else is published.
static NO_INLINE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes links created from now on send without inline data (`true`), or as the device allows.
#[cfg(feature = "test-util")]
pub(crate) fn force_no_inline(on: bool) {
    NO_INLINE.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn no_inline_forced() -> bool {
    NO_INLINE.load(std::sync::atomic::Ordering::Relaxed)
}

use std::collections::{HashMap, VecDeque};
use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use self::device::{CompChannel, Cq, Mapping, Mr, Pd, Port, Qp, Remote};
use super::{token_slot, Link, LinkError};
use crate::config::{HeldCharge, RmbBudget};
use crate::proto::cdc::{CdcMsg, CDC_MSG_LEN};
use crate::proto::cursor::{Cursor, RingSize};

/// Send work requests outstanding per QP. The kernel's `SMC_WR_BUF_CNT` is 16 send buffers;
/// a CDC chain here is up to three WRs (two WRITE spans and the SEND), so 64 lets about 21
/// messages be in flight before a sender waits.
pub(crate) const SQ_DEPTH: u32 = 64;
/// Receive work requests pre-posted per QP: the kernel posts 3 x `SMC_WR_BUF_CNT` receives;
/// we post two per send slot, so a peer at its send bound never meets an empty queue while we
/// re-post.
pub(crate) const RQ_DEPTH: u32 = 128;
/// Most work requests one CDC message takes: two WRITE spans (a wrap) and the SEND.
const WRS_PER_MSG: u32 = 3;
/// Frame type of the server's link-confirmation message (never a CDC type, 0xFE).
const LINK_UP_TYPE: u8 = 0xFD;
/// Completions taken per `ibv_poll_cq` call.
const POLL_BATCH: usize = 16;
/// Completions one look at the CQ takes at most: as many frames as it may hold
/// (`4 * RQ_DEPTH`). Frames the peer sends that are not queued for the group (its `LINK_UP`s)
/// are consumed as they are taken, so without a bound of its own a peer sending them as fast
/// as we re-post receives kept one look, and the thread it runs on, going for as long as it
/// liked.
const REAP_MAX: usize = 4 * RQ_DEPTH as usize;

/// Bytes of slots registered together, as one MR, the first time any of them is used: 8
/// slots of the default 256 KiB. With one registration per slot, a burst of 100 new
/// connections queues 200 `ibv_reg_mr` calls on the setup thread of each end (26 in chunks);
/// in the two-host soft-RoCE test bed on a host loaded with two busy loops, 6 of such a burst
/// waited past the 2 s handshake step bound and fell back to TCP, and none did in chunks (one
/// run each). A lone connection pins 2 MiB of a pool instead of 256 KiB.
pub(crate) const REG_CHUNK_BYTES: u32 = 2 << 20;

/// Slots of `size` bytes registered together in a pool of `count`: [`REG_CHUNK_BYTES`] of them,
/// at least one, at most the pool.
fn chunk_slots(count: u32, size: u32) -> u32 {
    (REG_CHUNK_BYTES / size.max(1)).clamp(1, count.max(1))
}

/// Bytes one chunk of a pool of `count` slots of `size` bytes registers (pins): the first
/// connection on it charges the RMB budget that much.
fn chunk_bytes(count: u32, size: u32) -> u64 {
    u64::from(chunk_slots(count, size)) * u64::from(size)
}

/// Bytes a connection on unused chunks of a link's two pools pins, `count` slots each, receive
/// rings of `rx_size` and send buffers of `tx_size` bytes: one chunk of each.
pub(crate) fn chunk_pair_bytes(count: u32, rx_size: u32, tx_size: u32) -> u64 {
    chunk_bytes(count, rx_size) + chunk_bytes(count, tx_size)
}

/// What a link shows of itself without the link: whether its peer answered (a SEND of ours
/// completed, which on a reliable connection the peer's adapter acknowledged) and the bytes its
/// pools have registered (pinned). Shared, so that what keeps count of the link's peer holds
/// this and not the link, whose last reference must be dropped on the setup thread.
#[derive(Debug, Default)]
pub(crate) struct LinkTally {
    /// Set once, at the first send completion (Release; read with Acquire).
    answered: AtomicBool,
    /// Both pools' registered chunks, in bytes (changed under a pool's `mrs` lock; read without
    /// it, as a figure for a bound, so Relaxed).
    pinned: AtomicU64,
}

impl LinkTally {
    /// Whether the peer's queue pair took a message of ours.
    pub(crate) fn peer_answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }

    /// Bytes the link's pools have registered now.
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.pinned.load(Ordering::Relaxed)
    }
}

/// A slot pool: `count` buffers of `size` bytes in one lazily backed mapping, registered a
/// chunk of slots at a time on first use. A chunk's rkey reaches every slot of the chunk: they
/// all belong to this link group, whose peer is the one process that may write into any of
/// them (the group's protection domain keeps it out of every other group's).
///
/// A registered chunk is pinned memory, charged to the context's RMB budget for as long as it
/// is registered, whichever slots of it are in use: a chunk the budget has no room for is not
/// registered, and the connection that asked for it stays TCP.
struct Pool {
    // Field order matters: the MRs are dropped before the mapping they cover. The mapping is
    // shared with the MRs `release` hands out, which keep it until they are dropped. Each MR
    // is dropped before its charge (tuple order): the budget gets the bytes back once they
    // are unpinned.
    mrs: Mutex<Vec<Option<(Mr, HeldCharge)>>>,
    map: Arc<Mapping>,
    budget: Arc<RmbBudget>,
    /// `release` gave the registrations back: no chunk is registered again.
    released: AtomicBool,
    /// The link's tally, which counts the chunks of both pools registered (changed under `mrs`'s
    /// lock).
    tally: Arc<LinkTally>,
    size: u32,
    count: u32,
    /// Slots per MR.
    chunk: u32,
    access: std::ffi::c_int,
}

impl Pool {
    fn new(
        count: u32,
        size: u32,
        access: std::ffi::c_int,
        budget: Arc<RmbBudget>,
        tally: Arc<LinkTally>,
    ) -> io::Result<Pool> {
        let len =
            usize::try_from(u64::from(count) * u64::from(size)).map_err(|_| io::Error::other("pool too large"))?;
        let chunk = chunk_slots(count, size);
        let chunks = count.div_ceil(chunk);
        Ok(Pool {
            mrs: Mutex::new((0..chunks).map(|_| None).collect()),
            map: Arc::new(Mapping::new(len)?),
            budget,
            released: AtomicBool::new(false),
            tally,
            size,
            count,
            chunk,
            access,
        })
    }

    /// The slot's (address, lkey, rkey), registering its chunk now if needed.
    fn slot(&self, pd: &Arc<Pd>, slot: u32) -> io::Result<(u64, u32, u32)> {
        self.slot_registering(pd, slot).map(|(s, _)| s)
    }

    /// [`slot`](Self::slot), and whether its chunk was registered by this call.
    fn slot_registering(&self, pd: &Arc<Pd>, slot: u32) -> io::Result<((u64, u32, u32), bool)> {
        if slot >= self.count {
            return Err(io::Error::other("rmb slot out of range"));
        }
        let c = slot / self.chunk;
        let first = c * self.chunk;
        let slots = self.chunk.min(self.count - first);
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        // Set under this lock (`release`).
        if self.released.load(Ordering::Relaxed) {
            return Err(io::Error::other("the link's memory was given back: it is torn down"));
        }
        let e = &mut mrs[c as usize];
        let new = e.is_none();
        if new {
            let len = slots as usize * self.size as usize;
            let charge = self.budget.charge_held(len as u64).ok_or_else(|| {
                io::Error::new(io::ErrorKind::OutOfMemory, "the rmb memory budget has no room for another chunk")
            })?;
            // SAFETY: the chunk (slots `first..first + slots`) lies inside `map`, which
            // outlives the MR (field order above; `release` hands the MR out with a copy of
            // the mapping that is dropped after it).
            *e = Some((unsafe { pd.reg_mr(self.ptr(first, 0), len, self.access) }?, charge));
            self.tally.pinned.fetch_add(len as u64, Ordering::Relaxed);
        }
        let (mr, _) = e.as_ref().ok_or_else(|| io::Error::other("mr"))?;
        Ok(((self.ptr(slot, 0) as u64, mr.lkey, mr.rkey), new))
    }

    /// Deregisters the chunk of `slot` (unpinned and uncharged as it is dropped, here: called
    /// on the setup thread), for a chunk registered for a connection that was then refused
    /// before any of its slots was used.
    fn unregister_chunk(&self, slot: u32) {
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        let taken = mrs.get_mut((slot / self.chunk) as usize).and_then(Option::take);
        if let Some((_, charge)) = &taken {
            self.tally.pinned.fetch_sub(charge.bytes(), Ordering::Relaxed);
        }
        drop(mrs);
        drop(taken);
    }

    /// Bytes the chunk of `slot` would register were it used now: 0 once it is registered.
    fn unregistered_bytes(&self, slot: u32) -> u64 {
        if slot >= self.count {
            return 0;
        }
        let c = slot / self.chunk;
        let slots = self.chunk.min(self.count - c * self.chunk);
        let mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        match mrs.get(c as usize) {
            Some(None) => u64::from(slots) * u64::from(self.size),
            _ => 0,
        }
    }

    /// Gives the pool's registrations back for good: what to drop (off the runtime) to unpin
    /// its chunks, with the mapping they cover, which they keep until then. The mapping, and
    /// the bytes in it, stay the pool's too: a connection moving to TCP reads its ring.
    fn release(&self) -> (Vec<(Mr, HeldCharge)>, Arc<Mapping>) {
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        self.released.store(true, Ordering::Relaxed);
        let taken: Vec<(Mr, HeldCharge)> = mrs.iter_mut().filter_map(Option::take).collect();
        self.tally.pinned.fetch_sub(taken.iter().map(|(_, c)| c.bytes()).sum(), Ordering::Relaxed);
        // Tuple order: the MRs drop before this copy of the mapping.
        (taken, self.map.clone())
    }

    fn ptr(&self, slot: u32, offset: u32) -> *mut u8 {
        // In bounds: callers checked slot < count and offset <= size, and the mapping is
        // count * size bytes.
        self.map.ptr().wrapping_add(slot as usize * self.size as usize + offset as usize)
    }

    /// Checks a span of a slot.
    fn span(&self, slot: u32, offset: u32, len: u32) -> Option<*mut u8> {
        (slot < self.count && offset.checked_add(len)? <= self.size).then(|| self.ptr(slot, offset))
    }
}

/// A link's RMBs: `count` of `rx_size` bytes to receive into (ours, which the peer writes),
/// and as many send buffers of `tx_size` bytes (the size of the peer's RMBs), both registered
/// a chunk at a time and charged to `budget` while registered.
pub(crate) struct Rmbs {
    pub(crate) count: u32,
    pub(crate) rx_size: u32,
    pub(crate) tx_size: u32,
    pub(crate) budget: Arc<RmbBudget>,
}

/// What a successful work completion is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completed {
    /// One of our signaled SENDs (with the WRITEs before it).
    Send,
    /// One of the peer's SENDs, into a posted receive buffer.
    Recv,
    /// Another receive-side completion: a WRITE with immediate data (`IBV_WC_RECV_RDMA_WITH_IMM`)
    /// consumes a posted receive without filling its buffer, which still holds an earlier
    /// message. Our peers never send one: the peer breaks the protocol.
    Foreign,
}

/// Classifies a successful completion by its opcode (receive-side opcodes have the
/// `IBV_WC_RECV` bit, `ibv_wc_opcode` in verbs.h).
fn completed(opcode: std::ffi::c_uint) -> Completed {
    match opcode {
        ffi::IBV_WC_RECV => Completed::Recv,
        o if o & ffi::IBV_WC_RECV != 0 => Completed::Foreign,
        _ => Completed::Send,
    }
}

/// A connection's send side: where its bytes go in the peer's RMB.
#[derive(Debug, Clone, Copy)]
struct ConnTx {
    our_slot: u32,
    /// The send buffer's local key.
    lkey: u32,
    remote_addr: u64,
    rkey: u32,
    ring: RingSize,
    /// The producer cursor of the last CDC message posted: bytes before it were written.
    sent_prod: Cursor,
}

/// One RDMA WRITE: `len` bytes at `off` of send-pool slot `slot` to the same offset of the
/// peer's RMB at `raddr`.
#[derive(Debug, Clone, Copy, Default)]
struct WriteSpan {
    slot: u32,
    lkey: u32,
    off: u32,
    len: u32,
    raddr: u64,
    rkey: u32,
}

/// The peer's RMB for one connection, from its Accept or Confirm.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerRmb {
    pub(crate) token: u32,
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
    pub(crate) size: u32,
}

#[derive(Default)]
struct CqState {
    frames: VecDeque<[u8; CDC_MSG_LEN]>,
    error: Option<LinkError>,
    armed: bool,
    /// The last look stopped at its bound ([`REAP_MAX`], or the frames it may hold): more
    /// completions may wait in the CQ, which raise no event of their own.
    backlog: bool,
}

/// The link's role in confirming the QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkRole {
    /// Sends nothing until the server's `LINK_UP`.
    Client,
    /// Sends `LINK_UP` once connected.
    Server,
}

/// An RDMA link: one RC QP with its CQ, completion channel, RMB and send pools.
pub(crate) struct VerbsLink {
    // Field order is drop order: QP before CQ before channel, MRs before mappings.
    qp: Qp,
    cq: Cq,
    chan: crate::link::reactor::ReactorFd<CompChannel>,
    rx_pool: Pool,
    tx_pool: Pool,
    recv_mr: Mr,
    recv_bufs: Mapping,
    /// When the QP cannot send a CDC frame inline (the device granted less inline data than a
    /// frame): registered slots the SENDs go from, one per message that can be in flight.
    send_frames: Option<(Mr, Mapping)>,
    /// This group's own protection domain (every MR and the QP also hold it).
    pd: Arc<Pd>,
    port: Port,
    psn: u32,
    role: LinkRole,
    tx: Mutex<HashMap<u32, ConnTx>>,
    cqs: Mutex<CqState>,
    sq_free: AtomicU32,
    up: AtomicBool,
    /// Told when `up` becomes true on a client.
    up_changed: tokio::sync::Notify,
    space_wanted: AtomicBool,
    /// Set with `CqState::error`, so senders check it without the CQ lock.
    failed: AtomicBool,
    /// Torn down (`teardown`). Relaxed: it only ever goes from false to true, and nothing a
    /// reader does after seeing it depends on other memory written before it (the queue pair's
    /// error state is the kernel's; a failure's reason is read under the CQ lock).
    closed: AtomicBool,
    busy_poll: Duration,
    /// See [`Link::test_interval`]; zero: never.
    test_interval: Duration,
    /// Work completions that succeeded (sends and receives): evidence that the path to the
    /// peer works. Relaxed: a count compared with itself, through which nothing is published.
    completed: AtomicU64,
    /// `completed` when [`Link::test_if_idle`] last looked.
    completed_at_test: AtomicU64,
    /// CDC messages posted, and of those, completed (acknowledged by the peer's adapter). Every
    /// SEND is signaled and an RC queue completes in order, so message `n` was delivered once
    /// `acked >= n` (see [`Link::poll_delivered`]). Counters only: `posted` grows under the
    /// send lock, `acked` as completions are reaped, and a reader compares them with an Acquire
    /// load; nothing else is published through them.
    posted: AtomicU64,
    acked: AtomicU64,
    /// Tasks waiting in `poll_delivered`.
    delivery_waiters: Mutex<Vec<std::task::Waker>>,
}

impl std::fmt::Debug for VerbsLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsLink")
            .field("device", &self.port.dev.name)
            .field("port", &self.port.port)
            .field("qpn", &self.qp.qpn)
            .field("role", &self.role)
            .finish()
    }
}

impl VerbsLink {
    /// A link on `port` with a QP in INIT and receives posted, with the RMBs `rmbs` says.
    pub(crate) fn new(
        port: Port,
        role: LinkRole,
        rmbs: Rmbs,
        busy_poll: Duration,
        test_interval: Duration,
    ) -> Result<VerbsLink, LinkError> {
        let dev = port.dev.clone();
        let pd = Pd::new(&dev)?;
        // Registered with the reactor before the CQ exists, so that on any error below the
        // locals drop in reverse order (QP, CQ, then the channel) and the channel is never
        // destroyed while a CQ still uses it.
        // SAFETY: CompChannel's fd is owned by its channel, which the AsyncFd owns.
        let chan = unsafe { crate::sys::register(CompChannel::new(&dev)?, tokio::io::Interest::READABLE) }?;
        let cq = Cq::new(&dev, SQ_DEPTH + RQ_DEPTH, chan.get_ref())?;
        let forced = no_inline_forced();
        let qp = Qp::new(&pd, &cq, port.port, SQ_DEPTH, RQ_DEPTH, if forced { 0 } else { CDC_MSG_LEN as u32 })?;
        let send_frames = if forced || qp.max_inline < CDC_MSG_LEN as u32 {
            tracing::debug!(granted = qp.max_inline, "cdc frames go from registered buffers (no inline sends)");
            let map = Mapping::new(SQ_DEPTH as usize * CDC_MSG_LEN)?;
            // SAFETY: `map` outlives the MR (field order of VerbsLink: the MR is dropped first,
            // as the tuple's first element).
            let mr = unsafe { pd.reg_mr(map.ptr(), map.len(), device_access::LOCAL) }?;
            Some((mr, map))
        } else {
            None
        };
        let recv_bufs = Mapping::new(RQ_DEPTH as usize * CDC_MSG_LEN)?;
        // SAFETY: `recv_bufs` outlives the MR (field order of VerbsLink).
        let recv_mr = unsafe { pd.reg_mr(recv_bufs.ptr(), recv_bufs.len(), device_access::LOCAL) }?;
        let Rmbs { count, rx_size, tx_size, budget } = rmbs;
        let tally = Arc::new(LinkTally::default());
        let rx_pool = Pool::new(count, rx_size, device_access::REMOTE, budget.clone(), tally.clone())?;
        let tx_pool = Pool::new(count, tx_size, device_access::LOCAL, budget, tally)?;
        let psn = crate::sys::random_secret().map(|t| u32::from_le_bytes([t.0[0], t.0[1], t.0[2], 0]))?;
        let link = VerbsLink {
            qp,
            cq,
            chan: crate::link::reactor::ReactorFd::new(chan, tokio::io::Interest::READABLE),
            rx_pool,
            tx_pool,
            recv_mr,
            recv_bufs,
            send_frames,
            pd,
            port,
            psn,
            role,
            tx: Mutex::new(HashMap::new()),
            cqs: Mutex::new(CqState::default()),
            sq_free: AtomicU32::new(SQ_DEPTH),
            up: AtomicBool::new(false),
            up_changed: tokio::sync::Notify::new(),
            space_wanted: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            busy_poll,
            test_interval,
            completed: AtomicU64::new(0),
            completed_at_test: AtomicU64::new(0),
            posted: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            delivery_waiters: Mutex::new(Vec::new()),
        };
        for i in 0..RQ_DEPTH {
            link.post_recv(i)?;
        }
        Ok(link)
    }

    fn post_recv(&self, i: u32) -> Result<(), LinkError> {
        let p = self.recv_bufs.ptr().wrapping_add(i as usize * CDC_MSG_LEN);
        // SAFETY: buffer `i` of `recv_bufs` is registered under recv_mr and lives as long as
        // the QP (field order).
        unsafe { self.qp.post_recv(u64::from(i), p, CDC_MSG_LEN as u32, self.recv_mr.lkey) }.map_err(LinkError::from)
    }

    /// Our QP number.
    pub(crate) fn qpn(&self) -> u32 {
        self.qp.qpn
    }

    /// Our initial packet sequence number.
    pub(crate) fn psn(&self) -> u32 {
        self.psn
    }

    /// The port (device, GID, MTU) this link uses.
    pub(crate) fn port(&self) -> &Port {
        &self.port
    }

    /// Size of the send buffers (the peer's RMBs).
    pub(crate) fn tx_size(&self) -> u32 {
        self.tx_pool.size
    }

    /// Whether the link confirmation arrived (server: sent).
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// Connects the QP to the peer's (INIT -> RTR -> RTS). A server then confirms the link
    /// ([`confirm_up`](Self::confirm_up)).
    pub(crate) fn connect(&self, remote: &Remote) -> Result<(), LinkError> {
        self.qp.connect(self.port.port, self.port.gid_index, self.psn, remote)?;
        Ok(())
    }

    /// The server's confirmation of a connected link: the `LINK_UP` frame, after which the
    /// client may send. Posted once the group can be found by the client's next proposals, so
    /// that a client that waits for it before proposing the group again finds it known.
    pub(crate) fn confirm_up(&self) -> Result<(), LinkError> {
        debug_assert_eq!(self.role, LinkRole::Server);
        let mut frame = [0u8; CDC_MSG_LEN];
        frame[0] = LINK_UP_TYPE;
        self.post_frame(&frame, &[])?;
        self.up.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Waits until the server's confirmation arrived (see [`is_up`](Self::is_up)); a link
    /// that fails first is never up, so callers bound the wait.
    pub(crate) async fn wait_up(&self) {
        loop {
            let notified = self.up_changed.notified();
            tokio::pin!(notified);
            // Enabled before the check, so a confirmation between the check and the wait wakes us.
            notified.as_mut().enable();
            if self.is_up() {
                return;
            }
            notified.await;
        }
    }

    /// Our RMB for the connection with our token `token`: (address, rkey). Its chunk, and the
    /// chunk of the connection's send buffer, are registered (and charged) now if no slot of
    /// them was used before, so that a connection the budget has no room for is refused here,
    /// before either end commits to it, and not later in [`bind`](Self::bind).
    pub(crate) fn register_rmb(&self, token: u32) -> Result<(u64, u32), LinkError> {
        let slot = token_slot(token);
        let ((addr, _, rkey), new) = self.rx_pool.slot_registering(&self.pd, slot)?;
        if let Err(e) = self.tx_pool.slot(&self.pd, slot) {
            if new && device::on_the_setup_thread() {
                // Registered for this connection alone: it would stay pinned, and charged,
                // for nothing until the link is torn down. (Only where steps run one at a
                // time: on the blocking pool another step may have begun to use the chunk.)
                self.rx_pool.unregister_chunk(slot);
            }
            return Err(e.into());
        }
        Ok((addr, rkey))
    }

    /// Bytes the connection with our token `token` would register (pin) for its ring and send
    /// buffer were they used now: the chunks of its slot not registered yet.
    pub(crate) fn unregistered_for(&self, token: u32) -> u64 {
        let slot = token_slot(token);
        self.rx_pool.unregistered_bytes(slot) + self.tx_pool.unregistered_bytes(slot)
    }

    /// Whether the peer answered, and what the pools registered ([`LinkTally`]): a Confirm over
    /// TCP names a queue pair; a completed SEND shows that one is there.
    pub(crate) fn tally(&self) -> Arc<LinkTally> {
        self.rx_pool.tally.clone()
    }

    /// Bytes a connection on an unused chunk of each pool pins ([`chunk_pair_bytes`]).
    pub(crate) fn chunk_pair_bytes(&self) -> u64 {
        chunk_pair_bytes(self.rx_pool.count, self.rx_pool.size, self.tx_pool.size)
    }

    /// Records where the connection with our token `our` writes: the peer's RMB `peer`.
    pub(crate) fn bind(&self, our: u32, peer: &PeerRmb) -> Result<(), LinkError> {
        let ring = RingSize::new(peer.size).ok_or(LinkError::Protocol("peer rmb size"))?;
        if peer.size != self.tx_pool.size {
            return Err(LinkError::Protocol("peer rmb size differs from the link's"));
        }
        let (_, lkey, _) = self.tx_pool.slot(&self.pd, token_slot(our))?;
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.get(&peer.token).is_some_and(|c| c.our_slot != token_slot(our)) {
            // Sends are looked up by the peer's token: a second connection under the same one
            // would take the first one's place, and the first would then write with the
            // second's slot and cursor.
            return Err(LinkError::Protocol("the peer named a ring another connection writes"));
        }
        tx.retain(|_, c| c.our_slot != token_slot(our));
        tx.insert(
            peer.token,
            ConnTx {
                our_slot: token_slot(our),
                lkey,
                remote_addr: peer.addr,
                rkey: peer.rkey,
                ring,
                sent_prod: Cursor::new(0, 0),
            },
        );
        Ok(())
    }

    /// Posts `writes` and then `frame` as an inline signaled SEND, in one chain; returns how
    /// many WRs it posted. A failed post ends the link: what the QP took of the chain is unknown.
    fn post_frame(&self, frame: &[u8; CDC_MSG_LEN], writes: &[WriteSpan]) -> Result<u32, LinkError> {
        let mut sges = [ffi::ibv_sge::default(); WRS_PER_MSG as usize];
        // SAFETY: ibv_send_wr is plain data for which all-zero is a valid (empty) value.
        let mut wrs: [ffi::ibv_send_wr; WRS_PER_MSG as usize] = unsafe { std::mem::zeroed() };
        let n = writes.len();
        if n + 1 > wrs.len() {
            return Err(LinkError::Protocol("too many write spans"));
        }
        for (i, w) in writes.iter().enumerate() {
            let p = self.tx_pool.span(w.slot, w.off, w.len).ok_or(LinkError::Protocol("send span"))?;
            sges[i] = ffi::ibv_sge { addr: p as u64, length: w.len, lkey: w.lkey };
            wrs[i].opcode = ffi::IBV_WR_RDMA_WRITE;
            wrs[i].remote_addr = w.raddr.wrapping_add(u64::from(w.off));
            wrs[i].rkey = w.rkey;
        }
        let count = n as u32 + 1;
        // The message's number: its delivery mark, and its send slot when sends are not inline.
        let seq = self.posted.fetch_add(1, Ordering::AcqRel);
        wrs[n].opcode = ffi::IBV_WR_SEND;
        wrs[n].wr_id = u64::from(count);
        match &self.send_frames {
            None => {
                sges[n] = ffi::ibv_sge { addr: frame.as_ptr() as u64, length: CDC_MSG_LEN as u32, lkey: 0 };
                wrs[n].send_flags = ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_INLINE;
            }
            Some((mr, map)) => {
                // At most SQ_DEPTH work requests, so at most SQ_DEPTH messages, are in flight
                // (`sq_free`), and an RC queue completes in order: the message SQ_DEPTH before
                // this one has completed, and its slot is free.
                let slot = (seq % u64::from(SQ_DEPTH)) as usize;
                let p = map.ptr().wrapping_add(slot * CDC_MSG_LEN);
                // SAFETY: slot < SQ_DEPTH, so the 64 bytes lie inside `map`; the adapter reads
                // them only after the post below and is done with them (see above).
                unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), p, CDC_MSG_LEN) };
                sges[n] = ffi::ibv_sge { addr: p as u64, length: CDC_MSG_LEN as u32, lkey: mr.lkey };
                wrs[n].send_flags = ffi::IBV_SEND_SIGNALED;
            }
        }
        let sge_ptr = sges.as_mut_ptr();
        let wr_ptr = wrs.as_mut_ptr();
        for i in 0..=n {
            // SAFETY: i <= n < WRS_PER_MSG, so WR i and SGE i are in their arrays, which outlive
            // these pointers (derived once, after the last indexed write).
            unsafe {
                let wr = &mut *wr_ptr.add(i);
                wr.sg_list = sge_ptr.add(i);
                wr.num_sge = 1;
                wr.next = if i < n { wr_ptr.add(i + 1) } else { std::ptr::null_mut() };
            }
        }
        // SAFETY: the SGEs and WRs live across the call; WRITE sources are registered send-pool
        // spans, which we leave unchanged until the peer reports them consumed (module docs:
        // a peer that reports early gets garbled bytes of its own); the SEND is
        // inline (`frame` is copied during the call) or goes from its registered slot, which
        // stays unchanged until it completes (above).
        match unsafe { self.qp.post_send(wr_ptr) } {
            Ok(()) => {
                self.sq_free.fetch_sub(count, Ordering::SeqCst);
                Ok(count)
            }
            Err(e) => {
                tracing::debug!(error = %e, "ibv_post_send failed: ending the link");
                let e = LinkError::from(e);
                self.fail_locked(&mut self.lock_cq(), e.clone());
                self.teardown();
                Err(e)
            }
        }
    }

    /// Takes every waiting completion into the link's state. Called with the CQ lock held.
    fn reap(&self, st: &mut CqState) {
        let mut wcs = [ffi::ibv_wc::default(); POLL_BATCH];
        let mut taken = 0;
        st.backlog = true;
        // Bound the frames held (a flooding peer waits in its own send queue, not our memory)
        // and the completions taken in one look (see `REAP_MAX`).
        while st.frames.len() < 4 * RQ_DEPTH as usize && taken < REAP_MAX {
            let n = match self.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    st.backlog = false;
                    self.fail_locked(st, e.into());
                    return;
                }
            };
            taken += n;
            for wc in &wcs[..n] {
                self.completion(st, wc);
            }
            if n < POLL_BATCH {
                st.backlog = false;
                break;
            }
        }
    }

    /// Why the link no longer works, if it does not: its failure's reason first (a failure
    /// tears the link down too, as a failed post does, and its reason, an I/O error that moves
    /// the connections to TCP, must not read as `Closed`, a teardown by the group that ends
    /// them), else `Closed` once torn down.
    fn ended(&self) -> Option<LinkError> {
        if self.failed.load(Ordering::Acquire) {
            return Some(self.lock_cq().error.clone().unwrap_or(LinkError::Closed));
        }
        self.closed.load(Ordering::Relaxed).then_some(LinkError::Closed)
    }

    /// The link failed: keeps the first reason, and wakes every task waiting for a delivery
    /// (`poll_delivered`), whose completion will never come.
    fn fail_locked(&self, st: &mut CqState, err: LinkError) {
        st.error.get_or_insert(err);
        self.failed.store(true, Ordering::Release);
        self.wake_delivery_waiters();
    }

    fn wake_delivery_waiters(&self) {
        let waiters = std::mem::take(&mut *self.delivery_waiters.lock().unwrap_or_else(|e| e.into_inner()));
        waiters.into_iter().for_each(std::task::Waker::wake);
    }

    fn completion(&self, st: &mut CqState, wc: &ffi::ibv_wc) {
        if wc.status != ffi::IBV_WC_SUCCESS {
            let err = match wc.status {
                ffi::IBV_WC_WR_FLUSH_ERR if self.closed.load(Ordering::Relaxed) => LinkError::Closed,
                // Transport retries exhausted: nothing answers at the peer's QP any more.
                ffi::IBV_WC_RETRY_EXC_ERR | ffi::IBV_WC_RNR_RETRY_EXC_ERR => LinkError::PeerGone,
                status => {
                    tracing::debug!(status, vendor = wc.vendor_err, opcode = wc.opcode, "work completion failed");
                    LinkError::Io(
                        std::io::ErrorKind::Other,
                        format!("rdma work completion failed: {} (status {status})", ffi::wc_status_str(status)),
                    )
                }
            };
            self.fail_locked(st, err);
            return;
        }
        self.completed.fetch_add(1, Ordering::Relaxed);
        let kind = completed(wc.opcode);
        if kind == Completed::Foreign {
            self.fail_locked(st, LinkError::Protocol("a receive completion that is not a SEND's"));
            return;
        }
        if kind == Completed::Recv {
            let i = wc.wr_id;
            if i >= u64::from(RQ_DEPTH) || wc.byte_len as usize != CDC_MSG_LEN {
                self.fail_locked(st, LinkError::Protocol("CDC message of the wrong length"));
                return;
            }
            let mut frame = [0u8; CDC_MSG_LEN];
            let p = self.recv_bufs.ptr().wrapping_add(i as usize * CDC_MSG_LEN);
            // SAFETY: receive buffer `i` is inside `recv_bufs`; the HCA finished writing it (its
            // completion was polled) and it is not re-posted until after this copy.
            unsafe { std::ptr::copy_nonoverlapping(p, frame.as_mut_ptr(), CDC_MSG_LEN) };
            if let Err(e) = self.post_recv(i as u32) {
                self.fail_locked(st, e);
                return;
            }
            if frame[0] == LINK_UP_TYPE {
                if self.role == LinkRole::Client {
                    self.up.store(true, Ordering::SeqCst);
                    self.up_changed.notify_waiters();
                }
            } else {
                st.frames.push_back(frame);
            }
        } else {
            // A signaled SEND completed: its whole chain (wr_id WRs) left the send queue, and
            // the peer's adapter has it.
            let n = u32::try_from(wc.wr_id).unwrap_or(0).min(WRS_PER_MSG);
            self.sq_free.fetch_add(n, Ordering::SeqCst);
            self.acked.fetch_add(1, Ordering::AcqRel);
            let tally = &self.rx_pool.tally;
            if !tally.answered.load(Ordering::Relaxed) {
                tally.answered.store(true, Ordering::Release);
            }
            self.wake_delivery_waiters();
        }
    }

    /// Sends `frame`, with the RDMA WRITEs of the new bytes `msg` (its decoded form) announces.
    /// Without `msg` (a frame that does not decode: the test hook's corrupt ones) the frame goes
    /// as it is, with no data.
    fn send(&self, frame: &[u8; CDC_MSG_LEN], msg: Option<&CdcMsg>) -> Result<bool, LinkError> {
        if let Some(e) = self.ended() {
            return Err(e);
        }
        // Announce the wait first (SeqCst, as the driver's updates of `up` and `sq_free` and its
        // check in `space_ready`), so a completion reaped concurrently sees it, or we see it.
        if !self.is_up() {
            self.space_wanted.store(true, Ordering::SeqCst);
            if !self.is_up() {
                return Ok(false);
            }
        }
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if self.sq_free.load(Ordering::SeqCst) < WRS_PER_MSG {
            if let Some(mut st) = crate::link::try_lock(&self.cqs) {
                self.reap(&mut st);
            }
            if self.sq_free.load(Ordering::SeqCst) < WRS_PER_MSG {
                self.space_wanted.store(true, Ordering::SeqCst);
                if self.sq_free.load(Ordering::SeqCst) < WRS_PER_MSG {
                    return Ok(false);
                }
            }
        }
        let mut writes = [WriteSpan::default(); 2];
        let mut n = 0;
        let conn = msg.and_then(|m| Some((m, tx.get_mut(&m.token)?)));
        // A producer cursor that does not advance validly from the last one sent writes nothing.
        let advance = conn.and_then(|(m, c)| Some((m, c.ring.distance(c.sent_prod, m.prod).ok()?, c)));
        if let Some((m, delta, c)) = &advance {
            // Bytes that ride inline in the frame need no WRITE: the receiver stores them.
            if *delta > 0 && m.inline().len() != *delta as usize {
                if let Ok(spans) = c.ring.spans(c.sent_prod, *delta) {
                    for (off, len) in spans.into_iter().filter(|s| s.1 > 0) {
                        writes[n] =
                            WriteSpan { slot: c.our_slot, lkey: c.lkey, off, len, raddr: c.remote_addr, rkey: c.rkey };
                        n += 1;
                    }
                }
            }
        }
        self.post_frame(frame, &writes[..n])?;
        if let Some((m, _, c)) = advance {
            c.sent_prod = m.prod;
        }
        Ok(true)
    }

    fn lock_cq(&self) -> std::sync::MutexGuard<'_, CqState> {
        self.cqs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a waiting sender can go now.
    fn space_ready(&self) -> bool {
        // SeqCst with the sender's store-then-load of the same flags (cdc_send_frame): a sender
        // that announced its wait after our last check is seen by this one, or sees our update.
        self.space_wanted.load(Ordering::SeqCst) && self.is_up() && self.sq_free.load(Ordering::SeqCst) >= WRS_PER_MSG
    }
}

/// Access flags of the pools.
mod device_access {
    use super::ffi;
    pub(super) const LOCAL: std::ffi::c_int = ffi::IBV_ACCESS_LOCAL_WRITE;
    pub(super) const REMOTE: std::ffi::c_int = ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE;
}

impl Link for VerbsLink {
    fn rx_rmb_size(&self) -> u32 {
        self.rx_pool.size
    }

    fn rx_token(&self, our_token: u32, _peer_token: u32) -> u32 {
        our_token
    }

    fn tx_write(&self, rmb: u32, offset: u32, data: &[u8]) -> Result<(), LinkError> {
        let len = u32::try_from(data.len()).map_err(|_| LinkError::Protocol("write span"))?;
        let p = self.tx_pool.span(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("write span"))?;
        // SAFETY: the span is inside our send pool, which lives as long as the link, and only
        // this connection (whose lock the caller holds) writes it. The HCA reads it only for a
        // WRITE posted earlier, which an honest peer has seen complete before it freed the span
        // (module docs); a dishonest one gets garbled bytes of its own.
        unsafe { super::peer_mem::copy_private(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    fn tx_read(&self, rmb: u32, offset: u32, dst: &mut [u8]) -> Result<(), LinkError> {
        let len = u32::try_from(dst.len()).map_err(|_| LinkError::Protocol("read-back span"))?;
        let p = self.tx_pool.span(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("read-back span"))?;
        // SAFETY: the span is inside our send pool; only this connection (whose lock the caller
        // holds) writes it, and the HCA only reads it, so the copy races with no writer.
        unsafe { super::peer_mem::copy_private(p.cast_const(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn tx_fill(
        &self,
        rmb: u32,
        offset: u32,
        len: u32,
        fill: &mut dyn FnMut(super::TxSpan) -> io::Result<usize>,
    ) -> Result<io::Result<usize>, LinkError> {
        let p = self.tx_pool.span(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("fill span"))?;
        // SAFETY: the span is inside our send pool, which lives as long as the link (beyond
        // this call), and is written only by this connection, whose lock the caller holds. The
        // HCA may read it while it is filled only for a dishonest peer (see `tx_write`).
        Ok(fill(unsafe { super::TxSpan::new(p, len as usize) }))
    }

    fn rx_read(&self, rmb: u32, offset: u32, dst: &mut [MaybeUninit<u8>]) -> Result<(), LinkError> {
        let len = u32::try_from(dst.len()).map_err(|_| LinkError::Protocol("read span"))?;
        let p = self.rx_pool.span(token_slot(rmb), offset, len).ok_or(LinkError::Protocol("read span"))?;
        // SAFETY: the span is inside our RMB pool, mapped for the link's life. The peer's HCA
        // wrote these bytes before the CDC message that announced them completed (RC
        // ordering), and that completion was polled before this read. A peer that posts
        // another WRITE meanwhile has the adapter write while we read: the copy uses relaxed
        // atomic loads, so that only garbles the peer's own bytes (see `peer_mem`).
        unsafe { super::peer_mem::copy_from_peer(p, dst) };
        Ok(())
    }

    fn rx_place_inline(&self, rmb: u32, spans: [(u32, u32); 2], data: &[u8]) -> Result<bool, LinkError> {
        let mut at = 0usize;
        for (off, len) in spans {
            if len == 0 {
                continue;
            }
            let src = data.get(at..at + len as usize).ok_or(LinkError::Protocol("inline span"))?;
            let p = self.rx_pool.span(token_slot(rmb), off, len).ok_or(LinkError::Protocol("inline span"))?;
            // SAFETY: the span is inside our RMB pool, mapped for the link's life. A well-behaved
            // peer wrote no bytes there for this message (it sent them inline instead); a
            // hostile one may have its adapter write there right now, so the copy uses relaxed
            // atomic stores (see `peer_mem`).
            unsafe { super::peer_mem::copy_to_peer(p, src) };
            at += len as usize;
        }
        Ok(true)
    }

    fn cdc_send(&self, msg: &CdcMsg) -> Result<bool, LinkError> {
        self.send(&msg.encode(), Some(msg))
    }

    fn cdc_send_frame(&self, frame: &[u8; CDC_MSG_LEN]) -> Result<bool, LinkError> {
        self.send(frame, CdcMsg::decode(frame).ok().as_ref())
    }

    fn cdc_recv(&self, out: &mut Vec<[u8; CDC_MSG_LEN]>, max: usize) -> Result<Option<usize>, LinkError> {
        let Some(mut st) = crate::link::try_lock(&self.cqs) else {
            return Ok(None);
        };
        self.reap(&mut st);
        let n = st.frames.len().min(max);
        out.extend(st.frames.drain(..n));
        if n == 0 {
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
        }
        Ok(Some(n))
    }

    fn poll_event(&self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if let Some(e) = self.ended() {
            return Poll::Ready(Err(e));
        }
        loop {
            let mut st = self.lock_cq();
            self.reap(&mut st);
            if let Some(e) = &st.error {
                return Poll::Ready(Err(e.clone()));
            }
            if !st.frames.is_empty() || self.space_ready() {
                return Poll::Ready(Ok(()));
            }
            if st.backlog {
                // Completions left in the CQ raise no event: come back for them after the
                // runtime's other tasks, as a polling reader does.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if !st.armed {
                // Arm, then poll again: a completion that landed before the arm raises no event.
                if let Err(e) = self.cq.arm() {
                    return Poll::Ready(Err(e.into()));
                }
                st.armed = true;
                continue;
            }
            drop(st);
            let Some(chan) = self.chan.get() else {
                return Poll::Ready(Err(LinkError::Closed));
            };
            match chan.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    let mut got = false;
                    loop {
                        match g.get_inner().get_event() {
                            Ok(true) => {
                                got = true;
                                self.cq.event_taken();
                            }
                            Ok(false) => break,
                            Err(e) => return Poll::Ready(Err(e.into())),
                        }
                    }
                    // Drained to EAGAIN: the readiness may be cleared.
                    g.clear_ready();
                    if got {
                        // The notification was one-shot: re-arm on the next round.
                        self.lock_cq().armed = false;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn clear_space_wait(&self) {
        self.space_wanted.store(false, Ordering::SeqCst);
    }

    fn watches_space(&self) -> bool {
        self.space_wanted.load(Ordering::SeqCst)
    }

    fn has_pending(&self) -> bool {
        let Some(mut st) = crate::link::try_lock(&self.cqs) else {
            return false;
        };
        self.reap(&mut st);
        !st.frames.is_empty() || st.error.is_some()
    }

    fn busy_poll(&self) -> Duration {
        self.busy_poll
    }

    fn test_interval(&self) -> Option<Duration> {
        (!self.test_interval.is_zero()).then_some(self.test_interval)
    }

    fn test_if_idle(&self) -> Result<(), LinkError> {
        let done = self.completed.load(Ordering::Relaxed);
        if self.completed_at_test.swap(done, Ordering::Relaxed) != done || !self.is_up() {
            return Ok(());
        }
        if let Some(e) = self.ended() {
            return Err(e);
        }
        // Under the senders' lock, as their posts are: a message slot is taken only with room
        // for a whole chain (`send`).
        let _tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        // Again under the lock: a send that failed, or a teardown, since the look above put the
        // queue pair in error, and a post now would only report that as a failure of its own.
        if let Some(e) = self.ended() {
            return Err(e);
        }
        if self.sq_free.load(Ordering::SeqCst) < SQ_DEPTH {
            // Sends in flight: their completions tell whether the path works.
            return Ok(());
        }
        // The test is a `LINK_UP` frame, which a peer's link takes in and drops once the link
        // is up (the server's first one confirms the link; any later one, from either side, is
        // only consumed). Its completion counts as traffic, so the next look sends none.
        let mut frame = [0u8; CDC_MSG_LEN];
        frame[0] = LINK_UP_TYPE;
        tracing::trace!(qpn = self.qp.qpn, "testing an idle link");
        // A failed post ends the link; its first recorded reason is the one to report.
        self.post_frame(&frame, &[]).map(|_| ()).map_err(|e| self.ended().unwrap_or(e))
    }

    fn is_rdma(&self) -> bool {
        true
    }

    fn tx_mark(&self) -> u64 {
        self.posted.load(Ordering::Acquire)
    }

    fn poll_delivered(&self, cx: &mut Context<'_>, mark: u64) -> Poll<Result<(), LinkError>> {
        for attempt in 0..2 {
            if self.acked.load(Ordering::Acquire) >= mark {
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = self.ended() {
                // Completions of sends that went before the end may still wait in the queue:
                // what they complete was delivered. (Waits for a reaper that holds the queue:
                // it may be taking that very completion.)
                self.reap(&mut self.lock_cq());
                if self.acked.load(Ordering::Acquire) >= mark {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(e));
            }
            if attempt == 0 {
                // Take what has completed ourselves (the driver may be asleep on the channel),
                // then wait, registered before the last look so no completion is missed.
                if let Some(mut st) = crate::link::try_lock(&self.cqs) {
                    self.reap(&mut st);
                }
                let mut w = self.delivery_waiters.lock().unwrap_or_else(|e| e.into_inner());
                if !w.iter().any(|x| x.will_wake(cx.waker())) {
                    w.push(cx.waker().clone());
                }
            }
        }
        Poll::Pending
    }

    fn conn_closed(&self, our_token: u32) {
        let slot = token_slot(our_token);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, c| c.our_slot != slot);
    }

    fn rehome(&self) -> Result<(), LinkError> {
        // The channel moves; the CQ keeps pointing at the same ibv_comp_channel.
        self.chan.rehome().map_err(LinkError::from)
    }

    #[cfg(feature = "test-util")]
    fn fail_for_test(&self, err: LinkError) {
        // What a failed post does (`send`).
        self.fail_locked(&mut self.lock_cq(), err);
        self.teardown();
    }

    fn teardown(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.qp.set_error();
            // The link is done with its pools: their pinned chunks go back now, not when the
            // last connection that moved to TCP, holding the group, is dropped (a peer can ask
            // for such moves and keep the connections open, so this bounds what it makes us
            // pin to live groups). Deregistration stops the adapter's use of the memory; the
            // mapping stays valid until the link is dropped, whatever the adapter does.
            let released = (self.rx_pool.release(), self.tx_pool.release());
            if !released.0 .0.is_empty() || !released.1 .0.is_empty() {
                crate::link::verbs::device::drop_on_setup_thread(Box::new(released));
            }
        }
        // Deliveries that were awaited will not complete now (`poll_delivered` reports the
        // end once woken).
        self.wake_delivery_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::{completed, Completed};

    /// Only a receive of the peer's SEND is read from its buffer; a WRITE with immediate data,
    /// which consumes a receive without filling it, is the peer breaking the protocol (its
    /// buffer would be read as a new message while it holds an old one). Send-side opcodes
    /// (SEND 0, RDMA WRITE 1) are our own completions.
    #[test]
    fn only_a_send_of_the_peer_is_taken_as_a_received_message() {
        assert_eq!(completed(128), Completed::Recv);
        assert_eq!(completed(129), Completed::Foreign);
        assert_eq!(completed(0), Completed::Send);
        assert_eq!(completed(1), Completed::Send);
    }
}
