//! The RDMA side of the link-group manager: which verbs link groups exist, to whom, and the
//! handshake steps that create, reuse and connect them.
//!
//! A group is named by the server's random 64-bit id, which only its two ends have seen: a
//! client proposes it (with its QP number and GID, which must match the group's and the
//! client's TCP address) to reuse the group; a client reuses only the group it has with that
//! server address, and only when the Accept names it exactly. A new group
//! costs a QP, a CQ and a completion channel; later connections cost an RMB slot (registered on
//! first use) and one CLC round trip.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{Settings, MIN_RMB_SIZE};
use crate::link::verbs::device::{find_port, find_port_cached, find_port_off_runtime, gid_of, Port, Remote};
use crate::link::verbs::{chunk_pair_bytes, LinkRole, PeerRmb, Rmbs, VerbsLink, REG_CHUNK_BYTES};
use crate::link::{Link, LinkError};
use crate::proto::clc::{DeclineReason, Proposal, RdmaLinkInfo, RdmaOffer};
use crate::proto::cursor::RingSize;
use crate::smc::conn::{PendingConn, SmcConn};
use crate::smc::group::{GroupTimes, LinkGroup, Role, TxRmbs};
use crate::smc::manager::Manager;

mod hosts;
use hosts::{
    give_group_token, group_token_or_decline, hold_for_handshake, host_of, make_host_room, take_group_token, Bucket,
    HandshakeHold, HostLink,
};

type PeerKey = ([u8; 16], u32);

#[derive(Clone)]
struct Entry {
    group: Arc<LinkGroup>,
    link: Arc<VerbsLink>,
    /// The peer's (GID, QPN).
    peer: PeerKey,
    /// The server's id of the group (ours on a server, the server's on a client): random, and
    /// seen only by the two ends, so it names the group in a proposal where (GID, QPN), which
    /// anyone can learn, does not.
    server_id: u64,
}

#[derive(Default)]
struct State {
    /// Server groups by their id, once confirmed.
    server: HashMap<u64, Entry>,
    /// Client groups per server address, oldest first. A proposal names the newest usable
    /// one; an Accept may name any of them (the server answers a proposal made while another
    /// connection was making a newer group), and only that group is reused.
    by_server: HashMap<SocketAddr, Vec<Entry>>,
    /// Per server address, held by the client handshake making the first group with it (see
    /// [`first_contact`]); inside, whether the last holder ended without making one.
    first_contact: HashMap<SocketAddr, Arc<tokio::sync::Mutex<bool>>>,
    /// Every server group alive, confirmed or not, by its id. Counted against
    /// [`max_groups_per_peer`] and [`max_server_groups`].
    server_groups: HashMap<u64, ServerGroup>,
    /// Per client host ([`host_of`]), the bytes of receive rings and send buffers that server
    /// handshakes hold between their Accept and the client's Confirm, and all hosts' together
    /// ([`hold_for_handshake`]).
    held: HashMap<[u8; 16], u64>,
    held_total: u64,
    /// New server groups, per client host and all together, as buckets of tokens
    /// ([`take_group_token`]).
    new_groups: HashMap<[u8; 16], Bucket>,
    new_groups_all: Option<Bucket>,
}

/// A server group the registry counts: the client host it was made for ([`host_of`]), the
/// group and its link once made, and whether the rate token it took is still to come back
/// ([`settle_group_tokens`]).
struct ServerGroup {
    host: [u8; 16],
    group: std::sync::Weak<LinkGroup>,
    /// The link's tally ([`crate::link::verbs::LinkTally`]), not the link: the registry must
    /// never hold a link's last reference.
    link: Option<Arc<dyn HostLink>>,
    owes_token: bool,
}

/// What a link group's first connection registers (pins): the first chunk of each of its two
/// pools ([`REG_CHUNK_BYTES`], 2 MiB each). The link charges registered chunks to the RMB
/// budget; this measure also bounds how many groups a server holds, each with a queue pair,
/// completion queue and protection domain that the budget does not count.
const GROUP_PINNED_BYTES: u64 = 2 * REG_CHUNK_BYTES as u64;

/// Link groups a server holds at once, from all clients, confirmed or not: as many as half the
/// context's RMB budget ([`set_rmb_memory_cap`](crate::config::set_rmb_memory_cap), 1 GiB by
/// default) would hold at [`GROUP_PINNED_BYTES`] each (128 by default), and at least 4. Without
/// a bound, a client proposing no group, connection after connection, made the server pin
/// 4 MiB and a queue pair per connection; half, because each group's first chunks are charged
/// to that budget, which the context's shared-memory connections and its own clients use too,
/// and remote hosts that never confirm their groups must not take all of it.
fn max_server_groups(manager: &Manager) -> usize {
    usize::try_from(manager.budget().cap() / (2 * GROUP_PINNED_BYTES)).unwrap_or(usize::MAX).max(4)
}

/// Link groups a server holds for one client host ([`host_of`]: an IPv4 address, an IPv6 /64,
/// every link-local address together),
/// and a client for one server address:
/// a quarter of [`max_server_groups`] (32 by default). A client of ours proposes the group it
/// has (one holds 1024 connections by default) and makes another for another ring size, when
/// one is full, or from another process; the groups of processes that were killed stay until
/// their connections' abort goes unanswered (30 s). The soft-RoCE test bed, whose processes
/// all run on one host, needs more than 16.
fn max_groups_per_peer(manager: &Manager) -> usize {
    (max_server_groups(manager) / 4).max(2)
}

