//! A storm of short connections against a listener with a small handshake bound. Alone in its
//! test binary: it counts the process's open descriptors.

use std::time::{Duration, Instant};

use smc_tokio::config::ShmConfig;
use smc_tokio::{SmcListener, SmcStream};
use tests::{bounded, open_fds};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_connections_with_sixteen_pending_handshakes() {
    tests::raise_fd_limit();
    const N: usize = 2000;
    let fds_before = open_fds();
    let stats_before = smc_tokio::stats();
    let shm = ShmConfig::default().rmb_size(16 << 10).idle_timeout(Duration::from_millis(200));
    let l = SmcListener::builder()
        .shm(shm.clone())
        .max_pending_handshakes(16)
        .limit_handshake(true)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut served = 0;
        while served < N {
            let (s, _) = l.accept().await.unwrap();
            served += 1;
            tokio::spawn(async move {
                let (mut rd, mut wr) = s.into_split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
            });
        }
        // The listener (and its side-channel acceptor) goes away with the task.
    });
    let builder = SmcStream::builder().shm(shm).max_pending_handshakes(N);
    let mut tasks = Vec::new();
    for i in 0..N {
        let b = builder.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = b.connect(addr).await.unwrap();
            let msg = format!("connection {i} says hello");
            s.write_all(msg.as_bytes()).await.unwrap();
            s.shutdown().await.unwrap();
            let mut back = Vec::new();
            s.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, msg.as_bytes(), "connection {i}");
            s.transport().is_smc()
        }));
    }
    let mut smc = 0;
    for t in tasks {
        if bounded(120, t).await.unwrap() {
            smc += 1;
        }
    }
    bounded(30, server).await.unwrap();
    let st = smc_tokio::stats();
    let server_total = st.server.total() - stats_before.server.total();
    let server_smc = st.server.smc_d - stats_before.server.smc_d;
    let congested = st.declines_sent[smc_tokio::DeclineReason::HandshakeCongested as usize - 1]
        - stats_before.declines_sent[smc_tokio::DeclineReason::HandshakeCongested as usize - 1];
    // Clients that found the door's queue full did not register: congestion seen locally.
    let door_busy = st.client.fallback_declined_local - stats_before.client.fallback_declined_local;
    let plain_at_server = st.server.fallback_peer_no_smc - stats_before.server.fallback_peer_no_smc;
    eprintln!(
        "storm: {smc} of {N} over smc-d, {congested} declined as congested, {door_busy} found the door full\n{st}"
    );
    assert_eq!(server_total, N as u64, "the server's stats count every connection");
    assert_eq!(server_smc, smc as u64, "both sides agree on which ones used shared memory");
    assert!(smc > 0, "some connections used shared memory");
    assert!(smc < N, "the bound of 16 pending handshakes turned some into tcp");
    // A registration whose port turned out taken at connect (a 4-tuple of an earlier run still
    // in TIME_WAIT) is cancelled and made again with another port; the listener may have
    // declined the first one as congested already, so declines may exceed the tcp connections
    // by as many as were made again.
    let registered = st.door[0] - stats_before.door[0];
    let made_again = registered - (N as u64 - door_busy);
    let tcp = server_total - server_smc;
    assert!(
        tcp <= congested + door_busy && congested + door_busy <= tcp + made_again,
        "every tcp one was congested, at a slot or the door: {tcp} tcp, {congested} + {door_busy} congested, {made_again} registered again"
    );
    assert_eq!(door_busy, plain_at_server, "a client that did not register is a plain client to the server");
    // Every descriptor comes back once the connections are closed and the idle link groups
    // are torn down.
    let t = Instant::now();
    loop {
        let now = open_fds();
        if now <= fds_before {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{} descriptors left open ({now} vs {fds_before})",
            now - fds_before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
