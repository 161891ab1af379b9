//! What a connection ended up using, and why.

use std::fmt;
use std::str::FromStr;

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
    Kernel(KernelFallback),
    /// A side declined during the handshake; both continue over TCP on the same connection.
    Declined {
        /// The decline reason.
        reason: DeclineReason,
        /// Which side declined.
        by: Side,
    },
    /// The connection was SMC and moved back to its TCP socket mid-stream, losing nothing
    /// (see [`SmcStream::hand_back`](crate::SmcStream::hand_back)).
    HandedBack(HandbackCause),
}

/// Why an SMC connection moved back to its TCP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HandbackCause {
    /// This side's application asked ([`SmcStream::hand_back`](crate::SmcStream::hand_back)).
    Requested,
    /// The link under the connection failed on this side while both processes lived.
    LinkFailed,
    /// The peer moved first (its application asked, or its link failed).
    Peer,
}

impl fmt::Display for HandbackCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandbackCause::Requested => "the application asked",
            HandbackCause::LinkFailed => "its link failed",
            HandbackCause::Peer => "the peer moved",
        })
    }
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
            FallbackReason::HandedBack(c) => write!(f, "moved from smc mid-stream: {c}"),
        }
    }
}

// ----- the kernel's SMC: how it was asked for, why it was not there, why it fell back ---------
// (Vocabulary of settings and outcomes; `kernel` re-exports them and does the work.)

/// Whether sockets are the kernel's `AF_SMC` ones. Set per listener or client with the
/// builders' `kernel` method, per process with `SMC_TOKIO_KERNEL=off|auto|on` (or
/// [`config::global`](crate::config::global)).
///
/// The default is [`Auto`](KernelMode::Auto): a host whose administrator loaded the kernel's
/// SMC (module `smc`: `smc_run`, `modprobe smc`, a pnet or UEID table) wants SMC with kernel
/// peers, and on every other host `Auto` costs nothing and changes nothing (no `AF_SMC` socket
/// is made, so the module is never loaded behind the administrator's back).
///
/// # Examples
///
/// ```
/// use smc_tokio::kernel::KernelMode;
///
/// assert_eq!("on".parse::<KernelMode>(), Ok(KernelMode::On));
/// assert_eq!(KernelMode::default(), KernelMode::Auto);
/// assert_eq!(KernelMode::Off.to_string(), "off");
/// assert!("sometimes".parse::<KernelMode>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KernelMode {
    /// Never: sockets are plain TCP (this crate's own SMC only).
    Off,
    /// `AF_SMC` when the kernel's SMC module is loaded (`/sys/module/smc`); plain TCP
    /// otherwise.
    #[default]
    Auto,
    /// Always try `AF_SMC` (which may load the module); plain TCP, with the reason counted,
    /// where the kernel has none.
    On,
}

impl FromStr for KernelMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "no" | "false" => Ok(KernelMode::Off),
            "auto" => Ok(KernelMode::Auto),
            "on" | "1" | "yes" | "true" => Ok(KernelMode::On),
            other => Err(format!("{other:?} is not off, auto or on")),
        }
    }
}

impl fmt::Display for KernelMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelMode::Off => "off",
            KernelMode::Auto => "auto",
            KernelMode::On => "on",
        })
    }
}

/// Why a socket that the settings wanted to be `AF_SMC` is plain TCP (the index into
/// [`KernelStats::unavailable`](crate::KernelStats::unavailable)).
///
/// # Examples
///
/// ```
/// use smc_tokio::kernel::KernelUnavailable;
///
/// assert_eq!(KernelUnavailable::NoAfSmc.index(), 1);
/// assert_eq!(KernelUnavailable::NoAfSmc.to_string(), "the kernel has no AF_SMC");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KernelUnavailable {
    /// [`KernelMode::Auto`] and the kernel's SMC module is not loaded.
    NotLoaded,
    /// The kernel has no `AF_SMC` (`socket(2)` said `EAFNOSUPPORT` or `EPROTONOSUPPORT`).
    NoAfSmc,
    /// `socket(AF_SMC, ...)` failed otherwise (permissions, a seccomp filter, limits).
    SocketFailed,
}

impl KernelUnavailable {
    /// The index of this reason in [`KernelStats::unavailable`](crate::KernelStats::unavailable).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::kernel::KernelUnavailable;
    /// assert_eq!(KernelUnavailable::NotLoaded.index(), 0);
    /// assert_eq!(KernelUnavailable::SocketFailed.index(), 2);
    /// ```
    pub fn index(&self) -> usize {
        match self {
            KernelUnavailable::NotLoaded => 0,
            KernelUnavailable::NoAfSmc => 1,
            KernelUnavailable::SocketFailed => 2,
        }
    }
}

