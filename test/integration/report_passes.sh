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
#    waits for the repair's call (not its transaction: e812c1a stopped
#    every report until it ended), sends 18 after it and leaves the cycle
#    marked, since the repair holds the cycle's mark lock to its end.
# 6. A repair that waits for a pass judges the meter read after the wait:
#    the pass's 15 landed while it waited, so the cycle matches (1963c3d
#    wrote 15 again and said "repaired" from a meter read of 10).  With a
#    lock_timeout it gives up on that cycle with a WARNING and sends
#    nothing.
# 7. A report or a repair that waits for the send lock while the cycle
#    closes: e812c1a took the time before the wait, sent the closed cycle
#    and repaired the other.  Now a closed cycle goes to review, and the
#    repair's verdict is closed_cycle_drift.
# 8. The worker logs when other senders have kept its passes out for ten
#    report intervals, and when they run again.
# 9. A repair whose cycle's counters the same call rebuilds keeps the send
#    lock until its transaction ends: a pass sends the counters' total,
#    and before the commit it would send the drifted one over the repair.
# 10. A reconcile that waits for a budget row after its repairs (another
#    transaction rebuilds that cycle) has given the send lock back.
# 11. A repair whose counters could not be rebuilt (a writer's open
#    transaction) said "repaired", though the next report sends the
#    drifted counters: now it stays under_billed, and the cause says why.
# 12. The mark after a repair waited, under the send lock, for another
#    reconcile's open transaction that rebuilt the cycle; now it is tried
#    for 100 ms, and the cycle's step fails with a WARNING.
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
# a send held on the way: longer than any wait here
HANG=$((50 * EM_WAIT_SCALE))
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
            "ALTER SYSTEM SET earmark.http_timeout = '$((60 * EM_WAIT_SCALE))s'" || echo "# the worker did not reload"
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

