//! SMC connections that move back to their TCP socket mid-stream (`SmcStream::hand_back`, and a
//! link that fails under live connections): every byte arrives once, in order, in both
//! directions, and the stream goes on as a TCP stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use smc_tokio::config::ShmConfig;
use smc_tokio::{FallbackReason, HandbackCause, SmcStream, Transport};
use tests::{bounded, read_n_shared, smc_pair, smc_pair_in, write_all_shared, Rng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn moved(cause: HandbackCause) -> Transport {
    Transport::Tcp(FallbackReason::HandedBack(cause))
}

/// What moves the connection.
#[derive(Clone, Copy)]
enum Mover {
    /// The client asks.
    HandBack,
    /// The client's link fails.
    FailLink,
}

/// Both ends write and read at once; when `cut` bytes of the client's stream went out, `mover`
/// moves the connection. Returns both ends and the longest stall of the server's reads.
async fn both_ways_with_a_move(size: usize, cut: u64, seed: u64, mover: Mover) -> (SmcStream, SmcStream, Duration) {
    let (client, server) = smc_pair(ShmConfig::default().rmb_size(64 << 10)).await;
    let mut rng = Rng::new(seed);
    let up = rng.bytes(size);
    let down = rng.bytes(size);
    let (sent, sent_down) = (AtomicU64::new(0), AtomicU64::new(0));
    let mover_run = async {
        while sent.load(Ordering::Relaxed) < cut {
            tokio::task::yield_now().await;
        }
        match mover {
            Mover::HandBack => client.hand_back().await.unwrap(),
            Mover::FailLink => client.fail_link().unwrap(),
        }
    };
    let (_, _, (got_up, stall), _, (got_down, _)) = bounded(120, async {
        tokio::join!(
            mover_run,
            write_all_shared(&client, &up, &sent),
            read_n_shared(&server, size),
            write_all_shared(&server, &down, &sent_down),
            read_n_shared(&client, size),
        )
    })
    .await;
    assert!(got_up == up, "the client's stream arrived whole and in order");
    assert!(got_down == down, "the server's stream arrived whole and in order");
    (client, server, stall)
}

#[tokio::test]
async fn hand_back_mid_stream_loses_nothing_in_either_direction() {
    for (i, cut) in [0u64, 1, 65_535, 100_000, 1 << 20].into_iter().enumerate() {
        let (client, server, _) = both_ways_with_a_move(2 << 20, cut, i as u64, Mover::HandBack).await;
        assert_eq!(client.transport(), moved(HandbackCause::Requested), "cut {cut}");
        assert_eq!(server.transport(), moved(HandbackCause::Peer), "cut {cut}");
    }
}

#[tokio::test]
async fn a_link_that_fails_under_a_64_mib_transfer_moves_it_to_tcp() {
    let before = smc_tokio::stats().handbacks[0];
    let start = Instant::now();
    let (client, server, stall) = both_ways_with_a_move(64 << 20, 20 << 20, 7, Mover::FailLink).await;
    eprintln!(
        "64 MiB each way, 64 MiB compared each way, link failed at 20 MiB: {:?} in all, longest read stall {stall:?}",
        start.elapsed()
    );
    assert_eq!(client.transport(), moved(HandbackCause::LinkFailed));
    assert_eq!(server.transport(), moved(HandbackCause::Peer));
    assert!(smc_tokio::stats().handbacks[0] >= before + 2, "both ends counted their move");
}

#[tokio::test]
async fn a_moved_stream_is_a_tcp_stream_into_std_and_raw_io_included() {
    let (mut client, mut server) = smc_pair(ShmConfig::default()).await;
    client.write_all(b"before ").await.unwrap();
    server.write_all(b"unread by the client ").await.unwrap();
    // Give the server's bytes time to land in the client's ring: they are resent after the move.
    tokio::time::sleep(Duration::from_millis(20)).await;
    client.hand_back().await.unwrap();
    let std_client = client.into_std().expect("a moved stream converts");
    // Raw socket I/O on the server's moved stream means what it means on tokio's.
    bounded(10, server.hand_back()).await.unwrap();
    let mut b = [0u8; 7];
    server.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"before ");
    let n = server
        .try_io(tokio::io::Interest::WRITABLE, || {
            use std::io::Write;
            (&*socket2::SockRef::from(&server)).write(b"raw")
        })
        .unwrap();
    assert_eq!(n, 3);
    let t = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std_client;
        s.set_nonblocking(false).unwrap();
        let mut got = vec![0u8; b"unread by the client raw".len()];
        s.read_exact(&mut got).unwrap();
        s.write_all(b"from std").unwrap();
        got
    });
    let got = bounded(10, t).await.unwrap();
    assert_eq!(got, b"unread by the client raw");
    let mut b = [0u8; 8];
    server.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"from std");
}

