#!/bin/sh
# two-ksmc mode, guest A (10.0.0.1): the kernel's own SMC-R (AF_SMC) echo
# server. Both guests set the same user EID (KSMC_UEID) over the SMC
# generic-netlink family first; without it the SMC-R handshake declines.
# Serves 4 connections in order: smc stream, smc rr, tcp stream, tcp rr
# (the same AF_SMC listener serves the plain TCP clients by fallback).
. /etc/rdma-vm/guest-lib.sh
T=$RDMA_VM_CMD_TIMEOUT
: "${KSMC_UEID:=SMC-TOKIO-RDMA-VM}"
: "${KSMC_PORT:=7100}"

C=/sys/class/infiniband/$RDMA_VM_DEV/ports/1/hw_counters
step ueid 30 ksmc-echo ueid "$KSMC_UEID"
s0=$(cat "$C/sent_pkts"); r0=$(cat "$C/rcvd_pkts")
step ksmc-server "$T" ksmc-echo server "$KSMC_PORT" 4
echo "rxe0 packets during the test: sent $(( $(cat "$C/sent_pkts") - s0 )), received $(( $(cat "$C/rcvd_pkts") - r0 ))"
finish
