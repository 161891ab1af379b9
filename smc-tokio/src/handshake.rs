//! Drives the sans-IO handshake machines of [`crate::proto::handshake`] over a TCP stream.

use std::io;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::proto::clc::{eyecatcher_prefix_matches, DeclineReason, CLC_EYECATCHER, CLC_MAX_LEN};
use crate::proto::handshake::{ClientEvent, ClientHandshake, Outcome, ServerEvent, ServerHandshake};

/// The surface both handshake machines share, so one loop drives either.
/// What a TCP stream handed out while its client may still send a handshake message owes the
/// peer: the in-band guard (`net::inband`) takes that message off the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owed {
    /// A Proposal, answered with a Decline of this reason.
    Proposal(DeclineReason),
    /// The client's Confirm or Decline answering an Accept we already declined: dropped.
    Answer,
}

/// What an establishment (a connect, or an accepted connection) came to: `net` makes the
/// application's `SmcStream` of it. Negotiation hands this up instead of building streams
/// itself, so it never imports `net`.
#[derive(Debug)]
pub(crate) enum Established {
    /// A TCP connection, with its transport (and why it is TCP) and, when the peer may still
    /// send a handshake message, what the stream's guard must take off it.
    Tcp { tcp: TcpStream, transport: crate::transport::Transport, owed: Option<Owed> },
    /// An SMC connection over `conn`; its TCP socket stays open underneath and is watched.
    Smc {
        tcp: std::sync::Arc<TcpStream>,
        conn: std::sync::Arc<crate::smc::conn::SmcConn>,
        transport: crate::transport::Transport,
        watcher: crate::smc::conn::Watcher,
    },
}

impl Established {
    /// An SMC connection over `conn`: its TCP socket is held under it and watched from now on
    /// (so a peer that moves the connection back to TCP is answered even before the
    /// application accepted the stream).
    pub(crate) fn smc(
        tcp: TcpStream,
        conn: std::sync::Arc<crate::smc::conn::SmcConn>,
        transport: crate::transport::Transport,
    ) -> Established {
        let tcp = std::sync::Arc::new(tcp);
        let watcher = conn.watch_tcp(tcp.clone());
        Established::Smc { tcp, conn, transport, watcher }
    }

    /// A TCP connection whose peer owes nothing.
    pub(crate) fn tcp(tcp: TcpStream, transport: crate::transport::Transport) -> Established {
        Established::Tcp { tcp, transport, owed: None }
    }

    /// Resets a connection nobody will take (a closed listener's queue), as the kernel resets
    /// those left in its own queue: a zero linger makes the socket's close a reset, and an SMC
    /// connection is aborted and gives its slot in the link group back once the peer answers;
    /// a peer that never does (its process died with its side channel still open to the group's
    /// other connections) has the connection forgotten and its slot retired after a bound, as
    /// for a handshake's committed connection, so that the group can go idle.
    pub(crate) fn reset(self) {
        match self {
            Established::Tcp { tcp, .. } => reset_tcp(tcp),
            Established::Smc { tcp, conn, watcher, .. } => {
                crate::sys::set_zero_linger(&*tcp);
                drop(watcher);
                conn.abort_unclaimed();
            }
        }
    }
}

/// Closes `tcp` with a reset (see [`Established::reset`]).
pub(crate) fn reset_tcp(tcp: TcpStream) {
    crate::sys::set_zero_linger(&tcp);
}

pub(crate) trait Machine {
    type Event;
    fn poll_transmit(&mut self) -> Option<Vec<u8>>;
    fn poll_event(&mut self) -> Option<Self::Event>;
    fn poll_timeout(&self) -> Option<Instant>;
    fn wanted(&self) -> usize;
    fn handle_input(&mut self, data: &[u8], now: Instant) -> usize;
    fn handle_timeout(&mut self, now: Instant);
    fn outcome(&self) -> Option<&Outcome>;
    /// At the first byte of a message the peer may have replaced with application bytes.
    fn at_first_byte(&self) -> bool;
    /// The peer sent application bytes there (nothing was taken).
    fn peer_sent_data(&mut self);
}

