//! The TCP fallback: every path that does not end in SMC ends in a working TCP stream with
//! nothing lost, and the transport says why. Listeners here have shared memory switched off
//! where a test needs a decline from a real `SmcListener`. Plain servers never see a byte of
//! ours unless the client opted in to in-band negotiation (`Policy::Always` here).

use std::time::Duration;

use smc_tokio::config::ShmConfig;
use smc_tokio::proto::clc::{
    decode, Accept, ClcMessage, Decline, Decoded, LinkInfo, ShmLinkInfo, CLC_HEADER_LEN, CLC_VERSION,
};
use smc_tokio::{DeclineReason, FallbackReason, Policy, Side, SmcError, SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, spawn_echo, Rng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DECLINED_BY_PEER: Transport =
    Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::NoCommonTransport, by: Side::Peer });

/// A listener that declines every proposal with "no common transport".
async fn declining_listener() -> SmcListener {
    SmcListener::builder().shm(ShmConfig::default().enabled(false)).bind("127.0.0.1:0").await.unwrap()
}

#[tokio::test]
async fn smc_to_smc_echo_random_sizes_through_fallback() {
    let listener = declining_listener().await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        assert_eq!(
            conn.transport(),
            Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::NoCommonTransport, by: Side::Local })
        );
        let (mut rd, mut wr) = conn.into_split();
        tokio::io::copy(&mut rd, &mut wr).await.unwrap();
    });
    let stream = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(stream.transport(), DECLINED_BY_PEER);
    let data = Rng::new(1).bytes(8 << 20);
    bounded(60, echo_check(stream, &data, 1 << 20, 7)).await;
    bounded(10, server).await.unwrap();
}

#[tokio::test]
async fn many_concurrent_connections_each_intact() {
    let listener = declining_listener().await;
    let addr = listener.local_addr().unwrap();
    spawn_echo(listener);
    let mut tasks = Vec::new();
    for i in 0..50u64 {
        tasks.push(tokio::spawn(async move {
            let s = SmcStream::connect(addr).await.unwrap();
            assert_eq!(s.transport(), DECLINED_BY_PEER);
            let data = Rng::new(i).bytes(64 << 10);
            echo_check(s, &data, 4096, i).await;
        }));
    }
    for t in tasks {
        bounded(30, t).await.unwrap();
    }
}

#[tokio::test]
async fn plain_client_speaks_first() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        assert_eq!(conn.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
        let (mut rd, mut wr) = conn.into_split();
        tokio::io::copy(&mut rd, &mut wr).await.unwrap();
    });
    let c = TcpStream::connect(addr).await.unwrap();
    let data = Rng::new(2).bytes(1 << 20);
    bounded(30, echo_check(c, &data, 65536, 2)).await;
    server.await.unwrap();
}

#[tokio::test]
async fn plain_client_whose_first_byte_is_the_eyecatchers_first_byte() {
    // 0xE2 alone is not decisive; 0xE2 0x00 is.
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    spawn_echo(listener);
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&[0xE2]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.write_all(&[0x00, 1, 2, 3]).await.unwrap();
    let mut got = [0u8; 5];
    bounded(10, c.read_exact(&mut got)).await.unwrap();
    assert_eq!(got, [0xE2, 0, 1, 2, 3]);
}

#[tokio::test]
async fn plain_client_waits_for_server_to_speak_first() {
    // No peek timer: a plain client is known to be plain when it is accepted (it did not
    // register at the door), so the greeting goes out at once.
    let listener = SmcListener::builder().peek_timeout(Duration::from_secs(3600)).bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        assert_eq!(conn.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
        conn.write_all(b"220 greetings\r\n").await.unwrap();
        let mut buf = [0u8; 6];
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"QUIT\r\n");
    });
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut greeting = [0u8; 15];
    bounded(10, c.read_exact(&mut greeting)).await.unwrap();
    assert_eq!(&greeting, b"220 greetings\r\n");
    c.write_all(b"QUIT\r\n").await.unwrap();
    bounded(10, server).await.unwrap();
}

