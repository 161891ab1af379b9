//! Cork, sendfile and their combinations with plain writes, on shared memory and on TCP.

use std::io::Write as _;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use smc_tokio::config::ShmConfig;
use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::{bounded, smc_pair, Rng};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Shm,
    Tcp,
}

/// A connected pair (client, server) over `kind`, with rings of `rmb` bytes on shm.
async fn pair(kind: Kind, rmb: u32) -> (SmcStream, SmcStream) {
    let shm = ShmConfig::default().rmb_size(rmb).enabled(kind == Kind::Shm);
    if kind == Kind::Shm {
        return smc_pair(shm).await;
    }
    let l = SmcListener::builder().shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let builder = SmcStream::builder().shm(shm);
    let (c, s) = tokio::join!(builder.connect(addr), l.accept());
    let (c, (s, _)) = (c.unwrap(), s.unwrap());
    assert!(!c.transport().is_smc(), "{:?}", c.transport());
    assert!(!s.transport().is_smc());
    (c, s)
}

/// Polls one read without waiting: `None` when it would block.
fn try_read_now<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Option<std::io::Result<usize>> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut rb = ReadBuf::new(buf);
    match std::pin::Pin::new(r).poll_read(&mut cx, &mut rb) {
        Poll::Ready(Ok(())) => Some(Ok(rb.filled().len())),
        Poll::Ready(Err(e)) => Some(Err(e)),
        Poll::Pending => None,
    }
}

/// How long TCP holds corked bytes before it sends them by itself (tcp(7), `TCP_CORK`).
const TCP_CORK_CEILING: Duration = Duration::from_millis(200);

/// Checks that none of the bytes corked since `since` is readable on `r` yet, and returns what
/// one read took anyway. On TCP the kernel sends corked bytes once they have waited its
/// ceiling, so "not yet" is certain only before it (a stalled thread may come here later):
/// bytes found after it are taken, not failed.
fn nothing_readable_yet<R: AsyncRead + Unpin>(kind: Kind, r: &mut R, since: Instant, what: &str) -> Vec<u8> {
    let mut buf = vec![0u8; 64 << 10];
    let n = match try_read_now(r, &mut buf) {
        None => return Vec::new(),
        Some(read) => read.unwrap(),
    };
    let late = kind == Kind::Tcp && since.elapsed() >= TCP_CORK_CEILING;
    assert!(late, "{kind:?}: {what}: {n} corked bytes readable");
    buf.truncate(n);
    buf
}

/// Reads what a cork just pushed, after `got` (what the "not yet" checks took), and checks it
/// is `want`. Right after the push, with no sleep: on shm the bytes are in the peer's ring and
/// announced before the push returns, so one poll finds them; on TCP the push happened in it,
/// and the reads only wait for loopback delivery.
async fn read_pushed(kind: Kind, s: &mut SmcStream, mut got: Vec<u8>, want: &[u8], what: &str) {
    let mut buf = [0u8; 64];
    match kind {
        Kind::Shm => {
            let n = try_read_now(s, &mut buf).unwrap_or_else(|| panic!("{what}: not visible at once")).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        Kind::Tcp => {
            while got.len() < want.len() {
                let n = bounded(5, s.read(&mut buf)).await.unwrap();
                assert_ne!(n, 0, "{what}: end of stream");
                got.extend_from_slice(&buf[..n]);
            }
        }
    }
    assert_eq!(got, want, "{kind:?}: {what}");
}

fn temp_file(data: &[u8]) -> (std::path::PathBuf, std::fs::File) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("smc-tokio-test-{}-{n}", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(data).unwrap();
    (path.clone(), std::fs::File::open(&path).unwrap())
}

async fn corked_write_invisible_until_the_guard_drops(kind: Kind) {
    let (mut c, mut s) = pair(kind, 64 << 10).await;
    let corked = Instant::now();
    let guard = c.cork();
    c.write_all(b"hello").await.unwrap();
    c.write_all(b" corked").await.unwrap();
    let early = nothing_readable_yet(kind, &mut s, corked, "corked bytes are not visible");
    drop(guard);
    read_pushed(kind, &mut s, early, b"hello corked", "visible after the drop").await;

    // flush() pushes under a cork, and the cork stays. (The kernel's ceiling may count from
    // the cork: the "not yet" checks below take it from there.)
    let mut buf = [0u8; 64];
    let corked = Instant::now();
    let guard = c.cork();
    c.write_all(b"one").await.unwrap();
    c.flush().await.unwrap();
    let n = match kind {
        Kind::Shm => try_read_now(&mut s, &mut buf).expect("flushed").unwrap(),
        Kind::Tcp => bounded(5, s.read(&mut buf)).await.unwrap(),
    };
    assert_eq!(&buf[..n], b"one");
    c.write_all(b"two").await.unwrap();
    let mut early = nothing_readable_yet(kind, &mut s, corked, "still corked after flush");
    // Nested guards: only the last drop pushes.
    let inner = c.cork();
    drop(guard);
    early.extend(nothing_readable_yet(kind, &mut s, corked, "inner guard still holds"));
    drop(inner);
    read_pushed(kind, &mut s, early, b"two", "pushed").await;
}

#[tokio::test]
async fn cork_on_shm() {
    corked_write_invisible_until_the_guard_drops(Kind::Shm).await;
}

#[tokio::test]
async fn cork_on_tcp() {
    corked_write_invisible_until_the_guard_drops(Kind::Tcp).await;
}

#[tokio::test]
async fn a_full_ring_pushes_under_a_cork() {
    // A fixed 4 KiB ring (no autotuning): every 4 KiB fills it, and a full ring must push
    // even under the cork. (A ring that grows holds the tail until the guard drops.)
    let (mut c, mut s) = smc_pair(ShmConfig::default().rmb_size(4096).rmb_max(0)).await;
    let _guard = c.cork();
    let data = Rng::new(9).bytes(64 << 10);
    let (w, r) = tokio::join!(c.write_all(&data), async {
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).await.map(|_| got)
    });
    w.unwrap();
    assert!(r.unwrap() == data, "64 KiB through a 4 KiB ring under a cork");
}

