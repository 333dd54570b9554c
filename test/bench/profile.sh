#!/usr/bin/env bash
# test/bench/profile.sh: where a job's CPU goes under the gate's load,
# earmark against the PL/pgSQL reference and the design floor, side by side.
#
#   sudo bash test/bench/profile.sh
#
# The gate's 10,000-account scenarios (pgbench/earmark_many.sql,
# ref_many.sql, floor_design.sql; 50 clients, synchronous_commit on,
# earmark.rate_limit = 0), on the cluster and data gate.sh uses, each run
# PROFILE_SECONDS (15) after gate.sh's warm-up, in PROFILE_ROUNDS (2)
# interleaved rounds.  During each run `perf record -a -g` samples every
# CPU for PROFILE_RECORD seconds (8) at PROFILE_HZ (999) a second, starting
# 2 s in; profile.py reads the samples' stacks.  Printed per scenario
# (medians of the rounds): jobs/s, then the CPU milliseconds a job of the
# server's processes split by phase (the call, the commit, reading the
# next message, ...; a sample counts in the first phase whose function is
# on its stack), and the inclusive milliseconds a job of earmark's steps
# and of PostgreSQL functions both use.  On 2 cores at 50 clients the
# CPUs are busy, so a job's milliseconds are the CPU's capacity divided by
# the jobs/s: what the table shows is how each system spends them.
# Needs perf (Debian's linux-perf) and root (perf record -a).  About 3 min.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${BENCH_PORT:-55458}
SECS=${PROFILE_SECONDS:-15}
REC=${PROFILE_RECORD:-8}
HZ=${PROFILE_HZ:-999}
ROUNDS=${PROFILE_ROUNDS:-2}
CLIENTS=${BENCH_CLIENTS:-50}

command -v perf >/dev/null \
    || em_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null
em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
BENCH_ESCROW_SLOTS=" "     # no escrow accounts: not measured here
source "$EM_ROOT/test/bench/pgbench/bench_lib.sh"
bench_load

SCEN=(em_many ref_many floor_design)
declare -A SCRIPT=([em_many]=earmark_many.sql [ref_many]=ref_many.sql [floor_design]=floor_design.sql)
declare -A TITLE=([em_many]="earmark" [ref_many]="reference" [floor_design]="design floor")
declare -A VAL
for round in $(seq 1 "$ROUNDS"); do
    for s in "${SCEN[@]}"; do
        data=$BENCH_TMP/$s.$round.perf
        # perf starts once the warm-up is over and the measured run is 2 s in
        ( sleep $((BENCH_WARMUP + 2)); em_sudo perf record -q -a -g -F "$HZ" -o "$data" -- sleep "$REC" >/dev/null 2>&1 ) &
        rec=$!
        PGOPTIONS="-c synchronous_commit=on" bench_run "$s-round$round" "${SCRIPT[$s]}" "$CLIENTS" "$SECS"
        wait "$rec" || { em_log "perf record failed"; exit 1; }
        jobs=$(awk -v t="$BENCH_TPS" -v r="$REC" 'BEGIN { print t * r }')
        VAL[$s,tps]="${VAL[$s,tps]:-} $BENCH_TPS"
        while IFS='|' read -r k v; do
            VAL[$s,$k]="${VAL[$s,$k]:-} $v"
        done < <(em_sudo perf script -i "$data" -F comm,ip,sym 2>/dev/null | python3 "$EM_ROOT/test/bench/profile.py" "$jobs" "$HZ")
        em_sudo rm -f "$data"
    done
done
[ -z "${BENCH_BOOKS_BAD:-}" ] || { em_log "books wrong: $BENCH_BOOKS_BAD"; exit 1; }

# shellcheck disable=SC1091
source "$EM_ROOT/test/bench/stats.sh"
row() {     # row LABEL KEY FORMAT
    local line="| $1 |" s
    for s in "${SCEN[@]}"; do line="$line $(echo ${VAL[$s,$2]:-} | median "$3") |"; done
    echo "$line"
}
keys() { for k in "${!VAL[@]}"; do k=${k#em_many,}; [[ $k == "$1"* ]] && echo "${k#"$1"}"; done | sort -u; }

echo
echo "Where a job's CPU goes, $CLIENTS clients, synchronous_commit on, 10,000 accounts ($(date -u '+%Y-%m-%d %H:%M UTC'), medians of $ROUNDS rounds; perf record -a -g -F $HZ, $REC s a run)"
echo
echo "| CPU ms a job | ${TITLE[em_many]} | ${TITLE[ref_many]} | ${TITLE[floor_design]} |"
echo "| --- | ---: | ---: | ---: |"
row "jobs/s" tps "%.0f"
row "every process, idle included" all "%.3f"
row "idle" idle "%.3f"
row "pgbench" pgbench "%.3f"
row "**the server (postgres)**" postgres "%.3f"
while read -r k; do row "- $k" "phase:$k" "%.3f"; done < <(keys "phase:")
echo
echo "| inclusive CPU ms a job | ${TITLE[em_many]} | ${TITLE[ref_many]} | ${TITLE[floor_design]} |"
echo "| --- | ---: | ---: | ---: |"
while read -r f; do
    row "\`$f\`" "func:$f" "%.3f"
done < <(python3 "$EM_ROOT/test/bench/profile.py" --funcs)
