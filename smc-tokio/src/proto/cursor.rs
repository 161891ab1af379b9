//! CDC cursors and receive-ring (RMB) arithmetic.
//!
//! A cursor names a byte position in a ring of `size` bytes as `(wrap, count)`: `count` is the
//! offset in the ring (`0 <= count < size`) and `wrap` counts how many times the position has
//! gone round, modulo 2^16. This is the kernel's `union smc_host_cursor` (net/smc/smc_cdc.h).
//!
//! Every function here validates instead of assuming: a cursor that arrives from a peer may be
//! anything, so the arithmetic returns [`CursorError`] rather than a nonsensical distance, and it
//! never overflows or panics.

use std::fmt;

/// A position in a receive ring: `(wrap, count)` as in the kernel's `smc_host_cursor`.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::cursor::{Cursor, RingSize};
///
/// let ring = RingSize::new(16).unwrap();
/// let start = Cursor::default();
/// let later = start.advance(ring, 12).unwrap().advance(ring, 8).unwrap();
/// assert_eq!(later, Cursor::new(1, 4));
/// assert_eq!(ring.distance(start.advance(ring, 8).unwrap(), later), Ok(12));
/// // A single step never skips a whole turn.
/// assert!(start.advance(ring, 17).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cursor {
    /// How many times the position went round the ring (modulo 2^16).
    pub wrap: u16,
    /// Offset in the ring, `0 <= count < ring size` for a valid cursor.
    pub count: u32,
}

impl Cursor {
    /// A cursor at `count` after `wrap` turns.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::Cursor;
    ///
    /// let c = Cursor::new(3, 100);
    /// assert_eq!((c.wrap, c.count), (3, 100));
    /// assert_eq!(c.to_string(), "3:100");
    /// assert_eq!(Cursor::new(0, 0), Cursor::default());
    /// ```
    pub const fn new(wrap: u16, count: u32) -> Self {
        Self { wrap, count }
    }

    /// The cursor `n` bytes further on in a ring of `ring` bytes.
    ///
    /// Fails when `self` is not a valid cursor for `ring` or when `n` exceeds the ring size
    /// (no single step may skip a whole turn).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::{Cursor, RingSize};
    ///
    /// let ring = RingSize::new(100).unwrap();
    /// assert_eq!(Cursor::new(0, 90).advance(ring, 10), Ok(Cursor::new(1, 0)));
    /// // The wrap counter rolls over at 2^16.
    /// assert_eq!(Cursor::new(u16::MAX, 50).advance(ring, 60), Ok(Cursor::new(0, 10)));
    /// // Not a cursor of this ring, or a step past a whole turn: errors.
    /// assert!(Cursor::new(0, 100).advance(ring, 1).is_err());
    /// assert!(Cursor::new(0, 0).advance(ring, 101).is_err());
    /// ```
    pub fn advance(self, ring: RingSize, n: u32) -> Result<Cursor, CursorError> {
        ring.check(self)?;
        if n > ring.get() {
            return Err(CursorError::StepTooLarge { step: n, size: ring.get() });
        }
        // Both terms are below 2^31 (ring sizes are bounded by RingSize::MAX), so the sum fits.
        let pos = self.count + n;
        if pos >= ring.get() {
            Ok(Cursor::new(self.wrap.wrapping_add(1), pos - ring.get()))
        } else {
            Ok(Cursor::new(self.wrap, pos))
        }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.wrap, self.count)
    }
}

/// Why cursor arithmetic refused its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorError {
    /// `count` is not below the ring size.
    OutOfRange {
        /// The offending cursor.
        cursor: Cursor,
        /// The ring size it was checked against.
        size: u32,
    },
    /// The second cursor is behind the first, or more than one ring ahead of it.
    NotAhead {
        /// The earlier cursor.
        from: Cursor,
        /// The cursor that should have been at or after `from`.
        to: Cursor,
    },
    /// A step larger than the ring.
    StepTooLarge {
        /// The requested step.
        step: u32,
        /// The ring size.
        size: u32,
    },
}

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CursorError::OutOfRange { cursor, size } => {
                write!(f, "cursor {cursor} is outside a ring of {size} bytes")
            }
            CursorError::NotAhead { from, to } => {
                write!(f, "cursor {to} is not within one ring ahead of cursor {from}")
            }
            CursorError::StepTooLarge { step, size } => {
                write!(f, "step of {step} bytes exceeds a ring of {size} bytes")
            }
        }
    }
}