/// On a multi-threaded runtime, a stream converts to a std stream as soon as its `hand_back()`
/// returns (both sides ask at once, so either may start the move): the move's task lets the
/// socket go before the move is seen to be over (it held it until after, and a caller on the
/// other worker could find the socket still shared, and lose the connection with the error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_converts_the_moment_its_move_is_over() {
    let l = smc_tokio::SmcListener::builder().shm(ShmConfig::default()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    for round in 0..200 {
        let (c, s) = tokio::join!(SmcStream::connect(addr), l.accept());
        let (client, (server, _)) = (c.unwrap(), s.unwrap());
        assert!(client.transport().is_smc());
        let mover = tokio::spawn(async move {
            server.hand_back().await.unwrap();
            server
        });
        bounded(10, client.hand_back()).await.unwrap();
        let std_client = client.into_std().unwrap_or_else(|e| panic!("round {round}: {e}"));
        drop(bounded(10, mover).await.unwrap());
        drop(std_client);
    }
}

#[tokio::test]
async fn half_closed_corked_and_sendfile_streams_move_whole() {
    use std::io::Write;
    let (mut client, mut server) = smc_pair(ShmConfig::default().rmb_size(16 << 10)).await;
    // The server's direction: written under a cork (unannounced), then half-closed.
    let cork = server.cork();
    server.write_all(b"corked bytes").await.unwrap();
    // The client's direction: a sendfile larger than the ring, the move in its middle.
    let mut file = tempfile::tempfile().unwrap();
    let body = Rng::new(3).bytes(1 << 20);
    file.write_all(&body).unwrap();
    let (sent, got) = bounded(60, async {
        tokio::join!(
            async {
                let n = client.sendfile(&file, 0, body.len() as u64).await.unwrap();
                client.shutdown().await.unwrap();
                n
            },
            async {
                let mut got = vec![0u8; 100 << 10];
                server.read_exact(&mut got).await.unwrap();
                // A third of the file is through: move, with the server's bytes still corked.
                server.hand_back().await.unwrap();
                drop(cork);
                server.shutdown().await.unwrap();
                let mut rest = Vec::new();
                server.read_to_end(&mut rest).await.unwrap();
                got.extend_from_slice(&rest);
                got
            }
        )
    })
    .await;
    assert_eq!(sent, body.len() as u64);
    assert!(got == body, "the file arrived whole, then the end");
    let mut all = Vec::new();
    bounded(10, client.read_to_end(&mut all)).await.unwrap();
    assert_eq!(all, b"corked bytes", "the corked bytes, then the server's end");
    assert_eq!(client.transport(), moved(HandbackCause::Peer));
}

#[tokio::test]
async fn an_orderly_close_is_no_move() {
    // The peer closes in order (its close announced over the link, then its TCP socket
    // closed): the stream reads the bytes in its ring, then the end, and never moves.
    let (mut client, server) = smc_pair(ShmConfig::default()).await;
    client.write_all(b"last words").await.unwrap();
    client.flush().await.unwrap();
    drop(client);
    let mut server = server;
    let mut got = Vec::new();
    bounded(10, server.read_to_end(&mut got)).await.unwrap();
    assert_eq!(got, b"last words");
    assert!(server.transport().is_smc(), "an orderly close is no move");
}

