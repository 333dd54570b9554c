#!/usr/bin/env bash
# The reporter, the providers and the limit cache against a real HTTP
# provider on loopback (test/fake_provider.py), with the worker of the test
# cluster doing the work:
# - kinde: one OAuth2 token for many requests; absolute totals reach the
#   meter; the Notch run (5,000 usage rows from 100 connections, all
#   recorded, the meter equal to the ledger, reconcile "match"); usage
#   after a report is carried by the next one; a repeated report leaves the
#   meter unchanged; a 500 is re-marked and sent on a later pass; a 429 is
#   honoured (no request before its RateLimit-Reset); a closed cycle goes to
#   the review list and is never written; sweeping goes on while a send
#   hangs; a send that hangs past earmark.http_timeout gives up, is logged
#   and is sent again; kill -9 of the worker in the middle of a report
#   loses nothing;
# - limits: entitlements read with paging; a stale limit is used while the
#   worker reads it again; with the provider down past the stale window
#   admissions are refused with "limit unknown", and admitted again once it
#   answers (the cache's age is written into the account row, not waited
#   for); earmark_refresh_limits for a new account;
# - http: the generic provider with a bearer token and an HMAC signature;
# - secrets: in a file only the server's user may read (refused otherwise),
#   named by a setting a non-superuser cannot see, absent from the log;
# - a hostile provider: answers jsonb would refuse (a limit of 1e200000,
#   nesting 200,000 deep) are one failed read of their account, recorded,
#   and the other accounts are read; token answers with every kind of bad
#   expires_in are used and not kept (a huge one is cut to a day); a cancel
#   in the middle of a send ends that send only; the worker is the same
#   process throughout;
# - a limits read that hangs: the worker sweeps meanwhile;
# - memory: ten report passes against a provider that answers 500 with a
#   256 kB body after 1.3 s leave the worker's memory as it was.
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
DB=postgres
WORK=$(mktemp -d /tmp/earmark-meter.XXXXXX)
chmod 755 "$WORK"
SECRET="s3cret-$RANDOM-client"
HMAC="hm4c-$RANDOM-key"

settings=(earmark.provider earmark.kinde_domain earmark.provider_url earmark.provider_client_id
          earmark.provider_secrets_file earmark.report_interval earmark.limit_fresh
          earmark.limit_stale earmark.http_timeout)
