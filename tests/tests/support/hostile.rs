//! A hostile shm peer for the integration tests: speaks the door (REGISTER naming a socket by
//! its cookie and port, one registration per door connection, id [`HOSTILE_ID`]), the CLC handshake and the shm side channel (JOIN / WELCOME) by hand, with
//! whatever memfd and doorbell a test wants to hand over or name. Nothing here uses the crate's private
//! code: the door frames and the JOIN / WELCOME messages come from the crate's public codecs
//! (`smc_tokio::proto::door` and `smc_tokio::proto::side`), and the region header is written
//! out from `smc-tokio/src/link/shm/region.rs` (eight native-endian u64 words), so a change
//! there breaks these tests loudly instead of silently testing nothing.
#![allow(dead_code, unreachable_pub)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use smc_tokio::proto::cdc::{CdcMsg, CDC_MSG_LEN};
use smc_tokio::proto::clc::{
    decode, Accept, ClcMessage, Commit, Confirm, Decline, DeclineReason, Decoded, LinkInfo, Proposal, Secret,
    ShmLinkInfo, ShmOffer, CLC_HEADER_LEN,
};
use smc_tokio::proto::door::{ConnectedTuple, DoorFrame, DoorKind, RegisterHead, DOOR_MSG_MAX};
use smc_tokio::proto::side::{self, BellTag, Join};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const JOIN_MAGIC: [u8; 8] = side::JOIN_MAGIC;
pub const WELCOME_MAGIC: [u8; 8] = side::WELCOME_MAGIC;
pub const SIDE_MSG_LEN: usize = side::SIDE_MSG_LEN;
/// "SMCTSHM1", the region header's magic (stored as a native-endian u64 of these BE bytes).
pub const REGION_MAGIC: u64 = u64::from_be_bytes(*b"SMCTSHM1");
/// The region layout's version: frames found by their lap marks.
pub const REGION_VERSION: u64 = 2;
pub const REGION_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn random_secret() -> Secret {
    let mut t = [0u8; 16];
    // SAFETY: getrandom writes at most 16 bytes into `t`, which holds 16.
    let n = unsafe { libc::getrandom(t.as_mut_ptr().cast(), 16, 0) };
    assert_eq!(n, 16);
    Secret(t)
}

// ----- CLC over TCP ----------------------------------------------------------------------------

pub async fn read_clc(c: &mut TcpStream) -> io::Result<ClcMessage> {
    let mut buf = vec![0u8; CLC_HEADER_LEN];
    c.read_exact(&mut buf).await?;
    let Decoded::NeedMore(total) = decode(&buf).map_err(|e| io::Error::other(format!("{e:?}")))? else {
        return Err(io::Error::other("header only"));
    };
    buf.resize(total, 0);
    c.read_exact(&mut buf[CLC_HEADER_LEN..]).await?;
    match decode(&buf).map_err(|e| io::Error::other(format!("{e:?}")))? {
        Decoded::Message(m, _) => Ok(m),
        other => Err(io::Error::other(format!("{other:?}"))),
    }
}

pub async fn send_clc(c: &mut TcpStream, m: ClcMessage) -> io::Result<()> {
    c.write_all(&m.encode().map_err(|e| io::Error::other(format!("{e:?}")))?).await
}

/// Proposes shm to `addr` as client `peer` / `instance` (the server knows a client by its pid,
/// which the kernel tells it, and the instance it registers with: `peer` is folded into the
/// instance so that one test process can pose as many clients), naming `link_group` (0: a new
/// group), with `rmb_size` for the server's receive rings. The Proposal goes with the
/// registration at the listener's door; the Accept comes back there. Panics unless the server
/// accepts with shm.
pub async fn propose(addr: std::net::SocketAddr, peer: u32, instance: u64, link_group: u64, rmb_size: u32) -> ClientHs {
    let instance = instance ^ (u64::from(peer) << 32);
    let secret = random_secret();
    let p = ClcMessage::Proposal(Proposal { secret, rmb_size, shm: Some(ShmOffer { link_group }), rdma: None });
    let (tcp, door) = register_and_connect(addr, instance, &p.encode().unwrap()).await.unwrap();
    match door_recv_clc(&door).await.unwrap() {
        Some(ClcMessage::Accept(Accept { secret: t, link: LinkInfo::Shm(info) })) => {
            assert_eq!(t, secret);
            ClientHs { tcp, door, secret, rmb_size, accept: info }
        }
        other => panic!("expected an shm accept, got {other:?}"),
    }
}

/// A hostile client's handshake up to the server's Accept: the TCP stream, the door connection
/// the handshake runs on, the token and the server's shm link details (group id, its RMB slot
/// for us, the side channel's name).
pub struct ClientHs {
    pub tcp: TcpStream,
    pub door: OwnedFd,
    pub secret: Secret,
    pub rmb_size: u32,
    pub accept: ShmLinkInfo,
}