impl fmt::Display for KernelUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelUnavailable::NotLoaded => "the kernel's smc module is not loaded",
            KernelUnavailable::NoAfSmc => "the kernel has no AF_SMC",
            KernelUnavailable::SocketFailed => "socket(AF_SMC) failed",
        })
    }
}

/// Why the kernel kept an `AF_SMC` connection on TCP, as its `smc_diag` reports it: the
/// kernel's reason code (its `SMC_CLC_DECL_*` values) and the peer's diagnosis (the code in the
/// peer's decline, when it sent one).
///
/// # Examples
///
/// ```
/// use smc_tokio::kernel::KernelFallback;
///
/// let f = KernelFallback { reason: 0x0301_0000, peer_diagnosis: 0 };
/// assert_eq!(f.name(), Some("peer has no smc"));
/// assert_eq!(f.to_string(), "kernel fallback 0x03010000 (peer has no smc)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelFallback {
    /// The kernel's fallback reason code (`smc->fallback_rsn`).
    pub reason: u32,
    /// The code the peer declined with, if it declined (`smc->peer_diagnosis`), else 0.
    pub peer_diagnosis: u32,
}

/// The kernel's `SMC_CLC_DECL_*` reason codes (`net/smc/smc_clc.h`, Linux 6.x) and what they
/// mean.
pub(crate) const KERNEL_REASONS: &[(u32, &str)] = &[
    (0x0101_0000, "insufficient memory resources"),
    (0x0201_0000, "timeout waiting for the clc proposal"),
    (0x0202_0000, "timeout waiting for the clc accept"),
    (0x0300_0000, "configuration error"),
    (0x0301_0000, "peer has no smc"),
    (0x0302_0000, "ipsec is in use"),
    (0x0303_0000, "no smc device found (r or d)"),
    (0x0303_0001, "no smc-d device found"),
    (0x0303_0002, "no smc-r device found"),
    (0x0303_0003, "no smc-dv2 capable ism device"),
    (0x0303_0004, "peer sent no smcv2 extension"),
    (0x0303_0005, "peer sent no smc-dv2 extension"),
    (0x0303_0006, "peer sent no seid"),
    (0x0303_0007, "no smc-dv2 device found"),
    (0x0303_0008, "no matching ueid"),
    (0x0303_0009, "release version error"),
    (0x0303_000a, "maximum connections reached"),
    (0x0303_000b, "maximum links reached"),
    (0x0304_0000, "smc mode not supported"),
    (0x0305_0000, "peer rmbe eyecatcher mismatch"),
    (0x0306_0000, "fastopen or another option unsupported"),
    (0x0307_0000, "different ip prefix"),
    (0x0308_0000, "getting the vlan id failed"),
    (0x0309_0000, "ism vlan id setting failed"),
    (0x030a_0000, "no active smc-r link in the link group"),
    (0x030b_0000, "smc-r link from the server not found"),
    (0x030c_0000, "smc version mismatch"),
    (0x030d_0000, "smc-d dmbs exhausted"),
    (0x030e_0000, "no route to the peer"),
    (0x030f_0000, "indirect route not supported"),
    (0x0400_0000, "synchronization error"),
    (0x0500_0000, "peer declined during the handshake"),
    (0x0999_0000, "internal error"),
    (0x0999_0001, "rtoken handling failed"),
    (0x0999_0002, "ib_modify_qp to rts failed"),
    (0x0999_0003, "buffer registration failed"),
];

impl KernelFallback {
    /// What the kernel's reason code means, if this crate knows it.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::kernel::KernelFallback;
    /// assert_eq!(KernelFallback { reason: 0x0303_0008, peer_diagnosis: 0 }.name(), Some("no matching ueid"));
    /// assert_eq!(KernelFallback { reason: 0x1234, peer_diagnosis: 0 }.name(), None);
    /// ```
    pub fn name(&self) -> Option<&'static str> {
        KERNEL_REASONS.iter().find(|(c, _)| *c == self.reason).map(|(_, n)| *n)
    }
}

impl fmt::Display for KernelFallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel fallback {:#010x}", self.reason)?;
        if let Some(n) = self.name() {
            write!(f, " ({n})")?;
        }
        if self.peer_diagnosis != 0 {
            write!(f, ", peer's diagnosis {:#010x}", self.peer_diagnosis)?;
        }
        Ok(())
    }
}
