//! The command line: modes, scenarios, transports and the options every mode shares.

use super::*;

pub(crate) const MODE_RR: u32 = 1;
pub(crate) const MODE_STREAM: u32 = 2;
/// The stream scenario with a reader that adds up every byte it reads (`--reader read-sum`).
pub(crate) const MODE_STREAM_READ_SUM: u32 = 3;
/// The same reading in place through `AsyncBufRead` (`--reader fill-buf-sum`).
pub(crate) const MODE_STREAM_BUF_SUM: u32 = 4;

/// How the stream scenario's server reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Reader {
    /// `read` into a 64 KiB buffer; the bytes are not looked at.
    Read,
    /// `read` into a 64 KiB buffer, then every byte is added up (a parser of a copy).
    ReadSum,
    /// `fill_buf`, every byte added up where it lies, `consume` (a parser in place): smc-tokio
    /// lends its receive ring; tokio's streams read through a 64 KiB `BufReader`.
    FillBufSum,
}

impl Reader {
    /// The row's variant: none for the default.
    pub(crate) fn variant(self) -> &'static str {
        match self {
            Reader::Read => "",
            Reader::ReadSum => "read-sum",
            Reader::FillBufSum => "fill-buf-sum",
        }
    }

    pub(crate) fn of_variant(v: &str) -> Reader {
        match v {
            "read-sum" => Reader::ReadSum,
            "fill-buf-sum" => Reader::FillBufSum,
            _ => Reader::Read,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Scenario {
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
    pub(crate) fn name(self) -> &'static str {
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
    pub(crate) fn opens_connections(self) -> bool {
        matches!(self, Scenario::Crr | Scenario::HttpClose)
    }

    /// Whether unix sockets have a row (the web scenarios run over smc, tcp and mem).
    pub(crate) fn has_unix(self) -> bool {
        matches!(self, Scenario::Rr | Scenario::Stream | Scenario::Crr)
    }

    /// Whether `mem` (an in-process pipe under the same HTTP or gRPC stack) runs it.
    pub(crate) fn has_mem(self) -> bool {
        matches!(self, Scenario::Http | Scenario::HttpClose | Scenario::Grpc)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// smc-tokio (`SmcStream`, `SmcListener`).
    Smc,
    /// tokio's `TcpStream` and `TcpListener`, the baseline.
    Tcp,
    /// tokio's `UnixStream` (raw scenarios only).
    Unix,
    /// tokio's in-process pipe (`tokio::io::duplex`) under the same stack (http, http-close and
    /// grpc, in `local` only): what hyper, axum and tonic reach with no kernel and no transport
    /// protocol between the two sides, the ceiling of those rows on this machine.
    Mem,
    /// smc-tokio through the kernel's `AF_SMC` socket (`KernelMode::On`; raw scenarios only):
    /// the kernel's SMC-R or SMC-D against a server whose listener is `AF_SMC` too (`--kernel
    /// on`), as in the soft-RoCE guests.
    Ksmc,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Smc => "smc",
            Kind::Tcp => "tcp",
            Kind::Unix => "unix",
            Kind::Ksmc => "ksmc",
            Kind::Mem => "mem",
        }
    }
}

/// `--runtime`: tokio's current-thread runtime, or the multi-threaded one with N workers (per
/// side in `local`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuntimeKind {
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
pub(crate) struct Opts {
    pub(crate) scenarios: Option<Vec<Scenario>>,
    pub(crate) sizes: Option<Vec<usize>>,
    pub(crate) transports: Vec<Kind>,
    pub(crate) conns: Option<usize>,
    pub(crate) duration: Duration,
    pub(crate) runs: usize,
    pub(crate) pin: bool,
    pub(crate) json: bool,
    pub(crate) unix: Option<PathBuf>,
    pub(crate) shm: ShmConfig,
    pub(crate) runtime: RuntimeKind,
    pub(crate) plot: Option<PathBuf>,
    pub(crate) settle: bool,
    pub(crate) reader: Reader,
    pub(crate) buf_offset: Option<usize>,
}

/// Measures smc-tokio beside tokio's `TcpStream` and `UnixStream` in the same run, and prints
/// each result with its ratio against TCP.
#[derive(Debug, clap::Parser)]
#[command(name = "smcperf", version, after_help = MODES_HELP)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) mode: Mode,
}

pub(crate) const MODES_HELP: &str = "\
Examples:
  smcperf local                                   the default matrix, about 25 s
  smcperf local --scenario http,grpc --conns 64 --runtime multi:2
  smcperf local --scenario rr --size 14 --busy-poll 200 --plot rr.svg
  smcperf server --listen 10.0.0.1:7777           then, on another host:
  smcperf client --connect 10.0.0.1:7777 --scenario rr,stream

