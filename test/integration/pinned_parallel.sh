#!/usr/bin/env bash
# No statement of the C-pinned entry points (earmark_reserve, earmark_charge,
# earmark_heartbeat, earmark_settle; earmark_inbox_receive,
# earmark_inbox_receive_signed, earmark_inbox_claim, earmark_inbox_complete,
# earmark_inbox_ignore, earmark_inbox_fail) runs in a parallel worker.  Their
# search path is an override pushed by their C code (src/spi.c,
# em_call_pinned), which a parallel worker does not inherit: it takes the
# caller's search_path setting instead, while running as earmark's owner.
# So every statement they run must be planned without parallelism, also
# the ones that only run when Citus is installed (src/cluster.c reads
# pg_dist_local_group; it scans pg_dist_partition directly, unplanned).  A cluster of its own with
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
P -c "CREATE EXTENSION citus" -c "CREATE EXTENSION earmark" -c "SELECT earmark_set_limit('pp', 1000000)" \
  -c "SELECT earmark_inbox_set_secret('pp-signed', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')" >/dev/null
ok $? "a database with Citus (not distributed) and earmark"

# a Standard Webhooks delivery of source pp-signed, signed now
pp_ts=$(date +%s)
pp_body='{"type": "pp.thing", "data": {}}'
pp_sig=$(python3 -c 'import base64, hashlib, hmac, sys
key = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
msg = ("pp-signed-1." + sys.argv[1] + "." + sys.argv[2]).encode()
print("v1," + base64.b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode())' "$pp_ts" "$pp_body")

# the plans of every statement the ten run, as a caller with
# force_parallel_mode = on gets them (a new session: the per-backend reads
# of cluster.c run again)
log=$(P 2>&1 >/dev/null <<EOF
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET client_min_messages = log;
SET force_parallel_mode = on;
SELECT job_id AS j FROM earmark_reserve('pp', 10, 'pp-1') \gset
SELECT * FROM earmark_charge('pp', :j, 5);
SELECT earmark_heartbeat('pp', :j);
SELECT * FROM earmark_settle('pp', :j, 5);
SELECT event_id AS e1 FROM earmark_inbox_receive('pp', 'pp-e1', 'pp.thing', '{}') \gset
SELECT event_id AS e2 FROM earmark_inbox_receive('pp', 'pp-e2', 'pp.thing', '{}') \gset
SELECT event_id AS e3 FROM earmark_inbox_receive('pp', 'pp-e3', 'pp.thing', '{}') \gset
SELECT event_id AS e4 FROM earmark_inbox_receive_signed('pp-signed', 'pp-signed-1', '$pp_ts', '$pp_sig', '$pp_body') \gset
SELECT count(*) FROM earmark_inbox_claim(10);
SELECT earmark_inbox_complete(:e1);
SELECT earmark_inbox_ignore(:e2, 'pp');
SELECT earmark_inbox_fail(:e3, 'pp');
SELECT earmark_inbox_complete(:e4);
EOF
)
plans=$(grep -c 'Query Text:' <<<"$log")
ok "$(( plans > 4 ? 0 : 1 ))" "auto_explain logged the nested statements' plans ($plans)"
ok "$(grep -q 'Query Text: SELECT groupid FROM pg_catalog.pg_dist_local_group' <<<"$log"; echo $?)" \
    "  ... among them the read of pg_dist_local_group"
gathers=$(grep -B1 -E '^(Gather|Gather Merge) ' <<<"$log" | grep -c 'Query Text:')
ok "$(grep -q 'Query Text: WITH c AS (' <<<"$log"; echo $?)" "  ... and the inbox claim's"
is "$gathers" 0 "no statement of reserve, charge, heartbeat, settle or of the inbox's pinned entry points is planned to run in a parallel worker"
if [ "$gathers" != 0 ]; then
    grep -B1 -E '^(Gather|Gather Merge) ' <<<"$log" | grep 'Query Text:' | sed 's/^/#   /'
fi
is "$(P -c "SELECT status FROM earmark.job WHERE idempotency_key = 'pp-1'")" completed "the calls did their work"
is "$(P -c "SELECT string_agg(dedupe_key || ' ' || status, ', ' ORDER BY dedupe_key) FROM earmark.inbox_event")" \
    "pp-e1 applied, pp-e2 ignored, pp-e3 failed, pp-signed-1 applied" "  ... the inbox calls too"

done_testing
