//! Policies and defaults shared by listeners and streams.

use std::time::Duration;

/// When to try SMC, and what to do when it cannot be used for a connection.
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
    /// SMC wherever the peer is known to speak it, and nowhere else: a listener on this host
    /// (found at its door, out of band: SMC-D, or SMC-R between two local RDMA ports), and
    /// the [in-band peers](crate::SmcStreamBuilder::inband_peers) (SMC-R across hosts). Any
    /// other server sees a plain TCP client. On a decline or a timeout the connection simply
    /// continues over TCP.
    #[default]
    Auto,
    /// Require SMC: propose everywhere, as [`Policy::Always`] does, and where a connection
    /// would fall back, fail it with
    /// [`SmcError::FallbackRefused`](crate::SmcError::FallbackRefused) instead. For tests and
    /// benchmarks that must not silently measure TCP.
    Never,
    /// Never try SMC. A listener opens no door (same-host clients connect as plain TCP) and
    /// answers in-band proposals with a decline, so SMC clients keep working over TCP.
    TcpOnly,
    /// As [`Policy::Auto`], and propose in-band to every destination, as if every address were
    /// an in-band peer. A server that does not speak SMC then receives the Proposal as its
    /// first bytes; the client closes that connection and connects again as plain TCP (and
    /// remembers the server in its negative cache). For deployments where every server runs
    /// smc-tokio.
    Always,
}

impl Policy {
    /// Whether a client with this policy proposes in-band to a destination that is not an
    /// in-band peer.
    pub(crate) fn proposes_everywhere(self) -> bool {
        matches!(self, Policy::Always | Policy::Never)
    }
}

/// Destinations a client negotiates SMC with in-band, over the TCP stream itself: how SMC-R is
/// reached on other hosts. A list of addresses and networks (`10.1.2.3`, `10.0.0.0/8`,
/// `fd00::/8`).
///
/// Out-of-band intent works on one host only; to another host the only way to ask is the
/// connection's first bytes. A server there that does not speak SMC would read them as
/// garbage, so a client proposes in-band only to the peers listed here (or to every peer under
/// [`Policy::Always`]). Empty by default.
///
/// # Examples
///
/// ```
/// use smc_tokio::config::InbandPeers;
///
/// let peers: InbandPeers = "10.0.0.0/8, 192.168.7.20".parse().unwrap();
/// assert!(peers.contains("10.9.8.7".parse().unwrap()));
/// assert!(peers.contains("192.168.7.20".parse().unwrap()));
/// assert!(!peers.contains("192.168.7.21".parse().unwrap()));
/// assert!("10.0.0.0/33".parse::<InbandPeers>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InbandPeers {
    nets: Vec<(std::net::IpAddr, u8)>,
}

impl InbandPeers {
    /// No peers.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::InbandPeers;
    ///
    /// let peers = InbandPeers::none();
    /// assert!(peers.is_empty());
    /// assert!(!peers.contains("10.0.0.1".parse().unwrap()));
    /// assert_eq!(peers, InbandPeers::default());
    /// ```
    pub fn none() -> InbandPeers {
        InbandPeers::default()
    }

    /// Adds the network `addr/prefix` (a whole address with prefix 32 or 128). A prefix longer
    /// than the address is clamped to it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use smc_tokio::config::InbandPeers;
    ///
    /// let net = IpAddr::V4(Ipv4Addr::new(10, 1, 0, 0));
    /// let peers = InbandPeers::none().with(net, 16);
    /// assert!(peers.contains("10.1.200.3".parse().unwrap()));
    /// assert!(!peers.contains("10.2.0.1".parse().unwrap()));
    /// assert_eq!(peers, "10.1.0.0/16".parse::<InbandPeers>().unwrap());
    /// // A prefix longer than the address is clamped: /40 on IPv4 is /32.
    /// assert_eq!(InbandPeers::none().with(net, 40), InbandPeers::none().with(net, 32));
    /// ```
    pub fn with(mut self, addr: std::net::IpAddr, prefix: u8) -> InbandPeers {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        self.nets.push((addr, prefix.min(max)));
        self
    }

    /// Whether `ip` falls in one of the networks (an IPv4-mapped IPv6 address counts as its
    /// IPv4 address).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::InbandPeers;
    ///
    /// let peers: InbandPeers = "192.168.7.0/24, fd00::/8".parse().unwrap();
    /// assert!(peers.contains("192.168.7.9".parse().unwrap()));
    /// assert!(peers.contains("fd12::1".parse().unwrap()));
    /// assert!(!peers.contains("192.168.8.1".parse().unwrap()));
    /// // An IPv4-mapped IPv6 address counts as its IPv4 address.
    /// assert!(peers.contains("::ffff:192.168.7.9".parse().unwrap()));
    /// ```
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.nets.iter().any(|&(net, prefix)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        })
    }

    /// Whether the list is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::InbandPeers;
    ///
    /// assert!(InbandPeers::none().is_empty());
    /// assert!("".parse::<InbandPeers>().unwrap().is_empty());
    /// assert!(!"10.0.0.1".parse::<InbandPeers>().unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

impl std::str::FromStr for InbandPeers {
    type Err = String;

    /// Parses a comma- or space-separated list of addresses and `address/prefix` networks.
    fn from_str(s: &str) -> Result<InbandPeers, String> {
        let mut peers = InbandPeers::none();
        for item in s.split([',', ' ']).map(str::trim).filter(|i| !i.is_empty()) {
            let (addr, prefix) = match item.split_once('/') {
                Some((a, p)) => (a, Some(p)),
                None => (item, None),
            };
            let addr: std::net::IpAddr = addr.parse().map_err(|_| format!("not an ip address: {item}"))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix = match prefix {
                Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| format!("bad prefix: {item}"))?,
                None => max,
            };
            peers = peers.with(addr, prefix);
        }
        Ok(peers)
    }
}

/// How long a listener that can do SMC-R waits for the first bytes of a client on another host
/// before it takes the client for one that waits for the server to speak first. Same-host
/// clients never wait (they announce themselves out of band), and listeners without an RDMA
/// device never peek. An in-band client sends its proposal right after connecting, so on a LAN
/// it arrives within a round trip (about a millisecond); 200 ms leaves two orders of magnitude
/// for a loaded server. Off-host plain clients of server-speaks-first protocols (SMTP, MySQL)
/// on such a listener see their greeting delayed by this much; a proposal that comes later is
/// answered with a decline, never handed to the application.
pub const DEFAULT_PEEK_TIMEOUT: Duration = Duration::from_millis(200);

/// Bound on each step of a CLC handshake (each wait for the peer's next message), both roles:
/// the kernel's `CLC_WAIT_TIME` (2 s, net/smc/smc_clc.h).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest handshake bound taken ([`Settings::handshake_timeout`]; less is this): 0 failed
/// every handshake before its first message could be answered, where a same-host one takes
/// about 100 us on the 2-vCPU VM (`smcperf`'s `crr` handshake times).
pub const MIN_HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest handshake or peek bound taken (more is this): an hour is past any handshake,
/// and a bound near `Duration::MAX` overflowed the `Instant` arithmetic of the handshake's
/// deadlines (a panic).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

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

/// The smallest receive ring: what [`ShmConfig::rmb_size`] and [`ShmConfig::rmb_max`] take at
/// least, and the smallest an RDMA peer may ask us to write into. One page: below it, each
/// CDC message (44 bytes, with a wake-up on the other end) would carry less than a page of
/// data; the kernel's SMC goes no lower than 16 KiB (`SMC_BUF_MIN_SIZE`).
pub const MIN_RMB_SIZE: u32 = 4 << 10;

/// How large a shared-memory connection's ring may grow (RMB autotuning): a writer that fills
/// its ring doubles it, once the reader drained it, up to this size and within the process
/// budget ([`set_rmb_memory_cap`]). The region reserves this much address space per slot; pages
/// are allocated only when a ring grows into them.
pub const DEFAULT_RMB_MAX: u32 = 1 << 20;

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

