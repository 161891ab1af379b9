//! A link group: the link between two processes (or two RDMA ports) and the connections that
//! share it, with the driver task that waits on the link's completion source and dispatches CDC
//! messages to connections.

use crate::hash::Map as HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::config::ShmConfig;
use crate::link::{Link, LinkError};
use crate::proto::cdc::{CdcMsg, CDC_MSG_LEN};
use crate::proto::clc::DeclineReason;
use crate::proto::clc::Secret;
use crate::proto::cursor::RingSize;
use crate::smc::conn::SmcConn;
use crate::smc::manager::Manager;

/// Frames taken from the link per receive call.
const RECV_BATCH: usize = 64;
/// Receive calls per dispatch round before the driver yields to other tasks: bounds the work
/// one doorbell can cause (a peer that floods its ring gets 4 x 64 frames per turn).
const ROUNDS_PER_TURN: usize = 4;
/// Receive calls a final drain ([`LinkGroup::drain`]) makes at most: 32 x 64 frames, twice the
/// largest CDC ring a region may have (`MAX_CDC_SLOTS`, which a peer's header is checked
/// against) and 16 times the RDMA receive queue. What the peer had published when the drain
/// began is in the ring then, one lap at most, and is taken first (frames are taken in order),
/// so one lap empties it, and the second is margin (receives that find the link busy count
/// apart, [`DRAIN_BUSY`]). A peer that is still there and keeps its ring full holds each drain
/// for those two laps: with 16 (a drain per connection whose TCP connection ends), closing
/// many connections at once held the runtime's threads sixteen times as long.
const DRAIN_ROUNDS: usize = 32;
/// Receive calls of a final drain that find the link's receive state busy (an RDMA link's
/// completion poll, held by its driver an instant), counted apart from [`DRAIN_ROUNDS`] and
/// yielded between: as many as a drain made in all before rounds were bounded to two laps.
const DRAIN_BUSY: usize = 256;
const _: () = assert!(DRAIN_ROUNDS * RECV_BATCH >= 2 * crate::link::shm::region::MAX_CDC_SLOTS as usize);

/// Nanoseconds since a process-wide origin: the clock of the polling deadlines, which live in
/// atomics.
pub(crate) fn clock_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    u64::try_from(ORIGIN.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// How long a group has had no connection before [`LinkGroup::end_if_idle`] may end it: the
/// last connection's close, posted as it was forgotten, has reached the peer by then on any
/// fabric we run (the soft-RoCE guests' round trip is about 2 ms), so the peer sees an orderly
/// close and not a link that went away under it.
const IDLE_BEFORE_ENDED: Duration = Duration::from_secs(1);

/// The shortest wait between two looks of a group's timer at whether it is idle: a group whose
/// idle timeout is shorter (0: end it as soon as it has no connection) is ended within this of
/// its last connection's end. Without a floor, a timeout of 0 re-armed the timer at once, and
/// the group's driver woke about 1000 times a second (tokio's timer granularity) for as long as
/// a connection lived; 20 looks a second are nothing beside a connection's own wake-ups.
const IDLE_LOOK_MIN: Duration = Duration::from_millis(50);

/// The longest a group's task for released connections waits between looks
/// ([`LinkGroup::watch_lingering`]): a connection released after a look may have a shorter
/// bound than the one the task sleeps for, and is forgotten at most this late. A look costs a
/// lock of each connection of the group, a few microseconds a second.
const LINGER_LOOK_MAX: Duration = Duration::from_secs(1);

/// Which side created the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Server,
}

struct GroupState {
    conns: HashMap<u32, Arc<SmcConn>>,
    free: Vec<u16>,
    generation: Vec<u16>,
    dead: Option<LinkError>,
    idle_since: Option<Instant>,
    join_secrets: Vec<Secret>,
    /// Ring bytes charged to the process budget per slot: the first size when allocated, more
    /// as its ring grows, 0 when free (and always 0 where the link charges what it pins:
    /// [`TxRmbs::charged_per_slot`]).
    charged: Vec<u32>,
}

/// A reader's right to spin (see [`LinkGroup::spin_slot`]); given back when dropped.
pub(crate) struct SpinSlot<'a>(&'a AtomicBool);

impl Drop for SpinSlot<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What the dispatch lock guards: the batch of frames taken from the link, and the connection
/// the last one went to.
struct Dispatch {
    frames: Vec<[u8; CDC_MSG_LEN]>,
    /// The last frame's token and connection (weak: the cache keeps no connection alive).
    last: Option<(u32, Weak<SmcConn>)>,
}

/// Where a group is driven: by its own driver on `home` (the runtime that set it up; `None`
/// before that, and once the rescue driver, whose thread always runs, took over), and by a
/// co-driver on each other runtime that made connections on it.
#[derive(Default)]
struct Drivers {
    home: Option<tokio::runtime::Id>,
    co: Vec<CoDriver>,
}

/// A co-driver: its runtime, its waker while it waits (woken when the group ends), and its
/// watch on the link, which the group holds (the task only borrows it for each poll): it goes
/// (its duplicate descriptor closed) when the group ends, whether or not that runtime runs then.
struct CoDriver {
    rt: tokio::runtime::Id,
    waker: Option<Waker>,
    watch: Option<Arc<crate::link::Watch>>,
}

pub(crate) struct LinkGroup {
    pub(crate) id: u64,
    pub(crate) role: Role,
    /// Size the RMBs in our region (the peer's receive rings) start at.
    pub(crate) tx_rmb_size: u32,
    /// Size of each RMB slot in our region: the most a ring may grow to (RMB autotuning; the
    /// same as `tx_rmb_size` where rings do not grow).
    pub(crate) tx_rmb_capacity: u32,
    /// Whether each allocated slot is charged to the budget here ([`TxRmbs::charged_per_slot`]).
    charged_per_slot: bool,
    link: OnceLock<Arc<dyn Link>>,
    state: Mutex<GroupState>,
    cdc_waiters: Mutex<Vec<Weak<SmcConn>>>,
    /// Whether `cdc_waiters` may hold a connection: set with a push (under the lock), cleared
    /// when they are taken (under the lock). `progress`, which every reader runs on each poll,
    /// reads it instead of taking the lock when nobody waits for CDC space (the usual case).
    cdc_waiting: AtomicBool,
    /// Held while frames are taken from the link and dispatched, so that a connection sees its
    /// messages in order even when several tasks (on several threads) call `progress`.
    dispatch: Mutex<Dispatch>,
    /// How many connections the group has (`conns.len()`), written under the group's lock and
    /// read without it: a hint for [`alone`](Self::alone).
    conns_open: std::sync::atomic::AtomicUsize,
    /// CDC frames dispatched so far, by any caller of `progress` (a busy-polling driver takes
    /// frames that readers drained themselves as traffic too). Relaxed: a hint.
    frames_seen: AtomicU64,
    /// Frames readers took for their own connections ([`dispatch_own`](Self::dispatch_own)).
    #[cfg(test)]
    pub(crate) own_frames: AtomicU64,
    /// A reader of the group spins for frames now (busy polling; [`spin_slot`](Self::spin_slot)).
    spinning: AtomicBool,
    idle_timeout: Duration,
    /// Group polling: after the driver dispatched work, it keeps looking at the link (runnable,
    /// the doorbell disarmed) for this long before it arms the doorbell and sleeps (0: never).
    poll_window: Duration,
    /// Set once the driver ran its teardown; the manager forgets dead groups.
    finished: AtomicBool,
    /// Woken when the group is established or fails.
    changed: tokio::sync::Notify,
    /// Handshakes whose proposal names this group: while any is running, the idle timer leaves
    /// the group alone.
    pins: std::sync::atomic::AtomicUsize,
    manager: Arc<Manager>,
    /// Adaptive polling: until this time ([`clock_ns`]) a reader of this group polls the link
    /// itself, so the driver leaves the doorbell disarmed (the peer sends without ringing).
    poll_until: AtomicU64,
    /// The driver left the doorbell disarmed for polling readers: when the last of them stops,
    /// or a reader goes to sleep with none polling, the driver is woken to arm again.
    unarmed: AtomicBool,
    /// A task looks after the connections released with their peers' answers to come
    /// ([`watch_lingering`](Self::watch_lingering)).
    sweeping: AtomicBool,
    /// Readers polling now. While any polls, it drains the link for every connection of the
    /// group, so sleeping readers need no doorbell. (The deadline in `poll_until` bounds what a
    /// count left behind by a reader that stopped mid-poll can do.)
    pollers: std::sync::atomic::AtomicUsize,
    /// The driver's waker while it waits.
    driver_waker: Mutex<Option<Waker>>,
    /// Which runtime drives the group, and the co-drivers of other runtimes ([`drive_here`](Self::drive_here)).
    drivers: Mutex<Drivers>,
    /// Looks of the idle timer ([`idle_check`](Self::idle_check)), for tests.
    #[cfg(test)]
    idle_looks: AtomicU64,
}

/// The RMBs of a group's region, the peer's receive rings, which we write into.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxRmbs {
    /// Slots: connections the group may hold at once.
    pub(crate) count: u32,
    /// Size each ring starts at.
    pub(crate) size: u32,
    /// Size each ring may grow to (RMB autotuning).
    pub(crate) capacity: u32,
    /// Whether the group charges each slot it allocates to the context's RMB budget, and each
    /// ring's growth: on shared memory, where our region holds these rings and nothing else
    /// of ours per connection. Not on verbs, whose link charges the memory it registers
    /// (pins) for both its pools, ours to receive into and these, by the chunk, for as long
    /// as it is registered (`link::verbs::Rmbs`).
    pub(crate) charged_per_slot: bool,
}

impl TxRmbs {
    /// Rings in a shared-memory region, charged by the slot.
    pub(crate) fn shm(count: u32, size: u32, capacity: u32) -> TxRmbs {
        TxRmbs { count, size, capacity, charged_per_slot: true }
    }

    /// Send buffers of a verbs link, which never grow and which the link charges.
    #[cfg(feature = "rdma")]
    pub(crate) fn verbs(count: u32, size: u32) -> TxRmbs {
        TxRmbs { count, size, capacity: size, charged_per_slot: false }
    }
}

/// A link group's clocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupTimes {
    /// How long the group lives without connections.
    pub(crate) idle_timeout: Duration,
    /// Its driver's polling budget between batches of work (the adaptive polling budget).
    pub(crate) poll_window: Duration,
}

/// Keeps a link group from idling out while a handshake that names it runs.
#[derive(Debug)]
pub(crate) struct GroupPin(Arc<LinkGroup>);

impl Drop for GroupPin {
    fn drop(&mut self) {
        let g = &self.0;
        if g.pins.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The idle clock restarts from the last handshake that named it.
            let mut st = g.lock();
            if st.conns.is_empty() && st.idle_since.is_some() {
                st.idle_since = Some(Instant::now());
            }
        }
    }
}

impl fmt::Debug for LinkGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkGroup").field("id", &self.id).field("role", &self.role).finish()
    }
}

