#!/usr/bin/env bash
# test/citus/distribute_pass.sh: earmark_distribute() and a pass of the
# coordinator's earmark worker are ordered, never deadlocked (TAP).
#
# Before earmark is distributed, the coordinator's worker sweeps its
# tables as on one node.  earmark_distribute() is one transaction: it
# distributes each table (create_distributed_table keeps it locked against
# writes until the end) and then empties the coordinator's own copies,
# which needs each table alone (truncate_local_data_after_distributing_table,
# ACCESS EXCLUSIVE).  A sweep that has read the job and budget tables and
# then locks a budget row waited for the distribution while the
# distribution waited for it: Citus or PostgreSQL cancelled one of them
# with 40P01 (seen once in ct_begin, where a worker pass can run).
#
# Here gdb holds the coordinator's worker in a sweep, after its read of the
# dead holds and before its lock of the budget row
# (em_direct_lock_skip_all), while earmark_distribute() starts and waits;
# then lets the sweep go on.  Both must finish without an error: the
# distribution waits for the pass's transaction to end (earmark's
# distribution lock, taken first by each), and the hold is swept.
#
# Needs gdb and root (ptrace); skips without them.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55930 bash test/citus/distribute_pass.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
GDB=1 WORK_NAME=distribute-pass ct_begin_cluster "earmark.sweep_interval = '100ms'"

ct_sql 0 -q -c "CREATE EXTENSION earmark" \
    -c "SET earmark.rate_limit = 0" \
    -c "SELECT earmark_set_account('dp')" -c "SELECT earmark_set_limit('dp', 100, 'm')" >/dev/null
ok $? "CREATE EXTENSION earmark on the coordinator, an account with a limit (not distributed yet)"

wpid=$(ct_worker_pid 0)
ok "$([ -n "$wpid" ]; echo $?)" "the coordinator's earmark worker runs (pid $wpid)"

# while the sweep is held: earmark_distribute() in the background, until it
# waits for a lock (or 30 s)
ct_meanwhile m <<EOF
ct_distribute_bg dp_distribute
ct_wait 30 0 "SELECT count(*) FROM pg_stat_activity
              WHERE application_name = 'dp_distribute' AND wait_event_type = 'Lock'" 1 >/dev/null
ct_val 0 "SELECT string_agg(l.locktype || coalesce(' ' || l.relation::regclass::text, ''), ', ')
          FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE a.application_name = 'dp_distribute' AND NOT l.granted" >'$WX/dist.waits'
EOF
gdb_hold "$wpid" "$WX/m.sh" em_direct_lock_skip_all bt
# a hold whose lease passes as gdb waits for the sweep: its 2 s start once
# gdb has attached (an attach slower than the lease missed the sweep)
gdb_armed
ok $? "gdb attached to the worker and set its breakpoint"
got=$(ct_sql 0 -q -A -t -c "SET earmark.rate_limit = 0" \
    -c "SELECT admitted FROM earmark_reserve('dp', 10, 'k1', 'm', '2 seconds')")
is "$got" t "a hold of 10 on dp whose lease passes in 2 s"
gdb_held "in lock_sweep_budget" && [ -f "$WX/m.done" ]
ok $? "gdb held the worker's sweep in its lock of the budget row while earmark_distribute() started"
diag "earmark_distribute() waited for: $(cat "$WX/dist.waits" 2>/dev/null)"

# the distribution goes on once the pass has ended
is "$(ct_distribute_end)" "t " "earmark_distribute() finishes without an error"
is "$(ct_logged deadlock)" 0 "no node logged a deadlock"
is "$(ct_val 0 "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'earmark.%'")" 14 \
   "earmark's 14 tables are distributed"
got=$(ct_wait 60 0 "SELECT status FROM earmark.job WHERE account = 'dp' AND idempotency_key = 'k1'" expired)
is "$got" expired "the dead hold is swept"
is "$(ct_val 0 "SELECT held FROM earmark_budget('dp', 'm')")" 0 "... and its budget holds nothing"
is "$(ct_logged ERROR 0)" 0 "the coordinator logged no error"

done_testing
