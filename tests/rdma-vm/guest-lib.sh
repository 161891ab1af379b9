# Helpers for the guest command scripts (busybox sh). Sourced, not run:
#   . /etc/rdma-vm/guest-lib.sh
#
# Environment set by /init (from run.sh):
#   RDMA_VM_MODE       single | two
#   RDMA_VM_ROLE       single | server | client
#   RDMA_VM_IP         this guest's address (10.0.0.1 or 10.0.0.2)
#   RDMA_VM_PEER_IP    the other guest's address (two mode; empty in single)
#   RDMA_VM_SERVER_IP  the address servers listen on (10.0.0.1 in both modes)
#   RDMA_VM_NETDEV     the net device rxe0 sits on
#   RDMA_VM_DEV        rxe0;  RDMA_VM_GID_INDEX  1 (the IPv4-mapped GID)
#   RDMA_VM_CMD_TIMEOUT  default per-command timeout in seconds
# plus every --env KEY=VAL given to run.sh.
#
# Every step prints "RDMA-VM-STEP: <name> <status>"; figures are printed as
# "RDMA-VM-FIGURE: <name> <value> <unit>" so that run.sh can list them.
# The guest script's exit status is RDMA_VM_FAILED (number of failed steps,
# capped at 99): end a script with `finish`.

# shellcheck shell=sh

RDMA_VM_FAILED=0
: "${RDMA_VM_DEV:=rxe0}"
: "${RDMA_VM_GID_INDEX:=1}"
: "${RDMA_VM_CMD_TIMEOUT:=120}"
LOGDIR=/tmp/rdma-vm-logs
mkdir -p "$LOGDIR"

figure() {
    # figure NAME VALUE UNIT
    echo "RDMA-VM-FIGURE: $1 $2 $3"
}

# step NAME TIMEOUT CMD [ARGS...]: run CMD (output to the console and to
# $LOGDIR/NAME.log) bounded by TIMEOUT seconds; record a failure if non-zero.
# Note: a task stuck inside the kernel cannot be killed by the guest's
# timeout; the host-side timeout on qemu is the backstop for that.
step() {
    _name=$1; _t=$2; shift 2
    echo "=== $_name: $*"
    _st=0
    timeout -s KILL "$_t" "$@" > "$LOGDIR/$_name.log" 2>&1 || _st=$?
    cat "$LOGDIR/$_name.log"
    echo "RDMA-VM-STEP: $_name $_st"
    if [ "$_st" != 0 ]; then
        RDMA_VM_FAILED=$((RDMA_VM_FAILED + 1))
    fi
    return 0
}

# bg_step NAME TIMEOUT CMD...: like step, in the background (a server).
# Collect it with wait_step NAME (it ends by itself), or stop_step NAME (a
# server that runs until killed). One background step at a time.
bg_step() {
    _name=$1; _t=$2; shift 2
    echo "=== $_name (background): $*"
    rm -f "$LOGDIR/$_name.status" "$LOGDIR/$_name.pid"
    ( _st=0
      # busybox timeout execs CMD in its own pid: killing that pid kills CMD.
      timeout -s KILL "$_t" "$@" > "$LOGDIR/$_name.log" 2>&1 &
      echo "$!" > "$LOGDIR/$_name.pid"
      wait "$!" || _st=$?
      echo "$_st" > "$LOGDIR/$_name.status" ) &
    BG_PID=$!
}

wait_step() {
    _name=$1
    wait "$BG_PID" 2>/dev/null || true
    _st=$(cat "$LOGDIR/$_name.status" 2>/dev/null || echo 98)
    cat "$LOGDIR/$_name.log"
    echo "RDMA-VM-STEP: $_name $_st"
    if [ "$_st" != 0 ]; then
        RDMA_VM_FAILED=$((RDMA_VM_FAILED + 1))
    fi
}

# stop_step NAME: stop a background server that runs until killed (TERM,
# then KILL after 5 s). Being stopped counts as success; having exited by
# itself before counts with its own status.
stop_step() {
    _name=$1
    if [ -f "$LOGDIR/$_name.status" ]; then
        wait_step "$_name"
        return 0
    fi
    _pid=$(cat "$LOGDIR/$_name.pid" 2>/dev/null || true)
    if [ -n "$_pid" ]; then
        kill -TERM "$_pid" 2>/dev/null || true
        _i=0
        while [ ! -f "$LOGDIR/$_name.status" ] && [ "$_i" -lt 50 ]; do
            sleep 0.1
            _i=$((_i + 1))
        done
        kill -KILL "$_pid" 2>/dev/null || true
    fi
    wait "$BG_PID" 2>/dev/null || true
    cat "$LOGDIR/$_name.log"
    echo "RDMA-VM-STEP: $_name 0 (stopped)"
}

