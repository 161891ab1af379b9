//! `smcperf`: the project's sockperf/qperf. Measures smc-tokio beside tokio's own `TcpStream` and
//! `UnixStream` in the same run and prints ratios against TCP.
//!
//! ```text
//! smcperf local [OPTIONS]                 server and client in one process, separate threads
//! smcperf server --listen ADDR [--unix PATH]
//! smcperf client --connect ADDR [--unix PATH] [OPTIONS]
//!
//! OPTIONS
//!   --scenario LIST    rr,stream,crr,file                (default: rr,stream,crr)
//!   --size LIST        message/write/file sizes in bytes (rr: 14,1024; stream: 65536; crr: 64;
//!                      file: 4096)
//!   --transport LIST   smc,tcp,unix                      (default: smc,tcp,unix)
//!   --conns N          rr: connections, crr/file: concurrent clients (rr: 1, crr: 64, file: 100)
//!   --duration SECS    measured time per run             (default 1.5)
//!   --runs N           runs per configuration; medians are reported (default 1)
//!   --rmb-size BYTES   smc receive ring size per connection and direction (default: crate's)
//!   --busy-poll US     smc busy-poll budget before sleeping, microseconds (default 0: off)
//!   --inline-max BYTES smc writes up to this size ride inline in the CDC message when idle (0: off)
//!   --autocork BYTES   smc autocork size (0: off)
//!   --limit-handshake on|off  the listeners' handshake limit (process-wide setting)
//!   --max-pending N    handshakes a listener runs at once (process-wide setting)
//!   --adaptive-min-bytes N  adaptive fallback threshold for smc clients (0: off)
//!   --shm on|off       offer/accept shared memory (off: two processes on one host meet over
//!                      RDMA when built with the `rdma` feature; the soft-RoCE guests use it)
//!   --pin              pin server and client threads to different CPUs (local)
//!   --json             print one JSON document instead of the table
//! ```
//!
//! Protocol between client and server: each connection starts with an 8-byte header
//! (`mode: u32`, `size: u32`, little endian). `rr` and `crr`: the server echoes `size`-byte
//! messages until EOF. `stream`: the server reads until EOF, then answers with the byte count
//! (u64), so the client's clock stops when the server has everything. `file`: HTTP/1.1
//! keep-alive GETs of a `size`-byte file from the `file_server` example's logic, in four
//! variants: smc with cork + sendfile, smc with plain writes, smc with sendfile and no cork, and
//! tokio TCP with plain writes (the server's listeners are the main port + 1 and + 2).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde_json::json;
use smc_tokio::config::ShmConfig;
use smc_tokio::{Policy, SmcListener, SmcStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

const MODE_RR: u32 = 1;
const MODE_STREAM: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Rr,
    Stream,
    Crr,
    File,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Rr => "rr",
            Scenario::Stream => "stream",
            Scenario::Crr => "crr",
            Scenario::File => "file",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Smc,
    Tcp,
    Unix,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Smc => "smc",
            Kind::Tcp => "tcp",
            Kind::Unix => "unix",
        }
    }
}

#[derive(Debug, Clone)]
struct Opts {
    scenarios: Option<Vec<Scenario>>,
    sizes: Option<Vec<usize>>,
    transports: Vec<Kind>,
    conns: Option<usize>,
    duration: Duration,
    runs: usize,
    pin: bool,
    json: bool,
    listen: Option<String>,
    connect: Option<String>,
    unix: Option<PathBuf>,
    shm: ShmConfig,
}

fn usage() -> &'static str {
    "usage: smcperf <local|server|client> [--scenario rr,stream,crr] [--size N,..] \
     [--transport smc,tcp,unix] [--conns N] [--duration SECS] [--runs N] [--rmb-size N] \
     [--busy-poll US] [--shm on|off] [--pin] [--json] \
     [--listen ADDR] [--connect ADDR] [--unix PATH]"
}

