//! A peer's descriptors when this process has no descriptor free. The kernel installs what a
//! message carries when it is received; what finds no room it closes, in the receiving thread,
//! when the receive returns. If that was the last reference (the peer closed its copy), a
//! socket whose close waits (`SO_LINGER` and unsent data) held that thread, a runtime worker,
//! for as long as it liked. The crate looks at a message before it takes it: one whose
//! descriptors do not all fit is left queued, an error, for the connection's end to dispose of
//! off the runtime.
//!
//! A process of its own (this file's one test): it lowers the descriptor limit.

#[path = "support/hostile.rs"]
mod hostile;

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

/// The lowest descriptor number free now: a descriptor limit of it leaves none free.
fn lowest_free() -> libc::rlim_t {
    // SAFETY: dup of standard input (open in any test process) takes no pointers.
    let fd = unsafe { libc::dup(0) };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: `fd` is the descriptor dup just made, ours alone.
    unsafe { libc::close(fd) };
    fd as libc::rlim_t
}

#[test]
fn a_message_whose_descriptors_find_no_room_is_left_queued_not_closed_here() {
    let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    // Three copies of a socket whose last close waits: the message holds the last references
    // once our copy is closed. (Five seconds: what a close here would hold this thread for,
    // before the fix.)
    let (blocking, peer) = smc_tokio::faults::socket_whose_close_blocks(Duration::from_secs(5)).unwrap();
    let raw = blocking.as_raw_fd();
    hostile::send_fds(theirs.as_fd(), b"join", &[raw, raw, raw]).unwrap();
    drop(blocking);

    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `limit`.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    let full = libc::rlimit { rlim_cur: lowest_free(), rlim_max: limit.rlim_max };
    // SAFETY: setrlimit reads one rlimit; this process has no other thread opening files now.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &full) }, 0);
    let mut buf = [0u8; 64];
    let refused = smc_tokio::faults::receive_as_the_crate_does(ours.as_fd(), &mut buf);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let e = refused.expect_err("a message whose descriptors found no room was taken");
    assert_eq!(e.kind(), std::io::ErrorKind::OutOfMemory, "{e}");

    // Left queued, descriptors and all: with room again, it is taken whole.
    let (n, fds) =
        smc_tokio::faults::receive_as_the_crate_does(ours.as_fd(), &mut buf).expect("the message was not left queued");
    assert_eq!((&buf[..n], fds), (&b"join"[..], 3));
    // The peer's reset ends the linger of the copies the closers hold.
    drop(peer);
}