impl ClientHs {
    /// Sends the Confirm naming our RMB slot `our_slot`, and returns the server's final word (a
    /// Commit, or a Decline).
    pub async fn confirm(&mut self, our_slot: u32) -> io::Result<ClcMessage> {
        let link = LinkInfo::Shm(ShmLinkInfo {
            link_group: self.accept.link_group,
            rmb_slot: our_slot,
            rmb_size: self.rmb_size,
            socket_name: Vec::new(),
        });
        // With the four-tuple of our connection, as the crate's clients send it: a listener that
        // answered before the connection arrived commits only a connection the kernel confirms.
        let t = ConnectedTuple { local: self.tcp.local_addr()?, peer: self.tcp.peer_addr()? };
        let m = ClcMessage::Confirm(Confirm { secret: self.secret, link }).encode().unwrap();
        send_fds(self.door.as_fd(), &t.encode_frame(HOSTILE_ID, &m), &[])?;
        door_recv_clc(&self.door).await?.ok_or_else(|| io::Error::other("door closed without a final word"))
    }

    /// Declines the Accept and reads the server's answer (its Decline).
    pub async fn decline(&mut self, reason: DeclineReason) -> io::Result<ClcMessage> {
        door_send_clc(&self.door, &ClcMessage::Decline(Decline { secret: self.secret, reason }))?;
        door_recv_clc(&self.door).await?.ok_or_else(|| io::Error::other("door closed without an answer"))
    }
}

/// Whether `m` is the server's Commit for `token`.
pub fn is_commit(m: &ClcMessage, secret: Secret) -> bool {
    matches!(m, ClcMessage::Commit(Commit { secret: t }) if *t == secret)
}

// ----- the door ----------------------------------------------------------------------------------

pub const DOOR_MAGIC: [u8; 4] = smc_tokio::proto::door::DOOR_MAGIC;
pub const DOOR_VERSION: u8 = smc_tokio::proto::door::DOOR_VERSION;
pub const DOOR_REGISTER: u8 = DoorKind::Register as u8;
pub const DOOR_CLC: u8 = DoorKind::Clc as u8;
pub const DOOR_UNMATCHED: u8 = DoorKind::Unmatched as u8;
pub const DOOR_REFUSED: u8 = DoorKind::Refused as u8;

/// The id a hostile client gives the one registration on each of its door connections.
pub const HOSTILE_ID: u64 = 1;

/// A door frame: magic, version, kind, reason, a spare byte, the id, then `payload`.
/// Nothing is checked, so a test can send frames the server must reject (a kind that is none
/// of the `DOOR_*` ones included: it is written over the encoded frame's kind byte).
pub fn door_frame(kind: u8, reason: u8, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = DoorFrame { kind: DoorKind::from_u8(kind).unwrap_or(DoorKind::Clc), reason, id }.encode(payload);
    b[5] = kind;
    b
}

/// A Register frame for id [`HOSTILE_ID`], naming the socket `fd` (its cookie and port), with
/// `proposal` (or whatever a test sends in its place) after its head.
pub fn register_frame(fd: BorrowedFd<'_>, instance: u64, proposal: &[u8]) -> Vec<u8> {
    RegisterHead { instance, cookie: socket_cookie(fd), port: bound_port(fd) }.encode_frame(HOSTILE_ID, proposal)
}

/// The kernel's cookie of a socket (`SO_COOKIE`).
pub fn socket_cookie(fd: BorrowedFd<'_>) -> u64 {
    let mut v = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (a u64's) into `v`, a live u64.
    cvt(unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_COOKIE, (&mut v as *mut u64).cast(), &mut len)
    })
    .unwrap();
    v
}

/// The door of a listener on `addr` that has no reuseport siblings.
pub fn door_name(addr: std::net::SocketAddr) -> Vec<u8> {
    format!("smc-tokio/d{DOOR_VERSION}/{addr}/solo").into_bytes()
}

/// One door message, read blocking (5 s receive timeout): kind, reason, payload. `None` at EOF.
pub fn door_recv(door: BorrowedFd<'_>) -> io::Result<Option<(u8, u8, Vec<u8>)>> {
    let (msg, _) = recv_fds(door)?;
    if msg.is_empty() {
        return Ok(None);
    }
    // One registration per door connection here: a message carries its one answer (a message
    // may carry up to 64 frames, the answers to as many registrations).
    let (frame, payload) =
        DoorFrame::decode(&msg).map_err(|e| io::Error::other(format!("bad door message {msg:?}: {e}")))?;
    if frame.kind == DoorKind::Connected {
        // A client's first CLC message, after the four-tuple of its connection.
        let (_, clc) = ConnectedTuple::decode(payload).map_err(|e| io::Error::other(format!("{e}")))?;
        return Ok(Some((DOOR_CLC, frame.reason, clc.to_vec())));
    }
    Ok(Some((frame.kind as u8, frame.reason, payload.to_vec())))
}

