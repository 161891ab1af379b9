use std::fmt;
use std::io::{self, IoSlice};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, Interest, ReadBuf, Ready};
use tokio::net::{TcpStream, ToSocketAddrs};
use tracing::Instrument;

use crate::config::{InbandPeers, Overrides, Policy, Settings, ShmConfig};
use crate::context::Context as SmcContext;
use crate::net::buf_read::ReadLend;
use crate::net::cork::CorkGuard;
use crate::net::inband::{InbandGuard, Owed};
use crate::net::split::{split, ReadHalf, WriteHalf};
use crate::net::split_owned::{split_owned, OwnedReadHalf, OwnedWriteHalf};
use crate::net::tcp_io::{Assumed, TcpIo};
use crate::smc::conn::{Lent, Reader, SmcConn};
use crate::sys;
use crate::transport::Transport;

/// A connection that started as TCP and moved to shared memory or RDMA when both ends could, or
/// stayed on TCP with every byte intact when they could not.
///
/// It is a drop-in for [`tokio::net::TcpStream`]: it implements [`AsyncRead`] and [`AsyncWrite`]
/// (vectored writes too), splits into borrowed or owned halves, and
/// [`shutdown`](tokio::io::AsyncWriteExt::shutdown) is a half-close with TCP's semantics.
/// [`transport`](SmcStream::transport) tells what the connection got and why.
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
/// let addr = listener.local_addr()?;
/// tokio::spawn(async move {
///     let (mut conn, _) = listener.accept().await?;
///     let mut buf = [0u8; 5];
///     conn.read_exact(&mut buf).await?;
///     conn.write_all(&buf).await?;
///     std::io::Result::Ok(())
/// });
///
/// let mut stream = SmcStream::connect(addr).await?;
/// stream.write_all(b"hello").await?;
/// let mut buf = [0u8; 5];
/// stream.read_exact(&mut buf).await?;
/// assert_eq!(&buf, b"hello");
/// println!("connected over {}", stream.transport());
/// # Ok(())
/// # }
/// ```
pub struct SmcStream {
    /// The context it was made in: its counters, its negative cache.
    ctx: SmcContext,
    tcp: Arc<TcpStream>,
    transport: Transport,
    /// What carries the bytes: the TCP socket, or an SMC connection over it.
    path: Path,
    /// Bytes the application moved (both directions), for adaptive fallback.
    moved: AtomicU64,
    /// Client side with adaptive fallback on: the server and the threshold.
    adaptive: Option<(SocketAddr, u64, Duration)>,
    /// Cork guards alive on the TCP path.
    tcp_corks: Arc<AtomicUsize>,
    /// The descriptor `sendfile` last found to be a regular file (-1: none), so a stream that
    /// serves one open file many times pays one `fstat`, not one per call (a system call
    /// costs as much as the rest of a 4 KiB `sendfile` on the development VM).
    sendfile_checked: AtomicI32,
    /// The directions of the TCP socket still assumed ready (an accepted stream's, as tokio
    /// assumes them for accepted sockets); used on the TCP path.
    assumed: Assumed,
    /// What the TCP socket's `SO_LINGER` is known to be, so that dropping an SMC stream (which
    /// aborts on a zero linger, as TCP's close resets) asks the kernel only when it cannot
    /// know: [`LINGER_UNKNOWN`], [`LINGER_NOT_ZERO`] or [`LINGER_ZERO`].
    linger: AtomicU8,
    /// The stream's own [`AsyncBufRead`] state (each read half has its own), made at its first
    /// use: a stream that is never read so costs one word.
    lend: Option<Box<ReadLend>>,
    /// Split into owned halves, whose read half lends ring bytes: reads through the stream
    /// itself (a write half's `as_ref`) are then not the lender's ([`Reader::Other`]).
    owned_split: bool,
    /// The owned read half holds bytes of the stream from `fill_buf` (lent, copied or peeked,
    /// and not consumed): a read by another handle would take them from under it, so it
    /// answers `WouldBlock` meanwhile, on every path.
    half_holds: AtomicBool,
}

/// `SO_LINGER` may be anything: the socket was the application's, or its descriptor was lent
/// out (through `AsFd`/`AsRawFd`), so it is read at drop.
const LINGER_UNKNOWN: u8 = 0;
/// `SO_LINGER` is off or non-zero: set so through the stream, or the socket is ours and never
/// lent out (a new socket's, and an accepted one's from such a listener, is off).
const LINGER_NOT_ZERO: u8 = 1;
/// `SO_LINGER` is zero, set through the stream.
const LINGER_ZERO: u8 = 2;

/// What carries a stream's bytes. The two are exclusive: an SMC connection has no in-band
/// guard (its handshake never touched the stream), and a TCP one no link.
enum Path {
    /// The TCP socket. On a server, with the guard that takes a client's late handshake message
    /// off it before the application's bytes (while the guard is active).
    Tcp(Option<InbandGuard>),
    /// An SMC connection; the TCP socket stays open underneath, idle and watched.
    Smc(SmcInner),
}

/// The SMC side of a stream that left TCP.
struct SmcInner {
    conn: Arc<SmcConn>,
    /// The task watching the TCP socket under the connection (taken when the stream moves back
    /// to the socket and the task is stopped).
    watcher: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl SmcInner {
    fn stop_watcher(&self) -> Option<tokio::task::JoinHandle<()>> {
        let w = self.watcher.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        w.abort();
        Some(w)
    }
}

/// What carries a stream's bytes now: a stream whose SMC connection moved back to its TCP
/// socket is a TCP stream (without an in-band guard: no handshake message follows SMC).
enum PathRef<'a> {
    Smc(&'a SmcInner),
    Tcp(Option<&'a InbandGuard>),
}

/// `r`, or `None` where it says that the SMC connection moved to its TCP socket meanwhile (the
/// caller then does the operation on TCP).
fn unless_moved<T>(r: Poll<io::Result<T>>) -> Option<Poll<io::Result<T>>> {
    match r {
        Poll::Ready(Err(e)) if SmcConn::is_moved_error(&e) => None,
        r => Some(r),
    }
}

/// Runs one operation on the SMC path within the task's cooperative budget, as tokio's own
/// streams do: once the task has done its share of operations that were ready, the operation
/// answers `Pending` (and the task is woken at once), so a stream that always has bytes or room
/// cannot keep the runtime from its timers and other tasks. `None` when the connection moved to
/// TCP (the TCP path spends the budget itself).
fn smc_coop<T>(
    cx: &mut Context<'_>,
    op: impl FnOnce(&mut Context<'_>) -> Poll<io::Result<T>>,
) -> Option<Poll<io::Result<T>>> {
    let coop = match tokio::task::coop::poll_proceed(cx) {
        Poll::Ready(coop) => coop,
        Poll::Pending => return Some(Poll::Pending),
    };
    let r = unless_moved(op(cx))?;
    if r.is_ready() {
        coop.made_progress();
    }
    Some(r)
}

/// A readiness poll on the SMC path, for a unit of the task's cooperative budget, as tokio's
/// readiness spends one.
fn smc_ready(cx: &mut Context<'_>, conn: &SmcConn, interest: Interest) -> Poll<io::Result<()>> {
    let coop = ready!(tokio::task::coop::poll_proceed(cx));
    let r = conn.poll_ready(cx, interest);
    if r.is_ready() {
        coop.made_progress();
    }
    r.map(|_| Ok(()))
}

impl Drop for SmcStream {
    fn drop(&mut self) {
        if let (Some((peer, min, ttl)), true) = (self.adaptive, self.smc().is_some()) {
            if self.ctx.negative_cache().record_smc_conn(peer, self.moved.load(Ordering::Relaxed) >= min, ttl) {
                self.ctx.counters().adaptive_fallback();
            }
        }
        if let Path::Smc(s) = &self.path {
            // A zero SO_LINGER (set on the stream, its socket before connecting, or through
            // its descriptor) asks for an abort, as it makes TCP's close a reset.
            let abort = match self.linger.load(Ordering::Relaxed) {
                LINGER_NOT_ZERO => false,
                LINGER_ZERO => true,
                _ => socket2::SockRef::from(&*self.tcp).linger().is_ok_and(|l| l == Some(Duration::ZERO)),
            };
            // The watcher goes with the connection: it goes on watching a TCP socket held for
            // the peer's close, and is stopped otherwise.
            let watcher = s.watcher.lock().unwrap_or_else(|e| e.into_inner()).take();
            s.conn.release(abort, watcher);
        }
    }
}

fn raw_io_unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "raw socket i/o on an smc connection: its bytes are not on the tcp socket",
    )
}

/// As tokio's `TcpStream` is `AsRef<TcpStream>`, and so are its halves: code generic over
/// `AsRef<SmcStream>` takes a stream or any half of one.
///
/// ```
/// use smc_tokio::{SmcListener, SmcStream};
///
/// fn nodelay_of(s: &impl AsRef<SmcStream>) -> bool {
///     s.as_ref().nodelay().unwrap()
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let mut stream = SmcStream::connect(listener.local_addr()?).await?;
/// stream.set_nodelay(true)?;
/// assert!(nodelay_of(&stream));
/// let (read, write) = stream.split();
/// assert!(nodelay_of(&read) && nodelay_of(&write));
/// let (read, write) = stream.into_split();
/// assert!(nodelay_of(&read) && nodelay_of(&write));
/// # Ok(())
/// # }
/// ```
impl AsRef<SmcStream> for SmcStream {
    fn as_ref(&self) -> &SmcStream {
        self
    }
}

impl fmt::Debug for SmcStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmcStream")
            .field("transport", &self.transport)
            .field("local", &self.tcp.local_addr().ok())
            .field("peer", &self.tcp.peer_addr().ok())
            .finish()
    }
}