/// Adaptive polling budget: a reader that finds no data polls for up to this long before it
/// sleeps, while polling keeps seeing its data in time. 50 us: `smcperf` rr and http round trips
/// with one connection take 1-8 us when polled, about 70-100 us through the doorbell on the
/// development VM, so a reply in flight arrives well within it. See the README's performance
/// section for the figures with it off and on.
pub const DEFAULT_ADAPTIVE_POLL: Duration = Duration::from_micros(50);

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
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// The fields this value's setters set (bit `1 << ShmField::X`): only those override the
    /// process-wide settings when a builder takes this value.
    pub(crate) set: u16,
    pub(crate) enabled: bool,
    pub(crate) rmb_size: u32,
    pub(crate) rmb_max: u32,
    pub(crate) rmbs_per_group: u32,
    pub(crate) cdc_slots: u32,
    pub(crate) busy_poll: Duration,
    pub(crate) adaptive_poll: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) allowed_uids: Vec<u32>,
    pub(crate) inline_max: usize,
    pub(crate) autocork: u32,
}

/// The fields of a [`ShmConfig`] a setter can set, as bit positions of its `set` mask.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub(crate) enum ShmField {
    Enabled,
    RmbSize,
    RmbMax,
    RmbsPerGroup,
    BusyPoll,
    AdaptivePoll,
    IdleTimeout,
    InlineMax,
    Autocork,
    AllowedUids,
}

impl PartialEq for ShmConfig {
    /// The values only: which of them a setter set does not count.
    fn eq(&self, o: &Self) -> bool {
        (self.enabled, self.rmb_size, self.rmb_max, self.rmbs_per_group, self.cdc_slots, self.busy_poll)
            == (o.enabled, o.rmb_size, o.rmb_max, o.rmbs_per_group, o.cdc_slots, o.busy_poll)
            && (self.adaptive_poll, self.idle_timeout, &self.allowed_uids, self.inline_max, self.autocork)
                == (o.adaptive_poll, o.idle_timeout, &o.allowed_uids, o.inline_max, o.autocork)
    }
}

impl Eq for ShmConfig {}

impl ShmConfig {
    /// `self` (the process-wide value) with every field that `over`'s setters set taken from
    /// `over` (a builder's): settings resolve field by field.
    pub(crate) fn overlaid(&self, over: &ShmConfig) -> ShmConfig {
        let mut r = self.clone();
        let has = |f: ShmField| over.set & (1 << f as u16) != 0;
        if has(ShmField::Enabled) {
            r.enabled = over.enabled;
        }
        if has(ShmField::RmbSize) {
            r.rmb_size = over.rmb_size;
        }
        if has(ShmField::RmbMax) {
            r.rmb_max = over.rmb_max;
        }
        if has(ShmField::RmbsPerGroup) {
            r.rmbs_per_group = over.rmbs_per_group;
        }
        if has(ShmField::BusyPoll) {
            r.busy_poll = over.busy_poll;
        }
        if has(ShmField::AdaptivePoll) {
            r.adaptive_poll = over.adaptive_poll;
        }
        if has(ShmField::IdleTimeout) {
            r.idle_timeout = over.idle_timeout;
        }
        if has(ShmField::InlineMax) {
            r.inline_max = over.inline_max;
        }
        if has(ShmField::Autocork) {
            r.autocork = over.autocork;
        }
        if has(ShmField::AllowedUids) {
            r.allowed_uids = over.allowed_uids.clone();
        }
        r.set = self.set | over.set;
        r
    }
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            set: 0,
            enabled: true,
            rmb_size: DEFAULT_RMB_SIZE,
            rmb_max: DEFAULT_RMB_MAX,
            rmbs_per_group: DEFAULT_RMBS_PER_GROUP,
            cdc_slots: DEFAULT_CDC_SLOTS,
            busy_poll: Duration::ZERO,
            adaptive_poll: DEFAULT_ADAPTIVE_POLL,
            idle_timeout: DEFAULT_LINK_GROUP_IDLE,
            allowed_uids: Vec::new(),
            inline_max: DEFAULT_INLINE_MAX,
            autocork: DEFAULT_AUTOCORK,
        }
    }
}

impl ShmConfig {
    /// Offer (client) or accept (server) shared memory at all. On by default.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{Settings, ShmConfig};
    ///
    /// let off = ShmConfig::default().enabled(false);
    /// assert_ne!(off, ShmConfig::default()); // on by default
    /// // What `SMC_TOKIO_SHM=0` sets for the whole process.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_SHM").then(|| "0".to_string()));
    /// assert_eq!(env.shm, off);
    /// ```
    pub fn enabled(mut self, on: bool) -> Self {
        self.enabled = on;
        self.set |= 1 << ShmField::Enabled as u16;
        self
    }

    /// Size of each receive ring this side provides (clamped to 4 KiB ..= 64 MiB).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::ShmConfig;
    ///
    /// assert_eq!(ShmConfig::default().rmb_size(1 << 20).get_rmb_size(), 1 << 20);
    /// // Out-of-range sizes are clamped to 4 KiB ..= 64 MiB.
    /// assert_eq!(ShmConfig::default().rmb_size(100).get_rmb_size(), 4 << 10);
    /// assert_eq!(ShmConfig::default().rmb_size(u32::MAX).get_rmb_size(), 64 << 20);
    /// ```
    pub fn rmb_size(mut self, bytes: u32) -> Self {
        self.rmb_size = bytes.clamp(MIN_RMB_SIZE, 64 << 20);
        self.set |= 1 << ShmField::RmbSize as u16;
        self
    }

    /// The receive ring size.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{Settings, ShmConfig, DEFAULT_RMB_SIZE};
    ///
    /// assert_eq!(ShmConfig::default().get_rmb_size(), DEFAULT_RMB_SIZE);
    /// // `SMC_TOKIO_RMB_SIZE` takes `k`/`m` suffixes.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_RMB_SIZE").then(|| "1m".to_string()));
    /// assert_eq!(env.shm.get_rmb_size(), 1 << 20);
    /// ```
    pub fn get_rmb_size(&self) -> u32 {
        self.rmb_size
    }

    /// How large each shared-memory receive ring may grow (RMB autotuning; clamped to
    /// 4 KiB ..= 64 MiB). A ring starts at [`rmb_size`](Self::rmb_size); when its writer fills
    /// it, the ring doubles once the reader has drained it, up to this size, while the process
    /// budget ([`set_rmb_memory_cap`]) allows. A value at or below `rmb_size` turns autotuning
    /// off. SMC-R rings keep `rmb_size`: they are registered (pinned) memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{ShmConfig, DEFAULT_RMB_MAX};
    ///
    /// assert_eq!(ShmConfig::default().get_rmb_max(), DEFAULT_RMB_MAX);
    /// // Fixed 512 KiB rings: no autotuning.
    /// let fixed = ShmConfig::default().rmb_size(512 << 10).rmb_max(0);
    /// assert_eq!(fixed.get_rmb_max(), 512 << 10);
    /// ```
    pub fn rmb_max(mut self, bytes: u32) -> Self {
        self.rmb_max = bytes.clamp(MIN_RMB_SIZE, 64 << 20);
        self.set |= 1 << ShmField::RmbMax as u16;
        self
    }

    /// The size a receive ring may grow to: never below [`get_rmb_size`](Self::get_rmb_size).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{Settings, ShmConfig};
    ///
    /// // A start above the cap keeps the start: the ring is fixed.
    /// assert_eq!(ShmConfig::default().rmb_size(4 << 20).get_rmb_max(), 4 << 20);
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_RMB_MAX").then(|| "4m".to_string()));
    /// assert_eq!(env.shm.get_rmb_max(), 4 << 20);
    /// ```
    pub fn get_rmb_max(&self) -> u32 {
        self.rmb_max.max(self.rmb_size)
    }

    /// Connections per link group (clamped to 1 ..= 65536).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::ShmConfig;
    ///
    /// let small = ShmConfig::default().rmbs_per_group(16);
    /// assert_ne!(small, ShmConfig::default());
    /// // Clamped to 1 ..= 65536.
    /// let d = ShmConfig::default();
    /// assert_eq!(d.clone().rmbs_per_group(0), d.clone().rmbs_per_group(1));
    /// assert_eq!(d.clone().rmbs_per_group(1 << 20), d.rmbs_per_group(1 << 16));
    /// ```
    pub fn rmbs_per_group(mut self, n: u32) -> Self {
        self.rmbs_per_group = n.clamp(1, 1 << 16);
        self.set |= 1 << ShmField::RmbsPerGroup as u16;
        self
    }

