//! The client side of each scenario: the cases a run measures, and how each is measured.

use super::*;

/// One configuration to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Case {
    pub(crate) scenario: Scenario,
    pub(crate) size: usize,
    pub(crate) conns: usize,
}

pub(crate) fn cases(o: &Opts) -> Vec<Case> {
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
pub(crate) struct Measure {
    pub(crate) negotiated: String,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) ops_per_s: f64,
    pub(crate) bytes_per_s: f64,
    pub(crate) errors: u64,
    /// CPU time (user and system, every thread of this process: in `local`, client and server)
    /// per operation, from `getrusage`.
    pub(crate) cpu_us_per_op: f64,
    /// Shared-memory doorbells rung per operation (`Stats::doorbells`), over the whole run as
    /// the CPU is.
    pub(crate) doorbells_per_op: f64,
    /// Times a thread of this process slept per operation (voluntary context switches; in
    /// `local`, both sides): each is a wake-up someone paid for, whatever the transport.
    pub(crate) sleeps_per_op: f64,
    /// The share of the machine's CPU time its hypervisor took during the run, in percent
    /// (`/proc/stat`'s steal): a run with much of it measured a slower machine.
    pub(crate) steal_pct: f64,
    /// rr only: the machine's round trip of a message of the case's size between two threads,
    /// copied in and out on each side (`machine::handoff`), in microseconds, measured just
    /// before the run and just after it (0: not measured). The VM's cost of moving a line
    /// between its CPUs changes by 3-8x for seconds at a time; this is the floor at the moment
    /// of the run, where the table's other machine figures are the best of the invocation.
    pub(crate) handoff_us: f64,
    /// `local` only: how busy the server's threads and the client's were over the run, in
    /// CPUs (1.0: one thread ran all the time; [`side_cpu`]). The side at 1.0 of a
    /// current-thread runtime is the one that limits the row (0: not measured).
    pub(crate) server_busy: f64,
    pub(crate) client_busy: f64,
    /// Latencies at the plot's percentile steps (`plot::quantiles`), for `--plot`.
    pub(crate) quantiles: Vec<f64>,
}

/// The CPU time so far of each thread of this process that belongs to a side of `local`, by
/// thread id: the server's runtime threads (named `smcperf-server`) as side 0, the client's
/// (the main thread, which runs the client's top-level future, and the workers of a
/// multi-threaded client runtime, named `smcperf-client`) as side 1. Other threads (blocking
/// pools, the crate's closers) are left out. Read with each thread's CPU-time clock
/// (`clock_gettime` on the clock id the kernel gives a thread of our own process: nanoseconds,
/// where `/proc`'s ticks are 10 ms).
pub(crate) fn side_cpu() -> Vec<(u32, usize, Duration)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    // SAFETY: getpid cannot fail and has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let side = if comm.starts_with("smcperf-server") {
            0
        } else if tid == pid || comm.starts_with("smcperf-client") {
            1
        } else {
            continue;
        };
        // The kernel's clock id of thread `tid` (`CPUCLOCK_PERTHREAD` | `CPUCLOCK_SCHED`, the
        // encoding glibc's `pthread_getcpuclockid` uses: include/linux/posix-timers.h).
        let clock = ((!(tid as libc::clockid_t)) << 3) | 6;
        // SAFETY: timespec is plain data; all-zero is valid.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: `ts` is valid for writes; a thread that ended meanwhile gives EINVAL.
        if unsafe { libc::clock_gettime(clock, &mut ts) } == 0 {
            out.push((tid, side, Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)));
        }
    }
    out
}

/// Each side's CPU time between two [`side_cpu`] readings, in CPUs over `wall` (a thread that
/// started in between counts from zero; one that ended is left out).
pub(crate) fn side_busy(
    before: &[(u32, usize, Duration)],
    after: &[(u32, usize, Duration)],
    wall: Duration,
) -> [f64; 2] {
    let mut busy = [0.0; 2];
    if wall.is_zero() {
        return busy;
    }
    for &(tid, side, t) in after {
        let t0 = before.iter().find(|b| b.0 == tid).map_or(Duration::ZERO, |b| b.2);
        busy[side] += t.saturating_sub(t0).as_secs_f64() / wall.as_secs_f64();
    }
    busy
}

