//! Process-wide counters, as the kernel's `smcr stats` and `smcss` show for its SMC: connections
//! by transport and role, fallbacks and declines by reason, handshakes in flight and their
//! durations, bytes by transport, link groups.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::proto::clc::DeclineReason;
use crate::proto::handshake::Side;
use crate::transport::{FallbackReason, Transport};

/// Upper bounds of the handshake-time histogram buckets; the last bucket is everything above.
pub const HANDSHAKE_BUCKETS: [Duration; 6] = [
    Duration::from_micros(50),
    Duration::from_micros(200),
    Duration::from_millis(1),
    Duration::from_millis(10),
    Duration::from_millis(100),
    Duration::from_secs(1),
];

const REASONS: usize = 8;
const FALLBACKS: usize = 8;

#[derive(Default)]
struct Role {
    smc_d: AtomicU64,
    smc_r: AtomicU64,
    kernel_smc_d: AtomicU64,
    kernel_smc_r: AtomicU64,
    tcp: AtomicU64,
    fallbacks: [AtomicU64; FALLBACKS],
}

/// One thread's share of a context's counters: every counter of [`Counters`], in lines of its
/// own.
#[derive(Default)]
#[repr(align(128))]
struct Lane {
    client: Role,
    server: Role,
    declines_sent: [AtomicU64; REASONS],
    declines_received: [AtomicU64; REASONS],
    handshakes_in_flight: AtomicU64,
    handshakes_completed: AtomicU64,
    handshakes_failed: AtomicU64,
    handshakes_abandoned: AtomicU64,
    handshake_hist: [AtomicU64; 7],
    bytes_sent: [AtomicU64; 3],
    bytes_received: [AtomicU64; 3],
    link_groups: AtomicU64,
    link_groups_rescued: AtomicU64,
    co_drivers: AtomicU64,
    tcp_held: AtomicU64,
    adaptive_fallbacks: AtomicU64,
    rmb_grown: AtomicU64,
    rdma_unavailable: [AtomicU64; 4],
    door: [AtomicU64; 5],
    late_messages: AtomicU64,
    door_connections: AtomicU64,
    door_frames: AtomicU64,
    door_messages: AtomicU64,
    partial_waits: AtomicU64,
    handbacks: [AtomicU64; 2],
    doorbells: [AtomicU64; 2],
    /// Spins for frames that readers started (busy polling); for tests, not in [`Stats`].
    reader_spins: AtomicU64,
    kernel: Kernel,
}

/// One context's counters (the default context's are the process's, [`stats`]).
///
/// Counted on every read and write, so they are striped: a thread takes the next lane the first
/// time it counts and adds to it from then on (threads beyond the lane count share lanes), and
/// a snapshot sums the lanes. One shared set of counters put a cache-line transfer on every
/// read and write of two threads moving bytes (measured with `perf` on `smcperf local
/// --scenario rr --size 14 --busy-poll 50`: 7% of each side's round trip was the byte
/// counter's `fetch_add`).
///
/// Gauges (handshakes in flight, live link groups) go up on one lane and may come down on
/// another: lanes wrap, and the sum of them is the gauge. A snapshot reads the lanes one after
/// another, so a gauge that changes meanwhile may read one off for that snapshot (its count
/// went up on a lane already read and down on one read later).
///
/// Aligned past the reference counts of its `Arc` (every handshake clones it): the lanes'
/// address, read on every count, stays in a line nobody writes.
#[repr(align(128))]
pub(crate) struct Counters {
    lanes: Box<[Lane]>,
    /// Kernel fallbacks by the kernel's reason code: few distinct codes, rarely counted.
    kernel_reasons: std::sync::Mutex<std::collections::BTreeMap<u32, u64>>,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters { lanes: (0..lane_count()).map(|_| Lane::default()).collect(), kernel_reasons: Default::default() }
    }
}

/// Lanes per set of counters: a power of two, four per CPU (threads take lanes in turn, so a
/// few more lanes than busy threads keep two busy threads apart), at least 8 and at most 64
/// (a lane is 768 bytes: 12 cache lines).
fn lane_count() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        cpus.saturating_mul(4).next_power_of_two().clamp(8, 64)
    })
}

/// This thread's lane number (before reduction to a set's lane count): threads take numbers in
/// turn, the first time they count.
fn lane_number() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static MINE: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    }
    MINE.with(|m| {
        let n = m.get();
        if n != usize::MAX {
            return n;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
        m.set(n);
        n
    })
}

