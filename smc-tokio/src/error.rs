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
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SmcError {
    /// The connection would have fallen back to TCP, and the policy is
    /// [`Policy::Never`](crate::Policy::Never).
    FallbackRefused(FallbackReason),
    /// The handshake failed and left the TCP connection unusable.
    Handshake(HandshakeError),
}

impl SmcError {
    /// The `SmcError` inside `err`, if it carries one.
    pub fn from_io(err: &io::Error) -> Option<&SmcError> {
        err.get_ref().and_then(|e| e.downcast_ref::<SmcError>())
    }

    fn kind(&self) -> io::ErrorKind {
        match self {
            SmcError::FallbackRefused(_) => io::ErrorKind::Unsupported,
            SmcError::Handshake(HandshakeError::Timeout) => io::ErrorKind::TimedOut,
            SmcError::Handshake(HandshakeError::Eof) => io::ErrorKind::UnexpectedEof,
            SmcError::Handshake(_) => io::ErrorKind::InvalidData,
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
        }
    }
}

impl std::error::Error for SmcError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SmcError::Handshake(e) => Some(e),
            SmcError::FallbackRefused(_) => None,
        }
    }
}

impl From<SmcError> for io::Error {
    fn from(e: SmcError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}
