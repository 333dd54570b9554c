#!/usr/bin/env bash
# test/bench/ab.sh: earmark builds against each other, side by side in one
# run, for measuring a change (A/B) rather than the targets (gate.sh).
#
#   bash test/bench/ab.sh NAME=CHECKOUT [NAME=CHECKOUT ...]
#
# Each CHECKOUT is a work tree of earmark (for example one made by
# `git worktree add --detach /tmp/old HEAD~1`).  Each is built into its own
# private PostgreSQL copy (AB_PREFIXES/NAME) and gets its own cluster on its
# own port (AB_PORT, AB_PORT + 1, ...), configured as gate.sh's and loaded
# by the checkout's own test/bench/pgbench/bench_lib.sh (the same accounts,
# reference and history), so that builds with different APIs (0.2.0's
# job-first calls, 0.3.0's account-first ones) each run their own pgbench
# scripts.  Then AB_ROUNDS rounds: in each, every scenario of AB_SCEN on
# every build in turn (interleaved, so that the machine's load falls on
# all alike), BENCH_SECONDS each after BENCH_WARMUP of warm-up, the books
# checked after each run (bench_run).  Prints per build and scenario the
# median jobs/s, CPU ms and WAL bytes a job over the rounds, every round's
# jobs/s, and each build's median against the first build's.
#
# Environment: AB_REF_ONCE (0; 1: the reference scenarios on the first
# build only: the reference is the same SQL in every build), AB_SCEN ("em_many em_hot ref_many": ids of bench_lib's
# bench_scenarios), AB_ROUNDS (3), AB_PORT (55820), AB_SYNC (on),
# AB_PREFIXES (/tmp/earmark-ab), AB_CONF (extra postgresql.conf lines,
# separated by ';'), and bench_lib's BENCH_SECONDS (15), BENCH_CLIENTS (50),
# BENCH_WARMUP, BENCH_HISTORY, BENCH_ESCROW_SLOTS ("": no escrow accounts).

set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCEN=(${AB_SCEN:-em_many em_hot ref_many})
ROUNDS=${AB_ROUNDS:-3}
PORT0=${AB_PORT:-55820}
SYNC=${AB_SYNC:-on}
PREFIXES=${AB_PREFIXES:-/tmp/earmark-ab}
SECS=${BENCH_SECONDS:-15}
CLIENTS=${BENCH_CLIENTS:-50}
export BENCH_ESCROW_SLOTS=${BENCH_ESCROW_SLOTS:-}
export BENCH_RATE_SCEN=1
STATE=$(mktemp -d /tmp/earmark-ab.XXXXXX)
chmod 755 "$STATE"

NAMES=() DIRS=()
for arg in "$@"; do
    NAMES+=("${arg%%=*}")
    DIRS+=("$(cd "${arg#*=}" && pwd)")
done
[ ${#NAMES[@]} -ge 1 ] || { echo "usage: $0 NAME=CHECKOUT ..." >&2; exit 2; }

# on I CMD...: run CMD in a subshell with build I's lib.sh and bench_lib.sh
# sourced and its cluster's environment set
on() {
    local i=$1
    shift
    (
        export EM_PREFIX=$PREFIXES/${NAMES[$i]}
        # shellcheck disable=SC1091
        source "${DIRS[$i]}/scripts/lib.sh"
        if [ -f "$STATE/$i.base" ]; then
            EM_BASE=$(cat "$STATE/$i.base")
            EM_DATA=$EM_BASE/data
            EM_SOCK=$EM_BASE/sock
            export PGHOST=$EM_SOCK PGPORT=$((PORT0 + i)) PGUSER=postgres
        fi
        # shellcheck disable=SC1091
        source "${DIRS[$i]}/test/bench/pgbench/bench_lib.sh"
        trap 'rm -rf "$BENCH_TMP"' EXIT
        "$@"
    )
}

ab_start() {
    local conf=()
    IFS=';' read -r -a conf <<<"${AB_CONF:-}"
    em_setup
    em_start_cluster "$EM_PORT_WANTED" "shared_preload_libraries = 'earmark'" \
        "earmark.database = 'postgres'" "earmark.rate_limit = 0" \
        "max_wal_size = '4GB'" "checkpoint_timeout = '30min'" "${conf[@]}"
    echo "$EM_BASE" >"$STATE/$EM_I.base"
    trap 'rm -rf "$BENCH_TMP"' EXIT
    bench_load
}

ab_stop() {
    em_stop_cluster
}

ab_run() {     # ab_run LABEL SCENARIO: one measured run; prints tps|cpu|wal
    BENCH_ESCROW=0
    [ -z "$BENCH_ESCROW_SLOTS" ] || BENCH_ESCROW=$(bench_has_escrow)
    # (a build's bench_lib.sh without per-scenario session options)
    declare -gA BENCH_OPTS
    bench_scenarios
    local args=()
    read -r -a args <<<"${BENCH_ARGS[$2]}"
    PGOPTIONS="-c synchronous_commit=$SYNC ${BENCH_OPTS[$2]:-}" \
        bench_run "$1" "${args[0]}" "$CLIENTS" "$SECS" "${args[@]:1}"
    echo "R|$BENCH_TPS|$BENCH_CPU|${BENCH_WAL%% *}"
}

cleanup() {
    local i
    for i in "${!NAMES[@]}"; do
        [ -f "$STATE/$i.base" ] && on "$i" ab_stop || true
    done
    rm -rf "$STATE"
}
trap cleanup EXIT

for i in "${!NAMES[@]}"; do
    EM_I=$i EM_PORT_WANTED=$((PORT0 + i)) on "$i" ab_start
done

declare -A R
for round in $(seq 1 "$ROUNDS"); do
    for s in "${SCEN[@]}"; do
        for i in "${!NAMES[@]}"; do
            # the reference is the same in every build: AB_REF_ONCE=1 runs it on the first only
            if [ "${AB_REF_ONCE:-0}" = 1 ] && [ "$i" -gt 0 ] && [[ $s == ref_* ]]; then continue; fi
            line=$(on "$i" ab_run "${NAMES[$i]}-$s-round$round" "$s" | sed -n 's/^R|//p')
            R[$i,$s]="${R[$i,$s]:-} $line"
        done
    done
done

# shellcheck disable=SC1091
source "$HERE/stats.sh"
col() { for x in $2; do echo "$x" | cut -d'|' -f"$1"; done | tr '\n' ' '; }

echo
echo "earmark A/B, $(date -u '+%Y-%m-%d %H:%M UTC'), $CLIENTS clients, $SECS s a run, median of $ROUNDS interleaved rounds,"
echo "synchronous_commit $SYNC; load average after: $(cut -d' ' -f1-3 /proc/loadavg)."
echo
echo "| build | scenario | jobs/s (median) | rounds | CPU ms / job | WAL bytes / job | jobs/s / ${NAMES[0]}'s |"
echo "| --- | --- | ---: | --- | ---: | ---: | ---: |"
for s in "${SCEN[@]}"; do
    base=$(col 1 "${R[0,$s]}" | median "%.0f")
    for i in "${!NAMES[@]}"; do
        [ -n "${R[$i,$s]:-}" ] || continue
        t=$(col 1 "${R[$i,$s]}" | median "%.0f")
        echo "| ${NAMES[$i]} ($(git -C "${DIRS[$i]}" describe --always --dirty 2>/dev/null)) | $s | $t | $(col 1 "${R[$i,$s]}") | $(col 2 "${R[$i,$s]}" | median "%.2f") | $(col 3 "${R[$i,$s]}" | median "%.0f") | $(awk -v a="$t" -v b="$base" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }') |"
    done
done
