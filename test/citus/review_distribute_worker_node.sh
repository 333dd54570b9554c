#!/usr/bin/env bash
# test/citus/review_distribute_worker_node.sh: a *worker node's* earmark
# worker does no pass, before earmark_distribute() as after it (TAP).
#
# Only the coordinator's earmark worker works in a Citus cluster.  A worker
# node's own copies of earmark's tables hold nothing to do before the
# distribution (earmark_distribute() refuses rows in them), and a pass of
# a worker node's worker that straddled the distribution's commit there
# failed: it began with earmark not distributed and ran a statement after,
# which Citus refuses to plan ("cannot perform distributed planning ... for
# SQL functions referencing distributed tables"); the distribution lock
# orders only the coordinator's worker with the distribution.
#
# Checked: each worker node's worker logs that it idles, the coordinator's
# does not; a dead hold made on node 1's own tables before the distribution
# stays open there while the same hold on the coordinator is swept; the
# distribution runs while every worker passes each 100 ms and no node logs
# an error, before or after it.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55850 bash test/citus/review_distribute_worker_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
WORK_NAME=distribute-worker-node ct_begin_cluster "earmark.sweep_interval = '100ms'"

ct_sql 0 -q -c "CREATE EXTENSION earmark" >/dev/null
ok $? "CREATE EXTENSION earmark on the coordinator (propagated to the workers)"

w1=$(ct_worker_pid 1)
ok "$([ -n "$w1" ]; echo $?)" "worker node 1's earmark worker runs (pid $w1)"

idles='earmark worker idles: database "postgres" is on a worker node (group'
for n in 1 2; do
    deadline=$(wait_deadline 30)
    until [ "$(ct_logged "$idles" "$n" 2>/dev/null)" -ge 1 ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.2; done
    is "$(ct_logged "$idles" "$n" 2>/dev/null)" 1 "worker node $n's earmark worker logs once that it idles"
done
is "$(ct_logged "$idles" 0 2>/dev/null)" 0 "the coordinator's earmark worker does not"

# a hold whose lease passes in 1 s, on node 1's own tables and on the coordinator's
hold() {
    ct_sql "$1" -q -A -t -c "SET earmark.rate_limit = 0" \
        -c "SELECT earmark_set_account('wn')" -c "SELECT earmark_set_limit('wn', 100, 'm')" \
        -c "SELECT admitted FROM earmark_reserve('wn', 10, 'k1', 'm', '1 second')" 2>&1 | tail -n 1
}
is "$(hold 1)" t "a hold of 10 on node 1's own tables, its lease 1 s"
is "$(hold 0)" t "the same hold on the coordinator's"
got=$(ct_wait 30 0 "SELECT status FROM earmark.job WHERE account = 'wn' AND idempotency_key = 'k1'" expired)
is "$got" expired "the coordinator's worker sweeps its dead hold"
# thirty sweep intervals after its lease passed
sleep 3
is "$(ct_val 1 "SELECT status FROM earmark.job WHERE account = 'wn' AND idempotency_key = 'k1'")" running \
   "node 1's dead hold is still running: its node's worker did no sweep"

# earmark_distribute() wants the workers' copies empty
ct_sql 1 -q -c "DO \$\$ BEGIN EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%I.%I', schemaname, tablename), ', ')
                                       FROM pg_tables WHERE schemaname = 'earmark') || ' CASCADE'; END \$\$" >/dev/null
ok $? "node 1's copies emptied"
ct_sql 0 -q -c "DO \$\$ BEGIN EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%I.%I', schemaname, tablename), ', ')
                                       FROM pg_tables WHERE schemaname = 'earmark') || ' CASCADE'; END \$\$" >/dev/null
ok $? "and the coordinator's"

ct_distribute_bg dw_distribute
is "$(ct_distribute_end)" "t " "earmark_distribute() finishes without an error while every worker passes each 100 ms"
is "$(ct_val 0 "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'earmark.%'")" 14 \
   "earmark's 14 tables are distributed"
is "$(ct_val 1 "SELECT count(*) FROM ONLY earmark.reporter_state")" 0 "node 1's own reporter_state was emptied"

# the cluster's work after it: the coordinator's worker sweeps a hold on any node
is "$(hold 0)" t "a hold of 10 with a 1 s lease on the distributed tables"
got=$(ct_wait 30 0 "SELECT status FROM earmark.job WHERE account = 'wn' AND idempotency_key = 'k1'" expired)
is "$got" expired "it is swept"
is "$(ct_val 1 "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'")" "$w1" \
   "node 1's earmark worker is the one that started (it never exited)"
is "$(ct_logged "$idles" "1 2" 2>/dev/null)" 2 "... and the workers logged their idling once each"
is "$(ct_logged deadlock)" 0 "no node logged a deadlock"
is "$(ct_logged ERROR)" 0 "no node logged an error"

done_testing
