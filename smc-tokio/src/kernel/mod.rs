//! The Linux kernel's own SMC (`AF_SMC` sockets, `net/smc`), so that tokio applications speak
//! SMC with every kernel-SMC peer: IBM Z ISM, RoCE fabrics, programs run under `smc_run`.
//!
//! With [`KernelMode::On`] (or [`Auto`](KernelMode::Auto) on a host whose kernel has SMC
//! loaded), listeners listen on an `AF_SMC` socket and clients connect through one:
//!
//! - a kernel-SMC peer gets SMC-R or SMC-D from the kernel (its SYN carries the SMC option);
//!   [`SmcStream::transport`](crate::SmcStream::transport) says
//!   [`KernelSmcR`](crate::Transport::KernelSmcR) or [`KernelSmcD`](crate::Transport::KernelSmcD),
//!   read from the kernel's own diagnostics (`smc_diag`);
//! - any other peer makes the kernel fall back to TCP on the same socket, and smc-tokio's own
//!   establishment proceeds on top: smc-tokio peers on this host still get this crate's SMC-D
//!   through the listener's door, opted-in peers the in-band handshake, plain peers TCP. A
//!   connection that stays on TCP reports the kernel's fallback reason
//!   ([`FallbackReason::Kernel`](crate::FallbackReason));
//! - where the kernel has no `AF_SMC`, sockets are plain TCP, as with [`KernelMode::Off`], and
//!   [`Stats::kernel`](crate::Stats::kernel) counts why.
//!
//! On such sockets the crate's batching and limits map to the kernel's: a
//! [cork guard](crate::SmcStream::cork) sets and clears `TCP_CORK` (the kernel pushes its send
//! buffer when the cork is cleared), [`sendfile`](crate::SmcStream::sendfile) is `sendfile(2)`,
//! a listener's `limit_handshake` is the socket option `SMC_LIMIT_HS`, and
//! [`set_limit_handshake`] switches the kernel's global limit (its generic-netlink knob).
//!
//! Every call here is a socket or netlink system call that the kernel answers at once (netlink
//! requests are sent and read with `MSG_DONTWAIT`), so none blocks a runtime worker.

mod wire;

use std::io;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

pub use wire::abi_report;
pub(crate) use wire::DiagMode;

use crate::transport::{FallbackReason, Transport};
pub use crate::transport::{KernelFallback, KernelMode, KernelUnavailable};

/// How long a look at `/sys/module/smc` is trusted for [`KernelMode::Auto`]: the module is
/// loaded rarely, and a `stat(2)` per connection would cost more than the connection's own
/// system calls on a connect-heavy client (crr). One second follows an administrator's
/// `modprobe` promptly enough.
const LOADED_RECHECK_MS: u64 = 1000;

fn epoch() -> Instant {
    static E: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *E.get_or_init(Instant::now)
}

/// Whether the kernel's SMC module is loaded (or built in): `/sys/module/smc` exists.
fn smc_loaded() -> bool {
    static CHECKED_MS: AtomicU64 = AtomicU64::new(u64::MAX);
    static LOADED: AtomicBool = AtomicBool::new(false);
    let now = epoch().elapsed().as_millis() as u64;
    let last = CHECKED_MS.load(Ordering::Relaxed);
    if last != u64::MAX && now.saturating_sub(last) < LOADED_RECHECK_MS {
        return LOADED.load(Ordering::Relaxed);
    }
    let loaded = std::path::Path::new("/sys/module/smc").exists();
    LOADED.store(loaded, Ordering::Relaxed);
    CHECKED_MS.store(now, Ordering::Relaxed);
    loaded
}

/// A non-blocking `AF_SMC` stream socket for `addr`'s family, or why there is none (`None`:
/// the mode is [`KernelMode::Off`], nothing to count). Reasons are counted in the stats.
pub(crate) fn socket(counters: &crate::stats::Counters, mode: KernelMode, addr: SocketAddr) -> Option<socket2::Socket> {
    let why = match mode {
        KernelMode::Off => return None,
        KernelMode::Auto if !smc_loaded() => KernelUnavailable::NotLoaded,
        _ => match open(addr) {
            Ok(s) => return Some(s),
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT | libc::ESOCKTNOSUPPORT) => {
                        KernelUnavailable::NoAfSmc
                    }
                    _ => KernelUnavailable::SocketFailed,
                };
                tracing::debug!(error = %e, %why, "no AF_SMC socket: using tcp");
                why
            }
        },
    };
    counters.kernel_unavailable(why);
    None
}

