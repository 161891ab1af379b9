//! A stream's TCP socket as its TCP path uses it: tokio's readiness, with the readiness an
//! accepted socket starts out with.
//!
//! tokio (since 1.54) takes a socket returned by `accept` to be readable and writable until an
//! operation finds otherwise, so that the first read and write after an accept try the socket
//! instead of waiting for the driver's first event (one event-loop round less per connection).
//! A listener that hands out sockets it took from the kernel itself (as `SmcListener::accept`
//! does, to return a connection on the first poll) gets tokio streams without that assumption,
//! so the stream keeps it here: [`Assumed`] holds the directions still assumed ready, and each
//! operation below tries the socket directly while its direction is assumed, clears the
//! assumption at the first `WouldBlock`, and from then on is tokio's own operation. A false
//! positive costs one system call; no event is lost, since tokio's registration saw the
//! socket's state when it was registered and every edge after it.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use tokio::io::{Interest, ReadBuf, Ready};
use tokio::net::TcpStream;

const READ: u8 = 1;
const WRITE: u8 = 2;

/// The directions of a stream's TCP socket still assumed ready (see the module documentation).
///
/// Ordering: the flags are hints about one socket, never published with other data: a reader
/// that sees a stale bit makes one extra system call, one that misses a bit waits for tokio's
/// event, which comes. `Relaxed` throughout.
#[derive(Debug, Default)]
pub(crate) struct Assumed(AtomicU8);

impl Assumed {
    /// Assumes both directions ready from now on.
    pub(crate) fn set_accepted(&self) {
        self.0.store(READ | WRITE, Ordering::Relaxed);
    }

    fn get(&self, interest: Interest) -> u8 {
        self.0.load(Ordering::Relaxed) & bits(interest)
    }

    fn clear(&self, bits: u8) {
        self.0.fetch_and(!bits, Ordering::Relaxed);
    }
}

fn bits(interest: Interest) -> u8 {
    let mut b = 0;
    if interest.is_readable() {
        b |= READ;
    }
    if interest.is_writable() {
        b |= WRITE;
    }
    b
}

fn ready_of(bits: u8) -> Ready {
    let mut r = Ready::EMPTY;
    if bits & READ != 0 {
        r |= Ready::READABLE;
    }
    if bits & WRITE != 0 {
        r |= Ready::WRITABLE;
    }
    r
}

/// Ready, for a unit of the task's cooperative budget; `Pending` (the task woken to run again
/// after the others) once the budget is spent.
fn spend_budget(cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
    coop.made_progress();
    Poll::Ready(Ok(()))
}

/// The TCP socket of a stream and its assumed readiness, borrowed for one operation.
#[derive(Clone, Copy)]
pub(crate) struct TcpIo<'a> {
    tcp: &'a TcpStream,
    assumed: &'a Assumed,
}

