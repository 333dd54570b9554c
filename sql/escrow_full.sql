-- An escrow account at its limit (escrow.c refused_outright): a reserve
-- that the whole budget has no room for, with no new generation of slots
-- to cut, is refused without locking or writing any slot and without
-- writing the budget row (a gathering cut wrote every free slot back with
-- no room, and the budget row, at every refusal: on a full hot account,
-- a row lock and an update a slot for each refused call).  A dead hold is
-- still reclaimed first (the reserve is then admitted), and a raised limit
-- still starts a new generation and admits.  The books hold throughout.
SET client_min_messages = warning;
-- holds are made dead here by hand (an UPDATE of lease_until), which a
-- budget's lease floor does not see (leasefloor.c): read every open hold
-- before a refusal
SET earmark.lease_floors = off;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- the cycle starts 14 to 17 days ago: none ends while the file runs
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT count(*) AS anchored FROM earmark_set_account('ef', :'anchor');
SELECT earmark_set_limit('ef', 100) IS NOT NULL AS lim,
       earmark_set_escrow('ef', 4) IS NOT NULL AS escrow;

-- ten holds of 10 fill it, through the slots and the budget row
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 10) g, LATERAL earmark_reserve('ef', 10, 'ef-' || g);
SELECT lim, used, held, remaining FROM earmark_budget('ef');
SELECT count(*) AS slot_rows FROM earmark.budget_slot WHERE account = 'ef';

-- the versions of the budget row and of every slot row before a refusal
CREATE TEMP TABLE before AS
SELECT 'budget' AS row_of, 0 AS slot, xmin::text AS version FROM earmark.budget WHERE account = 'ef'
UNION ALL
SELECT 'slot', slot, xmin::text FROM earmark.budget_slot WHERE account = 'ef';

SELECT admitted, remaining, reason FROM earmark_reserve('ef', 10, 'ef-refused-1');
SELECT admitted, remaining, reason FROM earmark_reserve('ef', 1, 'ef-refused-2');
-- nothing was written: every row is the version it was
SELECT count(*) AS rows_rewritten
  FROM before b
  LEFT JOIN (SELECT 'budget' AS row_of, 0 AS slot, xmin::text AS version FROM earmark.budget WHERE account = 'ef'
             UNION ALL
             SELECT 'slot', slot, xmin::text FROM earmark.budget_slot WHERE account = 'ef') a
    USING (row_of, slot)
 WHERE a.version IS DISTINCT FROM b.version;
SELECT lim, used, held, remaining FROM earmark_budget('ef');

-- a dead hold is reclaimed before a refusal: the reserve is admitted
UPDATE earmark.job SET lease_until = now() - interval '1 minute'
 WHERE account = 'ef' AND idempotency_key = 'ef-3';
SELECT admitted, remaining FROM earmark_reserve('ef', 10, 'ef-after-reclaim');
SELECT status, charged, released FROM earmark.job
 WHERE account = 'ef' AND idempotency_key = 'ef-3';
SELECT lim, used, held, remaining FROM earmark_budget('ef');

-- a settle frees room (into a slot or the budget row); the next reserve fits
SELECT charged FROM earmark_settle('ef', (SELECT job_id FROM earmark.job
                                           WHERE account = 'ef' AND idempotency_key = 'ef-5'), 4);
SELECT admitted, remaining FROM earmark_reserve('ef', 6, 'ef-after-settle');
SELECT admitted, remaining, reason FROM earmark_reserve('ef', 1, 'ef-refused-3');

-- a raised limit: a new generation, and room again
SELECT earmark_set_limit('ef', 150) IS NOT NULL AS raised;
SELECT admitted, remaining FROM earmark_reserve('ef', 30, 'ef-after-raise');
SELECT lim, used, held, remaining FROM earmark_budget('ef');

-- the books: held is the open holds, used the ledger, within the limit
SELECT b.used + b.held <= b.lim AS within,
       b.held = (SELECT coalesce(sum(amount), 0) FROM earmark.job
                  WHERE account = 'ef' AND status IN ('running', 'capped')) AS held_is_open_holds,
       b.used = (SELECT coalesce(sum(units), 0) FROM earmark.ledger l
                  JOIN earmark.budget x USING (budget_id) WHERE x.account = 'ef') AS used_is_ledger
  FROM earmark_budget('ef') b;
