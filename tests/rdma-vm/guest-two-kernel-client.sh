#!/bin/sh
# two-kernel mode, guest B (10.0.0.2): the client side of
# guest-two-kernel-server.sh, in the same order.
#  1. ksmc-echo iclient (C, AF_SMC) against smc-tokio's AF_SMC listener: two
#     exchanges (1 MiB up / 4 MiB down, then 14 B / 14 B), smc_diag checked.
#  2. smc-kernel-test client (smc-tokio, KernelMode::On) against ksmc-echo's
#     C server; prints "KERNEL-INTEROP smc-tokio-client->kernel smc-r".
#  3. smcperf client: ksmc (the kernel's SMC-R through smc-tokio), smc
#     (smc-tokio's own SMC-R, in-band) and tcp, same run.
. /etc/rdma-vm/guest-lib.sh
T=$RDMA_VM_CMD_TIMEOUT
S=$RDMA_VM_SERVER_IP
: "${KSMC_UEID:=SMC-TOKIO-RDMA-VM}"

step ueid 30 ksmc-echo ueid "$KSMC_UEID"

step kernel-client-big "$T" ksmc-echo iclient "$S" 7200 1048576 4194304
step kernel-client-small "$T" ksmc-echo iclient "$S" 7200 14 14

step smc-tokio-client "$T" smc-kernel-test client "$S" 7201 1048576 4194304

if [ -x /bin/smcperf ]; then
    client_step smcperf 400 60 env SMC_TOKIO_INBAND_PEERS="$S" smcperf client --connect "$S:7000" \
        --shm off --transport ksmc,smc,tcp --scenario rr,stream --size 14,65536 --duration 2 --runs 3
    peer_done_signal smcperf
fi
finish
