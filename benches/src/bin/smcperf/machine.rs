//! The machine's own limits, measured in the same run as the transports so that every figure is
//! also a ratio to what the hardware can do at that moment (this VM drifts by 2x within an
//! hour): the round trip of one cache line between two CPUs (an atomic ping-pong, the floor
//! under any shared-memory round trip), and what one CPU copies per second (the ceiling of a
//! stream that copies each byte once on each side).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::report::median;

/// What the machine did during this run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// One round trip of a cache line between two threads on two CPUs, in microseconds.
    pub(crate) pingpong_us: f64,
    /// Bytes per second one CPU copies with `copy_from_slice`, 64 KiB at a time (the copy
    /// stays in the caches).
    pub(crate) memcpy_64k: f64,
    /// The same, 16 MiB at a time (the copy goes through memory).
    pub(crate) memcpy_16m: f64,
}

/// Round trips per batch of the ping-pong, and batches (the median batch is reported). 20 000
/// round trips take 3-6 ms on the development VM at its usual 0.15-0.3 us.
const PINGPONG_ROUND_TRIPS: u64 = 20_000;
const PINGPONG_BATCHES: usize = 9;

/// How long each copy batch runs, and batches: 9 x 20 ms keeps the whole measurement near
/// 0.5 s, a small share of the default 25 s run.
const MEMCPY_BATCH: Duration = Duration::from_millis(20);
const MEMCPY_BATCHES: usize = 9;

/// A counter alone on its cache line, so the ping-pong moves one line and nothing else.
#[repr(align(128))]
struct Line(AtomicU64);

/// Measures the limits. `pin` puts the ping-pong's two threads on CPUs 0 and 1 (as `--pin` does
/// for the transports); otherwise the scheduler places them.
pub(crate) fn measure(pin: bool) -> Limits {
    Limits { pingpong_us: pingpong(pin), memcpy_64k: memcpy(64 << 10), memcpy_16m: memcpy(16 << 20) }
}

/// The median over batches of one round trip: the initiator stores an odd value and spins
/// until the responder stored the next even one.
fn pingpong(pin: bool) -> f64 {
    let line = Arc::new(Line(AtomicU64::new(0)));
    let total = PINGPONG_ROUND_TRIPS * PINGPONG_BATCHES as u64;
    let responder = {
        let line = line.clone();
        std::thread::spawn(move || {
            if pin {
                super::pin_to(1);
            }
            for i in 0..total {
                // Acquire/Release: each side's store is what the other waits to see; no other
                // data rides on it, so the orderings only keep the loop honest.
                while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    // The initiator runs on a thread of its own too, so that `--pin` does not move the caller.
    let initiator = std::thread::spawn(move || {
        if pin {
            super::pin_to(0);
        }
        let mut batches = Vec::with_capacity(PINGPONG_BATCHES);
        let mut i = 0u64;
        for _ in 0..PINGPONG_BATCHES {
            let start = Instant::now();
            for _ in 0..PINGPONG_ROUND_TRIPS {
                line.0.store(2 * i + 1, Ordering::Release);
                while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                    std::hint::spin_loop();
                }
                i += 1;
            }
            batches.push(start.elapsed().as_secs_f64() * 1e6 / PINGPONG_ROUND_TRIPS as f64);
        }
        median(batches)
    });
    let us = initiator.join().unwrap_or(0.0);
    let _ = responder.join();
    us
}

/// The median over batches of one CPU's copy rate, `size` bytes per copy.
fn memcpy(size: usize) -> f64 {
    let src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    // Touch both once so page faults are not timed.
    dst.copy_from_slice(&src);
    let mut batches = Vec::with_capacity(MEMCPY_BATCHES);
    for _ in 0..MEMCPY_BATCHES {
        let start = Instant::now();
        let mut copies = 0u64;
        while start.elapsed() < MEMCPY_BATCH {
            black_box(&mut dst).copy_from_slice(black_box(&src));
            copies += 1;
        }
        batches.push(copies as f64 * size as f64 / start.elapsed().as_secs_f64());
    }
    black_box(&dst);
    median(batches)
}

impl Limits {
    /// One line for the table's header.
    pub(crate) fn describe(&self) -> String {
        format!(
            "machine (same run): atomic ping-pong round trip {:.2} us, memcpy on one cpu {:.1} GB/s (64 KiB), {:.1} GB/s (16 MiB)",
            self.pingpong_us,
            self.memcpy_64k / 1e9,
            self.memcpy_16m / 1e9
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_are_measured_not_made_up() {
        let l = measure(false);
        // A round trip takes some time and far less than a scheduler tick per hop; a copy moves
        // bytes at some finite rate. (No bound on speed: this is not a timing test.)
        assert!(l.pingpong_us > 0.0 && l.pingpong_us.is_finite(), "{l:?}");
        assert!(l.memcpy_64k > 0.0 && l.memcpy_64k.is_finite(), "{l:?}");
        assert!(l.memcpy_16m > 0.0 && l.memcpy_16m.is_finite(), "{l:?}");
    }
}
