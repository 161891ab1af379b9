//! Establishment: the commit point, stalls on either side, a listener that goes away
//! mid-handshake, and attacks on the door. Every case ends in SMC or TCP with the bytes intact,
//! never in an error. Stalls are injected at the handshake's decision points (`faults`, feature
//! `test-util`), keyed by each test's own listener.

use std::net::SocketAddr;
use std::time::Duration;

use smc_tokio::faults::{self, Point};
use smc_tokio::{DeclineReason, FallbackReason, Side, SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, Rng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

const STEP: Duration = Duration::from_millis(200);

fn declined(reason: DeclineReason, by: Side) -> Transport {
    Transport::Tcp(FallbackReason::Declined { reason, by })
}

/// A listener with a 200 ms bound per handshake step whose connections are echoed; each one's
/// transport is reported.
async fn echo_listener() -> (SmcListener, SocketAddr) {
    let l = SmcListener::builder().handshake_timeout(STEP).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

/// Waits (up to 10 s) until a handshake with the listener at `addr` is held at the stall
/// injected at `point`.
async fn stalled_at(addr: SocketAddr, point: Point) {
    bounded(10, async {
        while !faults::reached(addr, point) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Waits (up to 10 s) until every link group of `ctx` has ended.
async fn groups_end(ctx: &smc_tokio::Context) {
    bounded(10, async {
        while ctx.stats().link_groups != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

fn serve_echo(l: SmcListener) -> mpsc::UnboundedReceiver<Transport> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = tx.send(s.transport());
            tokio::spawn(async move {
                let (mut rd, mut wr) = s.into_split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                let _ = wr.shutdown().await;
            });
        }
    });
    rx
}

#[tokio::test]
async fn a_confirm_after_the_servers_deadline_ends_in_tcp_in_step() {
    let (l, addr) = echo_listener().await;
    // The client sets its end up, then stalls past the server's wait for its answer.
    faults::inject(addr, Point::ClientBeforeConfirm, STEP * 3);
    let mut rx = serve_echo(l);
    let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    // The server gave up and declined on the door (its final word); the late Confirm went to
    // the door too, so the stream carries exactly the application's bytes.
    assert_eq!(s.transport(), declined(DeclineReason::Timeout, Side::Peer));
    bounded(10, echo_check(s, &Rng::new(1).bytes(64 << 10), 4096, 1)).await;
    assert_eq!(bounded(10, rx.recv()).await.unwrap(), declined(DeclineReason::Timeout, Side::Local));
    faults::clear(addr);
}

#[tokio::test]
async fn a_client_that_stalls_before_proposing_is_served_as_tcp_and_declined() {
    let (l, addr) = echo_listener().await;
    faults::inject(addr, Point::ClientBeforeHandshake, STEP * 3);
    let mut rx = serve_echo(l);
    let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    // The Proposal went with the registration and the Accept came at once; by the time the
    // client looks, the server has stopped waiting for its answer (and dropped the group it set
    // up for it), so the client's link setup fails and it declines; both stay on TCP.
    assert!(matches!(s.transport(), Transport::Tcp(FallbackReason::Declined { .. })), "{}", s.transport());
    assert_eq!(bounded(10, rx.recv()).await.unwrap(), declined(DeclineReason::Timeout, Side::Local));
    bounded(10, echo_check(s, &Rng::new(2).bytes(64 << 10), 4096, 2)).await;
    faults::clear(addr);
}

#[tokio::test]
async fn a_stalled_client_of_a_server_that_speaks_first_keeps_the_greeting() {
    let (l, addr) = echo_listener().await;
    faults::inject(addr, Point::ClientBeforeHandshake, STEP * 3);
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        // Handed out after the server stopped waiting for the client: it greets at once; the
        // handshake never touched the stream.
        s.write_all(b"220 ready\r\n").await.unwrap();
        let mut b = [0u8; 6];
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"PING\r\n", "nothing of the handshake reaches the application");
        s.write_all(b"PONG\r\n").await.unwrap();
        s.transport()
    });
    let mut s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert!(matches!(s.transport(), Transport::Tcp(FallbackReason::Declined { .. })), "{}", s.transport());
    let mut g = [0u8; 11];
    bounded(10, s.read_exact(&mut g)).await.unwrap();
    assert_eq!(&g, b"220 ready\r\n");
    s.write_all(b"PING\r\n").await.unwrap();
    let mut p = [0u8; 6];
    bounded(10, s.read_exact(&mut p)).await.unwrap();
    assert_eq!(&p, b"PONG\r\n");
    assert_eq!(bounded(10, server).await.unwrap(), declined(DeclineReason::Timeout, Side::Local));
    faults::clear(addr);
}

#[tokio::test]
async fn a_server_that_misses_its_commit_deadline_declines_in_step() {
    let (l, addr) = echo_listener().await;
    faults::inject(addr, Point::ServerBeforeCommit, STEP * 2);
    let mut rx = serve_echo(l);
    let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(s.transport(), declined(DeclineReason::Timeout, Side::Peer));
    assert_eq!(bounded(10, rx.recv()).await.unwrap(), declined(DeclineReason::Timeout, Side::Local));
    bounded(10, echo_check(s, &Rng::new(3).bytes(64 << 10), 4096, 3)).await;
    faults::clear(addr);
}

#[tokio::test]
async fn a_confirmed_client_waits_for_a_late_commit_and_never_splits_the_connection() {
    // The server's bound is long and it stalls after the Confirm for five of the client's
    // bounds: the client has confirmed, so only the server's word settles the connection, and
    // it waits for it. Both ends are SMC, and every byte arrives (before, the client gave up
    // after two of its bounds and wrote on TCP while the server committed: I/O errors).
    let l = SmcListener::builder().handshake_timeout(STEP * 20).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    faults::inject(addr, Point::ServerBeforeCommit, STEP * 5);
    let mut rx = serve_echo(l);
    let clients: Vec<_> = (0..16u64)
        .map(|i| {
            tokio::spawn(async move {
                let s = SmcStream::builder().handshake_timeout(STEP).connect(addr).await.unwrap();
                let t = s.transport();
                echo_check(s, &Rng::new(i).bytes(16 << 10), 4096, i).await;
                t
            })
        })
        .collect();
    for c in clients {
        assert_eq!(bounded(20, c).await.unwrap(), Transport::SmcD);
        assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::SmcD);
    }
    faults::clear(addr);
}

