//! The I/O of a handback ([`crate::proto::handback`]): our frame out, the peer's frame in, our
//! unacknowledged bytes out again, all on the connection's TCP socket. The connection
//! ([`SmcConn::hand_back`](crate::smc::conn::SmcConn::hand_back)) decides when to start and what
//! the result means; this runs the exchange.

use std::io;

use tokio::net::TcpStream;

use crate::proto::handback::{Handback, HandbackError, HANDBACK_FRAME_LEN};

/// How an exchange ended without finishing.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The TCP connection ended (EOF, or a reset: `reset`) before a byte of the peer's frame:
    /// the peer is gone, not moving.
    PeerGone { reset: bool },
    /// The TCP connection failed in the middle of the exchange.
    Tcp(io::Error),
    /// The peer's frame is invalid, or the connection ended inside it.
    Protocol(HandbackError),
    /// The peer's frame did not come whole within the bound ([`PEER_FRAME_WAIT`]), while its
    /// host acknowledged ours: a peer that answers nothing, or began its frame and stopped.
    Silent,
}

/// How long a move waits for the peer's frame, from its start. A live peer's frame comes at
/// once: its watcher sees ours and answers, whatever its application does, and a peer that
/// started the move wrote its frame whole before anything else. Without a bound, a peer whose
/// kernel acknowledges our frame (so that neither the keepalive probes nor the bound on
/// unacknowledged data end it) but which sends nothing, or one byte of its frame, kept the
/// connection, its ring slot and its task for as long as it kept the TCP connection open, also
/// after our application dropped the stream. The value is well past the bounds a dead or
/// cut-off host meets first (`probe_peer_host` in `smc::conn`: keepalive and unacknowledged
/// data, about 13 s), so that such a host still ends the move as a peer that went away (its
/// bytes in our ring read first): at 13 s this bound raced the kernel's and won in the
/// soft-RoCE guests' silent-host case. Only a live peer that stays silent meets it.
pub(crate) const PEER_FRAME_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs `hb` to its end on `tcp`, resending from `copy` (our bytes from
/// [`Handback::copy_start`] on). Reads no byte past the peer's frame: what follows it is the
/// peer's stream, for the application, which may read it from `peer_frame_read` on, while our
/// resend still goes out (the peer's resend may need our application to read before ours can
/// go: see `SmcConn::release_reads`). The peer's frame must be in within `frame_wait` of the
/// start ([`PEER_FRAME_WAIT`]), else [`Failure::Silent`].
pub(crate) async fn exchange(
    tcp: &TcpStream,
    hb: &mut Handback,
    copy: &[u8],
    peer_frame_read: impl FnOnce(),
    frame_wait: std::time::Duration,
) -> Result<(), Failure> {
    let deadline = tokio::time::Instant::now() + frame_wait;
    while !hb.frame_to_write().is_empty() {
        match tcp.try_write(hb.frame_to_write()) {
            Ok(n) => hb.frame_written(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.writable().await.map_err(Failure::Tcp)?,
            Err(e) if hb.peer_frame_wanted() == HANDBACK_FRAME_LEN && is_gone(&e) => {
                return Err(Failure::PeerGone { reset: true })
            }
            Err(e) => return Err(Failure::Tcp(e)),
        }
    }
    let mut buf = [0u8; HANDBACK_FRAME_LEN];
    while !hb.peer_frame_read() {
        let want = hb.peer_frame_wanted();
        match tcp.try_read(&mut buf[..want]) {
            Ok(0) if want == HANDBACK_FRAME_LEN => return Err(Failure::PeerGone { reset: false }),
            Ok(0) => return Err(Failure::Protocol(hb.peer_eof())),
            Ok(n) => {
                hb.on_peer_bytes(&buf[..n]).map_err(Failure::Protocol)?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match tokio::time::timeout_at(deadline, tcp.readable()).await {
                    Ok(ready) => ready.map_err(Failure::Tcp)?,
                    Err(_) => return Err(Failure::Silent),
                }
            }
            Err(e) if want == HANDBACK_FRAME_LEN && is_gone(&e) => return Err(Failure::PeerGone { reset: true }),
            Err(e) => return Err(Failure::Tcp(e)),
        }
    }
    peer_frame_read();
    while let Some((from, to)) = hb.resend() {
        let start = (from - hb.copy_start()) as usize;
        let end = (to - hb.copy_start()) as usize;
        match tcp.try_write(&copy[start..end]) {
            Ok(n) => hb.resent(n as u64),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.writable().await.map_err(Failure::Tcp)?,
            Err(e) => return Err(Failure::Tcp(e)),
        }
    }
    if hb.shutdown_wanted() {
        socket2::SockRef::from(tcp).shutdown(std::net::Shutdown::Write).map_err(Failure::Tcp)?;
        hb.shutdown_sent();
    }
    Ok(())
}

/// A TCP error that says the peer's end is closed, or its host out of reach (the bound on
/// unacknowledged data or the keepalive probes ran out: `ETIMEDOUT`, or an ICMP error for it).
fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::TimedOut
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::handback::HandbackFrame;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    #[tokio::test]
    async fn both_sides_exchange_and_resend_over_a_real_socket() {
        let (mut a, mut b) = pair().await;
        // A wrote 1000 bytes (B reported 200 consumed and consumed 600); B wrote 10, A
        // consumed 3 and had reported none.
        let a_stream: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let b_stream: Vec<u8> = (0..10u8).collect();
        let mut ha = Handback::new(3, 200, 1000, false);
        let mut hb = Handback::new(600, 0, 10, true);
        let (ra, rb) = tokio::join!(
            exchange(&a, &mut ha, &a_stream[200..], || (), PEER_FRAME_WAIT),
            exchange(&b, &mut hb, &b_stream[..], || (), PEER_FRAME_WAIT)
        );
        ra.unwrap();
        rb.unwrap();
        // B reads A's bytes 600.. after A's frame; A reads B's bytes 3.., then B's end.
        let mut got_b = vec![0u8; 400];
        tokio::io::AsyncReadExt::read_exact(&mut b, &mut got_b).await.unwrap();
        assert_eq!(got_b, &a_stream[600..]);
        let mut got_a = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut a, &mut got_a).await.unwrap();
        assert_eq!(got_a, &b_stream[3..], "B's write side was shut: A reads its end after the resend");
    }

    /// A host out of reach ends the exchange as a peer that went away, not as a failed move:
    /// what the peer sent before is then read from the ring, as the watcher would have it.
    #[test]
    fn a_host_out_of_reach_is_gone() {
        use io::ErrorKind::*;
        for kind in [ConnectionReset, BrokenPipe, ConnectionAborted, TimedOut, HostUnreachable, NetworkUnreachable] {
            assert!(is_gone(&io::Error::from(kind)), "{kind:?}");
        }
        for kind in [WouldBlock, Interrupted, InvalidData, OutOfMemory] {
            assert!(!is_gone(&io::Error::from(kind)), "{kind:?}");
        }
    }

    #[tokio::test]
    async fn a_peer_that_closes_before_its_frame_is_gone_and_a_bad_frame_is_refused() {
        let (a, b) = pair().await;
        drop(b);
        let mut h = Handback::new(0, 0, 0, false);
        assert!(matches!(exchange(&a, &mut h, &[], || (), PEER_FRAME_WAIT).await, Err(Failure::PeerGone { .. })));

        let (a, b) = pair().await;
        b.try_write(b"GET / HTTP/1.1\r\n").unwrap();
        let mut h = Handback::new(0, 0, 0, false);
        assert!(matches!(
            exchange(&a, &mut h, &[], || (), PEER_FRAME_WAIT).await,
            Err(Failure::Protocol(HandbackError::BadMagic(_)))
        ));

        let (a, b) = pair().await;
        b.try_write(&HandbackFrame { consumed: 5 }.encode()[..7]).unwrap();
        drop(b);
        let mut h = Handback::new(0, 0, 9, false);
        assert!(matches!(
            exchange(&a, &mut h, &[0; 9], || (), PEER_FRAME_WAIT).await,
            Err(Failure::Protocol(HandbackError::Truncated { got: 7 }))
        ));
    }

    /// A peer whose kernel takes our frame but which sends nothing, or begins its frame and
    /// stops, keeping its socket open, ends the exchange at the bound: the move does not wait
    /// for it for good.
    #[tokio::test]
    async fn a_peer_that_answers_nothing_or_part_of_its_frame_is_given_up() {
        let wait = std::time::Duration::from_millis(300);
        for sent in [0, 1, HANDBACK_FRAME_LEN - 1] {
            let (a, b) = pair().await;
            b.try_write(&HandbackFrame { consumed: 0 }.encode()[..sent]).unwrap();
            let mut h = Handback::new(0, 0, 0, false);
            let start = tokio::time::Instant::now();
            let res = exchange(&a, &mut h, &[], || (), wait).await;
            assert!(matches!(res, Err(Failure::Silent)), "{sent} bytes of a frame: {res:?}");
            assert!(start.elapsed() >= wait);
            drop(b);
        }
    }
}
