//! A server's bounds per client host on what remote hosts make it set up and hold: new link
//! groups in a rate (their tokens given back once the client's queue pair shows itself), and
//! RMB memory held by handshakes and registered by groups, a share of the budget per host.

use std::sync::Arc;

use super::{make_room, State};
use crate::link::verbs::LinkTally;
use crate::proto::clc::DeclineReason;
use crate::smc::manager::Manager;

/// What the bounds per client host ask of a server group's link.
pub(super) trait HostLink: Send + Sync {
    /// Whether the peer showed that its queue pair is there ([`LinkTally::peer_answered`]).
    fn peer_answered(&self) -> bool;
    /// Bytes registered (pinned) now ([`LinkTally::pinned_bytes`]).
    fn pinned_bytes(&self) -> u64;
}

impl HostLink for LinkTally {
    fn peer_answered(&self) -> bool {
        LinkTally::peer_answered(self)
    }

    fn pinned_bytes(&self) -> u64 {
        LinkTally::pinned_bytes(self)
    }
}

/// The client host a GID names, for the bounds per host ([`crate::sys::host_of`]: an IPv4
/// address, an IPv6 /64).
pub(super) fn host_of(gid: [u8; 16]) -> [u8; 16] {
    crate::sys::host_of(std::net::Ipv6Addr::from(gid).into()).octets()
}

/// A token bucket: `burst` tokens at most, refilled at `per_sec` a second.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bucket {
    tokens: f64,
    at: std::time::Instant,
}

impl Bucket {
    fn full(burst: f64, now: std::time::Instant) -> Bucket {
        Bucket { tokens: burst, at: now }
    }

    /// The tokens at `now`, refilled since the last look.
    fn refill(&mut self, (burst, per_sec): (f64, f64), now: std::time::Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_sec).min(burst);
        // Callers' instants may come out of order (one taken before another's lock): the
        // bucket's time never goes back, so no interval is credited twice.
        self.at = self.at.max(now);
        self.tokens
    }

    fn give_back(&mut self, rate: (f64, f64), now: std::time::Instant) {
        self.refill(rate, now);
        self.tokens = (self.tokens + 1.0).min(rate.0);
    }
}

/// New server groups a client host may have with no sign of its queue pair: 16 at once, then 4
/// a second ([`take_group_token`]). A group costs the setup thread, which every RDMA handshake
/// of the process waits for, a protection domain, a completion queue, a queue pair moved
/// through its states and 4 MiB registered (pinned). A client of ours asks for a new group for
/// its first connection with a server (once per process and context), for another ring size,
/// or when its group is full, and its queue pair answers the server's first message within a
/// round trip of the Confirm. The numbers are a choice, not a measurement: above what the
/// processes of one host ask for at once, far below a setup thread's worth.
pub(super) const NEW_GROUPS_PER_HOST: (f64, f64) = (16.0, 4.0);

/// New server groups all client hosts together may have with no sign of their queue pairs: 64
/// at once, then 16 a second (see [`NEW_GROUPS_PER_HOST`]): hosts that propose and never set
/// up a queue pair, each under its own bound, take no more of the setup thread than this
/// between them.
pub(super) const NEW_GROUPS_ALL: (f64, f64) = (64.0, 16.0);

/// Gives back the tokens of groups whose link showed the client's queue pair
/// ([`take_group_token`]). A group that ends first spent its token, unless its link had
/// answered (`Registry::forget`): at most one entry per server group is owed, so the debt is
/// bounded as the groups are.
pub(super) fn settle_group_tokens(s: &mut State, now: std::time::Instant) {
    let mut back = Vec::new();
    for g in s.server_groups.values_mut() {
        if g.owes_token && g.link.as_ref().is_some_and(|l| l.peer_answered()) {
            g.owes_token = false;
            back.push(g.host);
        }
    }
    for host in back {
        give_group_token(s, host, now);
    }
}

