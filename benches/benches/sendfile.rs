//! `SmcStream::sendfile` of 1 MiB between two ends on one thread, with the file's bytes landing
//! in the ring at a page-offset distance of 0 from where the page cache holds them, and of 16
//! (a 16-byte header written first): the kernel's copy into the ring is slow at a short
//! distance on AMD Zen 3 and 4, where the crate reads through a bounce buffer instead
//! (`smc-tokio/src/link/peer_mem.rs`, `read_file`). Each send has a connection of its own (made
//! outside the timing), whose ring starts at 0 and holds header and file at once (2 MiB, not
//! grown), so the whole send is one fill at that distance. The reader's buffer is page aligned.
//!
//! `cargo bench -p benches --bench sendfile`

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use smc_tokio::config::ShmConfig;
use smc_tokio::{SmcListener, SmcStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEN: usize = 1 << 20;
const PAGE: usize = 4096;

fn sendfile(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let path = std::env::temp_dir().join(format!("smc-sendfile-bench.{}", std::process::id()));
    std::fs::write(&path, (0..LEN).map(|i| i as u8).collect::<Vec<u8>>()).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let shm = ShmConfig::default().rmb_size(2 << 20).rmb_max(0);
    let l = rt.block_on(SmcListener::builder().shm(shm.clone()).bind("127.0.0.1:0")).unwrap();
    let addr = l.local_addr().unwrap();
    let client = SmcStream::builder().shm(shm);
    let mut space = vec![0u8; 64 * 1024 + PAGE];
    let at = space.as_ptr().align_offset(PAGE);
    let buf = &mut space[at..at + 64 * 1024];
    let mut g = c.benchmark_group("sendfile");
    g.throughput(Throughput::Bytes(LEN as u64));
    for distance in [0usize, 16] {
        let pair = || {
            rt.block_on(async {
                let (a, b) = tokio::join!(client.connect(addr), l.accept());
                let (mut a, mut b) = (a.unwrap(), b.unwrap().0);
                assert!(a.transport().is_smc(), "the pair did not negotiate smc-d");
                a.write_all(&vec![0; distance]).await.unwrap();
                b.read_exact(&mut vec![0; distance]).await.unwrap();
                (a, b)
            })
        };
        g.bench_with_input(BenchmarkId::new("distance", distance), &distance, |bench, _| {
            bench.iter_batched(
                pair,
                |(mut a, mut b)| {
                    rt.block_on(async {
                        let send = a.sendfile(&file, 0, LEN as u64);
                        let recv = async {
                            let mut got = 0;
                            while got < LEN {
                                let n = b.read(&mut buf[..]).await.unwrap();
                                assert!(n > 0, "the stream ended early");
                                got += n;
                            }
                        };
                        let (sent, ()) = tokio::join!(send, recv);
                        assert_eq!(sent.unwrap(), LEN as u64);
                    });
                    // Dropped outside the timing.
                    (a, b)
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, sendfile);
criterion_main!(benches);