/// The server's next CLC message on the door (on a blocking thread); `None` at EOF. A "no
/// handshake" answer is an error naming its reason.
pub async fn door_recv_clc(door: &OwnedFd) -> io::Result<Option<ClcMessage>> {
    let d = door.try_clone()?;
    let got = tokio::task::spawn_blocking(move || door_recv(d.as_fd())).await.unwrap()?;
    match got {
        None => Ok(None),
        Some((DOOR_CLC, _, payload)) => match decode(&payload).map_err(|e| io::Error::other(format!("{e:?}")))? {
            Decoded::Message(m, n) if n == payload.len() => Ok(Some(m)),
            other => Err(io::Error::other(format!("{other:?}"))),
        },
        Some((DOOR_UNMATCHED | DOOR_REFUSED, reason, _)) => {
            Err(io::Error::other(format!("no handshake: reason {reason}")))
        }
        Some((kind, ..)) => Err(io::Error::other(format!("unexpected door message kind {kind}"))),
    }
}

/// Sends a CLC message on the door.
pub fn door_send_clc(door: &OwnedFd, m: &ClcMessage) -> io::Result<()> {
    send_fds(door.as_fd(), &door_frame(DOOR_CLC, 0, HOSTILE_ID, &m.encode().unwrap()), &[])
}

/// A blocking TCP socket bound to a free port, with SO_REUSEPORT (as the crate's clients do).
pub fn bound_tcp_socket() -> OwnedFd {
    tcp_socket_bound_to(0).unwrap()
}

/// Sets an integer socket option (tests' sockets only; panics on failure).
pub fn set_int_opt(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, v: libc::c_int) {
    // SAFETY: the option value points to `v`, a live c_int, and its size is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .unwrap();
}

/// The port `fd` is bound to.
pub fn bound_port(fd: BorrowedFd<'_>) -> u16 {
    // SAFETY: sockaddr_in is plain data, for which all zeroes are a valid value.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockname writes at most `len` bytes (a sockaddr_in's) into `sin`.
    cvt(unsafe { libc::getsockname(fd.as_raw_fd(), (&mut sin as *mut libc::sockaddr_in).cast(), &mut len) }).unwrap();
    u16::from_be(sin.sin_port)
}

