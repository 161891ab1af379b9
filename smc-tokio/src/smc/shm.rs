//! The shared-memory side of the link-group manager (SMC-D setup, in one place): which groups
//! exist and to whom, the side channel a listener's groups are joined through, and the steps
//! that create, join and reuse them. The link itself (regions, doorbells, the JOIN exchange) is
//! [`link::shm`](crate::link::shm).
//!
//! A client's first connection to a server process creates a group: the server makes its
//! region and a pending group at the Accept, the client makes its own and joins through the
//! side channel the Accept named, and both sides have the link when the JOIN is answered. Later
//! connections between the two processes name the group in their Proposal and cost an RMB slot
//! each.

use crate::hash::Map as HashMap;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::Interest;

use crate::config::ShmConfig;
use crate::link::shm::region::Layout;
use crate::link::shm::{self, Admission, Join, JoinError, JoinRefused, ShmLocal};
use crate::link::Link;
use crate::proto::clc::{DeclineReason, Proposal, Secret, ShmLinkInfo, ShmOffer, SHM_SOCKET_NAME_MAX};
use crate::proto::cursor::RingSize;
use crate::smc::conn::SmcConn;
use crate::smc::group::{GroupPin, GroupTimes, LinkGroup, Role, TxRmbs};
use crate::smc::manager::Manager;
use crate::smc::manager::{uid_share, UidShare, OTHER_UID_SHARE};
use crate::smc::ClientIdentity;
use crate::sys;

/// How deep into a peer's ring our writes go before the ring starts over at its beginning,
/// whenever the peer has consumed everything (`ConnEngine::set_tx_restart`): request/response
/// connections then write the same page or two over and over instead of walking the whole
/// ring, which across many connections no cache holds. From `smcperf local --scenario rr --size
/// 1024 --conns 200 --runtime multi --transport smc`, interleaved invocations on the 2-vCPU
/// development VM: without restarts 1.00-1.07 M round trips/s, at 4 KiB 1.10-1.20 M (+10-12% in
/// each of four pairs; 1.07-1.14 M against 0.97-1.01 M in three more rounds); 1 KiB and 16 KiB
/// within the noise of 4 KiB, 64 KiB less. Streams did not move beyond the noise. One
/// connection's rr 1 KiB is not settled: 616-621 k round trips/s without, 622-670 k at 4 KiB,
/// 638-693 k at 16 KiB, run alone; but in three pairs of the README's matrix 581-592 k after
/// against 603-632 k before (docs/benchmarks.md).
const TX_RESTART_AT: u32 = 4096;

/// Server groups one client process (pid, uid) holds with one listener at once, confirmed or
/// pending, and all clients of all listeners together: the same bounds as a server's RDMA groups per client host and in all at
/// their default budget (`smc::rdma`), so that a client of a trusted uid cannot make us hold a
/// region, a doorbell and a driver per connection (a Proposal whose `instance` or ring size
/// differs each time gets a new group). A client of ours makes one group per ring size, and
/// one more per 1024 connections open at once (`DEFAULT_RMBS_PER_GROUP`): 10 000 concurrent
/// connections from one process need 10. At a bound an idle group is ended to make room, and
/// when none is idle the Proposal is declined (the connection stays TCP).
const GROUPS_PER_CLIENT: usize = 64;
/// See [`GROUPS_PER_CLIENT`].
const SERVER_GROUPS: usize = 256;

/// Client groups a context joins with one server process, and with all servers together
/// (joined or being joined): the server's bounds ([`GROUPS_PER_CLIENT`], [`SERVER_GROUPS`])
/// seen from the other end. Each Accept that names a group we do not have makes us join one
/// (a region of our own, a mapping of the server's, three descriptors), so a server of a
/// trusted uid that named a new group in every Accept would otherwise make us hold one per
/// connection until our descriptors or address space ran out. At a bound the Accept is
/// declined for resources (the connection stays TCP).
const GROUPS_PER_SERVER: usize = GROUPS_PER_CLIENT;
/// See [`GROUPS_PER_SERVER`].
const CLIENT_GROUPS: usize = SERVER_GROUPS;

/// A listener's side-channel acceptor: an abstract SOCK_SEQPACKET socket and the task that
/// serves JOINs on it, on the listener's runtime. It stops when the listener is dropped (or its
/// runtime shuts down); the link groups it set up keep running.
#[derive(Debug, Default)]
pub(crate) struct SideListener {
    inner: Mutex<Option<SideTask>>,
}

#[derive(Debug)]
struct SideTask {
    name: Vec<u8>,
    alive: Arc<AtomicBool>,
    task: tokio::task::AbortHandle,
}

impl Drop for SideListener {
    fn drop(&mut self) {
        if let Some(a) = self.inner.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            a.task.abort();
        }
    }
}

