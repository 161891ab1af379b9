//! Owned halves of an [`SmcStream`], from [`SmcStream::into_split`].

use std::error::Error;
use std::fmt;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};

use crate::net::buf_read::ReadLend;
use crate::net::stream::SmcStream;
use crate::smc::conn::Reader;
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
    lend: ReadLend,
}

/// The write half of an owned split. Dropping it shuts the write direction down (a half-close),
/// unless [`forget`](OwnedWriteHalf::forget) was called.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    inner: Arc<SmcStream>,
    shutdown_on_drop: bool,
}

pub(crate) fn split_owned(stream: Arc<SmcStream>) -> (OwnedReadHalf, OwnedWriteHalf) {
    (
        OwnedReadHalf { inner: stream.clone(), lend: ReadLend::default() },
        OwnedWriteHalf { inner: stream, shutdown_on_drop: true },
    )
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
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{ReuniteError, SmcListener, SmcStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let (rd, wr) = SmcStream::connect(addr).await?.into_split();
    /// let (other_rd, other_wr) = SmcStream::connect(addr).await?.into_split();
    /// // Halves of different streams are handed back in the error.
    /// let ReuniteError(rd, other_wr) = rd.reunite(other_wr).unwrap_err();
    /// let stream = rd.reunite(wr).expect("halves of one stream");
    /// assert!(stream.transport().is_smc());
    /// # drop((other_rd, other_wr));
    /// # Ok(())
    /// # }
    /// ```
    pub fn reunite(self, other: OwnedWriteHalf) -> Result<SmcStream, ReuniteError> {
        if Arc::ptr_eq(&self.inner, &other.inner) {
            let mut other = other;
            other.shutdown_on_drop = false;
            let inner = self.inner.clone();
            drop(self);
            drop(other);
            // Both halves are gone, so this is the last reference.
            Ok(Arc::try_unwrap(inner).unwrap_or_else(|_| unreachable!("both halves were dropped")).reunited())
        } else {
            Err(ReuniteError(self, other))
        }
    }

    /// Receives data without removing it from the queue; see [`SmcStream::peek`].
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
    /// client.write_all(b"ping").await?;
    /// let (mut rd, _wr) = server.into_split();
    /// let mut buf = [0u8; 4];
    /// let n = rd.peek(&mut buf).await?;
    /// assert_eq!(&buf[..n], &b"ping"[..n]);
    /// rd.read_exact(&mut buf).await?; // the peeked bytes are still there
    /// assert_eq!(&buf, b"ping");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.peek_as(buf, Reader::Lender).await
    }

    /// Waits for any of the readiness events in `interest` (read ones make sense here); see
    /// [`SmcStream::ready`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (rd, _wr) = server.into_split();
    /// # let (_crd, cwr) = client.into_split();
    /// # use tokio::io::AsyncWriteExt;
    /// # let mut cwr = cwr;
    /// # cwr.write_all(b"ping").await?;
    /// let r = rd.ready(tokio::io::Interest::READABLE).await?;
    /// assert!(r.is_readable());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ready(&self, interest: tokio::io::Interest) -> io::Result<tokio::io::Ready> {
        self.inner.ready(interest).await
    }

    /// Waits until the stream is readable; see [`SmcStream::readable`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (rd, _wr) = server.into_split();
    /// # let (_crd, cwr) = client.into_split();
    /// # use tokio::io::AsyncWriteExt;
    /// # let mut cwr = cwr;
    /// # cwr.write_all(b"ping").await?;
    /// rd.readable().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn readable(&self) -> io::Result<()> {
        self.inner.readable().await
    }

    /// Reads without waiting; see [`SmcStream::try_read`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (rd, _wr) = server.into_split();
    /// # let (_crd, cwr) = client.into_split();
    /// # use tokio::io::AsyncWriteExt;
    /// # let mut cwr = cwr;
    /// # cwr.write_all(b"ping").await?;
    /// let mut buf = [0u8; 4];
    /// let n = loop {
    ///     rd.readable().await?;
    ///     match rd.try_read(&mut buf) {
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         r => break r?,
    ///     }
    /// };
    /// assert_eq!(&buf[..n], &b"ping"[..n]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.try_read_as(buf, Reader::Lender)
    }

    /// Reads into several buffers without waiting; see [`SmcStream::try_read_vectored`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (rd, _wr) = server.into_split();
    /// # let (_crd, cwr) = client.into_split();
    /// # use tokio::io::AsyncWriteExt;
    /// # let mut cwr = cwr;
    /// # cwr.write_all(b"ping").await?;
    /// let mut a = [0u8; 4];
    /// let n = loop {
    ///     rd.readable().await?;
    ///     match rd.try_read_vectored(&mut [std::io::IoSliceMut::new(&mut a)]) {
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         r => break r?,
    ///     }
    /// };
    /// assert_eq!(&a[..n], &b"ping"[..n]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        self.inner.try_read_vectored_as(bufs, Reader::Lender)
    }

    /// Reads into a buffer's spare capacity without waiting; see [`SmcStream::try_read_buf`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (rd, _wr) = server.into_split();
    /// # let (_crd, cwr) = client.into_split();
    /// # use tokio::io::AsyncWriteExt;
    /// # let mut cwr = cwr;
    /// # cwr.write_all(b"ping").await?;
    /// let mut buf = Vec::with_capacity(4);
    /// while buf.is_empty() {
    ///     rd.readable().await?;
    ///     match rd.try_read_buf(&mut buf) {
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         r => { r?; }
    ///     }
    /// }
    /// assert!(b"ping".starts_with(&buf));
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_read_buf<B: bytes::BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        self.inner.try_read_buf_as(buf, Reader::Lender)
    }

    /// Polls for data to peek at; see [`SmcStream::poll_peek`].
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
    /// client.write_all(b"ping").await?;
    /// let (mut rd, _wr) = server.into_split();
    /// let mut buf = [0u8; 8];
    /// let mut rb = ReadBuf::new(&mut buf);
    /// let n = std::future::poll_fn(|cx| rd.poll_peek(cx, &mut rb)).await?;
    /// assert_eq!(rb.filled(), &b"ping"[..n]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn poll_peek(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<usize>> {
        self.inner.poll_peek_as(cx, buf, Reader::Lender)
    }

    /// The peer's address.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let (rd, _wr) = client.into_split();
    /// assert_eq!(rd.peer_addr()?, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// The local address.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let (rd, _wr) = server.into_split();
    /// assert_eq!(rd.local_addr()?, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The connection's transport.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let transport = client.transport();
    /// let (rd, _wr) = client.into_split();
    /// assert_eq!(rd.transport(), transport);
    /// assert!(rd.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn transport(&self) -> Transport {
        self.inner.transport()
    }
}

