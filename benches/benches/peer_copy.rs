//! The copy out of peer memory: `rep movsb` against the relaxed word loop, by length, beside a
//! plain `copy_from_slice` (`memcpy`), to place `REP_MOVSB_MIN` (`smc-tokio/src/link/peer_mem.rs`).
//!
//! `cargo bench -p benches --bench peer_copy`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use smc_tokio::fuzzing::peer_copy;

fn copies(c: &mut Criterion) {
    let src: Vec<u8> = (0..(256u32 << 10)).map(|i| i as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let mut g = c.benchmark_group("peer_copy");
    for len in [64usize, 256, 512, 1024, 2048, 4096, 16 << 10, 64 << 10, 256 << 10] {
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("dispatch", len), &len, |b, &n| {
            b.iter(|| peer_copy(black_box(&src[..n]), black_box(&mut dst[..n]), false))
        });
        g.bench_with_input(BenchmarkId::new("words", len), &len, |b, &n| {
            b.iter(|| peer_copy(black_box(&src[..n]), black_box(&mut dst[..n]), true))
        });
        g.bench_with_input(BenchmarkId::new("memcpy", len), &len, |b, &n| {
            b.iter(|| black_box(&mut dst[..n]).copy_from_slice(black_box(&src[..n])))
        });
    }
    g.finish();
}

criterion_group!(benches, copies);
criterion_main!(benches);