/// A move that fails on a frame that breaks the exchange, after the link failed (no abort can
/// go over it), ends the connection for the peer with an error, not a clean end: the bytes it
/// was to send again are lost. (Here the kernel resets the client's socket anyway, closed with
/// the server's frame unread; where nothing is left unread, its socket's zero linger does.)
#[tokio::test]
async fn a_move_broken_by_a_bad_frame_ends_the_peers_stream_with_an_error() {
    use std::os::fd::{AsFd, AsRawFd};
    let (mut client, mut server) = smc_pair(ShmConfig::default()).await;
    // The client's link fails: it moves, and reads the server's frame. Before the server's
    // task runs (one thread runs both), bytes on its TCP socket that are no handback frame: the
    // client takes them for the server's frame, and the exchange breaks.
    client.fail_link().unwrap();
    let junk = [0xA5u8; 64];
    // SAFETY: writes from a valid buffer of its length on the stream's own socket.
    let n = unsafe { libc::write(server.as_fd().as_raw_fd(), junk.as_ptr().cast(), junk.len()) };
    assert_eq!(n, 64, "{}", std::io::Error::last_os_error());
    let mut b = [0u8; 8];
    let failed = bounded(30, client.read(&mut b)).await;
    assert!(failed.is_err(), "the client's move did not fail: {failed:?}");
    drop(client);
    let end = bounded(30, server.read(&mut b)).await;
    assert!(end.is_err(), "the peer read a clean end after the failed move: {end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_on_a_multi_threaded_runtime_lose_nothing_either() {
    for (i, mover) in [Mover::HandBack, Mover::FailLink, Mover::HandBack, Mover::FailLink].into_iter().enumerate() {
        let (client, server, _) = both_ways_with_a_move(8 << 20, (i as u64 + 1) << 20, 100 + i as u64, mover).await;
        assert!(!client.transport().is_smc() && !server.transport().is_smc());
    }
}

#[tokio::test]
async fn split_halves_reunite_then_move_then_convert() {
    let (client, mut server) = smc_pair(ShmConfig::default()).await;
    let (rd, mut wr) = client.into_split();
    wr.write_all(b"through the halves, ").await.unwrap();
    let client = rd.reunite(wr).expect("halves of one stream");
    bounded(10, client.hand_back()).await.unwrap();
    let std_client = client.into_std().unwrap();
    let t = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut s = std_client;
        s.set_nonblocking(false).unwrap();
        s.write_all(b"then through std").unwrap();
    });
    bounded(10, t).await.unwrap();
    let mut all = Vec::new();
    bounded(10, server.read_to_end(&mut all)).await.unwrap();
    assert_eq!(all, b"through the halves, then through std");
    assert_eq!(server.transport(), moved(HandbackCause::Peer));
}

/// Bytes an owned read half holds from `fill_buf`, unconsumed, while the stream moves through
/// its write half's `as_ref`: the move counts them as unread (the peer sends them again on
/// TCP), and the `consume` that follows skips them there. Nothing is read twice.
#[tokio::test]
async fn bytes_held_by_a_read_half_across_a_requested_move_are_read_once() {
    use tokio::io::AsyncBufReadExt;
    let (client, mut server) = smc_pair(ShmConfig::default()).await;
    server.write_all(b"held across the move").await.unwrap();
    server.flush().await.unwrap();
    let (mut rd, wr) = client.into_split();
    let n = bounded(10, rd.fill_buf()).await.unwrap().len();
    assert_eq!(n, 20);
    bounded(10, wr.as_ref().hand_back()).await.unwrap();
    rd.consume(n);
    server.write_all(b", then this").await.unwrap();
    drop(server);
    let mut rest = Vec::new();
    bounded(10, rd.read_to_end(&mut rest)).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&rest), ", then this");
    drop(wr);
}

