#!/usr/bin/env bash
# The background worker: it sweeps expired holds on its own, follows
# earmark.sweep_interval on SIGHUP, comes back after SIGTERM and after
# kill -9 (with every committed hold, charge and settlement intact), and
# logs what it swept at DEBUG1; settings that a handler, the database or the
# role set (read-only, serializable, timeouts, search_path) do not change
# its transactions.  Without preload the functions still work.
source "$(dirname "$0")/tap.sh"
DB=postgres

# pass_lease JOB: the job's lease has passed (written into its row, so that
# no test waits for a lease, nor fails when the machine is slow)
pass_lease() {
    q -d "${2:-postgres}" -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $1" >/dev/null
}

worker_pid() { q -d postgres -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'"; }
# worker_setting NAME: the setting as the worker's own session has it (an
# inbox event whose handler the worker runs returns it; a reload wakes a
# worker that sleeps a long earmark.sweep_interval for it)
worker_setting() {
    local key="setting-$$-$RANDOM"
    q -d postgres >/dev/null <<'SQL'
CREATE OR REPLACE FUNCTION public.w_setting(e earmark.inbox_event) RETURNS text
    LANGUAGE sql AS $$SELECT pg_catalog.current_setting(e.payload ->> 'name')$$;
SELECT earmark_inbox_set_handler('w.setting', 'public.w_setting(earmark.inbox_event)');
SQL
    q -d postgres -c "SELECT earmark_inbox_receive('w', '$key', 'w.setting', jsonb_build_object('name', '$1'))" \
                 -c "SELECT pg_reload_conf()" >/dev/null
    wait_for 60 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = '$key'" applied >/dev/null
    q -d postgres -c "SELECT result FROM earmark.inbox_event WHERE dedupe_key = '$key'"
}
# worker_asleep: the worker waits on its latch between rounds (a wait of
# earmark.sweep_interval), not in the middle of a round
worker_asleep() {
    wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND wait_event = 'Extension'" 1 >/dev/null
}

q -d postgres -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
q -d postgres -c "TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget, earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE"
q -d postgres -c "SELECT earmark_set_limit('w', 100000)" >/dev/null

pid=$(wait_for 15 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND datname = 'postgres'" 1)
is "$pid" 1 "one earmark worker runs, connected to earmark.database"

# 1. the worker sweeps an expired hold without anybody calling earmark_sweep
job=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('w', 40000, 'gone', lease => '1 hour')")
q -d postgres -c "SELECT charged FROM earmark_charge('w', $job, 1234)" >/dev/null
pass_lease "$job"
got=$(wait_for 10 "SELECT status || ' ' || charged || ' ' || released FROM earmark.job WHERE job_id = $job" "expired 1234 38766")
is "$got" "expired 1234 38766" "the worker settled the dead hold as expired at its recorded use"
is "$(q -d postgres -c "SELECT used || '/' || held FROM earmark_budget('w')")" "1234/0" "the budget shows the use and no hold"
is "$(q -d postgres -c "SELECT status FROM earmark_settle('w', $job, 40000)")" "expired" "the late settle is ignored"
is "$(q -d postgres -c "SELECT sum(units) FROM earmark.ledger")" "1234" "one ledger row, at the recorded use"

# 2. SIGHUP: a new sweep interval is read on reload.  Waited for by states,
#    not time: the worker runs with the new setting (reload_conf, and its
#    own session shows it), then it sleeps between rounds; a lease passed
#    while it sleeps an hour is not swept until a reload wakes it.
reload_conf "ALTER SYSTEM SET earmark.sweep_interval = '1h'"
is "$(worker_setting earmark.sweep_interval)" 1h "after SIGHUP the worker's own session has sweep_interval = 1h"
worker_asleep
job=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('w', 10, 'slow', lease => '1 hour')")
pass_lease "$job"
is "$(q -d postgres -c "SELECT status FROM earmark.job WHERE job_id = $job")" "running" \
   "while the worker sleeps its hour it has not swept (the charge path still treats it as dead)"
is "$(q -d postgres -c "SELECT status FROM earmark_charge('w', $job, 1)")" "expired" "an unswept expired hold is dead for charge"
reload_conf "ALTER SYSTEM SET earmark.sweep_interval = '100ms'"
got=$(wait_for 10 "SELECT status FROM earmark.job WHERE job_id = $job" expired)
is "$got" expired "after SIGHUP with 100ms the worker sweeps it"

# 3. DEBUG1 log of what was swept (the worker runs with debug1 before the
#    hold's lease passes)
reload_conf "ALTER SYSTEM SET log_min_messages = 'debug1'"
job=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('w', 10, 'logged', lease => '1 hour')")
pass_lease "$job"
wait_for 10 "SELECT status FROM earmark.job WHERE job_id = $job" expired >/dev/null
logged=1
deadline=$(wait_deadline 20)
while [ "$(date +%s)" -lt "$deadline" ]; do
    grep -q "earmark: swept 1 expired holds" "$EM_BASE/server.log" && { logged=0; break; }
    sleep 0.2
done
reload_conf "ALTER SYSTEM RESET log_min_messages"
ok $logged "the worker logs what it swept at DEBUG1"

# 4. SIGTERM: the worker exits and the postmaster starts it again
old=$(worker_pid)
q -d postgres -c "SELECT pg_terminate_backend($old)" >/dev/null
new=$(wait_for 20 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND pid <> $old" 1)
is "$new" 1 "after SIGTERM the worker is restarted"

# 5. kill -9: the postmaster resets the cluster and starts the worker again;
#    nothing committed is lost and sweeping resumes
q -d postgres -c "SELECT earmark_set_limit('crash', 100000)" >/dev/null
for i in $(seq 1 20); do
    j=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('crash', 1000, 'c$i', lease => '1 hour')")
    q -d postgres -c "SELECT charged FROM earmark_charge('crash', $j, $i)" >/dev/null
    [ $((i % 2)) -eq 0 ] && q -d postgres -c "SELECT charged FROM earmark_settle('crash', $j)" >/dev/null
done
dead=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('crash', 5000, 'dies', lease => '1 hour')")
q -d postgres -c "SELECT charged FROM earmark_charge('crash', $dead, 77)" >/dev/null
before=$(q -d postgres -c "SELECT used || '/' || held FROM earmark_budget('crash')")
old=$(worker_pid)
kill -9 "$old"
# the postmaster resets the cluster: connections fail until crash recovery
# is done, which wait_for polls through
got=$(wait_for 120 "SELECT 1" 1)
is "$got" 1 "the server accepts connections again after the worker was killed with SIGKILL"
new=$(wait_for 120 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND pid <> $old" 1)
is "$new" 1 "the worker runs again after kill -9"
is "$(q -d postgres -c "SELECT count(*) || ' ' || count(*) FILTER (WHERE status = 'completed') FROM earmark.job WHERE account = 'crash' AND idempotency_key LIKE 'c%'")" \
   "20 10" "every committed reserve and settle survived the crash"
is "$before" "110/15000" "before the crash: 10 settled jobs used 110, 15000 held"
pass_lease "$dead"
got=$(wait_for 20 "SELECT status || ' ' || charged FROM earmark.job WHERE job_id = $dead" "expired 77")
is "$got" "expired 77" "the restarted worker sweeps a hold whose lease passed"
is "$(q -d postgres -c "SELECT used || '/' || held FROM earmark_budget('crash')")" "187/10000" \
   "after the sweep: used 110 + 77, held 15000 - 5000"

# 5b. the distribution lock (cluster.c): a transaction that holds it, as
#     earmark_distribute() does from its start, holds the worker's passes
#     until it ends (test/citus/distribute_pass.sh shows why); a role's own
#     advisory locks on the same first keys hold nothing up, and no role but
#     the superuser may take it
dl_waiting="SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
            WHERE a.backend_type = 'earmark worker' AND l.locktype = 'advisory'
              AND (l.classid, l.objid, l.objsubid) = (0, 0, 25956) AND NOT l.granted"
PGAPPNAME=dl_holder q -d postgres -c "BEGIN" -c "SELECT earmark.distribution_lock()" \
    -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
holder=$!
is "$(wait_for 20 "$dl_waiting" 1)" 1 "a transaction holds earmark.distribution_lock(): the worker's next pass waits for it"
is "$(q -d postgres -c "SELECT l.mode FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                        WHERE a.application_name = 'dl_holder' AND l.locktype = 'advisory'
                          AND (l.classid, l.objid, l.objsubid) = (0, 0, 25956) AND l.granted")" ExclusiveLock \
   "... which the transaction holds exclusive (objsubid 25956), the worker asks shared"
job=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('w', 10, 'distribution-held', lease => '1 hour')")
pass_lease "$job"
sleep 1
is "$(q -d postgres -c "SELECT status FROM earmark.job WHERE job_id = $job")" running \
   "... and does not sweep a dead hold meanwhile"
q -d postgres -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'dl_holder'" >/dev/null
wait "$holder"
got=$(wait_for 20 "SELECT status FROM earmark.job WHERE job_id = $job" expired)
is "$got" expired "once that transaction ends the worker sweeps it"
q -d postgres -c "SET client_min_messages = warning" -c "DROP ROLE IF EXISTS w_locker" -c "CREATE ROLE w_locker" \
    -c "GRANT USAGE ON SCHEMA earmark TO w_locker" >/dev/null
PGAPPNAME=dl_role q -d postgres -c "SET ROLE w_locker" -c "BEGIN" \
    -c "SELECT pg_advisory_lock(0), pg_advisory_lock(0, 0), pg_advisory_xact_lock(0), pg_advisory_xact_lock(0, 0)" \
    -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
holder=$!
wait_for 20 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dl_role' AND query = 'SELECT pg_sleep(600)'" 1 >/dev/null
job=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('w', 10, 'role-locks', lease => '1 hour')")
pass_lease "$job"
got=$(wait_for 20 "SELECT status FROM earmark.job WHERE job_id = $job" expired)
is "$got" expired "a role that holds the SQL advisory locks of keys 0 and (0, 0) holds the worker up not at all"
is "$(sqlstate "SET ROLE w_locker" "SELECT earmark.distribution_lock()" 2>&1 | grep -o '^42501\|permission denied for function distribution_lock' | sort -u | paste -sd'|')" \
   "42501|permission denied for function distribution_lock" \
   "... and may not take the distribution lock (42501), with USAGE on schema earmark"
q -d postgres -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'dl_role'" >/dev/null
wait "$holder"
q -d postgres -c "REVOKE USAGE ON SCHEMA earmark FROM w_locker" -c "DROP ROLE w_locker" >/dev/null

reload_conf "ALTER SYSTEM RESET earmark.sweep_interval"

# 6. settings of a session, the database or the role never reach the
#    worker's transactions: each one is READ COMMITTED and READ WRITE.
#    First a handler that sets read-only and serializable for its session
#    (set_config(..., false)), then the same and lock and statement timeouts
#    and a search_path set on the database and role for a restarted worker.
#    (This script's own sessions override them with PGOPTIONS.)
reset_db_settings() {
    PGOPTIONS="-c default_transaction_read_only=off" q -d postgres \
        -c "ALTER DATABASE postgres RESET ALL" -c "ALTER ROLE postgres IN DATABASE postgres RESET ALL" \
        -c "ALTER SYSTEM RESET earmark.report_interval" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
}
trap reset_db_settings EXIT
reload_conf "ALTER SYSTEM SET earmark.report_interval = '1s'"
q -d postgres >/dev/null <<'SQL'
DROP FUNCTION IF EXISTS public.w_sets_session(earmark.inbox_event);
CREATE FUNCTION public.w_sets_session(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('default_transaction_read_only', 'on', false);
    PERFORM set_config('default_transaction_isolation', 'serializable', false);
    PERFORM set_config('lock_timeout', '1ms', false);
    RETURN 'set';
END $$;
SELECT earmark_inbox_set_handler('w.sets_session', 'w_sets_session(earmark.inbox_event)');
SQL
key="sets-$$-$RANDOM"
q -d postgres -c "SELECT earmark_inbox_receive('w', '$key', 'w.sets_session', '{}')" >/dev/null
got=$(wait_for 15 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = '$key'" applied)
is "$got" applied "a handler that sets read-only and serializable for its session was applied"
job=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('w', 10, 'after-handler', lease => '1 hour')")
q -d postgres -c "SELECT charged FROM earmark_charge('w', $job, 3)" >/dev/null
pass_lease "$job"
got=$(wait_for 15 "SELECT status || ' ' || charged FROM earmark.job WHERE job_id = $job" "expired 3")
is "$got" "expired 3" "after that handler the worker still sweeps"
ledger_w() { q -d postgres -c "SELECT sum(l.units) FROM earmark.ledger l JOIN earmark.budget b USING (account, budget_id) WHERE b.account = 'w'"; }
q -d postgres -c "SELECT earmark_record_usage('w', 2, 'after-handler')" >/dev/null
got=$(wait_for 15 "SELECT total FROM earmark.local_meter WHERE account = 'w'" "$(ledger_w)")
is "$got" "$(ledger_w)" "... and reports the new total"

export PGOPTIONS="-c default_transaction_read_only=off -c default_transaction_isolation=read\\ committed -c lock_timeout=0 -c statement_timeout=0 -c search_path=public"
q -d postgres -c "ALTER DATABASE postgres SET default_transaction_read_only = on" \
  -c "ALTER DATABASE postgres SET default_transaction_isolation = 'serializable'" \
  -c "ALTER DATABASE postgres SET lock_timeout = '1ms'" -c "ALTER DATABASE postgres SET statement_timeout = '1ms'" \
  -c "ALTER ROLE postgres IN DATABASE postgres SET search_path = 'nowhere'" >/dev/null
old=$(worker_pid)
q -d postgres -c "SELECT pg_terminate_backend($old)" >/dev/null
new=$(wait_for 20 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND pid <> $old" 1)
is "$new" 1 "the worker restarted with the database's and role's settings"
is "$(PGOPTIONS= q -d postgres -c "SHOW default_transaction_read_only")" on "(a session without overrides is read-only by default)"
job=$(q -d postgres -c "SELECT job_id FROM earmark_reserve('w', 10, 'read-only-db', lease => '1 hour')")
q -d postgres -c "SELECT charged FROM earmark_charge('w', $job, 4)" >/dev/null
pass_lease "$job"
got=$(wait_for 15 "SELECT status || ' ' || charged FROM earmark.job WHERE job_id = $job" "expired 4")
is "$got" "expired 4" "with a read-only, serializable default the worker still sweeps an expired hold"
q -d postgres -c "SELECT earmark_record_usage('w', 6, 'read-only-db')" >/dev/null
got=$(wait_for 15 "SELECT total FROM earmark.local_meter WHERE account = 'w'" "$(ledger_w)")
is "$got" "$(ledger_w)" "... and reports the new total"
is "$(q -d postgres -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker'")" 1 "one worker, still running"
reset_db_settings
unset PGOPTIONS
old=$(worker_pid)
q -d postgres -c "SELECT pg_terminate_backend($old)" >/dev/null
wait_for 20 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND pid <> $old" 1 >/dev/null
q -d postgres -c "SELECT earmark_inbox_set_handler('w.sets_session', NULL)" -c "DROP FUNCTION public.w_sets_session(earmark.inbox_event)" \
  -c "SELECT earmark_inbox_set_handler('w.setting', NULL)" -c "DROP FUNCTION public.w_setting(earmark.inbox_event)" >/dev/null

# 7. without shared_preload_libraries CREATE EXTENSION warns, with the fix,
# and the functions still work (no worker)
NP=$(mktemp -d /tmp/earmark-nopreload.XXXXXX)
chown postgres "$NP"; chmod 755 "$NP"
runuser -u postgres -- "$EM_PGBIN/initdb" -D "$NP/data" -U postgres -A trust >/dev/null 2>&1
printf "port = %s\nlisten_addresses = ''\nunix_socket_directories = '%s'\n" $((PGPORT + 1)) "$NP" >>"$NP/data/postgresql.conf"
runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$NP/data" -l "$NP/log" -w start >/dev/null
np() { PGHOST=$NP PGPORT=$((PGPORT + 1)) q -d postgres "$@"; }
created=$(PGOPTIONS="-c client_min_messages=warning" np -c "CREATE EXTENSION earmark" 2>&1)
is "$(echo "$created" | grep -c 'WARNING:  earmark is not in shared_preload_libraries: its background worker does not run')" 1 \
   "CREATE EXTENSION without preload: a WARNING"
is "$(echo "$created" | grep -c "HINT:  Add earmark to shared_preload_libraries in postgresql.conf and restart the server.")" 1 \
   "... with the fix as its HINT"
is "$(np -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker'")" 0 "no worker without preload"
np -c "SELECT earmark_set_limit('np', 100)" >/dev/null
j=$(np -c "SELECT job_id FROM earmark_reserve('np', 60, 'a', lease => '1 hour')")
is "$(np -c "SELECT admitted || ' ' || reason FROM earmark_reserve('np', 60, 'b')")" "false the job needs 60 and 40 is left" "reserve works without preload"
np -c "SELECT charged FROM earmark_charge('np', $j, 25)" >/dev/null
np -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $j" >/dev/null
is "$(np -c "SELECT earmark_sweep()")" 1 "earmark_sweep works by hand without the worker"
is "$(np -c "SELECT used || '/' || held FROM earmark_budget('np')")" "25/0" "and the budget is right"
runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$NP/data" -m fast -w stop >/dev/null
rm -rf "$NP"

done_testing
