//! Results: rows, medians over repeats, ratios against TCP, the table, JSON and the plot.

use super::machine::Limits;
use super::*;

#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) case: Case,
    pub(crate) kind: Kind,
    /// The file scenario's response mode; empty elsewhere.
    pub(crate) variant: &'static str,
    /// The medians over the runs.
    pub(crate) m: Measure,
    /// Each run, in round order (round `i` of every row of a case ran back to back).
    pub(crate) per_run: Vec<Measure>,
}

impl Row {
    pub(crate) fn transport(&self) -> String {
        if self.variant.is_empty() {
            self.kind.name().to_string()
        } else {
            format!("{}/{}", self.kind.name(), self.variant)
        }
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

pub(crate) fn combine(runs: Vec<Measure>) -> Measure {
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
        doorbells_per_op: pick(|m| m.doorbells_per_op),
        sleeps_per_op: pick(|m| m.sleeps_per_op),
        steal_pct: pick(|m| m.steal_pct),
        handoff_us: pick(|m| m.handoff_us),
        server_busy: pick(|m| m.server_busy),
        client_busy: pick(|m| m.client_busy),
        // Each percentile step's median over the runs.
        quantiles: (0..runs.iter().map(|m| m.quantiles.len()).min().unwrap_or(0))
            .map(|i| median(runs.iter().map(|m| m.quantiles[i]).collect()))
            .collect(),
    }
}

/// A row's headline metric: p50 latency for rr (lower is better), throughput for stream,
/// connections/s for crr and requests (calls)/s for the others (higher is better).
fn headline(scenario: Scenario, m: &Measure) -> f64 {
    match scenario {
        Scenario::Rr => m.p50_us,
        Scenario::Stream => m.bytes_per_s,
        _ => m.ops_per_s,
    }
}

/// Each round's ratio of `row` against `base` (the runs of one round ran back to back).
fn round_ratios(row: &Row, base: &Row) -> Vec<f64> {
    let s = row.case.scenario;
    row.per_run
        .iter()
        .zip(&base.per_run)
        .filter_map(|(a, b)| {
            let (a, b) = (headline(s, a), headline(s, b));
            (b > 0.0).then(|| a / b)
        })
        .collect()
}

/// A ratio over the rounds: the median of the rounds' ratios, with their range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ratio {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Ratio {
    fn of(v: Vec<f64>) -> Option<Ratio> {
        if v.is_empty() {
            return None;
        }
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Ratio { median: median(v), min, max })
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{:.2}x", self.median)
        } else {
            write!(f, "{:.2}x [{:.2}-{:.2}]", self.median, self.min, self.max)
        }
    }
}

/// The ratio against tcp for the row's headline metric: the median over rounds of each
/// round's smc (or unix) run against the tcp run next to it.
pub(crate) fn ratio(row: &Row, rows: &[Row]) -> Option<Ratio> {
    let tcp = rows
        .iter()
        .find(|r| r.kind == Kind::Tcp && r.variant.is_empty() == row.variant.is_empty() && r.case == row.case)?;
    Ratio::of(round_ratios(row, tcp))
}

/// For the file scenario: each smc row's requests/s against smc with plain writes, round by
/// round.
pub(crate) fn ratio_vs_smc_write(row: &Row, rows: &[Row]) -> Option<Ratio> {
    if row.case.scenario != Scenario::File || row.kind != Kind::Smc {
        return None;
    }
    let base = rows.iter().find(|r| r.kind == Kind::Smc && r.variant == "write" && r.case == row.case)?;
    Ratio::of(round_ratios(row, base))
}

/// For the http, http-close and grpc scenarios: each smc or tcp row against the same stack
/// over an in-process pipe (the mem row), round by round: how much of the stack's ceiling on
/// this machine the transport leaves.
pub(crate) fn ratio_vs_mem(row: &Row, rows: &[Row]) -> Option<Ratio> {
    if !row.case.scenario.has_mem() || !matches!(row.kind, Kind::Smc | Kind::Tcp) {
        return None;
    }
    let mem = rows.iter().find(|r| r.kind == Kind::Mem && r.case == row.case)?;
    Ratio::of(round_ratios(row, mem))
}

