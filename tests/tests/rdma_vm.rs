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
//! Also a test of the test bed itself (a guest stuck in its power-off keeps its result).
//!
//! Set `SMC_TOKIO_SKIP_RDMA_VM=1` to leave them out of a local run (they then say so and pass).
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
            || l.starts_with("  close_across")
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
        "close_across_link_failure",
        "pinned_memory_charged",
    ];
    tests::assert_cases_passed(&console, tests::RDMA_CASES.into_iter().chain(extra));
}

/// The test bed itself: a guest that printed its result and then never powers off (as a guest
/// kernel's SMC-R teardown has made one, after every check had passed) is stopped 30 s later and
/// its result stands; the guest's `/init` simulates the stuck power-off. The run failed at the
/// host-side timeout before (900 s in the tests).
#[test]
fn a_guest_stuck_in_its_power_off_keeps_its_result() {
    let dir = std::env::temp_dir().join(format!("smc-rdma-vm-stuck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("guest.sh");
    std::fs::write(&script, "#!/bin/sh\necho guest script ran\nexit 0\n").unwrap();
    let script = script.to_str().unwrap();
    let args = ["single", "--script", script, "--env", "RDMA_VM_STUCK_POWEROFF=1", "--timeout", "300"];
    let console = tests::run_test_bed(&args, &["single.log"], |l| l.starts_with("guest script"));
    let _ = std::fs::remove_dir_all(&dir);
    let Some(console) = console else { return };
    assert!(console.contains("guest script ran"), "the guest's script did not run:\n{console}");
    assert!(console.contains("RDMA-VM-RESULT: 0"), "no result marker:\n{console}");
}
