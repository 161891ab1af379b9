use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, Notify};
use tracing::Instrument;

use crate::config::{Overrides, Policy, Settings, ShmConfig};
use crate::handshake::{advance, Step};
use crate::net::stream::SmcStream;
use crate::proto::clc::{eyecatcher_prefix_matches, DeclineReason, LinkInfo, CLC_EYECATCHER};
use crate::proto::handshake::{HandshakeError, Outcome, ServerEvent, ServerHandshake};
use crate::smc::conn::{PendingConn, SmcConn};
use crate::smc::manager::{AcceptorSlot, Manager};
use crate::stats;
use crate::sys;
use crate::transport::{FallbackReason, Transport};

type Ready = (SmcStream, SocketAddr);

/// A TCP listener whose connections move to shared memory or RDMA when the client speaks SMC,
/// and stay plain TCP, with every byte intact, when it does not.
///
/// The accept loop only accepts and looks at each connection's first bytes without taking them
/// (`MSG_PEEK`). A client that does not start with the CLC eyecatcher (curl, wrk, a browser, a
/// plain [`TcpStream`]) is handed out as TCP at once. An SMC client's handshake runs in a task
/// of its own, never in [`accept`](SmcListener::accept), which returns connections in the order
/// their handshakes finish.
///
/// A client that waits for the server to speak first sends nothing: it is handed out as TCP when
/// the [peek timeout](SmcListenerBuilder::peek_timeout) expires, which delays its greeting by
/// that much. See [`DEFAULT_PEEK_TIMEOUT`](crate::config::DEFAULT_PEEK_TIMEOUT).
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
    tcp: TcpListener,
    shared: Arc<ListenerShared>,
    ready_tx: mpsc::UnboundedSender<Ready>,
    ready_rx: Mutex<mpsc::UnboundedReceiver<Ready>>,
}

impl fmt::Debug for SmcListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmcListener")
            .field("local", &self.tcp.local_addr().ok())
            .field("settings", &self.shared.settings())
            .finish()
    }
}

/// What a listener and its handshake tasks share.
#[derive(Debug, Default)]
struct ListenerShared {
    /// The builder's values, changed at run time by the listener's setters.
    overrides: std::sync::RwLock<Overrides>,
    /// Handshakes running now.
    in_flight: AtomicUsize,
    /// Connections waiting for a handshake slot (`limit_handshake` off).
    waiting: AtomicUsize,
    /// Signalled when a handshake slot frees.
    freed: Notify,
    acceptor: AcceptorSlot,
}

impl ListenerShared {
    fn settings(&self) -> Settings {
        self.overrides.read().unwrap_or_else(|e| e.into_inner()).resolve()
    }

    /// Takes a handshake slot if one is free.
    fn try_slot(self: &Arc<Self>, max: usize) -> Option<HandshakeSlot> {
        let mut n = self.in_flight.load(Ordering::Acquire);
        loop {
            if n >= max {
                return None;
            }
            match self.in_flight.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(HandshakeSlot(self.clone())),
                Err(cur) => n = cur,
            }
        }
    }

    /// Admits a connection that starts a handshake: a slot at once; or, when all are taken,
    /// "congested" (`limit_handshake` on: decline and serve TCP now), a wait in a queue as long
    /// as the bound (off), or a refusal when the queue is full too.
    async fn admit(self: &Arc<Self>, cfg: &Settings) -> Admit {
        let max = cfg.max_pending_handshakes.max(1);
        if let Some(slot) = self.try_slot(max) {
            return Admit::Handshake(slot);
        }
        if cfg.limit_handshake {
            return Admit::Congested;
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= max {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Admit::Refuse;
        }
        let slot = loop {
            let freed = self.freed.notified();
            if let Some(slot) = self.try_slot(max) {
                break slot;
            }
            freed.await;
        };
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        Admit::Handshake(slot)
    }
}

enum Admit {
    Handshake(HandshakeSlot),
    Congested,
    Refuse,
}

/// A running handshake's place under `max_pending_handshakes`.
struct HandshakeSlot(Arc<ListenerShared>);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
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
}

