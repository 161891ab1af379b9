//! Who owns the client end of a TCP connection on this host: the kernel's `sock_diag` netlink
//! interface (`NETLINK_SOCK_DIAG`, `inet_diag`, see sock_diag(7)), asked for exactly one socket
//! by its four-tuple. The answer names the socket's owner (the uid that created it, as our user
//! namespace sees it: an id it does not map is the overflow id) and its cookie (the kernel's
//! 64-bit id of the socket, `SO_COOKIE`). A door uses it to check a registration without being
//! handed the socket: the registered cookie must be the client end's, and its uid the door
//! connection's.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::cvt;

/// `SOCK_DIAG_BY_FAMILY`, the request type of sock_diag(7).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR`, netlink(7).
const NLMSG_ERROR: u16 = 2;
/// `INET_DIAG_NOCOOKIE`: the request names no cookie (the kernel checks none).
const NO_COOKIE: u32 = !0;
/// Length of `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// Length of `struct inet_diag_req_v2`: family, protocol, ext, pad, states, then the 48-byte
/// `inet_diag_sockid`.
const REQ_LEN: usize = 8 + SOCKID_LEN;
/// Length of `struct inet_diag_sockid`: sport, dport, `src[4]`, `dst[4]`, if, `cookie[2]`.
const SOCKID_LEN: usize = 48;
/// Length of `struct inet_diag_msg`: family, state, timer, retrans, the sockid, then expires,
/// rqueue, wqueue, uid, inode.
const MSG_LEN: usize = 4 + SOCKID_LEN + 20;

/// `TCP_ESTABLISHED`, the state of a connected socket (include/net/tcp_states.h).
pub(crate) const TCP_ESTABLISHED: u8 = 1;
/// `TCP_SYN_RECV`: a request socket, the listener's end of a connection not yet a socket of
/// its own (include/net/tcp_states.h).
pub(crate) const TCP_SYN_RECV: u8 = 3;
/// `TCP_CLOSE_WAIT`: a connected socket whose peer closed its side (include/net/tcp_states.h).
pub(crate) const TCP_CLOSE_WAIT: u8 = 8;
/// `TCP_LISTEN`: a listening socket (include/net/tcp_states.h).
const TCP_LISTEN: u8 = 10;

/// What the kernel says of one TCP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpOwner {
    /// The uid that created the socket, in our user namespace.
    pub(crate) uid: u32,
    /// The socket's cookie (`SO_COOKIE`).
    pub(crate) cookie: u64,
    /// The socket's TCP state (`TCP_ESTABLISHED` is 1).
    pub(crate) state: u8,
    /// The socket's own address as the kernel writes it (`idiag_src`: an IPv4 address in the
    /// first four bytes, the rest zero).
    pub(crate) local: [u8; 16],
}

/// A `NETLINK_SOCK_DIAG` socket, non-blocking. The kernel answers a request for one socket
/// while the request is being sent, so the answer is queued by the time `sendmsg` returns:
/// nothing ever waits on it.
#[derive(Debug)]
pub(crate) struct TcpDiag {
    fd: OwnedFd,
    /// The interface every look-up names (`idiag_if`; 0: none). The kernel's look-up
    /// (`inet_lookup`, with this as the receiving interface) finds a socket bound to a device
    /// (`SO_BINDTODEVICE`, a VRF) only when asked with that device's index; a socket bound to
    /// none is found whatever the index.
    device: u32,
}

/// A non-blocking `NETLINK_SOCK_DIAG` socket. Fails where the kernel has no sock_diag
/// (`EPROTONOSUPPORT`) or a sandbox refuses netlink.
fn diag_socket() -> io::Result<OwnedFd> {
    netlink_socket(libc::SOCK_DGRAM, libc::NETLINK_SOCK_DIAG)
}

