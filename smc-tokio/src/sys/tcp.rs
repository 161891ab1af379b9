//! TCP sockets and addresses: client sockets bound (from our own port allocator) before they
//! connect, what a server checks about a socket a client hands it, four-tuples, and whether an
//! address is this host's (an interface-address cache).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::cvt;

/// The automatic port range (first, last) and the reserved ranges in it.
type PortRange = (u16, u16, Vec<(u16, u16)>);

/// The local port range for automatic ports (`/proc/sys/net/ipv4/ip_local_port_range`, which
/// governs IPv6 too), and the ports reserved from it (`ip_local_reserved_ports`), read once.
/// Linux's defaults when the files cannot be read: 32768..=60999, nothing reserved.
fn port_range() -> &'static PortRange {
    static R: std::sync::OnceLock<PortRange> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        let nums = |s: &str| s.split_whitespace().filter_map(|w| w.parse::<u16>().ok()).collect::<Vec<_>>();
        let (lo, hi) = match std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").map(|s| nums(&s)) {
            Ok(v) if v.len() == 2 && v[0] > 0 && v[0] <= v[1] => (v[0], v[1]),
            _ => (32768, 60999),
        };
        let reserved = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports")
            .map(|s| {
                s.trim()
                    .split(',')
                    .filter_map(|part| {
                        let mut it = part.trim().splitn(2, '-').map(|x| x.parse::<u16>().ok());
                        match (it.next().flatten(), it.next()) {
                            (Some(a), None) => Some((a, a)),
                            (Some(a), Some(Some(b))) => Some((a, b)),
                            _ => None,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        (lo, hi, reserved)
    })
}

/// The next port to try: a per-process cursor walking the automatic range from a random
/// start, so that one process's ports come back as late as possible (a port's last connection
/// must have left TIME_WAIT's reuse window before the same 4-tuple can connect again) and two
/// processes rarely walk the same ports.
fn next_port() -> u16 {
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    static CURSOR: AtomicU32 = AtomicU32::new(0);
    let (lo, hi, reserved) = port_range();
    let span = u32::from(*hi - *lo) + 1;
    let start = *START.get_or_init(|| (super::random_u64() % u64::from(span)) as u32);
    let mut port = *lo;
    // Bounded, in case a range is reserved whole; bind then reports the conflict.
    for _ in 0..span {
        let n = start.wrapping_add(CURSOR.fetch_add(1, Ordering::Relaxed));
        port = (u32::from(*lo) + n % span) as u16;
        if !reserved.iter().any(|(a, b)| (*a..=*b).contains(&port)) {
            break;
        }
    }
    port
}

/// A random port of the automatic range (reserved ones skipped).
fn random_port() -> u16 {
    let (lo, hi, reserved) = port_range();
    let span = u64::from(*hi - *lo) + 1;
    let mut port = *lo;
    for _ in 0..16 {
        port = (u64::from(*lo) + super::random_u64() % span) as u16;
        if !reserved.iter().any(|(a, b)| (*a..=*b).contains(&port)) {
            break;
        }
    }
    port
}

/// The source address the kernel gave this process's last connection to each local
/// destination address, learned with `getsockname` on the first one: a same-host connection's
/// own address is the route's (the destination itself, or 127.0.0.1 across 127/8), which
/// changes only with the host's addresses. A connection that finds it wrong tells the listener
/// a four-tuple that the kernel does not know; the listener declines (the connection stays
/// TCP) and the caller forgets the entry ([`forget_source`]).
static SOURCES: PerProcess<Vec<(IpAddr, IpAddr)>> = PerProcess::new();

/// The most source addresses kept: a host's own addresses, in practice a handful.
const SOURCES_KEPT: usize = 64;

fn sources() -> std::sync::MutexGuard<'static, Vec<(IpAddr, IpAddr)>> {
    SOURCES.lock()
}

/// The source address learned for connections to `dst` ([`SOURCES`]).
pub(crate) fn known_source(dst: IpAddr) -> Option<IpAddr> {
    sources().iter().find(|(d, _)| *d == dst).map(|(_, src)| *src)
}

/// Records that a connection to `dst` came from `src`.
pub(crate) fn learn_source(dst: IpAddr, src: IpAddr) {
    let mut s = sources();
    s.retain(|(d, _)| *d != dst);
    if s.len() >= SOURCES_KEPT {
        s.remove(0);
    }
    s.push((dst, src));
}

/// Forgets the source address learned for `dst`: the next connection asks the kernel again.
pub(crate) fn forget_source(dst: IpAddr) {
    sources().retain(|(d, _)| *d != dst);
}

/// How many ports [`bound_tcp_socket`] tries before it gives up.
const BIND_ATTEMPTS: usize = 64;

/// A non-blocking TCP socket for a connection to `dst`, bound to the wildcard address and a
/// port of this process's choosing before it connects, so that the port can be registered at
/// a listener's door; with that port. `SO_REUSEPORT` lets it bind over this process's own connections in
/// TIME_WAIT (which would otherwise exhaust the ports at high connection rates) while the
/// kernel keeps every other uid off the port as long as the socket lives (a reuseport group
/// is one uid's); `SO_REUSEADDR` stays off, since it would let any uid share the port.
pub(crate) fn bound_tcp_socket(dst: SocketAddr) -> io::Result<(socket2::Socket, u16)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let (domain, any): (Domain, IpAddr) = match dst {
        SocketAddr::V4(_) => (Domain::IPV4, Ipv4Addr::UNSPECIFIED.into()),
        SocketAddr::V6(_) => (Domain::IPV6, Ipv6Addr::UNSPECIFIED.into()),
    };
    let sock = Socket::new(domain, Type::STREAM.nonblocking().cloexec(), Some(Protocol::TCP))?;
    sock.set_reuse_port(true)?;
    let mut last = None;
    for attempt in 0..BIND_ATTEMPTS {
        // The cursor first; after a conflict, anywhere: ports held by other sockets (plain
        // connections in TIME_WAIT, whose ports the kernel hands out in runs) come in runs too.
        let port = if attempt == 0 { next_port() } else { random_port() };
        match sock.bind(&SocketAddr::new(any, port).into()) {
            Ok(()) => return Ok((sock, port)),
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
}

/// Binds the application's socket to the wildcard address of `dst`'s family and a port the
/// kernel picks, unless it is bound to a port already (a registration names a bound port).
pub(crate) fn bind_if_unbound(sock: &socket2::Socket, dst: SocketAddr) -> io::Result<()> {
    if sock.local_addr().ok().and_then(|a| a.as_socket()).is_some_and(|a| a.port() != 0) {
        return Ok(());
    }
    let any: IpAddr = match dst {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    sock.bind(&SocketAddr::new(any, 0).into())
}

/// A zero `SO_LINGER` on a TCP socket: its last close is a reset (tcp(7)), with no FIN exchange
/// and no `TIME_WAIT`. A failure is ignored: the close is then an orderly one.
/// How long the kernel keeps this TCP socket, orphaned, waiting for its peer's close
/// (`TCP_LINGER2`: the socket's own value, or `net.ipv4.tcp_fin_timeout`; a negative one, no
/// wait at all, is zero).
pub(crate) fn orphan_linger(sock: &impl std::os::fd::AsFd) -> io::Result<std::time::Duration> {
    let secs = super::getsockopt(sock.as_fd(), libc::IPPROTO_TCP, libc::TCP_LINGER2, 0 as libc::c_int)?;
    Ok(std::time::Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
}

pub(crate) fn set_zero_linger(sock: &impl std::os::fd::AsFd) {
    let _ = socket2::SockRef::from(sock).set_linger(Some(std::time::Duration::ZERO));
}

/// Ends the TCP connection of `sock` with a reset now, while the descriptor stays open:
/// `connect(2)` to an `AF_UNSPEC` address disconnects a TCP socket (Linux's `tcp_disconnect`),
/// which sends the peer a reset from an established connection and leaves `ECONNRESET` as the
/// socket's error, so that our next read or write fails and the peer's reads end in an error,
/// not in a clean end of stream. Best effort: a socket that is not connected any more stays
/// as it is.
pub(crate) fn reset_now(sock: &impl std::os::fd::AsFd) {
    // SAFETY: `sockaddr` is plain data; all-zero with the family set is a valid AF_UNSPEC
    // address of its own size.
    let mut addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    addr.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    let len = std::mem::size_of::<libc::sockaddr>() as libc::socklen_t;
    // SAFETY: a borrowed open descriptor, and `addr` valid for reads of `len` bytes.
    if let Err(e) = cvt(unsafe { libc::connect(sock.as_fd().as_raw_fd(), &addr, len) }) {
        tracing::debug!(error = %e, "resetting a tcp connection");
    }
}

/// The soft limit on open descriptors (`RLIMIT_NOFILE`), if it can be read.
pub(crate) fn nofile_limit() -> Option<u64> {
    // SAFETY: rlimit is plain data; all-zero is valid.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is valid for writes.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0).then_some(r.rlim_cur)
}

/// Whether `e` says this process ran out of descriptors or memory (rather than that the peer
/// or the network did something).
pub(crate) fn is_starved(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::OutOfMemory
        || matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS))
}

/// `addr` with an IPv4-mapped IPv6 address turned into the IPv4 one, so that a dual-stack
/// listener's view of a peer compares equal to the peer's own view.
pub(crate) fn unmap(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), a.port()),
            None => addr,
        },
        v4 => v4,
    }
}

