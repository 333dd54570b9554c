#!/usr/bin/env bash
# test/bench/clients.sh: gate throughput against the number of clients,
# one hot account against 10,000 accounts, earmark against the PL/pgSQL
# reference, side by side in one run on a private throwaway cluster.
#
#   sudo bash test/bench/clients.sh
#
# For each number of clients in CLIENTS_LIST (1 8 50 100), the scenarios of
# gate.sh (same pgbench scripts, same set-up and reset between runs, see
# pgbench/bench_lib.sh: 50,000 jobs of history, 3 s of unmeasured warm-up
# before each point), CLIENTS_SECONDS each (8), synchronous_commit on:
#   earmark hot, reference hot, earmark hot with escrow (16 and 64 slots,
#   when earmark_set_escrow exists), earmark 10,000 accounts, reference
#   10,000 accounts.
# Writes the numbers to docs/benchmarks.dat (one row per number of
# clients, jobs/s per scenario) and plots them
# with gnuplot to docs/benchmarks.svg; prints the same numbers as a
# markdown table.
#
# Environment: CLIENTS_PORT (55461), CLIENTS_LIST ("1 8 50 100"),
# CLIENTS_SECONDS (8), CLIENTS_OUT (docs; where the .dat and .svg go).
# About 9 minutes with the defaults.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${CLIENTS_PORT:-55461}
LIST=${CLIENTS_LIST:-"1 8 50 100"}
SECS=${CLIENTS_SECONDS:-8}
OUT=${CLIENTS_OUT:-$EM_ROOT/docs}

command -v gnuplot >/dev/null || em_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null
em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
source "$EM_ROOT/test/bench/pgbench/bench_lib.sh"

STARTED=$(date -u '+%Y-%m-%d %H:%M UTC')
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
bench_load

SCEN=("${BENCH_SCEN[@]}")
declare -A TPS
for c in $LIST; do
    for s in "${SCEN[@]}"; do
        read -r -a args <<<"${BENCH_ARGS[$s]}"
        bench_run "$s-c$c" "${args[0]}" "$c" "$SECS" "${args[@]:1}"
        TPS[$s,$c]=$BENCH_TPS
    done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$OUT"
DAT=$OUT/benchmarks.dat
{
    echo "# earmark gate throughput (jobs/s; a job = reserve + charge + settle) against clients"
    echo "# $STARTED, PostgreSQL $(bq 'SHOW server_version'), $(nproc) CPUs, $SECS s a point,"
    echo "# synchronous_commit on; load average before $LOAD_BEFORE, after $LOAD_AFTER"
    echo "# written by test/bench/clients.sh"
    echo "# columns: clients, then jobs/s of: ${SCEN[*]}"
    for c in $LIST; do
        line="$c"
        for s in "${SCEN[@]}"; do line="$line ${TPS[$s,$c]:-NaN}"; done
        echo "$line"
    done
} >"$DAT"

# one line per scenario: earmark solid, escrow dashed, reference dotted;
# hot accounts warm colours, 10,000 accounts cool ones
plots=()
col=2
escrow_colours=('#9467bd' '#8c564b' '#e377c2')
ei=0
for s in "${SCEN[@]}"; do
    case $s in
        em_hot)    style="lw 2 pt 7 lc rgb '#d62728'" ;;
        em_escrow*) style="lw 2 dt 2 pt 9 lc rgb '${escrow_colours[$((ei % 3))]}'"; ei=$((ei + 1)) ;;
        em_many)   style="lw 2 pt 5 lc rgb '#1f77b4'" ;;
        ref_hot)   style="lw 2 dt 3 pt 6 lc rgb '#ff7f0e'" ;;
        ref_many)  style="lw 2 dt 3 pt 4 lc rgb '#2ca02c'" ;;
        floor_many) style="lw 1 dt 4 pt 1 lc rgb '#7f7f7f'" ;;
        floor_design) style="lw 1 dt 5 pt 2 lc rgb '#17becf'" ;;
    esac
    plots+=("'$DAT' using 1:$col with linespoints $style title '${BENCH_NAME[$s]}'")
    col=$((col + 1))
done
plot_cmd="plot $(printf '%s, ' "${plots[@]}")"
plot_cmd=${plot_cmd%, }
xtics=$(echo $LIST | sed 's/\([0-9][0-9]*\)/"\1" \1/g; s/ "/, "/g')
gnuplot <<GP
set terminal svg size 1000,480 dynamic font 'sans,12' background rgb 'white'
set termoption noenhanced
set output '$OUT/benchmarks.svg'
set title "earmark gate: jobs/s (a job = reserve + charge + settle) against clients\n$(nproc) CPUs, synchronous_commit on, $SECS s a point, $STARTED"
set xlabel 'clients (log scale)'
set ylabel 'jobs/s'
set logscale x
set xtics ($xtics)
set xrange [0.8:130]
set yrange [0:*]
set grid
set key outside right top vertical
$plot_cmd
GP
em_log "wrote $DAT and $OUT/benchmarks.svg"

echo
echo "Gate throughput against clients, $STARTED; PostgreSQL $(bq 'SHOW server_version'), $(nproc) CPUs,"
echo "$SECS s a point, pgbench -M prepared, synchronous_commit on; jobs/s (a job = reserve + charge + settle)."
echo "Load average (1, 5, 15 min) before: $LOAD_BEFORE; after: $LOAD_AFTER."
[ -z "${BENCH_BOOKS_BAD:-}" ] || echo "**Books wrong after: ${BENCH_BOOKS_BAD}**"
echo
hdr="| clients |"; sep="| ---: |"
for s in "${SCEN[@]}"; do hdr="$hdr ${BENCH_NAME[$s]} |"; sep="$sep ---: |"; done
echo "$hdr"; echo "$sep"
for c in $LIST; do
    line="| $c |"
    for s in "${SCEN[@]}"; do line="$line ${TPS[$s,$c]} |"; done
    echo "$line"
done
