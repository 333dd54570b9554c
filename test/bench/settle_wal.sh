#!/usr/bin/env bash
# test/bench/settle_wal.sh: the WAL a settle writes, by the kind of job it
# settles, one settle a transaction, read off pg_waldump --stats=record
# between two WAL positions (full-page images left out: they follow the
# checkpoints' timing, not the settle).
#
#   bash test/bench/settle_wal.sh
#
# A throwaway cluster (earmark not preloaded: no worker writes meanwhile;
# earmark.rate_limit = 0) gets account "plain" (no escrow) and account
# "slots" (one escrow slot), 100 open jobs on the first and 200 on the
# second (taken from the slot: each reserve commits before the next, so
# the slot is free).  Then, in a DO block that commits after each call,
#   no escrow             100 settles of plain's jobs;
#   slot job, free slot   100 settles of slots' jobs, the slot free;
#   slot job, slot held   100 settles of slots' jobs while another session
#                         holds the slot in an open transaction (its own
#                         reserve): each settles into the budget row.
# Prints records and bytes a settle, and the records of each kind that
# come to at least 0.05 a settle.  SETTLE_WAL_PORT (55470).

set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
PORT=${SETTLE_WAL_PORT:-55470}
em_setup
em_start_cluster "$PORT" "earmark.rate_limit = 0" "jit = off"
# (earmark warns that it is not preloaded: on purpose here)
export PGOPTIONS="-c client_min_messages=error"
P() { "$EM_PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d postgres "$@"; }
P >/dev/null <<'SQL'
SET client_min_messages = error;
CREATE EXTENSION earmark;
SET earmark.rate_limit = 0;
SELECT earmark_set_account(a, date_trunc('month', now())) FROM (VALUES ('plain'), ('slots')) v(a);
SELECT earmark_set_limit(a, 1000000000000) FROM (VALUES ('plain'), ('slots')) v(a);
SELECT earmark_set_escrow('plain', 0), earmark_set_escrow('slots', 1);
SELECT earmark_settle('slots', r.job_id, 0) FROM earmark_reserve('slots', 1, 'warm-up') r;
CREATE TABLE wal_jobs (n int PRIMARY KEY, account text, job_id bigint);
DO $$
DECLARE
    i int;
    a text;
    r record;
BEGIN
    FOR i IN 1..300 LOOP
        a := CASE WHEN i <= 100 THEN 'plain' ELSE 'slots' END;
        SELECT * INTO r FROM earmark_reserve(a, 1, 'k' || i);
        INSERT INTO wal_jobs VALUES (i, a, r.job_id);
        COMMIT;
    END LOOP;
END
$$;
SQL
[ "$(P -c "SELECT count(*) FROM wal_jobs w JOIN earmark.job j USING (account, job_id) WHERE w.n > 100 AND j.slot IS NOT NULL")" = 200 ] \
    || { echo "the slots account's jobs did not all come from the slot" >&2; exit 1; }

# measure LABEL FIRST LAST: the settles of wal_jobs FIRST..LAST
measure() {
    local before after n=$(($3 - $2 + 1))
    before=$(P -c "SELECT pg_current_wal_insert_lsn()")
    P >/dev/null <<SQL
SET earmark.rate_limit = 0;
DO \$\$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT account, job_id FROM wal_jobs WHERE n BETWEEN $2 AND $3 ORDER BY n LOOP
        PERFORM earmark_settle(r.account, r.job_id, 0);
        COMMIT;
    END LOOP;
END
\$\$;
SQL
    after=$(P -c "SELECT pg_current_wal_insert_lsn()")
    "$EM_PGBIN/pg_waldump" -p "$EM_DATA/pg_wal" -s "$before" -e "$after" --stats=record 2>/dev/null |
        awk -v label="$1" -v n="$n" '
            /^Total/ { gsub(/[][%]/, ""); total = sprintf("%.2f records, %.0f bytes", $2 / n, $3 / n) }
            /^[A-Z][A-Za-z0-9]*\/[A-Z_]+ / && $2 / n >= 0.05 { kinds = kinds sprintf("%s%s %.2f", sep, $1, $2 / n); sep = ", " }
            END { printf "| %s | %s | %s |\n", label, total, kinds }'
}

echo "| settle of | a settle (without full pages) | records a settle |"
echo "| --- | --- | --- |"
measure "a job, no escrow" 1 100
measure "a slot job, the slot free" 101 200
# the slot held by an open transaction: the settles go to the budget row
P -c "SET earmark.rate_limit = 0" -c "BEGIN" -c "SELECT earmark_reserve('slots', 1, 'holder')" \
  -c "SELECT pg_sleep(3600)" >/dev/null 2>&1 &
HOLDER=$!
for _ in $(seq 1 150); do
    [ "$(P -c "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(3600)'")" = 1 ] && break
    sleep 0.2
done
[ "$(P -c "SELECT count(*) FROM (SELECT 1 FROM earmark.budget_slot WHERE account = 'slots' FOR UPDATE SKIP LOCKED) s")" = 0 ] \
    || { echo "the holder does not hold the slot" >&2; exit 1; }
measure "a slot job, the slot held" 201 300
P -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(3600)'" >/dev/null
wait "$HOLDER" 2>/dev/null || true   # ended by the terminate