/// A plain server that records every connection's bytes (as it received them) and either
/// echoes or, `greet`, speaks first and then answers PING with PONG.
async fn recording_plain_server(greet: bool) -> (std::net::SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let rec = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let rec = rec.clone();
            let i = {
                let mut r = rec.lock().unwrap();
                r.push(Vec::new());
                r.len() - 1
            };
            tokio::spawn(async move {
                if greet {
                    c.write_all(b"220 plain server ready\r\n").await.unwrap();
                }
                let mut b = [0u8; 4096];
                loop {
                    let n = match c.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    rec.lock().unwrap()[i].extend_from_slice(&b[..n]);
                    let reply: &[u8] = if greet {
                        if &b[..n] == b"PING" {
                            b"PONG"
                        } else {
                            b""
                        }
                    } else {
                        &b[..n]
                    };
                    if c.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn a_plain_server_sees_exactly_the_applications_bytes_on_one_connection() {
    // Client first (an echo server) and server first (a greeting), to a local address: the
    // client finds no door, proposes nothing, and connects once. (A context of its own: the
    // process's negative cache may hold this port from another test, which says so instead.)
    let ctx = smc_tokio::Context::new();
    let builder = SmcStream::builder().context(&ctx);
    let (addr, seen) = recording_plain_server(false).await;
    let s = bounded(10, builder.connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::NotProposed));
    let data = Rng::new(3).bytes(64 << 10);
    bounded(30, echo_check(s, &data, 8192, 3)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*seen.lock().unwrap(), vec![data], "one connection, exactly the application's bytes");

    let (addr, seen) = recording_plain_server(true).await;
    let mut s = bounded(10, builder.connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::NotProposed));
    let mut g = [0u8; 24];
    bounded(10, s.read_exact(&mut g)).await.unwrap();
    assert_eq!(&g, b"220 plain server ready\r\n");
    s.write_all(b"PING").await.unwrap();
    let mut p = [0u8; 4];
    bounded(10, s.read_exact(&mut p)).await.unwrap();
    assert_eq!(&p, b"PONG");
    assert_eq!(*seen.lock().unwrap(), vec![b"PING".to_vec()]);
}

#[tokio::test]
async fn smc_client_opted_in_against_plain_echo_server_reconnects_and_caches() {
    // A context of its own: the process's negative cache may hold this port from another
    // test, and the first connection would say so instead of what this one asserts.
    let ctx = smc_tokio::Context::new();
    // An echo server sends our own proposal back: not a valid reply. Only a client that opted
    // in to in-band negotiation sends one.
    let (addr, seen) = recording_plain_server(false).await;
    let b = SmcStream::builder().context(&ctx).policy(Policy::Always);
    let s = bounded(10, b.connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
    let data = Rng::new(3).bytes(256 << 10);
    bounded(30, echo_check(s, &data, 8192, 3)).await;
    // The second connection skips the proposal.
    let s = bounded(10, b.connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::NegativeCache));
    bounded(30, echo_check(s, &data, 8192, 4)).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "the proposal's connection, then two plain ones");
    assert!(seen[0].starts_with(&smc_tokio::proto::clc::CLC_EYECATCHER));
    assert_eq!(seen[1], data);
    // An in-band peer listed by address is opted in the same way.
    let (addr, seen) = recording_plain_server(false).await;
    let peers = "127.0.0.0/8".parse().unwrap();
    let s = bounded(10, SmcStream::builder().context(&ctx).inband_peers(peers).connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
    drop(s);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn smc_client_opted_in_against_plain_server_that_speaks_first() {
    // A context of its own: the process's negative cache may hold this port from another
    // test, and the first connection would say so instead of what this one asserts.
    let ctx = smc_tokio::Context::new();
    let (addr, _) = recording_plain_server(true).await;
    let mut s = bounded(10, SmcStream::builder().context(&ctx).policy(Policy::Always).connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
    // The greeting of the new connection is intact.
    let mut g = [0u8; 24];
    s.read_exact(&mut g).await.unwrap();
    assert_eq!(&g, b"220 plain server ready\r\n");
    s.write_all(b"PING").await.unwrap();
    let mut p = [0u8; 4];
    bounded(10, s.read_exact(&mut p)).await.unwrap();
    assert_eq!(&p, b"PONG");
}

#[tokio::test]
async fn smc_client_opted_in_against_silent_plain_server_times_out_then_reconnects() {
    // A context of its own: the process's negative cache may hold this port from another
    // test, and the first connection would say so instead of what this one asserts.
    let ctx = smc_tokio::Context::new();
    // A server that waits for a full request and never answers a proposal.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut line = Vec::new();
                let mut b = [0u8; 1];
                while c.read_exact(&mut b).await.is_ok() {
                    line.push(b[0]);
                    if line.ends_with(b"\n") {
                        c.write_all(&line).await.unwrap();
                        line.clear();
                    }
                }
            });
        }
    });
    let b = SmcStream::builder().context(&ctx).policy(Policy::Always).handshake_timeout(Duration::from_millis(100));
    // The timeout is remembered from a moment after this one.
    let started = std::time::Instant::now();
    let mut s = bounded(10, b.connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
    s.write_all(b"hello\n").await.unwrap();
    let mut got = [0u8; 6];
    bounded(10, s.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"hello\n");
    // A timeout is not proof of a plain server (an SMC server may be busy): it is remembered
    // briefly (2 s for a first timeout), not for the cache's whole TTL.
    const BACKOFF: Duration = Duration::from_secs(2);
    let s = bounded(10, b.connect(addr)).await.unwrap();
    // "Still remembered" is certain only before the backoff could have ended (a stalled machine
    // may come here later): past it, the connect proposed again, which is what the last step
    // checks (and its timeout doubled the backoff, so that step is done here).
    let late = started.elapsed() >= BACKOFF;
    if late && s.transport() == Transport::Tcp(FallbackReason::PeerNoSmc) {
        return;
    }
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::NegativeCache));
    // The backoff began before this connect did: it is over after this sleep.
    tokio::time::sleep(BACKOFF + Duration::from_millis(100)).await;
    let s = bounded(10, b.connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::PeerNoSmc), "proposed again after the backoff");
}

