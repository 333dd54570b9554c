#!/usr/bin/env bash
# No statement of the C-pinned entry points (earmark_reserve, earmark_charge,
# earmark_heartbeat, earmark_settle) runs in a parallel worker.  Their
# search path is an override pushed by their C code (src/spi.c,
# em_call_pinned), which a parallel worker does not inherit: it takes the
# caller's search_path setting instead, while running as earmark's owner.
# So every statement they run must be planned without parallelism, also
# the ones that only run when Citus is installed (src/cluster.c reads
# pg_dist_partition and pg_dist_local_group).  A cluster of its own with
# shared_preload_libraries = 'citus,earmark' (CREATE EXTENSION citus, not
# distributed: the reads run whenever Citus is installed); the caller sets
# force_parallel_mode = on, which puts a Gather on every plan that may run
# in parallel, and auto_explain logs the plan of every nested statement.
# Skipped when Citus is not installed.
source "$(dirname "$0")/tap.sh"

if [ ! -f "$("$EM_PGBIN/pg_config" --pkglibdir 2>/dev/null || echo "$EM_PGBIN/../lib")/citus.so" ]; then
    # (the runner counts a plan of 0 with no assertions as passed)
    echo "# skipped: Citus is not installed"
    echo "1..0"
    exit 0
fi

PP=$(mktemp -d /tmp/earmark-pinned-parallel.XXXXXX)
chown postgres "$PP"; chmod 755 "$PP"
# next to the citus layer's nodes (CT_PORT .. CT_PORT+3)
PPORT=$(( ${EM_CITUS_PORT:-$((PGPORT + 300))} + 4 ))
cleanup() {
    runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$PP/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$PP"
}
trap cleanup EXIT
runuser -u postgres -- "$EM_PGBIN/initdb" -D "$PP/data" -U postgres -A trust >/dev/null 2>&1
{
    echo "port = $PPORT"
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$PP'"
    echo "shared_preload_libraries = 'citus,earmark'"
    echo "earmark.database = 'postgres'"
    echo "max_worker_processes = 16"
} >>"$PP/data/postgresql.conf"
runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$PP/data" -l "$PP/log" -w -t 120 \
    ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} start >/dev/null
P() { PGHOST=$PP PGPORT=$PPORT q -d pp "$@"; }

PGHOST=$PP PGPORT=$PPORT q -d postgres -c "CREATE DATABASE pp" >/dev/null
P -c "CREATE EXTENSION citus" -c "CREATE EXTENSION earmark" -c "SELECT earmark_set_limit('pp', 1000000)" >/dev/null
ok $? "a database with Citus (not distributed) and earmark"

# the plans of every statement the four run, as a caller with
# force_parallel_mode = on gets them (a new session: the per-backend reads
# of cluster.c run again)
log=$(P 2>&1 >/dev/null <<'EOF'
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET client_min_messages = log;
SET force_parallel_mode = on;
SELECT job_id AS j FROM earmark_reserve('pp', 10, 'pp-1') \gset
SELECT * FROM earmark_charge('pp', :j, 5);
SELECT earmark_heartbeat('pp', :j);
SELECT * FROM earmark_settle('pp', :j, 5);
EOF
)
plans=$(grep -c 'Query Text:' <<<"$log")
ok "$(( plans > 4 ? 0 : 1 ))" "auto_explain logged the nested statements' plans ($plans)"
ok "$(grep -q 'Query Text: SELECT 1 FROM pg_catalog.pg_dist_partition' <<<"$log"; echo $?)" \
    "  ... among them the read of pg_dist_partition"
gathers=$(grep -B1 -E '^(Gather|Gather Merge) ' <<<"$log" | grep -c 'Query Text:')
is "$gathers" 0 "no statement of reserve, charge, heartbeat or settle is planned to run in a parallel worker"
if [ "$gathers" != 0 ]; then
    grep -B1 -E '^(Gather|Gather Merge) ' <<<"$log" | grep 'Query Text:' | sed 's/^/#   /'
fi
is "$(P -c "SELECT status FROM earmark.job WHERE idempotency_key = 'pp-1'")" completed "the calls did their work"

done_testing