fn parse_list<T>(v: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    v.split(',').filter(|s| !s.is_empty()).map(|s| f(s.trim())).collect()
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.to_ascii_lowercase() {
        x if x.ends_with("kib") || x.ends_with('k') => {
            (x.trim_end_matches("kib").trim_end_matches('k').to_string(), 1024)
        }
        x if x.ends_with("mib") || x.ends_with('m') => {
            (x.trim_end_matches("mib").trim_end_matches('m').to_string(), 1 << 20)
        }
        x => (x, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    if n == 0 || n * mul > 64 << 20 {
        return Err(format!("size {s:?} must be 1 byte ..= 64 MiB"));
    }
    Ok(n * mul)
}

fn parse(args: &[String]) -> Result<(String, Opts), String> {
    let mut it = args.iter();
    let cmd = it.next().cloned().ok_or_else(|| usage().to_string())?;
    let mut o = Opts {
        scenarios: None,
        sizes: None,
        transports: vec![Kind::Smc, Kind::Tcp, Kind::Unix],
        conns: None,
        duration: Duration::from_millis(1500),
        runs: 1,
        pin: false,
        json: false,
        listen: None,
        connect: None,
        unix: None,
        shm: ShmConfig::default(),
    };
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--scenario" => {
                o.scenarios = Some(parse_list(&val()?, |s| match s {
                    "rr" => Ok(Scenario::Rr),
                    "stream" => Ok(Scenario::Stream),
                    "crr" => Ok(Scenario::Crr),
                    "file" => Ok(Scenario::File),
                    _ => Err(format!("unknown scenario {s:?}")),
                })?)
            }
            "--size" => o.sizes = Some(parse_list(&val()?, parse_size)?),
            "--transport" => {
                o.transports = parse_list(&val()?, |s| match s {
                    "smc" => Ok(Kind::Smc),
                    "tcp" => Ok(Kind::Tcp),
                    "unix" => Ok(Kind::Unix),
                    _ => Err(format!("unknown transport {s:?}")),
                })?
            }
            "--conns" => o.conns = Some(val()?.parse().map_err(|_| "bad --conns")?),
            "--duration" => {
                let secs: f64 = val()?.parse().map_err(|_| "bad --duration")?;
                if !(0.05..=3600.0).contains(&secs) {
                    return Err("--duration must be 0.05 ..= 3600 seconds".into());
                }
                o.duration = Duration::from_secs_f64(secs);
            }
            "--runs" => o.runs = val()?.parse().map_err(|_| "bad --runs")?,
            "--rmb-size" => o.shm = o.shm.clone().rmb_size(parse_size(&val()?)? as u32),
            "--busy-poll" => {
                let us: u64 = val()?.parse().map_err(|_| "bad --busy-poll")?;
                o.shm = o.shm.clone().busy_poll(Duration::from_micros(us));
            }
            "--inline-max" => o.shm = o.shm.clone().inline_max(val()?.parse().map_err(|_| "bad --inline-max")?),
            "--autocork" => {
                let v = val()?;
                let n = if v == "0" { 0 } else { parse_size(&v)? as u32 };
                o.shm = o.shm.clone().autocork(n);
            }
            "--limit-handshake" => {
                let on = match val()?.as_str() {
                    "on" | "1" => true,
                    "off" | "0" => false,
                    v => return Err(format!("--limit-handshake takes on|off, not {v:?}")),
                };
                smc_tokio::config::global().update(|s| s.limit_handshake = on);
            }
            "--adaptive-min-bytes" => {
                let n: u64 = val()?.parse().map_err(|_| "bad --adaptive-min-bytes")?;
                smc_tokio::config::global().update(|s| s.adaptive_min_bytes = n);
            }
            "--max-pending" => {
                let n: usize = val()?.parse().map_err(|_| "bad --max-pending")?;
                smc_tokio::config::global().update(|s| s.max_pending_handshakes = n.max(1));
            }
            "--shm" => match val()?.as_str() {
                "on" => o.shm = o.shm.clone().enabled(true),
                "off" => o.shm = o.shm.clone().enabled(false),
                v => return Err(format!("--shm takes on|off, not {v:?}")),
            },
            "--pin" => o.pin = true,
            "--json" => o.json = true,
            "--listen" => o.listen = Some(val()?),
            "--connect" => o.connect = Some(val()?),
            "--unix" => o.unix = Some(PathBuf::from(val()?)),
            "-h" | "--help" => return Err(usage().to_string()),
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    if o.runs == 0 || o.conns == Some(0) {
        return Err("--runs and --conns must be at least 1".into());
    }
    if o.transports.is_empty() {
        return Err("--transport needs at least one transport".into());
    }
    Ok((cmd, o))
}

/// One configuration to measure.
#[derive(Debug, Clone, Copy)]
struct Case {
    scenario: Scenario,
    size: usize,
    conns: usize,
}

fn cases(o: &Opts) -> Vec<Case> {
    let scenarios = o.scenarios.clone().unwrap_or(vec![Scenario::Rr, Scenario::Stream, Scenario::Crr]);
    let mut out = Vec::new();
    for s in scenarios {
        let sizes = o.sizes.clone().unwrap_or(match s {
            Scenario::Rr => vec![14, 1024],
            Scenario::Stream => vec![65536],
            Scenario::Crr => vec![64],
            Scenario::File => vec![4096],
        });
        let conns = o.conns.unwrap_or(match s {
            Scenario::Crr => 64,
            Scenario::File => 100,
            _ => 1,
        });
        for size in sizes {
            out.push(Case { scenario: s, size, conns });
        }
    }
    out
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
struct Measure {
    negotiated: String,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    ops_per_s: f64,
    bytes_per_s: f64,
    errors: u64,
}

/// Where the client connects.
#[derive(Debug, Clone)]
struct Target {
    tcp: SocketAddr,
    unix: Option<PathBuf>,
    shm: ShmConfig,
    /// The file server: over an `SmcListener`, and over a tokio `TcpListener`.
    file_smc: SocketAddr,
    file_tcp: SocketAddr,
}

/// The `file` scenario's rows: transport and how the server writes the response.
const FILE_VARIANTS: [(Kind, &str); 4] =
    [(Kind::Smc, "cork-sendfile"), (Kind::Smc, "write"), (Kind::Smc, "sendfile"), (Kind::Tcp, "write")];

// ---------------------------------------------------------------------------------------------
// A stream of any of the three kinds.

enum Conn {
    Smc(SmcStream),
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn negotiated(&self) -> &'static str {
        match self {
            Conn::Smc(s) => s.transport().as_str(),
            Conn::Tcp(_) => "tcp",
            Conn::Unix(_) => "unix",
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Smc(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Smc(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Smc(s) => Pin::new(s).poll_flush(cx),
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Smc(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

async fn connect(kind: Kind, target: &Target) -> io::Result<Conn> {
    Ok(match kind {
        Kind::Smc => {
            let s = SmcStream::builder().policy(Policy::Auto).shm(target.shm.clone()).connect(target.tcp).await?;
            s.set_nodelay(true)?;
            Conn::Smc(s)
        }
        Kind::Tcp => {
            let s = TcpStream::connect(target.tcp).await?;
            s.set_nodelay(true)?;
            Conn::Tcp(s)
        }
        Kind::Unix => {
            let path = target.unix.as_ref().ok_or_else(|| io::Error::other("no --unix path for the unix transport"))?;
            Conn::Unix(UnixStream::connect(path).await?)
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Server

async fn serve_conn<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> io::Result<()> {
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr).await?;
    let mode = u32::from_le_bytes(hdr[..4].try_into().unwrap_or_default());
    let size = u32::from_le_bytes(hdr[4..].try_into().unwrap_or_default()) as usize;
    if size == 0 || size > 64 << 20 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad size"));
    }
    let mut buf = vec![0u8; size.max(65536)];
    match mode {
        MODE_RR => loop {
            match s.read_exact(&mut buf[..size]).await {
                Ok(_) => s.write_all(&buf[..size]).await?,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        },
        MODE_STREAM => {
            let mut total = 0u64;
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            s.write_all(&total.to_le_bytes()).await?;
            s.shutdown().await
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "bad mode")),
    }
}

struct ServerHandles {
    tcp_addr: SocketAddr,
    unix: Option<PathBuf>,
    file_smc: SocketAddr,
    file_tcp: SocketAddr,
}

/// The directory the file server serves: files `f<size>` of random bytes.
fn file_sizes(o: &Opts) -> Vec<usize> {
    cases(o).iter().filter(|c| c.scenario == Scenario::File).map(|c| c.size).collect()
}

fn www_root() -> PathBuf {
    std::env::temp_dir().join(format!("smcperf-www-{}", std::process::id()))
}

fn make_files(sizes: &[usize]) -> io::Result<()> {
    let root = www_root();
    std::fs::create_dir_all(&root)?;
    for &n in sizes {
        let data: Vec<u8> = (0..n).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        std::fs::write(root.join(format!("f{n}")), data)?;
    }
    Ok(())
}

/// Starts the listeners on the current runtime: an `SmcListener` (which also serves the plain
/// `tcp` clients, over TCP), a tokio `TcpListener` on the next port for the tcp baseline, and a
/// `UnixListener`.
async fn start_server(listen: &str, unix: Option<PathBuf>, shm: ShmConfig) -> io::Result<(ServerHandles, SocketAddr)> {
    let smc = SmcListener::builder().shm(shm.clone()).bind(listen).await?;
    let smc_addr = smc.local_addr()?;
    tokio::spawn(async move {
        loop {
            match smc.accept().await {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    tokio::spawn(serve_conn(s));
                }
                Err(e) => {
                    eprintln!("smcperf server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    });
    let tcp = TcpListener::bind(SocketAddr::new(smc_addr.ip(), 0)).await?;
    let tcp_addr = tcp.local_addr()?;
    tokio::spawn(async move {
        loop {
            match tcp.accept().await {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    tokio::spawn(serve_conn(s));
                }
                Err(e) => {
                    eprintln!("smcperf server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    });
    // The file server, on the next two ports when the main one is fixed.
    let port = |k: u16| if smc_addr.port() == 0 || listen.ends_with(":0") { 0 } else { smc_addr.port() + k };
    let file_smc = SmcListener::builder().shm(shm).bind(SocketAddr::new(smc_addr.ip(), port(1))).await?;
    let file_tcp = TcpListener::bind(SocketAddr::new(smc_addr.ip(), port(2))).await?;
    let (file_smc_addr, file_tcp_addr) = (file_smc.local_addr()?, file_tcp.local_addr()?);
    let root = Arc::new(www_root());
    let r = root.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = file_smc.accept().await {
            let _ = s.set_nodelay(true);
            let r = r.clone();
            tokio::spawn(async move { examples::serve_smc(s, &r, examples::ServeMode::CORK_SENDFILE).await });
        }
    });
    tokio::spawn(async move {
        while let Ok((s, _)) = file_tcp.accept().await {
            let _ = s.set_nodelay(true);
            let r = root.clone();
            tokio::spawn(async move { examples::serve_plain(s, &r).await });
        }
    });
    if let Some(path) = &unix {
        let _ = std::fs::remove_file(path);
        let ul = UnixListener::bind(path)?;
        tokio::spawn(async move {
            while let Ok((s, _)) = ul.accept().await {
                tokio::spawn(serve_conn(s));
            }
        });
    }
    Ok((ServerHandles { tcp_addr, unix, file_smc: file_smc_addr, file_tcp: file_tcp_addr }, smc_addr))
}

// ---------------------------------------------------------------------------------------------
// Client scenarios

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

async fn header(c: &mut Conn, mode: u32, size: usize) -> io::Result<()> {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&mode.to_le_bytes());
    h[4..].copy_from_slice(&(size as u32).to_le_bytes());
    c.write_all(&h).await
}

async fn run_rr(kind: Kind, target: &Target, case: Case, dur: Duration) -> io::Result<Measure> {
    let mut conns = Vec::new();
    for _ in 0..case.conns {
        let mut c = connect(kind, target).await?;
        header(&mut c, MODE_RR, case.size).await?;
        conns.push(c);
    }
    let negotiated = conns[0].negotiated().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let warmup = dur / 10;
    let mut tasks = Vec::new();
    for mut c in conns {
        let stop = stop.clone();
        let size = case.size;
        tasks.push(tokio::task::spawn_local(async move {
            let msg = vec![0x5au8; size];
            let mut back = vec![0u8; size];
            let mut lat = Vec::with_capacity(1 << 16);
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                c.write_all(&msg).await?;
                c.read_exact(&mut back).await?;
                if t.duration_since(start) >= warmup {
                    lat.push(t.elapsed().as_nanos() as u64);
                }
            }
            c.shutdown().await?;
            io::Result::Ok(lat)
        }));
    }
    measure(&stop, tasks, dur + warmup, dur, negotiated, case.size, 0).await
}

async fn run_stream(kind: Kind, target: &Target, case: Case, dur: Duration) -> io::Result<Measure> {
    let mut c = connect(kind, target).await?;
    let negotiated = c.negotiated().to_string();
    header(&mut c, MODE_STREAM, case.size).await?;
    let buf = vec![0xa5u8; case.size];
    let start = Instant::now();
    let mut sent = 0u64;
    let mut writes = 0u64;
    while start.elapsed() < dur {
        // Check the clock every 64 writes: Instant::now costs ~20 ns, a 64 B write ~1 us.
        for _ in 0..64 {
            c.write_all(&buf).await?;
            sent += buf.len() as u64;
            writes += 1;
        }
    }
    c.shutdown().await?;
    let mut total = [0u8; 8];
    c.read_exact(&mut total).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let got = u64::from_le_bytes(total);
    if got != sent {
        return Err(io::Error::other(format!("server counted {got} bytes, client sent {sent}")));
    }
    Ok(Measure {
        negotiated,
        ops_per_s: writes as f64 / elapsed,
        bytes_per_s: got as f64 / elapsed,
        ..Measure::default()
    })
}

async fn run_crr(kind: Kind, target: &Target, case: Case, dur: Duration) -> io::Result<Measure> {
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let negotiated = Arc::new(std::sync::Mutex::new(String::new()));
    let warmup = dur / 10;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..case.conns {
        let (stop, errors, negotiated, target) = (stop.clone(), errors.clone(), negotiated.clone(), target.clone());
        let size = case.size;
        tasks.push(tokio::task::spawn_local(async move {
            let msg = vec![0x3cu8; size];
            let mut back = vec![0u8; size];
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let once = async {
                    let mut c = connect(kind, &target).await?;
                    let mut first = Vec::with_capacity(8 + size);
                    first.extend_from_slice(&MODE_RR.to_le_bytes());
                    first.extend_from_slice(&(size as u32).to_le_bytes());
                    first.extend_from_slice(&msg);
                    c.write_all(&first).await?;
                    c.read_exact(&mut back).await?;
                    io::Result::Ok(c.negotiated())
                };
                match once.await {
                    Ok(neg) => {
                        if t.duration_since(start) >= warmup {
                            lat.push(t.elapsed().as_nanos() as u64);
                        }
                        let mut n = negotiated.lock().unwrap_or_else(|e| e.into_inner());
                        if n.is_empty() {
                            *n = neg.to_string();
                        } else if n.as_str() != neg && !n.contains('+') {
                            // Mixed outcomes are reported, never hidden.
                            *n = format!("{n}+{neg}");
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            io::Result::Ok(lat)
        }));
    }
    let mut m = measure(&stop, tasks, dur + warmup, dur, String::new(), 0, 0).await?;
    m.negotiated = negotiated.lock().unwrap_or_else(|e| e.into_inner()).clone();
    m.errors = errors.load(Ordering::Relaxed);
    Ok(m)
}

/// Lets the clients run for `run` (warm-up included), stops them, and turns the latencies they
/// recorded over the measured `dur` into a [`Measure`] (operations of `size` bytes each).
async fn measure(
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<io::Result<Vec<u64>>>>,
    run: Duration,
    dur: Duration,
    negotiated: String,
    size: usize,
    errors: u64,
) -> io::Result<Measure> {
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(io::Error::other)??);
    }
    all.sort_unstable();
    let n = all.len() as f64;
    Ok(Measure {
        negotiated,
        p50_us: percentile(&all, 0.5),
        p99_us: percentile(&all, 0.99),
        p999_us: percentile(&all, 0.999),
        ops_per_s: n / dur.as_secs_f64(),
        bytes_per_s: n * size as f64 / dur.as_secs_f64(),
        errors,
    })
}

async fn run_case(
    kind: Kind,
    variant: &'static str,
    target: &Target,
    case: Case,
    dur: Duration,
) -> io::Result<Measure> {
    match case.scenario {
        Scenario::Rr => run_rr(kind, target, case, dur).await,
        Scenario::Stream => run_stream(kind, target, case, dur).await,
        Scenario::Crr => run_crr(kind, target, case, dur).await,
        Scenario::File => run_file(kind, variant, target, case, dur).await,
    }
}

/// `conns` keep-alive HTTP/1.1 clients fetching the `size`-byte file as fast as they can; the
/// server writes each response as `variant` says.
async fn run_file(
    kind: Kind,
    variant: &'static str,
    target: &Target,
    case: Case,
    dur: Duration,
) -> io::Result<Measure> {
    let stop = Arc::new(AtomicBool::new(false));
    let warmup = dur / 10;
    let start = Instant::now();
    let request = format!("GET /f{}?mode={variant} HTTP/1.1\r\nhost: smcperf\r\n\r\n", case.size).into_bytes();
    let mut tasks = Vec::new();
    let mut negotiated = String::new();
    for _ in 0..case.conns {
        let mut c = match kind {
            Kind::Smc => {
                let s = SmcStream::builder().shm(target.shm.clone()).connect(target.file_smc).await?;
                s.set_nodelay(true)?;
                Conn::Smc(s)
            }
            _ => {
                let s = TcpStream::connect(target.file_tcp).await?;
                s.set_nodelay(true)?;
                Conn::Tcp(s)
            }
        };
        negotiated = c.negotiated().to_string();
        let (stop, request, size) = (stop.clone(), request.clone(), case.size);
        tasks.push(tokio::task::spawn_local(async move {
            let mut lat = Vec::with_capacity(1 << 14);
            let mut buf = Vec::with_capacity(2 * size + 512);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                c.write_all(&request).await?;
                let n = examples::read_response(&mut c, &mut buf).await?;
                if n != size {
                    return Err(io::Error::other(format!("response of {n} bytes, expected {size}")));
                }
                if t.duration_since(start) >= warmup {
                    lat.push(t.elapsed().as_nanos() as u64);
                }
            }
            io::Result::Ok(lat)
        }));
    }
    measure(&stop, tasks, dur + warmup, dur, negotiated, case.size, 0).await
}

// ---------------------------------------------------------------------------------------------
// Results

#[derive(Debug, Clone)]
struct Row {
    case: Case,
    kind: Kind,
    /// The file scenario's response mode; empty elsewhere.
    variant: &'static str,
    m: Measure,
    runs: usize,
}

impl Row {
    fn transport(&self) -> String {
        if self.variant.is_empty() {
            self.kind.name().to_string()
        } else {
            format!("{}/{}", self.kind.name(), self.variant)
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn combine(runs: Vec<Measure>) -> Measure {
    let pick = |f: fn(&Measure) -> f64| median(runs.iter().map(f).collect());
    let mut negotiated: Vec<&str> = runs.iter().map(|m| m.negotiated.as_str()).collect();
    negotiated.dedup();
    Measure {
        negotiated: negotiated.join("|"),
        p50_us: pick(|m| m.p50_us),
        p99_us: pick(|m| m.p99_us),
        p999_us: pick(|m| m.p999_us),
        ops_per_s: pick(|m| m.ops_per_s),
        bytes_per_s: pick(|m| m.bytes_per_s),
        errors: runs.iter().map(|m| m.errors).sum(),
    }
}

/// The ratio against tcp for the row's headline metric: p50 latency for rr (lower is better),
/// throughput for stream and connections/s for crr (higher is better).
fn ratio(row: &Row, rows: &[Row]) -> Option<f64> {
    let tcp = rows.iter().find(|r| {
        r.kind == Kind::Tcp
            && r.case.scenario == row.case.scenario
            && r.case.size == row.case.size
            && r.case.conns == row.case.conns
    })?;
    let (a, b) = match row.case.scenario {
        Scenario::Rr => (row.m.p50_us, tcp.m.p50_us),
        Scenario::Stream => (row.m.bytes_per_s, tcp.m.bytes_per_s),
        Scenario::Crr | Scenario::File => (row.m.ops_per_s, tcp.m.ops_per_s),
    };
    (b > 0.0).then(|| a / b)
}

/// For the file scenario: each smc row's requests/s against smc with plain writes.
fn ratio_vs_smc_write(row: &Row, rows: &[Row]) -> Option<f64> {
    if row.case.scenario != Scenario::File || row.kind != Kind::Smc {
        return None;
    }
    let base = rows.iter().find(|r| {
        r.kind == Kind::Smc && r.variant == "write" && r.case.size == row.case.size && r.case.conns == row.case.conns
    })?;
    (base.m.ops_per_s > 0.0).then(|| row.m.ops_per_s / base.m.ops_per_s)
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<7} {:>7} {:>5} {:<18} {:<12} {:>9} {:>9} {:>9} {:>11} {:>10} {:>8}  vs tcp",
        "scen", "size", "conns", "trans", "negotiated", "p50_us", "p99_us", "p999_us", "ops/s", "MB/s", "errors"
    );
    for r in rows {
        let vs = match ratio(r, rows) {
            Some(x) => {
                let what = match r.case.scenario {
                    Scenario::Rr => "p50 latency",
                    Scenario::Stream => "throughput",
                    Scenario::Crr => "conn/s",
                    Scenario::File => "req/s",
                };
                match ratio_vs_smc_write(r, rows) {
                    Some(y) => format!("{x:.2}x {what} ({y:.2}x smc/write)"),
                    None => format!("{x:.2}x {what}"),
                }
            }
            None => "-".into(),
        };
        println!(
            "{:<7} {:>7} {:>5} {:<18} {:<12} {:>9.1} {:>9.1} {:>9.1} {:>11.0} {:>10.1} {:>8}  {}",
            r.case.scenario.name(),
            r.case.size,
            r.case.conns,
            r.transport(),
            r.m.negotiated,
            r.m.p50_us,
            r.m.p99_us,
            r.m.p999_us,
            r.m.ops_per_s,
            r.m.bytes_per_s / 1e6,
            r.m.errors,
            vs
        );
    }
}

fn print_json(rows: &[Row], opts: &Opts) {
    let results: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "scenario": r.case.scenario.name(),
                "transport": r.transport(),
                "negotiated": r.m.negotiated,
                "size": r.case.size,
                "conns": r.case.conns,
                "p50_us": r.m.p50_us,
                "p99_us": r.m.p99_us,
                "p999_us": r.m.p999_us,
                "ops_per_s": r.m.ops_per_s,
                "bytes_per_s": r.m.bytes_per_s,
                "errors": r.m.errors,
                "runs": r.runs,
                "ratio_vs_tcp": ratio(r, rows),
                "ratio_vs_smc_write": ratio_vs_smc_write(r, rows),
            })
        })
        .collect();
    let doc = json!({
        "tool": "smcperf",
        "duration_s": opts.duration.as_secs_f64(),
        "pinned": opts.pin,
        "stats": smc_tokio::stats().to_string(),
        "results": results,
    });
    println!("{doc:#}");
}

// ---------------------------------------------------------------------------------------------
// Modes

fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it, and
    // sched_setaffinity(0, ..) reads it for the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("smcperf: could not pin to cpu {cpu}: {}", io::Error::last_os_error());
        }
    }
}

fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

fn run_client(opts: &Opts, target: &Target) -> io::Result<Vec<Row>> {
    let rt = runtime()?;
    let local = tokio::task::LocalSet::new();
    let mut rows = Vec::new();
    for case in cases(opts) {
        let variants: Vec<(Kind, &'static str)> = if case.scenario == Scenario::File {
            FILE_VARIANTS.to_vec()
        } else {
            opts.transports.iter().map(|k| (*k, "")).collect()
        };
        for (kind, variant) in variants {
            let mut runs = Vec::new();
            for _ in 0..opts.runs {
                let m = local.block_on(&rt, run_case(kind, variant, target, case, opts.duration)).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("{} {} over {}: {e}", case.scenario.name(), case.size, kind.name()),
                    )
                })?;
                runs.push(m);
            }
            rows.push(Row { case, kind, variant, m: combine(runs), runs: opts.runs });
        }
    }
    Ok(rows)
}

fn local(opts: &Opts) -> io::Result<Vec<Row>> {
    let unix = std::env::temp_dir().join(format!("smcperf-{}.sock", std::process::id()));
    let (tx, rx) = std::sync::mpsc::channel();
    let pin = opts.pin;
    let server_unix = unix.clone();
    let server_shm = opts.shm.clone();
    std::thread::Builder::new().name("smcperf-server".into()).spawn(move || {
        if pin {
            pin_to(0);
        }
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(e) => return drop(tx.send(Err(e))),
        };
        rt.block_on(async move {
            match start_server("127.0.0.1:0", Some(server_unix), server_shm).await {
                Ok(h) => {
                    let _ = tx.send(Ok(h));
                    std::future::pending::<()>().await
                }
                Err(e) => drop(tx.send(Err(e))),
            }
        })
    })?;
    let (handles, smc_addr) = rx.recv().map_err(io::Error::other)??;
    make_files(&file_sizes(opts))?;
    if pin {
        pin_to(1);
    }
    let targets = |kind: Kind| Target {
        tcp: if kind == Kind::Tcp { handles.tcp_addr } else { smc_addr },
        unix: handles.unix.clone(),
        shm: opts.shm.clone(),
        file_smc: handles.file_smc,
        file_tcp: handles.file_tcp,
    };
    // One client loop per transport keeps the baseline on tokio's own listener.
    let mut rows = Vec::new();
    for case in cases(opts) {
        if case.scenario == Scenario::File {
            let one = Opts {
                scenarios: Some(vec![case.scenario]),
                sizes: Some(vec![case.size]),
                conns: Some(case.conns),
                ..opts.clone()
            };
            rows.extend(run_client(&one, &targets(Kind::Smc))?);
            continue;
        }
        for &kind in &opts.transports {
            let one = Opts {
                scenarios: Some(vec![case.scenario]),
                sizes: Some(vec![case.size]),
                conns: Some(case.conns),
                transports: vec![kind],
                ..opts.clone()
            };
            rows.extend(run_client(&one, &targets(kind))?);
        }
    }
    let _ = std::fs::remove_file(&unix);
    let _ = std::fs::remove_dir_all(www_root());
    Ok(rows)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, opts) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let result = match cmd.as_str() {
        "local" => local(&opts),
        "server" => {
            let listen = opts.listen.clone().unwrap_or_else(|| "0.0.0.0:7777".into());
            let r = runtime().and_then(|rt| {
                rt.block_on(async {
                    let mut sizes = file_sizes(&opts);
                    if sizes.is_empty() {
                        sizes.push(4096);
                    }
                    make_files(&sizes)?;
                    let (h, smc_addr) = start_server(&listen, opts.unix.clone(), opts.shm.clone()).await?;
                    eprintln!(
                        "smcperf server: smc on {smc_addr}, tcp baseline on {}, unix on {:?}",
                        h.tcp_addr, h.unix
                    );
                    std::future::pending::<io::Result<()>>().await
                })
            });
            r.map(|()| Vec::new())
        }
        "client" => {
            let Some(connect) = opts.connect.clone() else {
                eprintln!("client needs --connect ADDR (the server's smc address)");
                return ExitCode::from(2);
            };
            match connect.parse::<SocketAddr>() {
                Ok(addr) => {
                    // The server's smc listener serves plain tcp clients too, over TCP.
                    let next = |k: u16| SocketAddr::new(addr.ip(), addr.port() + k);
                    let target = Target {
                        tcp: addr,
                        unix: opts.unix.clone(),
                        shm: opts.shm.clone(),
                        file_smc: next(1),
                        file_tcp: next(2),
                    };
                    run_client(&opts, &target)
                }
                Err(e) => {
                    eprintln!("bad --connect {connect:?}: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        other => {
            eprintln!("unknown command {other:?}\n{}", usage());
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(rows) => {
            if opts.json {
                print_json(&rows, &opts);
            } else {
                print_table(&rows);
                println!("\nsmc-tokio stats (this process, both roles):\n{}", smc_tokio::stats());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("smcperf: {e}");
            ExitCode::FAILURE
        }
    }
}
