use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tracing::Instrument;

use crate::config::{Overrides, Policy, Settings, ShmConfig};
use crate::context::Context as SmcContext;
use crate::door::Door;
use crate::listen::{self, Handoff, ListenerShared, Waiter};
use crate::net::stream::SmcStream;
use crate::sys;

pub use crate::listen::LISTEN_BACKLOG;

/// A socket for a listener on `addr`: the kernel's `AF_SMC` one when `cfg` wants it and the
/// kernel has it (with `SMC_LIMIT_HS` as `cfg.limit_handshake`: the kernel reads it in
/// `listen`), else TCP.
fn bind_tcp(ctx: &SmcContext, addr: SocketAddr, cfg: &Settings) -> io::Result<tokio::net::TcpSocket> {
    let sock = match crate::kernel::socket(ctx.counters(), cfg.kernel, addr) {
        // An AF_SMC socket takes the TCP socket calls (bind, listen, options) and passes them
        // to its TCP socket; tokio only needs a stream socket's descriptor.
        Some(s) => {
            if let Err(e) = crate::kernel::set_socket_limit_handshake(s.as_fd(), cfg.limit_handshake) {
                tracing::debug!(error = %e, "SMC_LIMIT_HS");
            }
            tokio::net::TcpSocket::from_std_stream(s.into())
        }
        None if addr.is_ipv4() => tokio::net::TcpSocket::new_v4()?,
        None => tokio::net::TcpSocket::new_v6()?,
    };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    Ok(sock)
}

/// A TCP listener whose connections move to shared memory or RDMA when the client speaks SMC,
/// and stay plain TCP, with every byte intact, when it does not.
///
/// A listener has a task of its own that takes connections from the kernel and runs SMC
/// handshakes, whether or not [`accept`](SmcListener::accept) is being called, as the kernel
/// runs its listen work; `accept` returns connections as they are ready, in that order.
///
/// Same-host clients announce SMC out of band, at the listener's door, before they connect; so
/// every other connection is known to be plain at once and is handed out with no peek and no
/// timer: a server that speaks first (SMTP, MySQL) greets plain clients without delay. Only
/// a listener that can do SMC-R (feature `rdma`, with a device) waits, for clients on other
/// hosts, up to the [peek timeout](SmcListenerBuilder::peek_timeout) for an in-band proposal,
/// for as many such clients at once as its ready queue holds (1024 at least, 4096 at most;
/// others are handed out at once). A proposal that arrives after a connection was handed out
/// is answered with a decline and never reaches the application.
///
/// Dropping the listener stops its task and closes its descriptor of the listening socket at
/// once (or as soon as a turn of its task already running on another worker ends), as
/// dropping a `TcpListener` does: a socket it held alone stops listening (new
/// connections are refused), and one that has other holders (a socket activation manager's,
/// pre-forked workers') goes on listening for them. Handshakes in progress are declined (their
/// clients continue over TCP and read the end of the connection, as TCP clients of a closed
/// listener do).
///
/// The listener's task runs on the runtime it was made on. If that runtime shuts down while
/// the listener lives (or the task panics: a runtime without timers), `accept` fails from then
/// on, as tokio's does after its runtime shut down, and same-host clients get TCP.
///
/// # Examples
///
/// ```
/// use smc_tokio::SmcListener;
/// use tokio::io::AsyncWriteExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
///
/// // Any plain TCP client is served.
/// let client = tokio::spawn(async move {
///     let mut c = tokio::net::TcpStream::connect(addr).await?;
///     c.write_all(b"plain hello").await
/// });
/// let (stream, peer) = listener.accept().await?;
/// println!("{peer} connected over {}", stream.transport());
/// assert!(!stream.transport().is_smc());
/// # client.await.unwrap()?;
/// # Ok(())
/// # }
/// ```
pub struct SmcListener {
    shared: Arc<ListenerShared>,
    /// The listening socket: held here alone (the task upgrades its weak reference for a turn
    /// at a time), so that it closes when the listener is dropped.
    tcp: Arc<TcpListener>,
    task: tokio::task::AbortHandle,
}

impl std::os::fd::AsFd for SmcListener {
    /// The listening TCP socket, for socket options. Accepting on it directly takes
    /// connections from under the listener (their clients' SMC handshakes then time out to
    /// TCP).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // Any option may be set through it, SO_LINGER too, which accepted sockets inherit.
        self.shared.default_linger.store(false, Ordering::Relaxed);
        self.tcp.as_fd()
    }
}

impl std::os::fd::AsRawFd for SmcListener {
    /// The listening TCP socket; see [`AsFd`](#impl-AsFd-for-SmcListener).
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsFd::as_fd(self).as_raw_fd()
    }
}

impl fmt::Debug for SmcListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmcListener")
            .field("local", &self.tcp.local_addr().ok())
            .field("door", &self.shared.door)
            .field("settings", &self.shared.settings())
            .finish()
    }
}

impl SmcListener {
    /// Test hook: the listener's door.
    #[cfg(test)]
    pub(crate) fn door_for_test(&self) -> Option<&Door> {
        self.shared.door.as_ref()
    }
}

impl Drop for SmcListener {
    fn drop(&mut self) {
        // Closed before the task is aborted: the task's end, which may run on another worker
        // at once, then finds the listener closed, not orphaned. The socket closes with `tcp`
        // right after (a turn of the task in progress holds it until the turn ends).
        self.shared.close();
        self.task.abort();
    }
}