/// Counts a new server group `id` for the client host `host` ([`host_of`]) in
/// ([`max_groups_per_peer`], [`max_server_groups`]), ending an idle group to make room where
/// needed: at a bound, a group of that host (or, at the overall bound, of anyone) that has had
/// no connection for a second ([`LinkGroup::end_if_idle`]), one its idle timeout would end
/// later. RDMA handshakes do not pin the group they name, so a client whose Proposal named the
/// group ended meanwhile gets a new one, and one whose Accept named it stays TCP (before any
/// byte moved). When every group is busy, the Proposal is declined (the connection stays TCP),
/// and so it is, as congested, when the host, or all hosts, made too many new groups lately
/// ([`take_group_token`]; looked at first, so that such a Proposal ends no idle group). Call
/// [`State::made_server_group`] once the group exists.
fn admit_server_group(
    manager: &Manager,
    id: u64,
    host: [u8; 16],
    now: std::time::Instant,
) -> Result<(), DeclineReason> {
    let (per_peer, most) = (max_groups_per_peer(manager), max_server_groups(manager));
    group_token_or_decline(&mut manager.rdma.lock(), host, now)?;
    let mut token = Ok(());
    make_room(manager, |s| {
        let of_peer = s.server_groups.values().filter(|g| g.host == host).count();
        if of_peer < per_peer && s.server_groups.len() < most {
            token = take_group_token(s, host, now);
            if token.is_ok() {
                let group = std::sync::Weak::new();
                s.server_groups.insert(id, ServerGroup { host, group, link: None, owes_token: false });
            }
            return None;
        }
        // The peer's own groups when it is at its bound, anyone's otherwise.
        let full = of_peer >= per_peer;
        Some(s.server_groups.values().filter(|g| !full || g.host == host).filter_map(|g| g.group.upgrade()).collect())
    })?;
    token
}

/// Room for a new group ([`crate::smc::manager::make_room`]): `full`, under the registry's
/// lock, takes the room where there is some (`None`), or names the groups one of which must end
/// to make it (admissions run at once when setup jobs run on one thread, or on the blocking
/// pool when that thread could not start).
fn make_room(
    manager: &Manager,
    mut full: impl FnMut(&mut State) -> Option<Vec<Arc<LinkGroup>>>,
) -> Result<(), DeclineReason> {
    crate::smc::manager::make_room(|| full(&mut manager.rdma.lock()).map_or(Ok(()), Err))
}

impl State {
    /// The group admitted as `id` exists now, with its link: it can be ended to make room when
    /// idle, its registered chunks count for its host ([`hold_for_handshake`]), and the token
    /// it took comes back once the link shows the client's queue pair
    /// ([`settle_group_tokens`]).
    fn made_server_group(&mut self, group: &Arc<LinkGroup>, link: Arc<dyn HostLink>) {
        let Some(e) = self.server_groups.get_mut(&group.id) else { return };
        e.group = Arc::downgrade(group);
        e.link = Some(link);
        e.owes_token = true;
    }

    /// A new group `id` was made and then not used (the handshake failed on our side before
    /// its Accept): its rate token comes back now.
    fn refund_group_token(&mut self, id: u64, now: std::time::Instant) {
        let Some(e) = self.server_groups.get_mut(&id) else { return };
        let host = e.host;
        if std::mem::take(&mut e.owes_token) {
            give_group_token(self, host, now);
        }
    }
}

/// Makes sure a client may make another group with `server`: the same bound as a server's per
/// client ([`max_groups_per_peer`]), so that an Accept naming a new group, connection after
/// connection, does not make us pin a group's memory for each. At the bound an idle group with
/// that server is ended to make room (one the server ended already, say, that we would
/// otherwise keep until its idle timeout).
fn client_group_room(manager: &Manager, server: SocketAddr) -> Result<(), DeclineReason> {
    let per_peer = max_groups_per_peer(manager);
    make_room(manager, |s| match s.by_server.get(&server) {
        Some(v) if v.len() >= per_peer => Some(v.iter().map(|e| e.group.clone()).collect()),
        _ => None,
    })
}

/// Room in the RMB budget for `bytes` more pinned memory, ending an idle RDMA group of the
/// context to make it where there is none ([`make_room`]): a group's registered chunks stay
/// charged while it lives, idle or not, and a burst's groups would otherwise hold the budget
/// until their idle timeout while new connections stay TCP. Runs on the setup thread, where an
/// ended group's chunks are given back at once.
fn pinned_room(manager: &Manager, bytes: u64) -> Result<(), DeclineReason> {
    make_room(manager, |s| {
        if manager.budget().room_for(bytes) {
            return None;
        }
        let groups = s.server_groups.values().filter_map(|g| g.group.upgrade());
        Some(groups.chain(s.by_server.values().flatten().map(|e| e.group.clone())).collect())
    })
}

/// A context's RDMA link groups (held by its [`Manager`]).
#[derive(Default)]
pub(crate) struct Registry {
    state: Mutex<State>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets a dead group.
    pub(crate) fn forget(&self, group: &LinkGroup) {
        let mut s = self.lock();
        let same = |e: &Entry| std::ptr::eq(Arc::as_ptr(&e.group), group);
        s.server.retain(|_, e| !same(e));
        if group.role == Role::Server {
            if let Some(g) = s.server_groups.remove(&group.id) {
                // A group whose link answered and that ended before the next look at the rate
                // gives its token back here.
                if g.owes_token && g.link.as_ref().is_some_and(|l| l.peer_answered()) {
                    give_group_token(&mut s, g.host, std::time::Instant::now());
                }
            }
        }
        s.by_server.retain(|_, v| {
            v.retain(|e| !same(e));
            !v.is_empty()
        });
    }
}

/// Loads the verbs library and opens the devices off the runtime, once (when RDMA is on),
/// waiting for that until `deadline` at most ([`until`]).
pub(crate) async fn warm_up(cfg: &Settings, deadline: tokio::time::Instant) {
    if cfg.rdma.enabled && !crate::link::verbs::device::devices_opened() {
        until(deadline, crate::link::verbs::device::init_devices()).await;
    }
}

