#!/usr/bin/env bash
# The reporter against itself and its caller (src/meter.c), with a real
# HTTP provider on loopback (test/fake_provider.py) and the worker of the
# test cluster reporting only once a day, so that the passes here are
# earmark_report()'s (TAP), except in 4.  Faults found by hostile reviews:
#
# 1. Two report passes at once, the worker's and an earmark_report() or
#    two of those.  Pass A claims the cycle's total 10 and sends it; its
#    request is held on the way.  Usage of 5 commits.  Pass B claimed 15,
#    sent it and deleted the cycle's marks; A's request then landed, and
#    the meter held 10.  Now one sender at a time holds the database's
#    send lock: B waits for A's finish, then sends 15 (failed on 1963c3d).
# 2. earmark_report() in a statement, DO block or function that wrote
#    usage first: it sent the uncommitted total and deleted the marks; the
#    rollback took the usage and its mark, and the provider kept a total
#    over the ledger with nothing to send the ledger's again.  Now it
#    refuses (25001) in a transaction that has written.
# 3. The same for earmark_reconcile.
# 4. The worker's pass holds the send lock from its claim to its finish,
#    and gives it back (an earmark_report() waited for nothing on 1963c3d).
# 5. A repair whose transaction rolls back, while a pass sends a newer
#    total: the pass sent 18 and deleted the marks, the repair's write of
#    15 landed after it, the rollback took the repair's mark: the meter
#    stayed at 15 under a ledger of 18, unmarked (1963c3d).  Now the pass
#    waits for the repair's transaction, and sends 18 after it.
# 6. A repair that waits for a pass judges the meter read after the wait:
#    the pass's 15 landed while it waited, so the cycle matches (1963c3d
#    wrote 15 again and said "repaired" from a meter read of 10).  With a
#    lock_timeout it gives up on that cycle with a WARNING and sends
#    nothing.
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
WORK=$(mktemp -d /tmp/earmark-passes.XXXXXX)
chmod 755 "$WORK"
A_PID=
B_PID=
R_PID=
SECRET="s3cret-$RANDOM-client"

settings=(earmark.provider earmark.kinde_domain earmark.provider_client_id
          earmark.provider_secrets_file earmark.report_interval earmark.http_timeout)
