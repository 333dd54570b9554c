#!/usr/bin/env bash
# Fault tests that really crash things (docs/design.md, "Invariants": the invariants hold
# "under concurrency and crashes"); each scenario ends with earmark_check()
# in one REPEATABLE READ snapshot, and prints any row it returns.
#
# 1. kill -9 of a backend in the middle of earmark_reserve, earmark_charge,
#    earmark_settle, earmark_record_usage (each held there by a row lock that
#    another session keeps), and of the worker in the middle of an inbox
#    handler (held by an advisory lock): the postmaster resets every backend;
#    the killed transaction left nothing (no job, no ledger row, no counter
#    or budget change), the committed work is intact, the key is free
#    again, and the inbox event is applied later, once, on its 2nd attempt.
#    (The rate limit's state is in shared memory, which the restart resets:
#    a rate limit may forget, so there is no rate state left to compare.)
# 2. pg_ctl stop -m immediate, twice, in the middle of a load run (clients
#    reserving, charging and settling on accounts with limits, recording
#    usage and receiving inbox events whose handler the worker runs); each
#    client writes down every call whose COMMIT came back; after the restart
#    every acknowledged write is there, the events are applied once each, and
#    the worker sweeps on its own a hold whose lease passed after the restart.
# 3. the worker killed with kill -9 three times while it reports to a slow
#    provider (test/fake_provider.py) that fails three requests: afterwards
#    every agreement's meter equals its ledger total and no mark is left.
# 4. a long application transaction keeps an uncommitted reserve open while
#    its lease passes: the sweeper goes on (it sweeps another account) and
#    never touches it, nothing is logged; once committed the sweeper settles
#    it as expired at the use it recorded.
#
# CRASH_LOAD_SECONDS (default 12) and CRASH_LOAD_CLIENTS (default 4) size
# the load run of scenario 2.
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
DB=postgres
P="q -d postgres"
WORK=$(mktemp -d /tmp/earmark-crash.XXXXXX)
chmod 755 "$WORK"
LOAD_SECS=${CRASH_LOAD_SECONDS:-12}
LOAD_CLIENTS=${CRASH_LOAD_CLIENTS:-4}
RUN=$(date +%s)
HOLDER=
VICTIM=
T_START=$(date +%s)

# --- helpers ------------------------------------------------------------------
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }

# The environment the server needs to start again (a sanitized build preloads
# its runtimes): the runner's EM_SERVER_ENV (tab-separated), else what the
# running postmaster was started with.
server_env() {
    if [ -n "${EM_SERVER_ENV:-}" ]; then printf '%s\n' "$EM_SERVER_ENV" | tr '\t' '\n'; return 0; fi
    local pm
    pm=$(head -1 "$EM_DATA/postmaster.pid" 2>/dev/null) || return 0
    as_root cat "/proc/$pm/environ" 2>/dev/null | tr '\0' '\n' \
        | grep -E '^(LD_PRELOAD|ASAN_OPTIONS|UBSAN_OPTIONS|LSAN_OPTIONS)=' || true
}
mapfile -t SERVER_ENV < <(server_env)
pgctl() { (cd "$EM_BASE" && as_pg env "${SERVER_ENV[@]}" "$EM_PGBIN/pg_ctl" -D "$EM_DATA" "$@"); }
# a restart starts the server the way the runner did (EM_PG_WRAPPER: under valgrind)
pgctl_start() { pgctl -l "$EM_BASE/server.log" -w -t 300 ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} start; }

server_up() {   # server_up [SECONDS]: wait until the server accepts connections
    local deadline=$(wait_deadline "${1:-120}")
    until $P -c "SELECT 1" >/dev/null 2>&1; do
        [ "$(date +%s)" -ge "$deadline" ] && return 1
        sleep 0.3
    done
}
worker_pid() { $P -c "SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE backend_type = 'earmark worker'" 2>/dev/null || echo 0; }
reinits() { grep -c "all server processes terminated; reinitializing" "$EM_BASE/server.log" 2>/dev/null; }

# after_crash REINITS-BEFORE OLD-WORKER: the postmaster noticed the crash, reset
# every backend, accepts connections again and runs a new earmark worker
after_crash() {
    local deadline=$(wait_deadline 90)
    while [ "$(reinits)" -le "$1" ]; do
        [ "$(date +%s)" -ge "$deadline" ] && { diag "no reinitialization in the server log"; return 1; }
        sleep 0.2
    done
    server_up 120 || { diag "the server does not accept connections again"; return 1; }
    wait_for 90 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND pid <> $2" 1 >/dev/null \
        || { diag "no new earmark worker"; return 1; }
}

# crash_pid PID: kill -9 a server process and wait for the cluster to be back
crash_pid() {
    local r w
    r=$(reinits)
    w=$(worker_pid)
    as_root kill -9 "$1" || return 1
    FIG_FAULTS=$((FIG_FAULTS + 1))
    after_crash "$r" "$w"
}

# reap PID...: wait for processes of ours to end (killed if they do not)
reap() {
    local p deadline=$(wait_deadline 60)
    for p in "$@"; do
        [ -n "$p" ] || continue
        while kill -0 "$p" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
        kill "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    return 0
}

