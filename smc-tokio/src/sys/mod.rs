//! The raw system calls the driver needs: memfd regions, Unix sockets (doorbells, door and side
//! channels, descriptor passing), file I/O for sendfile; TCP sockets and addresses in [`tcp`];
//! descriptors from other processes, closed off the runtime, in [`closer`].

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use crate::proto::clc::Secret;
use crate::proto::side::BellTag;

/// Fills `buf` from the kernel's CSPRNG (getrandom(2)).
fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the whole call.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(())
}

/// Bytes of the kernel's CSPRNG, drawn a page at a time, so that a connection's secret costs
/// no system call (a getrandom(2) per connection was one of a same-host connection's calls).
/// The page is private to its thread and marked `MADV_WIPEONFORK`: a forked child finds it
/// zeroed, hence empty, and draws its own bytes instead of repeating its parent's. Bytes are
/// zeroed as they are handed out. Without `MADV_WIPEONFORK` (Linux < 4.14) nothing is pooled.
struct RandomPage(std::ptr::NonNull<u8>);

/// The page's size, and where its bytes start: its first 8 bytes are the offset of the next
/// unused byte (0, as a wiped page has it: none left).
const RANDOM_PAGE: usize = 4096;
const RANDOM_HEAD: usize = 8;

impl RandomPage {
    fn new() -> Option<RandomPage> {
        // SAFETY: an anonymous private mapping of one page; no address is requested.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RANDOM_PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: `p` is the page just mapped, RANDOM_PAGE bytes long.
        if unsafe { libc::madvise(p, RANDOM_PAGE, libc::MADV_WIPEONFORK) } != 0 {
            // SAFETY: unmapping the page mapped above, which nothing else refers to.
            unsafe { libc::munmap(p, RANDOM_PAGE) };
            return None;
        }
        std::ptr::NonNull::new(p.cast()).map(RandomPage)
    }

    /// Fills `out` (at most a page's bytes) from the page, refilling it when it runs short.
    fn take(&mut self, out: &mut [u8]) -> io::Result<()> {
        let base = self.0.as_ptr();
        // SAFETY: the page is RANDOM_PAGE bytes, mapped read-write for this value's life and
        // used by this thread only; its head is 8-aligned (page-aligned mapping).
        let page = unsafe { std::slice::from_raw_parts_mut(base, RANDOM_PAGE) };
        let mut next = u64::from_ne_bytes(page[..RANDOM_HEAD].try_into().unwrap_or_default()) as usize;
        if next < RANDOM_HEAD || next + out.len() > RANDOM_PAGE {
            getrandom(&mut page[RANDOM_HEAD..])?;
            next = RANDOM_HEAD;
        }
        let taken = &mut page[next..next + out.len()];
        out.copy_from_slice(taken);
        taken.fill(0);
        page[..RANDOM_HEAD].copy_from_slice(&((next + out.len()) as u64).to_ne_bytes());
        Ok(())
    }
}

impl Drop for RandomPage {
    fn drop(&mut self) {
        // SAFETY: the page mapped in `new`, which nothing refers to after this value.
        unsafe { libc::munmap(self.0.as_ptr().cast(), RANDOM_PAGE) };
    }
}

thread_local! {
    /// This thread's random page; `None` where it cannot be had.
    static RANDOM: std::cell::RefCell<Option<RandomPage>> = std::cell::RefCell::new(RandomPage::new());
}

/// Fills `out` with bytes of the kernel's CSPRNG, through this thread's page when it has one.
fn random_bytes(out: &mut [u8]) -> io::Result<()> {
    let pooled = RANDOM.try_with(|r| r.try_borrow_mut().ok().and_then(|mut p| p.as_mut().map(|p| p.take(out))));
    match pooled {
        Ok(Some(r)) => r,
        // No page (or this thread is exiting): straight from the kernel.
        _ => getrandom(out),
    }
}

/// A random connection token from the kernel's CSPRNG.
pub(crate) fn random_secret() -> io::Result<Secret> {
    let mut t = [0u8; 16];
    random_bytes(&mut t)?;
    Ok(Secret(t))
}