/// Connects the (bound) socket `fd` to the IPv4 address `addr`, blocking.
pub fn connect_v4(fd: BorrowedFd<'_>, addr: std::net::SocketAddr) -> io::Result<()> {
    let std::net::SocketAddr::V4(v4) = addr else { panic!("ipv4 only") };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: the address points to `sin`, a live sockaddr_in, and its size is passed.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// A TCP socket whose close blocks for a minute: SO_LINGER set and unsent data queued to a
/// receiver that never reads. The receiving end is returned too: it must stay open (closing it
/// resets the connection, after which the close no longer waits).
pub fn lingering_socket() -> (std::os::fd::OwnedFd, std::net::TcpStream) {
    let sink = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // A small receive window (inherited by the accepted end) fills fast.
    set_int_opt(sink.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096);
    let sock = bound_tcp_socket();
    set_int_opt(sock.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, 4096);
    connect_v4(sock.as_fd(), sink.local_addr().unwrap()).unwrap();
    let (held, _) = sink.accept().unwrap();
    // SAFETY: F_GETFL and F_SETFL take no pointers; `sock` is our own descriptor.
    let flags = unsafe { libc::fcntl(sock.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    unsafe { libc::fcntl(sock.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) };
    // Send until the window is shut and our queue full: EAGAIN that lasts (a first EAGAIN may
    // only mean the small send buffer waits for acknowledgements).
    let chunk = [0u8; 65536];
    let mut queued = 0usize;
    let mut full_since: Option<std::time::Instant> = None;
    while full_since.is_none_or(|t| t.elapsed() < Duration::from_millis(200)) {
        // SAFETY: send reads at most `chunk.len()` bytes of `chunk`, which is live.
        let n = unsafe { libc::send(sock.as_raw_fd(), chunk.as_ptr().cast(), chunk.len(), libc::MSG_NOSIGNAL) };
        if n > 0 {
            queued += n as usize;
            full_since = None;
        } else {
            full_since.get_or_insert_with(std::time::Instant::now);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let mut unsent: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one c_int into `unsent`.
    unsafe { libc::ioctl(sock.as_raw_fd(), libc::TIOCOUTQ, &mut unsent) };
    assert!(queued > 0 && unsent > 0, "queued {queued}, unsent {unsent}");
    let linger = libc::linger { l_onoff: 1, l_linger: 60 };
    // SAFETY: the option value points to `linger`, a live libc::linger, and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    (sock, held)
}

/// A blocking IPv4 TCP socket bound to `0.0.0.0:port` with SO_REUSEPORT.
pub fn tcp_socket_bound_to(port: u16) -> io::Result<OwnedFd> {
    let fd = new_socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)?;
    set_int_opt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1);
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: 0 },
        sin_zero: [0; 8],
    };
    // SAFETY: the address points to `sin`, a live sockaddr_in, and its size is passed.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// One message from `fd` without waiting (`WouldBlock` when there is none).
pub fn recv_now(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut b = [0u8; 4096];
    // SAFETY: recv writes at most `b.len()` bytes into `b`, which is live.
    let n = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(b[..n as usize].to_vec())
}

/// Registers a connection to `addr` at its (solo) door as `instance`, with `proposal` (a
/// CLC Proposal, or anything a test wants to send in its place), and connects it: returns the
/// stream and the door connection (blocking, 5 s receive timeout) the handshake goes on.
pub async fn register_and_connect(
    addr: std::net::SocketAddr,
    instance: u64,
    proposal: &[u8],
) -> io::Result<(TcpStream, OwnedFd)> {
    let (sock, door) = register(addr, instance, proposal).await?;
    Ok((connect_registered(sock, addr).await?, door))
}

/// The first half of [`register_and_connect`]: registers a bound socket, not connected yet, at
/// the door of `addr`. Returns the socket and the door connection.
pub async fn register(addr: std::net::SocketAddr, instance: u64, proposal: &[u8]) -> io::Result<(OwnedFd, OwnedFd)> {
    let proposal = proposal.to_vec();
    tokio::task::spawn_blocking(move || -> io::Result<(OwnedFd, OwnedFd)> {
        let door = side_connect(&door_name(addr))?;
        let sock = bound_tcp_socket();
        send_fds(door.as_fd(), &register_frame(sock.as_fd(), instance, &proposal), &[])?;
        Ok((sock, door))
    })
    .await
    .unwrap()
}

/// The second half of [`register_and_connect`]: connects the registered socket `sock` to
/// `addr` (IPv4).
pub async fn connect_registered(sock: OwnedFd, addr: std::net::SocketAddr) -> io::Result<TcpStream> {
    let std = tokio::task::spawn_blocking(move || -> io::Result<std::net::TcpStream> {
        let std = std::net::TcpStream::from(sock);
        // A blocking connect of a bound socket: std's connect goes through a new socket, so call
        // connect(2) on this one.
        let std::net::SocketAddr::V4(v4) = addr else { panic!("ipv4 only") };
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
            sin_zero: [0; 8],
        };
        // SAFETY: the address points to `sin`, a live sockaddr_in, and its size is passed.
        cvt(unsafe {
            libc::connect(
                std.as_raw_fd(),
                (&sin as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        })?;
        Ok(std)
    })
    .await
    .unwrap()?;
    std.set_nonblocking(true)?;
    TcpStream::from_std(std)
}

/// A proposal with a shared-memory offer (a new group), as a registration carries it.
pub fn shm_proposal(rmb_size: u32) -> Vec<u8> {
    ClcMessage::Proposal(Proposal {
        secret: random_secret(),
        rmb_size,
        shm: Some(ShmOffer { link_group: 0 }),
        rdma: None,
    })
    .encode()
    .unwrap()
}

/// A fake server's door, by hand: listens on the (solo) door name of `addr`.
pub fn fake_door(addr: std::net::SocketAddr) -> OwnedFd {
    side_listen(&door_name(addr))
}

/// The fake door's side: accepts one registration (blocking, bounded) and returns the door
/// connection, the registration's id, the registered socket's port, the instance and the
/// Proposal that came with it.
pub fn accept_registration(door: BorrowedFd<'_>) -> io::Result<(OwnedFd, u64, u16, u64, ClcMessage)> {
    let c = side_accept(door, Duration::from_secs(5))?;
    let (msg, fds) = recv_fds(c.as_fd())?;
    let frame = DoorFrame::decode(&msg);
    let (frame, payload) = match frame {
        Ok((f, payload)) if f.kind == DoorKind::Register && fds.is_empty() => (f, payload),
        _ => return Err(io::Error::other(format!("bad registration: {msg:?} ({frame:?}) with {} fds", fds.len()))),
    };
    let (head, proposal) = RegisterHead::decode(payload).map_err(|e| io::Error::other(format!("{e}")))?;
    let Decoded::Message(p, _) = decode(proposal).map_err(|e| io::Error::other(format!("{e:?}")))? else {
        return Err(io::Error::other("registration without a whole proposal"));
    };
    Ok((c, frame.id, head.port, head.instance, p))
}

/// Sends a CLC message on a fake door's connection, for registration `id`.
pub fn door_send_clc_for(door: &OwnedFd, id: u64, m: &ClcMessage) -> io::Result<()> {
    send_fds(door.as_fd(), &door_frame(DOOR_CLC, 0, id, &m.encode().unwrap()), &[])
}

// ----- regions ---------------------------------------------------------------------------------

/// The layout arithmetic of `region.rs` (`Layout::new`).
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub cdc_slots: u32,
    pub rmb_count: u32,
    pub rmb_size: u32,
    pub rmb_offset: usize,
    pub total_len: usize,
}

impl Layout {
    pub fn new(cdc_slots: u32, rmb_count: u32, rmb_size: u32) -> Layout {
        let cdc_end = 4096 + cdc_slots as usize * CDC_MSG_LEN;
        let rmb_offset = cdc_end.div_ceil(4096) * 4096;
        Layout { cdc_slots, rmb_count, rmb_size, rmb_offset, total_len: rmb_offset + (rmb_count * rmb_size) as usize }
    }

    pub fn header(&self) -> [u64; 8] {
        [
            REGION_MAGIC,
            REGION_VERSION,
            u64::from(self.cdc_slots),
            u64::from(self.rmb_count),
            u64::from(self.rmb_size),
            self.rmb_offset as u64,
            self.total_len as u64,
            0,
        ]
    }
}

pub fn memfd(len: usize, sealing: bool) -> OwnedFd {
    let flags = libc::MFD_CLOEXEC | if sealing { libc::MFD_ALLOW_SEALING } else { 0 };
    // SAFETY: the name is a NUL-terminated literal.
    let fd = cvt(unsafe { libc::memfd_create(c"hostile".as_ptr(), flags) }).unwrap();
    // SAFETY: `fd` is a descriptor the kernel just gave us (cvt checked it), owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate takes no pointers; `fd` is ours.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }).unwrap();
    fd
}

pub fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> io::Result<()> {
    // SAFETY: F_ADD_SEALS takes an int, no pointer.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(drop)
}

pub fn get_seals(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: F_GET_SEALS takes no argument.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// A shared mapping of `len` bytes of `fd`.
pub struct Map {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a plain shared mapping, owned by the Map until its drop unmaps it; the tests access
// it through raw pointers and atomics, from any thread.
unsafe impl Send for Map {}
// SAFETY: as for Send: shared access goes through atomics or copies the test orders itself.
unsafe impl Sync for Map {}

impl Map {
    pub fn new(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Map> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a new mapping the kernel places (no address of ours is passed); checked below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Map { ptr: p.cast(), len })
    }

    pub fn word(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: the assert keeps [off, off + 8) inside the mapping, `off` is 8-aligned (the
        // mapping is page-aligned), and the mapping lives as long as `self`.
        unsafe { &*self.ptr.add(off).cast::<std::sync::atomic::AtomicU64>() }
    }

    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: the assert keeps the destination inside the mapping; `data` is another object.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len);
        let mut v = vec![0u8; len];
        // SAFETY: the assert keeps the source inside the mapping; `v` holds `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), len) };
        v
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once, here; no reference into it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A region written by this (hostile) side: a memfd with a valid header, mapped writable.
pub struct Region {
    pub fd: OwnedFd,
    pub map: Map,
    pub layout: Layout,
    prod: u64,
}

const OFF_CDC_CONS: usize = 128;
const OFF_ARMED: usize = 192;
const CDC_RING: usize = 4096;

impl Region {
    /// A region as the crate makes it: header written through a writable mapping, then sealed
    /// with `seals` (the writable mapping keeps working).
    pub fn new(layout: Layout, seals: i32) -> Region {
        let fd = memfd(layout.total_len, true);
        let map = Map::new(fd.as_fd(), layout.total_len, true).unwrap();
        for (i, w) in layout.header().iter().enumerate() {
            map.word(i * 8).store(*w, std::sync::atomic::Ordering::Relaxed);
        }
        if seals != 0 {
            add_seals(fd.as_fd(), seals).unwrap();
        }
        Region { fd, map, layout, prod: 0 }
    }

    pub fn rmb_write(&self, slot: u32, offset: u32, data: &[u8]) {
        assert!(offset as usize + data.len() <= self.layout.rmb_size as usize);
        self.map.write(self.layout.rmb_offset + (slot * self.layout.rmb_size + offset) as usize, data);
    }

    /// Publishes one CDC message (as `CdcTx::push`).
    pub fn push_cdc(&mut self, msg: &CdcMsg) {
        self.push_frame(&msg.encode());
    }

    /// Publishes one raw frame, which need not be a CDC message: its words after the first,
    /// then the first, with the frame's lap mark in byte 3, with Release.
    pub fn push_frame(&mut self, frame: &[u8; CDC_MSG_LEN]) {
        let slots = u64::from(self.layout.cdc_slots);
        let at = CDC_RING + (self.prod % slots) as usize * CDC_MSG_LEN;
        self.map.write(at + 8, &frame[8..]);
        let mut first = [0u8; 8];
        first.copy_from_slice(&frame[..8]);
        first[3] = lap_mark(self.prod, self.layout.cdc_slots);
        self.map.word(at).store(u64::from_ne_bytes(first), std::sync::atomic::Ordering::Release);
        self.prod += 1;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    pub fn armed(&self) -> u64 {
        self.map.word(OFF_ARMED).load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The lap mark of frame number `index` in a ring of `slots` frames, as the region's format
/// defines it: `(index / slots) % 255 + 1`.
pub fn lap_mark(index: u64, slots: u32) -> u8 {
    ((index / u64::from(slots)) % 255) as u8 + 1
}

/// Frame number `index` of the peer's CDC ring (of `slots` frames) with its lap mark cleared,
/// if it is there, through a read-only mapping of its region.
pub fn peer_frame(peer: &Map, slots: u32, index: u64) -> Option<[u8; CDC_MSG_LEN]> {
    let at = CDC_RING + (index % u64::from(slots)) as usize * CDC_MSG_LEN;
    if peer.word(at).load(std::sync::atomic::Ordering::Acquire).to_ne_bytes()[3] != lap_mark(index, slots) {
        return None;
    }
    let mut frame: [u8; CDC_MSG_LEN] = peer.read(at, CDC_MSG_LEN).try_into().unwrap();
    frame[3] = 0;
    Some(frame)
}

pub fn peer_cdc_cons(peer: &Map) -> u64 {
    peer.word(OFF_CDC_CONS).load(std::sync::atomic::Ordering::Acquire)
}

/// A doorbell as the crate's own peers make theirs: a ringing socket bound to the tag's ring
/// name and shut down for reading, made first; a waiting socket bound to its wait name once
/// the peer's tag is known ([`connect`](Bell::connect)).
pub struct Bell {
    pub ring: OwnedFd,
    pub tag: BellTag,
}

fn dgram() -> OwnedFd {
    new_socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC).unwrap()
}

/// A new socket of `domain` and `ty` (its default protocol).
fn new_socket(domain: libc::c_int, ty: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket takes no pointers.
    let fd = cvt(unsafe { libc::socket(domain, ty, 0) })?;
    // SAFETY: `fd` is a descriptor the kernel just gave us (cvt checked it), owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn bind_abstract(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (addr, len) = abstract_addr(name);
    // SAFETY: the address points to `addr`, a live sockaddr_un, of which `len` bytes are used.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) }).map(drop)
}

fn connect_abstract(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (addr, len) = abstract_addr(name);
    // SAFETY: the address points to `addr`, a live sockaddr_un, of which `len` bytes are used.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) }).map(drop)
}

impl Bell {
    pub fn new() -> Bell {
        let ring = dgram();
        // SAFETY: shutdown takes no pointers; `ring` is ours.
        cvt(unsafe { libc::shutdown(ring.as_raw_fd(), libc::SHUT_RD) }).unwrap();
        let mut t = [0u8; 24];
        t[..16].copy_from_slice(&random_secret().0);
        t[16..].copy_from_slice(&random_secret().0[..8]);
        let tag = BellTag(t);
        bind_abstract(ring.as_fd(), &tag.ring_name()).unwrap();
        Bell { ring, tag }
    }

    /// Completes the doorbell against the peer's: our waiting socket, bound and connected to
    /// the peer's ringing socket (returned), and our ringing socket connected to the peer's
    /// waiting socket, which the peer may make a moment after it named it (tried for 5 s).
    pub fn connect(&self, peer: &BellTag) -> io::Result<OwnedFd> {
        let wait = dgram();
        bind_abstract(wait.as_fd(), &self.tag.wait_name())?;
        connect_abstract(wait.as_fd(), &peer.ring_name())?;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match connect_abstract(self.ring.as_fd(), &peer.wait_name()) {
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                r => return r.map(|()| wait),
            }
        }
    }
}

/// Keeps `fd` open for the rest of the test process.
fn keep(fd: OwnedFd) {
    static KEEP: std::sync::Mutex<Vec<OwnedFd>> = std::sync::Mutex::new(Vec::new());
    KEEP.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
}

/// The tag of a doorbell kept open for the rest of the test process, as an honest peer keeps
/// its own, to name in a JOIN or a WELCOME.
pub fn doorbell() -> BellTag {
    let b = Bell::new();
    keep(b.ring);
    b.tag
}

/// The tag of a doorbell whose ringing socket is connected to another waiting socket (both
/// kept open): it refuses anybody else's waiting socket.
pub fn busy_doorbell() -> BellTag {
    let (b, other) = (Bell::new(), Bell::new());
    let w = dgram();
    bind_abstract(w.as_fd(), &other.tag.wait_name()).unwrap();
    connect_abstract(b.ring.as_fd(), &other.tag.wait_name()).unwrap();
    keep(b.ring);
    keep(other.ring);
    keep(w);
    b.tag
}

pub fn ring(fd: RawFd) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: write reads 8 bytes of `one`, a live u64.
    let n = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    if n == 8 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub fn pipe() -> (OwnedFd, OwnedFd) {
    let mut p = [0; 2];
    // SAFETY: pipe2 writes two ints into `p`, which holds two.
    cvt(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }).unwrap();
    // SAFETY: two descriptors the kernel just gave us (cvt checked it), owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
}

// ----- the side channel ------------------------------------------------------------------------

fn abstract_addr(name: &[u8]) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data, for which all zeroes are a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    assert!(!name.is_empty() && name.len() < addr.sun_path.len());
    for (dst, src) in addr.sun_path[1..].iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    (addr, (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t)
}

/// A 5 s receive timeout: a bug shows as an error, never as a hang.
fn set_rcv_timeout(fd: BorrowedFd<'_>) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: 5, tv_usec: 0 };
    // SAFETY: the option value points to `tv`, a live timeval, and its size is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn seqpacket() -> OwnedFd {
    let fd = new_socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC).unwrap();
    // Blocking, with a receive timeout.
    set_rcv_timeout(fd.as_fd()).unwrap();
    fd
}

/// Binds the abstract SOCK_SEQPACKET name `name` and fills its queue: a listen backlog of 0 and
/// one connection it never accepts, so that every connect after it fails with `EAGAIN` (what a
/// client of a swamped door meets). Returns the listener and the connection in its queue.
pub fn full_queue_at(name: &[u8]) -> (OwnedFd, OwnedFd) {
    let l = seqpacket();
    bind_abstract(l.as_fd(), name).unwrap();
    // SAFETY: listen takes no pointers.
    cvt(unsafe { libc::listen(l.as_raw_fd(), 0) }).unwrap();
    let queued = seqpacket();
    connect_abstract(queued.as_fd(), name).unwrap();
    let next = new_socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK).unwrap();
    let e = connect_abstract(next.as_fd(), name).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "the queue is not full: {e}");
    (l, queued)
}

/// A stranger's socket on an abstract name, held by a process of its own (`smc-test-peer
/// squat-full`, run as another uid), until dropped.
pub struct Squatter(std::process::Child);

impl Drop for Squatter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `smc-test-peer squat-full NAME [stream]` as `uid`, and waits until it holds the name:
/// a seqpacket listener with a full queue, or (`stream`) a listening stream socket.
pub fn squat_as(peer: &str, name: &[u8], uid: u32, stream: bool) -> Squatter {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(peer);
    cmd.arg("squat-full").arg(std::str::from_utf8(name).unwrap());
    if stream {
        cmd.arg("stream");
    }
    let mut child =
        cmd.uid(uid).gid(uid).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "SQUATTING", "the squatter did not take the name");
    Squatter(child)
}

