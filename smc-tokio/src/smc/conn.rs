//! One SMC connection: the engine's state behind a lock, the wakers of the tasks that wait on
//! it, and the copies between the application's buffers and the link.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use tokio::io::ReadBuf;
use tokio::net::TcpStream;

use crate::link::LinkError;
use crate::proto::cdc::CdcMsg;
use crate::proto::cursor::RingSize;
use crate::proto::engine::ConnEngine;
use crate::smc::group::LinkGroup;

/// Why a connection ended abnormally.
#[derive(Debug, Clone)]
enum ConnError {
    /// The peer aborted (reset) the connection.
    Reset,
    /// The link group failed (peer process gone, link protocol broken).
    Link(LinkError),
    /// The peer broke the connection protocol (bad cursor, sequence, flags).
    Protocol(String),
    /// The TCP connection closed or reset without an SMC close.
    TcpClosed,
}

impl ConnError {
    fn to_io(&self) -> io::Error {
        match self {
            ConnError::Reset => io::Error::new(
                io::ErrorKind::ConnectionReset,
                "smc connection reset by peer",
            ),
            ConnError::Link(LinkError::PeerGone) => {
                io::Error::new(io::ErrorKind::ConnectionReset, "smc peer process is gone")
            }
            ConnError::Link(e) => io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("smc link failed: {e}"),
            ),
            ConnError::Protocol(w) => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("smc peer broke the protocol: {w}"),
            ),
            ConnError::TcpClosed => io::Error::new(
                io::ErrorKind::ConnectionReset,
                "tcp connection closed under the smc connection",
            ),
        }
    }
}

struct ConnState {
    engine: ConnEngine,
    /// The peer's token: its RMB slot we read from, and the token our CDC messages carry.
    /// `None` on the server until the client's Confirm arrives.
    peer_token: Option<u32>,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
    error: Option<ConnError>,
    /// Kept until our close is announced, so the peer never sees the TCP connection close
    /// before the SMC close.
    tcp: Option<Arc<TcpStream>>,
    /// The application dropped its handle.
    released: bool,
}

pub(crate) struct SmcConn {
    group: Arc<LinkGroup>,
    our_token: u32,
    state: Mutex<ConnState>,
    me: Weak<SmcConn>,
}

impl std::fmt::Debug for SmcConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcConn")
            .field("group", &self.group.id)
            .field("token", &self.our_token)
            .finish()
    }
}

fn wake(w: &mut Option<Waker>) {
    if let Some(w) = w.take() {
        w.wake();
    }
}

