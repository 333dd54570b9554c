# test/citus/cluster.sh: a throwaway Citus cluster for earmark's tests: a
# coordinator and two workers on loopback, run as the unprivileged user of
# scripts/lib.sh from EM_PREFIX's PostgreSQL (or the system's).
#
# Source it (after setting EM_PREFIX if you use one), then:
#
#   ct_require_citus                  # prints "skipped: Citus is not installed"
#                                     # and exits 0 when citus.so is absent
#   ct_begin [postgresql.conf lines]  # all of an earmark TAP script's start:
#                                     # the above, tap.sh, ct_start with citus
#                                     # and earmark preloaded, CREATE EXTENSION
#                                     # earmark, earmark_distribute() (one TAP line)
#   ct_fake_provider [NAME=VALUE ...]  # then the fake provider, every node's
#                                     # earmark.provider at it
#   ct_start [postgresql.conf lines]  # start, CREATE EXTENSION citus, register
#   ct_sql 0 -c 'SELECT ...'          # psql on node 0 (coordinator), 1, 2 (workers)
#   ct_val 1 'SELECT ...'             # one value, unaligned, no header
#   ct_host 1 / ct_port 1             # a node's socket directory and port (pgbench, psql -h -p)
#   ct_kill_node 1                    # kill -9 a node's postmaster and its children
#   ct_start_node 1                   # start it again (crash recovery) and wait
#   ct_restart_node 1                 # both
#   ct_stop                           # stop and remove everything (runs on EXIT)
#
# Settings (environment, before ct_start):
#   CT_PORT      the coordinator's port (default 55660); worker i listens on
#                CT_PORT + i.  Where another program listens on one of
#                these TCP ports, ct_start moves the block up (in steps of
#                10) to the first free one and says so.
#   CT_WORKERS   the number of workers (default 2)
#   CT_PRELOAD   shared_preload_libraries (default 'citus'; Citus must come
#                first, e.g. 'citus,earmark')
#   CT_DB        the database Citus is created in on every node (default
#                postgres)
#   EM_KEEP      keep the cluster's directory after ct_stop
#
# Each node has its own directory under CT_BASE (data, sock, server.log);
# nodes reach each other over TCP on 127.0.0.1 (trust, as initdb -A trust
# sets up), clients use the node's private socket directory.  ct_start sets
# an EXIT trap (ct_stop); a script that also uses em_start_cluster must stop
# that cluster itself.

source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/lib.sh"

CT_PORT=${CT_PORT:-55660}
CT_WORKERS=${CT_WORKERS:-2}
CT_PRELOAD=${CT_PRELOAD:-citus}
CT_DB=${CT_DB:-postgres}
CT_BASE=

ct_log() { printf '[citus] %s\n' "$*" >&2; }

# ct_require_citus: Citus's library in the PostgreSQL we run, or skip
ct_require_citus() {
    local lib
    lib=$("$EM_PGBIN/pg_config" --pkglibdir 2>/dev/null || echo "$EM_PGBIN/../lib")
    if [ ! -f "$lib/citus.so" ]; then
        echo "skipped: Citus is not installed"
        exit 0
    fi
}

ct_port() { echo $((CT_PORT + $1)); }

