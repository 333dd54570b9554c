#!/usr/bin/env bash
# test/bench/batch.sh: the batch forms against the single calls, side by
# side in one run on a private throwaway cluster (issue 13, target 3).
#
#   sudo bash test/bench/batch.sh
#   EM_PREFIX=/work/pfx/NAME BATCH_PORT=55810 bash test/bench/batch.sh   # private build
#
# BENCH_CLIENTS (8) pgbench clients, pgbench -n -M prepared, every call on a
# random one of BATCH_ACCOUNTS (1,000) accounts whose limit is never reached,
# every event a new key:
#   usage, single    earmark_record_usage, one event a transaction
#   usage, batch     earmark_record_usage_many, BATCH_SIZE (100) events a call
#   jobs, single     earmark_reserve, then earmark_settle: one job, two
#                    transactions (as an application without batches runs it)
#   jobs, batch      earmark_reserve_many of BATCH_SIZE jobs, then
#                    earmark_settle_many of those jobs: two transactions
# Events/s (jobs/s) is pgbench's tps times the events of one script run.
# BENCH_ROUNDS (3) rounds, the four scenarios interleaved in each round, each
# run after BENCH_WARMUP (2) unmeasured seconds of the same load; the median
# of the rounds is reported.  Then the targets (batch / single: usage >= 15,
# jobs >= 5) with pass/MISS, and the books: every cycle's counters equal its
# ledger, every account's held equals its open holds and used + held stays
# within the limit, and every batch of usage wrote all its events or none.
#
# Prints markdown.  About 3 minutes with the defaults on 2 cores.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${BATCH_PORT:-55810}
SECS=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-8}
WARMUP=${BENCH_WARMUP:-2}
SIZE=${BATCH_SIZE:-100}
ACCOUNTS=${BATCH_ACCOUNTS:-1000}
LIMIT=1000000000000000

em_setup
em_start_cluster "$PORT" \
    "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" \
    "earmark.report_interval = '1h'" \
    "earmark.rate_limit = 0" \
    "jit = off"
W=$(mktemp -d /tmp/earmark-bench-batch.XXXXXX)
chmod 755 "$W"
trap 'rm -rf "$W"; em_stop_cluster' EXIT
Q() { em_psql -d postgres -A -t "$@"; }

em_log "loading: $ACCOUNTS accounts, their cycles' budget rows"
Q -c "CREATE EXTENSION earmark" -c "CREATE SEQUENCE bench_key" >/dev/null
Q >/dev/null <<SQL
SELECT count(earmark_set_limit('a' || i, $LIMIT)) FROM generate_series(1, $ACCOUNTS) i;
SELECT count(*) FROM generate_series(1, $ACCOUNTS) i
  CROSS JOIN LATERAL earmark_reserve('a' || i, 1, 'warm-up') r
  CROSS JOIN LATERAL earmark_settle('a' || i, r.job_id, 0) s;
SELECT count(earmark_record_usage('a' || i, 1, 'warm-up')) FROM generate_series(1, $ACCOUNTS) i;
SQL
Q -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null

# the batch's keys: b<call>-<n>, one sequence number a call
KEYS="ARRAY(SELECT 'b' || s.n || '-' || g FROM (SELECT nextval('bench_key') AS n) s, generate_series(1, $SIZE) g)"
printf '%s\n' "\\set a random(1, $ACCOUNTS)" \
    "SELECT earmark_record_usage('a' || :a, 1, 'u' || nextval('bench_key'));" >"$W/usage_single.sql"
printf '%s\n' "\\set a random(1, $ACCOUNTS)" \
    "SELECT count(*) FROM earmark_record_usage_many('a' || :a, array_fill(1::bigint, ARRAY[$SIZE]), $KEYS);" \
    >"$W/usage_batch.sql"
printf '%s\n' "\\set a random(1, $ACCOUNTS)" \
    "SELECT job_id AS j FROM earmark_reserve('a' || :a, 10, 'r' || nextval('bench_key')) \\gset" \
    "SELECT charged FROM earmark_settle('a' || :a, :j, 5);" >"$W/jobs_single.sql"
printf '%s\n' "\\set a random(1, $ACCOUNTS)" \
    "SELECT array_agg(job_id ORDER BY ord) AS js FROM earmark_reserve_many('a' || :a, array_fill(10::bigint, ARRAY[$SIZE]), $KEYS) \\gset" \
    "SELECT count(*) FROM earmark_settle_many('a' || :a, :js::bigint[], array_fill(5::bigint, ARRAY[$SIZE]));" \
    >"$W/jobs_batch.sql"

SCEN=(usage_single usage_batch jobs_single jobs_batch)
declare -A EVENTS=([usage_single]=1 [usage_batch]=$SIZE [jobs_single]=1 [jobs_batch]=$SIZE)
declare -A RESULTS

tps() {  # tps FILE: transactions/s of a pgbench run, after a warm-up
    "$EM_PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$WARMUP" -f "$1" postgres >/dev/null 2>&1
    "$EM_PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$1" postgres 2>"$W/err" |
        sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}

