//! While every descriptor closer is stuck in a close (a peer's file whose close waits for a
//! FUSE daemon that never answers, played here by TCP sockets that linger with unsent data
//! towards peers that never read), the process takes no new descriptor from other processes:
//! knocks on its door and side channel (and on a door as on a kernel before Linux 6.16, whose
//! connections could hold descriptors) do not pile up descriptors waiting for a closer, a new
//! same-host link group is not set up (the connection is TCP, and works), and once the closers
//! come free, shared memory comes back. A test binary of its own: the closers are the whole
//! process's.

use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use smc_tokio::{SmcListener, SmcStream};
use tests::{bounded, echo_check, open_fds, settle_fds, side_channel_names, spawn_echo};

/// The crate's bound on closer threads (`sys::closer::MAX_CLOSERS`), plus one that stays
/// queued so that the closers' watchdog sees all of them stuck with work waiting.
const STUCK: usize = 16 + 1;

/// Connects a SOCK_SEQPACKET socket to the abstract name `name` (a knock on a door or a side
/// channel), without waiting; the connection waits in the listener's backlog until it is
/// accepted (a full backlog: `WouldBlock`).
fn knock(name: &str) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain socket call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes; `fd` is ours.
    let r =
        unsafe { libc::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), (&addr as *const libc::sockaddr_un).cast(), len) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Waits up to `secs` for `f` to hold.
async fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s; {}", smc_tokio::stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn echo_over(addr: std::net::SocketAddr, seed: u64) -> smc_tokio::Transport {
    let s = SmcStream::connect(addr).await.unwrap();
    let t = s.transport();
    echo_check(s, &tests::pattern(100_000), 8192, seed).await;
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_closers_make_the_process_take_no_descriptor_from_peers() {
    let a = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let a_addr = a.local_addr().unwrap();
    spawn_echo(a);
    assert!(echo_over(a_addr, 1).await.is_smc(), "shared memory before the closers are stuck");
    let side = side_channel_names();
    assert!(!side.is_empty(), "a side channel for the first group");

    // Every closer stuck, one descriptor waiting.
    let mut peers = Vec::new();
    for _ in 0..STUCK {
        // Blocks its closer for two minutes, or until its peer is dropped (below).
        let (sock, peer) = smc_tokio::faults::socket_whose_close_blocks(Duration::from_secs(120)).unwrap();
        peers.push(peer);
        smc_tokio::faults::close_on_a_closer_as_is(sock);
    }
    wait_for(30, "the closers congested", || smc_tokio::stats().closer.congested).await;
    let stats = smc_tokio::stats();
    assert_eq!(stats.closer.threads, 16, "{stats}");
    assert!(stats.to_string().contains("congested"), "{stats}");

    // Knocks on the side channel and on a door: none of them costs a descriptor that waits
    // (each would, in the closers' queue, for as long as they are stuck).
    let b = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let b_addr = b.local_addr().unwrap();
    spawn_echo(b);
    let baseline = settle_fds().await;
    let queued_before = smc_tokio::stats().closer.queued;
    let door = format!("smc-tokio/d4/{b_addr}/solo");
    let (mut side_knocks, mut door_knocks) = (0, 0);
    for _ in 0..200 {
        if let Ok(fd) = knock(&side[0]) {
            side_knocks += 1;
            drop(fd);
        }
        if let Ok(fd) = knock(&door) {
            door_knocks += 1;
            drop(fd);
        }
    }
    assert!(side_knocks >= 100 && door_knocks >= 100, "knocks that connected: side {side_knocks}, door {door_knocks}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = settle_fds().await;
    let stats = smc_tokio::stats();
    eprintln!("{side_knocks} + {door_knocks} knocks: descriptors {baseline} -> {after}; {stats}");
    assert!(after <= baseline + 8, "descriptors {baseline} -> {after} after the knocks; {stats}");
    assert!(stats.closer.queued <= queued_before + 8, "queued {} -> {}", queued_before, stats.closer.queued);

    // A new same-host server: no group is set up for it (declined for resources, not left to
    // time out), the connection stays TCP and works.
    let out_of_memory = smc_tokio::DeclineReason::OutOfMemory as usize - 1;
    let declined = smc_tokio::stats().declines_sent[out_of_memory];
    let t = bounded(20, echo_over(b_addr, 2)).await;
    assert!(!t.is_smc(), "a new link group while the closers are stuck: {t:?}");
    let stats = smc_tokio::stats();
    assert_eq!(stats.declines_sent[out_of_memory], declined + 1, "{stats}");

    // A door as on a kernel before Linux 6.16, whose connections could hold descriptors: it
    // takes no knock while the closers are congested (they wait in its backlog), and a client
    // behind them waits for its handshake timeout, then uses TCP.
    smc_tokio::faults::doors_take_descriptors_as_before_6_16(true);
    let c = SmcListener::bind("127.0.0.1:0").await.unwrap();
    smc_tokio::faults::doors_take_descriptors_as_before_6_16(false);
    let c_addr = c.local_addr().unwrap();
    spawn_echo(c);
    let before_c = settle_fds().await;
    let c_door = format!("smc-tokio/d4/{c_addr}/solo");
    let mut c_knocks = 0;
    for _ in 0..200 {
        if let Ok(fd) = knock(&c_door) {
            c_knocks += 1;
            drop(fd);
        }
    }
    assert!(c_knocks >= 100, "knocks that connected: {c_knocks}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_c = settle_fds().await;
    eprintln!("{c_knocks} knocks on a door as before 6.16: descriptors {before_c} -> {after_c}");
    assert!(after_c <= before_c + 8, "descriptors {before_c} -> {after_c}; {}", smc_tokio::stats());
    let t = bounded(20, echo_over(c_addr, 4)).await;
    assert!(!t.is_smc(), "shared memory through a door that takes no connection: {t:?}");

    // The closers come free (the lingering sockets' peers reset them), the knocks that waited
    // in the side channel's backlog are taken and closed, and shared memory is back.
    drop(peers);
    wait_for(30, "the closers free again", || !smc_tokio::stats().closer.congested).await;
    // The door as before 6.16 takes its waiting knocks now and closes them on the closers.
    wait_for(10, "the waiting knocks closed", || open_fds() <= baseline + 8 && smc_tokio::stats().closer.queued == 0)
        .await;
    let t = bounded(20, echo_over(b_addr, 3)).await;
    assert!(t.is_smc(), "shared memory once the closers are free: {t:?}; {}", smc_tokio::stats());
}
