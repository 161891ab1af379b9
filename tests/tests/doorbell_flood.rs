//! A hostile peer that holds a link and rings our doorbell (from its own, connected to ours) in a
//! tight loop. The link group's driver must not starve the runtime: on the same
//! runtime, a ticker keeps ticking, an SMC connection (another link group) and a plain TCP
//! connection complete verified transfers, and the flooded link still works once the flood stops.
//! No speed is asserted, only that the work completes before a generous deadline.

#[path = "support/hostile.rs"]
mod hostile;

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hostile::{Layout, Map};
use smc_tokio::proto::cdc::CdcMsg;
use smc_tokio::proto::cursor::Cursor;
use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, spawn_echo, Rng};
use tokio::net::TcpStream;

const RMB: u32 = 64 << 10;

async fn flood_while_others_work() {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    spawn_echo(l);

    // The hostile peer: joins a group of its own and confirms, so the server holds a live link
    // whose doorbell it can ring.
    let mut hs = bounded(10, hostile::propose(addr, 31337, 1, 0, RMB)).await;
    let server_token = hs.accept.rmb_slot;
    let (mut region, _sock, server_memfd, ring_server) = hostile::join_genuine(&hs, Layout::new(8, 4, RMB)).await;
    hs.confirm(0).await.unwrap();

    // The flood: a thread ringing the server's doorbell as fast as it can.
    let stop = Arc::new(AtomicBool::new(false));
    let rings = Arc::new(AtomicU64::new(0));
    let flooder = {
        let (stop, rings) = (stop.clone(), rings.clone());
        let door = ring_server.try_clone().unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if hostile::ring(door.as_raw_fd()).is_ok() {
                    rings.fetch_add(1, Ordering::Relaxed);
                } else {
                    // EAGAIN: our send buffer is full of rings the server has not drained yet;
                    // keep trying.
                    std::hint::spin_loop();
                }
            }
        })
    };
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(Duration::from_millis(1));
            loop {
                iv.tick().await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Let the flood get going.
    bounded(10, async {
        while rings.load(Ordering::Relaxed) < 10_000 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let (rings0, ticks0) = (rings.load(Ordering::Relaxed), ticks.load(Ordering::Relaxed));

    // Other work on the same runtime: an SMC connection (our own link group, not the flooded
    // one) and a plain TCP connection, each with verified bytes.
    let smc = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(smc.transport(), Transport::SmcD);
    assert_ne!(smc.link_group(), Some(hs.accept.link_group));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let smc_data = Rng::new(1).bytes(8 << 20);
    let tcp_data = Rng::new(2).bytes(2 << 20);
    bounded(120, async {
        tokio::join!(echo_check(smc, &smc_data, 256 << 10, 1), echo_check(tcp, &tcp_data, 64 << 10, 2));
    })
    .await;
    let (rings1, ticks1) = (rings.load(Ordering::Relaxed), ticks.load(Ordering::Relaxed));
    eprintln!("during the transfers: {} doorbell rings, {} ticks", rings1 - rings0, ticks1 - ticks0);
    assert!(rings1 - rings0 > 1000, "the flood went on during the transfers ({} rings)", rings1 - rings0);
    // The ticker keeps advancing while the flood goes on: the runtime is not starved.
    bounded(10, async {
        while ticks.load(Ordering::Relaxed) < ticks1 + 20 || rings.load(Ordering::Relaxed) < rings1 + 1000 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;

    // The flooded link still works: bytes through our ring come back through the server's.
    let msg = b"after the flood";
    region.rmb_write(0, 0, msg);
    let mut cdc = CdcMsg::new(1, server_token);
    cdc.prod = Cursor::new(0, msg.len() as u32);
    region.push_cdc(&cdc);
    let hdr = Map::new(server_memfd.as_fd(), 4096, false).unwrap();
    let w = |i: usize| hdr.word(i * 8).load(Ordering::Relaxed) as u32;
    let sl = Layout::new(w(2), w(3), w(4));
    drop(hdr);
    let server_map = Map::new(server_memfd.as_fd(), sl.total_len, false).unwrap();
    bounded(30, async {
        while hostile::peer_frame(&server_map, sl.cdc_slots, 0).is_none() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let at = sl.rmb_offset + (server_token & 0xFFFF) as usize * sl.rmb_size as usize;
    assert_eq!(server_map.read(at, msg.len()), msg, "the echo over the flooded link");
    stop.store(true, Ordering::Relaxed);
    flooder.join().unwrap();
    ticker.abort();
    drop(hs);
}

#[tokio::test(flavor = "current_thread")]
async fn doorbell_flood_does_not_starve_a_current_thread_runtime() {
    flood_while_others_work().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doorbell_flood_does_not_starve_a_two_worker_runtime() {
    flood_while_others_work().await;
}
