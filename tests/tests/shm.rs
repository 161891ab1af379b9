//! SMC-D over shared memory: every test asserts the transport it meant to test (a test that
//! silently fell back to TCP proves nothing).

use std::process::Stdio;
use std::time::{Duration, Instant};

#[path = "support/hostile.rs"]
mod hostile;

use smc_tokio::config::ShmConfig;
use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, spawn_echo, Rng};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

async fn echo_server() -> std::net::SocketAddr {
    // Room for every handshake of the 1000-connection test: these tests want shared memory for
    // all (the handshake limit has tests of its own).
    let l = SmcListener::builder().max_pending_handshakes(4096).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);
    addr
}

async fn smc(addr: std::net::SocketAddr) -> SmcStream {
    let s = bounded(10, SmcStream::builder().max_pending_handshakes(4096).connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD, "expected shared memory");
    s
}

/// `n` concurrent connections to one server, each echoing `bytes` with random write and read
/// sizes; all on one link group.
async fn integrity(n: usize, bytes: usize, max_io: usize) {
    let addr = echo_server().await;
    let first = smc(addr).await;
    let group = first.link_group().expect("link group");
    let mut tasks = Vec::new();
    for i in 0..n as u64 {
        tasks.push(tokio::spawn(async move {
            let s = smc(addr).await;
            assert_eq!(s.link_group(), Some(group), "connections share one link group");
            let data = Rng::new(i + 1).bytes(bytes);
            echo_check(s, &data, max_io, i).await;
        }));
    }
    for t in tasks {
        bounded(120, t).await.unwrap();
    }
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_one_connection_random_sizes() {
    integrity(1, 16 << 20, 1 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_100_connections() {
    integrity(100, 256 << 10, 70_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_1000_connections_one_link_group() {
    tests::raise_fd_limit();
    integrity(1000, 16 << 10, 5000).await;
}

#[tokio::test]
async fn integrity_current_thread_tiny_ring() {
    // A 4 KiB ring forces wrap-around, blocking and consumer updates on every few writes.
    let l = SmcListener::builder().shm(ShmConfig::default().rmb_size(4096)).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);
    let s = bounded(10, SmcStream::builder().shm(ShmConfig::default().rmb_size(4096)).connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD);
    let data = Rng::new(77).bytes(2 << 20);
    bounded(60, echo_check(s, &data, 9000, 77)).await;
}

#[tokio::test]
async fn vectored_and_split_halves() {
    let addr = echo_server().await;
    let mut s = smc(addr).await;
    let bufs = [std::io::IoSlice::new(b"vec"), std::io::IoSlice::new(b""), std::io::IoSlice::new(b"tored")];
    assert_eq!(s.write_vectored(&bufs).await.unwrap(), 8);
    let mut got = [0u8; 8];
    bounded(10, s.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"vectored");
    let (mut rd, mut wr) = s.into_split();
    assert_eq!(rd.transport(), Transport::SmcD);
    wr.write_all(b"owned").await.unwrap();
    let mut got = [0u8; 5];
    bounded(10, rd.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"owned");
    let s = rd.reunite(wr).unwrap();
    bounded(10, echo_check(s, b"reunited", 3, 1)).await;
}

#[tokio::test]
async fn half_close_close_and_abort_match_tcp() {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        // 1: half-close. The server reads to EOF, then answers.
        let (mut c, _) = l.accept().await.unwrap();
        assert_eq!(c.transport(), Transport::SmcD);
        let mut req = Vec::new();
        c.read_to_end(&mut req).await.unwrap();
        c.write_all(&req).await.unwrap();
        c.write_all(b"+reply").await.unwrap();
        drop(c); // close
                 // 2: abort. Dropping with unread data resets, as TCP does.
        let (mut c, _) = l.accept().await.unwrap();
        let mut one = [0u8; 1];
        c.read_exact(&mut one).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await; // more data arrives, unread
        drop(c);
    });
    let mut s = smc(addr).await;
    s.write_all(b"req").await.unwrap();
    s.shutdown().await.unwrap();
    let mut resp = Vec::new();
    bounded(10, s.read_to_end(&mut resp)).await.unwrap();
    assert_eq!(resp, b"req+reply");
    assert!(s.write_all(b"x").await.is_err(), "write after shutdown fails");

    let mut s = smc(addr).await;
    s.write_all(b"abcdef").await.unwrap();
    let mut b = [0u8; 1];
    let err = bounded(10, s.read(&mut b)).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    server.await.unwrap();
}

fn peer_binary() -> &'static str {
    env!("CARGO_BIN_EXE_smc-test-peer")
}

async fn spawn_peer(mode: &str) -> (tokio::process::Child, std::net::SocketAddr) {
    let mut child = tokio::process::Command::new(peer_binary())
        .arg(mode)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = bounded(10, lines.next_line()).await.unwrap().unwrap();
    let port: u16 = line.strip_prefix("PORT ").unwrap().parse().unwrap();
    (child, ([127, 0, 0, 1], port).into())
}

fn sigkill(child: &tokio::process::Child) {
    let pid = child.id().unwrap() as i32;
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
}

#[tokio::test]
async fn peer_killed_mid_stream_ends_a_pending_read() {
    let (mut child, addr) = spawn_peer("serve").await;
    let s = smc(addr).await;
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(b"ping").await.unwrap();
    let mut b = [0u8; 4];
    bounded(10, rd.read_exact(&mut b)).await.unwrap();
    let reader = tokio::spawn(async move {
        let mut b = [0u8; 1];
        rd.read(&mut b).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    sigkill(&child);
    let res = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("read still pending 10 s after SIGKILL")
        .unwrap();
    eprintln!("the pending read ended {:?} after SIGKILL", t.elapsed());
    // As over TCP, where the kernel closes a killed process's sockets: the peer had read all
    // we sent (its echo said so), so the stream ends with EOF; had it left bytes of ours
    // unread, a reset (tests/tests/peer_exit.rs).
    assert_eq!(res.unwrap(), 0, "a pending read after the peer's death ends the stream");
    let _ = child.wait().await;
    // Writes fail too.
    assert!(wr.write_all(b"x").await.is_err());
}

#[tokio::test]
async fn peer_killed_while_writer_is_blocked_fails_the_write() {
    let (mut child, addr) = spawn_peer("hold").await;
    let mut s = smc(addr).await;
    // The peer never reads: fill its ring until the writer blocks.
    let chunk = vec![7u8; 64 << 10];
    while let Ok(r) = tokio::time::timeout(Duration::from_millis(200), s.write_all(&chunk)).await {
        r.unwrap();
    }
    let writer = tokio::spawn(async move { s.write_all(&chunk).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    sigkill(&child);
    let res = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("write still pending 10 s after SIGKILL")
        .unwrap();
    eprintln!("the blocked write ended {:?} after SIGKILL", t.elapsed());
    assert!(res.is_err());
    let _ = child.wait().await;
}

#[tokio::test]
async fn cross_process_client_and_server() {
    let (mut child, addr) = spawn_peer("serve").await;
    let s = smc(addr).await;
    let data = Rng::new(5).bytes(4 << 20);
    bounded(60, echo_check(s, &data, 100_000, 5)).await;
    let out = tokio::process::Command::new(peer_binary()).args(["client", &addr.to_string()]).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("TRANSPORT smc-d") && text.contains("OK"), "{text}");
    child.kill().await.unwrap();
}

/// Corrupt CDC messages from a (hook-driven) hostile peer: the victim connection ends with an
/// error; the other connection on the same link group keeps every byte.
#[tokio::test]
async fn corrupt_cdc_messages_abort_only_their_connection() {
    type Corrupt = fn(&mut [u8; 64]);
    let cases: [(&str, Corrupt); 7] = [
        ("producer cursor beyond the ring", |f| f[14..18].copy_from_slice(&u32::MAX.to_be_bytes())),
        ("producer cursor a whole wrap ahead", |f| {
            let w = u16::from_be_bytes([f[12], f[13]]).wrapping_add(2);
            f[12..14].copy_from_slice(&w.to_be_bytes())
        }),
        ("producer cursor backwards", |f| {
            let w = u16::from_be_bytes([f[12], f[13]]).wrapping_sub(1);
            f[12..14].copy_from_slice(&w.to_be_bytes())
        }),
        ("consumer cursor beyond what was produced", |f| f[20..24].copy_from_slice(&1_000_000u32.to_be_bytes())),
        ("unknown flag bits", |f| f[1] = 0x80),
        ("wrong sequence number", |f| {
            let s = u32::from_be_bytes([f[4], f[5], f[6], f[7]]).wrapping_add(5);
            f[4..8].copy_from_slice(&s.to_be_bytes())
        }),
        ("bad message type", |f| f[0] = 0),
    ];
    let addr = echo_server().await;
    let good = smc(addr).await;
    let group = good.link_group();
    let (mut good_rd, mut good_wr) = good.into_split();
    for (i, (what, corrupt)) in cases.into_iter().enumerate() {
        let mut victim = smc(addr).await;
        assert_eq!(victim.link_group(), group, "victim shares the good connection's link group");
        victim.write_all(b"before").await.unwrap();
        let mut b = [0u8; 6];
        bounded(10, victim.read_exact(&mut b)).await.unwrap();
        victim.send_corrupt_cdc(corrupt).unwrap();
        let mut buf = [0u8; 16];
        let res = bounded(10, async {
            loop {
                match victim.read(&mut buf).await {
                    Ok(0) => break Ok(0),
                    Ok(_) => continue,
                    Err(e) => break Err(e),
                }
            }
        })
        .await;
        assert!(res.is_err(), "case {what}: victim should fail, got {res:?}");
        // The other connection is untouched.
        let data = Rng::new(i as u64).bytes(100_000);
        let (w, r) = tokio::join!(good_wr.write_all(&data), async {
            let mut back = vec![0u8; data.len()];
            good_rd.read_exact(&mut back).await.map(|_| back)
        });
        w.unwrap();
        assert!(r.unwrap() == data, "case {what}: other connection corrupted");
    }
}

#[tokio::test]
async fn a_client_in_another_network_namespace_falls_back_to_tcp() {
    if !tests::require_root("a_client_in_another_network_namespace_falls_back_to_tcp") {
        return;
    }
    let other = tests::OtherHost::start();
    let (ns, here) = (other.ns.clone(), other.here);
    let l = SmcListener::bind(std::net::SocketAddr::new(here, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let t = s.transport();
        let (mut rd, mut wr) = s.into_split();
        tokio::io::copy(&mut rd, &mut wr).await.unwrap();
        t
    });
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &ns, peer_binary(), "client", &addr.to_string()])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "client in namespace failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    // Another namespace is another host: no door there, and not an in-band peer, so the
    // client does not propose at all.
    assert!(text.contains("TRANSPORT tcp (smc not proposed"), "{text}");
    assert!(text.contains("OK"), "{text}");
    let t = bounded(10, server).await.unwrap();
    assert_eq!(t, Transport::Tcp(smc_tokio::FallbackReason::PeerNoSmc), "server saw {t}");

    // Opted in (SMC_TOKIO_POLICY=always): it proposes in-band; this listener has no RDMA, so it
    // served the connection as TCP at once and answers the proposal with a decline, in step.
    let l = SmcListener::bind(std::net::SocketAddr::new(here, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let t = s.transport();
        let (mut rd, mut wr) = s.into_split();
        tokio::io::copy(&mut rd, &mut wr).await.unwrap();
        t
    });
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &ns, "env", "SMC_TOKIO_POLICY=always", peer_binary(), "client", &addr.to_string()])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "opted-in client failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("TRANSPORT tcp (declined by peer: no common transport)"), "{text}");
    assert!(text.contains("OK"), "{text}");
    assert_eq!(bounded(10, server).await.unwrap(), Transport::Tcp(smc_tokio::FallbackReason::PeerNoSmc));

    // A plain server on the other host sees exactly the client's bytes, on one connection.
    let plain = tokio::net::TcpListener::bind(std::net::SocketAddr::new(here, 0)).await.unwrap();
    let addr = plain.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut conns = Vec::new();
        loop {
            let (mut c, _) = match tokio::time::timeout(Duration::from_millis(500), plain.accept()).await {
                Ok(r) => r.unwrap(),
                Err(_) => return conns,
            };
            let mut seen = Vec::new();
            let mut b = [0u8; 8192];
            loop {
                let n = c.read(&mut b).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&b[..n]);
                c.write_all(&b[..n]).await.unwrap();
            }
            conns.push(seen);
        }
    });
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &ns, peer_binary(), "client", &addr.to_string()])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("TRANSPORT tcp (smc not proposed") && text.contains("OK"), "{text}");
    let conns = bounded(20, server).await.unwrap();
    let expected: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(conns, vec![expected], "one connection, exactly the application's bytes");
    drop(other);
}

