# test/integration/tap.sh: a few TAP helpers for the integration scripts.
#
# The runner (scripts/test.sh) sets PGHOST, PGPORT and PGUSER to the private
# cluster, whose earmark worker is connected to database "postgres", and
# EM_DATA to its data directory.  Each script prints TAP and is run by prove.

set -uo pipefail
EM_PGBIN=${EM_PGBIN:-/usr/lib/postgresql/15/bin}
_tap_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_tap_n=0
_tap_failed=0
# EM_WAIT_SCALE: every deadline of a wait (wait_for, reload_conf, the
# scripts' own polls through wait_deadline) is multiplied by it.  A
# deadline only bounds how long a wait for a state may take before the step
# fails; the slower the server, the longer it must be.  Under valgrind
# (scripts/test.sh starts the server through EM_PG_WRAPPER) every process
# is 20-50 times slower, crash recovery after kill -9 among them, so it is
# 10 there unless set.
EM_WAIT_SCALE=${EM_WAIT_SCALE:-$([ -n "${EM_PG_WRAPPER:-}" ] && echo 10 || echo 1)}
# wait_deadline SECONDS: the epoch second a wait of SECONDS (scaled) ends
wait_deadline() { echo $(( $(date +%s) + $1 * EM_WAIT_SCALE )); }