/// Waits for `look`, a look-up on the setup thread, until `deadline` at most. The thread does
/// one step at a time for the whole process, and other handshakes' setups may be queued on
/// it: past the deadline the caller goes on without the answer (its connection without
/// RDMA), and the look-up goes on in a task of its own, for the connections after it.
async fn until(deadline: tokio::time::Instant, look: impl std::future::Future<Output = ()> + Send + 'static) {
    let look = tokio::spawn(look);
    if tokio::time::timeout_at(deadline, look).await.is_err() {
        tracing::debug!("rdma look-up still queued: going on without it");
    }
}

/// The end of a wait for a handshake's RDMA setup, `cfg`'s handshake bound from now.
pub(crate) fn setup_deadline(cfg: &Settings) -> tokio::time::Instant {
    tokio::time::Instant::now() + cfg.handshake_timeout
}

/// Whether an RDMA port may serve `local` here, without waiting: `false` only once the lookup
/// (devices opened, GID tables read, off the runtime) said no. Until it has answered, the
/// answer is `true` and the lookup is started, so that a listener peeks at the first
/// connections to an address instead of serving them as plain TCP while the lookup runs; its
/// handshake waits for the lookup ([`warm_port`]) before it chooses.
pub(crate) fn may_serve(local: IpAddr, cfg: &Settings) -> bool {
    if !cfg.rdma.enabled {
        return false;
    }
    match find_port_cached(local, &cfg.rdma) {
        Some(r) => r.is_ok(),
        None => {
            // One look-up task per address at a time, however many connections come first.
            crate::link::verbs::device::look_up_in_background(local, &cfg.rdma);
            true
        }
    }
}

/// Looks up the port for `local` off the runtime, so that later lookups (in the proposal, in
/// the handshake) answer from the cache; waits for it until `deadline` at most ([`until`]).
pub(crate) async fn warm_port(local: IpAddr, cfg: &Settings, deadline: tokio::time::Instant) {
    if cfg.rdma.enabled && find_port_cached(local, &cfg.rdma).is_none() {
        let rdma = cfg.rdma.clone();
        until(deadline, async move {
            let _ = find_port_off_runtime(local, &rdma).await;
        })
        .await;
    }
}

/// Runs a step of link setup on the RDMA setup thread
/// ([`on_setup_thread`](crate::link::verbs::device::on_setup_thread)): creating protection
/// domains, completion queues and queue pairs, moving a QP through its states and registering
/// memory are system calls into the RDMA driver (memory registration pins pages), which must
/// not stall a runtime worker. The step may spawn tasks (it runs with the runtime entered).
/// Its turn is waited for until `deadline`, after which it never runs and the handshake is
/// declined as congested; once begun, it is waited for to its end
/// ([`on_setup_thread_by`](crate::link::verbs::device::on_setup_thread_by)).
async fn off_runtime<T: Send + 'static>(
    deadline: tokio::time::Instant,
    f: impl FnOnce() -> Result<T, DeclineReason> + Send + 'static,
) -> Result<T, DeclineReason> {
    use crate::link::verbs::device::Setup;
    match crate::link::verbs::device::on_setup_thread_by(deadline, f).await {
        Setup::Done(r) => r,
        Setup::Late => {
            tracing::debug!("rdma setup did not get its turn within the handshake bound");
            Err(DeclineReason::HandshakeCongested)
        }
        Setup::Lost => {
            tracing::warn!("rdma link setup job was lost");
            Err(DeclineReason::Internal)
        }
    }
}

fn port_for(manager: &Manager, local: IpAddr, cfg: &Settings) -> Result<Port, DeclineReason> {
    find_port(local, &cfg.rdma).map_err(|u| {
        manager.counters.rdma_unavailable(u.index());
        tracing::debug!(reason = u.as_str(), %local, "no rdma for this connection");
        DeclineReason::NoCommonTransport
    })
}

fn usable(e: &Entry, rx_size: u32, tx_size: u32) -> bool {
    e.group.is_established() && e.link.rx_rmb_size() == rx_size && e.link.tx_size() == tx_size
}

fn new_link(
    manager: &Manager,
    port: Port,
    role: LinkRole,
    cfg: &Settings,
    rx: u32,
    tx: u32,
) -> Result<Arc<VerbsLink>, DeclineReason> {
    let rmbs = Rmbs { count: cfg.shm.rmbs_per_group, rx_size: rx, tx_size: tx, budget: manager.budget().clone() };
    VerbsLink::new(port, role, rmbs, cfg.shm.busy_poll, cfg.rdma.link_test).map(Arc::new).map_err(|e| {
        tracing::debug!(error = %e, "cannot create an rdma link");
        match e {
            LinkError::Io(std::io::ErrorKind::OutOfMemory, _) => DeclineReason::OutOfMemory,
            _ => DeclineReason::Internal,
        }
    })
}

/// Registers the connection's RMB; gives its slot back when that fails. A budget with no room
/// for the chunks is given room by ending an idle group, if there is one ([`pinned_room`]).
fn open_rmb(manager: &Manager, link: &VerbsLink, conn: &Arc<SmcConn>) -> Result<(u64, u32), DeclineReason> {
    let registered = link.register_rmb(conn.our_token()).or_else(|e| match e {
        LinkError::Io(std::io::ErrorKind::OutOfMemory, _) if pinned_room(manager, link.chunk_pair_bytes()).is_ok() => {
            link.register_rmb(conn.our_token())
        }
        e => Err(e),
    });
    registered.map_err(|e| {
        tracing::debug!(error = %e, "cannot register an rmb");
        conn.group().unregister(conn.our_token());
        DeclineReason::OutOfMemory
    })
}

// ----- client --------------------------------------------------------------------------------

