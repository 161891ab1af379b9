//! SIGKILL of the peer process at random points: during the handshake, during link-group setup
//! (every peer process is a new peer, so its first connection sets up a group), mid-stream and
//! during sendfile; in both roles. The surviving side sees an error or EOF (never a hang), its
//! listener keeps accepting SMC and plain clients, and its descriptor count returns to the
//! baseline once the idle link groups are gone.
//!
//! Each test has a context of its own (its link groups and counters are its own), but they run
//! one at a time: they count `/proc/self/fd`, which is the process's.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smc_tokio::config::ShmConfig;
use smc_tokio::{Context, SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, open_fds, Rng};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const ITERATIONS: usize = 30;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn shm() -> ShmConfig {
    ShmConfig::default().rmb_size(64 << 10).idle_timeout(Duration::from_millis(200))
}

fn seed() -> u64 {
    let s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("seed {s}");
    s
}

/// Waits until `ctx` has no link group left and the descriptor count has held still for 300 ms;
/// returns the count.
async fn settle(ctx: &Context) -> usize {
    bounded(30, async {
        while ctx.stats().link_groups != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tests::settle_fds().await
    })
    .await
}

/// Polls until the descriptor count is back to `baseline` (or below), failing after 20 s.
async fn back_to(baseline: usize, what: &str) {
    let t = Instant::now();
    loop {
        let now = open_fds();
        if now <= baseline {
            return;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok().map(|p| p.display().to_string()))
                .collect();
            panic!("{what}: {} descriptors left open ({now} vs {baseline}): {fds:?}", now - baseline);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn peer(args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn sigkill(child: &tokio::process::Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) of our own child, which has not been reaped (id() is Some).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

/// Reads the child's first stdout line (bounded).
async fn first_line(child: &mut tokio::process::Child) -> Option<String> {
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let l = bounded(10, lines.next_line()).await.ok().flatten();
    // Keep the pipe open (dropping it could SIGPIPE the child before we kill it).
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    l
}

/// Waits `d` without yielding (sub-millisecond delays; tokio's timer rounds up to 1 ms).
fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

const ECHO: u8 = 0;
const SENDFILE: u8 = 1;

fn big_file() -> std::fs::File {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-{}", std::process::id()));
    let data = Rng::new(3).bytes(16 << 20);
    std::fs::write(&path, &data).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    f
}

/// We are the server; peer clients die at random points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_clients_killed_at_random_points_leave_the_listener_serving_and_no_descriptors() {
    let _serial = SERIAL.lock().await;
    let ctx = Context::new();
    let mut rng = Rng::new(seed());
    let file = Arc::new(big_file());
    let l = Arc::new(
        SmcListener::builder()
            .context(&ctx)
            .shm(shm())
            // Long enough that a busy machine does not cut off the clients asserted to be on
            // shared memory, short enough that a handshake a killed client left waits little.
            .handshake_timeout(Duration::from_secs(3))
            .bind("127.0.0.1:0")
            .await
            .unwrap(),
    );
    let addr = l.local_addr().unwrap();
    let mode = Arc::new(AtomicU8::new(ECHO));
    let live = Arc::new(AtomicUsize::new(0));
    let ended_with_error = Arc::new(AtomicUsize::new(0));
    {
        let (l, mode, live, errs, file) =
            (l.clone(), mode.clone(), live.clone(), ended_with_error.clone(), file.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                live.fetch_add(1, Ordering::SeqCst);
                let (live, errs, file) = (live.clone(), errs.clone(), file.clone());
                let m = mode.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let r = if m == SENDFILE {
                        loop {
                            match s.sendfile(&*file, 0, 16 << 20).await {
                                Ok(_) => continue,
                                Err(e) => break Err(e),
                            }
                        }
                    } else {
                        let (mut rd, mut wr) = s.split();
                        tokio::io::copy(&mut rd, &mut wr).await.map(drop)
                    };
                    if r.is_err() {
                        errs.fetch_add(1, Ordering::SeqCst);
                    }
                    live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
    }
    // Warm-up (not killed): starts the side-channel acceptor and tokio's child-process driver.
    let t0 = Instant::now();
    let mut warm = peer(&["client", &addr.to_string()]);
    let out = first_line(&mut warm).await.unwrap();
    // How long a peer takes from spawn to a finished handshake: kills are spread around it.
    let to_connected = t0.elapsed();
    assert_eq!(out, "TRANSPORT smc-d");
    assert!(bounded(20, warm.wait()).await.unwrap().success());
    drop(warm);
    let baseline = settle(&ctx).await;
    eprintln!("baseline {baseline} descriptors; a peer is connected {to_connected:?} after its spawn");

    let phases: [(&str, &str, u8, u64); 3] = [
        ("handshake and link setup", "client", ECHO, 8),
        ("mid-stream", "blast", ECHO, 20),
        ("sendfile", "sink", SENDFILE, 20),
    ];
    for (phase, peer_mode, server_mode, max_delay_ms) in phases {
        mode.store(server_mode, Ordering::SeqCst);
        let mut transports = Vec::new();
        let before = ctx.stats();
        for i in 0..ITERATIONS {
            let mut child = peer(&[peer_mode, &addr.to_string()]);
            let delay = Duration::from_micros(rng.range(0, max_delay_ms as usize * 1000) as u64);
            if peer_mode == "client" {
                // Anywhere from before the connect to after the echo, most around the handshake
                // and the group setup (which take well under a millisecond).
                let d = to_connected.mul_f64(rng.range(10, 120) as f64 / 100.0);
                spin_for(d);
            } else {
                let t = first_line(&mut child).await;
                transports.push(t.clone().unwrap_or_default());
                tokio::time::sleep(delay).await;
            }
            sigkill(&child);
            let _ = bounded(10, child.wait()).await;
            drop(child);
            // Every connection the listener handed out ends (error or EOF), and every handshake
            // it was running finishes.
            let t = Instant::now();
            while live.load(Ordering::SeqCst) != 0 || l.pending_handshakes() != 0 {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "{phase} #{i}: {} connections and {} handshakes still running 10 s after SIGKILL",
                    live.load(Ordering::SeqCst),
                    l.pending_handshakes()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let smc = transports.iter().filter(|t| t.as_str() == "TRANSPORT smc-d").count();
        let after = ctx.stats();
        eprintln!(
            "{phase}: {ITERATIONS} kills; {smc} of {} peers were on smc-d when killed; server handed out {} smc-d and {} tcp connections, {} handshakes failed",
            transports.len(),
            after.server.smc_d - before.server.smc_d,
            after.server.tcp - before.server.tcp,
            after.handshakes_failed - before.handshakes_failed,
        );
        if peer_mode != "client" {
            assert!(smc > ITERATIONS / 2, "{phase}: most peers were on shared memory when killed: {transports:?}");
        }
    }
    eprintln!("{} served connections ended with an error", ended_with_error.load(Ordering::SeqCst));
    assert!(ended_with_error.load(Ordering::SeqCst) > 0);

    // Still serving, SMC and plain clients alike.
    mode.store(ECHO, Ordering::SeqCst);
    let s = bounded(10, SmcStream::builder().context(&ctx).shm(shm()).connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD);
    bounded(20, echo_check(s, &Rng::new(9).bytes(1 << 20), 50_000, 9)).await;
    let c = TcpStream::connect(addr).await.unwrap();
    bounded(20, echo_check(c, b"plain client after the kills", 7, 10)).await;
    let mut ok = peer(&["client", &addr.to_string()]);
    assert_eq!(first_line(&mut ok).await.unwrap(), "TRANSPORT smc-d");
    assert!(bounded(20, ok.wait()).await.unwrap().success());
    drop(ok);
    // Every descriptor comes back: connections, regions, doorbells, side channels, pending
    // groups nobody joined.
    back_to(baseline, "server after the kills").await;
}

/// We are the client; peer servers die at random points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_servers_killed_at_random_points_leave_the_client_with_errors_and_no_descriptors() {
    let _serial = SERIAL.lock().await;
    let ctx = Context::new();
    let mut rng = Rng::new(seed());
    let file = Arc::new(big_file());
    // No negative cache: a killed server's port may come back as a later iteration's server.
    let builder = SmcStream::builder()
        .context(&ctx)
        .shm(shm())
        .handshake_timeout(Duration::from_millis(500))
        .negative_cache_ttl(Duration::ZERO);
    // Connections asserted to be on shared memory (to a server that is not killed before they
    // are made) are given far longer than a busy machine can delay a handshake step; the short
    // bound above is for the connects whose server is killed under them.
    let patient = builder.clone().handshake_timeout(Duration::from_secs(5));
    // Warm-up: tokio's child-process driver.
    let mut warm = peer(&["serve"]);
    let _ = first_line(&mut warm).await;
    warm.kill().await.unwrap();
    drop(warm);
    let baseline = settle(&ctx).await;
    eprintln!("baseline {baseline} descriptors");
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for phase in ["connect", "mid-stream", "sendfile"] {
        for i in 0..ITERATIONS {
            let mut child = peer(&[if phase == "sendfile" { "hold" } else { "serve" }]);
            let line = first_line(&mut child).await.expect("PORT line");
            let port: u16 = line.strip_prefix("PORT ").unwrap().parse().unwrap();
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let what = format!("{phase} #{i}");
            let outcome = match phase {
                "connect" => {
                    // The first connection to a new server: the handshake and the group setup.
                    let b = builder.clone();
                    let connect = tokio::spawn(async move { b.connect(addr).await });
                    spin_for(Duration::from_micros(rng.range(0, 1500) as u64));
                    sigkill(&child);
                    match bounded(10, connect).await.unwrap() {
                        Err(e) => format!("connect failed ({:?})", e.kind()),
                        Ok(mut s) => {
                            let t = s.transport();
                            let mut b = [0u8; 8];
                            let _ = s.write_all(b"ping").await;
                            // A dead server: the read ends (an echo may come first if it
                            // answered before dying).
                            let r = bounded(10, async {
                                loop {
                                    match s.read(&mut b).await {
                                        Ok(0) => break Ok(0),
                                        Ok(_) => continue,
                                        Err(e) => break Err(e),
                                    }
                                }
                            })
                            .await;
                            format!("{} then {}", if t.is_smc() { "smc-d" } else { "tcp" }, r.is_err())
                        }
                    }
                }
                "mid-stream" => {
                    let s = bounded(10, patient.connect(addr)).await.unwrap();
                    assert_eq!(s.transport(), Transport::SmcD, "{what}");
                    let (mut rd, mut wr) = s.into_split();
                    let writer = tokio::spawn(async move {
                        let chunk = vec![1u8; 100_000];
                        loop {
                            if let Err(e) = wr.write_all(&chunk).await {
                                return e;
                            }
                        }
                    });
                    let reader = tokio::spawn(async move {
                        let mut buf = vec![0u8; 65536];
                        loop {
                            match rd.read(&mut buf).await {
                                Ok(0) => return None,
                                Ok(_) => {}
                                Err(e) => return Some(e),
                            }
                        }
                    });
                    tokio::time::sleep(Duration::from_micros(rng.range(0, 20_000) as u64)).await;
                    sigkill(&child);
                    let w = bounded(10, writer).await.unwrap();
                    let r = bounded(10, reader).await.unwrap();
                    format!("write {:?}, read {:?}", w.kind(), r.map(|e| e.kind()))
                }
                _ => {
                    let mut s = bounded(10, patient.connect(addr)).await.unwrap();
                    assert_eq!(s.transport(), Transport::SmcD, "{what}");
                    let file = file.clone();
                    let sender = tokio::spawn(async move {
                        let mut sent = 0;
                        loop {
                            match s.sendfile(&*file, 0, 16 << 20).await {
                                Ok(n) => sent += n,
                                Err(e) => return (sent, e),
                            }
                        }
                    });
                    tokio::time::sleep(Duration::from_micros(rng.range(0, 20_000) as u64)).await;
                    sigkill(&child);
                    let (sent, e) = bounded(10, sender).await.unwrap();
                    assert!(sent < 16 << 20, "{what}: the peer never reads, at most a ring's worth goes out");
                    format!("sendfile {:?}", e.kind())
                }
            };
            *outcomes.entry(format!("{phase}: {outcome}")).or_default() += 1;
            let _ = bounded(10, child.wait()).await;
        }
        back_to(baseline, phase).await;
    }
    eprintln!("{outcomes:#?}");
}
