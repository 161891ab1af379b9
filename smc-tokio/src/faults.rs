//! Injected stalls at the handshake's decision points, for tests of the commit point (feature
//! `test-util`; without it every hook is an empty inline function). Stalls are keyed by the
//! listener's address, so tests running at once in one process do not disturb each other.

use std::net::SocketAddr;
#[cfg(feature = "test-util")]
use std::time::Duration;

/// A point in the handshake where a stall can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub, dead_code))]
pub enum Point {
    /// Client: once the connection is up, before its side of the handshake goes on (in-band:
    /// before the Proposal goes out; at the door: before it reads the server's answer).
    ClientBeforeHandshake,
    /// Client: after the Accept and its end of the link is set up, before the Confirm goes out.
    ClientBeforeConfirm,
    /// Server: after the Proposal, before it decides.
    ServerBeforeAccept,
    /// Server: after the Confirm, before it checks it and commits.
    ServerBeforeCommit,
    /// Server: after it committed, before its Commit goes out.
    ServerAfterCommit,
}

/// A stall asked for, and whether a handshake has reached it.
#[cfg(feature = "test-util")]
struct Stall {
    delay: Duration,
    reached: bool,
    /// Ends the handshakes held at it when the stall is cleared.
    release: std::sync::Arc<tokio::sync::Notify>,
}

#[cfg(feature = "test-util")]
fn table() -> &'static std::sync::Mutex<std::collections::HashMap<(SocketAddr, Point), Stall>> {
    static T: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<(SocketAddr, Point), Stall>>> =
        std::sync::OnceLock::new();
    T.get_or_init(Default::default)
}

/// Makes handshakes with the listener at `server` stall for `delay` at `point` (both roles in
/// this process).
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use smc_tokio::faults::{self, Point};
/// use smc_tokio::{SmcListener, SmcStream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// // The server sits on the Proposal for 100 ms, well inside the handshake timeout.
/// faults::inject(addr, Point::ServerBeforeAccept, Duration::from_millis(100));
/// let start = Instant::now();
/// let stream = SmcStream::connect(addr).await?;
/// assert!(start.elapsed() >= Duration::from_millis(100));
/// assert!(stream.transport().is_smc());
/// faults::clear(addr);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "test-util")]
pub fn inject(server: SocketAddr, point: Point, delay: Duration) {
    table()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((crate::sys::unmap(server), point), Stall { delay, reached: false, release: Default::default() });
}

/// Whether a handshake with the listener at `server` has reached the stall [`inject`]ed at
/// `point` (since it was injected), so that a test can act while the handshake is held there.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use smc_tokio::faults::{self, Point};
/// use smc_tokio::{SmcListener, SmcStream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// faults::inject(addr, Point::ServerBeforeAccept, Duration::from_millis(50));
/// assert!(!faults::reached(addr, Point::ServerBeforeAccept));
/// let _stream = SmcStream::connect(addr).await?;
/// assert!(faults::reached(addr, Point::ServerBeforeAccept));
/// faults::clear(addr);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "test-util")]
pub fn reached(server: SocketAddr, point: Point) -> bool {
    let t = table().lock().unwrap_or_else(|e| e.into_inner());
    t.get(&(crate::sys::unmap(server), point)).is_some_and(|s| s.reached)
}

/// Removes every stall for `server`, and ends those that handshakes are held at now: they go on
/// at once. A test can thus hold handshakes for as long as it needs (a stall longer than its
/// steps could take), and let them go when it is done.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use smc_tokio::faults::{self, Point};
/// use smc_tokio::{SmcListener, SmcStream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// // A stall far past any handshake deadline, removed before anyone connects.
/// faults::inject(addr, Point::ServerBeforeAccept, Duration::from_secs(60));
/// faults::clear(addr);
/// let stream = SmcStream::connect(addr).await?;
/// assert!(stream.transport().is_smc());
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "test-util")]
pub fn clear(server: SocketAddr) {
    let server = crate::sys::unmap(server);
    let mut released = Vec::new();
    table().lock().unwrap_or_else(|e| e.into_inner()).retain(|(a, _), s| {
        if *a == server {
            released.push(s.release.clone());
        }
        *a != server
    });
    for r in released {
        r.notify_waiters();
    }
}

/// Stalls here if a test asked for it.
#[cfg(feature = "test-util")]
pub(crate) async fn stall(server: SocketAddr, point: Point) {
    let key = (crate::sys::unmap(server), point);
    let found = {
        let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
        t.get_mut(&key).map(|s| {
            s.reached = true;
            (s.delay, s.release.clone())
        })
    };
    let Some((d, release)) = found else { return };
    // Registered before the second look, so that a `clear` after that look wakes it, and one
    // before it is seen there.
    let released = release.notified();
    let mut released = std::pin::pin!(released);
    released.as_mut().enable();
    let cleared = !table()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .is_some_and(|s| std::sync::Arc::ptr_eq(&s.release, &release));
    if cleared {
        return;
    }
    tracing::debug!(?point, ?d, "injected stall");
    let _ = tokio::time::timeout(d, released).await;
}