    /// How long the link group's driver keeps looking at shared memory before it arms the
    /// doorbell and sleeps, and a waiting reader spins before it polls or sleeps. Trades a CPU
    /// for latency: a wake-up through a doorbell costs about 20 us between cores on the
    /// development VM, a poll of shared memory well under 1 us. Off by default.
    ///
    /// Neither holds a thread from the tasks that share it: the driver looks once per turn of
    /// the runtime (its other tasks run in between), and a reader spins inside its own poll for
    /// at most 5 us of the budget, then goes on waiting through the runtime. A reader spins only
    /// while it awaits a reply (it wrote since a read last returned bytes: a reader that drains
    /// until it would block does not), and one reader of a link group at a time.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::config::{Settings, ShmConfig};
    ///
    /// let cfg = ShmConfig::default().busy_poll(Duration::from_micros(50));
    /// // The same as `SMC_TOKIO_BUSY_POLL_US=50`.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_BUSY_POLL_US").then(|| "50".to_string()));
    /// assert_eq!(env.shm, cfg);
    /// // Budgets above 10 ms are clamped.
    /// let max = ShmConfig::default().busy_poll(Duration::from_millis(10));
    /// assert_eq!(ShmConfig::default().busy_poll(Duration::from_secs(1)), max);
    /// ```
    pub fn busy_poll(mut self, budget: Duration) -> Self {
        self.busy_poll = budget.min(Duration::from_millis(10));
        self.set |= 1 << ShmField::BusyPoll as u16;
        self
    }

    /// Adaptive polling budget (0 turns it off; clamped to 10 ms). A reader that finds no data
    /// polls shared memory for up to this long (from the start of its wait) instead of
    /// sleeping on the doorbell: the peer then sends without ringing and the reply is seen
    /// without a wake-up. It polls by staying runnable (its task looks again on the runtime's
    /// next turn), so other tasks on the thread keep running; only a connection alone on its
    /// link group that awaits a reply (it wrote since it last read bytes) first spins inside
    /// its poll, for about a microsecond at the first look of a wait (a same-host round trip
    /// mostly fits), and a spin that missed its reply makes the next 1, 2, 4, ... 64 waits
    /// skip it.
    /// A poll whose budget runs out before the data comes makes the connection's next 1, 2,
    /// 4, ... 64 waits sleep at once, so idle connections and slow peers cost little CPU; a poll
    /// that sees its data keeps the connection polling. Unlike [`busy_poll`](Self::busy_poll),
    /// which spins before every sleep. On a current-thread runtime a link group's driver polls
    /// by the same rule after each batch of work it dispatched, so that many connections
    /// answering one another on one thread need neither doorbells nor sleeps.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::config::{Settings, ShmConfig, DEFAULT_ADAPTIVE_POLL};
    ///
    /// assert_eq!(ShmConfig::default().get_adaptive_poll(), DEFAULT_ADAPTIVE_POLL);
    /// let off = ShmConfig::default().adaptive_poll(Duration::ZERO);
    /// // The same as `SMC_TOKIO_ADAPTIVE_POLL_US=0`.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_ADAPTIVE_POLL_US").then(|| "0".to_string()));
    /// assert_eq!(env.shm, off);
    /// assert_eq!(ShmConfig::default().adaptive_poll(Duration::from_secs(1)).get_adaptive_poll(), Duration::from_millis(10));
    /// ```
    pub fn adaptive_poll(mut self, budget: Duration) -> Self {
        self.adaptive_poll = budget.min(Duration::from_millis(10));
        self.set |= 1 << ShmField::AdaptivePoll as u16;
        self
    }

    /// The adaptive polling budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::config::ShmConfig;
    ///
    /// let cfg = ShmConfig::default().adaptive_poll(Duration::from_micros(20));
    /// assert_eq!(cfg.get_adaptive_poll(), Duration::from_micros(20));
    /// ```
    pub fn get_adaptive_poll(&self) -> Duration {
        self.adaptive_poll
    }

    /// How long an idle link group lives.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::config::{ShmConfig, DEFAULT_LINK_GROUP_IDLE};
    ///
    /// let short = ShmConfig::default().idle_timeout(Duration::from_secs(5));
    /// assert_ne!(short, ShmConfig::default());
    /// assert_eq!(ShmConfig::default().idle_timeout(DEFAULT_LINK_GROUP_IDLE), ShmConfig::default());
    /// ```
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self.set |= 1 << ShmField::IdleTimeout as u16;
        self
    }

    /// Largest write (in bytes, at most [`CDC_INLINE_MAX`](crate::proto::cdc::CDC_INLINE_MAX))
    /// that travels inside its CDC message when the connection is idle, so the peer reads it
    /// from the message instead of from the ring. 0 turns it off.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{Settings, ShmConfig};
    /// use smc_tokio::proto::cdc::CDC_INLINE_MAX;
    ///
    /// // The default is the whole inline area; larger values are clamped to it.
    /// assert_eq!(ShmConfig::default().inline_max(CDC_INLINE_MAX), ShmConfig::default());
    /// assert_eq!(ShmConfig::default().inline_max(4096), ShmConfig::default());
    /// // Off, as `SMC_TOKIO_INLINE_MAX=0` sets it.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_INLINE_MAX").then(|| "0".to_string()));
    /// assert_eq!(env.shm, ShmConfig::default().inline_max(0));
    /// ```
    pub fn inline_max(mut self, bytes: usize) -> Self {
        self.inline_max = bytes.min(crate::proto::cdc::CDC_INLINE_MAX);
        self.set |= 1 << ShmField::InlineMax as u16;
        self
    }

    /// Autocork: while written data is still unconsumed by the peer, small writes are held
    /// back until this many bytes wait, or the peer has read everything (the kernel's
    /// `autocorking_size`). The first write on an idle connection is never delayed. 0 turns it
    /// off.
    ///
    /// Unlike Nagle's algorithm, which waits for the peer's kernel, this waits for the peer's
    /// application; a reader of this crate's that only peeks asks for what is held, and gets
    /// it. A peer of an earlier version that only peeks until a whole message is there waits
    /// for the writer's next flush, shutdown or larger write.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{Settings, ShmConfig};
    ///
    /// let cfg = ShmConfig::default().autocork(4096);
    /// // The same as `SMC_TOKIO_AUTOCORK=4k`.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_AUTOCORK").then(|| "4k".to_string()));
    /// assert_eq!(env.shm, cfg);
    /// assert_eq!(ShmConfig::default().autocork(0), ShmConfig::default()); // off by default
    /// ```
    pub fn autocork(mut self, bytes: u32) -> Self {
        self.autocork = bytes;
        self.set |= 1 << ShmField::Autocork as u16;
        self
    }

    /// Other uids (besides this process's own) trusted as same-host peers: a server admits
    /// their registrations at its door and their joins to its link groups; a client registers
    /// at doors they own. By default only the same uid is trusted
    /// (`SMC_TOKIO_SHM_ALLOW_UIDS` sets the list per process).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{Settings, ShmConfig};
    ///
    /// let cfg = ShmConfig::default().allow_uid(0).allow_uid(1000);
    /// assert_ne!(cfg, ShmConfig::default());
    /// // The same list as `SMC_TOKIO_SHM_ALLOW_UIDS=0,1000`.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_SHM_ALLOW_UIDS").then(|| "0,1000".to_string()));
    /// assert_eq!(env.shm, cfg);
    /// ```
    pub fn allow_uid(mut self, uid: u32) -> Self {
        self.allowed_uids.push(uid);
        self.set |= 1 << ShmField::AllowedUids as u16;
        self
    }
}