/// Whether a token for a new server group for the client host `host` is there (see
/// [`take_group_token`]), without taking it. A host with a token out (a new group whose queue
/// pair has not answered yet, or one that ended without answering, until its bucket refilled)
/// may not take the last half of all hosts' tokens: that half is kept for hosts with none, so
/// that a few hosts that never answer cannot hold everyone's new groups back.
pub(super) fn group_token_ready(s: &mut State, host: [u8; 16], now: std::time::Instant) -> bool {
    settle_group_tokens(s, now);
    let all = s.new_groups_all.get_or_insert_with(|| Bucket::full(NEW_GROUPS_ALL.0, now)).refill(NEW_GROUPS_ALL, now);
    if s.new_groups.len() >= 64 {
        // A host whose bucket is full again is as if never seen.
        s.new_groups.retain(|_, b| b.refill(NEW_GROUPS_PER_HOST, now) < NEW_GROUPS_PER_HOST.0);
    }
    let own = s.new_groups.get_mut(&host).map_or(NEW_GROUPS_PER_HOST.0, |b| b.refill(NEW_GROUPS_PER_HOST, now));
    // A host whose bucket is not full has a token out: a new group not answered yet, or one
    // that ended without answering (its bucket refills in a quarter of a second per token).
    let waiting = own < NEW_GROUPS_PER_HOST.0;
    let kept = if waiting { NEW_GROUPS_ALL.0 / 2.0 } else { 0.0 };
    own >= 1.0 && all >= kept + 1.0
}

/// [`group_token_ready`], or the decline for a Proposal without a token: congested.
pub(super) fn group_token_or_decline(
    s: &mut State,
    host: [u8; 16],
    now: std::time::Instant,
) -> Result<(), DeclineReason> {
    if group_token_ready(s, host, now) {
        return Ok(());
    }
    tracing::debug!("too many new rdma link groups of this client, or of all, lately: declining");
    Err(DeclineReason::HandshakeCongested)
}

/// Takes a token for a new server group for the client host `host`, from its bucket and from
/// all hosts' ([`NEW_GROUPS_PER_HOST`], [`NEW_GROUPS_ALL`]); once the group's link shows that
/// the client's queue pair is there, both are given back ([`settle_group_tokens`]), so a host
/// whose groups come up is not held back. Without a token the Proposal is declined as
/// congested: a remote host that proposed a new group and closed, or confirmed it over TCP with
/// no queue pair behind it, again and again, made the server set up a group for each (on the
/// thread every RDMA handshake waits for) without bound.
pub(super) fn take_group_token(s: &mut State, host: [u8; 16], now: std::time::Instant) -> Result<(), DeclineReason> {
    group_token_or_decline(s, host, now)?;
    s.new_groups.entry(host).or_insert_with(|| Bucket::full(NEW_GROUPS_PER_HOST.0, now)).tokens -= 1.0;
    if let Some(all) = s.new_groups_all.as_mut() {
        all.tokens -= 1.0;
    }
    Ok(())
}

/// Gives a token back ([`take_group_token`]).
pub(super) fn give_group_token(s: &mut State, host: [u8; 16], now: std::time::Instant) {
    if let Some(b) = s.new_groups.get_mut(&host) {
        b.give_back(NEW_GROUPS_PER_HOST, now);
    }
    if let Some(b) = s.new_groups_all.as_mut() {
        b.give_back(NEW_GROUPS_ALL, now);
    }
}

/// Bytes of RMB memory one client host may have a server's handshakes and groups hold: a
/// quarter of the context's RMB budget (256 MiB by default), all hosts together half of it, as
/// for groups ([`max_groups_per_peer`], [`max_server_groups`]). Counted twice: the rings and
/// send buffers of handshakes between Accept and Confirm, and the chunks the host's groups
/// have registered (pinned). A connection registers its ring's and send buffer's chunks at the
/// Accept, and a chunk stays registered while its group lives: a host that had one group
/// confirmed made the server pin the whole budget with some 800 Proposals naming that group,
/// never confirmed, and keep it pinned.
fn host_bounds(manager: &Manager) -> (u64, u64) {
    let cap = manager.budget().cap();
    (cap / 4, cap / 2)
}

