#!/usr/bin/env bash
# test/bench/job_wal.sh: where a job's WAL goes, earmark against the
# reference, under the gate's own 10,000-account load: by record kind
# (records, bytes and full-page image bytes a job) and, for the full-page
# images, by relation.  Counted from pg_waldump between two WAL positions,
# so the figures are counts, not timings: the machine's load moves them
# little.
#
#   sudo bash test/bench/job_wal.sh
#
# A throwaway cluster configured as gate.sh's (earmark preloaded, rate
# limit off, checkpoint_timeout 30 min), loaded by bench_lib.sh (10,000
# accounts and BENCH_HISTORY settled jobs in each system).  For each of
# pgbench/earmark_many.sql and pgbench/ref_many.sql: VACUUM ANALYZE and
# CHECKPOINT (as bench_reset does between the gate's runs), BENCH_WARMUP
# seconds of the load, then JOB_WAL_SECONDS (15) measured at 50 clients,
# synchronous_commit on.  A full-page image is written by the first change
# of a page after a checkpoint; which pages a run changes for the first
# time (the free space VACUUM left in old pages, the pages a non-HOT
# update moves a row to) decides how many.  JOB_WAL_PORT (55464).

set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091
source "$HERE/../../scripts/lib.sh"
PORT=${JOB_WAL_PORT:-55464}
SECS=${JOB_WAL_SECONDS:-15}
CLIENTS=${BENCH_CLIENTS:-50}
em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
# shellcheck disable=SC1091
source "$HERE/pgbench/bench_lib.sh"     # its BENCH_TMP, removed on exit with the cluster
bench_load

# waldump FROM TO ARGS...: pg_waldump as the server's user
waldump() {
    local from=$1 to=$2
    shift 2
    em_as_pg "$EM_PGBIN/pg_waldump" -p "$EM_DATA/pg_wal" -s "$from" -e "$to" "$@" 2>/dev/null || true
}

# measure NAME SCRIPT: one run; leaves NAME.stats, NAME.fpw and NAME.jobs
measure() {
    local name=$1 script=$2 from to
    em_psql -d "$BENCH_DB" -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
    "$EM_PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$BENCH_WARMUP" \
        -f "$BENCH_SQL/$script" "$BENCH_DB" >/dev/null 2>&1
    from=$(bq "SELECT pg_current_wal_insert_lsn()")
    PGOPTIONS="-c synchronous_commit=on" "$EM_PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 \
        -T "$SECS" -f "$BENCH_SQL/$script" "$BENCH_DB" >"$BENCH_TMP/$name.log" 2>&1
    to=$(bq "SELECT pg_current_wal_insert_lsn()")
    sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$BENCH_TMP/$name.log" \
        >"$BENCH_TMP/$name.jobs"
    waldump "$from" "$to" --stats=record >"$BENCH_TMP/$name.stats"
    # one line a full-page image: its relation's file node
    # (none at all after a short run: the warm-up changed its pages first)
    waldump "$from" "$to" | { grep -o 'rel [0-9]*/[0-9]*/[0-9]* \(fork [a-z]* \)\?blk [0-9]* FPW' || true; } \
        | awk '{ split($2, r, "/"); print r[3] }' | sort | uniq -c >"$BENCH_TMP/$name.fpw"
    bench_check "$name"
}

measure earmark earmark_many.sql
measure reference ref_many.sql
EJ=$(cat "$BENCH_TMP/earmark.jobs")
RJ=$(cat "$BENCH_TMP/reference.jobs")

echo
echo "WAL a job, $(date -u '+%Y-%m-%d %H:%M UTC'), 10,000 accounts, $CLIENTS clients, $SECS s after a"
echo "checkpoint and $BENCH_WARMUP s of warm-up; earmark $EJ jobs, the reference $RJ."
echo
echo "| record kind | earmark: records | record bytes | full-page bytes | reference: records | record bytes | full-page bytes |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
# pg_waldump --stats=record: Type N (%) size (%) fpi (%) combined (%)
awk -v ej="$EJ" -v rj="$RJ" '
    FNR == 1 { f++ }
    # the shares in parentheses and brackets left out: kind N size fpi combined
    { gsub(/\([^)]*\)/, ""); gsub(/\[[^]]*\]/, "") }
    /^[A-Z][A-Za-z0-9]*\/[A-Z_0-9]+ / {
        k = $1; kinds[k] = 1
        n[f, k] = $2; b[f, k] = $3; p[f, k] = $4
    }
    /^Total/ { tn[f] = $2; tb[f] = $3; tp[f] = $4 }
    END {
        for (k in kinds) {
            if ((n[1, k] / ej < 0.05) && (n[2, k] / rj < 0.05)) continue
            printf "| %s | %.2f | %.0f | %.0f | %.2f | %.0f | %.0f |\n", k,
                n[1, k] / ej, b[1, k] / ej, p[1, k] / ej, n[2, k] / rj, b[2, k] / rj, p[2, k] / rj
        }
        printf "~| **all** (kinds under 0.05 a job included) | **%.2f** | **%.0f** | **%.0f** | **%.2f** | **%.0f** | **%.0f** |\n",
            tn[1] / ej, tb[1] / ej, tp[1] / ej, tn[2] / rj, tb[2] / rj, tp[2] / rj
    }' "$BENCH_TMP/earmark.stats" "$BENCH_TMP/reference.stats" | LC_ALL=C sort | sed "s/^~//"

echo
echo "| full-page images by relation | earmark: a job | reference: a job |"
echo "| --- | ---: | ---: |"
fpw_rows() {    # fpw_rows NAME JOBS: relation|images a job
    local count node
    while read -r count node; do
        printf '%s|%s\n' "$(bq "SELECT coalesce((SELECT relnamespace::regnamespace || '.' || relname FROM pg_class WHERE relfilenode = $node LIMIT 1), 'file $node')")" \
            "$(awk -v c="$count" -v j="$2" 'BEGIN { printf "%.3f", c / j }')"
    done <"$BENCH_TMP/$1.fpw"
}
LC_ALL=C join -t'|' -a1 -a2 -e '0' -o 0,1.2,2.2 <(fpw_rows earmark "$EJ" | LC_ALL=C sort -t'|' -k1,1) <(fpw_rows reference "$RJ" | LC_ALL=C sort -t'|' -k1,1) \
    | sort -t'|' -k2,2gr | awk -F'|' '$2 >= 0.001 || $3 >= 0.001 { printf "| %s | %s | %s |\n", $1, $2, $3 }'
[ -z "${BENCH_BOOKS_BAD:-}" ] || { echo "BOOKS WRONG: $BENCH_BOOKS_BAD" >&2; exit 1; }