impl SmcStream {
    /// Opens a connection to `addr`, proposing SMC, with the default settings (policy
    /// [`Policy::Auto`]). See [`SmcStreamBuilder`] for the settings.
    ///
    /// If `addr` resolves to several addresses, each is tried in turn, as
    /// [`TcpStream::connect`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, SmcListener, SmcStream, Transport};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // An smc-tokio listener on this host: the connection moves to shared memory.
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// assert!(stream.transport().is_smc());
    ///
    /// // A plain TCP server: nothing is proposed to it, and the connection is TCP.
    /// let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let stream = SmcStream::connect(plain.local_addr()?).await?;
    /// assert_eq!(stream.transport(), Transport::Tcp(FallbackReason::NotProposed));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<SmcStream> {
        SmcStreamBuilder::new().connect(addr).await
    }

    /// The TCP socket as the TCP path uses it (with its assumed readiness).
    fn io(&self) -> TcpIo<'_> {
        TcpIo::new(&self.tcp, &self.assumed)
    }

    /// Marks a stream the listener hands out: as tokio does for an accepted socket, its TCP
    /// socket is taken to be readable and writable until an operation finds otherwise.
    pub(crate) fn assume_accepted(self) -> SmcStream {
        self.assumed.set_accepted();
        self
    }

    /// Sets `SO_LINGER`, and remembers it unless it cannot be known (the socket was the
    /// application's, or its descriptor was lent out: then it is read at drop).
    fn store_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        socket2::SockRef::from(&*self.tcp).set_linger(dur)?;
        let known = if dur == Some(Duration::ZERO) { LINGER_ZERO } else { LINGER_NOT_ZERO };
        let _ =
            self.linger.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| (l != LINGER_UNKNOWN).then_some(known));
        Ok(())
    }

    /// Marks a stream whose socket has the default `SO_LINGER` (off): made by us, or accepted
    /// from a listening socket made by us, and never lent out.
    pub(crate) fn default_linger(self) -> SmcStream {
        self.linger.store(LINGER_NOT_ZERO, Ordering::Relaxed);
        self
    }

    /// Whether a guarded stream is readable by assumption: its guard holds nothing and its
    /// socket is assumed readable (an accepted stream before its first empty read), so a
    /// read tries the socket, as it would on tokio's accepted stream.
    fn guard_assumed_readable(&self, g: &InbandGuard) -> bool {
        self.io().assumed_readable() && !g.holds_bytes()
    }

    /// What carries the bytes now (see [`PathRef`]).
    fn path(&self) -> PathRef<'_> {
        match &self.path {
            Path::Smc(s) if !s.conn.on_tcp() => PathRef::Smc(s),
            Path::Smc(_) => PathRef::Tcp(None),
            Path::Tcp(g) => PathRef::Tcp(g.as_ref()),
        }
    }

    /// The SMC connection, if the bytes move over one.
    fn smc(&self) -> Option<&SmcInner> {
        match self.path() {
            PathRef::Smc(s) => Some(s),
            PathRef::Tcp(_) => None,
        }
    }

    /// The in-band guard of a server's TCP stream (active or done).
    fn guard(&self) -> Option<&InbandGuard> {
        match &self.path {
            Path::Tcp(g) => g.as_ref(),
            Path::Smc(_) => None,
        }
    }

    /// A builder for connections with non-default settings.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, Policy, SmcListener, SmcStream, Transport};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// // SMC switched off for this one connection.
    /// let stream = SmcStream::builder().policy(Policy::TcpOnly).connect(listener.local_addr()?).await?;
    /// assert_eq!(stream.transport(), Transport::Tcp(FallbackReason::Disabled));
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder() -> SmcStreamBuilder {
        SmcStreamBuilder::new()
    }

    pub(crate) fn from_tcp(ctx: SmcContext, tcp: TcpStream, transport: Transport) -> SmcStream {
        SmcStream {
            ctx,
            tcp: Arc::new(tcp),
            transport,
            path: Path::Tcp(None),
            moved: AtomicU64::new(0),
            adaptive: None,
            tcp_corks: Arc::default(),
            sendfile_checked: AtomicI32::new(-1),
            assumed: Assumed::default(),
            linger: AtomicU8::new(LINGER_UNKNOWN),
            lend: None,
            owned_split: false,
            half_holds: AtomicBool::new(false),
        }
    }

    /// A server's TCP stream whose client may still send the handshake message `owed`.
    /// The application's stream of what an establishment came to.
    pub(crate) fn from_established(ctx: SmcContext, e: crate::handshake::Established) -> SmcStream {
        match e {
            crate::handshake::Established::Tcp { tcp, transport, owed: None } => {
                SmcStream::from_tcp(ctx, tcp, transport)
            }
            crate::handshake::Established::Tcp { tcp, transport, owed: Some(o) } => {
                SmcStream::from_tcp_guarded(ctx, tcp, transport, o)
            }
            crate::handshake::Established::Smc { tcp, conn, transport, watcher } => {
                SmcStream::from_smc(ctx, tcp, conn, transport, watcher)
            }
        }
    }

    fn from_tcp_guarded(ctx: SmcContext, tcp: TcpStream, transport: Transport, owed: Owed) -> SmcStream {
        let wait = crate::net::inband::partial_wait_for(tcp.peer_addr().ok(), tcp.local_addr().ok());
        let counters = ctx.counters().clone();
        let mut s = SmcStream::from_tcp(ctx, tcp, transport);
        s.path = Path::Tcp(Some(InbandGuard::new(owed, wait, counters)));
        s
    }

    /// A stream whose bytes move over `conn`; `tcp` stays open underneath, watched by `watcher`.
    fn from_smc(
        ctx: SmcContext,
        tcp: Arc<TcpStream>,
        conn: Arc<SmcConn>,
        transport: Transport,
        watcher: crate::smc::conn::Watcher,
    ) -> SmcStream {
        // The peer's address is looked up (a system call) only for a span that records it.
        let peer = if conn.span().is_disabled() { None } else { tcp.peer_addr().ok() };
        conn.describe(peer, transport);
        let watcher = watcher.take();
        SmcStream {
            ctx,
            tcp,
            transport,
            path: Path::Smc(SmcInner { conn, watcher: std::sync::Mutex::new(watcher) }),
            moved: AtomicU64::new(0),
            adaptive: None,
            tcp_corks: Arc::default(),
            sendfile_checked: AtomicI32::new(-1),
            assumed: Assumed::default(),
            linger: AtomicU8::new(LINGER_UNKNOWN),
            lend: None,
            owned_split: false,
            half_holds: AtomicBool::new(false),
        }
    }

    /// What the connection uses: TCP (with the reason it stayed there), SMC-D or SMC-R.
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
    /// let (server, _) = listener.accept().await?;
    /// // Both ends are smc-tokio in one process, and agree on what they got.
    /// assert!(client.transport().is_smc());
    /// assert_eq!(server.transport(), client.transport());
    /// println!("{}", client.transport()); // "smc-d"
    /// # Ok(())
    /// # }
    /// ```
    pub fn transport(&self) -> Transport {
        match &self.path {
            // Moved once the bytes come over TCP (the peer's frame read), whatever of the move
            // is still under way (our resend).
            Path::Smc(s) => match s.conn.reads_moved_to_tcp() {
                Some(cause) => Transport::Tcp(crate::FallbackReason::HandedBack(cause)),
                None => self.transport,
            },
            Path::Tcp(_) => self.transport,
        }
    }

    /// The id of the link group the connection runs on (`None` on TCP). Connections between
    /// the same two processes share one link group, as `smcss` shows for the kernel's SMC.
    ///
    /// # Examples
    ///
    /// Two connections between the same processes share a link group; a TCP one has none.
    ///
    /// ```
    /// use smc_tokio::{Policy, SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let a = SmcStream::connect(addr).await?;
    /// let b = SmcStream::connect(addr).await?;
    /// assert!(a.link_group().is_some());
    /// assert_eq!(a.link_group(), b.link_group());
    /// let tcp = SmcStream::builder().policy(Policy::TcpOnly).connect(addr).await?;
    /// assert_eq!(tcp.link_group(), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn link_group(&self) -> Option<u64> {
        self.smc().map(|s| s.conn.group_id())
    }

    /// Test hook (feature `test-util`): sends this connection's next CDC message after
    /// `corrupt` edited its 64 encoded bytes, as a hostile or buggy peer would. Fails on TCP.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcError, SmcListener, SmcStream};
    /// use tokio::io::AsyncReadExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let client = SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// // A frame whose type byte is wrong: the server takes it for a protocol violation.
    /// client.send_corrupt_cdc(|frame| frame[0] = 0)?;
    /// let err = server.read(&mut [0u8; 1]).await.unwrap_err();
    /// assert!(matches!(SmcError::from_io(&err), Some(SmcError::Protocol(_))));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn send_corrupt_cdc(&self, corrupt: impl FnOnce(&mut [u8; 64])) -> io::Result<()> {
        match self.path() {
            PathRef::Smc(s) => s.conn.send_corrupt_cdc(corrupt),
            PathRef::Tcp(_) => Err(io::Error::other("not an smc connection")),
        }
    }

    /// Test hook: fails this connection's link group on this side, as a local link error would
    /// (an RDMA port that went down, a system call on the link that failed): every connection
    /// of the group moves to its TCP socket, and the peer follows.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn fail_link(&self) -> io::Result<()> {
        match &self.path {
            Path::Smc(s) => {
                let why = "failed by a test".to_string();
                s.conn.group().fail(crate::link::LinkError::Io(io::ErrorKind::Other, why));
                Ok(())
            }
            Path::Tcp(_) => Err(io::Error::other("not an smc connection")),
        }
    }

    /// Test hook: this connection's link fails under it as a failed work completion fails an
    /// RDMA link: the link first, and its group when its driver (or a task waiting for a
    /// delivery) sees it. Shared-memory links do not fail that way: an error there.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn break_link(&self) -> io::Result<()> {
        match &self.path {
            Path::Smc(s) => match s.conn.group().link() {
                Some(l) if l.is_rdma() => {
                    l.fail_for_test(crate::link::LinkError::Io(io::ErrorKind::Other, "broken by a test".into()));
                    Ok(())
                }
                _ => Err(io::Error::other("not an smc-r connection")),
            },
            Path::Tcp(_) => Err(io::Error::other("not an smc connection")),
        }
    }

    /// Test hook: drops the stream (its close goes out as for any drop), then, before anything
    /// else runs on this thread, [`break_link`](Self::break_link) under it: a link that fails
    /// while the close is in flight.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn drop_and_break_link(self) -> io::Result<()> {
        let link = match &self.path {
            Path::Smc(s) => s.conn.group().link().filter(|l| l.is_rdma()).cloned(),
            Path::Tcp(_) => None,
        };
        let link = link.ok_or_else(|| io::Error::other("not an smc-r connection"))?;
        drop(self);
        link.fail_for_test(crate::link::LinkError::Io(io::ErrorKind::Other, "broken by a test".into()));
        Ok(())
    }

    /// The local address of the underlying TCP connection.
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
    /// let (server, peer) = listener.accept().await?;
    /// assert_eq!(client.local_addr()?, peer);
    /// assert_eq!(server.local_addr()?, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The peer's address.
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
    /// let (server, _) = listener.accept().await?;
    /// assert_eq!(client.peer_addr()?, listener.local_addr()?);
    /// assert_eq!(server.peer_addr()?, client.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.peer_addr()
    }

    /// Sets `TCP_NODELAY` on the underlying TCP connection.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// client.set_nodelay(true)?;
    /// assert!(client.nodelay()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.tcp.set_nodelay(nodelay)
    }

    /// Whether `TCP_NODELAY` is set.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// assert!(!client.nodelay()?); // off on a new connection
    /// client.set_nodelay(true)?;
    /// assert!(client.nodelay()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn nodelay(&self) -> io::Result<bool> {
        self.tcp.nodelay()
    }

    /// Splits into a read half and a write half that borrow the stream; both can be used
    /// concurrently (from one task, e.g. with `tokio::join!`).
    ///
    /// # Examples
    ///
    /// An echo on the server's halves while the client talks, all on one task.
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
    /// let (mut rd, mut wr) = server.split();
    /// let echo = async {
    ///     tokio::io::copy(&mut rd, &mut wr).await?;
    ///     wr.shutdown().await
    /// };
    /// let talk = async {
    ///     client.write_all(b"ping").await?;
    ///     client.shutdown().await?; // the echo sees the end, and ends too
    ///     let mut got = Vec::new();
    ///     client.read_to_end(&mut got).await.map(|_| got)
    /// };
    /// let ((), got) = tokio::try_join!(echo, talk)?;
    /// assert_eq!(got, b"ping");
    /// # Ok(())
    /// # }
    /// ```
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        split(self)
    }

    /// Splits into owned halves that can move to different tasks. Dropping the write half shuts
    /// the write direction down, as with tokio's `TcpStream`. [`OwnedReadHalf::reunite`] puts
    /// them back together.
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
    /// let client = SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let (mut rd, mut wr) = client.into_split();
    /// // The write half moves to a task of its own; dropping it there half-closes the stream.
    /// tokio::spawn(async move { wr.write_all(b"request").await });
    /// let mut req = Vec::new();
    /// server.read_to_end(&mut req).await?;
    /// assert_eq!(req, b"request");
    /// server.write_all(b"reply").await?;
    /// let mut buf = [0u8; 5];
    /// rd.read_exact(&mut buf).await?;
    /// assert_eq!(&buf, b"reply");
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_split(mut self) -> (OwnedReadHalf, OwnedWriteHalf) {
        self.owned_split = true;
        split_owned(Arc::new(self))
    }

    /// Back from owned halves ([`OwnedReadHalf::reunite`]): the stream lends again.
    pub(crate) fn reunited(mut self) -> SmcStream {
        self.owned_split = false;
        self
    }

    /// `WouldBlock` for a read by another handle while the owned read half holds bytes.
    fn other_may_read(&self, reader: Reader) -> io::Result<()> {
        if reader == Reader::Other && self.half_holds.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(())
    }

    /// The owned read half holds bytes from `fill_buf`, or no longer does.
    pub(crate) fn set_half_holds(&self, holds: bool) {
        self.half_holds.store(holds, Ordering::Relaxed);
    }

    /// Who reads when the application calls a read method on the stream itself.
    fn reader(&self) -> Reader {
        if self.owned_split {
            Reader::Other
        } else {
            Reader::Lender
        }
    }

    pub(crate) fn poll_read_priv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = self.poll_read_io(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.moved(false, buf.filled().len() - before);
        }
        r
    }

    pub(crate) fn poll_write_priv(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let r = self.poll_write_io(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            self.moved(true, n);
        }
        r
    }

    pub(crate) fn poll_write_vectored_priv(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = self.poll_write_vectored_io(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.moved(true, n);
        }
        r
    }

    /// Receives data without removing it from the queue: the next read returns the same bytes.
    /// Resolves to the number of bytes copied into `buf` (0 at the end of the stream), waiting
    /// until there is at least one, as [`TcpStream::peek`] does. Over SMC the bytes are copied
    /// from the receive ring and stay there.
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
    /// let addr = listener.local_addr()?;
    /// tokio::spawn(async move {
    ///     let (mut c, _) = listener.accept().await?;
    ///     c.write_all(b"hello").await
    /// });
    /// let mut s = SmcStream::connect(addr).await?;
    /// let mut b = [0u8; 5];
    /// let n = s.peek(&mut b).await?;
    /// assert_eq!(&b[..n], &b"hello"[..n]);
    /// s.read_exact(&mut b).await?; // the peeked bytes are still there
    /// assert_eq!(&b, b"hello");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.peek_as(buf, self.reader()).await
    }

    /// [`peek`](Self::peek) by `reader`.
    pub(crate) async fn peek_as(&self, buf: &mut [u8], reader: Reader) -> io::Result<usize> {
        // As tokio's: a peek that does not wait, and the stream's readiness future between
        // tries, so that every task peeking is woken (the `poll_*` methods keep one waker);
        // each try spends a unit of the task's cooperative budget, so that a loop of peeks
        // that keep finding the same bytes yields to the runtime (where the rest of them, or
        // the link group's driver that takes them in, waits to run).
        loop {
            // The budget's guard is not held across the wait: it is not `Send`, and a future
            // that held it would not be either (tokio's `peek` is).
            let tried = {
                let coop = std::future::poll_fn(tokio::task::coop::poll_proceed).await;
                match self.try_peek_into(&mut ReadBuf::new(buf), reader) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
                    r => {
                        coop.made_progress();
                        Some(r)
                    }
                }
            };
            match tried {
                Some(r) => return r,
                None => self.readable().await?,
            }
        }
    }

    /// A peek that does not wait: `WouldBlock` where there is nothing to see yet.
    fn try_peek_into(&self, rb: &mut ReadBuf<'_>, reader: Reader) -> io::Result<usize> {
        if let Some(s) = self.smc() {
            match s.conn.try_peek(rb, reader) {
                Err(e) if SmcConn::is_moved_error(&e) => {}
                r => return r,
            }
        }
        if let Poll::Ready(r) = self.poll_skip(None, false) {
            r?;
        }
        if let Some(g) = self.guard() {
            match g.poll_settle(None, self.io()) {
                Poll::Ready(r) => r?,
                Poll::Pending => return Err(io::ErrorKind::WouldBlock.into()),
            }
        }
        self.io().try_peek(rb)
    }

    /// Polls for data to peek at; see [`peek`](SmcStream::peek). On `Ready(Ok(n))` the first `n`
    /// bytes of `buf`'s unfilled part hold the data and are marked filled. As with
    /// [`TcpStream::poll_peek`], only the waker of the most recent call is woken.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use tokio::io::{AsyncWriteExt, ReadBuf};
    /// client.write_all(b"hello").await?;
    /// let mut buf = [0u8; 8];
    /// let mut rb = ReadBuf::new(&mut buf);
    /// let n = std::future::poll_fn(|cx| server.poll_peek(cx, &mut rb)).await?;
    /// assert_eq!(rb.filled(), &b"hello"[..n]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn poll_peek(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<usize>> {
        self.poll_peek_as(cx, buf, self.reader())
    }

    /// [`poll_peek`](Self::poll_peek) by `reader`.
    pub(crate) fn poll_peek_as(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        reader: Reader,
    ) -> Poll<io::Result<usize>> {
        if let Some(s) = self.smc() {
            if let Some(r) = smc_coop(cx, |cx| s.conn.poll_peek(cx, buf, reader)) {
                return r;
            }
        }
        ready!(self.poll_skip(Some(cx), false))?;
        if let Some(g) = self.guard() {
            ready!(g.poll_settle(Some(cx), self.io()))?;
        }
        self.io().poll_peek(cx, buf)
    }

    /// Makes a stream of an already connected std TCP stream, as [`TcpStream::from_std`] does
    /// (the stream should be in non-blocking mode). No handshake runs on a connection that
    /// exists already: the stream is TCP, with the reason
    /// [`FallbackReason::Adopted`](crate::FallbackReason::Adopted). Must be called inside a
    /// tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, SmcStream, Transport};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let std_stream = std::net::TcpStream::connect(listener.local_addr()?)?;
    /// std_stream.set_nonblocking(true)?;
    /// let stream = SmcStream::from_std(std_stream)?;
    /// assert_eq!(stream.transport(), Transport::Tcp(FallbackReason::Adopted));
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_std(stream: std::net::TcpStream) -> io::Result<SmcStream> {
        Ok(SmcStream::from_tcp(
            SmcContext::global().clone(),
            TcpStream::from_std(stream)?,
            Transport::Tcp(crate::FallbackReason::Adopted),
        ))
    }

    /// Moves the connection's byte stream back to its TCP socket now, in both directions, losing
    /// and repeating nothing: bytes the peer sent that this side has not read, and bytes this
    /// side wrote that the peer has not read, are sent again over TCP, and the peer follows at
    /// once (see [`proto::handback`](crate::proto::handback)). From then on the stream is a TCP
    /// stream: [`transport`](SmcStream::transport) says
    /// [`FallbackReason::HandedBack`](crate::FallbackReason::HandedBack), and
    /// [`into_std`](SmcStream::into_std), [`try_io`](SmcStream::try_io) and
    /// [`async_io`](SmcStream::async_io) work as on tokio's stream. A connection whose link
    /// fails while both processes live moves by itself.
    ///
    /// Resolves at once on a TCP connection. Reads wait for the peer's answer (one round trip
    /// on the TCP connection, at most 30 s); writes, and this call, also wait until the bytes
    /// sent again have gone into the socket, which takes as long as the peer's application
    /// takes to read what does not fit its socket's buffers. Fails where the connection cannot
    /// move any more: it ended (closed, aborted, failed), this side's close went out already,
    /// or the runtime the stream was made on shut down (its socket went with that runtime's
    /// reactor: the error is the one its reads and writes get then).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, HandbackCause, SmcListener, SmcStream, Transport};
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// client.write_all(b"over shared memory, ").await?;
    /// client.hand_back().await?;
    /// assert_eq!(client.transport(), Transport::Tcp(FallbackReason::HandedBack(HandbackCause::Requested)));
    /// client.write_all(b"then over tcp").await?;
    /// drop(client);
    /// let mut all = String::new();
    /// server.read_to_string(&mut all).await?;
    /// assert_eq!(all, "over shared memory, then over tcp");
    /// assert_eq!(server.transport(), Transport::Tcp(FallbackReason::HandedBack(HandbackCause::Peer)));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn hand_back(&self) -> io::Result<()> {
        let Path::Smc(s) = &self.path else {
            return Ok(());
        };
        if !s.conn.on_tcp() {
            if let Some(e) = s.conn.runtime_gone() {
                // Its socket went with its runtime's reactor: no move can run on it, and the
                // stream fails here as at any other use.
                return Err(e);
            }
            // Bytes lent and not consumed (by the stream's own `fill_buf`, or by an owned read
            // half that may still hold them while this runs through its write half's
            // `as_ref`) count as unread: the peer sends them again on TCP, and a `consume` of
            // them skips them there. Ending the lend here instead made them consumed for the
            // move and the `consume` that came after skip nothing: read twice.
            if !s.conn.hand_back(crate::HandbackCause::Requested) {
                return Err(io::Error::other(
                    "the smc connection cannot move to its tcp socket: it ended, or its close went out",
                ));
            }
            s.conn.handed_back().await?;
        }
        // The watcher of the socket under SMC has no more to watch; once it is gone the stream
        // holds the socket alone (which `into_std` needs).
        if let Some(w) = s.stop_watcher() {
            let _ = w.await;
        }
        Ok(())
    }

    /// Turns a TCP connection into a std one, as [`TcpStream::into_std`] does (the result is
    /// in non-blocking mode).
    ///
    /// An SMC connection becomes one once it moved to its TCP socket: await
    /// [`hand_back`](SmcStream::hand_back) first (a function that does not wait cannot move it:
    /// the move needs the peer's answer). Before that its bytes are not on the socket, so this
    /// returns an error of kind [`Unsupported`](io::ErrorKind::Unsupported) and the connection is
    /// closed (as dropping the stream would). So does a TCP stream that a
    /// [`cork`](SmcStream::cork) guard still holds, and a server stream that owes its client
    /// a reply to a late in-band handshake message, or whose socket holds the start of what may
    /// be one (left there until it is whole, or taken for data), and a moved one whose bytes
    /// consumed before the move are still on their way to be skipped (a read on TCP after the
    /// move takes them off first). A server stream that has not
    /// read yet can still get such a message (from a client that proposes SMC-R in-band to a
    /// listener that cannot take it): once converted, nothing answers it, and its bytes reach
    /// the std stream as data. Read from the stream first where such clients may connect.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{Policy, SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// // Both ends are smc types on one host: the connection is SMC-D, which std cannot hold
    /// // until it moved to its TCP socket.
    /// let smc = SmcStream::connect(addr).await?;
    /// assert_eq!(smc.into_std().unwrap_err().kind(), std::io::ErrorKind::Unsupported);
    /// let smc = SmcStream::connect(addr).await?;
    /// smc.hand_back().await?;
    /// let std_stream: std::net::TcpStream = smc.into_std()?;
    /// # drop(std_stream);
    /// // A TCP connection converts as tokio's does.
    /// let tcp = SmcStream::builder().policy(Policy::TcpOnly).connect(addr).await?;
    /// let std_stream: std::net::TcpStream = tcp.into_std()?;
    /// # drop(std_stream);
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_std(self) -> io::Result<std::net::TcpStream> {
        if self.smc().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "an smc connection becomes a std TcpStream only once it moved to its tcp socket: await hand_back() first",
            ));
        }
        if self.guard().is_some_and(|g| g.holds_bytes()) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the stream owes its client a reply, or bytes that may begin an smc handshake message wait for the rest: read first, then convert",
            ));
        }
        if let Path::Smc(s) = &self.path {
            // Bytes consumed before the move, sent again by the peer: not the std stream's.
            match self.skip_now() {
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                _ => {}
            }
            if s.conn.has_tcp_skip() {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "bytes consumed before the move to tcp were still on their way to be skipped: the connection is closed (convert after a read on tcp)",
                ));
            }
        }
        if self.tcp_corks.load(Ordering::Acquire) > 0 {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "a cork guard still holds the stream"));
        }
        let tcp = self.tcp.clone();
        drop(self);
        match Arc::try_unwrap(tcp) {
            Ok(tcp) => tcp.into_std(),
            // A task still holds the socket as it ends: the watcher of a connection that moved
            // to TCP by itself (a failed link, the peer's move), stopped as this stream went.
            // The std stream takes a duplicate of the descriptor; the task closes its own, which
            // ends nothing while this one is open.
            Err(tcp) => {
                let std = socket2::SockRef::from(&*tcp).try_clone()?;
                std.set_nonblocking(true)?;
                Ok(std.into())
            }
        }
    }

    /// Takes the pending error of the TCP socket (`SO_ERROR`), as [`TcpStream::take_error`]
    /// does. Errors of an SMC connection are returned by its reads and writes instead.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// assert!(server.take_error()?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.tcp.take_error()
    }

    /// Waits for any of the readiness events in `interest`, as [`TcpStream::ready`] does.
    ///
    /// Over SMC readiness follows tokio's model: a stream is taken to be readable until a read
    /// finds nothing (then it waits for bytes, the end or an error from the peer), and
    /// writable until a write finds the peer's ring full (then it waits for room);
    /// [`READ_CLOSED`](tokio::io::Ready::READ_CLOSED) and
    /// [`WRITE_CLOSED`](tokio::io::Ready::WRITE_CLOSED) are reported once a direction has
    /// ended. As with tokio, readiness can be spurious: follow it with a `try_*` call and
    /// handle [`WouldBlock`](io::ErrorKind::WouldBlock).
    ///
    /// Any number of tasks may wait at once, on the stream or on its halves, and each is woken,
    /// as with tokio; the `poll_read_ready` and `poll_write_ready` methods keep one waker per
    /// direction (the most recent), as tokio's do.
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio::io::{AsyncWriteExt, Interest};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// client.write_all(b"hi").await?;
    /// let ready = server.ready(Interest::READABLE | Interest::WRITABLE).await?;
    /// assert!(ready.is_writable());
    /// let mut buf = [0u8; 2];
    /// loop {
    ///     server.readable().await?;
    ///     match server.try_read(&mut buf) {
    ///         Ok(n) => { assert_eq!(&buf[..n], &b"hi"[..n]); break; }
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        match self.path() {
            // From the peer's frame on, reads are the socket's, while our resend may still go
            // and for good after: a wait that asks nothing of the write side waits on the
            // socket's own readiness future, of which tokio keeps one waiter per future (the
            // connection's poll shares the socket's one waker with reads and peeks).
            PathRef::Smc(s) if !interest.is_writable() && s.conn.reads_moved_to_tcp().is_some() => {
                self.io().ready(interest).await
            }
            PathRef::Smc(s) => Ok(std::future::poll_fn(|cx| s.conn.poll_ready_future(cx, interest)).await),
            PathRef::Tcp(Some(g)) if g.is_active() && interest.is_readable() && !self.guard_assumed_readable(g) => {
                self.guarded_ready(g, interest).await
            }
            PathRef::Tcp(_) => self.io().ready(interest).await,
        }
    }

    /// [`ready`](Self::ready) while a plain client's guard may still take a handshake message
    /// off the stream: readable once the guard has decided on the head of the stream (a
    /// message taken off, or data left on the socket), which it does without a context; the
    /// wait is tokio's readiness future on the socket (every waiting task is woken, and the
    /// socket's one reader waker stays the `poll_*` caller's), or the guard's deadline for
    /// bytes that start like a message. Any other interest is the socket's own, waited for
    /// alongside.
    async fn guarded_ready(&self, g: &InbandGuard, interest: Interest) -> io::Result<Ready> {
        use std::future::Future;
        let others = interest.remove(Interest::READABLE);
        loop {
            match g.poll_settle_ready(self.io()) {
                // Decided: the socket is the stream.
                Poll::Ready(Ok(())) => return self.io().ready(interest).await,
                // A read returns the error: readable.
                Poll::Ready(Err(_)) => return Ok(Ready::READABLE),
                Poll::Pending => {}
            }
            let mut guard = std::pin::pin!(self.wait_for_guard(g, Interest::READABLE));
            let mut other = std::pin::pin!(async {
                match others {
                    Some(w) => self.io().ready(w).await,
                    None => std::future::pending().await,
                }
            });
            let woke = std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = other.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                // Bytes, the end of the wait for the rest of a prefix, or an error (which the
                // guard's look meets): look again.
                guard.as_mut().poll(cx).map(|r| r.err().map(Err))
            })
            .await;
            if let Some(r) = woke {
                // Another direction is ready; readable too if a read would return something
                // now, as tokio reports every direction that is ready.
                let mut ready = r?;
                match g.poll_settle_ready(self.io()) {
                    Poll::Ready(Err(_)) => ready |= Ready::READABLE,
                    Poll::Ready(Ok(())) => {
                        let now = std::pin::pin!(self.io().ready(Interest::READABLE));
                        if let Poll::Ready(Ok(r)) = now.poll(&mut Context::from_waker(std::task::Waker::noop())) {
                            ready |= r;
                        }
                    }
                    Poll::Pending => {}
                }
                return Ok(ready);
            }
        }
    }

    /// Waits until the guard `g` may decide on `wait`: the socket's own readiness for it (not
    /// the stream's, which is the guard's decision), or the end of the guard's wait for the rest
    /// of a possible handshake message, whichever comes first.
    async fn wait_for_guard(&self, g: &InbandGuard, wait: Interest) -> io::Result<()> {
        use std::future::Future;
        let deadline = g.partial_deadline();
        let mut socket = std::pin::pin!(self.tcp.ready(wait));
        let mut timer = std::pin::pin!(async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        });
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = socket.as_mut().poll(cx) {
                return Poll::Ready(r.map(drop));
            }
            timer.as_mut().poll(cx).map(Ok)
        })
        .await
    }

    /// Waits until the stream is readable; see [`ready`](SmcStream::ready) for what that
    /// means over SMC. Usually followed by [`try_read`](SmcStream::try_read).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use tokio::io::AsyncWriteExt;
    /// client.write_all(b"x").await?;
    /// server.readable().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn readable(&self) -> io::Result<()> {
        self.ready(Interest::READABLE).await.map(drop)
    }

    /// Polls for read readiness, as [`TcpStream::poll_read_ready`] does: `Ready(Ok(()))` when
    /// the stream is readable (see [`ready`](SmcStream::ready)); on `Pending` the waker of
    /// this call (only the most recent one) is woken when it becomes readable.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use tokio::io::AsyncWriteExt;
    /// client.write_all(b"x").await?;
    /// std::future::poll_fn(|cx| server.poll_read_ready(cx)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.path() {
            PathRef::Smc(s) => smc_ready(cx, &s.conn, Interest::READABLE),
            PathRef::Tcp(Some(g)) if g.is_active() && !self.guard_assumed_readable(g) => {
                let mut b = [0u8; 1];
                self.poll_peek(cx, &mut ReadBuf::new(&mut b)).map_ok(drop)
            }
            PathRef::Tcp(_) => self.io().poll_read_ready(cx),
        }
    }

    /// Waits until the stream is writable; see [`ready`](SmcStream::ready). Usually followed by
    /// [`try_write`](SmcStream::try_write).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// client.writable().await?;
    /// assert_eq!(client.try_write(b"hello")?, 5);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn writable(&self) -> io::Result<()> {
        self.ready(Interest::WRITABLE).await.map(drop)
    }

    /// Polls for write readiness, as [`TcpStream::poll_write_ready`] does (see
    /// [`ready`](SmcStream::ready)); on `Pending` only the most recent waker is woken.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// std::future::poll_fn(|cx| client.poll_write_ready(cx)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.path() {
            PathRef::Smc(s) => smc_ready(cx, &s.conn, Interest::WRITABLE),
            PathRef::Tcp(_) => self.io().poll_write_ready(cx),
        }
    }

    /// Reads without waiting, as [`TcpStream::try_read`] does: the number of bytes read (0 at
    /// the end of the stream, or when `buf` is empty), or [`WouldBlock`](io::ErrorKind::WouldBlock)
    /// when nothing has arrived. Over SMC the bytes come from the receive ring.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use tokio::io::AsyncWriteExt;
    /// let mut buf = [0u8; 16];
    /// assert_eq!(server.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    /// client.write_all(b"ping").await?;
    /// let n = loop {
    ///     server.readable().await?;
    ///     match server.try_read(&mut buf) {
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         r => break r?,
    ///     }
    /// };
    /// assert_eq!(&buf[..n], &b"ping"[..n]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.try_read_as(buf, self.reader())
    }

    /// [`try_read`](Self::try_read) by `reader`.
    pub(crate) fn try_read_as(&self, buf: &mut [u8], reader: Reader) -> io::Result<usize> {
        self.try_read_into(&mut ReadBuf::new(buf), reader)
    }

    /// Reads into several buffers without waiting, filling them in order, as
    /// [`TcpStream::try_read_vectored`] does; see [`try_read`](SmcStream::try_read).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use std::io::IoSliceMut;
    /// use tokio::io::AsyncWriteExt;
    /// client.write_all(b"abcdef").await?;
    /// let (mut a, mut b) = ([0u8; 3], [0u8; 3]);
    /// let mut got = 0;
    /// while got == 0 {
    ///     server.readable().await?;
    ///     match server.try_read_vectored(&mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)]) {
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         r => got = r?,
    ///     }
    /// }
    /// assert_eq!(&a[..got.min(3)], &b"abc"[..got.min(3)]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        self.try_read_vectored_as(bufs, self.reader())
    }

    /// [`try_read_vectored`](Self::try_read_vectored) by `reader`.
    pub(crate) fn try_read_vectored_as(&self, bufs: &mut [io::IoSliceMut<'_>], reader: Reader) -> io::Result<usize> {
        self.other_may_read(reader)?;
        if self.smc().is_none() && !self.guard().is_some_and(|g| g.is_active()) {
            self.skip_now()?;
            let n = self.io().try_read_vectored(bufs)?;
            self.moved(false, n);
            return Ok(n);
        }
        if let Some(s) = self.smc() {
            // The bytes there fill the buffers in order under one look, so an end that follows
            // them is left for the next read (it is reported once), whoever else reads.
            match s.conn.try_read_vectored(bufs, reader) {
                Err(e) if SmcConn::is_moved_error(&e) => {}
                r => {
                    let n = r?;
                    self.moved(false, n);
                    return Ok(n);
                }
            }
        }
        // Moved to TCP, or a server stream whose in-band guard still looks at the first bytes:
        // one buffer (a short read), or, with only empty ones, `WouldBlock` until readable.
        match bufs.iter_mut().find(|b| !b.is_empty()) {
            Some(b) => self.try_read_into(&mut ReadBuf::new(b), reader),
            None => self.try_read_into(&mut ReadBuf::new(&mut []), reader),
        }
    }

    /// Reads into the spare capacity of `buf` without waiting, advancing it, as
    /// [`TcpStream::try_read_buf`] does; see [`try_read`](SmcStream::try_read).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use tokio::io::AsyncWriteExt;
    /// client.write_all(b"ping").await?;
    /// let mut buf = Vec::with_capacity(16);
    /// while buf.is_empty() {
    ///     server.readable().await?;
    ///     match server.try_read_buf(&mut buf) {
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         r => { r?; }
    ///     }
    /// }
    /// assert!(b"ping".starts_with(&buf));
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_read_buf<B: bytes::BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        self.try_read_buf_as(buf, self.reader())
    }

    /// [`try_read_buf`](Self::try_read_buf) by `reader`.
    pub(crate) fn try_read_buf_as<B: bytes::BufMut>(&self, buf: &mut B, reader: Reader) -> io::Result<usize> {
        let dst = buf.chunk_mut();
        // SAFETY: UninitSlice is a slice of possibly uninitialized bytes; viewing it as
        // `[MaybeUninit<u8>]` (same layout) lets ReadBuf track what gets initialized. Nothing
        // reads the bytes before they are written.
        let dst = unsafe { &mut *(dst as *mut _ as *mut [std::mem::MaybeUninit<u8>]) };
        let mut rb = ReadBuf::uninit(dst);
        let n = self.try_read_into(&mut rb, reader)?;
        // SAFETY: the read initialized the first `n` bytes of the chunk (ReadBuf's filled part).
        unsafe { buf.advance_mut(n) };
        Ok(n)
    }

    /// The SMC side of [`AsyncBufRead::poll_fill_buf`] (see [`SmcConn::poll_lend`]); `None` on
    /// the TCP path.
    pub(crate) fn poll_lend(
        &self,
        cx: &mut Context<'_>,
        scratch: &mut Vec<u8>,
        may_lend: bool,
    ) -> Option<Poll<io::Result<Lent>>> {
        let s = self.smc()?;
        smc_coop(cx, |cx| s.conn.poll_lend(cx, scratch, may_lend))
    }

    /// Ends what the SMC connection lent through a handle that is gone (see
    /// [`SmcConn::give_back`]).
    pub(crate) fn give_back(&self) {
        if let Path::Smc(s) = &self.path {
            s.conn.give_back();
        }
    }

    /// Consumes `amt` bytes of what the SMC connection lent (see [`SmcConn::consume`]; those the
    /// stream's move to TCP counted as unread are skipped there).
    pub(crate) fn consume_lent(&self, amt: usize) {
        let Path::Smc(s) = &self.path else { return };
        let n = s.conn.consume(amt);
        self.moved(false, n);
    }

    /// On the TCP path of a stream that moved there: takes off the socket the bytes a
    /// `consume` skipped ([`SmcConn::claim_tcp_skip`]), and, for a consuming read, tells the
    /// connection that the stream now reads on TCP (a `consume` of what was handed out before
    /// the move no longer refers to the head of the stream). Without a context it does not
    /// wait (`WouldBlock`).
    fn poll_skip(&self, cx: Option<&mut Context<'_>>, consuming: bool) -> Poll<io::Result<()>> {
        let Path::Smc(s) = &self.path else { return Poll::Ready(Ok(())) };
        if consuming {
            s.conn.forget_voided();
        }
        let mut cx = cx;
        loop {
            let claimed = s.conn.claim_tcp_skip(1 << 20);
            if claimed == 0 {
                return Poll::Ready(Ok(()));
            }
            let want = usize::try_from(claimed).unwrap_or(1 << 20);
            let r = self.io().try_io(Interest::READABLE, || self.drop_queued(want));
            let took = match &r {
                Ok(n) => *n as u64,
                Err(_) => 0,
            };
            if took < claimed {
                s.conn.unclaim_tcp_skip(claimed - took);
            }
            match r {
                Ok(0) => {
                    // The stream ended within them: the read that follows sees the end.
                    s.conn.clear_tcp_skip();
                    return Poll::Ready(Ok(()));
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match cx.as_deref_mut() {
                    Some(cx) => ready!(self.io().poll_read_ready(cx))?,
                    None => return Poll::Ready(Err(e)),
                },
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// [`poll_skip`](Self::poll_skip) for an operation that does not wait, before it reads:
    /// `WouldBlock` while bytes to skip have not arrived.
    fn skip_now(&self) -> io::Result<()> {
        match self.poll_skip(None, true) {
            Poll::Ready(r) => r,
            // Without a context it never waits.
            Poll::Pending => Ok(()),
        }
    }

    /// One read that does not wait, into `rb`.
    pub(crate) fn try_read_into(&self, rb: &mut ReadBuf<'_>, reader: Reader) -> io::Result<usize> {
        self.other_may_read(reader)?;
        let n = match self.path() {
            PathRef::Smc(s) => match s.conn.try_read(rb, reader) {
                // Moved (or moving, with the peer's stream already on the socket): a read of
                // the socket, as on the TCP path (an SMC stream has no in-band guard).
                Err(e) if SmcConn::is_moved_error(&e) => self.try_read_plain(rb)?,
                r => r?,
            },
            PathRef::Tcp(Some(g)) if g.is_active() => {
                // No context: a read that finds nothing leaves the socket's one reader waker
                // alone, as tokio's `try_read` does.
                match g.poll_settle(None, self.io()) {
                    Poll::Ready(r) => r?,
                    Poll::Pending => return Err(io::ErrorKind::WouldBlock.into()),
                }
                self.try_read_plain(rb)?
            }
            PathRef::Tcp(_) => self.try_read_plain(rb)?,
        };
        self.moved(false, n);
        Ok(n)
    }

    /// One read of the TCP socket that does not wait, into `rb` (no guard in the way).
    fn try_read_plain(&self, rb: &mut ReadBuf<'_>) -> io::Result<usize> {
        self.skip_now()?;
        self.recv_into(rb)
    }

    /// One `recv` of the TCP socket into `rb`'s unfilled part, through the socket's (assumed)
    /// readiness, as tokio's `try_read` does: the bytes it took.
    fn recv_into(&self, rb: &mut ReadBuf<'_>) -> io::Result<usize> {
        // SAFETY: the unfilled part of a ReadBuf is valid for writes of its length; recv
        // writes at most that many bytes and they are marked initialized only after it
        // returned their count.
        let unfilled = unsafe { rb.unfilled_mut() };
        let fd = self.tcp.as_raw_fd();
        let n = self.io().try_io(Interest::READABLE, || {
            // SAFETY: `fd` is the stream's open socket; pointer and length describe the
            // unfilled region borrowed above.
            let n = unsafe { libc::recv(fd, unfilled.as_mut_ptr().cast(), unfilled.len(), 0) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        })?;
        // SAFETY: recv initialized the first `n` unfilled bytes.
        unsafe { rb.assume_init(n) };
        rb.advance(n);
        Ok(n)
    }

    /// Drops up to `len` bytes queued on the TCP socket without copying them (`recv` with
    /// `MSG_TRUNC`): how many it dropped, 0 at the end of the stream.
    fn drop_queued(&self, len: usize) -> io::Result<usize> {
        // SAFETY: the descriptor is the stream's open socket; with MSG_TRUNC a TCP socket drops
        // up to `len` queued bytes and writes nothing, so no buffer is needed (tcp(7)).
        let n = unsafe { libc::recv(self.tcp.as_raw_fd(), std::ptr::null_mut(), len, libc::MSG_TRUNC) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Takes up to `len` bytes off the stream without waiting, for a `consume` of bytes a peek
    /// handed out: on plain TCP the kernel drops them (`MSG_TRUNC`: no copy); where the path
    /// holds bytes of its own (an active in-band guard, or SMC) they are read into `scratch`,
    /// which holds at least `len` bytes.
    pub(crate) fn try_discard(&self, len: usize, scratch: &mut [u8]) -> io::Result<usize> {
        match self.path() {
            PathRef::Tcp(g) if !g.is_some_and(|g| g.is_active()) => {
                self.skip_now()?;
                let n = self.io().try_io(Interest::READABLE, || self.drop_queued(len))?;
                self.moved(false, n);
                Ok(n)
            }
            _ => {
                let mut rb = ReadBuf::new(&mut scratch[..len]);
                self.try_read_into(&mut rb, Reader::Lender)
            }
        }
    }

    /// Writes without waiting, as [`TcpStream::try_write`] does: the number of bytes written
    /// (possibly fewer than `buf` holds), or [`WouldBlock`](io::ErrorKind::WouldBlock) when there
    /// is no room. Over SMC the bytes go into the peer's ring and are announced at once (a held
    /// [`cork`](SmcStream::cork) guard defers that, as it does for writes).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// client.writable().await?;
    /// let n = client.try_write(b"hello")?;
    /// assert_eq!(n, 5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let n = match self.path() {
            PathRef::Smc(s) => match s.conn.try_write(buf) {
                Err(e) if SmcConn::is_moved_error(&e) => return self.try_write(buf),
                r => r?,
            },
            PathRef::Tcp(Some(g)) if g.is_active() => {
                // No context: a write that cannot go now leaves the socket's one writer waker
                // alone, as tokio's `try_write` does.
                match g.poll_before_write(None, self.io()) {
                    Poll::Ready(r) => r?,
                    Poll::Pending => return Err(io::ErrorKind::WouldBlock.into()),
                }
                self.io().try_write(buf)?
            }
            PathRef::Tcp(_) => self.io().try_write(buf)?,
        };
        self.moved(true, n);
        Ok(n)
    }

    /// Writes from several buffers without waiting, as [`TcpStream::try_write_vectored`] does;
    /// see [`try_write`](SmcStream::try_write).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use std::io::IoSlice;
    /// client.writable().await?;
    /// let n = client.try_write_vectored(&[IoSlice::new(b"hel"), IoSlice::new(b"lo")])?;
    /// assert_eq!(n, 5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let n = match self.path() {
            PathRef::Smc(s) => match s.conn.try_write_vectored(bufs) {
                Err(e) if SmcConn::is_moved_error(&e) => return self.try_write_vectored(bufs),
                r => r?,
            },
            PathRef::Tcp(Some(g)) if g.is_active() => {
                match g.poll_before_write(None, self.io()) {
                    Poll::Ready(r) => r?,
                    Poll::Pending => return Err(io::ErrorKind::WouldBlock.into()),
                }
                self.io().try_write_vectored(bufs)?
            }
            PathRef::Tcp(_) => self.io().try_write_vectored(bufs)?,
        };
        self.moved(true, n);
        Ok(n)
    }

    /// Runs `f` on the TCP socket if it is ready for `interest`, as [`TcpStream::try_io`] does:
    /// for system calls tokio has no method for (`recvmsg` with flags, say).
    ///
    /// **On an SMC connection this returns an error of kind
    /// [`Unsupported`](io::ErrorKind::Unsupported)** and does not call `f`: the connection's
    /// bytes are not on the TCP socket, so `f`'s reads would find nothing and its writes would
    /// bypass the stream (and break the SMC connection). Check
    /// [`transport`](SmcStream::transport) first.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{Policy, SmcListener, SmcStream};
    /// use tokio::io::Interest;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let tcp = SmcStream::builder().policy(Policy::TcpOnly).connect(listener.local_addr()?).await?;
    /// tcp.writable().await?;
    /// let n = tcp.try_io(Interest::WRITABLE, || {
    ///     use std::os::fd::AsRawFd;
    ///     // SAFETY: a valid socket and buffer.
    ///     let n = unsafe { libc::send(tcp.as_raw_fd(), b"x".as_ptr().cast(), 1, 0) };
    ///     if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
    /// })?;
    /// assert_eq!(n, 1);
    ///
    /// let smc = SmcStream::connect(listener.local_addr()?).await?;
    /// let err = smc.try_io(Interest::READABLE, || Ok(())).unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        if self.smc().is_some() {
            return Err(raw_io_unsupported());
        }
        if interest.is_readable() {
            // The application's own reads must not see bytes it consumed before a move.
            self.skip_now()?;
        }
        if self.poll_raw_io_guard(interest)?.is_some() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.io().try_io(interest, f)
    }

    /// Settles a plain client's guard before the application's own system calls on the
    /// socket, which it cannot look into: for writes, a Decline owed goes first (and later
    /// handshake messages are no longer answered); for reads, a handshake message that
    /// arrived is taken off first ([`InbandGuard::poll_settle`]). `None`: the socket is the
    /// stream for `interest`; else the direction to wait for first (the caller waits for the
    /// socket, or answers `WouldBlock`). Asked for both directions, a guard with nothing to
    /// decide on (the socket empty for reading) lets a call go on for its writes.
    fn poll_raw_io_guard(&self, interest: Interest) -> io::Result<Option<Interest>> {
        let Some(g) = self.guard().filter(|g| g.is_active()) else { return Ok(None) };
        if interest.is_writable() {
            match g.poll_before_write(None, self.io()) {
                Poll::Ready(r) => r?,
                Poll::Pending => return Ok(Some(Interest::WRITABLE)),
            }
        }
        if interest.is_readable() {
            match g.poll_settle(None, self.io()) {
                Poll::Ready(r) => r?,
                Poll::Pending if interest.is_writable() && !g.holds_bytes() => {}
                Poll::Pending => return Ok(Some(Interest::READABLE)),
            }
        }
        Ok(None)
    }

    /// Waits for `interest` and runs `f` on the TCP socket until it does not answer
    /// `WouldBlock`, as [`TcpStream::async_io`] does. **On an SMC connection it returns an
    /// error of kind [`Unsupported`](io::ErrorKind::Unsupported)** without calling `f`; see
    /// [`try_io`](SmcStream::try_io).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use tokio::io::Interest;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// if stream.transport().is_smc() {
    ///     let err = stream.async_io(Interest::READABLE, || Ok(())).await.unwrap_err();
    ///     assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn async_io<R>(&self, interest: Interest, mut f: impl FnMut() -> io::Result<R>) -> io::Result<R> {
        if self.smc().is_some() {
            return Err(raw_io_unsupported());
        }
        if interest.is_readable() {
            // Without the `poll_*` methods' one reader waker: a readiness future of the socket.
            while let Poll::Ready(Err(e)) = self.poll_skip(None, true) {
                if e.kind() != io::ErrorKind::WouldBlock {
                    return Err(e);
                }
                self.tcp.readable().await?;
            }
        }
        let mut first = true;
        while let Some(wait) = self.poll_raw_io_guard(interest)? {
            let empty = !self.guard().is_some_and(InbandGuard::holds_bytes);
            if std::mem::take(&mut first) && wait == Interest::READABLE && empty {
                // As tokio's first poll, which tries the closure before it waits: the guard
                // has just found the socket empty, so the closure finds nothing either, save
                // bytes that land in between (a handshake message there would reach it; a
                // window of a system call's length).
                // Called directly: the guard's look cleared the socket's readiness, which
                // tokio's `try_io` would answer with `WouldBlock` without calling it.
                match f() {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => return r,
                }
            }
            if let Some(g) = self.guard() {
                self.wait_for_guard(g, wait).await?;
            }
        }
        self.io().async_io(interest, f).await
    }

    /// The `TCP_QUICKACK` option of the TCP socket, as [`TcpStream::quickack`] reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let _on: bool = client.quickack()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn quickack(&self) -> io::Result<bool> {
        self.tcp.quickack()
    }

    /// Sets `TCP_QUICKACK` on the TCP socket, as [`TcpStream::set_quickack`] does. Over SMC the
    /// TCP connection carries no data, so it changes nothing there.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// client.set_quickack(true)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_quickack(&self, quickack: bool) -> io::Result<()> {
        self.tcp.set_quickack(quickack)
    }

    /// The `SO_LINGER` option of the TCP socket, as [`TcpStream::linger`] reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// assert_eq!(client.linger()?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        socket2::SockRef::from(&*self.tcp).linger()
    }

    /// Sets `SO_LINGER` on the TCP socket, as [`TcpStream::set_linger`] does (deprecated there
    /// too: a non-zero linger makes a drop block the thread until the data is sent or the time
    /// runs out). Over SMC, data written is in the peer's ring already, so a drop does not
    /// block for it; a zero linger aborts the connection on drop (see
    /// [`set_zero_linger`](SmcStream::set_zero_linger)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # #[allow(deprecated)]
    /// client.set_linger(Some(std::time::Duration::from_secs(1)))?;
    /// assert_eq!(client.linger()?, Some(std::time::Duration::from_secs(1)));
    /// # Ok(())
    /// # }
    /// ```
    #[deprecated = "`SO_LINGER` causes the socket to block the thread on drop"]
    pub fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        self.store_linger(dur)
    }

    /// Sets a zero `SO_LINGER`, as [`TcpStream::set_zero_linger`] does: dropping the stream
    /// then aborts the connection instead of closing it in order. On TCP the peer gets a reset;
    /// over SMC it gets the SMC abort (its reads fail with
    /// [`ConnectionReset`](io::ErrorKind::ConnectionReset)) and the TCP reset under it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// server.set_zero_linger()?;
    /// assert_eq!(server.linger()?, Some(std::time::Duration::ZERO));
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_zero_linger(&self) -> io::Result<()> {
        self.store_linger(Some(Duration::ZERO))
    }

    /// The `IP_TTL` of the TCP socket, as [`TcpStream::ttl`] reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// assert!(client.ttl()? > 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn ttl(&self) -> io::Result<u32> {
        self.tcp.ttl()
    }

    /// Sets `IP_TTL` on the TCP socket, as [`TcpStream::set_ttl`] does. Over SMC the TCP
    /// connection carries no data after the handshake; SMC-R traffic is not IP-routed by it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// client.set_ttl(64)?;
    /// assert_eq!(client.ttl()?, 64);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.tcp.set_ttl(ttl)
    }

    fn moved(&self, sent: bool, n: usize) {
        self.ctx.counters().bytes(self.transport(), sent, n);
        // Only adaptive fallback reads the per-stream total: keep the hot path to one atomic.
        if self.adaptive.is_some() {
            self.moved.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    fn poll_read_io(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Some(s) = self.smc() {
            if let Some(r) = smc_coop(cx, |cx| s.conn.poll_read(cx, buf)) {
                return r;
            }
        }
        ready!(self.poll_skip(Some(cx), true))?;
        if let Some(g) = self.guard() {
            ready!(g.poll_settle(Some(cx), self.io()))?;
        }
        loop {
            ready!(self.io().poll_read_ready(cx))?;
            match self.recv_into(buf) {
                Ok(_) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_write_io(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(s) = self.smc() {
            if let Some(r) = smc_coop(cx, |cx| s.conn.poll_write(cx, data)) {
                return r;
            }
        }
        if let Some(g) = self.guard() {
            ready!(g.poll_before_write(Some(cx), self.io()))?;
        }
        loop {
            ready!(self.io().poll_write_ready(cx))?;
            match self.io().try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                res => return Poll::Ready(res),
            }
        }
    }

    fn poll_write_vectored_io(&self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if let Some(s) = self.smc() {
            if let Some(r) = smc_coop(cx, |cx| s.conn.poll_write_vectored(cx, bufs)) {
                return r;
            }
        }
        if let Some(g) = self.guard() {
            ready!(g.poll_before_write(Some(cx), self.io()))?;
        }
        loop {
            ready!(self.io().poll_write_ready(cx))?;
            match self.io().try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                res => return Poll::Ready(res),
            }
        }
    }

    pub(crate) fn poll_flush_priv(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.path() {
            // Announces everything written, cork or not, and waits until it is delivered (out
            // of this process's hands, as TCP's bytes are once written).
            PathRef::Smc(s) => match unless_moved(s.conn.poll_flush(cx)) {
                Some(r) => r,
                None => Poll::Ready(crate::net::cork::tcp_push(&self.tcp, &self.tcp_corks)),
            },
            // TCP sends at once (subject to Nagle and TCP_CORK): a flush under a cork pushes.
            PathRef::Tcp(_) => Poll::Ready(crate::net::cork::tcp_push(&self.tcp, &self.tcp_corks)),
        }
    }

    /// Corks the stream until the returned guard drops: writes are collected and pushed to the
    /// peer together (see [`CorkGuard`]). Guards nest; the last one to drop pushes.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// let cork = client.cork();
    /// client.write_all(b"GET / HTTP/1.1\r\n").await?;
    /// client.write_all(b"host: a\r\n\r\n").await?;
    /// drop(cork); // both writes reach the peer in one push
    /// let mut req = [0u8; 27];
    /// server.read_exact(&mut req).await?;
    /// assert_eq!(&req, b"GET / HTTP/1.1\r\nhost: a\r\n\r\n");
    /// # Ok(())
    /// # }
    /// ```
    pub fn cork(&self) -> CorkGuard {
        match self.path() {
            PathRef::Smc(s) => CorkGuard::smc(s.conn.clone()),
            PathRef::Tcp(_) => CorkGuard::tcp(self.tcp.clone(), self.tcp_corks.clone()),
        }
    }

    /// Sends up to `len` bytes of `file` starting at `offset`, and resolves to the number of
    /// bytes sent, without a user-space buffer: over shared memory the file is read straight
    /// into the peer's receive ring (one `pread` per chunk, one copy), over TCP with
    /// `sendfile(2)`. (On AMD CPUs of family 0x19 and later, where the kernel's copy is slow
    /// when the ring position lies 1 to 31 bytes past the file offset modulo 4096, such a
    /// chunk goes through a buffer of the calling thread instead: two fast copies. The buffer,
    /// 68 KiB, is kept for the thread's life once used.) All chunks but the last are corked; the last one pushes (the kernel's
    /// `MSG_SENDPAGE_NOTLAST`), unless a [`cork`](SmcStream::cork) guard is held, in which case
    /// the guard's drop pushes.
    ///
    /// - A file shorter than `offset + len` sends what there is: the result is smaller than
    ///   `len` (0 when `offset` is at or past the end). A file that shrinks while it is sent
    ///   ends the same way, at its new end. Over shared memory each byte is copied when it is
    ///   read from the file; over TCP, `sendfile(2)` shares page-cache pages with the socket, so
    ///   bytes still queued when the file changes may carry the new content, as with the
    ///   kernel's own sendfile.
    /// - `file` must be a regular file (`InvalidInput` otherwise: pipes and sockets have no
    ///   offsets to read at). The check is made once per descriptor in a row: a stream that
    ///   serves the same open file again does not ask the kernel again.
    /// - The file is read on the calling task; a file that is not in the page cache blocks it
    ///   while the disk reads, as `sendfile(2)` does in a non-blocking server.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use tokio::io::AsyncReadExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let path = std::env::temp_dir().join(format!("smc-sendfile-doc-{}", std::process::id()));
    /// std::fs::write(&path, b"0123456789")?;
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let p = path.clone();
    /// tokio::spawn(async move {
    ///     let (mut conn, _) = listener.accept().await?;
    ///     let file = std::fs::File::open(&p)?;
    ///     let sent = conn.sendfile(&file, 2, 100).await?;
    ///     assert_eq!(sent, 8); // the file ends before offset + len
    ///     std::io::Result::Ok(())
    /// });
    /// let mut s = SmcStream::connect(addr).await?;
    /// let mut got = Vec::new();
    /// s.read_to_end(&mut got).await?;
    /// assert_eq!(got, b"23456789");
    /// # std::fs::remove_file(&path)?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn sendfile<F: AsFd>(&mut self, file: &F, offset: u64, len: u64) -> io::Result<u64> {
        self.sendfile_priv(file.as_fd(), offset, len).await
    }

    pub(crate) async fn sendfile_priv(&self, file: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<u64> {
        let fd = file.as_raw_fd();
        if self.sendfile_checked.load(Ordering::Relaxed) != fd {
            if !sys::is_regular_file(file)? {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "sendfile needs a regular file"));
            }
            self.sendfile_checked.store(fd, Ordering::Relaxed);
        }
        let cork = self.cork();
        let (mut at, mut left) = (offset, len);
        let res = match self.path() {
            PathRef::Smc(s) => {
                match std::future::poll_fn(|cx| s.conn.poll_sendfile(cx, file, &mut at, &mut left)).await {
                    // Moved to TCP in the middle: the rest goes there (`at`, `left` say where).
                    Err(e) if SmcConn::is_moved_error(&e) => self.tcp_sendfile(file, &mut at, &mut left).await,
                    r => r,
                }
            }
            PathRef::Tcp(_) => self.tcp_sendfile(file, &mut at, &mut left).await,
        };
        drop(cork);
        // Counted as bytes written on this transport, as a write's are (what moved before an
        // error moved too): adaptive fallback then sees a sendfile upload for what it is.
        self.moved(true, usize::try_from(at - offset).unwrap_or(usize::MAX));
        res.map(|()| at - offset)
    }

    async fn tcp_sendfile(&self, file: BorrowedFd<'_>, at: &mut u64, left: &mut u64) -> io::Result<()> {
        if let Some(g) = self.guard() {
            std::future::poll_fn(|cx| g.poll_before_write(Some(cx), self.io())).await?;
        }
        while *left > 0 {
            // sendfile(2) moves at most 0x7ffff000 bytes per call.
            let count = usize::try_from(*left).unwrap_or(usize::MAX).min(0x7fff_f000);
            self.io().ready(Interest::WRITABLE).await?;
            match self.io().try_io(Interest::WRITABLE, || sys::sendfile(self.tcp.as_fd(), file, at, count)) {
                Ok(0) => *left = 0, // end of file
                Ok(n) => *left -= n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(crate) fn poll_shutdown_priv(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(s) = self.smc() {
            // The close is delivered before the shutdown resolves, as a flush's bytes are.
            if let Some(r) = unless_moved(s.conn.poll_shutdown(cx)) {
                return r;
            }
        }
        if let Some(g) = self.guard() {
            // A Decline still owed goes out before our FIN.
            ready!(g.poll_before_write(Some(cx), self.io()))?;
        }
        Poll::Ready(self.shutdown_priv())
    }

    /// Shuts the write side down without waiting (for a write half dropped unshut).
    pub(crate) fn shutdown_priv(&self) -> io::Result<()> {
        if let Some(s) = self.smc() {
            match s.conn.shutdown() {
                Err(e) if SmcConn::is_moved_error(&e) => {}
                r => return r,
            }
        }
        if let Some(g) = self.guard() {
            // As before any write of the application's: a Proposal already waiting is
            // answered before the end goes out, and none is answered after it (best effort: a
            // Decline that cannot go now is not waited for).
            let _ = g.poll_before_write(None, self.io());
        }
        match socket2::SockRef::from(&self.tcp).shutdown(Shutdown::Write) {
            // Shutting down a connection the peer already reset is not an error for the caller.
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        }
    }
}

impl AsyncRead for SmcStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.poll_read_priv(cx, buf)
    }
}

/// Received bytes without a copy where the stream is on shared memory with a peer of our own
/// uid: [`poll_fill_buf`](AsyncBufRead::poll_fill_buf) lends the receive ring's bytes where they
/// lie, and [`consume`](AsyncBufRead::consume) frees them for the peer. Elsewhere (TCP, RDMA, a
/// peer of another uid, whose bytes could change while lent) it peeks into a buffer of the
/// stream's own and `consume` takes the bytes off the queue, so the stream needs no
/// [`BufReader`](tokio::io::BufReader) either way. Reads, peeks and `try_read` mix freely with
/// it: the bytes stay queued until consumed.
///
/// It is implemented on `&mut SmcStream`, not on `SmcStream`: there,
/// [`AsyncBufReadExt::split`](tokio::io::AsyncBufReadExt::split) would take the place of
/// [`SmcStream::split`] in code that imports the trait, which compiles with a `TcpStream` (it has
/// no `AsyncBufRead`). Call it as `(&mut stream).fill_buf()`, or split the stream:
/// [`OwnedReadHalf`] lends as well.
///
/// While the application holds lent bytes, the peer cannot reuse that part of its ring: the
/// connection holds back its abort, or its answer to the peer's, until they are consumed or the
/// stream is read again (after a move to TCP the peer never reuses the ring). Hold lent bytes
/// for the time it takes to parse them.
///
/// # Examples
///
/// ```
/// use smc_tokio::{SmcListener, SmcStream};
/// use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// tokio::spawn(async move {
///     let (mut c, _) = listener.accept().await?;
///     c.write_all(b"GET /\nHost: example\n\n").await
/// });
/// let mut s = SmcStream::connect(addr).await?;
/// // Parse lines where they lie: no copy over shared memory.
/// let mut rd = &mut s;
/// let mut lengths = Vec::new();
/// // Only a line split between two fills (at the ring's end, say) is copied.
/// let mut partial = Vec::new();
/// loop {
///     let buf = rd.fill_buf().await?;
///     if buf.is_empty() {
///         break; // the end of the stream
///     }
///     let Some(end) = buf.iter().position(|&b| b == b'\n') else {
///         partial.extend_from_slice(buf);
///         let n = buf.len();
///         rd.consume(n);
///         continue;
///     };
///     let len = partial.len() + end;
///     lengths.push(len);
///     partial.clear();
///     rd.consume(end + 1);
///     if len == 0 {
///         break; // the empty line ends the header
///     }
/// }
/// assert_eq!(lengths, [5, 13, 0]);
/// # Ok(())
/// # }
/// ```
impl AsyncBufRead for &mut SmcStream {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this: &mut SmcStream = self.get_mut();
        // The state is taken out while the stream is read through a shared borrow (its scratch
        // buffer's bytes stay where they are), then put back before the bytes are lent from it.
        let mut lend = this.lend.take().unwrap_or_default();
        let r = lend.poll_fill(this, cx, true);
        let lend = this.lend.insert(lend);
        let lent = ready!(r)?;
        // SAFETY: `lent` is what the fill just returned; the returned slice borrows the stream
        // exclusively, so nothing reads it until the slice is gone, and the stream keeps its
        // connection alive.
        Poll::Ready(Ok(unsafe { lend.bytes(lent) }))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this: &mut SmcStream = self.get_mut();
        if let Some(mut lend) = this.lend.take() {
            lend.consume(this, amt);
            this.lend = Some(lend);
        }
    }
}

