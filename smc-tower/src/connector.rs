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
/// Only `http://` URIs are served (the default port is 80): put a TLS connector on top for
/// `https://`.
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
}

impl SmcConnector {
    /// A connector with the default settings (and the process-wide ones).
    pub fn new() -> Self {
        Self::default()
    }

    /// A connector that connects with `builder`'s settings.
    pub fn from_builder(builder: SmcStreamBuilder) -> Self {
        SmcConnector { builder }
    }

    /// Sets the fallback policy.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.set_policy(policy);
        self
    }
}

impl SetPolicy for SmcConnector {
    fn set_policy(&mut self, policy: Policy) {
        self.builder = self.builder.clone().policy(policy);
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
        let b = self.builder.clone();
        Box::pin(async move { b.connect(addr).await })
    }
}

/// Host and port of an `http://` URI.
fn authority(uri: &Uri) -> io::Result<(String, u16)> {
    match uri.scheme_str() {
        Some("http") | None => {}
        Some(other) => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("SmcConnector serves http:// only, not {other}://; add a TLS connector on top"),
            ))
        }
    }
    let host = uri.host().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URI has no host"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    Ok((host, uri.port_u16().unwrap_or(80)))
}

impl Service<Uri> for SmcConnector {
    type Response = SmcConnection;
    type Error = io::Error;
    type Future = BoxFuture<SmcConnection>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let b = self.builder.clone();
        Box::pin(async move {
            let (host, port) = authority(&uri)?;
            let stream = b.connect((host.as_str(), port)).await?;
            SmcConnection::new(stream)
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
    pub fn new(stream: SmcStream) -> io::Result<SmcConnection> {
        let info = SmcConnectInfo::of(&stream)?;
        Ok(SmcConnection { io: TokioIo::new(stream), info })
    }

    /// The connection's transport.
    pub fn transport(&self) -> Transport {
        self.info.transport
    }

    /// The stream back.
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
        assert_eq!(authority(&"http://a.example:81/x".parse().unwrap()).unwrap(), ("a.example".into(), 81));
        assert_eq!(authority(&"http://[::1]/".parse().unwrap()).unwrap(), ("::1".into(), 80));
        assert_eq!(authority(&"https://a/".parse().unwrap()).unwrap_err().kind(), io::ErrorKind::Unsupported);
    }
}
