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
//! the delivery fails (the link failed), or the process exits or the runtime ends first, the
//! socket closes with its zero linger: a reset, which the peer reads as an end that may have
//! lost bytes (`SmcError::PeerGone` after what arrived), and which waits, on the peer, for a
//! close still in flight over the link as a FIN does.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::link::Link;

/// Ready with whether the close was delivered.
type PollDelivered = dyn FnMut(&mut Context<'_>) -> Poll<bool> + Send;

/// A TCP socket whose FIN waits for the delivery of our close over `link`; a reset if the
/// delivery fails or never comes. A future: run on a runtime, it closes the socket as soon
/// as the close is delivered. Dropped before that, it looks once more, without waiting.
pub(crate) struct FinOnDelivery {
    /// Ready with whether the close was delivered (`false`: the link failed first).
    delivered: Box<PollDelivered>,
    tcp: Option<Arc<TcpStream>>,
    /// The socket's own `SO_LINGER`, put back for the FIN.
    linger: Option<Duration>,
    /// The link's wait at a shutdown: used once spawned on a runtime, which drops it unfinished
    /// only when it shuts down, where a short wait for the delivery is worth it.
    wait: Arc<ShutdownWait>,
    on_runtime: bool,
}

/// How long the closes still in flight over one link when their runtime shuts down wait, all
/// together, for their delivery before their sockets reset (a process that returns from `main`
/// right after it dropped its streams ends this way, and its queue pairs go with it). A close
/// SEND completes within a round trip on a live fabric (microseconds; about 2 ms on the
/// soft-RoCE guests, the slowest path we run); a link that is dead without having failed yet
/// gives nothing in time, and costs the shutdown this once, however many closes it holds.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(100);

/// The one wait ([`SHUTDOWN_WAIT`]) that the closes in flight over a link share when a shutdown
/// drops them: the first one dropped starts it, and the others dropped within a second of its
/// end share it; one dropped later (another runtime's shutdown) starts another.
#[derive(Debug, Default)]
pub(crate) struct ShutdownWait(std::sync::atomic::AtomicU64);

impl ShutdownWait {
    /// When the wait of a close dropped now ends.
    fn ends(&self) -> std::time::Instant {
        use std::sync::atomic::Ordering::Relaxed;
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let epoch = *EPOCH.get_or_init(std::time::Instant::now);
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        // Milliseconds since `epoch`, plus one: zero is "never started".
        let now = ms(epoch.elapsed()) + 1;
        let fresh = now + ms(SHUTDOWN_WAIT);
        // Relaxed: a deadline, nothing is published through it.
        let end = match self.0.fetch_update(Relaxed, Relaxed, |end| (end == 0 || end + 1000 < now).then_some(fresh)) {
            Ok(_) => fresh,
            Err(end) => end,
        };
        epoch + Duration::from_millis(end - 1)
    }
}

impl FinOnDelivery {
    /// Holds `tcp` until every message handed to `link` so far (the close among them) is
    /// delivered. Sets the socket's linger to zero meanwhile.
    pub(crate) fn new(link: Arc<dyn Link>, tcp: Arc<TcpStream>, wait: Arc<ShutdownWait>) -> FinOnDelivery {
        let mark = link.tx_mark();
        Self::with(tcp, wait, move |cx| link.poll_delivered(cx, mark).map(|r| r.is_ok()))
    }

    fn with(
        tcp: Arc<TcpStream>,
        wait: Arc<ShutdownWait>,
        delivered: impl FnMut(&mut Context<'_>) -> Poll<bool> + Send + 'static,
    ) -> FinOnDelivery {
        // A socket whose linger cannot be read has the default: none.
        let linger = socket2::SockRef::from(&*tcp).linger().unwrap_or(None);
        crate::sys::set_zero_linger(&*tcp);
        FinOnDelivery { delivered: Box::new(delivered), tcp: Some(tcp), linger, wait, on_runtime: false }
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

    /// Runs to the end on the current runtime; without one, settles now.
    pub(crate) fn spawn(mut self) {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                self.on_runtime = true;
                drop(rt.spawn(self));
            }
            Err(_) => drop(self),
        }
    }
}

impl Future for FinOnDelivery {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut().settle(cx) {
            Some(_) => Poll::Ready(()),
            None => Poll::Pending,
        }
    }
}

impl Drop for FinOnDelivery {
    fn drop(&mut self) {
        if self.tcp.is_none() {
            return;
        }
        // Not run to the end (no runtime, or its runtime shut down): a close delivered by now
        // still ends with a FIN; one still in flight with a reset. Dropped by a runtime's
        // shutdown, it waits a little for the delivery first (no lock of ours is held there;
        // without a runtime the caller may hold its connection's).
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let until = if self.on_runtime { Some(self.wait.ends()) } else { None };
        while self.settle(&mut cx).is_none() {
            match until {
                // Nothing else may reap the completions now (the group's driver went with the
                // runtime): each look reaps them itself.
                Some(t) if std::time::Instant::now() < t => std::thread::sleep(Duration::from_micros(200)),
                _ => {
                    self.tcp = None;
                    return;
                }
            }
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

    fn fin(tcp: Arc<TcpStream>) -> (FinOnDelivery, Arc<Scripted>) {
        let d = Arc::new(Scripted::default());
        let polled = d.clone();
        let f = FinOnDelivery::with(tcp, Arc::default(), move |cx| {
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
        tokio::time::timeout(Duration::from_secs(10), peer.read(&mut b)).await.expect("the peer heard of the end")
    }

    fn linger(tcp: &TcpStream) -> Option<Duration> {
        socket2::SockRef::from(tcp).linger().unwrap()
    }

    #[tokio::test]
    async fn a_delivered_close_ends_with_a_fin_and_the_sockets_own_linger() {
        let (tcp, mut peer) = pair().await;
        socket2::SockRef::from(&*tcp).set_linger(Some(Duration::from_secs(3))).unwrap();
        let kept = tcp.clone();
        let (f, d) = fin(tcp);
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
        let (f, d) = fin(tcp);
        let task = tokio::spawn(f);
        tokio::task::yield_now().await;
        d.deliver(false);
        tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
        assert_eq!(end_seen(&mut peer).await.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
    }

    #[tokio::test]
    async fn dropped_before_its_delivery_it_resets_and_after_it_sends_a_fin() {
        let (tcp, mut peer) = pair().await;
        let (f, _d) = fin(tcp);
        drop(f);
        assert_eq!(end_seen(&mut peer).await.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);

        let (tcp, mut peer) = pair().await;
        let (f, d) = fin(tcp);
        d.deliver(true);
        drop(f);
        assert_eq!(end_seen(&mut peer).await.unwrap(), 0);
    }

    /// A runtime's shutdown drops a close still in flight: it waits a little for the delivery.
    fn dropped_by_a_shutdown(deliver_after: Option<Duration>) -> std::io::Result<usize> {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let d = rt.block_on(async {
            let (f, d) = fin(Arc::new(TcpStream::from_std(c).unwrap()));
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
        assert_eq!(dropped_by_a_shutdown(Some(Duration::from_millis(20))).unwrap(), 0);
    }

    #[test]
    fn a_close_never_delivered_while_its_runtime_shuts_down_ends_with_a_reset() {
        let e = dropped_by_a_shutdown(None).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
    }
}