/// A random non-zero 64-bit id (link groups, side-channel names, a context's instance, port
/// choices): from the kernel's CSPRNG, which does not fail on Linux >= 3.17 with these flags;
/// should it, from the clock and the pid.
pub(crate) fn random_u64() -> u64 {
    let t = random_secret().map(|t| t.0).unwrap_or_else(|_| {
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        (n ^ u128::from(std::process::id())).to_le_bytes()
    });
    u64::from_le_bytes(t[..8].try_into().unwrap_or_default()) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc` whose `self` names another pid than ours is another pid namespace's: a peer's
    /// pid there may be another process, so nothing read there says who the peer is.
    #[test]
    fn a_proc_of_another_pid_namespace_is_not_read_for_a_peer() {
        let path = |s: &str| std::path::PathBuf::from(s);
        assert!(proc_is_ours(Some(&path("4242")), 4242));
        assert!(!proc_is_ours(Some(&path("17")), 4242), "the parent namespace's numbering");
        assert!(!proc_is_ours(Some(&path("self")), 4242));
        assert!(!proc_is_ours(None, 4242), "no link to read");
        // Here, where the tests run: ours.
        assert!(proc_is_ours(std::fs::read_link("/proc/self").ok().as_deref(), std::process::id()));
    }

    /// The peer of a socket is judged as the process that made it while that process lives:
    /// ourselves across a socket pair, yes; a child that connected and exited, no (its pidfd
    /// says so, where the kernel gives one, whatever process has its pid by then).
    #[test]
    fn the_peer_judged_is_the_live_process_of_the_socket() {
        // SAFETY: these getters cannot fail and take no pointers.
        let me = unsafe { PeerCred { pid: libc::getpid(), uid: libc::geteuid(), gid: libc::getegid() } };
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(could_trace_us(&me, a.as_fd()), could_trace(&me));
        let path = std::env::temp_dir().join(format!("smc-tokio-pidfd-{}", me.pid));
        let _ = std::fs::remove_file(&path);
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let script =
            format!("import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?})", path.to_str().unwrap());
        let status = std::process::Command::new("python3").args(["-c", &script]).status().unwrap();
        assert!(status.success());
        let (gone, _) = l.accept().unwrap();
        let _ = std::fs::remove_file(&path);
        match peer_pidfd(gone.as_fd()) {
            Ok(fd) => assert!(!alive(fd.as_fd()), "an exited peer's pidfd says it lives"),
            // Reaped already (the child was waited for): the kernel gives no pidfd.
            Err(e) if e.raw_os_error() != Some(libc::ENOPROTOOPT) => {}
            Err(_) => eprintln!("SKIPPED: no SO_PEERPIDFD here (before Linux 6.5)"),
        }
        let cred = peer_cred(gone.as_fd()).unwrap();
        assert!(!could_trace_us(&cred, gone.as_fd()), "an exited peer could trace us");
    }

    /// Who could trace us, as [`could_trace_us`] reads it: ourselves and a plain child of ours
    /// (same ids, capabilities and namespaces) where the machine lets such processes trace each
    /// other; a child that dropped its capabilities, one of another uid and one in another pid
    /// namespace never.
    #[test]
    fn only_a_process_that_could_trace_us_may_be_lent_to() {
        // SAFETY: these getters cannot fail and take no pointers.
        let (pid, uid, gid) = unsafe { (libc::getpid(), libc::geteuid(), libc::getegid()) };
        let me = ProcStatus::read("/proc/self").unwrap();
        let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").map_or(true, |s| s.trim() == "0");
        if !yama || me.seccomp != 0 || me.uids[..3].iter().any(|&u| u != uid) || me.gids[..3].iter().any(|&g| g != gid)
        {
            eprintln!("SKIPPED: this process could not be traced by its own kind here (Yama, seccomp or mixed ids)");
            return;
        }
        assert!(could_trace(&PeerCred { pid, uid, gid }));
        let child = |cmd: &mut std::process::Command| {
            let c = cmd.arg("sleep").arg("30").spawn().unwrap();
            // The exec has happened once the status names sleep.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::fs::read_to_string(format!("/proc/{}/comm", c.id())).map_or(true, |s| s.trim() != "sleep") {
                assert!(std::time::Instant::now() < deadline, "the child did not start");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            c
        };
        let mut plain = child(&mut std::process::Command::new("env"));
        assert!(could_trace(&PeerCred { pid: plain.id() as i32, uid, gid }), "a plain child of ours");
        assert!(!could_trace(&PeerCred { pid: plain.id() as i32, uid: uid + 1, gid }), "another uid named");
        plain.kill().unwrap();
        plain.wait().unwrap();
        assert!(!could_trace(&PeerCred { pid: 0, uid, gid }), "a pid we cannot see");
        if me.cap_permitted != 0 && uid == 0 {
            let mut weak =
                child(std::process::Command::new("setpriv").args(["--bounding-set=-all", "--inh-caps=-all"]));
            assert!(!could_trace(&PeerCred { pid: weak.id() as i32, uid, gid }), "a child without our capabilities");
            weak.kill().unwrap();
            weak.wait().unwrap();
            let mut other =
                child(std::process::Command::new("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups"]));
            assert!(!could_trace(&PeerCred { pid: other.id() as i32, uid: 65534, gid: 65534 }), "another uid");
            other.kill().unwrap();
            other.wait().unwrap();
            // The unshare process stays in our namespace; its child, sleep, is the one in the new one.
            let mut ns =
                std::process::Command::new("unshare").args(["--pid", "--fork", "sleep", "30"]).spawn().unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let inner = loop {
                let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", ns.id())).unwrap_or_default();
                if let Some(p) = kids.split_whitespace().next().and_then(|p| p.parse::<i32>().ok()) {
                    break p;
                }
                assert!(std::time::Instant::now() < deadline, "unshare started no child");
                std::thread::sleep(std::time::Duration::from_millis(10));
            };
            assert!(!could_trace(&PeerCred { pid: inner, uid, gid }), "a process in another pid namespace");
            let mut nnp = child(std::process::Command::new("setpriv").arg("--no-new-privs"));
            assert!(!could_trace(&PeerCred { pid: nnp.id() as i32, uid, gid }), "a child with no_new_privs");
            nnp.kill().unwrap();
            nnp.wait().unwrap();
            ns.kill().unwrap();
            // SAFETY: kill takes no pointers; the child is ours to signal.
            unsafe { libc::kill(inner, libc::SIGKILL) };
            ns.wait().unwrap();
        }
    }

    /// Secrets drawn across several refills of the page are all different, and a forked child
    /// draws its own instead of the one its parent draws next.
    #[test]
    fn secrets_differ_across_refills_and_forks() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3 * RANDOM_PAGE / 16 {
            assert!(seen.insert(random_secret().unwrap().0), "a secret repeated");
        }
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only draws a secret (this thread's page exists already: no
        // allocation, no lock), writes it and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let t = random_secret().map(|t| t.0).unwrap_or([0; 16]);
            // SAFETY: writing 16 bytes from `t` to the pipe, then leaving without unwinding.
            unsafe {
                libc::write(fds[1], t.as_ptr().cast(), t.len());
                libc::_exit(0);
            }
        }
        let parent = random_secret().unwrap().0;
        let mut child = [0u8; 16];
        // SAFETY: reading at most 16 bytes into `child`.
        let n = unsafe { libc::read(fds[0], child.as_mut_ptr().cast(), child.len()) };
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        // SAFETY: closing the pipe's two descriptors, ours.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert_eq!(n, 16);
        assert_ne!(child, [0; 16]);
        assert_ne!(child, parent, "the child repeated its parent's next secret");
        assert!(!seen.contains(&child));
    }

    /// The ids the kernel reports for peers our user namespace does not map are never trusted,
    /// not even when allowed or equal to our own uid; real ids are trusted as configured.
    #[test]
    fn the_overflow_ids_are_never_trusted() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let (overflow_uid, overflow_gid) = overflow_ids();
        let cred = |uid, gid| PeerCred { pid: 1, uid, gid };
        assert_eq!(cred(me, 0).trusted(&[]), me != overflow_uid);
        assert!(!cred(overflow_uid, 0).trusted(&[overflow_uid]));
        assert!(!cred(me, overflow_gid).trusted(&[me]));
        assert!(cred(12345, 1).trusted(&[12345]));
        assert!(!cred(12345, 1).trusted(&[]));
    }
    use std::os::fd::AsFd;

    #[test]
    fn tokens_differ() {
        assert_ne!(random_secret().unwrap(), random_secret().unwrap());
    }

    /// One side's doorbell: its ringing socket and its tag.
    struct Side {
        ring: OwnedFd,
        tag: BellTag,
        wait: Option<PeerFd>,
    }

    impl Side {
        fn wait(&self) -> BorrowedFd<'_> {
            self.wait.as_ref().unwrap().as_fd()
        }
    }

    /// Two sides' doorbells, set up as a link does: both ringing sockets first, then each
    /// waiting socket connected to the other's ringing one, then each ringing socket to the
    /// other's waiting one.
    fn bells() -> (Side, Side) {
        let (ra, ta) = bell_ring().unwrap();
        let (rb, tb) = bell_ring().unwrap();
        let wb = bell_wait(&tb, &ta).unwrap();
        let wa = bell_wait(&ta, &tb).unwrap();
        bell_ring_connect(ra.as_fd(), &tb).unwrap();
        bell_ring_connect(rb.as_fd(), &ta).unwrap();
        (Side { ring: ra, tag: ta, wait: Some(wa) }, Side { ring: rb, tag: tb, wait: Some(wb) })
    }

    /// An unbound, unconnected datagram socket, such as any local user can make.
    fn stranger() -> std::os::unix::net::UnixDatagram {
        let s = std::os::unix::net::UnixDatagram::unbound().unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    fn send_to(s: &std::os::unix::net::UnixDatagram, name: &[u8]) -> io::Result<usize> {
        use std::os::linux::net::SocketAddrExt;
        s.send_to_addr(b"r", &std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap())
    }

    /// Rings far beyond what the peer's queue holds never block (the extra ones are "already
    /// rung"), and a drain to the end reports WouldBlock instead of waiting.
    #[test]
    fn rings_beyond_the_queue_never_block_and_drains_end_in_would_block() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (a, b) = bells();
            for _ in 0..100_000 {
                doorbell_ring(a.ring.as_fd()).unwrap();
            }
            let mut drained = 0;
            loop {
                match doorbell_drain(b.wait(), false, 64) {
                    Ok(n) => drained += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            }
            let again = doorbell_drain(b.wait(), false, 64).unwrap_err().kind();
            tx.send((drained, again)).unwrap();
        });
        let (drained, again) =
            rx.recv_timeout(std::time::Duration::from_secs(20)).expect("a doorbell call blocked (or panicked)");
        assert!(drained > 0 && drained < 100_000, "our send buffer bounded the rings: {drained}");
        assert_eq!(again, io::ErrorKind::WouldBlock);
    }

    /// Nobody but the peer's ringing socket gets a datagram into a waiting socket, and nobody
    /// at all into a ringing one; not even after the peer's sockets are gone.
    #[test]
    fn a_doorbell_takes_rings_only_from_the_peers_ringing_socket() {
        use std::os::linux::net::SocketAddrExt;
        let (a, b) = bells();
        let third = stranger();
        for name in [&a.tag.wait_name()[..], &b.tag.wait_name()[..]] {
            assert_eq!(send_to(&third, name).unwrap_err().raw_os_error(), Some(libc::EPERM));
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
            assert_eq!(third.connect_addr(&addr).unwrap_err().raw_os_error(), Some(libc::EPERM));
        }
        // Connected, a ringing socket refuses strangers as a waiting one does; unconnected, its
        // shutdown refuses them (below).
        for name in [&a.tag.ring_name()[..], &b.tag.ring_name()[..]] {
            let e = send_to(&third, name).unwrap_err().raw_os_error();
            assert!(matches!(e, Some(libc::EPERM | libc::EPIPE)), "{e:?}");
        }
        doorbell_ring(b.ring.as_fd()).unwrap();
        doorbell_ring(a.ring.as_fd()).unwrap();
        assert_eq!(doorbell_drain(a.wait(), false, 8).unwrap(), 1);
        assert_eq!(doorbell_drain(b.wait(), false, 8).unwrap(), 1);
        // The peer's sockets go (its ringing one first); ours still refuse strangers, and a
        // ring that finds the peer gone reports it.
        let Side { ring: rb, wait: wb, .. } = b;
        drop(rb);
        drop(wb);
        assert_eq!(send_to(&third, &a.tag.wait_name()).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(ring_until_refused(&a), Some(libc::ECONNREFUSED));
        assert_eq!(send_to(&third, &a.tag.wait_name()).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(send_to(&third, &a.tag.ring_name()).unwrap_err().raw_os_error(), Some(libc::EPIPE));
        assert_eq!(doorbell_drain(a.wait(), false, 8).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    }

    /// A waiting socket that something reached between its bind and its connect is refused
    /// (and closed off the caller's thread); a missing or busy peer ringing socket, and a name
    /// taken, are errors of their own.
    #[test]
    fn a_waiting_socket_reached_before_it_was_connected_is_refused() {
        // A waiting name of its own for each case: a socket that failed may close on a closer,
        // a moment later, and its name with it.
        let (_ra, ta) = bell_ring().unwrap();
        let (_rb, tb0) = bell_ring().unwrap();
        let fresh = |n: u8| {
            let mut t = tb0;
            t.0[16..].fill(n);
            t
        };
        let tb = fresh(1);
        let w = bell_wait_bind(&tb).unwrap();
        send_to(&stranger(), &tb.wait_name()).unwrap();
        let e = bell_wait_connect(w, &ta).map(drop).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // A ring of the peer's that came before the connect (its ringing socket found our name
        // first) is taken like any ring; a stranger's behind it still fails the setup.
        let (ra, ta) = bell_ring().unwrap();
        let tb = fresh(2);
        let w = bell_wait_bind(&tb).unwrap();
        bell_ring_connect(ra.as_fd(), &tb).unwrap();
        doorbell_ring(ra.as_fd()).unwrap();
        doorbell_ring(ra.as_fd()).unwrap();
        let w = bell_wait_connect(w, &ta).unwrap();
        assert_eq!(doorbell_drain(w.as_fd(), false, 8).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        drop((w, ra));
        let (ra, ta) = bell_ring().unwrap();
        let tb = fresh(3);
        let w = bell_wait_bind(&tb).unwrap();
        bell_ring_connect(ra.as_fd(), &tb).unwrap();
        doorbell_ring(ra.as_fd()).unwrap();
        send_to(&stranger(), &tb.wait_name()).unwrap();
        assert_eq!(bell_wait_connect(w, &ta).map(drop).unwrap_err().kind(), io::ErrorKind::InvalidData);
        drop(ra);
        let (_ra, ta) = bell_ring().unwrap();
        // Without the stranger it works, and a name in use cannot be bound again.
        let tb = fresh(4);
        let w = bell_wait(&tb, &ta).unwrap();
        assert_eq!(bell_wait(&tb, &ta).map(drop).unwrap_err().raw_os_error(), Some(libc::EADDRINUSE));
        drop(w);
        let mut nobody = tb;
        nobody.0[..16].fill(0x77);
        assert_eq!(bell_wait(&ta, &nobody).map(drop).unwrap_err().raw_os_error(), Some(libc::ECONNREFUSED));
        // A ringing socket already connected to another waiting socket refuses a second.
        let (a, _b) = bells();
        let mut other = a.tag;
        other.0[16..].fill(0x42);
        assert_eq!(bell_wait(&other, &a.tag).map(drop).unwrap_err().raw_os_error(), Some(libc::EPERM));
    }

    /// A peer that sends descriptors with its rings is refused by the kernel where it can
    /// (SO_PASSRIGHTS, which our doorbells turn off); where it cannot, or on a socket that does
    /// not refuse, the drain refuses the ring and leaves it queued (the doorbell is broken, and
    /// its link ends): none of them comes into the drainer, and the socket's close on a closer
    /// takes them with it.
    #[test]
    fn descriptors_sent_with_a_ring_never_reach_the_drainer() {
        let (a, b) = bells();
        let (x, y) = std::os::unix::net::UnixStream::pair().unwrap();
        let sent = send_with_fds(b.ring.as_fd(), b"r", &[x.as_fd()]);
        drop(x);
        if refuses_descriptors(a.wait()) {
            assert_eq!(sent.unwrap_err().raw_os_error(), Some(libc::EPERM));
        } else {
            sent.unwrap();
            assert_eq!(doorbell_drain(a.wait(), false, 8).unwrap_err().kind(), io::ErrorKind::InvalidData);
        }
        drop(a);
        // A socket that does not refuse: the drain refuses the ring.
        let (c, d) = unix_pair(libc::SOCK_DGRAM).unwrap();
        let (x2, y2) = std::os::unix::net::UnixStream::pair().unwrap();
        send_with_fds(c.as_fd(), b"r", &[x2.as_fd()]).unwrap();
        drop(x2);
        assert_eq!(doorbell_drain(d.as_fd(), false, 8).unwrap_err().kind(), io::ErrorKind::InvalidData);
        drop(PeerFd::new(d));
        // Either way the streams' other ends are closed now (their only holders were the
        // messages, closed with the sockets they were queued in).
        for y in [y, y2] {
            y.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
            assert_eq!(std::io::Read::read(&mut &y, &mut [0u8; 1]).unwrap(), 0);
        }
    }

    /// Whatever a peer does with its waiting socket, our rings go nowhere else: connected to
    /// another socket, it refuses them; closed, it ends them.
    #[test]
    fn a_peer_cannot_send_our_rings_anywhere_else() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("smc-tokio-test-third-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let third = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
        third.set_nonblocking(true).unwrap();
        let (a, b) = bells();
        let wb = std::os::unix::net::UnixDatagram::from(b.wait().try_clone_to_owned().unwrap());
        wb.connect_addr(&addr).unwrap();
        let first = doorbell_ring(a.ring.as_fd()).unwrap_err().raw_os_error();
        assert!(matches!(first, Some(libc::ECONNRESET | libc::EPERM)), "{first:?}");
        assert_eq!(doorbell_ring(a.ring.as_fd()).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(
            third.recv(&mut [0u8; 8]).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "a ring reached a third socket"
        );
        let (a, b) = bells();
        drop(b);
        assert_eq!(ring_until_refused(&a), Some(libc::ECONNREFUSED));
    }

    /// Rings until a ring fails (the peer's sockets may close on a closer, a moment later).
    fn ring_until_refused(a: &Side) -> Option<i32> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match doorbell_ring(a.ring.as_fd()) {
                Err(e) => return e.raw_os_error(),
                Ok(()) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Ok(()) => return None,
            }
        }
    }

    /// A peer that reads its own waiting socket into a page that faults for as long as it
    /// wants (here a userfaultfd page nobody serves; a FUSE mapping does the same for any user)
    /// holds that socket's read lock throughout. That stalls every other reader of the socket,
    /// even a non-blocking one (checked here, so that the test shows a real stall), which is
    /// why we never wait on a socket a peer made; our ring to the stuck peer and our drain of
    /// our own waiting socket go through.
    #[test]
    fn a_peer_stuck_reading_its_bell_stalls_neither_our_ring_nor_our_drain() {
        let Some(page) = StalledPage::new() else {
            eprintln!("SKIPPED: no userfaultfd for kernel faults here (needs CAP_SYS_PTRACE)");
            return;
        };
        let (a, b) = bells();
        doorbell_ring(a.ring.as_fd()).unwrap();
        doorbell_ring(a.ring.as_fd()).unwrap();
        doorbell_ring(b.ring.as_fd()).unwrap();
        let wb = std::sync::Arc::new(b.wait.unwrap());
        // The peer reads a ring of ours into the page: inside the copy, holding the lock.
        let (peer_w, at) = (wb.clone(), page.addr);
        let stuck = std::thread::spawn(move || {
            // SAFETY: reads at most 8 bytes into the mapped (registered) page at `at`.
            unsafe { libc::recv(peer_w.as_raw_fd(), at as *mut libc::c_void, 8, 0) }
        });
        // The peer's read is inside the copy once its fault on the page is reported.
        let faulted = page.wait_for_fault(std::time::Duration::from_secs(10));
        // The control: another reader of the peer's socket waits for the lock.
        let (tx, rx) = std::sync::mpsc::channel();
        let other_w = wb.clone();
        let control = std::thread::spawn(move || {
            let r = doorbell_drain(other_w.as_fd(), false, 1).map_err(|e| e.kind());
            let _ = tx.send(());
            r
        });
        let stalled = faulted && rx.recv_timeout(std::time::Duration::from_millis(300)).is_err();
        // What we do meanwhile.
        let (tx2, rx2) = std::sync::mpsc::channel();
        let Side { ring: ra, wait: wa, .. } = a;
        let ours = std::thread::spawn(move || {
            let rang = doorbell_ring(ra.as_fd()).is_ok();
            let drained = doorbell_drain(wa.as_ref().unwrap().as_fd(), false, 8).ok();
            let _ = tx2.send((rang, drained));
        });
        let ours_done = rx2.recv_timeout(std::time::Duration::from_secs(10));
        // Let the stalled copy go, and every thread out.
        drop(page);
        let _ = stuck.join();
        let _ = control.join();
        let _ = ours.join();
        assert!(stalled, "the page did not stall the peer's read: the test shows nothing");
        assert_eq!(ours_done.expect("our ring or drain waited for the peer"), (true, Some(1)));
    }

    /// An anonymous page registered with a userfaultfd that nobody serves: a kernel copy into
    /// it waits until the userfaultfd is closed (when the value is dropped).
    struct StalledPage {
        addr: usize,
        uffd: OwnedFd,
    }

    impl StalledPage {
        fn new() -> Option<StalledPage> {
            // `include/uapi/linux/userfaultfd.h`: UFFD_API; UFFDIO_API and UFFDIO_REGISTER are
            // _IOWR(0xAA, 0x3F, 24 bytes) and _IOWR(0xAA, 0x00, 32 bytes); MODE_MISSING.
            const UFFD_API: u64 = 0xAA;
            const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
            const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
            const MODE_MISSING: u64 = 1;
            // SAFETY: plain syscall; a non-negative result is a new descriptor we own.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
            if fd < 0 {
                return None;
            }
            // SAFETY: a new descriptor nothing else owns.
            let uffd = unsafe { OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) };
            let mut api = [UFFD_API, 0, 0];
            // SAFETY: UFFDIO_API takes a 24-byte struct, which `api` is.
            if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, api.as_mut_ptr()) } != 0 {
                return None;
            }
            // SAFETY: a fresh private anonymous mapping of one page. It is never unmapped: a
            // thread may still be inside a copy into it when the value is dropped.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            let mut reg = [p as u64, 4096, MODE_MISSING, 0];
            // SAFETY: UFFDIO_REGISTER takes a 32-byte struct (range, mode, ioctls out).
            if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_REGISTER, reg.as_mut_ptr()) } != 0 {
                return None;
            }
            Some(StalledPage { addr: p as usize, uffd })
        }

        /// Waits up to `limit` for a fault on the page to be reported (a message pending on
        /// the userfaultfd, which makes it readable); whether one was.
        fn wait_for_fault(&self, limit: std::time::Duration) -> bool {
            let deadline = std::time::Instant::now() + limit;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
                let mut pfd = libc::pollfd { fd: self.uffd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, for a descriptor this value owns.
                let n = unsafe { libc::poll(&mut pfd, 1, ms) };
                if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return n > 0 && pfd.revents & libc::POLLIN != 0;
            }
        }
    }

    /// A message with as many descriptors as one can carry, on a socket that also asks for
    /// the sender's credentials and pidfd (options a peer holding the socket can turn on):
    /// every descriptor comes out to us, none is cut off and closed by the kernel on the
    /// receiving thread.
    #[test]
    fn a_full_message_of_descriptors_fits_beside_credentials_and_a_pidfd() {
        raise_fd_limit();
        let (a, b) = unix_pair(libc::SOCK_DGRAM).unwrap();
        setsockopt(b.as_fd(), libc::SOL_SOCKET, libc::SO_PASSCRED, &1 as &libc::c_int).unwrap();
        let _ = setsockopt(b.as_fd(), libc::SOL_SOCKET, SO_PASSPIDFD, &1 as &libc::c_int);
        let files: Vec<std::fs::File> = (0..253).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        send_with_any_fds(a.as_fd(), b"r", &borrowed).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds, flags) = recvmsg_fds(b.as_fd(), &mut buf, libc::MSG_DONTWAIT).unwrap();
        assert_eq!((n, fds.len()), (1, 253));
        assert_eq!(flags & libc::MSG_CTRUNC, 0, "the control message was cut");
    }

    /// A message that came with descriptors is refused and left queued, as it was (a read
    /// that takes descriptors gets it whole afterwards); one without is read, and a message
    /// longer than the buffer says so.
    #[test]
    fn a_read_that_takes_no_descriptor_refuses_a_message_with_some() {
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let (x, _y) = std::os::unix::net::UnixStream::pair().unwrap();
        send_with_fds(a.as_fd(), b"with", &[x.as_fd(), x.as_fd()]).unwrap();
        send_with_fds(a.as_fd(), b"without", &[]).unwrap();
        let mut buf = [0u8; 16];
        let e = recv_without_fds(b.as_fd(), &mut buf, 0, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let (n, fds) = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"with"[..], 2), "the message was not left as it was");
        let (n, flags) = recv_without_fds(b.as_fd(), &mut buf, 0, false).unwrap();
        assert_eq!((&buf[..n], flags & libc::MSG_TRUNC), (&b"without"[..], 0));
        send_with_fds(a.as_fd(), b"longer than four", &[]).unwrap();
        let (n, flags) = recv_without_fds(b.as_fd(), &mut buf[..4], 0, true).unwrap();
        assert_eq!((&buf[..n], flags & libc::MSG_TRUNC != 0), (&b"long"[..], true));
        assert_eq!(recv_without_fds(b.as_fd(), &mut buf, 0, false).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    }

    /// A connection accepted from a listener that refuses descriptors refuses them from the
    /// moment its client connects, before it is accepted (what closing door connections in
    /// place rests on); a listener that takes them (a side channel's) gives connections that
    /// take them.
    #[test]
    fn connections_refuse_descriptors_from_birth_when_their_listener_does() {
        let name = format!("smc-tokio-test/refusal/{}", std::process::id());
        let refusing = seqpacket_listen(name.as_bytes(), false).unwrap();
        let (x, _y) = std::os::unix::net::UnixStream::pair().unwrap();
        if refuses_descriptors(refusing.as_fd()) {
            let c = seqpacket_connect(name.as_bytes()).unwrap();
            assert_eq!(send_with_fds(c.as_fd(), b"x", &[x.as_fd()]).unwrap_err().raw_os_error(), Some(libc::EPERM));
            let accepted = seqpacket_accept(refusing.as_fd()).unwrap();
            assert!(refuses_descriptors(accepted.as_fd()));
            assert!(refusal_inherited());
        } else {
            // Before Linux 6.16: nothing refuses, and door connections go to the closers.
            eprintln!("this kernel has no SO_PASSRIGHTS");
        }
        let side = format!("smc-tokio-test/rights/{}", std::process::id());
        let taking = seqpacket_listen(side.as_bytes(), true).unwrap();
        let c = seqpacket_connect(side.as_bytes()).unwrap();
        send_with_fds(c.as_fd(), b"x", &[x.as_fd()]).unwrap();
        assert!(!refuses_descriptors(seqpacket_accept(taking.as_fd()).unwrap().as_fd()));
    }
}

// ---------------------------------------------------------------------------------------------
// Shared memory, doorbells and the side channel (SMC-D).

use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::NonNull;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)` sized to `len` bytes.
pub(crate) fn memfd(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string; the flags are constants.
    let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) })?;
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd too large"))?;
    // SAFETY: plain syscall on a descriptor we own.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    Ok(fd)
}

