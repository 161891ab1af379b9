//! The guard on a server's TCP stream that was handed out while its client may still send a
//! handshake message: a Proposal that comes after the server stopped waiting (or from a client
//! that proposes in-band to a listener that cannot take it), or the client's answer to an
//! Accept the server timed out on. The message is taken off the stream before the application
//! reads, and a Proposal is answered with a Decline, so both sides stay in step and the
//! application sees exactly the client's own bytes.
//!
//! Cost on a plain connection: one look at the head of the stream (`MSG_PEEK`) before the
//! first read, and one byte comparison. The guard never takes the application's bytes: it
//! looks without taking, takes only a whole handshake message, and leaves everything else on
//! the socket, so whatever reads next (the stream, or the application's own system calls)
//! reads them in order. Bytes that start like a handshake message wait on the socket for the
//! rest (for clients on other hosts, [`PARTIAL_WAIT`]) before they are taken for data.
//!
//! A Proposal can only be answered while the application has written nothing: a Decline after
//! application bytes would be read as data. Once the application wrote, a late Proposal is
//! dropped silently; its client sees application bytes where it expected a reply, which tells a
//! client that registered at our door that we served it as TCP (an in-band client that cannot
//! tell us from a plain server closes and reconnects instead). Before the application's first
//! write, a Proposal that is already waiting is answered first.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::net::tcp_io::TcpIo;

use crate::proto::clc::{
    decode, ClcError, ClcMessage, Decline, DeclineReason, Decoded, Secret, CLC_EYECATCHER, CLC_MAX_LEN,
};
use crate::stats::Counters;

pub(crate) use crate::handshake::Owed;

/// How long bytes that start like a handshake message (from a lone first byte of the
/// eyecatcher to a whole header whose body is missing) wait for more before they are taken for
/// application data (each new byte starts the wait again). Our handshake messages are written whole and are far smaller than a
/// segment, so they arrive whole: a prefix that stays a prefix is someone else's bytes. The
/// wait only covers a segment split by a middlebox.
const PARTIAL_WAIT: Duration = Duration::from_millis(50);