q() { "$EM_PGBIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 "$@"; }

# hunt_python: PY set to a python3 with psycopg2 (the Debian package's lives
# in the system's python3), or one failed test and exit
hunt_python() {
    local p
    PY=
    for p in ${HUNT_PYTHON:-} /usr/bin/python3 python3; do
        if "$p" -c 'import psycopg2' 2>/dev/null; then PY=$p; return 0; fi
    done
    ok 1 "python3 with psycopg2 (the python3-psycopg2 package) is installed"
    done_testing
    exit 1
}

# hunt_results FILE RC: a hunt's results file ("0|text" held, "1|text"
# failed) as TAP lines, or one failed line when it wrote none
hunt_results() {
    local bad text
    if [ ! -s "$1" ]; then
        ok 1 "the hunt ran to its end (exit $2)"
        return
    fi
    while IFS='|' read -r bad text; do
        ok "$bad" "$text"
    done <"$1"
}

# drop_run_accounts RUN: delete, in database postgres, every row of the
# accounts named RUN_... (a randomized run's), so that the scripts after
# it find the books as they left them
drop_run_accounts() {
    q -d postgres -v run="$1" >/dev/null 2>&1 <<'SQL'
BEGIN;
CREATE TEMP TABLE gone ON COMMIT DROP AS SELECT budget_id FROM earmark.budget WHERE account LIKE :'run' || '\_%';
DELETE FROM earmark.ledger_entry WHERE budget_id IN (SELECT budget_id FROM gone);
DELETE FROM earmark.usage_shard WHERE budget_id IN (SELECT budget_id FROM gone);
DELETE FROM earmark.meter_mark WHERE budget_id IN (SELECT budget_id FROM gone);
DELETE FROM earmark.meter_send WHERE budget_id IN (SELECT budget_id FROM gone);
DELETE FROM earmark.meter_review WHERE budget_id IN (SELECT budget_id FROM gone);
DELETE FROM earmark.budget_slot WHERE budget_id IN (SELECT budget_id FROM gone);
DELETE FROM earmark.evidence WHERE account LIKE :'run' || '\_%';
DELETE FROM earmark.local_meter WHERE account LIKE :'run' || '\_%';
DELETE FROM earmark.job WHERE account LIKE :'run' || '\_%';
DELETE FROM earmark.budget WHERE budget_id IN (SELECT budget_id FROM gone);
DELETE FROM earmark.account_limit WHERE account LIKE :'run' || '\_%';
DELETE FROM earmark.account WHERE account LIKE :'run' || '\_%';
COMMIT;
SQL
}

# as_root CMD...: run CMD as root (sudo when the tests do not run as root)
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# skip_unless_gdb: a script that holds a backend still with gdb (ptrace)
# prints one skipped test and ends without gdb or root
skip_unless_gdb() {
    if ! command -v gdb >/dev/null || [ "$(id -u)" -ne 0 ]; then
        echo "1..1"
        echo "ok 1 # SKIP needs gdb and root"
        exit 0
    fi
}

# own_database NAME: a new database NAME with earmark on the test cluster
own_database() {
    q -d postgres -c "DROP DATABASE IF EXISTS $1" >/dev/null 2>&1
    q -d postgres -c "CREATE DATABASE $1" && q -d "$1" -c "CREATE EXTENSION earmark"
}

# anchored_account DB ACCOUNT <<SQL: ACCOUNT, its cycle begun 14-17 days ago, then SQL (one psql, quiet)
anchored_account() {
    { cat <<SQL
SET earmark.rate_limit = 0;
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT earmark_set_account('$2', :'anchor');
SQL
      cat; } | q -d "$1" >/dev/null
}

# floor_trusted DB ACCOUNT AMOUNT KEY: up to 5 reserves until a refusal reads no hold; prints false|0 then
floor_trusted() {
    local i got=
    for i in 1 2 3 4 5; do
        got=$(q -d "$1" -c "SET earmark.rate_limit = 0" -c "BEGIN" \
            -c "SELECT (SELECT admitted FROM earmark_reserve('$2', $3, '$4' || $i))::text || '|' ||
                       pg_stat_get_xact_numscans('earmark.job_open'::regclass)" -c "COMMIT")
        [ "$got" = "false|0" ] && break
        sleep 0.2
    done
    echo "$got"
}

# The harness of the scripts that hold a backend still with gdb, in steps:
# work_dir; backend (or sess and say); meanwhile; gdb_hold; wait "$SPID";
# gdb_held REGEX, or else run WX/NAME.sh itself (no function to break on).
# In WX: a session's NAME.out and NAME.err (sess: NAME.in, its fifo), a
# meanwhile script's NAME.sh and NAME.done, and gdb.cmd and gdb.log.
# gdb_hold's STOP: a break location ("if COND" allowed), "finish", "bt" or
# "set ..."; its MEANWHILE runs while the backend is stopped ("": none) and
# gdb gives up after 90 s.  sess: rate limit off, lock_timeout 60s; say
# opens the fifo read-write, so a session that has ended times out, no hang.
# On exit (work_dir's trap): sessions closed, background jobs (psql, gdb)
# killed, the script's at_exit run if it has one.
#
# work_dir NAME: WX=/tmp/earmark-NAME.XXXXXX; on exit: jobs killed, at_exit, WX removed unless KEEP
work_dir() {
    WX=$(mktemp -d "/tmp/earmark-$1.XXXXXX")
    chmod 755 "$WX"
    _tap_wx=$WX
    trap work_cleanup EXIT
}
work_cleanup() {
    sess_close
    kill $(jobs -pr) 2>/dev/null
    declare -F at_exit >/dev/null && at_exit
    [ -n "${KEEP:-}" ] || rm -rf "$_tap_wx"
}

# sess NAME: a psql session on $DBN fed through the fifo WX/NAME.in, open until sess_close
_tap_sess_fds=()
sess() {
    local fd
    mkfifo "$WX/$1.in"
    PGOPTIONS='-c earmark.rate_limit=0 -c lock_timeout=60s' \
        "$EM_PGBIN/psql" -X -A -t -q -d "$DBN" <"$WX/$1.in" >"$WX/$1.out" 2>"$WX/$1.err" &
    exec {fd}>"$WX/$1.in"
    _tap_sess_fds+=("$fd")
}
# sess_close: ends every session (closes the fifos)
sess_close() {
    local fd
    for fd in ${_tap_sess_fds[@]+"${_tap_sess_fds[@]}"}; do exec {fd}>&-; done
    _tap_sess_fds=()
}
# say NAME MARK LINE...: the lines and "\echo MARK" to session NAME, then wait_mark NAME MARK
say() {
    local name=$1 mark=$2
    shift 2
    printf '%s\n' "$@" "\\echo $mark" 1<>"$WX/$name.in"
    wait_mark "$name" "$mark"
}
# wait_mark NAME MARK: until session NAME printed the line MARK; 1 if not within 60 s (scaled)
wait_mark() {
    local end
    end=$(wait_deadline 60)
    until grep -q "^$2\$" "$WX/$1.out" 2>/dev/null; do
        [ "$(date +%s)" -ge "$end" ] && return 1
        sleep 0.05
    done
}

# backend NAME -c SQL...: q on $DBN in the background, pg_backend_pid() first; sets SPID and BPID
backend() {
    local name=$1 i
    shift
    q -d "$DBN" -c "SELECT pg_backend_pid()" "$@" >"$WX/$name.out" 2>"$WX/$name.err" &
    SPID=$!
    for i in $(seq 50); do [ -s "$WX/$name.out" ] && break; sleep 0.1; done
    BPID=$(head -1 "$WX/$name.out")
}

# meanwhile NAME <<EOF: WX/NAME.sh: tap.sh, WX and DBN, the lines on stdin, touch WX/NAME.done
meanwhile() {
    {
        echo "source '$_tap_dir/tap.sh'"
        echo "WX='$WX' DBN='$DBN'"
        cat
        echo "touch '$WX/$1.done'"
    } >"$WX/$1.sh"
}

# gdb_hold PID MEANWHILE STOP...: gdb stops PID at each STOP in turn, runs MEANWHILE, detaches
gdb_hold() {
    local pid=$1 script=$2 stop armed=
    shift 2
    rm -f "$WX/gdb.armed"
    {
        echo "set pagination off"
        echo "set confirm off"
        for stop in "$@"; do
            case $stop in
                finish|bt|set\ *) echo "$stop" ;;
                *) printf 'break %s\n' "$stop"
                   # attached, its first breakpoint set: gdb_armed returns
                   [ -n "$armed" ] || { echo "shell touch '$WX/gdb.armed'"; armed=1; }
                   printf 'continue\ndelete\n' ;;
            esac
        done
        [ -n "$script" ] && echo "shell bash $script"
        echo "detach"
        echo "quit"
    } >"$WX/gdb.cmd"
    timeout 90 gdb -q -batch -p "$pid" -x "$WX/gdb.cmd" >"$WX/gdb.log" 2>&1 &
    GPID=$!
}
# gdb_armed: waits until gdb_hold's gdb has attached and set its first
# breakpoint (60 s, scaled); 1 if it did not.  A script whose breakpoint a
# timed event reaches (a lease that passes) starts that clock only then.
gdb_armed() {
    local end
    end=$(wait_deadline 60)
    until [ -f "$WX/gdb.armed" ]; do
        [ "$(date +%s)" -ge "$end" ] && return 1
        sleep 0.05
    done
}
# gdb_armed_psql: gdb_armed's wait as a psql meta-command (\!), for a
# session that must wait inside itself, between two of its statements:
#   backend r -c "$(gdb_armed_psql)" -c "SELECT ..."
gdb_armed_psql() {
    printf '%s' "\\! for i in \$(seq $((1200 * EM_WAIT_SCALE))); do [ -f '$WX/gdb.armed' ] && break; sleep 0.05; done"
}
# gdb_held REGEX: waits for gdb_hold's gdb; 0 if gdb.log matches REGEX (it held where wanted)
gdb_held() { wait "$GPID"; GPID=; grep -q "$1" "$WX/gdb.log"; }

