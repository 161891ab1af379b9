//! SMC-R for real: boots Debian's kernel with soft-RoCE (`rdma_rxe`) in a qemu guest through the
//! test bed (`tests/rdma-vm/run.sh single`) and runs `smc-rdma-test single` there, both ends on
//! `rxe0`: handshake to smc-r on both sides, integrity at random sizes, 100 connections, cork and
//! sendfile both ways, half-close, abort, a corrupt CDC message, no device, a peer killed
//! mid-stream. The script installs its host packages and caches the kernel package
//! (`~/.cache/smc-tokio-rdma-vm`); the first run downloads about 110 MB.
//!
//! Set `SMC_TOKIO_SKIP_RDMA_VM=1` to leave it out of a local run (it then says so and passes).
#![cfg(feature = "rdma")]

use std::process::Command;

#[test]
fn smc_r_on_soft_roce_in_a_qemu_guest() {
    if std::env::var("SMC_TOKIO_SKIP_RDMA_VM").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: SMC_TOKIO_SKIP_RDMA_VM=1");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_smc-rdma-test");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/rdma-vm/run.sh");
    // The emulated guest kernel's rxe driver has crashed now and then under heavy host load
    // (a slab corruption in rxe_receiver, also during perftest's own runs): that one outcome
    // (status 125, no result marker) is retried once; every other failure fails the test.
    for attempt in 1..=2 {
        let out_dir = std::env::temp_dir().join(format!("smc-rdma-vm-{}-{attempt}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out_dir);
        let out = Command::new("bash")
            .arg(script)
            .args(["single", "--bin", bin, "--env", "RDMA_VM_SKIP_BASELINE=1", "--timeout", "900", "--quiet"])
            .arg("--out")
            .arg(&out_dir)
            .output()
            .expect("run tests/rdma-vm/run.sh");
        let console = std::fs::read_to_string(out_dir.join("single.log")).unwrap_or_default();
        eprintln!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let shown = |l: &str| {
            l.starts_with("PASS")
                || l.starts_with("FAIL")
                || l.starts_with("stats")
                || l.starts_with("  writers_exit")
                || l.starts_with("  setup_off")
        };
        for line in console.lines().filter(|l| shown(l)) {
            eprintln!("guest: {line}");
        }
        match out.status.code() {
            Some(0) => {
                for case in [
                    "handshake_smc_r",
                    "integrity_random_sizes",
                    "connections_100",
                    "cork_sendfile_from_server",
                    "cork_sendfile_to_server",
                    "half_close",
                    "abort",
                    "corrupt_cdc_fails_one_connection",
                    "no_device_falls_back",
                    "peer_killed_mid_stream",
                    "writers_exit",
                    "setup_off_runtime",
                    "no_inline_sends",
                    "group_outlives_runtime",
                ] {
                    assert!(console.contains(&format!("PASS {case} ")), "case {case} did not pass:\n{console}");
                }
                assert!(!console.contains("\nFAIL"), "a case failed:\n{console}");
                let _ = std::fs::remove_dir_all(&out_dir);
                return;
            }
            Some(125) if attempt == 1 => eprintln!("the guest printed no result (kernel crash?); retrying once"),
            other => panic!("the soft-RoCE test bed failed with {other:?}; console:\n{console}"),
        }
    }
}
