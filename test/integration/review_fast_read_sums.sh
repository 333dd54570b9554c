#!/usr/bin/env bash
# review_fast_read_sums: escrow's fast path reads the same numbers by index
# from C (escrow.c, fast_read_direct) as its SQL statement (fast_numbers)
# does: sum(...) over numeric, then ::bigint, so only a total past bigint is
# an error.  The C sums must not fail where the statement did not: a sum of
# counter rows or slot rows whose running total passes bigint on the way,
# in index order, while the total does not.
#
# 1. Recorded usage, through the API only: three sessions open at once get
#    three usage shards (ledger.c, em_usage_shard).  The two lower shards
#    record 5 * 10^18 each (5,000 calls of at most 10^15), the highest a
#    correction of -5 * 10^18 in between (so the cycle's total never passes
#    5 * 10^18 + 3, and every SQL total along the way is a bigint).  In
#    shard order the counters run 5e18, 1e19 (past bigint), 5e18.
# 2. Slot sums: four slots' held moved by +4.7e18, +4.7e18, -4.7e18,
#    -4.7e18 (written by hand: every sum, total and allocation is what it
#    was; a slot's own held goes below zero whenever a hold is settled in
#    another slot, escrow.c's header).  In slot order held runs past bigint.
#
# On 3ec915c (fast_numbers through SPI) both reserves are admitted through a
# slot; with the C read as in fast_read_direct.diff both fail with "bigint
# out of range".
source "$(dirname "$0")/tap.sh"
DB=review_fast_read_sums
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
q -d $DB -c "CREATE EXTENSION earmark" -c "CREATE EXTENSION dblink" >/dev/null
ok $? "earmark and dblink in a database of their own"

# every account's cycle began 14 to 17 days ago: none ends while this runs
anchor="(SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
          least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC')
          FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t)"

# --- 1. recorded usage ------------------------------------------------------
out=$(q -d $DB -v host="$PGHOST" -v port="$PGPORT" -v user="$PGUSER" -v db=$DB <<SQL
SET earmark.rate_limit = 0;
SELECT earmark_set_account('rec', $anchor);
SELECT earmark_set_limit('rec', NULL);
SELECT earmark_set_escrow('rec', 2);
SELECT admitted FROM earmark_reserve('rec', 1, 'warm-1');
SELECT format('host=%s port=%s user=%s dbname=%s', :'host', :'port', :'user', :'db') AS cs \gset
SELECT dblink_connect('c1', :'cs'), dblink_connect('c2', :'cs'), dblink_connect('c3', :'cs');
-- which shard each session writes: one unit each, one session at a time
SELECT * FROM dblink('c1', \$\$SELECT earmark_record_usage('rec', 1, 'p1')::text\$\$) t(x text);
SELECT shard AS s1 FROM earmark.usage_shard WHERE account = 'rec' \gset
SELECT * FROM dblink('c2', \$\$SELECT earmark_record_usage('rec', 1, 'p2')::text\$\$) t(x text);
SELECT shard AS s2 FROM earmark.usage_shard WHERE account = 'rec' AND shard <> :s1 \gset
SELECT * FROM dblink('c3', \$\$SELECT earmark_record_usage('rec', 1, 'p3')::text\$\$) t(x text);
SELECT shard AS s3 FROM earmark.usage_shard WHERE account = 'rec' AND shard NOT IN (:s1, :s2) \gset
SELECT (array_agg(c ORDER BY s))[1] AS lo1, (array_agg(c ORDER BY s))[2] AS lo2,
       (array_agg(c ORDER BY s))[3] AS hi
FROM (VALUES ('c1', :s1), ('c2', :s2), ('c3', :s3)) v(c, s) \gset
-- 5,000 calls' worth each: lower shard +5e18, highest -5e18, other lower +5e18
SELECT * FROM dblink(:'lo1', \$\$SELECT count(*)::text FROM generate_series(0, 4) b,
  LATERAL earmark_record_usage_many('rec', array_fill(1000000000000000::bigint, ARRAY[1000]),
          ARRAY(SELECT 'up1-' || b || '-' || i FROM generate_series(1, 1000) i)) r\$\$) t(x text);
SELECT * FROM dblink(:'hi', \$\$SELECT count(*)::text FROM generate_series(0, 4) b,
  LATERAL earmark_record_usage_many('rec', array_fill(-1000000000000000::bigint, ARRAY[1000]),
          ARRAY(SELECT 'down-' || b || '-' || i FROM generate_series(1, 1000) i)) r\$\$) t(x text);
SELECT * FROM dblink(:'lo2', \$\$SELECT count(*)::text FROM generate_series(0, 4) b,
  LATERAL earmark_record_usage_many('rec', array_fill(1000000000000000::bigint, ARRAY[1000]),
          ARRAY(SELECT 'up2-' || b || '-' || i FROM generate_series(1, 1000) i)) r\$\$) t(x text);
SELECT dblink_disconnect('c1'), dblink_disconnect('c2'), dblink_disconnect('c3');
SELECT 'recorded ' || sum(units) FROM earmark.usage_shard WHERE account = 'rec';
SELECT 'running ' || string_agg(run::text, ' ' ORDER BY shard)
FROM (SELECT shard, sum(units) OVER (ORDER BY shard) AS run FROM earmark.usage_shard
       WHERE account = 'rec') r;
SQL
)
ok $? "three sessions recorded 5e18, -5e18 and 5e18 (and 1 each) into three shards"
is "$(grep '^recorded ' <<<"$out")" "recorded 5000000000000000003" "the cycle's recorded usage: 5,000,000,000,000,000,003, a bigint"
diag "$(grep '^running ' <<<"$out") (shard order)"
got=$(q -d $DB -c "SET earmark.rate_limit = 0" \
        -c "SELECT 'reserve ' || admitted || ' ' || coalesce(reason, '-') FROM earmark_reserve('rec', 1, 'after')" 2>&1)