impl Machine for ClientHandshake {
    type Event = ClientEvent;
    fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        ClientHandshake::poll_transmit(self)
    }
    fn poll_event(&mut self) -> Option<ClientEvent> {
        ClientHandshake::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        ClientHandshake::poll_timeout(self)
    }
    fn wanted(&self) -> usize {
        ClientHandshake::wanted(self)
    }
    fn handle_input(&mut self, data: &[u8], now: Instant) -> usize {
        ClientHandshake::handle_input(self, data, now)
    }
    fn handle_timeout(&mut self, now: Instant) {
        ClientHandshake::handle_timeout(self, now)
    }
    fn outcome(&self) -> Option<&Outcome> {
        ClientHandshake::outcome(self)
    }
    fn at_first_byte(&self) -> bool {
        self.awaits_reply_start()
    }
    fn peer_sent_data(&mut self) {
        ClientHandshake::peer_sent_data(self)
    }
}

impl Machine for ServerHandshake {
    type Event = ServerEvent;
    fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        ServerHandshake::poll_transmit(self)
    }
    fn poll_event(&mut self) -> Option<ServerEvent> {
        ServerHandshake::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        ServerHandshake::poll_timeout(self)
    }
    fn wanted(&self) -> usize {
        ServerHandshake::wanted(self)
    }
    fn handle_input(&mut self, data: &[u8], now: Instant) -> usize {
        ServerHandshake::handle_input(self, data, now)
    }
    fn handle_timeout(&mut self, now: Instant) {
        ServerHandshake::handle_timeout(self, now)
    }
    fn outcome(&self) -> Option<&Outcome> {
        ServerHandshake::outcome(self)
    }
    fn at_first_byte(&self) -> bool {
        self.awaits_proposal_start()
    }
    fn peer_sent_data(&mut self) {
        ServerHandshake::peer_sent_data(self)
    }
}

/// Where [`advance`] stopped.
pub(crate) enum Step<E> {
    /// The machine needs a decision; make it and call [`advance`] again.
    Event(E),
    /// The handshake has ended and everything it had to send was sent.
    Done(Outcome),
}

/// Runs the machine over `tcp` until it needs a decision or ends. Reads never take more than the
/// machine wants, so bytes after the handshake stay in the socket for the application, and the
/// first byte of a message the peer may have replaced with application bytes is looked at
/// before it is taken. I/O errors are returned as they are; the connection is then unusable.
pub(crate) async fn advance<M: Machine>(tcp: &mut TcpStream, m: &mut M) -> io::Result<Step<M::Event>> {
    let mut buf = [0u8; CLC_MAX_LEN];
    loop {
        flush(tcp, m).await?;
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
        let tdeadline = tokio::time::Instant::from_std(deadline);
        if want == 0 {
            // Nothing to read and no decision pending: only the deadline can move it on.
            tokio::time::sleep_until(tdeadline).await;
            m.handle_timeout(Instant::now().max(deadline));
            continue;
        }
        if m.at_first_byte() {
            let mut first = [0u8; CLC_EYECATCHER.len()];
            match tokio::time::timeout_at(tdeadline, tcp.peek(&mut first)).await {
                Ok(Ok(0)) => {
                    m.handle_input(&[], Instant::now());
                    continue;
                }
                Ok(Ok(n)) if !eyecatcher_prefix_matches(&first[..n]) => {
                    m.peer_sent_data();
                    continue;
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    m.handle_timeout(Instant::now().max(deadline));
                    continue;
                }
            }
        }
        match tokio::time::timeout_at(tdeadline, tcp.read(&mut buf[..want])).await {
            Ok(Ok(n)) => {
                m.handle_input(&buf[..n], Instant::now());
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => m.handle_timeout(Instant::now().max(deadline)),
        }
    }
}

/// Sends what the machine has to send. A handshake message is at most `CLC_MAX_LEN` bytes on
/// a connection that carried nothing else, so it fits the socket's send buffer: the write does
/// not wait on the peer. It is bounded by the machine's deadline anyway (or a second, once the
/// machine is done).
pub(crate) async fn flush<M: Machine>(tcp: &mut TcpStream, m: &mut M) -> io::Result<()> {
    while let Some(bytes) = m.poll_transmit() {
        let deadline = m
            .poll_timeout()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(|| tokio::time::Instant::now() + std::time::Duration::from_secs(1));
        tokio::time::timeout_at(deadline, tcp.write_all(&bytes))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "handshake write timed out"))??
    }
    Ok(())
}

