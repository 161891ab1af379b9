//! How the TCP connection under an SMC-R connection ends once our close is announced.
//!
//! Over RDMA a close is a CDC SEND posted to the queue pair, and the peer learns of it (and of
//! the bytes WRITten before it) only when the adapters have carried it. Until its completion
//! comes back, a failed link, or this process's exit (its queue pairs are destroyed with it),
//! can lose the close and the last bytes. The peer takes a FIN on the TCP connection without
//! an SMC close for a peer that went away after it had all its bytes, and reads a clean end of
//! stream: a FIN sent before the close is delivered could so end a stream cut short, with
//! nothing to tell.
//!
//! So the socket is kept, with a zero `SO_LINGER`, until the close is delivered
//! ([`Link::poll_delivered`]); then its own linger goes back and it is closed with a FIN. If
//! the delivery fails (the link failed), does not come within [`DELIVERY_BOUND`], or the
//! process exits first, the socket closes with its zero linger: a reset, which the peer reads
//! as an end that may have lost bytes (`SmcError::PeerGone` after what arrived), and which
//! waits, on the peer, for a close still in flight over the link as a FIN does.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::link::Link;

/// Ready with whether the close was delivered.
type PollDelivered = dyn FnMut(&mut Context<'_>) -> Poll<bool> + Send;

/// How long a close may wait for its delivery before its socket resets: as long as the kernel
/// keeps an orphaned TCP socket whose peer acknowledged its FIN and never closes
/// (`net.ipv4.tcp_fin_timeout`, 60 s by default). A queue pair retries a peer that posts no
/// receives for good (`rnr_retry` 7), so a stopped or hostile peer would otherwise hold the
/// socket and its task while the group lives.
const DELIVERY_BOUND: Duration = Duration::from_secs(60);

/// How long the closes still in flight when their runtime shuts down wait for their delivery
/// before their sockets reset, all together: a process that
/// returns from `main` right after it dropped its streams ends this way, and its queue pairs go
/// with it. A close SEND completes within a round trip on a live fabric (microseconds; about
/// 2 ms on the soft-RoCE guests, the slowest path we run); a link that is dead without having
/// failed yet gives nothing in time, and costs a shutdown this once, however many closes and
/// link groups it holds.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(100);

/// A TCP socket whose FIN waits for the delivery of our close over `link`; a reset if the
/// delivery fails or never comes. A future: run on a runtime, it closes the socket as soon
/// as the close is delivered. Dropped before that, it waits for the delivery for at most its
/// share of a [`ShutdownWait`].
pub(crate) struct FinOnDelivery {
    /// Ready with whether the close was delivered (`false`: the link failed first).
    delivered: Box<PollDelivered>,
    tcp: Option<Arc<TcpStream>>,
    /// The socket's own `SO_LINGER`, put back for the FIN.
    linger: Option<Duration>,
    /// The wait shared by the closes dropped unfinished ([`SHUTDOWN_WAIT`]).
    wait: &'static ShutdownWait,
    /// Reset past it ([`DELIVERY_BOUND`]); set when first polled.
    bound: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The one wait that the closes dropped unfinished share: the first one dropped starts it, and
/// those dropped until a second past its end share it; one dropped later starts another.
#[derive(Debug)]
pub(crate) struct ShutdownWait {
    /// Its end, in milliseconds since `EPOCH`, plus one (zero: never started).
    end: std::sync::atomic::AtomicU64,
    wait: Duration,
}

/// The process's shutdown wait.
pub(crate) static SHUTDOWN: ShutdownWait = ShutdownWait::new(SHUTDOWN_WAIT);

impl ShutdownWait {
    const fn new(wait: Duration) -> ShutdownWait {
        ShutdownWait { end: std::sync::atomic::AtomicU64::new(0), wait }
    }

    /// When the wait of a close dropped now ends.
    fn ends(&self) -> Instant {
        use std::sync::atomic::Ordering::Relaxed;
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let epoch = *EPOCH.get_or_init(Instant::now);
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let now = ms(epoch.elapsed()).saturating_add(1);
        let fresh = now.saturating_add(ms(self.wait));
        // Relaxed: a deadline, nothing is published through it.
        let stale = |end: u64| end == 0 || end.saturating_add(1000) < now;
        let end = match self.end.fetch_update(Relaxed, Relaxed, |end| stale(end).then_some(fresh)) {
            Ok(_) => fresh,
            Err(end) => end,
        };
        epoch + Duration::from_millis(end - 1)
    }
}

/// A link a close waits on, let go on the RDMA setup thread: a close in flight when its link
/// failed can hold the link's last reference (the group let go of it), and destroying a queue
/// pair and completion queue and deregistering memory takes the process's memory-map lock,
/// which a runtime thread must not wait for (as the group's own reference, `LinkGroup`'s drop).
struct SetupThreadDrop(Option<Arc<dyn Link>>);

impl Drop for SetupThreadDrop {
    fn drop(&mut self) {
        #[cfg(feature = "rdma")]
        if let Some(link) = self.0.take().filter(|l| l.is_rdma()) {
            crate::link::verbs::device::drop_on_setup_thread(Box::new(link));
        }
    }
}

thread_local! {
    /// Closes dropped where their wait must not run: inside `spawn` (a runtime that is shutting
    /// down drops the task there, under the connection's lock). [`settle_deferred`] waits for
    /// them once the lock is let go (and the thread's end, for any left).
    static DEFERRED: RefCell<Vec<FinOnDelivery>> = const { RefCell::new(Vec::new()) };
    /// Set while `spawn` runs on this thread.
    static IN_SPAWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether [`DEFERRED`] may hold any: one load for the look of every group's turn.
    static ANY_DEFERRED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Waits for the closes this thread deferred ([`DEFERRED`]): called where no connection's lock
/// is held (a connection's release, a group's turn or drain), so that none waits there long.
pub(crate) fn settle_deferred() {
    // A load on every group's turn; the store only when there is something.
    if !ANY_DEFERRED.try_with(std::cell::Cell::get).unwrap_or(false) {
        return;
    }
    let _ = ANY_DEFERRED.try_with(|a| a.set(false));
    while let Some(f) = DEFERRED.try_with(|d| d.borrow_mut().pop()).ok().flatten() {
        drop(f);
    }
}

impl FinOnDelivery {
    /// Holds `tcp` until every message handed to `link` so far (the close among them) is
    /// delivered. Sets the socket's linger to zero meanwhile.
    pub(crate) fn new(link: Arc<dyn Link>, tcp: Arc<TcpStream>) -> FinOnDelivery {
        let mark = link.tx_mark();
        let link = SetupThreadDrop(Some(link));
        // The link is taken out only when the closure is dropped.
        Self::with(tcp, &SHUTDOWN, move |cx| {
            link.0.as_ref().map_or(Poll::Ready(false), |l| l.poll_delivered(cx, mark).map(|r| r.is_ok()))
        })
    }

    fn with(
        tcp: Arc<TcpStream>,
        wait: &'static ShutdownWait,
        delivered: impl FnMut(&mut Context<'_>) -> Poll<bool> + Send + 'static,
    ) -> FinOnDelivery {
        // A socket whose linger cannot be read has the default: none.
        let linger = socket2::SockRef::from(&*tcp).linger().unwrap_or(None);
        crate::sys::set_zero_linger(&*tcp);
        FinOnDelivery { delivered: Box::new(delivered), tcp: Some(tcp), linger, wait, bound: None }
    }

    /// Closes the socket as the delivery came out: with a FIN, its linger put back, once
    /// delivered (`Some(true)`); with a reset if the link failed (`Some(false)`). `None`: not
    /// delivered yet (`cx` is woken when it is).
    fn settle(&mut self, cx: &mut Context<'_>) -> Option<bool> {
        let Poll::Ready(delivered) = (self.delivered)(cx) else { return None };
        if let Some(tcp) = self.tcp.take() {
            if delivered {
                if let Err(e) = socket2::SockRef::from(&*tcp).set_linger(self.linger) {
                    tracing::debug!(error = %e, "cannot put a closed connection's linger back: it ends with a reset");
                }
            } else {
                tracing::debug!("our close over rdma was not delivered: the tcp connection ends with a reset");
            }
        }
        Some(delivered)
    }

    /// Runs to the end on the current runtime; without one, on the crate's waiting thread
    /// ([`off_runtime`]). When the runtime is shutting down, the wait is deferred until
    /// [`settle_deferred`] (the caller holds its connection's lock).
    pub(crate) fn spawn(self) {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let was = IN_SPAWN.replace(true);
                drop(rt.spawn(self));
                IN_SPAWN.set(was);
            }
            Err(_) => off_runtime(self),
        }
    }
}

/// How many closes this thread deferred and has not settled.
#[cfg(test)]
pub(crate) fn deferred_here() -> usize {
    DEFERRED.with(|d| d.borrow().len())
}

/// Leaves `f` to [`settle_deferred`] on this thread. A thread whose locals are going (its end)
/// waits for it now instead.
pub(crate) fn defer(f: FinOnDelivery) {
    let mut f = Some(f);
    let _ = DEFERRED.try_with(|d| {
        if let Some(f) = f.take() {
            d.borrow_mut().push(f);
            let _ = ANY_DEFERRED.try_with(|a| a.set(true));
        }
    });
    if let Some(f) = f {
        // Its drop must wait, not defer again.
        let _ = IN_SPAWN.try_with(|s| s.set(false));
        drop(f);
    }
}

/// Closes dropped outside any runtime (a stream dropped after its runtime's `block_on`
/// returned, under its connection's lock) wait for their delivery on a thread of this crate's,
/// started on first use, which looks at each every millisecond until it is delivered, failed,
/// or past [`DELIVERY_BOUND`]. Without that thread, a close waits where it is dropped.
fn off_runtime(f: FinOnDelivery) {
    type Queue = std::sync::mpsc::Sender<(FinOnDelivery, Instant)>;
    static WAITER: std::sync::OnceLock<Option<Queue>> = std::sync::OnceLock::new();
    let waiter = WAITER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let started = std::thread::Builder::new().name("smc-tokio-fin".into()).spawn(move || wait_for_deliveries(rx));
        match started {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::warn!(error = %e, "no thread to wait for closes over rdma off the runtime");
                None
            }
        }
    });
    let until = Instant::now() + DELIVERY_BOUND;
    match waiter {
        Some(tx) => {
            if let Err(e) = tx.send((f, until)) {
                drop(e.0 .0);
            }
        }
        None => drop(f),
    }
}