impl Counters {
    /// This thread's lane.
    fn lane(&self) -> &Lane {
        // The lane count is a power of two.
        &self.lanes[lane_number() & (self.lanes.len() - 1)]
    }

    /// The sum of one counter over the lanes. Wrapping: a gauge's lanes may each have wrapped.
    fn sum(&self, pick: impl Fn(&Lane) -> &AtomicU64) -> u64 {
        self.lanes.iter().fold(0u64, |n, l| n.wrapping_add(pick(l).load(Ordering::Relaxed)))
    }

    /// The sums of an array of counters over the lanes.
    fn sums<const N: usize>(&self, pick: impl Fn(&Lane) -> &[AtomicU64; N]) -> [u64; N] {
        std::array::from_fn(|i| self.sum(|l| &pick(l)[i]))
    }

    /// A gauge: the sum of its lanes, never below zero (a lane that only ever came down wrapped).
    fn gauge(&self, pick: impl Fn(&Lane) -> &AtomicU64) -> u64 {
        let n = self.sum(pick);
        if n > u64::MAX / 2 {
            0
        } else {
            n
        }
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A snapshot is `Stats`; a handle only says what it is.
        f.debug_struct("Counters").finish_non_exhaustive()
    }
}

/// The kernel-SMC counters (see [`KernelStats`]).
#[derive(Default)]
struct Kernel {
    smc_r: AtomicU64,
    smc_d: AtomicU64,
    fallback: AtomicU64,
    unknown: AtomicU64,
    unavailable: [AtomicU64; 3],
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
}

impl Counters {
    /// The default context's counters: what [`stats`] reports.
    pub(crate) fn process() -> &'static std::sync::Arc<Counters> {
        static C: std::sync::OnceLock<std::sync::Arc<Counters>> = std::sync::OnceLock::new();
        C.get_or_init(std::sync::Arc::default)
    }
}

/// The index of `t` in the byte counters; `None` for the kernel's SMC (counted apart).
fn transport_index(t: Transport) -> Option<usize> {
    match t {
        Transport::SmcD => Some(0),
        Transport::SmcR => Some(1),
        Transport::Tcp(_) => Some(2),
        Transport::KernelSmcR | Transport::KernelSmcD | Transport::KernelUnknown => None,
    }
}

fn fallback_index(r: FallbackReason) -> usize {
    match r {
        FallbackReason::Disabled => 0,
        FallbackReason::PeerNoSmc => 1,
        FallbackReason::NegativeCache => 2,
        FallbackReason::ClientSilent => 3,
        FallbackReason::Declined { by: Side::Local, .. } => 4,
        FallbackReason::Declined { by: Side::Peer, .. } => 5,
        // Adopted streams never went through a handshake and are not counted as connections;
        // if one were, "not proposed" is what happened.
        // Handed-back connections were counted when they became SMC (and in `handbacks`).
        FallbackReason::NotProposed | FallbackReason::Adopted | FallbackReason::HandedBack(_) => 6,
        FallbackReason::Kernel(_) => 7,
    }
}

fn reason_index(r: DeclineReason) -> usize {
    (r as usize).saturating_sub(1).min(REASONS - 1)
}

/// What happened at a door (see [`Stats::door`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum DoorEvent {
    Registered = 0,
    Matched = 1,
    Unmatched = 2,
    TimedOut = 3,
    Refused = 4,
}