# ct_begin [postgresql.conf lines]: what an earmark TAP script starts with.
# Citus or skip; the TAP helpers (test/integration/tap.sh); a cluster with
# citus and earmark preloaded, earmark's worker on CT_DB reporting hourly
# (a test reports when it means to), plus the lines given; earmark created
# and distributed on the coordinator, which is the script's first TAP line,
# and the worker's first report pass run.
ct_begin() {
    ct_begin_cluster "$@"
    ct_sql 0 -q -c "CREATE EXTENSION earmark" -c "SELECT * FROM earmark_distribute()" >/dev/null
    ok $? "CREATE EXTENSION earmark and earmark_distribute() on the coordinator"
    # The worker's first report pass runs at its first round, hourly after
    # that: wait for it, or it may send (and delete) the marks of the
    # script's first steps, whose checks count them.
    ct_wait 60 0 "SELECT last_report_at IS NOT NULL FROM earmark.worker_status" t >/dev/null ||
        echo "# the earmark worker's first report pass did not run within 60 s"
}
# ct_begin_cluster [postgresql.conf lines]: ct_begin without CREATE
# EXTENSION and earmark_distribute (a script that distributes itself);
# with gdb (GDB=1 before it) ptrace or skip (skip_unless_gdb), and
# test/integration/tap.sh's work directory (work_dir NAME with WORK_NAME)
# whose exit stops the cluster
ct_begin_cluster() {
    ct_require_citus
    source "$EM_ROOT/test/integration/tap.sh"
    [ -n "${GDB:-}" ] && skip_unless_gdb
    set +e
    export PGOPTIONS="-c client_min_messages=warning"
    CT_PRELOAD='citus,earmark'
    ct_start "earmark.database = '$CT_DB'" "earmark.report_interval = '1h'" "$@" \
        || { echo "Bail out! the Citus cluster did not start"; exit 1; }
    if [ -n "${WORK_NAME:-}" ]; then
        work_dir "$WORK_NAME"
        at_exit() { ct_stop; }
    fi
}

# ct_worker_pid NODE: the pid of the node's earmark worker, once it runs (30 s)
ct_worker_pid() {
    ct_wait 30 "$1" "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker'" 1 >/dev/null &&
        ct_val "$1" "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'"
}

# ct_distribute_bg APPNAME: earmark_distribute() on the coordinator in the
# background, as APPNAME: its answer (t) in WX/dist.out, its errors in
# WX/dist.err, its psql's pid in WX/dist.pid; ct_distribute_end waits for
# it (120 s, scaled) and prints "OUT ERR" ("t " when it distributed)
ct_distribute_bg() {
    PGAPPNAME=$1 ct_sql 0 -q -A -t -c "SELECT count(*) > 0 FROM earmark_distribute()" \
        >"$WX/dist.out" 2>"$WX/dist.err" &
    echo $! >"$WX/dist.pid"
}
ct_distribute_end() {
    local pid end
    pid=$(cat "$WX/dist.pid" 2>/dev/null)
    end=$(wait_deadline 120)
    while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done
    echo "$(cat "$WX/dist.out" 2>/dev/null) $(cat "$WX/dist.err" 2>/dev/null)"
}

# ct_logged REGEX [NODES]: how many lines of the nodes' server logs (all)
# match REGEX; the lines themselves as TAP comments (on stderr)
ct_logged() {
    local logs=() n
    for n in ${2:-$(seq 0 "$CT_WORKERS")}; do logs+=("$(ct_dir "$n")/server.log"); done
    grep -h -- "$1" "${logs[@]}" | sed 's/^/# /' >&2
    cat "${logs[@]}" | grep -c -- "$1"
}

# ct_meanwhile NAME <<EOF: as tap.sh's meanwhile, for gdb_hold's MEANWHILE on
# this cluster: WX/NAME.sh with cluster.sh, CT_BASE and CT_PORT, the lines
# on stdin, then touch WX/NAME.done
ct_meanwhile() {
    {
        echo "source '$EM_ROOT/test/citus/cluster.sh'"
        echo "set +e"
        echo "CT_BASE='$CT_BASE' CT_PORT=$CT_PORT WX='$WX'"
        cat
        echo "touch '$WX/$1.done'"
    } >"$WX/$1.sh"
}

# ct_fake_provider [NAME=VALUE ...]: after ct_begin, the fake provider
# (test/fake_provider.py) on loopback, its base URL in BASE and its work
# directory in WORK, and on every node earmark.provider 'http' at its
# /generic endpoints, with the settings given (ALTER SYSTEM, reloaded);
# stopped at exit with the cluster
ct_fake_provider() {
    local n kv args
    WORK=$(mktemp -d /tmp/earmark-citus-provider.XXXXXX)
    chmod 755 "$WORK"
    trap 'fake_provider_stop; rm -rf "$WORK"; ct_stop' EXIT
    fake_provider "$WORK" || { echo "Bail out! the fake provider did not start"; exit 1; }
    args=(-c "ALTER SYSTEM SET earmark.provider = 'http'"
          -c "ALTER SYSTEM SET earmark.provider_url = '$BASE/generic'")
    for kv in "$@"; do args+=(-c "ALTER SYSTEM SET ${kv%%=*} = '${kv#*=}'"); done
    for n in $(seq 0 "$CT_WORKERS"); do
        ct_sql "$n" -q "${args[@]}" -c "SELECT pg_reload_conf()" >/dev/null
    done
}