/// How this side uses RDMA (SMC-R), with the crate's `rdma` feature. Without the feature these
/// settings are accepted and ignored: no RDMA is offered.
///
/// By default the device, port and GID are found from the TCP connection's local address: the
/// active RoCE port whose GID table holds that address as a RoCE v2 GID (the IPv4-mapped GID for
/// IPv4). A connection whose address no port serves offers no RDMA, and goes shared memory or
/// TCP; [`stats()`](crate::stats()) counts why.
///
/// # Examples
///
/// ```
/// use smc_tokio::config::RdmaConfig;
///
/// let cfg = RdmaConfig::default().device("rxe0").port(1).gid_index(1);
/// assert_eq!(cfg.get_device(), Some("rxe0"));
/// assert!(cfg.is_enabled());
/// ```
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// The fields this value's setters set (as [`ShmConfig`]'s).
    pub(crate) set: u16,
    pub(crate) enabled: bool,
    pub(crate) device: Option<String>,
    pub(crate) port: Option<u8>,
    pub(crate) gid_index: Option<u8>,
    pub(crate) link_test: Duration,
}

/// How long an SMC-R link may carry nothing before it is tested: the kernel's default
/// interval between LLC test-link messages (`SMC_LLC_TESTLINK_DEFAULT_TIME`, 30 s).
pub const DEFAULT_LINK_TEST_INTERVAL: Duration = Duration::from_secs(30);

/// The fields of an [`RdmaConfig`] a setter can set, as bit positions of its `set` mask.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub(crate) enum RdmaField {
    Enabled,
    Device,
    Port,
    GidIndex,
    LinkTest,
}

impl PartialEq for RdmaConfig {
    /// The values only: which of them a setter set does not count.
    fn eq(&self, o: &Self) -> bool {
        (self.enabled, &self.device, self.port, self.gid_index, self.link_test)
            == (o.enabled, &o.device, o.port, o.gid_index, o.link_test)
    }
}

impl Eq for RdmaConfig {}

impl RdmaConfig {
    /// As [`ShmConfig::overlaid`].
    pub(crate) fn overlaid(&self, over: &RdmaConfig) -> RdmaConfig {
        let mut r = self.clone();
        let has = |f: RdmaField| over.set & (1 << f as u16) != 0;
        if has(RdmaField::Enabled) {
            r.enabled = over.enabled;
        }
        if has(RdmaField::Device) {
            r.device = over.device.clone();
        }
        if has(RdmaField::Port) {
            r.port = over.port;
        }
        if has(RdmaField::GidIndex) {
            r.gid_index = over.gid_index;
        }
        if has(RdmaField::LinkTest) {
            r.link_test = over.link_test;
        }
        r.set = self.set | over.set;
        r
    }
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            set: 0,
            enabled: true,
            device: None,
            port: None,
            gid_index: None,
            link_test: DEFAULT_LINK_TEST_INTERVAL,
        }
    }
}

impl RdmaConfig {
    /// Offer (client) or accept (server) RDMA at all. On by default (with the `rdma` feature).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::RdmaConfig;
    ///
    /// assert!(RdmaConfig::default().is_enabled());
    /// assert!(!RdmaConfig::default().enabled(false).is_enabled());
    /// ```
    pub fn enabled(mut self, on: bool) -> Self {
        self.enabled = on;
        self.set |= 1 << RdmaField::Enabled as u16;
        self
    }

    /// Whether RDMA is on.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{RdmaConfig, Settings};
    ///
    /// assert!(RdmaConfig::default().is_enabled());
    /// // `SMC_TOKIO_RDMA=0` switches it off for the whole process.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_RDMA").then(|| "0".to_string()));
    /// assert!(!env.rdma.is_enabled());
    /// ```
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Use only the device of this name (as `ibv_devices` lists it, e.g. `mlx5_0`, `rxe0`).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::RdmaConfig;
    ///
    /// let cfg = RdmaConfig::default().device("mlx5_0");
    /// assert_eq!(cfg.get_device(), Some("mlx5_0"));
    /// assert_eq!(cfg, RdmaConfig::default().device(String::from("mlx5_0")));
    /// ```
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.device = Some(name.into());
        self.set |= 1 << RdmaField::Device as u16;
        self
    }

    /// The device named by [`device`](Self::device), if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{RdmaConfig, Settings};
    ///
    /// assert_eq!(RdmaConfig::default().get_device(), None); // any device that serves the address
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_RDMA_DEV").then(|| "rxe0".to_string()));
    /// assert_eq!(env.rdma.get_device(), Some("rxe0"));
    /// ```
    pub fn get_device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// Use only this port number (1-based, as in verbs).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{RdmaConfig, Settings};
    ///
    /// let cfg = RdmaConfig::default().port(2);
    /// assert_ne!(cfg, RdmaConfig::default());
    /// // The same as `SMC_TOKIO_RDMA_PORT=2`.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_RDMA_PORT").then(|| "2".to_string()));
    /// assert_eq!(env.rdma, cfg);
    /// ```
    pub fn port(mut self, port: u8) -> Self {
        self.port = Some(port);
        self.set |= 1 << RdmaField::Port as u16;
        self
    }

    /// Use this GID index instead of the first RoCE v2 one that holds the connection's local
    /// address (to choose among entries of that address, such as its RoCE v1 and v2 ones). It
    /// must hold the address too: both ends decline a peer whose GID is not its TCP address's,
    /// and a port whose entry at this index holds another GID serves no RDMA for the address.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config::{RdmaConfig, Settings};
    ///
    /// let cfg = RdmaConfig::default().gid_index(3);
    /// assert_ne!(cfg, RdmaConfig::default());
    /// // The same as `SMC_TOKIO_RDMA_GID_INDEX=3`.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_RDMA_GID_INDEX").then(|| "3".to_string()));
    /// assert_eq!(env.rdma, cfg);
    /// ```
    pub fn gid_index(mut self, index: u8) -> Self {
        self.gid_index = Some(index);
        self.set |= 1 << RdmaField::GidIndex as u16;
        self
    }

    /// Tests a link that has carried nothing for this long while it serves connections
    /// (default [`DEFAULT_LINK_TEST_INTERVAL`], the kernel's; zero: never). A queue pair learns
    /// that the path to its peer broke only when it sends, so without a test an idle
    /// connection across a broken path would learn it only at its next write. The test is one
    /// small message that our peers take in and drop; when the path is broken, its delivery
    /// fails after the queue pair's retries, and the link's connections move to their TCP
    /// sockets as on any link failure. A broken path is found within two intervals and the
    /// retries (a link's own test counts as traffic for the next interval). Each side tests
    /// its own end of the link, at the interval of the settings its link group was made with
    /// (a connection that joins a group does not change it); the first side to find the break
    /// moves, and the other follows.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use smc_tokio::config::{RdmaConfig, Settings, DEFAULT_LINK_TEST_INTERVAL};
    ///
    /// assert_eq!(RdmaConfig::default().get_link_test_interval(), DEFAULT_LINK_TEST_INTERVAL);
    /// let cfg = RdmaConfig::default().link_test_interval(Duration::from_secs(5));
    /// // The same as `SMC_TOKIO_RDMA_LINK_TEST_MS=5000`.
    /// let env = Settings::from_vars(|k| (k == "SMC_TOKIO_RDMA_LINK_TEST_MS").then(|| "5000".to_string()));
    /// assert_eq!(env.rdma, cfg);
    /// ```
    pub fn link_test_interval(mut self, every: Duration) -> Self {
        self.link_test = every;
        self.set |= 1 << RdmaField::LinkTest as u16;
        self
    }

    /// The interval set by [`link_test_interval`](Self::link_test_interval).
    pub fn get_link_test_interval(&self) -> Duration {
        self.link_test
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
    RmbBudget::process().set_cap(bytes);
}

/// A context's RMB memory budget: bytes of receive rings held by live shared-memory
/// connections, and of SMC-R memory registered (pinned) by live link groups, and the cap they
/// may not exceed. (Ordering: both are plain counters, read and updated with
/// `Relaxed`; the cap is a setting, and a charge that races a cap change may see either.)
#[derive(Debug)]
pub(crate) struct RmbBudget {
    in_use: std::sync::atomic::AtomicU64,
    cap: std::sync::atomic::AtomicU64,
}