/// Bytes handed out by `fill_buf` and consumed while a move runs, when the move then fails (the
/// peer reset its TCP connection before it answered): they are consumed from the ring, where
/// they still are, and the reads that follow go on after them before the error.
#[tokio::test]
async fn bytes_consumed_while_a_move_fails_are_not_read_again() {
    use tokio::io::AsyncBufReadExt;
    let server = HeldServer::start(b"abcdef");
    let mut client = SmcStream::connect(server.addr).await.unwrap();
    assert_eq!(client.transport(), Transport::SmcD);
    // (`AsyncBufRead` is the `&mut SmcStream`'s, the handle that lends.)
    let n = bounded(10, (&mut client).fill_buf()).await.unwrap().len();
    assert_eq!(n, 6);
    client.fail_link().unwrap();
    AsyncBufReadExt::consume(&mut &mut client, 3);
    server.reset();
    let mut rest = Vec::new();
    let end = bounded(10, client.read_to_end(&mut rest)).await;
    assert_eq!(String::from_utf8_lossy(&rest), "def", "the rest of the bytes, once");
    assert!(end.is_err(), "then the reset: {end:?}");
    server.release();
}

/// A server on a runtime of its own, whose thread holds once it accepted a connection (and
/// wrote `first` on it), so that its side never answers a move.
impl HeldServer {
    /// Started; its connection's descriptor is known once a client connected (`reset` waits
    /// for it).
    fn start(first: &'static [u8]) -> HeldServer {
        use std::os::fd::AsRawFd;
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (fd_tx, fd_rx) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let l = smc_tokio::SmcListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                let (mut s, _) = l.accept().await.unwrap();
                s.write_all(first).await.unwrap();
                s.flush().await.unwrap();
                fd_tx.send(s.as_raw_fd()).unwrap();
                // Held: no task of this runtime runs until the test is done.
                go_rx.recv().unwrap();
                drop(s);
            });
        });
        HeldServer { addr: addr_rx.recv().unwrap(), fd: fd_rx, go, thread }
    }
}

