//! RDMA link setup runs on one thread for the process, one step at a time, and any host may
//! send a Proposal that names RDMA. Handshakes waiting for that thread hold at most half of a
//! listener's handshake slots, each for at most its handshake bound, and a client's connect
//! waits for its look-ups there no longer than its own bound. Here the setup thread is held (as
//! a queue of slow setups would hold it) and the Proposals come in-band from raw TCP clients
//! on another host (a network namespace). Its own test binary:
//! holding the process's setup thread would stall the RDMA look-ups of tests running beside it.
#![cfg(feature = "rdma")]

use std::time::{Duration, Instant};

use smc_tokio::proto::clc::{self, ClcMessage, Decline, DeclineReason, Proposal, RdmaOffer, Secret};
use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::bounded;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A whole Proposal naming RDMA only, as a remote host's client sends it in-band.
fn rdma_proposal(n: u8) -> Vec<u8> {
    let rdma = RdmaOffer { gid: [n; 16], port: 1, mtu: 1024, qpn: 0, link_group: 0 };
    ClcMessage::Proposal(Proposal { secret: Secret([n; 16]), rmb_size: 64 << 10, shm: None, rdma: Some(rdma) })
        .encode()
        .unwrap()
}

/// Reads the listener's answer to a Proposal: a Decline, whose reason is returned.
async fn read_decline(c: &mut TcpStream) -> DeclineReason {
    let mut buf = vec![0u8; clc::CLC_HEADER_LEN];
    c.read_exact(&mut buf).await.unwrap();
    let total = u16::from_be_bytes([buf[6], buf[7]]) as usize;
    buf.resize(total, 0);
    c.read_exact(&mut buf[clc::CLC_HEADER_LEN..]).await.unwrap();
    match clc::decode(&buf).unwrap() {
        clc::Decoded::Message(ClcMessage::Decline(Decline { reason, .. }), _) => reason,
        other => panic!("expected a decline, got {other:?}"),
    }
}

/// A connection to `addr` from `host`.
fn from(host: &tests::OtherHost, addr: std::net::SocketAddr) -> TcpStream {
    let c = host.connect(addr).unwrap();
    c.set_nonblocking(true).unwrap();
    TcpStream::from_std(c).unwrap()
}

async fn wait_pending(l: &SmcListener, n: usize) {
    let t = Instant::now();
    while l.pending_handshakes() != n {
        assert!(t.elapsed() < Duration::from_secs(10), "{} handshakes pending, expected {n}", l.pending_handshakes());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_waiting_for_rdma_setup_hold_half_the_slots_for_their_bound_at_most() {
    const BOUND: Duration = Duration::from_secs(3);
    if !tests::require_root("handshakes_waiting_for_rdma_setup_hold_half_the_slots_for_their_bound_at_most") {
        return;
    }
    // The Proposals come from another host: a listener takes in-band ones only from there.
    let other = tests::OtherHost::start();
    let held = smc_tokio::faults::hold_rdma_setup();

    // A client's connect waits for the look-ups it needs (the verbs library and devices, its
    // port) at most its handshake bound, then goes on without RDMA: here the same-host
    // listener's door gives it shared memory.
    let near = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let near_addr = near.local_addr().unwrap();
    let accepted = tokio::spawn(async move { near.accept().await.map(|(s, _)| s.transport()) });
    let c = bounded(30, SmcStream::builder().handshake_timeout(Duration::from_millis(300)).connect(near_addr))
        .await
        .unwrap();
    assert_eq!(c.transport(), Transport::SmcD, "a client while the setup thread is held");
    assert_eq!(bounded(10, accepted).await.unwrap().unwrap(), Transport::SmcD);
    drop(c);

    // No look-up of the listener's address has answered (the thread is held), so it looks
    // for in-band Proposals.
    let l = SmcListener::builder()
        .max_pending_handshakes(4)
        .handshake_timeout(BOUND)
        .bind(std::net::SocketAddr::new(other.here, 0))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let l = std::sync::Arc::new(l);
    // Each connection echoes what it reads, and reports its transport.
    let (tx, mut transports) = tokio::sync::mpsc::unbounded_channel();
    let server = {
        let l = l.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = tx.send(s.transport());
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        })
    };

    // Two Proposals wait for the setup thread: half the slots.
    let mut waiting = Vec::new();
    for n in 1..=2u8 {
        let mut c = from(&other, addr);
        c.write_all(&rdma_proposal(n)).await.unwrap();
        wait_pending(&l, n.into()).await;
        waiting.push(c);
    }
    // A third is declined at once as congested, while the two still wait.
    let mut third = from(&other, addr);
    third.write_all(&rdma_proposal(3)).await.unwrap();
    assert_eq!(bounded(10, read_decline(&mut third)).await, DeclineReason::HandshakeCongested);
    // (Its slot goes once its answer is flushed: waited for, not read at once.)
    wait_pending(&l, 2).await;
    // A same-host client takes one of the slots left, and gets shared memory. (It proposes no
    // RDMA, so it does not wait for look-ups the thread holds up.)
    let no_rdma = smc_tokio::config::RdmaConfig::default().enabled(false);
    let mut door = bounded(10, SmcStream::builder().rdma(no_rdma).connect(addr)).await.unwrap();
    assert_eq!(door.transport(), Transport::SmcD, "a same-host client while rdma setup waits");
    wait_pending(&l, 2).await;

    // The two waiting are declined within their bound, the thread still held, and go on as
    // TCP with their bytes; so does the third.
    for (i, c) in waiting.iter_mut().enumerate() {
        assert_eq!(
            bounded(BOUND.as_secs() * 4, read_decline(c)).await,
            DeclineReason::HandshakeCongested,
            "waiting proposal {i}"
        );
    }
    wait_pending(&l, 0).await;
    for c in waiting.iter_mut().chain([&mut third]) {
        c.write_all(b"after").await.unwrap();
        let mut got = [0u8; 5];
        bounded(10, c.read_exact(&mut got)).await.unwrap();
        assert_eq!(&got, b"after");
    }
    door.write_all(b"smc").await.unwrap();
    let mut got = [0u8; 3];
    bounded(10, door.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"smc");
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(bounded(10, transports.recv()).await.unwrap());
    }
    assert_eq!(seen.iter().filter(|t| matches!(t, Transport::Tcp(_))).count(), 3, "{seen:?}");
    drop(held);
    server.abort();
    drop(other);
}
