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
# One error is allowed, and only on a worker node: a pass of that node's
# worker that began before the distribution committed there (its check
# found earmark not distributed) and ran a statement after it, which Citus
# then refuses to plan ("cannot perform distributed planning ... for SQL
# functions referencing distributed tables").  The pass rolls back; the
# node's next passes find earmark distributed and do nothing.  The
# distribution lock does not reach a worker node's worker (docs/api.md,
# Known issues).
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55850 bash test/citus/review_distribute_worker_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
HOLD=${HOLD:-em_inbox_claim}
GDB=1 WORK_NAME=distribute-worker-node ct_begin_cluster "earmark.sweep_interval = '100ms'"

ct_sql 0 -q -c "CREATE EXTENSION earmark" >/dev/null
ok $? "CREATE EXTENSION earmark on the coordinator (propagated to the workers)"

w1=$(ct_worker_pid 1)
ok "$([ -n "$w1" ]; echo $?)" "worker node 1's earmark worker runs (pid $w1)"

ct_meanwhile m <<EOF
ct_distribute_bg dw_distribute
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

is "$(ct_distribute_end)" "t " "earmark_distribute() finishes without an error once the pass ends"
is "$(ct_logged deadlock)" 0 "no node logged a deadlock"
is "$(ct_val 0 "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'earmark.%'")" 14 \
   "earmark's 14 tables are distributed"
is "$(ct_val 1 "SELECT count(*) FROM ONLY earmark.reporter_state")" 0 "node 1's own reporter_state was emptied"
is "$(ct_logged "ERROR" 0)" 0 "the coordinator logged no error"
straddled='earmark worker ERROR:  cannot perform distributed planning on this query because parameterized queries for SQL functions referencing distributed tables are not supported'
is "$(( $(ct_logged ERROR "1 2") - $(ct_logged "$straddled" "1 2" 2>/dev/null) ))" 0 \
   "the workers logged no error but a worker's pass that straddled the distribution's commit"

done_testing
