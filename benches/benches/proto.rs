//! Micro-benchmarks of the sans-IO core: the CLC and CDC codecs and cursor arithmetic.
//!
//! `cargo bench -p benches --bench proto`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use smc_tokio::proto::cdc::{CdcFlags, CdcMsg};
use smc_tokio::proto::clc::{decode, ClcMessage, Proposal, RdmaOffer, Secret, ShmOffer};
use smc_tokio::proto::cursor::{Cursor, RingSize};

fn clc(c: &mut Criterion) {
    let msg = ClcMessage::Proposal(Proposal {
        secret: Secret([7; 16]),
        rmb_size: 1 << 16,
        shm: Some(ShmOffer { link_group: 0 }),
        rdma: Some(RdmaOffer { gid: [2; 16], port: 1, mtu: 1024, qpn: 0, link_group: 0 }),
    });
    let bytes = msg.encode().unwrap();
    let mut g = c.benchmark_group("clc");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode_proposal", |b| b.iter(|| black_box(&msg).encode()));
    g.bench_function("decode_proposal", |b| b.iter(|| decode(black_box(&bytes))));
    g.finish();
}

fn cdc(c: &mut Criterion) {
    let mut msg = CdcMsg::new(1, 2);
    msg.prod = Cursor::new(3, 4096);
    msg.cons = Cursor::new(3, 1024);
    msg.flags = CdcFlags::CONS_CURS_UPD_REQ;
    msg.set_inline(b"14 byte inline").unwrap();
    let frame = msg.encode();
    let mut g = c.benchmark_group("cdc");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode", |b| b.iter(|| black_box(&msg).encode()));
    g.bench_function("decode", |b| b.iter(|| CdcMsg::decode(black_box(&frame))));
    g.finish();
}

fn cursor(c: &mut Criterion) {
    let ring = RingSize::new(65536).unwrap();
    let cons = Cursor::new(7, 60000);
    let prod = Cursor::new(8, 1000);
    let mut g = c.benchmark_group("cursor");
    g.bench_function("free", |b| b.iter(|| black_box(ring).free(black_box(cons), black_box(prod))));
    g.bench_function("advance", |b| b.iter(|| black_box(prod).advance(black_box(ring), black_box(1500))));
    g.bench_function("spans", |b| b.iter(|| black_box(ring).spans(black_box(cons), black_box(9000))));
    g.finish();
}

criterion_group!(benches, clc, cdc, cursor);
criterion_main!(benches);