/// The client host `ip` stands for in the bounds kept per host: an IPv4 address as it is (in
/// its IPv4-mapped form, as an IPv4-mapped IPv6 address), an IPv6 address by its /64, which one
/// host may hold whole. Link-local addresses are one /64 (`fe80::/64`) between them: any
/// neighbour on the link may take as many as it likes.
///
/// ```text
/// 192.0.2.1, ::ffff:192.0.2.1     -> ::ffff:192.0.2.1
/// 2001:db8:1:2::1, 2001:db8:1:2:: -> 2001:db8:1:2::
/// ```
pub(crate) fn host_of(ip: IpAddr) -> Ipv6Addr {
    let v6 = match ip {
        IpAddr::V4(v4) => return v4.to_ipv6_mapped(),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => return v6,
        IpAddr::V6(v6) => v6,
    };
    let mut o = v6.octets();
    o[8..].fill(0);
    o.into()
}

/// Whether `addr` is an address of this host (in this network namespace): a loopback address or
/// one assigned to an interface; a link-local IPv6 address only on the interface its scope
/// names (`fe80::1%2`, where another host on the link of interface 3 may have `fe80::1` too),
/// on any without a scope (which only a socket bound to a device can connect to). Interface
/// addresses are read with getifaddrs(3) and kept
/// until the kernel says they changed: a routing socket that hears of every address added or
/// removed ([`AddrWatch`]) is looked at on each call (one `recv` that finds nothing), so an
/// address is known as this host's from the moment it was assigned, before anybody could
/// connect from it. (A listener asks this of each client to know whether it can have
/// registered at its door: an address taken for another host's would hand a registered
/// client's connection out as TCP.) Where no such socket can be had, the list is read again
/// each second. A process forked from one that kept the list keeps a list and a watch of its
/// own ([`PerProcess`]): the socket it inherited is its parent's too, and what one of them
/// reads the other never hears.
pub(crate) fn is_local_addr(addr: SocketAddr) -> bool {
    let addr = unmap(addr);
    let ip = addr.ip();
    if ip.is_loopback() {
        return true;
    }
    // A link-local address names an interface's link by its scope (the interface's index):
    // each link has its own `fe80::/10`. One without a scope (`None`: any interface's) is what
    // a socket bound to a device connects to, on that device's link, which is not known here.
    let scope = match addr {
        SocketAddr::V6(a) if a.ip().is_unicast_link_local() && a.scope_id() == 0 => None,
        SocketAddr::V6(a) if a.ip().is_unicast_link_local() => Some(a.scope_id()),
        _ => Some(0),
    };
    let mut c = ADDRS.lock();
    let stale = match c.as_mut() {
        None => true,
        Some(a) => match &a.watch {
            Some(w) => w.changed().unwrap_or_else(|e| {
                tracing::debug!(error = %e, "address watch failed: reading the addresses each second");
                a.watch = None;
                true
            }),
            None => a.read.elapsed() >= std::time::Duration::from_secs(1),
        },
    };
    if stale {
        // The watch opened before the list is read: a change after the read is heard.
        let (old, watch) = match c.take() {
            Some(Addrs { ips, watch: Some(w), .. }) => (ips, Some(w)),
            Some(Addrs { ips, .. }) => (ips, AddrWatch::open().ok()),
            None => (Vec::new(), AddrWatch::open().ok()),
        };
        let read = std::time::Instant::now();
        *c = Some(match interface_addrs() {
            Ok(ips) => Addrs { ips, read, watch },
            // No list now (no descriptor free, say): the last one is kept, and read again in a
            // second, whatever the watch hears.
            Err(e) => {
                tracing::debug!(error = %e, "cannot read this host's addresses");
                Addrs { ips: old, read, watch: None }
            }
        });
    }
    c.as_ref().is_some_and(|a| a.ips.iter().any(|&(i, s)| i == ip && scope.is_none_or(|want| want == s)))
}