impl std::error::Error for CursorError {}

/// The size of a receive ring, validated once: non-zero and at most [`RingSize::MAX`].
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::cursor::{Cursor, RingSize};
///
/// let ring = RingSize::new(1024).unwrap();
/// let cons = Cursor::new(0, 1000);
/// let prod = Cursor::new(1, 100);
/// assert_eq!(ring.used(cons, prod), Ok(124));
/// assert_eq!(ring.free(cons, prod), Ok(900));
/// assert!(RingSize::new(0).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RingSize(u32);

impl RingSize {
    /// The largest ring: 1 GiB. Keeps `count + step` far from `u32` overflow and matches the
    /// kernel's largest RMB (`SMC_RMB_SIZES`, 512 KiB .. 1 MiB in practice) with a wide margin.
    pub const MAX: u32 = 1 << 30;

    /// A ring of `size` bytes, or `None` if `size` is 0 or above [`RingSize::MAX`].
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::RingSize;
    ///
    /// assert_eq!(RingSize::new(4096).map(RingSize::get), Some(4096));
    /// assert!(RingSize::new(0).is_none());
    /// assert!(RingSize::new(RingSize::MAX).is_some());
    /// assert!(RingSize::new(RingSize::MAX + 1).is_none());
    /// ```
    pub const fn new(size: u32) -> Option<Self> {
        if size == 0 || size > Self::MAX {
            None
        } else {
            Some(Self(size))
        }
    }

    /// The size in bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::{Cursor, RingSize};
    ///
    /// let ring = RingSize::new(64 << 10).unwrap();
    /// assert_eq!(ring.get(), 65536);
    /// // An empty ring is all free space.
    /// assert_eq!(ring.free(Cursor::default(), Cursor::default()), Ok(ring.get()));
    /// ```
    pub const fn get(self) -> u32 {
        self.0
    }

    /// Checks that `cursor` lies inside this ring.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::{Cursor, CursorError, RingSize};
    ///
    /// let ring = RingSize::new(100).unwrap();
    /// assert_eq!(ring.check(Cursor::new(7, 99)), Ok(()));
    /// let bad = Cursor::new(7, 100);
    /// assert_eq!(ring.check(bad), Err(CursorError::OutOfRange { cursor: bad, size: 100 }));
    /// ```
    pub fn check(self, cursor: Cursor) -> Result<(), CursorError> {
        if cursor.count < self.0 {
            Ok(())
        } else {
            Err(CursorError::OutOfRange { cursor, size: self.0 })
        }
    }

    /// Bytes from `from` forward to `to`: `0 ..= size`.
    ///
    /// `to` must be at or after `from` and at most one whole ring ahead; anything else is an
    /// error (a cursor that went backwards, or skipped past unread data).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::{Cursor, RingSize};
    ///
    /// let ring = RingSize::new(100).unwrap();
    /// assert_eq!(ring.distance(Cursor::new(3, 10), Cursor::new(3, 60)), Ok(50));
    /// assert_eq!(ring.distance(Cursor::new(3, 90), Cursor::new(4, 5)), Ok(15));
    /// assert_eq!(ring.distance(Cursor::new(3, 40), Cursor::new(4, 40)), Ok(100)); // a whole ring
    /// // Backwards, or more than a ring ahead: errors.
    /// assert!(ring.distance(Cursor::new(3, 60), Cursor::new(3, 10)).is_err());
    /// assert!(ring.distance(Cursor::new(3, 40), Cursor::new(4, 41)).is_err());
    /// ```
    pub fn distance(self, from: Cursor, to: Cursor) -> Result<u32, CursorError> {
        self.check(from)?;
        self.check(to)?;
        let not_ahead = CursorError::NotAhead { from, to };
        if to.wrap == from.wrap {
            to.count.checked_sub(from.count).ok_or(not_ahead)
        } else if to.wrap == from.wrap.wrapping_add(1) {
            // One turn ahead: at most a whole ring, reached when to.count == from.count.
            if to.count <= from.count {
                Ok(self.0 - from.count + to.count)
            } else {
                Err(not_ahead)
            }
        } else {
            Err(not_ahead)
        }
    }

