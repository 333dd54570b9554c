#!/usr/bin/env bash
# docs/quickstart.md, step by step, on an "existing server": a cluster of
# its own that runs without earmark, with pg_stat_statements preloaded, a
# role `app` and its database `app` with a table of the application's.
# The SQL and the configuration are read from the page's code blocks (each
# after a `<!-- quickstart.sh: NAME -->` line), so that the page and this
# test cannot say different things:
# - show:     SHOW shared_preload_libraries (the server's list before)
# - config:   appended to postgresql.conf; then a restart (the page's
#             `systemctl restart`, here pg_ctl restart)
# - launcher: one earmark launcher, and the other library still loaded
# - install:  as the superuser in app
# - job:      as app in app; its output must be the page's "job output"
#             block, and the budget and ledger must say the same
# - check:    worker_status in app says 1 worker, and it is app's
# Step 1 (build and install) is the runner's: it installed this checkout.
source "$(dirname "$0")/tap.sh"

PAGE=$(cd "$(dirname "$0")/../.." && pwd)/docs/quickstart.md
QS=$(mktemp -d /tmp/earmark-quickstart.XXXXXX)
chown postgres "$QS"; chmod 755 "$QS"
QPORT=$((PGPORT + 8))
cleanup() {
    runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$QS/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$QS"
}
trap cleanup EXIT
export PGHOST=$QS PGPORT=$QPORT
pg_ctl_() { runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$QS/data" -l "$QS/log" -w -t 120 "$@" >/dev/null; }

# block NAME: the code block after "<!-- quickstart.sh: NAME -->"
block() {
    awk -v m="<!-- quickstart.sh: $1 -->" '
        $0 == m { found = 1; next }
        found == 1 && /^```/ { found = 2; next }
        found == 2 && /^```/ { exit }
        found == 2 { print }' "$PAGE"
}
# run USER NAME [psql options]: the block NAME, as USER, in database app
run() {
    local user=$1 name=$2
    shift 2
    block "$name" >"$QS/$name.sql"
    "$EM_PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -U "$user" -d app "$@" -f "$QS/$name.sql"
}

for b in show config launcher install job "job output" check; do
    [ -n "$(block "$b")" ] || { echo "Bail out! docs/quickstart.md has no block \"$b\""; exit 1; }
done

# --- the existing server -----------------------------------------------------
runuser -u postgres -- "$EM_PGBIN/initdb" -D "$QS/data" -U postgres -A trust >/dev/null 2>&1
{
    echo "port = $QPORT"
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$QS'"
    echo "shared_preload_libraries = 'pg_stat_statements'"
} >>"$QS/data/postgresql.conf"
pg_ctl_ ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} start
q -d postgres -c "CREATE ROLE app LOGIN" -c "CREATE DATABASE app OWNER app" >/dev/null
q -U app -d app -c "CREATE TABLE orders (id bigint PRIMARY KEY, earmark_job bigint)" >/dev/null
is "$(q -d postgres -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'earmark%'")" 0 \
   "the existing server runs without earmark"

# --- 2. preload the library --------------------------------------------------
is "$(run postgres show -A -t)" "pg_stat_statements" \
   "step 2: SHOW shared_preload_libraries gives the list the page starts from"
block config >>"$QS/data/postgresql.conf"

# --- 3. restart (systemctl restart postgresql@15-main on Debian) -------------
pg_ctl_ ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} restart
is "$(run postgres launcher -A -t)" 1 "step 3: after the restart one earmark launcher runs"
is "$(q -d postgres -c "SELECT count(*) FROM pg_shmem_allocations WHERE name = 'pg_stat_statements'")" 1 \
   "... and pg_stat_statements, preloaded before, is still loaded"

# --- 4. create the extension in the application's database -------------------
run postgres install >/dev/null
ok $? "step 4: CREATE EXTENSION, GRANT and the limit, as the superuser in app"

# --- 5. one job, as the application -------------------------------------------
got=$(run app job 2>&1 | sed 's/ *$//')
want=$(block "job output" | sed 's/ *$//')
is "$got" "$want" "step 5: the job's output, as app, is the page's"
is "$(q -d app -c "SELECT lim, used, held, remaining FROM earmark_budget('acme')")" "100000|31200|0|68800" \
   "... the budget: 31,200 used of 100,000, nothing held, 68,800 left"
is "$(q -d app -c "SELECT status, charged, released FROM earmark.job WHERE job_id = 1")" \
   "completed|31200|8800" "... the job: completed, 31,200 charged, 8,800 released"
is "$(q -d app -c "SELECT sum(units) FROM earmark.ledger")" 31200 "... and the ledger holds 31,200"

# --- 6. the worker -------------------------------------------------------------
# the page's query, until it gives the page's answer
for i in $(seq 1 300); do
    got=$(run postgres check -A -t 2>&1)
    [ "$got" == 1 ] && break
    sleep 0.2
done
is "$got" 1 "step 6: worker_status in app counts its worker"
is "$(q -d postgres -c "SELECT string_agg(datname, ',') FROM pg_stat_activity WHERE backend_type = 'earmark worker'")" \
   app "... the one earmark worker of the server runs in app"
j=$(q -U app -d app -c "SELECT job_id FROM earmark_reserve('acme', 10, 'order-lost', lease => '1 hour')")
q -d app -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $j" >/dev/null
is "$(DB=app wait_for 60 "SELECT status FROM earmark.job WHERE job_id = $j" expired)" expired \
   "... and it sweeps a hold whose lease has passed"

done_testing