/// A non-blocking netlink socket of type `ty` for `protocol`.
pub(super) fn netlink_socket(ty: libc::c_int, protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant arguments.
    let fd = cvt(unsafe { libc::socket(libc::AF_NETLINK, ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, protocol) })?;
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes the `nlmsghdr` of a `SOCK_DIAG_BY_FAMILY` request that is all of `req`, with `flags`
/// (the sequence number and port stay 0).
fn request_header(req: &mut [u8], flags: u16) {
    let len = u32::try_from(req.len()).unwrap_or(u32::MAX);
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
}

impl TcpDiag {
    /// A new diag socket whose look-ups find the sockets bound to the interface `device` (a
    /// listener's `SO_BINDTOIFINDEX`, which its accepted connections inherit; 0: none), and
    /// those bound to none. Fails where the kernel has no sock_diag (`EPROTONOSUPPORT`) or a
    /// sandbox refuses netlink.
    pub(crate) fn new(device: u32) -> io::Result<TcpDiag> {
        Ok(TcpDiag { fd: diag_socket()?, device })
    }

    /// The owner of the TCP socket whose local address is `local` and whose peer is `peer`
    /// (IPv4-mapped addresses unmapped or not: an IPv4 pair is looked for among IPv4 sockets,
    /// then among IPv6 ones as mapped addresses). `Ok(None)`: no such socket.
    pub(crate) fn owner(&self, local: SocketAddr, peer: SocketAddr) -> io::Result<Option<TcpOwner>> {
        self.lookup(local, peer, true)
    }

    /// Whether the kernel answers a look-up of that four-tuple with any socket at all, the one
    /// asked for or, failing it, one listening on its local port: `false` where it has no
    /// sock_diag for TCP (its answer is then "no such socket" for every socket), asked of our
    /// own end of an accepted connection (which the kernel drops from its table when the peer
    /// resets it before the accept; our listener is found then).
    pub(crate) fn answers(&self, local: SocketAddr, peer: SocketAddr) -> io::Result<bool> {
        Ok(self.lookup(local, peer, false)?.is_some())
    }

    /// Whether the listener the kernel would hand a connection to `dst` is bound to the
    /// unspecified address (`Some(true)`) or to `dst`'s own (`Some(false)`); `None` when no
    /// listener answers. A door named after `dst`'s own address is no door of a listener that
    /// is not bound to it: anybody may have bound the name.
    pub(crate) fn listener_is_wildcard(&self, dst: SocketAddr) -> io::Result<Option<bool>> {
        // A four-tuple no connection has (a peer on port 1 of the same address): the kernel's
        // look-up goes on to the listening sockets, and answers with the one it would choose.
        let peer = SocketAddr::new(dst.ip(), 1);
        Ok(self.lookup(dst, peer, false)?.filter(|o| o.state == TCP_LISTEN).map(|o| o.local.iter().all(|b| *b == 0)))
    }

    /// [`owner`](Self::owner); `exact`: only the socket with this four-tuple.
    fn lookup(&self, local: SocketAddr, peer: SocketAddr, exact: bool) -> io::Result<Option<TcpOwner>> {
        let (local, peer) = (super::unmap(local), super::unmap(peer));
        match (local.ip(), peer.ip()) {
            (IpAddr::V4(l), IpAddr::V4(p)) => {
                if let Some(o) =
                    self.ask(libc::AF_INET as u8, local.port(), &l.octets(), peer.port(), &p.octets(), exact)?
                {
                    return Ok(Some(o));
                }
                let (l, p) = (l.to_ipv6_mapped().octets(), p.to_ipv6_mapped().octets());
                self.ask(libc::AF_INET6 as u8, local.port(), &l, peer.port(), &p, exact)
            }
            (IpAddr::V6(l), IpAddr::V6(p)) => {
                self.ask(libc::AF_INET6 as u8, local.port(), &l.octets(), peer.port(), &p.octets(), exact)
            }
            // A pair of mixed families is no connection.
            _ => Ok(None),
        }
    }

    fn ask(
        &self,
        family: u8,
        sport: u16,
        src: &[u8],
        dport: u16,
        dst: &[u8],
        exact: bool,
    ) -> io::Result<Option<TcpOwner>> {
        let mut req = [0u8; NLMSG_HDR + REQ_LEN];
        // NLM_F_REQUEST, no dump: the kernel looks up exactly this socket.
        request_header(&mut req, libc::NLM_F_REQUEST as u16);
        let r = &mut req[NLMSG_HDR..];
        r[0] = family;
        r[1] = libc::IPPROTO_TCP as u8;
        // Every state.
        r[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
        let id = &mut r[8..];
        id[0..2].copy_from_slice(&sport.to_be_bytes());
        id[2..4].copy_from_slice(&dport.to_be_bytes());
        id[4..4 + src.len()].copy_from_slice(src);
        id[20..20 + dst.len()].copy_from_slice(dst);
        id[36..40].copy_from_slice(&self.device.to_ne_bytes());
        id[40..44].copy_from_slice(&NO_COOKIE.to_ne_bytes());
        id[44..48].copy_from_slice(&NO_COOKIE.to_ne_bytes());
        // SAFETY: `req` is a valid buffer of its length; the kernel is the destination (a
        // netlink socket's default peer).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = [0u8; 1024];
        // SAFETY: `buf` is a valid, writable buffer of its length. The answer is queued before
        // send returns; MSG_TRUNC would tell a longer one (attributes we did not ask for).
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let asked: &[u8; TUPLE_LEN] =
            req[NLMSG_HDR + 8..NLMSG_HDR + 8 + TUPLE_LEN].try_into().map_err(|_| io::ErrorKind::InvalidData)?;
        parse_answer(&buf[..usize::try_from(n).unwrap_or(0)], exact.then_some((asked, self.device)))
    }
}

/// The four-tuple's bytes at the start of an `inet_diag_sockid`: sport, dport, `src[4]`,
/// `dst[4]` (IPv4 addresses in the first word, the rest zero, as the kernel writes them).
const TUPLE_LEN: usize = 36;

/// Reads the kernel's answer to one request: an `inet_diag_msg`, or an error (`ENOENT`: no
/// such socket). With `asked` (the four-tuple and the device named), a socket whose four-tuple
/// is not that one is no answer: for a tuple no connected socket has, the kernel's lookup
/// (`inet_lookup`) goes on to the listening sockets and answers with one bound to the asked
/// local port, whoever owns it; its tuple has no peer. Nor is a socket bound to another device
/// than the one named (two sockets on different devices, in different VRFs, may share a
/// four-tuple; the look-up names ours).
fn parse_answer(b: &[u8], asked: Option<(&[u8; TUPLE_LEN], u32)>) -> io::Result<Option<TcpOwner>> {
    let short = || io::Error::new(io::ErrorKind::InvalidData, "short sock_diag answer");
    let hdr = b.get(..NLMSG_HDR).ok_or_else(short)?;
    let kind = u16::from_ne_bytes([hdr[4], hdr[5]]);
    let body = &b[NLMSG_HDR..];
    if kind == NLMSG_ERROR {
        let e = i32::from_ne_bytes(body.get(..4).ok_or_else(short)?.try_into().map_err(|_| short())?);
        return match e.wrapping_neg() {
            0 | libc::ENOENT => Ok(None),
            errno => Err(io::Error::from_raw_os_error(errno)),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "unexpected sock_diag answer"));
    }
    let m = body.get(..MSG_LEN).ok_or_else(short)?;
    let word = |at: usize| u32::from_ne_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]]);
    if let Some((tuple, device)) = asked {
        let bound = word(4 + TUPLE_LEN);
        if m[4..4 + TUPLE_LEN] != tuple[..] || bound != 0 && bound != device {
            return Ok(None);
        }
    }
    let cookie = u64::from(word(4 + 44)) << 32 | u64::from(word(4 + 40));
    let mut local = [0u8; 16];
    local.copy_from_slice(&m[4 + 4..4 + 20]);
    Ok(Some(TcpOwner { uid: word(4 + SOCKID_LEN + 12), cookie, state: m[1], local }))
}

