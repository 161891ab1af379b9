#!/bin/sh
# Single-guest command script (run by the guest's /init; see run.sh).
# Server and client of each test run in this one guest on the same rxe0 and
# the same address ($RDMA_VM_IP, 10.0.0.1): rxe1 -> rxe0 inside one guest
# fails at RTR, so there is only one rxe device.
#
# Skip the perftest/pingpong baseline with: run.sh single --env RDMA_VM_SKIP_BASELINE=1
. /etc/rdma-vm/guest-lib.sh

IPADDR=$RDMA_VM_IP
D=$RDMA_VM_DEV
G=$RDMA_VM_GID_INDEX
T=$RDMA_VM_CMD_TIMEOUT

step devinfo 30 ibv_devinfo -d "$D"

# With one vCPU (the default), two busy-polling processes only take turns at
# scheduler ticks (4 ms): ibv_rc_pingpong without -e measures ~8000 usec/iter
# here. So the ping-pong uses completion events (-e), and ib_send_lat (which
# busy-polls, and hangs with -e on rxe: "cq queue full") only runs with
# --smp 2 or more. The same holds for any program of ours whose two ends
# share this guest: busy-polling ends need --smp 2.
NCPU=$(nproc)
if [ "${RDMA_VM_SKIP_BASELINE:-0}" != 1 ]; then
    # RC ping-pong, 4 KiB and 16 B (the RR latency baseline).
    for size in 4096 16; do
        bg_step "rc_pingpong-$size-server" "$T" ibv_rc_pingpong -e -d "$D" -g "$G" -s "$size" -n 1000 -p 18515
        client_step "rc_pingpong-$size" "$T" 20 ibv_rc_pingpong -e -d "$D" -g "$G" -s "$size" -n 1000 -p 18515 "$IPADDR"
        wait_step "rc_pingpong-$size-server"
        pingpong_figure "rc_pingpong-$size" "single-rc_pingpong-${size}B"
    done

    # RDMA write bandwidth, 64 KiB messages.
    bg_step write_bw-server "$T" ib_write_bw -d "$D" -x "$G" -s 65536 -n 2000 -p 18516
    client_step write_bw "$T" 20 ib_write_bw -d "$D" -x "$G" -s 65536 -n 2000 -p 18516 "$IPADDR"
    wait_step write_bw-server
    write_bw_figure write_bw single-ib_write_bw-64KiB 65536

    # Send latency, 16 B (busy-polling on both ends: needs 2 vCPUs).
    if [ "$NCPU" -gt 1 ]; then
        bg_step send_lat-server "$T" ib_send_lat -d "$D" -x "$G" -s 16 -n 1000 -p 18517
        client_step send_lat "$T" 20 ib_send_lat -d "$D" -x "$G" -s 16 -n 1000 -p 18517 "$IPADDR"
        wait_step send_lat-server
        send_lat_figure send_lat single-ib_send_lat-16B 16
    else
        echo "=== send_lat: skipped with 1 vCPU (tick-bound); run.sh single --smp 2 runs it"
    fi
fi

# --- Hook: the project's RDMA test runner (package `tests`, binary
# smc-rdma-test), when passed in with:
#   run.sh single --bin target/debug/smc-rdma-test [--env RUST_LOG=debug]
# Its status counts (the number of failed cases). SMC_RDMA_TEST_TIMEOUT
# (seconds, via --env) bounds it; keep it below run.sh's --timeout.
if [ -x /bin/smc-rdma-test ]; then
    step smc-rdma-test-devices 60 smc-rdma-test devices
    step smc-rdma-test "${SMC_RDMA_TEST_TIMEOUT:-$T}" smc-rdma-test single "$IPADDR"
fi

# --- smcperf (package `benches`, built with `--features rdma`), when passed
# with --bin: both ends in this guest on rxe0.
if [ -x /bin/smcperf ]; then
    bg_step smcperf-server "$T" smcperf server --listen "$IPADDR:7000" --shm off
    client_step smcperf "$T" 20 smcperf client --connect "$IPADDR:7000" --shm off --transport smc,tcp \
        --scenario rr,stream --size 14,65536 --duration 3 --runs 3
    stop_step smcperf-server
fi

finish