impl RmbBudget {
    /// A budget with nothing charged and the default cap.
    pub(crate) fn new() -> RmbBudget {
        RmbBudget {
            in_use: std::sync::atomic::AtomicU64::new(0),
            cap: std::sync::atomic::AtomicU64::new(DEFAULT_RMB_MEMORY_CAP),
        }
    }

    /// The default context's budget, which [`set_rmb_memory_cap`] and [`rmb_memory_in_use`]
    /// speak of.
    pub(crate) fn process() -> &'static std::sync::Arc<RmbBudget> {
        static B: std::sync::OnceLock<std::sync::Arc<RmbBudget>> = std::sync::OnceLock::new();
        B.get_or_init(|| std::sync::Arc::new(RmbBudget::new()))
    }

    /// Sets the cap.
    pub(crate) fn set_cap(&self, bytes: u64) {
        self.cap.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Reserves `bytes` if that stays within the cap.
    pub(crate) fn charge(&self, bytes: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let cap = self.cap.load(Relaxed);
        self.in_use.fetch_update(Relaxed, Relaxed, |used| used.checked_add(bytes).filter(|n| *n <= cap)).is_ok()
    }

    /// Reserves `bytes` if that stays within the cap, as a charge that gives them back when
    /// dropped: for memory whose life is an object's (an RDMA registration, pinned until its
    /// MR is deregistered).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn charge_held(self: &std::sync::Arc<Self>, bytes: u64) -> Option<HeldCharge> {
        self.charge(bytes).then(|| HeldCharge { budget: self.clone(), bytes })
    }

    /// Gives `bytes` back.
    pub(crate) fn uncharge(&self, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let _ = self.in_use.fetch_update(Relaxed, Relaxed, |used| Some(used.saturating_sub(bytes)));
    }

    /// The cap.
    #[cfg(feature = "rdma")]
    pub(crate) fn cap(&self) -> u64 {
        self.cap.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `bytes` more would fit under the cap now (a hint: a charge may take the room
    /// first).
    #[cfg(feature = "rdma")]
    pub(crate) fn room_for(&self, bytes: u64) -> bool {
        self.in_use().checked_add(bytes).is_some_and(|n| n <= self.cap())
    }

    /// Bytes held now.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Bytes charged to an [`RmbBudget`] for as long as this lives ([`RmbBudget::charge_held`]).
#[derive(Debug)]
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) struct HeldCharge {
    budget: std::sync::Arc<RmbBudget>,
    bytes: u64,
}

impl HeldCharge {
    /// The bytes charged.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for HeldCharge {
    fn drop(&mut self) {
        self.budget.uncharge(self.bytes);
    }
}

/// RMB memory the default context holds (both roles), in bytes: shared-memory rings of live
/// connections at their current size, and SMC-R's registered (pinned) chunks while their link
/// groups live.
///
/// # Examples
///
/// ```
/// use smc_tokio::config;
///
/// // No connection is open yet, so no receive ring is allocated.
/// assert_eq!(config::rmb_memory_in_use(), 0);
/// // `stats()` reports the same figure.
/// assert_eq!(smc_tokio::stats().rmb_bytes, config::rmb_memory_in_use());
/// ```
pub fn rmb_memory_in_use() -> u64 {
    RmbBudget::process().in_use()
}

/// Handshakes one listener runs at once by default; beyond it, `limit_handshake` serves TCP.
/// The value is [`SmcListener::bind`](crate::SmcListener::bind)'s listen backlog, as the
/// kernel's SMC bounds handshakes in flight by its listener's backlog (`net/smc/af_smc.c`,
/// `smc_tcp_syn_recv_sock`). A handshake that sets up nothing new (the common case: the link
/// group exists) costs the listener tens of microseconds, but holds its slot until its client
/// answers: with 1000 clients in flight on one runtime that is tens of milliseconds, and 256
/// slots capped SMC handshakes near 5 k/s (`smcperf` crr, separate processes, 2-vCPU VM: 45%
/// of connections over SMC-D, against 95% with 1024). Clients keep a window of registrations
/// per door connection, so no number of them can fill one with answers.
pub const DEFAULT_MAX_PENDING_HANDSHAKES: usize = 1024;

/// Every setting that can be set per process (environment, run-time handle) and overridden per
/// listener or stream (builders).
///
/// Resolution order: the builder's value, else the process-wide value ([`global`]), which
/// starts as the `SMC_TOKIO_*` environment variables read once at first use, else the defaults.
///
/// | variable | setting | example |
/// |---|---|---|
/// | `SMC_TOKIO_POLICY` | [`Policy`]: `auto`, `always`, `never`, `tcp-only` | `tcp-only` |
/// | `SMC_TOKIO_INBAND_PEERS` | [`InbandPeers`]: addresses and networks to propose to in-band | `10.0.0.0/8` |
/// | `SMC_TOKIO_SHM` | shared memory on (`1`) or off (`0`) | `0` |
/// | `SMC_TOKIO_SHM_ALLOW_UIDS` | other uids trusted as same-host peers (doors and link groups) | `0,1000` |
/// | `SMC_TOKIO_LIMIT_HANDSHAKE` | serve TCP at once when handshakes pile up (`1`/`0`) | `1` |
/// | `SMC_TOKIO_MAX_PENDING_HANDSHAKES` | handshakes in flight per listener | `64` |
/// | `SMC_TOKIO_HANDSHAKE_TIMEOUT_MS` | bound on a handshake | `500` |
/// | `SMC_TOKIO_PEEK_TIMEOUT_MS` | wait for an off-host client's first bytes (SMC-R listeners) | `50` |
/// | `SMC_TOKIO_NEGATIVE_CACHE_TTL_MS` | how long a plain server is remembered | `60000` |
/// | `SMC_TOKIO_RMB_SIZE` | receive ring size (bytes; `k`/`m`/`g` suffixes) | `1m` |
/// | `SMC_TOKIO_RMB_MAX` | how large a receive ring may grow (autotuning; bytes) | `4m` |
/// | `SMC_TOKIO_BUSY_POLL_US` | busy-poll budget before sleeping | `50` |
/// | `SMC_TOKIO_ADAPTIVE_POLL_US` | adaptive polling budget (0: off) | `0` |
/// | `SMC_TOKIO_AUTOCORK` | autocork size in bytes (0: off) | `4096` |
/// | `SMC_TOKIO_INLINE_MAX` | largest inline first message | `0` |
/// | `SMC_TOKIO_RDMA` | RDMA on (`1`) or off (`0`), with the `rdma` feature | `0` |
/// | `SMC_TOKIO_RDMA_DEV` | use only this RDMA device | `rxe0` |
/// | `SMC_TOKIO_RDMA_PORT` | use only this port | `1` |
/// | `SMC_TOKIO_RDMA_GID_INDEX` | use this GID index | `1` |
/// | `SMC_TOKIO_RDMA_LINK_TEST_MS` | test an idle SMC-R link this often (0: never) | `30000` |
/// | `SMC_TOKIO_ADAPTIVE_MIN_BYTES` | adaptive fallback threshold (0: off) | `1024` |
/// | `SMC_TOKIO_KERNEL` | the kernel's `AF_SMC` sockets: `off`, `auto` (default), `on` | `on` |
///
/// Durations (`_MS`, `_US`: the unit is in the name) and counts are plain whole numbers; sizes
/// in bytes take a `k`, `m` or `g` suffix (powers of 1024). A value that does not parse (a
/// suffix on a duration, say) is ignored with a warning naming the variable (through
/// `tracing`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// When to try SMC, and what to do when it cannot be used.
    pub policy: Policy,
    /// Destinations a client proposes to in-band (SMC-R across hosts).
    pub inband_peers: InbandPeers,
    /// How long a listener that can do SMC-R waits for the first bytes of a client on another
    /// host (which can only propose in-band). Same-host clients never wait: they announce
    /// themselves at the listener's door before they connect. At most [`MAX_TIMEOUT`].
    pub peek_timeout: Duration,
    /// Bound on a handshake. A client with more than 1024 connections to one listener in
    /// flight (from one runtime) also waits in line at most this long for one to end before it
    /// connects, and goes plain TCP past it, or at once when the line stands still for a second.
    /// Taken within [`MIN_HANDSHAKE_TIMEOUT`] and [`MAX_TIMEOUT`].
    pub handshake_timeout: Duration,
    /// How long a client remembers a plain TCP server.
    pub negative_cache_ttl: Duration,
    /// Serve TCP at once, declining as congested, when `max_pending_handshakes` are running
    /// (the kernel's `SMC_LIMIT_HS`). Off: wait in a bounded queue. (Past its host's share of
    /// `max_pending_handshakes`, an in-band handshake is declined at once either way.)
    pub limit_handshake: bool,
    /// Handshakes a listener runs at once (and, on the client side, per process); at least 1
    /// (0 is taken as 1: with none, every connection went TCP). Of a listener's, clients on
    /// other hosts run three quarters at most, one client host half (at least one each).
    pub max_pending_handshakes: usize,
    /// Shared-memory settings.
    pub shm: ShmConfig,
    /// RDMA settings.
    pub rdma: RdmaConfig,
    /// Adaptive fallback: a server whose SMC connections keep ending before they move this
    /// many bytes is not offered SMC for a while (0: off). See [`ADAPTIVE_STRIKES`].
    pub adaptive_min_bytes: u64,
    /// Whether sockets are the kernel's `AF_SMC` ones, to speak SMC with kernel-SMC peers
    /// (see [`kernel`](crate::kernel)).
    pub kernel: crate::transport::KernelMode,
}