#[tokio::test]
async fn a_server_stalled_before_accepting_is_waited_for_not_abandoned() {
    // Within the server's own bound, a slow decision is just slow: still SMC. (Both bounds are
    // far longer than the stall, so that only a handshake that gives up on a slow server, not
    // a busy machine, ends in TCP.)
    let l = SmcListener::builder().handshake_timeout(STEP * 50).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    faults::inject(addr, Point::ServerBeforeAccept, STEP * 2);
    let mut rx = serve_echo(l);
    let s = bounded(20, SmcStream::builder().handshake_timeout(STEP * 50).connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD);
    assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::SmcD);
    bounded(10, echo_check(s, b"slow but smc", 4, 4)).await;
    faults::clear(addr);
}

#[tokio::test]
async fn a_listener_dropped_mid_handshake_declines_and_the_client_reads_the_end() {
    let l = SmcListener::builder().handshake_timeout(Duration::from_secs(5)).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    // The stall lasts until the listener goes (its close ends the handshake), and the client
    // waits as long: only the server's decline ends the handshake.
    faults::inject(addr, Point::ServerBeforeAccept, Duration::from_secs(60));
    let client = tokio::spawn(async move {
        let builder = SmcStream::builder().handshake_timeout(Duration::from_secs(60));
        builder.connect(addr).await
    });
    // Once the handshake is stalled in the server's decision, the listener goes away.
    stalled_at(addr, Point::ServerBeforeAccept).await;
    drop(l);
    let mut s = bounded(10, client).await.unwrap().expect("no error: the server declined in step");
    assert_eq!(s.transport(), declined(DeclineReason::Timeout, Side::Peer));
    let mut b = Vec::new();
    // As with TCP, a connection nobody accepted ends (EOF or reset), without an SMC error.
    let r = bounded(10, s.read_to_end(&mut b)).await;
    assert!(r.is_ok() || r.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset), "{r:?}");
    assert!(b.is_empty());
    // The port was closed with the listener, not when its last handshake task ended: it can be
    // bound again at once (tokio's listeners set SO_REUSEADDR, as ours do).
    let again = tokio::net::TcpListener::bind(addr).await.expect("the dropped listener's port is free");
    let _c = tokio::net::TcpStream::connect(addr).await.unwrap();
    bounded(10, again.accept()).await.unwrap();
    faults::clear(addr);
}

/// A member of a reuseport group that refuses a connection's handshake (its slots are taken)
/// tells the client at once that the connection stays TCP: the client does not wait for the
/// other members' doors, which never see the connection.
#[tokio::test]
async fn a_refusal_in_a_reuseport_group_is_final() {
    let bind = |addr: SocketAddr| {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.set_reuseport(true).unwrap();
        s.set_reuseaddr(true).unwrap();
        s.bind(addr).unwrap();
        SmcListener::builder()
            .handshake_timeout(Duration::from_secs(20))
            .limit_handshake(true)
            .max_pending_handshakes(1)
            .from_tcp(s.listen(1024).unwrap())
    };
    let first = bind("127.0.0.1:0".parse().unwrap());
    let addr = first.local_addr().unwrap();
    let second = bind(addr);
    let mut rx1 = serve_echo(first);
    let mut rx2 = serve_echo(second);
    // Every handshake is held in the server's decision (for up to 12 s, within both ends'
    // bounds), holding its listener's only slot, until the refusals are in: each listener serves
    // at most one of the five clients, so at least three land on a listener that is full, and
    // their refusals come while the others are held, however slowly the clients arrive.
    faults::inject(addr, Point::ServerBeforeAccept, Duration::from_secs(12));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..5 {
        clients.spawn(async move {
            let builder = SmcStream::builder().handshake_timeout(Duration::from_secs(15));
            builder.connect(addr).await
        });
    }
    let congested = declined(DeclineReason::HandshakeCongested, Side::Peer);
    let mut refused = 0;
    let mut done = 0;
    while let Some(c) = bounded(30, clients.join_next()).await {
        let s = c.unwrap().unwrap();
        let t = s.transport();
        assert!(t == Transport::SmcD || t == congested, "{t}: a refusal must not end in the client's timeout");
        if t == congested {
            refused += 1;
        } else {
            assert!(refused >= 3, "a held handshake went on before three refusals came: {refused}");
        }
        done += 1;
        bounded(10, echo_check(s, b"either way", 3, done)).await;
        if refused == 3 {
            // The held ones go on now.
            faults::clear(addr);
        }
    }
    assert!(refused >= 3, "{refused} refused");
    let mut served = 0;
    while served < 5 {
        tokio::select! {
            Some(_) = rx1.recv() => served += 1,
            Some(_) = rx2.recv() => served += 1,
        }
    }
    faults::clear(addr);
}