/// How long a guard on a connection from `peer` waits on a partial prefix ([`PARTIAL_WAIT`]
/// for a client on another host). A client on this host has no middlebox between us: its
/// handshake messages, written whole, arrive whole, so a prefix is data at once and no plain
/// client of this host ever waits for a timer.
pub(crate) fn partial_wait_for(peer: Option<std::net::SocketAddr>, local: Option<std::net::SocketAddr>) -> Duration {
    if let Some(wait) = local.and_then(crate::faults::partial_wait) {
        return wait;
    }
    match peer {
        Some(p) if crate::sys::is_local_addr(p) => Duration::ZERO,
        _ => PARTIAL_WAIT,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing decided yet.
    Undecided,
    /// Nothing more to do: the socket is the stream (once a Decline owed is out).
    Done,
}

struct State {
    owed: Owed,
    phase: Phase,
    /// The application has written: a Proposal can no longer be answered.
    app_wrote: bool,
    /// A Decline still to be written before the application's next bytes.
    reply: Vec<u8>,
    /// Bytes on the socket that start like a handshake message wait for the rest until then.
    partial: Option<Box<Partial>>,
    /// How many bytes of such a prefix were there when its wait started: more start it again.
    seen: usize,
    /// The error a look met (a reset: the socket reports it once, and the look took it), owed
    /// to the next read.
    error: Option<i32>,
    /// How long a partial prefix waits for more ([`partial_wait_for`]).
    partial_wait: Duration,
}

/// The wait of a partial prefix for the rest of a possible handshake message (boxed: rare, and
/// the stream stays small without it).
struct Partial {
    deadline: tokio::time::Instant,
    /// Made when a call with a context waits for the deadline (a call without one reads the
    /// deadline, and may come from outside any runtime).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// See the module documentation.
pub(crate) struct InbandGuard {
    active: AtomicBool,
    state: Mutex<State>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for InbandGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InbandGuard").field("active", &self.is_active()).finish()
    }
}

/// What the bytes at the head of the stream are.
enum Class {
    /// Not a handshake message (or not one we expect): application data.
    Data,
    /// A prefix of a handshake message: wait for more.
    NeedMore,
    /// A message we take: its length, and the Decline to answer with (if any).
    Take(usize, Option<Vec<u8>>),
}

impl InbandGuard {
    pub(crate) fn new(owed: Owed, partial_wait: Duration, counters: Arc<Counters>) -> InbandGuard {
        InbandGuard {
            counters,
            active: AtomicBool::new(true),
            state: Mutex::new(State {
                owed,
                phase: Phase::Undecided,
                app_wrote: false,
                reply: Vec::new(),
                partial: None,
                seen: 0,
                error: None,
                partial_wait,
            }),
        }
    }

    /// Whether the guard still has work (cheap; the paths check it first).
    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Whether the guard owes the peer a reply, or bytes on the socket wait for the rest of a
    /// possible handshake message: the socket alone is then not the stream.
    pub(crate) fn holds_bytes(&self) -> bool {
        if !self.is_active() {
            return false;
        }
        let st = self.lock();
        !st.reply.is_empty() || st.partial.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before the application reads, peeks, waits for readability or makes its own system
    /// calls on the socket: the head of the stream is looked at without taking it, and a
    /// handshake message there is taken off (and declined if owed). `Ready(Ok)`: the socket is
    /// the stream, the caller reads (or peeks at) it itself; `Pending`: nothing to decide on
    /// yet, or a prefix waits for the rest. Without a context (`try_*`, readiness futures,
    /// the application's own calls) nothing is registered: the socket keeps one reader's
    /// waker, which those calls must not take, and the wait for the rest of a prefix is read
    /// as a deadline ([`partial_deadline`](Self::partial_deadline)).
    pub(crate) fn poll_settle(&self, cx: Option<&mut Context<'_>>, tcp: TcpIo<'_>) -> Poll<io::Result<()>> {
        self.poll_settle_as(cx, tcp, true)
    }

    /// As [`poll_settle`](Self::poll_settle) for a readiness wait, which reports an error the
    /// look met as readability and leaves it for the read that follows.
    pub(crate) fn poll_settle_ready(&self, tcp: TcpIo<'_>) -> Poll<io::Result<()>> {
        self.poll_settle_as(None, tcp, false)
    }

    fn poll_settle_as(&self, cx: Option<&mut Context<'_>>, tcp: TcpIo<'_>, read: bool) -> Poll<io::Result<()>> {
        if !self.is_active() {
            return Poll::Ready(Ok(()));
        }
        let mut st = self.lock();
        let r = self.poll_decide(cx, &mut st, tcp);
        match &r {
            Poll::Ready(Ok(())) => {
                let _ = flush_reply(tcp, &mut st);
                self.finish(&mut st);
            }
            // The read the error was owed to: from now on the socket is the stream.
            Poll::Ready(Err(_)) if read && st.error.take().is_some() => {
                st.phase = Phase::Done;
                let _ = flush_reply(tcp, &mut st);
                self.finish(&mut st);
            }
            _ => {}
        }
        r
    }

    /// When a prefix of a possible handshake message on the socket stops waiting for the rest
    /// and becomes data, if one waits (for a readiness future, which waits for it without the
    /// guard's timer).
    pub(crate) fn partial_deadline(&self) -> Option<tokio::time::Instant> {
        if !self.is_active() {
            return None;
        }
        let st = self.lock();
        st.partial.as_ref().filter(|_| st.phase == Phase::Undecided).map(|p| p.deadline)
    }

    /// Looks at the head of the stream until it decides (a message taken, or data left where it
    /// is), or the socket has nothing more for now (`Pending`, woken by readiness or the
    /// partial-prefix timer if there is a context).
    fn poll_decide(&self, mut cx: Option<&mut Context<'_>>, st: &mut State, tcp: TcpIo<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Some(code) = st.error {
                return Poll::Ready(Err(io::Error::from_raw_os_error(code)));
            }
            if st.phase == Phase::Done {
                return Poll::Ready(Ok(()));
            }
            // A look at the socket itself, whatever its readiness says: a prefix waiting for
            // the rest was left there with its readiness cleared, and must be looked at again
            // when its wait ends.
            let mut head = [std::mem::MaybeUninit::<u8>::uninit(); CLC_MAX_LEN];
            let n = match peek(tcp, &mut head) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    clear_readable(tcp);
                    // Bytes that came between the look and the clearing: look again.
                    match peek(tcp, &mut head) {
                        Ok(_) => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return owe(st, e),
                    }
                    match poll_read_ready(tcp, cx.as_deref_mut()) {
                        Poll::Ready(Ok(())) => continue,
                        other => return other,
                    }
                }
                Err(e) => return owe(st, e),
            };
            // SAFETY: the peek initialized the first `n` bytes of `head` (n <= head.len()),
            // and `MaybeUninit<u8>` has the layout of `u8`.
            let bytes = unsafe { std::slice::from_raw_parts(head.as_ptr().cast::<u8>(), n) };
            if n == 0 || bytes[0] != CLC_EYECATCHER[0] {
                // The end, or data: the fast and usual case, one look. Either is there for the
                // next read, whatever the socket's readiness says yet.
                st.phase = Phase::Done;
                tcp.assume_readable();
                continue;
            }
            match classify(bytes, st.owed, st.app_wrote) {
                Class::Data => {
                    st.phase = Phase::Done;
                    tcp.assume_readable();
                }
                Class::Take(len, reply) => {
                    // The message is on the socket, whole (the look saw it): taken off, nothing
                    // after it, whatever the socket's readiness says.
                    let mut taken = 0;
                    let sock = socket2::SockRef::from(tcp.socket());
                    while taken < len {
                        match sock.recv(&mut head[..len - taken]) {
                            Ok(0) => break,
                            Ok(k) => taken += k,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Poll::Ready(Err(e)),
                        }
                    }
                    if n > len {
                        // What follows it is there for the next read.
                        tcp.assume_readable();
                    }
                    self.counters.late_message();
                    tracing::debug!(owed = ?st.owed, answered = reply.is_some(), "took a late handshake message off the stream");
                    if let Some(r) = reply {
                        st.reply = r;
                        let _ = flush_reply(tcp, st);
                    }
                    st.partial = None;
                    st.phase = Phase::Done;
                }
                Class::NeedMore => {
                    if n > st.seen {
                        // Progress: the wait for the rest starts again.
                        st.seen = n;
                        st.partial = None;
                    }
                    if st.partial_wait.is_zero() {
                        st.phase = Phase::Done;
                        tcp.assume_readable();
                        continue;
                    }
                    if st.partial.is_none() {
                        self.counters.partial_wait();
                    }
                    let wait = st.partial_wait;
                    let p = st.partial.get_or_insert_with(|| {
                        let now = tokio::time::Instant::now();
                        // A wait too long to add is a wait for good (a year is that).
                        let deadline = now.checked_add(wait).unwrap_or(now + Duration::from_secs(365 * 86_400));
                        Box::new(Partial { deadline, timer: None })
                    });
                    let over = match cx.as_deref_mut() {
                        Some(cx) => {
                            let deadline = p.deadline;
                            let timer = p.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                            timer.as_mut().poll(cx).is_ready()
                        }
                        None => tokio::time::Instant::now() >= p.deadline,
                    };
                    // A prefix that stays a prefix is someone else's bytes (still on the socket,
                    // whose readiness may have been cleared for the wait); so is one after which
                    // the peer closed: no rest will come.
                    if over || read_closed(tcp) {
                        st.phase = Phase::Done;
                        tcp.assume_readable();
                        continue;
                    }
                    // The bytes stay on the socket, so its readiness stays set: cleared here,
                    // the wait is for the rest. More that came meanwhile: look again.
                    clear_readable(tcp);
                    match peek(tcp, &mut head) {
                        Ok(m) if m != n => continue,
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return owe(st, e),
                    }
                    match poll_read_ready(tcp, cx.as_deref_mut()) {
                        Poll::Ready(Ok(())) => {}
                        other => return other,
                    }
                }
            }
        }
    }

    /// Called before the application writes: answers a Proposal that is already waiting,
    /// writes a Decline still owed, and notes that the application has written (so later
    /// Proposals are dropped silently). `Pending` only while a Decline cannot be written yet
    /// (without a context, `try_write`, nothing is registered for it).
    pub(crate) fn poll_before_write(&self, mut cx: Option<&mut Context<'_>>, tcp: TcpIo<'_>) -> Poll<io::Result<()>> {
        if !self.is_active() {
            return Poll::Ready(Ok(()));
        }
        let mut st = self.lock();
        if st.phase == Phase::Undecided && !st.app_wrote {
            // What has arrived, without waiting, so a waiting Proposal is answered before the
            // application's bytes go out.
            let _ = self.poll_decide(None, &mut st, tcp);
        }
        st.app_wrote = true;
        loop {
            match flush_reply(tcp, &mut st) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match cx.as_deref_mut() {
                    Some(cx) => match tcp.poll_write_ready(cx) {
                        Poll::Ready(Ok(())) => continue,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => return Poll::Pending,
                    },
                    None => return Poll::Pending,
                },
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        if st.phase == Phase::Done {
            self.finish(&mut st);
        }
        Poll::Ready(Ok(()))
    }

    fn finish(&self, st: &mut State) {
        if st.reply.is_empty() {
            st.partial = None;
            self.active.store(false, Ordering::Release);
        }
    }
}

