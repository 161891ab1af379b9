//! A program may build a runtime per request: the link group its connections share outlives
//! each runtime, and nothing of a request's connection stays behind. In a test binary of its
//! own, because it counts the process's descriptors, which tests running beside it open and
//! close.

use std::time::Duration;

use smc_tokio::{SmcStream, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[test]
fn a_runtime_per_request_for_1000_requests_leaks_no_descriptors() {
    let (_server_rt, addr) = tests::echo_server_on_own_runtime();
    let request = |i: usize| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut s = tests::bounded(10, SmcStream::connect(addr)).await.unwrap();
            assert_eq!(s.transport(), Transport::SmcD, "request {i}");
            let body = tests::pattern(1024);
            s.write_all(&body).await.unwrap();
            let mut back = vec![0u8; body.len()];
            tests::bounded(10, s.read_exact(&mut back)).await.unwrap();
            assert_eq!(back, body, "request {i}");
            s.link_group()
        })
    };
    // A few requests first: the group, the rescue driver's thread and runtime exist by then.
    let group = request(0);
    for i in 1..10 {
        assert_eq!(request(i), group, "request {i} reuses the group");
    }
    std::thread::sleep(Duration::from_millis(300));
    let fds_before = tests::open_fds();
    let t = std::time::Instant::now();
    for i in 10..1000 {
        assert_eq!(request(i), group, "request {i} reuses the group");
    }
    // Closed connections' descriptors go on the server's runtime and a closer thread: give
    // them a moment, then compare.
    let mut fds_after = tests::open_fds();
    for _ in 0..50 {
        if fds_after <= fds_before {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        fds_after = tests::open_fds();
    }
    eprintln!("990 requests, a runtime each, in {:?}; descriptors {fds_before} before, {fds_after} after", t.elapsed());
    assert!(fds_after <= fds_before, "descriptors grew from {fds_before} to {fds_after} over 990 requests");
}