impl AsyncWrite for SmcStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_priv(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored_priv(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush_priv(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_shutdown_priv(cx)
    }
}

impl TryFrom<std::net::TcpStream> for SmcStream {
    type Error = io::Error;

    /// See [`SmcStream::from_std`].
    fn try_from(stream: std::net::TcpStream) -> io::Result<SmcStream> {
        SmcStream::from_std(stream)
    }
}

impl AsFd for SmcStream {
    /// The underlying TCP socket, for socket options.
    ///
    /// **Over SMC this socket is idle: the connection's bytes do not pass through it.** Waiting
    /// on its readiness (with `AsyncFd`, `epoll`, `poll`) never reports the data an SMC peer
    /// sends, and reading or writing it bypasses the stream and breaks the SMC connection. Use
    /// the stream's own [`ready`](SmcStream::ready), [`readable`](SmcStream::readable) and
    /// [`writable`](SmcStream::writable) instead, which work on every transport.
    fn as_fd(&self) -> BorrowedFd<'_> {
        // Any option may be set through it: SO_LINGER is read at drop from now on.
        self.linger.store(LINGER_UNKNOWN, Ordering::Relaxed);
        self.tcp.as_fd()
    }
}

impl AsRawFd for SmcStream {
    /// The underlying TCP socket; see [`AsFd for SmcStream`](#impl-AsFd-for-SmcStream): over
    /// SMC it carries none of the connection's bytes.
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

/// Settings for [`SmcStream`] connections.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use smc_tokio::{Policy, SmcListener, SmcStream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// tokio::spawn(async move { listener.accept().await });
///
/// let stream = SmcStream::builder()
///     .policy(Policy::Auto)
///     .handshake_timeout(Duration::from_millis(500))
///     .connect(addr)
///     .await?;
/// # drop(stream);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SmcStreamBuilder {
    o: Overrides,
    ctx: SmcContext,
}

