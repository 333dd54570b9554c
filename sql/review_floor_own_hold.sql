-- review_floor_own_hold: a hold whose lease has passed never causes a
-- refusal, also a hold the refusing transaction admitted itself.  A
-- transaction's own holds lower the budget's lease floor only when it
-- commits (leasefloor.c, em_floor_note_hold); until then
-- em_floor_none_dead trusts a floor that leaves them out.  A transaction
-- that admitted a hold with a short lease and, after that lease passed,
-- reserves again and finds no room is refused by the floor, its own dead
-- hold the cause, where the search would have reclaimed it.  No sweeper
-- runs in this database (earmark.database is 'postgres').
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT count(*) AS anchored
FROM unnest(ARRAY['oh', 'oe']) a, LATERAL earmark_set_account(a, :'anchor');
SELECT count(earmark_set_limit(a, 100)) AS limits FROM unnest(ARRAY['oh', 'oe']) a;
SELECT earmark_set_escrow('oe', 4) IS NOT NULL AS escrow;

-- y holds 90 for an hour; then, in a transaction that wrote no job row
-- (one that did stores no floor), a refusal searches, finds none dead and
-- stores the floor (y's lease end, an hour away)
SELECT a, (SELECT admitted FROM earmark_reserve(a, 90, a || '-y', lease => '1 hour')) AS y
FROM unnest(ARRAY['oh', 'oe']) a;
SELECT a, (SELECT admitted FROM earmark_reserve(a, 20, a || '-r', lease => '1 hour')) AS refused
FROM unnest(ARRAY['oh', 'oe']) a;

-- one transaction: h takes the last 10 for one second; once h's lease has
-- passed, a reserve of 10 finds no room: h, dead, is reclaimed first
BEGIN;
SELECT a, (SELECT admitted FROM earmark_reserve(a, 10, a || '-h', lease => '1 second')) AS h
FROM unnest(ARRAY['oh', 'oe']) a;
SELECT pg_sleep(1.2);
SELECT count(*) AS dead FROM earmark.job
 WHERE idempotency_key LIKE '%-h' AND status = 'running' AND lease_until < clock_timestamp();
SELECT a, r.admitted, r.remaining, r.reason
FROM unnest(ARRAY['oh', 'oe']) a, LATERAL earmark_reserve(a, 10, a || '-after', lease => '1 hour') r;
COMMIT;
SELECT idempotency_key, status FROM earmark.job ORDER BY job_id;
SELECT count(*) AS problems FROM earmark_check();
