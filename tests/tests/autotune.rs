//! RMB autotuning and adaptive polling on SMC-D, end to end. Its own test binary (process):
//! it reads the process-wide RMB budget and growth counter, which other tests' connections
//! would move.

use std::time::Duration;

use smc_tokio::config::{self, ShmConfig};
use smc_tokio::SmcStream;
use tests::{bounded, smc_pair, Rng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Streams `data` from `w` to `r` (the reader reads in small pieces, so the writer fills the
/// ring) and checks every byte.
async fn stream(w: &mut SmcStream, r: &mut SmcStream, data: &[u8]) {
    let (wrote, got) = tokio::join!(w.write_all(data), async {
        let mut got = Vec::with_capacity(data.len());
        let mut buf = vec![0u8; 3000];
        while got.len() < data.len() {
            let n = r.read(&mut buf).await.unwrap();
            assert!(n > 0, "early EOF");
            got.extend_from_slice(&buf[..n]);
        }
        got
    });
    wrote.unwrap();
    assert!(got == data, "bytes differ");
}

/// Resident memory of this process's shared-memory regions (both link ends are here), in KiB:
/// the `Rss` of every mapping of a `memfd:smc-tokio-region` in `/proc/self/smaps`.
fn region_rss_kib() -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut total = 0;
    let mut in_region = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if !first.ends_with(':') {
            // A mapping's header line: `start-end perms offset dev inode path`.
            in_region = line.contains("memfd:smc-tokio-region");
        } else if let Some(kib) = line.strip_prefix("Rss:") {
            if in_region {
                total += kib.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap();
            }
        }
    }
    total
}

// One test function: its parts read the process-wide budget, which parallel tests would move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autotuning_and_adaptive_polling() {
    rings_grow_within_the_budget_and_give_memory_back().await;
    polling_readers_that_fall_asleep_are_woken().await;
}

async fn rings_grow_within_the_budget_and_give_memory_back() {
    let base = config::rmb_memory_in_use();
    let grown_before = smc_tokio::stats().rmb_grown;
    let shm = ShmConfig::default().rmb_size(16 << 10).rmb_max(256 << 10);
    let (mut c, mut s) = bounded(10, smc_pair(shm.clone())).await;
    // Two 16 KiB rings (one per side).
    assert_eq!(config::rmb_memory_in_use(), base + 2 * (16 << 10));
    let data = Rng::new(1).bytes(4 << 20);
    bounded(30, stream(&mut c, &mut s, &data)).await;
    let grown = smc_tokio::stats().rmb_grown - grown_before;
    // 16 -> 32 -> 64 -> 128 -> 256 KiB: four steps, no more (the cap).
    assert_eq!(grown, 4, "the client's ring doubled up to the cap");
    assert_eq!(config::rmb_memory_in_use(), base + (256 << 10) + (16 << 10));
    // The other direction grows on its own.
    bounded(30, stream(&mut s, &mut c, &data)).await;
    assert_eq!(smc_tokio::stats().rmb_grown - grown_before, 8);
    assert_eq!(config::rmb_memory_in_use(), base + 2 * (256 << 10));
    // Small request/response traffic afterwards still works in the grown rings.
    for i in 0..50u8 {
        c.write_all(&[i; 10]).await.unwrap();
        let mut b = [0u8; 10];
        bounded(5, s.read_exact(&mut b)).await.unwrap();
        assert_eq!(b, [i; 10]);
    }
    let resident_grown = region_rss_kib();
    drop((c, s));
    // Both slots are freed once both sides closed: the budget is whole again.
    bounded(10, async {
        while config::rmb_memory_in_use() != base {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // And the pages the rings grew into are given back for real (the link group lives on):
    // at least the 2 x 240 KiB they grew by, here where both regions are mapped twice (by
    // their writer and by their reader).
    let resident_freed = region_rss_kib();
    eprintln!("regions resident: {resident_grown} KiB with grown rings, {resident_freed} KiB after they were freed");
    assert!(resident_freed + 2 * 240 <= resident_grown, "{resident_grown} KiB -> {resident_freed} KiB");

    // A budget with no room to grow: the ring stays at its first size and every byte arrives.
    let (mut c, mut s) = bounded(10, smc_pair(shm)).await;
    config::set_rmb_memory_cap(config::rmb_memory_in_use());
    let grown_before = smc_tokio::stats().rmb_grown;
    bounded(30, stream(&mut c, &mut s, &data[..1 << 20])).await;
    assert_eq!(smc_tokio::stats().rmb_grown, grown_before, "no growth beyond the budget");
    config::set_rmb_memory_cap(config::DEFAULT_RMB_MEMORY_CAP);
    drop((c, s));

    // Fixed rings (`rmb_max` at or below `rmb_size`) never grow.
    let (mut c, mut s) = bounded(10, smc_pair(ShmConfig::default().rmb_size(16 << 10).rmb_max(0))).await;
    let grown_before = smc_tokio::stats().rmb_grown;
    bounded(30, stream(&mut c, &mut s, &data[..1 << 20])).await;
    assert_eq!(smc_tokio::stats().rmb_grown, grown_before);
}

/// Adaptive polling's liveness: a reader that polled (short round trips) and then sleeps
/// through a pause must still be woken by the peer's next message (the driver arms the
/// doorbell again), with polling on (two budgets) and off.
async fn polling_readers_that_fall_asleep_are_woken() {
    for budget in [Duration::from_micros(50), Duration::from_millis(5), Duration::ZERO] {
        let (mut c, mut s) = bounded(10, smc_pair(ShmConfig::default().adaptive_poll(budget))).await;
        let server = tokio::spawn(async move {
            let mut b = [0u8; 64];
            loop {
                let n = s.read(&mut b).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&b[..n]).await.unwrap();
            }
        });
        for round in 0..3u8 {
            // Short round trips: the connection polls.
            for i in 0..200u8 {
                c.write_all(&[i ^ round; 14]).await.unwrap();
                let mut b = [0u8; 14];
                bounded(5, c.read_exact(&mut b)).await.unwrap();
                assert_eq!(b, [i ^ round; 14]);
            }
            // A pause longer than any budget: both readers give up polling and sleep.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        c.shutdown().await.unwrap();
        bounded(5, server).await.unwrap();
    }
}
