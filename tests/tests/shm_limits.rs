//! Process-wide shm limits. In a test binary of their own: the cap is per process.

use smc_tokio::config::{rmb_memory_in_use, set_rmb_memory_cap, ShmConfig};
use smc_tokio::{DeclineReason, FallbackReason, Side, SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, spawn_echo};

#[tokio::test]
async fn beyond_the_rmb_memory_cap_connections_are_declined_and_served_as_tcp() {
    let rmb = 64 << 10;
    let cfg = ShmConfig::default().rmb_size(rmb);
    let l = SmcListener::builder().shm(cfg.clone()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);
    // Room for exactly one connection: its client RMB and its server RMB.
    set_rmb_memory_cap(2 * u64::from(rmb));
    let first = bounded(10, SmcStream::builder().shm(cfg.clone()).connect(addr)).await.unwrap();
    assert_eq!(first.transport(), Transport::SmcD);
    assert_eq!(rmb_memory_in_use(), 2 * u64::from(rmb));
    let second = bounded(10, SmcStream::builder().shm(cfg.clone()).connect(addr)).await.unwrap();
    assert_eq!(
        second.transport(),
        Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::OutOfMemory, by: Side::Peer })
    );
    bounded(10, echo_check(second, b"served as tcp", 4, 1)).await;
    bounded(10, echo_check(first, b"still smc", 4, 2)).await;
    // Both sides closed: the memory comes back.
    let t = std::time::Instant::now();
    while rmb_memory_in_use() != 0 {
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "rmb memory not returned: {}", rmb_memory_in_use());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let third = bounded(10, SmcStream::builder().shm(cfg).connect(addr)).await.unwrap();
    assert_eq!(third.transport(), Transport::SmcD);
    drop(third);
    set_rmb_memory_cap(smc_tokio::config::DEFAULT_RMB_MEMORY_CAP);
    aborted_connections_return_their_memory().await;
}

/// An abort (a stream dropped with unread data) is answered, so both sides give their ring
/// slots back: nothing leaks, and no slot is reused while the peer could still read it. Run from
/// the cap test, after it, since both read the process-wide counter.
async fn aborted_connections_return_their_memory() {
    wait_for_memory(0).await;
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut one = [0u8; 1];
        tokio::io::AsyncReadExt::read_exact(&mut s, &mut one).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(s); // unread bytes remain: an abort
    });
    let mut c = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(c.transport(), Transport::SmcD);
    tokio::io::AsyncWriteExt::write_all(&mut c, b"0123456789").await.unwrap();
    let mut b = [0u8; 4];
    let err = bounded(10, tokio::io::AsyncReadExt::read(&mut c, &mut b)).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    server.await.unwrap();
    drop(c);
    wait_for_memory(0).await;
}

async fn wait_for_memory(bytes: u64) {
    let t = std::time::Instant::now();
    while rmb_memory_in_use() != bytes {
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "ring memory in use: {}", rmb_memory_in_use());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