# check_clean WHAT: earmark_check() finds nothing, in one snapshot; its rows
# are printed as diagnostics
check_clean() {
    local out n
    out=$($P -F ' | ' -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT count(*) FROM earmark_check()" \
             -c "SELECT * FROM earmark_check()" -c "COMMIT" 2>&1)
    n=$(printf '%s\n' "$out" | head -1)
    is "$n" 0 "$1: earmark_check() finds no violated invariant"
    printf '%s\n' "$out" | tail -n +2 | sed '/^$/d; s/^/#   earmark_check: /'
}

# The figures, printed as a table at the end: for each scenario the writes
# acknowledged to clients before or during its faults, the faults injected,
# those of the acknowledged writes found missing afterwards, and the
# scenario's failed checks.
FIG=()
FIG_FAULTS=0
fig_begin() { FIG_FAILED=$_tap_failed; FIG_FAULTS=0; }
fig_end() {     # fig_end SCENARIO ACKNOWLEDGED LOST
    FIG+=("| $1 | $2 | $FIG_FAULTS | $3 | $(( _tap_failed - FIG_FAILED )) |")
}

# start_holder -c SQL...: a session that takes a lock and keeps its
# transaction open (it dies with the crash)
start_holder() {
    PGAPPNAME=crash_holder $P -c "BEGIN" "$@" -c "SELECT pg_sleep(600)" >"$WORK/holder.out" 2>"$WORK/holder.err" &
    HOLDER=$!
    wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'crash_holder' AND query = 'SELECT pg_sleep(600)'" 1 >/dev/null
}

# start_victim -c SQL...: one transaction, committed at the end (it never is)
start_victim() {
    PGAPPNAME=crash_victim $P -c "BEGIN" "$@" -c "COMMIT" >"$WORK/victim.out" 2>"$WORK/victim.err" &
    VICTIM=$!
}

# victim_waiting LIKE: the victim's pid once it waits for the holder's lock
# in the statement given
victim_waiting() {
    wait_for 60 "SELECT count(*) FROM pg_stat_activity v, pg_stat_activity h
                  WHERE v.application_name = 'crash_victim' AND h.application_name = 'crash_holder'
                    AND v.wait_event_type = 'Lock' AND h.pid = ANY (pg_blocking_pids(v.pid))
                    AND v.query LIKE '$1'" 1 >/dev/null || return 1
    $P -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'crash_victim'"
}

# kill_victim CALL LIKE WAITING: once the victim waits (LIKE, as for
# victim_waiting), kill -9 its backend, wait for the cluster, and reap the
# holder and the victim; two assertions, "CALL: WAITING" and the restart
kill_victim() {
    local pid
    pid=$(victim_waiting "$2")
    ok $? "$1: $3"
    crash_pid "$pid"
    ok $? "$1: kill -9 of that backend; the cluster restarted with a new worker"
    reap "$HOLDER" "$VICTIM"
}

# fp ACCOUNT: every number of the account a transaction could change
fp() {
    $P -c "SELECT concat_ws(' | ',
        (SELECT string_agg(b.feature || ' used ' || b.used || ' held ' || b.held, ', ' ORDER BY b.feature)
           FROM earmark.budget b WHERE b.account = '$1'),
        (SELECT 'recorded ' || coalesce(sum(u.units), 0) FROM earmark.usage_shard u WHERE u.account = '$1'),
        (SELECT 'ledger ' || count(*) || ' rows ' || coalesce(sum(l.units), 0) FROM earmark.ledger l
           JOIN earmark.budget b USING (budget_id) WHERE b.account = '$1'),
        (SELECT 'jobs ' || string_agg(j.idempotency_key || '=' || j.status || '/' || j.used || '/'
                || coalesce(j.last_step::text, '-') || '/' || coalesce(j.charged::text, '-') || '/'
                || to_char(j.lease_until, 'HH24:MI:SS.US'), ', ' ORDER BY j.job_id)
           FROM earmark.job j WHERE j.account = '$1'))"
}

settings=(earmark.inbox_lease earmark.provider earmark.kinde_domain earmark.provider_client_id
          earmark.provider_secrets_file earmark.report_interval)
