-- review_unlimited_bounds: an unlimited budget with escrow slots near the
-- largest bigint, where an admission past the room its slots are cut from
-- (a quarter of the largest bigint) would take the account's held or used
-- past a bigint, so that earmark_budget and earmark_check failed for
-- every account.
--   1. held: jobs in the slots, then a job that would take the budget
--      row's held to the largest bigint, and one that fits the room.
--   2. used: a job that, charged, would leave no room in a bigint for the
--      slots' charges.  1 and 2 refuse past the room (api.md, known
--      issues).
--   3. a budget row's held below 0 (slot jobs expired into it: only the
--      sums count) under a limit of the largest bigint: a job that fits
--      what is left is admitted, not refused as "0 is left".
--   4. an unlimited escrow account given a limit below what it holds:
--      refusals and earmark_check's over_limit; then unlimited again.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
CREATE FUNCTION pg_temp.job(acct text, k text) RETURNS bigint LANGUAGE sql AS $$
  SELECT job_id FROM earmark.job WHERE account = acct AND idempotency_key = k
$$;
-- the account's totals as numeric: never out of range
CREATE FUNCTION pg_temp.totals(acct text) RETURNS TABLE (used numeric, held numeric, fits boolean)
LANGUAGE sql AS $$
  SELECT u, h, u <= 9223372036854775807 AND h <= 9223372036854775807
    FROM (SELECT b.used::numeric + coalesce((SELECT sum(s.used) FROM earmark.budget_slot s
                                              WHERE s.account = b.account AND s.budget_id = b.budget_id), 0) AS u,
                 b.held::numeric + coalesce((SELECT sum(s.held) FROM earmark.budget_slot s
                                              WHERE s.account = b.account AND s.budget_id = b.budget_id), 0) AS h
            FROM earmark.budget b WHERE b.account = acct) t
$$;

-- 1. held: three jobs of 10, two in the slots; then a job that takes the
-- budget row's held to exactly the largest bigint
SELECT count(*) FROM earmark_set_account('uh', :'anchor');
SELECT earmark_set_limit('uh', NULL) IS NOT NULL, earmark_set_escrow('uh', 2) IS NOT NULL;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 3) g, LATERAL earmark_reserve('uh', 10, 'h-' || g);
SELECT count(*) FILTER (WHERE slot IS NOT NULL) AS in_slots FROM earmark.job WHERE account = 'uh';
SELECT admitted, reason FROM earmark_reserve('uh', 9223372036854775797, 'h-big');
SELECT * FROM pg_temp.totals('uh');
SELECT used, held FROM earmark_budget('uh');
-- a job that fits with the slots' allocation is admitted outside them
SELECT admitted, reason FROM earmark_reserve('uh', 6917529027641081856, 'h-fits');
SELECT * FROM pg_temp.totals('uh');
SELECT used, held FROM earmark_budget('uh');

-- 2. used: a job of 5e18 outside the slots, which charged in full would
-- leave the budget's used with no room for the slots' charges
SELECT count(*) FROM earmark_set_account('uu', :'anchor');
SELECT earmark_set_limit('uu', NULL) IS NOT NULL, earmark_set_escrow('uu', 2) IS NOT NULL;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 3) g, LATERAL earmark_reserve('uu', 10, 'u-' || g);
SELECT admitted, reason FROM earmark_reserve('uu', 5000000000000000000, 'u-big');
SELECT charged FROM earmark_settle('uu', pg_temp.job('uu', 'u-1'), 10);
SELECT * FROM pg_temp.totals('uu');
SELECT used, held FROM earmark_budget('uu');

-- 3. a limit of the largest bigint, two jobs in slots expired into the
-- budget row (its held goes below 0, the slots keep theirs: only the sums
-- count), then a job that fits what is left
SELECT count(*) FROM earmark_set_account('neg', :'anchor');
SELECT earmark_set_limit('neg', 9223372036854775807) IS NOT NULL, earmark_set_escrow('neg', 2) IS NOT NULL;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 3) g, LATERAL earmark_reserve('neg', 10, 'n-' || g);
UPDATE earmark.job SET lease_until = now() - interval '1 minute'
 WHERE account = 'neg' AND slot IS NOT NULL;
SELECT earmark_sweep() AS expired;
SELECT held < 0 AS budget_row_held_below_zero FROM earmark.budget WHERE account = 'neg';
SELECT lim, used, held, remaining FROM earmark_budget('neg');
SELECT admitted, remaining, reason FROM earmark_reserve('neg', 9223372036854775000, 'n-big');
SELECT * FROM pg_temp.totals('neg');

-- 4. unlimited with escrow past the room, then a limit below what it holds,
-- then unlimited again
SELECT count(*) FROM earmark_set_account('ul', :'anchor');
SELECT earmark_set_limit('ul', NULL) IS NOT NULL, earmark_set_escrow('ul', 2) IS NOT NULL;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 3) g, LATERAL earmark_reserve('ul', 10, 'l-' || g);
SELECT admitted FROM earmark_reserve('ul', 4611686018427387904, 'l-big');
SELECT earmark_set_limit('ul', 100) IS NOT NULL;
SELECT admitted, remaining, reason FROM earmark_reserve('ul', 1, 'l-after');
SELECT lim, used, held, remaining FROM earmark_budget('ul');
SELECT charged FROM earmark_settle('ul', pg_temp.job('ul', 'l-2'), 10);
SELECT admitted, remaining, reason FROM earmark_reserve('ul', 1, 'l-after2');
SELECT earmark_set_limit('ul', NULL) IS NOT NULL;
SELECT admitted, remaining, reason FROM earmark_reserve('ul', 1, 'l-after3');
SELECT lim, used, held, remaining FROM earmark_budget('ul');
SELECT invariant, account FROM earmark_check() ORDER BY 1, 2;

-- 5. an unlimited account without slots whose settled jobs and recorded
-- usage add up past the largest bigint: earmark_budget cannot give its
-- used as a bigint (22003), and earmark_check still checks every account
SELECT count(*) FROM earmark_set_account('sum', :'anchor');
SELECT earmark_set_limit('sum', NULL) IS NOT NULL;
SELECT earmark_record_usage('sum', 10, 'r-1');
SELECT admitted FROM earmark_reserve('sum', 9223372036854775800, 's-1');
SELECT charged, status FROM earmark_settle('sum', pg_temp.job('sum', 's-1'), 9223372036854775800);
SELECT used FROM earmark_budget('sum');
SELECT invariant, account FROM earmark_check() ORDER BY 1, 2;
