#!/usr/bin/env bash
# test/citus/review_worker_added_late.sh: an earmark worker that started on a
# node before citus_add_node gave the node its group idles from its next
# pass, without a restart; and after the distribution exactly one worker of
# the cluster works, the coordinator's (TAP).
#
# node_works (src/worker.c) reads pg_dist_local_group every pass, not the
# group em_node_group() cached in the worker's backend: a node has group 0
# until citus_add_node sets it, and the worker's backend lives across that.
# review_distribute_worker_node.sh cannot see the difference, as its nodes
# are added before earmark exists, so every worker's first read already
# finds the group.  Here node 3 is a Citus node of its own (group 0) with
# earmark created on it, whose worker works there; then it is added.
#
# Checked: node 3's worker sweeps a dead hold while the node is out of the
# cluster and does not log that it idles; after citus_add_node the same
# worker (same pid) logs once that it idles and a dead hold on node 3's own
# tables stays open; after earmark_distribute(), with the coordinator's
# worker held off (earmark.sweep_interval 1h there), a dead hold stays open
# (no worker node sweeps the cluster), and is swept once the coordinator's
# worker runs again; no node logs an error.  Then, on node 1, a session
# whose first read of the group fails reads it again (em_read_node_group
# caches only a group it read); and node 3's worker logs when its group
# goes back to 0.
#
# Fails with node_works reading the cached em_node_group() (checks 10, 12,
# 18, 19: node 3's worker keeps group 0, sweeps its own tables after the
# add, and after the distribution takes itself for the coordinator and
# fails every pass with 0A000) and with node_works of bd2f0a7^ (10, 12, 18);
# check 21 fails when em_read_node_group caches group 0 before its read.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55850 bash test/citus/review_worker_added_late.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
conf=("earmark.sweep_interval = '100ms'")
WORK_NAME=worker-added-late ct_begin_cluster "${conf[@]}"

# node 3: initialized like the others (ct_start's lines), started, Citus
# created, but not added: a Citus node of its own, group 0
ct_ports_free "$(ct_port 3)" 1 || { echo "Bail out! port $(ct_port 3) is taken"; exit 1; }
CT_WORKERS=3   # ct_stop and ct_logged take node 3 in from here
ct_init_node 3 "earmark.database = '$CT_DB'" "earmark.report_interval = '1h'" "${conf[@]}" &&
    ct_start_node 3 && ct_sql 3 -q -c "CREATE EXTENSION citus"
ok $? "node 3 runs Citus, not added to the cluster"
is "$(ct_val 3 "SELECT groupid FROM pg_dist_local_group")" 0 "node 3's group is 0"

ct_sql 0 -q -c "CREATE EXTENSION earmark" >/dev/null
ok $? "CREATE EXTENSION earmark on the coordinator (propagated to workers 1 and 2)"
ct_sql 3 -q -c "CREATE EXTENSION earmark" >/dev/null
ok $? "CREATE EXTENSION earmark on node 3"
w3=$(ct_worker_pid 3)
ok "$([ -n "$w3" ]; echo $?)" "node 3's earmark worker runs (pid $w3)"

# a hold whose lease passes in 1 s
hold() {
    ct_sql "$1" -q -A -t -c "SET earmark.rate_limit = 0" \
        -c "SELECT earmark_set_account('$2')" -c "SELECT earmark_set_limit('$2', 100, 'm')" \
        -c "SELECT admitted FROM earmark_reserve('$2', 10, '$3', 'm', '1 second')" 2>&1 | tail -n 1
}
status() { ct_val "$1" "SELECT status FROM earmark.job WHERE idempotency_key = '$2'"; }
empty() {
    ct_sql "$1" -q -c "DO \$\$ BEGIN EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%I.%I', schemaname, tablename), ', ')
                                               FROM pg_tables WHERE schemaname = 'earmark') || ' CASCADE'; END \$\$" >/dev/null
}
idles='earmark worker idles: database "postgres" is on a worker node (group'

is "$(hold 3 a3 k1)" t "a hold with a 1 s lease on node 3, out of the cluster"
is "$(ct_wait 30 3 "SELECT status FROM earmark.job WHERE idempotency_key = 'k1'" expired)" expired \
   "node 3's worker sweeps it: a node with Citus and group 0 works"
is "$(ct_logged "$idles" 3 2>/dev/null)" 0 "node 3's worker has not logged that it idles"

