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
    pub fn of(stream: &SmcStream) -> std::io::Result<SmcConnectInfo> {
        Ok(SmcConnectInfo { peer: stream.peer_addr()?, transport: stream.transport() })
    }

    /// Why the connection stayed on TCP, if it did.
    pub fn fallback_reason(&self) -> Option<FallbackReason> {
        self.transport.fallback_reason()
    }
}

#[cfg(feature = "axum")]
impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, smc_tokio::SmcListener>>
    for SmcConnectInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, smc_tokio::SmcListener>) -> Self {
        SmcConnectInfo { peer: *stream.remote_addr(), transport: stream.io().transport() }
    }
}
