//! RMB memory on SMC-D, end to end: autotuning (rings grow within the budget and give their
//! pages back), the memory cap (connections beyond it stay TCP), aborts that return their
//! slots, and adaptive polling's liveness. Each test has a context of its own, so its budget
//! and counters are its own while the others run.

use std::time::Duration;

use smc_tokio::config::ShmConfig;
use smc_tokio::{Context, DeclineReason, FallbackReason, Side, SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, smc_pair_in, spawn_echo, Rng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The resident size of shared memory is a fact of the process, not of a context: the test that
/// measures it runs alone (write), every other test that maps regions holds a read guard.
static RESIDENT: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

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

fn growing() -> ShmConfig {
    ShmConfig::default().rmb_size(16 << 10).rmb_max(256 << 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rings_grow_within_the_budget_and_give_memory_back() {
    let _alone = RESIDENT.write().await;
    let ctx = Context::new();
    let (mut c, mut s) = bounded(10, smc_pair_in(&ctx, growing())).await;
    // Two 16 KiB rings (one per side).
    assert_eq!(ctx.rmb_memory_in_use(), 2 * (16 << 10));
    let data = Rng::new(1).bytes(4 << 20);
    bounded(30, stream(&mut c, &mut s, &data)).await;
    // 16 -> 32 -> 64 -> 128 -> 256 KiB: four steps, no more (the cap).
    assert_eq!(ctx.stats().rmb_grown, 4, "the client's ring doubled up to the cap");
    assert_eq!(ctx.rmb_memory_in_use(), (256 << 10) + (16 << 10));
    // The other direction grows on its own.
    bounded(30, stream(&mut s, &mut c, &data)).await;
    assert_eq!(ctx.stats().rmb_grown, 8);
    assert_eq!(ctx.rmb_memory_in_use(), 2 * (256 << 10));
    // Nothing in this test binary uses the default context: its budget saw none of it.
    assert_eq!(Context::global().rmb_memory_in_use(), 0, "the default context is apart");
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
        while ctx.rmb_memory_in_use() != 0 {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_with_no_room_to_grow_keeps_rings_at_their_first_size() {
    let _shared = RESIDENT.read().await;
    let ctx = Context::new();
    let (mut c, mut s) = bounded(10, smc_pair_in(&ctx, growing())).await;
    ctx.set_rmb_memory_cap(ctx.rmb_memory_in_use());
    let data = Rng::new(2).bytes(1 << 20);
    bounded(30, stream(&mut c, &mut s, &data)).await;
    assert_eq!(ctx.stats().rmb_grown, 0, "no growth beyond the budget");
    assert_eq!(ctx.rmb_memory_in_use(), 2 * (16 << 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_rings_never_grow() {
    let _shared = RESIDENT.read().await;
    let ctx = Context::new();
    // `rmb_max` at or below `rmb_size`.
    let (mut c, mut s) = bounded(10, smc_pair_in(&ctx, ShmConfig::default().rmb_size(16 << 10).rmb_max(0))).await;
    let data = Rng::new(3).bytes(1 << 20);
    bounded(30, stream(&mut c, &mut s, &data)).await;
    assert_eq!(ctx.stats().rmb_grown, 0);
    assert_eq!(ctx.rmb_memory_in_use(), 2 * (16 << 10));
}

#[tokio::test]
async fn beyond_the_rmb_memory_cap_connections_are_declined_and_served_as_tcp() {
    let _shared = RESIDENT.read().await;
    let ctx = Context::new();
    let rmb = 64 << 10;
    let cfg = ShmConfig::default().rmb_size(rmb);
    let l = SmcListener::builder().context(&ctx).shm(cfg.clone()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);
    // Room for exactly one connection: its client RMB and its server RMB.
    ctx.set_rmb_memory_cap(2 * u64::from(rmb));
    let builder = SmcStream::builder().context(&ctx).shm(cfg);
    let connect = || builder.connect(addr);
    let first = bounded(10, connect()).await.unwrap();
    assert_eq!(first.transport(), Transport::SmcD);
    assert_eq!(ctx.rmb_memory_in_use(), 2 * u64::from(rmb));
    let second = bounded(10, connect()).await.unwrap();
    assert_eq!(
        second.transport(),
        Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::OutOfMemory, by: Side::Peer })
    );
    bounded(10, echo_check(second, b"served as tcp", 4, 1)).await;
    bounded(10, echo_check(first, b"still smc", 4, 2)).await;
    // Both sides closed: the memory comes back, and with it room for another connection.
    wait_for_memory(&ctx, 0).await;
    let third = bounded(10, connect()).await.unwrap();
    assert_eq!(third.transport(), Transport::SmcD);
}

/// An abort (a stream dropped with unread data) is answered, so both sides give their ring
/// slots back: nothing leaks, and no slot is reused while the peer could still read it.
#[tokio::test]
async fn aborted_connections_return_their_memory() {
    let _shared = RESIDENT.read().await;
    let ctx = Context::new();
    let l = SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(s); // unread bytes remain: an abort
    });
    let mut c = bounded(10, SmcStream::builder().context(&ctx).connect(addr)).await.unwrap();
    assert_eq!(c.transport(), Transport::SmcD);
    assert!(ctx.rmb_memory_in_use() > 0);
    c.write_all(b"0123456789").await.unwrap();
    let mut b = [0u8; 4];
    let err = bounded(10, c.read(&mut b)).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    server.await.unwrap();
    drop(c);
    wait_for_memory(&ctx, 0).await;
}

async fn wait_for_memory(ctx: &Context, bytes: u64) {
    let t = std::time::Instant::now();
    while ctx.rmb_memory_in_use() != bytes {
        assert!(t.elapsed() < Duration::from_secs(5), "ring memory in use: {}", ctx.rmb_memory_in_use());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Adaptive polling's liveness: a reader that polled (short round trips) and then sleeps
/// through a pause must still be woken by the peer's next message (the driver arms the
/// doorbell again), with polling on (two budgets) and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_readers_that_fall_asleep_are_woken() {
    let _shared = RESIDENT.read().await;
    let ctx = Context::new();
    for budget in [Duration::from_micros(50), Duration::from_millis(5), Duration::ZERO] {
        let (mut c, mut s) = bounded(10, smc_pair_in(&ctx, ShmConfig::default().adaptive_poll(budget))).await;
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

/// Group polling's liveness: on a current-thread runtime, a link group's driver that
/// dispatched work keeps looking for the next with its doorbell disarmed; after a pause longer
/// than its window it must have armed the doorbell again, so the peer's next message wakes it.
/// Sixteen connections on one group keep its driver busy, then all of them pause, three times.
#[tokio::test(flavor = "current_thread")]
async fn a_polling_group_that_falls_asleep_is_woken() {
    let _shared = RESIDENT.read().await;
    let ctx = Context::new();
    for budget in [Duration::from_micros(50), Duration::from_millis(5)] {
        let shm = ShmConfig::default().adaptive_poll(budget);
        let l = SmcListener::builder().context(&ctx).shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let echo = spawn_echo(l);
        let builder = SmcStream::builder().context(&ctx).shm(shm);
        let mut clients = Vec::new();
        for _ in 0..16 {
            let c = bounded(10, builder.connect(addr)).await.unwrap();
            assert_eq!(c.transport(), Transport::SmcD);
            clients.push(c);
        }
        for round in 0..3u8 {
            let rounds = clients.iter_mut().enumerate().map(|(k, c)| async move {
                for i in 0..100u8 {
                    let msg = [i ^ round ^ k as u8; 14];
                    c.write_all(&msg).await.unwrap();
                    let mut b = [0u8; 14];
                    c.read_exact(&mut b).await.unwrap();
                    assert_eq!(b, msg);
                }
            });
            bounded(10, futures::future::join_all(rounds)).await;
            // Longer than either window: the driver arms its doorbell and sleeps.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        drop(clients);
        echo.abort();
    }
}
