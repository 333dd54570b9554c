#!/usr/bin/env bash
# A hold in a prepared transaction that a restart (or a crash) recovered:
# a hold whose lease has passed never causes a refusal, also once that
# transaction is committed.
#
# leasefloor.c keeps a budget's lease floor in shared memory; while a
# prepared transaction with holds is in progress no floor is stored, by
# its own list of prepared xids (filled at PREPARE).  A restart empties
# that list, but PostgreSQL recovers the prepared transaction: its hold is
# invisible (in progress) to a search for dead holds, which then stores a
# floor without it.  An escrow admission locks only its slot row, not the
# budget row, so a reserve that finds no room does not wait for the
# prepared transaction (a plain admission's budget row lock would make it
# wait until COMMIT PREPARED).  COMMIT PREPARED runs no callback of the
# prepared transaction's backend, so nothing lowers the floor: once the
# hold's lease passes, reserves are refused while it stays open.
#
# A cluster of its own (max_prepared_transactions needs a restart to
# change), with earmark preloaded and its worker in database postgres only
# (earmark.database): no sweeper runs in the database of the test, so only
# a reserve's reclaim can expire the hold.
source "$(dirname "$0")/tap.sh"
FX=$(mktemp -d /tmp/earmark-floor-restart.XXXXXX)
FPORT=$((PGPORT + 12))
trap 'own_stop immediate; rm -rf "$FX"' EXIT
fq() { PGHOST=$FX PGPORT=$FPORT q -d floor "$@"; }
own_cluster "$FX" "$FPORT"
PGHOST=$FX PGPORT=$FPORT q -d postgres -c "CREATE DATABASE floor" &&
    fq -c "CREATE EXTENSION earmark"
ok $? "a cluster of its own with max_prepared_transactions, earmark in database floor"

# Limit 100 in 4 escrow slots: two holds cut the slots; h (10, a lease of
# two seconds) is admitted from a slot (escrow's fast path) in a
# transaction that is prepared; then holds of an hour fill the rest.
PGHOST=$FX PGPORT=$FPORT anchored_account floor pr <<'SQL'
SELECT earmark_set_limit('pr', 100), earmark_set_escrow('pr', 4);
SELECT admitted FROM earmark_reserve('pr', 10, 'pr-y1', lease => '1 hour');
SELECT admitted FROM earmark_reserve('pr', 10, 'pr-y2', lease => '1 hour');
BEGIN;
SELECT admitted FROM earmark_reserve('pr', 10, 'pr-h', lease => '2 seconds');
PREPARE TRANSACTION 'pr-h';
SELECT count(*) FROM generate_series(3, 12) g,
       LATERAL earmark_reserve('pr', 10, 'pr-y' || g, lease => '1 hour');
SQL
ok $? "h prepared, the budget filled"
is "$(fq -c "SELECT gid FROM pg_prepared_xacts")" "pr-h" "h's transaction is prepared"

# the restart: the prepared transaction is recovered
own_stop && own_start
ok $? "the cluster restarted"
is "$(fq -c "SELECT gid FROM pg_prepared_xacts")" "pr-h" "h's transaction is prepared after the restart"

# a reserve that finds no room searches for dead holds while h is prepared
fq -c "SET earmark.rate_limit = 0" -c "SELECT admitted FROM earmark_reserve('pr', 10, 'pr-s1')" >/dev/null
ok $? "a reserve while h is prepared"
fq -c "COMMIT PREPARED 'pr-h'"
ok $? "h committed"
is "$(fq -c "SELECT slot IS NOT NULL FROM earmark.job WHERE idempotency_key = 'pr-h'")" "t" \
    "h was admitted from an escrow slot"
# h's lease passes
fq -c "SELECT pg_sleep(greatest(0, extract(epoch FROM (SELECT lease_until FROM earmark.job
                                                       WHERE idempotency_key = 'pr-h') - clock_timestamp())) + 0.3)" >/dev/null
is "$(fq -c "SELECT status, lease_until < clock_timestamp() FROM earmark.job WHERE idempotency_key = 'pr-h'")" \
    "running|t" "h is open and its lease has passed"

# reserves of 10 until one is refused: before that refusal h, dead, is
# reclaimed (a hold whose lease has passed never causes a refusal)
refusals=$(fq -c "SET earmark.rate_limit = 0" -c "
    SELECT count(*) FILTER (WHERE NOT admitted)
      FROM generate_series(1, 5) g, LATERAL earmark_reserve('pr', 10, 'pr-after' || g, lease => '1 hour')")
ok "$(( refusals > 0 ? 0 : 1 ))" "the budget is full: $refusals of 5 refused"
is "$(fq -c "SELECT status FROM earmark.job WHERE idempotency_key = 'pr-h'")" "expired" \
    "h, dead, was reclaimed before a refusal"
is "$(fq -c "SELECT count(*) FROM earmark.job WHERE status IN ('running', 'capped') AND lease_until < clock_timestamp()")" \
    "0" "no open hold of a full budget is dead"

done_testing
