//! SMC-R where there is no RDMA (this host: no rdma_rxe, and in CI often no libibverbs): with
//! the `rdma` feature built in and shared memory off, connections fall back to TCP with every
//! byte, and the stats say why RDMA was not offered. The RDMA paths themselves run in the
//! soft-RoCE guests (`tests/rdma-vm/run.sh`).
#![cfg(feature = "rdma")]

use smc_tokio::config::{RdmaConfig, ShmConfig};
use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::bounded;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One echo through a listener with shared memory off, from a client with `rdma` (and shared
/// memory on or off: with it on, the client registers at the door and proposes, so its RDMA
/// offer is attempted even when RDMA is switched off).
async fn echo_once(rdma: RdmaConfig, client_shm: bool) -> Transport {
    let l = SmcListener::builder().shm(ShmConfig::default().enabled(false)).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; 100_000];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf).await.unwrap();
        s.transport()
    });
    let mut c =
        SmcStream::builder().shm(ShmConfig::default().enabled(client_shm)).rdma(rdma).connect(addr).await.unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
    c.write_all(&data).await.unwrap();
    let mut back = vec![0u8; data.len()];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(back, data, "every byte comes back over the fallback");
    let server_t = bounded(10, server).await.unwrap();
    assert!(!server_t.is_smc(), "server side is tcp too: {server_t}");
    c.transport()
}

#[tokio::test]
async fn without_a_device_connections_fall_back_to_tcp_and_count_why() {
    let before = smc_tokio::stats().rdma_unavailable;
    let t = bounded(30, echo_once(RdmaConfig::default(), false)).await;
    assert!(matches!(t, Transport::Tcp(_)), "no rdma device here, so tcp: {t}");
    let after = smc_tokio::stats().rdma_unavailable;
    // No library, no device, or (on a host with devices) no port for 127.0.0.1: exactly one
    // of the three is counted.
    let grew: Vec<usize> = (1..4).filter(|&i| after[i] > before[i]).collect();
    assert_eq!(grew.len(), 1, "one reason is counted: {before:?} -> {after:?}");
    // The diagnostics tell the same story as the counter.
    let described = smc_tokio::rdma::describe_devices();
    match (grew[0], &described) {
        (1, Err(e)) => assert!(e.contains("libibverbs"), "no library, described as: {e}"),
        (2, Err(e)) => assert_eq!(e, "no rdma device", "no device, described as: {e}"),
        (3, Ok(ports)) => {
            assert!(!ports.is_empty(), "devices exist, so ports are listed");
            for p in ports {
                let rest = p.split_once(" port ").map(|(_, r)| r).unwrap_or_else(|| panic!("not a port line: {p}"));
                assert!(rest.split_whitespace().next().is_some_and(|n| n.parse::<u8>().is_ok()), "{p}");
                assert!(!p.contains("::ffff:127.0.0.1"), "a port serving 127.0.0.1 was not used: {p}");
            }
        }
        (reason, d) => panic!("counted reason {reason}, but the diagnostics say {d:?}"),
    }
}

#[tokio::test]
async fn rdma_switched_off_is_counted_as_off() {
    let before = smc_tokio::stats().rdma_unavailable[0];
    let t = bounded(30, echo_once(RdmaConfig::default().enabled(false), true)).await;
    assert!(matches!(t, Transport::Tcp(_)), "{t}");
    assert!(smc_tokio::stats().rdma_unavailable[0] > before);
}
