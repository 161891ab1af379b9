//! A soak: a mixed workload on loopback for a bounded time, every byte verified, peer processes
//! killed at random, descriptors and RSS reported at the start and the end.
//!
//! ```text
//! cargo run --release -p tests --bin smc-soak -- [--duration SECS] [--kill-every SECS]
//! ```
//!
//! Workload: request/response over shm and over TCP (policy TcpOnly), 1 MiB streams, short
//! connections (connect, one exchange, close), sendfile of a 256 KiB file, and a peer process
//! (`smc-test-peer serve`) killed with SIGKILL under streaming clients every few seconds; those
//! clients must fail within 2 s (never hang). Exits non-zero on any unexpected error, mismatch or
//! hang.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smc_tokio::{Policy, SmcListener, SmcStream, Transport};
use tests::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Default)]
struct Counters {
    bytes: AtomicU64,
    ops: AtomicU64,
    unexpected: AtomicU64,
    kills: AtomicU64,
    killed_clients_failed: AtomicU64,
    hangs: AtomicU64,
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4)
}

fn unexpected(c: &Counters, what: &str, e: &dyn std::fmt::Display) {
    if c.unexpected.fetch_add(1, Ordering::Relaxed) < 10 {
        eprintln!("UNEXPECTED {what}: {e}");
    }
}