for r in $(seq 1 "$ROUNDS"); do
    for s in "${SCEN[@]}"; do
        em_log "round $r/$ROUNDS: $s, $CLIENTS clients, ${SECS}s"
        t=$(tps "$W/$s.sql")
        [ -n "$t" ] || { cat "$W/err" >&2; t=0; }
        RESULTS[$s]="${RESULTS[$s]:-} $(python3 -c "print(f'{$t * ${EVENTS[$s]}:.0f}')")"
    done
    Q -c "CHECKPOINT" >/dev/null
done

# shellcheck disable=SC1091
source "$EM_ROOT/test/bench/stats.sh"
declare -A MED
for s in "${SCEN[@]}"; do
    # shellcheck disable=SC2086
    MED[$s]=$(echo ${RESULTS[$s]} | median "%.0f")
done
ratio() { python3 -c "print(f'{$1 / max($2, 1):.1f}')"; }
mark() { python3 -c "print('pass' if $1 >= $2 else 'MISS')"; }
ru=$(ratio "${MED[usage_batch]}" "${MED[usage_single]}")
rj=$(ratio "${MED[jobs_batch]}" "${MED[jobs_single]}")
# each round's own ratio (its two runs ran one after the other): shown
# beside the ratio of the medians, which the target is judged on
by_round() {  # by_round BATCH SINGLE: "r1, r2, ..."
    python3 -c "import sys; b, s = sys.argv[1].split(), sys.argv[2].split(); print(', '.join(f'{float(x) / max(float(y), 1):.1f}' for x, y in zip(b, s)))" "$1" "$2"
}
ru_rounds=$(by_round "${RESULTS[usage_batch]}" "${RESULTS[usage_single]}")
rj_rounds=$(by_round "${RESULTS[jobs_batch]}" "${RESULTS[jobs_single]}")

# the books: settle what a run cut off between reserve and settle, then check
Q >/dev/null <<'SQL'
SELECT count(*) FROM earmark.job j CROSS JOIN LATERAL earmark_settle(j.account, j.job_id, 0) s
 WHERE j.status IN ('running', 'capped');
SQL
counters=$(Q <<'SQL'
SELECT count(*) FILTER (WHERE b.used
         + coalesce((SELECT sum(u.units) FROM earmark.usage_shard u
                      WHERE u.account = b.account AND u.budget_id = b.budget_id), 0)
         <> coalesce((SELECT sum(l.units) FROM earmark.ledger l
                       WHERE l.account = b.account AND l.budget_id = b.budget_id), 0))
       || ' of ' || count(*)
  FROM earmark.budget b;
SQL
)
holds=$(Q <<'SQL'
SELECT count(*) FILTER (WHERE b.held <> coalesce(o.held, 0) OR b.used + b.held > b.lim) || ' of ' || count(*)
  FROM earmark.account a CROSS JOIN LATERAL earmark_budget(a.account) b
  LEFT JOIN (SELECT account, sum(amount) AS held FROM earmark.job
              WHERE status IN ('running', 'capped') GROUP BY account) o ON o.account = a.account;
SQL
)
partial=$(Q <<'SQL'
SELECT count(*) || ' of ' || (SELECT count(DISTINCT split_part(entry_key, '-', 1)) FROM earmark.ledger
                               WHERE entry_key LIKE 'b%')
  FROM (SELECT split_part(entry_key, '-', 1) FROM earmark.ledger WHERE entry_key LIKE 'b%'
         GROUP BY 1 HAVING count(*) <> (SELECT max(n) FROM (SELECT count(*) AS n FROM earmark.ledger
                                          WHERE entry_key LIKE 'b%' GROUP BY split_part(entry_key, '-', 1)) m)) x;
SQL
)
usage_rows=$(Q -c "SELECT count(*) FROM earmark.ledger WHERE entry_key IS NOT NULL")
jobs=$(Q -c "SELECT count(*) FROM earmark.job")

echo
echo "## Batches ($CLIENTS clients, $SIZE events a call, $ACCOUNTS accounts, ${SECS} s a run, median of $ROUNDS interleaved rounds)"
echo
echo "| scenario | events/s (median) | the rounds |"
echo "| --- | ---: | --- |"
echo "| usage, single calls | ${MED[usage_single]} |${RESULTS[usage_single]} |"
echo "| usage, earmark_record_usage_many | ${MED[usage_batch]} |${RESULTS[usage_batch]} |"
echo "| jobs, single reserve + settle | ${MED[jobs_single]} |${RESULTS[jobs_single]} |"
echo "| jobs, earmark_reserve_many + earmark_settle_many | ${MED[jobs_batch]} |${RESULTS[jobs_batch]} |"
echo
echo "| target | measured (ratio of the medians) | | each round's ratio |"
echo "| --- | ---: | --- | --- |"
echo "| usage events/s, batch >= 15 x single | ${ru} x | $(mark "$ru" 15) | $ru_rounds |"
echo "| jobs/s, batch >= 5 x single | ${rj} x | $(mark "$rj" 5) | $rj_rounds |"
echo
echo "Books after the runs: cycles whose counters differ from their ledger: $counters;" \
     "accounts whose held differs from their open holds or whose used + held passes the limit: $holds;" \
     "usage batches not written whole: $partial ($usage_rows keyed ledger rows, $jobs jobs)."