impl LinkGroup {
    pub(crate) fn new(id: u64, role: Role, rmbs: TxRmbs, times: GroupTimes, manager: Arc<Manager>) -> Arc<LinkGroup> {
        let GroupTimes { idle_timeout, poll_window } = times;
        let n = rmbs.count.min(1 << 16) as usize;
        Arc::new(LinkGroup {
            id,
            role,
            tx_rmb_size: rmbs.size,
            tx_rmb_capacity: rmbs.capacity.max(rmbs.size),
            charged_per_slot: rmbs.charged_per_slot,
            link: OnceLock::new(),
            state: Mutex::new(GroupState {
                conns: HashMap::default(),
                // Hand out low slots first (pop from the back).
                free: (0..n as u32).rev().map(|s| s as u16).collect(),
                generation: vec![0; n],
                dead: None,
                idle_since: Some(Instant::now()),
                join_secrets: Vec::new(),
                charged: vec![0; n],
            }),
            cdc_waiters: Mutex::new(Vec::new()),
            cdc_waiting: AtomicBool::new(false),
            dispatch: Mutex::new(Dispatch { frames: Vec::with_capacity(RECV_BATCH), last: None }),
            conns_open: std::sync::atomic::AtomicUsize::new(0),
            frames_seen: AtomicU64::new(0),
            #[cfg(test)]
            own_frames: AtomicU64::new(0),
            spinning: AtomicBool::new(false),
            idle_timeout,
            poll_window,
            finished: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
            pins: std::sync::atomic::AtomicUsize::new(0),
            manager,
            poll_until: AtomicU64::new(0),
            unarmed: AtomicBool::new(false),
            sweeping: AtomicBool::new(false),
            pollers: std::sync::atomic::AtomicUsize::new(0),
            driver_waker: Mutex::new(None),
            drivers: Mutex::new(Drivers::default()),
            #[cfg(test)]
            idle_looks: AtomicU64::new(0),
        })
    }

