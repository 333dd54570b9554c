#!/usr/bin/env bash
# Kinde webhooks: earmark_inbox_receive_kinde verifies a JWT signed with
# RS256 against the JSON Web Key Set that test/fake_jwks.py serves on
# loopback.  Keys are made with openssl, tokens are signed here with
# `openssl dgst -sha256 -sign`.  Checks: a valid token is stored (type,
# dedupe key = event_id, occurred_at = event_timestamp, the customer's
# account) and its copy only counted; a wrong key, a tampered payload,
# alg none / HS256, an expired exp and malformed tokens are refused with
# their SQLSTATE and store nothing; an unknown kid causes one refetch (not
# within the cooldown), and after the server rotates its keys the new key
# is accepted; earmark.jwks_path reaches /.well-known/jwks.json; an
# unreachable, slow or unset key set is "unavailable"; six tokens with
# made-up kids over six connections make at most one key set request (the
# cooldown is in shared memory), and the set such a token fetched verifies a
# genuine token with a new key on another connection within the cooldown
# (the set is shared too); a stored event is verified by kinde_jwt.
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
DB=postgres
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/earmark-jwt.XXXXXX)
SERVER_PIDS=()

cleanup() {
    local p
    for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    q -d postgres -c "ALTER SYSTEM RESET earmark.kinde_domain" -c "ALTER SYSTEM RESET earmark.jwks_path" \
      -c "ALTER SYSTEM RESET earmark.jwks_refresh" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

# --- helpers -------------------------------------------------------------
b64url() { basenc --base64url -w0 | tr -d '='; }

# jwk PEM KID: the public key as a JWK (n and e base64url, big-endian)
jwk() {
    local mod exp
    mod=$(openssl rsa -in "$1" -noout -modulus 2>/dev/null | sed 's/^Modulus=//')
    exp=$(openssl rsa -in "$1" -noout -text 2>/dev/null | sed -n 's/^publicExponent: \([0-9]*\).*/\1/p')
    python3 - "$mod" "$exp" "$2" <<'EOF'
import base64, json, sys
mod, exp, kid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
n = bytes.fromhex(mod)
e = exp.to_bytes((exp.bit_length() + 7) // 8, "big")
print(json.dumps({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": b64(n), "e": b64(e)}))
EOF
}

# serve_jwks FILE PATH [DELAY]: start fake_jwks.py; sets PORT and HITS
serve_jwks() {
    local name=$WORK/srv$RANDOM deadline
    python3 "$ROOT/test/fake_jwks.py" --file "$1" --path "$2" --port-file "$name.port" \
        --log "$name.log" --delay "${3:-0}" &
    SERVER_PIDS+=($!)
    # (a loaded machine may take seconds to start python)
    deadline=$(wait_deadline 60)
    until [ -s "$name.port" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.1; done
    PORT=$(cat "$name.port")
    HITS=$name.log
    touch "$HITS"
}
hits() { wc -l <"$1" | tr -d ' '; }

# jwt KEY KID PAYLOAD [ALG]: a compact JWS of PAYLOAD signed with KEY
jwt() {
    local h p s
    h=$(printf '{"alg":"%s","kid":"%s","typ":"JWT"}' "${4:-RS256}" "$2" | b64url)
    p=$(printf '%s' "$3" | b64url)
    s=$(printf '%s.%s' "$h" "$p" | openssl dgst -sha256 -sign "$1" -binary | b64url)
    echo "$h.$p.$s"
}

receive() { echo "SELECT event_id || ' ' || inserted FROM earmark_inbox_receive_kinde('$1', '$2')"; }
kinde_events() { q -d "$DB" -c "SELECT count(*) || '/' || coalesce(sum(seen_count), 0) FROM earmark.inbox_event WHERE source = 'kinde'"; }

# set_domain URL: earmark.kinde_domain for every session.  The worker's
# refresh is off meanwhile (earmark.jwks_refresh = 0, and the worker runs
# with it before it sees the domain): it fetches a set that is missing
# once a minute, and on a slow machine that minute may come before a
# delivery stored the set, a fetch the steps counting the key server's
# requests do not expect.  Step 12 turns it on.
set_domain() {
    reload_conf "ALTER SYSTEM SET earmark.jwks_refresh = 0"
    reload_conf "ALTER SYSTEM SET earmark.kinde_domain = '$1'"
}

# --- set-up ----------------------------------------------------------------
q -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
q -d "$DB" -c "TRUNCATE earmark.jwks" \
  -c "DELETE FROM earmark.inbox_event WHERE source = 'kinde'" \
  -c "SELECT earmark_set_account('acct_kinde', provider_customer => 'customer_0198abc')" >/dev/null

for k in k1 k2 k3; do
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$WORK/$k.pem" 2>/dev/null
done
echo "{\"keys\": [$(jwk "$WORK/k1.pem" k1)]}" >"$WORK/jwks.json"

serve_jwks "$WORK/jwks.json" /.well-known/jwks
A_PORT=$PORT
A_HITS=$HITS
set_domain "http://127.0.0.1:$A_PORT"
diag "JWKS on 127.0.0.1:$A_PORT"

# (exp a day ahead: no step may be slow enough to pass it)
now=$(date +%s)
EVENT='{"type":"customer.plan_changed","event_id":"event_01a1","timestamp":"2026-10-21T02:29:24.481368869+11:00","event_timestamp":"2026-10-21T02:29:23.403633+11:00","source":"admin","data":{"user_id":"kp_4940","customer_id":"customer_0198abc","plan":{"key":"customer_pro_plan"}},"exp":'$((now + 86400))'}'
GOOD=$(jwt "$WORK/k1.pem" k1 "$EVENT")

# 1. a valid token: fetched key set, stored event
got=$(q -d "$DB" -c "$(receive wh_1 "$GOOD")")
is "${got#* }" true "a valid token is stored (inserted = true)"
is "${got% *}" "$(q -d "$DB" -c "SELECT event_id FROM earmark.inbox_event WHERE source = 'kinde' AND dedupe_key = 'event_01a1'")" \
   "... and the event_id returned is the stored event's"
is "$(hits "$A_HITS")" 1 "the key set was fetched once, on demand"
is "$(q -d "$DB" -c "SET TIME ZONE 'UTC'" -c "SELECT dedupe_key || '|' || event_type || '|' || occurred_at || '|' || account || '|' || (payload->'data'->'plan'->>'key') FROM earmark.inbox_event WHERE source = 'kinde'")" \
   "event_01a1|customer.plan_changed|2026-10-20 15:29:23.403633+00|acct_kinde|customer_pro_plan" \
   "dedupe key = event_id, type, occurred_at = event_timestamp, the customer's account, the claims as payload"
is "$(q -d "$DB" -c "SELECT coalesce(verified_by, '<unverified>') FROM earmark.inbox_event WHERE source = 'kinde' AND dedupe_key = 'event_01a1'")" \
   kinde_jwt "the event is recorded as verified by the Kinde JWT intake"
is "$(q -d "$DB" -c "SELECT jsonb_array_length(keys) || ' ' || (keys->0->>'kid') FROM earmark.jwks WHERE url = 'http://127.0.0.1:$A_PORT/.well-known/jwks'")" "1 k1" \
   "the key set is cached in earmark.jwks under its URL"

# 2. the same delivery again (another webhook-id): counted, not stored twice
is "$(q -d "$DB" -c "$(receive wh_1_retry "$GOOD")" | cut -d' ' -f2)" false "a copy is not inserted"
is "$(kinde_events)" "1/2" "one event, seen twice"
is "$(hits "$A_HITS")" 1 "a known kid is verified from the cache"

# 3. without event_id the webhook-id is the key; without event_timestamp,
#    timestamp is the time; an unknown customer has no account
EV2='{"type":"user.created","timestamp":"2026-10-21T02:29:24+11","data":{"customer_id":"customer_unknown"}}'
q -d "$DB" -c "$(receive wh_noevent "$(jwt "$WORK/k1.pem" k1 "$EV2")")" >/dev/null
is "$(q -d "$DB" -c "SET TIME ZONE 'UTC'" -c "SELECT event_type || '|' || occurred_at || '|' || coalesce(account, '<null>') FROM earmark.inbox_event WHERE source = 'kinde' AND dedupe_key = 'wh_noevent'")" \
   "user.created|2026-10-20 15:29:24+00|<null>" "no event_id: keyed by webhook-id; timestamp used; unknown customer has no account"

# 4. refused tokens: each error has its SQLSTATE and stores nothing
before=$(kinde_events)
H=$(echo "$GOOD" | cut -d. -f1)
P=$(echo "$GOOD" | cut -d. -f2)
S=$(echo "$GOOD" | cut -d. -f3)
TAMPERED="$H.$(printf '%s' "${EVENT/customer_pro_plan/customer_free_plan}" | b64url).$S"
NONE="$(printf '{"alg":"none","kid":"k1"}' | b64url).$P."
HS="$(printf '{"alg":"HS256","kid":"k1"}' | b64url).$P.$(printf '%s' "$(printf '{"alg":"HS256","kid":"k1"}' | b64url).$P" | openssl dgst -sha256 -hmac "$(jwk "$WORK/k1.pem" k1)" -binary | b64url)"
EXPIRED=$(jwt "$WORK/k1.pem" k1 "${EVENT/\"exp\":$((now + 86400))/\"exp\":$((now - 10))}")
NOKID="$(printf '{"alg":"RS256"}' | b64url).$P.$S"
NOTYPE=$(jwt "$WORK/k1.pem" k1 '{"event_id":"e_notype"}')
NOTJSON=$(jwt "$WORK/k1.pem" k1 'type=user.created')
BADTIME=$(jwt "$WORK/k1.pem" k1 '{"type":"a","event_id":"e_badtime","event_timestamp":"2026-02-30T00:00:00Z"}')
is "$(sqlstate "$(receive wh_x "$(jwt "$WORK/k3.pem" k1 "$EVENT")")")" EM101 "signed by another key under kid k1: EM101"
is "$(sqlstate "$(receive wh_x "$TAMPERED")")" EM101 "tampered payload: EM101"
is "$(sqlstate "$(receive wh_x "$NONE")")" EM101 "alg none: EM101"
is "$(sqlstate "$(receive wh_x "$HS")")" EM101 "HS256 keyed with the public key: EM101"
is "$(sqlstate "$(receive wh_x "$EXPIRED")")" EM106 "exp in the past: EM106"
is "$(sqlstate "$(receive wh_x "$H.$P.${S:0:20}")")" EM101 "truncated signature: EM101"
is "$(sqlstate "$(receive wh_x "$H.$P.$S!")")" EM103 "signature not base64url: EM103"
is "$(sqlstate "$(receive wh_x "$H.$P")")" EM103 "two parts: EM103"
is "$(sqlstate "$(receive wh_x "$H.$P.$S.$S")")" EM103 "four parts: EM103"
is "$(sqlstate "$(receive wh_x "$(printf 'not json' | b64url).$P.$S")")" EM103 "header not JSON: EM103"
is "$(sqlstate "$(receive wh_x "$NOKID")")" EM103 "header without kid: EM103"
is "$(sqlstate "$(receive wh_x "$NOTYPE")")" EM103 "signed payload without type: EM103"
is "$(sqlstate "$(receive wh_x "$NOTJSON")")" EM103 "signed payload not JSON: EM103"
is "$(sqlstate "$(receive wh_x "$BADTIME")")" EM103 "signed payload with an impossible date: EM103"
is "$(sqlstate "$(receive wh_x '')")" 22023 "empty token: 22023"
is "$(sqlstate "SELECT earmark_inbox_receive_kinde(NULL, '$GOOD')")" 22004 "NULL webhook_id: 22004"
is "$(sqlstate "SELECT earmark_inbox_receive_kinde('w', repeat('a', 1048577))")" 22001 "token over 1 MB: 22001"
is "$(kinde_events)" "$before" "no refused token stored anything"
is "$(hits "$A_HITS")" 1 "no refused token fetched the key set"
FUTURE=$(jwt "$WORK/k1.pem" k1 '{"type":"a","event_id":"e_exp_ok","exp":'$((now + 86400))'}')
is "$(sqlstate "$(receive wh_y "$FUTURE")")" ok "exp in the future is accepted"

# 5. an unknown kid: within the cooldown no fetch; with none, one refetch
#    that still does not have it.  (The cooldown is an hour here: the
#    default 30 s may have run out since the fetch in step 1 on a slow
#    machine.)
K2_EVENT='{"type":"customer.plan_changed","event_id":"event_k2","event_timestamp":"2026-10-22T00:00:00Z"}'
K2=$(jwt "$WORK/k2.pem" k2 "$K2_EVENT")
is "$(sqlstate "SET earmark.jwks_refetch_cooldown = '1h'" "$(receive wh_k2 "$K2")")" EM104 "unknown kid within the refetch cooldown: EM104"
is "$(hits "$A_HITS")" 1 "... and the key set was not fetched again"
is "$(sqlstate "SET earmark.jwks_refetch_cooldown = 0" "$(receive wh_k2 "$K2")")" EM104 "unknown kid, refetched, still unknown: EM104"
is "$(hits "$A_HITS")" 2 "... after exactly one refetch"

# 6. the server rotates its keys: the new kid is fetched once and accepted.
#    The first k2 delivery of the session is tampered: it fetches the new
#    set and fails, which rolls the stored set back; the backend keeps its
#    copy, so the genuine delivery after it needs no second fetch.
echo "{\"keys\": [$(jwk "$WORK/k1.pem" k1), $(jwk "$WORK/k2.pem" k2)]}" >"$WORK/jwks.json"
K2_TAMPERED="$(echo "$K2" | cut -d. -f1).$(printf '%s' "${K2_EVENT/event_k2/event_k2x}" | b64url).$(echo "$K2" | cut -d. -f3)"
out=$("$EM_PGBIN/psql" -X -A -t -q -d "$DB" -c "SET earmark.jwks_refetch_cooldown = 0" \
      -c "$(receive wh_k2 "$K2_TAMPERED")" -c "$(receive wh_k2 "$K2")" 2>&1)
diag "$out"
is "$(echo "$out" | grep -c 'JWT signature does not match')" 1 "after the rotation a tampered k2 token is refused"
is "$(echo "$out" | grep -c ' true$')" 1 "... and the genuine one after it, in the same session, is accepted"
is "$(hits "$A_HITS")" 3 "... after one refetch between them"
is "$(q -d "$DB" -c "SELECT dedupe_key FROM earmark.inbox_event WHERE source = 'kinde' AND dedupe_key = 'event_k2'")" event_k2 "the k2 event is stored"
K2B=$(jwt "$WORK/k2.pem" k2 '{"type":"a","event_id":"event_k2b"}')
is "$(sqlstate "$(receive wh_k2b "$K2B")")" ok "the next k2 token is verified from the cache"
is "$(hits "$A_HITS")" 3 "... without a fetch"

# 7. earmark_refresh_jwks fetches now and counts the keys
is "$(q -d "$DB" -c "SELECT earmark_refresh_jwks()")" 2 "earmark_refresh_jwks() returns the number of keys"
is "$(hits "$A_HITS")" 4 "... after one fetch"

# 8. /.well-known/jwks.json through earmark.jwks_path
serve_jwks "$WORK/jwks.json" /.well-known/jwks.json
B_PORT=$PORT
B_HITS=$HITS
is "$(sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$B_PORT/'" "$(receive wh_b "$(jwt "$WORK/k1.pem" k1 '{"type":"a","event_id":"event_b"}')")")" EM105 \
   "the default path on a server that serves jwks.json: EM105 (404)"
is "$(sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$B_PORT/'" "SET earmark.jwks_path = '/.well-known/jwks.json'" \
                "$(receive wh_b "$(jwt "$WORK/k1.pem" k1 '{"type":"a","event_id":"event_b"}')")")" ok \
   "earmark.jwks_path = '/.well-known/jwks.json' works"
is "$(sed -n 2p "$B_HITS")" "GET /.well-known/jwks.json 200" "... fetched from /.well-known/jwks.json"

# 9. unavailable key sets
FREE=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
before=$(kinde_events)
T3=$(jwt "$WORK/k1.pem" k1 '{"type":"a","event_id":"event_down"}')
is "$(sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$FREE'" "$(receive wh_down "$T3")")" EM105 "nothing listening: EM105"
echo '{"no keys": true}' >"$WORK/notjwks.json"
serve_jwks "$WORK/notjwks.json" /.well-known/jwks
is "$(sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$PORT'" "$(receive wh_down "$T3")")" EM105 "a document without keys: EM105"
# (a server that answers after 10 minutes: only the timeout ends the wait)
serve_jwks "$WORK/jwks.json" /.well-known/jwks 600
is "$(sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$PORT'" "SET earmark.http_timeout = '500ms'" "$(receive wh_down "$T3")" 2>"$WORK/slow.err")" EM105 \
   "a server slower than earmark.http_timeout: EM105"
# the error's detail is curl's: "Operation timed out after N milliseconds"
# (or, where resolving 127.0.0.1 took that long, as under valgrind, "Failed
# to resolve host ... with timeout after N ms"), N about 500 (the setting)
# and below the default 5000 that would end it had the setting not been
# used.  curl truncates the elapsed time to whole milliseconds and its
# clock may start a moment after the timer's: it has printed 499, so the
# floor is 450 (a timeout ended by anything but the setting is far off)
grep 'DETAIL' "$WORK/slow.err"
n=$(sed -n 's/.*DETAIL:  .*\(timed out\|timeout\) after \([0-9]*\) \(ms\|milliseconds\).*/\2/p' "$WORK/slow.err" | head -1)
ok "$([ -n "$n" ] && [ "$n" -ge 450 ] && [ "$n" -lt 5000 ]; echo $?)" \
   "... ended by earmark.http_timeout (timed out after ${n:-?} ms), not by an answer or the default"
is "$(sqlstate "SET earmark.kinde_domain = ''" "$(receive wh_down "$T3")")" EM105 "earmark.kinde_domain not set: EM105"
is "$(sqlstate "SET earmark.kinde_domain = 'file:///etc'" "SET earmark.jwks_path = 'passwd'" "$(receive wh_down "$T3")")" EM105 \
   "a file: URL is not fetched: EM105"
is "$(kinde_events)" "$before" "an unavailable key set stores nothing"

# 10. privileges: earmark_user receives; only superusers choose the domain
q -d "$DB" -c "DROP ROLE IF EXISTS em_jwt_user" -c "CREATE ROLE em_jwt_user IN ROLE earmark_user" >/dev/null
T4=$(jwt "$WORK/k1.pem" k1 '{"type":"a","event_id":"event_role"}')
is "$(sqlstate "SET ROLE em_jwt_user" "$(receive wh_role "$T4")")" ok "a role with earmark_user receives a Kinde webhook"
is "$(sqlstate "SET ROLE em_jwt_user" "SET earmark.kinde_domain = 'http://127.0.0.1:1'")" 42501 "it cannot point earmark.kinde_domain elsewhere"
is "$(sqlstate "SET ROLE em_jwt_user" "SELECT earmark_refresh_jwks()")" 42501 "nor call earmark_refresh_jwks"
q -d "$DB" -c "DROP ROLE em_jwt_user" >/dev/null

# 11. the refetch cooldown is shared by every backend: six tokens with
#     made-up kids, each on its own connection, against a key set no
#     backend has stored yet.  Each delivery fails, which rolls back any set
#     it fetched, so only shared memory remembers the fetch: one request
#     reaches the key server within earmark.jwks_refetch_cooldown (an hour
#     here, so that it cannot run out between the six connections).
serve_jwks "$WORK/jwks.json" /.well-known/jwks
F_PORT=$PORT
F_HITS=$HITS
codes=""
for i in 1 2 3 4 5 6; do
    FORGED=$(jwt "$WORK/k3.pem" "made-up-$i-$RANDOM" '{"type":"customer.plan_changed","event_id":"forged_'$i'"}')
    codes="$codes $(sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$F_PORT'" "SET earmark.jwks_refetch_cooldown = '1h'" \
                             "$(receive "wh_forged_$i" "$FORGED")" 2>/dev/null)"
