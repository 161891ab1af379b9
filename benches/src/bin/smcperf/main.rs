//! `smcperf`: the project's sockperf/qperf. Measures smc-tokio beside tokio's own `TcpStream` and
//! `UnixStream` in the same run and prints ratios against TCP. `smcperf --help` lists the modes,
//! scenarios and options; `smcperf local --help` each option's meaning.
//!
//! Protocol of the raw scenarios between client and server: each connection starts with an
//! 8-byte header (`mode: u32`, `size: u32`, little endian). `rr` and `crr`: the server echoes
//! `size`-byte messages until EOF. `stream`: the server reads until EOF, then answers with the
//! byte count (u64), so the client's clock stops when the server has everything. `file`:
//! HTTP/1.1 keep-alive GETs of a `size`-byte file from the `file_server` example's logic, in four
//! variants: smc with cork + sendfile, smc with plain writes, smc with sendfile and no cork, and
//! tokio TCP with plain writes (the server's listeners are the main port + 1 and + 2). `http`,
//! `http-close` and `grpc` run hyper, axum and tonic (see `web.rs`; ports + 3 ..= + 6).

mod plot;
mod web;

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
use smc_tokio::kernel::KernelMode;
use smc_tokio::{Policy, SmcListener, SmcStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

const MODE_RR: u32 = 1;
const MODE_STREAM: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    /// Request/response on open connections: p50/p99 latency of `--size`-byte messages.
    Rr,
    /// Bulk writes of `--size` bytes: bytes/s, the clock stopping when the server has all.
    Stream,
    /// Connect, one `--size`-byte request/response, close, at `--conns` concurrency: conn/s.
    Crr,
    /// HTTP/1.1 keep-alive GETs of a `--size`-byte file: cork+sendfile, plain writes, sendfile.
    File,
    /// hyper client (smc-tower's SmcConnector) against axum on SmcListener, keep-alive: req/s.
    Http,
    /// The same with `Connection: close`: a new connection per request.
    HttpClose,
    /// tonic unary calls through SmcConnector against SmcIncoming, a channel per client.
    Grpc,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Rr => "rr",
            Scenario::Stream => "stream",
            Scenario::Crr => "crr",
            Scenario::File => "file",
            Scenario::Http => "http",
            Scenario::HttpClose => "http-close",
            Scenario::Grpc => "grpc",
        }
    }

    /// Whether every operation opens a connection (their runs leave sockets in TIME_WAIT).
    fn opens_connections(self) -> bool {
        matches!(self, Scenario::Crr | Scenario::HttpClose)
    }

    /// Whether unix sockets have a row (the web scenarios run over tcp and smc only).
    fn has_unix(self) -> bool {
        matches!(self, Scenario::Rr | Scenario::Stream | Scenario::Crr)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Kind {
    /// smc-tokio (`SmcStream`, `SmcListener`).
    Smc,
    /// tokio's `TcpStream` and `TcpListener`, the baseline.
    Tcp,
    /// tokio's `UnixStream` (raw scenarios only).
    Unix,
    /// smc-tokio through the kernel's `AF_SMC` socket (`KernelMode::On`; raw scenarios only):
    /// the kernel's SMC-R or SMC-D against a server whose listener is `AF_SMC` too (`--kernel
    /// on`), as in the soft-RoCE guests.
    Ksmc,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Smc => "smc",
            Kind::Tcp => "tcp",
            Kind::Unix => "unix",
            Kind::Ksmc => "ksmc",
        }
    }
}

/// `--runtime`: tokio's current-thread runtime, or the multi-threaded one with N workers (per
/// side in `local`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RuntimeKind {
    Current,
    Multi(usize),
}

impl std::str::FromStr for RuntimeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "current" => Ok(RuntimeKind::Current),
            None if s == "multi" => Ok(RuntimeKind::Multi(2)),
            Some(("multi", n)) => match n.parse() {
                Ok(n) if (1..=256).contains(&n) => Ok(RuntimeKind::Multi(n)),
                _ => Err(format!("bad worker count {n:?} (1 ..= 256)")),
            },
            _ => Err(format!("{s:?} is not current, multi or multi:N")),
        }
    }
}

impl std::fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeKind::Current => f.write_str("current"),
            RuntimeKind::Multi(n) => write!(f, "multi:{n}"),
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
    unix: Option<PathBuf>,
    shm: ShmConfig,
    runtime: RuntimeKind,
    plot: Option<PathBuf>,
    settle: bool,
}