# Two-guest rendezvous: the client guest calls peer_done_signal TAG when it is
# through with a part (TAG names it); the server guest waits for that word
# with peer_done_wait SECS TAG, then, say, stops its server. Words with another
# tag are passed over, so a wait that timed out does not take the next part's
# word. Port 7999 on the server guest.
RDMA_VM_DONE_PORT=7999
peer_done_wait() {
    # peer_done_wait TIMEOUT TAG
    echo "=== waiting (up to $1 s) for the client guest to finish ($2)"
    _end=$(( $(date +%s) + $1 ))
    while :; do
        _left=$(( _end - $(date +%s) ))
        if [ "$_left" -le 0 ]; then
            echo "no word from the client guest within $1 s ($2)"
            return 0
        fi
        _got=$(timeout -s KILL "$_left" nc -l -p "$RDMA_VM_DONE_PORT" 2>/dev/null) || true
        if [ "$_got" = "done $2" ]; then
            echo "client guest finished ($2)"
            return 0
        fi
        [ -n "$_got" ] || sleep 1
    done
}

peer_done_signal() {
    # peer_done_signal TAG [TRIES]: TRIES (30) a second apart, each up to 5 s:
    # the server guest may still be starting to listen.
    _i=0
    while [ "$_i" -lt "${2:-30}" ]; do
        if echo "done $1" | timeout -s KILL 5 nc "$RDMA_VM_SERVER_IP" "$RDMA_VM_DONE_PORT" > /dev/null 2>&1; then
            return 0
        fi
        sleep 1
        _i=$((_i + 1))
    done
    echo "could not tell the server guest that the client is done ($1)"
}

# client_step NAME TIMEOUT TRIES CMD...: a client that retries (1 s apart)
# while the server is not listening yet; the whole thing bounded by TIMEOUT.
client_step() {
    _name=$1; _t=$2; _tries=$3; shift 3
    echo "=== $_name: $* (up to $_tries tries)"
    _st=1
    _i=0
    _deadline=$(( $(date +%s) + _t ))
    while [ "$_i" -lt "$_tries" ]; do
        _i=$((_i + 1))
        _left=$(( _deadline - $(date +%s) ))
        [ "$_left" -gt 0 ] || break
        _st=0
        timeout -s KILL "$_left" "$@" > "$LOGDIR/$_name.log" 2>&1 || _st=$?
        [ "$_st" = 0 ] && break
        # Only retry while the server is not there yet.
        if ! grep -qiE "couldn't connect|connection refused|unable to connect|failed to connect|Couldn't connect" "$LOGDIR/$_name.log"; then
            break
        fi
        sleep 1
    done
    cat "$LOGDIR/$_name.log"
    echo "RDMA-VM-STEP: $_name $_st (try $_i)"
    if [ "$_st" != 0 ]; then
        RDMA_VM_FAILED=$((RDMA_VM_FAILED + 1))
    fi
    return 0
}

# Figures from the tools' output (the log of step NAME).
pingpong_figure() {
    # ibv_rc_pingpong: "1000 iters in 0.40 seconds = 400.12 usec/iter"
    _v=$(sed -n 's/.*= *\([0-9.]*\) usec\/iter.*/\1/p' "$LOGDIR/$1.log" | tail -n 1)
    [ -n "$_v" ] && figure "$2" "$_v" usec/iter
    return 0
}

write_bw_figure() {
    # ib_write_bw: " 65536  2000  45.10  44.98  0.000720" -> BW average
    _v=$(awk -v s="$3" '$1 == s && NF >= 4 { v = $4 } END { if (v != "") print v }' "$LOGDIR/$1.log")
    [ -n "$_v" ] && figure "$2" "$_v" MB/s
    return 0
}

send_lat_figure() {
    # ib_send_lat: "#bytes #iterations t_min t_max t_typical t_avg t_stdev ..."
    _v=$(awk -v s="$3" '$1 == s && NF >= 6 { t = $5; a = $6 } END { if (t != "") print t, a }' "$LOGDIR/$1.log")
    if [ -n "$_v" ]; then
        figure "$2-typical" "${_v% *}" usec
        figure "$2-avg" "${_v#* }" usec
    fi
    return 0
}

finish() {
    # The server guest does not power off before the client guest's steps are
    # through. A guest whose RoCE device goes (rxe is removed at power-off)
    # while the other's kernel still has SMC-R messages in flight to it leaves
    # those pending: a close there then blocks in the kernel for good (the
    # link group's termination waits for its pending CDC sends,
    # smc_cdc_wait_pend_tx_wr, holding the socket's lock, which the close waits
    # for). The hung-task watchdog's stacks showed it, in a client whose server
    # had powered off. (Idle kernel link groups outlive their sockets: the
    # client's power-off may still meet a server gone, which run.sh allows.)
    case "$RDMA_VM_ROLE" in
        server) peer_done_wait 120 finish ;;
        client) peer_done_signal finish 15 ;;
    esac
    echo "rdma-vm: $RDMA_VM_FAILED failed step(s) in role $RDMA_VM_ROLE"
    [ "$RDMA_VM_FAILED" -gt 99 ] && RDMA_VM_FAILED=99
    exit "$RDMA_VM_FAILED"
}