# ct_ports_free FIRST COUNT: whether COUNT TCP ports from FIRST can be bound
# on 127.0.0.1, with SO_REUSEADDR as the postmaster binds them (so only a
# listener, not a closed connection in TIME_WAIT, makes a port taken)
ct_ports_free() {
    python3 - "$1" "$2" <<'PY'
import socket, sys
first, count = int(sys.argv[1]), int(sys.argv[2])
for port in range(first, first + count):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
    except OSError:
        sys.exit(1)
    finally:
        s.close()
PY
}

# ct_pick_ports: CT_PORT, or the first block of CT_WORKERS + 1 free ports
# above it: the nodes listen on loopback TCP, where any program of the
# machine may hold a port (a fixed port once failed a run this way)
ct_pick_ports() {
    local try first=$CT_PORT
    for try in $(seq 0 49); do
        if ct_ports_free "$CT_PORT" $((CT_WORKERS + 1)); then
            [ "$CT_PORT" = "$first" ] || ct_log "ports $first.. are taken: the cluster listens on $CT_PORT.. instead"
            return 0
        fi
        CT_PORT=$((CT_PORT + 10))
    done
    ct_log "no block of $((CT_WORKERS + 1)) free ports from $first to $CT_PORT"
    return 1
}
ct_dir() { echo "$CT_BASE/n$1"; }
ct_host() { echo "$CT_BASE/n$1/sock"; }

# ct_sql NODE psql-args...: psql on a node, stopping at the first error
ct_sql() {
    local n=$1
    shift
    "$EM_PGBIN/psql" -X -v ON_ERROR_STOP=1 -h "$(ct_dir "$n")/sock" -p "$(ct_port "$n")" \
        -U postgres -d "$CT_DB" "$@"
}

# ct_val NODE SQL: the query's result, unaligned and without a header
ct_val() { ct_sql "$1" -A -t -q -c "$2"; }

# ct_wait SECONDS NODE SQL EXPECTED: poll a node until the query returns EXPECTED
ct_wait() {
    local deadline=$(( $(date +%s) + $1 )) got
    while :; do
        got=$(ct_val "$2" "$3" 2>/dev/null)
        [ "$got" == "$4" ] && { echo "$got"; return 0; }
        [ "$(date +%s)" -ge "$deadline" ] && { echo "$got"; return 1; }
        sleep 0.2
    done
}

# ct_ready NODE SECONDS: wait until the node accepts connections
ct_ready() {
    local deadline=$(( $(date +%s) + ${2:-60} ))
    until "$EM_PGBIN/pg_isready" -q -h "$(ct_dir "$1")/sock" -p "$(ct_port "$1")" -d "$CT_DB"; do
        [ "$(date +%s)" -ge "$deadline" ] && { ct_log "node $1 does not accept connections"; return 1; }
        sleep 0.2
    done
}

ct_init_node() {
    local n=$1 d
    shift
    d=$(ct_dir "$n")
    mkdir -p "$d/sock"
    em_sudo chown -R "$EM_PGUSER" "$d"
    em_as_pg "$EM_PGBIN/initdb" -D "$d/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
        >"$d/initdb.log" 2>&1 || { cat "$d/initdb.log" >&2; return 1; }
    {
        echo "port = $(ct_port "$n")"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$d/sock'"
        echo "shared_preload_libraries = '$CT_PRELOAD'"
        echo "max_connections = 200"
        # Citus runs multi-shard writes as two-phase commits
        echo "max_prepared_transactions = 200"
        echo "max_worker_processes = 32"
        echo "shared_buffers = 64MB"
        echo "log_min_messages = warning"
        echo "log_line_prefix = '%m [%p] %b '"
        for line in "$@"; do echo "$line"; done
    } | em_as_pg tee -a "$d/data/postgresql.conf" >/dev/null
}

