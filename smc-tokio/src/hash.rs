//! The hash of the crate's maps: keyed, and cheaper than std's SipHash for the small keys they
//! hold (connection tokens, registration ids, ports, addresses).
//!
//! Each map draws its own key from a per-process secret (the kernel's CSPRNG) and a counter, as
//! std's `RandomState` does, so which keys collide differs from map to map and from run to run:
//! a peer that chooses keys (a registration id, a port) cannot aim them at one bucket without
//! the secret. The step is a folded multiply (the 128-bit product of the state, mixed with the
//! input, and an odd constant, its halves XORed), which spreads every input bit over the
//! state; `finish` folds once more, so that the high bits (hashbrown's control bytes) and the
//! low bits (its bucket index) both depend on the whole key.
//!
//! `callgrind` of `smcperf` serving `crr` put std's SipHash at about 1 900 instructions per
//! connection in the client and 2 800 in the server, where the keys are a few words each.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Odd 64-bit constants for the folded multiplies: the fractional part of pi (the digits any
/// such constant may take; what matters is that they are odd and their bits mixed).
const M0: u64 = 0x243f_6a88_85a3_08d3;
const M1: u64 = 0x1319_8a2e_0370_7345;

/// The product of `a` and `b` in 128 bits, its two halves XORed.
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Makes the maps' hashers: a key per map (see the module's documentation).
#[derive(Clone, Debug)]
pub(crate) struct Keyed {
    key: u64,
}

impl Default for Keyed {
    fn default() -> Keyed {
        static SECRET: OnceLock<u64> = OnceLock::new();
        // Relaxed: the counter only has to give each map another value.
        static MAPS: AtomicU64 = AtomicU64::new(0);
        let secret = *SECRET.get_or_init(crate::sys::random_u64);
        let n = MAPS.fetch_add(1, Ordering::Relaxed);
        Keyed { key: fold(secret ^ n.wrapping_mul(M1), M0) }
    }
}

impl BuildHasher for Keyed {
    type Hasher = KeyedHasher;

    #[inline]
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher { state: self.key }
    }
}

/// One key's hash in progress ([`Keyed`]).
#[derive(Clone, Debug)]
pub(crate) struct KeyedHasher {
    state: u64,
}

impl KeyedHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.state = fold(self.state ^ word, M0);
    }
}

impl Hasher for KeyedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // The length is in the word, so that a short tail and the same bytes followed by
            // zeros differ.
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        fold(self.state, M1)
    }
}

/// A `HashMap` hashed with [`Keyed`].
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, Keyed>;

/// Takes one from `key`'s count in `counts`, and the key out once its count is 0 (a map of
/// counts holds only what is counted).
pub(crate) fn count_down<K: std::hash::Hash + Eq, S: BuildHasher>(
    counts: &mut std::collections::HashMap<K, usize, S>,
    key: &K,
) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn hash<T: std::hash::Hash>(b: &Keyed, t: &T) -> u64 {
        b.hash_one(t)
    }

    /// A key hashes alike within a map; two maps (two keys) hash it differently, so a set of
    /// keys that collides in one map does not in the next.
    #[test]
    fn each_map_has_its_own_key() {
        let (a, b) = (Keyed::default(), Keyed::default());
        assert_eq!(hash(&a, &42u64), hash(&a, &42u64));
        assert_ne!(hash(&a, &42u64), hash(&b, &42u64));
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(hash(&a, &addr), hash(&a, &addr));
        assert_ne!(hash(&a, &addr), hash(&b, &addr));
    }

    /// Consecutive small keys (tokens, ports, ids), the maps' usual ones, spread over the bits
    /// hashbrown uses: both the low bits (the bucket) and the top seven (the control byte)
    /// take many values, and no two keys of the run share a hash.
    #[test]
    fn consecutive_keys_spread_over_low_and_high_bits() {
        let b = Keyed::default();
        let hashes: Vec<u64> = (0..4096u32).map(|k| hash(&b, &k)).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        let high: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        let all: std::collections::HashSet<u64> = hashes.iter().copied().collect();
        assert!(low.len() > 900, "{} of 1024 low values", low.len());
        assert_eq!(high.len(), 128, "every control byte value");
        assert_eq!(all.len(), hashes.len());
    }

    /// Byte strings that differ only in trailing zeros or in length hash apart.
    #[test]
    fn tails_and_lengths_count() {
        let b = Keyed::default();
        let h = |bytes: &[u8]| {
            let mut s = b.build_hasher();
            s.write(bytes);
            s.finish()
        };
        assert_ne!(h(b"abc"), h(b"abc\0"));
        assert_ne!(h(b""), h(b"\0"));
        assert_ne!(h(b"12345678"), h(b"12345678\0"));
        assert_eq!(h(b"same bytes"), h(b"same bytes"));
    }

    /// Maps and sets over it behave as maps do.
    #[test]
    fn a_map_over_it_finds_what_it_holds() {
        let mut m: Map<(SocketAddr, u16), u32> = Map::default();
        for i in 0..1000u16 {
            m.insert((SocketAddr::from(([10, 0, 0, 1], i)), i), u32::from(i));
        }
        for i in 0..1000u16 {
            assert_eq!(m.get(&(SocketAddr::from(([10, 0, 0, 1], i)), i)), Some(&u32::from(i)));
        }
    }
}
