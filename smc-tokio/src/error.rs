//! Typed errors. Public APIs return [`std::io::Result`], as tokio's do; when the cause is
//! specific to SMC, the `io::Error` carries an [`SmcError`] that [`SmcError::from_io`] recovers.

use std::fmt;
use std::io;

use crate::proto::handshake::HandshakeError;
use crate::transport::FallbackReason;

/// An SMC-specific failure, carried inside an [`io::Error`].
///
/// # Examples
///
/// ```
/// use std::io;
/// use smc_tokio::{FallbackReason, SmcError};
///
/// let err: io::Error = SmcError::FallbackRefused(FallbackReason::PeerNoSmc).into();
/// assert_eq!(err.kind(), io::ErrorKind::Unsupported);
/// assert!(matches!(SmcError::from_io(&err), Some(SmcError::FallbackRefused(_))));
///
/// // After the handshake: a dead peer, a failed link and a protocol violation are told apart.
/// let err: io::Error = SmcError::PeerGone.into();
/// assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
/// assert_eq!(SmcError::from_io(&err), Some(&SmcError::PeerGone));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SmcError {
    /// The connection would have fallen back to TCP, and the policy is
    /// [`Policy::Never`](crate::Policy::Never).
    FallbackRefused(FallbackReason),
    /// The handshake failed and left the TCP connection unusable.
    Handshake(HandshakeError),
    /// The peer went away without closing the connection (its process exited or was killed,
    /// its link stopped answering, or the TCP connection under the SMC one was reset), while it
    /// had not read everything this side sent. Reads first return every byte the peer sent;
    /// this error (kind `ConnectionReset`, as TCP's reset) comes after them. A peer that had
    /// read everything ends the stream with EOF instead, as TCP's FIN does.
    PeerGone,
    /// The link under the connection failed locally (a system call on the link, an RDMA work
    /// completion): reads first return what arrived before; then this error (kind
    /// `ConnectionAborted`). The string says what failed.
    LinkFailed(String),
    /// The peer broke the SMC protocol (an invalid cursor, a malformed CDC message, a region
    /// or control word out of bounds): the connection ends at once (kind `InvalidData`). The
    /// string says what was wrong.
    Protocol(String),
}

impl SmcError {
    /// The `SmcError` inside `err`, if it carries one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io;
    /// use smc_tokio::SmcError;
    ///
    /// let err: io::Error = SmcError::LinkFailed("ibv_post_send".into()).into();
    /// assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
    /// assert_eq!(SmcError::from_io(&err), Some(&SmcError::LinkFailed("ibv_post_send".into())));
    ///
    /// // An error that did not come from SMC carries none.
    /// let plain = io::Error::from(io::ErrorKind::ConnectionReset);
    /// assert_eq!(SmcError::from_io(&plain), None);
    /// ```
    pub fn from_io(err: &io::Error) -> Option<&SmcError> {
        err.get_ref().and_then(|e| e.downcast_ref::<SmcError>())
    }

    fn kind(&self) -> io::ErrorKind {
        match self {
            SmcError::FallbackRefused(_) => io::ErrorKind::Unsupported,
            SmcError::Handshake(HandshakeError::Timeout) => io::ErrorKind::TimedOut,
            SmcError::Handshake(HandshakeError::Eof) => io::ErrorKind::UnexpectedEof,
            SmcError::Handshake(_) => io::ErrorKind::InvalidData,
            SmcError::PeerGone => io::ErrorKind::ConnectionReset,
            SmcError::LinkFailed(_) => io::ErrorKind::ConnectionAborted,
            SmcError::Protocol(_) => io::ErrorKind::InvalidData,
        }
    }
}

impl fmt::Display for SmcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmcError::FallbackRefused(r) => {
                write!(f, "smc required by policy, but the connection would fall back to tcp: {r}")
            }
            SmcError::Handshake(e) => write!(f, "smc handshake failed: {e}"),
            SmcError::PeerGone => f.write_str("smc peer went away without closing the connection"),
            SmcError::LinkFailed(w) => write!(f, "smc link failed: {w}"),
            SmcError::Protocol(w) => write!(f, "smc peer broke the protocol: {w}"),
        }
    }
}

impl std::error::Error for SmcError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SmcError::Handshake(e) => Some(e),
            SmcError::FallbackRefused(_) | SmcError::PeerGone | SmcError::LinkFailed(_) | SmcError::Protocol(_) => None,
        }
    }
}

impl From<SmcError> for io::Error {
    fn from(e: SmcError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}