/// A socket of the application's whose in-band handshake found a plain server: the plain
/// reconnection that follows (on a new socket, the first one carried a Proposal) has the
/// application's options and its bound address.
#[tokio::test]
async fn a_plain_reconnection_keeps_the_applications_socket_options() {
    // A context of its own: the process's negative cache may hold this port from another
    // test, and the first connection would say so instead of what this one asserts.
    let ctx = smc_tokio::Context::new();
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = plain.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = plain.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = c.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let socket = smc_tokio::SmcSocket::new_v4().unwrap();
    socket.set_nodelay(true).unwrap();
    socket.set_keepalive(true).unwrap();
    socket.set_tos_v4(0x20).unwrap();
    socket.bind("127.0.0.9:0".parse().unwrap()).unwrap();
    let b = SmcStream::builder().context(&ctx).policy(Policy::Always).handshake_timeout(Duration::from_millis(100));
    let s = bounded(10, b.connect_socket(socket, addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
    assert!(s.nodelay().unwrap());
    assert_eq!(s.local_addr().unwrap().ip().to_string(), "127.0.0.9");
    let sock = socket2::SockRef::from(&s);
    assert!(sock.keepalive().unwrap());
    assert_eq!(sock.tos_v4().unwrap(), 0x20);
}

#[tokio::test]
async fn never_policy_returns_typed_errors() {
    let listener = declining_listener().await;
    let addr = listener.local_addr().unwrap();
    spawn_echo(listener);
    let err = SmcStream::builder().policy(Policy::Never).connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
    assert_eq!(
        SmcError::from_io(&err),
        Some(&SmcError::FallbackRefused(FallbackReason::Declined {
            reason: DeclineReason::NoCommonTransport,
            by: Side::Peer
        }))
    );

    // Never proposes everywhere (as Always), and fails where it would fall back.
    let (plain, _) = recording_plain_server(false).await;
    let err =
        SmcStream::builder().policy(Policy::Never).negative_cache_ttl(Duration::ZERO).connect(plain).await.unwrap_err();
    assert!(matches!(SmcError::from_io(&err), Some(SmcError::Handshake(_))), "{err}");
}

#[tokio::test]
async fn tcp_only_policies() {
    let listener = SmcListener::builder().policy(Policy::TcpOnly).bind("127.0.0.1:0").await.unwrap();
    assert_eq!(listener.door_name(), None, "a TcpOnly listener has no door");
    let addr = listener.local_addr().unwrap();
    spawn_echo(listener);
    // Same-host clients find no door and connect plain. (A context of its own: the process's
    // negative cache may hold this port from another test, which says so instead.)
    let ctx = smc_tokio::Context::new();
    let s = SmcStream::builder().context(&ctx).connect(addr).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::NotProposed));
    bounded(10, echo_check(s, b"tcp only listener", 5, 5)).await;
    // A TcpOnly listener still answers an in-band proposal, so an SMC client keeps working.
    let s = SmcStream::builder().policy(Policy::Always).connect(addr).await.unwrap();
    assert_eq!(s.transport(), DECLINED_BY_PEER);
    bounded(10, echo_check(s, b"tcp only, in-band", 5, 7)).await;
    // A client with shm switched off offers nothing, and the server declines.
    let s = SmcStream::builder()
        .policy(Policy::Always)
        .shm(ShmConfig::default().enabled(false))
        .connect(addr)
        .await
        .unwrap();
    assert_eq!(s.transport(), DECLINED_BY_PEER);
    // A TcpOnly client sends no proposal at all.
    let s = SmcStream::builder().policy(Policy::TcpOnly).connect(addr).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(FallbackReason::Disabled));
    bounded(10, echo_check(s, b"tcp only client", 5, 6)).await;
}

#[tokio::test]
async fn never_listener_closes_fallback_connections() {
    let listener = SmcListener::builder().policy(Policy::Never).bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move { listener.accept().await });
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let mut b = Vec::new();
    // The connection is closed without a byte; accept never returns it.
    let n = bounded(10, c.read_to_end(&mut b)).await.unwrap_or(0);
    assert_eq!(n, 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!accept.is_finished());
    accept.abort();
}

/// A fake in-band SMC server that answers every proposal with `reply` and then echoes.
async fn fake_server(
    reply: impl Fn(ClcMessage) -> ClcMessage + Send + Sync + 'static,
) -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let reply = std::sync::Arc::new(reply);
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let reply = reply.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let proposal = read_clc(&mut c).await;
                c.write_all(&reply(proposal).encode().unwrap()).await.unwrap();
                // Whatever the client sends before its data (a decline, for an accept).
                let _ = tx.send(Vec::new());
                let (mut rd, mut wr) = c.split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
            });
        }
    });
    (addr, rx)
}

