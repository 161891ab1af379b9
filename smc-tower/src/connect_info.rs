use std::net::SocketAddr;

use smc_tokio::{FallbackReason, SmcStream, Transport};

/// What a handler (or a client response) can learn about its connection: the peer, the
/// transport it got, and why it stayed on TCP if it did.
///
/// On the server, with axum (feature `axum`):
/// `app.into_make_service_with_connect_info::<SmcConnectInfo>()`, then extract
/// `axum::extract::ConnectInfo<SmcConnectInfo>`. On the client, hyper-util puts it in each
/// response's extensions when the connector is [`SmcConnector`](crate::SmcConnector).
///
/// ```
/// use smc_tower::SmcConnectInfo;
/// use smc_tokio::{FallbackReason, Transport};
///
/// let info = SmcConnectInfo { peer: "127.0.0.1:1".parse().unwrap(), transport: Transport::Tcp(FallbackReason::PeerNoSmc) };
/// assert_eq!(info.fallback_reason(), Some(FallbackReason::PeerNoSmc));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmcConnectInfo {
    /// The peer's address.
    pub peer: SocketAddr,
    /// The transport the connection uses.
    pub transport: Transport,
}

impl SmcConnectInfo {
    /// The connect info of `stream`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcStream};
    /// use smc_tower::SmcConnectInfo;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let stream = SmcStream::connect(listener.local_addr()?).await?;
    /// let info = SmcConnectInfo::of(&stream)?;
    /// assert_eq!(info.peer, listener.local_addr()?);
    /// assert_eq!(info.transport, stream.transport());
    /// # Ok(())
    /// # }
    /// ```
    pub fn of(stream: &SmcStream) -> std::io::Result<SmcConnectInfo> {
        Ok(SmcConnectInfo { peer: stream.peer_addr()?, transport: stream.transport() })
    }

    /// Why the connection stayed on TCP, if it did.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, SmcListener, SmcStream};
    /// use smc_tower::SmcConnectInfo;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let smc = SmcStream::connect(listener.local_addr()?).await?;
    /// assert_eq!(SmcConnectInfo::of(&smc)?.fallback_reason(), None);
    /// // A plain TCP server: nothing was proposed to it.
    /// let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let tcp = SmcStream::connect(plain.local_addr()?).await?;
    /// assert_eq!(SmcConnectInfo::of(&tcp)?.fallback_reason(), Some(FallbackReason::NotProposed));
    /// # Ok(())
    /// # }
    /// ```
    pub fn fallback_reason(&self) -> Option<FallbackReason> {
        self.transport.fallback_reason()
    }
}

/// Behind axum's `tap_io` (`listener.tap_io(|s| ...)`, axum's way to set options on each
/// connection), axum's own `ConnectInfo<SocketAddr>` works and this type cannot (axum's blanket
/// implementation for tapped listeners rules out any other); on a bare `SmcListener` it is the
/// other way round.
#[cfg(feature = "axum")]
impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, smc_tokio::SmcListener>>
    for SmcConnectInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, smc_tokio::SmcListener>) -> Self {
        SmcConnectInfo { peer: *stream.remote_addr(), transport: stream.io().transport() }
    }
}