/// The seals every shared region carries before it is sent: it can neither shrink (a shrink
/// would turn the peer's next access into SIGBUS) nor grow, and the seals themselves are
/// sealed. Not `F_SEAL_FUTURE_WRITE`: that seal also refuses hole punching (`MADV_REMOVE`,
/// `fallocate`), which is how a ring that grew gives its pages back. The peer's read-only
/// access comes from the descriptor it is given instead ([`read_only_view`]).
pub(crate) const REGION_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Adds `seals` to a memfd.
pub(crate) fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: plain fcntl on a borrowed, open descriptor.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(drop)
}

/// The seals of a memfd.
pub(crate) fn get_seals(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: plain fcntl on a borrowed, open descriptor.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// `fstat(2)`.
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: `st` is written by fstat before it is read; zeroed is a valid bit pattern.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable stat buffer; `fd` is borrowed open.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// The size of a file.
pub(crate) fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(fstat(fd)?.st_size as u64)
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access through it goes through raw pointers or
// atomics whose users uphold their own synchronisation.
unsafe impl Send for Mmap {}
// SAFETY: as above.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Maps `len` bytes of `fd` shared, writable or read-only.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Mmap> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) of a descriptor we hold.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Mmap { ptr, len })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`; nothing refers to it any more
        // (the owner of the Mmap outlives every user of its pointer).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A doorbell is two Unix datagram sockets per side of a link, made by that side and never
/// handed to anyone, bound to the abstract names of a random [`BellTag`]:
///
/// - the *ringing* socket ([`bell_ring`]), shut down for reading before it is bound, so nobody
///   can queue anything in it, ever (a sender gets `EPIPE`); it is connected to the peer's
///   waiting socket by name ([`bell_ring_connect`]) and rings it by sending one byte;
/// - the *waiting* socket ([`bell_wait`]), bound only once the peer's tag is known, under a
///   name with 8 bytes nobody else has seen, and connected at once to the peer's ringing
///   socket: from then on the kernel refuses every other sender (`EPERM`). It never sends, so
///   the kernel never disconnects it (a datagram socket that sends to a socket that has gone
///   is disconnected, its queue purged in the sending thread, and then takes anyone's
///   datagrams again; that is also why one socket does not do both). A datagram from anyone
///   but the peer's ringing socket that got in between its bind and its connect (a stranger
///   who read the name from `/proc/net/unix` and sent to it) fails the setup: the link is not
///   made and the connection stays TCP.
///
/// Why no descriptor of a doorbell crosses: whoever makes a socket pair and hands one end over
/// shares that socket with the receiver. An end we rang on, the peer could connect elsewhere (a
/// datagram socket may be connected again at any time) and have us send there, under our pid
/// and uid. An end we waited on, the peer could read as well: a reader of a Unix datagram
/// socket holds the socket's read lock while it copies a datagram out, and a copy into a page
/// that faults for as long as the reader wants (a FUSE mapping, userfaultfd) kept our
/// non-blocking drain waiting for that lock, on a runtime worker. Our sockets have no other
/// reader and no other sender on them; what the peer does to its own (reads them into a
/// stalled page, connects them elsewhere, closes them) touches only its sockets' locks and its
/// own wake-ups.
///
/// Why not an eventfd (or a pipe): a descriptor passed with `SCM_RIGHTS` shares its open file
/// description, and so its `O_NONBLOCK` flag, with the sender. A hostile peer could clear the
/// flag on an eventfd we read (and drain it first) or one we write (and fill it first), and our
/// read or write would block a runtime worker. Sockets take `MSG_DONTWAIT` per call, so no
/// flag the peer can change makes our calls block.
///
/// This makes the ringing socket and the tag it is bound under. Both sockets refuse
/// descriptors where the kernel can (rings are bytes).
pub(crate) fn bell_ring() -> io::Result<(OwnedFd, BellTag)> {
    let fd = dgram()?;
    shutdown(std::os::fd::AsFd::as_fd(&fd), std::net::Shutdown::Read)?;
    // 128 random bits: a name is taken only by somebody who read it from /proc/net/unix after
    // we bound it, and then it is ours. A few tries for the impossible case.
    let mut last = None;
    for _ in 0..4 {
        let mut tag = [0u8; 24];
        random_bytes(&mut tag)?;
        let tag = BellTag(tag);
        if tag.is_none() {
            continue;
        }
        match bind_abstract(std::os::fd::AsFd::as_fd(&fd), &tag.ring_name()) {
            Ok(()) => return Ok((fd, tag)),
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no doorbell name")))
}

/// Connects our ringing socket to the peer's waiting socket, by name. Fails with
/// `ECONNREFUSED` when no socket has that name, and `EPERM` when the socket there is connected
/// to another one (it would refuse our rings).
pub(crate) fn bell_ring_connect(fd: BorrowedFd<'_>, peer: &BellTag) -> io::Result<()> {
    connect_abstract(fd, &peer.wait_name())
}

/// Our waiting socket (see [`bell_ring`]): bound to `ours`' waiting name, connected to the
/// peer's ringing socket, and checked. Fails with `ECONNREFUSED` when the peer's ringing socket
/// is not there, `EPERM` when it is connected to another socket, `EADDRINUSE` when our name is
/// taken, and `InvalidData` when a datagram from anybody else got in before the connect. A
/// [`PeerFd`]:
/// before Linux 6.16 (no `SO_PASSRIGHTS`) such a datagram may carry descriptors, and the
/// socket's close then goes to a closer, never to the caller.
pub(crate) fn bell_wait(ours: &BellTag, peer: &BellTag) -> io::Result<PeerFd> {
    let fd = bell_wait_bind(ours)?;
    bell_wait_connect(fd, peer)
}

/// The first half of [`bell_wait`]: the socket, bound.
pub(crate) fn bell_wait_bind(ours: &BellTag) -> io::Result<PeerFd> {
    let fd = dgram()?;
    let refuses = refuses_descriptors(std::os::fd::AsFd::as_fd(&fd));
    bind_abstract(std::os::fd::AsFd::as_fd(&fd), &ours.wait_name())?;
    // Refusing from birth, it can hold only bytes: its close cannot block.
    Ok(if refuses { PeerFd::new(fd).inert() } else { PeerFd::new(fd) })
}

/// The second half of [`bell_wait`]: connected to the peer's ringing socket, and checked.
pub(crate) fn bell_wait_connect(fd: PeerFd, peer: &BellTag) -> io::Result<PeerFd> {
    connect_abstract(std::os::fd::AsFd::as_fd(&fd), &peer.ring_name())?;
    // Nobody but the peer can send to it now. Whatever is queued came before. The peer rings
    // us only once we armed our side of the link, which comes after this; still, a ring of
    // its ringing socket (the only socket with its name) is taken like any ring, whenever it
    // came. Anybody else's datagram, perhaps with descriptors, fails the setup. Each datagram
    // is looked at first without taking it (a peek takes no descriptor into our table) to see
    // its sender's name.
    let want = abstract_addr(&peer.ring_name())?;
    // At most as many as can have been queued (the kernel's queue length,
    // `net.unix.max_dgram_qlen`, bounds a sender that the socket is not connected to); more is
    // a sender that went on.
    for _ in 0..64 {
        match peek_sender(std::os::fd::AsFd::as_fd(&fd)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(fd),
            Err(e) => return Err(e),
            Ok(from) if same_addr(&from, &want) => {
                doorbell_drain(std::os::fd::AsFd::as_fd(&fd), fd.is_inert(), 1)?;
            }
            Ok(_) => break,
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "a datagram reached the doorbell before it was connected"))
}

/// Whether two Unix addresses as the kernel reports them are the same name.
fn same_addr(a: &(libc::sockaddr_un, libc::socklen_t), b: &(libc::sockaddr_un, libc::socklen_t)) -> bool {
    let path = |(addr, len): &(libc::sockaddr_un, libc::socklen_t)| {
        let n = (*len as usize).saturating_sub(std::mem::size_of::<libc::sa_family_t>()).min(addr.sun_path.len());
        addr.sun_path[..n].to_vec()
    };
    a.1 == b.1 && a.0.sun_family == b.0.sun_family && path(a) == path(b)
}

/// The sender's address of the next datagram on `fd`, without taking it (`WouldBlock` when
/// there is none).
fn peek_sender(fd: BorrowedFd<'_>) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let mut one = [0u8; 1];
    let mut iov = libc::iovec { iov_base: one.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: both are plain data; all-zero is valid.
    let (mut addr, mut msg): (libc::sockaddr_un, libc::msghdr) = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: `msg` points at `addr` and `one`, both alive and as large as it says; no
    // control buffer, so no descriptor is installed (a peek with none only reports them cut).
    cvt(unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_PEEK | libc::MSG_DONTWAIT) } as libc::c_int)?;
    // Compare exactly what the kernel wrote; the rest of the zeroed buffer stays zero.
    Ok((addr, msg.msg_namelen))
}

/// A non-blocking Unix datagram socket that refuses descriptors where the kernel can.
fn dgram() -> io::Result<OwnedFd> {
    let fd = unix_socket(libc::SOCK_DGRAM)?;
    refuse_descriptors(std::os::fd::AsFd::as_fd(&fd));
    Ok(fd)
}

/// A fresh non-blocking Unix socket of type `ty` (`SOCK_DGRAM`, `SOCK_SEQPACKET`).
fn unix_socket(ty: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant arguments.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds `fd` to the abstract name `name`.
fn bind_abstract(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) }).map(drop)
}

