use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use smc_tokio::{Policy, SmcStream, SmcStreamBuilder, Transport};
use tower_service::Service;

use crate::connect_info::SmcConnectInfo;
use crate::policy::SetPolicy;

/// A connector that opens [`SmcStream`]s: `Service<Uri>` for hyper-util's legacy client and
/// tonic's `Endpoint::connect_with_connector`, and `Service<SocketAddr>` for everything else.
///
/// As hyper-util's `HttpConnector` with `enforce_http(false)`, which TLS connectors wrap, any
/// scheme is served: the URI names the host and port to connect to (by default 443 for
/// `https://`, else 80), and a TLS connector on top does the rest for `https://`.
///
/// # Examples
///
/// ```
/// use smc_tower::SmcConnector;
/// use smc_tokio::{Policy, SmcListener};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// tokio::spawn(async move { listener.accept().await });
/// let stream = SmcConnector::new().policy(Policy::Auto).oneshot(addr).await?;
/// println!("{}", stream.transport());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct SmcConnector {
    builder: SmcStreamBuilder,
    nodelay: bool,
}

impl SmcConnector {
    /// A connector with the default settings (and the process-wide ones).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcListener;
    /// use smc_tower::SmcConnector;
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// // `Service<SocketAddr>`: an `SmcStream`.
    /// let stream = SmcConnector::new().oneshot(listener.local_addr()?).await?;
    /// assert!(stream.transport().is_smc());
    /// // `Service<Uri>`, for hyper-util's client: an `SmcConnection`.
    /// let uri: http::Uri = format!("http://{}/", listener.local_addr()?).parse().unwrap();
    /// let conn = SmcConnector::new().oneshot(uri).await?;
    /// assert!(conn.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// A connector that connects with `builder`'s settings.
    ///
    /// # Examples
    ///
    /// Every connection gets the builder's settings: here, SMC or an error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::{Policy, SmcListener, SmcStream};
    /// use smc_tower::SmcConnector;
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let builder = SmcStream::builder().policy(Policy::Never).handshake_timeout(Duration::from_millis(500));
    /// let connector = SmcConnector::from_builder(builder);
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// assert!(connector.clone().oneshot(listener.local_addr()?).await?.transport().is_smc());
    /// let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// assert!(connector.oneshot(plain.local_addr()?).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_builder(builder: SmcStreamBuilder) -> Self {
        SmcConnector { builder, nodelay: false }
    }

    /// Sets `TCP_NODELAY` on every connection (off by default, as hyper-util's
    /// `HttpConnector::set_nodelay`; tonic's own connector turns it on). It matters only where
    /// a connection stays on TCP.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{Policy, SmcListener};
    /// use smc_tower::SmcConnector;
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let stream = SmcConnector::new().nodelay(true).oneshot(listener.local_addr()?).await?;
    /// assert!(stream.nodelay()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn nodelay(mut self, on: bool) -> Self {
        self.nodelay = on;
        self
    }

    /// Sets the fallback policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, Policy, SmcListener, Transport};
    /// use smc_tower::SmcConnector;
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let stream = SmcConnector::new().policy(Policy::TcpOnly).oneshot(listener.local_addr()?).await?;
    /// assert_eq!(stream.transport(), Transport::Tcp(FallbackReason::Disabled));
    /// # Ok(())
    /// # }
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.set_policy(policy);
        self
    }
}

impl SetPolicy for SmcConnector {
    fn set_policy(&mut self, policy: Policy) {
        self.builder = self.builder.clone().policy(policy);
    }