/// The future of [`SmcListener::accept`].
struct Accept<'a> {
    listener: &'a SmcListener,
    waiter: Waiter,
}

impl Future for Accept<'_> {
    type Output = io::Result<(SmcStream, SocketAddr)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        this.listener.poll_next(cx, &mut this.waiter)
    }
}

impl Drop for Accept<'_> {
    fn drop(&mut self) {
        if let Waiter::Future(id) = self.waiter {
            self.listener.shared.ready.forget(id);
        }
    }
}

/// Settings for an [`SmcListener`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use smc_tokio::{Policy, SmcListener};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::builder()
///     .policy(Policy::Auto)
///     .peek_timeout(Duration::from_millis(50))
///     .handshake_timeout(Duration::from_secs(1))
///     .bind("127.0.0.1:0")
///     .await?;
/// # drop(listener);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SmcListenerBuilder {
    o: Overrides,
    ctx: SmcContext,
}

impl Default for SmcListenerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl SmcListenerBuilder {
    /// A builder that sets nothing: the listener takes its context's settings (the
    /// `SMC_TOKIO_*` environment and their run-time updates; without those, [`Policy::Auto`],
    /// [`DEFAULT_PEEK_TIMEOUT`](crate::config::DEFAULT_PEEK_TIMEOUT),
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`](crate::config::DEFAULT_HANDSHAKE_TIMEOUT) and the other
    /// defaults) for every field it does not set.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{config, SmcListenerBuilder, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // Nothing set: the process-wide settings (the defaults, unless `SMC_TOKIO_*` says otherwise).
    /// let listener = SmcListenerBuilder::new().bind("127.0.0.1:0").await?;
    /// assert_eq!(listener.settings(), config::global().get());
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// assert!(stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        Self { o: Overrides::default(), ctx: SmcContext::global().clone() }
    }

    /// The context the listener belongs to: its link groups, the settings this builder's
    /// values override, its counters. Without it, [`Context::global`](crate::Context::global).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{config::Settings, Context, SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let mut settings = Settings::default();
    /// settings.max_pending_handshakes = 8;
    /// let ctx = Context::with_settings(settings);
    /// let listener = SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await?;
    /// assert_eq!(listener.settings().max_pending_handshakes, 8);
    /// assert!(listener.context().ptr_eq(&ctx));
    /// # Ok(())
    /// # }
    /// ```
    pub fn context(mut self, ctx: &SmcContext) -> Self {
        self.ctx = ctx.clone();
        self
    }