/// Connects `fd` to the abstract name `name` (again after an interruption).
fn connect_abstract(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (addr, len) = abstract_addr(name)?;
    loop {
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        match cvt(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) }) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A set of descriptors of our own to ask which are readable (an epoll instance, level
/// triggered, polled without waiting): for the door, whose look-ups read only the connections
/// with something queued instead of asking each.
#[derive(Debug)]
pub(crate) struct ReadySet(OwnedFd);

impl ReadySet {
    /// Readable descriptors one look reports at most: the door's batch of connections taken per
    /// drain (`door::DRAIN_BATCH`), so that a look-up's drains, as many as the door holds
    /// connections over its batch, can read every one of its connections.
    pub(crate) const READY_MAX: usize = 256;

    pub(crate) fn new() -> io::Result<ReadySet> {
        // SAFETY: plain syscall with a constant flag.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: a new descriptor nothing else owns.
        Ok(ReadySet(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds `fd`, reported by its number while readable.
    pub(crate) fn add(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd.as_raw_fd() as u64 };
        // SAFETY: both descriptors are open; `ev` is a valid epoll_event.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) }).map(drop)
    }

    /// Takes `fd` out (before it closes: its close is a closer's, later).
    pub(crate) fn remove(&self, fd: BorrowedFd<'_>) {
        // SAFETY: both descriptors are open; DEL takes no event.
        unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_DEL, fd.as_raw_fd(), std::ptr::null_mut()) };
    }

    /// The numbers of up to [`READY_MAX`](Self::READY_MAX) readable descriptors (in `out`),
    /// without waiting; whether there may be more (that many were). The kernel reports
    /// level-triggered ones in turn, so the next call gives those left out first.
    pub(crate) fn ready(&self, out: &mut Vec<std::os::fd::RawFd>) -> io::Result<bool> {
        out.clear();
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; Self::READY_MAX];
        let n = loop {
            // SAFETY: `evs` has room for `evs.len()` events; timeout 0 never waits.
            let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), evs.len() as libc::c_int, 0) };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        out.extend(evs[..n].iter().map(|e| e.u64 as std::os::fd::RawFd));
        Ok(n == evs.len())
    }
}