async fn read_clc(c: &mut TcpStream) -> ClcMessage {
    let mut buf = vec![0u8; CLC_HEADER_LEN];
    c.read_exact(&mut buf).await.unwrap();
    let Decoded::NeedMore(total) = decode(&buf).unwrap() else { panic!("header only") };
    buf.resize(total, 0);
    c.read_exact(&mut buf[CLC_HEADER_LEN..]).await.unwrap();
    match decode(&buf).unwrap() {
        Decoded::Message(m, _) => m,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn every_decline_reason_from_the_server_ends_in_working_tcp() {
    // A context of its own: the process's negative cache may hold this port from another
    // test, and the first connection would say so instead of what this one asserts.
    let ctx = smc_tokio::Context::new();
    for reason in DeclineReason::ALL {
        let (addr, _rx) = fake_server(move |p| ClcMessage::Decline(Decline { secret: p.secret(), reason })).await;
        let s = bounded(10, SmcStream::builder().context(&ctx).policy(Policy::Always).connect(addr)).await.unwrap();
        assert_eq!(s.transport(), Transport::Tcp(FallbackReason::Declined { reason, by: Side::Peer }));
        let data = Rng::new(reason as u64).bytes(100_000);
        bounded(10, echo_check(s, &data, 3000, reason as u64)).await;
    }
}

#[tokio::test]
async fn unoffered_accept_is_declined_by_the_client_and_stays_in_step() {
    // A context of its own: the process's negative cache may hold this port from another
    // test, and the first connection would say so instead of what this one asserts.
    let ctx = smc_tokio::Context::new();
    // The fake server accepts with a shm link the client never offered; the client must decline,
    // and the server must find the Decline, then the data.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut c, _) = l.accept().await.unwrap();
        let p = read_clc(&mut c).await;
        let accept = ClcMessage::Accept(Accept {
            secret: p.secret(),
            link: LinkInfo::Shm(ShmLinkInfo {
                link_group: 1,
                rmb_slot: 0,
                rmb_size: 65536,
                socket_name: b"x".to_vec(),
            }),
        });
        c.write_all(&accept.encode().unwrap()).await.unwrap();
        let d = read_clc(&mut c).await;
        assert_eq!(d, ClcMessage::Decline(Decline { secret: p.secret(), reason: DeclineReason::NoCommonTransport }));
        // After an Accept the server always has the last word; the client waits for it.
        c.write_all(&d.encode().unwrap()).await.unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"after");
    });
    let mut s = bounded(10, SmcStream::builder().context(&ctx).policy(Policy::Always).connect(addr)).await.unwrap();
    assert_eq!(
        s.transport(),
        Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::NoCommonTransport, by: Side::Local })
    );
    s.write_all(b"after").await.unwrap();
    bounded(10, server).await.unwrap();
}

/// A fake client: sends `proposal_bytes`, then returns the stream and what the server answered.
async fn fake_client(addr: std::net::SocketAddr, proposal_bytes: &[u8]) -> (TcpStream, Option<ClcMessage>) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(proposal_bytes).await.unwrap();
    let mut hdr = [0u8; CLC_HEADER_LEN];
    if c.read_exact(&mut hdr).await.is_err() {
        return (c, None);
    }
    let Decoded::NeedMore(total) = decode(&hdr).unwrap() else { panic!() };
    let mut buf = hdr.to_vec();
    buf.resize(total, 0);
    c.read_exact(&mut buf[CLC_HEADER_LEN..]).await.unwrap();
    let Decoded::Message(m, _) = decode(&buf).unwrap() else { panic!() };
    (c, Some(m))
}

/// A client proposes in-band to a listener that serves it as TCP: it must be declined, then
/// send "app bytes" and read "ok" on the same connection (the server's part).
async fn declined_then_served(addr: std::net::SocketAddr) {
    let (mut c, reply) = bounded(10, fake_client(addr, &proposal_bytes())).await;
    match reply {
        Some(ClcMessage::Decline(d)) => assert_eq!(d.reason, DeclineReason::NoCommonTransport),
        other => panic!("{other:?}"),
    }
    c.write_all(b"app bytes").await.unwrap();
    let mut ok = [0u8; 2];
    bounded(10, c.read_exact(&mut ok)).await.unwrap();
    assert_eq!(&ok, b"ok");
}

fn proposal_bytes() -> Vec<u8> {
    use smc_tokio::proto::clc::{Proposal, Secret};
    ClcMessage::Proposal(Proposal { secret: Secret([9; 16]), rmb_size: 0, shm: None, rdma: None }).encode().unwrap()
}