/// This host's addresses as [`is_local_addr`] last read them, each with its scope (a
/// link-local address's interface index, 0 for any other).
struct Addrs {
    ips: Vec<(IpAddr, u32)>,
    read: std::time::Instant,
    /// What tells of changes since (`None`: the list is read again after a second).
    watch: Option<AddrWatch>,
}

/// This host's addresses as this process last read them ([`PerProcess`]: a forked child reads
/// its own, on a watch of its own).
static ADDRS: PerProcess<Option<Addrs>> = PerProcess::new();

/// A value each process keeps for itself, under a lock of its own: a forked child starts from
/// `T::default()` instead of its parent's value, and never waits for its parent's lock, which
/// a thread that does not exist in the child may have held at the fork (and would then hold for
/// good). The process is told by its pid and [`forks`] (the count tells a child whose pid is its
/// parent's, PID 1 of a new pid namespace forked from PID 1 of another).
pub(crate) struct PerProcess<T> {
    /// The slot of the process that made it last: a leaked box, never freed (null before the
    /// first). Ordering: a slot is written before it is published (release) and read after
    /// it is loaded (acquire).
    slot: AtomicPtr<Slot<T>>,
    /// Shared as a `Mutex<T>` is.
    _value: std::marker::PhantomData<std::sync::Mutex<T>>,
}