# hold_open END SQL...: in the background (R_PID), BEGIN, the statements
# (their rows to $WORK/r.out, messages to $WORK/r.err), then, once
# $WORK/go exists, END (COMMIT or ROLLBACK); ready waits until the
# statements have run, end_held lets the transaction end
hold_open() {
    local end=$1 s args=()
    shift
    for s in "$@"; do args+=(-c "$s"); done
    rm -f "$WORK/go" "$WORK/ready"
    q -c "BEGIN" "${args[@]}" \
      -c "\\! touch $WORK/ready; while [ ! -e $WORK/go ]; do sleep 0.1; done" \
      -c "$end" >"$WORK/r.out" 2>"$WORK/r.err" &
    R_PID=$!
}
ready() {
    local deadline
    deadline=$(wait_deadline 30)
    until [ -e "$WORK/ready" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.1; done
}
end_held() { touch "$WORK/go"; wait "$R_PID"; R_PID=; }
# hung_pass ACCOUNT TAG: a new account with a usage of 1, and an
# earmark_report() /* TAG */ in the background (A_PID) whose send of it
# is held on the way
hung_pass() {
    q -c "SELECT earmark_set_account('$1', NULL, 'cus_$1', 'agr_$1')" \
      -c "SELECT earmark_set_limit('$1', NULL)" \
      -c "SELECT earmark_record_usage('$1', 1, 'first')" >/dev/null
    control "{\"hang\": {\"count\": 1, \"seconds\": $HANG, \"path\": \"$METER\", \"method\": \"POST\"}}"
    q -c "SELECT earmark_report() /* $2 */" >"$WORK/a.out" 2>&1 &
    A_PID=$!
}

# pass A: claims 10, its send is held on the way
control "{\"hang\": {\"count\": 1, \"seconds\": $HANG, \"path\": \"$METER\", \"method\": \"POST\"}}"
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
control "{\"hang\": {\"count\": 1, \"seconds\": $HANG, \"path\": \"$METER\", \"method\": \"POST\"}}"
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
control "{\"hang\": {\"count\": 1, \"seconds\": $HANG, \"path\": \"$METER\", \"method\": \"POST\"}}"
rm -f "$WORK/c.out"
hold_open ROLLBACK "SELECT verdict FROM earmark_reconcile('$acct')"
is "$(wait_until 30 in_flight 1)" 1 "the repair's write of 15 is on its way"
# usage of 3, then a pass
q -c "SELECT earmark_record_usage('$acct', 3, 'third')" >/dev/null
q -c "SELECT earmark_report() /* pass_C */" >"$WORK/c.out" 2>&1 &
A_PID=$!
is "$(wait_until 10 "waiting pass_C" 1)" 1 "the pass waits for the send lock while the repair is written"
control '{"release": true}'
ready
# the call has ended, its transaction is open: the pass goes on
pass_out() { cat "$WORK/c.out"; }
is "$(wait_until 30 pass_out 1)" 1 "the pass sent the cycle while the repair's transaction was open"
is "$(meter "agr_$acct")" 18 "the meter holds the ledger's 18"
is "$(marks)" 1 "the pass left the cycle marked (the repair holds its mark lock)"
end_held
wait "$A_PID"; A_PID=
is "$(head -1 "$WORK/r.out")" repaired "the reconcile repaired the cycle, then rolled back"
ledger=$(q -c "SELECT sum(units) FROM earmark.ledger WHERE account = '$acct'")
is "$ledger" 18 "the ledger holds 18"
is "$(marks)" 1 "after the rollback the cycle is still marked (the usage's mark)"
is "$(q -c "SELECT earmark_report()")" 1 "the next pass sends the cycle again"
is "$(meter "agr_$acct")" 18 "the meter holds the ledger's 18"
is "$(marks)" 0 "no mark is left"
is "$(q -c "SELECT string_agg(origin || ':' || total, ',' ORDER BY send_id) FROM earmark.meter_send
             WHERE account = '$acct'")" "report:10,report:18,report:18" \
   "the sends were 10, then 18 twice (the repair's send rolled back with its log row)"


# --- 6. a repair that waits for a pass ---------------------------------------
acct=waits_$RANDOM
reported_10
q -c "SELECT earmark_record_usage('$acct', 5, 'second')" >/dev/null
control "{\"hang\": {\"count\": 1, \"seconds\": $HANG, \"path\": \"$METER\", \"method\": \"POST\"}}"
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

# --- 7. a report and a repair that wait across a cycle's close --------------
# closing_account ACCOUNT END: an account whose cycle ends at END (its
# anchor a month before; on the 29th to the 31st, when no anchor gives
# that end, the budget row's end is set after each usage: add_usage)
closing_account() {
    if [ "$(q -c "SELECT extract(day FROM '$2'::timestamptz AT TIME ZONE 'UTC') <= 28")" = t ]; then
        q -c "SELECT earmark_set_account('$1', ('$2'::timestamptz AT TIME ZONE 'UTC' - interval '1 month') AT TIME ZONE 'UTC', 'cus_$1', 'agr_$1')" >/dev/null
    else
        diag "no anchor ends a cycle at $2: the budget row's end is set"
        q -c "SELECT earmark_set_account('$1', NULL, 'cus_$1', 'agr_$1')" >/dev/null
    fi
    q -c "SELECT earmark_set_limit('$1', NULL)" >/dev/null
}
add_usage() {   # add_usage ACCOUNT UNITS KEY END
    q -c "SELECT earmark_record_usage('$1', $2, '$3')" \
      -c "UPDATE earmark.budget SET cycle_end = '$4' WHERE account = '$1' AND cycle_end > '$4'" >/dev/null
}
held=held_$RANDOM
c1=closes1_$RANDOM
c2=closes2_$RANDOM
# pass B claims the oldest mark: no other is left
q -c "TRUNCATE earmark.meter_mark" >/dev/null
end=$(q -c "SELECT date_trunc('second', now()) + interval '$((12 * EM_WAIT_SCALE)) seconds'")
closing_account "$c1" "$end"
closing_account "$c2" "$end"
add_usage "$c2" 10 first "$end"
q -c "SELECT earmark_report()" >/dev/null
is "$(meter "agr_$c2")" 10 "the second account's meter holds its 10"
# pass A: sends another account's cycle, held on the way
hung_pass "$held" pass_A
is "$(wait_until 30 in_flight 1)" 1 "pass A's send is on its way"
# usage in both closing cycles after A's claim: the first marked, the
# second marked and 5 over its meter
add_usage "$c1" 10 first "$end"
add_usage "$c2" 5 second "$end"
is "$(q -c "SELECT count(*) FROM earmark.budget WHERE account IN ('$c1', '$c2') AND cycle_end = '$end'")" 2 \
   "both cycles end at $end"
q -c "SELECT earmark_report(1) /* pass_B */" >"$WORK/b.out" 2>&1 &
B_PID=$!
q -c "SELECT verdict, provider_total, ledger_total, repaired_to FROM earmark_reconcile('$c2')" \
  >"$WORK/r.out" 2>&1 &
R_PID=$!
is "$(wait_until 10 "waiting pass_B" 1)" 1 "a report waits for the send lock"
is "$(wait_until 10 "waiting earmark_reconcile" 1)" 1 "a reconcile that would repair waits for it too"
closed() { q -c "SELECT now() >= '$end'"; }
is "$(wait_until 30 closed t)" t "the cycles have closed"
is "$(waiting pass_B)$(waiting earmark_reconcile)" 11 "both still wait"
control '{"release": true}'
wait "$A_PID"; A_PID=
wait "$B_PID"; B_PID=
wait "$R_PID"; R_PID=
is "$(cat "$WORK/b.out")" 0 "the report sent nothing (failed on e812c1a)"
is "$(meter "agr_$c1")" -1 "the closed cycle's meter was not written"
is "$(q -c "SELECT ledger_total FROM earmark.review_list WHERE account = '$c1'")" 10 \
   "the closed cycle is on the review list"
is "$(cat "$WORK/r.out")" "closed_cycle_drift|10|15|" \
   "the reconcile judged the cycle closed, read after the wait (failed on e812c1a)"
is "$(meter "agr_$c2")" 10 "and did not write it"
is "$(q -c "SELECT count(*) FROM earmark.meter_send WHERE account = '$c2' AND origin = 'repair'")" 0 \
   "no repair was sent"


# --- 8. the worker says when other senders keep its passes out ---------------
acct=kept_out_$RANDOM
log_from=$(($(wc -l <"$EM_BASE/server.log") + 1))
logged() { tail -n "+$log_from" "$EM_BASE/server.log" | grep -c "$1"; }
hung_pass "$acct" pass_D
is "$(wait_until 30 in_flight 1)" 1 "an earmark_report() holds the send lock while its send is held"
is "$(q -c "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
             WHERE $sendlock AND l.granted AND a.query LIKE '%pass_D%'")" 1 \
   "(it is the session that holds the lock)"
# only now the worker reports every second
reload_conf "ALTER SYSTEM SET earmark.report_interval = '1'" || echo "# the worker did not reload"
no_pass() { logged "no report pass has run for"; }
is "$(wait_until 60 no_pass 1)" 1 "the worker logs that no pass has run"
secs=$(tail -n "+$log_from" "$EM_BASE/server.log" | sed -n 's/.*no report pass has run for \([0-9]*\) s.*/\1/p' | head -1)
ok "$(( ${secs:-0} >= 10 ? 0 : 1 ))" "after ten report intervals at least (it says $secs s)"
control '{"release": true}'
wait "$A_PID"; A_PID=
again() { logged "the report passes run again after"; }
is "$(wait_until 30 again 1)" 1 "and logs once when its passes run again"
reload_conf "ALTER SYSTEM SET earmark.report_interval = '86400'" || echo "# the worker did not reload"


# --- 9. a repair whose cycle's counters are rebuilt, and a pass --------------
# A pass sends the counters' total; the rebuild's is seen once the
# reconcile commits: the reconcile keeps the send lock until then.
acct=drift_$RANDOM
reported_10
q -c "SELECT earmark_record_usage('$acct', 5, 'second')" \
  -c "UPDATE earmark.budget SET used = used + 7 WHERE account = '$acct'" >/dev/null
is "$(q -c "SELECT used FROM earmark_budget('$acct')")" 22 "the counters say 22 (the ledger 15)"
rm -f "$WORK/c.out"
hold_open COMMIT "SELECT verdict, counters_rebuilt FROM earmark_reconcile('$acct')"
ready
is "$(meter "agr_$acct")" 15 "the repair wrote the ledger's 15"
q -c "SELECT earmark_report() /* pass_E */" >"$WORK/c.out" 2>&1 &
A_PID=$!
is "$(wait_until 10 "waiting pass_E" 1)" 1 "a pass waits while the rebuild is not committed"
is "$(meter "agr_$acct")" 15 "the meter keeps the repair's 15 (a pass would have sent 22)"
end_held
wait "$A_PID"; A_PID=
is "$(head -1 "$WORK/r.out")" "repaired|t" "the reconcile repaired the cycle and rebuilt its counters"
is "$(cat "$WORK/c.out")" 1 "after the commit the pass sent the cycle"
is "$(meter "agr_$acct")" 15 "the meter holds the ledger's 15"
is "$(marks)" 0 "no mark is left"


# --- 10. a reconcile that waits for a row lock after its repairs -------------
# Cycle x's counters are rebuilt by an open reconcile (which holds x's
# budget row); a second reconcile repairs y, then waits for x's row to
# rebuild it again: it gave the send lock back before that wait.
F=f_$RANDOM
x=rx_$RANDOM
y=ry_$RANDOM
for acct in "$x" "$y"; do
    q -c "SELECT earmark_set_account('$acct', NULL, 'cus_$acct', 'agr_$acct')" \
      -c "SELECT earmark_set_limit('$acct', NULL, '$F')" \
      -c "SELECT earmark_record_usage('$acct', 10, 'first', '$F')" >/dev/null
done
q -c "SELECT earmark_report()" >/dev/null
q -c "UPDATE earmark.budget SET used = used + 7 WHERE account = '$x' AND feature = '$F'" \
  -c "SELECT earmark_record_usage('$y', 5, 'second', '$F')" >/dev/null
is "$(meter "agr_$x" "$F")$(meter "agr_$y" "$F")" 1010 "both meters hold 10"
hold_open COMMIT "SELECT verdict, counters_rebuilt FROM earmark_reconcile('$x', '$F')"
ready
is "$(head -1 "$WORK/r.out")" "match|t" "the first reconcile rebuilt x's counters (its transaction open)"
q -c "SELECT verdict FROM earmark_reconcile(NULL, '$F') /* r_two */ ORDER BY budget_id" >"$WORK/r2.out" 2>"$WORK/r2.err" &
B_PID=$!
row_wait() {
    q -c "SELECT count(*) FROM pg_stat_activity
           WHERE wait_event_type = 'Lock' AND wait_event = 'transactionid' AND query LIKE '%r_two%'
             AND pid <> pg_backend_pid()"
}
is "$(wait_until 30 row_wait 1)" 1 "the second reconcile waits for x's budget row"
is "$(meter "agr_$y" "$F")" 15 "after it repaired y"
is "$(q -c "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
             WHERE $sendlock AND l.granted AND a.query LIKE '%r_two%'")" 0 \
   "it does not hold the send lock while it waits"
is "$(sqlstate "SET lock_timeout = '5s'" "SELECT earmark_report()")" ok "a report runs meanwhile"
end_held
wait "$B_PID"; B_PID=
is "$(tr '\n' ' ' <"$WORK/r2.out")" "match repaired " "the second reconcile: x matches, y repaired"


# --- 11. a repair whose counters cannot be rebuilt is no repair ---------------
# A pass sends the counters' total: while they differ from the ledger, the
# next report undoes the repair.  A writer's open transaction holds the
# cycle's mark lock, so the rebuild is left for later.
acct=undone_$RANDOM
reported_10
q -c "SELECT earmark_record_usage('$acct', 5, 'second')" \
  -c "UPDATE earmark.budget SET used = used + 7 WHERE account = '$acct'" >/dev/null
hold_open ROLLBACK "SELECT earmark_record_usage('$acct', 1, 'open')"
ready
q -c "SELECT verdict, counters_rebuilt, repaired_to, read_back,
             cause LIKE '%the counters (22) could not be rebuilt%'
        FROM earmark_reconcile('$acct')" >"$WORK/r2.out" 2>"$WORK/r2.err"
end_held
is "$(cat "$WORK/r2.out")" "under_billed|f|15|15|t" \
   "the meter was written and read back, the counters were not rebuilt: under_billed, and the cause says why (repaired on e812c1a)"
grep -q "so they were not rebuilt" "$WORK/r2.err"
ok $? "a WARNING says the counters were not rebuilt"
is "$(q -c "SELECT verdict, counters_rebuilt FROM earmark_reconcile('$acct')" 2>/dev/null)" "match|t" \
   "run again once the writer is gone: the meter matches, the counters are rebuilt"
q -c "SELECT earmark_report()" >/dev/null
is "$(meter "agr_$acct")" 15 "and the next report sends the ledger's 15"


# --- 12. the mark after a repair does not wait under the send lock -----------
# An open reconcile rebuilt the cycle's counters and holds its mark lock;
# a second one repairs the meter (99 meanwhile) and cannot mark the cycle:
# it gives up on that cycle at once instead of holding the send lock until
# the first commits.
acct=markwait_$RANDOM
reported_10
q -c "UPDATE earmark.budget SET used = used + 7 WHERE account = '$acct'" >/dev/null
hold_open COMMIT "SELECT verdict, counters_rebuilt FROM earmark_reconcile('$acct')"
ready
is "$(head -1 "$WORK/r.out")" "match|t" "the first reconcile rebuilt the counters (its transaction open)"
control "{\"set_meter\": {\"agreement\": \"agr_$acct\", \"feature\": \"default\", \"value\": 99}}"
rm -f "$WORK/r2.out"
q -c "SELECT count(*) FROM earmark_reconcile('$acct') /* r_two */" >"$WORK/r2.out" 2>"$WORK/r2.err" &
B_PID=$!
r_two_out() { cat "$WORK/r2.out" 2>/dev/null; }
is "$(wait_until 30 r_two_out 0)" 0 "the second reconcile returns no row for the cycle, without waiting for the first"
is "$(sqlstate "SET lock_timeout = '5s'" "SELECT earmark_report()")" ok "a report runs meanwhile"
end_held
wait "$B_PID"; B_PID=
grep -q "the meter was repaired to 10 but the cycle could not be marked" "$WORK/r2.err"
ok $? "its WARNING says the meter was repaired and the cycle not marked"
is "$(meter "agr_$acct")" 10 "the meter holds the ledger's 10"

q -c "SELECT earmark_report()" >/dev/null
is "$(q -c "SELECT count(*) FROM earmark_check()")" 0 "at the end earmark_check() finds no violated invariant"

done_testing
