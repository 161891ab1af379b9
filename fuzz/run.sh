#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 30) with cargo-fuzz (libFuzzer) on the
# nightly toolchain, starting from the committed seed corpus in fuzz/corpus. New inputs go to a
# scratch directory, crashes to fuzz/artifacts/<target>/. Prints libFuzzer's final stats.
#
#   fuzz/run.sh            # smoke: 30 s per target
#   fuzz/run.sh 600        # the long run: 10 minutes per target
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-30}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for t in $(cargo +nightly fuzz list); do
    mkdir -p "$work/$t" "corpus/$t"
    echo "== $t: $secs s"
    if ! cargo +nightly fuzz run "$t" "$work/$t" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 2>&1 \
        | grep -E "stat::number_of_executed_units|stat::new_units_added|cov:|ERROR|panicked|SUMMARY" | tail -6; then
        status=1
    fi
    if [ -d "artifacts/$t" ] && [ -n "$(ls -A "artifacts/$t" 2>/dev/null)" ]; then
        echo "!! $t: crash inputs in fuzz/artifacts/$t"
        status=1
    fi
done
exit "$status"
