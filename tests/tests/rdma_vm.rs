//! SMC-R for real: boots Debian's kernel with soft-RoCE (`rdma_rxe`) in a qemu guest through the
//! test bed (`tests/rdma-vm/run.sh single`) and runs `smc-rdma-test single` there, both ends on
//! `rxe0`: handshake to smc-r on both sides, integrity at random sizes, 100 connections, cork and
//! sendfile both ways, half-close, abort, a corrupt CDC message, no device, a connection moved
//! back to TCP mid-stream (asked for, and under a failed link group), a peer killed mid-stream,
//! pinned memory charged to the RMB budget and given back.
//! The whole run gets 600 s in the guest (`SMC_RDMA_TEST_TIMEOUT`; it takes about two
//! minutes under emulation, past the test bed's default 120 s per command). The script installs its host packages and caches the kernel package
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
            || l.starts_with("  move_")
            || l.starts_with("  connections_")
    };
    let Some(console) = tests::run_rdma_test("single", bin, &["single.log"], shown) else {
        return;
    };
    let extra = [
        "peer_killed_mid_stream",
        "writers_exit",
        "setup_off_runtime",
        "no_inline_sends",
        "group_outlives_runtime",
        "flush_across_link_failure",
        "pinned_memory_charged",
    ];
    tests::assert_cases_passed(&console, tests::RDMA_CASES.into_iter().chain(extra));
}