#[tokio::test]
async fn server_declines_newer_version_and_serves_tcp() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    spawn_echo(listener);
    let mut p = proposal_bytes();
    p[4] = CLC_VERSION + 1;
    let (mut c, reply) = bounded(10, fake_client(addr, &p)).await;
    match reply {
        Some(ClcMessage::Decline(d)) => assert_eq!(d.reason, DeclineReason::VersionMismatch),
        other => panic!("{other:?}"),
    }
    c.write_all(b"v2 client falls back").await.unwrap();
    let mut b = [0u8; 20];
    bounded(10, c.read_exact(&mut b)).await.unwrap();
    assert_eq!(&b, b"v2 client falls back");
}

#[tokio::test]
async fn malformed_proposal_on_a_plain_connection_is_the_applications_data() {
    // A client that did not register cannot be an SMC client the listener would serve, so
    // bytes that look like a broken proposal are its data: handed to the application whole.
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    spawn_echo(listener);
    let mut bad = proposal_bytes();
    bad[6..8].copy_from_slice(&60000u16.to_be_bytes());
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&bad).await.unwrap();
    let mut back = vec![0u8; bad.len()];
    bounded(10, c.read_exact(&mut back)).await.unwrap();
    assert_eq!(back, bad, "echoed byte for byte");
    // The listener goes on serving.
    let s = SmcStream::connect(addr).await.unwrap();
    bounded(10, echo_check(s, b"still serving", 4, 1)).await;
}

#[tokio::test]
async fn a_late_proposal_on_a_plain_connection_is_declined_never_delivered() {
    // A client proposing in-band to a listener that handed its connection out as TCP (it did
    // not register): the application reads nothing but the client's data, and the client gets
    // a decline and continues over TCP on the same connection.
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        assert_eq!(conn.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
        let mut b = [0u8; 9];
        conn.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"app bytes", "the proposal never reaches the application");
        conn.write_all(b"ok").await.unwrap();
    });
    declined_then_served(addr).await;
    bounded(10, server).await.unwrap();
    assert!(smc_tokio::stats().late_messages >= 1);
}

#[tokio::test]
async fn half_close_behaves_as_tcp() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut req = Vec::new();
        conn.read_to_end(&mut req).await.unwrap(); // EOF from the client's half-close
                                                   // The other direction still flows.
        conn.write_all(&req).await.unwrap();
        conn.write_all(b" + reply").await.unwrap();
        conn.shutdown().await.unwrap();
    });
    let mut s = SmcStream::connect(addr).await.unwrap();
    s.write_all(b"request").await.unwrap();
    s.shutdown().await.unwrap();
    let mut resp = Vec::new();
    bounded(10, s.read_to_end(&mut resp)).await.unwrap();
    assert_eq!(resp, b"request + reply");
    // Writing after shutdown fails, as on TCP.
    assert!(s.write_all(b"late").await.is_err());
    server.await.unwrap();
}

#[tokio::test]
async fn owned_halves_reunite_and_refuse_strangers() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    spawn_echo(listener);
    let a = SmcStream::connect(addr).await.unwrap();
    let b = SmcStream::connect(addr).await.unwrap();
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    assert_eq!(ar.transport(), aw.transport());
    let err = ar.reunite(bw).unwrap_err();
    let (ar, bw) = (err.0, err.1);
    let a = ar.reunite(aw).unwrap();
    let b = bw.reunite(br).unwrap();
    // Reunited streams were not shut down by the halves.
    bounded(10, echo_check(a, b"still open a", 3, 1)).await;
    bounded(10, echo_check(b, b"still open b", 3, 2)).await;
}

#[tokio::test]
async fn vectored_writes_and_stream_accessors() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    spawn_echo(listener);
    let mut s = SmcStream::connect(addr).await.unwrap();
    assert_eq!(s.peer_addr().unwrap(), addr);
    assert!(s.local_addr().unwrap().port() != 0);
    s.set_nodelay(true).unwrap();
    assert!(s.nodelay().unwrap());
    let bufs = [std::io::IoSlice::new(b"hello "), std::io::IoSlice::new(b"vectored")];
    let mut sent = 0;
    while sent < 14 {
        sent += s.write_vectored(&bufs).await.unwrap();
        assert_eq!(sent, 14, "loopback takes 14 bytes in one call");
    }
    let mut got = [0u8; 14];
    bounded(10, s.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"hello vectored");
}

#[tokio::test]
async fn listener_conversions() {
    let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_l.set_nonblocking(true).unwrap();
    let l = SmcListener::try_from(std_l).unwrap();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);
    let s = SmcStream::connect(addr).await.unwrap();
    bounded(10, echo_check(s, b"from std", 2, 1)).await;

    let l: SmcListener = TcpListener::bind("127.0.0.1:0").await.unwrap().into();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);
    let s = SmcStream::connect(addr).await.unwrap();
    bounded(10, echo_check(s, b"from tokio", 2, 1)).await;
}