/// The client's RDMA offer to `server` from local address `local`, for a receive ring of
/// `rx_size` bytes: the port's GID and MTU, and the QP of the group it already has there. Only
/// from the port cache ([`warm_port`] first): no offer when the address was never looked up.
pub(crate) fn client_offer(
    manager: &Manager,
    server: SocketAddr,
    local: IpAddr,
    rx_size: u32,
    cfg: &Settings,
) -> Option<RdmaOffer> {
    // (Switched off counts as a known answer: `port_for` records why there is no offer.)
    let _known = find_port_cached(local, &cfg.rdma)?;
    let port = port_for(manager, local, cfg).ok()?;
    let s = manager.rdma.lock();
    let existing = s.by_server.get(&server).and_then(|v| {
        v.iter().rev().find(|e| {
            // A link the server has not confirmed may be one it does not know yet.
            e.group.is_established()
                && e.link.is_up()
                && e.link.port().gid == port.gid
                && e.link.rx_rmb_size() == rx_size
        })
    });
    Some(RdmaOffer {
        gid: port.gid,
        port: port.port,
        mtu: port.mtu,
        qpn: existing.map_or(0, |e| e.link.qpn()),
        link_group: existing.map_or(0, |e| e.server_id),
    })
}

/// Held by a client's handshake with a server it has no established group with, so that
/// connections opened together share one group instead of making one each: the others wait
/// for it (as Linux's SMC-R serializes a client's first contacts), then propose its group.
/// Waiting is bounded by three handshake timeouts (the holder's own bound), after which a
/// connection goes on alone. When the holder ends without a group (the server declined, chose
/// shared memory, or did not answer), the waiting ones go on together, as if there had been
/// no wait: a group that is not made is not waited for one handshake at a time.
pub(crate) struct FirstContact {
    guard: Option<tokio::sync::OwnedMutexGuard<bool>>,
    manager: Arc<Manager>,
    server: SocketAddr,
}

impl Drop for FirstContact {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else { return };
        let mut s = self.manager.rdma.lock();
        *guard = !has_group(&s, self.server);
        release(&mut s, self.server, guard);
    }
}

impl FirstContact {
    /// Ends the first contact once the group it made (if any) has its link confirmed by the
    /// server, waiting at most `timeout`: until then, the server may not know the group yet,
    /// and a connection that proposed it would make another.
    pub(crate) async fn settle(self, timeout: Duration) {
        let link = {
            let s = self.manager.rdma.lock();
            s.by_server.get(&self.server).and_then(|v| v.last()).filter(|e| e.group.is_alive()).map(|e| e.link.clone())
        };
        if let Some(link) = link {
            if tokio::time::timeout(timeout, link.wait_up()).await.is_err() {
                tracing::debug!(server = %self.server, "the new link group's link was not confirmed in time");
            }
            // Its group may have failed meanwhile and let go of it: this may be the link's last
            // reference, whose queue pair and memory go on the setup thread, as a group's do.
            crate::link::verbs::device::drop_on_setup_thread(Box::new(link));
        }
    }
}

/// Lets go of a first contact's lock; the last one to hold it removes it from the map.
fn release(s: &mut State, server: SocketAddr, guard: tokio::sync::OwnedMutexGuard<bool>) {
    // Only the map's copy and this guard's are left: nobody waits, the entry can go.
    if Arc::strong_count(tokio::sync::OwnedMutexGuard::mutex(&guard)) == 2 {
        s.first_contact.remove(&server);
    }
    drop(guard);
}

/// Waits, when this client has devices but no established group with `server`, until no
/// other handshake of ours is making the first one (see [`FirstContact`]). `None`: nothing to
/// wait for.
pub(crate) async fn first_contact(manager: &Arc<Manager>, server: SocketAddr, cfg: &Settings) -> Option<FirstContact> {
    if !cfg.rdma.enabled || !crate::link::verbs::device::have_devices() {
        return None;
    }
    let lock = {
        let mut s = manager.rdma.lock();
        if has_group(&s, server) {
            return None;
        }
        s.first_contact.entry(server).or_default().clone()
    };
    // The holder's handshake ends within its steps' bounds: the waits for the Accept and the
    // Commit and our setup between them, each at most the handshake timeout.
    let guard = match tokio::time::timeout(cfg.handshake_timeout.saturating_mul(3), lock.lock_owned()).await {
        // The one waited for made no group: neither does waiting for the next one.
        Ok(g) if *g => {
            release(&mut manager.rdma.lock(), server, g);
            return None;
        }
        Ok(g) => Some(g),
        Err(_) => {
            tracing::debug!(%server, "another handshake still makes the first link group with this server");
            None
        }
    };
    let first = FirstContact { guard, manager: manager.clone(), server };
    // The handshake waited for may have made the group: then this one just proposes it.
    let made = has_group(&manager.rdma.lock(), server);
    (!made).then_some(first)
}

/// Whether this client has a group with `server` whose link the server confirmed (one it
/// certainly knows, so that proposing it reuses it).
fn has_group(s: &State, server: SocketAddr) -> bool {
    s.by_server.get(&server).is_some_and(|v| v.iter().any(|e| e.group.is_established() && e.link.is_up()))
}

/// The client's side of an RDMA Accept (see [`client_conn_create_blocking`]), off the runtime. The
/// connection comes registered in a [`PendingConn`], so that a handshake abandoned meanwhile
/// gives its slot back.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn client_conn_create(
    manager: &Arc<Manager>,
    server: SocketAddr,
    local: IpAddr,
    a: &RdmaLinkInfo,
    rx_size: u32,
    cfg: &Settings,
    (timeout, deadline): (Duration, tokio::time::Instant),
) -> Result<(PendingConn, RdmaLinkInfo), DeclineReason> {
    let (a, cfg, manager) = (*a, cfg.clone(), manager.clone());
    off_runtime(deadline, move || {
        let (conn, confirm) = client_conn_create_blocking(&manager, server, local, &a, rx_size, &cfg, timeout)?;
        Ok((PendingConn::holding(conn), confirm))
    })
    .await
}