/// This process's CPU time so far (user + system) and the times its threads slept waiting for
/// something (voluntary context switches: an `epoll_wait` or a futex wait that blocked), from
/// `getrusage(RUSAGE_SELF)`.
pub(crate) fn cpu_time() -> (Duration, u64) {
    // SAFETY: rusage is plain data; all-zero is valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is valid for writes; RUSAGE_SELF needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return (Duration::ZERO, 0);
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(u.ru_utime) + tv(u.ru_stime), u64::try_from(u.ru_nvcsw).unwrap_or(0))
}

// ---------------------------------------------------------------------------------------------
// Client scenarios

pub(crate) fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

pub(crate) async fn header(c: &mut Conn, mode: u32, size: usize) -> io::Result<()> {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&mode.to_le_bytes());
    h[4..].copy_from_slice(&(size as u32).to_le_bytes());
    c.write_all(&h).await
}

pub(crate) async fn run_rr(kind: Kind, target: &Target, case: Case, dur: Duration) -> io::Result<Measure> {
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
            let msg = PageBuf::message(size, 0x5a);
            let mut back = PageBuf::message(size, 0);
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

pub(crate) async fn run_stream(
    kind: Kind,
    target: &Target,
    case: Case,
    dur: Duration,
    reader: Reader,
) -> io::Result<Measure> {
    let mut c = connect(kind, target).await?;
    let negotiated = c.negotiated().to_string();
    let mode = match reader {
        Reader::Read => MODE_STREAM,
        Reader::ReadSum => MODE_STREAM_READ_SUM,
        Reader::FillBufSum => MODE_STREAM_BUF_SUM,
    };
    header(&mut c, mode, case.size).await?;
    let buf = PageBuf::message(case.size, 0xa5);
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
    if reader != Reader::Read {
        // The server's sum of every byte proves it read them all.
        let mut sum = [0u8; 8];
        c.read_exact(&mut sum).await?;
        let want = sent.wrapping_mul(0xa5);
        if u64::from_le_bytes(sum) != want {
            return Err(io::Error::other(format!("server's byte sum {} is not {want}", u64::from_le_bytes(sum))));
        }
    }
    Ok(Measure {
        negotiated,
        ops_per_s: writes as f64 / elapsed,
        bytes_per_s: got as f64 / elapsed,
        ..Measure::default()
    })
}

pub(crate) async fn run_crr(kind: Kind, target: &Target, case: Case, dur: Duration) -> io::Result<Measure> {
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let negotiated = Arc::new(Seen::default());
    let warmup = dur / 10;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..case.conns {
        let (stop, errors, negotiated, target) = (stop.clone(), errors.clone(), negotiated.clone(), target.clone());
        let first_error = first_error.clone();
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
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| e.to_string());
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
    if let Some(e) = first_error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        eprintln!("smcperf: crr over {}: {} connections failed, the first with: {e}", kind.name(), m.errors);
    }
    Ok(m)
}

/// The negotiated transports seen so far, as the other scenarios report them: one name, or two
/// joined by `+` when outcomes were mixed.
#[derive(Default)]
pub(crate) struct Seen(std::sync::Mutex<String>);

impl Seen {
    pub(crate) fn add(&self, t: &str) {
        let mut n = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if n.is_empty() {
            *n = t.to_string();
        } else if n.as_str() != t && !n.contains('+') {
            // Mixed outcomes are reported, never hidden.
            *n = format!("{n}+{t}");
        }
    }

