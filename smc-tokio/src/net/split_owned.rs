//! Owned halves of an [`SmcStream`], from [`SmcStream::into_split`].

use std::error::Error;
use std::fmt;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::net::stream::SmcStream;
use crate::transport::Transport;

/// The read half of an owned split; it can move to another task.
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
///     let (conn, _) = listener.accept().await?;
///     let (mut rd, mut wr) = conn.into_split();
///     tokio::io::copy(&mut rd, &mut wr).await
/// });
/// let (mut rd, mut wr) = SmcStream::connect(addr).await?.into_split();
/// let reader = tokio::spawn(async move {
///     let mut b = Vec::new();
///     rd.read_to_end(&mut b).await.map(|_| b)
/// });
/// wr.write_all(b"bye").await?;
/// drop(wr); // half-closes: the echo server sees EOF and closes too
/// assert_eq!(reader.await.unwrap()?, b"bye");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct OwnedReadHalf {
    inner: Arc<SmcStream>,
}

/// The write half of an owned split. Dropping it shuts the write direction down (a half-close),
/// unless [`forget`](OwnedWriteHalf::forget) was called.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    inner: Arc<SmcStream>,
    shutdown_on_drop: bool,
}

pub(crate) fn split_owned(stream: Arc<SmcStream>) -> (OwnedReadHalf, OwnedWriteHalf) {
    (OwnedReadHalf { inner: stream.clone() }, OwnedWriteHalf { inner: stream, shutdown_on_drop: true })
}

/// The halves given to [`OwnedReadHalf::reunite`] came from different streams; they are handed
/// back.
#[derive(Debug)]
pub struct ReuniteError(pub OwnedReadHalf, pub OwnedWriteHalf);

impl fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tried to reunite halves that are not from the same SmcStream")
    }
}

impl Error for ReuniteError {}

impl OwnedReadHalf {
    /// Puts the halves back together, if they came from the same stream.
    pub fn reunite(self, other: OwnedWriteHalf) -> Result<SmcStream, ReuniteError> {
        if Arc::ptr_eq(&self.inner, &other.inner) {
            let mut other = other;
            other.shutdown_on_drop = false;
            let inner = self.inner.clone();
            drop(self);
            drop(other);
            // Both halves are gone, so this is the last reference.
            Ok(Arc::try_unwrap(inner).unwrap_or_else(|_| unreachable!("both halves were dropped")))
        } else {
            Err(ReuniteError(self, other))
        }
    }

    /// Receives data without removing it from the queue; see [`SmcStream::peek`].
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.peek(buf).await
    }

    /// Polls for data to peek at; see [`SmcStream::poll_peek`].
    pub fn poll_peek(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<usize>> {
        self.inner.poll_peek(cx, buf)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The connection's transport.
    pub fn transport(&self) -> Transport {
        self.inner.transport()
    }
}

impl OwnedWriteHalf {
    /// Puts the halves back together; see [`OwnedReadHalf::reunite`].
    pub fn reunite(self, other: OwnedReadHalf) -> Result<SmcStream, ReuniteError> {
        other.reunite(self)
    }

    /// Corks the stream until the guard drops; see [`SmcStream::cork`].
    pub fn cork(&self) -> crate::CorkGuard {
        self.inner.cork()
    }

    /// Sends part of a file without a user-space buffer; see [`SmcStream::sendfile`].
    pub async fn sendfile<F: std::os::fd::AsFd>(&mut self, file: &F, offset: u64, len: u64) -> io::Result<u64> {
        self.inner.sendfile_priv(file.as_fd(), offset, len).await
    }

    /// Drops the half without shutting the write direction down.
    pub fn forget(mut self) {
        self.shutdown_on_drop = false;
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The connection's transport.
    pub fn transport(&self) -> Transport {
        self.inner.transport()
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if self.shutdown_on_drop {
            // Best effort, as tokio's OwnedWriteHalf: a failure here has nobody to report to.
            let _ = self.inner.shutdown_priv();
        }
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_read_priv(cx, buf)
    }
}

impl AsyncWrite for OwnedWriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.inner.poll_write_priv(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_write_vectored_priv(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_flush_priv(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let res = ready!(self.inner.poll_shutdown_priv(cx));
        if res.is_ok() {
            Pin::into_inner(self).shutdown_on_drop = false;
        }
        Poll::Ready(res)
    }
}