/// Whether the peer's receive ring (`peer_rmb`, from its Proposal or Accept) is one we take:
/// our send buffer for the connection is as large, registered (pinned) and charged to the
/// context's RMB budget, so a peer that names 1 GiB would take the whole default budget with
/// one connection (every other SMC connection of the process then falling back to TCP) and pin
/// it. Never more than our own largest ring (`ShmConfig::rmb_max`), and never less than our
/// smallest ([`MIN_RMB_SIZE`]): a ring of a few bytes would make us send a CDC message, and
/// take a completion, for every few bytes we write. Others are declined (the connection stays
/// TCP).
fn peer_ring_fits(peer_rmb: u32, cfg: &Settings) -> Result<(), DeclineReason> {
    let max = cfg.shm.get_rmb_max();
    if peer_rmb > max {
        tracing::debug!(peer_rmb, max, "the peer's rdma receive ring is larger than ours may be: declining");
        return Err(DeclineReason::OutOfMemory);
    }
    if peer_rmb < MIN_RMB_SIZE {
        tracing::debug!(peer_rmb, min = MIN_RMB_SIZE, "the peer's rdma receive ring is too small: declining");
        return Err(DeclineReason::SyncError);
    }
    Ok(())
}

/// The server's GID in its Accept must be its TCP address's, as a client's in its Proposal
/// must be its own (`server_conn_create_blocking`): our QP never connects to a third host a
/// server names.
fn accepted_gid_is_the_servers(a: &RdmaLinkInfo, server: SocketAddr) -> Result<(), DeclineReason> {
    if a.gid == gid_of(crate::sys::unmap(server).ip()) {
        return Ok(());
    }
    tracing::debug!(%server, "rdma accept's gid is not the server's address");
    Err(DeclineReason::SyncError)
}

/// The client's side of an RDMA Accept: reuses the group to that server QP or builds one (QP to
/// RTS), registers our RMB and the connection. Returns what goes into the Confirm. Blocks.
fn client_conn_create_blocking(
    manager: &Arc<Manager>,
    server: SocketAddr,
    local: IpAddr,
    a: &RdmaLinkInfo,
    rx_size: u32,
    cfg: &Settings,
    timeout: Duration,
) -> Result<(Arc<SmcConn>, RdmaLinkInfo), DeclineReason> {
    accepted_gid_is_the_servers(a, server)?;
    let rx_ring = RingSize::new(rx_size).ok_or(DeclineReason::Internal)?;
    RingSize::new(a.rmb_size).ok_or(DeclineReason::SyncError)?;
    peer_ring_fits(a.rmb_size, cfg)?;
    let port = port_for(manager, local, cfg)?;
    let mtu = a.mtu.min(port.mtu);
    // Reuse only the group this client has with this very server (its address), and only when
    // the Accept names it exactly: a server cannot steer us onto a group with another one.
    let existing = manager
        .rdma
        .lock()
        .by_server
        .get(&server)
        .and_then(|v| v.iter().find(|e| e.server_id == a.link_group))
        .filter(|e| e.peer == (a.gid, a.qpn) && usable(e, rx_size, a.rmb_size))
        .cloned();
    let entry = match existing {
        Some(e) => e,
        None => {
            client_group_room(manager, server)?;
            pinned_room(manager, chunk_pair_bytes(cfg.shm.rmbs_per_group, rx_size, a.rmb_size))?;
            let link = new_link(manager, port.clone(), LinkRole::Client, cfg, rx_size, a.rmb_size)?;
            link.connect(&Remote { gid: a.gid, qpn: a.qpn, psn: a.psn, mtu }).map_err(|e| {
                tracing::debug!(error = %e, "cannot connect the rdma qp");
                DeclineReason::Internal
            })?;
            let group = LinkGroup::new(
                crate::sys::random_u64(),
                Role::Client,
                TxRmbs::verbs(cfg.shm.rmbs_per_group, a.rmb_size),
                GroupTimes { idle_timeout: cfg.shm.idle_timeout, poll_window: cfg.shm.adaptive_poll },
                manager.clone(),
            );
            group.establish(link.clone()).map_err(|_| DeclineReason::Internal)?;
            // The server confirms the link with its first message; a link that never comes up
            // fails its connections instead of leaving them waiting.
            let (g, l) = (group.clone(), link.clone());
            tokio::spawn(async move {
                tokio::time::sleep(timeout.max(Duration::from_secs(1)).saturating_mul(2)).await;
                if !l.is_up() {
                    g.fail(LinkError::Protocol("rdma link was never confirmed by the server"));
                }
            });
            let e = Entry { group, link, peer: (a.gid, a.qpn), server_id: a.link_group };
            {
                // Filed only while the group lives, as the server files its own: an entry filed
                // after the group ended (and was forgotten) would count against the bound for
                // good.
                let mut s = manager.rdma.lock();
                if !e.group.is_alive() {
                    return Err(DeclineReason::Internal);
                }
                s.by_server.entry(server).or_default().push(e.clone());
            }
            e
        }
    };
    let conn = entry.group.open_conn(Some(a.rmb_token), rx_ring, &cfg.shm)?;
    let (rmb_addr, rkey) = open_rmb(manager, &entry.link, &conn)?;
    let peer = PeerRmb { token: a.rmb_token, addr: a.rmb_addr, rkey: a.rkey, size: a.rmb_size };
    if let Err(e) = entry.link.bind(conn.our_token(), &peer) {
        tracing::debug!(error = %e, "cannot bind the connection to the server's rmb");
        conn.group().unregister(conn.our_token());
        return Err(DeclineReason::SyncError);
    }
    let confirm = RdmaLinkInfo {
        gid: entry.link.port().gid,
        qpn: entry.link.qpn(),
        psn: entry.link.psn(),
        mtu,
        rkey,
        rmb_addr,
        rmb_size: rx_size,
        rmb_token: conn.our_token(),
        link_group: a.link_group,
    };
    Ok((conn, confirm))
}

// ----- server --------------------------------------------------------------------------------

/// What a server keeps between its Accept and the client's Confirm.
#[derive(Debug, Clone)]
pub(crate) struct ServerPending {
    /// Dropped on the setup thread (see `Drop`).
    link: std::mem::ManuallyDrop<Arc<VerbsLink>>,
    accepted: RdmaLinkInfo,
    /// The GID the client proposed from (its TCP address's).
    client_gid: [u8; 16],
    /// A group made for this Proposal: failed when the last copy goes while it is still not
    /// established.
    _unconfirmed: Option<Arc<Unconfirmed>>,
    /// The handshake's share of the RMB budget for its client's host ([`hold_for_handshake`]).
    _hold: Arc<HandshakeHold>,
}