    /// Its builder's policy, else the process's settings' as they are now.
    fn current_policy(&self) -> Option<Policy> {
        Some(self.builder.settings().policy)
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send>>;

impl Service<SocketAddr> for SmcConnector {
    type Response = SmcStream;
    type Error = io::Error;
    type Future = BoxFuture<SmcStream>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, addr: SocketAddr) -> Self::Future {
        let (b, nodelay) = (self.builder.clone(), self.nodelay);
        Box::pin(async move {
            let stream = b.connect(addr).await?;
            if nodelay {
                stream.set_nodelay(true)?;
            }
            Ok(stream)
        })
    }
}

/// Host (without an IPv6 address's brackets) and port of a URI: its own port, else 443 for
/// `https`, else 80 (hyper-util's `HttpConnector` without `enforce_http`).
fn authority(uri: &Uri) -> io::Result<(&str, u16)> {
    let host = uri.host().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URI has no host"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let default = if uri.scheme() == Some(&http::uri::Scheme::HTTPS) { 443 } else { 80 };
    Ok((host, uri.port_u16().unwrap_or(default)))
}

impl Service<Uri> for SmcConnector {
    type Response = SmcConnection;
    type Error = io::Error;
    type Future = BoxFuture<SmcConnection>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (b, nodelay) = (self.builder.clone(), self.nodelay);
        Box::pin(async move {
            let (host, port) = authority(&uri)?;
            // An address needs no lookup (nor the host's copy a lookup takes along). Each
            // address is tried in turn, as `connect` would, so that the one that answered is
            // known without asking the socket (whose `peer_addr` fails once the peer reset it).
            let addrs: Vec<SocketAddr> = match host.parse::<std::net::IpAddr>() {
                Ok(ip) => vec![SocketAddr::new(ip, port)],
                Err(_) => tokio::net::lookup_host((host, port)).await?.collect(),
            };
            let mut last = None;
            for peer in addrs {
                match b.connect(peer).await {
                    Ok(stream) => {
                        if nodelay {
                            stream.set_nodelay(true)?;
                        }
                        let info = SmcConnectInfo { peer, transport: stream.transport() };
                        return Ok(SmcConnection { io: TokioIo::new(stream), info });
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "could not resolve to any address")))
        })
    }
}

/// An [`SmcStream`] as hyper's I/O (`hyper::rt::Read` + `Write`) with hyper-util's
/// [`Connection`] metadata: the [`SmcConnectInfo`] rides in each response's extensions.
#[derive(Debug)]
pub struct SmcConnection {
    io: TokioIo<SmcStream>,
    info: SmcConnectInfo,
}

impl SmcConnection {
    /// Wraps a connected stream.
    ///
    /// # Examples
    ///
    /// ```
    /// use hyper_util::client::legacy::connect::Connection;
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use smc_tower::{SmcConnectInfo, SmcConnection};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let conn = SmcConnection::new(SmcStream::connect(listener.local_addr()?).await?)?;
    /// // What hyper-util copies into the extensions of every response on this connection.
    /// let mut extensions = http::Extensions::new();
    /// conn.connected().get_extras(&mut extensions);
    /// let info = extensions.get::<SmcConnectInfo>().unwrap();
    /// assert_eq!(info.peer, listener.local_addr()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(stream: SmcStream) -> io::Result<SmcConnection> {
        let info = SmcConnectInfo::of(&stream)?;
        Ok(SmcConnection { io: TokioIo::new(stream), info })
    }

    /// The connection's transport.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use smc_tower::SmcConnection;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// let transport = stream.transport();
    /// let conn = SmcConnection::new(stream)?;
    /// assert_eq!(conn.transport(), transport);
    /// assert!(conn.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn transport(&self) -> Transport {
        self.info.transport
    }

    /// The stream back.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use smc_tower::SmcConnection;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let conn = SmcConnection::new(SmcStream::connect(listener.local_addr()?).await?)?;
    /// let (mut server, _) = listener.accept().await?;
    /// // Back to the stream, with tokio's I/O traits.
    /// let mut stream = conn.into_inner();
    /// stream.write_all(b"hi").await?;
    /// let mut buf = [0u8; 2];
    /// server.read_exact(&mut buf).await?;
    /// assert_eq!(&buf, b"hi");
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_inner(self) -> SmcStream {
        self.io.into_inner()
    }
}

impl Connection for SmcConnection {
    fn connected(&self) -> Connected {
        Connected::new().extra(self.info)
    }
}

impl hyper::rt::Read for SmcConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for SmcConnection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        hyper::rt::Write::is_write_vectored(&self.io)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        assert_eq!(authority(&"http://a.example:81/x".parse().unwrap()).unwrap(), ("a.example", 81));
        assert_eq!(authority(&"http://[::1]/".parse().unwrap()).unwrap(), ("::1", 80));
        assert_eq!(authority(&"https://a/".parse().unwrap()).unwrap(), ("a", 443));
        assert_eq!(authority(&"https://a:8443/".parse().unwrap()).unwrap(), ("a", 8443));
        assert_eq!(authority(&"grpc://[fe80::1]/".parse().unwrap()).unwrap(), ("fe80::1", 80));
        assert_eq!(authority(&"/only/a/path".parse().unwrap()).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