impl OwnedWriteHalf {
    /// Test hook: [`SmcStream::break_link`] on the stream this half writes to.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn break_link(&self) -> io::Result<()> {
        self.inner.break_link()
    }

    /// Puts the halves back together; see [`OwnedReadHalf::reunite`].
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
    /// let (rd, wr) = client.into_split();
    /// let mut client = wr.reunite(rd).expect("halves of one stream");
    /// // Reuniting does not shut the write direction down: the stream writes on.
    /// client.write_all(b"still open").await?;
    /// let mut buf = [0u8; 10];
    /// server.read_exact(&mut buf).await?;
    /// assert_eq!(&buf, b"still open");
    /// # Ok(())
    /// # }
    /// ```
    pub fn reunite(self, other: OwnedReadHalf) -> Result<SmcStream, ReuniteError> {
        other.reunite(self)
    }

    /// Corks the stream until the guard drops; see [`SmcStream::cork`].
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
    /// let (_rd, mut wr) = client.into_split();
    /// let cork = wr.cork();
    /// wr.write_all(b"HTTP/1.1 204 No Content\r\n").await?;
    /// wr.write_all(b"\r\n").await?;
    /// drop(cork); // both writes reach the peer in one push
    /// let mut buf = [0u8; 27];
    /// server.read_exact(&mut buf).await?;
    /// assert_eq!(&buf, b"HTTP/1.1 204 No Content\r\n\r\n");
    /// # Ok(())
    /// # }
    /// ```
    pub fn cork(&self) -> crate::CorkGuard {
        self.inner.cork()
    }

    /// Sends part of a file without a user-space buffer; see [`SmcStream::sendfile`].
    ///
    /// # Examples
    ///
    /// The write half sends from a task of its own.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use tokio::io::AsyncReadExt;
    /// # let path = std::env::temp_dir().join(format!("smc-doc-owned-sendfile-{}", std::process::id()));
    /// # std::fs::write(&path, b"0123456789")?;
    /// let file = std::fs::File::open(&path)?; // holds "0123456789"
    /// let (_rd, mut wr) = client.into_split();
    /// let sent = tokio::spawn(async move { wr.sendfile(&file, 0, 4).await });
    /// assert_eq!(sent.await.unwrap()?, 4);
    /// let mut buf = [0u8; 4];
    /// server.read_exact(&mut buf).await?;
    /// assert_eq!(&buf, b"0123");
    /// # std::fs::remove_file(&path)?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn sendfile<F: std::os::fd::AsFd>(&mut self, file: &F, offset: u64, len: u64) -> io::Result<u64> {
        self.inner.sendfile_priv(file.as_fd(), offset, len).await
    }

    /// Drops the half without shutting the write direction down.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use std::time::Duration;
    /// use tokio::io::AsyncReadExt;
    /// let (rd, wr) = client.into_split();
    /// wr.forget(); // no half-close: the server's read keeps waiting
    /// let mut buf = [0u8; 1];
    /// let read = tokio::time::timeout(Duration::from_millis(50), server.read(&mut buf)).await;
    /// assert!(read.is_err());
    /// drop(rd); // the last half closes the stream, and the server reads its end
    /// assert_eq!(server.read(&mut buf).await?, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn forget(mut self) {
        self.shutdown_on_drop = false;
    }

    /// Waits for any of the readiness events in `interest` (write ones make sense here); see
    /// [`SmcStream::ready`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (_rd, wr) = client.into_split();
    /// let r = wr.ready(tokio::io::Interest::WRITABLE).await?;
    /// assert!(r.is_writable());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ready(&self, interest: tokio::io::Interest) -> io::Result<tokio::io::Ready> {
        self.inner.ready(interest).await
    }

    /// Waits until the stream is writable; see [`SmcStream::writable`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (_rd, wr) = client.into_split();
    /// wr.writable().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn writable(&self) -> io::Result<()> {
        self.inner.writable().await
    }

    /// Writes without waiting; see [`SmcStream::try_write`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (_rd, wr) = client.into_split();
    /// wr.writable().await?;
    /// assert_eq!(wr.try_write(b"ping")?, 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.inner.try_write(buf)
    }

    /// Writes from several buffers without waiting; see [`SmcStream::try_write_vectored`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// # let (_rd, wr) = client.into_split();
    /// wr.writable().await?;
    /// let n = wr.try_write_vectored(&[std::io::IoSlice::new(b"pi"), std::io::IoSlice::new(b"ng")])?;
    /// assert_eq!(n, 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.inner.try_write_vectored(bufs)
    }

    /// The peer's address.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let (_rd, wr) = client.into_split();
    /// assert_eq!(wr.peer_addr()?, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// The local address.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let (_rd, wr) = server.into_split();
    /// assert_eq!(wr.local_addr()?, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The connection's transport.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let (_rd, wr) = server.into_split();
    /// assert!(wr.transport().is_smc());
    /// assert_eq!(wr.transport(), client.transport());
    /// # Ok(())
    /// # }
    /// ```
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

