//! Helpers shared by the integration tests.

use std::future::Future;
use std::time::Duration;

use smc_tokio::SmcListener;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Descriptors this process has open now (`/proc/self/fd`).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// The abstract names of this process's side channels (`@smc-tokio.<pid>.<n>` in
/// `/proc/net/unix`).
pub fn side_channel_names() -> Vec<String> {
    let prefix = format!("@smc-tokio.{}.", std::process::id());
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let mut names: Vec<String> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|n| n.starts_with(&prefix))
        .map(|n| n[1..].to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Waits until the descriptor count has held still for 300 ms; returns it.
pub async fn settle_fds() -> usize {
    let mut last = open_fds();
    let mut since = std::time::Instant::now();
    while since.elapsed() < Duration::from_millis(300) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = open_fds();
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        }
    }
    last
}

/// A small deterministic PRNG (xorshift64*), so tests need no extra crates and failures
/// reproduce from the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; 0 is remapped).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// Fails the test if `fut` takes longer than `secs` seconds: no test may hang.
/// A connected SMC-D pair (client, server) with `shm` on both sides; asserts that both ends
/// are on shared memory.
pub async fn smc_pair(shm: smc_tokio::config::ShmConfig) -> (smc_tokio::SmcStream, smc_tokio::SmcStream) {
    smc_pair_in(smc_tokio::Context::global(), shm).await
}

/// [`smc_pair`], both ends in `ctx`.
pub async fn smc_pair_in(
    ctx: &smc_tokio::Context,
    shm: smc_tokio::config::ShmConfig,
) -> (smc_tokio::SmcStream, smc_tokio::SmcStream) {
    let l = SmcListener::builder().context(ctx).shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let builder = smc_tokio::SmcStream::builder().context(ctx).shm(shm);
    let (c, s) = tokio::join!(builder.connect(addr), l.accept());
    let (c, (s, _)) = (c.unwrap(), s.unwrap());
    assert_eq!(c.transport(), smc_tokio::Transport::SmcD);
    assert_eq!(s.transport(), smc_tokio::Transport::SmcD);
    (c, s)
}

pub async fn bounded<F: Future>(secs: u64, fut: F) -> F::Output {
    raise_fd_limit();
    tokio::time::timeout(Duration::from_secs(secs), fut).await.unwrap_or_else(|_| panic!("test step exceeded {secs} s"))
}

/// Two tasks peek at `server` and one waits in `poll_read_ready`, all before `client` writes;
/// all three must be woken when it does, and both peeks see its bytes (tokio wakes every
/// peeker; the `poll_*` methods keep one waker). `server` must have found nothing to read yet.
pub async fn every_peeker_is_woken(server: &smc_tokio::SmcStream, client: &mut (impl AsyncWrite + Unpin)) {
    let (mut b1, mut b2) = ([0u8; 8], [0u8; 8]);
    let mut polled = tokio_test::task::spawn(std::future::poll_fn(|cx| server.poll_read_ready(cx)));
    let mut p1 = tokio_test::task::spawn(server.peek(&mut b1));
    let mut p2 = tokio_test::task::spawn(server.peek(&mut b2));
    // The `poll_*` caller first: a peek that took its one slot after it would leave it unwoken.
    assert!(polled.poll().is_pending());
    assert!(p1.poll().is_pending());
    assert!(p2.poll().is_pending());
    client.write_all(b"peekaboo").await.unwrap();
    bounded(5, async {
        while !(p1.is_woken() && p2.is_woken() && polled.is_woken()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let (n1, n2) = match (p1.poll(), p2.poll()) {
        (std::task::Poll::Ready(n1), std::task::Poll::Ready(n2)) => (n1.unwrap(), n2.unwrap()),
        other => panic!("{other:?}"),
    };
    drop((p1, p2, polled));
    assert!(n1 > 0 && n2 > 0);
    assert_eq!(&b1[..n1], &b"peekaboo"[..n1]);
    assert_eq!(&b2[..n2], &b"peekaboo"[..n2]);
}

/// An echo server ([`spawn_echo`]) on a runtime with one worker thread of its own, which goes on
/// serving while the test's thread does other things: the runtime, to keep, and the address.
pub fn echo_server_on_own_runtime() -> (tokio::runtime::Runtime, std::net::SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let addr = rt.block_on(async {
        let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        spawn_echo(l);
        addr
    });
    (rt, addr)
}

/// Accepts connections forever and echoes each one until EOF, then half-closes.
pub fn spawn_echo(listener: SmcListener) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = conn.into_split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                let _ = wr.shutdown().await;
            });
        }
    })
}

