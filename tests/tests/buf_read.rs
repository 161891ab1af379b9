//! `AsyncBufRead` on streams and read halves: over shared memory with a peer of our own uid the
//! receive ring's bytes are lent where they lie; elsewhere they are peeked into a buffer. Either
//! way every byte arrives once and in order, mixed with plain reads, peeks and `try_read`; and
//! while bytes are lent the peer cannot reuse their memory (an abort's answer waits for them,
//! and after a move to TCP a peer that may lend never gets its ring reused).

use std::time::Duration;

use smc_tokio::config::ShmConfig;
use smc_tokio::{Context, Policy, SmcListener, SmcStream, SmcStreamBuilder, Transport};
use tests::{bounded, pattern, read_n_shared, smc_pair, write_all_shared, Rng};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// Where a `fill_buf` result starts and how long it is.
fn span(buf: &[u8]) -> (usize, usize) {
    (buf.as_ptr() as usize, buf.len())
}

/// Reads `n` bytes from `rd` with a random mix of `fill_buf` and partial `consume`, plain
/// reads and peeks; returns them and whether a `fill_buf` after a partial `consume` started
/// where the consumed bytes ended (the bytes lie in the ring: lent) rather than at the start of
/// the reader's buffer again (copied).
async fn read_mixed<R: AsyncBufRead + Unpin>(rd: &mut R, n: usize, seed: u64) -> (Vec<u8>, Lending) {
    let mut rng = Rng::new(seed);
    let mut got = Vec::with_capacity(n);
    let mut seen = Lending::default();
    while got.len() < n {
        match rng.range(0, 9) {
            0..=5 => {
                let buf = bounded(10, rd.fill_buf()).await.unwrap();
                let (p, len) = span(buf);
                assert!(len > 0, "eof after {} of {n} bytes", got.len());
                let take = rng.range(1, len);
                got.extend_from_slice(&buf[..take]);
                rd.consume(take);
                if take < len {
                    let (q, rest) = span(bounded(10, rd.fill_buf()).await.unwrap());
                    if q == p + take && rest >= len - take {
                        seen.advanced += 1;
                    } else if q == p {
                        seen.restarted += 1;
                    }
                }
            }
            6..=7 => {
                let mut b = vec![0u8; rng.range(1, 4999)];
                let k = bounded(10, rd.read(&mut b)).await.unwrap();
                assert!(k > 0, "eof after {} of {n} bytes", got.len());
                got.extend_from_slice(&b[..k]);
            }
            _ => {
                // A fill without a consume, then a read: the read takes the same bytes.
                let (_, len) = span(bounded(10, rd.fill_buf()).await.unwrap());
                let mut b = vec![0u8; len.min(rng.range(1, 299))];
                bounded(10, rd.read_exact(&mut b)).await.unwrap();
                got.extend_from_slice(&b);
            }
        }
    }
    (got, seen)
}

/// What `read_mixed` saw of where refills start.
#[derive(Debug, Default)]
struct Lending {
    /// A refill started where the consumed bytes ended (lent from the ring).
    advanced: usize,
    /// A refill started at the same place again (a buffer of the reader's).
    restarted: usize,
}