/// The door at index `index` of a reuseport group of listeners on `addr`.
pub fn group_door_name(addr: std::net::SocketAddr, index: u32) -> Vec<u8> {
    format!("smc-tokio/d{DOOR_VERSION}/{addr}/{index}").into_bytes()
}

/// Connects to the abstract SOCK_SEQPACKET socket `name` (blocking, 5 s receive timeout).
pub fn side_connect(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = seqpacket();
    connect_abstract(fd.as_fd(), name)?;
    Ok(fd)
}

/// Listens on the abstract name `name`.
pub fn side_listen(name: &[u8]) -> OwnedFd {
    let fd = seqpacket();
    bind_abstract(fd.as_fd(), name).unwrap();
    // SAFETY: listen takes no pointers.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 16) }).unwrap();
    fd
}

/// Accepts one connection, waiting at most `timeout`.
pub fn side_accept(l: BorrowedFd<'_>, timeout: Duration) -> io::Result<OwnedFd> {
    let mut p = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll reads and writes one pollfd, `p`, which is live.
    let n = cvt(unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) })?;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "no side-channel connection"));
    }
    // SAFETY: no address is asked for (both pointers null).
    let fd =
        cvt(unsafe { libc::accept4(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) })?;
    // SAFETY: `fd` is a descriptor the kernel just gave us (cvt checked it), owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    set_rcv_timeout(fd.as_fd())?;
    Ok(fd)
}

