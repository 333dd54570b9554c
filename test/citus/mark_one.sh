#!/usr/bin/env bash
# test/citus/mark_one.sh: on Citus, a report pass whose send fails
# leaves the cycle one mark (one_mark, src/meter.c, run on the account's
# node by earmark.report_cycle), then sends it once the provider answers
# (TAP).
#
# On Citus a writer under REPEATABLE READ inserts its mark without a check
# (em_mark_cycle), so three such transactions leave three marks of one
# cycle.  A pass with a provider that cannot be reached (earmark.provider
# 'http' with no earmark.provider_url) fails the send: finish_cycle, with
# the cycle's mark lock, makes its marks one at the back (one_mark).  What must hold: one mark left, moved
# behind (marked_at later than before), and with the local provider again
# the next pass sends the total and deletes it.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55930 bash test/citus/mark_one.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin

ct_sql 0 -q -c "SELECT earmark_set_account('acme', now() - interval '14 days')" \
            -c "SELECT earmark_set_limit('acme', 1000)" >/dev/null
for k in 1 2 3; do
    ct_sql 0 -q -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
                -c "SELECT earmark_record_usage('acme', 10, 'u-$k')" -c "COMMIT" >/dev/null
done
is "$(ct_val 0 "SELECT count(*) || ' ' || count(DISTINCT marked_at) FROM earmark.meter_mark WHERE account = 'acme'")" "3 3" \
   "three REPEATABLE READ writers of acme's cycle: three marks"
before=$(ct_val 0 "SELECT max(marked_at) FROM earmark.meter_mark WHERE account = 'acme'")

# a provider that cannot be reached: every send fails
ct_sql 0 -q -c "ALTER SYSTEM SET earmark.provider = 'http'" -c "ALTER SYSTEM RESET earmark.provider_url" \
            -c "ALTER SYSTEM SET earmark.report_interval = '1s'" -c "SELECT pg_reload_conf()" >/dev/null
got=$(ct_wait 30 0 "SELECT last_report_failed >= 1 FROM earmark.worker_status" t)
ok $? "a pass with the provider unreachable fails acme's send ($(ct_val 0 "SELECT last_report_error FROM earmark.worker_status"))"
ct_sql 0 -q -c "ALTER SYSTEM SET earmark.report_interval = '1h'" -c "SELECT pg_reload_conf()" >/dev/null
sleep 1
is "$(ct_val 0 "SELECT count(*) FROM earmark.meter_mark WHERE account = 'acme'")" 1 \
   "... the failed pass leaves acme's cycle one mark (one_mark on the account's node)"
is "$(ct_val 0 "SELECT bool_and(marked_at > '$before') FROM earmark.meter_mark WHERE account = 'acme'")" t \
   "... moved behind the others (requeue_mark)"
is "$(ct_val 0 "SELECT marked_cycles FROM earmark.worker_status")" 1 "... one marked cycle"

# the local provider again: the next pass sends 30 and clears the cycle
ct_sql 0 -q -c "ALTER SYSTEM RESET earmark.provider" -c "ALTER SYSTEM SET earmark.report_interval = '1s'" \
            -c "SELECT pg_reload_conf()" >/dev/null
got=$(ct_wait 30 0 "SELECT (SELECT count(*) FROM earmark.meter_mark) || ' ' || coalesce((SELECT total FROM earmark.local_meter WHERE account = 'acme'), -1)" "0 30")
is "$got" "0 30" "with the local provider, acme's total 30 reaches the meter and its marks are gone"

done_testing
