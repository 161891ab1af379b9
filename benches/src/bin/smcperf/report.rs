//! Results: rows, medians over repeats, ratios against TCP, the table, JSON and the plot.

use super::*;

#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) case: Case,
    pub(crate) kind: Kind,
    /// The file scenario's response mode; empty elsewhere.
    pub(crate) variant: &'static str,
    pub(crate) m: Measure,
    pub(crate) runs: usize,
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
        // Each percentile step's median over the runs.
        quantiles: (0..runs.iter().map(|m| m.quantiles.len()).min().unwrap_or(0))
            .map(|i| median(runs.iter().map(|m| m.quantiles[i]).collect()))
            .collect(),
    }
}

/// The ratio against tcp for the row's headline metric: p50 latency for rr (lower is better),
/// throughput for stream, connections/s for crr and requests (calls)/s for the others (higher
/// is better).
pub(crate) fn ratio(row: &Row, rows: &[Row]) -> Option<f64> {
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
pub(crate) fn ratio_vs_smc_write(row: &Row, rows: &[Row]) -> Option<f64> {
    if row.case.scenario != Scenario::File || row.kind != Kind::Smc {
        return None;
    }
    let base = rows.iter().find(|r| {
        r.kind == Kind::Smc && r.variant == "write" && r.case.size == row.case.size && r.case.conns == row.case.conns
    })?;
    (base.m.ops_per_s > 0.0).then(|| row.m.ops_per_s / base.m.ops_per_s)
}

pub(crate) fn print_table(rows: &[Row]) {
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

pub(crate) fn print_json(rows: &[Row], opts: &Opts) {
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
