#!/usr/bin/env bash
# test/bench/refusals.sh: how fast an account at its limit refuses, against
# how many holds it has open.  A reserve that does not fit first looks for
# the budget's dead holds, to expire them and try again (a hold whose lease
# has passed never causes a refusal): it reads every open hold of the
# budget, since a lease's end is in no index (every charge renews it, and an
# indexed column would keep that update from being HOT), and it does so
# holding the budget row, which the account's settlements wait for; once a
# search has read them all and found none dead, the budget's lease floor
# (leasefloor.c) lets the next refusals read none until a lease could end;
# and a session that saw the budget refuse reads its room without the
# budget row's lock first, and refuses there (gate.c, refused_unlocked: no
# lock, no transaction id, nothing to flush).
# The reference (reference.sql) does not reclaim: its refusal reads the
# budget row alone.
#
#   sudo bash test/bench/refusals.sh
#
# A throwaway cluster (earmark preloaded, rate limit off).  For each N in
# REFUSE_HOLDS ("10 1000 10000"), a new database: account hot with a limit
# of 10 x N, in both systems, and N open holds of 10 (lease 1 hour, so none
# is dead: the search finds nothing); then REFUSE_SECONDS (10) of
# REFUSE_CLIENTS (8) clients each reserving 10 on the full account with a
# new key, earmark and the reference one after the other, synchronous
# commit on.  Every call must be refused (checked: no job was added).
# Prints refusals/s of each and their ratio.  REFUSE_PORT (55468).

set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091
source "$HERE/../../scripts/lib.sh"
PORT=${REFUSE_PORT:-55468}
SECS=${REFUSE_SECONDS:-10}
CLIENTS=${REFUSE_CLIENTS:-8}
HOLDS=${REFUSE_HOLDS:-10 1000 10000}
em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0"
TMP=$(mktemp -d /tmp/earmark-refuse.XXXXXX)
chmod 755 "$TMP"
trap 'rm -rf "$TMP"; em_stop_cluster' EXIT

cat >"$TMP/earmark.sql" <<'SQL'
\set k random(1, 1000000000)
SELECT admitted FROM earmark_reserve('hot', 10, 'r-' || :k::text);
SQL
cat >"$TMP/reference.sql" <<'SQL'
\set k random(1, 1000000000)
SELECT ref.reserve('hot', 10, 'r-' || :k::text);
SQL

# setup N: a new database with N open holds in each system, the account full
setup() {
    em_psql -d postgres -c "DROP DATABASE IF EXISTS refuse" -c "CREATE DATABASE refuse" >/dev/null
    em_psql -d refuse -f "$HERE/reference.sql" >/dev/null
    em_psql -d refuse >/dev/null <<SQL
CREATE EXTENSION earmark;
SELECT earmark_set_limit('hot', 10 * $1);
SELECT ref.set_limit('hot', 10 * $1);
SELECT count(*) FROM (SELECT earmark_reserve('hot', 10, 'open-' || g, lease => interval '1 hour')
                        FROM generate_series(1, $1) g) s;
SELECT count(*) FROM (SELECT ref.reserve('hot', 10, 'open-' || g) FROM generate_series(1, $1) g) s;
VACUUM ANALYZE;
SQL
}

# run SCRIPT: refusals/s
run() {
    "$EM_PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$TMP/$1" refuse \
        >"$TMP/run.log" 2>&1 || { tail -5 "$TMP/run.log" >&2; exit 1; }
    awk '/^tps = / { printf "%.0f", $3 }' "$TMP/run.log"
}

echo
echo "Refusals of a full account, $(date -u '+%Y-%m-%d %H:%M UTC'): $CLIENTS clients, $SECS s a run,"
echo "each call a reserve of 10 with a new key; N open holds, none dead."
echo
echo "| open holds | earmark refusals/s | reference refusals/s | earmark / reference |"
echo "| ---: | ---: | ---: | ---: |"
for n in $HOLDS; do
    setup "$n"
    e=$(run earmark.sql)
    r=$(run reference.sql)
    jobs=$(em_psql -d refuse -At -c "SELECT (SELECT count(*) FROM earmark.job) || ',' || (SELECT count(*) FROM ref.job)")
    [ "$jobs" = "$n,$n" ] || { echo "a reserve was admitted: jobs $jobs, expected $n,$n" >&2; exit 1; }
    awk -v n="$n" -v e="$e" -v r="$r" 'BEGIN { printf "| %d | %d | %d | %.2f |\n", n, e, r, e / r }'
done