impl Default for SmcListenerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl SmcListenerBuilder {
    /// Default settings: [`Policy::Auto`],
    /// [`DEFAULT_PEEK_TIMEOUT`](crate::config::DEFAULT_PEEK_TIMEOUT),
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`](crate::config::DEFAULT_HANDSHAKE_TIMEOUT).
    pub fn new() -> Self {
        Self { o: Overrides::default() }
    }

    /// Shared-memory (SMC-D) settings for connections accepted by this listener.
    pub fn shm(mut self, config: ShmConfig) -> Self {
        self.o.shm = Some(config);
        self
    }

    /// RDMA (SMC-R) settings for connections accepted by this listener (with the `rdma` feature).
    pub fn rdma(mut self, config: crate::config::RdmaConfig) -> Self {
        self.o.rdma = Some(config);
        self
    }

    /// What to do with connections that cannot use SMC. Under [`Policy::Never`] they are closed
    /// instead of handed out; under [`Policy::TcpOnly`] every proposal is declined.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.o.policy = Some(policy);
        self
    }

    /// How long to wait for a new connection's first bytes before handing it out as TCP.
    pub fn peek_timeout(mut self, timeout: Duration) -> Self {
        self.o.peek_timeout = Some(timeout);
        self
    }

    /// Bound on a whole handshake once the eyecatcher has been seen.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.o.handshake_timeout = Some(timeout);
        self
    }

    /// Handshakes this listener runs at once.
    pub fn max_pending_handshakes(mut self, n: usize) -> Self {
        self.o.max_pending_handshakes = Some(n.max(1));
        self
    }

    /// With `true` (the default), a connection that arrives when `max_pending_handshakes` are
    /// running is declined as congested and handed out as TCP at once; with `false` it waits
    /// for a slot, in a queue as long as `max_pending_handshakes`, and is refused (closed) when
    /// that queue is full too.
    pub fn limit_handshake(mut self, on: bool) -> Self {
        self.o.limit_handshake = Some(on);
        self
    }

    /// Binds a new listener to `addr`.
    pub async fn bind<A: ToSocketAddrs>(self, addr: A) -> io::Result<SmcListener> {
        Ok(self.from_tcp(TcpListener::bind(addr).await?))
    }

    /// Wraps an already bound tokio listener.
    pub fn from_tcp(self, tcp: TcpListener) -> SmcListener {
        let (ready_tx, ready_rx) = mpsc::unbounded_channel();
        SmcListener {
            tcp,
            shared: Arc::new(ListenerShared { overrides: std::sync::RwLock::new(self.o), ..ListenerShared::default() }),
            ready_tx,
            ready_rx: Mutex::new(ready_rx),
        }
    }

    /// Wraps an already bound std listener, as [`TcpListener::from_std`] does (the listener
    /// should be in non-blocking mode). Must be called inside a tokio runtime.
    pub fn from_std(self, listener: std::net::TcpListener) -> io::Result<SmcListener> {
        Ok(self.from_tcp(TcpListener::from_std(listener)?))
    }
}

impl SmcListener {
    /// Binds a listener to `addr` with the default settings.
    pub async fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<SmcListener> {
        SmcListenerBuilder::new().bind(addr).await
    }

    /// A builder for listeners with non-default settings.
    pub fn builder() -> SmcListenerBuilder {
        SmcListenerBuilder::new()
    }

    /// Wraps an already bound std listener with the default settings.
    pub fn from_std(listener: std::net::TcpListener) -> io::Result<SmcListener> {
        SmcListenerBuilder::new().from_std(listener)
    }

    /// The local address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The settings connections accepted now would get (the builder's and the setters' values
    /// over the process-wide ones).
    pub fn settings(&self) -> Settings {
        self.shared.settings()
    }

    /// Changes `limit_handshake` for this listener, from the next connection on.
    pub fn set_limit_handshake(&self, on: bool) {
        self.shared.overrides.write().unwrap_or_else(|e| e.into_inner()).limit_handshake = Some(on);
    }

    /// Changes `max_pending_handshakes` for this listener, from the next connection on.
    pub fn set_max_pending_handshakes(&self, n: usize) {
        self.shared.overrides.write().unwrap_or_else(|e| e.into_inner()).max_pending_handshakes = Some(n.max(1));
    }

    /// Handshakes this listener is running now.
    pub fn pending_handshakes(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Waits for the next connection whose handshake (if any) has finished.
    ///
    /// Errors are those of [`TcpListener::accept`] (for example `EMFILE`); a connection whose
    /// handshake fails is closed and never returned.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a connection is either returned or stays queued for the next call.
    pub async fn accept(&self) -> io::Result<(SmcStream, SocketAddr)> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Polls for the next connection; see [`accept`](SmcListener::accept). Only the waker of the
    /// most recent call is woken, as with [`TcpListener::poll_accept`].
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(SmcStream, SocketAddr)>> {
        loop {
            {
                let mut rx = self.ready_rx.lock().unwrap_or_else(|e| e.into_inner());
                if let Poll::Ready(Some(ready)) = rx.poll_recv(cx) {
                    return Poll::Ready(Ok(ready));
                }
            }
            let (tcp, peer) = match self.tcp.poll_accept(cx) {
                Poll::Ready(Ok(c)) => c,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            // Resolved once per connection, here, and handed to its task.
            let config = self.shared.settings();
            match classify_now(&tcp) {
                // The common plain-client case is decided here, without a task.
                Some(Class::Plain) if config.policy != Policy::Never => {
                    let t = Transport::Tcp(FallbackReason::PeerNoSmc);
                    stats::connection(true, t);
                    let s = SmcStream::from_tcp(tcp, t);
                    return Poll::Ready(Ok((s, peer)));
                }
                _ => {
                    let shared = self.shared.clone();
                    let tx = self.ready_tx.clone();
                    let span = tracing::debug_span!("smc_accept", %peer, transport = tracing::field::Empty);
                    tokio::spawn(serve(tcp, peer, config, shared, tx).instrument(span));
                }
            }
        }
    }
}

impl From<TcpListener> for SmcListener {
    /// Wraps a tokio listener with the default settings.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Not our eyecatcher (or EOF): a plain client.
    Plain,
    /// The whole eyecatcher is there.
    Smc,
}

/// Looks at the bytes already waiting, without blocking: `None` if they do not decide yet.
fn classify_now(tcp: &TcpStream) -> Option<Class> {
    let mut buf = [0u8; CLC_EYECATCHER.len()];
    match sys::peek_now(tcp.as_fd(), &mut buf) {
        Ok(0) => Some(Class::Plain),
        Ok(n) => classify(&buf[..n]),
        Err(_) => None,
    }
}

fn classify(seen: &[u8]) -> Option<Class> {
    if !eyecatcher_prefix_matches(seen) {
        Some(Class::Plain)
    } else if seen.len() >= CLC_EYECATCHER.len() {
        Some(Class::Smc)
    } else {
        None
    }
}

/// Waits (up to `deadline`) until the first bytes decide what the client is. `None`: it sent
/// nothing decisive in time.
async fn peek_class(tcp: &TcpStream, deadline: tokio::time::Instant) -> io::Result<Option<Class>> {
    let mut buf = [0u8; CLC_EYECATCHER.len()];
    // After a matching prefix shorter than the eyecatcher, the socket stays readable, so waiting
    // for readiness would spin: back off instead. Only a client that trickles its first bytes
    // gets here; the backoff caps at 16 ms.
    let mut backoff = Duration::from_millis(1);
    loop {
        let n = match tokio::time::timeout_at(deadline, tcp.peek(&mut buf)).await {
            Ok(r) => r?,
            Err(_) => return Ok(None),
        };
        if n == 0 {
            return Ok(Some(Class::Plain));
        }
        if let Some(c) = classify(&buf[..n]) {
            return Ok(Some(c));
        }
        if tokio::time::timeout_at(deadline, tokio::time::sleep(backoff)).await.is_err() {
            return Ok(None);
        }
        backoff = (backoff * 2).min(Duration::from_millis(16));
    }
}

/// Serves one accepted connection: classify, handshake if it is an SMC client, queue the
/// result for `accept`.
async fn serve(
    mut tcp: TcpStream,
    peer: SocketAddr,
    config: Settings,
    shared: Arc<ListenerShared>,
    tx: mpsc::UnboundedSender<Ready>,
) {
    let transport = {
        let work = async {
            let peek_deadline = tokio::time::Instant::now() + config.peek_timeout;
            let served = match peek_class(&tcp, peek_deadline).await? {
                None => Served::Tcp(Transport::Tcp(FallbackReason::ClientSilent)),
                Some(Class::Plain) => Served::Tcp(Transport::Tcp(FallbackReason::PeerNoSmc)),
                Some(Class::Smc) => match shake(&mut tcp, &config, &shared).await? {
                    (Outcome::Fallback { reason, by }, _) => {
                        Served::Tcp(Transport::Tcp(FallbackReason::Declined { reason, by }))
                    }
                    (Outcome::Smc { .. }, Some(conn)) => Served::Smc(conn),
                    (Outcome::Smc { .. }, None) => {
                        return Err(io::Error::other("handshake agreed on a link without a connection"))
                    }
                    (Outcome::Failed(e), _) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
                },
            };
            Ok::<_, io::Error>(served)
        };
        let mut work = std::pin::pin!(work);
        let mut closed = std::pin::pin!(tx.closed());
        let transport = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = work.as_mut().poll(cx) {
                return Poll::Ready(Some(r));
            }
            // The listener is gone: nobody will accept this connection.
            closed.as_mut().poll(cx).map(|()| None)
        })
        .await;
        transport
    };
    let Some(transport) = transport else { return };
    match transport {
        Ok(Served::Tcp(t)) if config.policy == Policy::Never => {
            tracing::debug!(transport = %t, "closing: policy requires smc");
        }
        Ok(Served::Tcp(t)) => {
            tracing::Span::current().record("transport", tracing::field::display(t));
            stats::connection(true, t);
            let _ = tx.send((SmcStream::from_tcp(tcp, t), peer));
        }
        Ok(Served::Smc(conn)) => {
            let t = conn.transport();
            tracing::Span::current().record("transport", t.as_str());
            stats::connection(true, t);
            let _ = tx.send((SmcStream::from_smc(tcp, conn, t), peer));
        }
        Err(e) => tracing::debug!(error = %e, "closing connection after failed handshake"),
    }
}

/// What a served connection turned out to be.
enum Served {
    Tcp(Transport),
    Smc(Arc<SmcConn>),
}

/// Admits the connection under the handshake bound, then runs the handshake (or, congested,
/// only the decline).
async fn shake(
    tcp: &mut TcpStream,
    config: &Settings,
    shared: &Arc<ListenerShared>,
) -> io::Result<(Outcome, Option<Arc<SmcConn>>)> {
    let (slot, congested) = match shared.admit(config).await {
        Admit::Handshake(slot) => (Some(slot), false),
        Admit::Congested => (None, true),
        Admit::Refuse => return Err(io::Error::other("handshake queue full: connection refused")),
    };
    let timer = stats::HandshakeTimer::start();
    let r = server_handshake(tcp, config, &shared.acceptor, congested).await;
    drop(slot);
    match &r {
        Ok((Outcome::Smc { .. }, _)) => timer.completed(),
        Ok((Outcome::Fallback { reason, by }, _)) => {
            stats::decline(*reason, *by);
            timer.completed();
        }
        _ => drop(timer),
    }
    r
}

async fn server_handshake(
    tcp: &mut TcpStream,
    config: &Settings,
    acceptor: &AcceptorSlot,
    congested: bool,
) -> io::Result<(Outcome, Option<Arc<SmcConn>>)> {
    let mut hs = ServerHandshake::new(Instant::now(), config.handshake_timeout);
    let mut pending = PendingConn::default();
    let mut proposed_rmb = 0;
    #[cfg(feature = "rdma")]
    let mut rdma_pending: Option<crate::smc::rdma::ServerPending> = None;
    loop {
        match advance(tcp, &mut hs).await? {
            Step::Event(ServerEvent::Proposal(p)) => {
                tracing::debug!(token = ?p.token, shm = p.shm.is_some(), rdma = p.rdma.is_some(), "proposal");
                if congested {
                    hs.decline(DeclineReason::HandshakeCongested);
                    continue;
                }
                if config.policy == Policy::TcpOnly {
                    hs.decline(DeclineReason::NoCommonTransport);
                    continue;
                }
                // Shared memory first (same host), then RDMA.
                let shm = if p.shm.is_some() {
                    Manager::global().server_accept(acceptor, &p, &config.shm, config.handshake_timeout)
                } else {
                    Err(DeclineReason::NoCommonTransport)
                };
                let res = match shm {
                    Ok((conn, info)) => Ok((conn, LinkInfo::Shm(info))),
                    #[cfg(feature = "rdma")]
                    Err(shm_reason) if p.rdma.is_some() => {
                        let (local, peer) = (tcp.local_addr()?.ip(), tcp.peer_addr()?.ip());
                        crate::smc::rdma::warm_up(config).await;
                        match crate::smc::rdma::server_accept(
                            Manager::global(),
                            &p,
                            local,
                            peer,
                            config,
                            config.handshake_timeout,
                        ) {
                            Ok((conn, info, rp)) => {
                                rdma_pending = Some(rp);
                                Ok((conn, LinkInfo::Rdma(info)))
                            }
                            Err(DeclineReason::NoCommonTransport) => Err(shm_reason),
                            Err(r) => Err(r),
                        }
                    }
                    Err(r) => Err(r),
                };
                match res {
                    Ok((conn, info)) => {
                        proposed_rmb = p.rmb_size;
                        pending.set(conn);
                        hs.accept(info);
                    }
                    Err(reason) => {
                        tracing::debug!(%reason, "declining proposal");
                        hs.decline(reason);
                    }
                }
            }
            Step::Done(o) => {
                let Some(conn) = pending.get() else {
                    return Ok((o, None));
                };
                match &o {
                    Outcome::Smc { peer: LinkInfo::Shm(c), .. } => {
                        let group = conn.group().clone();
                        // The client confirms once it has our WELCOME; our join task installs the
                        // link right after sending it, so this waits at most a few task turns.
                        let established =
                            c.link_group == group.id && group.wait_established(config.handshake_timeout).await;
                        if c.link_group != group.id || c.rmb_size != proposed_rmb || !established {
                            tracing::debug!(?c, "confirm does not match the accepted link");
                            return Ok((Outcome::Failed(HandshakeError::ConfirmMismatch), None));
                        }
                        conn.confirm(c.rmb_slot);
                    }
                    #[cfg(feature = "rdma")]
                    Outcome::Smc { peer: LinkInfo::Rdma(c), .. } => {
                        let Some(rp) = rdma_pending.as_ref() else {
                            return Ok((Outcome::Failed(HandshakeError::ConfirmMismatch), None));
                        };
                        if let Err(why) = crate::smc::rdma::server_confirm(conn, rp, c) {
                            tracing::debug!(%why, "rdma confirm");
                            return Ok((Outcome::Failed(HandshakeError::ConfirmMismatch), None));
                        }
                    }
                    // A transport we did not accept (only reachable without the `rdma` feature).
                    #[allow(unreachable_patterns)]
                    Outcome::Smc { .. } => {
                        return Ok((Outcome::Failed(HandshakeError::ConfirmMismatch), None));
                    }
                    _ => {
                        // No SMC: give the slot back, and drop a shm group this handshake set up
                        // for a client that will not join it.
                        if let Some(conn) = pending.take() {
                            let group = conn.group().clone();
                            group.unregister(conn.our_token());
                            Manager::global().abandon_pending(&group);
                            // A new rdma group waits for nobody but this handshake's Confirm.
                            #[cfg(feature = "rdma")]
                            if rdma_pending.is_some() && group.link().is_none() && group.conn_count() == 0 {
                                group.fail(crate::link::LinkError::Closed);
                            }
                        }
                        return Ok((o, None));
                    }
                }
                return Ok((o, pending.take()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(classify(b""), None);
        assert_eq!(classify(&CLC_EYECATCHER[..1]), None);
        assert_eq!(classify(&CLC_EYECATCHER[..3]), None);
        assert_eq!(classify(&CLC_EYECATCHER), Some(Class::Smc));
        assert_eq!(classify(b"G"), Some(Class::Plain));
        assert_eq!(classify(&[0xE2, 0xD4, 0x00]), Some(Class::Plain));
        assert_eq!(classify(&[0x16, 0x03, 0x01, 0x00]), Some(Class::Plain), "TLS client hello");
    }
}
