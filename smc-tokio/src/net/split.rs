//! Borrowed halves of an [`SmcStream`], from [`SmcStream::split`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::net::stream::SmcStream;

/// The read half of a borrowed split. Reads from the stream.
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
///     let (mut rd, mut wr) = conn.split();
///     tokio::io::copy(&mut rd, &mut wr).await
/// });
/// let mut s = SmcStream::connect(addr).await?;
/// let (mut rd, mut wr) = s.split();
/// let (_, got) = tokio::try_join!(wr.write_all(b"ping"), async {
///     let mut b = [0u8; 4];
///     rd.read_exact(&mut b).await.map(|_| b)
/// })?;
/// assert_eq!(&got, b"ping");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ReadHalf<'a>(&'a SmcStream);

/// The write half of a borrowed split. Writes to the stream; `shutdown` half-closes it.
#[derive(Debug)]
pub struct WriteHalf<'a>(&'a SmcStream);

pub(crate) fn split(stream: &mut SmcStream) -> (ReadHalf<'_>, WriteHalf<'_>) {
    (ReadHalf(stream), WriteHalf(stream))
}

impl ReadHalf<'_> {
    /// Receives data without removing it from the queue; see [`SmcStream::peek`].
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream().peek(buf).await
    }

    /// Polls for data to peek at; see [`SmcStream::poll_peek`].
    pub fn poll_peek(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<usize>> {
        self.stream().poll_peek(cx, buf)
    }

    /// The stream this half belongs to.
    pub fn stream(&self) -> &SmcStream {
        self.0
    }
}

impl WriteHalf<'_> {
    /// The stream this half belongs to.
    pub fn stream(&self) -> &SmcStream {
        self.0
    }

    /// Corks the stream until the guard drops; see [`SmcStream::cork`].
    pub fn cork(&self) -> crate::CorkGuard {
        self.0.cork()
    }

    /// Sends part of a file without a user-space buffer; see [`SmcStream::sendfile`].
    pub async fn sendfile<F: std::os::fd::AsFd>(&mut self, file: &F, offset: u64, len: u64) -> io::Result<u64> {
        self.0.sendfile_priv(file.as_fd(), offset, len).await
    }
}

impl AsyncRead for ReadHalf<'_> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.0.poll_read_priv(cx, buf)
    }
}

impl AsyncWrite for WriteHalf<'_> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.0.poll_write_priv(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_write_vectored_priv(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.poll_flush_priv(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.poll_shutdown_priv(cx)
    }
}
