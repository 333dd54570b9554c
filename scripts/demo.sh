#!/usr/bin/env bash
# scripts/demo.sh: the earmark demo on a fresh Debian 12 machine.
#
# Installs what is missing, builds and installs earmark, starts a private
# throwaway cluster (port 55450) with earmark preloaded, and runs the
# Concurrency Lab and a small load run (test/lab/earmark_lab.c) side by side:
# the usual "read what is left, then spend" check against earmark's
# reserve / charge / settle.  Then the Engine Room
# (test/integration/engine_room.sh): nine webhook deliveries of three events
# through the inbox and the background worker (which runs in database
# postgres), the worker killed with kill -9 halfway, next to a naive handler
# that applies each delivery on arrival.  The cluster stops and is removed
# on exit.
#
# Run as root or as a user with sudo:  bash scripts/demo.sh
# Extra arguments go to the lab program (e.g. --jobs, --concurrency).

source "$(dirname "$0")/lib.sh"
em_setup
# the worker applies the Engine Room's inbox events in database postgres
em_start_cluster 55450 "shared_preload_libraries = 'earmark'" "earmark.database = 'postgres'"
export EM_BASE EM_DATA

DEMO_DB=earmark_demo
DEMO_TMP=$(mktemp -d /tmp/earmark-demo.XXXXXX)
# keep lib.sh's cluster stop; remove the program's temp dir as well
trap 'rm -rf "$DEMO_TMP"; em_stop_cluster' EXIT

em_psql -d postgres -c "CREATE DATABASE $DEMO_DB"
em_psql -d "$DEMO_DB" -c "CREATE EXTENSION earmark"

em_log "compiling the lab program"
# the headers and libpq of the system's PostgreSQL: a private copy of it
# (EM_PREFIX) holds the server's programs and libraries only
PGC=/usr/lib/postgresql/15/bin/pg_config
[ -x "$PGC" ] || PGC="$EM_PGBIN/pg_config"
gcc -std=c11 -O2 -Wall -Wextra -Werror -I"$("$PGC" --includedir)" \
    "$EM_ROOT/test/lab/earmark_lab.c" -L"$("$PGC" --libdir)" -lpq -lpthread \
    -o "$DEMO_TMP/earmark_lab"

em_log "running the lab and the load (database $DEMO_DB)"
echo
"$DEMO_TMP/earmark_lab" --db "$DEMO_DB" --account-prefix demo --mode all --check "$@"

# --- the Engine Room -------------------------------------------------------
echo
em_log "running the Engine Room (database postgres, with the background worker)"
ER_LOG=$DEMO_TMP/engine_room.log
er_rc=0
bash "$EM_ROOT/test/integration/engine_room.sh" >"$ER_LOG" 2>&1 || er_rc=$?
er_ok=$(grep -c '^ok ' "$ER_LOG" || true)
er_fail=$(grep -c '^not ok ' "$ER_LOG" || true)
# "#   naive apply-on-arrival: pro 2950 (plan, balance)" -> "pro 2950"
er_naive=$(sed -n 's/^#   naive apply-on-arrival: *\([^ ]* [^ ]*\).*/\1/p' "$ER_LOG")
er_inbox=$(sed -n 's/^#   earmark inbox: *\([^ ]* [^ ]*\).*/\1/p' "$ER_LOG")
echo
echo "## Engine Room: 9 webhook deliveries of 3 events, the worker killed once"
echo
grep '^# ' "$ER_LOG" || true
echo
echo "| handler                                    | plan | balance |"
echo "|--------------------------------------------|------|--------:|"
read -r naive_plan naive_balance <<<"${er_naive:-- -}"
read -r inbox_plan inbox_balance <<<"${er_inbox:-- -}"
printf '| %-42s | %-4s | %7s |\n' "naive: apply each delivery on arrival" "$naive_plan" "$naive_balance"
printf '| %-42s | %-4s | %7s |\n' "earmark inbox: store, claim, apply once" "$inbox_plan" "$inbox_balance"
printf '| %-42s | %-4s | %7s |\n' "correct (Free 10 + Pro allowance 490)" pro 500
echo
if [ "$er_rc" -eq 0 ] && [ "$er_fail" -eq 0 ]; then
    echo "Engine Room checks: $er_ok passed"
else
    echo "Engine Room checks: $er_ok passed, $er_fail failed (exit status $er_rc):"
    grep -v '^ok ' "$ER_LOG" || true
    exit 1
fi