/// A server group awaiting its first Confirm, failed when dropped unless established by then.
#[derive(Debug)]
struct Unconfirmed(Arc<LinkGroup>);

impl Drop for Unconfirmed {
    fn drop(&mut self) {
        if !self.0.is_established() {
            self.0.fail(LinkError::Closed);
        }
    }
}

/// The server's side of a Proposal with an RDMA offer (see [`server_conn_create_blocking`]), off the
/// runtime; the connection comes registered in a [`PendingConn`].
pub(crate) async fn server_conn_create(
    manager: &Arc<Manager>,
    p: &Proposal,
    local: IpAddr,
    peer: IpAddr,
    cfg: &Settings,
    (timeout, deadline): (Duration, tokio::time::Instant),
) -> Result<(PendingConn, RdmaLinkInfo, ServerPending), DeclineReason> {
    let (p, cfg, manager) = (p.clone(), cfg.clone(), manager.clone());
    off_runtime(deadline, move || {
        let (conn, info, pending) = server_conn_create_blocking(&manager, &p, local, peer, &cfg, timeout)?;
        Ok((PendingConn::holding(conn), info, pending))
    })
    .await
}

/// The server's side of a Proposal with an RDMA offer: reuses the group of the client QP it
/// names or creates one (QP in INIT), registers our RMB and the connection. Returns what goes
/// into the Accept. Blocks.
fn server_conn_create_blocking(
    manager: &Arc<Manager>,
    p: &Proposal,
    local: IpAddr,
    peer: IpAddr,
    cfg: &Settings,
    timeout: Duration,
) -> Result<(Arc<SmcConn>, RdmaLinkInfo, ServerPending), DeclineReason> {
    let offer = p.rdma.as_ref().ok_or(DeclineReason::NoCommonTransport)?;
    // The client's GID must be its TCP address's: our QP never connects to a third host a
    // client names.
    if offer.gid != gid_of(peer) {
        tracing::debug!(%peer, "rdma offer's gid is not the client's address");
        return Err(DeclineReason::NoCommonTransport);
    }
    let port = port_for(manager, local, cfg)?;
    let rx_size = cfg.shm.rmb_size;
    let rx_ring = RingSize::new(rx_size).ok_or(DeclineReason::Internal)?;
    RingSize::new(p.rmb_size).ok_or(DeclineReason::SyncError)?;
    peer_ring_fits(p.rmb_size, cfg)?;
    let mtu = offer.mtu.min(port.mtu);
    let host = host_of(offer.gid);
    let ring_bytes = u64::from(rx_size) + u64::from(p.rmb_size);
    let existing = (offer.link_group != 0)
        .then(|| {
            manager
                .rdma
                .lock()
                .server
                .get(&offer.link_group)
                .filter(|e| e.peer == (offer.gid, offer.qpn) && usable(e, rx_size, p.rmb_size))
                .cloned()
        })
        .flatten();
    let made = existing.is_none();
    let (group, link) = match existing {
        Some(e) => (e.group, e.link),
        None => {
            let (id, now) = (crate::sys::random_u64(), std::time::Instant::now());
            let fresh_chunks = chunk_pair_bytes(cfg.shm.rmbs_per_group, rx_size, p.rmb_size);
            // Before any setup, and before any idle group is ended for room, the host's rate of
            // new groups; then its share of the budget, and its count of groups.
            group_token_or_decline(&mut manager.rdma.lock(), host, now)?;
            make_host_room(manager, host, ring_bytes, fresh_chunks)?;
            admit_server_group(manager, id, host, now)?;
            // From here the group is counted until the manager forgets it (when it fails, which
            // `Unconfirmed` below makes sure of), or until this fails first.
            let undo = || {
                let mut s = manager.rdma.lock();
                s.server_groups.remove(&id);
                give_group_token(&mut s, host, std::time::Instant::now());
            };
            pinned_room(manager, fresh_chunks).inspect_err(|_| undo())?;
            let link =
                new_link(manager, port.clone(), LinkRole::Server, cfg, rx_size, p.rmb_size).inspect_err(|_| undo())?;
            let group = LinkGroup::new(
                id,
                Role::Server,
                TxRmbs::verbs(cfg.shm.rmbs_per_group, p.rmb_size),
                GroupTimes { idle_timeout: cfg.shm.idle_timeout.max(timeout), poll_window: cfg.shm.adaptive_poll },
                manager.clone(),
            );
            manager.rdma.lock().made_server_group(&group, link.tally());
            (group, link)
        }
    };
    // A new group lives as long as the handshake that made it, unless that confirms it: a
    // client that never confirms leaves nothing behind, however slowly the host runs.
    let unconfirmed = (!group.is_established()).then(|| Arc::new(Unconfirmed(group.clone())));
    let opened = (|| {
        let conn = group.open_conn(None, rx_ring, &cfg.shm)?;
        // What this connection would register: nothing where its chunks are registered already.
        let hold = hold_for_handshake(manager, host, ring_bytes, link.unregistered_for(conn.our_token()))
            .inspect_err(|_| group.unregister(conn.our_token()))?;
        let (rmb_addr, rkey) = open_rmb(manager, &link, &conn)?;
        Ok((conn, hold, rmb_addr, rkey))
    })();
    let (conn, hold, rmb_addr, rkey) = opened.inspect_err(|_| {
        if made {
            // Our side failed, not the client's queue pair: its rate token comes back.
            manager.rdma.lock().refund_group_token(group.id, std::time::Instant::now());
        }
    })?;
    let accepted = RdmaLinkInfo {
        gid: port.gid,
        qpn: link.qpn(),
        psn: link.psn(),
        mtu,
        rkey,
        rmb_addr,
        rmb_size: rx_size,
        rmb_token: conn.our_token(),
        link_group: group.id,
    };
    Ok((
        conn,
        accepted,
        ServerPending {
            link: std::mem::ManuallyDrop::new(link),
            accepted,
            client_gid: offer.gid,
            _unconfirmed: unconfirmed,
            _hold: Arc::new(hold),
        },
    ))
}

