//! The README's main job works: `smcperf local`, briefly, over every scenario, gives a row for
//! each transport it runs, the smc rows over shared memory, with no errors, and the ratios that
//! the table prints. No figure is judged: this machine's speed is not a test's business.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Far above the few seconds the run takes (a debug build included): a run that hangs fails.
const DEADLINE: Duration = Duration::from_secs(180);

/// The rows `smcperf local --json` gives for one scenario: every transport it runs there.
const EXPECTED: &[(&str, &[&str])] = &[
    ("rr", &["smc", "tcp", "unix"]),
    ("stream", &["smc", "tcp", "unix"]),
    ("crr", &["smc", "tcp", "unix"]),
    ("file", &["smc/cork-sendfile", "smc/write", "smc/sendfile", "tcp/write"]),
    ("http", &["smc", "tcp", "mem"]),
    ("http-close", &["smc", "tcp", "mem"]),
    ("grpc", &["smc", "tcp", "mem"]),
];

#[test]
fn smcperf_local_runs_every_scenario_over_every_transport() {
    let scenarios: Vec<&str> = EXPECTED.iter().map(|(s, _)| *s).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_smcperf"))
        .args(["local", "--scenario", &scenarios.join(","), "--duration", "0.1", "--conns", "4", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("smcperf starts");
    let started = Instant::now();
    while child.try_wait().expect("smcperf's status").is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("smcperf local still ran after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("smcperf's output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "smcperf failed: {stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stderr}"));
    // The ping-pong needs two CPUs (a machine with one leaves it out, and rr's ratio to it).
    let two_cpus = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    assert_eq!(
        doc["machine"]["pingpong_round_trip_us"].as_f64().is_some_and(|v| v > 0.0),
        two_cpus,
        "the machine's ping-pong: {doc:#}"
    );
    for size in ["64k", "16m"] {
        let copied = doc["machine"][format!("memcpy_{size}_bytes_per_s")].as_f64();
        assert!(copied.is_some_and(|v| v > 0.0), "no memcpy figure for {size}: {doc:#}");
    }
    let results = doc["results"].as_array().expect("results");
    for (scenario, transports) in EXPECTED {
        for transport in *transports {
            let rows: Vec<&Value> =
                results.iter().filter(|r| r["scenario"] == *scenario && r["transport"] == *transport).collect();
            assert!(!rows.is_empty(), "no {scenario} row over {transport}");
            for row in rows {
                let what = format!("{scenario} over {transport}: {row:#}");
                assert!(row["ops_per_s"].as_f64().is_some_and(|v| v > 0.0), "nothing done, {what}");
                // The scenarios that count failed operations (the others fail the whole run).
                if ["crr", "http", "http-close"].contains(scenario) {
                    assert_eq!(row["errors"], 0, "{what}");
                }
                let negotiated = match transport.split('/').next() {
                    Some("smc") => "smc-d",
                    Some(other) => other,
                    None => unreachable!("split gives at least one piece"),
                };
                assert_eq!(row["negotiated"], negotiated, "{what}");
                if !transport.starts_with("tcp") {
                    assert!(row["ratio_vs_tcp"].as_f64().is_some(), "no ratio against tcp, {what}");
                }
                let against_mem =
                    ["http", "http-close", "grpc"].contains(scenario) && ["smc", "tcp"].contains(transport);
                assert_eq!(row["ratio_vs_mem"].is_f64(), against_mem, "ratio against mem, {what}");
                let against_machine = ["stream", "file"].contains(scenario) || (*scenario == "rr" && two_cpus);
                assert_eq!(row["ratio_vs_machine"].is_f64(), against_machine, "ratio against the machine, {what}");
                let against_ring = ["stream", "file"].contains(scenario) && two_cpus;
                assert_eq!(row["ratio_vs_ring"].is_f64(), against_ring, "ratio against the two-cpu ring, {what}");
                // rr's own round trip of the machine, measured next to each run.
                let handoff = *scenario == "rr" && two_cpus;
                assert_eq!(row["ratio_vs_handoff"].is_f64(), handoff, "ratio against the handoff, {what}");
                assert_eq!(
                    row["handoff_round_trip_us"].as_f64().is_some_and(|us| us > 0.0),
                    handoff,
                    "the handoff's round trip, {what}"
                );
                // Both sides of `local` ran, and their threads were found by name.
                for side in ["server_busy_cpus", "client_busy_cpus"] {
                    assert!(row[side].as_f64().is_some_and(|v| v > 0.0), "{side}, {what}");
                }
                let against_writes = *scenario == "file" && transport.starts_with("smc/");
                assert_eq!(row["ratio_vs_smc_write"].is_f64(), against_writes, "ratio against plain writes, {what}");
            }
        }
    }
    let listed: usize = EXPECTED.iter().map(|(s, t)| t.len() * if *s == "rr" { 2 } else { 1 }).sum();
    assert_eq!(results.len(), listed, "rows beyond those expected: {doc:#}");
}
