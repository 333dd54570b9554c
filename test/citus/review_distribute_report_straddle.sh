#!/usr/bin/env bash
# test/citus/review_distribute_report_straddle.sh: a
# report pass of the coordinator's worker is two transactions (claim,
# finish) with the send between them; the distribution lock orders each
# transaction with earmark_distribute(), not the pass "whole".  gdb holds
# the worker between its claim's commit and its finish (run_pass of
# report_finish_fn), earmark_distribute() runs to its end meanwhile, then
# the finish runs on the distributed install with what the single-node
# claim read (TAP).
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55870 bash test/citus/review_distribute_report_straddle.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
GDB=1 WORK_NAME=distribute-report ct_begin_cluster "earmark.report_interval = '2s'" "earmark.sweep_interval = '100ms'"

ct_sql 0 -q -c "CREATE EXTENSION earmark" -c "SET earmark.rate_limit = 0" \
    -c "SELECT earmark_set_account('rs')" -c "SELECT earmark_set_limit('rs', 1000, 'm')" >/dev/null
ok $? "an account with a limit, not distributed yet"
wpid=$(ct_worker_pid 0)

ct_meanwhile m <<EOF
ct_val 0 "SELECT count(*) FROM earmark.meter_mark" >'$WX/marks.before'
timeout 120 env PGAPPNAME=rs_distribute "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h '$CT_BASE/n0/sock' -p $CT_PORT -U postgres -d $CT_DB \
    -c "SELECT count(*) > 0 FROM earmark_distribute()" >'$WX/dist.out' 2>'$WX/dist.err'
echo \$? >'$WX/dist.rc'
EOF
gdb_hold "$wpid" "$WX/m.sh" "run_pass if fn == report_finish_fn && ((ReportPass *) arg)->n > 0" bt
gdb_armed
ct_sql 0 -q -c "SET earmark.rate_limit = 0" -c "SELECT earmark_record_usage('rs', 7, 'm', 'u1')" >/dev/null
ok $? "usage of 7 on rs (a marked cycle), once gdb waits for the finish of a report pass that claimed it"
gdb_held "report_finish_fn"
ok $? "gdb held the worker between its report claim and its finish"
is "$(cat "$WX/marks.before")" 1 "... with the cycle's mark claimed (one mark)"
is "$(cat "$WX/dist.rc") $(cat "$WX/dist.out") $(cat "$WX/dist.err")" "0 t " \
   "earmark_distribute() ran to its end meanwhile (the worker held no distribution lock)"
sleep 5
grep -h "ERROR\|WARNING" "$CT_BASE"/n*/server.log | sed 's/^/# /'
is "$(grep -h "earmark worker" "$CT_BASE"/n0/server.log | grep -c "ERROR")" 0 "the worker's finish after the distribution logged no error"
is "$(ct_wait 20 0 "SELECT count(*) FROM earmark.meter_mark" 0)" 0 "the mark is gone (the total reported)"
is "$(ct_val 0 "SELECT string_agg(account || ' ' || total || ' ' || writes, ', ') FROM earmark.local_meter")" "rs 7 1" \
   "the meter holds the cycle's total once"
done_testing
