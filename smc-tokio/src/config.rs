//! Policies and defaults shared by listeners and streams.

use std::time::Duration;

/// What to do when SMC cannot be used for a connection.
///
/// # Examples
///
/// ```
/// use smc_tokio::Policy;
///
/// assert_eq!(Policy::default(), Policy::Auto);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Policy {
    /// Try SMC; on a decline, a timeout or a non-SMC peer, continue (or reconnect) over TCP.
    #[default]
    Auto,
    /// Require SMC: where a connection would fall back, fail it with
    /// [`SmcError::FallbackRefused`](crate::SmcError::FallbackRefused) instead. For tests and
    /// benchmarks that must not silently measure TCP.
    Never,
    /// Never try SMC. A listener still answers proposals (with a decline), so SMC clients keep
    /// working over TCP.
    TcpOnly,
}

/// How long the listener waits for a new connection's first bytes before it takes the client
/// for one that waits for the server to speak first. An SMC client sends its proposal right
/// after connecting, so on a LAN or loopback it arrives within a round trip (microseconds to
/// about a millisecond); 200 ms leaves two orders of magnitude for a loaded server. The cost is
/// paid only by server-speaks-first protocols (SMTP, MySQL): their greeting is delayed by this
/// much. Such servers should lower it or use [`Policy::TcpOnly`].
pub const DEFAULT_PEEK_TIMEOUT: Duration = Duration::from_millis(200);

/// Bound on a whole CLC handshake, both roles: the kernel's `CLC_WAIT_TIME` (2 s,
/// net/smc/smc_clc.h).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a client remembers that a server answered as plain TCP, so it does not pay a
/// failed proposal and a reconnect on every connection. A minute bounds the cost of a server
/// that is upgraded to SMC while clients run, at one failed proposal per minute per server
/// otherwise.
pub const DEFAULT_NEGATIVE_CACHE_TTL: Duration = Duration::from_secs(60);
