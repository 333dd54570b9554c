#!/usr/bin/env bash
# The launcher: one earmark worker in every database where the extension is
# installed, on a cluster of its own with earmark.database unset (the
# runner's cluster pins its worker to database postgres).
# - two databases with the extension: both get a worker, both are swept,
#   each one's worker_status counts its own worker;
# - CREATE EXTENSION starts a worker at once, DROP EXTENSION stops it;
# - DROP DATABASE and ALTER DATABASE ... RENAME are not blocked by it;
# - a worker that is terminated is started again; after kill -9 (the
#   postmaster restarts every process) the launcher brings them all back;
# - earmark.database set: only that database gets a worker; set to a
#   database that does not exist: a WARNING;
# - two slots (earmark.max_databases) and more databases without earmark:
#   both databases with earmark get a worker; a terminated worker is back
#   at its retry even with an hour's launcher_naptime.
source "$(dirname "$0")/tap.sh"

LC=$(mktemp -d /tmp/earmark-launcher.XXXXXX)
chown postgres "$LC"; chmod 755 "$LC"
LPORT=$((PGPORT + 7))
cleanup() {
    runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$LC/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$LC"
}
trap cleanup EXIT
start_lc() {
    runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$LC/data" -l "$LC/log" -w -t 120 \
        ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} start >/dev/null
}
runuser -u postgres -- "$EM_PGBIN/initdb" -D "$LC/data" -U postgres -A trust >/dev/null 2>&1
{
    echo "port = $LPORT"
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$LC'"
    echo "shared_preload_libraries = 'earmark'"
    echo "earmark.launcher_naptime = '500ms'"
    echo "earmark.sweep_interval = '200ms'"
    echo "max_worker_processes = 16"
} >>"$LC/data/postgresql.conf"
start_lc
L() { PGHOST=$LC PGPORT=$LPORT q "$@"; }
workers() {
    L -d postgres -c "SELECT coalesce(string_agg(datname, ',' ORDER BY datname), '') FROM pg_stat_activity
                      WHERE backend_type = 'earmark worker'"
}
wait_workers() {   # wait_workers EXPECTED: until the workers' databases are these
    local got i
    for i in $(seq 1 300); do
        got=$(workers 2>/dev/null)
        [ "$got" == "$1" ] && { echo "$got"; return 0; }
        sleep 0.2
    done
    echo "$got"
}
# a hold whose lease has passed, in database $1; prints the job's status once swept
swept() {
    local j
    L -d "$1" -c "SELECT earmark_set_limit('l', 100)" >/dev/null
    j=$(L -d "$1" -c "SELECT job_id FROM earmark_reserve('l', 10, 'k-$RANDOM', lease => '1 hour')")
    L -d "$1" -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $j" >/dev/null
    DB=$1 PGHOST=$LC PGPORT=$LPORT wait_for 60 "SELECT status FROM earmark.job WHERE job_id = $j" expired
}

is "$(L -d postgres -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark launcher'")" 1 \
   "one launcher runs"
is "$(wait_workers "")" "" "no database has the extension: no worker"

L -d postgres -c "CREATE DATABASE one" -c "CREATE DATABASE two" -c "CREATE DATABASE three" >/dev/null
L -d one -c "CREATE EXTENSION earmark" >/dev/null
L -d two -c "CREATE EXTENSION earmark" >/dev/null
is "$(wait_workers "one,two")" "one,two" "the two databases with the extension have a worker each (not three)"
is "$(swept one)" expired "database one's worker sweeps its dead hold"
is "$(swept two)" expired "database two's worker sweeps its dead hold"
is "$(L -d one -c "SELECT workers_running FROM earmark.worker_status")" 1 \
   "worker_status in one counts one's worker"
is "$(L -d two -c "SELECT workers_running FROM earmark.worker_status")" 1 "... and in two, two's"

L -d three -c "CREATE EXTENSION earmark" >/dev/null
is "$(wait_workers "one,three,two")" "one,three,two" "CREATE EXTENSION in three starts its worker"
L -d three -c "DROP EXTENSION earmark" >/dev/null
is "$(wait_workers "one,two")" "one,two" "DROP EXTENSION stops it"

L -d postgres -c "ALTER DATABASE two RENAME TO deux" >/dev/null
ok $? "ALTER DATABASE two RENAME while its worker runs"
is "$(wait_workers "deux,one")" "deux,one" "... and the renamed database gets its worker back"
L -d postgres -c "DROP DATABASE deux" >/dev/null
ok $? "DROP DATABASE while its worker runs"
is "$(wait_workers "one")" "one" "... and only one's worker is left"

old=$(L -d postgres -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'")
L -d postgres -c "SELECT pg_terminate_backend($old)" >/dev/null
got=$(PGHOST=$LC PGPORT=$LPORT wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND pid <> $old" 1)
is "$got" 1 "a terminated worker is started again"

old=$(L -d postgres -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'")
kill -9 "$old"
for i in $(seq 1 600); do L -d postgres -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.2; done
is "$(wait_workers "one")" "one" "after kill -9 (every process restarted) the launcher starts one's worker again"
is "$(swept one)" expired "... and it sweeps"

# earmark.database: only that database
L -d postgres -c "CREATE DATABASE four" >/dev/null
L -d four -c "CREATE EXTENSION earmark" >/dev/null
is "$(wait_workers "four,one")" "four,one" "a new database with the extension gets a worker"
echo "earmark.database = 'four'" >>"$LC/data/postgresql.conf"
runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$LC/data" -m fast -w stop >/dev/null
start_lc
is "$(wait_workers "four")" "four" "with earmark.database = 'four' only four has a worker"

# Slots are for databases with earmark: two slots, four databases without
# it (postgres, three, n1, n2) and two with it, and both get a worker.  A
# launcher_naptime of an hour: only the launcher's own retry times (and
# its workers' exits) wake it.
L -d postgres -c "CREATE DATABASE n1" -c "CREATE DATABASE n2" >/dev/null
sed -i "/^earmark.database = 'four'/d" "$LC/data/postgresql.conf"
{
    echo "earmark.max_databases = 2"
    echo "earmark.launcher_naptime = '1h'"
} >>"$LC/data/postgresql.conf"
runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$LC/data" -m fast -w stop >/dev/null
from=$(($(wc -l <"$LC/log") + 1))
start_lc
is "$(wait_workers "four,one")" "four,one" \
   "two slots, four databases without earmark: both databases with earmark get a worker"
old=$(L -d postgres -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND datname = 'one'")
L -d postgres -c "SELECT pg_terminate_backend($old)" >/dev/null
got=$(PGHOST=$LC PGPORT=$LPORT wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND datname = 'one' AND pid <> $old" 1)
is "$got" 1 "a terminated worker is back at its retry, not at the next launcher_naptime (an hour)"
is "$(tail -n +"$from" "$LC/log" | grep -c 'earmark is not installed in database')" 0 \
   "a database without earmark is no news for the server log"

# earmark.database naming no database: said in the log, not silent
echo "earmark.database = 'no_such_db'" >>"$LC/data/postgresql.conf"
runuser -u postgres -- "$EM_PGBIN/pg_ctl" -D "$LC/data" -m fast -w stop >/dev/null
start_lc
for i in $(seq 1 300); do grep -q 'earmark.database is "no_such_db"' "$LC/log" && break; sleep 0.2; done
is "$(grep -c 'WARNING:  earmark launcher: earmark.database is "no_such_db", and no database of that name accepts connections' "$LC/log")" 1 \
   "earmark.database naming no database: one WARNING"
is "$(wait_workers "")" "" "... and no worker"

done_testing