impl Default for SmcStreamBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl SmcStreamBuilder {
    /// Default settings: [`Policy::Auto`],
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`](crate::config::DEFAULT_HANDSHAKE_TIMEOUT),
    /// [`DEFAULT_NEGATIVE_CACHE_TTL`](crate::config::DEFAULT_NEGATIVE_CACHE_TTL).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{config, SmcListener, SmcStreamBuilder};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // Nothing set: the process-wide settings (the defaults, unless `SMC_TOKIO_*` says otherwise).
    /// let builder = SmcStreamBuilder::new();
    /// assert_eq!(builder.settings(), config::global().get());
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// assert!(builder.connect(listener.local_addr()?).await?.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        Self { o: Overrides::default(), ctx: SmcContext::global().clone() }
    }

    /// The context the connection belongs to: the link groups it may share, the settings this
    /// builder's values override, its negative cache and counters. Without it,
    /// [`Context::global`](crate::Context::global).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{config::Settings, Context, Policy, SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// // A context whose connections stay on TCP, whatever the process-wide settings say.
    /// let mut settings = Settings::default();
    /// settings.policy = Policy::TcpOnly;
    /// let tcp_only = Context::with_settings(settings);
    /// let stream = SmcStream::builder().context(&tcp_only).connect(listener.local_addr()?).await?;
    /// assert!(!stream.transport().is_smc());
    /// assert_eq!(tcp_only.stats().client.fallback_disabled, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn context(mut self, ctx: &SmcContext) -> Self {
        self.ctx = ctx.clone();
        self
    }

    /// Shared-memory (SMC-D) settings for this connection's side.
    ///
    /// Only the fields `config`'s setters set override: every other field keeps its
    /// process-wide value (the `SMC_TOKIO_*` variables, or [`config::global`](crate::config::global)'s update), so
    /// `ShmConfig::default().rmb_size(64 << 10)` leaves `SMC_TOKIO_SHM=0` in force.
    ///
    /// Connections of a context to one server share a link group, which the first of them
    /// shapes: its ring size (`rmb_size`, `rmb_max`), rings per group, busy polling, idle
    /// timeout and polling window hold for every later connection of the group, whatever their
    /// builders say. Whether to use shared memory at all (`enabled`) and whom to trust
    /// (`allow_uid`) are each connection's own. A connection that needs other ring sizes uses
    /// another [`Context`](crate::Context).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::ShmConfig;
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// // Receive rings of 64 KiB on this side of the connection.
    /// let builder = SmcStream::builder().shm(ShmConfig::default().rmb_size(64 << 10));
    /// assert_eq!(builder.settings().shm.get_rmb_size(), 64 << 10);
    /// assert!(builder.connect(listener.local_addr()?).await?.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn shm(mut self, config: ShmConfig) -> Self {
        self.o.shm = Some(config);
        self
    }

    /// RDMA (SMC-R) settings for connections made by this builder (with the `rdma` feature).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::RdmaConfig;
    /// use smc_tokio::{SmcListener, SmcStream, Transport};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// // No SMC-R from this client: a listener on this host is reached over shared memory.
    /// let builder = SmcStream::builder().rdma(RdmaConfig::default().enabled(false));
    /// assert!(!builder.settings().rdma.is_enabled());
    /// let stream = builder.connect(listener.local_addr()?).await?;
    /// assert_eq!(stream.transport(), Transport::SmcD);
    /// # Ok(())
    /// # }
    /// ```
    pub fn rdma(mut self, config: crate::config::RdmaConfig) -> Self {
        self.o.rdma = Some(config);
        self
    }