    /// Pins the group for the life of the returned guard (see [`GroupPin`]).
    pub(crate) fn pin(self: &Arc<Self>) -> GroupPin {
        self.pins.fetch_add(1, Ordering::AcqRel);
        GroupPin(self.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The link, once established.
    pub(crate) fn link(&self) -> Option<&Arc<dyn Link>> {
        self.link.get()
    }

    /// The manager (of the context) that owns this group.
    pub(crate) fn manager(&self) -> &Arc<Manager> {
        &self.manager
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.lock().dead.is_none()
    }

    /// Whether a connection could be opened on it now: alive, with a free RMB slot. A hint
    /// (another handshake may take the slot first), for choosing among groups.
    pub(crate) fn has_room(&self) -> bool {
        let st = self.lock();
        st.dead.is_none() && !st.free.is_empty()
    }

    /// Whether it carries connections now (so its idle timer is not running on either side).
    pub(crate) fn in_use(&self) -> bool {
        !self.lock().conns.is_empty()
    }

    pub(crate) fn is_established(&self) -> bool {
        self.link.get().is_some() && self.is_alive()
    }

    /// Waits until the group is established (true) or failed, or `timeout` passed (false). The
    /// server needs it for a client whose Confirm overtakes the end of its join: the client
    /// has the WELCOME, but our join task may not have installed the link yet.
    pub(crate) async fn wait_established(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change between the check and the wait wakes us.
            notified.as_mut().enable();
            if self.is_established() {
                return true;
            }
            if !self.is_alive() {
                return false;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.is_established();
            }
        }
    }

    /// Records a handshake token that may be presented to join this (pending) group.
    pub(crate) fn add_join_secret(&self, secret: Secret) {
        let mut st = self.lock();
        // Bounded: a pending group accepts at most one token per RMB slot.
        if st.join_secrets.len() < st.generation.len() {
            st.join_secrets.push(secret);
        }
    }

    pub(crate) fn has_join_secret(&self, secret: Secret) -> bool {
        self.lock().join_secrets.contains(&secret)
    }

    /// Allocates an RMB slot in our region: the token `generation << 16 | slot`.
    pub(crate) fn alloc_slot(&self) -> Option<u32> {
        let mut st = self.lock();
        if st.dead.is_some() {
            return None;
        }
        let slot = st.free.pop()?;
        let charge = if self.charged_per_slot { self.tx_rmb_size } else { 0 };
        // (Nothing to charge is no charge: a budget whose cap was cut below its use refuses
        // even 0 bytes.)
        if charge > 0 && !self.manager.charge_rmb(u64::from(charge)) {
            st.free.push(slot);
            return None;
        }
        st.charged[usize::from(slot)] = charge;
        // Not idle any more: the idle timer must not tear the group down under this slot.
        st.idle_since = None;
        let g = st.generation[usize::from(slot)];
        Some(u32::from(g) << 16 | u32::from(slot))
    }

    /// Frees the slot of `token`; returns whether its ring had grown (so its pages beyond the
    /// first size should go back to the kernel).
    fn free_slot(&self, st: &mut GroupState, token: u32) -> bool {
        let slot = (token & 0xFFFF) as usize;
        if slot < st.generation.len() && u32::from(st.generation[slot]) == token >> 16 {
            st.generation[slot] = st.generation[slot].wrapping_add(1);
            st.free.push(slot as u16);
            let charged = std::mem::take(&mut st.charged[slot]);
            self.manager.uncharge_rmb(u64::from(charged));
            return charged > self.tx_rmb_size;
        }
        false
    }

    /// Charges the process budget for growing the ring of `token` to `size` bytes; `false`
    /// when the budget (or the slot's capacity) does not allow it.
    pub(crate) fn grow_slot(&self, token: u32, size: u32) -> bool {
        if size > self.tx_rmb_capacity {
            return false;
        }
        let mut st = self.lock();
        let slot = (token & 0xFFFF) as usize;
        if st.dead.is_some() || slot >= st.generation.len() || u32::from(st.generation[slot]) != token >> 16 {
            return false;
        }
        let now = st.charged[slot];
        if self.charged_per_slot && size > now {
            if !self.manager.charge_rmb(u64::from(size - now)) {
                return false;
            }
            st.charged[slot] = size;
            self.manager.counters.rmb_grown();
        }
        true
    }

    /// Connections registered now.
    pub(crate) fn conn_count(&self) -> usize {
        self.lock().conns.len()
    }

    /// Whether the group serves one connection only (a hint, read without the lock).
    pub(crate) fn alone(&self) -> bool {
        self.conns_open.load(Ordering::Relaxed) == 1
    }

    /// Mirrors `conns.len()` into [`conns_open`](Self::conns_open); call under the lock.
    fn count_conns(&self, st: &GroupState) {
        self.conns_open.store(st.conns.len(), Ordering::Relaxed);
    }

    /// Forgets a connection and frees its slot.
    pub(crate) fn unregister(&self, token: u32) {
        self.forget_conn(token, false);
    }

    /// Forgets a connection. Its slot goes back to the group unless `retire`: then it is never
    /// used again by this group (its memory stays, and stays charged, until the group ends),
    /// for a connection that moved to TCP (or failed to), whose peer may hold bytes of the ring
    /// we write into, lent to its application in place, for as long as that application likes
    /// (a peer of our uid over shared memory: [`Link::peer_may_lend`]). One slot per such move,
    /// which is rare.
    pub(crate) fn forget_conn(&self, token: u32, retire: bool) {
        let mut st = self.lock();
        if let Some(conn) = st.conns.remove(&token) {
            conn.forget();
            self.count_conns(&st);
            let grown = !retire && self.free_slot(&mut st, token);
            if let Some(l) = self.link.get() {
                l.conn_closed(token);
                if grown {
                    l.release_tx_rmb(token, self.tx_rmb_size);
                }
            }
        }
        if st.conns.is_empty() && st.idle_since.is_none() {
            st.idle_since = Some(Instant::now());
        }
    }

    /// Allocates an RMB slot and registers a new connection on it, reading from a ring of
    /// `rx_ring` bytes; `peer_token` is `None` on a server until the client's Confirm.
    pub(crate) fn open_conn(
        self: &Arc<Self>,
        peer_token: Option<u32>,
        rx_ring: RingSize,
        cfg: &ShmConfig,
    ) -> Result<Arc<SmcConn>, DeclineReason> {
        let tx_ring = RingSize::new(self.tx_rmb_size).ok_or(DeclineReason::Internal)?;
        let our_token = self.alloc_slot().ok_or(DeclineReason::OutOfMemory)?;
        let conn = SmcConn::new(self.clone(), our_token, peer_token, tx_ring, rx_ring, cfg);
        let mut st = self.lock();
        if st.dead.is_some() {
            // fail() already returned every allocated slot (this one included) to the budget.
            return Err(DeclineReason::Internal);
        }
        st.idle_since = None;
        st.conns.insert(our_token, conn.clone());
        self.count_conns(&st);
        Ok(conn)
    }

    /// Installs the established link and starts the driver task on the current runtime.
    pub(crate) fn establish(self: &Arc<Self>, link: Arc<dyn Link>) -> Result<(), LinkError> {
        {
            // Under the group's lock, as `end` marks it dead: a group that ended before (a
            // handshake that gave up on it while its setup step ran) takes no link, which no
            // teardown would reach; one that ends after finds the link and tears it down.
            let st = self.lock();
            if let Some(e) = &st.dead {
                return Err(e.clone());
            }
            // The driver is spawned below, on this runtime. Named before the link is there: a
            // connection of another runtime that finds the link finds its home too.
            self.drivers().home = tokio::runtime::Handle::try_current().ok().map(|h| h.id());
            if self.link.set(link).is_err() {
                return Err(LinkError::Protocol("link group established twice"));
            }
        }
        self.manager.counters.link_group_up();
        self.changed.notify_waiters();
        let span = tracing::debug_span!("smc_link_group", id = self.id, role = ?self.role);
        tracing::debug!(parent: &span, "link group established");
        let me = self.clone();
        tokio::spawn(tracing::Instrument::instrument(drive(me, false), span));
        Ok(())
    }

    fn drivers(&self) -> std::sync::MutexGuard<'_, Drivers> {
        self.drivers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure a task of the current runtime waits on the link for the group's connections
    /// made on it: the group's own driver where this runtime set the group up (or the rescue
    /// driver has it), else a co-driver of this runtime's, started now if there is none. A
    /// group is shared by every runtime's connections to its peer, and its driver runs where
    /// it was set up; a runtime that lives but does not run (a current-thread runtime whose
    /// thread waits outside `block_on`) would otherwise leave every other runtime's reader
    /// that sleeps on its waker without a wake-up, though its peer's reply is in its ring. With
    /// a co-driver, a connection needs its own runtime to run and no other, as tokio's streams
    /// do. A co-driver waits on a duplicate of the link's doorbell registered with its own
    /// runtime's reactor and dispatches what comes, for the whole group; while it sleeps, the
    /// doorbell stays armed (so a group shared by two running runtimes takes the peer's rings
    /// where its own driver would have polled for frames without them). Links that cannot be
    /// waited on twice (RDMA) get none.
    pub(crate) fn drive_here(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let Some(link) = self.link() else { return };
        let id = rt.id();
        let mut d = self.drivers();
        if d.home.is_none_or(|home| home == id) || d.co.iter().any(|c| c.rt == id) {
            return;
        }
        match link.watch() {
            None => {}
            Some(Err(e)) => {
                tracing::debug!(id = self.id, error = %e, "no co-driver for the link group on this runtime")
            }
            Some(Ok(watch)) => {
                let watch = Arc::new(watch);
                let weak = Arc::downgrade(&watch);
                d.co.push(CoDriver { rt: id, waker: None, watch: Some(watch) });
                drop(d);
                // Counted from here, and uncounted however the task ends (dropped unpolled too).
                let leave = Leave::new(self, id);
                if !self.is_alive() {
                    // It ended meanwhile, perhaps before the entry was there to be taken.
                    return drop(leave);
                }
                let span = tracing::debug_span!("smc_link_group_co_driver", id = self.id, role = ?self.role);
                tracing::debug!(parent: &span, "co-driver started");
                rt.spawn(tracing::Instrument::instrument(co_drive(Arc::downgrade(self), weak, leave), span));
            }
        }
    }

    /// Wakes the group's own driver and its co-drivers (but `except`'s): a waiter that leaves
    /// frames for a later turn of its own, on a runtime that may stop before that turn, hands
    /// them to whichever of the others runs first (each dispatches the whole group). Nothing
    /// to do without co-drivers: the own driver's turn comes, or its runtime's connections do
    /// not need it.
    fn hand_off(&self, except: Option<tokio::runtime::Id>) {
        let wakers: Vec<Waker> = {
            let d = self.drivers();
            if d.co.is_empty() {
                return;
            }
            d.co.iter().filter(|c| Some(c.rt) != except).filter_map(|c| c.waker.clone()).collect()
        };
        wakers.into_iter().for_each(Waker::wake);
        if except.is_some() {
            let own = self.driver_waker.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(w) = own {
                w.wake();
            }
        }
    }

    /// Keeps co-driver `rt`'s waker, for the group's end.
    fn set_co_waker(&self, rt: tokio::runtime::Id, waker: &Waker) {
        let mut d = self.drivers();
        if let Some(c) = d.co.iter_mut().find(|c| c.rt == rt) {
            crate::smc::conn::register(&mut c.waker, waker);
        }
    }

    /// A connection was released with its peer's answer still to come: a task of this runtime
    /// forgets those whose peers stay silent ([`SmcConn::end_if_silent`]), one per group at a
    /// time, which looks when the first of them is due, and at least once a second (a
    /// connection released meanwhile may have a shorter bound), and leaves when none is left.
    /// The group's driver calls this at each look of its idle timer too, on its own runtime: a
    /// release with no runtime started none, and a task whose runtime shut down (the group went
    /// to the rescue driver) left none.
    pub(crate) fn watch_lingering(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        if self.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        /// Lets the next release start a task however this one ends (its runtime shut down),
        /// unless it let go of the flag itself.
        struct Sweeping(Option<Weak<LinkGroup>>);
        impl Drop for Sweeping {
            fn drop(&mut self) {
                if let Some(g) = self.0.take().and_then(|w| w.upgrade()) {
                    g.sweeping.store(false, Ordering::SeqCst);
                }
            }
        }
        let mut me = Sweeping(Some(Arc::downgrade(self)));
        rt.spawn(async move {
            let mut wait = Duration::ZERO;
            loop {
                tokio::time::sleep(wait).await;
                let Some(g) = me.0.as_ref().and_then(Weak::upgrade) else { return };
                if !g.is_alive() {
                    return;
                }
                let mut next = g.end_silent_released();
                if next.is_none() {
                    // None left: the flag goes, then one more look, for a connection released
                    // between the look and the flag (its release found the flag set). Each
                    // side stores, then looks (SeqCst): one of them sees the other.
                    me.0 = None;
                    g.sweeping.store(false, Ordering::SeqCst);
                    next = g.end_silent_released();
                    if next.is_none() || g.sweeping.swap(true, Ordering::SeqCst) {
                        return;
                    }
                    me.0 = Some(Arc::downgrade(&g));
                }
                wait = next.unwrap_or_default().clamp(IDLE_LOOK_MIN, LINGER_LOOK_MAX);
            }
        });
    }

    /// Ends the released connections whose peers stayed silent too long; how long until the
    /// next of the others is due (`None`: none waits for its peer).
    fn end_silent_released(&self) -> Option<Duration> {
        let conns: Vec<Arc<SmcConn>> = self.lock().conns.values().cloned().collect();
        let now = Instant::now();
        conns.iter().filter_map(|c| c.end_if_silent(now)).min()
    }

    /// Adaptive polling: a reader of this group polls the link (on its own task, through
    /// [`progress`](Self::progress)) until `until` ([`clock_ns`]), expecting a reply by then.
    /// The driver, next time it waits, leaves the doorbell disarmed until then.
    pub(crate) fn poll_until(&self, until: u64) {
        self.poll_until.fetch_max(until, Ordering::AcqRel);
    }

    /// A reader starts polling (one wait's worth).
    pub(crate) fn poll_start(&self) {
        self.pollers.fetch_add(1, Ordering::AcqRel);
    }

    /// A reader stops polling: the last one wakes an unarmed driver to arm again. `pollers`
    /// and `unarmed` are a store-then-load pair on each side (here the count, then the flag;
    /// in the driver the flag, then the count), all SeqCst: either the driver sees no reader
    /// polling and arms, or the last reader sees the driver unarmed and wakes it. (With the
    /// driver's flag stored after its look at the count, a reader that stopped in between left
    /// it unarmed until its polling deadline.)
    pub(crate) fn poll_stop(&self) {
        let before = self.pollers.fetch_sub(1, Ordering::SeqCst);
        if before <= 1 {
            if before == 0 {
                // Unbalanced: never below zero.
                self.pollers.store(0, Ordering::SeqCst);
            }
            self.wake_unarmed_driver();
        }
    }

    /// A reader goes to sleep without polling: with no reader polling, an unarmed driver is
    /// woken to arm again; while one polls, it drains the link for this reader too.
    pub(crate) fn sleeping(&self) {
        if self.pollers.load(Ordering::SeqCst) == 0 {
            self.wake_unarmed_driver();
        }
    }

    fn wake_unarmed_driver(&self) {
        if self.unarmed.load(Ordering::SeqCst) {
            let waker = self.driver_waker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    /// How long readers poll from now on (`None`: they do not): while some reader polls, up
    /// to the latest deadline asked for.
    fn polling(&self) -> Option<Duration> {
        if self.pollers.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let until = self.poll_until.load(Ordering::Acquire);
        let now = clock_ns();
        (until > now).then(|| Duration::from_nanos(until - now))
    }

    /// Keeps the waiting driver's waker for [`sleeping`](Self::sleeping).
    fn set_driver_waker(&self, waker: &Waker) {
        crate::smc::conn::register(&mut self.driver_waker.lock().unwrap_or_else(|e| e.into_inner()), waker);
    }

    /// The right to spin for frames inside a reader's poll (busy polling), held by one reader
    /// of the group at a time; `None` while another has it. Every frame of the group ends a
    /// spin, so one spinner sees what many would; many spinning readers held as many threads
    /// (`smcperf local --scenario http --conns 64 --busy-poll 50 --runtime multi`: 43-46 k
    /// requests/s with every reader spinning, 63-67 k with one at a time, both before a reader
    /// spun only while awaiting a reply).
    pub(crate) fn spin_slot(&self) -> Option<SpinSlot<'_>> {
        if self.spinning.load(Ordering::Relaxed) || self.spinning.swap(true, Ordering::Acquire) {
            return None;
        }
        Some(SpinSlot(&self.spinning))
    }

    /// CDC frames dispatched so far by anyone (a hint: see `frames_seen`).
    pub(crate) fn frames_seen(&self) -> u64 {
        self.frames_seen.load(Ordering::Relaxed)
    }

    /// Counts `n` frames taken from the link and dispatched. Called under the dispatch lock,
    /// which orders every writer of the count: a load and a store, no locked instruction.
    fn seen(&self, n: usize) {
        if n > 0 {
            self.frames_seen.store(self.frames_seen.load(Ordering::Relaxed) + n as u64, Ordering::Relaxed);
        }
    }

    /// Asks to be called back (through [`SmcConn::retry_cdc`]) when the link has CDC space,
    /// once however often it asks: a connection is in the list at most once. (Every refused
    /// send asks, and so does every message of the peer's that leaves something owed: a peer
    /// that never freed CDC space and kept sending grew the list by one entry per message,
    /// and each retry of the group then called the same connection back as many times.)
    pub(crate) fn wait_cdc_space(&self, conn: &Arc<SmcConn>) {
        let mut w = self.cdc_waiters.lock().unwrap_or_else(|e| e.into_inner());
        // By address: a `Weak` in the list keeps its connection's allocation, so no other
        // connection can have that address while the entry is there.
        if !w.iter().any(|x| std::ptr::eq(x.as_ptr(), Arc::as_ptr(conn))) {
            w.push(Arc::downgrade(conn));
        }
        self.cdc_waiting.store(true, Ordering::Release);
    }

    /// Takes received CDC frames from the link and dispatches them to their connections, then
    /// retries sends that waited for space. Returns how many frames it dispatched and whether
    /// more may be waiting (the work bound was reached). Any task may call it; while one
    /// dispatches, the others return at once (the dispatcher delivers what arrives, in order).
    pub(crate) fn progress(&self) -> (usize, bool) {
        let Some(link) = self.link.get() else {
            return (0, false);
        };
        if link.nothing_waiting() {
            // Nothing to take, and the dispatch lock left alone: every reader of the group
            // looks here on each poll, and on a multi-threaded runtime the lock's line moved
            // between workers at each look.
            self.retry_waiters();
            crate::smc::tcp_end::settle_deferred();
            return (0, false);
        }
        let mut d = match self.dispatch.try_lock() {
            Ok(d) => d,
            // Another task is dispatching; it delivers what arrives. Report "more" so a driver
            // yields instead of spinning on the link's readiness meanwhile.
            Err(std::sync::TryLockError::WouldBlock) => return (0, true),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                drop(p);
                self.dispatch_panicked();
                return (0, false);
            }
        };
        let mut more = false;
        let mut dispatched = 0;
        for round in 0..ROUNDS_PER_TURN {
            match link.cdc_recv(&mut d.frames, RECV_BATCH) {
                Ok(None) => break,
                Ok(Some(n)) => {
                    dispatched += n;
                    self.dispatch_all(&mut d);
                    if n < RECV_BATCH {
                        break;
                    }
                    more = round + 1 == ROUNDS_PER_TURN;
                }
                Err(e) => {
                    self.seen(dispatched);
                    drop(d);
                    self.fail(e);
                    return (dispatched, false);
                }
            }
        }
        self.seen(dispatched);
        drop(d);
        self.retry_waiters();
        // Closes that a message of the peer's let out (a close that waited for CDC space) and
        // that a runtime shutting down could not take: no lock is held here.
        crate::smc::tcp_end::settle_deferred();
        (dispatched, more)
    }

    /// Whether the link's next CDC frame is connection `token`'s (a hint: [`Link::next_frame`]):
    /// what makes [`dispatch_own`](Self::dispatch_own) worth a try.
    pub(crate) fn next_frame_is(&self, token: u32) -> bool {
        self.link.get().and_then(|l| l.next_frame()).is_some_and(|f| CdcMsg::token_of(&f) == token)
    }

    /// Takes the next CDC frame on the link if it is connection `token`'s, and hands it to
    /// `apply` under the dispatch lock, where [`progress`](Self::progress) would deliver it in
    /// its turn: the shortest way to a reader's own bytes, for a reader that holds its
    /// connection's lock (no look-up, no reference count, no second lock of the connection).
    /// Called once [`next_frame_is`](Self::next_frame_is) said the frame is there, so it does
    /// not look again before the locks. `Ok(false)` leaves
    /// everything as it was (no frame, another connection's first, another task dispatching,
    /// frames a failed receive left undelivered, or a link that takes frames only in batches),
    /// and the caller goes the usual way. An error, after the frame was handed over, ends the
    /// group: the caller ends it ([`fail`](Self::fail)) once it has let its connection's lock
    /// go, which the end takes (`progress` ends it too, without delivering the frames that
    /// receive took). The rest of a `progress` (retrying senders that wait for CDC space,
    /// settling deferred closes) waits for the next one: on shared memory, the only link that
    /// hands frames out one by one, a sender waiting for space is rung for whatever the arming,
    /// and closes are deferred only over RDMA.
    pub(crate) fn dispatch_own(&self, token: u32, apply: impl FnOnce(&[u8; CDC_MSG_LEN])) -> Result<bool, LinkError> {
        let Some(link) = self.link.get() else {
            return Ok(false);
        };
        // Without waiting: a dispatcher holding the lock may be about to take this
        // connection's lock, which the caller holds.
        let Ok(d) = self.dispatch.try_lock() else {
            return Ok(false);
        };
        // A dispatcher delivers the frames it took before it lets the lock go, unless their
        // receive failed (the group ends then): with none left over, the link's next frame is
        // the connection's next.
        if !d.frames.is_empty() {
            return Ok(false);
        }
        let Some((frame, after)) = link.cdc_recv_if(&mut |f| CdcMsg::token_of(f) == token) else {
            return Ok(false);
        };
        apply(&frame);
        self.seen(1);
        #[cfg(test)]
        self.own_frames.fetch_add(1, Ordering::Relaxed);
        drop(d);
        after.map(|()| true)
    }

    /// Dispatches every CDC message waiting on the link, however many tasks are dispatching:
    /// unlike [`progress`](Self::progress), it waits for the dispatch lock (held for at most
    /// one bounded round), so when it returns, every message the peer had published by the
    /// time it was called has reached its connection. Called before an end is decided that
    /// depends on what the peer sent (its process gone, its TCP connection closed).
    pub(crate) fn drain(&self) {
        let Some(link) = self.link.get() else {
            return;
        };
        let mut d = match self.dispatch.lock() {
            Ok(d) => d,
            Err(p) => {
                drop(p);
                return self.dispatch_panicked();
            }
        };
        let (mut rounds, mut busy) = (0, 0);
        while rounds < DRAIN_ROUNDS && busy < DRAIN_BUSY {
            match link.cdc_recv(&mut d.frames, RECV_BATCH) {
                Ok(Some(0)) => break,
                Ok(Some(n)) => {
                    rounds += 1;
                    self.dispatch_all(&mut d);
                    // Traffic, as `progress` counts it (a spinning reader stops).
                    self.seen(n);
                }
                // The link's receive state is busy this instant (a completion poll that keeps
                // what it takes for us): try again, on a bound of its own, so that a busy
                // instant does not take a round from the frames.
                Ok(None) => {
                    busy += 1;
                    std::thread::yield_now();
                }
                // The link's own error: whoever drains decides what it means.
                Err(_) => break,
            }
        }
        drop(d);
        crate::smc::tcp_end::settle_deferred();
    }

    fn retry_waiters(&self) {
        // A push this load does not see yet is taken by a later call: the connection asked the
        // link to watch for space after its push, and the watch ends in another `progress`
        // (as a push just after the lock was taken here always was).
        if !self.cdc_waiting.load(Ordering::Acquire) {
            // Nobody registered: a watch for space left on by a sender that was refused and
            // then got through on its own retry (space appeared as it asked) ends here. Left
            // on, the link reports work whenever its ring has room and the driver never
            // sleeps. Under the lock, with the list empty, as below: a sender refused just now
            // registers and then tries again, so its own refusal turns the watch back on.
            if let Some(l) = self.link.get().filter(|l| l.watches_space()) {
                let w = self.cdc_waiters.lock().unwrap_or_else(|e| e.into_inner());
                if w.is_empty() && !self.cdc_waiting.load(Ordering::Acquire) {
                    l.clear_space_wait();
                }
            }
            return;
        }
        let waiters = {
            let mut w = self.cdc_waiters.lock().unwrap_or_else(|e| e.into_inner());
            self.cdc_waiting.store(false, Ordering::Relaxed);
            std::mem::take(&mut *w)
        };
        if waiters.is_empty() {
            return;
        }
        for w in waiters {
            if let Some(c) = w.upgrade() {
                c.retry_cdc();
            }
        }
        // A connection still short of space registered again (and asked the link to watch);
        // with none left, stop watching, or the driver would keep waking for space nobody needs.
        // Only here, never at a send that went through: connections refused before that send
        // still wait (every refused sender registers, so the watch always ends here). Under the
        // lock: a connection that registers meanwhile does so after the watch was stopped, and
        // its send that follows asks the link to watch again; stopped after the lock was let
        // go, the watch could end under a connection that had just registered, and its writer
        // wait for traffic that might never come.
        let w = self.cdc_waiters.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_empty() {
            if let Some(l) = self.link.get() {
                l.clear_space_wait();
            }
        }
        drop(w);
    }

    /// A task panicked while it dispatched (a foreign waker's panic, say) and poisoned the
    /// dispatch lock: the rest of its batch, taken off the link already, went with the
    /// unwinding, and nothing tells which connections missed which messages. The group ends as
    /// if its link had failed (its connections move to their TCP sockets, where nothing is
    /// lost) rather than go on with messages missing; read as "another task dispatches", the
    /// poisoned lock kept the driver yielding in a loop and nothing was dispatched again.
    fn dispatch_panicked(&self) {
        self.dispatch.clear_poison();
        self.fail(LinkError::Io(
            std::io::ErrorKind::Other,
            "a task panicked while dispatching the group's messages".into(),
        ));
    }

    /// Dispatches the frames taken (and empties the batch).
    fn dispatch_all(&self, d: &mut Dispatch) {
        let Dispatch { frames, last } = d;
        for f in frames.drain(..) {
            self.dispatch(&f, last);
        }
    }

    /// Delivers one frame to the connection its token names. `last` is the connection the
    /// previous frame went to: frames come in runs for one connection (a request, then its
    /// answer's consumer update), and a run after its first frame takes neither the group's lock
    /// nor a map lookup.
    fn dispatch(&self, frame: &[u8; CDC_MSG_LEN], last: &mut Option<(u32, Weak<SmcConn>)>) {
        let token = CdcMsg::token_of(frame);
        let cached = match last {
            Some((t, w)) if *t == token => w.upgrade().filter(|c| !c.forgotten()),
            _ => None,
        };
        let conn = cached.or_else(|| {
            let c = self.lock().conns.get(&token).cloned();
            *last = c.as_ref().map(|c| (token, Arc::downgrade(c)));
            c
        });
        let Some(conn) = conn else {
            // A message for a connection that is gone (or never was): nothing to deliver to.
            tracing::trace!(token, "CDC message for an unknown connection");
            return;
        };
        match CdcMsg::decode(frame) {
            Ok(msg) => conn.on_cdc(&msg),
            Err(e) => conn.fail_protocol(format!("malformed CDC message: {e}")),
        }
    }

    /// Ends the group: every connection fails with `err`, the link is torn down and the manager
    /// forgets the group.
    pub(crate) fn fail(&self, err: LinkError) {
        self.end(err, None::<fn(&GroupState) -> bool>);
    }

    /// [`fail`](Self::fail); with `only_if`, only a live group of which it holds, looked at in
    /// the same hold of the lock that marks it dead (so no connection can be opened in
    /// between). Returns whether the group was alive and is ended now.
    fn end(&self, err: LinkError, only_if: Option<impl FnOnce(&GroupState) -> bool>) -> bool {
        let alive;
        let conns: Vec<Arc<SmcConn>> = {
            let mut st = self.lock();
            alive = st.dead.is_none();
            if let Some(only_if) = only_if {
                if !alive || !only_if(&st) {
                    return false;
                }
            }
            if alive {
                st.dead = Some(err.clone());
                if self.link.get().is_some() {
                    self.manager.counters.link_group_down();
                }
                // The region goes with the group: every slot still allocated is returned to the
                // process-wide RMB budget, once.
                let n = st.generation.len();
                let charged: u64 = st.charged.iter_mut().map(|c| u64::from(std::mem::take(c))).sum();
                st.free = (0..n as u32).rev().map(|s| s as u16).collect();
                self.manager.uncharge_rmb(charged);
            }
            let conns = st
                .conns
                .drain()
                .map(|(_, c)| {
                    c.forget();
                    c
                })
                .collect();
            self.count_conns(&st);
            conns
        };
        if !conns.is_empty() && err != LinkError::Closed {
            tracing::warn!(id = self.id, role = ?self.role, error = %err, conns = conns.len(), "link group failed under its connections");
        } else if err != LinkError::Closed {
            tracing::debug!(id = self.id, error = %err, "idle link group failed");
        }
        for c in conns {
            c.fail_link(&err);
        }
        if let Some(l) = self.link.get() {
            l.teardown();
        }
        self.manager.forget(self);
        self.changed.notify_waiters();
        // Co-drivers leave, and their duplicates of the doorbell go now (their tasks may be on
        // a runtime that does not run). After the group was marked dead: one that registers its
        // waker after this finds it dead when it looks.
        let co: Vec<(Option<Waker>, Option<Arc<crate::link::Watch>>)> =
            self.drivers().co.iter_mut().map(|c| (c.waker.take(), c.watch.take())).collect();
        for (waker, watch) in co {
            drop(watch);
            if let Some(w) = waker {
                w.wake();
            }
        }
        alive
    }

    /// The link failed with `e` (its driver saw it, or a task waiting on the link): the group
    /// ends with it, its connections moving to TCP where the error allows. Again, nothing.
    pub(crate) fn end_on_link_error(&self, e: LinkError) {
        if matches!(e, LinkError::PeerGone | LinkError::Io(..)) {
            // The peer (or the link) is done, but what it published before is good: dispatch
            // all of it, so its connections read every byte, before they learn the end.
            self.drain();
        }
        self.fail(e);
    }

    /// Ends the group now if it has had no connection for [`IDLE_BEFORE_ENDED`] and no
    /// handshake pins it, as its idle timeout would later; returns whether it did. Looked at
    /// and ended in one hold of the group's lock: a connection opened meanwhile finds it gone
    /// (its handshake declines and it stays TCP).
    pub(crate) fn end_if_idle(&self) -> bool {
        let pins = &self.pins;
        self.end(
            LinkError::Closed,
            Some(|st: &GroupState| {
                st.conns.is_empty()
                    && pins.load(Ordering::Acquire) == 0
                    && st.idle_since.is_some_and(|t| t.elapsed() >= IDLE_BEFORE_ENDED)
            }),
        )
    }

    /// Makes the group look idle for `by` longer than it has been.
    #[cfg(all(test, feature = "rdma"))]
    pub(crate) fn backdate_idle(&self, by: Duration) {
        let mut st = self.lock();
        if let Some(t) = st.idle_since {
            st.idle_since = Some(t.checked_sub(by).unwrap_or(t));
        }
    }

    /// Tears the group down if it has been idle long enough; returns whether it did, or how
    /// long to wait before asking again.
    fn idle_check(&self) -> Result<(), Duration> {
        #[cfg(test)]
        self.idle_looks.fetch_add(1, Ordering::Relaxed);
        let st = self.lock();
        let again = self.idle_timeout.max(IDLE_LOOK_MIN);
        match st.idle_since {
            Some(_) if self.pins.load(Ordering::Acquire) > 0 => Err(again),
            Some(since) if st.conns.is_empty() => {
                let idle = since.elapsed();
                if idle >= self.idle_timeout {
                    drop(st);
                    self.fail(LinkError::Closed);
                    Ok(())
                } else {
                    Err(self.idle_timeout - idle)
                }
            }
            _ => Err(again),
        }
    }
}

impl Drop for LinkGroup {
    fn drop(&mut self) {
        // An RDMA link's last reference is usually this one: destroying its queue pair and
        // completion queue and deregistering its pools takes the process's memory-map lock,
        // which runtime threads must not wait for (see `on_setup_thread`).
        #[cfg(feature = "rdma")]
        if let Some(link) = self.link.take() {
            if link.is_rdma() {
                crate::link::verbs::device::drop_on_setup_thread(Box::new(link));
            }
        }
    }
}

/// Ends the group when its driver stops, unless the driver's runtime shut down under a group
/// that is still alive: then the group moves to the rescue driver (see [`rescue`]), because
/// its connections may belong to other runtimes. A group nobody drives must not be handed out
/// again, so when it cannot move it fails.
struct DriverGuard {
    group: Arc<LinkGroup>,
    /// The driver returned (the group failed or idled out): nothing to rescue.
    done: bool,
    /// The driver runs on the rescue thread already, whose runtime never shuts down: a drop
    /// there is a panic, and moving again would only repeat it.
    rescued: bool,
    /// Set while the driver is polled ([`MarkPoll`]): a drop while the thread panics with this
    /// set is the driver's own panic. One without it is a runtime dropped while its thread
    /// unwinds from a panic elsewhere (the application's), whose groups other runtimes'
    /// connections may share: those are rescued as at any runtime's end.
    in_poll: Arc<AtomicBool>,
}

impl DriverGuard {
    /// The driver returned: its group has nothing to be rescued for.
    fn returned(mut self) {
        self.done = true;
    }
}

impl Drop for DriverGuard {
    fn drop(&mut self) {
        let driver_panicked = std::thread::panicking() && self.in_poll.load(Ordering::Relaxed);
        if !self.done && !self.rescued && !driver_panicked && self.group.is_alive() {
            match rescue(self.group.clone()) {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(id = self.group.id, error = %e, "link group outlived its runtime and cannot move: ending it")
                }
            }
        }
        self.group.finished.store(true, Ordering::Relaxed);
        if driver_panicked {
            // The driver panicked (a foreign waker it woke, say) on a runtime that lives on:
            // the group ends as a failed link does, and its connections move to their TCP
            // sockets, losing nothing. (`Closed` would end them with an error, as for a runtime
            // that is gone and has nothing left to run a move on.)
            self.group.fail(LinkError::Io(std::io::ErrorKind::Other, "the link group's driver panicked".into()));
        } else {
            self.group.fail(LinkError::Closed);
        }
    }
}

