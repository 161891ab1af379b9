//! Handshake hostility: trickled proposals, proposals cut off at every byte, clients that never
//! send, from clients that registered at the door (so the listener runs a handshake for them)
//! and from ones that did not (so their bytes are the application's). The listener frees every
//! slot, closes what it must, and keeps serving.

#[path = "support/hostile.rs"]
mod hostile;

use std::time::{Duration, Instant};

use smc_tokio::proto::clc::{ClcMessage, Proposal, Token};
use smc_tokio::{FallbackReason, SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn proposal() -> Vec<u8> {
    ClcMessage::Proposal(Proposal { token: Token([1; 16]), rmb_size: 0, shm: None, rdma: None }).encode().unwrap()
}

async fn wait_idle(l: &SmcListener) {
    let t = Instant::now();
    while l.pending_handshakes() != 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "{} handshakes still pending", l.pending_handshakes());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_trickled_proposal_times_out_and_frees_its_slot() {
    let l = std::sync::Arc::new(
        SmcListener::builder().handshake_timeout(Duration::from_millis(200)).bind("127.0.0.1:0").await.unwrap(),
    );
    let addr = l.local_addr().unwrap();
    let acceptor = {
        let l = l.clone();
        tokio::spawn(async move { l.accept().await })
    };
    // A registered client: the listener expects its proposal, with the handshake timeout.
    let (mut c, verdict) = hostile::register_and_connect(addr, 1).await.unwrap();
    assert_eq!(verdict, hostile::DOOR_MATCHED);
    let p = proposal();
    let started = Instant::now();
    let mut closed = false;
    for b in &p {
        if c.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server gave up on the handshake (timeout) and closed the connection without a byte:
    // the read ends (EOF or reset) instead of hanging, and nothing came back.
    let mut rest = Vec::new();
    let _ = bounded(10, c.read_to_end(&mut rest)).await;
    assert!(rest.is_empty(), "no reply to a trickled proposal (writes failed early: {closed})");
    assert!(started.elapsed() >= Duration::from_millis(200));
    wait_idle(&l).await;
    assert!(!acceptor.is_finished(), "the trickled connection is never handed out");
    acceptor.abort();
}

#[tokio::test]
async fn a_proposal_cut_off_at_every_byte_never_hurts_the_listener() {
    let l = SmcListener::builder().handshake_timeout(Duration::from_millis(300)).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let l = std::sync::Arc::new(l);
    {
        let l = l.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut rd, mut wr) = s.into_split();
                    let _ = tokio::io::copy(&mut rd, &mut wr).await;
                });
            }
        });
    }
    let p = proposal();
    for k in 1..p.len() {
        // Unregistered: the bytes are handed to the application (here, an echo) as they are.
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&p[..k]).await.unwrap();
        drop(c); // closed mid-proposal
                 // Registered: the handshake sees the end of the stream mid-message.
        let (mut c, verdict) = hostile::register_and_connect(addr, 2).await.unwrap();
        assert_eq!(verdict, hostile::DOOR_MATCHED);
        c.write_all(&p[..k]).await.unwrap();
        drop(c);
    }
    wait_idle(&l).await;
    // Still serving, both kinds of client.
    let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD);
    bounded(10, echo_check(s, b"after the cut-offs", 4, 1)).await;
    let c = TcpStream::connect(addr).await.unwrap();
    bounded(10, echo_check(c, b"plain too", 4, 2)).await;
}

#[tokio::test]
async fn hundreds_of_silent_clients_do_not_stop_the_listener() {
    const PLAIN: usize = 300;
    const REGISTERED: usize = 100;
    let l = SmcListener::builder()
        .peek_timeout(Duration::from_secs(3600))
        .handshake_timeout(Duration::from_millis(300))
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = tx.send(s);
        }
    });
    // Plain silent clients are plain from the start (they did not register): handed out at
    // once, with no peek. Registered silent clients hold a handshake slot until it times out.
    let mut silent = Vec::new();
    for _ in 0..PLAIN {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut registered = Vec::new();
    for i in 0..REGISTERED {
        let (c, verdict) = hostile::register_and_connect(addr, 1000 + i as u64).await.unwrap();
        assert_eq!(verdict, hostile::DOOR_MATCHED);
        registered.push(c);
    }
    // A plain client and an SMC client are served while the registered ones are pending.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"x").await.unwrap();
    let smc = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(smc.transport(), Transport::SmcD);
    let mut kinds = Vec::new();
    while kinds.len() < PLAIN + REGISTERED + 2 {
        let s = bounded(10, rx.recv()).await.unwrap();
        kinds.push(s.transport());
    }
    let count = |t: Transport| kinds.iter().filter(|k| **k == t).count();
    assert_eq!(count(Transport::Tcp(FallbackReason::PeerNoSmc)), PLAIN + 1, "plain clients at once");
    assert_eq!(count(Transport::SmcD), 1);
    let timed_out = Transport::Tcp(FallbackReason::Declined {
        reason: smc_tokio::DeclineReason::Timeout,
        by: smc_tokio::Side::Local,
    });
    assert_eq!(count(timed_out), REGISTERED, "silent registered clients handed out as tcp after the timeout");
    drop((silent, registered));
}

#[tokio::test]
async fn a_tight_descriptor_limit_gives_clear_errors_or_tcp_never_a_panic() {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tests::spawn_echo(l);
    let run = |spare: &'static str| {
        let addr = addr.to_string();
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
                .args(["lowfd", &addr, spare])
                .output()
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
            assert!(text.contains("DONE") && !text.contains("panicked"), "{text}");
            // Every failed connect names its cause (EMFILE).
            for e in text.lines().filter(|l| l.starts_with("ERR")) {
                assert!(e.contains("os error 24"), "{text}");
            }
            text
        }
    };
    // Room for a link group: the first connections use shared memory, later ones reuse it
    // until no descriptor is left for their TCP socket.
    let text = run("6").await;
    assert!(text.contains("CONN 0 smc-d write_ok=true"), "{text}");
    // No room for a link group: the connection stays on TCP, declined locally, and works.
    let text = run("2").await;
    assert!(text.contains("CONN 0 tcp (declined locally:") && text.contains("write_ok=true"), "{text}");
}