impl<'a> TcpIo<'a> {
    pub(crate) fn new(tcp: &'a TcpStream, assumed: &'a Assumed) -> TcpIo<'a> {
        TcpIo { tcp, assumed }
    }

    /// The socket.
    pub(crate) fn socket(self) -> &'a TcpStream {
        self.tcp
    }

    /// Takes the socket to be readable again: bytes are known to be queued on it (a look that
    /// left them there), whatever its readiness says.
    pub(crate) fn assume_readable(self) {
        self.assumed.0.fetch_or(READ, Ordering::Relaxed);
    }

    /// Runs `f` if the socket is (or is assumed) ready for `interest`, as
    /// [`TcpStream::try_io`] does.
    pub(crate) fn try_io<R>(self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        let b = self.assumed.get(interest);
        if b == 0 {
            return self.tcp.try_io(interest, f);
        }
        match f() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.assumed.clear(b);
                Err(e)
            }
            r => r,
        }
    }

    /// Waits for `interest` and runs `f` until it does not answer `WouldBlock`, as
    /// [`TcpStream::async_io`] does.
    pub(crate) async fn async_io<R>(self, interest: Interest, mut f: impl FnMut() -> io::Result<R>) -> io::Result<R> {
        let b = self.assumed.get(interest);
        if b != 0 {
            // A unit of the task's cooperative budget, as tokio's readiness spends one.
            let coop = std::future::poll_fn(tokio::task::coop::poll_proceed).await;
            match f() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.assumed.clear(b),
                r => {
                    coop.made_progress();
                    return r;
                }
            }
        }
        self.tcp.async_io(interest, f).await
    }

    /// A read that does not wait (the tests' view of the assumed readiness).
    #[cfg(test)]
    pub(crate) fn try_read(self, buf: &mut [u8]) -> io::Result<usize> {
        self.try_io(Interest::READABLE, || (&*socket2::SockRef::from(self.tcp)).read(buf))
    }

    pub(crate) fn try_read_vectored(self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.try_io(Interest::READABLE, || (&*socket2::SockRef::from(self.tcp)).read_vectored(bufs))
    }

    pub(crate) fn try_write(self, buf: &[u8]) -> io::Result<usize> {
        // socket2's `Write` sends with MSG_NOSIGNAL, as mio's does.
        self.try_io(Interest::WRITABLE, || (&*socket2::SockRef::from(self.tcp)).write(buf))
    }

    pub(crate) fn try_write_vectored(self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.try_io(Interest::WRITABLE, || (&*socket2::SockRef::from(self.tcp)).write_vectored(bufs))
    }

    /// Whether the socket is assumed readable (a read should try it before waiting).
    pub(crate) fn assumed_readable(self) -> bool {
        self.assumed.get(Interest::READABLE) != 0
    }

    /// Read readiness, as [`TcpStream::poll_read_ready`]; an assumed direction is ready at once,
    /// for a unit of the task's cooperative budget, as tokio's readiness spends one (a stream
    /// whose socket always has bytes would otherwise never yield to the runtime).
    pub(crate) fn poll_read_ready(self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.assumed_readable() {
            return spend_budget(cx);
        }
        self.tcp.poll_read_ready(cx)
    }

    /// Write readiness; as [`poll_read_ready`](Self::poll_read_ready).
    pub(crate) fn poll_write_ready(self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.assumed.get(Interest::WRITABLE) != 0 {
            return spend_budget(cx);
        }
        self.tcp.poll_write_ready(cx)
    }

    /// Waits for any of `interest`, as [`TcpStream::ready`] does; an assumed direction is
    /// ready at once.
    pub(crate) async fn ready(self, interest: Interest) -> io::Result<Ready> {
        let b = self.assumed.get(interest);
        if b != 0 {
            return Ok(ready_of(b));
        }
        self.tcp.ready(interest).await
    }

    /// Peeks as [`TcpStream::poll_peek`] does, trying the socket first while it is assumed
    /// readable.
    pub(crate) fn poll_peek(self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<usize>> {
        if self.assumed_readable() {
            std::task::ready!(spend_budget(cx))?;
            match peek_into(self.tcp, buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.assumed.clear(READ),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        self.tcp.poll_peek(cx, buf)
    }

    /// A peek that does not wait, through the socket's (assumed) readiness, as
    /// [`try_io`](Self::try_io) runs a call.
    pub(crate) fn try_peek(self, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
        self.try_io(Interest::READABLE, || peek_into(self.tcp, buf))
    }
}

/// One `MSG_PEEK` of `tcp` into `buf`'s unfilled part, which it fills by what it copied.
fn peek_into(tcp: &TcpStream, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
    // SAFETY: the unfilled part of a ReadBuf is valid for writes of its length; the peek writes
    // at most that many bytes and never de-initializes any, and only the count it returned is
    // marked initialized below.
    let unfilled = unsafe { buf.unfilled_mut() };
    let n = socket2::SockRef::from(tcp).peek(unfilled)?;
    // SAFETY: the peek initialized the first `n` bytes of the unfilled region.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_assumption_lasts_until_the_first_would_block() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let s = TcpStream::from_std(s).unwrap();
        let a = Assumed::default();
        a.set_accepted();
        let io = TcpIo::new(&s, &a);
        let noop = &mut Context::from_waker(std::task::Waker::noop());
        assert!(io.poll_read_ready(noop).is_ready());
        assert_eq!(io.try_read(&mut [0u8; 4]).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(!io.assumed_readable(), "the first WouldBlock ends the assumption");
        // Writable is still assumed; the write goes straight to the socket.
        assert_eq!(io.ready(Interest::WRITABLE).await.unwrap(), Ready::WRITABLE);
        assert_eq!(io.try_write(b"hi").unwrap(), 2);
        // Data that arrives later comes through tokio's own readiness.
        c.write_all(b"later").unwrap();
        let mut buf = [0u8; 8];
        let n = loop {
            io.tcp.readable().await.unwrap();
            match io.try_read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => break r.unwrap(),
            }
        };
        assert_eq!(&buf[..n], b"later");
        let mut got = [0u8; 2];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
    }
}