#[tokio::test]
async fn idle_link_groups_are_torn_down_and_rebuilt() {
    let cfg = ShmConfig::default().idle_timeout(Duration::from_millis(100));
    let l = SmcListener::builder().shm(cfg.clone()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);
    let builder = SmcStream::builder().shm(cfg.clone());
    let connect = || builder.connect(addr);
    let a = bounded(10, connect()).await.unwrap();
    let b = bounded(10, connect()).await.unwrap();
    assert_eq!(a.transport(), Transport::SmcD);
    let first = a.link_group();
    assert_eq!(b.link_group(), first, "a live group is reused");
    bounded(10, echo_check(a, b"a", 1, 1)).await;
    bounded(10, echo_check(b, b"b", 1, 2)).await;
    // Idle for longer than the timeout (both sides): the next connection builds a new group.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let c = bounded(10, connect()).await.unwrap();
    assert_eq!(c.transport(), Transport::SmcD);
    assert_ne!(c.link_group(), first, "the idle group was torn down");
    bounded(10, echo_check(c, b"c", 1, 3)).await;
}

/// A connection we let go of whose peer never answers (its application holds the stream and
/// neither reads nor closes it, as a stopped process would) is forgotten once the peer has been
/// silent for the TCP socket's `TCP_LINGER2`, as the kernel forgets an orphaned TCP socket
/// whose peer does not close: the link group, left with nothing, goes idle and its memory comes
/// back, and the peer still reads the end when it comes to it. (It held the connection, its
/// ring and its group for as long as the peer lived.) A peer that is slow but reads is not
/// silent: it gets every byte.
#[tokio::test]
async fn a_close_the_peer_never_answers_ends_after_the_sockets_linger2() {
    use std::os::fd::AsFd;
    let cfg = ShmConfig::default().idle_timeout(Duration::from_millis(100)).rmb_size(64 << 10).rmb_max(64 << 10);
    let (server_ctx, client_ctx) = (smc_tokio::Context::new(), smc_tokio::Context::new());
    let l = SmcListener::builder().context(&server_ctx).shm(cfg.clone()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let linger2 = |s: &SmcStream, secs| hostile::set_int_opt(s.as_fd(), libc::IPPROTO_TCP, libc::TCP_LINGER2, secs);

    // A slow reader first: 96 KiB written into a 64 KiB ring, the last 64 KiB of it left to
    // the peer when we let go; it reads them 4 KiB at a time, for longer than the linger (2 s),
    // and gets all of it and the end.
    let mut c = bounded(10, SmcStream::builder().context(&client_ctx).shm(cfg.clone()).connect(addr)).await.unwrap();
    let (mut s, _) = bounded(10, l.accept()).await.unwrap();
    assert_eq!(c.transport(), Transport::SmcD);
    linger2(&c, 2);
    let data: Vec<u8> = (0..96u32 << 10).map(|i| (i % 251) as u8).collect();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        c.write_all(&sent).await.unwrap();
        drop(c);
    });
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut released = None;
    loop {
        let n = bounded(10, s.read(&mut buf)).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if released.is_none() && writer.is_finished() {
            released = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    bounded(10, writer).await.unwrap();
    let read_after = released.map(|r| r.elapsed()).unwrap_or_default();
    assert!(
        read_after >= Duration::from_secs(2),
        "not slower than the linger: read for {read_after:?} after the release"
    );
    assert!(got == data, "a slow reader lost bytes: {} of {}", got.len(), data.len());
    drop(s);

    // A silent peer: it holds its end and never reads nor closes.
    let c = bounded(10, SmcStream::builder().context(&client_ctx).shm(cfg.clone()).connect(addr)).await.unwrap();
    let (mut s, _) = bounded(10, l.accept()).await.unwrap();
    assert_eq!(c.transport(), Transport::SmcD);
    assert!(client_ctx.stats().link_groups > 0);
    linger2(&c, 1);
    drop(c);
    let gone = Instant::now();
    loop {
        let st = client_ctx.stats();
        if st.link_groups == 0 && st.rmb_bytes == 0 {
            break;
        }
        assert!(gone.elapsed() < Duration::from_secs(10), "the group of the unanswered close still lives: {st}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone.elapsed() >= Duration::from_millis(900), "ended before the linger: {:?}", gone.elapsed());
    // The peer reads our close, as it would have from TCP (nothing was sent after it), and its
    // writes fail (our close was a full one).
    assert_eq!(bounded(10, s.read(&mut [0u8; 8])).await.unwrap(), 0, "the peer did not read the end");
    assert!(s.write_all(b"anyone?").await.is_err(), "the peer's write went somewhere");
}

#[tokio::test]
async fn adaptive_fallback_stops_proposing_to_a_server_of_short_connections() {
    // A context of its own: the server's address goes into the context's negative cache, and
    // in the shared one it would send the clients of another test's listener that later gets
    // the same port to TCP.
    let ctx = smc_tokio::Context::new();
    let l = SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);
    let builder = SmcStream::builder().context(&ctx).adaptive_min_bytes(1000);
    let before = ctx.stats().adaptive_fallbacks;
    for _ in 0..smc_tokio::config::ADAPTIVE_STRIKES {
        let s = bounded(10, builder.connect(addr)).await.unwrap();
        assert_eq!(s.transport(), Transport::SmcD);
        bounded(10, echo_check(s, b"short", 5, 1)).await;
    }
    let s = bounded(10, builder.connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::Tcp(smc_tokio::FallbackReason::NegativeCache));
    assert!(ctx.stats().adaptive_fallbacks > before);
    bounded(10, echo_check(s, b"served over tcp", 5, 2)).await;
}

/// Any number of tasks may wait for an SMC stream's readiness at once, as for tokio's streams,
/// and each is woken: three tasks awaiting `readable()` on one stream, and a read on an owned
/// read half beside a `ready(READABLE)` on its write half. (One waker per direction, which the
/// `poll_*_ready` methods keep, woke only the last task to wait; the others slept on with bytes
/// waiting.)
#[tokio::test]
async fn every_task_waiting_for_readiness_is_woken() {
    use std::sync::Arc;
    use tokio::io::Interest;

    // Adaptive polling off: a task that finds nothing sleeps on its waker at once, instead of
    // waking itself to look again.
    let (mut c, s) = tests::smc_pair(ShmConfig::default().adaptive_poll(Duration::ZERO)).await;
    assert_eq!((c.transport(), s.transport()), (Transport::SmcD, Transport::SmcD));
    // A new stream counts as readable until a read finds nothing.
    let mut b = [0u8; 1];
    assert_eq!(s.try_read(&mut b).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    let s = Arc::new(s);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.readable().await.unwrap() })
        })
        .collect();
    // Every task waits.
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.write_all(b"x").await.unwrap();
    for w in waiters {
        bounded(10, w).await.unwrap();
    }
    assert_eq!(s.try_read(&mut b).unwrap(), 1);

    let s = Arc::into_inner(s).unwrap();
    let (mut rd, wr) = s.into_split();
    let reader = tokio::spawn(async move {
        let mut b = [0u8; 1];
        rd.read_exact(&mut b).await.unwrap();
        b
    });
    let watcher = tokio::spawn(async move { wr.ready(Interest::READABLE).await.unwrap().is_readable() });
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.write_all(b"y").await.unwrap();
    assert_eq!(&bounded(10, reader).await.unwrap(), b"y");
    assert!(bounded(10, watcher).await.unwrap());
}