/// Writes `data` in random-sized pieces while reading the echo in random-sized pieces, then
/// checks the echo byte for byte. Sizes go up to `max_io` bytes.
pub async fn echo_check<S>(stream: S, data: &[u8], max_io: usize, seed: u64)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut wrng = Rng::new(seed);
    let mut rrng = Rng::new(seed ^ 0xABCD);
    let writer = async {
        let mut at = 0;
        while at < data.len() {
            let n = wrng.range(1, max_io).min(data.len() - at);
            wr.write_all(&data[at..at + n]).await.expect("write");
            at += n;
        }
        wr.shutdown().await.expect("shutdown");
    };
    let reader = async {
        let mut got = Vec::with_capacity(data.len());
        let mut buf = vec![0u8; max_io];
        loop {
            let n = rrng.range(1, max_io);
            let k = rd.read(&mut buf[..n]).await.expect("read");
            if k == 0 {
                break;
            }
            got.extend_from_slice(&buf[..k]);
        }
        got
    };
    let ((), got) = tokio::join!(writer, reader);
    assert_eq!(got.len(), data.len(), "echo length");
    if let Some(i) = got.iter().zip(data).position(|(a, b)| a != b) {
        panic!("echo differs first at byte {i}");
    }
}

/// Raises this process's soft limit on open descriptors towards its hard limit (to at most
/// 65 536), once. A login shell often gives 1 024, and tests that open a thousand sockets at
/// once, with the tests beside them in the same process, need more; the peers a test starts
/// inherit it. Called by [`bounded`], and first thing by the tests that open the most.
pub fn raise_fd_limit() {
    smc_tokio::faults::raise_fd_limit();
}

/// Whether this test process runs as root, which tests that run a peer as another uid (or set
/// up network namespaces) need. When it does not, the test fails with a clear message unless
/// `SMC_TOKIO_SKIP_ROOT_TESTS=1` says to skip such tests (so a skip is always a decision, never
/// a silent pass); returns whether the test should go on.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var("SMC_TOKIO_SKIP_ROOT_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: needs root (SMC_TOKIO_SKIP_ROOT_TESTS=1)");
        return false;
    }
    panic!("{test} needs root (it runs a peer as another uid); run the tests as root, or set SMC_TOKIO_SKIP_ROOT_TESTS=1 to skip it");
}

/// Another host, for tests that need a peer whose address is not this host's: a network
/// namespace joined to ours by a veth pair, `here` on our end, `there` on its end. Root only
/// (see [`require_root`]); needs iproute2. Removed when dropped.
#[derive(Debug)]
pub struct OtherHost {
    pub ns: String,
    veth: String,
    pub here: std::net::IpAddr,
    pub there: std::net::IpAddr,
}