/// `NLMSG_DONE`, the end of a dump (netlink(7)).
const NLMSG_DONE: u16 = 3;
/// `UDIAG_SHOW_NAME | UDIAG_SHOW_UID` (linux/unix_diag.h): each socket's name and owner.
const UDIAG_SHOW: u32 = 0x01 | 0x40;
/// `UNIX_DIAG_NAME` and `UNIX_DIAG_UID`, the attributes asked for (linux/unix_diag.h).
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_UID: u16 = 7;
/// Length of `struct unix_diag_req`: family, protocol, pad, states, ino, show, `cookie[2]`.
const UNIX_REQ_LEN: usize = 24;
/// Length of `struct unix_diag_msg`: family, type, state, pad, ino, `cookie[2]`.
const UNIX_MSG_LEN: usize = 16;
/// Listening Unix sockets a read of the kernel's list takes in at most. Anybody can create
/// listening sockets (a descriptor each), so the list could be made as long as they like; past
/// this many the read stops, and says the list was not read whole. A read of 4 096 took
/// 3.1-3.3 ms on the development VM (three runs of `listeners_of_a_prefix_are_listed_by_owner`
/// with 4 096 listeners instead of its 200; 1 000 took 0.55 ms), so one of 16 384 about 13 ms.
pub(crate) const UNIX_LISTENERS_MAX: usize = 16_384;