    /// Bytes written by the producer and not yet consumed: `distance(cons, prod)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::{Cursor, RingSize};
    ///
    /// let ring = RingSize::new(100).unwrap();
    /// let (cons, prod) = (Cursor::new(0, 80), Cursor::new(1, 20));
    /// assert_eq!(ring.used(cons, prod), Ok(40));
    /// assert_eq!(ring.used(prod, prod), Ok(0)); // empty
    /// ```
    pub fn used(self, cons: Cursor, prod: Cursor) -> Result<u32, CursorError> {
        self.distance(cons, prod)
    }

    /// Bytes the producer may still write: `size - used`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::{Cursor, RingSize};
    ///
    /// let ring = RingSize::new(100).unwrap();
    /// assert_eq!(ring.free(Cursor::new(0, 80), Cursor::new(1, 20)), Ok(60));
    /// assert_eq!(ring.free(Cursor::new(0, 30), Cursor::new(1, 30)), Ok(0)); // full
    /// ```
    pub fn free(self, cons: Cursor, prod: Cursor) -> Result<u32, CursorError> {
        Ok(self.0 - self.used(cons, prod)?)
    }

    /// The contiguous spans `[(offset, len); 2]` that cover `len` bytes starting at `at`, split
    /// where the ring wraps. The second span has length 0 when no wrap occurs.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::proto::cursor::{Cursor, RingSize};
    ///
    /// let ring = RingSize::new(100).unwrap();
    /// // 30 bytes from offset 90: split where the ring wraps.
    /// assert_eq!(ring.spans(Cursor::new(0, 90), 30), Ok([(90, 10), (0, 20)]));
    /// assert_eq!(ring.spans(Cursor::new(0, 10), 30), Ok([(10, 30), (0, 0)]));
    /// assert!(ring.spans(Cursor::new(0, 0), 101).is_err());
    /// ```
    pub fn spans(self, at: Cursor, len: u32) -> Result<[(u32, u32); 2], CursorError> {
        self.check(at)?;
        if len > self.0 {
            return Err(CursorError::StepTooLarge { step: len, size: self.0 });
        }
        let first = len.min(self.0 - at.count);
        Ok([(at.count, first), (0, len - first)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn distance_same_wrap() {
        let r = RingSize::new(100).unwrap();
        assert_eq!(r.distance(Cursor::new(3, 10), Cursor::new(3, 60)), Ok(50));
        assert_eq!(r.distance(Cursor::new(3, 10), Cursor::new(3, 10)), Ok(0));
        assert!(r.distance(Cursor::new(3, 60), Cursor::new(3, 10)).is_err());
    }

    #[test]
    fn distance_across_wrap_and_u16_rollover() {
        let r = RingSize::new(100).unwrap();
        assert_eq!(r.distance(Cursor::new(u16::MAX, 90), Cursor::new(0, 5)), Ok(15));
        assert_eq!(r.distance(Cursor::new(7, 40), Cursor::new(8, 40)), Ok(100));
        assert!(r.distance(Cursor::new(7, 40), Cursor::new(8, 41)).is_err());
        assert!(r.distance(Cursor::new(7, 40), Cursor::new(9, 0)).is_err());
        assert!(r.distance(Cursor::new(7, 40), Cursor::new(6, 0)).is_err());
    }

    #[test]
    fn out_of_range_cursor_is_rejected() {
        let r = RingSize::new(100).unwrap();
        assert_eq!(
            r.distance(Cursor::new(0, 100), Cursor::new(0, 0)),
            Err(CursorError::OutOfRange { cursor: Cursor::new(0, 100), size: 100 })
        );
        assert!(r.free(Cursor::new(0, 0), Cursor::new(0, u32::MAX)).is_err());
        assert!(Cursor::new(0, 100).advance(r, 1).is_err());
        assert!(Cursor::new(0, 0).advance(r, 101).is_err());
    }

    #[test]
    fn ring_size_bounds() {
        assert!(RingSize::new(0).is_none());
        assert!(RingSize::new(RingSize::MAX + 1).is_none());
        assert_eq!(RingSize::new(RingSize::MAX).map(RingSize::get), Some(RingSize::MAX));
    }

    #[test]
    fn spans_split_at_wrap() {
        let r = RingSize::new(100).unwrap();
        assert_eq!(r.spans(Cursor::new(0, 90), 30), Ok([(90, 10), (0, 20)]));
        assert_eq!(r.spans(Cursor::new(0, 10), 30), Ok([(10, 30), (0, 0)]));
        assert_eq!(r.spans(Cursor::new(0, 0), 100), Ok([(0, 100), (0, 0)]));
        assert!(r.spans(Cursor::new(0, 0), 101).is_err());
    }

    /// The model: an absolute byte position `p` (u64) in a ring of `size` bytes is the cursor
    /// `((p / size) mod 2^16, p mod size)`.
    fn model(p: u64, size: u32) -> Cursor {
        let size = u64::from(size);
        Cursor::new(((p / size) % (1 << 16)) as u16, (p % size) as u32)
    }

    proptest! {
        #[test]
        fn distance_matches_model(size in 1u32..=1 << 20, start in 0u64..1 << 40, d in 0u64..=1 << 20) {
            let d = d % (u64::from(size) + 1);
            let r = RingSize::new(size).unwrap();
            let a = model(start, size);
            let b = model(start + d, size);
            prop_assert_eq!(r.distance(a, b), Ok(d as u32));
            prop_assert_eq!(r.used(a, b), Ok(d as u32));
            prop_assert_eq!(r.free(a, b), Ok(size - d as u32));
        }

        #[test]
        fn beyond_one_ring_or_backwards_is_an_error(size in 1u32..=1 << 20, start in 0u64..1 << 40, d in 1u64..=1 << 20) {
            let r = RingSize::new(size).unwrap();
            let a = model(start, size);
            // More than one ring ahead, but less than 2^16 rings (where the wrap counter aliases).
            let ahead = model(start + u64::from(size) + (d % u64::from(size)).max(1), size);
            prop_assert!(r.distance(a, ahead).is_err());
            // Backwards by 1 ..= size - 1 bytes.
            if d < u64::from(size) && start >= d {
                let behind = model(start - d, size);
                prop_assert!(r.distance(a, behind).is_err());
            }
        }

        #[test]
        fn advance_matches_model(size in 1u32..=1 << 20, start in 0u64..1 << 40, n in 0u32..=1 << 20) {
            let n = n % (size + 1);
            let r = RingSize::new(size).unwrap();
            prop_assert_eq!(model(start, size).advance(r, n), Ok(model(start + u64::from(n), size)));
        }

        #[test]
        fn arbitrary_cursors_never_panic(size in any::<u32>(), a in any::<(u16, u32)>(), b in any::<(u16, u32)>(), n in any::<u32>()) {
            if let Some(r) = RingSize::new(size) {
                let (a, b) = (Cursor::new(a.0, a.1), Cursor::new(b.0, b.1));
                if let Ok(d) = r.distance(a, b) {
                    prop_assert!(d <= r.get());
                }
                if let Ok(f) = r.free(a, b) {
                    prop_assert!(f <= r.get());
                }
                if let Ok(c) = a.advance(r, n) {
                    prop_assert!(c.count < r.get());
                }
                if let Ok([(o1, l1), (o2, l2)]) = r.spans(a, n) {
                    prop_assert!(u64::from(o1) + u64::from(l1) <= u64::from(r.get()));
                    prop_assert!(u64::from(o2) + u64::from(l2) <= u64::from(r.get()));
                    prop_assert_eq!(l1 + l2, n);
                }
            }
        }
    }
}
