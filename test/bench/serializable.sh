#!/usr/bin/env bash
# test/bench/serializable.sh: how often the gate's 10,000-account load
# fails with 40001 when the application runs it at SERIALIZABLE, earmark
# against the reference, with READ COMMITTED and REPEATABLE READ beside
# them.  REPEATABLE READ takes no predicate locks: its failures are those
# of two transactions updating one row (the same account's budget, say),
# which SERIALIZABLE has too; what SERIALIZABLE fails beyond them is its
# read/write dependencies.  Each pgbench run is a job (reserve, charge,
# settle: three transactions) and is not retried (--max-tries=1): a job
# whose transaction fails counts as failed, and the client goes on to the
# next.  The share of failed jobs is a count, not a timing: the machine's
# load moves it little.
#
#   sudo bash test/bench/serializable.sh
#
# What it shows: a B-tree read under SERIALIZABLE takes a predicate lock
# on the whole leaf page, so two transactions that read and write the same
# leaf fail one another, whatever rows they touch.  An index whose leaf a
# job picks by account keeps accounts apart; one led by an increasing id
# (the reference's primary key, or earmark.job's if it were led by job_id)
# puts every open job in the same few leaves (docs/benchmarks.md).
#
# A throwaway cluster configured as gate.sh's (earmark preloaded, rate
# limit off), loaded by bench_lib.sh (10,000 accounts and BENCH_HISTORY
# settled jobs in each system).  For each level and each of
# pgbench/earmark_many.sql and pgbench/ref_many.sql: VACUUM ANALYZE and
# CHECKPOINT, then SERIALIZABLE_SECONDS (15) at BENCH_CLIENTS (50)
# clients, and the books checked.  No warm-up and no settling between
# runs: a failed job's hold stays open until its lease passes (longer
# than a run), and the run goes on with the accounts' other jobs.
# SERIALIZABLE_PORT (55466).

set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091
source "$HERE/../../scripts/lib.sh"
PORT=${SERIALIZABLE_PORT:-55466}
SECS=${SERIALIZABLE_SECONDS:-15}
CLIENTS=${BENCH_CLIENTS:-50}
em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
# shellcheck disable=SC1091
source "$HERE/pgbench/bench_lib.sh"     # its BENCH_TMP, removed on exit with the cluster
bench_load

# run LEVEL SCRIPT: one run at the level (PGOPTIONS spelling); leaves
# "jobs/s | done | failed | of them 40001 | share failed" in
# $BENCH_TMP/row, not printed: bench_check's verdict must reach this
# shell, not a subshell's
run() {
    local level=$1 script=$2 out=$BENCH_TMP/run.log
    em_psql -d "$BENCH_DB" -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
    PGOPTIONS="-c default_transaction_isolation=$level" "$EM_PGBIN/pgbench" -n -M prepared \
        -c "$CLIENTS" -j "$BENCH_THREADS" -T "$SECS" --max-tries=1 --failures-detailed \
        -f "$BENCH_SQL/$script" "$BENCH_DB" >"$out" 2>&1 || {
        tail -5 "$out" >&2
        exit 1
    }
    bench_check "$script"
    awk '/^number of transactions actually processed:/ { done = $6 }
         /^number of failed transactions:/ { failed = $5 }
         /^number of serialization failures:/ { ser = $5 }
         /^tps = / { tps = $3 }
         END { if (done + failed == 0) { print "no job done or failed" > "/dev/stderr"; exit 1 }
               printf "%.0f | %d | %d | %d | %.2f %%\n", tps, done, failed, ser,
                      100 * failed / (done + failed) }' "$out" >"$BENCH_TMP/row"
}

echo
echo "Failed jobs, $(date -u '+%Y-%m-%d %H:%M UTC'), 10,000 accounts, $CLIENTS clients, $SECS s a run,"
echo "no retries; a job is reserve, charge and settle, three transactions."
echo
echo "| level | system | jobs/s | jobs done | jobs failed | of them 40001 | failed |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for level in 'read\ committed' 'repeatable\ read' serializable; do
    for sys in earmark reference; do
        script=earmark_many.sql
        [ "$sys" = earmark ] || script=ref_many.sql
        run "$level" "$script"
        printf '| %s | %s | %s |\n' "${level/\\/}" "$sys" "$(cat "$BENCH_TMP/row")"
    done
done
[ -z "${BENCH_BOOKS_BAD:-}" ] || { echo "BOOKS WRONG: $BENCH_BOOKS_BAD" >&2; exit 1; }