/// Writes `data` in uneven pieces, then half-closes.
fn spawn_writer<W: tokio::io::AsyncWrite + Unpin + Send + 'static>(
    mut w: W,
    data: Vec<u8>,
    seed: u64,
) -> tokio::task::JoinHandle<W> {
    tokio::spawn(async move {
        let mut rng = Rng::new(seed);
        let mut at = 0;
        while at < data.len() {
            let end = (at + rng.range(1, 39_999)).min(data.len());
            w.write_all(&data[at..end]).await.unwrap();
            at = end;
        }
        w.shutdown().await.unwrap();
        w
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_buf_lends_the_ring_where_it_lies_and_loses_nothing() {
    // A small ring: the transfer wraps it hundreds of times, and lent runs end at its end.
    let (c, mut s) = smc_pair(ShmConfig::default().rmb_size(16 * 1024)).await;
    let data = pattern(3 << 20);
    let w = spawn_writer(c, data.clone(), 1);
    // On `&mut SmcStream` (see its documentation).
    let mut rd = &mut s;
    let (got, seen) = bounded(60, read_mixed(&mut rd, data.len(), 2)).await;
    assert!(got == data, "bytes lost, repeated or reordered");
    assert!(seen.advanced > 10 && seen.restarted == 0, "the ring's bytes were not lent: {seen:?}");
    // The end of the stream: an empty fill, which consume(0) leaves so.
    assert!(bounded(10, rd.fill_buf()).await.unwrap().is_empty());
    rd.consume(0);
    assert_eq!(s.read(&mut [0u8; 8]).await.unwrap(), 0);
    bounded(10, w).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_read_half_lends_and_a_borrowed_one_copies() {
    let (c, s) = smc_pair(ShmConfig::default().rmb_size(16 * 1024)).await;
    let data = pattern(1 << 20);
    let (mut rd, _wr) = s.into_split();
    let w = spawn_writer(c, data.clone(), 3);
    let (got, seen) = bounded(60, read_mixed(&mut rd, data.len(), 4)).await;
    assert!(got == data, "owned half: bytes lost, repeated or reordered");
    assert!(seen.advanced > 5 && seen.restarted == 0, "the owned half did not lend: {seen:?}");
    let c = bounded(10, w).await.unwrap();
    drop(c);

    // A borrowed read half copies: its write half can reach the stream's reads.
    let (c, mut s) = smc_pair(ShmConfig::default().rmb_size(16 * 1024)).await;
    let w = spawn_writer(c, data.clone(), 5);
    let (mut rd, _wr) = s.split();
    let (got, seen) = bounded(60, read_mixed(&mut rd, data.len(), 6)).await;
    assert!(got == data, "borrowed half: bytes lost, repeated or reordered");
    assert!(seen.restarted > 5 && seen.advanced == 0, "the borrowed half did not copy: {seen:?}");
    bounded(10, w).await.unwrap();
}

#[tokio::test]
async fn on_tcp_fill_buf_peeks_and_consume_takes_the_bytes_off_the_socket() {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let tcp_only = SmcStream::builder().policy(Policy::TcpOnly);
    let (c, s) = tokio::join!(tcp_only.connect(addr), l.accept());
    let (c, (mut s, _)) = (c.unwrap(), s.unwrap());
    assert!(matches!(s.transport(), Transport::Tcp(_)));
    let data = pattern(1 << 20);
    let w = spawn_writer(c, data.clone(), 7);
    let (got, seen) = bounded(60, read_mixed(&mut &mut s, data.len(), 8)).await;
    assert!(got == data, "bytes lost, repeated or reordered");
    assert!(seen.restarted > 5 && seen.advanced == 0, "{seen:?}");
    assert!(bounded(10, (&mut s).fill_buf()).await.unwrap().is_empty(), "the end of the stream");
    bounded(10, w).await.unwrap();
    // Lines, as a protocol parser would take them.
    let (mut c, mut s) = {
        let tcp_only = SmcStream::builder().policy(Policy::TcpOnly);
        let (c, s) = tokio::join!(tcp_only.connect(addr), l.accept());
        (c.unwrap(), s.unwrap().0)
    };
    c.write_all(b"one\r\ntwo\r\n\r\n").await.unwrap();
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        bounded(10, (&mut s).read_line(&mut line)).await.unwrap();
        if line == "\r\n" {
            break;
        }
        lines.push(line);
    }
    assert_eq!(lines, ["one\r\n", "two\r\n"]);
}

/// Connects a client to `l` and accepts it.
async fn pair_on(l: &SmcListener, shm: &ShmConfig) -> (SmcStream, SmcStream) {
    pair_with(l, SmcStream::builder().shm(shm.clone())).await
}

/// Connects a client built by `b` to `l` and accepts it; the client must be on SMC-D.
async fn pair_with(l: &SmcListener, b: SmcStreamBuilder) -> (SmcStream, SmcStream) {
    let addr = l.local_addr().unwrap();
    let (c, s) = tokio::join!(b.connect(addr), l.accept());
    let (c, (s, _)) = (c.unwrap(), s.unwrap());
    assert_eq!(c.transport(), Transport::SmcD);
    (c, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lent_bytes_stay_as_they_are_when_the_peer_aborts_and_its_ring_slot_is_wanted() {
    let shm = ShmConfig::default().rmb_size(4096);
    let l = SmcListener::builder().shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
    let (mut c1, mut s1) = pair_on(&l, &shm).await;
    let group = c1.link_group();
    s1.write_all(&[b'A'; 1000]).await.unwrap();
    let mut r1 = &mut c1;
    let lent = bounded(10, r1.fill_buf()).await.unwrap();
    assert!(!lent.is_empty());
    // The peer aborts (a zero linger): it may reuse the ring we read from once we answer, and
    // the answer waits until the lent bytes are given back.
    s1.set_zero_linger().unwrap();
    drop(s1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // New connections on the same link group write other bytes; kept open, each takes another
    // slot, and a freed one first.
    let mut kept = Vec::new();
    for _ in 0..4 {
        let (mut c2, mut s2) = pair_on(&l, &shm).await;
        assert_eq!(c2.link_group(), group);
        s2.write_all(&[b'B'; 4096]).await.unwrap();
        let mut b = vec![0u8; 4096];
        bounded(10, c2.read_exact(&mut b)).await.unwrap();
        assert!(b.iter().all(|&x| x == b'B'));
        kept.push((c2, s2));
    }
    assert!(lent.iter().all(|&x| x == b'A'), "lent bytes changed under the application");
    let n = lent.len();
    r1.consume(n);
    // Given back: the abort is answered and reported.
    let mut rest = Vec::new();
    let r = bounded(10, c1.read_to_end(&mut rest)).await;
    assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset), "after {} more bytes", rest.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lent_bytes_stay_as_they_are_across_a_move_to_tcp_and_what_was_not_consumed_comes_again() {
    let shm = ShmConfig::default().rmb_size(16 * 1024);
    let l = SmcListener::builder().shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
    let (mut c, s) = pair_on(&l, &shm).await;
    let group = c.link_group();
    let data = pattern(200_000);
    let mut s = s;
    s.write_all(&data[..10_000]).await.unwrap();
    let mut rc = &mut c;
    let held = bounded(10, rc.fill_buf()).await.unwrap();
    let len = held.len();
    assert!(len > 100);
    // The server moves the stream to TCP while the client holds bytes of its ring; the move
    // does not wait for them (the client's writes could be waiting on it).
    bounded(10, s.hand_back()).await.unwrap();
    assert!(matches!(s.transport(), Transport::Tcp(_)), "{}", s.transport());
    // New connections on the same link group write other bytes; kept open, each takes another
    // slot, and one given back first.
    let mut kept = Vec::new();
    for _ in 0..4 {
        let (mut c2, mut s2) = pair_on(&l, &shm).await;
        assert_eq!(c2.link_group(), group);
        s2.write_all(&[b'B'; 16 * 1024]).await.unwrap();
        let mut b = vec![0u8; 16 * 1024];
        bounded(10, c2.read_exact(&mut b)).await.unwrap();
        kept.push((c2, s2));
    }
    assert!(held == &data[..len], "lent bytes changed under the application");
    // Consuming part of them after the move: the peer sent them again on TCP (the move counted
    // them as unread), and they are skipped there; so are 50 more, consumed separately.
    rc.consume(100);
    rc.consume(50);
    s.write_all(&data[10_000..]).await.unwrap();
    s.shutdown().await.unwrap();
    let again = bounded(10, rc.fill_buf()).await.unwrap();
    assert!(!again.is_empty() && again == &data[150..150 + again.len()], "the fill after the move");
    let mut rest = Vec::new();
    bounded(10, c.read_to_end(&mut rest)).await.unwrap();
    assert!(rest == data[150..], "after the move: {} bytes, expected {}", rest.len(), data.len() - 150);
    assert!(matches!(c.transport(), Transport::Tcp(_)), "{}", c.transport());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_of_an_allowed_uid_are_copied_not_lent() {
    if !tests::require_root("bytes_of_an_allowed_uid_are_copied_not_lent") {
        return;
    }
    const PEER: u32 = 65533;
    let l = SmcListener::builder()
        .shm(ShmConfig::default().allow_uid(PEER).rmb_size(8 * 1024).rmb_max(8 * 1024))
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let t = s.transport();
        let (mut rd, mut wr) = s.into_split();
        let (mut starts, mut fills) = (std::collections::HashSet::new(), 0);
        // The peer checks the echo and exits once it has it all, perhaps before its close
        // reaches us: the end may come as an error.
        while let Ok(buf) = rd.fill_buf().await {
            if buf.is_empty() {
                break;
            }
            starts.insert(buf.as_ptr() as usize);
            fills += 1;
            // Part of each fill: a lent fill after it starts further into the ring.
            let n = buf.len().min(3000);
            if wr.write_all(&buf[..n]).await.is_err() {
                break;
            }
            rd.consume(n);
        }
        let _ = wr.shutdown().await;
        (t, starts, fills)
    });
    let out = bounded(
        30,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
            .args(["client", &addr.to_string()])
            .env("SMC_TOKIO_SHM_ALLOW_UIDS", "0")
            // Small rings on both sides: the 64 KiB echo takes many fills.
            .env("SMC_TOKIO_RMB_SIZE", "8k")
            .env("SMC_TOKIO_RMB_MAX", "8k")
            .uid(PEER)
            .gid(PEER)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("TRANSPORT smc-d") && text.contains("OK"), "{text}");
    let (t, starts, fills) = bounded(10, server).await.unwrap();
    assert_eq!(t, Transport::SmcD);
    // Every fill began at the start of the half's own buffer.
    assert!(fills > 1, "{fills} fills");
    assert_eq!(starts.len(), 1, "bytes of another uid were lent from its ring ({fills} fills)");
}

/// `split` on a stream, and on a `&mut` of one, with `AsyncBufReadExt` in scope (imported at the
/// top of this file) is still `SmcStream::split`, as it is `TcpStream::split` for tokio's
/// stream: the trait's `split(self, byte)` would not take one argument less.
#[tokio::test]
async fn split_is_the_streams_own_with_async_buf_read_ext_in_scope() {
    fn halves(s: &mut SmcStream) -> (smc_tokio::ReadHalf<'_>, smc_tokio::WriteHalf<'_>) {
        s.split()
    }
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let (c, s) = tokio::join!(SmcStream::connect(l.local_addr().unwrap()), l.accept());
    let (mut c, (mut s, _)) = (c.unwrap(), s.unwrap());
    let (_, mut w) = c.split();
    w.write_all(b"x\n").await.unwrap();
    let (mut r, _) = halves(&mut s);
    let mut line = String::new();
    bounded(10, r.read_line(&mut line)).await.unwrap();
    assert_eq!(line, "x\n");
}

/// A 32 MiB echo: the server writes and reads through `&SmcStream` in two tasks (each waiting
/// on readiness) while a third moves the stream to TCP early on; the client echoes with
/// `copy_buf` over its owned (lending) halves, or with `copy` where `lend` is false.
async fn echo_under_a_move(lend: bool) {
    let (c, s) = smc_pair(ShmConfig::default().rmb_size(16 * 1024)).await;
    let echo = tokio::spawn(async move {
        let (mut rd, mut wr) = c.into_split();
        let n =
            if lend { tokio::io::copy_buf(&mut rd, &mut wr).await } else { tokio::io::copy(&mut rd, &mut wr).await };
        let _ = wr.shutdown().await;
        n
    });
    let s = std::sync::Arc::new(s);
    let data = pattern(32 << 20);
    let (w, r, m) = {
        let (s1, s2, s3) = (s.clone(), s.clone(), s.clone());
        let d = data.clone();
        let w = tokio::spawn(async move { write_all_shared(&s1, &d, &Default::default()).await });
        let n = data.len();
        let r = tokio::spawn(async move { read_n_shared(&s2, n).await.0 });
        let m = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(3)).await;
            s3.hand_back().await
        });
        (w, r, m)
    };
    bounded(30, w).await.unwrap();
    bounded(30, m).await.unwrap().unwrap();
    let got = bounded(30, r).await.unwrap();
    assert!(got == data, "the echo lost, repeated or reordered bytes");
    assert!(matches!(s.transport(), Transport::Tcp(_)), "{}", s.transport());
    drop(s);
    assert_eq!(bounded(30, echo).await.unwrap().unwrap(), data.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_with_copy_buf_on_lending_halves_survives_a_move_under_it() {
    // `copy_buf` writes the bytes it holds lent before it consumes them: the move must not wait
    // for them while the write waits for the move.
    echo_under_a_move(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_and_a_writer_waiting_in_two_tasks_both_wake_when_a_move_ends() {
    // Before, a task waiting on readiness during the move took both wakers' places, and the
    // other task (here the server's writer) slept on after the move (3 runs in 10).
    echo_under_a_move(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_back_after_a_fill_without_a_consume_moves_and_loses_nothing() {
    let (mut c, mut s) = smc_pair(ShmConfig::default().rmb_size(16 * 1024)).await;
    let data = pattern(100_000);
    s.write_all(&data[..5000]).await.unwrap();
    let held = bounded(10, (&mut c).fill_buf()).await.unwrap().len();
    assert!(held > 0);
    // The bytes handed out were not consumed: after the move they are read again.
    bounded(10, c.hand_back()).await.unwrap();
    assert!(matches!(c.transport(), Transport::Tcp(_)), "{}", c.transport());
    s.write_all(&data[5000..]).await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    bounded(10, c.read_to_end(&mut got)).await.unwrap();
    assert!(got == data, "{} bytes, expected {}", got.len(), data.len());
}

#[tokio::test]
async fn a_peek_between_fill_buf_and_consume_leaves_the_bytes_to_consume() {
    for tcp in [false, true] {
        let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
        let policy = if tcp { Policy::TcpOnly } else { Policy::default() };
        let b = SmcStream::builder().policy(policy);
        let (c, s) = tokio::join!(b.connect(l.local_addr().unwrap()), l.accept());
        let (mut c, (mut s, _)) = (c.unwrap(), s.unwrap());
        assert_eq!(s.transport().is_smc(), !tcp, "{}", s.transport());
        c.write_all(b"abcdefgh").await.unwrap();
        let mut rd = &mut s;
        let mut n = 0;
        while n < 8 {
            n = bounded(10, rd.fill_buf()).await.unwrap().len();
            if n < 8 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let mut p = [0u8; 3];
        assert_eq!(rd.peek(&mut p).await.unwrap(), 3);
        assert_eq!(&p, b"abc");
        rd.consume(3);
        let mut rest = [0u8; 5];
        rd.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"defgh", "tcp: {tcp}");
    }
}

/// Waits until `ctx` holds `want` bytes of rings, or 10 s; returns what it holds then.
async fn rings_settle(ctx: &Context, want: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ctx.rmb_memory_in_use() != want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ctx.rmb_memory_in_use()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_tcp_keeps_the_ring_only_from_a_peer_that_may_lend() {
    const RING: u32 = 16 * 1024;
    let shm = ShmConfig::default().rmb_size(RING).rmb_max(RING);
    // A peer of our own uid may hold bytes of our ring lent: after a move, neither side's ring
    // goes back to the group, even once both streams are gone. A plain close gives both back.
    let ctx = Context::new();
    let l = SmcListener::builder().context(&ctx).shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
    let pair = || pair_with(&l, SmcStream::builder().context(&ctx).shm(shm.clone()));
    let (mut c, mut s) = pair().await;
    assert_eq!(ctx.rmb_memory_in_use(), 2 * RING as u64);
    s.write_all(b"one").await.unwrap();
    let mut b = [0u8; 3];
    c.read_exact(&mut b).await.unwrap();
    drop((c, s));
    assert_eq!(rings_settle(&ctx, 0).await, 0, "a closed connection's rings came back");
    let (mut c, mut s) = pair().await;
    bounded(10, s.hand_back()).await.unwrap();
    s.write_all(b"two").await.unwrap();
    bounded(10, c.read_exact(&mut b)).await.unwrap();
    assert_eq!(&b, b"two");
    assert!(matches!(c.transport(), Transport::Tcp(_)), "{}", c.transport());
    drop((c, s));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ctx.rmb_memory_in_use(), 2 * RING as u64, "rings a peer of our uid may hold were reused");

    // A peer of another uid (allowed) copies: after a move our ring goes back at once.
    if !tests::require_root("a_move_to_tcp_keeps_the_ring_only_from_a_peer_that_may_lend (other uid)") {
        return;
    }
    const PEER: u32 = 65533;
    let ctx = Context::new();
    let l = SmcListener::builder()
        .context(&ctx)
        .shm(ShmConfig::default().allow_uid(PEER).rmb_size(RING).rmb_max(RING))
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let peer = tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
        .args(["client", &addr.to_string()])
        .env("SMC_TOKIO_SHM_ALLOW_UIDS", "0")
        .uid(PEER)
        .gid(PEER)
        .kill_on_drop(true)
        .output();
    let server = async {
        let (s, _) = l.accept().await.unwrap();
        assert_eq!(s.transport(), Transport::SmcD);
        let held = ctx.rmb_memory_in_use();
        s.hand_back().await.unwrap();
        let after = ctx.rmb_memory_in_use();
        // The peer's 64 KiB echo goes on over TCP.
        let (mut rd, mut wr) = s.into_split();
        let _ = tokio::io::copy(&mut rd, &mut wr).await;
        (held, after)
    };
    let (out, (held, after)) = bounded(30, async { tokio::join!(peer, server) }).await;
    let out = out.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("TRANSPORT smc-d") && text.contains("OK"), "{text}");
    assert_eq!(held, RING as u64);
    assert_eq!(after, 0, "the ring written for a peer of another uid was kept after the move");
}

#[tokio::test]
async fn request_response_over_shared_memory_keeps_to_the_start_of_the_ring() {
    // Lent bytes show where they lie: with the ring starting over whenever the reader has
    // consumed everything, 200 exchanges of 1000 bytes stay within the ring's first pages
    // instead of walking its 64 KiB.
    let (mut c, mut s) = smc_pair(ShmConfig::default().rmb_size(64 * 1024).rmb_max(64 * 1024)).await;
    let (mut lo, mut hi) = (usize::MAX, 0usize);
    let msg = pattern(1000);
    for _ in 0..200 {
        s.write_all(&msg).await.unwrap();
        let mut got = 0;
        while got < msg.len() {
            let mut rc = &mut c;
            let buf = bounded(10, rc.fill_buf()).await.unwrap();
            let (at, len) = span(buf);
            assert!(buf == &msg[got..got + len], "the bytes lent are not the ones written");
            lo = lo.min(at);
            hi = hi.max(at + len);
            got += len;
            rc.consume(len);
        }
        c.write_all(b"k").await.unwrap();
        let mut k = [0u8; 1];
        s.read_exact(&mut k).await.unwrap();
    }
    // More than one message's span: the bytes were lent from the ring, not copied to one place.
    assert!(hi - lo > 1000, "the bytes were not lent ({} bytes spanned)", hi - lo);
    assert!(hi - lo <= 4096 + 1000, "request/response walked {} bytes of the ring", hi - lo);
}

/// A write half's `as_ref` reaches the stream's reads. While the owned read half holds bytes
/// from `fill_buf` (lent from the ring, or peeked on TCP), such a read takes none of them
/// (`WouldBlock`): taken, they would be consumed under the half's reference (and the peer free
/// to write over them), or the half's `consume` would take the bytes after them. Once the half
/// consumed them, reads through either handle go on. Over SMC and over TCP.
#[tokio::test]
async fn reads_through_a_write_half_do_not_take_what_the_read_half_holds() {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    for builder in [SmcStream::builder(), SmcStream::builder().policy(Policy::TcpOnly)] {
        let (c, s) = tokio::join!(builder.connect(l.local_addr().unwrap()), l.accept());
        reads_through_a_write_half_on(c.unwrap(), s.unwrap().0).await;
    }
}

async fn reads_through_a_write_half_on(client: SmcStream, mut server: SmcStream) {
    let what = client.transport();
    server.write_all(b"held").await.unwrap();
    server.flush().await.unwrap();
    let (mut rd, wr) = client.into_split();
    let held = bounded(10, rd.fill_buf()).await.unwrap();
    assert_eq!(held, b"held", "{what}");
    let mut b = [0u8; 8];
    assert_eq!(wr.as_ref().try_read(&mut b).map_err(|e| e.kind()), Err(std::io::ErrorKind::WouldBlock), "{what}");
    assert_eq!(bounded(10, wr.as_ref().peek(&mut b)).await.unwrap(), 4, "{what}: a peek sees them");
    assert_eq!(held, b"held", "{what}");
    let n = held.len();
    rd.consume(n);
    server.write_all(b"next").await.unwrap();
    server.flush().await.unwrap();
    let got = loop {
        bounded(10, wr.as_ref().readable()).await.unwrap();
        match wr.as_ref().try_read(&mut b) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => break r.unwrap(),
        }
    };
    assert_eq!(&b[..got], b"next", "{what}");
    drop((rd, wr));
}
