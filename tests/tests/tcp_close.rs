//! How the TCP connection under a shared-memory connection ends: once both applications let
//! go, the last of the two resets it, so no socket of either end goes through the FIN exchange
//! or stays in `TIME_WAIT`; while only one has, that one keeps its socket open, within a budget
//! of a sixteenth of the descriptor limit, and a peer that moves or ends TCP meanwhile meets
//! the close it would have met before.

use std::os::fd::AsRawFd;
use std::time::Duration;

use smc_tokio::{Context, SmcListener, SmcStream, Transport};
use tests::bounded;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// TCP states of /proc/net/tcp (include/net/tcp_states.h).
const ESTABLISHED: u8 = 0x01;
const FIN_WAIT2: u8 = 0x05;
const TIME_WAIT: u8 = 0x06;

/// The states of the IPv4 TCP sockets of connections between `clients` (local ports) and
/// `port`, either end, from /proc/net/tcp. (Only our connections: sockets of other tests may
/// sit in `TIME_WAIT` on the same port, a listener's port being reusable over them.)
fn states_on(port: u16, clients: &[u16]) -> Vec<u8> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port_of = |field: &str| u16::from_str_radix(field.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, remote) = (port_of(f[1]), port_of(f[2]));
            let ours = (local == port && clients.contains(&remote)) || (remote == port && clients.contains(&local));
            ours.then(|| u8::from_str_radix(f[3], 16).unwrap())
        })
        .collect()
}