is "$(grep -E '^reserve |ERROR' <<<"$got")" "reserve true -" "a reserve of 1 is admitted (fast_numbers summed it; no error)"
is "$(q -d $DB -c "SELECT count(*) FROM earmark.job WHERE account = 'rec' AND idempotency_key = 'after' AND slot IS NOT NULL")" 1 \
    "... through a slot"

# --- 2. slot sums -----------------------------------------------------------
q -d $DB -c "SET earmark.rate_limit = 0" -c "SELECT earmark_set_account('slots', $anchor)" \
  -c "SELECT earmark_set_limit('slots', 1000)" -c "SELECT earmark_set_escrow('slots', 4)" \
  -c "SELECT admitted FROM earmark_reserve('slots', 1, 'warm-1')" >/dev/null
ok $? "account slots: limit 1000, 4 escrow slots, cut by its first reserve"
before=$(q -d $DB -c "SELECT sum(room) || ' ' || sum(held) || ' ' || sum(used) FROM earmark.budget_slot WHERE account = 'slots'")
q -d $DB -c "UPDATE earmark.budget_slot SET held = held + CASE WHEN slot < 2 THEN 4700000000000000000
                                                            ELSE -4700000000000000000 END
             WHERE account = 'slots'" >/dev/null
is "$(q -d $DB -c "SELECT sum(room) || ' ' || sum(held) || ' ' || sum(used) FROM earmark.budget_slot WHERE account = 'slots'")" \
    "$before" "the slots' sums (room, held, used) unchanged: $before"
got=$(q -d $DB -c "SET earmark.rate_limit = 0" \
        -c "SELECT 'reserve ' || admitted || ' ' || coalesce(reason, '-') FROM earmark_reserve('slots', 1, 'after')" 2>&1)
is "$(grep -E '^reserve |ERROR' <<<"$got")" "reserve true -" "a reserve of 1 is admitted (the sums fit; no error)"
is "$(q -d $DB -c "SELECT count(*) FROM earmark.job WHERE account = 'slots' AND idempotency_key = 'after' AND slot IS NOT NULL")" 1 \
    "... through a slot"

q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