/// Measures smc-tokio beside tokio's `TcpStream` and `UnixStream` in the same run, and prints
/// each result with its ratio against TCP.
#[derive(Debug, clap::Parser)]
#[command(name = "smcperf", version, after_help = MODES_HELP)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

const MODES_HELP: &str = "\
Examples:
  smcperf local                                   the default matrix, about 25 s
  smcperf local --scenario http,grpc --conns 64 --runtime multi:2
  smcperf local --scenario rr --size 14 --busy-poll 200 --plot rr.svg
  smcperf server --listen 10.0.0.1:7777           then, on another host:
  smcperf client --connect 10.0.0.1:7777 --scenario rr,stream";

#[derive(Debug, clap::Subcommand)]
enum Mode {
    /// Server and client in one process, on two threads (each with its own runtime).
    Local(Common),
    /// Serves every scenario: smc on --listen, the tcp baseline and the others on the next ports.
    Server {
        /// Where the smc listener listens (tcp baseline: the next port; file, web: + 1 ..= + 6).
        #[arg(long, default_value = "0.0.0.0:7777")]
        listen: String,
        #[command(flatten)]
        common: Common,
    },
    /// Measures against a server started with `smcperf server`.
    Client {
        /// The server's smc address (its --listen).
        #[arg(long)]
        connect: SocketAddr,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KernelArg {
    Off,
    Auto,
    On,
}

#[derive(Debug, clap::Args)]
struct Common {
    /// Scenarios, comma-separated.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [Scenario::Rr, Scenario::Stream, Scenario::Crr, Scenario::Http])]
    scenario: Vec<Scenario>,
    /// Sizes in bytes, comma-separated, with k/m suffixes [default: rr 14,1024; stream 65536;
    /// crr, http, http-close, grpc 64; file 4096].
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    size: Vec<usize>,
    /// Transports, comma-separated.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [Kind::Smc, Kind::Tcp, Kind::Unix])]
    transport: Vec<Kind>,
    /// rr: connections; crr, file, http, http-close, grpc: concurrent clients [default: rr 1,
    /// file 100, the others 64].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    conns: Option<u32>,
    /// Measured seconds per run (a tenth more runs first as warm-up).
    #[arg(long, default_value_t = 1.5, value_parser = parse_secs)]
    duration: f64,
    /// Runs per configuration; medians are reported.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// tokio runtime of client and server: current, multi (2 workers) or multi:N.
    #[arg(long, default_value_t = RuntimeKind::Current)]
    runtime: RuntimeKind,
    /// smc receive ring size per connection and direction [default: the crate's].
    #[arg(long, value_parser = parse_size)]
    rmb_size: Option<usize>,
    /// smc: how large a receive ring may grow (RMB autotuning; at or below --rmb-size: off)
    /// [default: the crate's].
    #[arg(long, value_parser = parse_size_or_zero)]
    rmb_max: Option<usize>,
    /// smc adaptive polling budget, in microseconds (0: off) [default: the crate's].
    #[arg(long, value_name = "US")]
    adaptive_poll: Option<u64>,
    /// smc busy-poll budget before sleeping, in microseconds (0: off).
    #[arg(long, value_name = "US")]
    busy_poll: Option<u64>,
    /// smc writes up to this size ride inline in the CDC message when idle (0: off).
    #[arg(long, value_name = "BYTES")]
    inline_max: Option<usize>,
    /// smc autocork size (0: off).
    #[arg(long, value_name = "BYTES", value_parser = parse_size_or_zero)]
    autocork: Option<usize>,
    /// The listeners' handshake limit (a process-wide setting).
    #[arg(long, value_enum)]
    limit_handshake: Option<OnOff>,
    /// Handshakes a listener runs at once (a process-wide setting).
    #[arg(long, value_name = "N")]
    max_pending: Option<usize>,
    /// Adaptive fallback threshold for smc clients, in bytes (0: off).
    #[arg(long, value_name = "BYTES")]
    adaptive_min_bytes: Option<u64>,
    /// Offer and accept shared memory (off: two processes on one host meet over RDMA when built
    /// with the `rdma` feature, as in the soft-RoCE guests) [default: the crate's, or
    /// `SMC_TOKIO_SHM`].
    #[arg(long, value_enum)]
    shm: Option<OnOff>,
    /// The kernel's `AF_SMC` sockets for this process's smc listeners (and `smc` clients
    /// use them only with `--transport ksmc`): off, auto or on [default: the crate's, or
    /// `SMC_TOKIO_KERNEL`].
    #[arg(long, value_enum)]
    kernel: Option<KernelArg>,
    /// The unix socket path (local: a temporary one).
    #[arg(long)]
    unix: Option<PathBuf>,
    /// Pin server and client threads to different CPUs (local).
    #[arg(long)]
    pin: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// Before each crr or http-close run, wait until few sockets are left in TIME_WAIT by
    /// earlier runs (they slow connects; up to 70 s a run).
    #[arg(long)]
    settle: bool,
    /// Also draw every row's latency distribution into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

fn parse_secs(s: &str) -> Result<f64, String> {
    let secs: f64 = s.parse().map_err(|_| format!("bad duration {s:?}"))?;
    if !(0.05..=3600.0).contains(&secs) {
        return Err("the duration must be 0.05 ..= 3600 seconds".into());
    }
    Ok(secs)
}

fn parse_size_or_zero(s: &str) -> Result<usize, String> {
    if s == "0" {
        Ok(0)
    } else {
        parse_size(s)
    }
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

impl Common {
    /// The options, with the process-wide settings they name applied.
    fn into_opts(self) -> Opts {
        let mut shm = ShmConfig::default();
        if let Some(v) = self.shm {
            shm = shm.enabled(v == OnOff::On);
        }
        if let Some(n) = self.rmb_size {
            shm = shm.rmb_size(n as u32);
        }
        if let Some(n) = self.rmb_max {
            shm = shm.rmb_max(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if let Some(us) = self.adaptive_poll {
            shm = shm.adaptive_poll(Duration::from_micros(us));
        }
        if let Some(us) = self.busy_poll {
            shm = shm.busy_poll(Duration::from_micros(us));
        }
        if let Some(n) = self.inline_max {
            shm = shm.inline_max(n);
        }
        if let Some(n) = self.autocork {
            shm = shm.autocork(n as u32);
        }
        if let Some(v) = self.limit_handshake {
            smc_tokio::config::global().update(|s| s.limit_handshake = v == OnOff::On);
        }
        if let Some(n) = self.max_pending {
            smc_tokio::config::global().update(|s| s.max_pending_handshakes = n.max(1));
        }
        if let Some(n) = self.adaptive_min_bytes {
            smc_tokio::config::global().update(|s| s.adaptive_min_bytes = n);
        }
        if let Some(k) = self.kernel {
            let mode = match k {
                KernelArg::Off => KernelMode::Off,
                KernelArg::Auto => KernelMode::Auto,
                KernelArg::On => KernelMode::On,
            };
            smc_tokio::config::global().update(|s| s.kernel = mode);
        }
        Opts {
            scenarios: Some(self.scenario),
            sizes: (!self.size.is_empty()).then_some(self.size),
            transports: self.transport,
            conns: self.conns.map(|n| n as usize),
            duration: Duration::from_secs_f64(self.duration),
            runs: self.runs as usize,
            pin: self.pin,
            json: self.json,
            unix: self.unix,
            shm,
            runtime: self.runtime,
            plot: self.plot,
            settle: self.settle,
        }
    }
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
            Scenario::Crr | Scenario::Http | Scenario::HttpClose | Scenario::Grpc => vec![64],
            Scenario::File => vec![4096],
        });
        let conns = o.conns.unwrap_or(match s {
            Scenario::Rr | Scenario::Stream => 1,
            Scenario::File => 100,
            Scenario::Crr | Scenario::Http | Scenario::HttpClose | Scenario::Grpc => 64,
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
    /// CPU time (user and system, every thread of this process: in `local`, client and server)
    /// per operation, from `getrusage`.
    cpu_us_per_op: f64,
    /// Latencies at the plot's percentile steps (`plot::quantiles`), for `--plot`.
    quantiles: Vec<f64>,
}

/// This process's CPU time so far (user + system), from `getrusage(RUSAGE_SELF)`.
fn cpu_time() -> Duration {
    // SAFETY: rusage is plain data; all-zero is valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is valid for writes; RUSAGE_SELF needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
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
    /// The http and grpc servers.
    web: web::WebAddrs,
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
        Kind::Smc | Kind::Ksmc => {
            let kernel = if kind == Kind::Ksmc { KernelMode::On } else { KernelMode::Off };
            let s = SmcStream::builder()
                .policy(Policy::Auto)
                .shm(target.shm.clone())
                .kernel(kernel)
                .connect(target.tcp)
                .await?;
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
    web: web::WebAddrs,
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

/// Serves the raw scenarios on a listener (an `SmcListener` or a tokio `TcpListener`: the same
/// calls, no common trait) until the runtime ends; an accept error is printed and retried 5 ms
/// later.
macro_rules! serve_raw {
    ($listener:expr) => {{
        let listener = $listener;
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
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
        })
    }};
}

/// Starts the listeners on the current runtime: an `SmcListener` (which also serves the plain
/// `tcp` clients, over TCP), a tokio `TcpListener` on the next port for the tcp baseline, and a
/// `UnixListener`.
async fn start_server(listen: &str, unix: Option<PathBuf>, shm: ShmConfig) -> io::Result<(ServerHandles, SocketAddr)> {
    let smc = SmcListener::builder().shm(shm.clone()).bind(listen).await?;
    let smc_addr = smc.local_addr()?;
    serve_raw!(smc);
    let tcp = TcpListener::bind(SocketAddr::new(smc_addr.ip(), 0)).await?;
    let tcp_addr = tcp.local_addr()?;
    serve_raw!(tcp);
    // The file server, on the next two ports when the main one is fixed.
    let port = |k: u16| if smc_addr.port() == 0 || listen.ends_with(":0") { 0 } else { smc_addr.port() + k };
    let file_smc = SmcListener::builder().shm(shm.clone()).bind(SocketAddr::new(smc_addr.ip(), port(1))).await?;
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
    let web = web::start(smc_addr.ip(), shm, |k| if port(1) == 0 { 0 } else { port(3 + k) }).await?;
    Ok((ServerHandles { tcp_addr, unix, file_smc: file_smc_addr, file_tcp: file_tcp_addr, web }, smc_addr))
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
        tasks.push(tokio::spawn(async move {
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
    let negotiated = Arc::new(Seen::default());
    let warmup = dur / 10;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..case.conns {
        let (stop, errors, negotiated, target) = (stop.clone(), errors.clone(), negotiated.clone(), target.clone());
        let size = case.size;
        tasks.push(tokio::spawn(async move {
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
                        negotiated.add(neg);
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
    m.negotiated = negotiated.get();
    m.errors = errors.load(Ordering::Relaxed);
    Ok(m)
}

/// The negotiated transports seen so far, as the other scenarios report them: one name, or two
/// joined by `+` when outcomes were mixed.
#[derive(Default)]
struct Seen(std::sync::Mutex<String>);

impl Seen {
    fn add(&self, t: &str) {
        let mut n = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if n.is_empty() {
            *n = t.to_string();
        } else if n.as_str() != t && !n.contains('+') {
            // Mixed outcomes are reported, never hidden.
            *n = format!("{n}+{t}");
        }
    }

    fn get(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
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
        cpu_us_per_op: 0.0,
        quantiles: plot::quantiles(&all),
    })
}

async fn run_case(
    kind: Kind,
    variant: &'static str,
    target: &Target,
    case: Case,
    dur: Duration,
) -> io::Result<Measure> {
    let (cpu0, t0) = (cpu_time(), Instant::now());
    let mut m = match case.scenario {
        Scenario::Rr => run_rr(kind, target, case, dur).await,
        Scenario::Stream => run_stream(kind, target, case, dur).await,
        Scenario::Crr => run_crr(kind, target, case, dur).await,
        Scenario::File => run_file(kind, variant, target, case, dur).await,
        Scenario::Http => web::run_http(kind, target.web, &target.shm, case, dur, false).await,
        Scenario::HttpClose => web::run_http(kind, target.web, &target.shm, case, dur, true).await,
        Scenario::Grpc => web::run_grpc(kind, target.web, &target.shm, case, dur).await,
    }?;
    // CPU over the whole run (warm-up, set-up and tear-down included), per operation counted
    // in the measured window scaled to the run's length.
    let ops = m.ops_per_s * t0.elapsed().as_secs_f64();
    if ops > 0.0 {
        m.cpu_us_per_op = (cpu_time() - cpu0).as_secs_f64() * 1e6 / ops;
    }
    Ok(m)
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
        tasks.push(tokio::spawn(async move {
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
        cpu_us_per_op: pick(|m| m.cpu_us_per_op),
        // Each percentile step's median over the runs.
        quantiles: (0..runs.iter().map(|m| m.quantiles.len()).min().unwrap_or(0))
            .map(|i| median(runs.iter().map(|m| m.quantiles[i]).collect()))
            .collect(),
    }
}

/// The ratio against tcp for the row's headline metric: p50 latency for rr (lower is better),
/// throughput for stream, connections/s for crr and requests (calls)/s for the others (higher
/// is better).
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
        _ => (row.m.ops_per_s, tcp.m.ops_per_s),
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
        "{:<10} {:>7} {:>5} {:<18} {:<12} {:>9} {:>9} {:>9} {:>11} {:>10} {:>9} {:>6}  vs tcp",
        "scen",
        "size",
        "conns",
        "trans",
        "negotiated",
        "p50_us",
        "p99_us",
        "p999_us",
        "ops/s",
        "MB/s",
        "cpu_us/op",
        "errors"
    );
    for r in rows {
        let vs = match ratio(r, rows) {
            Some(x) => {
                let what = match r.case.scenario {
                    Scenario::Rr => "p50 latency",
                    Scenario::Stream => "throughput",
                    Scenario::Crr => "conn/s",
                    Scenario::File | Scenario::Http | Scenario::HttpClose => "req/s",
                    Scenario::Grpc => "calls/s",
                };
                match ratio_vs_smc_write(r, rows) {
                    Some(y) => format!("{x:.2}x {what} ({y:.2}x smc/write)"),
                    None => format!("{x:.2}x {what}"),
                }
            }
            None => "-".into(),
        };
        println!(
            "{:<10} {:>7} {:>5} {:<18} {:<12} {:>9.1} {:>9.1} {:>9.1} {:>11.0} {:>10.1} {:>9.2} {:>6}  {}",
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
            r.m.cpu_us_per_op,
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
                "cpu_us_per_op": r.m.cpu_us_per_op,
                "runs": r.runs,
                "ratio_vs_tcp": ratio(r, rows),
                "ratio_vs_smc_write": ratio_vs_smc_write(r, rows),
            })
        })
        .collect();
    let doc = json!({
        "tool": "smcperf",
        "duration_s": opts.duration.as_secs_f64(),
        "runtime": opts.runtime.to_string(),
        "pinned": opts.pin,
        "stats": smc_tokio::stats().to_string(),
        "results": results,
    });
    println!("{doc:#}");
}

/// `--plot`: a panel per case, a line per transport.
fn write_plot(path: &std::path::Path, rows: &[Row]) -> io::Result<()> {
    let mut panels: Vec<plot::Panel> = Vec::new();
    for r in rows {
        let title = format!("{} {} B, {} conn(s)", r.case.scenario.name(), r.case.size, r.case.conns);
        let series = plot::Series { label: r.transport(), quantiles: r.m.quantiles.clone() };
        match panels.iter_mut().find(|p| p.title == title) {
            Some(p) => p.series.push(series),
            None => panels.push(plot::Panel { title, series: vec![series] }),
        }
    }
    std::fs::write(path, plot::svg(&panels))
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

fn runtime(kind: RuntimeKind, name: &str) -> io::Result<tokio::runtime::Runtime> {
    match kind {
        RuntimeKind::Current => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        RuntimeKind::Multi(n) => {
            tokio::runtime::Builder::new_multi_thread().worker_threads(n).thread_name(name).enable_all().build()
        }
    }
}

/// Sockets in TIME_WAIT on this host (network namespace), from `/proc/net/tcp` and `tcp6`
/// (state `06`), or `None` where they cannot be read.
fn time_wait_sockets() -> Option<usize> {
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).ok()?;
        n += text.lines().skip(1).filter(|l| l.split_whitespace().nth(3) == Some("06")).count();
    }
    Some(n)
}

/// More TIME_WAIT sockets than this at the start of a run that opens connections get a warning.
/// On the development VM, the 14.5 k left by a 2 s tcp crr run did not change the next run's
/// rate (13.9 k against 13.8 k conn/s); with 78 k left by several runs, tcp crr fell from about
/// 14 k to 5-6 k conn/s.
const TIME_WAIT_WARN: usize = 20_000;

/// What `--settle` waits for: about none left, so that every run starts alike.
const TIME_WAIT_SETTLED: usize = 1000;

/// Before a run that opens connections: warns when many sockets linger in TIME_WAIT (they slow
/// connects, so such runs are not comparable), or with `settle` waits (up to 70 s, past the
/// kernel's 60 s TIME_WAIT) until about none are left.
fn settle_time_wait(settle: bool) {
    let Some(n) = time_wait_sockets() else { return };
    if n <= if settle { TIME_WAIT_SETTLED } else { TIME_WAIT_WARN } {
        return;
    }
    if !settle {
        eprintln!(
            "smcperf: {n} sockets in TIME_WAIT slow the connects of this run; compare connection rates only \
             from runs that start without them (--settle waits for them)"
        );
        return;
    }
    let until = Instant::now() + Duration::from_secs(70);
    while Instant::now() < until && time_wait_sockets().is_some_and(|n| n > TIME_WAIT_SETTLED) {
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn run_client(opts: &Opts, target: &Target) -> io::Result<Vec<Row>> {
    let rt = runtime(opts.runtime, "smcperf-client")?;
    let mut rows = Vec::new();
    for case in cases(opts) {
        let variants: Vec<(Kind, &'static str)> = if case.scenario == Scenario::File {
            FILE_VARIANTS.to_vec()
        } else {
            opts.transports
                .iter()
                .filter(|k| !matches!(k, Kind::Unix | Kind::Ksmc) || case.scenario.has_unix())
                .map(|k| (*k, ""))
                .collect()
        };
        for (kind, variant) in variants {
            let mut runs = Vec::new();
            for _ in 0..opts.runs {
                if case.scenario.opens_connections() {
                    settle_time_wait(opts.settle);
                }
                let m = rt.block_on(run_case(kind, variant, target, case, opts.duration)).map_err(|e| {
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
    let (pin, rt_kind) = (opts.pin, opts.runtime);
    let server_unix = unix.clone();
    let server_shm = opts.shm.clone();
    std::thread::Builder::new().name("smcperf-server".into()).spawn(move || {
        if pin {
            pin_to(0);
        }
        let rt = match runtime(rt_kind, "smcperf-server") {
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
        web: handles.web,
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
    let cli = <Cli as clap::Parser>::parse();
    /// What this invocation does, with the options of its mode.
    enum Run {
        Local,
        Server(String),
        Client(SocketAddr),
    }
    let (run, opts) = match cli.mode {
        Mode::Local(c) => (Run::Local, c.into_opts()),
        Mode::Server { listen, common } => (Run::Server(listen), common.into_opts()),
        Mode::Client { connect, common } => (Run::Client(connect), common.into_opts()),
    };
    let result = match run {
        Run::Local => local(&opts),
        Run::Server(listen) => {
            let r = runtime(opts.runtime, "smcperf-server").and_then(|rt| {
                rt.block_on(async {
                    let mut sizes = file_sizes(&opts);
                    if sizes.is_empty() {
                        sizes.push(4096);
                    }
                    make_files(&sizes)?;
                    let (h, smc_addr) = start_server(&listen, opts.unix.clone(), opts.shm.clone()).await?;
                    eprintln!(
                        "smcperf server: smc on {smc_addr}, tcp baseline on {}, unix on {:?}, web {:?}",
                        h.tcp_addr, h.unix, h.web
                    );
                    std::future::pending::<io::Result<()>>().await
                })
            });
            r.map(|()| Vec::new())
        }
        Run::Client(addr) => {
            // The server's smc listener serves plain tcp clients too, over TCP.
            let next = |k: u16| SocketAddr::new(addr.ip(), addr.port() + k);
            let target = Target {
                tcp: addr,
                unix: opts.unix.clone(),
                shm: opts.shm.clone(),
                file_smc: next(1),
                file_tcp: next(2),
                web: web::WebAddrs::at(addr.ip(), addr.port() + 3),
            };
            run_client(&opts, &target)
        }
    };
    match result {
        Ok(rows) => {
            if let Some(path) = &opts.plot {
                if let Err(e) = write_plot(path, &rows) {
                    eprintln!("smcperf: writing {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
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