// ----- attacks on the door (a peer process as another uid) ---------------------------------------

#[tokio::test]
async fn a_process_squatting_on_a_door_name_gets_nothing() {
    if !tests::require_root("a_process_squatting_on_a_door_name_gets_nothing") {
        return;
    }
    // Another uid takes the door name of the address our listener is about to bind.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let name = format!("smc-tokio/d4/127.0.0.1:{port}/solo");
    let (child, mut lines) = tests::peer_as(env!("CARGO_BIN_EXE_smc-test-peer"), 65534, &["squat", &name, "3"]);
    assert_eq!(bounded(10, lines.next_line()).await.unwrap().as_deref(), Some("SQUATTING"));
    let l = SmcListener::bind(("127.0.0.1", port)).await.unwrap();
    // Our listener takes the first indexed name instead; clients skip the squatter's door (its
    // owner is not a uid they trust) and register at ours.
    assert_eq!(l.door_name().unwrap(), format!("smc-tokio/d4/127.0.0.1:{port}/0"));
    let addr = l.local_addr().unwrap();
    let mut rx = serve_echo(l);
    for i in 0..5 {
        let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
        assert_eq!(s.transport(), Transport::SmcD);
        assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::SmcD);
        bounded(10, echo_check(s, b"past the squatter", 4, i)).await;
    }
    let out = bounded(20, lines.next_line()).await.unwrap().unwrap();
    drop(child);
    // The clients knocked (and left after seeing its uid): not a byte, not a descriptor.
    assert!(out.starts_with("SQUAT conns=") && out.ends_with("bytes=0 fds=0"), "{out}");
    assert!(!out.starts_with("SQUAT conns=0 "), "the clients did knock: {out}");
}

#[tokio::test]
async fn a_process_of_another_uid_cannot_claim_a_connections_port() {
    if !tests::require_root("a_process_of_another_uid_cannot_claim_a_connections_port") {
        return;
    }
    // The server even trusts the claimer's uid (so the door takes its registrations), and the
    // claimer names the victim socket's port and cookie (which anyone can read): the kernel
    // says the connection's client end is not the claimer's uid's, so it stays the victim's.
    // (Not uid 65534: the overflow uid is never trusted.)
    use std::os::fd::AsRawFd;
    const CLAIMER: u32 = 65533;
    let cfg = smc_tokio::config::ShmConfig::default().allow_uid(CLAIMER);
    let l = SmcListener::builder().shm(cfg).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut rx = serve_echo(l);
    let smc = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(smc.transport(), Transport::SmcD);
    assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::SmcD);
    // The victim: a plain client whose socket is bound before it connects.
    let victim = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    victim.set_reuse_port(true).unwrap();
    victim.bind(&"0.0.0.0:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    let port = victim.local_addr().unwrap().as_socket().unwrap().port();
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for writes of the option's size.
    let r = unsafe {
        libc::getsockopt(
            victim.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0);
    let (child, mut lines) = tests::peer_as(
        env!("CARGO_BIN_EXE_smc-test-peer"),
        CLAIMER,
        &["claim", &addr.to_string(), &port.to_string(), &cookie.to_string(), "1"],
    );
    let out = bounded(20, lines.next_line()).await.unwrap().unwrap();
    // EADDRINUSE for the victim's port; its registration is sent.
    assert_eq!(out, "CLAIM victim_port=errno98 registered=ok");
    // Give the listener time to take the registration in (and answer it: at a solo door, an
    // Accept for the claimer's own proposal), then the victim connects, before the claimer's
    // Confirm names the victim's connection.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let plain = tokio::task::spawn_blocking(move || {
        victim.connect(&addr.into()).unwrap();
        std::net::TcpStream::from(victim)
    })
    .await
    .unwrap();
    plain.set_nonblocking(true).unwrap();
    let plain = tokio::net::TcpStream::from_std(plain).unwrap();
    assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::Tcp(FallbackReason::PeerNoSmc));
    let verdict = bounded(20, lines.next_line()).await.unwrap().unwrap();
    drop(child);
    // Never matched: the Confirm that names the victim's connection is declined (the kernel
    // says its client end is uid 0's, not the claimer's), and no Commit ever comes.
    assert_eq!(verdict, "VERDICT accept-then-decline");
    bounded(10, echo_check(smc, &Rng::new(5).bytes(100_000), 5000, 5)).await;
    bounded(10, echo_check(plain, &Rng::new(6).bytes(100_000), 5000, 6)).await;
}

/// Connects `n` plain clients one after another to a greeting server on `addr` and returns the
/// median and worst time from `connect` to the greeting's first byte.
async fn time_to_banner(addr: SocketAddr, n: usize) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut b = [0u8; 1];
        bounded(10, c.read_exact(&mut b)).await.unwrap();
        times.push(t.elapsed());
    }
    times.sort();
    (times[n / 2], times[n - 1])
}

