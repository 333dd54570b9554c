#!/usr/bin/env bash
# test/bench/meter.sh: the usage ledger's and the reporter's benchmarks, one
# command, side by side in one run on a private throwaway cluster.
#
#   sudo bash test/bench/meter.sh
#
# 1. earmark_record_usage, BENCH_CLIENTS (50) clients, BENCH_SECONDS (15)
#    each, pgbench -n -M prepared, every call a new key:
#      one account          every call on account "hot"
#      10,000 accounts      a random one of 10,000 per call
#    The ratio one/many says how much a hot account queues (the 64 counter
#    shards are there so that it does not).  Then the books: the ledger's
#    row count equals the calls pgbench counted, and each cycle's counters
#    equal its ledger (earmark_reconcile with the local provider: every
#    verdict "match" after a report).
# 2. The reporter: BENCH_CYCLES (10,000) marked cycles pushed to
#    test/fake_provider.py (Kinde's API on loopback) by one earmark_report()
#    call, once with earmark.report_parallel = 1 and once with 10, with the
#    fake answering after BENCH_LATENCY_MS (5) ms (a provider is not on
#    loopback).  Requests/s for each and the ratio; afterwards every one of
#    the fake's meters must equal its cycle's ledger total.
#
# Prints markdown tables.  About 2-3 minutes with the defaults on 2 cores.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${METER_PORT:-55462}
SECS=${BENCH_SECONDS:-15}
CLIENTS=${BENCH_CLIENTS:-50}
CYCLES=${BENCH_CYCLES:-10000}
LATENCY=${BENCH_LATENCY_MS:-5}

em_setup
em_start_cluster "$PORT" \
    "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" \
    "earmark.report_interval = '1h'" \
    "earmark.rate_limit = 0"
W=$(mktemp -d /tmp/earmark-bench-meter.XXXXXX)
chmod 755 "$W"
FAKE=
trap 'kill $FAKE 2>/dev/null; rm -rf "$W"; em_stop_cluster' EXIT
Q() { em_psql -d postgres -A -t "$@"; }

Q -c "CREATE EXTENSION earmark" \
  -c "SELECT earmark_set_account('acc' || i, NULL, 'cus' || i, 'agr' || i), earmark_set_limit('acc' || i, NULL) FROM generate_series(1, 10000) i" \
  -c "SELECT earmark_set_account('hot', NULL, 'cus_hot', 'agr_hot'), earmark_set_limit('hot', NULL)" \
  -c "CREATE SEQUENCE bench_key" >/dev/null
echo "SELECT earmark_record_usage('hot', 1, 'h' || nextval('bench_key'));" >"$W/hot.sql"
printf '%s\n' "\\set a random(1, 10000)" \
    "SELECT earmark_record_usage('acc' || :a, 1, 'm' || nextval('bench_key'));" >"$W/many.sql"

tps() {  # tps FILE: calls/s of a pgbench run (3 s warm-up first)
    "$EM_PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T 3 -f "$1" postgres >/dev/null 2>&1
    "$EM_PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$1" postgres 2>&1 |
        sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}

em_log "record_usage: one account, $CLIENTS clients, ${SECS}s"
hot=$(tps "$W/hot.sql")
em_log "record_usage: 10,000 accounts, $CLIENTS clients, ${SECS}s"
many=$(tps "$W/many.sql")

rows=$(Q -c "SELECT count(*) FROM earmark.ledger")
calls=$(Q -c "SELECT last_value FROM bench_key")
Q -c "SELECT earmark_report(20000)" >/dev/null
rt0=$(date +%s.%N)
books=$(Q -c "SELECT count(*) FILTER (WHERE verdict = 'match') || '/' || count(*) FROM earmark_reconcile()")
rt1=$(date +%s.%N)
rsecs=$(python3 -c "print(f'{$rt1 - $rt0:.1f}')")