/// A waker that panics when woken.
struct Boom;

impl std::task::Wake for Boom {
    fn wake(self: std::sync::Arc<Self>) {
        panic!("a waker that panics (on purpose)");
    }
}

/// A waker that panics when a delivery wakes it poisons its link group's dispatch lock, and the
/// unwinding drops the rest of that batch of messages. The group then ends as if its link had
/// failed: its connections move to their TCP sockets and lose nothing. (Read as "another task
/// dispatches", the poisoned lock kept the group's driver yielding in a loop, and nothing was
/// dispatched again.)
#[tokio::test]
async fn a_panic_while_dispatching_ends_the_group_and_loses_nothing() {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Waker};
    use tokio::io::{AsyncRead, ReadBuf};

    // Adaptive polling off: the reader sleeps on its waker, and the group's driver delivers.
    let (mut c, mut s) = tests::smc_pair(ShmConfig::default().adaptive_poll(Duration::ZERO)).await;
    assert_eq!((c.transport(), s.transport()), (Transport::SmcD, Transport::SmcD));
    let waker = Waker::from(Arc::new(Boom));
    let mut cx = Context::from_waker(&waker);
    let mut buf = [0u8; 16];
    assert!(Pin::new(&mut s).poll_read(&mut cx, &mut ReadBuf::new(&mut buf)).is_pending());
    c.write_all(b"hello").await.unwrap();
    // Whoever dispatches the message wakes the waker, which panics.
    tokio::time::sleep(Duration::from_millis(100)).await;
    reads_then_both_ways_over_tcp(&mut c, &mut s, b"hello").await;
}

