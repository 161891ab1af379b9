//! A stranger on the host against the door and the side channel: a process of uid 65534 (and a
//! victim in a user namespace) tries what any local user can, and the tests assert what the
//! user of the crate sees. Descriptors it queues can make a close block for an hour (a TCP
//! socket with `SO_LINGER` {1, 3600} and unsent data towards a peer that never reads); none of
//! them may block a thread of ours, leak a descriptor, or stop plain TCP service; a squatter
//! on a door name gets no socket and no byte, and slows no client down.
//!
//! The tests run as root (they start the attacker as another uid); each prints what it
//! measured with `--nocapture`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, open_fds, require_root, side_channel_names};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PEER: &str = env!("CARGO_BIN_EXE_smc-test-peer");
const NOBODY: u32 = 65534;

/// A connect that takes longer than this is stuck, not slow: the attacker's sockets would hold
/// a close for an hour. (A working connect here takes well under a millisecond.)
const STUCK: Duration = Duration::from_secs(2);

/// Serves every connection of `l`: a request that starts `GET ` (curl's) is answered
/// `hello` over HTTP/1.1 and closed; anything else is echoed. Returns the accept loop.
fn serve(l: SmcListener) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((conn, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = conn.into_split();
                let mut first = [0u8; 4];
                if rd.read_exact(&mut first).await.is_err() {
                    return;
                }
                if &first == b"GET " {
                    let _ =
                        wr.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello").await;
                    let _ = wr.shutdown().await;
                    return;
                }
                let _ = wr.write_all(&first).await;
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                let _ = wr.shutdown().await;
            });
        }
    })
}

/// curl against `addr` (3 s bound): the body, or what went wrong.
async fn curl(addr: SocketAddr) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "3", &format!("http://{addr}/")])
        .output()
        .await
        .expect("curl (the test command's .ci/run installs it)");
    if out.status.success() {
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        format!("curl failed: {}", out.status)
    }
}

/// A plain tokio client round trip against `addr`.
async fn plain_round_trip(addr: SocketAddr) {
    let mut c = bounded(10, tokio::net::TcpStream::connect(addr)).await.unwrap();
    c.write_all(b"plain client").await.unwrap();
    let mut b = [0u8; 12];
    bounded(10, c.read_exact(&mut b)).await.unwrap();
    assert_eq!(&b, b"plain client");
}

/// An SMC client round trip against `addr`; returns its transport.
async fn smc_round_trip(addr: SocketAddr, seed: u64) -> Transport {
    let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    let t = s.transport();
    bounded(10, echo_check(s, &tests::Rng::new(seed).bytes(10_000), 1000, seed)).await;
    t
}

/// Threads of this process whose kernel stack is inside a TCP close (`/proc/self/task/*/stack`,
/// readable by root), by name.
fn threads_in_tcp_close() -> Vec<String> {
    let mut stuck = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let stack = std::fs::read_to_string(task.path().join("stack")).unwrap_or_default();
        if stack.contains("sk_stream_wait_close") || stack.contains("tcp_close") {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            stuck.push(comm.trim().to_string());
        }
    }
    stuck
}