impl SideListener {
    /// The acceptor's abstract name, starting it on the current runtime if it is not running.
    pub(crate) fn name(&self, manager: &Arc<Manager>, timeout: Duration) -> std::io::Result<Vec<u8>> {
        let mut slot = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = slot.as_ref() {
            if a.alive.load(Ordering::Relaxed) {
                return Ok(a.name.clone());
            }
        }
        let name = format!("smc-tokio.{}.{:016x}", std::process::id(), sys::random_u64()).into_bytes();
        // Clients see us as the uid we are when the socket starts listening (the kernel records
        // it then): lending is decided against it (`shm::lend_trust`).
        // SAFETY: geteuid cannot fail and has no preconditions.
        let listen_euid = unsafe { libc::geteuid() };
        // Anyone may connect to it: its connections refuse descriptors from the start where the
        // kernel can (`SO_PASSRIGHTS`, which they take from the listener as their peer
        // connects), until the peer is found to be a client we wait for; that one's JOIN then
        // brings its region (`answer_join`). Elsewhere a connection nobody waits for may bring
        // descriptors, which the closers take out and close.
        let fd = sys::seqpacket_listen(&name, false)?;
        let inert_conns = sys::refuses_descriptors(fd.as_fd()) && sys::refusal_inherited();
        // Closed on a closer: where the kernel cannot refuse, the connections still in its
        // backlog close with it, and anyone may have queued descriptors in them (more so while
        // congested closers leave them there).
        let fd = sys::PeerFd::new(fd);
        // SAFETY: the PeerFd owns its descriptor.
        let listener = unsafe { sys::register(fd, Interest::READABLE) }?;
        let alive = Arc::new(AtomicBool::new(true));
        let flag = AliveFlag(alive.clone());
        let own_name = name.clone();
        let unjoined = Arc::new(Mutex::new(UnjoinedCount::default()));
        let manager = manager.clone();
        let task = tokio::spawn(async move {
            let _flag = flag;
            loop {
                let Ok(mut g) = listener.readable().await else {
                    return;
                };
                if !inert_conns && sys::closers_congested() {
                    // Every connection taken would go to a congested closer (anyone can queue
                    // descriptors in one before it is accepted, where the kernel cannot
                    // refuse): they wait in the backlog, and no new group is set up meanwhile
                    // (`new_server_group`); a client of a group set up just before waits, and
                    // its join may time out (its connection is TCP).
                    tokio::time::sleep(sys::CONGESTED_RETRY).await;
                    continue;
                }
                match g.try_io(|l| sys::seqpacket_accept(l.get_ref().as_fd())) {
                    Ok(Ok(fd)) => {
                        // Nothing but bytes can be queued in it yet where it refuses descriptors
                        // (asked of the socket: a listener whose probe failed still has them):
                        // closed in place.
                        let fd = if inert_conns || sys::refuses_descriptors(fd.as_fd()) { fd.inert() } else { fd };
                        // Filtered at once, as the door filters its knocks: only a process a
                        // pending group of ours waits for may join, and only so many at once
                        // (each for at most the join timeout). Anybody else's connection is
                        // closed: in place where it refused descriptors, else defused by a
                        // closer.
                        let Some((process, pending)) = manager.expects_join(&fd, &own_name) else {
                            manager.counters.door_refused();
                            continue;
                        };
                        let Some(guard) = Unjoined::enter(&unjoined, process, listen_euid, pending) else {
                            tracing::debug!(?process, "side channel: too many connections waiting to join");
                            manager.counters.door_refused();
                            continue;
                        };
                        let serve = manager.clone().serve_join(fd, timeout, own_name.clone(), listen_euid);
                        tokio::spawn(async move {
                            serve.await;
                            drop(guard);
                        });
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "side-channel accept");
                        if e.raw_os_error() == Some(libc::EMFILE) || e.raw_os_error() == Some(libc::ENFILE) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    Err(_would_block) => {}
                }
            }
        })
        .abort_handle();
        if let Some(old) = slot.replace(SideTask { name: name.clone(), alive, task }) {
            old.task.abort();
        }
        Ok(name)
    }
}

/// Side-channel connections one acceptor serves at once before their JOIN is done. Only a
/// trusted process that a pending group of ours waits for gets this far, with at most one
/// connection per such group ([`Unjoined::enter`]), and a client joins once per new link group,
/// so a few are in flight at a time; 64 leaves room for a burst of new clients. Beyond it new
/// connections are closed at once (their clients fall back to TCP).
const MAX_UNJOINED: usize = 64;

/// Counts a side-channel connection that is being served, until its join is over.
struct Unjoined {
    count: Arc<Mutex<UnjoinedCount>>,
    process: ClientProcess,
}

/// A client process as its side-channel connection's credentials name it: (pid, uid). Every
/// process outside our pid namespace shows pid 0, so the uid tells them apart by user.
type ClientProcess = (u32, u32);

/// Side-channel connections served before their JOIN: all of them, per client process, and per
/// uid.
#[derive(Default)]
struct UnjoinedCount {
    all: usize,
    by_process: HashMap<ClientProcess, usize>,
    by_uid: HashMap<u32, usize>,
}

impl Unjoined {
    /// A place for a connection of the client process `(pid, uid)`, which `pending` groups of
    /// ours wait for: at most one per such group, and a quarter of [`MAX_UNJOINED`] for one
    /// process; for a uid other than ours (`own`) a quarter for its processes together, and
    /// half for all other uids ([`uid_share`]); [`MAX_UNJOINED`] in
    /// all. A client joins once per group; one a pending group waited for could otherwise hold
    /// every place with idle connections for the join timeout (a Proposal with another
    /// `instance` each time makes another pending group), and every other client's new group
    /// failed.
    fn enter(
        count: &Arc<Mutex<UnjoinedCount>>,
        (pid, uid): ClientProcess,
        own: u32,
        pending: usize,
    ) -> Option<Unjoined> {
        let mut c = count.lock().unwrap_or_else(|e| e.into_inner());
        let of_process = c.by_process.get(&(pid, uid)).copied().unwrap_or(0);
        let of_uid = |u: u32| c.by_uid.get(&u).copied().unwrap_or(0);
        let over = c.all >= MAX_UNJOINED
            || of_process >= pending.min(MAX_UNJOINED / OTHER_UID_SHARE)
            || uid_share(uid, own, of_uid(uid), c.all - of_uid(own), MAX_UNJOINED) != UidShare::Within;
        if over {
            return None;
        }
        c.all += 1;
        *c.by_process.entry((pid, uid)).or_default() += 1;
        *c.by_uid.entry(uid).or_default() += 1;
        Some(Unjoined { count: count.clone(), process: (pid, uid) })
    }
}

impl Drop for Unjoined {
    fn drop(&mut self) {
        let mut c = self.count.lock().unwrap_or_else(|e| e.into_inner());
        c.all -= 1;
        crate::hash::count_down(&mut c.by_process, &self.process);
        crate::hash::count_down(&mut c.by_uid, &self.process.1);
    }
}