impl Drop for ServerPending {
    /// A new group's link is held only here until the client confirms: when a handshake ends
    /// without that (a client that proposes and closes, again and again), this is its last
    /// reference, and destroying its queue pair and completion queue and deregistering its
    /// memory takes the process's memory-map lock, which a runtime thread must not wait for.
    /// So the reference goes to the setup thread, as a link group's does.
    fn drop(&mut self) {
        // SAFETY: `link` is taken out exactly once, here, and not used after.
        let link = unsafe { std::mem::ManuallyDrop::take(&mut self.link) };
        crate::link::verbs::device::drop_on_setup_thread(Box::new(link));
    }
}

/// The server's side of the client's Confirm (see [`server_confirm_blocking`]), off the
/// runtime, its turn waited for until `deadline` ([`off_runtime`]): an error is the reason to
/// decline with, and why.
pub(crate) async fn server_confirm(
    conn: &Arc<SmcConn>,
    pending: &ServerPending,
    c: &RdmaLinkInfo,
    deadline: tokio::time::Instant,
) -> Result<(), (DeclineReason, String)> {
    let (conn, pending, c) = (conn.clone(), pending.clone(), *c);
    let checked = off_runtime(deadline, move || Ok(server_confirm_blocking(&conn, &pending, &c))).await;
    match checked {
        Ok(r) => r.map_err(|why| (DeclineReason::SyncError, why)),
        Err(reason) => Err((reason, "the confirm's setup did not get its turn".into())),
    }
}