/// A connected pair of non-blocking Unix sockets of type `ty` (`SOCK_DGRAM`, `SOCK_SEQPACKET`),
/// for tests that play both ends.
#[cfg(test)]
pub(crate) fn unix_pair(ty: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    cvt(unsafe {
        libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
    })?;
    // SAFETY: two new descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// shutdown(2) of `fd` in direction `how`. On a Unix socket, after `Both` nothing more can be
/// queued in it (a sender gets EPIPE) while what is queued stays readable, and its peer reads
/// the end after it; on a listening socket, the port stops taking connections.
pub(crate) fn shutdown(fd: BorrowedFd<'_>, how: std::net::Shutdown) -> io::Result<()> {
    let how = match how {
        std::net::Shutdown::Read => libc::SHUT_RD,
        std::net::Shutdown::Write => libc::SHUT_WR,
        std::net::Shutdown::Both => libc::SHUT_RDWR,
    };
    // SAFETY: plain syscall on a borrowed, open descriptor.
    cvt(unsafe { libc::shutdown(fd.as_raw_fd(), how) }).map(drop)
}

/// `SCM_PIDFD` (Linux 6.5, `include/linux/socket.h`): a control message carrying the sender's
/// pidfd, on a socket with `SO_PASSPIDFD`; not in the libc crate yet.
const SCM_PIDFD: libc::c_int = 4;

/// `SO_PASSPIDFD` (Linux 6.5, `include/uapi/asm-generic/socket.h`).
#[cfg(test)]
const SO_PASSPIDFD: libc::c_int = 76;

/// `SO_PASSRIGHTS` (Linux 6.16, `include/uapi/asm-generic/socket.h`); not in the libc crate yet.
const SO_PASSRIGHTS: libc::c_int = 83;

/// Makes the Unix socket `fd` refuse descriptors (`SO_PASSRIGHTS` off: a sender's `SCM_RIGHTS`
/// fails with EPERM), where the kernel has the option (6.16 and later); returns whether it
/// did. Where it does not, descriptors a peer queues are still taken out and defused by the
/// closers; this only means they cannot be queued at all.
pub(crate) fn refuse_descriptors(fd: BorrowedFd<'_>) -> bool {
    setsockopt(fd, libc::SOL_SOCKET, SO_PASSRIGHTS, &0 as &libc::c_int).is_ok()
}

/// Makes the Unix socket `fd` take descriptors again (`SO_PASSRIGHTS` on), for a connection
/// that refused them until it knew its peer; returns whether it did.
pub(crate) fn allow_descriptors(fd: BorrowedFd<'_>) -> bool {
    setsockopt(fd, libc::SOL_SOCKET, SO_PASSRIGHTS, &1 as &libc::c_int).is_ok()
}

/// Whether the Unix socket `fd` refuses descriptors (`SO_PASSRIGHTS` off). Always false where
/// the kernel has no such option (before 6.16).
pub(crate) fn refuses_descriptors(fd: BorrowedFd<'_>) -> bool {
    getsockopt(fd, libc::SOL_SOCKET, SO_PASSRIGHTS, 1 as libc::c_int).is_ok_and(|v| v == 0)
}

/// Whether a connection accepted from a listener that refuses descriptors refuses them too,
/// from the moment its client connects (Linux copies `SO_PASSRIGHTS` from the listener to the
/// new socket when the client connects): found out once per process with a listener, a
/// connection and an accept of our own. False where the kernel has no such option, where it
/// does not copy it (a kernel that took the option without the copy), or where the probe fails
/// (out of descriptors, say: then it is tried again at the next call, as only a definite answer
/// is kept).
pub(crate) fn refusal_inherited() -> bool {
    static INHERITED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if let Some(known) = INHERITED.get() {
        return *known;
    }
    let name = format!("smc-tokio/refusal-probe/{}/{:016x}", std::process::id(), random_u64());
    let probe = || -> io::Result<bool> {
        let listener = seqpacket_listen(name.as_bytes(), false)?;
        if !refuses_descriptors(std::os::fd::AsFd::as_fd(&listener)) {
            return Ok(false);
        }
        let _client = seqpacket_connect(name.as_bytes())?;
        // Ours on both ends, nothing queued: closed here.
        let accepted = seqpacket_accept(std::os::fd::AsFd::as_fd(&listener))?.inert();
        Ok(refuses_descriptors(std::os::fd::AsFd::as_fd(&accepted)))
    };
    match probe() {
        Ok(known) => *INHERITED.get_or_init(|| known),
        Err(_) => false,
    }
}

/// Rings a doorbell: sends a one-byte datagram, never blocking. A full queue (EAGAIN, ENOBUFS)
/// already means "ring", so it is not an error.
pub(crate) fn doorbell_ring(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one = [1u8];
    loop {
        // SAFETY: sends one byte from a valid buffer on a borrowed descriptor.
        let n = unsafe { libc::send(fd.as_raw_fd(), one.as_ptr().cast(), 1, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::ENOBUFS) => return Ok(()),
            _ => return Err(e),
        }
    }
}

/// Drains up to `max` rings from a doorbell without blocking; returns how many it took
/// (`WouldBlock` when there were none). Bounded, so a peer that rings in a loop cannot keep
/// the caller here.
pub(crate) fn doorbell_drain(fd: BorrowedFd<'_>, refused: bool, max: usize) -> io::Result<usize> {
    let mut buf = [0u8; 8];
    let mut n = 0;
    while n < max {
        // A ring with descriptors (where the kernel could not refuse them, before Linux 6.16,
        // see `refuse_descriptors`) is refused and left queued, never taken into this process:
        // the peer broke the doorbell, and its link ends (the socket's close, on a closer,
        // takes the datagram with it). A datagram longer than the buffer is still one ring.
        match recv_without_fds(fd, &mut buf, 0, refused) {
            Ok(_) => n += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && n > 0 => return Ok(n),
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Credentials of a Unix socket's peer (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerCred {
    pub(crate) pid: i32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

pub(crate) fn peer_cred(fd: BorrowedFd<'_>) -> io::Result<PeerCred> {
    let c = getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, libc::ucred { pid: 0, uid: 0, gid: 0 })?;
    Ok(PeerCred { pid: c.pid, uid: c.uid, gid: c.gid })
}

impl PeerCred {
    /// Whether a peer with these credentials is trusted as a same-host peer: its uid is our
    /// effective uid or one of `allowed`, and both its uid and gid are real in our user
    /// namespace. The kernel reports a uid or gid that our namespace does not map as the
    /// overflow id (`/proc/sys/kernel/overflowuid`, 65534 by default), whoever it really is:
    /// in a user namespace that maps only ourselves to 65534, every stranger on the host would
    /// look like us. So the overflow ids are never trusted, not even when they are our own (a
    /// process running as the overflow uid gets no SMC-D, only TCP).
    ///
    /// Our euid is read each time: a process that drops privileges trusts its new uid, not its
    /// old one.
    pub(crate) fn trusted(&self, allowed: &[u32]) -> bool {
        // SAFETY: geteuid cannot fail and has no preconditions.
        self.trusted_by(unsafe { libc::geteuid() }, allowed)
    }

    /// As [`trusted`](Self::trusted), by a process whose effective uid is `euid`.
    pub(crate) fn trusted_by(&self, euid: u32, allowed: &[u32]) -> bool {
        self.gid != overflow_ids().1 && uid_trusted_by(self.uid, euid, allowed)
    }
}

/// Raises this process's soft limit on open descriptors towards its hard limit (to at most
/// 65 536), once, for tests that open many at once beside the others in the same process (a
/// login shell often gives 1 024).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn raise_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: rlimit is plain data; all-zero is valid.
        let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: `r` is valid for writes.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return;
        }
        let want = r.rlim_max.min(65_536);
        if r.rlim_cur < want {
            r.rlim_cur = want;
            // SAFETY: `r` is a valid rlimit; raising the soft limit up to the hard one needs no
            // privilege.
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
        }
    });
}