done
is "$codes" " EM104 EM104 EM104 EM104 EM104 EM104" "six tokens with made-up kids on six connections: each refused (EM104)"
is "$(hits "$F_HITS")" 1 "... with one key set request among them (the first delivery's)"
is "$(q -d "$DB" -c "SELECT count(*) FROM earmark.inbox_event WHERE dedupe_key LIKE 'forged\_%'")" 0 "... and nothing stored"

# 11b. what the cooldown stands for is shared too: against a key server
#     with k1 and k2 whose set no backend has stored, a token with a
#     made-up kid fetches the set (taking the cooldown) and fails, which
#     rolls back the set it stored.  A genuine token signed with k2, on
#     another connection within the cooldown, is verified with the set that
#     fetch got, without a fetch of its own: forged tokens sent once a
#     cooldown do not keep a key the provider rotated in refused.
serve_jwks "$WORK/jwks.json" /.well-known/jwks
G_PORT=$PORT
G_HITS=$HITS
FORGED=$(jwt "$WORK/k3.pem" "made-up-$RANDOM" '{"type":"customer.note","event_id":"forged_shared"}')
is "$(sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$G_PORT'" "SET earmark.jwks_refetch_cooldown = '1h'" \
               "$(receive wh_forged_shared "$FORGED")" 2>/dev/null)" EM104 "a token with a made-up kid fetches the set and is refused (EM104)"
