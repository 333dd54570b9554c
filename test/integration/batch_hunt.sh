#!/usr/bin/env bash
# test/integration/batch_hunt.sh: a randomized hunt for overspends through
# the batch calls (test/hunt/batch_hunt.py, whose header gives the rule it
# checks): 6 clients on 3 accounts (escrow none, by hand, automatic) for
# 30 s, earmark_reserve_many and earmark_settle_many among single calls,
# savepoints, rollbacks, PREPARE TRANSACTION, all three isolation levels,
# an admin raising limits and changing slots, and a checker reading the
# strict rule in one snapshot every 0.3 s.
#
# The first line printed is the seed.  Replay a seed, or hunt longer:
#   BATCH_HUNT_SEED=N BATCH_HUNT_SECONDS=600 bash test/integration/batch_hunt.sh
# Runs in database "postgres"; its accounts are named after the run and
# removed afterwards (BATCH_HUNT_KEEP=1 keeps them).
source "$(dirname "$0")/tap.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SEED=${BATCH_HUNT_SEED:-$(( $(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % 2147483646 + 1 ))}
echo "# batch hunt seed $SEED (replay: BATCH_HUNT_SEED=$SEED bash test/integration/batch_hunt.sh)"
export BATCH_HUNT_SEED=$SEED
export BATCH_HUNT_RUN=bhunt$(( SEED % 1000000 ))x$$

hunt_python

WORK=$(mktemp -d /tmp/earmark-batch-hunt.XXXXXX)
clean() {
    [ -n "${BATCH_HUNT_KEEP:-}" ] && { diag "kept the accounts ${BATCH_HUNT_RUN}_*"; return; }
    drop_run_accounts "$BATCH_HUNT_RUN"
}
trap 'clean; rm -rf "$WORK"' EXIT
q -d postgres -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null

PGDATABASE=postgres "$PY" "$ROOT/test/hunt/batch_hunt.py" --results "$WORK/results"
hunt_results "$WORK/results" $?
done_testing