# A cluster of its own, for a script that restarts its server or needs a
# setting fixed at start: own_cluster DIR PORT [postgresql.conf lines...]
# makes it in DIR/data (earmark preloaded, its worker in database postgres
# only, max_prepared_transactions 4) and starts it; own_start and own_stop
# [MODE] start and stop it again; the script's EXIT trap calls own_stop
# immediate.  Its socket is DIR.
own_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }
own_start() {
    own_pg "$EM_PGBIN/pg_ctl" -D "$OWN_DIR/data" -l "$OWN_DIR/log" -w -t 300 \
        ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} start >/dev/null
}
own_stop() { [ -n "${OWN_DIR:-}" ] || return 0; own_pg "$EM_PGBIN/pg_ctl" -D "$OWN_DIR/data" -m "${1:-fast}" -w stop >/dev/null 2>&1; }
own_cluster() {
    OWN_DIR=$1
    local port=$2 line
    shift 2
    chown postgres "$OWN_DIR"; chmod 755 "$OWN_DIR"
    own_pg "$EM_PGBIN/initdb" -D "$OWN_DIR/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null 2>&1
    {
        echo "port = $port"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$OWN_DIR'"
        echo "max_connections = 50"
        echo "max_prepared_transactions = 4"
        echo "shared_preload_libraries = 'earmark'"
        echo "earmark.database = 'postgres'"
        echo "earmark.sweep_interval = '200ms'"
        echo "log_min_messages = warning"
        for line in "$@"; do echo "$line"; done
    } >>"$OWN_DIR/data/postgresql.conf"
    own_start
}