struct HeldServer {
    addr: std::net::SocketAddr,
    fd: std::sync::mpsc::Receiver<std::os::fd::RawFd>,
    go: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl HeldServer {
    /// The server resets its TCP connection without answering (`connect(AF_UNSPEC)`: an RST).
    fn reset(&self) {
        let fd = self.fd.recv().unwrap();
        let unspec = libc::sockaddr { sa_family: libc::AF_UNSPEC as libc::sa_family_t, sa_data: [0; 14] };
        // SAFETY: connect(2) with a valid sockaddr on the server's open socket, which its
        // thread keeps open until `release`.
        let r = unsafe { libc::connect(fd, &unspec, std::mem::size_of::<libc::sockaddr>() as libc::socklen_t) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    }

    /// Lets the server's thread go, and waits for it.
    fn release(self) {
        self.go.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

/// A move whose peer does not answer is bounded as a silent peer host's is: from the start of
/// any move the socket probes its peer (keepalive from 5 s of silence) and bounds
/// unacknowledged data (13 s), where a frame nobody acknowledged was retransmitted for a
/// quarter of an hour; the settings go back once the stream moved.
#[tokio::test]
async fn every_move_probes_the_peer_host_while_it_waits() {
    let server = HeldServer::start(b"");
    let client = SmcStream::connect(server.addr).await.unwrap();
    let sock = socket2::SockRef::from(&client);
    assert!(!sock.keepalive().unwrap());
    client.fail_link().unwrap();
    // The move starts on the runtime's next turns; under load that may take a while.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !sock.keepalive().unwrap() {
        assert!(tokio::time::Instant::now() < deadline, "a waiting move probes its peer");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(5));
    assert_eq!(sock.tcp_user_timeout().unwrap(), Some(Duration::from_secs(13)));
    server.reset();
    server.release();
    drop(client);

    // A move that went through leaves the socket as the application had it.
    let (client, _server) = smc_pair(ShmConfig::default()).await;
    bounded(10, client.hand_back()).await.unwrap();
    let sock = socket2::SockRef::from(&client);
    assert!(!sock.keepalive().unwrap());
    assert_eq!(sock.tcp_user_timeout().unwrap(), None);
}

/// A move whose peer's host acknowledges our frame but whose process never answers it (its
/// runtime holds) ends at the bound on the peer's frame, also after the application dropped
/// the stream: the move's task, the connection and its ring slot are let go, and the peer's
/// connection is reset. Without the bound they waited for as long as the peer kept its TCP
/// connection open (the keepalive probes and the bound on unacknowledged data never fire
/// against a live host).
#[tokio::test]
async fn a_move_whose_peer_never_answers_ends_after_the_stream_is_dropped() {
    let server = HeldServer::start(b"");
    let ctx = smc_tokio::Context::new();
    let client = SmcStream::builder().context(&ctx).connect(server.addr).await.unwrap();
    assert_eq!(client.transport(), Transport::SmcD);
    // The server's thread holds from the moment it gives its socket out (before, its runtime
    // could still answer the move).
    server.fd.recv().unwrap();
    client.fail_link().unwrap();
    // The move starts on the runtime's next turns (it probes the peer from then on); the
    // stream is dropped while it waits.
    let sock = socket2::SockRef::from(&client);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.keepalive().unwrap() {
        assert!(Instant::now() < deadline, "the move started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(client);
    a_move_fails_within(&ctx, Duration::from_secs(90), "the move still waits for a peer that never answers").await;
    assert_eq!(ctx.stats().handbacks, [0, 1], "one move, failed");
    server.release();
}

/// Waits until a move of `ctx` failed, for at most `limit` (else fails with `what`).
async fn a_move_fails_within(ctx: &smc_tokio::Context, limit: Duration, what: &str) {
    let start = Instant::now();
    while ctx.stats().handbacks[1] == 0 {
        assert!(start.elapsed() < limit, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A move whose peer answers and then never reads, with far more to resend than the sockets
/// hold (the peer's ring full of our bytes, its socket's receive buffer small): once our
/// application dropped the stream, the resend is bounded as a silent host's data is (the
/// kernel ends it after 13 s of a zero window), and the connection goes. Before, the resend
/// waited for room for as long as the peer kept its TCP connection open.
/// A pair in `ctx` whose client filled the server's 4 MiB ring (the server's application reads
/// nothing) over sockets with 4 KiB buffers: a move's resend from the client then waits.
async fn a_ring_full_over_tiny_sockets(ctx: &smc_tokio::Context) -> (SmcStream, SmcStream) {
    let (client, server) = smc_pair_in(ctx, ShmConfig::default().rmb_size(4 << 20).rmb_max(4 << 20)).await;
    socket2::SockRef::from(&server).set_recv_buffer_size(4 << 10).unwrap();
    socket2::SockRef::from(&client).set_send_buffer_size(4 << 10).unwrap();
    let mut sent = 0usize;
    let chunk = [7u8; 16 << 10];
    while let Ok(n) = client.try_write(&chunk) {
        sent += n;
    }
    assert!(sent > 2 << 20, "{sent} bytes in the server's ring");
    (client, server)
}

/// Waits (10 s at most) for the first move in `ctx` to end: the server's, when the client asked.
async fn the_servers_move_ends(ctx: &smc_tokio::Context) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while ctx.stats().handbacks[0] == 0 {
        assert!(Instant::now() < deadline, "the server's move did not end");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (10 s at most) until `client`'s move it asked for read the server's frame: its reads
/// are the socket's, whatever its resend still waits for. (The server's move can end before
/// that: it has nothing to resend.)
async fn the_clients_reads_move(client: &SmcStream) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.transport() != moved(HandbackCause::Requested) {
        assert!(Instant::now() < deadline, "the client's reads did not move: {}", client.transport());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_the_peer_never_reads_ends_after_the_stream_is_dropped() {
    let ctx = smc_tokio::Context::new();
    let (client, server) = a_ring_full_over_tiny_sockets(&ctx).await;
    let moving = tokio::spawn(async move {
        let _ = client.hand_back().await;
    });
    // Wait for the server's move to end: the peer's frame is in (its host and process answer)
    // and our resend is stuck behind its zero window; then the application drops the stream.
    the_servers_move_ends(&ctx).await;
    assert_eq!(ctx.stats().handbacks, [1, 0], "the server's move ended, the client's resend waits");
    moving.abort();
    let _ = moving.await;
    a_move_fails_within(&ctx, Duration::from_secs(60), "the resend still waits for a peer that never reads").await;
    assert_eq!(ctx.stats().handbacks, [1, 1], "the server's move ended, the client's failed");
    drop(server);
}

/// A move that fails after the peer's frame for a reason other than the socket (here the
/// runtime that ran it shut down while its resend waited on a peer that does not read) resets
/// the connection: the stream is the socket's by then, but the peer has only part of the
/// resend, so a later write must not follow it as if nothing were missing, and the peer's
/// reads must end in an error, not in a gap or a clean end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_whose_runtime_ends_after_the_peers_frame_resets_the_connection() {
    let ctx = smc_tokio::Context::new();
    let (client, mut server) = a_ring_full_over_tiny_sockets(&ctx).await;
    let client = std::sync::Arc::new(client);
    let (mover, watch) = (client.clone(), client.clone());
    // The move runs on the runtime that started it: a runtime of its own, dropped once the
    // client has the server's frame (its resend waits).
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let _moving = tokio::spawn(async move { mover.hand_back().await });
            the_clients_reads_move(&watch).await;
        });
    })
    .join()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        // A write after the failed move: refused (the connection was reset), never sent after
        // a partial resend.
        match client.try_write(b"after the move") {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => break e,
            Ok(n) => panic!("{n} bytes written after a move whose resend did not all go"),
        }
        assert!(Instant::now() < deadline, "the connection was not reset");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(matches!(err.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe), "{err}");
    // The server reads what came of the resend, then the reset.
    let mut sink = vec![0u8; 64 << 10];
    let end = bounded(10, async {
        loop {
            match server.read(&mut sink).await {
                Ok(0) => break Ok(()),
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        }
    })
    .await;
    assert_eq!(end.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset), "the server's reads ended cleanly");
}

/// Two tasks peek (each waiting on the stream's readiness future between tries, as tokio's
/// `peek` does) and a third polls a peek (`poll_peek`, which keeps the socket's one waker) while
/// the stream's move waits on its resend (the peer's application does not read) and reads are
/// already the socket's: a byte from the peer reaches all three. The socket keeps the waker of
/// the last poll only: a future was neither kept beside it nor woken, and waited for good; then,
/// kept beside it, it still waited for the end of the move whenever a `poll_peek` or a read
/// had taken the socket's waker last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_readiness_future_hears_of_bytes_while_the_resend_waits() {
    let ctx = smc_tokio::Context::new();
    let (client, mut server) = a_ring_full_over_tiny_sockets(&ctx).await;
    let client = std::sync::Arc::new(client);
    let mover = client.clone();
    let moving = tokio::spawn(async move {
        let _ = mover.hand_back().await;
    });
    // The client's reads move to the socket; its resend waits behind the server's zero window.
    the_clients_reads_move(&client).await;
    let mut waiters: Vec<_> = (0..2)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.peek(&mut [0u8; 4]).await })
        })
        .collect();
    // The last to wait: a poll of a peek, after the futures.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c = client.clone();
    waiters.push(tokio::spawn(async move {
        let mut b = [0u8; 4];
        std::future::poll_fn(|cx| c.poll_peek(cx, &mut tokio::io::ReadBuf::new(&mut b))).await
    }));
    // All wait before the byte comes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "a peek ended before the byte came");
    server.write_all(b"x").await.unwrap();
    for w in waiters {
        assert_eq!(bounded(10, w).await.unwrap().unwrap(), 1);
    }
    let mut b = [0u8; 1];
    assert_eq!(client.try_read(&mut b).unwrap(), 1);
    assert_eq!(&b, b"x");
    moving.abort();
}