/// The listening `SOCK_SEQPACKET` Unix sockets of this network namespace whose abstract names
/// (without their leading NUL) start with `prefix`, with the uid that owns each (the uid that
/// created the socket, as our user namespace sees it: an id it does not map is the overflow
/// id), from the kernel's `unix_diag` list (Linux 5.3 for the owner); `whole` says whether the
/// list was read to its end (within [`UNIX_LISTENERS_MAX`] listeners of any name). An error
/// where the kernel has no `unix_diag` or refuses netlink. The kernel walks every Unix socket
/// of the namespace for it, listening or not: call it off the runtime.
///
/// Sockets of another type are left out: an abstract name is one name per socket type (the
/// kernel looks a name up among sockets of the connecting socket's type), so anybody may bind
/// a stream socket with a door's name without touching the door.
pub(crate) fn seqpacket_listeners(prefix: &[u8]) -> io::Result<Listeners> {
    let fd = diag_socket()?;
    let mut req = [0u8; NLMSG_HDR + UNIX_REQ_LEN];
    request_header(&mut req, (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16);
    let r = &mut req[NLMSG_HDR..];
    r[0] = libc::AF_UNIX as u8;
    r[4..8].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    r[12..16].copy_from_slice(&UDIAG_SHOW.to_ne_bytes());
    // SAFETY: `req` is a valid buffer of its length; the kernel is the destination.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut want = Vec::with_capacity(prefix.len() + 1);
    want.push(0);
    want.extend_from_slice(prefix);
    let mut list = Listeners { owners: Vec::new(), whole: false, seen: 0 };
    let mut buf = vec![0u8; 32 << 10];
    while list.seen <= UNIX_LISTENERS_MAX {
        // SAFETY: `buf` is a valid, writable buffer of its length. A dump's next part is made
        // in this call when the last was read, so it never finds the queue empty before the
        // end (`NLMSG_DONE`).
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if parse_unix_dump(&buf[..usize::try_from(n).unwrap_or(0)], &want, &mut list)? {
            list.whole = true;
            break;
        }
    }
    Ok(list)
}

/// What [`seqpacket_listeners`] read.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Listeners {
    /// Each listener's name (without its leading NUL) and owner.
    pub(crate) owners: Vec<(Vec<u8>, u32)>,
    /// The list was read to its end: a name that is not here had no listener then.
    pub(crate) whole: bool,
    /// Sockets read, of any name and type.
    seen: usize,
}

