-- review_floor_own_rollback: a hold whose lease has passed never causes a
-- refusal, also after a transaction or a savepoint that changed it rolled
-- back.  A reserve that finds no room searches the budget's holds for dead
-- ones (budget.c lock_dead) with a snapshot that sees the transaction's own
-- uncommitted work: a hold it settled or expired earlier is not open there.
-- If that search stores a lease floor (leasefloor.c) and the settle or
-- expiry is then rolled back, the hold is open (and dead) again while the
-- floor says none can be: the next reserve that finds no room must still
-- reclaim it.  No sweeper runs in this database (earmark.database is
-- 'postgres'), so nothing else expires the hold.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
-- every account's cycle began 14 to 17 days ago: no cycle ends while the
-- file runs
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT count(*) AS anchored
FROM unnest(ARRAY['sp', 'rb', 'rc']) a, LATERAL earmark_set_account(a, :'anchor');
SELECT count(earmark_set_limit(a, 100)) AS limits FROM unnest(ARRAY['sp', 'rb', 'rc']) a;

-- each account: x holds 10 with a lease of one second, y holds 90 for an
-- hour; the budget is full
SELECT a, (SELECT admitted FROM earmark_reserve(a, 10, a || '-x', lease => '1 second')) AS x,
          (SELECT admitted FROM earmark_reserve(a, 90, a || '-y', lease => '1 hour')) AS y
FROM unnest(ARRAY['sp', 'rb', 'rc']) a;
-- x's lease passes (its lease_until is earlier than every call below)
SELECT pg_sleep(1.2);
SELECT count(*) AS dead FROM earmark.job
 WHERE idempotency_key LIKE '%-x' AND status = 'running' AND lease_until < clock_timestamp();

-- 1. a savepoint settles x; a reserve after it finds no room and searches
-- (x is not open in its snapshot, y is live); the savepoint is rolled back:
-- x is open again, its lease passed
SELECT job_id AS x FROM earmark.job WHERE idempotency_key = 'sp-x' \gset
BEGIN;
SAVEPOINT s;
SELECT charged, released, status FROM earmark_settle('sp', :x);
SELECT admitted, remaining, reason FROM earmark_reserve('sp', 15, 'sp-in');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT status, lease_until < clock_timestamp() AS dead FROM earmark.job WHERE job_id = :x;
-- x is reclaimed: admitted
SELECT admitted, remaining, reason FROM earmark_reserve('sp', 10, 'sp-after');
SELECT idempotency_key, status FROM earmark.job WHERE account = 'sp' ORDER BY job_id;

-- 2. the same in a transaction rolled back whole
SELECT job_id AS x FROM earmark.job WHERE idempotency_key = 'rb-x' \gset
BEGIN;
SELECT charged, released, status FROM earmark_settle('rb', :x);
SELECT admitted, remaining, reason FROM earmark_reserve('rb', 15, 'rb-in');
ROLLBACK;
SELECT status, lease_until < clock_timestamp() AS dead FROM earmark.job WHERE job_id = :x;
SELECT admitted, remaining, reason FROM earmark_reserve('rb', 10, 'rb-after');
SELECT idempotency_key, status FROM earmark.job WHERE account = 'rb' ORDER BY job_id;

-- 3. a reserve in a savepoint reclaims x itself (that search stores no
-- floor) and is admitted; a second reserve finds no room and searches (x
-- expired in its snapshot); the savepoint is rolled back
BEGIN;
SAVEPOINT s;
SELECT admitted, remaining, reason FROM earmark_reserve('rc', 10, 'rc-first');
SELECT admitted, remaining, reason FROM earmark_reserve('rc', 5, 'rc-second');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT idempotency_key, status FROM earmark.job WHERE account = 'rc' ORDER BY job_id;
SELECT admitted, remaining, reason FROM earmark_reserve('rc', 10, 'rc-after');
SELECT idempotency_key, status FROM earmark.job WHERE account = 'rc' ORDER BY job_id;