/// The waiting thread of [`off_runtime`].
fn wait_for_deliveries(rx: std::sync::mpsc::Receiver<(FinOnDelivery, Instant)>) {
    let mut waiting: Vec<(FinOnDelivery, Instant)> = Vec::new();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    loop {
        let next = if waiting.is_empty() {
            rx.recv().map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(Duration::from_millis(1))
        };
        match next {
            Ok(w) => waiting.push(w),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        waiting.retain_mut(|(f, until)| {
            if f.settle(&mut cx).is_some() {
                return false;
            }
            if now >= *until {
                tracing::debug!(bound = ?DELIVERY_BOUND, "our close over rdma was not delivered in time: the tcp connection ends with a reset");
                f.tcp = None;
                return false;
            }
            true
        });
    }
}

impl Future for FinOnDelivery {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let me = self.get_mut();
        if me.settle(cx).is_some() {
            return Poll::Ready(());
        }
        let bound = me.bound.get_or_insert_with(|| Box::pin(tokio::time::sleep(DELIVERY_BOUND)));
        if bound.as_mut().poll(cx).is_ready() {
            tracing::debug!(bound = ?DELIVERY_BOUND, "our close over rdma was not delivered in time: the tcp connection ends with a reset");
            me.tcp = None;
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for FinOnDelivery {
    fn drop(&mut self) {
        if self.tcp.is_none() {
            return;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if IN_SPAWN.try_with(std::cell::Cell::get).unwrap_or(false) {
            // Dropped inside `spawn` (its runtime is shutting down), under the connection's
            // lock: the wait runs once the lock is let go, unless it is delivered already.
            if self.settle(&mut cx).is_none() {
                let delivered = std::mem::replace(&mut self.delivered, Box::new(|_| Poll::Ready(false)));
                let (tcp, linger, wait) = (self.tcp.take(), self.linger, self.wait);
                defer(FinOnDelivery { delivered, tcp, linger, wait, bound: None });
            }
            return;
        }
        // Dropped by a runtime's shutdown, or deferred and let go by `settle_deferred`: a close
        // delivered by now still ends with a FIN, one still in flight after the shared wait
        // with a reset. Nothing else may reap
        // the completions now (the group's driver may be gone): each look reaps them itself.
        let until = self.wait.ends();
        while self.settle(&mut cx).is_none() {
            if Instant::now() >= until {
                self.tcp = None;
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::AsyncReadExt;

    use super::*;

    /// The delivery a test decides: `None` while in flight.
    #[derive(Default)]
    struct Scripted(Mutex<(Option<bool>, Option<std::task::Waker>)>);

    impl Scripted {
        fn deliver(&self, ok: bool) {
            let mut s = self.0.lock().unwrap();
            s.0 = Some(ok);
            if let Some(w) = s.1.take() {
                w.wake();
            }
        }
    }

    /// A close over `tcp` whose delivery the test decides, with a shutdown wait of its own.
    fn fin(tcp: Arc<TcpStream>, wait: Duration) -> (FinOnDelivery, Arc<Scripted>) {
        let d = Arc::new(Scripted::default());
        let polled = d.clone();
        let wait = Box::leak(Box::new(ShutdownWait::new(wait)));
        let f = FinOnDelivery::with(tcp, wait, move |cx| {
            let mut s = polled.0.lock().unwrap();
            match s.0 {
                Some(ok) => Poll::Ready(ok),
                None => {
                    s.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        });
        (f, d)
    }

    async fn pair() -> (Arc<TcpStream>, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (c, a) = tokio::join!(TcpStream::connect(l.local_addr().unwrap()), l.accept());
        (Arc::new(c.unwrap()), a.unwrap().0)
    }

    /// What the peer reads at the end: `Ok(0)` for a FIN, the error for a reset.
    async fn end_seen(peer: &mut TcpStream) -> std::io::Result<usize> {
        let mut b = [0u8; 8];
        tokio::time::timeout(Duration::from_secs(120), peer.read(&mut b)).await.expect("the peer heard of the end")
    }

    fn linger(tcp: &TcpStream) -> Option<Duration> {
        socket2::SockRef::from(tcp).linger().unwrap()
    }

    #[tokio::test]
    async fn a_delivered_close_ends_with_a_fin_and_the_sockets_own_linger() {
        let (tcp, mut peer) = pair().await;
        socket2::SockRef::from(&*tcp).set_linger(Some(Duration::from_secs(3))).unwrap();
        let kept = tcp.clone();
        let (f, d) = fin(tcp, Duration::ZERO);
        assert_eq!(linger(&kept), Some(Duration::ZERO), "a close in flight ends with a reset");
        let task = tokio::spawn(f);
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert!(!task.is_finished(), "the socket went before the close was delivered");
        d.deliver(true);
        tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
        assert_eq!(linger(&kept), Some(Duration::from_secs(3)));
        drop(kept);
        assert_eq!(end_seen(&mut peer).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_failed_delivery_ends_with_a_reset() {
        let (tcp, mut peer) = pair().await;
        let (f, d) = fin(tcp, Duration::ZERO);
        let task = tokio::spawn(f);
        tokio::task::yield_now().await;
        d.deliver(false);
        tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
        assert_eq!(end_seen(&mut peer).await.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
    }

    /// A close whose delivery never comes (a peer that posts no receives: its queue pair
    /// retries for good) resets its socket after the bound, as the kernel lets go of an
    /// orphaned socket whose peer does not answer.
    #[tokio::test(start_paused = true)]
    async fn a_delivery_that_never_comes_ends_with_a_reset_after_the_bound() {
        let (tcp, mut peer) = pair().await;
        let (f, _d) = fin(tcp, Duration::ZERO);
        let task = tokio::spawn(f);
        let started = tokio::time::Instant::now();
        assert_eq!(end_seen(&mut peer).await.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
        assert!(started.elapsed() >= DELIVERY_BOUND, "reset before the bound: {:?}", started.elapsed());
        task.await.unwrap();
    }

    /// A runtime's shutdown drops a close still in flight: it waits for the delivery, within
    /// its shutdown wait.
    fn dropped_by_a_shutdown(deliver_after: Option<Duration>, wait: Duration) -> std::io::Result<usize> {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let d = rt.block_on(async {
            let (f, d) = fin(Arc::new(TcpStream::from_std(c).unwrap()), wait);
            f.spawn();
            d
        });
        let deliverer = deliver_after.map(|after| {
            std::thread::spawn(move || {
                std::thread::sleep(after);
                d.deliver(true);
            })
        });
        drop(rt);
        if let Some(t) = deliverer {
            t.join().unwrap();
        }
        std::io::Read::read(&mut peer, &mut [0u8; 8])
    }

    #[test]
    fn a_close_delivered_while_its_runtime_shuts_down_ends_with_a_fin() {
        assert_eq!(dropped_by_a_shutdown(Some(Duration::from_millis(20)), Duration::from_secs(20)).unwrap(), 0);
    }

    #[test]
    fn a_close_never_delivered_while_its_runtime_shuts_down_ends_with_a_reset() {
        let e = dropped_by_a_shutdown(None, Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
    }

    /// Outside any runtime (a stream dropped after its runtime's `block_on` returned) the
    /// close waits for its delivery on the crate's waiting thread.
    #[test]
    fn a_close_outside_any_runtime_waits_for_its_delivery_on_a_thread_of_its_own() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        c.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let tcp = rt.block_on(async { Arc::new(TcpStream::from_std(c).unwrap()) });
        let (f, d) = fin(tcp, Duration::from_secs(20));
        f.spawn();
        // Kept, not closed: the peer hears nothing yet.
        peer.set_nonblocking(true).unwrap();
        let nothing = std::io::Read::read(&mut peer, &mut [0u8; 8]).unwrap_err();
        assert_eq!(nothing.kind(), std::io::ErrorKind::WouldBlock);
        peer.set_nonblocking(false).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        d.deliver(true);
        assert_eq!(std::io::Read::read(&mut peer, &mut [0u8; 8]).unwrap(), 0, "not a FIN");
        drop(rt);
    }

    #[tokio::test]
    async fn dropped_before_its_delivery_it_resets_and_after_it_sends_a_fin() {
        let (tcp, mut peer) = pair().await;
        let (f, _d) = fin(tcp, Duration::ZERO);
        drop(f);
        assert_eq!(end_seen(&mut peer).await.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);

        let (tcp, mut peer) = pair().await;
        let (f, d) = fin(tcp, Duration::ZERO);
        d.deliver(true);
        drop(f);
        assert_eq!(end_seen(&mut peer).await.unwrap(), 0);
    }

    /// A stream dropped while its runtime shuts down spawns its close on that runtime, which
    /// drops the task inside `spawn`, under the connection's lock: the wait is deferred until
    /// `settle_deferred` (after the lock), not run there.
    #[test]
    fn a_close_spawned_on_a_runtime_shutting_down_waits_only_once_deferred_ones_settle() {
        struct SpawnsOnDrop(Option<FinOnDelivery>, Arc<std::sync::atomic::AtomicUsize>);
        impl Drop for SpawnsOnDrop {
            fn drop(&mut self) {
                if let Some(f) = self.0.take() {
                    f.spawn();
                    let deferred = DEFERRED.with(|d| d.borrow().len());
                    self.1.store(deferred, std::sync::atomic::Ordering::SeqCst);
                    settle_deferred();
                }
            }
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.set_nonblocking(true).unwrap();
        let deferred = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let d = rt.block_on(async {
            let (f, d) = fin(Arc::new(TcpStream::from_std(c).unwrap()), Duration::from_secs(20));
            let guard = SpawnsOnDrop(Some(f), deferred.clone());
            tokio::spawn(async move {
                let _guard = guard;
                std::future::pending::<()>().await
            });
            tokio::task::yield_now().await;
            d
        });
        // Delivered only once the close was deferred (or not).
        let seen = deferred.clone();
        let deliverer = std::thread::spawn(move || {
            while seen.load(std::sync::atomic::Ordering::SeqCst) == usize::MAX {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(20));
            d.deliver(true);
        });
        drop(rt);
        deliverer.join().unwrap();
        assert_eq!(deferred.load(std::sync::atomic::Ordering::SeqCst), 1, "the close was not deferred");
        assert_eq!(std::io::Read::read(&mut peer, &mut [0u8; 8]).unwrap(), 0, "not a FIN");
    }
}
