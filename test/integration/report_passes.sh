#!/usr/bin/env bash
# The reporter against itself and its caller (src/meter.c), with a real
# HTTP provider on loopback (test/fake_provider.py) and the worker of the
# test cluster reporting only once a day, so that the passes here are
# earmark_report()'s (TAP).  Two faults found by a hostile review, each
# failing on 9966740 and before:
#
# 1. Two report passes at once: the worker's and an earmark_report(), or
#    two of those, which nothing keeps apart (only each cycle's mark lock
#    in the finish step).  Pass A claims the cycle's total 10 and sends it;
#    its request is held on the way.  Usage of 5 commits (it sees the
#    committed mark and inserts none).  Pass B claims 15, sends it, finds
#    the total unchanged and deletes the cycle's marks.  A's request then
#    lands: the meter holds 10.  A's finish sees the total moved and left
#    the marks as they were: none, so the meter stayed behind the ledger
#    until some later usage of the cycle (never, if it closed first).  Now
#    a pass that finds the total moved and no mark left marks the cycle
#    again (one_mark), and the next pass sends 15.
# 2. earmark_report() in a statement, DO block or function that wrote
#    usage first: it sent the uncommitted total and deleted the marks; the
#    rollback took the usage and its mark, and the provider kept a total
#    over the ledger with nothing to send the ledger's again.  Now it
#    refuses (25001) in a transaction that has written.
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
WORK=$(mktemp -d /tmp/earmark-passes.XXXXXX)
chmod 755 "$WORK"
A_PID=
SECRET="s3cret-$RANDOM-client"

settings=(earmark.provider earmark.kinde_domain earmark.provider_client_id
          earmark.provider_secrets_file earmark.report_interval earmark.http_timeout)
cleanup() {
    [ -n "$A_PID" ] && wait "$A_PID" 2>/dev/null
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

# pass A: claims 10, its send is held on the way
control "{\"hang\": {\"count\": 1, \"seconds\": 50, \"path\": \"$METER\", \"method\": \"POST\"}}"
q -c "SELECT earmark_report()" >"$WORK/a.out" 2>&1 &
A_PID=$!
deadline=$(wait_deadline 30)
until [ "$(in_flight)" = 1 ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.1; done
is "$(in_flight)" 1 "pass A's send of 10 is on its way"

# usage of 5 (the committed mark is seen: no mark of its own)
q -c "SELECT earmark_record_usage('$acct', 5, 'second')" >/dev/null
is "$(marks)" 1 "the second usage inserted no mark of its own"

# pass B: sends 15 and deletes the marks
is "$(q -c "SELECT earmark_report()")" 1 "pass B sent the cycle"
is "$(meter "agr_$acct")" 15 "the meter holds 15"
is "$(marks)" 0 "pass B deleted the cycle's marks"

# pass A's request lands late; A finishes
control '{"release": true}'
wait "$A_PID"
A_PID=
is "$(cat "$WORK/a.out")" 1 "pass A sent the cycle too"
is "$(meter "agr_$acct")" 10 "the meter now holds pass A's 10"
ledger=$(q -c "SELECT sum(units) FROM earmark.ledger WHERE account = '$acct'")
is "$ledger" 15 "the ledger holds 15"
is "$(marks)" 1 "the cycle whose total moved under pass A is still marked (the meter is behind)"

# a later pass puts the meter right only if the cycle is marked
q -c "SELECT earmark_report()" >/dev/null
is "$(meter "agr_$acct")" 15 "a later pass sends 15"


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

done_testing
