#!/usr/bin/env bash
# Soft-RoCE test bed: boots Debian's kernel in qemu (TCG) with a busybox
# initramfs, loads rdma_rxe, creates rxe0 and runs a guest command script.
#
# Usage:
#   tests/rdma-vm/run.sh [MODE] [OPTIONS]
#
# MODE (default: single)
#   single     one guest; server and client of every test share rxe0 on a veth
#              (10.0.0.1). Script: guest-single.sh
#   two        two guests in parallel, linked by qemu's UDP socket netdev:
#              A = server 10.0.0.1 (guest-two-server.sh),
#              B = client 10.0.0.2 (guest-two-client.sh). B's status decides.
#   two-ksmc   like two, with the kernel's own SMC-R (AF_SMC) echo test:
#              guest-two-ksmc-server.sh / guest-two-ksmc-client.sh.
#   two-kernel like two, smc-tokio against the kernel's SMC-R both ways
#              (guest-two-kernel-*.sh): a C AF_SMC client against an
#              smc-tokio server, an smc-tokio client against a C AF_SMC
#              server, each checked with smc_diag; then smcperf with
#              --transport ksmc,smc,tcp. Builds smc-kernel-test and smcperf
#              (release, feature rdma) itself unless given with --bin; exits 0
#              only if both guests pass and both KERNEL-INTEROP lines say
#              smc-r.
#
# OPTIONS
#   --bin PATH[:NAME]     put PATH in the guest's /bin (as NAME, default its
#                         basename) with the libraries ldd lists (repeatable). libibverbs.so.1 and the rxe
#                         provider are always there (for binaries that dlopen).
#   --file SRC:DEST       copy a file to DEST (absolute path) in the guest
#                         (repeatable); no ldd.
#   --env KEY=VAL         export KEY=VAL in the guest (repeatable), e.g.
#                         --env RUST_LOG=debug --env SMC_TOKIO_FOO=1
#   --timeout SECS        host-side bound on each guest (qemu killed after
#                         it = failure). Default 300 (single), 420 (two).
#   --cmd-timeout SECS    guest default per-command bound
#                         (RDMA_VM_CMD_TIMEOUT, default 120).
#   --script PATH         guest command script (single mode).
#   --server-script PATH  guest command script of guest A (two modes).
#   --client-script PATH  guest command script of guest B (two modes).
#   --mem MIB             guest memory (default 1024).
#   --cpu MODEL           qemu CPU model (default max).
#   --smp N               guest CPUs (default 1). With 1 CPU, two busy-polling
#                         processes in one guest take turns per scheduler
#                         tick (4 ms): use completion events there.
#   --modules "M ..."     extra kernel modules to load at boot (with deps).
#   --require-server      two modes: fail also when the server guest's status
#                         is non-zero (default: client decides, server warns).
#   --out DIR             where serial logs go (default: a new directory
#                         under $CACHE/runs/).
#   --keep                keep the initramfs images in the run directory.
#   --quiet               don't print the guests' consoles, only the summary.
#   --no-install          don't apt-get install missing host packages.
#   --no-perf             two-kernel: don't build or run smcperf.
#   -h, --help            this text.
#
# Environment:
#   SMC_RDMA_VM_CACHE     cache dir (default $HOME/.cache/smc-tokio-rdma-vm):
#                         kernel package, unpacked kernel, decompressed
#                         modules, private apt lists, run logs.
#
# Before booting, when smc-rdma-test is among the binaries, tests/rdma-vm/abi.c
# (compiled against the installed verbs.h) and `smc-rdma-test abi` must print
# the same layout, or the run stops with status 3.
#
# Exit status: the guest script's status (two modes: the client's), 124 when a
# guest hit the host-side timeout, 125 when a guest printed no result marker
# (its kernel crashed or hung), 2 on usage errors.
#
# Guest side: /init (tests/rdma-vm/init) prints "RDMA-VM-RESULT: <status>";
# steps print "RDMA-VM-STEP: <name> <status>" and figures
# "RDMA-VM-FIGURE: <name> <value> <unit>" (see guest-lib.sh).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KVER=6.12.95+deb12-amd64
KPKG=linux-image-$KVER
KSUITE=bookworm-backports
DEBIAN_URI=http://deb.debian.org/debian
CACHE=${SMC_RDMA_VM_CACHE:-$HOME/.cache/smc-tokio-rdma-vm}
HOST_PKGS=(gcc qemu-system-x86 busybox-static cpio kmod xz-utils rdma-core ibverbs-utils
    ibverbs-providers libibverbs-dev rdmacm-utils perftest iproute2)
