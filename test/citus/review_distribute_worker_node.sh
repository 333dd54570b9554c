#!/usr/bin/env bash
# test/citus/review_distribute_worker_node.sh: a pass
# of a *worker node's* earmark worker and earmark_distribute() on the
# coordinator (TAP).
#
# Before distribution the workers' earmark workers sweep, claim and report
# on their own copies of earmark's tables, and take only their own node's
# distribution lock, which no distribution takes.  earmark_distribute()
# ends with a TRUNCATE ONLY of the coordinator-only tables on each worker,
# over a connection of its own (run_command_on_workers), while it holds
# every lock of the distribution (and its coordinated transaction on that
# worker holds SHARE UPDATE EXCLUSIVE on the worker's copies of the
# distributed tables, citus_internal_add_*_metadata).
#
# gdb holds worker 1's earmark worker just after its inbox claim (its
# transaction holds locks on earmark.inbox_event and inbox_handler) while
# earmark_distribute() runs; then lets it go.  Expected: the distribution
# waits for that pass (its TRUNCATE on node 1), no deadlock and no error
# on any node, and it finishes once the pass ends.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55850 bash test/citus/review_distribute_worker_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_require_citus
source "$EM_ROOT/test/integration/tap.sh"
skip_unless_gdb
set +e
export PGOPTIONS="-c client_min_messages=warning"
CT_PRELOAD='citus,earmark'
HOLD=${HOLD:-em_inbox_claim}
ct_start "earmark.database = '$CT_DB'" "earmark.report_interval = '1h'" \
         "earmark.sweep_interval = '100ms'" \
    || { echo "Bail out! the Citus cluster did not start"; exit 1; }
work_dir distribute-worker-node
at_exit() { ct_stop; }

ct_sql 0 -q -c "CREATE EXTENSION earmark" >/dev/null
ok $? "CREATE EXTENSION earmark on the coordinator (propagated to the workers)"

w1=$(ct_wait 30 1 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker'" 1 >/dev/null &&
     ct_val 1 "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'")
ok "$([ -n "$w1" ]; echo $?)" "worker node 1's earmark worker runs (pid $w1)"

cat >"$WX/m.sh" <<EOF
source '$EM_ROOT/test/citus/cluster.sh'
CT_BASE='$CT_BASE' CT_PORT=$CT_PORT
PGAPPNAME=dw_distribute ct_sql 0 -q -A -t -c "SELECT count(*) > 0 FROM earmark_distribute()" \
    >'$WX/dist.out' 2>'$WX/dist.err' &
echo \$! >'$WX/dist.pid'
# until a backend on node 1 waits for a lock (the distribution's TRUNCATE), or 40 s
ct_wait 40 1 "SELECT count(*) > 0 FROM pg_stat_activity
              WHERE backend_type = 'client backend' AND wait_event_type = 'Lock'" t >/dev/null
ct_val 1 "SELECT string_agg(a.pid || ' ' || left(regexp_replace(a.query, '\s+', ' ', 'g'), 60) || ' waits ' ||
                            l.mode || ' on ' || coalesce(l.relation::regclass::text, l.locktype), '; ')
          FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE NOT l.granted" >'$WX/w1.waits'
ct_val 1 "SELECT string_agg(DISTINCT l.relation::regclass::text || ' ' || l.mode, ', ')
          FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.granted AND a.backend_type = 'client backend' AND l.relation::regclass::text LIKE 'earmark.%'
            AND l.mode NOT IN ('AccessShareLock')" >'$WX/w1.others'
ct_val 0 "SELECT wait_event_type || '/' || wait_event FROM pg_stat_activity WHERE backend_type = 'earmark worker'" >'$WX/w0.wait'
# long enough for PostgreSQL's (1 s) and Citus's (2 s) deadlock detection
sleep 6
kill -0 \$(cat '$WX/dist.pid') 2>/dev/null && echo running >'$WX/dist.state' || echo ended >'$WX/dist.state'
EOF
gdb_hold "$w1" "$WX/m.sh" "$HOLD" finish bt
gdb_held "$HOLD" && [ -s "$WX/dist.state" ]
ok $? "gdb held node 1's earmark worker after $HOLD while earmark_distribute() ran"
diag "node 1 waits: $(cat "$WX/w1.waits" 2>/dev/null)"
diag "node 1, strong locks of the distribution: $(cat "$WX/w1.others" 2>/dev/null)"
diag "the coordinator's worker: $(cat "$WX/w0.wait" 2>/dev/null)"
is "$(cat "$WX/dist.state")" running "earmark_distribute() was still running (waiting) 6 s into the hold"

dpid=$(cat "$WX/dist.pid" 2>/dev/null)
deadline=$(wait_deadline 120)
while kill -0 "$dpid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
is "$(cat "$WX/dist.out") $(cat "$WX/dist.err")" "t " "earmark_distribute() finishes without an error once the pass ends"
grep -h "deadlock" "$CT_BASE"/n*/server.log | sed 's/^/# /'
is "$(cat "$CT_BASE"/n*/server.log | grep -c deadlock)" 0 "no node logged a deadlock"
is "$(ct_val 0 "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'earmark.%'")" 14 \
   "earmark's 14 tables are distributed"
is "$(ct_val 1 "SELECT count(*) FROM ONLY earmark.reporter_state")" 0 "node 1's own reporter_state was emptied"
grep -h "ERROR" "$CT_BASE"/n*/server.log | sed 's/^/# /'
is "$(cat "$CT_BASE"/n*/server.log | grep -c ERROR)" 0 "no node logged an error"

done_testing