/// Both directions full when the stream moves (neither application read for a while), with
/// rings far larger than the sockets' buffers: each side's resend needs the other side's
/// application to read before it fits. Reads wait only for the peer's frame, not for our own
/// resend, so both moves end and every byte arrives (reads held for the resend left both moves
/// waiting on each other until the probe's bound ended the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_with_both_directions_full_ends_and_loses_nothing() {
    let (client, server) = smc_pair(ShmConfig::default().rmb_size(4 << 20).rmb_max(4 << 20)).await;
    // Fill both rings: nobody reads.
    let fill = |s: &SmcStream, tag: u8| {
        let mut sent = 0usize;
        let chunk = [tag; 16 << 10];
        while let Ok(n) = s.try_write(&chunk) {
            sent += n;
        }
        sent
    };
    let (to_server, to_client) = (fill(&client, 1), fill(&server, 2));
    assert!(to_server > 2 << 20 && to_client > 2 << 20, "{to_server} {to_client}");
    let mover = tokio::spawn(async move {
        client.hand_back().await.unwrap();
        client
    });
    let drain = |mut s: SmcStream, n: usize, tag: u8| async move {
        // Both moves under way before either application reads.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut got = vec![0u8; n];
        s.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|&b| b == tag));
        s
    };
    let server = tokio::spawn(drain(server, to_server, 1));
    let client = bounded(20, mover).await.unwrap();
    let client = bounded(60, drain(client, to_client, 2)).await;
    drop(bounded(60, server).await.unwrap());
    drop(client);
}