/// A plain client's stream, accepted by an `SmcListener`, that has sent nothing yet: its
/// guard (which takes a late handshake message off the stream) is still on. Returns the
/// server's stream, after a read that found nothing, and the client.
async fn silent_plain_client() -> (std::sync::Arc<SmcStream>, TcpStream) {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, _) = bounded(10, listener.accept()).await.unwrap();
    assert_eq!(server.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
    let mut buf = [0u8; 16];
    assert_eq!(server.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    (std::sync::Arc::new(server), client)
}

/// Asking for either direction on a plain client's stream that has nothing to read answers
/// writable at once, as tokio's does: a server that pushes (`ready(READABLE | WRITABLE)` in
/// a loop) must not wait for its client to speak first.
#[tokio::test]
async fn a_silent_plain_clients_stream_is_writable_when_asked_for_either() {
    use tokio::io::Interest;
    let (server, _client) = silent_plain_client().await;
    let ready = bounded(5, server.ready(Interest::READABLE | Interest::WRITABLE)).await.unwrap();
    assert!(ready.is_writable() && !ready.is_readable(), "{ready:?}");
    assert_eq!(server.try_write(b"hello").unwrap(), 5);
}

/// Every task that waits for a plain client's bytes is woken when they come, as with tokio:
/// two readiness futures, and a `poll_read_ready` caller; `try_read` calls in between (which
/// find nothing) take no task's place. Then the bytes are the client's, exactly.
#[tokio::test]
async fn every_task_waiting_for_a_plain_client_is_woken() {
    let (server, mut client) = silent_plain_client().await;
    let mut a = tokio_test::task::spawn(server.readable());
    let mut b = tokio_test::task::spawn(server.readable());
    let mut polled = tokio_test::task::spawn(std::future::poll_fn(|cx| server.poll_read_ready(cx)));
    // The `poll_*` caller first: a readiness future that took the socket's one reader slot
    // after it would leave it unwoken.
    assert!(polled.poll().is_pending());
    assert!(a.poll().is_pending());
    assert!(b.poll().is_pending());
    let mut buf = [0u8; 16];
    assert_eq!(server.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(server.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    client.write_all(b"hi there").await.unwrap();
    bounded(5, async {
        while !(a.is_woken() && b.is_woken() && polled.is_woken()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(a.poll().is_ready() && b.poll().is_ready() && polled.poll().is_ready());
    drop((a, b, polled));
    let mut got = Vec::new();
    while got.len() < 8 {
        server.readable().await.unwrap();
        match server.try_read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, b"hi there");
}

/// Two tasks peeking at a plain client's stream, and a `poll_read_ready` caller, are all woken
/// when the client's bytes come, and both peeks see them, as with tokio's `peek`.
#[tokio::test]
async fn every_task_peeking_at_a_plain_client_is_woken() {
    let (server, mut client) = silent_plain_client().await;
    tests::every_peeker_is_woken(&server, &mut client).await;
}

/// The wait of a listener's plain clients for the rest of a possible handshake message, set
/// (`faults::set_partial_wait`) for as long as this lives: put back however a test ends.
struct PartialWait(std::net::SocketAddr);

impl PartialWait {
    fn set(listener: std::net::SocketAddr, wait: Duration) -> PartialWait {
        smc_tokio::faults::set_partial_wait(listener, Some(wait));
        PartialWait(listener)
    }
}

impl Drop for PartialWait {
    fn drop(&mut self) {
        smc_tokio::faults::set_partial_wait(self.0, None);
    }
}

/// A plain client whose first byte is the handshake eyecatcher's first, and nothing after it:
/// the guard holds it for the rest of a possible handshake message, as long as clients on other
/// hosts are given (set long here, so that "not yet" is certain), then hands it to the
/// application. A readiness future waits for that deadline (it has no timer of the guard's to
/// be woken by), and so does a read; neither answers before, and the byte comes out as sent.
#[tokio::test]
async fn a_lone_eyecatcher_byte_is_held_until_the_partial_wait_ends() {
    const WAIT: Duration = Duration::from_millis(1500);
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _wait = PartialWait::set(addr, WAIT);
    for reader in ["readiness future", "read"] {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut server, _) = bounded(10, listener.accept()).await.unwrap();
        let sent = std::time::Instant::now();
        client.write_all(&[0xE2]).await.unwrap();
        let mut byte = [0u8; 1];
        // "Not yet" is certain only before the wait could have ended (a stalled machine may
        // take longer than the sleep).
        let not_yet = |pending: bool| pending || sent.elapsed() >= WAIT;
        if reader == "read" {
            let mut read = tokio_test::task::spawn(server.read(&mut byte));
            assert!(not_yet(read.poll().is_pending()));
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(not_yet(read.poll().is_pending()), "{reader}: answered before the wait ended");
            let n = bounded(5, read).await.unwrap();
            assert_eq!(&byte[..n], &[0xE2]);
        } else {
            // A fresh stream is taken to be readable until a read finds nothing (tokio's
            // accepted streams are): this one finds the byte held.
            let e = server.try_read(&mut byte).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
            let mut ready = tokio_test::task::spawn(server.readable());
            assert!(not_yet(ready.poll().is_pending()));
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(not_yet(ready.poll().is_pending()), "{reader}: answered before the wait ended");
            bounded(5, ready).await.unwrap();
            assert_eq!(server.try_read(&mut byte).unwrap(), 1);
            assert_eq!(byte, [0xE2]);
        }
        // The rest of the stream is the client's, as sent.
        client.write_all(b"rest").await.unwrap();
        let mut rest = [0u8; 4];
        bounded(5, server.read_exact(&mut rest)).await.unwrap();
        assert_eq!(&rest, b"rest", "{reader}");
    }
}

/// The same held byte, read with `try_read` from a thread outside any runtime (where the guard
/// can make no timer): no panic, "would block" while the wait lasts, and the byte once it is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_byte_is_read_from_outside_the_runtime_once_the_partial_wait_ends() {
    const WAIT: Duration = Duration::from_millis(700);
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _wait = PartialWait::set(addr, WAIT);
    let mut client = TcpStream::connect(addr).await.unwrap();
    let (server, _) = bounded(10, listener.accept()).await.unwrap();
    let sent = std::time::Instant::now();
    client.write_all(&[0xE2]).await.unwrap();
    // The byte is on the server's socket before the thread looks.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        assert!(tokio::runtime::Handle::try_current().is_err(), "no runtime on this thread");
        let mut byte = [0u8; 1];
        let first = (server.try_read(&mut byte).map_err(|e| e.kind()), sent.elapsed());
        let mut next = first.0.map_err(std::io::Error::from);
        let got = loop {
            match next {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && sent.elapsed() < WAIT * 10 => {
                    std::thread::sleep(Duration::from_millis(20));
                    next = server.try_read(&mut byte);
                }
                r => break (r.map_err(|e| e.kind()), sent.elapsed()),
            }
        };
        let _ = tx.send((first, got, byte, server));
    });
    let (first, got, byte, _server) = bounded(20, rx).await.expect("the reading thread panicked");
    assert!(first.0 == Err(std::io::ErrorKind::WouldBlock) || first.1 >= WAIT, "answered before the wait: {first:?}");
    assert_eq!(got.0, Ok(1), "the byte after the wait");
    assert!(got.1 >= WAIT, "the byte came {:?} after it was sent, before the wait of {WAIT:?}", got.1);
    assert_eq!(byte, [0xE2]);
}

/// An accepted plain client's stream spends the task's cooperative budget on each read and
/// write, as tokio's streams do, also while its socket is still taken to be ready (it is until
/// a call finds it is not): a loop of small writes that all fit in the socket's buffer, or of
/// small reads of bytes that are all there, yields to the runtime's other tasks.
#[tokio::test]
async fn io_on_a_plain_clients_stream_yields_to_the_tasks_of_its_runtime() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    for way in ["write", "read"] {
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = bounded(10, listener.accept()).await.unwrap();
        if way == "read" {
            client.write_all(&[b'x'; 4096]).await.unwrap();
            // All of it arrived before the loop starts.
            let mut buf = [0u8; 1];
            bounded(5, async { while server.peek(&mut buf).await.unwrap() == 0 {} }).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        tokio::spawn(async move { flag.store(true, Ordering::Relaxed) });
        let mut byte = [0u8; 1];
        let mut yielded = false;
        for i in 0..1024 {
            if way == "write" {
                server.write_all(b"x").await.unwrap();
            } else {
                server.read_exact(&mut byte).await.unwrap();
            }
            if ran.load(Ordering::Relaxed) {
                assert!(i > 0, "{way}: the other task ran before the first call");
                yielded = true;
                break;
            }
        }
        assert!(yielded, "{way}: 1024 calls in a row never let the runtime's other task run");
    }
}

/// The application's own system calls on a plain client's stream (`async_io`, `try_io`) never
/// see a late handshake message: it is taken off and declined first, as for reads through the
/// stream, and the client goes on over TCP on the same connection. A plain client's bytes are
/// left on the socket for the application's own call.
#[tokio::test]
async fn raw_reads_never_see_a_late_proposal_and_plain_bytes_stay_on_the_socket() {
    use std::os::fd::AsRawFd;
    /// One `recv` of up to 64 bytes on the stream's socket, through `async_io`.
    async fn raw_recv(conn: &SmcStream) -> std::io::Result<Vec<u8>> {
        let fd = conn.as_raw_fd();
        conn.async_io(tokio::io::Interest::READABLE, || {
            let mut b = [0u8; 64];
            // SAFETY: `fd` is the stream's open socket, `b` a writable buffer of 64 bytes.
            let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), 0) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(b[..n as usize].to_vec())
            }
        })
        .await
    }
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        // A client that proposes in-band.
        let (conn, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        while got.len() < 9 {
            got.extend(raw_recv(&conn).await.unwrap());
        }
        assert_eq!(got, b"app bytes", "the proposal never reaches the application");
        conn.try_io(tokio::io::Interest::WRITABLE, || {
            std::io::Write::write(&mut &*socket2::SockRef::from(&conn), b"ok")
        })
        .unwrap();
        // A plain client: its bytes are the application's own call's, straight off the socket.
        let (conn, _) = listener.accept().await.unwrap();
        assert_eq!(bounded(10, raw_recv(&conn)).await.unwrap(), b"plain");
    });
    declined_then_served(addr).await;
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"plain").await.unwrap();
    bounded(10, server).await.unwrap();
}

