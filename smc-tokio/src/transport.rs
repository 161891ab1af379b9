//! What a connection ended up using, and why.

use std::fmt;

use crate::proto::clc::DeclineReason;
use crate::proto::handshake::Side;

/// The transport a connection uses, as reported by
/// [`SmcStream::transport`](crate::SmcStream::transport).
///
/// # Examples
///
/// ```
/// use smc_tokio::{FallbackReason, Transport};
///
/// let t = Transport::Tcp(FallbackReason::PeerNoSmc);
/// assert!(!t.is_smc());
/// assert_eq!(t.as_str(), "tcp");
/// assert_eq!(t.to_string(), "tcp (peer does not speak smc)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// The connection stayed on TCP, for the given reason.
    Tcp(FallbackReason),
    /// Shared memory between processes on one host (SMC-D).
    SmcD,
    /// RDMA between hosts (SMC-R).
    SmcR,
    /// The kernel's own SMC-R carries the connection (an `AF_SMC` socket; see
    /// [`kernel`](crate::kernel)).
    KernelSmcR,
    /// The kernel's own SMC-D carries the connection (an `AF_SMC` socket).
    KernelSmcD,
    /// An `AF_SMC` socket whose mode the kernel did not report (`smc_diag` not available):
    /// the kernel's SMC or TCP, the bytes flow either way.
    KernelUnknown,
}

impl Transport {
    /// Whether the byte stream moved off TCP.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, Transport};
    ///
    /// assert!(Transport::SmcD.is_smc());
    /// assert!(Transport::SmcR.is_smc());
    /// assert!(!Transport::Tcp(FallbackReason::PeerNoSmc).is_smc());
    /// ```
    pub fn is_smc(&self) -> bool {
        matches!(self, Transport::SmcD | Transport::SmcR | Transport::KernelSmcR | Transport::KernelSmcD)
    }

    /// Whether the kernel's SMC carries the connection (an `AF_SMC` socket in SMC-R or SMC-D
    /// mode).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::Transport;
    ///
    /// assert!(Transport::KernelSmcR.is_kernel_smc());
    /// assert!(!Transport::SmcR.is_kernel_smc());
    /// ```
    pub fn is_kernel_smc(&self) -> bool {
        matches!(self, Transport::KernelSmcR | Transport::KernelSmcD)
    }

    /// Whether the kernel's SMC took the connection, or may have (its mode unknown): nothing of
    /// ours is negotiated on it then.
    pub(crate) fn settled_by_kernel(&self) -> bool {
        self.is_kernel_smc() || *self == Transport::KernelUnknown
    }

    /// Why the connection stayed on TCP, if it did.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, Transport};
    ///
    /// let t = Transport::Tcp(FallbackReason::NegativeCache);
    /// assert_eq!(t.fallback_reason(), Some(FallbackReason::NegativeCache));
    /// assert_eq!(Transport::SmcD.fallback_reason(), None);
    /// ```
    pub fn fallback_reason(&self) -> Option<FallbackReason> {
        match self {
            Transport::Tcp(r) => Some(*r),
            _ => None,
        }
    }

    /// `"tcp"`, `"smc-d"`, `"smc-r"`, or for the kernel's SMC `"ksmc-r"`, `"ksmc-d"` and
    /// `"ksmc-?"`: the names `smcperf` and the stats use.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, Transport};
    ///
    /// assert_eq!(Transport::SmcD.as_str(), "smc-d");
    /// assert_eq!(Transport::SmcR.as_str(), "smc-r");
    /// // The name leaves the reason out; `Display` adds it.
    /// let tcp = Transport::Tcp(FallbackReason::Adopted);
    /// assert_eq!(tcp.as_str(), "tcp");
    /// assert!(tcp.to_string().starts_with("tcp ("));
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            Transport::Tcp(_) => "tcp",
            Transport::SmcD => "smc-d",
            Transport::SmcR => "smc-r",
            Transport::KernelSmcR => "ksmc-r",
            Transport::KernelSmcD => "ksmc-d",
            Transport::KernelUnknown => "ksmc-?",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Tcp(r) => write!(f, "tcp ({r})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// Why a connection stayed on TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FallbackReason {
    /// SMC is switched off on this side: [`Policy::TcpOnly`](crate::Policy::TcpOnly), or
    /// every transport it could offer is (shared memory off, `SMC_TOKIO_SHM=0`, and RDMA off
    /// or not built) for a destination it would not propose to in-band.
    Disabled,
    /// The peer does not speak SMC: a plain TCP client met our listener, or our proposal met a
    /// plain TCP server (the client then reconnected as plain TCP).
    PeerNoSmc,
    /// The peer is in the client's negative cache: it recently answered as a plain TCP server,
    /// so no proposal was sent.
    NegativeCache,
    /// Server side: the client sent nothing within the listener's peek timeout, so it was taken
    /// for a plain client that waits for the server to speak first. Only listeners that can do
    /// SMC-R wait for the first bytes, and only of clients on other hosts.
    ClientSilent,
    /// Client side: SMC was not proposed. The destination has no SMC listener on this host
    /// (no door), and in-band negotiation is not enabled for it (see
    /// [`SmcStreamBuilder::inband_peers`](crate::SmcStreamBuilder::inband_peers)), so the
    /// server saw a plain TCP client.
    NotProposed,
    /// The stream was made from a socket that was already connected
    /// ([`SmcStream::from_std`](crate::SmcStream::from_std), `TryFrom<std::net::TcpStream>`):
    /// no handshake ran, so it is TCP.
    Adopted,
    /// The connection is on an `AF_SMC` socket, and the kernel kept it on TCP for this reason
    /// (and no smc-tokio establishment moved it either). See [`kernel`](crate::kernel).
    Kernel(crate::kernel::KernelFallback),
    /// A side declined during the handshake; both continue over TCP on the same connection.
    Declined {
        /// The decline reason.
        reason: DeclineReason,
        /// Which side declined.
        by: Side,
    },
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FallbackReason::Disabled => f.write_str("smc disabled on this side (policy or settings)"),
            FallbackReason::PeerNoSmc => f.write_str("peer does not speak smc"),
            FallbackReason::NegativeCache => f.write_str("peer in negative cache"),
            FallbackReason::ClientSilent => f.write_str("client sent nothing before peek timeout"),
            FallbackReason::Adopted => f.write_str("adopted from a connected socket: no handshake ran"),
            FallbackReason::NotProposed => {
                f.write_str("smc not proposed: no smc listener on this host, not an in-band peer")
            }
            FallbackReason::Kernel(k) => write!(f, "{k}"),
            FallbackReason::Declined { reason, by: Side::Local } => {
                write!(f, "declined locally: {reason}")
            }
            FallbackReason::Declined { reason, by: Side::Peer } => {
                write!(f, "declined by peer: {reason}")
            }
        }
    }
}