/// The states of those sockets once the held sockets of `ctxs` are gone (waits up to 10 s for
/// the peers' closes to be taken in).
async fn settled_states(port: u16, clients: &[u16], ctxs: &[&Context]) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held: u64 = ctxs.iter().map(|c| c.stats().tcp_held).sum();
        let states = states_on(port, clients);
        if (held == 0 && states.is_empty()) || tokio::time::Instant::now() > deadline {
            assert_eq!(held, 0, "sockets still held for peers' closes");
            return states;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn connect(ctx: &Context, port: u16) -> std::io::Result<SmcStream> {
    SmcStream::builder().context(ctx).connect(("127.0.0.1", port)).await
}

/// One request and answer; `server_first`: the server closes first (HTTP's `Connection:
/// close`), else the client does (a connection per request from the client's side).
async fn exchange(client: &mut SmcStream, server: &mut SmcStream, server_first: bool) {
    client.write_all(b"request").await.unwrap();
    let mut req = [0u8; 7];
    server.read_exact(&mut req).await.unwrap();
    server.write_all(b"answer").await.unwrap();
    let mut ans = [0u8; 6];
    client.read_exact(&mut ans).await.unwrap();
    assert_eq!((&req, &ans), (b"request", b"answer"));
    let (first, second) = if server_first { (server, client) } else { (client, server) };
    first.shutdown().await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(second.read_to_end(&mut rest).await.unwrap(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn closed_smc_d_connections_leave_no_socket_behind_either_end_closing_first() {
    let (cctx, sctx) = (Context::new(), Context::new());
    let listener = SmcListener::builder().context(&sctx).bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    for server_first in [true, false] {
        let mut clients = Vec::new();
        for _ in 0..20 {
            let (c, s) = tokio::join!(connect(&cctx, port), listener.accept());
            let (mut c, (mut s, _)) = (c.unwrap(), s.unwrap());
            assert_eq!((c.transport(), s.transport()), (Transport::SmcD, Transport::SmcD));
            clients.push(c.local_addr().unwrap().port());
            bounded(10, exchange(&mut c, &mut s, server_first)).await;
            if server_first {
                drop(s);
                drop(c);
            } else {
                drop(c);
                drop(s);
            }
        }
        let left = bounded(15, settled_states(port, &clients, &[&cctx, &sctx])).await;
        assert!(left.is_empty(), "server first {server_first}: sockets left in states {left:x?}");
    }

    // The same exchange over tokio's TCP leaves TIME_WAIT sockets, which this reading sees.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (c, s) = tokio::join!(tokio::net::TcpStream::connect(("127.0.0.1", port)), l.accept());
    let (mut c, (mut s, _)) = (c.unwrap(), s.unwrap());
    let clients = [c.local_addr().unwrap().port()];
    s.shutdown().await.unwrap();
    assert_eq!(c.read(&mut [0u8; 1]).await.unwrap(), 0);
    drop((s, c));
    assert!(states_on(port, &clients).contains(&TIME_WAIT), "tcp left {:x?}", states_on(port, &clients));
}

/// While the client holds its end, the server's socket stays open (no FIN: the client's TCP
/// socket stays established while it reads the end of stream from its ring); the client's
/// close resets it.
#[tokio::test(flavor = "current_thread")]
async fn a_closed_end_holds_its_socket_until_the_peer_closes() {
    let (cctx, sctx) = (Context::new(), Context::new());
    let listener = SmcListener::builder().context(&sctx).bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (c, s) = tokio::join!(connect(&cctx, port), listener.accept());
    let (mut c, (s, _)) = (c.unwrap(), s.unwrap());
    assert_eq!(c.transport(), Transport::SmcD);
    let clients = [c.local_addr().unwrap().port()];
    drop(s);
    assert_eq!(bounded(10, c.read(&mut [0u8; 8])).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sctx.stats().tcp_held, 1);
    assert_eq!(cctx.stats().tcp_held, 0);
    let states = states_on(port, &clients);
    assert_eq!(states, [ESTABLISHED, ESTABLISHED], "both ends stay established while one holds");
    assert!(c.peer_addr().is_ok() && c.take_error().unwrap().is_none());
    drop(c);
    let left = bounded(15, settled_states(port, &clients, &[&cctx, &sctx])).await;
    assert!(left.is_empty(), "sockets left in states {left:x?}");
}

/// A peer that puts bytes on the TCP connection while we hold it (as a move's frame would
/// be) meets our close as it would have without the hold (a close with a byte unread: a
/// reset), and the hold ends while the peer still has its stream.
#[tokio::test(flavor = "current_thread")]
async fn bytes_on_a_held_socket_end_the_hold() {
    let (cctx, sctx) = (Context::new(), Context::new());
    let listener = SmcListener::builder().context(&sctx).bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (c, s) = tokio::join!(connect(&cctx, port), listener.accept());
    let (mut c, (s, _)) = (c.unwrap(), s.unwrap());
    let clients = [c.local_addr().unwrap().port()];
    drop(s);
    assert_eq!(bounded(10, c.read(&mut [0u8; 8])).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sctx.stats().tcp_held, 1);
    // SAFETY: a valid buffer of 1 byte; the descriptor is the client's TCP socket, open.
    let n = unsafe { libc::send(c.as_raw_fd(), b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    assert_eq!(n, 1);
    let left = bounded(15, settled_states(port, &clients, &[&sctx])).await;
    assert!(left.is_empty(), "sockets left in states {left:x?}");
    assert_eq!(c.read(&mut [0u8; 8]).await.unwrap(), 0, "the stream still reads its end");
    drop(c);
}

/// Sockets held for peers' closes stay within a sixteenth of the descriptor limit: past it, a
/// close sends its FIN at once.
#[test]
fn held_sockets_stay_within_their_budget() {
    // SAFETY: reads and sets this process's own limit through valid pointers.
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = 512;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // Made after the limit went down: their budget is 512 / 16 = 32.
        let (cctx, sctx) = (Context::new(), Context::new());
        let listener = SmcListener::builder().context(&sctx).bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mut clients, mut ports) = (Vec::new(), Vec::new());
        for _ in 0..40 {
            let (c, s) = tokio::join!(connect(&cctx, port), listener.accept());
            let (mut c, (s, _)) = (c.unwrap(), s.unwrap());
            assert_eq!(c.transport(), Transport::SmcD);
            ports.push(c.local_addr().unwrap().port());
            drop(s);
            assert_eq!(bounded(10, c.read(&mut [0u8; 8])).await.unwrap(), 0);
            clients.push(c);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(sctx.stats().tcp_held, 32);
        let states = states_on(port, &ports);
        let fin_wait = states.iter().filter(|&&s| s == FIN_WAIT2).count();
        assert_eq!(fin_wait, 8, "closes past the budget send a FIN: {states:x?}");
        drop(clients);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while sctx.stats().tcp_held != 0 {
            assert!(tokio::time::Instant::now() < deadline, "held sockets not let go");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

/// Both ends let go at once (neither saw the other's close yet, so both hold) inside a
/// runtime that is then dropped: the groups' drivers, rescued, take the closes in and the holds
/// end.
#[test]
fn holds_end_after_the_runtime_that_made_them_is_dropped() {
    let (cctx, sctx) = (Context::new(), Context::new());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let listener = SmcListener::builder().context(&sctx).bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (c, s) = tokio::join!(connect(&cctx, port), listener.accept());
        let (c, (s, _)) = (c.unwrap(), s.unwrap());
        drop(c);
        drop(s);
        assert_eq!((cctx.stats().tcp_held, sctx.stats().tcp_held), (1, 1));
    });
    drop(rt);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cctx.stats().tcp_held + sctx.stats().tcp_held != 0 {
        assert!(std::time::Instant::now() < deadline, "holds left after the runtime went");
        std::thread::sleep(Duration::from_millis(10));
    }
}