impl OtherHost {
    /// Sets the namespace and its link up; panics, saying which step failed, when it cannot.
    pub fn start() -> OtherHost {
        assert!(
            std::process::Command::new("ip").arg("-V").output().is_ok(),
            "tests with another host need iproute2 (`ip`; .ci/run installs it)"
        );
        let pid = std::process::id();
        // Several test binaries may run at once: the names and subnet are the process's.
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ns = format!("smct{pid}x{k}");
        let (veth, peer) = (format!("vh{}x{k}", pid % 100_000), format!("vp{}x{k}", pid % 100_000));
        let net = format!("10.{}.{}", 100 + k % 100, pid % 250);
        let host = OtherHost {
            ns: ns.clone(),
            veth: veth.clone(),
            here: format!("{net}.1").parse().unwrap(),
            there: format!("{net}.2").parse().unwrap(),
        };
        let sh = |args: String| {
            let ok =
                std::process::Command::new("sh").arg("-c").arg(&args).status().map(|s| s.success()).unwrap_or(false);
            assert!(ok, "setting up another host failed: {args}");
        };
        sh(format!("ip netns add {ns}"));
        sh(format!("ip link add {veth} type veth peer name {peer}"));
        sh(format!("ip link set {peer} netns {ns}"));
        sh(format!("ip addr add {}/24 dev {veth} && ip link set {veth} up", host.here));
        sh(format!("ip netns exec {ns} ip addr add {}/24 dev {peer}", host.there));
        sh(format!("ip netns exec {ns} ip link set {peer} up && ip netns exec {ns} ip link set lo up"));
        host
    }

    /// A TCP connection to `addr` from the other host (a socket made in its namespace).
    pub fn connect(&self, addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
        let path = format!("/var/run/netns/{}", self.ns);
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let f = std::fs::File::open(path)?;
            // SAFETY: `f` is an open namespace file; setns moves only this thread, which
            // exits right after making the socket (the socket keeps its namespace).
            if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            std::net::TcpStream::connect(addr)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the connecting thread panicked")))
    }
}

impl Drop for OtherHost {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", &self.veth]).status();
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// Starts the test peer `bin` (an integration test passes `env!("CARGO_BIN_EXE_smc-test-peer")`)
/// as `uid` (and the same gid, no supplementary groups) with `args`; returns it (killed when
/// dropped) and its output lines.
pub fn peer_as(
    bin: &str,
    uid: u32,
    args: &[&str],
) -> (tokio::process::Child, tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(bin)
        .args(args)
        .uid(uid)
        .gid(uid)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// `n` bytes of a fixed pattern (period 251, so no power-of-two ring size lines up with it): a
/// reader that compares what it got with `pattern(n)` catches lost, repeated or reordered bytes.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ 0x5A).collect()
}

/// The `smc-rdma-test` cases of every mode (one guest, and the client across two), in their
/// order; one guest runs more after them.
pub const RDMA_CASES: [&str; 12] = [
    "handshake_smc_r",
    "integrity_random_sizes",
    "connections_100",
    "first_contact_100",
    "cork_sendfile_from_server",
    "cork_sendfile_to_server",
    "half_close",
    "abort",
    "corrupt_cdc_fails_one_connection",
    "no_device_falls_back",
    "hand_back_mid_stream",
    "link_failure_moves_to_tcp",
];

/// Runs `smc-rdma-test` (`bin`: the test's `CARGO_BIN_EXE_smc-rdma-test`) through the test bed
/// in `mode` (`single` or `two`), without the perftest baseline, giving the whole run 600 s in
/// the guest (it takes about two minutes under emulation, past the test bed's 120 s default per
/// command); see [`run_test_bed`] for `consoles`, `shown` and the result.
pub fn run_rdma_test(mode: &str, bin: &str, consoles: &[&str], shown: impl Fn(&str) -> bool) -> Option<String> {
    let args = [mode, "--bin", bin, "--env", "RDMA_VM_SKIP_BASELINE=1", "--env", "SMC_RDMA_TEST_TIMEOUT=600"];
    run_test_bed(&[&args[..], &["--timeout", "900"]].concat(), consoles, shown)
}

/// Asserts that a test-bed console says `PASS` for every one of `cases` and `FAIL` for none.
pub fn assert_cases_passed<'a>(console: &str, cases: impl IntoIterator<Item = &'a str>) {
    for case in cases {
        assert!(
            console.contains(&format!("PASS {case} ")),
            "case {case} did not pass:
{console}"
        );
    }
    assert!(!console.contains("\nFAIL"), "a case failed:\n{console}");
}

