//! Handshake hostility from clients that registered at the door (so the listener runs a
//! handshake for them on the door connection) and from ones that did not (so their bytes are the
//! application's): trickled and cut-off proposals, garbage, clients that go silent. The listener
//! frees every slot, serves what it can as TCP with the bytes intact, and keeps serving.

#[path = "support/hostile.rs"]
mod hostile;

use std::time::{Duration, Instant};

use smc_tokio::proto::clc::{ClcMessage, Proposal, Secret};
use smc_tokio::{FallbackReason, SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn proposal() -> Vec<u8> {
    ClcMessage::Proposal(Proposal { secret: Secret([1; 16]), rmb_size: 0, shm: None, rdma: None }).encode().unwrap()
}

async fn wait_idle(l: &SmcListener) {
    let t = Instant::now();
    while l.pending_handshakes() != 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "{} handshakes still pending", l.pending_handshakes());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_whole_proposal_on_a_plain_connection_is_answered_and_a_trickled_one_is_data() {
    // Not registered, so in-band: the connection is the application's at once. A proposal
    // written whole (as every smc-tokio client writes one) is taken off the stream and
    // declined; one trickled a byte at a time from this host is no client of ours (nothing
    // splits a same-host segment): its bytes are the application's, at once, with no timer.
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let p = proposal();
    let expect = p.clone();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        assert_eq!(s.transport(), Transport::Tcp(FallbackReason::PeerNoSmc));
        let mut b = [0u8; 5];
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"after", "the whole proposal never reaches the application");
        s.write_all(b"ok").await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        let mut got = vec![0u8; expect.len()];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(got, expect, "the trickled bytes reach the application as they were sent");
        s.write_all(b"ok").await.unwrap();
    });
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&p).await.unwrap();
    let mut reply = vec![0u8; smc_tokio::proto::clc::CLC_HEADER_LEN];
    bounded(10, c.read_exact(&mut reply)).await.unwrap();
    assert_eq!(reply[..4], smc_tokio::proto::clc::CLC_EYECATCHER, "a decline comes back");
    let total = u16::from_be_bytes([reply[6], reply[7]]) as usize;
    reply.resize(total, 0);
    bounded(10, c.read_exact(&mut reply[smc_tokio::proto::clc::CLC_HEADER_LEN..])).await.unwrap();
    c.write_all(b"after").await.unwrap();
    let mut ok = [0u8; 2];
    bounded(10, c.read_exact(&mut ok)).await.unwrap();

    let held = smc_tokio::stats().partial_waits;
    let mut c = TcpStream::connect(addr).await.unwrap();
    for b in p {
        c.write_all(&[b]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut ok = [0u8; 2];
    bounded(10, c.read_exact(&mut ok)).await.unwrap();
    assert_eq!(&ok, b"ok", "no decline: the application answered");
    bounded(10, server).await.unwrap();
    assert_eq!(smc_tokio::stats().partial_waits, held, "a same-host client waited for a timer");
}

#[tokio::test]
async fn cut_off_and_garbage_proposals_at_the_door_end_in_tcp_and_free_their_slots() {
    // Short enough that the cut-off proposals time out soon, long enough that the SMC client
    // below is not cut off by a busy machine.
    let l = SmcListener::builder().handshake_timeout(Duration::from_secs(3)).bind("127.0.0.1:0").await.unwrap();
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
    let mut cases: Vec<Vec<u8>> = [1, 4, 8, 12, p.len() - 1].iter().map(|&k| p[..k].to_vec()).collect();
    cases.push(b"GET / HTTP/1.1\r\n\r\n".to_vec());
    let mut wrong_version = p.clone();
    wrong_version[4] ^= 0x7f;
    cases.push(wrong_version);
    let mut tasks = Vec::new();
    for (i, bad) in cases.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            // Registered with a broken proposal: whatever the listener makes of it, the TCP stream
            // carried none of it, so the connection ends as TCP with its bytes.
            let (c, door) = hostile::register_and_connect(addr, 2 + i as u64, &bad).await.unwrap();
            let msg = format!("case {i} still echoes");
            bounded(10, echo_check(c, msg.as_bytes(), 4, i as u64)).await;
            drop(door);
        }));
    }
    for t in tasks {
        bounded(20, t).await.unwrap();
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
    tests::raise_fd_limit();
    const PLAIN: usize = 300;
    const REGISTERED: usize = 100;
    let l = SmcListener::builder()
        .peek_timeout(Duration::from_secs(3600))
        // Short enough that the silent registered clients time out soon, long enough that the
        // SMC client below is not cut off by a busy machine.
        .handshake_timeout(Duration::from_secs(3))
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
    // once, with no peek. Registered clients that never answer the Accept hold a handshake slot
    // until it times out.
    let mut silent = Vec::new();
    for _ in 0..PLAIN {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut registered = Vec::new();
    for _ in 0..REGISTERED {
        registered.push(hostile::register_and_connect(addr, 1000, &hostile::shm_proposal(64 << 10)).await.unwrap());
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
            // Every failed connect names its cause (EMFILE); every connection that stayed on
            // TCP says it was for want of resources, not "internal error" or "no listener".
            for e in text.lines().filter(|l| l.starts_with("ERR")) {
                assert!(e.contains("os error 24"), "{text}");
            }
            for c in text.lines().filter(|l| l.starts_with("CONN") && l.contains(" tcp ")) {
                assert!(c.contains("(declined locally: out of memory or descriptors) write_ok=true"), "{text}");
            }
            text
        }
    };
    // Room for a link group (it needs six descriptors while it is set up, by hand: 6 is the
    // least that works; 12 leaves slack for the runtime): the first connections use shared
    // memory, later ones reuse it until no descriptor is left for their TCP socket.
    let text = run("12").await;
    assert!(text.contains("CONN 0 smc-d write_ok=true"), "{text}");
    assert!(text.contains("Too many open files"), "the run reached the limit: {text}");
    // No room for a link group: the connection stays on TCP, declined locally, and works.
    let text = run("2").await;
    assert!(text.contains("CONN 0 tcp (declined locally:") && text.contains("write_ok=true"), "{text}");
}

