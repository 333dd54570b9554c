#!/usr/bin/env bash
# scripts/demo.sh: the earmark demo on a fresh Debian 12 machine.
#
# Installs what is missing, builds and installs earmark, starts a private
# throwaway cluster (port 55450) with earmark preloaded, and runs the
# Concurrency Lab and a small load run (test/lab/earmark_lab.c) side by side:
# the usual "read what is left, then spend" check against earmark's
# reserve / charge / settle.  The cluster stops and is removed on exit.
#
# Run as root or as a user with sudo:  bash scripts/demo.sh
# Extra arguments go to the lab program (e.g. --jobs, --concurrency).

source "$(dirname "$0")/lib.sh"
em_setup
em_start_cluster 55450 "shared_preload_libraries = 'earmark'"

DEMO_DB=earmark_demo
DEMO_TMP=$(mktemp -d /tmp/earmark-demo.XXXXXX)
# keep lib.sh's cluster stop; remove the program's temp dir as well
trap 'rm -rf "$DEMO_TMP"; em_stop_cluster' EXIT

em_psql -d postgres -c "CREATE DATABASE $DEMO_DB"
em_psql -d "$DEMO_DB" -c "CREATE EXTENSION earmark"

em_log "compiling the lab program"
gcc -std=c11 -O2 -Wall -Wextra -Werror -I"$("$EM_PGBIN/pg_config" --includedir)" \
    "$EM_ROOT/test/lab/earmark_lab.c" -L"$("$EM_PGBIN/pg_config" --libdir)" -lpq -lpthread \
    -o "$DEMO_TMP/earmark_lab"

em_log "running the lab and the load (database $DEMO_DB)"
echo
"$DEMO_TMP/earmark_lab" --db "$DEMO_DB" --account-prefix demo --mode all --check "$@"