    /// Shared-memory (SMC-D) settings for connections accepted by this listener.
    ///
    /// Only the fields `config`'s setters set override: every other field keeps its
    /// process-wide value (the `SMC_TOKIO_*` variables, or [`config::global`](crate::config::global)'s update), so
    /// `ShmConfig::default().rmb_size(64 << 10)` leaves `SMC_TOKIO_SHM=0` in force.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::ShmConfig;
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // Receive rings of 64 KiB on the server side of this listener's connections.
    /// let shm = ShmConfig::default().rmb_size(64 << 10);
    /// let listener = SmcListener::builder().shm(shm).bind("127.0.0.1:0").await?;
    /// assert_eq!(listener.settings().shm.get_rmb_size(), 64 << 10);
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// assert!(stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn shm(mut self, config: ShmConfig) -> Self {
        self.o.shm = Some(config);
        self
    }

    /// RDMA (SMC-R) settings for connections accepted by this listener (with the `rdma` feature).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::RdmaConfig;
    /// use smc_tokio::{SmcListener, SmcStream, Transport};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // No SMC-R: clients on this host still get shared memory.
    /// let no_rdma = RdmaConfig::default().enabled(false);
    /// let listener = SmcListener::builder().rdma(no_rdma).bind("127.0.0.1:0").await?;
    /// assert!(!listener.settings().rdma.is_enabled());
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// assert_eq!(stream.transport(), Transport::SmcD);
    /// # Ok(())
    /// # }
    /// ```
    pub fn rdma(mut self, config: crate::config::RdmaConfig) -> Self {
        self.o.rdma = Some(config);
        self
    }

    /// What to do with connections that cannot use SMC. Under [`Policy::Never`] they are closed
    /// instead of handed out; under [`Policy::TcpOnly`] the listener opens no door and every
    /// in-band proposal is declined.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, Policy, SmcListener, SmcStream, Transport};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // A listener that never does SMC opens no door: clients on this host connect as plain TCP.
    /// let listener = SmcListener::builder().policy(Policy::TcpOnly).bind("127.0.0.1:0").await?;
    /// assert_eq!(listener.door_name(), None);
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// assert_eq!(stream.transport(), Transport::Tcp(FallbackReason::NotProposed));
    /// # Ok(())
    /// # }
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.o.policy = Some(policy);
        self
    }

    /// How long a listener that can do SMC-R waits for the first bytes of a client on another
    /// host before handing it out as TCP (see
    /// [`DEFAULT_PEEK_TIMEOUT`](crate::config::DEFAULT_PEEK_TIMEOUT)), for as many such
    /// clients at once as its ready queue holds (1024 at least, 4096 at most; others are handed
    /// out at once). Same-host clients and listeners without RDMA never wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::SmcListener;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::builder().peek_timeout(Duration::from_secs(30)).bind("127.0.0.1:0").await?;
    /// assert_eq!(listener.settings().peek_timeout, Duration::from_secs(30));
    /// // A plain client on this host is handed out at once, not after the timeout.
    /// let _plain = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
    /// let accepted = tokio::time::timeout(Duration::from_secs(5), listener.accept()).await;
    /// let (stream, _) = accepted.expect("not held back for the peek timeout")?;
    /// assert!(!stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn peek_timeout(mut self, timeout: Duration) -> Self {
        self.o.peek_timeout = Some(timeout);
        self
    }

    /// Bound on each step of a handshake (each wait for the client, each decision of ours),
    /// taken within [`MIN_HANDSHAKE_TIMEOUT`](crate::config::MIN_HANDSHAKE_TIMEOUT) and
    /// [`MAX_TIMEOUT`](crate::config::MAX_TIMEOUT).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let timeout = Duration::from_millis(500);
    /// let listener = SmcListener::builder().handshake_timeout(timeout).bind("127.0.0.1:0").await?;
    /// assert_eq!(listener.settings().handshake_timeout, timeout);
    /// // On one host a handshake takes far less.
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// assert!(stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.o.handshake_timeout = Some(timeout);
        self
    }

    /// Handshakes this listener runs at once. Clients on other hosts, which propose in-band,
    /// take at most three quarters of them together and one client host (an IPv4 address, an
    /// IPv6 /64) half: one host that opened connections and never finished their handshakes
    /// took every slot, the door's same-host clients' too. A handshake past its host's share
    /// is declined as congested and its connection handed out as TCP at once, whatever
    /// [`limit_handshake`](Self::limit_handshake) says (it never waits in the queue). A share
    /// is at least one.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcListener;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::builder().max_pending_handshakes(64).bind("127.0.0.1:0").await?;
    /// assert_eq!(listener.settings().max_pending_handshakes, 64);
    /// // At least one: 0 means 1.
    /// let one = SmcListener::builder().max_pending_handshakes(0).bind("127.0.0.1:0").await?;
    /// assert_eq!(one.settings().max_pending_handshakes, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_pending_handshakes(mut self, n: usize) -> Self {
        self.o.max_pending_handshakes = Some(n);
        self
    }

    /// With `true` (the default), a connection that arrives when `max_pending_handshakes` are
    /// running is declined as congested and handed out as TCP at once; with `false` it waits
    /// for a slot, in a queue as long as `max_pending_handshakes`, and is declined as
    /// congested and handed out as TCP when that queue is full too. (A handshake past its client
    /// host's share of the slots is declined at once either way: see
    /// [`max_pending_handshakes`](Self::max_pending_handshakes).)
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcListener;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // Under load, queue connections for a handshake slot instead of serving them as TCP.
    /// let listener = SmcListener::builder()
    ///     .max_pending_handshakes(16)
    ///     .limit_handshake(false)
    ///     .bind("127.0.0.1:0")
    ///     .await?;
    /// assert!(!listener.settings().limit_handshake);
    /// # Ok(())
    /// # }
    /// ```
    pub fn limit_handshake(mut self, on: bool) -> Self {
        self.o.limit_handshake = Some(on);
        self
    }

    /// Whether [`bind`](SmcListenerBuilder::bind) listens on the kernel's `AF_SMC` socket, so
    /// that kernel-SMC clients get the kernel's SMC-R or SMC-D (see [`kernel`](crate::kernel)).
    /// Plain TCP clients and smc-tokio clients are served on the same listener as before: the
    /// kernel falls back to TCP for them, and this crate's establishment proceeds on top.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::kernel::KernelMode;
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // On a kernel without AF_SMC this is a plain TCP listener, and the stats say why.
    /// let listener = SmcListener::builder().kernel(KernelMode::On).bind("127.0.0.1:0").await?;
    /// let client = SmcStream::connect(listener.local_addr()?).await?;
    /// assert!(client.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn kernel(mut self, mode: crate::kernel::KernelMode) -> Self {
        self.o.kernel = Some(mode);
        self
    }

    /// Binds a new listener to `addr` (each address it resolves to in turn, as
    /// [`TcpListener::bind`] does), with `SO_REUSEADDR` and a backlog of [`LISTEN_BACKLOG`].
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcListener;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::builder().bind("127.0.0.1:0").await?;
    /// assert_ne!(listener.local_addr()?.port(), 0); // the kernel picked a port
    /// assert!(socket2::SockRef::from(&listener).reuse_address()?);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn bind<A: ToSocketAddrs>(self, addr: A) -> io::Result<SmcListener> {
        let mut last = None;
        let cfg = self.o.resolve(self.ctx.settings());
        for a in tokio::net::lookup_host(addr).await? {
            let sock = match bind_tcp(&self.ctx, a, &cfg) {
                Ok(s) => s,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            // The door opens before the port listens: no client can connect while the
            // listener has no door yet (it would go plain, finding none).
            let door =
                open_door(&self.ctx, &self.o, (sock.local_addr(), sock.as_fd()), sock.reuseport().unwrap_or(false));
            // A port another socket bound with SO_REUSEADDR began to listen on since our bind
            // fails here: the next address is tried, as for a failed bind (the door closes).
            let tcp = match sock.listen(LISTEN_BACKLOG) {
                Ok(l) => l,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            let listener = SmcListener::start_with(self.ctx, tcp, self.o, door, LISTEN_BACKLOG as usize);
            // Our socket: SO_LINGER off until the application reaches the descriptor.
            listener.shared.default_linger.store(true, Ordering::Relaxed);
            return Ok(listener);
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "could not resolve to any address")))
    }

    /// Listens on `socket` (made, set up and bound by the application) with these settings and
    /// a backlog of `backlog`, as [`TcpSocket::listen`](tokio::net::TcpSocket::listen) does. The
    /// door opens before the socket listens. Must be called inside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcSocket};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_reuseport(true)?;
    /// socket.bind("127.0.0.1:0".parse().unwrap())?;
    /// let listener = SmcListener::builder().max_pending_handshakes(64).listen_socket(socket, 256)?;
    /// # drop(listener);
    /// # Ok(())
    /// # }
    /// ```
    pub fn listen_socket(self, socket: crate::SmcSocket, backlog: u32) -> io::Result<SmcListener> {
        let sock = socket.into_tokio();
        if sock.local_addr().map_or(true, |a| a.port() == 0) {
            // Not bound: listen picks the port, so nobody can connect before it is known, and
            // the door opens after.
            return Ok(SmcListener::start(self.ctx, sock.listen(backlog)?, self.o, backlog as usize));
        }
        let reuseport = sock.reuseport().unwrap_or(false);
        let door = open_door(&self.ctx, &self.o, (sock.local_addr(), sock.as_fd()), reuseport);
        Ok(SmcListener::start_with(self.ctx, sock.listen(backlog)?, self.o, door, backlog as usize))
    }

    /// Wraps an already bound tokio listener. Must be called inside a tokio runtime: the
    /// listener's task (which accepts and runs handshakes) starts on it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let listener = SmcListener::builder().handshake_timeout(Duration::from_secs(1)).from_tcp(tcp);
    /// // The wrapped listener has a door: clients on this host that come now get SMC.
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// assert!(stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_tcp(self, tcp: TcpListener) -> SmcListener {
        SmcListener::start(self.ctx, tcp, self.o, listen::READY_CAP)
    }

    /// Wraps an already bound std listener, as [`TcpListener::from_std`] does (the listener
    /// should be in non-blocking mode). Must be called inside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// std_listener.set_nonblocking(true)?;
    /// let listener = SmcListener::builder().max_pending_handshakes(32).from_std(std_listener)?;
    /// assert_eq!(listener.settings().max_pending_handshakes, 32);
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// assert!(stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_std(self, listener: std::net::TcpListener) -> io::Result<SmcListener> {
        Ok(self.from_tcp(TcpListener::from_std(listener)?))
    }
}