/// The same when the task that dispatched is not the group's driver but a reader of another
/// connection of the group, which found nothing of its own and drained the link itself: its
/// task panics and leaves the dispatch lock poisoned, and the next look at a message ends the
/// group the same way (`dispatch_panicked`), whoever looks.
#[tokio::test]
async fn a_panic_in_another_task_while_dispatching_ends_the_group_and_loses_nothing() {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Waker};
    use tokio::io::{AsyncRead, ReadBuf};

    let shm = ShmConfig::default().adaptive_poll(Duration::ZERO);
    let l = SmcListener::builder().shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let builder = SmcStream::builder().shm(shm.clone());
    let connect = || builder.connect(addr);
    let (c1, a1) = tokio::join!(connect(), l.accept());
    let (mut c1, (mut s1, _)) = (c1.unwrap(), a1.unwrap());
    let (c2, a2) = tokio::join!(connect(), l.accept());
    let (_c2, (mut s2, _)) = (c2.unwrap(), a2.unwrap());
    assert_eq!((s1.transport(), s2.transport()), (Transport::SmcD, Transport::SmcD));
    assert_eq!(s1.link_group(), s2.link_group(), "both on one group");

    let waker = Waker::from(Arc::new(Boom));
    let mut cx = Context::from_waker(&waker);
    let mut buf = [0u8; 16];
    assert!(Pin::new(&mut s1).poll_read(&mut cx, &mut ReadBuf::new(&mut buf)).is_pending());
    c1.write_all(b"hello").await.unwrap();
    // Spawned before this task yields, on this current-thread runtime: the reader runs before
    // the group's driver is told of the message, finds nothing for s2, and delivers s1's.
    let reader = tokio::spawn(async move {
        let mut b = [0u8; 1];
        let _ = s2.read(&mut b).await;
    });
    let joined = bounded(10, reader).await;
    assert!(joined.is_err_and(|e| e.is_panic()), "the other reader's task delivered the message, and panicked");

    // The next message finds the dispatch lock poisoned.
    c1.write_all(b" world").await.unwrap();
    reads_then_both_ways_over_tcp(&mut c1, &mut s1, b"hello world").await;
}