/// A registration proves nothing once its socket is closed: a later connection from the same
/// port (here a plain client's, another socket with another cookie) is served as plain TCP at
/// once, and the door connection that registered hears nothing of it.
#[tokio::test]
async fn a_registration_whose_socket_was_closed_matches_no_later_connection() {
    use std::os::fd::AsFd;
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = tx.send(s.transport());
            tokio::spawn(async move {
                let (mut rd, mut wr) = s.into_split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
            });
        }
    });
    let (door, port) = tokio::task::spawn_blocking(move || {
        let door = hostile::side_connect(&hostile::door_name(addr)).unwrap();
        let sock = hostile::bound_tcp_socket();
        let port = hostile::bound_port(sock.as_fd());
        let frame = hostile::register_frame(sock.as_fd(), 77, &hostile::shm_proposal(64 << 10));
        hostile::send_fds(door.as_fd(), &frame, &[]).unwrap();
        // The socket goes; the registration (and its door connection) stays.
        drop(sock);
        (door, port)
    })
    .await
    .unwrap();
    // Give the listener time to take the registration in before the connection arrives.
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A plain client on the registered port.
    let plain = tokio::task::spawn_blocking(move || {
        let fd = hostile::tcp_socket_bound_to(port).expect("bind to the registered port");
        hostile::connect_v4(fd.as_fd(), addr).unwrap();
        std::net::TcpStream::from(fd)
    })
    .await
    .unwrap();
    plain.set_nonblocking(true).unwrap();
    let plain = TcpStream::from_std(plain).unwrap();
    assert_eq!(bounded(10, rx.recv()).await.unwrap(), Transport::Tcp(FallbackReason::PeerNoSmc));
    bounded(10, echo_check(plain, b"mine, not the registrant's", 7, 1)).await;
    // The registrant heard nothing of that connection: at most the Accept of its own proposal
    // (a solo door answers registrations at once), never a Commit.
    loop {
        match hostile::recv_now(door.as_fd()) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Ok(m) => {
                for (frame, payload) in smc_tokio::proto::door::frames(&m).unwrap() {
                    assert_eq!(frame.kind, smc_tokio::proto::door::DoorKind::Clc, "{m:?}");
                    let got = smc_tokio::proto::clc::decode(payload).unwrap();
                    assert!(
                        matches!(
                            got,
                            smc_tokio::proto::clc::Decoded::Message(smc_tokio::proto::clc::ClcMessage::Accept(_), _)
                        ),
                        "the door said {got:?}"
                    );
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Descriptors that come through the door (none belongs there) are closed off the runtime:
/// sockets whose close would block (see `hostile::lingering_socket`), one sent with a
/// registration and one queued unread in a door connection the listener drops, do not stall the
/// listener. On a current-thread runtime, a close on the runtime thread would stop everything,
/// the test's own timers included, for the linger time.
/// Lets go of our copy of a lingering socket: as it is when the listener holds another (`sent`);
/// else (the kernel refused it) with its linger off first, or this thread would wait out the
/// linger in its close.
fn release(s: std::os::fd::OwnedFd, sent: bool) {
    if !sent {
        socket2::SockRef::from(&s).set_linger(None).unwrap();
    }
    drop(s);
}

#[tokio::test(flavor = "current_thread")]
async fn sockets_that_block_on_close_do_not_stall_the_listener() {
    use std::os::fd::{AsFd, AsRawFd};
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tests::spawn_echo(l);
    let (door, knock, sinks) = tokio::task::spawn_blocking(move || {
        let (a, sink_a) = hostile::lingering_socket();
        let (b, sink_b) = hostile::lingering_socket();
        // Sent with a registration, then our copy closed: the listener holds the last reference
        // (unless the kernel refused it), and lets it go at once.
        let door = hostile::side_connect(&hostile::door_name(addr)).unwrap();
        // A registration with a descriptor attached (none belongs there): taken out and closed
        // off the runtime, whether or not the kernel refuses it first.
        let frame = hostile::register_frame(a.as_fd(), 78, &hostile::shm_proposal(64 << 10));
        let sent_a = hostile::send_fds(door.as_fd(), &frame, &[a.as_raw_fd()]).is_ok();
        release(a, sent_a);
        // Sent with garbage: the listener drops the knock and what came with it (where the
        // kernel lets the door refuse descriptors, the send fails and nothing comes).
        let knock = hostile::side_connect(&hostile::door_name(addr)).unwrap();
        let sent_b = hostile::send_fds(knock.as_fd(), b"garbage", &[b.as_raw_fd()]).is_ok();
        release(b, sent_b);
        (door, knock, (sink_a, sink_b))
    })
    .await
    .unwrap();
    drop(door);
    // The listener sweeps the cancelled registration (within 100 ms) and drops the garbage
    // knock; meanwhile and after, it serves. A blocked runtime thread blocks tokio's timers
    // too (a `timeout` whose future is ready when it is next polled reports success however
    // late), so the stall is caught with the wall clock: a hang detector with the linger time
    // as its scale, not a performance bound.
    let start = std::time::Instant::now();
    for i in 0..20 {
        let c = bounded(10, TcpStream::connect(addr)).await.unwrap();
        bounded(10, echo_check(c, b"still serving", 3, i)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(start.elapsed() < Duration::from_secs(30), "the runtime stalled for {:?}", start.elapsed());
    drop((knock, sinks));
}

/// Anybody may bind the door name of a wildcard listener's specific address (`127.0.0.1:P`
/// for a listener on `0.0.0.0:P`) and fill its queue: a client that found that door busy gave
/// up its look-up, and every same-host client of the listener went to TCP as "congested".
/// The kernel hands such a connection to the wildcard listener, so a busy door at the specific
/// name is nobody's to honour: the client goes on to the wildcard's door.
#[tokio::test]
async fn a_full_queue_at_a_squatted_door_name_sends_no_client_to_tcp() {
    let l = SmcListener::bind("0.0.0.0:0").await.unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], l.local_addr().unwrap().port()));
    let _squat = hostile::full_queue_at(&hostile::door_name(addr));
    let server = tests::spawn_echo(l);
    let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD, "the squatter's full queue kept the client off its listener's door");
    bounded(10, echo_check(s, &tests::pattern(4096), 512, 1)).await;
    server.abort();
}

/// The test peer, which squats on names as another uid.
const PEER: &str = env!("CARGO_BIN_EXE_smc-test-peer");
/// A stranger's uid: an ordinary one, not the overflow id.
const STRANGER: u32 = 4242;

/// Anybody may bind the door name after a reuseport group's last member (the next index) and
/// fill its queue: a client that found that door busy gave up its look-up at every member, and
/// every same-host client of the group went to TCP as "congested". A full door is now judged
/// by its owner, as a door that answers is: one owned by a uid the client does not trust is no
/// door of its listener's. The owner comes from the kernel's list of sockets, read off the
/// client's thread once a client asks: the first client may find the door busy, those after it
/// within a moment pass it over.
#[tokio::test]
async fn a_strangers_full_queue_after_a_reuseport_group_sends_no_client_to_tcp() {
    if !tests::require_root("a_strangers_full_queue_after_a_reuseport_group_sends_no_client_to_tcp") {
        return;
    }
    let member = |addr: std::net::SocketAddr| {
        let s = smc_tokio::SmcSocket::new_v4().unwrap();
        s.set_reuseport(true).unwrap();
        s.bind(addr).unwrap();
        s.listen(1024).unwrap()
    };
    let first = member("127.0.0.1:0".parse().unwrap());
    let addr = first.local_addr().unwrap();
    let second = member(addr);
    let _squat = hostile::squat_as(PEER, &hostile::group_door_name(addr, 2), STRANGER, false);
    let servers = [tests::spawn_echo(first), tests::spawn_echo(second)];
    let start = Instant::now();
    loop {
        let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
        if s.transport() == Transport::SmcD {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the stranger's full queue kept sending clients to TCP");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for round in 0..4 {
        let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
        assert_eq!(s.transport(), Transport::SmcD, "round {round}: the stranger's full queue sent the client to TCP");
        bounded(10, echo_check(s, &tests::pattern(4096), 512, round)).await;
    }
    for s in servers {
        s.abort();
    }
}

/// A full door that the client's own uid owns is still busy: its listener may be swamped, and
/// the connection may land there, so the client does not register at the others (TCP, as
/// "congested"), in every connect over the time the kernel's list is read again. Only a
/// stranger's full queue is passed over; a stranger's stream socket bound to the same name (an
/// abstract name is one per socket type) does not make the door its.
#[tokio::test]
async fn a_full_queue_of_our_own_uid_still_means_busy() {
    if !tests::require_root("a_full_queue_of_our_own_uid_still_means_busy") {
        return;
    }
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    // A door of our uid at the listener's name, filled: what a swamped listener looks like.
    let _full = hostile::full_queue_at(&hostile::door_name(addr));
    let _stream = hostile::squat_as(PEER, &hostile::door_name(addr), STRANGER, true);
    let accept = tokio::spawn(async move {
        loop {
            let _ = l.accept().await;
        }
    });
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
        assert!(
            matches!(
                s.transport(),
                Transport::Tcp(FallbackReason::Declined { reason: smc_tokio::DeclineReason::HandshakeCongested, .. })
            ),
            "{:?}",
            s.transport()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    accept.abort();
}