/// An error a look met: the socket reported it once (a reset), so it is kept for the read
/// that follows, whoever looked.
fn owe(st: &mut State, e: io::Error) -> Poll<io::Result<()>> {
    if let Some(code) = e.raw_os_error() {
        st.error = Some(code);
    }
    Poll::Ready(Err(e))
}

/// Looks at the head of the stream on the socket itself, whatever its readiness says (`EINTR`
/// retried): how many bytes it copied into `head`.
fn peek(tcp: TcpIo<'_>, head: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
    loop {
        match socket2::SockRef::from(tcp.socket()).peek(head) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// Whether the socket's readiness says the peer closed its side (its end is queued after any
/// bytes a look sees), without waiting.
fn read_closed(tcp: TcpIo<'_>) -> bool {
    let ready = std::pin::pin!(tcp.socket().ready(tokio::io::Interest::READABLE));
    matches!(ready.poll(&mut Context::from_waker(std::task::Waker::noop())), Poll::Ready(Ok(r)) if r.is_read_closed())
}

/// Clears the socket's read readiness, assumed and tokio's, so that a wait for it is a wait for
/// bytes that come from now on.
fn clear_readable(tcp: TcpIo<'_>) {
    let would_block = || Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock));
    // The first clears an assumed readiness, the second tokio's (each is a no-op where unset).
    let _ = tcp.try_io(tokio::io::Interest::READABLE, would_block);
    let _ = tcp.try_io(tokio::io::Interest::READABLE, would_block);
}

