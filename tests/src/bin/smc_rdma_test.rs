//! `smc-rdma-test`: the RDMA (SMC-R) integration tests, run by the soft-RoCE test bed
//! (`tests/rdma-vm/run.sh`) inside qemu guests, where a verbs device exists.
//!
//! ```text
//! smc-rdma-test devices            list RDMA ports and GIDs; fails if there is none
//! smc-rdma-test abi                print the verbs structure layout the crate assumes
//! smc-rdma-test single IP          every case, server and client on this host (IP is the
//!                                  address of the rxe device's netdev)
//! smc-rdma-test server IP          serve the cases on IP:7471 and IP:7477 until killed (two-guest mode)
//! smc-rdma-test client IP          run the cases against a server on IP:7471
//! smc-rdma-test serve ADDR         (internal) a server in a child process, for the kill case
//! smc-rdma-test write-exit ADDR BYTES HOW   (internal) a writer in a child process: connect,
//!                                  write BYTES of `tests::pattern`, flush, print "WROTE", then
//!                                  end without a shutdown: HOW = return (shut the runtime down
//!                                  and exit) | exit | kill (sleep until killed); drop-return and
//!                                  drop-exit drop the stream instead of the flush, then end so
//! ```
//!
//! `SMC_RDMA_WRITER_ROUNDS` (default 10) sets how many writers per way of ending the
//! `writers_exit` case runs.
//!
//! Shared memory is switched off in every role, so that two processes on one host meet over
//! RDMA. Each case prints `PASS name` or `FAIL name: why`, is bounded in time, and the exit
//! status is the number of failures (capped at 100).

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use smc_tokio::config::{RdmaConfig, ShmConfig};
use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PORT: u16 = 7471;
/// A second server port, used only by `first_contact_100`: a client's link groups are per
/// server address, so it has none to this one until that case makes the first.
const FIRST_CONTACT_PORT: u16 = PORT + 6;
/// Bound on each case: generous for a TCG guest (about 1/50 of real speed).
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

fn listener_builder() -> smc_tokio::SmcListenerBuilder {
    // Emulated guests are slow: give clients time to start their handshake.
    SmcListener::builder()
        .shm(ShmConfig::default().enabled(false))
        .handshake_timeout(Duration::from_secs(10))
        .peek_timeout(Duration::from_secs(2))
}

fn client() -> smc_tokio::SmcStreamBuilder {
    SmcStream::builder().shm(ShmConfig::default().enabled(false)).handshake_timeout(Duration::from_secs(10))
}

/// FNV-1a over a byte stream.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, data: &[u8]) {
        for b in data {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

// ----- server --------------------------------------------------------------------------------

/// Serves one connection: the first byte picks the service.
async fn serve_conn(mut s: SmcStream) -> std::io::Result<()> {
    let mut cmd = [0u8; 1];
    s.read_exact(&mut cmd).await?;
    // Every service answers with the transport the server saw first, so the client can assert
    // both ends negotiated SMC-R.
    let t = s.transport();
    let code = if t == Transport::SmcR { b'R' } else { b'T' };
    s.write_all(&[code]).await?;
    match cmd[0] {
        b'E' => {
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await?;
            w.shutdown().await?;
        }
        b'S' => {
            let mut h = Fnv::new();
            let mut n = 0u64;
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let k = s.read(&mut buf).await?;
                if k == 0 {
                    break;
                }
                h.update(&buf[..k]);
                n += k as u64;
            }
            let mut out = Vec::with_capacity(16);
            out.extend_from_slice(&n.to_be_bytes());
            out.extend_from_slice(&h.0.to_be_bytes());
            s.write_all(&out).await?;
            s.shutdown().await?;
        }
        b'F' => {
            // A header and a file under one cork, the file by sendfile: "nginx" style.
            let mut len = [0u8; 8];
            s.read_exact(&mut len).await?;
            let len = u64::from_be_bytes(len);
            let path = std::env::temp_dir().join(format!("smc-rdma-file-{}-{len}", std::process::id()));
            let data = Rng::new(len | 1).bytes(len as usize);
            std::fs::write(&path, &data)?;
            let f = std::fs::File::open(&path)?;
            let _ = std::fs::remove_file(&path);
            {
                let _cork = s.cork();
                s.write_all(b"HEADER\r\n").await?;
                let sent = s.sendfile(&f, 0, len).await?;
                if sent != len {
                    return Err(std::io::Error::other(format!("sendfile sent {sent} of {len}")));
                }
            }
            s.shutdown().await?;
        }
        b'A' => {
            // Read one byte, then drop the connection with the client's bytes unread: an abort.
            let mut one = [0u8; 1];
            s.read_exact(&mut one).await?;
            drop(s);
        }
        other => return Err(std::io::Error::other(format!("unknown command {other}"))),
    }
    Ok(())
}

/// The server of the `server` and `single` modes: the cases' port, and [`FIRST_CONTACT_PORT`].
async fn serve_cases(ip: std::net::IpAddr) -> std::io::Result<()> {
    let second = tokio::spawn(serve(SocketAddr::new(ip, FIRST_CONTACT_PORT)));
    let r = serve(SocketAddr::new(ip, PORT)).await;
    second.abort();
    r
}

async fn serve(addr: SocketAddr) -> std::io::Result<()> {
    let l = listener_builder().bind(addr).await?;
    eprintln!("serving on {}", l.local_addr()?);
    loop {
        let (s, _) = l.accept().await?;
        tokio::spawn(async move {
            if let Err(e) = serve_conn(s).await {
                eprintln!("server connection: {e}");
            }
        });
    }
}

// ----- client cases --------------------------------------------------------------------------

async fn open(addr: SocketAddr, cmd: u8) -> Result<SmcStream, String> {
    let mut s = client().connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    if s.transport() != Transport::SmcR {
        return Err(format!("client transport is {}, expected smc-r", s.transport()));
    }
    s.write_all(&[cmd]).await.map_err(|e| format!("command: {e}"))?;
    let mut code = [0u8; 1];
    s.read_exact(&mut code).await.map_err(|e| format!("server's transport code: {e}"))?;
    if code[0] != b'R' {
        return Err("server's side of the connection is not smc-r".into());
    }
    Ok(s)
}

/// A listener of its own at `at`, serving each connection as the cases' server does, on the
/// current runtime (its tasks, and the link groups it makes, live there); its address.
async fn serve_on(at: SocketAddr) -> Result<SocketAddr, String> {
    let l = listener_builder().bind(at).await.map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = serve_conn(s).await;
            });
        }
    });
    Ok(addr)
}

/// Writes and flushes in turns while the link breaks under the connection as a failed work
/// completion breaks it: the link first, its group when its driver looks. A write right after
/// the break, or a flush that was waiting for a delivery when it came, meets the failed link
/// before the group does (a new group with a listener of its own, on a current-thread runtime:
/// its driver cannot look in between). Neither may end the connection: it moves to TCP (the
/// flush waits for that and finishes there), and every byte comes back once, in order.
///
/// Whether a flush is still waiting when it is first polled depends on how soon the adapter
/// completes the message (soft-RoCE in one guest may complete it in the posting call): a
/// connection whose every flush was done at once is checked as it ran, and the case tries
/// another, up to [`FLUSH_WAIT_TRIES`] connections, before it fails.
fn case_flush_across_link_failure(ip: std::net::IpAddr) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let addr = serve_on(SocketAddr::new(ip, PORT + 7)).await?;
        flush_across_link_failure(addr, false).await?;
        for _ in 0..FLUSH_WAIT_TRIES {
            if flush_across_link_failure(addr, true).await? {
                return Ok(());
            }
        }
        Err(format!(
            "no flush waited for its delivery in {FLUSH_WAIT_TRIES} connections: the link was never broken under one"
        ))
    })
}