impl Drop for OwnedReadHalf {
    fn drop(&mut self) {
        // Nothing it lent can be held any more: a held-back abort or move need not wait for
        // the write half to go too.
        self.inner.give_back();
        self.inner.set_half_holds(false);
    }
}

impl AsRef<SmcStream> for OwnedReadHalf {
    fn as_ref(&self) -> &SmcStream {
        &self.inner
    }
}

impl AsRef<SmcStream> for OwnedWriteHalf {
    fn as_ref(&self) -> &SmcStream {
        &self.inner
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_read_priv(cx, buf)
    }
}

/// As [`SmcStream`'s](SmcStream#impl-AsyncBufRead-for-%26mut+SmcStream): over shared memory with a peer
/// of our own uid, the receive ring's bytes are lent where they lie.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
/// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
/// let client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
/// let (mut server, _) = listener.accept().await?;
/// let (mut rd, _wr) = client.into_split();
/// server.write_all(b"abc").await?;
/// let mut got = Vec::new();
/// while got.len() < 3 {
///     let buf = rd.fill_buf().await?;
///     let n = buf.len();
///     got.extend_from_slice(buf);
///     rd.consume(n);
/// }
/// assert_eq!(got, b"abc");
/// # Ok(())
/// # }
/// ```
impl AsyncBufRead for OwnedReadHalf {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        let lent = ready!(this.lend.poll_fill(&this.inner, cx, true))?;
        this.inner.set_half_holds(this.lend.holds());
        // SAFETY: `lent` is what the fill just returned; the slice borrows this half
        // exclusively, which keeps the stream alive. The write half reaches the stream's reads
        // only through `as_ref`, as `Reader::Other`, which takes no lent byte and does not end
        // the hold on them (`SmcConn::poll_received`).
        Poll::Ready(Ok(unsafe { this.lend.bytes(lent) }))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        this.lend.consume(&this.inner, amt);
        this.inner.set_half_holds(this.lend.holds());
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