#[tokio::test]
async fn plain_clients_of_a_server_that_speaks_first_are_greeted_without_a_timer() {
    // The peek timeout is an hour: if plain clients waited on it, this test would hang.
    let l = SmcListener::builder().peek_timeout(Duration::from_secs(3600)).bind("127.0.0.1:0").await.unwrap();
    let smc_addr = l.local_addr().unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = tx.send(s.transport());
            tokio::spawn(async move { s.write_all(b"220 hello\r\n").await });
        }
    });
    let tl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp_addr = tl.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tl.accept().await {
            tokio::spawn(async move { s.write_all(b"220 hello\r\n").await });
        }
    });
    let (smc_p50, smc_max) = time_to_banner(smc_addr, 200).await;
    let (tcp_p50, tcp_max) = time_to_banner(tcp_addr, 200).await;
    for _ in 0..200 {
        assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::Tcp(FallbackReason::PeerNoSmc));
    }
    eprintln!(
        "BANNER time to greeting, 200 plain clients: SmcListener p50 {smc_p50:?} max {smc_max:?}; \
         tokio TcpListener p50 {tcp_p50:?} max {tcp_max:?}"
    );
}

#[tokio::test]
async fn a_registered_socket_keeps_the_applications_options() {
    // The client hands its own socket to the door; the listener holds a duplicate of it until
    // the connection arrives, then lets it go. Socket options belong to the socket, not to a
    // descriptor, so whatever the listener does to its duplicate the client sees: it must
    // leave them alone (a linger the application set stays set, and so its close semantics).
    let (l, addr) = echo_listener().await;
    let _rx = serve_echo(l);
    for linger in [Duration::from_secs(5), Duration::ZERO] {
        let socket = smc_tokio::SmcSocket::new_v4().unwrap();
        #[expect(deprecated, reason = "set_linger is tokio's deprecated way to set a non-zero linger")]
        socket.set_linger(Some(linger)).unwrap();
        let s = bounded(10, SmcStream::builder().connect_socket(socket, addr)).await.unwrap();
        assert_eq!(s.transport(), Transport::SmcD);
        // The listener let its duplicate go when it matched the connection, before its Accept;
        // give its closer thread time to act.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(s.linger().unwrap(), Some(linger), "the application's linger is kept");
        bounded(10, echo_check(s, b"options kept", 64, 1)).await;
    }
}

/// A plain client whose first bytes are a strict prefix of the CLC eyecatcher (`E2`, the first
/// byte of many UTF-8 characters and binary protocols) is no in-band client to wait for: on one
/// host it is served at once, its bytes untouched, with no partial-prefix timer.
#[tokio::test]
async fn plain_clients_whose_first_bytes_look_like_a_handshake_are_not_held() {
    let (l, addr) = echo_listener().await;
    let mut rx = serve_echo(l);
    let held_before = smc_tokio::stats().partial_waits;
    for first in [&[0xE2u8][..], &[0xE2, 0xD4, 0xC3][..], b"A"] {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let t = std::time::Instant::now();
        c.write_all(first).await.unwrap();
        let mut back = vec![0u8; first.len()];
        bounded(10, c.read_exact(&mut back)).await.unwrap();
        eprintln!("first bytes {first:02x?}: echo after {:?}", t.elapsed());
        assert_eq!(back, first);
        assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::Tcp(FallbackReason::PeerNoSmc));
    }
    assert_eq!(smc_tokio::stats().partial_waits, held_before, "a same-host plain client waited for a timer");
}

/// Every "no SMC" a door answers is counted, whichever path refused: here a listener with one
/// A client opens one door connection per listener and runtime, however many connections it
/// makes through it, concurrent or one after another; a second runtime gets its own. What the
/// connections of one turn of the runtime say goes out together: one after another, each
/// frame is a message of its own; at once, the twenty registrations (and the listener's
/// answers to them) share messages.
#[tokio::test]
async fn one_door_connection_carries_every_registration_of_a_runtime() {
    let server = smc_tokio::Context::new();
    let l = SmcListener::builder().context(&server).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut rx = serve_echo(l);
    let client = smc_tokio::Context::new();
    for i in 0..20 {
        let s = bounded(10, SmcStream::builder().context(&client).connect(addr)).await.unwrap();
        assert_eq!(s.transport(), Transport::SmcD);
        bounded(10, echo_check(s, b"one after another", 4, i)).await;
    }
    let (alone, answers) = (client.stats(), server.stats());
    // A Register and a Connected frame (with the Confirm) per connection; an Accept and a
    // Commit back. (A connect whose four-tuple was taken, EADDRNOTAVAIL, registers again, with
    // a Cancel for the first: counted as frames too, never fewer.)
    assert!(alone.door_frames_sent >= 40, "{} frames", alone.door_frames_sent);
    assert_eq!(alone.door_frames_sent, alone.door_messages_sent, "a frame alone is a message of its own");
    assert!(answers.door_frames_sent >= 40, "{} answers", answers.door_frames_sent);
    assert_eq!(answers.door_frames_sent, answers.door_messages_sent);
    let mut concurrent = Vec::new();
    for i in 0..20u64 {
        let b = SmcStream::builder().context(&client);
        concurrent.push(tokio::spawn(async move {
            let s = bounded(10, b.connect(addr)).await.unwrap();
            assert_eq!(s.transport(), Transport::SmcD);
            bounded(10, echo_check(s, b"at once", 4, 100 + i)).await;
        }));
    }
    for t in concurrent {
        t.await.unwrap();
    }
    for _ in 0..40 {
        assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::SmcD);
    }
    let st = client.stats();
    // 40, or a few more when a connect found its four-tuple taken (see above).
    assert!((40..=44).contains(&st.door[0]), "{} registrations", st.door[0]);
    assert_eq!(st.door_connections, 1, "door connections for 40 registrations");
    let frames = st.door_frames_sent - alone.door_frames_sent;
    let messages = st.door_messages_sent - alone.door_messages_sent;
    assert!(frames >= 40, "{frames} frames");
    assert!(messages < frames, "20 connections at once sent {frames} door frames in {messages} messages");
    let sv = server.stats();
    let frames = sv.door_frames_sent - answers.door_frames_sent;
    let messages = sv.door_messages_sent - answers.door_messages_sent;
    assert!(frames >= 40, "{frames} answers");
    assert!(messages < frames, "the listener answered 20 connections in {messages} messages");
    // Another runtime (on another thread) opens its own; this one keeps serving meanwhile.
    let c2 = client.clone();
    let other = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let s = bounded(10, SmcStream::builder().context(&c2).connect(addr)).await.unwrap();
            assert_eq!(s.transport(), Transport::SmcD);
            bounded(10, echo_check(s, b"from another runtime", 4, 999)).await;
        });
    });
    bounded(20, other).await.unwrap();
    assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::SmcD);
    assert_eq!(client.stats().door_connections, 2);
}