/// One process's value.
struct Slot<T> {
    made_by: (u32, u64),
    value: std::sync::Mutex<T>,
}

impl<T: Default> PerProcess<T> {
    pub(crate) const fn new() -> Self {
        PerProcess { slot: AtomicPtr::new(std::ptr::null_mut()), _value: std::marker::PhantomData }
    }

    /// This process's value, locked (a lock poisoned by a panic is taken as it is). The
    /// parent's slot is left allocated (its size, once per fork); where its lock is free its
    /// value is dropped (descriptors in it close here, not in the parent), else left too.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        let made_by = (std::process::id(), forks());
        let slot = loop {
            let cur = self.slot.load(Ordering::Acquire);
            // SAFETY: a non-null pointer in `slot` is a box leaked below, never freed, whose
            // contents were written before it was published.
            let old = unsafe { cur.as_ref() };
            if let Some(slot) = old.filter(|s| s.made_by == made_by) {
                break slot;
            }
            let new = Box::into_raw(Box::new(Slot { made_by, value: std::sync::Mutex::new(T::default()) }));
            match self.slot.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if let Some(old) = old {
                        match old.value.try_lock() {
                            Ok(mut v) => *v = T::default(),
                            Err(std::sync::TryLockError::Poisoned(e)) => *e.into_inner() = T::default(),
                            Err(std::sync::TryLockError::WouldBlock) => {}
                        }
                    }
                    // SAFETY: `new` came from `Box::into_raw` just now and is never freed.
                    break unsafe { &*new };
                }
                // Another thread of this process published a slot first: ours was never shared.
                // SAFETY: `new` came from `Box::into_raw` above and nothing else has it.
                Err(_) => drop(unsafe { Box::from_raw(new) }),
            }
        };
        slot.value.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Forks this process's line went through since [`forks`] was first asked (counted in each