/// Hands a live group whose runtime shut down to the rescue driver: a thread of this crate's
/// with a current-thread runtime, started on first use, that moves the link's descriptors to
/// its reactor and drives the group from then on. Link groups are process-wide (every
/// runtime's connections to the same peer share one), so a runtime dropped while others still
/// use its groups (a runtime per request, several runtimes, tests) must not take them along.
/// Only orphaned groups run there; a group keeps its creator's runtime while that lives, so a
/// connection's wake-ups stay on its own runtime's threads.
fn rescue(group: Arc<LinkGroup>) -> Result<(), &'static str> {
    static RESCUE: OnceLock<Option<tokio::sync::mpsc::UnboundedSender<Arc<LinkGroup>>>> = OnceLock::new();
    let tx = RESCUE.get_or_init(|| {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Arc<LinkGroup>>();
        let started = std::thread::Builder::new().name("smc-tokio-rescue".into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::warn!(error = %e, "no runtime for the link-group rescue driver");
                    return;
                }
            };
            rt.block_on(async move {
                while let Some(group) = rx.recv().await {
                    let moved = group.link().map(|l| l.rehome());
                    match moved {
                        Some(Ok(())) => {
                            // Its thread always runs: no runtime needs a co-driver for it now.
                            group.drivers().home = None;
                            group.manager.counters.link_group_rescued();
                            tracing::debug!(id = group.id, "link group moved to the rescue driver");
                            let span = tracing::debug_span!("smc_link_group", id = group.id, role = ?group.role);
                            tokio::spawn(tracing::Instrument::instrument(drive(group, true), span));
                        }
                        Some(Err(e)) => {
                            tracing::warn!(id = group.id, error = %e, "link group could not move to the rescue driver");
                            group.finished.store(true, Ordering::Relaxed);
                            group.fail(e);
                        }
                        None => {
                            group.finished.store(true, Ordering::Relaxed);
                            group.fail(LinkError::Closed);
                        }
                    }
                }
            });
        });
        started.ok().map(|_| tx)
    });
    match tx {
        Some(tx) => tx.send(group).map_err(|_| "the rescue driver is not running"),
        None => Err("the rescue driver could not start"),
    }
}