ok() {   # ok CONDITION-EXIT-STATUS DESCRIPTION  (use: ok $? "desc" or ok "$(( a == b ))"...)
    _tap_n=$((_tap_n + 1))
    if [ "$1" = 0 ]; then echo "ok $_tap_n - $2"
    else echo "not ok $_tap_n - $2"; _tap_failed=$((_tap_failed + 1)); fi
}

is() {   # is GOT EXPECTED DESCRIPTION
    _tap_n=$((_tap_n + 1))
    if [ "$1" == "$2" ]; then echo "ok $_tap_n - $3"
    else
        echo "not ok $_tap_n - $3"
        echo "#   got:      '$1'"
        echo "#   expected: '$2'"
        _tap_failed=$((_tap_failed + 1))
    fi
}

diag() { echo "# $*"; }

# wait_for SECONDS SQL EXPECTED: poll until the query returns EXPECTED
# (SECONDS scaled by EM_WAIT_SCALE; a server that refuses connections, as
# during crash recovery, is polled on)
wait_for() {
    local deadline got
    deadline=$(wait_deadline "$1")
    while :; do
        got=$(q -d "${DB:-postgres}" -c "$2" 2>/dev/null || true)
        [ "$got" == "$3" ] && { echo "$got"; return 0; }
        [ "$(date +%s)" -ge "$deadline" ] && { echo "$got"; return 1; }
        sleep 0.2
    done
}

