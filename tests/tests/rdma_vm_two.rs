//! smc-tokio to smc-tokio SMC-R across two hosts: boots two qemu guests with soft-RoCE
//! (`rdma_rxe`), linked by qemu's socket network, through the test bed (`tests/rdma-vm/run.sh
//! two`). The server guest serves `smc-rdma-test server`; the client guest, which names the
//! server as an in-band peer (`SMC_TOKIO_INBAND_PEERS`, as a cross-host deployment opts in), runs
//! `smc-rdma-test client` against it: every case asserts that both ends are smc-r before it
//! checks its bytes, so a change that breaks the cross-host path, or makes it fall back to TCP,
//! fails here. One case takes two hosts: the client guest drops the RoCE packets that reach it
//! in the middle of an echo, and the connection must move to TCP with nothing lost, though
//! neither side's link reports more than a peer that stopped answering; and again with the
//! connection idle, where only the link's own test finds the broken path.
//!
//! Set `SMC_TOKIO_SKIP_RDMA_VM=1` to leave it out of a local run (it then says so and passes).
#![cfg(feature = "rdma")]

#[test]
fn smc_r_between_two_hosts_on_soft_roce() {
    let bin = env!("CARGO_BIN_EXE_smc-rdma-test");
    let Some(console) = tests::run_rdma_test("two", bin, &["client.log"], |l| {
        l.starts_with("PASS") || l.starts_with("FAIL") || l.starts_with("stats") || l.starts_with("  ")
    }) else {
        return;
    };
    tests::assert_cases_passed(
        &console,
        tests::RDMA_CASES.into_iter().chain([
            "path_cut_moves_to_tcp",
            "silent_host_ends_the_connection",
            "idle_path_cut_moves_to_tcp",
        ]),
    );
}