#[cfg(not(feature = "test-util"))]
#[inline(always)]
pub(crate) async fn stall(_server: SocketAddr, _point: Point) {}

/// Hands `fd` to the crate's descriptor closers as a descriptor from another process that is
/// closed as it is, not defused first (its linger stays), as a file on a FUSE mount would be:
/// if its close blocks (a TCP socket with `SO_LINGER` and unsent data towards a peer that does
/// not read), it holds a closer that long. For tests of what the process does while every
/// closer is stuck (`Stats::closer`).
///
/// # Examples
///
/// ```
/// use std::os::fd::OwnedFd;
///
/// let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
/// smc_tokio::faults::close_on_a_closer_as_is(OwnedFd::from(ours));
/// // The closer closes it: the other end reads the end.
/// let mut buf = [0u8; 1];
/// assert_eq!(std::io::Read::read(&mut &theirs, &mut buf)?, 0);
/// # Ok::<(), std::io::Error>(())
/// ```
#[cfg(feature = "test-util")]
pub fn close_on_a_closer_as_is(fd: std::os::fd::OwnedFd) {
    drop(crate::sys::PeerFd::as_is(fd));
}

/// Receives one message from `sock`, and the descriptors it carries, as the crate's reads of
/// door connections, side channels and doorbells do: the message's length and how many
/// descriptors came with it (closed off this thread, by a closer). A message whose
/// descriptors cannot all be installed (no descriptor free) is an `OutOfMemory` error and is
/// left queued. For tests of a peer's descriptors against a full descriptor table.
///
/// # Examples
///
/// ```
/// use std::os::fd::{AsFd, AsRawFd};
///
/// let (ours, theirs) = std::os::unix::net::UnixDatagram::pair()?;
/// theirs.send(b"ring")?;
/// let mut buf = [0u8; 16];
/// assert_eq!(smc_tokio::faults::receive_as_the_crate_does(ours.as_fd(), &mut buf)?, (4, 0));
/// # Ok::<(), std::io::Error>(())
/// ```
#[cfg(feature = "test-util")]
pub fn receive_as_the_crate_does(sock: std::os::fd::BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<(usize, usize)> {
    crate::sys::recv_with_fds(sock, buf).map(|(n, fds)| (n, fds.len()))
}

/// A TCP socket whose last close blocks for `linger`, or until the returned peer is dropped
/// (which resets the connection): `SO_LINGER` set and unsent data towards a peer that never
/// reads. What a file on a FUSE mount whose daemon does not answer is to a descriptor closer,
/// for tests of the closers ([`close_on_a_closer_as_is`]).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// let (sock, peer) = smc_tokio::faults::socket_whose_close_blocks(Duration::from_secs(60))?;
/// // The peer's reset ends the linger: the close returns at once.
/// drop(peer);
/// drop(sock);
/// # Ok::<(), std::io::Error>(())
/// ```
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub fn socket_whose_close_blocks(
    linger: std::time::Duration,
) -> std::io::Result<(std::os::fd::OwnedFd, std::net::TcpStream)> {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.set_send_buffer_size(4096)?;
    s.connect(&tcp.local_addr()?.into())?;
    let (peer, _) = tcp.accept()?;
    socket2::SockRef::from(&peer).set_recv_buffer_size(4096)?;
    s.set_nonblocking(true)?;
    let chunk = [0u8; 65536];
    while s.send(&chunk).is_ok() {}
    s.set_linger(Some(linger))?;
    Ok((s.into(), peer))
}

/// Makes doors bound from now on take descriptors on their connections, as on a kernel before
/// Linux 6.16 (no `SO_PASSRIGHTS`), where door connections go to the descriptor closers
/// (`false`: they refuse them where the kernel can). For tests of that path on newer kernels.
///
/// # Examples
///
/// ```
/// smc_tokio::faults::doors_take_descriptors_as_before_6_16(true);
/// // ... listeners bound here have doors as on an older kernel ...
/// smc_tokio::faults::doors_take_descriptors_as_before_6_16(false);
/// ```
#[cfg(feature = "test-util")]
pub fn doors_take_descriptors_as_before_6_16(on: bool) {
    DOORS_TAKE_DESCRIPTORS.store(on, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(feature = "test-util")]
static DOORS_TAKE_DESCRIPTORS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether new doors take descriptors (see [`doors_take_descriptors_as_before_6_16`]).
#[cfg(feature = "test-util")]
pub(crate) fn doors_take_descriptors() -> bool {
    // Ordering: a test switch read when a door is bound, no data hangs on it.
    DOORS_TAKE_DESCRIPTORS.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(not(feature = "test-util"))]
#[inline(always)]
pub(crate) fn doors_take_descriptors() -> bool {
    false
}

/// Makes RDMA links created from now on send their CDC frames from registered buffers instead
/// of inline, as on a device that grants no inline data (`false`: as the device allows). For
/// the soft-RoCE test bed, whose device always grants it.
///
/// # Examples
///
/// ```
/// // RDMA links set up from here on send their CDC frames from registered buffers...
/// smc_tokio::faults::rdma_without_inline_sends(true);
/// // ... and from here on, inline again where the device allows it.
/// smc_tokio::faults::rdma_without_inline_sends(false);
/// ```
#[cfg(all(feature = "test-util", feature = "rdma"))]
pub fn rdma_without_inline_sends(on: bool) {
    crate::link::verbs::force_no_inline(on);
}

/// How many blocking RDMA setup calls (creating verbs objects, registering memory, scanning GID
/// tables) ran on a runtime thread instead of a blocking one since the process started: 0 is
/// right. The link logs each at warn.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
/// let _stream = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
/// // Looking for RDMA devices (or finding none) happened off the runtime's threads.
/// assert_eq!(smc_tokio::faults::rdma_setup_calls_on_runtime(), 0);
/// # Ok(())
/// # }
/// ```
#[cfg(all(feature = "test-util", feature = "rdma"))]
pub fn rdma_setup_calls_on_runtime() -> u64 {
    crate::link::verbs::device::setup_calls_on_runtime()
}

/// Holds the process's RDMA setup thread, as a queue of slow link setups would, until the
/// returned guard is dropped: every RDMA setup step queued meanwhile (device look-ups, link
/// and memory setup, for handshakes of both roles) waits behind it.
///
/// # Examples
///
/// ```
/// let held = smc_tokio::faults::hold_rdma_setup();
/// // ... handshakes that name RDMA wait for the setup thread here, at most their bound ...
/// drop(held);
/// ```
#[cfg(all(feature = "test-util", feature = "rdma"))]
pub fn hold_rdma_setup() -> RdmaSetupHold {
    RdmaSetupHold(crate::link::verbs::device::hold_setup_thread())
}

/// What [`hold_rdma_setup`] returns: the setup thread goes on when this is dropped.
#[cfg(all(feature = "test-util", feature = "rdma"))]
#[derive(Debug)]
pub struct RdmaSetupHold(#[allow(dead_code)] std::sync::mpsc::Sender<()>);

/// How many times readers of connections in `ctx` started to spin for frames inside their poll
/// (busy polling): a reader spins only while it awaits a reply (it wrote since a read last
/// returned bytes), one reader of a link group at a time.
///
/// # Examples
///
/// ```
/// // No busy polling, no spins.
/// assert_eq!(smc_tokio::faults::reader_spins(&smc_tokio::Context::new()), 0);
/// ```
#[cfg(feature = "test-util")]
pub fn reader_spins(ctx: &crate::Context) -> u64 {
    ctx.counters().reader_spins()
}

#[cfg(feature = "test-util")]
fn partial_waits() -> &'static std::sync::Mutex<std::collections::HashMap<SocketAddr, Duration>> {
    static T: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<SocketAddr, Duration>>> =
        std::sync::OnceLock::new();
    T.get_or_init(Default::default)
}

/// Makes plain clients accepted from now on by the listener at `server` wait `wait` for the
/// rest of bytes that start like a handshake message, as clients on other hosts do (50 ms;
/// clients on this host never wait), so that the wait can be tested on one host; `None` puts
/// the rule back. `server` is matched against each accepted connection's local address: for
/// a listener bound to an unspecified address (`0.0.0.0`), name the address clients connect
/// to.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
/// smc_tokio::faults::set_partial_wait(listener.local_addr()?, Some(Duration::from_millis(50)));
/// // ... plain clients of `listener` that send a lone 0xE2 byte now wait 50 ms ...
/// smc_tokio::faults::set_partial_wait(listener.local_addr()?, None);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "test-util")]
pub fn set_partial_wait(server: SocketAddr, wait: Option<Duration>) {
    let mut t = partial_waits().lock().unwrap_or_else(|e| e.into_inner());
    match wait {
        Some(w) => t.insert(server, w),
        None => t.remove(&server),
    };
}

/// The wait [`set_partial_wait`] set for the listener at `server`.
#[cfg(feature = "test-util")]
pub(crate) fn partial_wait(server: SocketAddr) -> Option<Duration> {
    partial_waits().lock().unwrap_or_else(|e| e.into_inner()).get(&server).copied()
}

#[cfg(not(feature = "test-util"))]
#[inline]
pub(crate) fn partial_wait(_server: SocketAddr) -> Option<std::time::Duration> {
    None
}

/// Raises this process's soft limit on open descriptors towards its hard limit (to at most
/// 65 536), once: for test processes that open many sockets at once (a login shell often gives
/// 1 024). The peers a test starts inherit it.
#[cfg(feature = "test-util")]
pub fn raise_fd_limit() {
    crate::sys::raise_fd_limit();
}