/// The peer writes its last bytes and closes while our move runs, and the move fails (the
/// peer's socket is gone before our frame): what it sent meanwhile, and its close, are taken in
/// from the link after all, so the reads end with its bytes, not short of them.
#[tokio::test]
async fn bytes_the_peer_sent_while_a_failed_move_ran_are_read() {
    use std::future::Future;
    let (client, mut server) = smc_pair(ShmConfig::default()).await;
    server.write_all(b"before ").await.unwrap();
    server.flush().await.unwrap();
    let mut client = client;
    let mut first = [0u8; 7];
    bounded(10, client.read_exact(&mut first)).await.unwrap();
    // The move starts (its exchange runs at our next await), the peer writes and goes.
    {
        let mut moving = std::pin::pin!(client.hand_back());
        std::future::poll_fn(|cx| {
            assert!(moving.as_mut().poll(cx).is_pending(), "the move waits for the peer");
            std::task::Poll::Ready(())
        })
        .await;
        assert_eq!(server.try_write(b"the tail").unwrap(), 8);
        drop(server);
        assert!(bounded(10, moving).await.is_err(), "the peer went: no move");
    }
    let mut rest = Vec::new();
    let end = bounded(10, client.read_to_end(&mut rest)).await;
    assert_eq!(String::from_utf8_lossy(&rest), "the tail", "{end:?}");
    assert_eq!(end.unwrap(), 8, "then the end of its stream, as its close said");
}