/// The row's headline against the machine's limit in the same run: rr's p50 in atomic
/// ping-pong round trips (lower is better), stream's throughput as a share of one CPU's
/// 64 KiB memcpy, file's bytes served as a share of one CPU's 16 MiB memcpy (each byte of a
/// response is copied at least once on each side, out of cache: the file into the ring, the
/// ring into the client's buffer).
pub(crate) fn vs_machine(row: &Row, limits: &Limits) -> Option<f64> {
    match row.case.scenario {
        Scenario::Rr if limits.pingpong_us > 0.0 => Some(row.m.p50_us / limits.pingpong_us),
        Scenario::Stream if limits.memcpy_64k > 0.0 => Some(row.m.bytes_per_s / limits.memcpy_64k),
        Scenario::File if limits.memcpy_16m > 0.0 => Some(row.m.bytes_per_s / limits.memcpy_16m),
        _ => None,
    }
}

/// rr's p50 in round trips between two tokio tasks over one cache line ([`Limits::task_rt_us`]):
/// how far the row is from what any tokio stream could reach on this machine.
pub(crate) fn vs_task(row: &Row, limits: &Limits) -> Option<f64> {
    (row.case.scenario == Scenario::Rr && limits.task_rt_us > 0.0).then(|| row.m.p50_us / limits.task_rt_us)
}

/// rr's p50 in round trips of the machine's own copy of the message between two threads at the
/// moment of the run ([`Measure::handoff_us`]): with the VM's phases divided out, what the
/// transport adds to what moving the message costs.
pub(crate) fn vs_handoff(row: &Row) -> Option<f64> {
    (row.case.scenario == Scenario::Rr && row.m.handoff_us > 0.0).then(|| row.m.p50_us / row.m.handoff_us)
}

/// Stream's throughput, and the bytes a file row served, as a share of what the machine's own
/// ring between its two CPUs carried in the same run: the same pipeline (copied in on one CPU,
/// out on the other) with no transport around it, so the share says what the transport leaves
/// of what crossing costs. (A file's bytes cross the same way: into the ring on the server's
/// CPU, out of it on the client's; cork+sendfile copies each byte once on each side, as the
/// ring does.)
pub(crate) fn vs_ring(row: &Row, limits: &Limits) -> Option<f64> {
    (matches!(row.case.scenario, Scenario::Stream | Scenario::File) && limits.ring_64k > 0.0)
        .then(|| row.m.bytes_per_s / limits.ring_64k)
}

/// A latency in microseconds for the table: two decimals below 10 us (a shared-memory round
/// trip is a few tenths of one, and one decimal hid a fifth of it), one above.
fn micros(us: f64) -> String {
    if us < 10.0 {
        format!("{us:.2}")
    } else {
        format!("{us:.1}")
    }
}