/// A server-side group: who it is for, and our half until the peer joins.
struct ServerGroup {
    group: Arc<LinkGroup>,
    /// The side channel (one per listener) it was set up under: a group serves one listener,
    /// and is joined only through its side channel.
    acceptor: Vec<u8>,
    pid: u32,
    /// The client's uid (from the door): only that process, as that uid, may join.
    uid: u32,
    instance: u64,
    peer_rmb_size: u32,
    local: Option<ShmLocal>,
    busy_poll: Duration,
    allowed_uids: Vec<u32>,
}

#[derive(Default)]
struct ServerSide {
    groups: HashMap<u64, ServerGroup>,
}

impl ServerSide {
    /// `None` when `client` may have another group with the listener whose side channel is
    /// `acceptor` ([`GROUPS_PER_CLIENT`], [`SERVER_GROUPS`], and, for a uid other than ours
    /// (`own`), the shares other uids have of the groups: [`uid_share`]); else the live groups one of which must end to make room: the
    /// client's own when it is at its bound, its uid's at that uid's share, other uids' at
    /// theirs, anyone's otherwise. A few processes of one other trusted uid, each keeping its
    /// groups alive with a connection, held every group otherwise.
    fn no_room_for(&self, client: &ClientIdentity, acceptor: &[u8], own: u32) -> Option<Vec<Arc<LinkGroup>>> {
        let live = || self.groups.values().filter(|g| g.group.is_alive());
        let of_client = |g: &&ServerGroup| g.pid == client.pid && g.uid == client.uid && g.acceptor == acceptor;
        let (of_uid, of_others) =
            (live().filter(|g| g.uid == client.uid).count(), live().filter(|g| g.uid != own).count());
        let share = uid_share(client.uid, own, of_uid, of_others, SERVER_GROUPS);
        let full = live().filter(of_client).count() >= GROUPS_PER_CLIENT;
        if !full && share == UidShare::Within && live().count() < SERVER_GROUPS {
            return None;
        }
        let candidate = |g: &&ServerGroup| match share {
            _ if full => of_client(g),
            UidShare::UidFull => g.uid == client.uid,
            UidShare::OthersFull => g.uid != own,
            UidShare::Within => true,
        };
        Some(live().filter(candidate).map(|g| g.group.clone()).collect())
    }
}

/// A server process as its side channel's credentials name it: (pid, uid).
type ServerProcess = (i32, u32);

/// A client group being joined: every connection whose Accept names it waits for the one join.
type Joining = Arc<tokio::sync::OnceCell<Arc<LinkGroup>>>;

/// A connection's wait for a join ([`ClientSide::establishing`]): if its future is dropped
/// before the join ends (a connect given up: an application's timeout around it) and no other
/// connection waits for that join, the entry goes, or it would count toward the bounds on
/// client groups for good.
struct JoinEntry<'a> {
    side: &'a Mutex<ClientSide>,
    id: u64,
    /// Each waiter holds one reference, the map another.
    cell: Joining,
    /// The join ended (its waiter ended the entry itself).
    ended: bool,
}

impl Drop for JoinEntry<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let mut c = self.side.lock().unwrap_or_else(|e| e.into_inner());
        // The map's reference and this one: nobody else waits.
        if Arc::strong_count(&self.cell) <= 2 {
            c.end_join(self.id, &self.cell);
        }
    }
}

#[derive(Default)]
struct ClientSide {
    /// The group a proposal to this server names (the newest one set up with it).
    by_server: HashMap<SocketAddr, Arc<LinkGroup>>,
    /// Every live client group, by id, with the side-channel name of the server it joined and
    /// that server's process (pid, uid): an Accept may name any of them (concurrent first
    /// connections set up several), but only for the server that owns it.
    by_id: HashMap<u64, (Vec<u8>, Arc<LinkGroup>, ServerProcess)>,
    /// Groups being joined, by id, with the server process joined.
    establishing: HashMap<u64, (Joining, ServerProcess)>,
}

impl ClientSide {
    /// Ends the entry of the join `cell` of group `id`, if the entry is still that join's.
    fn end_join(&mut self, id: u64, cell: &Joining) {
        if self.establishing.get(&id).is_some_and(|(e, _)| Arc::ptr_eq(e, cell)) {
            self.establishing.remove(&id);
        }
    }
}

/// A context's shared-memory groups (held by its [`Manager`]).
#[derive(Default)]
pub(crate) struct Registry {
    server: Mutex<ServerSide>,
    client: Mutex<ClientSide>,
}

impl Registry {
    /// Forgets a dead group.
    pub(crate) fn forget(&self, group: &LinkGroup) {
        match group.role {
            Role::Server => {
                let mut s = self.server.lock().unwrap_or_else(|e| e.into_inner());
                if s.groups.get(&group.id).is_some_and(|g| std::ptr::eq(Arc::as_ptr(&g.group), group)) {
                    s.groups.remove(&group.id);
                }
            }
            Role::Client => {
                let mut c = self.client.lock().unwrap_or_else(|e| e.into_inner());
                c.by_server.retain(|_, g| !std::ptr::eq(Arc::as_ptr(g), group));
                c.by_id.retain(|_, (_, g, _)| !std::ptr::eq(Arc::as_ptr(g), group));
            }
        }
    }
}

impl Manager {
    /// What the client offers to `server`: the group it already has there (pinned, so its idle
    /// timer cannot tear it down while the proposal names it) and the receive ring size.
    pub(crate) fn client_offer(
        &self,
        server: SocketAddr,
        cfg: &ShmConfig,
    ) -> Option<(ShmOffer, u32, Option<GroupPin>)> {
        if !cfg.enabled {
            return None;
        }
        let c = self.shm.client.lock().unwrap_or_else(|e| e.into_inner());
        let existing = c.by_server.get(&server).filter(|g| g.is_established());
        let offer = ShmOffer { link_group: existing.map_or(0, |g| g.id) };
        Some((offer, existing.map_or(cfg.rmb_size, |g| g.tx_rmb_size), existing.map(|g| g.pin())))
    }

