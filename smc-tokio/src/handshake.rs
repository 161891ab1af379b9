//! Drives the sans-IO handshake machines of [`crate::proto::handshake`] over a TCP stream.

use std::io;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::proto::clc::CLC_MAX_LEN;
use crate::proto::handshake::{ClientEvent, ClientHandshake, Outcome, ServerEvent, ServerHandshake};

/// The surface both handshake machines share, so one loop drives either.
pub(crate) trait Machine {
    type Event;
    fn poll_transmit(&mut self) -> Option<Vec<u8>>;
    fn poll_event(&mut self) -> Option<Self::Event>;
    fn poll_timeout(&self) -> Option<Instant>;
    fn wanted(&self) -> usize;
    fn handle_input(&mut self, data: &[u8]) -> usize;
    fn handle_timeout(&mut self, now: Instant);
    fn outcome(&self) -> Option<&Outcome>;
}

macro_rules! impl_machine {
    ($t:ty, $e:ty) => {
        impl Machine for $t {
            type Event = $e;
            fn poll_transmit(&mut self) -> Option<Vec<u8>> {
                <$t>::poll_transmit(self)
            }
            fn poll_event(&mut self) -> Option<$e> {
                <$t>::poll_event(self)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                <$t>::poll_timeout(self)
            }
            fn wanted(&self) -> usize {
                <$t>::wanted(self)
            }
            fn handle_input(&mut self, data: &[u8]) -> usize {
                <$t>::handle_input(self, data)
            }
            fn handle_timeout(&mut self, now: Instant) {
                <$t>::handle_timeout(self, now)
            }
            fn outcome(&self) -> Option<&Outcome> {
                <$t>::outcome(self)
            }
        }
    };
}

impl_machine!(ClientHandshake, ClientEvent);
impl_machine!(ServerHandshake, ServerEvent);

/// Where [`advance`] stopped.
pub(crate) enum Step<E> {
    /// The machine needs a decision; make it and call [`advance`] again.
    Event(E),
    /// The handshake has ended and everything it had to send was sent.
    Done(Outcome),
}

/// Runs the machine over `tcp` until it needs a decision or ends. Reads never take more than the
/// machine wants, so bytes after the handshake stay in the socket for the application. I/O
/// errors are returned as they are; the connection is then unusable.
pub(crate) async fn advance<M: Machine>(tcp: &mut TcpStream, m: &mut M) -> io::Result<Step<M::Event>> {
    let mut buf = [0u8; CLC_MAX_LEN];
    loop {
        if let Some(bytes) = m.poll_transmit() {
            // A handshake message is at most CLC_MAX_LEN bytes on a fresh connection, so it
            // fits the socket's send buffer: this write does not wait on the peer. It is bounded
            // by the deadline anyway.
            match m.poll_timeout() {
                Some(deadline) => {
                    let deadline = tokio::time::Instant::from_std(deadline);
                    tokio::time::timeout_at(deadline, tcp.write_all(&bytes))
                        .await
                        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "handshake write timed out"))??
                }
                None => tcp.write_all(&bytes).await?,
            }
        }
        if let Some(o) = m.outcome() {
            return Ok(Step::Done(o.clone()));
        }
        if let Some(ev) = m.poll_event() {
            return Ok(Step::Event(ev));
        }
        let want = m.wanted().min(buf.len());
        let Some(deadline) = m.poll_timeout() else {
            // Only a finished machine has no deadline, and that was handled above; never wait
            // without a bound.
            return Err(io::Error::other("handshake machine has no deadline"));
        };
        if want == 0 {
            // Nothing to read and no decision pending: only the deadline can move it on.
            tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
            m.handle_timeout(Instant::now().max(deadline));
            continue;
        }
        match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), tcp.read(&mut buf[..want])).await {
            Ok(Ok(n)) => {
                m.handle_input(&buf[..n]);
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => m.handle_timeout(Instant::now().max(deadline)),
        }
    }
}
