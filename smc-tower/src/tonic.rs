//! tonic glue (feature `tonic`): serve an [`SmcListener`] with `serve_with_incoming`, and let
//! handlers read [`SmcConnectInfo`] from their requests.

use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use smc_tokio::{SmcListener, SmcStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::SmcConnectInfo;

/// What tonic puts in the extensions of each request on a connection an [`SmcIncoming`]
/// accepted: [`SmcConnectInfo`] by default, or tonic's own
/// [`TcpConnectInfo`](tonic::transport::server::TcpConnectInfo), which `Request::remote_addr`
/// and `Request::local_addr` read (see [`SmcIncoming::with_connect_info`]).
pub trait IncomingConnectInfo: Clone + Send + Sync + 'static {
    /// The info of `stream`, accepted from `peer`.
    fn of(stream: &SmcStream, peer: SocketAddr) -> Self;
}

impl IncomingConnectInfo for SmcConnectInfo {
    fn of(stream: &SmcStream, peer: SocketAddr) -> Self {
        SmcConnectInfo { peer, transport: stream.transport() }
    }
}

impl IncomingConnectInfo for tonic::transport::server::TcpConnectInfo {
    fn of(stream: &SmcStream, peer: SocketAddr) -> Self {
        tonic::transport::server::TcpConnectInfo { local_addr: stream.local_addr().ok(), remote_addr: Some(peer) }
    }
}

/// How long the stream waits after an accept error that is not one connection's (such as the
/// process running out of descriptors) before it takes the next connection: tonic's server
/// asks again at once, which would spin; axum's and hyper's serve loops wait a second.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

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
/// In a handler, `request.extensions().get::<SmcConnectInfo>()` tells the transport; with
/// [`with_connect_info`](Self::with_connect_info)`::<TcpConnectInfo>()`, tonic's
/// `request.remote_addr()` answers instead. An accept error that is not one connection's
/// (running out of descriptors, say) is handed to tonic, and the next accept waits a second,
/// as axum's serve loop does, instead of spinning.
#[derive(Debug)]
pub struct SmcIncoming<I = SmcConnectInfo> {
    listener: SmcListener,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
    info: PhantomData<fn() -> I>,
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
        SmcIncoming { listener, pause: None, info: PhantomData }
    }
}

impl<I: IncomingConnectInfo> SmcIncoming<I> {
    /// The same listener, whose connections carry `J` into their requests instead.
    ///
    /// # Examples
    ///
    /// tonic's `TcpConnectInfo`, so that `Request::remote_addr` answers.
    ///
    /// ```
    /// use std::pin::Pin;
    /// use futures_core::Stream;
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use smc_tower::SmcIncoming;
    /// use tonic::transport::server::{Connected, TcpConnectInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let mut incoming = SmcIncoming::new(listener).with_connect_info::<TcpConnectInfo>();
    /// let client = SmcStream::connect(addr).await?;
    /// let io = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx)).await.unwrap()?;
    /// assert_eq!(io.connect_info().remote_addr(), Some(client.local_addr()?));
    /// assert_eq!(io.connect_info().local_addr(), Some(addr));
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_connect_info<J: IncomingConnectInfo>(self) -> SmcIncoming<J> {
        SmcIncoming { listener: self.listener, pause: self.pause, info: PhantomData }
    }
}

/// Errors that concern one connection only (the peer went away before `accept` saw it).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

impl<I: IncomingConnectInfo> futures_core::Stream for SmcIncoming<I> {
    type Item = io::Result<SmcIo<I>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(p) = &mut this.pause {
            ready!(p.as_mut().poll(cx));
            this.pause = None;
        }
        Poll::Ready(Some(match ready!(this.listener.poll_accept(cx)) {
            Ok((stream, peer)) => {
                let info = I::of(&stream, peer);
                Ok(SmcIo { stream, info })
            }
            Err(e) => {
                if !is_connection_error(&e) {
                    this.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_ERROR_PAUSE)));
                }
                Err(e)
            }
        }))
    }
}

/// An accepted [`SmcStream`] as tonic's server I/O, carrying its [`IncomingConnectInfo`]
/// ([`SmcConnectInfo`] by default).
#[derive(Debug)]
pub struct SmcIo<I = SmcConnectInfo> {
    stream: SmcStream,
    info: I,
}

impl<I> SmcIo<I> {
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

impl<I: IncomingConnectInfo> tonic::transport::server::Connected for SmcIo<I> {
    type ConnectInfo = I;

    fn connect_info(&self) -> I {
        self.info.clone()
    }
}

impl<I: Unpin> AsyncRead for SmcIo<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<I: Unpin> AsyncWrite for SmcIo<I> {
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
