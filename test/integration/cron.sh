#!/usr/bin/env bash
# docs/operations.md, "Scheduling with pg_cron", run as printed: on a
# cluster of its own, started with nothing but the doc's postgresql.conf
# lines (besides where it listens: no TCP, its own socket directory and
# port), the doc's step 2 as the superuser and step 3 as the role billing,
# then the doc's check of the runs and its unschedule.  The steps are taken
# from the doc's fenced blocks in that section, in order; the only change
# is the schedule of step 3 ('17 3 * * *', daily) made '* * * * *', so that
# the job runs within a minute (pg_cron 1.4, Debian 12's, has no seconds
# schedules).  Checks that the job really ran: cron.job_run_details says
# succeeded (one row) and earmark_reconcile left evidence.  A step of the
# doc that fails, or a job that fails (e.g. "connection failed" when jobs
# connect to cron.host), fails this script.
source "$(dirname "$0")/tap.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DOC=$ROOT/docs/operations.md

CC=$(mktemp -d /tmp/earmark-cron.XXXXXX)
chown postgres "$CC"; chmod 755 "$CC"
CPORT=$((PGPORT + 9))
as_pg() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
cleanup() {
    as_pg "$EM_PGBIN/pg_ctl" -D "$CC/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$CC"
}
trap cleanup EXIT
C() { PGHOST=$CC PGPORT=$CPORT q -d postgres "$@"; }

# the section's fenced blocks, one file each: 1 postgresql.conf, 2 step 2,
# 3 step 3, 4 the check of the runs and the unschedule
awk '/^### Scheduling with pg_cron/ {s = 1; next} s && /^##/ {exit}
     s && /^ *```/ {if (inb) {inb = 0} else {inb = 1; n++}; next}
     s && inb {sub(/^   /, ""); print > (dir "/block" n)}' dir="$CC" "$DOC"
for n in 1 2 3 4; do
    ok "$([ -s "$CC/block$n" ]; echo $?)" "docs/operations.md, Scheduling with pg_cron: block $n found"
done
sed 's/^/# conf: /' "$CC/block1"

as_pg "$EM_PGBIN/initdb" -D "$CC/data" -U postgres -A trust >/dev/null 2>&1
{
    echo "port = $CPORT"
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$CC'"
    cat "$CC/block1"
} >>"$CC/data/postgresql.conf"
as_pg "$EM_PGBIN/pg_ctl" -D "$CC/data" -l "$CC/log" -w -t 120 \
    ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} start >/dev/null
ok $? "the server starts with the doc's postgresql.conf lines"
is "$(C -c "SHOW shared_preload_libraries")" "earmark,pg_cron" "earmark and pg_cron are preloaded"

# before the doc's steps: earmark installed, the role billing, and usage to
# reconcile (with the default "local" provider)
C -c "CREATE EXTENSION earmark" \
  -c "CREATE ROLE billing LOGIN IN ROLE earmark_admin" \
  -c "SELECT earmark_set_account('cron_acct')" -c "SELECT earmark_set_limit('cron_acct', NULL)" \
  -c "SELECT earmark_record_usage('cron_acct', 5, 'cron-1')" >/dev/null
is "$(C -c "SELECT count(*) FROM earmark.evidence")" 0 "no evidence before the job runs"

# step 2, as the superuser
C -f "$CC/block2" >"$CC/step2.out" 2>&1
ok $? "step 2 (CREATE EXTENSION pg_cron; GRANT USAGE ON SCHEMA cron TO billing) as the superuser" ||
    sed 's/^/# /' "$CC/step2.out"

# step 3, as billing, every minute instead of daily at 03:17
grep -q "'17 3 \* \* \*'" "$CC/block3"
ok $? "step 3 schedules '17 3 * * *' (replaced by '* * * * *' here)"
sed "s/'17 3 \* \* \*'/'* * * * *'/" "$CC/block3" >"$CC/step3.sql"
jobid=$(C -U billing -f "$CC/step3.sql" 2>"$CC/step3.err")
ok $? "step 3 (cron.schedule) as billing" || sed 's/^/# /' "$CC/step3.err"
diag "job $jobid: $(C -c "SELECT jobname || ' ' || schedule || ' as ' || username || ', nodename ' || nodename FROM cron.job")"

# the job runs within a minute (and a bit on a loaded machine)
# (a first run that ended, either way)
PGHOST=$CC PGPORT=$CPORT DB=postgres wait_for 180 \
    "SELECT count(*) > 0 FROM cron.job_run_details WHERE jobid = $jobid AND status IN ('succeeded', 'failed')" t >/dev/null
ok $? "pg_cron ran the scheduled job within 3 minutes"
is "$(C -c "SELECT status FROM cron.job_run_details WHERE jobid = $jobid AND status IN ('succeeded', 'failed') ORDER BY runid LIMIT 1")" \
   succeeded "pg_cron ran the scheduled earmark_reconcile: succeeded"
C -c "SELECT status || ': ' || coalesce(return_message, '') FROM cron.job_run_details WHERE jobid = $jobid ORDER BY runid" | sed 's/^/# run: /'
is "$(C -c "SELECT return_message FROM cron.job_run_details WHERE jobid = $jobid AND status = 'succeeded' ORDER BY runid LIMIT 1")" \
   "SELECT 1" "the job's result is one row (count(*))"
diag "evidence: $(C -c "SELECT string_agg(account || ' ' || verdict || ' ' || ledger_total, ', ') FROM earmark.evidence")"
is "$(C -c "SELECT string_agg(DISTINCT account || ' ' || ledger_total, ',') FROM earmark.evidence")" \
   "cron_acct 5" "the job's earmark_reconcile stored its evidence of the cycle (ledger 5)"

# the doc's check of the runs and its unschedule, as billing
C -U billing -f "$CC/block4" >"$CC/step4.out" 2>&1
ok $? "the doc's check of the runs and cron.unschedule, as billing" || sed 's/^/# /' "$CC/step4.out"
grep -q '^succeeded|' "$CC/step4.out"
ok $? "the doc's check shows a succeeded run"
is "$(C -c "SELECT count(*) FROM cron.job")" 0 "the job is unscheduled"

done_testing
