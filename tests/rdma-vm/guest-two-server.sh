#!/bin/sh
# Two-guest mode, guest A (10.0.0.1): the server side of each test.
# The client guest (guest-two-client.sh) runs the same list in the same order,
# retrying each connect until this side listens. Every test uses its own TCP
# port so that a client can never reach the previous test's server.
#
# Skip the baseline with: run.sh two --env RDMA_VM_SKIP_BASELINE=1
. /etc/rdma-vm/guest-lib.sh

D=$RDMA_VM_DEV
G=$RDMA_VM_GID_INDEX
T=$RDMA_VM_CMD_TIMEOUT

step devinfo 30 ibv_devinfo -d "$D"

if [ "${RDMA_VM_SKIP_BASELINE:-0}" != 1 ]; then
    step rc_pingpong-4096-server "$T" ibv_rc_pingpong -d "$D" -g "$G" -s 4096 -n 1000 -p 18515
    step rc_pingpong-16-server "$T" ibv_rc_pingpong -d "$D" -g "$G" -s 16 -n 1000 -p 18525
    step write_bw-server "$T" ib_write_bw -d "$D" -x "$G" -s 65536 -n 2000 -p 18516
    step send_lat-server "$T" ib_send_lat -d "$D" -x "$G" -s 16 -n 1000 -p 18517
fi

# --- Hook: the project's RDMA test runner (package `tests`), when passed with
# --bin. `smc-rdma-test server IP` serves until killed: it is stopped when
# the client guest says it is through (peer_done_signal/peer_done_wait), and
# counts as failed only if it exited by itself with a non-zero status.
if [ -x /bin/smc-rdma-test ]; then
    step smc-rdma-test-devices 60 smc-rdma-test devices
    bg_step smc-rdma-test-server "${SMC_RDMA_TEST_TIMEOUT:-$T}" smc-rdma-test server "$RDMA_VM_SERVER_IP"
    peer_done_wait "${SMC_RDMA_TEST_TIMEOUT:-$T}" smc-rdma-test
    stop_step smc-rdma-test-server
fi

# --- smcperf (package `benches`, built with `--features rdma`), when passed
# with --bin: a server that runs until the client guest is done.
if [ -x /bin/smcperf ]; then
    bg_step smcperf-server "$T" smcperf server --listen "$RDMA_VM_SERVER_IP:7000" --shm off
    peer_done_wait "$T" smcperf
    stop_step smcperf-server
fi

finish
