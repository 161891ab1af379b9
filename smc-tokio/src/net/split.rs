//! Borrowed halves of an [`SmcStream`], from [`SmcStream::split`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};

use crate::net::buf_read::ReadLend;
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
pub struct ReadHalf<'a>(&'a SmcStream, ReadLend);

/// The write half of a borrowed split. Writes to the stream; `shutdown` half-closes it.
#[derive(Debug)]
pub struct WriteHalf<'a>(&'a SmcStream);

pub(crate) fn split(stream: &mut SmcStream) -> (ReadHalf<'_>, WriteHalf<'_>) {
    (ReadHalf(stream, ReadLend::default()), WriteHalf(stream))
}

impl ReadHalf<'_> {
    /// The peer's address; see [`SmcStream::peer_addr`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (rd, _wr) = client.split();
    /// assert_eq!(rd.peer_addr()?, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.0.peer_addr()
    }

    /// The local address; see [`SmcStream::local_addr`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (rd, _wr) = client.split();
    /// assert!(rd.local_addr()?.ip().is_loopback());
    /// # Ok(())
    /// # }
    /// ```
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.0.local_addr()
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
    /// # let (rd, _wr) = server.split();
    /// # let (_crd, cwr) = client.split();
    /// # use tokio::io::AsyncWriteExt;
    /// # let mut cwr = cwr;
    /// # cwr.write_all(b"ping").await?;
    /// let r = rd.ready(tokio::io::Interest::READABLE).await?;
    /// assert!(r.is_readable());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ready(&self, interest: tokio::io::Interest) -> io::Result<tokio::io::Ready> {
        self.0.ready(interest).await
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
    /// # let (rd, _wr) = server.split();
    /// # let (_crd, cwr) = client.split();
    /// # use tokio::io::AsyncWriteExt;
    /// # let mut cwr = cwr;
    /// # cwr.write_all(b"ping").await?;
    /// rd.readable().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn readable(&self) -> io::Result<()> {
        self.0.readable().await
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
    /// # let (rd, _wr) = server.split();
    /// # let (_crd, cwr) = client.split();
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
        self.0.try_read(buf)
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
    /// # let (rd, _wr) = server.split();
    /// # let (_crd, cwr) = client.split();
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
        self.0.try_read_vectored(bufs)
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
    /// # let (rd, _wr) = server.split();
    /// # let (_crd, cwr) = client.split();
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
        self.0.try_read_buf(buf)
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
    /// let (mut rd, _wr) = server.split();
    /// let mut buf = [0u8; 4];
    /// let n = rd.peek(&mut buf).await?;
    /// assert_eq!(&buf[..n], &b"ping"[..n]);
    /// rd.read_exact(&mut buf).await?; // the peeked bytes are still there
    /// assert_eq!(&buf, b"ping");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream().peek(buf).await
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
    /// let (mut rd, _wr) = server.split();
    /// let mut buf = [0u8; 8];
    /// let mut rb = ReadBuf::new(&mut buf);
    /// let n = std::future::poll_fn(|cx| rd.poll_peek(cx, &mut rb)).await?;
    /// assert_eq!(rb.filled(), &b"ping"[..n]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn poll_peek(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<usize>> {
        self.stream().poll_peek(cx, buf)
    }

    /// The stream this half belongs to.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let (rd, _wr) = client.split();
    /// // The stream's own methods, through the half.
    /// assert!(rd.stream().transport().is_smc());
    /// assert_eq!(rd.stream().peer_addr()?, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream(&self) -> &SmcStream {
        self.0
    }
}