    /// The client's side of an Accept: finds or joins the group, allocates our RMB and
    /// registers the connection. Returns what goes into the Confirm.
    pub(crate) async fn client_conn_create(
        self: &Arc<Self>,
        server: (SocketAddr, sys::PeerCred),
        secret: Secret,
        accept: &ShmLinkInfo,
        our_rmb_size: u32,
        cfg: &ShmConfig,
        timeout: Duration,
    ) -> Result<(Arc<SmcConn>, ShmLinkInfo), DeclineReason> {
        let rx_ring = RingSize::new(accept.rmb_size).ok_or(DeclineReason::SyncError)?;
        let group = self.client_group(server, secret, accept, our_rmb_size, cfg, timeout).await?;
        let link = group.link().ok_or(DeclineReason::Internal)?;
        // The peer's region holds rings up to its slot size; they start at the Accept's size.
        if accept.rmb_size > link.rx_rmb_size() || group.tx_rmb_size != our_rmb_size {
            return Err(DeclineReason::SyncError);
        }
        let conn = group.open_conn(Some(accept.rmb_slot), rx_ring, cfg)?;
        conn.restart_tx_at(TX_RESTART_AT);
        let confirm = ShmLinkInfo {
            link_group: group.id,
            rmb_slot: conn.our_token(),
            rmb_size: group.tx_rmb_size,
            socket_name: Vec::new(),
        };
        Ok((conn, confirm))
    }