/// `s` reads `want`, which its peer `c` wrote, its link group having ended under it; then both
/// directions go on, over TCP.
async fn reads_then_both_ways_over_tcp(c: &mut SmcStream, s: &mut SmcStream, want: &[u8]) {
    let mut got = vec![0u8; want.len()];
    bounded(10, s.read_exact(&mut got)).await.unwrap();
    assert_eq!(got, want);
    assert!(matches!(s.transport(), Transport::Tcp(_)), "the group ended: {}", s.transport());
    s.write_all(b"back").await.unwrap();
    let mut back = [0u8; 4];
    bounded(10, c.read_exact(&mut back)).await.unwrap();
    assert_eq!(&back, b"back");
}

/// Two tasks peeking at an SMC-D stream, and a `poll_read_ready` caller, are all woken when
/// the peer's bytes come, and both peeks see them (tokio's `peek` wakes every peeker; the
/// `poll_*` methods keep one waker).
#[tokio::test]
async fn every_task_peeking_over_shared_memory_is_woken() {
    // No adaptive polling: a polling reader wakes itself, which would hide a lost wake.
    let shm = ShmConfig::default().adaptive_poll(Duration::ZERO);
    let listener = SmcListener::builder().shm(shm).bind("127.0.0.1:0").await.unwrap();
    let mut client = smc(listener.local_addr().unwrap()).await;
    let (server, _) = bounded(10, listener.accept()).await.unwrap();
    assert_eq!(server.transport(), Transport::SmcD);
    // Readable until a read finds nothing, as tokio's streams are.
    let e = server.try_read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    tests::every_peeker_is_woken(&server, &mut client).await;
}