# sqlstate SQL...: "ok", or the SQLSTATE of the error the statements raise
sqlstate() {
    local args=() s out
    for s in "$@"; do args+=(-c "$s"); done
    if out=$("$EM_PGBIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -d "${DB:-postgres}" "${args[@]}" 2>&1 >/dev/null); then
        echo ok
    else
        echo "$out" | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p' | head -1
        echo "$out" | sed 's/^/# /' >&2
    fi
}

# explain_as_run: the psql lines after which every statement of the
# session, those earmark runs through SPI included, is followed by a
# notice with its plan as it ran (auto_explain, ANALYZE without timing)
explain_as_run() {
    echo "LOAD 'auto_explain';"
    echo "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
    echo "SET auto_explain.log_analyze = on; SET auto_explain.log_timing = off;"
    echo "SET auto_explain.log_level = notice; SET client_min_messages = notice;"
}

# plans_as_lines REGEX: of explain_as_run's notices on stdin, the plans of
# the statements whose "Query Text: " line matches REGEX, one a line, the
# plan's lines joined by " | "
plans_as_lines() {
    awk -v re="$1" '/^(psql:.*)?NOTICE:/ { if (keep) print plan; keep = 0; plan = "" }
                    $0 ~ "^Query Text: " re { keep = 1; next }
                    keep { sub(/^ */, ""); plan = plan " | " $0 }
                    END { if (keep) print plan }'
}

done_testing() {
    echo "1..$_tap_n"
    [ "$_tap_failed" -eq 0 ]
}

# reload_conf SQL...: run the statements (ALTER SYSTEM ...), reload the
# configuration and wait until the earmark worker runs with it.  A new
# session sees a reloaded setting at once; the worker rereads it only at
# the top of its next round, which may come after a slow provider call.
# It applies inbox events in every round, after that reread, so a probe
# event whose handler returns the worker's pg_conf_load_time() shows it:
# once a probe reports a load time after the reload, every later step sees
# the worker on the new settings.  The first probe is stored in the
# reload's own transaction, visible from the round the reload wakes; a
# worker that sleeps long (a long earmark.sweep_interval) and missed it is
# woken with another reload after a while (a liveness step only).  Returns
# 1 if the worker did not get there within EM_RELOAD_WAIT seconds (180,
# scaled by EM_WAIT_SCALE).
reload_conf() {
    local args=() s since key n=0 got poke deadline
    for s in "$@"; do args+=(-c "$s"); done
    q -d postgres >/dev/null <<'SQL' || return 1
CREATE OR REPLACE FUNCTION public.tap_conf_probe(e earmark.inbox_event) RETURNS text
    LANGUAGE sql AS 'SELECT pg_catalog.pg_conf_load_time()::text';
SELECT earmark_inbox_set_handler('tap.conf_probe', 'public.tap_conf_probe(earmark.inbox_event)');
SQL
    key="tap-conf-$$-$RANDOM-$n"
    since=$(q -d postgres "${args[@]}" -c "SELECT clock_timestamp()" -c "BEGIN" \
              -c "SELECT earmark_inbox_receive('tap', '$key', 'tap.conf_probe', '{}') IS NOT NULL" \
              -c "SELECT pg_reload_conf()" -c "COMMIT") || return 1
    since=${since%%$'\n'*}
    deadline=$(wait_deadline "${EM_RELOAD_WAIT:-180}")
    poke=$(( $(date +%s) + 10 ))
    while :; do
        got=$(q -d postgres -c "SELECT status || ' ' || (result::timestamptz >= '$since')
                                  FROM earmark.inbox_event WHERE source = 'tap' AND dedupe_key = '$key'" 2>/dev/null)
        case $got in
            "applied true") break ;;
            applied*|failed*|dead*)
                # applied in a round that began before the reload: ask again
                n=$((n + 1)); key="tap-conf-$$-$RANDOM-$n"
                q -d postgres -c "SELECT earmark_inbox_receive('tap', '$key', 'tap.conf_probe', '{}')" >/dev/null ;;
        esac
        if [ "$(date +%s)" -ge "$deadline" ]; then got=timeout; break; fi
        if [ "$(date +%s)" -ge "$poke" ]; then
            q -d postgres -c "SELECT pg_reload_conf()" >/dev/null
            poke=$(( $(date +%s) + 10 ))
        fi
        sleep 0.2
    done
    q -d postgres >/dev/null <<'SQL'
SELECT earmark_inbox_set_handler('tap.conf_probe', NULL);
DELETE FROM earmark.inbox_event WHERE source = 'tap' AND event_type = 'tap.conf_probe';
DROP FUNCTION public.tap_conf_probe(earmark.inbox_event);
SQL
    [ "$got" = "applied true" ] || { echo "# reload_conf: the worker did not reread its configuration ($got)" >&2; return 1; }
}

# fake_provider WORK [ARGS...]: test/fake_provider.py on loopback (ARGS are
# its own: --client-id, --client-secret, --bearer, --hmac-secret, ...), its
# port and request log in WORK; sets FAKE_PID and BASE, and returns 1 if it
# wrote no port within 60 s (scaled).  fake_provider_stop ends it (for the
# scripts' cleanup, and wherever a script is done with it).  control JSON
# posts a /_control request (control @FILE: the body is the file's, for one
# too long for an argument); state PYEXPR prints PYEXPR over d, the
# provider's /_state.
fake_provider() {
    local work=$1 deadline
    shift
    python3 "$(dirname "${BASH_SOURCE[0]}")/../fake_provider.py" \
        --port-file "$work/port" --log "$work/requests.log" "$@" &
    FAKE_PID=$!
    deadline=$(wait_deadline 60)
    until [ -s "$work/port" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.1; done
    BASE="http://127.0.0.1:$(cat "$work/port")"
    [ -s "$work/port" ]
}
fake_provider_stop() {
    [ -n "${FAKE_PID:-}" ] || return 0
    kill "$FAKE_PID" 2>/dev/null
    wait "$FAKE_PID" 2>/dev/null
    FAKE_PID=
}
control() { curl -s -X POST "$BASE/_control" -H 'Content-Type: application/json' --data-binary "$1" >/dev/null; }
state() { curl -s "$BASE/_state" | python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