/// The server's side of the client's Confirm: connects a new group's QP (and confirms the link
/// to the client) or checks that the client's QP is the reused group's, then binds the
/// connection to the client's RMB. Blocks.
fn server_confirm_blocking(conn: &Arc<SmcConn>, pending: &ServerPending, c: &RdmaLinkInfo) -> Result<(), String> {
    let group = conn.group();
    let link: &Arc<VerbsLink> = &pending.link;
    if c.rmb_size != link.tx_size() || c.mtu != pending.accepted.mtu {
        return Err("confirm's rmb size or mtu differs from the accepted link".into());
    }
    if c.gid != pending.client_gid || c.link_group != group.id {
        return Err("confirm's gid or link group differs from the proposal and accept".into());
    }
    let key = (c.gid, c.qpn);
    if group.is_established() {
        let same = group
            .manager()
            .rdma
            .lock()
            .server
            .get(&group.id)
            .is_some_and(|e| Arc::ptr_eq(&e.group, group) && e.peer == key);
        if !same {
            return Err("confirm names another client qp than the reused group's".into());
        }
    } else {
        if !group.is_alive() {
            return Err("link group is gone".into());
        }
        link.connect(&Remote { gid: c.gid, qpn: c.qpn, psn: c.psn, mtu: c.mtu }).map_err(|e| e.to_string())?;
        group.establish(link.clone()).map_err(|e| e.to_string())?;
        let e = Entry { group: group.clone(), link: link.clone(), peer: key, server_id: group.id };
        {
            // Filed only while the group lives: one that ended meanwhile was forgotten already,
            // and an entry filed after that would keep its link for good.
            let mut s = group.manager().rdma.lock();
            if !group.is_alive() {
                return Err("link group is gone".into());
            }
            s.server.insert(group.id, e);
        }
        // Confirmed only now that a proposal naming the group finds it.
        link.confirm_up().map_err(|e| e.to_string())?;
    }
    let peer = PeerRmb { token: c.rmb_token, addr: c.rmb_addr, rkey: c.rkey, size: c.rmb_size };
    link.bind(conn.our_token(), &peer).map_err(|e| e.to_string())?;
    conn.confirm(c.rmb_token);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::hosts::FakeLink;
    use super::{
        accepted_gid_is_the_servers, admit_server_group, max_groups_per_peer, max_server_groups, peer_ring_fits,
    };
    use crate::config::{RmbBudget, Settings, ShmConfig};
    use crate::proto::clc::DeclineReason;
    use crate::proto::cursor::RingSize;
    use crate::smc::group::{GroupTimes, LinkGroup, Role, TxRmbs};
    use crate::smc::manager::Manager;

    fn gid(host: u8) -> [u8; 16] {
        let mut g = [0; 16];
        g[15] = host;
        g
    }

    /// An Accept that names a GID other than the server's address (a third host on the
    /// fabric) is declined before anything is set up; the server's own GID passes, written
    /// for an IPv4 server as the kernel writes it (IPv4-mapped), however its address is given.
    #[test]
    fn an_accept_naming_another_host_is_declined() {
        use crate::proto::clc::RdmaLinkInfo;
        let info = |gid| RdmaLinkInfo {
            gid,
            qpn: 7,
            psn: 1,
            mtu: 1024,
            rkey: 1,
            rmb_addr: 0x1000,
            rmb_size: 64 << 10,
            rmb_token: 1,
            link_group: 1,
        };
        let server: std::net::SocketAddr = "192.0.2.10:443".parse().unwrap();
        let mapped: std::net::SocketAddr = "[::ffff:192.0.2.10]:443".parse().unwrap();
        let own = std::net::Ipv4Addr::new(192, 0, 2, 10).to_ipv6_mapped().octets();
        let third = std::net::Ipv4Addr::new(192, 0, 2, 99).to_ipv6_mapped().octets();
        assert_eq!(accepted_gid_is_the_servers(&info(own), server), Ok(()));
        assert_eq!(accepted_gid_is_the_servers(&info(own), mapped), Ok(()));
        assert_eq!(accepted_gid_is_the_servers(&info(third), server), Err(DeclineReason::SyncError));
        assert_eq!(accepted_gid_is_the_servers(&info(gid(10)), server), Err(DeclineReason::SyncError));
    }

    /// One client host gets at most `max_groups_per_peer` server groups, all clients together
    /// `max_server_groups`, both from the RMB budget's cap. At a bound a group with no
    /// connection for a second and no handshake pinning it, of that client (or of anyone, at
    /// the overall bound), is ended to make room; when none is, the new one is declined. Only
    /// a server group counts.
    #[test]
    fn a_client_cannot_make_a_server_hold_groups_without_bound() {
        let default = Manager::new(Arc::default(), Arc::new(RmbBudget::new()));
        assert_eq!((max_server_groups(&default), max_groups_per_peer(&default)), (128, 32));
        // A smaller budget, fewer groups (and a shorter test).
        let budget = RmbBudget::new();
        budget.set_cap(128 << 20);
        let manager = Manager::new(Arc::default(), Arc::new(budget));
        let (most, per_peer) = (max_server_groups(&manager), max_groups_per_peer(&manager));
        assert_eq!((most, per_peer), (16, 4));
        let times = GroupTimes { idle_timeout: Duration::from_secs(60), poll_window: Duration::ZERO };
        let ring = RingSize::new(1 << 16).unwrap();
        let mut next_id = 1;
        // Admits and makes a group for `host`, idle for long enough to be ended.
        let mut make = |host: u8| -> Result<Arc<LinkGroup>, DeclineReason> {
            next_id += 1;
            admit_server_group(&manager, next_id, gid(host), std::time::Instant::now())?;
            let g = LinkGroup::new(next_id, Role::Server, TxRmbs::verbs(2, 1 << 16), times, manager.clone());
            manager.rdma.lock().made_server_group(&g, Arc::new(FakeLink::default()));
            g.backdate_idle(Duration::from_secs(2));
            Ok(g)
        };
        // The first host's groups each carry a connection.
        let mut first: Vec<_> = (0..per_peer)
            .map(|_| {
                let g = make(1).unwrap();
                let c = g.open_conn(None, ring, &ShmConfig::default()).unwrap();
                (g, c)
            })
            .collect();
        assert_eq!(make(1).err(), Some(DeclineReason::OutOfMemory), "a host with every group busy gets no more");
        let other = make(2).expect("another host is not held back by the first");

        // One of the first host's groups loses its connection: once it has been idle for a
        // while it makes room, and is ended for it.
        let (idle, conn) = first.pop().unwrap();
        idle.unregister(conn.our_token());
        assert_eq!(make(1).err(), Some(DeclineReason::OutOfMemory), "a group idle for an instant is left alone");
        idle.backdate_idle(Duration::from_secs(2));
        let again = make(1).expect("an idle group of the host makes room");
        let _again_pin = again.pin();
        assert!(!idle.is_alive(), "the idle group was ended");
        assert!(other.is_alive(), "another host's group was not");
        assert_eq!(manager.rdma.lock().server_groups.len(), per_peer + 1);

        // All hosts together: groups a handshake pins, up to the bound, then nothing more.
        let mut rest = Vec::new();
        let mut host = 3;
        while manager.rdma.lock().server_groups.len() < most {
            let g = make(host).unwrap();
            let pin = g.pin();
            rest.push((g, pin));
            host += 1;
        }
        let other_pin = other.pin();
        assert_eq!(make(250).err(), Some(DeclineReason::OutOfMemory), "all hosts together are bounded");
        // At the overall bound, any host's idle group makes room.
        let (idle, pin) = rest.pop().unwrap();
        drop(pin);
        idle.backdate_idle(Duration::from_secs(2));
        let _last = make(251).expect("an idle group of another host makes room");
        assert!(!idle.is_alive());
        drop(other_pin);

        // A client group of the same id as a server group is not counted, nor forgotten for it.
        let (busy, _) = &first[0];
        let client_group = LinkGroup::new(busy.id, Role::Client, TxRmbs::verbs(1, 1 << 16), times, manager.clone());
        manager.forget(&client_group);
        assert!(manager.rdma.lock().server_groups.contains_key(&busy.id));
    }

    /// A peer's ring is mirrored by a send buffer of ours, pinned and charged to the RMB
    /// budget: one larger than our own largest ring is declined, whatever the peer names.
    #[test]
    fn a_peer_ring_larger_than_ours_may_be_is_declined() {
        let mut cfg = Settings { shm: ShmConfig::default().rmb_size(64 << 10).rmb_max(1 << 20), ..Settings::default() };
        assert_eq!(peer_ring_fits(16 << 10, &cfg), Ok(()));
        assert_eq!(peer_ring_fits(1 << 20, &cfg), Ok(()));
        assert_eq!(peer_ring_fits((1 << 20) + 1, &cfg), Err(DeclineReason::OutOfMemory));
        assert_eq!(peer_ring_fits(1 << 30, &cfg), Err(DeclineReason::OutOfMemory));
        // Autotuning off (the largest ring is the first one): that size is the bound.
        cfg.shm = ShmConfig::default().rmb_size(2 << 20).rmb_max(0);
        assert_eq!(peer_ring_fits(2 << 20, &cfg), Ok(()));
        assert_eq!(peer_ring_fits(4 << 20, &cfg), Err(DeclineReason::OutOfMemory));
    }

    /// A ring of a few bytes would make every few bytes we write a CDC message: below our own
    /// smallest ring, a peer's is declined.
    #[test]
    fn a_peer_ring_smaller_than_ours_may_be_is_declined() {
        let cfg = Settings::default();
        for tiny in [1, 4095] {
            assert_eq!(peer_ring_fits(tiny, &cfg), Err(DeclineReason::SyncError), "{tiny} bytes");
        }
        assert_eq!(peer_ring_fits(crate::config::MIN_RMB_SIZE, &cfg), Ok(()));
    }
}