fn open(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let proto = if addr.is_ipv4() { wire::SMCPROTO_SMC } else { wire::SMCPROTO_SMC6 };
    socket2::Socket::new(
        socket2::Domain::from(wire::AF_SMC),
        socket2::Type::STREAM.nonblocking().cloexec(),
        Some(socket2::Protocol::from(proto)),
    )
}

/// Whether `fd` is an `AF_SMC` socket (`SO_DOMAIN`).
pub(crate) fn is_smc_socket(fd: BorrowedFd<'_>) -> bool {
    socket2::SockRef::from(&fd).domain().is_ok_and(|d| d == socket2::Domain::from(wire::AF_SMC))
}

/// Sets `SMC_LIMIT_HS` on an `AF_SMC` socket that is about to listen: with it on, the kernel
/// serves TCP when the listener's SMC handshakes pile up (its SYN-ACK then carries no SMC
/// option, and both sides fall back with "peer has no smc"). The kernel reads it in `listen`,
/// so it has no effect on a socket that already listens.
pub(crate) fn set_socket_limit_handshake(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    crate::sys::setsockopt(fd, wire::SOL_SMC, wire::SMC_LIMIT_HS, &libc::c_int::from(on))
}

/// What the kernel made of the `AF_SMC` connection `fd`, from `smc_diag`.
pub(crate) fn diag(fd: BorrowedFd<'_>) -> io::Result<DiagMode> {
    let inode = crate::sys::fstat(fd)?.st_ino;
    let mut found = None;
    // The kernel's smc_diag answers only with a dump of every SMC socket of the namespace; it
    // is read up to our socket, no further: the kernel fills each part as the one before is
    // read, so at most one part after ours is made.
    transact(wire::NETLINK_SOCK_DIAG, &wire::diag_request(next_seq()), true, |m| {
        if wire::is_diag_entry(m) {
            let (ino, mode) = wire::diag_entry(m.payload)?;
            if ino == inode {
                found = Some(mode);
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    })?;
    found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "smc_diag does not list the socket"))
}

/// The transport of a connection on an `AF_SMC` socket whose own establishment ended with
/// `ours`: the kernel's SMC if the kernel moved it; ours if we moved it (the kernel fell back,
/// since our peer did not speak the kernel's SMC); otherwise TCP, for the kernel's reason.
/// Counted in the stats.
pub(crate) fn transport(counters: &crate::stats::Counters, fd: BorrowedFd<'_>, ours: Transport) -> Transport {
    let t = match diag(fd) {
        Ok(DiagMode::SmcR) => Transport::KernelSmcR,
        Ok(DiagMode::SmcD) => Transport::KernelSmcD,
        Ok(DiagMode::Fallback { reason, peer_diagnosis }) => {
            counters.kernel_fallback(reason);
            if ours.is_smc() {
                ours
            } else {
                Transport::Tcp(FallbackReason::Kernel(KernelFallback { reason, peer_diagnosis }))
            }
        }
        Ok(DiagMode::Other(m)) => {
            tracing::debug!(mode = m, "smc_diag reported a mode this crate does not know");
            Transport::KernelUnknown
        }
        Err(e) => {
            tracing::debug!(error = %e, "smc_diag gave no answer for the socket");
            Transport::KernelUnknown
        }
    };
    counters.kernel_transport(t);
    t
}

/// Whether the kernel's global SMC handshake limitation is on (`SMC_NETLINK_DUMP_HS_LIMITATION`
/// of the `SMC_GEN_NETLINK` family): with it on, kernel SMC listeners serve TCP when their
/// handshakes pile up, whatever their own `SMC_LIMIT_HS`.
///
/// An error of kind `NotFound` means the kernel has no SMC generic-netlink family (no SMC, or
/// the module is not loaded).
///
/// # Examples
///
/// ```
/// match smc_tokio::kernel::limit_handshake() {
///     Ok(on) => println!("kernel smc handshake limitation: {on}"),
///     Err(e) => println!("no kernel smc here: {e}"),
/// }
/// ```
pub fn limit_handshake() -> io::Result<bool> {
    let family = smc_family()?;
    let mut value = None;
    transact(libc::NETLINK_GENERIC, &wire::hs_limitation_get(family, next_seq()), true, |m| {
        value = Some(wire::hs_limitation_value(m.payload)?);
        Ok(ControlFlow::Continue(()))
    })?;
    value.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "empty handshake limitation dump"))
}