/// Consecutive short SMC connections to one server before adaptive fallback stops proposing to
/// it (for one negative-cache TTL). Three keeps one unlucky connection from switching it off.
pub const ADAPTIVE_STRIKES: u32 = 3;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            policy: Policy::Auto,
            inband_peers: InbandPeers::none(),
            peek_timeout: DEFAULT_PEEK_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            negative_cache_ttl: DEFAULT_NEGATIVE_CACHE_TTL,
            limit_handshake: true,
            max_pending_handshakes: DEFAULT_MAX_PENDING_HANDSHAKES,
            shm: ShmConfig::default(),
            rdma: RdmaConfig::default(),
            adaptive_min_bytes: 0,
            kernel: crate::transport::KernelMode::Auto,
        }
    }
}

impl Settings {
    /// The defaults with the `SMC_TOKIO_*` variables of `lookup` applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::time::Duration;
    /// use smc_tokio::{config::Settings, Policy};
    ///
    /// let vars = HashMap::from([("SMC_TOKIO_POLICY", "tcp-only"), ("SMC_TOKIO_HANDSHAKE_TIMEOUT_MS", "500")]);
    /// let s = Settings::from_vars(|k| vars.get(k).map(|v| v.to_string()));
    /// assert_eq!(s.policy, Policy::TcpOnly);
    /// assert_eq!(s.handshake_timeout, Duration::from_millis(500));
    /// // A value that does not parse is ignored (with a warning).
    /// let s = Settings::from_vars(|k| (k == "SMC_TOKIO_POLICY").then(|| "sometimes".to_string()));
    /// assert_eq!(s, Settings::default());
    /// ```
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Settings {
        let mut s = Settings::default();
        let get = |name: &str| lookup(name).map(|v| v.trim().to_ascii_lowercase());
        fn warn(name: &str, v: &str) {
            tracing::warn!(variable = name, value = v, "ignoring an smc-tokio setting that does not parse");
        }
        // A size in bytes, with an optional `k`, `m` or `g` suffix (powers of 1024).
        let bytes = |name: &str| -> Option<u64> {
            let v = get(name)?;
            let (digits, mul) = match v.as_bytes().last() {
                Some(b'k') => (&v[..v.len() - 1], 1u64 << 10),
                Some(b'm') => (&v[..v.len() - 1], 1 << 20),
                Some(b'g') => (&v[..v.len() - 1], 1 << 30),
                _ => (&v[..], 1),
            };
            match digits.parse::<u64>().ok().and_then(|n| n.checked_mul(mul)) {
                Some(n) => Some(n),
                None => {
                    warn(name, &v);
                    None
                }
            }
        };
        // A plain whole number: durations (`_MS`, `_US`: the unit is in the name, so `2k` is
        // refused rather than read as 2048) and counts.
        let int = |name: &str| -> Option<u64> {
            let v = get(name)?;
            match v.parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    tracing::warn!(
                        variable = name,
                        value = %v,
                        "ignoring an smc-tokio setting that is not a whole number (no unit suffix: the unit is in the name)"
                    );
                    None
                }
            }
        };
        // A whole number that fits a `u8` (a port or GID index).
        let small = |name: &str| -> Option<u8> {
            let n = int(name)?;
            match u8::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    warn(name, &n.to_string());
                    None
                }
            }
        };
        let flag = |name: &str| -> Option<bool> {
            let v = get(name)?;
            match v.as_str() {
                "1" | "on" | "true" | "yes" => Some(true),
                "0" | "off" | "false" | "no" => Some(false),
                _ => {
                    warn(name, &v);
                    None
                }
            }
        };
        if let Some(v) = get("SMC_TOKIO_POLICY") {
            match v.as_str() {
                "auto" => s.policy = Policy::Auto,
                "always" => s.policy = Policy::Always,
                "never" => s.policy = Policy::Never,
                "tcp-only" | "tcp_only" | "tcponly" => s.policy = Policy::TcpOnly,
                _ => warn("SMC_TOKIO_POLICY", &v),
            }
        }
        if let Some(v) = lookup("SMC_TOKIO_INBAND_PEERS") {
            match v.parse::<InbandPeers>() {
                Ok(p) => s.inband_peers = p,
                Err(e) => warn("SMC_TOKIO_INBAND_PEERS", &e),
            }
        }
        if let Some(on) = flag("SMC_TOKIO_SHM") {
            s.shm.enabled = on;
        }
        if let Some(on) = flag("SMC_TOKIO_LIMIT_HANDSHAKE") {
            s.limit_handshake = on;
        }
        if let Some(n) = int("SMC_TOKIO_MAX_PENDING_HANDSHAKES") {
            s.max_pending_handshakes = (n as usize).max(1);
        }
        let ms = |n: u64| Duration::from_millis(n);
        if let Some(n) = int("SMC_TOKIO_HANDSHAKE_TIMEOUT_MS") {
            s.handshake_timeout = ms(n);
        }
        if let Some(n) = int("SMC_TOKIO_PEEK_TIMEOUT_MS") {
            s.peek_timeout = ms(n);
        }
        if let Some(n) = int("SMC_TOKIO_NEGATIVE_CACHE_TTL_MS") {
            s.negative_cache_ttl = ms(n);
        }
        if let Some(v) = lookup("SMC_TOKIO_SHM_ALLOW_UIDS") {
            let uids: Result<Vec<u32>, _> =
                v.split([',', ' ']).map(str::trim).filter(|u| !u.is_empty()).map(str::parse::<u32>).collect();
            match uids {
                Ok(u) => s.shm.allowed_uids = u,
                Err(_) => warn("SMC_TOKIO_SHM_ALLOW_UIDS", &v),
            }
        }
        if let Some(n) = bytes("SMC_TOKIO_RMB_SIZE") {
            s.shm = s.shm.rmb_size(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if let Some(n) = bytes("SMC_TOKIO_RMB_MAX") {
            s.shm = s.shm.rmb_max(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if let Some(n) = int("SMC_TOKIO_BUSY_POLL_US") {
            s.shm = s.shm.busy_poll(Duration::from_micros(n));
        }
        if let Some(n) = int("SMC_TOKIO_ADAPTIVE_POLL_US") {
            s.shm = s.shm.adaptive_poll(Duration::from_micros(n));
        }
        if let Some(n) = bytes("SMC_TOKIO_AUTOCORK") {
            s.shm = s.shm.autocork(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if let Some(n) = bytes("SMC_TOKIO_INLINE_MAX") {
            s.shm = s.shm.inline_max(n as usize);
        }
        if let Some(on) = flag("SMC_TOKIO_RDMA") {
            s.rdma.enabled = on;
        }
        if let Some(v) = lookup("SMC_TOKIO_RDMA_DEV").map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()) {
            s.rdma.device = Some(v);
        }
        if let Some(n) = small("SMC_TOKIO_RDMA_PORT") {
            s.rdma.port = Some(n);
        }
        if let Some(n) = small("SMC_TOKIO_RDMA_GID_INDEX") {
            s.rdma.gid_index = Some(n);
        }
        if let Some(n) = int("SMC_TOKIO_RDMA_LINK_TEST_MS") {
            s.rdma.link_test = Duration::from_millis(n);
        }
        if let Some(n) = bytes("SMC_TOKIO_ADAPTIVE_MIN_BYTES") {
            s.adaptive_min_bytes = n;
        }
        if let Some(v) = get("SMC_TOKIO_KERNEL") {
            match v.parse() {
                Ok(m) => s.kernel = m,
                Err(_) => warn("SMC_TOKIO_KERNEL", &v),
            }
        }
        s
    }
}

/// The process-wide settings: the `SMC_TOKIO_*` environment, read once at first use, and
/// changeable while running (as the kernel's netlink knobs). Builders' explicit values win.
///
/// # Examples
///
/// ```
/// use smc_tokio::config;
///
/// // Serve TCP at once when more than 64 handshakes are in flight, from now on.
/// config::global().update(|s| {
///     s.limit_handshake = true;
///     s.max_pending_handshakes = 64;
/// });
/// assert_eq!(config::global().get().max_pending_handshakes, 64);
/// # config::global().update(|s| *s = config::Settings::from_vars(|k| std::env::var(k).ok()));
/// ```
#[derive(Debug)]
pub struct GlobalSettings {
    inner: std::sync::RwLock<Settings>,
    /// Updates so far: what was read from the settings may be kept until this changes.
    /// (Increased under the write lock after each change, `Release`; a reader takes it,
    /// `Acquire`, before it reads the settings, so what it read is at least that new.)
    version: std::sync::atomic::AtomicU64,
}

impl GlobalSettings {
    /// A handle holding `settings`.
    pub(crate) fn new(settings: Settings) -> GlobalSettings {
        GlobalSettings { inner: std::sync::RwLock::new(settings), version: std::sync::atomic::AtomicU64::new(0) }
    }

    /// How many times the settings were updated: a reader keeps what it derived from them
    /// until this changes. Taken before the read it goes with, so that an update in between
    /// only makes the reader read again.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A snapshot of the current process-wide settings.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::config;
    ///
    /// let before = config::global().get();
    /// config::global().update(|s| s.max_pending_handshakes += 1);
    /// // A snapshot: it keeps the values it was taken with.
    /// assert_eq!(config::global().get().max_pending_handshakes, before.max_pending_handshakes + 1);
    /// # config::global().update(|s| *s = before);
    /// ```
    pub fn get(&self) -> Settings {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes the process-wide settings; connections made after the call use them, on open
    /// listeners too (each accepted connection resolves its settings anew, and a door reads the
    /// uids it trusts again: a door connection from a uid no longer allowed is closed at its
    /// next message). Fixed at bind: whether a listener has a door at
    /// all (one bound under [`Policy::TcpOnly`] serves TCP until it is bound again), and any
    /// field its builder set.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{config, Policy};
    ///
    /// // From now on, new connections in this process stay on TCP.
    /// config::global().update(|s| s.policy = Policy::TcpOnly);
    /// assert_eq!(config::global().get().policy, Policy::TcpOnly);
    /// # config::global().update(|s| *s = config::Settings::from_vars(|k| std::env::var(k).ok()));
    /// ```
    ///
    /// `f` runs under the settings' lock: it changes the settings it is given, and must not
    /// read or update them through this handle (that would wait on the lock it holds).
    pub fn update(&self, f: impl FnOnce(&mut Settings)) {
        let mut s = self.inner.write().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        self.version.fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

/// The process-wide settings handle.
///
/// # Examples
///
/// ```
/// use smc_tokio::config::{self, Settings};
///
/// // The `SMC_TOKIO_*` environment, read at first use; the same handle every time.
/// assert_eq!(config::global().get(), Settings::from_vars(|k| std::env::var(k).ok()));
/// assert!(std::ptr::eq(config::global(), config::global()));
/// ```
pub fn global() -> &'static GlobalSettings {
    global_handle()
}

/// The default context's settings (see [`global`]).
pub(crate) fn global_handle() -> &'static std::sync::Arc<GlobalSettings> {
    static G: std::sync::OnceLock<std::sync::Arc<GlobalSettings>> = std::sync::OnceLock::new();
    G.get_or_init(|| std::sync::Arc::new(GlobalSettings::new(Settings::from_vars(|k| std::env::var(k).ok()))))
}

/// Values a builder set explicitly; everything else comes from its context's settings (the
/// default context's are [`global`]) when used.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overrides {
    pub(crate) policy: Option<Policy>,
    pub(crate) inband_peers: Option<InbandPeers>,
    pub(crate) peek_timeout: Option<Duration>,
    pub(crate) handshake_timeout: Option<Duration>,
    pub(crate) negative_cache_ttl: Option<Duration>,
    pub(crate) limit_handshake: Option<bool>,
    pub(crate) max_pending_handshakes: Option<usize>,
    pub(crate) shm: Option<ShmConfig>,
    pub(crate) rdma: Option<RdmaConfig>,
    pub(crate) adaptive_min_bytes: Option<u64>,
    pub(crate) kernel: Option<crate::transport::KernelMode>,
}

impl Overrides {
    /// The effective settings now, over the context's `base`.
    pub(crate) fn resolve(&self, base: &GlobalSettings) -> Settings {
        self.resolve_over(base.get())
    }

    /// The settings with these overrides on top of the process-wide `base`.
    fn resolve_over(&self, base: Settings) -> Settings {
        let mut s = base;
        if let Some(v) = self.policy {
            s.policy = v;
        }
        if let Some(v) = &self.inband_peers {
            s.inband_peers = v.clone();
        }
        if let Some(v) = self.peek_timeout {
            s.peek_timeout = v;
        }
        if let Some(v) = self.handshake_timeout {
            s.handshake_timeout = v;
        }
        if let Some(v) = self.negative_cache_ttl {
            s.negative_cache_ttl = v;
        }
        if let Some(v) = self.limit_handshake {
            s.limit_handshake = v;
        }
        if let Some(v) = self.max_pending_handshakes {
            s.max_pending_handshakes = v;
        }
        // Field by field: a builder that set one shared-memory field keeps the process-wide
        // value of every other one.
        if let Some(v) = &self.shm {
            s.shm = s.shm.overlaid(v);
        }
        if let Some(v) = &self.rdma {
            s.rdma = s.rdma.overlaid(v);
        }
        if let Some(v) = self.adaptive_min_bytes {
            s.adaptive_min_bytes = v;
        }
        if let Some(v) = self.kernel {
            s.kernel = v;
        }
        s.bounded()
    }
}

impl Settings {
    /// These settings with each value where the crate can work with it, however it was set
    /// (a builder, an environment variable, [`Settings`] given whole): a handshake bound
    /// within [`MIN_HANDSHAKE_TIMEOUT`] and [`MAX_TIMEOUT`], a peek bound within
    /// [`MAX_TIMEOUT`], at least one handshake at once.
    fn bounded(mut self) -> Settings {
        self.handshake_timeout = self.handshake_timeout.clamp(MIN_HANDSHAKE_TIMEOUT, MAX_TIMEOUT);
        self.peek_timeout = self.peek_timeout.min(MAX_TIMEOUT);
        self.max_pending_handshakes = self.max_pending_handshakes.max(1);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each shared-memory and RDMA variable, with the field it sets: it holds with no builder,
    /// with a builder that set another field of the same group, and a builder that set this
    /// field wins.
    #[test]
    fn every_variable_survives_a_builder_that_sets_another_field() {
        type Check = fn(&Settings) -> bool;
        let cases: Vec<(&str, &str, Check, Overrides, Check)> = vec![
            (
                "SMC_TOKIO_SHM",
                "0",
                |s| !s.shm.enabled,
                Overrides { shm: Some(ShmConfig::default().enabled(true)), ..Default::default() },
                |s| s.shm.enabled,
            ),
            (
                "SMC_TOKIO_SHM_ALLOW_UIDS",
                "1000,2000",
                |s| s.shm.allowed_uids == [1000, 2000],
                Overrides { shm: Some(ShmConfig::default().allow_uid(7)), ..Default::default() },
                |s| s.shm.allowed_uids == [7],
            ),
            (
                "SMC_TOKIO_RMB_SIZE",
                "64k",
                |s| s.shm.rmb_size == 64 << 10,
                Overrides { shm: Some(ShmConfig::default().rmb_size(32 << 10)), ..Default::default() },
                |s| s.shm.rmb_size == 32 << 10,
            ),
            (
                "SMC_TOKIO_RMB_MAX",
                "2m",
                |s| s.shm.rmb_max == 2 << 20,
                Overrides { shm: Some(ShmConfig::default().rmb_max(512 << 10)), ..Default::default() },
                |s| s.shm.rmb_max == 512 << 10,
            ),
            (
                "SMC_TOKIO_ADAPTIVE_POLL_US",
                "0",
                |s| s.shm.adaptive_poll == Duration::ZERO,
                Overrides {
                    shm: Some(ShmConfig::default().adaptive_poll(Duration::from_micros(7))),
                    ..Default::default()
                },
                |s| s.shm.adaptive_poll == Duration::from_micros(7),
            ),
            (
                "SMC_TOKIO_BUSY_POLL_US",
                "30",
                |s| s.shm.busy_poll == Duration::from_micros(30),
                Overrides { shm: Some(ShmConfig::default().busy_poll(Duration::from_micros(9))), ..Default::default() },
                |s| s.shm.busy_poll == Duration::from_micros(9),
            ),
            (
                "SMC_TOKIO_AUTOCORK",
                "0",
                |s| s.shm.autocork == 0,
                Overrides { shm: Some(ShmConfig::default().autocork(123)), ..Default::default() },
                |s| s.shm.autocork == 123,
            ),
            (
                "SMC_TOKIO_INLINE_MAX",
                "0",
                |s| s.shm.inline_max == 0,
                Overrides { shm: Some(ShmConfig::default().inline_max(8)), ..Default::default() },
                |s| s.shm.inline_max == 8,
            ),
            (
                "SMC_TOKIO_RDMA",
                "0",
                |s| !s.rdma.enabled,
                Overrides { rdma: Some(RdmaConfig::default().enabled(true)), ..Default::default() },
                |s| s.rdma.enabled,
            ),
            (
                "SMC_TOKIO_RDMA_DEV",
                "rxe7",
                |s| s.rdma.device.as_deref() == Some("rxe7"),
                Overrides { rdma: Some(RdmaConfig::default().device("mlx5_0")), ..Default::default() },
                |s| s.rdma.device.as_deref() == Some("mlx5_0"),
            ),
            (
                "SMC_TOKIO_RDMA_PORT",
                "2",
                |s| s.rdma.port == Some(2),
                Overrides { rdma: Some(RdmaConfig::default().port(1)), ..Default::default() },
                |s| s.rdma.port == Some(1),
            ),
            (
                "SMC_TOKIO_RDMA_GID_INDEX",
                "3",
                |s| s.rdma.gid_index == Some(3),
                Overrides { rdma: Some(RdmaConfig::default().gid_index(1)), ..Default::default() },
                |s| s.rdma.gid_index == Some(1),
            ),
            (
                "SMC_TOKIO_RDMA_LINK_TEST_MS",
                "1500",
                |s| s.rdma.link_test == Duration::from_millis(1500),
                Overrides {
                    rdma: Some(RdmaConfig::default().link_test_interval(Duration::ZERO)),
                    ..Default::default()
                },
                |s| s.rdma.link_test == Duration::ZERO,
            ),
        ];
        // A builder that sets one field of each group, never the variable's own.
        let other_shm = |var: &str| {
            if var == "SMC_TOKIO_RMB_SIZE" {
                ShmConfig::default().idle_timeout(Duration::from_secs(9))
            } else {
                ShmConfig::default().rmb_size(128 << 10)
            }
        };
        let other_rdma = |var: &str| {
            if var == "SMC_TOKIO_RDMA_PORT" {
                RdmaConfig::default().gid_index(5)
            } else {
                RdmaConfig::default().port(4)
            }
        };
        for (var, value, holds, same_field, builder_wins) in cases {
            let base = Settings::from_vars(|k| (k == var).then(|| value.to_string()));
            assert!(holds(&base), "{var}={value} with no builder");
            let other = Overrides { shm: Some(other_shm(var)), rdma: Some(other_rdma(var)), ..Default::default() };
            let s = other.resolve_over(base.clone());
            assert!(holds(&s), "{var}={value} lost to a builder that set another field");
            let s = same_field.resolve_over(base);
            assert!(builder_wins(&s), "a builder that set the field {var} sets must win");
        }
    }

    /// Durations and counts are plain whole numbers (the unit is in the name): a `k`/`m`/`g`
    /// suffix is refused, not multiplied in; sizes take the suffixes.
    #[test]
    fn units_and_suffixes_parse_strictly() {
        let one = |k: &str, v: &str| Settings::from_vars(|n| (n == k).then(|| v.to_string()));
        let d = Settings::default();
        assert_eq!(one("SMC_TOKIO_HANDSHAKE_TIMEOUT_MS", "2k").handshake_timeout, d.handshake_timeout);
        assert_eq!(one("SMC_TOKIO_HANDSHAKE_TIMEOUT_MS", "2000").handshake_timeout, Duration::from_secs(2));
        assert_eq!(one("SMC_TOKIO_BUSY_POLL_US", "1m").shm.busy_poll, d.shm.busy_poll);
        assert_eq!(one("SMC_TOKIO_MAX_PENDING_HANDSHAKES", "1k").max_pending_handshakes, d.max_pending_handshakes);
        assert_eq!(one("SMC_TOKIO_RMB_SIZE", "64k").shm.rmb_size, 64 << 10);
        assert_eq!(one("SMC_TOKIO_ADAPTIVE_MIN_BYTES", "2m").adaptive_min_bytes, 2 << 20);
        assert_eq!(one("SMC_TOKIO_RDMA_PORT", "300").rdma.port, d.rdma.port);
        assert_eq!(one("SMC_TOKIO_RDMA_PORT", "2").rdma.port, Some(2));
        assert_eq!(one("SMC_TOKIO_NEGATIVE_CACHE_TTL_MS", "-5").negative_cache_ttl, d.negative_cache_ttl);
    }

    /// The builder's value for a field wins over the process-wide one, and only for that field.
    #[test]
    fn overlay_takes_exactly_the_fields_a_setter_set() {
        let process = ShmConfig { rmb_size: 1 << 20, autocork: 0, enabled: false, ..ShmConfig::default() };
        let builder = ShmConfig::default().rmb_size(64 << 10);
        let r = process.overlaid(&builder);
        assert_eq!((r.rmb_size, r.autocork, r.enabled), (64 << 10, 0, false));
        // Values compare without regard to which were set.
        assert_eq!(ShmConfig::default().enabled(true), ShmConfig::default());
    }

    /// A held charge is refused past the cap, and gives its bytes back when dropped, once.
    #[test]
    fn a_held_charge_lasts_as_long_as_its_holder() {
        let b = std::sync::Arc::new(RmbBudget::new());
        b.set_cap(3 << 20);
        let first = b.charge_held(2 << 20).expect("within the cap");
        assert_eq!(b.in_use(), 2 << 20);
        assert!(b.charge_held(2 << 20).is_none(), "past the cap");
        assert_eq!(b.in_use(), 2 << 20, "a refused charge takes nothing");
        let second = b.charge_held(1 << 20).expect("up to the cap");
        drop(first);
        assert_eq!(b.in_use(), 1 << 20);
        drop(second);
        assert_eq!(b.in_use(), 0);
    }
}
