#!/usr/bin/env bash
# test/integration/hunt.sh: a randomized concurrency hunt with its own model
# of the books (test/hunt/hunt.py, whose header explains the model and why
# its admission check is sound).  16 clients on 4 hot accounts for about a
# minute: reserves, charges, heartbeats, settles, recorded usage and
# corrections, limit, escrow and anchor changes, sweeps, ROLLBACKs,
# REPEATABLE READ retries, a stretch with the rate limit on, and backends
# killed at random; the model checks every admission against the limit that
# could have been in force, and the books at quiet points and at the end.
#
# The first line printed is the seed.  Replay a seed, or hunt longer:
#   HUNT_SEED=N HUNT_SECONDS=600 bash test/integration/hunt.sh
# Knobs (see test/hunt/hunt.py): HUNT_CLIENTS, HUNT_SECONDS, HUNT_ACCOUNTS,
# HUNT_KILL, HUNT_ESCROW, HUNT_RR, HUNT_RATE, HUNT_BIAS, HUNT_QUIET.
# Runs in database "postgres", where the earmark worker sweeps every 200 ms;
# its accounts are named after the run (hunt<seed>x<pid>_...) and removed
# afterwards (HUNT_KEEP=1 keeps them), so it leaves other tests' rows alone.
# On today's code it finds the known overspends (escrow's fast path racing
# an anchor change; escrow handing released room out while over the limit;
# REPEATABLE READ reserves that miss a committed usage or limit): this
# script then fails until they are fixed.
source "$(dirname "$0")/tap.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SEED=${HUNT_SEED:-$(( $(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % 2147483646 + 1 ))}
echo "# hunt seed $SEED (replay: HUNT_SEED=$SEED HUNT_SECONDS=${HUNT_SECONDS:-60} bash test/integration/hunt.sh)"
export HUNT_SEED=$SEED
# the run's name: its accounts are named after it, and only they are removed
# afterwards (another hunt may share the cluster)
export HUNT_RUN=hunt$(( SEED % 1000000 ))x$$

# the Debian package's psycopg2 lives in the system's python3
PY=
for p in ${HUNT_PYTHON:-} /usr/bin/python3 python3; do
    if "$p" -c 'import psycopg2' 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
    ok 1 "python3 with psycopg2 (the python3-psycopg2 package) is installed"
    done_testing
    exit 1
fi

WORK=$(mktemp -d /tmp/earmark-hunt.XXXXXX)
# the hunt's accounts go afterwards (HUNT_KEEP=1 keeps them for a look), so
# that the scripts after this one find the books as they left them
clean() {
    [ -n "${HUNT_KEEP:-}" ] && { diag "kept the accounts ${HUNT_RUN}_* and schema hunt"; return; }
    q -d postgres -v run="$HUNT_RUN" >/dev/null 2>&1 <<'SQL'
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
DELETE FROM hunt.tx_marker WHERE marker LIKE :'run' || '-%';
COMMIT;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM hunt.tx_marker) THEN DROP SCHEMA hunt CASCADE; END IF;
END $$;
SQL
}
trap 'clean; rm -rf "$WORK"' EXIT
q -d postgres -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null

PGDATABASE=postgres "$PY" "$ROOT/test/hunt/hunt.py" --results "$WORK/results"
rc=$?
if [ ! -s "$WORK/results" ]; then
    ok 1 "the hunt ran to its end (exit $rc)"
else
    while IFS='|' read -r bad text; do
        ok "$bad" "$text"
    done <"$WORK/results"
fi
done_testing