pub(crate) fn print_table(rows: &[Row], limits: &Limits) {
    println!("{}", limits.describe());
    println!(
        "{:<10} {:>7} {:>5} {:<18} {:<12} {:>9} {:>9} {:>9} {:>11} {:>10} {:>9} {:>8} {:>9} {:>6} {:>6} {:>9} {:>25}  vs tcp",
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
        "bells/op",
        "sleeps/op",
        "errors",
        "steal%",
        "busy s/c",
        "machine"
    );
    for r in rows {
        let what = match r.case.scenario {
            Scenario::Rr => "p50 latency",
            Scenario::Stream => "throughput",
            Scenario::Crr => "conn/s",
            Scenario::File | Scenario::Http | Scenario::HttpClose => "req/s",
            Scenario::Grpc => "calls/s",
        };
        let vs = match (ratio(r, rows), ratio_vs_smc_write(r, rows), ratio_vs_mem(r, rows)) {
            (Some(x), Some(y), _) => format!("{x} {what} ({y} smc/write)"),
            (Some(x), None, Some(y)) => format!("{x} {what} ({y} of mem)"),
            (Some(x), None, None) => format!("{x} {what}"),
            (None, _, Some(y)) => format!("- ({y} {what} of mem)"),
            (None, Some(y), None) => format!("- ({y} smc/write)"),
            (None, None, None) => "-".into(),
        };
        let machine = match (r.case.scenario, vs_machine(r, limits), vs_ring(r, limits)) {
            (Scenario::Rr, Some(x), _) => {
                let task = vs_task(r, limits).map(|y| format!(" {y:.1}x tsk")).unwrap_or_default();
                let handoff = vs_handoff(r).map(|z| format!(" {z:.1}x hnd")).unwrap_or_default();
                format!("{x:.1}x rt{task}{handoff}")
            }
            (Scenario::File, Some(x), Some(y)) => format!("{x:.2} cpy16m {y:.2} rng"),
            (Scenario::File, Some(x), None) => format!("{x:.2} cpy16m"),
            (_, Some(x), Some(y)) => format!("{x:.2} cpy {y:.2} rng"),
            (_, Some(x), None) => format!("{x:.2} cpy"),
            (_, None, _) => "-".into(),
        };
        // Which side ran all the time (in `local`; separate processes measure only their own).
        let busy = if r.m.server_busy > 0.0 || r.m.client_busy > 0.0 {
            format!("{:.2}/{:.2}", r.m.server_busy, r.m.client_busy)
        } else {
            "-".into()
        };
        println!(
            "{:<10} {:>7} {:>5} {:<18} {:<12} {:>9} {:>9} {:>9} {:>11.0} {:>10.1} {:>9.2} {:>8.3} {:>9.3} {:>6} {:>6.0} {:>9} {:>25}  {}",
            r.case.scenario.name(),
            r.case.size,
            r.case.conns,
            r.transport(),
            r.m.negotiated,
            micros(r.m.p50_us),
            micros(r.m.p99_us),
            micros(r.m.p999_us),
            r.m.ops_per_s,
            r.m.bytes_per_s / 1e6,
            r.m.cpu_us_per_op,
            r.m.doorbells_per_op,
            r.m.sleeps_per_op,
            r.m.errors,
            r.m.steal_pct,
            busy,
            machine,
            vs
        );
    }
}

pub(crate) fn print_json(rows: &[Row], opts: &Opts, limits: &Limits) {
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
                "doorbells_per_op": r.m.doorbells_per_op,
                "sleeps_per_op": r.m.sleeps_per_op,
                "steal_pct": r.m.steal_pct,
                "server_busy_cpus": r.m.server_busy,
                "client_busy_cpus": r.m.client_busy,
                "runs": r.per_run.len(),
                "ratio_vs_tcp": ratio(r, rows).map(|x| x.median),
                "ratio_vs_tcp_range": ratio(r, rows).map(|x| [x.min, x.max]),
                "ratio_vs_smc_write": ratio_vs_smc_write(r, rows).map(|x| x.median),
                "ratio_vs_mem": ratio_vs_mem(r, rows).map(|x| x.median),
                "ratio_vs_machine": vs_machine(r, limits),
                "ratio_vs_ring": vs_ring(r, limits),
                "ratio_vs_task_round_trip": vs_task(r, limits),
                "handoff_round_trip_us": r.m.handoff_us,
                "ratio_vs_handoff": vs_handoff(r),
            })
        })
        .collect();
    let doc = json!({
        "tool": "smcperf",
        "duration_s": opts.duration.as_secs_f64(),
        "runtime": opts.runtime.to_string(),
        "pinned": opts.pin,
        "machine": {
            "pingpong_round_trip_us": limits.pingpong_us,
            "task_round_trip_us": limits.task_rt_us,
            "memcpy_64k_bytes_per_s": limits.memcpy_64k,
            "memcpy_16m_bytes_per_s": limits.memcpy_16m,
            "ring_64k_bytes_per_s": limits.ring_64k,
        },
        "stats": smc_tokio::stats().to_string(),
        "results": results,
    });
    println!("{doc:#}");
}

/// `--plot`: a panel per case, a line per transport.
pub(crate) fn write_plot(path: &std::path::Path, rows: &[Row]) -> io::Result<()> {
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