is "$(hits "$G_HITS")" 1 "... with one key set request"
GENUINE=$(jwt "$WORK/k2.pem" k2 '{"type":"customer.note","event_id":"event_shared_copy"}')
is "$(sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$G_PORT'" "SET earmark.jwks_refetch_cooldown = '1h'" \
               "$(receive wh_shared_copy "$GENUINE")" 2>/dev/null)" ok \
   "a genuine k2 token within that cooldown, on another connection, is stored"
is "$(hits "$G_HITS")" 1 "... without a key set request of its own"
is "$(q -d "$DB" -c "SELECT count(*) FROM earmark.inbox_event WHERE dedupe_key = 'event_shared_copy'")/$(q -d "$DB" -c "SELECT count(*) FROM earmark.jwks WHERE url = 'http://127.0.0.1:$G_PORT/.well-known/jwks'")" \
   "1/1" "... the event and the key set it was verified with are stored"

# 11c. each key set URL keeps its own shared copy: after a token with a
#     made-up kid to a first server, one to each of four more servers
#     (other databases' earmark.kinde_domain) fetches their sets too; a
#     genuine k2 token to the first, within its cooldown, is still verified
#     with the first server's set.
U_PORTS=() U_HITS=()
for i in 1 2 3 4 5; do
    serve_jwks "$WORK/jwks.json" /.well-known/jwks
    U_PORTS+=("$PORT") U_HITS+=("$HITS")
