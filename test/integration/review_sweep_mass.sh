#!/usr/bin/env bash
# review (b73ac49): the sweep's expiries from C (budget.c expire_direct)
# at scale and under a crash.
# 1. 100,000 dead holds of one budget, swept by one earmark_sweep(100000)
#    in a transaction: all expired at their recorded use, the budget row
#    follows, the job indexes agree with the heap (amcheck heapallindexed:
#    every expired row out of job_open, every charged one in job_entry), and
#    the memory the transaction keeps after the call (TopTransactionContext
#    and its children) stays small.
# 2. kill -9 of a backend whose transaction's earmark_sweep() expired one
#    budget's 2,000 dead holds (written from C) and then waits for another
#    budget's row (the sweep itself never waits after its first budget, so
#    the wait is the transaction's next statement): after recovery nothing
#    of the expiry is there (jobs open, held as before), the indexes agree
#    with the heap, and a new sweep expires them all.
source "$(dirname "$0")/tap.sh"
DB=review_sweep_mass
P="q -d $DB"
q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
$P -c "CREATE EXTENSION earmark" -c "CREATE EXTENSION amcheck" \
   -c "SELECT earmark_set_limit('big', NULL)" -c "SET earmark.rate_limit = 0" \
   -c "SELECT count(*) FROM generate_series(1, 100000) i, earmark_reserve('big', 10, 'k-' || i) r WHERE r.admitted" \
   -c "SELECT count(*) FROM earmark.job j, earmark_charge('big', j.job_id, 3) c WHERE j.job_id % 3 = 0" \
   -c "UPDATE earmark.job SET lease_until = now() - interval '1 hour'" >/dev/null
ok $? "100,000 holds of 10 on account big, a third charged 3, all past their lease"

indexes_ok() {
    $P -c "SELECT count(*) FROM (SELECT bt_index_check(c.oid, true) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                                  WHERE i.indrelid = 'earmark.job'::regclass) s" 2>&1
}
out=$($P -c "BEGIN" -c "SELECT earmark_sweep(100000)" \
        -c "SELECT (sum(total_bytes) / 1024)::bigint FROM pg_backend_memory_contexts
             WHERE name = 'TopTransactionContext' OR parent = 'TopTransactionContext'" -c "COMMIT" 2>&1)
is "$(sed -n 1p <<<"$out")" 100000 "one earmark_sweep(100000) expires the 100,000"
kb=$(sed -n 2p <<<"$out")
diag "TopTransactionContext and children after the sweep: $kb kB"
ok "$(( ${kb:-999999} < 8192 ? 0 : 1 ))" "the transaction keeps under 8 MB after the sweep ($kb kB)"
is "$($P -c "SELECT count(*) FILTER (WHERE status = 'expired' AND charged = used AND released = amount - used),
                    sum(charged), count(*) FILTER (WHERE status IN ('running', 'capped'))
               FROM earmark.job")" "100000|99999|0" "each one expired at its use (33,333 charged 3)"
is "$($P -c "SELECT used || ' ' || held FROM earmark.budget WHERE account = 'big'")" "99999 0" \
   "the budget: used 99,999, held 0"
is "$(indexes_ok)" 4 "the job indexes agree with the heap (bt_index_check heapallindexed)"
is "$($P -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
          -c "SELECT count(*) FROM earmark.job WHERE account = 'big' AND status IN ('running', 'capped')")" 0 \
   "job_open returns no expired job"

# 2. crash
$P -c "SELECT earmark_set_limit('ca', NULL), earmark_set_limit('cb', NULL)" -c "SET earmark.rate_limit = 0" \
   -c "SELECT count(*) FROM generate_series(1, 2000) i, earmark_reserve('ca', 10, 'c-' || i) r" \
   -c "SELECT count(*) FROM earmark.job j, earmark_charge('ca', j.job_id, 4) c WHERE j.account = 'ca' AND j.job_id % 2 = 0" \
   -c "SELECT count(*) FROM earmark_reserve('cb', 10, 'd-1')" \
   -c "UPDATE earmark.job SET lease_until = now() - interval '2 hours' WHERE account = 'ca'" \
   >/dev/null
before=$($P -c "SELECT string_agg(account || ' ' || used || ' ' || held, ', ' ORDER BY account) FROM earmark.budget WHERE account IN ('ca', 'cb')")
PGAPPNAME=rsm_holder $P -c "BEGIN" -c "SELECT 1 FROM earmark.budget WHERE account = 'cb' FOR UPDATE" -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
HOLDER=$!
wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rsm_holder' AND query = 'SELECT pg_sleep(600)'" 1 >/dev/null
PGAPPNAME=rsm_victim $P -c "BEGIN" -c "SELECT earmark_sweep(100000)" \
    -c "SELECT 1 FROM earmark.budget WHERE account = 'cb' FOR UPDATE" -c "COMMIT" >/dev/null 2>&1 &
VICTIM=$!
wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rsm_victim' AND wait_event_type = 'Lock'" 1 >/dev/null
ok $? "the transaction swept ca's holds and waits for cb's budget row"
vpid=$($P -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'rsm_victim'")
as_root kill -9 "$vpid"
sleep 1
wait_for 120 "SELECT 1" 1 >/dev/null
ok $? "kill -9 of the sweeping backend; the cluster is back"
kill "$HOLDER" "$VICTIM" 2>/dev/null; wait "$HOLDER" "$VICTIM" 2>/dev/null
is "$(wait_for 30 "SELECT count(*) FROM earmark.job WHERE account = 'ca' AND status IN ('running', 'capped') AND settled_at IS NULL" 2000)" 2000 \
   "after recovery ca's 2,000 jobs are open, none half-expired"
is "$($P -c "SELECT string_agg(account || ' ' || used || ' ' || held, ', ' ORDER BY account) FROM earmark.budget WHERE account IN ('ca', 'cb')")" \
   "$before" "the budgets as before the sweep"
is "$(indexes_ok)" 4 "the job indexes agree with the heap after recovery"
is "$($P -c "SELECT earmark_sweep(100000)")" 2000 "a new sweep expires the 2,000"
is "$($P -c "SELECT string_agg(account || ' ' || used || ' ' || held, ', ' ORDER BY account) FROM earmark.budget WHERE account IN ('ca', 'cb')")" \
   "ca 4000 0, cb 0 10" "the budgets after it"
is "$(indexes_ok)" 4 "the job indexes agree with the heap"
q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
echo "1..$_tap_n"
[ "$_tap_failed" -eq 0 ]
