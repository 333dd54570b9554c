#!/usr/bin/env bash
# Review test (earmark_report, src/meter.c): earmark_report() refuses a
# transaction block (IsTransactionBlock), but not a single statement, a DO
# block or a function that also writes usage: its claim reads the
# statement's own uncommitted usage, sends that total to the provider (an
# HTTP call, outside the transaction), and its finish deletes the cycle's
# marks (its own share lock does not stop its exclusive one).  If the
# transaction then rolls back, the usage and the send's log go, and so does
# the usage's own mark; the provider keeps the total with the usage that
# never committed: over-billed, with no mark to send the ledger's total
# again.  Expected: earmark_report() refuses to run in a transaction that
# wrote (or the meter is put right by a later pass).  Failed on 9966740
# (and before); earmark_report now refuses (25001).
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
DB=postgres
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/earmark-own.XXXXXX)
chmod 755 "$WORK"
FAKE_PID=
SECRET="s3cret-$RANDOM-client"

settings=(earmark.provider earmark.kinde_domain earmark.provider_client_id
          earmark.provider_secrets_file earmark.report_interval earmark.http_timeout)
cleanup() {
    [ -n "$FAKE_PID" ] && { kill "$FAKE_PID" 2>/dev/null; wait "$FAKE_PID" 2>/dev/null; }
    local s args=()
    for s in "${settings[@]}"; do args+=(-c "ALTER SYSTEM RESET $s"); done
    q -d postgres "${args[@]}" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

python3 "$ROOT/test/fake_provider.py" --port-file "$WORK/port" --log "$WORK/requests.log" \
    --client-id earmark-test --client-secret "$SECRET" &
FAKE_PID=$!
deadline=$(wait_deadline 60)
until [ -s "$WORK/port" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.1; done
BASE="http://127.0.0.1:$(cat "$WORK/port")"
control() { curl -s -X POST "$BASE/_control" -H 'Content-Type: application/json' -d "$1" >/dev/null; }
state() { curl -s "$BASE/_state" | python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
meter() { state "int(d['kinde_meters'].get('$1|${2:-default}', -1))"; }
METER=/api/v1/billing/meter_usage

printf '%s\n' "client_secret = $SECRET" >"$WORK/secrets"
as_root chown postgres "$WORK/secrets"
as_root chmod 600 "$WORK/secrets"

q -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
q -c "TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review" \
  -c "UPDATE earmark.reporter_state SET blocked_until = NULL" >/dev/null
# the worker reports once a day: the passes here are earmark_report()'s
reload_conf "ALTER SYSTEM SET earmark.provider = 'kinde'" \
            "ALTER SYSTEM SET earmark.kinde_domain = '$BASE'" \
            "ALTER SYSTEM SET earmark.provider_client_id = 'earmark-test'" \
            "ALTER SYSTEM SET earmark.provider_secrets_file = '$WORK/secrets'" \
            "ALTER SYSTEM SET earmark.report_interval = '86400'" \
            "ALTER SYSTEM SET earmark.http_timeout = '60s'" || echo "# the worker did not reload"
sleep 1

acct=own_$RANDOM
q -c "SELECT earmark_set_account('$acct', NULL, 'cus_$acct', 'agr_$acct')" \
  -c "SELECT earmark_set_limit('$acct', NULL)" \
  -c "SELECT earmark_record_usage('$acct', 10, 'first')" \
  -c "SELECT earmark_report()" >/dev/null
is "$(meter "agr_$acct")" 10 "the meter holds the committed 10"
marks() { q -c "SELECT count(*) FROM earmark.meter_mark WHERE account = '$acct'"; }
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

done_testing
