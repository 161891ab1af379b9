//! The client's negative cache: servers that recently answered a proposal as plain TCP.

use crate::hash::Map as HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most peers remembered at once. An entry is ~40 bytes, so the cache stays under 200 KiB; a
/// client talking to more distinct plain servers than this within one TTL simply re-probes some.
const CAPACITY: usize = 4096;

/// Why and since when a server is remembered, and until when its rememberer wanted it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    since: Instant,
    until: Instant,
    /// Remembered by adaptive fallback (its SMC connections kept ending too soon), not for
    /// answering as plain TCP: it holds for connections that use adaptive fallback only.
    adaptive: bool,
}

/// Why a server is remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// It answered a proposal as plain TCP.
    Plain,
    /// Its handshake timed out: remembered for a backoff that grows with each timeout.
    Backoff,
    /// Adaptive fallback: its SMC connections kept ending too soon.
    Adaptive,
}

/// How a connection asks the cache ([`NegativeCache::contains`]): with its own TTL (an entry
/// older than that, or any entry when it is 0, does not hold for it) and whether it uses
/// adaptive fallback. The cache is its context's: a builder's settings limit what holds for
/// its own connections, not what other builders remember.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asker {
    pub(crate) ttl: Duration,
    pub(crate) adaptive: bool,
}

#[derive(Debug, Default)]
pub(crate) struct NegativeCache {
    entries: Mutex<HashMap<SocketAddr, Entry>>,
    /// Consecutive handshake timeouts per server, for [`NegativeCache::insert_backoff`].
    timeouts: Mutex<HashMap<SocketAddr, u32>>,
    /// Adaptive fallback: consecutive short SMC connections per server.
    strikes: Mutex<HashMap<SocketAddr, u32>>,
}