reset_settings() {
    local s args=()
    for s in "${settings[@]}"; do args+=(-c "ALTER SYSTEM RESET $s"); done
    q -d postgres "${args[@]}" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
}
cleanup() {
    fake_provider_stop
    reset_settings
    q -d postgres -c "DROP ROLE IF EXISTS meter_app" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

# --- the fake provider --------------------------------------------------------
fake_provider "$WORK" --client-id earmark-test --client-secret "$SECRET" --bearer btok --hmac-secret "$HMAC"

meter() { state "int(d['kinde_meters'].get('$1|${2:-default}', -1))"; }
writes() { state "d['writes'].get('$1|${2:-default}', 0)"; }
# requests to a path waiting on a hang
in_flight() { state "len([r for r in d['in_flight'] if r['path'] == '$1'])"; }
# wait_state SECONDS PYTHON-EXPRESSION EXPECTED: poll the fake's state
wait_state() {
    local deadline got
    deadline=$(wait_deadline "$1")
    while :; do
        got=$(state "$2")
        [ "$got" == "$3" ] && { echo "$got"; return 0; }
        [ "$(date +%s)" -ge "$deadline" ] && { echo "$got"; return 1; }
        sleep 0.2
    done
}
# pass_lease JOB: the job's lease has passed (written into its row, not
# waited for, so that no machine is too slow for the step)
pass_lease() {
    q -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $1" >/dev/null
}
METER=/api/v1/billing/meter_usage
ledger() { q -c "SELECT coalesce(sum(l.units), 0) FROM earmark.ledger l JOIN earmark.budget b USING (account, budget_id) WHERE b.account = '$1'"; }

# wait_meter SECONDS AGREEMENT EXPECTED
wait_meter() {
    local deadline got
    deadline=$(wait_deadline "$1")
    while :; do
        got=$(meter "$2")
        [ "$got" == "$3" ] && { echo "$got"; return 0; }
        [ "$(date +%s)" -ge "$deadline" ] && { echo "$got"; return 1; }
        sleep 0.2
    done
}

set_conf() {  # set_conf NAME VALUE ...: set, reload, and wait until the worker runs with them
    local args=()
    while [ $# -gt 0 ]; do args+=("ALTER SYSTEM SET $1 = '$2'"); shift 2; done
    reload_conf "${args[@]}"
}

# secrets_file MODE LINES...: the provider's secrets, owned by the server's user
# (written under another name, then renamed over it: the worker reads the
# file at each use, and must never see the new contents with the old mode,
# as it did when the file was rewritten in place and then chmod'ed: the
# right key under mode 600 for a moment, a send that succeeded, and no
# refusal to wait for)
secrets_file() {
    local mode=$1
    shift
    printf '%s\n' "$@" >"$WORK/secrets.new"
    as_root chown postgres "$WORK/secrets.new"
    as_root chmod "$mode" "$WORK/secrets.new"
    as_root mv -f "$WORK/secrets.new" "$WORK/secrets"
}
secrets_file 600 "# earmark's provider secrets" "client_secret = $SECRET" "token = btok" "hmac_secret = $HMAC"

q -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
q -c "TRUNCATE earmark.budget, earmark.job, earmark.ledger_entry, earmark.meter_send, earmark.meter_review, earmark.evidence" \
  -c "UPDATE earmark.reporter_state SET blocked_until = NULL" >/dev/null
set_conf earmark.provider kinde earmark.kinde_domain "$BASE" \
         earmark.provider_client_id earmark-test earmark.provider_secrets_file "$WORK/secrets" \
         earmark.report_interval 1s

# --- kinde: a total reaches the meter -----------------------------------------
q -c "SELECT earmark_set_account('m_acct', NULL, 'cus_m', 'agr_m')" -c "SELECT earmark_set_limit('m_acct', NULL)" >/dev/null
q -c "SELECT earmark_record_usage('m_acct', 40, 'first')" >/dev/null
got=$(wait_meter 15 agr_m 40)
is "$got" 40 "the worker sent the cycle's absolute total to the Kinde meter"
q -c "SELECT earmark_record_usage('m_acct', 2, 'second')" >/dev/null
got=$(wait_meter 15 agr_m 42)
is "$got" 42 "usage after a report: the next report carries the new total"
is "$(state "d['tokens_issued']")" 1 "one OAuth2 token served every request (cached until 60 s before it expires)"
# (waited for: the meter reads the total once the provider has applied it,
# but the worker deletes the mark in its finish transaction, after the
# provider's answer has come back)
is "$(wait_for 15 "SELECT count(*) FROM earmark.meter_mark" 0)" 0 "a cycle the provider took is no longer marked"

# a repeated report: the same total again leaves the meter where it was
before=$(writes agr_m)
q -c "INSERT INTO earmark.meter_mark (account, budget_id) SELECT account, budget_id FROM earmark.budget WHERE account = 'm_acct'" >/dev/null
wait_for 15 "SELECT count(*) FROM earmark.meter_mark" 0 >/dev/null
is "$(writes agr_m)" "$((before + 1))" "a repeated report was written again"
is "$(meter agr_m)" 42 "... and left the meter unchanged (absolute writes)"

# --- the Notch run: 5,000 rows from 100 connections ---------------------------
q -c "SELECT earmark_set_account('notch', NULL, 'cus_n', 'agr_n')" -c "SELECT earmark_set_limit('notch', NULL)" \
  -c "DROP SEQUENCE IF EXISTS notch_click" -c "CREATE SEQUENCE notch_click" >/dev/null
echo "SELECT earmark_record_usage('notch', 1, 'click-' || nextval('notch_click'));" >"$WORK/click.sql"
"$EM_PGBIN/pgbench" -n -c 100 -j 4 -t 50 -f "$WORK/click.sql" postgres >"$WORK/pgbench.log" 2>&1
ok $? "pgbench: 100 connections x 50 usage rows ran without an error" || sed 's/^/# /' "$WORK/pgbench.log" | tail -5
is "$(q -c "SELECT count(*) || ' ' || sum(units) FROM earmark.ledger l JOIN earmark.budget b USING (account, budget_id) WHERE b.account = 'notch'")" \
   "5000 5000" "all 5,000 usage rows were recorded, once each"
shards=$(q -c "SELECT count(*) FROM earmark.usage_shard u JOIN earmark.budget b USING (account, budget_id) WHERE b.account = 'notch'")
ok "$(( shards > 16 ? 0 : 1 ))" "the writers spread over the counter shards ($shards of 64 used)"
got=$(wait_meter 20 agr_n 5000)
is "$got" 5000 "the meter reads 5,000"
is "$(q -c "SELECT verdict || ' ' || ledger_total || ' ' || provider_total FROM earmark_reconcile('notch')")" \
   "match 5000 5000" "reconcile: match at 5,000 (ledger, counters, meter)"

# --- a failed report is marked again and sent on a later pass -----------------
control '{"fail": {"status": 500, "count": 1, "path": "/api/v1/billing/meter_usage", "method": "POST"}}'
q -c "SELECT earmark_record_usage('m_acct', 8, 'third')" >/dev/null
got=$(wait_meter 20 agr_m 50)
is "$got" 50 "after a 500 the cycle was sent again on a later pass"
# (the success is logged in the finish transaction, after the meter shows 50)
got=$(wait_for 20 "SELECT string_agg(coalesce(http_status::text, '-') || ':' || ok, ',' ORDER BY send_id) FROM earmark.send_log WHERE account = 'm_acct' AND total = 50" \
      "500:false,200:true")
is "$got" "500:false,200:true" "the send log shows the 500 and the later success"

# --- 429: nothing before the reset ------------------------------------------
control '{"rate_limit": {"count": 1, "reset": 3, "path": "/api/v1/billing/meter_usage"}}'
q -c "SELECT earmark_record_usage('m_acct', 1, 'fourth')" >/dev/null
got=$(wait_meter 25 agr_m 51)
is "$got" 51 "after a 429 the total was sent once its reset had passed"
gap=$(state "(lambda t: min([r['t'] for r in d['requests'] if r['path'] == '/api/v1/billing/meter_usage' and r['method'] == 'POST' and r['t'] > t] or [0]) - t)([r['t'] for r in d['requests'] if r['status'] == 429][-1])")
ok "$(python3 -c "print(0 if $gap >= 2.9 else 1)")" "no meter request came before RateLimit-Reset (next one ${gap}s after the 429)"
is "$(q -c "SELECT count(*) FROM earmark.send_log WHERE http_status = 429")" 1 "the 429 is in the send log"

# --- a closed cycle goes to the review list, never to the meter ---------------
q -c "SELECT earmark_set_account('closed_acct', NULL, 'cus_c', 'agr_c')" -c "SELECT earmark_set_limit('closed_acct', NULL)" \
  -c "SELECT earmark_record_usage('closed_acct', 5, 'late', occurred_at => now() - interval '40 days')" >/dev/null
got=$(wait_for 15 "SELECT ledger_total || ' ' || coalesce(last_sent::text, 'never') FROM earmark.review_list WHERE account = 'closed_acct'" "5 never")
is "$got" "5 never" "a late usage in a closed cycle is on the review list"
is "$(writes agr_c)" 0 "... and was never written to the meter"

# --- a hanging provider: sweeping goes on meanwhile ---------------------------
# The send hangs until the test releases it (the worker would wait 60 s): a
# lease passed meanwhile is swept while the request is still waiting.
sends_from=$(q -c "SELECT coalesce(max(send_id), 0) FROM earmark.send_log")
set_conf earmark.http_timeout 60000
control '{"hang": {"count": 1, "seconds": 600, "path": "/api/v1/billing/meter_usage"}}'
q -c "SELECT earmark_record_usage('m_acct', 1, 'fifth')" >/dev/null
got=$(wait_state 60 "len([r for r in d['in_flight'] if r['path'] == '$METER'])" 1)
is "$got" 1 "the worker's send waits on the hanging provider"
job=$(q -c "SELECT job_id FROM earmark_reserve('m_acct', 10, 'hang-job', lease => '1 hour')")
pass_lease "$job"
got=$(wait_for 60 "SELECT status FROM earmark.job WHERE job_id = $job" expired)
is "$got $(in_flight "$METER")" "expired 1" "a lease that passed meanwhile was swept while the provider hung"
control '{"release": true}'
got=$(wait_for 60 "SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (account, budget_id) WHERE b.account = 'm_acct'" 0)
is "$got $(meter agr_m)" "0 52" "released, the send was answered and the total is on the meter"

# --- a provider that hangs past earmark.http_timeout: the send gives up --------
# The cycle is marked again (the same total); the send times out after 3 s
# (the fake then applies what it got, the same total again), is logged as a
# failure, and the cycle is sent again on a later pass.
set_conf earmark.http_timeout $((3000 * EM_WAIT_SCALE))
control '{"hang": {"count": 1, "seconds": 600, "path": "/api/v1/billing/meter_usage"}}'
q -c "INSERT INTO earmark.meter_mark (account, budget_id) SELECT account, budget_id FROM earmark.budget WHERE account = 'm_acct'" >/dev/null
got=$(wait_for 60 "SELECT string_agg(coalesce(http_status::text, '-') || ':' || ok, ',' ORDER BY send_id) FROM earmark.send_log WHERE account = 'm_acct' AND total = 52 AND send_id > $sends_from" \
      "200:true,-:false,200:true")
is "$got" "200:true,-:false,200:true" "after the timeout the total was sent again"
is "$(q -c "SELECT count(*) FROM earmark.send_log WHERE ok = false AND error ILIKE '%timed out%'")" 1 "the timed-out send is logged as an error"
# the request the worker gave up on has been applied (the same total) before
# the next step writes another
got=$(wait_state 60 "len([r for r in d['requests'] if r['path'] == '$METER' and r['disconnected']])" 1)
is "$got $(meter agr_m)" "1 52" "the fake applied the abandoned request: the meter still reads 52"
set_conf earmark.http_timeout $((5000 * EM_WAIT_SCALE))

# --- kill -9 of the worker in the middle of a report --------------------------
# (the send hangs until the worker is killed: the fake then applies it, the
# same total the restarted worker sends again)
control '{"hang": {"count": 1, "seconds": 600, "path": "/api/v1/billing/meter_usage"}}'
q -c "SELECT earmark_record_usage('m_acct', 3, 'sixth')" >/dev/null
got=$(wait_state 60 "len([r for r in d['in_flight'] if r['path'] == '$METER'])" 1)
is "$got" 1 "the worker is in the middle of a report"
old=$(q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'")
kill -9 "$old"
# The postmaster resets the cluster: connections fail ("the database system
# is not yet accepting connections") until crash recovery is done, which
# under valgrind takes minutes; wait_for polls through that.
new=$(wait_for 120 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND pid <> $old" 1)
is "$new" 1 "the postmaster restarted the worker after kill -9"
# the mark of the cycle survives the crash (its send did not commit) and
# goes once the restarted worker's send was taken
got=$(wait_for 60 "SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (account, budget_id) WHERE b.account = 'm_acct'" 0)
is "$got $(meter agr_m)" "0 55" "the restarted worker sent the cycle: nothing was lost"
is "$(ledger m_acct)" 55 "the ledger kept every committed row"
is "$(q -c "SELECT verdict FROM earmark_reconcile('m_acct')")" match "reconcile after the crash: match"

# --- limits: entitlements with paging, stale window, fail closed --------------
control '{"set_entitlement": [{"customer": "cus_l", "feature": "default", "limit": 1000}, {"customer": "cus_l", "feature": "images", "limit": null}, {"customer": "cus_l", "feature": "video", "limit": 2147483647}]}'
q -c "SELECT earmark_set_account('lim_acct', NULL, 'cus_l', 'agr_l')" >/dev/null
is "$(q -c "SELECT earmark_refresh_limits('lim_acct')")" 3 "earmark_refresh_limits read three entitlements over two pages"
is "$(q -c "SELECT string_agg(feature || '=' || coalesce(lim::text, 'unlimited'), ',' ORDER BY feature) FROM earmark.account_limit WHERE account = 'lim_acct'")" \
   "default=1000,images=unlimited,video=unlimited" "null and 2147483647 both mean unlimited"
is "$(state "len([r for r in d['requests'] if r['path'] == '/api/v1/billing/entitlements'])")" 2 "two entitlement pages were read (starting_after while has_more)"
is "$(q -c "SELECT admitted FROM earmark_reserve('lim_acct', 100, 'l1')")" t "an admission under a fresh provider limit"
# a feature the provider no longer lists loses its provider limit (written
# in feature order with the others); a limit set by hand stays
q -c "SELECT earmark_set_limit('lim_acct', 5, 'beta')" >/dev/null
control '{"set_entitlement": {"customer": "cus_l", "feature": "images", "remove": true}}'
is "$(q -c "SELECT earmark_refresh_limits('lim_acct')")" 2 "after the provider dropped a feature, two entitlements are read"
is "$(q -c "SELECT string_agg(feature || '=' || coalesce(lim::text, 'unlimited') || ':' || source, ',' ORDER BY feature) FROM earmark.account_limit WHERE account = 'lim_acct'")" \
   "beta=5:manual,default=1000:provider,video=unlimited:provider" "... its limit is gone, the one set by hand stays"

# the first feature, the last one, and every one dropped in turn (an empty
# answer keeps only the limits set by hand)
limits_of() {
    q -c "SELECT coalesce(string_agg(feature || '=' || coalesce(lim::text, 'unlimited') || ':' || source, ',' ORDER BY feature), '-') FROM earmark.account_limit WHERE account = '$1'"
}
q -c "SELECT earmark_set_account('rr_acct', NULL, 'cus_rr', 'agr_rr')" >/dev/null
q -c "SELECT earmark_set_limit('rr_acct', 7, 'm')" >/dev/null
# refreshed: the read's count and the limits after it; dropped FEATURE: the
# same after the provider stopped listing FEATURE
refreshed() { echo "$(q -c "SELECT earmark_refresh_limits('rr_acct')") $(limits_of rr_acct)"; }
dropped() {
    control "{\"set_entitlement\": {\"customer\": \"cus_rr\", \"feature\": \"$1\", \"remove\": true}}"
    refreshed
}
control '{"set_entitlement": [{"customer": "cus_rr", "feature": "a", "limit": 1}, {"customer": "cus_rr", "feature": "b", "limit": 2}, {"customer": "cus_rr", "feature": "c", "limit": 3}]}'
is "$(refreshed)" "3 a=1:provider,b=2:provider,c=3:provider,m=7:manual" "three provider limits beside one set by hand"
is "$(dropped a)" "2 b=2:provider,c=3:provider,m=7:manual" "the first feature dropped by the provider is gone"
is "$(dropped c)" "1 b=2:provider,m=7:manual" "the last feature dropped by the provider is gone"
is "$(dropped b)" "0 m=7:manual" "an answer with no entitlements leaves only the limit set by hand"

# Two refreshes of one account at once store one after the other: the
# answer stored last is the account's provider limits.  The first reads
# (a=20, x=5) and waits, before it commits, on a table a third session
# holds; the second reads (a=30) meanwhile and must wait for the first's
# refresh lock (one no SQL function can take: its fourth key is 25965),
# then drop the x the first stored.  rr_race LEVEL runs it with
# the second at LEVEL (its snapshot taken before the first commits) and
# prints "first's exit, second's exit, second's answer or error, the limits".
rr_race() {
    control '{"set_entitlement": {"customer": "cus_rr", "feature": "a", "limit": 10}}'
    q -c "SELECT earmark_refresh_limits('rr_acct')" >/dev/null
    PGAPPNAME=rr_gate q -c "BEGIN" -c "LOCK TABLE rr_gate" -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
    local gate=$! first=0 second=0 a b
    wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rr_gate' AND query = 'SELECT pg_sleep(600)'" 1 >/dev/null
    control '{"set_entitlement": [{"customer": "cus_rr", "feature": "a", "limit": 20}, {"customer": "cus_rr", "feature": "x", "limit": 5}]}'
    PGAPPNAME=rr_first q -c "BEGIN" -c "SELECT earmark_refresh_limits('rr_acct')" -c "LOCK TABLE rr_gate" -c "COMMIT" >"$WORK/rr_first.out" 2>&1 &
    a=$!
    wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rr_first' AND wait_event_type = 'Lock' AND query = 'LOCK TABLE rr_gate'" 1 >/dev/null
    control '{"set_entitlement": [{"customer": "cus_rr", "feature": "a", "limit": 30}, {"customer": "cus_rr", "feature": "x", "remove": true}]}'
    PGAPPNAME=rr_second q -c "BEGIN ISOLATION LEVEL $1" -c "SELECT count(*) FROM earmark.account_limit" \
        -c "SELECT earmark_refresh_limits('rr_acct')" -c "COMMIT" >"$WORK/rr_second.out" 2>&1 &
    b=$!
    wait_for 60 "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l USING (pid)
                  WHERE a.application_name = 'rr_second' AND NOT l.granted
                    AND l.locktype = 'advisory' AND l.objsubid = 25965" 1 >/dev/null ||
        echo "the second refresh never waited for the refresh lock"
    q -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'rr_gate'" >/dev/null
    wait "$gate" || true    # cancelled: its transaction ends
    wait "$a" || first=$?
    wait "$b" || second=$?
    echo "$first $second $(grep -m1 '^ERROR' "$WORK/rr_second.out" || sed -n '$p' "$WORK/rr_second.out") $(limits_of rr_acct)"
}
q -c "DROP TABLE IF EXISTS rr_gate" -c "CREATE TABLE rr_gate ()"
is "$(rr_race 'READ COMMITTED')" "0 0 1 a=30:provider,m=7:manual" \
   "two refreshes of one account at once: the second waits for the first, then drops the x it stored"
is "$(rr_race 'REPEATABLE READ')" "0 1 ERROR:  could not serialize access due to concurrent update a=20:provider,m=7:manual,x=5:provider" \
   "... under REPEATABLE READ the second fails with 40001 and the first's limits stay"
q -c "DROP TABLE rr_gate"

# The cache's age is written into the account row (limits_fetched_at), not
# waited for: with the default windows (used as it is up to 60 s, used
# while it is read again up to 10 min), 5 minutes old is stale and an hour
# old is past the stale window.
control '{"down": true}'
q -c "UPDATE earmark.account SET limits_fetched_at = clock_timestamp() - interval '5 minutes' WHERE account = 'lim_acct'" >/dev/null
is "$(q -c "SELECT admitted || ' ' || coalesce(reason, '') FROM earmark_reserve('lim_acct', 100, 'l2')")" "true " \
   "a stale limit (past limit_fresh, within limit_stale) is still used"
got=$(wait_for 60 "SELECT limits_error IS NOT NULL FROM earmark.account WHERE account = 'lim_acct'" t)
is "$got" t "the worker tried to read the stale limit and recorded the failure"
q -c "UPDATE earmark.account SET limits_fetched_at = clock_timestamp() - interval '1 hour' WHERE account = 'lim_acct'" >/dev/null
is "$(q -c "SELECT admitted || ' ' || reason FROM earmark_reserve('lim_acct', 100, 'l3')")" "false limit unknown" \
   "past the stale window with the provider down: refused, limit unknown (fail closed)"
control '{"down": false}'
# the failed read's retry is made due (its time written, not waited for)
q -c "UPDATE earmark.account SET limits_tried_at = NULL WHERE account = 'lim_acct'" >/dev/null
got=$(wait_for 60 "SELECT limits_error IS NULL AND limits_fetched_at > clock_timestamp() - interval '10 minutes' FROM earmark.account WHERE account = 'lim_acct'" t)
is "$got $(q -c "SELECT admitted FROM earmark_reserve('lim_acct', 100, 'l4')")" "t t" \
   "once the provider answers, the worker reads the limit and admissions resume"

q -c "SELECT earmark_set_account('signup', NULL, 'cus_new', 'agr_new')" >/dev/null
control '{"set_entitlement": {"customer": "cus_new", "feature": "default", "limit": 50}}'
is "$(q -c "SELECT earmark_refresh_limits('signup')")" 1 "sign-up flow: earmark_refresh_limits reads the new account's limit"
is "$(q -c "SELECT admitted || ' ' || remaining FROM earmark_reserve('signup', 20, 's1')")" "true 30" "... and its first admission uses it"
control '{"down": true}'
is "$(sqlstate "SELECT earmark_refresh_limits('signup')")" EM201 "earmark_refresh_limits with the provider down: EM201"
control '{"down": false}'

# --- the generic http provider: bearer token and HMAC signature --------------
set_conf earmark.provider http earmark.provider_url "$BASE/generic"
control '{"set_limit": {"account": "h_acct", "feature": "default", "limit": 700}}'
q -c "SELECT earmark_set_account('h_acct')" >/dev/null
is "$(q -c "SELECT earmark_refresh_limits('h_acct')")" 1 "http provider: limits read with a bearer token and a signature"
q -c "SELECT earmark_record_usage('h_acct', 11, 'h1')" >/dev/null
cs=$(q -c "SELECT to_char(cycle_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') FROM earmark.budget WHERE account = 'h_acct'")
got=$(wait_state 30 "d['generic_meters'].get('h_acct|default|$cs', -1)" 11)
is "$got" 11 "http provider: the absolute total was PUT, signed"
is "$(q -c "SELECT verdict FROM earmark_reconcile('h_acct')")" match "http provider: read back for reconcile"
secrets_file 600 "token = btok" "hmac_secret = wrong-key"
q -c "SELECT earmark_record_usage('h_acct', 1, 'h2')" >/dev/null
got=$(wait_for 10 "SELECT http_status FROM earmark.send_log WHERE account = 'h_acct' AND NOT ok ORDER BY send_id DESC LIMIT 1" 401)
is "$got" 401 "a wrong signature is refused by the provider (401) and logged"
secrets_file 644 "token = btok" "hmac_secret = $HMAC"
got=$(wait_for 10 "SELECT error LIKE '%readable by no one else%' FROM earmark.send_log WHERE account = 'h_acct' AND NOT ok ORDER BY send_id DESC LIMIT 1" t)
is "$got" t "a secrets file others may read is refused, and no request is made"
secrets_file 600 "token = btok" "hmac_secret = $HMAC"
got=$(wait_for 10 "SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (account, budget_id) WHERE b.account = 'h_acct'" 0)
is "$got" 0 "with the right key again the cycle is sent"

# --- answers earmark refuses (providers.md): each is one failed read ----------
q -c "SELECT earmark_set_account('h_ans')" >/dev/null
answer_case() {  # answer_case BODY EXPECTED-DETAIL-OR-RESULT DESCRIPTION
    local spec detail
    spec=$(python3 -c 'import json, sys; print(json.dumps({"answer": {"path": "/generic/limits", "query": "account=h_ans", "count": 1, "body": sys.argv[1]}}))' "$1")
    control "$spec"
    detail=$("$EM_PGBIN/psql" -X -A -t -q -d postgres -c "SELECT earmark_refresh_limits('h_ans')" 2>&1 |
             sed -n 's/^DETAIL:  //p; s/^\([0-9][0-9]*\)$/read \1/p')
    is "$detail" "$2" "a limits answer $3"
}
answer_case '' "the provider's answer cannot be read: the answer is empty" "empty"
answer_case '[{"feature": "default", "limit": 1}]' "the provider's answer cannot be read: the answer is not a JSON object" "that is an array"
answer_case '{"limits": [' "the provider's answer cannot be read: the answer is not valid JSON" "cut short"
answer_case '{"limits": [{"feature": "a\u0000b", "limit": 1}]}' "the provider's answer cannot be read: the answer is not valid JSON" "with \\u0000"
answer_case '{"limits": [{"feature": "\udc00", "limit": 1}]}' "the provider's answer cannot be read: the answer is not valid JSON" "with a lone surrogate"
answer_case "{\"a\": $(printf '[%.0s' $(seq 1 40))$(printf ']%.0s' $(seq 1 40))}" "the provider's answer cannot be read: nested deeper than 32 levels" "nested 40 deep"
answer_case '{"limits": [{"feature": "default", "limit": 1e3}]}' 'the limit of feature "default" is not a whole number >= 0' "with a limit of 1e3"
answer_case '{"limits": [{"feature": "default", "limit": 1.5}]}' 'the limit of feature "default" is not a whole number >= 0' "with a limit of 1.5"
answer_case '{"limits": [{"feature": "default", "limit": 9223372036854775808}]}' 'the limit of feature "default" is not a whole number >= 0' "with a limit past bigint"
answer_case '{"limits": [{"feature": "", "limit": 1}]}' "a limit in the provider's answer has no usable feature" "with an empty feature"
answer_case '{"limits": [{"feature": "default", "limit": 7}], "noise": [1e200000, -1e-200000, "\ud83d\ude00"]}' "read 1" "with 1e200000 outside the limits"
is "$(q -c "SELECT lim FROM earmark.account_limit WHERE account = 'h_ans'")" 7 "a number jsonb would refuse elsewhere in the answer is ignored"
answer_case '{"limits": [], "limits": [{"feature": "default", "limit": "8"}]}' "read 1" "with two limits keys"
is "$(q -c "SELECT lim FROM earmark.account_limit WHERE account = 'h_ans'")" 8 "of two equal keys the last counts; a decimal string is a number"

# --- a hostile provider: answers PostgreSQL's jsonb would refuse -------------
# (a number past numeric's range, nesting past the stack depth) are each one
# failed read of one account, recorded and logged; the worker keeps running
# and reads the other accounts' limits
secrets_file 600 "client_secret = $SECRET" "token = btok" "hmac_secret = $HMAC"
set_conf earmark.provider kinde earmark.kinde_domain "$BASE" earmark.http_timeout $((5000 * EM_WAIT_SCALE))
worker() { q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'"; }
log_from=$(stat -c %s "$EM_BASE/server.log")
log_since() { tail -c +$((log_from + 1)) "$EM_BASE/server.log"; }
wpid=$(worker)
python3 - "$WORK/deep.json" <<'EOF2'
import json, sys
n = 200000
body = '{"has_more": false, "entitlements": ' + '[' * n + ']' * n + '}'
json.dump({"answer": {"path": "/api/v1/billing/entitlements", "query": "customer_id=cus_hx_deep",
                      "count": 100000, "body": body}}, open(sys.argv[1], "w"))
EOF2
control "@$WORK/deep.json"
control '{"answer": {"path": "/api/v1/billing/entitlements", "query": "customer_id=cus_hx_big", "count": 100000, "body": "{\"has_more\": false, \"entitlements\": [{\"id\": \"e1\", \"feature_code\": \"default\", \"entitlement_limit_max\": 1e200000}]}"}}'
control '{"set_entitlement": [{"customer": "cus_hx_one", "feature": "default", "limit": 500}, {"customer": "cus_hx_two", "feature": "default", "limit": 600}]}'
q -c "SELECT earmark_set_account(a, NULL, 'cus_' || a, 'agr_' || a) FROM unnest(ARRAY['hx_big', 'hx_deep', 'hx_one', 'hx_two']) a" >/dev/null
# flagged in this order: the hostile ones come first in every pass
for a in hx_big hx_deep hx_one hx_two; do q -c "SELECT reason FROM earmark_reserve('$a', 1, 'hx-1')" >/dev/null; done
got=$(wait_for 30 "SELECT string_agg(account || '=' || lim, ',' ORDER BY account) FROM earmark.account_limit WHERE account IN ('hx_one', 'hx_two')" "hx_one=500,hx_two=600")
is "$got" "hx_one=500,hx_two=600" "the other accounts' limits were read although the first two flagged answer with hostile JSON"
is "$(q -c "SELECT string_agg(account || ' ' || (limits_error IS NOT NULL) || ' ' || (limits_fetched_at IS NULL), ', ' ORDER BY account) FROM earmark.account WHERE account IN ('hx_big', 'hx_deep')")" \
   "hx_big true true, hx_deep true true" "each hostile answer is a failed read of its account, with its error recorded"
q -c "SELECT account || ': ' || limits_error FROM earmark.account WHERE account IN ('hx_big', 'hx_deep') ORDER BY account" | sed 's/^/# /'
is "$(worker)" "$wpid" "the worker kept running (same pid)"
is "$(log_since | grep -c -e 'value overflows numeric format' -e 'stack depth limit exceeded')" 0 \
   "no answer raised an error in the worker"
logged=$(log_since | grep -c 'could not read the limits of account "hx_big"')
ok "$(( logged >= 1 ? 0 : 1 ))" "the failed read is in the server log ($logged lines, one a try)"
q -c "UPDATE earmark.account SET limits_wanted_at = NULL" >/dev/null

# --- the token's expires_in: validated and clamped, never an error -------------
# Each case: the token is refused by the provider (revoked), the worker gets a
# new one whose expires_in is the case's text, and reports with it; then one
# more report shows whether the token was kept (no new token) or not.
tok_n=0
total=$(meter agr_m)
token_case() {  # token_case RAW-EXPIRES-IN KEPT(true/false) DESCRIPTION
    local raw issued first second
    raw=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1")
    control "{\"token_expires_in\": $raw, \"revoke_tokens\": true}"
    tok_n=$((tok_n + 1)); total=$((total + 1))
    q -c "SELECT earmark_record_usage('m_acct', 1, 'tok-$tok_n-a')" >/dev/null
    first=$(wait_meter 20 agr_m $total)
    issued=$(state "d['tokens_issued']")
    total=$((total + 1))
    q -c "SELECT earmark_record_usage('m_acct', 1, 'tok-$tok_n-b')" >/dev/null
    second=$(wait_meter 20 agr_m $total)
    kept=$([ "$(state "d['tokens_issued']")" = "$issued" ] && echo true || echo false)
    is "$first $second $kept" "$((total - 1)) $total $2" "expires_in $1: $3"
}
token_case 1e200000 false "past numeric's range: the token is used, not kept"
token_case 99999999999999999999999 false "past bigint: not kept"
token_case -5 false "negative: not kept"
token_case 0 false "zero: not kept"
token_case 1.5 false "not a whole number: not kept"
token_case true false "not a number: not kept"
token_case '"3600"' true "a decimal string: kept"
token_case 9223372036854775807 true "bigint's largest: clamped (no overflow), kept"
token_case 3600 true "an hour: kept"
is "$(worker)" "$wpid" "the worker kept running through every token answer (same pid)"
control '{"token_expires_in": null}'

# --- a cancel in the middle of a send: logged, and the worker goes on ----------
# (the write hangs until the cancel ends it)
control '{"hang": {"count": 1, "seconds": 600, "path": "/api/v1/billing/meter_usage", "method": "POST"}}'
total=$((total + 1))
q -c "SELECT earmark_record_usage('m_acct', 1, 'cancelled-send')" >/dev/null
got=$(wait_state 60 "len([r for r in d['in_flight'] if r['path'] == '$METER'])" 1)
is "$got" 1 "the worker is waiting on a hanging meter write"
q -c "SELECT pg_cancel_backend($(worker))" >/dev/null
got=$(wait_meter 20 agr_m $total)
is "$got" "$total" "after a cancel in the middle of the send, the total reaches the meter"
is "$(worker)" "$wpid" "the cancel ended one step only: the same worker goes on"
cancelled=$(log_since | grep -c "earmark worker ERROR:  canceling statement due to user request")
is "$cancelled" 1 "the cancel is in the server log, once"

# --- a slow limits read: sweeping goes on meanwhile ----------------------------
# (the read hangs until it is released; the worker would wait 60 s)
set_conf earmark.http_timeout 60000
q -c "SELECT earmark_set_account('hx_slow', NULL, 'cus_hx_slow', 'agr_hx_slow')" >/dev/null
control '{"hang": {"count": 1, "seconds": 600, "path": "/api/v1/billing/entitlements", "query": "customer_id=cus_hx_slow"}}'
q -c "SELECT reason FROM earmark_reserve('hx_slow', 1, 'slow-1')" >/dev/null
got=$(wait_state 60 "len([r for r in d['in_flight'] if r['path'] == '/api/v1/billing/entitlements'])" 1)
is "$got" 1 "the worker's limits read waits on a hanging provider"
job=$(q -c "SELECT job_id FROM earmark_reserve('m_acct', 10, 'slow-limits-job', lease => '1 hour')")
pass_lease "$job"
got=$(wait_for 60 "SELECT status FROM earmark.job WHERE job_id = $job" expired)
is "$got $(in_flight /api/v1/billing/entitlements)" "expired 1" "a lease that passed while the limits read hung was swept meanwhile"
control '{"release": true}'
got=$(wait_for 60 "SELECT limits_fetched_at IS NOT NULL FROM earmark.account WHERE account = 'hx_slow'" t)
is "$got" t "once the provider answers, the slow read is stored"
set_conf earmark.http_timeout $((5000 * EM_WAIT_SCALE))

# --- memory: failing passes against a slow provider leave the worker's memory as it was
# A provider that answers 500 with a 256 kB body after 1.3 s, to five cycles a
# pass; the worker's memory (pg_log_backend_memory_contexts' grand total) is
# sampled after 2 failing passes and again 10 passes later.
worker_memory() {  # the grand total of the worker's memory contexts, in bytes ("" if not logged)
    local pid=$1 before deadline
    before=$(grep -c "\[$pid\] .*Grand total: " "$EM_BASE/server.log")
    q -c "SELECT pg_log_backend_memory_contexts($pid)" >/dev/null
    deadline=$(wait_deadline 60)
    while [ "$(date +%s)" -lt "$deadline" ]; do
        if [ "$(grep -c "\[$pid\] .*Grand total: " "$EM_BASE/server.log")" -gt "$before" ]; then
            grep "\[$pid\] .*Grand total: " "$EM_BASE/server.log" | tail -1 |
                sed 's/.*Grand total: \([0-9]*\) bytes.*/\1/'
            return 0
        fi
        sleep 0.1
    done
}
failed_sends() { q -c "SELECT count(*) FROM earmark.send_log WHERE account LIKE 'mem_%' AND NOT ok"; }
q -c "SELECT earmark_set_account('mem_' || i, NULL, 'cus_mem_' || i, 'agr_mem_' || i), earmark_set_limit('mem_' || i, NULL) FROM generate_series(1, 5) i" >/dev/null
control '{"fail": {"status": 500, "count": 100000, "path": "/api/v1/billing/meter_usage", "method": "POST", "body_bytes": 262144}, "slow": {"ms": 1300}}'
q -c "SELECT earmark_record_usage('mem_' || i, i, 'mem') FROM generate_series(1, 5) i" >/dev/null
wait_for 60 "SELECT count(*) >= 10 FROM earmark.send_log WHERE account LIKE 'mem_%' AND NOT ok" t >/dev/null
first_mem=$(worker_memory "$(worker)")
sent=$(failed_sends)
wait_for 120 "SELECT count(*) >= $((sent + 50)) FROM earmark.send_log WHERE account LIKE 'mem_%' AND NOT ok" t >/dev/null
ok $? "ten more passes failed against the slow provider ($sent, then $(failed_sends) failed sends)"
second_mem=$(worker_memory "$(worker)")
diag "worker memory: $first_mem bytes, then $second_mem bytes"
ok "$([ -n "$first_mem" ] && [ -n "$second_mem" ] && [ $((second_mem - first_mem)) -lt $((2 * 1024 * 1024)) ]; echo $?)" \
   "the worker's memory did not grow over ten failing passes ($first_mem -> $second_mem bytes)"
is "$(worker)" "$wpid" "the same worker throughout"
control '{"fail": {"count": 0}, "slow": {"ms": 0}}'
got=$(wait_for 30 "SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (account, budget_id) WHERE b.account LIKE 'mem_%'" 0)
is "$got" 0 "once the provider answers, the cycles are sent"

# --- secrets ------------------------------------------------------------------
q -c "DROP ROLE IF EXISTS meter_app" -c "CREATE ROLE meter_app LOGIN IN ROLE earmark_admin" >/dev/null
is "$(sqlstate "SET ROLE meter_app" "SHOW earmark.provider_secrets_file")" 42501 "a non-superuser cannot SHOW where the secrets file is"
is "$(q -c "SET ROLE meter_app" -c "SELECT count(*) FROM pg_settings WHERE name = 'earmark.provider_secrets_file'")" 0 \
   "nor see it in pg_settings"
is "$(sqlstate "SET ROLE meter_app" "SELECT pg_read_file('$WORK/secrets')")" 42501 "nor read the file"
is "$(q -c "SET ROLE meter_app" -c "SELECT count(*) FROM pg_settings WHERE name = 'earmark.provider'")" 1 "(the provider itself is visible)"
logged=$(grep -c -e "$SECRET" -e "$HMAC" "$EM_BASE/server.log" 2>/dev/null | awk -F: '{s += $NF} END {print s + 0}')
is "$logged" 0 "no secret appears in the server log"
is "$(q -c "SELECT count(*) FROM pg_settings WHERE setting LIKE '%$SECRET%' OR setting LIKE '%$HMAC%'")" 0 "no setting holds a secret"

done_testing