/// Room for the control message of [`send_fds`] and [`recv_fds`]: 32 descriptors, more than any
/// test sends.
const CMSG_WORDS: usize = 32;

/// Sends `data` with `fds` attached (`SCM_RIGHTS`).
pub fn send_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    let mut cbuf = [0u64; CMSG_WORDS];
    // SAFETY: msghdr is plain data, for which all zeroes are a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE computes a size; it touches no memory.
        let space = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        assert!(space <= std::mem::size_of_val(&cbuf), "{} descriptors do not fit one message here", fds.len());
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer is `cbuf`, live and 8-aligned, with room for a header (the
        // assert above), so the first header is non-null and inside it.
        let c = unsafe { &mut *libc::CMSG_FIRSTHDR(&msg) };
        c.cmsg_level = libc::SOL_SOCKET;
        c.cmsg_type = libc::SCM_RIGHTS;
        // SAFETY: CMSG_LEN computes a size; it touches no memory.
        c.cmsg_len = unsafe { libc::CMSG_LEN(bytes) } as _;
        // SAFETY: the header's data holds `bytes` bytes inside `cbuf` (the assert above), and
        // `fds` is another object.
        unsafe { std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len()) };
    }
    // SAFETY: `msg` points to `iov` (over `data`) and, with descriptors, to `cbuf`, all live.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one message and its descriptors. `Ok((empty, []))` is EOF. A message longer than a
