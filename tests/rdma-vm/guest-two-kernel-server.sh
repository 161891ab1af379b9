#!/bin/sh
# two-kernel mode, guest A (10.0.0.1): smc-tokio and the kernel's own SMC-R.
#  1. smc-kernel-test server: an smc-tokio listener on the kernel's AF_SMC
#     socket, for ksmc-echo's C client (guest B); prints
#     "KERNEL-INTEROP kernel-client->smc-tokio smc-r" when smc_diag says
#     SMC-R and the exchange (cork + sendfile back) is intact.
#  2. ksmc-echo iserver: a C AF_SMC server for smc-tokio's client (guest B),
#     checking smc_diag on its side too.
#  3. smcperf server --kernel on (raw scenarios: ksmc, smc, tcp rows).
# Both guests set the same user EID first: SMC-Rv2 over soft-RoCE needs one.
. /etc/rdma-vm/guest-lib.sh
T=$RDMA_VM_CMD_TIMEOUT
: "${KSMC_UEID:=SMC-TOKIO-RDMA-VM}"

step ueid 30 ksmc-echo ueid "$KSMC_UEID"
step kernel-limit 30 smc-kernel-test limit

bg_step kernel-client-to-smc-tokio "$T" smc-kernel-test server 7200 2
wait_step kernel-client-to-smc-tokio

bg_step smc-tokio-client-to-kernel "$T" ksmc-echo iserver 7201 1
wait_step smc-tokio-client-to-kernel

if [ -x /bin/smcperf ]; then
    bg_step smcperf-server 500 smcperf server --listen "$RDMA_VM_SERVER_IP:7000" --shm off --kernel on
    peer_done_wait 500 smcperf
    stop_step smcperf-server
fi
finish