/// Reads one part of a `unix_diag` dump (netlink messages one after another, each a
/// `unix_diag_msg` and its attributes) into `list`: the `SOCK_SEQPACKET` sockets whose names
/// (as the kernel gives an abstract name: a NUL, then the name) start with `want`. Returns
/// whether the dump ended. An error for anything malformed, never a panic or a loop that does
/// not advance.
fn parse_unix_dump(mut b: &[u8], want: &[u8], list: &mut Listeners) -> io::Result<bool> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed unix_diag answer");
    while !b.is_empty() {
        let hdr = b.get(..NLMSG_HDR).ok_or_else(bad)?;
        let len = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
        let kind = u16::from_ne_bytes([hdr[4], hdr[5]]);
        if len < NLMSG_HDR {
            return Err(bad());
        }
        let msg = b.get(NLMSG_HDR..len).ok_or_else(bad)?;
        b = b.get(align4(len).min(b.len())..).unwrap_or(&[]);
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let e = i32::from_ne_bytes(msg.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
                return Err(io::Error::from_raw_os_error(e.wrapping_neg()));
            }
            SOCK_DIAG_BY_FAMILY => {}
            _ => return Err(bad()),
        }
        list.seen += 1;
        let head = msg.get(..UNIX_MSG_LEN).ok_or_else(bad)?;
        let mut attrs = &msg[UNIX_MSG_LEN..];
        let (mut name, mut uid) = (None, None);
        while attrs.len() >= 4 {
            let alen = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
            let akind = u16::from_ne_bytes([attrs[2], attrs[3]]);
            if alen < 4 {
                return Err(bad());
            }
            let data = attrs.get(4..alen).ok_or_else(bad)?;
            match akind {
                UNIX_DIAG_NAME => name = Some(data),
                UNIX_DIAG_UID => uid = data.get(..4).map(|u| u32::from_ne_bytes([u[0], u[1], u[2], u[3]])),
                _ => {}
            }
            attrs = attrs.get(align4(alen).min(attrs.len())..).unwrap_or(&[]);
        }
        let Some(name) = name.filter(|n| head[1] == libc::SOCK_SEQPACKET as u8 && n.starts_with(want)) else {
            continue;
        };
        // A kernel too old to give the uid gives the name alone: that says nothing of the owner.
        let uid = uid.ok_or_else(|| io::Error::other("unix_diag gives no owner"))?;
        list.owners.push((name[1..].to_vec(), uid));
    }
    Ok(false)
}

/// Netlink's alignment of messages and attributes (`NLMSG_ALIGN`, `RTA_ALIGN`): 4 bytes.
fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

