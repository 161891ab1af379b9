//! SMC-R for real: boots Debian's kernel with soft-RoCE (`rdma_rxe`) in a qemu guest through the
//! test bed (`tests/rdma-vm/run.sh single`) and runs `smc-rdma-test single` there, both ends on
//! `rxe0`: handshake to smc-r on both sides, integrity at random sizes, 100 connections, cork and
//! sendfile both ways, half-close, abort, a corrupt CDC message, no device, a peer killed
//! mid-stream. The script installs its host packages and caches the kernel package
//! (`~/.cache/smc-tokio-rdma-vm`); the first run downloads about 110 MB.
//!
//! Set `SMC_TOKIO_SKIP_RDMA_VM=1` to leave it out of a local run (it then says so and passes).
#![cfg(feature = "rdma")]

#[test]
fn smc_r_on_soft_roce_in_a_qemu_guest() {
    let bin = env!("CARGO_BIN_EXE_smc-rdma-test");
    let shown = |l: &str| {
        l.starts_with("PASS")
            || l.starts_with("FAIL")
            || l.starts_with("stats")
            || l.starts_with("  writers_exit")
            || l.starts_with("  setup_off")
    };
    let Some(console) = tests::run_test_bed(
        &["single", "--bin", bin, "--env", "RDMA_VM_SKIP_BASELINE=1", "--timeout", "900"],
        &["single.log"],
        shown,
    ) else {
        return;
    };
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
}
