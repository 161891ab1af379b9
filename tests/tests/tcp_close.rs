//! How the TCP connection under a shared-memory connection ends: once both applications let
//! go, the last of the two resets it, so no socket of either end goes through the FIN exchange
//! or stays in `TIME_WAIT`; while only one has, that one keeps its socket open, within a budget
//! of a sixteenth of the descriptor limit, and a peer that moves or ends TCP meanwhile meets
//! the close it would have met before.

use std::os::fd::AsRawFd;
use std::time::Duration;

use smc_tokio::SmcStream;
use tests::bounded;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "support/close_bed.rs"]
mod close_bed;
use close_bed::{settled_states, states_on, wait_for, Bed, ESTABLISHED, FIN_WAIT2, TIME_WAIT};

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
    let bed = Bed::new().await;
    for server_first in [true, false] {
        let mut clients = Vec::new();
        for _ in 0..20 {
            let (mut c, mut s, port) = bed.pair().await;
            clients.push(port);
            bounded(10, exchange(&mut c, &mut s, server_first)).await;
            if server_first {
                drop(s);
                drop(c);
            } else {
                drop(c);
                drop(s);
            }
        }
        let left = bounded(15, settled_states(bed.port, &clients, &[&bed.cctx, &bed.sctx])).await;
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
    // The kernel may take the client's FIN later, in a softirq of its own: wait for the
    // server's socket to reach TIME_WAIT.
    wait_for("tcp leaves a socket in TIME_WAIT", || states_on(port, &clients).contains(&TIME_WAIT)).await;
}

/// While the client holds its end, the server's socket stays open (no FIN: the client's TCP
/// socket stays established while it reads the end of stream from its ring); the client's
/// close resets it.
#[tokio::test(flavor = "current_thread")]
async fn a_closed_end_holds_its_socket_until_the_peer_closes() {
    let bed = Bed::new().await;
    let (c, port) = bed.server_gone().await;
    assert_eq!((bed.sctx.stats().tcp_held, bed.cctx.stats().tcp_held), (1, 0));
    assert_eq!(states_on(bed.port, &[port]), [ESTABLISHED, ESTABLISHED], "both ends stay established while one holds");
    assert!(c.peer_addr().is_ok() && c.take_error().unwrap().is_none());
    drop(c);
    let left = bounded(15, settled_states(bed.port, &[port], &[&bed.cctx, &bed.sctx])).await;
    assert!(left.is_empty(), "sockets left in states {left:x?}");
}

/// A peer that puts bytes on the TCP connection while we hold it (as a move's frame would
/// be) meets our close as it would have without the hold (a close with a byte unread: a
/// reset), and the hold ends while the peer still has its stream.
#[tokio::test(flavor = "current_thread")]
async fn bytes_on_a_held_socket_end_the_hold() {
    let bed = Bed::new().await;
    let (mut c, port) = bed.server_gone().await;
    assert_eq!(bed.sctx.stats().tcp_held, 1);
    // SAFETY: a valid buffer of 1 byte; the descriptor is the client's TCP socket, open.
    let n = unsafe { libc::send(c.as_raw_fd(), b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    assert_eq!(n, 1);
    let left = bounded(15, settled_states(bed.port, &[port], &[&bed.sctx])).await;
    assert!(left.is_empty(), "sockets left in states {left:x?}");
    assert_eq!(c.read(&mut [0u8; 8]).await.unwrap(), 0, "the stream still reads its end");
}

/// Both ends let go at once (neither saw the other's close yet, so both hold) inside a
/// runtime that is then dropped: the groups' drivers, rescued, take the closes in and the holds
/// end.
#[test]
fn holds_end_after_the_runtime_that_made_them_is_dropped() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (cctx, sctx) = rt.block_on(async {
        let bed = Bed::new().await;
        let (c, s, _) = bed.pair().await;
        drop(c);
        drop(s);
        assert_eq!((bed.cctx.stats().tcp_held, bed.sctx.stats().tcp_held), (1, 1));
        (bed.cctx, bed.sctx)
    });
    drop(rt);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cctx.stats().tcp_held + sctx.stats().tcp_held != 0 {
        assert!(std::time::Instant::now() < deadline, "holds left after the runtime went");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A held socket whose watcher's runtime is dropped (the server's, here) is closed as it would
/// have been without the hold, with a FIN, while the client still holds its end: nothing is
/// left held with nobody to answer a peer's move on it.
#[test]
fn a_hold_whose_watcher_goes_with_its_runtime_ends() {
    let server_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let sctx = smc_tokio::Context::new();
    let listener = server_rt.block_on(smc_tokio::SmcListener::builder().context(&sctx).bind("127.0.0.1:0")).unwrap();
    let listener_port = listener.local_addr().unwrap().port();
    // The server's end is accepted and dropped on the server's runtime: its watcher runs there.
    let served = server_rt.spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        drop(s);
        listener
    });
    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cctx = smc_tokio::Context::new();
    let (c, port) = client_rt.block_on(async {
        let mut c = SmcStream::builder().context(&cctx).connect(("127.0.0.1", listener_port)).await.unwrap();
        assert_eq!(c.transport(), smc_tokio::Transport::SmcD);
        assert_eq!(bounded(10, c.read(&mut [0u8; 8])).await.unwrap(), 0);
        let port = c.local_addr().unwrap().port();
        (c, port)
    });
    let listener = server_rt.block_on(served).unwrap();
    assert_eq!(sctx.stats().tcp_held, 1);
    server_rt.block_on(async move { drop(listener) });
    drop(server_rt);
    assert_eq!(sctx.stats().tcp_held, 0, "the hold ends with its watcher");
    client_rt.block_on(wait_for("the server's FIN", || states_on(listener_port, &[port]).contains(&FIN_WAIT2)));
    drop(c);
}

/// An abort of ours (a stream dropped with bytes unread) resets the TCP connection at once, as
/// TCP's close does: nothing is held, and the peer's socket is reset while its application
/// still holds its end.
#[tokio::test(flavor = "current_thread")]
async fn an_abort_resets_at_once() {
    let bed = Bed::new().await;
    let (c, mut s, port) = bed.pair().await;
    s.write_all(b"unread").await.unwrap();
    // Arrived, and left unread.
    assert_eq!(bounded(10, c.peek(&mut [0u8; 1])).await.unwrap(), 1);
    drop(c);
    assert_eq!(bed.cctx.stats().tcp_held, 0);
    wait_for("both sockets gone", || states_on(bed.port, &[port]).is_empty()).await;
    drop(s);
}