/// As above, with the peer writing its tail in more small pieces than a move keeps messages
/// (each piece is a CDC message of its own): the older ones are folded in while the move runs,
/// and the reads still end with every byte and the peer's clean end. They ended in a protocol
/// error ("more CDC messages than a move keeps") before. The client runs on a runtime of its
/// own, whose driver takes the messages while this thread writes without yielding, so that the
/// peer's side never sees the client's frame before it goes.
#[tokio::test]
async fn more_messages_than_a_move_keeps_while_it_fails_are_all_read() {
    use std::future::Future;
    const PIECES: usize = 20_000;
    let ctx = smc_tokio::Context::new();
    let l = smc_tokio::SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let client_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let builder = SmcStream::builder().context(&ctx);
    let connect = client_rt.spawn(async move { builder.connect(addr).await });
    let (mut server, _) = bounded(10, l.accept()).await.unwrap();
    let mut client = bounded(10, connect).await.unwrap().unwrap();
    assert_eq!(client.transport(), Transport::SmcD);
    server.write_all(b"before ").await.unwrap();
    server.flush().await.unwrap();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let reader = client_rt.spawn(async move {
        let mut first = [0u8; 7];
        client.read_exact(&mut first).await.unwrap();
        let moved = {
            let mut moving = std::pin::pin!(client.hand_back());
            std::future::poll_fn(|cx| {
                assert!(moving.as_mut().poll(cx).is_pending(), "the move waits for the peer");
                std::task::Poll::Ready(())
            })
            .await;
            let _ = started_tx.send(());
            moving.await
        };
        let mut rest = Vec::new();
        let end = client.read_to_end(&mut rest).await;
        (moved.is_ok(), rest, end)
    });
    bounded(10, started).await.unwrap();
    // One message a piece, written without yielding: this runtime (the server's side, its
    // socket's watcher among its tasks) runs nothing meanwhile.
    let tail: Vec<u8> = (0..PIECES).map(|i| (i % 251) as u8).collect();
    let t = Instant::now();
    for b in tail.chunks(1) {
        loop {
            match server.try_write(b) {
                Ok(1) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(t.elapsed() < Duration::from_secs(20), "the peer's ring stayed full");
                    std::thread::yield_now();
                }
                other => panic!("a piece gave {other:?}"),
            }
        }
    }
    // Every message out before the close, still without yielding: a close that found the CDC
    // ring full would wait for this runtime, whose watcher could meanwhile see the client's
    // frame and move the server's side too.
    {
        let mut flush = std::pin::pin!(server.flush());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while flush.as_mut().poll(&mut cx).is_pending() {
            assert!(t.elapsed() < Duration::from_secs(20), "the pieces' messages never went");
            std::thread::yield_now();
        }
    }
    drop(server);
    let (moved, rest, end) = bounded(30, reader).await.unwrap();
    assert!(!moved, "the peer went: no move");
    assert!(rest == tail, "read {} of {PIECES} bytes, then {end:?}", rest.len());
    assert_eq!(end.unwrap(), PIECES, "then the end of its stream, as its close said");
    client_rt.shutdown_background();
}

/// A stream that moved to TCP by itself (its link failed; no `hand_back`) converts to a std
/// stream at once, its watcher's hold on the socket notwithstanding, and the std stream carries
/// the connection both ways. (On a current-thread runtime the watcher, stopped as the stream
/// goes, is not dropped before the runtime's next turn.)
#[tokio::test]
async fn a_stream_that_moved_by_itself_converts_to_std() {
    for round in 0..20 {
        let (mut client, mut server) = smc_pair(ShmConfig::default()).await;
        client.write_all(b"before").await.unwrap();
        let mut b = [0u8; 6];
        bounded(10, server.read_exact(&mut b)).await.unwrap();
        client.fail_link().unwrap();
        bounded(10, async {
            while client.transport() != moved(HandbackCause::LinkFailed) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        let std_client = client.into_std().unwrap_or_else(|e| panic!("round {round}: {e}"));
        let t = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut s = std_client;
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"from std").unwrap();
            let mut got = [0u8; 5];
            s.read_exact(&mut got).unwrap();
            got
        });
        let mut b = [0u8; 8];
        bounded(10, server.read_exact(&mut b)).await.unwrap();
        assert_eq!(&b, b"from std", "round {round}");
        server.write_all(b"reply").await.unwrap();
        assert_eq!(&bounded(10, t).await.unwrap(), b"reply", "round {round}");
    }
}
