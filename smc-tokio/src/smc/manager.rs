//! A context's link-group manager: its link groups of both kinds (shared memory in
//! [`shm`](crate::smc::shm), RDMA in `smc::rdma`, feature `rdma`), the RMB memory budget they
//! charge and the counters they feed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::RmbBudget;
use crate::proto::clc::DeclineReason;
use crate::smc::group::LinkGroup;
use crate::stats::Counters;
use crate::sys;

/// The shares of a bounded resource of a listener (door connections, registrations,
/// shared-memory link groups) that the clients of uids other than the listener's own may hold,
/// as divisors of the bound: all of them together half, any one of them a quarter. Half stays
/// for the listener's own uid, which no share bounds, and a quarter at least for the other uids
/// besides a greedy one: with other uids trusted (`SMC_TOKIO_SHM_ALLOW_UIDS`), one of them could
/// otherwise take the whole bound, and every other client's connections would go plain.
pub(crate) const OTHER_UIDS_SHARE: usize = 2;
/// See [`OTHER_UIDS_SHARE`].
pub(crate) const OTHER_UID_SHARE: usize = 4;

/// Where the clients of `uid` stand against the shares of a resource of `bound` places
/// ([`OTHER_UIDS_SHARE`], [`OTHER_UID_SHARE`], each at least one place), of which they hold
/// `of_uid` and the clients of every uid but ours (`own`) `of_others`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UidShare {
    /// Room for one more: ours, which no share bounds, or below both shares.
    Within,
    /// That uid's own share is full.
    UidFull,
    /// The share of all other uids together is full.
    OthersFull,
}

/// See [`UidShare`].
pub(crate) fn uid_share(uid: u32, own: u32, of_uid: usize, of_others: usize, bound: usize) -> UidShare {
    let share = |d: usize| (bound / d).max(1);
    if uid == own {
        UidShare::Within
    } else if of_uid >= share(OTHER_UID_SHARE) {
        UidShare::UidFull
    } else if of_others >= share(OTHER_UIDS_SHARE) {
        UidShare::OthersFull
    } else {
        UidShare::Within
    }
}

pub(crate) struct Manager {
    instance: u64,
    /// The shared-memory groups and the side channels that set them up.
    pub(crate) shm: crate::smc::shm::Registry,
    /// The RDMA groups (feature `rdma`).
    #[cfg(feature = "rdma")]
    pub(crate) rdma: crate::smc::rdma::Registry,
    pub(crate) counters: Arc<Counters>,
    budget: Arc<RmbBudget>,
    /// TCP sockets of released shared-memory connections kept open for their peer's close
    /// ([`TcpHold`]).
    held_tcp: AtomicUsize,
    /// At most this many ([`held_tcp_max`]).
    held_tcp_max: usize,
}

/// How many TCP sockets of released connections a context keeps open for their peers' closes:
/// a sixteenth of the process's descriptor limit (a process with one context keeps most of its
/// descriptors for new connections; each further context may keep as many), and at most 1024
/// (the listener's default backlog: a burst of connection-per-request closes). Beyond it a
/// close sends its FIN as before.
fn held_tcp_max() -> usize {
    let soft = sys::nofile_limit().unwrap_or(1024);
    usize::try_from(soft / 16).unwrap_or(usize::MAX).min(1024)
}

/// A released shared-memory connection's TCP socket, kept open until the peer lets go of its
/// end too: the last of the two closes then resets the TCP connection instead of each sending
/// a FIN, so neither end goes through the FIN exchange or leaves a socket in `TIME_WAIT`
/// (nothing of the stream is on TCP; the peer learns of the close from its ring). One place
/// of the context's [`Manager::hold_tcp`] budget, given back when dropped.
pub(crate) struct TcpHold(Arc<Manager>);

impl std::fmt::Debug for TcpHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TcpHold")
    }
}

impl Drop for TcpHold {
    fn drop(&mut self) {
        self.0.held_tcp.fetch_sub(1, Ordering::Relaxed);
        self.0.counters.tcp_held(false);
    }
}

impl Manager {
    /// A manager with no groups, counting into `counters` and charging `budget`.
    pub(crate) fn new(counters: Arc<Counters>, budget: Arc<RmbBudget>) -> Arc<Manager> {
        Arc::new(Manager {
            instance: sys::random_u64(),
            shm: Default::default(),
            #[cfg(feature = "rdma")]
            rdma: Default::default(),
            counters,
            budget,
            held_tcp: AtomicUsize::new(0),
            held_tcp_max: held_tcp_max(),
        })
    }

    /// A place to keep a released connection's TCP socket open for its peer's close, or `None`
    /// when the context keeps as many as it may ([`held_tcp_max`]).
    pub(crate) fn hold_tcp(self: &Arc<Self>) -> Option<TcpHold> {
        let max = self.held_tcp_max;
        self.held_tcp.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1)).ok().map(
            |_| {
                self.counters.tcp_held(true);
                TcpHold(self.clone())
            },
        )
    }

    /// Reserves `bytes` of RMB memory against the context's cap ([`RmbBudget`]).
    pub(crate) fn charge_rmb(&self, bytes: u64) -> bool {
        self.budget.charge(bytes)
    }

    pub(crate) fn uncharge_rmb(&self, bytes: u64) {
        self.budget.uncharge(bytes)
    }

    /// The RMB memory budget.
    pub(crate) fn budget(&self) -> &Arc<RmbBudget> {
        &self.budget
    }

    /// Forgets a dead group.
    pub(crate) fn forget(&self, group: &LinkGroup) {
        #[cfg(feature = "rdma")]
        self.rdma.forget(group);
        self.shm.forget(group);
    }

    /// This process's manager instance: a random id that, with the pid, names this client to
    /// servers (through the door, never on the wire).
    pub(crate) fn instance(&self) -> u64 {
        self.instance
    }
}

/// Room for a new link group under a bound. `look`, under its registry's lock, goes on where
/// there is room (`Ok`, with what it made or found), or names the groups one of which must end
/// to make it (`Err`). Each round ends one idle group among them
/// ([`LinkGroup::end_if_idle`]) outside that lock (an ended group's manager forgets it, under
/// it); a few rounds cover admissions running at once. When none is idle, the new group is
/// declined (the connection stays TCP).
pub(crate) fn make_room<T>(mut look: impl FnMut() -> Result<T, Vec<Arc<LinkGroup>>>) -> Result<T, DeclineReason> {
    for _ in 0..4 {
        match look() {
            Ok(t) => return Ok(t),
            Err(candidates) if candidates.iter().any(|g| g.end_if_idle()) => {}
            Err(_) => break,
        }
    }
    // The last round's end may have made the room.
    if let Ok(t) = look() {
        return Ok(t);
    }
    tracing::debug!("no room for another link group, and none is idle: declining");
    Err(DeclineReason::OutOfMemory)
}