/// A server handshake's share of [`host_bounds`], given back when dropped.
pub(super) struct HandshakeHold {
    manager: Arc<Manager>,
    host: [u8; 16],
    bytes: u64,
}

impl std::fmt::Debug for HandshakeHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeHold").field("bytes", &self.bytes).finish()
    }
}

/// Which share a handshake would take past ([`host_room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Over {
    /// The client host's.
    Host,
    /// All hosts'.
    All,
}

/// Whether a server handshake for the client host `host` may hold `bytes` and register `pin`
/// more: not when that host's handshakes, or all hosts', hold their share already, nor when
/// that host's groups, or all hosts', have so much registered that `pin` would take them past
/// it ([`host_bounds`]).
pub(super) fn host_room(s: &State, manager: &Manager, host: [u8; 16], bytes: u64, pin: u64) -> Result<(), Over> {
    let (per_host, all) = host_bounds(manager);
    let (mut pinned_host, mut pinned_all) = (0u64, 0u64);
    for g in s.server_groups.values() {
        let p = g.link.as_ref().map_or(0, |l| l.pinned_bytes());
        pinned_all += p;
        if g.host == host {
            pinned_host += p;
        }
    }
    let held_host = s.held.get(&host).copied().unwrap_or(0);
    let fits = |have: u64, add: u64, bound: u64| have.saturating_add(add) <= bound;
    if !(fits(held_host, bytes, per_host) && fits(pinned_host, pin, per_host)) {
        return Err(Over::Host);
    }
    if !(fits(s.held_total, bytes, all) && fits(pinned_all, pin, all)) {
        return Err(Over::All);
    }
    Ok(())
}

/// Makes room for a server handshake of `host` ([`host_room`]), ending an idle group to make it
/// where there is none ([`make_room`]): the host's own where its share is full, anyone's where
/// all hosts' is. A host whose connections once took its share and closed would otherwise get
/// TCP until its idle groups' timeout. `then` takes the room, under the registry's lock.
fn host_room_then(
    manager: &Manager,
    (host, bytes, pin): ([u8; 16], u64, u64),
    mut then: impl FnMut(&mut State),
) -> Result<(), DeclineReason> {
    make_room(manager, |s| match host_room(s, manager, host, bytes, pin) {
        Ok(()) => {
            then(s);
            None
        }
        Err(over) => {
            let groups = s.server_groups.values().filter(|g| over == Over::All || g.host == host);
            Some(groups.filter_map(|g| g.group.upgrade()).collect())
        }
    })
    .inspect_err(|_| {
        tracing::debug!("this client's rdma handshakes or groups hold their share of the rmb budget: declining");
    })
}

/// Whether a server handshake of `host` has room ([`host_room_then`]), taking none.
pub(super) fn make_host_room(manager: &Manager, host: [u8; 16], bytes: u64, pin: u64) -> Result<(), DeclineReason> {
    host_room_then(manager, (host, bytes, pin), |_| {})
}

/// Counts `bytes` held by a server handshake for the client host `host` that registers `pin`
/// more, where there is room or an idle group can make it ([`host_room_then`]).
pub(super) fn hold_for_handshake(
    manager: &Arc<Manager>,
    host: [u8; 16],
    bytes: u64,
    pin: u64,
) -> Result<HandshakeHold, DeclineReason> {
    host_room_then(manager, (host, bytes, pin), |s| {
        *s.held.entry(host).or_default() += bytes;
        s.held_total += bytes;
    })?;
    Ok(HandshakeHold { manager: manager.clone(), host, bytes })
}

impl Drop for HandshakeHold {
    fn drop(&mut self) {
        let mut s = self.manager.rdma.lock();
        if let std::collections::hash_map::Entry::Occupied(mut e) = s.held.entry(self.host) {
            *e.get_mut() = e.get().saturating_sub(self.bytes);
            if *e.get() == 0 {
                e.remove();
            }
        }
        s.held_total = s.held_total.saturating_sub(self.bytes);
    }
}

