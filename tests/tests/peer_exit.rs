//! A writer that exits right after writing loses nothing: every byte it published reaches the
//! reader, then the end TCP would report. The writer is another process (smc-test-peer
//! `write-exit`), which ends three ways: it returns from main (its stream is dropped: an SMC
//! close), calls `std::process::exit` (nothing is dropped: no close, the kernel closes its
//! descriptors), or is SIGKILLed. TCP delivers every byte and then EOF in all three, as the
//! writer never read (it had nothing unread to reset for); so must we. A writer that dies with
//! bytes of ours unread is a TCP peer that resets: every byte it sent, then `ConnectionReset`.

use std::net::SocketAddr;
use std::process::Stdio;

use smc_tokio::{SmcListener, Transport};
use tests::bounded;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

const BYTES: usize = 256 << 10;

/// One writer: spawns it, reads everything from the accepted stream, and returns what the
/// server read and how the read ended.
async fn one(
    l: &SmcListener,
    addr: SocketAddr,
    how: &str,
    leave_unread: bool,
) -> (Transport, Vec<u8>, std::io::Result<usize>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
        .args(["write-exit", &addr.to_string(), &BYTES.to_string(), how])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut s, _) = bounded(10, l.accept()).await.unwrap();
    let t = s.transport();
    if leave_unread {
        // The writer never reads: these bytes are unread when it dies.
        tokio::io::AsyncWriteExt::write_all(&mut s, b"never read").await.unwrap();
    }
    assert!(bounded(10, lines.next_line()).await.unwrap().unwrap().starts_with("TRANSPORT "));
    if how == "kill" {
        // Read nothing until the writer is dead: everything must still be there.
        assert_eq!(bounded(20, lines.next_line()).await.unwrap().unwrap(), "WROTE");
        child.start_kill().unwrap();
        bounded(10, child.wait()).await.unwrap();
    }
    let mut got = Vec::with_capacity(BYTES);
    let end = bounded(20, s.read_to_end(&mut got)).await;
    let _ = bounded(10, child.wait()).await;
    (t, got, end)
}

async fn run(how: &'static str, rounds: usize) {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let want = tests::pattern(BYTES);
    let (mut short, mut errors, mut smc) = (0, 0, 0);
    let mut first_failure = None;
    for i in 0..rounds {
        let (t, got, end) = one(&l, addr, how, false).await;
        smc += usize::from(t == Transport::SmcD);
        let ok_bytes = got == want;
        short += usize::from(!ok_bytes);
        errors += usize::from(end.is_err());
        if (!ok_bytes || end.is_err()) && first_failure.is_none() {
            first_failure = Some(format!("round {i}: {t}, read {} of {BYTES} bytes, end {end:?}", got.len()));
        }
    }
    eprintln!("WRITER-EXITS {how}: {rounds} rounds, {smc} over smc-d, {short} short or wrong, {errors} errors");
    assert_eq!(smc, rounds, "every connection used shared memory");
    assert_eq!((short, errors), (0, 0), "first failure: {first_failure:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_returns_from_main_loses_nothing() {
    run("return", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_calls_exit_loses_nothing() {
    run("exit", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_writer_loses_nothing() {
    run("kill", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_with_our_bytes_unread_reads_as_a_reset_after_its_bytes() {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let want = tests::pattern(BYTES);
    for _ in 0..20 {
        let (t, got, end) = one(&l, addr, "kill", true).await;
        assert_eq!(t, Transport::SmcD);
        assert!(got == want, "read {} of {BYTES} bytes", got.len());
        let e = end.expect_err("a reset after the bytes");
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
        assert_eq!(smc_tokio::SmcError::from_io(&e), Some(&smc_tokio::SmcError::PeerGone), "{e}");
    }
}