/// A loop of peeks that keeps finding too few bytes yields to the runtime, as tokio's `peek`
/// does (each try spends a unit of the task's cooperative budget), so the rest of the bytes,
/// written by another task of the same one-thread runtime and taken in by the link group's
/// driver there, come in. On a thread of its own with a watchdog: a loop that never yields
/// stops that runtime's timers too.
#[test]
fn a_loop_of_peeks_yields_to_the_tasks_of_its_runtime() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let got = rt.block_on(async {
            let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
            let mut client = smc(listener.local_addr().unwrap()).await;
            let (server, _) = listener.accept().await.unwrap();
            assert_eq!(server.transport(), Transport::SmcD);
            let writer = tokio::spawn(async move {
                client.write_all(b"ab").await.unwrap();
                // The reader peeks at "ab" before "cd" is written.
                tokio::time::sleep(Duration::from_millis(20)).await;
                client.write_all(b"cd").await.unwrap();
                client
            });
            let mut hdr = [0u8; 4];
            while server.peek(&mut hdr).await.unwrap() < 4 {}
            drop(writer.await.unwrap());
            hdr
        });
        let _ = done.send(got);
    });
    let got = finished.recv_timeout(Duration::from_secs(20)).expect("the loop of peeks never let the writer run");
    assert_eq!(&got, b"abcd");
}

/// Two contexts in one process share nothing: their connections to the same server set up a
/// link group each, and each counts its own; connections of one context share its group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_contexts_set_up_separate_link_groups_to_one_server() {
    let addr = echo_server().await;
    let (a, b) = (smc_tokio::Context::new(), smc_tokio::Context::new());
    let connect = |ctx: &smc_tokio::Context| {
        let b = SmcStream::builder().context(ctx);
        async move { bounded(10, b.connect(addr)).await.unwrap() }
    };
    let (a1, a2, b1) = (connect(&a).await, connect(&a).await, connect(&b).await);
    for s in [&a1, &a2, &b1] {
        assert_eq!(s.transport(), Transport::SmcD);
    }
    assert_eq!(a1.link_group(), a2.link_group(), "one context's connections share its group");
    assert_ne!(a1.link_group(), b1.link_group(), "another context's group");
    assert_eq!((a.stats().link_groups, b.stats().link_groups), (1, 1), "each counts its own");
    for (s, what) in [(a1, "a1"), (a2, "a2"), (b1, "b1")] {
        bounded(10, echo_check(s, what.as_bytes(), 2, 3)).await;
    }
}
