#!/usr/bin/env bash
# Checks that catch deliberate bugs no other test caught (issue 14), against
# the worker of the test cluster and test/fake_provider.py (the generic
# "http" provider, without authentication):
# - the reporter sends earmark.report_parallel requests at once (libcurl
#   multi), not one at a time: the fake holds every request 1 s and counts
#   the most open at once;
# - one report pass claims earmark.report_batch marked cycles, not one: of
#   150 marked cycles, one pass (its sends share a sent_at, the finishing
#   transaction's now()) sends 100;
# - Retry-After given as an HTTP date (RFC 9110) on a 429 is honoured: no
#   meter request before that time; a reset in seconds counts from the
#   429's answer, not from the end of the pass that got it; a hostile
#   reset blocks for a day at most, or is ignored;
# - the webhook endpoint of docs/inbox.md ("store, then answer"), run as
#   the doc prints it, answers what the doc says it answers, and a 200
#   means the event is already committed.
# The rules (a 16-of-32-byte HMAC compare, the rate limit's banked burst)
# are checked in test/pgtap/catch.sql; the counter shards' spread in
# test/integration/meter.sh (the Notch run).
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
DB=postgres
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/earmark-catch.XXXXXX)
chmod 755 "$WORK"
RUN=$(date +%s%N)      # keys of this run (the cluster may have seen an earlier one)

settings=(earmark.provider earmark.provider_url earmark.provider_secrets_file earmark.report_interval
          earmark.kinde_domain earmark.http_timeout)