/// child by a `pthread_atfork` handler).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// The count of forks, with the handler that keeps it set up at the first call.
fn forks() -> u64 {
    extern "C" fn in_child() {
        // Ordering: the child has one thread at this point; nothing is published with it.
        FORKS.fetch_add(1, Ordering::Relaxed);
    }
    // Set by the first caller, which then registers the handler; the others go on without
    // waiting for it (a `Once` would make them wait, and a child forked while one waited would
    // wait for good). A fork in the microseconds before the registration returns is not
    // counted: that matters only to a child whose pid is its parent's (PID 1 forking into a new
    // pid namespace), which then takes its parent's slots for its own. Ordering: a flag,
    // nothing published with it.
    static HANDLER: AtomicBool = AtomicBool::new(false);
    if !HANDLER.swap(true, Ordering::Relaxed) {
        // SAFETY: registers a child handler that only increments an atomic (async-signal-safe,
        // as a handler run in a child of a multi-threaded process must be).
        let r = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if r != 0 {
            tracing::debug!(error = r, "no fork handler: a forked child is told by its pid only");
        }
    }
    // Ordering: see `in_child`.
    FORKS.load(Ordering::Relaxed)
}

/// A routing socket (`NETLINK_ROUTE`) in the groups that hear of IPv4 and IPv6 addresses
/// added and removed (`rtnetlink(7)`; no privilege needed).
struct AddrWatch(OwnedFd);

impl AddrWatch {
    fn open() -> io::Result<AddrWatch> {
        let fd = super::diag::netlink_socket(libc::SOCK_RAW, libc::NETLINK_ROUTE)?;
        // SAFETY: sockaddr_nl is plain data; all-zero is valid.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
        // SAFETY: `addr` is a valid sockaddr_nl of the size given.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        })?;
        Ok(AddrWatch(fd))
    }

    /// Whether anything was heard since the last look (taken, so the next look starts afresh).
    /// A socket whose queue overflowed (ENOBUFS: changes were lost) counts as changed.
    fn changed(&self) -> io::Result<bool> {
        let mut buf = [0u8; 4096];
        let mut changed = false;
        // Bounded: what is queued is taken, and a flood of changes is one change.
        for _ in 0..64 {
            match super::recv_no_control(self.0.as_fd(), &mut buf, 0) {
                Ok(_) => changed = true,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(changed),
                    Some(libc::ENOBUFS) => changed = true,
                    _ => return Err(e),
                },
            }
        }
        Ok(true)
    }
}