/// The socket's read readiness for a call with a context; `Pending` without one (the caller
/// does not wait, and the socket's one reader waker stays whose it is).
fn poll_read_ready(tcp: TcpIo<'_>, cx: Option<&mut Context<'_>>) -> Poll<io::Result<()>> {
    match cx {
        Some(cx) => tcp.poll_read_ready(cx),
        None => Poll::Pending,
    }
}

/// Writes what is left of a Decline; `WouldBlock` while the socket cannot take it.
fn flush_reply(tcp: TcpIo<'_>, st: &mut State) -> io::Result<()> {
    while !st.reply.is_empty() {
        match tcp.try_write(&st.reply) {
            Ok(n) => {
                st.reply.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(e),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // The socket will take no more (its write side shut, or the connection
                // gone): the reply is dropped, so that the guard can finish.
                st.reply.clear();
                return Err(e);
            }
        }
    }
    Ok(())
}

fn classify(held: &[u8], owed: Owed, app_wrote: bool) -> Class {
    match decode(held) {
        Ok(Decoded::NeedMore(_)) => Class::NeedMore,
        Ok(Decoded::Message(m, len)) => match (owed, m) {
            (Owed::Proposal(reason), ClcMessage::Proposal(p)) => {
                let reply = (!app_wrote).then(|| decline(p.secret, reason));
                Class::Take(len, reply)
            }
            (Owed::Answer, ClcMessage::Confirm(_) | ClcMessage::Decline(_)) => Class::Take(len, None),
            _ => Class::Data,
        },
        // A proposal in a version we do not speak: its framing is sound, so it is taken and
        // declined as the handshake would (the secret sits in a body we do not parse).
        Err(ClcError::UnsupportedVersion { len, .. }) if matches!(owed, Owed::Proposal(_)) => {
            let len = usize::from(len);
            if len > CLC_MAX_LEN {
                // No version of ours sends one this large: not a handshake message.
                Class::Data
            } else if held.len() < len {
                Class::NeedMore
            } else {
                Class::Take(len, (!app_wrote).then(|| decline(Secret::default(), DeclineReason::VersionMismatch)))
            }
        }
        Err(_) => Class::Data,
    }
}

