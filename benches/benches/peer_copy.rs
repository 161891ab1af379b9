//! The copy out of peer memory: `rep movsb` against the relaxed word loop, by length, beside a
//! plain `copy_from_slice` (`memcpy`), to place `REP_MOVSB_MIN` (`smc-tokio/src/link/peer_mem.rs`);
//! and each at a page-offset distance of 0 and of 16 bytes between source and destination (a
//! reader's buffer that glibc mapped on its own against a page-aligned ring position), where
//! `rep movsb` is slow on AMD Zen 3 and 4 and the dispatch takes a vector loop there instead.
//!
//! `cargo bench -p benches --bench peer_copy`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use smc_tokio::fuzzing::peer_copy;

const PAGE: usize = 4096;
const MAX: usize = 256 << 10;

fn copies(c: &mut Criterion) {
    // Source at a page boundary, destination one page-rounded span later plus the distance.
    let mut space = vec![0x5au8; 2 * MAX + 3 * PAGE];
    let base = space.as_ptr().align_offset(PAGE);
    let (src, rest) = space[base..].split_at_mut(MAX + PAGE);
    let mut g = c.benchmark_group("peer_copy");
    for distance in [0usize, 16] {
        let dst = &mut rest[distance..distance + MAX];
        for len in [64usize, 256, 512, 1024, 2048, 4096, 16 << 10, 64 << 10, 256 << 10] {
            g.throughput(Throughput::Bytes(len as u64));
            let id = |name: &str| BenchmarkId::new(format!("{name}-distance-{distance}"), len);
            g.bench_with_input(id("dispatch"), &len, |b, &n| {
                b.iter(|| peer_copy(black_box(&src[..n]), black_box(&mut dst[..n]), false))
            });
            g.bench_with_input(id("words"), &len, |b, &n| {
                b.iter(|| peer_copy(black_box(&src[..n]), black_box(&mut dst[..n]), true))
            });
            g.bench_with_input(id("memcpy"), &len, |b, &n| {
                b.iter(|| black_box(&mut dst[..n]).copy_from_slice(black_box(&src[..n])))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, copies);
criterion_main!(benches);