    /// When to try SMC, and what to do when it cannot be used (see [`Policy`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::{Policy, SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// // Require SMC: where the connection would fall back to TCP, it fails instead.
    /// let strict = SmcStream::builder().policy(Policy::Never).handshake_timeout(Duration::from_millis(500));
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// assert!(strict.connect(listener.local_addr()?).await?.transport().is_smc());
    /// // A plain TCP server never answers the proposal.
    /// let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// assert!(strict.connect(plain.local_addr()?).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.o.policy = Some(policy);
        self
    }

    /// Destinations to negotiate SMC with in-band, on the TCP stream itself: the way to SMC-R on
    /// other hosts. Only servers known to run smc-tokio belong here: any other server would
    /// read the Proposal as its first bytes (the connection is then closed and made again as
    /// plain TCP). Same-host listeners need no entry; they are found at their door.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcStream;
    ///
    /// let builder = SmcStream::builder().inband_peers("10.0.0.0/8".parse().unwrap());
    /// assert!(builder.settings().inband_peers.contains("10.1.2.3".parse().unwrap()));
    /// ```
    pub fn inband_peers(mut self, peers: InbandPeers) -> Self {
        self.o.inband_peers = Some(peers);
        self
    }

    /// Bound on each step of the handshake, taken within
    /// [`MIN_HANDSHAKE_TIMEOUT`](crate::config::MIN_HANDSHAKE_TIMEOUT) and
    /// [`MAX_TIMEOUT`](crate::config::MAX_TIMEOUT). An in-band peer that has not answered by then is
    /// taken for a plain TCP server that waits for its client: the connection is closed, the
    /// server is left alone for a while (briefly at first: it may only be busy), and a plain
    /// TCP connection is made. At a same-host listener's door the same bound holds for each
    /// answer, except the last: after its Confirm the client waits for the server's final
    /// word (see [`ClientHandshake::has_confirmed`](crate::proto::handshake::ClientHandshake::has_confirmed)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let builder = SmcStream::builder().handshake_timeout(Duration::from_millis(500));
    /// assert_eq!(builder.settings().handshake_timeout, Duration::from_millis(500));
    /// // On one host the handshake takes far less.
    /// assert!(builder.connect(listener.local_addr()?).await?.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.o.handshake_timeout = Some(timeout);
        self
    }

    /// How long a server that answered as plain TCP is remembered (0 disables the cache).
    ///
    /// # Examples
    ///
    /// With the cache off, not even adaptive fallback sets a server aside.
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::{config::ADAPTIVE_STRIKES, SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let builder = SmcStream::builder().adaptive_min_bytes(1024).negative_cache_ttl(Duration::ZERO);
    /// assert_eq!(builder.settings().negative_cache_ttl, Duration::ZERO);
    /// for _ in 0..=ADAPTIVE_STRIKES {
    ///     // Each connection moves nothing, and the next one still gets SMC.
    ///     assert!(builder.connect(listener.local_addr()?).await?.transport().is_smc());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn negative_cache_ttl(mut self, ttl: Duration) -> Self {
        self.o.negative_cache_ttl = Some(ttl);
        self
    }

    /// With `true`, a connect that finds `max_pending_handshakes` client handshakes already
    /// running in this process does not propose SMC: it connects as plain TCP at once. Off
    /// unless set here (the process-wide `limit_handshake` is for listeners). A connect holds
    /// no place while its TCP connection is made (plain, in-band or through a same-host door),
    /// nor while it waits for another connection's first contact with the server: a host that
    /// is down, or a listener whose queue is full, can take minutes to answer. A handshake
    /// takes a place again once connected, and stays TCP if none is free then (or, under
    /// `Policy::Never`, fails).
    ///
    /// # Examples
    ///
    /// One client handshake at a time: a connect that finds it taken goes plain at once.
    ///
    /// ```
    /// use smc_tokio::{DeclineReason, FallbackReason, Side, SmcListener, SmcStream, Transport};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let builder = SmcStream::builder().limit_handshake(true).max_pending_handshakes(1);
    /// let (a, b) = tokio::try_join!(builder.connect(addr), builder.connect(addr))?;
    /// let congested = FallbackReason::Declined { reason: DeclineReason::HandshakeCongested, by: Side::Local };
    /// assert!(a.transport().is_smc() != b.transport().is_smc());
    /// assert!([a.transport(), b.transport()].contains(&Transport::Tcp(congested)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn limit_handshake(mut self, on: bool) -> Self {
        self.o.limit_handshake = Some(on);
        self
    }

    /// Client handshakes this process runs at once before `limit_handshake` applies.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcStream;
    ///
    /// let builder = SmcStream::builder().max_pending_handshakes(16).limit_handshake(true);
    /// assert_eq!(builder.settings().max_pending_handshakes, 16);
    /// // At least one: 0 means 1.
    /// assert_eq!(SmcStream::builder().max_pending_handshakes(0).settings().max_pending_handshakes, 1);
    /// ```
    pub fn max_pending_handshakes(mut self, n: usize) -> Self {
        self.o.max_pending_handshakes = Some(n);
        self
    }

    /// Adaptive fallback: after [`ADAPTIVE_STRIKES`](crate::config::ADAPTIVE_STRIKES) SMC
    /// connections in a row to one server that moved fewer than `bytes` bytes, stop proposing
    /// to it for the negative-cache TTL (0 turns it off, the default).
    ///
    /// # Examples
    ///
    /// Connections that move less than 1 KiB each: after a few, the server is left alone for a while.
    ///
    /// ```
    /// use smc_tokio::config::ADAPTIVE_STRIKES;
    /// use smc_tokio::{FallbackReason, SmcListener, SmcStream, Transport};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let builder = SmcStream::builder().adaptive_min_bytes(1024);
    /// for _ in 0..ADAPTIVE_STRIKES {
    ///     let short = builder.connect(listener.local_addr()?).await?;
    ///     assert!(short.transport().is_smc());
    /// } // each is dropped having moved nothing
    /// let next = builder.connect(listener.local_addr()?).await?;
    /// assert_eq!(next.transport(), Transport::Tcp(FallbackReason::NegativeCache));
    /// # Ok(())
    /// # }
    /// ```
    pub fn adaptive_min_bytes(mut self, bytes: u64) -> Self {
        self.o.adaptive_min_bytes = Some(bytes);
        self
    }

    /// Whether to connect through the kernel's `AF_SMC` sockets, to reach kernel-SMC servers
    /// (see [`kernel`](crate::kernel)). A destination with an smc-tokio listener on this host
    /// is reached through its door with a plain TCP socket either way; everywhere else the
    /// kernel falls back to TCP, as it does for any SMC client of a plain server.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::kernel::KernelMode;
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let builder = SmcStream::builder().kernel(KernelMode::On);
    /// assert_eq!(builder.settings().kernel, KernelMode::On);
    /// // An smc-tokio listener on this host: its door, this crate's SMC-D.
    /// assert!(builder.connect(listener.local_addr()?).await?.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn kernel(mut self, mode: crate::kernel::KernelMode) -> Self {
        self.o.kernel = Some(mode);
        self
    }

    /// The settings a connect would use now: this builder's values over the process-wide ones.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{config, Policy, SmcStream};
    ///
    /// let settings = SmcStream::builder().policy(Policy::TcpOnly).settings();
    /// assert_eq!(settings.policy, Policy::TcpOnly); // set on the builder
    /// assert_eq!(settings.handshake_timeout, config::global().get().handshake_timeout); // the process-wide value
    /// ```
    pub fn settings(&self) -> Settings {
        self.o.resolve(self.ctx.settings())
    }

    /// Connects to `addr`, trying each address it resolves to in turn.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::{SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let port = listener.local_addr()?.port();
    /// let builder = SmcStream::builder().handshake_timeout(Duration::from_secs(1));
    /// // Whatever `ToSocketAddrs` takes: a `SocketAddr`, `"host:port"`, `(host, port)`.
    /// let stream = builder.connect(("127.0.0.1", port)).await?;
    /// assert_eq!(stream.peer_addr()?, listener.local_addr()?);
    /// assert!(stream.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect<A: ToSocketAddrs>(&self, addr: A) -> io::Result<SmcStream> {
        let mut last_err = None;
        for addr in tokio::net::lookup_host(addr).await? {
            match self.connect_addr_from(addr, None).await {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "could not resolve to any address")))
    }

    /// Connects `socket` (made and set up by the application, perhaps bound) to `addr` with
    /// these settings, as [`TcpSocket::connect`](tokio::net::TcpSocket::connect) does: the
    /// connection is this socket's. A same-host client registers it at the listener's door (an
    /// unbound one is bound to the wildcard address and a port the kernel picks first).
    ///
    /// Toward an in-band peer (see [`inband_peers`](SmcStreamBuilder::inband_peers)) whose
    /// handshake fails, the plain TCP reconnection that follows uses a new socket (the first
    /// one carried a Proposal and is closed) with the application's options: its bound address
    /// (on a new port), device, TOS or traffic class, `TCP_NODELAY`, keepalive and linger; not
    /// buffer sizes, which cannot be told from the kernel's own.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcSocket, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_keepalive(true)?;
    /// let stream = SmcStream::builder()
    ///     .handshake_timeout(std::time::Duration::from_secs(1))
    ///     .connect_socket(socket, listener.local_addr()?)
    ///     .await?;
    /// # drop(stream);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_socket(&self, socket: crate::SmcSocket, addr: SocketAddr) -> io::Result<SmcStream> {
        self.connect_addr_from(addr, Some(socket.into_socket2())).await
    }

    /// The handshake's state (kilobytes) lives on the heap, boxed once where it is made: a
    /// future that awaits a connect holds a few hundred bytes of its own, and that state is not
    /// copied again as the futures around it are moved.
    async fn connect_addr_from(&self, addr: SocketAddr, user: Option<socket2::Socket>) -> io::Result<SmcStream> {
        // A socket we make has SO_LINGER off; the application's may have anything.
        let ours = user.is_none();
        let span = tracing::debug_span!("smc_connect", peer = %addr, transport = tracing::field::Empty);
        let limit = self.o.limit_handshake == Some(true);
        let handshake = async {
            let cfg = self.o.resolve(self.ctx.settings());
            let res = crate::connect::establish(&self.ctx, addr, &cfg, limit, user).await;
            (res, cfg.adaptive_min_bytes, cfg.negative_cache_ttl)
        };
        let (res, adaptive_min_bytes, negative_cache_ttl) = Box::pin(handshake).instrument(span.clone()).await;
        let mut s = SmcStream::from_established(self.ctx.clone(), res?);
        if ours {
            s = s.default_linger();
        }
        span.record("transport", tracing::field::display(s.transport()));
        self.ctx.counters().connection(false, s.transport());
        if adaptive_min_bytes > 0 && s.transport().is_smc() {
            s.adaptive = Some((addr, adaptive_min_bytes, negative_cache_ttl));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

    use crate::config::ShmConfig;
    use crate::{SmcListener, SmcStream, Transport};

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Two client connections on one link group (`a`, `b`) with their accepted ends (`sa`,
    /// `sb`) and the group, in a context of their own, adaptive polling off: a reader that
    /// finds nothing waits on its waker, instead of waking itself to look again.
    async fn two_on_one_group() -> (crate::Context, [SmcStream; 4], Arc<crate::smc::group::LinkGroup>) {
        let ctx = crate::Context::new();
        let shm = ShmConfig::default().adaptive_poll(Duration::ZERO);
        let l = SmcListener::builder().context(&ctx).shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let builder = SmcStream::builder().context(&ctx).shm(shm);
        let (a, sa) = tokio::join!(builder.connect(addr), l.accept());
        let (b, sb) = tokio::join!(builder.connect(addr), l.accept());
        let (a, b, sa, sb) = (a.unwrap(), b.unwrap(), sa.unwrap().0, sb.unwrap().0);
        assert_eq!((a.transport(), b.transport()), (Transport::SmcD, Transport::SmcD));
        assert!(a.link_group().is_some());
        assert_eq!(a.link_group(), b.link_group(), "one link group");
        let group = a.smc().unwrap().conn.group().clone();
        (ctx, [a, b, sa, sb], group)
    }

    /// A read that finds the link's next CDC frame to be its own connection's takes it itself,
    /// under the connection's lock (the shortest way to a small message), and still hands what
    /// came behind that frame to its connections before it returns: another connection's
    /// bytes reach it and wake its waiting reader, with no turn of the group's driver between.
    #[tokio::test]
    async fn a_read_takes_its_own_frame_and_delivers_what_came_behind_it() {
        let (_ctx, [mut a, mut b, mut sa, mut sb], group) = two_on_one_group().await;
        let (mut got_a, mut got_b) = ([0u8; 3], [0u8; 3]);
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let b_waker = Waker::from(woken.clone());
        let mut rb = ReadBuf::new(&mut got_b);
        assert!(Pin::new(&mut b).poll_read(&mut Context::from_waker(&b_waker), &mut rb).is_pending());
        // a's frame first on the link, b's behind it. Nothing below yields to the runtime, so
        // the group's driver does not run before a's read.
        sa.write_all(b"aaa").await.unwrap();
        sb.write_all(b"bbb").await.unwrap();
        let own = group.own_frames.load(Ordering::Relaxed);
        let mut ra = ReadBuf::new(&mut got_a);
        let r = Pin::new(&mut a).poll_read(&mut Context::from_waker(Waker::noop()), &mut ra);
        assert!(matches!(r, Poll::Ready(Ok(()))), "{r:?}");
        assert_eq!(ra.filled(), b"aaa");
        assert_eq!(group.own_frames.load(Ordering::Relaxed), own + 1, "a's frame came the short way");
        assert!(woken.0.load(Ordering::SeqCst) > 0, "the frame behind a's reached b and woke its reader");
        let r = Pin::new(&mut b).poll_read(&mut Context::from_waker(&b_waker), &mut rb);
        assert!(matches!(r, Poll::Ready(Ok(()))), "{r:?}");
        assert_eq!(rb.filled(), b"bbb");
    }

    /// A frame the reader takes for its own connection the short way is checked as the
    /// dispatch checks it: one that does not decode fails that connection alone, with the
    /// reason, and the link group's other connections go on.
    #[tokio::test]
    async fn a_malformed_frame_taken_the_short_way_fails_its_connection_alone() {
        let (_ctx, [mut a, mut b, sa, mut sb], group) = two_on_one_group().await;
        // A CDC message for a's connection, of a type that is not one, from the server's side.
        let mut frame = crate::proto::cdc::CdcMsg::new(1, a.smc().unwrap().conn.our_token()).encode();
        frame[0] = 0;
        let server_link = sa.smc().unwrap().conn.group().link().unwrap().clone();
        assert!(server_link.cdc_send_frame(&frame).unwrap());
        let own = group.own_frames.load(Ordering::Relaxed);
        let mut got = [0u8; 3];
        let mut ra = ReadBuf::new(&mut got);
        let r = Pin::new(&mut a).poll_read(&mut Context::from_waker(Waker::noop()), &mut ra);
        assert_eq!(group.own_frames.load(Ordering::Relaxed), own + 1, "taken the short way");
        match r {
            Poll::Ready(Err(e)) => assert!(e.to_string().contains("malformed CDC message"), "{e}"),
            other => panic!("a's read should fail: {other:?}"),
        }
        sb.write_all(b"bbb").await.unwrap();
        let mut got_b = [0u8; 3];
        tokio::io::AsyncReadExt::read_exact(&mut b, &mut got_b).await.unwrap();
        assert_eq!(&got_b, b"bbb", "the group's other connection goes on");
    }
}
