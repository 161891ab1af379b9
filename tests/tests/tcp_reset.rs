//! A reset of the TCP connection under an established SMC connection. The crate keeps the TCP
//! socket open for the connection's life and a task watches it (`watch_tcp` in
//! `smc-tokio/src/net/stream.rs`): when it ends without the peer's SMC close (after every CDC
//! message the peer published was dispatched), the SMC connection ends too: reads return what
//! arrived, then a reset (or EOF, for a FIN from a peer that had read everything, as TCP would
//! say). These tests hold it to that: the reset connection ends with an error on both sides,
//! never hangs, and the other connections of the same link group keep every byte.
//!
//! The reset is made with `connect(fd, AF_UNSPEC)` on the socket (`tcp_disconnect`: an RST for
//! an established connection), which leaves the SMC connection and its descriptor alone.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::time::Duration;

use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, Rng};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

fn reset(fd: &impl AsRawFd) {
    let unspec = libc::sockaddr { sa_family: libc::AF_UNSPEC as libc::sa_family_t, sa_data: [0; 14] };
    // SAFETY: connect(2) with a valid sockaddr on an open socket.
    let r = unsafe { libc::connect(fd.as_raw_fd(), &unspec, std::mem::size_of::<libc::sockaddr>() as libc::socklen_t) };
    assert_eq!(r, 0, "connect(AF_UNSPEC): {}", std::io::Error::last_os_error());
}

/// A listener whose accepted streams are handed to the test.
async fn listener() -> (SocketAddr, mpsc::UnboundedReceiver<SmcStream>) {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = tx.send(s);
        }
    });
    (addr, rx)
}

fn echo(s: SmcStream) {
    tokio::spawn(async move {
        let (mut rd, mut wr) = s.into_split();
        let _ = tokio::io::copy(&mut rd, &mut wr).await;
        let _ = wr.shutdown().await;
    });
}