fn interface_addrs() -> io::Result<Vec<(IpAddr, u32)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`, freed below with freeifaddrs.
    cvt(unsafe { libc::getifaddrs(&mut head) })?;
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr whose family says how large it is.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push((IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))), 0));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                // getifaddrs gives a link-local address the index of its interface as its scope.
                let scope = if ip.is_unicast_link_local() { sin6.sin6_scope_id } else { 0 };
                out.push((IpAddr::V6(ip), scope));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Accepts one connection from a listening TCP socket without waiting (`WouldBlock` when none
/// is queued): non-blocking and close-on-exec, as tokio's own accept makes them.
pub(crate) fn accept_tcp(listener: BorrowedFd<'_>) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    use std::os::fd::FromRawFd;
    let mut storage = socket2::SockAddrStorage::zeroed();
    let mut len = storage.size_of();
    let fd = loop {
        // SAFETY: `storage` (viewed as the sockaddr it stands for, which it is large enough to
        // hold) and `len` describe a writable buffer for any address; the flags are constants.
        let r = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                storage.view_as::<libc::sockaddr>(),
                &mut len,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        match cvt(r) {
            Ok(fd) => break fd,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    // SAFETY: accept4 returned a new descriptor nothing else owns.
    let stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    // SAFETY: the kernel wrote a valid address of `len` bytes into `storage`.
    let addr = unsafe { socket2::SockAddr::new(storage, len) };
    let peer = addr.as_socket().ok_or_else(|| io::Error::other("accepted a connection without an inet address"))?;
    Ok((stream, peer))
}

/// What an application set on a client socket that a second socket to the same destination
/// must have too (a plain reconnection after an in-band handshake spoiled the first
/// connection): its bound address (not its port, which the first connection's TIME_WAIT
/// holds), device, TOS or traffic class, `TCP_NODELAY`, keepalive and linger. Buffer sizes are
/// not carried: reading one back cannot tell a size the application set from the kernel's
/// own, and setting one turns the kernel's autotuning off.
#[derive(Debug, Clone)]
pub(crate) struct ClientOptions {
    local: Option<SocketAddr>,
    device: Option<Vec<u8>>,
    tos: Option<u32>,
    tclass: Option<u32>,
    nodelay: bool,
    keepalive: bool,
    linger: Option<std::time::Duration>,
}

impl ClientOptions {
    /// The options of `s`, as far as they can be read.
    pub(crate) fn of(s: &socket2::Socket) -> ClientOptions {
        let local = s.local_addr().ok().and_then(|a| a.as_socket());
        let v6 = local.is_some_and(|a| a.is_ipv6());
        ClientOptions {
            local: local.filter(|a| !a.ip().is_unspecified()),
            device: s.device().ok().flatten(),
            tos: if v6 { None } else { s.tos_v4().ok() },
            tclass: if v6 { s.tclass_v6().ok() } else { None },
            nodelay: s.tcp_nodelay().unwrap_or(false),
            keepalive: s.keepalive().unwrap_or(false),
            linger: s.linger().ok().flatten(),
        }
    }

    /// A new TCP socket for `dst` with these options (bound to the same address, on a port the
    /// kernel picks, if the first one was bound to one).
    pub(crate) fn socket(&self, dst: SocketAddr) -> io::Result<socket2::Socket> {
        let s = socket2::Socket::new(socket2::Domain::for_address(dst), socket2::Type::STREAM, None)?;
        if let Some(d) = &self.device {
            s.bind_device(Some(d))?;
        }
        if let Some(t) = self.tos {
            s.set_tos_v4(t)?;
        }
        if let Some(t) = self.tclass {
            s.set_tclass_v6(t)?;
        }
        s.set_tcp_nodelay(self.nodelay)?;
        s.set_keepalive(self.keepalive)?;
        if self.linger.is_some() {
            s.set_linger(self.linger)?;
        }
        if let Some(local) = self.local {
            s.bind(&SocketAddr::new(local.ip(), 0).into())?;
        }
        s.set_nonblocking(true)?;
        Ok(s)
    }
}

/// Whether a listening socket has a connection waiting to be accepted, without taking it or
/// waiting (`poll(2)` with no timeout: a listener is readable while its queue is not empty).
/// Errors count as a connection waiting, so that the caller's `accept` meets them itself.
pub(crate) fn has_pending_connection(listener: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: one valid pollfd, for a descriptor the borrow keeps open; no timeout.
        match cvt(unsafe { libc::poll(&mut p, 1, 0) }) {
            Ok(n) => return n > 0,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

#[cfg(test)]
mod door_tests {
    use super::*;
    use std::os::fd::AsFd;

    /// An address is this host's from the moment it is assigned, and not once it is removed:
    /// no second of a stale list in between (a client connecting from an address just added
    /// was taken for another host's, and the listener handed its connection out as TCP without
    /// looking for its registration). Needs root, to add an address.
    #[test]
    fn an_address_is_local_from_the_moment_it_is_assigned() {
        let Some((_one, addr)) = address_test(0x5e7c) else { return };
        let ip = |op: &str| lo_address(op, addr);
        assert!(!is_local_addr(SocketAddr::new(IpAddr::V6(addr), 0)), "before it was assigned");
        ip("add");
        let added = is_local_addr(SocketAddr::new(IpAddr::V6(addr), 0));
        ip("del");
        let removed = is_local_addr(SocketAddr::new(IpAddr::V6(addr), 0));
        assert!(added, "an address just assigned was taken for another host's");
        assert!(!removed, "an address just removed was taken for this host's");
    }

    /// A link-local address is this host's only on the interface it is assigned to: the same
    /// address with another interface's scope may be another host's on that link. One with no
    /// scope (a socket bound to a device connects to it on that device's link) is this host's
    /// as it was before scopes were looked at: on any interface. Needs root, to add an address
    /// (to `lo`, interface 1).
    #[test]
    fn a_link_local_address_is_local_on_its_own_interface_only() {
        let Some((_one, unique)) = address_test(0x5e7e) else { return };
        // fe80::5e7e:<pid>:0:1, of this test alone.
        let u = unique.octets();
        let addr = Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, u[2], u[3], u[4], u[5], 0, 0, 0, 1]);
        let lo = 1; // the loopback interface's index, always 1 on Linux
        let at = |scope| is_local_addr(SocketAddr::V6(std::net::SocketAddrV6::new(addr, 0, 0, scope)));
        assert!(!at(lo), "before it was assigned");
        lo_address("add", addr);
        let (here, elsewhere, unscoped) = (at(lo), at(lo + 1000), at(0));
        lo_address("del", addr);
        assert!(here, "on its own interface it was taken for another host's");
        assert!(!elsewhere, "on another interface's link it was taken for this host's");
        assert!(unscoped, "without a scope it was taken for another host's");
    }

    /// The address tests one at a time: each reads what the one watch hears (and one moves the
    /// fork count).
    static ADDRESS_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// For a test that adds an address: the address tests' turn and an address of its own
    /// (`fd00:<tag>:<pid>::1`), or `None` (skipped) without root.
    fn address_test(tag: u16) -> Option<(std::sync::MutexGuard<'static, ()>, Ipv6Addr)> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: adding an address needs root");
            return None;
        }
        let turn = ADDRESS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        Some((turn, format!("fd00:{tag:x}:{:x}::1", std::process::id() & 0xffff).parse().unwrap()))
    }

    /// `ip -6 addr <op> <addr>/128 dev lo`.
    fn lo_address(op: &str, addr: Ipv6Addr) {
        let out = std::process::Command::new("ip")
            .args(["-6", "addr", op, &format!("{addr}/128"), "dev", "lo"])
            .output()
            .expect("ip");
        assert!(out.status.success(), "ip addr {op}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The fork handler counts a fork in the child, and only there. (The child only loads an
    /// atomic and exits: nothing in it may take a lock another thread of the test held.)
    #[test]
    fn a_fork_is_counted_in_the_child() {
        // The test that plays a fork moves the count too.
        let _one = ADDRESS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let before = forks();
        // SAFETY: the child runs only async-signal-safe code (an atomic load, `_exit`).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let counted = FORKS.load(Ordering::Relaxed) > before;
            // SAFETY: ends the child at once, running no handler of the parent's.
            unsafe { libc::_exit(if counted { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child did not count its fork: {status}"
        );
        assert_eq!(forks(), before, "the parent counted the fork");
    }

    /// A forked child whose parent had read the addresses hears of an address added after the
    /// fork although its parent takes the news off the watch's socket they share: it opens a
    /// watch of its own. A fork is simulated (forking a test process with other threads is not
    /// safe): the fork count moves as the handler moves it in a child, and a second descriptor
    /// of the same socket, read to the end first, plays the parent. Needs root, to add an
    /// address.
    #[test]
    fn a_forked_child_hears_of_addresses_on_a_watch_of_its_own() {
        let Some((_one, addr)) = address_test(0x5e7d) else { return };
        assert!(!is_local_addr(SocketAddr::new(IpAddr::V6(addr), 0)), "before it was assigned");
        let parent = {
            let c = ADDRS.lock();
            c.as_ref().expect("the addresses were read").watch.as_ref().expect("a watch").0.try_clone().unwrap()
        };
        FORKS.fetch_add(1, Ordering::Relaxed);
        lo_address("add", addr);
        // The parent reads the news first, to the end (until nothing more comes for 200 ms: the
        // kernel may tell of an IPv6 address twice, the second time a little later).
        let mut heard = 0;
        let mut buf = [0u8; 4096];
        loop {
            let mut p = libc::pollfd { fd: parent.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut p, 1, 200) } <= 0 {
                break;
            }
            // SAFETY: `buf` is valid for writes of its length.
            if unsafe { libc::recv(parent.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) } > 0 {
                heard += 1;
            }
        }
        let seen = is_local_addr(SocketAddr::new(IpAddr::V6(addr), 0));
        lo_address("del", addr);
        assert!(heard > 0, "the parent heard nothing of the address added");
        assert!(seen, "the child took an address added after the fork for another host's");
    }

    /// A forked child does not wait for the address list's lock when a thread of its parent
    /// held it at the fork: that thread does not exist in the child, and the lock would stay
    /// held for good. Simulated as the test above simulates a fork: another thread holds the
    /// lock, and the fork count moves as the handler moves it in a child.
    #[test]
    fn a_forked_child_does_not_wait_for_its_parents_address_lock() {
        let _one = ADDRESS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let not_here = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 0); // TEST-NET-1 (RFC 5737)
        assert!(!is_local_addr(not_here));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _lock = ADDRS.lock();
            held_tx.send(()).unwrap();
            // Until the test ends, whichever way.
            let _ = release_rx.recv();
        });
        held_rx.recv().unwrap();
        FORKS.fetch_add(1, Ordering::Relaxed);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || done_tx.send(is_local_addr(not_here)).unwrap());
        let answer = done_rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(release_tx);
        holder.join().unwrap();
        assert_eq!(answer, Ok(false), "the child waited for a lock its parent's thread held");
    }

    /// A forked child's per-process value starts from the default, and the parent's, whose lock
    /// is free, is dropped in the child (a fork simulated as above).
    #[test]
    fn a_forked_child_starts_from_the_default_and_drops_its_parents_value() {
        let _one = ADDRESS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        static VALUE: PerProcess<Option<std::sync::Arc<()>>> = PerProcess::new();
        let token = std::sync::Arc::new(());
        *VALUE.lock() = Some(token.clone());
        assert!(VALUE.lock().is_some(), "the parent's value is kept");
        FORKS.fetch_add(1, Ordering::Relaxed);
        assert!(VALUE.lock().is_none(), "the child found its parent's value");
        assert_eq!(std::sync::Arc::strong_count(&token), 1, "the parent's value was not dropped");
    }

    /// A client socket is bound to a port before it connects, and once connected the kernel
    /// names its owner and cookie by the four-tuple the server's accepted end sees, reversed
    /// (what a door checks a registration against), for a dual-stack view of it too.
    #[test]
    fn a_bound_client_socket_is_found_by_its_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        for dst in
            [l.local_addr().unwrap(), format!("[::ffff:127.0.0.1]:{}", l.local_addr().unwrap().port()).parse().unwrap()]
        {
            let (c, port) = bound_tcp_socket(dst).unwrap();
            assert_eq!(c.local_addr().unwrap().as_socket().unwrap().port(), port);
            c.connect(&dst.into())
                .or_else(|e| if e.raw_os_error() == Some(libc::EINPROGRESS) { Ok(()) } else { Err(e) })
                .unwrap();
            let (server_end, peer) = l.accept().unwrap();
            assert_eq!(peer.port(), port);
            let owner = crate::sys::TcpDiag::new(0).unwrap().owner(peer, server_end.local_addr().unwrap()).unwrap();
            assert_eq!(owner.map(|o| o.cookie), Some(crate::sys::socket_cookie(c.as_fd()).unwrap()));
        }
    }
}