/// [`PeerCred::trusted`] for a peer known by its uid alone (the owner of a socket, from the
/// kernel's socket lists): no gid to check, so a uid alone must pass the same rule.
pub(crate) fn uid_trusted(uid: u32, allowed: &[u32]) -> bool {
    // SAFETY: geteuid cannot fail and has no preconditions.
    uid_trusted_by(uid, unsafe { libc::geteuid() }, allowed)
}

/// The uid half of [`PeerCred::trusted_by`]: `uid` is `euid` or an allowed one, and not the
/// overflow id.
fn uid_trusted_by(uid: u32, euid: u32, allowed: &[u32]) -> bool {
    uid != overflow_ids().0 && (uid == euid || allowed.contains(&uid))
}

/// Whether the process with credentials `peer` could read and write this process's memory
/// anyway, by the kernel's process tracing (`PTRACE_ATTACH`, `/proc/<pid>/mem`): what lending
/// it bytes in place requires, since a `&[u8]` over its region is one it can change under the
/// application's feet. Conservative: `false` whenever a rule of the kernel's attach check
/// (`__ptrace_may_access`, the capability and Yama modules) may refuse it, or we cannot tell:
/// - Yama's `ptrace_scope` is absent or 0 (1 lets only ancestors attach, 2 and 3 nobody);
/// - we are dumpable (`PR_GET_DUMPABLE` 1; a process that is not refuses attaches without
///   `CAP_SYS_PTRACE`);
/// - our real, effective and saved uids are all the peer's uid, our gids all its gid, and the
///   peer's real uid and gid are those too (`/proc/<pid>/status`: attaching uses its real ids);
/// - the peer is in our pid and user namespaces (it sees our pid; the capability rule needs the
///   same user namespace), and its permitted capabilities include ours;
/// - no seccomp filter on the peer (one may forbid it to trace), and no `no_new_privs` (which
///   an unprivileged process needs to confine itself with seccomp or Landlock, and Landlock
///   keeps a confined process from tracing anything outside its domain).
///
/// What no file tells (an LSM's policy, an SELinux or AppArmor confinement of the peer, a
/// Landlock domain a privileged peer entered without `no_new_privs`) can refuse an attach this
/// calls possible. The pid is the one the kernel recorded for the peer's socket `sock`; where
/// the kernel gives that process's pidfd (`SO_PEERPIDFD`, Linux 6.5), the process is checked
/// to be alive after its `/proc` files are read, so they were its own and not a later
/// process's under a reused pid.
pub(crate) fn could_trace_us(peer: &PeerCred, sock: BorrowedFd<'_>) -> bool {
    let pidfd = match peer_pidfd(sock) {
        Ok(fd) => Some(fd),
        // A kernel without it (before 6.5): the pid alone.
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => None,
        // The process is gone (reaped: the pid may be another's by now), or we cannot tell.
        Err(_) => return false,
    };
    could_trace(peer) && pidfd.is_none_or(|fd| alive(fd.as_fd()))
}

/// `SO_PEERPIDFD` (Linux 6.5, `include/uapi/asm-generic/socket.h`, the value of every
/// architecture this crate builds for but parisc and sparc); not in the libc crate yet.
const SO_PEERPIDFD: libc::c_int = 77;

/// The pidfd of the process that connected `sock` (or listened, for the connecting side).
/// `ENOPROTOOPT` where the kernel has no such option.
fn peer_pidfd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let fd = getsockopt(sock, libc::SOL_SOCKET, SO_PEERPIDFD, -1 as libc::c_int)?;
    if fd < 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "no pidfd"));
    }
    // SAFETY: the kernel installed a new descriptor for us, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the process of `pidfd` has not exited (`pidfd_send_signal` with signal 0).
fn alive(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: signal 0 sends nothing; the info pointer may be null; `pidfd` is borrowed open.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0) == 0
    }
}

/// Whether the `/proc` mounted here numbers processes as our pid namespace does: its `self`
/// link (`self_link`) names our own pid (`pid`). The pid of a peer's credentials is one of our
/// namespace's; a process in a pid namespace of its own whose `/proc` was not mounted again
/// (`unshare -p` without `--mount-proc`) sees the parent namespace's processes there, and a
/// peer's pid would name another process.
fn proc_is_ours(self_link: Option<&std::path::Path>, pid: u32) -> bool {
    self_link.and_then(|p| p.to_str()?.parse::<u32>().ok()) == Some(pid)
}

/// [`could_trace_us`] from `/proc` alone, without the pidfd's word on the process.
fn could_trace(peer: &PeerCred) -> bool {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(s) if s.trim() == "0" => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        _ => return false,
    }
    // SAFETY: prctl(PR_GET_DUMPABLE) reads a flag of this process; no pointer is passed.
    if unsafe { libc::prctl(libc::PR_GET_DUMPABLE) } != 1 {
        return false;
    }
    if peer.pid <= 0 || !proc_is_ours(std::fs::read_link("/proc/self").ok().as_deref(), std::process::id()) {
        return false;
    }
    let them = format!("/proc/{}", peer.pid);
    let same_ns = |ns: &str| match (
        std::fs::read_link(format!("/proc/self/ns/{ns}")),
        std::fs::read_link(format!("{them}/ns/{ns}")),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same_ns("pid") || !same_ns("user") {
        return false;
    }
    let (Some(ours), Some(theirs)) = (ProcStatus::read("/proc/self"), ProcStatus::read(&them)) else { return false };
    let all = |ids: [u32; 4], id: u32| ids[..3].iter().all(|&i| i == id);
    all(ours.uids, peer.uid)
        && all(ours.gids, peer.gid)
        && theirs.uids[0] == peer.uid
        && theirs.gids[0] == peer.gid
        && ours.cap_permitted & !theirs.cap_permitted == 0
        && theirs.seccomp == 0
        && theirs.no_new_privs == 0
}

/// What [`could_trace`] reads of a process's `/proc/<pid>/status`.
struct ProcStatus {
    /// Real, effective, saved and filesystem uids.
    uids: [u32; 4],
    /// The same gids.
    gids: [u32; 4],
    cap_permitted: u64,
    seccomp: u32,
    no_new_privs: u32,
}

impl ProcStatus {
    fn read(dir: &str) -> Option<ProcStatus> {
        let text = std::fs::read_to_string(format!("{dir}/status")).ok()?;
        let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim);
        let ids = |name: &str| -> Option<[u32; 4]> {
            let mut it = field(name)?.split_whitespace().map(|v| v.parse::<u32>().ok());
            Some([it.next()??, it.next()??, it.next()??, it.next()??])
        };
        Some(ProcStatus {
            uids: ids("Uid")?,
            gids: ids("Gid")?,
            cap_permitted: u64::from_str_radix(field("CapPrm")?, 16).ok()?,
            // Absent where the kernel has no seccomp: none.
            seccomp: field("Seccomp").map_or(Some(0), |v| v.parse().ok())?,
            no_new_privs: field("NoNewPrivs")?.parse().ok()?,
        })
    }
}

