-- A refusal without the budget row (gate.c, refused_unlocked): once a
-- backend has seen a budget refuse, its next reserve on that budget first
-- reads the budget's room without a lock; when the whole budget lacks room,
-- the budget's lease floor says no hold is dead and no job has the key, it
-- refuses there, with no row lock and so no transaction id (here: whether
-- the call's transaction has one, pg_current_xact_id_if_assigned).  Every
-- other case takes the locked path as before: room, a lease that has
-- passed, the transaction's own dead hold, REPEATABLE READ, a read-only
-- transaction, earmark.lease_floors off.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- the cycle starts 14 to 17 days ago: none ends while the file runs
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset

-- one reserve, and whether its transaction took a transaction id
CREATE FUNCTION pg_temp.try(account text, key text, amount bigint,
                            lease interval DEFAULT interval '1 hour')
RETURNS TABLE (admitted boolean, remaining bigint, reason text, took_xid boolean)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT r.admitted, r.remaining, r.reason INTO admitted, remaining, reason
      FROM earmark_reserve(account, amount, key, lease => lease) r;
    took_xid := pg_current_xact_id_if_assigned() IS NOT NULL;
    RETURN NEXT;
END
$$;

-- 1. a full account: the first refusal takes the locked path (and stores
--    the floor); the next ones take no lock, with the same answer
SELECT count(*) AS anchored FROM earmark_set_account('fu', :'anchor');
SELECT earmark_set_limit('fu', 100) IS NOT NULL AS lim;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 9) g, LATERAL earmark_reserve('fu', 10, 'fu-' || g, lease => interval '1 hour');
SELECT * FROM pg_temp.try('fu', 'fu-r1', 20);
SELECT * FROM pg_temp.try('fu', 'fu-r2', 20);
SELECT * FROM pg_temp.try('fu', 'fu-r3', 11);
-- the room it reports counts the recorded usage too
SELECT earmark_record_usage('fu', 4, 'fu-usage') AS recorded;
SELECT * FROM pg_temp.try('fu', 'fu-r4', 7);
-- a job that fits takes the locked path and is admitted
SELECT * FROM pg_temp.try('fu', 'fu-fits', 6);
-- full again: the next refusal locks once, then none
SELECT * FROM pg_temp.try('fu', 'fu-r5', 1);
SELECT * FROM pg_temp.try('fu', 'fu-r6', 1);
-- no job was written by a refusal
SELECT count(*) AS refused_rows FROM earmark.job WHERE account = 'fu' AND idempotency_key LIKE 'fu-r%';

-- 2. a settlement frees room: the next reserve is admitted
SELECT status FROM earmark_settle('fu', (SELECT job_id FROM earmark.job
                                         WHERE account = 'fu' AND idempotency_key = 'fu-1'), 0);
SELECT * FROM pg_temp.try('fu', 'fu-after-settle', 10);
-- a raised limit too
SELECT * FROM pg_temp.try('fu', 'fu-r7', 10);
SELECT earmark_set_limit('fu', 110) IS NOT NULL AS lim;
SELECT * FROM pg_temp.try('fu', 'fu-after-raise', 10);

-- 3. a hold whose lease passes: its commit lowered the floor, so once the
--    lease has passed the reserve takes the locked path, reclaims it and
--    is admitted
SELECT count(*) AS anchored FROM earmark_set_account('ls', :'anchor');
SELECT earmark_set_limit('ls', 20) IS NOT NULL AS lim;
SELECT * FROM pg_temp.try('ls', 'ls-long', 10);
SELECT * FROM pg_temp.try('ls', 'ls-short', 10, interval '1 second');
SELECT * FROM pg_temp.try('ls', 'ls-r1', 10);
SELECT * FROM pg_temp.try('ls', 'ls-r2', 10);
SELECT pg_sleep(1.2);
SELECT * FROM pg_temp.try('ls', 'ls-after-lease', 10);
SELECT idempotency_key, status FROM earmark.job WHERE account = 'ls' ORDER BY idempotency_key;

-- 4. the transaction's own hold, dead before it commits: not in the floor,
--    and reclaimed by the locked path
SELECT count(*) AS anchored FROM earmark_set_account('ow', :'anchor');
SELECT earmark_set_limit('ow', 20) IS NOT NULL AS lim;
SELECT * FROM pg_temp.try('ow', 'ow-long', 10);
SELECT * FROM pg_temp.try('ow', 'ow-r1', 20);
SELECT * FROM pg_temp.try('ow', 'ow-r2', 20);
BEGIN;
SELECT * FROM pg_temp.try('ow', 'ow-mine', 10, interval '1 second');
SELECT admitted, remaining FROM earmark_reserve('ow', 10, 'ow-r3');
SELECT pg_sleep(1.2);
SELECT admitted, remaining, reason FROM earmark_reserve('ow', 10, 'ow-after-own');
COMMIT;
SELECT idempotency_key, status FROM earmark.job WHERE account = 'ow' ORDER BY idempotency_key;

-- 5. REPEATABLE READ takes the locked path (its snapshot may be older
--    than the call), READ COMMITTED after it does not
SELECT * FROM pg_temp.try('fu', 'fu-rc0', 30);
SELECT * FROM pg_temp.try('fu', 'fu-rc1', 30);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pg_temp.try('fu', 'fu-rr', 30);
COMMIT;
SELECT * FROM pg_temp.try('fu', 'fu-rc', 30);

-- 6. a read-only transaction's reserve fails as it always did, refusal or
--    not (the locked path's row lock)
\set VERBOSITY terse
BEGIN READ ONLY;
SELECT * FROM pg_temp.try('fu', 'fu-ro', 30);
ROLLBACK;
\set VERBOSITY default

-- 7. earmark.lease_floors off: every refusal reads its holds, under the lock
SET earmark.lease_floors = off;
SELECT * FROM pg_temp.try('fu', 'fu-off', 30);
RESET earmark.lease_floors;
SELECT * FROM pg_temp.try('fu', 'fu-on-again', 30);

-- 8. an escrow budget: the whole budget, every slot summed, lacks room
SELECT count(*) AS anchored FROM earmark_set_account('es', :'anchor');
SELECT earmark_set_limit('es', 100) IS NOT NULL AS lim,
       earmark_set_escrow('es', 4) IS NOT NULL AS escrow;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 10) g, LATERAL earmark_reserve('es', 10, 'es-' || g, lease => interval '1 hour');
SELECT count(*) > 0 AS through_slots FROM earmark.job WHERE account = 'es' AND slot IS NOT NULL;
SELECT * FROM pg_temp.try('es', 'es-r1', 10);
SELECT * FROM pg_temp.try('es', 'es-r2', 10);
SELECT status FROM earmark_settle('es', (SELECT job_id FROM earmark.job
                                         WHERE account = 'es' AND slot IS NOT NULL
                                         ORDER BY job_id LIMIT 1), 0);
SELECT * FROM pg_temp.try('es', 'es-after-settle', 10);
SELECT * FROM pg_temp.try('es', 'es-r3', 10);

-- 9. the same key again after a refusal without the lock: still the same
--    job once it is admitted (a refusal stores nothing)
SELECT * FROM pg_temp.try('fu', 'fu-r1', 20);
SELECT earmark_set_limit('fu', 1000) IS NOT NULL AS lim;
SELECT admitted, reason FROM earmark_reserve('fu', 20, 'fu-r1');
SELECT admitted, reason FROM earmark_reserve('fu', 20, 'fu-r1');

-- the books hold throughout
SELECT count(*) AS problems FROM earmark_check();