empty 3
ct_sql 0 -q -A -t -c "SELECT citus_add_node('127.0.0.1', $(ct_port 3))" >/dev/null
ok $? "citus_add_node adds node 3, whose earmark worker runs"
deadline=$(wait_deadline 30)
until [ "$(ct_logged "$idles" 3 2>/dev/null)" -ge 1 ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.2; done
is "$(ct_logged "$idles" 3 2>/dev/null)" 1 "node 3's worker logs once that it idles, from its next pass"
is "$(hold 3 b3 k2)" t "a hold with a 1 s lease on node 3's own tables, after the add"
sleep 3
is "$(status 3 k2)" running "thirty sweep intervals after its lease: still running, node 3's worker did no sweep"
is "$(ct_val 3 "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'")" "$w3" \
   "it is the worker that started before the add (no restart)"

empty 3
empty 0
is "$(ct_val 0 "SELECT count(*) > 0 FROM earmark_distribute()")" t "earmark_distribute() over three workers"

# the coordinator's worker held off: only a worker node's pass could sweep now
ct_sql 0 -q -c "ALTER SYSTEM SET earmark.sweep_interval = '1h'" -c "SELECT pg_reload_conf()" >/dev/null
sleep 1
is "$(hold 0 c3 k3)" t "a hold with a 1 s lease on the distributed tables, the coordinator's worker held off"
sleep 3
is "$(status 0 k3)" running "thirty worker-node sweep intervals after its lease: still running, no worker node swept the cluster"
ct_sql 0 -q -c "ALTER SYSTEM RESET earmark.sweep_interval" -c "SELECT pg_reload_conf()" >/dev/null
is "$(ct_wait 30 0 "SELECT status FROM earmark.job WHERE idempotency_key = 'k3'" expired)" expired \
   "the coordinator's worker sweeps it once it runs again"
is "$(ct_logged "$idles" "1 2 3" 2>/dev/null)" 3 "each worker node's worker logged its idling once"
is "$(ct_logged ERROR)" 0 "no node logged an error"

# A session on node 1 (group 1) whose first read of the group fails (a
# statement timeout while pg_dist_local_group is locked) reads it again at
# its next id: a failed read leaves no group 0 in the backend's cache,
# which would give ids without the node's bits (errors logged from here)
lockq="SELECT FROM pg_locks WHERE relation = 'pg_catalog.pg_dist_local_group'::regclass AND mode = 'AccessExclusiveLock' AND granted"
# the sequence below this node's range (as before its first id), so that
# only the group the call reads can put the node's bits in
ct_sql 1 -q -c "SELECT setval('earmark.job_id_seq', 1)" >/dev/null
# the session: Citus's caches warmed first, then its first id while the lock is held, then one after
PGAPPNAME=next_id ct_sql 1 -v ON_ERROR_STOP=0 -q -A -t -c "SELECT count(*) FROM earmark.account" \
    -c "DO \$\$ BEGIN WHILE NOT EXISTS ($lockq) LOOP PERFORM pg_sleep(0.05); END LOOP; END \$\$" \
    -c "SET statement_timeout = 500" -c "SELECT earmark.next_id('earmark.job_id_seq')" -c "SET statement_timeout = 0" \
    -c "DO \$\$ BEGIN WHILE EXISTS ($lockq) LOOP PERFORM pg_sleep(0.05); END LOOP; END \$\$" \
    -c "SELECT earmark.next_id('earmark.job_id_seq') >> 48" >"$WX/next_id.out" 2>"$WX/next_id.err" &
session=$!
ct_wait 30 1 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'next_id' AND query LIKE 'DO%'" 1 >/dev/null
ct_sql 1 -q -c "BEGIN" -c "LOCK pg_catalog.pg_dist_local_group IN ACCESS EXCLUSIVE MODE" \
    -c "SELECT pg_sleep(2)" -c "COMMIT" >/dev/null 2>&1
wait "$session"
got=$(tail -n 1 "$WX/next_id.out")
diag "the first id: $(tr '\n' ' ' <"$WX/next_id.err")"
grep -q "statement timeout" "$WX/next_id.err"
ok $? "node 1: a session's first earmark.next_id timed out on its read of the group"
is "$got" 1 "... and its next id carries group 1 in its top bits"

# node 3's group back to 0, as a removal may leave it (its metadata kept):
# its worker says so, with the hint to drop earmark there
ct_sql 3 -q -c "UPDATE pg_catalog.pg_dist_local_group SET groupid = 0" >/dev/null
again='earmark worker works again: database "postgres" is no longer on a worker node'
deadline=$(wait_deadline 30)
until [ "$(ct_logged "$again" 3 2>/dev/null)" -ge 1 ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.2; done
is "$(ct_logged "$again" 3 2>/dev/null)" 1 "node 3's worker logs once that it works again when its group is 0"

done_testing
