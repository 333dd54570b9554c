-- A budget's lease floor (leasefloor.c): a reserve that finds no room
-- looks for the budget's dead holds before it refuses, and that walk reads
-- every open hold of the budget (the index job_open).  Once a walk at READ
-- COMMITTED has read them all and found none dead, the earliest lease end
-- it read is kept in shared memory, and until then a refusal reads no
-- hold: here, the scans of job_open a call made (pg_stat_get_xact_numscans,
-- pending in this backend until the transaction block ends).  Every hold's
-- commit lowers the floor to its own lease end, so a hold admitted after
-- the walk, with a short lease, is still reclaimed once its lease has
-- passed: through the budget row, through an escrow slot, and in a batch.
-- Under REPEATABLE READ a walk stores nothing.  The sweeper never trusts a
-- floor: a lease_until moved earlier by hand is expired by earmark_sweep.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- the cycle starts 14 to 17 days ago: none ends while the file runs
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset

-- the job_open scans of one reserve, in a transaction of its own
CREATE FUNCTION pg_temp.refusal(account text, key text, amount bigint DEFAULT 5)
RETURNS TABLE (admitted boolean, job_open_scans bigint) LANGUAGE plpgsql AS $$
DECLARE
    before bigint := pg_stat_get_xact_numscans('earmark.job_open'::regclass);
BEGIN
    SELECT r.admitted INTO admitted FROM earmark_reserve(account, amount, key) r;
    job_open_scans := pg_stat_get_xact_numscans('earmark.job_open'::regclass) - before;
    RETURN NEXT;
END
$$;

-- 1. a full account: the first refusal walks its 50 open holds, the next
--    ones read none
SELECT count(*) AS anchored FROM earmark_set_account('lf', :'anchor');
SELECT earmark_set_limit('lf', 100) IS NOT NULL AS lim;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 50) g, LATERAL earmark_reserve('lf', 2, 'lf-' || g, lease => interval '1 hour');
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-1');
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-2');
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-3');

-- 2. a hold admitted after the walk, through the budget row, with a lease
--    of one second: its commit lowers the floor, and once its lease has
--    passed a refusal walks again and reclaims it
SELECT status FROM earmark_settle('lf', (SELECT job_id FROM earmark.job
                                         WHERE account = 'lf' AND idempotency_key = 'lf-1'), 0);
SELECT admitted FROM earmark_reserve('lf', 2, 'lf-short', lease => interval '1 second');
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-4');
SELECT pg_sleep(1.2);
SELECT * FROM pg_temp.refusal('lf', 'lf-after-short', 2);
SELECT status, charged, released FROM earmark.job WHERE account = 'lf' AND idempotency_key = 'lf-short';
-- the walk that reclaimed stored nothing; the next refusal walks and stores
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-5');
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-6');

-- 3. a hold rolled back to a savepoint still lowers the floor: a walk
--    more, never a dead hold missed
BEGIN;
SELECT status FROM earmark_settle('lf', (SELECT job_id FROM earmark.job
                                         WHERE account = 'lf' AND idempotency_key = 'lf-2'), 0);
SAVEPOINT s;
SELECT admitted FROM earmark_reserve('lf', 2, 'lf-rolled-back', lease => interval '1 second');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-7', 3);
SELECT pg_sleep(1.2);
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-8', 3);
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-9', 3);

-- 4. REPEATABLE READ: a walk reads the transaction's snapshot and stores
--    nothing; a floor stored at READ COMMITTED is used
SELECT count(*) AS anchored FROM earmark_set_account('rr', :'anchor');
SELECT earmark_set_limit('rr', 20) IS NOT NULL AS lim;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 10) g, LATERAL earmark_reserve('rr', 2, 'rr-' || g, lease => interval '1 hour');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pg_temp.refusal('rr', 'rr-refused-1');
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pg_temp.refusal('rr', 'rr-refused-2');
COMMIT;
SELECT * FROM pg_temp.refusal('rr', 'rr-refused-3');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pg_temp.refusal('rr', 'rr-refused-4');
COMMIT;

