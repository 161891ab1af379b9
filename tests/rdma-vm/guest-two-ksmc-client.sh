#!/bin/sh
# two-ksmc mode, guest B (10.0.0.2): the kernel's own SMC-R (AF_SMC) echo
# client against guest A. Figures: 16 MiB echo (MB/s each way) and 16 B round
# trips (usec/iter), over SMC-R and then over plain TCP for comparison.
# SMC-R really being used (no silent TCP fallback) is checked with rxe0's
# packet counters.
. /etc/rdma-vm/guest-lib.sh
T=$RDMA_VM_CMD_TIMEOUT
S=$RDMA_VM_SERVER_IP
: "${KSMC_UEID:=SMC-TOKIO-RDMA-VM}"
: "${KSMC_PORT:=7100}"
: "${KSMC_BYTES:=16777216}"

C=/sys/class/infiniband/$RDMA_VM_DEV/ports/1/hw_counters
pkts() { echo $(( $(cat "$C/sent_pkts") + $(cat "$C/rcvd_pkts") )); }
step ueid 30 ksmc-echo ueid "$KSMC_UEID"

p0=$(pkts)
step ksmc-stream-smc "$T" ksmc-echo stream smc "$S" "$KSMC_PORT" "$KSMC_BYTES"
dp=$(( $(pkts) - p0 ))
echo "rxe0 packets during the SMC stream: $dp"
if [ "$dp" -lt 1000 ]; then
    echo "FAIL: SMC fell back to TCP (rxe0 carried $dp packets)"
    RDMA_VM_FAILED=$((RDMA_VM_FAILED + 1))
fi
v=$(sed -n 's/.* = \([0-9.]*\) MB\/s each way/\1/p' "$LOGDIR/ksmc-stream-smc.log")
[ -n "$v" ] && figure ksmc-smcr-echo-16MiB "$v" MB/s-each-way

step ksmc-rr-smc "$T" ksmc-echo rr smc "$S" "$KSMC_PORT" 16 1000
v=$(sed -n 's/.* = \([0-9.]*\) usec\/iter/\1/p' "$LOGDIR/ksmc-rr-smc.log")
[ -n "$v" ] && figure ksmc-smcr-rr-16B "$v" usec/iter

step ksmc-stream-tcp "$T" ksmc-echo stream tcp "$S" "$KSMC_PORT" "$KSMC_BYTES"
v=$(sed -n 's/.* = \([0-9.]*\) MB\/s each way/\1/p' "$LOGDIR/ksmc-stream-tcp.log")
[ -n "$v" ] && figure ksmc-tcp-echo-16MiB "$v" MB/s-each-way

step ksmc-rr-tcp "$T" ksmc-echo rr tcp "$S" "$KSMC_PORT" 16 1000
v=$(sed -n 's/.* = \([0-9.]*\) usec\/iter/\1/p' "$LOGDIR/ksmc-rr-tcp.log")
[ -n "$v" ] && figure ksmc-tcp-rr-16B "$v" usec/iter
finish