/// A plain client's stream whose write half is dropped (its end sent) while a Proposal of the
/// client waits, unread: as before any write of the application's, the Proposal is answered
/// (declined) before the end goes out, so the client learns it is served as TCP instead of
/// meeting an end where it waits for an answer; the application then reads only the client's
/// own bytes.
#[tokio::test]
async fn dropping_the_write_half_answers_a_waiting_proposal_first() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let (conn, _) = bounded(10, listener.accept()).await.unwrap();
    let proposal = proposal_bytes();
    c.write_all(&proposal).await.unwrap();
    c.write_all(b"data").await.unwrap();
    // Until the Proposal is on the server's socket, looked at from outside the stream.
    bounded(10, async {
        let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 256];
        while socket2::SockRef::from(&conn).peek(&mut b).unwrap_or(0) < proposal.len() + 4 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let (mut rd, wr) = conn.into_split();
    drop(wr);
    let mut hdr = [0u8; CLC_HEADER_LEN];
    bounded(10, c.read_exact(&mut hdr)).await.expect("an answer before the end");
    let Decoded::NeedMore(total) = decode(&hdr).unwrap() else { panic!("{hdr:?}") };
    let mut msg = hdr.to_vec();
    msg.resize(total, 0);
    bounded(10, c.read_exact(&mut msg[CLC_HEADER_LEN..])).await.unwrap();
    assert!(matches!(decode(&msg).unwrap(), Decoded::Message(ClcMessage::Decline(_), _)));
    let mut end = [0u8; 1];
    assert_eq!(bounded(10, c.read(&mut end)).await.unwrap(), 0, "then the end");
    c.shutdown().await.unwrap();
    let mut got = Vec::new();
    bounded(10, rd.read_to_end(&mut got)).await.unwrap();
    assert_eq!(got, b"data");
}