impl SmcConn {
    /// A connection on `group` that writes into the peer's RMBs of `tx_ring` bytes (through our
    /// slot `our_token`) and reads from ours of `rx_ring` bytes.
    pub(crate) fn new(
        group: Arc<LinkGroup>,
        our_token: u32,
        peer_token: Option<u32>,
        tx_ring: RingSize,
        rx_ring: RingSize,
    ) -> Arc<SmcConn> {
        Arc::new_cyclic(|me| SmcConn {
            group,
            our_token,
            state: Mutex::new(ConnState {
                engine: ConnEngine::new(peer_token.unwrap_or(0), tx_ring, rx_ring),
                peer_token,
                rx_waker: None,
                tx_waker: None,
                error: None,
                tcp: None,
                released: false,
            }),
            me: me.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, ConnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn our_token(&self) -> u32 {
        self.our_token
    }

    pub(crate) fn group(&self) -> &Arc<LinkGroup> {
        &self.group
    }

    /// Server side: the client's Confirm named its token.
    pub(crate) fn confirm(&self, peer_token: u32) {
        let mut st = self.lock();
        st.peer_token = Some(peer_token);
        // Nothing can have been sent yet (there was no peer token), so only the token changes;
        // what was received meanwhile is kept.
        st.engine.set_token(peer_token);
        self.flush_cdc(&mut st);
    }

    /// Keeps the connection's TCP socket open until our SMC close is announced.
    pub(crate) fn hold_tcp(&self, tcp: Arc<TcpStream>) {
        self.lock().tcp = Some(tcp);
    }

    // ----- application side ------------------------------------------------------------------

    pub(crate) fn poll_read(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        for attempt in 0..2 {
            let mut st = self.lock();
            if let Some(e) = &st.error {
                return Poll::Ready(Err(e.to_io()));
            }
            let avail = st.engine.rx_available();
            if avail > 0 {
                let n = avail.min(u32::try_from(buf.remaining()).unwrap_or(u32::MAX));
                return Poll::Ready(self.copy_out(&mut st, buf, n));
            }
            if st.engine.peer_aborted() {
                return Poll::Ready(Err(ConnError::Reset.to_io()));
            }
            if st.engine.rx_eof() {
                return Poll::Ready(Ok(()));
            }
            if attempt == 0 {
                // Fast path: drain the link ourselves rather than wait for the driver's turn,
                // spinning first for up to the busy-poll budget.
                drop(st);
                self.spin_for_frames();
                self.group.progress();
                continue;
            }
            st.rx_waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    fn spin_for_frames(&self) {
        let Some(link) = self.group.link() else {
            return;
        };
        let budget = link.busy_poll();
        if budget.is_zero() {
            return;
        }
        let until = std::time::Instant::now() + budget;
        while !link.has_pending() && std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
    }

    fn copy_out(&self, st: &mut ConnState, buf: &mut ReadBuf<'_>, n: u32) -> io::Result<()> {
        let (Some(link), Some(peer_token)) = (self.group.link(), st.peer_token) else {
            return Err(io::Error::other(
                "smc connection read before it was established",
            ));
        };
        let Some(spans) = st.engine.rx_spans(n) else {
            return Err(io::Error::other("rx span"));
        };
        let mut done = 0usize;
        for (off, len) in spans {
            if len == 0 {
                continue;
            }
            // SAFETY: rmb_read writes exactly `len` bytes into this part of the unfilled region
            // (or fails without claiming them); they are marked initialized only afterwards.
            let dst = unsafe { &mut buf.unfilled_mut()[done..done + len as usize] };
            if let Err(e) = link.rmb_read(peer_token, off, dst) {
                self.fail_locked(st, ConnError::Link(e.clone()));
                return Err(ConnError::Link(e).to_io());
            }
            done += len as usize;
        }
        // SAFETY: the first `done` unfilled bytes were written by rmb_read above.
        unsafe { buf.assume_init(done) };
        buf.advance(done);
        // rx_spans succeeded for n, so consuming n cannot fail.
        let _ = st.engine.rx_consume(n);
        self.flush_cdc(st);
        Ok(())
    }

    pub(crate) fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, data.len(), |link, token, spans, engine_n| {
            let mut at = 0usize;
            for (off, len) in spans {
                if len > 0 {
                    link.rmb_write(token, off, &data[at..at + len as usize])?;
                    at += len as usize;
                }
            }
            debug_assert_eq!(at, engine_n as usize);
            Ok(())
        })
    }

    pub(crate) fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        self.poll_write_with(cx, total, |link, token, spans, n| {
            // Walk the buffers and the (at most two) ring spans together.
            let mut src = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty());
            let mut cur: &[u8] = &[];
            let mut left = n as usize;
            for (mut off, len) in spans {
                let mut room = len as usize;
                while room > 0 && left > 0 {
                    if cur.is_empty() {
                        cur = src.next().unwrap_or(&[]);
                        if cur.is_empty() {
                            return Err(LinkError::Protocol("vectored write ran out of data"));
                        }
                    }
                    let k = cur.len().min(room).min(left);
                    link.rmb_write(token, off, &cur[..k])?;
                    cur = &cur[k..];
                    off += k as u32;
                    room -= k;
                    left -= k;
                }
            }
            Ok(())
        })
    }

    fn poll_write_with(
        &self,
        cx: &mut Context<'_>,
        len: usize,
        copy: impl Fn(&Arc<dyn crate::link::Link>, u32, [(u32, u32); 2], u32) -> Result<(), LinkError>,
    ) -> Poll<io::Result<usize>> {
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        for attempt in 0..2 {
            let mut st = self.lock();
            if let Some(e) = &st.error {
                return Poll::Ready(Err(e.to_io()));
            }
            if st.engine.is_write_shutdown() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "write after shutdown",
                )));
            }
            if st.engine.peer_aborted() {
                return Poll::Ready(Err(ConnError::Reset.to_io()));
            }
            if st.engine.peer_closed() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "smc peer closed the connection",
                )));
            }
            let free = st.engine.tx_free();
            if free > 0 {
                let n = free.min(u32::try_from(len).unwrap_or(u32::MAX));
                let Some(link) = self.group.link() else {
                    return Poll::Ready(Err(io::Error::other(
                        "smc connection written before it was established",
                    )));
                };
                let Some(spans) = st.engine.tx_spans(n) else {
                    return Poll::Ready(Err(io::Error::other("tx span")));
                };
                if let Err(e) = copy(link, self.our_token, spans, n) {
                    self.fail_locked(&mut st, ConnError::Link(e.clone()));
                    return Poll::Ready(Err(ConnError::Link(e).to_io()));
                }
                // tx_spans succeeded for n, so committing n cannot fail.
                let _ = st.engine.tx_commit(n);
                self.flush_cdc(&mut st);
                return Poll::Ready(Ok(n as usize));
            }
            st.engine.set_write_blocked();
            self.flush_cdc(&mut st);
            if attempt == 0 {
                drop(st);
                self.group.progress();
                continue;
            }
            st.tx_waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Test hook: sends the CDC message this connection would send next (or a plain state
    /// update), after `corrupt` edited its encoded bytes. The engine does not record it.
    #[cfg(feature = "test-util")]
    pub(crate) fn send_corrupt_cdc(
        &self,
        corrupt: impl FnOnce(&mut [u8; crate::proto::cdc::CDC_MSG_LEN]),
    ) -> io::Result<()> {
        let st = self.lock();
        let (Some(link), Some(token)) = (self.group.link(), st.peer_token) else {
            return Err(io::Error::other("not established"));
        };
        let msg = st
            .engine
            .poll_cdc()
            .unwrap_or_else(|| st.engine.state_msg(token));
        let mut frame = msg.encode();
        corrupt(&mut frame);
        link.cdc_send_frame(&frame)
            .map(drop)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The link group's id.
    pub(crate) fn group_id(&self) -> u64 {
        self.group.id
    }

    /// Half-close: the peer reads EOF after the bytes written so far.
    pub(crate) fn shutdown(&self) -> io::Result<()> {
        let mut st = self.lock();
        if let Some(e) = &st.error {
            return Err(e.to_io());
        }
        st.engine.shutdown_write();
        self.flush_cdc(&mut st);
        Ok(())
    }

    /// The application dropped the stream: close (or, with unread data, abort, as TCP resets a
    /// connection closed with unread data).
    pub(crate) fn release(&self) {
        let mut st = self.lock();
        st.released = true;
        if st.error.is_none() {
            if st.engine.rx_available() > 0 && !st.engine.rx_eof() {
                st.engine.abort();
            } else {
                st.engine.set_corked(false);
                st.engine.close();
            }
            self.flush_cdc(&mut st);
        }
        st.rx_waker = None;
        st.tx_waker = None;
        let done = st.error.is_some() || st.engine.finished();
        drop(st);
        if done {
            self.group.unregister(self.our_token);
        }
    }

    // ----- link side -------------------------------------------------------------------------

    /// Sends every CDC message the engine owes. Called with the state locked.
    fn flush_cdc(&self, st: &mut ConnState) {
        if st.peer_token.is_none() {
            return;
        }
        let Some(link) = self.group.link() else {
            return;
        };
        while let Some(msg) = st.engine.poll_cdc() {
            match link.cdc_send(&msg) {
                Ok(true) => st.engine.on_cdc_sent(&msg),
                Ok(false) => {
                    if let Some(me) = self.me.upgrade() {
                        self.group.wait_cdc_space(&me);
                    }
                    return;
                }
                Err(e) => {
                    st.error.get_or_insert(ConnError::Link(e));
                    wake(&mut st.rx_waker);
                    wake(&mut st.tx_waker);
                    return;
                }
            }
        }
        if st.engine.close_sent() {
            st.tcp = None;
        }
    }

    /// Retries CDC messages that found the link full.
    pub(crate) fn retry_cdc(&self) {
        let mut st = self.lock();
        self.flush_cdc(&mut st);
        self.maybe_finish(st);
    }

    fn maybe_finish(&self, st: MutexGuard<'_, ConnState>) {
        let done = st.released && (st.engine.finished() || st.error.is_some());
        drop(st);
        if done {
            self.group.unregister(self.our_token);
        }
    }

    /// A CDC message for this connection.
    pub(crate) fn on_cdc(&self, msg: &CdcMsg) {
        let mut st = self.lock();
        if st.error.is_some() {
            return;
        }
        match st.engine.on_cdc(msg) {
            Ok((effect, _inline)) => {
                if effect.readable {
                    wake(&mut st.rx_waker);
                }
                if effect.writable {
                    wake(&mut st.tx_waker);
                }
                if st.engine.peer_aborted() {
                    st.error = Some(ConnError::Reset);
                }
                // A blocked writer on the other side waits for our consumer cursor.
                self.flush_cdc(&mut st);
            }
            Err(e) => {
                tracing::debug!(token = self.our_token, error = %e, "aborting connection: bad CDC message");
                self.fail_locked(&mut st, ConnError::Protocol(e.to_string()));
            }
        }
        self.maybe_finish(st);
    }

    fn fail_locked(&self, st: &mut ConnState, err: ConnError) {
        if st.error.is_none() {
            st.error = Some(err);
            st.engine.abort();
            self.flush_cdc(st);
        }
        wake(&mut st.rx_waker);
        wake(&mut st.tx_waker);
    }

    /// The peer sent something that does not decode.
    pub(crate) fn fail_protocol(&self, what: String) {
        let mut st = self.lock();
        self.fail_locked(&mut st, ConnError::Protocol(what));
        self.maybe_finish(st);
    }

    /// The link group failed; the group has already forgotten this connection.
    pub(crate) fn fail_link(&self, err: &LinkError) {
        let mut st = self.lock();
        if st.error.is_none() {
            st.error = Some(ConnError::Link(err.clone()));
        }
        st.tcp = None;
        wake(&mut st.rx_waker);
        wake(&mut st.tx_waker);
    }

    /// Whether the peer closed (or aborted) the SMC connection, or it failed.
    pub(crate) fn closed_by_peer(&self) -> bool {
        let st = self.lock();
        st.engine.peer_closed() || st.error.is_some()
    }

    /// The TCP connection under this SMC connection became readable: EOF, a reset, or bytes
    /// (which an SMC peer never sends). Unless the peer already closed the SMC connection in
    /// order, that aborts it. Pending CDC messages are taken first, because the peer announces
    /// its close before it closes TCP.
    pub(crate) fn on_tcp_event(&self, res: io::Result<usize>) {
        self.group.progress();
        let mut st = self.lock();
        let orderly = matches!(res, Ok(0)) && (st.engine.peer_closed() || st.error.is_some());
        if !orderly {
            tracing::debug!(
                token = self.our_token,
                ?res,
                "tcp connection ended under smc"
            );
            self.fail_locked(&mut st, ConnError::TcpClosed);
        }
        self.maybe_finish(st);
    }
}

/// A connection registered during a handshake that has not been handed to the application:
/// dropping the guard (a failed or abandoned handshake) gives its slot back.
#[derive(Debug, Default)]
pub(crate) struct PendingConn(Option<Arc<SmcConn>>);

impl PendingConn {
    pub(crate) fn set(&mut self, conn: Arc<SmcConn>) {
        self.release();
        self.0 = Some(conn);
    }

    pub(crate) fn get(&self) -> Option<&Arc<SmcConn>> {
        self.0.as_ref()
    }

    pub(crate) fn take(&mut self) -> Option<Arc<SmcConn>> {
        self.0.take()
    }

    fn release(&mut self) {
        if let Some(c) = self.0.take() {
            c.group().unregister(c.our_token());
        }
    }
}

impl Drop for PendingConn {
    fn drop(&mut self) {
        self.release();
    }
}