done
to_url() {  # to_url PORT WEBHOOK_ID TOKEN: ok or the SQLSTATE
    sqlstate "SET earmark.kinde_domain = 'http://127.0.0.1:$1'" "SET earmark.jwks_refetch_cooldown = '1h'" \
             "$(receive "$2" "$3")" 2>/dev/null
}
got= hit=
for i in 0 1 2 3 4; do
    got+="$(to_url "${U_PORTS[$i]}" "wh_u${i}_forged" "$(jwt "$WORK/k3.pem" "made-up-$RANDOM" "{\"type\":\"customer.note\",\"event_id\":\"forged_u$i\"}")")/"
    hit+="$(hits "${U_HITS[$i]}")/"
done
is "$got $hit" "EM104/EM104/EM104/EM104/EM104/ 1/1/1/1/1/" \
   "tokens with made-up kids to five key set URLs are refused, each URL fetched once"
is "$(to_url "${U_PORTS[0]}" wh_u1_genuine "$(jwt "$WORK/k2.pem" k2 '{"type":"customer.note","event_id":"event_two_urls"}')")" ok \
   "a genuine k2 token to the first URL, within its cooldown, is stored"
is "$(hits "${U_HITS[0]}")" 1 "... without a key set request of its own"

# 12. the worker keeps the cached key set fresh (earmark.jwks_refresh)
serve_jwks "$WORK/jwks.json" /.well-known/jwks
W_HITS=$HITS
#     (1 s, the shortest: the worker checks once a second then, and each
#     check finds the set it fetched a second ago too old; waited for by
#     the requests the key server logged)
reload_conf "ALTER SYSTEM SET earmark.kinde_domain = 'http://127.0.0.1:$PORT'" \
            "ALTER SYSTEM SET earmark.jwks_refresh = '1s'"
deadline=$(wait_deadline 120)
until [ "$(hits "$W_HITS")" -ge 2 ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.2; done
ok "$(( $(hits "$W_HITS") >= 2 ? 0 : 1 ))" "the worker fetched the key set again once the cached one was older than earmark.jwks_refresh"
reload_conf "ALTER SYSTEM RESET earmark.kinde_domain" "ALTER SYSTEM RESET earmark.jwks_refresh"

done_testing
