-- review_floor_track_counts: a hold whose lease has passed never causes a
-- refusal, also after a transaction that settled it with track_counts off
-- rolled back.  leasefloor.c's xact_changed() tells whether the
-- transaction changed a job row before a search by the statistics' counts
-- of the transaction, and takes "track_counts is off" to mean "changed";
-- but it reads the setting at the search, not at the change.  A settle made
-- while track_counts was off (SET LOCAL, or a function's SET clause) is
-- counted nowhere; with track_counts on again, the search stores a lease
-- floor that the rollback makes wrong.  No sweeper runs in this database
-- (earmark.database is 'postgres').
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT earmark_set_account('tc', :'anchor') IS NOT NULL AS anchored;
SELECT earmark_set_limit('tc', 100) IS NOT NULL AS limited;
-- x holds 10 with a lease of one second, y holds 90 for an hour
SELECT (SELECT admitted FROM earmark_reserve('tc', 10, 'tc-x', lease => '1 second')) AS x,
       (SELECT admitted FROM earmark_reserve('tc', 90, 'tc-y', lease => '1 hour')) AS y;
SELECT pg_sleep(1.2);
SELECT job_id AS x FROM earmark.job WHERE idempotency_key = 'tc-x' \gset
SHOW track_counts;

-- the settle with track_counts off, the search with it on, then rollback
BEGIN;
SET LOCAL track_counts = off;
SELECT charged, released, status FROM earmark_settle('tc', :x);
SET LOCAL track_counts = on;
SELECT admitted, remaining, reason FROM earmark_reserve('tc', 15, 'tc-in');
ROLLBACK;
SELECT status, lease_until < clock_timestamp() AS dead FROM earmark.job WHERE job_id = :x;
-- x is reclaimed: admitted
SELECT admitted, remaining, reason FROM earmark_reserve('tc', 10, 'tc-after');
SELECT idempotency_key, status FROM earmark.job WHERE account = 'tc' ORDER BY job_id;
SELECT count(*) AS problems FROM earmark_check();