async fn echo_once(s: &mut SmcStream, rng: &mut Rng, max: usize) -> std::io::Result<usize> {
    let n = rng.range(1, max);
    let msg = rng.bytes(n);
    s.write_all(&msg).await?;
    let mut back = vec![0u8; n];
    s.read_exact(&mut back).await?;
    if back != msg {
        return Err(std::io::Error::other("echo mismatch"));
    }
    Ok(n)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut duration, mut kill_every) = (60u64, 5u64);
    while let Some(a) = args.next() {
        let v: u64 = args.next().and_then(|v| v.parse().ok()).ok_or_else(|| std::io::Error::other("missing value"))?;
        match a.as_str() {
            "--duration" => duration = v.clamp(1, 24 * 3600),
            "--kill-every" => kill_every = v.clamp(1, 3600),
            _ => return Err(std::io::Error::other(format!("unknown argument {a}"))),
        }
    }
    let l = SmcListener::builder().max_pending_handshakes(4096).bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tests::spawn_echo(l);
    let file_data = Rng::new(99).bytes(256 << 10);
    let path = std::env::temp_dir().join(format!("smc-soak-{}", std::process::id()));
    std::fs::write(&path, &file_data)?;
    let file = Arc::new(std::fs::File::open(&path)?);
    let c = Arc::new(Counters::default());
    let deadline = Instant::now() + Duration::from_secs(duration);

    // Warm up one connection of each kind before the baseline, so that the link group and the
    // runtime's own descriptors are counted at the start as at the end.
    let mut w = SmcStream::connect(addr).await?;
    echo_once(&mut w, &mut Rng::new(1), 64).await?;
    drop(w);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (fds0, rss0) = (fds(), rss_kib());
    println!("start: {fds0} descriptors, {rss0} KiB RSS, duration {duration} s");

    let mut tasks = Vec::new();
    // Samples every tenth of the run: descriptors and RSS must stay flat.
    {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let every = Duration::from_secs((duration / 10).max(1));
            let start = Instant::now();
            while Instant::now() + every < deadline {
                tokio::time::sleep(every).await;
                println!(
                    "t={:>4}s: {} descriptors, {} KiB RSS, {} bytes verified",
                    start.elapsed().as_secs(),
                    fds(),
                    rss_kib(),
                    c.bytes.load(Ordering::Relaxed)
                );
            }
        }));
    }
    // Request/response: shm and tcp.
    for (i, policy) in
        [Policy::Auto, Policy::Auto, Policy::Auto, Policy::TcpOnly, Policy::TcpOnly].into_iter().enumerate()
    {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(10 + i as u64);
            let mut s = match SmcStream::builder().policy(policy).connect(addr).await {
                Ok(s) => s,
                Err(e) => return unexpected(&c, "rr connect", &e),
            };
            let want_smc = policy == Policy::Auto;
            if s.transport().is_smc() != want_smc {
                return unexpected(&c, "rr transport", &s.transport());
            }
            while Instant::now() < deadline {
                match echo_once(&mut s, &mut rng, 4096).await {
                    Ok(n) => {
                        c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                        c.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return unexpected(&c, "rr", &e),
                }
            }
        }));
    }
    // Streams of 1 MiB with random chunking.
    for i in 0..2u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(20 + i);
            while Instant::now() < deadline {
                let s = match SmcStream::connect(addr).await {
                    Ok(s) => s,
                    Err(e) => return unexpected(&c, "stream connect", &e),
                };
                let data = rng.bytes(1 << 20);
                let (mut rd, mut wr) = s.into_split();
                let d2 = data.clone();
                let writer = tokio::spawn(async move {
                    for chunk in d2.chunks(70_000) {
                        wr.write_all(chunk).await?;
                    }
                    wr.shutdown().await
                });
                let mut back = Vec::with_capacity(data.len());
                let r = rd.read_to_end(&mut back).await;
                match (r, writer.await) {
                    (Ok(_), Ok(Ok(()))) if back == data => {
                        c.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                        c.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    (r, w) => return unexpected(&c, "stream", &format!("{r:?} {w:?} len {}", back.len())),
                }
            }
        }));
    }
    // Short connections.
    for i in 0..3u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(30 + i);
            while Instant::now() < deadline {
                let r = async {
                    let mut s = SmcStream::connect(addr).await?;
                    let n = echo_once(&mut s, &mut rng, 64).await?;
                    std::io::Result::Ok(n)
                }
                .await;
                match r {
                    Ok(n) => {
                        c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                        c.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return unexpected(&c, "crr", &e),
                }
            }
        }));
    }
    // sendfile of the whole file, echoed back and compared with it.
    {
        let (c, file, file_data) = (c.clone(), file.clone(), file_data.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let s = match SmcStream::connect(addr).await {
                    Ok(s) => s,
                    Err(e) => return unexpected(&c, "sendfile connect", &e),
                };
                let (mut rd, mut wr) = s.into_split();
                let f = file.clone();
                let writer = tokio::spawn(async move {
                    let n = wr.sendfile(&*f, 0, 256 << 10).await?;
                    wr.shutdown().await.map(|()| n)
                });
                let mut back = Vec::new();
                let r = rd.read_to_end(&mut back).await;
                match (r, writer.await) {
                    (Ok(_), Ok(Ok(n))) if n == file_data.len() as u64 && back == file_data => {
                        c.bytes.fetch_add(n, Ordering::Relaxed);
                        c.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    (r, w) => return unexpected(&c, "sendfile", &format!("{r:?} {w:?}")),
                }
            }
        }));
    }
    // Peer processes killed under streaming clients.
    {
        let c = c.clone();
        let peer = std::env::current_exe()?.with_file_name("smc-test-peer");
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(40);
            while Instant::now() + Duration::from_secs(kill_every) < deadline {
                tokio::time::sleep(Duration::from_secs(kill_every)).await;
                let mut child = match tokio::process::Command::new(&peer)
                    .arg("serve")
                    .stdout(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                {
                    Ok(ch) => ch,
                    Err(e) => return unexpected(&c, "spawn peer", &e),
                };
                let mut out = String::new();
                let mut stdout = child.stdout.take().expect("piped");
                let mut byte = [0u8; 1];
                while !out.ends_with('\n') {
                    if stdout.read(&mut byte).await.unwrap_or(0) == 0 {
                        break;
                    }
                    out.push(byte[0] as char);
                }
                let Some(port) = out.trim().strip_prefix("PORT ").and_then(|p| p.parse::<u16>().ok()) else {
                    unexpected(&c, "peer port", &out);
                    continue;
                };
                let mut clients = Vec::new();
                for k in 0..4u64 {
                    let c2 = c.clone();
                    clients.push(tokio::spawn(async move {
                        let mut rng = Rng::new(50 + k);
                        let mut s = SmcStream::connect(("127.0.0.1", port)).await?;
                        if s.transport() != Transport::SmcD {
                            return Err(std::io::Error::other("peer connection not on shm"));
                        }
                        loop {
                            let n = echo_once(&mut s, &mut rng, 8192).await?;
                            c2.bytes.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        #[allow(unreachable_code)]
                        std::io::Result::Ok(())
                    }));
                }
                tokio::time::sleep(Duration::from_millis(rng.range(200, 1000) as u64)).await;
                let pid = child.id().unwrap_or(0) as i32;
                // SAFETY: kill(2) of our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                c.kills.fetch_add(1, Ordering::Relaxed);
                let _ = child.wait().await;
                for cl in clients {
                    match tokio::time::timeout(Duration::from_secs(2), cl).await {
                        Ok(Ok(Err(_))) => {
                            c.killed_clients_failed.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(other) => unexpected(&c, "killed-peer client", &format!("{other:?}")),
                        Err(_) => {
                            c.hangs.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        if let Err(e) = t.await {
            unexpected(&c, "task", &e);
        }
    }
    // Let closes and idle link groups settle (the shm idle timeout is 60 s: groups of killed
    // peers are gone at once, the one with the in-process server stays, as it did at the start).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (fds1, rss1) = (fds(), rss_kib());
    let _ = std::fs::remove_file(&path);
    let st = smc_tokio::stats();
    println!(
        "end: {fds1} descriptors ({:+}), {rss1} KiB RSS ({:+} KiB)",
        fds1 as i64 - fds0 as i64,
        rss1 as i64 - rss0 as i64
    );
    println!(
        "bytes verified {}, operations {}, peer kills {}, clients failed by a kill {}, hangs {}, unexpected errors {}",
        c.bytes.load(Ordering::Relaxed),
        c.ops.load(Ordering::Relaxed),
        c.kills.load(Ordering::Relaxed),
        c.killed_clients_failed.load(Ordering::Relaxed),
        c.hangs.load(Ordering::Relaxed),
        c.unexpected.load(Ordering::Relaxed)
    );
    println!("{st}");
    let bad = c.unexpected.load(Ordering::Relaxed) + c.hangs.load(Ordering::Relaxed);
    if bad > 0 || fds1 > fds0 + 8 {
        return Err(std::io::Error::other(format!(
            "soak failed: {bad} unexpected errors or hangs, {} descriptors more",
            fds1 as i64 - fds0 as i64
        )));
    }
    Ok(())
}