#[cfg(test)]
/// A stand-in for a server group's link: whether its peer answered, what it pinned.
#[derive(Default)]
pub(super) struct FakeLink {
    pub(super) answered: std::sync::atomic::AtomicBool,
    pub(super) pinned: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
impl HostLink for FakeLink {
    fn peer_answered(&self) -> bool {
        self.answered.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn pinned_bytes(&self) -> u64 {
        self.pinned.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::admit_server_group;
    use super::{
        give_group_token, group_token_ready, hold_for_handshake, host_of, settle_group_tokens, take_group_token,
        FakeLink, NEW_GROUPS_ALL, NEW_GROUPS_PER_HOST,
    };
    use crate::config::RmbBudget;
    use crate::proto::clc::DeclineReason;
    use crate::smc::group::{GroupTimes, LinkGroup, Role, TxRmbs};
    use crate::smc::manager::Manager;
    use crate::smc::rdma::State;

    fn gid(host: u8) -> [u8; 16] {
        let mut g = [0; 16];
        g[15] = host;
        g
    }

    /// A host that makes new groups whose queue pair never answers gets `NEW_GROUPS_PER_HOST`'s
    /// burst, then its rate; all hosts together `NEW_GROUPS_ALL`'s. A group whose link shows
    /// the client's queue pair gives its token back (a Confirm over TCP alone does not), so a
    /// host whose groups come up is never held back; one that ended without spent it.
    #[test]
    fn new_groups_whose_queue_pair_never_answers_are_bounded_in_rate() {
        let t0 = std::time::Instant::now();
        let mut s = State::default();
        let burst = NEW_GROUPS_PER_HOST.0 as usize;
        for i in 0..burst {
            assert_eq!(take_group_token(&mut s, gid(1), t0), Ok(()), "group {i} of the burst");
        }
        assert_eq!(take_group_token(&mut s, gid(1), t0), Err(DeclineReason::HandshakeCongested));
        assert_eq!(take_group_token(&mut s, gid(2), t0), Ok(()), "another host is not held back by the first");
        // A quarter of a second later the first host has one more (4 a second).
        let later = t0 + Duration::from_millis(250);
        assert_eq!(take_group_token(&mut s, gid(1), later), Ok(()));
        assert_eq!(take_group_token(&mut s, gid(1), later), Err(DeclineReason::HandshakeCongested));

        // A group never made gives its token back at once.
        give_group_token(&mut s, gid(1), later);
        assert_eq!(take_group_token(&mut s, gid(1), later), Ok(()));

        // A server admits new groups under that bound, and a host past it ends nobody's idle
        // group for room.
        let manager = Manager::new(Arc::default(), Arc::new(RmbBudget::new()));
        for id in 0..burst as u64 {
            assert_eq!(admit_server_group(&manager, id, gid(7), t0), Ok(()));
        }
        assert_eq!(admit_server_group(&manager, 99, gid(7), t0), Err(DeclineReason::HandshakeCongested));
        assert_eq!(manager.rdma.lock().server_groups.len(), burst, "a declined group is not counted");

        // All hosts together: each under its own bound, no more than the overall burst.
        let mut s = State::default();
        let mut taken = 0;
        for host in 0..=255u8 {
            while take_group_token(&mut s, gid(host), t0).is_ok() {
                taken += 1;
            }
        }
        assert_eq!(taken, NEW_GROUPS_ALL.0 as usize);
        assert!(s.new_groups.len() <= 64 + 1, "hosts seen are forgotten once their bucket is full");
        let refilled = t0 + Duration::from_secs(1);
        let mut again = 0;
        for host in 100..=255u8 {
            while take_group_token(&mut s, gid(host), refilled).is_ok() {
                again += 1;
            }
        }
        assert_eq!(again, NEW_GROUPS_ALL.1 as usize, "then the overall rate");
    }

    /// A new group's token comes back once its link shows the client's queue pair (a Confirm
    /// over TCP does not), or at its end if it had by then; one that ended silent spent it. A
    /// host with a group still silent may not take the last half of all hosts' tokens.
    #[test]
    fn a_new_groups_token_comes_back_once_its_queue_pair_answers() {
        let t0 = std::time::Instant::now();
        let manager = Manager::new(Arc::default(), Arc::new(RmbBudget::new()));
        let times = GroupTimes { idle_timeout: Duration::from_secs(60), poll_window: Duration::ZERO };
        let make = |id: u64, host: u8| {
            admit_server_group(&manager, id, gid(host), t0).unwrap();
            let g = LinkGroup::new(id, Role::Server, TxRmbs::verbs(2, 1 << 16), times, manager.clone());
            let l = Arc::new(FakeLink::default());
            manager.rdma.lock().made_server_group(&g, l.clone());
            (g, l)
        };
        let made: Vec<_> = (1..=4).map(|id| make(id, 1)).collect();
        // What came back since `t0`, less the refill since then (4 a second).
        let back = |base: f64| {
            let refill = t0.elapsed().as_secs_f64() * NEW_GROUPS_PER_HOST.1;
            let tokens = manager.rdma.lock().new_groups[&gid(1)].tokens;
            (tokens - base - refill).round()
        };
        let base = NEW_GROUPS_PER_HOST.0 - 4.0;
        let answered = |i: usize| made[i].1.answered.store(true, std::sync::atomic::Ordering::Relaxed);
        let settle = || settle_group_tokens(&mut manager.rdma.lock(), std::time::Instant::now());
        settle();
        assert_eq!(back(base), 0.0, "silent links owe theirs");
        answered(0);
        settle();
        assert_eq!(back(base), 1.0, "an answered link gives its token back");
        answered(1);
        manager.forget(&made[1].0);
        assert_eq!(back(base), 2.0, "so does one that answered and ended before the next look");
        manager.forget(&made[2].0);
        settle();
        assert_eq!(back(base), 2.0, "one that ended silent spent its token");
        assert!(manager.rdma.lock().server_groups[&4].owes_token, "a silent one's is still owed");

        // The last half of all hosts' tokens is kept for hosts with no silent group.
        let manager = Manager::new(Arc::default(), Arc::new(RmbBudget::new()));
        admit_server_group(&manager, 1, gid(9), t0).unwrap();
        let g = LinkGroup::new(1, Role::Server, TxRmbs::verbs(2, 1 << 16), times, manager.clone());
        let silent = Arc::new(FakeLink::default());
        manager.rdma.lock().made_server_group(&g, silent.clone());
        let mut s = manager.rdma.lock();
        for host in [20, 21] {
            while take_group_token(&mut s, gid(host), t0).is_ok() {}
        }
        assert!(s.new_groups_all.unwrap().tokens < NEW_GROUPS_ALL.0 / 2.0 + 1.0);
        assert!(!group_token_ready(&mut s, gid(9), t0), "a host with a silent group waits");
        assert!(group_token_ready(&mut s, gid(30), t0), "a host with none does not");
        silent.answered.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(group_token_ready(&mut s, gid(9), t0), "nor one whose group answered");
        drop(s);
        // A host whose group ended without answering has its token out too, with no group left.
        admit_server_group(&manager, 2, gid(10), t0).unwrap();
        let g = LinkGroup::new(2, Role::Server, TxRmbs::verbs(2, 1 << 16), times, manager.clone());
        manager.rdma.lock().made_server_group(&g, Arc::new(FakeLink::default()));
        manager.forget(&g);
        assert!(!group_token_ready(&mut manager.rdma.lock(), gid(10), t0), "a host that proposed and closed waits");
    }

    /// One host is one IPv4 address or one IPv6 /64, link-local addresses all one.
    #[test]
    fn a_host_is_an_ipv4_address_or_an_ipv6_64() {
        let v4 = |d| std::net::Ipv4Addr::new(192, 0, 2, d).to_ipv6_mapped().octets();
        assert_ne!(host_of(v4(1)), host_of(v4(2)));
        let plain: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(crate::sys::host_of(plain).octets(), host_of(v4(1)), "an IPv4 address, mapped or not");
        let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
        assert_eq!(host_of(v6("2001:db8:1:2::1")), host_of(v6("2001:db8:1:2:ffff::9")));
        assert_ne!(host_of(v6("2001:db8:1:2::1")), host_of(v6("2001:db8:1:3::1")));
        assert_eq!(host_of(v6("fe80::1")), host_of(v6("fe80::2:3:4:5")));
    }

    /// What server handshakes hold between Accept and Confirm (a ring and a send buffer each)
    /// is bounded per client host, and for all hosts together, and given back when the
    /// handshake ends; so is what the host's groups have registered.
    #[test]
    fn one_host_holds_at_most_a_quarter_of_the_budget() {
        let budget = RmbBudget::new();
        budget.set_cap(64 << 20);
        let manager = Manager::new(Arc::default(), Arc::new(budget));
        let each = (256 << 10) + (1 << 20);
        let mut held = Vec::new();
        while let Ok(h) = hold_for_handshake(&manager, gid(1), each, 0) {
            held.push(h);
        }
        assert_eq!(held.len() as u64, (16 << 20) / each, "a quarter of the budget for one host");
        assert_eq!(hold_for_handshake(&manager, gid(1), each, 0).err(), Some(DeclineReason::OutOfMemory));
        let mut others = Vec::new();
        for host in 2..10 {
            while let Ok(h) = hold_for_handshake(&manager, gid(host), each, 0) {
                others.push(h);
            }
        }
        let total = (held.len() + others.len()) as u64 * each;
        assert!(total <= 32 << 20 && total > (32 << 20) - each, "half the budget for all hosts: {total}");
        assert_eq!(hold_for_handshake(&manager, gid(11), each, 0).err(), Some(DeclineReason::OutOfMemory));
        drop(others);
        held.pop();
        assert!(hold_for_handshake(&manager, gid(1), each, 0).is_ok(), "an ended handshake gives its share back");
        drop(held);
        assert!(manager.rdma.lock().held.is_empty());

        // Chunks the host's groups registered count too, whether or not a handshake holds them.
        let link = Arc::new(FakeLink::default());
        link.pinned.store(15 << 20, std::sync::atomic::Ordering::Relaxed);
        let times = GroupTimes { idle_timeout: Duration::from_secs(60), poll_window: Duration::ZERO };
        admit_server_group(&manager, 1, gid(1), std::time::Instant::now()).unwrap();
        let g = LinkGroup::new(1, Role::Server, TxRmbs::verbs(2, 1 << 16), times, manager.clone());
        manager.rdma.lock().made_server_group(&g, link.clone());
        let fresh = 4 << 20;
        assert!(hold_for_handshake(&manager, gid(1), each, 1 << 20).is_ok(), "room for one more chunk pair");
        assert_eq!(hold_for_handshake(&manager, gid(1), each, fresh).err(), Some(DeclineReason::OutOfMemory));
        assert!(hold_for_handshake(&manager, gid(2), each, fresh).is_ok(), "another host is not held back");
        link.pinned.store(31 << 20, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            hold_for_handshake(&manager, gid(2), each, fresh).err(),
            Some(DeclineReason::OutOfMemory),
            "nor past half for all hosts"
        );
        link.pinned.store(0, std::sync::atomic::Ordering::Relaxed);

        // A host whose share is taken by a group with no connection left gets room by its end,
        // once it has been idle for a while.
        let idle_link = Arc::new(FakeLink::default());
        idle_link.pinned.store(16 << 20, std::sync::atomic::Ordering::Relaxed);
        admit_server_group(&manager, 3, gid(3), std::time::Instant::now()).unwrap();
        let idle = LinkGroup::new(3, Role::Server, TxRmbs::verbs(2, 1 << 16), times, manager.clone());
        manager.rdma.lock().made_server_group(&idle, idle_link);
        assert_eq!(hold_for_handshake(&manager, gid(3), each, fresh).err(), Some(DeclineReason::OutOfMemory));
        assert!(idle.is_alive(), "a group idle for an instant is left alone");
        idle.backdate_idle(Duration::from_secs(2));
        assert!(hold_for_handshake(&manager, gid(3), each, fresh).is_ok(), "the idle group made room");
        assert!(!idle.is_alive());
        assert!(g.is_alive(), "another host's group was not ended for it");
    }
}