impl WriteHalf<'_> {
    /// The peer's address; see [`SmcStream::peer_addr`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (_rd, wr) = client.split();
    /// assert_eq!(wr.peer_addr()?, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.0.peer_addr()
    }

    /// The local address; see [`SmcStream::local_addr`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (_rd, wr) = client.split();
    /// assert!(wr.local_addr()?.ip().is_loopback());
    /// # Ok(())
    /// # }
    /// ```
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.0.local_addr()
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
    /// # let (_rd, wr) = client.split();
    /// let r = wr.ready(tokio::io::Interest::WRITABLE).await?;
    /// assert!(r.is_writable());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ready(&self, interest: tokio::io::Interest) -> io::Result<tokio::io::Ready> {
        self.0.ready(interest).await
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
    /// # let (_rd, wr) = client.split();
    /// wr.writable().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn writable(&self) -> io::Result<()> {
        self.0.writable().await
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
    /// # let (_rd, wr) = client.split();
    /// wr.writable().await?;
    /// assert_eq!(wr.try_write(b"ping")?, 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
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
    /// # let (_rd, wr) = client.split();
    /// wr.writable().await?;
    /// let n = wr.try_write_vectored(&[std::io::IoSlice::new(b"pi"), std::io::IoSlice::new(b"ng")])?;
    /// assert_eq!(n, 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    /// The stream this half belongs to.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// let (_rd, wr) = client.split();
    /// wr.stream().set_nodelay(true)?;
    /// assert!(wr.stream().nodelay()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream(&self) -> &SmcStream {
        self.0
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
    /// let (_rd, mut wr) = client.split();
    /// let cork = wr.cork();
    /// wr.write_all(b"he").await?;
    /// wr.write_all(b"llo").await?;
    /// drop(cork); // both writes reach the peer in one push
    /// let mut buf = [0u8; 5];
    /// server.read_exact(&mut buf).await?;
    /// assert_eq!(&buf, b"hello");
    /// # Ok(())
    /// # }
    /// ```
    pub fn cork(&self) -> crate::CorkGuard {
        self.0.cork()
    }

    /// Sends part of a file without a user-space buffer; see [`SmcStream::sendfile`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
    /// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
    /// let (mut server, _) = listener.accept().await?;
    /// use tokio::io::AsyncReadExt;
    /// # let path = std::env::temp_dir().join(format!("smc-doc-split-sendfile-{}", std::process::id()));
    /// # std::fs::write(&path, b"0123456789")?;
    /// let file = std::fs::File::open(&path)?; // holds "0123456789"
    /// let (_rd, mut wr) = client.split();
    /// assert_eq!(wr.sendfile(&file, 4, 3).await?, 3);
    /// let mut buf = [0u8; 3];
    /// server.read_exact(&mut buf).await?;
    /// assert_eq!(&buf, b"456");
    /// # std::fs::remove_file(&path)?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn sendfile<F: std::os::fd::AsFd>(&mut self, file: &F, offset: u64, len: u64) -> io::Result<u64> {
        self.0.sendfile_priv(file.as_fd(), offset, len).await
    }
}

impl AsRef<SmcStream> for ReadHalf<'_> {
    fn as_ref(&self) -> &SmcStream {
        self.0
    }
}

impl AsRef<SmcStream> for WriteHalf<'_> {
    fn as_ref(&self) -> &SmcStream {
        self.0
    }
}

impl AsyncRead for ReadHalf<'_> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.0.poll_read_priv(cx, buf)
    }
}

/// As [`SmcStream`'s](SmcStream#impl-AsyncBufRead-for-%26mut+SmcStream), except that a borrowed read
/// half always copies (into a buffer of its own): its [`WriteHalf`] can reach the stream's
/// reads ([`WriteHalf::stream`]) while bytes would be lent. [`SmcStream::into_split`]'s
/// [`OwnedReadHalf`](crate::OwnedReadHalf) lends.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
/// let listener = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
/// let mut client = smc_tokio::SmcStream::connect(listener.local_addr()?).await?;
/// let (mut server, _) = listener.accept().await?;
/// let (mut rd, _wr) = client.split();
/// server.write_all(b"one\ntwo\n").await?;
/// let mut line = String::new();
/// rd.read_line(&mut line).await?;
/// assert_eq!(line, "one\n");
/// # Ok(())
/// # }
/// ```
impl AsyncBufRead for ReadHalf<'_> {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        let lent = ready!(this.1.poll_fill(this.0, cx, false))?;
        // SAFETY: `lent` is what the fill just returned, and it copied (no ring bytes are lent
        // without `may_lend`); the stream outlives the half.
        Poll::Ready(Ok(unsafe { this.1.bytes(lent) }))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        this.1.consume(this.0, amt);
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