-- 5. through an escrow slot: the fast path locks a slot, not the budget
--    row, and its hold's commit lowers the floor all the same
SELECT count(*) AS anchored FROM earmark_set_account('es', :'anchor');
SELECT earmark_set_limit('es', 100) IS NOT NULL AS lim,
       earmark_set_escrow('es', 4) IS NOT NULL AS escrow;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 10) g, LATERAL earmark_reserve('es', 10, 'es-' || g, lease => interval '1 hour');
SELECT * FROM pg_temp.refusal('es', 'es-refused-1');
SELECT * FROM pg_temp.refusal('es', 'es-refused-2');
-- a settlement frees 10 into the hold's slot; a hold of 10 takes it back
SELECT status FROM earmark_settle('es', (SELECT job_id FROM earmark.job
                                         WHERE account = 'es' AND slot IS NOT NULL
                                         ORDER BY job_id LIMIT 1), 0);
SELECT admitted FROM earmark_reserve('es', 10, 'es-short', lease => interval '1 second');
SELECT slot IS NOT NULL AS through_a_slot FROM earmark.job
 WHERE account = 'es' AND idempotency_key = 'es-short';
SELECT * FROM pg_temp.refusal('es', 'es-refused-3');
SELECT pg_sleep(1.2);
SELECT * FROM pg_temp.refusal('es', 'es-after-short', 10);
SELECT status FROM earmark.job WHERE account = 'es' AND idempotency_key = 'es-short';

-- 6. a batch: earmark_reserve_many's holds lower the floor too
SELECT count(*) AS anchored FROM earmark_set_account('bt', :'anchor');
SELECT earmark_set_limit('bt', 10) IS NOT NULL AS lim;
SELECT admitted FROM earmark_reserve('bt', 6, 'bt-long', lease => interval '1 hour');
SELECT * FROM pg_temp.refusal('bt', 'bt-refused-1', 6);
SELECT * FROM pg_temp.refusal('bt', 'bt-refused-2', 6);
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM earmark_reserve_many('bt', ARRAY[2, 2], ARRAY['bt-a', 'bt-b'], lease => interval '1 second');
SELECT pg_sleep(1.2);
SELECT * FROM pg_temp.refusal('bt', 'bt-after-batch', 4);
SELECT idempotency_key, status FROM earmark.job WHERE account = 'bt' ORDER BY idempotency_key;

-- 7. a lease moved earlier by hand is not seen by the floor (operations.md):
--    the reserve is refused; the sweeper, which never trusts a floor,
--    expires the hold, and the reserve is then admitted
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-10', 3);
UPDATE earmark.job SET lease_until = now() - interval '1 minute'
 WHERE account = 'lf' AND idempotency_key = 'lf-3';
SELECT * FROM pg_temp.refusal('lf', 'lf-refused-11', 3);
SELECT earmark_sweep() >= 1 AS swept;
SELECT status FROM earmark.job WHERE account = 'lf' AND idempotency_key = 'lf-3';
SELECT * FROM pg_temp.refusal('lf', 'lf-after-sweep', 3);

-- 8. a transaction that settled a dead hold stores no floor: rolled back,
--    the hold is open and dead again, and the next reserve reclaims it
SELECT count(*) AS anchored FROM earmark_set_account('ow', :'anchor');
SELECT earmark_set_limit('ow', 20) IS NOT NULL AS lim;
SELECT admitted FROM earmark_reserve('ow', 10, 'ow-short', lease => interval '1 second');
SELECT admitted FROM earmark_reserve('ow', 10, 'ow-long', lease => interval '1 hour');
SELECT pg_sleep(1.2);
BEGIN;
SELECT status FROM earmark_settle('ow', (SELECT job_id FROM earmark.job
                                         WHERE account = 'ow' AND idempotency_key = 'ow-short'), 0);
SELECT * FROM pg_temp.refusal('ow', 'ow-refused-1', 15);
ROLLBACK;
SELECT status FROM earmark.job WHERE account = 'ow' AND idempotency_key = 'ow-short';
SELECT * FROM pg_temp.refusal('ow', 'ow-after-rollback', 10);
SELECT status FROM earmark.job WHERE account = 'ow' AND idempotency_key = 'ow-short';

-- the books hold throughout
SELECT count(*) AS problems FROM earmark_check();