/// The ids the kernel reports for a uid and a gid our user namespace does not map
/// (`/proc/sys/kernel/overflowuid` and `overflowgid`; 65534 when they cannot be read, the
/// kernel's default).
pub(crate) fn overflow_ids() -> (u32, u32) {
    static IDS: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *IDS.get_or_init(|| {
        let read =
            |path: &str| std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<u32>().ok()).unwrap_or(65534);
        (read("/proc/sys/kernel/overflowuid"), read("/proc/sys/kernel/overflowgid"))
    })
}

/// A read-only descriptor of the memfd `fd`, for a peer to map: the file's mode becomes 0400
/// first, so that a peer of another uid cannot open it again for writing (through
/// `/proc/self/fd`), and a read-only file description cannot be mapped writable.
pub(crate) fn read_only_view(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall on a borrowed, open descriptor.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), 0o400) })?;
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "descriptor path"))?;
    // SAFETY: `path` is a valid NUL-terminated string; the flags are constants.
    let ro = cvt(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    // SAFETY: open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ro) })
}

fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.is_empty() || name.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad abstract socket name"));
    }
    // sun_path[0] stays 0: the abstract namespace.
    for (dst, src) in addr.sun_path[1..].iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((addr, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<OwnedFd> {
    unix_socket(libc::SOCK_SEQPACKET)
}

/// A non-blocking SOCK_SEQPACKET listener on the abstract name `name`, with a backlog of
/// 4096 (capped by `net.core.somaxconn`): a door takes one connection per registered TCP
/// connection, so it needs at least the TCP listener's backlog (1024), and a burst of 2000
/// concurrent connects filled 1024 on the 2-vCPU VM. Without `rights`, its connections refuse
/// descriptors from the moment a client connects, before they are accepted (the kernel gives
/// each the listener's `SO_PASSRIGHTS`; 6.16 and later): nobody can queue descriptors in one
/// for us to take out.
pub(crate) fn seqpacket_listen(name: &[u8], rights: bool) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    if !rights {
        refuse_descriptors(std::os::fd::AsFd::as_fd(&fd));
    }
    bind_abstract(std::os::fd::AsFd::as_fd(&fd), name)?;
    // SAFETY: plain syscall on our socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 4096) })?;
    Ok(fd)
}

/// Accepts one connection (non-blocking; `WouldBlock` when none is waiting). Anyone may have
/// connected and queued descriptors in it: it is a [`PeerFd`].
pub(crate) fn seqpacket_accept(fd: BorrowedFd<'_>) -> io::Result<PeerFd> {
    loop {
        // SAFETY: NULL address buffers are allowed; flags are constants.
        let r = unsafe {
            libc::accept4(
                fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        match cvt(r) {
            // SAFETY: accept4 returned a new descriptor nothing else owns.
            Ok(c) => return Ok(PeerFd::new(unsafe { OwnedFd::from_raw_fd(c) })),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Starts connecting a non-blocking SOCK_SEQPACKET socket to the abstract name `name`. Unix
/// sockets connect at once or fail (ECONNREFUSED when nobody listens there, which is what a
/// client in another network namespace sees).
pub(crate) fn seqpacket_connect(name: &[u8]) -> io::Result<OwnedFd> {
    seqpacket_connect_with(seqpacket()?, name).map_err(|(_, e)| e)
}

/// Test helper: `n` SOCK_SEQPACKET sockets connected to the abstract `name` by a forked child
/// running as `uid` (so that `SO_PEERCRED` names `uid`), the child gone by the time it returns.
/// A child, not a thread of ours: changing a thread's uid makes the whole process undumpable,
/// which changes what other tests see. Needs root.
#[cfg(test)]
pub(crate) fn seqpacket_connect_as(uid: u32, name: &[u8], n: usize) -> io::Result<Vec<OwnedFd>> {
    let socks = (0..n).map(|_| seqpacket()).collect::<io::Result<Vec<OwnedFd>>>()?;
    let raw: Vec<std::os::fd::RawFd> = socks.iter().map(|s| s.as_raw_fd()).collect();
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: fork in a multi-threaded process: the child only makes async-signal-safe system
    // calls (setresuid, connect, _exit) on memory prepared before the fork, then exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: see above; `addr` is a valid sockaddr_un of `len` bytes, the descriptors are
        // the child's copies of ours.
        unsafe {
            let uid = uid as libc::c_long;
            if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
                libc::_exit(1);
            }
            for fd in &raw {
                if libc::connect(*fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                    libc::_exit(2);
                }
            }
            libc::_exit(0);
        }
    }
    cvt(pid)?;
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is valid for writes.
    cvt(unsafe { libc::waitpid(pid, &mut status, 0) })?;
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => {}
        // No such uid to take here (no CAP_SETUID, or a user namespace that does not map it).
        (true, 1) => return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("cannot become uid {uid}"))),
        _ => return Err(io::Error::other(format!("the child connecting as uid {uid} failed: status {status}"))),
    }
    Ok(socks)
}

/// A fresh (unconnected) SOCK_SEQPACKET socket, for [`seqpacket_connect_with`], that refuses
/// descriptors where the kernel can ([`refuse_descriptors`]): a client probing door names
/// never receives one, so a squatter cannot queue any into it.
pub(crate) fn seqpacket_socket() -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    refuse_descriptors(std::os::fd::AsFd::as_fd(&fd));
    Ok(fd)
}

/// As [`seqpacket_connect`], with a socket the caller made: a failed connect hands it back, and
/// it can be tried on another name (a refused connect leaves a Unix socket unconnected), so
/// probing several names costs one socket.
pub(crate) fn seqpacket_connect_with(fd: OwnedFd, name: &[u8]) -> Result<OwnedFd, (OwnedFd, io::Error)> {
    match connect_abstract(std::os::fd::AsFd::as_fd(&fd), name) {
        Ok(()) => Ok(fd),
        // A full backlog: the listener is there but busy.
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Err((fd, io::Error::new(io::ErrorKind::WouldBlock, e))),
        Err(e) => Err((fd, e)),
    }
}

// ----- descriptors another process had a hand in -----------------------------------------

mod closer;
pub(crate) use closer::{closer_stats, congested as closers_congested, PeerFd, CONGESTED_RETRY};

/// `getsockopt(2)` of a plain-data option value (`c_int`, `linger`, `ucred`, ...): `init` is
/// the buffer the kernel fills (at most its size).
pub(crate) fn getsockopt<T: Copy>(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, init: T) -> io::Result<T> {
    let mut v = init;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<T>())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "socket option too large"))?;
    // SAFETY: `v` is valid for writes of `len` bytes for the call's duration (a plain `Copy`
    // value, any bit pattern the kernel writes into it is one of the option's values); `fd` is
    // borrowed open.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&mut v as *mut T).cast(), &mut len) })?;
    Ok(v)
}

/// `setsockopt(2)` with a plain-data option value (`c_int`, `linger`, ...), passed by pointer
/// with its size.
pub(crate) fn setsockopt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len = libc::socklen_t::try_from(std::mem::size_of::<T>())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "socket option too large"))?;
    // SAFETY: `value` is valid for reads of `len` bytes for the call's duration (a plain `Copy`
    // value, which the kernel only reads); `fd` is borrowed open.
    cvt(unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (value as *const T).cast(), len) }).map(drop)
}

/// Most descriptors one side-channel message carries.
pub(crate) const MAX_FDS: usize = 2;

/// Sends one datagram with `fds` attached (SCM_RIGHTS). Non-blocking.
pub(crate) fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors for one message"));
    }
    send_with_any_fds(sock, data, fds)
}

/// [`send_with_fds`] with as many descriptors as the kernel takes in one message (253), for
/// tests that play a peer sending more than ours do.
pub(crate) fn send_with_any_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // Room for the descriptors, aligned as cmsghdr requires: on the stack for the few a
    // side-channel message carries (and for none: every door message comes through here), on
    // the heap for more.
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE((fds.len() * std::mem::size_of::<libc::c_int>()) as u32) } as usize;
    let mut small = [0u64; 8];
    let mut large = Vec::new();
    let cbuf: &mut [u64] = if space <= std::mem::size_of_val(&small) {
        &mut small
    } else {
        large.resize(space.div_ceil(8), 0u64);
        &mut large
    };
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `cbuf`, which holds at least `space` bytes, so
        // CMSG_FIRSTHDR is non-null and in bounds, and CMSG_DATA has room for `fds.len()` ints.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((fds.len() * std::mem::size_of::<libc::c_int>()) as u32) as usize;
            let d = libc::CMSG_DATA(c).cast::<libc::c_int>();
            for (i, fd) in fds.iter().enumerate() {
                d.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `msg` describes valid buffers that live across the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return if n as usize == data.len() { Ok(()) } else { Err(io::Error::other("short side-channel send")) };
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one datagram and up to [`MAX_FDS`] descriptors. Returns the datagram's length (0 on
/// EOF) and the descriptors (as [`PeerFd`]s: those the caller does not keep are closed off the
/// runtime). A truncated datagram is an error (and the descriptors that did arrive are
/// closed); so is a message whose descriptors could not all be installed (no descriptor free),
/// which is left queued (see [`recvmsg_fds_looked`]).
pub(crate) fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<PeerFd>)> {
    let (n, fds, flags) = recvmsg_fds_looked(sock, buf, 0)?;
    if flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "truncated side-channel message"));
    }
    Ok((n, fds))
}