/// Random interleavings of plain writes, corked sections, flushes and sendfile of random file
/// ranges; the reader reads with random sizes and checks every byte.
async fn mixed_integrity(kind: Kind, seed: u64, rmb: u32) {
    let file_data = Rng::new(seed ^ 0xF11E).bytes(1 << 20);
    let (path, file) = temp_file(&file_data);
    let (c, mut s) = pair(kind, rmb).await;
    let (_crd, mut w) = c.into_split();
    let mut rng = Rng::new(seed);
    let mut expected = Vec::new();
    let mut plan = Vec::new();
    for _ in 0..120 {
        match rng.range(0, 4) {
            0 => {
                let n = rng.range(1, 70_000);
                plan.push(Op::Write(rng.bytes(n)))
            }
            1 => {
                let off = rng.range(0, file_data.len() + 1000) as u64;
                let len = rng.range(0, 300_000) as u64;
                plan.push(Op::Sendfile(off, len));
            }
            2 => plan.push(Op::Cork(rng.range(1, 4))),
            3 => plan.push(Op::Uncork),
            _ => plan.push(Op::Flush),
        }
    }
    for op in &plan {
        match op {
            Op::Write(d) => expected.extend_from_slice(d),
            Op::Sendfile(off, len) => {
                let start = (*off as usize).min(file_data.len());
                let end = (start + *len as usize).min(file_data.len());
                expected.extend_from_slice(&file_data[start..end]);
            }
            _ => {}
        }
    }
    let writer = async {
        let mut guards = Vec::new();
        for op in plan {
            match op {
                Op::Write(d) => w.write_all(&d).await.unwrap(),
                Op::Sendfile(off, len) => {
                    let sent = w.sendfile(&file, off, len).await.unwrap();
                    let start = off.min(file_data.len() as u64);
                    assert_eq!(sent, len.min(file_data.len() as u64 - start));
                }
                Op::Cork(n) => (0..n).for_each(|_| guards.push(w.cork())),
                Op::Uncork => {
                    guards.pop();
                }
                Op::Flush => w.flush().await.unwrap(),
            }
        }
        drop(guards);
        w.shutdown().await.unwrap();
    };
    let reader = async {
        let mut got = Vec::new();
        let mut rrng = Rng::new(seed ^ 1);
        let mut buf = vec![0u8; 100_000];
        loop {
            let n = s.read(&mut buf[..rrng.range(1, 100_000)]).await.unwrap();
            if n == 0 {
                break got;
            }
            got.extend_from_slice(&buf[..n]);
        }
    };
    let ((), got) = bounded(60, async { tokio::join!(writer, reader) }).await;
    assert_eq!(got.len(), expected.len(), "{kind:?} seed {seed}: length");
    assert!(got == expected, "{kind:?} seed {seed}: bytes differ");
    std::fs::remove_file(path).unwrap();
}

enum Op {
    Write(Vec<u8>),
    Sendfile(u64, u64),
    Cork(usize),
    Uncork,
    Flush,
}