/// Reads until an error or EOF; panics if bytes arrive or it takes longer than 10 s.
async fn ends(s: &mut SmcStream, what: &str) -> std::io::Result<usize> {
    let mut b = [0u8; 64];
    let r = bounded(10, s.read(&mut b)).await;
    if let Ok(n) = r {
        assert_eq!(n, 0, "{what}: read {n} bytes from a reset connection");
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_tcp_connection_ends_its_smc_connection_and_spares_the_link_group() {
    let (addr, mut rx) = listener().await;
    let mut a = bounded(10, SmcStream::connect(addr)).await.unwrap();
    let a_srv = bounded(10, rx.recv()).await.unwrap();
    let b = bounded(10, SmcStream::connect(addr)).await.unwrap();
    echo(bounded(10, rx.recv()).await.unwrap());
    assert_eq!((a.transport(), b.transport()), (Transport::SmcD, Transport::SmcD));
    assert_eq!(a.link_group(), b.link_group(), "one link group");
    let (mut a_srv_rd, _a_srv_wr) = a_srv.into_split();
    a.write_all(b"hi").await.unwrap();
    let mut two = [0u8; 2];
    bounded(10, a_srv_rd.read_exact(&mut two)).await.unwrap();

    // The server's reader is parked on the SMC connection when the RST arrives.
    let srv_reader = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        a_srv_rd.read(&mut buf).await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    reset(&a);
    let err = bounded(10, srv_reader).await.unwrap().expect_err("the server's read must fail after an RST");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    // The client's side ends too (the server's abort arrives over the link).
    let r = ends(&mut a, "client side").await;
    assert!(r.is_err(), "client side after its own reset: {r:?}");
    assert!(a.write_all(b"x").await.is_err(), "writes fail too");

    // The other connection on the same group keeps every byte, and new ones still join it.
    let data = Rng::new(11).bytes(2 << 20);
    bounded(30, echo_check(b, &data, 100_000, 11)).await;
    let c = bounded(10, SmcStream::connect(addr)).await.unwrap();
    echo(bounded(10, rx.recv()).await.unwrap());
    assert_eq!(c.link_group(), a.link_group(), "the link group survived");
    bounded(10, echo_check(c, b"after the reset", 5, 12)).await;
}

/// The server resets while the client is blocked writing into a full ring: the blocked write
/// fails instead of waiting forever for space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_wakes_a_writer_blocked_on_a_full_ring() {
    let (addr, mut rx) = listener().await;
    let mut a = bounded(10, SmcStream::connect(addr)).await.unwrap();
    let a_srv = bounded(10, rx.recv()).await.unwrap();
    assert_eq!(a.transport(), Transport::SmcD);
    let chunk = vec![5u8; 64 << 10];
    // The server never reads: fill the ring until a write blocks.
    while let Ok(r) = tokio::time::timeout(Duration::from_millis(200), a.write_all(&chunk)).await {
        r.unwrap();
    }
    let writer = tokio::spawn(async move {
        let r = a.write_all(&chunk).await;
        (a, r)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!writer.is_finished(), "the writer is blocked on the full ring");
    reset(&a_srv);
    let (_a, r) = bounded(10, writer).await.unwrap();
    let err = r.expect_err("a blocked write must fail after the reset");
    eprintln!("blocked writer ended with: {err} ({:?})", err.kind());
    drop(a_srv);
}

/// Another process resets one of its two connections and stays alive (its link group and side
/// channel stay up): only the TCP watch can end the reset connection on our side, and it must;
/// the peer's other connection echoes 1 MiB intact meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_process_resetting_one_connection_keeps_its_other_connection() {
    let (addr, mut rx) = listener().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
        .args(["reset", &addr.to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut a_srv = bounded(10, rx.recv()).await.unwrap();
    let b_srv = bounded(10, rx.recv()).await.unwrap();
    assert_eq!((a_srv.transport(), b_srv.transport()), (Transport::SmcD, Transport::SmcD));
    assert_eq!(a_srv.link_group(), b_srv.link_group());
    echo(b_srv);
    // A: answer the peer's one byte, then wait for the reset.
    let mut one = [0u8; 1];
    bounded(10, a_srv.read_exact(&mut one)).await.unwrap();
    a_srv.write_all(&one).await.unwrap();
    let r = ends(&mut a_srv, "server side of the reset connection").await;
    let err = r.expect_err("an RST from a live peer process ends the connection with an error");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    let mut out = Vec::new();
    bounded(20, async {
        while let Some(l) = lines.next_line().await.unwrap() {
            let done = l.starts_with("A READ");
            out.push(l);
            if done {
                break;
            }
        }
    })
    .await;
    let text = out.join("\n");
    assert!(text.contains("TRANSPORT smc-d smc-d") && text.contains("RESET 0"), "{text}");
    assert!(text.contains("B OK"), "the other connection of the group echoed intact: {text}");
    assert!(text.contains("A READ Ok(Err("), "the peer's reset connection fails on its side too: {text}");
    assert!(child.try_wait().unwrap().is_none(), "the peer is still alive: its link group did not end A");
    child.kill().await.unwrap();
}

/// How the peer of an SMC stream dropped with or without a zero `SO_LINGER` sees its end:
/// `true` for an error (an abort, as TCP's reset), `false` for end of stream after the bytes.
async fn peer_sees_abort(how: &str) -> bool {
    // A context of its own: the file's other tests reset and abort connections of the global
    // one's link groups meanwhile, and this one needs its connection on shared memory.
    let ctx = smc_tokio::Context::new();
    let listener = SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await.unwrap();
    if how == "listener descriptor" {
        // Accepted sockets inherit it.
        socket2::SockRef::from(&listener).set_linger(Some(Duration::ZERO)).unwrap();
    }
    let addr = listener.local_addr().unwrap();
    let client = SmcStream::builder().context(&ctx).connect(addr).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    assert_eq!((client.transport(), server.transport()), (Transport::SmcD, Transport::SmcD), "{how}");
    let (mut dropped, mut peer) = if how == "listener descriptor" { (server, client) } else { (client, server) };
    match how {
        "stream" => dropped.set_zero_linger().unwrap(),
        "stream descriptor" => socket2::SockRef::from(&dropped).set_linger(Some(Duration::ZERO)).unwrap(),
        _ => {}
    }
    dropped.write_all(b"bytes").await.unwrap();
    let mut got = [0u8; 5];
    peer.read_exact(&mut got).await.unwrap();
    drop(dropped);
    let mut rest = Vec::new();
    match bounded(10, peer.read_to_end(&mut rest)).await {
        Ok(0) => false,
        Ok(n) => panic!("{how}: {n} bytes after the drop"),
        Err(_) => true,
    }
}

/// Dropping an SMC stream aborts it when its socket's `SO_LINGER` is zero however that was set
/// (on the stream, through its descriptor, or inherited from the listening socket), and ends it
/// in order otherwise; that the drop need not ask the kernel for the option when nobody could
/// have set it does not change what it does.
#[tokio::test]
async fn a_zero_linger_set_any_way_aborts_an_smc_stream_and_none_ends_it_in_order() {
    assert!(!peer_sees_abort("none").await, "no linger: end of stream");
    for how in ["stream", "stream descriptor", "listener descriptor"] {
        assert!(peer_sees_abort(how).await, "zero linger through the {how}: an abort");
    }
}

/// A client over SMC, and one over TCP as the reference (`Policy::TcpOnly`), to the same kind
/// of listener: (what it is, the stream, the server's end).
async fn both_transports() -> Vec<(&'static str, SmcStream, SmcStream)> {
    let mut pairs = Vec::new();
    for (what, builder) in
        [("smc", SmcStream::builder()), ("tcp", SmcStream::builder().policy(smc_tokio::Policy::TcpOnly))]
    {
        let (addr, mut rx) = listener().await;
        let client = builder.connect(addr).await.unwrap();
        let server = bounded(10, rx.recv()).await.unwrap();
        assert_eq!(client.transport().is_smc(), what == "smc", "{what}");
        pairs.push((what, client, server));
    }
    pairs
}

/// A peer that drops its stream with our bytes unread aborts (over TCP: resets) the
/// connection; what it sent before stays readable, as a TCP reset leaves the receive queue:
/// the reads return its bytes, then the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_sent_before_a_peers_abort_are_read_before_the_reset() {
    for (what, mut client, mut server) in both_transports().await {
        client.write_all(b"x").await.unwrap();
        // Arrived, and left unread.
        assert_eq!(bounded(10, server.peek(&mut [0u8; 4])).await.unwrap(), 1, "{what}");
        server.write_all(b"the answer").await.unwrap();
        server.flush().await.unwrap();
        drop(server);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut got = Vec::new();
        let r = bounded(10, client.read_to_end(&mut got)).await;
        assert_eq!(got, b"the answer", "{what}: the bytes sent before the abort");
        assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset), "{what}");
    }
}