fn decline(secret: Secret, reason: DeclineReason) -> Vec<u8> {
    ClcMessage::Decline(Decline { secret, reason }).encode().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::clc::{Confirm, LinkInfo, Proposal, ShmLinkInfo};

    fn proposal() -> Vec<u8> {
        ClcMessage::Proposal(Proposal { secret: Secret([5; 16]), rmb_size: 0, shm: None, rdma: None }).encode().unwrap()
    }

    #[test]
    fn classification() {
        let p = proposal();
        let owed = Owed::Proposal(DeclineReason::Timeout);
        assert!(matches!(classify(b"GET /", owed, false), Class::Data));
        assert!(matches!(classify(&p[..3], owed, false), Class::NeedMore));
        assert!(matches!(classify(&p[..p.len() - 1], owed, false), Class::NeedMore));
        match classify(&p, owed, false) {
            Class::Take(n, Some(reply)) => {
                assert_eq!(n, p.len());
                assert!(matches!(
                    decode(&reply),
                    Ok(Decoded::Message(ClcMessage::Decline(Decline { reason: DeclineReason::Timeout, .. }), _))
                ));
            }
            _ => panic!("a whole proposal is taken and answered"),
        }
        assert!(matches!(classify(&p, owed, true), Class::Take(_, None)), "silent once the app wrote");
        // Not the message we owe: data.
        assert!(matches!(classify(&p, Owed::Answer, false), Class::Data));
        let confirm = ClcMessage::Confirm(Confirm {
            secret: Secret([5; 16]),
            link: LinkInfo::Shm(ShmLinkInfo { link_group: 1, rmb_slot: 1, rmb_size: 4096, socket_name: Vec::new() }),
        })
        .encode()
        .unwrap();
        assert!(matches!(classify(&confirm, Owed::Answer, false), Class::Take(_, None)));
        assert!(matches!(classify(&confirm, owed, false), Class::Data));
        // A broken frame after the eyecatcher is data.
        let mut bad = p.clone();
        let n = bad.len();
        bad[n - 1] = 0;
        assert!(matches!(classify(&bad, owed, false), Class::Data));
    }
}