/// A message channel a handshake can run over instead of the TCP stream: the door connection
/// of a same-host client (each CLC message one `SOCK_SEQPACKET` datagram).
pub(crate) trait Wire {
    /// Sends one CLC message.
    async fn send(&mut self, msg: &[u8]) -> io::Result<()>;
    /// The peer's next CLC message; `None` when the peer closed (or cancelled).
    async fn recv(&mut self) -> io::Result<Option<Vec<u8>>>;
    /// The process at the other end, where the wire knows it (a door connection's owner,
    /// once that door answered).
    fn peer_process(&self) -> Option<crate::sys::PeerCred> {
        None
    }
}

/// As [`advance`], over a message [`Wire`]: each message received is fed to the machine whole.
/// Bytes past a message's end (a peer that packed more into one datagram) are an error.
pub(crate) async fn advance_wire<M: Machine, W: Wire>(w: &mut W, m: &mut M) -> io::Result<Step<M::Event>> {
    loop {
        while let Some(bytes) = m.poll_transmit() {
            w.send(&bytes).await?;
        }
        if let Some(o) = m.outcome() {
            return Ok(Step::Done(o.clone()));
        }
        if let Some(ev) = m.poll_event() {
            return Ok(Step::Event(ev));
        }
        let Some(deadline) = m.poll_timeout() else {
            return Err(io::Error::other("handshake machine has no deadline"));
        };
        if m.wanted() == 0 {
            tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
            m.handle_timeout(Instant::now().max(deadline));
            continue;
        }
        match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), w.recv()).await {
            Ok(Ok(Some(msg))) => {
                let now = Instant::now();
                let mut at = 0;
                // The whole message at once: the machine takes no more than it wants, and
                // decodes a whole message where it lies.
                while at < msg.len() && m.wanted() > 0 {
                    at += m.handle_input(&msg[at..], now);
                }
                if at < msg.len() {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "handshake message of the wrong length"));
                }
            }
            Ok(Ok(None)) => {
                m.handle_input(&[], Instant::now());
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => m.handle_timeout(Instant::now().max(deadline)),
        }
    }
}

/// Where a handshake runs: the TCP stream itself (in-band), or a message [`Wire`] beside it.
pub(crate) enum Channel<'a, W> {
    Tcp(&'a mut TcpStream),
    Wire(&'a mut W),
}

impl<W: Wire> Channel<'_, W> {
    /// [`advance`] or [`advance_wire`], as the channel is.
    pub(crate) async fn advance<M: Machine>(&mut self, m: &mut M) -> io::Result<Step<M::Event>> {
        match self {
            Channel::Tcp(t) => advance(t, m).await,
            Channel::Wire(w) => advance_wire(*w, m).await,
        }
    }

    /// The process at the other end, where the channel knows it ([`Wire::peer_process`]).
    pub(crate) fn peer_process(&self) -> Option<crate::sys::PeerCred> {
        match self {
            Channel::Tcp(_) => None,
            Channel::Wire(w) => w.peer_process(),
        }
    }

    /// Sends what the machine still has to send.
    pub(crate) async fn flush<M: Machine>(&mut self, m: &mut M) -> io::Result<()> {
        match self {
            Channel::Tcp(t) => flush(t, m).await,
            Channel::Wire(w) => {
                while let Some(b) = m.poll_transmit() {
                    w.send(&b).await?;
                }
                Ok(())
            }
        }
    }
}