/// Runs the soft-RoCE test bed (`tests/rdma-vm/run.sh`) with `args` (plus `--quiet` and its
/// own `--out` directory) and returns the guests' consoles (`consoles`: the files the mode
/// writes, such as `single.log`), joined, once it exited 0. `None`: `SMC_TOKIO_SKIP_RDMA_VM=1`
/// said to leave it out (it says so).
///
/// The emulated guest kernel's rxe driver has crashed now and then under heavy host load (a
/// slab corruption in the rxe work queue's skb allocations, also during perftest's own runs,
/// most often in the two-guest mode), and its SMC-R has hung a client's exit in the kernel
/// (a task and a kworker blocked for minutes, in the kernel-interop mode, after every transfer
/// had completed and been checked on the server's side): those outcomes (status 125, no
/// result marker) are tried up to three times in all; any other non-zero status panics with
/// the consoles. (A hang after the result marker, in the guest's power-off, is the test bed's
/// to end: it stops the guest and keeps the result.) `shown` picks the console lines worth
/// printing on the way.
pub fn run_test_bed(args: &[&str], consoles: &[&str], shown: impl Fn(&str) -> bool) -> Option<String> {
    if std::env::var("SMC_TOKIO_SKIP_RDMA_VM").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: SMC_TOKIO_SKIP_RDMA_VM=1");
        return None;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/rdma-vm/run.sh");
    // Runs of one test binary go on at once (its tests run in parallel): a directory each.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    const ATTEMPTS: u32 = 3;
    for attempt in 1..=ATTEMPTS {
        let out_dir =
            std::env::temp_dir().join(format!("smc-rdma-vm-{}-{}-{run}-{attempt}", args[0], std::process::id()));
        let _ = std::fs::remove_dir_all(&out_dir);
        let out = std::process::Command::new("bash")
            .arg(script)
            .args(args)
            .arg("--quiet")
            .arg("--out")
            .arg(&out_dir)
            .output()
            .expect("run tests/rdma-vm/run.sh");
        let console = consoles
            .iter()
            .map(|f| std::fs::read_to_string(out_dir.join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        eprintln!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        for line in console.lines().filter(|l| shown(l)) {
            eprintln!("guest: {line}");
        }
        match out.status.code() {
            Some(0) => {
                let _ = std::fs::remove_dir_all(&out_dir);
                return Some(console);
            }
            Some(125) if attempt < ATTEMPTS => {
                eprintln!("a guest printed no result (its kernel crashed or hung); trying again")
            }
            other => panic!("the soft-RoCE test bed failed with {other:?}; console:\n{console}"),
        }
    }
    unreachable!("the last attempt returns or panics")
}

/// Writes `data` with `try_write` (so a mover can hold `&SmcStream` meanwhile), counting what went.
pub async fn write_all_shared(s: &smc_tokio::SmcStream, data: &[u8], sent: &std::sync::atomic::AtomicU64) {
    let mut at = 0;
    while at < data.len() {
        s.writable().await.unwrap();
        // Small and uneven writes, so cut points fall anywhere in a ring.
        let end = (at + 1 + (at * 7919) % 60_000).min(data.len());
        match s.try_write(&data[at..end]) {
            Ok(n) => {
                at += n;
                sent.store(at as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("write: {e}"),
        }
    }
}

/// Reads exactly `n` bytes with `try_read`; also returns the longest wait between two reads
/// that returned bytes.
pub async fn read_n_shared(s: &smc_tokio::SmcStream, n: usize) -> (Vec<u8>, Duration) {
    let mut got = vec![0u8; n];
    let mut at = 0;
    let (mut last, mut gap) = (std::time::Instant::now(), Duration::ZERO);
    while at < n {
        s.readable().await.unwrap();
        match s.try_read(&mut got[at..]) {
            Ok(0) => panic!("eof after {at} of {n} bytes"),
            Ok(k) => {
                at += k;
                gap = gap.max(last.elapsed());
                last = std::time::Instant::now();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("read after {at} of {n} bytes: {e}"),
        }
    }
    (got, gap)
}