/// The kernel's cookie of a socket (`SO_COOKIE`): what a door registration names.
pub(crate) fn socket_cookie(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u64> {
    super::getsockopt(fd, libc::SOL_SOCKET, libc::SO_COOKIE, 0u64)
}

/// The index of the interface a socket is bound to (`SO_BINDTOIFINDEX`, Linux 5.0), 0 for
/// none. A kernel that cannot say (older than 5.0) is asked for the device's name
/// (`SO_BINDTODEVICE`) instead.
pub(crate) fn bound_device(fd: std::os::fd::BorrowedFd<'_>) -> u32 {
    if let Ok(i) = super::getsockopt(fd, libc::SOL_SOCKET, libc::SO_BINDTOIFINDEX, 0 as libc::c_int) {
        return u32::try_from(i).unwrap_or(0);
    }
    match socket2::SockRef::from(&fd).device() {
        Ok(Some(name)) => match std::ffi::CString::new(name) {
            // SAFETY: `name` is a NUL-terminated string that lives across the call.
            Ok(name) => unsafe { libc::if_nametoindex(name.as_ptr()) },
            Err(_) => 0,
        },
        _ => 0,
    }
}

/// Whether the socket `fd` is an IPv6 socket with `IPV6_V6ONLY` set (it receives no IPv4
/// connection); `false` for an IPv4 socket, or when the kernel does not say.
pub(crate) fn v6_only(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    socket2::SockRef::from(&fd).only_v6().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Listening seqpacket sockets whose names start with the prefix are listed with their
    /// owners' uids: not a stream socket of such a name (an abstract name is one per socket
    /// type, so anybody may bind a door's name as a stream socket), not a name without the
    /// prefix, not a socket once it is closed.
    #[test]
    fn listeners_of_a_prefix_are_listed_by_owner() {
        super::super::raise_fd_limit();
        let prefix = format!("smc-tokio-diag-test-{}/", std::process::id()).into_bytes();
        let named = |tail: &str| [prefix.clone(), tail.as_bytes().to_vec()].concat();
        let list = || {
            let l = seqpacket_listeners(&prefix).unwrap();
            assert!(l.whole, "the list was not read whole");
            let mut owners = l.owners;
            owners.sort();
            owners
        };
        assert_eq!(list(), Vec::new());
        let door = crate::sys::seqpacket_listen(&named("door"), false).unwrap();
        let stream = super::super::unix_socket(libc::SOCK_STREAM).unwrap();
        super::super::bind_abstract(stream.as_fd(), &named("stream")).unwrap();
        // SAFETY: plain syscall on our socket.
        cvt(unsafe { libc::listen(stream.as_raw_fd(), 1) }).unwrap();
        let elsewhere = crate::sys::seqpacket_listen(format!("elsewhere-{}", std::process::id()).as_bytes(), false);
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(list(), vec![(named("door"), me)], "a stream socket, or a name without the prefix, was listed");
        let second = crate::sys::seqpacket_listen(&named("other"), false).unwrap();
        assert_eq!(list(), vec![(named("door"), me), (named("other"), me)]);
        drop((door, second, stream, elsewhere));
        assert_eq!(list(), Vec::new());
        // What a read through a longer list costs (printed, not asserted). Two hundred: well
        // within a soft descriptor limit of 1 024 with the tests beside this one.
        let many: Vec<_> = (0..200)
            .map(|i| crate::sys::seqpacket_listen(named(&format!("many-{i}")).as_slice(), false))
            .collect::<Result<_, _>>()
            .unwrap();
        let t = std::time::Instant::now();
        let l = seqpacket_listeners(&prefix).unwrap();
        println!("a read through {} listeners took {:?}", l.seen, t.elapsed());
        assert_eq!(l.owners.len(), many.len());
    }

    /// A dump's parts as the kernel writes them: a listener with the prefix and its uid, one
    /// without, a stream socket, the end, an error; truncated or malformed messages (an
    /// attribute of length 0 included) are errors, never panics or loops.
    #[test]
    fn unix_dump_parts_are_read_as_the_kernel_writes_them() {
        fn msg(kind: u16, body: &[u8]) -> Vec<u8> {
            let len = (NLMSG_HDR + body.len()) as u32;
            let mut m = len.to_ne_bytes().to_vec();
            m.extend_from_slice(&kind.to_ne_bytes());
            m.extend_from_slice(&[0; 10]);
            m.extend_from_slice(body);
            m.resize(align4(m.len()), 0);
            m
        }
        fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
            let mut a = ((4 + data.len()) as u16).to_ne_bytes().to_vec();
            a.extend_from_slice(&kind.to_ne_bytes());
            a.extend_from_slice(data);
            a.resize(align4(a.len()), 0);
            a
        }
        let sock = |ty: i32, name: &[u8], uid: Option<u32>| {
            let mut body = vec![0u8; UNIX_MSG_LEN];
            body[1] = ty as u8;
            body.extend(attr(UNIX_DIAG_NAME, name));
            if let Some(u) = uid {
                body.extend(attr(UNIX_DIAG_UID, &u.to_ne_bytes()));
            }
            msg(SOCK_DIAG_BY_FAMILY, &body)
        };
        let sp = libc::SOCK_SEQPACKET;
        let want = b"\0door/";
        let mut list = Listeners::default();
        let mut part = sock(sp, b"\0other", Some(7));
        part.extend(sock(sp, b"\0door/1", Some(1000)));
        part.extend(sock(libc::SOCK_STREAM, b"\0door/2", Some(9)));
        assert!(!parse_unix_dump(&part, want, &mut list).unwrap());
        assert_eq!((list.owners.clone(), list.seen), (vec![(b"door/1".to_vec(), 1000)], 3));
        assert!(parse_unix_dump(&msg(NLMSG_DONE, &[0; 4]), want, &mut list).unwrap());
        let err = msg(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse_unix_dump(&err, want, &mut list).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert!(parse_unix_dump(&sock(sp, b"\0door/3", None), want, &mut list).is_err(), "a name without its owner");
        let whole = sock(sp, b"\0door/4", Some(1000));
        for cut in 1..whole.len() {
            let _ = parse_unix_dump(&whole[..cut], want, &mut list);
        }
        let mut huge = whole.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse_unix_dump(&huge, want, &mut list).is_err());
        let mut tiny = whole.clone();
        tiny[0..4].copy_from_slice(&3u32.to_ne_bytes());
        assert!(parse_unix_dump(&tiny, want, &mut list).is_err());
        // An attribute that says it is 0 bytes long.
        let mut body = vec![0u8; UNIX_MSG_LEN];
        body.extend_from_slice(&[0, 0, 0, 0]);
        assert!(parse_unix_dump(&msg(SOCK_DIAG_BY_FAMILY, &body), want, &mut list).is_err());
    }

    /// The client end of a loopback connection is found by its four-tuple, with our uid and
    /// its own cookie; the server end by the reverse tuple; a tuple nobody has is `None`.
    #[test]
    fn finds_the_client_end_of_a_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let diag = TcpDiag::new(0).unwrap();
        let me = c.local_addr().unwrap();
        let them = c.peer_addr().unwrap();
        let got = diag.owner(me, them).unwrap().unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(got.uid, unsafe { libc::geteuid() });
        assert_eq!(got.cookie, socket_cookie(c.as_fd()).unwrap());
        assert_eq!(got.state, 1);
        let server_end = diag.owner(them, me).unwrap().unwrap();
        assert_eq!(server_end.cookie, socket_cookie(s.as_fd()).unwrap());
        assert_ne!(server_end.cookie, got.cookie);
        let nobody = SocketAddr::new(me.ip(), 1);
        assert_eq!(diag.owner(nobody, them).unwrap(), None);
    }

    /// Sockets bound to a device (`SO_BINDTODEVICE`, as in a VRF) are found only by a look-up
    /// that names the device; one that names it still finds sockets bound to none. The
    /// listener's device is what its door's look-ups name (`bound_device`).
    #[test]
    fn sockets_bound_to_a_device_are_found_by_naming_it() {
        let bound = || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            // Needs CAP_NET_RAW; the tests run as root.
            s.bind_device(Some(b"lo")).unwrap();
            s
        };
        let l = bound();
        l.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        l.listen(8).unwrap();
        let server = l.local_addr().unwrap().as_socket().unwrap();
        assert_eq!(bound_device(l.as_fd()), if_index(c"lo"));
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(bound_device(plain.as_fd()), 0);

        let c = bound();
        c.connect(&server.into()).unwrap();
        let (s, _) = l.accept().unwrap();
        let client = c.local_addr().unwrap().as_socket().unwrap();
        let blind = TcpDiag::new(0).unwrap();
        assert_eq!(blind.owner(client, server).unwrap(), None, "found without naming the device");
        assert!(!blind.answers(server, client).unwrap());
        let diag = TcpDiag::new(bound_device(l.as_fd())).unwrap();
        assert_eq!(diag.owner(client, server).unwrap().unwrap().cookie, socket_cookie(c.as_fd()).unwrap());
        assert!(diag.answers(server, client).unwrap());
        assert_eq!(diag.owner(server, client).unwrap().unwrap().cookie, socket_cookie(s.as_fd()).unwrap());

        // A client bound to no device, of the same listener.
        let free = std::net::TcpStream::connect(server).unwrap();
        let _s2 = l.accept().unwrap();
        let got = diag.owner(free.local_addr().unwrap(), server).unwrap().unwrap();
        assert_eq!(got.cookie, socket_cookie(free.as_fd()).unwrap());
    }

    fn if_index(name: &std::ffi::CStr) -> u32 {
        // SAFETY: `name` is NUL-terminated and lives across the call.
        unsafe { libc::if_nametoindex(name.as_ptr()) }
    }

    /// The listener a connection would reach, and whether it is bound to the address asked
    /// or to the wildcard; no answer for a port nobody listens on.
    #[test]
    fn the_listener_for_an_address_says_what_it_is_bound_to() {
        let diag = TcpDiag::new(0).unwrap();
        let wild = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let at = SocketAddr::from(([127, 0, 0, 1], wild.local_addr().unwrap().port()));
        assert_eq!(diag.listener_is_wildcard(at).unwrap(), Some(true));
        let exact = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(diag.listener_is_wildcard(exact.local_addr().unwrap()).unwrap(), Some(false));
        let port = exact.local_addr().unwrap().port();
        drop((wild, exact));
        assert_eq!(diag.listener_is_wildcard(SocketAddr::from(([127, 0, 0, 1], port))).unwrap(), None);
    }

    /// An IPv4 client of a dual-stack IPv6 listener is found as an IPv4 socket, whichever way
    /// its addresses are written.
    #[test]
    fn finds_ipv4_clients_of_a_dual_stack_listener() {
        let Ok(l) = std::net::TcpListener::bind("[::]:0") else { return };
        let port = l.local_addr().unwrap().port();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_s, peer) = l.accept().unwrap();
        let diag = TcpDiag::new(0).unwrap();
        let server_local: SocketAddr = format!("[::ffff:127.0.0.1]:{port}").parse().unwrap();
        let got = diag.owner(peer, server_local).unwrap().unwrap();
        assert_eq!(got.cookie, socket_cookie(c.as_fd()).unwrap());
    }

    /// A tuple no connected socket has is no socket, even where a listener is bound to its
    /// local port: the kernel answers such a lookup with the listener (a stranger's, say, on
    /// the port a remote client connects from), which owns no connection.
    #[test]
    fn a_listener_on_the_asked_port_is_not_the_client_end() {
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let diag = TcpDiag::new(0).unwrap();
        let client_end: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        assert_eq!(diag.owner(client_end, server.local_addr().unwrap()).unwrap(), None);
        let remote: SocketAddr = format!("192.0.2.7:{port}").parse().unwrap();
        assert_eq!(diag.owner(remote, server.local_addr().unwrap()).unwrap(), None);
        // What the kernel itself answers there: the listener, with a tuple that is not the one
        // asked (no peer).
        let mut req_tuple = [0u8; TUPLE_LEN];
        req_tuple[0..2].copy_from_slice(&port.to_be_bytes());
        let mut answer = [0u8; NLMSG_HDR + MSG_LEN];
        answer[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        answer[NLMSG_HDR + 4..NLMSG_HDR + 6].copy_from_slice(&port.to_be_bytes());
        answer[NLMSG_HDR + 1] = 10; // TCP_LISTEN
        assert!(parse_answer(&answer, Some((&req_tuple, 0))).unwrap().is_some());
        req_tuple[2..4].copy_from_slice(&server.local_addr().unwrap().port().to_be_bytes());
        assert_eq!(parse_answer(&answer, Some((&req_tuple, 0))).unwrap(), None);
        // Asked whether the kernel answers at all, it does (with the listener).
        assert!(parse_answer(&answer, None).unwrap().is_some());
        assert!(diag.answers(client_end, server.local_addr().unwrap()).unwrap());
    }

    /// An answer for the asked tuple from a socket bound to another device than the one named
    /// is no answer; one bound to none, or to that device, is.
    #[test]
    fn a_socket_on_another_device_is_not_the_one_asked() {
        let tuple = [7u8; TUPLE_LEN];
        let answer = |bound: u32| {
            let mut a = [0u8; NLMSG_HDR + MSG_LEN];
            a[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
            a[NLMSG_HDR + 4..NLMSG_HDR + 4 + TUPLE_LEN].copy_from_slice(&tuple);
            a[NLMSG_HDR + 4 + TUPLE_LEN..NLMSG_HDR + 8 + TUPLE_LEN].copy_from_slice(&bound.to_ne_bytes());
            a
        };
        assert!(parse_answer(&answer(0), Some((&tuple, 3))).unwrap().is_some());
        assert!(parse_answer(&answer(3), Some((&tuple, 3))).unwrap().is_some());
        assert_eq!(parse_answer(&answer(5), Some((&tuple, 3))).unwrap(), None);
        assert_eq!(parse_answer(&answer(5), Some((&tuple, 0))).unwrap(), None);
    }

    #[test]
    fn short_and_foreign_answers_are_errors() {
        let any = Some((&[0; TUPLE_LEN], 0));
        assert!(parse_answer(&[0; 8], any).is_err());
        let mut b = [0u8; NLMSG_HDR + 4];
        b[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        b[NLMSG_HDR..].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_answer(&b, any).unwrap(), None);
        b[NLMSG_HDR..].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse_answer(&b, any).unwrap_err().raw_os_error(), Some(libc::EPERM));
        b[4..6].copy_from_slice(&99u16.to_ne_bytes());
        assert!(parse_answer(&b, any).is_err());
        let mut m = [0u8; NLMSG_HDR + 10];
        m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        assert!(parse_answer(&m, any).is_err());
    }
}