# inet_diag and tcp_diag: a listener's door asks sock_diag who owns a connection's client end.
BASE_MODULES=(crc32_generic crc32_pclmul veth virtio_net rdma_rxe ib_uverbs rdma_ucm inet_diag tcp_diag)
GUEST_TOOLS=(ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong ib_write_bw ib_read_bw ib_send_bw
    ib_send_lat ib_write_lat ib_read_lat rping)
MULTIARCH=x86_64-linux-gnu

log() { echo "rdma-vm: $*" >&2; }
die() { echo "rdma-vm: ERROR: $*" >&2; exit 2; }
usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# ---------------------------------------------------------------- arguments
MODE=single
BINS=()
FILES=()
ENVS=()
TIMEOUT=""
CMD_TIMEOUT=120
SCRIPT=""
SERVER_SCRIPT=""
CLIENT_SCRIPT=""
MEM=1024
SMP=1
CPU=max
EXTRA_MODULES=()
REQUIRE_SERVER=0
NO_PERF=0
OUT=""
KEEP=0
QUIET=0
INSTALL=1

need_arg() { [ "$#" -ge 2 ] || die "$1 needs an argument"; }
while [ "$#" -gt 0 ]; do
    case "$1" in
        single|two|two-ksmc|two-kernel) MODE=$1 ;;
        --bin) need_arg "$@"; BINS+=("$2"); shift ;;
        --file) need_arg "$@"; FILES+=("$2"); shift ;;
        --env) need_arg "$@"; ENVS+=("$2"); shift ;;
        --timeout) need_arg "$@"; TIMEOUT=$2; shift ;;
        --cmd-timeout) need_arg "$@"; CMD_TIMEOUT=$2; shift ;;
        --script) need_arg "$@"; SCRIPT=$2; shift ;;
        --server-script) need_arg "$@"; SERVER_SCRIPT=$2; shift ;;
        --client-script) need_arg "$@"; CLIENT_SCRIPT=$2; shift ;;
        --mem) need_arg "$@"; MEM=$2; shift ;;
        --smp) need_arg "$@"; SMP=$2; shift ;;
        --cpu) need_arg "$@"; CPU=$2; shift ;;
        --modules) need_arg "$@"; read -r -a _m <<< "$2"; EXTRA_MODULES+=("${_m[@]}"); shift ;;
        --require-server) REQUIRE_SERVER=1 ;;
        --no-perf) NO_PERF=1 ;;
        --out) need_arg "$@"; OUT=$2; shift ;;
        --keep) KEEP=1 ;;
        --quiet) QUIET=1 ;;
        --no-install) INSTALL=0 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
    shift
done

case "$MODE" in
    single)
        : "${TIMEOUT:=300}"
        : "${SCRIPT:=$HERE/guest-single.sh}"
        ;;
    two)
        : "${TIMEOUT:=420}"
        : "${SERVER_SCRIPT:=$HERE/guest-two-server.sh}"
        : "${CLIENT_SCRIPT:=$HERE/guest-two-client.sh}"
        ;;
    two-ksmc)
        : "${TIMEOUT:=420}"
        : "${SERVER_SCRIPT:=$HERE/guest-two-ksmc-server.sh}"
        : "${CLIENT_SCRIPT:=$HERE/guest-two-ksmc-client.sh}"
        EXTRA_MODULES+=(smc smc_diag)
        ;;
    two-kernel)
        : "${TIMEOUT:=600}"
        : "${SERVER_SCRIPT:=$HERE/guest-two-kernel-server.sh}"
        : "${CLIENT_SCRIPT:=$HERE/guest-two-kernel-client.sh}"
        EXTRA_MODULES+=(smc smc_diag)
        REQUIRE_SERVER=1
        ;;
esac
for v in "$TIMEOUT" "$CMD_TIMEOUT" "$MEM" "$SMP"; do
    [[ "$v" =~ ^[0-9]+$ ]] || die "not a number: $v"
done
for s in "$SCRIPT" "$SERVER_SCRIPT" "$CLIENT_SCRIPT"; do
    [ -z "$s" ] || [ -f "$s" ] || die "no such guest script: $s"
done
for b in "${BINS[@]}"; do
    if [ ! -f "${b%%:*}" ] || [ ! -x "${b%%:*}" ]; then
        die "--bin $b: not an executable file"
    fi
