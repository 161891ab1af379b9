//! A request/response round trip with both ends on one thread: the path's own cost, with no
//! line crossing between CPUs and no wake-up (each read finds its bytes there). smc-tokio's
//! stream beside tokio's in-process pipe (`tokio::io::duplex`, a lock and a copy), tokio's
//! `UnixStream` and `TcpStream`, in the same run.
//!
//! `cargo bench -p benches --bench rr_one_thread`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// One round trip: `a` writes `msg`, `b` reads it and writes it back, `a` reads it.
async fn round_trip<A, B>(a: &mut A, b: &mut B, msg: &[u8], buf: &mut [u8])
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    a.write_all(msg).await.unwrap();
    b.read_exact(buf).await.unwrap();
    b.write_all(buf).await.unwrap();
    a.read_exact(buf).await.unwrap();
}

fn bench_pair<A, B>(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, mut a: A, mut b: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut g = c.benchmark_group("rr_one_thread");
    for size in [14usize, 1024] {
        let msg = vec![0x5a; size];
        let mut buf = vec![0; size];
        g.bench_with_input(BenchmarkId::new(name, size), &size, |bench, _| {
            bench.iter(|| rt.block_on(round_trip(&mut a, &mut b, black_box(&msg), &mut buf)))
        });
    }
    g.finish();
}

fn pairs(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (a, b) = rt.block_on(async {
        let l = smc_tokio::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(smc_tokio::SmcStream::connect(addr), l.accept());
        let a = a.unwrap();
        assert!(a.transport().is_smc(), "the pair did not negotiate smc-d");
        (a, b.unwrap().0)
    });
    bench_pair(c, &rt, "smc", a, b);
    let (a, b) = tokio::io::duplex(64 << 10);
    bench_pair(c, &rt, "duplex", a, b);
    let (a, b) = rt.block_on(async {
        let dir = std::env::temp_dir().join(format!("rr_one_thread.{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let l = tokio::net::UnixListener::bind(&dir).unwrap();
        let (a, b) = tokio::join!(tokio::net::UnixStream::connect(&dir), l.accept());
        let _ = std::fs::remove_file(&dir);
        (a.unwrap(), b.unwrap().0)
    });
    bench_pair(c, &rt, "unix", a, b);
    let (a, b) = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        let a = a.unwrap();
        a.set_nodelay(true).unwrap();
        (a, b.unwrap().0)
    });
    bench_pair(c, &rt, "tcp", a, b);
}

criterion_group!(benches, pairs);
criterion_main!(benches);