/// tokio's loop of `readable()` then `try_io(READABLE, recv)` on a plain client's stream whose
/// bytes arrive after the accept: the guard's look leaves them on the socket, so the
/// application's own call reads them, in order, also when they start with the handshake
/// eyecatcher's first byte (0xE2 leads UTF-8's “, — and €).
#[tokio::test]
async fn readable_then_try_io_reads_a_plain_clients_bytes() {
    use std::os::fd::AsRawFd;
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    for data in [&b"plain bytes"[..], "\u{201c}quoted\u{201d} \u{20ac}5".as_bytes()] {
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = bounded(10, listener.accept()).await.unwrap();
        let mut b = [0u8; 64];
        assert_eq!(server.try_read(&mut b).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        client.write_all(data).await.unwrap();
        let mut got = Vec::new();
        bounded(10, async {
            while got.len() < data.len() {
                server.readable().await.unwrap();
                let fd = server.as_raw_fd();
                match server.try_io(tokio::io::Interest::READABLE, || {
                    // SAFETY: `fd` is the stream's open socket, `b` a writable buffer of 64 bytes.
                    let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), 0) };
                    if n < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(n as usize)
                    }
                }) {
                    Ok(n) => got.extend_from_slice(&b[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await;
        assert_eq!(got, data);
    }
}

/// A client that sends the eyecatcher's first byte and then closes: no rest can come, so the
/// byte is the application's at once (not after the wait for the rest, set to 30 s here), then
/// the end, whether the application reads or waits for readiness first.
#[tokio::test]
async fn a_prefix_followed_by_the_end_is_data_at_once() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _wait = PartialWait::set(addr, Duration::from_secs(30));
    for reader in ["read", "readiness future"] {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut server, _) = bounded(10, listener.accept()).await.unwrap();
        client.write_all(&[0xE2]).await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        if reader == "read" {
            bounded(5, server.read_to_end(&mut got)).await.unwrap();
        } else {
            let mut b = [0u8; 8];
            bounded(5, async {
                loop {
                    server.readable().await.unwrap();
                    match server.try_read(&mut b) {
                        Ok(0) => break,
                        Ok(n) => got.extend_from_slice(&b[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            })
            .await;
        }
        assert_eq!(got, [0xE2], "{reader}");
    }
}

/// A plain client that resets its connection: the application's read meets the reset, as on
/// tokio's stream, even where the guard's look met it first (a socket reports a reset once).
#[tokio::test]
async fn a_plain_clients_reset_reaches_the_application() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = bounded(10, listener.accept()).await.unwrap();
    let mut b = [0u8; 8];
    assert_eq!(server.try_read(&mut b).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO)).unwrap();
    drop(client);
    bounded(5, server.readable()).await.unwrap();
    let e = server.try_read(&mut b).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
}