/// Turns the kernel's global SMC handshake limitation on or off, as `smcd`/`smcr` of smc-tools
/// do (needs `CAP_NET_ADMIN`; `PermissionDenied` otherwise).
///
/// # Examples
///
/// ```
/// // Without kernel SMC (or without the capability) this is an error that says so.
/// if let Err(e) = smc_tokio::kernel::set_limit_handshake(true) {
///     println!("cannot switch the kernel's limitation: {e}");
/// }
/// ```
pub fn set_limit_handshake(on: bool) -> io::Result<()> {
    let family = smc_family()?;
    transact(libc::NETLINK_GENERIC, &wire::hs_limitation_set(family, on, next_seq()), false, |_| {
        Ok(ControlFlow::Continue(()))
    })
}

/// Whether this kernel offers `AF_SMC` sockets now (creates one and closes it, which may load
/// the module).
///
/// # Examples
///
/// ```
/// println!("kernel smc: {}", smc_tokio::kernel::available());
/// ```
pub fn available() -> bool {
    open(SocketAddr::from(([127, 0, 0, 1], 0))).is_ok()
}

fn smc_family() -> io::Result<u16> {
    let mut id = None;
    transact(libc::NETLINK_GENERIC, &wire::genl_family_request(wire::SMC_GENL_FAMILY_NAME, next_seq()), false, |m| {
        id = Some(wire::genl_family_id(m.payload)?);
        Ok(ControlFlow::Continue(()))
    })
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => io::Error::new(io::ErrorKind::NotFound, "the kernel has no SMC_GEN_NETLINK family"),
        _ => e,
    })?;
    id.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no family id in the answer"))
}

fn next_seq() -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// Sends `request` on a new netlink socket of `proto` and hands every data message of the
/// answer to `each`, until the dump's end (`dump`) or the one answer, error or acknowledgement,
/// or until `each` says it has what it wanted (`Break`).
/// Reads with `MSG_DONTWAIT`: the kernel produces its answer (each part of a dump) within the
/// calls, so a read that would wait is an error, never a stalled worker.
fn transact(
    proto: libc::c_int,
    request: &[u8],
    dump: bool,
    mut each: impl FnMut(&wire::Msg<'_>) -> io::Result<ControlFlow<()>>,
) -> io::Result<()> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed is a valid sockaddr_nl (pid 0, groups 0: the kernel).
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `request` and `sa` are valid for the given lengths; `fd` is open.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            request.as_ptr().cast(),
            request.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let seq = wire::messages(request)?.first().map(|m| m.seq).unwrap_or(0);
    // A dump part is at most a page or so; 32 KiB holds any the kernel sends by default.
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: `buf` is valid for writes of its length; `fd` is open.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the kernel did not answer the netlink request"));
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "netlink socket closed"));
        }
        for m in wire::messages(&buf[..n as usize])? {
            if m.seq != seq {
                continue;
            }
            match wire::control(&m)? {
                wire::Control::Done | wire::Control::Ack => return Ok(()),
                wire::Control::Error(e) => return Err(io::Error::from_raw_os_error(e)),
                wire::Control::Data => {
                    // Enough: the socket closes with the rest of the answer unread.
                    if each(&m)?.is_break() {
                        return Ok(());
                    }
                    if !dump && !wire::is_multi(&m) {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [KernelMode::Off, KernelMode::Auto, KernelMode::On] {
            assert_eq!(m.to_string().parse::<KernelMode>(), Ok(m));
        }
        assert_eq!(" ON ".parse::<KernelMode>(), Ok(KernelMode::On));
        assert!("".parse::<KernelMode>().is_err());
    }

    #[test]
    fn fallback_reasons_name_known_codes_only() {
        let codes: Vec<u32> = crate::transport::KERNEL_REASONS.iter().map(|(c, _)| *c).collect();
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), codes.len(), "a code is listed twice");
        let f = KernelFallback { reason: 0x0500_0000, peer_diagnosis: 0x0303_0008 };
        assert_eq!(
            f.to_string(),
            "kernel fallback 0x05000000 (peer declined during the handshake), peer's diagnosis 0x03030008"
        );
        assert_eq!(KernelFallback { reason: 7, peer_diagnosis: 0 }.to_string(), "kernel fallback 0x00000007");
    }

    #[test]
    fn off_makes_no_socket_and_counts_nothing() {
        let counters = crate::stats::Counters::default();
        assert!(socket(&counters, KernelMode::Off, "127.0.0.1:1".parse().unwrap()).is_none());
        assert_eq!(counters.snapshot(&crate::config::RmbBudget::new()).kernel.unavailable, [0; 3]);
    }

    #[test]
    fn a_tcp_socket_is_not_an_smc_socket() {
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!is_smc_socket(std::os::fd::AsFd::as_fd(&s)));
    }
}
