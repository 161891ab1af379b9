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

/// Size of each receive ring (RMB) of a shared-memory connection, per direction.
///
/// `smcperf local --scenario stream --transport smc,tcp --runs 5 --rmb-size N` on the 2-vCPU
/// development VM (64 KiB writes, medians, ratio to tokio TCP in the same run): 64 KiB 0.47x
/// (one-write ring: lockstep), 128 KiB 1.00x, 256 KiB 2.51x, 512 KiB 2.64x, 1 MiB 2.89x,
/// 2 MiB 3.04x. 256 KiB is the knee: 94% of the 1 MiB figure at a quarter of the memory
/// (1000 connections cost 256 MiB per side, not 1 GiB). Request/response latency does not
/// depend on it.
pub const DEFAULT_RMB_SIZE: u32 = 256 << 10;

/// Connections one shm link group holds at once (RMB slots per side). 1024 covers the
/// "1000 concurrent connections on one link group" test; the region is sized for all of them
/// but pages are only allocated when touched.
pub const DEFAULT_RMBS_PER_GROUP: u32 = 1024;

/// CDC frames in flight per direction of a link group: 1024 frames of 64 bytes (64 KiB), one
/// per connection of a full group.
pub const DEFAULT_CDC_SLOTS: u32 = 1024;

/// How long a link group with no connections lives before it is torn down, so that bursts of
/// short connections reuse it. A minute, as a middle ground between the kernel's ten-minute
/// link-group linger (`SMC_LGR_FREE_DELAY_SERV`) and returning memory promptly.
pub const DEFAULT_LINK_GROUP_IDLE: Duration = Duration::from_secs(60);

/// Inline first message: writes up to this size on an idle connection ride in the CDC message.
/// The whole 40-byte inline area of a frame; see the README's performance section for the
/// `smcperf rr` figures with and without it.
pub const DEFAULT_INLINE_MAX: usize = crate::proto::cdc::CDC_INLINE_MAX;

/// Autocork size; 0 (off). See the README's performance section for `smcperf stream` with
/// 64-byte writes, autocork on and off.
pub const DEFAULT_AUTOCORK: u32 = 0;

/// Process-wide cap on RMB memory in use (allocated slots times their size). Beyond it, new
/// connections are declined with "out of memory" and served as TCP.
pub const DEFAULT_RMB_MEMORY_CAP: u64 = 1 << 30;

/// Shared-memory (SMC-D) settings.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use smc_tokio::config::ShmConfig;
///
/// let cfg = ShmConfig::default().rmb_size(64 << 10).busy_poll(Duration::from_micros(50));
/// assert_eq!(cfg.get_rmb_size(), 64 << 10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmConfig {
    pub(crate) enabled: bool,
    pub(crate) rmb_size: u32,
    pub(crate) rmbs_per_group: u32,
    pub(crate) cdc_slots: u32,
    pub(crate) busy_poll: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) allowed_uids: Vec<u32>,
    pub(crate) inline_max: usize,
    pub(crate) autocork: u32,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            enabled: true,
            rmb_size: DEFAULT_RMB_SIZE,
            rmbs_per_group: DEFAULT_RMBS_PER_GROUP,
            cdc_slots: DEFAULT_CDC_SLOTS,
            busy_poll: Duration::ZERO,
            idle_timeout: DEFAULT_LINK_GROUP_IDLE,
            allowed_uids: Vec::new(),
            inline_max: DEFAULT_INLINE_MAX,
            autocork: DEFAULT_AUTOCORK,
        }
    }
}

impl ShmConfig {
    /// Offer (client) or accept (server) shared memory at all. On by default.
    pub fn enabled(mut self, on: bool) -> Self {
        self.enabled = on;
        self
    }

    /// Size of each receive ring this side provides (clamped to 4 KiB ..= 64 MiB).
    pub fn rmb_size(mut self, bytes: u32) -> Self {
        self.rmb_size = bytes.clamp(4 << 10, 64 << 20);
        self
    }

    /// The receive ring size.
    pub fn get_rmb_size(&self) -> u32 {
        self.rmb_size
    }

    /// Connections per link group (clamped to 1 ..= 65536).
    pub fn rmbs_per_group(mut self, n: u32) -> Self {
        self.rmbs_per_group = n.clamp(1, 1 << 16);
        self
    }

    /// How long the link group's driver spins on shared memory before it arms the doorbell and
    /// sleeps. Trades a CPU for latency: a wake-up through an eventfd costs about 20 us between
    /// cores on the development VM, a poll of shared memory well under 1 us. Off by default.
    pub fn busy_poll(mut self, budget: Duration) -> Self {
        self.busy_poll = budget.min(Duration::from_millis(10));
        self
    }

    /// How long an idle link group lives.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Largest write (in bytes, at most [`CDC_INLINE_MAX`](crate::proto::cdc::CDC_INLINE_MAX))
    /// that travels inside its CDC message when the connection is idle, so the peer reads it
    /// from the message instead of from the ring. 0 turns it off.
    pub fn inline_max(mut self, bytes: usize) -> Self {
        self.inline_max = bytes.min(crate::proto::cdc::CDC_INLINE_MAX);
        self
    }

    /// Autocork: while written data is still unconsumed by the peer, small writes are held
    /// back until this many bytes wait, or the peer has read everything (the kernel's
    /// `autocorking_size`). The first write on an idle connection is never delayed. 0 turns it
    /// off.
    pub fn autocork(mut self, bytes: u32) -> Self {
        self.autocork = bytes;
        self
    }

    /// Other uids (besides this process's own) whose processes may join this side's link
    /// groups. By default only the same uid may.
    pub fn allow_uid(mut self, uid: u32) -> Self {
        self.allowed_uids.push(uid);
        self
    }
}

/// Sets the process-wide cap on RMB memory in use (default
/// [`DEFAULT_RMB_MEMORY_CAP`]). Connections that would exceed it are declined with "out of
/// memory" and served as TCP. Takes effect for new connections at once.
///
/// # Examples
///
/// ```
/// smc_tokio::config::set_rmb_memory_cap(512 << 20);
/// assert!(smc_tokio::config::rmb_memory_in_use() <= 512 << 20);
/// # smc_tokio::config::set_rmb_memory_cap(smc_tokio::config::DEFAULT_RMB_MEMORY_CAP);
/// ```
pub fn set_rmb_memory_cap(bytes: u64) {
    crate::smc::manager::Manager::global().set_rmb_cap(bytes);
}

/// RMB memory this process has allocated to live connections (both roles), in bytes.
pub fn rmb_memory_in_use() -> u64 {
    crate::smc::manager::Manager::global().rmb_in_use()
}