/// whole door message ([`DOOR_MSG_MAX`]), or with more descriptors than fit, is an error, not
/// a part of it.
pub fn recv_fds(sock: BorrowedFd<'_>) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; DOOR_MSG_MAX];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut cbuf = [0u64; CMSG_WORDS];
    // SAFETY: msghdr is plain data, for which all zeroes are a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: `msg` points to `iov` (over `buf`) and to `cbuf`, both live, with their sizes.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: `msg` is as recvmsg left it, its control buffer `cbuf`.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: a non-null header from CMSG_FIRSTHDR or CMSG_NXTHDR lies inside `cbuf`.
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: the data of a header inside `cbuf`.
            let data = unsafe { libc::CMSG_DATA(c) }.cast::<RawFd>();
            // SAFETY: CMSG_LEN computes a size; it touches no memory.
            let count = (h.cmsg_len as usize - unsafe { libc::CMSG_LEN(0) } as usize) / std::mem::size_of::<RawFd>();
            for i in 0..count {
                // SAFETY: the kernel wrote `count` descriptors there, each new to this process
                // and owned by nothing else (read unaligned: the data need not be aligned).
                fds.push(unsafe { OwnedFd::from_raw_fd(data.add(i).read_unaligned()) });
            }
        }
        // SAFETY: `c` is a header inside `msg`'s control buffer.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        // The descriptors that did come are closed with `fds`.
        return Err(io::Error::other(format!("a message cut short (flags {:#x})", msg.msg_flags)));
    }
    buf.truncate(n as usize);
    Ok((buf, fds))
}