/// A close in flight when the link fails under it: the writer drops its stream while its last
/// write is not yet delivered (a flush polled once is still waiting), and the link breaks at
/// once, before the adapter carries the rest (a current-thread runtime: nothing runs in
/// between). The reader gets what arrived and then an error, never a clean end after a stream
/// cut short: the writer's TCP socket ends with a FIN only once its close is delivered, and
/// with a reset when it never is. Connections whose write was delivered at once are checked as
/// they ran (every byte, then the end), and another is tried, up to [`FLUSH_WAIT_TRIES`].
fn case_close_across_link_failure(ip: std::net::IpAddr) -> Result<(), String> {
    const TOTAL: usize = 4 << 20;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let l = listener_builder().bind(SocketAddr::new(ip, PORT + 11)).await.map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        for attempt in 0..FLUSH_WAIT_TRIES {
            let data = Rng::new(0xc105e + attempt as u64).bytes(TOTAL);
            let builder = client();
            let (c, a) = tokio::join!(builder.connect(addr), l.accept());
            let mut c = c.map_err(|e| format!("connect: {e}"))?;
            let (mut srv, _) = a.map_err(|e| format!("accept: {e}"))?;
            if c.transport() != Transport::SmcR || srv.transport() != Transport::SmcR {
                return Err(format!("transports {} and {}", c.transport(), srv.transport()));
            }
            let reader = tokio::spawn(async move {
                let mut got = Vec::with_capacity(TOTAL);
                let end = srv.read_to_end(&mut got).await;
                (got, end)
            });
            c.write_all(&data).await.map_err(|e| format!("write: {e}"))?;
            let in_flight = tokio::time::timeout(Duration::ZERO, c.flush()).await.is_err();
            if in_flight {
                c.drop_and_break_link().map_err(|e| format!("break: {e}"))?;
            } else {
                drop(c);
            }
            let (got, end) = reader.await.map_err(|e| e.to_string())?;
            if !data.starts_with(&got) {
                return Err(format!("the {} bytes read are not the stream's head", got.len()));
            }
            match (in_flight, got.len() == TOTAL, &end) {
                (_, false, Ok(_)) => {
                    return Err(format!("a clean end after {} of {TOTAL} bytes (in flight: {in_flight})", got.len()))
                }
                (false, _, Err(e)) => return Err(format!("no break, and the read ended in {e}")),
                (true, _, _) => {
                    println!(
                        "  close_across_link_failure: connection {attempt}: {} of {TOTAL} bytes, then {end:?}",
                        got.len()
                    );
                    return Ok(());
                }
                (false, true, Ok(_)) => {}
            }
        }
        Err(format!("no write was still in flight at its close in {FLUSH_WAIT_TRIES} connections"))
    })
}

/// Connections [`case_flush_across_link_failure`] tries for a flush that waits. A fresh-clone CI
/// run (2026-12-05) met a connection in which all 384 flushes after the first quarter were done
/// when first polled; other runs found a waiting flush in their first connection.
const FLUSH_WAIT_TRIES: usize = 5;

/// One connection of [`case_flush_across_link_failure`]. `waiting`: the break comes while a
/// flush waits for its message's delivery (the adapter has not completed it); else at once
/// after a flushed piece, before a write that meets it. Whether the link was broken: always
/// when not `waiting`; when `waiting`, only if a flush waited (else the connection's bytes are
/// still checked, over the link it kept).
async fn flush_across_link_failure(addr: SocketAddr, waiting: bool) -> Result<bool, String> {
    const TOTAL: usize = 8 << 20;
    const PIECE: usize = 16 << 10;
    let s = open(addr, b'E').await?;
    let before = s.transport();
    let (mut r, mut w) = s.into_split();
    let data = Rng::new(0xf1a5).bytes(TOTAL);
    let writer = async {
        let (mut at, mut broke) = (0, false);
        while at < TOTAL {
            let end = (at + PIECE).min(TOTAL);
            if !broke && !waiting && at >= TOTAL / 4 {
                w.break_link().map_err(|e| format!("break_link: {e}"))?;
                broke = true;
                // At once, before the group's driver can look: a write that meets the failed
                // link, then the flush.
                match w.try_write(&data[at..end]) {
                    Ok(n) => at += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(format!("write right after the break: {e}")),
                }
            } else {
                w.write_all(&data[at..end]).await.map_err(|e| format!("write at {at}: {e}"))?;
                at = end;
                // Polled once: a flush that waits for its delivery gets the break under it
                // (nothing runs between the two on this runtime), then is awaited again.
                if !broke
                    && waiting
                    && at >= TOTAL / 4
                    && tokio::time::timeout(Duration::ZERO, w.flush()).await.is_err()
                {
                    w.break_link().map_err(|e| format!("break_link: {e}"))?;
                    broke = true;
                }
            }
            w.flush().await.map_err(|e| format!("flush after {at} bytes: {e}"))?;
        }
        if !broke && !waiting {
            return Err("the link was never broken".into());
        }
        Ok::<_, String>(broke)
    };
    let reader = async {
        let mut got = vec![0u8; TOTAL];
        r.read_exact(&mut got).await.map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(got)
    };
    // A writer that fails ends the case at once (the reader would wait for its bytes).
    let (broke, got) = tokio::try_join!(writer, reader)?;
    if got != data {
        return Err("the echo differs".into());
    }
    if !broke {
        if w.transport() != before {
            return Err(format!("transport {} after no break, {before} before", w.transport()));
        }
        println!("  flush_across_link_failure (a flush waiting): every flush was done when first polled; trying again");
        return Ok(false);
    }
    let want = Transport::Tcp(smc_tokio::FallbackReason::HandedBack(smc_tokio::HandbackCause::LinkFailed));
    if w.transport() != want {
        return Err(format!("transport after the break is {}, expected {want}", w.transport()));
    }
    println!(
        "  flush_across_link_failure{}: {} MiB written and flushed in {} KiB pieces, echoed and compared; transport {before} before, {} after",
        if waiting { " (a flush waiting)" } else { "" },
        TOTAL >> 20,
        PIECE >> 10,
        w.transport()
    );
    Ok(true)
}

/// Memory this process has pinned (registered with the adapter), from `/proc/self/status`.
fn vm_pin_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmPin:"))?;
    line[6..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// How [`case_move`] moves its connection to TCP.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Move {
    /// The application asks (`hand_back`).
    HandBack,
    /// The client's link group fails, as when a port went down: its queue pair is torn down
    /// under the peer, whose side fails too.
    FailLink,
    /// The path between the hosts loses every RoCE packet ([`PathCut`]) while both processes
    /// and their TCP connection live: each side's queue pair gives up on a peer that no longer
    /// answers, and neither hears of a failure from the other.
    CutPath,
}