#[tokio::test]
async fn mixed_cork_sendfile_writes_on_shm() {
    for seed in 0..4 {
        mixed_integrity(Kind::Shm, seed, [4096, 64 << 10, 256 << 10][seed as usize % 3]).await;
    }
}

#[tokio::test]
async fn mixed_cork_sendfile_writes_on_tcp() {
    for seed in 10..13 {
        mixed_integrity(Kind::Tcp, seed, 64 << 10).await;
    }
}

async fn sendfile_edges(kind: Kind) {
    let data = Rng::new(3).bytes(1 << 20);
    let (path, file) = temp_file(&data);
    let (mut c, mut s) = pair(kind, 64 << 10).await;
    // Larger than the ring, in one call.
    let (sent, got) = tokio::join!(c.sendfile(&file, 0, data.len() as u64), async {
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).await.map(|_| got)
    });
    assert_eq!(sent.unwrap(), data.len() as u64);
    assert!(got.unwrap() == data);
    // Past the end: nothing. Shorter than asked: what there is.
    assert_eq!(c.sendfile(&file, data.len() as u64 + 10, 100).await.unwrap(), 0);
    assert_eq!(c.sendfile(&file, data.len() as u64 - 5, 100).await.unwrap(), 5);
    let mut tail = [0u8; 5];
    bounded(5, s.read_exact(&mut tail)).await.unwrap();
    assert_eq!(&tail, &data[data.len() - 5..]);
    // Not a regular file.
    let devnull = std::fs::File::open("/dev/null").unwrap();
    let err = c.sendfile(&devnull, 0, 10).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    // A tokio File works too (any AsFd).
    let tf = tokio::fs::File::open(&path).await.unwrap();
    assert_eq!(c.sendfile(&tf, 0, 3).await.unwrap(), 3);
    let mut head = [0u8; 3];
    bounded(5, s.read_exact(&mut head)).await.unwrap();
    assert_eq!(&head, &data[..3]);

    // A file that shrinks while it is sent: the send ends at the new end.
    let (path2, file2) = temp_file(&data);
    let shrink_to = 200_000u64;
    let sender = async {
        let n = c.sendfile(&file2, 0, data.len() as u64).await.unwrap();
        c.shutdown().await.unwrap();
        n
    };
    let receiver = async {
        let mut got = vec![0u8; 64 << 10];
        s.read_exact(&mut got).await.unwrap();
        // The sender is blocked on a full ring (shm) or socket buffer (tcp) by now, or has
        // sent more: shrink the file under it, then read the rest.
        std::fs::OpenOptions::new().write(true).open(&path2).unwrap().set_len(shrink_to).unwrap();
        s.read_to_end(&mut got).await.unwrap();
        got
    };
    let (n, got) = bounded(30, async { tokio::join!(sender, receiver) }).await;
    assert_eq!(n, got.len() as u64, "sendfile reports what was sent");
    assert!(n < data.len() as u64 || kind == Kind::Tcp, "shm: the ring cannot hold the whole file before the shrink");
    assert!(got[..64 << 10] == data[..64 << 10], "bytes received before the shrink are the file's");
    if kind == Kind::Shm {
        // On shm every byte is copied when it is read from the file, so all of it matches. TCP's
        // sendfile shares page-cache pages with the socket: bytes still queued when the file
        // shrinks may read as the truncated pages' new content (the kernel's behaviour).
        assert!(got[..] == data[..got.len()], "shm: every byte is the file's");
    }
    std::fs::remove_file(path).unwrap();
    std::fs::remove_file(path2).unwrap();
}

#[tokio::test]
async fn sendfile_edges_on_shm() {
    sendfile_edges(Kind::Shm).await;
}

#[tokio::test]
async fn sendfile_edges_on_tcp() {
    sendfile_edges(Kind::Tcp).await;
}