/// handshake place (`limit_handshake`), held by a stalled handshake, refuses the registered
/// connections that come meanwhile, and each refusal shows as a door "no smc" and a decline
/// sent for congestion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_refusal_is_counted() {
    let (l, addr) = echo_listener().await;
    l.set_limit_handshake(true);
    l.set_max_pending_handshakes(1);
    // The one place, held by a stall that outlasts the refusals below however slowly they
    // run (its client waits as long, so that nothing gives the place up meanwhile).
    faults::inject(addr, Point::ServerBeforeAccept, Duration::from_secs(60));
    let mut rx = serve_echo(l);
    let first = tokio::spawn(async move {
        let builder = SmcStream::builder().handshake_timeout(Duration::from_secs(60));
        builder.connect(addr).await
    });
    stalled_at(addr, Point::ServerBeforeAccept).await;
    let before = smc_tokio::stats();
    let congested = DeclineReason::HandshakeCongested as usize - 1;
    for i in 0..5 {
        let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
        assert_eq!(s.transport(), declined(DeclineReason::HandshakeCongested, Side::Peer));
        assert_eq!(bounded(10, rx.recv()).await.unwrap(), declined(DeclineReason::HandshakeCongested, Side::Local));
        bounded(10, echo_check(s, b"refused but served", 8, i)).await;
    }
    let after = smc_tokio::stats();
    assert!(after.door[2] >= before.door[2] + 5, "door no-smc: {} -> {}", before.door[2], after.door[2]);
    assert!(
        after.declines_sent[congested] >= before.declines_sent[congested] + 5,
        "declines sent (congested): {} -> {}",
        before.declines_sent[congested],
        after.declines_sent[congested]
    );
    // With `limit_handshake` off the connection waits for a place instead, in a queue as long
    // as the places; beyond it the registration is refused, and that is counted too (it was
    // not: only the congested answer was). The connection is served as TCP, as its client was
    // told to use it (it was closed).
    faults::clear(addr);
    let (l, addr) = echo_listener().await;
    l.set_limit_handshake(false);
    l.set_max_pending_handshakes(1);
    faults::inject(addr, Point::ServerBeforeAccept, Duration::from_secs(60));
    let _rx = serve_echo(l);
    // The clients of this part share a context of their own: their registrations go, in the
    // order they are made, on one door connection, and its counters tell when each was made.
    let cctx = smc_tokio::Context::new();
    let patient = |ctx: smc_tokio::Context| async move {
        let builder = SmcStream::builder().context(&ctx).handshake_timeout(Duration::from_secs(60));
        builder.connect(addr).await
    };
    let held = tokio::spawn(patient(cctx.clone()));
    stalled_at(addr, Point::ServerBeforeAccept).await;
    let queued = tokio::spawn(patient(cctx.clone()));
    // Once its registration is made, the server takes it (into the queue) before the ones
    // below, which follow it on the same door connection.
    bounded(10, async {
        while cctx.stats().door[0] < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let before = smc_tokio::stats();
    for i in 0..5 {
        let s = bounded(10, SmcStream::builder().context(&cctx).connect(addr)).await.unwrap();
        assert_eq!(s.transport(), declined(DeclineReason::HandshakeCongested, Side::Peer));
        bounded(10, echo_check(s, b"queue full but served", 8, 10 + i)).await;
    }
    let after = smc_tokio::stats();
    faults::clear(addr);
    drop((first, held, queued));
    assert!(after.door[2] >= before.door[2] + 5, "door no-smc (queue full): {} -> {}", before.door[2], after.door[2]);
    assert!(after.declines_sent[congested] >= before.declines_sent[congested] + 5);
}

/// Bytes moved with `sendfile` count as bytes sent on the connection's transport, as a
/// write's do (on TCP here: a plain server).
#[tokio::test]
async fn sendfile_bytes_are_counted() {
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    let reader = tokio::spawn(async move {
        let (mut s, _) = server.accept().await.unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).await.unwrap();
        all.len()
    });
    let path = std::env::temp_dir().join(format!("smc-sendfile-count-{}", std::process::id()));
    std::fs::write(&path, vec![7u8; 100_000]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let mut c = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert!(matches!(c.transport(), Transport::Tcp(_)));
    let before = smc_tokio::stats().bytes_sent[2];
    assert_eq!(bounded(10, c.sendfile(&file, 0, 100_000)).await.unwrap(), 100_000);
    let after = smc_tokio::stats().bytes_sent[2];
    c.shutdown().await.unwrap();
    assert_eq!(bounded(10, reader).await.unwrap(), 100_000);
    std::fs::remove_file(&path).unwrap();
    assert!(after >= before + 100_000, "tcp bytes sent: {before} -> {after}");
}

/// A listener bound to the wildcard address is found at its door by a client that connects to
/// a local address of its port, on IPv4 and, where the host has it, IPv6; and a client that
/// connects again reuses what it found (its door connection).
#[tokio::test]
async fn a_wildcard_listener_is_found_through_a_local_address() {
    for (bind, dst) in [("0.0.0.0:0", "127.0.0.1"), ("[::]:0", "::1"), ("[::]:0", "127.0.0.1")] {
        let l = match SmcListener::bind(bind).await {
            Ok(l) => l,
            // No IPv6 on this host.
            Err(_) if bind.starts_with('[') => continue,
            Err(e) => panic!("bind {bind}: {e}"),
        };
        let port = l.local_addr().unwrap().port();
        let mut seen = serve_echo(l);
        let addr = SocketAddr::new(dst.parse().unwrap(), port);
        for round in 0..2 {
            let s = match SmcStream::connect(addr).await {
                Ok(s) => s,
                // A dual-stack listener is not what this host's [::] gives.
                Err(_) if bind.starts_with('[') => break,
                Err(e) => panic!("connect {addr} from {bind}: {e}"),
            };
            assert!(s.transport().is_smc(), "{bind} via {addr}, round {round}: {:?}", s.transport());
            echo_check(s, b"wildcard", 8, round).await;
            assert!(seen.recv().await.expect("accepted").is_smc());
        }
    }
}

/// Every member of a reuseport group has a door, and a client registers at each: whichever
/// member the kernel gives the connection serves it over SMC.
#[tokio::test]
async fn every_member_of_a_reuseport_group_serves_smc() {
    let first = {
        let s = smc_tokio::SmcSocket::new_v4().unwrap();
        s.set_reuseport(true).unwrap();
        s.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        s.listen(1024).unwrap()
    };
    let addr = first.local_addr().unwrap();
    let second = {
        let s = smc_tokio::SmcSocket::new_v4().unwrap();
        s.set_reuseport(true).unwrap();
        s.bind(addr).unwrap();
        s.listen(1024).unwrap()
    };
    let (mut a, mut b) = (serve_echo(first), serve_echo(second));
    for round in 0..16 {
        let s = SmcStream::connect(addr).await.unwrap();
        assert!(s.transport().is_smc(), "round {round}: {:?}", s.transport());
        echo_check(s, b"group", 5, round).await;
        let t = tokio::select! {
            t = a.recv() => t,
            t = b.recv() => t,
        };
        assert!(t.expect("accepted").is_smc());
    }
}

/// Connections that a listener took in but the application never accepted are reset when the
/// listener is dropped, as the kernel resets those left in a closed listener's queue: an SMC
/// client and a plain client both read a reset, not an end, and the server gives the SMC
/// connection's slot back (its idle link group then goes).
#[tokio::test]
async fn connections_left_in_a_dropped_listeners_queue_are_reset() {
    let server_ctx = smc_tokio::Context::new();
    let shm = smc_tokio::config::ShmConfig::default().idle_timeout(Duration::from_millis(100));
    let l = SmcListener::builder().context(&server_ctx).shm(shm).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut smc = SmcStream::connect(addr).await.unwrap();
    assert!(smc.transport().is_smc(), "{}", smc.transport());
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    // Both in the listener's own queue before it goes.
    bounded(10, async {
        loop {
            let s = server_ctx.stats().server;
            if s.smc_d == 1 && s.tcp == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    drop(l);
    let mut b = [0u8; 8];
    let e = bounded(10, smc.read(&mut b)).await.expect_err("smc client read an end, not a reset");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    let e = bounded(10, plain.read(&mut b)).await.expect_err("plain client read an end, not a reset");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    groups_end(&server_ctx).await;
}

/// A listener on a socket that has another holder (socket activation hands a service a copy,
/// pre-forked workers share one) lets go of its own descriptor when dropped, as tokio's does:
/// the socket keeps listening for the other holder, which accepts the next connection. A
/// shutdown of the socket stopped it listening for every holder.
#[tokio::test]
async fn a_dropped_listener_leaves_a_shared_socket_listening() {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    let other_holder = std_listener.try_clone().unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let l = SmcListener::from_std(std_listener).unwrap();
    let (c, s) = tokio::join!(SmcStream::connect(addr), l.accept());
    drop((c.unwrap(), s.unwrap()));
    drop(l);
    let client = bounded(10, tokio::net::TcpStream::connect(addr)).await.expect("the socket stopped listening");
    // The copy shares the descriptor's non-blocking mode, as tokio wants it.
    let other_holder = tokio::net::TcpListener::from_std(other_holder).unwrap();
    let (_, peer) = bounded(10, other_holder.accept()).await.expect("the other holder cannot accept");
    assert_eq!(peer, client.local_addr().unwrap());
}

/// A listener that holds its socket alone closes it the moment it is dropped, whoever made the
/// socket and whatever its handshakes or task still hold (they do not hold the socket): new
/// connections are refused at once and the address can be bound again, before the runtime ran
/// anything after the drop, as with tokio's listener.
#[tokio::test]
async fn a_dropped_listener_closes_a_socket_it_holds_alone_at_once() {
    for given in [false, true] {
        let l = if given {
            let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            std_listener.set_nonblocking(true).unwrap();
            SmcListener::from_std(std_listener).unwrap()
        } else {
            SmcListener::bind("127.0.0.1:0").await.unwrap()
        };
        let addr = l.local_addr().unwrap();
        let (c, s) = tokio::join!(SmcStream::connect(addr), l.accept());
        drop((c.unwrap(), s.unwrap()));
        drop(l);
        // No await between the drop and these: the task has not run since.
        let refused = std::net::TcpStream::connect(addr).map(drop).map_err(|e| e.kind());
        assert_eq!(refused, Err(std::io::ErrorKind::ConnectionRefused), "given socket: {given}");
        std::net::TcpListener::bind(addr).unwrap_or_else(|e| panic!("given socket: {given}: {e}"));
    }
}

/// A listener dropped after its handshake committed, before the Commit went out: the Commit
/// still goes (the client, confirmed, waits for the server's word), and the connection, which
/// nobody will accept, is reset as those left in a closed listener's queue are. The client
/// reads a reset, not an end, and a write of its fails; the server's link group, its slot
/// given back once the client answered the abort, ends.
#[tokio::test]
async fn a_listener_dropped_after_it_committed_resets_the_connection() {
    let server_ctx = smc_tokio::Context::new();
    let shm = smc_tokio::config::ShmConfig::default().idle_timeout(Duration::from_millis(100));
    let l = SmcListener::builder().context(&server_ctx).shm(shm).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    faults::inject(addr, Point::ServerAfterCommit, Duration::from_secs(60));
    let client = tokio::spawn(async move { SmcStream::connect(addr).await });
    stalled_at(addr, Point::ServerAfterCommit).await;
    drop(l);
    let mut s = bounded(10, client).await.unwrap().expect("connected");
    assert_eq!(s.transport(), Transport::SmcD, "the Commit was decided before the listener went");
    let mut b = [0u8; 8];
    let e = bounded(10, s.read(&mut b)).await.expect_err("the client read an end, not a reset");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert!(s.write_all(b"lost").await.is_err(), "a write into a reset connection went through");
    groups_end(&server_ctx).await;
    faults::clear(addr);
}

/// A connect cancelled after its Confirm went out (the server may have committed) tells the
/// server so: it closes the connection to the server's end before it lets its own go, and the
/// server's application reads the end of the stream, as from a TCP connect given up after the
/// connection was made. Said nothing, the server's end read the same end from the client's TCP
/// close, but its slot, the client silent, was held and then retired for the group's life; with
/// two slots a group, the client's next connection needed a new group. Here the slot comes back
/// once the server's application drops its end: the next connection joins the same group.
#[tokio::test]
async fn a_connect_cancelled_after_its_confirm_gives_the_servers_slot_back() {
    let server_ctx = smc_tokio::Context::new();
    let shm = smc_tokio::config::ShmConfig::default().rmbs_per_group(2);
    let l = SmcListener::builder().context(&server_ctx).shm(shm).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let client_ctx = smc_tokio::Context::new();
    let client = SmcStream::builder().context(&client_ctx);
    let (first, served) = tokio::join!(client.connect(addr), l.accept());
    let (first, _served) = (first.unwrap(), served.unwrap().0);
    assert_eq!(first.transport(), Transport::SmcD);
    // The second handshake stops once the server committed; the client gives up there.
    faults::inject(addr, Point::ServerAfterCommit, Duration::from_secs(60));
    let ctx = client_ctx.clone();
    let cancelled = tokio::spawn(async move { SmcStream::builder().context(&ctx).connect(addr).await });
    stalled_at(addr, Point::ServerAfterCommit).await;
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    faults::clear(addr);
    // The server's end reaches the application, which reads the end and drops it.
    let (mut orphan, _) = bounded(10, l.accept()).await.unwrap();
    assert_eq!(orphan.transport(), Transport::SmcD);
    let mut b = [0u8; 8];
    let r = bounded(10, orphan.read(&mut b)).await;
    assert_eq!(r.map_err(|e| e.kind()), Ok(0), "the client's close");
    drop(orphan);
    let (next, served) = tokio::join!(client.connect(addr), l.accept());
    let (next, _served) = (next.unwrap(), served.unwrap().0);
    assert_eq!(next.transport(), Transport::SmcD);
    assert_eq!(next.link_group(), first.link_group(), "the group had its slot back");
}

/// A listener whose application does not accept holds as many finished connections as its
/// backlog. A client that registers then is told at once to stay on TCP, as a kernel
/// listener's backlog takes a connection whoever accepts it later, instead of waiting for a
/// handshake that could end only once the application accepts (here, for as long as its own
/// bound: far beyond the test's).
#[tokio::test]
async fn a_client_of_a_listener_that_is_not_accepting_goes_on_as_tcp_at_once() {
    const BACKLOG: u32 = 4;
    let ctx = smc_tokio::Context::new();
    let socket = smc_tokio::SmcSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let l = SmcListener::builder().context(&ctx).listen_socket(socket, BACKLOG).unwrap();
    let addr = l.local_addr().unwrap();
    let mut clients = Vec::new();
    for i in 0..BACKLOG {
        let c = bounded(10, SmcStream::connect(addr)).await.unwrap();
        assert!(c.transport().is_smc(), "client {i}: {}", c.transport());
        clients.push(c);
    }
    // Each finished connection is counted just before it is queued.
    bounded(10, async {
        while ctx.stats().server.smc_d < u64::from(BACKLOG) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let builder = SmcStream::builder().handshake_timeout(Duration::from_secs(60));
    let mut late = bounded(10, builder.connect(addr)).await.expect("the late client waited for the application");
    assert_eq!(late.transport(), declined(DeclineReason::HandshakeCongested, Side::Peer));
    // The application accepts them all, the late one as TCP, whose bytes go through.
    for _ in 0..BACKLOG {
        assert!(bounded(10, l.accept()).await.unwrap().0.transport().is_smc());
    }
    let (mut s, _) = bounded(10, l.accept()).await.unwrap();
    assert_eq!(s.transport(), declined(DeclineReason::HandshakeCongested, Side::Local));
    late.write_all(b"ping").await.unwrap();
    let mut b = [0u8; 4];
    bounded(10, s.read_exact(&mut b)).await.unwrap();
    assert_eq!(&b, b"ping");
}

/// A future that awaits a connect holds no handshake state: that state, kilobytes, is boxed
/// once where it is made, so it is neither part of the caller's task nor copied again whenever
/// the futures around it move. (tokio's own connect future is the yardstick printed.)
#[test]
fn a_connect_future_holds_no_handshake_state() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let builder = SmcStream::builder();
    let tokio = std::mem::size_of_val(&tokio::net::TcpStream::connect(addr));
    let sizes = [
        ("SmcStream::connect", std::mem::size_of_val(&SmcStream::connect(addr))),
        ("SmcStreamBuilder::connect", std::mem::size_of_val(&builder.connect(addr))),
    ];
    eprintln!("tokio's TcpStream::connect: {tokio} bytes; ours: {sizes:?}");
    for (name, size) in sizes {
        assert!(size <= 1024, "{name}'s future is {size} bytes (tokio's: {tokio})");
    }
}

/// The stats tell a handshake given up from one that failed: a connect cancelled while the
/// server stalls is abandoned on both ends (the server finds the registration cancelled), and
/// one that runs out of time failed on the client, which then uses TCP.
#[tokio::test]
async fn cancelled_handshakes_are_abandoned_and_timed_out_ones_failed() {
    let ctx = smc_tokio::Context::new();
    let l = SmcListener::builder().context(&ctx).handshake_timeout(STEP * 10).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tests::spawn_echo(l);
    faults::inject(addr, Point::ServerBeforeAccept, STEP * 3);
    let settled = |ctx: smc_tokio::Context| async move {
        let t = std::time::Instant::now();
        while ctx.stats().handshakes_in_flight != 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "handshakes still in flight");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ctx.stats()
    };

    // Cancelled: the connect is dropped while it waits for the server's Accept.
    let before = ctx.stats();
    let builder = SmcStream::builder().context(&ctx).handshake_timeout(STEP * 10);
    assert!(tokio::time::timeout(STEP / 2, builder.connect(addr)).await.is_err());
    let after = settled(ctx.clone()).await;
    assert_eq!(
        (after.handshakes_abandoned - before.handshakes_abandoned, after.handshakes_failed - before.handshakes_failed),
        (2, 0),
        "{after}"
    );

    // Timed out: the client gives up after its own bound, stays on TCP, and counts a failure;
    // the server, stalled, then finds the registration cancelled.
    let before = after;
    let s = bounded(10, SmcStream::builder().context(&ctx).handshake_timeout(STEP).connect(addr)).await.unwrap();
    assert_eq!(s.transport(), declined(DeclineReason::Timeout, Side::Local));
    bounded(10, echo_check(s, b"after a timed-out handshake", 7, 1)).await;
    let after = settled(ctx.clone()).await;
    assert_eq!(
        (after.handshakes_abandoned - before.handshakes_abandoned, after.handshakes_failed - before.handshakes_failed),
        (1, 1),
        "{after}"
    );
    faults::clear(addr);
}

/// A client's handshake place (`limit_handshake`) is held for the handshake, not while a TCP
/// connection is made before it (in-band) or without one (plain): a connect that waits out SYN
/// retransmissions (a host that is down, here a server whose accept queue is full, whose
/// kernel drops further SYNs) does not send the client's other connections to TCP. It held the
/// client's only place before, and a connection to a listener on this host went plain as
/// congested.
#[tokio::test]
async fn a_connect_waiting_for_its_syn_answer_holds_no_handshake_place() {
    // A plain server that never accepts: its queue fills, then SYNs go unanswered.
    let full = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    full.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
    full.listen(0).unwrap();
    let full_addr = full.local_addr().unwrap().as_socket().unwrap();
    let mut queued = Vec::new();
    loop {
        assert!(queued.len() < 16, "the accept queue never filled");
        match tokio::time::timeout(STEP, tokio::net::TcpStream::connect(full_addr)).await {
            Ok(c) => queued.push(c.unwrap()),
            Err(_) => break,
        }
    }
    let (l, addr) = echo_listener().await;
    let rx = serve_echo(l);
    // In-band to every destination (the connect to the full server is one of SMC's, made
    // before its handshake), and the default (that server has no door and is not in-band: a
    // plain connect, with no handshake at all).
    for policy in [smc_tokio::config::Policy::Always, smc_tokio::config::Policy::Auto] {
        let ctx = smc_tokio::Context::new();
        let client = SmcStream::builder().context(&ctx).policy(policy).limit_handshake(true).max_pending_handshakes(1);
        let stuck = {
            let client = client.clone();
            tokio::spawn(async move { client.connect(full_addr).await })
        };
        // Past its door look-up (none) and into its connect.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!stuck.is_finished(), "{policy:?}: the connect to the full server did not wait");
        let c = bounded(10, client.connect(addr)).await.unwrap();
        assert_eq!(c.transport(), Transport::SmcD, "{policy:?}: the waiting connect held the only handshake place");
        bounded(10, echo_check(c, b"smc", 1, 1)).await;
        stuck.abort();
    }
    drop((rx, queued));
}