# ct_start_node NODE: start a node's server (after ct_kill_node: crash
# recovery) and wait until it accepts connections
ct_start_node() {
    local d
    d=$(ct_dir "$1")
    # (after a kill, pg_ctl warns about the old postmaster.pid: in pg_ctl.log)
    em_as_pg "$EM_PGBIN/pg_ctl" -D "$d/data" -l "$d/server.log" -w -t 120 start \
        >"$d/pg_ctl.log" 2>&1 || { cat "$d/pg_ctl.log" >&2; tail -20 "$d/server.log" >&2; return 1; }
    ct_ready "$1" 60
}

# ct_kill_node NODE: kill -9 the node's postmaster, then each of its
# processes (by pid), as a machine that loses power would; waits until they
# are gone, so that ct_start_node can start it again
ct_kill_node() {
    local d pm pids p deadline
    d=$(ct_dir "$1")
    pm=$(head -1 "$d/data/postmaster.pid" 2>/dev/null) || { ct_log "node $1 is not running"; return 1; }
    pids=$(ps -o pid= --ppid "$pm" || true)
    em_sudo kill -9 "$pm"
    for p in $pids; do em_sudo kill -9 "$p" 2>/dev/null || true; done
    deadline=$(( $(date +%s) + 30 ))
    for p in $pm $pids; do
        while kill -0 "$p" 2>/dev/null; do
            [ "$(date +%s)" -ge "$deadline" ] && { ct_log "process $p of node $1 does not end"; return 1; }
            sleep 0.1
        done
    done
    ct_log "node $1 killed (postmaster $pm)"
}

ct_restart_node() { ct_kill_node "$1" && ct_start_node "$1"; }

# ct_start [postgresql.conf lines...]: skip as ct_require_citus does when
# Citus is absent; otherwise init and start the coordinator (node 0) and
# CT_WORKERS workers, CREATE EXTENSION citus on each, and register them from
# the coordinator.  ct_stop runs on exit.
ct_start() {
    local n
    ct_require_citus
    CT_BASE=$(mktemp -d /tmp/earmark-citus.XXXXXX)
    chmod 755 "$CT_BASE"
    trap ct_stop EXIT
    ct_pick_ports || return 1
    for n in $(seq 0 "$CT_WORKERS"); do
        ct_init_node "$n" "$@" || return 1
        ct_start_node "$n" || return 1
        ct_sql "$n" -q -c "CREATE EXTENSION IF NOT EXISTS citus" || return 1
    done
    ct_sql 0 -q -A -t -c "SELECT citus_set_coordinator_host('127.0.0.1', $(ct_port 0))" >/dev/null || return 1
    for n in $(seq 1 "$CT_WORKERS"); do
        ct_sql 0 -q -A -t -c "SELECT citus_add_node('127.0.0.1', $(ct_port "$n"))" >/dev/null || return 1
    done
    ct_log "cluster up in $CT_BASE: coordinator on port $(ct_port 0), workers on $(ct_port 1)..$(ct_port "$CT_WORKERS") ($(ct_val 0 "SELECT citus_version()" | cut -d' ' -f1,2))"
}

# ct_stop: stop every node (immediately) and remove the directory
ct_stop() {
    local n d
    [ -n "$CT_BASE" ] && [ -d "$CT_BASE" ] || return 0
    for n in $(seq 0 "$CT_WORKERS"); do
        d=$(ct_dir "$n")
        [ -f "$d/data/postmaster.pid" ] || continue
        em_as_pg "$EM_PGBIN/pg_ctl" -D "$d/data" -m immediate -w stop >/dev/null 2>&1 || true
    done
    if [ -z "${EM_KEEP:-}" ]; then rm -rf "$CT_BASE"; else ct_log "kept $CT_BASE"; fi
    CT_BASE=
}