/// sendfile over shared memory with the ring position at every page-offset distance from 0 to
/// 40 past the file offset, from file offsets at and off a page, across more than one piece of
/// the bounce buffer that AMD Zen 3 and 4 read through at distances 1 to 31: every byte arrives
/// as the file has it. Each case has a connection of its own, whose ring starts at 0: a few
/// bytes written first put the file's first byte where the case wants it (under the 4 KiB at
/// which a drained ring starts over), and the file fits the ring (fixed in size), so the whole
/// send is one fill at that distance.
#[tokio::test]
async fn sendfile_at_every_short_page_distance_on_shm() {
    let data = Rng::new(5).bytes(150_000);
    let (path, file) = temp_file(&data);
    let shm = ShmConfig::default().rmb_size(256 << 10).rmb_max(0);
    let l = SmcListener::builder().shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let client = SmcStream::builder().shm(shm);
    for offset in [0u64, 100, 4095] {
        for distance in 0..=40u64 {
            let (c, s) = tokio::join!(client.connect(addr), l.accept());
            let (mut c, (mut s, _)) = (c.unwrap(), s.unwrap());
            assert_eq!(c.transport(), Transport::SmcD);
            let pad = (offset + distance) % 4096;
            let len = data.len() as u64 - offset;
            let what = format!("offset {offset}, distance {distance}");
            let (n, got) = bounded(10, async {
                tokio::join!(
                    async {
                        c.write_all(&vec![0xA5; pad as usize]).await.unwrap();
                        c.sendfile(&file, offset, len).await.unwrap()
                    },
                    async {
                        let mut got = vec![0u8; (pad + len) as usize];
                        s.read_exact(&mut got).await.unwrap();
                        got
                    }
                )
            })
            .await;
            assert_eq!(n, len, "{what}");
            assert!(got[..pad as usize].iter().all(|b| *b == 0xA5), "{what}: the padding");
            assert!(got[pad as usize..] == data[offset as usize..], "{what}: the file");
        }
    }
    std::fs::remove_file(path).unwrap();
}

#[tokio::test]
async fn header_and_sendfile_under_cork_arrive_together() {
    let body = Rng::new(4).bytes(4096);
    let (_path, file) = temp_file(&body);
    for kind in [Kind::Shm, Kind::Tcp] {
        let (c, mut s) = pair(kind, 256 << 10).await;
        let (_r, mut w) = c.into_split();
        let corked = Instant::now();
        let guard = w.cork();
        w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4096\r\n\r\n").await.unwrap();
        assert_eq!(w.sendfile(&file, 0, 4096).await.unwrap(), 4096);
        let mut got = nothing_readable_yet(kind, &mut s, corked, "held by the guard");
        drop(guard);
        let mut rest = vec![0u8; 41 + 4096 - got.len()];
        bounded(5, s.read_exact(&mut rest)).await.unwrap();
        got.extend_from_slice(&rest);
        assert!(got[41..] == body[..]);
    }
}

/// Small request/response with the inline first message on and off, and with autocork on: the
/// bytes are the same either way.
#[tokio::test]
async fn inline_and_autocork_keep_every_byte() {
    for cfg in [
        ShmConfig::default(),
        ShmConfig::default().inline_max(0),
        ShmConfig::default().autocork(4096),
        ShmConfig::default().autocork(64).inline_max(0).rmb_size(4096),
    ] {
        let l = SmcListener::builder().shm(cfg.clone()).bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tests::spawn_echo(l);
        let mut c = SmcStream::builder().shm(cfg.clone()).connect(addr).await.unwrap();
        assert_eq!(c.transport(), Transport::SmcD);
        let mut rng = Rng::new(11);
        for _ in 0..2000 {
            let n = rng.range(1, 60);
            let msg = rng.bytes(n);
            c.write_all(&msg).await.unwrap();
            let mut back = vec![0u8; n];
            bounded(5, c.read_exact(&mut back)).await.unwrap();
            assert_eq!(back, msg, "{cfg:?}");
        }
        // A burst of small writes (autocork coalesces them while earlier ones are unread).
        let burst: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let (mut rd, mut wr) = c.split();
        let (w, r) = tokio::join!(
            async {
                for chunk in burst.chunks(7) {
                    wr.write_all(chunk).await?;
                }
                std::io::Result::Ok(())
            },
            async {
                let mut got = vec![0u8; burst.len()];
                rd.read_exact(&mut got).await.map(|_| got)
            }
        );
        w.unwrap();
        assert!(r.unwrap() == burst, "{cfg:?}: burst");
    }
}

/// A reader that peeks until a whole message is there gets it from an autocorking writer, as
/// from TCP: autocork holds small writes until the reader consumes what came before, and a
/// peek consumes nothing, so the peek asks the writer for what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_only_peeks_gets_what_autocork_holds() {
    let (mut client, mut server) = smc_pair(ShmConfig::default().autocork(4096)).await;
    assert!(client.transport().is_smc());
    client.write_all(&[1; 10]).await.unwrap();
    client.write_all(&[2; 10]).await.unwrap();
    let mut b = [0u8; 20];
    bounded(10, async {
        while server.peek(&mut b).await.unwrap() < 20 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!((&b[..10], &b[10..]), (&[1u8; 10][..], &[2u8; 10][..]));
    let mut got = [0u8; 20];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(got, b, "the read returns what the peek showed");
}