echo
echo "## earmark_record_usage ($CLIENTS clients, ${SECS} s each, one run)"
echo
echo "| scenario | calls/s |"
echo "| --- | ---: |"
echo "| one account | $hot |"
echo "| 10,000 accounts | $many |"
echo "| ratio one / many | $(python3 -c "print(f'{$hot / $many:.2f}')") |"
echo
echo "Books: $rows ledger rows for $calls calls (warm-ups included); reconcile after a report: $books cycles match."
echo "That earmark_reconcile() (every account, the local meter) took $rsecs s."

# --- the reporter ---------------------------------------------------------------
python3 "$EM_ROOT/test/fake_provider.py" --port-file "$W/port" --log /dev/null \
    --client-id bench --client-secret bench-secret &
FAKE=$!
for i in $(seq 1 50); do [ -s "$W/port" ] && break; sleep 0.1; done
BASE="http://127.0.0.1:$(cat "$W/port")"
curl -s -X POST "$BASE/_control" -d "{\"slow\": {\"ms\": $LATENCY}}" >/dev/null
printf 'client_secret = bench-secret\n' >"$W/secrets"
em_sudo chown "$EM_PGUSER" "$W/secrets"
em_sudo chmod 600 "$W/secrets"
Q -c "ALTER SYSTEM SET earmark.provider = 'kinde'" -c "ALTER SYSTEM SET earmark.kinde_domain = '$BASE'" \
  -c "ALTER SYSTEM SET earmark.provider_client_id = 'bench'" \
  -c "ALTER SYSTEM SET earmark.provider_secrets_file = '$W/secrets'" -c "SELECT pg_reload_conf()" >/dev/null

report_rate() {  # report_rate PARALLEL: requests/s of one pass over CYCLES marks
    Q -c "ALTER SYSTEM SET earmark.report_parallel = $1" -c "SELECT pg_reload_conf()" >/dev/null
    sleep 0.5
    Q -c "DELETE FROM earmark.meter_mark" -c "INSERT INTO earmark.meter_mark (account, budget_id) SELECT account, budget_id FROM earmark.budget WHERE account LIKE 'acc%' ORDER BY budget_id LIMIT $CYCLES" >/dev/null
    local t0 t1 sent
    t0=$(date +%s.%N)
    sent=$(Q -c "SELECT earmark_report($CYCLES)")
    t1=$(date +%s.%N)
    python3 -c "print(f'{$sent} {$sent / ($t1 - $t0):.0f} {$t1 - $t0:.1f}')"
}
em_log "reporter: $CYCLES cycles, 1 request at once"
read -r s1 r1 t1 <<<"$(report_rate 1)"
em_log "reporter: $CYCLES cycles, 10 requests at once"
read -r s10 r10 t10 <<<"$(report_rate 10)"

# every meter the fake holds equals its cycle's ledger total: reconcile reads
# each one back (it would repair a difference, and say so in its verdict)
rt0=$(date +%s.%N)
wrong=$(Q -c "SELECT count(*) FILTER (WHERE verdict <> 'match') || ' of ' || count(*) FROM earmark_reconcile() WHERE account LIKE 'acc%'")
rt1=$(date +%s.%N)
rsecs=$(python3 -c "print(f'{$rt1 - $rt0:.1f}')")

echo
echo "## Reporter: $CYCLES marked cycles, one earmark_report() pass, fake provider answering after ${LATENCY} ms"
echo
echo "| requests at once | cycles sent | seconds | requests/s |"
echo "| ---: | ---: | ---: | ---: |"
echo "| 1 | $s1 | $t1 | $r1 |"
echo "| 10 | $s10 | $t10 | $r10 |"
echo "| ratio 10 / 1 | | | $(python3 -c "print(f'{$r10 / $r1:.2f}')") |"
echo
echo "Meters that differ from their ledger total afterwards (reconcile read back): $wrong; that earmark_reconcile()"
echo "(every account, each meter read from the fake provider, earmark.report_parallel = 10) took $rsecs s."