cleanup() {
    [ -n "$A_PID$B_PID" ] && control '{"release": true}'
    [ -n "$A_PID" ] && wait "$A_PID" 2>/dev/null
    [ -n "$B_PID" ] && wait "$B_PID" 2>/dev/null
    [ -n "$R_PID" ] && { touch "$WORK/go"; wait "$R_PID" 2>/dev/null; }
    fake_provider_stop
    local s args=()
    for s in "${settings[@]}"; do args+=(-c "ALTER SYSTEM RESET $s"); done
    q -d postgres "${args[@]}" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

fake_provider "$WORK" --client-id earmark-test --client-secret "$SECRET"
meter() { state "int(d['kinde_meters'].get('$1|${2:-default}', -1))"; }
METER=/api/v1/billing/meter_usage
in_flight() { state "len([r for r in d['in_flight'] if r['path'] == '$METER'])"; }

printf '%s\n' "client_secret = $SECRET" >"$WORK/secrets"
as_root chown postgres "$WORK/secrets"
as_root chmod 600 "$WORK/secrets"

q -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
q -c "TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review" \
  -c "UPDATE earmark.reporter_state SET blocked_until = NULL" >/dev/null
reload_conf "ALTER SYSTEM SET earmark.provider = 'kinde'" \
            "ALTER SYSTEM SET earmark.kinde_domain = '$BASE'" \
            "ALTER SYSTEM SET earmark.provider_client_id = 'earmark-test'" \
            "ALTER SYSTEM SET earmark.provider_secrets_file = '$WORK/secrets'" \
            "ALTER SYSTEM SET earmark.report_interval = '86400'" \
            "ALTER SYSTEM SET earmark.http_timeout = '60s'" || echo "# the worker did not reload"
sleep 1

# --- 1. two passes at once ---------------------------------------------------
acct=stale_$RANDOM
q -c "SELECT earmark_set_account('$acct', NULL, 'cus_$acct', 'agr_$acct')" \
  -c "SELECT earmark_set_limit('$acct', NULL)" \
  -c "SELECT earmark_record_usage('$acct', 10, 'first')" >/dev/null
marks() { q -c "SELECT count(*) FROM earmark.meter_mark WHERE account = '$acct'"; }
is "$(marks)" 1 "the usage marked its cycle"
# sessions waiting for the send lock, by what they run
waiting() {
    q -c "SELECT count(*) FROM pg_stat_activity
           WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND query LIKE '%$1%'
             AND pid <> pg_backend_pid()"
}
# wait_until SECONDS COMMAND EXPECTED: poll a shell command's output
wait_until() {
    local deadline got
    deadline=$(wait_deadline "$1")
    while :; do
        got=$($2)
        [ "$got" == "$3" ] && break
        [ "$(date +%s)" -ge "$deadline" ] && break
        sleep 0.1
    done
    echo "$got"
}

# pass A: claims 10, its send is held on the way
control "{\"hang\": {\"count\": 1, \"seconds\": 50, \"path\": \"$METER\", \"method\": \"POST\"}}"
q -c "SELECT earmark_report()" >"$WORK/a.out" 2>&1 &
A_PID=$!
is "$(wait_until 30 in_flight 1)" 1 "pass A's send of 10 is on its way"

# usage of 5 (the committed mark is seen: no mark of its own)
q -c "SELECT earmark_record_usage('$acct', 5, 'second')" >/dev/null
is "$(marks)" 1 "the second usage inserted no mark of its own"

# pass B waits for A
q -c "SELECT earmark_report() /* pass_B */" >"$WORK/b.out" 2>&1 &
B_PID=$!
is "$(wait_until 10 "waiting pass_B" 1)" 1 "pass B waits for the send lock while pass A sends"
is "$(meter "agr_$acct")" -1 "nothing reached the meter yet"

# A's request lands; A finishes; then B claims, sends 15 and finishes
control '{"release": true}'
wait "$A_PID"; A_PID=
wait "$B_PID"; B_PID=
is "$(cat "$WORK/a.out")" 1 "pass A sent the cycle"
is "$(cat "$WORK/b.out")" 1 "pass B sent the cycle after it"
ledger=$(q -c "SELECT sum(units) FROM earmark.ledger WHERE account = '$acct'")
is "$ledger" 15 "the ledger holds 15"
is "$(meter "agr_$acct")" 15 "the meter holds the ledger's 15 once both passes are done"
is "$(marks)" 0 "no mark is left"
is "$(q -c "SELECT string_agg(total::text, ',' ORDER BY send_id) FROM earmark.meter_send
             WHERE account = '$acct'")" "10,15" "the sends were 10, then 15"


# reported_10: account $acct with usage of 10, reported (the meter holds it)
reported_10() {
    q -c "SELECT earmark_set_account('$acct', NULL, 'cus_$acct', 'agr_$acct')" \
      -c "SELECT earmark_set_limit('$acct', NULL)" \
      -c "SELECT earmark_record_usage('$acct', 10, 'first')" \
      -c "SELECT earmark_report()" >/dev/null
    is "$(meter "agr_$acct")" 10 "the meter holds the committed 10"
}

# --- 2. a report in a transaction that wrote, then rolled back ---------------
acct=own_$RANDOM
reported_10
is "$(marks)" 0 "the cycle is not marked"

# usage and a report in one statement, which then fails
q -c "DO \$\$ BEGIN
        PERFORM earmark_record_usage('$acct', 7, 'rolled-back');
        PERFORM earmark_report();
        RAISE EXCEPTION 'the application fails after its report';
      END \$\$" >/dev/null 2>&1
ledger=$(q -c "SELECT sum(units) FROM earmark.ledger WHERE account = '$acct'")
is "$ledger" 10 "the ledger holds 10 (the usage of 7 rolled back)"
q -c "SELECT earmark_report()" >/dev/null
is "$(meter "agr_$acct")" 10 "the meter holds the ledger's 10, not the 17 of usage that never committed"


# --- 3. a reconcile in a transaction that wrote, then rolled back ------------
acct=rec_$RANDOM
reported_10

# usage and a reconcile in one transaction, which then rolls back (psql
# leaves with the transaction open)
is "$(sqlstate "BEGIN" \
               "SELECT earmark_record_usage('$acct', 7, 'rolled-back')" \
               "SELECT verdict FROM earmark_reconcile('$acct')")" 25001 \
   "earmark_reconcile refuses in a transaction that has written (25001)"
ledger=$(q -c "SELECT sum(units) FROM earmark.ledger WHERE account = '$acct'")
is "$ledger" 10 "the ledger holds 10 (the usage of 7 rolled back)"
q -c "SELECT earmark_report()" >/dev/null
is "$(meter "agr_$acct")" 10 "the meter holds the ledger's 10, not the 17 of usage that never committed"
is "$(q -c "SELECT verdict FROM earmark_reconcile('$acct')")" match \
   "a reconcile on its own finds the meter equal to the ledger"


# --- 4. the worker's pass holds the send lock --------------------------------
acct=worker_$RANDOM
reported_10
reload_conf "ALTER SYSTEM SET earmark.report_interval = '1'" || echo "# the worker did not reload"
control "{\"hang\": {\"count\": 1, \"seconds\": 50, \"path\": \"$METER\", \"method\": \"POST\"}}"
q -c "SELECT earmark_record_usage('$acct', 5, 'second')" >/dev/null
is "$(wait_until 30 in_flight 1)" 1 "the worker's send of 15 is on its way"
sendlock="l.locktype = 'advisory' AND l.classid = 1701671780 AND l.objid = 0 AND l.objsubid = 3"
is "$(q -c "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
             WHERE $sendlock AND l.granted AND a.backend_type = 'earmark worker'")" 1 \
   "the worker holds the send lock while it sends"
is "$(sqlstate "SET lock_timeout = '1s'" "SELECT earmark_report()")" 55P03 \
   "an earmark_report() meanwhile waits for it (lock_timeout: 55P03)"
control '{"release": true}'
is "$(wait_for 30 "SELECT count(*) FROM pg_locks l WHERE $sendlock" 0)" 0 \
   "the worker gives the send lock back after its pass"
is "$(meter "agr_$acct")" 15 "the worker's pass sent 15"
reload_conf "ALTER SYSTEM SET earmark.report_interval = '86400'" || echo "# the worker did not reload"
is "$(sqlstate "SET lock_timeout = '5s'" "SELECT earmark_report()")" ok \
   "an earmark_report() after the worker's pass takes the lock"


# --- 5. a repair whose transaction rolls back, and a pass --------------------
acct=rollback_$RANDOM
reported_10
q -c "SELECT earmark_record_usage('$acct', 5, 'second')" >/dev/null
# the repair's write of 15 is held on the way; its transaction then waits
# for $WORK/go
control "{\"hang\": {\"count\": 1, \"seconds\": 50, \"path\": \"$METER\", \"method\": \"POST\"}}"
rm -f "$WORK/go" "$WORK/ready"
q -c "BEGIN" -c "SELECT verdict FROM earmark_reconcile('$acct')" \
  -c "\\! touch $WORK/ready; while [ ! -e $WORK/go ]; do sleep 0.1; done" \
  -c "ROLLBACK" >"$WORK/r.out" 2>&1 &
R_PID=$!
is "$(wait_until 30 in_flight 1)" 1 "the repair's write of 15 is on its way"
# usage of 3, then a pass
q -c "SELECT earmark_record_usage('$acct', 3, 'third')" >/dev/null
q -c "SELECT earmark_report() /* pass_C */" >"$WORK/c.out" 2>&1 &
A_PID=$!
is "$(wait_until 10 "waiting pass_C" 1)" 1 "the pass waits for the repair's send lock"
control '{"release": true}'
deadline=$(wait_deadline 30)
until [ -e "$WORK/ready" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.1; done
is "$(meter "agr_$acct")" 15 "the repair wrote the 15 it read"
is "$(waiting pass_C)" 1 "the pass still waits while the repair's transaction is open"
touch "$WORK/go"
wait "$R_PID"; R_PID=
wait "$A_PID"; A_PID=
is "$(head -1 "$WORK/r.out")" repaired "the reconcile repaired the cycle, then rolled back"
ledger=$(q -c "SELECT sum(units) FROM earmark.ledger WHERE account = '$acct'")
is "$ledger" 18 "the ledger holds 18"
is "$(cat "$WORK/c.out")" 1 "the pass sent the cycle after the rollback"
is "$(meter "agr_$acct")" 18 "the meter holds the ledger's 18"
is "$(marks)" 0 "no mark is left"


# --- 6. a repair that waits for a pass ---------------------------------------
acct=waits_$RANDOM
reported_10
q -c "SELECT earmark_record_usage('$acct', 5, 'second')" >/dev/null
control "{\"hang\": {\"count\": 1, \"seconds\": 50, \"path\": \"$METER\", \"method\": \"POST\"}}"
q -c "SELECT earmark_report()" >"$WORK/a.out" 2>&1 &
A_PID=$!
is "$(wait_until 30 in_flight 1)" 1 "the pass's send of 15 is on its way"
out=$(q -c "SET lock_timeout = '500ms'" -c "SELECT count(*) FROM earmark_reconcile('$acct')" 2>&1)
is "$(echo "$out" | tail -1)" 0 "a reconcile that cannot have the send lock returns no row for the cycle"
echo "$out" | grep -q 'could not reconcile the cycle of account'
ok $? "and a WARNING that names it"
is "$(q -c "SELECT count(*) FROM earmark.meter_send WHERE account = '$acct' AND origin = 'repair'")" 0 \
   "and sends nothing"
q -c "SELECT verdict, provider_total, ledger_total, repaired_to FROM earmark_reconcile('$acct')" \
  >"$WORK/r.out" 2>&1 &
R_PID=$!
is "$(wait_until 10 "waiting earmark_reconcile" 1)" 1 "a reconcile waits for the pass's send lock"
control '{"release": true}'
wait "$A_PID"; A_PID=
wait "$R_PID"; R_PID=
is "$(cat "$WORK/r.out")" "match|15|15|" "after the wait it reads the meter again: 15, a match"
is "$(q -c "SELECT count(*) FROM earmark.meter_send WHERE account = '$acct' AND origin = 'repair'")" 0 \
   "nothing was written again"

done_testing