/// The driver task: dispatch, then wait on the link (doorbell or completion channel) and the
/// idle timer, until the link fails or the group idles out. `rescued`: it runs on the rescue
/// driver (see [`rescue`]).
fn drive(group: Arc<LinkGroup>, rescued: bool) -> impl Future<Output = ()> + Send {
    // The guard exists before the task does: a runtime that is shutting down drops what is
    // spawned on it unpolled, and the group must then still move to the rescue driver (or
    // fail), not stay alive with nobody driving it.
    let in_poll = Arc::new(AtomicBool::new(false));
    let guard = DriverGuard { group, done: false, rescued, in_poll: in_poll.clone() };
    let run = async move {
        drive_until_done(&guard.group, rescued).await;
        guard.returned();
    };
    MarkPoll::new(in_poll, run)
}

/// A future that says when it is being polled ([`DriverGuard::in_poll`], and the listener's
/// task's end): a panic that unwinds out of its poll leaves the mark set, so a guard dropped
/// while the thread panics tells the task's own panic from a runtime dropped while its thread
/// unwinds from another.
pub(crate) struct MarkPoll<F> {
    in_poll: Arc<AtomicBool>,
    fut: std::pin::Pin<Box<F>>,
}

impl<F> MarkPoll<F> {
    pub(crate) fn new(in_poll: Arc<AtomicBool>, fut: F) -> MarkPoll<F> {
        MarkPoll { in_poll, fut: Box::pin(fut) }
    }
}

impl<F: Future> Future for MarkPoll<F> {
    type Output = F::Output;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        // Relaxed: the guard's drop reads it on the thread that polled last (unwinding from this
        // poll), or after the runtime's own ordering of the task's polls and its drop.
        self.in_poll.store(true, Ordering::Relaxed);
        let r = self.fut.as_mut().poll(cx);
        self.in_poll.store(false, Ordering::Relaxed);
        r
    }
}

/// A co-driver's place in its group ([`LinkGroup::drive_here`]), made before its task: the
/// count of co-drivers goes up with it and down when it is dropped, with the task or with a
/// runtime that drops the task unpolled, which also takes the entry (and the watch) out of the
/// group, so that a later connection of the runtime (or of a new one that reuses its id)
/// starts another.
struct Leave {
    group: Weak<LinkGroup>,
    rt: tokio::runtime::Id,
    counters: Arc<crate::stats::Counters>,
}

impl Leave {
    fn new(group: &Arc<LinkGroup>, rt: tokio::runtime::Id) -> Leave {
        let counters = group.manager.counters.clone();
        counters.co_driver(true);
        Leave { group: Arc::downgrade(group), rt, counters }
    }
}

impl Drop for Leave {
    fn drop(&mut self) {
        if let Some(g) = self.group.upgrade() {
            let gone: Vec<CoDriver> = {
                let mut d = g.drivers();
                let (gone, kept) = std::mem::take(&mut d.co).into_iter().partition(|c| c.rt == self.rt);
                d.co = kept;
                gone
            };
            // Outside the lock: the watch's descriptor goes to a closer.
            drop(gone);
        }
        self.counters.co_driver(false);
    }
}

/// A co-driver of `group` ([`LinkGroup::drive_here`]): dispatches the group's frames whenever
/// its `watch` on the link says they came, until the group ends (or the runtime drops the
/// task). It holds neither strongly between polls, so a group that ended is not kept by a task
/// whose runtime does not run. The group's own driver keeps everything else (idle timer, link
/// test, polling); a link error met here ends the group as there.
async fn co_drive(group: Weak<LinkGroup>, watch: Weak<crate::link::Watch>, leave: Leave) {
    loop {
        let more = match group.upgrade() {
            Some(g) => g.progress().1,
            None => return,
        };
        if more {
            // More frames than one turn takes (or another dispatcher has them): the runtime's
            // other tasks first. This runtime may stop meanwhile, and the ring that announced
            // the frames left was taken here: the group's other waiters are told directly.
            if let Some(g) = group.upgrade() {
                g.hand_off(Some(leave.rt));
            }
            tokio::task::yield_now().await;
            continue;
        }
        let ev = std::future::poll_fn(|cx| {
            let (Some(g), Some(w)) = (group.upgrade(), watch.upgrade()) else {
                return Poll::Ready(None);
            };
            // The waker first, then the look: `end` marks the group dead before it wakes.
            g.set_co_waker(leave.rt, cx.waker());
            match g.link() {
                Some(link) if g.is_alive() => link.poll_watch(&w, cx).map(Some),
                _ => Poll::Ready(None),
            }
        })
        .await;
        match ev {
            None | Some(Err(LinkError::Closed)) => return,
            Some(Ok(())) => {}
            Some(Err(e)) => {
                if let Some(g) = group.upgrade() {
                    g.end_on_link_error(e);
                }
                return;
            }
        }
    }
}