pub fn join_msg(link_group: u64, secret: Secret, bell: BellTag) -> [u8; SIDE_MSG_LEN] {
    Join { link_group, secret, bell }.encode()
}

pub fn welcome_msg(link_group: u64, status: u32, bell: BellTag) -> [u8; SIDE_MSG_LEN] {
    side::Welcome { link_group, status, bell }.encode()
}

/// A parsed WELCOME: status, the doorbell it names and the descriptors that came with it.
#[derive(Debug)]
pub struct Welcome {
    pub status: u32,
    pub link_group: u64,
    pub bell: BellTag,
    pub fds: Vec<OwnedFd>,
}

pub fn parse_welcome(msg: &[u8], fds: Vec<OwnedFd>) -> Welcome {
    let w = side::Welcome::decode(msg).unwrap_or_else(|e| panic!("bad welcome {msg:?}: {e}"));
    Welcome { status: w.status, link_group: w.link_group, bell: w.bell, fds }
}

/// Joins the pending group of an accepted proposal `hs` with a genuine sealed region of
/// `layout` and a doorbell of our own (on a blocking thread, bounded), and expects a WELCOME of
/// status 0. Returns our region, the side channel, the server's region and our ringing socket,
/// connected to the server's waiting one: ringing on it rings the server. (Our waiting socket,
/// where the server's rings land, is kept open for the rest of the test process.)
pub async fn join_genuine(hs: &ClientHs, layout: Layout) -> (Region, OwnedFd, OwnedFd, OwnedFd) {
    let (name, group, token) = (hs.accept.socket_name.clone(), hs.accept.link_group, hs.secret);
    let (region, sock, welcome, bell) = tests::bounded(
        10,
        tokio::task::spawn_blocking(move || {
            let region = Region::new(layout, REGION_SEALS);
            let bell = Bell::new();
            let (sock, w) = join(&name, group, token, bell.tag, &[region.fd.as_raw_fd()]).unwrap();
            assert_eq!(w.status, 0, "the server welcomes a genuine region");
            assert!(!w.bell.is_none(), "the server names its doorbell");
            keep(bell.connect(&w.bell).expect("the server's doorbell takes our connects"));
            (region, sock, w, bell)
        }),
    )
    .await
    .unwrap();
    let server_memfd = welcome.fds.into_iter().next().unwrap();
    (region, sock, server_memfd, bell.ring)
}

/// Joins the server's pending group with the descriptors `fds` (a region, or whatever a test
/// hands over instead) and the doorbell `bell` (blocking; run it on a blocking thread).
/// Returns the side channel and the WELCOME.
pub fn join(
    name: &[u8],
    link_group: u64,
    secret: Secret,
    bell: BellTag,
    fds: &[RawFd],
) -> io::Result<(OwnedFd, Welcome)> {
    let sock = side_connect(name)?;
    send_join(sock.as_fd(), &join_msg(link_group, secret, bell), fds)?;
    let (mut msg, mut got) = recv_fds(sock.as_fd())?;
    if side::Ready::decode(&msg).is_ok() {
        // The JOIN went through before the READY came: the WELCOME follows.
        (msg, got) = recv_fds(sock.as_fd())?;
    }
    if msg.is_empty() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "side channel closed without a welcome"));
    }
    Ok((sock, parse_welcome(&msg, got)))
}

/// Sends `msg` (a JOIN, or what a test sends instead) with `fds` on the side channel `sock` as
/// a client does: where the server's connection refuses descriptors until it knows who
/// connected (`SO_PASSRIGHTS`), again once its READY says it takes them.
pub fn send_join(sock: BorrowedFd<'_>, msg: &[u8], fds: &[RawFd]) -> io::Result<()> {
    match send_fds(sock, msg, fds) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let (ready, _) = recv_fds(sock)?;
            if ready.is_empty() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "side channel closed without a ready"));
            }
            side::Ready::decode(&ready).map_err(|e| io::Error::other(format!("no ready for a refused join: {e}")))?;
            send_fds(sock, msg, fds)
        }
        r => r,
    }
}

/// Waits (up to the socket's 5 s receive timeout) for the side channel to reach EOF (past a
/// READY that came after a JOIN that went through).
pub fn side_eof(sock: BorrowedFd<'_>) -> io::Result<()> {
    let (mut msg, mut fds) = recv_fds(sock)?;
    if side::Ready::decode(&msg).is_ok() {
        (msg, fds) = recv_fds(sock)?;
    }
    if msg.is_empty() && fds.is_empty() {
        Ok(())
    } else {
        Err(io::Error::other(format!("unexpected side-channel message of {} bytes", msg.len())))
    }
}

/// `ftruncate` result as an errno (0 on success).
pub fn ftruncate_errno(fd: BorrowedFd<'_>, len: usize) -> i32 {
    // SAFETY: ftruncate takes no pointers.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } == 0 {
        0
    } else {
        io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

pub fn errno_of<T>(r: io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}
