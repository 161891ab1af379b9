#!/bin/sh
# Two-guest mode, guest B (10.0.0.2): the client side of each test, against
# the server guest at $RDMA_VM_SERVER_IP (10.0.0.1). Same order and ports as
# guest-two-server.sh; each client retries its connect while the server is
# not listening yet. This guest's exit status decides the run.
. /etc/rdma-vm/guest-lib.sh

S=$RDMA_VM_SERVER_IP
# Across hosts a client proposes SMC in-band only to destinations it was told run smc-tokio:
# the server guest is one.
export SMC_TOKIO_INBAND_PEERS="$S"
D=$RDMA_VM_DEV
G=$RDMA_VM_GID_INDEX
T=$RDMA_VM_CMD_TIMEOUT

step devinfo 30 ibv_devinfo -d "$D"

if [ "${RDMA_VM_SKIP_BASELINE:-0}" != 1 ]; then
    client_step rc_pingpong-4096 "$T" 60 ibv_rc_pingpong -d "$D" -g "$G" -s 4096 -n 1000 -p 18515 "$S"
    pingpong_figure rc_pingpong-4096 two-rc_pingpong-4096B
    client_step rc_pingpong-16 "$T" 60 ibv_rc_pingpong -d "$D" -g "$G" -s 16 -n 1000 -p 18525 "$S"
    pingpong_figure rc_pingpong-16 two-rc_pingpong-16B
    client_step write_bw "$T" 60 ib_write_bw -d "$D" -x "$G" -s 65536 -n 2000 -p 18516 "$S"
    write_bw_figure write_bw two-ib_write_bw-64KiB 65536
    client_step send_lat "$T" 60 ib_send_lat -d "$D" -x "$G" -s 16 -n 1000 -p 18517 "$S"
    send_lat_figure send_lat two-ib_send_lat-16B 16
fi

# --- Hook: the project's RDMA test runner (package `tests`), when passed with
# --bin (it waits for the server guest's port itself). Then tell the server
# guest that we are through, so that it stops its server and powers off.
if [ -x /bin/smc-rdma-test ]; then
    step smc-rdma-test-devices 60 smc-rdma-test devices
    step smc-rdma-test "${SMC_RDMA_TEST_TIMEOUT:-$T}" smc-rdma-test client "$S"
    peer_done_signal smc-rdma-test
fi

# --- smcperf (package `benches`, built with `--features rdma`), when passed
# with --bin: SMC-R against TCP between the same guests, stream and RR.
if [ -x /bin/smcperf ]; then
    client_step smcperf "$T" 60 smcperf client --connect "$S:7000" --shm off --transport smc,tcp \
        --scenario rr,stream --size 14,65536 --duration 3 --runs 3
    peer_done_signal smcperf
fi

finish
