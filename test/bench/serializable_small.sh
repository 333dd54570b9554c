#!/usr/bin/env bash
# test/bench/serializable_small.sh: how often a new installation's calls
# fail one another with 40001 at SERIALIZABLE.  A new installation's
# tables are a few pages, on which the planner runs a look-up as a
# sequential scan, and under SERIALIZABLE a sequential scan is a predicate
# lock on the whole table: a call that read a table whole and wrote a row
# of it failed any other account's call that did the same.  serializable.sh
# measures 10,000 accounts with a history, where every plan is an index
# scan; this is the other end.
#
#   sudo bash test/bench/serializable_small.sh
#
# A throwaway cluster (earmark preloaded, rate limit off); in a new
# database for each run, SMALL_ACCOUNTS (100) accounts with a limit and
# one open hold each (lease 1 day, job i is account si's, capped), every
# table analyzed.  Then, for each script below, at
# REPEATABLE READ and at SERIALIZABLE, SMALL_SECONDS (10) at SMALL_CLIENTS
# (8) clients on a database set up anew for each run, each transaction
# on an account picked at random, not retried (--max-tries=1):
#   heartbeat  SELECT earmark_heartbeat(account, its job)
#   charge     SELECT earmark_charge(account, its job, 1) and a heartbeat
#              in one transaction (the holds are capped at set-up, so the
#              charge locks the job row and writes nothing)
#   refused    a reserve past the limit (refused: it looks for the
#              budget's dead holds to reclaim first, and finds none) and a
#              heartbeat, in one transaction
# REPEATABLE READ takes no predicate locks: its failures are two
# transactions that picked the same account (the same job row); what
# SERIALIZABLE fails beyond them is read/write dependencies.  Counts, not
# timings.  SMALL_SCRIPTS picks scripts (all three); SMALL_PORT (55467).

set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091
source "$HERE/../../scripts/lib.sh"
PORT=${SMALL_PORT:-55467}
SECS=${SMALL_SECONDS:-10}
CLIENTS=${SMALL_CLIENTS:-8}
ACCOUNTS=${SMALL_ACCOUNTS:-100}
em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0"
TMP=$(mktemp -d /tmp/earmark-small.XXXXXX)
chmod 755 "$TMP"
trap 'rm -rf "$TMP"; em_stop_cluster' EXIT

# setup DB: a new database with the accounts and their holds, analyzed
setup() {
    em_psql -d postgres -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" >/dev/null
    em_psql -d "$1" >/dev/null <<SQL
CREATE EXTENSION earmark;
SELECT earmark_set_limit('s' || i, 1000000000) FROM generate_series(1, $ACCOUNTS) i;
SELECT earmark_reserve('s' || i, 1000, 'open', lease => interval '1 day')
  FROM generate_series(1, $ACCOUNTS) i ORDER BY i;
-- each hold capped: a charge of it then takes the general path (the job
-- row locked, nothing written)
SELECT earmark_charge('s' || i, i, 1001) FROM generate_series(1, $ACCOUNTS) i;
ANALYZE;
SQL
}
cat >"$TMP/heartbeat.sql" <<SQL
\set a random(1, $ACCOUNTS)
SELECT earmark_heartbeat('s' || :a::text, :a);
SQL
cat >"$TMP/charge.sql" <<SQL
\set a random(1, $ACCOUNTS)
BEGIN;
SELECT charged FROM earmark_charge('s' || :a::text, :a, 1);
SELECT earmark_heartbeat('s' || :a::text, :a);
COMMIT;
SQL
cat >"$TMP/refused.sql" <<SQL
\set a random(1, $ACCOUNTS)
\set k random(1, 1000000000)
BEGIN;
SELECT admitted FROM earmark_reserve('s' || :a::text, 2000000000, 'big-' || :k::text);
SELECT earmark_heartbeat('s' || :a::text, :a);
COMMIT;
SQL

# run LEVEL SCRIPT: on a new database, "transactions/s | done | failed |
# share failed | sequential scans of earmark.job"
run() {
    local level=$1 script=$2 out=$TMP/run.log db=small_${script%.sql}
    setup "$db"
    PGOPTIONS="-c default_transaction_isolation=$level" "$EM_PGBIN/pgbench" -n -M prepared \
        -c "$CLIENTS" -j 2 -T "$SECS" --max-tries=1 --failures-detailed \
        -f "$TMP/$script" "$db" >"$out" 2>&1 || { tail -5 "$out" >&2; exit 1; }
    sleep 1                     # the backends' statistics reach the collector
    awk -v seq="$(em_psql -d "$db" -At -c "SELECT seq_scan FROM pg_stat_user_tables
                                          WHERE schemaname = 'earmark' AND relname = 'job'")" '
         /^number of transactions actually processed:/ { done = $6 }
         /^number of failed transactions:/ { failed = $5 }
         /^tps = / { tps = $3 }
         END { if (done + failed == 0) { print "nothing done or failed" > "/dev/stderr"; exit 1 }
               printf "%.0f | %d | %d | %.2f %% | %d\n", tps, done, failed,
                      100 * failed / (done + failed), seq }' "$out"
}

echo
echo "Failed transactions on a new installation, $(date -u '+%Y-%m-%d %H:%M UTC'), $ACCOUNTS accounts"
echo "with one open hold each, $CLIENTS clients, $SECS s a run on a new database, no retries."
echo
echo "| script | level | transactions/s | done | failed | failed share | sequential scans of earmark.job |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for script in ${SMALL_SCRIPTS:-heartbeat charge refused}; do
    for level in 'repeatable\ read' serializable; do
        printf '| %s | %s | %s |\n' "$script" "${level/\\/}" "$(run "$level" "$script.sql")"
    done
done
