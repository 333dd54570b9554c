#!/usr/bin/env bash
# test/citus/report_isolation.sh: a worker node whose
# default_transaction_isolation is repeatable read holds up no report of
# the accounts on the other nodes (TAP).  earmark.report_cycle runs there
# at the node's default (Citus sends the worker's call on its own).
#
# Account "bee" lives on the node at repeatable read, account "ant" on the
# other worker.  bee's cycle is marked first, so every claim takes it
# before ant's.  What must hold: ant's total reaches the meter, also when
# one pass claims one cycle (earmark.report_batch = 1: bee's is the oldest
# mark), and ant's marks are gone; bee's cycle is never cleared unreported,
# and is reported once its node is at read committed again at the latest.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55930 bash test/citus/report_isolation.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin

node_of() {
    ct_val 0 "SELECT nodeport FROM pg_dist_shard_placement
              WHERE shardid = get_shard_id_for_distribution_column('earmark.account', '$1')"
}
# two account names, one on each worker
ant=; bee=
for i in $(seq 1 40); do
    p=$(node_of "acct$i")
    [ -z "$ant" ] && [ "$p" = "$(ct_port 1)" ] && ant=acct$i
    [ -z "$bee" ] && [ "$p" = "$(ct_port 2)" ] && bee=acct$i
done
ok "$([ -n "$ant" ] && [ -n "$bee" ]; echo $?)" "an account on each worker: $ant on worker 1, $bee on worker 2"

for a in "$bee" "$ant"; do
    ct_sql 0 -q -c "SELECT earmark_set_account('$a', now() - interval '14 days')" \
                -c "SELECT earmark_set_limit('$a', 1000)" >/dev/null
done
ct_sql 0 -q -c "SELECT earmark_record_usage('$bee', 10, 'b-1')" >/dev/null
sleep 0.2
ct_sql 0 -q -c "SELECT earmark_record_usage('$ant', 20, 'a-1')" >/dev/null
is "$(ct_val 0 "SELECT string_agg(account, ',' ORDER BY marked_at) FROM earmark.meter_mark")" "$bee,$ant" \
   "$bee's cycle is marked before $ant's"

# worker 2 (bee's node) at repeatable read; the coordinator and worker 1 stay at read committed
ct_sql 2 -q -c "ALTER SYSTEM SET default_transaction_isolation = 'repeatable read'" \
            -c "SELECT pg_reload_conf()" >/dev/null
# one cycle a pass: every claim takes bee's cycle, the oldest mark
ct_sql 0 -q -c "ALTER SYSTEM SET earmark.report_interval = '1s'" -c "ALTER SYSTEM SET earmark.report_batch = 1" \
            -c "SELECT pg_reload_conf()" >/dev/null
got=$(ct_wait 15 0 "SELECT coalesce((SELECT total FROM earmark.local_meter WHERE account = '$ant'), -1)" 20)
is "$got" 20 "with earmark.report_batch = 1, $ant's total still reaches the meter (a refused cycle does not hold the claim)"
ct_sql 0 -q -c "ALTER SYSTEM RESET earmark.report_batch" -c "SELECT pg_reload_conf()" >/dev/null
got=$(ct_wait 30 0 "SELECT coalesce((SELECT total FROM earmark.local_meter WHERE account = '$ant'), -1) || ' '
                    || (SELECT count(*) FROM earmark.meter_mark WHERE account = '$ant')" "20 0")
is "$got" "20 0" "$ant's total (node at read committed) reaches the meter and its marks are gone"
# bee's cycle: still marked, or reported (never cleared unreported)
got=$(ct_val 0 "SELECT (SELECT count(*) FROM earmark.meter_mark WHERE account = '$bee') > 0
                       OR coalesce((SELECT total FROM earmark.local_meter WHERE account = '$bee'), -1) = 10")
is "$got" t "$bee's cycle (node at repeatable read) is still marked or its total 10 is in the meter"

# read committed again: bee is reported too
ct_sql 2 -q -c "ALTER SYSTEM RESET default_transaction_isolation" -c "SELECT pg_reload_conf()" >/dev/null
got=$(ct_wait 30 0 "SELECT coalesce((SELECT total FROM earmark.local_meter WHERE account = '$bee'), -1) || ' '
                    || (SELECT count(*) FROM earmark.meter_mark)" "10 0")
is "$got" "10 0" "with worker 2 at read committed again, $bee's total 10 reaches the meter and no mark is left"

done_testing
