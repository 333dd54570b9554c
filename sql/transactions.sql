-- The gate inside application transactions: a reserve that rolls back
-- leaves no hold, a savepoint undoes what it covers, and a key whose
-- transaction rolled back can be used again.
SET client_min_messages = warning;
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- Every account here starts its cycle 14 to 17 days ago (midnight UTC, day
-- 28 at the latest), so that no cycle ends while the file runs, on any
-- date: a cycle that ended between two calls would split their holds and
-- usage over two budgets.
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT count(*) AS anchored
FROM unnest(ARRAY['app']) a, LATERAL earmark_set_account(a, :'anchor');
SELECT earmark_set_limit('app', 100000);

-- rolled back: no job, no hold
BEGIN;
SELECT admitted, remaining FROM earmark_reserve('app', 40000, 'order-1');
SELECT held FROM earmark_budget('app');
ROLLBACK;
SELECT held, remaining FROM earmark_budget('app');
SELECT count(*) AS jobs FROM earmark.job;

-- the key is free again after the rollback
SELECT admitted, reason FROM earmark_reserve('app', 40000, 'order-1');
SELECT held FROM earmark_budget('app');

-- a savepoint rolled back takes its reserve with it, the rest stays
BEGIN;
SELECT admitted FROM earmark_reserve('app', 10000, 'order-2');
SAVEPOINT s;
SELECT admitted FROM earmark_reserve('app', 20000, 'order-3');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT idempotency_key, amount FROM earmark.job ORDER BY job_id;
SELECT held FROM earmark_budget('app');

-- the application's own work and the hold commit or fail together
CREATE TABLE app_orders (id int PRIMARY KEY, job bigint);
BEGIN;
INSERT INTO app_orders SELECT 1, job_id FROM earmark_reserve('app', 5000, 'order-4');
INSERT INTO app_orders VALUES (1, NULL);   -- fails: the reserve goes too
ROLLBACK;
SELECT count(*) AS orders FROM app_orders;
SELECT count(*) AS jobs_for_order_4 FROM earmark.job WHERE idempotency_key = 'order-4';

-- reserve, charge and settle in one transaction
BEGIN;
SELECT job_id AS j FROM earmark_reserve('app', 5000, 'order-5') \gset
SELECT charged FROM earmark_charge('app', :j, 3000);
SELECT charged, released, status FROM earmark_settle('app', :j);
COMMIT;
SELECT used, held FROM earmark_budget('app');

-- a settle that rolls back leaves the job running with its hold
SELECT job_id AS j FROM earmark.job WHERE idempotency_key = 'order-1' \gset
BEGIN;
SELECT charged FROM earmark_settle('app', :j, 40000);
ROLLBACK;
SELECT status FROM earmark.job WHERE job_id = :j;
SELECT used, held FROM earmark_budget('app');
SELECT charged, released, status FROM earmark_settle('app', :j, 1000);
SELECT used, held FROM earmark_budget('app');