/// While it lives, this host drops the packets that arrive on the interface holding `ip` and
/// match `what` ([`PathCut::ROCE`]: every RoCE v2 packet, so TCP and everything else pass;
/// or everything from one host), with a policy-routing rule whose route is a blackhole. The
/// rule must come before the table of local addresses (preference 0, which new rules of
/// preference 0 would follow), so that table moves behind it while the cut lasts. Soft-RoCE
/// between two processes of one host never routes its packets (the device loops them back):
/// this takes two hosts.
struct PathCut {
    /// The rule's selector: the interface, then `what`.
    selector: Vec<String>,
}

impl PathCut {
    /// UDP (protocol 17, by number: the guest has no `/etc/protocols`) to RoCE v2's port.
    const ROCE: [&'static str; 4] = ["ipproto", "17", "dport", "4791"];

    fn new(ip: std::net::IpAddr, what: &[&str]) -> Result<PathCut, String> {
        let out = ip_cmd(&["-o", "addr", "show", "to", &ip.to_string()])?;
        let dev = out.split_whitespace().nth(1).ok_or_else(|| format!("no interface holds {ip}"))?;
        let selector = ["iif", dev].into_iter().chain(what.iter().copied()).map(String::from).collect();
        ip_cmd(&["rule", "add", "pref", "100", "lookup", "local"])?;
        let cut = PathCut { selector };
        ip_cmd(&["rule", "del", "pref", "0", "lookup", "local"])?;
        ip_cmd(&cut.blackhole("add"))?;
        Ok(cut)
    }

    /// `ip` arguments that add or delete (`op`) the rule that drops the packets.
    fn blackhole<'a>(&'a self, op: &'a str) -> Vec<&'a str> {
        let mut args = vec!["rule", op, "pref", "10"];
        args.extend(self.selector.iter().map(String::as_str));
        args.push("blackhole");
        args
    }
}

impl Drop for PathCut {
    fn drop(&mut self) {
        let _ = ip_cmd(&["rule", "add", "pref", "0", "lookup", "local"]);
        let _ = ip_cmd(&self.blackhole("del"));
        let _ = ip_cmd(&["rule", "del", "pref", "100", "lookup", "local"]);
    }
}

/// The server's host goes silent under an open echo connection (this host drops everything
/// from it, TCP included): our queue pair gives up on the peer, the connection waits a second
/// for the TCP connection's word, moves, and the move's frame is never acknowledged. The bound
/// on unacknowledged data set for that wait (13 s) must end the connection, as a peer that
/// went away: every byte that came back before is read, in order, then `SmcError::PeerGone`
/// (not an end of stream: the peer never closed), within the case's bound where the system's
/// retransmissions would take a quarter of an hour. Prints how long the end took.
async fn case_silent_host(addr: SocketAddr) -> Result<(), String> {
    const CHUNK: usize = 64 << 10;
    let data = Rng::new(0x51_1e47).bytes(CHUNK);
    let mut s = open(addr, b'E').await?;
    // Traffic both ways first, all of it echoed.
    let mut buf = vec![0u8; CHUNK];
    for _ in 0..4 {
        echo_chunk(&mut s, &data, &mut buf, "before the cut").await?;
    }
    let local = s.local_addr().map_err(|e| e.to_string())?.ip();
    let peer = addr.ip().to_string();
    let _cut = PathCut::new(local, &["from", &peer])?;
    let t = Instant::now();
    // One more chunk: its RDMA writes are what our queue pair gives up on. It fits in the
    // peer's ring, so the write returns.
    s.write_all(&data).await.map_err(|e| format!("write after the cut: {e}"))?;
    let mut got = 0usize;
    let end = loop {
        match s.read(&mut buf).await {
            Ok(0) => return Err(format!("end of stream after {got} bytes of the last chunk: the peer never closed")),
            Ok(n) => {
                if buf[..n] != data[got..got + n] {
                    return Err(format!("the echo differs in bytes {got}..{}", got + n));
                }
                got += n;
            }
            Err(e) => break e,
        }
    };
    let took = t.elapsed();
    println!(
        "  silent_host: ended {:.1} s after the cut ({} after {got} echoed bytes of the last chunk); transport {}",
        took.as_secs_f64(),
        end,
        s.transport()
    );
    // Within the case's bound (the system's retransmissions would take a quarter of an hour),
    // and as a peer that went away, not as a move that failed.
    if smc_tokio::SmcError::from_io(&end) != Some(&smc_tokio::SmcError::PeerGone) {
        return Err(format!("the connection ended with {end:?}, expected SmcError::PeerGone"));
    }
    Ok(())
}

/// Writes `data` and reads its echo into `buf`, which must then equal it.
async fn echo_chunk(s: &mut SmcStream, data: &[u8], buf: &mut [u8], what: &str) -> Result<(), String> {
    s.write_all(data).await.map_err(|e| format!("{what}: write: {e}"))?;
    s.read_exact(buf).await.map_err(|e| format!("{what}: read: {e}"))?;
    if buf != data {
        return Err(format!("{what}: the echo differs"));
    }
    Ok(())
}

/// An idle connection whose path breaks moves to TCP without a byte of its own to send: its
/// link group (made by a context of this case's own, with a link test every second) tests the
/// idle link, the test's delivery fails, and the connection moves as on any link failure.
/// Then it echoes over TCP, nothing lost.
async fn case_idle_path_cut(addr: SocketAddr) -> Result<(), String> {
    const CHUNK: usize = 64 << 10;
    const TEST_EVERY: Duration = Duration::from_secs(1);
    let data = Rng::new(0x1d1e).bytes(CHUNK);
    let ctx = smc_tokio::Context::new();
    let mut s = client()
        .context(&ctx)
        .rdma(RdmaConfig::default().link_test_interval(TEST_EVERY))
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    if s.transport() != Transport::SmcR {
        return Err(format!("client transport is {}, expected smc-r", s.transport()));
    }
    let mut buf = vec![0u8; CHUNK];
    s.write_all(b"E").await.map_err(|e| format!("command: {e}"))?;
    let mut code = [0u8; 1];
    s.read_exact(&mut code).await.map_err(|e| format!("server's transport code: {e}"))?;
    if code[0] != b'R' {
        return Err("server's side of the connection is not smc-r".into());
    }
    for _ in 0..4 {
        echo_chunk(&mut s, &data, &mut buf, "before the cut").await?;
    }
    let local = s.local_addr().map_err(|e| e.to_string())?.ip();
    let cut = PathCut::new(local, &PathCut::ROCE)?;
    let t = Instant::now();
    // Idle: nothing is written or read until the connection moved.
    // Two of our tests' intervals and the retries (the peer, testing every 30 s, would find
    // the break only later than this).
    while !matches!(s.transport(), Transport::Tcp(_)) {
        if t.elapsed() > Duration::from_secs(20) {
            return Err(format!("still {} 20 s after the path of the idle connection was cut", s.transport()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = t.elapsed();
    drop(cut);
    // Our link found it (its test), not the peer's.
    if s.transport() != Transport::Tcp(smc_tokio::FallbackReason::HandedBack(smc_tokio::HandbackCause::LinkFailed)) {
        return Err(format!("transport after the move is {}, expected a move for our failed link", s.transport()));
    }
    for _ in 0..4 {
        echo_chunk(&mut s, &data, &mut buf, "after the move").await?;
    }
    println!(
        "  idle_path_cut: moved {:.1} s after the cut (link test every {} s), then echoed over tcp",
        took.as_secs_f64(),
        TEST_EVERY.as_secs()
    );
    Ok(())
}

/// Runs iproute2's `ip` with `args`; its output, or what it said when it failed.
fn ip_cmd(args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("/usr/sbin/ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if !out.status.success() {
        return Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Echoes `size` random bytes through a fresh connection and moves it back to its TCP socket
/// once `cut` bytes went out, as `how` says. Every byte must come back once, in order, and the
/// client must end on TCP, moved for that reason. Prints the longest stall of the reads.
async fn case_move(addr: SocketAddr, size: usize, cut: usize, how: Move) -> Result<(), String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // The stream is made and checked in chunks of its own seed, so a 64 MiB echo needs no
    // 64 MiB buffers (the emulated guest has 1 GiB for every case).
    const CHUNK: usize = 64 << 10;
    let chunk = |i: usize| Rng::new(0x5eed ^ i as u64).bytes(CHUNK);
    let s = open(addr, b'E').await?;
    let before = s.transport();
    let sent = AtomicUsize::new(0);
    let writer = async {
        let mut at = 0;
        let mut cur = chunk(0);
        while at < size {
            s.writable().await.map_err(|e| format!("writable: {e}"))?;
            let off = at % CHUNK;
            let end = (CHUNK - off).min(size - at);
            match s.try_write(&cur[off..off + end]) {
                Ok(n) => {
                    at += n;
                    sent.store(at, Ordering::Relaxed);
                    if at % CHUNK == 0 {
                        cur = chunk(at / CHUNK);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("write after {at} bytes: {e}")),
            }
        }
        Ok::<_, String>(())
    };
    let reader = async {
        let mut buf = vec![0u8; CHUNK];
        let mut want = chunk(0);
        let (mut at, mut gap, mut last) = (0, Duration::ZERO, Instant::now());
        while at < size {
            s.readable().await.map_err(|e| format!("readable: {e}"))?;
            let off = at % CHUNK;
            let room = (CHUNK - off).min(size - at);
            match s.try_read(&mut buf[..room]) {
                Ok(0) => return Err(format!("eof after {at} of {size} bytes")),
                Ok(k) => {
                    if buf[..k] != want[off..off + k] {
                        return Err(format!("the echo differs in bytes {at}..{}", at + k));
                    }
                    at += k;
                    if at % CHUNK == 0 {
                        want = chunk(at / CHUNK);
                    }
                    gap = gap.max(last.elapsed());
                    last = Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("read after {at} bytes: {e}")),
            }
        }
        Ok::<_, String>(gap)
    };
    let mover = async {
        while sent.load(Ordering::Relaxed) < cut {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let pinned = vm_pin_kib();
        let mut path_cut = None;
        match how {
            Move::HandBack => s.hand_back().await.map_err(|e| format!("hand_back: {e}"))?,
            Move::FailLink => s.fail_link().map_err(|e| format!("fail_link: {e}"))?,
            Move::CutPath => {
                let local = s.local_addr().map_err(|e| e.to_string())?.ip();
                path_cut = Some(PathCut::new(local, &PathCut::ROCE)?);
                // The path stays cut until the connection moved: neither side may hear from
                // the other over RDMA meanwhile.
                let t = Instant::now();
                while !matches!(s.transport(), Transport::Tcp(_)) {
                    if t.elapsed() > Duration::from_secs(60) {
                        let rules = ip_cmd(&["rule", "show"]).unwrap_or_else(|e| e);
                        return Err(format!(
                            "still {} 60 s after the path was cut, {} bytes sent; stats: {}; rules:\n{rules}",
                            s.transport(),
                            sent.load(Ordering::Relaxed),
                            smc_tokio::stats()
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                println!("  move_path_cut: moved {:.1} s after the cut", t.elapsed().as_secs_f64());
            }
        }
        Ok::<_, String>((pinned, path_cut))
    };
    // The first error ends the case (the cut, if any, goes with the mover's result).
    let ((), gap, (pinned_before, path_cut)) = tokio::try_join!(writer, reader, mover)?;
    drop(path_cut);
    if how == Move::FailLink {
        // The failed group's pools (a registered chunk each, 2 MiB) are unpinned when its link
        // is torn down (on the setup thread), though the moved connection still holds the
        // group.
        let mut after = vm_pin_kib();
        let t = Instant::now();
        while after.zip(pinned_before).is_some_and(|(a, b)| a + 4096 > b) && t.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            after = vm_pin_kib();
        }
        println!("  move_link_failed: VmPin {pinned_before:?} kB before the failure, {after:?} kB after the move");
        match (pinned_before, after) {
            (Some(b), Some(a)) if a + 4096 <= b => {}
            (Some(b), Some(a)) => {
                return Err(format!("the failed group's pools are still pinned: VmPin {b} kB before, {a} kB after"))
            }
            _ => return Err("no VmPin in /proc/self/status".into()),
        }
    }
    use smc_tokio::HandbackCause::{LinkFailed, Peer, Requested};
    // Over a cut path either side may give up on the other first, and the other follows its
    // frame.
    let causes: &[_] = match how {
        Move::HandBack => &[Requested],
        Move::FailLink => &[LinkFailed],
        Move::CutPath => &[LinkFailed, Peer],
    };
    if !causes.iter().any(|c| s.transport() == Transport::Tcp(smc_tokio::FallbackReason::HandedBack(*c))) {
        return Err(format!("transport after the move is {}, expected a move for {causes:?}", s.transport()));
    }
    println!(
        "  move_{}: {} MiB echoed and compared, moved after {} KiB; transport {before} before, {} after; longest read stall {:.1} ms",
        match how {
            Move::HandBack => "hand_back",
            Move::FailLink => "link_failed",
            Move::CutPath => "path_cut",
        },
        size >> 20,
        cut >> 10,
        s.transport(),
        gap.as_secs_f64() * 1e3
    );
    Ok(())
}

/// Echoes `data` through a fresh connection, writing and reading concurrently.
async fn echo(addr: SocketAddr, data: Vec<u8>) -> Result<(), String> {
    echo_on(open(addr, b'E').await?, data).await
}

/// Echoes `data` through `s`, an open echo connection.
async fn echo_on(s: SmcStream, data: Vec<u8>) -> Result<(), String> {
    let (mut r, mut w) = s.into_split();
    let want = {
        let mut h = Fnv::new();
        h.update(&data);
        (data.len(), h.0)
    };
    let writer = tokio::spawn(async move {
        for chunk in data.chunks(50_000) {
            w.write_all(chunk).await?;
        }
        w.shutdown().await
    });
    let mut h = Fnv::new();
    let mut n = 0;
    let mut buf = vec![0u8; 32 << 10];
    loop {
        let k = r.read(&mut buf).await.map_err(|e| format!("read after {n} bytes: {e}"))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k;
    }
    writer.await.map_err(|e| e.to_string())?.map_err(|e| format!("write: {e}"))?;
    if (n, h.0) != want {
        return Err(format!("echoed {n} bytes hash {:x}, sent {} hash {:x}", h.0, want.0, want.1));
    }
    Ok(())
}

async fn case_handshake(addr: SocketAddr) -> Result<(), String> {
    echo(addr, b"hello, smc-r!!".to_vec()).await
}

async fn case_random_sizes(addr: SocketAddr) -> Result<(), String> {
    let mut rng = Rng::new(0x5eed);
    let mut sizes = vec![1usize, 7, 39, 40, 41, 4095, 4096, 65_536, 262_143, 262_144, 262_145, 1 << 20];
    for _ in 0..6 {
        sizes.push((rng.next_u64() % (3 << 20)) as usize);
    }
    for n in sizes {
        echo(addr, rng.bytes(n)).await.map_err(|e| format!("{n} bytes: {e}"))?;
    }
    Ok(())
}

/// `conns` connections opened at once share the client's link group with the server: they
/// make at most one new group between them (the first contact, when there was no group with
/// that server address; the rest wait and join it), counted `ends_here` times where both of
/// its ends are in this process.
async fn case_many(addr: SocketAddr, conns: usize, ends_here: u64) -> Result<(), String> {
    let groups_before = smc_tokio::stats().link_groups;
    let mut tasks = Vec::new();
    for i in 0..conns {
        tasks.push(tokio::spawn(echo(addr, Rng::new(i as u64 + 1).bytes(16 << 10))));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        t.await.map_err(|e| e.to_string())?.map_err(|e| format!("connection {i}: {e}"))?;
    }
    let made = smc_tokio::stats().link_groups.saturating_sub(groups_before);
    println!("  connections_{conns} to {addr}: {made} new link groups (live before: {groups_before})");
    if made > ends_here {
        return Err(format!("{conns} connections opened together made {made} link groups (ends), not at most one"));
    }
    Ok(())
}

async fn case_sendfile_from_server(addr: SocketAddr) -> Result<(), String> {
    for len in [0u64, 1, 5000, 300_001, 2 << 20] {
        let mut s = open(addr, b'F').await?;
        s.write_all(&len.to_be_bytes()).await.map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.map_err(|e| format!("{len}: {e}"))?;
        let mut want = b"HEADER\r\n".to_vec();
        want.extend(Rng::new(len | 1).bytes(len as usize));
        if got != want {
            return Err(format!("file of {len} bytes: got {} bytes, differing", got.len()));
        }
    }
    Ok(())
}

async fn case_sendfile_to_server(addr: SocketAddr) -> Result<(), String> {
    let len = 1_500_000usize;
    let data = Rng::new(77).bytes(len);
    let path = std::env::temp_dir().join(format!("smc-rdma-up-{}", std::process::id()));
    std::fs::write(&path, &data).map_err(|e| e.to_string())?;
    let f = std::fs::File::open(&path).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&path);
    let mut s = open(addr, b'S').await?;
    {
        let _cork = s.cork();
        s.write_all(b"prefix").await.map_err(|e| e.to_string())?;
        let sent = s.sendfile(&f, 0, len as u64).await.map_err(|e| format!("sendfile: {e}"))?;
        if sent != len as u64 {
            return Err(format!("sendfile sent {sent} of {len}"));
        }
    }
    s.shutdown().await.map_err(|e| e.to_string())?;
    let mut reply = [0u8; 16];
    s.read_exact(&mut reply).await.map_err(|e| format!("reply: {e}"))?;
    let mut h = Fnv::new();
    h.update(b"prefix");
    h.update(&data);
    let n = u64::from_be_bytes(reply[..8].try_into().unwrap_or_default());
    let hash = u64::from_be_bytes(reply[8..].try_into().unwrap_or_default());
    if (n, hash) != (len as u64 + 6, h.0) {
        return Err(format!("server counted {n} bytes hash {hash:x}"));
    }
    Ok(())
}

async fn case_half_close(addr: SocketAddr) -> Result<(), String> {
    let mut s = open(addr, b'S').await?;
    s.write_all(b"half").await.map_err(|e| e.to_string())?;
    s.shutdown().await.map_err(|e| e.to_string())?;
    // Writing after our shutdown fails; reading still works until the server's EOF.
    if s.write_all(b"x").await.is_ok() {
        return Err("write after shutdown succeeded".into());
    }
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).await.map_err(|e| e.to_string())?;
    if reply.len() != 16 || reply[..8] != 4u64.to_be_bytes() {
        return Err(format!("reply {reply:?}"));
    }
    Ok(())
}

async fn case_abort(addr: SocketAddr) -> Result<(), String> {
    let mut s = open(addr, b'A').await?;
    s.write_all(&vec![1u8; 64 << 10]).await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 16];
    match s.read(&mut buf).await {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
        other => Err(format!("read after the server's abort gave {other:?}, expected a reset")),
    }
}

/// A hostile CDC message on one connection (a producer cursor far outside the ring) ends that
/// connection with an error on the server; another connection on the same link group keeps
/// its bytes intact.
async fn case_corrupt_cdc(addr: SocketAddr) -> Result<(), String> {
    let mut bad = open(addr, b'E').await?;
    let good = open(addr, b'E').await?;
    if bad.link_group() != good.link_group() {
        return Err("the two connections are on different link groups".into());
    }
    bad.send_corrupt_cdc(|f| f[14..18].copy_from_slice(&0xFFFF_FFF0u32.to_be_bytes()))
        .map_err(|e| format!("corrupt send: {e}"))?;
    // The server aborts the bad connection: its read sees a reset (or the TCP close).
    let mut buf = [0u8; 16];
    match bad.read(&mut buf).await {
        Err(_) | Ok(0) => {}
        Ok(n) => return Err(format!("bad connection still delivered {n} bytes")),
    }
    echo_on(good, Rng::new(99).bytes(300_000)).await.map_err(|e| format!("other connection of the group: {e}"))
}

async fn case_no_device(addr: SocketAddr) -> Result<(), String> {
    let before = smc_tokio::stats().rdma_unavailable;
    let mut s = SmcStream::builder()
        .shm(ShmConfig::default().enabled(false))
        .rdma(RdmaConfig::default().device("no-such-device"))
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    if !matches!(s.transport(), Transport::Tcp(_)) {
        return Err(format!("transport {} without a device, expected tcp", s.transport()));
    }
    s.write_all(b"E").await.map_err(|e| e.to_string())?;
    let mut code = [0u8; 1];
    s.read_exact(&mut code).await.map_err(|e| e.to_string())?;
    if code[0] != b'T' {
        return Err("server did not see a tcp connection".into());
    }
    s.write_all(b"plain").await.map_err(|e| e.to_string())?;
    let mut five = [0u8; 5];
    s.read_exact(&mut five).await.map_err(|e| e.to_string())?;
    let after = smc_tokio::stats().rdma_unavailable;
    if &five != b"plain" || after[3] <= before[3] {
        return Err(format!("echo {five:?}, no-port count {} -> {}", before[3], after[3]));
    }
    Ok(())
}

/// A server in a child process is killed while the client streams to it: the client must see
/// an error (or EOF) in bounded time, and new connections to a new server still work.
async fn case_peer_killed(ip: std::net::IpAddr) -> Result<(), String> {
    let addr = SocketAddr::new(ip, PORT + 1);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = std::process::Command::new(&exe)
        .args(["serve", &addr.to_string()])
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let result = async {
        let mut s = None;
        for _ in 0..100 {
            match open(addr, b'S').await {
                Ok(c) => {
                    s = Some(c);
                    break;
                }
                Err(e) if e.starts_with("connect") => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => return Err(e),
            }
        }
        let mut s = s.ok_or("child server never came up")?;
        let chunk = vec![3u8; 64 << 10];
        let mut sent = 0usize;
        let started = Instant::now();
        let mut killed = false;
        loop {
            if !killed && sent >= 1 << 20 {
                child.kill().map_err(|e| e.to_string())?;
                let _ = child.wait();
                killed = true;
            }
            match s.write_all(&chunk).await {
                Ok(()) => sent += chunk.len(),
                Err(e) => {
                    if !killed {
                        return Err(format!("write failed before the kill: {e}"));
                    }
                    println!("  survivor's write failed after {sent} bytes: {e}");
                    break;
                }
            }
            if started.elapsed() > Duration::from_secs(90) {
                return Err("writes kept succeeding after the peer was killed".into());
            }
        }
        Ok(())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The writer side of `case_writers_exit`, in a child process.
async fn write_exit(addr: SocketAddr, n: usize, how: &str) -> std::io::Result<()> {
    let mut s = client().connect(addr).await?;
    if s.transport() != Transport::SmcR {
        return Err(std::io::Error::other(format!("transport {}", s.transport())));
    }
    s.write_all(&tests::pattern(n)).await?;
    if let Some(how) = how.strip_prefix("drop-") {
        // No flush: the stream's close is what carries the last bytes out.
        drop(s);
        return match how {
            "exit" => std::process::exit(0),
            _ => Ok(()),
        };
    }
    s.flush().await?;
    println!("WROTE");
    std::io::stdout().flush()?;
    match how {
        "exit" => std::process::exit(0),
        "kill" => loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        },
        _ => Ok(()),
    }
}

/// Writers in child processes write 256 KiB, flush and end without a shutdown (returning from
/// main, calling exit, or SIGKILLed after "WROTE"): the server reads every byte, then EOF.
async fn case_writers_exit(ip: std::net::IpAddr) -> Result<(), String> {
    const BYTES: usize = 256 << 10;
    let rounds: usize = std::env::var("SMC_RDMA_WRITER_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let l = listener_builder().bind(SocketAddr::new(ip, PORT + 2)).await.map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let want = tests::pattern(BYTES);
    let groups_before = smc_tokio::stats().link_groups;
    for how in ["return", "exit", "kill", "drop-return", "drop-exit"] {
        // Writers that drop their stream without a flush and end at once (`drop-*`) may lose
        // their last bytes over RDMA (their queue pairs go with the process; a runtime's
        // shutdown waits a little for the close in flight): then the reader must get an error
        // after what arrived, never a clean end after a stream cut short.
        let unflushed = how.starts_with("drop-");
        let (mut short, mut errors, mut cut) = (0, 0, 0);
        let mut first = None;
        let t = Instant::now();
        for i in 0..rounds {
            let mut child = tokio::process::Command::new(&exe)
                .args(["write-exit", &addr.to_string(), &BYTES.to_string(), how])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("spawn: {e}"))?;
            let mut lines =
                tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().ok_or("no stdout")?));
            let (mut s, _) = l.accept().await.map_err(|e| e.to_string())?;
            if s.transport() != Transport::SmcR {
                return Err(format!("{how} round {i}: server transport {}", s.transport()));
            }
            if how == "kill" {
                match lines.next_line().await {
                    Ok(Some(l)) if l == "WROTE" => {}
                    other => return Err(format!("kill round {i}: writer said {other:?}")),
                }
                child.start_kill().map_err(|e| e.to_string())?;
                let _ = child.wait().await;
            }
            let mut got = Vec::with_capacity(BYTES);
            let end = s.read_to_end(&mut got).await;
            let _ = child.wait().await;
            let bad = if unflushed {
                // What arrived is the stream's head, and a short one ends in an error.
                let cut_short = got.len() < want.len() || end.is_err();
                cut += usize::from(cut_short && end.is_err());
                !want.starts_with(&got) || (cut_short && end.is_ok())
            } else {
                got != want || end.is_err()
            };
            short += usize::from(got != want);
            errors += usize::from(end.is_err());
            if bad && first.is_none() {
                first = Some(format!("round {i}: read {} of {BYTES}, end {end:?}", got.len()));
            }
        }
        let rss = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| l[6..].trim().to_string()))
            .unwrap_or_default();
        println!(
            "  writers_exit {how}: {rounds} rounds over smc-r, {short} short or wrong, {errors} errors, {cut} cut short with an error ({:.1} s; link groups now {}, VmRSS {rss})",
            t.elapsed().as_secs_f64(),
            smc_tokio::stats().link_groups
        );
        if let Some(first) = first {
            return Err(format!("{how}: first failure {first}"));
        }
    }
    // Every writer is gone: the server's link groups with them go too (orderly ones idle out
    // after 60 s; those of writers that died without a close once their abort went unanswered
    // for 30 s), instead of holding their registered memory for good.
    let t = Instant::now();
    while smc_tokio::stats().link_groups > groups_before + 1 {
        if t.elapsed() > Duration::from_secs(100) {
            return Err(format!(
                "{} link groups of dead writers still up after {:?}",
                smc_tokio::stats().link_groups - groups_before,
                t.elapsed()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  writers_exit: the writers' link groups were gone {:.1} s after the last one",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A link group outlives the runtime that set it up: runtime A's connection creates the client
/// group to a fresh listener, runtime B's joins it, A is dropped, and B's connection still echoes
/// a megabyte over the same group (its completion channel moved to the rescue driver).
fn case_group_outlives_runtime(ip: std::net::IpAddr) -> Result<(), String> {
    let rt = |n| tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build();
    let server = rt(1).map_err(|e| e.to_string())?;
    let addr = server.block_on(async {
        let addr = serve_on(SocketAddr::new(ip, PORT + 5)).await?;
        Ok::<_, String>(addr)
    })?;
    let before = smc_tokio::stats().link_groups_rescued;
    let a = rt(1).map_err(|e| e.to_string())?;
    let b = rt(1).map_err(|e| e.to_string())?;
    let sa = a.block_on(open(addr, b'E'))?;
    let sb = b.block_on(open(addr, b'E'))?;
    if sa.link_group().is_none() || sa.link_group() != sb.link_group() {
        return Err(format!("groups differ: {:?} {:?}", sa.link_group(), sb.link_group()));
    }
    drop(sa);
    drop(a);
    b.block_on(echo_on(sb, Rng::new(7).bytes(1 << 20))).map_err(|e| format!("after runtime A dropped: {e}"))?;
    let rescued = smc_tokio::stats().link_groups_rescued - before;
    if rescued == 0 {
        return Err("the group was not moved to the rescue driver".into());
    }
    Ok(())
}

/// 20 concurrent SMC-R handshakes (server and clients, all new link groups) on a current-thread
/// runtime, with a ticker task that sleeps 1 ms at a time: every blocking setup call (verbs
/// objects, memory registration, GID scans) must run on a blocking thread. The count of such
/// calls on a runtime thread must stay 0; the ticker's longest gap is reported.
fn case_setup_off_runtime(ip: std::net::IpAddr) -> Result<(), String> {
    const CLIENTS: usize = 20;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let addr = serve_on(SocketAddr::new(ip, PORT + 3)).await?;
        let before = smc_tokio::faults::rdma_setup_calls_on_runtime();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let t = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    worst = worst.max(t.elapsed().saturating_sub(Duration::from_millis(1)));
                }
                worst
            })
        };
        let t = Instant::now();
        let clients: Vec<_> =
            (0..CLIENTS).map(|i| tokio::spawn(echo(addr, Rng::new(900 + i as u64).bytes(4096)))).collect();
        for (i, c) in clients.into_iter().enumerate() {
            c.await.map_err(|e| e.to_string())?.map_err(|e| format!("client {i}: {e}"))?;
        }
        let took = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let worst = ticker.await.map_err(|e| e.to_string())?;
        let on_runtime = smc_tokio::faults::rdma_setup_calls_on_runtime() - before;
        // The control: the same ticker while as many blocking threads burn the CPU for as
        // long, with no handshake at all. On a one-CPU guest the ticker's overrun is then the
        // scheduler sharing the CPU, not a stall of the runtime thread.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let t = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    worst = worst.max(t.elapsed().saturating_sub(Duration::from_millis(1)));
                }
                worst
            })
        };
        let burners: Vec<_> = (0..CLIENTS)
            .map(|_| {
                tokio::task::spawn_blocking(move || {
                    let until = Instant::now() + took;
                    while Instant::now() < until {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        for b in burners {
            let _ = b.await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let control = ticker.await.map_err(|e| e.to_string())?;
        println!(
            "  setup_off_runtime: {CLIENTS} handshakes in {:.1} ms, setup calls on the runtime {on_runtime}, longest ticker overrun {:.2} ms (control, {CLIENTS} busy blocking threads and no handshake: {:.2} ms)",
            took.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3,
            control.as_secs_f64() * 1e3
        );
        if on_runtime != 0 {
            return Err(format!("{on_runtime} blocking rdma setup calls ran on the runtime thread"));
        }
        Ok(())
    })
}

/// Links whose QPs send CDC frames from registered buffers (as on a device that grants no
/// inline data) carry every byte: both ends of a new group are built that way.
async fn case_no_inline_sends(ip: std::net::IpAddr) -> Result<(), String> {
    smc_tokio::faults::rdma_without_inline_sends(true);
    let result = async {
        let l = listener_builder().bind(SocketAddr::new(ip, PORT + 4)).await.map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        let server = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let _ = serve_conn(s).await;
                });
            }
        });
        let r = async {
            echo(addr, Rng::new(4242).bytes(1 << 20)).await?;
            // Small messages ride in the frame itself, from the registered slot.
            for n in [1usize, 7, 40] {
                echo(addr, Rng::new(n as u64).bytes(n)).await?;
            }
            Ok::<(), String>(())
        }
        .await;
        server.abort();
        r
    }
    .await;
    smc_tokio::faults::rdma_without_inline_sends(false);
    result
}

/// Registered (pinned) memory is charged to the context's RMB budget by the chunk, on both ends
/// and for both pools (our receive rings, and our send buffers the size of the peer's): with
/// rings of 64 KiB, a connection's first chunks are 2 MiB each (`REG_CHUNK_BYTES`, 32 rings),
/// 4 MiB an end, charged once it is set up. They stay charged while they are registered, and
/// come back when the group ends (after its idle time). A context whose budget has no room for
/// a chunk serves the connection as TCP, whichever end it is, and every byte arrives.
async fn case_pinned_memory_charged(ip: std::net::IpAddr) -> Result<(), String> {
    const RING: u32 = 64 << 10;
    const PINNED: u64 = 2 * (2 << 20);
    let shm = || {
        ShmConfig::default()
            .enabled(false)
            .rmb_size(RING)
            .rmb_max(0)
            .rmbs_per_group(64)
            .idle_timeout(Duration::from_secs(1))
    };
    let listen = |ctx: &smc_tokio::Context, port: u16| {
        let b = listener_builder().context(ctx).shm(shm());
        async move {
            let l = b.bind(SocketAddr::new(ip, port)).await.map_err(|e| e.to_string())?;
            let addr = l.local_addr().map_err(|e| e.to_string())?;
            let task = tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    tokio::spawn(async move {
                        let _ = serve_conn(s).await;
                    });
                }
            });
            Ok::<_, String>((addr, task))
        }
    };
    let connect = |ctx: &smc_tokio::Context, addr: SocketAddr| {
        let b = SmcStream::builder().context(ctx).shm(shm()).handshake_timeout(Duration::from_secs(10));
        async move {
            let mut s = b.connect(addr).await.map_err(|e| format!("connect: {e}"))?;
            s.write_all(b"E").await.map_err(|e| format!("command: {e}"))?;
            let mut code = [0u8; 1];
            s.read_exact(&mut code).await.map_err(|e| format!("server's transport code: {e}"))?;
            Ok::<_, String>((s, code[0]))
        }
    };
    let in_use = |what: &str, ctx: &smc_tokio::Context, want: u64| {
        let got = ctx.rmb_memory_in_use();
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: {got} bytes charged, expected {want}"))
        }
    };
    async fn given_back(what: &str, ctx: &smc_tokio::Context) -> Result<(), String> {
        let t = Instant::now();
        while ctx.rmb_memory_in_use() != 0 {
            if t.elapsed() > Duration::from_secs(60) {
                return Err(format!("{what}: {} bytes still charged after 60 s", ctx.rmb_memory_in_use()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    // Room enough: both ends on SMC-R, each charged its two chunks, until its group ends.
    let (server_ctx, client_ctx) = (smc_tokio::Context::new(), smc_tokio::Context::new());
    let (addr, server) = listen(&server_ctx, PORT + 8).await?;
    let (s, code) = connect(&client_ctx, addr).await?;
    if s.transport() != Transport::SmcR || code != b'R' {
        server.abort();
        return Err(format!("with room: client {}, server code {}", s.transport(), code as char));
    }
    let charged = in_use("client", &client_ctx, PINNED).and_then(|()| in_use("server", &server_ctx, PINNED));
    let echoed = echo_on(s, Rng::new(88).bytes(1 << 20)).await;
    let back = match (charged, echoed) {
        (Ok(()), Ok(())) => {
            async {
                given_back("client", &client_ctx).await?;
                given_back("server", &server_ctx).await
            }
            .await
        }
        (c, e) => c.and(e),
    };
    server.abort();
    back?;

    // No room for a chunk, on either end: TCP on both, every byte there, nothing charged.
    for (client_cap, server_cap, port) in [(1 << 20, u64::MAX, PORT + 9), (u64::MAX, 1 << 20, PORT + 10)] {
        let (server_ctx, client_ctx) = (smc_tokio::Context::new(), smc_tokio::Context::new());
        server_ctx.set_rmb_memory_cap(server_cap);
        client_ctx.set_rmb_memory_cap(client_cap);
        let (addr, server) = listen(&server_ctx, port).await?;
        let r = async {
            let (mut s, code) = connect(&client_ctx, addr).await?;
            let which = if client_cap < server_cap { "the client's" } else { "the server's" };
            if !matches!(s.transport(), Transport::Tcp(_)) || code != b'T' {
                return Err(format!(
                    "no room in {which} budget: client {}, server code {}",
                    s.transport(),
                    code as char
                ));
            }
            let data = Rng::new(port.into()).bytes(256 << 10);
            s.write_all(&data).await.map_err(|e| e.to_string())?;
            s.shutdown().await.map_err(|e| e.to_string())?;
            let mut back = Vec::new();
            s.read_to_end(&mut back).await.map_err(|e| e.to_string())?;
            if back != data {
                return Err(format!("over tcp: {} bytes came back of {}", back.len(), data.len()));
            }
            given_back("client (no room)", &client_ctx).await?;
            given_back("server (no room)", &server_ctx).await
        }
        .await;
        server.abort();
        r?;
    }
    Ok(())
}

/// `single`: server and client in this process (one guest), where a link group has both its
/// ends here and the cases that kill a peer run too.
async fn run_cases(addr: SocketAddr, single: bool) -> usize {
    let mut failures = 0;
    let ends_here = if single { 2 } else { 1 };
    // A comma-separated list of the cases to run, for a quicker run by hand; all when unset.
    let only: Option<Vec<String>> =
        std::env::var("SMC_RDMA_CASES").ok().map(|v| v.split(',').map(str::to_owned).collect());
    macro_rules! case {
        ($name:literal, $f:expr) => {
            case!($name, $f, CASE_TIMEOUT)
        };
        ($name:literal, $f:expr, $bound:expr) => {{
            if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == $name)) {
                println!("SKIP {}", $name);
            } else {
                let t = Instant::now();
                let bound: Duration = $bound;
                let r = match tokio::time::timeout(bound, $f).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("timed out after {bound:?}")),
                };
                match r {
                    Ok(()) => println!("PASS {} ({:.1} s)", $name, t.elapsed().as_secs_f64()),
                    Err(e) => {
                        failures += 1;
                        println!("FAIL {}: {e}", $name);
                    }
                }
                let _ = std::io::stdout().flush();
            }
        }};
    }
    case!("handshake_smc_r", case_handshake(addr));
    case!("integrity_random_sizes", case_random_sizes(addr));
    case!("connections_100", case_many(addr, 100, ends_here));
    case!("first_contact_100", case_many(SocketAddr::new(addr.ip(), FIRST_CONTACT_PORT), 100, ends_here));
    case!("cork_sendfile_from_server", case_sendfile_from_server(addr));
    case!("cork_sendfile_to_server", case_sendfile_to_server(addr));
    case!("half_close", case_half_close(addr));
    case!("abort", case_abort(addr));
    case!("corrupt_cdc_fails_one_connection", case_corrupt_cdc(addr));
    case!("no_device_falls_back", case_no_device(addr));
    case!("hand_back_mid_stream", case_move(addr, 16 << 20, 4 << 20, Move::HandBack));
    case!("link_failure_moves_to_tcp", case_move(addr, 64 << 20, 8 << 20, Move::FailLink), Duration::from_secs(300));
    if !single {
        case!("path_cut_moves_to_tcp", case_move(addr, 16 << 20, 4 << 20, Move::CutPath));
        case!("silent_host_ends_the_connection", case_silent_host(addr));
        case!("idle_path_cut_moves_to_tcp", case_idle_path_cut(addr));
    }
    if single {
        case!("peer_killed_mid_stream", case_peer_killed(addr.ip()));
        // Three ways of ending, SMC_RDMA_WRITER_ROUNDS writers each, at up to a second a writer.
        let rounds: u64 = std::env::var("SMC_RDMA_WRITER_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
        case!(
            "writers_exit",
            case_writers_exit(addr.ip()),
            CASE_TIMEOUT.max(Duration::from_secs(3 * rounds)) + Duration::from_secs(100)
        );
        let ip = addr.ip();
        case!("setup_off_runtime", async move {
            tokio::task::spawn_blocking(move || case_setup_off_runtime(ip)).await.map_err(|e| e.to_string())?
        });
        case!("no_inline_sends", case_no_inline_sends(addr.ip()));
        case!("group_outlives_runtime", async move {
            tokio::task::spawn_blocking(move || case_group_outlives_runtime(ip)).await.map_err(|e| e.to_string())?
        });
        case!("flush_across_link_failure", async move {
            tokio::task::spawn_blocking(move || case_flush_across_link_failure(ip)).await.map_err(|e| e.to_string())?
        });
        case!("close_across_link_failure", async move {
            tokio::task::spawn_blocking(move || case_close_across_link_failure(ip)).await.map_err(|e| e.to_string())?
        });
        case!("pinned_memory_charged", case_pinned_memory_charged(ip), Duration::from_secs(300));
    }
    let s = smc_tokio::stats();
    println!("stats: {s}");
    if s.client.smc_r == 0 {
        println!("FAIL stats: no smc-r connection counted");
        failures += 1;
    }
    failures
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let ip = |i: usize| -> std::net::IpAddr {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: smc-rdma-test devices|abi|single IP|server IP|client IP|serve ADDR");
            std::process::exit(2)
        })
    };
    let failures = match args.first().map(String::as_str) {
        Some("devices") => match smc_tokio::rdma::describe_devices() {
            Ok(ports) if !ports.is_empty() => {
                ports.iter().for_each(|p| println!("{p}"));
                0
            }
            Ok(_) => {
                println!("no ports");
                1
            }
            Err(e) => {
                println!("no rdma: {e}");
                1
            }
        },
        Some("abi") => {
            print!("{}", smc_tokio::rdma::abi_report());
            0
        }
        Some("write-exit") => {
            let addr: SocketAddr = args.get(1).and_then(|a| a.parse().ok()).unwrap_or_else(|| std::process::exit(2));
            let n: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or_else(|| std::process::exit(2));
            let how = args.get(3).cloned().unwrap_or_default();
            let res = rt.block_on(write_exit(addr, n, &how));
            if how.ends_with("return") {
                // As returning from `main` does: the runtime shuts down (and drops its tasks).
                drop(rt);
            }
            match res {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("write-exit: {e}");
                    1
                }
            }
        }
        Some("serve") => {
            let addr: SocketAddr = args.get(1).and_then(|a| a.parse().ok()).unwrap_or_else(|| std::process::exit(2));
            rt.block_on(serve(addr)).map(|_| 0).unwrap_or(1)
        }
        Some("server") => {
            let ip = ip(1);
            rt.block_on(serve_cases(ip)).map(|_| 0).unwrap_or(1)
        }
        Some("client") => {
            let addr = SocketAddr::new(ip(1), PORT);
            rt.block_on(async {
                // Wait for the other guest's server.
                for _ in 0..600 {
                    if tokio::net::TcpStream::connect(addr).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                run_cases(addr, false).await
            })
        }
        Some("single") => {
            let addr = SocketAddr::new(ip(1), PORT);
            rt.block_on(async {
                tokio::spawn(async move {
                    if let Err(e) = serve_cases(addr.ip()).await {
                        eprintln!("server: {e}");
                    }
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
                run_cases(addr, true).await
            })
        }
        _ => {
            eprintln!("usage: smc-rdma-test devices|abi|single IP|server IP|client IP|serve ADDR");
            2
        }
    };
    std::process::exit(failures.min(100) as i32);
}