impl Counters {
    /// Counts a connection handed to the application.
    pub(crate) fn connection(&self, server: bool, t: Transport) {
        let c = self.lane();
        let role = if server { &c.server } else { &c.client };
        let n = match t {
            Transport::SmcD => &role.smc_d,
            Transport::SmcR => &role.smc_r,
            Transport::KernelSmcD => &role.kernel_smc_d,
            Transport::KernelSmcR => &role.kernel_smc_r,
            // Its mode is unknown: counted as TCP, and in the kernel stats as unknown.
            Transport::KernelUnknown => &role.tcp,
            Transport::Tcp(r) => {
                role.fallbacks[fallback_index(r)].fetch_add(1, Ordering::Relaxed);
                &role.tcp
            }
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a decline this process sent or received.
    pub(crate) fn decline(&self, reason: DeclineReason, by: Side) {
        let c = self.lane();
        let a = match by {
            Side::Local => &c.declines_sent,
            Side::Peer => &c.declines_received,
        };
        a[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts bytes moved by the application over `t`.
    pub(crate) fn bytes(&self, t: Transport, sent: bool, n: usize) {
        let c = self.lane();
        match transport_index(t) {
            Some(i) => {
                let a = if sent { &c.bytes_sent } else { &c.bytes_received };
                a[i].fetch_add(n as u64, Ordering::Relaxed);
            }
            None => {
                let k = if sent { &c.kernel.bytes_sent } else { &c.kernel.bytes_received };
                k.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }

    /// Counts what the kernel made of an `AF_SMC` connection.
    pub(crate) fn kernel_transport(&self, t: Transport) {
        let k = &self.lane().kernel;
        let n = match t {
            Transport::KernelSmcR => &k.smc_r,
            Transport::KernelSmcD => &k.smc_d,
            Transport::KernelUnknown => &k.unknown,
            _ => &k.fallback,
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a kernel fallback by the kernel's reason code.
    pub(crate) fn kernel_fallback(&self, reason: u32) {
        let mut m = self.kernel_reasons.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(reason).or_default() += 1;
    }

    /// Counts a socket that was wanted as `AF_SMC` but is plain TCP.
    pub(crate) fn kernel_unavailable(&self, why: crate::transport::KernelUnavailable) {
        if let Some(c) = self.lane().kernel.unavailable.get(why.index()) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn link_group_up(&self) {
        self.lane().link_groups.fetch_add(1, Ordering::Relaxed);
    }

    /// A released connection's TCP socket held open for its peer's close (`up`), or let go.
    pub(crate) fn tcp_held(&self, up: bool) {
        // Maybe on another lane than the one it went up on: lanes wrap (see `gauge`).
        if up {
            self.lane().tcp_held.fetch_add(1, Ordering::Relaxed);
        } else {
            self.lane().tcp_held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A co-driver of a link group started (`up`) or ended.
    pub(crate) fn co_driver(&self, up: bool) {
        // Maybe on another lane than the one it went up on: lanes wrap (see `gauge`).
        if up {
            self.lane().co_drivers.fetch_add(1, Ordering::Relaxed);
        } else {
            self.lane().co_drivers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn link_group_rescued(&self) {
        self.lane().link_groups_rescued.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn link_group_down(&self) {
        // Maybe on another lane than the one it went up on: lanes wrap (see `gauge`).
        self.lane().link_groups.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts a shared-memory ring that grew (RMB autotuning).
    pub(crate) fn rmb_grown(&self) {
        self.lane().rmb_grown.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn adaptive_fallback(&self) {
        self.lane().adaptive_fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn door(&self, e: DoorEvent) {
        self.lane().door[e as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A door connection or a door's owner refused for its uid.
    pub(crate) fn door_refused(&self) {
        self.door(DoorEvent::Refused);
    }

    /// A door connection a client opened (it then carries every registration to that
    /// listener from its runtime).
    pub(crate) fn door_connection(&self) {
        self.lane().door_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A door message sent (either end), carrying `frames` frames.
    pub(crate) fn door_message(&self, frames: usize) {
        let lane = self.lane();
        lane.door_messages.fetch_add(1, Ordering::Relaxed);
        lane.door_frames.fetch_add(frames as u64, Ordering::Relaxed);
    }

    /// A late handshake message taken off a TCP stream before the application's bytes.
    pub(crate) fn late_message(&self) {
        self.lane().late_messages.fetch_add(1, Ordering::Relaxed);
    }

    /// The in-band guard held a partial handshake prefix and started its wait for more.
    pub(crate) fn partial_wait(&self) {
        self.lane().partial_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// A shared-memory link rang its peer's doorbell (`rung`), or woke up for a ring of its own.
    pub(crate) fn doorbell(&self, rung: bool) {
        self.lane().doorbells[usize::from(!rung)].fetch_add(1, Ordering::Relaxed);
    }

    /// A reader started to spin for frames (busy polling).
    pub(crate) fn reader_spin(&self) {
        self.lane().reader_spins.fetch_add(1, Ordering::Relaxed);
    }

    /// Spins for frames that readers started.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub(crate) fn reader_spins(&self) -> u64 {
        self.sum(|l| &l.reader_spins)
    }

    /// An SMC connection finished its move to its TCP socket (`ok`), or the move failed.
    pub(crate) fn handback(&self, ok: bool) {
        self.lane().handbacks[usize::from(!ok)].fetch_add(1, Ordering::Relaxed);
    }
}

/// A handshake in flight; records its duration and outcome when finished or dropped.
pub(crate) struct HandshakeTimer {
    counters: std::sync::Arc<Counters>,
    start: Instant,
    done: bool,
}

impl HandshakeTimer {
    pub(crate) fn start(counters: &std::sync::Arc<Counters>) -> HandshakeTimer {
        counters.lane().handshakes_in_flight.fetch_add(1, Ordering::Relaxed);
        HandshakeTimer { counters: counters.clone(), start: Instant::now(), done: false }
    }

    /// Stops the timer at the handshake's end, `outcome` as the handshake machine's driver
    /// returned it: an outcome (SMC or a decline) completed it; an error short of one (no
    /// answer in time, a message that made no sense, a channel that failed) failed it; a peer
    /// that closed the channel without a final word gave up, so the handshake counts as
    /// abandoned, as one whose timer is dropped unstopped does.
    pub(crate) fn end(self, outcome: &std::io::Result<crate::proto::handshake::Outcome>) {
        use crate::proto::handshake::{HandshakeError, Outcome};
        match outcome {
            Ok(Outcome::Smc { .. } | Outcome::Fallback { .. }) => self.completed(),
            Ok(Outcome::Failed(HandshakeError::Eof)) => drop(self),
            Ok(Outcome::Failed(_)) | Err(_) => self.failed(),
        }
    }

    fn failed(mut self) {
        self.done = true;
        self.counters.lane().handshakes_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// The handshake ended with an outcome (SMC or a decline): it completed.
    fn completed(mut self) {
        self.done = true;
        let c = self.counters.lane();
        c.handshakes_completed.fetch_add(1, Ordering::Relaxed);
        let t = self.start.elapsed();
        let b = HANDSHAKE_BUCKETS.iter().position(|&limit| t <= limit).unwrap_or(HANDSHAKE_BUCKETS.len());
        c.handshake_hist[b].fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for HandshakeTimer {
    fn drop(&mut self) {
        // Maybe on another thread than the start: lanes wrap (see `Counters::gauge`).
        let c = self.counters.lane();
        c.handshakes_in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.done {
            c.handshakes_abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Connections of one role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoleStats {
    /// Over shared memory.
    pub smc_d: u64,
    /// Over RDMA.
    pub smc_r: u64,
    /// Over the kernel's SMC-D (an `AF_SMC` socket).
    pub kernel_smc_d: u64,
    /// Over the kernel's SMC-R (an `AF_SMC` socket).
    pub kernel_smc_r: u64,
    /// Over TCP (all fallback reasons).
    pub tcp: u64,
    /// TCP because SMC was off by policy.
    pub fallback_disabled: u64,
    /// TCP because the peer does not speak SMC.
    pub fallback_peer_no_smc: u64,
    /// TCP because the server was in the negative cache.
    pub fallback_negative_cache: u64,
    /// TCP because the client sent nothing before the peek timeout.
    pub fallback_client_silent: u64,
    /// TCP after this side declined.
    pub fallback_declined_local: u64,
    /// TCP after the peer declined.
    pub fallback_declined_peer: u64,
    /// TCP because SMC was not proposed (client: no door, not an in-band peer).
    pub fallback_not_proposed: u64,
    /// TCP on an `AF_SMC` socket, for a reason of the kernel's (see [`KernelStats`]).
    pub fallback_kernel: u64,
}

impl RoleStats {
    /// All connections of the role.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::RoleStats;
    ///
    /// let r = RoleStats { smc_d: 3, smc_r: 1, tcp: 2, fallback_peer_no_smc: 2, ..Default::default() };
    /// assert_eq!(r.total(), 6); // the fallback counters break `tcp` down; they are not added
    /// assert_eq!(smc_tokio::stats().client.total(), 0); // no connection made yet
    /// ```
    pub fn total(&self) -> u64 {
        self.smc_d + self.smc_r + self.kernel_smc_d + self.kernel_smc_r + self.tcp
    }
}

/// A snapshot of the process-wide counters, from [`stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Connections this process made (`SmcStream::connect`).
    pub client: RoleStats,
    /// Connections this process accepted (`SmcListener::accept`).
    pub server: RoleStats,
    /// Declines sent, by reason (index: [`DeclineReason`] wire value - 1).
    pub declines_sent: [u64; REASONS],
    /// Declines received, by reason.
    pub declines_received: [u64; REASONS],
    /// Handshakes running now.
    pub handshakes_in_flight: u64,
    /// Handshakes that reached an outcome (SMC or a decline).
    pub handshakes_completed: u64,
    /// Handshakes that ended with an error short of an outcome: no answer in time, a message
    /// that made no sense, a channel that failed. Their connections are TCP (or, for a client
    /// whose Confirm went out, fail: see the commit point in the crate docs).
    pub handshakes_failed: u64,
    /// Handshakes given up before an outcome: the connect was cancelled (its future dropped),
    /// the listener or its runtime closed, or the other end closed the channel the handshake
    /// ran on (a cancelled connect's registration, a listener that went away).
    pub handshakes_abandoned: u64,
    /// Completed handshakes by duration: `<= HANDSHAKE_BUCKETS[i]`, then above the last.
    pub handshake_time: [u64; 7],
    /// Bytes written by applications: smc-d, smc-r, tcp.
    pub bytes_sent: [u64; 3],
    /// Bytes read by applications: smc-d, smc-r, tcp.
    pub bytes_received: [u64; 3],
    /// Live link groups.
    pub link_groups: u64,
    /// Link groups that outlived the runtime that drove them and moved to the rescue driver
    /// (their connections belonged to other runtimes, or still could).
    pub link_groups_rescued: u64,
    /// Tasks that wait on a shared-memory link group's doorbell on a runtime other than the one
    /// that drives the group, for that runtime's connections on it (a connection needs its own
    /// runtime to run, and no other). One per such runtime and group, from that runtime's first
    /// connection on the group until the task ends: when it runs after the group ended, or
    /// when its runtime drops it.
    pub link_group_co_drivers: u64,
    /// TCP sockets of shared-memory connections that the application closed, held open until
    /// the peer closes its end too, when the last of the two resets the TCP connection instead
    /// of a FIN exchange (no `TIME_WAIT` on either end). At most a sixteenth of the process's
    /// descriptor limit, and 1024.
    pub tcp_held: u64,
    /// RMB memory in use, in bytes.
    pub rmb_bytes: u64,
    /// Times a shared-memory ring grew (RMB autotuning: a writer filled its ring and the
    /// process budget allowed a larger one).
    pub rmb_grown: u64,
    /// Servers that adaptive fallback stopped proposing to.
    pub adaptive_fallbacks: u64,
    /// Handshakes in which this side could not offer (client) or accept (server) RDMA, by why:
    /// switched off, libibverbs not loadable, no RDMA device, no active RoCE port with a GID for
    /// the connection's local address. Counted only when the crate is built with `rdma`.
    pub rdma_unavailable: [u64; 4],
    /// Same-host registrations at listeners' doors: made (client), matched to a connection
    /// (server: told to propose), answered "no SMC" (server), given up waiting for a verdict
    /// (client), and door connections, door owners and side-channel connections refused
    /// (either side: credentials not trusted, or, on a side channel, nobody waiting for that
    /// process or too many waiting already).
    pub door: [u64; 5],
    /// Door connections clients opened: one per listener, runtime and context, reused by every
    /// registration after the first (so far fewer than `door[0]`, the registrations).
    pub door_connections: u64,
    /// Door frames (registrations, handshake messages, answers, cancels) this process sent,
    /// either end, and the messages that carried them: what one turn of a runtime says on a
    /// door connection goes out in one message, so under many connections at once there are
    /// far fewer messages than frames.
    pub door_frames_sent: u64,
    /// See [`door_frames_sent`](Self::door_frames_sent).
    pub door_messages_sent: u64,
    /// Late handshake messages (a Proposal after the server stopped waiting, or the answer to
    /// an Accept it timed out on) taken off TCP streams before the application's bytes.
    pub late_messages: u64,
    /// Times a TCP stream's first bytes were a strict prefix of a handshake message and were
    /// held back, up to 50 ms, for the rest (clients on other hosts only: a same-host client's
    /// bytes are never held for a timer).
    pub partial_waits: u64,
    /// SMC connections that moved back to their TCP socket mid-stream, losing nothing
    /// (`[0]`), and moves that failed (`[1]`: the TCP connection broke during the exchange, or
    /// the peer's frame was invalid).
    pub handbacks: [u64; 2],
    /// Doorbells of shared-memory links: rung for the peer (`[0]`: a system call and, for a
    /// peer asleep, a wake-up), and rings that woke a link of ours (`[1]`). A doorbell is rung
    /// only for a peer that armed it before sleeping, so these count the wake-ups SMC-D paid.
    pub doorbells: [u64; 2],
    /// The kernel's SMC (`AF_SMC` sockets, see [`kernel`](crate::kernel)).
    pub kernel: KernelStats,
    /// Descriptors from other processes, closed off the runtime.
    pub closer: CloserStats,
}

/// Descriptors that other processes had a hand in (door and side-channel connections,
/// descriptors they sent), which the crate closes on closer threads, never
/// on a runtime worker: such a close can block (a lingering TCP socket, a Unix socket with
/// descriptors queued in it). Before closing, a closer takes out what is queued in Unix
/// sockets and turns every socket's linger off.
///
/// # Examples
///
/// ```
/// let c = smc_tokio::stats().closer;
/// println!("closed {}, found queued {}, stuck closes {}", c.closed, c.drained, c.stalls);
/// assert!(c.threads <= 16);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloserStats {
    /// Descriptors closed, those found queued inside Unix sockets included.
    pub closed: u64,
    /// Descriptors found queued inside Unix sockets about to be closed (every one of them was
    /// put there by another process).
    pub drained: u64,
    /// Times every closer was stuck in one close and another closer was started.
    pub stalls: u64,
    /// Closer threads running now (at most 16).
    pub threads: u64,
    /// Descriptors waiting to be closed now.
    pub queued: u64,
    /// The closers are congested now: every one of them is stuck in a close (a file whose
    /// close waits for a FUSE daemon, say) or many descriptors wait. Meanwhile doors and side
    /// channels take no connection in which a peer could have queued descriptors, and no new
    /// same-host link group is set up: a connection that would need one stays TCP, while
    /// connections over groups that exist go on over shared memory.
    pub congested: bool,
}

/// What became of connections on the kernel's `AF_SMC` sockets, from the kernel's `smc_diag`,
/// and of sockets that could not be `AF_SMC`.
///
/// # Examples
///
/// ```
/// let k = smc_tokio::stats().kernel;
/// println!("kernel smc-r {}, smc-d {}, fallback {}", k.smc_r, k.smc_d, k.fallback);
/// for (code, n) in &k.fallback_reasons {
///     println!("  {n} x {}", smc_tokio::kernel::KernelFallback { reason: *code, peer_diagnosis: 0 });
/// }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KernelStats {
    /// Connections the kernel moved to SMC-R.
    pub smc_r: u64,
    /// Connections the kernel moved to SMC-D.
    pub smc_d: u64,
    /// Connections the kernel kept on TCP (this crate's own establishment may still have moved
    /// them: an smc-tokio peer on this host gets this crate's SMC-D).
    pub fallback: u64,
    /// Connections whose mode the kernel did not report (`smc_diag` unavailable).
    pub unknown: u64,
    /// Kernel fallbacks by the kernel's reason code (`SMC_CLC_DECL_*`), in code order.
    pub fallback_reasons: Vec<(u32, u64)>,
    /// Sockets that the settings wanted as `AF_SMC` but are plain TCP, by why (the index is
    /// [`KernelUnavailable::index`](crate::kernel::KernelUnavailable::index)): the module not
    /// loaded (mode `auto`), no `AF_SMC` in the kernel, `socket(2)` failed otherwise.
    pub unavailable: [u64; 3],
    /// Bytes written by applications over the kernel's SMC.
    pub bytes_sent: u64,
    /// Bytes read by applications over the kernel's SMC.
    pub bytes_received: u64,
}

/// Counts a handshake without RDMA, by reason index (see [`Stats::rdma_unavailable`]).
impl Counters {
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn rdma_unavailable(&self, index: usize) {
        if let Some(c) = self.lane().rdma_unavailable.get(index) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A snapshot of the process-wide counters. Each counter is read once, not all at one instant:
/// counters that change during the call may disagree with one another by what changed, and a
/// gauge (`handshakes_in_flight`, `link_groups`) may read one off while it changes.
///
/// # Examples
///
/// ```
/// let s = smc_tokio::stats();
/// println!("{s}");
/// assert!(s.server.total() >= s.server.smc_d);
/// ```
pub fn stats() -> Stats {
    Counters::process().snapshot(crate::config::RmbBudget::process())
}

impl Counters {
    /// A snapshot, with `budget`'s memory in use.
    pub(crate) fn snapshot(&self, budget: &crate::config::RmbBudget) -> Stats {
        Stats {
            client: self.role(|l| &l.client),
            server: self.role(|l| &l.server),
            declines_sent: self.sums(|l| &l.declines_sent),
            declines_received: self.sums(|l| &l.declines_received),
            handshakes_in_flight: self.gauge(|l| &l.handshakes_in_flight),
            handshakes_completed: self.sum(|l| &l.handshakes_completed),
            handshakes_failed: self.sum(|l| &l.handshakes_failed),
            handshakes_abandoned: self.sum(|l| &l.handshakes_abandoned),
            handshake_time: self.sums(|l| &l.handshake_hist),
            bytes_sent: self.sums(|l| &l.bytes_sent),
            bytes_received: self.sums(|l| &l.bytes_received),
            link_groups: self.gauge(|l| &l.link_groups),
            link_groups_rescued: self.sum(|l| &l.link_groups_rescued),
            link_group_co_drivers: self.gauge(|l| &l.co_drivers),
            tcp_held: self.gauge(|l| &l.tcp_held),
            rmb_bytes: budget.in_use(),
            adaptive_fallbacks: self.sum(|l| &l.adaptive_fallbacks),
            rmb_grown: self.sum(|l| &l.rmb_grown),
            rdma_unavailable: self.sums(|l| &l.rdma_unavailable),
            door: self.sums(|l| &l.door),
            late_messages: self.sum(|l| &l.late_messages),
            door_connections: self.sum(|l| &l.door_connections),
            door_frames_sent: self.sum(|l| &l.door_frames),
            door_messages_sent: self.sum(|l| &l.door_messages),
            partial_waits: self.sum(|l| &l.partial_waits),
            handbacks: self.sums(|l| &l.handbacks),
            doorbells: self.sums(|l| &l.doorbells),
            kernel: self.kernel(),
            closer: {
                let k = crate::sys::closer_stats();
                CloserStats {
                    closed: k.closed,
                    drained: k.drained,
                    stalls: k.stalls,
                    threads: k.threads,
                    queued: k.queued,
                    congested: k.congested,
                }
            },
        }
    }
}

impl Counters {
    fn kernel(&self) -> KernelStats {
        let reasons = self.kernel_reasons.lock().unwrap_or_else(|e| e.into_inner());
        KernelStats {
            smc_r: self.sum(|l| &l.kernel.smc_r),
            smc_d: self.sum(|l| &l.kernel.smc_d),
            fallback: self.sum(|l| &l.kernel.fallback),
            unknown: self.sum(|l| &l.kernel.unknown),
            fallback_reasons: reasons.iter().map(|(c, n)| (*c, *n)).collect(),
            unavailable: self.sums(|l| &l.kernel.unavailable),
            bytes_sent: self.sum(|l| &l.kernel.bytes_sent),
            bytes_received: self.sum(|l| &l.kernel.bytes_received),
        }
    }

    fn role(&self, pick: impl Fn(&Lane) -> &Role) -> RoleStats {
        let f = self.sums(|l| &pick(l).fallbacks);
        RoleStats {
            smc_d: self.sum(|l| &pick(l).smc_d),
            smc_r: self.sum(|l| &pick(l).smc_r),
            kernel_smc_d: self.sum(|l| &pick(l).kernel_smc_d),
            kernel_smc_r: self.sum(|l| &pick(l).kernel_smc_r),
            tcp: self.sum(|l| &pick(l).tcp),
            fallback_disabled: f[0],
            fallback_peer_no_smc: f[1],
            fallback_negative_cache: f[2],
            fallback_client_silent: f[3],
            fallback_declined_local: f[4],
            fallback_declined_peer: f[5],
            fallback_not_proposed: f[6],
            fallback_kernel: f[7],
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, r) in [("client", &self.client), ("server", &self.server)] {
            writeln!(
                f,
                "{name}: {} connections: smc-d {}, smc-r {}, kernel smc-d {}, kernel smc-r {}, tcp {} (disabled {}, peer no smc {}, negative cache {}, client silent {}, declined locally {}, declined by peer {}, not proposed {}, kernel {})",
                r.total(),
                r.smc_d,
                r.smc_r,
                r.kernel_smc_d,
                r.kernel_smc_r,
                r.tcp,
                r.fallback_disabled,
                r.fallback_peer_no_smc,
                r.fallback_negative_cache,
                r.fallback_client_silent,
                r.fallback_declined_local,
                r.fallback_declined_peer,
                r.fallback_not_proposed,
                r.fallback_kernel
            )?;
        }
        let reasons = |a: &[u64; REASONS]| {
            DeclineReason::ALL
                .iter()
                .zip(a)
                .filter(|(_, n)| **n > 0)
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(
            f,
            "declines sent: [{}]; received: [{}]",
            reasons(&self.declines_sent),
            reasons(&self.declines_received)
        )?;
        let h = &self.handshake_time;
        writeln!(
            f,
            "handshakes: {} in flight, {} completed, {} failed, {} abandoned; time <=50us {}, <=200us {}, <=1ms {}, <=10ms {}, <=100ms {}, <=1s {}, >1s {}",
            self.handshakes_in_flight,
            self.handshakes_completed,
            self.handshakes_failed,
            self.handshakes_abandoned,
            h[0],
            h[1],
            h[2],
            h[3],
            h[4],
            h[5],
            h[6]
        )?;
        let d = &self.door;
        writeln!(
            f,
            "doors: {} registered over {} door connections, {} matched, {} no smc, {} timed out, {} refused; {} frames sent in {} messages; late handshake messages taken: {}, partial prefixes held: {}",
            d[0], self.door_connections, d[1], d[2], d[3], d[4], self.door_frames_sent, self.door_messages_sent, self.late_messages, self.partial_waits
        )?;
        writeln!(
            f,
            "moved to tcp mid-stream: {} ({} failed); doorbells rung {}, woken by {}",
            self.handbacks[0], self.handbacks[1], self.doorbells[0], self.doorbells[1]
        )?;
        let c = &self.closer;
        writeln!(
            f,
            "peer descriptors: {} closed, {} found queued, {} stuck closes, {} closers, {} waiting{}",
            c.closed,
            c.drained,
            c.stalls,
            c.threads,
            c.queued,
            if c.congested { " (congested: none taken from peers)" } else { "" }
        )?;
        write!(
            f,
            "bytes sent/received: smc-d {}/{}, smc-r {}/{}, tcp {}/{}; link groups {} (co-drivers {}); tcp held for peers' closes {}; rmb memory {} B, grown {}; adaptive fallbacks {}; no rdma: off {}, no lib {}, no device {}, no port {}",
            self.bytes_sent[0],
            self.bytes_received[0],
            self.bytes_sent[1],
            self.bytes_received[1],
            self.bytes_sent[2],
            self.bytes_received[2],
            self.link_groups,
            self.link_group_co_drivers,
            self.tcp_held,
            self.rmb_bytes,
            self.rmb_grown,
            self.adaptive_fallbacks,
            self.rdma_unavailable[0],
            self.rdma_unavailable[1],
            self.rdma_unavailable[2],
            self.rdma_unavailable[3]
        )?;
        let k = &self.kernel;
        let reasons = k.fallback_reasons.iter().map(|(c, n)| format!("{c:#010x} {n}")).collect::<Vec<_>>().join(", ");
        write!(
            f,
            "\nkernel smc: smc-r {}, smc-d {}, fallback {} [{}], unknown {}; bytes sent/received {}/{}; not AF_SMC: module not loaded {}, no AF_SMC {}, socket failed {}",
            k.smc_r,
            k.smc_d,
            k.fallback,
            reasons,
            k.unknown,
            k.bytes_sent,
            k.bytes_received,
            k.unavailable[0],
            k.unavailable[1],
            k.unavailable[2]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads_add_up_and_gauges_come_down_on_other_threads() {
        let c = std::sync::Arc::new(Counters::default());
        // More threads than lanes, so that lanes are shared as well as apart.
        let threads = lane_count() + 3;
        let ups: Vec<_> = (0..threads)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.bytes(Transport::SmcD, true, i + 1);
                        c.doorbell(true);
                    }
                    c.link_group_up();
                    HandshakeTimer::start(&c)
                })
            })
            .collect();
        let timers: Vec<HandshakeTimer> = ups.into_iter().map(|t| t.join().unwrap()).collect();
        let s = c.snapshot(&crate::config::RmbBudget::new());
        let want: u64 = (1..=threads as u64).map(|n| n * 1000).sum();
        assert_eq!(s.bytes_sent[0], want);
        assert_eq!(s.doorbells[0], 1000 * threads as u64);
        assert_eq!((s.link_groups, s.handshakes_in_flight), (threads as u64, threads as u64));
        // Down on threads other than the ones that went up (and on other lanes).
        let downs: Vec<_> = timers
            .into_iter()
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    c.link_group_down();
                    t.completed();
                })
            })
            .collect();
        for d in downs {
            d.join().unwrap();
        }
        let s = c.snapshot(&crate::config::RmbBudget::new());
        assert_eq!((s.link_groups, s.handshakes_in_flight), (0, 0));
        assert_eq!(s.handshakes_completed, threads as u64);
        assert_eq!(s.handshake_time.iter().sum::<u64>(), threads as u64);
        assert_eq!(s.bytes_sent[0], want);
    }

    #[test]
    fn a_lane_is_the_size_the_docs_say() {
        assert_eq!(std::mem::size_of::<Lane>(), 768);
    }

    #[test]
    fn a_gauge_that_only_came_down_reads_zero() {
        let c = Counters::default();
        c.link_group_down();
        assert_eq!(c.snapshot(&crate::config::RmbBudget::new()).link_groups, 0);
        c.link_group_up();
        c.link_group_up();
        assert_eq!(c.snapshot(&crate::config::RmbBudget::new()).link_groups, 1);
    }
}