/// The door of a listener on `local` (none under [`Policy::TcpOnly`] at bind, or when it
/// cannot open). The door reads the uids it trusts from `settings` whenever it takes knocks,
/// so a run-time change of the allowed uids reaches it. The listener's socket tells the device
/// it is bound to, which the door's look-ups of its connections name, and, on IPv6, whether it
/// receives IPv4 connections too.
fn open_door(
    ctx: &SmcContext,
    settings: &Overrides,
    (local, sock): (io::Result<SocketAddr>, std::os::fd::BorrowedFd<'_>),
    reuseport: bool,
) -> Option<Door> {
    match (settings.resolve(ctx.settings()).policy, local) {
        (Policy::TcpOnly, _) => None,
        (_, Ok(local)) => {
            let at = (local, crate::sys::bound_device(sock), crate::sys::v6_only(sock));
            Door::open(ctx.settings_handle().clone(), ctx.counters().clone(), at, settings.clone(), reuseport)
        }
        (_, Err(e)) => {
            tracing::warn!(error = %e, "listener without a local address: serving tcp only");
            None
        }
    }
}

impl SmcListener {
    /// Binds a listener to `addr` with its context's settings (the `SMC_TOKIO_*` environment and
    /// their run-time updates, else the defaults).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// // Both ends are smc-tokio on one host: the bytes go through shared memory.
    /// assert!(server.transport().is_smc());
    /// client.write_all(b"hi").await?;
    /// let mut buf = [0u8; 2];
    /// server.read_exact(&mut buf).await?;
    /// assert_eq!(&buf, b"hi");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<SmcListener> {
        SmcListenerBuilder::new().bind(addr).await
    }

    /// A builder for listeners with non-default settings.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::SmcListener;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::builder()
    ///     .max_pending_handshakes(16)
    ///     .handshake_timeout(Duration::from_secs(1))
    ///     .bind("127.0.0.1:0")
    ///     .await?;
    /// assert_eq!(listener.settings().max_pending_handshakes, 16);
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder() -> SmcListenerBuilder {
        SmcListenerBuilder::new()
    }

    /// Wraps an already bound std listener with the default settings.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// std_listener.set_nonblocking(true)?;
    /// let addr = std_listener.local_addr()?;
    /// let listener = SmcListener::from_std(std_listener)?;
    /// assert_eq!(listener.local_addr()?, addr);
    /// let stream = SmcStream::connect(addr).await?;
    /// assert!(stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_std(listener: std::net::TcpListener) -> io::Result<SmcListener> {
        SmcListenerBuilder::new().from_std(listener)
    }

    /// Wraps a listening socket (one that already listened, so clients that connected before
    /// its door opened went plain).
    /// `ready_cap`: finished connections held for `accept` (the backlog).
    fn start(ctx: SmcContext, tcp: TcpListener, overrides: Overrides, ready_cap: usize) -> SmcListener {
        let reuseport = socket2::SockRef::from(&tcp).reuse_port().unwrap_or(true);
        let door = open_door(&ctx, &overrides, (tcp.local_addr(), tcp.as_fd()), reuseport);
        SmcListener::start_with(ctx, tcp, overrides, door, ready_cap)
    }

    fn start_with(
        ctx: SmcContext,
        tcp: TcpListener,
        overrides: Overrides,
        door: Option<Door>,
        ready_cap: usize,
    ) -> SmcListener {
        #[cfg(feature = "rdma")]
        let cfg = overrides.resolve(ctx.settings());
        let kernel = crate::kernel::is_smc_socket(tcp.as_fd());
        let shared = Arc::new(ListenerShared::new(ctx, &tcp, door, kernel, overrides, ready_cap));
        let tcp = Arc::new(tcp);
        // Open the RDMA devices and look the listening address up now, off the runtime, so
        // the first connections can use them.
        #[cfg(feature = "rdma")]
        if cfg.rdma.enabled {
            let local = tcp.local_addr().ok().map(|a| a.ip()).filter(|ip| !ip.is_unspecified());
            tokio::spawn(async move {
                crate::smc::rdma::warm_up(&cfg, crate::smc::rdma::setup_deadline(&cfg)).await;
                if let Some(ip) = local {
                    crate::smc::rdma::warm_port(ip, &cfg, crate::smc::rdma::setup_deadline(&cfg)).await;
                }
            });
        }
        let span = tracing::debug_span!("smc_listener", local = ?tcp.local_addr().ok(), kernel);
        let task = tokio::spawn(listen::run(shared.clone(), Arc::downgrade(&tcp)).instrument(span)).abort_handle();
        SmcListener { shared, tcp, task }
    }

    /// The local address the listener is bound to.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// assert!(listener.local_addr()?.ip().is_loopback());
    /// # Ok(())
    /// # }
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Turns the listener into a std one, as [`TcpListener::into_std`] does (the result is in
    /// non-blocking mode). The listener's door closes, so clients stop proposing SMC to it.
    ///
    /// Unlike tokio's listener, ours takes connections from the kernel before `accept` asks
    /// for them (to run their handshakes): connections it had taken but not handed out (SMC
    /// handshakes still running, or finished and waiting for `accept`) are reset. Call it
    /// before clients connect, or accept what is there first. The std listener holds a
    /// duplicate of the socket's descriptor (the listener's task may still hold the first as it
    /// ends): a descriptor number saved from [`as_raw_fd`](std::os::fd::AsRawFd::as_raw_fd)
    /// before the call names a closed descriptor after it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let std_listener = listener.into_std()?;
    /// assert_eq!(std_listener.local_addr()?, addr);
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_std(self) -> io::Result<std::net::TcpListener> {
        let sock = socket2::SockRef::from(&*self.tcp).try_clone()?;
        self.shared.close();
        self.task.abort();
        drop(self);
        sock.set_nonblocking(true)?;
        Ok(sock.into())
    }

    /// The `IP_TTL` of the listening socket, as [`TcpListener::ttl`] reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// assert!(listener.ttl()? > 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn ttl(&self) -> io::Result<u32> {
        self.tcp.ttl()
    }

    /// Sets `IP_TTL` on the listening socket (accepted connections inherit it), as
    /// [`TcpListener::set_ttl`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// listener.set_ttl(100)?;
    /// assert_eq!(listener.ttl()?, 100);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.tcp.set_ttl(ttl)
    }

    /// The settings connections accepted now would get (the builder's and the setters' values
    /// over the process-wide ones).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::{config, SmcListener};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::builder().peek_timeout(Duration::from_millis(20)).bind("127.0.0.1:0").await?;
    /// let settings = listener.settings();
    /// assert_eq!(settings.peek_timeout, Duration::from_millis(20)); // the builder's
    /// assert_eq!(settings.negative_cache_ttl, config::global().get().negative_cache_ttl); // the process's
    /// # Ok(())
    /// # }
    /// ```
    pub fn settings(&self) -> Settings {
        self.shared.settings()
    }

    /// The context the listener was made in ([`SmcListenerBuilder::context`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// assert!(listener.context().ptr_eq(smc_tokio::Context::global()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn context(&self) -> &SmcContext {
        &self.shared.ctx
    }

    /// Changes `limit_handshake` for this listener, from the next connection on. (On the
    /// kernel's `AF_SMC` socket the kernel's own `SMC_LIMIT_HS` keeps the value the listener
    /// was bound with: the kernel reads it only when the socket starts listening.
    /// [`kernel::set_limit_handshake`](crate::kernel::set_limit_handshake) switches the
    /// kernel's global limit.)
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcListener;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// // From now on, connections beyond the bound wait for a handshake slot.
    /// listener.set_limit_handshake(false);
    /// assert!(!listener.settings().limit_handshake);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_limit_handshake(&self, on: bool) {
        self.shared.overrides.write().unwrap_or_else(|e| e.into_inner()).limit_handshake = Some(on);
    }

    /// Whether the listening socket is the kernel's `AF_SMC` one (see
    /// [`SmcListenerBuilder::kernel`]): kernel-SMC clients then get the kernel's SMC.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::kernel::KernelMode;
    /// use smc_tokio::SmcListener;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::builder().kernel(KernelMode::Off).bind("127.0.0.1:0").await?;
    /// assert!(!listener.is_kernel_smc());
    /// let wanted = SmcListener::builder().kernel(KernelMode::On).bind("127.0.0.1:0").await?;
    /// assert_eq!(wanted.is_kernel_smc(), smc_tokio::kernel::available());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_kernel_smc(&self) -> bool {
        self.shared.kernel
    }

    /// Changes `max_pending_handshakes` for this listener, from the next connection on.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcListener;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// listener.set_max_pending_handshakes(8);
    /// assert_eq!(listener.settings().max_pending_handshakes, 8);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_max_pending_handshakes(&self, n: usize) {
        self.shared.overrides.write().unwrap_or_else(|e| e.into_inner()).max_pending_handshakes = Some(n);
    }

    /// Handshakes this listener is running now.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// assert_eq!(listener.pending_handshakes(), 0);
    /// let _client = SmcStream::connect(listener.local_addr()?).await?;
    /// let (_server, _) = listener.accept().await?;
    /// assert_eq!(listener.pending_handshakes(), 0); // that handshake is over
    /// # Ok(())
    /// # }
    /// ```
    pub fn pending_handshakes(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The name of this listener's door (the abstract Unix socket at which same-host clients
    /// announce SMC), if it has one; `None` under [`Policy::TcpOnly`] or when the name was
    /// taken (the listener then serves TCP only).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{Policy, SmcListener};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// assert!(listener.door_name().is_some());
    /// // No door under `Policy::TcpOnly`.
    /// let tcp_only = SmcListener::builder().policy(Policy::TcpOnly).bind("127.0.0.1:0").await?;
    /// assert_eq!(tcp_only.door_name(), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn door_name(&self) -> Option<String> {
        self.shared.door.as_ref().map(|d| String::from_utf8_lossy(d.name()).into_owned())
    }

    /// Waits for the next connection whose handshake (if any) has finished.
    ///
    /// Errors are those of [`TcpListener::accept`] (for example `EMFILE`); a connection whose
    /// handshake fails is closed and never returned. Any number of tasks may wait at once;
    /// every one is woken when a connection is ready.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a connection is either returned or stays queued for the next call.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let client = SmcStream::connect(listener.local_addr()?).await?;
    /// let (stream, peer) = listener.accept().await?;
    /// assert_eq!(peer, client.local_addr()?);
    /// assert!(stream.transport().is_smc());
    ///
    /// // Plain TCP clients are served too, over TCP.
    /// let _plain = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
    /// let (stream, _) = listener.accept().await?;
    /// assert!(!stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn accept(&self) -> io::Result<(SmcStream, SocketAddr)> {
        Accept { listener: self, waiter: Waiter::Future(0) }.await
    }

    /// Polls for the next connection; see [`accept`](SmcListener::accept). Only the waker of the
    /// most recent call is woken, as with [`TcpListener::poll_accept`].
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let client = SmcStream::connect(listener.local_addr()?).await?;
    /// let (stream, peer) = std::future::poll_fn(|cx| listener.poll_accept(cx)).await?;
    /// assert_eq!(peer, client.local_addr()?);
    /// assert!(stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(SmcStream, SocketAddr)>> {
        self.poll_next(cx, &mut Waiter::Poll)
    }

    fn poll_next(&self, cx: &mut Context<'_>, waiter: &mut Waiter) -> Poll<io::Result<(SmcStream, SocketAddr)>> {
        // The application's stream: taken to be readable and writable, as tokio takes an
        // accepted socket.
        let accepted = |e| {
            let s = SmcStream::from_established(self.shared.ctx.clone(), e).assume_accepted();
            if self.shared.default_linger.load(Ordering::Relaxed) {
                s.default_linger()
            } else {
                s
            }
        };
        if let Some(e) = self.shared.orphaned() {
            return Poll::Ready(Err(e));
        }
        // Nothing to hand out now: a wait, unless the listener's task ended meanwhile. The waiter
        // is registered (`pop_or_wait`) before the look that finds nothing, and a task orphaned
        // since the look above set the reason before it woke the waiters.
        let wait = || self.shared.orphaned().map_or(Poll::Pending, |e| Poll::Ready(Err(e)));
        // One unit of the task's cooperative budget per connection handed out, as tokio's
        // accept spends: a loop of accepts over a full queue yields to the runtime.
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        // The look-ups of the connections taken from the kernel here read the door within a
        // budget of their own, as those of a turn of the listener task do (begun at the first).
        let mut turn = self.shared.door.as_ref();
        // Connections taken from the kernel here that something else takes on (a handshake,
        // or a close under `Policy::Never`): after a batch of them the call yields, so a flood
        // of connects cannot keep it, and the worker, here for good.
        let mut handed_off = 0;
        loop {
            if handed_off == listen::ACCEPT_BATCH {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if let Some((e, peer)) = self.shared.ready.pop_or_wait(cx, waiter) {
                coop.made_progress();
                return Poll::Ready(Ok((accepted(e), peer)));
            }
            // Take from the kernel directly, so that a connection that needs no handshake is
            // returned on the first poll, as tokio's accept returns it.
            match sys::accept_tcp(self.tcp.as_fd()) {
                Ok((std, peer)) => {
                    let tcp = TcpStream::from_std(std)?;
                    if let Some(door) = turn.take() {
                        door.begin_turn();
                    }
                    if let Handoff::Now(e) = listen::admit(&self.shared, tcp, peer) {
                        coop.made_progress();
                        return Poll::Ready(Ok((accepted(e), peer)));
                    }
                    handed_off += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return wait(),
                // `accept4` takes a descriptor before it looks at the queue, so without one it
                // fails on an empty queue too; tokio's accept, which asks only once the queue
                // is readable, waits there. So do we (registered above): the listener task
                // meets the error when a connection comes, and wakes us to meet it ourselves.
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
                        && !sys::has_pending_connection(self.tcp.as_fd()) =>
                {
                    return wait();
                }
                Err(e) => {
                    coop.made_progress();
                    return Poll::Ready(Err(e));
                }
            }
        }
    }
}

impl From<TcpListener> for SmcListener {
    /// Wraps a tokio listener with the default settings (inside a tokio runtime).
    fn from(tcp: TcpListener) -> SmcListener {
        SmcListenerBuilder::new().from_tcp(tcp)
    }
}

impl TryFrom<std::net::TcpListener> for SmcListener {
    type Error = io::Error;

    /// Same as [`SmcListener::from_std`].
    fn try_from(listener: std::net::TcpListener) -> io::Result<SmcListener> {
        SmcListener::from_std(listener)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A listener whose door went blind (the kernel cannot tell who owns a connection; the
    /// door shuts, and its listening socket reports a hang-up for good) serves TCP: its task
    /// neither turns on the shut door nor stops taking connections from the kernel, so an
    /// accept waiting on an empty queue gets the next client.
    #[tokio::test]
    async fn a_listener_whose_door_went_blind_still_hands_out_connections() {
        let listener = Arc::new(SmcListener::bind("127.0.0.1:0").await.unwrap());
        let addr = listener.local_addr().unwrap();
        listener.shared.door.as_ref().expect("a door").go_blind_for_test();
        for round in 0..3 {
            // The accept first finds nothing (in the listener's queue or the kernel's), and
            // waits for the listener task to take the client in.
            let l = listener.clone();
            let accept = tokio::spawn(async move { l.accept().await.map(|(s, _)| s.transport()) });
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert!(!accept.is_finished(), "round {round}");
            let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let t = tokio::time::timeout(Duration::from_secs(5), accept).await.expect("accept never woken").unwrap();
            assert!(!t.unwrap().is_smc(), "round {round}");
        }
    }

    /// Connections that an accept takes from the kernel and gives to something else (under
    /// [`Policy::Never`], a plain client is closed) end the call after a batch: a flood of them
    /// does not keep one `poll_accept` (and its worker) for as long as it lasts.
    #[tokio::test]
    async fn an_accept_that_hands_every_connection_elsewhere_yields_after_a_batch() {
        let listener = SmcListener::builder().policy(crate::Policy::Never).bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let clients: Vec<_> =
            (0..3 * crate::listen::ACCEPT_BATCH).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(listener.poll_accept(&mut cx).is_pending());
        assert!(sys::has_pending_connection(listener.tcp.as_fd()), "one poll took every queued connection");
        drop(clients);
    }

    /// A loop of accepts over a full queue yields to the runtime, as tokio's does (each accept
    /// spends a unit of the task's cooperative budget): a task spawned before it runs before
    /// the loop ends.
    #[tokio::test]
    async fn a_loop_of_accepts_yields_to_the_tasks_of_its_runtime() {
        let listener = SmcListener::builder().policy(crate::Policy::TcpOnly).bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        for _ in 0..200 {
            clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        tokio::spawn(async move { flag.store(true, Ordering::Relaxed) });
        for i in 0..200 {
            tokio::time::timeout(Duration::from_secs(5), listener.accept()).await.expect("accept").unwrap();
            if ran.load(Ordering::Relaxed) {
                assert!(i > 0, "the other task ran before the first accept");
                return;
            }
        }
        panic!("200 accepts in a row never let the runtime's other task run");
    }

    /// An address that cannot be taken (another socket listens there) is passed over for the
    /// next one the argument resolves to, as tokio's `bind` does, and the listener serves SMC
    /// there. (A `listen` that fails after its `bind` succeeded takes the same path; no test
    /// can make one fail in between.)
    #[tokio::test]
    async fn bind_takes_the_next_address_when_one_is_taken() {
        let holder = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let addrs = [holder.local_addr().unwrap(), free];
        let listener = SmcListener::bind(&addrs[..]).await.expect("the second address");
        assert_eq!(listener.local_addr().unwrap(), free);
        let (client, server) = tokio::join!(crate::SmcStream::connect(free), listener.accept());
        assert!(client.unwrap().transport().is_smc());
        assert!(server.unwrap().0.transport().is_smc());
        let err = SmcListener::bind(holder.local_addr().unwrap()).await.expect_err("taken");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    /// A connection the listener handed out as plain TCP because it could not read its door to
    /// the end (out of descriptors, say) is never committed to SMC when its registration is
    /// read later: the client would talk over shared memory to an application reading TCP.
    #[tokio::test]
    async fn a_connection_handed_out_plain_before_its_registration_was_read_stays_tcp() {
        handed_out_plain_then_read(|door, on| door.stall_reads_for_test(on)).await;
    }

    /// The same while the door takes no new door connection because the process's descriptor
    /// closers are congested (before Linux 6.16): the client's new door connection, with its
    /// registration, waits in the door's queue, and the connection is handed out as TCP. A
    /// look-up took that for "everything read" and did not note the connection as missed: once
    /// the closers came free, the registration was read, answered at once (a solo door) and
    /// committed, with the application reading TCP (the client was committed to SMC).
    #[tokio::test]
    async fn a_connection_handed_out_plain_while_door_connections_wait_stays_tcp() {
        handed_out_plain_then_read(|door, on| door.congest_for_test(on)).await;
    }

    /// Values a handshake cannot work with are bounded wherever they come from: a builder's
    /// `Duration::MAX` handshake bound (it panicked in the arithmetic of the handshake's
    /// deadlines), a zero one (every handshake failed before it could be answered), and
    /// settings given whole that allow no handshake at once (every connection went TCP).
    #[tokio::test]
    async fn out_of_range_settings_are_bounded_not_fatal() {
        use crate::config::{Settings, MAX_TIMEOUT, MIN_HANDSHAKE_TIMEOUT};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = SmcListener::builder().handshake_timeout(Duration::ZERO).bind("127.0.0.1:0").await.unwrap();
        assert_eq!(l.settings().handshake_timeout, MIN_HANDSHAKE_TIMEOUT);
        let zero = l.local_addr().unwrap();
        crate::testing::spawn_echo_of_five(l);
        let builder = crate::SmcStream::builder().handshake_timeout(Duration::MAX);
        assert_eq!(builder.settings().handshake_timeout, MAX_TIMEOUT);
        let connect = tokio::time::timeout(Duration::from_secs(30), builder.connect(zero));
        let mut s = connect.await.expect("an answer, SMC or TCP, within the test's bound").expect("a connection");
        s.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hello");

        let settings = Settings { max_pending_handshakes: 0, handshake_timeout: Duration::MAX, ..Settings::default() };
        let ctx = crate::Context::with_settings(settings);
        let l = SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await.unwrap();
        assert_eq!(l.settings().max_pending_handshakes, 1);
        let addr = l.local_addr().unwrap();
        let builder = crate::SmcStream::builder().context(&ctx);
        let (c, a) = tokio::join!(builder.connect(addr), l.accept());
        assert!(c.unwrap().transport().is_smc());
        assert!(a.unwrap().0.transport().is_smc());
    }

    /// A solo door answers a registration before its connection comes, and a client of an IPv4
    /// address registers at the door of the IPv6 wildcard of its port when no `0.0.0.0` door is
    /// there. A `::` listener with `IPV6_V6ONLY` receives no IPv4 connection: another socket
    /// (here a plain listener; it could be another user's) may listen on `0.0.0.0` of the same
    /// port and get the connection. The door must not commit it: before, it checked the port
    /// alone, and the client went to shared memory with a listener that never got its
    /// connection, while the plain server waited for its bytes.
    #[tokio::test]
    async fn a_v6_only_wildcard_never_commits_a_connection_that_went_to_ipv4() {
        // A port free on both wildcards: the one `[::]` gets may be in use on IPv4 (by a
        // connection of another test, say); then another.
        let (sock, port, plain) = 'found: {
            for _ in 0..20 {
                let sock = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).unwrap();
                sock.set_only_v6(true).unwrap();
                sock.bind(&"[::]:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
                let port = sock.local_addr().unwrap().as_socket().unwrap().port();
                if let Ok(plain) = tokio::net::TcpListener::bind(("0.0.0.0", port)).await {
                    break 'found (sock, port, plain);
                }
            }
            panic!("no port free on both wildcards in 20 tries");
        };
        sock.listen(128).unwrap();
        sock.set_nonblocking(true).unwrap();
        let listener = SmcListener::builder().from_std(sock.into()).unwrap();
        assert_eq!(listener.local_addr().unwrap().port(), port);
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let client = tokio::spawn(async move {
            crate::SmcStream::builder().handshake_timeout(Duration::from_secs(60)).connect(addr).await
        });
        let (mut server, _) = tokio::time::timeout(Duration::from_secs(10), plain.accept()).await.unwrap().unwrap();
        let mut client =
            tokio::time::timeout(Duration::from_secs(10), client).await.expect("no verdict").unwrap().unwrap();
        plain_both_ways(&mut client, &mut server).await;
        // An IPv6 client of the same listener still gets shared memory.
        let v6: std::net::SocketAddr = format!("[::1]:{port}").parse().unwrap();
        let (c, s) = tokio::join!(crate::SmcStream::connect(v6), listener.accept());
        assert!(c.unwrap().transport().is_smc());
        assert!(s.unwrap().0.transport().is_smc());
    }

    /// `client` is not on shared memory, and bytes go both ways between it and `server`.
    async fn plain_both_ways(
        client: &mut crate::SmcStream,
        server: &mut (impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin),
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        assert!(!client.transport().is_smc(), "the client was committed to {}", client.transport());
        client.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), server.read_exact(&mut b)).await.unwrap().unwrap();
        assert_eq!(&b, b"ping");
        server.write_all(b"pong").await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut b)).await.unwrap().unwrap();
        assert_eq!(&b, b"pong");
    }

    /// A client connects while `fault` keeps the door from reading its registration; the
    /// listener hands the connection out as TCP; the fault ends, and the client, its handshake
    /// bound far beyond the test's, must be TCP too, the bytes going both ways.
    async fn handed_out_plain_then_read(fault: impl Fn(&crate::door::Door, bool)) {
        let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let door = listener.shared.door.as_ref().expect("a door");
        fault(door, true);
        // A handshake bound far beyond the test's: the verdict is the door's, not a timeout's.
        let client = tokio::spawn(async move {
            crate::SmcStream::builder().handshake_timeout(Duration::from_secs(60)).connect(addr).await
        });
        let (mut server, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await.unwrap().unwrap();
        assert!(!server.transport().is_smc(), "{}", server.transport());
        fault(door, false);
        let mut client =
            tokio::time::timeout(Duration::from_secs(10), client).await.expect("no verdict").unwrap().unwrap();
        plain_both_ways(&mut client, &mut server).await;
    }
}