The tcp baseline is tokio's TcpListener and TcpStream, listening with SmcListener's backlog
(1024) rather than TcpListener::bind's 128. smcperf raises its descriptor limit to the hard
limit, so --conns 10000 runs as it is.";

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Mode {
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
pub(crate) enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KernelArg {
    Off,
    Auto,
    On,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Common {
    /// Scenarios, comma-separated.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [Scenario::Rr, Scenario::Stream, Scenario::Crr, Scenario::Http])]
    pub(crate) scenario: Vec<Scenario>,
    /// Sizes in bytes, comma-separated, with k/m suffixes [default: rr 14,1024; stream 65536;
    /// crr, http, http-close, grpc 64; file 4096].
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub(crate) size: Vec<usize>,
    /// Transports, comma-separated.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [Kind::Smc, Kind::Tcp, Kind::Unix, Kind::Mem])]
    pub(crate) transport: Vec<Kind>,
    /// rr: connections; crr, file, http, http-close, grpc: concurrent clients [default: rr 1,
    /// file 100, the others 64].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) conns: Option<u32>,
    /// Measured seconds per run (a tenth more runs first as warm-up).
    #[arg(long, default_value_t = 1.5, value_parser = parse_secs)]
    pub(crate) duration: f64,
    /// Runs per configuration; medians are reported.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) runs: u32,
    /// tokio runtime of client and server: current, multi (2 workers) or multi:N.
    #[arg(long, default_value_t = RuntimeKind::Current)]
    pub(crate) runtime: RuntimeKind,
    /// smc receive ring size per connection and direction [default: the crate's].
    #[arg(long, value_parser = parse_size)]
    pub(crate) rmb_size: Option<usize>,
    /// smc: how large a receive ring may grow (RMB autotuning; at or below --rmb-size: off)
    /// [default: the crate's].
    #[arg(long, value_parser = parse_size_or_zero)]
    pub(crate) rmb_max: Option<usize>,
    /// smc adaptive polling budget, in microseconds (0: off) [default: the crate's].
    #[arg(long, value_name = "US")]
    pub(crate) adaptive_poll: Option<u64>,
    /// smc busy-poll budget before sleeping, in microseconds (0: off).
    #[arg(long, value_name = "US")]
    pub(crate) busy_poll: Option<u64>,
    /// smc writes up to this size ride inline in the CDC message when idle (0: off).
    #[arg(long, value_name = "BYTES")]
    pub(crate) inline_max: Option<usize>,
    /// smc autocork size (0: off).
    #[arg(long, value_name = "BYTES", value_parser = parse_size_or_zero)]
    pub(crate) autocork: Option<usize>,
    /// The listeners' handshake limit (a process-wide setting).
    #[arg(long, value_enum)]
    pub(crate) limit_handshake: Option<OnOff>,
    /// Handshakes a listener runs at once (a process-wide setting).
    #[arg(long, value_name = "N")]
    pub(crate) max_pending: Option<usize>,
    /// Adaptive fallback threshold for smc clients, in bytes (0: off).
    #[arg(long, value_name = "BYTES")]
    pub(crate) adaptive_min_bytes: Option<u64>,
    /// Offer and accept shared memory (off: two processes on one host meet over RDMA when built
    /// with the `rdma` feature, as in the soft-RoCE guests) [default: the crate's, or
    /// `SMC_TOKIO_SHM`].
    #[arg(long, value_enum)]
    pub(crate) shm: Option<OnOff>,
    /// The kernel's `AF_SMC` sockets for this process's smc listeners (and `smc` clients
    /// use them only with `--transport ksmc`): off, auto or on [default: the crate's, or
    /// `SMC_TOKIO_KERNEL`].
    #[arg(long, value_enum)]
    pub(crate) kernel: Option<KernelArg>,
    /// The unix socket path (local: a temporary one).
    #[arg(long)]
    pub(crate) unix: Option<PathBuf>,
    /// Pin server and client threads to different CPUs (local).
    #[arg(long)]
    pub(crate) pin: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Before each crr or http-close run, wait until few sockets are left in TIME_WAIT by
    /// earlier runs (they slow connects; up to 70 s a run). The first wait comes before the
    /// machine is measured.
    #[arg(long)]
    pub(crate) settle: bool,
    /// Also draw every row's latency distribution into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// stream: how the server reads (the rows are named after it, but for `read`).
    #[arg(long, value_enum, default_value_t = Reader::Read)]
    pub(crate) reader: Reader,
    /// rr and stream (both sides) and crr (the server's echo): place the message buffers this
    /// many bytes past a page boundary (0-4095) [default: where the allocator puts them]. On
    /// AMD Zen 3 and 4 a copy of 4 KiB or more runs at a sixteenth of its speed when its
    /// destination lies 1-31 bytes past its source modulo 4096: with 16, a reader's copies out
    /// of page-aligned ring positions are.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u16).range(0..4096))]
    pub(crate) buf_offset: Option<u16>,
}

pub(crate) fn parse_secs(s: &str) -> Result<f64, String> {
    let secs: f64 = s.parse().map_err(|_| format!("bad duration {s:?}"))?;
    if !(0.05..=3600.0).contains(&secs) {
        return Err("the duration must be 0.05 ..= 3600 seconds".into());
    }
    Ok(secs)
}

pub(crate) fn parse_size_or_zero(s: &str) -> Result<usize, String> {
    if s == "0" {
        Ok(0)
    } else {
        parse_size(s)
    }
}

pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
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
    pub(crate) fn into_opts(self) -> Opts {
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
            reader: self.reader,
            buf_offset: self.buf_offset.map(usize::from),
        }
    }
}