/// A stream dropped with bytes unread resets the connection even when the peer's end of
/// stream came after them, as TCP does (only the FIN itself does not count as unread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_with_bytes_unread_after_the_peers_end_resets_it() {
    for (what, mut client, mut server) in both_transports().await {
        client.write_all(&[7; 10]).await.unwrap();
        client.shutdown().await.unwrap();
        let mut one = [0u8; 1];
        bounded(10, server.read_exact(&mut one)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(server);
        let mut b = [0u8; 8];
        let r = bounded(10, client.read(&mut b)).await;
        assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset), "{what}");
    }
}

/// After the peer reset the connection (a zero linger), shutting our write side down is not
/// an error, as tokio's shutdown of a reset TCP socket is not (Linux's `ENOTCONN`, which tokio
/// takes for success).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_a_stream_the_peer_reset_succeeds() {
    for (what, mut client, server) in both_transports().await {
        server.set_zero_linger().unwrap();
        drop(server);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(bounded(10, client.shutdown()).await.is_ok(), "{what}");
    }
}

/// Empty buffers behave as on TCP: a write of nothing after our shutdown fails as any write
/// would, and a read into no room waits for the stream to be readable (`try_read` says
/// `WouldBlock` until then), then reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_buffers_see_the_streams_state() {
    for (what, mut client, mut server) in both_transports().await {
        assert_eq!(
            client.try_read(&mut []).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "{what}: nothing to read yet"
        );
        server.write_all(b"hi").await.unwrap();
        server.flush().await.unwrap();
        assert_eq!(bounded(10, client.read(&mut [])).await.unwrap(), 0, "{what}");
        let mut two = [0u8; 2];
        bounded(10, client.read_exact(&mut two)).await.unwrap();
        assert_eq!(&two, b"hi", "{what}: the empty read took nothing");
        client.shutdown().await.unwrap();
        assert_eq!(
            client.write(&[]).await.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::BrokenPipe),
            "{what}: a write of nothing after shutdown"
        );
    }
}

/// `ready(Interest::ERROR)` resolves, with the error bit, once the peer reset the connection,
/// and `ready(Interest::PRIORITY)` once the peer closed its side (tokio reports the read side's
/// close with it); neither hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_and_priority_readiness_resolve_at_a_reset_and_a_close() {
    use tokio::io::Interest;
    for (what, client, server) in both_transports().await {
        server.set_zero_linger().unwrap();
        drop(server);
        let r = bounded(10, client.ready(Interest::ERROR)).await.unwrap();
        assert!(r.is_error(), "{what}: {r:?}");
    }
    for (what, client, mut server) in both_transports().await {
        server.shutdown().await.unwrap();
        let r = bounded(10, client.ready(Interest::PRIORITY)).await.unwrap();
        assert!(r.is_read_closed(), "{what}: {r:?}");
        drop(server);
    }
}