reset_settings() {
    local s args=()
    for s in "${settings[@]}"; do args+=(-c "ALTER SYSTEM RESET $s"); done
    q -d postgres "${args[@]}" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
}
cleanup() {
    local p
    fake_provider_stop
    for p in $(cat "$WORK/endpoint.pids" 2>/dev/null); do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    reset_settings
    q -c "UPDATE earmark.reporter_state SET blocked_until = NULL" >/dev/null 2>&1
    q -d postgres -c "DROP ROLE IF EXISTS catch_webhooks" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

# --- the fake provider --------------------------------------------------------
fake_provider "$WORK"
marks() {  # marked cycles of the accounts LIKE $1
    q -c "SELECT count(*) FROM earmark.meter_mark WHERE account LIKE '$1'"
}

q -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
q -c "TRUNCATE earmark.meter_mark, earmark.meter_send" \
  -c "UPDATE earmark.reporter_state SET blocked_until = NULL" >/dev/null
# (reload_conf: until the worker runs with them; a new session sees them at
# once, the worker only at the top of its next round, and a worker still on
# the local provider would send (a)'s cycles to earmark.local_meter)
reload_conf "ALTER SYSTEM SET earmark.provider = 'http'" \
            "ALTER SYSTEM SET earmark.provider_url = '$BASE/generic'" \
            "ALTER SYSTEM RESET earmark.provider_secrets_file" \
            "ALTER SYSTEM RESET earmark.kinde_domain" \
            "ALTER SYSTEM SET earmark.http_timeout = '30s'" \
            "ALTER SYSTEM SET earmark.report_interval = '1s'" || echo "# the worker did not reload"
PARALLEL=$(q -c "SHOW earmark.report_parallel")
BATCH=$(q -c "SHOW earmark.report_batch")
diag "earmark.report_parallel = $PARALLEL, earmark.report_batch = $BATCH"
# new accounts with usage: one marked cycle each, all marked in one transaction
accounts() {  # accounts PREFIX N
    q -c "SELECT earmark_set_account('$1' || i), earmark_set_limit('$1' || i, NULL) FROM generate_series(1, $2) i" >/dev/null
    q -c "SELECT count(earmark_record_usage('$1' || i, 1, 'k-$RUN')) FROM generate_series(1, $2) i" >/dev/null
}
# let the worker's passes settle before each step: nothing of ours marked
wait_for 60 "SELECT count(*) FROM earmark.meter_mark" 0 >/dev/null

# --- (a) earmark.report_parallel requests in flight at once -------------------
# 3 x report_parallel cycles, each request held 1 s by the fake: a reporter
# that sends them one at a time has at most 1 open; ours has report_parallel
control '{"slow": {"ms": 1000}, "reset_concurrency": true}'
accounts catch_par_ $((3 * PARALLEL))
got=$(wait_for 120 "SELECT count(*) FROM earmark.meter_mark WHERE account LIKE 'catch_par_%'" 0)
is "$got" 0 "$((3 * PARALLEL)) marked cycles were sent"
is "$(state "d['max_concurrent']")" "$PARALLEL" \
   "the reporter had earmark.report_parallel ($PARALLEL) requests open at once, no more"
control '{"slow": {"ms": 0}}'

# --- (b) one pass sends earmark.report_batch cycles ---------------------------
# 150 cycles marked in one transaction: the first pass that sees them claims
# report_batch (100) of them; its sends are logged in one transaction, so
# they share their sent_at
accounts catch_bat_ 150
got=$(wait_for 120 "SELECT count(*) FROM earmark.meter_mark WHERE account LIKE 'catch_bat_%'" 0)
is "$got" 0 "150 marked cycles were sent"
is "$(q -c "SELECT count(*) FROM earmark.meter_send WHERE account LIKE 'catch_bat_%' AND ok")" 150 \
   "... each once"
is "$(q -c "SELECT max(n) FROM (SELECT count(*) n FROM earmark.meter_send WHERE account LIKE 'catch_bat_%' GROUP BY sent_at) x")" \
   "$BATCH" "one report pass sent earmark.report_batch ($BATCH) of them"

# --- (e) Retry-After as an HTTP date ------------------------------------------
# The fake answers the next meter write 429 with only "Retry-After: <HTTP
# date 4 s ahead>" (no RateLimit-Reset).  A reporter that cannot read the
# date waits one report interval (1 s) instead.
control '{"rate_limit": {"count": 1, "reset": 4, "retry_after": "date", "path": "/generic/meter", "method": "PUT"}}'
accounts catch_ra_ 1
got=$(wait_for 60 "SELECT count(*) FROM earmark.meter_mark WHERE account LIKE 'catch_ra_%'" 0)
is "$got" 0 "after a 429 with an HTTP-date Retry-After the cycle was sent"
is "$(q -c "SELECT string_agg(coalesce(http_status::text, '-'), ',' ORDER BY send_id) FROM earmark.meter_send WHERE account = 'catch_ra_1'")" \
   "429,200" "the send log shows the 429, then the success"
# the first meter write after the 429, against the date the 429 named
gap=$(state "(lambda puts: min([t for t, s in puts if t > [t for t, s in puts if s == 429][-1]] or [0]) - d['rate_limited_until'])([(r['t'], r['status']) for r in d['requests'] if r['path'] == '/generic/meter' and r['method'] == 'PUT'])")
ok "$(python3 -c "print(0 if $gap >= 0 else 1)")" \
   "no meter request came before the Retry-After date (the next one ${gap}s after it)"
# and the date was in the headers earmark read: blocked_until is that date
# exactly (the fallback of one report interval would be 1 s after the pass;
# a wait counted from the pass's end would be later than the date by the
# time from the answer to the end)
is "$(q -c "SELECT blocked_until = to_timestamp($(state "d['rate_limited_until']"))
              FROM earmark.reporter_state")" t \
   "reporter_state.blocked_until is the Retry-After date"

# --- (f) a reset counted from the 429's answer, not from the pass's end -------
# Two cycles in one pass: the fake answers the first meter write 429 with
# "RateLimit-Reset: 2" and holds the second 6 s, which keeps the pass open
# until then.  blocked_until is the 429's arrival plus 2 s: before the
# pass's end (its sends' sent_at, the finishing transaction's now()), where a
# reset counted from the end would put it 8 s after the 429.
control '{"rate_limit": {"count": 1, "reset": 2, "path": "/generic/meter", "method": "PUT"}, "hang": {"count": 1, "seconds": 6, "path": "/generic/meter", "method": "PUT"}}'
accounts catch_rs_ 2
got=$(wait_for 60 "SELECT count(*) FROM earmark.meter_mark WHERE account LIKE 'catch_rs_%'" 0)
is "$got" 0 "after a 429 while another request was held, both cycles were sent"
is "$(q -c "SELECT count(*) FILTER (WHERE http_status = 429) || ',' || count(DISTINCT sent_at) FILTER (WHERE send_id <= (SELECT min(send_id) + 1 FROM earmark.meter_send WHERE account LIKE 'catch_rs_%'))
              FROM earmark.meter_send WHERE account LIKE 'catch_rs_%'")" "1,1" \
   "one 429, and both first sends in one pass"
t429=$(state "[r['t'] for r in d['requests'] if r['path'] == '/generic/meter' and r['status'] == 429][-1]")
is "$(q -c "SELECT blocked_until < (SELECT sent_at FROM earmark.meter_send
                                     WHERE account LIKE 'catch_rs_%' AND http_status = 429)
              FROM earmark.reporter_state")" t \
   "blocked_until is counted from the 429's answer: before the end of the pass that got it"
is "$(q -c "SELECT blocked_until >= to_timestamp($t429 + 2) FROM earmark.reporter_state")" t \
   "... and not before the 2 s the provider asked for"

# --- (g) hostile resets: at most a day, or ignored ---------------------------
# A 429 whose reset is a huge number, a Unix time or a date far ahead, or
# seconds past a day blocks the reporter for a day after the answer at most
# (a time past PostgreSQL's range would overflow on the way); a Unix time
# already past is the answer's time; a negative value, a date already past
# or one that is no number and no date is ignored, and the pass waits one
# report interval (1 s).  10^9 is still seconds, one more a Unix time.  Of
# two headers in one answer the later time counts, whichever comes first;
# those of an interim answer before the 429 do not count.
# Each case's block, blocked_until less the 429 pass's sent_at in seconds,
# is checked against its range; then it is lifted by hand.
reset_case() {  # reset_case N HEADERS-JSON LOW HIGH [INTERIM-HEADERS-JSON]
    local got
    control "{\"answer\": {\"status\": 429, \"body\": \"{}\", \"headers\": $2, \"interim\": ${5:-null}, \"count\": 1, \"path\": \"/generic/meter\", \"method\": \"PUT\"}}"
    accounts "catch_hr$1_" 1
    wait_for 60 "SELECT count(*) FROM earmark.meter_send WHERE account = 'catch_hr$1_1' AND http_status = 429" 1 >/dev/null
    got=$(q -c "SELECT round(extract(epoch FROM blocked_until - (SELECT sent_at FROM earmark.meter_send
                                                              WHERE account = 'catch_hr$1_1' AND http_status = 429)), 1)
                FROM earmark.reporter_state")
    q -c "UPDATE earmark.reporter_state SET blocked_until = NULL" >/dev/null
    wait_for 60 "SELECT count(*) FROM earmark.meter_mark WHERE account = 'catch_hr$1_1'" 0 >/dev/null
    ok "$(python3 -c "print(0 if $3 <= float('${got:-nan}') <= $4 else 1)")" \
       "a 429 with $2 blocks the reporter ${got}s after its pass (expected $3 to $4)"
}
hostile_reset() {  # hostile_reset N HEADER VALUE LOW HIGH
    reset_case "$1" "{\"$2\": \"$3\"}" "$4" "$5"
}
hostile_reset 1 RateLimit-Reset 99999999999999999999 86390 86401
hostile_reset 2 Retry-After "Fri, 31 Dec 9999 23:59:59 GMT" 86390 86401
hostile_reset 3 Retry-After 999999 86390 86401
hostile_reset 4 RateLimit-Reset 1000000001 -10 0.5
hostile_reset 5 Retry-After -5 0.5 3
hostile_reset 6 Retry-After "soon, perhaps" 0.5 3
hostile_reset 7 Retry-After "Wed, 01 Jan 2020 00:00:00 GMT" 0.5 3
hostile_reset 8 RateLimit-Reset 1000000000 86390 86401
hostile_reset 9 RateLimit-Reset "$(( $(date +%s) + 20 ))" 1 21
reset_case 10 '{"RateLimit-Reset": "30", "Retry-After": "2"}' 27 31
reset_case 11 '{"Retry-After": "2", "RateLimit-Reset": "30"}' 27 31
# a reset in an interim answer (103) is not the 429's: one report interval
reset_case 12 '{}' 0.5 3 '{"Retry-After": "86400"}'
# two 429s in one pass (two cycles sent at once), resets of 30 s and 2 s:
# the later counts, whichever answer the pass takes last
control '{"answer": {"status": 429, "body": "{}", "headers": {"RateLimit-Reset": "30"}, "count": 1, "path": "/generic/meter", "method": "PUT"}}'
control '{"answer": {"status": 429, "body": "{}", "headers": {"RateLimit-Reset": "2"}, "count": 1, "path": "/generic/meter", "method": "PUT"}}'
accounts catch_r2_ 2
wait_for 60 "SELECT count(*) FROM earmark.meter_send WHERE account LIKE 'catch_r2_%' AND http_status = 429" 2 >/dev/null
got=$(q -c "SELECT count(DISTINCT sent_at) || ',' || round(extract(epoch FROM (SELECT blocked_until FROM earmark.reporter_state) - max(sent_at)), 1)
              FROM earmark.meter_send WHERE account LIKE 'catch_r2_%' AND http_status = 429")
q -c "UPDATE earmark.reporter_state SET blocked_until = NULL" >/dev/null
wait_for 60 "SELECT count(*) FROM earmark.meter_mark WHERE account LIKE 'catch_r2_%'" 0 >/dev/null
ok "$(python3 -c "n, b = '$got'.split(','); print(0 if n == '1' and 27 <= float(b or 'nan') <= 31 else 1)")" \
   "two 429s in one pass, resets of 30 s and 2 s: the later counts (passes, block: $got)"

# --- (h) the webhook endpoint of docs/inbox.md, as printed --------------------
# The doc's Python block, run unchanged; each answer the doc lists is checked,
# and that a 200 means "stored": the event is committed when the answer
# arrives (read at once from another session, no waiting).
awk '/^## An endpoint in front of earmark/ {s = 1} s && /^```python$/ {p = 1; next} p && /^```$/ {exit} p' \
    "$ROOT/docs/inbox.md" >"$WORK/webhook_endpoint.py"
ok "$(grep -q 'def do_POST' "$WORK/webhook_endpoint.py"; echo $?)" "the endpoint's code was taken from docs/inbox.md"
q -c "DROP ROLE IF EXISTS catch_webhooks" -c "CREATE ROLE catch_webhooks LOGIN IN ROLE earmark_user" >/dev/null
SECRET="whsec_$(head -c 32 /dev/urandom | base64)"
q -c "DELETE FROM earmark.webhook_secret WHERE source = 'catchsrc'" \
  -c "DELETE FROM earmark.inbox_receipt WHERE event_id IN (SELECT event_id FROM earmark.inbox_event WHERE source = 'catchsrc')" \
  -c "DELETE FROM earmark.inbox_event WHERE source = 'catchsrc'" \
  -c "SELECT earmark_inbox_set_secret('catchsrc', '$SECRET')" >/dev/null
# the doc's dependency is Debian's python3-psycopg2, in the system's python
PY=python3
python3 -c 'import psycopg2' 2>/dev/null || PY=/usr/bin/python3
$PY -c 'import psycopg2' 2>/dev/null
ok $? "psycopg2 can be imported ($PY)"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start_endpoint() {  # start_endpoint DSN: the endpoint's base URL
    local port
    port=$(free_port)
    EARMARK_DSN="$1" PORT=$port $PY "$WORK/webhook_endpoint.py" >>"$WORK/endpoint.log" 2>&1 &
    echo $! >>"$WORK/endpoint.pids"
    for i in $(seq 1 300); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && break
        sleep 0.1
    done
    echo "http://127.0.0.1:$port"
}
EP=$(start_endpoint "dbname=postgres user=catch_webhooks")
# deliver PATH ID TS BODY [SIGNED-BODY]: "status text" of the endpoint's answer
deliver() {
    local sig
    sig=$(python3 -c 'import base64, hashlib, hmac, sys
key = base64.b64decode(sys.argv[1][len("whsec_"):])
msg = ("%s.%s.%s" % (sys.argv[2], sys.argv[3], sys.argv[4])).encode()
print("v1," + base64.b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode())' \
        "$SECRET" "$2" "$3" "${5-$4}")
    answer -H "webhook-id: $2" -H "webhook-timestamp: $3" -H "webhook-signature: $sig" \
        --data-binary "$4" "$EP/$1"
}
answer() {  # answer CURL-ARGS...: "status text" (the text's last newline cut)
    local code
    code=$(curl -s -o "$WORK/answer" -w '%{http_code}' -X POST "$@")
    echo "$code $(cat "$WORK/answer")"
}
events() { q -c "SELECT count(*) || ' ' || coalesce(sum(seen_count), 0) FROM earmark.inbox_event WHERE source = 'catchsrc'"; }
NOW=$(date +%s)
BODY='{"type": "catch.test", "data": {"n": 1}}'
got=$(deliver catchsrc msg_catch_1 "$NOW" "$BODY")
stored=$(events)
id=$(q -c "SELECT event_id FROM earmark.inbox_event WHERE source = 'catchsrc' AND dedupe_key = 'msg_catch_1'")
is "$got" "200 stored $id" "a first delivery: 200 stored <event_id>"
is "$stored" "1 1" "... and when the 200 arrived the event was already committed"
is "$(deliver catchsrc msg_catch_1 "$NOW" "$BODY")" "200 copy of $id" "its copy: 200 copy of <event_id>"
is "$(events)" "1 2" "... stored once, seen twice"
is "$(deliver catchsrc msg_catch_2 "$NOW" '{"type": "catch.test", "data": {"n": 2}}' "$BODY")" "401 EM101" \
   "a tampered body: 401 EM101"
is "$(deliver catchsrc msg_catch_3 $((NOW - 3600)) "$BODY")" "401 EM102" "a timestamp an hour old: 401 EM102"
is "$(deliver catchsrc msg_catch_4 "$NOW" 'not json')" "400 EM103" "a body that is not JSON: 400 EM103"
is "$(deliver catchnosuchsrc msg_catch_5 "$NOW" "$BODY")" "401 EM107" "an unknown source: 401 EM107"
is "$(events)" "1 2" "none of the refused deliveries stored anything"
# a Kinde token (well formed: RS256 header with a kid) without earmark.kinde_domain
b64u() { python3 -c 'import base64, sys; print(base64.urlsafe_b64encode(sys.argv[1].encode()).decode().rstrip("="))' "$1"; }
TOKEN="$(b64u '{"alg": "RS256", "kid": "catch-key", "typ": "JWT"}').$(b64u "{\"type\": \"customer.plan_changed\", \"data\": {}, \"iat\": $NOW, \"exp\": $((NOW + 600))}").$(b64u "$(head -c 256 /dev/zero | tr '\0' x)")"
got=$(answer -H "webhook-id: msg_catch_k" --data-binary "$TOKEN" "$EP/kinde")
is "$got" "503 EM105" "a Kinde token without earmark.kinde_domain: 503 EM105"
# the database down: the endpoint's connection cannot be made
EP=$(start_endpoint "dbname=postgres user=catch_webhooks host=$WORK port=1")
is "$(deliver catchsrc msg_catch_7 "$NOW" "$BODY")" "500 database unavailable" "the database down (unreachable): 500"

done_testing