impl NegativeCache {
    /// Whether `peer` is remembered at `now`, for `asker`; expired entries are dropped.
    pub(crate) fn contains(&self, peer: SocketAddr, now: Instant, asker: Asker) -> bool {
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&peer) {
            Some(e) if e.until > now => {
                !asker.ttl.is_zero()
                    && (!e.adaptive || asker.adaptive)
                    && e.since.checked_add(asker.ttl).is_none_or(|end| end > now)
            }
            Some(_) => {
                map.remove(&peer);
                false
            }
            None => false,
        }
    }

    /// Remembers `peer` as plain until `now + ttl`.
    pub(crate) fn insert(&self, peer: SocketAddr, now: Instant, ttl: Duration) {
        self.remember(peer, now, ttl, Why::Plain);
    }

    /// Remembers `peer` until `now + ttl`, for the reason `why`.
    fn remember(&self, peer: SocketAddr, now: Instant, ttl: Duration, why: Why) {
        if ttl.is_zero() {
            return;
        }
        // A TTL past what an `Instant` can hold is forever.
        let until = now.checked_add(ttl).unwrap_or(now + Duration::from_secs(u64::from(u32::MAX)));
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        // A live entry is never shortened by another connection's shorter TTL, and one that
        // holds for every connection (the server answered as plain TCP) is not narrowed to the
        // connections that use adaptive fallback. A timeout's backoff says when to try the
        // server again, and is taken as it is.
        let adaptive = why == Why::Adaptive;
        let entry = match map.get(&peer) {
            Some(old) if old.until > now && !old.adaptive && adaptive => return,
            Some(old) if old.until > now && why != Why::Backoff => {
                Entry { since: now, until: until.max(old.until), adaptive }
            }
            _ => Entry { since: now, until, adaptive },
        };
        if map.len() >= CAPACITY && !map.contains_key(&peer) {
            map.retain(|_, e| e.until > now);
            if map.len() >= CAPACITY {
                // Still full of live entries: forget the one that expires first.
                if let Some(oldest) = map.iter().min_by_key(|(_, e)| e.until).map(|(k, _)| *k) {
                    map.remove(&oldest);
                }
            }
        }
        map.insert(peer, entry);
    }

    /// Remembers `peer`, whose handshake timed out, for `base` doubled by each consecutive
    /// timeout before this one, at most `max`: a silent server cannot be told from a busy SMC
    /// one, so it is retried soon, then less and less often.
    pub(crate) fn insert_backoff(&self, peer: SocketAddr, now: Instant, base: Duration, max: Duration) {
        let n = {
            let mut t = self.timeouts.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() >= CAPACITY && !t.contains_key(&peer) {
                t.clear();
            }
            let n = t.entry(peer).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let ttl = base.checked_mul(1u32 << (n - 1).min(16)).unwrap_or(max).min(max);
        self.remember(peer, now, ttl, Why::Backoff);
    }

    /// A handshake with `peer` completed (SMC or a decline): its timeouts are forgiven.
    pub(crate) fn answered(&self, peer: SocketAddr) {
        let mut t = self.timeouts.lock().unwrap_or_else(|e| e.into_inner());
        if !t.is_empty() {
            t.remove(&peer);
        }
    }

    /// Adaptive fallback: records how an SMC connection to `peer` ended. After
    /// [`ADAPTIVE_STRIKES`](crate::config::ADAPTIVE_STRIKES) short ones in a row, the server is
    /// remembered for `ttl` like a plain one: for it, the handshake costs more than it saves.
    /// Returns whether this connection made the server one to leave alone.
    pub(crate) fn record_smc_conn(&self, peer: SocketAddr, long_enough: bool, ttl: Duration) -> bool {
        let mut strikes = self.strikes.lock().unwrap_or_else(|e| e.into_inner());
        if long_enough {
            strikes.remove(&peer);
            return false;
        }
        if strikes.len() >= CAPACITY && !strikes.contains_key(&peer) {
            strikes.clear();
        }
        let n = strikes.entry(peer).or_insert(0);
        *n += 1;
        if *n >= crate::config::ADAPTIVE_STRIKES {
            strikes.remove(&peer);
            drop(strikes);
            tracing::debug!(%peer, "adaptive fallback: short smc connections; proposing no more for a while");
            self.remember(peer, Instant::now(), ttl, Why::Adaptive);
            return true;
        }
        false
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A connection that takes whatever the cache holds.
    const ANY: Asker = Asker { ttl: Duration::MAX, adaptive: true };

    #[test]
    fn ttl_expiry() {
        let c = NegativeCache::default();
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        assert!(!c.contains(addr(1), now, ANY));
        c.insert(addr(1), now, ttl);
        assert!(c.contains(addr(1), now + ttl / 2, ANY));
        assert!(!c.contains(addr(1), now + ttl, ANY));
        assert_eq!(c.len(), 0, "expired entry dropped on lookup");
        c.insert(addr(3), now, Duration::ZERO);
        assert!(!c.contains(addr(3), now, ANY));
    }

    #[test]
    fn adaptive_strikes() {
        let c = NegativeCache::default();
        let ttl = Duration::from_secs(10);
        let now = Instant::now();
        assert!(!c.record_smc_conn(addr(9), false, ttl));
        assert!(!c.record_smc_conn(addr(9), false, ttl));
        assert!(!c.record_smc_conn(addr(9), true, ttl)); // a long connection resets the count
        assert!(!c.record_smc_conn(addr(9), false, ttl));
        assert!(!c.record_smc_conn(addr(9), false, ttl));
        assert!(!c.contains(addr(9), now, ANY));
        assert!(c.record_smc_conn(addr(9), false, ttl));
        assert!(c.contains(addr(9), Instant::now(), ANY));
    }

    #[test]
    fn timeouts_back_off_up_to_the_ttl() {
        let c = NegativeCache::default();
        let now = Instant::now();
        let (base, max) = (Duration::from_secs(2), Duration::from_secs(60));
        let ttl_after = |c: &NegativeCache| {
            let until = c.entries.lock().unwrap().get(&addr(7)).unwrap().until;
            until - now
        };
        c.insert_backoff(addr(7), now, base, max);
        assert_eq!(ttl_after(&c), base, "a first timeout is remembered briefly");
        c.insert_backoff(addr(7), now, base, max);
        assert_eq!(ttl_after(&c), base * 2);
        for _ in 0..10 {
            c.insert_backoff(addr(7), now, base, max);
        }
        assert_eq!(ttl_after(&c), max);
        c.answered(addr(7));
        c.insert_backoff(addr(7), now, base, max);
        assert_eq!(ttl_after(&c), base, "an answer resets the backoff");
    }

    /// The cache is its context's, and every builder's connections ask it: what holds for a
    /// connection is limited by its own settings. A TTL of 0 ("no cache") finds nothing; a
    /// shorter TTL ends an entry earlier for it; an entry of adaptive fallback holds only for
    /// connections that use it. (Before, a server one builder remembered was left alone by
    /// every connection of the context, also those whose builders turned the cache or adaptive
    /// fallback off.) A TTL too long for an `Instant` is forever, not a panic.
    #[test]
    fn what_holds_for_a_connection_is_limited_by_its_own_settings() {
        let c = NegativeCache::default();
        let now = Instant::now();
        c.insert(addr(1), now, Duration::from_secs(60));
        let asker = |secs: u64, adaptive: bool| Asker { ttl: Duration::from_secs(secs), adaptive };
        assert!(!c.contains(addr(1), now, asker(0, true)), "a connection without a cache found an entry");
        assert!(c.contains(addr(1), now + Duration::from_secs(5), asker(10, false)));
        assert!(!c.contains(addr(1), now + Duration::from_secs(20), asker(10, false)), "older than the asker's TTL");
        assert!(c.contains(addr(1), now + Duration::from_secs(20), asker(60, false)));
        let ttl = Duration::from_secs(60);
        for _ in 0..crate::config::ADAPTIVE_STRIKES {
            c.record_smc_conn(addr(2), false, ttl);
        }
        assert!(c.contains(addr(2), Instant::now(), asker(60, true)));
        assert!(
            !c.contains(addr(2), Instant::now(), asker(60, false)),
            "adaptive fallback for a connection without it"
        );
        c.insert(addr(3), now, Duration::MAX);
        assert!(c.contains(addr(3), now + Duration::from_secs(3600), ANY));
        // Another connection's shorter TTL does not cut a live entry short for the others, and
        // adaptive fallback does not hide a plain server from connections without it.
        c.insert(addr(1), now, Duration::from_secs(2));
        assert!(c.contains(addr(1), now + Duration::from_secs(30), asker(60, false)));
        for _ in 0..crate::config::ADAPTIVE_STRIKES {
            c.record_smc_conn(addr(1), false, ttl);
        }
        assert!(c.contains(addr(1), Instant::now(), asker(60, false)));
    }

    #[test]
    fn capacity_is_bounded() {
        let c = NegativeCache::default();
        let now = Instant::now();
        for i in 0..(CAPACITY as u16 + 100) {
            c.insert(addr(i), now + Duration::from_millis(u64::from(i)), Duration::from_secs(60));
        }
        assert_eq!(c.len(), CAPACITY);
        // The newest entry survived; the earliest-expiring ones were evicted.
        assert!(c.contains(addr(CAPACITY as u16 + 99), now, ANY));
        assert!(!c.contains(addr(0), now, ANY));
    }
}