reset_settings() {
    local s args=()
    for s in "${settings[@]}"; do args+=(-c "ALTER SYSTEM RESET $s"); done
    $P "${args[@]}" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
}
set_conf() {  # set_conf NAME VALUE ...
    local args=()
    while [ $# -gt 0 ]; do args+=(-c "ALTER SYSTEM SET $1 = '$2'"); shift 2; done
    $P "${args[@]}" -c "SELECT pg_reload_conf()" >/dev/null
}

cleanup() {
    local p
    touch "$WORK/stop"
    exec 7>&- 2>/dev/null
    for p in $(jobs -p); do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    # the server may have been left down by a failure in the middle
    if ! pgctl status >/dev/null 2>&1; then
        pgctl_start >/dev/null 2>&1
    fi
    server_up 60
    reset_settings
    $P -c "SELECT earmark_inbox_set_handler(event_type, NULL) FROM earmark.inbox_handler WHERE event_type LIKE 'crash.%'" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

# --- set-up: our own accounts, events and handlers, cleaned first -------------
$P -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
$P >/dev/null <<'SQL'
SELECT earmark_inbox_set_handler(event_type, NULL) FROM earmark.inbox_handler WHERE event_type LIKE 'crash.%';
DELETE FROM earmark.inbox_event WHERE source = 'crash';
DELETE FROM earmark.ledger_entry WHERE account LIKE 'crash\_%';
DELETE FROM earmark.usage_shard WHERE account LIKE 'crash\_%';
DELETE FROM earmark.meter_mark WHERE account LIKE 'crash\_%';
DELETE FROM earmark.meter_send WHERE account LIKE 'crash\_%';
DELETE FROM earmark.meter_review WHERE account LIKE 'crash\_%';
DELETE FROM earmark.budget_slot WHERE account LIKE 'crash\_%';
DELETE FROM earmark.evidence WHERE account LIKE 'crash\_%';
DELETE FROM earmark.job WHERE account LIKE 'crash\_%';
DELETE FROM earmark.budget WHERE account LIKE 'crash\_%';
DELETE FROM earmark.local_meter WHERE account LIKE 'crash\_%';
DELETE FROM earmark.account WHERE account LIKE 'crash\_%';
DROP TABLE IF EXISTS crash_effect, crash_ack;
DROP FUNCTION IF EXISTS crash_slow(earmark.inbox_event), crash_load(earmark.inbox_event);
-- what the handlers did: one row per applied event is "once"
CREATE TABLE crash_effect (event_id bigint NOT NULL, dedupe_key text NOT NULL,
                           at timestamptz NOT NULL DEFAULT clock_timestamp());
-- the writes the load clients had acknowledged
CREATE TABLE crash_ack (client int, kind text, key text, a text, b text);
-- scenario 1: writes its effect, then waits for an advisory lock the test holds
CREATE FUNCTION crash_slow(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO crash_effect (event_id, dedupe_key) VALUES (e.event_id, e.dedupe_key);
    PERFORM pg_advisory_xact_lock(7262737);
    RETURN 'applied on attempt ' || e.attempts;
END $$;
-- scenario 2
CREATE FUNCTION crash_load(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO crash_effect (event_id, dedupe_key) VALUES (e.event_id, e.dedupe_key);
    RETURN 'done';
END $$;
SELECT earmark_inbox_set_handler('crash.slow', 'crash_slow(earmark.inbox_event)');
SELECT earmark_inbox_set_handler('crash.load', 'crash_load(earmark.inbox_event)');
SQL
# a claimed event whose worker died is claimed again once its lease passed
set_conf earmark.inbox_lease 4s
wait_for 15 "SHOW earmark.inbox_lease" 4s >/dev/null
wait_for 30 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker'" 1 >/dev/null
ok $? "the earmark worker runs"
check_clean "before any fault"

# === 1. kill -9 of a backend in the middle of each call =======================
diag "1. kill -9 in the middle of reserve, charge, settle, record_usage and an inbox handler"
fig_begin
$P -c "SELECT earmark_set_limit('crash_k', 100000)" -c "SELECT earmark_set_limit('crash_k', 100000, 'f2')" >/dev/null
J1=$($P -c "SELECT job_id FROM earmark_reserve('crash_k', 1000, 'k-j1', lease => '1 hour')")
J2=$($P -c "SELECT job_id FROM earmark_reserve('crash_k', 1000, 'k-j2', lease => '1 hour')")
J3=$($P -c "SELECT job_id FROM earmark_reserve('crash_k', 1000, 'k-j3', lease => '1 hour')")
J4=$($P -c "SELECT job_id FROM earmark_reserve('crash_k', 1000, 'k-j4', 'f2', '1 hour')")
J5=$($P -c "SELECT job_id FROM earmark_reserve('crash_k', 500, 'k-j5', lease => '1 hour')")
$P -c "SELECT charged FROM earmark_charge('crash_k', $J1, 100, 1)" -c "SELECT charged FROM earmark_charge('crash_k', $J5, 50, 1)" \
   -c "SELECT status FROM earmark_settle('crash_k', $J5)" \
   -c "SELECT earmark_record_usage('crash_k', 9, 'k-u0')" -c "SELECT earmark_record_usage('crash_k', 4, 'k-u0-f2', 'f2')" >/dev/null
BD=$($P -c "SELECT budget_id FROM earmark.budget WHERE account = 'crash_k' AND feature = 'default'")
BF=$($P -c "SELECT budget_id FROM earmark.budget WHERE account = 'crash_k' AND feature = 'f2'")
is "$($P -c "SELECT string_agg(used || '/' || held, ' ') FROM (SELECT * FROM earmark_budget('crash_k') UNION ALL SELECT * FROM earmark_budget('crash_k', 'f2')) x")" \
   "59/3000 4/1000" "committed before the faults: default used 59 (a settled job and usage), 3 holds; f2 used 4, 1 hold"

# (a) reserve: the second reserve of the transaction waits for the f2 budget row
base=$(fp crash_k)
start_holder -c "SELECT 1 FROM earmark.budget WHERE budget_id = $BF FOR UPDATE"
start_victim -c "SELECT admitted FROM earmark_reserve('crash_k', 100, 'k-res-a', lease => '1 hour')" \
             -c "SELECT admitted FROM earmark_reserve('crash_k', 200, 'k-res-b', 'f2', '1 hour')"
kill_victim reserve '%k-res-b%' "the transaction took a hold, and its second reserve waits for the budget row"
is "$(head -1 "$WORK/victim.out")" t "reserve: (its first reserve had been admitted in the transaction)"
is "$($P -c "SELECT count(*) FROM earmark.job WHERE account = 'crash_k' AND idempotency_key LIKE 'k-res-%'")" 0 \
   "reserve: the killed transaction left no job"
is "$(fp crash_k)" "$base" "reserve: no budget, counter, ledger or job change"
is "$($P -c "SELECT admitted || ' ' || coalesce(reason, 'new') FROM earmark_reserve('crash_k', 100, 'k-res-a', lease => '1 hour')")" \
   "true new" "reserve: the key is free again: a retry is a new admission"
$P -c "SELECT (earmark_settle('crash_k', job_id, 0, 'cancelled')).status FROM earmark.job WHERE account = 'crash_k' AND idempotency_key = 'k-res-a'" >/dev/null
check_clean "kill -9 in reserve"

# (b) charge: the second charge waits for the job row
base=$(fp crash_k)
start_holder -c "SELECT 1 FROM earmark.job WHERE job_id = $J2 FOR UPDATE"
start_victim -c "SELECT charged FROM earmark_charge('crash_k', $J1, 30, 2)" -c "SELECT charged FROM earmark_charge('crash_k', $J2, 40, 1)"
kill_victim charge "%earmark_charge(_crash_k_, $J2,%" "the transaction charged one job, and waits to charge another"
is "$(head -1 "$WORK/victim.out")" 30 "charge: (its first charge had been recorded in the transaction)"
is "$(fp crash_k)" "$base" "charge: no use, step or lease change on either job, nothing else changed"
is "$($P -c "SELECT charged || ' ' || room FROM earmark_charge('crash_k', $J1, 30, 2)")" "30 870" \
   "charge: step 2 was never recorded: charged now, once"
check_clean "kill -9 in charge"

# (c) settle: the second settle waits for the budget row (after its job row
# and the cycle's mark lock)
base=$(fp crash_k)
start_holder -c "SELECT 1 FROM earmark.budget WHERE budget_id = $BD FOR UPDATE"
start_victim -c "SELECT status FROM earmark_settle('crash_k', $J4, 60)" -c "SELECT status FROM earmark_settle('crash_k', $J3, 70)"
kill_victim settle "%earmark_settle(_crash_k_, $J3,%" "the transaction settled one job, and waits in the settle of another"
is "$(head -1 "$WORK/victim.out")" completed "settle: (its first settle had been done in the transaction)"
is "$($P -c "SELECT string_agg(status || ' ' || coalesce(charged::text, '-'), ', ' ORDER BY job_id) FROM earmark.job WHERE job_id IN ($J3, $J4)")" \
   "running -, running -" "settle: both jobs are still open"
is "$($P -c "SELECT count(*) FROM earmark.ledger WHERE job_id IN ($J3, $J4)")" 0 "settle: no ledger row of either job"
is "$(fp crash_k)" "$base" "settle: no budget, counter or ledger change"
is "$($P -c "SELECT charged || ' ' || released || ' ' || status FROM earmark_settle('crash_k', $J4, 60)")" "60 940 completed" \
   "settle: settled now, once"
is "$($P -c "SELECT count(*) || ' ' || sum(units) FROM earmark.ledger WHERE job_id = $J4")" "1 60" "settle: one ledger row"
check_clean "kill -9 in settle"

# (d) record_usage: the second call waits for its counter row, after it has
# inserted its ledger row (every shard of the budget is held)
$P -c "INSERT INTO earmark.usage_shard (account, budget_id, shard, units) SELECT 'crash_k', $BD, g, 0 FROM generate_series(0, 63) g ON CONFLICT DO NOTHING" >/dev/null
base=$(fp crash_k)
start_holder -c "SELECT 1 FROM earmark.usage_shard WHERE account = 'crash_k' AND budget_id = $BD FOR UPDATE"
start_victim -c "SELECT earmark_record_usage('crash_k', 5, 'k-use-a', 'f2')" -c "SELECT earmark_record_usage('crash_k', 7, 'k-use-b')"
kill_victim record_usage '%k-use-b%' "the transaction recorded usage, and waits in a second call for its counter row"
is "$(head -1 "$WORK/victim.out")" t "record_usage: (its first call had written its row in the transaction)"
is "$($P -c "SELECT count(*) FROM earmark.ledger WHERE account = 'crash_k' AND entry_key LIKE 'k-use-%'")" 0 \
   "record_usage: no ledger row of either key"
is "$(fp crash_k)" "$base" "record_usage: no counter or budget change"
is "$($P -c "SELECT earmark_record_usage('crash_k', 7, 'k-use-b')" -c "SELECT earmark_record_usage('crash_k', 7, 'k-use-b')" | paste -sd' ')" \
   "t f" "record_usage: the key is free again: recorded now, once"
check_clean "kill -9 in record_usage"

# (e) the worker, in the middle of an inbox handler: the handler has written
# its effect and waits for an advisory lock the test holds
base=$(fp crash_k)
start_holder -c "SELECT pg_advisory_xact_lock(7262737)"
EV=$($P -c "SELECT event_id FROM earmark_inbox_receive('crash', 'slow-1', 'crash.slow', '{\"n\": 1}')")
wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND wait_event_type = 'Lock' AND wait_event = 'advisory'" 1 >/dev/null
ok $? "inbox: the worker runs the handler, which waits in the middle"
is "$($P -c "SELECT status || ' ' || attempts FROM earmark.inbox_event WHERE event_id = $EV")" "processing 1" \
   "inbox: its claim (attempt 1) was committed before the handler ran"
crash_pid "$(worker_pid)"
ok $? "inbox: kill -9 of the worker; the cluster restarted with a new worker"
reap "$HOLDER"
diag "inbox: right after the restart: $($P -c "SELECT status || ', attempt ' || attempts || ', effects ' || (SELECT count(*) FROM crash_effect f WHERE f.event_id = e.event_id) FROM earmark.inbox_event e WHERE event_id = $EV")"
got=$(wait_for 90 "SELECT e.status || ' ' || e.attempts || ' ' || (SELECT count(*) FROM crash_effect f WHERE f.event_id = e.event_id) FROM earmark.inbox_event e WHERE e.event_id = $EV" "applied 2 1")
is "$got" "applied 2 1" "inbox: once its lease passed the event was applied on attempt 2, with one effect (the killed attempt's was rolled back)"
is "$($P -c "SELECT result FROM earmark.inbox_event WHERE event_id = $EV")" "applied on attempt 2" "inbox: the handler's result is kept"
is "$(fp crash_k)" "$base" "inbox: the gate's committed work is intact"
check_clean "kill -9 of the worker in a handler"
# the ten writes acknowledged before the faults: five reserves, the charges
# of J1 (100) and J5 (50), J5's settlement, two usage rows
LOST1=$($P -c "SELECT (5 - (SELECT count(*) FROM earmark.job WHERE job_id IN ($J1, $J2, $J3, $J4, $J5)))
                    + (SELECT count(*) FROM earmark.job WHERE job_id = $J1 AND used < 100)
                    + 2 * (SELECT count(*) FROM (SELECT 1) x WHERE NOT EXISTS
                             (SELECT 1 FROM earmark.ledger WHERE job_id = $J5 AND units = 50))
                    + (2 - (SELECT count(*) FROM earmark.ledger WHERE account = 'crash_k' AND
                             (entry_key, units) IN (('k-u0', 9), ('k-u0-f2', 4))))")
is "$LOST1" 0 "kill -9: none of the ten writes acknowledged before the faults is missing"
fig_end "1. kill -9 of a backend in reserve, charge, settle, record_usage; of the worker in an inbox handler" 10 "$LOST1"

# === 2. immediate shutdown during a load run ==================================
diag "2. pg_ctl stop -m immediate in the middle of a load run ($LOAD_CLIENTS clients)"
fig_begin
for i in 1 2 3 4; do echo "SELECT earmark_set_limit('crash_l$i', 20000);"; done | $P >/dev/null

# gen_batch CLIENT FIRST N: N operations, each in its own transaction; the
# key of every one whose COMMIT returned is echoed after it
gen_batch() {
    local c=$1 k r acct key
    for k in $(seq "$2" $(($2 + $3 - 1))); do
        r=$((RANDOM % 10))
        acct="crash_l$((RANDOM % 4 + 1))"
        key="$RUN-$c-$k"
        if [ $r -lt 4 ]; then
            echo "BEGIN;"
            echo "SELECT coalesce(job_id, 0) AS j, admitted AS a FROM earmark_reserve('$acct', $((RANDOM % 200 + 1)), 'R$key', lease => '3 seconds') \\gset"
            echo "COMMIT;"
            echo "\\echo $c R R$key :j :a"
            if [ $r -ne 0 ]; then       # 3 in 4 are charged and settled, the others left to their lease
                echo "\\if :a"
                echo "BEGIN;"
                echo "SELECT charged AS x FROM earmark_charge('$acct', :j, $((RANDOM % 20 + 1)), 1) \\gset"
                echo "SELECT charged AS sc, status AS ss FROM earmark_settle('$acct', :j) \\gset"
                echo "COMMIT;"
                echo "\\echo $c S :j :ss :sc"
                echo "\\endif"
            fi
        elif [ $r -lt 7 ]; then
            echo "BEGIN;"
            echo "SELECT earmark_record_usage('$acct', $((k % 9 + 1)), 'U$key') AS w \\gset"
            echo "COMMIT;"
            echo "\\echo $c U U$key $((k % 9 + 1)) :w"
        else
            echo "BEGIN;"
            echo "SELECT event_id AS e, inserted AS n FROM earmark_inbox_receive('crash', 'E$key', 'crash.load', '{\"c\": $c, \"k\": $k}') \\gset"
            echo "COMMIT;"
            echo "\\echo $c E E$key :e :n"
        fi
    done
}

# load_client N: one application session after another until told to stop
load_client() {
    local c=$1 i=0
    export PGAPPNAME=crash_load PGOPTIONS="$PGOPTIONS -c earmark.rate_limit=0"
    while [ ! -e "$WORK/stop" ]; do
        gen_batch "$c" "$i" 20 >"$WORK/batch.$c"
        i=$((i + 20))
        "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d postgres -f "$WORK/batch.$c" >>"$WORK/ack.$c" 2>>"$WORK/err.$c" \
            || sleep 0.2
    done
}
acked() { cat "$WORK"/ack.* 2>/dev/null | wc -l; }
# wait_acks N: until the clients have acknowledged N more operations (60 s
# at most, scaled by EM_WAIT_SCALE)
wait_acks() {
    local want=$(( $(acked) + $1 )) deadline=$(wait_deadline 60)
    while [ "$(acked)" -lt "$want" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
}

rm -f "$WORK/stop"
LOAD_PIDS=()
for c in $(seq 1 "$LOAD_CLIENTS"); do
    load_client "$c" &
    LOAD_PIDS+=($!)
done
FAULTS=0
T_LOAD=$(date +%s)
PRE=
for f in 1 2; do
    # a third of the run, and some new acknowledged writes, before each fault
    sleep $((LOAD_SECS / 3))
    wait_acks 20
    if [ $f -eq 2 ]; then
        # a hold that the restart interrupts (its lease is made to pass
        # after the restart, below: the worker must not sweep it before)
        PRE=$($P -c "SELECT job_id FROM earmark_reserve('crash_l1', 10, 'pre-crash-$RUN', lease => '1 hour')")
        $P -c "SELECT charged FROM earmark_charge('crash_l1', $PRE, 4)" >/dev/null
    fi
    pgctl stop -m immediate -w >/dev/null 2>&1
    ok $? "load: fault $f: pg_ctl stop -m immediate in the middle of the run"
    FAULTS=$((FAULTS + 1))
    pgctl_start >/dev/null 2>&1
    ok $? "load: fault $f: the server started again (crash recovery)"
    server_up 120
done
sleep $((LOAD_SECS / 3))
wait_acks 20
touch "$WORK/stop"
for p in "${LOAD_PIDS[@]}"; do reap "$p"; done
T_LOAD=$(( $(date +%s) - T_LOAD ))

cat "$WORK"/ack.* >"$WORK/acks" 2>/dev/null
$P -c "TRUNCATE crash_ack" -c "\\copy crash_ack FROM '$WORK/acks' WITH (DELIMITER ' ')" >/dev/null
ok $? "load: the clients' acknowledgements were read"
OPS=$($P -c "SELECT count(*) FROM crash_ack")
read -r -d '' LOST_SQL <<'SQL'
  FROM crash_ack a
 WHERE NOT CASE a.kind
   WHEN 'R' THEN (a.b = 't' AND EXISTS (SELECT 1 FROM earmark.job j
                                         WHERE j.idempotency_key = a.key AND j.job_id = a.a::bigint))
              OR (a.b = 'f' AND NOT EXISTS (SELECT 1 FROM earmark.job j WHERE j.idempotency_key = a.key))
   WHEN 'S' THEN EXISTS (SELECT 1 FROM earmark.job j
                          WHERE j.job_id = a.key::bigint AND j.status = a.a AND j.charged = a.b::bigint
                            AND (j.charged = 0 OR EXISTS (SELECT 1 FROM earmark.ledger l
                                                           WHERE l.account = j.account AND l.job_id = j.job_id AND l.units = j.charged)))
   WHEN 'U' THEN a.b = 't' AND EXISTS (SELECT 1 FROM earmark.ledger l
                                        WHERE l.entry_key = a.key AND l.account LIKE 'crash\_l%' AND l.units = a.a::bigint)
   WHEN 'E' THEN a.b = 't' AND EXISTS (SELECT 1 FROM earmark.inbox_event e
                                        WHERE e.source = 'crash' AND e.dedupe_key = a.key AND e.event_id = a.a::bigint)
   ELSE false END
SQL
LOST=$($P -c "SELECT count(*) $LOST_SQL")
MIX=$($P -c "SELECT string_agg(n || ' ' || k, ', ' ORDER BY k) FROM (SELECT kind AS k, count(*) AS n FROM crash_ack GROUP BY kind) x")
diag "load: $OPS operations acknowledged ($MIX; R reserve, S charge+settle, U usage, E event) by $LOAD_CLIENTS clients in ${T_LOAD} s; $FAULTS faults injected; $LOST acknowledged writes lost"
ok "$(( OPS >= 100 ? 0 : 1 ))" "load: the run did real work ($OPS operations acknowledged)"
is "$LOST" 0 "load: no acknowledged write was lost ($OPS acknowledged, $FAULTS immediate shutdowns)"
[ "$LOST" != 0 ] && $P -F ' ' -c "SELECT a.* $LOST_SQL LIMIT 10" | sed 's/^/#   lost: /'
errs=$(cat "$WORK"/err.* 2>/dev/null | grep -c 'ERROR:')
is "$errs" 0 "load: no client got an SQL error (only lost connections)"
[ "$errs" != 0 ] && cat "$WORK"/err.* | grep 'ERROR:' | sort | uniq -c | head -5 | sed 's/^/#   /'

# the worker goes on by itself: a hold from before the restart whose lease
# has passed (written into its row, as if it had passed while the server was
# down) is swept after the restart; every open hold of the run ends
$P -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $PRE" >/dev/null
got=$(wait_for 60 "SELECT status || ' ' || charged || ' ' || (settled_at > pg_postmaster_start_time()) FROM earmark.job WHERE job_id = $PRE" "expired 4 true")
is "$got" "expired 4 true" "load: the restarted worker swept a hold from before the restart once its lease passed, at its recorded use"
got=$(wait_for 60 "SELECT count(*) FROM earmark.job WHERE account LIKE 'crash\_l%' AND status IN ('running', 'capped')" 0)
is "$got" 0 "load: every hold of the run ended (settled, or swept once its lease passed)"
got=$(wait_for 120 "SELECT count(*) FROM earmark.inbox_event e WHERE e.source = 'crash' AND e.event_type = 'crash.load'
                     AND (e.status <> 'applied' OR (SELECT count(*) FROM crash_effect f WHERE f.event_id = e.event_id) <> 1)" 0)
is "$got" 0 "load: every stored event was applied by the worker, with exactly one effect each"
is "$($P -c "SELECT count(*) FROM crash_effect f WHERE NOT EXISTS (SELECT 1 FROM earmark.inbox_event e WHERE e.event_id = f.event_id)")" 0 \
   "load: no effect without its event"
diag "load: $($P -c "SELECT count(*) || ' events stored, ' || count(*) FILTER (WHERE attempts > 1) || ' of them applied after a retry' FROM earmark.inbox_event WHERE source = 'crash' AND event_type = 'crash.load'")"
check_clean "immediate shutdowns during the load run"
FIG_FAULTS=$FAULTS
fig_end "2. pg_ctl stop -m immediate during a load run of reserves, settles, usage and webhooks ($LOAD_CLIENTS clients)" "$OPS" "$LOST"

# === 3. the worker killed three times while a slow provider fails ============
diag "3. kill -9 of the worker, three times, during reports to a slow failing provider"
fig_begin
SECRET="crash-$RANDOM-secret"
fake_provider "$WORK" --client-id earmark-crash --client-secret "$SECRET"
meter() { state "int(d['kinde_meters'].get('$1|default', -1))"; }
ledger() { $P -c "SELECT coalesce(sum(l.units), 0) FROM earmark.ledger l JOIN earmark.budget b USING (budget_id) WHERE b.account = '$1'"; }
printf '%s\n' "client_secret = $SECRET" >"$WORK/secrets"
as_root chown postgres "$WORK/secrets"
as_root chmod 600 "$WORK/secrets"
for a in 1 2 3; do
    $P -c "SELECT earmark_set_account('crash_m$a', NULL, 'cus_crash_m$a', 'agr_crash_m$a')" -c "SELECT earmark_set_limit('crash_m$a', NULL)" >/dev/null
done
set_conf earmark.provider kinde earmark.kinde_domain "$BASE" earmark.provider_client_id earmark-crash \
         earmark.provider_secrets_file "$WORK/secrets" earmark.report_interval 1s
wait_for 15 "SHOW earmark.provider" kinde >/dev/null
ok $? "provider kinde at the fake provider, reports every second"
control '{"slow": {"ms": 300}}'
control '{"fail": {"status": 500, "count": 3, "path": "/api/v1/billing/meter_usage", "method": "POST"}}'

# in_report KILL: the worker's pid as soon as it is seen sending totals (if
# it went quiet first, a little more usage gives it something to send)
in_report() {
    local deadline=$(wait_deadline 90) nudge=$(( $(date +%s) + 5 )) n=0 p
    while [ "$(date +%s)" -lt "$deadline" ]; do
        p=$($P -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND state = 'active' AND query = 'earmark: sending totals to the meter'" 2>/dev/null)
        [ -n "$p" ] && { echo "$p"; return 0; }
        if [ "$(date +%s)" -ge "$nudge" ]; then
            n=$((n + 1))
            $P -c "SELECT earmark_record_usage('crash_m1', 1, 'm-$1-nudge-$n')" >/dev/null 2>&1
            nudge=$(( $(date +%s) + 5 ))
        fi
        sleep 0.05
    done
    return 1
}
KILLS=0
for k in 1 2 3; do
    for a in 1 2 3; do
        $P -c "SELECT earmark_record_usage('crash_m$a', $((a * 10 + k)), 'm-$k-a')" \
           -c "SELECT earmark_record_usage('crash_m$a', $k, 'm-$k-b')" >/dev/null
    done
    pid=$(in_report "$k")
    ok $? "worker kill $k: the worker is sending totals to the meter"
    r=$(reinits)
    as_root kill -9 "$pid" && KILLS=$((KILLS + 1))
    after_crash "$r" "$pid"
    ok $? "worker kill $k: kill -9; the cluster restarted with a new worker"
done
for a in 1 2 3; do $P -c "SELECT earmark_record_usage('crash_m$a', 100, 'm-last')" >/dev/null; done
METER_BAD=0
for a in 1 2 3; do
    want=$(ledger "crash_m$a")
    got=""
    deadline=$(wait_deadline 90)
    while :; do
        got=$(meter "agr_crash_m$a")
        [ "$got" == "$want" ] && break
        [ "$(date +%s)" -ge "$deadline" ] && break
        sleep 0.3
    done
    is "$got" "$want" "worker kills: the meter of crash_m$a equals its ledger total ($want)"
    [ "$got" == "$want" ] || METER_BAD=$((METER_BAD + 1))
done
got=$(wait_for 60 "SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (budget_id) WHERE b.account LIKE 'crash\_m%'" 0)
is "$got" 0 "worker kills: no mark left"
diag "worker kills: $KILLS kills; the fake saw $(state "len([r for r in d['requests'] if r['path'] == '/api/v1/billing/meter_usage' and r['method'] == 'POST'])") meter writes, $(state "len([r for r in d['requests'] if r['status'] == 500])") answered 500, $(state "len([r for r in d['requests'] if r['disconnected']])") abandoned by a killed worker"
is "$(state "len([r for r in d['requests'] if r['status'] == 500])")" 3 "worker kills: the three failures were served (and retried)"
is "$(for a in 1 2 3; do $P -c "SELECT verdict FROM earmark_reconcile('crash_m$a')"; done | paste -sd' ')" \
   "match match match" "worker kills: reconcile reads back a meter equal to the ledger for each account"
check_clean "worker killed three times during reports"
FIG_FAULTS=$KILLS
fig_end "3. kill -9 of the worker during reports to a slow provider that fails (usage rows; lost = meters not equal to their ledger)" \
    "$($P -c "SELECT count(*) FROM earmark.ledger WHERE account LIKE 'crash\_m%'")" "$METER_BAD"
reset_settings
fake_provider_stop
wait_for 15 "SHOW earmark.provider" local >/dev/null

# === 4. a long application transaction holding a reserve while the sweeper runs
diag "4. an uncommitted reserve outlives its lease while the sweeper runs"
fig_begin
$P -c "SELECT earmark_set_limit('crash_long', 10000)" -c "SELECT earmark_set_limit('crash_long2', 10000)" >/dev/null
LOG_AT=$(stat -c %s "$EM_BASE/server.log")
mkfifo "$WORK/a.in"
PGAPPNAME=crash_long $P <"$WORK/a.in" >"$WORK/a.out" 2>"$WORK/a.err" &
APP=$!
exec 7>"$WORK/a.in"
a_sql() { printf '%s\n' "$@" >&7; }
# a_read FILE: what the session wrote there (it closes the file first)
a_read() {
    local deadline=$(wait_deadline 60)
    until [ -s "$1" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.1; done
    cat "$1" 2>/dev/null
}
# the lease of its hold passes inside the transaction: written into the
# (uncommitted) job row, a moment before the wall clock
a_sql "BEGIN;" \
      "SELECT job_id AS jid FROM earmark_reserve('crash_long', 500, 'long-1', lease => '1 hour') \\gset" \
      "SELECT charged FROM earmark_charge('crash_long', :jid, 123) \\gset" \
      "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = :jid;" \
      "\\o $WORK/a.1.tmp" "SELECT :jid, lease_until < clock_timestamp(), used, status FROM earmark.job WHERE job_id = :jid;" "\\o" \
      "\\! mv $WORK/a.1.tmp $WORK/a.1"
IFS='|' read -r JA PASSED AUSED ASTATUS <<<"$(a_read "$WORK/a.1")"
is "$AUSED $ASTATUS" "123 running" "long transaction: it reserved 500 and charged 123, and stays open"
is "$PASSED" t "long transaction: its hold's lease has passed, uncommitted"
JB=$($P -c "SELECT job_id FROM earmark_reserve('crash_long2', 100, 'long-2', lease => '1 hour')")
$P -c "SELECT charged FROM earmark_charge('crash_long2', $JB, 7)" -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $JB" >/dev/null
got=$(wait_for 30 "SELECT status || ' ' || charged FROM earmark.job WHERE job_id = $JB" "expired 7")
is "$got" "expired 7" "long transaction: meanwhile the sweeper runs: it swept a later dead hold of another account"
is "$($P -c "SELECT count(*) FROM earmark.job WHERE account = 'crash_long'")" 0 "long transaction: its hold is invisible to everyone else"
is "$($P -c "SELECT used || '/' || held FROM earmark_budget('crash_long')")" "0/0" "long transaction: the committed budget shows nothing of it"
a_sql "\\o $WORK/a.2.tmp" "SELECT status, used FROM earmark.job WHERE job_id = :jid;" "\\o" "\\! mv $WORK/a.2.tmp $WORK/a.2"
is "$(a_read "$WORK/a.2")" "running|123" "long transaction: the sweeper never touched its hold"
a_sql "COMMIT;" "\\o $WORK/a.3.tmp" "SELECT 'committed';" "\\o" "\\! mv $WORK/a.3.tmp $WORK/a.3" "\\q"
is "$(a_read "$WORK/a.3")" committed "long transaction: it commits (a hold whose lease has already passed)"
exec 7>&-
reap "$APP"
got=$(wait_for 30 "SELECT status || ' ' || charged || ' ' || released FROM earmark.job WHERE job_id = $JA" "expired 123 377")
is "$got" "expired 123 377" "long transaction: the sweeper then settled it as expired at its recorded use"
is "$($P -c "SELECT used || '/' || held FROM earmark_budget('crash_long')")" "123/0" "long transaction: the budget shows the use and no hold"
is "$($P -c "SELECT count(*) || ' ' || sum(units) FROM earmark.ledger WHERE job_id = $JA")" "1 123" "long transaction: one ledger row"
logged=$(tail -c +$((LOG_AT + 1)) "$EM_BASE/server.log" | grep -E '(ERROR|FATAL|PANIC):')
is "$(printf '%s' "$logged" | grep -c .)" 0 "long transaction: nothing was logged as an error meanwhile"
[ -n "$logged" ] && printf '%s\n' "$logged" | head -5 | sed 's/^/#   /'
check_clean "a long transaction across the sweeper"
fig_end "4. a long application transaction holds a reserve past its lease while the sweeper runs (no fault; two reserves with a charge each)" 4 0

# === 5. an open application transaction on one budget never stalls the worker
diag "5. a budget row held by an open transaction, with a dead hold on it"
fig_begin
$P -c "SELECT earmark_set_limit('crash_stall_a', 10000)" -c "SELECT earmark_set_limit('crash_stall_b', 10000)" >/dev/null
JS=$($P -c "SELECT job_id FROM earmark_reserve('crash_stall_a', 10, 'stall-dead', lease => '1 hour')")
mkfifo "$WORK/s.in"
PGAPPNAME=crash_stall $P <"$WORK/s.in" >"$WORK/s.out" 2>"$WORK/s.err" &
STALL=$!
exec 8>"$WORK/s.in"
# the session reserves on the same budget (its row stays locked) while the
# other hold lives, then stays open
printf '%s\n' "BEGIN;" "SELECT job_id FROM earmark_reserve('crash_stall_a', 10, 'stall-open', lease => '1 hour');" >&8
wait_for 15 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'crash_stall' AND state = 'idle in transaction'" 1 >/dev/null
ok $? "stall: an application transaction holds crash_stall_a's budget row, idle"
# the other hold's lease passes (written into its row, not waited for)
$P -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $JS" >/dev/null
ok $? "stall: the other hold on that budget is dead now"
JT=$($P -c "SELECT job_id FROM earmark_reserve('crash_stall_b', 10, 'stall-b', lease => '1 hour')" \
        -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE idempotency_key = 'stall-b'" | head -1)
got=$(wait_for 60 "SELECT status FROM earmark.job WHERE job_id = $JT" expired)
is "$got" expired "stall: the worker swept another account's dead hold meanwhile (it skips the locked budget)"
is "$($P -c "SELECT status FROM earmark.job WHERE job_id = $JS")" running "stall: the dead hold behind the locked row waits"
printf '%s\n' "COMMIT;" "\\q" >&8
exec 8>&-
reap "$STALL"
got=$(wait_for 15 "SELECT status FROM earmark.job WHERE job_id = $JS" expired)
is "$got" expired "stall: once the transaction ends, that hold is swept too"
check_clean "an open transaction on a budget with a dead hold"
fig_end "5. an idle application transaction holds a budget row with a dead hold on it (no fault; its reserves)" 3 0

diag ""
diag "Figures of this run:"
diag ""
diag "| scenario | writes acknowledged | faults injected | acknowledged writes lost | failed checks |"
diag "| --- | ---: | ---: | ---: | ---: |"
for row in "${FIG[@]}"; do diag "$row"; done
diag ""

diag "crash.sh ran in $(( $(date +%s) - T_START )) s"
done_testing