/// Waits up to 5 s for this process's descriptors to come back to `baseline` (plus `slack`
/// for sockets a runtime may still be closing); returns the last count seen.
async fn back_to_baseline(baseline: usize, slack: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = open_fds();
        if now <= baseline + slack || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The test peer run as `uid` (and its gid) with `args`, trusting our uid (root's): the child
/// (killed when dropped), its stdin and its stdout's lines.
fn peer_as(
    uid: u32,
    args: &[&str],
) -> (
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(PEER)
        .args(args)
        .env("SMC_TOKIO_SHM_ALLOW_UIDS", "0")
        .uid(uid)
        .gid(uid)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    (child, stdin, lines)
}

/// The tests of this file count the process's descriptors and threads: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs an attack (the test peer's arguments, from `attack` once the listener has served its
/// first SMC connection) as uid 65534 against listener `l` while plain and SMC clients keep
/// using it; then checks that our descriptors are back where they were while the attacker
/// still holds its end, that no thread of ours sits in a TCP close, and that the closers took
/// out at least as many queued descriptors as `queued` reads from the attacker's report line,
/// which is returned.
async fn under_attack(l: SmcListener, attack: impl FnOnce() -> Vec<String>, queued: fn(&str) -> u64) -> String {
    let addr = l.local_addr().unwrap();
    let _server = serve(l);
    // Warm up: the closer threads, a link group, the side channel.
    assert_eq!(smc_round_trip(addr, 1).await, Transport::SmcD);
    plain_round_trip(addr).await;
    let attack = attack();
    let attack: Vec<&str> = attack.iter().map(String::as_str).collect();
    let baseline = tests::settle_fds().await;
    let drained_before = smc_tokio::stats().closer.drained;

    let (_attacker, mut lines) = tests::peer_as(PEER, NOBODY, &attack);
    let report = bounded(60, lines.next_line()).await.unwrap().expect("the attacker reports");
    eprintln!("attacker: {report}");
    let expect_drained = queued(&report);
    // During: plain TCP, curl and SMC all serve.
    for i in 0..5 {
        plain_round_trip(addr).await;
        assert_eq!(smc_round_trip(addr, 10 + i).await, Transport::SmcD);
    }
    assert_eq!(curl(addr).await, "hello", "curl during the attack");
    let after = back_to_baseline(baseline, 2).await;
    eprintln!("descriptors: baseline {baseline}, with the attacker still there {after}");
    assert!(after <= baseline + 2, "descriptors did not come back: {baseline} -> {after}");
    let stuck = threads_in_tcp_close();
    assert!(stuck.is_empty(), "threads blocked in a TCP close: {stuck:?}");
    let c = smc_tokio::stats().closer;
    eprintln!("closer: {c:?}");
    assert!(
        c.drained >= drained_before + expect_drained,
        "the queued sockets were not taken out: {drained_before} -> {}",
        c.drained
    );
    assert_eq!(c.queued, 0, "descriptors still wait for a closer");
    // After: still serving.
    plain_round_trip(addr).await;
    assert_eq!(smc_round_trip(addr, 99).await, Transport::SmcD);
    assert_eq!(curl(addr).await, "hello", "curl after the attack");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_sockets_knocked_into_the_door_block_nothing() {
    if !require_root("lingering_sockets_knocked_into_the_door_block_nothing") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let door = l.door_name().unwrap();
    let attack = || vec!["knock-linger".into(), door, "500".into(), "30".into()];
    let knocked = |r: &str| r.strip_prefix("KNOCKED ").and_then(|n| n.parse().ok()).unwrap();
    let report = under_attack(l, attack, knocked).await;
    if kernel_refuses_descriptors() {
        // The door's connections refuse descriptors from the moment they are made, before the
        // door accepts them: no knock got a socket in.
        assert_eq!(knocked(&report), 0, "{report}");
    } else {
        // Most knocks got their socket into the door connection before the door closed it.
        assert!(knocked(&report) >= 100, "{report}");
    }
}

/// Whether this kernel lets a Unix socket refuse descriptors (`SO_PASSRIGHTS`, Linux 6.16).
fn kernel_refuses_descriptors() -> bool {
    use std::os::fd::AsRawFd;
    const SO_PASSRIGHTS: libc::c_int = 83;
    let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
    let off: libc::c_int = 0;
    // SAFETY: a valid int option value of its size, on a socket we own.
    let r = unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&off as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    r == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_side_channel_takes_nobody_it_does_not_wait_for() {
    tests::raise_fd_limit();
    if !require_root("the_side_channel_takes_nobody_it_does_not_wait_for") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let before = side_channel_names();
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    // The listener's side channel, started by its first SMC-D connection: 1000 connections at
    // once, each with a lingering socket queued, all closed at once.
    let attack = || {
        let new: Vec<String> = side_channel_names().into_iter().filter(|n| !before.contains(n)).collect();
        assert_eq!(new.len(), 1, "{new:?}");
        vec!["side-hold".into(), new[0].clone(), "1000".into()]
    };
    // The side channel closes a stranger's connection as soon as it is accepted, so few of the
    // sockets make it into one (none where the kernel can refuse them); those that do are taken
    // out.
    let queued = |r: &str| r.split(" queued=").nth(1).and_then(|q| q.split(' ').next()?.parse().ok()).unwrap();
    let report = under_attack(l, attack, queued).await;
    eprintln!("{report}");
    assert!(report.starts_with("SIDE opened=1000 "), "{report}");
    assert!(report.ends_with(" open_after=0"), "the side channel held a stranger's connections: {report}");
    if kernel_refuses_descriptors() {
        // Its connections refuse descriptors from the moment they are made, until the peer is
        // a client it waits for: no stranger got a socket in.
        assert_eq!(queued(&report), 0, "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squatter_queueing_lingering_sockets_slows_no_client() {
    tests::raise_fd_limit();
    if !require_root("a_squatter_queueing_lingering_sockets_slows_no_client") {
        return;
    }
    let _serial = SERIAL.lock().await;
    // A plain TCP server (no door of ours), and a squatter on every door name of its address.
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = server.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let base = format!("smc-tokio/d4/{addr}");
    let mut names = vec![format!("{base}/solo")];
    names.extend((0..16).map(|i| format!("{base}/{i}")));
    let mut args = vec!["squat-linger".to_string(), "5".to_string()];
    args.extend(names);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_squatter, mut lines) = tests::peer_as(PEER, NOBODY, &args);
    assert_eq!(bounded(10, lines.next_line()).await.unwrap().as_deref(), Some("SQUATTING"));
    let baseline = tests::settle_fds().await;
    let drained_before = smc_tokio::stats().closer.drained;
    let mut worst = Duration::ZERO;
    let mut times = Vec::new();
    for i in 0..30 {
        let t = Instant::now();
        let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
        let took = t.elapsed();
        times.push(took);
        worst = worst.max(took);
        assert!(matches!(s.transport(), Transport::Tcp(_)), "{:?}", s.transport());
        bounded(10, echo_check(s, &tests::Rng::new(i).bytes(4096), 512, i)).await;
        assert!(took < STUCK, "connect {i} was stuck behind the squatter for {took:?}");
    }
    times.sort();
    eprintln!("connects past the squatter: median {:?}, worst {worst:?}", times[times.len() / 2]);
    let after = back_to_baseline(baseline, 2).await;
    assert!(after <= baseline + 2, "descriptors did not come back: {baseline} -> {after}");
    let stuck = threads_in_tcp_close();
    assert!(stuck.is_empty(), "threads blocked in a TCP close: {stuck:?}");
    let out = bounded(30, lines.next_line()).await.unwrap().unwrap_or_default();
    eprintln!("squatter: {out}");
    // It saw the probes, and got nothing from them: not a byte, not a socket.
    assert!(out.starts_with("SQUAT conns=") && out.contains(" bytes=0 fds=0 "), "{out}");
    assert!(!out.starts_with("SQUAT conns=0 "), "the clients did probe: {out}");
    // Every lingering socket it got into a probe connection was taken out by our closer.
    let queued: u64 = out.split(" queued=").nth(1).and_then(|q| q.parse().ok()).unwrap();
    let drained = smc_tokio::stats().closer.drained - drained_before;
    assert!(drained >= queued, "queued {queued}, taken out {drained}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_in_a_user_namespace_does_not_trust_the_overflow_uid() {
    if !require_root("a_victim_in_a_user_namespace_does_not_trust_the_overflow_uid") {
        return;
    }
    let _serial = SERIAL.lock().await;
    // A plain TCP echo server, and the host's nobody squatting on its door name. A client in a
    // user namespace that maps only itself to 65534 sees every unmapped uid (nobody's
    // included) as 65534, its own euid.
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = server.accept().await {
            let got = got_tx.clone();
            tokio::spawn(async move {
                let mut first = vec![0u8; 64];
                let n = s.read(&mut first).await.unwrap_or(0);
                let _ = got.send(first[..n].to_vec());
                s.write_all(&first[..n]).await.unwrap();
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let name = format!("smc-tokio/d4/{addr}/solo");
    let (_squatter, mut lines) = tests::peer_as(PEER, NOBODY, &["squat", &name, "4"]);
    assert_eq!(bounded(10, lines.next_line()).await.unwrap().as_deref(), Some("SQUATTING"));
    let victim = tokio::process::Command::new("unshare")
        .args(["-U", "--map-user=65534", "--map-group=65534", PEER, "client", &addr.to_string()])
        .output();
    let victim = bounded(30, victim).await.unwrap();
    let out = String::from_utf8_lossy(&victim.stdout);
    eprintln!("victim: {out} {}", String::from_utf8_lossy(&victim.stderr));
    assert!(victim.status.success(), "{out}");
    assert!(out.contains("TRANSPORT tcp"), "{out}");
    assert!(out.contains("OK"), "{out}");
    // The server saw the victim's own first bytes, nobody else's.
    let first = bounded(10, got_rx.recv()).await.unwrap();
    assert!(!first.is_empty() && !first.windows(8).any(|w| w == b"INJECTED"), "{first:?}");
    let squat = bounded(30, lines.next_line()).await.unwrap().unwrap_or_default();
    eprintln!("squatter: {squat}");
    assert!(squat.ends_with("bytes=0 fds=0"), "the squatter got something: {squat}");
}

/// A run-time change of the allowed uids reaches a door that is already open: a peer of a uid
/// that was not trusted when the listener bound gets shared memory once it is allowed, and
/// TCP again once it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allowed_uids_reach_an_open_door_at_run_time() {
    if !require_root("the_allowed_uids_reach_an_open_door_at_run_time") {
        return;
    }
    let _serial = SERIAL.lock().await;
    const PEER_UID: u32 = 65533;
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let _server = serve(l);
    let peer = || async move {
        let out = bounded(
            30,
            tokio::process::Command::new(PEER)
                .args(["client", &addr.to_string()])
                .env("SMC_TOKIO_SHM_ALLOW_UIDS", "0")
                .uid(PEER_UID)
                .gid(PEER_UID)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success() && text.contains("OK"), "{text}");
        text
    };
    assert!(peer().await.contains("TRANSPORT tcp ("), "not trusted at bind");
    let before = smc_tokio::config::global().get();
    smc_tokio::config::global().update(|s| s.shm = s.shm.clone().allow_uid(PEER_UID));
    let allowed = peer().await;
    smc_tokio::config::global().update(|s| *s = before);
    assert!(allowed.contains("TRANSPORT smc-d"), "allowed at run time: {allowed}");
    assert!(peer().await.contains("TRANSPORT tcp ("), "no longer allowed");
}

/// A run-time change of the allowed uids reaches a door connection already open: once the
/// peer's uid is no longer allowed, its next connection over the same door connection is TCP.
/// (Before, a door connection accepted while the uid was allowed kept registering, and its
/// connections kept going to shared memory, until it closed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_door_connection_whose_uid_is_revoked_is_closed_at_its_next_message() {
    if !require_root("a_door_connection_whose_uid_is_revoked_is_closed_at_its_next_message") {
        return;
    }
    // Its peer and connections are descriptors and threads the others here count.
    let _serial = SERIAL.lock().await;
    const PEER_UID: u32 = 65533;
    // A context of its own: the uids it allows change here, and nowhere else.
    let ctx = smc_tokio::Context::new();
    let before = ctx.settings().get();
    ctx.settings().update(|s| s.shm = s.shm.clone().allow_uid(PEER_UID));
    let l = SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let _server = serve(l);
    let (_peer, mut stdin, mut out) = peer_as(PEER_UID, &["client-per-line", &addr.to_string()]);
    let first = bounded(30, out.next_line()).await.unwrap().unwrap_or_default();
    let second = async {
        stdin.write_all(b"again\n").await.unwrap();
        bounded(30, out.next_line()).await.unwrap().unwrap_or_default()
    };
    let allowed = second.await;
    ctx.settings().update(|s| *s = before);
    stdin.write_all(b"again\n").await.unwrap();
    let revoked = bounded(30, out.next_line()).await.unwrap().unwrap_or_default();
    drop(stdin);
    assert_eq!(first, "TRANSPORT smc-d", "allowed");
    assert_eq!(allowed, "TRANSPORT smc-d", "allowed, on the same door connection");
    assert!(
        revoked.starts_with("TRANSPORT tcp ("),
        "no longer allowed, on the door connection opened before: {revoked}"
    );
}

/// Whom to trust is each connection's own: a door connection opened for a builder that trusts
/// another uid's listener is no door for a builder that does not. (Before, connections of one
/// runtime shared their door connections without a look at the owner, and the uid one builder
/// allowed served every builder: the second connection here went to shared memory with a
/// listener its builder did not trust.)
#[tokio::test(flavor = "current_thread")]
async fn a_door_one_builder_trusts_serves_no_builder_that_does_not() {
    use smc_tokio::config::ShmConfig;
    if !require_root("a_door_one_builder_trusts_serves_no_builder_that_does_not") {
        return;
    }
    // The plain connect below trusts what the process-wide settings say, which another test
    // here changes while it holds this.
    let _serial = SERIAL.lock().await;
    const OWNER: u32 = 65533;
    let (_child, _stdin, mut lines) = peer_as(OWNER, &["storm-serve"]);
    let port: u16 =
        bounded(10, lines.next_line()).await.unwrap().unwrap().strip_prefix("PORT ").unwrap().parse().unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    // The listener answers 1024 bytes with the same.
    let echo = |mut s: SmcStream| async move {
        let data = tests::pattern(1024);
        s.write_all(&data).await.unwrap();
        let mut back = vec![0u8; 1024];
        s.read_exact(&mut back).await.unwrap();
        assert!(back == data);
        s
    };
    let trusting = SmcStream::builder().shm(ShmConfig::default().allow_uid(OWNER));
    let first = bounded(10, trusting.connect(addr)).await.unwrap();
    assert_eq!(first.transport(), Transport::SmcD, "the builder that trusts the owner");
    let first = bounded(10, echo(first)).await;
    let second = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert!(!second.transport().is_smc(), "a builder that trusts only its own uid got {}", second.transport());
    bounded(10, echo(second)).await;
    drop(first);
}
