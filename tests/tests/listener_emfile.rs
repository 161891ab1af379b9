//! An `accept` waiting on an empty queue meets the error the kernel's queue gives when the
//! process has no descriptor left (EMFILE), as tokio's accept does, instead of waiting until
//! descriptors free up: servers that shed load on it (or log it) must see it. A test binary
//! of its own: the descriptor limit is the whole process's. An accept on an empty queue waits
//! meanwhile, as tokio's does.

use std::sync::Arc;
use std::time::Duration;

use smc_tokio::SmcListener;

/// The lowest descriptor number not in use: the one the kernel gives a new file.
fn lowest_free_fd() -> u64 {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open("/dev/null").unwrap();
    u64::try_from(f.as_raw_fd()).unwrap()
}

#[tokio::test]
async fn a_waiting_accept_meets_the_processs_lack_of_descriptors() {
    // TCP only: no door, so no descriptor of the listener's own opens or closes meanwhile.
    let listener =
        Arc::new(SmcListener::builder().policy(smc_tokio::Policy::TcpOnly).bind("127.0.0.1:0").await.unwrap());
    let addr = listener.local_addr().unwrap();
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid rlimit for getrlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    // A round whose accept succeeds saw a descriptor that another thread of the process closed
    // after the limit came down (the test cannot rule that out): it is tried again. Without
    // the waking, every round's accept waits, and the round's bound fails the test.
    let mut rounds = 0;
    let (e, client) = loop {
        rounds += 1;
        assert!(rounds <= 5, "a descriptor came free in every round");
        let l = listener.clone();
        let accept = tokio::spawn(async move { l.accept().await.map(|_| ()) });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!accept.is_finished(), "nothing to accept yet");
        // The client's socket exists before the limit comes down; connecting needs no
        // descriptor.
        let client = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        // Down to the lowest free descriptor, until a new file cannot be opened (a descriptor
        // that another thread closed meanwhile lowers it again).
        loop {
            let lowered = libc::rlimit { rlim_cur: lowest_free_fd(), rlim_max: limit.rlim_max };
            // SAFETY: a valid rlimit, lowering only the soft limit.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
            match std::fs::File::open("/dev/null") {
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                Err(e) => panic!("{e}"),
                Ok(_) => {
                    // SAFETY: as above, the original limit back before looking again.
                    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
                }
            }
        }
        // An accept that starts now, on an empty queue, waits as tokio's does (the kernel's
        // accept would fail for want of a descriptor, but there is nothing to accept).
        let mut fresh = tokio_test::task::spawn(listener.accept());
        let fresh_waited = fresh.poll().is_pending();
        drop(fresh);
        let res = async {
            client.connect(&addr.into())?;
            let accepted = tokio::time::timeout(Duration::from_secs(5), accept).await;
            Ok::<_, std::io::Error>(accepted)
        }
        .await;
        // SAFETY: as above; the limit goes back before anything is asserted.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
        assert!(fresh_waited, "an accept on an empty queue failed for want of a descriptor");
        match res.unwrap().expect("the waiting accept never met the error").unwrap() {
            Err(e) => break (e, client),
            Ok(()) => continue,
        }
    };
    assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
    // Descriptors back, the client's connection is there to accept.
    let (s, peer) = tokio::time::timeout(Duration::from_secs(5), listener.accept()).await.unwrap().unwrap();
    assert_eq!(peer, client.local_addr().unwrap().as_socket().unwrap());
    drop(s);
}
