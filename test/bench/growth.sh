#!/usr/bin/env bash
# test/bench/growth.sh: the gate's 10,000-account load as both job tables
# grow, earmark against the PL/pgSQL reference on one cluster.
#
#   bash test/bench/growth.sh
#
# A throwaway cluster configured as gate.sh's, loaded by bench_lib.sh's
# bench_load (10,000 accounts, BENCH_HISTORY settled jobs in each system;
# no escrow accounts).  Then GROWTH_STEPS + 1 sizes: at each,
# GROWTH_ROUNDS interleaved rounds of earmark_many.sql and ref_many.sql
# (bench_run: BENCH_CLIENTS clients, BENCH_SECONDS after BENCH_WARMUP,
# each run after VACUUM ANALYZE and CHECKPOINT, the books checked), then
# GROWTH_JOBS settled jobs more in each system (bench_history: each one's
# own reserve and settle, 1,000 a transaction, synchronous_commit off),
# and VACUUM ANALYZE and CHECKPOINT.  Prints, per size and round, each job
# table's rows and size with its indexes, jobs/s, full-page images and WAL
# bytes a job.  Counts of full-page images follow the checkpoint: each run
# starts on one, as gate.sh's do.
#
# Environment: GROWTH_PORT (55465), GROWTH_STEPS (3), GROWTH_JOBS
# (250000), GROWTH_ROUNDS (2), and bench_lib.sh's BENCH_CLIENTS (50),
# BENCH_SECONDS (15), BENCH_WARMUP (3), BENCH_HISTORY (50000).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
PORT=${GROWTH_PORT:-55465}
STEPS=${GROWTH_STEPS:-3}
JOBS=${GROWTH_JOBS:-250000}
ROUNDS=${GROWTH_ROUNDS:-2}
CLIENTS=${BENCH_CLIENTS:-50}
SECS=${BENCH_SECONDS:-15}
export BENCH_ESCROW_SLOTS=""
em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
source "$EM_ROOT/test/bench/pgbench/bench_lib.sh"
bench_load

# one system's job table: rows, and size with its indexes
table() {
    bq "SELECT to_char(count(*), 'FM999,999,999') || ' rows, '
               || pg_size_pretty(pg_total_relation_size('$1')) FROM $1"
}

ROWS=()
for step in $(seq 0 "$STEPS"); do
    sizes="$(table earmark.job) / $(table ref.job)"
    em_log "size $step: $sizes"
    for r in $(seq 1 "$ROUNDS"); do
        bench_run "em_many-size$step-round$r" earmark_many.sql "$CLIENTS" "$SECS"
        em_tps=$BENCH_TPS em_wal=$BENCH_WAL
        bench_run "ref_many-size$step-round$r" ref_many.sql "$CLIENTS" "$SECS"
        ROWS+=("| $sizes | $r | $em_tps / $BENCH_TPS ($(bench_ratio "$em_tps" "$BENCH_TPS")×) | $em_wal / $BENCH_WAL |")
    done
    if [ "$step" -lt "$STEPS" ]; then
        em_log "growing: $JOBS settled jobs more in each system"
        bench_history "$JOBS" "grow$step-"
    fi
done

echo
echo "earmark against the reference as the job tables grow, $(date -u '+%Y-%m-%d %H:%M UTC');"
echo "$CLIENTS clients, $SECS s a run, synchronous_commit on; earmark $(git -C "$EM_ROOT" describe --always --dirty 2>/dev/null || echo "(no git)")."
echo "WAL: bytes a job (records, full-page images a job)."
echo
echo "| job table, earmark / reference | round | jobs/s, earmark / reference | WAL a job, earmark / reference |"
echo "| --- | ---: | --- | --- |"
printf '%s\n' "${ROWS[@]}"
echo
if [ -n "${BENCH_BOOKS_BAD:-}" ]; then echo "**Books wrong after: ${BENCH_BOOKS_BAD}** (see the log above)."; else echo "Books right after every run."; fi