    async fn client_group(
        self: &Arc<Self>,
        (server, owner): (SocketAddr, sys::PeerCred),
        secret: Secret,
        accept: &ShmLinkInfo,
        our_rmb_size: u32,
        cfg: &ShmConfig,
        timeout: Duration,
    ) -> Result<Arc<LinkGroup>, DeclineReason> {
        let entry = {
            let mut c = self.shm.client.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((name, g, of)) = c.by_id.get(&accept.link_group) {
                // Only the server process that set it up names it (ids are random and secret;
                // this holds even for one that learned another's).
                if *name == accept.socket_name && *of == (owner.pid, owner.uid) && g.is_established() {
                    return Ok(g.clone());
                }
            }
            let process = (owner.pid, owner.uid);
            match c.establishing.get(&accept.link_group) {
                Some((cell, of)) if *of == process => cell.clone(),
                // Being joined with another server process: not this one's to name.
                Some(_) => return Err(DeclineReason::SyncError),
                None => {
                    let of_server = c.by_id.values().filter(|(_, _, o)| *o == process).count()
                        + c.establishing.values().filter(|(_, o)| *o == process).count();
                    // Servers of uids other than ours: a quarter of the groups each, half
                    // together, as the server shares its own out (`ServerSide::no_room_for`);
                    // a few processes of another trusted uid, each naming a new group in
                    // every Accept, took every place otherwise.
                    // SAFETY: geteuid cannot fail and has no preconditions.
                    let own = unsafe { libc::geteuid() };
                    let by = |uid: &dyn Fn(u32) -> bool| {
                        c.by_id.values().filter(|(_, _, o)| uid(o.1)).count()
                            + c.establishing.values().filter(|(_, o)| uid(o.1)).count()
                    };
                    let (of_uid, of_others) = (by(&|u| u == owner.uid), by(&|u| u != own));
                    if of_server >= GROUPS_PER_SERVER
                        || uid_share(owner.uid, own, of_uid, of_others, CLIENT_GROUPS) != UidShare::Within
                        || c.by_id.len() + c.establishing.len() >= CLIENT_GROUPS
                    {
                        tracing::debug!(of_server, "client link groups at their bound: not joining another");
                        return Err(DeclineReason::OutOfMemory);
                    }
                    let cell = Arc::new(tokio::sync::OnceCell::new());
                    c.establishing.insert(accept.link_group, (cell.clone(), process));
                    cell
                }
            }
        };
        let mut entry = JoinEntry { side: &self.shm.client, id: accept.link_group, cell: entry, ended: false };
        let res = entry
            .cell
            .get_or_try_init(|| async {
                if accept.socket_name.is_empty() || accept.socket_name.len() > SHM_SOCKET_NAME_MAX {
                    return Err(DeclineReason::SyncError);
                }
                if sys::closers_congested() {
                    // The server's region and doorbell would go to a congested closer in the end.
                    tracing::debug!("descriptor closers congested: not joining a new shm link group");
                    return Err(DeclineReason::OutOfMemory);
                }
                let capacity = our_rmb_size.max(cfg.get_rmb_max());
                let layout = Layout::new(cfg.cdc_slots, cfg.rmbs_per_group, capacity).ok_or(DeclineReason::Internal)?;
                let local =
                    ShmLocal::create(layout).map_err(|_| DeclineReason::OutOfMemory)?.counting(self.counters.clone());
                let join = Join { link_group: accept.link_group, secret, bell: local.bell_tag() };
                let link = match shm::join(&accept.socket_name, owner, join, local, cfg.busy_poll, timeout).await {
                    Ok(l) => l,
                    Err(e @ JoinError::Starved(_)) => {
                        tracing::debug!(error = %e, "shm join");
                        return Err(DeclineReason::OutOfMemory);
                    }
                    Err(e @ JoinError::Unreachable(_)) => {
                        tracing::debug!(error = %e, "shm side channel unreachable: other host or network namespace");
                        return Err(DeclineReason::NoCommonTransport);
                    }
                    Err(e @ JoinError::Timeout) => {
                        tracing::debug!(error = %e, "shm join");
                        return Err(DeclineReason::Timeout);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "shm join");
                        return Err(DeclineReason::Internal);
                    }
                };
                let group = LinkGroup::new(
                    accept.link_group,
                    Role::Client,
                    TxRmbs::shm(layout.rmb_count, our_rmb_size, capacity),
                    GroupTimes { idle_timeout: cfg.idle_timeout, poll_window: cfg.adaptive_poll },
                    self.clone(),
                );
                group.establish(Arc::new(link)).map_err(|_| DeclineReason::Internal)?;
                Ok(group)
            })
            .await
            .cloned();
        entry.ended = true;
        let mut c = self.shm.client.lock().unwrap_or_else(|e| e.into_inner());
        c.end_join(accept.link_group, &entry.cell);
        if let Ok(g) = &res {
            if g.is_alive() {
                c.by_server.insert(server, g.clone());
                c.by_id.insert(g.id, (accept.socket_name.clone(), g.clone(), (owner.pid, owner.uid)));
            }
        }
        res
    }

    // ----- server ----------------------------------------------------------------------------

    /// The server's side of a Proposal from `client`, which registered its connection at our
    /// door (so it is on this host): finds or creates the group, allocates our RMB and
    /// registers the (not yet confirmed) connection. Returns what goes into the Accept.
    pub(crate) fn server_conn_create(
        self: &Arc<Self>,
        acceptor: &SideListener,
        p: &Proposal,
        client: &ClientIdentity,
        cfg: &ShmConfig,
        handshake_timeout: Duration,
    ) -> Result<(Arc<SmcConn>, ShmLinkInfo), DeclineReason> {
        let offer = p.shm.as_ref().ok_or(DeclineReason::NoCommonTransport)?;
        if !cfg.enabled {
            return Err(DeclineReason::NoCommonTransport);
        }
        let rx_ring = RingSize::new(p.rmb_size).ok_or(DeclineReason::SyncError)?;
        let name = acceptor.name(self, handshake_timeout).map_err(|e| {
            tracing::debug!(error = %e, "cannot listen for shm side channels");
            DeclineReason::Internal
        })?;
        let (group, fresh) = crate::smc::manager::make_room(|| {
            let mut s = self.shm.server.lock().unwrap_or_else(|e| e.into_inner());
            let same_client = |g: &&ServerGroup| {
                // The uid too: a client outside our pid namespace shows pid 0, and then only its
                // instance number (which every server it registers with learns) tells it from
                // another client of an allowed uid.
                g.acceptor == name
                    && g.pid == client.pid
                    && g.uid == client.uid
                    && g.instance == client.instance
                    && g.peer_rmb_size == p.rmb_size
                    && g.group.is_alive()
            };
            // The group the proposal names; else, since the door told us who the client is, a
            // group it is still joining (a burst of first connections from one process shares
            // one group instead of setting one up each) or another of its groups in use (not
            // idle, so the client is not closing it). A full group (every RMB slot taken) is
            // passed over, and when all are full a new group is set up, as the kernel's SMC
            // does for a link group at its connection limit: more connections at once than
            // one group holds are not declined.
            let open_to_more = |g: &&ServerGroup| g.group.has_room() && (g.local.is_some() || g.group.in_use());
            let reuse = s
                .groups
                .get(&offer.link_group)
                .filter(same_client)
                .filter(|g| g.group.has_room())
                .or_else(|| s.groups.values().filter(same_client).find(open_to_more));
            if let Some(g) = reuse {
                return Ok(Ok((g.group.clone(), false)));
            }
            // SAFETY: geteuid cannot fail and has no preconditions.
            let own = unsafe { libc::geteuid() };
            if let Some(candidates) = s.no_room_for(client, &name, own) {
                return Err(candidates);
            }
            Ok(self.new_server_group(&mut s, &name, p, client, cfg, handshake_timeout).map(|g| (g, true)))
        })??;
        if fresh {
            // A pending group nobody joins is removed when its handshakes time out, or when the
            // runtime that would time them out shuts down first (its task is then dropped,
            // perhaps inside `spawn`: hence outside the registry's lock, which ending the group
            // takes).
            struct Unjoined(Arc<LinkGroup>);
            impl Drop for Unjoined {
                fn drop(&mut self) {
                    if self.0.link().is_none() {
                        self.0.fail(crate::link::LinkError::Closed);
                    }
                }
            }
            let pending = Unjoined(group.clone());
            tokio::spawn(async move {
                tokio::time::sleep(handshake_timeout * 2).await;
                drop(pending);
            });
        }
        if !group.is_established() {
            group.add_join_secret(p.secret);
        }
        let conn = group.open_conn(None, rx_ring, cfg)?;
        conn.restart_tx_at(TX_RESTART_AT);
        let info = ShmLinkInfo {
            link_group: group.id,
            rmb_slot: conn.our_token(),
            rmb_size: group.tx_rmb_size,
            socket_name: name,
        };
        Ok((conn, info))
    }

    /// A new server group for `client`'s Proposal `p` on the side channel `name`, filed
    /// (pending until the client joins) in `s`.
    fn new_server_group(
        self: &Arc<Self>,
        s: &mut ServerSide,
        name: &[u8],
        p: &Proposal,
        client: &ClientIdentity,
        cfg: &ShmConfig,
        handshake_timeout: Duration,
    ) -> Result<Arc<LinkGroup>, DeclineReason> {
        if sys::closers_congested() {
            // A group's set-up takes the client's region and doorbell, descriptors that go to a
            // closer in the end: declined for resources while the closers are congested.
            tracing::debug!("descriptor closers congested: no new shm link group");
            return Err(DeclineReason::OutOfMemory);
        }
        let layout =
            Layout::new(cfg.cdc_slots, cfg.rmbs_per_group, cfg.get_rmb_max()).ok_or(DeclineReason::Internal)?;
        let local = ShmLocal::create(layout)
            .map_err(|e| {
                tracing::debug!(error = %e, "cannot create shm region");
                DeclineReason::OutOfMemory
            })?
            .counting(self.counters.clone());
        let mut id = sys::random_u64();
        while s.groups.contains_key(&id) {
            id = sys::random_u64();
        }
        let group = LinkGroup::new(
            id,
            Role::Server,
            TxRmbs::shm(layout.rmb_count, cfg.rmb_size, cfg.get_rmb_max()),
            GroupTimes { idle_timeout: cfg.idle_timeout.max(handshake_timeout), poll_window: cfg.adaptive_poll },
            self.clone(),
        );
        s.groups.insert(
            id,
            ServerGroup {
                group: group.clone(),
                acceptor: name.to_vec(),
                pid: client.pid,
                uid: client.uid,
                instance: client.instance,
                peer_rmb_size: p.rmb_size,
                local: Some(local),
                busy_poll: cfg.busy_poll,
                allowed_uids: cfg.allowed_uids.clone(),
            },
        );
        Ok(group)
    }

    /// A handshake that created or used a pending group ended without SMC: if nobody has
    /// joined the group (its region was never handed over) and no other connection uses it,
    /// nobody will join it any more, so it is dropped now rather than at the pending timer.
    /// Checked under the lock that admits joins, so it never races with one.
    pub(crate) fn abandon_pending(&self, group: &Arc<LinkGroup>) {
        let removed = {
            let mut s = self.shm.server.lock().unwrap_or_else(|e| e.into_inner());
            let unjoined = s.groups.get(&group.id).is_some_and(|g| {
                Arc::ptr_eq(&g.group, group) && g.local.is_some() && group.link().is_none() && group.conn_count() == 0
            });
            if unjoined {
                s.groups.remove(&group.id)
            } else {
                None
            }
        };
        if let Some(g) = removed {
            tracing::debug!(id = group.id, "dropping a pending link group nobody joined");
            g.group.fail(crate::link::LinkError::Closed);
        }
    }

    /// Whether the peer of a new side-channel connection on `acceptor` is a client that a
    /// pending group of ours waits for (trusted credentials, and the pid and uid that
    /// registered at the door): its (pid, uid), and how many pending groups wait for it.
    fn expects_join(&self, fd: &sys::PeerFd, acceptor: &[u8]) -> Option<(ClientProcess, usize)> {
        let cred = sys::peer_cred(fd.as_fd()).ok()?;
        let s = self.shm.server.lock().unwrap_or_else(|e| e.into_inner());
        let pending = s
            .groups
            .values()
            .filter(|g| {
                g.acceptor == acceptor
                    && g.local.is_some()
                    && i64::from(g.pid) == i64::from(cred.pid)
                    && g.uid == cred.uid
                    && cred.trusted(&g.allowed_uids)
            })
            .count();
        let expected = (pending > 0).then(|| ((u32::try_from(cred.pid).unwrap_or(0), cred.uid), pending));
        if expected.is_none() {
            tracing::debug!(
                uid = cred.uid,
                gid = cred.gid,
                pid = cred.pid,
                "side channel: refusing a connection nobody waits for"
            );
        }
        expected
    }

    async fn serve_join(
        self: Arc<Self>,
        fd: crate::sys::PeerFd,
        timeout: Duration,
        acceptor: Vec<u8>,
        listen_euid: u32,
    ) {
        let mut joined = None;
        let res = shm::answer_join(fd, timeout, listen_euid, |join, cred| {
            let mut s = self.shm.server.lock().unwrap_or_else(|e| e.into_inner());
            let g = s
                .groups
                .get_mut(&join.link_group)
                .filter(|g| g.acceptor == acceptor)
                .ok_or(JoinRefused::UnknownGroup)?;
            if !g.group.has_join_secret(join.secret) {
                return Err(JoinRefused::UnknownGroup);
            }
            if !cred.trusted(&g.allowed_uids) || cred.uid != g.uid || i64::from(cred.pid) != i64::from(g.pid) {
                tracing::debug!(uid = cred.uid, pid = cred.pid, "refusing shm join from another process");
                return Err(JoinRefused::Credentials);
            }
            let local = g.local.take().ok_or(JoinRefused::UnknownGroup)?;
            joined = Some((g.group.clone(), g.peer_rmb_size));
            Ok(Admission { local, busy_poll: g.busy_poll })
        })
        .await;
        match (res, joined) {
            (Ok((_, link)), Some((group, peer_rmb_size))) => {
                if peer_rmb_size > link.rx_rmb_size() {
                    tracing::debug!("peer region's rmb slots are smaller than its proposal's ring");
                    group.fail(crate::link::LinkError::Protocol("rmb size mismatch"));
                    return;
                }
                if let Err(e) = group.establish(Arc::new(link)) {
                    group.fail(e);
                }
            }
            (Err(e), Some((group, _))) => {
                tracing::debug!(error = %e, "shm join failed");
                group.fail(crate::link::LinkError::Protocol("join failed"));
            }
            (Err(e), None) => tracing::debug!(error = %e, "shm join refused"),
            (Ok(_), None) => {}
        }
    }
}