/// `poll_read_ready` spends the task's cooperative budget as tokio's does: a loop of readiness
/// and `try_read` on a stream that always has bytes is made to yield.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_readiness_spends_the_cooperative_budget() {
    for (what, client, mut server) in both_transports().await {
        server.write_all(&[1; 1000]).await.unwrap();
        server.flush().await.unwrap();
        let mut one = [0u8; 1];
        bounded(10, client.readable()).await.unwrap();
        let yielded = std::future::poll_fn(|cx| {
            for _ in 0..500 {
                match client.poll_read_ready(cx) {
                    std::task::Poll::Pending => return std::task::Poll::Ready(true),
                    std::task::Poll::Ready(r) => r.unwrap(),
                }
                let _ = client.try_read(&mut one);
            }
            std::task::Poll::Ready(false)
        })
        .await;
        assert!(yielded, "{what}: 500 ready polls in one turn of the task");
    }
}

/// After our own shutdown the stream is still writable as far as readiness goes, as tokio's
/// is (only a hang-up or a reset reports the write side closed); the write itself fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_shutdown_does_not_report_the_write_side_closed() {
    use tokio::io::Interest;
    for (what, mut client, server) in both_transports().await {
        client.shutdown().await.unwrap();
        let r = bounded(10, client.ready(Interest::WRITABLE)).await.unwrap();
        assert!(r.is_writable() && !r.is_write_closed(), "{what}: {r:?}");
        assert_eq!(client.try_write(b"x").map_err(|e| e.kind()), Err(std::io::ErrorKind::BrokenPipe), "{what}");
        drop(server);
    }
}

/// A reset is reported once, as a TCP socket reports its error once and is shut both ways
/// after: whichever of a read or a write meets it first returns it, reads after that find
/// the end of stream and writes `BrokenPipe`, so a loop that reads on after an error ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_reported_once_and_the_stream_is_ended_both_ways_after() {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
    for first in ["read", "write"] {
        for (what, mut client, server) in both_transports().await {
            server.set_zero_linger().unwrap();
            drop(server);
            // Until the reset is there (readiness says so without reporting it).
            bounded(10, async {
                while !client.ready(tokio::io::Interest::READABLE).await.unwrap().is_read_closed() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
            let mut b = [0u8; 8];
            let r = match first {
                "read" => bounded(10, client.read(&mut b)).await,
                _ => bounded(10, client.write(b"x")).await,
            };
            assert_eq!(r.map_err(|e| e.kind()), Err(ConnectionReset), "{what}: the {first} that meets it");
            for _ in 0..2 {
                assert_eq!(bounded(10, client.read(&mut b)).await.unwrap(), 0, "{what}: a read after, {first} first");
            }
            let w = bounded(10, client.write(b"x")).await;
            assert_eq!(w.map_err(|e| e.kind()), Err(BrokenPipe), "{what}: a write after, {first} first");
        }
    }
}

/// A vectored read without waiting, as tokio's: with only empty buffers it says `WouldBlock`
/// until the stream is readable; bytes before a reset fill its buffers and are returned, and
/// the reset comes with the read after (not lost to a buffer past the bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vectored_read_returns_the_bytes_before_a_reset_and_the_reset_after() {
    use std::io::IoSliceMut;
    for (what, mut client, mut server) in both_transports().await {
        let e = client.try_read_vectored(&mut [IoSliceMut::new(&mut [])]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{what}: empty buffers, nothing there");
        client.write_all(b"x").await.unwrap();
        // Left unread, so the drop resets.
        assert_eq!(bounded(10, server.peek(&mut [0u8; 4])).await.unwrap(), 1, "{what}");
        server.write_all(b"abc").await.unwrap();
        server.flush().await.unwrap();
        drop(server);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (mut a, mut b) = ([0u8; 3], [0u8; 3]);
        let n = client.try_read_vectored(&mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)]).unwrap();
        assert_eq!((n, &a), (3, b"abc"), "{what}");
        let r = bounded(10, client.read(&mut b)).await;
        assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset), "{what}: the reset after");
    }
}