/// `rescued`: on the rescue runtime, whose thread serves no connection of the group.
async fn drive_until_done(group: &Arc<LinkGroup>, rescued: bool) {
    let Some(link) = group.link.get().cloned() else {
        return;
    };
    let mut idle = Box::pin(tokio::time::sleep(group.idle_timeout));
    // The link test (SMC-R): each interval, a link with connections that carried nothing
    // since the last look is tested (`Link::test_if_idle`), so that a broken path is found
    // while the connections are idle, not at their next write.
    let mut test = link.test_interval().map(|every| (Box::pin(tokio::time::sleep(every)), every));
    // While readers poll, the driver looks again when their polling ends at the latest, so a
    // reader that went to sleep meanwhile is never left without an armed doorbell.
    let mut poll_end = Box::pin(tokio::time::sleep(Duration::ZERO));
    // Group polling, only where the driver shares its thread with the connections it serves:
    // not on the rescue thread, which would only burn, nor on a multi-threaded runtime, where a
    // task that stays runnable keeps a worker from parking and is stolen between workers
    // (`smcperf --runtime multi` measured fewer doorbells but more sleeps and no gain). Its
    // waits follow the readers' rule (`WaitClock`): a wait that saw work come keeps the group
    // polling, one that ran out makes the next 1, 2, 4, ... 64 arm at once, so a group whose
    // peer is slow or sporadic costs little.
    let polls = !rescued
        && tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
    let mut wait = crate::smc::conn::WaitClock::new(if polls { group.poll_window } else { Duration::ZERO });
    // Busy polling (off by default): before it arms the doorbell, the driver keeps looking for
    // this long, on the runtime's turns like a polling reader. A spin inside the task held the
    // thread from the connections it serves: a reader that yielded (its cooperative budget
    // spent) could not answer until the spin ran out, and its peer spun meanwhile too
    // (`smcperf local --scenario rr --size 14 --busy-poll 200`: p99.9 of 205 us).
    let busy = u64::try_from(link.busy_poll().as_nanos()).unwrap_or(u64::MAX);
    let mut busy_until: Option<u64> = None;
    let mut frames_seen = 0;
    loop {
        let (dispatched, more) = group.progress();
        if !group.is_alive() {
            return;
        }
        if dispatched > 0 || more {
            busy_until = None;
            wait.end();
            // Let the connections just woken run (and answer) before this task re-arms the
            // doorbell; it also bounds the work per turn when more frames wait, and lets another
            // dispatcher finish.
            if more {
                // Frames left for a later turn, which no ring may announce: a co-driver's
                // runtime may run before this one does again.
                group.hand_off(None);
            }
            tokio::task::yield_now().await;
            if more {
                continue;
            }
        }
        // Group polling: after a batch of work the next is likely on its way (many connections
        // answering one another), so look again on the runtime's next turn with the doorbell
        // disarmed: the peer sends without ringing, and this thread does not sleep and wake
        // for it. A budget without work ends the wait's polling, and the doorbell is armed.
        let now = clock_ns();
        let busy_left = busy > 0 && {
            // Traffic that readers drained themselves counts as work too.
            let seen = group.frames_seen();
            if seen != frames_seen {
                frames_seen = seen;
                busy_until = None;
            }
            now < *busy_until.get_or_insert(now.saturating_add(busy))
        };
        if busy_left || wait.poll_until(now).is_some() {
            // One look per poll of the task: it wakes itself and returns `Pending`, as a
            // polling reader does, so it runs again after the thread's other tasks without
            // making the runtime poll its reactor on every turn (`yield_now` would).
            let mut looked = false;
            let ev = std::future::poll_fn(|cx| {
                if looked {
                    return Poll::Ready(None);
                }
                looked = true;
                match link.poll_event_unarmed(cx) {
                    Poll::Ready(r) => Poll::Ready(Some(r)),
                    Poll::Pending => {
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                }
            })
            .await;
            if let Some(Err(e)) = ev {
                return group.end_on_link_error(e);
            }
            continue;
        }
        let ev = std::future::poll_fn(|cx| {
            // Adaptive polling: while readers poll for replies they expect soon, leave the
            // doorbell disarmed, so the peer sends without ringing (a system call on its side,
            // a wake-up on ours). The waker and the flag are stored before `polling` reads
            // the count (`poll_stop` says why): a reader whose polling ends after that read
            // finds them and wakes us to arm (`poll_stop`, `sleeping`).
            group.set_driver_waker(cx.waker());
            group.unarmed.store(true, Ordering::SeqCst);
            let polling = group.polling();
            if polling.is_none() {
                group.unarmed.store(false, Ordering::SeqCst);
            }
            let event = match polling {
                Some(left) => {
                    let end = tokio::time::Instant::now() + left;
                    if poll_end.deadline() < end {
                        poll_end.as_mut().reset(end);
                    }
                    // A timer that fired is polled again only after a reset.
                    if poll_end.as_mut().poll(cx).is_ready() {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    link.poll_event_unarmed(cx)
                }
                None => link.poll_event(cx),
            };
            if let Poll::Ready(r) = event {
                return Poll::Ready(Some(r));
            }
            if test.as_mut().is_some_and(|(t, _)| t.as_mut().poll(cx).is_ready()) {
                // Handled below, as a wake-up with nothing received.
                return Poll::Ready(Some(Ok(())));
            }
            match Pin::new(&mut idle).poll(cx) {
                Poll::Ready(()) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        // Whatever woke it, that wait is over.
        wait.end();
        busy_until = None;
        if let Some((t, every)) = test.as_mut() {
            if t.is_elapsed() {
                t.as_mut().reset(tokio::time::Instant::now() + *every);
                if group.in_use() {
                    if let Err(e) = link.test_if_idle() {
                        return group.end_on_link_error(e);
                    }
                }
            }
        }
        match ev {
            Some(Ok(())) => {}
            Some(Err(e)) => return group.end_on_link_error(e),
            None => match group.idle_check() {
                Ok(()) => {
                    tracing::debug!(id = group.id, "idle link group torn down");
                    return;
                }
                Err(wait) => {
                    // Released connections of this group that no task looks after (released
                    // outside a runtime, or their task's runtime shut down) get one here.
                    group.watch_lingering();
                    idle.as_mut().reset(tokio::time::Instant::now() + wait)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{GroupTimes, LinkGroup, Role, TxRmbs};
    use crate::link::shm::region::Layout;
    use crate::link::shm::tests::joined;
    use crate::link::Link;
    use crate::proto::cdc::CdcMsg;
    use crate::smc::manager::Manager;

    /// A waiter that leaves frames for a later turn hands them off: a co-driver wakes the group's
    /// own driver and every other co-driver, the own driver every co-driver; nobody wakes
    /// itself, and a group without co-drivers wakes nobody.
    #[test]
    fn a_waiter_that_leaves_frames_for_later_wakes_the_groups_other_waiters() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let counted = || Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let woken = |c: &Arc<Count>| c.0.load(std::sync::atomic::Ordering::SeqCst);
        let runtime = || tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (a, b) = (runtime(), runtime());
        let (a, b) = (a.handle().id(), b.handle().id());
        let group = client_group(4, Duration::from_secs(60));
        let own = counted();
        group.set_driver_waker(&std::task::Waker::from(own.clone()));
        group.hand_off(None);
        group.hand_off(Some(a));
        assert_eq!(woken(&own), 0, "no co-driver: nobody to hand off to");
        let (ca, cb) = (counted(), counted());
        for (rt, c) in [(a, &ca), (b, &cb)] {
            group.drivers().co.push(super::CoDriver { rt, waker: None, watch: None });
            group.set_co_waker(rt, &std::task::Waker::from(c.clone()));
        }
        group.hand_off(Some(a));
        assert_eq!((woken(&own), woken(&ca), woken(&cb)), (1, 0, 1), "co-driver a hands off");
        group.hand_off(None);
        assert_eq!((woken(&own), woken(&ca), woken(&cb)), (1, 1, 2), "the own driver hands off");
    }

    /// A runtime other than the group's starts one co-driver there however many of its
    /// connections ask, none where the group's own driver runs; the group's end lets the
    /// co-driver's watch (its duplicate of the doorbell) go at once, though that runtime never
    /// runs the task, and the runtime's drop ends the count of it.
    #[test]
    fn a_co_driver_per_other_runtime_whose_watch_goes_with_the_group() {
        let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let own = runtime();
        let (ours, _peer) = own.block_on(joined(Layout::new(8, 4, 4096).unwrap(), "co-driver"));
        let group = client_group(4, Duration::from_secs(60));
        let _in_own = own.enter();
        group.establish(Arc::new(ours)).unwrap();
        let co = || group.manager.counters.snapshot(&crate::config::RmbBudget::new()).link_group_co_drivers;
        group.drive_here();
        assert_eq!(co(), 0, "the group's own runtime has its driver");
        let other = runtime();
        {
            let _in = other.enter();
            group.drive_here();
            group.drive_here();
        }
        assert_eq!(co(), 1, "one co-driver for the other runtime");
        let watch = {
            let d = group.drivers();
            assert_eq!(d.co.len(), 1);
            Arc::downgrade(d.co[0].watch.as_ref().expect("its watch, held by the group"))
        };
        group.fail(crate::link::LinkError::Closed);
        assert!(watch.upgrade().is_none(), "the watch went with the group");
        assert_eq!(co(), 1, "its task is still there, on a runtime that has not run it");
        drop(other);
        assert_eq!(co(), 0, "the runtime's drop ended it");
    }

    /// A reader takes its own connection's frame off the link only when it is the next one and
    /// nobody else dispatches, and then it gets that frame and the group counts it; otherwise
    /// nothing is taken (nothing there, another connection's frame first, the dispatch lock
    /// held, a frame a failed receive left over), and what is there stays, in order, for the
    /// usual dispatch.
    #[test]
    fn a_reader_takes_its_own_frame_only_when_it_is_next() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (client, server) = joined(Layout::new(8, 4, 4096).unwrap(), "own-frame").await;
            let group = client_group(4, Duration::from_secs(60));
            group.establish(Arc::new(client)).unwrap();
            let link = group.link().unwrap().clone();
            let refuse = |f: &[u8; crate::proto::cdc::CDC_MSG_LEN]| panic!("no frame to take: {:?}", CdcMsg::decode(f));
            assert!(!group.dispatch_own(5, refuse).unwrap(), "nothing there");
            assert!(server.cdc_send(&CdcMsg::new(1, 5)).unwrap());
            assert!(server.cdc_send(&CdcMsg::new(2, 6)).unwrap());
            assert!(!group.dispatch_own(6, refuse).unwrap(), "connection 5's frame is first");
            {
                let _dispatching = group.dispatch.lock().unwrap();
                assert!(!group.dispatch_own(5, refuse).unwrap(), "another task dispatches");
            }
            // A receive that failed left a frame undelivered: the link's next is not the next.
            group.dispatch.lock().unwrap().frames.push(CdcMsg::new(9, 5).encode());
            assert!(!group.dispatch_own(5, refuse).unwrap(), "a frame left over comes first");
            group.dispatch.lock().unwrap().frames.clear();
            let seen = group.frames_seen();
            let mut got = None;
            assert!(group.dispatch_own(5, |f| got = Some(CdcMsg::decode(f).unwrap())).unwrap());
            assert_eq!(got.map(|m| (m.seq, m.token)), Some((1, 5)));
            assert_eq!(group.frames_seen(), seen + 1, "counted as dispatched");
            assert!(!group.dispatch_own(5, refuse).unwrap(), "connection 6's frame is next");
            let mut frames = Vec::new();
            assert_eq!(link.cdc_recv(&mut frames, 4).unwrap(), Some(1), "it stayed, alone");
            assert_eq!(CdcMsg::decode(&frames[0]).map(|m| (m.seq, m.token)), Ok((2, 6)));
        });
    }

    /// A frame taken one by one whose receive then failed (ringing a peer that waits for room)
    /// is handed over all the same, and counted, and the error comes back for the caller to
    /// end the group with: nothing the peer published is lost to a receive that went wrong
    /// after it.
    #[test]
    fn a_frame_taken_before_its_receive_failed_is_handed_over_with_the_error() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (client, server) = joined(Layout::new(8, 4, 4096).unwrap(), "own-frame-error").await;
            let broken = crate::link::LinkError::Protocol("the doorbell failed");
            let link = Arc::new(Posing { after_recv: Some(broken.clone()), ..Posing::shm(client) });
            let group = client_group(4, Duration::from_secs(60));
            group.establish(link).unwrap();
            assert!(server.cdc_send(&CdcMsg::new(1, 5)).unwrap());
            let seen = group.frames_seen();
            let mut got = None;
            let r = group.dispatch_own(5, |f| got = Some(CdcMsg::decode(f).unwrap()));
            assert_eq!(r, Err(broken));
            assert_eq!(got.map(|m| (m.seq, m.token)), Some((1, 5)), "handed over before the error");
            assert_eq!(group.frames_seen(), seen + 1);
        });
    }

    /// A client group of `slots` rings of 4 KiB in a context of its own, ended after
    /// `idle_timeout` without connections, not polling.
    fn client_group(slots: u32, idle_timeout: Duration) -> Arc<LinkGroup> {
        let manager = Manager::new(Arc::default(), Arc::new(crate::config::RmbBudget::new()));
        let times = GroupTimes { idle_timeout, poll_window: Duration::ZERO };
        LinkGroup::new(7, Role::Client, TxRmbs::shm(slots, 4096, 4096), times, manager)
    }

    /// A send refused for want of CDC space that then got through on the link's own retry
    /// (the peer freed a slot as it asked) registers no waiter, and leaves the link watching
    /// for space. With nobody waiting, the group's driver ends the watch: left on, the link
    /// reported work whenever its ring had room, and the driver turned without ever letting
    /// its thread go (a current-thread runtime froze).
    #[test]
    fn a_watch_for_space_nobody_waits_on_is_ended_and_the_driver_sleeps() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let watching = rt.block_on(async {
                let (client, server) = joined(Layout::new(4, 4, 4096).unwrap(), "space-watch").await;
                let group = client_group(4, Duration::from_secs(60));
                group.establish(Arc::new(client)).unwrap();
                let link = group.link().unwrap();
                // Fill the ring, as senders that do not register (their retry went through).
                let mut m = CdcMsg::new(1, 2);
                while link.cdc_send(&m).unwrap() {
                    m.seq += 1;
                }
                let mut frames = Vec::new();
                assert_eq!(server.cdc_recv(&mut frames, 1).unwrap(), Some(1));
                assert!(link.cdc_send(&m).unwrap(), "the freed slot takes the send");
                // Room again, and nobody waits for it.
                assert_eq!(server.cdc_recv(&mut frames, 2).unwrap(), Some(2));
                assert!(link.watches_space());
                tokio::time::sleep(Duration::from_millis(50)).await;
                let watching = link.watches_space();
                drop(server);
                watching
            });
            let _ = tx.send(watching);
        });
        let watching =
            rx.recv_timeout(Duration::from_secs(20)).expect("the runtime froze: its link group's driver never slept");
        assert!(!watching, "the watch for space stayed on with nobody waiting");
    }

    /// A connection that asks again and again for CDC space is in the list of those waiting
    /// for it once: the list is bounded by the group's connections, whatever a peer that never
    /// frees space sends.
    #[tokio::test]
    async fn a_connection_waits_for_cdc_space_once_however_often_it_asks() {
        use crate::proto::cursor::RingSize;
        let group = client_group(4, Duration::from_secs(60));
        let ring = RingSize::new(4096).unwrap();
        let cfg = crate::config::ShmConfig::default();
        let a = crate::smc::conn::SmcConn::new(group.clone(), 1, Some(2), ring, ring, &cfg);
        let b = crate::smc::conn::SmcConn::new(group.clone(), 3, Some(4), ring, ring, &cfg);
        for _ in 0..1000 {
            group.wait_cdc_space(&a);
        }
        group.wait_cdc_space(&b);
        group.wait_cdc_space(&a);
        assert_eq!(group.cdc_waiters.lock().unwrap().len(), 2, "one entry per waiting connection");
        // One gone: its entry is taken out with the others at the next retry, not matched.
        drop(b);
        group.wait_cdc_space(&a);
        assert_eq!(group.cdc_waiters.lock().unwrap().len(), 2);
    }

    /// A drain takes what the peer published before it began and returns, also when the peer
    /// never stops sending: two laps of the largest CDC ring at most (it took sixteen, once for
    /// every connection whose TCP connection ended).
    #[tokio::test]
    async fn a_drain_under_a_peer_that_never_stops_takes_two_laps_at_most() {
        let (client, _server) = joined(Layout::new(4, 4, 4096).unwrap(), "flood-drain").await;
        let link = Arc::new(Posing { flood: Some(Default::default()), ..Posing::shm(client) });
        let group = client_group(4, Duration::from_secs(60));
        group.establish(link.clone()).unwrap();
        group.drain();
        let calls = link.flood.as_ref().unwrap().load(std::sync::atomic::Ordering::Relaxed);
        let laps = (calls * super::RECV_BATCH) as f64 / f64::from(crate::link::shm::region::MAX_CDC_SLOTS);
        assert!(calls > 0 && laps <= 2.0, "{calls} receives, {laps} laps of the largest ring");
    }

    /// A group with an idle timeout of 0 (ended as soon as it has no connection) looks at
    /// whether it is idle at most every [`IDLE_LOOK_MIN`](super::IDLE_LOOK_MIN) while it has
    /// a connection, counted over a second of a paused clock. Its timer, re-armed at 0, fired
    /// at once, again and again: the driver never let its runtime idle, so the paused clock
    /// never moved and the runtime froze (on a running clock, a wake-up every millisecond).
    #[test]
    fn a_group_with_no_idle_time_does_not_spin_its_timer_while_in_use() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
            let looks = rt.block_on(async {
                let (client, server) = joined(Layout::new(4, 4, 4096).unwrap(), "idle-zero").await;
                let group = client_group(4, Duration::ZERO);
                group.establish(Arc::new(client)).unwrap();
                let slot = group.alloc_slot().expect("a slot");
                let before = group.idle_looks.load(std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
                let looks = group.idle_looks.load(std::sync::atomic::Ordering::Relaxed) - before;
                assert!(group.is_alive(), "a group in use was ended");
                let _ = (slot, server);
                looks
            });
            let _ = tx.send(looks);
        });
        let looks = rx.recv_timeout(Duration::from_secs(20)).expect("the runtime froze: the group's idle timer spun");
        let most = Duration::from_secs(1).as_millis() / super::IDLE_LOOK_MIN.as_millis() + 1;
        assert!(u128::from(looks) <= most, "{looks} looks at the idle timer in a second, at most {most} expected");
    }

    /// A shared-memory link that poses as another: one that says it is RDMA (the peer writes
    /// into our memory there, which is all `PendingConn` asks of a link), or one whose peer
    /// never stops sending (every receive finds as many frames as it may take, for a
    /// connection nobody has, and is counted).
    #[derive(Debug)]
    struct Posing {
        link: crate::link::shm::ShmLink,
        rdma: bool,
        flood: Option<std::sync::atomic::AtomicUsize>,
        /// Frames taken one by one come with this error of what follows a receive.
        after_recv: Option<crate::link::LinkError>,
        /// Whether what was sent is delivered, as the test decides: `None` in flight (without
        /// it, everything is delivered at once).
        delivery: Option<Arc<Delivery>>,
        /// Says on which thread the link was dropped.
        _probe: Option<DropProbe>,
    }

    /// Sends the name of the thread it is dropped on.
    #[derive(Debug)]
    struct DropProbe(std::sync::mpsc::Sender<Option<String>>);

    impl Drop for DropProbe {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().name().map(str::to_owned));
        }
    }

    #[derive(Debug, Default)]
    struct Delivery(Mutex<(Option<bool>, Vec<std::task::Waker>)>);

    impl Delivery {
        fn set(&self, delivered: bool) {
            let mut d = self.0.lock().unwrap();
            d.0 = Some(delivered);
            d.1.drain(..).for_each(std::task::Waker::wake);
        }
    }

    impl Posing {
        fn rdma(link: crate::link::shm::ShmLink) -> Posing {
            Posing { rdma: true, ..Posing::shm(link) }
        }

        fn shm(link: crate::link::shm::ShmLink) -> Posing {
            Posing { link, rdma: false, flood: None, after_recv: None, delivery: None, _probe: None }
        }
    }

    impl Link for Posing {
        fn rx_rmb_size(&self) -> u32 {
            self.link.rx_rmb_size()
        }
        fn tx_write(&self, rmb: u32, offset: u32, data: &[u8]) -> Result<(), crate::link::LinkError> {
            self.link.tx_write(rmb, offset, data)
        }
        fn tx_read(&self, rmb: u32, offset: u32, dst: &mut [u8]) -> Result<(), crate::link::LinkError> {
            self.link.tx_read(rmb, offset, dst)
        }
        fn tx_fill(
            &self,
            rmb: u32,
            offset: u32,
            len: u32,
            fill: &mut dyn FnMut(crate::link::TxSpan) -> std::io::Result<usize>,
        ) -> Result<std::io::Result<usize>, crate::link::LinkError> {
            self.link.tx_fill(rmb, offset, len, fill)
        }
        fn rx_read(
            &self,
            rmb: u32,
            offset: u32,
            dst: &mut [std::mem::MaybeUninit<u8>],
        ) -> Result<(), crate::link::LinkError> {
            self.link.rx_read(rmb, offset, dst)
        }
        fn cdc_send_frame(&self, frame: &[u8; crate::proto::cdc::CDC_MSG_LEN]) -> Result<bool, crate::link::LinkError> {
            self.link.cdc_send_frame(frame)
        }
        fn cdc_recv(
            &self,
            out: &mut Vec<[u8; crate::proto::cdc::CDC_MSG_LEN]>,
            max: usize,
        ) -> Result<Option<usize>, crate::link::LinkError> {
            if let Some(calls) = &self.flood {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                out.extend(std::iter::repeat_n(CdcMsg::new(1, 0xdead).encode(), max));
                return Ok(Some(max));
            }
            self.link.cdc_recv(out, max)
        }
        fn next_frame(&self) -> Option<[u8; crate::proto::cdc::CDC_MSG_LEN]> {
            self.link.next_frame()
        }
        fn cdc_recv_if(
            &self,
            want: &mut dyn FnMut(&[u8; crate::proto::cdc::CDC_MSG_LEN]) -> bool,
        ) -> Option<([u8; crate::proto::cdc::CDC_MSG_LEN], Result<(), crate::link::LinkError>)> {
            let (frame, after) = self.link.cdc_recv_if(want)?;
            Some((frame, self.after_recv.clone().map_or(after, Err)))
        }
        fn poll_event(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), crate::link::LinkError>> {
            self.link.poll_event(cx)
        }
        fn clear_space_wait(&self) {
            self.link.clear_space_wait()
        }
        fn watches_space(&self) -> bool {
            self.link.watches_space()
        }
        fn has_pending(&self) -> bool {
            self.link.has_pending()
        }
        fn busy_poll(&self) -> Duration {
            self.link.busy_poll()
        }
        fn is_rdma(&self) -> bool {
            self.rdma
        }
        fn poll_delivered(
            &self,
            cx: &mut std::task::Context<'_>,
            _: u64,
        ) -> std::task::Poll<Result<(), crate::link::LinkError>> {
            let Some(d) = &self.delivery else { return std::task::Poll::Ready(Ok(())) };
            let mut d = d.0.lock().unwrap();
            match d.0 {
                Some(true) => std::task::Poll::Ready(Ok(())),
                Some(false) => std::task::Poll::Ready(Err(crate::link::LinkError::PeerGone)),
                None => {
                    d.1.push(cx.waker().clone());
                    std::task::Poll::Pending
                }
            }
        }
        fn rehome(&self) -> Result<(), crate::link::LinkError> {
            self.link.rehome()
        }
        fn teardown(&self) {
            self.link.teardown()
        }
    }

    /// Lets the timers of an unanswered abort run out (the connection's 30 s bound) on a
    /// paused clock. (A timer's task runs once first, to start its timer.)
    async fn past_the_answer_bound() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(31)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::resume();
    }

    /// The aborts sent to the peer's connection `token` that the peer's end of the link holds.
    fn aborts_to(peer: &impl Link, token: u32) -> usize {
        let mut frames = Vec::new();
        let _ = peer.cdc_recv(&mut frames, 16).unwrap();
        frames
            .iter()
            .filter_map(|f| CdcMsg::decode(f).ok())
            .filter(|m| m.token == token && m.flags.contains(crate::proto::cdc::CdcFlags::PEER_CONN_ABORT))
            .count()
    }

    /// A connection a handshake set up and then let go (`PendingConn`) goes as far as the
    /// handshake got, over shared memory and over a link whose peer writes into our memory
    /// (RDMA): its slot comes back while the peer could not write into it, or once the peer's
    /// Decline said it will not; once the peer may write (our Confirm went out), the slot is
    /// retired over RDMA (a stale writer's bytes must not reach the slot's next connection) and
    /// comes back over shared memory (where the peer writes only its own region); once
    /// committed, the peer is sent an abort, and the slot waits for its answer, for a bound: a
    /// peer that never answers has the connection forgotten and its slot retired.
    #[tokio::test]
    async fn a_pending_connection_is_let_go_as_far_as_its_handshake_got() {
        use crate::smc::conn::PendingConn;
        let cfg = crate::config::ShmConfig::default();
        let ring = crate::proto::cursor::RingSize::new(4096).unwrap();
        for rdma in [false, true] {
            // A group of two slots, established, and the peer's end of its link.
            let group_of_two = |tag: &'static str| async move {
                let (client, server) = joined(Layout::new(4, 4, 4096).unwrap(), tag).await;
                let group = client_group(2, Duration::from_secs(60));
                let link: Arc<dyn Link> = if rdma { Arc::new(Posing::rdma(client)) } else { Arc::new(client) };
                group.establish(link).unwrap();
                (group, server)
            };
            let kind = if rdma { "rdma" } else { "shm" };
            let open = |g: &Arc<LinkGroup>, peer: u32| g.open_conn(Some(peer), ring, &cfg).ok();
            // Let go in each state: whether a slot is free again right after.
            let free_after = |g: &Arc<LinkGroup>, held: &dyn Fn(&mut PendingConn)| {
                let mut p = PendingConn::holding(open(g, 77).expect("a slot"));
                held(&mut p);
                drop(p);
                let (a, b) = (open(g, 78), open(g, 79));
                a.is_some() && b.is_some()
            };
            let (g, _server) = group_of_two(if rdma { "pending-open-rdma" } else { "pending-open-shm" }).await;
            assert!(free_after(&g, &|_| {}), "{kind}: a slot no peer could write into did not come back");
            let (g, _server) = group_of_two(if rdma { "pending-may-rdma" } else { "pending-may-shm" }).await;
            let came_back = free_after(&g, &|p| p.peer_may_write());
            assert_eq!(came_back, !rdma, "{kind}: a slot the peer may write into came back: {came_back}");
            let (g, _server) = group_of_two(if rdma { "pending-declined-rdma" } else { "pending-declined-shm" }).await;
            assert!(
                free_after(&g, &|p| {
                    p.peer_may_write();
                    p.peer_will_not_write();
                }),
                "{kind}: a slot whose peer declined did not come back"
            );
            let (g, server) = group_of_two(if rdma { "pending-committed-rdma" } else { "pending-committed-shm" }).await;
            assert!(!free_after(&g, &|p| p.committed()), "{kind}: a committed connection's slot came back unanswered");
            let aborts = aborts_to(&server, 77);
            assert_eq!(aborts, 1, "{kind}: the committed connection's peer was sent {aborts} aborts");
            // This peer never answers (a real one that never committed drops the abort): past
            // the bound the connection is forgotten and its slot retired, so that the group
            // can go idle.
            let held = g.conn_count();
            past_the_answer_bound().await;
            assert_eq!(g.conn_count(), held - 1, "{kind}: an unanswered abort held its connection past the bound");
            assert!(open(&g, 80).is_none(), "{kind}: the unanswered connection's slot was used again");
        }
    }

    /// A connection (peer token 77) on a new client group of two slots over `link` (made of our
    /// end of a shared-memory link), with a TCP connection beside it: the group, the
    /// connection, the peer's end of the link, our TCP socket and the peer's.
    async fn conn_beside_tcp(
        tag: &'static str,
        link: impl FnOnce(crate::link::shm::ShmLink) -> Arc<dyn Link>,
    ) -> (
        Arc<LinkGroup>,
        Arc<crate::smc::conn::SmcConn>,
        crate::link::shm::ShmLink,
        tokio::net::TcpStream,
        tokio::net::TcpStream,
    ) {
        let cfg = crate::config::ShmConfig::default();
        let ring = crate::proto::cursor::RingSize::new(4096).unwrap();
        let (client, server) = joined(Layout::new(4, 4, 4096).unwrap(), tag).await;
        let g = client_group(2, Duration::from_secs(60));
        g.establish(link(client)).unwrap();
        let conn = g.open_conn(Some(77), ring, &cfg).expect("a slot");
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (tcp, accepted) = tokio::join!(tokio::net::TcpStream::connect(l.local_addr().unwrap()), l.accept());
        (g, conn, server, tcp.unwrap(), accepted.unwrap().0)
    }

    /// A peer that resizes our receive ring (here to one byte) breaks the protocol on an RDMA
    /// link, whose rings are registered memory of a fixed size: the connection fails. Over
    /// shared memory the same message is taken.
    #[tokio::test]
    async fn a_resize_is_refused_over_rdma_and_taken_over_shared_memory() {
        let mut resize = CdcMsg::new(1, 1);
        resize.set_resize(1);
        let (_g, conn, _server, _tcp, _theirs) =
            conn_beside_tcp("resize-rdma", |client| Arc::new(Posing::rdma(client))).await;
        conn.on_cdc(&resize);
        assert!(conn.try_write(b"x").is_err(), "the resize was taken over rdma");
        let (_g, conn, _server, _tcp, _theirs) = conn_beside_tcp("resize-shm", |client| Arc::new(client)).await;
        conn.on_cdc(&resize);
        assert_eq!(conn.try_write(b"x").unwrap(), 1, "the resize broke the connection over shared memory");
    }

    /// Over RDMA the TCP socket of a connection the application let go of ends with a FIN only
    /// once its close (and what it wrote before) is delivered, and with a reset when the
    /// delivery fails: a FIN sent before would read, on the peer, as the clean end of a stream
    /// that may have lost its last bytes.
    #[tokio::test]
    async fn an_rdma_close_ends_tcp_with_a_fin_once_delivered_and_a_reset_if_not() {
        use tokio::io::AsyncReadExt;
        for delivered in [true, false] {
            let tag = if delivered { "fin-delivered" } else { "fin-undelivered" };
            let delivery = Arc::new(Delivery::default());
            let posing = |client| -> Arc<dyn Link> {
                Arc::new(Posing { delivery: Some(delivery.clone()), ..Posing::rdma(client) })
            };
            let (_g, conn, _server, tcp, mut theirs) = conn_beside_tcp(tag, posing).await;
            let watcher = conn.watch_tcp(Arc::new(tcp));
            assert_eq!(conn.try_write(b"the last bytes").unwrap(), 14);
            conn.release(false, watcher.take());
            let mut b = [0u8; 8];
            let early = tokio::time::timeout(Duration::from_millis(100), theirs.read(&mut b)).await;
            assert!(early.is_err(), "{tag}: the tcp connection ended before the close was delivered: {early:?}");
            delivery.set(delivered);
            let end = tokio::time::timeout(Duration::from_secs(10), theirs.read(&mut b)).await.expect("an end");
            if delivered {
                assert_eq!(end.unwrap(), 0, "{tag}: not a FIN");
            } else {
                assert_eq!(end.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset, "{tag}: not a reset");
            }
        }
    }

    /// A close in flight holds its link, and, once the group let go of it (the link failed), may
    /// hold its last reference: that one is dropped on the RDMA setup thread, as the group's
    /// own, not on the runtime's thread where the close's task ends (destroying a queue pair and
    /// deregistering memory take the process's memory-map lock).
    #[cfg(feature = "rdma")]
    #[tokio::test]
    async fn a_close_holding_its_links_last_reference_lets_it_go_on_the_setup_thread() {
        let (client, _server) = joined(Layout::new(4, 4, 4096).unwrap(), "last-link-ref").await;
        let (tx, rx) = std::sync::mpsc::channel();
        let delivery = Arc::new(Delivery::default());
        let link: Arc<dyn Link> =
            Arc::new(Posing { delivery: Some(delivery.clone()), _probe: Some(DropProbe(tx)), ..Posing::rdma(client) });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (tcp, _theirs) = tokio::join!(tokio::net::TcpStream::connect(l.local_addr().unwrap()), l.accept());
        crate::smc::tcp_end::FinOnDelivery::new(link, Arc::new(tcp.unwrap())).spawn();
        // The close's task, on this runtime, ends with the delivery.
        delivery.set(true);
        let dropped_on = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match rx.try_recv() {
                    Ok(name) => return name,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        })
        .await
        .expect("the link was never dropped");
        assert_eq!(dropped_on.as_deref(), Some("smc-tokio-rdma-setup"));
    }

    /// Closes deferred on a thread (a runtime that shuts down drops their task inside `spawn`,
    /// under a connection's lock) are settled at the group's next turn on it, wherever the close
    /// went out (a close that waited for CDC space goes out as a message of the peer's is
    /// dispatched), not only at a connection's release.
    #[tokio::test]
    async fn a_groups_turn_settles_the_closes_its_thread_deferred() {
        use tokio::io::AsyncReadExt;
        let posing = |client| -> Arc<dyn Link> { Arc::new(Posing::rdma(client)) };
        let (g, _conn, _server, tcp, mut theirs) = conn_beside_tcp("settled-at-turn", posing).await;
        let link = g.link().expect("the link").clone();
        crate::smc::tcp_end::defer(crate::smc::tcp_end::FinOnDelivery::new(link, Arc::new(tcp)));
        assert_eq!(crate::smc::tcp_end::deferred_here(), 1);
        g.progress();
        assert_eq!(crate::smc::tcp_end::deferred_here(), 0, "the group's turn left a deferred close");
        // Delivered (the posing link delivers at once): its socket ended with a FIN.
        let mut b = [0u8; 8];
        let end = tokio::time::timeout(Duration::from_secs(10), theirs.read(&mut b)).await.expect("an end");
        assert_eq!(end.unwrap(), 0);
    }

    /// A released connection whose close never went out (the peer never took a CDC frame, and
    /// its ring is full) and whose peer stays silent ends its TCP connection with a reset once
    /// forgotten: the peer may lack the bytes the close would have announced, and a FIN would
    /// read as the clean end of a whole stream.
    #[tokio::test]
    async fn a_close_that_never_went_out_ends_tcp_with_a_reset() {
        use tokio::io::AsyncReadExt;
        let shm = |client| -> Arc<dyn Link> { Arc::new(client) };
        let (_g, conn, _server, tcp, mut theirs) = conn_beside_tcp("close-never-sent", shm).await;
        let watcher = conn.watch_tcp(Arc::new(tcp));
        // Nobody takes the frames on the other end: each flushed write is one, until the CDC
        // ring is full.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for i in 0..64u8 {
            assert_eq!(conn.try_write(&[i]).unwrap(), 1);
            if conn.poll_flush(&mut cx).is_pending() {
                break;
            }
        }
        conn.release(false, watcher.take());
        conn.end_if_silent(std::time::Instant::now() + Duration::from_secs(3600));
        let mut b = [0u8; 8];
        let end = tokio::time::timeout(Duration::from_secs(10), theirs.read(&mut b)).await.expect("an end");
        assert_eq!(end.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset, "not a reset");
    }

    /// Over RDMA a connection that ended with its link group where it could not move (here the
    /// group torn down with its runtime) ends its TCP connection with a reset: what it wrote
    /// last may not have reached the peer, and a FIN would read as a clean end after it.
    #[tokio::test]
    async fn an_rdma_connection_ended_with_its_group_resets_its_tcp_connection() {
        use tokio::io::AsyncReadExt;
        let posing = |client| -> Arc<dyn Link> { Arc::new(Posing::rdma(client)) };
        let (g, conn, _server, tcp, mut theirs) = conn_beside_tcp("reset-with-group", posing).await;
        let tcp = Arc::new(tcp);
        let watcher = conn.watch_tcp(tcp.clone());
        assert_eq!(conn.try_write(b"the last bytes").unwrap(), 14);
        g.fail(crate::link::LinkError::Closed);
        conn.release(false, watcher.take());
        drop(tcp);
        let mut b = [0u8; 8];
        let end = tokio::time::timeout(Duration::from_secs(10), theirs.read(&mut b)).await.expect("an end");
        assert_eq!(end.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
    }

    /// A connection reset in a closed listener's ready queue (`Established::reset`) is aborted,
    /// and a peer that never answers the abort has it forgotten and its slot retired after the
    /// bound, as a handshake's committed connection has.
    #[tokio::test]
    async fn a_reset_connection_whose_peer_never_answers_is_let_go_after_the_bound() {
        let cfg = crate::config::ShmConfig::default();
        let ring = crate::proto::cursor::RingSize::new(4096).unwrap();
        let shm = |client| -> Arc<dyn Link> { Arc::new(client) };
        let (g, conn, server, tcp, _theirs) = conn_beside_tcp("reset-unanswered", shm).await;
        let held = g.conn_count();
        crate::handshake::Established::smc(tcp, conn, crate::Transport::SmcD).reset();
        let aborts = aborts_to(&server, 77);
        assert_eq!(aborts, 1, "the reset connection's peer was sent {aborts} aborts");
        assert_eq!(g.conn_count(), held, "the connection waits for its peer's answer");
        past_the_answer_bound().await;
        assert_eq!(g.conn_count(), held - 1, "an unanswered abort held the reset connection past the bound");
        assert!(g.open_conn(Some(78), ring, &cfg).is_ok(), "the other slot is still there");
        assert!(g.open_conn(Some(79), ring, &cfg).is_err(), "the unanswered connection's slot was used again");
    }
}
