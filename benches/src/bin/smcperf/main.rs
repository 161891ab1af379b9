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

mod buf;
mod cli;
mod conn;
mod machine;
mod plot;
mod report;
mod web;
mod workload;

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

use buf::PageBuf;
use cli::*;
use conn::*;
use report::*;
use workload::*;

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

/// Runs every case on one client runtime: `opts.runs` rounds of it, each round one run of every
/// transport (file: every variant) in turn, so that the machine's drift lands on both sides of
/// each round's ratio. One runtime for the whole invocation, as an application has: a runtime
/// per case would leave each case's link groups to the rescue thread when it ends, and the
/// next case's connections, which join those groups, would pay its cross-thread wake-ups.
fn run_client(opts: &Opts, target_for: &dyn Fn(Kind) -> Target) -> io::Result<Vec<Row>> {
    let rt = runtime(opts.runtime, "smcperf-client")?;
    let cases = cases(opts);
    if opts.transports.contains(&Kind::Mem) && !web::mem_available() && cases.iter().any(|c| c.scenario.has_mem()) {
        eprintln!("smcperf: mem runs only in `local` (its pipes do not cross processes); its rows are left out");
    }
    let mut rows = Vec::new();
    for case in cases {
        let variants: Vec<(Kind, &'static str)> = if case.scenario == Scenario::File {
            FILE_VARIANTS.to_vec()
        } else {
            opts.transports
                .iter()
                .filter(|k| !matches!(k, Kind::Unix | Kind::Ksmc) || case.scenario.has_unix())
                .filter(|k| **k != Kind::Mem || (case.scenario.has_mem() && web::mem_available()))
                .map(|k| (*k, if case.scenario == Scenario::Stream { opts.reader.variant() } else { "" }))
                .collect()
        };
        let mut runs: Vec<Vec<Measure>> = vec![Vec::new(); variants.len()];
        for _ in 0..opts.runs {
            for (i, &(kind, variant)) in variants.iter().enumerate() {
                if case.scenario.opens_connections() {
                    settle_time_wait(opts.settle);
                }
                // rr's floor at the moment of the run: the machine's own round trip of the
                // message, measured on either side of it (see `Measure::handoff_us`).
                let rr = case.scenario == Scenario::Rr;
                let mut floor = if rr { machine::handoff(case.size, opts.pin) } else { Vec::new() };
                let mut m =
                    rt.block_on(run_case(kind, variant, &target_for(kind), case, opts.duration)).map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!("{} {} over {}: {e}", case.scenario.name(), case.size, kind.name()),
                        )
                    })?;
                if rr {
                    floor.extend(machine::handoff(case.size, opts.pin));
                    m.handoff_us = report::median(floor);
                }
                runs[i].push(m);
            }
        }
        for ((kind, variant), per_run) in variants.into_iter().zip(runs) {
            rows.push(Row { case, kind, variant, m: combine(per_run.clone()), per_run });
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
    let rows = run_client(opts, &targets)?;
    let _ = std::fs::remove_file(&unix);
    let _ = std::fs::remove_dir_all(www_root());
    Ok(rows)
}

fn main() -> ExitCode {
    let cli = <Cli as clap::Parser>::parse();
    let nofile = raise_nofile();
    eprintln!(
        "smcperf: the tcp baseline listens with a backlog of {} (as SmcListener does); descriptor limit {nofile}",
        smc_tokio::net::LISTEN_BACKLOG
    );
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
    if let Some(offset) = opts.buf_offset {
        buf::set_offset(offset);
    }
    // The machine's limits, measured before the transports (with the servers idle) and again
    // after them, so every figure of this run is also a ratio to what the machine did in it:
    // the better figure of the two, as a limit is what the machine could do (one measure that
    // lands in a minute the hypervisor takes the CPUs gave a ring of 1.8 GB/s where the same
    // hour's other runs gave 12-14).
    // With `--settle`, its first wait comes before the measure, so that the machine's figures are
    // of the minute the first run starts in, not of a minute before it.
    let limits = match run {
        Run::Server(_) => None,
        _ => {
            if opts.settle && cases(&opts).iter().any(|c| c.scenario.opens_connections()) {
                settle_time_wait(true);
            }
            Some(machine::measure(opts.pin))
        }
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
                    // Until SIGINT or SIGTERM; then the server's side of the story (how its
                    // handshakes and doors went) next to what the client printed.
                    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
                    tokio::select! {
                        r = tokio::signal::ctrl_c() => r?,
                        _ = term.recv() => {}
                    }
                    eprintln!("\nsmc-tokio stats (server process):\n{}", smc_tokio::stats());
                    Ok(())
                })
            });
            // The files it served go with it, however it ended.
            let _ = std::fs::remove_dir_all(www_root());
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
            run_client(&opts, &|_| target.clone())
        }
    };
    let limits = limits.map(|before| before.best(machine::measure(opts.pin)));
    match result {
        Ok(rows) => {
            if let Some(path) = &opts.plot {
                if let Err(e) = write_plot(path, &rows) {
                    eprintln!("smcperf: writing {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            let limits = limits.unwrap_or(machine::Limits {
                pingpong_us: 0.0,
                task_rt_us: 0.0,
                memcpy_64k: 0.0,
                memcpy_16m: 0.0,
                ring_64k: 0.0,
            });
            if opts.json {
                print_json(&rows, &opts, &limits);
            } else {
                print_table(&rows, &limits);
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
