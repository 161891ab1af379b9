//! smc-tokio against the Linux kernel's own SMC-R, both ways: boots two guests with soft-RoCE
//! through the test bed (`tests/rdma-vm/run.sh two-kernel --no-perf`). A C client on `AF_SMC`
//! (`ksmc-echo iclient`) against an smc-tokio listener on `AF_SMC`, and an smc-tokio client
//! against a C `AF_SMC` server (`ksmc-echo iserver`); each end checks with the kernel's
//! `smc_diag` that the connection is SMC-R, the bytes are verified, and both sides send under a
//! cork with sendfile. The kernel's global handshake limitation is switched over netlink and
//! back. Before booting, the kernel module's constants and layouts are compared with the
//! installed headers (`kabi.c`).
//!
//! Set `SMC_TOKIO_SKIP_RDMA_VM=1` to leave it out of a local run (it then says so and passes).
#![cfg(feature = "rdma")]

#[test]
fn smc_tokio_and_the_kernels_smc_r_both_ways() {
    let bin = env!("CARGO_BIN_EXE_smc-kernel-test");
    let Some(console) = tests::run_test_bed(
        &["two-kernel", "--no-perf", "--bin", bin, "--timeout", "900"],
        &["server.log", "client.log"],
        |l| l.contains("KERNEL-INTEROP") || l.contains("smc_diag mode"),
    ) else {
        return;
    };
    for want in ["KERNEL-INTEROP kernel-client->smc-tokio smc-r", "KERNEL-INTEROP smc-tokio-client->kernel smc-r"] {
        assert!(console.lines().any(|l| l.trim_end() == want), "no {want:?}:\n{console}");
    }
    // The C peers' own view, from smc_diag: SMC-R on all three of their connections.
    assert_eq!(console.matches("smc_diag mode SMCR").count(), 3, "{console}");
    assert!(console.contains("kernel handshake limitation false -> true -> false"), "{console}");
}