done
for e in "${ENVS[@]}"; do
    [[ "$e" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $e: expected KEY=VAL"
done
for f in "${FILES[@]}"; do
    if [[ "$f" != *:/* ]] || [ ! -f "${f%%:*}" ]; then
        die "--file $f: expected SRC:/DEST with SRC a file"
    fi
done

# ---------------------------------------------------------- host packages
install_host_packages() {
    local missing=() p
    for p in "${HOST_PKGS[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    [ "$INSTALL" = 1 ] || die "missing host packages (and --no-install): ${missing[*]}"
    [ "$(id -u)" = 0 ] || die "missing host packages, and not root: apt-get install ${missing[*]}"
    log "installing host packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# ----------------------------------------------------------- kernel (cache)
KROOT=$CACHE/kernel-$KVER
VMLINUZ=$KROOT/boot/vmlinuz-$KVER
KMODDIR=$KROOT/lib/modules/$KVER

fetch_kernel() {
    if [ -f "$VMLINUZ" ] && [ -f "$KMODDIR/modules.dep" ]; then
        return 0
    fi
    local apt=$CACHE/apt
    mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$apt/etc" "$CACHE/debs"
    # A private apt configuration: only this sources list, own lists and
    # archives; the machine's own apt sources and state stay untouched.
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEBIAN_URI $KSUITE main" \
        > "$apt/etc/sources.list"
    local opts=(-o "Dir::Etc::sourcelist=$apt/etc/sources.list" -o Dir::Etc::sourceparts=-
        -o "Dir::State::lists=$apt/lists" -o "Dir::Cache::archives=$apt/archives"
        -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Sandbox::User=root
        -o Debug::NoLocking=1)
    local deb
    deb=$(find "$CACHE/debs" -maxdepth 1 -name "${KPKG}_*.deb" | head -n 1)
    if [ -z "$deb" ]; then
        log "fetching $KPKG from $KSUITE"
        apt-get "${opts[@]}" -qq update >&2
        (cd "$CACHE/debs" && apt-get "${opts[@]}" -qq download "$KPKG" >&2)
        deb=$(find "$CACHE/debs" -maxdepth 1 -name "${KPKG}_*.deb" | head -n 1)
        [ -n "$deb" ] || die "download of $KPKG failed"
    fi
    log "unpacking $(basename "$deb")"
    rm -rf "$KROOT.tmp"
    dpkg-deb -x "$deb" "$KROOT.tmp"
    depmod -b "$KROOT.tmp" "$KVER"
    rm -rf "$KROOT"
    mv "$KROOT.tmp" "$KROOT"
}

# Resolve module names to "name file params" lines (dependency order), with
# the .ko.xz files decompressed into the cache.
resolve_modules() {
    local out=$1; shift
    local dec=$CACHE/modules-$KVER m line path params name deps
    mkdir -p "$dec"
    : > "$out"
    declare -A seen=()
    for m in "$@"; do
        deps=$(modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>&1) ||
            die "kernel module $m not found in $KVER: $deps"
        while read -r line; do
            case "$line" in
                insmod\ *) ;;
                *) continue ;;  # builtin
            esac
            line=${line#insmod }
            path=${line%% *}
            params=""
            [ "$path" != "$line" ] && params=${line#* }
            name=$(basename "$path")
            name=${name%.xz}; name=${name%.zst}; name=${name%.gz}; name=${name%.ko}; name=${name//-/_}
            [ -n "${seen[$name]:-}" ] && continue
            seen[$name]=1
            if [ ! -f "$dec/$name.ko" ]; then
                case "$path" in
                    *.xz) xz -dc "$path" > "$dec/$name.ko.tmp" ;;
                    *.zst) zstd -dcq "$path" > "$dec/$name.ko.tmp" ;;
                    *.gz) gzip -dc "$path" > "$dec/$name.ko.tmp" ;;
                    *) cp "$path" "$dec/$name.ko.tmp" ;;
                esac
                mv "$dec/$name.ko.tmp" "$dec/$name.ko"
            fi
            echo "$name $dec/$name.ko $params" >> "$out"
        done <<< "$deps"
    done
}

# ------------------------------------------------------------- initramfs
ROOT=""

# copy_elf SRC DEST: copy SRC (following links) to $ROOT/DEST and every
# library that ldd lists for it to the same path in $ROOT.
copy_elf() {
    local src=$1 dest=$2 lib out
    mkdir -p "$ROOT$(dirname "$dest")"
    cp -L "$src" "$ROOT$dest"
    chmod a+rx "$ROOT$dest" 2>/dev/null || true
    if ! out=$(ldd "$src" 2>&1); then
        # Static binaries: nothing to add.
        grep -qE 'not a dynamic executable|statically linked' <<< "$out" && return 0
        die "ldd $src failed: $out"
    fi
    if grep -q 'not found' <<< "$out"; then
        die "ldd $src: missing libraries: $(grep 'not found' <<< "$out" | tr -s ' \t' ' ')"
    fi
    while read -r lib; do
        [ -n "$lib" ] || continue
        [ -e "$ROOT$lib" ] && continue
        mkdir -p "$ROOT$(dirname "$lib")"
        cp -L "$lib" "$ROOT$lib"
    done < <(awk '/=> \// { print $3; next } /^[ \t]*\// { print $1 }' <<< "$out")
}

build_base_root() {
    ROOT=$1
    mkdir -p "$ROOT"/{bin,dev,proc,sys,tmp,run,root,etc/rdma-vm,usr/lib/$MULTIARCH,usr/lib64,usr/sbin,usr/bin}
    ln -s usr/lib "$ROOT/lib"
    ln -s usr/lib64 "$ROOT/lib64"
    ln -s bin "$ROOT/sbin"
    # The kernel needs a console node before devtmpfs is mounted.
    mknod -m 600 "$ROOT/dev/console" c 5 1 2>/dev/null || true

    cp /bin/busybox "$ROOT/bin/busybox"
    local a
    for a in $("$ROOT/bin/busybox" --list); do
        [ -e "$ROOT/bin/$a" ] || ln -s busybox "$ROOT/bin/$a"
    done

    # iproute2: busybox's own ip applet cannot make a veth, and busybox sh
    # runs its applets first, so these are called by full path.
    copy_elf "$(command -v ip)" /usr/sbin/ip
    copy_elf "$(command -v rdma)" /usr/sbin/rdma

    local t p
    for t in "${GUEST_TOOLS[@]}"; do
        p=$(command -v "$t") || die "host tool $t not found"
        copy_elf "$p" "/bin/$t"
    done

    # libibverbs + the rxe provider, always (our Rust binaries dlopen
    # libibverbs.so.1 at run time, so ldd would not list it).
    copy_elf "/usr/lib/$MULTIARCH/libibverbs/librxe-rdmav34.so" "/usr/lib/$MULTIARCH/libibverbs/librxe-rdmav34.so"
    copy_elf "/usr/lib/$MULTIARCH/libibverbs.so.1" "/usr/lib/$MULTIARCH/libibverbs.so.1"
    copy_elf "/usr/lib/$MULTIARCH/librdmacm.so.1" "/usr/lib/$MULTIARCH/librdmacm.so.1"
    ln -sf libibverbs.so.1 "$ROOT/usr/lib/$MULTIARCH/libibverbs.so"
    ln -sf librdmacm.so.1 "$ROOT/usr/lib/$MULTIARCH/librdmacm.so"
    mkdir -p "$ROOT/etc/libibverbs.d"
    cp /etc/libibverbs.d/rxe.driver "$ROOT/etc/libibverbs.d/"
    # Programs linked against libgcc_s for unwinding (Rust) usually list it,
    # but make sure it is there for dlopen-ed code too.
    [ -e "/usr/lib/$MULTIARCH/libgcc_s.so.1" ] && [ ! -e "$ROOT/usr/lib/$MULTIARCH/libgcc_s.so.1" ] &&
        cp -L "/usr/lib/$MULTIARCH/libgcc_s.so.1" "$ROOT/usr/lib/$MULTIARCH/"

    printf 'root:x:0:0:root:/root:/bin/sh\n' > "$ROOT/etc/passwd"
    printf 'root:x:0:\n' > "$ROOT/etc/group"
    printf '127.0.0.1 localhost\n10.0.0.1 rdma-vm-a\n10.0.0.2 rdma-vm-b\n' > "$ROOT/etc/hosts"
    printf 'hosts: files\n' > "$ROOT/etc/nsswitch.conf"

    # Kernel modules.
    mkdir -p "$ROOT/lib/modules"
    local name path params
    : > "$ROOT/etc/rdma-vm/modules"
    while read -r name path params; do
        cp "$path" "$ROOT/lib/modules/$name.ko"
        echo "$name /lib/modules/$name.ko $params" >> "$ROOT/etc/rdma-vm/modules"
    done < "$RUN/modules.list"

    local b
    for b in "${BINS[@]}"; do
        if [[ "$b" == *:* ]]; then
            copy_elf "${b%%:*}" "/bin/${b#*:}"
        else
            copy_elf "$b" "/bin/$(basename "$b")"
        fi
    done
    local f
    for f in "${FILES[@]}"; do
        mkdir -p "$ROOT$(dirname "${f#*:}")"
        cp -L "${f%%:*}" "$ROOT${f#*:}"
    done

    cp "$HERE/init" "$ROOT/init"
    chmod 755 "$ROOT/init"
    cp "$HERE/guest-lib.sh" "$ROOT/etc/rdma-vm/guest-lib.sh"
}

mkcpio() { # DIR OUT
    (cd "$1" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) > "$2"
}

sq() { # shell single-quote
    printf "'%s'" "${1//\'/\'\\\'\'}"
}

# build_guest_image NAME ROLE IP PEER NET SCRIPT -> $RUN/NAME.img
build_guest_image() {
    local name=$1 role=$2 ip=$3 peer=$4 net=$5 script=$6
    local o=$RUN/overlay-$name
    mkdir -p "$o/etc/rdma-vm"
    cp "$script" "$o/etc/rdma-vm/guest.sh"
    {
        echo "RDMA_VM_MODE=$(sq "$MODE")"
        echo "RDMA_VM_ROLE=$(sq "$role")"
        echo "RDMA_VM_IP=$(sq "$ip")"
        echo "RDMA_VM_PEER_IP=$(sq "$peer")"
        echo "RDMA_VM_SERVER_IP=10.0.0.1"
        echo "RDMA_VM_NET=$(sq "$net")"
        echo "RDMA_VM_DEV=rxe0"
        echo "RDMA_VM_GID_INDEX=1"
        echo "RDMA_VM_CMD_TIMEOUT=$(sq "$CMD_TIMEOUT")"
        local e
        for e in "${ENVS[@]}"; do
            echo "${e%%=*}=$(sq "${e#*=}")"
        done
    } > "$o/etc/rdma-vm/env"
    mkcpio "$o" "$RUN/overlay-$name.cpio"
    # The kernel unpacks concatenated cpio archives in order: the overlay's
    # files are added to (and override) the base image's.
    cat "$RUN/base.cpio" "$RUN/overlay-$name.cpio" > "$RUN/$name.img"
    rm -rf "$o" "$RUN/overlay-$name.cpio"
}

# ------------------------------------------------------------------ qemu
QEMU_PIDS=()
QEMU_NAMES=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    local p
    # The host-side `timeout` processes: TERM makes each kill its qemu.
    for p in "${QEMU_PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    if [ -n "${RUN:-}" ] && [ "$KEEP" = 0 ]; then
        rm -f "$RUN"/*.img "$RUN/base.cpio"
        rm -rf "$RUN/root"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_guest NAME [qemu net args...]: runs in the background; the qemu exit
# status goes to $RUN/NAME.qemu-status, the console to $RUN/NAME.log.
start_guest() {
    local name=$1; shift
    local cmd=(qemu-system-x86_64 -accel tcg -cpu "$CPU" -smp "$SMP" -m "$MEM"
        -nodefaults -no-user-config -display none -monitor none -no-reboot
        -serial "file:$RUN/$name.log"
        -kernel "$VMLINUZ" -initrd "$RUN/$name.img"
        -append "console=ttyS0 panic=-1 quiet loglevel=5 rdinit=/init"
        "$@")
    echo "${cmd[*]}" > "$RUN/$name.cmd"
    timeout --kill-after=10 "$TIMEOUT" "${cmd[@]}" > "$RUN/$name.qemu-out" 2>&1 &
    QEMU_PIDS+=("$!")
    QEMU_NAMES+=("$name")
}

# wait_guests: wait for every started guest, recording each qemu's status.
# When a guest ends without its result marker (its kernel crashed), the
# others get PEER_GRACE seconds, then are stopped rather than left to run
# into their timeout. A guest whose kernel reports a task blocked in the
# kernel for minutes (its hung-task watchdog, after 120 s) is stuck there:
# it is stopped (marked .hung) once the watchdog's stacks of the blocked tasks
# had HUNG_STACKS_GRACE seconds to reach the console, not at the host-side timeout,
# and counts as a guest that ended without a result. A guest that printed its
# result and has not powered off POWEROFF_GRACE seconds later (its kernel
# stuck in the power-off: a guest kernel's own SMC-R link teardown has been
# seen to block it for good) is stopped too (marked .after-result), and its
# result stands.
PEER_GRACE=30
POWEROFF_GRACE=30
HUNG_STACKS_GRACE=5
# stop_guest_after I SINCE GRACE MARK WHY: stops guest I, once, marking it
# with $RUN/NAME.MARK, when GRACE seconds have passed since SINCE (epoch s).
stop_guest_after() {
    local i=$1 since=$2 grace=$3 mark=$4 why=$5
    if [ $(( $(date +%s) - since )) -ge "$grace" ] && [ ! -f "$RUN/${QEMU_NAMES[$i]}.$mark" ]; then
        log "stopping guest ${QEMU_NAMES[$i]}: $why"
        touch "$RUN/${QEMU_NAMES[$i]}.$mark"
        kill "${QEMU_PIDS[$i]}" 2>/dev/null || true
    fi
}
wait_guests() {
    local i st left crashed_at=""
    declare -A done_=() result_at=() hung_at=()
    while :; do
        left=0
        for i in "${!QEMU_PIDS[@]}"; do
            [ -n "${done_[$i]:-}" ] && continue
            if kill -0 "${QEMU_PIDS[$i]}" 2>/dev/null; then
                if grep -q '^RDMA-VM-RESULT: ' "$RUN/${QEMU_NAMES[$i]}.log" 2>/dev/null; then
                    [ -z "${result_at[$i]:-}" ] && result_at[$i]=$(date +%s)
                    stop_guest_after "$i" "${result_at[$i]}" "$POWEROFF_GRACE" after-result \
                        "it printed its result but has not powered off in ${POWEROFF_GRACE}s"
                elif grep -q 'INFO: task .* blocked for more than' "$RUN/${QEMU_NAMES[$i]}.log" 2>/dev/null; then
                    # A few seconds for the watchdog's stacks of the blocked tasks to
                    # reach the console, which say where the kernel is stuck.
                    [ -z "${hung_at[$i]:-}" ] && hung_at[$i]=$(date +%s)
                    stop_guest_after "$i" "${hung_at[$i]}" "$HUNG_STACKS_GRACE" hung "a task is stuck in its kernel"
                fi
                left=$((left + 1))
                continue
            fi
            st=0
            wait "${QEMU_PIDS[$i]}" || st=$?
            echo "$st" > "$RUN/${QEMU_NAMES[$i]}.qemu-status"
            done_[$i]=1
            if [ -z "$crashed_at" ] && ! grep -q '^RDMA-VM-RESULT: ' "$RUN/${QEMU_NAMES[$i]}.log"; then
                crashed_at=$(date +%s)
            fi
        done
        [ "$left" = 0 ] && break
        if [ -n "$crashed_at" ] && [ $(( $(date +%s) - crashed_at )) -ge "$PEER_GRACE" ]; then
            for i in "${!QEMU_PIDS[@]}"; do
                if [ -z "${done_[$i]:-}" ]; then
                    log "stopping guest ${QEMU_NAMES[$i]}: the other guest ended without a result"
                    touch "$RUN/${QEMU_NAMES[$i]}.stopped"
                    kill "${QEMU_PIDS[$i]}" 2>/dev/null || true
                fi
            done
            crashed_at=""
        fi
        sleep 1
    done
    QEMU_PIDS=()
    QEMU_NAMES=()
}

# guest_status NAME: prints the guest's result; 124 on host-side timeout,
# 125 when no marker was printed.
guest_status() {
    local name=$1 qst res
    qst=$(cat "$RUN/$name.qemu-status" 2>/dev/null || echo 125)
    res=$(tr -d '\r' < "$RUN/$name.log" | sed -n 's/^RDMA-VM-RESULT: \([0-9]*\)$/\1/p' | tail -n 1)
    if [ -z "$res" ] && [ -f "$RUN/$name.hung" ]; then
        log "FAIL: guest $name's kernel hung (a task blocked in it for minutes; no RDMA-VM-RESULT marker); console: $RUN/$name.log"
        tr -d '\r' < "$RUN/$name.log" | grep -m 4 -E 'blocked for more than' | sed 's/^/  /' >&2
        echo 125
    elif [ -z "$res" ] && [ -f "$RUN/$name.stopped" ]; then
        log "FAIL: guest $name stopped because the other guest ended without a result; console: $RUN/$name.log"
        echo 125
    elif [ -n "$res" ] && [ -f "$RUN/$name.after-result" ]; then
        log "guest $name printed its result ($res) and was stopped in its power-off; console: $RUN/$name.log"
        echo "$res"
    elif [ "$qst" = 124 ] || [ "$qst" = 137 ]; then
        log "FAIL: guest $name killed by the host-side timeout (${TIMEOUT}s); console: $RUN/$name.log"
        echo 124
    elif [ -z "$res" ] && grep -qE 'Kernel panic|Oops|BUG: ' "$RUN/$name.log"; then
        log "FAIL: guest $name's kernel crashed (no RDMA-VM-RESULT marker); console: $RUN/$name.log"
        tr -d '\r' < "$RUN/$name.log" | grep -m 3 -A 12 -E 'Kernel panic|Oops|BUG: |WARNING: ' | sed 's/^/  /' >&2
        echo 125
    elif [ -z "$res" ]; then
        log "FAIL: guest $name printed no RDMA-VM-RESULT marker (qemu status $qst); console: $RUN/$name.log"
        [ -s "$RUN/$name.qemu-out" ] && sed 's/^/  qemu: /' "$RUN/$name.qemu-out" >&2
        echo 125
    else
        echo "$res"
    fi
}

show_console() { # NAME
    if [ "$QUIET" = 0 ]; then
        echo "----- console of guest $1 ($RUN/$1.log) -----"
        tr -d '\r' < "$RUN/$1.log" | sed "s/^/[$1] /"
        echo "----- end of console of guest $1 -----"
    fi
}

summary() { # NAME...
    local n
    echo "===== summary ====="
    for n in "$@"; do
        tr -d '\r' < "$RUN/$n.log" | grep -E '^RDMA-VM-(STEP|FIGURE|RESULT):' | sed "s/^/[$n] /" || true
    done
}

free_udp_port() {
    local p used
    used=$(ss -Hlun 2>/dev/null | awk '{ print $4 }' | sed 's/.*://' || true)
    while :; do
        p=$(( 20000 + RANDOM % 40000 ))
        grep -qx "$p" <<< "$used" || { echo "$p"; return; }
    done
}

# ------------------------------------------------------------- verbs ABI
# smc-tokio declares the few libibverbs structures it uses by hand (no bindgen);
# before anything boots, compare its layout with the installed verbs.h.
# two-kernel builds what it runs unless given: smc-kernel-test and smcperf.
build_kernel_bins() {
    local b have_test=0 have_perf=0 root
    for b in "${BINS[@]}"; do
        case "$(basename "${b%%:*}")" in
            smc-kernel-test) have_test=1 ;;
            smcperf) have_perf=1 ;;
        esac
    done
    root=$(cd "$HERE/../.." && pwd)
    if [ "$have_test" = 0 ]; then
        log "building smc-kernel-test (release)"
        (cd "$root" && cargo build --release -q -p tests --bin smc-kernel-test) || die "cannot build smc-kernel-test"
        BINS+=("$root/target/release/smc-kernel-test")
    fi
    if [ "$have_perf" = 0 ] && [ "$NO_PERF" = 0 ]; then
        log "building smcperf (release, feature rdma)"
        (cd "$root" && cargo build --release -q -p benches --features rdma --bin smcperf) || die "cannot build smcperf"
        BINS+=("$root/target/release/smcperf")
    fi
}

# abi_compare RUN_DIR BIN C_FILE WHAT: when BIN is among the guest binaries,
# C_FILE (compiled against the installed headers) and `BIN abi` must print the
# same facts, or the run stops with status 3.
abi_compare() {
    local b exe="" name
    for b in "${BINS[@]}"; do
        if [ "$(basename "${b%%:*}")" = "$2" ]; then exe=${b%%:*}; fi
    done
    [ -n "$exe" ] || return 0
    name=$(basename "$3" .c)
    command -v gcc > /dev/null || die "gcc is needed for the $4 ABI check"
    gcc -O0 -o "$1/$name-c" "$HERE/$3" || die "cannot compile $3"
    "$1/$name-c" > "$1/$name-c.txt"
    "$exe" abi > "$1/$name-rust.txt"
    if ! diff -u "$1/$name-c.txt" "$1/$name-rust.txt" >&2; then
        echo "rdma-vm: $4 ABI mismatch: smc-tokio disagrees with the installed headers" >&2
        exit 3
    fi
    log "$4 ABI: $(wc -l < "$1/$name-c.txt") facts match the installed headers"
}

# ------------------------------------------------------------------- main
START=$(date +%s)
mkdir -p "$CACHE"
exec 9> "$CACHE/.lock"
# One run at a time installs the host's packages (two test beds started at once on a fresh
# machine both found them missing, and the second apt-get failed on the first one's lock).
flock 9
install_host_packages
flock -u 9
if [ "$MODE" = two-kernel ]; then
    build_kernel_bins
fi
flock 9
fetch_kernel
if [ -z "$OUT" ]; then
    mkdir -p "$CACHE/runs"
    # Keep the last 20 run directories.
    find "$CACHE/runs" -mindepth 1 -maxdepth 1 -type d | sort | head -n -19 | xargs -r rm -rf
    OUT=$CACHE/runs/$(date +%Y%m%d-%H%M%S)-$MODE-$$
fi
RUN=$OUT
mkdir -p "$RUN"
# The verbs FFI (smc-rdma-test) and the kernel SMC module (smc-kernel-test).
abi_compare "$RUN" smc-rdma-test abi.c verbs
abi_compare "$RUN" smc-kernel-test kabi.c "kernel SMC"
resolve_modules "$RUN/modules.list" "${BASE_MODULES[@]}" "${EXTRA_MODULES[@]}"
flock -u 9

if [ "$MODE" = two-ksmc ] || [ "$MODE" = two-kernel ]; then
    # The AF_SMC echo tool, built with the host's C compiler.
    command -v gcc > /dev/null || die "$MODE needs gcc (apt-get install gcc libc6-dev)"
    gcc -O2 -Wall -pthread -o "$RUN/ksmc-echo" "$HERE/ksmc-echo.c"
    BINS+=("$RUN/ksmc-echo")
fi
build_base_root "$RUN/root"
mkcpio "$RUN/root" "$RUN/base.cpio"
rm -rf "$RUN/root"
log "initramfs: $(du -h "$RUN/base.cpio" | cut -f1), prepared in $(( $(date +%s) - START ))s; logs in $RUN"

BOOT=$(date +%s)
if [ "$MODE" = single ]; then
    build_guest_image single single 10.0.0.1 "" veth "$SCRIPT"
    start_guest single
    wait_guests
    show_console single
    summary single
    st=$(guest_status single)
    log "single guest: status $st, guests ran $(( $(date +%s) - BOOT ))s, total $(( $(date +%s) - START ))s"
    exit "$st"
fi

# Two guests: A (server, 10.0.0.1) and B (client, 10.0.0.2), each NIC a UDP
# socket pointed at the other's port.
PA=$(free_udp_port)
PB=$(free_udp_port)
while [ "$PB" = "$PA" ]; do PB=$(free_udp_port); done
build_guest_image server server 10.0.0.1 10.0.0.2 virtio "$SERVER_SCRIPT"
build_guest_image client client 10.0.0.2 10.0.0.1 virtio "$CLIENT_SCRIPT"
start_guest server -netdev "socket,id=n0,udp=127.0.0.1:$PB,localaddr=127.0.0.1:$PA" \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:01
start_guest client -netdev "socket,id=n0,udp=127.0.0.1:$PA,localaddr=127.0.0.1:$PB" \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:02
wait_guests
show_console server
show_console client
summary server client
sst=$(guest_status server)
cst=$(guest_status client)
log "two guests: server status $sst, client status $cst, guests ran $(( $(date +%s) - BOOT ))s, total $(( $(date +%s) - START ))s"
if [ "$cst" != 0 ]; then
    exit "$cst"
fi
if [ "$sst" = 124 ] || [ "$sst" = 125 ]; then
    exit "$sst"
fi
if [ "$sst" != 0 ]; then
    if [ "$REQUIRE_SERVER" = 1 ]; then
        exit "$sst"
    fi
    log "WARNING: the server guest's status is $sst (the client's decides; --require-server to fail on it)"
fi
if [ "$MODE" = two-kernel ]; then
    # Both directions must have said smc-r (the guests' statuses already count
    # every failed step; this checks the verdict lines themselves). grep reads the logs
    # itself: in a `cat | grep -q` pipeline grep exits at the first match, cat can die
    # of SIGPIPE, and under pipefail a verdict that is there read as missing.
    ok=1
    for want in "KERNEL-INTEROP kernel-client->smc-tokio smc-r" "KERNEL-INTEROP smc-tokio-client->kernel smc-r"; do
        if grep -qxF -e "$want" -e "$want"$'\r' "$RUN/server.log" "$RUN/client.log" 2>/dev/null; then
            log "$want"
        else
            log "MISSING: $want"
            ok=0
        fi
    done
    [ "$ok" = 1 ] || exit 1
fi
exit 0
