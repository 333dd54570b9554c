#!/usr/bin/env bash
# test/citus/escrow_settle.sh: the settle of a job taken from an escrow
# slot on Citus (TAP), where settle_target (gate.c) locks by SQL
# (lock_job_status, lock_budget_row) instead of em_direct_lock, and the
# first write leaves a slot job unmatched (settle_job's $6) for
# settle_unmatched to read.  test/citus/earmark.sh has no escrow account.
#
#   1. a fast-path job settled into a free slot of its generation
#   2. a settle that waits for the job row (an open charge on it)
#   3. a settle that waits for the job row while another settle of it is
#      open: it answers the status that settle left, charges nothing
#   4. a job of an old generation (the limit changed and a slow path cut
#      the slot again): no slot of its generation, so the budget row
#   5. earmark_settle_many with the same slot job twice
#   6. earmark_check() clean, the slots' allocation unchanged
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55595 bash test/citus/escrow_settle.sh

source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin

group_of() {
    ct_val 0 "SELECT p.groupid FROM pg_dist_placement p
               WHERE p.shardid = get_shard_id_for_distribution_column('earmark.account', '$1')"
}
A=
for i in '' $(seq 1 60); do
    c=acme${i:+-$i}
    [ "$(group_of "$c")" = 1 ] && { A=$c; break; }
done
ok "$([ -n "$A" ]; echo $?)" "an account on worker 1: $A"

ct_sql 0 -q -c "SELECT * FROM earmark_set_limit('$A', 1000)" -c "SELECT * FROM earmark_set_escrow('$A', 1)" >/dev/null
W=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$A', 1, 'warm-up')")
ct_sql 0 -q -c "SELECT * FROM earmark_settle('$A', $W, 0)" >/dev/null
ok $? "limit 1000, one escrow slot, a warm-up reserve and settle (the first rebalance)"
slots() { ct_val 0 "SELECT string_agg(slot || ':' || gen || ':' || (room + held + used), ' ' ORDER BY slot) FROM earmark.budget_slot WHERE account = '$A'"; }
alloc0=$(slots)
diag "slots (slot:gen:allocation): $alloc0"

# 1.
J1=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$A', 10, 'k1')")
is "$(ct_val 0 "SELECT slot IS NOT NULL AND gen IS NOT NULL FROM earmark.job WHERE account = '$A' AND job_id = $J1")" t \
   "1. k1 was admitted from the slot (job.slot and job.gen set)"
is "$(ct_val 0 "SELECT charged || ' ' || released || ' ' || status FROM earmark_settle('$A', $J1, 4)")" "4 6 completed" \
   "  ... its settle: charged 4, released 6"
is "$(ct_val 0 "SELECT sum(used) || ' ' || sum(held) FROM earmark.budget_slot WHERE account = '$A'")" "4 0" \
   "  ... into the slot (slot used 4, held 0)"

# 2.
J2=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$A', 10, 'k2')")
PGAPPNAME=es_open ct_sql 0 -A -t -q -c "BEGIN" -c "SELECT charged FROM earmark_charge('$A', $J2, 3)" -c "SELECT pg_sleep(3)" -c "COMMIT" >/tmp/review_slot_settle.$$ 2>&1 &
bg=$!
# the charge is done and its transaction open (waited for, not slept: a
# session that starts late would let the settle go first)
open_wait() {
    ct_wait 60 0 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'es_open' AND query = 'SELECT pg_sleep(3)'" 1 >/dev/null
}
open_wait
t0=$(date +%s%N)
got=$(ct_val 0 "SELECT charged || ' ' || released || ' ' || status FROM earmark_settle('$A', $J2)" 2>&1)
t1=$(date +%s%N)
wait $bg
is "$got" "3 7 completed" "2. a settle of k2 while a charge of 3 is open: it waits, then settles at the charge (3, 7)"
ok "$([ $(( (t1 - t0) / 1000000 )) -ge 800 ]; echo $?)" "  ... it waited for the charge ($(( (t1 - t0) / 1000000 )) ms)"

# 3.
J3=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$A', 10, 'k3')")
PGAPPNAME=es_open ct_sql 0 -A -t -q -c "BEGIN" -c "SELECT status FROM earmark_settle('$A', $J3, 5)" -c "SELECT pg_sleep(3)" -c "COMMIT" >/tmp/review_slot_settle.$$ 2>&1 &
bg=$!
open_wait
got=$(ct_val 0 "SELECT charged || ' ' || released || ' ' || status FROM earmark_settle('$A', $J3, 9, 'failed')" 2>&1)
wait $bg
is "$got" "0 0 completed" "3. a settle of k3 while another settle of it is open: it answers that settle's status, charges nothing"
is "$(ct_val 0 "SELECT charged || ' ' || status FROM earmark.job WHERE account = '$A' AND job_id = $J3")" "5 completed" \
   "  ... k3 charged 5 once"

# 4.
J4=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$A', 10, 'k4')")
g4=$(ct_val 0 "SELECT gen FROM earmark.job WHERE account = '$A' AND job_id = $J4")
ct_sql 0 -q -c "SELECT * FROM earmark_set_limit('$A', 2000)" >/dev/null
big=$(ct_val 0 "SELECT admitted FROM earmark_reserve('$A', 900, 'big')")
g=$(ct_val 0 "SELECT string_agg(DISTINCT gen::text, ',') FROM earmark.budget_slot WHERE account = '$A'")
is "$big|$g" "t|$((g4 + 1))" "4. a new limit and a slow path: the slot is cut again in generation $((g4 + 1)) (k4's is $g4)"
is "$(ct_val 0 "SELECT charged || ' ' || released || ' ' || status FROM earmark_settle('$A', $J4, 2)")" "2 8 completed" \
   "  ... k4's settle: no slot of its generation, into the budget row (2, 8)"
is "$(ct_val 0 "SELECT used FROM earmark.budget WHERE account = '$A'")" 2 "  ... the budget row's used is 2"

# 5.
J5=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$A', 10, 'k5')")
is "$(ct_val 0 "SELECT string_agg(charged || ' ' || released || ' ' || status, ', ' ORDER BY ord) FROM earmark_settle_many('$A', ARRAY[$J5, $J5]::bigint[], ARRAY[1, 7]::bigint[])")" \
   "1 9 completed, 0 0 completed" "5. earmark_settle_many with k5 twice: the second settles nothing"

# 6.
JB=$(ct_val 0 "SELECT job_id FROM earmark.job WHERE account = '$A' AND idempotency_key = 'big'")
ct_val 0 "SELECT status FROM earmark_settle('$A', $JB, 0)" >/dev/null
is "$(ct_val 0 "SELECT count(*) FROM earmark_check()")" 0 "6. earmark_check(): no violation"
is "$(ct_val 0 "SELECT used || ' ' || held FROM earmark_budget('$A')")" "15 0" \
   "  ... used 15 (4 + 3 + 5 + 2 + 1), held 0"
rm -f /tmp/review_slot_settle.$$
done_testing