    pub(crate) fn get(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Lets the clients run for `run` (warm-up included), stops them, and turns the latencies they
/// recorded over the measured `dur` into a [`Measure`] (operations of `size` bytes each).
pub(crate) async fn measure(
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<io::Result<Vec<u64>>>>,
    run: Duration,
    dur: Duration,
    negotiated: String,
    size: usize,
    errors: u64,
) -> io::Result<Measure> {
    let started = Instant::now();
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    // The window the tasks recorded in: from the end of the warm-up to the stop, which comes
    // later than planned when the tasks kept the runtime from its timer.
    let window = started.elapsed().saturating_sub(run - dur).max(dur).as_secs_f64();
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
        ops_per_s: n / window,
        bytes_per_s: n * size as f64 / window,
        errors,
        cpu_us_per_op: 0.0,
        doorbells_per_op: 0.0,
        sleeps_per_op: 0.0,
        quantiles: plot::quantiles(&all),
        ..Measure::default()
    })
}

pub(crate) async fn run_case(
    kind: Kind,
    variant: &'static str,
    target: &Target,
    case: Case,
    dur: Duration,
) -> io::Result<Measure> {
    let ((cpu0, sleeps0), t0, bells0) = (cpu_time(), Instant::now(), smc_tokio::stats().doorbells[0]);
    let ticks0 = machine::cpu_ticks();
    let sides0 = side_cpu();
    let mut m = match case.scenario {
        Scenario::Rr => run_rr(kind, target, case, dur).await,
        Scenario::Stream => run_stream(kind, target, case, dur, Reader::of_variant(variant)).await,
        Scenario::Crr => run_crr(kind, target, case, dur).await,
        Scenario::File => run_file(kind, variant, target, case, dur).await,
        Scenario::Http => web::run_http(kind, target.web, &target.shm, case, dur, false).await,
        Scenario::HttpClose => web::run_http(kind, target.web, &target.shm, case, dur, true).await,
        Scenario::Grpc => web::run_grpc(kind, target.web, &target.shm, case, dur).await,
    }?;
    m.steal_pct = machine::steal_percent(ticks0, machine::cpu_ticks());
    // Over the whole run too (warm-up, set-up and tear-down included, as the CPU per op).
    let sides1 = side_cpu();
    let wall = t0.elapsed();
    [m.server_busy, m.client_busy] = side_busy(&sides0, &sides1, wall);
    // CPU over the whole run (warm-up, set-up and tear-down included), per operation counted
    // in the measured window scaled to the run's length.
    let ops = m.ops_per_s * wall.as_secs_f64();
    if ops > 0.0 {
        let (cpu1, sleeps1) = cpu_time();
        m.cpu_us_per_op = (cpu1 - cpu0).as_secs_f64() * 1e6 / ops;
        m.sleeps_per_op = sleeps1.saturating_sub(sleeps0) as f64 / ops;
        // Doorbells this process rang (in `local`, both sides), per operation, likewise.
        m.doorbells_per_op = (smc_tokio::stats().doorbells[0] - bells0) as f64 / ops;
    }
    Ok(m)
}

/// `conns` keep-alive HTTP/1.1 clients fetching the `size`-byte file as fast as they can; the
/// server writes each response as `variant` says.
pub(crate) async fn run_file(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each side's busy time is its threads' CPU time between the readings over the wall time:
    /// a thread that started in between counts from zero, one that ended is left out.
    #[test]
    fn sides_are_busy_by_their_threads_cpu_time_over_the_wall() {
        let ms = Duration::from_millis;
        let before = [(1, 0, ms(1000)), (2, 1, ms(2000)), (4, 1, ms(500))];
        let after = [(1, 0, ms(1500)), (2, 1, ms(2250)), (3, 1, ms(250))];
        assert_eq!(side_busy(&before, &after, ms(1000)), [0.5, 0.5]);
        assert_eq!(side_busy(&before, &after, Duration::ZERO), [0.0, 0.0]);
        // This process's own reading finds its main thread, as the client's side.
        assert!(side_cpu().iter().any(|&(_, side, _)| side == 1));
    }
}