/// Clears the acceptor's liveness flag when its task ends (or its runtime drops it), so the
/// next handshake starts a new listener.
struct AliveFlag(Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smc::manager::OTHER_UIDS_SHARE;

    /// A client process has at most one side-channel connection waiting to join per pending
    /// group that waits for it, and all clients together `MAX_UNJOINED`; a place comes back
    /// when its connection is done.
    #[test]
    fn a_client_waits_to_join_on_one_connection_per_pending_group() {
        let count = Arc::new(Mutex::new(UnjoinedCount::default()));
        let own = 1000;
        let enter = |pid: u32, uid: u32, pending: usize| Unjoined::enter(&count, (pid, uid), own, pending);
        let first = enter(7, own, 1).expect("one for its one group");
        assert!(enter(7, own, 1).is_none(), "a second for the same group");
        let second = enter(7, own, 2).expect("one more once a second group waits");
        drop(first);
        let again = enter(7, own, 2).expect("a place given back");
        // However many groups wait for one process: a quarter of the places.
        let many: Vec<_> = std::iter::from_fn(|| enter(8, own, 1000)).collect();
        assert_eq!(many.len(), MAX_UNJOINED / OTHER_UID_SHARE);
        // Processes of another uid, pid 0 or not: a quarter together; all other uids half.
        let a: Vec<_> = (0..4).flat_map(|pid| std::iter::from_fn(move || enter(pid, 2001, 1000)).take(100)).collect();
        assert_eq!(a.len(), MAX_UNJOINED / OTHER_UID_SHARE, "one other uid");
        let b: Vec<_> = std::iter::from_fn(|| enter(0, 2002, 1000)).collect();
        assert_eq!(b.len(), MAX_UNJOINED / OTHER_UID_SHARE, "a second other uid");
        assert!(enter(0, 2003, 1000).is_none(), "all other uids together: half");
        drop((second, again, many, a, b));
        let c = count.lock().unwrap();
        assert_eq!((c.all, c.by_process.len(), c.by_uid.len()), (0, 0, 0));
    }

    /// The clients of one uid other than the listener's hold at most a quarter of the server's
    /// groups, all other uids together half; the listener's own uid's clients the rest. At a
    /// share, the groups one of which must end to make room are that uid's (other uids', at
    /// theirs).
    #[tokio::test]
    async fn other_uids_hold_at_most_their_shares_of_server_groups() {
        let manager = Manager::new(Arc::default(), Arc::new(crate::config::RmbBudget::new()));
        let times = GroupTimes { idle_timeout: Duration::from_secs(60), poll_window: Duration::ZERO };
        let own = 1000;
        let mut side = ServerSide::default();
        let mut id = 0;
        // Fills groups of `uid`'s processes (a new process each `GROUPS_PER_CLIENT`) while
        // there is room; how many.
        let mut fill = |side: &mut ServerSide, uid: u32, pid0: u32| {
            let mut n = 0;
            loop {
                let client = ClientIdentity { pid: pid0 + (n / GROUPS_PER_CLIENT) as u32, uid, instance: 1 };
                if let Some(candidates) = side.no_room_for(&client, b"acceptor", own) {
                    return (n, candidates);
                }
                id += 1;
                let group = LinkGroup::new(id, Role::Server, TxRmbs::shm(4, 4096, 4096), times, manager.clone());
                let g = ServerGroup {
                    group,
                    acceptor: b"acceptor".to_vec(),
                    pid: client.pid,
                    uid,
                    instance: 1,
                    peer_rmb_size: 4096,
                    local: None,
                    busy_poll: Duration::ZERO,
                    allowed_uids: Vec::new(),
                };
                side.groups.insert(id, g);
                n += 1;
            }
        };
        let (n, candidates) = fill(&mut side, 2001, 100);
        assert_eq!(n, SERVER_GROUPS / OTHER_UID_SHARE, "one other uid, over several processes: a quarter");
        assert!(candidates.len() == n, "its own groups are the ones to end for room");
        let (n, candidates) = fill(&mut side, 2002, 200);
        assert_eq!(n, SERVER_GROUPS / OTHER_UID_SHARE, "a second uid: a quarter too");
        assert_eq!(candidates.len(), n);
        let (n, candidates) = fill(&mut side, 2003, 300);
        assert_eq!(n, 0, "all other uids together: half");
        assert_eq!(candidates.len(), SERVER_GROUPS / OTHER_UIDS_SHARE, "the other uids' groups");
        let (n, _) = fill(&mut side, own, 400);
        assert_eq!(n, SERVER_GROUPS / 2, "the listener's own uid: the rest");
    }

    /// Servers of a uid other than ours hold at most a quarter of a client's groups, all other
    /// uids together half: past that their Accepts naming a new group are declined for
    /// resources; a server of our own uid is bounded only by the rest.
    #[tokio::test]
    async fn servers_of_other_uids_make_a_client_join_at_most_their_shares() {
        let manager = Manager::new(Arc::default(), Arc::new(crate::config::RmbBudget::new()));
        let times = GroupTimes { idle_timeout: Duration::from_secs(60), poll_window: Duration::ZERO };
        let server: SocketAddr = "127.0.0.1:1".parse().unwrap();
        // SAFETY: geteuid cannot fail and has no preconditions.
        let own = unsafe { libc::geteuid() };
        let (a, b) = (own.wrapping_add(1001), own.wrapping_add(1002));
        let mut groups = Vec::new();
        let mut hold = |uid: u32, pid0: i32, n: usize| {
            let mut c = manager.shm.client.lock().unwrap();
            for i in 0..n {
                let id = 1000 + groups.len() as u64;
                let g = LinkGroup::new(id, Role::Client, TxRmbs::shm(2, 1 << 16, 1 << 16), times, manager.clone());
                // A server process per GROUPS_PER_SERVER groups.
                let pid = pid0 + (i / GROUPS_PER_SERVER) as i32;
                c.by_id.insert(id, (b"held".to_vec(), g.clone(), (pid, uid)));
                groups.push(g);
            }
        };
        let join = |uid: u32, pid: i32| {
            let manager = manager.clone();
            async move {
                let accept = ShmLinkInfo {
                    link_group: 1,
                    rmb_slot: 0,
                    rmb_size: 1 << 16,
                    socket_name: b"smc-tokio/test/nobody-listens-here".to_vec(),
                };
                let owner = sys::PeerCred { pid, uid, gid: 0 };
                let secret = sys::random_secret().unwrap();
                let r = manager
                    .client_group(
                        (server, owner),
                        secret,
                        &accept,
                        1 << 16,
                        &ShmConfig::default(),
                        Duration::from_secs(1),
                    )
                    .await;
                r.err()
            }
        };
        hold(a, 100, CLIENT_GROUPS / OTHER_UID_SHARE - 1);
        assert_ne!(join(a, 900).await, Some(DeclineReason::OutOfMemory), "below its share the join is tried");
        hold(a, 200, 1);
        assert_eq!(join(a, 901).await, Some(DeclineReason::OutOfMemory), "one other uid: a quarter");
        assert_ne!(join(b, 902).await, Some(DeclineReason::OutOfMemory), "another uid is not held back by it");
        hold(b, 300, CLIENT_GROUPS / OTHER_UID_SHARE);
        let c = own.wrapping_add(1003);
        assert_eq!(join(c, 903).await, Some(DeclineReason::OutOfMemory), "all other uids together: half");
        assert_ne!(join(own, 904).await, Some(DeclineReason::OutOfMemory), "our own uid's servers: the rest");
        drop(groups);
    }

    /// A server that names a new link group in every Accept makes us join at most
    /// [`GROUPS_PER_SERVER`] of them, and all servers together [`CLIENT_GROUPS`]: past that the
    /// Accept is declined for resources (the connection stays TCP) before anything is made.
    #[tokio::test]
    async fn a_server_cannot_make_a_client_join_groups_without_bound() {
        let manager = Manager::new(Arc::default(), Arc::new(crate::config::RmbBudget::new()));
        let times = GroupTimes { idle_timeout: Duration::from_secs(60), poll_window: Duration::ZERO };
        let server: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let owner = |pid| sys::PeerCred { pid, uid: 0, gid: 0 };
        // Groups the client holds: `n` more with the server process `pid`.
        let hold = |pid: i32, n: usize, groups: &mut Vec<Arc<LinkGroup>>| {
            let mut c = manager.shm.client.lock().unwrap();
            for _ in 0..n {
                let id = 1000 + groups.len() as u64;
                let g = LinkGroup::new(id, Role::Client, TxRmbs::shm(2, 1 << 16, 1 << 16), times, manager.clone());
                c.by_id.insert(id, (b"held".to_vec(), g.clone(), (pid, 0)));
                groups.push(g);
            }
        };
        // An Accept naming a group we do not have, at a side channel nobody listens on.
        let join = |pid: i32, id: u64| {
            let manager = manager.clone();
            async move {
                let accept = ShmLinkInfo {
                    link_group: id,
                    rmb_slot: 0,
                    rmb_size: 1 << 16,
                    socket_name: b"smc-tokio/test/nobody-listens-here".to_vec(),
                };
                let secret = sys::random_secret().unwrap();
                manager
                    .client_group(
                        (server, owner(pid)),
                        secret,
                        &accept,
                        1 << 16,
                        &ShmConfig::default(),
                        Duration::from_secs(1),
                    )
                    .await
                    .err()
            }
        };
        let mut groups = Vec::new();
        hold(7, GROUPS_PER_SERVER - 1, &mut groups);
        // Below the bound the join is tried (and finds nobody).
        assert_ne!(join(7, 1).await, Some(DeclineReason::OutOfMemory));
        hold(7, 1, &mut groups);
        assert_eq!(join(7, 2).await, Some(DeclineReason::OutOfMemory), "a 65th group with one server");
        // Another server still gets groups, up to the bound of all.
        assert_ne!(join(8, 3).await, Some(DeclineReason::OutOfMemory));
        for pid in 9.. {
            if groups.len() >= CLIENT_GROUPS {
                break;
            }
            hold(pid, (CLIENT_GROUPS - groups.len()).min(GROUPS_PER_SERVER - 1), &mut groups);
        }
        assert_eq!(join(8, 4).await, Some(DeclineReason::OutOfMemory), "a group past the bound of all");
        assert!(manager.shm.client.lock().unwrap().establishing.is_empty());
    }

    /// Two clients that show one pid (0: both outside our pid namespace) and one instance
    /// number, as a client of an allowed uid can make itself look once it learned another's
    /// instance (every server it registers with sees it), never share a server group unless
    /// their uids are the same too.
    #[tokio::test]
    async fn clients_of_two_uids_never_share_a_server_group() {
        let manager = Manager::new(Arc::default(), Arc::new(crate::config::RmbBudget::new()));
        let acceptor = SideListener::default();
        let cfg = ShmConfig::default();
        let p = Proposal {
            secret: sys::random_secret().unwrap(),
            rmb_size: 64 << 10,
            shm: Some(crate::proto::clc::ShmOffer { link_group: 0 }),
            rdma: None,
        };
        let group_of = |uid: u32| {
            let client = ClientIdentity { pid: 0, uid, instance: 0x5eed };
            let (conn, info) =
                manager.server_conn_create(&acceptor, &p, &client, &cfg, Duration::from_secs(5)).unwrap();
            (conn, info.link_group)
        };
        let (_a, first) = group_of(1000);
        let (_b, other_uid) = group_of(1001);
        let (_c, same_uid) = group_of(1000);
        assert_ne!(first, other_uid, "a client of another uid was put in the group of a client it imitates");
        assert_eq!(first, same_uid, "one client's burst of first connections set up two groups");
    }

    /// A connect given up while its group was being joined leaves nothing that counts toward
    /// the bounds: the join's entry goes with the last connection waiting for it.
    #[tokio::test]
    async fn a_join_given_up_leaves_no_entry() {
        let manager = Manager::new(Arc::default(), Arc::new(crate::config::RmbBudget::new()));
        // A side channel that takes the connection and never answers: the join waits.
        let name = format!("smc-tokio/test/silent-side/{}", std::process::id()).into_bytes();
        let _side = sys::seqpacket_listen(&name, true).unwrap();
        let accept = ShmLinkInfo { link_group: 77, rmb_slot: 0, rmb_size: 1 << 16, socket_name: name };
        // SAFETY: these getters cannot fail and take no pointers.
        let owner = unsafe { sys::PeerCred { pid: libc::getpid(), uid: libc::geteuid(), gid: libc::getegid() } };
        let server: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let secret = sys::random_secret().unwrap();
        let cfg = ShmConfig::default();
        let join = || manager.client_group((server, owner), secret, &accept, 1 << 16, &cfg, Duration::from_secs(60));
        let (first, second) = (join(), join());
        let both = async { tokio::join!(first, second) };
        let r = tokio::time::timeout(Duration::from_millis(300), both).await;
        assert!(r.is_err(), "the join ended: {r:?}");
        assert!(manager.shm.client.lock().unwrap().establishing.is_empty(), "a given-up join left its entry");
        // One of two waiters given up: the other still waits on the entry.
        let mut kept = Box::pin(join());
        assert!(tokio::time::timeout(Duration::from_millis(100), kept.as_mut()).await.is_err());
        let dropped = join();
        assert!(tokio::time::timeout(Duration::from_millis(100), dropped).await.is_err());
        assert_eq!(manager.shm.client.lock().unwrap().establishing.len(), 1, "the entry went while one waits");
        drop(kept);
        assert!(manager.shm.client.lock().unwrap().establishing.is_empty());
    }
}