/// Receives one message on a socket whose peer has no descriptor to send us (a door
/// connection, a doorbell, a link's side channel once joined), without taking any into this
/// process: the message is looked at first with no room for control data, and one that came
/// with descriptors (or anything else the kernel would put there) is left queued and refused
/// (`InvalidData`): the caller ends the connection, and its close, on a closer, takes the
/// message with it (see `closer`). Taking them here, as a message of 253 at a time, let a
/// peer fill the process's descriptor table faster than closers stuck in closes could empty
/// it. A message that refuses no descriptors on its socket (`refused`: `SO_PASSRIGHTS` off
/// since the socket was made, [`refuse_descriptors`]) is read at once, without the look.
/// Returns the message's length (0 at the end of the stream) and the flags the kernel returned
/// (`MSG_TRUNC`: the message was longer than `buf`).
pub(crate) fn recv_without_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
    refused: bool,
) -> io::Result<(usize, libc::c_int)> {
    if !refused {
        // Looked at: with no control buffer, the kernel drops its copies of the message's
        // descriptors (never the last references: the queued message keeps its own) and says
        // so with MSG_CTRUNC.
        let (_, got) = recv_no_control(sock, buf, flags | libc::MSG_PEEK)?;
        if got & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message with descriptors where none belong (left queued)",
            ));
        }
    }
    recv_no_control(sock, buf, flags)
}

/// `recvmsg(2)` of one message with `flags` and `MSG_DONTWAIT`, with no room for control data
/// (descriptors the message carries are dropped by the kernel, `MSG_CTRUNC`): its length and
/// the message flags the kernel returned.
fn recv_no_control(sock: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, libc::c_int)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain data; all-zero is valid (no name, no control buffer).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    loop {
        // SAFETY: `msg` describes `buf`, valid for writes of its length across the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags | libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok((n as usize, msg.msg_flags));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// [`recvmsg_fds`] that never leaves the kernel a peer's descriptor to close on this thread.
/// The message is looked at first (`MSG_PEEK`, which installs copies of its descriptors while
/// the message keeps its own references), and taken only when every descriptor it carries was
/// installed: it is then taken with no room for control data, which drops the message's own
/// references while ours are open, never the last one. Where some could not be installed (no
/// descriptor free in the process: a peer that filled our table and then sent a socket whose
/// close waits, a `SO_LINGER` one, say), the kernel drops those copies, again not the last
/// references, and the message stays queued: `OutOfMemory`, and the caller ends the
/// connection, whose close, off the runtime by a closer, takes the message with it. (Taken
/// whole, the descriptors that found no room were closed by the kernel when `recvmsg`
/// returned, on this thread: their last close, if the peer had closed its copies.)
fn recvmsg_fds_looked(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<(usize, Vec<PeerFd>, libc::c_int)> {
    let (n, fds, got) = recvmsg_fds(sock, buf, flags | libc::MSG_PEEK)?;
    if got & libc::MSG_CTRUNC != 0 {
        // The control buffer holds the most descriptors one message can carry (SCM_MAX_FD), so
        // a cut there means the kernel could not install them here: no descriptor free.
        return Err(io::Error::new(
            io::ErrorKind::OutOfMemory,
            "descriptors passed with a message could not be taken: no descriptor free (EMFILE); the message is left queued",
        ));
    }
    // The message looked at, now taken: the same one, as every socket read here has one reader
    // (a door connection the listener's task or a client's reader task, a side channel its
    // link's task, a doorbell its group's driver).
    recv_no_control(sock, buf, flags)?;
    Ok((n, fds, got))
}

/// `recvmsg(2)` of one message with `flags`, with room for every descriptor it can carry:
/// its length, its descriptors (as [`PeerFd`]s) and the message flags the kernel returned.
fn recvmsg_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<(usize, Vec<PeerFd>, libc::c_int)> {
    recvmsg_some_fds(sock, buf, flags, None)
}

/// [`recvmsg_fds`] with room for at most `max_fds` descriptors when it is given (and for
/// nothing else): those of the message beyond them are closed by the kernel in this thread
/// (`MSG_CTRUNC`), so only a closer thread calls it so.
pub(super) fn recvmsg_some_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
    max_fds: Option<usize>,
) -> io::Result<(usize, Vec<PeerFd>, libc::c_int)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for every descriptor one message can carry (the kernel's SCM_MAX_FD, 253, in one
    // SCM_RIGHTS header: 16 + 253 * 4 bytes), and 4 KiB besides for what a socket's options
    // add ahead of them (credentials, a pidfd, a security label, a timestamp: a peer that
    // holds the socket too could turn those on): descriptors that
    // do not fit are closed by the kernel in this thread, which is what `PeerFd` keeps off the
    // runtime.
    // Left uninitialised (zeroing its 5 KiB was most of a door read's own time): only what the
    // kernel writes is read, headers it wrote within the `msg_controllen` it returns.
    let mut cbuf = std::mem::MaybeUninit::<[u64; 130 + 512]>::uninit();
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    if let Some(max) = max_fds {
        // One SCM_RIGHTS header with `max` descriptors, within the buffer: the length without
        // the padding `CMSG_SPACE` adds, as the kernel counts the room for descriptors from
        // it (`scm_max_fds`), so an odd `max` gets no extra one.
        let want = u32::try_from(max.min(253) * std::mem::size_of::<libc::c_int>()).unwrap_or(0);
        // SAFETY: CMSG_LEN only computes a length.
        let len = unsafe { libc::CMSG_LEN(want) } as usize;
        msg.msg_controllen = len.min(std::mem::size_of_val(&cbuf));
    }
    let n = loop {
        // SAFETY: `msg` describes valid, writable buffers that live across the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control up to msg_controllen; CMSG_FIRSTHDR/CMSG_NXTHDR walk
    // only within it; each SCM_RIGHTS payload holds (cmsg_len - CMSG_LEN(0)) / 4 descriptors
    // now ours, and an SCM_PIDFD payload one int, a descriptor now ours when not negative.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let d = libc::CMSG_DATA(c).cast::<libc::c_int>();
                for i in 0..payload / std::mem::size_of::<libc::c_int>() {
                    fds.push(PeerFd::new(OwnedFd::from_raw_fd(d.add(i).read_unaligned())));
                }
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == SCM_PIDFD {
                // The sender's pidfd, installed because the socket asks for one (SO_PASSPIDFD,
                // which a peer holding the socket too can turn on): closed here, at once (a
                // pidfd's close never waits), or every message would leave one open. A
                // negative value is the error the kernel met making one (none installed).
                let fd = libc::CMSG_DATA(c).cast::<libc::c_int>().read_unaligned();
                if fd >= 0 {
                    drop(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n, fds, msg.msg_flags))
}

/// Registers a descriptor with the current tokio reactor.
///
/// # Safety
///
/// `inner` must own its descriptor: it stays open and refers to the same file description until
/// the returned `AsyncFd` (which takes `inner`) is dropped, and `as_raw_fd` always returns it.
pub(crate) unsafe fn register<T: AsRawFd>(
    inner: T,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<T>> {
    // SAFETY: forwarded from this function's contract.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(inner, interest) }.map_err(|e| e.into_parts().1)
}

/// `pread(2)` until the `len` bytes at `buf` are full or the file ends; returns the bytes read
/// (fewer only at EOF). The bytes are written by the kernel, never by Rust code, so the memory
/// may be memory that another process accesses at the same time (our shared-memory region).
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes for the whole call.
pub(crate) unsafe fn pread_full(fd: BorrowedFd<'_>, buf: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < len {
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
        // SAFETY: `done < len`, so `buf + done` and the `len - done` bytes after it are inside
        // the span the caller gives (valid for writes); `fd` is borrowed open. The kernel
        // writes at most that many bytes.
        let n = unsafe { libc::pread(fd.as_raw_fd(), buf.add(done).cast(), len - done, at) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done)
}

/// Whether `fd` is a regular file (sendfile's source must be one).
pub(crate) fn is_regular_file(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(fstat(fd)?.st_mode & libc::S_IFMT == libc::S_IFREG)
}

/// `sendfile(2)` from `file` at `*offset` to the socket `sock`, at most `count` bytes;
/// advances `*offset`. Non-blocking on the socket side (`WouldBlock`).
pub(crate) fn sendfile(
    sock: BorrowedFd<'_>,
    file: BorrowedFd<'_>,
    offset: &mut u64,
    count: usize,
) -> io::Result<usize> {
    let mut off = libc::off_t::try_from(*offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
    loop {
        // SAFETY: both descriptors are borrowed open; `off` is a valid, writable off_t.
        let n = unsafe { libc::sendfile(sock.as_raw_fd(), file.as_raw_fd(), &mut off, count) };
        if n >= 0 {
            *offset = off as u64;
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sets or clears `TCP_CORK`.
pub(crate) fn set_tcp_cork(sock: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    setsockopt(sock, libc::IPPROTO_TCP, libc::TCP_CORK, &libc::c_int::from(on))
}

/// Whether `fd` lives on shmem (tmpfs), where memfds live unless created with MFD_HUGETLB.
pub(crate) fn is_tmpfs(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: `st` is written by fstatfs before it is read; zeroed is a valid bit pattern.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable statfs buffer; `fd` is borrowed open.
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) })?;
    Ok(st.f_type == libc::TMPFS_MAGIC)
}

/// Whether two descriptors refer to the same file.
pub(crate) fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> io::Result<bool> {
    let (a, b) = (fstat(a)?, fstat(b)?);
    Ok((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino))
}

/// Sets `O_NONBLOCK` on a descriptor this process owns (or that a library owns for it).
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) fn set_nonblocking(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor have no memory-safety preconditions; a closed
    // descriptor yields EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends a small message without descriptors (non-blocking, no SIGPIPE).
pub(crate) fn send_msg(sock: BorrowedFd<'_>, data: &[u8]) -> io::Result<()> {
    send_with_fds(sock, data, &[])
}

// ----- TCP sockets and addresses -----------------------------------------------------------

mod tcp;
pub(crate) use tcp::*;

// ----- who owns a TCP socket ---------------------------------------------------------------

mod diag;
pub(crate) use diag::seqpacket_listeners;
pub(crate) use diag::{
    bound_device, socket_cookie, v6_only, TcpDiag, TcpOwner, TCP_CLOSE_WAIT, TCP_ESTABLISHED, TCP_SYN_RECV,
};
