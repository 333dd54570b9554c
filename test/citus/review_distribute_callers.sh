#!/usr/bin/env bash
# test/citus/review_distribute_callers.sh: callers of
# earmark_distribute() that wait for the distribution lock: lock_timeout,
# a second concurrent call at READ COMMITTED and at REPEATABLE READ (TAP).
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55860 bash test/citus/review_distribute_callers.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin_cluster "earmark.sweep_interval = '100ms'"
ct_sql 0 -q -c "CREATE EXTENSION earmark" >/dev/null
ok $? "CREATE EXTENSION earmark"
ndist() { ct_val 0 "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'earmark.%'"; }

# A. lock_timeout while another transaction holds the lock
ct_sql 0 -q -c "BEGIN" -c "SELECT earmark.distribution_lock()" -c "SELECT pg_sleep(20)" >/dev/null 2>&1 &
h=$!
ct_wait 10 0 "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 25956 AND granted AND mode = 'ExclusiveLock'" 1 >/dev/null
t0=$(date +%s%N)
err=$(ct_sql 0 -q -A -t -v VERBOSITY=verbose -c "SET lock_timeout = '1s'" -c "SELECT count(*) FROM earmark_distribute()" 2>&1 >/dev/null | head -1)
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
diag "lock_timeout: $err (${ms} ms)"
is "$(echo "$err" | grep -o 55P03)" 55P03 "with lock_timeout 1s it fails with 55P03 while the lock is held"
is "$(ndist)" 0 "... and distributed nothing"
kill $h 2>/dev/null; ct_val 0 "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(20)'" >/dev/null; wait $h 2>/dev/null

# B. a second call at REPEATABLE READ that waited for the first
run_pair() {  # ISOLATION: first call holds its transaction open 5 s; the second waits
    ct_sql 0 -q -A -t -c "BEGIN" -c "SELECT count(*) FROM earmark_distribute()" -c "SELECT pg_sleep(5)" -c "COMMIT" >/dev/null 2>&1 &
    local h=$!
    ct_wait 60 0 "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(5)'" 1 >/dev/null
    ct_sql 0 -q -A -t -c "BEGIN ISOLATION LEVEL $1" -c "SELECT count(*) FROM earmark_distribute()" -c "COMMIT" 2>&1
    wait $h
}
got=$(run_pair "REPEATABLE READ")
diag "second call, REPEATABLE READ: $got"
is "$(ndist)" 14 "the first call distributed earmark"
# its snapshot is older than the first call's commit: it must not go on to
# distribute the tables again ("already distributed"); refused instead
is "$(echo "$got" | head -1)" "ERROR:  earmark_distribute must run in a READ COMMITTED transaction" \
   "a second call at REPEATABLE READ (its snapshot taken before its wait) is refused, not run on a stale snapshot"
got=$(ct_sql 0 -q -A -t -c "BEGIN ISOLATION LEVEL SERIALIZABLE" -c "SELECT count(*) FROM earmark_distribute()" -c "COMMIT" 2>&1 | head -1)
is "$got" "ERROR:  earmark_distribute must run in a READ COMMITTED transaction" "... and so is one at SERIALIZABLE"

ct_sql 0 -q -c "DROP EXTENSION earmark CASCADE" -c "CREATE EXTENSION earmark" >/dev/null 2>&1
is "$(ndist)" 0 "earmark dropped and created again, not distributed"
got=$(run_pair "READ COMMITTED")
diag "second call, READ COMMITTED: $got"
is "$(echo "$got" | head -1)" 0 "a second call at READ COMMITTED that waited for the first returns no rows"
done_testing
