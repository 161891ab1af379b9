//! tonic glue (feature `tonic`): serve an [`SmcListener`] with `serve_with_incoming`, and let
//! handlers read [`SmcConnectInfo`] from their requests.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use smc_tokio::{SmcListener, SmcStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::SmcConnectInfo;

/// An [`SmcListener`] as the stream of connections tonic's `Server::serve_with_incoming` takes.
///
/// ```no_run
/// # async fn run<S>(svc: S) -> Result<(), Box<dyn std::error::Error>>
/// # where S: tonic::server::NamedService + Clone + Send + Sync + 'static
/// #     + tower_service::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>, Error = std::convert::Infallible>,
/// #     S::Future: Send + 'static {
/// let listener = smc_tokio::SmcListener::bind("0.0.0.0:50051").await?;
/// tonic::transport::Server::builder()
///     .add_service(svc)
///     .serve_with_incoming(smc_tower::SmcIncoming::new(listener))
///     .await?;
/// # Ok(()) }
/// ```
///
/// In a handler, `request.extensions().get::<SmcConnectInfo>()` tells the transport.
#[derive(Debug)]
pub struct SmcIncoming {
    listener: SmcListener,
}

impl SmcIncoming {
    /// Wraps a listener.
    ///
    /// # Examples
    ///
    /// Takes the next connection, as tonic's server does.
    ///
    /// ```
    /// use std::pin::Pin;
    /// use futures_core::Stream;
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use smc_tower::SmcIncoming;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let mut incoming = SmcIncoming::new(listener);
    /// let _client = SmcStream::connect(addr).await?;
    /// let io = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx)).await.unwrap()?;
    /// assert!(io.into_inner().transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(listener: SmcListener) -> Self {
        SmcIncoming { listener }
    }
}

impl futures_core::Stream for SmcIncoming {
    type Item = io::Result<SmcIo>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.listener.poll_accept(cx).map(|r| {
            Some(r.map(|(s, peer)| {
                let info = SmcConnectInfo { peer, transport: s.transport() };
                SmcIo { stream: s, info }
            }))
        })
    }
}

/// An accepted [`SmcStream`] as tonic's server I/O, carrying [`SmcConnectInfo`].
#[derive(Debug)]
pub struct SmcIo {
    stream: SmcStream,
    info: SmcConnectInfo,
}

impl SmcIo {
    /// The stream back.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::pin::Pin;
    /// use futures_core::Stream;
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use smc_tower::SmcIncoming;
    /// use tonic::transport::server::Connected;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let mut incoming = SmcIncoming::new(listener);
    /// let client = SmcStream::connect(addr).await?;
    /// let io = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx)).await.unwrap()?;
    /// // What a handler finds in its request's extensions, then the stream itself.
    /// let info = io.connect_info();
    /// assert_eq!(info.peer, client.local_addr()?);
    /// assert_eq!(io.into_inner().transport(), info.transport);
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_inner(self) -> SmcStream {
        self.stream
    }
}

impl tonic::transport::server::Connected for SmcIo {
    type ConnectInfo = SmcConnectInfo;

    fn connect_info(&self) -> SmcConnectInfo {
        self.info
    }
}

impl AsyncRead for SmcIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for SmcIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
